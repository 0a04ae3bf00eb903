//! Replicas that check each other (`docs/operations.md`, "Replicas that check each other"):
//! the running digest of the table, the decision that names the members whose digest
//! differs from the majority's, and the replicated `CORRUPT` alarm that names them.
//!
//! - **The digest** of a table is the wrapping sum, over its stored resources, of
//!   [`entry_digest`] (the first 8 bytes of the SHA-256 of the storage key and the stored
//!   encoding). A sum does not depend on order, so `State::set` keeps it up to date in O(1)
//!   per change (subtract the old entry, add the new), for writes, restores and snapshot
//!   installs alike; two replicas that applied the same log hold the same digest at the same
//!   index. SHA-256 is fixed by its standard, so builds of different releases agree (the
//!   stored encoding may still differ between releases: the node compares only members that
//!   report the same build).
//! - **The decision** ([`odd_ones_out`]) is pure: the digests members report at one index in,
//!   the members that differ from a strict majority out.
//! - **The alarm** ([`CorruptAlarm`]) is replicated state, changed only through the log
//!   ([`crate::Command::Integrity`]), so every member agrees which members are named at every
//!   index. A named member refuses reads (the node's rule); an operator replaces it and
//!   disarms.

use sha2::{Digest as _, Sha256};

/// Digests kept per applied index, for the questions "what was your digest at index N"
/// that the leader asks while members apply at slightly different paces.
pub const DIGESTS_KEPT: usize = 4096;

/// Most members one alarm names (a cluster has a handful).
pub const CORRUPT_MEMBERS_MAX: usize = 64;

/// What one stored resource adds to the table's digest.
pub fn entry_digest(key: &[u8], encoded: &[u8]) -> u64 {
    let mut hasher = Sha256::new();
    hasher.update((key.len() as u64).to_le_bytes());
    hasher.update(key);
    hasher.update(encoded);
    let out = hasher.finalize();
    u64::from_le_bytes(out[..8].try_into().expect("a SHA-256 has 32 bytes"))
}

/// A change of the `CORRUPT` alarm ([`crate::Command::Integrity`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IntegrityAction {
    /// The leader's, after a check found these members' digests differ from the majority's
    /// (they are added to the members already named).
    RaiseCorrupt(Vec<u64>),
    /// An operator's (`cairn alarm disarm`), once the named members are replaced.
    Disarm,
}

/// The replicated `CORRUPT` alarm: the members named (sorted, none = not raised) and the
/// index of the entry that raised it last.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CorruptAlarm {
    pub members: Vec<u64>,
    pub raised_index: u64,
}

impl CorruptAlarm {
    /// Whether the alarm is raised.
    pub fn is_raised(&self) -> bool {
        !self.members.is_empty()
    }

    /// Whether the alarm names `member`.
    pub fn names(&self, member: u64) -> bool {
        self.members.binary_search(&member).is_ok()
    }

    /// The alarm after `action` in the entry at `index`. Raising names the union of the
    /// members already named and the new ones (at most [`CORRUPT_MEMBERS_MAX`]).
    pub fn act(&self, action: &IntegrityAction, index: u64) -> CorruptAlarm {
        let next = match action {
            IntegrityAction::RaiseCorrupt(members) => {
                let mut all: Vec<u64> = self.members.iter().chain(members).copied().collect();
                all.sort_unstable();
                all.dedup();
                all.truncate(CORRUPT_MEMBERS_MAX);
                if all == self.members {
                    self.clone()
                } else {
                    CorruptAlarm {
                        members: all,
                        raised_index: index,
                    }
                }
            }
            IntegrityAction::Disarm => CorruptAlarm::default(),
        };
        assert!(
            next.members.windows(2).all(|w| w[0] < w[1]),
            "the named members are sorted and distinct"
        );
        assert_eq!(
            next.is_raised(),
            next.raised_index > 0,
            "a raised alarm names the entry that raised it (entries start at 1)"
        );
        next
    }
}

/// What the digests members reported at one index say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every member that answered holds the same digest.
    Agree,
    /// A strict majority of the answers hold one digest; these members hold another.
    Differ(Vec<u64>),
    /// No digest is held by a strict majority of the answers: no member can be trusted
    /// over another (every answering member is listed).
    NoMajority(Vec<u64>),
}

