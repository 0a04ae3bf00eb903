//! # cairn-bench — the load generator
//!
//! **Purpose.** The load generator behind `cairn bench` (its flags and exit codes:
//! `cairn_cli::bench`) and `cairn check perf`: load against a running cluster, reached as a
//! client ([`Cluster`]: endpoints, token, TLS), and its report ([`Report`], printed in a
//! [`Format`]). The scripts of `docs/benchmarks.md` are `bench/scripts/`.
//!
//! Workloads: `write` (compare-and-set creates and updates), `read` (strong or
//! eventual), `list`, `mixed` (reads and writes in a ratio), `watch` (N
//! watchers on random nodes, writers at the leader, delivery latency from the
//! acknowledged write to every watcher) and `failover` (kill -9 of the leader,
//! time to the first successful write through a surviving node). Each reports
//! ops/s and latency percentiles from HDR histograms, errors counted by
//! [`cairn_proto::error::ApiError`] kind, the generator's own CPU per op
//! (getrusage) and, for nodes running on this machine, their CPU and resident
//! memory, as a table or as JSON (`-o json`).
//!
//! **What it must not do.** Depend on the server or the command line: the cluster comes in
//! as a [`Cluster`] and the report goes out in a [`Format`] (the command line maps its
//! flags onto them, and a [`BenchError`] onto its exit codes). Change the cluster beyond
//! its own keys (everything it writes lives under its own type `bench/Item` and one
//! namespace), retry an operation behind the measurement's back (a failed op is counted,
//! never hidden), or add work to the hot path that a real client would not do (raw tonic
//! clients, no JSON, no per-op allocation beyond the request itself).
//!
//! ## Concurrency model
//! One multi-threaded tokio runtime. `--connections` HTTP/2 channels are shared
//! round-robin by `--clients` tasks, each running one operation at a time
//! (closed loop). A coordinating task opens and closes the measurement window
//! (flags in `load::Shared`) and drives the progress bar; workers keep their
//! own histograms and error counts and hand them back when they end, so there is
//! no shared lock on the hot path (the per-key version slots are only touched by
//! the client owning the key).
//!
//! ## Invariants
//! - Only operations started inside the measurement window and finished before
//!   it closed are counted, and each is counted exactly once: as a latency sample
//!   or as an error.
//! - The op cap is honoured exactly: at most `--max-ops` operations are started
//!   inside the window.
//! - Writes, strong reads and lists go to the leader (found with
//!   `AdminService.Status`) unless `--target all` is given.

pub mod failover;
pub mod leases;
pub mod load;
mod procfs;
mod report;
pub mod watch;

use std::time::Duration;

use bytes::Bytes;
use cairn_client::{Access, AuthenticatedChannel, BearerToken, Client, ClientError, ClientOptions};
use cairn_proto::error::ApiError;
use cairn_proto::google::protobuf::Any;
use cairn_proto::v1::{self as pb, resource_service_client::ResourceServiceClient};
use clap::{Args, ValueEnum};

pub use load::remove_keys;
pub use report::{Format, Report};

/// A connection to a node that presents the run's credentials (`--token`) on every call.
pub type BenchChannel = AuthenticatedChannel;

/// The largest answer the generator accepts (a list of 100,000 resources of
/// 256 bytes is about 35 MiB).
const DECODE_BYTES_MAX: usize = 1 << 30;
/// Watch streams per HTTP/2 connection.
const WATCHERS_PER_CONNECTION: usize = 100;

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum Target {
    /// Every connection to the current leader.
    Leader,
    /// Connections spread round-robin over every endpoint.
    All,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum ConsistencyArg {
    Strong,
    Eventual,
}

impl ConsistencyArg {
    fn proto(self) -> pb::Consistency {
        match self {
            ConsistencyArg::Strong => pb::Consistency::Strong,
            ConsistencyArg::Eventual => pb::Consistency::Eventual,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ConsistencyArg::Strong => "strong",
            ConsistencyArg::Eventual => "eventual",
        }
    }
}

/// The cluster a run loads, and how to reach it, as the `cairn` command line's cluster
/// flags give it (`--endpoints`, `--token`, the TLS files): taken as given, checked when the
/// run starts.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    /// Client addresses of cluster nodes (`host:port`, `http://host:port` or
    /// `https://host:port`).
    pub endpoints: Vec<String>,
    /// The bearer token every call presents (`--token`), not yet checked.
    pub token: Option<String>,
    /// TLS, when the flags or an `https://` endpoint ask for it.
    pub tls: Option<cairn_client::TlsOptions>,
}

