//! The cluster version as replicated state, and the first command it gates (WriteStatus):
//! what a controller and an operator rely on, through the store's public interface.

mod common;

use cairn_fsm::{
    Applied, ClusterVersion, ClusterVersionState, Command, FsmError, VersionAction, WatchEventKind,
};
use cairn_proto::v1::{Condition, Status};
use common::*;

const V01: ClusterVersion = ClusterVersion::new(0, 1);
const V02: ClusterVersion = ClusterVersion::new(0, 2);

fn set_version(
    log: &mut Log,
    action: VersionAction,
    version: ClusterVersion,
) -> Result<Applied, FsmError> {
    log.index += 1;
    log.store
        .apply(log.index, &Command::ClusterVersion { action, version })
}

fn write_status(
    log: &mut Log,
    id: cairn_proto::v1::Id,
    key: &str,
    status: Status,
    version: &str,
) -> Result<Applied, FsmError> {
    log.index += 1;
    log.store.apply(
        log.index,
        &Command::WriteStatus {
            id,
            key: key.into(),
            status,
            version: version.into(),
        },
    )
}

fn healthy(observed_generation: &str) -> Status {
    Status {
        observed_generation: observed_generation.into(),
        conditions: vec![Condition {
            r#type: "Healthy".into(),
            state: 1,
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[test]
fn a_new_store_runs_the_baseline_and_the_log_raises_it() {
    let mut log = Log::new();
    assert_eq!(log.store.cluster_version(), ClusterVersionState::default());
    assert_eq!(
        log.store.cluster_version().version,
        ClusterVersion::BASELINE
    );
    let raised = set_version(&mut log, VersionAction::Raise, V02).unwrap();
    let at_02 = ClusterVersionState {
        version: V02,
        downgrade: None,
    };
    assert_eq!(raised, Applied::ClusterVersion(at_02));
    assert_eq!(log.store.cluster_version(), at_02);
    assert_eq!(
        log.store.applied_index(),
        log.index,
        "the entry is applied like any other"
    );
}

#[test]
fn a_status_write_is_refused_below_its_cluster_version_and_changes_nothing() {
    let mut log = Log::new();
    let stored = log.put(resource(id("u1", "web"), ""));
    let refused = write_status(&mut log, id("u1", "web"), "health", healthy("1"), "").unwrap_err();
    assert!(
        matches!(refused, FsmError::FailedPrecondition(_)),
        "{refused:?}"
    );
    assert!(
        refused
            .to_string()
            .contains("needs cluster version 0.2; the cluster runs 0.1"),
        "{refused}"
    );
    let read = log.store.view().read(&id("", "web")).unwrap();
    assert_eq!(read.version(), stored.version(), "nothing was written");
}

#[test]
fn a_status_write_replaces_one_entry_bumps_the_version_and_keeps_the_generation() {
    let mut log = Log::new();
    set_version(&mut log, VersionAction::Raise, V02).unwrap();
    let mut data = resource(id("u1", "web"), "");
    data.generation = "g7".into();
    let stored = log.put(data);
    let mut watch = log
        .store
        .watch(
            filter(services(), tenancy("default", "default"), ""),
            log.index,
        )
        .unwrap();

    // Without a version: no conflict with the data writer.
    let Applied::Written(first) =
        write_status(&mut log, id("u1", "web"), "health", healthy("g7"), "").unwrap()
    else {
        panic!("a status write stores the resource")
    };
    let Applied::Written(second) =
        write_status(&mut log, id("u1", "web"), "placement", healthy("g7"), "").unwrap()
    else {
        panic!("a status write stores the resource")
    };
    let resource = second.resource();
    assert_eq!(resource.status.len(), 2, "each key is its own entry");
    assert_eq!(resource.status["health"], healthy("g7"));
    // From 0.2 the store sets the generation (the given "g7" is not kept): the version of
    // the write that last changed the data or metadata, which a status write never does.
    assert_eq!(stored.resource().generation, stored.version());
    assert_eq!(
        resource.generation,
        stored.version(),
        "the generation is the data's"
    );
    assert_eq!(
        resource.data,
        stored.resource().data,
        "the data is untouched"
    );
    assert!(first.version() > stored.version() && second.version() > first.version());
    let (events, closed) = drain(&mut watch);
    assert!(closed.is_none());
    let kinds: Vec<_> = events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [WatchEventKind::Upsert, WatchEventKind::Upsert],
        "watchers see each"
    );

    // With a version: a CAS on the resource's version.
    let stale = write_status(
        &mut log,
        id("u1", "web"),
        "health",
        healthy("g8"),
        first.version(),
    )
    .unwrap_err();
    assert!(matches!(stale, FsmError::CasFailure { .. }), "{stale:?}");
    write_status(
        &mut log,
        id("u1", "web"),
        "health",
        healthy("g8"),
        second.version(),
    )
    .unwrap();
}

#[test]
fn a_status_write_needs_the_lifetime_it_was_meant_for() {
    let mut log = Log::new();
    set_version(&mut log, VersionAction::Raise, V02).unwrap();
    log.put(resource(id("u1", "web"), ""));
    let no_uid = write_status(&mut log, id("", "web"), "health", healthy("1"), "").unwrap_err();
    assert!(
        matches!(&no_uid, FsmError::InvalidArgument { field, .. } if field == "id.uid"),
        "{no_uid:?}"
    );
    let other_lifetime =
        write_status(&mut log, id("u0", "web"), "health", healthy("1"), "").unwrap_err();
    assert_eq!(other_lifetime, FsmError::NotFound);
    let nothing = write_status(&mut log, id("u1", "db"), "health", healthy("1"), "").unwrap_err();
    assert_eq!(nothing, FsmError::NotFound);
    let empty_key = write_status(&mut log, id("u1", "web"), "", healthy("1"), "").unwrap_err();
    assert!(
        matches!(&empty_key, FsmError::InvalidArgument { field, .. } if field == "key"),
        "{empty_key:?}"
    );
}

#[test]
fn a_downgrade_pins_the_version_until_cancelled_and_gates_again() {
    let mut log = Log::new();
    set_version(&mut log, VersionAction::Raise, V02).unwrap();
    log.put(resource(id("u1", "web"), ""));
    set_version(&mut log, VersionAction::Downgrade, V01).unwrap();
    assert_eq!(
        log.store.cluster_version(),
        ClusterVersionState {
            version: V01,
            downgrade: Some(V01)
        }
    );
    let refused = write_status(&mut log, id("u1", "web"), "health", healthy("1"), "").unwrap_err();
    assert!(refused.to_string().contains("--cancel"), "{refused}");
    set_version(&mut log, VersionAction::CancelDowngrade, V01).unwrap();
    set_version(&mut log, VersionAction::Raise, V02).unwrap();
    write_status(&mut log, id("u1", "web"), "health", healthy("1"), "").unwrap();
}

#[test]
fn a_raise_in_the_log_applies_whether_or_not_this_replica_kept_the_pin() {
    // The pin holds the leader back; a replica that lost it (its snapshot was written by
    // release 0.1.0, which drops what it does not know) must still reach the same version.
    let mut pinned = Log::new();
    set_version(&mut pinned, VersionAction::Raise, V02).unwrap();
    set_version(&mut pinned, VersionAction::Downgrade, V01).unwrap();
    let unpinned = Log::new();
    for log in [&mut pinned, &mut { unpinned }] {
        set_version(log, VersionAction::Raise, V02).unwrap();
        assert_eq!(
            log.store.cluster_version(),
            ClusterVersionState {
                version: V02,
                downgrade: None
            }
        );
    }
}

#[test]
fn a_snapshot_carries_the_cluster_version_and_its_install_takes_it() {
    let mut log = Log::new();
    set_version(&mut log, VersionAction::Raise, V02).unwrap();
    log.put(resource(id("u1", "web"), ""));
    let snapshot = log.store.snapshot();
    assert_eq!(snapshot.cluster.version, V02);

    // A node installing the image takes its version; an image naming none is the baseline.
    let applied_index = snapshot.applied_index;
    let cluster = snapshot.cluster;
    let other = Log::new();
    let mut restoration = other.store.restore();
    for stored in snapshot {
        restoration.apply(stored.resource()).unwrap();
    }
    restoration.set_cluster_version(cluster);
    restoration.commit(applied_index).unwrap();
    assert_eq!(other.store.cluster_version(), cluster);

    // An image that names no cluster version (a file written by release 0.1.0) is the baseline.
    let mut raised = Log::new();
    set_version(&mut raised, VersionAction::Raise, V02).unwrap();
    let mut restoration = raised.store.restore();
    restoration.apply(resource(id("u1", "web"), "1")).unwrap();
    restoration.commit(applied_index + 1).unwrap();
    assert_eq!(
        raised.store.cluster_version(),
        ClusterVersionState::default()
    );
}

#[test]
fn an_online_restore_leaves_the_cluster_version_alone() {
    let mut log = Log::new();
    set_version(&mut log, VersionAction::Raise, V02).unwrap();
    for command in [
        Command::RestoreBegin {
            restore_id: "r1".into(),
            resource_count: 1,
            leases: vec![],
        },
        Command::RestoreChunk {
            restore_id: "r1".into(),
            resources: vec![resource(id("u1", "web"), "1")],
        },
        Command::RestoreCommit {
            restore_id: "r1".into(),
        },
    ] {
        log.index += 1;
        log.store.apply(log.index, &command).unwrap();
    }
    assert_eq!(log.store.cluster_version().version, V02);
}
