//! `ResourceHead::parse` reads what a client would decode.
//!
//! The node filters lists and watches by the type and tenancy it reads from
//! a resource's bytes (the bytes it sends), so the reader must never see
//! another id than the one a client decodes: for any resource, the head is
//! the decoded id and version; for any bytes at all (arbitrary, or a valid
//! encoding with byte-level edits), the reader never panics, and whenever it
//! and prost both accept the bytes they agree. The reader may refuse what
//! prost accepts (a field of the id given twice, which prost merges), never
//! the other way round for prost's own encodings.
//!
//! `PROPTEST_CASES=100000 cargo test --release -p cairn-fsm --test
//! resource_head` runs a long pass.

use bytes::Bytes;
use cairn_fsm::{ResourceHead, StoredResource, TenancyHead, TypeHead};
use cairn_proto::google::protobuf::Any;
use cairn_proto::v1::{Id, Resource, Tenancy, Type};
use proptest::prelude::*;
use prost::Message;

/// The head as a client sees it: the decoded resource's id and version.
fn head_of(resource: &Resource) -> ResourceHead<'_> {
    let id = resource.id.as_ref();
    ResourceHead {
        uid: id.map(|i| i.uid.as_str()).unwrap_or(""),
        name: id.map(|i| i.name.as_str()).unwrap_or(""),
        type_: id.and_then(|i| i.r#type.as_ref()).map(TypeHead::from),
        tenancy: id.and_then(|i| i.tenancy.as_ref()).map(TenancyHead::from),
        version: &resource.version,
    }
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-z0-9*/é-]{1,12}"]
}

fn arb_id() -> impl Strategy<Value = Id> {
    (
        text(),
        text(),
        proptest::option::of((text(), text(), text())),
        proptest::option::of((text(), text())),
    )
        .prop_map(|(uid, name, t, tenancy)| Id {
            uid,
            name,
            r#type: t.map(|(group, group_version, kind)| Type {
                group,
                group_version,
                kind,
            }),
            tenancy: tenancy.map(|(partition, namespace)| Tenancy {
                partition,
                namespace,
            }),
        })
}

fn arb_resource() -> impl Strategy<Value = Resource> {
    (
        proptest::option::of(arb_id()),
        proptest::option::of(arb_id()),
        text(),
        text(),
        proptest::collection::btree_map(text(), text(), 0..3),
        proptest::option::of((text(), proptest::collection::vec(any::<u8>(), 0..64))),
    )
        .prop_map(
            |(id, owner, version, generation, metadata, data)| Resource {
                id,
                owner: owner.map(Box::new),
                version,
                generation,
                metadata,
                data: data.map(|(type_url, value)| Any {
                    type_url,
                    value: Bytes::from(value),
                }),
                ..Default::default()
            },
        )
}

/// Whenever both the reader and prost accept `bytes`, they agree.
fn agrees_with_prost(bytes: &[u8]) -> Result<(), TestCaseError> {
    let (Ok(head), Ok(decoded)) = (ResourceHead::parse(bytes), Resource::decode(bytes)) else {
        return Ok(());
    };
    prop_assert_eq!(head, head_of(&decoded));
    Ok(())
}

/// One byte-level edit: overwrite, insert, remove.
fn edit(bytes: &mut Vec<u8>, (at, value, kind): (usize, u8, u8)) {
    let len = bytes.len();
    match kind % 3 {
        0 if len > 0 => bytes[at % len] = value,
        1 => bytes.insert(at % (len + 1), value),
        2 if len > 0 => {
            bytes.remove(at % len);
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(cairn_test_support::fuzz::config(512))]

    #[test]
    fn the_head_of_an_encoding_is_the_decoded_id_and_version(resource in arb_resource()) {
        let bytes = resource.encode_to_vec();
        let head = ResourceHead::parse(&bytes);
        prop_assert_eq!(head, Ok(head_of(&resource)));
    }

    #[test]
    fn a_stored_resource_reads_its_own_fields(resource in arb_resource()) {
        // The quick accessors of a stored resource agree with the strict reader.
        let stored = StoredResource::from_resource(&resource);
        prop_assert_eq!(stored.resource(), resource.clone());
        prop_assert_eq!(stored.head(), head_of(&resource));
        prop_assert_eq!(stored.uid(), head_of(&resource).uid);
        prop_assert_eq!(stored.version(), resource.version.as_str());
        prop_assert_eq!(stored.group_version(), head_of(&resource).group_version());
    }

    #[test]
    fn edited_encodings_are_read_as_prost_reads_them_or_refused(
        resource in arb_resource(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6),
    ) {
        let mut bytes = resource.encode_to_vec();
        for e in edits {
            edit(&mut bytes, e);
        }
        agrees_with_prost(&bytes)?;
    }

    #[test]
    fn arbitrary_bytes_are_read_as_prost_reads_them_or_refused(
        bytes in proptest::collection::vec(any::<u8>(), 0..256)
    ) {
        agrees_with_prost(&bytes)?;
    }
}
