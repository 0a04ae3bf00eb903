//! Opening a WAL: read the metadata, drop segment files the metadata does not list (a crash
//! between creating a file and recording it, or between recording a purge and deleting),
//! replay every listed segment in id order, cut a torn tail back to its last commit frame,
//! and refuse — with the segment and the index — anything damaged before the tail.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;

use openraft::LogId;
use openraft::RaftLogId;
use openraft::RaftTypeConfig;
use openraft::Vote;
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::format;
use super::format::FrameKind;
use super::format::ScannedFrame;
use super::io::create_segment;
use super::io::Active;
use super::io::DiskIndex;
use super::io::IoThread;
use super::io::SegmentRecord;
use super::io::META_SEGMENTS;
use super::Location;
use super::Op;
use super::SegmentFile;
use super::Shared;
use super::Slot;
use super::State;
use crate::engine::LogEngine;
use crate::engine::SledEngine;
use crate::marker::WAL_META_SUBDIR;
use crate::marker::WAL_SEGMENTS_SUBDIR;
use crate::poison::Poison;
use crate::store::read_meta;
use crate::writer::Counters;
use crate::writer::META_COMMITTED;
use crate::writer::META_PURGED;
use crate::writer::META_VOTE;
use crate::LogError;
use crate::LogOptions;

/// sled's page cache for the metadata tree: it holds a handful of small values.
const META_CACHE_CAPACITY_BYTES: u64 = 1024 * 1024;

