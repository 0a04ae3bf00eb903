//! Leases on a running node: the clock that measures them, and their expiry, decided by
//! the leader (the replicated rules are [`cairn_fsm::lease`]'s; what a client may rely on
//! is `docs/contract.md`, "Leases").
//!
//! - **Every node measures every lease** ([`LeaseClock`]): it notes, on its own monotonic
//!   clock, when it first saw each lease's latest renewal (`renewed_revision`: the grant, a
//!   keep-alive, or the restore that brought it). A lease's deadline on a node is that
//!   moment plus its TTL ([`deadline_ms`]). A node sees a renewal only once it was
//!   committed, and the client that sent it counts its TTL from before it sent it, so no
//!   node's deadline comes before the one the client was promised.
//! - **Only the leader expires leases** ([`expire_leases`]), once its state holds
//!   everything committed: it proposes [`Command::LeaseExpire`] for the leases past their
//!   deadline, naming the renewal it judged, and the fsm revokes a lease only if that is
//!   still its last renewal. A new leader measures each lease from when it saw its last
//!   renewal, so a leader change never shortens a lease, and gives it at most the time
//!   the renewal took to reach the new leader of extra life; a restarted node gives each
//!   lease a TTL from the moment it read it back.
//! - Wall-clock time is never read (but with `--unsafe-lease-wall-clock`, a test-only
//!   switch that proves the checker catches it).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use cairn_fsm::lease::LEASE_IDS_PER_ENTRY_MAX;
use cairn_fsm::{Command, Feature, Lease, View};
use parking_lot::Mutex;

/// How often every node looks for renewals and the leader for expired leases: a lease is
/// revoked at most this late (plus a commit).
pub const EXPIRY_TICK: Duration = Duration::from_millis(100);

/// Which clock measures leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSource {
    /// The monotonic clock: what leases are decided on.
    Monotonic,
    /// DANGEROUS, test-only (`--unsafe-lease-wall-clock`): the wall clock, which jumps.
    WallClock,
}

/// When each lease's latest renewal was first seen on this node.
pub struct LeaseClock {
    source: TimeSource,
    start: Instant,
    /// Lease id -> (the renewal seen, when it was first seen, in ms of [`LeaseClock::now_ms`]).
    seen: Mutex<HashMap<u64, (u64, u64)>>,
}

/// A lease's deadline on a node that first saw its latest renewal at `seen_ms`.
pub fn deadline_ms(seen_ms: u64, ttl_ms: u64) -> u64 {
    seen_ms.saturating_add(ttl_ms)
}

