//! The resource lifecycle through the store's public interface (cluster version 0.2):
//! the generation the store sets, finalizers and deletion marks, and the collection of
//! what a removed owner owned, step by step as the leader proposes it.

mod common;

use cairn_fsm::lifecycle::{COLLECT_BATCH_MAX, DELETION_TIMESTAMP, FINALIZERS, ORPHAN_FINALIZER};
use cairn_fsm::{Applied, Command, FsmError, LeaseApplied, StoredResource, WatchEventKind};
use cairn_proto::v1::{Id, Resource, Status};
use common::*;

const NOW_MS: u64 = 1_764_410_400_000;
const NOW: &str = "2025-11-29T10:00:00Z";

fn at_0_2() -> Log {
    log_at_0_2(Default::default())
}

fn with_finalizers(mut r: Resource, finalizers: &str) -> Resource {
    r.metadata.insert(FINALIZERS.into(), finalizers.into());
    r
}

fn owned_by(mut r: Resource, owner: &StoredResource) -> Resource {
    r.owner = owner.resource().id.map(Box::new);
    r
}

fn delete(log: &mut Log, stored: &StoredResource, orphan: bool) -> Result<Applied, FsmError> {
    apply(
        log,
        Command::Delete {
            id: stored.resource().id.unwrap(),
            version: stored.version().into(),
            now_ms: NOW_MS,
            orphan,
        },
    )
}

/// Proposes what the leader would until nothing is left to collect; returns the steps.
fn collect_all(log: &mut Log) -> usize {
    let mut steps = 0;
    loop {
        let candidates = log.store.view().collect_candidates(8);
        if candidates.is_empty() {
            return steps;
        }
        for owner in candidates {
            let applied = apply(
                log,
                Command::Collect {
                    owner,
                    now_ms: NOW_MS,
                },
            );
            assert!(matches!(applied, Ok(Applied::Collected { changed }) if changed > 0));
            steps += 1;
        }
        assert!(steps < 10_000, "collection ends");
    }
}

fn stored(log: &Log, id: &Id) -> Option<Resource> {
    log.store.view().read(id).ok().map(|r| r.resource())
}

#[test]
fn the_store_sets_the_generation_when_data_or_metadata_change_and_only_then() {
    let mut log = at_0_2();
    let mut r = resource(id("u1", "web"), "");
    r.generation = "mine".into();
    let created = log.put(r).resource();
    assert_eq!(
        created.generation, created.version,
        "created: its own version"
    );

    let mut same = created.clone();
    same.status.insert("c".into(), Status::default());
    let same = log.put(same).resource();
    assert_eq!(
        same.generation, created.generation,
        "status and version only: kept"
    );

    let mut meta = same.clone();
    meta.metadata.insert("app".into(), "web".into());
    let meta = log.put(meta).resource();
    assert_eq!(meta.generation, meta.version, "metadata changed: moved");

    let mut data = meta.clone();
    data.data.as_mut().unwrap().value = b"other".to_vec().into();
    let data = log.put(data).resource();
    assert_eq!(data.generation, data.version, "data changed: moved");

    // Before 0.2 the generation is stored verbatim.
    let mut old = Log::new();
    let mut r = resource(id("u1", "web"), "");
    r.generation = "mine".into();
    assert_eq!(old.put(r).resource().generation, "mine");
}

