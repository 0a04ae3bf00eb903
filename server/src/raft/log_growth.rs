//! Log compaction by size as well as by count.
//!
//! openraft builds a snapshot every `snapshot_log_entries` entries. Since one
//! entry may carry a batch of up to 256 writes, a count alone lets the log
//! (kept on disk and in sled's page cache until purged) grow to hundreds of
//! megabytes between snapshots. Here the state machine counts the payload
//! bytes it applies, and once the log since the last snapshot holds more
//! than a budget, a snapshot is triggered (openraft purges the log behind it).
//!
//! The budget is `max(snapshot_log_bytes, size of the last snapshot)`: the
//! log never holds much more than the state itself, and the cost of building
//! snapshots stays proportional to the bytes written (a large state is not
//! rewritten for every few megabytes of writes).
//!
//! On request, the log is also compacted through an index
//! ([`LogGrowth::compact_through`]): a snapshot that covers it, then a purge of
//! every entry up to the snapshot (openraft otherwise keeps
//! `max_in_snapshot_log_to_keep` entries behind it). A downgrade asks for it, so
//! that the log no longer holds commands an older build cannot read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::types::Raft;

/// Counts the log bytes applied since the last snapshot; see the module docs.
#[derive(Debug)]
pub struct LogGrowth {
    since_snapshot_bytes: AtomicU64,
    last_snapshot_bytes: AtomicU64,
    floor_bytes: u64,
    due: Notify,
    /// The index the log must be compacted through (0: none asked).
    compact_through: tokio::sync::watch::Sender<u64>,
}

impl LogGrowth {
    pub fn new(floor_bytes: u64) -> Arc<LogGrowth> {
        assert!(
            floor_bytes > 0,
            "a zero budget would snapshot after every entry"
        );
        Arc::new(LogGrowth {
            since_snapshot_bytes: AtomicU64::new(0),
            last_snapshot_bytes: AtomicU64::new(0),
            floor_bytes,
            due: Notify::new(),
            compact_through: tokio::sync::watch::Sender::new(0),
        })
    }

    /// The log bytes since the last snapshot that trigger the next one.
    pub fn budget_bytes(&self) -> u64 {
        self.floor_bytes
            .max(self.last_snapshot_bytes.load(Ordering::Relaxed))
    }

    /// The log bytes applied since the last snapshot.
    pub fn since_snapshot_bytes(&self) -> u64 {
        self.since_snapshot_bytes.load(Ordering::Relaxed)
    }

    /// The state machine applied entries whose payloads hold `bytes`.
    pub fn applied(&self, bytes: u64) {
        let total = self
            .since_snapshot_bytes
            .fetch_add(bytes, Ordering::Relaxed)
            + bytes;
        if total >= self.budget_bytes() {
            // Coalesces: one stored permit however often it is called.
            self.due.notify_one();
        }
    }

    /// A snapshot was built that covers the first `covered_bytes` counted
    /// (read with [`LogGrowth::since_snapshot_bytes`] when its state was
    /// taken) and whose file holds `snapshot_bytes`.
    pub fn snapshot_built(&self, covered_bytes: u64, snapshot_bytes: u64) {
        let _ =
            self.since_snapshot_bytes
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |since| {
                    Some(since.saturating_sub(covered_bytes))
                });
        self.last_snapshot_bytes
            .store(snapshot_bytes, Ordering::Relaxed);
    }

    /// A snapshot from the leader replaced the state and the log.
    pub fn snapshot_installed(&self, snapshot_bytes: u64) {
        self.since_snapshot_bytes.store(0, Ordering::Relaxed);
        self.last_snapshot_bytes
            .store(snapshot_bytes, Ordering::Relaxed);
    }

    /// Asks for the log to be compacted through `index` (already applied): see
    /// [`LogGrowth::compact_on_request`]. A lower index than one already asked is ignored.
    pub fn compact_through(&self, index: u64) {
        self.compact_through.send_if_modified(|through| {
            let raised = index > *through;
            if raised {
                *through = index;
            }
            raised
        });
    }

    /// Compacts the log through the last index asked ([`LogGrowth::compact_through`]): a
    /// snapshot covering it, then a purge up to that snapshot, until the log's purged index
    /// reaches it; until Raft stops.
    pub async fn compact_on_request(self: Arc<Self>, raft: Raft) {
        let mut asked = self.compact_through.subscribe();
        loop {
            if asked.changed().await.is_err() {
                return;
            }
            let through = *asked.borrow_and_update();
            loop {
                let (snapshot, purged) = {
                    let m = raft.metrics();
                    let m = m.borrow();
                    (
                        m.snapshot.map(|l| l.index).unwrap_or(0),
                        m.purged.map(|l| l.index).unwrap_or(0),
                    )
                };
                if purged >= through {
                    tracing::info!(through, purged, "compacted the log as asked");
                    break;
                }
                // openraft ignores either trigger while a snapshot or a purge is under way.
                let triggered = if snapshot < through {
                    raft.trigger().snapshot().await
                } else {
                    raft.trigger().purge_log(snapshot).await
                };
                if triggered.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// Triggers a snapshot whenever the budget is exceeded, until Raft stops.
    pub async fn run(self: Arc<Self>, raft: Raft) {
        loop {
            self.due.notified().await;
            if self.since_snapshot_bytes() < self.budget_bytes() {
                continue;
            }
            tracing::info!(
                since_snapshot_bytes = self.since_snapshot_bytes(),
                budget_bytes = self.budget_bytes(),
                "log outgrew its budget: triggering a snapshot"
            );
            // openraft ignores the trigger while a snapshot is being built.
            if raft.trigger().snapshot().await.is_err() {
                return;
            }
            // Give the build time to start before looking again.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_the_floor_or_the_last_snapshot_whichever_is_larger() {
        let growth = LogGrowth::new(1000);
        assert_eq!(growth.budget_bytes(), 1000);
        growth.snapshot_built(0, 5000);
        assert_eq!(growth.budget_bytes(), 5000);
        growth.snapshot_installed(10);
        assert_eq!(growth.budget_bytes(), 1000);
    }

    #[test]
    fn a_built_snapshot_subtracts_only_what_it_covers() {
        let growth = LogGrowth::new(1000);
        growth.applied(600);
        let covered = growth.since_snapshot_bytes();
        // Applied while the snapshot was being written: not covered by it.
        growth.applied(300);
        growth.snapshot_built(covered, 10);
        assert_eq!(growth.since_snapshot_bytes(), 300);
        growth.snapshot_installed(10);
        assert_eq!(growth.since_snapshot_bytes(), 0);
    }

    #[tokio::test]
    async fn crossing_the_budget_leaves_a_permit_for_the_trigger_task() {
        let growth = LogGrowth::new(1000);
        growth.applied(999);
        let not_yet = tokio::time::timeout(Duration::from_millis(20), growth.due.notified()).await;
        assert!(not_yet.is_err(), "below the budget nothing is due");
        growth.applied(1);
        tokio::time::timeout(Duration::from_secs(5), growth.due.notified())
            .await
            .expect("at the budget a snapshot is due");
    }
}
