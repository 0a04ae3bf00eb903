//! One test per rule of contract sections 2 and 3 (and the fsm brief): each
//! would fail without its rule.

mod common;

use std::collections::BTreeMap;

use cairn_fsm::{
    Applied, Command, FsmError, Limits, Store, StoredResource, WatchEventKind,
    COMMAND_FORMAT_VERSION,
};
use cairn_proto::error::ApiError;
use cairn_proto::v1::{Id, Status};
use common::*;

// ---------------------------------------------------------------- writes

#[test]
fn a_create_is_stored_with_the_log_index_as_version_and_every_field_verbatim() {
    // Step 4: the stored resource equals the given one except for the version.
    let mut log = Log::new();
    log.noop();
    let mut r = resource(id("u1", "web"), "");
    r.owner = Some(Box::new(id("u0", "parent")));
    r.generation = "g-17".into();
    r.metadata = BTreeMap::from([("team".into(), "a".into())]);
    r.status = BTreeMap::from([(
        "ctrl".into(),
        Status {
            observed_generation: "g-16".into(),
            ..Default::default()
        },
    )]);
    let stored = log.put(r.clone());
    assert_eq!(stored.version(), "2");
    let mut expected = r;
    expected.version = "2".into();
    assert_eq!(stored.resource(), expected);
    assert_eq!(log.store.view().read(&id("u1", "web")).unwrap(), stored);
}

#[test]
fn a_non_empty_expected_version_with_nothing_stored_is_a_cas_failure() {
    // Step 1: "version given but nothing stored".
    let mut log = Log::new();
    let err = log.write(resource(id("u1", "web"), "1")).unwrap_err();
    assert_eq!(
        err,
        FsmError::CasFailure {
            expected: "1".into(),
            stored: None
        }
    );
    assert!(log.store.view().is_empty());
}

#[test]
fn a_write_with_a_different_uid_is_wrong_uid_even_when_empty() {
    // Step 2: a different uid, an empty one included, is WrongUid.
    let mut log = Log::new();
    let v = log.put(resource(id("u1", "web"), "")).version().to_string();
    for uid in ["u2", ""] {
        let err = log.write(resource(id(uid, "web"), &v)).unwrap_err();
        assert!(matches!(err, FsmError::WrongUid { .. }), "{uid:?}: {err:?}");
    }
    // A stored empty uid is different from a given non-empty one too.
    let v = log.put(resource(id("", "db"), "")).version().to_string();
    assert!(matches!(
        log.write(resource(id("u9", "db"), &v)),
        Err(FsmError::WrongUid { .. })
    ));
}

#[test]
fn the_uid_is_checked_before_the_version() {
    // Step 2 precedes step 3: wrong uid and wrong version gives WrongUid.
    let mut log = Log::new();
    log.put(resource(id("u1", "web"), ""));
    assert!(matches!(
        log.write(resource(id("u2", "web"), "999")),
        Err(FsmError::WrongUid { .. })
    ));
    // Step 1 precedes step 2 only when nothing is stored: CasFailure there.
    assert!(matches!(
        log.write(resource(id("u2", "other"), "999")),
        Err(FsmError::CasFailure { stored: None, .. })
    ));
}

#[test]
fn a_stale_or_empty_expected_version_with_something_stored_is_a_cas_failure() {
    // Step 3: stored version != expected (empty included) -> CasFailure.
    let mut log = Log::new();
    let first = log.put(resource(id("u1", "web"), ""));
    let second = log.put(resource(id("u1", "web"), first.version()));
    assert_eq!(second.version(), "2");
    for expected in [first.version(), ""] {
        let err = log.write(resource(id("u1", "web"), expected)).unwrap_err();
        assert_eq!(
            err,
            FsmError::CasFailure {
                expected: expected.into(),
                stored: Some("2".into())
            }
        );
    }
    assert_eq!(log.store.view().read(&id("u1", "web")).unwrap(), second);
}

#[test]
fn a_failed_write_advances_the_applied_index_and_changes_nothing() {
    // Outcomes are per entry: the index moves, the table and watches do not.
    let mut log = Log::new();
    let mut watch = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    let _ = drain(&mut watch);
    let _ = log.write(resource(id("u1", "web"), "5"));
    assert_eq!(log.store.applied_index(), 1);
    assert_eq!(log.store.view().revision(), 1);
    assert!(log.store.view().is_empty());
    assert!(drain(&mut watch).0.is_empty());
}

#[test]
fn writes_ignore_the_group_version() {
    // A write at another group version updates the one stored resource of the key.
    let mut log = Log::new();
    let v1 = log.put(resource(id("u1", "web"), ""));
    let v2_id = full_id(
        "u1",
        "web",
        ty("catalog", "v2", "Service"),
        tenancy("default", "default"),
    );
    let v2 = log.put(resource(v2_id.clone(), v1.version()));
    assert_eq!(log.store.view().len(), 1);
    assert_eq!(log.store.view().read(&v2_id).unwrap(), v2);
}

#[test]
fn invalid_commands_are_rejected_deterministically_without_panicking() {
    // A malformed command from the log is InvalidArgument and advances the index.
    let mut log = Log::new();
    let err = log.write(resource(Id::default(), "")).unwrap_err();
    assert!(matches!(err, FsmError::InvalidArgument { .. }));
    let err = log.delete(Id::default(), "").unwrap_err();
    assert!(matches!(err, FsmError::InvalidArgument { .. }));
    assert_eq!(log.store.applied_index(), 2);
}

#[test]
fn apply_owned_stores_the_same_as_apply() {
    // The by-value entry point follows the same rules.
    let a = Store::new(Limits::default());
    let b = Store::new(Limits::default());
    let r = resource(id("u1", "web"), "");
    let x = a
        .apply(
            1,
            &Command::Write {
                resource: r.clone(),
            },
        )
        .unwrap();
    let y = b.apply_owned(1, Command::Write { resource: r }).unwrap();
    assert_eq!(x, y);
    assert_eq!(
        b.apply_owned(
            2,
            Command::Delete {
                id: id("u1", "web"),
                version: "1".into(),
                now_ms: 0,
                orphan: false,
            }
        ),
        Ok(Applied::Deleted { existed: true })
    );
}

