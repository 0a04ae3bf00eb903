//! The ops listener: plain HTTP on `metrics_address`, for probes and Prometheus, so that
//! they work when the client port needs mutual TLS (as etcd's `--listen-metrics-urls`).
//!
//! - `GET /metrics`: every series in the Prometheus text format (see `docs/monitoring.md`).
//!   Gauges that describe state (term, indexes, resources per type, open watches) are read
//!   from the node when scraped.
//! - `GET /livez`: the process's event loop answers, no fatal condition is flagged, and the
//!   data dir takes a small write. It never depends on quorum: a probe that restarts members
//!   during a quorum loss makes the outage worse.
//! - `GET /readyz`: the checks of [`Probes::readiness`]: no storage fault, a known leader, a
//!   linearizable read that succeeds, applied within `ready_apply_lag_entries_max` of the
//!   leader's commit index, and a member (a learner only once caught up).
//! - `?verbose` on either lists every check, `[+]name ok` or `[-]name failed: why`.
//! - `GET /ui`: the read-only web console, and `GET /ui/api/...`, the JSON it polls
//!   ([`crate::console`]: authenticated and authorized as the client port is when grants
//!   are configured).
//! - Any other path: 404.
//!
//! Readiness is decided here, once: gRPC health (`agent::run_health`) reports the same
//! verdict.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use cairn_proto::v1 as pb;
use tokio::sync::watch;

use crate::fatal::FatalCause;
use crate::raft::RaftHandle;
use crate::service::ResourceApi;

/// Installs the process-wide metrics recorder ([`crate::recorder`]; once, later calls do
/// nothing) and describes every series. Without it, metrics cost nothing and `/metrics` is
/// empty.
pub fn install_recorder() -> anyhow::Result<()> {
    if crate::recorder::recording() {
        return Ok(());
    }
    // Durations that alerts take quantiles of across nodes are histograms with buckets; the
    // others (write stages, forwarding latency, sizes) stay summaries with their quantiles.
    let builder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_duration_seconds".into()),
            &LATENCY_BUCKETS_SECONDS,
        )
        .context("histogram buckets")?
        // etcd's peer round-trip time is a histogram too (from 100 µs, doubling).
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(
                crate::raft::PEER_ROUND_TRIP_TIME.to_string(),
            ),
            &LATENCY_BUCKETS_SECONDS,
        )
        .context("histogram buckets")?;
    if crate::recorder::install(builder)? {
        describe();
    }
    Ok(())
}

/// Latency buckets of the `*_duration_seconds` histograms and of the peer round-trip time,
/// from 100 µs to 8.192 s (etcd's disk histograms start at 1 ms; a WAL sync here takes
/// 0.1–0.2 ms).
const LATENCY_BUCKETS_SECONDS: [f64; 16] = [
    0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512,
    1.024, 2.048, 8.192,
];

/// One check of a probe.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    /// Why it failed; `None` when it passed.
    pub failure: Option<String>,
    /// What a passing check has to say (`?verbose` prints it).
    pub detail: Option<String>,
}

impl Check {
    fn new(name: &'static str, result: Result<(), String>) -> Check {
        Check {
            name,
            failure: result.err(),
            detail: None,
        }
    }

    /// A check that passes, saying `detail`.
    fn informing(name: &'static str, detail: String) -> Check {
        Check {
            name,
            failure: None,
            detail: Some(detail),
        }
    }
}

/// The checks of one probe, in order.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    pub checks: Vec<Check>,
}

impl Verdict {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.failure.is_none())
    }

    /// The failed checks, `name: why`, joined: for logs.
    pub fn failures(&self) -> String {
        self.checks
            .iter()
            .filter_map(|c| c.failure.as_ref().map(|f| format!("{}: {f}", c.name)))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The body of a probe's answer: `ok` (or the failures), or with `verbose` one line per
    /// check, as Kubernetes' and etcd's probes print them.
    fn render(&self, probe: &str, verbose: bool) -> String {
        let mut body = String::new();
        if verbose || !self.passed() {
            for check in &self.checks {
                match &check.failure {
                    None if verbose => match &check.detail {
                        Some(detail) => {
                            let _ = writeln!(body, "[+]{} ok: {detail}", check.name);
                        }
                        None => {
                            let _ = writeln!(body, "[+]{} ok", check.name);
                        }
                    },
                    None => {}
                    Some(why) => {
                        let _ = writeln!(body, "[-]{} failed: {why}", check.name);
                    }
                }
            }
        }
        if self.passed() {
            let _ = writeln!(body, "{probe} check passed");
        } else {
            let _ = writeln!(body, "{probe} check failed");
        }
        body
    }
}

