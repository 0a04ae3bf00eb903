//! Runs the `jepsen-tests check` binary on one history of each verdict and checks
//! its exit codes (0 valid, 1 invalid, 2 unknown, 3 unusable input) and output.

use std::path::PathBuf;
use std::process::{Command, Output};

fn testdata(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(relative)
}

fn check(args: &[&str]) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(env!("CARGO_BIN_EXE_jepsen-tests"))
        .arg("check")
        .args(args)
        .output()
        .expect("the binary runs");
    (
        status.code().expect("exited normally"),
        String::from_utf8(stdout).unwrap(),
        String::from_utf8(stderr).unwrap(),
    )
}

fn path(relative: &str) -> String {
    testdata(relative).to_str().unwrap().to_owned()
}

#[test]
fn linearizable_jepsen_log_exits_zero() {
    // etcd_002 is linearizable per VERDICTS.
    let (code, stdout, _) = check(&["--model", "register", &path("porcupine-etcd/etcd_002.log")]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("jepsen-log"), "{stdout}");
    assert!(stdout.contains("verdict: LINEARIZABLE"), "{stdout}");
}

#[test]
fn jepsen_logs_padded_with_spaces_and_edn_histories_are_checked_not_refused() {
    // etcd_002 (linearizable) rewritten with space-padded columns and a
    // timestamp, and as history.edn operation maps: both get etcd_002's verdict.
    for file in [
        "examples/etcd_002-padded.log",
        "examples/etcd_002-history.edn",
    ] {
        let (code, stdout, stderr) = check(&["--model", "register", &path(file)]);
        assert_eq!(code, 0, "{file}: {stdout}{stderr}");
        assert!(stdout.contains("jepsen-log"), "{stdout}");
        assert!(stdout.contains("verdict: LINEARIZABLE"), "{stdout}");
    }
}

#[test]
fn non_linearizable_jepsen_log_exits_one_and_prints_the_illegal_prefix() {
    // etcd_000 is not linearizable: the key, the failing operation and the prefix are printed.
    let (code, stdout, _) = check(&["--model", "register", &path("porcupine-etcd/etcd_000.log")]);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("verdict: NOT LINEARIZABLE"), "{stdout}");
    assert!(stdout.contains("key \"\": NOT LINEARIZABLE"), "{stdout}");
    assert!(stdout.contains("cannot be linearized"), "{stdout}");
    assert!(stdout.contains("shortest illegal prefix"), "{stdout}");
}

#[test]
fn undecidable_history_within_the_budget_exits_two() {
    // 60 concurrent writes then an impossible read: too many orders to rule out in 1 s.
    let (code, stdout, _) = check(&[
        "--model",
        "register",
        "--time-budget-secs",
        "1",
        &path("examples/register-hard-unknown.jsonl"),
    ]);
    assert_eq!(code, 2, "{stdout}");
    assert!(stdout.contains("time budget exhausted"), "{stdout}");
    assert!(stdout.contains("verdict: UNKNOWN"), "{stdout}");
}

#[test]
fn kv_model_reads_jsonl_and_reports_each_verdict() {
    // The kv model accepts a valid JSONL history (with a delete) and rejects a stale read.
    let (code, stdout, _) = check(&["--model", "kv", &path("examples/kv-valid.jsonl")]);
    assert_eq!(code, 0, "{stdout}");
    assert!(
        stdout.contains("(jsonl, 7 operations, keys: 2)"),
        "{stdout}"
    );
    let (code, stdout, _) = check(&[
        "--model",
        "kv",
        "--all-keys",
        &path("examples/kv-stale-read.jsonl"),
    ]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("operation #7 cannot be linearized"),
        "{stdout}"
    );
    assert!(stdout.contains("1 of 2 keys linearizable"), "{stdout}");
}

#[test]
fn set_and_append_checkers_report_their_verdicts() {
    // The set example loses an acknowledged add; the append example is valid.
    let (code, stdout, _) = check(&["--model", "set", &path("examples/set-lost.jsonl")]);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("lost: 2 known from #1"), "{stdout}");
    let (code, stdout, _) = check(&["--model", "append", &path("examples/append-valid.jsonl")]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("verdict: VALID"), "{stdout}");
}

#[test]
fn unusable_input_exits_three_not_a_verdict() {
    // A missing file, a bad flag, or operations the model cannot interpret are errors.
    let (code, _, stderr) = check(&["--model", "register", &path("no-such-file.jsonl")]);
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("cannot open"), "{stderr}");
    let (code, _, _) = check(&["--model", "paxos", &path("examples/kv-valid.jsonl")]);
    assert_eq!(code, 3);
    let (code, _, stderr) = check(&["--model", "register", &path("examples/set-lost.jsonl")]);
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("does not support add"), "{stderr}");
}
