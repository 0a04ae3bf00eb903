//! openraft's state machine over `cairn_fsm::Store`, with snapshots as files
//! in the data dir (format: `crate::snapshot_file`).
//!
//! The table itself is in memory; durability comes from the Raft log plus the
//! latest snapshot file: on start the newest complete snapshot is loaded and
//! openraft replays the log after it.
//!
//! Invariants: the fsm's applied index equals `last_applied.index` after every
//! `apply`; a snapshot file carries exactly the state at its header's index.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cairn_fsm::{Command, Store};
use cairn_proto::error::ApiError;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{EntryPayload, LogId, RaftLogId, StorageError, StorageIOError, StoredMembership};

use super::identity::AdoptError;
pub use super::identity::ClusterIdentity;
use super::log_growth::LogGrowth;
use super::types::{Membership, NodeId, NodeInfo, Reply, TypeConfig};
use super::{snapshot_index_of, snapshot_path};
use crate::fatal::FatalCause;
use crate::snapshot_file::{
    self, Section, SnapshotFileError, SnapshotHeader, SnapshotReader, SnapshotWriter,
};

#[derive(Default)]
struct Meta {
    last_applied: Option<LogId<NodeId>>,
    membership: Membership,
    current_snapshot: Option<(SnapshotMeta<NodeId, NodeInfo>, PathBuf)>,
}

struct Shared {
    store: Store,
    dir: PathBuf,
    /// Log bytes applied since the last snapshot, for compaction by size.
    growth: Arc<LogGrowth>,
    identity: Arc<ClusterIdentity>,
    meta: Mutex<Meta>,
    /// The write-stage clock (set once at start; see `super::stages`).
    stages: std::sync::OnceLock<Arc<super::stages::WriteStages>>,
    /// Told each time a snapshot file is durable with its name, so that purges of the log up
    /// to it may go through (set once at start; see `super::purge_gate`).
    purge_gate: std::sync::OnceLock<Arc<super::purge_gate::PurgeGate>>,
    /// The first failure returned to openraft (whose core stops on it), classified.
    failure: Mutex<Option<FatalCause>>,
    /// Snapshot files that failed to load at start, newest first, with why.
    damaged: Vec<(PathBuf, String)>,
}

/// The state machine openraft drives. Cheap to clone (the builder is a clone).
#[derive(Clone)]
pub struct StateMachine {
    shared: Arc<Shared>,
}

fn storage_error(cause: &FatalCause) -> StorageError<NodeId> {
    StorageIOError::write_state_machine(&io::Error::other(cause.to_string())).into()
}

/// A failure of the snapshot file at `path` while doing `doing` (writing it, loading it at
/// start, installing it from the leader), classified: an I/O error by its errno (on the file
/// it names), anything else as damage of `path`.
fn snapshot_failure(doing: &str, path: &Path, error: &SnapshotFileError) -> FatalCause {
    match error {
        SnapshotFileError::Io {
            path: io_path,
            source,
        } => FatalCause::from_io(doing, io_path, source),
        damage => FatalCause::Corruption {
            file: path.to_path_buf(),
            detail: damage.to_string(),
        },
    }
}

fn log_id_of(header: &SnapshotHeader) -> Option<LogId<NodeId>> {
    if header.last_log_index == 0 && header.last_log_term == 0 && !header.applied_initial_entry {
        return None;
    }
    Some(LogId::new(
        openraft::CommittedLeaderId::new(header.last_log_term, header.last_log_leader_node_id),
        header.last_log_index,
    ))
}

