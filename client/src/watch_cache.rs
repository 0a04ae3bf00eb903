//! [`WatchCache`]: an in-memory copy of one or several types, kept from
//! WatchList streams, with a primed barrier, resync after failures, and
//! ordered, duplicate-free, never-rewinding callbacks.
//!
//! ## How it stays right
//!
//! One task per watched type ([`WatchSpec`]) owns that type's stream and its
//! *revision* R (the last revision it applied). It:
//! 1. opens a watch with a snapshot, buffers the snapshot's Upserts, and at
//!    EndOfSnapshot applies the whole snapshot at once (mark and sweep);
//! 2. then applies live Upserts and Deletes one by one, advancing R;
//! 3. when the stream ends (WatchClosed, dropped connection, node gone), it
//!    re-watches *from R* (`start_revision = R`): the node replays every
//!    change after R, so nothing is lost and nothing repeats;
//! 4. when the node no longer has that history (Compacted, as after a
//!    restore), it takes a fresh snapshot and sweeps: every cached key of the
//!    type that the snapshot lacks gets a Delete.
//!
//! Snapshots are taken STRONG by default ([`WatchCacheOptions::snapshot_consistency`]):
//! the node, leader or follower, opens the watch at a revision no older than a
//! quorum-confirmed read index, so a primed cache holds every write
//! acknowledged before it asked; a controller acting on it never rewinds a
//! resource to a state older than one it, or anyone, was told was written.
//! A fresh snapshot older than R (an EVENTUAL snapshot from a follower that
//! lags behind the node the cache read before) is discarded and taken again,
//! from the next endpoint, after a pause: showing it would move resources
//! back in time.
//!
//! Each change also passes a per-key check before it reaches the table and
//! the subscribers: versions are decimal log indices, compared numerically;
//! an Upsert whose version is not above the cached one is a duplicate or
//! stale and is dropped; a Delete older than the cached resource is dropped.
//! The only exception is a fresh snapshot (itself at or after R) holding a
//! key at a lower version than cached, which can only follow the restore of
//! an older backup: the cache follows the store, presenting it as the end of
//! the old lifetime (Delete) then a new one (Upsert).
//!
//! ## Concurrency
//!
//! The type tasks apply changes under two locks, always taken in this order:
//! `dispatch` (the subscriber list; held while callbacks run, so callbacks of
//! all types are serialised and each type's are in stream order), then
//! `table` (held only to update the maps, never during callbacks). Readers
//! (`get`, `list`) take only `table`, so a callback may read the cache; it
//! must not call [`WatchCache::subscribe`] (that would wait for itself).

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use cairn_proto::v1::{Consistency, Id, Resource, Tenancy, Type, WatchListRequest};
use parking_lot::{Mutex, RwLock};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{EventKind, ResourceApi};
use crate::error::ClientError;

/// What one watch of the cache selects: an unversioned type (group + kind),
/// a tenancy in which `*` matches any value, and a name prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSpec {
    /// Only `group` and `kind` are used.
    pub type_: Type,
    pub tenancy: Tenancy,
    pub name_prefix: String,
}

impl WatchSpec {
    /// Every resource of `group` + `kind`, in every tenancy.
    pub fn new(group: impl Into<String>, kind: impl Into<String>) -> WatchSpec {
        WatchSpec {
            type_: Type {
                group: group.into(),
                group_version: String::new(),
                kind: kind.into(),
            },
            tenancy: Tenancy {
                partition: "*".into(),
                namespace: "*".into(),
            },
            name_prefix: String::new(),
        }
    }

    pub fn with_tenancy(mut self, tenancy: Tenancy) -> WatchSpec {
        self.tenancy = tenancy;
        self
    }

    pub fn with_name_prefix(mut self, name_prefix: impl Into<String>) -> WatchSpec {
        self.name_prefix = name_prefix.into();
        self
    }
}

/// Where the cache stands (as Calico's syncer reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CacheStatus {
    /// At least one type has no open watch (not connected yet, or
    /// reconnecting after a failure).
    WaitingForDatastore,
    /// Every type has a watch open, and at least one is receiving a snapshot.
    ResyncInProgress,
    /// Every type is live: its snapshot applied, or its history replayed.
    InSync,
}

