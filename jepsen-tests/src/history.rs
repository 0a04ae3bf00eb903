//! Histories of client operations: the data model, its JSON-lines form, the
//! [`Recorder`] used by workloads, and loading from files (JSONL or Jepsen logs).
//!
//! One JSON line per operation, for example
//! `{"process":3,"op":"cas","key":"k1","input":[1,2],"output":null,"outcome":"ok","invoke_ns":1200,"complete_ns":1950}`.
//!
//! | `op`     | `input`                         | `output` (when `ok`)              |
//! | -------- | ------------------------------- | --------------------------------- |
//! | `read`   | `null`                          | the value read (`null` = absent)  |
//! | `write`  | the value written               | ignored                           |
//! | `cas`    | `[from, to]` (`from` may be `null` = absent) | ignored              |
//! | `delete` | `null`, or the expected value   | ignored                           |
//! | `append` | the element appended            | ignored                           |
//! | `add`    | the element added               | ignored                           |
//! | `restore`| the backup: `[[key, [elements]], ...]` (every key not named is empty) | ignored |
//! | `grant`  | the TTL asked for, in ms        | `[lease, revision]`               |
//! | `keepalive` | the lease                    | the TTL answered (`0`: the lease is gone) |
//! | `revoke` | the lease                       | the revision of the revoke        |
//! | `campaign` | the lease the election is created with | the token won (the create's version) |
//! | `fenced` | `[token, seq, stale]` (`stale` 1: the holder's one write after a pause) | the revision it applied at |
//! | `resign` | the token                       | the revision of the delete (`0`: nothing was stored) |
//! | `status` | `[uid, status key, value]`      | the version stored (a refusal's output names it: `not-found`, `cas-failure: ...`) |
//! | `finalize` | `[uid, version]`              | the version answered |
//!
//! The six from `grant` to `resign` are the election workload's ([`crate::election`]): a
//! refused `campaign` or `fenced` (`fail`) carries the node's message as output. `status` and
//! `finalize` are the lifecycle workload's ([`crate::lifecycle`]), whose `read`, `write` and
//! `delete` carry uids and versions too (see there).
//!
//! A `restore` (key `""`: it replaces every key at once) is the online restore of a
//! backup into a set history ([`crate::set`]). Its `info` completion time is when
//! the nemesis *settled* it (its driver was killed and a strong read succeeded
//! afterwards): an unknown restore took effect before then, or never.
//!
//! Outcomes: `ok` = took effect, `fail` = certainly did not take effect (for a
//! `cas` or a conditional `delete`: the compare was evaluated and failed),
//! `info` = unknown (a timeout, a lost connection). An operation without
//! `complete_ns` never completed and is indeterminate too. A workload whose CAS was
//! rejected *before* the compare ran (no leader, say) must record `info` (sound but
//! weaker) rather than `fail`.

mod jepsen_log;

use std::fmt;
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

use crate::Error;

/// A value read or written: `null`, an integer, a string, or a list of values.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Value {
    /// Absent / nil.
    #[default]
    Null,
    Int(i64),
    Str(String),
    List(Vec<Value>),
}

impl Value {
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The elements of a list; `null` counts as the empty list. `None` for scalars.
    pub fn as_list(&self) -> Option<&[Value]> {
        match self {
            Value::Null => Some(&[]),
            Value::List(items) => Some(items),
            Value::Int(_) | Value::Str(_) => None,
        }
    }
}

impl From<i64> for Value {
    fn from(value: i64) -> Self {
        Value::Int(value)
    }
}

impl From<&str> for Value {
    fn from(value: &str) -> Self {
        Value::Str(value.to_owned())
    }
}

impl From<String> for Value {
    fn from(value: String) -> Self {
        Value::Str(value)
    }
}

