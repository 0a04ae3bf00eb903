//! `cairn agent`: one node. Its flags, one per setting that has a flag (the settings and
//! their checks are `cairn_server::config`'s; this module adds only the command line: the
//! flags, their help, `--print-config`, and the test-only `--unsafe-*` switches), and the
//! process around the node the library starts (`cairn_server::embed`): logging, signals,
//! the shutdown watchdog, the exit code.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use cairn_server::config::parse_members;
use cairn_server::embed::EmbeddedNode;

use crate::common::{exit, runtime};

/// `cairn agent`'s flags. Each one named after a setting (`--node-id` for `node_id`) shows
/// that setting's default and environment variable in its help ([`describe_flag`]:
/// the defaults are `Config::default()`'s). A flag given overrides the file and the
/// environment; a flag not given changes nothing.
#[derive(Args, Default)]
#[command(mut_args = describe_flag)]
pub struct AgentArgs {
    /// TOML configuration file; CAIRN_* variables and flags override it (every setting:
    /// docs/configuration.md).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the effective configuration (TOML) and where each value came from (default,
    /// file, environment variable, flag), then exit without starting the node.
    #[arg(long)]
    print_config: bool,
    /// This node's id: a positive integer, unique in the cluster.
    #[arg(long)]
    node_id: Option<u64>,
    /// Where the Raft log, snapshots and the cluster id live.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address serving clients, HOST:PORT (an IP or a host name, resolved when bound).
    #[arg(long)]
    client_address: Option<String>,
    /// Address serving peers (Raft and forwarding), HOST:PORT.
    #[arg(long)]
    peer_address: Option<String>,
    /// Initial members: ID=PEER_ADDR/CLIENT_ADDR,... (the same on every node; host names
    /// are resolved each time a peer is dialled).
    #[arg(long)]
    members: Option<String>,
    /// Join a running cluster through this node's client address.
    #[arg(long)]
    join: Option<String>,
    /// A follower campaigns 1.0–1.2 times this long after the last heartbeat (100–600000).
    #[arg(long)]
    election_timeout_ms: Option<u64>,
    /// How often the leader sends heartbeats; at most a third of the election timeout.
    #[arg(long)]
    heartbeat_interval_ms: Option<u64>,
    /// Build a snapshot (and purge the log behind it) after this many entries.
    #[arg(long)]
    snapshot_log_entries: Option<u64>,
    /// ... or once the log since the last snapshot holds this many bytes (1 MiB–1 TiB).
    #[arg(long)]
    snapshot_log_bytes: Option<u64>,
    /// Changes kept for reads at past revisions and watches resuming from a revision.
    #[arg(long)]
    history_changes_max: Option<usize>,
    /// ... and at most this many bytes of older resource images (default: 10 % of the
    /// node's memory past 128 MiB; docs/operations.md, "Capacity").
    #[arg(long)]
    history_bytes_max: Option<u64>,
    /// The space quota this node asks for, in accounted bytes (default: 40 % of the node's
    /// memory, its cgroup's limit or the machine's, past 128 MiB; docs/operations.md,
    /// "Capacity"). The cluster's quota is the lowest its members ask for.
    #[arg(long)]
    data_bytes_max: Option<u64>,
    /// Most bytes of entries in one AppendEntries to a lagging follower.
    #[arg(long)]
    replication_batch_bytes_max: Option<usize>,
    /// error, warn, info, debug, trace, or a filter such as warn,cairn_server=debug.
    #[arg(long)]
    log_level: Option<String>,
    /// Log lines as text or as one JSON object each.
    #[arg(long, value_enum)]
    log_format: Option<LogFormatArg>,
    /// Serve /metrics, /livez, /readyz and the web console (/ui) over plain HTTP on this
    /// address (HOST:PORT).
    #[arg(long)]
    metrics_address: Option<String>,
    /// Serve the read-only web console (/ui) on the --metrics-address listener, or not.
    #[arg(long, value_enum)]
    web_console: Option<WebConsoleArg>,
    /// How far (in entries) applying may trail the leader's commit index for /readyz.
    #[arg(long)]
    ready_apply_lag_entries_max: Option<u64>,
    /// How often the leader compares every member's table digest (0 = on demand only).
    #[arg(long)]
    consistency_check_interval_ms: Option<u64>,
    /// Where the leader's scheduled backups go: an absolute directory or s3://BUCKET/PREFIX
    /// (docs/operations.md, "Scheduled backups"); unset: none.
    #[arg(long)]
    backup_target: Option<String>,
    /// How often the leader takes a backup (after the newest in the target); 0 = never.
    #[arg(long)]
    backup_interval_ms: Option<u64>,
    /// Keep the newest this many backups of the cluster in the target (1–10000).
    #[arg(long)]
    backup_retain_count: Option<usize>,
    /// ... and, beyond them, every one younger than this; 0 = none beyond the count.
    #[arg(long)]
    backup_retain_age_ms: Option<u64>,
    /// Write a backup's spool file at most this fast, in bytes a second; 0 = no limit.
    #[arg(long)]
    backup_write_bytes_per_second_max: Option<u64>,
    /// With an s3:// target: the URL of an S3-compatible server (unset: AWS).
    #[arg(long)]
    backup_s3_endpoint: Option<String>,
    /// With an s3:// target: the region to sign for (unset: AWS_REGION, else us-east-1).
    #[arg(long)]
    backup_s3_region: Option<String>,
    /// With an s3:// target: allow a plain http:// endpoint.
    #[arg(long)]
    backup_s3_allow_http: bool,
    /// With an s3:// target: an AWS shared credentials file (profile AWS_PROFILE, else
    /// default); unset: the AWS_* environment variables.
    #[arg(long)]
    backup_s3_credentials_file: Option<PathBuf>,
    /// Time every stage of each write on the leader into the histogram
    /// cairn_write_stage_seconds on the metrics port.
    #[arg(long)]
    write_stage_timing: bool,
    /// This node's certificate (PEM); turns TLS on (with --tls-key-file and --tls-ca-file).
    #[arg(long)]
    tls_cert_file: Option<PathBuf>,
    /// The private key of --tls-cert-file (PEM).
    #[arg(long)]
    tls_key_file: Option<PathBuf>,
    /// The cluster CA (PEM): peers must present a certificate from it.
    #[arg(long)]
    tls_ca_file: Option<PathBuf>,
    /// CA of client certificates on the client port (default: --tls-ca-file).
    #[arg(long)]
    tls_client_ca_file: Option<PathBuf>,
    /// Client certificates on the client port: none, optional or required.
    #[arg(long, value_enum)]
    tls_client_auth: Option<ClientAuthArg>,
    /// How often certificate files are checked for changes; 0 = only on SIGHUP.
    #[arg(long)]
    tls_reload_interval_ms: Option<u64>,
    /// A new connection must finish its TLS handshake and HTTP/2 preface within this time.
    #[arg(long)]
    handshake_timeout_ms: Option<u64>,
    /// Open connections on the client port; more are closed at once.
    #[arg(long)]
    client_connections_max: Option<usize>,
    /// A shutdown ends within this time, or the process exits non-zero naming what did not stop.
    #[arg(long)]
    shutdown_timeout_ms: Option<u64>,
    /// Open connections on the peer port; more are closed at once.
    #[arg(long)]
    peer_connections_max: Option<usize>,
    /// Close a connection with no request in flight for this long (GOAWAY); 0 = never.
    #[arg(long)]
    connection_idle_timeout_ms: Option<u64>,
    /// A client mid-request must send at least this many bytes a second; 0 = no minimum.
    #[arg(long)]
    receive_bytes_per_second_min: Option<u64>,
    /// ... falling behind that rate by at most this long before it is closed.
    #[arg(long)]
    receive_stall_timeout_ms: Option<u64>,
    /// The test-only `--unsafe-*` switches (flags only; see `config::UnsafeModes`).
    #[command(flatten)]
    unsafe_modes: UnsafeFlags,
}

