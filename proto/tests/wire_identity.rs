//! The `cairn.v1.shared` answers are wire-identical to the public ones: a
//! node encodes a shared message around the stored encodings of its
//! resources, and a client decodes the bytes with the public definitions.
//!
//! For every answer type (and every kind of watch event): encoding the shared
//! message gives exactly the bytes of the public message, the public decoder
//! reads back the resources, and the shared decoder reads the public bytes as
//! the resources' encodings. Checked on hand-picked edge cases (an empty
//! resource, absent resources, empty lists) and on arbitrary resources.

use bytes::Bytes;
use cairn_proto::google::protobuf::{Any, Timestamp};
use cairn_proto::v1::{
    self as pb, shared, Condition, Id, Reference, Resource, Status, Tenancy, Type,
};
use proptest::prelude::*;
use prost::Message;

fn encoded(resource: &Resource) -> Bytes {
    Bytes::from(resource.encode_to_vec())
}

/// `shared` encodes to the bytes of `public`; each decodes the other's bytes
/// to itself.
fn assert_twins<S, P>(shared_message: &S, public_message: &P)
where
    S: Message + Default + PartialEq + std::fmt::Debug,
    P: Message + Default + PartialEq + std::fmt::Debug,
{
    let shared_bytes = shared_message.encode_to_vec();
    let public_bytes = public_message.encode_to_vec();
    assert_eq!(shared_bytes, public_bytes, "the two encodings differ");
    assert_eq!(
        P::decode(shared_bytes.as_slice()).expect("the public decoder reads the shared bytes"),
        *public_message
    );
    assert_eq!(
        S::decode(public_bytes.as_slice()).expect("the shared decoder reads the public bytes"),
        *shared_message
    );
}

/// Every answer type built around `resources` (the first one, if any, for
/// the singular answers), checked shared against public.
fn assert_every_answer(resources: &[Resource], revision: u64) {
    let first = resources.first();
    assert_twins(
        &shared::ReadResponse {
            resource: first.map(encoded),
            revision,
        },
        &pb::ReadResponse {
            resource: first.cloned(),
            revision,
        },
    );
    assert_twins(
        &shared::WriteResponse {
            resource: first.map(encoded),
        },
        &pb::WriteResponse {
            resource: first.cloned(),
        },
    );
    assert_twins(
        &shared::WriteStatusResponse {
            resource: first.map(encoded),
        },
        &pb::WriteStatusResponse {
            resource: first.cloned(),
        },
    );
    // A last page (no token) and a page with a next one.
    for next_page_token in [String::new(), format!("AQ-_{revision}")] {
        assert_twins(
            &shared::ListResponse {
                resources: resources.iter().map(encoded).collect(),
                revision,
                next_page_token: next_page_token.clone(),
            },
            &pb::ListResponse {
                resources: resources.to_vec(),
                revision,
                next_page_token,
            },
        );
    }
    assert_twins(
        &shared::ListByOwnerResponse {
            resources: resources.iter().map(encoded).collect(),
            revision,
        },
        &pb::ListByOwnerResponse {
            resources: resources.to_vec(),
            revision,
        },
    );
    use pb::watch_event::Event as P;
    use shared::watch_event::Event as S;
    let events: [(Option<S>, Option<P>); 6] = [
        (
            Some(S::Upsert(shared::watch_event::Upsert {
                resource: first.map(encoded),
            })),
            Some(P::Upsert(pb::watch_event::Upsert {
                resource: first.cloned(),
            })),
        ),
        (
            Some(S::Delete(shared::watch_event::Delete {
                resource: first.map(encoded),
            })),
            Some(P::Delete(pb::watch_event::Delete {
                resource: first.cloned(),
            })),
        ),
        (
            Some(S::EndOfSnapshot(shared::watch_event::EndOfSnapshot {})),
            Some(P::EndOfSnapshot(pb::watch_event::EndOfSnapshot {})),
        ),
        (
            Some(S::Progress(shared::watch_event::Progress {})),
            Some(P::Progress(pb::watch_event::Progress {})),
        ),
        (None, None),
        (
            Some(S::Upsert(shared::watch_event::Upsert { resource: None })),
            Some(P::Upsert(pb::watch_event::Upsert { resource: None })),
        ),
    ];
    for (s, p) in events {
        assert_twins(
            &shared::WatchEvent { event: s, revision },
            &pb::WatchEvent { event: p, revision },
        );
    }
}

fn full_id(name: &str) -> Id {
    Id {
        uid: "01HQZX3V9K5W2M8N4P6R7T0Y1A".into(),
        name: name.into(),
        r#type: Some(Type {
            group: "catalog".into(),
            group_version: "v2beta1".into(),
            kind: "Service".into(),
        }),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }),
    }
}