impl From<Vec<Value>> for Value {
    fn from(value: Vec<Value>) -> Self {
        Value::List(value)
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(value: Option<T>) -> Self {
        value.map_or(Value::Null, Into::into)
    }
}

/// Displayed in EDN style, as Jepsen prints values: `nil`, `3`, `"s"`, `[1 2]`.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("nil"),
            Value::Int(value) => write!(f, "{value}"),
            Value::Str(value) => write!(f, "{value:?}"),
            Value::List(items) => {
                f.write_str("[")?;
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        f.write_str(" ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
        }
    }
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => serializer.serialize_unit(),
            Value::Int(value) => serializer.serialize_i64(*value),
            Value::Str(value) => serializer.serialize_str(value),
            Value::List(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ValueVisitor;

        impl<'de> Visitor<'de> for ValueVisitor {
            type Value = Value;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("null, an integer, a string or a list of those")
            }

            fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
                Ok(Value::Null)
            }

            fn visit_none<E: de::Error>(self) -> Result<Value, E> {
                Ok(Value::Null)
            }

            fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
                Value::deserialize(deserializer)
            }

            fn visit_i64<E: de::Error>(self, value: i64) -> Result<Value, E> {
                Ok(Value::Int(value))
            }

            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Value, E> {
                i64::try_from(value)
                    .map(Value::Int)
                    .map_err(|_| E::custom(format!("integer {value} does not fit in i64")))
            }

            fn visit_str<E: de::Error>(self, value: &str) -> Result<Value, E> {
                Ok(Value::Str(value.to_owned()))
            }

            fn visit_string<E: de::Error>(self, value: String) -> Result<Value, E> {
                Ok(Value::Str(value))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Value::List(items))
            }
        }

        deserializer.deserialize_any(ValueVisitor)
    }
}

/// The kind of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    Read,
    Write,
    Cas,
    Delete,
    Append,
    Add,
    Restore,
    /// Election workload ([`crate::election`]): a lease granted.
    Grant,
    /// Election workload: one keep-alive of a lease.
    #[serde(rename = "keepalive")]
    KeepAlive,
    /// Election workload: a lease revoked by its owner.
    Revoke,
    /// Election workload: the create-only write of the election resource.
    Campaign,
    /// Election workload: a write under a fencing token.
    Fenced,
    /// Election workload: the holder deletes the election resource.
    Resign,
    /// Lifecycle workload ([`crate::lifecycle`]): a status write without a version.
    Status,
    /// Lifecycle workload: the write removing a marked lifetime's last finalizer.
    Finalize,
}

impl OpKind {
    /// Whether this is one of the election workload's kinds, which only its checker reads.
    pub fn is_election(self) -> bool {
        matches!(
            self,
            OpKind::Grant
                | OpKind::KeepAlive
                | OpKind::Revoke
                | OpKind::Campaign
                | OpKind::Fenced
                | OpKind::Resign
        )
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::Cas => "cas",
            OpKind::Delete => "delete",
            OpKind::Append => "append",
            OpKind::Add => "add",
            OpKind::Restore => "restore",
            OpKind::Grant => "grant",
            OpKind::KeepAlive => "keepalive",
            OpKind::Revoke => "revoke",
            OpKind::Campaign => "campaign",
            OpKind::Fenced => "fenced",
            OpKind::Resign => "resign",
            OpKind::Status => "status",
            OpKind::Finalize => "finalize",
        })
    }
}

/// How an operation ended, as the client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// It took effect.
    Ok,
    /// It certainly did not take effect (for a CAS: the compare failed).
    Fail,
    /// Unknown: it may have taken effect at any time after its invocation, or never.
    Info,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::Ok => "ok",
            Outcome::Fail => "fail",
            Outcome::Info => "info",
        })
    }
}

/// One client operation, from invocation to completion.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    /// The logical client that issued it (informational; at most one operation of a
    /// process is expected in flight).
    pub process: u64,
    pub op: OpKind,
    /// The key (register, resource name, set or list name). Keys are independent.
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub input: Value,
    #[serde(default)]
    pub output: Value,
    pub outcome: Outcome,
    /// When the client invoked it, in nanoseconds of one monotonic clock shared by the
    /// whole history (for Jepsen logs: the 1-based line number).
    pub invoke_ns: u64,
    /// When the client saw it complete; `None` if it never did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete_ns: Option<u64>,
}

impl Operation {
    /// True when the operation may or may not have taken effect: `info`, or no
    /// completion at all.
    pub fn is_indeterminate(&self) -> bool {
        self.outcome == Outcome::Info || self.complete_ns.is_none()
    }

