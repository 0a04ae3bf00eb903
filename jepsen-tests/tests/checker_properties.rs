//! Property tests of the checkers.
//!
//! - Histories generated from a real sequential execution, with random overlapping
//!   invoke/complete windows around each linearization point, random timeouts and
//!   failures, are accepted by the register and key-value models.
//! - The same histories with one read altered so that it becomes impossible are
//!   rejected, and the report names that read as the first operation that cannot be
//!   linearized.
//! - On tiny random histories (arbitrary outputs), the checker agrees with a naive
//!   search over every ordering.
//! - Set and append histories from a sequential execution are valid; dropping an
//!   acknowledged element from the final read makes them invalid.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::sample::Index;

use jepsen_tests::linearizability::{CheckOptions, KeyOutcome};
use jepsen_tests::models::{self, ModelKind};
use jepsen_tests::{append, set, History, OpKind, Operation, Outcome, Value, Verdict};

/// A value no generated operation ever writes.
const NEVER_WRITTEN: i64 = 99;
/// Spacing of linearization points; windows reach up to 4 points either side.
const SPACING_NS: u64 = 10;

/// One generated operation: key, kind selector, two small arguments, how far its
/// window extends before and after its linearization point, and its fate
/// (selects timeouts and failures).
type Step = (u8, u8, u8, u8, u64, u64, u8);

fn steps(max_len: usize) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0u8..3, 0u8..4, 0u8..5, 1u8..5, 0u64..40, 0u64..40, 0u8..10),
        1..max_len,
    )
}

fn int(value: u8) -> Value {
    Value::Int(i64::from(value))
}

/// Runs the steps sequentially against a map and records what clients would see.
/// Every operation that takes effect does so at its linearization point, inside its
/// window, so the history is linearizable by construction.
fn sequential_history(steps: &[Step], with_deletes: bool) -> Vec<Operation> {
    let mut map: BTreeMap<String, Value> = BTreeMap::new();
    let mut operations = Vec::with_capacity(steps.len());
    for (position, &(key, kind, a, b, before_ns, after_ns, fate)) in steps.iter().enumerate() {
        let key = format!("k{key}");
        let point_ns = SPACING_NS * (position as u64 + 1);
        let invoke_ns = point_ns.saturating_sub(before_ns);
        let complete_ns = point_ns + after_ns;
        let current = map.get(&key).cloned().unwrap_or(Value::Null);
        // fate 0: timed out after taking effect; 1: timed out without taking effect;
        // 2: failed (for plain writes); otherwise acknowledged.
        let (op, input, applied, outcome) = match kind % if with_deletes { 4 } else { 3 } {
            0 => (
                OpKind::Read,
                Value::Null,
                None,
                if fate == 0 {
                    Outcome::Info
                } else {
                    Outcome::Ok
                },
            ),
            1 => {
                let outcome = match fate {
                    0 | 1 => Outcome::Info,
                    2 => Outcome::Fail,
                    _ => Outcome::Ok,
                };
                (
                    OpKind::Write,
                    int(b),
                    (fate == 0 || fate > 2).then(|| int(b)),
                    outcome,
                )
            }
            2 => {
                // Half of the time compare against the current value, so that CAS succeeds.
                let from = if a % 2 == 0 { current.clone() } else { int(a) };
                let input = Value::List(vec![from.clone(), int(b)]);
                if from == current {
                    match fate {
                        0 => (OpKind::Cas, input, Some(int(b)), Outcome::Info),
                        1 => (OpKind::Cas, input, None, Outcome::Info),
                        _ => (OpKind::Cas, input, Some(int(b)), Outcome::Ok),
                    }
                } else {
                    let outcome = if fate == 0 {
                        Outcome::Info
                    } else {
                        Outcome::Fail
                    };
                    (OpKind::Cas, input, None, outcome)
                }
            }
            _ => {
                let outcome = match fate {
                    0 | 1 => Outcome::Info,
                    2 => Outcome::Fail,
                    _ => Outcome::Ok,
                };
                (
                    OpKind::Delete,
                    Value::Null,
                    (fate == 0 || fate > 2).then_some(Value::Null),
                    outcome,
                )
            }
        };
        let output = if op == OpKind::Read && outcome == Outcome::Ok {
            current
        } else {
            Value::Null
        };
        if let Some(value) = applied {
            map.insert(key.clone(), value);
        }
        // Some timeouts are seen by the client, others never complete.
        let complete_ns = if outcome == Outcome::Info && before_ns % 2 == 0 {
            None
        } else {
            Some(complete_ns)
        };
        operations.push(Operation {
            process: position as u64 % 7,
            op,
            key,
            input,
            output,
            outcome,
            invoke_ns,
            complete_ns,
        });
    }
    operations
}