/// A change delivered to subscribers.
#[derive(Debug, Clone, PartialEq)]
pub enum CacheEvent {
    /// A resource appeared or changed (a higher version than before).
    Upsert(Arc<Resource>),
    /// A resource is gone; carries it as last known.
    Delete(Arc<Resource>),
}

impl CacheEvent {
    pub fn resource(&self) -> &Arc<Resource> {
        match self {
            CacheEvent::Upsert(r) | CacheEvent::Delete(r) => r,
        }
    }
}

/// Counters of what the cache has done, for tests and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Snapshots applied (the first one of each type included).
    pub snapshots_applied: u64,
    /// Re-watches that replayed history from the cache's revision.
    pub replays: u64,
    /// Snapshots discarded because they were older than the cache.
    pub stale_snapshots_discarded: u64,
    /// Re-watches refused with Compacted (each followed by a snapshot).
    pub compacted: u64,
    /// Changes dropped by the per-key check (duplicates, stale events).
    pub events_dropped: u64,
}

/// Settings of a [`WatchCache`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchCacheOptions {
    /// Pause after a failed watch, doubling up to `retry_backoff_max`; reset
    /// by every event received.
    pub retry_backoff_initial: Duration,
    pub retry_backoff_max: Duration,
    /// The consistency of every snapshot the cache takes (when it primes, and
    /// when it resyncs after Compacted). STRONG (the default): the snapshot
    /// holds every write acknowledged before the watch was opened. EVENTUAL:
    /// whatever the node applied, cheaper, possibly older. A watch resumed
    /// from the cache's revision replays every change after it either way.
    pub snapshot_consistency: Consistency,
}

impl Default for WatchCacheOptions {
    fn default() -> WatchCacheOptions {
        WatchCacheOptions {
            retry_backoff_initial: Duration::from_millis(50),
            retry_backoff_max: Duration::from_secs(2),
            snapshot_consistency: Consistency::Strong,
        }
    }
}

/// Identifies a subscription, to end it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SubscriptionId(u64);

/// The storage key: (group, kind, partition, namespace, name).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceKey {
    pub group: String,
    pub kind: String,
    pub partition: String,
    pub namespace: String,
    pub name: String,
}

impl ResourceKey {
    pub fn of_id(id: &Id) -> ResourceKey {
        let t = id.r#type.clone().unwrap_or_default();
        let ten = id.tenancy.clone().unwrap_or_default();
        ResourceKey {
            group: t.group,
            kind: t.kind,
            partition: ten.partition,
            namespace: ten.namespace,
            name: id.name.clone(),
        }
    }

    pub fn of(resource: &Resource) -> ResourceKey {
        ResourceKey::of_id(resource.id.as_ref().unwrap_or(&Id::default()))
    }
}

type Callback = Box<dyn FnMut(&CacheEvent) + Send>;

/// Per-type state of a watch, for the status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TypeStatus {
    NoWatch,
    Snapshot,
    Live,
}

struct Table {
    /// One map per spec (specs have distinct group + kind, so a key belongs
    /// to exactly one map).
    maps: Vec<BTreeMap<ResourceKey, Arc<Resource>>>,
    type_status: Vec<TypeStatus>,
    primed: Vec<bool>,
    stats: CacheStats,
}

struct Dispatch {
    subscribers: Vec<(SubscriptionId, Callback)>,
    next_id: u64,
}

struct Shared {
    specs: Vec<WatchSpec>,
    /// Lock order: `dispatch`, then `table`.
    dispatch: Mutex<Dispatch>,
    table: RwLock<Table>,
    status: watch::Sender<CacheStatus>,
    primed: watch::Sender<bool>,
}

