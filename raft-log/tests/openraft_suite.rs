//! openraft's own storage test suite against `LogStore`, paired with a minimal in-memory state
//! machine (the real one belongs to the node).

mod common;

use std::io::Cursor;
use std::sync::Arc;

use common::TestConfig;
use openraft::storage::RaftStateMachine;
use openraft::storage::Snapshot;
use openraft::testing::StoreBuilder;
use openraft::testing::Suite;
use openraft::EntryPayload;
use openraft::LogId;
use openraft::RaftSnapshotBuilder;
use openraft::SnapshotMeta;
use openraft::StorageError;
use openraft::StorageIOError;
use openraft::StoredMembership;
use parking_lot::Mutex;
use serde::Deserialize;
use serde::Serialize;

/// What the test state machine holds: everything openraft asks about, plus the applied data.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct SmData {
    last_applied: Option<LogId<u64>>,
    last_membership: StoredMembership<u64, openraft::BasicNode>,
    applied: Vec<Vec<u8>>,
}

#[derive(Default)]
struct SmInner {
    data: SmData,
    snapshot: Option<(SnapshotMeta<u64, openraft::BasicNode>, Vec<u8>)>,
    snapshots_built: u64,
}

/// A minimal in-memory state machine, enough for openraft's suite.
#[derive(Clone, Default)]
struct TestStateMachine {
    inner: Arc<Mutex<SmInner>>,
}

fn sm_error(e: impl std::fmt::Display) -> StorageError<u64> {
    StorageIOError::write_state_machine(openraft::AnyError::error(e)).into()
}

impl RaftSnapshotBuilder<TestConfig> for TestStateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TestConfig>, StorageError<u64>> {
        let mut inner = self.inner.lock();
        let bytes = serde_json::to_vec(&inner.data).map_err(sm_error)?;
        inner.snapshots_built += 1;
        let meta = SnapshotMeta {
            last_log_id: inner.data.last_applied,
            last_membership: inner.data.last_membership.clone(),
            snapshot_id: format!("snapshot-{}", inner.snapshots_built),
        };
        inner.snapshot = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<TestConfig> for TestStateMachine {
    type SnapshotBuilder = TestStateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<
        (
            Option<LogId<u64>>,
            StoredMembership<u64, openraft::BasicNode>,
        ),
        StorageError<u64>,
    > {
        let inner = self.inner.lock();
        Ok((inner.data.last_applied, inner.data.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<()>, StorageError<u64>>
    where
        I: IntoIterator<Item = openraft::Entry<TestConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut inner = self.inner.lock();
        let mut replies = Vec::new();
        for entry in entries {
            inner.data.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(command) => inner.data.applied.push(command.0),
                EntryPayload::Membership(membership) => {
                    inner.data.last_membership =
                        StoredMembership::new(Some(entry.log_id), membership)
                }
            }
            replies.push(());
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, openraft::BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let bytes = snapshot.into_inner();
        let data: SmData = serde_json::from_slice(&bytes).map_err(sm_error)?;
        let mut inner = self.inner.lock();
        inner.data = data;
        inner.snapshot = Some((meta.clone(), bytes));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TestConfig>>, StorageError<u64>> {
        let inner = self.inner.lock();
        Ok(inner.snapshot.as_ref().map(|(meta, bytes)| Snapshot {
            meta: meta.clone(),
            snapshot: Box::new(Cursor::new(bytes.clone())),
        }))
    }
}

/// Builds a fresh store with `options` in a new temporary directory for each suite case.
struct Builder {
    options: cairn_raft_log::LogOptions,
}

impl StoreBuilder<TestConfig, common::Store, TestStateMachine, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, common::Store, TestStateMachine), StorageError<u64>> {
        let dir = tempfile::tempdir().map_err(|e| sm_error(format!("tempdir: {e}")))?;
        let store = common::Store::open(dir.path(), self.options.clone())
            .map_err(|e| sm_error(format!("open log store: {e}")))?;
        Ok((dir, store, TestStateMachine::default()))
    }
}

#[test]
fn openraft_storage_suite_passes_on_the_wal() {
    // Runs every case of openraft::testing::Suite against a fresh WAL-backed LogStore.
    Suite::test_all(Builder {
        options: common::options(common::LogEngineKind::Wal),
    })
    .expect("openraft storage suite on the WAL");
}

#[test]
fn openraft_storage_suite_passes_on_the_wal_with_tiny_segments_and_no_tail() {
    // The same suite with 4 KiB segments (rotation on nearly every append) and no in-memory
    // tail (every read goes to the segments).
    Suite::test_all(Builder {
        options: common::small_wal(4096, 0),
    })
    .expect("openraft storage suite on the WAL, tiny segments, no tail");
}

#[test]
fn openraft_storage_suite_passes_on_sled() {
    // Runs every case of openraft::testing::Suite against a fresh sled-backed LogStore.
    Suite::test_all(Builder {
        options: common::options(common::LogEngineKind::Sled),
    })
    .expect("openraft storage suite on sled");
}