#[test]
#[should_panic(expected = "applied after index")]
fn applying_an_index_at_or_below_the_applied_index_panics() {
    // Versions strictly increase: a repeated index is a caller bug.
    let store = Store::new(Limits::default());
    store.apply_noop(3);
    store.apply_noop(3);
}

// ---------------------------------------------------------------- deletes

#[test]
fn deleting_nothing_succeeds_without_an_event() {
    // Idempotent delete: nothing stored -> Ok(existed=false), no event.
    let mut log = Log::new();
    let mut watch = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    let _ = drain(&mut watch);
    assert_eq!(
        log.delete(id("u1", "web"), "7"),
        Ok(Applied::Deleted { existed: false })
    );
    assert!(drain(&mut watch).0.is_empty());
}

#[test]
fn deleting_another_lifetime_succeeds_deletes_nothing_and_emits_nothing() {
    // Stored uid != id.uid (empty included) -> success, nothing deleted, no event.
    let mut log = Log::new();
    let stored = log.put(resource(id("u1", "web"), ""));
    let mut watch = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    let _ = drain(&mut watch);
    for uid in ["u2", ""] {
        assert_eq!(
            log.delete(id(uid, "web"), stored.version()),
            Ok(Applied::Deleted { existed: false })
        );
    }
    assert_eq!(log.store.view().read(&id("u1", "web")).unwrap(), stored);
    assert!(drain(&mut watch).0.is_empty());
}

#[test]
fn deleting_with_another_version_is_a_cas_failure_even_when_empty() {
    // Stored version != version (empty included) -> CasFailure.
    let mut log = Log::new();
    let stored = log.put(resource(id("u1", "web"), ""));
    for version in ["99", ""] {
        assert!(matches!(
            log.delete(id("u1", "web"), version),
            Err(FsmError::CasFailure { .. })
        ));
    }
    assert_eq!(log.store.view().read(&id("u1", "web")).unwrap(), stored);
}

#[test]
fn a_delete_removes_and_emits_the_resource_as_last_stored() {
    // The Delete event carries the last stored resource, at the delete's revision.
    let mut log = Log::new();
    let first = log.put(resource(id("u1", "web"), ""));
    let last = log.put(resource(id("u1", "web"), first.version()));
    let mut watch = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    let _ = drain(&mut watch);
    assert_eq!(
        log.delete(id("u1", "web"), last.version()),
        Ok(Applied::Deleted { existed: true })
    );
    let (events, closed) = drain(&mut watch);
    assert!(closed.is_none());
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, WatchEventKind::Delete);
    assert_eq!(events[0].resource.as_ref(), Some(&last));
    assert_eq!(events[0].revision, 3);
    assert_eq!(
        log.store.view().read(&id("u1", "web")),
        Err(FsmError::NotFound)
    );
}

#[test]
fn deletes_ignore_the_group_version() {
    // A delete naming another group version still deletes.
    let mut log = Log::new();
    let stored = log.put(resource(id("u1", "web"), ""));
    let other = full_id(
        "u1",
        "web",
        ty("catalog", "v9", "Service"),
        tenancy("default", "default"),
    );
    assert_eq!(
        log.delete(other, stored.version()),
        Ok(Applied::Deleted { existed: true })
    );
}

// ---------------------------------------------------------------- reads

#[test]
fn reading_nothing_is_not_found() {
    // Nothing stored -> NotFound.
    let log = Log::new();
    assert_eq!(
        log.store.view().read(&id("", "web")),
        Err(FsmError::NotFound)
    );
}

#[test]
fn a_non_empty_uid_that_differs_is_not_found_and_an_empty_uid_matches_any() {
    // Read uid rule.
    let mut log = Log::new();
    let stored = log.put(resource(id("u1", "web"), ""));
    let view = log.store.view();
    assert_eq!(view.read(&id("u2", "web")), Err(FsmError::NotFound));
    assert_eq!(view.read(&id("", "web")), Ok(stored.clone()));
    assert_eq!(view.read(&id("u1", "web")), Ok(stored));
}

#[test]
fn a_read_at_another_group_version_carries_the_stored_resource_after_the_uid_check() {
    // GroupVersionMismatch with requested type and stored resource; uid first.
    let mut log = Log::new();
    let stored = log.put(resource(id("u1", "web"), ""));
    let v2 = full_id(
        "u1",
        "web",
        ty("catalog", "v2", "Service"),
        tenancy("default", "default"),
    );
    assert_eq!(
        log.store.view().read(&v2),
        Err(FsmError::GroupVersionMismatch {
            requested: ty("catalog", "v2", "Service"),
            stored: stored.clone(),
        })
    );
    let mut v2_other_uid = v2;
    v2_other_uid.uid = "u2".into();
    assert_eq!(
        log.store.view().read(&v2_other_uid),
        Err(FsmError::NotFound)
    );
}

// ---------------------------------------------------------------- lists

fn populate_tenancies(log: &mut Log) {
    for (p, ns, name) in [
        ("default", "default", "api"),
        ("default", "default", "apple"),
        ("default", "default", "Api"),
        ("default", "team", "api"),
        ("other", "default", "api"),
        ("", "", "api"),
        ("", "team", "web"),
    ] {
        log.put(resource(full_id("u", name, services(), tenancy(p, ns)), ""));
    }
    // Same names under other kinds and groups never match.
    log.put(resource(
        full_id(
            "u",
            "api",
            ty("catalog", "v1", "Node"),
            tenancy("default", "default"),
        ),
        "",
    ));
    log.put(resource(
        full_id(
            "u",
            "api",
            ty("mesh", "v1", "Service"),
            tenancy("default", "default"),
        ),
        "",
    ));
}

