//! The store: one writer applying commands in log order, any number of
//! readers taking O(1) point-in-time views.

use std::sync::Arc;

use cairn_proto::v1::{Id, Resource};
use imbl::Vector;
use parking_lot::{Mutex, RwLock};

use crate::key::{self, Key};
use crate::snapshot::{Restoration, Snapshot};
use crate::state::{Change, State, View};
use crate::validate::{validate_id, validate_list, validate_write, Limits};
use crate::watch::{self, Registry, Watch, WatchFilter};
use crate::{Command, FsmError};

/// What a successful command did.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// The resource as stored, with its new version.
    Written(Arc<Resource>),
    /// `existed = false` for the no-op deletes (nothing stored, or another
    /// lifetime stored): nothing changed and no event was published.
    Deleted { existed: bool },
}

/// What readers see: the latest state and the history that leads to it.
/// Replaced as a whole after every applied entry.
pub(crate) struct Published {
    pub state: Arc<State>,
    pub history: Vector<Change>,
    pub oldest_retained_revision: u64,
}

/// Everything the single writer owns.
pub(crate) struct Writer {
    /// The latest state; `state.revision` is the applied index.
    pub state: State,
    /// The last `history_changes_max` changes, oldest first, revisions
    /// strictly increasing.
    pub history: Vector<Change>,
    /// The oldest revision whose state can be rebuilt from `history`.
    pub oldest_retained_revision: u64,
    /// The highest version ever assigned by this store (also before a restore).
    pub version_issued_max: u64,
    pub registry: Registry,
}