#[test]
fn a_delete_marks_a_resource_with_finalizers_and_the_last_finalizer_removes_it() {
    let mut log = at_0_2();
    let web = log.put(with_finalizers(resource(id("u1", "web"), ""), "a b"));
    let mut watch = log
        .store
        .watch(
            filter(services(), tenancy("default", "default"), ""),
            log.index,
        )
        .unwrap();

    let Ok(Applied::Marked(marked)) = delete(&mut log, &web, false) else {
        panic!("a delete of a resource with finalizers marks it")
    };
    let m = marked.resource();
    assert_eq!(
        m.metadata[DELETION_TIMESTAMP], NOW,
        "the leader's time, as RFC 3339"
    );
    assert_eq!(m.version, log.index.to_string());
    assert_eq!(m.generation, m.version, "the mark is a metadata change");
    assert_eq!(stored(&log, &id("u1", "web")), Some(m.clone()), "it stays");

    // Deleting again changes nothing.
    let again = delete(&mut log, &marked, false);
    assert!(
        matches!(&again, Ok(Applied::Marked(r)) if r == &marked),
        "{again:?}"
    );

    // A marked resource may only lose finalizers.
    let refusals = [
        ("data", {
            let mut r = m.clone();
            r.data.as_mut().unwrap().value = b"x".to_vec().into();
            r
        }),
        ("adds", with_finalizers(m.clone(), "a b c")),
        ("metadata other than", {
            let mut r = m.clone();
            r.metadata.remove(DELETION_TIMESTAMP);
            r
        }),
    ];
    for (what, r) in refusals {
        let error = log.write(r).unwrap_err();
        assert!(
            matches!(&error, FsmError::FailedPrecondition(m) if m.contains(what)),
            "{what}: {error}"
        );
    }
    // A status write is allowed while it waits.
    let status = apply(
        &mut log,
        Command::WriteStatus {
            id: id("u1", "web"),
            key: "ctl".into(),
            status: Status::default(),
            version: String::new(),
        },
    );
    let Ok(Applied::Written(with_status)) = status else {
        panic!("{status:?}")
    };
    let one_left = log.put(with_finalizers(with_status.resource(), "b"));
    assert!(
        stored(&log, &id("u1", "web")).is_some(),
        "one finalizer left"
    );
    let mut last = one_left.resource();
    last.metadata.remove(FINALIZERS);
    let Ok(Applied::Written(answer)) = log.write(last) else {
        panic!("removing the last finalizer is a write")
    };
    assert_eq!(answer.version(), log.index.to_string());
    assert_eq!(
        stored(&log, &id("u1", "web")),
        None,
        "the last finalizer removed it"
    );

    let (events, _) = drain(&mut watch);
    let kinds: Vec<_> = events.iter().map(|e| e.kind).collect();
    use WatchEventKind::*;
    assert_eq!(
        kinds,
        [Upsert, Upsert, Upsert, Delete],
        "mark, status, one gone, removed"
    );
    assert_eq!(
        events[3].resource.as_ref(),
        Some(&one_left),
        "the Delete: as last stored"
    );
}

#[test]
fn only_the_store_marks_a_resource() {
    let mut log = at_0_2();
    let mut r = resource(id("u1", "web"), "");
    r.metadata.insert(DELETION_TIMESTAMP.into(), NOW.into());
    let error = log.write(r).unwrap_err();
    assert!(
        error.to_string().contains("metadata.deletionTimestamp"),
        "{error}"
    );
    // A resource without finalizers is removed by a delete, as before.
    let plain = log.put(resource(id("u1", "web"), ""));
    assert!(matches!(
        delete(&mut log, &plain, false),
        Ok(Applied::Deleted { existed: true })
    ));
}

#[test]
fn a_chain_of_owners_three_levels_deep_goes_entirely_and_nothing_else_is_touched() {
    let mut log = at_0_2();
    let root = log.put(resource(id("u-root", "root"), ""));
    let child = log.put(owned_by(resource(id("u-child", "child"), ""), &root));
    let grandchild = log.put(owned_by(resource(id("u-gc", "grandchild"), ""), &child));
    let kept = log.put(finalized_sibling(&child));
    let other_root = log.put(resource(id("u-other", "other-root"), ""));
    let other = log.put(owned_by(
        resource(id("u-o1", "other-child"), ""),
        &other_root,
    ));
    let unrelated = log.put(resource(id("u-x", "unrelated"), ""));
    assert!(
        log.store.view().collect_candidates(8).is_empty(),
        "every owner is stored"
    );

    assert!(matches!(
        delete(&mut log, &root, false),
        Ok(Applied::Deleted { existed: true })
    ));
    assert_eq!(
        collect_all(&mut log),
        2,
        "the child, then the grandchild and its sibling"
    );
    assert_eq!(stored(&log, &id("u-child", "child")), None);
    assert_eq!(stored(&log, &id("u-gc", "grandchild")), None);
    // The grandchild's sibling has a finalizer: marked, kept until it is removed.
    let marked = stored(&log, &id("u-kept", "kept")).expect("a finalizer keeps it");
    assert_eq!(marked.metadata[DELETION_TIMESTAMP], NOW);
    for untouched in [&other_root, &other, &unrelated] {
        let id = untouched.resource().id.unwrap();
        assert_eq!(stored(&log, &id).as_ref(), Some(&untouched.resource()));
    }
    let _ = (grandchild, kept);
}

fn finalized_sibling(owner: &StoredResource) -> Resource {
    with_finalizers(owned_by(resource(id("u-kept", "kept"), ""), owner), "ctl")
}

