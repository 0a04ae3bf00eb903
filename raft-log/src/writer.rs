//! The writer thread: the only place that mutates the engine. It applies requests in the order
//! they were sent, groups every request already queued into one durability point (group
//! commit), and fires the durability callbacks only after that point.

use std::sync::mpsc;
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::engine::LogEngine;
use crate::watermark::Watermark;
use crate::LogError;

/// Called once the entries of an append are durable (`Ok`) or can no longer become durable
/// (`Err`). Runs on the writer thread: it must not block.
pub type DurableCallback = Box<dyn FnOnce(Result<(), std::io::Error>) + Send + 'static>;

/// A reply slot for a request.
pub(crate) type Reply = oneshot::Sender<Result<(), LogError>>;

/// At most this many queued requests share one durability point, to bound the latency of the
/// first one.
const GROUP_REQUESTS_MAX: usize = 1024;

/// Metadata key of the vote.
pub(crate) const META_VOTE: &str = "vote";
/// Metadata key of the last purged log id.
pub(crate) const META_PURGED: &str = "purged";
/// Metadata key of the committed log id.
pub(crate) const META_COMMITTED: &str = "committed";

/// One mutation, sent to the writer thread.
pub(crate) enum Request {
    /// Store `entries` (contiguous, sealed); reply on `applied` once they are readable, call
    /// `on_durable` once they are durable.
    Append {
        entries: Vec<(u64, Vec<u8>)>,
        applied: Reply,
        on_durable: DurableCallback,
    },
    /// Delete every entry with index `>= from_index`; reply once durable.
    Truncate { from_index: u64, done: Reply },
    /// Persist and sync the purge point, then delete every entry with index `<= through_index`.
    Purge {
        through_index: u64,
        sealed_purged: Vec<u8>,
        done: Reply,
    },
    /// Store one metadata value; reply once durable if `durable`, else once applied.
    PutMeta {
        key: &'static str,
        sealed: Vec<u8>,
        durable: bool,
        done: Reply,
    },
}

/// Someone waiting for the next durability point.
enum Waiter {
    Callback(DurableCallback),
    Reply(Reply),
}

impl Waiter {
    fn release(self, result: &Result<(), String>) {
        match (self, result) {
            (Waiter::Callback(callback), Ok(())) => callback(Ok(())),
            (Waiter::Callback(callback), Err(reason)) => {
                callback(Err(std::io::Error::other(reason.clone())))
            }
            (Waiter::Reply(reply), Ok(())) => {
                let _ = reply.send(Ok(()));
            }
            (Waiter::Reply(reply), Err(reason)) => {
                let _ = reply.send(Err(LogError::Poisoned {
                    reason: reason.clone(),
                }));
            }
        }
    }
}

/// State owned by the writer thread.
pub(crate) struct Writer {
    engine: Arc<dyn LogEngine>,
    /// Index of the last stored entry.
    last_index: Option<u64>,
    /// Index of the last purged entry.
    purged_index: Option<u64>,
    /// Set after a failed write or sync: the on-disk state is unknown.
    poisoned: Option<String>,
    /// Lower bound of the durable last log index, for detecting silent engine data loss.
    watermark: Watermark,
}

impl Writer {
    pub(crate) fn new(
        engine: Arc<dyn LogEngine>,
        last_index: Option<u64>,
        purged_index: Option<u64>,
        watermark: Watermark,
    ) -> Writer {
        if let (Some(last), Some(purged)) = (last_index, purged_index) {
            assert!(
                purged < last,
                "purged index {purged} must be below the last index {last}"
            );
        }
        Writer {
            engine,
            last_index,
            purged_index,
            poisoned: None,
            watermark,
        }
    }

    /// Runs until every sender is dropped.
    pub(crate) fn run(mut self, requests: mpsc::Receiver<Request>) {
        while let Ok(first) = requests.recv() {
            let mut group = vec![first];
            while group.len() < GROUP_REQUESTS_MAX {
                match requests.try_recv() {
                    Ok(request) => group.push(request),
                    Err(_) => break,
                }
            }
            let mut waiters = Vec::new();
            for request in group {
                self.handle(request, &mut waiters);
            }
            self.durability_point(waiters);
        }
        tracing::debug!("raft-log writer thread stops: every handle is dropped");
    }

    fn poison(&mut self, error: &LogError) {
        if self.poisoned.is_none() {
            tracing::error!(%error, "raft log store poisoned");
            self.poisoned = Some(error.to_string());
        }
    }

    /// Syncs the engine and releases `waiters`; a failed sync poisons the store.
    fn durability_point(&mut self, waiters: Vec<Waiter>) {
        if waiters.is_empty() {
            return;
        }
        let result = match &self.poisoned {
            Some(reason) => Err(reason.clone()),
            None => match self.engine.sync() {
                Ok(()) => {
                    // After the durability point, never before: the watermark must not claim
                    // more than is durable.
                    if let Err(error) = self
                        .watermark
                        .advance(self.last_index.or(self.purged_index))
                    {
                        tracing::warn!(%error, "cannot advance the raft log watermark");
                    }
                    Ok(())
                }
                Err(error) => {
                    self.poison(&error);
                    Err(error.to_string())
                }
            },
        };
        for waiter in waiters {
            waiter.release(&result);
        }
    }

