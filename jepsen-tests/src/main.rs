//! `jepsen-tests`: command-line entry point.
//!
//! `jepsen-tests check --model register|kv|set|append FILE` checks a recorded
//! history (project JSONL or Jepsen log, detected automatically) and exits with
//! 0 = valid (linearizable), 1 = invalid, 2 = unknown within the time budget,
//! 3 = the command or the file could not be used.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use jepsen_tests::append::{self, AppendAnomaly};
use jepsen_tests::history::Format;
use jepsen_tests::linearizability::{
    CheckOptions, KeyOutcome, LinearizabilityReport, UnknownReason,
};
use jepsen_tests::models::{self, ModelKind};
use jepsen_tests::set::{self, SetAnomaly};
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
            for key in &report.keys {
                say!(
                out,
                    "key {:?}: {} (final read {}, {} acknowledged, {} indeterminate of which {} present, {} failed, {} unverified)",
                    key.key,
                    verdict_word(key.verdict, false),
                    key.final_read.map_or_else(|| "none".to_owned(), |index| format!("#{index}")),
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
            }
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
            add,
            final_read,
        } => {
            format!("lost: {element} acknowledged by #{add} before final read #{final_read}, missing from it")
        }
        SetAnomaly::NeverAttempted { element, read } => {
            format!("never attempted: {element} in read #{read}")
        }
        SetAnomaly::FailedButPresent { element, read, add } => {
            format!("failed but present: {element} in read #{read}, its add #{add} failed")
        }
        SetAnomaly::Duplicated { element, read } => {
            format!("duplicated: {element} twice in read #{read}")
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
