//! Where backups go, as an operator writes it: pure (no I/O).
//!
//! | location                          | target                                        |
//! |-----------------------------------|-----------------------------------------------|
//! | `/abs/dir`, `file:///abs/dir`     | the directory (it must exist when opened)     |
//! | `s3://bucket`, `s3://bucket/a/b`  | the bucket, under the prefix `a/b` if given   |
//! | `dir`, `./dir`, `file://host/dir` | refused: a relative path / a host             |
//! | `gs://…`, `http://…`, `s3:bucket` | refused: an unknown scheme / not a URL        |
//! | `s3://`, `s3:///a`                | refused: no bucket                            |
//! | `s3://b/a//b`, `s3://b/../x`      | refused: an empty, `.` or `..` prefix segment |
//!
//! S3 options ([`S3Options`]) go with an `s3://` location only: an endpoint URL (for an
//! S3-compatible server; `http://` only with `allow_http`), a region, and credentials. With
//! explicit credentials nothing is read from the environment; without them, the standard
//! AWS environment is used (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`, `AWS_REGION`, … and object_store's other providers).

use std::fmt;
use std::path::{Path, PathBuf};

/// Where backups go: parsed and checked, not yet opened.
#[derive(Clone, PartialEq, Eq)]
pub enum TargetSpec {
    /// A local directory (an absolute path).
    Directory { path: PathBuf },
    /// A bucket of S3 or an S3-compatible server, and a prefix in it (`""` for none; no
    /// leading or trailing `/`).
    S3 {
        bucket: String,
        prefix: String,
        options: S3Options,
    },
}

/// How to reach an S3 target. `Debug` does not show the secret or the session token.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct S3Options {
    /// The server's URL (`https://minio.example:9000`), for an S3-compatible server; none
    /// for AWS itself. Requests are path-style (`<endpoint>/<bucket>/<key>`).
    pub endpoint: Option<String>,
    /// The region to sign for (`us-east-1` when neither this nor the environment says).
    pub region: Option<String>,
    /// Allows a plain `http://` endpoint (a server on this machine, a test).
    pub allow_http: bool,
    /// Explicit credentials: both or neither. Neither: the standard AWS environment.
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// With explicit credentials, a session token, if they are temporary ones.
    pub session_token: Option<String>,
}

