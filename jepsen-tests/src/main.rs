//! `jepsen-tests`: command-line entry point.
//!
//! `jepsen-tests check --model register|kv|set|append|monotonic FILE` checks a recorded
//! history (project JSONL or Jepsen log, detected automatically);
//! `jepsen-tests check --model watch DIR` re-checks a watch scenario's results
//! folder (history, watch log and final state), `jepsen-tests check --model election DIR`
//! an election scenario's (history, watch log, fault windows, final state),
//! `jepsen-tests check --model lifecycle DIR` a lifecycle scenario's (history and
//! `lifecycle.jsonl`). All exit with
//! 0 = valid (linearizable), 1 = invalid, 2 = unknown within the time budget,
//! 3 = the command or the file could not be used.
//!
//! `jepsen-tests auth` runs the scenario under authentication (two tokens
//! with disjoint scopes, the set workload, partitions, kills and leader
//! transfers; see `jepsen_tests::scoped`).
//!
//! `jepsen-tests ci` runs the short fault suite (18 scenarios on 3 nodes, the last, the
//! recovery from a lost quorum, on 5; bounded to 10 minutes) and ends with the line `N
//! passed, N failed` (`--only TEXT` runs the scenarios whose name contains TEXT;
//! `--recover-from-lagging` is the proof that the recovery scenario can fail);
//! `jepsen-tests soak --minutes M --seed S` runs 5-node scenarios with
//! every nemesis until the time is up or the first failure; `jepsen-tests
//! prove-broken` runs the broken-node matrix: for every `--unsafe-*` mode of the node
//! (`runner::BrokenMode`), a scenario whose checker must find the history INVALID.
//! Under `CI=true` a skipped scenario or mode is a failure. `jepsen-tests upgrade` builds the
//! newest release pinned in `tests/compat/releases.toml` from its commit and upgrades a
//! 3-node cluster of it to this build member by member, with a rollback, under the register
//! and set workloads (`jepsen_tests::upgrade`). Each writes its results
//! (histories, node logs, nemesis logs, checker reports, `summary.txt` with
//! the seed) to `--results` (default `./jepsen-results/<timestamp>`).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};

use jepsen_tests::runner;

use jepsen_tests::append::{self, AppendAnomaly};
use jepsen_tests::history::Format;
use jepsen_tests::linearizability::{
    CheckOptions, KeyOutcome, LinearizabilityReport, UnknownReason,
};
use jepsen_tests::models::{self, ModelKind};
use jepsen_tests::monotonic;
use jepsen_tests::set::{self, SetAnomaly};
use jepsen_tests::watch_check;
use jepsen_tests::{Error, History, Verdict};

/// Appends a line to the report being built (writing to a `String` cannot fail).
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
}

/// Exit code for usage errors and unreadable histories (0, 1 and 2 are verdicts).
const EXIT_USAGE: u8 = 3;

#[derive(Parser, Debug)]
#[command(
    name = "jepsen-tests",
    version,
    about = "Black-box fault testing of Cairn clusters"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check a recorded history: exit 0 valid, 1 invalid, 2 unknown, 3 unusable input.
    Check(CheckArgs),
    /// Run the short fault suite (3-node clusters; the recovery from a lost quorum on 5) (exit 1
    /// on any failure).
    Ci(CiArgs),
    /// Run 5-node scenarios with every nemesis until the time is up or one fails.
    Soak(SoakArgs),
    /// Two tokens with disjoint scopes run the set workload through partitions,
    /// kills and leader transfers; no token may see the other's resources.
    Auth(RunArgs),
    /// Show that the suite catches every broken node mode (`--unsafe-*`), each with the
    /// checker meant for it (exit 0 all caught, 1 one not caught, 2 one skipped; a skip is
    /// a failure under CI=true).
    ProveBroken(ProveArgs),
    /// Upgrade a 3-node cluster of an earlier release (tests/compat/releases.toml, built from
    /// its commit) to this build member by member, with a rollback, under the register and
    /// set workloads (exit 1 on any failure).
    Upgrade(UpgradeArgs),
}

#[derive(clap::Args, Debug, Clone)]
struct RunArgs {
    /// Seed of every random choice (default: from the clock); printed for replay.
    #[arg(long)]
    seed: Option<u64>,
    /// Results folder (default: ./jepsen-results/<timestamp>).
    #[arg(long)]
    results: Option<PathBuf>,
    /// The cairn binary (default: built with cargo next to this program).
    #[arg(long)]
    cairn_binary: Option<PathBuf>,
    /// Run only the scenarios whose name contains this.
    #[arg(long)]
    only: Option<String>,
}

