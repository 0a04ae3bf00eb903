//! Watches: a lazily iterated snapshot (or a history replay), then live
//! events through a bounded per-watch buffer.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use cairn_proto::v1::{shared, watch_event, Tenancy, Type, WatchEvent};
use tokio::sync::mpsc;

use crate::history::History;
use crate::key::{self, Key};
use crate::state::{Change, State};
use crate::store::Shared;
use crate::{FsmError, Limits, Selector, StoredResource};

/// What a watch selects: the list rule (group + kind, tenancy with `*`,
/// name prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchFilter {
    /// Only group and kind are used.
    pub type_: Type,
    pub tenancy: Tenancy,
    pub name_prefix: String,
    /// Only resources whose metadata matches (None: all). A change that makes a resource
    /// stop matching is sent as a Delete, one that makes it start as an Upsert.
    pub selector: Option<Arc<Selector>>,
}

/// The event a watch with `selector` sees of `change`, if any: a resource that matches
/// after the change is an Upsert; one that matched before and no longer does (or is
/// gone) is a Delete, carrying the resource as now stored (or as last stored). With the
/// empty selector it is the change's own event. `seen` decodes each side's metadata once
/// per change, however many watches look.
pub(crate) fn selected_event(
    change: &Change,
    selector: &Selector,
    seen: &mut ChangeMetadata,
) -> Option<Event> {
    let (before, after) = seen.of(change, selector);
    let (kind, resource) = match (&change.after, after, before) {
        (Some(now), true, _) => (WatchEventKind::Upsert, now),
        (Some(now), false, true) => (WatchEventKind::Delete, now),
        (None, _, true) => match &change.before {
            Some(last) => (WatchEventKind::Delete, last),
            None => unreachable!("it matched before, so it was stored"),
        },
        (_, _, false) => return None,
    };
    Some(Event {
        kind,
        resource: Some(resource.clone()),
        revision: change.revision,
    })
}

/// The metadata of each side of one change, decoded at most once however many selector
/// watches look at the change.
#[derive(Default)]
pub(crate) struct ChangeMetadata {
    metadata: Option<[Option<std::collections::BTreeMap<String, String>>; 2]>,
}

impl ChangeMetadata {
    /// (matched before, matches after) of `change` for `selector`.
    fn of(&mut self, change: &Change, selector: &Selector) -> (bool, bool) {
        if selector.is_empty() {
            return (change.before.is_some(), change.after.is_some());
        }
        let [before, after] = self.metadata.get_or_insert_with(|| {
            let decode = |r: &Option<StoredResource>| r.as_ref().map(|r| r.resource().metadata);
            [decode(&change.before), decode(&change.after)]
        });
        (
            before.as_ref().is_some_and(|m| selector.matches(m)),
            after.as_ref().is_some_and(|m| selector.matches(m)),
        )
    }
}

/// The kind of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEventKind {
    Upsert,
    Delete,
    EndOfSnapshot,
    /// Every matching change up to `revision` was delivered before it
    /// (asked for with [`crate::Store::request_progress`]).
    Progress,
}

/// One watch event. `resource` is the stored resource for an Upsert, the
/// resource as last stored for a Delete, and `None` for EndOfSnapshot and
/// Progress. `revision` is the index of the entry that made the change, the
/// snapshot's revision for EndOfSnapshot (and for snapshot Upserts), or the
/// revision the watch has caught up with for Progress.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub kind: WatchEventKind,
    pub resource: Option<StoredResource>,
    pub revision: u64,
}

impl Event {
    /// The form a node sends: the stored resource's bytes, shared (no copy,
    /// no encoding). Wire-identical to [`Event::to_proto`].
    pub fn to_shared(&self) -> shared::WatchEvent {
        use shared::watch_event as e;
        let resource = self.resource.as_ref().map(|r| r.encoded().clone());
        let event = match self.kind {
            WatchEventKind::Upsert => e::Event::Upsert(e::Upsert { resource }),
            WatchEventKind::Delete => e::Event::Delete(e::Delete { resource }),
            WatchEventKind::EndOfSnapshot => e::Event::EndOfSnapshot(e::EndOfSnapshot {}),
            WatchEventKind::Progress => e::Event::Progress(e::Progress {}),
        };
        shared::WatchEvent {
            event: Some(event),
            revision: self.revision,
        }
    }