#[test]
fn collection_goes_in_bounded_steps_and_a_new_lifetime_of_the_owner_stops_it() {
    let mut log = at_0_2();
    let owner = log.put(resource(id("u-1", "owner"), ""));
    let count = COLLECT_BATCH_MAX + 10;
    for i in 0..count {
        log.put(owned_by(
            resource(id(&format!("u-{i}"), &format!("d{i:04}")), ""),
            &owner,
        ));
    }
    delete(&mut log, &owner, false).unwrap();
    let candidate = log.store.view().collect_candidates(8);
    assert_eq!(candidate.len(), 1);
    let step = apply(
        &mut log,
        Command::Collect {
            owner: candidate[0].clone(),
            now_ms: NOW_MS,
        },
    );
    assert!(
        matches!(step, Ok(Applied::Collected { changed }) if changed == COLLECT_BATCH_MAX as u64)
    );
    assert_eq!(log.store.view().len(), 10);
    // The owner's name written again (another lifetime) does not stop the collection of
    // the first lifetime's dependents; the same lifetime stored again would.
    log.put(resource(id("u-2", "owner"), ""));
    assert_eq!(collect_all(&mut log), 1);
    assert_eq!(log.store.view().len(), 1, "only the new owner is left");
    // A collect for an owner that is stored does nothing.
    let step = apply(
        &mut log,
        Command::Collect {
            owner: id("u-2", "owner"),
            now_ms: NOW_MS,
        },
    );
    assert!(matches!(step, Ok(Applied::Collected { changed: 0 })));
}

#[test]
fn an_orphaning_delete_clears_the_dependents_owner_then_removes_the_owner() {
    let mut log = at_0_2();
    let owner = log.put(resource(id("u-1", "owner"), ""));
    let a = log.put(owned_by(resource(id("u-a", "a"), ""), &owner));
    let Ok(Applied::Marked(marked)) = delete(&mut log, &owner, true) else {
        panic!("an owner whose dependents are orphaned is marked first")
    };
    assert!(marked.resource().metadata[FINALIZERS].contains(ORPHAN_FINALIZER));
    assert_eq!(collect_all(&mut log), 1);
    assert_eq!(stored(&log, &id("u-1", "owner")), None, "the owner went");
    let orphan = stored(&log, &id("u-a", "a")).expect("the dependent stays");
    assert_eq!(orphan.owner, None, "without its owner reference");
    assert_eq!(
        orphan.generation,
        a.resource().generation,
        "its data did not change"
    );
    // An orphaning delete of a resource that owns nothing removes it at once.
    let lone = log.put(resource(id("u-l", "lone"), ""));
    assert!(matches!(
        delete(&mut log, &lone, true),
        Ok(Applied::Deleted { existed: true })
    ));
}

#[test]
fn a_restore_or_a_write_naming_an_owner_that_is_gone_is_collected() {
    let mut log = at_0_2();
    let ghost = id("u-ghost", "ghost");
    let mut dependent = resource(id("u-d", "dependent"), "");
    dependent.owner = Some(Box::new(ghost.clone()));
    log.put(dependent.clone());
    let candidates = log.store.view().collect_candidates(8);
    assert_eq!(candidates.len(), 1);
    assert_eq!(candidates[0].uid, "u-ghost");
    assert_eq!(candidates[0].name, "ghost");

    // A snapshot restored into another store brings the same verdict.
    let snapshot = log.store.snapshot();
    let applied = snapshot.applied_index;
    let target = cairn_fsm::Store::new(Default::default());
    let mut restoration = target.restore();
    for r in snapshot {
        restoration.apply(r.resource()).unwrap();
    }
    restoration.commit(applied).unwrap();
    let restored = target.view().collect_candidates(8);
    assert_eq!(restored, candidates);
    assert_eq!(collect_all(&mut log), 1);
    assert!(log.store.view().is_empty());
}

#[test]
fn a_lease_ending_marks_and_detaches_what_has_finalizers() {
    let mut log = at_0_2();
    let Ok(Applied::Lease(LeaseApplied::Granted(lease))) =
        apply(&mut log, Command::LeaseGrant { ttl_ms: 10_000 })
    else {
        panic!("grant")
    };
    let mut kept = with_finalizers(resource(id("u-k", "kept"), ""), "ctl");
    kept.lease = lease.id;
    log.put(kept);
    let mut gone = resource(id("u-g", "gone"), "");
    gone.lease = lease.id;
    log.put(gone);
    let revoked = apply(
        &mut log,
        Command::LeaseRevoke {
            id: lease.id,
            now_ms: NOW_MS,
        },
    );
    assert!(matches!(
        revoked,
        Ok(Applied::Lease(LeaseApplied::Revoked {
            existed: true,
            deleted: 2
        }))
    ));
    assert_eq!(stored(&log, &id("u-g", "gone")), None);
    let kept = stored(&log, &id("u-k", "kept")).expect("a finalizer keeps it");
    assert_eq!(kept.metadata[DELETION_TIMESTAMP], NOW);
    assert_eq!(kept.lease, 0, "detached from the lease that ended");
}
