//! The `cairn` command line: every command of the binary, one module each.
//! This module parses the arguments ([`Cli`]), runs `agent` (one node) and
//! `token`, and hands every other command to its module:
//!
//! | module | commands |
//! |--------|----------|
//! | [`data`] (+ [`json`], the JSON form of resources) | `read`, `write`, `delete`, `list`, `owned-by`, `watch` |
//! | [`admin`] | `status`, `endpoint`, `member`, `transfer-leader` |
//! | [`snapshot`] | `snapshot save / inspect / restore` |
//! | [`dev`] | `dev`: a local cluster of child processes |
//! | [`check`] | `check disk`, `check perf` |
//! | [`tls`] | `tls init`: development certificates |
//! | [`bench`](mod@bench) | `bench`: its workloads and flags (the load generator is [`cairn_bench`]) |
//!
//! [`common`] holds what they share: the cluster flags (endpoints, token, TLS),
//! `-o` and `--timeout-ms`, global before or after any subcommand, and the one
//! exit-code table. What the commands call and the node shares stays outside
//! this folder ([`cairn_client`] for the data commands,
//! [`cairn_client::admin`] for the admin ones, [`cairn_server::snapshot_file`],
//! [`cairn_bench`]'s load generator).

pub mod admin;
pub mod bench;
pub mod check;
pub mod common;
pub mod data;
pub mod dev;
pub mod json;
pub mod snapshot;
pub mod tls;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use admin::{EndpointCommand, MemberCommand, TransferArgs};
use cairn_server::config::parse_members;
use cairn_server::embed::EmbeddedNode;

#[derive(Parser)]
#[command(
    name = "cairn",
    version,
    about = "Cairn: a Raft-replicated resource store"
)]
pub struct Cli {
    /// `--endpoints`, `--token`, TLS, `-o` and `--timeout-ms`: global, before or after any
    /// subcommand (the data commands read the same flags).
    #[command(flatten)]
    global: common::GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one node.
    Agent(AgentArgs),
    /// Run a local cluster of child processes on loopback (Ctrl-C stops it).
    Dev(dev::DevArgs),
    /// Ask every member for its own status: reachable or not, role, term, indices, lag,
    /// version, uptime, data dir size. Exits 5 without a leader or a quorum.
    Status,
    /// Health and status of each endpoint (or of every member, with --cluster).
    #[command(subcommand)]
    Endpoint(EndpointCommand),
    /// List the members, or change the membership.
    #[command(subcommand)]
    Member(MemberCommand),
    /// Hand leadership to another voter (the most up-to-date one by default).
    TransferLeader(TransferArgs),
    /// Load generator: measure a running cluster (write, read, list, mixed, watch).
    Bench(bench::BenchArgs),
    /// Is this disk, this cluster, fit to run Cairn? `check disk`, `check perf`.
    #[command(subcommand)]
    Check(check::CheckCommand),
    /// Back up, inspect and restore snapshots.
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCommand),
    /// Make and hash bearer tokens for `[[auth.grants]]`.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Development certificates: a CA, one certificate per node, one for a client.
    #[command(subcommand)]
    Tls(tls::TlsCommand),
    #[command(flatten)]
    Data(data::DataCommand),
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Print a new random token (line 1) and its `token_sha256` config line (line 2).
    New,
    /// Print the `token_sha256` config line of a token read from stdin.
    Hash,
}

/// `cairn agent`'s flags. Each one named after a setting (`--node-id` for `node_id`) shows
/// that setting's default and environment variable in its help ([`describe_flag`]:
/// the defaults are `Config::default()`'s). A flag given overrides the file and the
/// environment; a flag not given changes nothing.
#[derive(Args, Default)]
#[command(mut_args = describe_flag)]
struct AgentArgs {
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
    /// Most bytes of entries in one AppendEntries to a lagging follower.
    #[arg(long)]
    replication_batch_bytes_max: Option<usize>,
    /// error, warn, info, debug, trace, or a filter such as warn,cairn_node=debug.
    #[arg(long)]
    log_level: Option<String>,
    /// Log lines as text or as one JSON object each.
    #[arg(long, value_enum)]
    log_format: Option<LogFormatArg>,
    /// Serve /metrics, /livez and /readyz over plain HTTP on this address (HOST:PORT).
    #[arg(long)]
    metrics_address: Option<String>,
    /// How far (in entries) applying may trail the leader's commit index for /readyz.
    #[arg(long)]
    ready_apply_lag_entries_max: Option<u64>,
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
}

