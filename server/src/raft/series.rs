//! The Raft module's series: proposals, snapshots and the peer network (modelled on etcd's
//! `etcd_server_proposals_*`, `etcd_debugging_snap_save_*` / `etcd_network_snapshot_*` and
//! `etcd_network_peer_*`). Through the `metrics` facade: nothing is recorded unless the
//! process installed a recorder.
//!
//! Series whose labels are known in advance (the kinds of a failed proposal) and the
//! snapshot histograms are registered at zero when the recorder is installed, so that
//! dashboards and alerts see them before the first event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{Counter, Histogram};

use super::types::NodeId;

pub const PROPOSALS_COMMITTED: &str = "cairn_server_proposals_committed_total";
pub const PROPOSALS_FAILED: &str = "cairn_server_proposals_failed_total";
pub const PROPOSALS_PENDING: &str = "cairn_server_proposals_pending";
pub const SNAPSHOT_SAVE_DURATION: &str = "cairn_snapshot_save_duration_seconds";
pub const SNAPSHOT_SAVE_BYTES: &str = "cairn_snapshot_save_bytes";
pub const SNAPSHOT_INSTALL_DURATION: &str = "cairn_snapshot_install_duration_seconds";
pub const SNAPSHOT_INSTALL_BYTES: &str = "cairn_snapshot_install_bytes";
pub const PEER_ROUND_TRIP_TIME: &str = "cairn_network_peer_round_trip_time_seconds";
pub const PEER_SENT_BYTES: &str = "cairn_network_peer_sent_bytes_total";
pub const PEER_RECEIVED_BYTES: &str = "cairn_network_peer_received_bytes_total";
pub const CONSISTENCY_CHECKS: &str = "cairn_consistency_checks_total";

/// Every `outcome` of [`CONSISTENCY_CHECKS`].
pub const CHECK_OUTCOMES: [&str; 4] = ["agree", "differ", "no-majority", "skipped"];

/// Every `kind` of [`PROPOSALS_FAILED`] ([`failure_of`]'s answers).
pub const FAILURE_KINDS: [&str; 5] = [
    "not_leader",
    "unavailable",
    "outcome_unknown",
    "resource_exhausted",
    "internal",
];

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
    describe_histogram!(
        PEER_ROUND_TRIP_TIME,
        Unit::Seconds,
        "Round-trip time of heartbeats (AppendEntries without entries, which the follower \
         answers without touching its disk) to each peer, by `to`."
    );
    describe_counter!(
        PEER_SENT_BYTES,
        Unit::Bytes,
        "Bytes of Raft messages (requests and replies) sent to each peer, by `to`."
    );
    describe_counter!(
        PEER_RECEIVED_BYTES,
        Unit::Bytes,
        "Bytes of Raft messages (requests and replies) received from each peer, by `from`."
    );
    describe_counter!(
        CONSISTENCY_CHECKS,
        "Consistency checks this node ran as leader, by `outcome`: agree (every member's table \
         digest equal), differ (some differ from the majority: CORRUPT raised), no-majority, \
         or skipped (members of different builds)."
    );
    for kind in FAILURE_KINDS {
        metrics::counter!(PROPOSALS_FAILED, "kind" => kind).absolute(0);
    }
    for outcome in CHECK_OUTCOMES {
        metrics::counter!(CONSISTENCY_CHECKS, "outcome" => outcome).absolute(0);
    }
    for histogram in [
        SNAPSHOT_SAVE_DURATION,
        SNAPSHOT_SAVE_BYTES,
        SNAPSHOT_INSTALL_DURATION,
        SNAPSHOT_INSTALL_BYTES,
    ] {
        // Registered, with no sample yet: rendered with a count of 0.
        let _ = metrics::histogram!(histogram);
    }
}

/// One peer's network series: registered once (the only allocation of their labels),
/// then recorded through their handles, a few atomic operations per message.
pub struct PeerSeries {
    sent_bytes: Counter,
    received_bytes: Counter,
    round_trip: Histogram,
}

impl PeerSeries {
    fn register(peer: NodeId) -> PeerSeries {
        let id = peer.to_string();
        PeerSeries {
            sent_bytes: metrics::counter!(PEER_SENT_BYTES, "to" => id.clone()),
            received_bytes: metrics::counter!(PEER_RECEIVED_BYTES, "from" => id.clone()),
            round_trip: metrics::histogram!(PEER_ROUND_TRIP_TIME, "to" => id),
        }
    }

    pub fn sent(&self, bytes: usize) {
        self.sent_bytes.increment(bytes as u64);
    }

    pub fn received(&self, bytes: usize) {
        self.received_bytes.increment(bytes as u64);
    }

    pub fn round_trip(&self, elapsed: Duration) {
        self.round_trip.record(elapsed.as_secs_f64());
    }
}

/// Each peer's [`PeerSeries`], registered the first time the peer is met. Only peers the
/// peer gate admitted, or that the membership names, are ever looked up: the label set
/// stays as small as the membership's history.
#[derive(Default)]
pub struct PeerSeriesMap(Mutex<HashMap<NodeId, Arc<PeerSeries>>>);

impl PeerSeriesMap {
    /// A map when metrics are recorded; `None` (nothing measured at all) otherwise.
    pub fn when_recording() -> Option<Arc<PeerSeriesMap>> {
        crate::recorder::recording().then(|| Arc::new(PeerSeriesMap::default()))
    }

    pub fn of(&self, peer: NodeId) -> Arc<PeerSeries> {
        let mut peers = self.0.lock().unwrap_or_else(|e| e.into_inner());
        peers
            .entry(peer)
            .or_insert_with(|| Arc::new(PeerSeries::register(peer)))
            .clone()
    }
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

/// One consistency check ended with `outcome` (one of [`CHECK_OUTCOMES`]).
pub fn consistency_check(outcome: &'static str) {
    debug_assert!(CHECK_OUTCOMES.contains(&outcome), "{outcome}");
    metrics::counter!(CONSISTENCY_CHECKS, "outcome" => outcome).increment(1);
}

pub fn snapshot_saved(elapsed: Duration, size_bytes: u64) {
    metrics::histogram!(SNAPSHOT_SAVE_DURATION).record(elapsed.as_secs_f64());
    metrics::histogram!(SNAPSHOT_SAVE_BYTES).record(size_bytes as f64);
}

pub fn snapshot_installed(elapsed: Duration, size_bytes: u64) {
    metrics::histogram!(SNAPSHOT_INSTALL_DURATION).record(elapsed.as_secs_f64());
    metrics::histogram!(SNAPSHOT_INSTALL_BYTES).record(size_bytes as f64);
}
