//! The set checker, in the manner of Jepsen's `set-full`: cheaper than a
//! linearizability search, for the "set" workload.
//!
//! Operations per key (one set per key): `add` with the element as input, and
//! `read` whose `ok` output is the list of elements (`null` = empty). Reads are
//! strong (linearizable), so elements never leave a set. Checked, per element:
//! - it becomes *known* at the earliest of: the completion of an acknowledged
//!   add of it, or the completion of a read that listed it (so an add whose
//!   outcome was unknown is known once a read saw it);
//! - every read invoked after it became known must list it. A read that does
//!   not is *stale*; if a later read lists it again the element was
//!   [`SetAnomaly::Stale`] (lost, then recovered), if the last read invoked
//!   after it became known misses it, it is [`SetAnomaly::Lost`]. Each element's
//!   report carries when it was lost (the first stale read's invocation) and
//!   when it was recovered (the completion of the first later read listing it);
//! - every element of every read was attempted: some `add` of it was invoked
//!   before the read completed (else [`SetAnomaly::NeverAttempted`]), and not
//!   every such attempt is a certain failure (else [`SetAnomaly::FailedButPresent`]);
//! - no read lists an element twice ([`SetAnomaly::Duplicated`]).
//!
//! What it cannot see: a read concurrent with the add (or with the read) that
//! made the element known may go either way; an acknowledged element no read
//! started after is only counted as unverified; an indeterminate add no read
//! ever listed may or may not have happened. A key with adds but no successful
//! read cannot be judged: its verdict is unknown.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::history::{History, OpKind, Outcome, Value};
use crate::{Error, Verdict};

mod restore;

pub use restore::{StateMismatch, RESTORE_UNKNOWN_MAX};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetAnomaly {
    /// Known (acknowledged by `known_by`, or listed by the read `known_by`),
    /// then missing from `first_missing_read` and from every later read.
    Lost {
        element: Value,
        known_by: usize,
        first_missing_read: usize,
        /// The last read invoked after it became known (which misses it).
        last_read: usize,
        missing_reads: usize,
    },
    /// Known, then missing from `first_missing_read` (a stale read), then
    /// listed again by `recovered_read`.
    Stale {
        element: Value,
        known_by: usize,
        first_missing_read: usize,
        recovered_read: usize,
        missing_reads: usize,
    },
    /// Present in a read although no add of it had been invoked by then.
    NeverAttempted { element: Value, read: usize },
    /// Present in a read although every add of it invoked by then failed.
    FailedButPresent {
        element: Value,
        read: usize,
        add: usize,
    },
    /// Listed more than once by one read.
    Duplicated { element: Value, read: usize },
    /// (Histories with restores.) A read that no state it may have seen explains:
    /// for each candidate state (the initial one, or the one a restore left), why
    /// not.
    Unexplained {
        read: usize,
        candidates: Vec<StateMismatch>,
    },
}

/// The timeline of one element that some read missed after it became known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElementFate {
    pub element: Value,
    /// When it became known (history time) and by which operation.
    pub known_ns: u64,
    pub known_by: usize,
    /// The invocation of the first read that missed it after it became known.
    pub lost_ns: u64,
    /// The completion of the first read after that which listed it again;
    /// `None` = never recovered (lost).
    pub recovered_ns: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetKeyReport {
    pub key: String,
    pub verdict: Verdict,
    /// The `ok` read invoked last (history index).
    pub final_read: Option<usize>,
    /// Successful reads of this key.
    pub reads: usize,
    /// Distinct elements with at least one acknowledged add.
    pub acknowledged_elements: usize,
    /// Distinct elements whose adds were all indeterminate (none acknowledged).
    pub indeterminate_elements: usize,
    /// Of those, how many some read listed (which makes them known).
    pub indeterminate_elements_present: usize,
    /// Distinct elements whose adds all failed.
    pub failed_elements: usize,
    /// Known elements that no read started after they became known (so
    /// nothing could confirm they stayed).
    pub unverified_elements: usize,
    /// Reads that missed a known element (each counted once).
    pub stale_reads: usize,
    /// The elements some read missed after they became known, by element.
    pub fates: Vec<ElementFate>,
    pub anomalies: Vec<SetAnomaly>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetReport {
    pub verdict: Verdict,
    /// One report per key, sorted by key.
    pub keys: Vec<SetKeyReport>,
    /// The restores of the history, in order of invocation (none: no restore).
    pub restores: Vec<RestoreFate>,
}

struct Attempt {
    index: usize,
    outcome: Outcome,
    indeterminate: bool,
    invoke_ns: u64,
    complete_ns: Option<u64>,
}

struct Read<'h> {
    index: usize,
    invoke_ns: u64,
    complete_ns: u64,
    elements: &'h [Value],
    members: HashSet<&'h Value>,
}

