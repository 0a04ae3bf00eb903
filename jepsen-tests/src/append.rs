//! The list-append checker, for the "append" workload: each key holds a list, an
//! `append` adds its input (unique per key) at the end, a `read` returns the list
//! (`null` = empty).
//!
//! Checked, per key, against the longest list any `ok` read observed:
//! - every observed list is a prefix of the longest ([`AppendAnomaly::NotPrefixOfLongest`]);
//! - no list holds an element twice ([`AppendAnomaly::Duplicate`]);
//! - every element was attempted before the read completed, by an append that did not
//!   certainly fail ([`AppendAnomaly::NeverAttempted`], [`AppendAnomaly::FailedButPresent`]);
//! - every acknowledged append is in every list read after it was acknowledged, hence
//!   in the longest ([`AppendAnomaly::Lost`]); appends acknowledged after the last read
//!   began cannot be verified and are only counted;
//! - real-time order: a read that began after another ended never shows a shorter
//!   list ([`AppendAnomaly::Rewind`]), and an append acknowledged before another was
//!   invoked comes first in the list ([`AppendAnomaly::OrderViolation`]).
//!
//! A key with acknowledged appends but no successful read cannot be judged: unknown.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::history::{History, OpKind, Outcome, Value};
use crate::{Error, Verdict};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppendAnomaly {
    /// A read lists an element twice.
    Duplicate { element: Value, read: usize },
    /// A read lists an element whose append had not been invoked when it completed.
    NeverAttempted { element: Value, read: usize },
    /// A read lists an element whose append certainly failed.
    FailedButPresent {
        element: Value,
        read: usize,
        append: usize,
    },
    /// A read's list is not a prefix of the longest list observed.
    NotPrefixOfLongest { read: usize, longest_read: usize },
    /// An append acknowledged before `read` began is missing from it.
    Lost {
        element: Value,
        append: usize,
        read: usize,
    },
    /// `later_read` began after `earlier_read` ended but shows a shorter list.
    Rewind {
        earlier_read: usize,
        later_read: usize,
    },
    /// `first_append` was acknowledged before `second_append` was invoked, yet the
    /// longest list has the second element before the first.
    OrderViolation {
        first_append: usize,
        second_append: usize,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendKeyReport {
    pub key: String,
    pub verdict: Verdict,
    /// The read that observed the longest list (history index).
    pub longest_read: Option<usize>,
    pub longest_len: usize,
    pub reads: usize,
    pub acknowledged_appends: usize,
    pub indeterminate_appends: usize,
    pub failed_appends: usize,
    /// Acknowledged appends that no read began after.
    pub unverified_appends: usize,
    pub anomalies: Vec<AppendAnomaly>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendReport {
    pub verdict: Verdict,
    /// One report per key, sorted by key.
    pub keys: Vec<AppendKeyReport>,
}

struct Append {
    index: usize,
    outcome: Outcome,
    indeterminate: bool,
    invoke_ns: u64,
    complete_ns: Option<u64>,
}

impl Append {
    /// Completion time if acknowledged.
    fn acknowledged_ns(&self) -> Option<u64> {
        if self.outcome == Outcome::Ok && !self.indeterminate {
            self.complete_ns
        } else {
            None
        }
    }
}

struct Read<'h> {
    index: usize,
    invoke_ns: u64,
    complete_ns: u64,
    list: &'h [Value],
}

#[derive(Default)]
struct KeyOperations<'h> {
    appends: HashMap<&'h Value, Append>,
    reads: Vec<Read<'h>>,
}

/// Checks a list-append history, key by key.
pub fn check(history: &History) -> Result<AppendReport, Error> {
    let mut keys: BTreeMap<&str, KeyOperations<'_>> = BTreeMap::new();
    for (index, operation) in history.operations().iter().enumerate() {
        let key = keys.entry(operation.key.as_str()).or_default();
        match operation.op {
            OpKind::Append => {
                let append = Append {
                    index,
                    outcome: operation.outcome,
                    indeterminate: operation.is_indeterminate(),
                    invoke_ns: operation.invoke_ns,
                    complete_ns: operation.complete_ns,
                };
                if let Some(previous) = key.appends.insert(&operation.input, append) {
                    return Err(Error::InvalidOperation {
                        index,
                        reason: format!(
                            "{} was already appended to key {:?} by operation {}; append values must be unique per key",
                            operation.input, operation.key, previous.index
                        ),
                    });
                }
            }
            OpKind::Read => {
                let (Outcome::Ok, Some(complete_ns)) = (operation.outcome, operation.complete_ns)
                else {
                    continue;
                };
                let list = operation
                    .output
                    .as_list()
                    .ok_or_else(|| Error::InvalidOperation {
                        index,
                        reason: format!(
                            "an append read must return a list, got {}",
                            operation.output
                        ),
                    })?;
                key.reads.push(Read {
                    index,
                    invoke_ns: operation.invoke_ns,
                    complete_ns,
                    list,
                });
            }
            OpKind::Write
            | OpKind::Cas
            | OpKind::Delete
            | OpKind::Add
            | OpKind::Restore
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
                    checker: "append",
                    op: operation.op,
                });
            }
        }
    }
    let keys: Vec<AppendKeyReport> = keys
        .into_iter()
        .map(|(key, operations)| check_key(key, &operations))
        .collect();
    let verdict = keys
        .iter()
        .fold(Verdict::Valid, |verdict, key| verdict.combine(key.verdict));
    Ok(AppendReport { verdict, keys })
}