impl Cluster {
    /// The token, checked ([`BearerToken::new`]).
    fn bearer_token(&self) -> Result<Option<BearerToken>, ClientError> {
        self.token.clone().map(BearerToken::new).transpose()
    }

    /// How to reach the nodes: TLS (files read now), presenting the token; unusable ones
    /// are [`BenchError::Access`].
    fn access(&self) -> Result<Access, BenchError> {
        let access = || -> Result<Access, ClientError> {
            let token = self.bearer_token()?;
            Ok(Access::from_options(self.tls.as_ref())?.with_token(token.as_ref()))
        };
        access().map_err(|e| BenchError::Access(e.to_string()))
    }

    /// A client library [`Client`] of `endpoints` (some of the cluster's), each call bounded
    /// by `timeout`, presenting the token over the cluster's TLS.
    fn client_at(&self, endpoints: &[String], timeout: Duration) -> Result<Client, ClientError> {
        let options = ClientOptions {
            request_timeout: timeout,
            connect_timeout: timeout.min(Duration::from_secs(1)),
            token: self.bearer_token()?,
            tls: self.tls.clone(),
            ..ClientOptions::default()
        };
        Client::new(endpoints, options)
    }
}

/// Options every load workload shares (the cluster and the report's format aside).
#[derive(Args, Clone)]
pub struct LoadOptions {
    /// Concurrent client tasks, each with one operation in flight.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// HTTP/2 connections the clients share (round-robin).
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Length of the measurement window, in seconds.
    #[arg(long = "duration", default_value_t = 10.0)]
    duration_s: f64,
    /// Unmeasured load before the window opens, in seconds.
    #[arg(long = "warmup", default_value_t = 1.0)]
    warmup_s: f64,
    /// Stop after this many operations started in the window.
    #[arg(long, default_value_t = 10_000_000)]
    max_ops: u64,
    /// Number of distinct keys.
    #[arg(long, default_value_t = 10_000)]
    key_space: u64,
    /// Size of each resource's data payload, in bytes.
    #[arg(long = "value-size", default_value_t = 256)]
    value_bytes: usize,
    /// Start at most this many operations per second over all clients (0: as many as the
    /// clients can, one at a time each).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Walk the key space in order (each op the next key) instead of at random.
    #[arg(long)]
    sequential_keys: bool,
    /// Namespace holding the bench's resources (type bench/Item).
    #[arg(long, default_value = "bench")]
    namespace: String,
    /// Where requests go.
    #[arg(long, value_enum, default_value = "leader")]
    target: Target,
    /// Per-operation timeout, in milliseconds (counted as ClientTimeout).
    #[arg(long = "op-timeout-ms", default_value_t = 5_000)]
    op_timeout_ms: u64,
    /// Node processes to watch for CPU and memory (default: the local
    /// processes listening on the endpoints, when there are any).
    #[arg(long, value_delimiter = ',')]
    server_pids: Vec<i32>,
    /// A free-form label carried into the report.
    #[arg(long)]
    label: Option<String>,
}

/// `cairn bench failover`'s options (the cluster and the report's format aside).
#[derive(Args)]
pub struct FailoverArgs {
    /// The leader's process id (default: the local process listening on the
    /// leader's client address).
    #[arg(long)]
    kill_pid: Option<i32>,
    /// Pause between two probe writes, in milliseconds.
    #[arg(long = "probe-interval-ms", default_value_t = 10)]
    probe_interval_ms: u64,
    /// Timeout of one probe write, in milliseconds.
    #[arg(long = "probe-timeout-ms", default_value_t = 1_000)]
    probe_timeout_ms: u64,
    /// Give up after this many seconds without a successful write.
    #[arg(long = "max-wait", default_value_t = 20.0)]
    max_wait_s: f64,
    #[arg(long, default_value = "bench")]
    namespace: String,
    #[arg(long)]
    label: Option<String>,
}

/// The bench's own errors: set-up failures. Failed operations are not errors
/// of the bench; they are counted in the report.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// `reason` names the address (`cairn_client::Access::connect`'s message).
    #[error("{reason}")]
    Connect { address: String, reason: String },
    #[error("bad endpoint {address:?}: {reason}")]
    Endpoint { address: String, reason: String },
    /// No endpoint answered; one `endpoint: why` per endpoint.
    #[error("no endpoint answered: {}", .0.join("; "))]
    Unreachable(Vec<String>),
    #[error("no leader known to any of {0:?}")]
    NoLeader(Vec<String>),
    /// `--token` or the TLS flags are unusable.
    #[error("{0}")]
    Access(String),
    #[error("{0}")]
    Api(#[from] ApiError),
    #[error("invalid option {option}: {reason}")]
    Option {
        option: &'static str,
        reason: String,
    },
    #[error("{0}")]
    Setup(String),
}

