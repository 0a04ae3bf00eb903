//! [`LogStore`]: the openraft-facing handle.

use std::fmt::Debug;
use std::ops::Bound;
use std::ops::RangeBounds;
use std::path::Path;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use openraft::storage::LogFlushed;
use openraft::storage::LogState;
use openraft::storage::RaftLogStorage;
use openraft::AnyError;
use openraft::LogId;
use openraft::OptionalSend;
use openraft::RaftLogId;
use openraft::RaftLogReader;
use openraft::RaftTypeConfig;
use openraft::StorageError;
use openraft::StorageIOError;
use openraft::Vote;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::oneshot;

use crate::codec;
use crate::engine::LogEngine;
use crate::engine::SledEngine;
use crate::poison::Poison;
use crate::wal::Wal;
use crate::watermark::Watermark;
use crate::writer::Counters;
use crate::writer::LogStats;
use crate::writer::Request;
use crate::writer::Writer;
use crate::writer::META_COMMITTED;
use crate::writer::META_PURGED;
use crate::writer::META_VOTE;
use crate::DirLock;
use crate::DurableCallback;
use crate::LogEngineKind;
use crate::LogError;
use crate::LogOptions;

/// Name of the sled directory inside a log store's directory (sled engine).
pub const SLED_SUBDIR: &str = crate::marker::SLED_SUBDIR;

/// How many entries the open-time verification reads at a time.
const VERIFY_CHUNK_ENTRIES: u64 = 4096;

/// A durable Raft log for the type config `C`: a cheap `Clone` handle implementing openraft's
/// `RaftLogReader` and `RaftLogStorage`. See the crate documentation for the concurrency model.
pub struct LogStore<C: RaftTypeConfig> {
    inner: Arc<Inner<C>>,
}

impl<C: RaftTypeConfig> Clone for LogStore<C> {
    fn clone(&self) -> Self {
        LogStore {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C: RaftTypeConfig> Debug for LogStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("dir", &self.inner.dir)
            .field("engine", &self.inner.engine_kind())
            .finish()
    }
}

struct Inner<C: RaftTypeConfig> {
    /// Dropped first: stops the engine's threads.
    backend: Backend<C>,
    dir: PathBuf,
    /// The first error returned to openraft (which stops its core on any storage error).
    returned: parking_lot::Mutex<Option<Arc<LogError>>>,
    /// [`LogOptions::read_bytes_max`].
    read_bytes_max: u64,
    /// Released last, after the threads have stopped.
    _lock: DirLock,
}

impl<C: RaftTypeConfig> Inner<C> {
    fn engine_kind(&self) -> LogEngineKind {
        match self.backend {
            Backend::Sled(_) => LogEngineKind::Sled,
            Backend::Wal(_) => LogEngineKind::Wal,
        }
    }
}

enum Backend<C: RaftTypeConfig> {
    Sled(SledBackend),
    Wal(Wal<C>),
}

/// A [`LogEngine`] driven by the writer and syncer threads (`writer.rs`).
struct SledBackend {
    engine: Arc<dyn LogEngine>,
    counters: Arc<Counters>,
    poison: Arc<Poison>,
    requests: Option<mpsc::Sender<Request>>,
    writer: Option<JoinHandle<()>>,
}

impl Drop for SledBackend {
    fn drop(&mut self) {
        // Closing the channel stops the writer after its current group; wait for it so that the
        // engine is quiet before the directory lock is released.
        drop(self.requests.take());
        // A durability callback that drops the last handle runs on the syncer thread, which
        // the writer joins: joining from there would deadlock, so let the threads finish alone.
        let on_own_thread = matches!(
            std::thread::current().name(),
            Some("raft-log-writer") | Some("raft-log-syncer")
        );
        if on_own_thread {
            return;
        }
        if let Some(writer) = self.writer.take() {
            if writer.join().is_err() {
                tracing::error!("raft-log writer thread panicked");
            }
        }
    }
}

impl SledBackend {
    fn send(&self, request: Request) -> Result<(), LogError> {
        let requests = self.requests.as_ref().ok_or(LogError::WriterStopped)?;
        requests.send(request).map_err(|_| LogError::WriterStopped)
    }

    async fn request(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<(), LogError>>) -> Request,
    ) -> Result<(), LogError> {
        let (done, reply) = oneshot::channel();
        self.send(make(done))?;
        reply.await.map_err(|_| LogError::WriterStopped)?
    }
}

