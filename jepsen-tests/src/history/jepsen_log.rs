//! Parser for Jepsen's event logs, in every layout Jepsen writes them:
//! - the logger's lines `INFO  jepsen.util - PROCESS :TYPE :F VALUE`, the
//!   columns separated by tabs or padded with spaces (both occur in Jepsen's
//!   own etcd logs), with or without a timestamp before the logger name;
//! - the same columns without the logger's prefix (only when the second
//!   column is an event type, so that other output is never taken for one);
//! - EDN operation maps, one per line, as in `history.edn`:
//!   `{:type :ok, :f :write, :value 3, :process 0, :time 12, :index 5}`
//!   (`:type`, `:f`, `:process` and `:value` are used, other keys ignored; a
//!   whole history's `[` and `]` are allowed around them).
//!
//! `:invoke` opens an operation of PROCESS; the next `:ok`, `:fail` or `:info` of
//! the same PROCESS completes it. Lines carrying no event (other log output) and
//! events of non-numeric processes (`:nemesis`) are skipped. Values are a small
//! EDN subset: `nil`, integers, strings, keywords (kept as strings with their
//! colon), vectors, lists and sets (as lists), maps (as lists of `[key value]`),
//! and other tokens (booleans, floats, symbols) kept as their text. A line that
//! carries an event but cannot be read is an error naming the line.

use std::collections::HashMap;

use super::{OpKind, Operation, Outcome, Value};
use crate::Error;

const MARKER: &str = "jepsen.util - ";

struct Pending {
    op: OpKind,
    input: Value,
    line: usize,
}

/// One event of the log, whatever its layout.
struct Event {
    /// `None` for events of non-client processes (`:nemesis`).
    process: Option<u64>,
    kind: String,
    function: String,
    value: Value,
}

const KINDS: [&str; 4] = [":invoke", ":ok", ":fail", ":info"];

/// The event on a line, `Ok(None)` for a line that carries none (other log
/// output). Layouts: `... jepsen.util - P :type :f VALUE` with its columns
/// separated by tabs or by any run of spaces; the same columns without the
/// logger's prefix; or an EDN operation map `{:type :ok, :f :write, :value 3,
/// :process 0, ...}`, possibly inside the `[` `]` of a whole history.
fn event_of_line(line: &str) -> Result<Option<Event>, String> {
    if let Some(marker_at) = line.find(MARKER) {
        return columns(&line[marker_at + MARKER.len()..]).map(Some);
    }
    let trimmed = line.trim();
    let map_text = trimmed.trim_start_matches('[').trim_start();
    if map_text.starts_with('{') {
        return map_event(map_text.trim_end_matches(']').trim_end()).map(Some);
    }
    // Bare columns: only when the second column is an event type, so that
    // other output is not mistaken for a broken event.
    let mut words = trimmed.split_whitespace();
    let looks_like_event = words
        .next()
        .is_some_and(|first| first.starts_with(':') || first.parse::<u64>().is_ok())
        && words.next().is_some_and(|kind| KINDS.contains(&kind));
    if looks_like_event {
        columns(trimmed).map(Some)
    } else {
        Ok(None)
    }
}

/// `PROCESS :type :f VALUE`, columns separated by any whitespace; the value
/// is the rest of the line.
fn columns(event: &str) -> Result<Event, String> {
    let mut rest = event.trim();
    let mut column = || {
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let (word, tail) = rest.split_at(end);
        rest = tail.trim_start();
        word
    };
    let process_field = column();
    let kind = column().to_owned();
    let function = column().to_owned();
    let process = match process_field.parse::<u64>() {
        Ok(process) => Some(process),
        // `:nemesis` and other non-client events carry no operation.
        Err(_) if process_field.starts_with(':') => None,
        Err(_) => return Err(format!("bad process {process_field:?}")),
    };
    let value = if process.is_some() {
        parse_value(rest)?
    } else {
        Value::Null
    };
    Ok(Event {
        process,
        kind,
        function,
        value,
    })
}

