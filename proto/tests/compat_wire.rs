//! The forwarding messages of release 0.2.0, as it sent them on the peer port, read by this
//! build: `tests/compat/0.2.0/wire/forward-*.bin` (`tests/compat/README.md`).
//!
//! A follower forwards writes, deletes, status writes, strong reads and lists to the leader
//! and asks it for read indexes (`forwarding.proto`); during a rolling upgrade the follower
//! and the leader are different releases, either way round. For every request and answer of
//! `ForwardingService`, the fixture decodes to the sample below (answers carrying resources
//! also decode with their public twin, as the client the follower hands them to does), and
//! encoding the sample gives exactly the fixture's bytes. A renumbered field or a changed
//! type in `forwarding.proto`, `resource.proto` or `shared.proto` fails here.
//!
//! Every RPC of `ForwardingService` (read from `forwarding.proto`) must have a request and an
//! answer fixture of the types it declares: an RPC added without them fails too. The samples
//! and the files never change; a new message gets a new sample and a new file, written once
//! (`CAIRN_WRITE_WIRE_FIXTURES=1`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use bytes::Bytes;
use cairn_proto::google::protobuf::{Any, Timestamp};
use cairn_proto::v1::{
    self as pb, condition, shared, Condition, Consistency, Id, Reference, Resource, Status,
    Tenancy, Type,
};
use cairn_test_support::fixtures::{self, FixtureDir};
use prost::Message;

const FORWARDING_PROTO: &str = include_str!("../proto/cairn/v1/forwarding.proto");

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
            state: condition::State::False as i32,
            reason: "CheckFailing".into(),
            message: "1 of 3 checks failing".into(),
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
            nanos: 500_000_000,
        }),
    }
}

/// A resource with every field set: owner, generation, metadata, a status entry with a
/// condition and a timestamp, and data.
fn rich(version: &str) -> Resource {
    Resource {
        lease: 0,
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
    }
}

/// A stored resource with only an id, a version and data.
fn plain(name: &str, version: &str) -> Resource {
    Resource {
        id: Some(id("Endpoint", name, "01J9ZK3Q4V6W7X8Y9Z0A1B2C40")),
        version: version.into(),
        data: Some(Any {
            type_url: "type.googleapis.com/catalog.v2.Endpoint".into(),
            value: Bytes::from_static(b"{}"),
        }),
        ..Default::default()
    }
}

/// A resource as a node stores it and a shared answer carries it: its encoding.
fn stored(resource: &Resource) -> Bytes {
    Bytes::from(resource.encode_to_vec())
}

/// A check of a fixture's bytes against a sample.
type Check = Box<dyn Fn(&[u8]) -> Result<(), String>>;

/// One fixture: its file, the message type's Rust name, the sample's encoding, and the
/// checks of the fixture's bytes against the sample.
struct Row {
    name: &'static str,
    type_name: &'static str,
    encoded: Vec<u8>,
    checks: Vec<Check>,
}

/// The fixture `name` holds `sample`, a `M`.
fn row<M: Message + Default + PartialEq + Debug + 'static>(name: &'static str, sample: M) -> Row {
    let encoded = sample.encode_to_vec();
    Row {
        name,
        type_name: std::any::type_name::<M>(),
        encoded,
        checks: vec![decodes_to(sample)],
    }
}

impl Row {
    /// The fixture also decodes to `public`, with the public twin of the shared answer.
    fn and_as_public<P: Message + Default + PartialEq + Debug + 'static>(
        mut self,
        public: P,
    ) -> Row {
        self.checks.push(decodes_to(public));
        self
    }
}

fn decodes_to<M: Message + Default + PartialEq + Debug + 'static>(sample: M) -> Check {
    let type_name = std::any::type_name::<M>();
    Box::new(move |bytes: &[u8]| match M::decode(bytes) {
        Ok(decoded) if decoded == sample => Ok(()),
        Ok(decoded) => Err(format!(
            "decodes as {type_name} to {decoded:?}, not the sample {sample:?}"
        )),
        Err(e) => Err(format!("does not decode as {type_name}: {e}")),
    })
}

