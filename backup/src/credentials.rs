//! S3 credentials from a file in the AWS shared credentials format (`~/.aws/credentials`),
//! so that no secret need be written in Cairn's own configuration: the parse is pure, the
//! read bounded ([`CREDENTIALS_FILE_BYTES_MAX`]).
//!
//! ```text
//! # comments start with '#' or ';'
//! [default]
//! aws_access_key_id = AKIA...
//! aws_secret_access_key = ...
//! aws_session_token = ...        (optional: temporary credentials)
//! [backups]                      (or [profile backups], as in ~/.aws/config)
//! ...
//! ```
//!
//! | file                                                | result                                  |
//! |-----------------------------------------------------|-----------------------------------------|
//! | the profile with both keys (and maybe a token)      | the credentials                         |
//! | other keys in the profile (`region`, ...)           | ignored                                 |
//! | no such profile                                     | refused: [`CredentialsError::NoProfile`] |
//! | a key missing, or empty                             | refused: [`CredentialsError::Missing`]  |
//! | a key given twice in the profile                    | refused: [`CredentialsError::Syntax`]   |
//! | a line that is neither a section, `key = value` nor a comment | refused: [`CredentialsError::Syntax`] |
//! | a file over 64 KiB, not UTF-8, unreadable           | refused                                 |
//!
//! No message ever holds a value of the file: only its path, the profile, key names and
//! line numbers.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::spec::S3Options;

/// The largest credentials file read (a real one is a few hundred bytes).
pub const CREDENTIALS_FILE_BYTES_MAX: u64 = 64 * 1024;

/// An access key, its secret and maybe a session token. `Debug` shows none of them but the
/// key id.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// Why a credentials file gives no credentials. Never holds a value of the file.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("cannot read credentials file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("credentials file {} is larger than {limit} bytes: not a credentials file", path.display())]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("credentials file {} is not UTF-8 text", path.display())]
    NotText { path: PathBuf },
    #[error("credentials file {}: {what}", path.display())]
    Parse { path: PathBuf, what: ParseError },
}

