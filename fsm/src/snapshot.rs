//! Snapshot (a lazily iterated point-in-time image) and restore (a separate
//! table swapped in atomically).

use std::sync::Arc;

use cairn_proto::v1::Resource;
use imbl::ordmap;

use crate::key::Key;
use crate::lease::Lease;
use crate::restore::{install, PendingRestore, RestoreTable};
use crate::store::{Published, Shared};
use crate::{ClusterVersionState, CorruptAlarm, FsmError, SpaceState, StoredResource};

/// The format of the resources a [`Snapshot`] yields: each is a complete
/// `cairn.v1.Resource` with its assigned version, as stored (its encoding is
/// [`StoredResource::encoded`]). The node frames and stores them; this number
/// goes with them so a future reader can tell.
pub const SNAPSHOT_FORMAT_VERSION: u8 = 1;

/// A consistent image of the table at `applied_index`, taken in O(1) without
/// stopping writes. Iterates every resource once, in storage-key order.
pub struct Snapshot {
    /// The index of the last entry the image reflects.
    pub applied_index: u64,
    /// [`SNAPSHOT_FORMAT_VERSION`].
    pub format_version: u8,
    /// The online restore in progress at `applied_index`, if any. Not part
    /// of the table: iterating the snapshot does not yield its resources.
    pub pending: Option<PendingSnapshot>,
    /// The cluster version at `applied_index` ([`crate::ClusterVersionState`]): part of
    /// the replicated state, so a node that installs the image takes it too.
    pub cluster: ClusterVersionState,
    /// The space quota and its alarm at `applied_index` (replicated, like `cluster`).
    pub space: SpaceState,
    /// The `CORRUPT` alarm at `applied_index` (replicated, like `cluster`).
    pub corrupt: CorruptAlarm,
    /// The leases at `applied_index`, by id (replicated; the resources name theirs).
    pub leases: Vec<Lease>,
    len: usize,
    resources: ordmap::ConsumingIter<Key, StoredResource, imbl::shared_ptr::DefaultSharedPtr>,
}

