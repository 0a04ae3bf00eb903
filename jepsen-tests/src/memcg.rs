//! Memory cgroups for nodes that the kernel may kill: one cgroup per node, with a memory
//! limit that the oom-kill loop ([`crate::nemesis::NemesisKind::OomKillLoop`]) lowers to
//! just above what the node holds, so that its next allocation burst makes the kernel's
//! OOM killer send it `SIGKILL`, as it did to the operator's node in issue 29.
//!
//! Both hierarchies are supported: cgroup v1 (`/sys/fs/cgroup/memory`, the files
//! `memory.limit_in_bytes`, `memory.stat` `rss`, `memory.oom_control` `oom_kill`) and
//! cgroup v2 (`/sys/fs/cgroup` with the `memory` controller: `memory.max`, `memory.stat`
//! `anon`, `memory.events` `oom_kill`). [`Hierarchy::find`] says why neither can be used
//! (not root, no memory controller), and the scenario is then skipped with that reason.
//!
//! A cgroup is named `cairn-jepsen-<pid>-<n>-node-<id>` (the pid of this program, a counter
//! of this process); it is removed when its [`MemoryCgroup`] is dropped (after its node was
//! killed), and [`cleanup_stale`] removes those of programs that are gone. Cgroups of other
//! names are never touched.
//!
//! The limit is lowered against the *anonymous* memory (heap) of the cgroup, not its whole
//! usage: the usage includes the page cache of the log and snapshot files, which the kernel
//! reclaims before it kills anything, so a limit just above the usage would kill nothing.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The prefix of every cgroup this module creates.
const NAME_PREFIX: &str = "cairn-jepsen-";

/// Which cgroup hierarchy holds the memory controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// Where memory cgroups are created.
#[derive(Clone, Debug)]
pub struct Hierarchy {
    pub version: Version,
    /// The parent directory of the cgroups created here.
    pub root: PathBuf,
}

const V1_ROOT: &str = "/sys/fs/cgroup/memory";
const V2_ROOT: &str = "/sys/fs/cgroup";

impl Hierarchy {
    /// The memory cgroup hierarchy of this machine, or why there is none to use.
    pub fn find() -> Result<Hierarchy, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("memory cgroups need root (not root here)".into());
        }
        let v2 = Path::new(V2_ROOT);
        if let Ok(controllers) = std::fs::read_to_string(v2.join("cgroup.controllers")) {
            if !controllers.split_whitespace().any(|c| c == "memory") {
                return Err(format!(
                    "cgroup v2 is mounted at {V2_ROOT} but its memory controller is not \
                     available (cgroup.controllers: {:?})",
                    controllers.trim()
                ));
            }
            let subtree = v2.join("cgroup.subtree_control");
            let enabled = std::fs::read_to_string(&subtree)
                .is_ok_and(|s| s.split_whitespace().any(|c| c == "memory"));
            if !enabled {
                std::fs::write(&subtree, "+memory").map_err(|e| {
                    format!(
                        "cgroup v2: cannot enable the memory controller for child cgroups \
                         ({}: {e})",
                        subtree.display()
                    )
                })?;
            }
            return Ok(Hierarchy {
                version: Version::V2,
                root: v2.to_path_buf(),
            });
        }
        let v1 = Path::new(V1_ROOT);
        if v1.join("memory.limit_in_bytes").is_file() {
            return Ok(Hierarchy {
                version: Version::V1,
                root: v1.to_path_buf(),
            });
        }
        Err(format!(
            "no memory cgroup hierarchy: neither cgroup v2 ({V2_ROOT}/cgroup.controllers) \
             nor cgroup v1 ({V1_ROOT}/memory.limit_in_bytes) is mounted"
        ))
    }
}

/// Why memory cgroups cannot be used here, if they cannot.
pub fn unavailable_reason() -> Option<String> {
    Hierarchy::find().err()
}