    /// The public message, with the resource decoded (a copy): for clients
    /// and tests, not for serving.
    pub fn to_proto(&self) -> WatchEvent {
        let resource = self.resource.as_ref().map(StoredResource::resource);
        let event = match self.kind {
            WatchEventKind::Upsert => watch_event::Event::Upsert(watch_event::Upsert { resource }),
            WatchEventKind::Delete => watch_event::Event::Delete(watch_event::Delete { resource }),
            WatchEventKind::EndOfSnapshot => {
                watch_event::Event::EndOfSnapshot(watch_event::EndOfSnapshot {})
            }
            WatchEventKind::Progress => watch_event::Event::Progress(watch_event::Progress {}),
        };
        WatchEvent {
            event: Some(event),
            revision: self.revision,
        }
    }

    fn of_change(change: &Change) -> Event {
        match (&change.after, &change.before) {
            (Some(after), _) => Event {
                kind: WatchEventKind::Upsert,
                resource: Some(after.clone()),
                revision: change.revision,
            },
            (None, Some(before)) => Event {
                kind: WatchEventKind::Delete,
                resource: Some(before.clone()),
                revision: change.revision,
            },
            (None, None) => unreachable!("a change has a before or an after"),
        }
    }
}

/// How many snapshot resources a watch fetches per seek into the tree.
const SNAPSHOT_CHUNK_RESOURCES: usize = 64;

/// What a buffered event costs beyond its resource (the event, its slot).
const EVENT_OVERHEAD_BYTES: usize = 64;

/// Why a watch was closed; set once by the writer before it drops the sender.
type CloseReason = Arc<OnceLock<String>>;

pub(crate) const REASON_LAGGING: &str = "lagging";
pub(crate) const REASON_RESTORE: &str = "restore";
/// The store itself was dropped.
pub(crate) const REASON_SHUTDOWN: &str = "shutdown";

/// A live event in a watch's buffer, with the bytes it is charged for.
struct Buffered {
    event: Event,
    size_bytes: usize,
}

/// Bytes of live events buffered and not yet read: one counter per watch,
/// one for the whole store. The writer adds when it buffers an event; the
/// consumer subtracts when it takes one out or drops the watch.
#[derive(Clone, Default)]
struct Unread {
    watch_bytes: Arc<AtomicUsize>,
    store_bytes: Arc<AtomicUsize>,
}

impl Unread {
    fn add(&self, size_bytes: usize) {
        self.watch_bytes.fetch_add(size_bytes, Ordering::SeqCst);
        self.store_bytes.fetch_add(size_bytes, Ordering::SeqCst);
    }

    fn take(&self, size_bytes: usize) {
        let before = self.watch_bytes.fetch_sub(size_bytes, Ordering::SeqCst);
        assert!(
            before >= size_bytes,
            "a watch never reads more than it buffered"
        );
        let before = self.store_bytes.fetch_sub(size_bytes, Ordering::SeqCst);
        assert!(
            before >= size_bytes,
            "the store's unread bytes cover every watch's"
        );
    }

    /// Releases everything still charged to this watch (it is gone).
    fn release(&self) {
        let left = self.watch_bytes.swap(0, Ordering::SeqCst);
        let before = self.store_bytes.fetch_sub(left, Ordering::SeqCst);
        assert!(
            before >= left,
            "the store's unread bytes cover every watch's"
        );
    }
}

