//! Engine choice: a data dir remembers the engine that wrote it, and opening it with the
//! other engine is refused with a message that says what to do.

mod common;

use cairn_raft_log::LogError;
use common::LogEngineKind;
use common::Store;

fn write_one_entry(dir: &std::path::Path, engine: LogEngineKind) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let store = Store::open(dir, common::options(engine)).expect("open");
        assert_eq!(store.engine(), engine);
        store
            .append_durable(vec![common::entry(1)])
            .await
            .expect("append");
    });
}

fn data_dir_written_by_one_engine_is_refused_by_the_other(written_by: LogEngineKind) {
    // Write with one engine, open with the other: EngineMismatch naming both and the setting
    // to use; the data is untouched and opens again with the engine that wrote it.
    let other = match written_by {
        LogEngineKind::Wal => LogEngineKind::Sled,
        LogEngineKind::Sled => LogEngineKind::Wal,
    };
    let dir = tempfile::tempdir().expect("tempdir");
    write_one_entry(dir.path(), written_by);
    match Store::open(dir.path(), common::options(other)) {
        Err(error @ LogError::EngineMismatch { .. }) => {
            let message = error.to_string();
            println!("{message}");
            assert!(
                message.contains(&format!("`{written_by}` log engine")),
                "{message}"
            );
            assert!(
                message.contains(&format!("log_engine = \"{written_by}\"")),
                "{message}"
            );
        }
        other => panic!("expected EngineMismatch, got {other:?}"),
    }
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let store = Store::open(dir.path(), common::options(written_by)).expect("reopen");
        let entries = store.read_entries(..).await.expect("read");
        assert_eq!(entries.len(), 1);
    });
}

for_each_engine!(data_dir_written_by_one_engine_is_refused_by_the_other);