fn verdict(operations: &[Operation], kind: ModelKind) -> (Verdict, Option<usize>) {
    let history = History::new(operations.to_vec()).unwrap();
    let report = models::check(&history, kind, &CheckOptions::default()).unwrap();
    let failing = report
        .failures()
        .next()
        .map(|(_, prefix)| prefix.failing_operation);
    (report.verdict, failing)
}

fn ok_reads(operations: &[Operation]) -> Vec<usize> {
    (0..operations.len())
        .filter(|&index| {
            operations[index].op == OpKind::Read && operations[index].outcome == Outcome::Ok
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn sequential_executions_with_random_overlaps_are_linearizable(steps in steps(60)) {
        // Any history produced by a real sequential execution is accepted, in any order.
        let register = sequential_history(&steps, false);
        prop_assert_eq!(verdict(&register, ModelKind::Register).0, Verdict::Valid);
        let kv = sequential_history(&steps, true);
        prop_assert_eq!(verdict(&kv, ModelKind::KeyValue).0, Verdict::Valid);
        let reversed: Vec<Operation> = kv.into_iter().rev().collect();
        prop_assert_eq!(verdict(&reversed, ModelKind::KeyValue).0, Verdict::Valid);
    }

    #[test]
    fn read_of_a_never_written_value_is_rejected_and_named(steps in steps(60), pick in any::<Index>()) {
        // Altering one read to a value nobody wrote makes the history illegal at that read.
        for (with_deletes, kind) in [(false, ModelKind::Register), (true, ModelKind::KeyValue)] {
            let mut operations = sequential_history(&steps, with_deletes);
            let reads = ok_reads(&operations);
            if reads.is_empty() {
                continue;
            }
            let altered = reads[pick.index(reads.len())];
            operations[altered].output = Value::Int(NEVER_WRITTEN);
            prop_assert_eq!(verdict(&operations, kind), (Verdict::Invalid, Some(altered)));
        }
    }

    #[test]
    fn stale_nil_read_after_an_acknowledged_write_is_rejected(steps in steps(60), pick in any::<Index>()) {
        // Without deletes nothing writes nil again: reading nil after an acknowledged
        // write or successful cas of the key completed is impossible.
        let mut operations = sequential_history(&steps, false);
        let candidates: Vec<usize> = ok_reads(&operations)
            .into_iter()
            .filter(|&read| {
                let (key, invoke_ns) = (&operations[read].key, operations[read].invoke_ns);
                operations.iter().any(|op| {
                    op.key == *key
                        && matches!(op.op, OpKind::Write | OpKind::Cas)
                        && op.outcome == Outcome::Ok
                        && op.complete_ns.is_some_and(|complete_ns| complete_ns < invoke_ns)
                })
            })
            .collect();
        prop_assume!(!candidates.is_empty());
        let altered = candidates[pick.index(candidates.len())];
        operations[altered].output = Value::Null;
        prop_assert_eq!(verdict(&operations, ModelKind::Register), (Verdict::Invalid, Some(altered)));
    }
}

/// One tiny random operation on a single key: kind, two values (0 = nil), an
/// outcome selector, invoke time, duration, and whether an `info` ever completes.
type TinyStep = (u8, u8, u8, u8, u64, u64, bool);

fn tiny_value(selector: u8) -> Value {
    if selector == 0 {
        Value::Null
    } else {
        int(selector)
    }
}

fn tiny_history(steps: &[TinyStep]) -> Vec<Operation> {
    steps
        .iter()
        .enumerate()
        .map(
            |(position, &(kind, a, b, outcome, invoke_ns, duration_ns, completes))| {
                let outcome = match outcome % 3 {
                    0 => Outcome::Ok,
                    1 => Outcome::Fail,
                    _ => Outcome::Info,
                };
                let (op, input, output) = match kind % 4 {
                    0 => (OpKind::Read, Value::Null, tiny_value(a)),
                    1 => (OpKind::Write, tiny_value(a.max(1)), Value::Null),
                    2 => (
                        OpKind::Cas,
                        Value::List(vec![tiny_value(a), tiny_value(b.max(1))]),
                        Value::Null,
                    ),
                    _ => (
                        OpKind::Delete,
                        if b % 2 == 0 {
                            Value::Null
                        } else {
                            tiny_value(a)
                        },
                        Value::Null,
                    ),
                };
                let complete_ns =
                    (outcome != Outcome::Info || completes).then_some(invoke_ns + duration_ns);
                Operation {
                    process: position as u64,
                    op,
                    key: String::new(),
                    input,
                    output,
                    outcome,
                    invoke_ns,
                    complete_ns,
                }
            },
        )
        .collect()
}

/// The possible states after `op` in `state` under the key-value semantics
/// (written independently of the checker's model).
fn naive_step(state: &Value, op: &Operation) -> Vec<Value> {
    let compare_and_set = |from: &Value, to: &Value| match op.outcome {
        Outcome::Ok if state == from => vec![to.clone()],
        Outcome::Fail if state != from => vec![state.clone()],
        Outcome::Info => vec![if state == from {
            to.clone()
        } else {
            state.clone()
        }],
        _ => vec![],
    };
    match (op.op, &op.input) {
        (OpKind::Read, _) => {
            if *state == op.output {
                vec![state.clone()]
            } else {
                vec![]
            }
        }
        (OpKind::Write, value) => vec![value.clone()],
        (OpKind::Delete, Value::Null) => vec![Value::Null],
        (OpKind::Delete, expected) => compare_and_set(expected, &Value::Null),
        (OpKind::Cas, Value::List(pair)) => compare_and_set(&pair[0], &pair[1]),
        _ => unreachable!("generated histories hold only these operations"),
    }
}

/// Tries every order of every subset containing all determinate operations.
fn naive_linearizable(operations: &[Operation]) -> bool {
    // Reads that did not succeed, and writes or unconditional deletes that failed,
    // constrain nothing.
    let relevant: Vec<&Operation> = operations
        .iter()
        .filter(|op| match op.op {
            OpKind::Read => op.outcome == Outcome::Ok,
            OpKind::Write => op.outcome != Outcome::Fail,
            OpKind::Delete if op.input.is_null() => op.outcome != Outcome::Fail,
            _ => true,
        })
        .collect();
    let returns: Vec<Option<u64>> = relevant
        .iter()
        .map(|op| {
            if op.is_indeterminate() {
                None
            } else {
                op.complete_ns
            }
        })
        .collect();

    fn search(relevant: &[&Operation], returns: &[Option<u64>], done: u32, state: &Value) -> bool {
        let pending_determinate =
            (0..relevant.len()).any(|i| done & (1 << i) == 0 && returns[i].is_some());
        if !pending_determinate {
            return true;
        }
        for next in 0..relevant.len() {
            if done & (1 << next) != 0 {
                continue;
            }
            // `next` can go now only if no other pending operation returned before it was called.
            let blocked = (0..relevant.len()).any(|other| {
                other != next
                    && done & (1 << other) == 0
                    && returns[other].is_some_and(|return_ns| return_ns < relevant[next].invoke_ns)
            });
            if blocked {
                continue;
            }
            for after in naive_step(state, relevant[next]) {
                if search(relevant, returns, done | (1 << next), &after) {
                    return true;
                }
            }
        }
        false
    }

    search(&relevant, &returns, 0, &Value::Null)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn checker_agrees_with_a_naive_search_on_tiny_histories(
        steps in prop::collection::vec((0u8..4, 0u8..3, 0u8..3, 0u8..3, 0u64..12, 0u64..8, any::<bool>()), 1..8)
    ) {
        // Random outputs, windows and outcomes: both searches must reach the same verdict.
        let operations = tiny_history(&steps);
        let expected = if naive_linearizable(&operations) { Verdict::Valid } else { Verdict::Invalid };
        let history = History::new(operations.clone()).unwrap();
        let report = models::check(&history, ModelKind::KeyValue, &CheckOptions::default()).unwrap();
        prop_assert_eq!(report.verdict, expected, "history: {:#?}", operations);
        if let Some(KeyOutcome::NotLinearizable(prefix)) = report.keys.first().map(|key| &key.outcome) {
            prop_assert!(prefix.prefix_operations.contains(&prefix.failing_operation));
        }
    }
}

/// A sequential execution of adds (set) or appends (list) on a few keys, with reads
/// returning the state at their linearization point.
fn sequential_collection(steps: &[Step], op: OpKind) -> Vec<Operation> {
    let mut collections: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut operations = Vec::new();
    for (position, &(key, kind, _, _, before_ns, after_ns, fate)) in steps.iter().enumerate() {
        let key = format!("k{key}");
        let point_ns = SPACING_NS * (position as u64 + 1);
        let window = (
            point_ns.saturating_sub(before_ns),
            Some(point_ns + after_ns),
        );
        let collection = collections.entry(key.clone()).or_default();
        let (kind, input, output, outcome) = if kind == 0 {
            (
                OpKind::Read,
                Value::Null,
                Value::List(collection.clone()),
                Outcome::Ok,
            )
        } else {
            let element = Value::Int(position as i64);
            // fate 0: timed out after taking effect; 1: timed out, never applied; 2: failed.
            if fate == 0 || fate > 2 {
                collection.push(element.clone());
            }
            let outcome = match fate {
                0 | 1 => Outcome::Info,
                2 => Outcome::Fail,
                _ => Outcome::Ok,
            };
            (op, element, Value::Null, outcome)
        };
        let complete_ns = if outcome == Outcome::Info && before_ns % 2 == 0 {
            None
        } else {
            window.1
        };
        operations.push(Operation {
            process: position as u64 % 5,
            op: kind,
            key: key.clone(),
            input,
            output,
            outcome,
            invoke_ns: window.0,
            complete_ns,
        });
    }
    // A final read of every key, after everything completed.
    let end_ns = SPACING_NS * (steps.len() as u64 + 10);
    for (key, collection) in collections {
        operations.push(Operation {
            process: 99,
            op: OpKind::Read,
            key,
            input: Value::Null,
            output: Value::List(collection),
            outcome: Outcome::Ok,
            invoke_ns: end_ns,
            complete_ns: Some(end_ns + 1),
        });
    }
    operations
}

/// Removes one acknowledged element from the final read of its key.
fn drop_acknowledged(operations: &mut [Operation], pick: Index) -> bool {
    let acknowledged: Vec<usize> = (0..operations.len())
        .filter(|&index| {
            operations[index].op != OpKind::Read && operations[index].outcome == Outcome::Ok
        })
        .collect();
    if acknowledged.is_empty() {
        return false;
    }
    let victim = operations[acknowledged[pick.index(acknowledged.len())]].clone();
    let final_read = operations
        .iter_mut()
        .filter(|op| op.op == OpKind::Read && op.key == victim.key)
        .max_by_key(|op| op.invoke_ns)
        .expect("every key has a final read");
    if let Value::List(items) = &mut final_read.output {
        items.retain(|item| *item != victim.input);
    }
    true
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn sequential_set_histories_are_valid_and_lost_adds_are_caught(steps in steps(60), pick in any::<Index>()) {
        // Reads of a real set are accepted; removing an acked element from the final read is caught.
        let mut operations = sequential_collection(&steps, OpKind::Add);
        let report = set::check(&History::new(operations.clone()).unwrap()).unwrap();
        prop_assert_eq!(report.verdict, Verdict::Valid, "{:?}", report);
        if drop_acknowledged(&mut operations, pick) {
            let report = set::check(&History::new(operations).unwrap()).unwrap();
            prop_assert_eq!(report.verdict, Verdict::Invalid);
        }
    }

    #[test]
    fn sequential_append_histories_are_valid_and_lost_appends_are_caught(steps in steps(60), pick in any::<Index>()) {
        // Reads of a real list are accepted; removing an acked element from the final read is caught.
        let mut operations = sequential_collection(&steps, OpKind::Append);
        let report = append::check(&History::new(operations.clone()).unwrap()).unwrap();
        prop_assert_eq!(report.verdict, Verdict::Valid, "{:?}", report);
        if drop_acknowledged(&mut operations, pick) {
            let report = append::check(&History::new(operations).unwrap()).unwrap();
            prop_assert_eq!(report.verdict, Verdict::Invalid);
        }
    }
}
