//! The commands of release 0.2.0, as it wrote them into Raft log entries, read by this
//! build: `tests/compat/0.2.0/wire/command-*.bin` (`tests/compat/README.md`).
//!
//! A command is on disk (in the log and its WAL) and on the wire (in AppendEntries) for as
//! long as a cluster lives, and a cluster is upgraded one member at a time: every later
//! build must decode what 0.2.0 wrote, and write the same bytes for the same command (so
//! that a 0.2.0 member of a mixed cluster reads what a newer leader proposes). For every
//! command and cluster-version action, the fixture decodes (`Command::decode`) to the
//! sample below, and encoding the sample (`Command::encode`) gives exactly the fixture's
//! bytes. A renumbered field, a changed type or format-version byte fails here.
//!
//! Every field of `cairn.v1.log.Command`'s `oneof command` and every value of
//! `ClusterVersionCommand.Action` (read from `log.proto`) must have a fixture: a command
//! added without one fails too. The samples and the files never change; a new command gets
//! a new sample and a new file, written once (`CAIRN_WRITE_WIRE_FIXTURES=1`).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use cairn_fsm::{CapacityAction, ClusterVersion, Command, IntegrityAction, VersionAction};
use cairn_proto::google::protobuf::{Any, Timestamp};
use cairn_proto::v1::{condition, Condition, Id, Reference, Resource, Status, Tenancy, Type};
use cairn_test_support::fixtures::{self, FixtureDir};

const LOG_PROTO: &str = include_str!("../../proto/proto/cairn/v1/log.proto");

fn fixture_dir() -> FixtureDir {
    FixtureDir::in_workspace(env!("CARGO_MANIFEST_DIR"), "tests/compat/0.2.0/wire")
}

fn id(kind: &str, name: &str, uid: &str) -> Id {
    Id {
        uid: uid.into(),
        name: name.into(),
        r#type: Some(Type {
            group: "catalog".into(),
            group_version: "v2".into(),
            kind: kind.into(),
        }),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: "prod".into(),
        }),
    }
}

fn status() -> Status {
    Status {
        observed_generation: "01J9ZK3Q4V6W7X8Y9Z0A1B2C3D".into(),
        conditions: vec![Condition {
            r#type: "Healthy".into(),
            state: condition::State::True as i32,
            reason: "AllChecksPassing".into(),
            message: "3 of 3 checks passing".into(),
            resource: Some(Reference {
                r#type: Some(Type {
                    group: "catalog".into(),
                    group_version: "v2".into(),
                    kind: "Endpoint".into(),
                }),
                tenancy: Some(Tenancy {
                    partition: "default".into(),
                    namespace: "prod".into(),
                }),
                name: "web-1".into(),
                section: "http".into(),
            }),
        }],
        updated_at: Some(Timestamp {
            seconds: 1_764_000_000,
            nanos: 123_456_789,
        }),
    }
}

/// A resource with every field set: owner, generation, metadata, a status entry with a
/// condition and a timestamp, and data.
fn rich(version: &str) -> Resource {
    Resource {
        id: Some(id("Endpoint", "web-1", "01J9ZK3Q4V6W7X8Y9Z0A1B2C3E")),
        owner: Some(Box::new(id("Service", "web", "01J9ZK3Q4V6W7X8Y9Z0A1B2C3F"))),
        version: version.into(),
        generation: "01J9ZK3Q4V6W7X8Y9Z0A1B2C3D".into(),
        metadata: BTreeMap::from([
            ("team".into(), "blue".into()),
            ("tier".into(), "frontend".into()),
        ]),
        status: BTreeMap::from([("consul.io/health-controller".into(), status())]),
        data: Some(Any {
            type_url: "type.googleapis.com/catalog.v2.Endpoint".into(),
            value: Bytes::from_static(&[0x0a, 0x05, b'w', b'e', b'b', b'-', b'1', 0x10, 0x50]),
        }),
        lease: 0,
    }
}

/// A resource with only what a create needs.
fn plain(name: &str) -> Resource {
    Resource {
        id: Some(id("Service", name, "01J9ZK3Q4V6W7X8Y9Z0A1B2C40")),
        data: Some(Any {
            type_url: "type.googleapis.com/catalog.v2.Service".into(),
            value: Bytes::from_static(b"{}"),
        }),
        ..Default::default()
    }
}

