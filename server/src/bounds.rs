//! Sizes that the settings' checks ([`crate::config`]) and the Raft layer (`raft/`) both
//! rely on, defined once, below both: the configuration bounds its settings by them, and
//! Raft enforces them on what it encodes, batches and accepts from peers. Nothing here
//! depends on any other module.

/// bincode's own bound on what one decode may claim, and the largest
/// `peer_message_bytes_max` the config accepts: a message is never larger
/// than that gRPC limit, so no length prefix inside it can claim more.
pub const DECODE_BYTES_MAX: usize = 1 << 30;

/// Largest snapshot chunk (the largest `snapshot_chunk_bytes` a node accepts): the peer gate
/// refuses a larger chunk from any sender.
pub const SNAPSHOT_CHUNK_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// A write batch stops growing once its commands' encoded size reaches this: one Raft entry
/// holds at most this plus one more command.
pub const WRITE_BATCH_BYTES_MAX: usize = 1024 * 1024;
