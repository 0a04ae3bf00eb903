//! One rule for the conditions under which a node cannot do its job.
//!
//! **Contract.** When openraft's core stops, or the Raft log or the state machine fails in a
//! way that retrying cannot fix, or the data dir must not be used, the node
//! 1. sets gRPC health to NOT_SERVING at once (see `agent`),
//! 2. logs one line, [`FatalCause::line`]: what happened, the path, what the node does and what
//!    the operator does,
//! 3. for damaged data only, leaves a marker file ([`MARKER_FILE_NAME`]) in the data dir that
//!    refuses every later start until an operator acts ([`check_marker`]),
//! 4. shuts down within `shutdown_timeout_ms` ([`Watchdog`] enforces the deadline whatever
//!    state the core or the storage is in) and exits with [`FatalCause::exit_code`], non-zero,
//!    so that a supervisor restarts it. Transient exhaustion (a full disk, no descriptors, no
//!    memory) leaves no marker: the node starts again once the cause is gone.
//!
//! Errors are classified here and nowhere else: [`FatalCause::from_io`] (the errno),
//! [`FatalCause::from_log_error`] (the Raft log's errors), and the variants built by the state
//! machine and the start-up checks. Health, the log line, the exit code and the marker all
//! come from the one [`FatalCause`].
//!
//! **Invariants.** Only newly found damage ([`FatalCause::Corruption`]) leaves a marker, and
//! every cause that exits [`exit::CORRUPTION`] is damage: newly found, or recorded by a marker
//! an earlier run left ([`FatalCause::MarkedCorrupt`], which leaves none of its own); no cause
//! exits 0; the watchdog exits the process at the deadline even
//! when every other thread is blocked.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Exit codes of `cairn agent` when it stops on its own (the common codes are `cairn_cli::exit`).
pub mod exit {
    /// A resource ran out (disk space, file descriptors, memory): start again once freed.
    pub const RESOURCE_EXHAUSTED: u8 = 10;
    /// The disk failed (an I/O error other than exhaustion): check it, then start again.
    pub const STORAGE_ERROR: u8 = 11;
    /// Stored data is damaged: the data dir is marked and the node refuses to start.
    pub const CORRUPTION: u8 = 12;
    /// openraft's core stopped for no storage reason (a bug): start again, report the log.
    pub const RAFT_STOPPED: u8 = 13;
    /// A shutdown did not finish within `shutdown_timeout_ms`.
    pub const SHUTDOWN_TIMEOUT: u8 = 14;
    /// The data dir belongs to another cluster or node, or this node must be re-added first.
    pub const DATA_DIR_REFUSED: u8 = 15;
}

/// The marker a node leaves in its data dir when it found damaged data.
pub const MARKER_FILE_NAME: &str = "CORRUPT";

/// Why a node stops (or refuses to start). See the module docs for what follows from each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FatalCause {
    /// ENOSPC or EDQUOT while doing `doing` on `path`.
    DiskFull { path: PathBuf, doing: String },
    /// EMFILE or ENFILE.
    OutOfDescriptors { path: PathBuf, doing: String },
    /// ENOMEM.
    OutOfMemory { path: PathBuf, doing: String },
    /// Any other I/O failure of the disk (EIO, EROFS, ...), or a storage error that is neither
    /// exhaustion nor damage.
    StorageFailed { path: PathBuf, doing: String },
    /// Stored data failed a check: `file` is the damaged file, `detail` says where in it (the
    /// byte offset or the log index) and what is wrong.
    Corruption { file: PathBuf, detail: String },
    /// A data dir marked damaged by an earlier run: `marker` is the file, `recorded` its line.
    MarkedCorrupt { marker: PathBuf, recorded: String },
    /// openraft's core stopped, and no storage failure explains why.
    RaftStopped { reason: String },
    /// The data dir may not be used by this node as configured; `reason` names both sides
    /// (cluster ids, node ids) and what to do.
    DataDirRefused { reason: String },
}