/// Every command, by the fixture that holds it. Never changed: add rows.
fn samples() -> Vec<(&'static str, Command)> {
    vec![
        (
            "command-write.bin",
            Command::Write {
                resource: rich("41"),
            },
        ),
        (
            "command-delete.bin",
            Command::Delete {
                id: id("Endpoint", "web-1", "01J9ZK3Q4V6W7X8Y9Z0A1B2C3E"),
                version: "42".into(),
                now_ms: 0,
                orphan: false,
            },
        ),
        (
            "command-batch.bin",
            Command::Batch {
                commands: vec![
                    Command::Write {
                        resource: plain("api"),
                    },
                    Command::Write { resource: rich("") },
                    Command::Delete {
                        id: id("Service", "old", "01J9ZK3Q4V6W7X8Y9Z0A1B2C41"),
                        version: "17".into(),
                        now_ms: 0,
                        orphan: false,
                    },
                ],
            },
        ),
        (
            "command-restore-begin.bin",
            Command::RestoreBegin {
                restore_id: "restore-01J9ZK3Q4V".into(),
                resource_count: 142,
                leases: vec![],
            },
        ),
        (
            "command-restore-chunk.bin",
            Command::RestoreChunk {
                restore_id: "restore-01J9ZK3Q4V".into(),
                resources: vec![rich("199"), plain("api")],
            },
        ),
        (
            "command-restore-commit.bin",
            Command::RestoreCommit {
                restore_id: "restore-01J9ZK3Q4V".into(),
            },
        ),
        (
            "command-restore-abort.bin",
            Command::RestoreAbort {
                restore_id: "restore-01J9ZK3Q4V".into(),
            },
        ),
        (
            "command-cluster-version-raise.bin",
            Command::ClusterVersion {
                action: VersionAction::Raise,
                version: ClusterVersion::new(0, 2),
            },
        ),
        (
            "command-cluster-version-downgrade.bin",
            Command::ClusterVersion {
                action: VersionAction::Downgrade,
                version: ClusterVersion::new(0, 1),
            },
        ),
        (
            "command-cluster-version-cancel-downgrade.bin",
            Command::ClusterVersion {
                action: VersionAction::CancelDowngrade,
                version: ClusterVersion::new(0, 1),
            },
        ),
        (
            "command-write-status.bin",
            Command::WriteStatus {
                id: id("Endpoint", "web-1", "01J9ZK3Q4V6W7X8Y9Z0A1B2C3E"),
                key: "consul.io/health-controller".into(),
                status: status(),
                version: "43".into(),
            },
        ),
        (
            "command-capacity-set-quota.bin",
            Command::Capacity {
                action: CapacityAction::SetQuota(256 * 1024 * 1024),
            },
        ),
        (
            "command-capacity-raise-alarm.bin",
            Command::Capacity {
                action: CapacityAction::RaiseAlarm,
            },
        ),
        (
            "command-capacity-disarm-alarm.bin",
            Command::Capacity {
                action: CapacityAction::DisarmAlarm,
            },
        ),
        (
            "command-restore-begin-leases.bin",
            Command::RestoreBegin {
                restore_id: "restore-01J9ZK3Q4W".into(),
                resource_count: 3,
                leases: vec![(57, 10_000), (58, 30_000)],
            },
        ),
        (
            "command-write-leased.bin",
            Command::Write {
                resource: Resource {
                    lease: 57,
                    ..plain("api")
                },
            },
        ),
        (
            "command-lease-grant.bin",
            Command::LeaseGrant { ttl_ms: 10_000 },
        ),
        (
            "command-lease-revoke.bin",
            Command::LeaseRevoke { id: 57, now_ms: 0 },
        ),
        (
            "command-lease-keep-alive.bin",
            Command::LeaseKeepAlive { ids: vec![57, 58] },
        ),
        (
            "command-lease-expire.bin",
            Command::LeaseExpire {
                leases: vec![(57, 60), (58, 61)],
                now_ms: 0,
            },
        ),
        (
            "command-fenced-write.bin",
            Command::Fenced {
                fence: cairn_proto::v1::Fence {
                    election: Some(cairn_proto::v1::Reference {
                        r#type: id("Election", "leader", "").r#type,
                        tenancy: id("Election", "leader", "").tenancy,
                        name: "leader".into(),
                        section: String::new(),
                    }),
                    token: 62,
                },
                command: Box::new(Command::Write {
                    resource: plain("api"),
                }),
            },
        ),
        // The lifecycle (cluster version 0.2): a delete proposed with the leader's time and
        // orphaning, the lease commands with it, and a step of collection.
        (
            "command-delete-orphan.bin",
            Command::Delete {
                id: id("Thing", "api", "u1"),
                version: "63".into(),
                now_ms: 1_764_410_400_123,
                orphan: true,
            },
        ),
        (
            "command-lease-revoke-at.bin",
            Command::LeaseRevoke {
                id: 57,
                now_ms: 1_764_410_400_123,
            },
        ),
        (
            "command-lease-expire-at.bin",
            Command::LeaseExpire {
                leases: vec![(57, 60)],
                now_ms: 1_764_410_400_123,
            },
        ),
        (
            "command-collect.bin",
            Command::Collect {
                owner: id("Thing", "api", "u1"),
                now_ms: 1_764_410_400_123,
            },
        ),
        // Replicas that check each other: the CORRUPT alarm raised, then disarmed.
        (
            "command-integrity-raise-corrupt.bin",
            Command::Integrity {
                action: IntegrityAction::RaiseCorrupt(vec![3, 5]),
            },
        ),
        (
            "command-integrity-disarm.bin",
            Command::Integrity {
                action: IntegrityAction::Disarm,
            },
        ),
    ]
}