/// One node's memory cgroup; removed when dropped (its processes must be gone by then).
#[derive(Debug)]
pub struct MemoryCgroup {
    version: Version,
    path: PathBuf,
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// The value of `key` in a flat-keyed cgroup file (`key value` per line).
fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

impl MemoryCgroup {
    /// Creates the cgroup of node `node_id` with a memory limit of `limit_bytes` (and no
    /// swap, where the hierarchy can say so).
    pub fn create(
        hierarchy: &Hierarchy,
        node_id: u64,
        limit_bytes: u64,
    ) -> Result<MemoryCgroup, String> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("{NAME_PREFIX}{}-{n}-node-{node_id}", std::process::id());
        let path = hierarchy.root.join(name);
        std::fs::create_dir(&path)
            .map_err(|e| format!("cannot create the cgroup {}: {e}", path.display()))?;
        let cgroup = MemoryCgroup {
            version: hierarchy.version,
            path,
        };
        if cgroup.version == Version::V2 {
            // Without swap the OOM killer acts at the limit, as on the operator's machine.
            let _ = std::fs::write(cgroup.path.join("memory.swap.max"), "0");
        }
        cgroup.set_limit(limit_bytes)?;
        Ok(cgroup)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file a process writes its pid (or `0`: itself) to, to join the cgroup.
    pub fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// Sets the memory limit. Lowering it below what the cgroup's page cache and heap hold
    /// makes the kernel reclaim the cache first (v1 refuses with EBUSY when it cannot get
    /// under the limit; v2 OOM-kills).
    pub fn set_limit(&self, bytes: u64) -> Result<(), String> {
        let file = self.path.join(match self.version {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        });
        std::fs::write(&file, bytes.to_string())
            .map_err(|e| format!("cannot set {} to {bytes}: {e}", file.display()))
    }

    /// The anonymous memory (heap, stacks) the cgroup's processes hold: what the OOM killer
    /// cannot reclaim.
    pub fn anonymous_bytes(&self) -> Result<u64, String> {
        let file = self.path.join("memory.stat");
        let key = match self.version {
            // "rss: anonymous and swap cache memory (includes transparent hugepages)".
            Version::V1 => "rss",
            Version::V2 => "anon",
        };
        keyed_value(&read(&file)?, key).ok_or_else(|| format!("no `{key}` in {}", file.display()))
    }

    /// How many processes of this cgroup the kernel's OOM killer has killed.
    pub fn oom_kills(&self) -> Result<u64, String> {
        let file = self.path.join(match self.version {
            Version::V1 => "memory.oom_control",
            Version::V2 => "memory.events",
        });
        keyed_value(&read(&file)?, "oom_kill").ok_or_else(|| {
            format!(
                "no `oom_kill` count in {} (a kernel older than 4.13?)",
                file.display()
            )
        })
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // A process killed just before may take a moment to leave the cgroup.
        for _ in 0..50 {
            match std::fs::remove_dir(&self.path) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
        eprintln!(
            "jepsen: cannot remove the cgroup {} (a process still in it?)",
            self.path.display()
        );
    }
}

/// The pid in a name `cairn-jepsen-<pid>-...`, if it is one of ours.
fn owner_pid(name: &str) -> Option<i32> {
    let rest = name.strip_prefix(NAME_PREFIX)?;
    let (pid, _) = rest.split_once('-')?;
    pid.parse().ok()
}

fn pid_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Removes the cgroups left by runs of this program that are no longer alive (after
/// killing what is still in them). Returns what was removed.
pub fn cleanup_stale() -> Vec<String> {
    let Ok(hierarchy) = Hierarchy::find() else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(&hierarchy.root) else {
        return removed;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if owner_pid(&name).is_none_or(pid_alive) {
            continue;
        }
        let procs = read(&entry.path().join("cgroup.procs")).unwrap_or_default();
        for pid in procs
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            // SAFETY: kill(2) on a process inside a cgroup a dead run of ours created.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        let cgroup = MemoryCgroup {
            version: hierarchy.version,
            path: entry.path(),
        };
        drop(cgroup);
        if !entry.path().exists() {
            removed.push(format!("cgroup {name}"));
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_by_key_from_cgroup_files() {
        let v1_stat = "cache 177504256\nrss 191328256\nrss_huge 0\nshmem 0\n";
        assert_eq!(keyed_value(v1_stat, "rss"), Some(191_328_256));
        assert_eq!(keyed_value(v1_stat, "rss_huge"), Some(0));
        let v1_oom = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(keyed_value(v1_oom, "oom_kill"), Some(3));
        let v2_events = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(keyed_value(v2_events, "oom_kill"), Some(1));
        assert_eq!(keyed_value(v2_events, "oom"), Some(2));
        assert_eq!(keyed_value(v2_events, "absent"), None);
    }

    #[test]
    fn only_our_cgroups_name_an_owner() {
        assert_eq!(owner_pid("cairn-jepsen-1234-0-node-2"), Some(1234));
        assert_eq!(owner_pid("cairn-repro-1"), None);
        assert_eq!(owner_pid("cairn-jepsen-x-0-node-1"), None);
        assert_eq!(owner_pid("system.slice"), None);
    }
}
