//! The storage-engine seam: a small, byte-oriented, blocking interface that [`crate::LogStore`]
//! drives from its writer thread (writes) and the blocking pool (reads). Checksums, encoding
//! and ordering live above it, so replacing sled (for example by a segmented write-ahead log)
//! means implementing this trait only.

use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Bound;
use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;
use std::time::Instant;
use std::time::SystemTime;

use parking_lot::Mutex;

use crate::codec::entry_key;
use crate::codec::index_of_key;
use crate::read_budget::ReadBudget;
use crate::LogError;

/// A blocking, byte-oriented log engine. Keys are log indexes; values are opaque sealed bytes.
///
/// Implementations must make each method atomic (a crash leaves all of a call's writes or none
/// of them, once [`LogEngine::sync`] has been called after it) and must keep writes ordered: a
/// successful `sync` makes every earlier write durable.
pub trait LogEngine: Send + Sync + 'static {
    /// Stores `entries` (index, sealed bytes) in one atomic batch.
    fn put_entries(&self, entries: &[(u64, Vec<u8>)]) -> Result<(), LogError>;
    /// Deletes every entry with an index at or above the first of `entries` and stores
    /// `entries`, in one atomic batch: after a crash the log holds the old tail or the new
    /// entries, never neither. An append that overlaps the log's tail (a follower's log
    /// overwritten by a new leader) is this one call, not a deletion and then an insert.
    fn replace_entries_from(&self, entries: &[(u64, Vec<u8>)]) -> Result<(), LogError>;
    /// Deletes every entry with index `>= from_index`, atomically.
    fn delete_entries_from(&self, from_index: u64) -> Result<(), LogError>;
    /// Deletes every entry with index `<= through_index`, atomically.
    fn delete_entries_through(&self, through_index: u64) -> Result<(), LogError>;
    /// Reads the entries whose index is in `[start, end)` (`end = None`: to the last), in
    /// index order, stopping before the one that would take the sizes of the values read past
    /// `bytes_max` (the first is always read; `u64::MAX`: no bound). A missing entry is skipped
    /// here, not reported: the store checks the run it gets back.
    fn read_entries(
        &self,
        start: u64,
        end: Option<u64>,
        bytes_max: u64,
    ) -> Result<Vec<(u64, Vec<u8>)>, LogError>;
    /// The entry with the greatest index, if any.
    fn last_entry(&self) -> Result<Option<(u64, Vec<u8>)>, LogError>;
    /// The entry with the smallest index, if any.
    fn first_entry(&self) -> Result<Option<(u64, Vec<u8>)>, LogError>;
    /// Stores one metadata value.
    fn put_meta(&self, key: &str, value: &[u8]) -> Result<(), LogError>;
    /// Reads one metadata value.
    fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>, LogError>;
    /// The durability point: when this returns `Ok`, every earlier write survives a power cut.
    fn sync(&self) -> Result<(), LogError>;
}

/// sled's page cache size.
pub(crate) const CACHE_CAPACITY_BYTES: u64 = 64 * 1024 * 1024;

/// sled's own log file inside its directory.
pub(crate) const SLED_LOG_FILE_NAME: &str = "db";
/// sled's storage parameters inside its directory (written once, at creation).
pub(crate) const SLED_CONFIG_FILE_NAME: &str = "conf";
/// The directory inside sled's where it keeps values too large for its log, one file each.
pub(crate) const SLED_BLOBS_DIR_NAME: &str = "blobs";

/// How long [`SledEngine::open`] waits for an earlier handle's lock on sled's log to go.
const SLED_LOCK_RELEASE_WAIT: Duration = Duration::from_secs(10);
/// How often it looks.
const SLED_LOCK_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// The file a corruption error of the sled database in `dir` names: a blob
/// (`dir/blobs/N`) or sled's log (`dir/db`). `None` when sled did not say where, or when
/// `error` is no corruption.
pub(crate) fn sled_corrupt_file(dir: &Path, error: &sled::Error) -> Option<PathBuf> {
    match error {
        sled::Error::Corruption {
            at: Some(sled::DiskPtr::Blob(_, blob)),
            ..
        } => Some(dir.join(SLED_BLOBS_DIR_NAME).join(blob.to_string())),
        sled::Error::Corruption {
            at: Some(sled::DiskPtr::Inline(_)),
            ..
        } => Some(dir.join(SLED_LOG_FILE_NAME)),
        _ => None,
    }
}

