//! Partitions between processes that all listen on loopback (`cairn dev`'s nodes), where
//! [`crate::net`]'s namespaces do not apply.
//!
//! Each node's process is put in a `net_cls` cgroup (cgroup v1) of its own, whose class id
//! the kernel stamps on every packet the node's sockets send (moving a process moves its
//! sockets' class too). A partition is a [`Grudge`], as in [`crate::net`]: for each node,
//! the nodes whose packets it drops. It is one nftables table in the output hook with one
//! rule per grudge: packets of the dropped nodes' classes to the node's ports are dropped.
//! Loopback packets pass the output hook once, so one table covers both directions of a
//! connection: a connection the grudge forbids cannot be opened, and one already open
//! stalls. Processes outside these cgroups (the drill's clients, an operator's `cairn`) are
//! never partitioned, like Jepsen's control node.
//!
//! Names carry the owner's pid: the table `cairn_loopback_<pid>`, the cgroups
//! `NET_CLS/cairn-loopback-<pid>/node-<id>`. What dead owners left behind is removed when a
//! new [`LoopbackNet`] is made, and [`LoopbackNet`]'s drop removes its own.
//!
//! Needs root, `nft` (nftables) and the `net_cls` controller; when no hierarchy has it
//! mounted, it is mounted at `/sys/fs/cgroup/net_cls`. [`unavailable_reason`] says why
//! partitions cannot be made here.
//!
//! ## Invariants
//! - A node's class id is unique within one [`LoopbackNet`], and never 0 (0 is "no class":
//!   every process outside these cgroups).
//! - A node never drops its own packets (asserted, as in [`crate::net`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::net::{pid_alive, run, run_with_input, Grudge};

/// The `net_cls` hierarchy mounted by this module when none is.
const NET_CLS_MOUNT: &str = "/sys/fs/cgroup/net_cls";

/// Class ids are `MAJOR:node id` (`tc`'s notation), with a major no one else uses here.
const CLASS_MAJOR: u32 = 0xCA1;

/// The prefix of the table and cgroup names (then the owner's pid).
const TABLE_PREFIX: &str = "cairn_loopback_";
const CGROUP_PREFIX: &str = "cairn-loopback-";

/// Why loopback partitions cannot be made here, or `None` when they can.
pub fn unavailable_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root (nftables and cgroups need root)".into());
    }
    if run("nft", &["--version"]).is_err() {
        return Some("`nft` is missing (Debian package `nftables`)".into());
    }
    let known = std::fs::read_to_string("/proc/cgroups").unwrap_or_default();
    if !known
        .lines()
        .any(|l| l.split_whitespace().next() == Some("net_cls"))
    {
        return Some("this kernel has no net_cls cgroup controller".into());
    }
    None
}

/// The class id of node `id`.
fn class_of(id: u64) -> u32 {
    assert!(
        (1..=0xFFFF).contains(&id),
        "node ids of a loopback net are 1..=65535"
    );
    (CLASS_MAJOR << 16) | id as u32
}

/// The nftables script of `grudge`: one table `table`, and per grudge one rule dropping the
/// packets of the dropped nodes' classes to the grudging node's ports. Nodes without ports
/// are ignored.
pub fn ruleset(table: &str, grudge: &Grudge, ports: &BTreeMap<u64, Vec<u16>>) -> String {
    let mut rules = String::new();
    for (node, dropped) in grudge {
        assert!(
            !dropped.contains(node),
            "a node never drops its own packets"
        );
        let Some(node_ports) = ports.get(node).filter(|p| !p.is_empty()) else {
            continue;
        };
        let classes: Vec<String> = dropped
            .iter()
            .filter(|d| ports.contains_key(d))
            .map(|d| format!("0x{:08x}", class_of(*d)))
            .collect();
        if classes.is_empty() {
            continue;
        }
        let node_ports: Vec<String> = node_ports.iter().map(u16::to_string).collect();
        rules.push_str(&format!(
            "    meta cgroup {{ {} }} tcp dport {{ {} }} drop\n",
            classes.join(", "),
            node_ports.join(", ")
        ));
    }
    format!(
        "table inet {table} {{\n  chain output {{\n    type filter hook output priority 0; policy accept;\n{rules}  }}\n}}\n"
    )
}

/// The partitions of one set of loopback nodes.
pub struct LoopbackNet {
    table: String,
    /// `NET_CLS/cairn-loopback-<pid>`: one cgroup per node below it.
    root: PathBuf,
    /// Each node's ports (client and peer).
    ports: BTreeMap<u64, Vec<u16>>,
    grudge: Grudge,
}

impl LoopbackNet {
    /// Makes the cgroups of `ports`' nodes (none is partitioned yet; put their processes in
    /// with [`LoopbackNet::attach`]).
    pub fn new(ports: BTreeMap<u64, Vec<u16>>) -> Result<LoopbackNet, String> {
        if let Some(why) = unavailable_reason() {
            return Err(why);
        }
        let hierarchy = net_cls_hierarchy()?;
        cleanup_stale(&hierarchy);
        let pid = std::process::id();
        let root = hierarchy.join(format!("{CGROUP_PREFIX}{pid}"));
        for id in ports.keys() {
            let dir = root.join(format!("node-{id}"));
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot make the cgroup {}: {e}", dir.display()))?;
            write(&dir.join("net_cls.classid"), &class_of(*id).to_string())?;
        }
        Ok(LoopbackNet {
            table: format!("{TABLE_PREFIX}{pid}"),
            root,
            ports,
            grudge: Grudge::new(),
        })
    }

