//! Write batching: several client writes and deletes in one Raft entry, and a
//! bounded number of entries in flight.
//!
//! openraft 0.9 appends each `client_write` as its own entry, so writes
//! proposed one by one each pay for their own log append and durability
//! point, replication message, follower fsync and apply. Here at most
//! [`InFlight::proposals_max`] entries (`write_proposals_in_flight_max`, 1 by
//! default) and [`InFlight::bytes_max`] of their bytes are in flight at a
//! time: writes that arrive while every slot is taken wait and then go
//! together as one `Command::Batch` entry (up to [`BATCH_COMMANDS_MAX`]
//! commands or [`BATCH_BYTES_MAX`] encoded bytes). A write that finds a slot
//! free is proposed at once, as itself: batching adds no latency when there
//! is nothing to batch.
//!
//! Why one by default: on a 2-core machine that runs the three nodes and the
//! clients, more entries in flight make smaller entries, and the cost of an
//! entry (its append, its replication messages, the followers' syncs and
//! applies) is paid more often out of the same CPU. Measured with
//! `bench/scripts/pipeline.sh` (2026-11-30; `docs/benchmarks.md`, "Write
//! entries in flight"): at 64 clients, 1 in flight gave 9,236 writes/s, 2 gave
//! 7,101, 4 gave 6,254 and 8 gave 7,084, and the CPU per write rose from 142
//! to 185–225 µs. A machine whose disk syncs slowly, with cores to spare, may
//! do better with more.
//!
//! Semantics do not depend on the bound: the fsm applies a batch's commands in
//! order, each with its own outcome, all at the entry's index (their version
//! and their events' revision). An error of the proposal as a whole (not
//! leader, leadership lost, Raft stopped) is every command's error. Entries
//! the batcher task proposes are handed to the Raft core in the order they
//! were batched (`client_write_ff`), and each is answered on a task of its
//! own, which then gives its slot back.
//!
//! Each command is encoded once, by [`WriteBatcher::propose`] on the caller's
//! task; the batch entry is framed around those bytes
//! (`Command::encode_batch`), and a lone command's bytes are the entry.
//!
//! A slot is a permit of two semaphores, one counting entries and one their
//! bytes. A write that finds one free takes it and proposes itself on its own
//! task, with no hand-off to the batcher task and back (two task wake-ups
//! fewer per write when writes come one at a time). A write that finds none
//! queues; the batcher task waits for a slot with the first queued write in
//! hand, then takes everything queued into one entry. A released permit goes
//! to a waiting batcher before any new caller (the semaphores hand permits to
//! waiters first), so queued writes are never overtaken for long and never
//! stranded: whoever holds the slots, the batcher task is the one that drains
//! the queue. A leader transfer takes every slot ([`WriteBatcher::hold`]).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use cairn_fsm::{Applied, Command};
use cairn_proto::error::ApiError;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use super::leadership::{await_entry, propose_entry, require_leader, submit_entry, Submitted};
use super::stages::{WriteStages, WriteTimes};
use super::types::{NodeId, Raft};

/// At most this many commands per batch entry.
pub const BATCH_COMMANDS_MAX: usize = 256;
/// A batch stops growing once its commands' encoded size reaches this.
pub use crate::bounds::WRITE_BATCH_BYTES_MAX as BATCH_BYTES_MAX;
/// Writes waiting to be proposed; callers wait for room beyond this.
const QUEUE_MAX: usize = 8192;

type Outcome = Result<(u64, Applied), ApiError>;

/// How much a batcher keeps in flight (proposed, not yet answered): settings
/// `write_proposals_in_flight_max` and `write_proposal_bytes_in_flight_max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    /// Entries (lone writes or batches) proposed and not yet answered.
    pub proposals_max: usize,
    /// Their commands' encoded bytes; one entry larger than this goes alone.
    pub bytes_max: usize,
}

struct Pending {
    /// The command, encoded (`Command::encode`).
    encoded: Bytes,
    reply: oneshot::Sender<Outcome>,
    /// When the batcher received it (only with stage timing on).
    received: Option<Instant>,
}