/// An in-memory cache of one or several types. See the module docs. Dropping
/// it stops its tasks.
pub struct WatchCache {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for WatchCache {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl WatchCache {
    /// Starts watching `specs` through `client` (inside a Tokio runtime:
    /// outside one this is InvalidArgument): any [`ResourceApi`], the remote
    /// [`crate::Client`] or an embedded node's in-process client. Two specs
    /// with the same group and kind are rejected: each key must belong to one
    /// watch, or a sweep of one would delete what the other holds.
    pub fn start(
        client: impl ResourceApi,
        specs: Vec<WatchSpec>,
        options: WatchCacheOptions,
    ) -> Result<WatchCache, ClientError> {
        WatchCache::start_with(client, specs, options, Vec::new())
    }

    /// As [`WatchCache::start`], with subscribers registered before the first
    /// event, so they see everything from the initial snapshot on.
    pub fn start_with(
        client: impl ResourceApi,
        specs: Vec<WatchSpec>,
        options: WatchCacheOptions,
        subscribers: Vec<Callback>,
    ) -> Result<WatchCache, ClientError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ClientError::invalid(
                "runtime",
                "a WatchCache must be started inside a Tokio runtime",
            ));
        }
        if specs.is_empty() {
            return Err(ClientError::invalid(
                "specs",
                "at least one type to watch is required",
            ));
        }
        for (i, s) in specs.iter().enumerate() {
            if s.type_.group.is_empty() || s.type_.kind.is_empty() {
                return Err(ClientError::invalid(
                    format!("specs[{i}].type"),
                    "group and kind are required",
                ));
            }
            if specs[..i]
                .iter()
                .any(|o| o.type_.group == s.type_.group && o.type_.kind == s.type_.kind)
            {
                return Err(ClientError::invalid(
                    format!("specs[{i}].type"),
                    "watched twice: one watch per group and kind",
                ));
            }
        }
        let client: Arc<dyn ResourceApi> = Arc::new(client);
        let n = specs.len();
        let (status, _) = watch::channel(CacheStatus::WaitingForDatastore);
        let (primed, _) = watch::channel(false);
        let mut dispatch = Dispatch {
            subscribers: Vec::new(),
            next_id: 0,
        };
        for callback in subscribers {
            let id = SubscriptionId(dispatch.next_id);
            dispatch.next_id += 1;
            dispatch.subscribers.push((id, callback));
        }
        let shared = Arc::new(Shared {
            specs,
            dispatch: Mutex::new(dispatch),
            table: RwLock::new(Table {
                maps: vec![BTreeMap::new(); n],
                type_status: vec![TypeStatus::NoWatch; n],
                primed: vec![false; n],
                stats: CacheStats::default(),
            }),
            status,
            primed,
        });
        let tasks = (0..n)
            .map(|index| {
                let watcher = TypeWatcher {
                    shared: shared.clone(),
                    client: client.clone(),
                    index,
                    options: options.clone(),
                };
                tokio::spawn(watcher.run())
            })
            .collect();
        Ok(WatchCache { shared, tasks })
    }

    /// Returns once every watched type has delivered its EndOfSnapshot and
    /// the snapshot is in the cache (and its callbacks have run). After that
    /// the cache is never half-filled: later resyncs replace a type's
    /// contents atomically.
    pub async fn wait_primed(&self) {
        let mut primed = self.shared.primed.subscribe();
        // The sender lives in `shared`, which `self` holds: the wait ends
        // only by priming.
        let _ = primed.wait_for(|p| *p).await;
    }

    /// Whether [`WatchCache::wait_primed`] would return at once.
    pub fn is_primed(&self) -> bool {
        *self.shared.primed.borrow()
    }

    /// The current status.
    pub fn status(&self) -> CacheStatus {
        *self.shared.status.borrow()
    }

    /// A receiver of status changes.
    pub fn status_changes(&self) -> watch::Receiver<CacheStatus> {
        self.shared.status.subscribe()
    }

    /// Counters of resyncs, replays and dropped events.
    pub fn stats(&self) -> CacheStats {
        self.shared.table.read().stats.clone()
    }

    /// The cached resource at `id`'s key (a non-empty `id.uid` must match).
    pub fn get(&self, id: &Id) -> Option<Arc<Resource>> {
        let key = ResourceKey::of_id(id);
        let table = self.shared.table.read();
        let index = self.spec_of(&key.group, &key.kind)?;
        let found = table.maps[index].get(&key)?.clone();
        let uid_matches = id.uid.is_empty() || found.id.as_ref().is_some_and(|i| i.uid == id.uid);
        uid_matches.then_some(found)
    }

    /// Every cached resource of the watched type `group` + `kind`, in key order.
    pub fn list(&self, group: &str, kind: &str) -> Vec<Arc<Resource>> {
        let table = self.shared.table.read();
        match self.spec_of(group, kind) {
            Some(index) => table.maps[index].values().cloned().collect(),
            None => Vec::new(),
        }
    }

    /// How many resources are cached, all types together.
    pub fn len(&self) -> usize {
        self.shared
            .table
            .read()
            .maps
            .iter()
            .map(BTreeMap::len)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Registers a callback. It first receives an Upsert for every resource
    /// cached now, then every change, in order, never a duplicate. Callbacks
    /// run on the cache's tasks: keep them short, and do not call `subscribe`
    /// from one. A callback that panics is unsubscribed.
    pub fn subscribe(&self, callback: impl FnMut(&CacheEvent) + Send + 'static) -> SubscriptionId {
        let mut callback: Callback = Box::new(callback);
        let mut dispatch = self.shared.dispatch.lock();
        let current: Vec<Arc<Resource>> = {
            let table = self.shared.table.read();
            table
                .maps
                .iter()
                .flat_map(|m| m.values().cloned())
                .collect()
        };
        let mut healthy = true;
        for r in current {
            let event = CacheEvent::Upsert(r);
            if catch_unwind(AssertUnwindSafe(|| callback(&event))).is_err() {
                healthy = false;
                break;
            }
        }
        let id = SubscriptionId(dispatch.next_id);
        dispatch.next_id += 1;
        if healthy {
            dispatch.subscribers.push((id, callback));
        }
        id
    }

    /// Ends a subscription; returns whether it existed.
    pub fn unsubscribe(&self, id: SubscriptionId) -> bool {
        let mut dispatch = self.shared.dispatch.lock();
        let before = dispatch.subscribers.len();
        dispatch.subscribers.retain(|(i, _)| *i != id);
        dispatch.subscribers.len() != before
    }

    fn spec_of(&self, group: &str, kind: &str) -> Option<usize> {
        self.shared
            .specs
            .iter()
            .position(|s| s.type_.group == group && s.type_.kind == kind)
    }
}