/// The flags of the test-only switches, one per field of
/// [`cairn_server::config::UnsafeModes`] (whose docs say what each breaks), named after it.
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
struct UnsafeFlags {
    /// DANGEROUS, test-only: serve strong reads and lists locally without confirming
    /// leadership (stale reads).
    #[arg(long)]
    unsafe_local_strong_reads: bool,
    /// DANGEROUS, test-only: skip the Raft log's fdatasync/fsync (a power cut loses
    /// acknowledged writes).
    #[arg(long)]
    unsafe_skip_fsync: bool,
    /// DANGEROUS, test-only: answer a write as soon as it is handed to Raft, before it
    /// commits (a write lost with its leader was acknowledged).
    #[arg(long)]
    unsafe_ack_before_commit: bool,
    /// DANGEROUS, test-only: drop every Nth change event of each watch stream (0 = none).
    #[arg(long, value_name = "N", default_value_t = 0)]
    unsafe_drop_watch_events: u64,
    /// DANGEROUS, test-only: accept a compare-and-set whose version is stale (the leader
    /// replaces it with the stored version).
    #[arg(long)]
    unsafe_accept_stale_cas: bool,
    /// DANGEROUS, test-only: decide lease expiry on the wall clock instead of the
    /// monotonic one (a clock jump expires leases early).
    #[arg(long)]
    unsafe_lease_wall_clock: bool,
    /// DANGEROUS, test-only: apply a fenced write without checking its fence (a deposed
    /// holder's writes are accepted).
    #[arg(long)]
    unsafe_ignore_fences: bool,
    /// DANGEROUS, test-only: once this node has applied a write, change the data of one
    /// resource in its own table, outside the log (its table then differs from the
    /// other members').
    #[arg(long)]
    unsafe_alter_applied_state: bool,
}

