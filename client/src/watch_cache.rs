//! [`WatchCache`]: an in-memory copy of one or several types, kept from
//! WatchList streams, with a primed barrier, resync after failures,
//! ordered, duplicate-free, never-rewinding callbacks, indexes, and status
//! callbacks that carry the cache's revision.
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
//! ## Indexes
//!
//! [`WatchCache::list_by_owner`] (the node's ListByOwner rule, over the
//! watched types) and every [`Index`] declared with
//! [`WatchCacheBuilder::index`] ([`WatchCache::by_index`]) are kept in the
//! table, changed in the same critical section as the maps on every upsert,
//! delete and mark-and-sweep resync (`crate::index`). A reader therefore
//! never sees an index out of step with `get`/`list`: every result is
//! exactly what a scan of the table at that moment would find, and shares
//! the table's `Arc`s.
//!
//! ## Status and revision
//!
//! Each type's revision R is published in the table under the same lock as
//! its map; [`WatchCache::revision`] is the lowest over the watched types
//! (`None` until every type has applied a snapshot). The status
//! ([`CacheStatus`], as Calico's syncer: WaitingForDatastore, then
//! ResyncInProgress, then InSync) changes under the dispatch lock, so every
//! change reaches the [`WatchCache::on_status`] callbacks and
//! [`WatchCache::status_changes`] once, in the order it happened, as a
//! [`StatusUpdate`] carrying the revision at that moment; InSync always
//! carries one. A callback registered later first gets the current status.
//! Priming ([`WatchCache::wait_primed`], [`crate::PrimingBarrier`]) happens
//! once: a later failure or resync changes the status, never the primed
//! flag (the first complete snapshot of every type is in).
//!
//! ## Concurrency
//!
//! The type tasks apply changes under two locks, always taken in this order:
//! `dispatch` (the subscriber and status-callback lists; held while
//! callbacks run, so callbacks of all types are serialised and each type's
//! are in stream order), then `table` (the maps, indexes, revisions and
//! per-type status; held only to update them, never during callbacks).
//! Readers (`get`, `list`, `list_by_owner`, `by_index`, `revision`) take
//! only `table`, so a callback may read the cache; it must not call
//! [`WatchCache::subscribe`], [`WatchCache::on_status`] or
//! [`WatchCache::unsubscribe`] (each takes `dispatch`: it would wait for
//! itself).

use std::collections::{BTreeMap, HashMap};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use cairn_proto::v1::{Consistency, Id, Resource, Tenancy, Type, WatchListRequest};
use parking_lot::{Mutex, RwLock};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{EventKind, ResourceApi};
use crate::error::ClientError;
use crate::index::{Index, Indexes};

/// What one watch of the cache selects: an unversioned type (group + kind),
/// a tenancy in which `*` matches any value, a name prefix and a metadata selector
/// (Kubernetes' label-selector syntax; "" = all). A resource that stops matching the
/// selector leaves the cache (the node sends it as a Delete), one that starts matching
/// enters it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSpec {
    /// Only `group` and `kind` are used.
    pub type_: Type,
    pub tenancy: Tenancy,
    pub name_prefix: String,
    pub selector: String,
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
            selector: String::new(),
        }
    }

    /// Only the resources whose metadata matches `selector` (`app=web,tier!=db`).
    pub fn with_selector(mut self, selector: impl Into<String>) -> WatchSpec {
        self.selector = selector.into();
        self
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

/// A change of the cache's status, with the cache's revision when it
/// happened ([`WatchCache::revision`]: the lowest revision applied over the
/// watched types; `None` until every type has applied a snapshot, and never
/// `None` with [`CacheStatus::InSync`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusUpdate {
    pub status: CacheStatus,
    pub revision: Option<u64>,
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
    /// Times a node answered for another cluster than the one the cache
    /// primed from (each followed by a resync of every type from scratch).
    pub cluster_changes: u64,
}

/// Settings of a [`WatchCache`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchCacheOptions {
    /// Pause after a failed watch, doubling up to `retry_backoff_max`; reset
    /// by every snapshot applied and every live event.
    pub retry_backoff_initial: Duration,
    pub retry_backoff_max: Duration,
    /// The consistency of every snapshot the cache takes (when it primes, and
    /// when it resyncs after Compacted). STRONG (the default): the snapshot
    /// holds every write acknowledged before the watch was opened. EVENTUAL:
    /// whatever the node applied, cheaper, possibly older. A watch resumed
    /// from the cache's revision replays every change after it either way.
    pub snapshot_consistency: Consistency,
    /// How long [`WatchCache::get_consistent`] and
    /// [`WatchCache::list_consistent`] wait for the cache to catch up with a
    /// quorum-confirmed revision before they fail with Inconsistent.
    pub consistent_read_timeout: Duration,
}