/// The decision of a check: `answers` are (member, digest) at one index, one per member.
///
/// | answers (member: digest) | verdict |
/// |---|---|
/// | none, or all the same | Agree |
/// | 1: a, 2: a, 3: b | `Differ [3]` |
/// | 1: a, 2: a, 3: b, 4: c, 5: a | `Differ [3, 4]` |
/// | 1: a, 2: b | `NoMajority [1, 2]` (a tie: neither side is a majority) |
/// | 1: a, 2: b, 3: c | `NoMajority [1, 2, 3]` |
pub fn odd_ones_out(answers: &[(u64, u64)]) -> Verdict {
    let mut counts: Vec<(u64, usize)> = Vec::new();
    for &(_, digest) in answers {
        match counts.iter_mut().find(|(d, _)| *d == digest) {
            Some((_, n)) => *n += 1,
            None => counts.push((digest, 1)),
        }
    }
    if counts.len() <= 1 {
        return Verdict::Agree;
    }
    let mut members: Vec<u64> = answers.iter().map(|(m, _)| *m).collect();
    members.sort_unstable();
    match counts.iter().find(|(_, n)| *n * 2 > answers.len()) {
        Some(&(majority, _)) => {
            let mut odd: Vec<u64> = answers
                .iter()
                .filter(|(_, d)| *d != majority)
                .map(|(m, _)| *m)
                .collect();
            odd.sort_unstable();
            assert!(
                !odd.is_empty() && odd.len() * 2 < answers.len(),
                "a strict majority leaves a strict minority"
            );
            Verdict::Differ(odd)
        }
        None => Verdict::NoMajority(members),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_members_that_differ_from_a_strict_majority_are_named() {
        use Verdict::*;
        let table: &[(&[(u64, u64)], Verdict)] = &[
            (&[], Agree),
            (&[(1, 7)], Agree),
            (&[(1, 7), (2, 7), (3, 7)], Agree),
            (&[(1, 7), (2, 7), (3, 9)], Differ(vec![3])),
            (&[(3, 9), (1, 7), (2, 7)], Differ(vec![3])),
            (
                &[(1, 7), (2, 7), (3, 9), (4, 8), (5, 7)],
                Differ(vec![3, 4]),
            ),
            (&[(1, 7), (2, 9)], NoMajority(vec![1, 2])),
            (&[(1, 7), (2, 8), (3, 9)], NoMajority(vec![1, 2, 3])),
            (
                &[(1, 7), (2, 7), (3, 9), (4, 9)],
                NoMajority(vec![1, 2, 3, 4]),
            ),
        ];
        for (answers, expected) in table {
            assert_eq!(&odd_ones_out(answers), expected, "{answers:?}");
        }
    }

    #[test]
    fn the_alarm_adds_members_and_a_disarm_clears_it() {
        let none = CorruptAlarm::default();
        let raised = none.act(&IntegrityAction::RaiseCorrupt(vec![3]), 10);
        assert_eq!((raised.members.clone(), raised.raised_index), (vec![3], 10));
        assert!(raised.names(3) && !raised.names(1));
        // The same members again: unchanged, the first raise's index kept.
        assert_eq!(
            raised.act(&IntegrityAction::RaiseCorrupt(vec![3]), 20),
            raised
        );
        let more = raised.act(&IntegrityAction::RaiseCorrupt(vec![5, 1]), 30);
        assert_eq!(
            (more.members.clone(), more.raised_index),
            (vec![1, 3, 5], 30)
        );
        assert_eq!(
            more.act(&IntegrityAction::Disarm, 40),
            CorruptAlarm::default()
        );
    }

    #[test]
    fn an_entry_digest_depends_on_the_key_and_the_bytes() {
        let base = entry_digest(b"k", b"v");
        assert_eq!(base, entry_digest(b"k", b"v"), "deterministic");
        assert_ne!(base, entry_digest(b"k", b"w"));
        assert_ne!(base, entry_digest(b"j", b"v"));
        // The key's length is hashed: moving a byte between key and value changes it.
        assert_ne!(entry_digest(b"kv", b""), entry_digest(b"k", b"v"));
    }
}