/// What is wrong with a credentials file's text (no path: [`parse_credentials`] is pure).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("no profile [{profile}]")]
    NoProfile { profile: String },
    #[error("profile [{profile}] has no {key} (or it is empty)")]
    Missing { profile: String, key: &'static str },
    #[error("line {line}: {why}")]
    Syntax { line: usize, why: &'static str },
}

const KEY_ID: &str = "aws_access_key_id";
const SECRET: &str = "aws_secret_access_key";
const TOKEN: &str = "aws_session_token";

/// The credentials of `profile` in the text of a credentials file (see the module's table).
pub fn parse_credentials(text: &str, profile: &str) -> Result<S3Credentials, ParseError> {
    let mut in_profile = false;
    let mut found_profile = false;
    let (mut id, mut secret, mut token): (Option<String>, Option<String>, Option<String>) =
        (None, None, None);
    for (n, raw) in text.lines().enumerate() {
        let line_number = n + 1;
        let syntax = |why| ParseError::Syntax {
            line: line_number,
            why,
        };
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[') {
            let name = section
                .strip_suffix(']')
                .ok_or_else(|| syntax("a section header without its closing ']'"))?
                .trim();
            let name = name.strip_prefix("profile ").map_or(name, str::trim);
            in_profile = name == profile;
            found_profile |= in_profile;
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| syntax("neither [profile], key = value nor a comment"))?;
        if !in_profile {
            continue;
        }
        let slot = match key.trim().to_ascii_lowercase().as_str() {
            KEY_ID => &mut id,
            SECRET => &mut secret,
            TOKEN => &mut token,
            _ => continue,
        };
        if slot.is_some() {
            return Err(syntax("a key given twice in the profile"));
        }
        *slot = Some(value.trim().to_string());
    }
    if !found_profile {
        return Err(ParseError::NoProfile {
            profile: profile.to_string(),
        });
    }
    let required = |value: Option<String>, key| {
        value
            .filter(|v| !v.is_empty())
            .ok_or_else(|| ParseError::Missing {
                profile: profile.to_string(),
                key,
            })
    };
    Ok(S3Credentials {
        access_key_id: required(id, KEY_ID)?,
        secret_access_key: required(secret, SECRET)?,
        session_token: token.filter(|t| !t.is_empty()),
    })
}

/// Reads `path` (at most [`CREDENTIALS_FILE_BYTES_MAX`]) and parses `profile` from it.
pub fn read_credentials_file(
    path: &Path,
    profile: &str,
) -> Result<S3Credentials, CredentialsError> {
    let read = |source| CredentialsError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read)?;
    let mut bytes = Vec::new();
    file.take(CREDENTIALS_FILE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(read)?;
    if bytes.len() as u64 > CREDENTIALS_FILE_BYTES_MAX {
        return Err(CredentialsError::TooLarge {
            path: path.to_path_buf(),
            limit: CREDENTIALS_FILE_BYTES_MAX,
        });
    }
    let text = String::from_utf8(bytes).map_err(|_| CredentialsError::NotText {
        path: path.to_path_buf(),
    })?;
    parse_credentials(&text, profile).map_err(|what| CredentialsError::Parse {
        path: path.to_path_buf(),
        what,
    })
}

impl S3Options {
    /// These options with explicit `credentials` (nothing is then read from the
    /// environment's credentials).
    pub fn with_credentials(mut self, credentials: S3Credentials) -> S3Options {
        self.access_key_id = Some(credentials.access_key_id);
        self.secret_access_key = Some(credentials.secret_access_key);
        self.session_token = credentials.session_token;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(id: &str, secret: &str, token: Option<&str>) -> Result<S3Credentials, ParseError> {
        Ok(S3Credentials {
            access_key_id: id.into(),
            secret_access_key: secret.into(),
            session_token: token.map(Into::into),
        })
    }

    #[test]
    fn a_profile_gives_its_credentials_or_names_what_is_missing() {
        let syntax = |line, why| Err(ParseError::Syntax { line, why });
        let missing = |key| {
            Err(ParseError::Missing {
                profile: "default".into(),
                key,
            })
        };
        let table: Vec<(&str, &str, Result<S3Credentials, ParseError>)> = vec![
            (
                "[default]\naws_access_key_id = AK\naws_secret_access_key = SK\n",
                "default",
                creds("AK", "SK", None),
            ),
            (
                "# c\n; c\n[other]\naws_access_key_id=X\naws_secret_access_key=Y\n\n[default]\n  AWS_ACCESS_KEY_ID=AK  \naws_secret_access_key= S=K\naws_session_token = T\nregion = eu-west-1\n",
                "default",
                creds("AK", "S=K", Some("T")),
            ),
            (
                "[profile backups]\naws_access_key_id = AK\naws_secret_access_key = SK\n",
                "backups",
                creds("AK", "SK", None),
            ),
            (
                "[default]\naws_access_key_id = AK\naws_secret_access_key = SK\naws_session_token =\n",
                "default",
                creds("AK", "SK", None),
            ),
            (
                "[other]\naws_access_key_id = AK\n",
                "default",
                Err(ParseError::NoProfile {
                    profile: "default".into(),
                }),
            ),
            ("", "default", Err(ParseError::NoProfile { profile: "default".into() })),
            ("[default]\naws_access_key_id = AK\n", "default", missing(SECRET)),
            (
                "[default]\naws_access_key_id =\naws_secret_access_key = SK\n",
                "default",
                missing(KEY_ID),
            ),
            (
                "[default]\naws_access_key_id = A\naws_access_key_id = B\n",
                "default",
                syntax(3, "a key given twice in the profile"),
            ),
            (
                "[default\n",
                "default",
                syntax(1, "a section header without its closing ']'"),
            ),
            (
                "[default]\njust words\n",
                "default",
                syntax(2, "neither [profile], key = value nor a comment"),
            ),
        ];
        for (text, profile, expected) in table {
            assert_eq!(parse_credentials(text, profile), expected, "{text:?}");
        }
    }

    #[test]
    fn no_message_shows_a_value() {
        let text = "[default]\naws_access_key_id = KEYVALUE\naws_access_key_id = SECRETVALUE\n";
        let error = parse_credentials(text, "default").unwrap_err().to_string();
        assert!(
            !error.contains("KEYVALUE") && !error.contains("SECRETVALUE"),
            "{error}"
        );
        let ok = parse_credentials(
            "[default]\naws_access_key_id = K\naws_secret_access_key = SECRETVALUE\naws_session_token = TOKENVALUE",
            "default",
        )
        .unwrap();
        let shown = format!("{ok:?}");
        assert!(
            !shown.contains("SECRETVALUE") && !shown.contains("TOKENVALUE"),
            "{shown}"
        );
    }

    #[test]
    fn a_file_is_read_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials");
        std::fs::write(
            &path,
            "[default]\naws_access_key_id=A\naws_secret_access_key=B\n",
        )
        .unwrap();
        assert_eq!(
            read_credentials_file(&path, "default").unwrap(),
            creds("A", "B", None).unwrap()
        );
        std::fs::write(&path, vec![b'#'; CREDENTIALS_FILE_BYTES_MAX as usize + 1]).unwrap();
        assert!(matches!(
            read_credentials_file(&path, "default"),
            Err(CredentialsError::TooLarge { .. })
        ));
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        assert!(matches!(
            read_credentials_file(&path, "default"),
            Err(CredentialsError::NotText { .. })
        ));
        assert!(matches!(
            read_credentials_file(&dir.path().join("absent"), "default"),
            Err(CredentialsError::Read { .. })
        ));
    }
}
