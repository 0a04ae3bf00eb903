//! Fuzz harness for the log's command decoder (`Command::decode`) and the
//! store that applies what it decodes: arbitrary bytes and mutations of valid
//! encodings never panic, neither in the decoder nor in `Store::apply`.
//!
//! CI runs a short pass; `PROPTEST_CASES=100000 cargo test --release -p
//! cairn-fsm --test fuzz_command` runs a long one (see docs/security.md).

use cairn_fsm::{Command, Limits, Store};
use cairn_proto::v1::{Condition, Id, Resource, Status, Tenancy, Type};
use proptest::prelude::*;

/// Cases per property: `PROPTEST_CASES` when set, else a short CI pass.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

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
        },
        Command::RestoreBegin {
            restore_id: "r1".into(),
            resource_count: 2,
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
                },
            ],
        },
    ]
    .into_iter()
    .map(|c| c.encode().to_vec())
    .collect()
}

/// One byte-level edit: overwrite, insert, delete, or truncate.
#[derive(Debug, Clone)]
enum Mutation {
    Set(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Remove),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let len = bytes.len();
        match *m {
            Mutation::Set(i, b) if len > 0 => bytes[i % len] = b,
            Mutation::Insert(i, b) => bytes.insert(i % (len + 1), b),
            Mutation::Remove(i) if len > 0 => {
                bytes.remove(i % len);
            }
            Mutation::Truncate(i) => bytes.truncate(i % (len + 1)),
            _ => {}
        }
    }
    bytes
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
        },
    ];
    for (i, c) in seeded.iter().enumerate() {
        let _ = store.apply(i as u64 + 1, c);
    }
    let _ = store.apply(3, &command);
    let _ = store.apply_owned(4, command);
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_never_panic_the_decoder_or_the_store(
        bytes in proptest::collection::vec(any::<u8>(), 0..1024)
    ) {
        decode_and_apply(&bytes);
    }

    #[test]
    fn mutated_commands_never_panic_the_decoder_or_the_store(
        seed in 0usize..7,
        mutations in proptest::collection::vec(mutation(), 1..8),
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