impl Default for WatchCacheOptions {
    fn default() -> WatchCacheOptions {
        WatchCacheOptions {
            retry_backoff_initial: Duration::from_millis(50),
            retry_backoff_max: Duration::from_secs(2),
            snapshot_consistency: Consistency::Strong,
            consistent_read_timeout: Duration::from_secs(5),
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
type StatusCallback = Box<dyn FnMut(&StatusUpdate) + Send>;

/// Per-type state of a watch, for the status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TypeStatus {
    NoWatch,
    Snapshot,
    Live,
}

/// What readers see: the maps, their indexes and revisions, and the
/// per-type status. Pure; every change of a map goes through
/// [`Table::apply_snapshot`] or [`Table::apply_live`], which change the
/// indexes and the type's revision with it.
struct Table {
    /// One map per spec (specs have distinct group + kind, so a key belongs
    /// to exactly one map).
    maps: Vec<BTreeMap<ResourceKey, Arc<Resource>>>,
    /// Over every map together.
    indexes: Indexes,
    /// Per spec: the last revision applied to its map; `None` before its
    /// first snapshot. Never decreases, except when the cache hears another
    /// cluster ([`Table::forget_revision`]).
    revisions: Vec<Option<u64>>,
    type_status: Vec<TypeStatus>,
    /// Per spec: where its watch is open now (for WatchProgress), if it is.
    watches: Vec<Option<WatchAt>>,
    primed: Vec<bool>,
    stats: CacheStats,
}

/// A watch open on a node: the node's endpoint and the id it gave the watch.
#[derive(Debug, Clone, PartialEq, Eq)]
struct WatchAt {
    endpoint: String,
    watch_id: u64,
}

impl Table {
    fn new(types: usize, indexes: Vec<Index>) -> Table {
        Table {
            maps: vec![BTreeMap::new(); types],
            indexes: Indexes::new(indexes),
            watches: vec![None; types],
            revisions: vec![None; types],
            type_status: vec![TypeStatus::NoWatch; types],
            primed: vec![false; types],
            stats: CacheStats::default(),
        }
    }

    /// The lowest revision applied over the types; `None` until every type
    /// has one.
    fn revision(&self) -> Option<u64> {
        self.revisions
            .iter()
            .try_fold(u64::MAX, |lowest, r| r.map(|r| lowest.min(r)))
    }

    fn set_type_status(&mut self, type_index: usize, status: TypeStatus) {
        assert!(
            status != TypeStatus::Live || self.revisions[type_index].is_some(),
            "a type is live only from a revision (its snapshot's, or the one it replays from)"
        );
        self.type_status[type_index] = status;
    }

    fn status(&self) -> StatusUpdate {
        let status = if self.type_status.contains(&TypeStatus::NoWatch) {
            CacheStatus::WaitingForDatastore
        } else if self.type_status.contains(&TypeStatus::Snapshot) {
            CacheStatus::ResyncInProgress
        } else {
            CacheStatus::InSync
        };
        let revision = self.revision();
        assert!(
            status != CacheStatus::InSync || revision.is_some(),
            "every type is live, so every type has a revision"
        );
        StatusUpdate { status, revision }
    }

    /// Forgets the type's revision: the cache heard another cluster, whose
    /// revisions say nothing about this one's, so the next snapshot is taken
    /// whatever its revision and replaces the map whole (mark and sweep).
    /// The only way a type's revision goes down.
    fn forget_revision(&mut self, type_index: usize) {
        self.revisions[type_index] = None;
        assert!(
            self.type_status[type_index] != TypeStatus::Live,
            "a type whose revision is forgotten is not live"
        );
    }

    /// Whether each type `types[slot]` has applied the revision `asked[slot]`
    /// names, through the very watch asked (a watch opened since, as after a
    /// change of cluster, is asked again): the highest of those revisions if
    /// so.
    fn reached(&self, types: &[usize], asked: &[Option<(WatchAt, u64)>]) -> Option<u64> {
        assert_eq!(types.len(), asked.len(), "one ask per type");
        let mut slowest = 0;
        for (&i, asked) in types.iter().zip(asked) {
            let (at, target) = asked.as_ref()?;
            let caught_up = self.watches[i].as_ref() == Some(at)
                && self.revisions[i].is_some_and(|r| r >= *target);
            if !caught_up {
                return None;
            }
            slowest = slowest.max(*target);
        }
        Some(slowest)
    }

    /// Raises the type's revision to `revision` (a progress notification).
    fn advance_revision(&mut self, type_index: usize, revision: u64) {
        let r = &mut self.revisions[type_index];
        *r = Some(r.map_or(revision, |r| r.max(revision)));
    }

    /// Replaces a type's map with a complete snapshot taken at `revision`
    /// (mark and sweep); returns Upserts for what is new or newer and Deletes
    /// for every key the snapshot lacks.
    fn apply_snapshot(
        &mut self,
        type_index: usize,
        snapshot: Vec<Arc<Resource>>,
        revision: u64,
    ) -> Vec<CacheEvent> {
        assert!(
            self.revisions[type_index].is_none_or(|r| r <= revision),
            "a snapshot older than the cache is discarded before it is applied"
        );
        // No revision: the first snapshot, or the first from another cluster
        // (`forget_revision`), whose versions say nothing of the old map's.
        let same_history = self.revisions[type_index].is_some();
        let old = std::mem::take(&mut self.maps[type_index]);
        let mut next = BTreeMap::new();
        let mut events = Vec::new();
        for r in snapshot {
            let key = ResourceKey::of(&r);
            let previous = old.get(&key);
            let changes = snapshot_transition(previous, &r, same_history);
            // An unchanged resource keeps its cached Arc, and its index entries.
            let value = match (previous, changes.is_empty()) {
                (Some(p), true) => p.clone(),
                _ => {
                    self.indexes.insert(&key, &r);
                    r
                }
            };
            events.extend(changes);
            let duplicate = next.insert(key, value);
            assert!(duplicate.is_none(), "a snapshot holds each key once");
        }
        for (key, r) in &old {
            if !next.contains_key(key) {
                self.indexes.remove(key);
                events.push(CacheEvent::Delete(r.clone()));
            }
        }
        self.maps[type_index] = next;
        self.revisions[type_index] = Some(revision);
        self.stats.snapshots_applied += 1;
        events
    }

    /// Applies one live change at `revision`, unless it is a duplicate or
    /// stale (`None`: an event without a resource, which only advances the
    /// revision); returns the events to deliver.
    fn apply_live(
        &mut self,
        type_index: usize,
        change: Option<CacheEvent>,
        revision: u64,
    ) -> Vec<CacheEvent> {
        assert!(
            self.revisions[type_index].is_some_and(|r| r <= revision),
            "live changes follow a snapshot or a replay, and older ones are dropped before"
        );
        self.revisions[type_index] = Some(revision);
        let Some(change) = change else {
            return Vec::new();
        };
        let key = ResourceKey::of(change.resource());
        let map = &mut self.maps[type_index];
        let events = match (&change, map.get(&key)) {
            (CacheEvent::Upsert(new), None) => {
                map.insert(key.clone(), new.clone());
                self.indexes.insert(&key, new);
                vec![change.clone()]
            }
            (CacheEvent::Upsert(new), Some(old)) if is_later(new, old) => {
                let events = if uid_of(old) == uid_of(new) {
                    vec![change.clone()]
                } else {
                    // The Delete of the old lifetime was not seen.
                    vec![CacheEvent::Delete(old.clone()), change.clone()]
                };
                map.insert(key.clone(), new.clone());
                self.indexes.insert(&key, new);
                events
            }
            (CacheEvent::Delete(gone), Some(old)) if !is_later(old, gone) => {
                map.remove(&key);
                self.indexes.remove(&key);
                vec![change.clone()]
            }
            // A duplicate, an older state, or a Delete of nothing cached.
            _ => Vec::new(),
        };
        if events.is_empty() {
            self.stats.events_dropped += 1;
        }
        events
    }
}

struct Dispatch {
    subscribers: Vec<(SubscriptionId, Callback)>,
    status_subscribers: Vec<(SubscriptionId, StatusCallback)>,
    next_id: u64,
}

impl Dispatch {
    fn next_id(&mut self) -> SubscriptionId {
        let id = SubscriptionId(self.next_id);
        self.next_id += 1;
        id
    }
}

struct Shared {
    specs: Vec<WatchSpec>,
    /// Lock order: `dispatch`, then `table`.
    dispatch: Mutex<Dispatch>,
    table: RwLock<Table>,
    /// The last status delivered; sent under `dispatch`.
    status: watch::Sender<StatusUpdate>,
    primed: watch::Sender<bool>,
    /// Woken whenever a type's revision or watch changes (consistent reads
    /// wait on it).
    moved: watch::Sender<()>,
    /// The cluster the cache heard last (`None` before any node named one).
    cluster: Mutex<Option<String>>,
    /// How many times the cluster changed, sent on every change: a type
    /// watcher that started under an older epoch, even one waiting on a quiet
    /// stream to the old cluster, resyncs from scratch.
    cluster_epoch: watch::Sender<u64>,
    /// The client the type watchers use, for WatchProgress.
    client: Arc<dyn ResourceApi>,
    options: WatchCacheOptions,
    /// The WatchProgress calls consistent reads share.
    progress: Mutex<HashMap<String, ProgressRound>>,
}

/// The WatchProgress calls of one endpoint, shared by concurrent consistent
/// reads: one call in flight at a time; reads that ask meanwhile queue, and
/// the next call, sent once the one in flight has answered, names all their
/// watches. A read is answered only by a call sent after it queued, so the
/// revision it gets was confirmed after the read began.
#[derive(Default)]
struct ProgressRound {
    waiting: Vec<(Vec<u64>, ProgressWaiter)>,
}

type ProgressWaiter = tokio::sync::oneshot::Sender<Result<crate::WatchProgress, ClientError>>;

impl Shared {
    fn subscribe(&self, mut callback: Callback) -> SubscriptionId {
        let mut dispatch = self.dispatch.lock();
        let current: Vec<Arc<Resource>> = {
            let table = self.table.read();
            table
                .maps
                .iter()
                .flat_map(|m| m.values().cloned())
                .collect()
        };
        let healthy = current.into_iter().all(|r| {
            let event = CacheEvent::Upsert(r);
            catch_unwind(AssertUnwindSafe(|| callback(&event))).is_ok()
        });
        let id = dispatch.next_id();
        if healthy {
            dispatch.subscribers.push((id, callback));
        }
        id
    }

    fn on_status(&self, mut callback: StatusCallback) -> SubscriptionId {
        let mut dispatch = self.dispatch.lock();
        // Status changes are sent under `dispatch`: none can slip in between.
        let current = *self.status.borrow();
        let healthy = catch_unwind(AssertUnwindSafe(|| callback(&current))).is_ok();
        let id = dispatch.next_id();
        if healthy {
            dispatch.status_subscribers.push((id, callback));
        }
        id
    }

    /// WatchProgress at `endpoint` for `watch_ids`, through a call shared with
    /// the consistent reads asking at the same time ([`ProgressRound`]).
    async fn ask_progress(
        shared: &Arc<Shared>,
        endpoint: &str,
        watch_ids: Vec<u64>,
    ) -> Result<crate::WatchProgress, ClientError> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let first = {
            let mut rounds = shared.progress.lock();
            let first = !rounds.contains_key(endpoint);
            let round = rounds.entry(endpoint.to_string()).or_default();
            round.waiting.push((watch_ids, answer));
            first
        };
        if first {
            // No call in flight there: this read starts the endpoint's caller, which
            // sends calls until nobody waits.
            tokio::spawn(Shared::send_progress(shared.clone(), endpoint.to_string()));
        }
        answered.await.unwrap_or_else(|_| {
            Err(ClientError::Unavailable {
                message: "the cache stopped before its WatchProgress call answered".into(),
                outcome: crate::Outcome::NotApplied,
            })
        })
    }

    /// Sends `endpoint`'s WatchProgress calls, one at a time, each for every
    /// read queued before it was sent, until none waits (then the endpoint's
    /// round ends, and the next read starts a new one).
    async fn send_progress(shared: Arc<Shared>, endpoint: String) {
        loop {
            let waiting = {
                let mut rounds = shared.progress.lock();
                let Some(round) = rounds.get_mut(&endpoint) else {
                    unreachable!("a round ends only here")
                };
                if round.waiting.is_empty() {
                    rounds.remove(&endpoint);
                    return;
                }
                std::mem::take(&mut round.waiting)
            };
            // Taken before the call is sent: every read answered by it queued first.
            let mut ids: Vec<u64> = waiting
                .iter()
                .flat_map(|(ids, _)| ids.iter().copied())
                .collect();
            ids.sort_unstable();
            ids.dedup();
            let answer = shared.client.watch_progress(&endpoint, ids).await;
            for (_, waiter) in waiting {
                let _ = waiter.send(answer.clone());
            }
        }
    }

    /// Notes the cluster id a node answered with and returns the current
    /// epoch: a new one when the id differs from the one the cache heard
    /// before (reported, and counted in [`CacheStats::cluster_changes`]).
    ///
    /// `None` when the node names no cluster but the cache already knows one:
    /// a node that has not joined a cluster yet (a wiped node coming back as
    /// part of a new cluster, say) cannot show that its history is the
    /// cache's cluster's, and a watch resumed there would skip that history
    /// by revision. Its watch is not used.
    fn observe_cluster(&self, cluster_id: Option<&str>, endpoint: &str) -> Option<u64> {
        let mut seen = self.cluster.lock();
        match (cluster_id, seen.as_deref()) {
            (None, Some(known)) => {
                tracing::debug!(
                    known,
                    endpoint,
                    "watch cache: a node names no cluster; not using its watch"
                );
                return None;
            }
            (Some(heard), Some(known)) if heard != known => {
                tracing::warn!(
                    before = known,
                    now = heard,
                    endpoint,
                    "watch cache: the cluster changed (rebuilt, or restored into a new one); \
                     resyncing every type from scratch"
                );
                *seen = Some(heard.to_string());
                self.table.write().stats.cluster_changes += 1;
                self.cluster_epoch.send_modify(|epoch| *epoch += 1);
            }
            (Some(heard), None) => *seen = Some(heard.to_string()),
            (Some(_), Some(_)) | (None, None) => {}
        }
        Some(*self.cluster_epoch.borrow())
    }

    /// Publishes `update` if its status differs from the last one published
    /// (`dispatch` held, so updates go out in the order they were computed).
    fn publish_status(&self, dispatch: &mut Dispatch, update: StatusUpdate) {
        let changed = self.status.send_if_modified(|current| {
            let changed = current.status != update.status;
            if changed {
                *current = update;
            }
            changed
        });
        if changed {
            dispatch.status_subscribers.retain_mut(|(_, callback)| {
                catch_unwind(AssertUnwindSafe(|| callback(&update))).is_ok()
            });
        }
    }
}

/// An in-memory cache of one or several types. See the module docs. Dropping
/// it stops its tasks.
///
/// Reads: [`WatchCache::get`] and [`WatchCache::list`] answer from memory at
/// once, at whatever revision the cache has reached (monotonic, possibly
/// behind the cluster). [`WatchCache::get_consistent`] and
/// [`WatchCache::list_consistent`] first ask the node serving each watch
/// needed for a revision confirmed by a quorum after the call began and for
/// a Progress event at or above it (`WatchProgress`), wait until the cache
/// has applied it, then answer from memory: linearizable, as a strong read,
/// without reading the data again. They fail with Inconsistent, never with
/// stale data, when that takes longer than
/// [`WatchCacheOptions::consistent_read_timeout`].
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

/// Everything a [`WatchCache`] is started with: the types to watch, the
/// options, the indexes, and callbacks registered before the first event.
/// From [`WatchCache::builder`].
pub struct WatchCacheBuilder {
    client: Arc<dyn ResourceApi>,
    specs: Vec<WatchSpec>,
    options: WatchCacheOptions,
    indexes: Vec<Index>,
    subscribers: Vec<Callback>,
    status_subscribers: Vec<StatusCallback>,
}

impl WatchCacheBuilder {
    pub fn options(mut self, options: WatchCacheOptions) -> WatchCacheBuilder {
        self.options = options;
        self
    }