/// Whom one entry's outcome goes to: a lone command, or each command of a batch.
enum Replies {
    One(oneshot::Sender<Outcome>),
    Batch(Vec<oneshot::Sender<Outcome>>),
}

/// One entry's room in flight, given back when it drops: a proposal, and its bytes.
struct Slot {
    _proposal: OwnedSemaphorePermit,
    _bytes: OwnedSemaphorePermit,
}

/// Submits writes and deletes; a background task proposes them. Cheap to
/// clone (a channel sender).
#[derive(Clone)]
pub struct WriteBatcher {
    queue: mpsc::Sender<Pending>,
    stages: Arc<WriteStages>,
    in_flight: InFlight,
    /// `in_flight.proposals_max` permits: one held per entry in flight.
    proposals: Arc<Semaphore>,
    /// `in_flight.bytes_max` permits: one per encoded byte in flight.
    bytes: Arc<Semaphore>,
    raft: Raft,
}

impl WriteBatcher {
    /// Starts the batcher task among `tasks` (it runs until they stop).
    pub fn start(
        raft: Raft,
        node_id: NodeId,
        stages: Arc<WriteStages>,
        in_flight: InFlight,
        tasks: &mut crate::tasks::Tasks,
    ) -> WriteBatcher {
        assert!(
            in_flight.proposals_max >= 1,
            "at least one proposal in flight"
        );
        assert!(
            in_flight.bytes_max >= 1 && in_flight.bytes_max <= u32::MAX as usize,
            "bytes in flight within a semaphore's u32 acquisition"
        );
        let (queue, receiver) = mpsc::channel(QUEUE_MAX);
        let batcher = WriteBatcher {
            queue,
            stages,
            in_flight,
            proposals: Arc::new(Semaphore::new(in_flight.proposals_max)),
            bytes: Arc::new(Semaphore::new(in_flight.bytes_max)),
            raft,
        };
        tasks.spawn("write batcher", batcher.clone().run(node_id, receiver));
        batcher
    }

    /// Holds every proposal of this batcher until the returned permit drops: those in
    /// flight finish first, and writes that arrive meanwhile queue. A leader transfer
    /// holds them: a leader that is to go quiet must send nothing, or every entry it
    /// replicates renews its followers' leases and they refuse the successor's votes.
    /// The writes held are proposed when it drops, each checked for leadership first
    /// (`submit_batch`): `NotLeader` once the successor leads.
    pub async fn hold(&self) -> OwnedSemaphorePermit {
        let all = u32::try_from(self.in_flight.proposals_max).expect("proposals_max fits u32");
        self.proposals
            .clone()
            .acquire_many_owned(all)
            .await
            .expect("the proposals semaphore is never closed")
    }

    /// The byte permits an entry of `size_bytes` takes: its size, or all of them for an
    /// entry larger than the bound (it then goes alone).
    fn bytes_permits(&self, size_bytes: usize) -> u32 {
        size_bytes.clamp(1, self.in_flight.bytes_max) as u32
    }

