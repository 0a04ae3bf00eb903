//! The Raft log as openraft sees it, with one rule added: **the durable purge point never
//! passes the newest durable snapshot.**
//!
//! openraft 0.9 purges the log through an installed snapshot's index as soon as it hands the
//! snapshot to the state machine worker, without waiting for the install to finish (its
//! `PurgeLog` command has no condition). Written through at once, a kill during the install
//! (which copies, fsyncs, verifies and loads hundreds of megabytes) left a log purged past
//! every snapshot file on disk: the state in between existed nowhere, and the node refused to
//! start, for good. Here a purge beyond what the durable snapshots cover is only recorded; the
//! state machine carries it out once the snapshot that covers it is durable
//! ([`PurgeGate::snapshot_durable`], called before `install_snapshot` or `build_snapshot`
//! returns), so the order on disk is: snapshot file and its name, then the purge point.
//!
//! openraft does not read entries it asked to purge, so answering the purge before it is
//! carried out changes nothing it sees. A restart before it is carried out finds entries below
//! the snapshot, which openraft purges again.
//!
//! Invariants:
//! - A purge through `i` reaches the log store only when `i <= floor`, the index of the newest
//!   snapshot file that is durable with its name (asserted).
//! - `floor` only grows; a deferred purge is carried out once, by the call that raises `floor`
//!   over it, before that call returns.
//! - An append that starts past the log's end, which needs the deferred purge's gap (the
//!   WAL refuses a hole below an unpurged point), waits until the purge is carried out.

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{LogId, OptionalSend, RaftLogId, StorageError, Vote};
use parking_lot::Mutex;
use tokio::sync::watch;

use super::types::{LogStore, NodeId, TypeConfig};

type Entry = openraft::Entry<TypeConfig>;

#[derive(Debug, Default)]
struct Gate {
    /// The index of the newest snapshot that is durable with its name (`None`: none yet).
    floor: Option<u64>,
    /// A purge openraft asked for beyond `floor`, not yet carried out.
    deferred: Option<LogId<NodeId>>,
}

/// Shared by the log adapter ([`GatedLog`]) and the state machine, which raises the floor.
#[derive(Debug)]
pub struct PurgeGate {
    log: LogStore,
    gate: Mutex<Gate>,
    /// Bumped each time a deferred purge is carried out (appends waiting on one watch it).
    carried_out: watch::Sender<u64>,
}

impl PurgeGate {
    /// A gate over `log`, whose newest durable snapshot is at `floor` (the one loaded at start).
    pub fn new(log: LogStore, floor: Option<u64>) -> Arc<PurgeGate> {
        Arc::new(PurgeGate {
            log,
            gate: Mutex::new(Gate {
                floor,
                deferred: None,
            }),
            carried_out: watch::Sender::new(0),
        })
    }

    /// The snapshot at `index` is durable with its name: raises the floor, and carries out a
    /// deferred purge it now covers (durably) before returning.
    pub async fn snapshot_durable(&self, index: u64) -> Result<(), cairn_raft_log::LogError> {
        let due = {
            let mut gate = self.gate.lock();
            gate.floor = gate.floor.max(Some(index));
            match gate.deferred {
                Some(deferred) if deferred.index <= index => gate.deferred.take(),
                _ => None,
            }
        };
        if let Some(log_id) = due {
            self.log.purge_through(&log_id).await?;
            self.carried_out.send_modify(|n| *n += 1);
            tracing::debug!(index = log_id.index, "deferred log purge carried out");
        }
        Ok(())
    }

    /// Records openraft's purge through `log_id`; `Some` when it may reach the log now.
    fn admit(&self, log_id: LogId<NodeId>) -> Option<LogId<NodeId>> {
        let mut gate = self.gate.lock();
        if gate.floor.is_some_and(|floor| log_id.index <= floor) {
            return Some(log_id);
        }
        if gate
            .deferred
            .is_none_or(|deferred| deferred.index < log_id.index)
        {
            tracing::debug!(
                index = log_id.index,
                floor = ?gate.floor,
                "log purge deferred until a snapshot covering it is durable"
            );
            gate.deferred = Some(log_id);
        }
        None
    }

    fn deferred(&self) -> Option<LogId<NodeId>> {
        self.gate.lock().deferred
    }
}

/// The log store handed to openraft: [`LogStore`] with purges gated by a [`PurgeGate`].
#[derive(Clone)]
pub struct GatedLog {
    log: LogStore,
    gate: Arc<PurgeGate>,
}

impl GatedLog {
    pub fn new(gate: Arc<PurgeGate>) -> GatedLog {
        GatedLog {
            log: gate.log.clone(),
            gate,
        }
    }

