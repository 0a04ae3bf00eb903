//! The WAL's I/O thread, `raft-log-wal`: the only code that writes segments and metadata.
//!
//! It blocks for one operation, takes every operation already queued (a *group*), writes all
//! their frames as one batch closed by one commit frame with one `pwrite`, makes it durable
//! with one `fdatasync`, publishes where each entry now lives, and then — on this same thread,
//! with no further hand-off — fires the flush callbacks and answers truncations in queue
//! order. Metadata changes of the group (a vote, a purge point, a new segment) go to sled
//! after the entries are durable; segments below a purge point are deleted only after the
//! purge point is durable. A group that wrote nothing makes no `fdatasync`.
//!
//! While the thread is inside `fdatasync`, new operations queue up and form the next group:
//! appends issued back to back share durability points (group commit).

use std::collections::VecDeque;
use std::fs::File;
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;

use openraft::RaftTypeConfig;
use serde::Deserialize;
use serde::Serialize;

use super::format;
use super::format::FrameKind;
use super::Location;
use super::Op;
use super::SegmentFile;
use super::Shared;
use crate::engine::LogEngine;
use crate::engine::SledEngine;
use crate::writer::Waiter;
use crate::writer::META_COMMITTED;
use crate::writer::META_PURGED;
use crate::writer::META_VOTE;
use crate::LogError;

/// Metadata key of the segment list.
pub(crate) const META_SEGMENTS: &str = "segments";

/// At most this many queued operations form one group, to bound the latency of the first.
const GROUP_OPS_MAX: usize = 4096;

/// One segment, as the metadata lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SegmentRecord {
    pub(crate) id: u64,
    pub(crate) base_index: u64,
    /// Where the last batch of a sealed segment ends; `None` for the active (last) segment.
    pub(crate) sealed_end_bytes: Option<u64>,
}

/// The segment being appended to.
pub(crate) struct Active {
    pub(crate) id: u64,
    pub(crate) file: Arc<SegmentFile>,
    /// Where the next batch starts: just after the last commit frame.
    pub(crate) write_offset: u64,
    /// The preallocated size; a batch that would cross it goes to a new segment.
    pub(crate) capacity_bytes: u64,
}

/// Which segment holds each entry written so far, in the order the thread wrote them.
#[derive(Debug, Default)]
pub(crate) struct DiskIndex {
    pub(crate) first_index: u64,
    pub(crate) segment_ids: VecDeque<u64>,
}

impl DiskIndex {
    pub(crate) fn last_index(&self) -> Option<u64> {
        (!self.segment_ids.is_empty()).then(|| self.first_index + self.segment_ids.len() as u64 - 1)
    }

    fn push(&mut self, index: u64, segment_id: u64) {
        match self.last_index() {
            None => self.first_index = index,
            Some(last) => assert_eq!(index, last + 1, "entries reach the disk in order"),
        }
        self.segment_ids.push_back(segment_id);
    }

    fn truncate_from(&mut self, from_index: u64) {
        let keep = from_index.saturating_sub(self.first_index) as usize;
        self.segment_ids.truncate(keep);
    }

    fn purge_through(&mut self, through_index: u64) {
        while !self.segment_ids.is_empty() && self.first_index <= through_index {
            self.segment_ids.pop_front();
            self.first_index += 1;
        }
        if self.segment_ids.is_empty() {
            self.first_index = self.first_index.max(through_index + 1);
        }
    }
}

/// Everything the I/O thread owns.
pub(crate) struct IoThread<C: RaftTypeConfig> {
    pub(crate) shared: Arc<Shared<C>>,
    pub(crate) meta: SledEngine,
    pub(crate) segments_dir: PathBuf,
    pub(crate) records: Vec<SegmentRecord>,
    pub(crate) active: Active,
    pub(crate) disk: DiskIndex,
    pub(crate) purged_index: Option<u64>,
    pub(crate) fsync: bool,
    pub(crate) fsync_directories: bool,
    pub(crate) segment_size_bytes: u64,
    /// The batch being built (reused between groups).
    pub(crate) buffer: Vec<u8>,
    /// Frames in `buffer`.
    pub(crate) buffer_frames: u32,
    /// The last append operation taken from the queue: callers number them in queue order.
    pub(crate) last_seq: u64,
}