#[derive(Default)]
struct KeyOperations<'h> {
    adds: HashMap<&'h Value, Vec<Attempt>>,
    reads: Vec<Read<'h>>,
}

/// How the checker took one restore of the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreFate {
    /// The restore (history index).
    pub restore: usize,
    pub outcome: Outcome,
    /// Whether the explanation the checker settled on has it applied: always for
    /// `ok`, never for `fail`; for an unknown one, what fits the reads (for an invalid
    /// history: the choice that leaves the fewest anomalies).
    pub applied: bool,
}

impl std::fmt::Display for RestoreFate {
    /// `restore #12: ok, taken as applied`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "restore #{}: {}, taken as {}",
            self.restore,
            self.outcome,
            if self.applied {
                "applied"
            } else {
                "not applied"
            }
        )
    }
}

/// Checks a set history, key by key (with restores: `restore`).
pub fn check(history: &History) -> Result<SetReport, Error> {
    let mut keys: BTreeMap<&str, KeyOperations<'_>> = BTreeMap::new();
    let mut restores = Vec::new();
    for (index, operation) in history.operations().iter().enumerate() {
        match operation.op {
            OpKind::Restore => restores.push(restore::Restore::parse(index, operation)?),
            OpKind::Add => keys
                .entry(operation.key.as_str())
                .or_default()
                .adds
                .entry(&operation.input)
                .or_default()
                .push(Attempt {
                    index,
                    outcome: operation.outcome,
                    indeterminate: operation.is_indeterminate(),
                    invoke_ns: operation.invoke_ns,
                    complete_ns: operation.complete_ns,
                }),
            OpKind::Read => {
                let key = keys.entry(operation.key.as_str()).or_default();
                let (Outcome::Ok, Some(complete_ns)) = (operation.outcome, operation.complete_ns)
                else {
                    continue;
                };
                let elements =
                    operation
                        .output
                        .as_list()
                        .ok_or_else(|| Error::InvalidOperation {
                            index,
                            reason: format!(
                                "a set read must return a list, got {}",
                                operation.output
                            ),
                        })?;
                key.reads.push(Read {
                    index,
                    invoke_ns: operation.invoke_ns,
                    complete_ns,
                    elements,
                    members: elements.iter().collect(),
                });
            }
            OpKind::Write
            | OpKind::Cas
            | OpKind::Delete
            | OpKind::Append
            | OpKind::Grant
            | OpKind::KeepAlive
            | OpKind::Revoke
            | OpKind::Campaign
            | OpKind::Fenced
            | OpKind::Resign
            | OpKind::Status
            | OpKind::Finalize => {
                return Err(Error::UnsupportedOperation {
                    index,
                    checker: "set",
                    op: operation.op,
                });
            }
        }
    }
    for operations in keys.values_mut() {
        operations
            .reads
            .sort_by_key(|read| (read.invoke_ns, read.complete_ns, read.index));
    }
    if !restores.is_empty() {
        return restore::check(&keys, restores);
    }
    let keys: Vec<SetKeyReport> = keys
        .iter()
        .map(|(key, operations)| check_key(key, operations))
        .collect();
    let verdict = keys
        .iter()
        .fold(Verdict::Valid, |verdict, key| verdict.combine(key.verdict));
    Ok(SetReport {
        verdict,
        keys,
        restores: Vec::new(),
    })
}