    /// Puts process `pid` (node `id`, with all its threads) in node `id`'s cgroup.
    pub fn attach(&self, id: u64, pid: u32) -> Result<(), String> {
        if !self.ports.contains_key(&id) {
            return Err(format!("node {id} is not one of this loopback net's nodes"));
        }
        write(
            &self.root.join(format!("node-{id}")).join("cgroup.procs"),
            &pid.to_string(),
        )
    }

    /// Replaces the partition in force with `grudge`.
    pub fn partition(&mut self, grudge: &Grudge) -> Result<(), String> {
        self.heal()?;
        let script = ruleset(&self.table, grudge, &self.ports);
        run_with_input("nft", &["-f", "-"], &script)?;
        self.grudge = grudge.clone();
        Ok(())
    }

    /// Removes every partition.
    pub fn heal(&mut self) -> Result<(), String> {
        delete_table(&self.table)?;
        self.grudge.clear();
        Ok(())
    }

    /// The partition in force.
    pub fn grudge(&self) -> &Grudge {
        &self.grudge
    }
}

impl Drop for LoopbackNet {
    fn drop(&mut self) {
        let _ = delete_table(&self.table);
        remove_cgroups(&self.root);
    }
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn delete_table(table: &str) -> Result<(), String> {
    // Declaring the table first makes the delete succeed when it is absent.
    run_with_input(
        "nft",
        &["-f", "-"],
        &format!("table inet {table}\ndelete table inet {table}\n"),
    )
}

/// Removes the node cgroups below `root`, then `root`. A cgroup that still holds a process
/// stays (its processes leave it when they end; the next cleanup removes it).
fn remove_cgroups(root: &Path) {
    if let Ok(entries) = std::fs::read_dir(root) {
        for entry in entries.flatten() {
            if entry.path().is_dir() {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(root);
}

/// Where the `net_cls` controller is mounted: found in `/proc/mounts`, or mounted at
/// [`NET_CLS_MOUNT`].
fn net_cls_hierarchy() -> Result<PathBuf, String> {
    let mounts = std::fs::read_to_string("/proc/mounts")
        .map_err(|e| format!("cannot read /proc/mounts: {e}"))?;
    let found = mounts.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            [_, dir, "cgroup", options, ..] if options.split(',').any(|o| o == "net_cls") => {
                Some(PathBuf::from(dir))
            }
            _ => None,
        }
    });
    if let Some(dir) = found {
        return Ok(dir);
    }
    std::fs::create_dir_all(NET_CLS_MOUNT)
        .map_err(|e| format!("cannot make {NET_CLS_MOUNT}: {e}"))?;
    run(
        "mount",
        &["-t", "cgroup", "-o", "net_cls", "net_cls", NET_CLS_MOUNT],
    )
    .map_err(|e| format!("cannot mount the net_cls cgroup controller: {e}"))?;
    Ok(PathBuf::from(NET_CLS_MOUNT))
}

/// Removes the tables and cgroups of owners that are no longer alive.
fn cleanup_stale(hierarchy: &Path) {
    let dead = |name: &str, prefix: &str| {
        name.strip_prefix(prefix)
            .and_then(|pid| pid.parse::<i32>().ok())
            .is_some_and(|pid| !pid_alive(pid))
    };
    if let Ok(tables) = run("nft", &["list", "tables", "inet"]) {
        for line in tables.lines() {
            // "table inet cairn_loopback_123"
            if let Some(name) = line.split_whitespace().nth(2) {
                if dead(name, TABLE_PREFIX) {
                    let _ = delete_table(name);
                }
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(hierarchy) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if dead(&name, CGROUP_PREFIX) {
                remove_cgroups(&entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::shapes;

    #[test]
    fn isolating_a_node_drops_its_packets_to_the_others_and_theirs_to_it() {
        let ports: BTreeMap<u64, Vec<u16>> = [
            (1, vec![7001, 8001]),
            (2, vec![7002, 8002]),
            (3, vec![7003, 8003]),
        ]
        .into();
        let script = ruleset("t", &shapes::isolate(1, &[1, 2, 3]), &ports);
        let rules: Vec<&str> = script.lines().filter(|l| l.contains("drop")).collect();
        assert_eq!(
            rules,
            [
                // Nodes 2 and 3 cannot reach node 1's ports...
                "    meta cgroup { 0x0ca10002, 0x0ca10003 } tcp dport { 7001, 8001 } drop",
                // ...and node 1 cannot reach theirs.
                "    meta cgroup { 0x0ca10001 } tcp dport { 7002, 8002 } drop",
                "    meta cgroup { 0x0ca10001 } tcp dport { 7003, 8003 } drop",
            ]
        );
        assert!(script.starts_with("table inet t {"));
        assert!(script.contains("type filter hook output priority 0; policy accept;"));
    }

    #[test]
    fn no_grudge_is_an_empty_table_and_unknown_nodes_are_ignored() {
        let ports: BTreeMap<u64, Vec<u16>> = [(1, vec![7001]), (2, vec![7002])].into();
        let script = ruleset("t", &Grudge::new(), &ports);
        assert!(!script.contains("drop"), "{script}");
        // Node 9 has no ports: nothing to drop for it or from it.
        let script = ruleset("t", &shapes::isolate(9, &[1, 2, 9]), &ports);
        assert!(!script.contains("drop"), "{script}");
    }

    #[test]
    fn class_ids_are_distinct_and_never_zero() {
        let ids: std::collections::BTreeSet<u32> = (1..=5).map(class_of).collect();
        assert_eq!(ids.len(), 5);
        assert!(!ids.contains(&0));
    }
}
