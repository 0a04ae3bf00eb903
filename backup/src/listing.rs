//! What a target holds, sorted from its object names: pure (no I/O).

use crate::name::{BackupName, ObjectName};

/// One published backup in a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBackup {
    pub name: BackupName,
    pub size_bytes: u64,
}

impl StoredBackup {
    pub fn cluster_id(&self) -> &str {
        self.name.cluster_id()
    }

    /// The Raft log index the backup reflects.
    pub fn index(&self) -> u64 {
        self.name.index()
    }

    pub fn created_unix_ms(&self) -> u64 {
        self.name.created_unix_ms()
    }
}

/// A backup's temporary object (`<name>.part`): an upload being checked, or what a crash
/// left behind. Never fetched; pruned by retention once old ([`crate::Retention`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    pub name: BackupName,
    pub size_bytes: u64,
    /// When the target last wrote it (the target's clock).
    pub modified_unix_ms: u64,
}

/// A target's backups, newest first, and what the listing passed over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// Published backups, newest first ([`BackupName::newest_first`]).
    pub backups: Vec<StoredBackup>,
    /// `.part` objects, newest first.
    pub leftovers: Vec<Leftover>,
    /// Objects that are not ours (other names, sub-folders): never touched.
    pub foreign_count: usize,
}

impl Listing {
    /// How many objects the listing passed over: leftovers and foreign objects.
    pub fn ignored_count(&self) -> usize {
        self.leftovers.len() + self.foreign_count
    }

    /// The newest backup of `cluster_id`, if any.
    pub fn newest_of(&self, cluster_id: &str) -> Option<&StoredBackup> {
        self.backups.iter().find(|b| b.cluster_id() == cluster_id)
    }

    /// Adds one object, by its file name (`None` for one in a sub-folder of the target).
    pub(crate) fn add(&mut self, file_name: Option<&str>, size_bytes: u64, modified_unix_ms: u64) {
        match file_name.map(ObjectName::classify) {
            Some(ObjectName::Backup(name)) => self.backups.push(StoredBackup { name, size_bytes }),
            Some(ObjectName::Leftover(name)) => self.leftovers.push(Leftover {
                name,
                size_bytes,
                modified_unix_ms,
            }),
            Some(ObjectName::Foreign) | None => self.foreign_count += 1,
        }
    }

    /// Puts everything newest first.
    pub(crate) fn sort(&mut self) {
        self.backups
            .sort_by(|a, b| BackupName::newest_first(&a.name, &b.name));
        self.leftovers
            .sort_by(|a, b| BackupName::newest_first(&a.name, &b.name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_sorted_into_backups_newest_first_leftovers_and_foreign() {
        let name = |created, index| BackupName::new("c1", created, index).unwrap();
        let mut listing = Listing::default();
        let objects: Vec<(Option<String>, u64)> = vec![
            (Some(name(10, 1).file_name()), 100),
            (Some(name(30, 3).file_name()), 300),
            (Some(name(20, 2).file_name()), 200),
            (Some(name(40, 4).part_file_name()), 400),
            (Some("README".into()), 1),
            (None, 2), // a sub-folder's object, whatever its name
        ];
        for (file_name, size_bytes) in &objects {
            listing.add(file_name.as_deref(), *size_bytes, 7);
        }
        listing.sort();
        let backups: Vec<(u64, u64)> = listing
            .backups
            .iter()
            .map(|b| (b.created_unix_ms(), b.size_bytes))
            .collect();
        assert_eq!(backups, vec![(30, 300), (20, 200), (10, 100)]);
        assert_eq!(
            listing.leftovers,
            vec![Leftover {
                name: name(40, 4),
                size_bytes: 400,
                modified_unix_ms: 7
            }]
        );
        assert_eq!(listing.foreign_count, 2);
        assert_eq!(listing.ignored_count(), 3);
        assert_eq!(listing.newest_of("c1").map(|b| b.index()), Some(3));
        assert_eq!(listing.newest_of("c2"), None);
    }
}
