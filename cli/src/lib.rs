//! # cairn-cli — the `cairn` command line
//!
//! **Purpose.** The `cairn` binary: every command, one module each. This module parses the
//! arguments ([`Cli`]) and hands each command to its module:
//!
//! | module | commands |
//! |--------|----------|
//! | [`agent`] | `agent`: one node (over the `cairn-server` library) |
//! | [`dev`] | `dev`: a local cluster of child processes; `dev restart / stop / start N` |
//! | [`drill`] | `drill failover / rolling-restart`: an action under a checked workload |
//! | [`data`] (+ [`json`], the JSON form of resources) | `read`, `write`, `delete`, `list`, `owned-by`, `watch` |
//! | [`admin`] | `status`, `endpoint`, `member`, `transfer-leader` |
//! | [`snapshot`] | `snapshot save / inspect / restore` |
//! | [`backup`] | `backup list / verify / restore`: a scheduled backups' target |
//! | [`recover`] | `recover`: a new cluster from a lost quorum's survivors |
//! | [`check`] | `check disk`, `check perf`, `check cache` |
//! | [`tls`] | `tls init`: development certificates |
//! | [`token`] | `token new`, `token hash` |
//! | [`lease`] | `lease grant / keep-alive / revoke / list / ttl`, `lock`, `elect` |
//! | [`bench`](mod@bench) | `bench`: its workloads and flags (the load generator is [`cairn_bench`]) |
//!
//! [`common`] holds what they share: the cluster flags (endpoints, token, TLS),
//! `-o` and `--timeout-ms`, global before or after any subcommand, and the one
//! exit-code table. What the commands call lives outside this crate: [`cairn_client`] for
//! the data commands, [`cairn_client::admin`] for the admin ones, [`cairn_server`] for
//! `agent` (through [`cairn_server::embed`], the one start-up path) and the snapshot file
//! format ([`cairn_server::snapshot_file`]), [`cairn_bench`] for the load generator.
//!
//! **What it must not do.** Hold node logic: a node runs only through
//! `cairn_server::embed`, as in any program that embeds one; the settings, their defaults
//! and checks are `cairn_server::config`'s (this crate adds the flags and their help). Reach a
//! cluster other than through `cairn-client` and `cairn-bench`. Print a panic for a closed
//! pipe (a command that prints for a reader ends quietly on SIGPIPE; `agent`, `dev` and
//! `bench` never do, so that a closed log pipe cannot kill a node).
//!
//! ## Invariants
//! - One exit-code table for every command ([`exit`], [`exit_code_of_kind`]): an error's
//!   kind decides its code, whatever the command.
//! - Every `cairn agent` flag named after a setting shows that setting's default and
//!   environment variable ([`agent::describe_flag`]), and `docs/configuration.md` lists
//!   every setting with its flag (both tested here).
//! - The `CAIRN_*` variables of the cluster flags are the ones the node knows to ignore
//!   (`cairn_server::config::COMMAND_LINE_ENVIRONMENT`, tested in [`common`]).

/// `println!` that ignores a closed stdout (`cairn status | head -1`) instead of panicking;
/// for every command module below (declared before them, so in scope in each).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

