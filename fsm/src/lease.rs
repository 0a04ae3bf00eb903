//! Leases: a time-to-live that a client keeps alive, and the resources attached to it
//! (`docs/contract.md`, "Leases").
//!
//! **What is replicated here** is everything but time: each lease's id, its TTL, the
//! index of its grant and of its last renewal ([`Lease`]), and which resources are
//! attached to it (derived from each stored resource's `lease` field, so a snapshot
//! only needs the leases themselves). Every rule below is a pure function of the
//! applied entries.
//!
//! **Time is the node's.** A lease expires when its holder stops renewing it for a TTL.
//! No replica can tell that from the log alone, so the node measures it: every node
//! notes, on its own monotonic clock, when it first saw each lease's latest renewal
//! (`renewed_revision`), and the leader proposes [`crate::Command::LeaseExpire`] for a
//! lease whose TTL has run out since then. The expiry names the renewal it judged; it
//! revokes the lease only if that is still the lease's last renewal
//! ([`expire_decision`]), so a keep-alive that was applied after the leader looked
//! always wins, on every replica, whichever leader proposed the expiry. A new leader
//! measures each lease from the moment it saw its last renewal, which is never before
//! the renewal was committed, so it never shortens the life a keep-alive promised, and
//! gives at most the time between that commit and its own apply of extra life (a
//! restarted node: a TTL from its restart).
//!
//! ## Invariants
//! - A lease's id is never 0 and at least the index of its grant; ids only grow
//!   (a grant gets the entry's index, or one above the highest id held after a
//!   restore brought higher ones).
//! - `granted_revision <= renewed_revision <= the applied index`.
//! - Every stored resource whose `lease` is not 0 is attached to a lease that exists
//!   (checked when it is written or restored); revoking or expiring a lease deletes
//!   every resource attached to it in the same entry.
//! - At most [`LEASES_HARD_MAX`] leases exist; every TTL is in
//!   `1..=`[`LEASE_TTL_HARD_MAX_MS`].

use crate::FsmError;

/// The most leases that can exist at once: the bound at apply, and the largest
/// `leases_max` a node may configure.
pub const LEASES_HARD_MAX: usize = 100_000;
/// The longest TTL applied (30 days), and the largest `lease_ttl_max_ms`.
pub const LEASE_TTL_HARD_MAX_MS: u64 = 30 * 24 * 60 * 60 * 1000;
/// The most leases one keep-alive or expiry entry names.
pub const LEASE_IDS_PER_ENTRY_MAX: usize = 10_000;

/// One lease, as replicated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub id: u64,
    pub ttl_ms: u64,
    /// The index of the entry that granted it (or of the restore that brought it).
    pub granted_revision: u64,
    /// The index of its last renewal: its grant, a keep-alive, or the restore that
    /// brought it. What the node measures its TTL from.
    pub renewed_revision: u64,
}

/// What a lease command did ([`crate::Applied`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseApplied {
    /// The new lease.
    Granted(Lease),
    /// A revoke: `existed = false` when there was no such lease (nothing changed);
    /// `deleted` attached resources went with it.
    Revoked { existed: bool, deleted: u64 },
    /// Each id of a keep-alive with the lease's TTL, or 0 for a lease that does not
    /// exist (any more), in the order asked.
    KeptAlive(Vec<(u64, u64)>),
    /// The leases an expiry revoked (those still at the renewal it judged), and how
    /// many attached resources went with them.
    Expired { expired: Vec<u64>, deleted: u64 },
}

/// The id a grant at `index` gets, where `highest_id` is the highest lease id held
/// (0: none): the index, unless a restore brought a higher id.
pub fn grant_id(index: u64, highest_id: u64) -> u64 {
    assert!(index > 0, "a grant is a log entry");
    index.max(highest_id.saturating_add(1))
}

/// Checks a grant's TTL and the number of leases against the hard bounds (the node
/// checks its configured ones before proposing).
pub fn check_grant(ttl_ms: u64, lease_count: usize, leases_max: usize) -> Result<(), FsmError> {
    check_ttl(ttl_ms, 1, LEASE_TTL_HARD_MAX_MS, "")?;
    if lease_count >= leases_max {
        return Err(FsmError::ResourceExhausted {
            limit: "leases_max".into(),
            value: leases_max as u64,
            reason: format!(
                "{lease_count} leases exist, the most leases_max = {leases_max} allows: \
                 revoke unused ones, or share one lease among a client's resources"
            ),
        });
    }
    Ok(())
}

