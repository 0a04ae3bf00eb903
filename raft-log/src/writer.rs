//! The two threads that mutate the engine.
//!
//! - `raft-log-writer` applies requests in the order they were sent (one engine batch per
//!   append) and replies "applied" at once, so entries are readable when `append` returns;
//!   everything that waits for durability is handed to the syncer as a job.
//! - `raft-log-syncer` blocks for one job, drains every job already queued, makes **one**
//!   durability point (`flush` + fsync) for all of them and then releases them in order (group
//!   commit). Because the writer keeps applying while the syncer is inside an fsync, appends
//!   issued one after the other (as openraft does) still share fsyncs.
//!
//! A job is queued only after its writes were applied, and a sync covers every write applied
//! before it starts, so releasing a job after the sync that dequeued it is safe.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::engine::LogEngine;
use crate::poison::Poison;
use crate::watermark::Watermark;
use crate::LogError;

/// Called once the entries of an append are durable (`Ok`) or can no longer become durable
/// (`Err`). Runs on the syncer thread: it must not block.
pub type DurableCallback = Box<dyn FnOnce(Result<(), std::io::Error>) + Send + 'static>;

/// A reply slot for a request.
pub(crate) type Reply = oneshot::Sender<Result<(), LogError>>;

/// At most this many queued jobs share one durability point, to bound the latency of the
/// first one.
const GROUP_JOBS_MAX: usize = 4096;

/// Metadata key of the vote.
pub(crate) const META_VOTE: &str = "vote";
/// Metadata key of the last purged log id.
pub(crate) const META_PURGED: &str = "purged";
/// Metadata key of the committed log id.
pub(crate) const META_COMMITTED: &str = "committed";

/// One mutation, sent to the writer thread.
pub(crate) enum Request {
    /// Store `entries` (contiguous, sealed); reply on `applied` once they are readable, call
    /// `on_durable` once they are durable.
    Append {
        entries: Vec<(u64, Vec<u8>)>,
        applied: Reply,
        on_durable: DurableCallback,
    },
    /// Delete every entry with index `>= from_index`; reply once durable.
    Truncate { from_index: u64, done: Reply },
    /// Persist and sync the purge point, then delete every entry with index `<= through_index`.
    Purge {
        through_index: u64,
        sealed_purged: Vec<u8>,
        done: Reply,
    },
    /// Store one metadata value; reply once durable if `durable`, else once applied.
    PutMeta {
        key: &'static str,
        sealed: Vec<u8>,
        durable: bool,
        done: Reply,
    },
}

/// Someone waiting for the next durability point: the sled syncer's, or the WAL I/O thread's
/// group (which has no barrier).
pub(crate) enum Waiter {
    Callback(DurableCallback),
    Reply(Reply),
    /// The writer thread itself, waiting inside a purge.
    Barrier(mpsc::Sender<Result<(), String>>),
}

impl Waiter {
    /// Tells the waiter how its durability point went (`Err`: the reason it failed).
    pub(crate) fn release(self, result: &Result<(), String>) {
        match (self, result) {
            (Waiter::Callback(callback), Ok(())) => callback(Ok(())),
            (Waiter::Callback(callback), Err(reason)) => {
                callback(Err(std::io::Error::other(reason.clone())))
            }
            (Waiter::Reply(reply), Ok(())) => {
                let _ = reply.send(Ok(()));
            }
            (Waiter::Reply(reply), Err(reason)) => {
                let _ = reply.send(Err(Poison::refusal(reason.clone())));
            }
            (Waiter::Barrier(barrier), result) => {
                let _ = barrier.send(result.clone());
            }
        }
    }
}

/// A job for the syncer: a waiter, plus the last log index applied when it was queued (what
/// the watermark may claim once the job's sync is done) and the truncation epoch it belongs to.
struct Job {
    waiter: Waiter,
    watermark_candidate: Option<u64>,
    truncation_epoch: u64,
}

/// The watermark and the number of truncations so far: a candidate from before a truncation
/// must never raise the watermark again.
struct WatermarkState {
    file: Watermark,
    truncation_epoch: u64,
}

/// Counters of what the store did, readable through [`crate::LogStore::stats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) appends: AtomicU64,
    pub(crate) entries_appended: AtomicU64,
    pub(crate) durability_points: AtomicU64,
    pub(crate) entries_read_from_disk: AtomicU64,
}

/// A snapshot of the store's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Append requests applied (each one engine batch).
    pub appends: u64,
    /// Entries stored by those appends.
    pub entries_appended: u64,
    /// Successful durability points (WAL: `fdatasync` of a batch; sled: flush + fsync); fewer
    /// than `appends` when group commit shared them.
    pub durability_points: u64,
    /// Entries read back from disk (not from the WAL's in-memory tail) by reads.
    pub entries_read_from_disk: u64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> LogStats {
        LogStats {
            appends: self.appends.load(Ordering::Relaxed),
            entries_appended: self.entries_appended.load(Ordering::Relaxed),
            durability_points: self.durability_points.load(Ordering::Relaxed),
            entries_read_from_disk: self.entries_read_from_disk.load(Ordering::Relaxed),
        }
    }
}

