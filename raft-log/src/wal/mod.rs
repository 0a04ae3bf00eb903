//! The segmented write-ahead log engine: the in-memory view of the log that every caller
//! shares ([`Wal`]), the I/O thread that writes it ([`io`]), the file format ([`format`]) and
//! recovery ([`recovery`]).
//!
//! Callers change the in-memory view and queue the matching operation to the I/O thread in
//! one critical section, so the thread sees operations in exactly the order the view changed.
//! Appended entries are readable at once, from the tail; the thread writes whole groups of
//! operations, makes them durable with one `fdatasync`, and fires the flush callbacks itself.

pub(crate) mod format;
mod io;
mod recovery;

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use openraft::LogId;
use openraft::RaftLogId;
use openraft::RaftTypeConfig;
use openraft::Vote;
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::oneshot;

use crate::codec;
use crate::poison::Poison;
use crate::read_budget::ReadBudget;
use crate::writer::Counters;
use crate::writer::DurableCallback;
use crate::writer::Reply;
use crate::writer::META_PURGED;
use crate::writer::META_VOTE;
use crate::LogError;
use crate::LogOptions;

use self::format::FrameKind;
use self::format::Parsed;

/// Name of the I/O thread.
pub(crate) const IO_THREAD_NAME: &str = "raft-log-wal";

/// An open segment file, shared by the I/O thread (which appends to it) and readers (which
/// `pread` frames that were written before they looked them up). Segments are append-only:
/// bytes once written at an offset are never rewritten while the store is open.
pub(crate) struct SegmentFile {
    pub(crate) file: File,
    pub(crate) name: String,
    /// The file's full path, for error messages.
    pub(crate) path: std::path::PathBuf,
}

/// Where an entry's frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Location {
    pub(crate) segment_id: u64,
    pub(crate) offset: u64,
}

/// One entry of the log, as the in-memory view knows it.
pub(crate) struct Slot<NID: openraft::NodeId> {
    pub(crate) log_id: LogId<NID>,
    /// The append operation that stored this incarnation of the entry.
    pub(crate) seq: u64,
    /// The frame's length in bytes.
    pub(crate) len_bytes: u32,
    /// Set by the I/O thread once the frame is written.
    pub(crate) location: Option<Location>,
}

/// The log as every caller sees it.
pub(crate) struct State<C: RaftTypeConfig> {
    /// The I/O thread's queue; `None` once the store is shutting down.
    pub(crate) ops: Option<mpsc::Sender<Op>>,
    pub(crate) next_seq: u64,
    pub(crate) purged: Option<LogId<C::NodeId>>,
    pub(crate) vote: Option<Vote<C::NodeId>>,
    pub(crate) committed: Option<LogId<C::NodeId>>,
    /// Index of `slots[0]`.
    pub(crate) first_index: u64,
    pub(crate) slots: VecDeque<Slot<C::NodeId>>,
    /// The entries of the last `tail.len()` slots.
    pub(crate) tail: VecDeque<C::Entry>,
    pub(crate) tail_bytes: u64,
    pub(crate) tail_bytes_max: u64,
    /// Every segment that a live slot may point into, by id.
    pub(crate) segments: BTreeMap<u64, Arc<SegmentFile>>,
}

impl<C: RaftTypeConfig> State<C> {
    fn last_index(&self) -> Option<u64> {
        (!self.slots.is_empty()).then(|| self.first_index + self.slots.len() as u64 - 1)
    }

    fn tail_first_index(&self) -> u64 {
        self.first_index + (self.slots.len() - self.tail.len()) as u64
    }

    /// Removes every entry `>= from_index`.
    fn truncate_from(&mut self, from_index: u64) {
        if self.last_index().is_none_or(|last| from_index > last) {
            return;
        }
        let keep = from_index.saturating_sub(self.first_index) as usize;
        while self.slots.len() > keep {
            let slot = self.slots.pop_back().expect("non-empty");
            // The tail holds the entries of the *last* slots: the slot just removed is its
            // last entry whenever it holds any. (Popping it only when the tail held every
            // slot shifted the tail against the slots once part of it had been evicted, and
            // each later read of a recent index returned a later entry: issue 29.)
            if !self.tail.is_empty() {
                self.tail.pop_back();
                self.tail_bytes -= u64::from(slot.len_bytes);
            }
        }
        assert!(self.last_index().is_none_or(|last| last < from_index));
        self.assert_tail_aligned();
    }

