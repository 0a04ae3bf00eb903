//! A node as a library (`cairn_server::embed`) and its in-process client.
//!
//! The contract's checks over `cairn_client::ResourceApi` (`api_contract`)
//! run three ways: through the remote `Client` against a cluster of `cairn`
//! processes, and through the in-process client of an embedded single node
//! and of each node of an embedded 3-node cluster (a follower's writes go to
//! the leader over the peer port). Then what the in-process client does of
//! its own: a `WatchCache` primed through it shares the resources its watch
//! delivered; it bypasses the client port's grants but not the node-wide
//! watch budget.

use crate::api_contract;
use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use api_contract::{check_the_contract, Target};
use cairn_client::{
    CacheEvent, Client, ClientError, ClientOptions, ResourceApi, WatchCache, WatchCacheOptions,
    WatchSpec,
};
use cairn_proto::v1::{Consistency, Id, Resource, Tenancy, Type, WatchListRequest};
use cairn_server::config::{parse_members, Config, GrantConfig};
use cairn_server::embed::EmbeddedNode;
use jepsen_tests::cluster::free_port;
use parking_lot::Mutex;

const LEADER_TIMEOUT: Duration = Duration::from_secs(20);
const WAIT: Duration = Duration::from_secs(10);
/// Changes the nodes keep for past reads and watch replays.
const HISTORY_CHANGES_MAX: usize = 200;

/// Embedded nodes of one cluster in this process, their data under one temporary dir.
struct Embedded {
    nodes: Vec<EmbeddedNode>,
    _dir: tempfile::TempDir,
}