/// The writer's handle on one watch.
struct Subscriber {
    id: u64,
    tenancy: Tenancy,
    name_prefix: String,
    selector: Option<Arc<Selector>>,
    sender: mpsc::Sender<Buffered>,
    close_reason: CloseReason,
    unread: Unread,
}

/// What a store's watches have done, for monitoring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchStats {
    pub open: u64,
    pub unread_bytes: u64,
    pub events_queued_total: u64,
    pub closed_lagging_total: u64,
}

/// Open watches, indexed by (group, kind) so a change only visits the
/// watches of its type. Lives under the writer lock.
#[derive(Default)]
pub(crate) struct Registry {
    by_type: HashMap<Box<str>, Vec<Subscriber>>,
    count: usize,
    next_id: u64,
    /// Since the store was created: events buffered for watches, and watches closed for
    /// lagging (each missed the event it could not take).
    events_queued_total: u64,
    closed_lagging_total: u64,
    /// Unread bytes of every watch of this store.
    unread_bytes: Arc<AtomicUsize>,
}

impl Registry {
    pub fn len(&self) -> usize {
        self.count
    }

    /// Bytes of live events buffered in every watch and not yet read.
    pub fn unread_bytes(&self) -> usize {
        self.unread_bytes.load(Ordering::SeqCst)
    }

    pub fn stats(&self) -> WatchStats {
        WatchStats {
            open: self.count as u64,
            unread_bytes: self.unread_bytes() as u64,
            events_queued_total: self.events_queued_total,
            closed_lagging_total: self.closed_lagging_total,
        }
    }

    fn add(&mut self, type_key: &str, subscriber: Subscriber) {
        self.by_type
            .entry(type_key.into())
            .or_default()
            .push(subscriber);
        self.count += 1;
    }

    /// Removes a watch that is still registered (its consumer dropped it).
    pub fn remove(&mut self, type_key: &str, id: u64) {
        let Some(subscribers) = self.by_type.get_mut(type_key) else {
            return;
        };
        let before = subscribers.len();
        subscribers.retain(|s| s.id != id);
        let removed = before - subscribers.len();
        assert!(removed <= 1, "watch ids are unique");
        self.count -= removed;
        if subscribers.is_empty() {
            self.by_type.remove(type_key);
        }
    }

    /// Sends the event of a committed change to every matching watch. A
    /// watch whose buffer is full, or whose unread bytes would go over
    /// `watch_buffer_bytes_max` (or the store's over
    /// `watch_buffers_bytes_max`), is closed as lagging (it keeps what it
    /// buffered); a watch whose consumer is gone is dropped. One Arc clone per
    /// matching watch, no other allocation.
    pub fn publish(&mut self, change: &Change, limits: &Limits) {
        let type_key = key::type_key_of_storage_key(&change.key);
        let Some(subscribers) = self.by_type.get_mut(type_key) else {
            return;
        };
        let event = Event::of_change(change);
        // What a buffered event costs: the resource it holds alive (the
        // table may move on to a newer version), its encoding.
        let size_bytes = event
            .resource
            .as_ref()
            .map(|r| r.encoded().len())
            .unwrap_or(0)
            + EVENT_OVERHEAD_BYTES;
        let before = subscribers.len();
        let store_bytes = &self.unread_bytes;
        let (mut queued, mut lagging) = (0u64, 0u64);
        let mut metadata = ChangeMetadata::default();
        subscribers.retain(|s| {
            if !key::tenancy_matches(&change.key, &s.tenancy, &s.name_prefix) {
                return true;
            }
            let selected;
            let (event, size_bytes) = match s.selector.as_deref() {
                None => (&event, size_bytes),
                Some(selector) => match selected_event(change, selector, &mut metadata) {
                    Some(e) => {
                        selected = e;
                        (&selected, size_bytes)
                    }
                    None => return true,
                },
            };
            let watch_unread = s.unread.watch_bytes.load(Ordering::SeqCst);
            if watch_unread + size_bytes > limits.watch_buffer_bytes_max {
                let _first = s.close_reason.set(format!(
                    "{REASON_LAGGING}: {} unread bytes would exceed watch_buffer_bytes_max = {}",
                    watch_unread + size_bytes,
                    limits.watch_buffer_bytes_max
                ));
                lagging += 1;
                return false;
            }
            let store_unread = store_bytes.load(Ordering::SeqCst);
            if store_unread + size_bytes > limits.watch_buffers_bytes_max {
                let _first = s.close_reason.set(format!(
                    "{REASON_LAGGING}: the node's unread watch events would exceed \
                     watch_buffers_bytes_max = {}",
                    limits.watch_buffers_bytes_max
                ));
                lagging += 1;
                return false;
            }
            let buffered = Buffered {
                event: event.clone(),
                size_bytes,
            };
            // Charged before it is sent: the consumer may take it out (and
            // give the bytes back) as soon as it is in the buffer.
            s.unread.add(size_bytes);
            match s.sender.try_send(buffered) {
                Ok(()) => {
                    queued += 1;
                    true
                }
                Err(mpsc::error::TrySendError::Full(_)) => {
                    s.unread.take(size_bytes);
                    let _first = s.close_reason.set(REASON_LAGGING.to_string());
                    lagging += 1;
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    s.unread.take(size_bytes);
                    false
                }
            }
        });
        self.count -= before - subscribers.len();
        if subscribers.is_empty() {
            self.by_type.remove(type_key);
        }
        // Each watch closed for lagging missed this event.
        self.events_queued_total += queued;
        self.closed_lagging_total += lagging;
    }