    fn handle(&mut self, request: Request, waiters: &mut Vec<Waiter>) {
        if let Some(reason) = &self.poisoned {
            let error = || LogError::Poisoned {
                reason: reason.clone(),
            };
            match request {
                Request::Append { applied, .. } => {
                    let _ = applied.send(Err(error()));
                }
                Request::Truncate { done, .. }
                | Request::Purge { done, .. }
                | Request::PutMeta { done, .. } => {
                    let _ = done.send(Err(error()));
                }
            }
            return;
        }
        match request {
            Request::Append {
                mut entries,
                applied,
                on_durable,
            } => {
                // Entries at or below the purge point are covered by the snapshot: not stored.
                if let Some(purged) = self.purged_index {
                    entries.retain(|(index, _)| *index > purged);
                }
                if let Some(&(first_index, _)) = entries.first() {
                    let expected_index = self.last_index.or(self.purged_index).map(|i| i + 1);
                    if let Some(expected_index) = expected_index {
                        if first_index > expected_index {
                            // A hole: refused before anything is written.
                            let _ = applied.send(Err(LogError::NonContiguousAppend {
                                expected_index,
                                got_index: first_index,
                            }));
                            return;
                        }
                    }
                    for pair in entries.windows(2) {
                        assert_eq!(pair[0].0 + 1, pair[1].0, "append batch must be contiguous");
                    }
                    if self.last_index.is_some_and(|last| first_index <= last) {
                        // Overlap: the new entries replace the tail from their first index.
                        if let Err(error) = self.engine.delete_entries_from(first_index) {
                            self.poison(&error);
                            let _ = applied.send(Err(error));
                            return;
                        }
                    }
                    if let Err(error) = self.engine.put_entries(&entries) {
                        self.poison(&error);
                        let _ = applied.send(Err(error));
                        return;
                    }
                    let last_index = entries.last().map(|(index, _)| *index);
                    assert!(last_index >= Some(first_index));
                    assert!(self.purged_index.is_none_or(|purged| purged < first_index));
                    self.last_index = last_index;
                }
                let _ = applied.send(Ok(()));
                waiters.push(Waiter::Callback(on_durable));
            }
            Request::Truncate { from_index, done } => {
                // The watermark comes down (durably) before the entries go.
                if let Err(error) = self.watermark.lower_durably(from_index.checked_sub(1)) {
                    self.poison(&error);
                    let _ = done.send(Err(error));
                    return;
                }
                if let Err(error) = self.engine.delete_entries_from(from_index) {
                    self.poison(&error);
                    let _ = done.send(Err(error));
                    return;
                }
                match self.refresh_last_index() {
                    Ok(()) => {
                        assert!(self.last_index.is_none_or(|last| last < from_index));
                        waiters.push(Waiter::Reply(done));
                    }
                    Err(error) => {
                        let _ = done.send(Err(error));
                    }
                }
            }
            Request::Purge {
                through_index,
                sealed_purged,
                done,
            } => {
                if self
                    .purged_index
                    .is_some_and(|purged| purged >= through_index)
                {
                    // Already purged at least this far: openraft never moves the purge point back.
                    let _ = done.send(Ok(()));
                    return;
                }
                // 1. The purge point, durable (with everything before it) before any deletion.
                if let Err(error) = self.engine.put_meta(META_PURGED, &sealed_purged) {
                    self.poison(&error);
                    let _ = done.send(Err(error));
                    return;
                }
                self.durability_point(std::mem::take(waiters));
                if let Some(reason) = &self.poisoned {
                    let _ = done.send(Err(LogError::Poisoned {
                        reason: reason.clone(),
                    }));
                    return;
                }
                self.purged_index = Some(through_index);
                // 2. Then the entries; their deletion becomes durable with the next sync.
                if let Err(error) = self.engine.delete_entries_through(through_index) {
                    self.poison(&error);
                    let _ = done.send(Err(error));
                    return;
                }
                match self.refresh_last_index() {
                    Ok(()) => {
                        assert!(self.last_index.is_none_or(|last| last > through_index));
                        let _ = done.send(Ok(()));
                    }
                    Err(error) => {
                        let _ = done.send(Err(error));
                    }
                }
            }
            Request::PutMeta {
                key,
                sealed,
                durable,
                done,
            } => {
                if let Err(error) = self.engine.put_meta(key, &sealed) {
                    self.poison(&error);
                    let _ = done.send(Err(error));
                    return;
                }
                if durable {
                    waiters.push(Waiter::Reply(done));
                } else {
                    let _ = done.send(Ok(()));
                }
            }
        }
    }

    fn refresh_last_index(&mut self) -> Result<(), LogError> {
        match self.engine.last_entry() {
            Ok(last) => {
                self.last_index = last.map(|(index, _)| index);
                Ok(())
            }
            Err(error) => {
                self.poison(&error);
                Err(error)
            }
        }
    }
}