/// What the node's lines say about itself.
#[derive(Debug, Clone)]
pub struct NodeContext {
    pub node_id: u64,
    pub data_dir: PathBuf,
    /// A member's client address to join through, for the advice.
    pub join_hint: String,
}

impl NodeContext {
    pub fn of(config: &crate::config::Config) -> NodeContext {
        let join_hint = config
            .join
            .clone()
            .or_else(|| {
                config
                    .members
                    .iter()
                    .find(|m| m.id != config.node_id)
                    .map(|m| m.client_address.clone())
            })
            .unwrap_or_else(|| "<a member's client address>".to_string());
        NodeContext {
            node_id: config.node_id,
            data_dir: config.data_dir.clone(),
            join_hint,
        }
    }
}

impl fmt::Display for FatalCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FatalCause::DiskFull { path, doing }
            | FatalCause::OutOfDescriptors { path, doing }
            | FatalCause::OutOfMemory { path, doing }
            | FatalCause::StorageFailed { path, doing } => {
                write!(f, "{doing} (on {})", path.display())
            }
            FatalCause::Corruption { file, detail } => {
                let file = file.display().to_string();
                if detail.contains(&file) {
                    write!(f, "{detail}")
                } else {
                    write!(f, "in {file}: {detail}")
                }
            }
            FatalCause::MarkedCorrupt { marker, recorded } => write!(
                f,
                "the data dir is marked damaged by {}, which says: {recorded}",
                marker.display()
            ),
            FatalCause::RaftStopped { reason } => write!(f, "the Raft core stopped: {reason}"),
            FatalCause::DataDirRefused { reason } => write!(f, "{reason}"),
        }
    }
}

impl std::error::Error for FatalCause {}

impl FatalCause {
    /// The one classification of an operating-system error met while doing `doing` on `path`.
    pub fn from_io(doing: impl Into<String>, path: &Path, error: &io::Error) -> FatalCause {
        let doing = format!("{}: {error}", doing.into());
        FatalCause::from_errno(error.raw_os_error(), path, doing)
    }

    /// The errno decides: exhaustion (transient) or a failing disk.
    fn from_errno(errno: Option<i32>, path: &Path, doing: String) -> FatalCause {
        let path = path.to_path_buf();
        match errno {
            Some(libc::ENOSPC | libc::EDQUOT) => FatalCause::DiskFull { path, doing },
            Some(libc::EMFILE | libc::ENFILE) => FatalCause::OutOfDescriptors { path, doing },
            Some(libc::ENOMEM) => FatalCause::OutOfMemory { path, doing },
            _ => FatalCause::StorageFailed { path, doing },
        }
    }

    /// The classification of a Raft log error that is damage or the operating system
    /// refusing; `log_dir` is the log's directory, named when the error cannot name a file of
    /// its own; a log written by a newer build is a refused data dir. `None` for any other
    /// error (a locked dir, the wrong engine, a failure of the log's own logic): at start
    /// those are configuration problems, reported as they are.
    pub fn from_log_error(error: &cairn_raft_log::LogError, log_dir: &Path) -> Option<FatalCause> {
        if let cairn_raft_log::LogError::NewerFormat { .. } = error {
            // Intact, and another build's: refused, never marked damaged.
            return Some(FatalCause::DataDirRefused {
                reason: error.to_string(),
            });
        }
        if error.is_corruption() {
            return Some(FatalCause::Corruption {
                file: error
                    .damaged_file()
                    .unwrap_or_else(|| log_dir.to_path_buf()),
                detail: error.to_string(),
            });
        }
        // The error's own text names the file it was working on.
        let os = error.os_error()?;
        Some(FatalCause::from_errno(
            os.raw_os_error(),
            log_dir,
            error.to_string(),
        ))
    }

