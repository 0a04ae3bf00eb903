//! Read-index batching: many concurrent strong reads share one leadership
//! confirmation. The leader confirms its leadership with openraft
//! ([`confirm_with_raft`]); a follower runs a second batcher whose rounds ask
//! the leader for a read index (`crate::forward`).
//!
//! openraft's `get_read_log_id` confirms leadership by sending a heartbeat to
//! every voter and waiting for a quorum; doing that once per strong read costs
//! one round of peer RPCs (and a pass through every follower's Raft core) per
//! read. Here a read joins the *next* confirmation: requests queue while one is
//! in flight, and when it ends a single new confirmation serves every request
//! that queued meanwhile.
//!
//! Why this is still linearizable: a request is answered only from a
//! confirmation that *started after the request arrived* (the queue is taken
//! before the confirmation is sent, and a request never joins one already in
//! flight). That confirmation proves this node was leader at some moment after
//! the request began, and its read index is at least every index committed
//! before that moment; the caller then waits until it has applied that index.
//! This is the read-index protocol of the Raft thesis (§6.4) with the
//! heartbeat round shared, as etcd does for its ReadIndex requests.
//!
//! Must not: answer a request from a confirmation that began before it, or
//! drop a request silently (every queued sender gets the batch's outcome; a
//! request whose caller went away is simply not listened to).
//!
//! Concurrency: one mutex-guarded queue and one driver task for the life of
//! the node ([`ReadBatcher::drive`], owned by the agent's tasks), woken by a
//! `Notify` whenever a request queues.
//!
//! ## Invariants
//! - Every request pushed is served by a later loop of the driver (a
//!   `Notify` permit is stored when the driver is busy, so no wake-up is lost),
//!   or, once the driver is gone, answered Unavailable.
//! - A request is answered only by a confirmation started after it was pushed.

use std::sync::{Arc, Mutex, MutexGuard};

use cairn_proto::error::ApiError;
use tokio::sync::{oneshot, Notify};

use super::leadership::{fatal, leader_hint};
use super::types::Raft;

/// The outcome of one confirmation: the read index, or why it could not be
/// confirmed.
pub type Confirmation = Result<u64, ApiError>;

type Waiter = oneshot::Sender<Confirmation>;

#[derive(Default)]
struct Queue {
    waiting: Vec<Waiter>,
    /// The driver is gone: nothing queued will be confirmed.
    closed: bool,
}

/// Shares leadership confirmations among concurrent strong reads.
#[derive(Clone)]
pub struct ReadBatcher {
    queue: Arc<Mutex<Queue>>,
    queued: Arc<Notify>,
}

impl Default for ReadBatcher {
    fn default() -> Self {
        ReadBatcher::new()
    }
}