fn tenancies(resources: &[StoredResource]) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = resources
        .iter()
        .map(|r| {
            let h = r.head();
            (
                h.partition().to_string(),
                h.namespace().to_string(),
                h.name.to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_list_matches_group_and_kind_at_any_group_version() {
    // Only group+kind count; a v2 resource is listed under a v1 query.
    let mut log = Log::new();
    populate_tenancies(&mut log);
    log.put(resource(
        full_id(
            "u",
            "zeta",
            ty("catalog", "v2", "Service"),
            tenancy("default", "default"),
        ),
        "",
    ));
    let listed = log.store.view().list(
        &ty("catalog", "v-anything", "Service"),
        &tenancy("*", "*"),
        "",
    );
    assert_eq!(listed.len(), 8);
    assert!(listed
        .iter()
        .all(|r| r.head().kind() == "Service" && r.head().group() == "catalog"));
}

#[test]
fn list_tenancy_fields_match_by_star_or_equality_including_empty() {
    // "*" matches any value; "" matches only "".
    let mut log = Log::new();
    populate_tenancies(&mut log);
    let view = log.store.view();
    let s = |p: &str, n: &str| tenancies(&view.list(&services(), &tenancy(p, n), ""));
    let t = |p: &str, n: &str, name: &str| (p.to_string(), n.to_string(), name.to_string());
    assert_eq!(s("", ""), vec![t("", "", "api")]);
    assert_eq!(s("", "*"), vec![t("", "", "api"), t("", "team", "web")]);
    assert_eq!(
        s("*", "team"),
        vec![t("", "team", "web"), t("default", "team", "api")]
    );
    assert_eq!(
        s("default", "*"),
        vec![
            t("default", "default", "Api"),
            t("default", "default", "api"),
            t("default", "default", "apple"),
            t("default", "team", "api")
        ]
    );
    assert_eq!(s("*", "*").len(), 7);
    assert!(s("nope", "*").is_empty());
}

#[test]
fn list_name_prefix_is_case_sensitive_and_empty_means_all() {
    // starts_with on the name, case-sensitive.
    let mut log = Log::new();
    populate_tenancies(&mut log);
    let view = log.store.view();
    let ten = tenancy("default", "default");
    assert_eq!(
        names(&view.list(&services(), &ten, "ap")),
        vec!["api", "apple"]
    );
    assert_eq!(names(&view.list(&services(), &ten, "A")), vec!["Api"]);
    assert_eq!(
        names(&view.list(&services(), &ten, "")),
        vec!["Api", "api", "apple"]
    );
    assert_eq!(
        names(&view.list(&services(), &tenancy("*", "*"), "api")).len(),
        4
    );
    assert!(view.list(&services(), &ten, "zz").is_empty());
}

// ---------------------------------------------------------------- owners

#[test]
fn list_by_owner_matches_the_owner_uid_and_ignores_its_group_version() {
    // Owner equality on group, kind, tenancy, name and uid; group version ignored.
    let mut log = Log::new();
    let owner = id("o1", "parent");
    let mut child = resource(id("c1", "child"), "");
    child.owner = Some(Box::new(owner.clone()));
    log.put(child);
    let mut other_lifetime = resource(id("c2", "child2"), "");
    other_lifetime.owner = Some(Box::new(id("o0", "parent")));
    log.put(other_lifetime);
    let view = log.store.view();
    assert_eq!(names(&view.list_by_owner(&owner)), vec!["child"]);
    let mut owner_v9 = owner.clone();
    owner_v9.r#type = Some(ty("catalog", "v9", "Service"));
    assert_eq!(names(&view.list_by_owner(&owner_v9)), vec!["child"]);
    assert!(view.list_by_owner(&id("o2", "parent")).is_empty());
    assert!(view.list_by_owner(&id("", "parent")).is_empty());
}

#[test]
fn deleting_the_owner_leaves_owned_resources_and_deleting_an_owned_one_removes_it() {
    // No cascade; the owner index follows deletes and re-parenting.
    let mut log = Log::new();
    let owner = log.put(resource(id("o1", "parent"), ""));
    let owner_id = id("o1", "parent");
    let mut a = resource(id("a", "a"), "");
    a.owner = Some(Box::new(owner_id.clone()));
    let a = log.put(a);
    let mut b = resource(id("b", "b"), "");
    b.owner = Some(Box::new(owner_id.clone()));
    let b = log.put(b);
    log.delete(owner_id.clone(), owner.version()).unwrap();
    let view = log.store.view();
    assert_eq!(names(&view.list_by_owner(&owner_id)), vec!["a", "b"]);
    assert_eq!(view.read(&id("a", "a")).unwrap(), a);
    log.delete(id("b", "b"), b.version()).unwrap();
    assert_eq!(names(&log.store.view().list_by_owner(&owner_id)), vec!["a"]);
    // Re-parenting a to another owner moves it in the index.
    let mut a2 = a.resource();
    a2.owner = Some(Box::new(id("o9", "other")));
    log.put(a2);
    assert!(log.store.view().list_by_owner(&owner_id).is_empty());
    assert_eq!(
        names(&log.store.view().list_by_owner(&id("o9", "other"))),
        vec!["a"]
    );
}

// ---------------------------------------------------------------- watches

#[test]
fn a_watch_yields_the_matching_snapshot_then_end_of_snapshot_then_live_events() {
    // Snapshot Upserts at the view revision, one EndOfSnapshot, then live events.
    let mut log = Log::new();
    log.put(resource(id("u", "a"), ""));
    log.put(resource(id("u", "b"), ""));
    log.put(resource(
        full_id(
            "u",
            "c",
            ty("catalog", "v1", "Node"),
            tenancy("default", "default"),
        ),
        "",
    ));
    let mut watch = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    log.put(resource(id("u", "d"), ""));
    let (events, closed) = drain(&mut watch);
    assert!(closed.is_none());
    assert_eq!(
        summary(&events),
        vec![
            (WatchEventKind::Upsert, "a".into(), "1".into(), 3),
            (WatchEventKind::Upsert, "b".into(), "2".into(), 3),
            (
                WatchEventKind::EndOfSnapshot,
                String::new(),
                String::new(),
                3
            ),
            (WatchEventKind::Upsert, "d".into(), "4".into(), 4),
        ]
    );
}

#[test]
fn a_watch_on_nothing_matching_yields_end_of_snapshot_first() {
    // Empty store, and a store with only non-matching resources: EndOfSnapshot first.
    let mut log = Log::new();
    let mut watch = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    let first = watch.try_next().unwrap().unwrap();
    assert_eq!(first.kind, WatchEventKind::EndOfSnapshot);
    assert_eq!(first.revision, 0);
    assert_eq!(watch.try_next(), Ok(None));
    log.put(resource(id("u", "zzz"), ""));
    let mut narrow = log
        .store
        .watch(filter(services(), tenancy("*", "*"), "a"), 0)
        .unwrap();
    let first = narrow.try_next().unwrap().unwrap();
    assert_eq!(first.kind, WatchEventKind::EndOfSnapshot);
    assert_eq!(first.revision, 1);
}

#[test]
fn live_events_follow_commit_order_and_skip_non_matching_and_no_op_changes() {
    // Only matching committed changes, in order; no-op deletes and CAS failures emit nothing.
    let mut log = Log::new();
    let mut watch = log
        .store
        .watch(filter(services(), tenancy("default", "*"), "w"), 0)
        .unwrap();
    let w1 = log.put(resource(id("u", "web"), ""));
    log.put(resource(id("u", "api"), ""));
    log.put(resource(
        full_id("u", "web", services(), tenancy("other", "default")),
        "",
    ));
    let _ = log.write(resource(id("u", "web"), "999"));
    log.delete(id("u", "nothing"), "1").unwrap();
    log.delete(id("other-uid", "web"), w1.version()).unwrap();
    let w2 = log.put(resource(id("u", "web"), w1.version()));
    log.delete(id("u", "web"), w2.version()).unwrap();
    let (events, closed) = drain(&mut watch);
    assert!(closed.is_none());
    assert_eq!(
        summary(&events),
        vec![
            (
                WatchEventKind::EndOfSnapshot,
                String::new(),
                String::new(),
                0
            ),
            (WatchEventKind::Upsert, "web".into(), "1".into(), 1),
            (WatchEventKind::Upsert, "web".into(), "7".into(), 7),
            (WatchEventKind::Delete, "web".into(), "7".into(), 8),
        ]
    );
}

#[test]
fn an_event_describes_state_readers_can_already_see() {
    // Contract 3.4: a read right after receiving an event returns its resource.
    let store = Store::new(Limits::default());
    let mut watch = store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    assert_eq!(
        watch.next_blocking().unwrap().kind,
        WatchEventKind::EndOfSnapshot
    );
    let writer = {
        let store = store.clone();
        std::thread::spawn(move || {
            let mut version = String::new();
            for index in 1..=200u64 {
                let r = resource(id("u", "web"), &version);
                match store.apply(index, &Command::Write { resource: r }) {
                    Ok(Applied::Written(r)) => version = r.version().to_string(),
                    other => panic!("{other:?}"),
                }
            }
        })
    };
    for _ in 0..200 {
        let event = watch.next_blocking().unwrap();
        let seen = store.view().read(&id("u", "web")).unwrap();
        assert!(seen.version().parse::<u64>().unwrap() >= event.revision);
    }
    writer.join().unwrap();
}

#[test]
fn a_write_racing_the_watch_creation_is_delivered_exactly_once() {
    // Snapshot + live events equal the final state, with contiguous revisions.
    for round in 0..20 {
        let store = Store::new(Limits::default());
        let writer = {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut versions = vec![String::new(); 8];
                for index in 1..=400u64 {
                    let slot = (index % 8) as usize;
                    let r = resource(id("u", &format!("n{slot}")), &versions[slot]);
                    match store.apply(index, &Command::Write { resource: r }) {
                        Ok(Applied::Written(r)) => versions[slot] = r.version().to_string(),
                        other => panic!("{other:?}"),
                    }
                }
            })
        };
        std::thread::sleep(std::time::Duration::from_micros(50 * round));
        let mut watch = store
            .watch(filter(services(), tenancy("*", "*"), ""), 0)
            .unwrap();
        writer.join().unwrap();
        let (events, closed) = drain(&mut watch);
        assert!(closed.is_none());
        let eos = events
            .iter()
            .position(|e| e.kind == WatchEventKind::EndOfSnapshot)
            .unwrap();
        let snapshot_revision = events[eos].revision;
        let mut state: BTreeMap<String, String> = BTreeMap::new();
        for e in &events[..eos] {
            let r = e.resource.as_ref().unwrap();
            assert!(r.version().parse::<u64>().unwrap() <= snapshot_revision);
            state.insert(r.head().name.to_string(), r.version().to_string());
        }
        let live: Vec<u64> = events[eos + 1..].iter().map(|e| e.revision).collect();
        let expected: Vec<u64> = (snapshot_revision + 1..=400).collect();
        assert_eq!(live, expected, "no gap, no duplicate");
        for e in &events[eos + 1..] {
            let r = e.resource.as_ref().unwrap();
            state.insert(r.head().name.to_string(), r.version().to_string());
        }
        let final_state: BTreeMap<String, String> = store
            .view()
            .iter()
            .map(|r| (r.head().name.to_string(), r.version().to_string()))
            .collect();
        assert_eq!(state, final_state);
    }
}

#[test]
fn a_lagging_watch_is_closed_after_delivering_everything_it_buffered() {
    // A full buffer closes the watch: buffered events, then WatchClosed("lagging"), never a skip.
    let mut log = Log::with_limits(Limits {
        watch_buffer_events: 3,
        ..Limits::default()
    });
    let mut watch = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    for i in 0..5 {
        log.put(resource(id("u", &format!("n{i}")), ""));
    }
    assert_eq!(
        log.store.watch_count(),
        0,
        "closed watches leave the registry"
    );
    let (events, closed) = drain(&mut watch);
    let revisions: Vec<u64> = events.iter().map(|e| e.revision).collect();
    assert_eq!(revisions, vec![0, 1, 2, 3]);
    assert_eq!(
        closed,
        Some(FsmError::WatchClosed {
            reason: "lagging".into()
        })
    );
    // Closed stays closed.
    assert!(matches!(
        watch.try_next(),
        Err(FsmError::WatchClosed { .. })
    ));
    assert!(matches!(
        watch.next_blocking(),
        Err(FsmError::WatchClosed { .. })
    ));
}

#[test]
fn a_watch_over_its_unread_byte_budget_is_closed_after_what_it_buffered() {
    // A watch that does not read holds at most watch_buffer_bytes_max of
    // events (a resource's encoded size + 64 each): the event that would go
    // over closes it as lagging, naming the limit, after delivering the two
    // it holds. A watch that keeps up, on the same store, stays open and sees
    // every event; reading or dropping gives every byte back.
    let mut probe = Log::new();
    let mut big = resource(id("u", "n0"), "");
    big.metadata.insert("pad".into(), "x".repeat(1000));
    let event_bytes = probe.put(big.clone()).encoded().len() + 64;
    let mut log = Log::with_limits(Limits {
        watch_buffer_bytes_max: 2 * event_bytes + event_bytes / 2,
        ..Limits::default()
    });
    let mut idle = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    let mut reader = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    let mut read_live = 0;
    for i in 0..3 {
        let mut r = big.clone();
        r.id.as_mut().unwrap().name = format!("n{i}");
        log.put(r);
        let (events, closed) = drain(&mut reader);
        assert_eq!(closed, None, "the watch that keeps up stays open");
        read_live += events.iter().filter(|e| e.revision > 0).count();
    }
    assert_eq!(read_live, 3);
    assert_eq!(
        log.store.watch_count(),
        1,
        "the idle watch left the registry"
    );
    let (events, closed) = drain(&mut idle);
    let live: Vec<u64> = events
        .iter()
        .map(|e| e.revision)
        .filter(|r| *r > 0)
        .collect();
    assert_eq!(live, vec![1, 2]);
    match closed {
        Some(FsmError::WatchClosed { reason }) => {
            assert!(reason.starts_with("lagging"), "{reason}");
            assert!(reason.contains("watch_buffer_bytes_max"), "{reason}");
        }
        other => panic!("expected WatchClosed, got {other:?}"),
    }
    assert_eq!(log.store.watch_unread_bytes(), 0);
}

#[test]
fn the_unread_bytes_of_all_watches_are_bounded_on_the_store() {
    // watch_buffers_bytes_max bounds the unread events of every watch
    // together: with room for three events, the fourth watch's event closes
    // that watch (naming the limit); the three others keep theirs. Dropping
    // watches gives their bytes back, and a new watch is served again.
    let mut probe = Log::new();
    let r0 = resource(id("u", "n0"), "");
    let event_bytes = probe.put(r0.clone()).encoded().len() + 64;
    let mut log = Log::with_limits(Limits {
        watch_buffers_bytes_max: 3 * event_bytes + event_bytes / 2,
        ..Limits::default()
    });
    let mut watches: Vec<_> = (0..4)
        .map(|_| {
            let mut w = log
                .store
                .watch(filter(services(), tenancy("*", "*"), ""), 0)
                .unwrap();
            drain(&mut w); // the snapshot and its end: nothing buffered
            w
        })
        .collect();
    log.put(r0.clone());
    assert_eq!(log.store.watch_count(), 3);
    assert_eq!(log.store.watch_unread_bytes(), 3 * event_bytes);
    let (events, closed) = drain(&mut watches[3]);
    assert!(events.is_empty());
    match closed {
        Some(FsmError::WatchClosed { reason }) => {
            assert!(reason.contains("watch_buffers_bytes_max"), "{reason}")
        }
        other => panic!("expected WatchClosed, got {other:?}"),
    }
    for w in &mut watches[..3] {
        let (events, closed) = drain(w);
        assert_eq!((events.len(), closed), (1, None));
    }
    drop(watches);
    assert_eq!(log.store.watch_unread_bytes(), 0);
    let mut again = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    drain(&mut again);
    let mut r1 = r0.clone();
    r1.id.as_mut().unwrap().name = "n1".into();
    log.put(r1);
    let (events, closed) = drain(&mut again);
    assert_eq!((events.len(), closed), (1, None));
}

#[test]
fn dropping_a_watch_releases_its_registration() {
    // The registry count goes back to 0 when every watch is dropped.
    let mut log = Log::new();
    let a = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    let b = log
        .store
        .watch(filter(services(), tenancy("x", "*"), "p"), 0)
        .unwrap();
    let c = log
        .store
        .watch(filter(ty("g", "v", "k"), tenancy("*", "*"), ""), 0)
        .unwrap();
    assert_eq!(log.store.watch_count(), 3);
    drop(b);
    assert_eq!(log.store.watch_count(), 2);
    log.put(resource(id("u", "a"), ""));
    drop(a);
    drop(c);
    assert_eq!(log.store.watch_count(), 0);
    // Dropping a watch after its store is gone is fine too.
    let d = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    drop(log);
    drop(d);
}

#[test]
fn a_watch_on_a_dropped_store_closes_with_shutdown() {
    // The consumer drains, then learns the store is gone.
    let mut log = Log::new();
    let mut watch = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    log.put(resource(id("u", "a"), ""));
    drop(log);
    let (events, closed) = drain(&mut watch);
    assert_eq!(events.len(), 2);
    assert_eq!(
        closed,
        Some(FsmError::WatchClosed {
            reason: "shutdown".into()
        })
    );
}

#[test]
fn a_watch_from_a_revision_replays_matching_changes_then_goes_live() {
    // No snapshot and no EndOfSnapshot: the changes after r, then live events.
    let mut log = Log::new();
    let a = log.put(resource(id("u", "a"), ""));
    log.put(resource(id("u", "b"), ""));
    log.put(resource(
        full_id("u", "c", ty("g", "v", "k"), tenancy("default", "default")),
        "",
    ));
    let a2 = log.put(resource(id("u", "a"), a.version()));
    log.delete(id("u", "a"), a2.version()).unwrap();
    let mut watch = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 1)
        .unwrap();
    log.put(resource(id("u", "e"), ""));
    let (events, closed) = drain(&mut watch);
    assert!(closed.is_none());
    assert_eq!(
        summary(&events),
        vec![
            (WatchEventKind::Upsert, "b".into(), "2".into(), 2),
            (WatchEventKind::Upsert, "a".into(), "4".into(), 4),
            (WatchEventKind::Delete, "a".into(), "4".into(), 5),
            (WatchEventKind::Upsert, "e".into(), "6".into(), 6),
        ]
    );
    // From the latest revision: only live events.
    let mut from_now = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 6)
        .unwrap();
    assert_eq!(from_now.try_next(), Ok(None));
    // From a revision not applied yet: events up to it are skipped.
    let mut ahead = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 8)
        .unwrap();
    log.put(resource(id("u", "f"), ""));
    log.put(resource(id("u", "g"), ""));
    log.put(resource(id("u", "h"), ""));
    assert_eq!(
        drain(&mut ahead)
            .0
            .iter()
            .map(|e| e.revision)
            .collect::<Vec<_>>(),
        vec![9]
    );
    assert_eq!(drain(&mut from_now).0.len(), 3);
}