/// What is wrong with a target's location or options. Each names the offending part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("the location is empty")]
    Empty,
    #[error("unknown scheme {scheme:?}: a target is an absolute path, file:///abs/path or s3://bucket/prefix")]
    UnknownScheme { scheme: String },
    #[error(
        "{path:?} is a relative path: a directory target is an absolute path or file:///abs/path"
    )]
    RelativePath { path: String },
    #[error("{location:?} is not a URL: {why}")]
    BadUrl { location: String, why: String },
    #[error("file URL {location:?} names host {host:?}: only local directories (file:///abs/path) are targets")]
    FileUrlHost { location: String, host: String },
    #[error("the bucket is empty: an S3 target is s3://bucket or s3://bucket/prefix")]
    EmptyBucket,
    #[error("bucket {bucket:?} {why}")]
    BadBucket { bucket: String, why: &'static str },
    #[error("prefix {prefix:?} {why}")]
    BadPrefix { prefix: String, why: &'static str },
    #[error("endpoint {endpoint:?} {why}")]
    BadEndpoint { endpoint: String, why: String },
    #[error("endpoint {endpoint:?} is plain http: set allow_http to use it (a server on this machine, a test)")]
    PlainHttp { endpoint: String },
    #[error("the region is empty")]
    EmptyRegion,
    #[error("{given} is given without {missing}: explicit credentials need both (or neither, for the AWS environment)")]
    HalfCredentials {
        given: &'static str,
        missing: &'static str,
    },
    #[error("a session token is given without explicit credentials")]
    TokenWithoutCredentials,
    #[error("S3 options are given for the directory target {path:?}")]
    S3OptionsForDirectory { path: PathBuf },
    #[error("the S3 client refused the configuration: {why}")]
    S3Config { why: String },
}

/// Longest bucket name S3 accepts (and then some: legacy names in us-east-1 reach 255).
const BUCKET_BYTES_MAX: usize = 255;
/// Longest prefix accepted: S3 keys are at most 1024 bytes, and a name must still fit.
const PREFIX_BYTES_MAX: usize = 512;

impl TargetSpec {
    /// Parses a location with no S3 options (see the module's table).
    pub fn parse(location: &str) -> Result<TargetSpec, SpecError> {
        TargetSpec::parse_with(location, S3Options::default())
    }

    /// Parses a location and checks `s3` against it: non-default S3 options with a
    /// directory location are refused (a sign of a mistaken configuration).
    pub fn parse_with(location: &str, s3: S3Options) -> Result<TargetSpec, SpecError> {
        let location = location.trim();
        if location.is_empty() {
            return Err(SpecError::Empty);
        }
        let spec = if location.starts_with('/') {
            TargetSpec::Directory {
                path: PathBuf::from(location),
            }
        } else if let Some((scheme, rest)) = location.split_once("://") {
            match scheme.to_ascii_lowercase().as_str() {
                "file" => TargetSpec::Directory {
                    path: parse_file_url(location)?,
                },
                "s3" => parse_s3(rest)?,
                _ => {
                    return Err(SpecError::UnknownScheme {
                        scheme: scheme.to_string(),
                    })
                }
            }
        } else if looks_like_scheme(location) {
            return Err(SpecError::BadUrl {
                location: location.to_string(),
                why: "expected <scheme>://".to_string(),
            });
        } else {
            return Err(SpecError::RelativePath {
                path: location.to_string(),
            });
        };
        match spec {
            TargetSpec::Directory { path } if s3 != S3Options::default() => {
                Err(SpecError::S3OptionsForDirectory { path })
            }
            TargetSpec::Directory { path } => Ok(TargetSpec::Directory { path }),
            TargetSpec::S3 { bucket, prefix, .. } => {
                check_s3_options(&s3)?;
                Ok(TargetSpec::S3 {
                    bucket,
                    prefix,
                    options: s3,
                })
            }
        }
    }

    /// The directory, for a directory target.
    pub fn directory(&self) -> Option<&Path> {
        match self {
            TargetSpec::Directory { path } => Some(path),
            TargetSpec::S3 { .. } => None,
        }
    }
}

impl std::str::FromStr for TargetSpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<TargetSpec, SpecError> {
        TargetSpec::parse(s)
    }
}

/// How a target is named in messages: the directory, or `s3://bucket/prefix` and its
/// endpoint (never a credential).
impl fmt::Display for TargetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetSpec::Directory { path } => write!(f, "{}", path.display()),
            TargetSpec::S3 {
                bucket,
                prefix,
                options,
            } => {
                write!(f, "s3://{bucket}")?;
                if !prefix.is_empty() {
                    write!(f, "/{prefix}")?;
                }
                if let Some(endpoint) = &options.endpoint {
                    write!(f, " at {endpoint}")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Debug for TargetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetSpec::Directory { path } => {
                f.debug_struct("Directory").field("path", path).finish()
            }
            TargetSpec::S3 {
                bucket,
                prefix,
                options,
            } => f
                .debug_struct("S3")
                .field("bucket", bucket)
                .field("prefix", prefix)
                .field("options", options)
                .finish(),
        }
    }
}

impl fmt::Debug for S3Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redacted = |v: &Option<String>| v.as_ref().map(|_| "<redacted>");
        f.debug_struct("S3Options")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("allow_http", &self.allow_http)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &redacted(&self.secret_access_key))
            .field("session_token", &redacted(&self.session_token))
            .finish()
    }
}

/// `word:` with no `//` after it (`s3:bucket`, `c:dir`): meant as a URL, not a relative path.
fn looks_like_scheme(location: &str) -> bool {
    match location.split_once(':') {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        }
        None => false,
    }
}