/// What the open-time verification found.
struct Verified {
    last_index: Option<u64>,
    purged_index: Option<u64>,
}

impl<C> LogStore<C>
where
    C: RaftTypeConfig,
    C::Entry: Serialize + DeserializeOwned + Clone,
{
    /// Opens (creating if needed) the log store in `dir` with the engine `options.engine`:
    /// takes the directory lock, checks that the directory was written by that engine (or
    /// records it, for a new directory), recovers and verifies what is stored, and starts the
    /// engine's threads. Blocking: call it at start-up or on a blocking thread. `dir` must be
    /// the store's own directory (e.g. `<data dir>/raft-log`), not a directory that the caller
    /// already holds a [`DirLock`] on: that would be refused as [`LogError::Locked`] naming our
    /// own pid.
    ///
    /// Dropping the last handle stops the threads after their current group.
    pub fn open(dir: &Path, options: LogOptions) -> Result<LogStore<C>, LogError> {
        let lock = DirLock::acquire(dir)?;
        crate::marker::check_or_record(
            dir,
            options.engine,
            !options.unsafe_skip_directory_fsync_for_tests,
        )?;
        match options.engine {
            LogEngineKind::Sled => {
                let engine = SledEngine::open_with(
                    &dir.join(SLED_SUBDIR),
                    !options.unsafe_skip_fsync_for_tests,
                    !options.unsafe_skip_directory_fsync_for_tests,
                    crate::engine::CACHE_CAPACITY_BYTES,
                )?;
                if options.is_unsafe() {
                    tracing::warn!(dir = %dir.display(), ?options, "raft log opened with unsafe test switches: acknowledged entries can be lost");
                }
                let damaged_blob = engine.damaged_blobs().first().cloned();
                Self::open_sled(lock, Arc::new(engine), options.read_bytes_max).map_err(|error| {
                    match damaged_blob {
                        // sled dropped that blob and what followed it: that is why data is missing.
                        Some(blob) if error.is_corruption() => LogError::CorruptBlob {
                            blob,
                            index: error.corrupt_index().unwrap_or(0),
                            reason: error.to_string(),
                        },
                        _ => error,
                    }
                })
            }
            LogEngineKind::Wal => {
                let wal = Wal::open(dir, &options)?;
                Ok(LogStore {
                    inner: Arc::new(Inner {
                        backend: Backend::Wal(wal),
                        dir: lock.dir().to_path_buf(),
                        returned: parking_lot::Mutex::new(None),
                        read_bytes_max: options.read_bytes_max,
                        _lock: lock,
                    }),
                })
            }
        }
    }

    /// Opens a log store on any key-value [`LogEngine`] (the sled engine's seam, also used by
    /// tests that wrap [`SledEngine`]), under an already-held directory lock. The directory is
    /// recorded as written by the sled engine.
    pub fn open_with_engine(
        lock: DirLock,
        engine: Arc<dyn LogEngine>,
    ) -> Result<LogStore<C>, LogError> {
        crate::marker::check_or_record(lock.dir(), LogEngineKind::Sled, true)?;
        Self::open_sled(lock, engine, LogOptions::default().read_bytes_max)
    }

    fn open_sled(
        lock: DirLock,
        engine: Arc<dyn LogEngine>,
        read_bytes_max: u64,
    ) -> Result<LogStore<C>, LogError> {
        let (watermark, watermark_index) = Watermark::open(lock.dir())?;
        finish_interrupted_purge::<C>(engine.as_ref())?;
        let verified = verify::<C>(engine.as_ref(), watermark_index)?;
        let (requests, receiver) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let poison = Arc::new(Poison::default());
        let writer = Writer::new(
            Arc::clone(&engine),
            verified.last_index,
            verified.purged_index,
            watermark,
            Arc::clone(&counters),
            Arc::clone(&poison),
        )?;
        let writer = std::thread::Builder::new()
            .name("raft-log-writer".to_string())
            .spawn(move || writer.run(receiver))
            .map_err(|e| LogError::io("spawn raft-log writer thread", e))?;
        Ok(LogStore {
            inner: Arc::new(Inner {
                backend: Backend::Sled(SledBackend {
                    engine,
                    counters,
                    poison,
                    requests: Some(requests),
                    writer: Some(writer),
                }),
                dir: lock.dir().to_path_buf(),
                returned: parking_lot::Mutex::new(None),
                read_bytes_max,
                _lock: lock,
            }),
        })
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The engine this store runs on.
    pub fn engine(&self) -> LogEngineKind {
        self.inner.engine_kind()
    }

    /// The failure that stopped this store, if any: the write or sync that poisoned it, or
    /// else the first error it returned to openraft (which stops its core on any storage
    /// error). Kept whole, so that the node can tell a full disk from damaged data.
    pub fn failure(&self) -> Option<Arc<LogError>> {
        let poisoned = match &self.inner.backend {
            Backend::Wal(wal) => wal.poisoned(),
            Backend::Sled(sled) => sled.poison.failure(),
        };
        poisoned.or_else(|| self.inner.returned.lock().clone())
    }

    /// Records `error` as returned to openraft (the first one is kept) and converts it.
    fn returned<NID: openraft::NodeId>(
        &self,
        error: LogError,
        convert: impl FnOnce(&LogError) -> StorageError<NID>,
    ) -> StorageError<NID> {
        let converted = convert(&error);
        let mut returned = self.inner.returned.lock();
        if returned.is_none() {
            *returned = Some(Arc::new(error));
        }
        converted
    }

    /// What the store has done since it was opened.
    pub fn stats(&self) -> LogStats {
        match &self.inner.backend {
            Backend::Sled(sled) => sled.counters.snapshot(),
            Backend::Wal(wal) => wal.counters().snapshot(),
        }
    }

    /// Appends `entries` (contiguous; starting at most one past the last stored or purged index:
    /// entries at or below the purge point are dropped, and an append starting at or below the
    /// last index replaces the tail from its first index). Returns once they are readable;
    /// `on_durable` is called once they are durable, on the thread that made them durable
    /// (WAL: the I/O thread right after its `fdatasync`; sled: the syncer thread). At most one
    /// durability point per call, shared with concurrent appends.
    pub async fn append_with_callback(
        &self,
        entries: Vec<C::Entry>,
        on_durable: DurableCallback,
    ) -> Result<(), LogError> {
        let sled = match &self.inner.backend {
            Backend::Wal(wal) => return wal.append(entries, on_durable),
            Backend::Sled(sled) => sled,
        };
        let mut sealed = Vec::with_capacity(entries.len());
        for entry in &entries {
            let index = entry.get_log_id().index;
            if let Some(&(previous, _)) = sealed.last() {
                if index != previous + 1 {
                    return Err(LogError::NonContiguousAppend {
                        expected_index: previous + 1,
                        got_index: index,
                    });
                }
            }
            let payload = codec::encode(entry).map_err(|source| LogError::Encode {
                what: format!("log entry {index}"),
                source,
            })?;
            let stored = codec::seal_entry(index, &payload);
            // Paired with the check on read: what we store must verify under its own key.
            assert!(
                codec::unseal(&codec::entry_key(index), &stored).is_ok(),
                "entry {index} must verify under its own key before it is written"
            );
            sealed.push((index, stored));
        }
        sled.request(|applied| Request::Append {
            entries: sealed,
            applied,
            on_durable,
        })
        .await
    }

    /// Appends `entries` and waits until they are durable.
    pub async fn append_durable(&self, entries: Vec<C::Entry>) -> Result<(), LogError> {
        let (tx, rx) = oneshot::channel();
        self.append_with_callback(
            entries,
            Box::new(move |result| {
                let _ = tx.send(result);
            }),
        )
        .await?;
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(LogError::io("make appended entries durable", e)),
            Err(_) => Err(LogError::WriterStopped),
        }
    }

    /// Reads the entries with index in `range`, verifying each one.
    pub async fn read_entries<RB: RangeBounds<u64>>(
        &self,
        range: RB,
    ) -> Result<Vec<C::Entry>, LogError> {
        let start = match range.start_bound() {
            Bound::Included(&start) => start,
            Bound::Excluded(&start) => match start.checked_add(1) {
                Some(start) => start,
                None => return Ok(Vec::new()),
            },
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&end) => end.checked_add(1),
            Bound::Excluded(&end) => Some(end),
            Bound::Unbounded => None,
        };
        if end.is_some_and(|end| end <= start) {
            return Ok(Vec::new());
        }
        self.read_run(start, end, u64::MAX).await
    }

    /// The entries of `[start, end)` from `start` on, while their encoded sizes add up to at
    /// most `bytes_max`, and always the first one whatever its size (so that an entry larger
    /// than the bound is still read). Empty only when the range or the log holds nothing there.
    pub async fn read_entries_bounded(
        &self,
        start: u64,
        end: u64,
        bytes_max: u64,
    ) -> Result<Vec<C::Entry>, LogError> {
        if end <= start {
            return Ok(Vec::new());
        }
        self.read_run(start, Some(end), bytes_max).await
    }

    /// The one read of both engines (`end = None`: to the last; `bytes_max = u64::MAX`: no
    /// bound; see `read_budget.rs`). An entry missing where the read starts, or inside the run
    /// it reads, is [`LogError::Corrupt`]: never an empty result (openraft takes an empty read
    /// for a heartbeat and would retry it for ever). One missing just after the run ends it
    /// there, as a bound would; the next read, which starts at it, fails (and openraft checks
    /// that an unbounded read covers its range).
    async fn read_run(
        &self,
        start: u64,
        end: Option<u64>,
        bytes_max: u64,
    ) -> Result<Vec<C::Entry>, LogError> {
        let (engine, counters) = match &self.inner.backend {
            Backend::Wal(wal) => return wal.read(start, end, bytes_max).await,
            Backend::Sled(sled) => (Arc::clone(&sled.engine), Arc::clone(&sled.counters)),
        };
        run_blocking(move || {
            let raw = engine.read_entries(start, end, bytes_max)?;
            counters
                .entries_read_from_disk
                .fetch_add(raw.len() as u64, std::sync::atomic::Ordering::Relaxed);
            check_run_start::<C>(
                engine.as_ref(),
                start,
                end,
                raw.first().map(|(index, _)| *index),
            )?;
            decode_run::<C>(raw)
        })
        .await
    }

    /// The last purged log id and the last log id (the purged one when the log is empty).
    pub async fn log_state(
        &self,
    ) -> Result<(Option<LogId<C::NodeId>>, Option<LogId<C::NodeId>>), LogError> {
        let engine = match &self.inner.backend {
            Backend::Wal(wal) => return Ok(wal.log_state()),
            Backend::Sled(sled) => Arc::clone(&sled.engine),
        };
        run_blocking(move || {
            let purged: Option<LogId<C::NodeId>> = read_meta(engine.as_ref(), META_PURGED)?;
            let last = match engine.last_entry()? {
                Some((index, stored)) => {
                    Some(decode_entry::<C>(index, &stored)?.get_log_id().clone())
                }
                None => None,
            };
            Ok((purged.clone(), last.or(purged)))
        })
        .await
    }

    /// The stored vote.
    pub async fn vote(&self) -> Result<Option<Vote<C::NodeId>>, LogError> {
        let engine = match &self.inner.backend {
            Backend::Wal(wal) => return Ok(wal.vote()),
            Backend::Sled(sled) => Arc::clone(&sled.engine),
        };
        run_blocking(move || read_meta(engine.as_ref(), META_VOTE)).await
    }

    /// Stores the vote; durable when this returns.
    pub async fn store_vote(&self, vote: &Vote<C::NodeId>) -> Result<(), LogError> {
        let sled = match &self.inner.backend {
            Backend::Wal(wal) => return wal.store_vote(vote).await,
            Backend::Sled(sled) => sled,
        };
        let sealed = seal_meta(META_VOTE, vote)?;
        sled.request(|done| Request::PutMeta {
            key: META_VOTE,
            sealed,
            durable: true,
            done,
        })
        .await
    }

    /// The stored committed log id.
    pub async fn committed(&self) -> Result<Option<LogId<C::NodeId>>, LogError> {
        let engine = match &self.inner.backend {
            Backend::Wal(wal) => return Ok(wal.committed()),
            Backend::Sled(sled) => Arc::clone(&sled.engine),
        };
        run_blocking(move || {
            Ok(read_meta::<Option<LogId<C::NodeId>>>(engine.as_ref(), META_COMMITTED)?.flatten())
        })
        .await
    }

    /// Stores the committed log id; ordered after every earlier append, durable later, never
    /// ahead of the entries it covers (openraft does not need it durable at once). The WAL
    /// writes it with its next metadata update; sled with its next durability point.
    pub async fn store_committed(
        &self,
        committed: Option<LogId<C::NodeId>>,
    ) -> Result<(), LogError> {
        let sled = match &self.inner.backend {
            Backend::Wal(wal) => return wal.store_committed(committed),
            Backend::Sled(sled) => sled,
        };
        let sealed = seal_meta(META_COMMITTED, &committed)?;
        sled.request(|done| Request::PutMeta {
            key: META_COMMITTED,
            sealed,
            durable: false,
            done,
        })
        .await
    }

    /// Deletes every entry with index `>= log_id.index`; durable when this returns.
    pub async fn truncate_from(&self, log_id: &LogId<C::NodeId>) -> Result<(), LogError> {
        let from_index = log_id.index;
        let sled = match &self.inner.backend {
            Backend::Wal(wal) => return wal.truncate_from(from_index).await,
            Backend::Sled(sled) => sled,
        };
        sled.request(|done| Request::Truncate { from_index, done })
            .await
    }

    /// Records `log_id` as purged (durably) and then deletes every entry with index
    /// `<= log_id.index` (WAL: the segments holding only such entries).
    pub async fn purge_through(&self, log_id: &LogId<C::NodeId>) -> Result<(), LogError> {
        let sled = match &self.inner.backend {
            Backend::Wal(wal) => return wal.purge_through(log_id).await,
            Backend::Sled(sled) => sled,
        };
        let sealed_purged = seal_meta(META_PURGED, log_id)?;
        let through_index = log_id.index;
        sled.request(|done| Request::Purge {
            through_index,
            sealed_purged,
            done,
        })
        .await
    }
}