impl Snapshot {
    pub(crate) fn new(published: &Published) -> Snapshot {
        let state = &published.state;
        Snapshot {
            applied_index: state.revision,
            format_version: SNAPSHOT_FORMAT_VERSION,
            pending: published.pending.as_ref().map(|p| PendingSnapshot {
                restore_id: p.restore_id.clone(),
                resource_count: p.resource_count,
                failure: p.failure.clone(),
                leases: p
                    .table
                    .state
                    .leases
                    .values()
                    .map(|l| (l.id, l.ttl_ms))
                    .collect(),
                len: p.table.state.resources.len(),
                resources: p.table.state.resources.clone().into_iter(),
            }),
            cluster: published.cluster,
            space: published.space,
            corrupt: published.corrupt.clone(),
            leases: state.leases.values().copied().collect(),
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
    type Item = StoredResource;

    fn next(&mut self) -> Option<StoredResource> {
        self.resources.next().map(|(_, r)| r)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.resources.size_hint()
    }
}

/// The part of a [`Snapshot`] that is an online restore in progress (see
/// `crate::restore`): its id, the count its begin announced, why it failed
/// if it did, and the resources received so far.
pub struct PendingSnapshot {
    pub restore_id: String,
    pub resource_count: u64,
    pub failure: Option<String>,
    /// The leases the restore brought (installed by its commit).
    pub leases: Vec<(u64, u64)>,
    len: usize,
    resources: ordmap::ConsumingIter<Key, StoredResource, imbl::shared_ptr::DefaultSharedPtr>,
}

impl PendingSnapshot {
    /// How many received resources the image holds.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Iterator for PendingSnapshot {
    type Item = StoredResource;

    fn next(&mut self) -> Option<StoredResource> {
        self.resources.next().map(|(_, r)| r)
    }
}

/// A restore in progress: resources go into a separate table, invisible until
/// [`Restoration::commit`]. Dropping it without committing (or calling
/// [`Restoration::abort`]) discards the table and changes nothing; once
/// committed, the drop does nothing either ("abort after commit does
/// nothing" holds by construction: `commit` consumes the restoration).
///
/// Loading a snapshot that carries a pending online restore: call
/// [`Restoration::begin_pending`], then [`Restoration::apply_pending`] for
/// each of its resources; the commit installs it as the pending restore.
pub struct Restoration {
    shared: Arc<Shared>,
    table: RestoreTable,
    pending: Option<PendingRestore>,
    cluster: ClusterVersionState,
    space: SpaceState,
    corrupt: CorruptAlarm,
}

impl Restoration {
    pub(crate) fn new(shared: Arc<Shared>) -> Restoration {
        Restoration {
            shared,
            table: RestoreTable::default(),
            pending: None,
            cluster: ClusterVersionState::default(),
            space: SpaceState::default(),
            corrupt: CorruptAlarm::default(),
        }
    }

    /// Declares the `CORRUPT` alarm the image was taken with (none: the default). The
    /// commit installs it.
    pub fn set_corrupt_alarm(&mut self, corrupt: CorruptAlarm) {
        self.corrupt = corrupt;
    }

    /// Declares the space quota and alarm the image was taken with (none: the default).
    /// The commit installs them.
    pub fn set_space(&mut self, space: SpaceState) {
        self.space = space;
    }

    /// Declares the cluster version the image was taken at (an image that names none was
    /// taken at [`crate::ClusterVersion::BASELINE`], the default). The commit installs it.
    pub fn set_cluster_version(&mut self, cluster: ClusterVersionState) {
        self.cluster = cluster;
    }

    /// Declares the leases the image holds, exactly as they were (their grant and renewal
    /// revisions included): before any resource is added, since a resource attached to a
    /// lease the image does not hold is refused. At most
    /// [`crate::lease::LEASES_HARD_MAX`], ids distinct and not 0.
    pub fn set_leases(&mut self, leases: Vec<Lease>) -> Result<(), FsmError> {
        assert!(
            self.table.len() == 0,
            "leases are declared before resources"
        );
        let pairs: Vec<(u64, u64)> = leases.iter().map(|l| (l.id, l.ttl_ms)).collect();
        let mut table = crate::restore::lease_table(&pairs, 0)?;
        for lease in leases {
            if lease.granted_revision > lease.renewed_revision {
                return Err(FsmError::invalid(
                    "leases",
                    format!("lease {} renewed before its grant", lease.id),
                ));
            }
            table.insert(lease.id, lease);
        }
        self.table.state.leases = table;
        Ok(())
    }

    /// How many resources have been added so far.
    pub fn len(&self) -> usize {
        self.table.len() as usize
    }

    /// Whether no resource has been added yet.
    pub fn is_empty(&self) -> bool {
        self.table.len() == 0
    }

    /// Adds one resource of the image. It must pass [`validate_write`], carry
    /// a version that is a positive decimal log index, and have a storage key
    /// not seen before in this restore. Publishes no event.
    ///
    /// [`validate_write`]: crate::validate_write
    pub fn apply(&mut self, resource: Resource) -> Result<(), FsmError> {
        self.table.add(resource, &self.shared.apply_limits)
    }

    /// Declares the online restore the image was taken in the middle of.
    pub fn begin_pending(
        &mut self,
        restore_id: String,
        resource_count: u64,
        failure: Option<String>,
        leases: &[(u64, u64)],
    ) -> Result<(), FsmError> {
        assert!(self.pending.is_none(), "an image holds one pending restore");
        let mut table = RestoreTable::default();
        table.state.leases = crate::restore::lease_table(leases, 0)?;
        self.pending = Some(PendingRestore {
            restore_id,
            resource_count,
            table,
            failure,
        });
        Ok(())
    }

    /// Adds one resource received by the pending restore declared with
    /// [`Restoration::begin_pending`] (same rules as [`Restoration::apply`]).
    pub fn apply_pending(&mut self, resource: Resource) -> Result<(), FsmError> {
        let Some(pending) = &mut self.pending else {
            return Err(FsmError::invalid(
                "snapshot",
                "a pending-restore resource without a pending restore",
            ));
        };
        pending.add(resource, &self.shared.apply_limits)
    }

    /// Swaps the restored table in atomically at `applied_index`: the applied
    /// index and the oldest retained revision become `applied_index`, the
    /// history is emptied, and every open watch is closed with
    /// `WatchClosed { reason: "restore" }`. A table holding a version above
    /// `applied_index` is rejected before anything changes. Later applies must
    /// use indexes above `applied_index` and above every version this store
    /// issued before (asserted), so versions never go backwards.
    pub fn commit(mut self, applied_index: u64) -> Result<(), FsmError> {
        // A pending restore's resources carry the backup's versions, which
        // the commit restamps: only the table itself is bounded here.
        let version_max = self.table.version_max;
        if let Some(lease) = self
            .table
            .state
            .leases
            .values()
            .find(|l| l.renewed_revision > applied_index)
        {
            return Err(FsmError::invalid(
                "applied_index",
                format!(
                    "{applied_index} is below the renewal {} of lease {} found in the snapshot",
                    lease.renewed_revision, lease.id
                ),
            ));
        }
        if version_max > applied_index {
            return Err(FsmError::invalid(
                "applied_index",
                format!("{applied_index} is below version {version_max} found in the snapshot"),
            ));
        }
        let table = std::mem::take(&mut self.table);
        let mut w = self.shared.writer.lock();
        assert!(
            w.unpublished.is_empty(),
            "no batch is open while the writer lock is free"
        );
        install(&mut w, table.state, applied_index);
        w.pending = self.pending.take();
        w.cluster = self.cluster;
        w.space = self.space.settle(w.state.usage.bytes);
        w.corrupt = std::mem::take(&mut self.corrupt);
        self.shared.publish(&mut w);
        Ok(())
    }

    /// Discards the restored table; the store is unchanged.
    pub fn abort(self) {
        drop(self);
    }
}