    /// The process's exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            FatalCause::DiskFull { .. }
            | FatalCause::OutOfDescriptors { .. }
            | FatalCause::OutOfMemory { .. } => exit::RESOURCE_EXHAUSTED,
            FatalCause::StorageFailed { .. } => exit::STORAGE_ERROR,
            FatalCause::Corruption { .. } | FatalCause::MarkedCorrupt { .. } => exit::CORRUPTION,
            FatalCause::RaftStopped { .. } => exit::RAFT_STOPPED,
            FatalCause::DataDirRefused { .. } => exit::DATA_DIR_REFUSED,
        }
    }

    /// Whether this cause marks the data dir (newly found damage only).
    pub fn leaves_marker(&self) -> bool {
        matches!(self, FatalCause::Corruption { .. })
    }

    /// A few words for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            FatalCause::DiskFull { .. } => "disk full",
            FatalCause::OutOfDescriptors { .. } => "out of file descriptors",
            FatalCause::OutOfMemory { .. } => "out of memory",
            FatalCause::StorageFailed { .. } => "storage failed",
            FatalCause::Corruption { .. } | FatalCause::MarkedCorrupt { .. } => "damaged data",
            FatalCause::RaftStopped { .. } => "raft stopped",
            FatalCause::DataDirRefused { .. } => "data dir refused",
        }
    }

    /// What the operator does (`None`: the cause itself says it).
    fn advice(&self, node: &NodeContext) -> Option<String> {
        let marker = node.data_dir.join(MARKER_FILE_NAME);
        let rejoin = format!(
            "replace the member (docs/operations.md, \"Replace a damaged member\"): `cairn \
             member remove {id}` against the cluster, empty {dir} (which deletes the marker) \
             and start this node with `--join {join}`; it catches up from the leader",
            id = node.node_id,
            dir = node.data_dir.display(),
            join = node.join_hint,
        );
        let advice = match self {
            FatalCause::DiskFull { path, .. } => format!(
                "free space on the filesystem holding {} (or grow it), then start the node \
                 again: it catches up from the other members",
                path.display()
            ),
            FatalCause::OutOfDescriptors { .. } => "raise the open-file limit (`ulimit -n`, \
                 LimitNOFILE=) or lower client_connections_max, then start the node again"
                .to_string(),
            FatalCause::OutOfMemory { .. } => "give the node more memory (or stop what else \
                 uses it), then start the node again"
                .to_string(),
            FatalCause::StorageFailed { path, .. } => format!(
                "check the disk holding {} (kernel log, SMART), then start the node again; if \
                 the disk is bad, {rejoin}",
                path.display()
            ),
            FatalCause::Corruption { .. } | FatalCause::MarkedCorrupt { .. } => format!(
                "the node will not start while {marker} exists. Either restore {dir} from a \
                 backup of this node's disk and delete {marker}, or {rejoin}",
                marker = marker.display(),
                dir = node.data_dir.display(),
            ),
            FatalCause::RaftStopped { .. } => format!(
                "start the node again: it rebuilds its state from its data dir. If it stops \
                 the same way again, what it stored is inconsistent: {rejoin}. Either way this \
                 is a bug: please report this log"
            ),
            FatalCause::DataDirRefused { .. } => return None,
        };
        Some(advice)
    }

    /// The one line the node logs: the cause, what the node does, what the operator does.
    pub fn line(&self, node: &NodeContext) -> String {
        let effect = match self {
            FatalCause::Corruption { .. } => format!(
                "Node {} stops (exit code {}) and marks its data dir with {}",
                node.node_id,
                self.exit_code(),
                node.data_dir.join(MARKER_FILE_NAME).display()
            ),
            FatalCause::MarkedCorrupt { .. } => format!(
                "Node {} refuses to start (exit code {}); nothing in the data dir was changed",
                node.node_id,
                self.exit_code()
            ),
            // At start, or on a snapshot from the leader that belongs to another cluster.
            FatalCause::DataDirRefused { .. } => format!(
                "Node {} stops (exit code {}); nothing in the data dir was changed",
                node.node_id,
                self.exit_code()
            ),
            _ => format!(
                "Node {} stops (exit code {})",
                node.node_id,
                self.exit_code()
            ),
        };
        match self.advice(node) {
            Some(advice) => format!(
                "FATAL {}: {self}. {effect}. What to do: {advice}.",
                self.kind()
            ),
            None => format!("FATAL {}: {self}. {effect}.", self.kind()),
        }
    }
}

