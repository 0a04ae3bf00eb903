//! Fuzz harness for the log's command decoder (`Command::decode`) and the
//! store that applies what it decodes: arbitrary bytes and mutations of valid
//! encodings never panic, neither in the decoder nor in `Store::apply`.
//!
//! CI runs a short pass; `PROPTEST_CASES=100000 cargo test --release -p
//! cairn-fsm --test fuzz_command` runs a long one (see docs/security.md).

use cairn_fsm::{Command, Limits, Store};
use cairn_proto::v1::{Condition, Id, Resource, Status, Tenancy, Type};
use cairn_test_support::fuzz::{arbitrary_bytes, config, mutate, mutations};
use proptest::prelude::*;

fn id(name: &str) -> Id {
    Id {
        uid: "u1".into(),
        name: name.into(),
        r#type: Some(Type {
            group: "demo".into(),
            group_version: "v1".into(),
            kind: "Thing".into(),
        }),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }),
    }
}

fn resource(name: &str) -> Resource {
    let mut r = Resource {
        id: Some(id(name)),
        owner: Some(Box::new(id("owner"))),
        ..Default::default()
    };
    r.metadata.insert("k".into(), "v".into());
    r.status.insert(
        "s".into(),
        Status {
            conditions: vec![Condition {
                r#type: "Ready".into(),
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    r
}

/// One valid encoding of every kind of command.
fn seeds() -> Vec<Vec<u8>> {
    vec![
        Command::Write {
            resource: resource("a"),
        },
        Command::Delete {
            id: id("a"),
            version: "3".into(),
            now_ms: 0,
            orphan: false,
        },
        Command::RestoreBegin {
            restore_id: "r1".into(),
            resource_count: 2,
            leases: vec![],
        },
        Command::RestoreChunk {
            restore_id: "r1".into(),
            resources: vec![resource("a"), resource("b")],
        },
        Command::RestoreCommit {
            restore_id: "r1".into(),
        },
        Command::RestoreAbort {
            restore_id: "r1".into(),
        },
        Command::Batch {
            commands: vec![
                Command::Write {
                    resource: resource("a"),
                },
                Command::Delete {
                    id: id("b"),
                    version: String::new(),
                    now_ms: 0,
                    orphan: false,
                },
            ],
        },
    ]
    .into_iter()
    .map(|c| c.encode().to_vec())
    .collect()
}

/// Decodes, and applies whatever decodes to a store holding some state and
/// a pending restore: errors are fine, panics are not.
fn decode_and_apply(bytes: &[u8]) {
    let Ok(command) = Command::decode(bytes) else {
        return;
    };
    let store = Store::new(Limits::default());
    let seeded = [
        Command::Write {
            resource: resource("a"),
        },
        Command::RestoreBegin {
            restore_id: "r1".into(),
            resource_count: 2,
            leases: vec![],
        },
    ];
    for (i, c) in seeded.iter().enumerate() {
        let _ = store.apply(i as u64 + 1, c);
    }
    let _ = store.apply(3, &command);
    let _ = store.apply_owned(4, command);
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn arbitrary_bytes_never_panic_the_decoder_or_the_store(
        bytes in arbitrary_bytes(1024)
    ) {
        decode_and_apply(&bytes);
    }

    #[test]
    fn mutated_commands_never_panic_the_decoder_or_the_store(
        seed in 0usize..7,
        mutations in mutations(),
    ) {
        let bytes = mutate(seeds()[seed].clone(), &mutations);
        decode_and_apply(&bytes);
    }
}

#[test]
fn every_seed_decodes_to_its_command() {
    // The mutations start from valid encodings, so that they reach deep.
    for seed in seeds() {
        let command = Command::decode(&seed).expect("a seed decodes");
        assert_eq!(command.encode().to_vec(), seed);
    }
}
