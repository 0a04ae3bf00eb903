//! openraft's own storage test suite against the node's real pair: the
//! `cairn-raft-log` log store and the fsm-backed [`StateMachine`] with its
//! snapshot files, each case on a fresh data dir.

use std::sync::Arc;

use openraft::testing::{StoreBuilder, Suite};
use openraft::{StorageError, StorageIOError};

use super::{log_dir, snapshot_dir, ClusterIdentity, LogStore, NodeId, StateMachine, TypeConfig};

struct Builder;

fn setup_error(e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::write_state_machine(&std::io::Error::other(e.to_string())).into()
}

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<NodeId>> {
        let dir = tempfile::tempdir().map_err(setup_error)?;
        let log = LogStore::open(&log_dir(dir.path()), Default::default()).map_err(setup_error)?;
        let identity = Arc::new(ClusterIdentity::open(dir.path()).map_err(setup_error)?);
        let store = cairn_fsm::Store::new(Default::default());
        let growth = super::log_growth::LogGrowth::new(64 * 1024 * 1024);
        let state_machine = StateMachine::open(&snapshot_dir(dir.path()), store, identity, growth)
            .map_err(setup_error)?;
        Ok((dir, log, state_machine))
    }
}

#[test]
fn openraft_storage_suite_passes_with_the_real_log_and_state_machine() {
    // Every case of openraft::testing::Suite, against what a node runs.
    Suite::test_all(Builder).expect("openraft storage suite");
}