/// The checks that need no notion of time or state, shared with [`restore`]: every
/// element listed was attempted, not only by failed adds, and listed once per read.
/// Returns the key's report with its counts (valid, no anomaly yet), those anomalies
/// and the reads (positions in the sorted reads) listing each element.
fn attempts_report<'h>(
    key: &str,
    operations: &KeyOperations<'h>,
) -> (
    SetKeyReport,
    Vec<SetAnomaly>,
    HashMap<&'h Value, Vec<usize>>,
) {
    let mut anomalies = Vec::new();
    // Reads (positions in the sorted reads) listing each element.
    let mut listed_by: HashMap<&Value, Vec<usize>> = HashMap::new();
    for (position, read) in operations.reads.iter().enumerate() {
        let mut seen = HashSet::with_capacity(read.elements.len());
        for element in read.elements {
            if !seen.insert(element) {
                anomalies.push(SetAnomaly::Duplicated {
                    element: element.clone(),
                    read: read.index,
                });
                continue;
            }
            listed_by.entry(element).or_default().push(position);
            let attempts: Vec<&Attempt> = operations
                .adds
                .get(element)
                .map(|attempts| {
                    attempts
                        .iter()
                        .filter(|attempt| attempt.invoke_ns <= read.complete_ns)
                        .collect()
                })
                .unwrap_or_default();
            match attempts
                .iter()
                .find(|attempt| attempt.outcome == Outcome::Fail)
            {
                _ if attempts.is_empty() => {
                    anomalies.push(SetAnomaly::NeverAttempted {
                        element: element.clone(),
                        read: read.index,
                    });
                }
                Some(failed)
                    if attempts
                        .iter()
                        .all(|attempt| attempt.outcome == Outcome::Fail) =>
                {
                    anomalies.push(SetAnomaly::FailedButPresent {
                        element: element.clone(),
                        read: read.index,
                        add: failed.index,
                    });
                }
                _ => {}
            }
        }
    }

    let final_read = operations.reads.last();
    let mut report = SetKeyReport {
        key: key.to_owned(),
        verdict: Verdict::Valid,
        final_read: final_read.map(|read| read.index),
        reads: operations.reads.len(),
        acknowledged_elements: 0,
        indeterminate_elements: 0,
        indeterminate_elements_present: 0,
        failed_elements: 0,
        unverified_elements: 0,
        stale_reads: 0,
        fates: Vec::new(),
        anomalies: Vec::new(),
    };
    for (element, attempts) in &operations.adds {
        if attempts
            .iter()
            .any(|attempt| attempt.outcome == Outcome::Ok && !attempt.indeterminate)
        {
            report.acknowledged_elements += 1;
        } else if attempts.iter().any(|attempt| attempt.indeterminate) {
            report.indeterminate_elements += 1;
            report.indeterminate_elements_present += usize::from(listed_by.contains_key(element));
        } else {
            report.failed_elements += 1;
        }
    }
    (report, anomalies, listed_by)
}

