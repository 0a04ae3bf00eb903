//! Cluster behaviour of real `cairn` processes on loopback: bootstrap,
//! leader failure, catch-up through snapshots, membership changes and whole
//! cluster restarts. Every test kills its processes when it ends.

use crate::support;

use std::time::{Duration, Instant};

use cairn_proto::error::ApiError;
use cairn_proto::v1::Consistency;
use support::*;

const LEADER_TIMEOUT: Duration = Duration::from_secs(20);

/// Starts a node that joins through the client address `via`, and waits until node `at`
/// counts it a voter; returns its id.
async fn join_as_voter(cluster: &mut Cluster, at: u64, via: &str) -> u64 {
    let id = cluster.add_joining_node(via);
    assert!(
        cluster.wait_voter(at, id, Duration::from_secs(30)).await,
        "node {id} never became a voter: {:?}",
        cluster.status(at).await
    );
    id
}

/// Waits until node `id` has applied node `leader`'s log as it stands now.
async fn assert_catches_up_with(cluster: &Cluster, id: u64, leader: u64) {
    let last = cluster.status(leader).await.unwrap().last_log_index;
    assert!(
        cluster
            .wait_applied(id, last, Duration::from_secs(30))
            .await,
        "node {id} never applied index {last} from node {leader}: {}",
        cluster.log_of(id)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_node_bootstrap_and_a_write_is_readable_on_every_node() {
    // Three fresh nodes elect a leader; a write acknowledged by the leader is
    // then readable (eventually) on every node, with the same version.
    let cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let written = write(
        &cluster.node(leader).client_address,
        thing("hello", "u1", "", b"world"),
    )
    .await
    .unwrap();
    assert!(!written.version.is_empty());
    for id in cluster.ids() {
        let address = cluster.node(id).client_address.clone();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match read(&address, "hello", Consistency::Eventual).await {
                Ok(r) => {
                    assert_eq!(r.version, written.version, "node {id}");
                    assert_eq!(r.data.unwrap().value.as_ref(), b"world");
                    break;
                }
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("node {id} never saw the write: {e}"),
            }
        }
    }
    // The strong read at the leader sees it at once.
    let strong = read(
        &cluster.node(leader).client_address,
        "hello",
        Consistency::Strong,
    )
    .await
    .unwrap();
    assert_eq!(strong.version, written.version);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_elects_another_and_loses_no_acknowledged_write() {
    // Writes are acknowledged, the leader is killed with SIGKILL, a new leader
    // takes over, writes continue, and every acknowledged write is still there.
    let mut cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let mut acknowledged = vec![];
    for i in 0..50 {
        let name = format!("before-{i:03}");
        if create_anywhere(&cluster, &name, b"x", Duration::from_secs(10))
            .await
            .unwrap()
        {
            acknowledged.push(name);
        }
    }
    let killed_at = Instant::now();
    cluster.kill(leader);
    let survivors: Vec<u64> = cluster.ids_except(leader);
    assert!(
        create_anywhere(&cluster, "after-000", b"x", Duration::from_secs(30))
            .await
            .unwrap()
    );
    println!(
        "failover: kill -9 of the leader to the first acknowledged write took {:?}",
        killed_at.elapsed()
    );
    acknowledged.push("after-000".into());
    for i in 1..20 {
        let name = format!("after-{i:03}");
        if create_anywhere(&cluster, &name, b"x", Duration::from_secs(10))
            .await
            .unwrap()
        {
            acknowledged.push(name);
        }
    }
    let new_leader = cluster
        .wait_for_leader_among(&survivors, LEADER_TIMEOUT)
        .await;
    let all = list(
        &cluster.node(new_leader).client_address,
        Consistency::Strong,
    )
    .await
    .unwrap();
    let names: std::collections::BTreeSet<String> =
        all.into_iter().map(|r| r.id.unwrap().name).collect();
    for name in &acknowledged {
        assert!(names.contains(name), "acknowledged write {name} lost");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_after_compaction_catches_up_through_a_snapshot() {
    // Node 3 is stopped, 10,000 writes happen and the log is compacted behind a
    // snapshot; restarted, node 3 installs the snapshot and serves the same data.
    let mut options = options(3);
    options.snapshot_log_entries = 1000;
    let mut cluster = Cluster::start(options);
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let lagging = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    cluster.stop(lagging);
    let leader_address = cluster.node(leader).client_address.clone();
    // Writes in rounds until the leader has snapshotted and purged its log
    // (how many writes that takes depends on how many share an entry).
    let round_writes = 2_000usize;
    let mut total = 0usize;
    for round in 0..20usize {
        total += round_writes;
        let mut tasks = tokio::task::JoinSet::new();
        for worker in 0..32usize {
            let address = leader_address.clone();
            tasks.spawn(async move {
                let c = client(&address).await;
                for i in (worker..round_writes).step_by(32) {
                    let mut c = c.clone();
                    let name = format!("r-{round:02}-{i:05}");
                    c.write(cairn_proto::v1::WriteRequest {
                        fence: None,
                        resource: Some(thing(&name, "u1", "", &[7u8; 64])),
                    })
                    .await
                    .unwrap_or_else(|e| panic!("write {name}: {e}"));
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
        let status = cluster.status(leader).await.unwrap();
        if status.purged_index > 0 {
            break;
        }
    }
    let status = cluster.status(leader).await.unwrap();
    assert!(
        status.snapshot_index > 0,
        "the leader built no snapshot: {status:?}"
    );
    assert!(
        status.purged_index > 0,
        "the leader purged no log: {status:?}"
    );
    cluster.spawn(lagging);
    let expected = names_on(&leader_address).await.unwrap();
    assert_eq!(expected.len(), total);
    wait_converged(&cluster, &[lagging], &expected, Duration::from_secs(60)).await;
    let s = cluster.status(lagging).await.unwrap();
    assert!(
        s.snapshot_index > 0,
        "node {lagging} caught up without a snapshot: {s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_compacted_by_size_long_before_the_entry_count() {
    // 48 writes of 64 KiB are 3 MiB of log in 48 entries: far below the
    // 20,000-entry count, three times the 1 MiB byte budget. The leader must
    // snapshot on size, and every node still serves every write.
    let mut options = options(3);
    options.snapshot_log_entries = 20_000;
    options.extra_args = vec!["--snapshot-log-bytes".into(), "1048576".into()];
    let cluster = Cluster::start(options);
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let leader_address = cluster.node(leader).client_address.clone();
    let mut c = client(&leader_address).await;
    for i in 0..48usize {
        let name = format!("big-{i:02}");
        c.write(cairn_proto::v1::WriteRequest {
            fence: None,
            resource: Some(thing(&name, "u1", "", &[7u8; 64 * 1024])),
        })
        .await
        .unwrap_or_else(|e| panic!("write {name}: {e}"));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        let status = cluster.status(leader).await.unwrap();
        if status.snapshot_index > 0 || tokio::time::Instant::now() > deadline {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        status.snapshot_index > 0 && status.snapshot_index < 20_000,
        "no snapshot after 3 MiB of log with a 1 MiB budget: {status:?}"
    );
    let expected = names_on(&leader_address).await.unwrap();
    assert_eq!(expected.len(), 48);
    wait_converged(&cluster, &cluster.ids(), &expected, Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_survive_two_failures_and_both_catch_up() {
    // With two of five nodes killed the cluster keeps accepting writes; the two
    // come back and converge on the same data.
    let mut cluster = Cluster::start(options(5));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let victims: Vec<u64> = cluster.ids_except(leader).into_iter().take(2).collect();
    for v in &victims {
        cluster.kill(*v);
    }
    for i in 0..100 {
        assert!(create_anywhere(
            &cluster,
            &format!("k-{i:03}"),
            b"x",
            Duration::from_secs(20)
        )
        .await
        .unwrap());
    }
    for v in &victims {
        cluster.spawn(*v);
    }
    let expected = names_on(&cluster.node(leader).client_address)
        .await
        .unwrap();
    assert_eq!(expected.len(), 100);
    wait_converged(&cluster, &cluster.ids(), &expected, Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_add_promote_and_remove_while_serving() {
    // A fourth node joins (learner, then voter), an old voter is removed, and
    // writes keep succeeding throughout.
    let mut cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    assert!(
        create_anywhere(&cluster, "m-0", b"x", Duration::from_secs(10))
            .await
            .unwrap()
    );
    let via = cluster.node(leader).client_address.clone();
    let new_id = join_as_voter(&mut cluster, leader, &via).await;
    assert!(
        create_anywhere(&cluster, "m-1", b"x", Duration::from_secs(10))
            .await
            .unwrap()
    );
    // Remove a voter that is not the leader.
    let removed = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader && *id != new_id)
        .unwrap();
    cluster
        .remove_member(removed, Duration::from_secs(20))
        .await
        .unwrap();
    cluster.kill(removed);
    assert!(
        create_anywhere(&cluster, "m-2", b"x", Duration::from_secs(10))
            .await
            .unwrap()
    );
    let s = cluster.status(leader).await.unwrap();
    assert!(
        !s.members.iter().any(|m| m.id == removed),
        "node {removed} still a member: {s:?}"
    );
    let expected: Vec<String> = vec!["m-0".into(), "m-1".into(), "m-2".into()];
    wait_converged(
        &cluster,
        &[leader, new_id],
        &expected,
        Duration::from_secs(20),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_the_whole_cluster_after_kill_loses_nothing() {
    // Every node is killed with SIGKILL at once and started again: every
    // acknowledged write is still there (it was fsynced on a majority).
    let mut cluster = Cluster::start(options(3));
    cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let mut acknowledged = vec![];
    for i in 0..200 {
        let name = format!("w-{i:03}");
        if create_anywhere(&cluster, &name, b"x", Duration::from_secs(10))
            .await
            .unwrap()
        {
            acknowledged.push(name);
        }
    }
    for id in cluster.ids() {
        cluster.kill(id);
    }
    for id in cluster.ids() {
        cluster.spawn(id);
    }
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let names = names_on_strong(&cluster.node(leader).client_address).await;
    for name in &acknowledged {
        assert!(
            names.contains(name),
            "acknowledged write {name} lost after a full restart"
        );
    }
}

async fn names_on_strong(address: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match list(address, Consistency::Strong).await {
            Ok(l) => return l.into_iter().map(|r| r.id.unwrap().name).collect(),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("strong list failed: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_node_is_refused_until_it_is_re_added_explicitly() {
    // A follower loses its data dir: restarted with the same bootstrap config it
    // refuses to start (it could otherwise vote without the acknowledged writes);
    // removed and started again with --join, it comes back with all the data.
    let mut cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    for i in 0..5 {
        assert!(
            create_anywhere(&cluster, &format!("p-{i}"), b"x", Duration::from_secs(10))
                .await
                .unwrap()
        );
    }
    let wiped = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    cluster.kill(wiped);
    std::fs::remove_dir_all(&cluster.node(wiped).data_dir).unwrap();
    cluster.spawn(wiped);
    let deadline = Instant::now() + Duration::from_secs(20);
    while cluster.is_running(wiped) {
        assert!(Instant::now() < deadline, "the wiped node kept running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = cluster.log_of(wiped);
    assert!(
        log.contains("already a member") && log.contains("--join"),
        "unclear refusal: {log}"
    );

    let via = cluster.node(leader).client_address.clone();
    cluster
        .remove_member(wiped, Duration::from_secs(20))
        .await
        .unwrap();
    std::fs::remove_dir_all(&cluster.node(wiped).data_dir).ok();
    cluster
        .nodes
        .iter_mut()
        .find(|n| n.id == wiped)
        .unwrap()
        .bootstrap = vec!["--join".into(), via.clone()];
    cluster.spawn(wiped);
    let expected: Vec<String> = (0..5).map(|i| format!("p-{i}")).collect();
    wait_converged(&cluster, &[wiped], &expected, Duration::from_secs(30)).await;
    // Promotion follows the catch-up: wait for it.
    assert!(
        cluster
            .wait_voter(leader, wiped, Duration::from_secs(20))
            .await,
        "not a voter again: {:?}",
        cluster.status(leader).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_transfer_hands_leadership_to_the_chosen_voter() {
    // TransferLeader{to} makes the chosen, up-to-date voter the leader, and the
    // cluster keeps accepting writes afterwards.
    let cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    assert!(
        create_anywhere(&cluster, "t-0", b"x", Duration::from_secs(10))
            .await
            .unwrap()
    );
    let target = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let mut admin = cairn_proto::v1::admin_service_client::AdminServiceClient::connect(format!(
        "http://{}",
        cluster.node(leader).client_address
    ))
    .await
    .unwrap();
    let started = Instant::now();
    admin
        .transfer_leader(cairn_proto::v1::TransferLeaderRequest { to: target })
        .await
        .unwrap();
    println!(
        "leader transfer {leader} -> {target} took {:?}",
        started.elapsed()
    );
    assert_eq!(cluster.wait_for_leader(LEADER_TIMEOUT).await, target);
    assert!(
        create_anywhere(&cluster, "t-1", b"x", Duration::from_secs(10))
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_on_a_follower_ends_its_leaders_stream_and_every_task_when_told() {
    // A follower's peer port holds its leader's AppendEntries stream open; a graceful stop
    // ends that stream, so the port's shutdown does not wait for the deadline.
    let mut cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    assert!(
        create_anywhere(&cluster, "f-0", b"x", Duration::from_secs(10))
            .await
            .unwrap()
    );
    let follower = cluster.ids_except(leader)[0];
    cluster.stop(follower);
    let log = cluster.log_of(follower);
    assert!(!log.contains("did not stop in time"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_the_watches_and_keep_alive_streams_it_serves_with_a_reason() {
    // Streams a node holds open for its clients end when it stops, each with the error that
    // tells its client what to do (the contract's WatchClosed: re-list elsewhere; UNAVAILABLE:
    // retry elsewhere), instead of holding the shutdown until its deadline and then being
    // cut with the connection.
    let mut cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    assert!(
        create_anywhere(&cluster, "w-0", b"x", Duration::from_secs(10))
            .await
            .unwrap()
    );
    let follower = cluster.ids_except(leader)[0];
    let address = cluster.node(follower).client_address.clone();
    let mut watch = client(&address)
        .await
        .watch_list(cairn_proto::v1::WatchListRequest {
            r#type: Some(thing_type()),
            tenancy: Some(any_tenancy()),
            ..Default::default()
        })
        .await
        .expect("a watch")
        .into_inner();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.message())
            .await
            .expect("the watch's snapshot within 10 s")
            .expect("the watch's snapshot")
            .expect("the watch is open");
        if matches!(
            event.event,
            Some(cairn_proto::v1::watch_event::Event::EndOfSnapshot(_))
        ) {
            break;
        }
    }
    let lease = grant_lease(&address, 30_000).await;
    let (requests, mut answers) = keep_alive_stream(&address).await;
    requests
        .send(cairn_proto::v1::LeaseKeepAliveRequest { id: lease })
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), answers.message())
        .await
        .expect("a keep-alive answer within 10 s");
    assert_eq!(answer.unwrap().unwrap().id, lease);

    cluster.stop(follower);
    let log = cluster.log_of(follower);
    assert!(!log.contains("did not stop in time"), "{log}");
    let ended = watch.message().await;
    match &ended {
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
            assert!(status.message().contains("shutting down"), "{status:?}");
        }
        Ok(_) => panic!("the watch did not end with WatchClosed: {ended:?}"),
    }
    let ended = answers.message().await;
    match &ended {
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            assert!(status.message().contains("shutting down"), "{status:?}");
        }
        Ok(_) => panic!("the keep-alive stream did not end UNAVAILABLE: {ended:?}"),
    }
    drop(requests);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_on_the_leader_hands_off_before_stopping() {
    // A graceful stop of the leader transfers leadership first, so the cluster
    // has a new leader without waiting for an election timeout, and the
    // stopped node stays a member. Every task of the node ends when told to: none is
    // aborted at the deadline.
    let mut cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    assert!(
        create_anywhere(&cluster, "s-0", b"x", Duration::from_secs(10))
            .await
            .unwrap()
    );
    cluster.stop(leader);
    let log = cluster.log_of(leader);
    assert!(log.contains("handed leadership off"), "{log}");
    assert!(!log.contains("did not stop in time"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    let others: Vec<u64> = cluster.ids_except(leader);
    let new_leader = cluster.wait_for_leader_among(&others, LEADER_TIMEOUT).await;
    let s = cluster.status(new_leader).await.unwrap();
    assert!(
        s.members.iter().any(|m| m.id == leader),
        "shutdown changed the membership: {s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_serving_once_a_leader_is_known() {
    // gRPC health answers SERVING for the resource service on every node once
    // the cluster has a leader and the node has caught up.
    let cluster = Cluster::start(options(3));
    cluster.wait_for_leader(LEADER_TIMEOUT).await;
    for id in cluster.ids() {
        let address = format!("http://{}", cluster.node(id).client_address);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let channel = tonic::transport::Endpoint::from_shared(address.clone())
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
            let r = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: "cairn.v1.ResourceService".into(),
                })
                .await
                .unwrap()
                .into_inner();
            if r.status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} never reported SERVING"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_starts_after_the_cluster_took_writes_joins_it() {
    // Two of three bootstrap members form the cluster and take writes before the
    // third process starts (a machine that came up late). The third has an empty
    // data dir and the others have committed data, but it never held a log: it
    // must start, not be refused as a member that lost its data.
    let mut o = options(3);
    o.started_later = vec![3];
    let mut cluster = Cluster::start(o);
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    for i in 0..5 {
        let address = cluster.node(leader).client_address.clone();
        write(&address, thing(&format!("early-{i}"), "u1", "", b"x"))
            .await
            .expect("two of three members take writes");
    }
    assert!(cluster.status(leader).await.unwrap().commit_index > 1);

    cluster.spawn(3);
    let expected: Vec<String> = (0..5).map(|i| format!("early-{i}")).collect();
    wait_converged(&cluster, &[3], &expected, Duration::from_secs(30)).await;
    assert!(
        cluster.is_running(3),
        "node 3 stopped: {}",
        cluster.log_of(3)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joining_under_a_newer_leader_catches_up_from_a_snapshot_older_than_it() {
    // Node 4 joins after the leader compacted its log, installs the leader's snapshot
    // (taken when the members were 1-3), and becomes leader. Node 5 then joins through
    // node 4 and installs that same snapshot: it names members 1-3 and not node 4, its
    // leader. Node 5 must still hear node 4's entries and catch up. (Its peer gate used to
    // hear only the members of the membership it held, and refused its leader forever:
    // found by the soak, seed 1124.)
    let mut o = options(3);
    o.snapshot_log_entries = 100;
    let mut cluster = Cluster::start(o);
    let first = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let address = cluster.node(first).client_address.clone();
    let mut written = 0;
    while cluster.status(first).await.unwrap().purged_index == 0 {
        for _ in 0..10 {
            write(&address, thing(&format!("w-{written:04}"), "u1", "", b"x"))
                .await
                .unwrap();
            written += 1;
        }
        assert!(written < 2_000, "the leader never compacted its log");
    }
    let old_snapshot_index = cluster.status(first).await.unwrap().snapshot_index;
    let four = join_as_voter(&mut cluster, first, &address).await;
    cluster.transfer_leader(four, LEADER_TIMEOUT).await.unwrap();
    assert_eq!(cluster.wait_for_leader(LEADER_TIMEOUT).await, four);
    let s4 = cluster.status(four).await.unwrap();
    assert_eq!(
        s4.snapshot_index, old_snapshot_index,
        "the premise: node 4 still holds the snapshot it installed, from before it joined"
    );

    let via_four = cluster.node(four).client_address.clone();
    let five = cluster.add_joining_node(&via_four);
    assert_catches_up_with(&cluster, five, four).await;
    let expected: Vec<String> = (0..written).map(|i| format!("w-{i:04}")).collect();
    wait_converged(&cluster, &[five], &expected, Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_away_while_a_node_joined_and_took_the_lead_catches_up_from_it() {
    // Without TLS. Node 3 is paused while node 4 joins and becomes leader; when node 3
    // wakes, its membership still names 1-3 and node 4, its leader now, is a stranger to
    // it. Nodes 1 and 2, members it knows, vouch that node 4 is in the cluster, so node 3
    // hears node 4 and catches up. (Its peer gate used to refuse a stranger leader on a
    // plaintext peer port forever: found by the `ci` scenario 09-register-membership-partition.)
    let mut cluster = Cluster::start(options(3));
    let first = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let away = cluster.ids_except(first)[0];
    let address = cluster.node(first).client_address.clone();
    write(&address, thing("before", "u1", "", b"x"))
        .await
        .unwrap();
    cluster.pause(away);
    let four = join_as_voter(&mut cluster, first, &address).await;
    cluster.transfer_leader(four, LEADER_TIMEOUT).await.unwrap();
    let via_four = cluster.node(four).client_address.clone();
    write(&via_four, thing("after", "u1", "", b"x"))
        .await
        .unwrap();
    cluster.resume(away);
    assert_catches_up_with(&cluster, away, four).await;
    let expected = vec!["after".to_string(), "before".to_string()];
    wait_converged(&cluster, &[away], &expected, Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eventual_read_never_goes_back_in_time_across_a_restart_of_its_node() {
    // Node 3 serves an eventual read of the last of 200 writes. Then the whole cluster is
    // killed and node 3 alone comes back: it replays its log only up to the commit index it
    // last persisted, below what it served before. Served from its table at once (as
    // before the fix), its eventual read returned an older version than the one it had
    // already served (the contract's known gap, issue 29). Now it serves eventual reads only
    // after a read index confirmed since its start was applied: alone it has none, so it
    // answers Unavailable ("certainly not served") rather than older state; with the others
    // back it serves the latest version again.
    let mut cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let leader_address = cluster.node(leader).client_address.clone();
    let mut last = write(&leader_address, thing("clock", "", "", b"v0"))
        .await
        .unwrap();
    for i in 1..200 {
        let body = format!("v{i}");
        let uid = last.id.as_ref().unwrap().uid.clone();
        last = write(
            &leader_address,
            thing("clock", &uid, &last.version, body.as_bytes()),
        )
        .await
        .unwrap();
    }
    let node3 = cluster.node(3).client_address.clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match read(&node3, "clock", Consistency::Eventual).await {
            Ok(r) if r.version == last.version => break,
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(20)).await,
            other => panic!("node 3 never served the last write: {other:?}"),
        }
    }
    for id in cluster.ids() {
        cluster.kill(id);
    }
    cluster.spawn(3);
    let served_version = |r: &cairn_proto::v1::Resource| r.version.parse::<u64>().unwrap();
    let started = Instant::now();
    let mut refused = 0;
    while started.elapsed() < Duration::from_secs(5) {
        match read(&node3, "clock", Consistency::Eventual).await {
            Ok(r) => assert!(
                served_version(&r) >= served_version(&last),
                "after its restart node 3 served version {} of clock, older than the {} it \
                 served before",
                r.version,
                last.version
            ),
            Err(ApiError::NotFound) => panic!(
                "after its restart node 3 answered that clock does not exist, older than the \
                 version {} it served before",
                last.version
            ),
            Err(ApiError::Unavailable(why)) if why.contains("caught up") => refused += 1,
            Err(_) => {} // not listening yet
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused > 0, "alone, node 3 refused its eventual reads");
    cluster.spawn(1);
    cluster.spawn(2);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match read(&node3, "clock", Consistency::Eventual).await {
            Ok(r) => {
                assert_eq!(
                    r.version, last.version,
                    "the latest version, once caught up"
                );
                break;
            }
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("node 3 never served eventual reads again: {e}"),
        }
    }
}
