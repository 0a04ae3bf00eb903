//! Fuzz harness for the log's disk decoders: the WAL's segment files (segment headers, frames,
//! commit frames, the entries' bincode) and the sled engine's stored entries (checksum, then
//! bincode). Property tests over arbitrary bytes and over mutations of a real store's files
//! (`cairn_test_support::fuzz`), each case on a fresh copy of a store written once:
//!
//! - a mutated WAL segment never panics recovery, which either refuses it with
//!   `CorruptSegment` naming that segment and an index of the log, or — damage in the last
//!   segment's last batch only — cuts it as a torn tail: the entries read back are then
//!   exactly a prefix of the ones written, and never fewer than a clean cut at the first
//!   damaged byte keeps. An entry in the middle is never skipped, and never read back changed;
//! - a segment replaced by arbitrary bytes (with or without its valid header) likewise;
//! - with the WAL's checksums switched off (`unsafe_skip_crc_check_for_tests`), the mutated
//!   bytes reach the frame parser and bincode: still no panic, no huge allocation, only typed
//!   errors, and whatever is read back is contiguous;
//! - a mutated sled entry is refused as `Corrupt` at its index; one resealed with a valid
//!   checksum (so that bincode decodes the damage) is refused at its index or decodes to an
//!   entry of that index, the others intact.
//!
//! CI runs a short pass (`PROPTEST_CASES` unset: 48 cases per property, each opening a store
//! on disk); `PROPTEST_CASES=5000 cargo test --release -p cairn-raft-log --test fuzz_wal` runs
//! a long one (see docs/security.md).

mod common;

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::path::Path;
use std::path::PathBuf;
use std::sync::OnceLock;

use cairn_raft_log::test_hooks;
use cairn_raft_log::LogError;
use cairn_test_support::fuzz::{arbitrary_bytes, config, first_difference, mutate, mutations};
use common::LogEngineKind;
use common::LogOptions;
use common::Store;
use common::TestConfig;
use openraft::BasicNode;
use openraft::Entry;
use openraft::EntryPayload;
use openraft::Membership;
use proptest::prelude::*;

/// Entries in the stores the cases start from.
const LAST_INDEX: u64 = 64;

/// The length of a WAL segment's header frame (a 24-byte frame header and a 24-byte payload;
/// see `docs/architecture.md`): where its first batch starts.
const SEGMENT_HEADER_LEN_BYTES: usize = 48;

/// WAL segments of 4 KiB, so that the entries span several sealed segments and an active one.
const SEGMENT_SIZE_BYTES: u64 = 4096;

/// The entry the stores hold at `index`: mostly normal entries of varied sizes, with membership
/// entries (whose node addresses are strings, the decoder's riskiest field) and blank ones.
fn entry(index: u64) -> Entry<TestConfig> {
    match index % 9 {
        3 => {
            let voters: BTreeSet<u64> = (1..=3).collect();
            let nodes: BTreeMap<u64, BasicNode> = (1..=4)
                .map(|id| (id, BasicNode::new(format!("10.0.0.{id}:{}", 8000 + index))))
                .collect();
            Entry {
                log_id: common::log_id(index),
                payload: EntryPayload::Membership(Membership::new(vec![voters], nodes)),
            }
        }
        7 => Entry {
            log_id: common::log_id(index),
            payload: EntryPayload::Blank,
        },
        _ => common::entry_scaled(index, 3),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn wal_options(check_crc: bool) -> LogOptions {
    LogOptions {
        // No tail: reads after open go to the segments, through the decoders again.
        tail_bytes_max: 0,
        unsafe_skip_crc_check_for_tests: !check_crc,
        // Only the cases' copies are opened with this; the originals are written durably.
        unsafe_skip_fsync_for_tests: true,
        unsafe_skip_directory_fsync_for_tests: true,
        ..common::small_wal(SEGMENT_SIZE_BYTES, 0)
    }
}

/// Writes entries 1..=LAST_INDEX, in batches of 1 to 4, into a new store in `dir`.
fn write_store(dir: &Path, options: LogOptions) {
    runtime().block_on(async {
        let store = Store::open(dir, options).expect("open");
        let mut next = 1;
        let mut batch = 1;
        while next <= LAST_INDEX {
            let end = (next + batch).min(LAST_INDEX + 1);
            store
                .append_durable((next..end).map(entry).collect())
                .await
                .expect("append");
            next = end;
            batch = batch % 4 + 1;
        }
    });
}

/// The store every WAL case starts from (written once per test process).
fn wal_original() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        write_store(dir.path(), common::small_wal(SEGMENT_SIZE_BYTES, 0));
        let segments = common::segment_files(dir.path());
        assert!(
            segments.len() >= 3,
            "the entries span {} segments",
            segments.len()
        );
        dir
    })
    .path()
}

