//! The log's series (through the `metrics` facade: nothing is recorded unless the process
//! installed a recorder). Named like etcd's disk series (`etcd_disk_wal_fsync_duration_seconds`,
//! `etcd_disk_wal_write_bytes_total`).

use std::time::Duration;

pub const WAL_WRITE_DURATION: &str = "cairn_disk_wal_write_duration_seconds";
pub const WAL_FSYNC_DURATION: &str = "cairn_disk_wal_fsync_duration_seconds";
pub const WAL_WRITE_BYTES: &str = "cairn_disk_wal_write_bytes_total";

/// Describes the series (call once, after the recorder is installed).
pub fn describe_metrics() {
    metrics::describe_histogram!(
        WAL_WRITE_DURATION,
        metrics::Unit::Seconds,
        "Time to write one WAL batch to its segment (before its fdatasync)."
    );
    metrics::describe_histogram!(
        WAL_FSYNC_DURATION,
        metrics::Unit::Seconds,
        "Time of one WAL fdatasync (one per batch: group commit)."
    );
    metrics::describe_counter!(
        WAL_WRITE_BYTES,
        metrics::Unit::Bytes,
        "Bytes written to WAL segments."
    );
}

/// One batch written (and, when `fsync` is `Some`, synced).
pub(crate) fn record_batch(bytes: usize, write: Duration, fsync: Option<Duration>) {
    metrics::histogram!(WAL_WRITE_DURATION).record(write.as_secs_f64());
    if let Some(fsync) = fsync {
        metrics::histogram!(WAL_FSYNC_DURATION).record(fsync.as_secs_f64());
    }
    metrics::counter!(WAL_WRITE_BYTES).increment(bytes as u64);
}
