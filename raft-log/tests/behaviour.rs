//! Behaviour of the store beyond openraft's suite: group commit, holes refused, truncation and
//! vote across a reopen, and recovery from a purge interrupted by a crash.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use cairn_raft_log::DirLock;
use cairn_raft_log::LogEngine;
use cairn_raft_log::LogError;
use cairn_raft_log::LogOptions;
use cairn_raft_log::SledEngine;
use common::Store;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("runtime")
}

#[test]
fn pipelined_appends_share_durability_points() {
    // 64 single-entry appends issued back to back without waiting for durability: all become
    // durable, in order, with fewer fsyncs than appends (group commit).
    let dir = tempfile::tempdir().expect("tempdir");
    runtime().block_on(async {
        let store = Store::open(dir.path(), LogOptions::default()).expect("open");
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
        for index in 1..=64u64 {
            let done_tx = done_tx.clone();
            store
                .append_with_callback(
                    vec![common::entry(index)],
                    Box::new(move |result| {
                        let _ = done_tx.send((index, result.is_ok()));
                    }),
                )
                .await
                .expect("append");
        }
        let mut order = Vec::new();
        for _ in 1..=64 {
            let (index, ok) = done_rx.recv().await.expect("callback");
            assert!(ok, "append {index} became durable");
            order.push(index);
        }
        assert_eq!(
            order,
            (1..=64).collect::<Vec<_>>(),
            "callbacks fire in append order"
        );
        let stats = store.stats();
        println!("{stats:?}");
        assert_eq!(stats.appends, 64);
        assert!(
            stats.durability_points < 64,
            "group commit shared fsyncs: {stats:?}"
        );
        let entries = store.read_entries(..).await.expect("read");
        assert_eq!(entries.len(), 64);
    });
}

#[test]
fn append_that_would_leave_a_hole_is_refused_and_nothing_is_written() {
    // Entries 1..=5, then an append starting at 7: refused, naming 6 and 7; the log is unchanged.
    let dir = tempfile::tempdir().expect("tempdir");
    runtime().block_on(async {
        let store = Store::open(dir.path(), LogOptions::default()).expect("open");
        store
            .append_durable((1..=5).map(common::entry).collect())
            .await
            .expect("append");
        match store.append_durable(vec![common::entry(7)]).await {
            Err(LogError::NonContiguousAppend {
                expected_index: 6,
                got_index: 7,
            }) => {}
            other => panic!("expected NonContiguousAppend, got {other:?}"),
        }
        let (_, last) = store.log_state().await.expect("state");
        assert_eq!(last, Some(common::log_id(5)));
    });
}

#[test]
fn vote_truncation_and_committed_survive_reopen() {
    // Save a vote, append 1..=20, truncate from 15, commit 10: all of it is there after reopen
    // (and the lowered watermark does not make the shorter log look damaged).
    let dir = tempfile::tempdir().expect("tempdir");
    let vote = openraft::Vote::new(7, 3);
    runtime().block_on(async {
        let store = Store::open(dir.path(), LogOptions::default()).expect("open");
        store.store_vote(&vote).await.expect("vote");
        store
            .append_durable((1..=20).map(common::entry).collect())
            .await
            .expect("append");
        store
            .truncate_from(&common::log_id(15))
            .await
            .expect("truncate");
        store
            .store_committed(Some(common::log_id(10)))
            .await
            .expect("committed");
        store
            .append_durable(vec![common::entry(15)])
            .await
            .expect("append after truncate");
    });
    runtime().block_on(async {
        let store = Store::open(dir.path(), LogOptions::default()).expect("reopen");
        assert_eq!(store.vote().await.expect("vote"), Some(vote));
        assert_eq!(
            store.committed().await.expect("committed"),
            Some(common::log_id(10))
        );
        let entries = store.read_entries(..).await.expect("read");
        assert_eq!(entries.len(), 15);
        for (offset, entry) in entries.iter().enumerate() {
            common::check_entry(1 + offset as u64, entry).expect("intact");
        }
    });
}

/// An engine whose purge deletions silently do nothing while `crash_before_delete` is set:
/// the state a crash leaves between a durable purge point and the deletion.
struct NoDeleteEngine {
    inner: SledEngine,
    crash_before_delete: AtomicBool,
}

impl LogEngine for NoDeleteEngine {
    fn put_entries(&self, entries: &[(u64, Vec<u8>)]) -> Result<(), LogError> {
        self.inner.put_entries(entries)
    }
    fn delete_entries_from(&self, from_index: u64) -> Result<(), LogError> {
        self.inner.delete_entries_from(from_index)
    }
    fn delete_entries_through(&self, through_index: u64) -> Result<(), LogError> {
        if self.crash_before_delete.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.inner.delete_entries_through(through_index)
    }
    fn read_entries(&self, start: u64, end: Option<u64>) -> Result<Vec<(u64, Vec<u8>)>, LogError> {
        self.inner.read_entries(start, end)
    }
    fn last_entry(&self) -> Result<Option<(u64, Vec<u8>)>, LogError> {
        self.inner.last_entry()
    }
    fn first_entry(&self) -> Result<Option<(u64, Vec<u8>)>, LogError> {
        self.inner.first_entry()
    }
    fn put_meta(&self, key: &str, value: &[u8]) -> Result<(), LogError> {
        self.inner.put_meta(key, value)
    }
    fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>, LogError> {
        self.inner.get_meta(key)
    }
    fn sync(&self) -> Result<(), LogError> {
        self.inner.sync()
    }
}

#[test]
fn purge_interrupted_before_deletion_is_finished_on_reopen() {
    // Purge through 10 but "crash" before the entries are deleted: reopening finishes the
    // purge instead of reporting corruption or serving entries below the purge point.
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let lock = DirLock::acquire(dir.path()).expect("lock");
        let engine = Arc::new(NoDeleteEngine {
            inner: SledEngine::open(&dir.path().join("sled"), true).expect("sled"),
            crash_before_delete: AtomicBool::new(true),
        });
        let store = Store::open_with_engine(lock, engine.clone()).expect("open");
        runtime().block_on(async {
            store
                .append_durable((1..=20).map(common::entry).collect())
                .await
                .expect("append");
            store
                .purge_through(&common::log_id(10))
                .await
                .expect("purge");
        });
        assert!(engine
            .inner
            .first_entry()
            .expect("first")
            .is_some_and(|(index, _)| index == 1));
    }
    runtime().block_on(async {
        let store =
            Store::open(dir.path(), LogOptions::default()).expect("reopen finishes the purge");
        let (purged, last) = store.log_state().await.expect("state");
        assert_eq!(purged, Some(common::log_id(10)));
        assert_eq!(last, Some(common::log_id(20)));
        let entries = store.read_entries(..).await.expect("read");
        assert_eq!(entries.first().map(|e| e.log_id.index), Some(11));
        assert_eq!(entries.len(), 10);
    });
}
