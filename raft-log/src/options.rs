//! [`LogOptions`] and the choice of engine, [`LogEngineKind`].

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;
use serde::Serialize;

/// Which engine stores the log. A data directory records the engine that wrote it (the file
/// `<dir>/ENGINE`); opening it with the other one fails with [`crate::LogError::EngineMismatch`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogEngineKind {
    /// The segmented write-ahead log (the default): entries in preallocated segment files,
    /// metadata in a small sled tree.
    #[default]
    Wal,
    /// Everything in sled (the engine of earlier releases).
    Sled,
}

impl LogEngineKind {
    /// The name used in configuration and in the `ENGINE` file.
    pub fn name(self) -> &'static str {
        match self {
            LogEngineKind::Wal => "wal",
            LogEngineKind::Sled => "sled",
        }
    }
}

impl fmt::Display for LogEngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for LogEngineKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "wal" => Ok(LogEngineKind::Wal),
            "sled" => Ok(LogEngineKind::Sled),
            other => Err(format!(
                "unknown log engine {other:?}: expected \"wal\" or \"sled\""
            )),
        }
    }
}

/// Default size of a WAL segment file.
pub const SEGMENT_SIZE_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
/// Smallest WAL segment size accepted.
pub const SEGMENT_SIZE_BYTES_MIN: u64 = 4096;
/// Default budget of the in-memory tail of recent entries.
pub const TAIL_BYTES_MAX_DEFAULT: u64 = 32 * 1024 * 1024;
/// Default bound of one `limited_get_log_entries`.
pub const READ_BYTES_MAX_DEFAULT: u64 = 4 * 1024 * 1024;

/// Options of [`crate::LogStore::open`].
#[derive(Clone, Debug)]
pub struct LogOptions {
    /// The engine; must match the one that wrote the directory.
    pub engine: LogEngineKind,
    /// WAL only: the size each segment file is preallocated to. Default 64 MiB.
    pub segment_size_bytes: u64,
    /// WAL only: the recent entries kept in memory (by encoded size) so that replication
    /// reads no disk. Entries not yet written are always kept. Default 32 MiB.
    pub tail_bytes_max: u64,
    /// The most encoded entry bytes one `limited_get_log_entries` returns (openraft reads the
    /// entries of one AppendEntries with it): entries are returned from the start of the range
    /// while their sizes add up to at most this, and always at least one, whatever its size.
    /// Default [`READ_BYTES_MAX_DEFAULT`].
    pub read_bytes_max: u64,
    /// **Dangerous, tests only.** Skip the `fdatasync`/`fsync` of files: appends are
    /// acknowledged once written to the page cache, so a power cut loses acknowledged entries.
    /// Exists so the power-cut tests can prove they notice. Default `false`.
    pub unsafe_skip_fsync_for_tests: bool,
    /// **Dangerous, tests only.** Skip the `fsync` of directories after files are created or
    /// deleted, so a power cut can lose a whole new segment. Default `false`.
    pub unsafe_skip_directory_fsync_for_tests: bool,
    /// **Dangerous, tests only.** WAL only: accept frames and batches whose crc32c does not
    /// match, so torn writes and flipped bits are read back as data. Default `false`.
    pub unsafe_skip_crc_check_for_tests: bool,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            engine: LogEngineKind::default(),
            segment_size_bytes: SEGMENT_SIZE_BYTES_DEFAULT,
            tail_bytes_max: TAIL_BYTES_MAX_DEFAULT,
            read_bytes_max: READ_BYTES_MAX_DEFAULT,
            unsafe_skip_fsync_for_tests: false,
            unsafe_skip_directory_fsync_for_tests: false,
            unsafe_skip_crc_check_for_tests: false,
        }
    }
}

impl LogOptions {
    /// The default options with `engine`.
    pub fn with_engine(engine: LogEngineKind) -> LogOptions {
        LogOptions {
            engine,
            ..LogOptions::default()
        }
    }

    /// Whether any `unsafe_*_for_tests` switch is on.
    pub fn is_unsafe(&self) -> bool {
        self.unsafe_skip_fsync_for_tests
            || self.unsafe_skip_directory_fsync_for_tests
            || self.unsafe_skip_crc_check_for_tests
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_names_parse_and_unknown_ones_are_named() {
        // The config spelling round-trips; a typo names itself and the choices.
        for kind in [LogEngineKind::Wal, LogEngineKind::Sled] {
            assert_eq!(kind.name().parse::<LogEngineKind>(), Ok(kind));
        }
        let error = "rocks".parse::<LogEngineKind>().expect_err("unknown");
        assert!(error.contains("rocks") && error.contains("wal"), "{error}");
        assert_eq!(LogOptions::default().engine, LogEngineKind::Wal);
    }
}
