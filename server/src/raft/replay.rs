//! A stopped node's data dir, read offline for `cairn recover`: what its log holds
//! ([`inspect`]), and the state after every entry it holds, committed or not ([`replay`]).
//!
//! Both open the data dir as [`super::RaftHandle::start`] does (the log's directory lock, so
//! a running node is refused; the engine the dir was written by; the newest snapshot that
//! loads) and change nothing in it but what opening always does (unfinished snapshot files
//! of an earlier run are removed).
//!
//! Invariants: the replayed state is the state machine's own after applying, in order, the
//! loaded snapshot and then every log entry after it up to the last one stored (asserted:
//! the applied index equals the last entry's index); its header keeps the data dir's
//! cluster id, membership and log id, and no online restore in progress.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_fsm::Store;
use cairn_raft_log::{LogEngineKind, LogError, LogOptions};
use openraft::storage::RaftStateMachine;

use super::identity::ClusterIdentity;
use super::log_growth::LogGrowth;
use super::{log_dir, snapshot_dir, LogStore, StateMachine};
use crate::snapshot_file::{SnapshotHeader, SnapshotWriter};

/// Entries read from the log and applied at a time.
const REPLAY_BATCH_BYTES_MAX: u64 = 16 << 20;

/// Why a data dir cannot be read offline.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// Not a node's data dir (no log, no snapshot).
    #[error("{0} holds no node data (no raft-log and no snapshots directory)")]
    NotADataDir(PathBuf),
    /// A node runs on it.
    #[error("{dir} is in use{}: stop that node first (recovery reads a stopped node's data)",
        holder_pid.map(|p| format!(" by process {p}")).unwrap_or_default())]
    InUse {
        dir: PathBuf,
        holder_pid: Option<u32>,
    },
    /// Its log, snapshot or metadata cannot be read or is damaged.
    #[error("{dir}: {detail}")]
    Unreadable { dir: PathBuf, detail: String },
}

/// What a stopped node's data dir holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LogSummary {
    pub data_dir: PathBuf,
    /// The node id recorded in it, if any.
    pub node_id: Option<u64>,
    pub cluster_id: String,
    /// The index the newest snapshot that loads reaches (0: none).
    pub snapshot_index: u64,
    /// Term and index of the last entry it holds (of the snapshot when the log is empty).
    pub last_log_term: u64,
    pub last_log_index: u64,
    /// The highest index this node knew to be committed (at least its snapshot's).
    pub committed_index: u64,
}

impl LogSummary {
    /// How up to date this log is, in Raft's order (last term, then last index); ties go to
    /// the one that knew more to be committed.
    pub fn rank(&self) -> (u64, u64, u64) {
        (
            self.last_log_term,
            self.last_log_index,
            self.committed_index,
        )
    }
}

/// The state replayed from a data dir, written as a snapshot file.
#[derive(Debug, Clone)]
pub struct Replayed {
    pub summary: LogSummary,
    /// The header of the snapshot file written (the data dir's cluster id and log id).
    pub header: SnapshotHeader,
    /// Entries applied after the snapshot.
    pub entries_applied: u64,
    pub size_bytes: u64,
}

struct Opened {
    log: LogStore,
    state_machine: StateMachine,
    summary: LogSummary,
}

fn unreadable(dir: &Path, detail: impl std::fmt::Display) -> ReplayError {
    ReplayError::Unreadable {
        dir: dir.to_path_buf(),
        detail: detail.to_string(),
    }
}

/// Opens the log with the engine that wrote it.
fn open_log(data_dir: &Path) -> Result<LogStore, ReplayError> {
    let dir = log_dir(data_dir);
    let open = |engine: LogEngineKind| LogStore::open(&dir, LogOptions::with_engine(engine));
    let opened = match open(LogEngineKind::Wal) {
        Err(LogError::EngineMismatch { found, .. }) => open(found),
        other => other,
    };
    opened.map_err(|e| match e {
        LogError::Locked { dir, holder_pid } => ReplayError::InUse { dir, holder_pid },
        e => unreadable(&dir, format!("the Raft log cannot be opened: {e}")),
    })
}