impl ReadBatcher {
    pub fn new() -> ReadBatcher {
        ReadBatcher {
            queue: Arc::new(Mutex::new(Queue::default())),
            queued: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The queue holds only senders and a flag, valid after a panic.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a leadership confirmation that started after this call, run
    /// by the driver ([`ReadBatcher::drive`]), and returns its outcome.
    pub async fn confirm(&self) -> Confirmation {
        let abandoned = || {
            Err(ApiError::Unavailable(
                "the read confirmation was abandoned (shutting down)".into(),
            ))
        };
        let (tx, rx) = oneshot::channel();
        {
            let mut queue = self.lock();
            if queue.closed {
                return abandoned();
            }
            queue.waiting.push(tx);
        }
        self.queued.notify_one();
        rx.await.unwrap_or_else(|_| abandoned())
    }

    /// The driver, for the life of the node: takes the queue, runs one
    /// confirmation for all of it (`confirm`: in production, openraft's
    /// `get_read_log_id` mapped to Cairn's errors), hands out the result, and
    /// waits for the next request when the queue is empty. Stopped by its
    /// owner; the requests still queued then are answered Unavailable.
    pub async fn drive<F, Fut>(self, confirm: F)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Confirmation>,
    {
        /// Closes the queue when the driver ends (stopped by its owner): the requests
        /// still queued, and any that come later, are answered at once.
        struct CloseOnDrop(ReadBatcher);
        impl Drop for CloseOnDrop {
            fn drop(&mut self) {
                let mut queue = self.0.lock();
                queue.closed = true;
                queue.waiting.clear();
            }
        }
        let _close = CloseOnDrop(self.clone());
        loop {
            self.queued.notified().await;
            loop {
                let batch = std::mem::take(&mut self.lock().waiting);
                if batch.is_empty() {
                    break;
                }
                // Taken before it starts: every request in `batch` arrived before
                // this confirmation began.
                let outcome = confirm().await;
                for waiter in batch {
                    let _ = waiter.send(outcome.clone());
                }
            }
        }
    }
}

/// One confirmation through openraft, with errors mapped as the node maps them.
pub async fn confirm_with_raft(raft: Raft) -> Confirmation {
    use openraft::error::{CheckIsLeaderError, RaftError};
    // openraft 0.9 restores a leader's role on restart in the same term, with
    // the committed index it last persisted, which can lag the entries it had
    // acknowledged before the crash (regression test:
    // `restarting_the_whole_cluster_after_kill_loses_nothing`). So the read
    // index is at least this leader's last log index when the confirmation
    // starts: every acknowledged write is in a leader's log, and waiting until
    // it is applied makes the read reflect it.
    let last_log_index = raft.metrics().borrow().last_log_index.unwrap_or(0);
    match raft.get_read_log_id().await {
        Ok((read, _applied)) => Ok(read.map(|l| l.index).unwrap_or(0).max(last_log_index)),
        Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
            Err(ApiError::NotLeader {
                hint: leader_hint(f.leader_id, f.leader_node),
            })
        }
        Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e))) => Err(
            ApiError::Inconsistent(format!("leadership not confirmed by a quorum: {e}")),
        ),
        Err(RaftError::Fatal(e)) => Err(fatal(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Duration;

    /// A fake confirmation: counts rounds, takes `delay`, answers with the
    /// round number as the read index.
    fn counting(
        rounds: Arc<AtomicU64>,
        delay: Duration,
    ) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Confirmation> + Send>>
           + Send
           + Sync
           + 'static {
        move || {
            let rounds = rounds.clone();
            Box::pin(async move {
                let round = rounds.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(delay).await;
                Ok(round)
            })
        }
    }

    /// A batcher whose driver runs `confirm`.
    fn driven<F, Fut>(confirm: F) -> ReadBatcher
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Confirmation> + Send + 'static,
    {
        let batcher = ReadBatcher::new();
        tokio::spawn(batcher.clone().drive(confirm));
        batcher
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_concurrent_reads_share_few_confirmations() {
        // 200 reads at once are served by far fewer than 200 quorum rounds.
        let rounds = Arc::new(AtomicU64::new(0));
        let batcher = driven(counting(rounds.clone(), Duration::from_millis(5)));
        let mut tasks = Vec::new();
        for _ in 0..200 {
            let b = batcher.clone();
            tasks.push(tokio::spawn(async move { b.confirm().await }));
        }
        for t in tasks {
            assert!(t.await.expect("task").is_ok());
        }
        let n = rounds.load(Ordering::SeqCst);
        assert!((1..=20).contains(&n), "{n} rounds for 200 reads");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_never_joins_a_confirmation_already_in_flight() {
        // A read that arrives while round 1 is in flight is answered by round 2.
        let rounds = Arc::new(AtomicU64::new(0));
        let batcher = driven(counting(rounds.clone(), Duration::from_millis(100)));
        let first = {
            let b = batcher.clone();
            tokio::spawn(async move { b.confirm().await })
        };
        while rounds.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let second = batcher.confirm().await;
        assert_eq!(first.await.expect("task"), Ok(1));
        assert_eq!(second, Ok(2));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_confirmation_fails_every_read_of_its_batch_and_the_next_batch_retries() {
        // An error reaches every waiter of its round; a later read gets a new round.
        let failing = Arc::new(AtomicBool::new(true));
        let f = failing.clone();
        let batcher = driven(move || {
            let fail = f.load(Ordering::SeqCst);
            async move {
                if fail {
                    Err(ApiError::Inconsistent("no quorum".into()))
                } else {
                    Ok(7)
                }
            }
        });
        let mut tasks = Vec::new();
        for _ in 0..10 {
            let b = batcher.clone();
            tasks.push(tokio::spawn(async move { b.confirm().await }));
        }
        for t in tasks {
            assert!(matches!(
                t.await.expect("task"),
                Err(ApiError::Inconsistent(_))
            ));
        }
        failing.store(false, Ordering::SeqCst);
        assert_eq!(batcher.confirm().await, Ok(7));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_queued_when_the_driver_is_stopped_is_answered_unavailable() {
        let batcher = ReadBatcher::new();
        let driver = tokio::spawn(batcher.clone().drive(std::future::pending::<Confirmation>));
        let read = {
            let b = batcher.clone();
            tokio::spawn(async move { b.confirm().await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        driver.abort();
        let _ = driver.await;
        // Whether the driver had taken it or not, the read hears Unavailable, and so does
        // every read after the driver is gone.
        assert!(matches!(
            read.await.expect("task"),
            Err(ApiError::Unavailable(_))
        ));
        assert!(matches!(
            batcher.confirm().await,
            Err(ApiError::Unavailable(_))
        ));
    }
}
