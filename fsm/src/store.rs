//! The store: one writer applying commands in log order, any number of
//! readers taking O(1) point-in-time views.

use std::sync::Arc;

use cairn_proto::v1::{Id, Resource};
use parking_lot::{Mutex, MutexGuard, RwLock};
use prost::Message;

use crate::capacity::{self, SpaceRefusal, SpaceState, TenantGrowth};
use crate::history::History;
use crate::integrity::CorruptAlarm;
use crate::key::{self, Key};
use crate::lease::{self, Lease, LeaseApplied};
use crate::lifecycle;
use crate::restore::{self, PendingRestore, PendingRestoreStatus};
use crate::snapshot::{Restoration, Snapshot};
use crate::state::{Change, State, View};
use crate::validate::{validate_id, validate_list, validate_write, Limits};
use crate::version::{ClusterVersionState, Feature};
use crate::watch::{self, Registry, Watch, WatchFilter};
use crate::{Command, FsmError, StoredResource};

/// What a successful command did.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// The resource as stored, with its new version.
    Written(StoredResource),
    /// `existed = false` for the no-op deletes (nothing stored, or another
    /// lifetime stored): nothing changed and no event was published.
    Deleted { existed: bool },
    /// An online restore is now pending.
    RestoreBegun,
    /// A chunk was added; `received` resources have arrived so far.
    RestoreChunkAdded { received: u64 },
    /// The pending restore was swapped in with this many resources.
    Restored { resource_count: u64 },
    /// `existed = false`: no such restore was pending, nothing changed.
    RestoreAborted { existed: bool },
    /// The outcome of each command of a [`Command::Batch`], in order.
    Batch(Vec<Result<Applied, FsmError>>),
    /// The cluster version after a [`Command::ClusterVersion`].
    ClusterVersion(ClusterVersionState),
    /// The space quota and alarm after a [`Command::Capacity`].
    Capacity(SpaceState),
    /// What a lease command did ([`crate::lease`]).
    Lease(LeaseApplied),
    /// A Delete that only marked the resource (it has finalizers, or it orphans what it
    /// owns: [`crate::lifecycle`]): the resource as now stored.
    Marked(StoredResource),
    /// A [`Command::Collect`]: how many dependents (or the owner) it changed.
    Collected { changed: u64 },
    /// The `CORRUPT` alarm after a [`Command::Integrity`].
    Integrity(CorruptAlarm),
}

/// A member's table digest at one index ([`Store::digest_at`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DigestAt {
    /// The digest of the table after the entry at that index.
    Known(u64),
    /// That index is not applied here yet.
    NotYet { applied_index: u64 },
    /// That index is older than the digests kept ([`crate::integrity::DIGESTS_KEPT`]) or
    /// lies inside a snapshot this member installed.
    Forgotten { oldest_index: u64 },
}

/// What readers see: the latest state and the history that leads to it.
/// Replaced as a whole after every batch of applied entries.
pub(crate) struct Published {
    pub state: Arc<State>,
    pub history: History,
    pub oldest_retained_revision: u64,
    /// The online restore in progress (a copy, O(1) to take).
    pub pending: Option<PendingRestore>,
    /// The cluster version at `state.revision`.
    pub cluster: ClusterVersionState,
    /// The space quota and its alarm at `state.revision`.
    pub space: SpaceState,
    /// The `CORRUPT` alarm at `state.revision` ([`crate::integrity`]).
    pub corrupt: CorruptAlarm,
}

/// Everything the single writer owns.
pub(crate) struct Writer {
    /// The latest state; `state.revision` is the applied index.
    pub state: State,
    /// The last `history_changes_max` changes, oldest first, revisions
    /// strictly increasing.
    pub history: History,
    /// The oldest revision whose state can be rebuilt from `history`.
    pub oldest_retained_revision: u64,
    /// The highest version ever assigned by this store (also before a restore).
    pub version_issued_max: u64,
    pub registry: Registry,
    /// The online restore in progress, if any (`crate::restore`).
    pub pending: Option<PendingRestore>,
    /// The cluster version (`crate::version`); an online restore leaves it alone.
    pub cluster: ClusterVersionState,
    /// The space quota and its alarm (`crate::capacity`); an online restore leaves them.
    pub space: SpaceState,
    /// The `CORRUPT` alarm (`crate::integrity`); an online restore leaves it.
    pub corrupt: CorruptAlarm,
    /// (applied index, table digest after it) for the last
    /// [`crate::integrity::DIGESTS_KEPT`] indexes applied, oldest first.
    pub digests: std::collections::VecDeque<(u64, u64)>,
    /// The bytes of the resources the history holds that the table no longer does (the
    /// before-images of its changes).
    pub history_bytes: u64,
    /// Changes applied in the current batch, not yet sent to watches. Kept
    /// here so its capacity is reused from batch to batch.
    pub unpublished: Vec<Change>,
    /// Whether the current batch changed anything readers can see.
    pub dirty: bool,
}

pub(crate) struct Shared {
    /// This node's configured limits (for the node's checks before it
    /// proposes, and for its own lists, history and watches).
    pub limits: Limits,
    /// What applied entries, restores and snapshots are checked against:
    /// `limits.applied()`, the same on every replica.
    pub apply_limits: Limits,
    /// Readers hold this lock only to clone the Arc.
    pub published: RwLock<Arc<Published>>,
    /// Lock order: `writer`, then `published`.
    pub writer: Mutex<Writer>,
}

impl Shared {
    /// Makes the writer's state the one readers see.
    pub(crate) fn publish(&self, w: &mut Writer) {
        note_digest(w);
        assert!(
            w.space.holds_with(w.state.usage.bytes),
            "a raised NOSPACE alarm has a quota and usage above its low-water mark"
        );
        let next = Arc::new(Published {
            state: Arc::new(w.state.clone()),
            history: w.history.clone(),
            oldest_retained_revision: w.oldest_retained_revision,
            pending: w.pending.clone(),
            cluster: w.cluster,
            space: w.space,
            corrupt: w.corrupt.clone(),
        });
        let previous = {
            let mut guard = self.published.write();
            std::mem::replace(&mut *guard, next)
        };
        w.dirty = false;
        // The old image is released outside the lock.
        drop(previous);
    }
}

/// The replicated resource table. Cheap to clone (an `Arc` inside); `Send +
/// Sync`. See the crate docs for the concurrency model and invariants.
#[derive(Clone)]
pub struct Store {
    pub(crate) shared: Arc<Shared>,
}

