//! Sequential specifications for the linearizability checker, and the translation
//! of a [`History`] into one [`Partition`] per key.
//!
//! Both models treat each key as an independent register (P-compositionality):
//! - **register** (`ModelKind::Register`): `read`, `write`, `cas [from to]`. The
//!   register starts absent: a read returns `nil` until the first write.
//! - **key-value map** (`ModelKind::KeyValue`): the same per key, plus `delete`
//!   (input `nil` = unconditional; any other input = delete only if the key holds
//!   that value), after which reads return `nil` again.
//!
//! Outcome semantics, per operation:
//! - `read ok v`: the key held `v` (`nil` = absent). A `read` that is `fail` or
//!   `info` constrains nothing and is left out of the search.
//! - `write`/unconditional `delete`: `ok` took effect; `info` (or never completed)
//!   may take effect any time after its call, or never; `fail` did not happen and is
//!   left out.
//! - `cas [from to]` and conditional `delete`: `ok` = the key held `from` and now
//!   holds `to`; `fail` = the compare was evaluated and the key did not hold `from`
//!   (nothing changed); `info` = either, at any time after the call, or never.
//!
//! Values are interned per key, so the search state is one `u32`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::history::{History, OpKind, Outcome, Value};
use crate::linearizability::{self, CheckOptions, LinearizabilityReport, Model, Partition};
use crate::Error;

/// Which sequential specification to check against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// CAS register per key: read, write, cas.
    Register,
    /// Key-value map partitioned by key: read, write, cas, delete.
    KeyValue,
}

impl ModelKind {
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Register => "register",
            ModelKind::KeyValue => "kv",
        }
    }
}

impl fmt::Display for ModelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Interned value id of "absent" in every partition.
pub const ABSENT: u32 = 0;

/// Id that replaces, in one key, every value that no read returns and no compare
/// tests. Such values are indistinguishable to every operation of the key, so
/// merging them loses nothing and lets the search treat, say, all timed-out writes
/// of never-read values as one class of interchangeable operations.
pub const UNOBSERVED: u32 = u32::MAX;

/// What a CAS-like operation reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CasOutcome {
    /// The compare matched and the new value was stored.
    Succeeded,
    /// The compare was evaluated and did not match; nothing changed.
    Failed,
    /// Either of the above.
    Unknown,
}

/// One register operation, with values interned to ids of the partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegisterOp {
    /// Observed this value.
    Read { value: u32 },
    /// Unconditionally stored this value (an unconditional delete stores [`ABSENT`]).
    Write { value: u32 },
    /// Compare-and-set (a conditional delete has `to = ABSENT`).
    Cas {
        from: u32,
        to: u32,
        outcome: CasOutcome,
    },
}

/// The register specification for one key. Holds the key's value table so that
/// states can be rendered in reports.
#[derive(Clone, Debug)]
pub struct RegisterModel {
    values: Vec<Value>,
}

impl RegisterModel {
    /// The value behind an interned id.
    pub fn value(&self, id: u32) -> Option<&Value> {
        self.values.get(id as usize)
    }
}

impl Model for RegisterModel {
    type State = u32;
    type Op = RegisterOp;

    fn init(&self) -> u32 {
        ABSENT
    }

    fn step(&self, state: &u32, op: &RegisterOp) -> Option<u32> {
        match *op {
            RegisterOp::Read { value } => (value == *state).then_some(*state),
            RegisterOp::Write { value } => Some(value),
            RegisterOp::Cas { from, to, outcome } => match (from == *state, outcome) {
                (true, CasOutcome::Succeeded | CasOutcome::Unknown) => Some(to),
                (false, CasOutcome::Failed | CasOutcome::Unknown) => Some(*state),
                (true, CasOutcome::Failed) | (false, CasOutcome::Succeeded) => None,
            },
        }
    }

    fn is_blind(&self, op: &RegisterOp) -> bool {
        matches!(op, RegisterOp::Write { .. })
    }

    fn describe_state(&self, state: &u32) -> String {
        if *state == UNOBSERVED {
            return "<a value no read or compare observes>".to_owned();
        }
        self.value(*state)
            .map_or_else(|| format!("<value #{state}>"), ToString::to_string)
    }
}