impl From<UnsafeFlags> for cairn_server::config::UnsafeModes {
    fn from(flags: UnsafeFlags) -> cairn_server::config::UnsafeModes {
        cairn_server::config::UnsafeModes {
            unsafe_local_strong_reads: flags.unsafe_local_strong_reads,
            unsafe_skip_fsync: flags.unsafe_skip_fsync,
            unsafe_ack_before_commit: flags.unsafe_ack_before_commit,
            unsafe_drop_watch_events: flags.unsafe_drop_watch_events,
            unsafe_accept_stale_cas: flags.unsafe_accept_stale_cas,
            unsafe_lease_wall_clock: flags.unsafe_lease_wall_clock,
            unsafe_ignore_fences: flags.unsafe_ignore_fences,
            unsafe_alter_applied_state: flags.unsafe_alter_applied_state,
        }
    }
}

/// A `cairn agent` flag named after a setting, with its default (from
/// `Config::default`, the value the node uses when nothing sets it) and its environment
/// variable appended to its help; any other argument unchanged.
pub fn describe_flag(arg: clap::Arg) -> clap::Arg {
    use cairn_server::config::{default_text, env_name, is_setting, REQUIRED};
    let key = arg.get_id().as_str().to_string();
    if !is_setting(&key) {
        return arg;
    }
    let mut help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
    if let Some(default) = default_text(&key) {
        help.push_str(&format!(" [default: {default}]"));
    } else if REQUIRED.contains(&key.as_str()) {
        help.push_str(" [required]");
    }
    help.push_str(&format!(" [env: {}]", env_name(&key)));
    arg.help(help)
}

/// A named flag's value as its setting takes it: the flag's own name for it (clap's
/// kebab-case, as the settings' names are in the configuration).
fn setting_name(value: impl ValueEnum) -> serde_json::Value {
    value
        .to_possible_value()
        .expect("no flag value is hidden")
        .get_name()
        .into()
}

#[derive(Clone, Copy, ValueEnum)]
enum ClientAuthArg {
    None,
    Optional,
    Required,
}