/// Runs blocking engine work off the async executor's threads when a tokio runtime is present.
pub(crate) async fn run_blocking<R, F>(work: F) -> Result<R, LogError>
where
    F: FnOnce() -> Result<R, LogError> + Send + 'static,
    R: Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle
            .spawn_blocking(work)
            .await
            .map_err(|e| LogError::ReadTask {
                reason: e.to_string(),
            })?,
        Err(_) => work(),
    }
}

pub(crate) fn seal_meta<T: Serialize>(key: &'static str, value: &T) -> Result<Vec<u8>, LogError> {
    let payload = codec::encode(value).map_err(|source| LogError::Encode {
        what: format!("metadata `{key}`"),
        source,
    })?;
    Ok(codec::seal_meta(key, &payload))
}

pub(crate) fn read_meta<T: DeserializeOwned>(
    engine: &dyn LogEngine,
    key: &'static str,
) -> Result<Option<T>, LogError> {
    match engine.get_meta(key)? {
        Some(stored) => codec::unseal_meta(key, &stored)
            .map(Some)
            .map_err(|reason| LogError::CorruptMeta { key, reason }),
        None => Ok(None),
    }
}

/// Verifies and decodes the entry stored under `index`.
fn decode_entry<C>(index: u64, stored: &[u8]) -> Result<C::Entry, LogError>
where
    C: RaftTypeConfig,
    C::Entry: DeserializeOwned,
{
    let entry: C::Entry =
        codec::unseal_entry(index, stored).map_err(|reason| LogError::Corrupt { index, reason })?;
    let own_index = entry.get_log_id().index;
    if own_index != index {
        return Err(LogError::Corrupt {
            index,
            reason: format!("entry stored under index {index} carries log id index {own_index}"),
        });
    }
    Ok(entry)
}