/// A version as a number; `None` for a version that is not a log index.
fn version_number(r: &Resource) -> Option<u64> {
    r.version.parse().ok()
}

/// Whether `new` is a later state of the key than `old` (same lifetime or
/// not: versions are log indices, global to the cluster). A version that is
/// not a number counts as later when it differs.
fn is_later(new: &Resource, old: &Resource) -> bool {
    match (version_number(new), version_number(old)) {
        (Some(n), Some(o)) => n > o,
        _ => new.version != old.version,
    }
}

fn uid_of(r: &Resource) -> &str {
    r.id.as_ref().map(|i| i.uid.as_str()).unwrap_or("")
}

/// The events that turn `old` into `new` at one key when a fresh snapshot
/// says the key holds `new` (which is the truth at the snapshot's revision,
/// at or after the cache's).
fn snapshot_transition(old: Option<&Arc<Resource>>, new: &Arc<Resource>) -> Vec<CacheEvent> {
    match old {
        None => vec![CacheEvent::Upsert(new.clone())],
        Some(o) if uid_of(o) == uid_of(new) && o.version == new.version => Vec::new(),
        Some(o) if uid_of(o) == uid_of(new) && is_later(new, o) => {
            vec![CacheEvent::Upsert(new.clone())]
        }
        // Another lifetime, or (only after an older backup was restored) a
        // lower version: end the old one, start the new one.
        Some(o) => vec![
            CacheEvent::Delete(o.clone()),
            CacheEvent::Upsert(new.clone()),
        ],
    }
}