impl Store {
    /// An empty store at applied index 0.
    pub fn new(limits: Limits) -> Store {
        let published = Published {
            state: Arc::new(State::default()),
            history: History::default(),
            oldest_retained_revision: 0,
            pending: None,
            cluster: ClusterVersionState::default(),
            space: SpaceState::default(),
            corrupt: CorruptAlarm::default(),
        };
        Store {
            shared: Arc::new(Shared {
                apply_limits: limits.applied(),
                limits,
                published: RwLock::new(Arc::new(published)),
                writer: Mutex::new(Writer {
                    state: State::default(),
                    history: History::default(),
                    oldest_retained_revision: 0,
                    version_issued_max: 0,
                    registry: Registry::default(),
                    pending: None,
                    cluster: ClusterVersionState::default(),
                    space: SpaceState::default(),
                    corrupt: CorruptAlarm::default(),
                    digests: Default::default(),
                    history_bytes: 0,
                    unpublished: Vec::new(),
                    dirty: false,
                }),
            }),
        }
    }

    /// The limits this store was configured with: what the node checks a
    /// request against before it proposes it (applied entries are checked
    /// against [`Limits::applied`] only).
    pub fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    /// Starts a batch: applies several entries under one writer lock and
    /// publishes them together when the batch ends (one copy of the touched
    /// tree paths per batch instead of per entry). Readers keep reading the
    /// state before the batch until then; watch registration and other writes
    /// wait. Use it for the entries of one apply call from Raft.
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            shared: &self.shared,
            writer: self.shared.writer.lock(),
        }
    }

    /// Applies a decoded command carried by the log entry at `index`.
    ///
    /// `index` must exceed the applied index and every version issued before
    /// (a violation is a bug in the caller: panic). The applied index becomes
    /// `index` whatever the outcome, so a CAS failure is the same on every
    /// replica. A successful write is stored with version `index.to_string()`.
    /// Watch events are published after the change is visible to readers.
    /// The same as a [`Batch`] of one entry.
    pub fn apply(&self, index: u64, command: &Command) -> Result<Applied, FsmError> {
        let mut batch = self.batch();
        let result = batch.apply(index, command);
        batch.finish();
        result
    }

    /// As [`Store::apply`], taking the command by value so a written resource
    /// is moved into the table rather than copied.
    pub fn apply_owned(&self, index: u64, command: Command) -> Result<Applied, FsmError> {
        let mut batch = self.batch();
        let result = batch.apply_owned(index, command);
        batch.finish();
        result
    }

    /// Advances the applied index for a log entry that changes no data
    /// (blank, membership).
    pub fn apply_noop(&self, index: u64) {
        let mut batch = self.batch();
        batch.apply_noop(index);
        batch.finish();
    }

    /// The index of the last applied entry that readers can see.
    pub fn applied_index(&self) -> u64 {
        self.shared.published.read().state.revision
    }

    /// The cluster version as of [`Store::applied_index`] (`crate::version`).
    pub fn cluster_version(&self) -> ClusterVersionState {
        self.shared.published.read().cluster
    }

    /// The space quota and its alarm as of [`Store::applied_index`] (`crate::capacity`).
    pub fn space(&self) -> SpaceState {
        self.shared.published.read().space
    }

    /// The `CORRUPT` alarm as of [`Store::applied_index`] (`crate::integrity`).
    pub fn corrupt_alarm(&self) -> CorruptAlarm {
        self.shared.published.read().corrupt.clone()
    }

    /// The table's digest after the entry at `index` ([`crate::integrity`]), if this store
    /// still knows it. Waits for a batch being applied to end.
    pub fn digest_at(&self, index: u64) -> DigestAt {
        let w = self.shared.writer.lock();
        let applied_index = w.state.revision;
        if index > applied_index {
            return DigestAt::NotYet { applied_index };
        }
        if index == applied_index {
            return DigestAt::Known(w.state.digest);
        }
        match w.digests.binary_search_by_key(&index, |(i, _)| *i) {
            Ok(at) => DigestAt::Known(w.digests[at].1),
            Err(_) => DigestAt::Forgotten {
                oldest_index: w.digests.front().map_or(applied_index, |(i, _)| *i),
            },
        }
    }

    /// DANGEROUS, test-only (`cairn agent --unsafe-alter-applied-state`): changes the data
    /// of the first stored resource in this member's table only, as a bad RAM bit or a bug in
    /// apply would, keeping its version. Returns its storage key (None: the table is empty).
    /// Its digest follows (the table is changed through the one setter).
    #[doc(hidden)]
    pub fn unsafe_alter_one_resource_for_tests(&self) -> Option<String> {
        let mut w = self.shared.writer.lock();
        let (key, stored) = w
            .state
            .resources
            .iter()
            .next()
            .map(|(k, v)| (k.clone(), v.clone()))?;
        let mut resource = stored.resource();
        let mut data = resource.data.take().unwrap_or_default();
        let mut value = data.value.to_vec();
        value.push(0x2a);
        data.value = value.into();
        resource.data = Some(data);
        let altered = StoredResource::new(&resource, &key);
        w.state.set(&key, Some(altered));
        self.shared.publish(&mut w);
        Some(key.to_string())
    }

    /// Bytes the history holds of resources the table no longer does (bounded by
    /// [`Limits::history_bytes_max`]).
    pub fn history_bytes(&self) -> u64 {
        self.shared.writer.lock().history_bytes
    }

    /// The capacity rules ([`crate::capacity`]) for `command` against the latest state:
    /// what the node checks before it proposes a write, so that a write over a quota is
    /// refused before it reaches the log. Apply checks again with the exact size. Only
    /// writes and status writes can be refused; a write whose other checks fail (a CAS
    /// failure, an absent resource) passes here and fails at apply.
    pub fn check_capacity(&self, command: &Command) -> Result<(), FsmError> {
        let published = self.shared.published.read().clone();
        let state = &published.state;
        // The rules hold from cluster version 0.2 on, as at apply.
        if published.cluster.require(Feature::Capacity).is_err()
            || (published.space == SpaceState::default() && !any_quota(state))
        {
            return Ok(());
        }
        let resource = match command {
            Command::Write { resource } => std::borrow::Cow::Borrowed(resource),
            Command::WriteStatus {
                id,
                key,
                status,
                version,
            } => match with_status(
                state,
                &self.shared.limits,
                id,
                key.clone(),
                status.clone(),
                version,
            ) {
                Ok(resource) => std::borrow::Cow::Owned(resource),
                Err(_) => return Ok(()),
            },
            _ => return Ok(()),
        };
        let Some(id) = resource.id.as_ref() else {
            return Ok(());
        };
        let key = key::storage_key(id);
        let stored = state.resources.get(key.as_str());
        let owner_entry_len = resource
            .owner
            .as_ref()
            .map(|owner| key::owner_entry(owner, &key).len());
        let growth = growth_over(
            stored,
            capacity::accounted_bytes(resource.encoded_len(), key.len(), owner_entry_len),
            key.len(),
        );
        check_capacity(state, published.space, &key, growth)
            .map_err(|refusal| refusal.into_error(state, published.space, growth))
    }

    /// The oldest revision that [`Store::view_at`] and [`Store::watch`] can
    /// still serve.
    pub fn oldest_retained_revision(&self) -> u64 {
        self.shared.published.read().oldest_retained_revision
    }

    /// How many watches are registered.
    pub fn watch_count(&self) -> usize {
        self.shared.writer.lock().registry.len()
    }

    /// Bytes of live watch events buffered and not yet read, over every
    /// watch (bounded by [`Limits::watch_buffers_bytes_max`]).
    pub fn watch_unread_bytes(&self) -> usize {
        self.shared.writer.lock().registry.unread_bytes()
    }

    /// What the watches have done, for monitoring.
    pub fn watch_stats(&self) -> crate::watch::WatchStats {
        self.shared.writer.lock().registry.stats()
    }

    /// The latest state, O(1).
    pub fn view(&self) -> View {
        View {
            state: self.shared.published.read().state.clone(),
        }
    }

    /// The state at `revision` (0 = the latest). A revision older than the
    /// retained history is `Compacted`; one beyond the applied index is
    /// `InvalidArgument { field: "revision" }` (the caller waits for it to be
    /// applied first). Costs O(changes since `revision` x log n), outside
    /// every lock.
    pub fn view_at(&self, revision: u64) -> Result<View, FsmError> {
        let published = self.shared.published.read().clone();
        let latest = published.state.revision;
        if revision == 0 || revision == latest {
            return Ok(View {
                state: published.state.clone(),
            });
        }
        if revision > latest {
            return Err(FsmError::invalid(
                "revision",
                format!("{revision} is beyond the applied index {latest}"),
            ));
        }
        if revision < published.oldest_retained_revision {
            return Err(FsmError::Compacted {
                oldest_retained_revision: published.oldest_retained_revision,
            });
        }
        let history = &published.history;
        let mut state = (*published.state).clone();
        let mut sequence = history.end();
        while sequence > history.start() {
            sequence -= 1;
            let Some(change) = history.get(sequence) else {
                unreachable!("the window holds every sequence in [start, end)")
            };
            if change.revision <= revision {
                break;
            }
            let undone = state.set(&change.key, change.before.clone());
            let found_after = match (&undone, &change.after) {
                (Some(undone), Some(after)) => StoredResource::ptr_eq(undone, after),
                (None, None) => true,
                _ => false,
            };
            assert!(found_after, "undoing a change finds its after-image");
        }
        state.revision = revision;
        Ok(View {
            state: Arc::new(state),
        })
    }

    /// Opens a watch. `start_revision = 0`: one Upsert per matching resource
    /// of the latest state, then EndOfSnapshot, then live events. `r > 0`:
    /// every matching change after `r`, then live events; `Compacted` if `r`
    /// is older than the retained history.
    pub fn watch(&self, filter: WatchFilter, start_revision: u64) -> Result<Watch, FsmError> {
        validate_list(
            &filter.type_,
            &filter.tenancy,
            &filter.name_prefix,
            &self.shared.limits,
        )?;
        let mut w = self.shared.writer.lock();
        if start_revision != 0 && start_revision < w.oldest_retained_revision {
            return Err(FsmError::Compacted {
                oldest_retained_revision: w.oldest_retained_revision,
            });
        }
        // Under the writer lock, outside a batch, the published state is the
        // writer's state: the snapshot and the registration are atomic w.r.t.
        // apply.
        assert!(!w.dirty, "no batch is open while the writer lock is free");
        let published = self.shared.published.read().clone();
        assert_eq!(
            published.state.revision, w.state.revision,
            "published is current under the writer lock"
        );
        Ok(watch::register(
            &self.shared,
            &mut w.registry,
            filter,
            published.state.clone(),
            published.history.clone(),
            start_revision,
            self.shared.limits.watch_buffer_events,
        ))
    }

    /// Queues a Progress event on each open watch of this store named in
    /// `watch_ids` ([`Watch::id`]), at the latest applied revision, behind
    /// every change up to it: a consumer that reads it has every matching
    /// change up to that revision. Returns the revision and the ids that got
    /// the event (a closed watch's id, or one whose buffer is full, does not).
    pub fn request_progress(&self, watch_ids: &[u64]) -> (u64, Vec<u64>) {
        let mut w = self.shared.writer.lock();
        // Outside a batch every applied change was published, to watches too.
        assert!(!w.dirty, "no batch is open while the writer lock is free");
        let revision = w.state.revision;
        assert_eq!(
            self.shared.published.read().state.revision,
            revision,
            "published is current under the writer lock"
        );
        let delivered = w.registry.progress(watch_ids, revision);
        (revision, delivered)
    }

    /// A consistent point-in-time image of the whole table, O(1) to take,
    /// iterated lazily; writes go on meanwhile.
    pub fn snapshot(&self) -> Snapshot {
        let published = self.shared.published.read().clone();
        Snapshot::new(&published)
    }

    /// The online restore in progress, if any.
    pub fn pending_restore(&self) -> Option<PendingRestoreStatus> {
        self.shared
            .published
            .read()
            .pending
            .as_ref()
            .map(PendingRestore::status)
    }

    /// Starts a restore into a separate table; nothing changes until
    /// [`Restoration::commit`].
    pub fn restore(&self) -> Restoration {
        Restoration::new(self.shared.clone())
    }
}