/// Name of the sled tree holding the entries.
const ENTRIES_TREE: &str = "entries";
/// Name of the sled tree holding the vote, purged and committed log ids.
const META_TREE: &str = "meta";

/// [`LogEngine`] on sled 0.34: entries in one tree keyed by big-endian index, metadata in a
/// second tree.
///
/// sled's `flush()` writes its buffers and calls `sync_file_range`, which is not a durability
/// point on Linux (no journal commit, no disk cache flush). [`SledEngine::sync`] therefore
/// follows it with `fdatasync` of every file in the database directory that is new or changed
/// since the last sync (always the main `db` file), and an `fsync` of each directory whose
/// list of names changed (new snapshots, blobs, renames).
pub struct SledEngine {
    db: sled::Db,
    entries: sled::Tree,
    meta: sled::Tree,
    path: PathBuf,
    /// `false` only in tests that prove the power-cut test catches a missing fsync.
    fsync: bool,
    /// `false` only in tests that prove the power-cut test catches a missing directory fsync.
    fsync_directories: bool,
    sync_state: Mutex<SyncState>,
    /// Blob files that failed sled's checksum when the database was opened (sled drops them,
    /// and what follows them, while it recovers, and says so only in a warning).
    damaged_blobs: Vec<PathBuf>,
}

/// What the last sync saw, to fsync only what changed.
#[derive(Default)]
struct SyncState {
    /// Per directory (relative to the db path): names -> what the name was at the last sync.
    directories: BTreeMap<PathBuf, BTreeMap<PathBuf, Stamp>>,
}

/// What a directory entry was when last synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stamp {
    Directory,
    File {
        len_bytes: u64,
        modified: Option<SystemTime>,
    },
}

impl SledEngine {
    /// Opens (creating if needed) a sled database at `path`, after waiting for a database just
    /// dropped there to let go of its lock. With `fsync = false` the engine skips its fsyncs
    /// (sled still writes its buffers): only for tests.
    pub fn open(path: &Path, fsync: bool) -> Result<SledEngine, LogError> {
        Self::open_with(path, fsync, fsync, CACHE_CAPACITY_BYTES)
    }

    /// [`SledEngine::open`] with each kind of fsync switchable (tests only) and a page cache of
    /// `cache_capacity_bytes`.
    pub fn open_with(
        path: &Path,
        fsync: bool,
        fsync_directories: bool,
        cache_capacity_bytes: u64,
    ) -> Result<SledEngine, LogError> {
        wait_for_sled_lock_release(path)?;
        clear_crash_leftovers(path, fsync_directories)?;
        let damaged_blobs = damaged_blobs(path);
        for blob in &damaged_blobs {
            tracing::error!(blob = %blob.display(), "sled blob fails its checksum");
        }
        let db = sled::Config::new()
            .path(path)
            // Durability is ours: no periodic background flush (which would also fsync at
            // random moments and blur what the power-cut test sees).
            .flush_every_ms(None)
            // sled's default page cache is 1 GiB. The log is read back only to
            // replicate recent entries and is purged behind every snapshot, so
            // a small cache serves it; the memory belongs to the state machine.
            .cache_capacity(cache_capacity_bytes)
            .open()
            .map_err(|e| LogError::engine(path, e))?;
        let entries = db
            .open_tree(ENTRIES_TREE)
            .map_err(|e| LogError::engine(path, e))?;
        let meta = db
            .open_tree(META_TREE)
            .map_err(|e| LogError::engine(path, e))?;
        let engine = SledEngine {
            db,
            entries,
            meta,
            path: path.to_path_buf(),
            fsync,
            fsync_directories,
            sync_state: Mutex::new(SyncState::default()),
            damaged_blobs,
        };
        // Make the freshly created files and directories durable before anyone relies on them,
        // including sled's own directory entry in its parent.
        engine.sync()?;
        if let Some(parent) = path.parent().filter(|_| fsync_directories) {
            crate::lock::fsync_directory(parent)?;
        }
        Ok(engine)
    }

    /// An error of this database, naming its directory (and the damaged file).
    fn error(&self, source: sled::Error) -> LogError {
        LogError::engine(&self.path, source)
    }

    /// Blob files that failed sled's checksum when the database was opened.
    pub fn damaged_blobs(&self) -> &[PathBuf] {
        &self.damaged_blobs
    }