/// What the probes look at.
#[derive(Clone)]
pub struct Probes {
    pub raft: RaftHandle,
    pub api: Arc<ResourceApi>,
    pub fatal: watch::Receiver<Option<FatalCause>>,
    pub data_dir: PathBuf,
    /// How far this node's applied index may trail the leader's commit index and still be
    /// ready.
    pub apply_lag_entries_max: u64,
    /// The bound on the linearizable read and on the data dir's write.
    pub timeout: Duration,
}

/// The readiness read: a strong List of a type that clients do not use, so the answer is
/// (almost always) empty and cheap; what matters is that it is served, and its revision.
fn probe_list() -> pb::ListRequest {
    pb::ListRequest {
        r#type: Some(pb::Type {
            group: "cairn".into(),
            group_version: "v1".into(),
            kind: "ReadinessProbe".into(),
        }),
        tenancy: None,
        name_prefix: String::new(),
        consistency: pb::Consistency::Strong as i32,
        // One resource is enough to learn the revision.
        limit: 1,
        ..pb::ListRequest::default()
    }
}

impl Probes {
    fn fatal_check(&self) -> Check {
        Check::new(
            "storage",
            match self.fatal.borrow().as_ref() {
                Some(cause) => Err(format!("{} ({cause})", cause.kind())),
                None => Ok(()),
            },
        )
    }

    /// `/livez`: no fatal condition, and the data dir takes a write. Never asks the cluster.
    pub async fn liveness(&self) -> Verdict {
        let dir = self.data_dir.clone();
        let write = tokio::task::spawn_blocking(move || {
            let probe = dir.join(".livez");
            std::fs::write(&probe, b"livez")?;
            std::fs::remove_file(&probe)
        });
        let writable = match tokio::time::timeout(self.timeout, write).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(format!("{}: {e}", self.data_dir.display())),
            Ok(Err(e)) => Err(format!("the write task failed: {e}")),
            Err(_) => Err(format!(
                "a write to {} took longer than {} ms",
                self.data_dir.display(),
                self.timeout.as_millis()
            )),
        };
        Verdict {
            checks: vec![self.fatal_check(), Check::new("data_dir", writable)],
        }
    }

    /// `/readyz` and gRPC health: may this node serve clients now?
    /// The space line of `/readyz?verbose`: usage, quota, and the alarm if raised.
    fn describe_space(&self) -> String {
        let space = self.raft.store.space();
        let usage = self.raft.store.view().usage().bytes;
        let quota = match space.quota_bytes {
            0 => "no space quota set".to_string(),
            q => format!("of the space quota {q} bytes"),
        };
        let alarms = crate::raft::capacity::alarms(space, usage);
        match alarms.first() {
            Some(alarm) => format!(
                "{usage} bytes {quota}; ALARM {}: {}",
                alarm.name, alarm.reason
            ),
            None => format!("{usage} bytes {quota}"),
        }
    }

    pub async fn readiness(&self) -> Verdict {
        let mut checks = vec![self.fatal_check()];
        let status = self.raft.status();
        let leader = match status.leader_id {
            Some(_) if status.state != "shutdown" => Ok(()),
            _ => Err(format!(
                "no leader known (this node is {} in term {})",
                status.state, status.term
            )),
        };
        let has_leader = leader.is_ok();
        checks.push(Check::new("leader", leader));
        // The read's revision is at least the leader's commit index when it was served.
        let leader_revision = if has_leader {
            let deadline = tokio::time::Instant::now() + self.timeout;
            let read = tokio::time::timeout(
                self.timeout,
                self.api.forwarder().list(probe_list(), None, deadline),
            )
            .await;
            match read {
                Ok(Ok(answer)) => Ok(answer.revision),
                Ok(Err(e)) => Err(format!("{e}")),
                Err(_) => Err(format!("no answer within {} ms", self.timeout.as_millis())),
            }
        } else {
            Err("no leader to read through".to_string())
        };
        let lag = leader_revision
            .as_ref()
            .ok()
            .map(|revision| revision.saturating_sub(self.raft.store.applied_index()));
        checks.push(Check::new(
            "linearizable_read",
            leader_revision.as_ref().map(|_| ()).map_err(Clone::clone),
        ));
        let applied = match lag {
            Some(lag) if lag <= self.apply_lag_entries_max => Ok(()),
            Some(lag) => Err(format!(
                "{lag} entries behind the leader's commit index \
                 (ready_apply_lag_entries_max = {})",
                self.apply_lag_entries_max
            )),
            None => Err("unknown: the leader's commit index was not read".to_string()),
        };
        checks.push(Check::new("applied", applied));
        let member = if status.voters.contains_key(&self.raft.node_id) {
            Ok(())
        } else if status.learners.contains_key(&self.raft.node_id) {
            match lag {
                Some(lag) if lag <= self.apply_lag_entries_max => Ok(()),
                Some(lag) => Err(format!("a learner still catching up, {lag} entries behind")),
                None => Err("a learner whose lag is unknown".to_string()),
            }
        } else {
            Err("not (yet) in the cluster's membership".to_string())
        };
        checks.push(Check::new("member", member));
        // NOSPACE does not make a node unready: reads, watches and deletes go on, and
        // deleting is how room is made. It is shown here, in `cairn status` and in metrics.
        checks.push(Check::informing("space", self.describe_space()));
        Verdict { checks }
    }
}