/// Every request and answer of `ForwardingService`, by the fixture that holds it. Never
/// changed: add rows.
fn samples() -> Vec<Row> {
    let list_type = Type {
        group: "catalog".into(),
        group_version: "v2".into(),
        kind: "Endpoint".into(),
    };
    let listed = [rich("57"), plain("web-2", "58"), plain("web-3", "59")];
    vec![
        row(
            "forward-write-request.bin",
            pb::WriteRequest {
                fence: None,
                resource: Some(rich("41")),
            },
        ),
        row(
            "forward-write-response.bin",
            shared::WriteResponse {
                resource: Some(stored(&rich("57"))),
            },
        )
        .and_as_public(pb::WriteResponse {
            resource: Some(rich("57")),
        }),
        row(
            "forward-delete-request.bin",
            pb::DeleteRequest {
                fence: None,
                id: Some(id("Endpoint", "web-1", "01J9ZK3Q4V6W7X8Y9Z0A1B2C3E")),
                version: "57".into(),
                orphan_dependents: false,
            },
        ),
        row(
            "forward-delete-response.bin",
            pb::DeleteResponse {
                revision: 58,
                marked: false,
            },
        ),
        row(
            "forward-write-status-request.bin",
            pb::WriteStatusRequest {
                fence: None,
                id: Some(id("Endpoint", "web-1", "01J9ZK3Q4V6W7X8Y9Z0A1B2C3E")),
                key: "consul.io/health-controller".into(),
                status: Some(status()),
                version: "57".into(),
            },
        ),
        row(
            "forward-write-status-response.bin",
            shared::WriteStatusResponse {
                resource: Some(stored(&rich("59"))),
            },
        )
        .and_as_public(pb::WriteStatusResponse {
            resource: Some(rich("59")),
        }),
        row(
            "forward-read-request.bin",
            pb::ReadRequest {
                id: Some(id("Endpoint", "web-1", "01J9ZK3Q4V6W7X8Y9Z0A1B2C3E")),
                consistency: Consistency::Strong as i32,
                revision: 55,
            },
        ),
        row(
            "forward-read-response.bin",
            shared::ReadResponse {
                resource: Some(stored(&rich("57"))),
                revision: 60,
            },
        )
        .and_as_public(pb::ReadResponse {
            resource: Some(rich("57")),
            revision: 60,
        }),
        row(
            "forward-list-request.bin",
            pb::ForwardedList {
                request: Some(pb::ListRequest {
                    r#type: Some(list_type.clone()),
                    tenancy: Some(Tenancy {
                        partition: "default".into(),
                        namespace: "*".into(),
                    }),
                    name_prefix: "web-".into(),
                    consistency: Consistency::Strong as i32,
                    revision: 60,
                    limit: 3,
                    page_token: "AAAAAAAAADwFd2ViLTE".into(),
                    selector: String::new(),
                }),
                read_scope: Some(pb::ReadScope {
                    any_of: vec![
                        pb::ScopePatterns {
                            types: vec!["catalog.*".into(), "demo.Thing".into()],
                            tenancies: vec!["default/prod".into()],
                        },
                        pb::ScopePatterns {
                            types: vec!["*".into()],
                            tenancies: vec!["*/staging".into()],
                        },
                    ],
                }),
            },
        ),
        row(
            "forward-list-response.bin",
            shared::ListResponse {
                resources: listed.iter().map(stored).collect(),
                revision: 60,
                next_page_token: "AAAAAAAAADwFd2ViLTM".into(),
            },
        )
        .and_as_public(pb::ListResponse {
            resources: listed.to_vec(),
            revision: 60,
            next_page_token: "AAAAAAAAADwFd2ViLTM".into(),
        }),
        row("forward-read-index-request.bin", pb::ReadIndexRequest {}),
        row(
            "forward-read-index-response.bin",
            pb::ReadIndexResponse { index: 61 },
        ),
        row(
            "forward-lease-request.bin",
            pb::LeaseCommandRequest {
                command: Some(pb::lease_command_request::Command::KeepAlive(
                    pb::LeaseKeepAlives { ids: vec![57, 58] },
                )),
            },
        ),
        row(
            "forward-lease-response.bin",
            pb::LeaseCommandResponse {
                answer: Some(pb::lease_command_response::Answer::KeepAlive(
                    pb::LeaseKeepAliveAnswers {
                        leases: vec![
                            pb::LeaseKeepAliveResponse {
                                id: 57,
                                ttl_ms: 10_000,
                            },
                            pb::LeaseKeepAliveResponse { id: 58, ttl_ms: 0 },
                        ],
                    },
                )),
            },
        ),
    ]
}

