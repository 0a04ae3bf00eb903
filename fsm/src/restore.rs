//! Restores: the separate table a restore fills, and the online restore that
//! arrives through the log as `RestoreBegin`, `RestoreChunk`s, then
//! `RestoreCommit` or `RestoreAbort`.
//!
//! Rules of the online restore (every outcome is a pure function of the
//! entries, so every replica ends the same):
//! - At most one restore is pending. `RestoreBegin` while one is pending is
//!   `RestoreConflict` and changes nothing; so are a chunk, a commit for an
//!   id that is not the pending one. `RestoreAbort` of any other id is a
//!   no-op (abort after commit does nothing).
//! - A chunk's resources must each pass the rules of [`RestoreTable::add`];
//!   the first that does not marks the restore failed (its table is dropped
//!   to free the memory), and every later chunk and the commit report that
//!   failure. A failed restore stays pending until its commit or abort.
//! - The commit checks that exactly `resource_count` resources arrived, then
//!   swaps the table in at the commit's index `I`, restamping every restored
//!   resource with version `I`: above every version this store issued before,
//!   and no restored version can equal one a client still holds. It empties
//!   the history and closes every watch (`WatchClosed { reason: "restore" }`).
//! - A pending restore is part of the state: snapshots carry it, so a node
//!   that restarts from a snapshot taken mid-restore still commits the same.

use cairn_proto::v1::Resource;

use crate::history::History;
use crate::key::{self, Key};
use crate::lease::Lease;
use crate::state::State;
use crate::store::Writer;
use crate::validate::{validate_write, Limits};
use crate::watch::REASON_RESTORE;
use crate::{Applied, FsmError, StoredResource};

/// The longest restore id accepted.
pub const RESTORE_ID_BYTES_MAX: usize = 128;

/// Resources being restored, not visible to readers.
#[derive(Clone, Default)]
pub(crate) struct RestoreTable {
    pub state: State,
    /// The highest version among the resources.
    pub version_max: u64,
}

impl RestoreTable {
    pub fn len(&self) -> u64 {
        self.state.resources.len() as u64
    }

    /// Adds one resource. It must pass [`validate_write`], carry a version
    /// that is a positive decimal log index, and have a storage key not seen
    /// before in this restore.
    pub fn add(&mut self, resource: Resource, limits: &Limits) -> Result<(), FsmError> {
        validate_write(&resource, limits)?;
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
        if resource.lease != 0 && !self.state.leases.contains_key(&resource.lease) {
            return Err(FsmError::invalid(
                "resource.lease",
                format!(
                    "names lease {}, which the snapshot does not hold",
                    resource.lease
                ),
            ));
        }
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
        let previous = self
            .state
            .set(&key, Some(StoredResource::new(&resource, &key)));
        assert!(previous.is_none(), "checked: the key was new");
        self.version_max = self.version_max.max(version);
        Ok(())
    }
}

/// An online restore between its begin and its commit or abort.
#[derive(Clone)]
pub(crate) struct PendingRestore {
    pub restore_id: String,
    /// How many resources the begin announced.
    pub resource_count: u64,
    pub table: RestoreTable,
    /// Why the restore can no longer commit, once a resource was refused.
    pub failure: Option<String>,
}

impl PendingRestore {
    pub fn status(&self) -> PendingRestoreStatus {
        PendingRestoreStatus {
            restore_id: self.restore_id.clone(),
            resource_count: self.resource_count,
            received: self.table.len(),
            failure: self.failure.clone(),
        }
    }

    /// Adds a resource from a snapshot of a pending restore (no count check:
    /// the snapshot holds what had arrived).
    pub fn add(&mut self, resource: Resource, limits: &Limits) -> Result<(), FsmError> {
        self.table.add(resource, limits)
    }
}

/// What the node can see of a pending online restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRestoreStatus {
    pub restore_id: String,
    pub resource_count: u64,
    /// Resources received so far (0 once failed).
    pub received: u64,
    pub failure: Option<String>,
}

fn validate_restore_id(restore_id: &str) -> Result<(), FsmError> {
    if restore_id.is_empty() || restore_id.len() > RESTORE_ID_BYTES_MAX {
        return Err(FsmError::invalid(
            "restore_id",
            format!("must be 1 to {RESTORE_ID_BYTES_MAX} bytes"),
        ));
    }
    Ok(())
}

/// The pending restore `restore_id`, or `RestoreConflict`.
fn pending_mut<'w>(
    w: &'w mut Writer,
    restore_id: &str,
) -> Result<&'w mut PendingRestore, FsmError> {
    let in_progress = w.pending.as_ref().map(|p| p.restore_id.as_str());
    if in_progress != Some(restore_id) {
        return Err(FsmError::RestoreConflict(match in_progress {
            Some(other) => {
                format!("restore {restore_id:?} is not in progress (restore {other:?} is)")
            }
            None => format!("restore {restore_id:?} is not in progress"),
        }));
    }
    Ok(w.pending.as_mut().expect("checked: pending"))
}

fn failed(reason: &str) -> FsmError {
    FsmError::invalid("snapshot", reason.to_string())
}

