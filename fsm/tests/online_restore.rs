//! The online restore as it arrives through the log: RestoreBegin, chunks,
//! then RestoreCommit or RestoreAbort. Each test applies the same entries a
//! replica would and checks what readers, watches and later writes see.

mod common;

use cairn_fsm::{Applied, Command, FsmError, Store};
use cairn_proto::v1::Resource;
use common::*;

impl Log {
    fn apply(&mut self, command: Command) -> Result<Applied, FsmError> {
        self.index += 1;
        self.store.apply_owned(self.index, command)
    }
}

fn begin(id: &str, resource_count: u64) -> Command {
    Command::RestoreBegin {
        restore_id: id.into(),
        resource_count,
        leases: vec![],
    }
}

fn chunk(id: &str, resources: Vec<Resource>) -> Command {
    Command::RestoreChunk {
        restore_id: id.into(),
        resources,
    }
}

fn commit(id: &str) -> Command {
    Command::RestoreCommit {
        restore_id: id.into(),
    }
}

fn abort(id: &str) -> Command {
    Command::RestoreAbort {
        restore_id: id.into(),
    }
}

/// A backup's resources: names `b0..`, each with a version from the old cluster.
fn backup(count: usize) -> Vec<Resource> {
    (0..count)
        .map(|i| resource(id("u", &format!("b{i}")), &(100 + i).to_string()))
        .collect()
}

fn all_names(store: &Store) -> Vec<String> {
    let v: Vec<_> = store.view().iter().cloned().collect();
    names(&v)
}

#[test]
fn nothing_is_visible_until_the_commit_which_swaps_everything_at_once() {
    // Readers see the old table through begin and chunks; the commit replaces
    // it whole, stamps every resource with the commit's index, and closes watches.
    let mut log = Log::new();
    let old = log.put(resource(id("u", "old"), ""));
    let mut watch = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    let _ = drain(&mut watch);
    log.apply(begin("r1", 3)).unwrap();
    assert_eq!(
        log.apply(chunk("r1", backup(3)[..2].to_vec())),
        Ok(Applied::RestoreChunkAdded { received: 2 })
    );
    // A write during the restore is applied to the current table, as usual.
    let during = log.put(resource(id("u", "old"), old.version()));
    log.apply(chunk("r1", backup(3)[2..].to_vec())).unwrap();
    assert_eq!(all_names(&log.store), vec!["old"]);
    assert_eq!(log.store.pending_restore().unwrap().received, 3);

    assert_eq!(
        log.apply(commit("r1")),
        Ok(Applied::Restored { resource_count: 3 })
    );
    let commit_index = log.index;
    assert_eq!(all_names(&log.store), vec!["b0", "b1", "b2"]);
    for r in log.store.view().iter() {
        assert_eq!(r.version(), commit_index.to_string());
    }
    assert!(commit_index > during.version().parse::<u64>().unwrap());
    assert_eq!(log.store.pending_restore(), None);
    let (_, closed) = drain(&mut watch);
    assert_eq!(
        closed,
        Some(FsmError::WatchClosed {
            reason: "restore".into()
        })
    );
    // A version handed out before the restore matches nothing after it.
    assert!(matches!(
        log.write(resource(id("u", "b0"), "100")),
        Err(FsmError::CasFailure { .. })
    ));
    let next = log.put(resource(id("u", "b0"), &commit_index.to_string()));
    assert!(next.version().parse::<u64>().unwrap() > commit_index);
}

#[test]
fn an_abort_discards_the_pending_restore_and_abort_after_commit_is_a_no_op() {
    let mut log = Log::new();
    log.put(resource(id("u", "old"), ""));
    log.apply(begin("r1", 2)).unwrap();
    log.apply(chunk("r1", backup(2))).unwrap();
    assert_eq!(
        log.apply(abort("r1")),
        Ok(Applied::RestoreAborted { existed: true })
    );
    assert_eq!(log.store.pending_restore(), None);
    assert_eq!(all_names(&log.store), vec!["old"]);
    // The aborted restore can no longer commit.
    assert!(matches!(
        log.apply(commit("r1")),
        Err(FsmError::RestoreConflict(_))
    ));

    log.apply(begin("r2", 1)).unwrap();
    log.apply(chunk("r2", backup(1))).unwrap();
    log.apply(commit("r2")).unwrap();
    let after_commit = log.store.view();
    assert_eq!(
        log.apply(abort("r2")),
        Ok(Applied::RestoreAborted { existed: false })
    );
    assert_eq!(all_names(&log.store), vec!["b0"]);
    assert_eq!(
        log.store.view().read(&id("u", "b0")).unwrap(),
        after_commit.read(&id("u", "b0")).unwrap()
    );
}

