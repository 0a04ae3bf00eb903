//! The set checker for histories with online restores (`restore` operations,
//! see [`crate::history`]).
//!
//! The model: one set per key; `add` puts its element in at one point between
//! its invocation and its completion (or at any point after its invocation, or
//! never, when its outcome is unknown); a restore replaces *every* key's set by
//! the backup's at one point of its window; a read returns the set at one point
//! of its own window. A restore's window runs from its invocation to its
//! completion (`ok`), or to the time the nemesis settled it (`info`: after that
//! it can no longer take effect); a `fail` restore changes nothing. Restores
//! that may take effect must not overlap (the nemesis runs one at a time, each
//! settled before the next); a history where they do is refused as unusable.
//!
//! Checked, for a given choice of which unknown restores took effect: each read
//! must be explained by one *state*: the initial (empty) set, or the set left by
//! one restore that may precede it (its window starts before the read ends),
//! provided the next one may follow it (its window ends after the read starts).
//! In the state left by restore `R` (window `[a, b]`) a read must list
//! - every element of `R`'s backup;
//! - every element *known* since `R`: acknowledged by an add invoked after `b`,
//!   or listed by a read invoked after `b`, that completed before the read began;
//!
//! and may list nothing else but elements some add could have put in after `R`'s
//! point: an add invoked before the read ended that was unknown or completed at
//! or after `a`. So an element acknowledged before a restore and not in its
//! backup never reappears after it, and a read concurrent with a restore sees
//! the state before it or the state after it, never a mix of both.
//!
//! Every choice of the unknown restores' outcomes is tried (one choice for all
//! keys: a restore replaces every key at once); the history is valid if one
//! choice explains every read. With more than [`RESTORE_UNKNOWN_MAX`] unknown
//! restores the verdict is unknown.
//!
//! What it cannot see: which point of its window a read or a restore took
//! (each read is explained on its own, so two reads may assume different
//! points of one restore); an element added concurrently with a restore may be
//! either kept or wiped; a restore that restored what the set already held.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{attempts_report, KeyOperations, Read, RestoreFate, SetAnomaly, SetReport};
use crate::history::{Operation, Outcome, Value};
use crate::{Error, Verdict};

/// Unknown restores tried both ways at most (2^N choices); more: verdict unknown.
pub const RESTORE_UNKNOWN_MAX: usize = 12;

/// Elements named per list of a [`StateMismatch`].
const LISTED_MAX: usize = 5;

/// Why a read is not the state it was compared with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateMismatch {
    /// The state tried: the one left by this restore (history index), or `None`:
    /// the initial, empty set and the adds since.
    pub after_restore: Option<usize>,
    /// Elements of that restore's backup the read misses (the first few).
    pub missing_from_backup: Vec<Value>,
    /// Elements known since that restore that the read misses, with the
    /// operation that made each known (the first few).
    pub missing_known: Vec<(Value, usize)>,
    /// Elements the read lists that this state cannot hold (the first few).
    pub unexpected: Vec<Value>,
    /// How many elements in all are missing or unexpected.
    pub mismatched_elements: usize,
}

/// `after restore #7: misses backup elements [3 4], misses [9 (known from #12)], lists [5]`.
impl std::fmt::Display for StateMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.after_restore {
            Some(restore) => write!(f, "after restore #{restore}:")?,
            None => write!(f, "before any restore:")?,
        }
        if !self.missing_from_backup.is_empty() {
            write!(
                f,
                " misses backup elements {}",
                Value::List(self.missing_from_backup.clone())
            )?;
        }
        if !self.missing_known.is_empty() {
            let known: Vec<String> = self
                .missing_known
                .iter()
                .map(|(element, by)| format!("{element} (known from #{by})"))
                .collect();
            write!(f, " misses [{}]", known.join(" "))?;
        }
        if !self.unexpected.is_empty() {
            write!(
                f,
                " lists {} it cannot hold",
                Value::List(self.unexpected.clone())
            )?;
        }
        write!(f, " ({} elements in all)", self.mismatched_elements)
    }
}

/// One restore of the history.
pub(super) struct Restore<'h> {
    index: usize,
    outcome: Outcome,
    invoke_ns: u64,
    /// The end of its window: completion (`ok`) or settling (`info`);
    /// `u64::MAX` when it never completed.
    end_ns: u64,
    /// The backup, by key.
    backup: HashMap<&'h str, HashSet<&'h Value>>,
}

