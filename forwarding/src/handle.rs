//! The narrow interface between request execution and the host's Raft.

use std::future::Future;

use cairn_fsm::{Applied, Command, Store};
use cairn_proto::error::{ApiError, LeaderHint};

/// Where a strong read may be confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadAt {
    /// Only on the leader: a node that does not lead answers NotLeader (and
    /// the forwarder sends the whole request to the leader). The path of a
    /// forwarded request, and of `follower_strong_reads = "forward"`.
    Leader,
    /// On any node: a follower asks the leader for a read index, waits until
    /// it has applied it, and serves the read from its own table.
    AnyNode,
}

/// What executing and forwarding requests needs from Raft — nothing more:
/// propose a command, confirm a read, name the leader, and the table.
///
/// The node implements it once, directly over openraft; the tests implement it
/// with an in-process leader and lagging follower.
///
/// ## Contract on errors
/// The retry rules of the [`crate::Forwarder`] rest on these:
/// - Leadership is checked once per request, inside [`Handle::propose`] and
///   [`Handle::confirm_read`]: nothing above them asks whether this node
///   leads. On a node that does not lead they answer `NotLeader` with the
///   leader it knows, and the forwarder sends the request there.
/// - [`Handle::propose`] answers `NotLeader` or `Unavailable` **only when the
///   command certainly did not enter the log** (refused before proposing).
///   Any failure after the command may have been appended — leadership lost
///   while waiting, Raft stopping, a timeout — is `Inconsistent` (the
///   outcome is unknown; the entry may still commit).
/// - [`Handle::confirm_read`] on success returns an index `i` such that every
///   write acknowledged before the call is at or below `i` and this node's
///   store has applied at least `i`. On a node that does not lead it answers
///   `NotLeader` with [`ReadAt::Leader`]; with [`ReadAt::AnyNode`] it asks the
///   leader for a read index (`NotLeader` when the leader it asked had lost
///   its role, with the new hint). It answers `Inconsistent` when the read
///   index could not be confirmed (no quorum; no leader reachable), and never
///   returns an index it could not confirm. It does not bound its own wait:
///   the caller cuts it off at its deadline.
pub trait Handle: Send + Sync + 'static {
    /// Appends `command` to the Raft log and waits until this node has
    /// applied it; returns the entry's index and what applying it did. A
    /// contract verdict (CasFailure, WrongUid, InvalidArgument) is an `Err`
    /// with that kind, the same on every replica. A command the cluster version
    /// does not allow (`Command::needs`) is refused FailedPrecondition before
    /// anything else, on any node, and never proposed.
    fn propose(
        &self,
        command: Command,
    ) -> impl Future<Output = Result<(u64, Applied), ApiError>> + Send;

    /// Confirms a read index with a quorum (here on the leader, or through
    /// the leader with [`ReadAt::AnyNode`]) and waits until this node has
    /// applied it (see the trait docs).
    fn confirm_read(&self, at: ReadAt) -> impl Future<Output = Result<u64, ApiError>> + Send;

    /// The current leader as this node knows it (its id and addresses).
    fn leader(&self) -> LeaderHint;

    /// This node's replica of the resource table.
    fn store(&self) -> &Store;

    /// Whether this node's table may answer reads: `Unavailable` when it must not (the
    /// node's `CORRUPT` alarm names it), so that a client asks another member.
    fn serves_reads(&self) -> Result<(), ApiError> {
        Ok(())
    }
}