/// One type's watch loop.
struct TypeWatcher {
    shared: Arc<Shared>,
    client: Arc<dyn ResourceApi>,
    index: usize,
    options: WatchCacheOptions,
}

/// How a stream ended, and so how to watch again.
enum Rewatch {
    /// From the cache's revision (replay), or a snapshot if there is none yet.
    FromRevision,
    /// With a fresh snapshot (the history is gone, or the stream misbehaved).
    FreshSnapshot,
}

impl TypeWatcher {
    async fn run(self) {
        let spec = self.shared.specs[self.index].clone();
        // The last revision applied to this type's map; `None` before the
        // first snapshot.
        let mut revision: Option<u64> = None;
        let mut fresh = true;
        let mut backoff = self.options.retry_backoff_initial;
        loop {
            // Resumed just before the last revision seen; the changes of it
            // already applied are dropped by key and version (`apply_live`).
            let start_revision = match (fresh, revision) {
                (false, Some(r)) => crate::watch_resume_revision(r),
                _ => 0,
            };
            let consistency = match start_revision {
                0 => self.options.snapshot_consistency,
                _ => Consistency::Eventual,
            };
            let request = WatchListRequest {
                r#type: Some(spec.type_.clone()),
                tenancy: Some(spec.tenancy.clone()),
                name_prefix: spec.name_prefix.clone(),
                start_revision,
                consistency: consistency as i32,
            };
            let mut stream = match self.client.watch_list(request).await {
                Ok(stream) => stream,
                Err(ClientError::Compacted { .. }) => {
                    self.shared.table.write().stats.compacted += 1;
                    fresh = true;
                    continue;
                }
                Err(e) => {
                    tracing::debug!(error = %e, kind = %spec.type_.kind, "watch cache: cannot open a watch");
                    self.set_type_status(TypeStatus::NoWatch);
                    self.sleep(&mut backoff).await;
                    continue;
                }
            };
            if start_revision == 0 {
                self.set_type_status(TypeStatus::Snapshot);
            } else {
                self.shared.table.write().stats.replays += 1;
                self.set_type_status(TypeStatus::Live);
            }
            let mut staged: Option<Vec<Arc<Resource>>> = (start_revision == 0).then(Vec::new);
            let next = loop {
                let event = match stream.next().await {
                    Some(Ok(event)) => event,
                    Some(Err(ClientError::Compacted { .. })) => {
                        self.shared.table.write().stats.compacted += 1;
                        break Rewatch::FreshSnapshot;
                    }
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, kind = %spec.type_.kind, "watch cache: watch ended");
                        break Rewatch::FromRevision;
                    }
                    None => break Rewatch::FromRevision,
                };
                if staged.is_none() {
                    // Live events flow: the watch works again.
                    backoff = self.options.retry_backoff_initial;
                }
                let event_revision = event.revision;
                match (event.kind, staged.as_mut()) {
                    (EventKind::Upsert(r), Some(buffer)) => buffer.push(r),
                    (EventKind::EndOfSnapshot, Some(_)) => {
                        let snapshot = staged.take().unwrap_or_default();
                        if revision.is_some_and(|r| event_revision < r) {
                            // A node behind what the cache already showed:
                            // try another one after a pause.
                            self.shared.table.write().stats.stale_snapshots_discarded += 1;
                            self.client.avoid(stream.source());
                            break Rewatch::FreshSnapshot;
                        }
                        self.apply_snapshot(snapshot);
                        backoff = self.options.retry_backoff_initial;
                        revision = Some(event_revision);
                        fresh = false;
                        self.set_type_status(TypeStatus::Live);
                        self.mark_primed();
                    }
                    (EventKind::Upsert(r), None) => {
                        // Older than what the map shows: a replay overlap.
                        // (Equal: another change of the same entry, or a
                        // replayed one, which `apply_live` drops.)
                        if revision.is_some_and(|r| event_revision < r) {
                            self.count_dropped();
                            continue;
                        }
                        self.apply_live(CacheEvent::Upsert(r));
                        revision = Some(event_revision);
                    }
                    (EventKind::Delete(r), None) => {
                        // Older than what the map shows: a replay overlap.
                        // (Equal: another change of the same entry, or a
                        // replayed one, which `apply_live` drops.)
                        if revision.is_some_and(|r| event_revision < r) {
                            self.count_dropped();
                            continue;
                        }
                        self.apply_live(CacheEvent::Delete(r));
                        revision = Some(event_revision);
                    }
                    (EventKind::Progress, None) => {
                        revision = Some(revision.map_or(event_revision, |r| r.max(event_revision)));
                    }
                    (EventKind::Progress, Some(_)) => {}
                    (EventKind::Delete(_), Some(_)) | (EventKind::EndOfSnapshot, None) => {
                        // Not a stream the contract allows: start over cleanly.
                        tracing::warn!(kind = %spec.type_.kind, "watch cache: unexpected event order; resyncing");
                        break Rewatch::FreshSnapshot;
                    }
                }
            };
            self.set_type_status(TypeStatus::NoWatch);
            if let Rewatch::FreshSnapshot = next {
                fresh = true;
            }
            self.sleep(&mut backoff).await;
        }
    }

    async fn sleep(&self, backoff: &mut Duration) {
        tokio::time::sleep(*backoff).await;
        *backoff = (*backoff * 2).min(self.options.retry_backoff_max);
    }

    fn count_dropped(&self) {
        self.shared.table.write().stats.events_dropped += 1;
    }

    /// Replaces this type's map with a complete snapshot; emits Upserts for
    /// what is new or newer and Deletes for every key the snapshot lacks.
    fn apply_snapshot(&self, snapshot: Vec<Arc<Resource>>) {
        let mut dispatch = self.shared.dispatch.lock();
        let events = {
            let mut table = self.shared.table.write();
            let old = std::mem::take(&mut table.maps[self.index]);
            let mut next = BTreeMap::new();
            let mut events = Vec::new();
            for r in snapshot {
                let key = ResourceKey::of(&r);
                let previous = old.get(&key);
                let changes = snapshot_transition(previous, &r);
                // An unchanged resource keeps its cached Arc.
                let value = match (previous, changes.is_empty()) {
                    (Some(p), true) => p.clone(),
                    _ => r,
                };
                events.extend(changes);
                let duplicate = next.insert(key, value);
                assert!(duplicate.is_none(), "a snapshot holds each key once");
            }
            for (key, r) in &old {
                if !next.contains_key(key) {
                    events.push(CacheEvent::Delete(r.clone()));
                }
            }
            table.maps[self.index] = next;
            table.stats.snapshots_applied += 1;
            events
        };
        deliver(&mut dispatch, &events);
    }

    /// Applies one live change, unless it is a duplicate or stale.
    fn apply_live(&self, change: CacheEvent) {
        let mut dispatch = self.shared.dispatch.lock();
        let events = {
            let mut table = self.shared.table.write();
            let key = ResourceKey::of(change.resource());
            let map = &mut table.maps[self.index];
            let events = match (&change, map.get(&key)) {
                (CacheEvent::Upsert(new), None) => {
                    map.insert(key, new.clone());
                    vec![change.clone()]
                }
                (CacheEvent::Upsert(new), Some(old)) if is_later(new, old) => {
                    let events = if uid_of(old) == uid_of(new) {
                        vec![change.clone()]
                    } else {
                        // The Delete of the old lifetime was not seen.
                        vec![CacheEvent::Delete(old.clone()), change.clone()]
                    };
                    map.insert(key, new.clone());
                    events
                }
                (CacheEvent::Delete(gone), Some(old)) if !is_later(old, gone) => {
                    map.remove(&key);
                    vec![change.clone()]
                }
                // A duplicate, an older state, or a Delete of nothing cached.
                _ => Vec::new(),
            };
            if events.is_empty() {
                table.stats.events_dropped += 1;
            }
            events
        };
        deliver(&mut dispatch, &events);
    }

    fn set_type_status(&self, status: TypeStatus) {
        let overall = {
            let mut table = self.shared.table.write();
            table.type_status[self.index] = status;
            if table.type_status.contains(&TypeStatus::NoWatch) {
                CacheStatus::WaitingForDatastore
            } else if table.type_status.contains(&TypeStatus::Snapshot) {
                CacheStatus::ResyncInProgress
            } else {
                CacheStatus::InSync
            }
        };
        self.shared.status.send_if_modified(|s| {
            let changed = *s != overall;
            *s = overall;
            changed
        });
    }

    fn mark_primed(&self) {
        let all = {
            let mut table = self.shared.table.write();
            table.primed[self.index] = true;
            table.primed.iter().all(|p| *p)
        };
        if all {
            self.shared.primed.send_if_modified(|p| {
                let changed = !*p;
                *p = true;
                changed
            });
        }
    }
}