/// Several log entries applied under one writer lock and published together
/// when the batch ends ([`Batch::finish`] or drop). Results are returned as
/// each entry is applied, but readers (and `applied_index`) see the entries
/// only once the batch ends, so answer clients after that. Watch events are
/// sent at the end, in commit order, after the state is visible.
pub struct Batch<'a> {
    shared: &'a Shared,
    writer: MutexGuard<'a, Writer>,
}

impl Batch<'_> {
    /// As [`Store::apply`], within the batch.
    pub fn apply(&mut self, index: u64, command: &Command) -> Result<Applied, FsmError> {
        match command {
            Command::Write { resource } => {
                self.advance(index);
                self.write(index, WriteInput::Borrowed(resource))
            }
            Command::Delete {
                id,
                version,
                now_ms,
                orphan,
            } => {
                self.advance(index);
                self.delete(index, id, version, *now_ms, *orphan)
            }
            // Rare or resource-carrying: one implementation, in `apply_owned`.
            Command::Batch { .. }
            | Command::RestoreChunk { .. }
            | Command::WriteStatus { .. }
            | Command::Capacity { .. }
            | Command::Integrity { .. }
            | Command::LeaseGrant { .. }
            | Command::LeaseRevoke { .. }
            | Command::LeaseKeepAlive { .. }
            | Command::LeaseExpire { .. }
            | Command::Fenced { .. }
            | Command::Collect { .. }
            | Command::ClusterVersion { .. } => self.apply_owned(index, command.clone()),
            other => self.restore(index, other),
        }
    }

    /// As [`Store::apply_owned`], within the batch.
    pub fn apply_owned(&mut self, index: u64, command: Command) -> Result<Applied, FsmError> {
        match command {
            Command::Write { resource } => {
                self.advance(index);
                self.write(index, WriteInput::Owned(resource))
            }
            Command::Delete {
                id,
                version,
                now_ms,
                orphan,
            } => {
                self.advance(index);
                self.delete(index, &id, &version, now_ms, orphan)
            }
            Command::Batch { commands } => {
                self.advance(index);
                let results = commands
                    .into_iter()
                    .map(|c| match c {
                        Command::Write { resource } => {
                            self.write(index, WriteInput::Owned(resource))
                        }
                        Command::Delete {
                            id,
                            version,
                            now_ms,
                            orphan,
                        } => self.delete(index, &id, &version, now_ms, orphan),
                        _ => unreachable!("a batch holds only writes and deletes"),
                    })
                    .collect();
                Ok(Applied::Batch(results))
            }
            Command::RestoreChunk {
                restore_id,
                resources,
            } => {
                self.advance(index);
                restore::chunk(
                    &mut self.writer,
                    &self.shared.apply_limits,
                    &restore_id,
                    resources,
                )
            }
            Command::ClusterVersion { action, version } => {
                self.advance(index);
                let w = &mut *self.writer;
                w.cluster = w.cluster.decide(action, version)?;
                Ok(Applied::ClusterVersion(w.cluster))
            }
            Command::Capacity { action } => {
                self.advance(index);
                let w = &mut *self.writer;
                w.cluster.require(Feature::Capacity)?;
                w.space = w.space.act(action, index, w.state.usage.bytes);
                Ok(Applied::Capacity(w.space))
            }
            Command::Integrity { action } => {
                self.advance(index);
                let w = &mut *self.writer;
                w.cluster.require(Feature::Integrity)?;
                w.corrupt = w.corrupt.act(&action, index);
                Ok(Applied::Integrity(w.corrupt.clone()))
            }
            Command::WriteStatus {
                id,
                key,
                status,
                version,
            } => {
                self.advance(index);
                self.write_status(index, &id, key, status, &version)
            }
            Command::LeaseGrant { ttl_ms } => {
                self.advance(index);
                self.writer.cluster.require(Feature::Leases)?;
                let w = &mut *self.writer;
                lease::check_grant(ttl_ms, w.state.leases.len(), lease::LEASES_HARD_MAX)?;
                let granted = Lease {
                    id: lease::grant_id(index, w.state.highest_lease_id()),
                    ttl_ms,
                    granted_revision: index,
                    renewed_revision: index,
                };
                let previous = w.state.leases.insert(granted.id, granted);
                assert!(previous.is_none(), "a granted lease id is new");
                Ok(Applied::Lease(LeaseApplied::Granted(granted)))
            }
            Command::LeaseRevoke { id, now_ms } => {
                self.advance(index);
                self.writer.cluster.require(Feature::Leases)?;
                let existed = self.writer.state.leases.contains_key(&id);
                let deleted = if existed {
                    self.end_lease(index, id, now_ms)
                } else {
                    0
                };
                Ok(Applied::Lease(LeaseApplied::Revoked { existed, deleted }))
            }
            Command::LeaseKeepAlive { ids } => {
                self.advance(index);
                self.writer.cluster.require(Feature::Leases)?;
                lease::check_ids(&ids)?;
                let leases = &mut self.writer.state.leases;
                let answers = ids
                    .into_iter()
                    .map(|id| match leases.get_mut(&id) {
                        Some(lease) => {
                            lease.renewed_revision = index;
                            (id, lease.ttl_ms)
                        }
                        None => (id, 0),
                    })
                    .collect();
                Ok(Applied::Lease(LeaseApplied::KeptAlive(answers)))
            }
            Command::LeaseExpire { leases, now_ms } => {
                self.advance(index);
                self.writer.cluster.require(Feature::Leases)?;
                let ids: Vec<u64> = leases.iter().map(|l| l.0).collect();
                lease::check_ids(&ids)?;
                let mut expired = Vec::new();
                let mut deleted = 0;
                for (id, judged_renewal) in leases {
                    let now = self.writer.state.leases.get(&id).copied();
                    if lease::expire_decision(now.as_ref(), judged_renewal) {
                        deleted += self.end_lease(index, id, now_ms);
                        expired.push(id);
                    }
                }
                Ok(Applied::Lease(LeaseApplied::Expired { expired, deleted }))
            }
            Command::Fenced { fence, command } => {
                self.advance(index);
                self.writer.cluster.require(Feature::Leases)?;
                check_fence(&self.writer.state, &self.shared.apply_limits, &fence)?;
                match *command {
                    Command::Write { resource } => self.write(index, WriteInput::Owned(resource)),
                    Command::Delete {
                        id,
                        version,
                        now_ms,
                        orphan,
                    } => self.delete(index, &id, &version, now_ms, orphan),
                    Command::WriteStatus {
                        id,
                        key,
                        status,
                        version,
                    } => self.write_status(index, &id, key, status, &version),
                    _ => Err(FsmError::invalid(
                        "fence",
                        "guards only a write, a delete or a status write",
                    )),
                }
            }
            Command::Collect { owner, now_ms } => {
                self.advance(index);
                self.writer.cluster.require(Feature::Lifecycle)?;
                validate_id("owner", &owner, &self.shared.apply_limits)?;
                if owner.uid.is_empty() {
                    return Err(FsmError::invalid("owner.uid", "must not be empty"));
                }
                let changed = self.collect(index, &owner, now_ms);
                Ok(Applied::Collected { changed })
            }
            other => self.restore(index, &other),
        }
    }

    /// The restore commands that carry no resources.
    fn restore(&mut self, index: u64, command: &Command) -> Result<Applied, FsmError> {
        self.advance(index);
        let w = &mut *self.writer;
        match command {
            Command::RestoreBegin {
                restore_id,
                resource_count,
                leases,
            } => restore::begin(w, index, restore_id, *resource_count, leases),
            Command::RestoreCommit { restore_id } => restore::commit(w, index, restore_id),
            Command::RestoreAbort { restore_id } => Ok(restore::abort(w, restore_id)),
            Command::Write { .. }
            | Command::Delete { .. }
            | Command::RestoreChunk { .. }
            | Command::Batch { .. }
            | Command::ClusterVersion { .. }
            | Command::Capacity { .. }
            | Command::Integrity { .. }
            | Command::LeaseGrant { .. }
            | Command::LeaseRevoke { .. }
            | Command::LeaseKeepAlive { .. }
            | Command::LeaseExpire { .. }
            | Command::Fenced { .. }
            | Command::Collect { .. }
            | Command::WriteStatus { .. } => unreachable!("handled by the caller"),
        }
    }

    /// As [`Store::apply_noop`], within the batch.
    pub fn apply_noop(&mut self, index: u64) {
        self.advance(index);
    }

    /// The index of the last entry applied in this batch (or before it).
    pub fn applied_index(&self) -> u64 {
        self.writer.state.revision
    }

    /// Ends the batch: publishes the new state, then sends the events.
    pub fn finish(self) {
        drop(self);
    }

    /// A status write at `index`, which the caller has advanced to.
    fn write_status(
        &mut self,
        index: u64,
        id: &Id,
        key: String,
        status: cairn_proto::v1::Status,
        version: &str,
    ) -> Result<Applied, FsmError> {
        self.writer.cluster.require(Feature::StatusWrites)?;
        let resource = with_status(
            &self.writer.state,
            &self.shared.apply_limits,
            id,
            key,
            status,
            version,
        )?;
        self.write(index, WriteInput::Owned(resource))
    }

    /// Ends the lease `id` at `index` (the caller has advanced to it): deletes every
    /// resource attached to it (their watchers see the Deletes, at this revision), then
    /// the lease. From cluster version 0.2 one with finalizers is marked at `now_ms` and
    /// detached instead ([`crate::lifecycle`]). Returns how many resources it changed.
    fn end_lease(&mut self, index: u64, id: u64, now_ms: u64) -> u64 {
        let keys = self.writer.state.keys_of_lease(id);
        let lifecycle = self.writer.cluster.require(Feature::Lifecycle).is_ok();
        for key in &keys {
            let w = &mut *self.writer;
            let Some(stored) = w.state.resources.get(key).cloned() else {
                unreachable!("the lease index names stored resources")
            };
            assert_eq!(
                stored.lease(),
                id,
                "the lease index names a resource attached to it"
            );
            let flags = stored.lifecycle();
            let after = (lifecycle && (flags.finalizers || flags.marked)).then(|| {
                rewritten(&stored, key, index, |r| {
                    if !flags.marked {
                        lifecycle::mark(r, now_ms, false);
                    }
                    r.lease = 0;
                })
            });
            self.change(index, key, after);
        }
        let w = &mut *self.writer;
        let removed = w.state.leases.remove(&id);
        assert!(removed.is_some(), "an ended lease existed");
        assert!(
            w.state.keys_of_lease(id).is_empty(),
            "nothing stays attached to an ended lease"
        );
        keys.len() as u64
    }

    /// Stores `after` at `key` (None: removes what is there) at `index`, which the caller
    /// has advanced to, as the store itself decided (a mark, a collection, a lease's end):
    /// no write rule applies. Records the change for the history and the watches.
    fn change(&mut self, index: u64, key: &Key, after: Option<StoredResource>) {
        let w = &mut *self.writer;
        let before = w.state.set(key, after.clone());
        assert!(before.is_some(), "the store changes only what is stored");
        w.space = w.space.settle(w.state.usage.bytes);
        if after.is_some() {
            w.version_issued_max = index;
        }
        self.remember(Change {
            revision: index,
            key: key.clone(),
            before,
            after,
        });
    }

    /// One step of collecting the dependents of `owner` ([`Command::Collect`]): returns
    /// how many resources it changed (0: nothing to do, the entry changes nothing).
    fn collect(&mut self, index: u64, owner: &Id, now_ms: u64) -> u64 {
        let prefix = key::owner_prefix(owner);
        let state = &self.writer.state;
        let stored_owner = key::with_storage_key(owner, |k| {
            state
                .resources
                .get(k)
                .filter(|o| o.uid() == owner.uid)
                .map(|o| (Key::from(k), o.clone()))
        });
        let dependents = |unmarked_only: bool| -> Vec<(Key, StoredResource)> {
            state
                .owned_by_prefix(&prefix)
                .filter(|(_, r)| !unmarked_only || !r.lifecycle().marked)
                .take(lifecycle::COLLECT_BATCH_MAX)
                .map(|(entry, r)| (Key::from(&entry[prefix.len()..]), r.clone()))
                .collect()
        };
        match stored_owner {
            // Gone: delete what it owned, marking what has finalizers.
            None => {
                let victims = dependents(true);
                for (key, dependent) in &victims {
                    let after = dependent.lifecycle().finalizers.then(|| {
                        rewritten(dependent, key, index, |r| lifecycle::mark(r, now_ms, false))
                    });
                    self.change(index, key, after);
                }
                victims.len() as u64
            }
            // Being deleted with its dependents orphaned: clear their owner, then let it go.
            Some((owner_key, stored)) if stored.lifecycle().orphaning => {
                let victims = dependents(false);
                for (key, dependent) in &victims {
                    let after = rewritten(dependent, key, index, |r| r.owner = None);
                    self.change(index, key, Some(after));
                }
                let mut changed = victims.len() as u64;
                if !self.writer.state.has_owned_prefix(&prefix) {
                    let released = rewritten(&stored, &owner_key, index, |r| {
                        lifecycle::without_finalizer(r, lifecycle::ORPHAN_FINALIZER)
                    });
                    let after = released.lifecycle().finalizers.then_some(released);
                    self.change(index, &owner_key, after);
                    changed += 1;
                }
                changed
            }
            // Stored again (or never gone): nothing to collect.
            Some(_) => 0,
        }
    }

    /// A write at `index`, which the caller has advanced to (once per entry:
    /// the commands of a batch share it).
    fn write(&mut self, index: u64, input: WriteInput<'_>) -> Result<Applied, FsmError> {
        let (change, written) = write(&mut self.writer, &self.shared.apply_limits, index, input)?;
        assert!(
            change
                .after
                .as_ref()
                .is_none_or(|a| StoredResource::ptr_eq(a, &written)),
            "a write stores what it answers, or removes the resource"
        );
        self.remember(change);
        Ok(Applied::Written(written))
    }

    /// A delete at `index`, which the caller has advanced to.
    fn delete(
        &mut self,
        index: u64,
        id: &Id,
        version: &str,
        now_ms: u64,
        orphan: bool,
    ) -> Result<Applied, FsmError> {
        let asked = DeleteAsked {
            id,
            version,
            now_ms,
            orphan,
        };
        match delete(&mut self.writer, &self.shared.apply_limits, index, asked)? {
            DeleteDone::Removed(change) => {
                self.remember(change);
                Ok(Applied::Deleted { existed: true })
            }
            DeleteDone::Marked(change, stored) => {
                if let Some(change) = change {
                    self.remember(change);
                }
                Ok(Applied::Marked(stored))
            }
            DeleteDone::Nothing => Ok(Applied::Deleted { existed: false }),
        }
    }

    /// Moves the applied index to `index`, asserting it only ever grows and
    /// stays above every version issued before (also across a restore).
    fn advance(&mut self, index: u64) {
        let w = &mut *self.writer;
        // The state after the previous entry is complete: keep its digest.
        note_digest(w);
        assert!(
            index > w.state.revision,
            "log index {index} applied after index {}",
            w.state.revision
        );
        assert!(
            index > w.version_issued_max,
            "log index {index} would reissue version {} or lower",
            w.version_issued_max
        );
        w.state.revision = index;
        w.dirty = true;
    }

    /// Appends a change to the history (evicting the oldest beyond the
    /// limit) and queues its event.
    fn remember(&mut self, change: Change) {
        let w = &mut *self.writer;
        assert_eq!(
            change.revision, w.state.revision,
            "a change carries its index"
        );
        let history_changes_max = self.shared.limits.history_changes_max;
        if history_changes_max == 0 {
            w.oldest_retained_revision = change.revision;
        } else {
            w.history_bytes += change.before_bytes();
            w.history.push(change.clone());
            let history_bytes_max = self.shared.limits.history_bytes_max as u64;
            while w.history.len() > history_changes_max
                || (w.history_bytes > history_bytes_max && w.history.len() > 1)
            {
                let oldest = w.history.get(w.history.start()).map(Change::before_bytes);
                if let Some(evicted) = w.history.pop_front() {
                    w.history_bytes -= oldest.unwrap_or(0);
                    w.oldest_retained_revision = evicted;
                }
            }
        }
        assert!(w.history.len() <= history_changes_max);
        assert!(
            w.history.len() <= 1 || w.history_bytes <= self.shared.limits.history_bytes_max as u64,
            "the history holds at most history_bytes_max bytes, or one change"
        );
        assert!(w.oldest_retained_revision <= w.state.revision);
        w.unpublished.push(change);
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // An invariant broke mid-entry: the writer's state may be torn,
            // so it is never shown to readers.
            return;
        }
        let w = &mut *self.writer;
        if w.dirty {
            self.shared.publish(w);
        }
        let mut changes = std::mem::take(&mut w.unpublished);
        for change in changes.drain(..) {
            w.registry.publish(&change, &self.shared.limits);
        }
        w.unpublished = changes;
    }
}