/// An EDN operation map: `:type`, `:f`, `:process` and `:value` are used,
/// other keys (`:time`, `:index`, `:error`, ...) are ignored.
fn map_event(text: &str) -> Result<Event, String> {
    let mut parser = ValueParser {
        bytes: text.trim_end_matches(',').as_bytes(),
        position: 0,
        depth: 0,
    };
    let entries = parser.map_entries()?;
    parser.skip_separators();
    if !parser.at_end() {
        return Err(format!("trailing text after the operation map in {text:?}"));
    }
    let field = |name: &str| {
        entries
            .iter()
            .find(|(key, _)| matches!(key, Value::Str(k) if k == name))
            .map(|(_, value)| value)
    };
    let keyword = |name: &str| match field(name) {
        Some(Value::Str(word)) if word.starts_with(':') => Ok(word.clone()),
        Some(other) => Err(format!("{name} must be a keyword, got {other}")),
        None => Err(format!("the operation map has no {name}")),
    };
    let process = match field(":process") {
        Some(Value::Int(process)) => {
            Some(u64::try_from(*process).map_err(|_| format!("bad process {process}"))?)
        }
        Some(Value::Str(word)) if word.starts_with(':') => None,
        Some(other) => return Err(format!("bad process {other}")),
        None => return Err("the operation map has no :process".to_owned()),
    };
    Ok(Event {
        process,
        kind: keyword(":type")?,
        function: if process.is_some() {
            keyword(":f")?
        } else {
            String::new()
        },
        value: field(":value").cloned().unwrap_or(Value::Null),
    })
}

pub(super) fn parse(text: &str) -> Result<Vec<Operation>, Error> {
    let mut operations = Vec::new();
    let mut pending: HashMap<u64, Pending> = HashMap::new();
    for (line_index, line) in text.lines().enumerate() {
        let line_number = line_index + 1;
        let parse_error = |reason: String| Error::Parse {
            line: line_number,
            reason,
        };
        let Some(event) = event_of_line(line).map_err(parse_error)? else {
            continue;
        };
        let Some(process) = event.process else {
            continue;
        };
        let kind = event.kind.as_str();
        let value = event.value;
        let op = match event.function.as_str() {
            ":read" => OpKind::Read,
            ":write" => OpKind::Write,
            ":cas" => OpKind::Cas,
            ":delete" => OpKind::Delete,
            ":append" => OpKind::Append,
            ":add" => OpKind::Add,
            other => return Err(parse_error(format!("unknown operation {other:?}"))),
        };
        match kind {
            ":invoke" => {
                if let Some(previous) = pending.get(&process) {
                    return Err(parse_error(format!(
                        "process {process} invoked again while its operation of line {} is pending",
                        previous.line
                    )));
                }
                let input = if op == OpKind::Read {
                    Value::Null
                } else {
                    value
                };
                pending.insert(
                    process,
                    Pending {
                        op,
                        input,
                        line: line_number,
                    },
                );
            }
            ":ok" | ":fail" | ":info" => {
                let Some(invocation) = pending.remove(&process) else {
                    return Err(parse_error(format!(
                        "completion of process {process} without an invocation"
                    )));
                };
                if invocation.op != op {
                    return Err(parse_error(format!(
                        "process {process} completes {op} but invoked {} on line {}",
                        invocation.op, invocation.line
                    )));
                }
                let outcome = match kind {
                    ":ok" => Outcome::Ok,
                    ":fail" => Outcome::Fail,
                    _ => Outcome::Info,
                };
                let output = if op == OpKind::Read && outcome == Outcome::Ok {
                    value
                } else {
                    Value::Null
                };
                operations.push(Operation {
                    process,
                    op,
                    key: String::new(),
                    input: invocation.input,
                    output,
                    outcome,
                    invoke_ns: invocation.line as u64,
                    complete_ns: Some(line_number as u64),
                });
            }
            other => return Err(parse_error(format!("unknown event type {other:?}"))),
        }
    }
    let mut never_completed: Vec<(u64, Pending)> = pending.into_iter().collect();
    never_completed.sort_by_key(|(_, invocation)| invocation.line);
    for (process, invocation) in never_completed {
        operations.push(Operation {
            process,
            op: invocation.op,
            key: String::new(),
            input: invocation.input,
            output: Value::Null,
            outcome: Outcome::Info,
            invoke_ns: invocation.line as u64,
            complete_ns: None,
        });
    }
    if operations.is_empty() && !text.trim().is_empty() {
        return Err(Error::Parse {
            line: 1,
            reason: "no Jepsen events (`jepsen.util - `) found".to_owned(),
        });
    }
    operations.sort_by_key(|operation| operation.invoke_ns);
    Ok(operations)
}