    /// The directory sled lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Applies `batch` with `entries` inserted into it, as one atomic sled batch. An insert
    /// wins over a removal of the same key in the batch.
    fn apply(&self, mut batch: sled::Batch, entries: &[(u64, Vec<u8>)]) -> Result<(), LogError> {
        for (index, value) in entries {
            batch.insert(&entry_key(*index), value.as_slice());
        }
        self.entries.apply_batch(batch).map_err(|e| self.error(e))
    }

    /// A batch removing every entry whose key is in `range` (the caller may add inserts).
    fn removal_of(&self, range: (Bound<[u8; 8]>, Bound<[u8; 8]>)) -> Result<sled::Batch, LogError> {
        let mut batch = sled::Batch::default();
        for item in self.entries.range(range) {
            let (key, _value) = item.map_err(|e| self.error(e))?;
            batch.remove(key);
        }
        Ok(batch)
    }

    /// fdatasync every file that is new or changed since the last sync (and always `db`), and
    /// fsync every directory whose names changed.
    fn fsync_files(&self) -> Result<(), LogError> {
        let mut state = self.sync_state.lock();
        let mut pending_dirs = vec![PathBuf::new()];
        while let Some(relative_dir) = pending_dirs.pop() {
            let dir = self.path.join(&relative_dir);
            let mut now: BTreeMap<PathBuf, Stamp> = BTreeMap::new();
            let listing = match std::fs::read_dir(&dir) {
                Ok(listing) => listing,
                // A sub-directory sled removed since we listed its parent.
                Err(e)
                    if e.kind() == std::io::ErrorKind::NotFound
                        && !relative_dir.as_os_str().is_empty() =>
                {
                    continue
                }
                Err(e) => return Err(LogError::io(format!("list {}", dir.display()), e)),
            };
            for item in listing {
                let item = item.map_err(|e| LogError::io(format!("list {}", dir.display()), e))?;
                let name = PathBuf::from(item.file_name());
                let metadata = match item.metadata() {
                    Ok(metadata) => metadata,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => {
                        return Err(LogError::io(format!("stat {}", item.path().display()), e))
                    }
                };
                if metadata.is_dir() {
                    pending_dirs.push(relative_dir.join(&name));
                    now.insert(name, Stamp::Directory);
                } else if metadata.is_file() {
                    now.insert(
                        name,
                        Stamp::File {
                            len_bytes: metadata.len(),
                            modified: metadata.modified().ok(),
                        },
                    );
                }
            }
            let before = state.directories.get(&relative_dir);
            for (name, stamp) in &now {
                if *stamp == Stamp::Directory {
                    continue;
                }
                let changed = before.and_then(|b| b.get(name)) != Some(stamp);
                let is_main_log =
                    relative_dir.as_os_str().is_empty() && name.as_os_str() == SLED_LOG_FILE_NAME;
                if changed || is_main_log {
                    let path = dir.join(name);
                    match File::open(&path) {
                        Ok(file) => file.sync_data().map_err(|e| {
                            LogError::io(format!("fdatasync {}", path.display()), e)
                        })?,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(LogError::io(format!("open {}", path.display()), e)),
                    }
                }
            }
            let names_changed = before.map(|b| !b.keys().eq(now.keys())).unwrap_or(true);
            if names_changed && self.fsync_directories {
                let handle = File::open(&dir)
                    .map_err(|e| LogError::io(format!("open directory {}", dir.display()), e))?;
                handle
                    .sync_all()
                    .map_err(|e| LogError::io(format!("fsync directory {}", dir.display()), e))?;
            }
            state.directories.insert(relative_dir, now);
        }
        Ok(())
    }
}

impl LogEngine for SledEngine {
    fn put_entries(&self, entries: &[(u64, Vec<u8>)]) -> Result<(), LogError> {
        // One entry (the usual append: one batch entry per round) is one sled
        // insert, atomic by itself. A `sled::Batch` writes its items plus a
        // batch manifest, which made every durability point flush three log
        // records instead of two: one client's write took 1.19 ms at p50 with
        // the batch and 1.06 ms with the insert (docs/benchmarks.md).
        if let [(index, value)] = entries {
            self.entries
                .insert(entry_key(*index), value.as_slice())
                .map_err(|e| self.error(e))?;
            return Ok(());
        }
        self.apply(sled::Batch::default(), entries)
    }

    fn replace_entries_from(&self, entries: &[(u64, Vec<u8>)]) -> Result<(), LogError> {
        let Some(&(from_index, _)) = entries.first() else {
            return Ok(());
        };
        let removal =
            self.removal_of((Bound::Included(entry_key(from_index)), Bound::Unbounded))?;
        self.apply(removal, entries)
    }

