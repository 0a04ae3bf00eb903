//! Network partitions with network namespaces and nftables.
//!
//! A [`NetworkLab`] gives every node its own network namespace with one veth
//! whose other end sits on a bridge in the runner's namespace. Addresses come
//! from one private /24 used only inside these namespaces and on the bridge
//! (the runner talks to the nodes through the bridge; it is never partitioned,
//! like Jepsen's control node). A partition is a *grudge*: for each node, the
//! nodes whose packets it drops, enforced by an nftables `input` chain inside
//! that node's namespace. Healing deletes those tables.
//!
//! Names carry the runner's pid and a letter per lab (`cj<pid>n<l><id>`
//! namespaces, `cj<pid>v<l><id>` veths, `cj<pid>b<l>` bridge), so concurrent
//! runs and labs do not collide; on start, what
//! dead runs left behind is removed ([`cleanup_stale`]); on drop, everything
//! this lab created is removed.
//!
//! Needs root and the `ip` (iproute2) and `nft` (nftables) commands:
//! [`unavailable_reason`] says why a lab cannot be built, and callers print a
//! SKIP with that reason instead of passing.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::process::{Command, Stdio};

use parking_lot::Mutex;

/// The nftables table this module owns inside each node namespace.
const TABLE: &str = "cairn_nemesis";

/// For each node, the nodes whose packets it drops.
pub type Grudge = BTreeMap<u64, BTreeSet<u64>>;

/// Why partitions cannot be made here, or `None` when they can.
pub fn unavailable_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root (network namespaces and nftables need root)".into());
    }
    for (tool, package) in [("ip", "iproute2"), ("nft", "nftables")] {
        let found = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Some(format!("`{tool}` is missing (Debian package `{package}`)"));
        }
    }
    None
}