    fn validate(&self, index: usize) -> Result<(), Error> {
        match (self.outcome, self.complete_ns) {
            (Outcome::Ok | Outcome::Fail, None) => Err(Error::InvalidOperation {
                index,
                reason: format!("outcome {} needs complete_ns", self.outcome),
            }),
            (_, Some(complete_ns)) if complete_ns < self.invoke_ns => {
                Err(Error::InvalidOperation {
                    index,
                    reason: format!(
                        "complete_ns {complete_ns} is before invoke_ns {}",
                        self.invoke_ns
                    ),
                })
            }
            _ => Ok(()),
        }
    }
}

/// `process 3 cas "k1" [1 2] -> ok` (plus the output of reads and the times).
impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "process {} {} {:?}", self.process, self.op, self.key)?;
        if self.op != OpKind::Read || !self.input.is_null() {
            write!(f, " {}", self.input)?;
        }
        write!(f, " -> {}", self.outcome)?;
        if self.op == OpKind::Read && self.outcome == Outcome::Ok {
            write!(f, " {}", self.output)?;
        }
        match self.complete_ns {
            Some(complete_ns) => write!(f, " [{}..{}]", self.invoke_ns, complete_ns),
            None => write!(f, " [{}..never]", self.invoke_ns),
        }
    }
}

/// The file formats a history can be read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One JSON [`Operation`] per line.
    Jsonl,
    /// Jepsen's event log (`INFO  jepsen.util - PROCESS :TYPE :F VALUE`, tabs
    /// or spaces) or EDN operation maps (`{:type :ok, :f :read, ...}`).
    JepsenLog,
}

impl Format {
    /// Guesses the format from the text: JSON lines start with `{"`; anything
    /// else (EDN maps `{:type ...}` included) is a Jepsen log.
    pub fn detect(text: &str) -> Format {
        let first = text.lines().map(str::trim).find(|line| !line.is_empty());
        match first {
            Some(line)
                if line
                    .strip_prefix('{')
                    .is_some_and(|rest| rest.trim_start().starts_with('"')) =>
            {
                Format::Jsonl
            }
            _ => Format::JepsenLog,
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Jsonl => "jsonl",
            Format::JepsenLog => "jepsen-log",
        })
    }
}

/// A validated list of operations. Order is not significant to the checkers;
/// operation indices in reports refer to this order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    operations: Vec<Operation>,
}

impl History {
    /// Validates every operation (see the crate invariants).
    pub fn new(operations: Vec<Operation>) -> Result<Self, Error> {
        for (index, operation) in operations.iter().enumerate() {
            operation.validate(index)?;
        }
        Ok(History { operations })
    }

    pub fn operations(&self) -> &[Operation] {
        &self.operations
    }

    pub fn into_operations(self) -> Vec<Operation> {
        self.operations
    }

    pub fn len(&self) -> usize {
        self.operations.len()
    }

    pub fn is_empty(&self) -> bool {
        self.operations.is_empty()
    }

    /// Parses JSON lines; blank lines are skipped.
    pub fn from_jsonl_str(text: &str) -> Result<Self, Error> {
        let mut operations = Vec::new();
        for (line_index, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let operation: Operation =
                serde_json::from_str(line).map_err(|error| Error::Parse {
                    line: line_index + 1,
                    reason: error.to_string(),
                })?;
            operation
                .validate(operations.len())
                .map_err(|error| Error::Parse {
                    line: line_index + 1,
                    reason: error.to_string(),
                })?;
            operations.push(operation);
        }
        Ok(History { operations })
    }

    /// Reads JSON lines from a reader.
    pub fn from_jsonl_reader(mut reader: impl BufRead) -> Result<Self, Error> {
        let mut text = String::new();
        reader
            .read_to_string(&mut text)
            .map_err(|source| Error::Io {
                context: "reading a JSONL history".to_owned(),
                source,
            })?;
        Self::from_jsonl_str(&text)
    }

    /// Parses a Jepsen event log (see `testdata/porcupine-etcd/README.md`). All
    /// operations get the empty key; timestamps are 1-based line numbers; an
    /// invocation without completion is indeterminate.
    pub fn from_jepsen_log(text: &str) -> Result<Self, Error> {
        let operations = jepsen_log::parse(text)?;
        Self::new(operations)
    }