#[test]
fn one_restore_at_a_time_and_commands_for_another_id_change_nothing() {
    let mut log = Log::new();
    log.apply(begin("r1", 1)).unwrap();
    assert!(matches!(
        log.apply(begin("r2", 1)),
        Err(FsmError::RestoreConflict(_))
    ));
    assert!(matches!(
        log.apply(chunk("r2", backup(1))),
        Err(FsmError::RestoreConflict(_))
    ));
    assert!(matches!(
        log.apply(commit("r2")),
        Err(FsmError::RestoreConflict(_))
    ));
    assert_eq!(
        log.apply(abort("r2")),
        Ok(Applied::RestoreAborted { existed: false })
    );
    let pending = log.store.pending_restore().unwrap();
    assert_eq!((pending.restore_id.as_str(), pending.received), ("r1", 0));
    for bad in ["", &"x".repeat(cairn_fsm::RESTORE_ID_BYTES_MAX + 1)] {
        assert!(matches!(
            Log::new().apply(begin(bad, 1)),
            Err(FsmError::InvalidArgument { .. })
        ));
    }
}

#[test]
fn a_bad_resource_or_a_wrong_count_fails_the_commit_and_leaves_the_table_alone() {
    // The commit of a failed or incomplete restore reports why, ends the
    // restore, and changes no resource.
    let cases: Vec<(&str, Vec<Vec<Resource>>, u64)> = vec![
        ("too few", vec![backup(1)], 2),
        ("too many", vec![backup(3)], 2),
        (
            "bad version",
            vec![vec![resource(id("u", "x"), "not-a-number")]],
            1,
        ),
        (
            "duplicate",
            vec![backup(1), vec![resource(id("u", "b0"), "7")]],
            2,
        ),
    ];
    for (case, chunks, count) in cases {
        let mut log = Log::new();
        let kept = log.put(resource(id("u", "kept"), ""));
        let mut watch = log
            .store
            .watch(filter(services(), tenancy("*", "*"), ""), 0)
            .unwrap();
        let _ = drain(&mut watch);
        log.apply(begin("r", count)).unwrap();
        for c in chunks {
            let _ = log.apply(chunk("r", c));
        }
        assert!(
            matches!(
                log.apply(commit("r")),
                Err(FsmError::InvalidArgument { ref field, .. }) if field == "snapshot"
            ),
            "{case}"
        );
        assert_eq!(log.store.pending_restore(), None, "{case}");
        assert_eq!(
            log.store.view().read(&id("u", "kept")).unwrap(),
            kept,
            "{case}"
        );
        assert_eq!(log.store.view().len(), 1, "{case}");
        assert!(drain(&mut watch).1.is_none(), "{case}: watch kept open");
    }
}

#[test]
fn a_snapshot_taken_mid_restore_carries_it_and_a_replica_loaded_from_it_commits_the_same() {
    // A node that restarts from a snapshot taken between chunks must end in
    // the same state as one that saw every entry.
    let mut full = Log::new();
    full.put(resource(id("u", "old"), ""));
    full.apply(begin("r", 3)).unwrap();
    full.apply(chunk("r", backup(3)[..2].to_vec())).unwrap();

    let mut image = full.store.snapshot();
    let pending = image
        .pending
        .take()
        .expect("the snapshot carries the restore");
    assert_eq!(
        (
            pending.restore_id.as_str(),
            pending.resource_count,
            pending.len()
        ),
        ("r", 3, 2)
    );
    let loaded = Store::new(Default::default());
    let mut restoration = loaded.restore();
    let at = image.applied_index;
    for r in image {
        restoration.apply(r.resource()).unwrap();
    }
    restoration
        .begin_pending(
            pending.restore_id.clone(),
            pending.resource_count,
            None,
            &pending.leases,
        )
        .unwrap();
    for r in pending {
        restoration.apply_pending(r.resource()).unwrap();
    }
    restoration.commit(at).unwrap();
    let mut replica = Log {
        store: loaded,
        index: at,
    };
    assert_eq!(
        replica.store.pending_restore(),
        full.store.pending_restore()
    );

    for log in [&mut full, &mut replica] {
        log.apply(chunk("r", backup(3)[2..].to_vec())).unwrap();
        log.apply(commit("r")).unwrap();
    }
    let a: Vec<_> = full.store.view().iter().cloned().collect();
    let b: Vec<_> = replica.store.view().iter().cloned().collect();
    assert_eq!(a, b);
    assert_eq!(names(&a), vec!["b0", "b1", "b2"]);
}

#[test]
fn restore_commands_round_trip_through_the_log_encoding() {
    // What a leader proposes is what every replica decodes.
    for c in [
        begin("r", 2),
        chunk("r", backup(2)),
        commit("r"),
        abort("r"),
    ] {
        assert_eq!(Command::decode(&c.encode()), Ok(c));
    }
}
