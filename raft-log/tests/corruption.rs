//! Corruption tests: damaged stored data is reported with the index it concerns — on reopen, on
//! read through openraft's reader, and when raw bytes of the engine's files are flipped. The
//! WAL's tests (`wal_*`) also check that a torn tail is cut back to its last commit, keeping
//! every acknowledged entry. The sled tests damage sled's tree through `test_hooks`.

mod common;

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use cairn_raft_log::test_hooks;
use cairn_raft_log::DirLock;
use cairn_raft_log::LogError;
use cairn_raft_log::LogOptions;
use common::Faults;
use common::FaultyEngine;
use common::Store;
use openraft::RaftLogReader;

/// Entries written by every test here.
const LAST_INDEX: u64 = 40;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("runtime")
}

/// Creates a store in `dir` holding entries 1..=LAST_INDEX (committed through LAST_INDEX) and
/// closes it.
fn write_entries(dir: &Path) {
    runtime().block_on(async {
        let store =
            Store::open(dir, LogOptions::with_engine(common::LogEngineKind::Sled)).expect("open");
        for chunk_start in (1..=LAST_INDEX).step_by(8) {
            let entries = (chunk_start..chunk_start + 8).map(common::entry).collect();
            store.append_durable(entries).await.expect("append");
        }
        store
            .store_committed(Some(common::log_id(LAST_INDEX)))
            .await
            .expect("committed");
        store
            .store_vote(&openraft::Vote::new(1, 0))
            .await
            .expect("vote");
    });
}

#[test]
fn flipped_byte_in_a_stored_entry_is_reported_with_its_index_on_reopen() {
    // Flip one payload byte of entry 7 behind the store's back; reopening names index 7.
    let dir = tempfile::tempdir().expect("tempdir");
    write_entries(dir.path());
    let found = test_hooks::rewrite_stored_entry(dir.path(), 7, |bytes| {
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x40;
    })
    .expect("rewrite");
    assert!(found, "entry 7 exists");
    match Store::open(
        dir.path(),
        LogOptions::with_engine(common::LogEngineKind::Sled),
    ) {
        Err(error @ LogError::Corrupt { index: 7, .. }) => {
            let message = error.to_string();
            println!("reopen reports: {message}");
            assert!(
                message.contains("index 7"),
                "message names the index: {message}"
            );
            assert!(message.contains("crc32c"), "message says why: {message}");
        }
        other => panic!("expected Corrupt {{ index: 7 }}, got {other:?}"),
    }
}

#[test]
fn missing_entry_in_the_middle_is_reported_with_its_index_on_reopen() {
    // Delete entry 12 behind the store's back: the hole is named, never skipped.
    let dir = tempfile::tempdir().expect("tempdir");
    write_entries(dir.path());
    assert!(test_hooks::delete_stored_entry(dir.path(), 12).expect("delete"));
    match Store::open(
        dir.path(),
        LogOptions::with_engine(common::LogEngineKind::Sled),
    ) {
        Err(error @ LogError::Corrupt { index: 12, .. }) => println!("reopen reports: {error}"),
        other => panic!("expected Corrupt {{ index: 12 }}, got {other:?}"),
    }
}

#[test]
fn truncated_stored_value_is_reported_with_its_index_on_reopen() {
    // Cut entry 3's stored value down to two bytes (shorter than its checksum).
    let dir = tempfile::tempdir().expect("tempdir");
    write_entries(dir.path());
    assert!(
        test_hooks::rewrite_stored_entry(dir.path(), 3, |bytes| bytes.truncate(2))
            .expect("rewrite")
    );
    match Store::open(
        dir.path(),
        LogOptions::with_engine(common::LogEngineKind::Sled),
    ) {
        Err(error @ LogError::Corrupt { index: 3, .. }) => println!("reopen reports: {error}"),
        other => panic!("expected Corrupt {{ index: 3 }}, got {other:?}"),
    }
}

/// Damages the entry at `corrupt_index`, and loses the one at `missing_index`, on every read,
/// so that damage appearing *after* open (a disk going bad) reaches the read path.
struct Damage {
    corrupt_index: AtomicU64,
    missing_index: AtomicU64,
}

impl Faults for Damage {
    fn damage(&self, (index, bytes): &mut (u64, Vec<u8>)) {
        if *index == self.corrupt_index.load(Ordering::SeqCst) {
            if let Some(last) = bytes.last_mut() {
                *last ^= 0x01;
            }
        }
    }

