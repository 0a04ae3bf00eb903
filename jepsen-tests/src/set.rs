//! The set checker: cheaper than a linearizability search, for the "set" workload.
//!
//! Operations per key (one set per key): `add` with the element as input, and
//! `read` whose `ok` output is the list of elements (`null` = empty). Checked:
//! - every element of every read was attempted: some `add` of it was invoked before
//!   the read completed (else [`SetAnomaly::NeverAttempted`]), and not every such
//!   attempt is a certain failure (else [`SetAnomaly::FailedButPresent`]);
//! - no read lists an element twice;
//! - the final read (the `ok` read invoked last) holds every element whose `add` was
//!   acknowledged before that read was invoked (else [`SetAnomaly::Lost`]).
//!   Indeterminate adds may or may not appear. Adds acknowledged after the final read
//!   began cannot be verified and are only counted.
//!
//! A key with adds but no successful read cannot be judged: its verdict is unknown.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::history::{History, OpKind, Outcome, Value};
use crate::{Error, Verdict};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetAnomaly {
    /// Acknowledged before the final read began, missing from it.
    Lost {
        element: Value,
        add: usize,
        final_read: usize,
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
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetKeyReport {
    pub key: String,
    pub verdict: Verdict,
    /// The `ok` read invoked last (history index).
    pub final_read: Option<usize>,
    /// Distinct elements with at least one acknowledged add.
    pub acknowledged_elements: usize,
    /// Distinct elements whose adds were all indeterminate (none acknowledged).
    pub indeterminate_elements: usize,
    /// Of those, how many the final read holds.
    pub indeterminate_elements_present: usize,
    /// Distinct elements whose adds all failed.
    pub failed_elements: usize,
    /// Acknowledged elements that could not be verified (acknowledged only after
    /// the final read was invoked, and absent from it).
    pub unverified_elements: usize,
    pub anomalies: Vec<SetAnomaly>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetReport {
    pub verdict: Verdict,
    /// One report per key, sorted by key.
    pub keys: Vec<SetKeyReport>,
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
}

#[derive(Default)]
struct KeyOperations<'h> {
    adds: HashMap<&'h Value, Vec<Attempt>>,
    reads: Vec<Read<'h>>,
}

/// Checks a set history, key by key.
pub fn check(history: &History) -> Result<SetReport, Error> {
    let mut keys: BTreeMap<&str, KeyOperations<'_>> = BTreeMap::new();
    for (index, operation) in history.operations().iter().enumerate() {
        let key = keys.entry(operation.key.as_str()).or_default();
        match operation.op {
            OpKind::Add => key.adds.entry(&operation.input).or_default().push(Attempt {
                index,
                outcome: operation.outcome,
                indeterminate: operation.is_indeterminate(),
                invoke_ns: operation.invoke_ns,
                complete_ns: operation.complete_ns,
            }),
            OpKind::Read => {
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
                });
            }
            OpKind::Write | OpKind::Cas | OpKind::Delete | OpKind::Append => {
                return Err(Error::UnsupportedOperation {
                    index,
                    checker: "set",
                    op: operation.op,
                });
            }
        }
    }
    let keys: Vec<SetKeyReport> = keys
        .into_iter()
        .map(|(key, operations)| check_key(key, &operations))
        .collect();
    let verdict = keys
        .iter()
        .fold(Verdict::Valid, |verdict, key| verdict.combine(key.verdict));
    Ok(SetReport { verdict, keys })
}

fn check_key(key: &str, operations: &KeyOperations<'_>) -> SetKeyReport {
    let mut anomalies = Vec::new();
    for read in &operations.reads {
        let mut seen = HashSet::with_capacity(read.elements.len());
        for element in read.elements {
            if !seen.insert(element) {
                anomalies.push(SetAnomaly::Duplicated {
                    element: element.clone(),
                    read: read.index,
                });
                continue;
            }
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

    let final_read = operations
        .reads
        .iter()
        .max_by_key(|read| (read.invoke_ns, read.complete_ns, read.index));
    let final_elements: HashSet<&Value> = final_read
        .map(|read| read.elements.iter().collect())
        .unwrap_or_default();
    let mut report = SetKeyReport {
        key: key.to_owned(),
        verdict: Verdict::Valid,
        final_read: final_read.map(|read| read.index),
        acknowledged_elements: 0,
        indeterminate_elements: 0,
        indeterminate_elements_present: 0,
        failed_elements: 0,
        unverified_elements: 0,
        anomalies: Vec::new(),
    };
    let mut elements: Vec<(&&Value, &Vec<Attempt>)> = operations.adds.iter().collect();
    elements.sort_by(|a, b| a.0.cmp(b.0));
    for (element, attempts) in elements {
        let acknowledged = attempts
            .iter()
            .filter(|attempt| attempt.outcome == Outcome::Ok && !attempt.indeterminate)
            .min_by_key(|attempt| attempt.complete_ns);
        let present = final_elements.contains(*element);
        if let Some(add) = acknowledged {
            report.acknowledged_elements += 1;
            let verifiable = final_read.filter(|read| {
                add.complete_ns
                    .is_some_and(|complete_ns| complete_ns < read.invoke_ns)
            });
            match (verifiable, present) {
                (Some(read), false) => anomalies.push(SetAnomaly::Lost {
                    element: (*element).clone(),
                    add: add.index,
                    final_read: read.index,
                }),
                (None, false) => report.unverified_elements += 1,
                (_, true) => {}
            }
        } else if attempts.iter().any(|attempt| attempt.indeterminate) {
            report.indeterminate_elements += 1;
            report.indeterminate_elements_present += usize::from(present);
        } else {
            report.failed_elements += 1;
        }
    }

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

    fn add(element: i64, outcome: Outcome, invoke_ns: u64, complete_ns: Option<u64>) -> Operation {
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

    fn read(elements: &[i64], invoke_ns: u64, complete_ns: u64) -> Operation {
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
                add: 0,
                final_read: 2
            }]
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