/// Runs every subscriber on every event, in order; drops subscribers that
/// panic.
fn deliver(dispatch: &mut Dispatch, events: &[CacheEvent]) {
    if events.is_empty() {
        return;
    }
    dispatch.subscribers.retain_mut(|(_, callback)| {
        events
            .iter()
            .all(|event| catch_unwind(AssertUnwindSafe(|| callback(event))).is_ok())
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Client;

    fn resource(name: &str, uid: &str, version: &str) -> Arc<Resource> {
        Arc::new(Resource {
            id: Some(Id {
                uid: uid.into(),
                name: name.into(),
                r#type: Some(Type {
                    group: "g".into(),
                    group_version: "v1".into(),
                    kind: "K".into(),
                }),
                tenancy: None,
            }),
            version: version.into(),
            ..Default::default()
        })
    }

    #[test]
    fn versions_compare_as_numbers_not_strings() {
        // "10" is later than "9" although it sorts before it as text.
        assert!(is_later(
            &resource("a", "u", "10"),
            &resource("a", "u", "9")
        ));
        assert!(!is_later(
            &resource("a", "u", "9"),
            &resource("a", "u", "10")
        ));
        assert!(!is_later(
            &resource("a", "u", "9"),
            &resource("a", "u", "9")
        ));
    }

    #[test]
    fn a_snapshot_transition_emits_nothing_for_an_unchanged_resource() {
        // Same uid and version: no event; newer: Upsert; other lifetime: Delete then Upsert.
        let old = resource("a", "u", "5");
        assert!(snapshot_transition(Some(&old), &resource("a", "u", "5")).is_empty());
        assert_eq!(
            snapshot_transition(Some(&old), &resource("a", "u", "7")),
            vec![CacheEvent::Upsert(resource("a", "u", "7"))]
        );
        assert_eq!(
            snapshot_transition(Some(&old), &resource("a", "u2", "9")),
            vec![
                CacheEvent::Delete(old.clone()),
                CacheEvent::Upsert(resource("a", "u2", "9"))
            ]
        );
        assert_eq!(
            snapshot_transition(None, &resource("a", "u", "1")),
            vec![CacheEvent::Upsert(resource("a", "u", "1"))]
        );
    }

    #[test]
    fn starting_outside_a_runtime_is_an_error_not_a_panic() {
        // No Tokio runtime: InvalidArgument instead of tokio::spawn panicking.
        let client = Client::new(&["127.0.0.1:1"], crate::ClientOptions::default()).unwrap();
        let r = WatchCache::start(
            client,
            vec![WatchSpec::new("g", "K")],
            WatchCacheOptions::default(),
        );
        assert!(matches!(r, Err(ClientError::InvalidArgument { .. })));
    }

    #[tokio::test]
    async fn two_specs_of_one_kind_are_rejected() {
        // A sweep of one would delete the other's keys, so the cache refuses.
        let client = Client::new(&["127.0.0.1:1"], crate::ClientOptions::default()).unwrap();
        let r = WatchCache::start(
            client,
            vec![
                WatchSpec::new("g", "K"),
                WatchSpec::new("g", "K").with_name_prefix("x"),
            ],
            WatchCacheOptions::default(),
        );
        assert!(matches!(r, Err(ClientError::InvalidArgument { .. })));
    }
}