#[derive(Clone, Copy, ValueEnum)]
enum WebConsoleArg {
    On,
    Off,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormatArg {
    Text,
    Json,
}

fn flags_of(a: &AgentArgs) -> Result<serde_json::Value, String> {
    let mut m = serde_json::Map::new();
    let mut put = |k: &str, v: serde_json::Value| {
        m.insert(k.to_string(), v);
    };
    if let Some(v) = a.node_id {
        put("node_id", v.into())
    }
    if let Some(v) = &a.data_dir {
        put("data_dir", v.display().to_string().into())
    }
    if let Some(v) = &a.client_address {
        put("client_address", v.clone().into())
    }
    if let Some(v) = &a.peer_address {
        put("peer_address", v.clone().into())
    }
    if let Some(v) = &a.members {
        let members =
            parse_members(v).map_err(|e| format!("configuration field `members`: {e}"))?;
        put(
            "members",
            serde_json::to_value(members).map_err(|e| e.to_string())?,
        )
    }
    if let Some(v) = &a.join {
        put("join", v.clone().into())
    }
    if let Some(v) = a.election_timeout_ms {
        put("election_timeout_ms", v.into())
    }
    if let Some(v) = a.heartbeat_interval_ms {
        put("heartbeat_interval_ms", v.into())
    }
    if let Some(v) = a.snapshot_log_entries {
        put("snapshot_log_entries", v.into())
    }
    if let Some(v) = a.snapshot_log_bytes {
        put("snapshot_log_bytes", v.into())
    }
    if let Some(v) = a.history_changes_max {
        put("history_changes_max", v.into())
    }
    if let Some(v) = a.history_bytes_max {
        put("history_bytes_max", v.into())
    }
    if let Some(v) = a.data_bytes_max {
        put("data_bytes_max", v.into())
    }
    if let Some(v) = &a.log_level {
        put("log_level", v.clone().into())
    }
    if let Some(v) = a.log_format {
        put("log_format", setting_name(v))
    }
    if let Some(v) = &a.metrics_address {
        put("metrics_address", v.clone().into())
    }
    if let Some(v) = a.web_console {
        put("web_console", setting_name(v))
    }
    if a.write_stage_timing {
        put("write_stage_timing", true.into())
    }
    for (key, value) in [
        ("backup_target", &a.backup_target),
        ("backup_s3_endpoint", &a.backup_s3_endpoint),
        ("backup_s3_region", &a.backup_s3_region),
    ] {
        if let Some(v) = value {
            put(key, v.clone().into())
        }
    }
    if let Some(v) = &a.backup_s3_credentials_file {
        put("backup_s3_credentials_file", v.display().to_string().into())
    }
    if a.backup_s3_allow_http {
        put("backup_s3_allow_http", true.into())
    }
    if let Some(v) = a.backup_retain_count {
        put("backup_retain_count", v.into())
    }
    for (key, path) in [
        ("tls_cert_file", &a.tls_cert_file),
        ("tls_key_file", &a.tls_key_file),
        ("tls_ca_file", &a.tls_ca_file),
        ("tls_client_ca_file", &a.tls_client_ca_file),
    ] {
        if let Some(v) = path {
            put(key, v.display().to_string().into())
        }
    }
    if let Some(v) = a.tls_client_auth {
        put("tls_client_auth", setting_name(v))
    }
    for (key, value) in [
        ("tls_reload_interval_ms", a.tls_reload_interval_ms),
        ("handshake_timeout_ms", a.handshake_timeout_ms),
        ("connection_idle_timeout_ms", a.connection_idle_timeout_ms),
        (
            "receive_bytes_per_second_min",
            a.receive_bytes_per_second_min,
        ),
        ("receive_stall_timeout_ms", a.receive_stall_timeout_ms),
        ("shutdown_timeout_ms", a.shutdown_timeout_ms),
        ("ready_apply_lag_entries_max", a.ready_apply_lag_entries_max),
        (
            "consistency_check_interval_ms",
            a.consistency_check_interval_ms,
        ),
        ("backup_interval_ms", a.backup_interval_ms),
        ("backup_retain_age_ms", a.backup_retain_age_ms),
        (
            "backup_write_bytes_per_second_max",
            a.backup_write_bytes_per_second_max,
        ),
    ] {
        if let Some(v) = value {
            put(key, v.into())
        }
    }
    for (key, value) in [
        ("client_connections_max", a.client_connections_max),
        ("peer_connections_max", a.peer_connections_max),
        ("replication_batch_bytes_max", a.replication_batch_bytes_max),
    ] {
        if let Some(v) = value {
            put(key, v.into())
        }
    }
    Ok(serde_json::Value::Object(m))
}

/// `cairn agent`: loads the configuration, then runs one node until a signal or a fatal
/// condition stops it; the exit code says which.
pub fn run(args: AgentArgs) -> u8 {
    let flags = match flags_of(&args) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cairn: {e}");
            return exit::USAGE;
        }
    };
    let source = cairn_server::config::ConfigSource {
        file: args.config.clone(),
        flags,
    };
    if args.print_config {
        return print_config(&source);
    }
    let mut config = match source.load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cairn: {e}");
            return exit::USAGE;
        }
    };
    config.unsafe_modes = args.unsafe_modes.clone().into();
    cairn_server::logging::init(&config.log_level, config.log_format);
    runtime().block_on(async move {
        let shutdown_timeout = Duration::from_millis(config.shutdown_timeout_ms);
        let node = cairn_server::fatal::NodeContext::of(&config);
        // The one start-up path, the library's own (`cairn_server::embed`).
        let mut agent = match EmbeddedNode::start_with_source(config, source).await {
            Ok(a) => a,
            Err(e) => match e.downcast_ref::<cairn_server::fatal::FatalCause>() {
                Some(cause) => return cairn_server::fatal::announce(cause, &node),
                None => {
                    eprintln!("cairn: {e:#}");
                    return exit::ERROR;
                }
            },
        };
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("signal handler");
        // A fatal cause was announced by the agent; a signal is a requested stop.
        let (code, code_past_deadline) = tokio::select! {
            _ = term.recv() => (exit::OK, cairn_server::fatal::exit::SHUTDOWN_TIMEOUT),
            _ = tokio::signal::ctrl_c() => (exit::OK, cairn_server::fatal::exit::SHUTDOWN_TIMEOUT),
            cause = agent.fatal() => (cause.exit_code(), cause.exit_code()),
        };
        tracing::info!("stopping");
        let progress = cairn_server::fatal::ShutdownProgress::default();
        cairn_server::fatal::Watchdog::arm(shutdown_timeout, progress.clone(), code_past_deadline);
        agent.shutdown_with(&progress).await;
        progress.set("the tasks still running after the node stopped");
        code
    })
}

/// `cairn agent --print-config`: the effective configuration on stdout; exit 0, or 2 (with
/// the reason on stderr) when it would not start a node.
fn print_config(source: &cairn_server::config::ConfigSource) -> u8 {
    match source.explain() {
        Ok(explained) => {
            print!("{}", explained.text);
            match explained.invalid {
                None => exit::OK,
                Some(e) => {
                    eprintln!("cairn: {e}");
                    exit::USAGE
                }
            }
        }
        Err(e) => {
            eprintln!("cairn: {e}");
            exit::USAGE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(Parser)]
    struct Agent {
        #[command(flatten)]
        args: super::AgentArgs,
    }

    #[test]
    fn a_named_flag_gives_its_setting_the_name_the_configuration_takes() {
        let agent = Agent::try_parse_from([
            "agent",
            "--log-format",
            "json",
            "--tls-client-auth",
            "optional",
            "--web-console",
            "off",
        ])
        .unwrap();
        let flags = super::flags_of(&agent.args).unwrap();
        assert_eq!(flags["log_format"], "json");
        assert_eq!(flags["tls_client_auth"], "optional");
        assert_eq!(flags["web_console"], "off");
    }
}