    fn delete_entries_from(&self, from_index: u64) -> Result<(), LogError> {
        let removal =
            self.removal_of((Bound::Included(entry_key(from_index)), Bound::Unbounded))?;
        self.apply(removal, &[])
    }

    fn delete_entries_through(&self, through_index: u64) -> Result<(), LogError> {
        let removal =
            self.removal_of((Bound::Unbounded, Bound::Included(entry_key(through_index))))?;
        self.apply(removal, &[])
    }

    fn read_entries(
        &self,
        start: u64,
        end: Option<u64>,
        bytes_max: u64,
    ) -> Result<Vec<(u64, Vec<u8>)>, LogError> {
        let upper = match end {
            Some(end) => Bound::Excluded(entry_key(end)),
            None => Bound::Unbounded,
        };
        // sled's range is lazy: no more than the bound (and one entry) is ever in memory.
        let mut budget = ReadBudget::new(bytes_max);
        let mut out = Vec::new();
        for item in self
            .entries
            .range((Bound::Included(entry_key(start)), upper))
        {
            let (key, value) = item.map_err(|e| self.error(e))?;
            if !budget.take(value.len() as u64) {
                break;
            }
            let index = decode_key(&key)?;
            out.push((index, value.to_vec()));
        }
        Ok(out)
    }

    fn last_entry(&self) -> Result<Option<(u64, Vec<u8>)>, LogError> {
        match self.entries.last().map_err(|e| self.error(e))? {
            Some((key, value)) => Ok(Some((decode_key(&key)?, value.to_vec()))),
            None => Ok(None),
        }
    }

    fn first_entry(&self) -> Result<Option<(u64, Vec<u8>)>, LogError> {
        match self.entries.first().map_err(|e| self.error(e))? {
            Some((key, value)) => Ok(Some((decode_key(&key)?, value.to_vec()))),
            None => Ok(None),
        }
    }

    fn put_meta(&self, key: &str, value: &[u8]) -> Result<(), LogError> {
        self.meta
            .insert(key.as_bytes(), value)
            .map_err(|e| self.error(e))?;
        Ok(())
    }

    fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>, LogError> {
        Ok(self
            .meta
            .get(key.as_bytes())
            .map_err(|e| self.error(e))?
            .map(|v| v.to_vec()))
    }

    fn sync(&self) -> Result<(), LogError> {
        self.db.flush().map_err(|e| self.error(e))?;
        if self.fsync {
            self.fsync_files()?;
        }
        Ok(())
    }
}

/// Waits (up to [`SLED_LOCK_RELEASE_WAIT`]) until no handle holds sled's lock on its log
/// (`path/db`), since sled's own open fails at once (`WouldBlock`) if one does.
///
/// sled drops that lock when the last handle on its log closes, and its I/O threads keep one
/// until the write they run returns, which is after the flush waiting on that write has
/// returned. So a database just dropped (by this process, or by the process that held the
/// directory before) can hold its lock a moment longer; the caller's [`crate::DirLock`] says
/// that no live store uses the directory. Once the wait is over, sled's open reports a lock
/// still held.
fn wait_for_sled_lock_release(path: &Path) -> Result<(), LogError> {
    let log = path.join(SLED_LOG_FILE_NAME);
    let file = match File::open(&log) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(LogError::io(format!("open {}", log.display()), e)),
    };
    let deadline = Instant::now() + SLED_LOCK_RELEASE_WAIT;
    while !crate::lock::try_flock_exclusive(&file)
        .map_err(|e| LogError::io(format!("flock {}", log.display()), e))?
        && Instant::now() < deadline
    {
        std::thread::sleep(SLED_LOCK_POLL_INTERVAL);
    }
    // Our probe's lock goes now, before sled opens: released only by closing `file`,
    // it would stay with a copy of the descriptor in a process another thread forks
    // meanwhile, and sled's own lock would fail (seen in the kill -9 crash test).
    crate::lock::unlock(&file);
    Ok(())
}