/// State shared by the writer and the syncer.
struct Shared {
    engine: Arc<dyn LogEngine>,
    counters: Arc<Counters>,
    /// Set after a failed write or sync: the on-disk state is unknown. Shared with the
    /// [`crate::LogStore`], which reports it.
    poison: Arc<Poison>,
    watermark: Mutex<WatermarkState>,
}

/// State owned by the writer thread.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    jobs: mpsc::Sender<Job>,
    syncer: Option<JoinHandle<()>>,
    /// Index of the last stored entry.
    last_index: Option<u64>,
    /// Index of the last purged entry.
    purged_index: Option<u64>,
}

impl Writer {
    /// Prepares the writer and starts the syncer thread.
    pub(crate) fn new(
        engine: Arc<dyn LogEngine>,
        last_index: Option<u64>,
        purged_index: Option<u64>,
        watermark: Watermark,
        counters: Arc<Counters>,
        poison: Arc<Poison>,
    ) -> Result<Writer, LogError> {
        if let (Some(last), Some(purged)) = (last_index, purged_index) {
            assert!(
                purged < last,
                "purged index {purged} must be below the last index {last}"
            );
        }
        let shared = Arc::new(Shared {
            engine,
            counters,
            poison,
            watermark: Mutex::new(WatermarkState {
                file: watermark,
                truncation_epoch: 0,
            }),
        });
        let (jobs, job_receiver) = mpsc::channel();
        let syncer_shared = Arc::clone(&shared);
        let syncer = std::thread::Builder::new()
            .name("raft-log-syncer".to_string())
            .spawn(move || run_syncer(syncer_shared, job_receiver))
            .map_err(|e| LogError::io("spawn raft-log syncer thread", e))?;
        Ok(Writer {
            shared,
            jobs,
            syncer: Some(syncer),
            last_index,
            purged_index,
        })
    }

    /// Runs until every sender is dropped, then stops the syncer after its last group.
    pub(crate) fn run(mut self, requests: mpsc::Receiver<Request>) {
        while let Ok(request) = requests.recv() {
            self.handle(request);
        }
        tracing::debug!("raft-log writer thread stops: every handle is dropped");
        let Writer { jobs, syncer, .. } = self;
        drop(jobs);
        if let Some(syncer) = syncer {
            if syncer.join().is_err() {
                tracing::error!("raft-log syncer thread panicked");
            }
        }
    }

    /// Hands `waiter` to the syncer, tagged with what is applied now.
    fn enqueue(&self, waiter: Waiter) {
        let truncation_epoch = self.shared.watermark.lock().truncation_epoch;
        let job = Job {
            waiter,
            watermark_candidate: self.last_index.or(self.purged_index),
            truncation_epoch,
        };
        if let Err(mpsc::SendError(job)) = self.jobs.send(job) {
            // The syncer is gone (it panicked): nothing can become durable any more.
            job.waiter
                .release(&Err("raft-log syncer thread has stopped".to_string()));
        }
    }