/// The store every sled case starts from.
fn sled_original() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        write_store(dir.path(), LogOptions::with_engine(LogEngineKind::Sled));
        dir
    })
    .path()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create");
    for item in std::fs::read_dir(from).expect("list") {
        let item = item.expect("item");
        let target = to.join(item.file_name());
        if item.file_type().expect("type").is_dir() {
            copy_dir(&item.path(), &target);
        } else {
            std::fs::copy(item.path(), &target).expect("copy");
        }
    }
}

/// A fresh copy of `original`.
fn copy_of(original: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    copy_dir(original, dir.path());
    dir
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned()
}

/// Opens the store in `dir` and reads every entry back: the entries, or the first error.
fn open_and_read(dir: &Path, options: LogOptions) -> Result<Vec<Entry<TestConfig>>, LogError> {
    let store = Store::open(dir, options)?;
    runtime().block_on(store.read_entries(..))
}

/// Checks an error of a damaged store: a corruption error naming an index of the log (and,
/// for the WAL, a segment in `segments` when given). Without checksums, the index may come
/// from the damaged bytes themselves: then only the kind of error is checked.
fn check_typed_error(
    error: &LogError,
    segments: Option<&[String]>,
    checksums: bool,
) -> Result<(), String> {
    let index = match error {
        LogError::CorruptSegment { segment, index, .. } => {
            if let Some(segments) = segments {
                // The error names the segment by its full path.
                let name = segment
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if !segments.contains(&name) {
                    return Err(format!(
                        "the error names segment {}, expected one of {segments:?}: {error}",
                        segment.display()
                    ));
                }
            }
            *index
        }
        LogError::Corrupt { index, .. } => *index,
        // Without checksums a damaged header's version field is read as it is: a version above
        // this build's is refused as a newer release's file, a typed error that names it.
        LogError::NewerFormat { .. } if !checksums => return Ok(()),
        other => return Err(format!("an untyped error for damage: {other}")),
    };
    // A new store's first segment starts at index 0 (openraft's first entry, which these stores
    // do not write); damage there names it.
    if checksums && index > LAST_INDEX + 1 {
        return Err(format!(
            "the error names index {index}, outside the log: {error}"
        ));
    }
    Ok(())
}

/// Checks that `entries` are exactly the first `entries.len()` entries written.
fn check_prefix(entries: &[Entry<TestConfig>]) -> Result<(), String> {
    for (position, got) in entries.iter().enumerate() {
        let want = entry(position as u64 + 1);
        if *got != want {
            return Err(format!(
                "entry {} read back as {got:?}, written as {want:?}",
                position + 1
            ));
        }
    }
    Ok(())
}