/// The multi-threaded runtime a load runs on (`cairn bench`, `cairn check perf`); not
/// starting is a [`BenchError::Setup`].
pub fn runtime() -> Result<tokio::runtime::Runtime, BenchError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::Setup(format!("cannot start the tokio runtime: {e}")))
}

impl LoadOptions {
    fn validate(&self, cluster: &Cluster) -> Result<(), BenchError> {
        let option = |option: &'static str, reason: &str| {
            Err(BenchError::Option {
                option,
                reason: reason.into(),
            })
        };
        if cluster.endpoints.is_empty() {
            return option("--endpoints", "at least one endpoint is needed");
        }
        if !(self.rate >= 0.0 && self.rate <= 10_000_000.0) {
            return option(
                "--rate",
                "must be between 0 and 10,000,000 operations per second",
            );
        }
        if self.clients == 0 {
            return option("--clients", "must be at least 1");
        }
        if self.connections == 0 {
            return option("--connections", "must be at least 1");
        }
        if self.key_space == 0 || self.key_space > 100_000_000 {
            return option("--key-space", "must be between 1 and 100,000,000");
        }
        if !(self.duration_s > 0.0 && self.duration_s <= 24.0 * 3600.0) {
            return option("--duration", "must be between 0 and 86400 seconds");
        }
        if !(0.0..=3600.0).contains(&self.warmup_s) {
            return option("--warmup", "must be between 0 and 3600 seconds");
        }
        if self.value_bytes > 16 << 20 {
            return option("--value-size", "must be at most 16 MiB");
        }
        Ok(())
    }

    /// `--op-timeout-ms` (at least 1 ms): how long one operation may take.
    fn op_timeout(&self) -> Duration {
        Duration::from_millis(self.op_timeout_ms.max(1))
    }

    /// The options of a standard write load (`cairn check perf`): `clients` clients on as
    /// many connections, at most `rate` writes per second, for `duration_s` seconds after
    /// `warmup_s`, over `key_space` keys of `value_bytes` bytes in `namespace`.
    pub fn standard_writes(load: StandardLoad, namespace: &str) -> LoadOptions {
        LoadOptions {
            clients: load.clients,
            connections: load.connections,
            duration_s: load.duration_s,
            warmup_s: load.warmup_s,
            max_ops: 10_000_000,
            key_space: load.key_space,
            value_bytes: load.value_bytes,
            rate: load.rate,
            sequential_keys: false,
            namespace: namespace.to_string(),
            target: Target::Leader,
            op_timeout_ms: 5_000,
            server_pids: vec![],
            label: None,
        }
    }
}

/// A write load's size, as [`LoadOptions::standard_writes`] takes it.
#[derive(Debug, Clone, Copy)]
pub struct StandardLoad {
    pub clients: usize,
    pub connections: usize,
    pub rate: f64,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub key_space: u64,
    pub value_bytes: usize,
}

/// Measures a write load (the `write` workload) and returns its report without printing
/// it.
pub async fn measure_writes(cluster: &Cluster, options: LoadOptions) -> Result<Report, BenchError> {
    load::measure(cluster, options, load::Mix::Write).await
}

/// The bench's resource type.
fn bench_type() -> pb::Type {
    pb::Type {
        group: "bench".into(),
        group_version: "v1".into(),
        kind: "Item".into(),
    }
}

fn bench_tenancy(namespace: &str) -> pb::Tenancy {
    pb::Tenancy {
        partition: "default".into(),
        namespace: namespace.into(),
    }
}

fn bench_id(namespace: &str, name: String) -> pb::Id {
    pb::Id {
        uid: "bench".into(),
        name,
        r#type: Some(bench_type()),
        tenancy: Some(bench_tenancy(namespace)),
    }
}

/// A resource to write: `expected_version` is the CAS token ("" = create).
fn bench_resource(
    namespace: &str,
    name: String,
    expected_version: String,
    value: Bytes,
) -> pb::Resource {
    pb::Resource {
        id: Some(bench_id(namespace, name)),
        version: expected_version,
        data: Some(Any {
            type_url: "type.googleapis.com/cairn.bench.Value".into(),
            value,
        }),
        ..Default::default()
    }
}

/// The name of key `k` (fixed width, so names sort as numbers).
fn key_name(k: u64) -> String {
    format!("k{k:09}")
}

/// The key index of a bench name, if it is one.
fn key_of(name: &str) -> Option<u64> {
    name.strip_prefix('k')
        .filter(|d| d.len() == 9)?
        .parse()
        .ok()
}