    /// Declares a user index, queried with [`WatchCache::by_index`]. Names
    /// must be non-empty and distinct.
    pub fn index(mut self, index: Index) -> WatchCacheBuilder {
        self.indexes.push(index);
        self
    }

    /// A subscriber that sees every change from the initial snapshot on
    /// (as [`WatchCache::subscribe`], registered before the first event).
    pub fn subscriber(
        mut self,
        callback: impl FnMut(&CacheEvent) + Send + 'static,
    ) -> WatchCacheBuilder {
        self.subscribers.push(Box::new(callback));
        self
    }

    /// A status callback that sees every status from the first
    /// (WaitingForDatastore, without a revision) on.
    pub fn on_status(
        mut self,
        callback: impl FnMut(&StatusUpdate) + Send + 'static,
    ) -> WatchCacheBuilder {
        self.status_subscribers.push(Box::new(callback));
        self
    }

    /// Starts the cache's tasks (inside a Tokio runtime: outside one this is
    /// InvalidArgument). InvalidArgument also for no spec, a spec without
    /// group or kind, two specs with the same group and kind (each key must
    /// belong to one watch, or a sweep of one would delete what the other
    /// holds), and an index with an empty or repeated name.
    pub fn start(self) -> Result<WatchCache, ClientError> {
        let WatchCacheBuilder {
            client,
            specs,
            options,
            indexes,
            subscribers,
            status_subscribers,
        } = self;
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
        Indexes::check_declared(&indexes)?;
        let n = specs.len();
        let table = Table::new(n, indexes);
        let (status, _) = watch::channel(table.status());
        let (primed, _) = watch::channel(false);
        let (moved, _) = watch::channel(());
        let shared = Arc::new(Shared {
            moved,
            cluster: Mutex::new(None),
            cluster_epoch: watch::channel(0).0,
            client: client.clone(),
            options: options.clone(),
            progress: Mutex::new(HashMap::new()),
            specs,
            dispatch: Mutex::new(Dispatch {
                subscribers: Vec::new(),
                status_subscribers: Vec::new(),
                next_id: 0,
            }),
            table: RwLock::new(table),
            status,
            primed,
        });
        for callback in subscribers {
            shared.subscribe(callback);
        }
        for callback in status_subscribers {
            shared.on_status(callback);
        }
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
}

impl WatchCache {
    /// A cache of `specs` through `client` (any [`ResourceApi`]: the remote
    /// [`crate::Client`], or an embedded node's in-process client), with
    /// default options, no index and no callback until more are given;
    /// [`WatchCacheBuilder::start`] starts it.
    pub fn builder(client: impl ResourceApi, specs: Vec<WatchSpec>) -> WatchCacheBuilder {
        WatchCacheBuilder {
            client: Arc::new(client),
            specs,
            options: WatchCacheOptions::default(),
            indexes: Vec::new(),
            subscribers: Vec::new(),
            status_subscribers: Vec::new(),
        }
    }

