//! Seeding one node's data dir of a NEW cluster from a snapshot file: the one way both
//! `cairn snapshot restore --offline` (from a backup) and `cairn recover` (from a survivor's
//! replayed log) start a cluster over.
//!
//! The snapshot is placed `bump_index` above its own index, with the new membership (every
//! member a voter) and a new cluster id. The id is derived from the source's cluster id and
//! index, the bump and the members, so every node seeded with the same file and arguments
//! gets the same one, and it is never the old cluster's: members of the old cluster that
//! come back are refused by the new one, and it by them.
//!
//! Invariants: the data dir held no node state before (refused otherwise, nothing written);
//! the seeded snapshot holds exactly the source's table, at index `source + bump_index`, so
//! every version the new cluster hands out is greater than every version the old one did
//! up to `bump_index` entries after the source.

use std::path::{Path, PathBuf};

use crate::config::MemberConfig;
use crate::snapshot_file::{
    self, SnapshotFileError, SnapshotHeader, SnapshotReader, SnapshotWriter,
};

/// The default distance between the source's index and the new cluster's first.
pub const BUMP_INDEX_DEFAULT: u64 = 1_000_000_000;

/// Why a data dir was not seeded.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    /// The arguments cannot be used (no members, a zero or overflowing bump).
    #[error("{0}")]
    Usage(String),
    /// The data dir already holds a node's state.
    #[error("{0} already holds a node's data; seeding only fills an empty data dir")]
    NotEmpty(PathBuf),
    /// Reading the source or writing the data dir failed, or the source is damaged.
    #[error(transparent)]
    File(#[from] SnapshotFileError),
}

/// A data dir seeded.
#[derive(Debug, Clone)]
pub struct Seeded {
    /// The source's header (its cluster id and index).
    pub source: SnapshotHeader,
    pub cluster_id: String,
    /// The new cluster's first log index.
    pub log_index: u64,
}

fn io_error(path: &Path, source: std::io::Error) -> SeedError {
    SeedError::File(SnapshotFileError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The new cluster's id: the same for every node seeded with the same source and arguments.
fn new_cluster_id(source: &SnapshotHeader, bump_index: u64, members: &[MemberConfig]) -> String {
    let mut id_source = format!(
        "{}|{}|{}|",
        source.cluster_id, source.last_log_index, bump_index
    );
    for m in members {
        id_source.push_str(&format!(
            "{}={}/{};",
            m.id, m.peer_address, m.client_address
        ));
    }
    let reversed: Vec<u8> = id_source.as_bytes().iter().rev().copied().collect();
    format!(
        "{:08x}{:08x}",
        crc32c::crc32c(id_source.as_bytes()),
        crc32c::crc32c(&reversed)
    )
}

/// Seeds `data_dir` (empty, or not there yet) from the snapshot file `source` for a new
/// cluster of `members`. The source is verified whole first (`progress(bytes, total)` is told
/// while verifying, then while copying, each phase from 0).
pub fn seed_data_dir(
    source: &Path,
    data_dir: &Path,
    members: &[MemberConfig],
    bump_index: u64,
    mut progress: impl FnMut(&'static str, u64, u64),
) -> Result<Seeded, SeedError> {
    if members.is_empty() {
        return Err(SeedError::Usage("--members is empty".into()));
    }
    if bump_index == 0 {
        return Err(SeedError::Usage("--bump-index must be positive".into()));
    }
    if crate::raft::holds_node_state(data_dir) {
        return Err(SeedError::NotEmpty(data_dir.to_path_buf()));
    }
    let size_bytes = std::fs::metadata(source)
        .map_err(|e| io_error(source, e))?
        .len();
    progress("verifying", 0, size_bytes);
    let old = snapshot_file::verify(source, |_, _| {})?;
    progress("verifying", size_bytes, size_bytes);
    let index = old
        .last_log_index
        .checked_add(bump_index)
        .ok_or_else(|| SeedError::Usage("--bump-index overflows".into()))?;
    let nodes = crate::raft::membership_nodes(members);
    let (membership, term, leader) = crate::raft::seed_membership(&nodes, index);
    let cluster_id = new_cluster_id(&old, bump_index, members);
    assert_ne!(cluster_id, old.cluster_id, "a seeded cluster gets a new id");
    let header = SnapshotHeader {
        cluster_id: cluster_id.clone(),
        last_log_index: index,
        last_log_term: term,
        last_log_leader_node_id: leader,
        membership,
        resource_count: old.resource_count,
        created_at_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        applied_initial_entry: false,
        // A restore in progress in the source file is not part of its table.
        pending_restore: None,
        cluster_version: None,
        cluster_version_downgrade: None,
        space_quota_bytes: None,
        nospace_alarm_index: None,
        corrupt_members: Vec::new(),
        corrupt_alarm_index: None,
        // The leases go with the table (their resources name them).
        leases: old.leases.clone(),
    };
    let snapshots = crate::raft::snapshot_dir(data_dir);
    std::fs::create_dir_all(&snapshots).map_err(|e| io_error(&snapshots, e))?;
    let target = crate::raft::snapshot_path(&snapshots, index, term);
    let mut reader = SnapshotReader::open(source)?;
    let mut writer = SnapshotWriter::create(&target, &header)?;
    let mut copied = 0u64;
    while let Some(resource) = reader.next_table_resource()? {
        writer.append(&resource)?;
        copied += 1;
        progress("seeding", reader.offset(), size_bytes);
    }
    assert_eq!(
        copied, old.resource_count,
        "a verified file holds its header's count"
    );
    writer.finish()?;
    let id_path = data_dir.join("cluster_id");
    crate::durable::write_atomically(&id_path, cluster_id.as_bytes())
        .map_err(|e| io_error(&id_path, e))?;
    Ok(Seeded {
        source: old,
        cluster_id,
        log_index: index,
    })
}
