//! Behaviour of the store beyond openraft's suite, on both engines: group commit, holes
//! refused, truncation and vote across a reopen, and recovery from a purge interrupted by a
//! crash. Then the WAL's own: segments rotate and are deleted behind purges, truncation across
//! segments, the in-memory tail, no fsync without new entries, and flush callbacks that fire
//! in order and are never stranded.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;

use cairn_raft_log::DirLock;
use cairn_raft_log::LogEngine as _;
use cairn_raft_log::LogError;
use cairn_raft_log::SledEngine;
use common::Faults;
use common::FaultyEngine;
use common::LogEngineKind;
use common::Store;
use common::Write;

for_each_engine!(
    pipelined_appends_share_durability_points,
    append_that_would_leave_a_hole_is_refused_and_nothing_is_written,
    vote_truncation_and_committed_survive_reopen,
    purge_past_the_end_of_the_log_then_appends_survive_reopen,
    replication_reads_are_bounded_by_bytes_and_always_return_one_entry,
);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("runtime")
}

fn pipelined_appends_share_durability_points(engine: LogEngineKind) {
    // 64 single-entry appends issued back to back without waiting for durability: all become
    // durable, in order, with fewer fsyncs than appends (group commit).
    let dir = tempfile::tempdir().expect("tempdir");
    runtime().block_on(async {
        let store = Store::open(dir.path(), common::options(engine)).expect("open");
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

fn append_that_would_leave_a_hole_is_refused_and_nothing_is_written(engine: LogEngineKind) {
    // Entries 1..=5, then an append starting at 7: refused, naming 6 and 7; the log is unchanged.
    let dir = tempfile::tempdir().expect("tempdir");
    runtime().block_on(async {
        let store = Store::open(dir.path(), common::options(engine)).expect("open");
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

fn vote_truncation_and_committed_survive_reopen(engine: LogEngineKind) {
    // Save a vote, append 1..=20, truncate from 15, commit 10: all of it is there after reopen
    // (and the lowered watermark does not make the shorter log look damaged).
    let dir = tempfile::tempdir().expect("tempdir");
    let vote = openraft::Vote::new(7, 3);
    runtime().block_on(async {
        let store = Store::open(dir.path(), common::options(engine)).expect("open");
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
        let store = Store::open(dir.path(), common::options(engine)).expect("reopen");
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

fn purge_past_the_end_of_the_log_then_appends_survive_reopen(engine: LogEngineKind) {
    // A follower that installs a snapshot while its own log is short: openraft purges through
    // the snapshot's last index (1000) though the log ends at 120, then appends from 1001.
    // Twice: once with each step durable before the next, once with the purge and the next
    // append queued back to back (one group for the WAL's I/O thread). Every entry after the
    // purge point must be there after a reopen, and nothing at or below it.
    let dir = tempfile::tempdir().expect("tempdir");
    runtime().block_on(async {
        let store = Store::open(dir.path(), common::options(engine)).expect("open");
        append_chunks(&store, 1..=120, 40).await;
        store
            .purge_through(&common::log_id(1000))
            .await
            .expect("purge past the end");
        append_chunks(&store, 1001..=1100, 50).await;
        let purge_point = common::log_id(2000);
        let (purge, append) = tokio::join!(
            store.purge_through(&purge_point),
            store.append_durable((2001..=2050).map(common::entry).collect()),
        );
        purge.expect("second purge past the end");
        append.expect("append right behind it");
    });
    runtime().block_on(async {
        let store = Store::open(dir.path(), common::options(engine)).expect("reopen");
        let (purged, last) = store.log_state().await.expect("state");
        assert_eq!(purged, Some(common::log_id(2000)));
        assert_eq!(last, Some(common::log_id(2050)));
        check_range(&store, 2001, 2050).await;
        let entries = store.read_entries(..).await.expect("read");
        assert_eq!(
            entries.len(),
            50,
            "nothing at or below the purge point is served"
        );
    });
}

/// Purge deletions silently do nothing while set: the state a crash leaves between a durable
/// purge point and the deletion.
struct CrashBeforePurgeDeletion(AtomicBool);

impl Faults for CrashBeforePurgeDeletion {
    fn before(&self, write: &Write<'_>) -> Result<bool, LogError> {
        let crashed =
            matches!(write, Write::DeleteEntriesThrough(_)) && self.0.load(Ordering::SeqCst);
        Ok(!crashed)
    }
}

#[test]
fn sled_purge_interrupted_before_deletion_is_finished_on_reopen() {
    // Purge through 10 but "crash" before the entries are deleted: reopening finishes the
    // purge instead of reporting corruption or serving entries below the purge point.
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let lock = DirLock::acquire(dir.path()).expect("lock");
        let engine =
            FaultyEngine::open(dir.path(), CrashBeforePurgeDeletion(AtomicBool::new(true)));
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
            .sled
            .first_entry()
            .expect("first")
            .is_some_and(|(index, _)| index == 1));
    }
    runtime().block_on(async {
        let store = Store::open(dir.path(), common::options(LogEngineKind::Sled))
            .expect("reopen finishes the purge");
        let (purged, last) = store.log_state().await.expect("state");
        assert_eq!(purged, Some(common::log_id(10)));
        assert_eq!(last, Some(common::log_id(20)));
        let entries = store.read_entries(..).await.expect("read");
        assert_eq!(entries.first().map(|e| e.log_id.index), Some(11));
        assert_eq!(entries.len(), 10);
    });
}

/// The durability point fails with ENOSPC once set: a full disk.
struct FullDisk(AtomicBool);

impl Faults for FullDisk {
    fn before(&self, write: &Write<'_>) -> Result<bool, LogError> {
        if matches!(write, Write::Sync) && self.0.load(Ordering::SeqCst) {
            return Err(LogError::Io {
                context: "fdatasync the test's full disk".to_string(),
                source: std::io::Error::from_raw_os_error(libc::ENOSPC),
            });
        }
        Ok(true)
    }
}

#[test]
fn the_failure_that_poisoned_the_store_is_kept_whole() {
    // A sync fails with ENOSPC: the append fails, later requests fail as poisoned, and the
    // store still reports the first failure with its OS error, so that the node can tell a
    // full disk (restart once space is freed) from damaged data.
    let dir = tempfile::tempdir().expect("tempdir");
    let lock = DirLock::acquire(dir.path()).expect("lock");
    let engine = FaultyEngine::open(dir.path(), FullDisk(AtomicBool::new(false)));
    let store = Store::open_with_engine(lock, engine.clone()).expect("open");
    runtime().block_on(async {
        store
            .append_durable((1..=4).map(common::entry).collect())
            .await
            .expect("append before the disk fills");
        assert!(store.failure().is_none(), "no failure yet");
        engine.faults.0.store(true, Ordering::SeqCst);
        store
            .append_durable((5..=8).map(common::entry).collect())
            .await
            .expect_err("the sync fails");
        let later = store
            .append_durable((9..=9).map(common::entry).collect())
            .await
            .expect_err("poisoned");
        assert!(matches!(later, LogError::Poisoned { .. }), "{later:?}");
    });
    let failure = store.failure().expect("the failure is kept");
    assert_eq!(
        failure.os_error().and_then(|e| e.raw_os_error()),
        Some(libc::ENOSPC),
        "{failure:?}"
    );
    assert!(!failure.is_corruption());
}

/// Once `armed` is set, the process dies inside the first write deleting tail entries: that
/// write is applied and synced (as the syncer thread may do at any moment), and then every later
/// write and sync fails.
#[derive(Default)]
struct DiesAfterTailDeletion {
    armed: AtomicBool,
    dead: AtomicBool,
}

impl Faults for DiesAfterTailDeletion {
    fn before(&self, _write: &Write<'_>) -> Result<bool, LogError> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(LogError::Io {
                context: "write after the test's crash".to_string(),
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        Ok(true)
    }

    fn after(&self, sled: &SledEngine, write: &Write<'_>) -> Result<(), LogError> {
        let deletes_tail = matches!(
            write,
            Write::ReplaceEntriesFrom(_) | Write::DeleteEntriesFrom(_)
        );
        if deletes_tail && self.armed.load(Ordering::SeqCst) {
            sled.sync()?;
            self.dead.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
}

#[test]
fn sled_append_over_the_tail_keeps_acknowledged_entries_through_a_crash_inside_it() {
    // Entries 1..=20 are acknowledged. An append of 16..=20 again (the same entries, as a
    // follower may receive them from a new leader) replaces the tail; a sync lands inside that
    // append and the process dies before it ends. Reopened, the log must still hold 1..=20:
    // the old tail or the new entries, never neither. (The power-cut test once found 4
    // acknowledged entries gone this way, when the replacement was a deletion and an insert.)
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let lock = DirLock::acquire(dir.path()).expect("lock");
        let engine = FaultyEngine::open(dir.path(), DiesAfterTailDeletion::default());
        let store = Store::open_with_engine(lock, engine.clone()).expect("open");
        runtime().block_on(async {
            store
                .append_durable((1..=20).map(common::entry).collect())
                .await
                .expect("acknowledged append");
            engine.faults.armed.store(true, Ordering::SeqCst);
            // Whether this append reports success depends on where the crash fell; the test
            // asks only what survives it.
            let _ = store
                .append_durable((16..=20).map(common::entry).collect())
                .await;
        });
        assert!(
            engine.faults.dead.load(Ordering::SeqCst),
            "the append over the tail deleted tail entries"
        );
    }
    runtime().block_on(async {
        let store = Store::open(dir.path(), common::options(LogEngineKind::Sled))
            .expect("reopen after the crash");
        let (_, last) = store.log_state().await.expect("state");
        assert_eq!(
            last,
            Some(common::log_id(20)),
            "every acknowledged entry survives"
        );
        check_range(&store, 1, 20).await;
    });
}

fn replication_reads_are_bounded_by_bytes_and_always_return_one_entry(engine: LogEngineKind) {
    // openraft reads each AppendEntries through `limited_get_log_entries`: it stops before the
    // entry that would take it past `read_bytes_max`, from memory or from disk, and returns the
    // first entry even when that alone is larger than the bound.
    use openraft::storage::RaftLogReader;
    let dir = tempfile::tempdir().expect("tempdir");
    let options = common::LogOptions {
        read_bytes_max: 64 * 1024,
        tail_bytes_max: 128 * 1024,
        ..common::options(engine)
    };
    runtime().block_on(async {
        let mut store = Store::open(dir.path(), options).expect("open");
        // Entry i carries 16 + 100 × (i % 240) bytes: up to 24 KB each.
        for first in (1..=400).step_by(8) {
            store
                .append_durable(
                    (first..first + 8)
                        .map(|i| common::entry_scaled(i, 100))
                        .collect(),
                )
                .await
                .expect("append");
        }
        for start in [1, 200, 390] {
            let entries = store
                .limited_get_log_entries(start, 401)
                .await
                .expect("read");
            let sizes: Vec<usize> = entries.iter().map(encoded_len).collect();
            let total: usize = sizes.iter().sum();
            assert!(!entries.is_empty(), "from {start}: at least one entry");
            assert!(
                total <= 64 * 1024,
                "from {start}: {total} bytes in {sizes:?}"
            );
            let next = start + entries.len() as u64;
            if next <= 400 {
                let following = store.read_entries(next..=next).await.expect("read");
                assert!(
                    // Stored sizes add a frame header (and a checksum) to each encoding.
                    total + encoded_len(&following[0]) + 64 * (entries.len() + 1) > 64 * 1024,
                    "from {start}: stopped early at {total} bytes"
                );
            }
            for (offset, entry) in entries.iter().enumerate() {
                common::check_entry_scaled(start + offset as u64, entry, 100).expect("intact");
            }
        }
        let options = common::LogOptions {
            read_bytes_max: 1,
            ..common::options(engine)
        };
        drop(store);
        let mut store = Store::open(dir.path(), options).expect("reopen");
        let one = store.limited_get_log_entries(5, 10).await.expect("read");
        assert_eq!(one.len(), 1, "one entry larger than the bound still goes");
    });
}

fn encoded_len(entry: &openraft::Entry<common::TestConfig>) -> usize {
    bincode::serde::encode_to_vec(entry, bincode::config::standard())
        .expect("encode")
        .len()
}

/// Appends `indexes` in chunks of `chunk` entries, each chunk durable before the next.
async fn append_chunks(store: &Store, indexes: std::ops::RangeInclusive<u64>, chunk: u64) {
    let (first, last) = (*indexes.start(), *indexes.end());
    let mut start = first;
    while start <= last {
        let end = (start + chunk - 1).min(last);
        store
            .append_durable((start..=end).map(common::entry).collect())
            .await
            .expect("append");
        start = end + 1;
    }
}

/// Reads `first..=last` and checks every entry.
async fn check_range(store: &Store, first: u64, last: u64) {
    let entries = store.read_entries(first..=last).await.expect("read");
    assert_eq!(
        entries.len() as u64,
        last + 1 - first,
        "entries {first}..={last}"
    );
    for (offset, entry) in entries.iter().enumerate() {
        common::check_entry(first + offset as u64, entry).expect("intact");
    }
}

#[test]
fn wal_segments_rotate_and_purge_deletes_the_ones_wholly_below_the_purge_point() {
    // 8 KiB segments: 600 entries fill many of them. A purge through 400 deletes the segments
    // holding only entries <= 400, keeps the rest, and the log reads back intact after reopen.
    let dir = tempfile::tempdir().expect("tempdir");
    let options = common::small_wal(8 * 1024, 0);
    runtime().block_on(async {
        let store = Store::open(dir.path(), options.clone()).expect("open");
        append_chunks(&store, 1..=600, 7).await;
        let before = common::segment_files(dir.path()).len();
        assert!(before >= 8, "600 entries rotated through {before} segments");
        store
            .purge_through(&common::log_id(400))
            .await
            .expect("purge");
        let after = common::segment_files(dir.path()).len();
        println!("segments: {before} before the purge, {after} after");
        assert!(
            after < before - 3,
            "the purge deleted segments: {before} -> {after}"
        );
        check_range(&store, 401, 600).await;
    });
    runtime().block_on(async {
        let store = Store::open(dir.path(), options.clone()).expect("reopen");
        let (purged, last) = store.log_state().await.expect("state");
        assert_eq!(
            (purged, last),
            (Some(common::log_id(400)), Some(common::log_id(600)))
        );
        check_range(&store, 401, 600).await;
        append_chunks(&store, 601..=700, 9).await;
        check_range(&store, 401, 700).await;
    });
}

#[test]
fn wal_segments_left_by_a_crash_between_purge_point_and_deletion_are_removed_on_reopen() {
    // A purge's segment deletion is lost (as if the process died after the purge point was
    // durable): the files come back, the metadata no longer lists them, reopening deletes them
    // and serves the purged log.
    let dir = tempfile::tempdir().expect("tempdir");
    let options = common::small_wal(8 * 1024, 0);
    let saved = tempfile::tempdir().expect("tempdir");
    runtime().block_on(async {
        let store = Store::open(dir.path(), options.clone()).expect("open");
        append_chunks(&store, 1..=300, 5).await;
        for file in common::segment_files(dir.path()) {
            std::fs::copy(&file, saved.path().join(file.file_name().expect("name"))).expect("copy");
        }
        store
            .purge_through(&common::log_id(250))
            .await
            .expect("purge");
    });
    let after_purge = common::segment_files(dir.path()).len();
    for item in std::fs::read_dir(saved.path()).expect("list") {
        let path = item.expect("entry").path();
        let target = dir
            .path()
            .join("segments")
            .join(path.file_name().expect("name"));
        if !target.exists() {
            std::fs::copy(&path, &target).expect("restore");
        }
    }
    assert!(common::segment_files(dir.path()).len() > after_purge);
    runtime().block_on(async {
        let store = Store::open(dir.path(), options.clone()).expect("reopen");
        assert_eq!(common::segment_files(dir.path()).len(), after_purge);
        let (purged, last) = store.log_state().await.expect("state");
        assert_eq!(
            (purged, last),
            (Some(common::log_id(250)), Some(common::log_id(300)))
        );
        check_range(&store, 251, 300).await;
    });
}

#[test]
fn wal_truncation_back_across_segments_survives_reopen() {
    // Entries 1..=300 over several segments; truncate from 120 (an earlier segment), append a
    // new 120..=150 in term 2: after reopen the log is 1..=119 (term 1) then 120..=150 (term 2).
    let dir = tempfile::tempdir().expect("tempdir");
    let options = common::small_wal(8 * 1024, 0);
    let term2 = |index: u64| openraft::Entry::<common::TestConfig> {
        log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(2, 0), index),
        payload: openraft::EntryPayload::Blank,
    };
    runtime().block_on(async {
        let store = Store::open(dir.path(), options.clone()).expect("open");
        append_chunks(&store, 1..=300, 10).await;
        store
            .truncate_from(&common::log_id(120))
            .await
            .expect("truncate");
        store
            .append_durable((120..=150).map(term2).collect())
            .await
            .expect("append after truncate");
    });
    runtime().block_on(async {
        let store = Store::open(dir.path(), options.clone()).expect("reopen");
        let (_, last) = store.log_state().await.expect("state");
        assert_eq!(last.map(|id| (id.leader_id.term, id.index)), Some((2, 150)));
        check_range(&store, 1, 119).await;
        let rewritten = store.read_entries(120..).await.expect("read");
        assert_eq!(rewritten.len(), 31);
        assert!(rewritten.iter().all(|e| e.log_id.leader_id.term == 2));
    });
}

#[test]
fn wal_overlapping_append_replaces_the_tail_like_a_truncation() {
    // openraft may append entries that overlap the end of the log: they replace it, on disk
    // too (checked after a reopen).
    let dir = tempfile::tempdir().expect("tempdir");
    runtime().block_on(async {
        let store = Store::open(dir.path(), common::options(LogEngineKind::Wal)).expect("open");
        append_chunks(&store, 1..=20, 20).await;
        let blank = |index: u64| openraft::Entry::<common::TestConfig> {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(3, 1), index),
            payload: openraft::EntryPayload::Blank,
        };
        store
            .append_durable((15..=17).map(blank).collect())
            .await
            .expect("overlapping append");
        let (_, last) = store.log_state().await.expect("state");
        assert_eq!(last.map(|id| id.index), Some(17));
    });
    runtime().block_on(async {
        let store = Store::open(dir.path(), common::options(LogEngineKind::Wal)).expect("reopen");
        check_range(&store, 1, 14).await;
        let replaced = store.read_entries(15..).await.expect("read");
        assert_eq!(replaced.len(), 3);
        assert!(replaced.iter().all(|e| e.log_id.leader_id.term == 3));
    });
}

#[test]
fn wal_recent_entries_are_read_from_memory_and_older_ones_from_disk() {
    // With a 64 KiB tail, reading the last 50 entries touches no disk; reading from entry 1
    // (evicted long ago) reads from the segments. Both return the right entries.
    let dir = tempfile::tempdir().expect("tempdir");
    runtime().block_on(async {
        let store =
            Store::open(dir.path(), common::small_wal(1024 * 1024, 64 * 1024)).expect("open");
        append_chunks(&store, 1..=2000, 16).await;
        check_range(&store, 1951, 2000).await;
        assert_eq!(
            store.stats().entries_read_from_disk,
            0,
            "recent entries come from the tail"
        );
        check_range(&store, 1, 2000).await;
        let stats = store.stats();
        println!("{stats:?}");
        assert!(
            stats.entries_read_from_disk > 0 && stats.entries_read_from_disk < 2000,
            "{stats:?}"
        );
    });
}

#[test]
fn wal_makes_no_fsync_when_nothing_new_was_written() {
    // A vote, a committed log id, and an append of entries already purged write no WAL
    // batch: the count of fdatasyncs does not move.
    let dir = tempfile::tempdir().expect("tempdir");
    runtime().block_on(async {
        let store = Store::open(dir.path(), common::options(LogEngineKind::Wal)).expect("open");
        append_chunks(&store, 1..=10, 5).await;
        store
            .purge_through(&common::log_id(5))
            .await
            .expect("purge");
        let before = store.stats().durability_points;
        assert_eq!(before, 2);
        store
            .store_vote(&openraft::Vote::new(3, 1))
            .await
            .expect("vote");
        store
            .store_committed(Some(common::log_id(10)))
            .await
            .expect("committed");
        store
            .append_durable((1..=5).map(common::entry).collect())
            .await
            .expect("append of purged entries");
        assert_eq!(store.stats().durability_points, before);
    });
}

#[test]
fn wal_flush_callbacks_fire_once_each_in_order_across_rotations_and_truncations() {
    // 400 single-entry appends without waiting, over 4 KiB segments (many rotations), with a
    // truncation and a purge in the middle: every callback fires exactly once, in append order,
    // and none is left waiting.
    let dir = tempfile::tempdir().expect("tempdir");
    runtime().block_on(async {
        let store = Store::open(dir.path(), common::small_wal(4096, 0)).expect("open");
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut next = 1u64;
        for round in 0..400u64 {
            if round == 200 {
                store
                    .truncate_from(&common::log_id(next - 10))
                    .await
                    .expect("truncate");
                next -= 10;
            }
            if round == 300 {
                store
                    .purge_through(&common::log_id(next - 50))
                    .await
                    .expect("purge");
            }
            let done_tx = done_tx.clone();
            // One call per round: the round numbers the callbacks.
            let this_call = round;
            store
                .append_with_callback(
                    vec![common::entry(next)],
                    Box::new(move |result| {
                        let _ = done_tx.send((this_call, result.is_ok()));
                    }),
                )
                .await
                .expect("append");
            next += 1;
        }
        drop(done_tx);
        let mut fired = Vec::new();
        while let Some((call, ok)) = done_rx.recv().await {
            assert!(ok, "callback {call} reports success");
            fired.push(call);
        }
        assert_eq!(
            fired,
            (0..400).collect::<Vec<_>>(),
            "each callback once, in order"
        );
        let (_, last) = store.log_state().await.expect("state");
        assert_eq!(last.map(|id| id.index), Some(next - 1));
    });
}

#[test]
fn wal_truncation_behind_a_partly_evicted_tail_keeps_every_entry_at_its_index() {
    // The bug of issue 29: with large entries the in-memory tail holds only the last few of
    // them. A truncation (a new leader overwriting an old leader's unreplicated entries) popped
    // slots from the log without popping their entries from the tail, so every later read of
    // a recent index returned the entry of a later one ("try to get log at index 1038 but got
    // Some(1039)"), and so did every open that replayed the truncate frame: the node could
    // never start again. Here the tail holds about 10 of 300 entries; after truncating from
    // 250 and appending a new 250..=260 in term 2, every index reads back as itself, before
    // and after a reopen (whose replay of the truncate frame meets the same partly evicted
    // tail).
    let dir = tempfile::tempdir().expect("tempdir");
    let entry_bytes = encoded_len(&common::entry(239)) as u64;
    let options = common::small_wal(1024 * 1024, 10 * entry_bytes);
    let term2 = |index: u64| openraft::Entry::<common::TestConfig> {
        log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(2, 0), index),
        payload: openraft::EntryPayload::Blank,
    };
    let check_all = |entries: Vec<openraft::Entry<common::TestConfig>>| {
        assert_eq!(entries.len(), 260, "entries 1..=260");
        for (offset, entry) in entries.iter().enumerate() {
            let index = offset as u64 + 1;
            assert_eq!(entry.log_id.index, index, "the entry read at {index}");
            if index < 250 {
                common::check_entry(index, entry).expect("intact");
            } else {
                assert_eq!(
                    entry.log_id.leader_id.term, 2,
                    "entry {index} is the new one"
                );
            }
        }
    };
    runtime().block_on(async {
        let store = Store::open(dir.path(), options.clone()).expect("open");
        append_chunks(&store, 1..=300, 1).await;
        store
            .truncate_from(&common::log_id(250))
            .await
            .expect("truncate");
        check_range(&store, 240, 249).await;
        store
            .append_durable((250..=260).map(term2).collect())
            .await
            .expect("append after the truncation");
        check_all(store.read_entries(..).await.expect("read"));
    });
    runtime().block_on(async {
        let store = Store::open(dir.path(), options.clone()).expect("reopen");
        check_all(store.read_entries(..).await.expect("read after reopen"));
    });
}