    /// Starts watching `specs` through `client`, without indexes (see
    /// [`WatchCacheBuilder::start`] for what is refused).
    pub fn start(
        client: impl ResourceApi,
        specs: Vec<WatchSpec>,
        options: WatchCacheOptions,
    ) -> Result<WatchCache, ClientError> {
        WatchCache::builder(client, specs).options(options).start()
    }

    /// As [`WatchCache::start`], with subscribers registered before the first
    /// event, so they see everything from the initial snapshot on.
    pub fn start_with(
        client: impl ResourceApi,
        specs: Vec<WatchSpec>,
        options: WatchCacheOptions,
        subscribers: Vec<Callback>,
    ) -> Result<WatchCache, ClientError> {
        let mut builder = WatchCache::builder(client, specs).options(options);
        builder.subscribers = subscribers;
        builder.start()
    }

    /// Returns once every watched type has delivered its EndOfSnapshot and
    /// the snapshot is in the cache (and its callbacks have run). After that
    /// the cache is never half-filled: later resyncs replace a type's
    /// contents atomically, and never un-prime it.
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

    /// A receiver of the primed flag, for [`crate::PrimingBarrier`].
    pub(crate) fn primed_changes(&self) -> watch::Receiver<bool> {
        self.shared.primed.subscribe()
    }

    /// The watched types, `group.Kind`, comma-separated.
    pub(crate) fn types_label(&self) -> String {
        let types: Vec<String> = self
            .shared
            .specs
            .iter()
            .map(|s| format!("{}.{}", s.type_.group, s.type_.kind))
            .collect();
        types.join(", ")
    }

    /// The current status.
    pub fn status(&self) -> CacheStatus {
        self.shared.status.borrow().status
    }

    /// A receiver of status changes, each with the revision when it happened.
    pub fn status_changes(&self) -> watch::Receiver<StatusUpdate> {
        self.shared.status.subscribe()
    }

    /// Registers a status callback. It first receives the current status,
    /// then every change, in order, each once. It runs on the cache's tasks
    /// under the same rules as [`WatchCache::subscribe`]'s callbacks (short;
    /// no `subscribe` or `on_status` from inside; unsubscribed if it panics);
    /// [`WatchCache::unsubscribe`] ends it.
    pub fn on_status(
        &self,
        callback: impl FnMut(&StatusUpdate) + Send + 'static,
    ) -> SubscriptionId {
        self.shared.on_status(Box::new(callback))
    }