    fn missing(&self, index: u64) -> bool {
        index == self.missing_index.load(Ordering::SeqCst)
    }
}

/// Writes the entries in `dir`, then opens the store (cleanly: nothing is damaged yet) over a
/// sled with [`Damage`].
fn open_over_damaging_engine(dir: &Path) -> (Arc<FaultyEngine<Damage>>, Store) {
    write_entries(dir);
    let lock = DirLock::acquire(dir).expect("lock");
    let engine = FaultyEngine::open(
        dir,
        Damage {
            corrupt_index: AtomicU64::new(u64::MAX),
            missing_index: AtomicU64::new(u64::MAX),
        },
    );
    let store = Store::open_with_engine(lock, engine.clone()).expect("clean open");
    (engine, store)
}

#[test]
fn entry_damaged_after_open_fails_openraft_reads_naming_its_index() {
    // Open cleanly, then damage entry 21 on the read path: openraft's reader gets a
    // StorageError for LogIndex(21); reads that avoid 21 still work.
    let dir = tempfile::tempdir().expect("tempdir");
    let (engine, mut store) = open_over_damaging_engine(dir.path());
    engine.faults.corrupt_index.store(21, Ordering::SeqCst);
    runtime().block_on(async {
        let error = store
            .try_get_log_entries(1..=LAST_INDEX)
            .await
            .expect_err("damaged read fails");
        let message = error.to_string();
        println!("openraft sees: {message}");
        assert!(
            message.contains("LogIndex(21)"),
            "openraft error names the index: {message}"
        );
        assert!(
            message.contains("index 21"),
            "cause names the index: {message}"
        );
        let fine = store
            .try_get_log_entries(1..21)
            .await
            .expect("entries below 21 read fine");
        assert_eq!(fine.len(), 20);
        for (offset, entry) in fine.iter().enumerate() {
            common::check_entry(1 + offset as u64, entry).expect("intact");
        }
    });
}

#[test]
fn entry_lost_after_open_fails_replication_reads_naming_its_index() {
    // Open cleanly, then lose entry 21 on the read path. openraft reads each AppendEntries
    // with `limited_get_log_entries`: a read across 21, or from 21, must fail naming
    // LogIndex(21), never come back short or empty (openraft takes empty for a heartbeat and
    // retries for ever). The unbounded reader says the same.
    let dir = tempfile::tempdir().expect("tempdir");
    let (engine, mut store) = open_over_damaging_engine(dir.path());
    engine.faults.missing_index.store(21, Ordering::SeqCst);
    runtime().block_on(async {
        for (start, end) in [(10, 30), (21, 30), (21, 22)] {
            let error = store
                .limited_get_log_entries(start, end)
                .await
                .expect_err("a read of a range missing entry 21 fails");
            let message = error.to_string();
            println!("limited_get_log_entries({start}, {end}): {message}");
            assert!(
                message.contains("LogIndex(21)") && message.contains("missing"),
                "the error names the missing index: {message}"
            );
        }
        for range in [10..30, 21..30] {
            let error = store
                .try_get_log_entries(range.clone())
                .await
                .expect_err("a read of a range missing entry 21 fails");
            let message = error.to_string();
            println!("try_get_log_entries({range:?}): {message}");
            assert!(
                message.contains("LogIndex(21)"),
                "the error names the missing index: {message}"
            );
        }
        let around = store
            .limited_get_log_entries(22, 30)
            .await
            .expect("entries after 21 read fine");
        assert_eq!(around.len(), 8);
        let from_start = store
            .try_get_log_entries(..21)
            .await
            .expect("entries below 21 read fine, from below the first index too");
        assert_eq!(from_start.len(), 20);
    });
}

/// Finds every occurrence of `needle` in `haystack`.
fn occurrences(haystack: &[u8], needle: &[u8]) -> Vec<usize> {
    haystack
        .windows(needle.len())
        .enumerate()
        .filter(|(_, window)| *window == needle)
        .map(|(offset, _)| offset)
        .collect()
}