/// Parses one EDN-subset value; the empty string is `nil`.
fn parse_value(text: &str) -> Result<Value, String> {
    let mut parser = ValueParser {
        bytes: text.as_bytes(),
        position: 0,
        depth: 0,
    };
    parser.skip_separators();
    if parser.at_end() {
        return Ok(Value::Null);
    }
    let value = parser.value()?;
    parser.skip_separators();
    if !parser.at_end() {
        return Err(format!("trailing text after value in {text:?}"));
    }
    Ok(value)
}

const NESTING_DEPTH_MAX: usize = 64;

struct ValueParser<'a> {
    bytes: &'a [u8],
    position: usize,
    depth: usize,
}

impl ValueParser<'_> {
    fn at_end(&self) -> bool {
        self.position >= self.bytes.len()
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.position).copied()
    }

    fn skip_separators(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b',' | b'\r' | b'\n')) {
            self.position += 1;
        }
    }

    fn token(&mut self) -> &str {
        let start = self.position;
        while let Some(byte) = self.peek() {
            if matches!(
                byte,
                b' ' | b'\t'
                    | b','
                    | b'\r'
                    | b'\n'
                    | b'['
                    | b']'
                    | b'('
                    | b')'
                    | b'{'
                    | b'}'
                    | b'"'
            ) {
                break;
            }
            self.position += 1;
        }
        // Token boundaries are ASCII bytes, so the slice is valid UTF-8.
        std::str::from_utf8(&self.bytes[start..self.position]).unwrap_or("")
    }

    /// `{k v, k v ...}` as (key, value) pairs.
    fn map_entries(&mut self) -> Result<Vec<(Value, Value)>, String> {
        if self.peek() != Some(b'{') {
            return Err("expected an EDN map".to_owned());
        }
        self.depth += 1;
        if self.depth > NESTING_DEPTH_MAX {
            return Err("values nested too deeply".to_owned());
        }
        self.position += 1;
        let mut entries = Vec::new();
        loop {
            self.skip_separators();
            match self.peek() {
                None => return Err("unterminated map".to_owned()),
                Some(b'}') => {
                    self.position += 1;
                    break;
                }
                Some(_) => {
                    let key = self.value()?;
                    self.skip_separators();
                    if matches!(self.peek(), None | Some(b'}')) {
                        return Err(format!("map key {key} has no value"));
                    }
                    entries.push((key, self.value()?));
                }
            }
        }
        self.depth -= 1;
        Ok(entries)
    }

    fn value(&mut self) -> Result<Value, String> {
        match self.peek() {
            None => Err("missing value".to_owned()),
            // A nested map (say `:error {...}`) as a list of [key value] pairs.
            Some(b'{') => Ok(Value::List(
                self.map_entries()?
                    .into_iter()
                    .map(|(key, value)| Value::List(vec![key, value]))
                    .collect(),
            )),
            // A set `#{...}` as a list.
            Some(b'#') if self.bytes.get(self.position + 1) == Some(&b'{') => {
                self.position += 1;
                self.set_items().map(Value::List)
            }
            Some(open @ (b'[' | b'(')) => {
                let close = if open == b'[' { b']' } else { b')' };
                self.depth += 1;
                if self.depth > NESTING_DEPTH_MAX {
                    return Err("values nested too deeply".to_owned());
                }
                self.position += 1;
                let mut items = Vec::new();
                loop {
                    self.skip_separators();
                    match self.peek() {
                        None => return Err("unterminated list".to_owned()),
                        Some(byte) if byte == close => {
                            self.position += 1;
                            break;
                        }
                        Some(_) => items.push(self.value()?),
                    }
                }
                self.depth -= 1;
                Ok(Value::List(items))
            }
            Some(b'"') => self.string(),
            Some(_) => {
                let token = self.token().to_owned();
                if token.is_empty() {
                    return Err(format!("unexpected character at byte {}", self.position));
                }
                if token == "nil" {
                    Ok(Value::Null)
                } else if let Ok(int) = token.parse::<i64>() {
                    Ok(Value::Int(int))
                } else if token.starts_with(|c: char| c.is_ascii_digit() || c == '-')
                    && token.parse::<f64>().is_err()
                {
                    Err(format!("malformed number {token:?}"))
                } else {
                    // Keywords (kept with their colon), booleans, symbols and
                    // floats: compared as their text.
                    Ok(Value::Str(token))
                }
            }
        }
    }

    /// `{...}` after a `#`: the set's elements.
    fn set_items(&mut self) -> Result<Vec<Value>, String> {
        self.depth += 1;
        if self.depth > NESTING_DEPTH_MAX {
            return Err("values nested too deeply".to_owned());
        }
        self.position += 1; // `{`
        let mut items = Vec::new();
        loop {
            self.skip_separators();
            match self.peek() {
                None => return Err("unterminated set".to_owned()),
                Some(b'}') => {
                    self.position += 1;
                    break;
                }
                Some(_) => items.push(self.value()?),
            }
        }
        self.depth -= 1;
        Ok(items)
    }

    fn string(&mut self) -> Result<Value, String> {
        self.position += 1; // opening quote
        let mut bytes = Vec::new();
        loop {
            match self.peek() {
                None => return Err("unterminated string".to_owned()),
                Some(b'"') => {
                    self.position += 1;
                    break;
                }
                Some(b'\\') => {
                    self.position += 1;
                    let escaped = match self.peek() {
                        Some(b'n') => b'\n',
                        Some(b't') => b'\t',
                        Some(b'r') => b'\r',
                        Some(byte @ (b'"' | b'\\')) => byte,
                        _ => return Err("bad escape in string".to_owned()),
                    };
                    bytes.push(escaped);
                    self.position += 1;
                }
                Some(byte) => {
                    bytes.push(byte);
                    self.position += 1;
                }
            }
        }
        String::from_utf8(bytes)
            .map(Value::Str)
            .map_err(|_| "string is not UTF-8".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_values_of_the_edn_subset() {
        // nil, integers, keywords, strings and nested vectors are understood.
        assert_eq!(parse_value("nil").unwrap(), Value::Null);
        assert_eq!(parse_value("").unwrap(), Value::Null);
        assert_eq!(parse_value("-42").unwrap(), Value::Int(-42));
        assert_eq!(
            parse_value(":timed-out").unwrap(),
            Value::Str(":timed-out".into())
        );
        assert_eq!(
            parse_value("\"a\\\"b\"").unwrap(),
            Value::Str("a\"b".into())
        );
        assert_eq!(
            parse_value("[3 [nil, 4]]").unwrap(),
            Value::List(vec![
                Value::Int(3),
                Value::List(vec![Value::Null, Value::Int(4)])
            ])
        );
        assert!(parse_value("[1 2").is_err());
        assert!(parse_value("1 2").is_err());
        assert_eq!(parse_value("true").unwrap(), Value::Str("true".into()));
        assert!(parse_value("12abc").is_err());
        assert!(parse_value(&"[".repeat(100)).is_err());
    }

    #[test]
    fn pairs_invocations_with_completions_per_process() {
        // Completions are matched to the pending invocation of the same process;
        // an invocation never completed becomes an indeterminate operation.
        let log = "INFO  jepsen.util - 0\t:invoke\t:read\tnil\n\
                   INFO  jepsen.util - 1\t:invoke\t:cas\t[1 2]\n\
                   some unrelated line\n\
                   INFO  jepsen.util - 0\t:ok\t:read\t3\n\
                   INFO  jepsen.util - :nemesis\t:info\t:start\tnil\n\
                   INFO  jepsen.util - 2\t:invoke\t:write\t4\n\
                   INFO  jepsen.util - 1\t:info\t:cas\t:timed-out\n";
        let operations = parse(log).unwrap();
        assert_eq!(operations.len(), 3);
        assert_eq!(operations[0].op, OpKind::Read);
        assert_eq!(operations[0].output, Value::Int(3));
        assert_eq!(
            (operations[0].invoke_ns, operations[0].complete_ns),
            (1, Some(4))
        );
        assert_eq!(operations[1].op, OpKind::Cas);
        assert_eq!(
            operations[1].input,
            Value::List(vec![Value::Int(1), Value::Int(2)])
        );
        assert_eq!(operations[1].outcome, Outcome::Info);
        assert_eq!(operations[2].op, OpKind::Write);
        assert_eq!(operations[2].complete_ns, None);
    }

    #[test]
    fn rejects_inconsistent_event_streams() {
        // A double invocation, an orphan completion or a mismatched function is an error.
        let double = "INFO  jepsen.util - 0\t:invoke\t:read\tnil\nINFO  jepsen.util - 0\t:invoke\t:read\tnil\n";
        assert!(matches!(parse(double), Err(Error::Parse { line: 2, .. })));
        let orphan = "INFO  jepsen.util - 0\t:ok\t:read\t1\n";
        assert!(matches!(parse(orphan), Err(Error::Parse { line: 1, .. })));
        let mismatch =
            "INFO  jepsen.util - 0\t:invoke\t:read\tnil\nINFO  jepsen.util - 0\t:ok\t:write\t1\n";
        assert!(matches!(parse(mismatch), Err(Error::Parse { line: 2, .. })));
        assert!(parse("no events here\n").is_err());
    }

    /// The same history in the layouts Jepsen writes: tab-separated, padded
    /// with spaces (with a timestamp), bare columns, and EDN maps.
    const TABS: &str = "INFO  jepsen.util - 0\t:invoke\t:write\t3\n\
                        INFO  jepsen.util - 1\t:invoke\t:read\tnil\n\
                        INFO  jepsen.util - 0\t:ok\t:write\t3\n\
                        INFO  jepsen.util - :nemesis\t:info\t:start\tnil\n\
                        INFO  jepsen.util - 1\t:ok\t:read\t3\n\
                        INFO  jepsen.util - 2\t:invoke\t:cas\t[3 4]\n\
                        INFO  jepsen.util - 2\t:fail\t:cas\t[3 4]\n";

    #[test]
    fn every_whitespace_layout_and_edn_maps_give_the_same_history() {
        // Columns padded with spaces (as in some of Jepsen's etcd logs), bare
        // columns, and history.edn maps all parse to the tab layout's history.
        let padded = "INFO [2017-03-09 15:02:01,123] jepsen.util - 0  :invoke  :write  3\n\
                      INFO [2017-03-09 15:02:01,124] jepsen.util - 1    :invoke :read   nil\n\
                      INFO [2017-03-09 15:02:01,125] jepsen.util - 0  :ok     :write  3\n\
                      INFO [2017-03-09 15:02:01,126] jepsen.util - :nemesis :info :start nil\n\
                      INFO [2017-03-09 15:02:01,127] jepsen.util - 1    :ok     :read   3\n\
                      INFO [2017-03-09 15:02:01,128] jepsen.util - 2  :invoke :cas    [3 4]\n\
                      INFO [2017-03-09 15:02:01,129] jepsen.util - 2  :fail   :cas    [3 4]\n";
        let bare = TABS.replace("INFO  jepsen.util - ", "");
        let edn = "[{:type :invoke, :f :write, :value 3, :process 0, :time 10, :index 0}\n\
                   {:type :invoke, :f :read, :value nil, :process 1, :time 11, :index 1}\n\
                   {:type :ok, :f :write, :value 3, :process 0, :time 12, :index 2}\n\
                   {:type :info, :f :start, :value nil, :process :nemesis, :time 13}\n\
                   {:type :ok, :f :read, :value 3, :process 1, :time 14, :index 3}\n\
                   {:type :invoke, :f :cas, :value [3 4], :process 2, :time 15}\n\
                   {:type :fail, :f :cas, :value [3 4], :process 2, :time 16, :error {:cause :mismatch, :ok? false, :took 1.5}}]\n";
        let expected = parse(TABS).unwrap();
        assert_eq!(expected.len(), 3);
        assert_eq!(expected[1].output, Value::Int(3));
        for (name, text) in [("padded", padded), ("bare", bare.as_str()), ("edn", edn)] {
            assert_eq!(parse(text).unwrap(), expected, "{name}");
        }
    }

    #[test]
    fn an_event_that_cannot_be_read_is_refused_naming_its_line() {
        // Really malformed events are errors with their line; other output is not.
        let cases = [
            "INFO  jepsen.util - 0 :invoke :write [3\n",
            "INFO  jepsen.util - x1 :invoke :read nil\n",
            "{:type :invoke, :f :write, :value 3}\n",
            "{:type :invoke :f :write :value}\n",
            "{:type :invoke, :f :write, :value 3, :process 0\n",
            "INFO  jepsen.util - 0 :invoke :write 12abc\n",
        ];
        for case in cases {
            let text = format!("starting the test\n{case}");
            assert!(
                matches!(parse(&text), Err(Error::Parse { line: 2, .. })),
                "{case:?}: {:?}",
                parse(&text)
            );
        }
        // A set value and a line of other output are fine.
        let sets = "some other output: 3 things\n\
                    {:type :invoke, :f :add, :value 1, :process 0}\n\
                    {:type :ok, :f :add, :value 1, :process 0}\n\
                    {:type :invoke, :f :read, :value nil, :process 1}\n\
                    {:type :ok, :f :read, :value #{1 2}, :process 1}\n";
        let operations = parse(sets).unwrap();
        assert_eq!(
            operations[1].output,
            Value::List(vec![Value::Int(1), Value::Int(2)])
        );
    }
}