impl LeaseClock {
    pub fn new(source: TimeSource) -> LeaseClock {
        LeaseClock {
            source,
            start: Instant::now(),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Now, in milliseconds of this clock.
    pub fn now_ms(&self) -> u64 {
        match self.source {
            TimeSource::Monotonic => self.start.elapsed().as_millis() as u64,
            TimeSource::WallClock => SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        }
    }

    /// Notes every renewal of `view` not seen yet (at `now_ms`), and forgets the leases it
    /// no longer holds.
    pub fn observe(&self, view: &View, now_ms: u64) {
        let mut seen = self.seen.lock();
        seen.retain(|id, _| view.lease(*id).is_some());
        for lease in view.leases() {
            let entry = seen
                .entry(lease.id)
                .or_insert((lease.renewed_revision, now_ms));
            if entry.0 != lease.renewed_revision {
                *entry = (lease.renewed_revision, now_ms);
            }
        }
        assert!(
            seen.len() <= view.lease_count(),
            "the clock measures only leases that exist"
        );
    }

    /// What is left of `lease` at `now_ms` (its full TTL if its renewal was not seen yet).
    pub fn remaining_ms(&self, lease: &Lease, now_ms: u64) -> u64 {
        let seen_ms = match self.seen.lock().get(&lease.id) {
            Some((renewal, at)) if *renewal == lease.renewed_revision => *at,
            _ => now_ms,
        };
        deadline_ms(seen_ms, lease.ttl_ms).saturating_sub(now_ms)
    }

    /// The leases of `view` past their deadline at `now_ms`, each with the renewal judged.
    pub fn expired(&self, view: &View, now_ms: u64) -> Vec<(u64, u64)> {
        let seen = self.seen.lock();
        view.leases()
            .filter(|lease| {
                seen.get(&lease.id).is_some_and(|(renewal, at)| {
                    *renewal == lease.renewed_revision && deadline_ms(*at, lease.ttl_ms) <= now_ms
                })
            })
            .map(|lease| (lease.id, lease.renewed_revision))
            .collect()
    }
}

/// Every [`EXPIRY_TICK`], on every node: notes the renewals it applied; on the leader
/// (holding everything committed), proposes the expiry of the leases past their deadline,
/// at most [`LEASE_IDS_PER_ENTRY_MAX`] per entry. Runs for the life of the node.
pub async fn expire_leases(raft: super::RaftHandle) {
    let clock = raft.leases.clone();
    let mut tick = tokio::time::interval(EXPIRY_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if raft
            .store
            .cluster_version()
            .require(Feature::Leases)
            .is_err()
        {
            continue;
        }
        let view = raft.store.view();
        let now_ms = clock.now_ms();
        clock.observe(&view, now_ms);
        if view.lease_count() == 0 {
            continue;
        }
        if !raft.leads_with_current_state().await {
            continue;
        }
        let expired = clock.expired(&view, now_ms);
        for leases in expired.chunks(LEASE_IDS_PER_ENTRY_MAX) {
            let count = leases.len();
            match raft
                .propose(Command::LeaseExpire {
                    leases: leases.to_vec(),
                    now_ms: cairn_forwarding::wall_clock_ms(),
                })
                .await
            {
                Ok((index, applied)) => {
                    metrics::counter!(crate::ops::LEASES_EXPIRED_TOTAL).increment(count as u64);
                    tracing::debug!(index, count, ?applied, "leases expired")
                }
                Err(e) => {
                    tracing::debug!(error = %e, "proposing lease expiries failed; trying again");
                    break;
                }
            }
        }
    }
}

/// The node's lease clock for its settings.
pub fn clock(unsafe_wall_clock: bool) -> Arc<LeaseClock> {
    Arc::new(LeaseClock::new(match unsafe_wall_clock {
        true => TimeSource::WallClock,
        false => TimeSource::Monotonic,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_fsm::{ClusterVersion, Store, VersionAction};

    fn store_with_leases(ttls_ms: &[u64]) -> Store {
        let store = Store::new(Default::default());
        store
            .apply(
                1,
                &Command::ClusterVersion {
                    action: VersionAction::Raise,
                    version: ClusterVersion::new(0, 2),
                },
            )
            .unwrap();
        for (i, ttl_ms) in ttls_ms.iter().enumerate() {
            store
                .apply(i as u64 + 2, &Command::LeaseGrant { ttl_ms: *ttl_ms })
                .unwrap();
        }
        store
    }

    #[test]
    fn a_lease_expires_a_ttl_after_its_last_renewal_was_seen_here() {
        let store = store_with_leases(&[1_000, 5_000]);
        let clock = LeaseClock::new(TimeSource::Monotonic);
        clock.observe(&store.view(), 10_000);
        // (now, expired ids)
        let table: [(u64, &[u64]); 4] = [
            (10_999, &[]),
            (11_000, &[2]),
            (14_999, &[2]),
            (15_000, &[2, 3]),
        ];
        for (now_ms, ids) in table {
            let expired: Vec<u64> = clock
                .expired(&store.view(), now_ms)
                .iter()
                .map(|e| e.0)
                .collect();
            assert_eq!(expired, ids, "at {now_ms} ms");
        }
        // A keep-alive seen at 10,900 moves lease 2's deadline to 11,900, never earlier.
        store
            .apply(4, &Command::LeaseKeepAlive { ids: vec![2] })
            .unwrap();
        clock.observe(&store.view(), 10_900);
        assert!(clock.expired(&store.view(), 11_899).is_empty());
        assert_eq!(clock.expired(&store.view(), 11_900), [(2, 4)]);
        let lease = store.view().lease(2).unwrap().0;
        assert_eq!(clock.remaining_ms(&lease, 11_400), 500);
    }

    #[test]
    fn a_node_that_never_saw_a_renewal_gives_the_lease_a_full_ttl_from_now() {
        // A new leader, or a node that restarted: it measures from when it first looks.
        let store = store_with_leases(&[1_000]);
        let clock = LeaseClock::new(TimeSource::Monotonic);
        let lease = store.view().lease(2).unwrap().0;
        assert_eq!(clock.remaining_ms(&lease, 50_000), 1_000);
        assert!(clock.expired(&store.view(), 50_000).is_empty());
        clock.observe(&store.view(), 50_000);
        assert!(clock.expired(&store.view(), 50_999).is_empty());
        assert_eq!(clock.expired(&store.view(), 51_000).len(), 1);
        // A revoked lease is forgotten.
        store
            .apply(3, &Command::LeaseRevoke { id: 2, now_ms: 0 })
            .unwrap();
        clock.observe(&store.view(), 51_000);
        assert!(clock.seen.lock().is_empty());
    }
}
