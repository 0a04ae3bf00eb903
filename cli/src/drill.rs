//! `cairn drill failover | rolling-restart | partition | restore`: one operator action on a
//! running cluster under a checked workload, and a report of what a client saw
//! (`jepsen_tests::drill`, the fault suite's workload and set checker).
//!
//! The members are stopped, started and partitioned through the `cairn dev` running on
//! `--dev DIR` (the default, `.cairn-dev`), or by the commands an operator names
//! (`--kill-command`, `--stop-command`, `--start-command`, `--isolate-command`,
//! `--heal-command`; `{id}` stands for the node id). Backups are taken and restored with
//! `cairn snapshot save` and `restore`'s own code. The report prints as a table or, with
//! `-o json`, as one JSON object, and is kept in the cluster (the last
//! [`jepsen_tests::drill::REPORTS_KEPT`], as `cairn.v1.DrillReport` resources: the web
//! console shows them).
//!
//! Exit codes: 0 when the drill passed (nothing lost, no read or version backwards), 1 when it failed, could not be checked, or could not run; 2 for a usage error
//! (a restore drill without a confirmation).

use std::path::PathBuf;
use std::time::Duration;

use cairn_client::admin::AdminClient;
use clap::{Args, Subcommand};
use jepsen_tests::drill::{Action, DrillOptions, Members, Report, Snapshots, Step, Stop};

use crate::common::{exit, GlobalArgs, OutputFormat};

#[derive(Subcommand)]
pub enum DrillCommand {
    /// Kill the leader with SIGKILL (or hand leadership off with --graceful), await a new
    /// leader, and start the old one again.
    Failover {
        /// Hand leadership off through the admin API instead of killing the leader.
        #[arg(long)]
        graceful: bool,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Stop (SIGTERM) and start each member in turn, followers first, each awaited until it
    /// has caught up.
    RollingRestart {
        #[command(flatten)]
        run: RunArgs,
    },
    /// Cut the leader off from the other members (clients still reach it), await a new
    /// leader and the old one's step-down, heal, await the old leader caught up. Against
    /// `cairn dev` it needs root (nftables).
    Partition {
        #[command(flatten)]
        run: RunArgs,
    },
    /// Save a backup through the leader and restore it online at once: the writes
    /// acknowledged in between are undone, as a restore does, and versions must stay above
    /// every one handed out before. It REPLACES the cluster's data: it asks first, or
    /// needs --yes off a terminal.
    Restore {
        /// Replace the running cluster's data without asking.
        #[arg(long, short = 'y')]
        yes: bool,
        #[command(flatten)]
        run: RunArgs,
    },
}

#[derive(Args)]
pub struct RunArgs {
    /// The data dir of the `cairn dev` cluster to drill: it stops and starts the members, and
    /// its layout gives their addresses. The default, unless the commands below are given.
    #[arg(long, conflicts_with_all = ["kill_command", "stop_command", "start_command", "isolate_command", "heal_command"])]
    dev: Option<PathBuf>,
    /// Kills member {id} at once, as a crash would (for `failover`):
    /// `systemctl kill -s KILL cairn@{id}`. Run with `sh -c`.
    #[arg(long)]
    kill_command: Option<String>,
    /// Stops member {id} gracefully and returns once it has ended (for `rolling-restart`):
    /// `systemctl stop cairn@{id}`.
    #[arg(long)]
    stop_command: Option<String>,
    /// Starts member {id} again: `systemctl start cairn@{id}`.
    #[arg(long)]
    start_command: Option<String>,
    /// Cuts member {id} off from the other members, both ways (for `partition`):
    /// `ssh node-{id} sudo nft -f /etc/cairn/isolate.nft`.
    #[arg(long)]
    isolate_command: Option<String>,
    /// Ends the partition ({id}: the member that was cut off).
    #[arg(long)]
    heal_command: Option<String>,
    /// Concurrent writers.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    clients: u16,
    /// Seconds of workload before the action.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=600))]
    before_seconds: u64,
    /// Seconds of workload after the action.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=600))]
    after_seconds: u64,
    /// The longest wait for one step: a new leader, a member caught up, a command.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    step_timeout_seconds: u64,
    /// The workload's seed (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
}

/// `cairn dev`'s control socket ([`crate::dev::control`]).
struct DevMembers {
    data_dir: PathBuf,
}

impl Members for DevMembers {
    async fn stop(&self, id: u64, how: Stop) -> Result<(), String> {
        let signal = match how {
            Stop::Kill => "kill",
            Stop::Terminate => "term",
        };
        crate::dev::control(&self.data_dir, &format!("stop {id} {signal}"))
            .await
            .map(drop)
    }

    async fn start(&self, id: u64) -> Result<(), String> {
        crate::dev::control(&self.data_dir, &format!("start {id}"))
            .await
            .map(drop)
    }

    async fn isolate(&self, id: u64) -> Result<(), String> {
        crate::dev::control(&self.data_dir, &format!("isolate {id}"))
            .await
            .map(drop)
    }