/// Checks `ttl_ms` against `min_ms..=max_ms`; `config` names where the bounds come from
/// in the message ("" for the hard bounds).
pub fn check_ttl(ttl_ms: u64, min_ms: u64, max_ms: u64, config: &str) -> Result<(), FsmError> {
    if (min_ms..=max_ms).contains(&ttl_ms) {
        return Ok(());
    }
    Err(FsmError::invalid(
        "ttl_ms",
        format!("{ttl_ms} ms is outside {min_ms}..={max_ms} ms{config}"),
    ))
}

/// Checks the ids of a keep-alive or an expiry entry: at most
/// [`LEASE_IDS_PER_ENTRY_MAX`], none 0.
pub fn check_ids(ids: &[u64]) -> Result<(), FsmError> {
    if ids.len() > LEASE_IDS_PER_ENTRY_MAX {
        return Err(FsmError::invalid(
            "ids",
            format!(
                "{} leases in one entry, more than {LEASE_IDS_PER_ENTRY_MAX}",
                ids.len()
            ),
        ));
    }
    if ids.contains(&0) {
        return Err(FsmError::invalid("ids", "0 is not a lease id"));
    }
    Ok(())
}

/// Whether an expiry that judged the renewal `judged_renewal` of a lease revokes it,
/// given the lease as stored now (`None`: it no longer exists).
///
/// | lease now                         | outcome                                  |
/// |-----------------------------------|------------------------------------------|
/// | gone (revoked, expired)           | nothing: already gone                    |
/// | renewed at `judged_renewal`       | revoked: nothing renewed it since        |
/// | renewed at another index          | kept: a keep-alive came after the verdict |
pub fn expire_decision(now: Option<&Lease>, judged_renewal: u64) -> bool {
    now.is_some_and(|lease| lease.renewed_revision == judged_renewal)
}

/// The message of a write naming a lease that does not exist.
pub fn no_such_lease(id: u64) -> FsmError {
    FsmError::FailedPrecondition(format!(
        "lease {id} does not exist: it expired or was revoked (a lease never comes back; \
         grant a new one)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(renewed_revision: u64) -> Lease {
        Lease {
            id: 5,
            ttl_ms: 1000,
            granted_revision: 5,
            renewed_revision,
        }
    }

    #[test]
    fn an_expiry_revokes_only_the_renewal_it_judged() {
        // (lease now, judged renewal, revoked)
        let table = [
            (None, 7, false),
            (Some(lease(7)), 7, true),
            (Some(lease(9)), 7, false),
            (Some(lease(5)), 7, false),
        ];
        for (now, judged, revoked) in table {
            assert_eq!(
                expire_decision(now.as_ref(), judged),
                revoked,
                "{now:?} {judged}"
            );
        }
    }

    #[test]
    fn a_grant_takes_its_index_unless_a_restored_id_is_higher() {
        assert_eq!(grant_id(10, 0), 10);
        assert_eq!(grant_id(10, 9), 10);
        assert_eq!(grant_id(10, 10), 11);
        assert_eq!(grant_id(10, 500), 501);
    }

    #[test]
    fn grants_and_ids_are_bounded_with_errors_naming_the_bound() {
        assert!(check_grant(1000, 0, 10).is_ok());
        let zero = check_grant(0, 0, 10).unwrap_err().to_string();
        assert!(zero.contains("ttl_ms"), "{zero}");
        let long = check_grant(LEASE_TTL_HARD_MAX_MS + 1, 0, 10).unwrap_err();
        assert!(long.to_string().contains("ttl_ms"), "{long}");
        let full = check_grant(1000, 10, 10).unwrap_err();
        assert!(
            matches!(&full, FsmError::ResourceExhausted { limit, .. } if limit == "leases_max"),
            "{full:?}"
        );
        assert!(check_ids(&[1, 2]).is_ok());
        assert!(check_ids(&[0]).is_err());
        assert!(check_ids(&vec![1; LEASE_IDS_PER_ENTRY_MAX + 1]).is_err());
    }
}