/// Creates segment `id` in `dir`: preallocated, header written, durable with its name.
pub(crate) fn create_segment(
    dir: &Path,
    id: u64,
    base_index: u64,
    capacity_bytes: u64,
    fsync: bool,
    fsync_directories: bool,
) -> Result<Arc<SegmentFile>, LogError> {
    let name = format::segment_file_name(base_index, id);
    let path = dir.join(&name);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .map_err(|e| LogError::io(format!("create segment {}", path.display()), e))?;
    preallocate(&file, capacity_bytes)
        .map_err(|e| LogError::io(format!("preallocate segment {}", path.display()), e))?;
    let header = format::segment_header(id, base_index);
    file.write_all_at(&header, 0)
        .map_err(|e| LogError::io(format!("write segment header {}", path.display()), e))?;
    if fsync {
        file.sync_all()
            .map_err(|e| LogError::io(format!("fsync segment {}", path.display()), e))?;
    }
    if fsync_directories {
        crate::lock::fsync_directory(dir)?;
    }
    Ok(Arc::new(SegmentFile { file, name, path }))
}

/// Reserves `len_bytes` for the file (zeros), falling back to a sparse length where the
/// filesystem cannot preallocate.
fn preallocate(file: &File, len_bytes: u64) -> std::io::Result<()> {
    let len = libc::off_t::try_from(len_bytes).map_err(std::io::Error::other)?;
    // SAFETY: fallocate on a file descriptor we own; no memory is passed.
    let ret = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if ret == 0 {
        return Ok(());
    }
    let error = std::io::Error::last_os_error();
    if error.raw_os_error() == Some(libc::EOPNOTSUPP) {
        file.set_len(len_bytes)
    } else {
        Err(error)
    }
}