/// Runs a command; an error carries its stderr.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Runs a command with `input` on stdin.
pub(crate) fn run_with_input(program: &str, args: &[&str], input: &str) -> Result<(), String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(|e| format!("writing to {program}: {e}"))?;
    }
    let output = child
        .wait_with_output()
        .map_err(|e| format!("waiting for {program}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

pub(crate) fn pid_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The pid in a name `cj<pid><tag>...`, if it is one of ours.
fn owner_pid(name: &str) -> Option<i32> {
    let rest = name.strip_prefix("cj")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    if digits.is_empty() || digits.len() == rest.len() {
        return None;
    }
    let tag = rest[digits.len()..].chars().next()?;
    if !matches!(tag, 'n' | 'v' | 'b') {
        return None;
    }
    digits.parse().ok()
}

/// Removes namespaces, veths and bridges left behind by runs that are no longer
/// alive (their processes are killed first). Returns what was removed.
pub fn cleanup_stale() -> Vec<String> {
    let mut removed = Vec::new();
    if let Ok(list) = run("ip", &["netns", "list"]) {
        for line in list.lines() {
            let Some(name) = line.split_whitespace().next() else {
                continue;
            };
            if owner_pid(name).is_some_and(|pid| !pid_alive(pid)) {
                kill_namespace_processes(name);
                if run("ip", &["netns", "delete", name]).is_ok() {
                    removed.push(format!("netns {name}"));
                }
            }
        }
    }
    if let Ok(list) = run("ip", &["-o", "link", "show"]) {
        for line in list.lines() {
            // "12: cj123v1@if2: <...>"
            let Some(name) = line.split(':').nth(1).map(str::trim) else {
                continue;
            };
            let name = name.split('@').next().unwrap_or(name);
            if owner_pid(name).is_some_and(|pid| !pid_alive(pid))
                && run("ip", &["link", "delete", name]).is_ok()
            {
                removed.push(format!("link {name}"));
            }
        }
    }
    removed
}

fn kill_namespace_processes(namespace: &str) {
    if let Ok(pids) = run("ip", &["netns", "pids", namespace]) {
        for pid in pids
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            // SAFETY: kill(2) on a pid inside a namespace this module created.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// One node's place in the lab.
#[derive(Debug, Clone)]
pub struct NodeNetwork {
    pub namespace: String,
    pub ip: String,
}

/// Network namespaces on one bridge, and the partitions between them.
pub struct NetworkLab {
    prefix: String,
    /// Tells apart the labs of one process.
    letter: char,
    subnet_prefix: String,
    bridge: String,
    nodes: Mutex<BTreeMap<u64, NodeNetwork>>,
    grudge: Mutex<Grudge>,
}

impl std::fmt::Debug for NetworkLab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetworkLab")
            .field("bridge", &self.bridge)
            .field("subnet", &self.subnet_prefix)
            .finish()
    }
}

impl NetworkLab {
    /// Creates the bridge (after removing what dead runs left behind).
    pub fn new() -> Result<NetworkLab, String> {
        if let Some(reason) = unavailable_reason() {
            return Err(reason);
        }
        cleanup_stale();
        let pid = std::process::id();
        // Several labs of one process (tests run in parallel) differ by a letter.
        static LABS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let instance = LABS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let letter = char::from(b'a' + (instance % 26) as u8);
        let prefix = format!("cj{pid}");
        let used = run("ip", &["-o", "addr", "show"]).unwrap_or_default();
        // A /24 of 10.147.0.0/16 that no interface here uses yet.
        let mut octet = 20 + (pid + instance * 37) % 200;
        for _ in 0..200 {
            if !used.contains(&format!("10.147.{octet}.")) {
                break;
            }
            octet = 20 + (octet - 19) % 200;
        }
        let subnet_prefix = format!("10.147.{octet}.");
        let bridge = format!("{prefix}b{letter}");
        let lab = NetworkLab {
            prefix,
            letter,
            subnet_prefix,
            bridge,
            nodes: Mutex::new(BTreeMap::new()),
            grudge: Mutex::new(Grudge::new()),
        };
        run("ip", &["link", "add", &lab.bridge, "type", "bridge"])?;
        run(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}254/24", lab.subnet_prefix),
                "dev",
                &lab.bridge,
            ],
        )?;
        run("ip", &["link", "set", &lab.bridge, "up"])?;
        Ok(lab)
    }

    /// The bridge's interface name.
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// The address node `id` has inside its namespace.
    pub fn ip_of(&self, id: u64) -> String {
        assert!(
            (1..=200).contains(&id),
            "node ids 1..=200 fit the lab's /24"
        );
        format!("{}{}", self.subnet_prefix, 10 + id)
    }

    /// Creates node `id`'s namespace and veth (idempotent).
    pub fn add_node(&self, id: u64) -> Result<NodeNetwork, String> {
        if let Some(existing) = self.nodes.lock().get(&id) {
            return Ok(existing.clone());
        }
        let namespace = format!("{}n{}{id}", self.prefix, self.letter);
        let veth = format!("{}v{}{id}", self.prefix, self.letter);
        let peer = format!("{}p{}{id}", self.prefix, self.letter);
        let ip = self.ip_of(id);
        run("ip", &["netns", "add", &namespace])?;
        run(
            "ip",
            &[
                "link", "add", &veth, "type", "veth", "peer", "name", &peer, "netns", &namespace,
            ],
        )?;
        run("ip", &["link", "set", &veth, "master", &self.bridge])?;
        run("ip", &["link", "set", &veth, "up"])?;
        run(
            "ip",
            &["-n", &namespace, "link", "set", &peer, "name", "eth0"],
        )?;
        run(
            "ip",
            &[
                "-n",
                &namespace,
                "addr",
                "add",
                &format!("{ip}/24"),
                "dev",
                "eth0",
            ],
        )?;
        run("ip", &["-n", &namespace, "link", "set", "eth0", "up"])?;
        run("ip", &["-n", &namespace, "link", "set", "lo", "up"])?;
        let node = NodeNetwork { namespace, ip };
        self.nodes.lock().insert(id, node.clone());
        Ok(node)
    }

    /// The namespace of node `id`, if it has one.
    pub fn namespace_of(&self, id: u64) -> Option<String> {
        self.nodes.lock().get(&id).map(|n| n.namespace.clone())
    }

    /// Replaces the current partition with `grudge` (nodes not named hear everyone).
    pub fn partition(&self, grudge: &Grudge) -> Result<(), String> {
        self.heal()?;
        let nodes = self.nodes.lock().clone();
        for (id, dropped) in grudge {
            if dropped.is_empty() {
                continue;
            }
            assert!(!dropped.contains(id), "a node never drops its own packets");
            let node = nodes
                .get(id)
                .ok_or_else(|| format!("node {id} has no namespace"))?;
            let sources: Vec<String> = dropped
                .iter()
                .filter_map(|d| nodes.get(d).map(|n| n.ip.clone()))
                .collect();
            if sources.is_empty() {
                continue;
            }
            let script = format!(
                "table inet {TABLE} {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    ip saddr {{ {} }} drop\n  }}\n}}\n",
                sources.join(", ")
            );
            run_with_input(
                "ip",
                &["netns", "exec", &node.namespace, "nft", "-f", "-"],
                &script,
            )?;
        }
        *self.grudge.lock() = grudge.clone();
        Ok(())
    }

    /// Removes every partition.
    pub fn heal(&self) -> Result<(), String> {
        let nodes = self.nodes.lock().clone();
        let mut first_error = None;
        for node in nodes.values() {
            // Declaring the table first makes the delete succeed when it is absent.
            let script = format!("table inet {TABLE}\ndelete table inet {TABLE}\n");
            if let Err(e) = run_with_input(
                "ip",
                &["netns", "exec", &node.namespace, "nft", "-f", "-"],
                &script,
            ) {
                first_error.get_or_insert(e);
            }
        }
        self.grudge.lock().clear();
        first_error.map_or(Ok(()), Err)
    }

    /// The partition in force.
    pub fn grudge(&self) -> Grudge {
        self.grudge.lock().clone()
    }

    /// Removes node `id`'s namespace (its processes are killed).
    pub fn remove_node(&self, id: u64) {
        if let Some(node) = self.nodes.lock().remove(&id) {
            kill_namespace_processes(&node.namespace);
            let _ = run("ip", &["netns", "delete", &node.namespace]);
            let _ = run(
                "ip",
                &[
                    "link",
                    "delete",
                    &format!("{}v{}{id}", self.prefix, self.letter),
                ],
            );
        }
    }
}

