//! Backup object names: pure (no I/O).
//!
//! A backup's object name tells a listing everything it needs without downloading the object:
//!
//! ```text
//! cairn-<cluster_id>-<created_unix_ms, 20 digits>-<index, 20 digits>.snap
//! cairn-0f3c…9a-00000001764418800000-00000000000000012345.snap
//! ```
//!
//! The numbers are zero-padded to 20 digits (`u64::MAX` has 20), so that within one cluster
//! the names sort as the backups were taken. The cluster id may itself hold `-`: a name is
//! parsed from its end. While a backup is being written and checked it lives under its name
//! followed by [`PART_SUFFIX`] (a *leftover* when a crash leaves it behind).
//!
//! | object file name                                   | [`ObjectName`]          |
//! |----------------------------------------------------|-------------------------|
//! | `cairn-<id>-<20 digits>-<20 digits>.snap`          | `Backup`                |
//! | the same followed by `.part`                       | `Leftover`              |
//! | anything else (other prefix, other widths, a number over `u64::MAX`, a cluster id with other characters, a name in a sub-folder) | `Foreign` |

use std::cmp::Ordering;
use std::fmt;

/// Every backup's name starts with this.
pub const NAME_PREFIX: &str = "cairn-";
/// Every backup's name ends with this.
pub const NAME_SUFFIX: &str = ".snap";
/// A backup being uploaded and verified: its final name followed by this.
pub const PART_SUFFIX: &str = ".part";
/// The longest cluster id a name may hold (Cairn's own are 32 hex digits).
pub const CLUSTER_ID_BYTES_MAX: usize = 128;
/// Width of each number in a name: `u64::MAX` has 20 digits.
const NUMBER_DIGITS: usize = 20;

/// Why a name is not a backup name (or a cluster id cannot be put in one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("the cluster id is empty")]
    EmptyClusterId,
    #[error(
        "the cluster id is {bytes} bytes long, over the {CLUSTER_ID_BYTES_MAX} a backup name holds"
    )]
    ClusterIdTooLong { bytes: usize },
    #[error("the cluster id holds {found:?}: a backup name holds only ASCII letters, digits, '-', '_' and '.'")]
    ClusterIdCharacter { found: char },
    #[error("{name:?} is not a backup name ({why}); expected cairn-<cluster_id>-<created_unix_ms:020>-<index:020>.snap")]
    NotABackupName { name: String, why: &'static str },
}

/// The name of one backup: which cluster, when it was taken, and the log index it reflects.
/// Valid by construction ([`BackupName::new`], [`BackupName::parse`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BackupName {
    cluster_id: String,
    created_unix_ms: u64,
    index: u64,
}

/// What an object's file name says it is (see the module's table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectName {
    /// A published backup: it was read back and verified before it got this name.
    Backup(BackupName),
    /// A backup's temporary object (`<name>.part`): an upload in flight, or a crash's leftover.
    Leftover(BackupName),
    /// Not ours: never listed as a backup, never pruned.
    Foreign,
}

impl BackupName {
    /// A name for the backup of `cluster_id` at log `index`, taken at `created_unix_ms`.
    pub fn new(
        cluster_id: &str,
        created_unix_ms: u64,
        index: u64,
    ) -> Result<BackupName, NameError> {
        check_cluster_id(cluster_id)?;
        Ok(BackupName {
            cluster_id: cluster_id.to_string(),
            created_unix_ms,
            index,
        })
    }

    /// Parses a final backup name (not a `.part`, not a path): the exact inverse of
    /// [`BackupName::file_name`].
    pub fn parse(name: &str) -> Result<BackupName, NameError> {
        let not = |why| NameError::NotABackupName {
            name: name.to_string(),
            why,
        };
        let body = name
            .strip_prefix(NAME_PREFIX)
            .ok_or_else(|| not("it does not start with \"cairn-\""))?
            .strip_suffix(NAME_SUFFIX)
            .ok_or_else(|| not("it does not end with \".snap\""))?;
        let (rest, index) = body
            .rsplit_once('-')
            .ok_or_else(|| not("it holds no index"))?;
        let (cluster_id, created) = rest
            .rsplit_once('-')
            .ok_or_else(|| not("it holds no creation time"))?;
        let created_unix_ms = parse_number(created)
            .ok_or_else(|| not("its creation time is not 20 digits of a u64"))?;
        let index =
            parse_number(index).ok_or_else(|| not("its index is not 20 digits of a u64"))?;
        BackupName::new(cluster_id, created_unix_ms, index)
    }

    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    pub fn created_unix_ms(&self) -> u64 {
        self.created_unix_ms
    }