#[test]
fn a_watch_or_read_from_before_the_retained_history_is_compacted() {
    // Older than the oldest retained revision -> Compacted with that revision.
    let mut log = Log::with_limits(Limits {
        history_changes_max: 2,
        ..Limits::default()
    });
    for i in 0..5 {
        log.put(resource(id("u", &format!("n{i}")), ""));
    }
    assert_eq!(log.store.oldest_retained_revision(), 3);
    let compacted = Err(FsmError::Compacted {
        oldest_retained_revision: 3,
    });
    assert_eq!(
        log.store.view_at(2).map(|v| v.revision()),
        compacted.clone()
    );
    assert_eq!(
        log.store
            .watch(filter(services(), tenancy("*", "*"), ""), 2)
            .map(|_| ()),
        compacted.map(|_: u64| ())
    );
    assert_eq!(log.store.view_at(3).unwrap().len(), 3);
    let mut watch = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 3)
        .unwrap();
    assert_eq!(
        drain(&mut watch)
            .0
            .iter()
            .map(|e| e.revision)
            .collect::<Vec<_>>(),
        vec![4, 5]
    );
    assert!(matches!(
        log.store.view_at(6),
        Err(FsmError::InvalidArgument { .. })
    ));
}

#[test]
fn reads_and_lists_at_a_past_revision_see_that_revision() {
    // view_at(r) is the table as it was right after entry r.
    let mut log = Log::new();
    let a1 = log.put(resource(id("u", "a"), ""));
    let mut b = resource(id("u", "b"), "");
    b.owner = Some(Box::new(id("o", "owner")));
    let b1 = log.put(b);
    let a2 = log.put(resource(id("u", "a"), a1.version()));
    log.delete(id("u", "b"), b1.version()).unwrap();
    log.noop();
    let at = |r: u64| log.store.view_at(r).unwrap();
    assert_eq!(at(1).read(&id("u", "a")).unwrap(), a1);
    assert_eq!(at(1).read(&id("u", "b")), Err(FsmError::NotFound));
    assert_eq!(at(2).read(&id("u", "b")).unwrap(), b1);
    assert_eq!(names(&at(2).list_by_owner(&id("o", "owner"))), vec!["b"]);
    assert_eq!(at(3).read(&id("u", "a")).unwrap(), a2);
    assert_eq!(
        names(&at(3).list(&services(), &tenancy("*", "*"), "")),
        vec!["a", "b"]
    );
    assert_eq!(
        names(&at(4).list(&services(), &tenancy("*", "*"), "")),
        vec!["a"]
    );
    assert!(at(4).list_by_owner(&id("o", "owner")).is_empty());
    assert_eq!(at(4).revision(), 4);
    assert_eq!(at(0).revision(), 5);
    assert_eq!(at(5).len(), 1);
}