/// Removes what a crash can leave half written in the sled database at `path` and sled 0.34
/// would refuse as corrupt on every open (no other process may have it open):
/// - a snapshot still named `snap.<lsn>.generating` that fails sled's own check (its last
///   4 bytes, the crc32 of all but its last 12): sled writes one on every close (and every
///   million operations), syncs it and only then renames it to `snap.<lsn>`; its recovery
///   reads the newest `snap.*` file, an unfinished one included. The finished one before
///   it, which sled removes only after the rename, is still there (names of one directory
///   survive in the order they changed), and sled replays its log from it. A whole one is
///   left: sled reads it;
/// - its `conf` (the storage parameters, written once when sled creates the database, never
///   synced by sled) when its crc32 does not match: sled writes it anew from the
///   configuration, which [`SledEngine`] never changes.
///
/// Found by the crash-point exploration (`server/tests/crash_points.rs`).
fn clear_crash_leftovers(path: &Path, fsync_directory: bool) -> Result<(), LogError> {
    let listing = match std::fs::read_dir(path) {
        Ok(listing) => listing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(LogError::io(format!("list {}", path.display()), e)),
    };
    let mut removed = false;
    for item in listing {
        let item = item.map_err(|e| LogError::io(format!("list {}", path.display()), e))?;
        let name = item.file_name().to_string_lossy().into_owned();
        let unfinished = name.starts_with("snap.") && name.ends_with(".generating");
        let leftover = if unfinished && !snapshot_is_whole(&item.path()) {
            Some("an unfinished snapshot")
        } else if name == SLED_CONFIG_FILE_NAME && !config_is_whole(&item.path()) {
            Some("a torn configuration file")
        } else {
            None
        };
        if let Some(what) = leftover {
            tracing::warn!(file = %item.path().display(), "removing {what} that a crash left in sled's directory");
            std::fs::remove_file(item.path())
                .map_err(|e| LogError::io(format!("remove {}", item.path().display()), e))?;
            removed = true;
        }
    }
    if removed && fsync_directory {
        crate::lock::fsync_directory(path)?;
    }
    Ok(())
}

/// Whether the sled snapshot file at `path` passes sled's check: more than 12 bytes, the
/// last 4 the little-endian crc32 of all but the last 12 (the 8 before them are a length).
fn snapshot_is_whole(path: &Path) -> bool {
    match std::fs::read(path) {
        Ok(bytes) if bytes.len() > 12 => {
            let crc = &bytes[bytes.len() - 4..];
            crc32fast::hash(&bytes[..bytes.len() - 12]).to_le_bytes() == crc
        }
        Ok(_) => false,
        // Unreadable: left to sled, which reports it.
        Err(_) => true,
    }
}

/// Whether sled's `conf` at `path` is whole: its last 4 bytes are the little-endian crc32 of
/// the bytes before them. A file sled reads as absent (8 bytes or fewer) counts as whole.
fn config_is_whole(path: &Path) -> bool {
    match std::fs::read(path) {
        Ok(bytes) if bytes.len() > 8 => {
            let (body, crc) = bytes.split_at(bytes.len() - 4);
            crc32fast::hash(body).to_le_bytes() == crc
        }
        Ok(_) => true,
        // Unreadable: left to sled, which reports it.
        Err(_) => true,
    }
}

/// The blob files in the sled database at `path` whose contents fail sled's own check (a
/// little-endian crc32 of the kind byte and the data, in the first 4 bytes), found before sled
/// opens the database, because sled's recovery drops them. Unreadable files count as damaged.
fn damaged_blobs(path: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(path.join(SLED_BLOBS_DIR_NAME)) else {
        return Vec::new();
    };
    let mut damaged: Vec<PathBuf> = entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|blob| match std::fs::read(blob) {
            Ok(bytes) if bytes.len() >= 5 => {
                let stored = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                crc32fast::hash(&bytes[4..]) != stored
            }
            _ => blob.is_file(),
        })
        .collect();
    damaged.sort();
    damaged
}