    /// The lowest revision applied over the watched types: every change the
    /// cluster committed up to it is in the cache. `None` until every type
    /// has applied its first snapshot; never decreases within one cluster
    /// (after the cache hears another cluster it is `None` again, then the
    /// new cluster's revision once every type resynced).
    pub fn revision(&self) -> Option<u64> {
        self.shared.table.read().revision()
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

    /// As [`WatchCache::get`], after the cache caught up with a revision
    /// confirmed by a quorum after this call began (see the type's docs): the
    /// answer reflects every write acknowledged before the call. An id of a
    /// type the cache does not watch is InvalidArgument.
    pub async fn get_consistent(&self, id: &Id) -> Result<Option<Arc<Resource>>, ClientError> {
        let key = ResourceKey::of_id(id);
        let index = self.watched(&key.group, &key.kind)?;
        self.catch_up(&[index]).await?;
        Ok(self.get(id))
    }

    /// As [`WatchCache::list`], after the cache caught up with a revision
    /// confirmed by a quorum after this call began (see
    /// [`WatchCache::get_consistent`]).
    pub async fn list_consistent(
        &self,
        group: &str,
        kind: &str,
    ) -> Result<Vec<Arc<Resource>>, ClientError> {
        let index = self.watched(group, kind)?;
        self.catch_up(&[index]).await?;
        Ok(self.list(group, kind))
    }

    /// The index of the watched type `group` + `kind`, or InvalidArgument.
    fn watched(&self, group: &str, kind: &str) -> Result<usize, ClientError> {
        self.spec_of(group, kind).ok_or_else(|| {
            ClientError::invalid(
                "type",
                format!("{group}.{kind} is not watched by this cache"),
            )
        })
    }

    /// Waits until each type in `types` has applied a revision that a node
    /// confirmed with a quorum after this call began, asking the node that
    /// serves each type's watch for it (again whenever the watch moves); the
    /// revision the slowest type was asked to reach, or Inconsistent at the
    /// deadline.
    async fn catch_up(&self, types: &[usize]) -> Result<u64, ClientError> {
        let timeout = self.shared.options.consistent_read_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut moved = self.shared.moved.subscribe();
        // Per type in `types`: the watch asked, and the revision it must reach.
        let mut asked: Vec<Option<(WatchAt, u64)>> = vec![None; types.len()];
        loop {
            // Marked seen before the table is read: a change after this read
            // wakes the wait below.
            moved.borrow_and_update();
            let to_ask = {
                let table = self.shared.table.read();
                if let Some(slowest) = table.reached(types, &asked) {
                    return Ok(slowest);
                }
                let mut to_ask: BTreeMap<String, Vec<(usize, u64)>> = BTreeMap::new();
                for (slot, &i) in types.iter().enumerate() {
                    let current = table.watches[i].as_ref();
                    if current != asked[slot].as_ref().map(|(at, _)| at) {
                        asked[slot] = None;
                        // No watch open now: asked once it opens.
                        if let Some(at) = current {
                            let ids = to_ask.entry(at.endpoint.clone()).or_default();
                            ids.push((slot, at.watch_id));
                        }
                    }
                }
                to_ask
            };
            for (endpoint, watches) in to_ask {
                let ids = watches.iter().map(|(_, id)| *id).collect();
                let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
                let asking = Shared::ask_progress(&self.shared, &endpoint, ids);
                let progress = match tokio::time::timeout(remaining, asking).await {
                    Ok(Ok(progress)) => progress,
                    Ok(Err(e)) => return Err(not_caught_up(timeout, Some(&e))),
                    Err(_elapsed) => return Err(not_caught_up(timeout, None)),
                };
                for (slot, watch_id) in watches {
                    // A watch that got no Progress (closed meanwhile) is asked
                    // again once its type watches anew.
                    if progress.delivered_watch_ids.contains(&watch_id) {
                        let at = WatchAt {
                            endpoint: endpoint.clone(),
                            watch_id,
                        };
                        asked[slot] = Some((at, progress.revision));
                    }
                }
            }
            if self.shared.table.read().reached(types, &asked).is_some() {
                continue;
            }
            if tokio::time::timeout_at(deadline, moved.changed())
                .await
                .is_err()
            {
                return Err(not_caught_up(timeout, None));
            }
        }
    }

    /// Every cached resource of the watched type `group` + `kind`, in key
    /// order, with the revision that type's map reflects, read together (the
    /// map at exactly that revision); `None` for a type not watched or not
    /// primed yet. What `cairn check cache` compares with the cluster.
    pub fn list_with_revision(&self, group: &str, kind: &str) -> Option<(u64, Vec<Arc<Resource>>)> {
        let index = self.spec_of(group, kind)?;
        let table = self.shared.table.read();
        let revision = table.revisions[index]?;
        Some((revision, table.maps[index].values().cloned().collect()))
    }

    /// Every cached resource of the watched type `group` + `kind`, in key order.
    pub fn list(&self, group: &str, kind: &str) -> Vec<Arc<Resource>> {
        let table = self.shared.table.read();
        match self.spec_of(group, kind) {
            Some(index) => table.maps[index].values().cloned().collect(),
            None => Vec::new(),
        }
    }

    /// Every cached resource (of any watched type) whose owner is `owner`,
    /// by the node's ListByOwner rule: group, kind, partition, namespace,
    /// name and uid equal, the group version ignored (another uid finds
    /// nothing). In storage-key order.
    pub fn list_by_owner(&self, owner: &Id) -> Vec<Arc<Resource>> {
        self.shared.table.read().indexes.by_owner(owner)
    }

    /// Every cached resource the index `name` holds under `key`, in
    /// storage-key order. InvalidArgument (field `index`) when no index of
    /// that name was declared.
    pub fn by_index(&self, name: &str, key: &str) -> Result<Vec<Arc<Resource>>, ClientError> {
        self.shared.table.read().indexes.by_index(name, key)
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
    /// or `on_status` from one. A callback that panics is unsubscribed.
    pub fn subscribe(&self, callback: impl FnMut(&CacheEvent) + Send + 'static) -> SubscriptionId {
        self.shared.subscribe(Box::new(callback))
    }

    /// Ends a subscription or a status callback; returns whether it existed.
    pub fn unsubscribe(&self, id: SubscriptionId) -> bool {
        let mut dispatch = self.shared.dispatch.lock();
        let before = dispatch.subscribers.len() + dispatch.status_subscribers.len();
        dispatch.subscribers.retain(|(i, _)| *i != id);
        dispatch.status_subscribers.retain(|(i, _)| *i != id);
        dispatch.subscribers.len() + dispatch.status_subscribers.len() != before
    }

    fn spec_of(&self, group: &str, kind: &str) -> Option<usize> {
        self.shared
            .specs
            .iter()
            .position(|s| s.type_.group == group && s.type_.kind == kind)
    }
}

/// The Inconsistent a consistent read ends with when the cache could not
/// catch up with a confirmed revision in time (`cause`: why it could not get
/// one).
fn not_caught_up(timeout: Duration, cause: Option<&ClientError>) -> ClientError {
    let why = match cause {
        Some(e) => format!("no revision confirmed: {e}"),
        None => "the cache did not reach a confirmed revision".to_string(),
    };
    ClientError::Inconsistent {
        message: format!(
            "consistent cache read not answered within {} ms: {why}",
            timeout.as_millis()
        ),
        outcome: crate::Outcome::NotApplied,
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
/// at or after the cache's). `same_history`: `old` came from the snapshot's
/// cluster; otherwise versions (log indexes) say nothing across the two, and
/// only an identical resource is unchanged.
fn snapshot_transition(
    old: Option<&Arc<Resource>>,
    new: &Arc<Resource>,
    same_history: bool,
) -> Vec<CacheEvent> {
    match old {
        None => vec![CacheEvent::Upsert(new.clone())],
        Some(o) if !same_history && o == new => Vec::new(),
        Some(o) if !same_history && uid_of(o) == uid_of(new) => {
            vec![CacheEvent::Upsert(new.clone())]
        }
        Some(o) if !same_history => vec![
            CacheEvent::Delete(o.clone()),
            CacheEvent::Upsert(new.clone()),
        ],
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
        // first snapshot. The task's copy of `Table::revisions[index]`, which
        // `apply_snapshot`, `apply_live` and `advance_revision` set to the
        // same values under the table lock.
        let mut revision: Option<u64> = None;
        let mut fresh = true;
        let mut backoff = self.options.retry_backoff_initial;
        // The cluster epoch this type's map belongs to.
        let mut epoch = 0;
        let mut epochs = self.shared.cluster_epoch.subscribe();
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
                selector: spec.selector.clone(),
            };
            let mut stream = match self.client.watch_list(request).await {
                Ok(stream) => stream,
                Err(ClientError::Compacted { .. }) => {
                    self.shared.table.write().stats.compacted += 1;
                    fresh = true;
                    continue;
                }
                Err(e) => {
                    let refused = matches!(
                        e,
                        ClientError::InvalidArgument { .. }
                            | ClientError::Unauthenticated(_)
                            | ClientError::PermissionDenied(_)
                    );
                    if refused {
                        // Every node refuses it the same way: still retried (credentials
                        // may be granted meanwhile), but said at most once a backoff.
                        tracing::warn!(error = %e, kind = %spec.type_.kind, "watch cache: the cluster refuses this type's watch; it will not prime until that changes");
                    } else {
                        tracing::debug!(error = %e, kind = %spec.type_.kind, "watch cache: cannot open a watch");
                    }
                    self.set_type_status(TypeStatus::NoWatch);
                    self.sleep(&mut backoff).await;
                    continue;
                }
            };
            // Which cluster answered, before any event is used: a resumed watch
            // on another cluster would replay its history into this one's.
            let Some(current) = self
                .shared
                .observe_cluster(stream.cluster_id(), stream.source())
            else {
                self.client.avoid(stream.source());
                self.set_type_status(TypeStatus::NoWatch);
                self.sleep(&mut backoff).await;
                continue;
            };
            if current != epoch {
                epoch = current;
                if revision.is_some() {
                    revision = None;
                    self.shared.table.write().forget_revision(self.index);
                }
                if start_revision != 0 {
                    fresh = true;
                    continue;
                }
            }
            self.set_watch(stream.watch_id().map(|watch_id| WatchAt {
                endpoint: stream.source().to_string(),
                watch_id,
            }));
            if start_revision == 0 {
                self.set_type_status(TypeStatus::Snapshot);
            } else {
                self.shared.table.write().stats.replays += 1;
                self.set_type_status(TypeStatus::Live);
            }
            let mut staged: Option<Vec<Arc<Resource>>> = (start_revision == 0).then(Vec::new);
            let next = loop {
                let next_event = tokio::select! {
                    // First: an epoch already moved ends the stream before any event is used.
                    biased;
                    _ = epochs.wait_for(|current| *current != epoch) => {
                        // Another type heard a new cluster (even while this stream was
                        // quiet): this map resyncs too.
                        break Rewatch::FreshSnapshot;
                    }
                    event = stream.next() => event,
                };
                let event = match next_event {
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
                        self.apply_snapshot(snapshot, event_revision);
                        backoff = self.options.retry_backoff_initial;
                        revision = Some(event_revision);
                        fresh = false;
                        self.set_type_status(TypeStatus::Live);
                        self.mark_primed();
                    }
                    (EventKind::Upsert(r), None) => {
                        self.live_change(CacheEvent::Upsert(r), event_revision, &mut revision)
                    }
                    (EventKind::Delete(r), None) => {
                        self.live_change(CacheEvent::Delete(r), event_revision, &mut revision)
                    }
                    (EventKind::Progress, None) => {
                        self.shared
                            .table
                            .write()
                            .advance_revision(self.index, event_revision);
                        self.shared.moved.send_replace(());
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
            self.set_watch(None);
            self.set_type_status(TypeStatus::NoWatch);
            if let Rewatch::FreshSnapshot = next {
                fresh = true;
            }
            if *epochs.borrow() != epoch {
                // Resynced from scratch at once, from the new cluster.
                continue;
            }
            self.sleep(&mut backoff).await;
        }
    }

    async fn sleep(&self, backoff: &mut Duration) {
        tokio::time::sleep(*backoff).await;
        *backoff = (*backoff * 2).min(self.options.retry_backoff_max);
    }

    /// A live change at `event_revision`, on a map at `revision`: dropped
    /// when older than what the map shows (a replay overlap), else applied.
    /// (Equal: another change of the same entry, or a replayed one, which
    /// `apply_live` drops.)
    fn live_change(&self, change: CacheEvent, event_revision: u64, revision: &mut Option<u64>) {
        if revision.is_some_and(|r| event_revision < r) {
            self.count_dropped();
            return;
        }
        self.apply_live(Some(change), event_revision);
        *revision = Some(event_revision);
    }

    fn count_dropped(&self) {
        self.shared.table.write().stats.events_dropped += 1;
    }

    /// Applies a complete snapshot taken at `revision` ([`Table::apply_snapshot`])
    /// and delivers its events.
    fn apply_snapshot(&self, snapshot: Vec<Arc<Resource>>, revision: u64) {
        let mut dispatch = self.shared.dispatch.lock();
        let events = self
            .shared
            .table
            .write()
            .apply_snapshot(self.index, snapshot, revision);
        deliver(&mut dispatch, &events);
        self.shared.moved.send_replace(());
    }

    /// Applies one live change at `revision` ([`Table::apply_live`]) and
    /// delivers its events.
    fn apply_live(&self, change: Option<CacheEvent>, revision: u64) {
        let mut dispatch = self.shared.dispatch.lock();
        let events = self
            .shared
            .table
            .write()
            .apply_live(self.index, change, revision);
        deliver(&mut dispatch, &events);
        self.shared.moved.send_replace(());
    }

    /// Records where this type's watch is open now (`None`: not open).
    fn set_watch(&self, at: Option<WatchAt>) {
        self.shared.table.write().watches[self.index] = at;
        self.shared.moved.send_replace(());
    }

    fn set_type_status(&self, status: TypeStatus) {
        let mut dispatch = self.shared.dispatch.lock();
        let update = {
            let mut table = self.shared.table.write();
            table.set_type_status(self.index, status);
            table.status()
        };
        self.shared.publish_status(&mut dispatch, update);
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
        assert!(snapshot_transition(Some(&old), &resource("a", "u", "5"), true).is_empty());
        assert_eq!(
            snapshot_transition(Some(&old), &resource("a", "u", "7"), true),
            vec![CacheEvent::Upsert(resource("a", "u", "7"))]
        );
        assert_eq!(
            snapshot_transition(Some(&old), &resource("a", "u2", "9"), true),
            vec![
                CacheEvent::Delete(old.clone()),
                CacheEvent::Upsert(resource("a", "u2", "9"))
            ]
        );
        assert_eq!(
            snapshot_transition(None, &resource("a", "u", "1"), true),
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

/// The indexes against a full scan of the table, after every step of random
/// upserts, deletes, owner and label changes, stale and duplicate events,
/// and whole-snapshot resyncs, all applied through the functions the type
/// tasks call ([`Table::apply_live`], [`Table::apply_snapshot`]).
#[cfg(test)]
mod index_model {
    use super::*;
    use cairn_proto::v1::Tenancy;
    use proptest::prelude::*;

    const KINDS: [&str; 2] = ["A", "B"];
    const NAMES: usize = 5;
    const LABELS: [&str; 4] = ["a", "b", "c", "d"];
    const OWNER_NAMES: usize = 3;
    const OWNER_UIDS: usize = 2;
    const NAMESPACES: [&str; 2] = ["default", "other"];

    /// An owner: (name, uid, group version, namespace), each an index.
    type Owner = (usize, usize, usize, usize);

    #[derive(Debug, Clone)]
    struct Shape {
        owner: Option<Owner>,
        labels: Vec<usize>,
    }

    #[derive(Debug, Clone)]
    enum Entry {
        /// Not in the snapshot: swept.
        Absent,
        /// As cached (when cached).
        Keep,
        /// A new state at the snapshot's revision.
        Write { uid: usize, shape: Shape },
        /// A state the key held before (the restore of an older backup).
        Past(usize),
    }

    #[derive(Debug, Clone)]
    enum Op {
        Upsert {
            type_: usize,
            name: usize,
            uid: usize,
            shape: Shape,
        },
        /// An Upsert older than the cached state (dropped).
        StaleUpsert {
            type_: usize,
            name: usize,
            shape: Shape,
        },
        /// The cached resource's Delete, or with `stale` one older than it
        /// (dropped); a Delete of nothing cached when the key is empty.
        Delete {
            type_: usize,
            name: usize,
            stale: bool,
        },
        Resync {
            type_: usize,
            entries: Vec<Entry>,
        },
    }

    fn owner_id(owner: Owner) -> Id {
        let (name, uid, group_version, namespace) = owner;
        Id {
            uid: format!("ou{uid}"),
            name: format!("o{name}"),
            r#type: Some(Type {
                group: "g".into(),
                group_version: format!("v{}", group_version + 1),
                kind: "Owner".into(),
            }),
            tenancy: Some(Tenancy {
                partition: "default".into(),
                namespace: NAMESPACES[namespace].into(),
            }),
        }
    }

    fn make(type_: usize, name: usize, uid: usize, shape: &Shape, version: u64) -> Arc<Resource> {
        let mut r = Resource {
            id: Some(Id {
                uid: format!("u{uid}"),
                name: format!("n{name}"),
                r#type: Some(Type {
                    group: "g".into(),
                    group_version: "v1".into(),
                    kind: KINDS[type_].into(),
                }),
                tenancy: Some(Tenancy {
                    partition: "default".into(),
                    namespace: "default".into(),
                }),
            }),
            owner: shape.owner.map(|o| Box::new(owner_id(o))),
            version: version.to_string(),
            ..Default::default()
        };
        for l in &shape.labels {
            r.metadata
                .insert(format!("label/{}", LABELS[*l]), String::new());
        }
        Arc::new(r)
    }

    fn key_of(type_: usize, name: usize) -> ResourceKey {
        ResourceKey {
            group: "g".into(),
            kind: KINDS[type_].into(),
            partition: "default".into(),
            namespace: "default".into(),
            name: format!("n{name}"),
        }
    }

    fn labels_of(r: &Resource) -> Vec<String> {
        r.metadata
            .keys()
            .filter_map(|k| k.strip_prefix("label/"))
            .map(str::to_string)
            .collect()
    }

    fn first_label_of(r: &Resource) -> Vec<String> {
        labels_of(r).into_iter().take(1).collect()
    }

    fn declared() -> Vec<Index> {
        vec![
            Index::new("by-label", labels_of),
            Index::new("by-first-label", first_label_of),
        ]
    }

    fn shape() -> impl Strategy<Value = Shape> {
        (
            proptest::option::of((
                0..OWNER_NAMES,
                0..OWNER_UIDS,
                0..2usize,
                0..NAMESPACES.len(),
            )),
            proptest::collection::vec(0..LABELS.len(), 0..4),
        )
            .prop_map(|(owner, labels)| Shape { owner, labels })
    }

    fn entry() -> impl Strategy<Value = Entry> {
        prop_oneof![
            1 => Just(Entry::Absent),
            2 => Just(Entry::Keep),
            2 => (0..2usize, shape()).prop_map(|(uid, shape)| Entry::Write { uid, shape }),
            1 => any::<usize>().prop_map(Entry::Past),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        let type_ = 0..KINDS.len();
        prop_oneof![
            6 => (type_.clone(), 0..NAMES, 0..2usize, shape())
                .prop_map(|(type_, name, uid, shape)| Op::Upsert { type_, name, uid, shape }),
            1 => (type_.clone(), 0..NAMES, shape())
                .prop_map(|(type_, name, shape)| Op::StaleUpsert { type_, name, shape }),
            3 => (type_.clone(), 0..NAMES, any::<bool>())
                .prop_map(|(type_, name, stale)| Op::Delete { type_, name, stale }),
            1 => (type_, proptest::collection::vec(entry(), NAMES))
                .prop_map(|(type_, entries)| Op::Resync { type_, entries }),
        ]
    }

    /// Runs `op` at `revision` through the table's own functions; returns
    /// the type whose stream carried it (`None`: nothing was sent).
    fn apply(
        table: &mut Table,
        history: &mut BTreeMap<ResourceKey, Vec<Arc<Resource>>>,
        op: &Op,
        revision: u64,
    ) -> Option<usize> {
        match op {
            Op::Upsert {
                type_,
                name,
                uid,
                shape,
            } => {
                let r = make(*type_, *name, *uid, shape, revision);
                history
                    .entry(ResourceKey::of(&r))
                    .or_default()
                    .push(r.clone());
                table.apply_live(*type_, Some(CacheEvent::Upsert(r)), revision);
                Some(*type_)
            }
            Op::StaleUpsert { type_, name, shape } => {
                let cached = table.maps[*type_].get(&key_of(*type_, *name)).cloned()?;
                let uid = uid_of(&cached).trim_start_matches('u').parse().unwrap_or(0);
                let older = make(*type_, *name, uid, shape, 0);
                let events = table.apply_live(*type_, Some(CacheEvent::Upsert(older)), revision);
                assert!(events.is_empty(), "an older Upsert is dropped");
                Some(*type_)
            }
            Op::Delete { type_, name, stale } => {
                let gone = match table.maps[*type_].get(&key_of(*type_, *name)) {
                    Some(cached) if *stale => Arc::new(Resource {
                        version: "0".into(),
                        ..(**cached).clone()
                    }),
                    Some(cached) => cached.clone(),
                    None => make(
                        *type_,
                        *name,
                        0,
                        &Shape {
                            owner: None,
                            labels: vec![],
                        },
                        revision,
                    ),
                };
                table.apply_live(*type_, Some(CacheEvent::Delete(gone)), revision);
                Some(*type_)
            }
            Op::Resync { type_, entries } => {
                let mut snapshot = Vec::new();
                for (name, entry) in entries.iter().enumerate() {
                    let key = key_of(*type_, name);
                    let cached = table.maps[*type_].get(&key);
                    let r = match entry {
                        Entry::Absent => None,
                        // An equal copy, not the cached Arc: as off the wire.
                        Entry::Keep => cached.map(|c| Arc::new((**c).clone())),
                        Entry::Write { uid, shape } => {
                            let r = make(*type_, name, *uid, shape, revision);
                            history.entry(key.clone()).or_default().push(r.clone());
                            Some(r)
                        }
                        Entry::Past(i) => history
                            .get(&key)
                            .filter(|past| !past.is_empty())
                            .map(|past| Arc::new((*past[i % past.len()]).clone())),
                    };
                    snapshot.extend(r);
                }
                table.apply_snapshot(*type_, snapshot, revision);
                Some(*type_)
            }
        }
    }

    /// Whether `r`'s owner is `owner` by the contract's rule, field by field.
    fn owned_by(r: &Resource, owner: &Id) -> bool {
        let Some(o) = r.owner.as_deref() else {
            return false;
        };
        let (ot, qt) = (
            o.r#type.clone().unwrap_or_default(),
            owner.r#type.clone().unwrap_or_default(),
        );
        let (on, qn) = (
            o.tenancy.clone().unwrap_or_default(),
            owner.tenancy.clone().unwrap_or_default(),
        );
        ot.group == qt.group
            && ot.kind == qt.kind
            && on.partition == qn.partition
            && on.namespace == qn.namespace
            && o.name == owner.name
            && o.uid == owner.uid
    }

    fn same(found: &[Arc<Resource>], expected: &[&Arc<Resource>]) -> bool {
        found.len() == expected.len() && found.iter().zip(expected).all(|(f, e)| Arc::ptr_eq(f, e))
    }

    /// Every index against a scan of the table.
    fn check(table: &Table) -> Result<(), TestCaseError> {
        let mut scan: Vec<(&ResourceKey, &Arc<Resource>)> =
            table.maps.iter().flat_map(|m| m.iter()).collect();
        scan.sort_by(|a, b| a.0.cmp(b.0));
        let mut owner_entries = 0;
        for name in 0..OWNER_NAMES {
            for uid in 0..OWNER_UIDS {
                for namespace in 0..NAMESPACES.len() {
                    // Asked at v1: owners stored at v2 match too.
                    let owner = owner_id((name, uid, 0, namespace));
                    let expected: Vec<&Arc<Resource>> = scan
                        .iter()
                        .filter(|(_, r)| owned_by(r, &owner))
                        .map(|(_, r)| *r)
                        .collect();
                    let found = table.indexes.by_owner(&owner);
                    prop_assert!(
                        same(&found, &expected),
                        "owner {owner:?}: index {found:?}, scan {expected:?}"
                    );
                    owner_entries += expected.len();
                }
            }
        }
        let mut user_entries = Vec::new();
        for (name, keys_of) in [
            ("by-label", labels_of as fn(&Resource) -> Vec<String>),
            ("by-first-label", first_label_of),
        ] {
            let mut entries = 0;
            for label in LABELS {
                let expected: Vec<&Arc<Resource>> = scan
                    .iter()
                    .filter(|(_, r)| keys_of(r).iter().any(|k| k == label))
                    .map(|(_, r)| *r)
                    .collect();
                let found = table.indexes.by_index(name, label).unwrap();
                prop_assert!(
                    same(&found, &expected),
                    "{name} {label}: index {found:?}, scan {expected:?}"
                );
                entries += expected.len();
            }
            user_entries.push(entries);
        }
        // Nothing held under keys the scan does not produce.
        prop_assert_eq!(table.indexes.lens(), (owner_entries, user_entries));
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn every_index_matches_a_scan_of_the_table_after_every_change(
            ops in proptest::collection::vec(op(), 1..60)
        ) {
            let mut table = Table::new(KINDS.len(), declared());
            let mut history = BTreeMap::new();
            // Both types primed empty at revision 1, as after their first snapshot.
            for type_ in 0..KINDS.len() {
                table.apply_snapshot(type_, Vec::new(), 1);
            }
            let mut revisions = [1u64; KINDS.len()];
            for (step, op) in ops.iter().enumerate() {
                let revision = step as u64 + 2;
                if let Some(type_) = apply(&mut table, &mut history, op, revision) {
                    revisions[type_] = revision;
                }
                check(&table).map_err(|e| TestCaseError::fail(format!("after step {step} ({op:?}): {e}")))?;
                // Each type's revision is its stream's last; the cache's, the lowest.
                prop_assert_eq!(&table.revisions, &revisions.map(Some).to_vec());
                prop_assert_eq!(table.revision(), revisions.iter().min().copied());
            }
        }
    }
}