pub(crate) fn begin(
    w: &mut Writer,
    index: u64,
    restore_id: &str,
    resource_count: u64,
    leases: &[(u64, u64)],
) -> Result<Applied, FsmError> {
    validate_restore_id(restore_id)?;
    if !leases.is_empty() {
        w.cluster.require(crate::Feature::Leases)?;
    }
    let leases = lease_table(leases, index)?;
    if let Some(p) = &w.pending {
        return Err(FsmError::RestoreConflict(format!(
            "restore {:?} is already in progress",
            p.restore_id
        )));
    }
    let mut table = RestoreTable::default();
    table.state.leases = leases;
    w.pending = Some(PendingRestore {
        restore_id: restore_id.to_string(),
        resource_count,
        table,
        failure: None,
    });
    w.dirty = true;
    Ok(Applied::RestoreBegun)
}

pub(crate) fn chunk(
    w: &mut Writer,
    limits: &Limits,
    restore_id: &str,
    resources: Vec<Resource>,
) -> Result<Applied, FsmError> {
    let pending = pending_mut(w, restore_id)?;
    if let Some(reason) = &pending.failure {
        return Err(failed(reason));
    }
    for resource in resources {
        let refused = if pending.table.len() == pending.resource_count {
            Some(format!(
                "more resources than the {} announced",
                pending.resource_count
            ))
        } else {
            let position = pending.table.len();
            pending
                .table
                .add(resource, limits)
                .err()
                .map(|e| format!("resource {position}: {e}"))
        };
        if let Some(reason) = refused {
            let leases = std::mem::take(&mut pending.table.state.leases);
            pending.table = RestoreTable::default();
            pending.table.state.leases = leases;
            pending.failure = Some(reason.clone());
            w.dirty = true;
            return Err(failed(&reason));
        }
    }
    let received = pending.table.len();
    w.dirty = true;
    Ok(Applied::RestoreChunkAdded { received })
}

pub(crate) fn commit(w: &mut Writer, index: u64, restore_id: &str) -> Result<Applied, FsmError> {
    pending_mut(w, restore_id)?;
    let Some(pending) = w.pending.take() else {
        unreachable!("checked: the restore is pending")
    };
    w.dirty = true;
    if let Some(reason) = pending.failure {
        return Err(failed(&reason));
    }
    if pending.table.len() != pending.resource_count {
        return Err(failed(&format!(
            "{} resources arrived, the restore announced {}",
            pending.table.len(),
            pending.resource_count
        )));
    }
    let version = index.to_string();
    let mut state = State::default();
    // The backup's leases, each renewed by the commit: a full TTL from it.
    state.leases = pending
        .table
        .state
        .leases
        .values()
        .map(|l| {
            let renewed = Lease {
                granted_revision: index,
                renewed_revision: index,
                ..*l
            };
            (l.id, renewed)
        })
        .collect();
    for (key, stored) in pending.table.state.resources {
        // Restamped: decoded and encoded again, once per restore.
        let mut resource = stored.resource();
        resource.version.clone_from(&version);
        state.set(&key, Some(StoredResource::new(&resource, &key)));
    }
    let resource_count = state.resources.len() as u64;
    assert_eq!(resource_count, pending.resource_count);
    install(w, state, index);
    w.version_issued_max = index;
    Ok(Applied::Restored { resource_count })
}

/// The leases `(id, ttl_ms)` of a backup as a lease table renewed at `index`: ids not 0
/// and distinct, TTLs within the hard bounds, at most [`crate::lease::LEASES_HARD_MAX`].
pub(crate) fn lease_table(
    leases: &[(u64, u64)],
    index: u64,
) -> Result<imbl::OrdMap<u64, Lease>, FsmError> {
    if leases.len() > crate::lease::LEASES_HARD_MAX {
        return Err(FsmError::invalid(
            "leases",
            format!(
                "{} leases, more than {}",
                leases.len(),
                crate::lease::LEASES_HARD_MAX
            ),
        ));
    }
    let mut table = imbl::OrdMap::new();
    for &(id, ttl_ms) in leases {
        if id == 0 {
            return Err(FsmError::invalid("leases", "0 is not a lease id"));
        }
        crate::lease::check_ttl(ttl_ms, 1, crate::lease::LEASE_TTL_HARD_MAX_MS, "")?;
        let lease = Lease {
            id,
            ttl_ms,
            granted_revision: index,
            renewed_revision: index,
        };
        if table.insert(id, lease).is_some() {
            return Err(FsmError::invalid(
                "leases",
                format!("lease {id} appears twice"),
            ));
        }
    }
    Ok(table)
}

pub(crate) fn abort(w: &mut Writer, restore_id: &str) -> Applied {
    let existed = w
        .pending
        .as_ref()
        .is_some_and(|p| p.restore_id == restore_id);
    if existed {
        w.pending = None;
        w.dirty = true;
    }
    Applied::RestoreAborted { existed }
}

/// Makes `state` the table at `revision`: the history is emptied (so
/// `revision` becomes the oldest retained one), changes not yet sent to
/// watches are dropped, and every watch is closed, since none of them can
/// follow the table across the swap. The caller publishes.
pub(crate) fn install(w: &mut Writer, mut state: State, revision: u64) {
    state.revision = revision;
    w.state = state;
    // The digests of the table before the swap describe another table.
    w.digests.clear();
    w.history = History::default();
    w.history_bytes = 0;
    w.oldest_retained_revision = revision;
    w.space = w.space.settle(w.state.usage.bytes);
    w.unpublished.clear();
    w.registry.close_all(REASON_RESTORE);
    assert_eq!(w.registry.len(), 0, "a restore leaves no watch open");
    w.dirty = true;
}