    /// Queues a Progress event at `revision` on each watch named in `ids`
    /// (behind every change already queued for it) and returns the ids that
    /// got one. Called under the writer lock with the revision every published
    /// change is at or below, so the event is true for every watch. Unknown ids
    /// (a watch since closed, another node's) are skipped, and so is a watch
    /// whose buffer is full: it is about to be closed as lagging, and its
    /// consumer resyncs.
    pub fn progress(&mut self, ids: &[u64], revision: u64) -> Vec<u64> {
        let wanted: HashSet<u64> = ids.iter().copied().collect();
        let mut delivered = Vec::new();
        for subscriber in self.by_type.values().flatten() {
            if !wanted.contains(&subscriber.id) {
                continue;
            }
            let buffered = Buffered {
                event: Event {
                    kind: WatchEventKind::Progress,
                    resource: None,
                    revision,
                },
                size_bytes: EVENT_OVERHEAD_BYTES,
            };
            subscriber.unread.add(EVENT_OVERHEAD_BYTES);
            match subscriber.sender.try_send(buffered) {
                Ok(()) => delivered.push(subscriber.id),
                Err(_) => subscriber.unread.take(EVENT_OVERHEAD_BYTES),
            }
        }
        assert!(delivered.len() <= ids.len(), "a watch id names one watch");
        delivered
    }

    /// Closes every watch with `reason`; each consumer receives what it had
    /// buffered, then WatchClosed.
    pub fn close_all(&mut self, reason: &str) {
        for (_, subscribers) in self.by_type.drain() {
            for s in subscribers {
                let _first = s.close_reason.set(reason.to_string());
            }
        }
        self.count = 0;
    }
}

/// Where a watch is in its stream.
enum Phase {
    /// Yielding the matching resources of `state` after `cursor`, then
    /// EndOfSnapshot. Iterated lazily, [`SNAPSHOT_CHUNK_RESOURCES`] at a time
    /// (one tree seek per chunk): nothing is copied into the event buffer.
    Snapshot {
        state: Arc<State>,
        /// The last key fetched into `ready` (None = start of the scan).
        cursor: Option<Key>,
        /// Fetched and not yet returned, in key order.
        ready: VecDeque<StoredResource>,
        /// Whether the scan reached its end.
        scanned: bool,
    },
    /// Replaying the matching changes of `history` from sequence `position`.
    Replay { history: History, position: u64 },
    /// Reading live events from the buffer.
    Live,
    /// Closed; the reason is returned on every later call.
    Closed(String),
}