fn parse_file_url(location: &str) -> Result<PathBuf, SpecError> {
    let url = url::Url::parse(location).map_err(|e| SpecError::BadUrl {
        location: location.to_string(),
        why: e.to_string(),
    })?;
    if let Some(host) = url
        .host_str()
        .filter(|h| !h.is_empty() && *h != "localhost")
    {
        return Err(SpecError::FileUrlHost {
            location: location.to_string(),
            host: host.to_string(),
        });
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(SpecError::BadUrl {
            location: location.to_string(),
            why: "a file URL has no query or fragment".to_string(),
        });
    }
    url.to_file_path().map_err(|()| SpecError::BadUrl {
        location: location.to_string(),
        why: "not a local absolute path".to_string(),
    })
}

/// `bucket[/prefix[/]]`, the part after `s3://`.
fn parse_s3(rest: &str) -> Result<TargetSpec, SpecError> {
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    check_bucket(bucket)?;
    let prefix = prefix.strip_suffix('/').unwrap_or(prefix);
    check_prefix(prefix)?;
    Ok(TargetSpec::S3 {
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
        options: S3Options::default(),
    })
}

fn check_bucket(bucket: &str) -> Result<(), SpecError> {
    let bad = |why| {
        Err(SpecError::BadBucket {
            bucket: bucket.to_string(),
            why,
        })
    };
    if bucket.is_empty() {
        return Err(SpecError::EmptyBucket);
    }
    if bucket.len() > BUCKET_BYTES_MAX {
        return bad("is longer than 255 bytes");
    }
    if !bucket
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    {
        return bad("holds a character other than ASCII letters, digits, '.', '-' and '_'");
    }
    Ok(())
}

fn check_prefix(prefix: &str) -> Result<(), SpecError> {
    let bad = |why| {
        Err(SpecError::BadPrefix {
            prefix: prefix.to_string(),
            why,
        })
    };
    if prefix.is_empty() {
        return Ok(());
    }
    if prefix.len() > PREFIX_BYTES_MAX {
        return bad("is longer than 512 bytes");
    }
    if prefix
        .chars()
        .any(|c| c.is_control() || matches!(c, '\\' | '?' | '#'))
    {
        return bad("holds a control character, '\\', '?' or '#'");
    }
    for segment in prefix.split('/') {
        match segment {
            "" => return bad("has an empty segment (a leading '/' or '//')"),
            "." | ".." => return bad("has a '.' or '..' segment"),
            _ => {}
        }
    }
    // What object_store accepts as a path is what it will be asked for.
    if object_store::path::Path::parse(prefix).is_err() {
        return bad("is not a valid object path");
    }
    Ok(())
}

