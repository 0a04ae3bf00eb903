//! `cairn agent` configuration: defaults, then a TOML file, then `CAIRN_*`
//! environment variables, then command-line flags (figment). A bad value is
//! reported with the name of its field and the agent exits non-zero.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

/// One member of the initial (bootstrap) cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberConfig {
    pub id: u64,
    pub peer_address: String,
    pub client_address: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
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
    pub resource_bytes_max: usize,
    pub watch_buffer_events: usize,
    /// How long a forwarded or strong request may take before it fails.
    pub request_timeout_ms: u64,
    /// `error`, `warn`, `info`, `debug`, `trace`, or a tracing filter directive.
    pub log_level: String,
    pub log_format: LogFormat,
    /// Serve Prometheus metrics on this address (`/metrics`); off when absent.
    #[serde(default)]
    pub metrics_address: Option<String>,
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
    /// A connection with no request in flight for this long is closed; 0 = never.
    pub connection_idle_timeout_ms: u64,
    /// HTTP/2 keepalive: ping every connection this often...
    pub keepalive_interval_ms: u64,
    /// ... and close it when a ping is not answered within this time.
    pub keepalive_timeout_ms: u64,
    /// DANGEROUS, for testing the test suite only: serve strong reads and
    /// strong lists from the local state without `ensure_linearizable`, so a
    /// follower or a deposed leader answers them with stale data. The jepsen
    /// suite's `prove-broken` command starts nodes with it to show that its
    /// register workload catches the violation. Never set it in production.
    #[serde(default)]
    pub unsafe_local_strong_reads: bool,
}

impl Default for Config {
    fn default() -> Self {
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
            history_changes_max: 10_000,
            resource_bytes_max: 1024 * 1024,
            watch_buffer_events: 4096,
            request_timeout_ms: 5_000,
            log_level: "warn".into(),
            log_format: LogFormat::Text,
            metrics_address: None,
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
            keepalive_interval_ms: 10_000,
            keepalive_timeout_ms: 10_000,
            unsafe_local_strong_reads: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("configuration field `{field}`: {reason}")]
    Invalid { field: &'static str, reason: String },
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
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

fn check_address(field: &'static str, value: &str) -> Result<(), ConfigError> {
    value
        .parse::<SocketAddr>()
        .map(|_| ())
        .map_err(|e| invalid(field, format!("{value:?} is not an IP:port address: {e}")))
}

impl Config {
    /// Layers the sources: defaults < file < environment < flags.
    pub fn load(
        file: Option<&std::path::Path>,
        flags: Serialized<serde_json::Value>,
    ) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            if !file.exists() {
                return Err(invalid(
                    "config",
                    format!("file {} does not exist", file.display()),
                ));
            }
            figment = figment.merge(Toml::file(file));
        }
        let figment = figment
            .merge(Env::prefixed("CAIRN_").ignore(&["endpoints"]))
            .merge(flags);
        let config: Config = figment
            .extract()
            .map_err(|e| ConfigError::Load(Box::new(e)))?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.node_id == 0 {
            return Err(invalid("node_id", "must be a positive integer"));
        }
        check_address("client_address", &self.client_address)?;
        check_address("peer_address", &self.peer_address)?;
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
            check_address("members", &m.peer_address)?;
            check_address("members", &m.client_address)?;
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
        if self.snapshot_log_entries < 100 {
            return Err(invalid("snapshot_log_entries", "must be at least 100"));
        }
        if !(1024 * 1024..=1024 * 1024 * 1024 * 1024).contains(&self.snapshot_log_bytes) {
            return Err(invalid(
                "snapshot_log_bytes",
                "must be between 1 MiB and 1 TiB",
            ));
        }
        if !(64 * 1024..=64 * 1024 * 1024).contains(&self.snapshot_chunk_bytes) {
            return Err(invalid(
                "snapshot_chunk_bytes",
                "must be between 64 KiB and 64 MiB",
            ));
        }
        if self.resource_bytes_max == 0 || self.resource_bytes_max > 16 * 1024 * 1024 {
            return Err(invalid(
                "resource_bytes_max",
                "must be between 1 byte and 16 MiB",
            ));
        }
        if self.watch_buffer_events == 0 {
            return Err(invalid("watch_buffer_events", "must be positive"));
        }
        if let Some(a) = &self.metrics_address {
            check_address("metrics_address", a)?;
        }
        self.validate_tls()?;
        self.validate_connections()
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
        if self.keepalive_interval_ms < 100 || self.keepalive_timeout_ms < 100 {
            return Err(invalid(
                "keepalive_interval_ms",
                "keepalive_interval_ms and keepalive_timeout_ms must be at least 100",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(v: serde_json::Value) -> Serialized<serde_json::Value> {
        Serialized::defaults(v)
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
    fn member_flag_parses_and_rejects_garbage() {
        let m = parse_members("1=127.0.0.1:8001/127.0.0.1:7001,2=127.0.0.1:8002/127.0.0.1:7002")
            .unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].client_address, "127.0.0.1:7002");
        assert!(parse_members("1=127.0.0.1:8001").is_err());
        assert!(parse_members("x=a/b").is_err());
    }
}