/// A key that is not 8 bytes long cannot name an index; report it at the nearest index we can
/// read from its first bytes.
fn decode_key(key: &[u8]) -> Result<u64, LogError> {
    index_of_key(key).ok_or_else(|| {
        let mut padded = [0u8; 8];
        let len = key.len().min(8);
        padded[..len].copy_from_slice(&key[..len]);
        LogError::Corrupt {
            index: u64::from_be_bytes(padded),
            reason: format!("entry key is {} bytes long, expected 8", key.len()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_waits_for_an_earlier_handle_to_release_sleds_lock() {
        // sled's I/O threads can keep its log open (and locked) a moment after the database
        // is dropped: open waits for that instead of failing with WouldBlock.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sled");
        drop(SledEngine::open(&path, false).expect("create"));
        wait_for_sled_lock_release(&path).expect("wait");
        let straggler = File::open(path.join(SLED_LOG_FILE_NAME)).expect("open sled's log");
        assert!(crate::lock::try_flock_exclusive(&straggler).expect("flock"));
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(straggler);
        });
        SledEngine::open(&path, false).expect("open once the straggler lets go");
        release.join().expect("release");
    }

    #[test]
    fn a_config_file_torn_by_a_crash_in_the_first_open_is_written_again() {
        // sled writes `conf` once, when it creates a database, and never syncs it itself: a
        // crash during a node's first start can leave part of it (found by the crash-point
        // exploration, server/tests/crash_points.rs: the conf's second write lost). sled 0.34
        // refuses such a database as corrupt on every later open: the node never starts.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sled");
        drop(SledEngine::open(&path, false).expect("create"));
        let conf = path.join(SLED_CONFIG_FILE_NAME);
        let bytes = std::fs::read(&conf).expect("sled wrote its conf");
        assert!(bytes.len() > 12);
        std::fs::write(&conf, &bytes[..bytes.len() - 4]).expect("tear the conf");
        let engine = SledEngine::open(&path, false).expect("a torn conf is written again");
        engine.put_meta("k", b"v").expect("put");
        assert_eq!(std::fs::read(&conf).expect("conf"), bytes, "written whole");
    }

    #[test]
    fn a_snapshot_file_left_half_written_by_a_crash_is_ignored() {
        // sled writes its snapshot to `snap.<lsn>.generating`, syncs it and renames it; its
        // recovery reads the newest `snap.*` file, a `.generating` one included, and refuses
        // a torn one as corrupt. A crash before the sync can leave it torn (found by the
        // crash-point exploration: sled snapshots on every close, so at each restart).
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sled");
        {
            let engine = SledEngine::open(&path, false).expect("create");
            engine.put_meta("k", b"v").expect("put");
            engine.sync().expect("sync");
        }
        let generating = path.join("snap.FFFFFFFFFFFFFFF0.generating");
        std::fs::write(&generating, b"the first sector of a snapshot").expect("torn snapshot");
        let engine = SledEngine::open(&path, false).expect("the torn snapshot is ignored");
        assert_eq!(engine.get_meta("k").expect("get"), Some(b"v".to_vec()));
        assert!(!generating.exists(), "removed");
        drop(engine);
        // A whole one (synced, its rename lost) is sled's to read: left in place.
        let mut finished: Vec<PathBuf> = std::fs::read_dir(&path)
            .expect("list")
            .flatten()
            .map(|item| item.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("snap."))
            })
            .collect();
        finished.sort();
        let newest = finished.pop().expect("sled snapshots on close");
        std::fs::copy(&newest, &generating).expect("a whole unfinished snapshot");
        let engine = SledEngine::open(&path, false).expect("a whole snapshot opens");
        assert_eq!(engine.get_meta("k").expect("get"), Some(b"v".to_vec()));
    }

    #[test]
    fn a_sled_corruption_names_the_same_file_in_its_message_and_as_the_damaged_file() {
        let dir = Path::new("/data/raft-log/sled");
        let blob = sled::Error::Corruption {
            at: Some(sled::DiskPtr::Blob(4096, 7)),
            bt: (),
        };
        let log = sled::Error::Corruption {
            at: Some(sled::DiskPtr::Inline(512)),
            bt: (),
        };
        let nowhere = sled::Error::Corruption { at: None, bt: () };
        assert_eq!(
            sled_corrupt_file(dir, &blob),
            Some(dir.join("blobs").join("7"))
        );
        assert_eq!(sled_corrupt_file(dir, &log), Some(dir.join("db")));
        assert_eq!(sled_corrupt_file(dir, &nowhere), None);
        assert_eq!(
            sled_corrupt_file(dir, &sled::Error::Unsupported("x".into())),
            None
        );
        for source in [blob, log] {
            let error = LogError::engine(dir, source);
            let file = error.damaged_file().expect("sled said where");
            assert!(
                error.to_string().contains(&file.display().to_string()),
                "{error} names {}",
                file.display()
            );
        }
        // sled did not say where: the message names sled's directory and no file is claimed, so
        // the node names the log directory.
        let error = LogError::engine(dir, nowhere);
        assert!(error.is_corruption());
        assert_eq!(error.damaged_file(), None);
        assert!(error.to_string().contains("/data/raft-log/sled"), "{error}");
    }
}