    /// Waits for a durability point covering everything applied so far.
    fn wait_durable(&self) -> Result<(), LogError> {
        let (barrier, done) = mpsc::channel();
        self.enqueue(Waiter::Barrier(barrier));
        match done.recv() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(reason)) => Err(Poison::refusal(reason)),
            Err(_) => Err(LogError::WriterStopped),
        }
    }

    /// Poisons the store with `error` and sends it to `reply`.
    fn fail(&self, error: LogError, reply: Reply) {
        let reason = self.shared.poison.poison(error);
        let _ = reply.send(Err(Poison::refusal(reason)));
    }

    fn handle(&mut self, request: Request) {
        if let Some(reason) = self.shared.poison.reason() {
            let error = || Poison::refusal(reason.clone());
            match request {
                Request::Append { applied, .. } => {
                    let _ = applied.send(Err(error()));
                }
                Request::Truncate { done, .. }
                | Request::Purge { done, .. }
                | Request::PutMeta { done, .. } => {
                    let _ = done.send(Err(error()));
                }
            }
            return;
        }
        match request {
            Request::Append {
                mut entries,
                applied,
                on_durable,
            } => {
                // Entries at or below the purge point are covered by the snapshot: not stored.
                if let Some(purged) = self.purged_index {
                    entries.retain(|(index, _)| *index > purged);
                }
                if let Some(&(first_index, _)) = entries.first() {
                    let expected_index = self.last_index.or(self.purged_index).map(|i| i + 1);
                    if let Some(expected_index) = expected_index {
                        if first_index > expected_index {
                            // A hole: refused before anything is written.
                            let _ = applied.send(Err(LogError::NonContiguousAppend {
                                expected_index,
                                got_index: first_index,
                            }));
                            return;
                        }
                    }
                    for pair in entries.windows(2) {
                        assert_eq!(pair[0].0 + 1, pair[1].0, "append batch must be contiguous");
                    }
                    let stored = if self.last_index.is_some_and(|last| first_index <= last) {
                        // Overlap: the new entries replace the tail from their first index, in
                        // one engine write. As two (a deletion, then the insert) a sync between
                        // them followed by a crash left the log shorter than both the old tail
                        // and the new entries, losing acknowledged ones.
                        self.lower_watermark_before_truncating(first_index)
                            .and_then(|()| self.shared.engine.replace_entries_from(&entries))
                    } else {
                        self.shared.engine.put_entries(&entries)
                    };
                    if let Err(error) = stored {
                        self.fail(error, applied);
                        return;
                    }
                    let last_index = entries.last().map(|(index, _)| *index);
                    assert!(last_index >= Some(first_index));
                    assert!(self.purged_index.is_none_or(|purged| purged < first_index));
                    self.last_index = last_index;
                    let counters = &self.shared.counters;
                    counters.appends.fetch_add(1, Ordering::Relaxed);
                    counters
                        .entries_appended
                        .fetch_add(entries.len() as u64, Ordering::Relaxed);
                }
                let _ = applied.send(Ok(()));
                self.enqueue(Waiter::Callback(on_durable));
            }
            Request::Truncate { from_index, done } => match self.truncate_from(from_index) {
                Ok(()) => self.enqueue(Waiter::Reply(done)),
                Err(error) => self.fail(error, done),
            },
            Request::Purge {
                through_index,
                sealed_purged,
                done,
            } => {
                if self
                    .purged_index
                    .is_some_and(|purged| purged >= through_index)
                {
                    // Already purged at least this far: openraft never moves the purge point back.
                    let _ = done.send(Ok(()));
                    return;
                }
                // 1. The purge point, durable (with everything before it) before any deletion.
                if let Err(error) = self.shared.engine.put_meta(META_PURGED, &sealed_purged) {
                    self.fail(error, done);
                    return;
                }
                if let Err(error) = self.wait_durable() {
                    let _ = done.send(Err(error));
                    return;
                }
                self.purged_index = Some(through_index);
                // 2. Then the entries; their deletion becomes durable with the next sync.
                if let Err(error) = self.shared.engine.delete_entries_through(through_index) {
                    self.fail(error, done);
                    return;
                }
                match self.refresh_last_index() {
                    Ok(()) => {
                        assert!(self.last_index.is_none_or(|last| last > through_index));
                        let _ = done.send(Ok(()));
                    }
                    Err(error) => self.fail(error, done),
                }
            }
            Request::PutMeta {
                key,
                sealed,
                durable,
                done,
            } => {
                if let Err(error) = self.shared.engine.put_meta(key, &sealed) {
                    self.fail(error, done);
                    return;
                }
                if durable {
                    self.enqueue(Waiter::Reply(done));
                } else {
                    let _ = done.send(Ok(()));
                }
            }
        }
    }

    /// Lowers the watermark durably below `from_index`, before entries from there are deleted
    /// (by a truncation, or by an append that replaces them), and starts a truncation epoch.
    fn lower_watermark_before_truncating(&self, from_index: u64) -> Result<(), LogError> {
        let mut watermark = self.shared.watermark.lock();
        watermark.file.lower_durably(from_index.checked_sub(1))?;
        watermark.truncation_epoch += 1;
        Ok(())
    }

    /// Deletes every entry `>= from_index`, lowering the watermark durably first.
    fn truncate_from(&mut self, from_index: u64) -> Result<(), LogError> {
        self.lower_watermark_before_truncating(from_index)?;
        self.shared.engine.delete_entries_from(from_index)?;
        self.refresh_last_index()?;
        assert!(self.last_index.is_none_or(|last| last < from_index));
        Ok(())
    }

    fn refresh_last_index(&mut self) -> Result<(), LogError> {
        let last = self.shared.engine.last_entry()?;
        self.last_index = last.map(|(index, _)| index);
        Ok(())
    }
}

/// The syncer thread: one durability point per group of queued jobs.
fn run_syncer(shared: Arc<Shared>, jobs: mpsc::Receiver<Job>) {
    while let Ok(first) = jobs.recv() {
        let mut group = vec![first];
        while group.len() < GROUP_JOBS_MAX {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        let result = match shared.poison.reason() {
            Some(reason) => Err(reason),
            None => match shared.engine.sync() {
                Ok(()) => {
                    shared
                        .counters
                        .durability_points
                        .fetch_add(1, Ordering::Relaxed);
                    advance_watermark(&shared, &group);
                    Ok(())
                }
                Err(error) => Err(shared.poison.poison(error)),
            },
        };
        for job in group {
            job.waiter.release(&result);
        }
    }
    tracing::debug!("raft-log syncer thread stops");
}

/// After a durability point, never before: the watermark must not claim more than is durable,
/// and a candidate queued before a truncation must not raise it again.
fn advance_watermark(shared: &Shared, group: &[Job]) {
    let mut watermark = shared.watermark.lock();
    let epoch = watermark.truncation_epoch;
    let candidate = group
        .iter()
        .rev()
        .find(|job| job.truncation_epoch == epoch)
        .map(|job| job.watermark_candidate);
    if let Some(candidate) = candidate {
        if let Err(error) = watermark.file.advance(candidate) {
            tracing::warn!(%error, "cannot advance the raft log watermark");
        }
    }
}
