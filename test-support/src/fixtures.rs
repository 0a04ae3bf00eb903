//! Compatibility fixtures: files written once by a release, committed under
//! `tests/compat/<version>/`, and read by every later build (`tests/compat/README.md`).
//!
//! [`FixtureDir::bytes`] gives a fixture's bytes. A missing fixture is an error, so a
//! message added without one fails its test, and no fixture is ever made again silently;
//! with [`WRITE_ENV`]`=1` a missing one is written from the sample (never over a file
//! that exists: a fixture, once committed, is never changed).
//!
//! The proto helpers ([`rpcs`], [`oneof_fields`], [`enum_values`]) read a `.proto`
//! file's text, so that a test can require a fixture for every RPC or command it declares.

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Set to `1` to write the fixtures that are missing (and only those).
pub const WRITE_ENV: &str = "CAIRN_WRITE_WIRE_FIXTURES";

/// A directory of fixtures.
#[derive(Debug, Clone)]
pub struct FixtureDir {
    dir: PathBuf,
}

impl FixtureDir {
    /// `relative` (say `tests/compat/0.2.0/wire`) in the workspace of the crate whose
    /// manifest directory is `manifest_dir` (a member directly under the workspace root).
    pub fn in_workspace(manifest_dir: &str, relative: &str) -> FixtureDir {
        let root = Path::new(manifest_dir)
            .parent()
            .expect("a workspace member has a parent directory");
        FixtureDir {
            dir: root.join(relative),
        }
    }

    /// Where the fixture `name` is.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Whether missing fixtures are written: [`WRITE_ENV`]`=1`, and not under CI (`CI=true`),
    /// where a missing fixture always fails.
    pub fn writing() -> bool {
        std::env::var(WRITE_ENV).is_ok_and(|v| v == "1")
            && !std::env::var("CI").is_ok_and(|v| v == "true")
    }

    /// The bytes of the fixture `name`. When it does not exist: with [`WRITE_ENV`]`=1`,
    /// `sample` is written as it (created, never over an existing file) and returned;
    /// otherwise an error that names the file.
    pub fn bytes(&self, name: &str, sample: &[u8]) -> Result<Vec<u8>, String> {
        let path = self.path(name);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if !Self::writing() {
                    return Err(format!(
                        "{}: missing; a fixture is written once, by the release it belongs \
                         to ({WRITE_ENV}=1, see tests/compat/README.md), and never again",
                        path.display()
                    ));
                }
                std::fs::create_dir_all(&self.dir)
                    .map_err(|e| format!("{}: {e}", self.dir.display()))?;
                let mut file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                file.write_all(sample)
                    .and_then(|()| file.sync_all())
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                eprintln!("wrote {} ({} bytes)", path.display(), sample.len());
                Ok(sample.to_vec())
            }
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// The names of the files in the directory that start with `prefix` (none if the
    /// directory does not exist).
    pub fn names_with_prefix(&self, prefix: &str) -> BTreeSet<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return BTreeSet::new();
        };
        entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| name.starts_with(prefix))
            .collect()
    }
}

/// The failures of a table of fixtures, each naming its file: fails the test with all of
/// them at once.
pub fn assert_no_failures(what: &str, failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{} {what} fixture(s) failed:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

/// `AppendEntries`, `append_entries` or `ACTION_CANCEL_DOWNGRADE` -> `append-entries`,
/// `cancel-downgrade` (the name in a fixture's file name).
pub fn kebab(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    let mut previous_lower = false;
    for c in name.chars() {
        if c == '_' {
            out.push('-');
            previous_lower = false;
        } else if c.is_ascii_uppercase() {
            if previous_lower {
                out.push('-');
            }
            out.push(c.to_ascii_lowercase());
            previous_lower = false;
        } else {
            out.push(c);
            previous_lower = true;
        }
    }
    out
}

/// Comments and line breaks out: a `.proto` file as one line of its declarations.
fn declarations(proto: &str) -> String {
    proto
        .lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join(" ")
}

/// One `rpc` of a `.proto` file: its name, and its request and answer types as written
/// (`WriteRequest`, `cairn.v1.shared.WriteResponse`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rpc {
    pub name: String,
    pub request: String,
    pub answer: String,
}