pub(crate) struct Shared {
    pub limits: Limits,
    /// Readers hold this lock only to clone the Arc.
    pub published: RwLock<Arc<Published>>,
    /// Lock order: `writer`, then `published`.
    pub writer: Mutex<Writer>,
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
            history: Vector::new(),
            oldest_retained_revision: 0,
        };
        Store {
            shared: Arc::new(Shared {
                limits,
                published: RwLock::new(Arc::new(published)),
                writer: Mutex::new(Writer {
                    state: State::default(),
                    history: Vector::new(),
                    oldest_retained_revision: 0,
                    version_issued_max: 0,
                    registry: Registry::default(),
                }),
            }),
        }
    }

    /// The limits this store enforces.
    pub fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    /// Applies a decoded command carried by the log entry at `index`.
    ///
    /// `index` must exceed the applied index and every version issued before
    /// (a violation is a bug in the caller: panic). The applied index becomes
    /// `index` whatever the outcome, so a CAS failure is the same on every
    /// replica. A successful write is stored with version `index.to_string()`.
    /// Watch events are published after the change is visible to readers.
    pub fn apply(&self, index: u64, command: &Command) -> Result<Applied, FsmError> {
        match command {
            Command::Write { resource } => self.apply_write(index, WriteInput::Borrowed(resource)),
            Command::Delete { id, version } => self.apply_delete(index, id, version),
        }
    }

    /// As [`Store::apply`], taking the command by value so a written resource
    /// is moved into the table rather than copied.
    pub fn apply_owned(&self, index: u64, command: Command) -> Result<Applied, FsmError> {
        match command {
            Command::Write { resource } => self.apply_write(index, WriteInput::Owned(resource)),
            Command::Delete { id, version } => self.apply_delete(index, &id, &version),
        }
    }

    /// Advances the applied index for a log entry that changes no data
    /// (blank, membership).
    pub fn apply_noop(&self, index: u64) {
        let mut w = self.shared.writer.lock();
        Self::advance(&mut w, index);
        self.publish(&w);
    }

    /// The index of the last applied entry.
    pub fn applied_index(&self) -> u64 {
        self.shared.published.read().state.revision
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

    /// The latest state, O(1).
    pub fn view(&self) -> View {
        View {
            state: self.shared.published.read().state.clone(),
        }
    }

    /// The state at `revision` (0 = the latest). A revision older than the
    /// retained history is `Compacted`; one beyond the applied index is
    /// `InvalidArgument { field: "revision" }` (the caller waits for it to be
    /// applied first). Costs O(changes since `revision` x log n).
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
        let mut state = (*published.state).clone();
        for change in published.history.iter().rev() {
            if change.revision <= revision {
                break;
            }
            let undone = state.set(&change.key, change.before.clone());
            assert!(
                undone.as_ref().map(Arc::as_ptr) == change.after.as_ref().map(Arc::as_ptr),
                "undoing a change finds its after-image"
            );
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
        // Under the writer lock the published state is the writer's state:
        // the snapshot and the registration are atomic w.r.t. apply.
        let state = self.shared.published.read().state.clone();
        assert_eq!(state.revision, w.state.revision, "published is current under the writer lock");
        let Writer {
            registry, history, ..
        } = &mut *w;
        Ok(watch::register(
            &self.shared,
            registry,
            filter,
            state,
            history,
            start_revision,
            self.shared.limits.watch_buffer_events,
        ))
    }

    /// A consistent point-in-time image of the whole table, O(1) to take,
    /// iterated lazily; writes go on meanwhile.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::new(self.shared.published.read().state.clone())
    }

    /// Starts a restore into a separate table; nothing changes until
    /// [`Restoration::commit`].
    pub fn restore(&self) -> Restoration {
        Restoration::new(self.shared.clone())
    }

    fn apply_write(&self, index: u64, resource: WriteInput<'_>) -> Result<Applied, FsmError> {
        let mut w = self.shared.writer.lock();
        Self::advance(&mut w, index);
        let outcome = Self::write(&mut w, &self.shared.limits, index, resource);
        self.finish(&mut w, outcome)
            .map(|change| Applied::Written(change.and_then(|c| c.after).unwrap_or_else(|| {
                unreachable!("a successful write has an after-image")
            })))
    }

    fn apply_delete(&self, index: u64, id: &Id, version: &str) -> Result<Applied, FsmError> {
        let mut w = self.shared.writer.lock();
        Self::advance(&mut w, index);
        let outcome = Self::delete(&mut w, &self.shared.limits, index, id, version);
        self.finish(&mut w, outcome).map(|change| Applied::Deleted {
            existed: change.is_some(),
        })
    }

    /// Moves the applied index to `index`, asserting it only ever grows and
    /// stays above every version issued before (also across a restore).
    fn advance(w: &mut Writer, index: u64) {
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
    }

    /// The write rules, in the contract's order. Returns the change made.
    fn write(
        w: &mut Writer,
        limits: &Limits,
        index: u64,
        input: WriteInput<'_>,
    ) -> Result<Option<Change>, FsmError> {
        let given = input.get();
        validate_write(given, limits)?;
        let id = given.id.as_ref();
        let key = key::storage_key(id.unwrap_or_else(|| unreachable!("validated: id present")));
        match w.state.resources.get(key.as_str()) {
            None if !given.version.is_empty() => {
                return Err(FsmError::CasFailure {
                    expected: given.version.clone(),
                    stored: None,
                })
            }
            None => {}
            Some(stored) => {
                let given_uid = key::resource_parts(given).uid;
                let stored_uid = key::resource_parts(stored).uid;
                if given_uid != stored_uid {
                    return Err(FsmError::WrongUid {
                        given: given_uid.to_string(),
                        stored: stored_uid.to_string(),
                    });
                }
                if stored.version != given.version {
                    return Err(FsmError::CasFailure {
                        expected: given.version.clone(),
                        stored: Some(stored.version.clone()),
                    });
                }
            }
        }
        let mut resource = input.into_owned();
        resource.version = index.to_string();
        let after = Arc::new(resource);
        let key = Key::from(key);
        let before = w.state.set(&key, Some(after.clone()));
        w.version_issued_max = index;
        Ok(Some(Change {
            revision: index,
            key,
            before,
            after: Some(after),
        }))
    }

    /// The delete rules, in the contract's order. `None` = a no-op delete.
    fn delete(
        w: &mut Writer,
        limits: &Limits,
        index: u64,
        id: &Id,
        version: &str,
    ) -> Result<Option<Change>, FsmError> {
        validate_id("id", id, limits)?;
        let key = key::storage_key(id);
        let Some(stored) = w.state.resources.get(key.as_str()) else {
            return Ok(None);
        };
        if key::resource_parts(stored).uid != id.uid {
            return Ok(None);
        }
        if stored.version != version {
            return Err(FsmError::CasFailure {
                expected: version.to_string(),
                stored: Some(stored.version.clone()),
            });
        }
        let key = Key::from(key);
        let before = w.state.set(&key, None);
        assert!(before.is_some(), "a delete removes what it found");
        Ok(Some(Change {
            revision: index,
            key,
            before,
            after: None,
        }))
    }

    /// Records the change in the history, publishes the new state, then the
    /// event. Runs for every outcome: the applied index moved regardless.
    fn finish(
        &self,
        w: &mut Writer,
        outcome: Result<Option<Change>, FsmError>,
    ) -> Result<Option<Change>, FsmError> {
        if let Ok(Some(change)) = &outcome {
            assert_eq!(change.revision, w.state.revision, "a change carries its index");
            Self::remember(w, &self.shared.limits, change.clone());
        }
        self.publish(w);
        if let Ok(Some(change)) = &outcome {
            w.registry.publish(change);
        }
        outcome
    }

    /// Appends to the history, evicting the oldest changes beyond the limit.
    fn remember(w: &mut Writer, limits: &Limits, change: Change) {
        if let Some(last) = w.history.last() {
            assert!(last.revision < change.revision, "history revisions increase");
        }
        if limits.history_changes_max == 0 {
            w.oldest_retained_revision = change.revision;
            return;
        }
        w.history.push_back(change);
        while w.history.len() > limits.history_changes_max {
            if let Some(evicted) = w.history.pop_front() {
                w.oldest_retained_revision = evicted.revision;
            }
        }
        assert!(w.history.len() <= limits.history_changes_max);
    }

    /// Makes the writer's state the one readers see.
    pub(crate) fn publish(&self, w: &Writer) {
        let next = Arc::new(Published {
            state: Arc::new(w.state.clone()),
            history: w.history.clone(),
            oldest_retained_revision: w.oldest_retained_revision,
        });
        let previous = {
            let mut guard = self.shared.published.write();
            std::mem::replace(&mut *guard, next)
        };
        // The old image is released outside the lock.
        assert!(previous.state.revision <= w.state.revision || w.history.is_empty());
        drop(previous);
    }
}

/// A resource to write, borrowed from a command or moved out of one.
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

    fn into_owned(self) -> Resource {
        match self {
            WriteInput::Borrowed(r) => r.clone(),
            WriteInput::Owned(r) => r,
        }
    }
}