#[test]
fn every_forwarding_message_of_0_2_0_decodes_and_encodes_to_its_fixture() {
    let dir = fixture_dir();
    let mut failures = Vec::new();
    for row in samples() {
        let path = dir.path(row.name);
        let fixture = match dir.bytes(row.name, &row.encoded) {
            Ok(bytes) => bytes,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        for check in &row.checks {
            if let Err(e) = check(&fixture) {
                failures.push(format!("{}: {e}", path.display()));
            }
        }
        if row.encoded != fixture {
            failures.push(format!(
                "{}: the sample encodes to other bytes than the fixture's ({} bytes, not {})\n    \
                 fixture: {:02x?}\n    encoded: {:02x?}",
                path.display(),
                row.encoded.len(),
                fixture.len(),
                fixture,
                row.encoded
            ));
        }
    }
    fixtures::assert_no_failures("forwarding", &failures);
}

/// `cairn.v1.shared.WriteResponse` -> `::shared::WriteResponse`, `WriteRequest` ->
/// `::v1::WriteRequest`: how the Rust type's name ends.
fn rust_suffix(proto_type: &str) -> String {
    match proto_type.strip_prefix("cairn.v1.shared.") {
        Some(name) => format!("::shared::{name}"),
        None => format!("::v1::{}", proto_type.trim_start_matches("cairn.v1.")),
    }
}

#[test]
fn every_forwarding_rpc_has_request_and_answer_fixtures_and_every_fixture_a_sample() {
    let rows = samples();
    let by_name: BTreeMap<&str, &str> = rows.iter().map(|r| (r.name, r.type_name)).collect();
    let mut failures = Vec::new();
    let rpcs = fixtures::rpcs(FORWARDING_PROTO);
    assert!(
        rpcs.len() >= 6,
        "forwarding.proto's RPCs not read: {rpcs:?}"
    );
    for rpc in &rpcs {
        for (side, proto_type) in [("request", &rpc.request), ("response", &rpc.answer)] {
            let name = format!("forward-{}-{side}.bin", fixtures::kebab(&rpc.name));
            let suffix = rust_suffix(proto_type);
            match by_name.get(name.as_str()) {
                None => failures.push(format!(
                    "ForwardingService.{} has no {side} sample ({name}, a {proto_type})",
                    rpc.name
                )),
                Some(type_name) if !type_name.ends_with(&suffix) => failures.push(format!(
                    "{name}: a {type_name}, but ForwardingService.{} takes a {proto_type}",
                    rpc.name
                )),
                Some(_) => {}
            }
        }
    }
    // A fixture no sample reads is a fixture no test checks.
    let names: BTreeSet<&str> = by_name.keys().copied().collect();
    for file in fixture_dir().names_with_prefix("forward-") {
        if !names.contains(file.as_str()) {
            failures.push(format!(
                "{}: no sample reads it",
                fixture_dir().path(&file).display()
            ));
        }
    }
    fixtures::assert_no_failures("forwarding", &failures);
}