impl Drop for NetworkLab {
    fn drop(&mut self) {
        let ids: Vec<u64> = self.nodes.lock().keys().copied().collect();
        for id in ids {
            self.remove_node(id);
        }
        let _ = run("ip", &["link", "delete", &self.bridge]);
    }
}

/// Grudges for the partition shapes the nemesis uses. `ids` are the members.
pub mod shapes {
    use super::Grudge;
    use std::collections::BTreeSet;

    /// Each side drops the other side's packets.
    pub fn split(side_a: &[u64], side_b: &[u64]) -> Grudge {
        let mut g = Grudge::new();
        for a in side_a {
            g.entry(*a).or_default().extend(side_b.iter().copied());
        }
        for b in side_b {
            g.entry(*b).or_default().extend(side_a.iter().copied());
        }
        g
    }

    /// `node` is cut off from every other member, both ways.
    pub fn isolate(node: u64, ids: &[u64]) -> Grudge {
        let others: Vec<u64> = ids.iter().copied().filter(|i| *i != node).collect();
        split(&[node], &others)
    }

    /// `node` hears nobody, but everybody still hears `node`.
    pub fn deaf(node: u64, ids: &[u64]) -> Grudge {
        let mut g = Grudge::new();
        g.insert(node, ids.iter().copied().filter(|i| *i != node).collect());
        g
    }

    /// Each node hears only its two neighbours in `ids` order (a majority of 5
    /// for every node, but no two nodes agree on which majority).
    pub fn ring(ids: &[u64]) -> Grudge {
        let n = ids.len();
        let mut g = Grudge::new();
        for (i, id) in ids.iter().enumerate() {
            let neighbours: BTreeSet<u64> = [ids[(i + 1) % n], ids[(i + n - 1) % n], *id]
                .into_iter()
                .collect();
            g.insert(
                *id,
                ids.iter()
                    .copied()
                    .filter(|j| !neighbours.contains(j))
                    .collect(),
            );
        }
        g
    }

    /// Two halves that cannot talk, joined by one `bridge` node that hears both.
    pub fn bridge(bridge: u64, ids: &[u64]) -> Grudge {
        let others: Vec<u64> = ids.iter().copied().filter(|i| *i != bridge).collect();
        let half = others.len() / 2;
        split(&others[..half], &others[half..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_of_five_leaves_each_node_its_two_neighbours() {
        // In a five-node ring every node drops exactly the two nodes that are not its neighbours.
        let g = shapes::ring(&[1, 2, 3, 4, 5]);
        assert_eq!(g[&1], [3, 4].into_iter().collect());
        assert_eq!(g[&3], [1, 5].into_iter().collect());
        for dropped in g.values() {
            assert_eq!(dropped.len(), 2);
        }
    }

    #[test]
    fn bridge_node_hears_both_halves_that_cannot_hear_each_other() {
        // The bridge node drops nobody; the halves drop each other.
        let g = shapes::bridge(3, &[1, 2, 3, 4, 5]);
        assert!(!g.contains_key(&3));
        assert_eq!(g[&1], [4, 5].into_iter().collect());
        assert_eq!(g[&5], [1, 2].into_iter().collect());
    }

    #[test]
    fn stale_names_are_recognised_by_their_pid() {
        // Only names of the form cj<pid>{n,v,b}<...> belong to a run.
        assert_eq!(owner_pid("cj1234na1"), Some(1234));
        assert_eq!(owner_pid("cj77ba"), Some(77));
        assert_eq!(owner_pid("cj77"), None);
        assert_eq!(owner_pid("eth0"), None);
        assert_eq!(owner_pid("cjxn1"), None);
    }
}