/// Recovers the WAL in `dir` and returns the shared state and the (not yet started) I/O thread.
pub(crate) fn recover<C>(
    dir: &Path,
    options: &LogOptions,
    ops: mpsc::Sender<Op>,
    counters: Arc<Counters>,
) -> Result<(Arc<Shared<C>>, IoThread<C>), LogError>
where
    C: RaftTypeConfig,
    C::Entry: Serialize + DeserializeOwned + Clone,
{
    let fsync = !options.unsafe_skip_fsync_for_tests;
    let fsync_directories = !options.unsafe_skip_directory_fsync_for_tests;
    let check_crc = !options.unsafe_skip_crc_check_for_tests;
    if options.is_unsafe() {
        tracing::warn!(dir = %dir.display(), ?options, "raft log opened with unsafe test switches: acknowledged entries can be lost or damaged");
    }
    let meta = SledEngine::open_with(
        &dir.join(WAL_META_SUBDIR),
        fsync,
        fsync_directories,
        META_CACHE_CAPACITY_BYTES,
    )?;
    let vote: Option<Vote<C::NodeId>> = read_meta(&meta, META_VOTE)?;
    let purged: Option<LogId<C::NodeId>> = read_meta(&meta, META_PURGED)?;
    let committed: Option<LogId<C::NodeId>> =
        read_meta::<Option<LogId<C::NodeId>>>(&meta, META_COMMITTED)?.flatten();
    let mut records: Vec<SegmentRecord> = read_meta(&meta, META_SEGMENTS)?.unwrap_or_default();
    check_records(&records)?;

    let segments_dir = dir.join(WAL_SEGMENTS_SUBDIR);
    if !segments_dir.exists() {
        std::fs::create_dir(&segments_dir)
            .map_err(|e| LogError::io(format!("create directory {}", segments_dir.display()), e))?;
        if fsync_directories {
            crate::lock::fsync_directory(dir)?;
        }
    }
    delete_unlisted_segments(&segments_dir, &records, fsync_directories)?;

    let mut state = State::<C> {
        ops: Some(ops),
        next_seq: 1,
        purged: None,
        vote: None,
        committed: None,
        first_index: 0,
        slots: VecDeque::new(),
        tail: VecDeque::new(),
        tail_bytes: 0,
        tail_bytes_max: options.tail_bytes_max,
        segments: BTreeMap::new(),
    };
    let mut active: Option<Active> = None;
    // The last segment's bytes after its last commit frame, to zero once the log is accepted.
    let mut torn_tail = None;
    for (position, record) in records.iter().enumerate() {
        let is_last = position + 1 == records.len();
        let name = format::segment_file_name(record.base_index, record.id);
        let path = segments_dir.join(&name);
        let corrupt = |index: u64, offset_bytes: u64, reason: String| LogError::CorruptSegment {
            segment: path.clone(),
            index,
            offset_bytes,
            reason,
        };
        let next_index = |state: &State<C>| {
            state
                .last_index()
                .map(|last| last + 1)
                .unwrap_or(record.base_index)
        };
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(corrupt(
                    next_index(&state),
                    0,
                    "the segment file is missing (the metadata lists it)".to_string(),
                ))
            }
            Err(e) => return Err(LogError::io(format!("open segment {}", path.display()), e)),
        };
        let mut bytes = Vec::new();
        (&file)
            .read_to_end(&mut bytes)
            .map_err(|e| LogError::io(format!("read segment {}", path.display()), e))?;
        let file_len_bytes = bytes.len() as u64;
        if let Some(sealed_end) = record.sealed_end_bytes {
            if file_len_bytes < sealed_end {
                return Err(corrupt(
                    next_index(&state),
                    file_len_bytes,
                    format!(
                        "the file is {file_len_bytes} bytes long, but was sealed at {sealed_end}"
                    ),
                ));
            }
            bytes.truncate(sealed_end as usize);
        }
        format::check_segment_header(&bytes, record.id, record.base_index, check_crc).map_err(
            |problem| match problem {
                format::HeaderProblem::Newer { found } => LogError::NewerFormat {
                    file: path.clone(),
                    found,
                    reads: format::FORMAT_VERSION,
                },
                format::HeaderProblem::Damaged(reason) => corrupt(next_index(&state), 0, reason),
            },
        )?;
        let scan = format::scan_segment(&bytes, check_crc);
        apply_frames(
            &mut state,
            purged.as_ref().map(|id| id.index),
            &scan.committed,
            &bytes,
            record.id,
            &path,
            check_crc,
        )?;
        let damaged_index = next_index(&state)
            + scan
                .uncommitted
                .iter()
                .filter(|frame| frame.kind == FrameKind::Entry)
                .count() as u64;
        match (&scan.damage, is_last) {
            (Some(damage), _) if !is_last || damage.later_batch_committed => {
                return Err(corrupt(damaged_index, damage.offset, damage.reason.clone()));
            }
            (None, false)
                if !scan.uncommitted.is_empty() || scan.end_offset != bytes.len() as u64 =>
            {
                return Err(corrupt(
                    damaged_index,
                    scan.end_offset,
                    format!(
                        "the sealed segment's batches end at byte {}, but it was sealed at {}",
                        scan.end_offset,
                        bytes.len()
                    ),
                ));
            }
            _ => {}
        }
        if is_last && (scan.damage.is_some() || !scan.uncommitted.is_empty()) {
            // A torn tail: the batch being written when the process stopped, never
            // acknowledged. Cut back to the last commit frame and zero what follows, so no
            // stale frame can ever line up behind a later batch.
            tracing::warn!(
                segment = %name,
                cut_at = scan.end_offset,
                damage = ?scan.damage,
                uncommitted_frames = scan.uncommitted.len(),
                "raft log: cutting a torn tail back to its last commit"
            );
        }
        if is_last && scan.nonzero_end > scan.end_offset {
            // Zeroed only once every check below has passed: a refused open changes nothing.
            torn_tail = Some((path.clone(), scan.end_offset, scan.nonzero_end));
        }
        let segment = Arc::new(SegmentFile {
            file,
            name,
            path: path.clone(),
        });
        state.segments.insert(record.id, Arc::clone(&segment));
        if is_last {
            active = Some(Active {
                id: record.id,
                file: segment,
                write_offset: scan.end_offset,
                capacity_bytes: options.segment_size_bytes.max(file_len_bytes),
            });
        }
    }

    if let Some(purged) = &purged {
        if !state.slots.is_empty() && state.first_index > purged.index + 1 {
            let missing = purged.index + 1;
            return Err(LogError::Corrupt {
                index: missing,
                reason: format!(
                    "entry is missing: the log is purged through {} but starts at {}",
                    purged.index, state.first_index
                ),
            });
        }
        state.purge_through(purged.index);
    }
    let last_index = state.last_index().or(purged.as_ref().map(|id| id.index));
    if let Some(committed) = &committed {
        if last_index.is_none_or(|last| committed.index > last) {
            return Err(LogError::Corrupt {
                index: committed.index,
                reason: format!(
                    "committed entry {} is missing: the log ends at {last_index:?}",
                    committed.index
                ),
            });
        }
    }
    if let Some((path, from_offset, to_offset)) = torn_tail {
        // A torn tail: the batch being written when the process stopped, never acknowledged
        // (the committed log id above is covered). Zeroed so that no stale frame can ever
        // line up behind a later batch.
        let file = &active
            .as_ref()
            .expect("the torn segment is the active one")
            .file
            .file;
        let zeros = vec![0u8; (to_offset - from_offset) as usize];
        file.write_all_at(&zeros, from_offset)
            .map_err(|e| LogError::io(format!("zero the torn tail of {}", path.display()), e))?;
        if fsync {
            file.sync_data()
                .map_err(|e| LogError::io(format!("fdatasync {}", path.display()), e))?;
        }
    }
    let active = match active {
        Some(active) => active,
        None => {
            // A new store: the first segment, durable and recorded before anything is written.
            let base_index = last_index.map(|last| last + 1).unwrap_or(0);
            let file = create_segment(
                &segments_dir,
                1,
                base_index,
                options.segment_size_bytes,
                fsync,
                fsync_directories,
            )?;
            records = vec![SegmentRecord {
                id: 1,
                base_index,
                sealed_end_bytes: None,
            }];
            meta.put_meta(
                META_SEGMENTS,
                &crate::store::seal_meta(META_SEGMENTS, &records)?,
            )?;
            meta.sync()?;
            state.segments.insert(1, Arc::clone(&file));
            Active {
                id: 1,
                file,
                write_offset: format::SEGMENT_HEADER_LEN_BYTES as u64,
                capacity_bytes: options.segment_size_bytes,
            }
        }
    };
    let mut disk = DiskIndex {
        first_index: state.first_index,
        segment_ids: VecDeque::with_capacity(state.slots.len()),
    };
    for slot in &state.slots {
        let location = slot.location.expect("recovered entries have locations");
        disk.segment_ids.push_back(location.segment_id);
    }
    let purged_index = purged.as_ref().map(|id| id.index);
    state.purged = purged;
    state.vote = vote;
    state.committed = committed;
    let shared = Arc::new(Shared {
        state: Mutex::new(state),
        poison: Poison::default(),
        counters,
        check_crc,
    });
    let io_thread = IoThread {
        shared: Arc::clone(&shared),
        meta,
        segments_dir,
        records,
        active,
        disk,
        purged_index,
        fsync,
        fsync_directories,
        segment_size_bytes: options.segment_size_bytes,
        buffer: Vec::new(),
        buffer_frames: 0,
        last_seq: 0,
    };
    Ok((shared, io_thread))
}