impl<C> IoThread<C>
where
    C: RaftTypeConfig,
{
    /// Runs until every sender is dropped, then writes the committed log id one last time.
    pub(crate) fn run(mut self, ops: mpsc::Receiver<Op>) {
        while let Ok(first) = ops.recv() {
            let mut group = vec![first];
            while group.len() < GROUP_OPS_MAX {
                match ops.try_recv() {
                    Ok(op) => group.push(op),
                    Err(_) => break,
                }
            }
            self.handle_group(group);
        }
        if self.shared.poison.failure().is_none() {
            if let Err(error) = self.put_committed().and_then(|()| self.meta.sync()) {
                tracing::warn!(%error, "cannot record the committed log id on close");
            }
        }
        tracing::debug!("raft-log WAL thread stops: every handle is dropped");
    }

    fn handle_group(&mut self, group: Vec<Op>) {
        let mut durable_waiters = Vec::new();
        let mut meta_waiters = Vec::new();
        let mut vote = None;
        let mut purge = None;
        let mut locations = Vec::new();
        let mut failure = self.shared.poison.reason();
        assert!(self.buffer.is_empty() && self.buffer_frames == 0);
        for op in group {
            match op {
                Op::Append {
                    seq,
                    first_index,
                    truncate_first,
                    frames,
                    frame_lens,
                    on_durable,
                } => {
                    // Paired with the numbering in `Wal::append`: callbacks are released in
                    // the order of `durable_waiters`, which is the append order.
                    assert!(seq > self.last_seq, "appends reach the I/O thread in order");
                    self.last_seq = seq;
                    durable_waiters.push(Waiter::Callback(on_durable));
                    if failure.is_some() || frame_lens.is_empty() {
                        continue;
                    }
                    // A purge queued before this append is durable before it is written: after
                    // a snapshot, the append may start past the end of what is on disk, and
                    // recovery accepts that gap only inside the durable purged range.
                    if purge.is_some() {
                        if let Err(error) = self
                            .write_batch()
                            .and_then(|()| self.write_meta(vote.take(), purge.take()))
                        {
                            failure = Some(self.fail(error));
                            continue;
                        }
                    }
                    let needed = frames.len()
                        + format::TRUNCATE_FRAME_LEN_BYTES
                        + format::COMMIT_FRAME_LEN_BYTES;
                    let end = self.active.write_offset + self.buffer.len() as u64;
                    if end + needed as u64 > self.active.capacity_bytes
                        && end > format::SEGMENT_HEADER_LEN_BYTES as u64
                    {
                        if let Err(error) = self
                            .write_batch()
                            .and_then(|()| self.rotate(first_index, needed))
                        {
                            failure = Some(self.fail(error));
                            continue;
                        }
                    }
                    if truncate_first {
                        self.push_truncate(first_index);
                    }
                    let mut offset = self.active.write_offset + self.buffer.len() as u64;
                    for (position, len) in frame_lens.iter().enumerate() {
                        let index = first_index + position as u64;
                        // Paired with the check on read: what we write names its own index.
                        debug_assert!(matches!(
                            format::parse_frame(&frames, (offset - self.active.write_offset - self.buffer.len() as u64) as usize, true),
                            format::Parsed::Frame { index: i, kind: FrameKind::Entry, .. } if i == index
                        ));
                        locations.push((
                            seq,
                            index,
                            Location {
                                segment_id: self.active.id,
                                offset,
                            },
                        ));
                        self.disk.push(index, self.active.id);
                        offset += u64::from(*len);
                    }
                    self.buffer.extend_from_slice(&frames);
                    self.buffer_frames += frame_lens.len() as u32;
                }
                Op::Truncate { from_index, done } => {
                    durable_waiters.push(Waiter::Reply(done));
                    if failure.is_none()
                        && self
                            .disk
                            .last_index()
                            .is_some_and(|last| from_index <= last)
                    {
                        self.push_truncate(from_index);
                    }
                }
                Op::Purge {
                    through_index,
                    sealed_purged,
                    done,
                } => {
                    meta_waiters.push(Waiter::Reply(done));
                    purge = Some((through_index, sealed_purged));
                }
                Op::Vote { sealed_vote, done } => {
                    meta_waiters.push(Waiter::Reply(done));
                    vote = Some(sealed_vote);
                }
            }
        }
        if failure.is_none() {
            if let Err(error) = self.write_batch() {
                failure = Some(self.fail(error));
            }
        }
        if let Some(reason) = failure {
            self.buffer.clear();
            self.buffer_frames = 0;
            let result = Err(reason);
            for waiter in durable_waiters.into_iter().chain(meta_waiters) {
                waiter.release(&result);
            }
            return;
        }
        // Durable: say where the entries live, so the tail may let go of them.
        {
            let mut state = self.shared.state.lock();
            let first_index = state.first_index;
            for (seq, index, location) in locations {
                let Some(position) = index.checked_sub(first_index) else {
                    continue;
                };
                if let Some(slot) = state.slots.get_mut(position as usize) {
                    if slot.seq == seq {
                        slot.location = Some(location);
                    }
                }
            }
            state.evict_tail();
        }
        // Flush callbacks and truncation replies, from this thread, in queue order.
        for waiter in durable_waiters {
            waiter.release(&Ok(()));
        }
        // A purge or vote already written before an append of this group has no meta left.
        let result = if vote.is_none() && purge.is_none() {
            Ok(())
        } else {
            self.write_meta(vote, purge)
                .map_err(|error| self.fail(error))
        };
        for waiter in meta_waiters {
            waiter.release(&result);
        }
    }

    /// Poisons the store; returns the reason.
    fn fail(&self, error: LogError) -> String {
        self.shared.poison.poison(error)
    }

    fn push_truncate(&mut self, from_index: u64) {
        format::push_frame(&mut self.buffer, FrameKind::Truncate, from_index, &[]);
        self.buffer_frames += 1;
        self.disk.truncate_from(from_index);
    }

    /// Closes the batch with its commit frame, writes it with one `pwrite` and makes it
    /// durable with one `fdatasync`. Nothing to write: no sync.
    fn write_batch(&mut self) -> Result<(), LogError> {
        if self.buffer_frames == 0 {
            assert!(self.buffer.is_empty());
            return Ok(());
        }
        let start = self.active.write_offset;
        let batch_crc = crc32c::crc32c(&self.buffer);
        format::push_commit(&mut self.buffer, start, batch_crc, self.buffer_frames);
        let file = &self.active.file;
        let write_started = std::time::Instant::now();
        file.file.write_all_at(&self.buffer, start).map_err(|e| {
            LogError::io(
                format!("write {} bytes to segment {}", self.buffer.len(), file.name),
                e,
            )
        })?;
        let sync_started = std::time::Instant::now();
        if self.fsync {
            file.file
                .sync_data()
                .map_err(|e| LogError::io(format!("fdatasync segment {}", file.name), e))?;
        }
        crate::metrics::record_batch(
            self.buffer.len(),
            sync_started - write_started,
            self.fsync.then(|| sync_started.elapsed()),
        );
        self.shared
            .counters
            .durability_points
            .fetch_add(1, Ordering::Relaxed);
        self.active.write_offset += self.buffer.len() as u64;
        assert_eq!(
            self.active.write_offset % format::FRAME_ALIGN_BYTES as u64,
            0
        );
        self.buffer.clear();
        self.buffer_frames = 0;
        Ok(())
    }

    /// Seals the active segment and starts a new one whose first entry will be `base_index`,
    /// big enough for `needed` bytes: the new file is durable with its name, then recorded in
    /// the metadata, before anything is written to it.
    fn rotate(&mut self, base_index: u64, needed: usize) -> Result<(), LogError> {
        assert!(
            self.buffer.is_empty(),
            "the previous batch is written first"
        );
        let id = self.active.id + 1;
        let capacity_bytes = self
            .segment_size_bytes
            .max((format::SEGMENT_HEADER_LEN_BYTES + needed) as u64);
        let file = create_segment(
            &self.segments_dir,
            id,
            base_index,
            capacity_bytes,
            self.fsync,
            self.fsync_directories,
        )?;
        let mut records = self.records.clone();
        let active = records.last_mut().expect("there is an active segment");
        assert_eq!(active.id, self.active.id);
        active.sealed_end_bytes = Some(self.active.write_offset);
        records.push(SegmentRecord {
            id,
            base_index,
            sealed_end_bytes: None,
        });
        self.meta.put_meta(
            META_SEGMENTS,
            &crate::store::seal_meta(META_SEGMENTS, &records)?,
        )?;
        self.put_committed()?;
        self.meta.sync()?;
        self.records = records;
        self.shared
            .state
            .lock()
            .segments
            .insert(id, Arc::clone(&file));
        tracing::debug!(segment = %file.name, "raft log segment started");
        self.active = Active {
            id,
            file,
            write_offset: format::SEGMENT_HEADER_LEN_BYTES as u64,
            capacity_bytes,
        };
        Ok(())
    }

    /// Writes the committed log id to the metadata (not synced here) when it is covered by
    /// durable entries.
    fn put_committed(&mut self) -> Result<(), LogError> {
        let committed = self.shared.state.lock().committed.clone();
        let Some(committed) = committed else {
            return Ok(());
        };
        let durable_last = self.disk.last_index().max(self.purged_index);
        if durable_last.is_none_or(|last| committed.index > last) {
            return Ok(());
        }
        let sealed = crate::store::seal_meta(META_COMMITTED, &Some(committed))?;
        self.meta.put_meta(META_COMMITTED, &sealed)
    }

    /// Stores a vote and/or a purge point durably, then deletes the segments that hold only
    /// purged entries (and fsyncs their directory).
    fn write_meta(
        &mut self,
        vote: Option<Vec<u8>>,
        purge: Option<(u64, Vec<u8>)>,
    ) -> Result<(), LogError> {
        if let Some(vote) = vote {
            self.meta.put_meta(META_VOTE, &vote)?;
        }
        let mut doomed = Vec::new();
        let mut records = self.records.clone();
        if let Some((through_index, sealed_purged)) = purge {
            self.meta.put_meta(META_PURGED, &sealed_purged)?;
            self.purged_index = self.purged_index.max(Some(through_index));
            self.disk.purge_through(through_index);
            let keep_from_id = self
                .disk
                .segment_ids
                .front()
                .copied()
                .unwrap_or(self.active.id)
                .min(self.active.id);
            (doomed, records) = records
                .into_iter()
                .partition(|record| record.id < keep_from_id);
            if !doomed.is_empty() {
                self.meta.put_meta(
                    META_SEGMENTS,
                    &crate::store::seal_meta(META_SEGMENTS, &records)?,
                )?;
            }
        }
        self.put_committed()?;
        // The purge point (and the shorter segment list) is durable before any deletion.
        self.meta.sync()?;
        self.records = records;
        assert_eq!(self.records.last().map(|r| r.id), Some(self.active.id));
        if doomed.is_empty() {
            return Ok(());
        }
        {
            let mut state = self.shared.state.lock();
            for record in &doomed {
                state.segments.remove(&record.id);
            }
        }
        for record in &doomed {
            let path = self
                .segments_dir
                .join(format::segment_file_name(record.base_index, record.id));
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(LogError::io(
                        format!("delete segment {}", path.display()),
                        e,
                    ))
                }
            }
            tracing::debug!(segment = %path.display(), "raft log segment deleted after a purge");
        }
        if self.fsync_directories {
            crate::lock::fsync_directory(&self.segments_dir)?;
        }
        Ok(())
    }
}
