//! Trace mode: the ordered record of every mutating operation the kernel sent to the
//! filesystem, with markers that the test process inserts into the same order.
//!
//! **Contract.** While tracing is on ([`crate::PowerCutHandle::start_trace`]), every operation
//! that changed the current tree — a new file or directory, a write (with its offset and
//! bytes), a change of size (truncate, `fallocate`), a rename, an unlink or rmdir — and every
//! sync (`fsync`/`fdatasync` of a file, `fsync` of a directory) is appended to the trace, in
//! the order the filesystem applied them, *before* the kernel answers the caller. So a
//! [`crate::TraceMarker::mark`] made after a program's sync returned (a durability callback, say) lands
//! after that sync in the trace: "the program said X was durable" is ordered exactly against
//! the operations that made it so. Failed operations are not recorded.
//!
//! What is not recorded: reads, opens, closes, attribute changes other than the size (mode,
//! owner, times), and `flush` (no durability point). Files are opened with direct I/O, so
//! every `write(2)` reaches the filesystem as one (or, past the kernel's largest request,
//! several consecutive) recorded writes.
//!
//! A trace starts on an empty root: [`crate::crash_state`] rebuilds crash states from it alone.
//!
//! **Invariants.** Positions are the order of application; a marker's position is after every
//! operation whose reply the marking thread had seen; inode numbers are never reused.

use std::ffi::OsString;

/// One recorded operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceOp {
    /// A new file or directory `name` in directory `parent` (create, mknod, mkdir).
    Create {
        parent: u64,
        name: OsString,
        ino: u64,
        directory: bool,
    },
    /// `data` written at `offset` of file `ino`.
    Write {
        ino: u64,
        offset: u64,
        data: Vec<u8>,
    },
    /// File `ino` cut or extended (with zeros) to `len_bytes` (truncate, `O_TRUNC`).
    SetLen { ino: u64, len_bytes: u64 },
    /// `fallocate` of file `ino` up to `end_bytes`: extends it with zeros, never shrinks it.
    Fallocate { ino: u64, end_bytes: u64 },
    /// `name` in `parent` renamed to `new_name` in `new_parent`; `replaced` is the inode the
    /// new name named before, if any.
    Rename {
        parent: u64,
        name: OsString,
        new_parent: u64,
        new_name: OsString,
        ino: u64,
        replaced: Option<u64>,
    },
    /// `name` (naming `ino`) removed from `parent` (unlink, or rmdir when `directory`).
    Unlink {
        parent: u64,
        name: OsString,
        ino: u64,
        directory: bool,
    },
    /// `fsync` (or `fdatasync`, `data_only`) of file `ino`.
    SyncFile { ino: u64, data_only: bool },
    /// `fsync` of directory `ino`.
    SyncDirectory { ino: u64 },
    /// A marker the test process inserted ([`crate::TraceMarker::mark`]); its meaning is the test's.
    Marker(u64),
}

impl TraceOp {
    /// Whether this is a durability point (a sync of a file or a directory).
    pub fn is_sync(&self) -> bool {
        matches!(
            self,
            TraceOp::SyncFile { .. } | TraceOp::SyncDirectory { .. }
        )
    }
}

/// One entry of a trace: the operation and, for people reading a failure, the path it
/// concerned when it was applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRecord {
    pub op: TraceOp,
    pub path: String,
}

impl std::fmt::Display for TraceRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.op {
            TraceOp::Create { directory, ino, .. } => write!(
                f,
                "{} {} (ino {ino})",
                if *directory { "mkdir" } else { "create" },
                self.path
            ),
            TraceOp::Write { offset, data, .. } => write!(
                f,
                "write {} [{offset}, {}) {} bytes",
                self.path,
                offset + data.len() as u64,
                data.len()
            ),
            TraceOp::SetLen { len_bytes, .. } => write!(f, "truncate {} to {len_bytes}", self.path),
            TraceOp::Fallocate { end_bytes, .. } => {
                write!(f, "fallocate {} to {end_bytes}", self.path)
            }
            TraceOp::Rename { new_name, .. } => {
                write!(f, "rename {} -> {}", self.path, new_name.to_string_lossy())
            }
            TraceOp::Unlink { directory, .. } => write!(
                f,
                "{} {}",
                if *directory { "rmdir" } else { "unlink" },
                self.path
            ),
            TraceOp::SyncFile { data_only, .. } => write!(
                f,
                "{} {}",
                if *data_only { "fdatasync" } else { "fsync" },
                self.path
            ),
            TraceOp::SyncDirectory { .. } => write!(f, "fsync directory {}", self.path),
            TraceOp::Marker(id) => write!(f, "marker {id}"),
        }
    }
}