/// The segment list must be in increasing id order, with only the last one unsealed.
fn check_records(records: &[SegmentRecord]) -> Result<(), LogError> {
    for pair in records.windows(2) {
        if pair[0].id >= pair[1].id {
            return Err(LogError::CorruptMeta {
                key: META_SEGMENTS,
                reason: format!(
                    "segment ids out of order: {} then {}",
                    pair[0].id, pair[1].id
                ),
            });
        }
    }
    for (position, record) in records.iter().enumerate() {
        let is_last = position + 1 == records.len();
        if is_last == record.sealed_end_bytes.is_some() {
            return Err(LogError::CorruptMeta {
                key: META_SEGMENTS,
                reason: format!(
                    "segment {} is {} but is {} the last",
                    record.id,
                    if record.sealed_end_bytes.is_some() {
                        "sealed"
                    } else {
                        "active"
                    },
                    if is_last { "" } else { "not" }
                ),
            });
        }
    }
    Ok(())
}

/// Deletes `*.wal` files that the metadata does not list: created but never recorded, or
/// recorded as purged but not yet deleted when the process stopped.
fn delete_unlisted_segments(
    segments_dir: &Path,
    records: &[SegmentRecord],
    fsync_directories: bool,
) -> Result<(), LogError> {
    let listed: BTreeSet<String> = records
        .iter()
        .map(|record| format::segment_file_name(record.base_index, record.id))
        .collect();
    let listing = std::fs::read_dir(segments_dir)
        .map_err(|e| LogError::io(format!("list {}", segments_dir.display()), e))?;
    let mut deleted = false;
    for item in listing {
        let item = item.map_err(|e| LogError::io(format!("list {}", segments_dir.display()), e))?;
        let name = item.file_name().to_string_lossy().into_owned();
        if format::parse_segment_file_name(&name).is_none() || listed.contains(&name) {
            continue;
        }
        tracing::info!(segment = %name, "deleting a raft log segment the metadata does not list");
        std::fs::remove_file(item.path())
            .map_err(|e| LogError::io(format!("delete {}", item.path().display()), e))?;
        deleted = true;
    }
    if deleted && fsync_directories {
        crate::lock::fsync_directory(segments_dir)?;
    }
    Ok(())
}

