//! [`PrimingBarrier`]: one wait for many [`WatchCache`]s to be primed, as a
//! controller manager waits for every informer it reads before it starts
//! (Consul's controller runtime primes each cache in its own goroutine and
//! waits for all of them).
//!
//! Primed means a cache's first complete snapshot of every watched type is
//! in ([`WatchCache::wait_primed`]). It happens once: a later failure or
//! resync of a cache changes its status, never its primed flag, so a barrier
//! that was passed stays passed.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::error::{ClientError, Outcome};
use crate::WatchCache;

/// A registered cache: its registration number (from 1), its watched types,
/// and its primed flag.
struct Registered {
    number: usize,
    types: String,
    primed: watch::Receiver<bool>,
}

impl Registered {
    fn describe(&self) -> String {
        format!("#{} [{}]", self.number, self.types)
    }
}

/// Waits for every registered cache to be primed. Clones share the same
/// registrations.
///
/// A barrier does not keep a cache alive: a cache dropped before it primed
/// can never prime, and [`PrimingBarrier::wait`] reports it. A barrier with
/// no cache is passed at once.
#[derive(Clone, Default)]
pub struct PrimingBarrier {
    caches: Arc<Mutex<Vec<Registered>>>,
}

impl PrimingBarrier {
    pub fn new() -> PrimingBarrier {
        PrimingBarrier::default()
    }

    /// Adds `cache` to the caches waited for (one already primed counts as
    /// primed). Caches are named in errors by their registration number
    /// (from 1) and watched types.
    pub fn register(&self, cache: &WatchCache) {
        let mut caches = self.caches.lock();
        let number = caches.len() + 1;
        caches.push(Registered {
            number,
            types: cache.types_label(),
            primed: cache.primed_changes(),
        });
    }

    /// Whether every registered cache is primed now.
    pub fn is_primed(&self) -> bool {
        self.not_primed().is_empty()
    }

    /// Returns once every cache registered so far is primed. InvalidArgument
    /// (field `barrier`) if one of them was dropped before it primed: it
    /// never will.
    pub async fn wait(&self) -> Result<(), ClientError> {
        let waits: Vec<(String, watch::Receiver<bool>)> = self
            .caches
            .lock()
            .iter()
            .map(|c| (c.describe(), c.primed.clone()))
            .collect();
        for (name, mut primed) in waits {
            // Checks the current value before it waits, so a cache primed
            // and then dropped counts as primed.
            if primed.wait_for(|p| *p).await.is_err() {
                return Err(ClientError::invalid(
                    "barrier",
                    format!("cache {name} was dropped before it was primed"),
                ));
            }
        }
        Ok(())
    }

    /// As [`PrimingBarrier::wait`], for at most `timeout`: then
    /// DeadlineExceeded, naming every cache not yet primed (registration
    /// number and watched types).
    pub async fn wait_timeout(&self, timeout: Duration) -> Result<(), ClientError> {
        match tokio::time::timeout(timeout, self.wait()).await {
            Ok(waited) => waited,
            Err(_) => Err(ClientError::DeadlineExceeded {
                deadline_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                detail: format!("caches not yet primed: {}", self.not_primed().join(", ")),
                outcome: Outcome::NotApplied,
            }),
        }
    }

    /// The registered caches not primed now, described.
    fn not_primed(&self) -> Vec<String> {
        self.caches
            .lock()
            .iter()
            .filter(|c| !*c.primed.borrow())
            .map(Registered::describe)
            .collect()
    }
}
