//! One error type for every operation on a target, sorted so a caller can act on it.
//!
//! | kind             | produced by                                                        |
//! |------------------|--------------------------------------------------------------------|
//! | `spec`           | a location or S3 option that is wrong ([`SpecError`]), or the S3 client refusing the configuration |
//! | `missing_target` | the directory does not exist (or is not one); S3 `NoSuchBucket`     |
//! | `refused`        | `EACCES`, `EPERM`, `EROFS` (a read-only mount); HTTP 401/403 (`AccessDenied`, `InvalidAccessKeyId`, `SignatureDoesNotMatch`, a bucket policy) |
//! | `full`           | `ENOSPC`, `EDQUOT`, `EFBIG`; HTTP 507; S3 codes `EntityTooLarge`, `*QuotaExceeded*` (Ceph's comes with a 403), `*StorageFull` (MinIO's `XMinioStorageFull`) |
//! | `not_found`      | the backup (or `.part`) named is not in the target                  |
//! | `verify`         | what was read back differs from what was sent, or the verify callback refused it, or it names another cluster or index |
//! | `too_many`       | a listing over [`crate::Limits::list_objects_max`] objects          |
//! | `local`          | reading the local file, or writing the local copy (the read-back, a fetch) |
//! | `io`             | anything else the target answered or failed with (a connection, a 5xx after retries) |
//!
//! object_store keeps the HTTP status type of its S3 client private: the S3 codes are read
//! from the error's text (`<Code>…</Code>` of the response body, `status code: 507`), the
//! file system's from the `std::io::Error`s in its source chain.

use std::error::Error as StdError;
use std::io;
use std::path::PathBuf;

use crate::spec::SpecError;

/// An operation on a target failed. Every message names the target and the object.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("backup target {target:?}: {source}")]
    Spec {
        target: String,
        #[source]
        source: SpecError,
    },
    #[error("backup target {target} does not exist ({op} {object}): {detail}")]
    MissingTarget {
        target: String,
        op: &'static str,
        object: String,
        detail: String,
    },
    #[error("backup target {target} refused to {op} {object}: {source}")]
    Refused {
        target: String,
        op: &'static str,
        object: String,
        #[source]
        source: Box<object_store::Error>,
    },
    #[error("backup target {target} is full: cannot {op} {object}: {source}")]
    Full {
        target: String,
        op: &'static str,
        object: String,
        #[source]
        source: Box<object_store::Error>,
    },
    #[error("backup target {target} holds no {object}")]
    NotFound {
        target: String,
        object: String,
        #[source]
        source: Box<object_store::Error>,
    },
    #[error("backup {object} in target {target} failed verification: {what}")]
    Verify {
        target: String,
        object: String,
        what: String,
    },
    #[error(
        "backup target {target} holds more than {limit} objects under its prefix: not listing \
         them all (prune it by hand, or give Cairn a prefix of its own)"
    )]
    TooMany { target: String, limit: usize },
    #[error("backup target {target}: {op} {object}: local file {}: {source}", path.display())]
    Local {
        target: String,
        op: &'static str,
        object: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("backup target {target}: cannot {op} {object}: {source}")]
    Io {
        target: String,
        op: &'static str,
        object: String,
        #[source]
        source: Box<object_store::Error>,
    },
}

impl BackupError {
    /// A short label for metrics (see the module's table).
    pub fn kind(&self) -> &'static str {
        match self {
            BackupError::Spec { .. } => "spec",
            BackupError::MissingTarget { .. } => "missing_target",
            BackupError::Refused { .. } => "refused",
            BackupError::Full { .. } => "full",
            BackupError::NotFound { .. } => "not_found",
            BackupError::Verify { .. } => "verify",
            BackupError::TooMany { .. } => "too_many",
            BackupError::Local { .. } => "local",
            BackupError::Io { .. } => "io",
        }
    }

    /// Sorts what object_store returned for `op` on `object` of `target`.
    pub(crate) fn from_store(
        target: &str,
        op: &'static str,
        object: &str,
        source: object_store::Error,
    ) -> BackupError {
        let (target, object) = (target.to_string(), object.to_string());
        let class = classify(&source);
        let source = Box::new(source);
        match class {
            Class::MissingTarget => BackupError::MissingTarget {
                target,
                op,
                object,
                detail: source.to_string(),
            },
            Class::Refused => BackupError::Refused {
                target,
                op,
                object,
                source,
            },
            Class::Full => BackupError::Full {
                target,
                op,
                object,
                source,
            },
            Class::NotFound => BackupError::NotFound {
                target,
                object,
                source,
            },
            Class::Other => BackupError::Io {
                target,
                op,
                object,
                source,
            },
        }
    }
}

/// How an object_store error reads, for [`BackupError::from_store`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    MissingTarget,
    Refused,
    Full,
    NotFound,
    Other,
}