/// Replays committed frames onto `state`: entries must follow the log's last index (or start
/// it, or jump over a gap that lies wholly at or below `purged_index`), truncate frames cut it.
fn apply_frames<C>(
    state: &mut State<C>,
    purged_index: Option<u64>,
    frames: &[ScannedFrame],
    bytes: &[u8],
    segment_id: u64,
    segment_path: &Path,
    check_crc: bool,
) -> Result<(), LogError>
where
    C: RaftTypeConfig,
    C::Entry: DeserializeOwned,
{
    for frame in frames {
        match frame.kind {
            FrameKind::Truncate => state.truncate_from(frame.index),
            FrameKind::Entry => {
                let corrupt = |index: u64, reason: String| LogError::CorruptSegment {
                    segment: segment_path.to_path_buf(),
                    index,
                    offset_bytes: frame.offset,
                    reason,
                };
                if let Some(last) = state.last_index() {
                    // After a snapshot, openraft purges past the end of a short log and appends
                    // from the purge point on: a forward jump whose gap is wholly purged loses
                    // nothing, and the log starts again at the jump.
                    let gap_is_purged = frame.index > last + 1
                        && purged_index.is_some_and(|purged| frame.index - 1 <= purged);
                    if gap_is_purged {
                        state.purge_through(frame.index - 1);
                    } else if frame.index != last + 1 {
                        return Err(corrupt(
                            last + 1,
                            format!(
                                "entry is missing: the log jumps from index {last} to {}",
                                frame.index
                            ),
                        ));
                    }
                }
                let start = frame.offset as usize;
                let raw = &bytes[start..start + frame.len as usize];
                let entry: C::Entry = super::decode_entry_frame::<C>(raw, frame.index, check_crc)
                    .map_err(|reason| corrupt(frame.index, reason))?;
                if state.slots.is_empty() {
                    state.first_index = frame.index;
                }
                state.slots.push_back(Slot {
                    log_id: entry.get_log_id().clone(),
                    seq: 0,
                    len_bytes: frame.len,
                    location: Some(Location {
                        segment_id,
                        offset: frame.offset,
                    }),
                });
                state.tail.push_back(entry);
                state.tail_bytes += u64::from(frame.len);
                state.evict_tail();
            }
            FrameKind::Commit | FrameKind::SegmentHeader => {
                unreachable!("the scan returns only entry and truncate frames")
            }
        }
    }
    Ok(())
}