async fn open(data_dir: &Path) -> Result<Opened, ReplayError> {
    if !super::holds_node_state(data_dir) {
        return Err(ReplayError::NotADataDir(data_dir.to_path_buf()));
    }
    let dir = data_dir.to_path_buf();
    let blocking = tokio::task::spawn_blocking(move || -> Result<_, ReplayError> {
        let log = open_log(&dir)?;
        let identity = Arc::new(ClusterIdentity::open(&dir).map_err(|e| unreadable(&dir, e))?);
        let state_machine = StateMachine::open(
            &snapshot_dir(&dir),
            Store::new(cairn_fsm::Limits::default()),
            identity.clone(),
            LogGrowth::new(u64::MAX),
        )
        .map_err(|e| unreadable(&dir, format!("the snapshot cannot be loaded: {e}")))?;
        Ok((log, identity, state_machine))
    });
    let (log, identity, state_machine) = blocking
        .await
        .map_err(|e| unreadable(data_dir, format!("the open task failed: {e}")))??;
    super::check_snapshot_covers_log(&log, &state_machine, &log_dir(data_dir))
        .await
        .map_err(|e| unreadable(data_dir, e))?;
    let (_, last) = log.log_state().await.map_err(|e| unreadable(data_dir, e))?;
    let committed = log.committed().await.map_err(|e| unreadable(data_dir, e))?;
    let snapshot_index = state_machine.applied_index().unwrap_or(0);
    let (last_log_term, last_log_index) = match last {
        Some(l) => (l.leader_id.term, l.index),
        None => {
            let (_, header) = state_machine
                .consistent_snapshot()
                .map_err(|e| unreadable(data_dir, e))?;
            (header.last_log_term, header.last_log_index)
        }
    };
    let last_log_index = last_log_index.max(snapshot_index);
    let summary = LogSummary {
        data_dir: data_dir.to_path_buf(),
        node_id: identity.node_id().map_err(|e| unreadable(data_dir, e))?,
        cluster_id: identity.cluster_id(),
        snapshot_index,
        last_log_term,
        last_log_index,
        committed_index: committed.map_or(0, |c| c.index).max(snapshot_index),
    };
    assert!(
        summary.snapshot_index <= summary.last_log_index
            && summary.committed_index <= summary.last_log_index.max(summary.snapshot_index),
        "snapshot <= last and committed <= last: {summary:?}"
    );
    Ok(Opened {
        log,
        state_machine,
        summary,
    })
}

/// What the stopped node's data dir at `data_dir` holds.
pub async fn inspect(data_dir: &Path) -> Result<LogSummary, ReplayError> {
    Ok(open(data_dir).await?.summary)
}

/// Applies every entry the data dir holds after its snapshot, committed or not, and writes
/// the resulting state to the snapshot file `out` (which must not exist). `progress` is told
/// (entries applied, entries to apply) as it goes.
pub async fn replay(
    data_dir: &Path,
    out: &Path,
    mut progress: impl FnMut(u64, u64),
) -> Result<Replayed, ReplayError> {
    let Opened {
        log,
        mut state_machine,
        summary,
    } = open(data_dir).await?;
    let first = summary.snapshot_index + 1;
    let last = summary.last_log_index;
    let total = (last + 1).saturating_sub(first);
    let mut next = first;
    // An empty data dir's log starts at 0 (the initial membership), which apply handles.
    if summary.snapshot_index == 0 && state_machine.applied_index().is_none() {
        next = 0;
    }
    while next <= last {
        let entries = log
            .read_entries_bounded(next, last + 1, REPLAY_BATCH_BYTES_MAX)
            .await
            .map_err(|e| unreadable(data_dir, e))?;
        let Some(end) = entries.last().map(|e| e.log_id.index) else {
            return Err(unreadable(
                data_dir,
                format!("the Raft log holds no entry at index {next}, below its last ({last})"),
            ));
        };
        assert_eq!(entries[0].log_id.index, next, "a read starts where asked");
        state_machine
            .apply(entries)
            .await
            .map_err(|e| unreadable(data_dir, format!("applying the log: {e}")))?;
        next = end + 1;
        progress(next.saturating_sub(first).min(total), total);
    }
    assert_eq!(
        state_machine.applied_index().unwrap_or(0),
        last,
        "the replay applied through the last entry"
    );
    let (snapshot, mut header) = state_machine
        .consistent_snapshot()
        .map_err(|e| unreadable(data_dir, e))?;
    assert_eq!(
        header.last_log_index, last,
        "the image is at the last entry"
    );
    // An online restore that had not committed is not part of the table.
    header.pending_restore = None;
    let write_header = header.clone();
    let out_path = out.to_path_buf();
    let (size_bytes, _) = tokio::task::spawn_blocking(move || {
        let mut writer = SnapshotWriter::create(&out_path, &write_header)?;
        for resource in snapshot {
            writer.append_encoded(resource.encoded())?;
        }
        writer.finish()
    })
    .await
    .map_err(|e| unreadable(data_dir, format!("the snapshot writer task failed: {e}")))?
    .map_err(|e| unreadable(out, e))?;
    Ok(Replayed {
        summary,
        header,
        entries_applied: total,
        size_bytes,
    })
}
