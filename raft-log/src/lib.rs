//! # cairn-raft-log: durable openraft log storage
//!
//! **Purpose.** Stores the Raft log of one Cairn node: the entries, the vote, the last purged
//! log id and the committed log id. [`LogStore`] implements openraft 0.9's `RaftLogReader` and
//! `RaftLogStorage` (storage-v2) for any `C: RaftTypeConfig` whose entries, node ids and nodes
//! are serde-serializable. The bytes live in a [`LogEngine`] (today [`SledEngine`], sled 0.34);
//! the store adds the checksums, the ordering and the durability points, so the engine can be
//! replaced (for example by a segmented write-ahead log) without touching the node.
//!
//! Every stored value is `crc32c (4 bytes, big endian) ++ bincode 2 (serde)`; the checksum covers
//! the entry's index (or the meta key's name) and the payload, so a value read back at the wrong
//! key is detected as well as a flipped bit.
//!
//! **What it must not do.**
//! - Never acknowledge an append (openraft's `LogFlushed` callback) or return from `save_vote`
//!   or `truncate` before the change is on stable storage, nor from `purge` before its purge
//!   point is: `db.flush()` followed by an fsync of the engine's files (sled's own flush is
//!   `sync_file_range`, not an fsync). (`save_committed` is ordered after the appends before it
//!   and becomes durable with the next durability point, as openraft allows.) The only
//!   way around this is [`LogOptions::unsafe_skip_fsync_for_tests`], which exists so the
//!   power-cut test can prove that it notices.
//! - Never run blocking disk work on the async executor's threads: writes go to the writer
//!   thread, reads run on `tokio::task::spawn_blocking` (inline when no runtime is present).
//! - Never panic on bytes read from disk, and never skip a bad entry: a checksum, decoding or
//!   contiguity failure is [`LogError::Corrupt`] naming the index, surfaced to openraft as a
//!   `StorageError` that reads the log at that index.
//! - Never delete entries before the purge point that covers them is durable, so a restart
//!   after compaction never finds entries missing below an unrecorded purge point.
//! - Never keep going after a failed fsync (the page cache state is then unknown): the store is
//!   poisoned and every later request fails with [`LogError::Poisoned`].
//!
//! **Concurrency model.** A [`LogStore`] is a cheap `Clone` handle (an `Arc`). All mutations —
//! append, truncate, purge, save_vote, save_committed — are sent, in call order, over one
//! `std::sync::mpsc` channel to a dedicated OS thread, `raft-log-writer`, which applies each
//! one in order (one engine batch per append) and replies "applied" at once, so the entries are
//! readable when `append` returns. Whatever must wait for durability (append callbacks,
//! `save_vote`, `truncate`) is queued to a second thread, `raft-log-syncer`, which takes every
//! job already queued, makes one durability point (`flush` + fsync) for the whole group and then
//! releases them in order (group commit). Because the writer keeps applying while the syncer is
//! inside an fsync, appends issued back to back — as openraft issues them — share fsyncs. A
//! purge persists its purge point, waits for a durability point, and only then deletes entries.
//! Reads do not go through the threads: they read the engine directly (sled is thread-safe) on
//! the blocking pool and see every append whose `append` call has returned. A [`DirLock`] (an
//! `flock` on `<dir>/LOCK` holding the owner's pid) keeps a second process — or a second
//! `LogStore` in the same process — out of the directory.
//!
//! **Invariants.**
//! - Entries are contiguous: the stored indexes form one run `first..=last` with no gap, and
//!   each stored entry's own log id index equals its key.
//! - `last_purged.index < first` when entries exist; after a purge the purge point is durable
//!   before any entry at or below it is deleted, so `last_purged` never goes backwards.
//! - Every entry read (by openraft or on open) has had its checksum verified and its key
//!   checked against its index; no read returns an unverified entry.
//! - A flush callback fires only after a durability point that followed the entry's write;
//!   callbacks fire in append order.
//! - An append never leaves a hole: one starting beyond `last + 1` (or `last_purged + 1` on an
//!   empty log) is refused with [`LogError::NonContiguousAppend`] before anything is written.
//!   Entries at or below the purge point are not stored (the snapshot covers them); an append
//!   starting at or below `last` replaces the tail from its first index.
//! - The watermark file never exceeds the durable last log index (it is written after each
//!   durability point and lowered durably before a truncation); on open, a log ending below it
//!   has lost durable entries (sled drops everything after a damaged record) and is reported
//!   as corrupt, naming the first missing index.
//! - Entries at or below a durable purge point found on open (a crash between the purge point
//!   and the deletion) are deleted before verification.
//! - The committed log id, when present, is `<=` the last log id on open
//!   (it is written after its entries, through the same ordered channel).

mod codec;
mod engine;
mod error;
mod lock;
mod marker;
mod options;
mod store;
pub mod test_hooks;
mod wal;
mod watermark;
mod writer;

pub use engine::LogEngine;
pub use engine::SledEngine;
pub use error::LogError;
pub use lock::DirLock;
pub use options::LogEngineKind;
pub use options::LogOptions;
pub use options::SEGMENT_SIZE_BYTES_DEFAULT;
pub use options::TAIL_BYTES_MAX_DEFAULT;
pub use store::LogStore;
pub use writer::DurableCallback;
pub use writer::LogStats;