    /// The tail holds exactly the entries of the last `tail.len()` slots: its first and last
    /// entries carry the log ids of those slots. O(1); checked after every change of the view.
    pub(crate) fn assert_tail_aligned(&self) {
        assert!(
            self.tail.len() <= self.slots.len(),
            "the tail is a suffix of the log"
        );
        if let (Some(first), Some(last)) = (self.tail.front(), self.tail.back()) {
            let first_slot = &self.slots[self.slots.len() - self.tail.len()];
            let last_slot = self.slots.back().expect("the tail is a suffix of the log");
            assert!(
                first.get_log_id() == &first_slot.log_id && last.get_log_id() == &last_slot.log_id,
                "the in-memory tail is out of step with the log: it holds {}..={} for slots {}..={}",
                first.get_log_id(),
                last.get_log_id(),
                first_slot.log_id,
                last_slot.log_id
            );
        }
    }

    /// Removes every entry `<= through_index`.
    fn purge_through(&mut self, through_index: u64) {
        while !self.slots.is_empty() && self.first_index <= through_index {
            let slot = self.slots.pop_front().expect("non-empty");
            if self.tail.len() > self.slots.len() {
                self.tail.pop_front();
                self.tail_bytes -= u64::from(slot.len_bytes);
            }
            self.first_index += 1;
        }
        if self.slots.is_empty() {
            self.first_index = through_index + 1;
        }
        assert!(self.first_index > through_index);
        self.assert_tail_aligned();
    }

    /// Drops the oldest tail entries beyond the budget, if they are written.
    pub(crate) fn evict_tail(&mut self) {
        while self.tail_bytes > self.tail_bytes_max && !self.tail.is_empty() {
            let position = self.slots.len() - self.tail.len();
            let slot = &self.slots[position];
            if slot.location.is_none() {
                break;
            }
            self.tail_bytes -= u64::from(slot.len_bytes);
            self.tail.pop_front();
        }
    }

    fn send(&mut self, op: Op) -> Result<(), LogError> {
        let ops = self.ops.as_ref().ok_or(LogError::WriterStopped)?;
        ops.send(op).map_err(|_| LogError::WriterStopped)
    }
}

/// One operation for the I/O thread.
pub(crate) enum Op {
    /// Write `frames` (entry frames for `first_index..`, lengths in `frame_lens`), after a
    /// truncate frame at `first_index` when `truncate_first`; call `on_durable` once durable.
    Append {
        seq: u64,
        first_index: u64,
        truncate_first: bool,
        frames: Vec<u8>,
        frame_lens: Vec<u32>,
        on_durable: DurableCallback,
    },
    /// Remove every entry `>= from_index`; reply once durable.
    Truncate { from_index: u64, done: Reply },
    /// Record the purge point durably, then delete the segments below it; reply then.
    Purge {
        through_index: u64,
        sealed_purged: Vec<u8>,
        done: Reply,
    },
    /// Store the vote durably; reply then.
    Vote { sealed_vote: Vec<u8>, done: Reply },
}

/// What the I/O thread shares with callers.
/// (the last purged log id, the last log id).
pub(crate) type LogBounds<C> = (
    Option<LogId<<C as RaftTypeConfig>::NodeId>>,
    Option<LogId<<C as RaftTypeConfig>::NodeId>>,
);

pub(crate) struct Shared<C: RaftTypeConfig> {
    pub(crate) state: Mutex<State<C>>,
    /// Set by the I/O thread after a failed write or sync; callers check it before they change
    /// the view.
    pub(crate) poison: Poison,
    pub(crate) counters: Arc<Counters>,
    pub(crate) check_crc: bool,
}

/// The WAL engine behind a [`crate::LogStore`].
pub(crate) struct Wal<C: RaftTypeConfig> {
    shared: Arc<Shared<C>>,
    io_thread: Option<JoinHandle<()>>,
}

impl<C: RaftTypeConfig> Drop for Wal<C> {
    fn drop(&mut self) {
        // Closing the queue stops the I/O thread after its current group.
        drop(self.shared.state.lock().ops.take());
        // A flush callback that drops the last handle runs on the I/O thread itself.
        if std::thread::current().name() == Some(IO_THREAD_NAME) {
            return;
        }
        if let Some(thread) = self.io_thread.take() {
            if thread.join().is_err() {
                tracing::error!("raft-log WAL thread panicked");
            }
        }
    }
}

