//! # cairn-forwarding — followers forward to the leader
//!
//! **Purpose.** Everything between a request arriving on any node and the
//! node that can answer it:
//! - [`Handle`]: the narrow interface to the host's Raft (apply a command and
//!   wait for its result, confirm a read index here or through the leader,
//!   the leader hint, the local [`cairn_fsm::Store`]). The node implements it over
//!   openraft; the tests implement it with an in-process leader and follower.
//! - [`Executor`]: the ONE place where requests are validated and executed on
//!   this node (reads, lists, writes, deletes, ListByOwner, watches). The
//!   node's `ResourceService`, the leader's local path and the
//!   [`ForwardingServer`] all go through it.
//! - [`LeaderChannel`]: one cached tonic channel to the leader's peer address.
//! - [`ForwardingServer`]: the `ForwardingService` on the peer port.
//! - [`Forwarder`]: the client-facing router: eventual reads, eventual lists,
//!   ListByOwner and watches are local; writes and deletes run locally on the
//!   leader and are forwarded to it from a follower, with retries across
//!   leader changes inside the request deadline; strong reads, lists and
//!   watches run locally after a read index ([`ReadAt::AnyNode`]: a follower
//!   asks the leader with [`LeaderReadIndex`]), or, with [`ReadAt::Leader`],
//!   strong reads and lists are forwarded like writes.
//!
//! **What it must not do.** Hold any rule of the contract (they live in
//! `cairn-fsm`); know openraft; map an error to a gRPC code anywhere but
//! through `cairn_proto::error::ApiError`; forward twice (a forwarded request
//! is served by the receiver or refused with NotLeader); retry a write or
//! delete unless that attempt certainly did not apply; answer a client with a
//! raw transport error.
//!
//! **Concurrency model.** Everything is `Send + Sync` and shared behind `Arc`s
//! by the tonic servers' tasks. [`LeaderChannel`] keeps its target and cached
//! channel under a short `parking_lot` mutex that is never held across an
//! `.await`; dialling is serialised by one `tokio` mutex so that concurrent
//! callers share one dial. The host calls [`LeaderChannel::leader_changed`]
//! from its own task whenever its Raft metrics name a new leader; that call
//! never blocks on a dial in progress (a dial that finishes for a leader that
//! is no longer the target is discarded).
//!
//! ## Error kinds on the forwarding path
//!
//! What follows a failed attempt is decided by `cairn_request` (one table,
//! shared with `cairn-client`); the [`Forwarder`] is its transport.
//!
//! | what happened                                         | kind the caller gets |
//! |-------------------------------------------------------|----------------------|
//! | the leader answered (any kind, PermissionDenied included) | that kind, intact (a NotLeader not followed in time: Unavailable) |
//! | no leader known / leader unreachable until the deadline (nothing sent) | Unavailable |
//! | a write sent, then the connection lost or no answer in time | Inconsistent (its outcome is unknown) |
//! | a message over the size limit                         | ResourceExhausted (a write: Inconsistent) |
//!
//! Unavailable therefore always means "certainly not applied, retry here or
//! elsewhere", and Inconsistent on a write means "may have applied" — the
//! rules `cairn-client` relies on (see the `cairn-proto` error table).
//!
//! ## Invariants
//! - A [`LeaderChannel`] never targets this node: a hint naming this node's id
//!   or peer address is "no leader" (checked when the target is set and
//!   asserted again just before every dial).
//! - At most one dial is in flight per [`LeaderChannel`]; the cached channel
//!   always belongs to the current target, or is absent.
//! - A [`LeaderChannel`]'s target moves only with this node's own view of the
//!   leader, or with a NotLeader from the current target that names another
//!   node. A NotLeader naming nobody else leaves the target: a node just
//!   elected answers so until its own view says it leads, and this node's view,
//!   which already names it, would never move the channel back.
//! - A request's next attempt goes without a pause only when a NotLeader has
//!   just turned the channel to a node this request has not asked yet; every
//!   other retry waits for the loop's pause, so nodes whose stale views name
//!   each other are asked at that pace, never as fast as they answer.
//! - A forwarded write or delete is sent again only after an attempt that
//!   certainly did not apply (nothing was sent, or the receiver refused with
//!   NotLeader/Unavailable, which by the [`Handle`] contract it does only
//!   before proposing). Every other failure of a sent write ends the request.
//! - [`ForwardingServer`] never forwards: it executes on its own node or
//!   answers NotLeader with its current hint.
//! - A strong read, a strong listing's first page, or a strong watch is
//!   served only after [`Handle::confirm_read`] succeeded on the serving
//!   node, and then from a view at least as new as the index it returned
//!   (asserted). A strong request that could not be confirmed by its
//!   deadline is Inconsistent, never a plain local read.
//!   A later page of any listing is read from the view at its token's
//!   revision (asserted), which holds the same on every node that applied
//!   it: it is Unavailable on a node that has not, Compacted on one whose
//!   history no longer reaches it.
//! - Every request is validated on the node that receives it and again on
//!   the node that executes it.

#![forbid(unsafe_code)]

mod channel;
mod executor;
mod forwarder;
mod handle;
pub mod metrics;
mod read_index;
mod server;

pub use channel::{LeaderChannel, LeaderChannelOptions, Target};
pub use executor::{checks, wall_clock_ms, Executor, OpenedWatch, WatchStream};
pub use forwarder::{Forwarder, ForwarderOptions, RequestStamp};
pub use handle::{Handle, ReadAt};
pub use read_index::LeaderReadIndex;
pub use server::{bounded_timeout, caller_timeout, watch_open_timeout, ForwardingServer};

/// Largest forwarded message, sent or received (a list page is bounded by
/// `cairn_fsm::LIST_PAGE_BYTES_MAX`, but a single resource can be larger;
/// the node's client port accepts the same).
pub const FORWARD_MESSAGE_BYTES_MAX: usize = 32 * 1024 * 1024;