#[test]
fn the_async_next_waits_for_a_live_event() {
    // Watch::next works on a runtime and wakes when a write is applied.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let store = Store::new(Limits::default());
    let mut watch = store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    let writer = {
        let store = store.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            store
                .apply(
                    1,
                    &Command::Write {
                        resource: resource(id("u", "a"), ""),
                    },
                )
                .unwrap();
        })
    };
    runtime.block_on(async {
        assert_eq!(
            watch.next().await.unwrap().kind,
            WatchEventKind::EndOfSnapshot
        );
        let e = watch.next().await.unwrap();
        assert_eq!((e.kind, e.revision), (WatchEventKind::Upsert, 1));
    });
    writer.join().unwrap();
}

// ---------------------------------------------------------------- snapshot and restore

#[test]
fn a_snapshot_is_a_point_in_time_while_writes_go_on() {
    // Writes after taking the snapshot are not in it.
    let mut log = Log::new();
    let a = log.put(resource(id("u", "a"), ""));
    log.put(resource(id("u", "b"), ""));
    let snapshot = log.store.snapshot();
    log.put(resource(id("u", "a"), a.version()));
    log.put(resource(id("u", "c"), ""));
    assert_eq!(snapshot.applied_index, 2);
    assert_eq!(snapshot.format_version, cairn_fsm::SNAPSHOT_FORMAT_VERSION);
    assert_eq!(snapshot.len(), 2);
    let versions: Vec<String> = snapshot.map(|r| r.version().to_string()).collect();
    assert_eq!(versions, vec!["1", "2"]);
}