/// Removes the watch from the registry when the Watch is dropped, then
/// releases the unread bytes still charged to it.
struct Registration {
    shared: Weak<Shared>,
    type_key: Box<str>,
    id: u64,
    unread: Unread,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            shared
                .writer
                .lock()
                .registry
                .remove(&self.type_key, self.id);
        }
        // No writer sends to this watch any more: what it still holds is freed.
        self.unread.release();
    }
}

/// An open watch. `Send`; dropping it releases the subscription.
pub struct Watch {
    filter: WatchFilter,
    matcher: key::Matcher,
    phase: Phase,
    receiver: mpsc::Receiver<Buffered>,
    close_reason: CloseReason,
    /// Live events at or below this revision are skipped (a watch that
    /// starts from a revision the node has not applied yet).
    skip_through_revision: u64,
    _registration: Registration,
}

/// Registers a watch. Called with the writer lock held, with the state and
/// history that the latest published revision reflects, so nothing is lost
/// or duplicated between them and the live events.
pub(crate) fn register(
    shared: &Arc<Shared>,
    registry: &mut Registry,
    filter: WatchFilter,
    state: Arc<State>,
    history: History,
    start_revision: u64,
    buffer_events: usize,
) -> Watch {
    let (sender, receiver) = mpsc::channel(buffer_events.max(1));
    let close_reason = CloseReason::default();
    let type_key = key::type_key(&filter.type_.group, &filter.type_.kind);
    let id = registry.next_id;
    registry.next_id += 1;
    let unread = Unread {
        watch_bytes: Arc::default(),
        store_bytes: registry.unread_bytes.clone(),
    };
    registry.add(
        &type_key,
        Subscriber {
            id,
            tenancy: filter.tenancy.clone(),
            name_prefix: filter.name_prefix.clone(),
            selector: filter.selector.clone(),
            sender,
            close_reason: close_reason.clone(),
            unread: unread.clone(),
        },
    );
    let phase = if start_revision == 0 {
        Phase::Snapshot {
            state,
            cursor: None,
            ready: VecDeque::new(),
            scanned: false,
        }
    } else {
        let position = history.first_after(start_revision);
        Phase::Replay { history, position }
    };
    Watch {
        matcher: key::Matcher::new(&filter.type_, &filter.tenancy, &filter.name_prefix),
        filter,
        phase,
        receiver,
        close_reason,
        skip_through_revision: start_revision,
        _registration: Registration {
            shared: Arc::downgrade(shared),
            type_key: type_key.into(),
            id,
            unread,
        },
    }
}

impl Watch {
    /// The filter this watch was opened with.
    pub fn filter(&self) -> &WatchFilter {
        &self.filter
    }

    /// This watch's id, unique among the watches a store ever opened: what
    /// [`crate::Store::request_progress`] names it by.
    pub fn id(&self) -> u64 {
        self._registration.id
    }

    /// The next event if one is ready: `Ok(None)` = nothing now. After the
    /// store closed the watch (restore, lagging, shutdown) every buffered event
    /// is still returned, then `Err(WatchClosed)` on this and every later call.
    pub fn try_next(&mut self) -> Result<Option<Event>, FsmError> {
        if let Some(event) = self.next_local()? {
            return Ok(Some(event));
        }
        loop {
            match self.receiver.try_recv() {
                Ok(event) => {
                    if let Some(event) = self.accept_live(event) {
                        return Ok(Some(event));
                    }
                }
                Err(mpsc::error::TryRecvError::Empty) => return Ok(None),
                Err(mpsc::error::TryRecvError::Disconnected) => return Err(self.close()),
            }
        }
    }