pub mod admin;
pub mod agent;
pub mod backup;
pub mod bench;
pub mod capacity;
pub mod check;
pub mod common;
pub mod data;
pub mod dev;
pub mod drill;
pub mod json;
pub mod lease;
pub mod recover;
pub mod snapshot;
pub mod tls;
pub mod token;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use admin::{EndpointCommand, MemberCommand, TransferArgs};

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
    Agent(Box<agent::AgentArgs>),
    /// Run a local cluster of child processes on loopback (Ctrl-C stops it).
    Dev(dev::DevArgs),
    /// Drills: kill the leader, restart every member in turn, under a checked workload,
    /// against `cairn dev` or any cluster whose members it may stop and start.
    #[command(subcommand)]
    Drill(drill::DrillCommand),
    /// Ask every member for its own status: reachable or not, role, term, indices, lag,
    /// version, uptime, data dir size. Exits 5 without a leader or a quorum.
    Status,
    /// Health and status of each endpoint (or of every member, with --cluster).
    #[command(subcommand)]
    Endpoint(EndpointCommand),
    /// List the members, or change the membership.
    #[command(subcommand)]
    Member(MemberCommand),
    /// The cluster version: `cluster downgrade --to V`, `cluster downgrade --cancel`
    /// (docs/upgrading.md).
    #[command(subcommand)]
    Cluster(admin::ClusterCommand),
    /// The cluster's alarms: `alarm list`, `alarm disarm` (docs/operations.md, "Capacity").
    #[command(subcommand)]
    Alarm(capacity::AlarmCommand),
    /// Tenant quotas: `quota set NAME count=100 bytes=64Mi ...`, `quota list`, `quota delete`.
    #[command(subcommand)]
    Quota(capacity::QuotaCommand),
    /// Hand leadership to another voter (the most up-to-date one by default).
    TransferLeader(TransferArgs),
    /// Leases: `lease grant --ttl 10s`, `lease keep-alive ID`, `lease revoke ID`,
    /// `lease list`, `lease ttl ID` (attach resources with `write --lease ID`).
    #[command(subcommand)]
    Lease(lease::LeaseCommand),
    /// Run a command while holding a lock: `lock NAME [--ttl 10s] -- CMD ARGS...` (the
    /// command gets CAIRN_LOCK_TOKEN, the fencing token). Exits with CMD's code, or 7 if
    /// the lock was lost while it ran.
    Lock(lease::LockArgs),
    /// Campaign in an election and hold it until Ctrl-C (exit 7 if lost), or follow its
    /// holder with --listen.
    Elect(lease::ElectArgs),
    /// Load generator: measure a running cluster (write, read, list, mixed, watch).
    Bench(bench::BenchArgs),
    /// Is this disk, this cluster, fit to run Cairn? `check disk`, `check perf`.
    #[command(subcommand)]
    Check(check::CheckCommand),
    /// Back up, inspect and restore snapshots.
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCommand),
    /// The leader's scheduled backups, read from their target: `backup list`, `backup
    /// verify [NAME]`, `backup restore [NAME]` (--target DIR or s3://BUCKET/PREFIX).
    #[command(subcommand)]
    Backup(backup::BackupCommand),
    /// After a quorum is lost for good: report what stopped survivors' data dirs hold, or
    /// with --members seed a new cluster from the most up-to-date one (offline).
    Recover(recover::RecoverArgs),
    /// Make and hash bearer tokens for `[[auth.grants]]`.
    #[command(subcommand)]
    Token(token::TokenCommand),
    /// Development certificates: a CA, one certificate per node, one for a client.
    #[command(subcommand)]
    Tls(tls::TlsCommand),
    #[command(flatten)]
    Data(data::DataCommand),
}

use common::runtime;
/// `-o table|json` and the one exit-code table, by error kind ([`common`]).
pub use common::{exit, exit_code_of_kind, OutputFormat as Output};

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(
        cli.command,
        Command::Agent(_) | Command::Dev(_) | Command::Bench(_) | Command::Drill(_)
    ) {
        end_quietly_when_stdout_closes();
    }
    let global = &cli.global;
    let code = match cli.command {
        Command::Agent(args) => agent::run(*args),
        Command::Dev(args) => dev::run(args),
        Command::Drill(d) => drill::run(d, global),
        Command::Status => runtime().block_on(admin::status(global)),
        Command::Endpoint(EndpointCommand::Health(args)) => {
            runtime().block_on(admin::endpoint_health(global, &args))
        }
        Command::Endpoint(EndpointCommand::Status(args)) => {
            runtime().block_on(admin::endpoint_status(global, &args))
        }
        Command::Member(m) => runtime().block_on(admin::member(m, global)),
        Command::Cluster(c) => runtime().block_on(admin::cluster(c, global)),
        Command::Alarm(a) => runtime().block_on(capacity::alarm(a, global)),
        Command::Quota(q) => runtime().block_on(capacity::quota(q, global)),
        Command::TransferLeader(t) => runtime().block_on(admin::transfer_leader(&t, global)),
        Command::Lease(l) => runtime().block_on(lease::lease(l, global)),
        Command::Lock(l) => runtime().block_on(lease::lock(l, global)),
        Command::Elect(e) => runtime().block_on(lease::elect(e, global)),
        Command::Snapshot(s) => snapshot::run(s, global),
        Command::Backup(b) => backup::run(b, global),
        Command::Recover(r) => recover::run(r, global),
        Command::Data(d) => runtime().block_on(data::run(d)),
        Command::Token(t) => token::run(t),
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
                    // dev's own settings: clap's default, which its help shows; a switch; or
                    // the agent flags passed on after `--`.
                    assert!(
                        !arg.get_default_values().is_empty()
                            || matches!(arg.get_action(), clap::ArgAction::SetTrue)
                            || arg.is_last_set(),
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