/// The write rules, in the contract's order. Returns the change made and the resource
/// written (what the write answers; the change removes it when the write removed a marked
/// resource's last finalizer).
fn write(
    w: &mut Writer,
    limits: &Limits,
    index: u64,
    input: WriteInput<'_>,
) -> Result<(Change, StoredResource), FsmError> {
    let given = input.get();
    validate_write(given, limits)?;
    let Some(id) = given.id.as_ref() else {
        unreachable!("validated: id present")
    };
    let key = key::with_storage_key(id, |key| {
        match w.state.resources.get(key) {
            None if !given.version.is_empty() => {
                return Err(FsmError::CasFailure {
                    expected: given.version.clone(),
                    stored: None,
                })
            }
            None => {}
            Some(stored) => {
                let given_uid = key::resource_parts(given).uid;
                if given_uid != stored.uid() {
                    return Err(FsmError::WrongUid {
                        given: given_uid.to_string(),
                        stored: stored.uid().to_string(),
                    });
                }
                if stored.version() != given.version {
                    return Err(FsmError::CasFailure {
                        expected: given.version.clone(),
                        stored: Some(stored.version().to_string()),
                    });
                }
            }
        }
        Ok(Key::from(key))
    })?;
    if given.lease != 0 {
        w.cluster.require(Feature::Leases)?;
        if !w.state.leases.contains_key(&given.lease) {
            return Err(lease::no_such_lease(given.lease));
        }
    }
    // The lifecycle rules (cluster version 0.2): the generation, and a marked resource may
    // only lose finalizers (the last one going removes it).
    let mut generation = None;
    let mut removes = false;
    if w.cluster.require(Feature::Lifecycle).is_ok() {
        let stored = w.state.resources.get(&key).map(StoredResource::resource);
        match stored
            .as_ref()
            .filter(|s| lifecycle::is_marked(&s.metadata))
        {
            Some(marked) => {
                removes = lifecycle::marked_write(marked, given)? == lifecycle::MarkedWrite::Remove
            }
            None => lifecycle::unmarked_write(given)?,
        }
        generation = Some(lifecycle::generation(stored.as_ref(), given, index));
    }
    // The capacity rules hold from cluster version 0.2 on: a 0.1 build applies none.
    let capacity_rules = w.cluster.require(Feature::Capacity).is_ok() && !removes;
    if capacity_rules {
        capacity::validate_quota_write(given)?;
    }
    // The final bytes are known only now (the version is this index): the
    // one encoding of this resource, which every answer will send.
    let after = input.stored_with_version(index, generation, &key);
    if removes {
        let before = w.state.set(&key, None);
        w.space = w.space.settle(w.state.usage.bytes);
        w.version_issued_max = index;
        let change = Change {
            revision: index,
            key,
            before,
            after: None,
        };
        return Ok((change, after));
    }
    let growth = growth_over(
        w.state.resources.get(&key),
        after.accounted_bytes(key.len()),
        key.len(),
    );
    let checked = match capacity_rules {
        true => check_capacity(&w.state, w.space, &key, growth),
        false => Ok(()),
    };
    checked
        .inspect_err(|refusal| {
            if let Refused::Space(SpaceRefusal::Quota) = refusal {
                // Passing the quota raises NOSPACE, at this entry, on every replica.
                w.space = w.space.act(
                    capacity::CapacityAction::RaiseAlarm,
                    index,
                    w.state.usage.bytes,
                );
            }
        })
        .map_err(|refusal| refusal.into_error(&w.state, w.space, growth))?;
    let before = w.state.set(&key, Some(after.clone()));
    w.space = w.space.settle(w.state.usage.bytes);
    w.version_issued_max = index;
    let change = Change {
        revision: index,
        key,
        before,
        after: Some(after.clone()),
    };
    Ok((change, after))
}

