//! The read paths as the node serves them, from the table to the bytes a
//! response puts on the wire, for counting instructions under callgrind
//! (wall time means nothing on a shared machine; instruction counts do).
//!
//! Run one workload at a time, counting only inside its `measured_*` function:
//!
//! ```sh
//! cargo build --release -p cairn-fsm --example wire_paths
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p \
//!   --toggle-collect='*measured_*' target/release/examples/wire_paths list
//! ```
//!
//! Workloads (each on a table of 1,000 resources shaped like `cairn bench`'s):
//! - `list`: one List of all 1,000, encoded as a ListResponse;
//! - `read`: 1,000 point reads, each encoded as a ReadResponse;
//! - `fanout`: one write applied while 1,000 watches match it, then every
//!   watch takes its event and encodes it as a WatchEvent;
//! - `watch_snapshot`: one watch reads its 1,000 Upserts and EndOfSnapshot,
//!   each encoded as a WatchEvent;
//! - `apply`: 1,000 CAS updates applied, each with its WriteResponse encoded
//!   (as the leader answers them);
//! - `follower_apply`: the same 1,000 updates as a follower applies them:
//!   each log payload decoded and applied by value, nothing answered.

use std::hint::black_box;

use bytes::Bytes;
use cairn_fsm::{Applied, Command, Limits, Store, Watch, WatchFilter};
use cairn_proto::google::protobuf::Any;
use cairn_proto::v1::{shared, Id, Resource, Tenancy, Type};
use prost::Message as _;

const TABLE_LEN: u64 = 1_000;
const WATCHERS: usize = 1_000;

fn id(k: u64) -> Id {
    Id {
        uid: "bench".into(),
        name: format!("k{k:09}"),
        r#type: Some(Type {
            group: "bench".into(),
            group_version: "v1".into(),
            kind: "Item".into(),
        }),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: "ns".into(),
        }),
    }
}

/// A resource as `cairn bench write` creates it: a 256-byte payload.
fn resource(k: u64, version: &str) -> Resource {
    Resource {
        id: Some(id(k)),
        version: version.into(),
        data: Some(Any {
            type_url: "type.googleapis.com/cairn.bench.Value".into(),
            value: Bytes::from(vec![0x5a; 256]),
        }),
        ..Default::default()
    }
}

fn items() -> Type {
    Type {
        group: "bench".into(),
        group_version: String::new(),
        kind: "Item".into(),
    }
}

fn every_tenancy() -> Tenancy {
    Tenancy {
        partition: "*".into(),
        namespace: "*".into(),
    }
}

/// A store holding `TABLE_LEN` resources at indexes 1..=TABLE_LEN.
fn populated() -> Store {
    let store = Store::new(Limits::default());
    for k in 0..TABLE_LEN {
        store
            .apply(
                k + 1,
                &Command::Write {
                    resource: resource(k, ""),
                },
            )
            .expect("a bench resource is valid");
    }
    store
}

#[inline(never)]
fn measured_list(store: &Store) -> usize {
    let view = store.view();
    let listed = view.list(&items(), &every_tenancy(), "");
    let response = shared::ListResponse {
        resources: listed.iter().map(|r| r.encoded().clone()).collect(),
        revision: view.revision(),
        // All 1,000: one page of the default list_page_size_max.
        next_page_token: String::new(),
    };
    response.encode_to_vec().len()
}

#[inline(never)]
fn measured_read(store: &Store, ids: &[Id]) -> usize {
    let mut total = 0;
    for id in ids {
        let view = store.view();
        let stored = view.read(id).expect("stored");
        let response = shared::ReadResponse {
            resource: Some(stored.encoded().clone()),
            revision: view.revision(),
        };
        total += response.encode_to_vec().len();
    }
    total
}

#[inline(never)]
fn measured_fanout(store: &Store, watches: &mut [Watch], index: u64) -> usize {
    let applied = store.apply(
        index,
        &Command::Write {
            resource: resource(0, "1"),
        },
    );
    assert!(matches!(applied, Ok(Applied::Written(_))), "{applied:?}");
    let mut total = 0;
    for watch in watches {
        let event = watch.try_next().expect("open").expect("one event");
        total += event.to_shared().encode_to_vec().len();
    }
    total
}

#[inline(never)]
fn measured_watch_snapshot(watch: &mut Watch) -> usize {
    let mut total = 0;
    loop {
        let event = watch.try_next().expect("open").expect("ready");
        total += event.to_shared().encode_to_vec().len();
        if event.resource.is_none() {
            return total;
        }
    }
}

#[inline(never)]
fn measured_apply(store: &Store, commands: &[Command], first_index: u64) -> usize {
    let mut total = 0;
    for (i, command) in commands.iter().enumerate() {
        match store.apply(first_index + i as u64, command) {
            Ok(Applied::Written(stored)) => {
                let response = shared::WriteResponse {
                    resource: Some(stored.encoded().clone()),
                };
                total += response.encode_to_vec().len();
            }
            other => panic!("apply: {other:?}"),
        }
    }
    total
}

#[inline(never)]
fn measured_follower_apply(store: &Store, payloads: &[Bytes], first_index: u64) -> usize {
    let mut written = 0;
    for (i, payload) in payloads.iter().enumerate() {
        let command = Command::decode(payload).expect("decodes");
        match store.apply_owned(first_index + i as u64, command) {
            Ok(Applied::Written(_)) => written += 1,
            other => panic!("apply: {other:?}"),
        }
    }
    written
}

fn watch_all(store: &Store, start_revision: u64) -> Watch {
    store
        .watch(
            WatchFilter {
                type_: items(),
                tenancy: every_tenancy(),
                name_prefix: String::new(),
                selector: None,
            },
            start_revision,
        )
        .expect("watch")
}

fn main() {
    let workload = std::env::args().nth(1).unwrap_or_default();
    let store = populated();
    let bytes = match workload.as_str() {
        "list" => measured_list(&store),
        "read" => {
            let ids: Vec<Id> = (0..TABLE_LEN).map(id).collect();
            measured_read(&store, &ids)
        }
        "fanout" => {
            let applied = store.applied_index();
            let mut watches: Vec<Watch> =
                (0..WATCHERS).map(|_| watch_all(&store, applied)).collect();
            measured_fanout(&store, &mut watches, applied + 1)
        }
        "watch_snapshot" => {
            let mut watch = watch_all(&store, 0);
            measured_watch_snapshot(&mut watch)
        }
        "apply" => {
            // Version k + 1 is stored at key k; update each once.
            let first = store.applied_index() + 1;
            let commands: Vec<Command> = (0..TABLE_LEN)
                .map(|k| Command::Write {
                    resource: resource(k, &(k + 1).to_string()),
                })
                .collect();
            measured_apply(&store, &commands, first)
        }
        "follower_apply" => {
            let first = store.applied_index() + 1;
            let payloads: Vec<Bytes> = (0..TABLE_LEN)
                .map(|k| {
                    Command::Write {
                        resource: resource(k, &(k + 1).to_string()),
                    }
                    .encode()
                })
                .collect();
            measured_follower_apply(&store, &payloads, first)
        }
        other => {
            eprintln!(
                "wire_paths: unknown workload {other:?} \
                 (list, read, fanout, watch_snapshot, apply, follower_apply)"
            );
            std::process::exit(2);
        }
    };
    println!("{workload}: {} bytes encoded", black_box(bytes));
}
