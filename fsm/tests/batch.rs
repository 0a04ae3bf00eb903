//! Several writes and deletes in one log entry (`Command::Batch`): each has
//! its own outcome, all share the entry's index as version and revision, and
//! readers and watches see the whole batch at once.

mod common;

use cairn_fsm::{Applied, Command, FsmError};
use common::*;

#[test]
fn a_batch_applies_in_order_with_one_outcome_each_at_one_revision() {
    let mut log = Log::new();
    let d = log.put(resource(id("u", "d"), ""));
    let mut watch = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    let _ = drain(&mut watch);
    let before = log.store.view();
    log.index += 1;
    let index = log.index;
    let applied = log.store.apply_owned(
        index,
        Command::Batch {
            commands: vec![
                Command::Write {
                    resource: resource(id("u", "a"), ""),
                },
                Command::Write {
                    resource: resource(id("u", "b"), ""),
                },
                // The same key twice: the second write's expected version is
                // stale once the first has applied.
                Command::Write {
                    resource: resource(id("u", "a"), ""),
                },
                Command::Delete {
                    id: id("u", "d"),
                    version: d.version().to_string(),
                    now_ms: 0,
                    orphan: false,
                },
            ],
        },
    );
    let Ok(Applied::Batch(results)) = applied else {
        panic!("{applied:?}")
    };
    assert_eq!(results.len(), 4);
    for (i, r) in results[..2].iter().enumerate() {
        match r {
            Ok(Applied::Written(w)) => assert_eq!(w.version(), index.to_string(), "write {i}"),
            other => panic!("write {i}: {other:?}"),
        }
    }
    assert!(matches!(results[2], Err(FsmError::CasFailure { .. })));
    assert_eq!(results[3], Ok(Applied::Deleted { existed: true }));

    assert_eq!(
        names(&log.store.view().iter().cloned().collect::<Vec<_>>()),
        vec!["a", "b"]
    );
    assert_eq!(
        names(&before.iter().cloned().collect::<Vec<_>>()),
        vec!["d"]
    );
    let past = log.store.view_at(index - 1).unwrap();
    assert_eq!(names(&past.iter().cloned().collect::<Vec<_>>()), vec!["d"]);
    let (events, closed) = drain(&mut watch);
    assert!(closed.is_none());
    assert_eq!(events.len(), 3);
    assert!(events.iter().all(|e| e.revision == index));
    // A replay from before the batch sees it whole; from its revision, nothing.
    let mut replay = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), index - 1)
        .unwrap();
    assert_eq!(drain(&mut replay).0.len(), 3);
    let mut after = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), index)
        .unwrap();
    assert!(drain(&mut after).0.is_empty());
    // The next entry gets a greater version.
    let next = log.put(resource(id("u", "a"), &index.to_string()));
    assert_eq!(next.version(), (index + 1).to_string());
}