/// Verifies and decodes a run of stored entries, which must be contiguous.
fn decode_run<C>(raw: Vec<(u64, Vec<u8>)>) -> Result<Vec<C::Entry>, LogError>
where
    C: RaftTypeConfig,
    C::Entry: DeserializeOwned,
{
    let mut entries = Vec::with_capacity(raw.len());
    let mut previous: Option<u64> = None;
    for (index, stored) in raw {
        if let Some(previous) = previous {
            if index != previous + 1 {
                return Err(LogError::Corrupt {
                    index: previous + 1,
                    reason: format!(
                        "entry is missing: the log jumps from index {previous} to {index}"
                    ),
                });
            }
        }
        entries.push(decode_entry::<C>(index, &stored)?);
        previous = Some(index);
    }
    Ok(entries)
}

/// Checks that a run read from `start` (up to `end`, excluded) begins where the log holds its
/// first entry at or after `start`: the engine skips a missing entry silently, and
/// [`decode_run`] sees only the gaps inside the run. `run_first` is the run's first index.
/// Looks further only when the run does not begin at `start` (a read from below the log's
/// first index, or a missing entry).
fn check_run_start<C: RaftTypeConfig>(
    engine: &dyn LogEngine,
    start: u64,
    end: Option<u64>,
    run_first: Option<u64>,
) -> Result<(), LogError> {
    if run_first == Some(start) {
        return Ok(());
    }
    // The log begins after the purge point, or at its first stored entry if nothing was purged.
    let purged: Option<LogId<C::NodeId>> = read_meta(engine, META_PURGED)?;
    let log_first = match purged {
        Some(purged) => purged.index + 1,
        None => match engine.first_entry()? {
            Some((first, _)) => first,
            None => return Ok(()),
        },
    };
    let Some((log_last, _)) = engine.last_entry()? else {
        return Ok(());
    };
    let expected = start.max(log_first);
    let expected_in_range = expected <= log_last && end.is_none_or(|end| expected < end);
    // A run beginning below `expected` holds entries a purge is about to delete: still intact.
    if !expected_in_range || run_first.is_some_and(|first| first <= expected) {
        return Ok(());
    }
    let reason = match run_first {
        Some(first) => format!(
            "entry is missing: the log holds {log_first}..={log_last}, but a read from index {start} finds {first} first"
        ),
        None => format!(
            "entry is missing: the log holds {log_first}..={log_last}, but a read from index {start} finds nothing"
        ),
    };
    Err(LogError::Corrupt {
        index: expected,
        reason,
    })
}