/// The fencing rule: the resource `fence.election` names (type, tenancy and name; no
/// section) is stored at version `fence.token`, else FailedPrecondition saying what is.
pub(crate) fn check_fence(
    state: &State,
    limits: &Limits,
    fence: &cairn_proto::v1::Fence,
) -> Result<(), FsmError> {
    let id = crate::validate::validate_fence(fence, limits)?;
    let stored = key::with_storage_key(&id, |key| state.resources.get(key).cloned());
    let token = fence.token.to_string();
    match stored {
        Some(stored) if stored.version() == token => Ok(()),
        Some(stored) => Err(FsmError::FailedPrecondition(format!(
            "fence: {:?} is held at token {}, not {token}: another holder won it since",
            id.name,
            stored.version()
        ))),
        None => Err(FsmError::FailedPrecondition(format!(
            "fence: {:?} is not held by anyone (token {token} ended)",
            id.name
        ))),
    }
}

/// What storing a resource of `new_bytes` accounted bytes at a key of `key_len` bytes, where
/// `stored` is, does to its tenancy: one more resource if none was stored, and the change in
/// bytes. The one rule for the check before proposing and the check at apply.
fn growth_over(stored: Option<&StoredResource>, new_bytes: u64, key_len: usize) -> TenantGrowth {
    TenantGrowth {
        count: i64::from(stored.is_none()),
        bytes: new_bytes as i64 - stored.map_or(0, |s| s.accounted_bytes(key_len) as i64),
    }
}