fn full_resource() -> Resource {
    Resource {
        lease: 0,
        id: Some(full_id("web")),
        owner: Some(Box::new(full_id("owner"))),
        version: "42".into(),
        generation: "01HQZX3V9K5W2M8N4P6R7T0Y1B".into(),
        metadata: [("a".to_string(), "1".to_string()), ("b".into(), "2".into())].into(),
        status: [(
            "consul".to_string(),
            Status {
                observed_generation: "g".into(),
                conditions: vec![Condition {
                    r#type: "Ready".into(),
                    state: 1,
                    reason: "ok".into(),
                    message: "fine".into(),
                    resource: Some(Reference {
                        r#type: full_id("x").r#type,
                        tenancy: full_id("x").tenancy,
                        name: "x".into(),
                        section: "s".into(),
                    }),
                }],
                updated_at: Some(Timestamp {
                    seconds: 1_700_000_000,
                    nanos: 5,
                }),
            },
        )]
        .into(),
        data: Some(Any {
            type_url: "type.googleapis.com/catalog.Service".into(),
            value: Bytes::from(vec![0xab; 300]),
        }),
    }
}

#[test]
fn every_answer_is_wire_identical_for_edge_cases() {
    // No resource at all; an empty (default) resource, whose encoding is
    // empty yet present; a full one; several.
    assert_every_answer(&[], 0);
    assert_every_answer(&[Resource::default()], 1);
    assert_every_answer(&[full_resource()], u64::MAX);
    assert_every_answer(&[full_resource(), Resource::default(), full_resource()], 7);
}

#[test]
fn a_present_empty_resource_stays_present() {
    // A message field distinguishes "absent" from "present and empty"; the
    // shared `optional bytes` field must too, or a client would read None.
    let bytes = shared::ReadResponse {
        resource: Some(Bytes::new()),
        revision: 3,
    }
    .encode_to_vec();
    let public = pb::ReadResponse::decode(bytes.as_slice()).expect("decodes");
    assert_eq!(public.resource, Some(Resource::default()));
    let absent = shared::ReadResponse {
        resource: None,
        revision: 3,
    }
    .encode_to_vec();
    assert_eq!(
        pb::ReadResponse::decode(absent.as_slice())
            .expect("decodes")
            .resource,
        None
    );
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-zA-Z0-9./\\-_ é*]{1,24}"]
}

fn arb_type() -> impl Strategy<Value = Option<Type>> {
    proptest::option::of(
        (text(), text(), text()).prop_map(|(group, group_version, kind)| Type {
            group,
            group_version,
            kind,
        }),
    )
}

fn arb_tenancy() -> impl Strategy<Value = Option<Tenancy>> {
    proptest::option::of((text(), text()).prop_map(|(partition, namespace)| Tenancy {
        partition,
        namespace,
    }))
}

fn arb_id() -> impl Strategy<Value = Id> {
    (text(), text(), arb_type(), arb_tenancy()).prop_map(|(uid, name, r#type, tenancy)| Id {
        uid,
        name,
        r#type,
        tenancy,
    })
}

fn arb_status() -> impl Strategy<Value = Status> {
    (
        text(),
        proptest::collection::vec(
            (
                text(),
                0i32..4,
                text(),
                text(),
                proptest::option::of((arb_type(), arb_tenancy(), text(), text())),
            ),
            0..3,
        ),
        proptest::option::of((any::<i64>(), any::<i32>())),
    )
        .prop_map(|(observed_generation, conditions, updated_at)| Status {
            observed_generation,
            conditions: conditions
                .into_iter()
                .map(|(r#type, state, reason, message, resource)| Condition {
                    r#type,
                    state,
                    reason,
                    message,
                    resource: resource.map(|(r#type, tenancy, name, section)| Reference {
                        r#type,
                        tenancy,
                        name,
                        section,
                    }),
                })
                .collect(),
            updated_at: updated_at.map(|(seconds, nanos)| Timestamp { seconds, nanos }),
        })
}

fn arb_resource() -> impl Strategy<Value = Resource> {
    (
        proptest::option::of(arb_id()),
        proptest::option::of(arb_id()),
        text(),
        text(),
        proptest::collection::btree_map(text(), text(), 0..4),
        proptest::collection::btree_map(text(), arb_status(), 0..3),
        proptest::option::of((text(), proptest::collection::vec(any::<u8>(), 0..600))),
    )
        .prop_map(
            |(id, owner, version, generation, metadata, status, data)| Resource {
                lease: 0,
                id,
                owner: owner.map(Box::new),
                version,
                generation,
                metadata,
                status,
                data: data.map(|(type_url, value)| Any {
                    type_url,
                    value: Bytes::from(value),
                }),
            },
        )
}

proptest! {
    #![proptest_config(cairn_test_support::fuzz::config(256))]

    #[test]
    fn every_answer_is_wire_identical_for_any_resources(
        resources in proptest::collection::vec(arb_resource(), 0..5),
        revision in any::<u64>(),
    ) {
        assert_every_answer(&resources, revision);
    }
}