/// Deletes entries at or below a durable purge point: left over when a crash came between the
/// purge point becoming durable and the deletion becoming durable.
fn finish_interrupted_purge<C: RaftTypeConfig>(engine: &dyn LogEngine) -> Result<(), LogError> {
    let purged: Option<LogId<C::NodeId>> = read_meta(engine, META_PURGED)?;
    let Some(purged) = purged else { return Ok(()) };
    if let Some((first, _)) = engine.first_entry()? {
        if first <= purged.index {
            tracing::info!(
                first,
                purged = purged.index,
                "finishing a purge interrupted by a crash"
            );
            engine.delete_entries_through(purged.index)?;
            engine.sync()?;
        }
    }
    Ok(())
}

/// Reads and checks everything on disk once, at open. `watermark_index` is a lower bound of
/// the last log index that was durable before (see `watermark.rs`).
fn verify<C>(engine: &dyn LogEngine, watermark_index: Option<u64>) -> Result<Verified, LogError>
where
    C: RaftTypeConfig,
    C::Entry: DeserializeOwned,
{
    let _vote: Option<Vote<C::NodeId>> = read_meta(engine, META_VOTE)?;
    let purged: Option<LogId<C::NodeId>> = read_meta(engine, META_PURGED)?;
    let committed: Option<LogId<C::NodeId>> =
        read_meta::<Option<LogId<C::NodeId>>>(engine, META_COMMITTED)?.flatten();
    let purged_index = purged.as_ref().map(|log_id| log_id.index);

    let first_index = engine.first_entry()?.map(|(index, _)| index);
    if let (Some(first), Some(purged)) = (first_index, purged_index) {
        if first <= purged {
            return Err(LogError::Corrupt {
                index: first,
                reason: format!(
                    "entry {first} is still stored although the log is purged through {purged}"
                ),
            });
        }
        if first != purged + 1 {
            return Err(LogError::Corrupt {
                index: purged + 1,
                reason: format!(
                    "entry is missing: the log is purged through {purged} but starts at {first}"
                ),
            });
        }
    }
    let mut last_index = None;
    if let Some(first) = first_index {
        let mut start = first;
        loop {
            let end = start.saturating_add(VERIFY_CHUNK_ENTRIES);
            let raw = engine.read_entries(start, Some(end), u64::MAX)?;
            let Some(&(chunk_first, _)) = raw.first() else {
                break;
            };
            if let Some(previous) = last_index {
                if chunk_first != previous + 1 {
                    return Err(LogError::Corrupt {
                        index: previous + 1,
                        reason: format!("entry is missing: the log jumps from index {previous} to {chunk_first}"),
                    });
                }
            }
            let decoded = decode_run::<C>(raw)?;
            last_index = decoded.last().map(|entry| entry.get_log_id().index);
            if end == u64::MAX {
                break;
            }
            start = end;
        }
        // Anything after the last full chunk that the loop stopped at (a gap of a whole chunk).
        if let (Some(last), Some((stored_last, _))) = (last_index, engine.last_entry()?) {
            if stored_last != last {
                return Err(LogError::Corrupt {
                    index: last + 1,
                    reason: format!("entry is missing: the log jumps from index {last} to a later run ending at {stored_last}"),
                });
            }
        }
    }
    let last_log_index = last_index.or(purged_index);
    if let Some(watermark_index) = watermark_index {
        if last_log_index.is_none_or(|last| last < watermark_index) {
            let first_missing = last_log_index.map(|last| last + 1).unwrap_or(0);
            return Err(LogError::Corrupt {
                index: first_missing,
                reason: format!(
                    "entries {first_missing}..={watermark_index} were durable but are gone: the storage engine dropped them while recovering (its log is damaged)"
                ),
            });
        }
    }
    if let Some(committed) = &committed {
        if last_log_index.is_none_or(|last| committed.index > last) {
            return Err(LogError::Corrupt {
                index: committed.index,
                reason: format!(
                    "committed entry {} is missing: the log ends at {:?}",
                    committed.index, last_log_index
                ),
            });
        }
    }
    Ok(Verified {
        last_index,
        purged_index,
    })
}