/// The `rpc`s a `.proto` file declares, in order.
pub fn rpcs(proto: &str) -> Vec<Rpc> {
    let text = declarations(proto);
    let inside = |s: &str| -> Option<String> {
        let (_, rest) = s.split_once('(')?;
        let (inner, _) = rest.split_once(')')?;
        Some(
            inner
                .trim()
                .trim_start_matches("stream ")
                .trim()
                .to_string(),
        )
    };
    text.split(';')
        .filter_map(|statement| {
            let (_, rpc) = statement.split_once("rpc ")?;
            let (signature, answer) = rpc.split_once("returns")?;
            Some(Rpc {
                name: signature.split('(').next()?.trim().to_string(),
                request: inside(signature)?,
                answer: inside(answer)?,
            })
        })
        .collect()
}

/// The text between the braces of `keyword name { ... }` (the first such block), in
/// `text` with its whitespace collapsed to single spaces.
fn block(text: &str, keyword: &str, name: &str) -> Option<String> {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let open = [
        format!("{keyword} {name} {{"),
        format!("{keyword} {name}{{"),
    ]
    .iter()
    .filter_map(|declaration| {
        text.find(declaration.as_str())
            .map(|at| at + declaration.len())
    })
    .min()?;
    let mut depth = 1usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(text[open..open + i].to_string());
                }
            }
            _ => {}
        }
    }
    None
}

/// The field names of `oneof <oneof> { ... }` in a `.proto` file, in order.
pub fn oneof_fields(proto: &str, oneof: &str) -> Vec<String> {
    let text = declarations(proto);
    let Some(body) = block(&text, "oneof", oneof) else {
        return Vec::new();
    };
    body.split(';')
        .filter_map(|field| {
            let words: Vec<&str> = field.split_whitespace().collect();
            // `Type name = number`
            (words.len() >= 4 && words[2] == "=").then(|| words[1].to_string())
        })
        .collect()
}

/// The value names of `enum <name> { ... }` in a `.proto` file, in order.
pub fn enum_values(proto: &str, name: &str) -> Vec<String> {
    let text = declarations(proto);
    let Some(body) = block(&text, "enum", name) else {
        return Vec::new();
    };
    body.split(';')
        .filter_map(|value| {
            let words: Vec<&str> = value.split_whitespace().collect();
            // `NAME = number`
            (words.len() >= 3 && words[1] == "=").then(|| words[0].to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROTO: &str = r#"
        // A comment { with braces }
        service S {
          rpc AppendEntries(M) returns (M);
          // rpc Commented(M) returns (M);
          rpc Vote (M) returns (cairn.v1.shared.R);
          rpc Watch(W) returns (stream E);
        }
        message C {
          enum Action {
            ACTION_RAISE = 0;
            ACTION_CANCEL_DOWNGRADE = 2;
          }
          oneof command {
            WriteCommand write = 1;
            RestoreBeginCommand restore_begin = 3; // a comment
          }
        }
    "#;

    #[test]
    fn reads_rpcs_oneof_fields_and_enum_values() {
        let rpc = |name: &str, request: &str, answer: &str| Rpc {
            name: name.into(),
            request: request.into(),
            answer: answer.into(),
        };
        assert_eq!(
            rpcs(PROTO),
            [
                rpc("AppendEntries", "M", "M"),
                rpc("Vote", "M", "cairn.v1.shared.R"),
                rpc("Watch", "W", "E")
            ]
        );
        assert_eq!(oneof_fields(PROTO, "command"), ["write", "restore_begin"]);
        assert_eq!(
            enum_values(PROTO, "Action"),
            ["ACTION_RAISE", "ACTION_CANCEL_DOWNGRADE"]
        );
        assert!(oneof_fields(PROTO, "other").is_empty());
    }

    #[test]
    fn kebab_case() {
        assert_eq!(kebab("AppendEntries"), "append-entries");
        assert_eq!(kebab("restore_begin"), "restore-begin");
        assert_eq!(kebab("ACTION_CANCEL_DOWNGRADE"), "action-cancel-downgrade");
        assert_eq!(kebab("ReadIndex"), "read-index");
    }
}