    /// Waits for the next event on the current thread. For tests and
    /// benches; must not be called from within an async runtime.
    pub fn next_blocking(&mut self) -> Result<Event, FsmError> {
        if let Some(event) = self.next_local()? {
            return Ok(event);
        }
        loop {
            match self.receiver.blocking_recv() {
                Some(event) => {
                    if let Some(event) = self.accept_live(event) {
                        return Ok(event);
                    }
                }
                None => return Err(self.close()),
            }
        }
    }

    /// Waits for the next event. Cancel-safe: dropping the future loses
    /// nothing. Works on any executor (the fsm never spawns).
    pub async fn next(&mut self) -> Result<Event, FsmError> {
        if let Some(event) = self.next_local()? {
            return Ok(event);
        }
        loop {
            match self.receiver.recv().await {
                Some(event) => {
                    if let Some(event) = self.accept_live(event) {
                        return Ok(event);
                    }
                }
                None => return Err(self.close()),
            }
        }
    }

    fn accept_live(&self, buffered: Buffered) -> Option<Event> {
        self._registration.unread.take(buffered.size_bytes);
        let event = buffered.event;
        (event.revision > self.skip_through_revision).then_some(event)
    }

    /// Marks the watch closed and returns the error to report.
    fn close(&mut self) -> FsmError {
        let reason = self
            .close_reason
            .get()
            .cloned()
            .unwrap_or_else(|| REASON_SHUTDOWN.to_string());
        self.phase = Phase::Closed(reason.clone());
        FsmError::WatchClosed { reason }
    }

    /// Advances the snapshot or replay phase; `Ok(None)` once live.
    fn next_local(&mut self) -> Result<Option<Event>, FsmError> {
        match &mut self.phase {
            Phase::Snapshot {
                state,
                cursor,
                ready,
                scanned,
            } => {
                if ready.is_empty() && !*scanned {
                    let scan_prefix = self.matcher.scan_prefix();
                    let lower = match cursor {
                        None => Bound::Included(scan_prefix),
                        Some(k) => Bound::Excluded(&**k),
                    };
                    let mut last = None;
                    let mut scan = state
                        .resources
                        .range::<_, str>((lower, Bound::Unbounded))
                        .take_while(|(k, _)| k.starts_with(scan_prefix))
                        .filter(|(k, _)| self.matcher.matches_key(k))
                        .filter(|(_, r)| {
                            self.filter.selector.as_deref().is_none_or(|s| s.selects(r))
                        });
                    for (k, r) in scan.by_ref().take(SNAPSHOT_CHUNK_RESOURCES) {
                        ready.push_back(r.clone());
                        last = Some(k);
                    }
                    match last {
                        Some(k) if ready.len() == SNAPSHOT_CHUNK_RESOURCES => {
                            *cursor = Some(k.clone())
                        }
                        _ => *scanned = true,
                    }
                }
                let revision = state.revision;
                match ready.pop_front() {
                    Some(r) => Ok(Some(Event {
                        kind: WatchEventKind::Upsert,
                        resource: Some(r),
                        revision,
                    })),
                    None => {
                        assert!(*scanned, "an empty chunk ends the scan");
                        self.phase = Phase::Live;
                        Ok(Some(Event {
                            kind: WatchEventKind::EndOfSnapshot,
                            resource: None,
                            revision,
                        }))
                    }
                }
            }
            Phase::Replay { history, position } => {
                while let Some(change) = history.get(*position) {
                    *position += 1;
                    if !self.matcher.matches_key(&change.key) {
                        continue;
                    }
                    match self.filter.selector.as_deref() {
                        None => return Ok(Some(Event::of_change(change))),
                        Some(selector) => {
                            let mut metadata = ChangeMetadata::default();
                            if let Some(event) = selected_event(change, selector, &mut metadata) {
                                return Ok(Some(event));
                            }
                        }
                    }
                }
                self.phase = Phase::Live;
                Ok(None)
            }
            Phase::Live => Ok(None),
            Phase::Closed(reason) => Err(FsmError::WatchClosed {
                reason: reason.clone(),
            }),
        }
    }
}