/// Why [`check_capacity`] refused a write.
pub(crate) enum Refused {
    Space(SpaceRefusal),
    Tenant(FsmError),
}

impl Refused {
    pub(crate) fn into_error(
        self,
        state: &State,
        space: SpaceState,
        growth: TenantGrowth,
    ) -> FsmError {
        match self {
            Refused::Space(refusal) => {
                space.refusal_error(refusal, state.usage.bytes, growth.bytes.max(0) as u64)
            }
            Refused::Tenant(error) => error,
        }
    }
}

/// The capacity rules for a write that changes the table by `growth` at the storage key
/// `key`: the space quota ([`capacity::space_decision`]), then the quotas of the write's
/// tenancy ([`capacity::tenant_decision`]; a quota itself is never held back by one). The
/// same at apply and before proposing ([`Store::check_capacity`]).
pub(crate) fn check_capacity(
    state: &State,
    space: SpaceState,
    key: &str,
    growth: TenantGrowth,
) -> Result<(), Refused> {
    capacity::space_decision(space, state.usage.bytes, growth.bytes).map_err(Refused::Space)?;
    let type_key = crate::state::type_key(key);
    let [group, kind, ..] = key::fields(key);
    if capacity::is_quota_type(group, kind) {
        return Ok(());
    }
    let quotas = quotas_of(state, crate::state::tenancy_key(type_key));
    if quotas.is_empty() {
        return Ok(());
    }
    let (type_usage, tenancy_usage) = state.tenant_usage(type_key);
    capacity::tenant_decision(&quotas, group, kind, tenancy_usage, type_usage, growth)
        .map_err(Refused::Tenant)
}