fn restore_from(source: &Store, target: &Store, applied_index: u64) {
    let mut restoration = target.restore();
    for r in source.snapshot() {
        restoration.apply(r.resource()).unwrap();
    }
    restoration.commit(applied_index).unwrap();
}

#[test]
fn a_restore_swaps_the_table_and_closes_every_watch() {
    // Every open watch gets WatchClosed("restore"); new watches see the restored state.
    let mut source = Log::new();
    source.put(resource(id("u", "x"), ""));
    source.put(resource(id("u", "y"), ""));
    let mut target = Log::new();
    target.put(resource(id("u", "old"), ""));
    let mut w1 = target
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    let mut w2 = target
        .store
        .watch(filter(ty("g", "v", "k"), tenancy("*", "*"), ""), 1)
        .unwrap();
    restore_from(&source.store, &target.store, 2);
    assert_eq!(target.store.watch_count(), 0);
    for w in [&mut w1, &mut w2] {
        let (_, closed) = drain(w);
        assert_eq!(
            closed,
            Some(FsmError::WatchClosed {
                reason: "restore".into()
            })
        );
    }
    assert_eq!(target.store.applied_index(), 2);
    assert_eq!(target.store.oldest_retained_revision(), 2);
    let mut fresh = target
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    let (events, _) = drain(&mut fresh);
    assert_eq!(
        summary(&events),
        vec![
            (WatchEventKind::Upsert, "x".into(), "1".into(), 2),
            (WatchEventKind::Upsert, "y".into(), "2".into(), 2),
            (
                WatchEventKind::EndOfSnapshot,
                String::new(),
                String::new(),
                2
            ),
        ]
    );
    assert_eq!(
        target.store.view_at(1).map(|_| ()),
        Err(FsmError::Compacted {
            oldest_retained_revision: 2
        })
    );
}