    async fn heal(&self) -> Result<(), String> {
        crate::dev::control(&self.data_dir, "heal").await.map(drop)
    }

    fn describe(&self) -> String {
        format!("cairn dev in {}", self.data_dir.display())
    }
}

/// The operator's commands, `{id}` replaced by the node id, run with `sh -c`.
struct CommandMembers {
    kill: Option<String>,
    stop: Option<String>,
    start: Option<String>,
    isolate: Option<String>,
    heal: Option<String>,
    timeout: Duration,
    /// The member `isolate` cut off, for `heal`'s {id}.
    isolated: std::sync::Mutex<Option<u64>>,
}

impl Members for CommandMembers {
    async fn stop(&self, id: u64, how: Stop) -> Result<(), String> {
        let (command, flag) = match how {
            Stop::Kill => (&self.kill, "--kill-command"),
            Stop::Terminate => (&self.stop, "--stop-command"),
        };
        let command = command
            .as_deref()
            .ok_or_else(|| format!("this drill needs {flag}"))?;
        run_command(command, id, self.timeout).await
    }

    async fn start(&self, id: u64) -> Result<(), String> {
        let command = self
            .start
            .as_deref()
            .ok_or("this drill needs --start-command")?;
        run_command(command, id, self.timeout).await
    }

    async fn isolate(&self, id: u64) -> Result<(), String> {
        let command = self
            .isolate
            .as_deref()
            .ok_or("this drill needs --isolate-command and --heal-command")?;
        if self.heal.is_none() {
            return Err("this drill needs --heal-command".into());
        }
        *self.isolated.lock().expect("not poisoned") = Some(id);
        run_command(command, id, self.timeout).await
    }

    async fn heal(&self) -> Result<(), String> {
        let command = self
            .heal
            .as_deref()
            .ok_or("this drill needs --heal-command")?;
        let id = self.isolated.lock().expect("not poisoned").unwrap_or(0);
        run_command(command, id, self.timeout).await
    }

