//! Write batching: several client writes and deletes in one Raft entry.
//!
//! openraft 0.9 appends each `client_write` as its own entry, so writes
//! proposed one by one each pay for their own log append and durability
//! point, replication message, follower fsync and apply. Here one proposal is
//! in flight at a time, as etcd's raft does with its `Ready` batches: writes
//! that arrive while it is in flight wait and then go together as one
//! `Command::Batch` entry (up to [`BATCH_COMMANDS_MAX`] commands or
//! [`BATCH_BYTES_MAX`] encoded bytes). A lone write is proposed at once, as
//! itself: batching adds no latency when there is nothing to batch.
//!
//! One in flight was measured against more (an idle 2-core machine, 64
//! clients on one connection, 2026-11-22, before lone writes proposed on
//! their own task; `docs/benchmarks.md`, changes measured on 2026-11-22): 1
//! gave 11,700 writes/s at p99 8.0 ms, 2 gave 10,100 at 9.4 ms, 4 gave 9,200
//! at 10.2 ms; one client's latency was the same for all three.
//!
//! Semantics are unchanged: the fsm applies a batch's commands in order, each
//! with its own outcome, all at the entry's index (their version and their
//! events' revision). An error of the proposal as a whole (not leader,
//! leadership lost, Raft stopped) is every command's error.
//!
//! Each command is encoded once, by [`WriteBatcher::propose`] on the caller's
//! task; the batch entry is framed around those bytes
//! (`Command::encode_batch`), and a lone command's bytes are the entry.
//!
//! The one proposal in flight is a permit ([`WriteBatcher`]'s `proposer`).
//! A write that finds it free takes it and proposes itself on its own task,
//! with no hand-off to the batcher task and back (two task wake-ups fewer
//! per write when writes come one at a time). A write that finds it taken
//! queues; the batcher task waits for the permit with the first queued write
//! in hand, then takes everything queued into one entry. A released permit
//! goes to a waiting batcher before any new caller (the semaphore hands
//! permits to waiters first), so queued writes are never overtaken for long
//! and never stranded: whoever holds the permit, the batcher task is the one
//! that drains the queue.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use cairn_fsm::{Applied, Command};
use cairn_proto::error::ApiError;
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::leadership::{propose_entry, require_leader};
use super::stages::{WriteStages, WriteTimes};
use super::types::{NodeId, Raft};

/// At most this many commands per batch entry.
pub const BATCH_COMMANDS_MAX: usize = 256;
/// A batch stops growing once its commands' encoded size reaches this.
pub use crate::bounds::WRITE_BATCH_BYTES_MAX as BATCH_BYTES_MAX;
/// Writes waiting to be proposed; callers wait for room beyond this.
const QUEUE_MAX: usize = 8192;

type Outcome = Result<(u64, Applied), ApiError>;

struct Pending {
    /// The command, encoded (`Command::encode`).
    encoded: Bytes,
    reply: oneshot::Sender<Outcome>,
    /// When the batcher received it (only with stage timing on).
    received: Option<Instant>,
}

/// Submits writes and deletes; a background task proposes them. Cheap to
/// clone (a channel sender).
#[derive(Clone)]
pub struct WriteBatcher {
    queue: mpsc::Sender<Pending>,
    stages: Arc<WriteStages>,
    /// One permit: held by whoever has a proposal in flight.
    proposer: Arc<Semaphore>,
    raft: Raft,
}

impl WriteBatcher {
    /// Starts the batcher task among `tasks` (it runs until they stop).
    pub fn start(
        raft: Raft,
        node_id: NodeId,
        stages: Arc<WriteStages>,
        tasks: &mut crate::tasks::Tasks,
    ) -> WriteBatcher {
        let (queue, receiver) = mpsc::channel(QUEUE_MAX);
        let proposer = Arc::new(Semaphore::new(1));
        tasks.spawn(
            "write batcher",
            run(
                raft.clone(),
                node_id,
                receiver,
                stages.clone(),
                proposer.clone(),
            ),
        );
        WriteBatcher {
            queue,
            stages,
            proposer,
            raft,
        }
    }

    /// Holds every proposal of this batcher until the returned permit drops: the one in
    /// flight (if any) finishes first, and writes that arrive meanwhile queue. A leader
    /// transfer holds them: a leader that is to go quiet must send nothing, or every entry
    /// it replicates renews its followers' leases and they refuse the successor's votes.
    /// The writes held are proposed when it drops, each checked for leadership first
    /// (`propose_batch`): `NotLeader` once the successor leads.
    pub async fn hold(&self) -> tokio::sync::OwnedSemaphorePermit {
        self.proposer
            .clone()
            .acquire_owned()
            .await
            .expect("the proposer semaphore is never closed")
    }

