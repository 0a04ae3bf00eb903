//! The lifecycle checker: three named checks over a lifecycle run's history and its
//! `lifecycle.jsonl` records ([`super::Record`]), each with the anomalies it found.
//!
//! 1. **status writes never conflict** ([`CHECK_STATUS`]): a `status` operation (always
//!    version "") that failed with CasFailure or WrongUid is a violation: a status write
//!    without a version must never lose to a data write. NotFound (the lifetime was removed)
//!    is not one; other refusals are counted.
//! 2. **no removal while a finalizer remained** ([`CHECK_FINALIZERS`]): every lifetime (a uid)
//!    is created with a finalizer, and only a `finalize` write (which removes it from a marked
//!    lifetime) may remove it. A lifetime is *seen removed* at the earliest of:
//!    - the receipt of a Delete of its uid on a raw (unfiltered) watch;
//!    - the completion of a `status` write to its uid that failed NotFound (the uid came
//!      from a read, so the lifetime existed);
//!    - the completion of a strong `read` of its key, invoked after the lifetime was *known
//!      stored* (its create acknowledged, a read showing it, or a watch Upsert of it
//!      received, all completed before the read was invoked), that returned nothing or
//!      another uid (uids are never reused, so it was removed meanwhile).
//!
//!    Each is later than the removal itself. A removal happens only after the write that
//!    caused it was invoked, so the lifetime must have a `finalize` attempt that was not a
//!    certain failure (`ok`, `info` or never completed: indeterminate outcomes count as
//!    attempts) invoked no later than it was seen removed; otherwise it was removed while its
//!    finalizer remained (a delete that removed instead of marking, a collection, a lost
//!    mark).
//! 3. **the selector cache equals the selector List** ([`CHECK_CACHE`]): at every progress
//!    point compared, the watch cache of [`super::SELECTOR`] held exactly what the strong List
//!    of that selector returned at the cache's revision (name, uid, version and label). A
//!    List that failed (Compacted, no quorum) leaves that point unchecked, counted.
//!
//! The verdict is invalid when any check found an anomaly, else valid; [`shortfall`] says
//! whether the run did too little to have tested these.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::history::{History, OpKind, Outcome, Value};
use crate::Verdict;

use super::{Entry, Record};

pub const CHECK_STATUS: &str = "1 status writes never conflict";
pub const CHECK_FINALIZERS: &str = "2 no removal while a finalizer remained";
pub const CHECK_CACHE: &str = "3 the selector cache equals the selector List";

/// What one check found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Finding {
    /// Counts, one line each.
    pub summary: Vec<String>,
    /// Violations, one message each.
    pub anomalies: Vec<String>,
}

/// What the run did, for [`shortfall`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub status_acknowledged: usize,
    pub deletes_marked: usize,
    pub finalizations_acknowledged: usize,
    pub removals_seen: usize,
    pub comparisons: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub verdict: Verdict,
    pub checks: Vec<(&'static str, Finding)>,
    pub counts: Counts,
}

fn secs(ns: u64) -> String {
    format!("{:.3} s", ns as f64 / 1e9)
}

fn short(uid: &str) -> &str {
    uid.get(..8).unwrap_or(uid)
}

fn str_at(value: &Value, index: usize) -> Option<&str> {
    match value.as_list()?.get(index)? {
        Value::Str(s) => Some(s),
        _ => None,
    }
}