/// S3 error codes of a full target, matched as a code's substring (MinIO's
/// `XMinioStorageFull` and `XMinioAdminBucketQuotaExceeded`, Ceph's `QuotaExceeded`).
const FULL_CODE_PARTS: &[&str] = &["QuotaExceeded", "StorageFull", "InsufficientStorage"];
/// S3 error codes of a full target, matched whole.
const FULL_CODES: &[&str] = &["EntityTooLarge"];
/// S3 error codes of a refusal (most come with a 403, which is refused anyway).
const REFUSED_CODES: &[&str] = &[
    "AccessDenied",
    "AllAccessDisabled",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "AccountProblem",
];

/// Sorts an object_store error: the file system's errno first (in the source chain), then
/// the S3 error code or HTTP status in its text, then object_store's own variant.
pub(crate) fn classify(error: &object_store::Error) -> Class {
    let mut chain: Vec<&(dyn StdError + 'static)> = Vec::new();
    let mut next: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = next {
        chain.push(e);
        // An io::Error's `source()` skips the error it wraps: look at that one too.
        if let Some(inner) = e.downcast_ref::<io::Error>().and_then(io::Error::get_ref) {
            chain.push(inner);
        }
        next = e.source();
    }
    for e in &chain {
        if let Some(class) = e.downcast_ref::<io::Error>().and_then(classify_io) {
            return class;
        }
    }

    let text: String = chain
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join(": ");
    let codes = s3_codes(&text);
    let has_code = |list: &[&str]| codes.iter().any(|c| list.contains(c));
    if codes
        .iter()
        .any(|c| FULL_CODE_PARTS.iter().any(|part| c.contains(part)))
        || has_code(FULL_CODES)
        || text.contains("status code: 507")
    {
        return Class::Full;
    }
    if codes.contains(&"NoSuchBucket") {
        return Class::MissingTarget;
    }
    match error {
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => Class::Refused,
        object_store::Error::NotFound { .. } => Class::NotFound,
        _ if has_code(REFUSED_CODES) => Class::Refused,
        _ => Class::Other,
    }
}

fn classify_io(e: &io::Error) -> Option<Class> {
    if let Some(errno) = e.raw_os_error() {
        return match errno {
            libc::ENOSPC | libc::EDQUOT | libc::EFBIG => Some(Class::Full),
            libc::EACCES | libc::EPERM | libc::EROFS => Some(Class::Refused),
            _ => None,
        };
    }
    match e.kind() {
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded | io::ErrorKind::FileTooLarge => {
            Some(Class::Full)
        }
        io::ErrorKind::ReadOnlyFilesystem => Some(Class::Refused),
        _ => None,
    }
}

/// The S3 error codes in an error's text: `<Code>…</Code>` of a response body, and
/// `(code: …)` as object_store writes a DeleteObjects failure (bounded: the first 8).
fn s3_codes(text: &str) -> Vec<&str> {
    let mut codes = Vec::new();
    for (open, close) in [("<Code>", "</Code>"), ("(code: ", ")")] {
        let mut rest = text;
        while codes.len() < 8 {
            let Some(start) = rest.find(open) else {
                break;
            };
            let after = &rest[start + open.len()..];
            let Some(end) = after.find(close) else {
                break;
            };
            codes.push(after[..end].trim());
            rest = &after[end..];
        }
    }
    codes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error with a given text, as object_store's S3 client error reads (its type is private).
    #[derive(Debug)]
    struct Text(&'static str);
    impl std::fmt::Display for Text {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl StdError for Text {}

    fn generic(source: impl StdError + Send + Sync + 'static) -> object_store::Error {
        object_store::Error::Generic {
            store: "S",
            source: Box::new(source),
        }
    }

    fn errno(code: i32) -> object_store::Error {
        generic(io::Error::from_raw_os_error(code))
    }

    const BODY_403_ACCESS: &str = "Server returned non-2xx status code: 403 Forbidden: <?xml version=\"1.0\"?><Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>";
    const BODY_403_QUOTA: &str = "Server returned non-2xx status code: 403 Forbidden: <Error><Code>QuotaExceeded</Code></Error>";
    const BODY_507: &str = "Server returned non-2xx status code: 507 Insufficient Storage: <Error><Code>XMinioStorageFull</Code></Error>";
    const BODY_507_BARE: &str = "Server returned non-2xx status code: 507 Insufficient Storage: ";
    const BODY_400_TOO_LARGE: &str = "Server returned non-2xx status code: 400 Bad Request: <Error><Code>EntityTooLarge</Code></Error>";
    const BODY_404_BUCKET: &str = "Server returned non-2xx status code: 404 Not Found: <Error><Code>NoSuchBucket</Code><BucketName>b</BucketName></Error>";
    const BODY_404_KEY: &str =
        "Server returned non-2xx status code: 404 Not Found: <Error><Code>NoSuchKey</Code></Error>";
    const BODY_500: &str = "Server returned non-2xx status code: 500 Internal Server Error: <Error><Code>InternalError</Code></Error>";

    #[test]
    fn store_errors_are_sorted_by_errno_code_and_variant() {
        let table: Vec<(&str, object_store::Error, Class)> = vec![
            ("ENOSPC", errno(libc::ENOSPC), Class::Full),
            ("EDQUOT", errno(libc::EDQUOT), Class::Full),
            ("EFBIG", errno(libc::EFBIG), Class::Full),
            ("EACCES", errno(libc::EACCES), Class::Refused),
            ("EPERM", errno(libc::EPERM), Class::Refused),
            ("EROFS", errno(libc::EROFS), Class::Refused),
            ("EIO", errno(libc::EIO), Class::Other),
            (
                "an io::Error wrapping a full disk's",
                generic(io::Error::other(io::Error::from_raw_os_error(libc::ENOSPC))),
                Class::Full,
            ),
            (
                "403 AccessDenied",
                object_store::Error::PermissionDenied {
                    path: "p".into(),
                    source: Box::new(Text(BODY_403_ACCESS)),
                },
                Class::Refused,
            ),
            (
                "401",
                object_store::Error::Unauthenticated {
                    path: "p".into(),
                    source: Box::new(Text("401 Unauthorized")),
                },
                Class::Refused,
            ),
            (
                "403 QuotaExceeded (Ceph)",
                object_store::Error::PermissionDenied {
                    path: "p".into(),
                    source: Box::new(Text(BODY_403_QUOTA)),
                },
                Class::Full,
            ),
            (
                "507 XMinioStorageFull",
                generic(Text(BODY_507)),
                Class::Full,
            ),
            (
                "507 with no body",
                generic(Text(BODY_507_BARE)),
                Class::Full,
            ),
            (
                "400 EntityTooLarge",
                generic(Text(BODY_400_TOO_LARGE)),
                Class::Full,
            ),
            (
                "404 NoSuchBucket",
                object_store::Error::NotFound {
                    path: "p".into(),
                    source: Box::new(Text(BODY_404_BUCKET)),
                },
                Class::MissingTarget,
            ),
            (
                "404 NoSuchKey",
                object_store::Error::NotFound {
                    path: "p".into(),
                    source: Box::new(Text(BODY_404_KEY)),
                },
                Class::NotFound,
            ),
            (
                "AccessDenied in a response body of a 200 (CompleteMultipartUpload)",
                generic(Text(
                    "Server returned error response: <Error><Code>AccessDenied</Code></Error>",
                )),
                Class::Refused,
            ),
            (
                "a DeleteObjects key refused",
                generic(Text(
                    "DeleteObjects request failed for key k: Access Denied (code: AccessDenied)",
                )),
                Class::Refused,
            ),
            ("500 after retries", generic(Text(BODY_500)), Class::Other),
            // A code's name elsewhere in the text (an object path) is not a code.
            (
                "QuotaExceeded in a path",
                generic(Text(
                    "cannot put cairn-QuotaExceeded-1-2.snap: connection reset",
                )),
                Class::Other,
            ),
        ];
        for (what, error, expected) in table {
            assert_eq!(classify(&error), expected, "{what}");
        }
    }

    #[test]
    fn every_kind_has_its_label_and_messages_name_target_and_object() {
        let refused = BackupError::from_store(
            "s3://b/p",
            "upload",
            "cairn-x.snap.part",
            object_store::Error::PermissionDenied {
                path: "p".into(),
                source: Box::new(Text(BODY_403_ACCESS)),
            },
        );
        assert_eq!(refused.kind(), "refused");
        let message = refused.to_string();
        assert!(
            message.contains("s3://b/p")
                && message.contains("cairn-x.snap.part")
                && message.contains("upload"),
            "{message}"
        );
        let full = BackupError::from_store("/d", "upload", "o", errno(libc::ENOSPC));
        assert_eq!(full.kind(), "full");
        assert!(
            full.to_string()
                .starts_with("backup target /d is full: cannot upload o"),
            "{full}"
        );
        let missing = BackupError::from_store(
            "s3://b",
            "list",
            "objects",
            object_store::Error::NotFound {
                path: "p".into(),
                source: Box::new(Text(BODY_404_BUCKET)),
            },
        );
        assert_eq!(missing.kind(), "missing_target");
        assert_eq!(
            BackupError::from_store("t", "get", "o", errno(libc::EIO)).kind(),
            "io"
        );
    }

    #[test]
    fn codes_are_read_from_an_s3_error_body() {
        assert_eq!(s3_codes(BODY_403_ACCESS), vec!["AccessDenied"]);
        assert_eq!(
            s3_codes("<Code>A</Code> x <Code> B </Code>"),
            vec!["A", "B"]
        );
        assert!(s3_codes("<Code>unterminated").is_empty());
        assert_eq!(
            s3_codes("DeleteObjects request failed for key k: Access Denied (code: AccessDenied)"),
            vec!["AccessDenied"]
        );
        assert_eq!(s3_codes(&"<Code>A</Code>".repeat(100)).len(), 8);
    }
}