    /// Parses text in the given format, or the detected one when `format` is `None`.
    pub fn parse(text: &str, format: Option<Format>) -> Result<(Self, Format), Error> {
        let format = format.unwrap_or_else(|| Format::detect(text));
        let history = match format {
            Format::Jsonl => Self::from_jsonl_str(text)?,
            Format::JepsenLog => Self::from_jepsen_log(text)?,
        };
        Ok((history, format))
    }

    /// Loads a history file in the given format, or the detected one.
    pub fn load(path: &Path, format: Option<Format>) -> Result<(Self, Format), Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Open {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, format)
    }

    /// Writes one JSON line per operation.
    pub fn write_jsonl(&self, mut writer: impl Write) -> Result<(), Error> {
        let io = |source| Error::Io {
            context: "writing a JSONL history".to_owned(),
            source,
        };
        for operation in &self.operations {
            serde_json::to_writer(&mut writer, operation).map_err(|error| io(error.into()))?;
            writer.write_all(b"\n").map_err(io)?;
        }
        writer.flush().map_err(io)
    }
}

/// Records operations from many tasks at once. Cheap to clone; every clone appends
/// to the same history. Timestamps are nanoseconds since the recorder was created.
#[derive(Clone, Debug)]
pub struct Recorder {
    inner: Arc<RecorderInner>,
}