    /// Room for one more entry of `size_bytes` in flight, if there is some now.
    fn try_slot(&self, size_bytes: usize) -> Option<Slot> {
        let proposal = self.proposals.clone().try_acquire_owned().ok()?;
        let bytes = self
            .bytes
            .clone()
            .try_acquire_many_owned(self.bytes_permits(size_bytes))
            .ok()?;
        Some(Slot {
            _proposal: proposal,
            _bytes: bytes,
        })
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
        if let Some(_slot) = self.try_slot(encoded.len()) {
            // Room in flight: this write is an entry of its own, proposed here.
            // (Should the caller give up waiting, its slot goes with it while the
            // entry may still be in flight: one more proposal may then overlap
            // it, which openraft allows.)
            let batched = self.stages.now();
            let outcome = propose_entry(&self.raft, encoded).await;
            record_times(
                &self.stages,
                [received],
                batched,
                batched,
                applied_index(&outcome),
            );
            return outcome;
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

    /// Proposes what queued, up to `in_flight` at a time, until every sender is
    /// gone or its owner stops it (the writes still queued then are answered
    /// `Inconsistent`: their outcome is lost). Entries are handed to the Raft
    /// core here, one after another, so they enter the log in the order they
    /// were batched; their outcomes are awaited each on a task of its own,
    /// which gives the entry's slot back when it is answered.
    async fn run(self, node_id: NodeId, mut queue: mpsc::Receiver<Pending>) {
        while let Some(first) = queue.recv().await {
            let proposal = self
                .proposals
                .clone()
                .acquire_owned()
                .await
                .expect("the proposals semaphore is never closed");
            let batched = self.stages.now();
            // Whatever queued while the slots were taken goes together.
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
            let bytes = self
                .bytes
                .clone()
                .acquire_many_owned(self.bytes_permits(size_bytes))
                .await
                .expect("the bytes semaphore is never closed");
            let slot = Slot {
                _proposal: proposal,
                _bytes: bytes,
            };
            let received: Vec<Option<Instant>> = batch.iter().map(|p| p.received).collect();
            let proposed = self.stages.now();
            if let Some((submitted, replies)) = submit_batch(&self.raft, node_id, batch).await {
                let stages = self.stages.clone();
                tokio::spawn(async move {
                    let index = answer(await_entry(submitted).await, replies);
                    record_times(&stages, received, batched, proposed, index);
                    drop(slot);
                });
            }
        }
    }
}

/// Records the stage times of each write of one entry, `received` when each arrived
/// (`None` without stage timing), up to its answer, with the index the entry was
/// applied at.
fn record_times(
    stages: &WriteStages,
    received: impl IntoIterator<Item = Option<Instant>>,
    batched: Option<Instant>,
    proposed: Option<Instant>,
    index: Option<u64>,
) {
    for received in received.into_iter().flatten() {
        let times = WriteTimes {
            received,
            batched,
            proposed,
        };
        stages.record_answered(&times, index, 1);
    }
}

/// The index a command was applied at, if it was.
fn applied_index(outcome: &Outcome) -> Option<u64> {
    outcome.as_ref().ok().map(|(index, _)| *index)
}

/// Hands `batch` to the Raft core as one entry (a lone command as itself); `None`
/// when it was refused, its commands then answered.
///
/// Each command's request checked leadership when it arrived
/// (`RaftHandle::propose`); leadership may have moved while it queued, so the
/// entry is checked once more before it is proposed: `NotLeader` to every
/// command (certainly not in the log) rather than the `Inconsistent` that
/// openraft's refusal would mean once the entry is handed over.
async fn submit_batch(
    raft: &Raft,
    node_id: NodeId,
    mut batch: Vec<Pending>,
) -> Option<(Submitted, Replies)> {
    let (payload, replies) = if batch.len() == 1 {
        let p = batch.pop().expect("one");
        (p.encoded, Replies::One(p.reply))
    } else {
        let (encoded, replies): (Vec<Bytes>, Vec<oneshot::Sender<Outcome>>) =
            batch.into_iter().map(|p| (p.encoded, p.reply)).unzip();
        (Command::encode_batch(&encoded), Replies::Batch(replies))
    };
    let refused = match require_leader(raft, node_id) {
        Ok(()) => match submit_entry(raft, payload).await {
            Ok(submitted) => return Some((submitted, replies)),
            Err(stopped) => stopped,
        },
        Err(not_leader) => not_leader,
    };
    answer(Err(refused), replies);
    None
}

/// Sends each command of one entry its outcome; returns the entry's index when it was
/// applied.
fn answer(outcome: Outcome, replies: Replies) -> Option<u64> {
    let replies = match replies {
        Replies::One(reply) => {
            let index = applied_index(&outcome);
            let _ = reply.send(outcome);
            return index;
        }
        Replies::Batch(replies) => replies,
    };
    match outcome {
        Ok((index, Applied::Batch(results))) => {
            assert_eq!(
                results.len(),
                replies.len(),
                "one outcome per batched command"
            );
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