fn int_at(value: &Value, index: usize) -> Option<i64> {
    match value.as_list()?.get(index)? {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

/// Checks a lifecycle run.
pub fn check(history: &History, records: &[Record]) -> Report {
    let (status, status_acknowledged) = check_status(history);
    let (finalizers, lifetime_counts) = check_finalizers(history, records);
    let (cache, comparisons) = check_cache(records);
    let checks = vec![
        (CHECK_STATUS, status),
        (CHECK_FINALIZERS, finalizers),
        (CHECK_CACHE, cache),
    ];
    let verdict = if checks.iter().any(|(_, f)| !f.anomalies.is_empty()) {
        Verdict::Invalid
    } else {
        Verdict::Valid
    };
    Report {
        verdict,
        checks,
        counts: Counts {
            status_acknowledged,
            comparisons,
            ..lifetime_counts
        },
    }
}

/// Check 1; and how many status writes were acknowledged.
fn check_status(history: &History) -> (Finding, usize) {
    let mut finding = Finding::default();
    let (mut ok, mut not_found, mut indeterminate, mut other) = (0, 0, 0, 0);
    for (index, op) in history.operations().iter().enumerate() {
        if op.op != OpKind::Status {
            continue;
        }
        if op.is_indeterminate() {
            indeterminate += 1;
            continue;
        }
        if op.outcome == Outcome::Ok {
            ok += 1;
            continue;
        }
        let why = match &op.output {
            Value::Str(s) => s.as_str(),
            _ => "",
        };
        if why == "not-found" {
            not_found += 1;
        } else if why.starts_with("cas-failure") || why.starts_with("wrong-uid") {
            finding.anomalies.push(format!(
                "#{index} process {} status write {:?} of {} (uid {}) with version \"\" was \
                 refused by a conflict ({why}) at {}: a status write without a version must \
                 never conflict with a data write",
                op.process,
                str_at(&op.input, 1).unwrap_or(""),
                op.key,
                str_at(&op.input, 0).unwrap_or(""),
                secs(op.complete_ns.unwrap_or(op.invoke_ns)),
            ));
        } else {
            other += 1;
        }
    }
    finding.summary.push(format!(
        "{ok} status writes acknowledged, {not_found} NotFound (lifetime removed), {} refused \
         by a conflict, {other} failed otherwise, {indeterminate} indeterminate",
        finding.anomalies.len()
    ));
    (finding, ok)
}

/// One lifetime, as the history and the watches show it.
#[derive(Default)]
struct Lifetime {
    key: String,
    /// The earliest time it was certainly stored.
    known_ns: Option<u64>,
    /// Invocations of `finalize` writes that may have applied.
    attempts: Vec<u64>,
    /// Finalize writes that certainly failed.
    failed_attempts: usize,
    /// The earliest time it was seen removed, and how.
    seen_removed: Option<(u64, String)>,
    /// Its deletes: (operation index, outcome, answered marked).
    deletes: Vec<(usize, Outcome, Option<bool>)>,
}

impl Lifetime {
    fn known(&mut self, at: u64) {
        self.known_ns = Some(self.known_ns.map_or(at, |k| k.min(at)));
    }

    fn removed(&mut self, at: u64, how: impl FnOnce() -> String) {
        if self.seen_removed.as_ref().is_none_or(|(t, _)| at < *t) {
            self.seen_removed = Some((at, how()));
        }
    }
}

/// Check 2; and the counts of deletes, finalizations and removals seen.
fn check_finalizers(history: &History, records: &[Record]) -> (Finding, Counts) {
    let mut lifetimes: BTreeMap<String, Lifetime> = BTreeMap::new();
    let ops = history.operations();
    let mut counts = Counts::default();
    let (mut deletes_unmarked, mut finalize_indeterminate) = (0, 0);
    // Pass 1: what each lifetime is, when it was known stored, its finalize attempts.
    for (index, op) in ops.iter().enumerate() {
        let uid = match op.op {
            OpKind::Write | OpKind::Delete | OpKind::Finalize | OpKind::Status => {
                str_at(&op.input, 0)
            }
            OpKind::Read if op.outcome == Outcome::Ok => str_at(&op.output, 0),
            _ => None,
        };
        let Some(uid) = uid.filter(|u| !u.is_empty()) else {
            continue;
        };
        let lifetime = lifetimes.entry(uid.to_owned()).or_default();
        lifetime.key.clone_from(&op.key);
        match op.op {
            OpKind::Read => lifetime.known(op.complete_ns.unwrap_or(u64::MAX)),
            OpKind::Write if op.outcome == Outcome::Ok && op.complete_ns.is_some() => {
                lifetime.known(op.complete_ns.unwrap_or(u64::MAX));
            }
            OpKind::Finalize if op.is_indeterminate() || op.outcome == Outcome::Ok => {
                lifetime.attempts.push(op.invoke_ns);
                if op.outcome == Outcome::Ok && !op.is_indeterminate() {
                    counts.finalizations_acknowledged += 1;
                } else {
                    finalize_indeterminate += 1;
                }
            }
            OpKind::Finalize => lifetime.failed_attempts += 1,
            OpKind::Delete => {
                let marked = (op.outcome == Outcome::Ok && !op.is_indeterminate())
                    .then(|| int_at(&op.output, 1) == Some(1));
                match marked {
                    Some(true) => counts.deletes_marked += 1,
                    Some(false) => deletes_unmarked += 1,
                    None => {}
                }
                lifetime.deletes.push((index, op.outcome, marked));
            }
            _ => {}
        }
    }
    for record in records {
        if let Record::Event {
            at_ns,
            delete: false,
            uid,
            name,
            ..
        } = record
        {
            let lifetime = lifetimes.entry(uid.clone()).or_default();
            lifetime.key.clone_from(name);
            lifetime.known(*at_ns);
        }
    }
    // Pass 2: when each was seen removed.
    for record in records {
        if let Record::Event {
            node,
            at_ns,
            revision,
            delete: true,
            uid,
            name,
            finalizers,
            ..
        } = record
        {
            let lifetime = lifetimes.entry(uid.clone()).or_default();
            lifetime.key.clone_from(name);
            lifetime.removed(*at_ns, || {
                format!(
                    "a Delete at revision {revision} on node {node}'s watch (last stored with \
                     finalizers {finalizers:?})"
                )
            });
        }
    }
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (uid, lifetime) in &lifetimes {
        by_key
            .entry(lifetime.key.clone())
            .or_default()
            .push(uid.clone());
    }
    for (index, op) in ops.iter().enumerate() {
        let Some(complete_ns) = op.complete_ns else {
            continue;
        };
        match op.op {
            OpKind::Status if op.outcome == Outcome::Fail => {
                let not_found = matches!(&op.output, Value::Str(s) if s == "not-found");
                if let (true, Some(uid)) = (not_found, str_at(&op.input, 0)) {
                    if let Some(lifetime) = lifetimes.get_mut(uid) {
                        lifetime.removed(complete_ns, || {
                            format!("status write #{index} answered NotFound")
                        });
                    }
                }
            }
            OpKind::Read if op.outcome == Outcome::Ok => {
                let read_uid = str_at(&op.output, 0).unwrap_or("");
                for uid in by_key.get(&op.key).into_iter().flatten() {
                    if uid == read_uid {
                        continue;
                    }
                    let Some(lifetime) = lifetimes.get_mut(uid) else {
                        continue;
                    };
                    if lifetime.known_ns.is_some_and(|k| k < op.invoke_ns) {
                        lifetime.removed(complete_ns, || {
                            let found = if read_uid.is_empty() {
                                "nothing".to_owned()
                            } else {
                                format!("uid {}", short(read_uid))
                            };
                            format!(
                                "read #{index} (invoked at {}) found {found}",
                                secs(op.invoke_ns)
                            )
                        });
                    }
                }
            }
            _ => {}
        }
    }
    let mut finding = Finding::default();
    for (uid, lifetime) in &lifetimes {
        let Some((seen_ns, how)) = &lifetime.seen_removed else {
            continue;
        };
        counts.removals_seen += 1;
        let first_attempt = lifetime.attempts.iter().min().copied();
        if first_attempt.is_some_and(|a| a <= *seen_ns) {
            continue;
        }
        let mut message = format!(
            "lifetime {uid} of {} was seen removed at {} ({how}), but no write removing its \
             last finalizer had been attempted by then",
            lifetime.key,
            secs(*seen_ns)
        );
        match first_attempt {
            Some(a) => {
                let _ = write!(message, " (the first was invoked at {})", secs(a));
            }
            None => message.push_str(" (none ever was)"),
        }
        if lifetime.failed_attempts > 0 {
            let _ = write!(
                message,
                "; {} finalize writes of it certainly failed",
                lifetime.failed_attempts
            );
        }
        let deletes: Vec<String> = lifetime
            .deletes
            .iter()
            .map(|(i, outcome, marked)| match marked {
                Some(marked) => format!("#{i} ok marked={marked}"),
                None => format!("#{i} {outcome}"),
            })
            .collect();
        if !deletes.is_empty() {
            let _ = write!(message, "; its deletes: {}", deletes.join(", "));
        }
        finding.anomalies.push(message);
    }
    finding.summary.push(format!(
        "{} lifetimes, {} seen removed; {} finalizations acknowledged, {finalize_indeterminate} \
         indeterminate; {} deletes answered marked, {deletes_unmarked} answered not marked",
        lifetimes.len(),
        counts.removals_seen,
        counts.finalizations_acknowledged,
        counts.deletes_marked
    ));
    (finding, counts)
}

fn entries(list: &[&Entry]) -> String {
    let shown: Vec<String> = list
        .iter()
        .take(8)
        .map(|e| format!("{}/{}@{} app={}", e.name, short(&e.uid), e.version, e.app))
        .collect();
    let more = list.len().saturating_sub(shown.len());
    if more > 0 {
        format!("[{} and {more} more]", shown.join(", "))
    } else {
        format!("[{}]", shown.join(", "))
    }
}

/// Check 3; and how many progress points were compared.
fn check_cache(records: &[Record]) -> (Finding, usize) {
    let mut finding = Finding::default();
    let (mut compared, mut unlisted, mut progress_failed) = (0, 0, 0);
    let mut sizes = 0;
    for record in records {
        match record {
            Record::Compare {
                cache,
                at_ns,
                revision,
                cached,
                listed: Some(listed),
                ..
            } => {
                compared += 1;
                sizes += cached.len();
                if cached != listed {
                    let only_cached: Vec<&Entry> =
                        cached.iter().filter(|e| !listed.contains(e)).collect();
                    let only_listed: Vec<&Entry> =
                        listed.iter().filter(|e| !cached.contains(e)).collect();
                    finding.anomalies.push(format!(
                        "cache {cache} at revision {revision} (compared at {}) differs from the \
                         strong List of {:?} at that revision: only in the cache {}, only in the \
                         List {}",
                        secs(*at_ns),
                        super::SELECTOR,
                        entries(&only_cached),
                        entries(&only_listed)
                    ));
                }
            }
            Record::Compare { listed: None, .. } => unlisted += 1,
            Record::ProgressFailed { .. } => progress_failed += 1,
            Record::Event { .. } | Record::Watch { .. } => {}
        }
    }
    finding.summary.push(format!(
        "{compared} progress points compared ({:.1} resources cached on average), {unlisted} \
         left unchecked (the List failed), {progress_failed} progress points not reached",
        if compared > 0 {
            sizes as f64 / compared as f64
        } else {
            0.0
        }
    ));
    (finding, compared)
}

/// Why a run did too little to have tested the lifecycle, if it did: fewer than 20 status
/// writes acknowledged, 3 deletes answered marked, 3 finalizations acknowledged or 3
/// progress points compared.
pub fn shortfall(counts: &Counts) -> Option<String> {
    let mut short = Vec::new();
    let mut need = |what: &str, got: usize, least: usize| {
        if got < least {
            short.push(format!("{got} {what} (at least {least} required)"));
        }
    };
    need("status writes acknowledged", counts.status_acknowledged, 20);
    need("deletes answered marked", counts.deletes_marked, 3);
    need(
        "finalizations acknowledged",
        counts.finalizations_acknowledged,
        3,
    );
    need("progress points compared", counts.comparisons, 3);
    (!short.is_empty()).then(|| format!("too little lifecycle to count: {}", short.join(", ")))
}

/// The report as text (`check.txt`, and `check --model lifecycle`).
pub fn describe(report: &Report, shown_max: usize) -> String {
    crate::findings::describe_checks(
        &format!("lifecycle checker: {:?}", report.verdict),
        "check ",
        report
            .checks
            .iter()
            .map(|(name, f)| crate::findings::CheckText {
                name,
                summary: &f.summary,
                anomalies: &f.anomalies,
            }),
        shown_max,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Operation, Recorder};

    fn op(
        process: u64,
        kind: OpKind,
        key: &str,
        input: Value,
        output: Value,
        outcome: Outcome,
        at: (u64, Option<u64>),
    ) -> Operation {
        Operation {
            process,
            op: kind,
            key: key.into(),
            input,
            output,
            outcome,
            invoke_ns: at.0,
            complete_ns: at.1,
        }
    }

    fn s(v: &str) -> Value {
        Value::Str(v.into())
    }

    fn list(items: Vec<Value>) -> Value {
        Value::List(items)
    }

    /// A lifetime `u1` of `lc00` created at 0..10, read at 20..30, deleted (marked) at
    /// 40..50; then the finalize write `finalize` (if any) invoked at 60; then a read at
    /// 100..110 finding nothing.
    fn history(finalize: Option<Outcome>) -> History {
        let mut ops = vec![
            op(
                0,
                OpKind::Write,
                "lc00",
                list(vec![s("u1"), s(""), Value::Int(1), s("web")]),
                s("5"),
                Outcome::Ok,
                (0, Some(10)),
            ),
            op(
                0,
                OpKind::Read,
                "lc00",
                Value::Null,
                list(vec![
                    s("u1"),
                    s("5"),
                    s("web"),
                    Value::Int(0),
                    s("jepsen.io/keep"),
                ]),
                Outcome::Ok,
                (20, Some(30)),
            ),
            op(
                5,
                OpKind::Delete,
                "lc00",
                list(vec![s("u1"), s("5")]),
                list(vec![Value::Int(7), Value::Int(1)]),
                Outcome::Ok,
                (40, Some(50)),
            ),
            op(
                0,
                OpKind::Read,
                "lc00",
                Value::Null,
                Value::Null,
                Outcome::Ok,
                (100, Some(110)),
            ),
        ];
        if let Some(outcome) = finalize {
            let complete = (outcome != Outcome::Info).then_some(70);
            ops.push(op(
                6,
                OpKind::Finalize,
                "lc00",
                list(vec![s("u1"), s("7")]),
                Value::Null,
                outcome,
                (60, complete),
            ));
        }
        ops.sort_by_key(|o| o.invoke_ns);
        History::new(ops).expect("a valid history")
    }

    fn anomalies(report: &Report, check: &str) -> Vec<String> {
        report
            .checks
            .iter()
            .find(|(name, _)| *name == check)
            .map(|(_, f)| f.anomalies.clone())
            .expect("the check")
    }

    #[test]
    fn a_removal_after_an_attempted_finalization_is_fine_whatever_its_outcome() {
        for outcome in [Outcome::Ok, Outcome::Info] {
            let report = check(&history(Some(outcome)), &[]);
            assert_eq!(report.verdict, Verdict::Valid, "{outcome}: {report:?}");
            assert_eq!(report.counts.removals_seen, 1);
        }
    }

    #[test]
    fn a_removal_without_a_finalization_or_after_a_failed_one_is_caught() {
        for finalize in [None, Some(Outcome::Fail)] {
            let report = check(&history(finalize), &[]);
            assert_eq!(report.verdict, Verdict::Invalid);
            let found = anomalies(&report, CHECK_FINALIZERS);
            assert_eq!(found.len(), 1, "{found:?}");
            assert!(found[0].contains("lifetime u1 of lc00"), "{}", found[0]);
            assert!(found[0].contains("read #"), "{}", found[0]);
        }
    }

    #[test]
    fn a_watch_delete_before_the_finalization_was_invoked_is_caught() {
        let delete = Record::Event {
            node: 1,
            at_ns: 55,
            revision: 8,
            delete: true,
            name: "lc00".into(),
            uid: "u1".into(),
            version: "7".into(),
            app: "web".into(),
            finalizers: "jepsen.io/keep".into(),
            marked: false,
        };
        let report = check(&history(Some(Outcome::Ok)), &[delete]);
        let found = anomalies(&report, CHECK_FINALIZERS);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("a Delete at revision 8"), "{}", found[0]);
        assert!(found[0].contains("invoked at"), "{}", found[0]);
    }

    #[test]
    fn a_read_concurrent_with_the_create_proves_nothing() {
        // The read is invoked before the create completed: it may precede it.
        let recorder = Recorder::new();
        let create = recorder.invoke(
            0,
            OpKind::Write,
            "lc00",
            list(vec![s("u1"), s(""), Value::Int(1), s("web")]),
        );
        let read = recorder.invoke(1, OpKind::Read, "lc00", Value::Null);
        create.ok(s("5"));
        read.ok(Value::Null);
        let report = check(&recorder.history(), &[]);
        assert_eq!(report.verdict, Verdict::Valid, "{report:?}");
        assert_eq!(report.counts.removals_seen, 0);
    }

    #[test]
    fn a_conflicting_status_write_is_caught_and_not_found_is_not() {
        let recorder = Recorder::new();
        let input = list(vec![s("u1"), s("p3"), Value::Int(1)]);
        recorder
            .invoke(3, OpKind::Status, "lc00", input.clone())
            .complete(Outcome::Fail, s("not-found"));
        let report = check(&recorder.history(), &[]);
        assert!(anomalies(&report, CHECK_STATUS).is_empty());
        recorder
            .invoke(3, OpKind::Status, "lc00", input)
            .complete(Outcome::Fail, s("cas-failure: expected \"\", stored 9"));
        let report = check(&recorder.history(), &[]);
        let found = anomalies(&report, CHECK_STATUS);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("cas-failure"), "{}", found[0]);
        assert_eq!(report.verdict, Verdict::Invalid);
    }

    #[test]
    fn a_cache_that_differs_from_the_list_is_caught() {
        let entry = |uid: &str, version: &str| Entry {
            name: "lc00".into(),
            uid: uid.into(),
            version: version.into(),
            app: "web".into(),
        };
        let compare = |cached: Vec<Entry>, listed: Vec<Entry>| Record::Compare {
            cache: 0,
            invoke_ns: 1,
            at_ns: 2,
            revision: 9,
            cached,
            listed: Some(listed),
            error: None,
        };
        let history = History::new(vec![]).expect("empty");
        let same = compare(vec![entry("u1", "9")], vec![entry("u1", "9")]);
        let report = check(&history, &[same]);
        assert_eq!(report.verdict, Verdict::Valid);
        assert_eq!(report.counts.comparisons, 1);
        let stale = compare(vec![entry("u1", "8")], vec![entry("u1", "9")]);
        let report = check(&history, &[stale]);
        let found = anomalies(&report, CHECK_CACHE);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("only in the cache [lc00/u1@8"),
            "{}",
            found[0]
        );
    }

    #[test]
    fn a_run_without_finalizations_falls_short() {
        let why = shortfall(&Counts::default()).expect("nothing done");
        assert!(why.contains("finalizations acknowledged"), "{why}");
        let enough = Counts {
            status_acknowledged: 20,
            deletes_marked: 3,
            finalizations_acknowledged: 3,
            removals_seen: 3,
            comparisons: 3,
        };
        assert_eq!(shortfall(&enough), None);
    }
}