    /// Waits while a deferred purge is what lets entries from `first_index` on follow the log.
    async fn await_gap_purge(&self, first_index: u64) -> Result<(), StorageError<NodeId>> {
        let mut carried_out = self.gate.carried_out.subscribe();
        loop {
            let Some(deferred) = self.gate.deferred() else {
                return Ok(());
            };
            let last = self.log.clone().get_log_state().await?.last_log_id;
            let next = last.map_or(0, |last| last.index + 1);
            if first_index <= next || first_index > deferred.index + 1 {
                return Ok(());
            }
            tracing::info!(
                first_index,
                deferred = deferred.index,
                "an append past the log's end waits for the snapshot that covers the gap"
            );
            if carried_out.changed().await.is_err() {
                return Ok(());
            }
        }
    }
}

impl RaftLogReader<TypeConfig> for GatedLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<NodeId>> {
        self.log.try_get_log_entries(range).await
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError<NodeId>> {
        self.log.limited_get_log_entries(start, end).await
    }
}

impl RaftLogStorage<TypeConfig> for GatedLog {
    type LogReader = GatedLog;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        self.log.get_log_state().await
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.log.save_vote(vote).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        self.log.read_vote().await
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        self.log.save_committed(committed).await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        self.log.read_committed().await
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        if let Some(first) = entries.first() {
            self.await_gap_purge(first.get_log_id().index).await?;
        }
        self.log.append(entries, callback).await
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.log.truncate(log_id).await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        match self.gate.admit(log_id) {
            Some(log_id) => {
                let floor = self.gate.gate.lock().floor;
                // Paired with the check in `admit`: nothing past a durable snapshot is purged.
                assert!(
                    floor.is_some_and(|floor| log_id.index <= floor),
                    "a purge through {} passes the newest durable snapshot ({floor:?})",
                    log_id.index
                );
                self.log.purge(log_id).await
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn log_id(index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    fn blank(index: u64) -> Entry {
        Entry {
            log_id: log_id(index),
            payload: openraft::EntryPayload::Blank,
        }
    }

    async fn append(log: &LogStore, indexes: std::ops::RangeInclusive<u64>) {
        log.append_durable(indexes.map(blank).collect())
            .await
            .expect("append");
    }

    #[tokio::test]
    async fn a_purge_past_the_durable_snapshot_waits_for_it() {
        // The install's order: openraft purges through 50 while the snapshot at 50 is still
        // being installed. Nothing reaches the disk until the snapshot is durable; then the
        // purge is carried out before `snapshot_durable` returns. A purge the durable
        // snapshots cover goes through at once.
        let dir = tempfile::tempdir().unwrap();
        let log = LogStore::open(dir.path(), Default::default()).unwrap();
        append(&log, 1..=30).await;
        let gate = PurgeGate::new(log.clone(), Some(20));
        let mut gated = GatedLog::new(gate.clone());
        gated.purge(log_id(10)).await.unwrap();
        assert_eq!(log.log_state().await.unwrap().0, Some(log_id(10)));
        gated.purge(log_id(50)).await.unwrap();
        assert_eq!(
            log.log_state().await.unwrap().0,
            Some(log_id(10)),
            "deferred: the snapshot at 50 is not durable yet"
        );
        gate.snapshot_durable(40).await.unwrap();
        assert_eq!(log.log_state().await.unwrap().0, Some(log_id(10)));
        gate.snapshot_durable(50).await.unwrap();
        assert_eq!(log.log_state().await.unwrap().0, Some(log_id(50)));
        drop(gated);
        drop(gate);
        drop(log);
        let reopened = LogStore::open(dir.path(), Default::default()).unwrap();
        assert_eq!(reopened.log_state().await.unwrap().0, Some(log_id(50)));
    }

    #[tokio::test]
    async fn an_append_past_the_end_waits_for_the_deferred_purge_of_its_gap() {
        // After an install at 50 over a log ending at 30, openraft appends from 51: the WAL
        // accepts that gap only below a purge point, so the append waits for the snapshot.
        let dir = tempfile::tempdir().unwrap();
        let log = LogStore::open(dir.path(), Default::default()).unwrap();
        append(&log, 1..=30).await;
        let gate = PurgeGate::new(log.clone(), Some(20));
        let mut gated = GatedLog::new(gate.clone());
        gated.purge(log_id(50)).await.unwrap();
        let waiting = gated.clone();
        let append = tokio::spawn(async move {
            waiting.await_gap_purge(51).await.unwrap();
            waiting
                .log
                .append_durable(vec![blank(51)])
                .await
                .expect("append after the gap's purge")
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!append.is_finished(), "the append waits for the snapshot");
        gate.snapshot_durable(50).await.unwrap();
        append.await.unwrap();
        let (purged, last) = log.log_state().await.unwrap();
        assert_eq!((purged, last), (Some(log_id(50)), Some(log_id(51))));
        // An append that follows the log needs no purge and never waits.
        gated.await_gap_purge(52).await.unwrap();
    }
}