fn check_s3_options(options: &S3Options) -> Result<(), SpecError> {
    if let Some(endpoint) = &options.endpoint {
        let bad = |why: &str| SpecError::BadEndpoint {
            endpoint: endpoint.clone(),
            why: why.to_string(),
        };
        let url = url::Url::parse(endpoint).map_err(|e| bad(&format!("is not a URL: {e}")))?;
        match url.scheme() {
            "https" => {}
            "http" if options.allow_http => {}
            "http" => {
                return Err(SpecError::PlainHttp {
                    endpoint: endpoint.clone(),
                })
            }
            _ => return Err(bad("is neither http:// nor https://")),
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(bad("names no host"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(bad("holds credentials: give them as the access key fields"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(bad("holds a query or fragment"));
        }
    }
    if options
        .region
        .as_deref()
        .is_some_and(|r| r.trim().is_empty())
    {
        return Err(SpecError::EmptyRegion);
    }
    match (&options.access_key_id, &options.secret_access_key) {
        (Some(_), None) => Err(SpecError::HalfCredentials {
            given: "access_key_id",
            missing: "secret_access_key",
        }),
        (None, Some(_)) => Err(SpecError::HalfCredentials {
            given: "secret_access_key",
            missing: "access_key_id",
        }),
        (None, None) if options.session_token.is_some() => Err(SpecError::TokenWithoutCredentials),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(path: &str) -> Result<TargetSpec, SpecError> {
        Ok(TargetSpec::Directory { path: path.into() })
    }

    fn s3(bucket: &str, prefix: &str) -> Result<TargetSpec, SpecError> {
        Ok(TargetSpec::S3 {
            bucket: bucket.into(),
            prefix: prefix.into(),
            options: S3Options::default(),
        })
    }

    #[test]
    fn locations_parse_to_targets_or_name_what_is_wrong() {
        let bad_prefix = |prefix: &str, why| {
            Err(SpecError::BadPrefix {
                prefix: prefix.into(),
                why,
            })
        };
        let table: Vec<(&str, Result<TargetSpec, SpecError>)> = vec![
            ("/var/backups/cairn", dir("/var/backups/cairn")),
            ("  /var/backups/  ", dir("/var/backups/")),
            ("file:///var/backups/cairn", dir("/var/backups/cairn")),
            ("file://localhost/var/b", dir("/var/b")),
            ("FILE:///x", dir("/x")),
            ("file:///my%20dir", dir("/my dir")),
            ("s3://bucket", s3("bucket", "")),
            ("s3://bucket/", s3("bucket", "")),
            ("s3://bucket/cairn/prod", s3("bucket", "cairn/prod")),
            ("s3://bucket/cairn/prod/", s3("bucket", "cairn/prod")),
            ("S3://my.bucket-1/x", s3("my.bucket-1", "x")),
            ("", Err(SpecError::Empty)),
            ("   ", Err(SpecError::Empty)),
            (
                "backups",
                Err(SpecError::RelativePath {
                    path: "backups".into(),
                }),
            ),
            (
                "./backups",
                Err(SpecError::RelativePath {
                    path: "./backups".into(),
                }),
            ),
            (
                "gs://bucket",
                Err(SpecError::UnknownScheme {
                    scheme: "gs".into(),
                }),
            ),
            (
                "http://host/x",
                Err(SpecError::UnknownScheme {
                    scheme: "http".into(),
                }),
            ),
            (
                "s3:bucket",
                Err(SpecError::BadUrl {
                    location: "s3:bucket".into(),
                    why: "expected <scheme>://".into(),
                }),
            ),
            (
                "file://nas/backups",
                Err(SpecError::FileUrlHost {
                    location: "file://nas/backups".into(),
                    host: "nas".into(),
                }),
            ),
            ("s3://", Err(SpecError::EmptyBucket)),
            ("s3:///prefix", Err(SpecError::EmptyBucket)),
            (
                "s3://bu cket",
                Err(SpecError::BadBucket {
                    bucket: "bu cket".into(),
                    why: "holds a character other than ASCII letters, digits, '.', '-' and '_'",
                }),
            ),
            (
                "s3://b?x=1",
                Err(SpecError::BadBucket {
                    bucket: "b?x=1".into(),
                    why: "holds a character other than ASCII letters, digits, '.', '-' and '_'",
                }),
            ),
            (
                "s3://b/a//c",
                bad_prefix("a//c", "has an empty segment (a leading '/' or '//')"),
            ),
            (
                "s3://b//a",
                bad_prefix("/a", "has an empty segment (a leading '/' or '//')"),
            ),
            (
                "s3://b/../x",
                bad_prefix("../x", "has a '.' or '..' segment"),
            ),
            (
                "s3://b/a/./x",
                bad_prefix("a/./x", "has a '.' or '..' segment"),
            ),
            (
                "s3://b/a?x",
                bad_prefix("a?x", "holds a control character, '\\', '?' or '#'"),
            ),
        ];
        for (location, expected) in table {
            assert_eq!(TargetSpec::parse(location), expected, "{location:?}");
        }
    }

    #[test]
    fn s3_options_are_checked_against_the_location() {
        let http = "http://127.0.0.1:9000".to_string();
        let key = |id: &str, secret: &str| S3Options {
            access_key_id: Some(id.into()),
            secret_access_key: Some(secret.into()),
            ..S3Options::default()
        };
        let table: Vec<(&str, S3Options, Result<(), SpecError>)> = vec![
            (
                "s3://b",
                S3Options {
                    endpoint: Some(http.clone()),
                    allow_http: true,
                    region: Some("eu-west-1".into()),
                    ..key("id", "secret")
                },
                Ok(()),
            ),
            (
                "s3://b",
                S3Options {
                    endpoint: Some("https://s3.example:443".into()),
                    ..S3Options::default()
                },
                Ok(()),
            ),
            (
                "s3://b",
                S3Options {
                    endpoint: Some(http.clone()),
                    ..S3Options::default()
                },
                Err(SpecError::PlainHttp {
                    endpoint: http.clone(),
                }),
            ),
            (
                "s3://b",
                S3Options {
                    endpoint: Some("ftp://x".into()),
                    ..S3Options::default()
                },
                Err(SpecError::BadEndpoint {
                    endpoint: "ftp://x".into(),
                    why: "is neither http:// nor https://".into(),
                }),
            ),
            (
                "s3://b",
                S3Options {
                    endpoint: Some("https://user:pw@s3.example".into()),
                    ..S3Options::default()
                },
                Err(SpecError::BadEndpoint {
                    endpoint: "https://user:pw@s3.example".into(),
                    why: "holds credentials: give them as the access key fields".into(),
                }),
            ),
            (
                "s3://b",
                S3Options {
                    region: Some(" ".into()),
                    ..S3Options::default()
                },
                Err(SpecError::EmptyRegion),
            ),
            (
                "s3://b",
                S3Options {
                    access_key_id: Some("id".into()),
                    ..S3Options::default()
                },
                Err(SpecError::HalfCredentials {
                    given: "access_key_id",
                    missing: "secret_access_key",
                }),
            ),
            (
                "s3://b",
                S3Options {
                    secret_access_key: Some("s".into()),
                    ..S3Options::default()
                },
                Err(SpecError::HalfCredentials {
                    given: "secret_access_key",
                    missing: "access_key_id",
                }),
            ),
            (
                "s3://b",
                S3Options {
                    session_token: Some("t".into()),
                    ..S3Options::default()
                },
                Err(SpecError::TokenWithoutCredentials),
            ),
            (
                "/var/b",
                key("id", "secret"),
                Err(SpecError::S3OptionsForDirectory {
                    path: "/var/b".into(),
                }),
            ),
            ("/var/b", S3Options::default(), Ok(())),
        ];
        for (location, options, expected) in table {
            let described = format!("{location} {options:?}");
            assert_eq!(
                TargetSpec::parse_with(location, options).map(|_| ()),
                expected,
                "{described}"
            );
        }
    }

    #[test]
    fn a_target_is_named_without_its_credentials() {
        let spec = TargetSpec::parse_with(
            "s3://bucket/cairn/prod",
            S3Options {
                endpoint: Some("https://s3.example".into()),
                access_key_id: Some("AKIAEXAMPLE".into()),
                secret_access_key: Some("very-secret".into()),
                session_token: Some("token-secret".into()),
                ..S3Options::default()
            },
        )
        .unwrap();
        assert_eq!(
            spec.to_string(),
            "s3://bucket/cairn/prod at https://s3.example"
        );
        let debug = format!("{spec:?}");
        assert!(
            !debug.contains("very-secret") && !debug.contains("token-secret"),
            "{debug}"
        );
        assert!(debug.contains("<redacted>"), "{debug}");
        assert_eq!(TargetSpec::parse("s3://b").unwrap().to_string(), "s3://b");
        assert_eq!(
            TargetSpec::parse("file:///x/y").unwrap().to_string(),
            "/x/y"
        );
    }
}