impl Embedded {
    /// Starts `n` nodes forming a new cluster (every node given every member, as
    /// `cairn agent --members` is), each config passed through `tweak` first.
    async fn start(n: u64, tweak: impl Fn(&mut Config)) -> Embedded {
        let dir = tempfile::tempdir().unwrap();
        let addresses: Vec<(u64, String, String)> = (1..=n)
            .map(|id| {
                let peer = format!("127.0.0.1:{}", free_port());
                let client = format!("127.0.0.1:{}", free_port());
                (id, peer, client)
            })
            .collect();
        let members = addresses
            .iter()
            .map(|(id, peer, client)| format!("{id}={peer}/{client}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = Vec::new();
        for (id, peer, client) in &addresses {
            let mut config = Config {
                node_id: *id,
                data_dir: dir.path().join(format!("node-{id}")),
                client_address: client.clone(),
                peer_address: peer.clone(),
                members: parse_members(&members).unwrap(),
                history_changes_max: HISTORY_CHANGES_MAX,
                ..Config::default()
            };
            tweak(&mut config);
            let node = EmbeddedNode::start(config)
                .await
                .unwrap_or_else(|e| panic!("embedded node {id} does not start: {e:#}"));
            nodes.push(node);
        }
        Embedded { nodes, _dir: dir }
    }

    /// The index of the node that leads, once one does.
    async fn leader(&self) -> usize {
        let deadline = Instant::now() + LEADER_TIMEOUT;
        loop {
            if let Some(i) = self.nodes.iter().position(EmbeddedNode::is_leader) {
                return i;
            }
            assert!(
                Instant::now() < deadline,
                "no leader within {LEADER_TIMEOUT:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn shutdown(self) {
        for node in self.nodes {
            node.shutdown().await;
        }
    }
}

/// A remote client of the nodes at `endpoints`.
fn remote(endpoints: &[String]) -> Client {
    Client::new(
        endpoints,
        ClientOptions {
            request_timeout: Duration::from_secs(10),
            ..ClientOptions::default()
        },
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contract_holds_through_the_trait_with_a_remote_client() {
    // The remote `Client` as a `ResourceApi`, against a cluster of `cairn` processes:
    // once through the leader, once through a follower (which forwards).
    let mut options = support::options(3);
    options.extra_args = vec![
        "--history-changes-max".into(),
        HISTORY_CHANGES_MAX.to_string(),
    ];
    let cluster = support::Cluster::start(options);
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = cluster.ids_except(leader)[0];
    for (run, (id, role)) in [(leader, "leader"), (follower, "follower")]
        .into_iter()
        .enumerate()
    {
        let client = remote(&[cluster.node(id).client_address.clone()]);
        let t = Target {
            api: &client,
            label: format!("remote client of node {id} ({role})"),
            group: format!("remote{run}"),
        };
        check_the_contract(&t).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contract_holds_in_process_on_a_single_embedded_node() {
    // One node started by the library; its in-process client passes the same checks.
    let embedded = Embedded::start(1, |_| {}).await;
    embedded.leader().await;
    let client = embedded.nodes[0].client();
    let t = Target {
        api: &client,
        label: "in-process client of a single node".into(),
        group: "single".into(),
    };
    check_the_contract(&t).await;
    embedded.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contract_holds_in_process_on_each_node_of_an_embedded_cluster() {
    // Three embedded nodes form a cluster as three `cairn agent`s would. The in-process
    // client of the leader, then of each follower (its writes and strong reads go
    // through the leader), passes the same checks; what each wrote is seen by the
    // others' strong reads.
    let embedded = Embedded::start(3, |_| {}).await;
    let leader = embedded.leader().await;
    let mut order = vec![leader];
    order.extend((0..3).filter(|i| *i != leader));
    for (run, i) in order.into_iter().enumerate() {
        let role = if i == leader { "leader" } else { "follower" };
        let node = &embedded.nodes[i];
        let client = node.client();
        let t = Target {
            api: &client,
            label: format!("in-process client of node {} ({role})", node.node_id()),
            group: format!("cluster{run}"),
        };
        check_the_contract(&t).await;
        let written = t.put(t.res("Shared", "s", "u1", "", b"x")).await;
        for other in &embedded.nodes {
            let seen = other
                .client()
                .read(t.id("Shared", "s", ""), Consistency::Strong)
                .await
                .unwrap();
            assert_eq!(
                seen,
                written,
                "node {} sees {}'s write",
                other.node_id(),
                t.label
            );
        }
    }
    embedded.shutdown().await;
}

fn counter_type() -> Type {
    Type {
        group: "demo".into(),
        group_version: "v1".into(),
        kind: "Counter".into(),
    }
}

fn counter(name: &str, version: &str, value: &[u8]) -> Resource {
    Resource {
        id: Some(Id {
            uid: "u1".into(),
            name: name.into(),
            r#type: Some(counter_type()),
            tenancy: Some(Tenancy {
                partition: "default".into(),
                namespace: "default".into(),
            }),
        }),
        version: version.into(),
        data: Some(cairn_proto::google::protobuf::Any {
            type_url: "demo/bytes".into(),
            value: bytes::Bytes::copy_from_slice(value),
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_cache_primes_through_the_in_process_client_and_shares_what_it_delivered() {
    // The same `WatchCache` code over the in-process client: primed with what was
    // written before it started, then live changes; a consistent read (WatchProgress
    // on the cache's watch, in process) sees a write acknowledged just before. A
    // subscriber and a reader of the cache hold the very resource the watch delivered
    // (one allocation, not copies). The same cache through a remote client of the
    // same node holds the same.
    let embedded = Embedded::start(1, |_| {}).await;
    embedded.leader().await;
    let node = &embedded.nodes[0];
    let client = node.client();
    for name in ["a", "b", "c"] {
        client.write(counter(name, "", b"0")).await.unwrap();
    }
    let delivered: Arc<Mutex<Vec<Arc<Resource>>>> = Arc::default();
    let record = delivered.clone();
    let cache = WatchCache::start_with(
        client.clone(),
        vec![WatchSpec::new("demo", "Counter")],
        WatchCacheOptions::default(),
        vec![Box::new(move |event: &CacheEvent| {
            record.lock().push(event.resource().clone())
        })],
    )
    .unwrap();
    tokio::time::timeout(WAIT, cache.wait_primed())
        .await
        .expect("primed in time");
    let names = |cache: &WatchCache| -> Vec<String> {
        cache
            .list("demo", "Counter")
            .iter()
            .map(|r| r.id.as_ref().unwrap().name.clone())
            .collect()
    };
    assert_eq!(names(&cache), ["a", "b", "c"]);

    let b = cache.get(&counter("b", "", b"").id.unwrap()).unwrap();
    let updated = client.write(counter("b", &b.version, b"1")).await.unwrap();
    let b_id = updated.id.clone().unwrap();
    // A consistent read asks the node for progress on the cache's watch (in
    // process too): it sees the acknowledged update without waiting for it.
    let cached = cache.get_consistent(&b_id).await.unwrap().unwrap();
    assert_eq!(cached, updated);
    let last_delivered = delivered.lock().last().cloned().unwrap();
    assert!(
        Arc::ptr_eq(&cached, &last_delivered),
        "the subscriber and the cache share one resource"
    );

    let remote = remote(&[node.client_address().to_string()]);
    let remote_cache = WatchCache::start(
        remote,
        vec![WatchSpec::new("demo", "Counter")],
        WatchCacheOptions::default(),
    )
    .unwrap();
    tokio::time::timeout(WAIT, remote_cache.wait_primed())
        .await
        .expect("the remote cache primed in time");
    let c = cache.get(&counter("c", "", b"").id.unwrap()).unwrap();
    let c2 = client.write(counter("c", &c.version, b"2")).await.unwrap();
    let seen = remote_cache.get_consistent(c2.id.as_ref().unwrap()).await;
    assert_eq!(seen.unwrap(), Some(c2));
    assert_eq!(
        remote_cache
            .list_consistent("demo", "Counter")
            .await
            .unwrap(),
        cache.list_consistent("demo", "Counter").await.unwrap()
    );
    drop((cache, remote_cache));
    embedded.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_process_client_bypasses_grants_but_not_the_node_wide_watch_budget() {
    // A node whose client port requires a token: a remote client without one is
    // refused, the in-process client (trusted) is not. Its watches count against
    // `watches_max` like any other: the third of two is ResourceExhausted naming the
    // limit, and closing one frees its slot.
    let token = cairn_server::auth::new_token().unwrap();
    let embedded = Embedded::start(1, |config| {
        config.watches_max = 2;
        config.auth.grants = vec![GrantConfig {
            name: "operators".into(),
            token_sha256: Some(cairn_server::auth::token_sha256_hex(&token)),
            admin: true,
            ..GrantConfig::default()
        }];
    })
    .await;
    embedded.leader().await;
    let node = &embedded.nodes[0];
    let client = node.client();

    let refused = remote(&[node.client_address().to_string()])
        .read(counter("a", "", b"").id.unwrap(), Consistency::Strong)
        .await;
    assert!(
        matches!(refused, Err(ClientError::Unauthenticated(_))),
        "{refused:?}"
    );
    let written = client.write(counter("a", "", b"0")).await.unwrap();
    let read = ResourceApi::read(&client, written.id.clone().unwrap(), Consistency::Strong)
        .await
        .unwrap();
    assert_eq!(read, written);

    let watch = || {
        client.watch_list(WatchListRequest {
            r#type: Some(counter_type()),
            tenancy: Some(Tenancy {
                partition: "*".into(),
                namespace: "*".into(),
            }),
            ..Default::default()
        })
    };
    let first = watch().await.unwrap();
    let _second = watch().await.unwrap();
    match watch().await {
        Err(ClientError::ResourceExhausted { limit, value, .. }) => {
            assert_eq!((limit.as_str(), value), ("watches_max", 2));
        }
        other => panic!("a third watch over watches_max = 2: {other:?}"),
    }
    drop(first);
    let _third = watch().await.expect("a closed watch frees its slot");
    embedded.shutdown().await;
}
