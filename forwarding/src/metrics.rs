//! Metric names and labels of the forwarding layer (the `metrics` facade;
//! the node installs the exporter).
//!
//! - [`CALLS_TOTAL`] `{method, outcome}`: every forwarded call (one attempt
//!   sent to the leader) by RPC method and outcome.
//! - [`DIALS_TOTAL`] `{outcome}`: every dial of the leader channel (the first
//!   one and every re-dial after a leader change or a failure).
//! - [`LATENCY_SECONDS`] `{method}`: the duration of each forwarded call,
//!   answered or not.
//! - [`SERVED_TOTAL`] `{method, outcome}`: requests served by the
//!   `ForwardingService` on the leader.
//!
//! `method` is `write`, `delete`, `read`, `list` or `read_index` (a
//! follower's request for a read index, [`crate::LeaderReadIndex`]). `outcome` is `ok`, the
//! snake-case kind of the contract error answered (`cas_failure`,
//! `not_leader`, ...), or how the call failed (`cairn_request::Failure::label`):
//! `not_sent` (no leader known, or the dial failed), `lost`, `no_answer`,
//! `too_large`, `foreign`.

pub const CALLS_TOTAL: &str = "cairn_forwarding_calls_total";
pub const DIALS_TOTAL: &str = "cairn_forwarding_dials_total";
pub const LATENCY_SECONDS: &str = "cairn_forwarding_latency_seconds";
pub const SERVED_TOTAL: &str = "cairn_forwarding_served_total";

/// Registers the descriptions of every forwarding metric with the installed
/// recorder (call once after installing it; harmless without one).
pub fn describe() {
    metrics::describe_counter!(
        CALLS_TOTAL,
        "Calls forwarded from this follower to the leader, by method and outcome"
    );
    metrics::describe_counter!(
        DIALS_TOTAL,
        "Dials of the cached channel to the leader (first dial and re-dials), by outcome"
    );
    metrics::describe_histogram!(
        LATENCY_SECONDS,
        metrics::Unit::Seconds,
        "Duration of each call forwarded to the leader"
    );
    metrics::describe_counter!(
        SERVED_TOTAL,
        "Forwarded requests served by this node's ForwardingService, by method and outcome"
    );
}

/// The RPCs that are forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    Write,
    Delete,
    WriteStatus,
    Read,
    List,
    ReadIndex,
    Lease,
}

impl Method {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Method::Write => "write",
            Method::Delete => "delete",
            Method::WriteStatus => "write_status",
            Method::Read => "read",
            Method::List => "list",
            Method::ReadIndex => "read_index",
            Method::Lease => "lease",
        }
    }

    /// Whether a call of this method changes state (and so may be retried
    /// only when it certainly did not apply).
    pub(crate) fn operation(self) -> cairn_request::Operation {
        match self {
            Method::Write | Method::Delete | Method::WriteStatus | Method::Lease => {
                cairn_request::Operation::Mutation
            }
            Method::Read | Method::List | Method::ReadIndex => cairn_request::Operation::Read,
        }
    }
}

/// The label of a contract error kind.
pub(crate) use cairn_request::decide::kind_label;

pub(crate) fn record_call(method: Method, outcome: &'static str, elapsed: std::time::Duration) {
    metrics::counter!(CALLS_TOTAL, "method" => method.label(), "outcome" => outcome).increment(1);
    metrics::histogram!(LATENCY_SECONDS, "method" => method.label()).record(elapsed.as_secs_f64());
}

pub(crate) fn record_dial(ok: bool) {
    let outcome = if ok { "ok" } else { "error" };
    metrics::counter!(DIALS_TOTAL, "outcome" => outcome).increment(1);
}

pub(crate) fn record_served(method: Method, outcome: &'static str) {
    metrics::counter!(SERVED_TOTAL, "method" => method.label(), "outcome" => outcome).increment(1);
}