#[test]
fn flipped_bytes_in_sled_files_are_reported_not_ignored() {
    // Flip a byte inside entry 30's payload in sled's raw files. sled checksums its own log
    // records, so either sled refuses the damaged record (and the entries after it vanish, which
    // our open-time check reports against the committed index) or our crc32c names entry 30.
    // What is never acceptable: opening and reading everything as if nothing happened.
    let dir = tempfile::tempdir().expect("tempdir");
    write_entries(dir.path());
    let payload = common::payload_for(30);
    let sled_dir = dir.path().join("sled");
    let mut flipped = 0;
    for item in std::fs::read_dir(&sled_dir).expect("list sled dir") {
        let path = item.expect("entry").path();
        if !path.is_file() {
            continue;
        }
        let mut bytes = std::fs::read(&path).expect("read sled file");
        let found = occurrences(&bytes, &payload);
        for offset in &found {
            bytes[offset + payload.len() / 2] ^= 0x10;
        }
        if !found.is_empty() {
            println!(
                "flipped {} occurrence(s) of entry 30's payload in {}",
                found.len(),
                path.display()
            );
            std::fs::write(&path, &bytes).expect("write sled file");
            flipped += found.len();
        }
    }
    assert!(
        flipped > 0,
        "entry 30's payload was not found in sled's files (is compression on?)"
    );
    let outcome = match Store::open(
        dir.path(),
        LogOptions::with_engine(common::LogEngineKind::Sled),
    ) {
        Err(error) => format!("reopen failed: {error}"),
        Ok(store) => runtime().block_on(async {
            match store.read_entries(1..=LAST_INDEX).await {
                Err(error) => format!("read failed: {error}"),
                Ok(entries) => panic!("damage went unnoticed: read {} entries", entries.len()),
            }
        }),
    };
    println!("{outcome}");
    assert!(
        outcome.contains("index") || outcome.contains("storage engine"),
        "the error names the index or the engine's corruption: {outcome}"
    );
}

/// Entries written by the WAL tests: enough to fill many 4 KiB segments.
const WAL_LAST_INDEX: u64 = 200;

/// Creates a WAL store in `dir` with 4 KiB segments and no tail, holding entries
/// 1..=WAL_LAST_INDEX appended in durable batches of 4, and closes it.
fn write_wal_entries(dir: &Path) -> LogOptions {
    let options = common::small_wal(4096, 0);
    runtime().block_on(async {
        let store = Store::open(dir, options.clone()).expect("open");
        for chunk_start in (1..=WAL_LAST_INDEX).step_by(4) {
            let entries = (chunk_start..chunk_start + 4).map(common::entry).collect();
            store.append_durable(entries).await.expect("append");
        }
    });
    options
}

/// Flips one byte in the middle of entry `index`'s payload in whichever segment holds it;
/// returns that segment's file name.
fn flip_payload_byte(dir: &Path, index: u64) -> String {
    let payload = common::payload_for(index);
    for path in common::segment_files(dir) {
        let mut bytes = std::fs::read(&path).expect("read segment");
        if let Some(&offset) = occurrences(&bytes, &payload).first() {
            bytes[offset + payload.len() / 2] ^= 0x10;
            std::fs::write(&path, &bytes).expect("write segment");
            return path
                .file_name()
                .expect("name")
                .to_string_lossy()
                .into_owned();
        }
    }
    panic!("entry {index}'s payload is in no segment");
}

#[test]
fn wal_segments_of_a_newer_format_are_refused_as_newer_not_as_damage() {
    // A data dir written by a newer build (format version 2, intact): reopening says so,
    // names the file and both versions, and is not corruption (no CORRUPT marker, exit 15
    // in the node). An older version than this build's is damage.
    let dir = tempfile::tempdir().expect("tempdir");
    let options = write_wal_entries(dir.path());
    let rewritten = test_hooks::rewrite_segment_format_version(dir.path(), 2).expect("rewrite");
    assert!(rewritten >= 4, "{rewritten} segments");
    match Store::open(dir.path(), options.clone()) {
        Err(
            error @ LogError::NewerFormat {
                found: 2, reads: 1, ..
            },
        ) => {
            let message = error.to_string();
            assert!(!error.is_corruption(), "{message}");
            assert!(
                message.contains("a newer release of Cairn wrote it"),
                "{message}"
            );
            assert!(message.contains(".wal"), "names the file: {message}");
        }
        other => panic!("expected NewerFormat, got {other:?}"),
    }
    test_hooks::rewrite_segment_format_version(dir.path(), 0).expect("rewrite");
    match Store::open(dir.path(), options) {
        Err(error @ LogError::CorruptSegment { .. }) => {
            assert!(
                error.to_string().contains("segment format version 0"),
                "{error}"
            );
        }
        other => panic!("expected CorruptSegment, got {other:?}"),
    }
}