fn storage_error<NID: openraft::NodeId>(error: &LogError, write: bool) -> StorageError<NID> {
    let source = AnyError::new(error);
    let io = match (error.corrupt_index(), write) {
        (Some(index), _) => StorageIOError::read_log_at_index(index, source),
        (None, true) => StorageIOError::write_logs(source),
        (None, false) => StorageIOError::read_logs(source),
    };
    StorageError::IO { source: io }
}

fn vote_error<NID: openraft::NodeId>(error: &LogError, write: bool) -> StorageError<NID> {
    let source = AnyError::new(error);
    let io = if write {
        StorageIOError::write_vote(source)
    } else {
        StorageIOError::read_vote(source)
    };
    StorageError::IO { source: io }
}

impl<C> RaftLogReader<C> for LogStore<C>
where
    C: RaftTypeConfig,
    C::Entry: Serialize + DeserializeOwned + Clone,
{
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, StorageError<C::NodeId>> {
        self.read_entries(range)
            .await
            .map_err(|e| self.returned(e, |e| storage_error(e, false)))
    }

    /// openraft reads the entries of one AppendEntries with this: bounded by
    /// [`LogOptions::read_bytes_max`] as well as by openraft's `max_payload_entries`.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<C::Entry>, StorageError<C::NodeId>> {
        self.read_entries_bounded(start, end, self.inner.read_bytes_max)
            .await
            .map_err(|e| self.returned(e, |e| storage_error(e, false)))
    }
}

