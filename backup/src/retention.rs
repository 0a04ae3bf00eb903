//! Which backups to prune: one pure decision (no I/O, no clock: `now` is given).
//!
//! Backups are taken from one [`Listing`]; `rank` counts only the deciding cluster's
//! published backups, newest first (creation time, then index: [`BackupName::newest_first`]),
//! 0 being the newest. `age` is `now − created_unix_ms`, 0 for a backup from the future
//! (a clock set back). `count` is `max(retain_count, 1)`.
//!
//! | object                                  | rank      | age                         | decision |
//! |-----------------------------------------|-----------|-----------------------------|----------|
//! | another cluster's backup or leftover    | —         | —                           | keep: not this cluster's to prune |
//! | this cluster's backup                   | 0         | any, even over `retain_age` | keep: the newest verified backup is never pruned |
//! | this cluster's backup                   | < `count` | any                         | keep     |
//! | this cluster's backup                   | ≥ `count` | `retain_age` unset          | prune: `retain_count` is then a maximum too |
//! | this cluster's backup                   | ≥ `count` | ≤ `retain_age`              | keep: `retain_count` is a minimum, `retain_age` keeps more |
//! | this cluster's backup                   | ≥ `count` | > `retain_age`              | prune    |
//! | this cluster's leftover (`.part`)       | —         | modified ≤ `leftover_grace` ago (target's clock) | keep: an upload may be in flight |
//! | this cluster's leftover (`.part`)       | —         | modified > `leftover_grace` ago | prune: a crash's leftover |
//! | a foreign object                        | —         | —                           | never listed here: never pruned |
//!
//! So the backups kept are the `count` newest, and, with `retain_age`, every younger one
//! besides. Every published backup was verified before it got its name, so "the newest
//! verified backup" is the newest published one.

use std::time::Duration;

use crate::listing::Listing;
use crate::name::BackupName;

/// How long a `.part` object is left alone by default: far longer than any upload and check.
pub const LEFTOVER_GRACE_DEFAULT: Duration = Duration::from_secs(24 * 60 * 60);

/// How many backups to keep, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// The newest this many are always kept (0 counts as 1: the newest is never pruned).
    pub retain_count: usize,
    /// Beyond `retain_count`, backups younger than this are kept too; unset: none are.
    pub retain_age: Option<Duration>,
    /// A `.part` object modified longer ago than this is a leftover to prune.
    pub leftover_grace: Duration,
}

impl Retention {
    /// `retain_count` and `retain_age`, with [`LEFTOVER_GRACE_DEFAULT`].
    pub fn new(retain_count: usize, retain_age: Option<Duration>) -> Retention {
        Retention {
            retain_count,
            retain_age,
            leftover_grace: LEFTOVER_GRACE_DEFAULT,
        }
    }
}

/// What [`decide_retention`] chose for one cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionDecision {
    /// Published backups to delete, oldest last.
    pub prune: Vec<BackupName>,
    /// Leftover `.part` objects to delete.
    pub prune_leftovers: Vec<BackupName>,
    /// This cluster's published backups kept.
    pub kept: usize,
}

