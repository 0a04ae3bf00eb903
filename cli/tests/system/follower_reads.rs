//! Strong reads, lists and watches served by followers through a read index
//! (`follower_strong_reads = "read-index"`, the default), with real `cairn`
//! processes: a lagging follower answers with every acknowledged write and
//! forwards nothing; a follower cut off from the leader answers Inconsistent,
//! never what it holds; a STRONG watch snapshot holds what an EVENTUAL one
//! opened at the same moment may lack.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use cairn_client::{Client, ClientError, ClientOptions};
use cairn_proto::v1::{watch_event, Consistency, WatchListRequest};
use jepsen_tests::net::{shapes, NetworkLab};
use support::*;

const LEADER_TIMEOUT: Duration = Duration::from_secs(20);

/// A client bound to node `id` alone: nothing it asks is served elsewhere.
fn client_of(cluster: &Cluster, id: u64, request_timeout: Duration) -> Client {
    Client::new(
        &[cluster.node(id).client_address.clone()],
        ClientOptions {
            request_timeout,
            read_attempt_timeout: request_timeout,
            ..ClientOptions::default()
        },
    )
    .expect("client")
}

/// `GET /metrics` on node `id`'s ops listener.
fn scrape(cluster: &Cluster, id: u64) -> String {
    use std::io::{Read, Write};
    let address = cluster
        .node(id)
        .metrics_address
        .clone()
        .expect("metrics are on");
    let mut stream = std::net::TcpStream::connect(&address).expect("connect to /metrics");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// The calls node `id` sent to the leader for `method` (`read`, `list`, `read_index`).
fn forwarded_calls(cluster: &Cluster, id: u64, method: &str) -> f64 {
    let label = format!("method=\"{method}\"");
    scrape(cluster, id)
        .lines()
        .filter(|l| l.starts_with("cairn_forwarding_calls_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// A follower of `cluster` (not `leader`).
fn a_follower(cluster: &Cluster, leader: u64) -> u64 {
    cluster.ids_except(leader)[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_follower_serves_strong_reads_and_lists_of_every_acknowledged_write_itself() {
    // One follower is paused while the leader acknowledges 200 writes, then
    // resumed: at once, its strong read of the last write and its strong list
    // hold every one of them, and it forwarded no read and no list (it asked
    // the leader for read indexes only).
    let mut o = options(3);
    o.metrics = true;
    let mut cluster = Cluster::start(o);
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = a_follower(&cluster, leader);
    let at_leader = client_of(&cluster, leader, Duration::from_secs(10));
    let at_follower = client_of(&cluster, follower, Duration::from_secs(10));
    at_leader
        .write(thing("warm-up", "u0", "", b"x"))
        .await
        .unwrap();
    at_follower
        .read(id("warm-up", ""), Consistency::Strong)
        .await
        .expect("the follower serves strong reads");

    cluster.pause(follower);
    let mut last = None;
    for i in 0..200 {
        last = Some(
            at_leader
                .write(thing(&format!("r{i:03}"), "u1", "", b"x"))
                .await
                .unwrap(),
        );
    }
    let last = last.unwrap();
    let behind = cluster.status(leader).await.unwrap().last_log_index;
    cluster.resume(follower);

    let read = at_follower
        .read(id("r199", ""), Consistency::Strong)
        .await
        .expect("a strong read on the follower");
    assert_eq!(read.version, last.version, "the last acknowledged write");
    let listed = at_follower
        .list(thing_type(), tenancy(), "r", Consistency::Strong)
        .await
        .expect("a strong list on the follower");
    assert_eq!(listed.resources.len(), 200, "every acknowledged write");
    assert!(listed.revision >= behind);
    println!(
        "follower {follower}: read indexes asked {}, reads forwarded {}, lists forwarded {}",
        forwarded_calls(&cluster, follower, "read_index"),
        forwarded_calls(&cluster, follower, "read"),
        forwarded_calls(&cluster, follower, "list"),
    );
    assert!(forwarded_calls(&cluster, follower, "read_index") >= 3.0);
    assert_eq!(forwarded_calls(&cluster, follower, "read"), 0.0);
    assert_eq!(forwarded_calls(&cluster, follower, "list"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_forwarding_configured_a_follower_sends_strong_reads_to_the_leader() {
    // `follower_strong_reads = "forward"`: the same strong read is answered,
    // by the leader: one forwarded read, no read index.
    let mut o = options(3);
    o.metrics = true;
    o.env = vec![("CAIRN_FOLLOWER_STRONG_READS".into(), "forward".into())];
    let cluster = Cluster::start(o);
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = a_follower(&cluster, leader);
    let written = client_of(&cluster, leader, Duration::from_secs(10))
        .write(thing("a", "u1", "", b"x"))
        .await
        .unwrap();
    let at_follower = client_of(&cluster, follower, Duration::from_secs(10));
    // An eventual read first: it is served once the follower has caught up since its start
    // (one read index, asked at the start), so the count below is the strong read's alone.
    // Eventual: the follower may not have applied the write yet, so it is asked until it has.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match at_follower.read(id("a", ""), Consistency::Eventual).await {
            Ok(_) => break,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("an eventual read on the follower once it caught up: {e}"),
        }
    }
    let read_indexes_before = forwarded_calls(&cluster, follower, "read_index");
    let read = at_follower
        .read(id("a", ""), Consistency::Strong)
        .await
        .unwrap();
    assert_eq!(read.version, written.version);
    assert_eq!(forwarded_calls(&cluster, follower, "read"), 1.0);
    assert_eq!(
        forwarded_calls(&cluster, follower, "read_index"),
        read_indexes_before,
        "a forwarded strong read asks no read index"
    );
}

/// A cluster in network namespaces, so that one node can be cut off from the others
/// (the test's clients reach every node through the bridge, never partitioned).
fn partitionable_cluster(test: &str) -> Option<(Cluster, Arc<NetworkLab>)> {
    if let Some(reason) = jepsen_tests::net::unavailable_reason() {
        println!("SKIPPED {test}: {reason}");
        eprintln!("SKIPPED {test}: {reason}");
        assert!(
            std::env::var("CI").is_err(),
            "{test} cannot be skipped under CI=true"
        );
        return None;
    }
    let lab = Arc::new(NetworkLab::new().expect("network lab"));
    let mut o = options(3);
    o.network = Some(lab.clone());
    Some((Cluster::start(o), lab))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_from_the_leader_answers_strong_requests_inconsistent() {
    // With the follower isolated, a strong read, list or watch sent to it
    // fails with Inconsistent within the request's deadline; an eventual read
    // is still served from what it holds.
    let Some((cluster, lab)) = partitionable_cluster(
        "a_follower_cut_off_from_the_leader_answers_strong_requests_inconsistent",
    ) else {
        return;
    };
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = a_follower(&cluster, leader);
    let written = client_of(&cluster, leader, Duration::from_secs(10))
        .write(thing("a", "u1", "", b"x"))
        .await
        .unwrap();
    let at_follower = client_of(&cluster, follower, Duration::from_secs(3));
    at_follower
        .read(id("a", ""), Consistency::Strong)
        .await
        .expect("before the partition");

    lab.partition(&shapes::isolate(follower, &cluster.ids()))
        .expect("partition");
    match at_follower.read(id("a", ""), Consistency::Strong).await {
        Err(ClientError::Inconsistent { .. }) => {}
        other => panic!("strong read: expected Inconsistent, got {other:?}"),
    }
    match at_follower
        .list(thing_type(), tenancy(), "", Consistency::Strong)
        .await
    {
        Err(ClientError::Inconsistent { .. }) => {}
        other => panic!("strong list: expected Inconsistent, got {other:?}"),
    }
    let strong_watch = WatchListRequest {
        r#type: Some(thing_type()),
        tenancy: Some(tenancy()),
        consistency: Consistency::Strong as i32,
        ..Default::default()
    };
    // A watch carries no gRPC deadline (it would end the stream): the node gives its
    // confirmation its own request timeout (5 s), so this client waits longer than that.
    let patient = client_of(&cluster, follower, Duration::from_secs(8));
    match patient.watch_list(strong_watch).await {
        Err(ClientError::Inconsistent { .. }) => {}
        Err(other) => panic!("strong watch: expected Inconsistent, got {other:?}"),
        Ok(_) => panic!("strong watch: expected Inconsistent, it opened"),
    }
    let eventual = at_follower
        .read(id("a", ""), Consistency::Eventual)
        .await
        .expect("eventual reads are served from what the follower holds");
    assert_eq!(eventual.version, written.version);
    lab.heal().expect("heal");
}

/// The names in the snapshot of a watch on `client`, and its EndOfSnapshot revision.
async fn snapshot_of(client: &Client, consistency: Consistency) -> (Vec<String>, u64) {
    let request = WatchListRequest {
        r#type: Some(thing_type()),
        tenancy: Some(tenancy()),
        consistency: consistency as i32,
        ..Default::default()
    };
    let mut stream = client.watch_list(request).await.expect("watch opens");
    let mut names = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("an event within 10 s")
            .expect("the stream stays open")
            .expect("no watch error");
        match event.event.expect("an event") {
            watch_event::Event::Upsert(u) => names.push(u.resource.unwrap().id.unwrap().name),
            watch_event::Event::EndOfSnapshot(_) => return (names, event.revision),
            other => panic!("unexpected {other:?} in a snapshot"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strong_watch_on_a_lagging_follower_holds_a_write_an_eventual_one_lacks() {
    // The follower is cut off while the leader acknowledges a write. An
    // EVENTUAL watch opened on it then starts from a snapshot without that
    // write; a STRONG one opened at the same moment waits for a read index
    // (the partition heals a second later) and its snapshot holds the write.
    let Some((cluster, lab)) = partitionable_cluster(
        "a_strong_watch_on_a_lagging_follower_holds_a_write_an_eventual_one_lacks",
    ) else {
        return;
    };
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = a_follower(&cluster, leader);
    let at_leader = client_of(&cluster, leader, Duration::from_secs(10));
    at_leader
        .write(thing("before", "u1", "", b"x"))
        .await
        .unwrap();
    let at_follower = client_of(&cluster, follower, Duration::from_secs(10));
    at_follower
        .read(id("before", ""), Consistency::Strong)
        .await
        .unwrap();

    lab.partition(&shapes::isolate(follower, &cluster.ids()))
        .expect("partition");
    at_leader
        .write(thing("during", "u1", "", b"x"))
        .await
        .unwrap();
    let (eventual, eventual_revision) = snapshot_of(&at_follower, Consistency::Eventual).await;
    let strong = tokio::spawn({
        let at_follower = at_follower.clone();
        async move { snapshot_of(&at_follower, Consistency::Strong).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    lab.heal().expect("heal");
    let (strong, strong_revision) = strong.await.expect("strong watch task");
    println!(
        "eventual snapshot at {eventual_revision}: {eventual:?}; strong snapshot at {strong_revision}: {strong:?}"
    );
    assert_eq!(eventual, vec!["before".to_string()], "the follower lagged");
    assert_eq!(
        strong,
        vec!["before".to_string(), "during".to_string()],
        "a strong snapshot holds every write acknowledged before the watch opened"
    );
    assert!(strong_revision > eventual_revision);
}