/// How many entries a WAL keeps when the last segment of `original` is cut cleanly from byte
/// `offset` on, as a torn write there would leave it: the byte at `offset` changed (as the
/// damage changed it) and zeros after it; `None` if that is refused. The byte itself must
/// change: zeroing alone would leave a byte that was already zero intact, and with it the
/// frame that holds it (a commit frame's payload, for one).
fn entries_after_clean_cut(original: &Path, offset: usize) -> Option<usize> {
    let dir = copy_of(original);
    let last = common::segment_files(dir.path()).pop().expect("a segment");
    let mut bytes = std::fs::read(&last).expect("read");
    let from = offset.min(bytes.len());
    let was = bytes.get(from).copied();
    bytes[from..].fill(0);
    if let Some(was) = was {
        bytes[from] = !was;
    }
    std::fs::write(&last, &bytes).expect("write");
    open_and_read(dir.path(), wal_options(true))
        .ok()
        .map(|entries| entries.len())
}

/// Replaces segment number `choice` (modulo their count) of a copy of the WAL store with
/// `damage(original bytes)`, opens it with checksums, and checks the outcome (see the module
/// docs).
fn check_damaged_wal_segment(
    choice: usize,
    damage: impl FnOnce(Vec<u8>) -> Vec<u8>,
) -> Result<(), String> {
    let original = wal_original();
    let dir = copy_of(original);
    let segments = common::segment_files(dir.path());
    let position = choice % segments.len();
    let target: PathBuf = segments[position].clone();
    let is_last = position + 1 == segments.len();
    let before = std::fs::read(&target).expect("read");
    let after = damage(before.clone());
    std::fs::write(&target, &after).expect("write");
    let changed_at = first_difference(&before, &after);
    match open_and_read(dir.path(), wal_options(true)) {
        Err(error) => {
            if changed_at.is_none() {
                return Err(format!("an undamaged store was refused: {error}"));
            }
            check_typed_error(&error, Some(&[file_name(&target)]), true)
        }
        Ok(entries) => {
            check_prefix(&entries)?;
            let kept = entries.len();
            let Some(changed_at) = changed_at else {
                return if kept == LAST_INDEX as usize {
                    Ok(())
                } else {
                    Err(format!("an undamaged store read back {kept} entries"))
                };
            };
            if !is_last {
                // A sealed segment is refused when damaged, or the damage lies where nothing
                // is read (past its sealed end); nothing may go missing.
                return if kept == LAST_INDEX as usize {
                    Ok(())
                } else {
                    Err(format!(
                        "damage at byte {changed_at} of sealed segment {} lost entries {}..",
                        file_name(&target),
                        kept + 1
                    ))
                };
            }
            match entries_after_clean_cut(original, changed_at) {
                Some(floor) if kept >= floor => Ok(()),
                Some(floor) => Err(format!(
                    "damage at byte {changed_at} of the last segment kept {kept} entries, a clean cut there keeps {floor}"
                )),
                None => Err(format!(
                    "damage at byte {changed_at} of the last segment was accepted, a clean cut there is refused"
                )),
            }
        }
    }
}

/// The sled store with `damage` applied to the entry at `index` (through `rewrite`), opened.
fn damaged_sled_store(
    index: u64,
    rewrite: impl FnOnce(&Path) -> bool,
) -> Result<Vec<Entry<TestConfig>>, LogError> {
    let dir = copy_of(sled_original());
    assert!(rewrite(dir.path()), "entry {index} exists");
    open_and_read(dir.path(), LogOptions::with_engine(LogEngineKind::Sled))
}