fn check_key(key: &str, operations: &KeyOperations<'_>) -> SetKeyReport {
    let (mut report, mut anomalies, listed_by) = attempts_report(key, operations);
    let final_read = operations.reads.last();

    // When each element became known: (time, operation index).
    let mut known: BTreeMap<&Value, (u64, usize)> = BTreeMap::new();
    for (element, attempts) in &operations.adds {
        let acknowledged = attempts
            .iter()
            .filter(|attempt| attempt.outcome == Outcome::Ok && !attempt.indeterminate)
            .filter_map(|attempt| attempt.complete_ns.map(|ns| (ns, attempt.index)))
            .min();
        if let Some(at) = acknowledged {
            known.insert(element, at);
        }
    }
    for (element, positions) in &listed_by {
        let seen = positions
            .iter()
            .map(|&position| {
                let read = &operations.reads[position];
                (read.complete_ns, read.index)
            })
            .min()
            .expect("an element is listed by at least one read");
        known
            .entry(element)
            .and_modify(|at| *at = (*at).min(seen))
            .or_insert(seen);
    }

    let mut stale_reads: HashSet<usize> = HashSet::new();
    for (element, (known_ns, known_by)) in known {
        // Reads are sorted by invocation: those from `first` on started after.
        let first = operations
            .reads
            .partition_point(|read| read.invoke_ns <= known_ns);
        let Some(last) = operations
            .reads
            .last()
            .filter(|_| first < operations.reads.len())
        else {
            report.unverified_elements += 1;
            continue;
        };
        let mut first_missing: Option<&Read<'_>> = None;
        let mut recovered: Option<&Read<'_>> = None;
        let mut missing_reads = 0usize;
        for read in &operations.reads[first..] {
            if read.members.contains(element) {
                if first_missing.is_some() && recovered.is_none() {
                    recovered = Some(read);
                }
            } else {
                missing_reads += 1;
                stale_reads.insert(read.index);
                first_missing.get_or_insert(read);
            }
        }
        let Some(first_missing) = first_missing else {
            continue;
        };
        let lost = !last.members.contains(element);
        report.fates.push(ElementFate {
            element: element.clone(),
            known_ns,
            known_by,
            lost_ns: first_missing.invoke_ns,
            recovered_ns: if lost {
                None
            } else {
                recovered.map(|read| read.complete_ns)
            },
        });
        anomalies.push(match (lost, recovered) {
            (false, Some(recovered)) => SetAnomaly::Stale {
                element: element.clone(),
                known_by,
                first_missing_read: first_missing.index,
                recovered_read: recovered.index,
                missing_reads,
            },
            _ => SetAnomaly::Lost {
                element: element.clone(),
                known_by,
                first_missing_read: first_missing.index,
                last_read: last.index,
                missing_reads,
            },
        });
    }
    report.stale_reads = stale_reads.len();

    report.verdict = if !anomalies.is_empty() {
        Verdict::Invalid
    } else if final_read.is_none() && !operations.adds.is_empty() {
        Verdict::Unknown
    } else {
        Verdict::Valid
    };
    report.anomalies = anomalies;
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Operation;

    /// An add of `element` to key "s" (shared with the restore checker's tests).
    pub(super) fn add(
        element: i64,
        outcome: Outcome,
        invoke_ns: u64,
        complete_ns: Option<u64>,
    ) -> Operation {
        Operation {
            process: 0,
            op: OpKind::Add,
            key: "s".into(),
            input: Value::Int(element),
            output: Value::Null,
            outcome,
            invoke_ns,
            complete_ns,
        }
    }

    /// A successful read of key "s" (shared with the restore checker's tests).
    pub(super) fn read(elements: &[i64], invoke_ns: u64, complete_ns: u64) -> Operation {
        Operation {
            process: 1,
            op: OpKind::Read,
            key: "s".into(),
            input: Value::Null,
            output: Value::List(
                elements
                    .iter()
                    .map(|&element| Value::Int(element))
                    .collect(),
            ),
            outcome: Outcome::Ok,
            invoke_ns,
            complete_ns: Some(complete_ns),
        }
    }

    fn run(operations: Vec<Operation>) -> SetReport {
        check(&History::new(operations).unwrap()).unwrap()
    }

    #[test]
    fn acknowledged_and_indeterminate_adds_in_final_read_are_valid() {
        // Acked adds present, an info add present, another info add absent: all fine.
        let report = run(vec![
            add(1, Outcome::Ok, 0, Some(1)),
            add(2, Outcome::Info, 2, Some(3)),
            add(3, Outcome::Info, 4, None),
            add(4, Outcome::Fail, 5, Some(6)),
            read(&[1, 2], 10, 11),
        ]);
        assert_eq!(report.verdict, Verdict::Valid);
        let key = &report.keys[0];
        assert_eq!(key.final_read, Some(4));
        assert_eq!(
            (
                key.acknowledged_elements,
                key.indeterminate_elements,
                key.indeterminate_elements_present
            ),
            (1, 2, 1)
        );
        assert_eq!(key.failed_elements, 1);
    }

    #[test]
    fn acknowledged_add_missing_from_final_read_is_lost() {
        // An add acked before the final read began must be in it.
        let report = run(vec![
            add(1, Outcome::Ok, 0, Some(1)),
            add(2, Outcome::Ok, 2, Some(3)),
            read(&[2], 10, 11),
        ]);
        assert_eq!(report.verdict, Verdict::Invalid);
        assert_eq!(
            report.keys[0].anomalies,
            vec![SetAnomaly::Lost {
                element: Value::Int(1),
                known_by: 0,
                first_missing_read: 2,
                last_read: 2,
                missing_reads: 1,
            }]
        );
    }

    #[test]
    fn a_stale_strong_read_in_the_middle_of_a_run_is_reported_with_its_times() {
        // 1 is acknowledged at 1; the read invoked at 4 misses it (stale), the
        // read at 6..7 lists it again, and so does the final read: the final
        // read alone would pass, the read in the middle may not.
        let report = run(vec![
            add(1, Outcome::Ok, 0, Some(1)),
            read(&[1], 2, 3),
            read(&[], 4, 5),
            read(&[1], 6, 7),
            read(&[1], 8, 9),
        ]);
        assert_eq!(report.verdict, Verdict::Invalid);
        let key = &report.keys[0];
        assert_eq!(
            key.anomalies,
            vec![SetAnomaly::Stale {
                element: Value::Int(1),
                known_by: 0,
                first_missing_read: 2,
                recovered_read: 3,
                missing_reads: 1,
            }]
        );
        assert_eq!(key.stale_reads, 1);
        assert_eq!(
            key.fates,
            vec![ElementFate {
                element: Value::Int(1),
                known_ns: 1,
                known_by: 0,
                lost_ns: 4,
                recovered_ns: Some(7),
            }]
        );
    }

    #[test]
    fn an_unknown_add_seen_by_a_read_then_missing_is_lost() {
        // The add of 1 never completed, so it may or may not have happened;
        // once the read at 2..3 listed it, it happened, and the later reads
        // (the final one included) may not miss it.
        let report = run(vec![
            add(1, Outcome::Info, 0, None),
            read(&[1], 2, 3),
            read(&[], 4, 5),
            read(&[], 6, 7),
        ]);
        assert_eq!(report.verdict, Verdict::Invalid);
        let key = &report.keys[0];
        assert_eq!(
            key.anomalies,
            vec![SetAnomaly::Lost {
                element: Value::Int(1),
                known_by: 1,
                first_missing_read: 2,
                last_read: 3,
                missing_reads: 2,
            }]
        );
        assert_eq!(key.fates[0].recovered_ns, None);
        assert_eq!(key.fates[0].lost_ns, 4);
    }

    #[test]
    fn reads_concurrent_with_what_made_an_element_known_may_miss_it() {
        // The add of 1 runs 0..10 and a read lists it at 7..8: it is known
        // from 8. Reads invoked at or before 8 may miss it (they may have
        // been served earlier); every read invoked after 8 lists it.
        let report = run(vec![
            add(1, Outcome::Ok, 0, Some(10)),
            read(&[], 5, 6),
            read(&[1], 7, 8),
            read(&[], 8, 12),
            read(&[1], 9, 11),
            add(2, Outcome::Info, 13, None),
            read(&[1], 14, 15),
        ]);
        assert_eq!(report.verdict, Verdict::Valid, "{report:?}");
        let key = &report.keys[0];
        assert_eq!(key.stale_reads, 0);
        assert_eq!(
            (
                key.indeterminate_elements,
                key.indeterminate_elements_present
            ),
            (1, 0)
        );
    }

    #[test]
    fn add_acknowledged_after_final_read_began_is_only_unverified() {
        // An add that completes while the final read runs may be missing from it.
        let report = run(vec![add(1, Outcome::Ok, 0, Some(20)), read(&[], 10, 11)]);
        assert_eq!(report.verdict, Verdict::Valid);
        assert_eq!(report.keys[0].unverified_elements, 1);
    }

    #[test]
    fn element_never_added_or_only_failed_is_an_anomaly() {
        // A read may not invent elements, nor show ones whose adds all failed.
        let report = run(vec![
            add(1, Outcome::Fail, 0, Some(1)),
            add(3, Outcome::Ok, 20, Some(21)),
            read(&[1, 2, 3, 3], 10, 11),
        ]);
        assert_eq!(report.verdict, Verdict::Invalid);
        assert_eq!(
            report.keys[0].anomalies,
            vec![
                SetAnomaly::FailedButPresent {
                    element: Value::Int(1),
                    read: 2,
                    add: 0
                },
                SetAnomaly::NeverAttempted {
                    element: Value::Int(2),
                    read: 2
                },
                SetAnomaly::NeverAttempted {
                    element: Value::Int(3),
                    read: 2
                },
                SetAnomaly::Duplicated {
                    element: Value::Int(3),
                    read: 2
                },
            ]
        );
    }

    #[test]
    fn adds_without_any_read_are_unknown() {
        // Without a successful read nothing can be verified.
        let report = run(vec![add(1, Outcome::Ok, 0, Some(1))]);
        assert_eq!(report.verdict, Verdict::Unknown);
    }

    #[test]
    fn set_checker_rejects_register_operations() {
        // A cas in a set history is a usage error, not a verdict.
        let mut operation = add(1, Outcome::Ok, 0, Some(1));
        operation.op = OpKind::Cas;
        let history = History::new(vec![operation]).unwrap();
        assert!(matches!(
            check(&history),
            Err(Error::UnsupportedOperation { index: 0, .. })
        ));
    }
}
