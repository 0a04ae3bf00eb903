//! A node's configuration (`cairn agent`'s, an embedded node's): defaults, then a TOML
//! file, then `CAIRN_*` environment variables that name a setting, then command-line flags
//! (figment; see `sources`). A bad value is reported with the name of its field and the
//! agent exits non-zero. Every setting is documented in `docs/configuration.md`.
//!
//! A leaf of the server: the settings, their defaults, sources and checks import nothing
//! from Raft, auth or the servers. The sizes they share with Raft are
//! [`crate::bounds`]'s; the grants' checks are here ([`AuthConfig::check_grants`]). The
//! flags themselves are the command line's (`cairn-cli`): this module only names them
//! ([`flag_name`], [`COMMAND_LINE_ENVIRONMENT`]).

use std::collections::{BTreeSet, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;

use cairn_fsm::Scope;
use figment::providers::Serialized;
use serde::{Deserialize, Serialize};

pub use crate::logging::LogFormat;

mod sources;
pub use sources::{
    default_text, env_name, flag_name, is_setting, setting_keys, warn_ignored_environment,
    Explained, COMMAND_LINE_ENVIRONMENT, REQUIRED,
};

/// One member of the initial (bootstrap) cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberConfig {
    pub id: u64,
    pub peer_address: String,
    pub client_address: String,
}

/// Where a follower serves a strong read or list (`follower_strong_reads`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum FollowerStrongReads {
    /// Here, from this node's table, after the leader confirmed a read index and this node
    /// applied it (the default): strong traffic spreads over every node.
    #[default]
    ReadIndex,
    /// At the leader: the whole request is forwarded to it and its answer handed back.
    Forward,
}

/// Whether the ops listener serves the read-only web console (`web_console`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum WebConsole {
    /// `/ui` and `/ui/api/...` on the ops listener, beside `/metrics` (the default).
    #[default]
    On,
    /// Not served: `/ui` answers 404 saying the console is off; `/metrics`, `/livez` and
    /// `/readyz` are served as ever.
    Off,
}

/// `[auth]`: the grants of the client port, and this node's own token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// `[[auth.grants]]`: who (a token's hash, or a client certificate's
    /// subject) may do what. Authentication is on as soon as one is given.
    #[serde(default)]
    pub grants: Vec<GrantConfig>,
    /// A file holding the token this node presents to other nodes' client
    /// ports when it joins, hands leadership off, or checks at start whether
    /// it is already a member. Its grant needs `admin = true`.
    #[serde(default)]
    pub node_token_file: Option<PathBuf>,
}

/// One `[[auth.grants]]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantConfig {
    /// Shown in logs and in PERMISSION_DENIED messages.
    pub name: String,
    /// The SHA-256 of the token, 64 hex digits (`cairn token new` prints it).
    #[serde(default)]
    pub token_sha256: Option<String>,
    /// A client certificate subject that stands in for a token.
    #[serde(default)]
    pub subject: Option<String>,
    /// Read (Read, List, ListByOwner, WatchList) on these types and tenancies.
    #[serde(default)]
    pub read: Option<ScopeConfig>,
    /// Write and Delete (and read) on these types and tenancies.
    #[serde(default)]
    pub write: Option<ScopeConfig>,
    /// Membership, leader transfer, elections, snapshot save and restore, status.
    #[serde(default)]
    pub admin: bool,
    /// This grant's rate on each node: requests and request bytes per second (absent: the
    /// node's `client_requests_per_second_max` / `client_bytes_per_second_max`; 0: no
    /// limit). See [`crate::fairness`].
    #[serde(default)]
    pub requests_per_second: Option<u64>,
    #[serde(default)]
    pub bytes_per_second: Option<u64>,
}

/// A set of resources: every type matching one of `types` (`group.kind`,
/// `group.*` or `*`) in every tenancy matching one of `tenancies`
/// (`partition/namespace`, either part `*`, or `*` alone).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopeConfig {
    pub types: Vec<String>,
    pub tenancies: Vec<String>,
}

/// One `[[auth.grants]]` entry as its checks leave it ([`AuthConfig::check_grants`]): its
/// scopes parsed, its token hash as the lookup keys it. What the client port makes of a
/// grant (authentication, authorization) is the `auth` module's.
#[derive(Debug, Clone)]
pub struct CheckedGrant<'a> {
    pub config: &'a GrantConfig,
    pub read: Option<Scope>,
    pub write: Option<Scope>,
    /// `token_sha256`, trimmed, in lower case.
    pub token_sha256: Option<String>,
}

impl GrantConfig {
    /// The grant's `read` and `write` scopes, parsed; an error says which one is wrong, or
    /// that the grant grants nothing.
    pub fn scopes(&self) -> Result<(Option<Scope>, Option<Scope>), String> {
        let read = self
            .read
            .as_ref()
            .map(|s| Scope::parse(&s.types, &s.tenancies))
            .transpose()
            .map_err(|e| format!("read: {e}"))?;
        let write = self
            .write
            .as_ref()
            .map(|s| Scope::parse(&s.types, &s.tenancies))
            .transpose()
            .map_err(|e| format!("write: {e}"))?;
        if read.is_none() && write.is_none() && !self.admin {
            return Err("grants nothing: give `read`, `write` or `admin = true`".into());
        }
        Ok((read, write))
    }
}

impl AuthConfig {
    /// Checks `[auth]`'s grants, in order; every mistake is an error naming the grant (by
    /// position and name) and what is wrong with it.
    pub fn check_grants(&self) -> Result<Vec<CheckedGrant<'_>>, ConfigError> {
        let mut checked = Vec::with_capacity(self.grants.len());
        let mut names = HashSet::new();
        let mut hashes = HashSet::new();
        let mut subjects = HashSet::new();
        for (index, g) in self.grants.iter().enumerate() {
            let fail = |reason: String| {
                invalid(
                    "auth.grants",
                    format!("grant {} ({:?}): {reason}", index + 1, g.name),
                )
            };
            if g.name.trim().is_empty() {
                return Err(fail("`name` is empty".into()));
            }
            if !names.insert(g.name.clone()) {
                return Err(fail("another grant has this name".into()));
            }
            if g.token_sha256.is_none() && g.subject.is_none() {
                return Err(fail(
                    "give `token_sha256` (from `cairn token new`) or `subject`".into(),
                ));
            }
            let (read, write) = g.scopes().map_err(fail)?;
            let mut token_sha256 = None;
            if let Some(hash) = &g.token_sha256 {
                let hash = hash.trim().to_ascii_lowercase();
                if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(fail(
                        "`token_sha256` must be 64 hex digits (the SHA-256 of the token, \
                         not the token)"
                            .into(),
                    ));
                }
                if !hashes.insert(hash.clone()) {
                    return Err(fail("another grant has the same token_sha256".into()));
                }
                token_sha256 = Some(hash);
            }
            if let Some(subject) = &g.subject {
                if subject.trim().is_empty() {
                    return Err(fail("`subject` is empty".into()));
                }
                if !subjects.insert(subject.clone()) {
                    return Err(fail("another grant has the same subject".into()));
                }
            }
            checked.push(CheckedGrant {
                config: g,
                read,
                write,
                token_sha256,
            });
        }
        Ok(checked)
    }
}

/// Client certificates on the client port (`tls_client_auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuthMode {
    None,
    #[default]
    Optional,
    Required,
}