proptest! {
    #![proptest_config(config(48))]

    #[test]
    fn wal_mutated_segments_are_refused_by_name_or_cut_as_a_torn_tail(
        choice in any::<usize>(),
        m in mutations(),
    ) {
        check_damaged_wal_segment(choice, |bytes| mutate(bytes, &m))
            .map_err(TestCaseError::fail)?;
    }

    #[test]
    fn wal_segments_of_arbitrary_bytes_are_refused_by_name_or_cut_as_a_torn_tail(
        choice in any::<usize>(),
        keep_header in any::<bool>(),
        garbage in arbitrary_bytes(4096),
    ) {
        check_damaged_wal_segment(choice, |bytes| {
            // With the header kept, the garbage reaches the frame scanner.
            let mut replaced = if keep_header { bytes[..SEGMENT_HEADER_LEN_BYTES].to_vec() } else { Vec::new() };
            replaced.extend_from_slice(&garbage);
            replaced.resize(bytes.len().max(replaced.len()), 0);
            replaced
        })
        .map_err(TestCaseError::fail)?;
    }

    #[test]
    fn wal_decoders_never_panic_on_mutated_segments_without_checksums(
        choice in any::<usize>(),
        m in mutations(),
    ) {
        let dir = copy_of(wal_original());
        let segments = common::segment_files(dir.path());
        let target = &segments[choice % segments.len()];
        let bytes = std::fs::read(target).expect("read");
        std::fs::write(target, mutate(bytes, &m)).expect("write");
        match open_and_read(dir.path(), wal_options(false)) {
            Err(error) => check_typed_error(&error, None, false).map_err(TestCaseError::fail)?,
            Ok(entries) => {
                // Unchecked bytes may decode to other entries, but never to a log with a gap.
                for pair in entries.windows(2) {
                    prop_assert_eq!(pair[1].log_id.index, pair[0].log_id.index + 1);
                }
            }
        }
    }

    #[test]
    fn sled_mutated_entries_are_refused_at_their_index(
        index in 1..=LAST_INDEX,
        m in mutations(),
    ) {
        let mut changed = false;
        let outcome = damaged_sled_store(index, |dir| {
            test_hooks::rewrite_stored_entry(dir, index, |stored| {
                let damaged = mutate(stored.clone(), &m);
                changed = damaged != *stored;
                *stored = damaged;
            })
            .expect("rewrite")
        });
        match outcome {
            Err(LogError::Corrupt { index: named, .. }) if changed => prop_assert_eq!(named, index),
            Ok(entries) if !changed => check_prefix(&entries).map_err(TestCaseError::fail)?,
            other => prop_assert!(false, "entry {} changed: {}, got {:?}", index, changed, other.map(|e| e.len())),
        }
    }

    #[test]
    fn sled_entries_resealed_after_mutation_reach_the_decoder_and_never_panic_it(
        // Half the cases damage a membership entry, whose strings carry length prefixes.
        index in prop_oneof![1..=LAST_INDEX, (0..LAST_INDEX / 9).prop_map(|n| n * 9 + 3)],
        m in mutations(),
    ) {
        let outcome = damaged_sled_store(index, |dir| {
            test_hooks::rewrite_stored_entry_payload(dir, index, |payload| {
                *payload = mutate(std::mem::take(payload), &m);
            })
            .expect("rewrite")
        });
        match outcome {
            Err(LogError::Corrupt { index: named, .. }) => prop_assert_eq!(named, index),
            Err(other) => prop_assert!(false, "an untyped error: {}", other),
            Ok(entries) => {
                // The damage decoded to some entry of that index; the others are intact.
                prop_assert_eq!(entries.len(), LAST_INDEX as usize);
                for (position, got) in entries.iter().enumerate() {
                    let at = position as u64 + 1;
                    if at == index {
                        prop_assert_eq!(got.log_id.index, index);
                    } else {
                        prop_assert!(*got == entry(at), "entry {} changed", at);
                    }
                }
            }
        }
    }
}

#[test]
fn the_original_stores_read_back_every_entry_so_that_mutations_reach_deep() {
    // The cases mutate valid stores: both open and hold exactly the entries written.
    for (dir, options) in [
        (wal_original(), wal_options(true)),
        (
            sled_original(),
            LogOptions::with_engine(LogEngineKind::Sled),
        ),
    ] {
        let copy = copy_of(dir);
        let entries = open_and_read(copy.path(), options).expect("open");
        assert_eq!(entries.len(), LAST_INDEX as usize);
        check_prefix(&entries).expect("intact");
    }
}