/// Opens one HTTP/2 connection to `address` (`host:port`, or `https://host:port`), over TLS
/// when `access` says so, presenting its credentials on every call.
async fn connect(access: &Access, address: &str) -> Result<BenchChannel, BenchError> {
    access
        .endpoint(address)
        .map_err(|reason| BenchError::Endpoint {
            address: address.into(),
            reason,
        })?;
    let channel = access
        .connect(address, Duration::from_secs(3))
        .await
        .map_err(|reason| BenchError::Connect {
            address: address.into(),
            reason,
        })?;
    Ok(tonic::service::interceptor::InterceptedService::new(
        channel,
        access.credentials.clone(),
    ))
}

/// A resource client over a [`BenchChannel`], as every workload holds one.
pub type ResourceClient = ResourceServiceClient<BenchChannel>;

fn resource_client(channel: BenchChannel) -> ResourceClient {
    ResourceServiceClient::new(channel).max_decoding_message_size(DECODE_BYTES_MAX)
}

/// The cluster as the endpoints see it: the leader's client address and the
/// status each reachable endpoint gave.
pub struct ClusterView {
    pub leader_id: u64,
    pub leader_address: String,
    pub statuses: Vec<(String, pb::StatusResponse)>,
}

/// Asks every endpoint for its status and finds the leader's client address. None
/// answering is [`BenchError::Unreachable`], naming each endpoint and why; a refused
/// credential is that refusal (every node would refuse it alike).
async fn discover(endpoints: &[String], access: &Access) -> Result<ClusterView, BenchError> {
    let client = cairn_client::admin::AdminClient::new(
        endpoints.to_vec(),
        access.clone(),
        cairn_client::admin::TIMEOUT_DEFAULT,
    );
    let mut statuses = Vec::new();
    let mut failures = Vec::new();
    for (endpoint, answer) in endpoints.iter().zip(client.statuses(endpoints).await) {
        match answer {
            Ok(s) => statuses.push((endpoint.clone(), s)),
            Err(e) if e.is_credential_refusal() => return Err(BenchError::Api(e)),
            Err(e) => failures.push(format!("{endpoint}: {e}")),
        }
    }
    if statuses.is_empty() {
        return Err(BenchError::Unreachable(failures));
    }
    for (_, s) in &statuses {
        if s.leader_id == 0 {
            continue;
        }
        if let Some(m) = s.members.iter().find(|m| m.id == s.leader_id) {
            return Ok(ClusterView {
                leader_id: s.leader_id,
                leader_address: m.client_address.clone(),
                statuses,
            });
        }
    }
    Err(BenchError::NoLeader(endpoints.to_vec()))
}

/// The addresses requests go to, per `--target`.
async fn targets(
    cluster: &Cluster,
    options: &LoadOptions,
    access: &Access,
) -> Result<Vec<String>, BenchError> {
    let endpoints = &cluster.endpoints;
    match options.target {
        Target::All => Ok(endpoints.clone()),
        Target::Leader => Ok(vec![discover(endpoints, access).await?.leader_address]),
    }
}

/// A small, fast, seeded generator (xorshift64*): the bench needs spread, not
/// quality, and must not spend its CPU here.
#[derive(Clone)]
struct FastRng(u64);

impl FastRng {
    fn new(seed: u64) -> FastRng {
        FastRng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        let k = self.next_u64() % n;
        assert!(k < n);
        k
    }
}

/// A run id: tells apart the keys and names of successive runs.
fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}", (nanos as u64) ^ (std::process::id() as u64) << 40)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_names_round_trip_and_sort_as_numbers() {
        // A key's name maps back to its index, and names order as indices do.
        for k in [0u64, 7, 999, 123_456_789] {
            assert_eq!(key_of(&key_name(k)), Some(k));
        }
        assert!(key_name(9) < key_name(10));
        assert_eq!(key_of("x000000001"), None);
        assert_eq!(key_of("k1"), None);
        assert_eq!(key_of("k00000000x"), None);
    }

    #[test]
    fn fast_rng_stays_below_its_bound_and_spreads() {
        // Every draw is below the bound, and every value of a small range is hit.
        let mut rng = FastRng::new(3);
        let mut seen = [false; 16];
        for _ in 0..10_000 {
            let k = rng.below(16);
            seen[k as usize] = true;
            let f = rng.next_f64();
            assert!((0.0..1.0).contains(&f));
        }
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn bench_resources_pass_the_node_validation() {
        // What the bench writes is a valid write for the node.
        let r = bench_resource(
            "bench",
            key_name(1),
            String::new(),
            Bytes::from(vec![b'v'; 256]),
        );
        cairn_fsm::validate_write(&r, &cairn_fsm::Limits::default()).expect("valid");
    }
}
