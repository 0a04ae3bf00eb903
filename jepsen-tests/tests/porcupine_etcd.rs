//! Reproduces every verdict of `testdata/porcupine-etcd/VERDICTS`: sixty Jepsen
//! histories of an etcd compare-and-set register, published with the Porcupine
//! checker (MIT licence, see the README there).

use std::path::PathBuf;
use std::time::Duration;

use jepsen_tests::history::Format;
use jepsen_tests::linearizability::{CheckOptions, KeyOutcome};
use jepsen_tests::models::{self, ModelKind};
use jepsen_tests::{History, Verdict};

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/porcupine-etcd")
}

#[test]
fn every_porcupine_etcd_verdict_is_reproduced() {
    // Checks all sixty histories against the register model and compares with VERDICTS.
    let verdicts = std::fs::read_to_string(testdata().join("VERDICTS")).unwrap();
    let options = CheckOptions {
        time_budget: Duration::from_secs(120),
        ..CheckOptions::default()
    };
    let mut checked = 0;
    let mut mismatches = Vec::new();
    for line in verdicts.lines().filter(|line| !line.trim().is_empty()) {
        let (file, expected) = line.split_once(' ').unwrap();
        let expected = match expected.trim() {
            "linearizable" => Verdict::Valid,
            "not-linearizable" => Verdict::Invalid,
            other => panic!("unknown verdict {other:?} in VERDICTS"),
        };
        let (history, format) = History::load(&testdata().join(file), None).unwrap();
        assert_eq!(format, Format::JepsenLog, "{file}");
        let report = models::check(&history, ModelKind::Register, &options).unwrap();
        if report.verdict != expected {
            mismatches.push(format!(
                "{file}: expected {expected:?}, got {:?}",
                report.verdict
            ));
        }
        // A failure names an operation of the history that is in its own illegal prefix.
        for (_, prefix) in report.failures() {
            assert!(prefix.failing_operation < history.len(), "{file}");
            assert!(
                prefix.prefix_operations.contains(&prefix.failing_operation),
                "{file}"
            );
            assert!(
                prefix.linearized_count < prefix.prefix_operations.len(),
                "{file}"
            );
        }
        if expected == Verdict::Valid {
            assert!(
                report
                    .keys
                    .iter()
                    .all(|key| key.outcome == KeyOutcome::Linearizable),
                "{file}"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 60);
    assert!(
        mismatches.is_empty(),
        "verdicts not reproduced:\n{}",
        mismatches.join("\n")
    );
}

#[test]
fn jepsen_log_and_its_jsonl_form_give_the_same_verdict() {
    // Converting a Jepsen log to the project's JSONL keeps every operation and the verdict.
    for (file, expected) in [
        ("etcd_000.log", Verdict::Invalid),
        ("etcd_002.log", Verdict::Valid),
    ] {
        let (history, _) = History::load(&testdata().join(file), None).unwrap();
        let mut jsonl = Vec::new();
        history.write_jsonl(&mut jsonl).unwrap();
        let (reloaded, format) =
            History::parse(std::str::from_utf8(&jsonl).unwrap(), None).unwrap();
        assert_eq!(format, Format::Jsonl);
        assert_eq!(reloaded, history);
        let report =
            models::check(&reloaded, ModelKind::KeyValue, &CheckOptions::default()).unwrap();
        assert_eq!(report.verdict, expected, "{file}");
    }
}