/// Whether any tenant quota is stored (one lookup in the per-type usage).
fn any_quota(state: &State) -> bool {
    const QUOTA_TYPES: &str = "cairn\0Quota\0";
    const _: () = assert!(key::SEPARATOR == '\0');
    debug_assert_eq!(
        QUOTA_TYPES,
        format!("{}\0{}\0", capacity::QUOTA_GROUP, capacity::QUOTA_KIND)
    );
    state
        .by_type
        .range::<_, str>((
            std::ops::Bound::Included(QUOTA_TYPES),
            std::ops::Bound::Unbounded,
        ))
        .next()
        .is_some_and(|(k, _)| k.starts_with(QUOTA_TYPES))
}

/// The quotas stored for the tenancy `tenancy_key` (`partition NUL namespace`), by name.
/// A quota whose data no longer parses (it cannot be written so) is skipped.
fn quotas_of(state: &State, tenancy_key: &str) -> Vec<(String, Vec<(capacity::QuotaLimit, u64)>)> {
    let sep = key::SEPARATOR;
    // Most clusters hold no quota at all: one lookup.
    if !any_quota(state) {
        return Vec::new();
    }
    let quota_types = format!(
        "{}{sep}{}{sep}",
        capacity::QUOTA_GROUP,
        capacity::QUOTA_KIND
    );
    let prefix = format!("{quota_types}{tenancy_key}{sep}");
    state
        .resources
        .range::<_, str>((
            std::ops::Bound::Included(prefix.as_str()),
            std::ops::Bound::Unbounded,
        ))
        .take_while(|(k, _)| k.starts_with(prefix.as_str()))
        .filter_map(|(k, stored)| {
            let resource = stored.resource();
            let limits = capacity::parse_quota(resource.data.as_ref()).ok()?;
            Some((k[prefix.len()..].to_string(), limits))
        })
        .collect()
}

