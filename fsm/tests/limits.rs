//! Replicas configured with different limits apply the same committed
//! entries the same way: a configured limit is the node's check before it
//! proposes; at apply only the fixed hard bounds count
//! (`Limits::applied`). Otherwise a node with a lower limit would refuse an
//! entry its leader applied, and the state machines would diverge.

mod common;

use bytes::Bytes;
use cairn_fsm::{validate_write, Applied, Command, FsmError, Limits, Store, NAME_BYTES_HARD_MAX};
use cairn_proto::google::protobuf::Any;
use cairn_proto::v1::Resource;
use common::*;

/// A node configured far below the defaults.
fn tight() -> Limits {
    Limits {
        resource_bytes_max: 200,
        name_bytes_max: 16,
        metadata_entries_max: 1,
        status_conditions_max: 0,
        ..Limits::default()
    }
}

/// A resource within the defaults but over every limit of [`tight`].
fn roomy(name: &str) -> Resource {
    let mut r = resource(id("u", name), "");
    r.data = Some(Any {
        type_url: "type.example/Payload".into(),
        value: Bytes::from(vec![7u8; 1000]),
    });
    for key in ["a", "b", "c"] {
        r.metadata.insert(key.into(), "v".into());
    }
    r
}

fn table(store: &Store) -> Vec<Bytes> {
    store.view().iter().map(|r| r.encoded().clone()).collect()
}

#[test]
fn an_entry_accepted_under_looser_limits_applies_under_tighter_ones() {
    let name = "a-name-longer-than-sixteen-bytes";
    let r = roomy(name);
    // The tight node itself would refuse it before proposing...
    assert!(validate_write(&r, &tight()).is_err());
    assert_eq!(validate_write(&r, &Limits::default()), Ok(()));
    // ...but an entry its leader committed applies on it as on the leader.
    let leader = Store::new(Limits::default());
    let follower = Store::new(tight());
    let write = Command::Write { resource: r };
    for store in [&leader, &follower] {
        assert!(matches!(store.apply(1, &write), Ok(Applied::Written(_))));
    }
    assert_eq!(table(&leader), table(&follower));
    assert_eq!(table(&follower).len(), 1);

    // A restore through the log, and a snapshot installed from the leader.
    let restore = [
        Command::RestoreBegin {
            restore_id: "r1".into(),
            resource_count: 1,
            leases: vec![],
        },
        Command::RestoreChunk {
            restore_id: "r1".into(),
            resources: vec![Resource {
                version: "5".into(),
                ..roomy(name)
            }],
        },
        Command::RestoreCommit {
            restore_id: "r1".into(),
        },
    ];
    for (i, command) in restore.iter().enumerate() {
        let index = 2 + i as u64;
        let on_leader = leader.apply(index, command);
        let on_follower = follower.apply(index, command);
        assert!(on_leader.is_ok(), "{on_leader:?}");
        assert_eq!(on_leader, on_follower);
    }
    assert_eq!(table(&leader), table(&follower));

    let installed = Store::new(tight());
    let mut restoration = installed.restore();
    for r in leader.snapshot() {
        restoration.apply(r.resource()).unwrap();
    }
    restoration.commit(4).unwrap();
    assert_eq!(table(&installed), table(&leader));
}

#[test]
fn the_hard_bounds_hold_on_every_replica_alike() {
    // A name over the hard bound is refused at apply whatever the limits,
    // with the same error everywhere.
    let r = resource(id("u", &"n".repeat(NAME_BYTES_HARD_MAX + 1)), "");
    let write = Command::Write { resource: r };
    let answers: Vec<Result<Applied, FsmError>> = [Limits::default(), tight()]
        .into_iter()
        .map(|limits| Store::new(limits).apply(1, &write))
        .collect();
    assert!(
        matches!(answers[0], Err(FsmError::InvalidArgument { .. })),
        "{answers:?}"
    );
    assert_eq!(answers[0], answers[1]);
}