#[test]
fn after_a_restore_versions_stay_greater_than_every_version_issued_before() {
    // Restoring an older image must not let a later apply reissue a version.
    let mut source = Log::new();
    source.put(resource(id("u", "x"), ""));
    let mut target = Log::new();
    for _ in 0..5 {
        target.noop();
    }
    target.put(resource(id("u", "z"), "")); // version 6 issued
    restore_from(&source.store, &target.store, 1);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        target.store.apply_noop(3);
    }));
    assert!(result.is_err(), "index 3 would reissue versions up to 6");
    let stored = match target.store.apply(
        7,
        &Command::Write {
            resource: resource(id("u", "x"), "1"),
        },
    ) {
        Ok(Applied::Written(r)) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(stored.version(), "7");
}

#[test]
fn abort_and_an_uncommitted_drop_change_nothing_and_a_committed_drop_does_nothing() {
    // Abort discards; drop after commit (the consuming "abort after commit") is a no-op.
    let mut log = Log::new();
    let kept = log.put(resource(id("u", "kept"), ""));
    let mut watch = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    let mut r = log.store.restore();
    r.apply(resource_with_version("new", "1")).unwrap();
    r.abort();
    let mut r = log.store.restore();
    r.apply(resource_with_version("new", "1")).unwrap();
    drop(r);
    assert_eq!(log.store.view().read(&id("u", "kept")).unwrap(), kept);
    assert_eq!(log.store.watch_count(), 1);
    assert!(drain(&mut watch).1.is_none());
    let mut r = log.store.restore();
    r.apply(resource_with_version("new", "1")).unwrap();
    r.commit(1).unwrap(); // consumes r; its drop ran after the commit
    assert_eq!(log.store.view().len(), 1);
    assert!(log.store.view().read(&id("u", "new")).is_ok());
    assert_eq!(log.store.applied_index(), 1);
}

fn resource_with_version(name: &str, version: &str) -> cairn_proto::v1::Resource {
    resource(id("u", name), version)
}

#[test]
fn a_corrupt_restore_is_rejected_before_anything_changes() {
    // Invalid resources, bad versions, duplicates, or a version above the index are refused.
    let mut log = Log::new();
    log.put(resource(id("u", "kept"), ""));
    let mut r = log.store.restore();
    assert!(matches!(
        r.apply(resource(Id::default(), "1")),
        Err(FsmError::InvalidArgument { .. })
    ));
    for bad in ["", "0", "x", "01", "-1"] {
        assert!(
            matches!(
                r.apply(resource_with_version("a", bad)),
                Err(FsmError::InvalidArgument { .. })
            ),
            "{bad:?}"
        );
    }
    r.apply(resource_with_version("a", "4")).unwrap();
    assert!(matches!(
        r.apply(resource_with_version("a", "3")),
        Err(FsmError::InvalidArgument { .. })
    ));
    assert_eq!(r.len(), 1);
    assert!(matches!(r.commit(3), Err(FsmError::InvalidArgument { .. })));
    assert_eq!(log.store.view().len(), 1);
    assert!(log.store.view().read(&id("u", "kept")).is_ok());
    assert_eq!(log.store.applied_index(), 1);
}

// ---------------------------------------------------------------- wire

#[test]
fn every_error_maps_to_its_api_kind() {
    // The one conversion: each FsmError becomes the ApiError of its kind; Decode is Internal.
    let stored = StoredResource::from_resource(&resource(id("u", "a"), "1"));
    type Check = fn(&ApiError) -> bool;
    let cases: Vec<(FsmError, Check)> = vec![
        (FsmError::NotFound, |e| matches!(e, ApiError::NotFound)),
        (
            FsmError::CasFailure {
                expected: "1".into(),
                stored: None,
            },
            |e| matches!(e, ApiError::CasFailure(_)),
        ),
        (
            FsmError::WrongUid {
                given: "a".into(),
                stored: "b".into(),
            },
            |e| matches!(e, ApiError::WrongUid(_)),
        ),
        (
            FsmError::GroupVersionMismatch {
                requested: services(),
                stored: stored.clone(),
            },
            |e| matches!(e, ApiError::GroupVersionMismatch { stored, .. } if stored.version == "1"),
        ),
        (
            FsmError::Compacted {
                oldest_retained_revision: 9,
            },
            |e| {
                matches!(
                    e,
                    ApiError::Compacted {
                        oldest_retained_revision: 9
                    }
                )
            },
        ),
        (
            FsmError::InvalidArgument {
                field: "f".into(),
                reason: "r".into(),
            },
            |e| matches!(e, ApiError::InvalidArgument { field, .. } if field == "f"),
        ),
        (
            FsmError::WatchClosed {
                reason: "restore".into(),
            },
            |e| matches!(e, ApiError::WatchClosed(r) if r == "restore"),
        ),
        (FsmError::Decode("x".into()), |e| {
            matches!(e, ApiError::Internal(_))
        }),
    ];
    for (error, check) in cases {
        let api = ApiError::from(error.clone());
        assert!(check(&api), "{error:?} -> {api:?}");
    }
}