#[derive(Debug)]
struct RecorderInner {
    start: Instant,
    operations: Mutex<Vec<Operation>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    pub fn new() -> Self {
        Recorder {
            inner: Arc::new(RecorderInner {
                start: Instant::now(),
                operations: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Nanoseconds since the recorder was created: the clock of every operation it records
    /// (the election workload stamps its watch events and fault windows with it too).
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.inner.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// When the recorder was created: time 0 of [`Recorder::now_ns`].
    pub fn started(&self) -> Instant {
        self.inner.start
    }

    /// Notes the invocation time of an operation; call this right before sending
    /// the request. Nothing is locked until the operation completes (or its handle
    /// is dropped, which records it as never completed).
    pub fn invoke(
        &self,
        process: u64,
        op: OpKind,
        key: impl Into<String>,
        input: Value,
    ) -> OpHandle {
        let invoke_ns = self.now_ns();
        OpHandle {
            recorder: self.clone(),
            pending: Some(Operation {
                process,
                op,
                key: key.into(),
                input,
                output: Value::Null,
                outcome: Outcome::Info,
                invoke_ns,
                complete_ns: None,
            }),
        }
    }

    fn push(&self, operation: Operation) {
        self.inner.operations.lock().push(operation);
    }

    /// Number of operations recorded so far (completed or abandoned).
    pub fn len(&self) -> usize {
        self.inner.operations.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A snapshot of everything recorded so far, ordered by invocation time.
    /// Operations still in flight are not included.
    pub fn history(&self) -> History {
        let mut operations = self.inner.operations.lock().clone();
        operations.sort_by_key(|operation| (operation.invoke_ns, operation.process));
        for operation in &operations {
            // Paired with Operation::validate: the recorder only produces valid ones.
            assert!(operation
                .complete_ns
                .is_none_or(|complete_ns| complete_ns >= operation.invoke_ns));
            assert!(operation.complete_ns.is_some() || operation.outcome == Outcome::Info);
        }
        History { operations }
    }
}

/// An operation in flight. Complete it with [`OpHandle::complete`]; dropping it
/// instead records the operation as never completed (indeterminate).
#[derive(Debug)]
#[must_use = "an operation handle must be completed; dropping it records the operation as indeterminate"]
pub struct OpHandle {
    recorder: Recorder,
    pending: Option<Operation>,
}

impl OpHandle {
    /// Records the completion, timestamped now; call right after the reply arrives.
    pub fn complete(mut self, outcome: Outcome, output: Value) {
        let complete_ns = self.recorder.now_ns();
        if let Some(mut operation) = self.pending.take() {
            operation.outcome = outcome;
            operation.output = output;
            operation.complete_ns = Some(complete_ns.max(operation.invoke_ns));
            self.recorder.push(operation);
        }
    }

    /// Shorthand for `complete(Outcome::Ok, output)`.
    pub fn ok(self, output: Value) {
        self.complete(Outcome::Ok, output);
    }

    /// Shorthand for `complete(Outcome::Fail, Value::Null)`.
    pub fn fail(self) {
        self.complete(Outcome::Fail, Value::Null);
    }

    /// Shorthand for `complete(Outcome::Info, Value::Null)`.
    pub fn info(self) {
        self.complete(Outcome::Info, Value::Null);
    }
}

impl Drop for OpHandle {
    fn drop(&mut self) {
        if let Some(operation) = self.pending.take() {
            self.recorder.push(operation);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_round_trips_through_jsonl() {
        // Writes a history as JSON lines and reads it back unchanged.
        let history = History::new(vec![
            Operation {
                process: 1,
                op: OpKind::Cas,
                key: "k".into(),
                input: Value::List(vec![Value::Null, Value::Int(2)]),
                output: Value::Null,
                outcome: Outcome::Ok,
                invoke_ns: 10,
                complete_ns: Some(20),
            },
            Operation {
                process: 2,
                op: OpKind::Read,
                key: "k".into(),
                input: Value::Null,
                output: Value::List(vec!["a".into(), Value::Int(-3)]),
                outcome: Outcome::Info,
                invoke_ns: 15,
                complete_ns: None,
            },
        ])
        .unwrap();
        let mut bytes = Vec::new();
        history.write_jsonl(&mut bytes).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert_eq!(Format::detect(&text), Format::Jsonl);
        assert_eq!(History::from_jsonl_str(&text).unwrap(), history);
    }

    #[test]
    fn jsonl_rejects_ok_without_completion_and_time_travel() {
        // An ok operation needs complete_ns, and complete_ns cannot precede invoke_ns.
        let missing = r#"{"process":1,"op":"write","input":1,"outcome":"ok","invoke_ns":5}"#;
        assert!(matches!(
            History::from_jsonl_str(missing),
            Err(Error::Parse { line: 1, .. })
        ));
        let backwards =
            r#"{"process":1,"op":"write","input":1,"outcome":"ok","invoke_ns":5,"complete_ns":4}"#;
        assert!(matches!(
            History::from_jsonl_str(backwards),
            Err(Error::Parse { line: 1, .. })
        ));
        let float = r#"{"process":1,"op":"write","input":1.5,"outcome":"ok","invoke_ns":5,"complete_ns":6}"#;
        assert!(History::from_jsonl_str(float).is_err());
    }

    #[test]
    fn recorder_records_completed_and_abandoned_operations() {
        // Completed handles record their outcome; a dropped handle records "never completed".
        let recorder = Recorder::new();
        let other = recorder.clone();
        let write = recorder.invoke(0, OpKind::Write, "x", Value::Int(1));
        let read = other.invoke(1, OpKind::Read, "x", Value::Null);
        write.ok(Value::Null);
        drop(read);
        let history = recorder.history();
        assert_eq!(history.len(), 2);
        let write = history
            .operations()
            .iter()
            .find(|op| op.op == OpKind::Write)
            .unwrap();
        assert_eq!(write.outcome, Outcome::Ok);
        assert!(write.complete_ns.unwrap() >= write.invoke_ns);
        let read = history
            .operations()
            .iter()
            .find(|op| op.op == OpKind::Read)
            .unwrap();
        assert_eq!(read.outcome, Outcome::Info);
        assert_eq!(read.complete_ns, None);
        assert!(read.is_indeterminate());
    }

    #[test]
    fn recorder_is_usable_from_many_threads() {
        // Many threads record through clones of one recorder; nothing is lost.
        let recorder = Recorder::new();
        std::thread::scope(|scope| {
            for process in 0..4u64 {
                let recorder = recorder.clone();
                scope.spawn(move || {
                    for value in 0..100 {
                        recorder
                            .invoke(process, OpKind::Add, "s", Value::Int(value))
                            .ok(Value::Null);
                    }
                });
            }
        });
        assert_eq!(recorder.len(), 400);
        assert_eq!(recorder.history().len(), 400);
    }
}