#[test]
fn wal_flipped_byte_in_a_middle_segment_names_the_segment_and_the_index() {
    // Entries 1..=200 spread over many 4 KiB segments; a byte of entry 100 (in a sealed segment
    // in the middle) is flipped: reopening fails with CorruptSegment naming that file and index.
    let dir = tempfile::tempdir().expect("tempdir");
    let options = write_wal_entries(dir.path());
    let segments = common::segment_files(dir.path());
    assert!(
        segments.len() >= 4,
        "entries span {} segments",
        segments.len()
    );
    let damaged = flip_payload_byte(dir.path(), 100);
    assert_ne!(
        Some(&damaged),
        segments
            .last()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .as_ref(),
        "a middle segment"
    );
    match Store::open(dir.path(), options) {
        Err(error @ LogError::CorruptSegment { index: 100, .. }) => {
            let message = error.to_string();
            println!("reopen reports: {message}");
            assert!(message.contains(&damaged), "names the segment: {message}");
            assert!(message.contains("index 100"), "names the index: {message}");
            assert!(message.contains("crc32c"), "says why: {message}");
        }
        other => panic!("expected CorruptSegment at index 100, got {other:?}"),
    }
}

#[test]
fn wal_flipped_byte_in_an_acknowledged_batch_of_the_active_segment_is_not_taken_for_a_torn_tail() {
    // The damaged entry is in the last segment, but later batches were committed after it:
    // it was durable, so this is corruption (named), not a torn tail to cut.
    let dir = tempfile::tempdir().expect("tempdir");
    let options = LogOptions {
        tail_bytes_max: 0,
        ..LogOptions::with_engine(common::LogEngineKind::Wal)
    };
    runtime().block_on(async {
        let store = Store::open(dir.path(), options.clone()).expect("open");
        for chunk_start in (1..=LAST_INDEX).step_by(4) {
            let entries = (chunk_start..chunk_start + 4).map(common::entry).collect();
            store.append_durable(entries).await.expect("append");
        }
    });
    assert_eq!(common::segment_files(dir.path()).len(), 1);
    flip_payload_byte(dir.path(), 9);
    match Store::open(dir.path(), options) {
        Err(error @ LogError::CorruptSegment { index: 9, .. }) => {
            println!("reopen reports: {error}")
        }
        other => panic!("expected CorruptSegment at index 9, got {other:?}"),
    }
}

#[test]
fn wal_torn_tail_is_cut_back_to_the_last_commit_keeping_every_acknowledged_entry() {
    // The last batch (entries 197..=200) is torn: a byte of entry 199 is flipped and its commit
    // frame zeroed, as if the power went during its write. Reopening keeps 1..=196 (every batch
    // acknowledged before it), cuts the torn batch, accepts new appends after it, and a second
    // reopen sees the new entries and no trace of the torn ones.
    let dir = tempfile::tempdir().expect("tempdir");
    let options = write_wal_entries(dir.path());
    let active = common::segment_files(dir.path()).pop().expect("a segment");
    let mut bytes = std::fs::read(&active).expect("read");
    let end = bytes.iter().rposition(|b| *b != 0).expect("data") + 1;
    let commit_start = (end - 40) / 8 * 8;
    bytes[commit_start..end].fill(0);
    let payload = common::payload_for(199);
    let offset = occurrences(&bytes, &payload)[0];
    bytes[offset + 3] ^= 0x01;
    std::fs::write(&active, &bytes).expect("write");
    runtime().block_on(async {
        let store = Store::open(dir.path(), options.clone()).expect("a torn tail is not an error");
        let (_, last) = store.log_state().await.expect("state");
        assert_eq!(
            last,
            Some(common::log_id(196)),
            "cut back to the last commit"
        );
        let entries = store.read_entries(1..=196).await.expect("read");
        assert_eq!(entries.len(), 196);
        for (offset, entry) in entries.iter().enumerate() {
            common::check_entry(1 + offset as u64, entry).expect("acknowledged entries intact");
        }
        store
            .append_durable((197..=198).map(common::entry).collect())
            .await
            .expect("append after the cut");
    });
    runtime().block_on(async {
        let store = Store::open(dir.path(), options.clone()).expect("reopen");
        let entries = store.read_entries(..).await.expect("read");
        assert_eq!(entries.len(), 198);
        for (offset, entry) in entries.iter().enumerate() {
            common::check_entry(1 + offset as u64, entry).expect("intact");
        }
    });
}