impl From<ClientAuthMode> for cairn_tls::ClientAuth {
    fn from(mode: ClientAuthMode) -> cairn_tls::ClientAuth {
        match mode {
            ClientAuthMode::None => cairn_tls::ClientAuth::None,
            ClientAuthMode::Optional => cairn_tls::ClientAuth::Optional,
            ClientAuthMode::Required => cairn_tls::ClientAuth::Required,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// This node's id: a positive integer, unique in the cluster.
    pub node_id: u64,
    /// Where the Raft log, snapshots and the cluster id live.
    pub data_dir: PathBuf,
    /// Address serving clients (ResourceService, AdminService, health, reflection).
    pub client_address: String,
    /// Address serving peers (Raft and forwarding).
    pub peer_address: String,
    /// The initial member list. Every node of a new cluster starts with the same
    /// list; the member with the lowest id initializes the cluster, once.
    #[serde(default)]
    pub members: Vec<MemberConfig>,
    /// Client address of a node of a running cluster to join as a learner, then voter.
    #[serde(default)]
    pub join: Option<String>,
    pub election_timeout_ms: u64,
    pub heartbeat_interval_ms: u64,
    /// Build a snapshot (and purge the log behind it) after this many entries.
    pub snapshot_log_entries: u64,
    /// ... or once the log since the last snapshot holds this many bytes of
    /// commands (or as many as the last snapshot, if that is larger).
    pub snapshot_log_bytes: u64,
    pub snapshot_chunk_bytes: u64,
    /// MVCC history retained for reads at past revisions and watches from a revision.
    pub history_changes_max: usize,
    /// ... and at most this many bytes of older images in it (absent: a share of the
    /// node's memory, [`crate::memory::capacity_defaults`]).
    #[serde(default)]
    pub history_bytes_max: Option<u64>,
    /// The space quota this node asks for: the bytes its table may account for
    /// (`docs/operations.md`, "Capacity"). The cluster's quota is the lowest its members
    /// ask for. Absent: a share of the node's memory ([`crate::memory::capacity_defaults`]).
    #[serde(default)]
    pub data_bytes_max: Option<u64>,
    pub resource_bytes_max: usize,
    pub watch_buffer_events: usize,
    /// Largest gRPC message on the client port, and of a forwarded request
    /// or answer on the peer port.
    pub client_message_bytes_max: usize,
    /// Largest Raft message between peers (an AppendEntries batch, a snapshot chunk).
    pub peer_message_bytes_max: usize,
    /// The leader sends a lagging follower at most this many bytes of entries in one
    /// AppendEntries (and at most `raft::REPLICATION_BATCH_ENTRIES_MAX` entries); one entry
    /// larger than this still goes alone.
    pub replication_batch_bytes_max: usize,
    /// Longest name, uid, type field (group, group version, kind), tenancy
    /// field (partition, namespace), version, metadata key, status key or
    /// list prefix, in bytes.
    pub name_bytes_max: usize,
    /// Most metadata entries on one resource.
    pub metadata_entries_max: usize,
    /// Most status conditions on one resource, over all its status entries.
    pub status_conditions_max: usize,
    /// Most resources one ListByOwner answers; a larger result is refused.
    /// (Lists are paged instead: `list_page_size_max`.)
    pub list_results_max: usize,
    /// Most resources in one page of a List, whatever the request's limit.
    pub list_page_size_max: usize,
    /// Most open watches on one client connection, and on the node.
    pub watches_per_connection_max: usize,
    pub watches_max: usize,
    /// Most requests in flight on one client connection (watches not counted).
    pub requests_per_connection_max: usize,
    /// The rate of each caller (a grant, or a connection without grants) that has none of
    /// its own: requests and request bytes per second, with one second's burst; 0 = no
    /// limit ([`crate::fairness`]).
    #[serde(default)]
    pub client_requests_per_second_max: u64,
    #[serde(default)]
    pub client_bytes_per_second_max: u64,
    /// How long a request over its caller's rate may wait for its turn before it is
    /// refused RESOURCE_EXHAUSTED.
    #[serde(default = "default_client_rate_wait_ms_max")]
    pub client_rate_wait_ms_max: u64,
    /// Most writes (writes, deletes, status writes) in flight through this node; when all
    /// are taken, callers get the freed ones in turn ([`crate::fairness::FairSlots`]).
    #[serde(default = "default_writes_in_flight_max")]
    pub writes_in_flight_max: usize,
    /// Raft entries of client writes (lone writes, or batches of those that queued) the
    /// leader keeps proposed and not yet answered, and their bytes; writes that arrive
    /// while all are taken queue and go as one batch entry ([`crate::raft::write_batch`]).
    #[serde(default = "default_write_proposals_in_flight_max")]
    pub write_proposals_in_flight_max: usize,
    #[serde(default = "default_write_proposal_bytes_in_flight_max")]
    pub write_proposal_bytes_in_flight_max: usize,
    /// The shortest and longest TTL a lease may be granted, and the most leases that may
    /// exist at once (checked by the node that proposes a grant).
    #[serde(default = "default_lease_ttl_min_ms")]
    pub lease_ttl_min_ms: u64,
    #[serde(default = "default_lease_ttl_max_ms")]
    pub lease_ttl_max_ms: u64,
    #[serde(default = "default_leases_max")]
    pub leases_max: usize,
    /// Largest backup `cairn snapshot restore` may upload.
    pub restore_upload_bytes_max: u64,
    /// Bytes of events buffered and not yet read, per watch and on the whole
    /// node; a watch that would go over is closed with WatchClosed.
    pub watch_buffer_bytes_max: usize,
    pub watch_buffers_bytes_max: usize,
    /// How long a forwarded or strong request may take before it fails.
    pub request_timeout_ms: u64,
    /// A shutdown (SIGTERM, SIGINT, or a fatal condition) ends within this time, whatever
    /// state the Raft core or the storage is in; past it the process exits with code 14
    /// (or the fatal condition's code) and a line naming what did not stop.
    pub shutdown_timeout_ms: u64,
    /// `error`, `warn`, `info`, `debug`, `trace`, or a tracing filter directive.
    pub log_level: String,
    pub log_format: LogFormat,
    /// The ops listener: plain HTTP on this address serving `/metrics` (Prometheus),
    /// `/livez` and `/readyz`; off when absent.
    #[serde(default)]
    pub metrics_address: Option<String>,
    /// How many entries this node's applied index may trail the leader's commit index while
    /// `/readyz` (and gRPC health) still call it ready.
    pub ready_apply_lag_entries_max: u64,
    /// How often the leader compares every member's table digest (`docs/operations.md`,
    /// "Replicas that check each other"); 0 = only on demand (`cairn check consistency`).
    pub consistency_check_interval_ms: u64,
    /// Where the leader's scheduled backups go (`docs/operations.md`, "Scheduled backups"):
    /// an absolute directory (`/var/backups/cairn`, `file:///var/backups/cairn`) or
    /// `s3://bucket/prefix`; none: no scheduled backups. Read with `backup_s3_*`
    /// ([`BackupTargetSettings`], which `cairn backup` shares).
    #[serde(default)]
    pub backup_target: Option<String>,
    /// How often the leader takes a backup: the next is due this long after the newest in
    /// the target; 0 = never (the target can still be read by `cairn backup`).
    pub backup_interval_ms: u64,
    /// The newest this many of the cluster's backups in the target are kept...
    pub backup_retain_count: usize,
    /// ... and, beyond them, every one younger than this; 0 = none beyond the count.
    pub backup_retain_age_ms: u64,
    /// How fast the leader writes a backup's spool file in the data dir before the upload,
    /// in bytes a second; 0 = no limit. A large backup then leaves the disk to the Raft
    /// log's fsyncs.
    pub backup_write_bytes_per_second_max: u64,
    /// With an `s3://` target: the URL of an S3-compatible server (MinIO, Ceph, …); none
    /// for AWS itself.
    #[serde(default)]
    pub backup_s3_endpoint: Option<String>,
    /// With an `s3://` target: the region to sign for (none: `AWS_REGION`, else
    /// `us-east-1`).
    #[serde(default)]
    pub backup_s3_region: Option<String>,
    /// With an `s3://` target: allows a plain `http://` endpoint.
    #[serde(default)]
    pub backup_s3_allow_http: bool,
    /// With an `s3://` target: a file in the AWS shared credentials format (its profile
    /// `AWS_PROFILE`, else `default`), read at every backup; none: the standard AWS
    /// environment variables. Never a secret in this configuration.
    #[serde(default)]
    pub backup_s3_credentials_file: Option<PathBuf>,
    /// Time every stage of each write on the leader (received, batched,
    /// proposed, replicated, committed, applied, answered) into the histogram
    /// `cairn_write_stage_seconds` on the metrics port. Off by default; when
    /// off it costs one atomic load per stage.
    #[serde(default)]
    pub write_stage_timing: bool,
    /// Where a follower serves strong reads and lists: `read-index` (here, after a read
    /// index from the leader; the default) or `forward` (at the leader). Strong watches
    /// always use a read index.
    #[serde(default)]
    pub follower_strong_reads: FollowerStrongReads,
    /// Whether the ops listener (`metrics_address`) serves the read-only web console
    /// (`on`, the default) or not (`off`).
    #[serde(default)]
    pub web_console: WebConsole,
    /// The Raft log's storage engine: `wal` (the segmented write-ahead log, default) or
    /// `sled`. A data dir records the engine that wrote it; starting it with the other one
    /// is refused with a message saying what to do.
    #[serde(default)]
    pub log_engine: cairn_raft_log::LogEngineKind,
    /// Who may do what on the client port (see `docs/security.md`). With no
    /// grant, every caller may do everything, and the node says so at start.
    #[serde(default)]
    pub auth: AuthConfig,
    /// This node's certificate (PEM, leaf first) for both ports and for the
    /// connections it opens to peers. TLS is on when it is set; then
    /// `tls_key_file` and `tls_ca_file` are required too.
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key of `tls_cert_file` (PEM).
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
    /// The cluster's CA (PEM): peers must present a certificate from it on
    /// the peer port (mutual TLS), and this node trusts it for the peers and
    /// client ports it dials.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// CA of client certificates on the client port (default: `tls_ca_file`).
    #[serde(default)]
    pub tls_client_ca_file: Option<PathBuf>,
    /// Client certificates on the client port: `none`, `optional` (a
    /// certificate, if presented, must verify; its subject names the caller)
    /// or `required`.
    pub tls_client_auth: ClientAuthMode,
    /// How often the certificate files are checked for changes (they are
    /// also reloaded on SIGHUP); 0 = only on SIGHUP.
    pub tls_reload_interval_ms: u64,
    /// A new connection must finish its TLS handshake and send the HTTP/2
    /// preface within this time, or it is closed (plaintext ports too).
    pub handshake_timeout_ms: u64,
    /// Open connections on the client port; more are closed at once.
    pub client_connections_max: usize,
    /// Open connections on the peer port; more are closed at once.
    pub peer_connections_max: usize,
    /// A connection with no request in flight for this long is closed (with
    /// HTTP/2 GOAWAY, so that its client reconnects); 0 = never.
    pub connection_idle_timeout_ms: u64,
    /// While the node waits for the rest of a request a client has begun (an
    /// HTTP/2 frame, a header block, a body its handler is reading), the
    /// client must send at least this many bytes a second; 0 = no minimum.
    pub receive_bytes_per_second_min: u64,
    /// ... falling behind that rate by at most this long: a client that stops
    /// sending mid-request is closed after it.
    pub receive_stall_timeout_ms: u64,
    /// HTTP/2 keepalive: ping every connection this often...
    pub keepalive_interval_ms: u64,
    /// ... and close it when a ping is not answered within this time.
    pub keepalive_timeout_ms: u64,
    /// The test-only switches ([`UnsafeModes`]): set by `--unsafe-*` flags only, never by
    /// the file or the environment (a file naming one is refused as an unknown field).
    #[serde(skip)]
    pub unsafe_modes: UnsafeModes,
}

/// DANGEROUS, for testing the test suite only: every switch that makes a node break its
/// contract, in one place. Each is an `--unsafe-*` flag of `cairn agent` and nothing else
/// (no setting, no environment variable, no file key), off by default, and logged as a
/// warning at start-up. The jepsen suite's `prove-broken` matrix starts nodes with each to
/// show that the checker meant for it notices. Never use one in production. (The flags
/// themselves are the command line's: one per field, named after it.)
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnsafeModes {
    /// DANGEROUS, test-only: serve strong reads and lists locally without confirming
    /// leadership (stale reads).
    pub unsafe_local_strong_reads: bool,
    /// DANGEROUS, test-only: skip the Raft log's fdatasync/fsync (a power cut loses
    /// acknowledged writes).
    pub unsafe_skip_fsync: bool,
    /// DANGEROUS, test-only: answer a write as soon as it is handed to Raft, before it
    /// commits (a write lost with its leader was acknowledged).
    pub unsafe_ack_before_commit: bool,
    /// DANGEROUS, test-only: drop every Nth change event of each watch stream (0 = none).
    pub unsafe_drop_watch_events: u64,
    /// DANGEROUS, test-only: accept a compare-and-set whose version is stale (the leader
    /// replaces it with the stored version).
    pub unsafe_accept_stale_cas: bool,
    /// DANGEROUS, test-only: decide lease expiry on the wall clock instead of the
    /// monotonic one (a clock jump expires leases early).
    pub unsafe_lease_wall_clock: bool,
    /// DANGEROUS, test-only: apply a fenced write without checking its fence (a deposed
    /// holder's writes are accepted).
    pub unsafe_ignore_fences: bool,
    /// DANGEROUS, test-only: once this node has applied a write, change the data of one
    /// resource in its own table, outside the log (as a bad RAM bit or a bug in apply
    /// would): its table then differs from the other members'.
    pub unsafe_alter_applied_state: bool,
}

impl UnsafeModes {
    /// The flags of the switches that are on, for the start-up warning.
    pub fn enabled(&self) -> Vec<String> {
        let mut on = Vec::new();
        if self.unsafe_local_strong_reads {
            on.push("--unsafe-local-strong-reads".to_owned());
        }
        if self.unsafe_skip_fsync {
            on.push("--unsafe-skip-fsync".to_owned());
        }
        if self.unsafe_ack_before_commit {
            on.push("--unsafe-ack-before-commit".to_owned());
        }
        if self.unsafe_drop_watch_events > 0 {
            on.push(format!(
                "--unsafe-drop-watch-events {}",
                self.unsafe_drop_watch_events
            ));
        }
        if self.unsafe_accept_stale_cas {
            on.push("--unsafe-accept-stale-cas".to_owned());
        }
        if self.unsafe_lease_wall_clock {
            on.push("--unsafe-lease-wall-clock".to_owned());
        }
        if self.unsafe_ignore_fences {
            on.push("--unsafe-ignore-fences".to_owned());
        }
        if self.unsafe_alter_applied_state {
            on.push("--unsafe-alter-applied-state".to_owned());
        }
        on
    }
}

fn default_client_rate_wait_ms_max() -> u64 {
    1000
}

fn default_writes_in_flight_max() -> usize {
    1024
}

fn default_write_proposals_in_flight_max() -> usize {
    1
}

fn default_write_proposal_bytes_in_flight_max() -> usize {
    8 * 1024 * 1024
}

fn default_lease_ttl_min_ms() -> u64 {
    cairn_fsm::Limits::default().lease_ttl_min_ms
}

fn default_lease_ttl_max_ms() -> u64 {
    cairn_fsm::Limits::default().lease_ttl_max_ms
}

fn default_leases_max() -> usize {
    cairn_fsm::Limits::default().leases_max
}

impl Default for Config {
    fn default() -> Self {
        // The state machine's limits have one set of defaults: the fsm's.
        let fsm = cairn_fsm::Limits::default();
        Config {
            node_id: 0,
            data_dir: PathBuf::from("cairn-data"),
            client_address: "127.0.0.1:7001".into(),
            peer_address: "127.0.0.1:8001".into(),
            members: vec![],
            join: None,
            election_timeout_ms: 1000,
            heartbeat_interval_ms: 100,
            snapshot_log_entries: 20_000,
            snapshot_log_bytes: 64 * 1024 * 1024,
            snapshot_chunk_bytes: 4 * 1024 * 1024,
            history_changes_max: fsm.history_changes_max,
            history_bytes_max: None,
            data_bytes_max: None,
            resource_bytes_max: fsm.resource_bytes_max,
            watch_buffer_events: fsm.watch_buffer_events,
            client_message_bytes_max: 32 * 1024 * 1024,
            peer_message_bytes_max: 128 * 1024 * 1024,
            replication_batch_bytes_max: 4 * 1024 * 1024,
            name_bytes_max: fsm.name_bytes_max,
            metadata_entries_max: fsm.metadata_entries_max,
            status_conditions_max: fsm.status_conditions_max,
            list_results_max: fsm.list_results_max,
            list_page_size_max: fsm.list_page_size_max,
            watches_per_connection_max: 128,
            watches_max: 10_000,
            requests_per_connection_max: 256,
            client_requests_per_second_max: 0,
            client_bytes_per_second_max: 0,
            client_rate_wait_ms_max: default_client_rate_wait_ms_max(),
            writes_in_flight_max: default_writes_in_flight_max(),
            write_proposals_in_flight_max: default_write_proposals_in_flight_max(),
            write_proposal_bytes_in_flight_max: default_write_proposal_bytes_in_flight_max(),
            lease_ttl_min_ms: default_lease_ttl_min_ms(),
            lease_ttl_max_ms: default_lease_ttl_max_ms(),
            leases_max: default_leases_max(),
            restore_upload_bytes_max: 4 * 1024 * 1024 * 1024,
            watch_buffer_bytes_max: fsm.watch_buffer_bytes_max,
            watch_buffers_bytes_max: fsm.watch_buffers_bytes_max,
            request_timeout_ms: 5_000,
            shutdown_timeout_ms: 10_000,
            log_level: "info".into(),
            log_format: LogFormat::Text,
            metrics_address: None,
            ready_apply_lag_entries_max: 1000,
            consistency_check_interval_ms: 60_000,
            backup_target: None,
            backup_interval_ms: 3_600_000,
            backup_retain_count: 24,
            backup_retain_age_ms: 0,
            backup_write_bytes_per_second_max: 0,
            backup_s3_endpoint: None,
            backup_s3_region: None,
            backup_s3_allow_http: false,
            backup_s3_credentials_file: None,
            write_stage_timing: false,
            log_engine: cairn_raft_log::LogEngineKind::Wal,
            follower_strong_reads: FollowerStrongReads::ReadIndex,
            web_console: WebConsole::On,
            auth: AuthConfig::default(),
            tls_cert_file: None,
            tls_key_file: None,
            tls_ca_file: None,
            tls_client_ca_file: None,
            tls_client_auth: ClientAuthMode::Optional,
            tls_reload_interval_ms: 5_000,
            handshake_timeout_ms: 10_000,
            client_connections_max: 2_048,
            peer_connections_max: 256,
            connection_idle_timeout_ms: 300_000,
            receive_bytes_per_second_min: 1_024,
            receive_stall_timeout_ms: 10_000,
            keepalive_interval_ms: 10_000,
            keepalive_timeout_ms: 10_000,
            unsafe_modes: UnsafeModes::default(),
        }
    }
}

/// The longest `backup_interval_ms`: 30 days.
pub const BACKUP_INTERVAL_MS_MAX: u64 = 30 * 24 * 3_600_000;
/// The most backups `backup_retain_count` may keep (a listing reads at most
/// `cairn_backup::Limits::list_objects_max` objects).
pub const BACKUP_RETAIN_COUNT_MAX: usize = 10_000;
/// The longest `backup_retain_age_ms`: 10 years.
pub const BACKUP_RETAIN_AGE_MS_MAX: u64 = 3_650 * 24 * 3_600_000;

/// Where backups go and how to reach them, as the settings name them: the agent's
/// `backup_target` and `backup_s3_*` ([`Config::backup_target_settings`]) and `cairn
/// backup`'s flags (`--target`, `--s3-*`, with the same environment variables).
/// [`BackupTargetSettings::spec`] is the one parser of both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackupTargetSettings {
    pub target: String,
    pub s3_endpoint: Option<String>,
    pub s3_region: Option<String>,
    pub s3_allow_http: bool,
    pub s3_credentials_file: Option<PathBuf>,
}

/// A backup setting that makes no target: the setting's key, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}`: {reason}")]
pub struct BackupSettingError {
    pub field: &'static str,
    pub reason: String,
}

impl BackupTargetSettings {
    /// The target these settings name, its S3 options checked and its credentials read
    /// (from `s3_credentials_file`, profile `AWS_PROFILE` or `default`; without a file the
    /// S3 client reads the standard AWS environment when it is opened). S3 settings with a
    /// directory target are refused, naming the first one set.
    pub fn spec(&self) -> Result<cairn_backup::TargetSpec, BackupSettingError> {
        use cairn_backup::{SpecError, TargetSpec};
        let bad = |field, reason: String| BackupSettingError { field, reason };
        let parsed =
            TargetSpec::parse(&self.target).map_err(|e| bad("backup_target", e.to_string()))?;
        if let TargetSpec::Directory { path } = &parsed {
            for (field, set) in [
                ("backup_s3_endpoint", self.s3_endpoint.is_some()),
                ("backup_s3_region", self.s3_region.is_some()),
                ("backup_s3_allow_http", self.s3_allow_http),
                (
                    "backup_s3_credentials_file",
                    self.s3_credentials_file.is_some(),
                ),
            ] {
                if set {
                    return Err(bad(
                        field,
                        format!(
                            "is an S3 setting, but the backup target {} is a directory",
                            path.display()
                        ),
                    ));
                }
            }
            return Ok(parsed);
        }
        let mut options = cairn_backup::S3Options {
            endpoint: self.s3_endpoint.clone(),
            region: self.s3_region.clone(),
            allow_http: self.s3_allow_http,
            ..Default::default()
        };
        if let Some(file) = &self.s3_credentials_file {
            let profile = std::env::var("AWS_PROFILE")
                .ok()
                .filter(|p| !p.trim().is_empty())
                .unwrap_or_else(|| "default".to_string());
            let credentials = cairn_backup::read_credentials_file(file, profile.trim())
                .map_err(|e| bad("backup_s3_credentials_file", e.to_string()))?;
            options = options.with_credentials(credentials);
        }
        TargetSpec::parse_with(&self.target, options).map_err(|e| {
            let field = match &e {
                SpecError::BadEndpoint { .. } | SpecError::PlainHttp { .. } => "backup_s3_endpoint",
                SpecError::EmptyRegion => "backup_s3_region",
                SpecError::HalfCredentials { .. } | SpecError::TokenWithoutCredentials => {
                    "backup_s3_credentials_file"
                }
                _ => "backup_target",
            };
            bad(field, e.to_string())
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A value that does not load (a wrong type, an unknown name), and where it came from.
    #[error("configuration field `{field}`: {reason} (from {from})")]
    Value {
        field: String,
        reason: String,
        from: String,
    },
    /// A source that does not load as a whole (a file that is no TOML).
    #[error("configuration {from}: {reason}")]
    Source { from: String, reason: String },
    #[error("configuration field `{field}`: {reason}")]
    Invalid { field: &'static str, reason: String },
}

pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// Parses `1=PEER/CLIENT,2=PEER/CLIENT` (the `--members` flag form).
pub fn parse_members(s: &str) -> Result<Vec<MemberConfig>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|part| {
            let (id, addresses) = part
                .trim()
                .split_once('=')
                .ok_or(format!("{part:?}: expected ID=PEER/CLIENT"))?;
            let (peer, client) = addresses
                .split_once('/')
                .ok_or(format!("{part:?}: expected ID=PEER/CLIENT"))?;
            let id = id
                .parse::<u64>()
                .map_err(|e| format!("{part:?}: bad id: {e}"))?;
            Ok(MemberConfig {
                id,
                peer_address: peer.to_string(),
                client_address: client.to_string(),
            })
        })
        .collect()
}

/// Splits `host:port`: the host is an IPv4 address, an IPv6 address in brackets
/// (`[::1]:7001`) or a DNS name (`localhost`, `node-1.cairn`); the port is 1–65535.
/// Names are not resolved here: a peer's address is resolved each time it is dialled (so
/// a peer whose DNS record changes is found again), a listen address when it is bound.
pub fn parse_host_port(value: &str) -> Result<(&str, u16), String> {
    if let Ok(address) = value.parse::<SocketAddr>() {
        if address.port() == 0 {
            return Err(format!(
                "{value:?} has port 0: give the port others reach it on"
            ));
        }
        return Ok((
            value.rsplit_once(':').map_or(value, |(h, _)| h),
            address.port(),
        ));
    }
    let Some((host, port)) = value.rsplit_once(':') else {
        return Err(format!(
            "{value:?} is not HOST:PORT (for example 10.0.0.1:7001 or node-1.cairn:7001)"
        ));
    };
    let port = match port.parse::<u16>() {
        Ok(0) | Err(_) => {
            return Err(format!(
                "{value:?} is not HOST:PORT: the port must be a number from 1 to 65535"
            ))
        }
        Ok(p) => p,
    };
    if host.starts_with('[') || host.contains(':') {
        return Err(format!(
            "{value:?} is not HOST:PORT: an IPv6 address goes in brackets, as in [::1]:7001"
        ));
    }
    if !is_dns_name(host) {
        return Err(format!(
            "{value:?} is not HOST:PORT: {host:?} is neither an IP address nor a host name \
             (letters, digits, hyphens and dots)"
        ));
    }
    Ok((host, port))
}

/// A DNS host name: dot-separated labels of 1–63 letters, digits and hyphens (and
/// underscores, which some service records use), not starting or ending with a hyphen;
/// at most 253 bytes; a trailing dot allowed. All-numeric names (a mistyped IP) are not.
fn is_dns_name(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    !host.is_empty()
        && host.len() <= 253
        && !host.chars().all(|c| c.is_ascii_digit() || c == '.')
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
}

fn check_address(field: &'static str, value: &str) -> Result<(), ConfigError> {
    parse_host_port(value)
        .map(|_| ())
        .map_err(|e| invalid(field, e))
}

/// A client address to dial: `HOST:PORT`, optionally with `http://` or `https://`.
fn check_endpoint(field: &'static str, value: &str) -> Result<(), ConfigError> {
    let bare = value
        .strip_prefix("https://")
        .or_else(|| value.strip_prefix("http://"))
        .unwrap_or(value);
    check_address(field, bare.strip_suffix('/').unwrap_or(bare))
}

/// Where a node's configuration comes from: the file and the flags (the
/// environment is read at each load). Kept by the node to read its
/// configuration again on SIGHUP.
#[derive(Debug, Clone, Default)]
pub struct ConfigSource {
    pub file: Option<PathBuf>,
    /// The flags given, as config keys.
    pub flags: serde_json::Value,
}

impl ConfigSource {
    /// The source of a configuration given whole (an embedded node's:
    /// `crate::embed`): every setting as a flag, the top layer, so that
    /// loading it again (on SIGHUP) gives the same configuration back
    /// whatever the file system or the environment say. Fails only on a
    /// setting that has no text form (a path that is not UTF-8).
    pub fn fixed(config: &Config) -> Result<ConfigSource, ConfigError> {
        let flags = serde_json::to_value(config).map_err(|e| ConfigError::Source {
            from: "the configuration given".into(),
            reason: e.to_string(),
        })?;
        Ok(ConfigSource { file: None, flags })
    }

    /// Defaults < file < environment < flags, validated.
    pub fn load(&self) -> Result<Config, ConfigError> {
        Config::load(
            self.file.as_deref(),
            Serialized::defaults(self.flags.clone()),
        )
    }

    /// `cairn agent --print-config`: the effective configuration as TOML, each value with
    /// where it came from (default, file, environment variable, flag), secrets hidden; and
    /// why it would not start a node, if it would not.
    pub fn explain(&self) -> Result<Explained, ConfigError> {
        sources::explain(
            self.file.as_deref(),
            Serialized::defaults(self.flags.clone()),
        )
    }
}

impl Config {
    /// The settings whose values differ between `self` and `other`, by
    /// config key: those a reload leaves as they were at start (the
    /// `[auth]` table, grants and node token file, is reloaded).
    /// `(data_bytes_max, history_bytes_max)`: as configured, or the shares of the memory
    /// this node may use ([`crate::memory::capacity_defaults`]; a machine whose memory
    /// cannot be read counts as 1 GiB).
    pub fn capacity(&self) -> (u64, u64) {
        let memory = crate::memory::memory_limit_bytes()
            .map(|(bytes, _)| bytes)
            .unwrap_or(1 << 30);
        let (data, history) = crate::memory::capacity_defaults(memory);
        (
            self.data_bytes_max.unwrap_or(data),
            self.history_bytes_max.unwrap_or(history),
        )
    }

    pub fn settings_changed(&self, other: &Config) -> Vec<String> {
        let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) =
            (serde_json::to_value(self), serde_json::to_value(other))
        else {
            return vec![];
        };
        a.iter()
            .filter(|(key, value)| key.as_str() != "auth" && b.get(key.as_str()) != Some(value))
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Layers the sources: defaults < file < environment (only `CAIRN_*` variables that
    /// name a setting) < flags; then validates.
    pub fn load(
        file: Option<&std::path::Path>,
        flags: Serialized<serde_json::Value>,
    ) -> Result<Config, ConfigError> {
        let config: Config = sources::figment(file, flags)?
            .extract()
            .map_err(sources::load_error)?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.node_id == 0 {
            return Err(invalid("node_id", "must be a positive integer"));
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid(
                "data_dir",
                "is empty: give the directory of this node's data",
            ));
        }
        check_address("client_address", &self.client_address)?;
        check_address("peer_address", &self.peer_address)?;
        if let Some(a) = &self.metrics_address {
            check_address("metrics_address", a)?;
        }
        // Three listeners, three addresses (the same host name on different ports is fine).
        let listeners = [
            ("client_address", Some(&self.client_address)),
            ("peer_address", Some(&self.peer_address)),
            ("metrics_address", self.metrics_address.as_ref()),
        ];
        for (i, (field, address)) in listeners.iter().enumerate() {
            for (other, other_address) in &listeners[..i] {
                if address.is_some() && address == other_address {
                    return Err(invalid(
                        field,
                        format!(
                            "is {}, the same as {other}",
                            address.unwrap_or(&String::new())
                        ),
                    ));
                }
            }
        }
        let mut ids = BTreeSet::new();
        for m in &self.members {
            if m.id == 0 {
                return Err(invalid("members", "member ids must be positive"));
            }
            if !ids.insert(m.id) {
                return Err(invalid(
                    "members",
                    format!("member id {} appears twice", m.id),
                ));
            }
            for (what, address) in [
                ("peer_address", &m.peer_address),
                ("client_address", &m.client_address),
            ] {
                parse_host_port(address)
                    .map_err(|e| invalid("members", format!("member {}'s {what}: {e}", m.id)))?;
            }
        }
        if let Some(join) = &self.join {
            check_endpoint("join", join)?;
        }
        match (&self.join, self.members.is_empty()) {
            (Some(_), false) => {
                return Err(invalid("join", "give either `join` or `members`, not both"))
            }
            (None, true) => {
                return Err(invalid(
                    "members",
                    "give the initial member list (or `join`)",
                ))
            }
            (None, false) if !ids.contains(&self.node_id) => {
                return Err(invalid(
                    "members",
                    format!("node_id {} is not in the member list", self.node_id),
                ))
            }
            _ => {}
        }
        check_range(
            "election_timeout_ms",
            self.election_timeout_ms,
            100..=600_000,
        )?;
        if self.heartbeat_interval_ms == 0
            || self.heartbeat_interval_ms * 3 > self.election_timeout_ms
        {
            return Err(invalid(
                "heartbeat_interval_ms",
                format!(
                    "must be positive and at most a third of election_timeout_ms ({})",
                    self.election_timeout_ms
                ),
            ));
        }
        check_range(
            "snapshot_log_entries",
            self.snapshot_log_entries,
            100..=1_000_000_000,
        )?;
        if !(1024 * 1024..=1024 * 1024 * 1024 * 1024).contains(&self.snapshot_log_bytes) {
            return Err(invalid(
                "snapshot_log_bytes",
                "must be between 1 MiB and 1 TiB",
            ));
        }
        // The peer gate refuses larger chunks from any sender: the same bound.
        let chunk_max = crate::bounds::SNAPSHOT_CHUNK_BYTES_MAX;
        if !(64 * 1024..=chunk_max).contains(&self.snapshot_chunk_bytes) {
            return Err(invalid(
                "snapshot_chunk_bytes",
                format!("must be between 64 KiB and {} MiB", chunk_max >> 20),
            ));
        }
        check_range(
            "resource_bytes_max",
            self.resource_bytes_max,
            1..=cairn_fsm::RESOURCE_BYTES_HARD_MAX,
        )?;
        check_range(
            "shutdown_timeout_ms",
            self.shutdown_timeout_ms,
            100..=600_000,
        )?;
        check_range(
            "watch_buffer_events",
            self.watch_buffer_events,
            1..=10_000_000,
        )?;
        check_range(
            "history_changes_max",
            self.history_changes_max,
            0..=100_000_000,
        )?;
        if let Some(bytes) = self.data_bytes_max {
            check_range("data_bytes_max", bytes, 1024 * 1024..=1 << 44)?;
        }
        if let Some(bytes) = self.history_bytes_max {
            check_range("history_bytes_max", bytes, 0..=1 << 44)?;
        }
        check_range("request_timeout_ms", self.request_timeout_ms, 100..=600_000)?;
        let ttl_hard_max_ms = cairn_fsm::lease::LEASE_TTL_HARD_MAX_MS;
        check_range(
            "lease_ttl_min_ms",
            self.lease_ttl_min_ms,
            100..=ttl_hard_max_ms,
        )?;
        check_range(
            "lease_ttl_max_ms",
            self.lease_ttl_max_ms,
            self.lease_ttl_min_ms..=ttl_hard_max_ms,
        )?;
        check_range(
            "leases_max",
            self.leases_max,
            1..=cairn_fsm::lease::LEASES_HARD_MAX,
        )?;
        crate::logging::check_log_level(&self.log_level)
            .map_err(|reason| invalid("log_level", reason))?;
        self.validate_limits()?;
        self.auth.check_grants()?;
        self.validate_tls()?;
        self.validate_connections()?;
        self.validate_backup()
    }

    /// The scheduled backups' settings: ranges, and a target that parses with its S3
    /// options (the credentials file read); S3 options without a target are refused.
    fn validate_backup(&self) -> Result<(), ConfigError> {
        check_off_or_range(
            "backup_interval_ms",
            self.backup_interval_ms,
            1_000..=BACKUP_INTERVAL_MS_MAX,
        )?;
        check_range(
            "backup_retain_count",
            self.backup_retain_count,
            1..=BACKUP_RETAIN_COUNT_MAX,
        )?;
        check_off_or_range(
            "backup_retain_age_ms",
            self.backup_retain_age_ms,
            1_000..=BACKUP_RETAIN_AGE_MS_MAX,
        )?;
        check_off_or_range(
            "backup_write_bytes_per_second_max",
            self.backup_write_bytes_per_second_max,
            64 * 1024..=1 << 40,
        )?;
        match self.backup_target_settings() {
            Some(settings) => settings
                .spec()
                .map(|_| ())
                .map_err(|e| invalid(e.field, e.reason)),
            None => {
                for (field, set) in [
                    ("backup_s3_endpoint", self.backup_s3_endpoint.is_some()),
                    ("backup_s3_region", self.backup_s3_region.is_some()),
                    ("backup_s3_allow_http", self.backup_s3_allow_http),
                    (
                        "backup_s3_credentials_file",
                        self.backup_s3_credentials_file.is_some(),
                    ),
                ] {
                    if set {
                        return Err(invalid(field, "is set but `backup_target` is not"));
                    }
                }
                Ok(())
            }
        }
    }

    /// `backup_target` and the `backup_s3_*` settings, when a target is set.
    pub fn backup_target_settings(&self) -> Option<BackupTargetSettings> {
        self.backup_target
            .as_ref()
            .map(|target| BackupTargetSettings {
                target: target.clone(),
                s3_endpoint: self.backup_s3_endpoint.clone(),
                s3_region: self.backup_s3_region.clone(),
                s3_allow_http: self.backup_s3_allow_http,
                s3_credentials_file: self.backup_s3_credentials_file.clone(),
            })
    }

    /// What the leader keeps of its backups (`backup_retain_count`, `backup_retain_age_ms`).
    pub fn backup_retention(&self) -> cairn_backup::Retention {
        cairn_backup::Retention::new(
            self.backup_retain_count,
            (self.backup_retain_age_ms > 0)
                .then(|| std::time::Duration::from_millis(self.backup_retain_age_ms)),
        )
    }

    /// TLS is on exactly when `tls_cert_file` is set; then its key and the
    /// cluster CA are required (the peer port is always mutual TLS).
    pub fn tls_enabled(&self) -> bool {
        self.tls_cert_file.is_some()
    }

    fn validate_tls(&self) -> Result<(), ConfigError> {
        if self.tls_enabled() {
            if self.tls_key_file.is_none() {
                return Err(invalid(
                    "tls_key_file",
                    "`tls_cert_file` needs its key file",
                ));
            }
            if self.tls_ca_file.is_none() {
                return Err(invalid(
                    "tls_ca_file",
                    "TLS needs the cluster CA: peers authenticate each other with it",
                ));
            }
        } else {
            for (field, set) in [
                ("tls_key_file", self.tls_key_file.is_some()),
                ("tls_ca_file", self.tls_ca_file.is_some()),
                ("tls_client_ca_file", self.tls_client_ca_file.is_some()),
            ] {
                if set {
                    return Err(invalid(field, "is set but `tls_cert_file` is not"));
                }
            }
        }
        Ok(())
    }

    fn validate_connections(&self) -> Result<(), ConfigError> {
        if !(100..=600_000).contains(&self.handshake_timeout_ms) {
            return Err(invalid(
                "handshake_timeout_ms",
                "must be between 100 and 600000",
            ));
        }
        for (field, value) in [
            ("client_connections_max", self.client_connections_max),
            ("peer_connections_max", self.peer_connections_max),
        ] {
            if !(1..=1_000_000).contains(&value) {
                return Err(invalid(field, "must be between 1 and 1000000"));
            }
        }
        check_range(
            "receive_bytes_per_second_min",
            self.receive_bytes_per_second_min,
            0..=1 << 30,
        )?;
        check_range(
            "receive_stall_timeout_ms",
            self.receive_stall_timeout_ms,
            100..=600_000,
        )?;
        check_range(
            "keepalive_interval_ms",
            self.keepalive_interval_ms,
            100..=3_600_000,
        )?;
        check_range(
            "keepalive_timeout_ms",
            self.keepalive_timeout_ms,
            100..=600_000,
        )?;
        check_off_or_range(
            "consistency_check_interval_ms",
            self.consistency_check_interval_ms,
            100..=86_400_000,
        )?;
        check_off_or_range(
            "connection_idle_timeout_ms",
            self.connection_idle_timeout_ms,
            100..=86_400_000,
        )?;
        check_off_or_range(
            "tls_reload_interval_ms",
            self.tls_reload_interval_ms,
            100..=86_400_000,
        )?;
        Ok(())
    }
}

/// Checks that `value` lies in `range` (the units are the field's).
fn check_range<T: PartialOrd + std::fmt::Display + Copy>(
    field: &'static str,
    value: T,
    range: std::ops::RangeInclusive<T>,
) -> Result<(), ConfigError> {
    if !range.contains(&value) {
        return Err(invalid(
            field,
            format!(
                "is {value}, must be between {} and {}",
                range.start(),
                range.end()
            ),
        ));
    }
    Ok(())
}

/// Checks that `value` is 0 (off) or lies in `range`.
fn check_off_or_range(
    field: &'static str,
    value: u64,
    range: std::ops::RangeInclusive<u64>,
) -> Result<(), ConfigError> {
    if value != 0 && !range.contains(&value) {
        return Err(invalid(
            field,
            format!(
                "is {value}, must be 0 (off) or between {} and {}",
                range.start(),
                range.end()
            ),
        ));
    }
    Ok(())
}

impl Config {
    /// The input limits: each within a range that keeps the node working,
    /// and consistent with the others (a resource fits in a message).
    fn validate_limits(&self) -> Result<(), ConfigError> {
        const MIB: usize = 1024 * 1024;
        check_range(
            "client_message_bytes_max",
            self.client_message_bytes_max,
            self.resource_bytes_max + 64 * 1024..=1024 * MIB,
        )?;
        check_range(
            "replication_batch_bytes_max",
            self.replication_batch_bytes_max,
            64 * 1024..=crate::bounds::DECODE_BYTES_MAX,
        )?;
        self.check_peer_messages_fit()?;
        // The upper bounds are the fsm's hard bounds: what every replica
        // applies, whatever its configuration.
        check_range(
            "name_bytes_max",
            self.name_bytes_max,
            16..=cairn_fsm::NAME_BYTES_HARD_MAX,
        )?;
        check_range(
            "metadata_entries_max",
            self.metadata_entries_max,
            0..=cairn_fsm::METADATA_ENTRIES_HARD_MAX,
        )?;
        check_range(
            "status_conditions_max",
            self.status_conditions_max,
            0..=cairn_fsm::STATUS_CONDITIONS_HARD_MAX,
        )?;
        check_range("list_results_max", self.list_results_max, 1..=100_000_000)?;
        check_range("list_page_size_max", self.list_page_size_max, 1..=1_000_000)?;
        check_range(
            "watches_per_connection_max",
            self.watches_per_connection_max,
            1..=10_000_000,
        )?;
        check_range("watches_max", self.watches_max, 1..=10_000_000)?;
        check_range(
            "requests_per_connection_max",
            self.requests_per_connection_max,
            1..=100_000,
        )?;
        check_range(
            "client_rate_wait_ms_max",
            self.client_rate_wait_ms_max,
            0..=600_000,
        )?;
        check_range(
            "writes_in_flight_max",
            self.writes_in_flight_max,
            1..=1_000_000,
        )?;
        check_range(
            "write_proposals_in_flight_max",
            self.write_proposals_in_flight_max,
            1..=64,
        )?;
        check_range(
            "write_proposal_bytes_in_flight_max",
            self.write_proposal_bytes_in_flight_max,
            64 * 1024..=1024 * MIB,
        )?;
        check_range(
            "restore_upload_bytes_max",
            self.restore_upload_bytes_max,
            1024..=1 << 44,
        )?;
        check_range(
            "watch_buffer_bytes_max",
            self.watch_buffer_bytes_max,
            self.resource_bytes_max..=self.watch_buffers_bytes_max.max(self.resource_bytes_max),
        )?;
        check_range(
            "watch_buffers_bytes_max",
            self.watch_buffers_bytes_max,
            self.resource_bytes_max..=1 << 40,
        )?;
        Ok(())
    }
}

impl Config {
    /// Every message the Raft of a valid configuration builds fits in `peer_message_bytes_max`
    /// (a peer refuses a larger one, and a leader would resend it for ever): an AppendEntries
    /// of `replication_batch_bytes_max`, or of one entry alone, whose size is bounded by a
    /// write batch ([`crate::bounds::WRITE_BATCH_BYTES_MAX`]) plus one more command (a
    /// client message, at most `client_message_bytes_max`); a snapshot chunk; a forwarded
    /// request. Each with [`PEER_MESSAGE_OVERHEAD_BYTES`] for its envelope.
    fn check_peer_messages_fit(&self) -> Result<(), ConfigError> {
        let entry_bytes_max = crate::bounds::WRITE_BATCH_BYTES_MAX + self.client_message_bytes_max;
        let needs = [
            (
                format!(
                    "one Raft entry (a write batch of up to {} bytes plus one command of up to \
                     client_message_bytes_max = {})",
                    crate::bounds::WRITE_BATCH_BYTES_MAX,
                    self.client_message_bytes_max
                ),
                entry_bytes_max,
            ),
            (
                format!(
                    "an AppendEntries of replication_batch_bytes_max = {}",
                    self.replication_batch_bytes_max
                ),
                self.replication_batch_bytes_max,
            ),
            (
                format!(
                    "a snapshot chunk of snapshot_chunk_bytes = {}",
                    self.snapshot_chunk_bytes
                ),
                self.snapshot_chunk_bytes as usize,
            ),
        ];
        let max = crate::bounds::DECODE_BYTES_MAX;
        if self.peer_message_bytes_max > max {
            return Err(invalid(
                "peer_message_bytes_max",
                format!("is {}, must be at most {max}", self.peer_message_bytes_max),
            ));
        }
        for (what, bytes) in needs {
            let min = bytes + PEER_MESSAGE_OVERHEAD_BYTES;
            if self.peer_message_bytes_max < min {
                return Err(invalid(
                    "peer_message_bytes_max",
                    format!(
                        "is {}, but {what} needs {min} bytes with its envelope: raise \
                         peer_message_bytes_max or lower the other",
                        self.peer_message_bytes_max
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// What a Raft message adds to the entries or chunk it carries (its envelope, the ids,
/// openraft's fields, bincode's lengths), with room to spare.
const PEER_MESSAGE_OVERHEAD_BYTES: usize = 64 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(v: serde_json::Value) -> Serialized<serde_json::Value> {
        Serialized::defaults(v)
    }

    /// A configuration file in `dir` naming node 1, the one member.
    fn one_member_file(dir: &std::path::Path) -> std::path::PathBuf {
        let file = dir.join("c.toml");
        std::fs::write(
            &file,
            "node_id = 1\n[[members]]\nid = 1\npeer_address = \"127.0.0.1:8001\"\nclient_address = \"127.0.0.1:7001\"\n",
        )
        .unwrap();
        file
    }

    #[test]
    fn a_fixed_source_loads_back_the_configuration_it_was_made_of() {
        // An embedded node's configuration, loaded again (SIGHUP): every setting as given,
        // the absent ones (metrics_address, join, TLS files) still absent.
        let config = Config {
            node_id: 3,
            data_dir: PathBuf::from("/tmp/cairn-embedded"),
            members: parse_members("3=127.0.0.1:8103/127.0.0.1:7103").unwrap(),
            election_timeout_ms: 2_000,
            follower_strong_reads: FollowerStrongReads::Forward,
            ..Config::default()
        };
        let loaded = ConfigSource::fixed(&config).unwrap().load().unwrap();
        assert_eq!(
            serde_json::to_value(&loaded).unwrap(),
            serde_json::to_value(&config).unwrap()
        );
        assert_eq!(loaded.metrics_address, None);
        assert!(config.settings_changed(&loaded).is_empty());
    }

    #[test]
    fn flags_override_the_file_and_a_bad_field_is_named() {
        // Layering: the flag wins over the file; a bad value names its field.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "node_id = 1\nelection_timeout_ms = 2000\n[[members]]\nid = 1\npeer_address = \"127.0.0.1:8001\"\nclient_address = \"127.0.0.1:7001\"\n",
        )
        .unwrap();
        let c = Config::load(
            Some(&file),
            flags(serde_json::json!({"election_timeout_ms": 3000})),
        )
        .unwrap();
        assert_eq!(c.election_timeout_ms, 3000);
        let e = Config::load(
            Some(&file),
            flags(serde_json::json!({"peer_address": "nowhere"})),
        )
        .unwrap_err();
        assert!(e.to_string().contains("peer_address"), "{e}");
        let e = Config::load(Some(&file), flags(serde_json::json!({"node_id": 7}))).unwrap_err();
        assert!(e.to_string().contains("members"), "{e}");
    }

    #[test]
    fn an_unsafe_mode_is_never_a_setting_read_from_a_file() {
        // The test-only switches are `--unsafe-*` flags only: a file naming one is refused
        // (unknown field), and the flags' layer cannot set one either.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        let members = "[[members]]\nid = 1\npeer_address = \"127.0.0.1:8001\"\nclient_address = \"127.0.0.1:7001\"\n";
        for key in [
            "unsafe_local_strong_reads = true",
            "unsafe_skip_fsync = true",
            "unsafe_ack_before_commit = true",
            "unsafe_drop_watch_events = 3",
            "unsafe_accept_stale_cas = true",
            "unsafe_lease_wall_clock = true",
            "unsafe_ignore_fences = true",
            "unsafe_modes = { unsafe_skip_fsync = true }",
        ] {
            std::fs::write(&file, format!("node_id = 1\n{key}\n{members}")).unwrap();
            let e = Config::load(Some(&file), flags(serde_json::json!({}))).unwrap_err();
            assert!(e.to_string().contains("unsafe"), "{key}: {e}");
        }
        std::fs::write(&file, format!("node_id = 1\n{members}")).unwrap();
        let c = Config::load(Some(&file), flags(serde_json::json!({}))).unwrap();
        assert_eq!(c.unsafe_modes, UnsafeModes::default());
        assert!(c.unsafe_modes.enabled().is_empty());
    }

    /// One setting whose value is a name: what its default is, another name it accepts,
    /// and a name it refuses.
    struct NamedSetting {
        key: &'static str,
        is_default: fn(&Config) -> bool,
        other: &'static str,
        is_other: fn(&Config) -> bool,
        refused: &'static str,
    }

    #[test]
    fn named_settings_have_their_default_take_another_name_and_refuse_a_bad_one_naming_the_field() {
        let table = [
            NamedSetting {
                key: "follower_strong_reads",
                is_default: |c| c.follower_strong_reads == FollowerStrongReads::ReadIndex,
                other: "forward",
                is_other: |c| c.follower_strong_reads == FollowerStrongReads::Forward,
                refused: "leader",
            },
            NamedSetting {
                key: "web_console",
                is_default: |c| c.web_console == WebConsole::On,
                other: "off",
                is_other: |c| c.web_console == WebConsole::Off,
                refused: "false",
            },
            // No setting: the WAL. `sled` is accepted; a typo fails naming `log_engine`.
            NamedSetting {
                key: "log_engine",
                is_default: |c| c.log_engine == cairn_raft_log::LogEngineKind::Wal,
                other: "sled",
                is_other: |c| c.log_engine == cairn_raft_log::LogEngineKind::Sled,
                refused: "rocks",
            },
        ];
        let dir = tempfile::tempdir().unwrap();
        let file = one_member_file(dir.path());
        let c = Config::load(Some(&file), flags(serde_json::json!({}))).unwrap();
        for row in &table {
            let key = row.key;
            assert!((row.is_default)(&c), "{key}: the default");
            let c =
                Config::load(Some(&file), flags(serde_json::json!({ key: row.other }))).unwrap();
            assert!((row.is_other)(&c), "{key} = {:?}", row.other);
            let e = Config::load(Some(&file), flags(serde_json::json!({ key: row.refused })))
                .unwrap_err();
            assert!(e.to_string().contains(key), "{key}: {e}");
        }
    }

    #[test]
    fn write_proposals_in_flight_default_to_one_and_out_of_range_values_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = one_member_file(dir.path());
        let load = |v: serde_json::Value| Config::load(Some(&file), flags(v));
        let c = load(serde_json::json!({})).unwrap();
        assert_eq!(c.write_proposals_in_flight_max, 1);
        assert_eq!(c.write_proposal_bytes_in_flight_max, 8 * 1024 * 1024);
        let c = load(serde_json::json!({"write_proposals_in_flight_max": 8})).unwrap();
        assert_eq!(c.write_proposals_in_flight_max, 8);
        for (field, value) in [
            ("write_proposals_in_flight_max", 0),
            ("write_proposals_in_flight_max", 65),
            ("write_proposal_bytes_in_flight_max", 1024),
        ] {
            let error = load(serde_json::json!({ field: value }))
                .unwrap_err()
                .to_string();
            assert!(error.contains(field), "{field} = {value}: {error}");
        }
    }

    #[test]
    fn backup_settings_are_refused_naming_the_field() {
        // Each bad value (or combination) names the one setting to fix; good ones load.
        let dir = tempfile::tempdir().unwrap();
        let file = one_member_file(dir.path());
        let credentials = dir.path().join("credentials");
        std::fs::write(
            &credentials,
            "[default]\naws_access_key_id = AK\naws_secret_access_key = SECRET\n",
        )
        .unwrap();
        let half = dir.path().join("half");
        std::fs::write(&half, "[default]\naws_access_key_id = AK\n").unwrap();
        let backup_dir = dir.path().display().to_string();
        let load = |v: serde_json::Value| Config::load(Some(&file), flags(v));
        let c = load(serde_json::json!({})).unwrap();
        assert_eq!(c.backup_target_settings(), None);
        let c = load(serde_json::json!({"backup_target": backup_dir.clone()})).unwrap();
        assert!(c
            .backup_target_settings()
            .unwrap()
            .spec()
            .unwrap()
            .directory()
            .is_some());
        let c = load(serde_json::json!({
            "backup_target": "s3://bucket/cairn",
            "backup_s3_endpoint": "http://127.0.0.1:9000",
            "backup_s3_allow_http": true,
            "backup_s3_region": "eu-west-1",
            "backup_s3_credentials_file": credentials.display().to_string(),
        }))
        .unwrap();
        let spec = c.backup_target_settings().unwrap().spec().unwrap();
        assert!(!format!("{spec:?}").contains("SECRET"), "{spec:?}");
        assert_eq!(c.backup_retention().retain_count, 24);
        let table: Vec<(serde_json::Value, &str)> = vec![
            (
                serde_json::json!({"backup_target": "backups"}),
                "backup_target",
            ),
            (
                serde_json::json!({"backup_target": "gs://b"}),
                "backup_target",
            ),
            (
                serde_json::json!({"backup_target": "s3://"}),
                "backup_target",
            ),
            (
                serde_json::json!({"backup_interval_ms": 10}),
                "backup_interval_ms",
            ),
            (
                serde_json::json!({"backup_retain_count": 0}),
                "backup_retain_count",
            ),
            (
                serde_json::json!({"backup_retain_age_ms": 5}),
                "backup_retain_age_ms",
            ),
            (
                serde_json::json!({"backup_write_bytes_per_second_max": 100}),
                "backup_write_bytes_per_second_max",
            ),
            (
                serde_json::json!({"backup_s3_endpoint": "http://127.0.0.1:9000"}),
                "backup_s3_endpoint",
            ),
            (
                serde_json::json!({"backup_target": backup_dir.clone(), "backup_s3_region": "x"}),
                "backup_s3_region",
            ),
            (
                serde_json::json!({"backup_target": "s3://b", "backup_s3_endpoint": "http://127.0.0.1:9000"}),
                "backup_s3_endpoint",
            ),
            (
                serde_json::json!({"backup_target": "s3://b", "backup_s3_region": " "}),
                "backup_s3_region",
            ),
            (
                serde_json::json!({"backup_target": "s3://b", "backup_s3_credentials_file": half.display().to_string()}),
                "backup_s3_credentials_file",
            ),
            (
                serde_json::json!({"backup_target": "s3://b", "backup_s3_credentials_file": "/nonexistent/credentials"}),
                "backup_s3_credentials_file",
            ),
        ];
        for (value, field) in table {
            let e = load(value.clone()).unwrap_err().to_string();
            assert!(e.contains(&format!("`{field}`")), "{value}: {e}");
        }
    }

    #[test]
    fn addresses_are_ips_or_host_names_with_a_port() {
        for good in [
            "10.0.0.1:7001",
            "[::1]:7001",
            "localhost:27150",
            "node-1.cairn:7001",
            "node-1.cairn.svc.cluster.local.:7001",
            "_grpc.node-1:7001",
        ] {
            parse_host_port(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        assert_eq!(
            parse_host_port("node-1.cairn:7001"),
            Ok(("node-1.cairn", 7001))
        );
        for bad in [
            "nowhere",
            "localhost",
            "localhost:0",
            "localhost:x",
            "localhost:70000",
            ":7001",
            "::1:7001",
            "[node]:7001",
            "-node:7001",
            "node..cairn:7001",
            "bad_host!:7001",
            "10.0.0:7001",
            "http://localhost:7001",
        ] {
            assert!(parse_host_port(bad).is_err(), "{bad} was accepted");
        }
        let mut c = Config {
            node_id: 1,
            members: vec![MemberConfig {
                id: 1,
                peer_address: "node-1.cairn:8001".into(),
                client_address: "node-1.cairn:7001".into(),
            }],
            client_address: "localhost:7001".into(),
            peer_address: "localhost:8001".into(),
            ..Config::default()
        };
        c.validate().expect("host names are valid addresses");
        c.members[0].peer_address = "node-1.cairn".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("`members`") && e.contains("member 1's peer_address"),
            "{e}"
        );
        c.members[0].peer_address = "node-1.cairn:8001".into();
        c.metrics_address = Some("localhost:7001".into());
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("`metrics_address`") && e.contains("client_address"),
            "{e}"
        );
        c.metrics_address = None;
        c.members.clear();
        c.join = Some("https://node-2.cairn:7001".into());
        c.validate().expect("a join address may carry a scheme");
        c.join = Some("node-2.cairn".into());
        assert!(c.validate().unwrap_err().to_string().contains("`join`"));
    }

    #[test]
    fn a_log_level_that_is_no_level_is_refused_naming_log_level() {
        // Which values are levels or filters: `logging`'s tests.
        let c = Config {
            node_id: 1,
            log_level: "verbose".into(),
            members: vec![MemberConfig {
                id: 1,
                peer_address: "127.0.0.1:8001".into(),
                client_address: "127.0.0.1:7001".into(),
            }],
            ..Config::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("`log_level`") && e.contains("\"verbose\""),
            "{e}"
        );
    }

    #[test]
    fn member_flag_parses_and_rejects_garbage() {
        let m = parse_members("1=127.0.0.1:8001/127.0.0.1:7001,2=127.0.0.1:8002/127.0.0.1:7002")
            .unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].client_address, "127.0.0.1:7002");
        assert!(parse_members("1=127.0.0.1:8001").is_err());
        assert!(parse_members("x=a/b").is_err());
    }

    #[test]
    fn peer_messages_must_hold_every_batch_the_leader_can_build() {
        // A peer_message_bytes_max under one entry (a write batch plus one client message) or
        // under replication_batch_bytes_max would stall replication: refused, naming the keys.
        let base = || Config {
            node_id: 1,
            members: vec![MemberConfig {
                id: 1,
                peer_address: "127.0.0.1:8001".into(),
                client_address: "127.0.0.1:7001".into(),
            }],
            ..Config::default()
        };
        base().validate().expect("the defaults are valid");
        const MIB: usize = 1024 * 1024;
        let mut c = base();
        c.peer_message_bytes_max = 8 * MIB;
        c.client_message_bytes_max = 8 * MIB;
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("peer_message_bytes_max") && e.contains("client_message_bytes_max"),
            "{e}"
        );
        c.client_message_bytes_max = 4 * MIB;
        c.validate()
            .expect("a write batch and one 4 MiB command fit in 8 MiB");
        c.replication_batch_bytes_max = 8 * MIB;
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("peer_message_bytes_max") && e.contains("replication_batch_bytes_max"),
            "{e}"
        );
        c.replication_batch_bytes_max = 16 * 1024;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("replication_batch_bytes_max"), "{e}");
    }

    #[test]
    fn settings_changed_names_what_waits_for_a_restart() {
        // Grants and the node token are reloaded, so they are no setting;
        // everything else is.
        let a = Config::default();
        let mut b = a.clone();
        assert!(a.settings_changed(&b).is_empty());
        b.history_changes_max += 1;
        b.auth.grants.push(GrantConfig::default());
        b.auth.node_token_file = Some("/t".into());
        assert_eq!(a.settings_changed(&b), ["history_changes_max"]);
    }
}