/// Serves the ops listener on `listener`, with the web console's routes (`None`: the
/// console is off, [`crate::console::off_router`]), until `stopped` turns true.
pub fn spawn(
    listener: tokio::net::TcpListener,
    probes: Probes,
    console: Option<crate::console::Console>,
    mut stopped: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let router = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .with_state(probes)
        .merge(match console {
            Some(console) => console.router(),
            None => crate::console::off_router(),
        })
        .fallback(not_found);
    tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(error = %e, "the ops listener failed");
        }
    })
}

fn verbose(query: &Option<String>) -> bool {
    query.as_deref().is_some_and(|q| {
        q.split('&')
            .any(|p| p == "verbose" || p.starts_with("verbose="))
    })
}

fn answer(verdict: &Verdict, probe: &str, query: &Option<String>) -> axum::response::Response {
    let code = if verdict.passed() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, verdict.render(probe, verbose(query))).into_response()
}

async fn livez(
    State(probes): State<Probes>,
    RawQuery(query): RawQuery,
) -> axum::response::Response {
    answer(&probes.liveness().await, "livez", &query)
}

async fn readyz(
    State(probes): State<Probes>,
    RawQuery(query): RawQuery,
) -> axum::response::Response {
    answer(&probes.readiness().await, "readyz", &query)
}

async fn not_found() -> axum::response::Response {
    (
        StatusCode::NOT_FOUND,
        "not found: this listener serves /metrics, /livez, /readyz and the console at /ui\n",
    )
        .into_response()
}

async fn metrics(State(probes): State<Probes>) -> axum::response::Response {
    record_state(&probes).await;
    let body = crate::recorder::render();
    (
        StatusCode::OK,
        [("content-type", "text/plain; version=0.0.4")],
        body,
    )
        .into_response()
}

// ---- The series -------------------------------------------------------------------------

pub const HAS_LEADER: &str = "cairn_server_has_leader";
pub const IS_LEADER: &str = "cairn_server_is_leader";
/// Counted where leader changes are watched (`forward`).
pub use crate::forward::LEADER_CHANGES;
pub const TERM: &str = "cairn_raft_term";
pub const COMMIT_INDEX: &str = "cairn_raft_commit_index";
pub const APPLIED_INDEX: &str = "cairn_raft_applied_index";
pub const LAST_LOG_INDEX: &str = "cairn_raft_last_log_index";
pub const SNAPSHOT_INDEX: &str = "cairn_raft_snapshot_index";
pub const RESOURCES: &str = "cairn_resources";
pub const WATCHES_OPEN: &str = "cairn_watches_open";
pub const WATCH_EVENTS_QUEUED: &str = "cairn_watch_events_queued_total";
pub const WATCHES_CLOSED_LAGGING: &str = "cairn_watches_closed_lagging_total";
pub const WATCH_UNREAD_BYTES: &str = "cairn_watch_unread_bytes";
pub const DATA_BYTES: &str = "cairn_data_bytes";
pub const DATA_BYTES_QUOTA: &str = "cairn_data_bytes_quota";
pub const HISTORY_BYTES: &str = "cairn_history_bytes";
pub const ALARM_ACTIVE: &str = "cairn_alarm_active";
pub const LEASES: &str = "cairn_leases";
pub const LEASES_EXPIRED_TOTAL: &str = "cairn_leases_expired_total";