impl From<UnsafeFlags> for cairn_server::config::UnsafeModes {
    fn from(flags: UnsafeFlags) -> cairn_server::config::UnsafeModes {
        cairn_server::config::UnsafeModes {
            unsafe_local_strong_reads: flags.unsafe_local_strong_reads,
            unsafe_skip_fsync: flags.unsafe_skip_fsync,
            unsafe_ack_before_commit: flags.unsafe_ack_before_commit,
            unsafe_drop_watch_events: flags.unsafe_drop_watch_events,
            unsafe_accept_stale_cas: flags.unsafe_accept_stale_cas,
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

#[derive(Clone, Copy, ValueEnum)]
enum ClientAuthArg {
    None,
    Optional,
    Required,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormatArg {
    Text,
    Json,
}

pub(crate) use common::access;
/// `-o table|json` and the one exit-code table, by error kind ([`common`]).
pub use common::{exit, exit_code_of_kind, OutputFormat as Output};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("cannot start the tokio runtime")
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(
        cli.command,
        Command::Agent(_) | Command::Dev(_) | Command::Bench(_)
    ) {
        end_quietly_when_stdout_closes();
    }
    let global = &cli.global;
    let code = match cli.command {
        Command::Agent(args) => run_agent(args),
        Command::Dev(args) => dev::run(args),
        Command::Status => runtime().block_on(admin::status(global)),
        Command::Endpoint(EndpointCommand::Health(args)) => {
            runtime().block_on(admin::endpoint_health(global, &args))
        }
        Command::Endpoint(EndpointCommand::Status(args)) => {
            runtime().block_on(admin::endpoint_status(global, &args))
        }
        Command::Member(m) => runtime().block_on(admin::member(m, global)),
        Command::TransferLeader(t) => runtime().block_on(admin::transfer_leader(&t, global)),
        Command::Snapshot(s) => snapshot::run(s, global),
        Command::Data(d) => runtime().block_on(data::run(d)),
        Command::Token(t) => token(t),
        Command::Bench(args) => bench::run(args),
        Command::Check(c) => check::run(c),
        Command::Tls(t) => tls::run(t),
    };
    ExitCode::from(code)
}

/// A command that prints for a reader (`cairn snapshot inspect F | head`) ends quietly when
/// the reader goes away, as Unix tools do, instead of panicking on the closed pipe: SIGPIPE
/// gets its default action back (Rust ignores it). Not for the commands that run nodes
/// (agent, dev, bench): a closed log pipe must never kill a node.
fn end_quietly_when_stdout_closes() {
    // SAFETY: signal(2) with SIG_DFL installs no handler; it runs before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// `cairn token new | hash`.
fn token(command: TokenCommand) -> u8 {
    use cairn_server::auth::{new_token, token_sha256_hex};
    match command {
        TokenCommand::New => match new_token() {
            Ok(token) => {
                println!("{token}");
                println!("token_sha256 = \"{}\"", token_sha256_hex(&token));
                eprintln!(
                    "cairn: give the token (line 1) to the client; put the token_sha256 line \
                     (line 2) in a [[auth.grants]] entry of every node's config. The node \
                     keeps only the hash: the token cannot be shown again."
                );
                exit::OK
            }
            Err(e) => {
                eprintln!("cairn: {e}");
                exit::ERROR
            }
        },
        TokenCommand::Hash => {
            let mut text = String::new();
            if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut text) {
                eprintln!("cairn: cannot read the token from stdin: {e}");
                return exit::ERROR;
            }
            match cairn_client::BearerToken::new(text) {
                Ok(token) => {
                    println!("token_sha256 = \"{}\"", token_sha256_hex(token.secret()));
                    exit::OK
                }
                Err(e) => {
                    eprintln!("cairn: stdin: {e}");
                    exit::USAGE
                }
            }
        }
    }
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
    if let Some(v) = &a.log_level {
        put("log_level", v.clone().into())
    }
    if let Some(v) = a.log_format {
        put(
            "log_format",
            match v {
                LogFormatArg::Text => "text",
                LogFormatArg::Json => "json",
            }
            .into(),
        )
    }
    if let Some(v) = &a.metrics_address {
        put("metrics_address", v.clone().into())
    }
    if a.write_stage_timing {
        put("write_stage_timing", true.into())
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
        put(
            "tls_client_auth",
            match v {
                ClientAuthArg::None => "none",
                ClientAuthArg::Optional => "optional",
                ClientAuthArg::Required => "required",
            }
            .into(),
        )
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

fn run_agent(args: AgentArgs) -> u8 {
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
    use super::*;
    use cairn_server::config::{
        default_text, env_name, flag_name, is_setting, setting_keys, Config,
    };
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("cairn").chain(args.iter().copied()))
    }

    #[test]
    fn cluster_flags_are_global_before_or_after_the_subcommand() {
        // --endpoints, --timeout-ms and -o go anywhere, on the admin commands (member,
        // snapshot, transfer-leader, status, endpoint) as on the data commands.
        for args in [
            &[
                "--endpoints",
                "a:1,http://b:2",
                "-o",
                "json",
                "--timeout-ms",
                "500",
                "member",
                "list",
            ][..],
            &[
                "member",
                "--endpoints",
                "a:1,http://b:2",
                "list",
                "-o",
                "json",
                "--timeout-ms",
                "500",
            ],
            &[
                "member",
                "remove",
                "3",
                "--endpoints",
                "a:1,http://b:2",
                "--output",
                "json",
                "--timeout-ms",
                "500",
            ],
            &[
                "transfer-leader",
                "--to",
                "2",
                "--endpoints",
                "a:1,http://b:2",
                "-o",
                "json",
                "--timeout-ms",
                "500",
            ],
            &[
                "snapshot",
                "--endpoints",
                "a:1,http://b:2",
                "-o",
                "json",
                "save",
                "f",
                "--timeout-ms",
                "500",
            ],
            &[
                "--endpoints",
                "a:1,http://b:2",
                "-o",
                "json",
                "--timeout-ms",
                "500",
                "status",
            ],
            &[
                "endpoint",
                "health",
                "--cluster",
                "--endpoints",
                "a:1,http://b:2",
                "-o",
                "json",
                "--timeout-ms",
                "500",
            ],
        ] {
            let cli = parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert_eq!(
                cli.global.cluster.endpoints,
                ["a:1", "http://b:2"],
                "{args:?}"
            );
            assert_eq!(cli.global.timeout_ms, 500, "{args:?}");
            assert_eq!(cli.global.output, common::OutputFormat::Json, "{args:?}");
        }
        // A global flag given before a data command reaches it.
        let cli = parse(&[
            "--endpoints",
            "x:1",
            "-o",
            "json",
            "read",
            "--type",
            "g.v1.K",
            "--name",
            "n",
        ])
        .unwrap();
        let Command::Data(data::DataCommand::Read(read)) = cli.command else {
            panic!("read")
        };
        assert_eq!(read.common.global.cluster.endpoints, ["x:1"]);
        assert_eq!(read.common.global.output, common::OutputFormat::Json);
        // The defaults: the dev cluster, 10 s, a table.
        let cli = parse(&["status"]).unwrap();
        assert_eq!(cli.global.cluster.endpoints.len(), 3);
        assert_eq!(cli.global.timeout_ms, 10_000);
        // The bench keeps its own flags.
        assert!(parse(&["bench", "write", "--endpoints", "a:1", "-o", "json"]).is_ok());
    }

    #[test]
    fn membership_commands_parse_their_safety_flags() {
        let cli = parse(&["member", "remove", "3", "--force"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Member(MemberCommand::Remove { id: 3, force: true })
        ));
        let cli = parse(&[
            "member",
            "add-learner",
            "--id",
            "4",
            "--peer-address",
            "p:1",
            "--client-address",
            "c:1",
            "--catch-up-timeout-ms",
            "0",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::Member(MemberCommand::AddLearner {
                id: 4,
                catch_up_timeout_ms: 0,
                ..
            })
        ));
    }

    #[test]
    fn every_flag_has_help_and_every_agent_flag_shows_its_setting_s_default() {
        // The help of `cairn agent` and `cairn dev`, as clap builds it.
        let cli = crate::Cli::command();
        for name in ["agent", "dev"] {
            let command = cli
                .find_subcommand(name)
                .unwrap_or_else(|| panic!("no {name} subcommand"));
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if ["help", "version"].contains(&id) {
                    continue;
                }
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                assert!(
                    !help.trim().is_empty() && !help.starts_with(" ["),
                    "cairn {name} --{id} has no help"
                );
                if name == "dev" {
                    // dev's own settings: clap's default, which its help shows; or a switch.
                    assert!(
                        !arg.get_default_values().is_empty()
                            || matches!(arg.get_action(), clap::ArgAction::SetTrue),
                        "cairn dev --{id} shows no default"
                    );
                    continue;
                }
                if ["config", "print_config"].contains(&id) {
                    continue;
                }
                if id.starts_with("unsafe_") {
                    // The test-only switches are flags only: no setting, no variable.
                    assert!(!is_setting(id), "--{id} must not be a setting");
                    continue;
                }
                assert!(is_setting(id), "--{id} names no setting");
                match default_text(id) {
                    Some(default) => assert!(
                        help.contains(&format!("[default: {default}]")),
                        "--{id}: {help}"
                    ),
                    None => assert!(!help.contains("[default:"), "--{id}: {help}"),
                }
                assert!(help.contains(&format!("[env: {}]", env_name(id))), "{help}");
            }
        }
        let agent = cli.find_subcommand("agent").unwrap();
        let election = agent
            .get_arguments()
            .find(|a| a.get_id() == "election_timeout_ms")
            .unwrap();
        assert!(election.get_help().unwrap().to_string().contains(&format!(
            "[default: {}]",
            Config::default().election_timeout_ms
        )));
    }

    #[test]
    fn docs_configuration_lists_every_setting_with_its_default_env_and_flag() {
        let doc = include_str!("../../docs/configuration.md");
        let agent = crate::Cli::command();
        let agent = agent.find_subcommand("agent").unwrap();
        for key in setting_keys() {
            let row = doc
                .lines()
                .find(|l| l.starts_with(&format!("| `{key}` |")))
                .unwrap_or_else(|| panic!("docs/configuration.md has no row for `{key}`"));
            let cells: Vec<&str> = row.split(" | ").map(|c| c.trim()).collect();
            // | setting | default | range | environment | flag | what |
            let default = cells[1];
            match default_text(key) {
                Some(value) => assert_eq!(
                    default.trim_matches('`'),
                    value.as_str(),
                    "docs/configuration.md: the default of `{key}`"
                ),
                None => assert!(
                    !default.starts_with('`'),
                    "docs/configuration.md: `{key}` has no default, the row says {default}"
                ),
            }
            assert_eq!(cells[3], format!("`{}`", env_name(key)), "{row}");
            let has_flag = agent.get_arguments().any(|a| a.get_id() == key.as_str());
            if has_flag {
                assert_eq!(cells[4], format!("`{}`", flag_name(key)), "{row}");
            } else {
                assert_eq!(cells[4], "—", "{row}: no such flag");
            }
        }
    }
}