/// Restores `store` from the snapshot file at `path` (with the online restore it was taken
/// in the middle of, if any), once the file is verified, is at `index` (when given), and
/// `admit` accepts its header: nothing is changed when any of these fails. Failures are
/// classified by [`snapshot_failure`], `doing` saying what for; a file whose records
/// contradict its header or cannot be restored is damaged.
fn restore_from_file(
    store: &Store,
    path: &Path,
    index: Option<u64>,
    doing: &str,
    admit: impl FnOnce(&SnapshotHeader) -> Result<(), FatalCause>,
) -> Result<SnapshotHeader, FatalCause> {
    let failure = |e: SnapshotFileError| snapshot_failure(doing, path, &e);
    let damaged = |detail: String| FatalCause::Corruption {
        file: path.to_path_buf(),
        detail,
    };
    snapshot_file::verify(path, |_, _| {}).map_err(failure)?;
    let mut reader = SnapshotReader::open(path).map_err(failure)?;
    let header = reader.header.clone();
    if let Some(index) = index.filter(|index| *index != header.last_log_index) {
        return Err(damaged(format!(
            "the snapshot file is at index {}, expected {index}",
            header.last_log_index
        )));
    }
    admit(&header)?;
    let cluster = header.cluster_version().map_err(&damaged)?;
    super::cluster_version::check_supported(cluster, &format!("the snapshot {}", path.display()))?;
    let mut restoration = store.restore();
    restoration.set_cluster_version(cluster);
    restoration.set_space(header.space());
    let corrupt = header.corrupt_alarm();
    if corrupt.is_raised() != (corrupt.raised_index > 0)
        || !corrupt.members.windows(2).all(|w| w[0] < w[1])
    {
        return Err(damaged(format!(
            "the snapshot header's CORRUPT alarm is malformed: {corrupt:?}"
        )));
    }
    restoration.set_corrupt_alarm(corrupt);
    restoration
        .set_leases(header.leases())
        .map_err(|e| damaged(e.to_string()))?;
    if let Some(p) = &header.pending_restore {
        let leases: Vec<(u64, u64)> = p.leases.iter().map(|&[id, ttl]| (id, ttl)).collect();
        restoration
            .begin_pending(
                p.restore_id.clone(),
                p.resource_count,
                p.failure.clone(),
                &leases,
            )
            .map_err(|e| damaged(e.to_string()))?;
    }
    loop {
        match reader.next_record() {
            Ok(Some((resource, section))) => {
                let added = match section {
                    Section::Table => restoration.apply(resource),
                    Section::PendingRestore => restoration.apply_pending(resource),
                };
                if let Err(e) = added {
                    restoration.abort();
                    return Err(damaged(format!(
                        "record {} cannot be restored: {e}",
                        reader.records_read() - 1
                    )));
                }
            }
            Ok(None) => break,
            Err(e) => {
                restoration.abort();
                return Err(failure(e));
            }
        }
    }
    restoration
        .commit(header.last_log_index)
        .map_err(|e| damaged(format!("the restored table cannot be committed: {e}")))?;
    Ok(header)
}

/// Removes the complete snapshots below index `keep_index`. Never a `.tmp` (a build may be
/// writing it) nor `incoming.part` (the leader may be sending it): a build runs beside the
/// state machine's other work, and both are removed at start only, when nothing writes them
/// ([`is_leftover`]).
fn prune_older(dir: &Path, keep_index: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if snapshot_index_of(&path).is_some_and(|index| index < keep_index) {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove an old snapshot");
            }
        }
    }
}

/// The file a snapshot streaming in from the leader is written to, in the snapshot dir `dir`.
fn incoming_path(dir: &Path) -> PathBuf {
    dir.join(INCOMING_FILE_NAME)
}

const INCOMING_FILE_NAME: &str = "incoming.part";

/// Whether `path` is a file a stopped process leaves behind in the snapshot dir: a snapshot
/// being built (`snap-*.tmp`) or being received from the leader ([`incoming_path`]). Neither
/// is ever read: a complete snapshot is only ever found under its final name.
fn is_leftover(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    (name.starts_with("snap-") && name.ends_with(".tmp")) || name == INCOMING_FILE_NAME
}

