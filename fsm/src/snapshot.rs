//! Snapshot (a lazily iterated point-in-time image) and restore (a separate
//! table swapped in atomically).

use std::sync::Arc;

use cairn_proto::v1::Resource;
use imbl::ordmap;

use crate::history::History;
use crate::key::{self, Key};
use crate::state::State;
use crate::store::Shared;
use crate::validate::validate_write;
use crate::watch::REASON_RESTORE;
use crate::FsmError;

/// The format of the resources a [`Snapshot`] yields: each is a complete
/// `cairn.v1.Resource` with its assigned version. The node frames and stores
/// them; this number goes with them so a future reader can tell.
pub const SNAPSHOT_FORMAT_VERSION: u8 = 1;

/// A consistent image of the table at `applied_index`, taken in O(1) without
/// stopping writes. Iterates every resource once, in storage-key order.
pub struct Snapshot {
    /// The index of the last entry the image reflects.
    pub applied_index: u64,
    /// [`SNAPSHOT_FORMAT_VERSION`].
    pub format_version: u8,
    len: usize,
    resources: ordmap::ConsumingIter<Key, Arc<Resource>, imbl::shared_ptr::DefaultSharedPtr>,
}

impl Snapshot {
    pub(crate) fn new(state: Arc<State>) -> Snapshot {
        Snapshot {
            applied_index: state.revision,
            format_version: SNAPSHOT_FORMAT_VERSION,
            len: state.resources.len(),
            // O(1): the map is shared, and copied out element by element as
            // the iteration proceeds.
            resources: state.resources.clone().into_iter(),
        }
    }

    /// How many resources the image holds in total.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the image holds no resource.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Iterator for Snapshot {
    type Item = Arc<Resource>;

    fn next(&mut self) -> Option<Arc<Resource>> {
        self.resources.next().map(|(_, r)| r)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.resources.size_hint()
    }
}

/// A restore in progress: resources go into a separate table, invisible until
/// [`Restoration::commit`]. Dropping it without committing (or calling
/// [`Restoration::abort`]) discards the table and changes nothing; once
/// committed, the drop does nothing either ("abort after commit does
/// nothing" holds by construction: `commit` consumes the restoration).
pub struct Restoration {
    shared: Arc<Shared>,
    state: State,
    /// The highest version among the restored resources.
    version_max: u64,
    committed: bool,
}

impl Restoration {
    pub(crate) fn new(shared: Arc<Shared>) -> Restoration {
        Restoration {
            shared,
            state: State::default(),
            version_max: 0,
            committed: false,
        }
    }

    /// How many resources have been added so far.
    pub fn len(&self) -> usize {
        self.state.resources.len()
    }

    /// Whether no resource has been added yet.
    pub fn is_empty(&self) -> bool {
        self.state.resources.is_empty()
    }

    /// Adds one resource of the image. It must pass [`validate_write`], carry
    /// a version that is a positive decimal log index, and have a storage key
    /// not seen before in this restore. Publishes no event.
    pub fn apply(&mut self, resource: Resource) -> Result<(), FsmError> {
        validate_write(&resource, &self.shared.limits)?;
        let version = resource
            .version
            .parse::<u64>()
            .ok()
            .filter(|v| *v > 0 && v.to_string() == resource.version)
            .ok_or_else(|| {
                FsmError::invalid(
                    "resource.version",
                    format!("{:?} is not a log index", resource.version),
                )
            })?;
        let id = resource
            .id
            .as_ref()
            .unwrap_or_else(|| unreachable!("validated: id present"));
        let key = Key::from(key::storage_key(id));
        if self.state.resources.contains_key(&key) {
            return Err(FsmError::invalid(
                "resource.id",
                "appears twice in the snapshot",
            ));
        }
        let previous = self.state.set(&key, Some(Arc::new(resource)));
        assert!(previous.is_none(), "checked: the key was new");
        self.version_max = self.version_max.max(version);
        Ok(())
    }

    /// Swaps the restored table in atomically at `applied_index`: the applied
    /// index and the oldest retained revision become `applied_index`, the
    /// history is emptied, and every open watch is closed with
    /// `WatchClosed { reason: "restore" }`. A table holding a version above
    /// `applied_index` is rejected before anything changes. Later applies must
    /// use indexes above `applied_index` and above every version this store
    /// issued before (asserted), so versions never go backwards.
    pub fn commit(mut self, applied_index: u64) -> Result<(), FsmError> {
        if self.version_max > applied_index {
            return Err(FsmError::invalid(
                "applied_index",
                format!(
                    "{applied_index} is below version {} found in the snapshot",
                    self.version_max
                ),
            ));
        }
        let mut state = std::mem::take(&mut self.state);
        state.revision = applied_index;
        {
            let mut w = self.shared.writer.lock();
            assert!(
                w.unpublished.is_empty(),
                "no batch is open while the writer lock is free"
            );
            w.state = state;
            w.history = History::default();
            w.oldest_retained_revision = applied_index;
            self.shared.publish(&mut w);
            w.registry.close_all(REASON_RESTORE);
            assert_eq!(w.registry.len(), 0, "a restore leaves no watch open");
        }
        self.committed = true;
        Ok(())
    }

    /// Discards the restored table; the store is unchanged.
    pub fn abort(self) {
        drop(self);
    }
}

impl Drop for Restoration {
    fn drop(&mut self) {
        // Nothing was shared with the store before commit, so aborting is
        // letting the separate table go; after commit the table was moved
        // into the store and there is nothing left to do.
        if !self.committed {
            self.state = State::default();
        }
    }
}
