//! The one error type of this crate: everything that makes a history unusable.
//! A history that is well formed but wrong is not an error: it is a
//! [`Verdict::Invalid`](crate::Verdict::Invalid) report.

use std::path::PathBuf;

use crate::history::OpKind;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing a history failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A file could not be opened.
    #[error("cannot open {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A line of a history file is malformed (1-based line number).
    #[error("line {line}: {reason}")]
    Parse { line: usize, reason: String },
    /// An operation is malformed or inconsistent (index into the history).
    #[error("operation {index}: {reason}")]
    InvalidOperation { index: usize, reason: String },
    /// The chosen model or checker cannot interpret this kind of operation.
    #[error("operation {index}: the {checker} checker does not support {op} operations")]
    UnsupportedOperation {
        index: usize,
        checker: &'static str,
        op: OpKind,
    },
}