/// Builds one partition per key. Operations that constrain nothing (reads that
/// failed or timed out, writes that certainly failed) are left out.
pub fn partitions(
    history: &History,
    kind: ModelKind,
) -> Result<Vec<Partition<RegisterModel>>, Error> {
    struct Builder {
        interned: HashMap<Value, u32>,
        values: Vec<Value>,
        ops: Vec<(usize, u64, Option<u64>, RegisterOp)>,
    }

    impl Builder {
        fn intern(&mut self, value: &Value, index: usize) -> Result<u32, Error> {
            if let Some(&id) = self.interned.get(value) {
                return Ok(id);
            }
            let id = u32::try_from(self.values.len()).map_err(|_| Error::InvalidOperation {
                index,
                reason: "too many distinct values for one key".to_owned(),
            })?;
            self.interned.insert(value.clone(), id);
            self.values.push(value.clone());
            Ok(id)
        }
    }

    let mut builders: BTreeMap<&str, Builder> = BTreeMap::new();
    for (index, operation) in history.operations().iter().enumerate() {
        let builder = builders
            .entry(operation.key.as_str())
            .or_insert_with(|| Builder {
                interned: HashMap::from([(Value::Null, ABSENT)]),
                values: vec![Value::Null],
                ops: Vec::new(),
            });
        let indeterminate = operation.is_indeterminate();
        let return_ns = if indeterminate {
            None
        } else {
            operation.complete_ns
        };
        let cas_outcome = match operation.outcome {
            _ if indeterminate => CasOutcome::Unknown,
            Outcome::Ok => CasOutcome::Succeeded,
            Outcome::Fail => CasOutcome::Failed,
            Outcome::Info => CasOutcome::Unknown,
        };
        let op = match operation.op {
            OpKind::Read => {
                if indeterminate || operation.outcome != Outcome::Ok {
                    continue;
                }
                RegisterOp::Read {
                    value: builder.intern(&operation.output, index)?,
                }
            }
            OpKind::Write => {
                if operation.outcome == Outcome::Fail {
                    continue;
                }
                RegisterOp::Write {
                    value: builder.intern(&operation.input, index)?,
                }
            }
            OpKind::Cas => {
                let Value::List(pair) = &operation.input else {
                    return Err(Error::InvalidOperation {
                        index,
                        reason: format!("cas input must be [from to], got {}", operation.input),
                    });
                };
                let [from, to] = pair.as_slice() else {
                    return Err(Error::InvalidOperation {
                        index,
                        reason: format!("cas input must be [from to], got {}", operation.input),
                    });
                };
                RegisterOp::Cas {
                    from: builder.intern(from, index)?,
                    to: builder.intern(to, index)?,
                    outcome: cas_outcome,
                }
            }
            OpKind::Delete if kind == ModelKind::KeyValue => {
                if operation.input.is_null() {
                    if operation.outcome == Outcome::Fail {
                        continue;
                    }
                    RegisterOp::Write { value: ABSENT }
                } else {
                    RegisterOp::Cas {
                        from: builder.intern(&operation.input, index)?,
                        to: ABSENT,
                        outcome: cas_outcome,
                    }
                }
            }
            OpKind::Delete
            | OpKind::Append
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
                    checker: kind.name(),
                    op: operation.op,
                });
            }
        };
        builder
            .ops
            .push((index, operation.invoke_ns, return_ns, op));
    }

    let mut partitions = Vec::with_capacity(builders.len());
    for (key, mut builder) in builders {
        let mut observed = vec![false; builder.values.len()];
        observed[ABSENT as usize] = true;
        for (_, _, _, op) in &builder.ops {
            match *op {
                RegisterOp::Read { value } => observed[value as usize] = true,
                RegisterOp::Cas { from, .. } => observed[from as usize] = true,
                RegisterOp::Write { .. } => {}
            }
        }
        let merge = |value: u32| {
            if observed[value as usize] {
                value
            } else {
                UNOBSERVED
            }
        };
        for (_, _, _, op) in &mut builder.ops {
            match op {
                RegisterOp::Write { value } => *value = merge(*value),
                RegisterOp::Cas { to, .. } => *to = merge(*to),
                RegisterOp::Read { .. } => {}
            }
        }
        let mut partition = Partition::new(
            key,
            RegisterModel {
                values: builder.values,
            },
        );
        for (index, call_ns, return_ns, op) in builder.ops {
            partition.push(index, call_ns, return_ns, op)?;
        }
        partitions.push(partition);
    }
    Ok(partitions)
}