#[derive(clap::Args, Debug, Clone)]
struct CiArgs {
    #[command(flatten)]
    run: RunArgs,
    /// The proof that 18-set-quorum-loss-recover tests the choice of survivor: recover from
    /// the lagging survivor alone instead of from both; that scenario must then FAIL, its set
    /// checker finding acknowledged adds lost (use with --only 18).
    #[arg(long)]
    recover_from_lagging: bool,
}

#[derive(clap::Args, Debug)]
struct SoakArgs {
    #[command(flatten)]
    run: RunArgs,
    /// How long to soak.
    #[arg(long, default_value_t = 10)]
    minutes: u64,
}

#[derive(clap::Args, Debug)]
struct ProveArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Attempts per mode (a 16 s scenario each) before it counts as not caught.
    #[arg(long, default_value_t = 3)]
    attempts: usize,
    /// Only these modes (repeatable): local-strong-reads, skip-fsync, ack-before-commit,
    /// drop-watch-events, accept-stale-cas, ignore-fences, lease-wall-clock. Default: every one.
    #[arg(long, value_parser = parse_mode)]
    mode: Vec<ModeArg>,
    /// The whole matrix ends within this many minutes; a mode not caught by then fails.
    #[arg(long, default_value_t = 12)]
    minutes: u64,
}

#[derive(clap::Args, Debug)]
struct UpgradeArgs {
    /// Seed of every random choice (default: from the clock); printed for replay.
    #[arg(long)]
    seed: Option<u64>,
    /// Results folder (default: ./jepsen-results/<timestamp>).
    #[arg(long)]
    results: Option<PathBuf>,
    /// This build's cairn binary (default: built with cargo next to this program).
    #[arg(long)]
    cairn_binary: Option<PathBuf>,
    /// The release to upgrade from, one of tests/compat/releases.toml (default: the newest).
    #[arg(long)]
    from: Option<String>,
    /// The scenario ends within this many minutes (building the earlier release not counted).
    #[arg(long, default_value_t = 5)]
    minutes: u64,
}

