//! The memory this node may use, and the capacity defaults derived from it
//! (`docs/operations.md`, "Capacity").
//!
//! A node holds its whole table in memory, so its space quota (`data_bytes_max`) and the
//! bytes its history may keep (`history_bytes_max`) default to shares of the memory it may
//! use: the limit of its memory cgroup (v2 `memory.max`, or v1 `memory.limit_in_bytes`),
//! else the machine's memory ([`memory_limit_bytes`]). The shares ([`capacity_defaults`])
//! leave room for what is not the table:
//!
//! - a second table while a snapshot from the leader is installed (the new one is built
//!   beside the one readers still see): one more `data_bytes_max`;
//! - the history's older images: `history_bytes_max`;
//! - watch buffers, requests in flight, write batches, the runtime: the rest.
//!
//! `memory − 128 MiB` is shared as 40 % table, 40 % a second table during an install,
//! 10 % history, 10 % the rest.

use std::path::Path;

/// Memory set aside for the process itself (code, runtime, thread stacks, gRPC buffers)
/// before the shares are taken.
pub const BASE_RESERVE_BYTES: u64 = 128 * 1024 * 1024;

/// The smallest defaults, for a machine with very little memory.
pub const DATA_BYTES_MAX_MIN: u64 = 16 * 1024 * 1024;
pub const HISTORY_BYTES_MAX_MIN: u64 = 4 * 1024 * 1024;

/// `(data_bytes_max, history_bytes_max)` for a node that may use `memory_bytes`.
pub fn capacity_defaults(memory_bytes: u64) -> (u64, u64) {
    let shared = memory_bytes.saturating_sub(BASE_RESERVE_BYTES);
    let data = (shared / 10 * 4).max(DATA_BYTES_MAX_MIN);
    let history = (shared / 10).max(HISTORY_BYTES_MAX_MIN);
    (data, history)
}

/// Where the memory limit came from, for the log line at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemorySource {
    CgroupV2(String),
    CgroupV1(String),
    Machine,
}

/// The memory this process may use: its cgroup's limit if it has one below the machine's
/// memory, else the machine's memory (`/proc/meminfo`'s MemTotal). `None` when neither can
/// be read (not Linux).
pub fn memory_limit_bytes() -> Option<(u64, MemorySource)> {
    let machine = machine_memory_bytes();
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|text| cgroup_limit(&text, Path::new("/sys/fs/cgroup")));
    match (cgroup, machine) {
        (Some((limit, source)), Some(machine)) if limit < machine => Some((limit, source)),
        (Some((limit, source)), None) => Some((limit, source)),
        (_, Some(machine)) => Some((machine, MemorySource::Machine)),
        (None, None) => None,
    }
}

fn machine_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo_total(&text)
}

/// MemTotal of `/proc/meminfo`, in bytes.
pub fn parse_meminfo_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The memory limit of the cgroup `/proc/self/cgroup` (`text`) names, read under `root`:
/// v2 (`0::/path` → `root/path/memory.max`) or v1 (`N:memory:/path` →
/// `root/memory/path/memory.limit_in_bytes`). "max", or v1's huge "no limit" value, is no
/// limit.
pub fn cgroup_limit(text: &str, root: &Path) -> Option<(u64, MemorySource)> {
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let relative = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "memory") {
            let file = root
                .join("memory")
                .join(relative)
                .join("memory.limit_in_bytes");
            if let Some(limit) = read_limit(&file) {
                return Some((limit, MemorySource::CgroupV1(file.display().to_string())));
            }
        } else if controllers.is_empty() {
            let file = root.join(relative).join("memory.max");
            if let Some(limit) = read_limit(&file) {
                return Some((limit, MemorySource::CgroupV2(file.display().to_string())));
            }
        }
    }
    None
}

/// A limit file's value; `None` for "max", v1's "no limit" (above 2^60) or anything else.
fn read_limit(file: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let value: u64 = text.trim().parse().ok()?;
    (value < 1 << 60).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_shares_of_the_memory_past_the_reserve() {
        const MIB: u64 = 1024 * 1024;
        // (memory, data_bytes_max, history_bytes_max)
        let table = [
            (
                700 * MIB,
                228 * MIB + 819 * 1024 + 204,
                57 * MIB + 204 * 1024 + 819,
            ),
            (128 * MIB, DATA_BYTES_MAX_MIN, HISTORY_BYTES_MAX_MIN),
            (0, DATA_BYTES_MAX_MIN, HISTORY_BYTES_MAX_MIN),
            (
                24 * 1024 * MIB,
                (24 * 1024 - 128) * MIB / 10 * 4,
                (24 * 1024 - 128) * MIB / 10,
            ),
        ];
        for (memory, data, history) in table {
            let (d, h) = capacity_defaults(memory);
            assert_eq!(d, data, "data_bytes_max for {memory}");
            assert_eq!(h, history, "history_bytes_max for {memory}");
            assert!(2 * d + h <= memory.max(2 * DATA_BYTES_MAX_MIN + HISTORY_BYTES_MAX_MIN));
        }
    }

    #[test]
    fn cgroup_limits_are_read_for_v1_and_v2_and_max_is_no_limit() {
        let root = tempfile::tempdir().unwrap();
        let v2 = root.path().join("system.slice/cairn.service");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(v2.join("memory.max"), "734003200\n").unwrap();
        assert_eq!(
            cgroup_limit("0::/system.slice/cairn.service\n", root.path()).map(|l| l.0),
            Some(734_003_200)
        );
        std::fs::write(v2.join("memory.max"), "max\n").unwrap();
        assert_eq!(
            cgroup_limit("0::/system.slice/cairn.service\n", root.path()),
            None
        );

        let v1 = root.path().join("memory/cairn-1");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "524288000\n").unwrap();
        let text = "12:cpu,cpuacct:/\n4:memory:/cairn-1\n";
        assert_eq!(
            cgroup_limit(text, root.path()).map(|l| l.0),
            Some(524_288_000)
        );
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(cgroup_limit(text, root.path()), None, "v1's no-limit value");
    }

    #[test]
    fn meminfo_total_is_read_in_bytes() {
        let text = "MemTotal:       24576000 kB\nMemFree:        1000 kB\n";
        assert_eq!(parse_meminfo_total(text), Some(24_576_000 * 1024));
        assert_eq!(parse_meminfo_total("nothing"), None);
    }
}
