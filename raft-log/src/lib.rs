//! # cairn-raft-log: durable openraft log storage
//!
//! **Purpose.** Stores the Raft log of one Cairn node: the entries, the vote, the last purged
//! log id and the committed log id. [`LogStore`] implements openraft 0.9's `RaftLogReader` and
//! `RaftLogStorage` (storage-v2) for any `C: RaftTypeConfig` whose entries are serde
//! serializable and `Clone`. Two engines, chosen by [`LogOptions::engine`]
//! ([`LogEngineKind`]); a directory records the engine that wrote it (`<dir>/ENGINE`) and the
//! other one refuses it with [`LogError::EngineMismatch`]:
//! - **`wal`, the default: a segmented write-ahead log.** Entries live in preallocated
//!   segment files `<dir>/segments/<base index>-<segment id>.wal` (64 MiB by default), as
//!   frames that each carry their length and a crc32c; every batch ends with a commit frame
//!   carrying the batch's offset, frame count and crc32c. The vote, the committed and purged
//!   log ids and the segment list live in a small sled tree (`<dir>/meta`), written only when
//!   they change. The format is in `wal/format.rs` and `docs/architecture.md`.
//! - **`sled`: everything in sled 0.34** (`<dir>/sled`), through the [`LogEngine`] seam, with a
//!   crc32c per value (`crc32c ++ bincode`, over the index or key name too) and a watermark
//!   file that detects entries sled dropped while recovering.
//!
//! **What it must not do.**
//! - Never acknowledge an append (openraft's `LogFlushed` callback) or return from `save_vote`
//!   or `truncate` before the change is on stable storage, nor from `purge` before its purge
//!   point is. The WAL: one `fdatasync` of the segment per batch, sled's flush plus `fdatasync`
//!   of its files for metadata, an `fsync` of the directory after a file is created or deleted.
//!   `save_committed` is never ahead of the entries it covers and becomes durable later, as
//!   openraft allows. The only ways around this are the `unsafe_*_for_tests` switches of
//!   [`LogOptions`], which exist so the power-cut tests can prove that they notice.
//! - Never run blocking disk work on the async executor's threads: writes go to the engine's
//!   threads; the WAL serves recent entries from memory and reads older ones on
//!   `tokio::task::spawn_blocking` (inline when no runtime is present); sled reads run there
//!   too.
//! - Never panic on bytes read from disk, and never skip a bad entry: damage is
//!   [`LogError::CorruptSegment`] (WAL: the segment file, the index, the byte offset),
//!   [`LogError::CorruptBlob`] or [`LogError::Engine`] naming the sled file, or
//!   [`LogError::Corrupt`] (the index), surfaced to openraft as a `StorageError` that reads the
//!   log at that index. [`LogError::is_corruption`], [`LogError::os_error`] and
//!   [`LogError::damaged_file`] let the node tell damaged data from a full disk. Only a torn
//!   tail — the WAL batch being written when the process or the power stopped, which was never
//!   acknowledged — is cut back, to the last commit frame, and only once every other check of
//!   the open has passed: an open refused because a committed entry is missing changes nothing
//!   on disk.
//! - Never delete entries before the purge point that covers them is durable.
//! - Never keep going after a failed write or sync (the page cache state is then unknown): the
//!   store is poisoned and every later request fails with [`LogError::Poisoned`]. The error
//!   that poisoned it (or else the first one returned to openraft, whose core stops on any
//!   storage error) is kept whole: [`LogStore::failure`].
//!
//! **Concurrency model (WAL).** A [`LogStore`] is a cheap `Clone` handle (an `Arc`). Callers
//! share one in-memory view of the log under a mutex: the log id and location of every entry,
//! and a bounded *tail* of the most recent entries themselves ([`LogOptions::tail_bytes_max`],
//! 32 MiB by default). `append` encodes the entries into frames on the caller's thread, and in
//! one critical section adds them to the view (readable at once, from the tail) and queues the
//! operation to one OS thread, `raft-log-wal`; it does no disk work and does not wait. That
//! thread blocks for one operation, takes every operation already queued, writes their frames
//! as one batch with one `pwrite` and one `fdatasync` (group commit: appends that arrive during
//! an `fdatasync` share the next one), records where each entry now lives, and then — on the
//! same thread, with no further hand-off — fires the flush callbacks in queue order and
//! answers truncations; votes and purge points then go to sled. Completions are delivered in
//! the order of the queue and every queued callback is released exactly once (with `Ok` or
//! with the poisoning error), so no completion can be stranded by another. Reads take recent
//! entries from the tail and older ones (evicted only once written) from their segments with
//! `pread`: segments are append-only while open, so readers never race the writer. A
//! [`DirLock`] (an `flock` on `<dir>/LOCK` holding the owner's pid) keeps a second process —
//! or a second `LogStore` in the same process — out of the directory.
//!
//! **Concurrency model (sled).** Mutations go in call order over a channel to
//! `raft-log-writer`, which applies each one and replies at once; whatever must wait for
//! durability is queued to `raft-log-syncer`, which makes one durability point (`flush` +
//! fsync) per group of jobs and releases them in order. Reads read sled directly on the
//! blocking pool.
//!
//! **Invariants.**
//! - Entries are contiguous: the stored indexes form one run `first..=last` with no gap (a WAL
//!   segment may jump forward over a gap only where the gap is wholly purged: after a snapshot,
//!   openraft purges past the end of a short log and appends from the purge point; the purge is
//!   durable before the append is written), and
//!   each stored entry's own log id index equals its key (sled) or its frame's index (WAL).
//! - `last_purged.index < first` when entries exist; the purge point is durable before any
//!   entry or segment at or below it is deleted, so `last_purged` never goes backwards.
//! - Every entry returned has had its checksum verified and its index checked, on open and on
//!   every read from disk (entries served from the tail were verified when encoded).
//! - A flush callback fires only after the durability point that covers the entry's write,
//!   from the thread that made it; callbacks fire in append order, each exactly once.
//! - An append never leaves a hole: one starting beyond `last + 1` (or `last_purged + 1` on an
//!   empty log) is refused with [`LogError::NonContiguousAppend`] before anything is written.
//!   Entries at or below the purge point are not stored (the snapshot covers them); an append
//!   starting at or below `last` replaces the tail from its first index atomically: a crash
//!   leaves the old tail or the new entries, never a log shorter than both (WAL: a truncate
//!   frame in the same batch; sled: one `sled::Batch` of removals and inserts,
//!   [`LogEngine::replace_entries_from`]).
//! - WAL: every entry frame and truncate frame is followed, in its segment, by the commit frame
//!   of its batch before it is acknowledged; at most one batch (the one being written) lacks
//!   its commit frame at any time, so on open a damaged frame followed by a later batch's
//!   commit is corruption, never a torn tail. A sealed segment (not the last) is valid up to
//!   the end the metadata recorded for it.
//! - WAL: a segment file is durable with its name and recorded in the metadata before any
//!   entry is written to it; files the metadata does not list are deleted on open.
//! - WAL: an entry leaves the tail only once its frame is written, so every live entry is in
//!   the tail or has a location in an open segment.
//! - The committed log id, when present, is `<=` the last log id (or purge point) on open.
//! - sled: the watermark file never exceeds the durable last log index; on open, a log ending
//!   below it has lost durable entries and is reported as corrupt, naming the first missing
//!   index.
//! - sled (both engines: the WAL keeps its metadata there): what a crash leaves half written
//!   that sled 0.34 would refuse forever — an unfinished `snap.*.generating`, a `conf` failing
//!   its crc32 — is removed before sled opens (`engine.rs`), as the crash-point exploration
//!   (`server/tests/crash_points.rs`) requires.

mod codec;
mod engine;
mod error;
mod lock;
mod marker;
mod metrics;
mod options;
mod poison;
mod read_budget;
mod store;
pub mod test_hooks;
mod wal;
mod watermark;
mod writer;

pub use engine::LogEngine;
pub use engine::SledEngine;
pub use error::LogError;
pub use lock::write_file_atomically;
pub use lock::DirLock;
pub use metrics::describe_metrics;
pub use options::LogEngineKind;
pub use options::LogOptions;
pub use options::READ_BYTES_MAX_DEFAULT;
pub use options::SEGMENT_SIZE_BYTES_DEFAULT;
pub use options::TAIL_BYTES_MAX_DEFAULT;
pub use store::LogStore;
pub use writer::DurableCallback;
pub use writer::LogStats;