#[derive(clap::Args, Debug)]
struct CheckArgs {
    /// What the history is checked against.
    #[arg(long, value_enum)]
    model: ModelArg,
    /// Input format; by default detected from the first line.
    #[arg(long, value_enum, default_value_t = FormatArg::Auto)]
    format: FormatArg,
    /// Wall-clock budget of the linearizability search; "unknown" when exceeded.
    #[arg(long, default_value_t = 60)]
    time_budget_secs: u64,
    /// Keys checked in parallel (default: the number of CPUs).
    #[arg(long)]
    threads: Option<usize>,
    /// Check every key to the end instead of stopping at the first failing key.
    #[arg(long)]
    all_keys: bool,
    /// At most this many operations or anomalies are printed per list.
    #[arg(long, default_value_t = 40)]
    print_max: usize,
    /// The history file.
    file: PathBuf,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ModelArg {
    /// CAS register per key (read, write, cas).
    Register,
    /// Key-value map partitioned by key (read, write, cas, delete).
    Kv,
    /// Set checker (add, read).
    Set,
    /// List-append checker (append, read).
    Append,
    /// Watch delivery (FILE is a watch scenario's results folder: history.jsonl,
    /// watch.jsonl, watch-final.json).
    Watch,
    /// Leases and fencing tokens (FILE is an election scenario's results folder:
    /// history.jsonl, watch.jsonl, faults.jsonl, election.json).
    Election,
    /// Status writes, finalizers and the selector cache (FILE is a lifecycle scenario's
    /// results folder: history.jsonl, lifecycle.jsonl).
    Lifecycle,
    /// Eventual reads never go backwards on one node in one lifetime (read with
    /// [node lifetime], or the node alone, as input and [version value] as
    /// output; a run's eventual.jsonl).
    Monotonic,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum FormatArg {
    Auto,
    Jsonl,
    JepsenLog,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.command {
        Command::Ci(args) => fault_run(FaultCommand::Ci(args)),
        Command::Auth(args) => fault_run(FaultCommand::Auth(args)),
        Command::Soak(args) => fault_run(FaultCommand::Soak(args)),
        Command::ProveBroken(args) => fault_run(FaultCommand::ProveBroken(args)),
        Command::Upgrade(args) => fault_run(FaultCommand::Upgrade(args)),
        Command::Check(args) => {
            let mut out = String::new();
            let result = run_check(&args, &mut out);
            // The report is printed in one go; a closed stdout (`| head`) is not an error.
            let _ = std::io::stdout().lock().write_all(out.as_bytes());
            match result {
                Ok(verdict) => {
                    ExitCode::from(u8::try_from(verdict.exit_code()).unwrap_or(EXIT_USAGE))
                }
                Err(error) => {
                    eprintln!("error: {error}");
                    ExitCode::from(EXIT_USAGE)
                }
            }
        }
    }
}

fn run_check(args: &CheckArgs, out: &mut String) -> Result<Verdict, Error> {
    let format = match args.format {
        FormatArg::Auto => None,
        FormatArg::Jsonl => Some(Format::Jsonl),
        FormatArg::JepsenLog => Some(Format::JepsenLog),
    };
    // A watch or an election run is a folder, not one history file.
    if matches!(args.model, ModelArg::Watch) {
        return check_watch(args, out);
    }
    if matches!(args.model, ModelArg::Election) {
        return check_election(args, out);
    }
    if matches!(args.model, ModelArg::Lifecycle) {
        return check_lifecycle(args, out);
    }
    let (history, format) = History::load(&args.file, format)?;
    let key_count = history
        .operations()
        .iter()
        .map(|operation| operation.key.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    say!(
        out,
        "history: {} ({format}, {} operations, keys: {key_count})",
        args.file.display(),
        history.len()
    );
    match args.model {
        ModelArg::Register | ModelArg::Kv => {
            let kind = if matches!(args.model, ModelArg::Register) {
                ModelKind::Register
            } else {
                ModelKind::KeyValue
            };
            let mut options = CheckOptions {
                time_budget: Duration::from_secs(args.time_budget_secs),
                ..CheckOptions::default()
            };
            options.stop_at_first_failure = !args.all_keys;
            if let Some(threads) = args.threads {
                options.threads = threads.max(1);
            }
            let report = models::check(&history, kind, &options)?;
            print_linearizability(out, &history, kind, &report, args.print_max);
            Ok(report.verdict)
        }
        ModelArg::Set => {
            let report = set::check(&history)?;
            say!(out, "checker: set");
            for fate in &report.restores {
                say!(out, "{fate}");
            }
            for key in &report.keys {
                say!(
                out,
                    "key {:?}: {} (final read {}, {} reads of which {} stale, {} acknowledged, {} indeterminate of which {} present, {} failed, {} unverified)",
                    key.key,
                    verdict_word(key.verdict, false),
                    key.final_read.map_or_else(|| "none".to_owned(), |index| format!("#{index}")),
                    key.reads,
                    key.stale_reads,
                    key.acknowledged_elements,
                    key.indeterminate_elements,
                    key.indeterminate_elements_present,
                    key.failed_elements,
                    key.unverified_elements
                );
                print_anomalies(
                    out,
                    key.anomalies.iter().map(describe_set_anomaly),
                    args.print_max,
                );
                for fate in key.fates.iter().take(args.print_max) {
                    say!(
                        out,
                        "  element {}: known at {} (#{}), lost at {}, {}",
                        fate.element,
                        fate.known_ns,
                        fate.known_by,
                        fate.lost_ns,
                        fate.recovered_ns.map_or_else(
                            || "never recovered".to_owned(),
                            |ns| format!("recovered at {ns}")
                        )
                    );
                }
            }
            say!(out, "verdict: {}", verdict_word(report.verdict, false));
            Ok(report.verdict)
        }
        ModelArg::Watch => check_watch(args, out),
        ModelArg::Election => check_election(args, out),
        ModelArg::Lifecycle => check_lifecycle(args, out),
        ModelArg::Monotonic => {
            let report = monotonic::check(&history)?;
            say!(out, "checker: monotonic reads");
            say!(
                out,
                "{} eventual reads on {} node/key pairs",
                report.reads,
                report.series
            );
            print_anomalies(
                out,
                report.anomalies.iter().map(ToString::to_string),
                args.print_max,
            );
            say!(out, "verdict: {}", verdict_word(report.verdict, false));
            Ok(report.verdict)
        }
        ModelArg::Append => {
            let report = append::check(&history)?;
            say!(out, "checker: append");
            for key in &report.keys {
                say!(
                out,
                    "key {:?}: {} (longest list {} from {}, {} reads, {} acknowledged, {} indeterminate, {} failed, {} unverified)",
                    key.key,
                    verdict_word(key.verdict, false),
                    key.longest_len,
                    key.longest_read.map_or_else(|| "no read".to_owned(), |index| format!("#{index}")),
                    key.reads,
                    key.acknowledged_appends,
                    key.indeterminate_appends,
                    key.failed_appends,
                    key.unverified_appends
                );
                print_anomalies(
                    out,
                    key.anomalies.iter().map(describe_append_anomaly),
                    args.print_max,
                );
            }
            say!(out, "verdict: {}", verdict_word(report.verdict, false));
            Ok(report.verdict)
        }
    }
}

/// `check --model watch DIR`: re-checks a watch scenario's folder.
fn check_watch(args: &CheckArgs, out: &mut String) -> Result<Verdict, Error> {
    let (history, log, last) = watch_check::load_run(&args.file)?;
    say!(
        out,
        "watch run: {} ({} operations, {} watch records, {} nodes)",
        args.file.display(),
        history.len(),
        log.len(),
        last.nodes
    );
    let report = watch_check::check(
        &log,
        &history,
        &last.state,
        last.revision,
        last.nodes,
        &last.members_at_end,
    );
    say!(out, "checker: watch");
    for line in &report.summary {
        say!(out, "  {line}");
    }
    print_anomalies(out, report.anomalies.iter().cloned(), args.print_max);
    say!(out, "verdict: {}", verdict_word(report.verdict, false));
    Ok(report.verdict)
}

/// `check --model election DIR`: re-checks an election scenario's folder.
fn check_election(args: &CheckArgs, out: &mut String) -> Result<Verdict, Error> {
    use jepsen_tests::election;
    let run = election::load_run(&args.file)?;
    say!(
        out,
        "election run: {} ({} operations, {} watch records, {} fault windows)",
        args.file.display(),
        run.history.len(),
        run.watch.len(),
        run.faults.len()
    );
    let report = election::check::check(
        &run.history,
        &run.watch,
        &run.faults,
        &run.record.final_state,
        &run.record.timing,
    );
    out.push_str(&election::describe(&report, args.print_max));
    say!(out, "verdict: {}", verdict_word(report.verdict, false));
    Ok(report.verdict)
}

/// `check --model lifecycle DIR`: re-checks a lifecycle scenario's folder.
fn check_lifecycle(args: &CheckArgs, out: &mut String) -> Result<Verdict, Error> {
    use jepsen_tests::lifecycle;
    let (history, records) = lifecycle::load_run(&args.file)?;
    say!(
        out,
        "lifecycle run: {} ({} operations, {} records)",
        args.file.display(),
        history.len(),
        records.len()
    );
    let report = lifecycle::check::check(&history, &records);
    out.push_str(&lifecycle::check::describe(&report, args.print_max));
    say!(out, "verdict: {}", verdict_word(report.verdict, false));
    Ok(report.verdict)
}

fn verdict_word(verdict: Verdict, linearizability: bool) -> &'static str {
    match (verdict, linearizability) {
        (Verdict::Valid, true) => "LINEARIZABLE",
        (Verdict::Invalid, true) => "NOT LINEARIZABLE",
        (Verdict::Valid, false) => "VALID",
        (Verdict::Invalid, false) => "INVALID",
        (Verdict::Unknown, _) => "UNKNOWN",
    }
}

fn print_linearizability(
    out: &mut String,
    history: &History,
    kind: ModelKind,
    report: &LinearizabilityReport,
    print_max: usize,
) {
    let operations = history.operations();
    let steps: u64 = report.keys.iter().map(|key| key.steps).sum();
    say!(
        out,
        "model: {kind}, keys: {}, search steps: {steps}, checked in {:?}",
        report.keys.len(),
        report.elapsed
    );
    for key in &report.keys {
        match &key.outcome {
            KeyOutcome::Linearizable => {}
            KeyOutcome::Unknown(reason) => {
                let why = match reason {
                    UnknownReason::TimeBudgetExhausted => "time budget exhausted",
                    UnknownReason::CacheLimitReached => "search cache limit reached",
                    UnknownReason::CancelledAfterAnotherKeyFailed => {
                        "not finished: another key already failed"
                    }
                };
                say!(
                    out,
                    "key {:?}: unknown ({why}; {} operations, {} search steps)",
                    key.key,
                    key.operation_count,
                    key.steps
                );
            }
            KeyOutcome::NotLinearizable(prefix) => {
                say!(out, "key {:?}: NOT LINEARIZABLE", key.key);
                say!(
                    out,
                    "  operation #{} cannot be linearized: {}",
                    prefix.failing_operation,
                    operations[prefix.failing_operation]
                );
                say!(
                    out,
                    "  shortest illegal prefix: {} events of this key, {} operations invoked:",
                    prefix.prefix_event_count,
                    prefix.prefix_operations.len()
                );
                let skipped = prefix.prefix_operations.len().saturating_sub(print_max);
                if skipped > 0 {
                    say!(out, "    ... {skipped} earlier operations not shown");
                }
                for &index in &prefix.prefix_operations[skipped..] {
                    say!(out, "    #{index} {}", operations[index]);
                }
                say!(
                    out,
                    "  deepest partial linearization: {} operations; its last steps (state after):",
                    prefix.linearized_count
                );
                for step in &prefix.linearized_tail {
                    say!(
                        out,
                        "    #{} {} => {}",
                        step.operation,
                        operations[step.operation],
                        step.state_after
                    );
                }
            }
        }
    }
    let linearizable = report
        .keys
        .iter()
        .filter(|key| key.outcome == KeyOutcome::Linearizable)
        .count();
    say!(
        out,
        "{linearizable} of {} keys linearizable",
        report.keys.len()
    );
    say!(out, "verdict: {}", verdict_word(report.verdict, true));
}

fn print_anomalies(
    out: &mut String,
    anomalies: impl ExactSizeIterator<Item = String>,
    print_max: usize,
) {
    let total = anomalies.len();
    for line in anomalies.take(print_max) {
        say!(out, "  {line}");
    }
    if total > print_max {
        say!(out, "  ... {} more anomalies", total - print_max);
    }
}

fn describe_set_anomaly(anomaly: &SetAnomaly) -> String {
    match anomaly {
        SetAnomaly::Lost {
            element,
            known_by,
            first_missing_read,
            last_read,
            missing_reads,
        } => format!(
            "lost: {element} known from #{known_by}, missing from read #{first_missing_read} on ({missing_reads} reads), the last read #{last_read} included"
        ),
        SetAnomaly::Stale {
            element,
            known_by,
            first_missing_read,
            recovered_read,
            missing_reads,
        } => format!(
            "stale: {element} known from #{known_by}, missing from read #{first_missing_read} ({missing_reads} reads), listed again by #{recovered_read}"
        ),
        SetAnomaly::NeverAttempted { element, read } => {
            format!("never attempted: {element} in read #{read}")
        }
        SetAnomaly::FailedButPresent { element, read, add } => {
            format!("failed but present: {element} in read #{read}, its add #{add} failed")
        }
        SetAnomaly::Duplicated { element, read } => {
            format!("duplicated: {element} twice in read #{read}")
        }
        SetAnomaly::Unexplained { read, candidates } => {
            let why: Vec<String> = candidates.iter().map(ToString::to_string).collect();
            format!("unexplained: read #{read} is no state it may have seen; {}", why.join("; "))
        }
    }
}

fn describe_append_anomaly(anomaly: &AppendAnomaly) -> String {
    match anomaly {
        AppendAnomaly::Duplicate { element, read } => format!("duplicate: {element} twice in read #{read}"),
        AppendAnomaly::NeverAttempted { element, read } => format!("never attempted: {element} in read #{read}"),
        AppendAnomaly::FailedButPresent { element, read, append } => {
            format!("failed but present: {element} in read #{read}, its append #{append} failed")
        }
        AppendAnomaly::NotPrefixOfLongest { read, longest_read } => {
            format!("read #{read} is not a prefix of the longest list (read #{longest_read})")
        }
        AppendAnomaly::Lost { element, append, read } => {
            format!("lost: {element} acknowledged by #{append} before read #{read} began, missing from it")
        }
        AppendAnomaly::Rewind { earlier_read, later_read } => {
            format!("rewind: read #{later_read} began after read #{earlier_read} ended but shows a shorter list")
        }
        AppendAnomaly::OrderViolation { first_append, second_append } => format!(
            "order: #{first_append} was acknowledged before #{second_append} was invoked, but comes after it"
        ),
    }
}

enum FaultCommand {
    Ci(CiArgs),
    Auth(RunArgs),
    Soak(SoakArgs),
    ProveBroken(ProveArgs),
    Upgrade(UpgradeArgs),
}

/// Runs a fault-injection command on a single-threaded runtime: nodes are
/// spawned from this (main) thread, so their parent-death signal fires only
/// when the whole program goes away. Ctrl-C and SIGTERM drop the run, which
/// kills the nodes, unmounts the disks and removes the namespaces.
fn fault_run(command: FaultCommand) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    runtime.block_on(async move {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("error: cannot handle SIGTERM: {e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
        tokio::select! {
            code = fault_command(command) => code,
            _ = tokio::signal::ctrl_c() => {
                eprintln!("interrupted: cleaning up");
                ExitCode::from(130)
            }
            _ = terminate.recv() => {
                eprintln!("terminated: cleaning up");
                ExitCode::from(143)
            }
        }
    })
}

struct Prepared {
    env: runner::RunEnvironment,
    seed: u64,
}

fn prepare(args: &RunArgs) -> Result<Prepared, String> {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64 % 1_000_000_007)
            .unwrap_or(1)
    });
    let binary = match &args.cairn_binary {
        Some(b) => b.clone(),
        None => runner::cairn_binary()?,
    };
    let results = args
        .results
        .clone()
        .unwrap_or_else(|| PathBuf::from("jepsen-results").join(runner::timestamp()));
    std::fs::create_dir_all(&results)
        .map_err(|e| format!("cannot create {}: {e}", results.display()))?;
    let results = results.canonicalize().unwrap_or(results);
    let mut stale = jepsen_tests::net::cleanup_stale();
    stale.extend(jepsen_tests::memcg::cleanup_stale());
    if !stale.is_empty() {
        println!(
            "removed what an earlier run left behind: {}",
            stale.join(", ")
        );
    }
    Ok(Prepared {
        env: runner::RunEnvironment {
            binary,
            results,
            check_budget: Duration::from_secs(60),
        },
        seed,
    })
}