/// Logs `cause`'s line and, for damaged data, marks the data dir. Returns the exit code.
/// Called once per process, by whoever found the cause (start-up, or the running agent).
pub fn announce(cause: &FatalCause, node: &NodeContext) -> u8 {
    let line = cause.line(node);
    tracing::error!(kind = cause.kind(), "{line}");
    if cause.leaves_marker() {
        if let Err(e) = write_marker(&node.data_dir, &format!("{}: {cause}", cause.kind())) {
            tracing::error!(error = %e, "cannot write the damaged-data marker in {}", node.data_dir.display());
        }
    }
    cause.exit_code()
}

/// Writes the marker (what was found, and when) durably: whole or absent after a crash.
fn write_marker(data_dir: &Path, line: &str) -> io::Result<()> {
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    crate::durable::write_atomically(
        &data_dir.join(MARKER_FILE_NAME),
        format!("{line}\nwritten_at_unix_ms {unix_ms}\n").as_bytes(),
    )
}

/// The longest marker read back: the file is ours (a line and a time), but bounded anyway.
const MARKER_BYTES_MAX: u64 = 64 * 1024;

/// Refuses a data dir that an earlier run marked damaged.
pub fn check_marker(data_dir: &Path) -> Result<(), FatalCause> {
    let marker = data_dir.join(MARKER_FILE_NAME);
    match crate::durable::read_small(&marker, MARKER_BYTES_MAX) {
        Ok(None) => Ok(()),
        Ok(Some(text)) => {
            let recorded = text.lines().next().unwrap_or("").trim().to_string();
            Err(FatalCause::MarkedCorrupt { marker, recorded })
        }
        // Unreadable (or not what we write): refuse too, naming the error (the operator
        // removes it).
        Err(e) => Err(FatalCause::MarkedCorrupt {
            marker,
            recorded: format!("(unreadable: {e})"),
        }),
    }
}