/// Decides which of `cluster_id`'s backups and leftovers in `listing` to prune at
/// `now_unix_ms` (see the module's table). Never prunes the newest of them.
pub fn decide_retention(
    listing: &Listing,
    cluster_id: &str,
    now_unix_ms: u64,
    retention: &Retention,
) -> RetentionDecision {
    let count = retention.retain_count.max(1);
    let mut ours: Vec<&BackupName> = listing
        .backups
        .iter()
        .map(|b| &b.name)
        .filter(|n| n.cluster_id() == cluster_id)
        .collect();
    ours.sort_by(|a, b| BackupName::newest_first(a, b));

    let mut decision = RetentionDecision::default();
    for (rank, name) in ours.iter().enumerate() {
        let age_ms = now_unix_ms.saturating_sub(name.created_unix_ms());
        let keep = rank < count
            || retention
                .retain_age
                .is_some_and(|max| u128::from(age_ms) <= max.as_millis());
        if keep {
            decision.kept += 1;
        } else {
            decision.prune.push((*name).clone());
        }
    }
    let grace_ms = retention.leftover_grace.as_millis();
    decision.prune_leftovers = listing
        .leftovers
        .iter()
        .filter(|l| l.name.cluster_id() == cluster_id)
        .filter(|l| u128::from(now_unix_ms.saturating_sub(l.modified_unix_ms)) > grace_ms)
        .map(|l| l.name.clone())
        .collect();

    // Invariant: the newest verified backup is never pruned (rank 0 is always kept).
    debug_assert!(ours
        .first()
        .is_none_or(|newest| !decision.prune.contains(newest)));
    decision
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listing::{Leftover, StoredBackup};

    const HOUR_MS: u64 = 3_600_000;
    const NOW: u64 = 1_000 * HOUR_MS;

    fn backup(cluster_id: &str, hours_old: u64) -> StoredBackup {
        StoredBackup {
            name: BackupName::new(cluster_id, NOW - hours_old * HOUR_MS, 1_000 - hours_old)
                .unwrap(),
            size_bytes: 1,
        }
    }

    /// Ages in hours of the cluster "c1" backups pruned, for a listing of backups of the
    /// given ages (and, in every case, two of "c2" that must never be pruned).
    fn pruned_ages(ages: &[u64], retain_count: usize, retain_age_hours: Option<u64>) -> Vec<u64> {
        let mut backups: Vec<StoredBackup> = ages.iter().map(|&h| backup("c1", h)).collect();
        backups.push(backup("c2", 500));
        backups.push(backup("c2", 0));
        let listing = Listing {
            backups,
            ..Listing::default()
        };
        let retention = Retention::new(
            retain_count,
            retain_age_hours.map(|h| Duration::from_millis(h * HOUR_MS)),
        );
        let decision = decide_retention(&listing, "c1", NOW, &retention);
        assert!(decision.prune.iter().all(|n| n.cluster_id() == "c1"));
        assert_eq!(decision.kept + decision.prune.len(), ages.len());
        decision
            .prune
            .iter()
            .map(|n| (NOW - n.created_unix_ms()) / HOUR_MS)
            .collect()
    }

    #[test]
    fn retention_keeps_the_newest_count_and_the_young_and_prunes_the_rest() {
        /// (ages of c1's backups in hours, retain_count, retain_age in hours, pruned ages)
        type Case = (&'static [u64], usize, Option<u64>, &'static [u64]);
        let table: &[Case] = &[
            // Nothing to decide.
            (&[], 3, None, &[]),
            (&[], 0, Some(1), &[]),
            // Count only: exactly the newest `count` stay, whatever the listing order.
            (&[1, 2, 3, 4, 5], 3, None, &[4, 5]),
            (&[5, 3, 1, 4, 2], 3, None, &[4, 5]),
            (&[1, 2], 3, None, &[]),
            // Count 0 counts as 1: the newest is never pruned.
            (&[1, 2, 3], 0, None, &[2, 3]),
            (&[7], 0, None, &[]),
            // Age: beyond the count, the young are kept and the old pruned.
            (&[1, 2, 30, 40, 50], 2, Some(24), &[30, 40, 50]),
            (&[1, 2, 3, 30], 2, Some(24), &[30]),
            // Exactly retain_age old is kept (pruned only when older).
            (&[1, 2, 24, 25], 1, Some(24), &[25]),
            // The count keeps old backups that the age alone would prune.
            (&[100, 200, 300], 2, Some(24), &[300]),
            // The newest is kept even when every backup is older than retain_age.
            (&[100, 200, 300], 0, Some(24), &[200, 300]),
            (&[100], 0, Some(1), &[]),
        ];
        for &(ages, count, age, expected) in table {
            let mut pruned = pruned_ages(ages, count, age);
            pruned.sort_unstable();
            assert_eq!(pruned, expected, "ages {ages:?} count {count} age {age:?}");
        }
    }

    #[test]
    fn a_backup_from_the_future_counts_as_new() {
        let future = StoredBackup {
            name: BackupName::new("c1", NOW + 10 * HOUR_MS, 2).unwrap(),
            size_bytes: 1,
        };
        let listing = Listing {
            backups: vec![future, backup("c1", 2), backup("c1", 48)],
            ..Listing::default()
        };
        let retention = Retention::new(1, Some(Duration::from_millis(24 * HOUR_MS)));
        let decision = decide_retention(&listing, "c1", NOW, &retention);
        let pruned: Vec<u64> = decision.prune.iter().map(|n| n.index()).collect();
        assert_eq!(pruned, vec![1_000 - 48]);
        assert_eq!(decision.kept, 2);
    }

    #[test]
    fn leftovers_are_pruned_after_the_grace_and_only_this_clusters() {
        let leftover = |cluster_id: &str, index, modified_hours_ago: u64| Leftover {
            name: BackupName::new(cluster_id, 1, index).unwrap(),
            size_bytes: 1,
            modified_unix_ms: NOW - modified_hours_ago * HOUR_MS,
        };
        let listing = Listing {
            backups: vec![backup("c1", 1)],
            leftovers: vec![
                leftover("c1", 1, 1),  // young: an upload may be in flight
                leftover("c1", 2, 24), // exactly the grace: kept
                leftover("c1", 3, 25), // older: pruned
                leftover("c2", 4, 99), // another cluster's: kept
            ],
            foreign_count: 5,
        };
        let decision = decide_retention(&listing, "c1", NOW, &Retention::new(1, None));
        let pruned: Vec<u64> = decision.prune_leftovers.iter().map(|n| n.index()).collect();
        assert_eq!(pruned, vec![3]);
        assert!(decision.prune.is_empty());
    }
}
