//! The one error enum of the raft-log layer.

use std::path::Path;
use std::path::PathBuf;

use crate::engine::sled_corrupt_file;

/// sled's corruption errors name a "disk pointer"; this names the file (and the offset).
fn describe_engine_error(dir: &Path, source: &sled::Error) -> String {
    match (source, sled_corrupt_file(dir, source)) {
        (
            sled::Error::Corruption {
                at: Some(sled::DiskPtr::Inline(offset)),
                ..
            },
            Some(log),
        ) => format!(
            "sled log {} is corrupt at byte offset {offset}",
            log.display()
        ),
        (sled::Error::Corruption { .. }, Some(blob)) => format!(
            "sled blob {} is corrupt: its checksum does not match its contents",
            blob.display()
        ),
        (sled::Error::Corruption { .. }, None) => format!(
            "sled database {} is corrupt (sled did not say where)",
            dir.display()
        ),
        (other, _) => format!("storage engine error in {}: {other}", dir.display()),
    }
}

/// Everything that can go wrong while storing or reading the Raft log.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// A stored entry failed its checksum, could not be decoded, sits under the wrong key, or is
    /// missing from the middle of the log. `index` names the entry's position in the log.
    #[error("raft log entry at index {index} is corrupt: {reason}")]
    Corrupt { index: u64, reason: String },

    /// A WAL segment is damaged before its tail, or missing: `segment` is its file (the full
    /// path) and `index` the first log index that cannot be read back.
    #[error("raft log segment {} is corrupt at entry index {index} (byte offset {offset_bytes}): {reason}", segment.display())]
    CorruptSegment {
        segment: PathBuf,
        index: u64,
        offset_bytes: u64,
        reason: String,
    },

    /// A file of the log carries a format version above what this build reads: a newer
    /// release of Cairn wrote it. Not damage: the file is intact, and nothing is changed.
    #[error(
        "{} has WAL format version {found}, and this build reads version {reads}: a newer \
         release of Cairn wrote it. Run that release (or a later one) on this data dir \
         (docs/upgrading.md)",
        file.display()
    )]
    NewerFormat {
        file: PathBuf,
        found: u32,
        reads: u32,
    },

    /// The data directory was written by another log engine than the one requested.
    #[error(
        "the raft log in {dir} was written by the `{found}` log engine, but this node is set to use `{requested}`: \
         set `log_engine = \"{found}\"` (or CAIRN_LOG_ENGINE={found}) to keep using this data dir; \
         to switch engines, stop the node, move its data dir aside and let it rejoin the cluster (or restore a snapshot)"
    )]
    EngineMismatch {
        dir: PathBuf,
        found: crate::LogEngineKind,
        requested: crate::LogEngineKind,
    },

    /// An option of [`crate::LogOptions`] is out of range.
    #[error("raft log option `{option}`: {reason}")]
    InvalidOption {
        option: &'static str,
        reason: String,
    },

    /// A sled blob file (a value sled keeps in a file of its own) fails sled's checksum. sled
    /// silently drops the blob, and everything written after it, while it recovers; `index` is
    /// the first log index found missing because of it.
    #[error("sled blob {} is corrupt (its checksum does not match its contents), and the raft log lost entries from index {index}: {reason}", blob.display())]
    CorruptBlob {
        blob: PathBuf,
        index: u64,
        reason: String,
    },

    /// A stored metadata value (vote, purged or committed log id) is corrupt.
    #[error("raft log metadata `{key}` is corrupt: {reason}")]
    CorruptMeta { key: &'static str, reason: String },

    /// Another process (or another handle in this process) holds the directory lock.
    #[error(
        "data directory {dir} is locked by another process (holder pid: {})",
        holder_pid.map(|pid| pid.to_string()).unwrap_or_else(|| "unknown".to_string())
    )]
    Locked {
        dir: PathBuf,
        holder_pid: Option<u32>,
    },

    /// An append did not start right after the last stored (or purged) index.
    #[error("append must start at index {expected_index}, but starts at {got_index}")]
    NonContiguousAppend { expected_index: u64, got_index: u64 },

    /// An operating-system I/O error, with what we were doing.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// The storage engine (sled, in `dir`) reported an error. A corruption sled located names
    /// the damaged file: a blob (`dir/blobs/N`) or sled's log (`dir/db`) and the byte offset;
    /// one it did not locate names `dir`.
    #[error("{}", describe_engine_error(dir, source))]
    Engine { dir: PathBuf, source: sled::Error },

    /// An entry or a metadata value could not be encoded.
    #[error("cannot encode {what}: {source}")]
    Encode {
        what: String,
        #[source]
        source: bincode::error::EncodeError,
    },

    /// An earlier durability point failed; the on-disk state is unknown and the store refuses
    /// further work until it is reopened.
    #[error("raft log store is poisoned by an earlier failure: {reason}")]
    Poisoned { reason: String },

    /// The writer thread is gone (the store is shutting down or the thread died).
    #[error("raft log writer thread has stopped")]
    WriterStopped,

    /// A blocking read task was cancelled or panicked.
    #[error("raft log read task failed: {reason}")]
    ReadTask { reason: String },
}

impl LogError {
    /// Wraps an I/O error with a description of the operation.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        LogError::Io {
            context: context.into(),
            source,
        }
    }

    /// Wraps an error of the sled database in `dir`.
    pub(crate) fn engine(dir: &Path, source: sled::Error) -> Self {
        LogError::Engine {
            dir: dir.to_path_buf(),
            source,
        }
    }

    /// Whether stored data failed a check (a checksum, a decode, a missing entry): reading it
    /// again will fail the same way, unlike an I/O error.
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            LogError::Corrupt { .. }
                | LogError::CorruptSegment { .. }
                | LogError::CorruptBlob { .. }
                | LogError::CorruptMeta { .. }
                | LogError::Engine {
                    source: sled::Error::Corruption { .. },
                    ..
                }
        )
    }

    /// The operating-system error underneath, if this is one (directly, or through sled).
    pub fn os_error(&self) -> Option<&std::io::Error> {
        match self {
            LogError::Io { source, .. } => Some(source),
            LogError::Engine {
                source: sled::Error::Io(source),
                ..
            } => Some(source),
            _ => None,
        }
    }

    /// The damaged file, when a corruption error can name it: a WAL segment, or a sled blob or
    /// log file. `None` for a sled corruption that sled did not locate (the message then names
    /// sled's directory).
    pub fn damaged_file(&self) -> Option<PathBuf> {
        match self {
            LogError::CorruptSegment { segment, .. } => Some(segment.clone()),
            LogError::CorruptBlob { blob, .. } => Some(blob.clone()),
            LogError::Engine { dir, source } => sled_corrupt_file(dir, source),
            _ => None,
        }
    }

    /// The index named by a corruption error, if this is one.
    pub fn corrupt_index(&self) -> Option<u64> {
        match self {
            LogError::Corrupt { index, .. }
            | LogError::CorruptSegment { index, .. }
            | LogError::CorruptBlob { index, .. } => Some(*index),
            _ => None,
        }
    }
}