#[test]
fn every_command_of_0_2_0_decodes_and_encodes_to_its_fixture() {
    let dir = fixture_dir();
    let mut failures = Vec::new();
    for (name, sample) in samples() {
        let path = dir.path(name);
        let encoded = sample.encode();
        let fixture = match dir.bytes(name, &encoded) {
            Ok(bytes) => bytes,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        match Command::decode(&fixture) {
            Ok(decoded) if decoded == sample => {}
            Ok(decoded) => failures.push(format!(
                "{}: decodes to {decoded:?}, not the sample {sample:?}",
                path.display()
            )),
            Err(e) => failures.push(format!("{}: does not decode: {e}", path.display())),
        }
        if encoded.as_ref() != fixture.as_slice() {
            failures.push(format!(
                "{}: the sample encodes to other bytes than the fixture's ({} bytes, not {}): \
                 a 0.2.0 member would not read what this build proposes\n    fixture: {:02x?}\n    \
                 encoded: {:02x?}",
                path.display(),
                encoded.len(),
                fixture.len(),
                fixture,
                encoded.as_ref()
            ));
        }
    }
    fixtures::assert_no_failures("command", &failures);
}

#[test]
fn every_command_and_action_of_the_log_has_a_fixture_and_every_fixture_a_sample() {
    let names: BTreeSet<String> = samples().iter().map(|(n, _)| n.to_string()).collect();
    let mut failures = Vec::new();
    let commands = fixtures::oneof_fields(LOG_PROTO, "command");
    assert!(
        commands.len() >= 9,
        "log.proto's `oneof command` not read: {commands:?}"
    );
    for command in &commands {
        let prefix = format!("command-{}", fixtures::kebab(command));
        if !names.iter().any(|n| n.starts_with(&prefix)) {
            failures.push(format!(
                "log.proto's command `{command}` has no sample (no {prefix}*.bin)"
            ));
        }
    }
    let actions = fixtures::enum_values(LOG_PROTO, "Action");
    assert!(
        actions.len() >= 3,
        "log.proto's `enum Action` not read: {actions:?}"
    );
    for action in &actions {
        let action = fixtures::kebab(action.trim_start_matches("ACTION_"));
        let name = format!("command-cluster-version-{action}.bin");
        if !names.contains(&name) {
            failures.push(format!(
                "the cluster version action `{action}` has no sample ({name})"
            ));
        }
    }
    // A fixture no sample reads is a fixture no test checks.
    for file in fixture_dir().names_with_prefix("command-") {
        if !names.contains(&file) {
            failures.push(format!(
                "{}: no sample reads it",
                fixture_dir().path(&file).display()
            ));
        }
    }
    fixtures::assert_no_failures("command", &failures);
}