    fn describe(&self) -> String {
        "members stopped and started by the given commands".into()
    }
}

/// Runs `command` for node `id` with `sh -c`, within `timeout`; an error names the command,
/// its exit and the end of what it printed on stderr.
async fn run_command(command: &str, id: u64, timeout: Duration) -> Result<(), String> {
    let line = command.replace("{id}", &id.to_string());
    let child = tokio::process::Command::new("sh")
        .args(["-c", &line])
        .env("CAIRN_DRILL_NODE_ID", id.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run `{line}`: {e}"))?;
    let output = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .map_err(|_| format!("`{line}` did not end within {} s", timeout.as_secs()))?
        .map_err(|e| format!("`{line}`: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(format!("`{line}` {}: {}", output.status, tail.join(" / ")))
}

/// Backups through the admin API, spooled to `file` (removed on drop): `cairn snapshot save`
/// and `restore`'s own code.
struct ApiSnapshots {
    client: AdminClient,
    file: PathBuf,
}

impl Snapshots for ApiSnapshots {
    async fn save(&self) -> Result<u64, String> {
        let (header, _, _) = crate::snapshot::save_with(&self.client, &self.file)
            .await
            .map_err(|e| e.to_string())?;
        Ok(header.last_log_index)
    }

    async fn restore(&self) -> Result<u64, String> {
        let shown = self.file.display().to_string();
        // Confirmed before the drill began.
        let (_, response) = crate::snapshot::restore_with(&self.client, &self.file, &shown, true)
            .await
            .map_err(|e| e.to_string())?;
        Ok(response.log_index)
    }
}

impl Drop for ApiSnapshots {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

pub fn run(command: DrillCommand, global: &GlobalArgs) -> u8 {
    let (action, args, confirmed) = match command {
        DrillCommand::Failover { graceful, run } => (Action::Failover { graceful }, run, true),
        DrillCommand::RollingRestart { run } => (Action::RollingRestart, run, true),
        DrillCommand::Partition { run } => (Action::Partition, run, true),
        DrillCommand::Restore { yes, run } => (Action::Restore, run, yes),
    };
    let step_timeout = Duration::from_secs(args.step_timeout_seconds);
    let by_commands = [
        &args.kill_command,
        &args.stop_command,
        &args.start_command,
        &args.isolate_command,
        &args.heal_command,
    ]
    .iter()
    .any(|c| c.is_some());
    let dev = (!by_commands).then(|| args.dev.clone().unwrap_or_else(|| ".cairn-dev".into()));
    let endpoints = match &dev {
        Some(dir) => match crate::dev::client_addresses(dir) {
            Ok(members) => members.into_iter().map(|(_, a)| a).collect(),
            Err(why) => {
                eprintln!("cairn drill: {why}");
                return exit::ERROR;
            }
        },
        None => global.cluster.endpoints.clone(),
    };
    let access = match global.cluster.access() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cairn drill: {e}");
            return exit::USAGE;
        }
    };
    let token = match global.cluster.bearer_token() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cairn drill: {e}");
            return exit::USAGE;
        }
    };
    let options = DrillOptions {
        endpoints: endpoints.clone(),
        access,
        client: cairn_client::ClientOptions {
            token,
            tls: global.cluster.tls.options(&endpoints),
            ..cairn_client::ClientOptions::default()
        },
        clients: usize::from(args.clients),
        before: Duration::from_secs(args.before_seconds),
        after: Duration::from_secs(args.after_seconds),
        step_timeout,
        seed: args.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        }),
    };
    if !confirmed {
        let asked = crate::snapshot::require_confirmation(false, || {
            "refusing to replace the running cluster's data without a confirmation: stdin is not \
             a terminal. Pass --yes: the restore drill saves a backup and restores it at once, \
             undoing every write made in between"
                .to_string()
        })
        .and_then(|()| {
            eprintln!(
                "The restore drill REPLACES ALL THE DATA of the running cluster ({}) with a \
                 backup it takes a few seconds before: every write made in between, by any \
                 client, is undone, and every open watch is closed.",
                endpoints.join(", ")
            );
            crate::snapshot::ask_yes("Type yes to run it: ")
        });
        if asked.is_err() {
            return crate::snapshot::exit_of(asked);
        }
    }
    let snapshots = ApiSnapshots {
        client: AdminClient::new(endpoints.clone(), options.access.clone(), step_timeout),
        file: std::env::temp_dir().join(format!("cairn-drill-{}.snap", std::process::id())),
    };
    let output = global.output;
    let on_step = move |step: &Step| {
        if output == OutputFormat::Table {
            out!("{:>+8} ms  {}", step.at_ms, step.what);
        }
    };
    if output == OutputFormat::Table {
        out!(
            "Drill {} on {} member(s), {} writers, seed {}:",
            action.name(),
            endpoints.len(),
            args.clients,
            options.seed
        );
    }
    let runtime = crate::common::runtime();
    let report = match &dev {
        Some(dir) => runtime.block_on(jepsen_tests::drill::run(
            action,
            &DevMembers {
                data_dir: dir.clone(),
            },
            &snapshots,
            &options,
            &on_step,
        )),
        None => runtime.block_on(jepsen_tests::drill::run(
            action,
            &CommandMembers {
                kill: args.kill_command.clone(),
                stop: args.stop_command.clone(),
                start: args.start_command.clone(),
                isolate: args.isolate_command.clone(),
                heal: args.heal_command.clone(),
                timeout: step_timeout,
                isolated: std::sync::Mutex::new(None),
            },
            &snapshots,
            &options,
            &on_step,
        )),
    };
    let report = match report {
        Ok(r) => r,
        Err(why) => {
            eprintln!("cairn drill: {why}");
            return exit::ERROR;
        }
    };
    let kept = runtime.block_on(async {
        let client = cairn_client::Client::new(&endpoints, options.client.clone())
            .map_err(|e| e.to_string())?;
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        jepsen_tests::drill::store_report(&client, &report, unix_ms).await
    });
    match output {
        OutputFormat::Json => out!(
            "{}",
            serde_json::to_string_pretty(&report).expect("a report serializes")
        ),
        OutputFormat::Table => print_table(&report),
    }
    match kept {
        Ok(name) if output == OutputFormat::Table => {
            let t = cairn_proto::drill_report::report_type();
            out!(
                "  kept as             {}.{}.{} {name} (the web console shows it)",
                t.group,
                t.group_version,
                t.kind
            )
        }
        Ok(_) => {}
        Err(why) => eprintln!("cairn drill: the report could not be kept in the cluster: {why}"),
    }
    if report.verdict == "pass" {
        exit::OK
    } else {
        exit::ERROR
    }
}

fn print_table(r: &Report) {
    out!("");
    out!(
        "Drill {} against {}: {}",
        r.drill,
        r.members,
        r.verdict.to_uppercase()
    );
    out!(
        "  leader before       node {} (term {})",
        r.leader_before,
        r.term_before
    );
    out!(
        "  leader after        node {} (term {})",
        r.leader_after,
        r.term_after
    );
    out!("  action took         {} ms", r.action_ms);
    match &r.write_gap {
        Some(g) => out!(
            "  writes stopped      {} ms: from {:+} ms to the first acknowledged write at {:+} ms",
            g.gap_ms,
            g.from_ms,
            g.to_ms
        ),
        None => out!("  writes stopped      no write was acknowledged after the action"),
    }
    out!(
        "  writes              {} acknowledged, {} refused, {} unknown",
        r.writes_acknowledged,
        r.writes_failed,
        r.writes_unknown
    );
    out!(
        "  lost writes         {} (every acknowledged write read back)",
        r.lost_writes
    );
    out!(
        "  reads backwards     {} of {} strong reads",
        r.reads_backwards,
        r.reads
    );
    if r.drill == Action::Restore.name() {
        out!(
            "  versions backwards  {} (resources with a version from before the restore)",
            r.versions_backwards
        );
    }
    for problem in &r.problems {
        out!("  problem             {problem}");
    }
}