impl<C> Wal<C>
where
    C: RaftTypeConfig,
    C::Entry: Serialize + DeserializeOwned + Clone,
{
    /// Recovers the WAL in `dir` (locked by the caller) and starts its I/O thread.
    pub(crate) fn open(dir: &Path, options: &LogOptions) -> Result<Wal<C>, LogError> {
        if options.segment_size_bytes < crate::options::SEGMENT_SIZE_BYTES_MIN {
            return Err(LogError::InvalidOption {
                option: "segment_size_bytes",
                reason: format!(
                    "{} is below the minimum of {} bytes",
                    options.segment_size_bytes,
                    crate::options::SEGMENT_SIZE_BYTES_MIN
                ),
            });
        }
        let counters = Arc::new(Counters::default());
        let (ops, receiver) = mpsc::channel();
        let (shared, io_thread) = recovery::recover::<C>(dir, options, ops, counters)?;
        let io_thread = std::thread::Builder::new()
            .name(IO_THREAD_NAME.to_string())
            .spawn(move || io_thread.run(receiver))
            .map_err(|e| LogError::io("spawn the raft-log WAL thread", e))?;
        Ok(Wal {
            shared,
            io_thread: Some(io_thread),
        })
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// The failure that poisoned the store, if any.
    pub(crate) fn poisoned(&self) -> Option<Arc<LogError>> {
        self.shared.poison.failure()
    }

    /// Makes `entries` readable at once and queues them for the I/O thread, which calls
    /// `on_durable` once they are durable. No disk work here.
    pub(crate) fn append(
        &self,
        entries: Vec<C::Entry>,
        on_durable: DurableCallback,
    ) -> Result<(), LogError> {
        // Encode outside the lock: one buffer of ready frames for the whole append.
        let mut frames = Vec::new();
        let mut frame_lens = Vec::with_capacity(entries.len());
        let mut previous: Option<u64> = None;
        for entry in &entries {
            let index = entry.get_log_id().index;
            if let Some(previous) = previous {
                if index != previous + 1 {
                    return Err(LogError::NonContiguousAppend {
                        expected_index: previous + 1,
                        got_index: index,
                    });
                }
            }
            previous = Some(index);
            let start = format::begin_frame(&mut frames, FrameKind::Entry, index);
            codec::encode_into(entry, &mut frames).map_err(|source| LogError::Encode {
                what: format!("log entry {index}"),
                source,
            })?;
            let len = format::finish_frame(&mut frames, start).ok_or_else(|| {
                LogError::InvalidOption {
                    option: "entry size",
                    reason: format!(
                        "log entry {index} is larger than {} bytes",
                        format::PAYLOAD_LEN_MAX_BYTES
                    ),
                }
            })?;
            frame_lens.push(len as u32);
        }
        let mut entries = entries;
        let mut state = self.shared.state.lock();
        self.shared.poison.check()?;
        // Entries at or below the purge point are covered by the snapshot: not stored.
        if let Some(purged) = state.purged.as_ref().map(|id| id.index) {
            let skip = entries
                .iter()
                .take_while(|entry| entry.get_log_id().index <= purged)
                .count();
            if skip > 0 {
                let skip_bytes: usize = frame_lens[..skip].iter().map(|len| *len as usize).sum();
                frames.drain(..skip_bytes);
                frame_lens.drain(..skip);
                entries.drain(..skip);
            }
        }
        let first_index = entries.first().map(|entry| entry.get_log_id().index);
        let mut truncate_first = false;
        if let Some(first_index) = first_index {
            let expected_index = state
                .last_index()
                .or(state.purged.as_ref().map(|id| id.index))
                .map(|index| index + 1);
            if let Some(expected_index) = expected_index {
                if first_index > expected_index {
                    return Err(LogError::NonContiguousAppend {
                        expected_index,
                        got_index: first_index,
                    });
                }
            }
            if state.last_index().is_some_and(|last| first_index <= last) {
                // Overlap: the new entries replace the tail from their first index.
                state.truncate_from(first_index);
                truncate_first = true;
            }
            if state.slots.is_empty() {
                state.first_index = first_index;
            }
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        for (entry, len) in entries.into_iter().zip(&frame_lens) {
            state.slots.push_back(Slot {
                log_id: entry.get_log_id().clone(),
                seq,
                len_bytes: *len,
                location: None,
            });
            state.tail.push_back(entry);
            state.tail_bytes += u64::from(*len);
        }
        state.assert_tail_aligned();
        assert_eq!(
            state
                .last_index()
                .map(|last| last + 1 - frame_lens.len() as u64),
            first_index.or(state.last_index().map(|last| last + 1)),
            "appended entries end the log"
        );
        self.shared.counters.appends.fetch_add(1, Ordering::Relaxed);
        self.shared
            .counters
            .entries_appended
            .fetch_add(frame_lens.len() as u64, Ordering::Relaxed);
        state.send(Op::Append {
            seq,
            first_index: first_index.unwrap_or(0),
            truncate_first,
            frames,
            frame_lens,
            on_durable,
        })
    }

    /// Reads the entries with index in `[start, end)` (`end = None`: to the last), stopped
    /// before the entry that would take the encoded sizes read past `bytes_max` (the first
    /// entry is always read; `u64::MAX`: no bound): recent ones from the tail, older ones from
    /// their segments on the blocking pool.
    pub(crate) async fn read(
        &self,
        start: u64,
        end: Option<u64>,
        bytes_max: u64,
    ) -> Result<Vec<C::Entry>, LogError> {
        let mut from_disk = Vec::new();
        let mut from_memory = Vec::new();
        {
            let state = self.shared.state.lock();
            let Some(last) = state.last_index() else {
                return Ok(Vec::new());
            };
            let low = start.max(state.first_index);
            let high = end.unwrap_or(u64::MAX).min(last + 1);
            if low >= high {
                return Ok(Vec::new());
            }
            let mut budget = ReadBudget::new(bytes_max);
            let high = if budget.is_unbounded() {
                high
            } else {
                (low..high)
                    .find(|&index| {
                        let slot = &state.slots[(index - state.first_index) as usize];
                        !budget.take(u64::from(slot.len_bytes))
                    })
                    .unwrap_or(high)
            };
            let tail_first = state.tail_first_index();
            for index in low..high.min(tail_first) {
                let slot = &state.slots[(index - state.first_index) as usize];
                let location = slot
                    .location
                    .expect("an entry evicted from the tail has been written");
                let segment = state
                    .segments
                    .get(&location.segment_id)
                    .expect("a live entry's segment is open");
                from_disk.push(DiskRead {
                    index,
                    segment: Arc::clone(segment),
                    offset: location.offset,
                    len_bytes: slot.len_bytes,
                });
            }
            for index in low.max(tail_first)..high {
                let entry = &state.tail[(index - tail_first) as usize];
                // Paired with `assert_tail_aligned`: what the tail serves is what was asked.
                assert_eq!(
                    entry.get_log_id().index,
                    index,
                    "the in-memory tail serves the entry asked for"
                );
                from_memory.push(entry.clone());
            }
        }
        if from_disk.is_empty() {
            return Ok(from_memory);
        }
        self.shared
            .counters
            .entries_read_from_disk
            .fetch_add(from_disk.len() as u64, Ordering::Relaxed);
        let check_crc = self.shared.check_crc;
        let mut entries =
            crate::store::run_blocking(move || read_frames::<C>(&from_disk, check_crc)).await?;
        entries.extend(from_memory);
        Ok(entries)
    }

    /// The last purged log id and the last log id (the purged one when the log is empty).
    pub(crate) fn log_state(&self) -> LogBounds<C> {
        let state = self.shared.state.lock();
        let last = state
            .slots
            .back()
            .map(|slot| slot.log_id.clone())
            .or(state.purged.clone());
        (state.purged.clone(), last)
    }

    pub(crate) fn vote(&self) -> Option<Vote<C::NodeId>> {
        self.shared.state.lock().vote.clone()
    }

    pub(crate) fn committed(&self) -> Option<LogId<C::NodeId>> {
        self.shared.state.lock().committed.clone()
    }

    /// Stores the vote; durable when this returns.
    pub(crate) async fn store_vote(&self, vote: &Vote<C::NodeId>) -> Result<(), LogError> {
        let sealed_vote = crate::store::seal_meta(META_VOTE, vote)?;
        let (done, reply) = oneshot::channel();
        {
            let mut state = self.shared.state.lock();
            self.shared.poison.check()?;
            state.vote = Some(vote.clone());
            state.send(Op::Vote { sealed_vote, done })?;
        }
        reply.await.map_err(|_| LogError::WriterStopped)?
    }

    /// Records the committed log id in memory; it is written to the metadata with its next
    /// durable update (a vote, a purge, a new segment, or closing the store), never ahead of
    /// the entries it covers.
    pub(crate) fn store_committed(
        &self,
        committed: Option<LogId<C::NodeId>>,
    ) -> Result<(), LogError> {
        let mut state = self.shared.state.lock();
        self.shared.poison.check()?;
        state.committed = committed;
        Ok(())
    }

    /// Removes every entry `>= from_index`; durable when this returns.
    pub(crate) async fn truncate_from(&self, from_index: u64) -> Result<(), LogError> {
        let (done, reply) = oneshot::channel();
        {
            let mut state = self.shared.state.lock();
            self.shared.poison.check()?;
            if state.last_index().is_none_or(|last| from_index > last) {
                return Ok(());
            }
            state.truncate_from(from_index);
            state.send(Op::Truncate { from_index, done })?;
        }
        reply.await.map_err(|_| LogError::WriterStopped)?
    }

    /// Records `log_id` as purged (durably), then deletes the segments wholly below it.
    pub(crate) async fn purge_through(&self, log_id: &LogId<C::NodeId>) -> Result<(), LogError> {
        let sealed_purged = crate::store::seal_meta(META_PURGED, log_id)?;
        let through_index = log_id.index;
        let (done, reply) = oneshot::channel();
        {
            let mut state = self.shared.state.lock();
            self.shared.poison.check()?;
            if state
                .purged
                .as_ref()
                .is_some_and(|purged| purged.index >= through_index)
            {
                // Already purged at least this far: openraft never moves the purge point back.
                return Ok(());
            }
            state.purged = Some(log_id.clone());
            state.purge_through(through_index);
            state.send(Op::Purge {
                through_index,
                sealed_purged,
                done,
            })?;
        }
        reply.await.map_err(|_| LogError::WriterStopped)?
    }
}

/// One frame to read back from a segment.
pub(crate) struct DiskRead {
    pub(crate) index: u64,
    pub(crate) segment: Arc<SegmentFile>,
    pub(crate) offset: u64,
    pub(crate) len_bytes: u32,
}

/// Reads and verifies entry frames (contiguous runs in one `pread` each). Blocking.
pub(crate) fn read_frames<C>(reads: &[DiskRead], check_crc: bool) -> Result<Vec<C::Entry>, LogError>
where
    C: RaftTypeConfig,
    C::Entry: DeserializeOwned,
{
    let mut entries = Vec::with_capacity(reads.len());
    let mut run_start = 0;
    let mut buffer = Vec::new();
    while run_start < reads.len() {
        let first = &reads[run_start];
        let mut run_end = run_start + 1;
        let mut run_len = u64::from(first.len_bytes);
        while run_end < reads.len() {
            let next = &reads[run_end];
            if !Arc::ptr_eq(&next.segment, &first.segment) || next.offset != first.offset + run_len
            {
                break;
            }
            run_len += u64::from(next.len_bytes);
            run_end += 1;
        }
        buffer.resize(run_len as usize, 0);
        first
            .segment
            .file
            .read_exact_at(&mut buffer, first.offset)
            .map_err(|e| {
                LogError::io(
                    format!(
                        "read entry {} from segment {}",
                        first.index, first.segment.name
                    ),
                    e,
                )
            })?;
        let mut position = 0usize;
        for read in &reads[run_start..run_end] {
            let frame = &buffer[position..position + read.len_bytes as usize];
            entries.push(
                decode_entry_frame::<C>(frame, read.index, check_crc).map_err(|reason| {
                    LogError::CorruptSegment {
                        segment: read.segment.path.clone(),
                        index: read.index,
                        offset_bytes: read.offset,
                        reason,
                    }
                })?,
            );
            position += read.len_bytes as usize;
        }
        run_start = run_end;
    }
    Ok(entries)
}

/// Verifies one entry frame (checksum, kind, index) and decodes its entry, whose own log id
/// must carry the same index. Never panics on bad bytes.
pub(crate) fn decode_entry_frame<C>(
    frame: &[u8],
    index: u64,
    check_crc: bool,
) -> Result<C::Entry, String>
where
    C: RaftTypeConfig,
    C::Entry: DeserializeOwned,
{
    match format::parse_frame(frame, 0, check_crc) {
        Parsed::Frame {
            kind: FrameKind::Entry,
            index: frame_index,
            payload,
            ..
        } => {
            if frame_index != index {
                return Err(format!(
                    "the frame carries index {frame_index}, expected {index}"
                ));
            }
            let entry: C::Entry = codec::decode(payload)?;
            let own_index = entry.get_log_id().index;
            if own_index != index {
                return Err(format!(
                    "the entry in frame {index} carries log id index {own_index}"
                ));
            }
            Ok(entry)
        }
        Parsed::Frame { kind, .. } => {
            Err(format!("expected an entry frame, found a {kind:?} frame"))
        }
        Parsed::End => Err("the frame is all zeros".to_string()),
        Parsed::Bad { reason } => Err(reason),
    }
}
