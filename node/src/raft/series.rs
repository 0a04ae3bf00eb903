//! The Raft module's series: proposals and snapshots (modelled on etcd's
//! `etcd_server_proposals_*` and `etcd_debugging_snap_save_*` / `etcd_network_snapshot_*`).
//! Through the `metrics` facade: nothing is recorded unless the process installed a recorder.

use std::time::Duration;

pub const PROPOSALS_COMMITTED: &str = "cairn_server_proposals_committed_total";
pub const PROPOSALS_FAILED: &str = "cairn_server_proposals_failed_total";
pub const PROPOSALS_PENDING: &str = "cairn_server_proposals_pending";
pub const SNAPSHOT_SAVE_DURATION: &str = "cairn_snapshot_save_duration_seconds";
pub const SNAPSHOT_SAVE_BYTES: &str = "cairn_snapshot_save_bytes";
pub const SNAPSHOT_INSTALL_DURATION: &str = "cairn_snapshot_install_duration_seconds";
pub const SNAPSHOT_INSTALL_BYTES: &str = "cairn_snapshot_install_bytes";

pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        PROPOSALS_COMMITTED,
        "Client commands this node proposed that were committed and applied."
    );
    describe_counter!(
        PROPOSALS_FAILED,
        "Client commands this node proposed that failed, by kind (a refusal of the state \
         machine, such as a CAS conflict, is not a failure)."
    );
    describe_gauge!(
        PROPOSALS_PENDING,
        "Client commands proposed and not yet answered."
    );
    describe_histogram!(
        SNAPSHOT_SAVE_DURATION,
        Unit::Seconds,
        "Time to write a snapshot of the state machine to disk."
    );
    describe_histogram!(
        SNAPSHOT_SAVE_BYTES,
        Unit::Bytes,
        "Size of each snapshot written."
    );
    describe_histogram!(
        SNAPSHOT_INSTALL_DURATION,
        Unit::Seconds,
        "Time to install a snapshot received from the leader (after its transfer)."
    );
    describe_histogram!(
        SNAPSHOT_INSTALL_BYTES,
        Unit::Bytes,
        "Size of each snapshot received from the leader and installed."
    );
}

/// The failure label of a proposal's answer: `None` when the command was committed (the
/// state machine's own refusals, such as a CAS conflict, are answers of a committed entry).
pub fn failure_of<T>(result: &Result<T, cairn_proto::error::ApiError>) -> Option<&'static str> {
    use cairn_proto::error::ApiError;
    match result {
        Ok(_) => None,
        Err(ApiError::NotLeader { .. }) => Some("not_leader"),
        Err(ApiError::Unavailable(_)) => Some("unavailable"),
        Err(ApiError::Inconsistent(_)) => Some("outcome_unknown"),
        Err(ApiError::ResourceExhausted { .. }) => Some("resource_exhausted"),
        Err(ApiError::Internal(_)) => Some("internal"),
        Err(_) => None,
    }
}

/// Counts a proposal pending until dropped; [`Pending::answered`] records its outcome.
pub struct Pending(());

impl Pending {
    pub fn start() -> Pending {
        metrics::gauge!(PROPOSALS_PENDING).increment(1.0);
        Pending(())
    }

    /// `failure`: the kind of error when the command could not be carried out; `None` when
    /// it was committed (whatever the state machine answered).
    pub fn answered(self, failure: Option<&'static str>) {
        match failure {
            None => metrics::counter!(PROPOSALS_COMMITTED).increment(1),
            Some(kind) => metrics::counter!(PROPOSALS_FAILED, "kind" => kind).increment(1),
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        metrics::gauge!(PROPOSALS_PENDING).decrement(1.0);
    }
}

pub fn snapshot_saved(elapsed: Duration, size_bytes: u64) {
    metrics::histogram!(SNAPSHOT_SAVE_DURATION).record(elapsed.as_secs_f64());
    metrics::histogram!(SNAPSHOT_SAVE_BYTES).record(size_bytes as f64);
}

pub fn snapshot_installed(elapsed: Duration, size_bytes: u64) {
    metrics::histogram!(SNAPSHOT_INSTALL_DURATION).record(elapsed.as_secs_f64());
    metrics::histogram!(SNAPSHOT_INSTALL_BYTES).record(size_bytes as f64);
}