    /// The Raft log index the backup reflects (everything up to and including it).
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The object's file name: `cairn-<cluster_id>-<created_unix_ms:020>-<index:020>.snap`.
    pub fn file_name(&self) -> String {
        format!(
            "{NAME_PREFIX}{}-{:0width$}-{:0width$}{NAME_SUFFIX}",
            self.cluster_id,
            self.created_unix_ms,
            self.index,
            width = NUMBER_DIGITS
        )
    }

    /// The temporary object's file name while the backup is uploaded and verified.
    pub fn part_file_name(&self) -> String {
        format!("{}{PART_SUFFIX}", self.file_name())
    }

    /// Orders backups newest first: by creation time, then index, then cluster id, all
    /// descending (a total order: two different names never compare equal).
    pub fn newest_first(a: &BackupName, b: &BackupName) -> Ordering {
        (b.created_unix_ms, b.index, &b.cluster_id).cmp(&(
            a.created_unix_ms,
            a.index,
            &a.cluster_id,
        ))
    }
}

impl fmt::Display for BackupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file_name())
    }
}

impl std::str::FromStr for BackupName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<BackupName, NameError> {
        BackupName::parse(s)
    }
}

impl ObjectName {
    /// Sorts one object's file name (the last segment of its path; a caller passes
    /// [`ObjectName::Foreign`] itself for objects in sub-folders).
    pub fn classify(file_name: &str) -> ObjectName {
        if let Ok(name) = BackupName::parse(file_name) {
            return ObjectName::Backup(name);
        }
        match file_name.strip_suffix(PART_SUFFIX).map(BackupName::parse) {
            Some(Ok(name)) => ObjectName::Leftover(name),
            _ => ObjectName::Foreign,
        }
    }
}

fn check_cluster_id(cluster_id: &str) -> Result<(), NameError> {
    if cluster_id.is_empty() {
        return Err(NameError::EmptyClusterId);
    }
    if cluster_id.len() > CLUSTER_ID_BYTES_MAX {
        return Err(NameError::ClusterIdTooLong {
            bytes: cluster_id.len(),
        });
    }
    match cluster_id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        Some(found) => Err(NameError::ClusterIdCharacter { found }),
        None => Ok(()),
    }
}