#[test]
fn wal_missing_segment_is_reported_by_name() {
    // A segment listed in the metadata is deleted behind the store's back: reopening names it.
    let dir = tempfile::tempdir().expect("tempdir");
    let options = write_wal_entries(dir.path());
    let segments = common::segment_files(dir.path());
    let victim = &segments[segments.len() / 2];
    let name = victim
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    std::fs::remove_file(victim).expect("delete");
    match Store::open(dir.path(), options) {
        Err(error @ LogError::CorruptSegment { .. }) => {
            let message = error.to_string();
            println!("reopen reports: {message}");
            assert!(
                message.contains(&name) && message.contains("missing"),
                "{message}"
            );
        }
        other => panic!("expected CorruptSegment naming {name}, got {other:?}"),
    }
}

#[test]
fn wal_entry_damaged_after_open_fails_openraft_reads_naming_its_index() {
    // With no tail, reads go to the segments: a byte flipped in entry 21 while the store is
    // open makes openraft's reader fail for LogIndex(21); reads below it still work.
    let dir = tempfile::tempdir().expect("tempdir");
    let options = write_wal_entries(dir.path());
    let mut store = Store::open(dir.path(), options).expect("clean open");
    flip_payload_byte(dir.path(), 21);
    runtime().block_on(async {
        let error = store
            .try_get_log_entries(1..=LAST_INDEX)
            .await
            .expect_err("damaged read fails");
        let message = error.to_string();
        println!("openraft sees: {message}");
        assert!(message.contains("LogIndex(21)"), "{message}");
        let fine = store
            .try_get_log_entries(1..21)
            .await
            .expect("entries below 21");
        assert_eq!(fine.len(), 20);
    });
}

#[test]
fn flipped_byte_in_a_sled_blob_names_the_blob_file() {
    // sled keeps a value larger than a quarter of its 512 KiB segments in a file of its own,
    // `sled/blobs/N`, checked by a crc32 of sled's. Flip one byte in the middle of every blob
    // file: opening the store (which reads every entry back) fails with an error that names
    // the damaged blob file, not only "storage engine error".
    let dir = tempfile::tempdir().expect("tempdir");
    runtime().block_on(async {
        let store = Store::open(
            dir.path(),
            LogOptions::with_engine(common::LogEngineKind::Sled),
        )
        .expect("open");
        let entries = (1..=3).map(|i| common::entry_scaled(i, 100_000)).collect();
        store.append_durable(entries).await.expect("append");
    });
    let blobs_dir = dir.path().join("sled").join("blobs");
    let blobs: Vec<std::path::PathBuf> = std::fs::read_dir(&blobs_dir)
        .expect("sled wrote blobs for entries of 200 KB")
        .map(|item| item.expect("entry").path())
        .filter(|path| path.is_file())
        .collect();
    assert!(!blobs.is_empty(), "no blob file in {}", blobs_dir.display());
    for blob in &blobs {
        let mut bytes = std::fs::read(blob).expect("read blob");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x01;
        std::fs::write(blob, &bytes).expect("write blob");
    }
    let message = match Store::open(
        dir.path(),
        LogOptions::with_engine(common::LogEngineKind::Sled),
    ) {
        Err(error) => {
            assert!(error.is_corruption(), "a corruption error: {error:?}");
            let damaged = error
                .damaged_file()
                .unwrap_or_else(|| panic!("the error names the damaged file: {error:?}"));
            assert!(
                blobs.contains(&damaged),
                "{} is one of {blobs:?}",
                damaged.display()
            );
            error.to_string()
        }
        Ok(store) => runtime().block_on(async {
            match store.read_entries(1..=3).await {
                Err(error) => error.to_string(),
                Ok(entries) => panic!("damage went unnoticed: read {} entries", entries.len()),
            }
        }),
    };
    println!("{message}");
    assert!(
        blobs
            .iter()
            .any(|b| message.contains(&b.display().to_string())),
        "the message names the blob file: {message}"
    );
}