impl<'h> Restore<'h> {
    /// Reads a `restore` operation: input `[[key, [elements...]], ...]`.
    pub(super) fn parse(index: usize, operation: &'h Operation) -> Result<Restore<'h>, Error> {
        let invalid = |reason: String| Error::InvalidOperation { index, reason };
        let pairs = operation.input.as_list().ok_or_else(|| {
            invalid(format!(
                "a restore's input must be a list of [key, [elements]], got {}",
                operation.input
            ))
        })?;
        let mut backup: HashMap<&'h str, HashSet<&'h Value>> = HashMap::new();
        for pair in pairs {
            let entry = match pair {
                Value::List(items) => match items.as_slice() {
                    [Value::Str(key), elements] => elements.as_list().map(|e| (key, e)),
                    _ => None,
                },
                _ => None,
            };
            let (key, elements) = entry.ok_or_else(|| {
                invalid(format!(
                    "a backup entry must be [key, [elements]], got {pair}"
                ))
            })?;
            if backup
                .insert(key.as_str(), elements.iter().collect())
                .is_some()
            {
                return Err(invalid(format!("the backup names key {key:?} twice")));
            }
        }
        let indeterminate = operation.is_indeterminate();
        Ok(Restore {
            index,
            outcome: if indeterminate {
                Outcome::Info
            } else {
                operation.outcome
            },
            invoke_ns: operation.invoke_ns,
            end_ns: operation.complete_ns.unwrap_or(u64::MAX),
            backup,
        })
    }
}

/// Checks every key of a history with restores (see the module doc).
pub(super) fn check(
    keys: &BTreeMap<&str, KeyOperations<'_>>,
    mut restores: Vec<Restore<'_>>,
) -> Result<SetReport, Error> {
    restores.sort_by_key(|restore| (restore.invoke_ns, restore.index));
    let effective: Vec<&Restore<'_>> = restores
        .iter()
        .filter(|restore| restore.outcome != Outcome::Fail)
        .collect();
    for pair in effective.windows(2) {
        if pair[0].end_ns >= pair[1].invoke_ns {
            return Err(Error::InvalidOperation {
                index: pair[1].index,
                reason: format!(
                    "this restore starts before restore #{} ended or was settled: the set \
                     checker needs restores one at a time",
                    pair[0].index
                ),
            });
        }
    }
    let unknown: Vec<usize> = (0..effective.len())
        .filter(|&i| effective[i].outcome != Outcome::Ok)
        .collect();
    let mut reports: Vec<_> = keys
        .iter()
        .map(|(key, operations)| attempts_report(key, operations))
        .collect();
    let decidable = unknown.len() <= RESTORE_UNKNOWN_MAX;
    // The choice (bit i: unknown restore i applied) with the fewest anomalies.
    let mut best: Option<(u64, usize, Vec<Vec<SetAnomaly>>)> = None;
    if decidable {
        for choice in 0..(1u64 << unknown.len()) {
            let applied: Vec<&Restore<'_>> = effective
                .iter()
                .enumerate()
                .filter(|(i, restore)| {
                    restore.outcome == Outcome::Ok
                        || unknown
                            .iter()
                            .position(|u| u == i)
                            .is_some_and(|bit| choice & (1 << bit) != 0)
                })
                .map(|(_, restore)| *restore)
                .collect();
            let anomalies: Vec<Vec<SetAnomaly>> = keys
                .iter()
                .map(|(key, operations)| unexplained_reads(key, operations, &applied))
                .collect();
            let count: usize = anomalies.iter().map(Vec::len).sum();
            if best.as_ref().is_none_or(|(_, fewest, _)| count < *fewest) {
                best = Some((choice, count, anomalies));
            }
            if count == 0 {
                break;
            }
        }
    }
    let choice = best.as_ref().map_or(0, |(choice, _, _)| *choice);
    let restores = restores
        .iter()
        .map(|restore| RestoreFate {
            restore: restore.index,
            outcome: restore.outcome,
            applied: match restore.outcome {
                Outcome::Ok => true,
                Outcome::Fail => false,
                Outcome::Info => unknown
                    .iter()
                    .position(|&i| effective[i].index == restore.index)
                    .is_some_and(|bit| choice & (1 << bit) != 0),
            },
        })
        .collect();
    let unexplained = best.map(|(_, _, anomalies)| anomalies);
    let mut key_reports = Vec::with_capacity(reports.len());
    for (position, ((_, operations), (mut report, mut anomalies, _))) in
        keys.iter().zip(reports.drain(..)).enumerate()
    {
        let reads = unexplained
            .as_ref()
            .map(|all| all[position].clone())
            .unwrap_or_default();
        report.stale_reads = reads.len();
        anomalies.extend(reads);
        report.verdict = if !anomalies.is_empty() {
            Verdict::Invalid
        } else if !decidable || (operations.reads.is_empty() && !operations.adds.is_empty()) {
            Verdict::Unknown
        } else {
            Verdict::Valid
        };
        report.anomalies = anomalies;
        key_reports.push(report);
    }
    let verdict = key_reports
        .iter()
        .fold(Verdict::Valid, |verdict, key| verdict.combine(key.verdict));
    Ok(SetReport {
        verdict,
        keys: key_reports,
        restores,
    })
}

/// The reads of one key that no state explains, when exactly `applied` took effect.
fn unexplained_reads(
    key: &str,
    operations: &KeyOperations<'_>,
    applied: &[&Restore<'_>],
) -> Vec<SetAnomaly> {
    let reads = &operations.reads;
    let states = applied.len() + 1;
    // State j: left by applied[j - 1]; state 0: the initial one. Its restore's window.
    let window = |j: usize| -> (u64, u64) {
        if j == 0 {
            (0, 0)
        } else {
            (applied[j - 1].invoke_ns, applied[j - 1].end_ns)
        }
    };
    let none = HashSet::new();
    let mut explained = vec![false; reads.len()];
    let mut mismatches: Vec<Vec<StateMismatch>> = vec![Vec::new(); reads.len()];
    for j in 0..states {
        let (start_ns, end_ns) = window(j);
        let backup = match j {
            0 => &none,
            _ => applied[j - 1].backup.get(key).unwrap_or(&none),
        };
        // What becomes known in this state, and when: acknowledged adds and reads
        // invoked after its restore ended.
        let mut known_events: Vec<(u64, &Value, usize)> = Vec::new();
        for (element, attempts) in &operations.adds {
            for attempt in attempts {
                if let (Outcome::Ok, false, Some(complete_ns)) =
                    (attempt.outcome, attempt.indeterminate, attempt.complete_ns)
                {
                    if j == 0 || attempt.invoke_ns > end_ns {
                        known_events.push((complete_ns, element, attempt.index));
                    }
                }
            }
        }
        for read in reads {
            if j == 0 || read.invoke_ns > end_ns {
                known_events.extend(
                    read.elements
                        .iter()
                        .map(|element| (read.complete_ns, element, read.index)),
                );
            }
        }
        known_events.sort();
        let mut known: HashMap<&Value, usize> = HashMap::new();
        let mut next = 0;
        // Reads are sorted by invocation: what is known before each grows.
        for (position, read) in reads.iter().enumerate() {
            let may_follow = j == 0 || start_ns <= read.complete_ns;
            let next_may_follow_read = j + 1 == states || window(j + 1).1 >= read.invoke_ns;
            if !may_follow || !next_may_follow_read {
                continue;
            }
            while let Some(&(at_ns, element, by)) = known_events.get(next) {
                if at_ns >= read.invoke_ns {
                    break;
                }
                known.entry(element).or_insert(by);
                next += 1;
            }
            if explained[position] {
                continue;
            }
            match compare(read, backup, &known, operations, start_ns) {
                None => explained[position] = true,
                Some(mut mismatch) => {
                    mismatch.after_restore = (j > 0).then(|| applied[j - 1].index);
                    mismatches[position].push(mismatch);
                }
            }
        }
    }
    reads
        .iter()
        .zip(mismatches)
        .zip(explained)
        .filter(|(_, explained)| !explained)
        .map(|((read, candidates), _)| SetAnomaly::Unexplained {
            read: read.index,
            candidates,
        })
        .collect()
}

/// How `read` differs from the state left by a restore that started at
/// `start_ns` (0: the initial state) with `backup`, where `known` must be
/// present; `None` when it may be that state.
fn compare(
    read: &Read<'_>,
    backup: &HashSet<&Value>,
    known: &HashMap<&Value, usize>,
    operations: &KeyOperations<'_>,
    start_ns: u64,
) -> Option<StateMismatch> {
    let mut missing_from_backup: Vec<Value> = backup
        .iter()
        .filter(|element| !read.members.contains(**element))
        .map(|element| (*element).clone())
        .collect();
    let mut missing_known: Vec<(Value, usize)> = known
        .iter()
        .filter(|(element, _)| !read.members.contains(**element) && !backup.contains(**element))
        .map(|(element, by)| ((*element).clone(), *by))
        .collect();
    let mut unexpected: Vec<Value> = read
        .members
        .iter()
        .filter(|element| !backup.contains(**element))
        .filter(|element| {
            // Some add may have put it in after the restore's point.
            !operations.adds.get(**element).is_some_and(|attempts| {
                attempts.iter().any(|attempt| {
                    attempt.outcome != Outcome::Fail
                        && attempt.invoke_ns <= read.complete_ns
                        && (attempt.indeterminate
                            || attempt.complete_ns.is_some_and(|ns| ns >= start_ns))
                })
            })
        })
        .map(|element| (*element).clone())
        .collect();
    let mismatched_elements = missing_from_backup.len() + missing_known.len() + unexpected.len();
    if mismatched_elements == 0 {
        return None;
    }
    missing_from_backup.sort();
    missing_from_backup.truncate(LISTED_MAX);
    missing_known.sort();
    missing_known.truncate(LISTED_MAX);
    unexpected.sort();
    unexpected.truncate(LISTED_MAX);
    Some(StateMismatch {
        after_restore: None,
        missing_from_backup,
        missing_known,
        unexpected,
        mismatched_elements,
    })
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::tests::{add, read};
    use super::*;
    use crate::history::{History, OpKind};

    /// A restore of a backup holding `elements` in key "s".
    fn restore(elements: &[i64], outcome: Outcome, invoke_ns: u64, complete_ns: u64) -> Operation {
        let backup = Value::List(elements.iter().map(|&e| Value::Int(e)).collect());
        Operation {
            process: 9,
            op: OpKind::Restore,
            key: String::new(),
            input: Value::List(vec![Value::List(vec![Value::from("s"), backup])]),
            output: Value::Null,
            outcome,
            invoke_ns,
            complete_ns: Some(complete_ns),
        }
    }

    fn run(operations: Vec<Operation>) -> SetReport {
        check(&History::new(operations).unwrap()).unwrap()
    }

    fn unexplained(report: &SetReport) -> Vec<(usize, Vec<StateMismatch>)> {
        report.keys[0]
            .anomalies
            .iter()
            .filter_map(|anomaly| match anomaly {
                SetAnomaly::Unexplained { read, candidates } => Some((*read, candidates.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_history_that_a_restore_explains_is_valid() {
        // 1 and 2 are acknowledged; the backup (saved when only 1 was there) holds
        // 1; the restore at 20..30 takes the set back to {1}, and 3, added after,
        // stays. A read concurrent with the restore may see either state whole;
        // an unknown restore that the reads show applied is taken as applied, one
        // they show not applied as not applied.
        let report = run(vec![
            add(1, Outcome::Ok, 0, Some(1)),
            read(&[1], 2, 3),
            add(2, Outcome::Ok, 4, Some(5)),
            read(&[1, 2], 6, 7),
            restore(&[1], Outcome::Ok, 20, 30),
            read(&[1, 2], 19, 22),
            read(&[1], 25, 35),
            add(3, Outcome::Ok, 31, Some(32)),
            read(&[1, 3], 40, 41),
            // Unknown, settled at 60: the reads after it show {1, 3}: not applied.
            restore(&[], Outcome::Info, 50, 60),
            read(&[1, 3], 61, 62),
            // Unknown, settled at 80: the reads after it show {} and 4: applied.
            restore(&[], Outcome::Info, 70, 80),
            add(4, Outcome::Info, 81, None),
            read(&[4], 85, 86),
            // A failed restore changes nothing.
            restore(&[7], Outcome::Fail, 90, 91),
            read(&[4], 92, 93),
        ]);
        assert_eq!(report.verdict, Verdict::Valid, "{report:#?}");
        assert_eq!(
            report
                .restores
                .iter()
                .map(|fate| (fate.restore, fate.applied))
                .collect::<Vec<_>>(),
            vec![(4, true), (9, false), (11, true), (14, false)]
        );
    }

    #[test]
    fn an_element_that_survives_an_acknowledged_restore_is_unexplained() {
        // 2 was acknowledged before the restore began and is not in the backup:
        // after the restore, a read may not list it.
        let report = run(vec![
            add(1, Outcome::Ok, 0, Some(1)),
            add(2, Outcome::Ok, 2, Some(3)),
            restore(&[1], Outcome::Ok, 10, 20),
            read(&[1, 2], 21, 22),
        ]);
        assert_eq!(report.verdict, Verdict::Invalid);
        let reads = unexplained(&report);
        assert_eq!(reads.len(), 1);
        assert_eq!(reads[0].0, 3);
        assert_eq!(reads[0].1.len(), 1, "only the state after the restore");
        assert_eq!(reads[0].1[0].after_restore, Some(2));
        assert_eq!(reads[0].1[0].unexpected, vec![Value::Int(2)]);
    }

    #[test]
    fn a_half_applied_restore_is_unexplained() {
        // {1, 2}; restore of {1}; 3 added: {1, 3}; restore of an older backup
        // {1, 2}. A read concurrent with the second restore that lists 2 (only in
        // the backup) with 3 (only before it) mixes the two states; a read after it
        // that misses 2 shows the restore half applied.
        let report = run(vec![
            add(1, Outcome::Ok, 0, Some(1)),
            add(2, Outcome::Ok, 2, Some(3)),
            restore(&[1], Outcome::Ok, 10, 20),
            add(3, Outcome::Ok, 21, Some(22)),
            read(&[1, 3], 23, 24),
            restore(&[1, 2], Outcome::Ok, 30, 40),
            read(&[1, 2, 3], 35, 45),
            read(&[1], 50, 51),
        ]);
        assert_eq!(report.verdict, Verdict::Invalid);
        let reads = unexplained(&report);
        assert_eq!(
            reads.iter().map(|(read, _)| *read).collect::<Vec<_>>(),
            vec![6, 7]
        );
        // The mixed read: before the restore it cannot list 2, after it not 3.
        let mixed = &reads[0].1;
        assert_eq!(mixed.len(), 2);
        assert_eq!(mixed[0].after_restore, Some(2));
        assert_eq!(mixed[0].unexpected, vec![Value::Int(2)]);
        assert_eq!(mixed[1].after_restore, Some(5));
        assert_eq!(mixed[1].unexpected, vec![Value::Int(3)]);
        // The read after it misses an element of the backup.
        assert_eq!(reads[1].1[0].missing_from_backup, vec![Value::Int(2)]);
    }

    #[test]
    fn an_unknown_restore_must_be_all_or_nothing_on_every_key() {
        // Key "s" shows the unknown restore applied, key "t" shows it not applied:
        // one restore cannot do both.
        let on_t = |mut operation: Operation| {
            operation.key = "t".into();
            operation
        };
        let mut unknown = restore(&[], Outcome::Info, 10, 20);
        unknown.input = Value::List(vec![
            Value::List(vec![Value::from("s"), Value::List(vec![])]),
            Value::List(vec![Value::from("t"), Value::List(vec![])]),
        ]);
        let report = run(vec![
            add(1, Outcome::Ok, 0, Some(1)),
            on_t(add(2, Outcome::Ok, 0, Some(1))),
            unknown,
            read(&[], 21, 22),
            on_t(read(&[2], 21, 22)),
        ]);
        assert_eq!(report.verdict, Verdict::Invalid, "{report:#?}");
        // Each key alone would be valid.
        for key in ["s", "t"] {
            let report = run(vec![
                add(1, Outcome::Ok, 0, Some(1)),
                on_t(add(2, Outcome::Ok, 0, Some(1))),
                restore(&[], Outcome::Info, 10, 20),
                read(&[], 21, 22),
                on_t(read(&[2], 21, 22)),
            ]
            .into_iter()
            .filter(|op| op.key == key || op.op == OpKind::Restore)
            .collect());
            assert_eq!(report.verdict, Verdict::Valid, "key {key}: {report:#?}");
        }
    }

    #[test]
    fn overlapping_or_malformed_restores_are_refused() {
        let overlapping = History::new(vec![
            restore(&[], Outcome::Ok, 10, 20),
            restore(&[], Outcome::Info, 15, 30),
        ])
        .unwrap();
        assert!(matches!(
            check(&overlapping),
            Err(Error::InvalidOperation { index: 1, .. })
        ));
        let mut malformed = restore(&[], Outcome::Ok, 10, 20);
        malformed.input = Value::List(vec![Value::from("s")]);
        assert!(matches!(
            check(&History::new(vec![malformed]).unwrap()),
            Err(Error::InvalidOperation { index: 0, .. })
        ));
    }
}
