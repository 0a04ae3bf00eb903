//! The monotonic-reads checker: eventual reads never go backwards on one node.
//!
//! The contract: an eventual read is served by the local replica and is
//! monotonic on one node — a later read never returns older state than an
//! earlier one. Input: `read` operations whose input is `[node, lifetime]` —
//! the index of the node that served them and how many times that node had
//! been started when the read was invoked (a read during which the node was
//! restarted is recorded indeterminate) — or, in histories recorded before
//! lifetimes were, the node alone (an integer); and whose `ok` output is
//! `[version, value]`, the version being the resource's revision (0 = nothing
//! stored). Versions of one key only grow (every write gets a new, larger one;
//! the register workload never deletes), so "older state" is "a smaller version".
//!
//! Per (node, key): for every two successful reads A and B where A completed
//! before B was invoked, B's version must be at least A's
//! ([`MonotonicAnomaly::Backwards`]), whatever happened to the node in between:
//! killed and restarted, a node serves no eventual read before it has caught up
//! with a commit index confirmed since its start, so a restart is no excuse (the
//! rule of `docs/contract.md` since 2026-11-28; before it, a restarted node served
//! what it replayed from its disk, and this checker compared reads only within
//! one lifetime). The same version must come with the same value
//! ([`MonotonicAnomaly::VersionValueMismatch`]). The lifetime a read records
//! (`[node, lifetime]` input) is reported with an anomaly, to tell a restart apart.
//!
//! What it cannot see: reads that overlap in time may be served in either
//! order, so they are not compared; reads on different nodes are not compared
//! (a follower may lag the leader); whether the values are right at all is
//! the linearizability checker's business (strong reads), not this one's.
//! Failed and indeterminate reads returned nothing and are skipped.

use std::collections::{BTreeMap, HashMap};

