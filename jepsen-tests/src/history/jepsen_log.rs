//! Parser for Jepsen's event log lines:
//! `INFO  jepsen.util - PROCESS<TAB>:TYPE<TAB>:F<TAB>VALUE`.
//!
//! `:invoke` opens an operation of PROCESS; the next `:ok`, `:fail` or `:info` of
//! the same PROCESS completes it. Lines without the `jepsen.util - ` marker (other
//! log output) and events of non-numeric processes (`:nemesis`) are skipped. Values
//! are a small EDN subset: `nil`, integers, strings, keywords (kept as strings with
//! their colon) and vectors or lists.

use std::collections::HashMap;

use super::{OpKind, Operation, Outcome, Value};
use crate::Error;

const MARKER: &str = "jepsen.util - ";

struct Pending {
    op: OpKind,
    input: Value,
    line: usize,
}

pub(super) fn parse(text: &str) -> Result<Vec<Operation>, Error> {
    let mut operations = Vec::new();
    let mut pending: HashMap<u64, Pending> = HashMap::new();
    for (line_index, line) in text.lines().enumerate() {
        let line_number = line_index + 1;
        let Some(marker_at) = line.find(MARKER) else {
            continue;
        };
        let event = &line[marker_at + MARKER.len()..];
        let mut fields = event.splitn(4, '\t');
        let parse_error = |reason: String| Error::Parse {
            line: line_number,
            reason,
        };
        let process_field = fields.next().unwrap_or("").trim();
        let Ok(process) = process_field.parse::<u64>() else {
            // `:nemesis` and other non-client events carry no operation.
            if process_field.starts_with(':') {
                continue;
            }
            return Err(parse_error(format!("bad process {process_field:?}")));
        };
        let kind = fields.next().map(str::trim).unwrap_or("");
        let function = fields.next().map(str::trim).unwrap_or("");
        let value_text = fields.next().map(str::trim).unwrap_or("");
        let op = match function {
            ":read" => OpKind::Read,
            ":write" => OpKind::Write,
            ":cas" => OpKind::Cas,
            ":delete" => OpKind::Delete,
            ":append" => OpKind::Append,
            ":add" => OpKind::Add,
            other => return Err(parse_error(format!("unknown operation {other:?}"))),
        };
        let value = parse_value(value_text).map_err(parse_error)?;
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
                b' ' | b'\t' | b',' | b'\r' | b'\n' | b'[' | b']' | b'(' | b')' | b'"'
            ) {
                break;
            }
            self.position += 1;
        }
        // Token boundaries are ASCII bytes, so the slice is valid UTF-8.
        std::str::from_utf8(&self.bytes[start..self.position]).unwrap_or("")
    }

    fn value(&mut self) -> Result<Value, String> {
        match self.peek() {
            None => Err("missing value".to_owned()),
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
                } else if token.starts_with(':') {
                    Ok(Value::Str(token))
                } else {
                    token
                        .parse::<i64>()
                        .map(Value::Int)
                        .map_err(|_| format!("unsupported value {token:?}"))
                }
            }
        }
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
        assert!(parse_value("true").is_err());
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
}