fn check_key(key: &str, operations: &KeyOperations<'_>) -> AppendKeyReport {
    let appends = &operations.appends;
    let mut anomalies = Vec::new();
    let mut report = AppendKeyReport {
        key: key.to_owned(),
        verdict: Verdict::Valid,
        longest_read: None,
        longest_len: 0,
        reads: operations.reads.len(),
        acknowledged_appends: appends
            .values()
            .filter(|append| append.acknowledged_ns().is_some())
            .count(),
        indeterminate_appends: appends
            .values()
            .filter(|append| append.indeterminate)
            .count(),
        failed_appends: appends
            .values()
            .filter(|append| append.outcome == Outcome::Fail && !append.indeterminate)
            .count(),
        unverified_appends: 0,
        anomalies: Vec::new(),
    };

    // Element-wise checks on every read.
    for read in &operations.reads {
        let mut seen = HashSet::with_capacity(read.list.len());
        for element in read.list {
            if !seen.insert(element) {
                anomalies.push(AppendAnomaly::Duplicate {
                    element: element.clone(),
                    read: read.index,
                });
                continue;
            }
            match appends.get(element) {
                Some(append) if append.invoke_ns <= read.complete_ns => {
                    if append.outcome == Outcome::Fail && !append.indeterminate {
                        anomalies.push(AppendAnomaly::FailedButPresent {
                            element: element.clone(),
                            read: read.index,
                            append: append.index,
                        });
                    }
                }
                _ => anomalies.push(AppendAnomaly::NeverAttempted {
                    element: element.clone(),
                    read: read.index,
                }),
            }
        }
    }

    let Some(longest) = operations.reads.iter().max_by_key(|read| {
        (
            read.list.len(),
            std::cmp::Reverse((read.invoke_ns, read.index)),
        )
    }) else {
        report.unverified_appends = report.acknowledged_appends;
        report.verdict = if report.acknowledged_appends > 0 {
            Verdict::Unknown
        } else {
            Verdict::Valid
        };
        return report;
    };
    report.longest_read = Some(longest.index);
    report.longest_len = longest.list.len();

    // Every read is a prefix of the longest; only those that are take part below.
    let mut compatible: Vec<&Read<'_>> = Vec::with_capacity(operations.reads.len());
    for read in &operations.reads {
        if longest.list.starts_with(read.list) {
            compatible.push(read);
        } else {
            anomalies.push(AppendAnomaly::NotPrefixOfLongest {
                read: read.index,
                longest_read: longest.index,
            });
        }
    }
    let mut position: HashMap<&Value, usize> = HashMap::with_capacity(longest.list.len());
    for (at, element) in longest.list.iter().enumerate() {
        position.entry(element).or_insert(at);
    }

    // Lost: an append acknowledged at t must be in every compatible read invoked
    // after t, i.e. its position must be below the shortest such read's length.
    compatible.sort_by_key(|read| (read.invoke_ns, read.index));
    let mut shortest_from: Vec<usize> = (0..compatible.len()).collect();
    for at in (0..compatible.len().saturating_sub(1)).rev() {
        let later = shortest_from[at + 1];
        if compatible[later].list.len() < compatible[at].list.len() {
            shortest_from[at] = later;
        }
    }
    let mut acknowledged: Vec<(&Value, &Append, u64)> = appends
        .iter()
        .filter_map(|(element, append)| {
            append
                .acknowledged_ns()
                .map(|ack_ns| (*element, append, ack_ns))
        })
        .collect();
    acknowledged.sort_by_key(|(_, append, _)| append.index);
    for (element, append, ack_ns) in acknowledged {
        let first_after = compatible.partition_point(|read| read.invoke_ns <= ack_ns);
        let Some(&shortest) = shortest_from.get(first_after) else {
            report.unverified_appends += 1;
            continue;
        };
        let read = compatible[shortest];
        let in_read = position
            .get(element)
            .is_some_and(|&at| at < read.list.len());
        if !in_read {
            anomalies.push(AppendAnomaly::Lost {
                element: element.clone(),
                append: append.index,
                read: read.index,
            });
        }
    }

    // Rewind: among compatible reads, one that began after another ended is not shorter.
    let mut by_completion: Vec<&Read<'_>> = compatible.clone();
    by_completion.sort_by_key(|read| (read.complete_ns, read.index));
    let mut longest_until: Vec<usize> = Vec::with_capacity(by_completion.len());
    for (at, read) in by_completion.iter().enumerate() {
        let best = match longest_until.last() {
            Some(&best) if by_completion[best].list.len() >= read.list.len() => best,
            _ => at,
        };
        longest_until.push(best);
    }
    for read in &compatible {
        let ended_before =
            by_completion.partition_point(|earlier| earlier.complete_ns < read.invoke_ns);
        if ended_before == 0 {
            continue;
        }
        let earlier = by_completion[longest_until[ended_before - 1]];
        if earlier.list.len() > read.list.len() {
            anomalies.push(AppendAnomaly::Rewind {
                earlier_read: earlier.index,
                later_read: read.index,
            });
        }
    }

    // Real-time order within the longest list: for the element at each position, no
    // element after it may have been acknowledged before it was invoked.
    let mut earliest_ack_after: Option<(u64, &Append)> = None;
    for element in longest.list.iter().rev() {
        let Some(append) = appends.get(element) else {
            continue;
        };
        if let Some((ack_ns, later)) = earliest_ack_after {
            if ack_ns < append.invoke_ns {
                anomalies.push(AppendAnomaly::OrderViolation {
                    first_append: later.index,
                    second_append: append.index,
                });
            }
        }
        if let Some(ack_ns) = append.acknowledged_ns() {
            if earliest_ack_after.is_none_or(|(earliest, _)| ack_ns < earliest) {
                earliest_ack_after = Some((ack_ns, append));
            }
        }
    }

    report.verdict = if anomalies.is_empty() {
        Verdict::Valid
    } else {
        Verdict::Invalid
    };
    report.anomalies = anomalies;
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Operation;

    fn append(
        element: i64,
        outcome: Outcome,
        invoke_ns: u64,
        complete_ns: Option<u64>,
    ) -> Operation {
        Operation {
            process: 0,
            op: OpKind::Append,
            key: "l".into(),
            input: Value::Int(element),
            output: Value::Null,
            outcome,
            invoke_ns,
            complete_ns,
        }
    }

    fn read(list: &[i64], invoke_ns: u64, complete_ns: u64) -> Operation {
        Operation {
            process: 1,
            op: OpKind::Read,
            key: "l".into(),
            input: Value::Null,
            output: Value::List(list.iter().map(|&element| Value::Int(element)).collect()),
            outcome: Outcome::Ok,
            invoke_ns,
            complete_ns: Some(complete_ns),
        }
    }

    fn anomalies(operations: Vec<Operation>) -> (Verdict, Vec<AppendAnomaly>) {
        let report = check(&History::new(operations).unwrap()).unwrap();
        (
            report.verdict,
            report
                .keys
                .into_iter()
                .flat_map(|key| key.anomalies)
                .collect(),
        )
    }

    #[test]
    fn growing_prefixes_with_indeterminate_appends_are_valid() {
        // Reads see growing prefixes; an info append shows up, a failed one never does.
        let (verdict, found) = anomalies(vec![
            append(1, Outcome::Ok, 0, Some(2)),
            read(&[1], 3, 4),
            append(2, Outcome::Info, 5, None),
            append(3, Outcome::Ok, 6, Some(8)),
            append(4, Outcome::Fail, 6, Some(7)),
            read(&[1, 2, 3], 9, 10),
            read(&[1, 2, 3], 11, 12),
        ]);
        assert_eq!((verdict, found), (Verdict::Valid, vec![]));
    }

    #[test]
    fn diverging_lists_are_not_prefixes_of_the_longest() {
        // Two reads that disagree on the order of elements cannot both be prefixes.
        let (verdict, found) = anomalies(vec![
            append(1, Outcome::Ok, 0, Some(10)),
            append(2, Outcome::Ok, 0, Some(10)),
            read(&[2], 11, 12),
            read(&[1, 2], 13, 14),
        ]);
        assert_eq!(verdict, Verdict::Invalid);
        assert!(found.contains(&AppendAnomaly::NotPrefixOfLongest {
            read: 2,
            longest_read: 3
        }));
    }

    #[test]
    fn acknowledged_append_missing_from_a_later_read_is_lost() {
        // An append acked before a read began must be in that read.
        let (verdict, found) = anomalies(vec![
            append(1, Outcome::Ok, 0, Some(1)),
            append(2, Outcome::Ok, 2, Some(3)),
            read(&[1], 4, 5),
        ]);
        assert_eq!(verdict, Verdict::Invalid);
        assert_eq!(
            found,
            vec![AppendAnomaly::Lost {
                element: Value::Int(2),
                append: 1,
                read: 2
            }]
        );
    }

    #[test]
    fn duplicates_and_invented_or_failed_elements_are_anomalies() {
        // A list may not repeat an element, invent one, or show a failed append.
        let (verdict, found) = anomalies(vec![
            append(1, Outcome::Ok, 0, Some(1)),
            append(2, Outcome::Fail, 2, Some(3)),
            read(&[1, 1, 2, 9], 4, 5),
        ]);
        assert_eq!(verdict, Verdict::Invalid);
        assert_eq!(
            found,
            vec![
                AppendAnomaly::Duplicate {
                    element: Value::Int(1),
                    read: 2
                },
                AppendAnomaly::FailedButPresent {
                    element: Value::Int(2),
                    read: 2,
                    append: 1
                },
                AppendAnomaly::NeverAttempted {
                    element: Value::Int(9),
                    read: 2
                },
            ]
        );
    }

    #[test]
    fn later_read_showing_a_shorter_list_is_a_rewind() {
        // Once a read has returned [1 2], a read starting afterwards cannot return [1].
        let (verdict, found) = anomalies(vec![
            append(1, Outcome::Ok, 0, Some(1)),
            append(2, Outcome::Info, 2, None),
            read(&[1, 2], 4, 5),
            read(&[1], 6, 7),
        ]);
        assert_eq!(verdict, Verdict::Invalid);
        assert_eq!(
            found,
            vec![AppendAnomaly::Rewind {
                earlier_read: 2,
                later_read: 3
            }]
        );
    }

    #[test]
    fn list_order_contradicting_real_time_is_an_order_violation() {
        // 1 was acked before 2 was invoked, so 2 cannot precede 1.
        let (verdict, found) = anomalies(vec![
            append(1, Outcome::Ok, 0, Some(1)),
            append(2, Outcome::Ok, 2, Some(3)),
            read(&[2, 1], 4, 5),
        ]);
        assert_eq!(verdict, Verdict::Invalid);
        assert_eq!(
            found,
            vec![AppendAnomaly::OrderViolation {
                first_append: 0,
                second_append: 1
            }]
        );
    }

    #[test]
    fn appends_without_reads_are_unknown_and_duplicate_appends_are_rejected() {
        // Nothing to verify is "unknown"; appending one value twice is a usage error.
        let (verdict, _) = anomalies(vec![append(1, Outcome::Ok, 0, Some(1))]);
        assert_eq!(verdict, Verdict::Unknown);
        let twice = History::new(vec![
            append(1, Outcome::Ok, 0, Some(1)),
            append(1, Outcome::Ok, 2, Some(3)),
        ])
        .unwrap();
        assert!(matches!(
            check(&twice),
            Err(Error::InvalidOperation { index: 1, .. })
        ));
    }
}