use crate::history::{History, OpKind, Outcome, Value};
use crate::{Error, Verdict};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MonotonicAnomaly {
    /// Read `later` (invoked after `earlier` completed, on the same node, in any
    /// lifetime of it) returned an older version.
    Backwards {
        node: i64,
        /// The node's lifetime at the later read (`None`: the history does not
        /// record lifetimes).
        lifetime: Option<i64>,
        key: String,
        earlier: usize,
        earlier_version: i64,
        later: usize,
        later_version: i64,
    },
    /// Two reads of one key on one node returned the same version with
    /// different values.
    VersionValueMismatch {
        node: i64,
        key: String,
        first: usize,
        second: usize,
        version: i64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MonotonicReport {
    pub verdict: Verdict,
    /// Successful reads checked.
    pub reads: usize,
    /// Distinct (node, key) pairs.
    pub series: usize,
    pub anomalies: Vec<MonotonicAnomaly>,
}

struct Read {
    index: usize,
    lifetime: Option<i64>,
    invoke_ns: u64,
    complete_ns: u64,
    version: i64,
    value: Value,
}

/// The node and (if recorded) the lifetime an eventual read names as its input.
fn node_and_lifetime(index: usize, input: &Value) -> Result<(i64, Option<i64>), Error> {
    match input {
        Value::Int(node) => return Ok((*node, None)),
        Value::List(pair) => {
            if let [Value::Int(node), Value::Int(lifetime)] = pair.as_slice() {
                if *lifetime >= 0 {
                    return Ok((*node, Some(*lifetime)));
                }
            }
        }
        _ => {}
    }
    Err(Error::InvalidOperation {
        index,
        reason: format!(
            "an eventual read names its node as input, as [node lifetime] (lifetime >= 0) or node, got {input}"
        ),
    })
}

/// Checks the eventual reads of a history.
pub fn check(history: &History) -> Result<MonotonicReport, Error> {
    let mut series: BTreeMap<(i64, &str), Vec<Read>> = BTreeMap::new();
    let mut reads = 0usize;
    for (index, operation) in history.operations().iter().enumerate() {
        if operation.op != OpKind::Read {
            return Err(Error::UnsupportedOperation {
                index,
                checker: "monotonic",
                op: operation.op,
            });
        }
        let (node, lifetime) = node_and_lifetime(index, &operation.input)?;
        let (Outcome::Ok, Some(complete_ns)) = (operation.outcome, operation.complete_ns) else {
            continue;
        };
        let (version, value) = match operation.output.as_list() {
            Some([Value::Int(version), value]) if *version >= 0 => (*version, value.clone()),
            _ => {
                return Err(Error::InvalidOperation {
                    index,
                    reason: format!(
                        "an eventual read returns [version value] with a version >= 0, got {}",
                        operation.output
                    ),
                })
            }
        };
        reads += 1;
        series
            .entry((node, operation.key.as_str()))
            .or_default()
            .push(Read {
                index,
                lifetime,
                invoke_ns: operation.invoke_ns,
                complete_ns,
                version,
                value,
            });
    }
    let mut anomalies = Vec::new();
    let series_count = series.len();
    for ((node, key), reads_of_key) in series {
        let mut values: HashMap<i64, (usize, &Value)> = HashMap::new();
        for read in &reads_of_key {
            match values.get(&read.version) {
                Some((first, value)) if **value != read.value => {
                    anomalies.push(MonotonicAnomaly::VersionValueMismatch {
                        node,
                        key: key.to_owned(),
                        first: *first,
                        second: read.index,
                        version: read.version,
                    });
                }
                Some(_) => {}
                None => {
                    values.insert(read.version, (read.index, &read.value));
                }
            }
        }
        for (earlier, later) in backwards(reads_of_key.iter().collect()) {
            anomalies.push(MonotonicAnomaly::Backwards {
                node,
                lifetime: later.lifetime,
                key: key.to_owned(),
                earlier: earlier.index,
                earlier_version: earlier.version,
                later: later.index,
                later_version: later.version,
            });
        }
    }
    let verdict = if anomalies.is_empty() {
        Verdict::Valid
    } else {
        Verdict::Invalid
    };
    Ok(MonotonicReport {
        verdict,
        reads,
        series: series_count,
        anomalies,
    })
}

/// The reads of one (node, key) that went backwards, each with the read it went
/// back from: for each read, the floor it must not go under is the newest version
/// among the reads that completed before it was invoked.
fn backwards(mut by_invoke: Vec<&Read>) -> Vec<(&Read, &Read)> {
    by_invoke.sort_by_key(|read| (read.invoke_ns, read.index));
    let mut by_complete = by_invoke.clone();
    by_complete.sort_by_key(|read| (read.complete_ns, read.index));
    let mut found = Vec::new();
    for read in &by_invoke {
        let before =
            by_complete.partition_point(|candidate| candidate.complete_ns < read.invoke_ns);
        let floor = by_complete[..before]
            .iter()
            .copied()
            .max_by_key(|candidate| (candidate.version, std::cmp::Reverse(candidate.index)));
        if let Some(floor) = floor.filter(|floor| read.version < floor.version) {
            found.push((floor, *read));
        }
    }
    found
}

impl std::fmt::Display for MonotonicAnomaly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MonotonicAnomaly::Backwards {
                node,
                lifetime,
                key,
                earlier,
                earlier_version,
                later,
                later_version,
            } => {
                write!(f, "backwards: node {node}")?;
                if let Some(lifetime) = lifetime {
                    write!(f, " (lifetime {lifetime})")?;
                }
                write!(
                    f,
                    ", key {key:?}: read #{later} returned version {later_version} after read #{earlier} had returned {earlier_version}"
                )
            }
            MonotonicAnomaly::VersionValueMismatch {
                node,
                key,
                first,
                second,
                version,
            } => write!(
                f,
                "version {version} of key {key:?} on node {node} came with two values (reads #{first} and #{second})"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Operation;

    fn read(node: i64, version: i64, invoke_ns: u64, complete_ns: u64) -> Operation {
        Operation {
            process: 0,
            op: OpKind::Read,
            key: "r".into(),
            input: Value::Int(node),
            output: Value::List(vec![
                Value::Int(version),
                if version == 0 {
                    Value::Null
                } else {
                    Value::Int(version * 10)
                },
            ]),
            outcome: Outcome::Ok,
            invoke_ns,
            complete_ns: Some(complete_ns),
        }
    }

    fn run(operations: Vec<Operation>) -> MonotonicReport {
        check(&History::new(operations).unwrap()).unwrap()
    }

    #[test]
    fn a_node_whose_reads_only_move_forward_passes() {
        // Node 0 moves 0 -> 3 -> 5; node 1 lags at 2 (another node may lag);
        // an overlapping read on node 0 returning 3 after 5 was served is
        // allowed (overlapping reads are not ordered).
        let report = run(vec![
            read(0, 0, 0, 1),
            read(0, 3, 2, 3),
            read(0, 5, 4, 6),
            read(0, 3, 5, 7),
            read(1, 2, 8, 9),
            read(0, 5, 10, 11),
        ]);
        assert_eq!(report.verdict, Verdict::Valid, "{report:?}");
        assert_eq!((report.reads, report.series), (6, 2));
    }

    #[test]
    fn a_node_going_back_to_an_older_version_is_reported() {
        // Node 0 returned version 5, then (strictly later) version 3.
        let report = run(vec![
            read(0, 3, 0, 1),
            read(0, 5, 2, 3),
            read(1, 7, 3, 4),
            read(0, 3, 4, 5),
        ]);
        assert_eq!(report.verdict, Verdict::Invalid);
        assert_eq!(
            report.anomalies,
            vec![MonotonicAnomaly::Backwards {
                node: 0,
                lifetime: None,
                key: "r".into(),
                earlier: 1,
                earlier_version: 5,
                later: 3,
                later_version: 3,
            }]
        );
    }

    #[test]
    fn a_node_forgetting_a_key_is_reported() {
        // Present at version 4, then absent (version 0) on the same node.
        let report = run(vec![read(2, 4, 0, 1), read(2, 0, 2, 3)]);
        assert_eq!(report.verdict, Verdict::Invalid);
        assert!(matches!(
            report.anomalies[0],
            MonotonicAnomaly::Backwards {
                later_version: 0,
                ..
            }
        ));
    }

    #[test]
    fn going_back_after_a_failed_read_is_reported() {
        // Node 0 served 5, then did not answer (killed: a failed read), then after
        // its restart served 2: going backwards, reported (a restarted node waits
        // to catch up before it serves eventual reads). It then served 4 and 3.
        let mut down = read(0, 0, 3, 4);
        down.outcome = Outcome::Fail;
        down.output = Value::Null;
        let report = run(vec![
            read(0, 5, 0, 1),
            down,
            read(0, 2, 5, 6),
            read(0, 4, 7, 8),
            read(0, 3, 9, 10),
        ]);
        assert_eq!(report.verdict, Verdict::Invalid, "{report:?}");
        let later: Vec<usize> = report
            .anomalies
            .iter()
            .map(|a| match a {
                MonotonicAnomaly::Backwards { later, .. } => *later,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(later, vec![2, 3, 4], "{report:?}");
    }

    /// An eventual read on `node` in its `lifetime`, as the workload records it.
    fn read_in(
        node: i64,
        lifetime: i64,
        version: i64,
        invoke_ns: u64,
        complete_ns: u64,
    ) -> Operation {
        let mut operation = read(node, version, invoke_ns, complete_ns);
        operation.input = Value::List(vec![Value::Int(node), Value::Int(lifetime)]);
        operation
    }

    #[test]
    fn a_restart_no_read_saw_is_no_excuse_for_going_backwards() {
        // The seed-7 case: node 1 served version 85, was killed and restarted
        // while no read went to it, then served version 0 (replayed from its
        // disk, before the leader told it the commit index). Excused until the
        // contract closed that gap; reported now, naming the later read's lifetime.
        let report = run(vec![
            read_in(1, 1, 85, 0, 1),
            read_in(1, 2, 0, 5, 6),
            read_in(1, 2, 86, 7, 8),
        ]);
        assert_eq!(report.verdict, Verdict::Invalid, "{report:?}");
        assert_eq!((report.reads, report.series), (3, 1));
        assert_eq!(
            report.anomalies,
            vec![MonotonicAnomaly::Backwards {
                node: 1,
                lifetime: Some(2),
                key: "r".into(),
                earlier: 0,
                earlier_version: 85,
                later: 1,
                later_version: 0,
            }]
        );
    }

    #[test]
    fn within_one_recorded_lifetime_going_backwards_is_reported_even_across_failed_reads() {
        // One lifetime (the harness did not restart the node): a read that failed
        // in between (a partition, a timeout) does not excuse going back from 85 to 0.
        let mut failed = read_in(1, 1, 0, 2, 3);
        failed.outcome = Outcome::Info;
        failed.output = Value::Null;
        let report = run(vec![
            read_in(1, 1, 85, 0, 1),
            failed,
            read_in(1, 1, 0, 5, 6),
            read_in(2, 1, 0, 7, 8),
        ]);
        assert_eq!(report.verdict, Verdict::Invalid, "{report:?}");
        assert_eq!(
            report.anomalies,
            vec![MonotonicAnomaly::Backwards {
                node: 1,
                lifetime: Some(1),
                key: "r".into(),
                earlier: 0,
                earlier_version: 85,
                later: 2,
                later_version: 0,
            }]
        );
        assert_eq!(
            report.anomalies[0].to_string(),
            "backwards: node 1 (lifetime 1), key \"r\": read #2 returned version 0 after read #0 had returned 85"
        );
    }

    #[test]
    fn one_version_with_two_values_is_reported_across_lifetimes() {
        // A restart may serve older state, never a different value for one version.
        let mut other_value = read_in(0, 2, 5, 2, 3);
        other_value.output = Value::List(vec![Value::Int(5), Value::Int(7)]);
        let report = run(vec![read_in(0, 1, 5, 0, 1), other_value]);
        assert_eq!(
            report.anomalies,
            vec![MonotonicAnomaly::VersionValueMismatch {
                node: 0,
                key: "r".into(),
                first: 0,
                second: 1,
                version: 5,
            }]
        );
    }

    #[test]
    fn malformed_eventual_reads_are_errors_not_verdicts() {
        // No node, or an output that is not [version value]: the history is unusable.
        let mut no_node = read(0, 1, 0, 1);
        no_node.input = Value::Null;
        assert!(matches!(
            check(&History::new(vec![no_node]).unwrap()),
            Err(Error::InvalidOperation { index: 0, .. })
        ));
        let mut bad_output = read(0, 1, 0, 1);
        bad_output.output = Value::Int(3);
        assert!(check(&History::new(vec![bad_output]).unwrap()).is_err());
        // A lifetime that is negative, missing or not an integer.
        for input in [
            Value::List(vec![Value::Int(0), Value::Int(-1)]),
            Value::List(vec![Value::Int(0)]),
            Value::List(vec![Value::Int(0), Value::Null]),
            Value::List(vec![Value::Int(0), Value::Int(1), Value::Int(2)]),
        ] {
            let mut bad_lifetime = read(0, 1, 0, 1);
            bad_lifetime.input = input;
            assert!(matches!(
                check(&History::new(vec![bad_lifetime]).unwrap()),
                Err(Error::InvalidOperation { index: 0, .. })
            ));
        }
    }
}