    /// Proposes a write or delete, alone or in a batch, and waits for its outcome.
    ///
    /// A node that is shutting down answers `Unavailable` when the command was
    /// never queued (certainly not proposed) and `Inconsistent` when it was
    /// queued and its outcome is lost (it may have been proposed).
    pub async fn propose(&self, command: Command) -> Outcome {
        assert!(
            matches!(command, Command::Write { .. } | Command::Delete { .. }),
            "only writes and deletes are batched"
        );
        let received = self.stages.now();
        let encoded = command.encode();
        if let Ok(_permit) = self.proposer.try_acquire() {
            // Nothing in flight: this write is the next entry, proposed
            // here. (Should the caller give up waiting, the permit goes with
            // it while the entry may still be in flight: a second proposal
            // may then overlap it, which openraft allows.)
            let lone = propose_entry(&self.raft, encoded);
            let batched = self.stages.now();
            return propose_timed(&self.stages, [received], batched, lone, applied_index).await;
        }
        let (reply, outcome) = oneshot::channel();
        let pending = Pending {
            received,
            encoded,
            reply,
        };
        if self.queue.send(pending).await.is_err() {
            return Err(ApiError::Unavailable("this node is shutting down".into()));
        }
        outcome.await.unwrap_or_else(|_| {
            Err(ApiError::Inconsistent(
                "this node shut down while the command was queued; it may still commit".into(),
            ))
        })
    }
}

/// Proposes what queued, one proposal at a time (holding `proposer`), until
/// every sender is gone or its owner stops it (the writes still queued then
/// are answered `Inconsistent`: their outcome is lost).
async fn run(
    raft: Raft,
    node_id: NodeId,
    mut queue: mpsc::Receiver<Pending>,
    stages: Arc<WriteStages>,
    proposer: Arc<Semaphore>,
) {
    while let Some(first) = queue.recv().await {
        let _permit = proposer
            .acquire()
            .await
            .expect("the proposer semaphore is never closed");
        let batched = stages.now();
        // Whatever queued while the previous proposal was in flight goes together.
        let mut size_bytes = first.encoded.len();
        let mut batch = vec![first];
        while batch.len() < BATCH_COMMANDS_MAX && size_bytes < BATCH_BYTES_MAX {
            match queue.try_recv() {
                Ok(p) => {
                    size_bytes += p.encoded.len();
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        let received: Vec<Option<Instant>> = batch.iter().map(|p| p.received).collect();
        let proposal = propose_batch(&raft, node_id, batch);
        propose_timed(&stages, received, batched, proposal, |index| *index).await;
    }
}

/// Awaits `proposal` (one entry: a lone write, or a batch) and records the stage times of
/// each of its writes, `received` when each arrived (`None` without stage timing), up to its
/// answer, with the index the entry was applied at (`index_of` finds it in the result).
async fn propose_timed<T>(
    stages: &WriteStages,
    received: impl IntoIterator<Item = Option<Instant>>,
    batched: Option<Instant>,
    proposal: impl Future<Output = T>,
    index_of: impl FnOnce(&T) -> Option<u64>,
) -> T {
    let proposed = stages.now();
    let result = proposal.await;
    let index = index_of(&result);
    for received in received.into_iter().flatten() {
        let times = WriteTimes {
            received,
            batched,
            proposed,
        };
        stages.record_answered(&times, index, 1);
    }
    result
}

/// The index a command was applied at, if it was.
fn applied_index(outcome: &Outcome) -> Option<u64> {
    outcome.as_ref().ok().map(|(index, _)| *index)
}

/// Proposes `batch` as one entry and sends every command its outcome;
/// returns the entry's index when it was applied.
///
/// Each command's request checked leadership when it arrived
/// (`RaftHandle::propose`); leadership may have moved while it queued, so the
/// entry is checked once more before it is proposed: `NotLeader` to every
/// command (certainly not in the log) rather than the `Inconsistent` that
/// openraft's refusal would mean after `client_write`.
async fn propose_batch(raft: &Raft, node_id: NodeId, mut batch: Vec<Pending>) -> Option<u64> {
    if let Err(not_leader) = require_leader(raft, node_id) {
        for p in batch {
            let _ = p.reply.send(Err(not_leader.clone()));
        }
        return None;
    }
    if batch.len() == 1 {
        let p = batch.pop().expect("one");
        let outcome = propose_entry(raft, p.encoded).await;
        let index = applied_index(&outcome);
        let _ = p.reply.send(outcome);
        return index;
    }
    let (encoded, replies): (Vec<Bytes>, Vec<oneshot::Sender<Outcome>>) =
        batch.into_iter().map(|p| (p.encoded, p.reply)).unzip();
    let count = encoded.len();
    match propose_entry(raft, Command::encode_batch(&encoded)).await {
        Ok((index, Applied::Batch(results))) => {
            assert_eq!(results.len(), count, "one outcome per batched command");
            for (result, reply) in results.into_iter().zip(replies) {
                let _ = reply.send(result.map(|a| (index, a)).map_err(ApiError::from));
            }
            Some(index)
        }
        Ok((index, other)) => {
            for reply in replies {
                let _ = reply.send(Err(ApiError::Internal(format!(
                    "batch at index {index} applied as {other:?}"
                ))));
            }
            None
        }
        Err(error) => {
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
            None
        }
    }
}