/// What a shutdown is doing now, for the watchdog's line.
#[derive(Clone, Default)]
pub struct ShutdownProgress(Arc<Mutex<&'static str>>);

impl ShutdownProgress {
    pub fn set(&self, stage: &'static str) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = stage;
    }

    pub fn stage(&self) -> &'static str {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Ends the process at a shutdown's deadline. An OS thread of its own, so that it fires even
/// when the async runtime or the storage threads are stuck; the process exits as soon as the
/// shutdown finishes, which ends it too.
pub struct Watchdog;

impl Watchdog {
    /// Arms the watchdog: if the process still runs `deadline` from now, it logs which stage
    /// did not stop and exits with `exit_code`.
    pub fn arm(deadline: Duration, progress: ShutdownProgress, exit_code: u8) {
        let spawned = std::thread::Builder::new()
            .name("shutdown-watchdog".into())
            .spawn(move || {
                std::thread::sleep(deadline);
                let line = format!(
                    "shutdown did not finish within shutdown_timeout_ms ({} ms): {} did not \
                     stop; exiting with code {exit_code}",
                    deadline.as_millis(),
                    progress.stage()
                );
                tracing::error!("{line}");
                // Also straight to stderr: the log writer may be what is stuck.
                eprintln!("cairn: {line}");
                std::process::exit(i32::from(exit_code));
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the shutdown watchdog");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeContext {
        NodeContext {
            node_id: 3,
            data_dir: PathBuf::from("/var/lib/cairn"),
            join_hint: "10.0.0.1:7001".into(),
        }
    }

    #[test]
    fn the_errno_decides_between_exhaustion_and_failure() {
        // ENOSPC, EDQUOT, EMFILE, ENFILE and ENOMEM are transient (exit 10, no marker); EIO is
        // a storage failure (exit 11). Each line names the path and says what to do.
        let path = Path::new("/var/lib/cairn/raft-log");
        for (errno, kind) in [
            (libc::ENOSPC, "disk full"),
            (libc::EDQUOT, "disk full"),
            (libc::EMFILE, "out of file descriptors"),
            (libc::ENFILE, "out of file descriptors"),
            (libc::ENOMEM, "out of memory"),
        ] {
            let cause = FatalCause::from_io("write", path, &io::Error::from_raw_os_error(errno));
            assert_eq!(cause.kind(), kind);
            assert_eq!(cause.exit_code(), exit::RESOURCE_EXHAUSTED);
            assert!(!cause.leaves_marker());
            let line = cause.line(&node());
            assert!(line.contains("/var/lib/cairn/raft-log"), "{line}");
            assert!(line.contains("start the node again"), "{line}");
        }
        let cause = FatalCause::from_io("write", path, &io::Error::from_raw_os_error(libc::EIO));
        assert_eq!(cause.exit_code(), exit::STORAGE_ERROR);
    }

    #[test]
    fn a_log_error_is_classified_only_when_it_is_damage_or_the_operating_systems() {
        // The errno of a log I/O error decides as for any other, and the line keeps the
        // log's own text (which names the file); a locked dir is no fatal condition.
        use cairn_raft_log::LogError;
        let log_dir = Path::new("/var/lib/cairn/raft-log");
        let full = LogError::Io {
            context: "append to /var/lib/cairn/raft-log/segments/7.wal".into(),
            source: io::Error::from_raw_os_error(libc::ENOSPC),
        };
        match FatalCause::from_log_error(&full, log_dir) {
            Some(FatalCause::DiskFull { path, doing }) => {
                assert_eq!(path, log_dir);
                assert_eq!(doing, full.to_string());
            }
            other => panic!("expected DiskFull, got {other:?}"),
        }
        let locked = LogError::Locked {
            dir: log_dir.to_path_buf(),
            holder_pid: Some(7),
        };
        assert_eq!(FatalCause::from_log_error(&locked, log_dir), None);
    }

    #[test]
    fn damage_marks_the_data_dir_and_the_line_names_the_file_and_both_choices() {
        let cause = FatalCause::Corruption {
            file: PathBuf::from("/var/lib/cairn/snapshots/snap-1.snap"),
            detail: "damaged snapshot: record length at byte 120".into(),
        };
        assert!(cause.leaves_marker());
        assert_eq!(cause.exit_code(), exit::CORRUPTION);
        let line = cause.line(&node());
        for needle in [
            "snap-1.snap",
            "byte 120",
            "/var/lib/cairn/CORRUPT",
            "backup",
            "cairn member remove 3",
            "--join 10.0.0.1:7001",
        ] {
            assert!(line.contains(needle), "{needle:?} missing from {line}");
        }
        assert!(!line.contains('\n'), "one line: {line}");
    }

    #[test]
    fn a_marked_data_dir_is_refused_until_the_marker_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        check_marker(dir.path()).expect("no marker");
        let node = NodeContext {
            data_dir: dir.path().to_path_buf(),
            ..node()
        };
        let code = announce(
            &FatalCause::Corruption {
                file: dir.path().join("raft-log/segments/x.wal"),
                detail: "bad crc".into(),
            },
            &node,
        );
        assert_eq!(code, exit::CORRUPTION);
        match check_marker(dir.path()) {
            Err(cause @ FatalCause::MarkedCorrupt { .. }) => {
                assert_eq!(cause.exit_code(), exit::CORRUPTION);
                let line = cause.line(&node);
                assert!(line.contains("x.wal"), "the first report is kept: {line}");
                assert!(line.contains("refuses to start"), "{line}");
            }
            other => panic!("expected MarkedCorrupt, got {other:?}"),
        }
        std::fs::remove_file(dir.path().join(MARKER_FILE_NAME)).unwrap();
        check_marker(dir.path()).expect("removed: starts again");
    }
}
