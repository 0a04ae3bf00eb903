//! The one error enum of the raft-log layer.

use std::path::PathBuf;

/// Everything that can go wrong while storing or reading the Raft log.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// A stored entry failed its checksum, could not be decoded, sits under the wrong key, or is
    /// missing from the middle of the log. `index` names the entry's position in the log.
    #[error("raft log entry at index {index} is corrupt: {reason}")]
    Corrupt { index: u64, reason: String },

    /// A WAL segment is damaged before its tail, or missing: `segment` is its file name and
    /// `index` the first log index that cannot be read back.
    #[error("raft log segment {segment} is corrupt at entry index {index} (byte offset {offset_bytes}): {reason}")]
    CorruptSegment {
        segment: String,
        index: u64,
        offset_bytes: u64,
        reason: String,
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

    /// The storage engine (sled) reported an error.
    #[error("storage engine error: {0}")]
    Engine(#[from] sled::Error),

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

    /// The index named by a corruption error, if this is one.
    pub fn corrupt_index(&self) -> Option<u64> {
        match self {
            LogError::Corrupt { index, .. } | LogError::CorruptSegment { index, .. } => {
                Some(*index)
            }
            _ => None,
        }
    }
}