fn describe() {
    use metrics::{describe_counter, describe_gauge};
    describe_gauge!(HAS_LEADER, "1 when this node knows a leader, else 0.");
    describe_gauge!(IS_LEADER, "1 when this node is the leader, else 0.");
    describe_counter!(LEADER_CHANGES, "Leader changes this node has seen.");
    describe_gauge!(TERM, "The Raft term this node is in.");
    describe_gauge!(
        COMMIT_INDEX,
        "The highest log index this node knows committed."
    );
    describe_gauge!(
        APPLIED_INDEX,
        "The highest log index this node has applied."
    );
    describe_gauge!(LAST_LOG_INDEX, "The last index in this node's log.");
    describe_gauge!(
        SNAPSHOT_INDEX,
        "The last index covered by this node's snapshot."
    );
    describe_gauge!(RESOURCES, "Resources stored, per type (group.Kind).");
    describe_gauge!(WATCHES_OPEN, "Watches open on this node.");
    describe_counter!(
        WATCH_EVENTS_QUEUED,
        "Watch events handed to open watches (buffered for their streams)."
    );
    describe_counter!(
        WATCHES_CLOSED_LAGGING,
        "Watches closed because their reader fell behind its buffer."
    );
    describe_gauge!(
        WATCH_UNREAD_BYTES,
        "Bytes of watch events buffered and not yet read, over every watch."
    );
    describe_gauge!(
        DATA_BYTES,
        "Bytes the state machine accounts for (docs/operations.md, Capacity)."
    );
    describe_gauge!(
        DATA_BYTES_QUOTA,
        "The cluster's space quota on cairn_data_bytes (0: none set)."
    );
    describe_gauge!(
        HISTORY_BYTES,
        "Bytes of older resource images the history holds (bounded by history_bytes_max)."
    );
    describe_gauge!(
        ALARM_ACTIVE,
        "1 while the alarm named by the label (NOSPACE, CORRUPT) is raised, else 0."
    );
    describe_gauge!(LEASES, "How many leases exist.");
    describe_counter!(
        LEASES_EXPIRED_TOTAL,
        "Leases this node expired as leader (their holders stopped keeping them alive)."
    );
    crate::raft::describe_metrics();
    crate::fairness::describe_metrics();
    crate::backup::describe_metrics();
    crate::grpc_metrics::describe();
    cairn_raft_log::describe_metrics();
}

/// Sets the gauges read from the node's state, before a scrape renders them.
async fn record_state(probes: &Probes) {
    let status = probes.raft.status();
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    metrics::gauge!(HAS_LEADER).set(flag(status.leader_id.is_some()));
    metrics::gauge!(IS_LEADER).set(flag(status.leader_id == Some(status.node_id)));
    metrics::gauge!(TERM).set(status.term as f64);
    metrics::gauge!(COMMIT_INDEX).set(probes.raft.committed_index().await as f64);
    metrics::gauge!(APPLIED_INDEX).set(status.applied_index as f64);
    metrics::gauge!(LAST_LOG_INDEX).set(status.last_log_index as f64);
    metrics::gauge!(SNAPSHOT_INDEX).set(status.snapshot_index as f64);
    let store = &probes.raft.store;
    for (type_, count) in store.view().count_by_type() {
        metrics::gauge!(RESOURCES, "type" => type_).set(count as f64);
    }
    let space = store.space();
    metrics::gauge!(DATA_BYTES).set(store.view().usage().bytes as f64);
    metrics::gauge!(DATA_BYTES_QUOTA).set(space.quota_bytes as f64);
    metrics::gauge!(HISTORY_BYTES).set(store.history_bytes() as f64);
    metrics::gauge!(ALARM_ACTIVE, "alarm" => "NOSPACE").set(flag(space.alarm_index.is_some()));
    metrics::gauge!(ALARM_ACTIVE, "alarm" => "CORRUPT")
        .set(flag(store.corrupt_alarm().is_raised()));
    metrics::gauge!(LEASES).set(store.view().lease_count() as f64);
    let watches = store.watch_stats();
    metrics::gauge!(WATCHES_OPEN).set(watches.open as f64);
    metrics::gauge!(WATCH_UNREAD_BYTES).set(watches.unread_bytes as f64);
    metrics::counter!(WATCH_EVENTS_QUEUED).absolute(watches.events_queued_total);
    metrics::counter!(WATCHES_CLOSED_LAGGING).absolute(watches.closed_lagging_total);
}