async fn fault_command(command: FaultCommand) -> ExitCode {
    let args = match command {
        FaultCommand::Ci(ref a) => a.run.clone(),
        FaultCommand::Auth(ref a) => a.clone(),
        FaultCommand::Soak(ref a) => a.run.clone(),
        FaultCommand::ProveBroken(ref a) => a.run.clone(),
        FaultCommand::Upgrade(upgrade) => return upgrade_command(upgrade).await,
    };
    let prepared = match prepare(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            println!("0 passed, 1 failed");
            return ExitCode::from(1);
        }
    };
    let env = std::sync::Arc::new(prepared.env);
    let seed = prepared.seed;
    let started = Instant::now();
    println!("results in {} (seed {seed})", env.results.display());
    match command {
        FaultCommand::Ci(ci) => {
            let scenarios: Vec<runner::Scenario> = runner::ci_scenarios(seed)
                .into_iter()
                .filter(|s| {
                    args.only
                        .as_ref()
                        .is_none_or(|o| s.name.contains(o.as_str()))
                })
                .map(|s| runner::Scenario {
                    recover_from_lagging: ci.recover_from_lagging,
                    ..s
                })
                .collect();
            let suite_deadline = started + Duration::from_secs(600);
            let mut results = Vec::new();
            for scenario in &scenarios {
                let left = suite_deadline.saturating_duration_since(Instant::now());
                let bound = left.min(Duration::from_secs(150));
                let result = runner::run_bounded(scenario.clone(), env.clone(), bound).await;
                runner::print_result(&result);
                results.push(result);
            }
            finish("ci", seed, &env, &results, started)
        }
        FaultCommand::Auth(_) => {
            let scenario = runner::auth_scenario(seed);
            let result = runner::run_bounded(scenario, env.clone(), Duration::from_secs(150)).await;
            runner::print_result(&result);
            finish("auth", seed, &env, &[result], started)
        }
        FaultCommand::Soak(soak) => {
            let deadline = started + Duration::from_secs(soak.minutes * 60);
            let mut results = Vec::new();
            let mut i = 0;
            while Instant::now() + Duration::from_secs(20) < deadline {
                let mut scenario = runner::soak_scenario(i, seed);
                i += 1;
                if args
                    .only
                    .as_ref()
                    .is_some_and(|o| !scenario.name.contains(o.as_str()))
                {
                    continue;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                scenario.duration = scenario
                    .duration
                    .min(left.saturating_sub(Duration::from_secs(15)));
                let bound = scenario.duration + Duration::from_secs(150);
                let result = runner::run_bounded(scenario.clone(), env.clone(), bound).await;
                runner::print_result(&result);
                let failed = matches!(result.status, runner::Status::Failed(_));
                results.push(result);
                if failed {
                    break;
                }
                if i > 10_000 {
                    break;
                }
            }
            finish("soak", seed, &env, &results, started)
        }
        FaultCommand::Upgrade(_) => unreachable!("run by upgrade_command"),
        FaultCommand::ProveBroken(prove) => {
            let modes: Vec<runner::BrokenMode> = if prove.mode.is_empty() {
                runner::BrokenMode::ALL.to_vec()
            } else {
                prove.mode.iter().map(|m| m.0).collect()
            };
            // Bounded as a whole: CI runs it after the workspace tests and `ci`.
            let deadline = started + Duration::from_secs(prove.minutes * 60);
            let mut results = Vec::new();
            let mut verdicts = Vec::new();
            for (m, mode) in modes.iter().enumerate() {
                let mut outcome = ProveOutcome::NotCaught;
                for attempt in 1..=prove.attempts.max(1) {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left < Duration::from_secs(30) {
                        outcome = ProveOutcome::OutOfTime;
                        break;
                    }
                    let scenario =
                        mode.scenario(attempt, seed.wrapping_add(m as u64 * 7919 + attempt as u64));
                    let result = runner::run_bounded(
                        scenario,
                        env.clone(),
                        left.min(Duration::from_secs(150)),
                    )
                    .await;
                    runner::print_result(&result);
                    let skipped = match &result.status {
                        runner::Status::Skipped(why) => Some(why.clone()),
                        _ => None,
                    };
                    let verdict = result.verdict;
                    results.push(result);
                    if let Some(why) = skipped {
                        outcome = ProveOutcome::Skipped(why);
                        break;
                    }
                    if verdict == Some(Verdict::Invalid) {
                        outcome = ProveOutcome::Caught(attempt);
                        break;
                    }
                }
                let (workload, nemesis) = mode.plan();
                let line = format!(
                    "--{} ({} checker, {} nemesis)",
                    mode.flags().join(" ").trim_start_matches("--"),
                    workload.name(),
                    nemesis.name()
                );
                match &outcome {
                    ProveOutcome::Caught(attempt) => {
                        println!("CAUGHT {line} at attempt {attempt}")
                    }
                    ProveOutcome::NotCaught => println!(
                        "NOT CAUGHT {line}: the broken nodes passed {} attempts",
                        prove.attempts.max(1)
                    ),
                    ProveOutcome::Skipped(why) => println!("SKIPPED {line}: {why}"),
                    ProveOutcome::OutOfTime => println!(
                        "NOT CAUGHT {line}: the {}-minute bound ran out",
                        prove.minutes
                    ),
                }
                verdicts.push(outcome);
            }
            runner::write_summary(
                &env.results,
                "prove-broken",
                seed,
                &results,
                started.elapsed(),
            );
            let caught = verdicts
                .iter()
                .filter(|v| matches!(v, ProveOutcome::Caught(_)))
                .count();
            let skipped = verdicts
                .iter()
                .filter(|v| matches!(v, ProveOutcome::Skipped(_)))
                .count();
            let not_caught = verdicts.len() - caught - skipped;
            println!("prove-broken: {caught} caught, {not_caught} not caught, {skipped} skipped");
            if not_caught > 0 {
                println!(
                    "replay with: cargo run -p jepsen-tests --release -- prove-broken --seed {seed}"
                );
                ExitCode::from(1)
            } else if skipped > 0 && runner::skip_is_failure() {
                println!("CI=true: a skipped mode is a failure");
                ExitCode::from(1)
            } else if skipped > 0 {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
    }
}

/// `jepsen-tests upgrade`: builds the earlier release (unless built already), then this build
/// (which links `target/release/cairn` again) or takes the given one (copied aside before the
/// earlier release's build), checks which is which, and runs the scenario.
async fn upgrade_command(args: UpgradeArgs) -> ExitCode {
    use jepsen_tests::upgrade::{self, release};
    let started = Instant::now();
    let fail = |why: String| {
        eprintln!("error: {why}");
        println!("upgrade: 0 passed, 1 failed");
        ExitCode::from(1)
    };
    let workspace = match runner::workspace_dir() {
        Ok(w) => w,
        Err(e) => return fail(e),
    };
    let earlier = match release::load(&workspace)
        .and_then(|releases| release::pick(&releases, args.from.as_deref()))
    {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let current_release = env!("CARGO_PKG_VERSION");
    let target = match release::target_dir() {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    // A binary given by path may be target/release/cairn, which the earlier release's build
    // links over: it is checked and kept aside first.
    let given = match &args.cairn_binary {
        Some(binary) => match release::keep_aside(binary, &target, current_release) {
            Ok(kept) => Some(kept),
            Err(e) => return fail(e),
        },
        None => None,
    };
    let built = release::build(&earlier, &workspace, &target).await;
    let built = match built {
        Ok(b) => b,
        Err(e) => return fail(e),
    };
    let build_line = match built.build_time {
        Some(took) => format!(
            "release {} (commit {}) built in {:.0} s: {}",
            earlier.version,
            earlier.short_commit(),
            took.as_secs_f64(),
            built.binary.display()
        ),
        None => format!(
            "release {} (commit {}) already built: {}",
            earlier.version,
            earlier.short_commit(),
            built.binary.display()
        ),
    };
    println!("{build_line}");
    // This build after the earlier one (both link target/release/cairn, this one last), or
    // the given one, kept aside before.
    let prepared = match prepare(&RunArgs {
        seed: args.seed,
        results: args.results.clone(),
        cairn_binary: given,
        only: None,
    }) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let checked = release::check_version(&built.binary, &earlier.version)
        .and_then(|()| release::check_version(&prepared.env.binary, current_release));
    if let Err(e) = checked {
        return fail(e);
    }
    let builds = upgrade::Builds {
        earlier: upgrade::Build {
            release: earlier.version.clone(),
            binary: built.binary.clone(),
        },
        current: upgrade::Build {
            release: current_release.to_owned(),
            binary: prepared.env.binary.clone(),
        },
    };
    let seed = prepared.seed;
    let env = std::sync::Arc::new(prepared.env);
    let ready = started.elapsed();
    println!(
        "results in {} (seed {seed}); builds ready in {:.0} s",
        env.results.display(),
        ready.as_secs_f64()
    );
    let result = upgrade::run_bounded(
        builds.clone(),
        env.clone(),
        seed,
        Duration::from_secs(args.minutes * 60),
    )
    .await;
    upgrade::print_result(&builds, &result);
    let lines = [
        build_line,
        format!("builds ready in {:.1}s", ready.as_secs_f64()),
        format!("elapsed: {:.1}s", started.elapsed().as_secs_f64()),
    ];
    upgrade::write_summary(&env.results, seed, &builds, &result, &lines);
    println!(
        "upgrade: {:.1}s, summary in {}",
        started.elapsed().as_secs_f64(),
        env.results.join("summary.txt").display()
    );
    if result.status == runner::Status::Passed {
        println!("upgrade: 1 passed, 0 failed");
        ExitCode::SUCCESS
    } else {
        println!("replay with: cargo run -p jepsen-tests --release -- upgrade --seed {seed}");
        println!("upgrade: 0 passed, 1 failed");
        ExitCode::from(1)
    }
}

/// How one broken mode fared.
enum ProveOutcome {
    /// Its checker said INVALID at this attempt.
    Caught(usize),
    NotCaught,
    Skipped(String),
    /// The run's time bound ended before it was caught.
    OutOfTime,
}

/// A `--mode` of `prove-broken`: a [`runner::BrokenMode`] by name.
#[derive(Clone, Debug)]
struct ModeArg(runner::BrokenMode);

fn parse_mode(text: &str) -> Result<ModeArg, String> {
    runner::BrokenMode::ALL
        .iter()
        .find(|m| m.name() == text)
        .map(|m| ModeArg(*m))
        .ok_or_else(|| {
            let names: Vec<&str> = runner::BrokenMode::ALL.iter().map(|m| m.name()).collect();
            format!("unknown mode {text:?}; one of {}", names.join(", "))
        })
}

fn finish(
    command: &str,
    seed: u64,
    env: &runner::RunEnvironment,
    results: &[runner::ScenarioResult],
    started: Instant,
) -> ExitCode {
    runner::write_summary(&env.results, command, seed, results, started.elapsed());
    let passed = results
        .iter()
        .filter(|r| r.status == runner::Status::Passed)
        .count();
    let skipped = results
        .iter()
        .filter(|r| matches!(r.status, runner::Status::Skipped(_)))
        .count();
    let mut failed = results
        .iter()
        .filter(|r| matches!(r.status, runner::Status::Failed(_)))
        .count();
    if skipped > 0 && runner::skip_is_failure() {
        println!("CI=true: {skipped} skipped scenarios count as failed");
        failed += skipped;
    }
    println!(
        "{command}: {:.1}s, summary in {}",
        started.elapsed().as_secs_f64(),
        env.results.join("summary.txt").display()
    );
    if failed > 0 {
        println!("replay with: cargo run -p jepsen-tests --release -- {command} --seed {seed}");
    }
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