/// Checks a history against the chosen model, one search per key.
pub fn check(
    history: &History,
    kind: ModelKind,
    options: &CheckOptions,
) -> Result<LinearizabilityReport, Error> {
    let partitions = partitions(history, kind)?;
    Ok(linearizability::check(partitions, options))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Operation;
    use crate::Verdict;

    fn op(
        process: u64,
        kind: OpKind,
        key: &str,
        input: Value,
        output: Value,
        outcome: Outcome,
        window: (u64, Option<u64>),
    ) -> Operation {
        Operation {
            process,
            op: kind,
            key: key.to_owned(),
            input,
            output,
            outcome,
            invoke_ns: window.0,
            complete_ns: window.1,
        }
    }

    fn pair(from: Value, to: Value) -> Value {
        Value::List(vec![from, to])
    }

    fn verdict(operations: Vec<Operation>, kind: ModelKind) -> Verdict {
        let history = History::new(operations).unwrap();
        check(&history, kind, &CheckOptions::default())
            .unwrap()
            .verdict
    }

    #[test]
    fn register_reads_nil_before_the_first_write() {
        // A fresh register is absent; reading a value nobody wrote is a violation.
        let ok = vec![op(
            0,
            OpKind::Read,
            "",
            Value::Null,
            Value::Null,
            Outcome::Ok,
            (0, Some(1)),
        )];
        assert_eq!(verdict(ok, ModelKind::Register), Verdict::Valid);
        let bad = vec![op(
            0,
            OpKind::Read,
            "",
            Value::Null,
            Value::Int(1),
            Outcome::Ok,
            (0, Some(1)),
        )];
        assert_eq!(verdict(bad, ModelKind::Register), Verdict::Invalid);
    }

    #[test]
    fn a_stale_cas_inside_a_write_is_seen_once_the_write_is_recorded_as_read_then_cas() {
        // The register holds 1. Process 0 writes 3 the workload's way: it
        // reads 1, then CASes 1 -> 3. Meanwhile process 1 CASes 1 -> 2 and is
        // acknowledged before process 0's CAS starts; a store that accepts
        // process 0's stale CAS anyway ends at 3, which a read then returns.
        // Recorded as a blind `write 3` this is linearizable (the write may
        // follow the CAS); recorded as the read and the CAS it was, the CAS
        // 1 -> 3 cannot succeed after 1 -> 2, so it is not.
        let prefix = |process_zero: Vec<Operation>| {
            let mut operations = vec![
                op(
                    2,
                    OpKind::Write,
                    "",
                    Value::Int(1),
                    Value::Null,
                    Outcome::Ok,
                    (0, Some(1)),
                ),
                op(
                    1,
                    OpKind::Cas,
                    "",
                    pair(Value::Int(1), Value::Int(2)),
                    Value::Null,
                    Outcome::Ok,
                    (4, Some(5)),
                ),
                op(
                    2,
                    OpKind::Read,
                    "",
                    Value::Null,
                    Value::Int(3),
                    Outcome::Ok,
                    (10, Some(11)),
                ),
            ];
            operations.extend(process_zero);
            operations
        };
        let blind = prefix(vec![op(
            0,
            OpKind::Write,
            "",
            Value::Int(3),
            Value::Null,
            Outcome::Ok,
            (2, Some(8)),
        )]);
        assert_eq!(verdict(blind, ModelKind::Register), Verdict::Valid);
        let read_then_cas = prefix(vec![
            op(
                0,
                OpKind::Read,
                "",
                Value::Null,
                Value::Int(1),
                Outcome::Ok,
                (2, Some(3)),
            ),
            op(
                0,
                OpKind::Cas,
                "",
                pair(Value::Int(1), Value::Int(3)),
                Value::Null,
                Outcome::Ok,
                (6, Some(8)),
            ),
        ]);
        assert_eq!(
            verdict(read_then_cas, ModelKind::Register),
            Verdict::Invalid
        );
    }

    #[test]
    fn failed_cas_proves_the_compare_did_not_match() {
        // A cas that failed while the register certainly held `from` is a violation.
        let write = op(
            0,
            OpKind::Write,
            "",
            Value::Int(1),
            Value::Null,
            Outcome::Ok,
            (0, Some(1)),
        );
        let failed_cas = op(
            1,
            OpKind::Cas,
            "",
            pair(Value::Int(1), Value::Int(2)),
            Value::Null,
            Outcome::Fail,
            (2, Some(3)),
        );
        assert_eq!(
            verdict(vec![write.clone(), failed_cas], ModelKind::Register),
            Verdict::Invalid
        );
        let cas = op(
            1,
            OpKind::Cas,
            "",
            pair(Value::Int(1), Value::Int(2)),
            Value::Null,
            Outcome::Ok,
            (2, Some(3)),
        );
        let read = op(
            2,
            OpKind::Read,
            "",
            Value::Null,
            Value::Int(2),
            Outcome::Ok,
            (4, Some(5)),
        );
        assert_eq!(
            verdict(vec![write, cas, read], ModelKind::Register),
            Verdict::Valid
        );
    }

    #[test]
    fn timed_out_cas_may_or_may_not_have_applied() {
        // An info cas explains a later read of its new value, and also its absence.
        for seen in [1, 2] {
            let history = vec![
                op(
                    0,
                    OpKind::Write,
                    "",
                    Value::Int(1),
                    Value::Null,
                    Outcome::Ok,
                    (0, Some(1)),
                ),
                op(
                    1,
                    OpKind::Cas,
                    "",
                    pair(Value::Int(1), Value::Int(2)),
                    Value::Null,
                    Outcome::Info,
                    (2, Some(3)),
                ),
                op(
                    2,
                    OpKind::Read,
                    "",
                    Value::Null,
                    Value::Int(seen),
                    Outcome::Ok,
                    (10, Some(11)),
                ),
            ];
            assert_eq!(verdict(history, ModelKind::Register), Verdict::Valid);
        }
    }

    #[test]
    fn kv_delete_makes_reads_nil_and_keys_are_independent() {
        // After a delete a key reads nil; another key keeps its value.
        let history = vec![
            op(
                0,
                OpKind::Write,
                "a",
                Value::Int(1),
                Value::Null,
                Outcome::Ok,
                (0, Some(1)),
            ),
            op(
                0,
                OpKind::Write,
                "b",
                Value::Int(5),
                Value::Null,
                Outcome::Ok,
                (2, Some(3)),
            ),
            op(
                0,
                OpKind::Delete,
                "a",
                Value::Null,
                Value::Null,
                Outcome::Ok,
                (4, Some(5)),
            ),
            op(
                1,
                OpKind::Read,
                "a",
                Value::Null,
                Value::Null,
                Outcome::Ok,
                (6, Some(7)),
            ),
            op(
                1,
                OpKind::Read,
                "b",
                Value::Null,
                Value::Int(5),
                Outcome::Ok,
                (8, Some(9)),
            ),
        ];
        assert_eq!(
            verdict(history.clone(), ModelKind::KeyValue),
            Verdict::Valid
        );
        let mut stale = history;
        stale[3].output = Value::Int(1);
        assert_eq!(verdict(stale, ModelKind::KeyValue), Verdict::Invalid);
    }

    #[test]
    fn kv_conditional_delete_compares_the_value() {
        // delete with an expected value acts like cas [expected nil].
        let history = vec![
            op(
                0,
                OpKind::Write,
                "a",
                Value::Int(1),
                Value::Null,
                Outcome::Ok,
                (0, Some(1)),
            ),
            op(
                0,
                OpKind::Delete,
                "a",
                Value::Int(2),
                Value::Null,
                Outcome::Fail,
                (2, Some(3)),
            ),
            op(
                0,
                OpKind::Delete,
                "a",
                Value::Int(1),
                Value::Null,
                Outcome::Ok,
                (4, Some(5)),
            ),
            op(
                1,
                OpKind::Read,
                "a",
                Value::Null,
                Value::Null,
                Outcome::Ok,
                (6, Some(7)),
            ),
        ];
        assert_eq!(
            verdict(history.clone(), ModelKind::KeyValue),
            Verdict::Valid
        );
        let mut wrong = history;
        wrong[2].outcome = Outcome::Fail;
        assert_eq!(verdict(wrong, ModelKind::KeyValue), Verdict::Invalid);
    }

    #[test]
    fn register_model_rejects_operations_it_cannot_interpret() {
        // delete is kv-only; append/add belong to other checkers; cas needs a pair.
        let delete = History::new(vec![op(
            0,
            OpKind::Delete,
            "",
            Value::Null,
            Value::Null,
            Outcome::Ok,
            (0, Some(1)),
        )])
        .unwrap();
        assert!(matches!(
            partitions(&delete, ModelKind::Register),
            Err(Error::UnsupportedOperation { .. })
        ));
        let append = History::new(vec![op(
            0,
            OpKind::Append,
            "",
            Value::Int(1),
            Value::Null,
            Outcome::Ok,
            (0, Some(1)),
        )])
        .unwrap();
        assert!(matches!(
            partitions(&append, ModelKind::KeyValue),
            Err(Error::UnsupportedOperation { .. })
        ));
        let bad_cas = History::new(vec![op(
            0,
            OpKind::Cas,
            "",
            Value::Int(1),
            Value::Null,
            Outcome::Ok,
            (0, Some(1)),
        )])
        .unwrap();
        assert!(matches!(
            partitions(&bad_cas, ModelKind::Register),
            Err(Error::InvalidOperation { index: 0, .. })
        ));
    }
}
