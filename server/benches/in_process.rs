//! The in-process client against the remote client, back to back, on one
//! embedded node (`cairn_server::embed`): the same calls through the same trait
//! (`cairn_client::ResourceApi`), once straight into the node's request layer
//! and once over loopback gRPC to the same node's client port.
//!
//! Run: `cargo bench -p cairn-server --bench in_process`. Each bench reports
//! the wall time of one call, made one after another by one caller (the
//! node's own tasks run on the same two-thread runtime); the data dir is a
//! temporary dir (`TMPDIR`), so writes include its fsync. Groups:
//! - `read_eventual`, `read_strong`: one resource of 1 KiB of data;
//! - `write`: a compare-and-set update of that resource (through Raft);
//! - `list_100`: a strong list of 100 resources of 1 KiB.

use std::hint::black_box;
use std::time::{Duration, Instant};

use cairn_client::{Client, ResourceApi};
use cairn_proto::google::protobuf::Any;
use cairn_proto::v1::{Consistency, Id, ListRequest, Resource, Tenancy, Type};
use cairn_server::config::{parse_members, Config};
use cairn_server::embed::EmbeddedNode;
use criterion::{criterion_group, criterion_main, Criterion};
use jepsen_tests::cluster::free_port;

fn thing_type() -> Type {
    Type {
        group: "bench".into(),
        group_version: "v1".into(),
        kind: "Thing".into(),
    }
}

fn id(name: &str) -> Id {
    Id {
        uid: "u1".into(),
        name: name.into(),
        r#type: Some(thing_type()),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }),
    }
}

fn thing(name: &str, version: &str) -> Resource {
    Resource {
        id: Some(id(name)),
        version: version.into(),
        data: Some(Any {
            type_url: "bench/bytes".into(),
            value: vec![7u8; 1024].into(),
        }),
        ..Default::default()
    }
}

fn in_process_against_grpc(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let dir = tempfile::tempdir().expect("a temporary dir");
    let client_address = format!("127.0.0.1:{}", free_port());
    let peer_address = format!("127.0.0.1:{}", free_port());
    let config = Config {
        node_id: 1,
        data_dir: dir.path().join("node-1"),
        members: parse_members(&format!("1={peer_address}/{client_address}")).unwrap(),
        client_address: client_address.clone(),
        peer_address,
        ..Config::default()
    };
    let node = runtime
        .block_on(EmbeddedNode::start(config))
        .expect("the node starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !node.is_leader() {
        assert!(Instant::now() < deadline, "the node never led");
        std::thread::sleep(Duration::from_millis(10));
    }
    let in_process = node.client();
    let remote = runtime
        .block_on(Client::connect(&[client_address]))
        .expect("a client");
    let clients: [(&str, &dyn ResourceApi); 2] = [("in_process", &in_process), ("grpc", &remote)];
    runtime.block_on(async {
        for i in 0..100 {
            in_process
                .write(thing(&format!("t{i:03}"), ""))
                .await
                .unwrap();
        }
    });
    let list = ListRequest {
        r#type: Some(thing_type()),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }),
        consistency: Consistency::Strong as i32,
        ..ListRequest::default()
    };

    for (group, consistency) in [
        ("read_eventual", Consistency::Eventual),
        ("read_strong", Consistency::Strong),
    ] {
        let mut g = c.benchmark_group(group);
        for (name, client) in clients {
            g.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    runtime.block_on(async {
                        let started = Instant::now();
                        for _ in 0..iters {
                            black_box(client.read(id("t000"), consistency).await.unwrap());
                        }
                        started.elapsed()
                    })
                })
            });
        }
        g.finish();
    }

    let mut g = c.benchmark_group("write");
    for (name, client) in clients {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                runtime.block_on(async {
                    let mut version = client
                        .read(id("t001"), Consistency::Strong)
                        .await
                        .unwrap()
                        .version
                        .clone();
                    let started = Instant::now();
                    for _ in 0..iters {
                        let written = client.write(thing("t001", &version)).await.unwrap();
                        version = written.version.clone();
                    }
                    started.elapsed()
                })
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("list_100");
    for (name, client) in clients {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                runtime.block_on(async {
                    let started = Instant::now();
                    for _ in 0..iters {
                        let listing = client.list(list.clone()).await.unwrap();
                        assert_eq!(listing.resources.len(), 100);
                        black_box(listing);
                    }
                    started.elapsed()
                })
            })
        });
    }
    g.finish();

    drop(remote);
    runtime.block_on(node.shutdown());
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = in_process_against_grpc
}
criterion_main!(benches);