/// Removes what a stopped process left in the snapshot dir (see [`is_leftover`]), so that a
/// kill during a snapshot of hundreds of megabytes does not keep that space for good.
fn remove_leftovers(dir: &Path) -> io::Result<()> {
    let mut removed = false;
    for entry in std::fs::read_dir(dir)?.flatten() {
        let path = entry.path();
        if !is_leftover(&path) {
            continue;
        }
        let size_bytes = entry.metadata().map(|m| m.len()).unwrap_or(0);
        std::fs::remove_file(&path)?;
        tracing::info!(path = %path.display(), size_bytes, "removed a snapshot file left unfinished by an earlier run");
        removed = true;
    }
    if removed {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

impl StateMachine {
    /// Opens the snapshot dir, removes files an earlier run left unfinished, and loads the
    /// newest complete snapshot into `store`.
    pub fn open(
        dir: &Path,
        store: Store,
        identity: Arc<ClusterIdentity>,
        growth: Arc<LogGrowth>,
    ) -> anyhow::Result<StateMachine> {
        if !dir.exists() {
            std::fs::create_dir_all(dir)?;
            // The new directory's name must survive a power cut, with the snapshots in it.
            crate::durable::sync_parent(dir)?;
        }
        remove_leftovers(dir)?;
        let mut candidates: Vec<PathBuf> = std::fs::read_dir(dir)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| snapshot_index_of(p).is_some())
            .collect();
        // Their names sort as their indexes do.
        candidates.sort();
        let mut meta = Meta::default();
        let mut damaged = Vec::new();
        // Newest first; a damaged newest file falls back to the one before. A file the
        // operating system fails to read stops the start, classified: it is not damage.
        while let Some(path) = candidates.pop() {
            match restore_from_file(&store, &path, None, "load the snapshot", |_| Ok(())) {
                Ok(header) => {
                    let membership: Membership = serde_json::from_value(header.membership.clone())?;
                    let last_log_id = log_id_of(&header);
                    if !header.cluster_id.is_empty() {
                        identity.set(&header.cluster_id)?;
                    }
                    tracing::info!(
                        index = header.last_log_index,
                        resources = header.resource_count,
                        "loaded snapshot"
                    );
                    meta.current_snapshot = Some((
                        SnapshotMeta {
                            last_log_id,
                            last_membership: membership.clone(),
                            snapshot_id: format!(
                                "{}-{}",
                                header.last_log_term, header.last_log_index
                            ),
                        },
                        path.clone(),
                    ));
                    meta.last_applied = last_log_id;
                    meta.membership = membership;
                    growth
                        .snapshot_installed(std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0));
                    break;
                }
                Err(FatalCause::Corruption { file, detail }) => {
                    tracing::error!(path = %file.display(), error = %detail, "skipping damaged snapshot");
                    damaged.push((file, detail));
                }
                Err(cause) => return Err(cause.into()),
            }
        }
        Ok(StateMachine {
            shared: Arc::new(Shared {
                store,
                dir: dir.to_path_buf(),
                growth,
                identity,
                meta: Mutex::new(meta),
                stages: std::sync::OnceLock::new(),
                purge_gate: std::sync::OnceLock::new(),
                failure: Mutex::new(None),
                damaged,
            }),
        })
    }

    /// Snapshot files that failed to load at start (newest first), with why.
    pub fn damaged_snapshots(&self) -> &[(PathBuf, String)] {
        &self.shared.damaged
    }

    /// The log index the loaded snapshot (or applied state) reaches, if any.
    pub fn applied_index(&self) -> Option<u64> {
        self.meta().last_applied.map(|l| l.index)
    }

    /// The first failure this state machine returned to openraft, classified.
    pub fn failure(&self) -> Option<FatalCause> {
        self.shared
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records `cause` (the first one is kept) and turns it into openraft's error.
    fn fail(&self, cause: FatalCause) -> StorageError<NodeId> {
        let error = storage_error(&cause);
        let mut failure = self
            .shared
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if failure.is_none() {
            *failure = Some(cause);
        }
        error
    }

    /// Records a failure that is neither the disk's nor damage (a bug).
    fn fail_with(&self, doing: impl std::fmt::Display) -> StorageError<NodeId> {
        self.fail(FatalCause::StorageFailed {
            path: self.shared.dir.clone(),
            doing: doing.to_string(),
        })
    }

    /// Records apply times into `stages` from now on (set once, at start).
    pub fn set_write_stages(&self, stages: Arc<super::stages::WriteStages>) {
        let set = self.shared.stages.set(stages);
        assert!(set.is_ok(), "the write-stage clock is set once");
    }

    /// Tells `gate` of every snapshot that becomes durable from now on (set once, at start).
    #[doc(hidden)]
    pub fn set_purge_gate(&self, gate: Arc<super::purge_gate::PurgeGate>) {
        let set = self.shared.purge_gate.set(gate);
        assert!(set.is_ok(), "the purge gate is set once");
    }

    /// The index of the snapshot file in use (loaded at start, built or installed since).
    pub fn snapshot_index(&self) -> Option<u64> {
        self.meta()
            .current_snapshot
            .as_ref()
            .and_then(|(meta, _)| meta.last_log_id.map(|l| l.index))
    }

    /// The snapshot at `index` is durable with its name: log purges up to it may go through,
    /// and a purge deferred until now is carried out before this returns.
    async fn snapshot_durable(&self, index: u64) -> Result<(), StorageError<NodeId>> {
        let Some(gate) = self.shared.purge_gate.get() else {
            return Ok(());
        };
        gate.snapshot_durable(index).await.map_err(|e| {
            self.fail_with(format!(
                "purge the Raft log through the snapshot at index {index}: {e}"
            ))
        })
    }

    fn record_stage(&self, stage: super::stages::IndexStage, first: u64, last: u64) {
        if let Some(stages) = self.shared.stages.get() {
            stages.record_indexes(stage, first, last);
        }
    }

    /// The table at one point in time together with the header describing it
    /// (log id, membership, cluster id, and the online restore in progress),
    /// taken while no entry is half applied.
    pub fn consistent_snapshot(&self) -> Result<(cairn_fsm::Snapshot, SnapshotHeader), String> {
        loop {
            let (fsm_snapshot, last_applied, membership) = {
                let meta = self.meta();
                (
                    self.shared.store.snapshot(),
                    meta.last_applied,
                    meta.membership.clone(),
                )
            };
            // Nothing applied (or only the initial membership at index 0, which
            // carries no data): an empty image at index 0, term 0.
            let (index, term, leader) = last_applied
                .map(|l| (l.index, l.leader_id.term, l.leader_id.node_id))
                .unwrap_or((0, 0, 0));
            // `apply` updates the table, then the meta: retry if we fell between the two.
            if fsm_snapshot.applied_index != index {
                std::thread::yield_now();
                continue;
            }
            let mut header = SnapshotHeader {
                cluster_id: self.shared.identity.cluster_id(),
                last_log_index: index,
                last_log_term: term,
                last_log_leader_node_id: leader,
                applied_initial_entry: last_applied.is_some_and(|l| l.index == 0),
                membership: serde_json::to_value(&membership).map_err(|e| e.to_string())?,
                resource_count: fsm_snapshot.len() as u64,
                created_at_unix_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis() as u64)
                    .unwrap_or(0),
                pending_restore: fsm_snapshot.pending.as_ref().map(|p| {
                    snapshot_file::PendingRestoreHeader {
                        restore_id: p.restore_id.clone(),
                        resource_count: p.resource_count,
                        received_count: p.len() as u64,
                        failure: p.failure.clone(),
                        leases: p.leases.iter().map(|&(id, ttl)| [id, ttl]).collect(),
                    }
                }),
                cluster_version: None,
                cluster_version_downgrade: None,
                space_quota_bytes: None,
                nospace_alarm_index: None,
                corrupt_members: Vec::new(),
                corrupt_alarm_index: None,
                leases: Vec::new(),
            };
            header.set_cluster_version(fsm_snapshot.cluster);
            header.set_space(fsm_snapshot.space);
            header.set_corrupt_alarm(&fsm_snapshot.corrupt);
            header.set_leases(&fsm_snapshot.leases);
            return Ok((fsm_snapshot, header));
        }
    }

    fn meta(&self) -> std::sync::MutexGuard<'_, Meta> {
        self.shared.meta.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the snapshot at `path` (of `meta`) the current one and removes the complete
    /// snapshots below it, unless one at a higher index is current: openraft builds a snapshot
    /// in a task of its own, beside the installs from the leader, so a build can end after a
    /// newer snapshot was installed. Such a stale build's file is removed instead, and the
    /// installed snapshot, which the log was purged behind, stays. Returns whether `meta` is
    /// current now. One lock holds the comparison, the swap and the removals together.
    fn publish_snapshot(&self, meta: &SnapshotMeta<NodeId, NodeInfo>, path: &Path) -> bool {
        let index_of =
            |meta: &SnapshotMeta<NodeId, NodeInfo>| meta.last_log_id.map_or(0, |l| l.index);
        let index = index_of(meta);
        let mut m = self.meta();
        if m.current_snapshot
            .as_ref()
            .is_some_and(|(current, _)| index_of(current) > index)
        {
            if let Err(e) = std::fs::remove_file(path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove a stale snapshot");
            }
            return false;
        }
        m.current_snapshot = Some((meta.clone(), path.to_path_buf()));
        prune_older(&self.shared.dir, index);
        true
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let covered_bytes = self.shared.growth.since_snapshot_bytes();
        let (fsm_snapshot, header) = self
            .consistent_snapshot()
            .map_err(|e| self.fail_with(format!("take a consistent snapshot: {e}")))?;
        let last_log_id = log_id_of(&header);
        let membership: Membership = serde_json::from_value(header.membership.clone())
            .map_err(|e| self.fail_with(format!("decode the snapshot membership: {e}")))?;
        let path = snapshot_path(
            &self.shared.dir,
            header.last_log_index,
            header.last_log_term,
        );
        let write_path = path.clone();
        let (header_index, header_term) = (header.last_log_index, header.last_log_term);
        let started = std::time::Instant::now();
        // A failed write removes its half-written file (SnapshotWriter's drop).
        let (size_bytes, crc) = tokio::task::spawn_blocking(move || {
            let mut fsm_snapshot = fsm_snapshot;
            let pending = fsm_snapshot.pending.take();
            let mut writer = SnapshotWriter::create(&write_path, &header)?;
            // Each record is the stored encoding, written as it is.
            for resource in fsm_snapshot {
                writer.append_encoded(resource.encoded())?;
            }
            for resource in pending.into_iter().flatten() {
                writer.append_encoded(resource.encoded())?;
            }
            writer.finish()
        })
        .await
        .map_err(|e| self.fail_with(format!("the snapshot writer task failed: {e}")))?
        .map_err(|e| self.fail(snapshot_failure("write the snapshot", &path, &e)))?;
        super::series::snapshot_saved(started.elapsed(), size_bytes);
        tracing::info!(
            index = header_index,
            size_bytes,
            crc,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "snapshot built"
        );
        let meta = SnapshotMeta {
            last_log_id,
            last_membership: membership,
            snapshot_id: format!("{header_term}-{header_index}-{crc:08x}"),
        };
        if let Some(log_id) = last_log_id {
            self.snapshot_durable(log_id.index).await?;
        }
        // Opened before it is published: a stale build's file is removed there.
        let file = tokio::fs::File::open(&path)
            .await
            .map_err(|e| self.fail(FatalCause::from_io("open the snapshot", &path, &e)))?;
        if self.publish_snapshot(&meta, &path) {
            self.shared.growth.snapshot_built(covered_bytes, size_bytes);
        } else {
            tracing::info!(
                index = header_index,
                "a newer snapshot was installed from the leader while this one was built: \
                 removed this one"
            );
        }
        Ok(Snapshot {
            meta,
            snapshot: Box::new(file),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, Membership), StorageError<NodeId>> {
        let meta = self.meta();
        Ok((meta.last_applied, meta.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Reply>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = openraft::Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        // One fsm batch per call: one publish and one writer lock for every
        // entry openraft hands over at once. Readers see the entries when the
        // batch ends, before the replies go out; the meta (last applied,
        // membership) follows right after, so `consistent_snapshot` never
        // pairs a table with the wrong log id.
        let mut replies = Vec::new();
        let mut applied_bytes = 0u64;
        let mut last_applied = None;
        let mut membership = None;
        let mut batch = self.shared.store.batch();
        let mut first_index = None;
        for entry in entries {
            let log_id = *entry.get_log_id();
            if first_index.is_none() {
                first_index = Some(log_id.index);
                self.record_stage(
                    super::stages::IndexStage::ApplyStarted,
                    log_id.index,
                    log_id.index,
                );
            }
            last_applied = Some(log_id);
            // openraft numbers the log from 0 and puts the initial membership
            // there; the fsm's revision 0 means "nothing applied", so entry 0
            // (which never carries data) leaves the table at revision 0.
            if log_id.index == 0 {
                assert!(
                    !matches!(entry.payload, EntryPayload::Normal(_)),
                    "data entry at log index 0"
                );
                if let EntryPayload::Membership(m) = entry.payload {
                    membership = Some(StoredMembership::new(Some(log_id), m));
                }
                replies.push(Reply(Ok(cairn_fsm::Applied::Deleted { existed: false })));
                continue;
            }
            if let EntryPayload::Normal(payload) = &entry.payload {
                applied_bytes += payload.0.len() as u64;
            }
            let reply = match entry.payload {
                EntryPayload::Blank => {
                    batch.apply_noop(log_id.index);
                    Reply(Ok(cairn_fsm::Applied::Deleted { existed: false }))
                }
                EntryPayload::Normal(payload) => match Command::decode(&payload.0) {
                    Ok(command) => {
                        let applied = batch.apply_owned(log_id.index, command);
                        if let Ok(cairn_fsm::Applied::ClusterVersion(state)) = &applied {
                            // Never serve under rules this build does not know.
                            super::cluster_version::check_supported(
                                *state,
                                &format!("the log entry at index {}", log_id.index),
                            )
                            .map_err(|cause| self.fail(cause))?;
                            // Downgraded: the log must lose the commands that the lower
                            // version does not allow, so that an older build can start.
                            if state.downgrade.is_some() {
                                self.shared.growth.compact_through(log_id.index);
                            }
                        }
                        Reply(applied.map_err(ApiError::from))
                    }
                    Err(e) => {
                        // Only validated commands are proposed; an undecodable one is a
                        // bug in a peer. Keep the log moving identically on every node.
                        tracing::error!(index = log_id.index, error = %e, "undecodable command in the log");
                        batch.apply_noop(log_id.index);
                        Reply(Err(ApiError::Internal(format!(
                            "undecodable command at index {}: {e}",
                            log_id.index
                        ))))
                    }
                },
                EntryPayload::Membership(m) => {
                    batch.apply_noop(log_id.index);
                    membership = Some(StoredMembership::new(Some(log_id), m));
                    Reply(Ok(cairn_fsm::Applied::Deleted { existed: false }))
                }
            };
            assert_eq!(
                batch.applied_index(),
                log_id.index,
                "fsm applied index diverged from raft's"
            );
            replies.push(reply);
        }
        batch.finish();
        if let (Some(first), Some(last)) = (first_index, last_applied) {
            // Every entry of the call started applying with the first one.
            self.record_stage(super::stages::IndexStage::ApplyStarted, first, last.index);
            self.record_stage(super::stages::IndexStage::Applied, first, last.index);
        }
        if let Some(log_id) = last_applied {
            let mut meta = self.meta();
            assert!(
                meta.last_applied < Some(log_id),
                "applied log ids strictly increase"
            );
            meta.last_applied = Some(log_id);
            if let Some(m) = membership {
                meta.membership = m;
            }
        }
        self.shared.growth.applied(applied_bytes);
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> StateMachine {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<tokio::fs::File>, StorageError<NodeId>> {
        let path = incoming_path(&self.shared.dir);
        // Readable too: `install_snapshot` copies a file handed back under another name.
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .await
            .map_err(|e| {
                self.fail(FatalCause::from_io(
                    "create the file for a snapshot from the leader",
                    &path,
                    &e,
                ))
            })?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, NodeInfo>,
        snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError<NodeId>> {
        let started = std::time::Instant::now();
        let incoming = incoming_path(&self.shared.dir);
        // The data is whatever file openraft hands back: normally the
        // `incoming.part` we opened for it, but any file is honoured, copied
        // into place first.
        let mut received = snapshot.into_std().await;
        let incoming_copy = incoming.clone();
        let received_bytes = tokio::task::spawn_blocking(move || -> std::io::Result<u64> {
            use std::io::Seek as _;
            use std::os::unix::fs::MetadataExt as _;
            let ours = std::fs::metadata(&incoming_copy).ok();
            let theirs = received.metadata()?;
            let same = ours.is_some_and(|m| m.dev() == theirs.dev() && m.ino() == theirs.ino());
            if !same {
                received.seek(std::io::SeekFrom::Start(0))?;
                let mut copy = std::fs::File::create(&incoming_copy)?;
                std::io::copy(&mut received, &mut copy)?;
                received = copy;
            }
            received.sync_all()?;
            Ok(received.metadata()?.len())
        })
        .await
        .map_err(|e| self.fail_with(format!("the snapshot copy task failed: {e}")))?
        .map_err(|e| {
            self.fail(FatalCause::from_io(
                "store the snapshot received from the leader",
                &incoming,
                &e,
            ))
        })?;
        let Some(last_log_id) = meta.last_log_id else {
            return Err(self.fail_with("received a snapshot without a log id"));
        };
        let final_path = snapshot_path(
            &self.shared.dir,
            last_log_id.index,
            last_log_id.leader_id.term,
        );
        let store = self.shared.store.clone();
        let identity = self.shared.identity.clone();
        let install_path = final_path.clone();
        let data_dir = self
            .shared
            .dir
            .parent()
            .unwrap_or(&self.shared.dir)
            .to_path_buf();
        tokio::task::spawn_blocking(move || -> Result<(), FatalCause> {
            const DOING: &str = "install the snapshot received from the leader";
            let admit = |header: &SnapshotHeader| {
                identity.admit(&header.cluster_id).map_err(|e| match e {
                    AdoptError::OtherCluster => FatalCause::DataDirRefused {
                        reason: format!(
                            "the snapshot received from the leader ({}) belongs to another \
                                 cluster than data dir {} (the leader's messages carry this \
                                 dir's id), and nothing was installed: find the member whose \
                                 data dir holds another cluster's state before starting this \
                                 node again",
                            incoming.display(),
                            data_dir.display()
                        ),
                    },
                    AdoptError::Persist { path, source } => {
                        FatalCause::from_io("record the cluster id", &path, &source)
                    }
                })
            };
            restore_from_file(&store, &incoming, Some(last_log_id.index), DOING, admit)?;
            std::fs::rename(&incoming, &install_path)
                .map_err(|e| FatalCause::from_io(DOING, &install_path, &e))?;
            // The new name is durable before the deferred log purge behind it is carried
            // out (`snapshot_durable`), and before `publish_snapshot` removes the older snapshots.
            crate::durable::sync_parent(&install_path)
                .map_err(|e| FatalCause::from_io(DOING, &install_path, &e))?;
            Ok(())
        })
        .await
        .map_err(|e| self.fail_with(format!("the snapshot install task failed: {e}")))?
        .map_err(|cause| self.fail(cause))?;
        self.shared.growth.snapshot_installed(received_bytes);
        super::series::snapshot_installed(started.elapsed(), received_bytes);
        self.snapshot_durable(last_log_id.index).await?;
        let published = self.publish_snapshot(meta, &final_path);
        assert!(
            published,
            "a snapshot installed from the leader is newer than any this node built"
        );
        let mut m = self.meta();
        m.last_applied = Some(last_log_id);
        m.membership = meta.last_membership.clone();
        tracing::info!(
            index = last_log_id.index,
            "installed snapshot from the leader"
        );
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let current = self.meta().current_snapshot.clone();
        match current {
            None => Ok(None),
            Some((meta, path)) => {
                let file = tokio::fs::File::open(&path)
                    .await
                    .map_err(|e| self.fail(FatalCause::from_io("open the snapshot", &path, &e)))?;
                Ok(Some(Snapshot {
                    meta,
                    snapshot: Box::new(file),
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn open(dir: &Path, cluster_id: &str) -> StateMachine {
        let identity = Arc::new(ClusterIdentity::open(dir).unwrap());
        if !cluster_id.is_empty() {
            identity.set(cluster_id).unwrap();
        }
        StateMachine::open(
            &dir.join("snapshots"),
            Store::new(Default::default()),
            identity,
            LogGrowth::new(1 << 20),
        )
        .unwrap()
    }

    fn header(cluster_id: &str, index: u64) -> SnapshotHeader {
        SnapshotHeader {
            cluster_id: cluster_id.into(),
            last_log_index: index,
            last_log_term: 1,
            last_log_leader_node_id: 1,
            membership: serde_json::to_value(Membership::default()).unwrap(),
            resource_count: 0,
            created_at_unix_ms: 0,
            applied_initial_entry: false,
            pending_restore: None,
            cluster_version: None,
            cluster_version_downgrade: None,
            space_quota_bytes: None,
            nospace_alarm_index: None,
            corrupt_members: Vec::new(),
            corrupt_alarm_index: None,
            leases: Vec::new(),
        }
    }

    /// Installs `bytes` as the snapshot at index 5 received from the leader.
    async fn install(sm: &mut StateMachine, bytes: &[u8]) -> Option<FatalCause> {
        use tokio::io::AsyncWriteExt as _;
        let mut file = sm.begin_receiving_snapshot().await.unwrap();
        file.write_all(bytes).await.unwrap();
        file.flush().await.unwrap();
        let meta = SnapshotMeta {
            last_log_id: Some(LogId::new(CommittedLeaderId::new(1, 1), 5)),
            last_membership: Membership::default(),
            snapshot_id: "1-5".into(),
        };
        assert!(sm.install_snapshot(&meta, file).await.is_err());
        sm.failure()
    }

    fn snapshot_bytes(dir: &Path, header: &SnapshotHeader) -> Vec<u8> {
        let path = dir.join("made.snap");
        SnapshotWriter::create(&path, header)
            .unwrap()
            .finish()
            .unwrap();
        std::fs::read(&path).unwrap()
    }

    #[tokio::test]
    async fn a_damaged_or_foreign_snapshot_from_the_leader_is_no_disk_failure() {
        // A received file that fails verification is damage (exit 12, naming the file); one
        // of another cluster refuses the data dir (exit 15). Before the fix both were
        // "storage failed" (exit 11, "check the disk").
        let dir = tempfile::tempdir().unwrap();
        let mut sm = open(dir.path(), "mine");
        match install(&mut sm, b"not a snapshot").await {
            Some(FatalCause::Corruption { file, detail }) => {
                assert!(file.ends_with("snapshots/incoming.part"), "{file:?}");
                assert!(detail.contains("not a Cairn snapshot"), "{detail}");
            }
            other => panic!("expected Corruption, got {other:?}"),
        }
        let dir = tempfile::tempdir().unwrap();
        let foreign = snapshot_bytes(dir.path(), &header("theirs", 5));
        let mut sm = open(dir.path(), "mine");
        match install(&mut sm, &foreign).await {
            Some(cause @ FatalCause::DataDirRefused { .. }) => {
                assert_eq!(cause.exit_code(), crate::fatal::exit::DATA_DIR_REFUSED);
                let line = cause.to_string();
                assert!(!line.contains("theirs") && !line.contains("mine"), "{line}");
            }
            other => panic!("expected DataDirRefused, got {other:?}"),
        }
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = snapshot_bytes(dir.path(), &header("mine", 4));
        let mut sm = open(dir.path(), "mine");
        match install(&mut sm, &elsewhere).await {
            Some(FatalCause::Corruption { detail, .. }) => {
                assert!(detail.contains("index 4, expected 5"), "{detail}")
            }
            other => panic!("expected Corruption, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_build_beside_a_receive_removes_neither_the_incoming_file_nor_a_newer_install() {
        // openraft builds a snapshot in a task of its own, beside a snapshot streaming in from
        // the leader. A build that ended mid-receive removed `incoming.part`, and the install
        // then failed (EBADF, exit 11: 14-set-oom-kill-loop, 2026-11-30). A build that ended
        // after an install removed the installed snapshot, which the log was purged behind,
        // and made its older one current.
        use tokio::io::AsyncWriteExt as _;
        let dir = tempfile::tempdir().unwrap();
        let snapshots = dir.path().join("snapshots");
        let bytes = snapshot_bytes(dir.path(), &header("mine", 5));
        let mut sm = open(dir.path(), "mine");
        let mut receiving = sm.begin_receiving_snapshot().await.unwrap();
        let (first, rest) = bytes.split_at(bytes.len() / 2);
        receiving.write_all(first).await.unwrap();
        sm.clone().build_snapshot().await.unwrap();
        assert!(
            snapshots.join("incoming.part").exists(),
            "a build removed the file being received"
        );
        receiving.write_all(rest).await.unwrap();
        receiving.flush().await.unwrap();
        let meta_at = |index| SnapshotMeta {
            last_log_id: Some(LogId::new(CommittedLeaderId::new(1, 1), index)),
            last_membership: Membership::default(),
            snapshot_id: format!("1-{index}"),
        };
        sm.install_snapshot(&meta_at(5), receiving).await.unwrap();
        let installed = snapshot_path(&snapshots, 5, 1);
        assert!(installed.exists());

        // A build that took its state before the install and ends after it.
        let stale = snapshot_path(&snapshots, 3, 1);
        SnapshotWriter::create(&stale, &header("mine", 3))
            .unwrap()
            .finish()
            .unwrap();
        assert!(!sm.publish_snapshot(&meta_at(3), &stale));
        assert!(installed.exists() && !stale.exists());
        let current = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta.last_log_id.map(|l| l.index), Some(5));
    }

    #[test]
    fn at_start_files_left_by_an_unfinished_snapshot_are_removed_and_complete_ones_kept() {
        // A kill while a snapshot was built (`.tmp`) or received (`incoming.part`) leaves its
        // partial file; the next start removes it (issue 29 found a 540 MB `.tmp` kept for
        // good) and loads the newest complete snapshot.
        let dir = tempfile::tempdir().unwrap();
        let snapshots = dir.path().join("snapshots");
        std::fs::create_dir_all(&snapshots).unwrap();
        let good = snapshot_path(&snapshots, 5, 1);
        SnapshotWriter::create(&good, &header("mine", 5))
            .unwrap()
            .finish()
            .unwrap();
        let building = snapshot_path(&snapshots, 9, 1).with_extension("tmp");
        let receiving = snapshots.join("incoming.part");
        std::fs::write(&building, b"CAIRNSNP half").unwrap();
        std::fs::write(&receiving, b"CAIRNSNP half").unwrap();
        let unrelated = snapshots.join("notes.txt");
        std::fs::write(&unrelated, b"an operator's file").unwrap();
        let sm = open(dir.path(), "mine");
        assert_eq!(sm.applied_index(), Some(5));
        assert!(!building.exists() && !receiving.exists());
        assert!(good.exists() && unrelated.exists());
    }

    #[test]
    fn at_start_a_damaged_snapshot_is_skipped_and_an_unreadable_one_stops_the_node() {
        // Damage falls back to the snapshot before, recording why without the path; a file
        // the operating system fails to read (here a directory: EISDIR) is no damage and
        // stops the start, classified. Before the fix it was taken for damage: with a log
        // purged beyond the older snapshot the data dir was then marked damaged.
        let dir = tempfile::tempdir().unwrap();
        let snapshots = dir.path().join("snapshots");
        std::fs::create_dir_all(&snapshots).unwrap();
        let good = snapshot_path(&snapshots, 5, 1);
        SnapshotWriter::create(&good, &header("mine", 5))
            .unwrap()
            .finish()
            .unwrap();
        let damaged = snapshot_path(&snapshots, 9, 1);
        std::fs::write(&damaged, b"CAIRNSNP damaged").unwrap();
        let sm = open(dir.path(), "mine");
        assert_eq!(sm.applied_index(), Some(5));
        let [(file, why)] = sm.damaged_snapshots() else {
            panic!("{:?}", sm.damaged_snapshots())
        };
        assert_eq!(file, &damaged);
        assert!(!why.contains(&*damaged.to_string_lossy()), "{why}");
        std::fs::remove_file(&damaged).unwrap();
        std::fs::create_dir(&damaged).unwrap();
        let identity = Arc::new(ClusterIdentity::open(dir.path()).unwrap());
        let error = StateMachine::open(
            &snapshots,
            Store::new(Default::default()),
            identity,
            LogGrowth::new(1 << 20),
        )
        .err()
        .expect("an unreadable snapshot stops the start");
        match error.downcast_ref::<FatalCause>() {
            Some(cause @ FatalCause::StorageFailed { path, .. }) => {
                assert_eq!(path, &damaged);
                assert!(!cause.leaves_marker());
            }
            other => panic!("expected StorageFailed, got {other:?} ({error:#})"),
        }
    }
}