/// The resource `id` with its status entry `key` replaced by `status`: the status-write
/// rules (`docs/contract.md`), checked in this order: the id and key are valid, the uid is
/// given, a resource with that uid is stored (else NotFound), and `version`, when not empty,
/// is the stored one (else a CAS failure). The result keeps the stored version, so the
/// write that stores it passes its own checks; its generation is the stored one.
fn with_status(
    state: &State,
    limits: &Limits,
    id: &Id,
    key: String,
    status: cairn_proto::v1::Status,
    version: &str,
) -> Result<Resource, FsmError> {
    crate::validate::validate_write_status(id, &key, &status, version, limits)?;
    let stored = key::with_storage_key(id, |storage_key| state.resources.get(storage_key).cloned());
    let Some(stored) = stored.filter(|s| s.uid() == id.uid) else {
        return Err(FsmError::NotFound);
    };
    if !version.is_empty() && stored.version() != version {
        return Err(FsmError::CasFailure {
            expected: version.to_string(),
            stored: Some(stored.version().to_string()),
        });
    }
    let mut resource = stored.resource();
    resource.status.insert(key, status);
    Ok(resource)
}

/// `stored` as the store itself rewrites it at `index` (a mark, a lease's end, an orphaned
/// owner reference): `change` applied, the version `index`, and the generation by the
/// rule of every write ([`lifecycle::generation`]).
fn rewritten(
    stored: &StoredResource,
    key: &Key,
    index: u64,
    change: impl FnOnce(&mut Resource),
) -> StoredResource {
    let before = stored.resource();
    let mut r = before.clone();
    change(&mut r);
    r.generation = lifecycle::generation(Some(&before), &r, index);
    r.version = index.to_string();
    StoredResource::new(&r, key)
}

/// A Delete as asked: the lifetime and version it names, the proposing leader's time and
/// whether to orphan what the resource owns.
struct DeleteAsked<'a> {
    id: &'a Id,
    version: &'a str,
    now_ms: u64,
    orphan: bool,
}

/// What a Delete did.
enum DeleteDone {
    /// Nothing stored, or another lifetime: nothing changed.
    Nothing,
    /// Removed.
    Removed(Change),
    /// Marked (the change; None if it was already marked), and the resource as stored.
    Marked(Option<Change>, StoredResource),
}

/// The delete rules, in the contract's order, then the lifecycle's ([`crate::lifecycle`],
/// cluster version 0.2): a resource with finalizers, or one whose dependents are to be
/// orphaned, is only marked.
fn delete(
    w: &mut Writer,
    limits: &Limits,
    index: u64,
    asked: DeleteAsked<'_>,
) -> Result<DeleteDone, FsmError> {
    let DeleteAsked {
        id,
        version,
        now_ms,
        orphan,
    } = asked;
    validate_id("id", id, limits)?;
    let lifecycle_rules = w.cluster.require(Feature::Lifecycle).is_ok();
    if orphan && !lifecycle_rules {
        w.cluster.require(Feature::Lifecycle)?;
    }
    let key = key::with_storage_key(id, |key| {
        let Some(stored) = w.state.resources.get(key) else {
            return Ok(None);
        };
        if stored.uid() != id.uid {
            return Ok(None);
        }
        if stored.version() != version {
            return Err(FsmError::CasFailure {
                expected: version.to_string(),
                stored: Some(stored.version().to_string()),
            });
        }
        Ok(Some((Key::from(key), stored.clone())))
    })?;
    let Some((key, stored)) = key else {
        return Ok(DeleteDone::Nothing);
    };
    let outcome = match lifecycle_rules {
        true => {
            let flags = stored.lifecycle();
            let dependents = orphan
                && w.state
                    .has_owned_prefix(&crate::state::self_prefix(&key, stored.uid()));
            lifecycle::delete_decision(flags.marked, flags.finalizers, orphan, dependents)
        }
        false => lifecycle::DeleteOutcome::Remove,
    };
    match outcome {
        lifecycle::DeleteOutcome::Remove => {
            let before = w.state.set(&key, None);
            assert!(before.is_some(), "a delete removes what it found");
            w.space = w.space.settle(w.state.usage.bytes);
            Ok(DeleteDone::Removed(Change {
                revision: index,
                key,
                before,
                after: None,
            }))
        }
        lifecycle::DeleteOutcome::AlreadyMarked => Ok(DeleteDone::Marked(None, stored)),
        lifecycle::DeleteOutcome::Mark { orphan } => {
            let after = rewritten(&stored, &key, index, |r| lifecycle::mark(r, now_ms, orphan));
            let before = w.state.set(&key, Some(after.clone()));
            w.space = w.space.settle(w.state.usage.bytes);
            w.version_issued_max = index;
            let change = Change {
                revision: index,
                key,
                before,
                after: Some(after.clone()),
            };
            Ok(DeleteDone::Marked(Some(change), after))
        }
    }
}

/// A resource to write, borrowed from a command or moved out of one. Lives
/// on the stack for one call; boxing it would add an allocation.
#[allow(clippy::large_enum_variant)]
enum WriteInput<'a> {
    Borrowed(&'a Resource),
    Owned(Resource),
}

impl WriteInput<'_> {
    fn get(&self) -> &Resource {
        match self {
            WriteInput::Borrowed(r) => r,
            WriteInput::Owned(r) => r,
        }
    }

    /// The resource stored with version `index` (and `generation`, when the store sets
    /// it): the borrowed one is copied first, the owned one is changed in place; either
    /// is encoded once.
    fn stored_with_version(
        self,
        index: u64,
        generation: Option<String>,
        key: &str,
    ) -> StoredResource {
        let mut resource = match self {
            WriteInput::Borrowed(r) => r.clone(),
            WriteInput::Owned(r) => r,
        };
        resource.version = index.to_string();
        if let Some(generation) = generation {
            resource.generation = generation;
        }
        StoredResource::new(&resource, key)
    }
}

/// Keeps the digest of the state at `w.state.revision` (the table after that entry) among
/// the last [`crate::integrity::DIGESTS_KEPT`].
pub(crate) fn note_digest(w: &mut Writer) {
    let at = (w.state.revision, w.state.digest);
    match w.digests.back_mut() {
        Some(last) if last.0 == at.0 => *last = at,
        Some(last) => {
            assert!(last.0 < at.0, "digests are kept in index order");
            w.digests.push_back(at);
        }
        None => w.digests.push_back(at),
    }
    if w.digests.len() > crate::integrity::DIGESTS_KEPT {
        w.digests.pop_front();
    }
}