#[test]
fn a_decoded_command_applies_like_the_original() {
    // encode -> decode -> apply is the path of every log entry.
    let store = Store::new(Limits::default());
    let bytes = Command::Write {
        resource: resource(id("u", "a"), ""),
    }
    .encode();
    assert_eq!(bytes[0], COMMAND_FORMAT_VERSION);
    let command = Command::decode(&bytes).unwrap();
    assert!(matches!(store.apply(1, &command), Ok(Applied::Written(_))));
}

// ---------------------------------------------------------------- batches

#[test]
fn a_batch_is_invisible_until_it_ends_and_then_sends_its_events_in_order() {
    // Readers see the state before the batch until it finishes; events follow, in commit order.
    let store = Store::new(Limits::default());
    let mut watch = store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    let _ = drain(&mut watch);
    let mut batch = store.batch();
    let a = match batch.apply(
        1,
        &Command::Write {
            resource: resource(id("u", "a"), ""),
        },
    ) {
        Ok(Applied::Written(r)) => r,
        other => panic!("{other:?}"),
    };
    batch.apply_noop(2);
    assert_eq!(
        batch
            .apply_owned(
                3,
                Command::Write {
                    resource: resource(id("u", "a"), "1")
                }
            )
            .map(|_| ()),
        Ok(())
    );
    assert_eq!(
        batch.apply(
            4,
            &Command::Delete {
                id: id("u", "a"),
                version: "1".into(),
                now_ms: 0,
                orphan: false,
            }
        ),
        Err(FsmError::CasFailure {
            expected: "1".into(),
            stored: Some("3".into())
        })
    );
    assert_eq!(batch.applied_index(), 4);
    let reader = {
        let store = store.clone();
        std::thread::spawn(move || (store.applied_index(), store.view().len()))
    };
    assert_eq!(reader.join().unwrap(), (0, 0), "nothing visible mid-batch");
    batch.finish();
    assert_eq!(store.applied_index(), 4);
    let (events, _) = drain(&mut watch);
    assert_eq!(
        summary(&events),
        vec![
            (WatchEventKind::Upsert, "a".into(), "1".into(), 1),
            (WatchEventKind::Upsert, "a".into(), "3".into(), 3),
        ]
    );
    assert_eq!(store.view_at(1).unwrap().read(&id("u", "a")).unwrap(), a);
}

#[test]
fn a_snapshot_larger_than_one_fetch_is_delivered_completely_in_order() {
    // Snapshots are fetched in chunks; every matching resource comes exactly once.
    let mut log = Log::new();
    for i in 0..300 {
        let tenancy_name = if i % 3 == 0 { "other" } else { "default" };
        log.put(resource(
            full_id(
                "u",
                &format!("n{i:03}"),
                services(),
                tenancy("default", tenancy_name),
            ),
            "",
        ));
    }
    for exact in [true, false] {
        let ten = if exact {
            tenancy("default", "default")
        } else {
            tenancy("*", "default")
        };
        let mut watch = log.store.watch(filter(services(), ten, "n"), 0).unwrap();
        let (events, closed) = drain(&mut watch);
        assert!(closed.is_none());
        let names: Vec<String> = events[..events.len() - 1]
            .iter()
            .map(|e| e.resource.as_ref().unwrap().head().name.to_string())
            .collect();
        let expected: Vec<String> = (0..300)
            .filter(|i| i % 3 != 0)
            .map(|i| format!("n{i:03}"))
            .collect();
        assert_eq!(names, expected);
        assert_eq!(events.last().unwrap().kind, WatchEventKind::EndOfSnapshot);
    }
    // Exactly a multiple of the chunk: 128 matches.
    let mut log = Log::new();
    for i in 0..128 {
        log.put(resource(id("u", &format!("m{i:03}")), ""));
    }
    let mut watch = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    let (events, _) = drain(&mut watch);
    assert_eq!(events.len(), 129);
}

#[test]
fn an_owner_id_with_a_separator_inside_a_field_matches_nothing() {
    // Malformed ids from the network cannot shift the owner-index prefix onto other owners.
    let mut log = Log::new();
    let mut child = resource(
        full_id(
            "u",
            "child",
            ty("c", "v1", "Kind"),
            tenancy("default", "default"),
        ),
        "",
    );
    child.owner = Some(Box::new(id("b", "a")));
    log.put(child);
    assert_eq!(log.store.view().list_by_owner(&id("b", "a")).len(), 1);
    // Owner name "a\0b" with uid "c" would otherwise prefix-match owner (a, b) + group "c".
    assert!(log.store.view().list_by_owner(&id("c", "a\0b")).is_empty());
}

#[test]
fn a_progress_event_follows_every_change_before_it_and_names_the_applied_revision() {
    // Beyond the contract: a consumer that reads Progress(r) has every matching
    // change up to r, even when the changes since its last event were to other
    // types (here: a Node written after the watch opened).
    let mut log = Log::new();
    let mut watch = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    log.put(resource(id("u", "a"), ""));
    log.put(resource(
        full_id(
            "u",
            "n",
            ty("catalog", "v1", "Node"),
            tenancy("default", "default"),
        ),
        "",
    ));
    let other = log
        .store
        .watch(filter(services(), tenancy("*", "*"), ""), 0)
        .unwrap();
    let (revision, delivered) = log.store.request_progress(&[watch.id(), u64::MAX]);
    assert_eq!(revision, log.store.applied_index());
    assert_eq!(revision, 2);
    assert_eq!(delivered, vec![watch.id()], "only the named, open watch");
    let (events, closed) = drain(&mut watch);
    assert!(closed.is_none());
    assert_eq!(
        summary(&events),
        vec![
            (
                WatchEventKind::EndOfSnapshot,
                String::new(),
                String::new(),
                0
            ),
            (WatchEventKind::Upsert, "a".into(), "1".into(), 1),
            (WatchEventKind::Progress, String::new(), String::new(), 2),
        ]
    );
    assert_ne!(other.id(), watch.id(), "watch ids are unique");
    drop(watch);
    let gone = log.store.request_progress(&[0]);
    assert_eq!(gone, (2, vec![]), "a dropped watch gets nothing");
}