/// Exactly [`NUMBER_DIGITS`] ASCII digits holding a `u64`.
fn parse_number(digits: &str) -> Option<u64> {
    if digits.len() != NUMBER_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0f3c5d7e9a1b2c3d4e5f60718293a4b5";

    #[test]
    fn a_name_is_formatted_and_parsed_back() {
        // (cluster id, created_unix_ms, index, file name)
        let table: &[(&str, u64, u64, &str)] = &[
            (
                ID,
                1_764_418_800_000,
                12_345,
                "cairn-0f3c5d7e9a1b2c3d4e5f60718293a4b5-00000001764418800000-00000000000000012345.snap",
            ),
            ("c1", 0, 0, "cairn-c1-00000000000000000000-00000000000000000000.snap"),
            (
                "a-b-c",
                u64::MAX,
                u64::MAX,
                "cairn-a-b-c-18446744073709551615-18446744073709551615.snap",
            ),
            ("x.y_z", 7, 8, "cairn-x.y_z-00000000000000000007-00000000000000000008.snap"),
        ];
        for &(id, created, index, file_name) in table {
            let name = BackupName::new(id, created, index).unwrap();
            assert_eq!(name.file_name(), file_name);
            assert_eq!(name.part_file_name(), format!("{file_name}.part"));
            let parsed = BackupName::parse(file_name).unwrap();
            assert_eq!(parsed, name, "{file_name}");
            assert_eq!(
                (
                    parsed.cluster_id(),
                    parsed.created_unix_ms(),
                    parsed.index()
                ),
                (id, created, index)
            );
        }
    }

    #[test]
    fn cluster_ids_a_name_cannot_hold_are_refused() {
        let long = "a".repeat(CLUSTER_ID_BYTES_MAX + 1);
        let table: &[(&str, NameError)] = &[
            ("", NameError::EmptyClusterId),
            (
                &long,
                NameError::ClusterIdTooLong {
                    bytes: CLUSTER_ID_BYTES_MAX + 1,
                },
            ),
            ("a/b", NameError::ClusterIdCharacter { found: '/' }),
            ("a b", NameError::ClusterIdCharacter { found: ' ' }),
            ("é", NameError::ClusterIdCharacter { found: 'é' }),
        ];
        for (id, expected) in table {
            assert_eq!(BackupName::new(id, 1, 1).unwrap_err(), *expected, "{id:?}");
        }
        assert!(BackupName::new(&"a".repeat(CLUSTER_ID_BYTES_MAX), 1, 1).is_ok());
    }

    #[test]
    fn object_names_are_sorted_into_backups_leftovers_and_foreign() {
        let backup = BackupName::new("c1", 5, 6).unwrap();
        let file = backup.file_name();
        let table: Vec<(String, ObjectName)> = vec![
            (file.clone(), ObjectName::Backup(backup.clone())),
            (format!("{file}.part"), ObjectName::Leftover(backup.clone())),
            // Two leftover suffixes, or the suffix on something else: not ours.
            (format!("{file}.part.part"), ObjectName::Foreign),
            ("notes.txt.part".into(), ObjectName::Foreign),
            ("".into(), ObjectName::Foreign),
            ("cairn-.snap".into(), ObjectName::Foreign),
            ("cairn-c1.snap".into(), ObjectName::Foreign),
            // Other prefix or suffix.
            (
                "kairn-c1-00000000000000000005-00000000000000000006.snap".into(),
                ObjectName::Foreign,
            ),
            (
                "cairn-c1-00000000000000000005-00000000000000000006.snap.gz".into(),
                ObjectName::Foreign,
            ),
            (
                "cairn-c1-00000000000000000005-00000000000000000006".into(),
                ObjectName::Foreign,
            ),
            // Numbers not exactly 20 digits, or over u64::MAX, or signed.
            ("cairn-c1-5-6.snap".into(), ObjectName::Foreign),
            (
                "cairn-c1-000000000000000000005-00000000000000000006.snap".into(),
                ObjectName::Foreign,
            ),
            (
                "cairn-c1-18446744073709551616-00000000000000000006.snap".into(),
                ObjectName::Foreign,
            ),
            (
                "cairn-c1-+0000000000000000005-00000000000000000006.snap".into(),
                ObjectName::Foreign,
            ),
            // No cluster id, or one with a character a name does not hold.
            (
                "cairn--00000000000000000005-00000000000000000006.snap".into(),
                ObjectName::Foreign,
            ),
            (
                "cairn-c 1-00000000000000000005-00000000000000000006.snap".into(),
                ObjectName::Foreign,
            ),
            (
                "cairn-00000000000000000005-00000000000000000006.snap".into(),
                ObjectName::Foreign,
            ),
        ];
        for (file_name, expected) in table {
            assert_eq!(ObjectName::classify(&file_name), expected, "{file_name:?}");
        }
    }

    #[test]
    fn a_parse_failure_names_the_name_and_what_is_wrong() {
        let message = BackupName::parse("cairn-c1-5-6.snap")
            .unwrap_err()
            .to_string();
        assert!(message.contains("\"cairn-c1-5-6.snap\""), "{message}");
        assert!(
            message.contains("creation time is not 20 digits"),
            "{message}"
        );
    }

    #[test]
    fn names_sort_newest_first_by_creation_then_index() {
        let n = |id: &str, created, index| BackupName::new(id, created, index).unwrap();
        let mut names = vec![
            n("a", 1, 9),
            n("a", 3, 1),
            n("b", 2, 5),
            n("a", 3, 2),
            n("b", 3, 2),
        ];
        names.sort_by(BackupName::newest_first);
        assert_eq!(
            names,
            vec![
                n("b", 3, 2),
                n("a", 3, 2),
                n("a", 3, 1),
                n("b", 2, 5),
                n("a", 1, 9)
            ]
        );
        // Within one cluster the file names sort the same way (ascending = oldest first).
        let mut files: Vec<String> = [n("a", 10, 1), n("a", 9, 100), n("a", 10, 0)]
            .iter()
            .map(BackupName::file_name)
            .collect();
        files.sort();
        assert_eq!(
            files,
            [n("a", 9, 100), n("a", 10, 0), n("a", 10, 1)].map(|n| n.file_name())
        );
    }
}
