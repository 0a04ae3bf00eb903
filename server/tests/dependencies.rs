//! What a server needs, and nothing of the command line: `cairn-server`'s normal
//! dependencies (what a program that embeds a node builds, `cargo tree -p cairn-server -e
//! normal`) hold no argument parser (clap), no progress bars (indicatif), no load
//! generator's histograms (hdrhistogram) and no certificate generation (rcgen). Those are
//! `cairn-cli`'s and `cairn-bench`'s.
//!
//! The one exception is named below: openraft 0.9 depends on clap unconditionally (its
//! `Config` derives `clap::Parser`; no feature turns it off), so clap reaches the server
//! through openraft and through nothing else. Any other route to a forbidden crate (the
//! server itself, or any crate it depends on) fails the test, naming the crate and the
//! route.
//!
//! Reads `cargo metadata --format-version 1` (the workspace's resolved graph: the same
//! edges `cargo tree` walks) with the `cargo` that runs the tests.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// The crates a server must not build.
const FORBIDDEN: &[&str] = &["clap", "indicatif", "hdrhistogram", "rcgen"];

/// (forbidden crate, the one crate allowed to bring it in, and why).
const EXCEPTIONS: &[(&str, &str, &str)] = &[(
    "clap",
    "openraft",
    "openraft 0.9's Config derives clap::Parser; the dependency is not optional",
)];

/// The resolved dependency graph: package id -> (name, its normal dependencies' ids).
struct Graph {
    names: BTreeMap<String, String>,
    normal: BTreeMap<String, Vec<String>>,
}

fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--manifest-path"])
        .arg(&manifest)
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON")
}

fn graph(metadata: &Value) -> Graph {
    let names = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            (
                p["id"].as_str().expect("package id").to_string(),
                p["name"].as_str().expect("package name").to_string(),
            )
        })
        .collect();
    let normal = metadata["resolve"]["nodes"]
        .as_array()
        .expect("resolve.nodes")
        .iter()
        .map(|node| {
            let deps = node["deps"]
                .as_array()
                .expect("deps")
                .iter()
                .filter(|dep| {
                    // A normal dependency has kind null (dev and build ones are named).
                    dep["dep_kinds"]
                        .as_array()
                        .expect("dep_kinds")
                        .iter()
                        .any(|k| k["kind"].is_null())
                })
                .map(|dep| dep["pkg"].as_str().expect("dep pkg").to_string())
                .collect();
            (node["id"].as_str().expect("node id").to_string(), deps)
        })
        .collect();
    Graph { names, normal }
}

impl Graph {
    fn id_of(&self, name: &str) -> String {
        self.names
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .map(|(id, _)| id.clone())
            .unwrap_or_else(|| panic!("no package {name} in the workspace's graph"))
    }

    /// Every package `root` reaches through normal dependencies, with the route that first
    /// reached it (names, from `root`).
    fn reached(&self, root: &str) -> BTreeMap<String, Vec<String>> {
        let mut routes = BTreeMap::new();
        routes.insert(root.to_string(), vec![self.names[root].clone()]);
        let mut queue = VecDeque::from([root.to_string()]);
        while let Some(id) = queue.pop_front() {
            let route = routes[&id].clone();
            for dep in self.normal.get(&id).into_iter().flatten() {
                if !routes.contains_key(dep) {
                    let mut longer = route.clone();
                    longer.push(self.names[dep].clone());
                    routes.insert(dep.clone(), longer);
                    queue.push_back(dep.clone());
                }
            }
        }
        routes
    }
}

#[test]
fn the_server_builds_no_command_line_crates() {
    let graph = graph(&metadata());
    let server = graph.id_of("cairn-server");
    let reached = graph.reached(&server);
    let mut wrong = Vec::new();
    for id in reached.keys() {
        let name = &graph.names[id];
        if !FORBIDDEN.contains(&name.as_str()) {
            continue;
        }
        // Who in the server's closure depends on it directly, and how the server reaches
        // each of them.
        let dependents: BTreeSet<&String> = reached
            .keys()
            .filter(|d| graph.normal.get(*d).is_some_and(|deps| deps.contains(id)))
            .collect();
        for dependent in dependents {
            let dependent_name = &graph.names[dependent];
            let allowed = EXCEPTIONS
                .iter()
                .any(|(crate_, via, _)| crate_ == name && via == dependent_name);
            if !allowed {
                wrong.push(format!(
                    "{name}, a dependency of {dependent_name}: {} -> {name}",
                    reached[dependent].join(" -> ")
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "cairn-server must not depend on {}, but its normal dependencies hold:\n  {}\n\
         (move what needs them to cairn-cli or cairn-bench)",
        FORBIDDEN.join(", "),
        wrong.join("\n  ")
    );
}

/// The exception stays an exception: each names a crate the server does reach, through the
/// crate named (so that it is dropped once openraft no longer needs it).
#[test]
fn each_exception_is_still_needed() {
    let graph = graph(&metadata());
    let reached = graph.reached(&graph.id_of("cairn-server"));
    for (name, via, why) in EXCEPTIONS {
        let via_id = reached
            .keys()
            .find(|id| graph.names[*id] == *via)
            .unwrap_or_else(|| panic!("the server no longer reaches {via}: drop the exception"));
        assert!(
            graph.normal[via_id]
                .iter()
                .any(|dep| graph.names[dep] == *name),
            "{via} no longer depends on {name} ({why}): drop the exception"
        );
    }
}