impl<C> RaftLogStorage<C> for LogStore<C>
where
    C: RaftTypeConfig,
    C::Entry: Serialize + DeserializeOwned + Clone,
{
    type LogReader = LogStore<C>;

    async fn get_log_state(&mut self) -> Result<LogState<C>, StorageError<C::NodeId>> {
        let (last_purged_log_id, last_log_id) = self
            .log_state()
            .await
            .map_err(|e| self.returned(e, |e| storage_error(e, false)))?;
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        self.store_vote(vote)
            .await
            .map_err(|e| self.returned(e, |e| vote_error(e, true)))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<C::NodeId>>, StorageError<C::NodeId>> {
        self.vote()
            .await
            .map_err(|e| self.returned(e, |e| vote_error(e, false)))
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<C::NodeId>>,
    ) -> Result<(), StorageError<C::NodeId>> {
        self.store_committed(committed)
            .await
            .map_err(|e| self.returned(e, |e| storage_error(e, true)))
    }

    async fn read_committed(
        &mut self,
    ) -> Result<Option<LogId<C::NodeId>>, StorageError<C::NodeId>> {
        self.committed()
            .await
            .map_err(|e| self.returned(e, |e| storage_error(e, false)))
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<C>,
    ) -> Result<(), StorageError<C::NodeId>>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<C::Entry> = entries.into_iter().collect();
        self.append_with_callback(
            entries,
            Box::new(move |result| callback.log_io_completed(result)),
        )
        .await
        .map_err(|e| self.returned(e, |e| storage_error(e, true)))
    }

    async fn truncate(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        self.truncate_from(&log_id)
            .await
            .map_err(|e| self.returned(e, |e| storage_error(e, true)))
    }

    async fn purge(&mut self, log_id: LogId<C::NodeId>) -> Result<(), StorageError<C::NodeId>> {
        self.purge_through(&log_id)
            .await
            .map_err(|e| self.returned(e, |e| storage_error(e, true)))
    }
}
