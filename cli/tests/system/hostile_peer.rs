//! Hostile peers on the real peer port of a running cluster: forged Raft
//! messages are refused before openraft sees them, and the cluster keeps its
//! leader and its data. Also: a node whose stored vote is absurd refuses to
//! start, with a clear error, instead of panicking in a loop.
//!
//! The attacker here knows the cluster id (read from a node's status, as an
//! insider could); what stops it is the membership and bounds checks.

use crate::support;

use std::time::{Duration, Instant};

use cairn_proto::v1::raft_service_client::RaftServiceClient;
use cairn_proto::v1::{Consistency, RaftMessage, StatusResponse};
use cairn_server::raft::{LogPayload, NodeId, TypeConfig};
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};
use support::*;

const LEADER_TIMEOUT: Duration = Duration::from_secs(20);

fn encode<T: serde::Serialize>(value: &T) -> bytes::Bytes {
    bincode::serde::encode_to_vec(value, bincode::config::standard())
        .expect("encodes")
        .into()
}

async fn raft_client(peer_address: &str) -> RaftServiceClient<tonic::transport::Channel> {
    RaftServiceClient::connect(format!("http://{peer_address}"))
        .await
        .expect("the peer port accepts connections")
}

async fn status_of(cluster: &Cluster, id: u64) -> StatusResponse {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(s) = cluster.status(id).await {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "node {id} does not answer status"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends a Vote as `sender` with `cluster_id` to `peer_address`.
async fn send_vote(
    peer_address: &str,
    cluster_id: &str,
    sender: NodeId,
    term: u64,
) -> Result<RaftMessage, tonic::Status> {
    let vote: VoteRequest<NodeId> = VoteRequest::new(Vote::new(term, sender), None);
    raft_client(peer_address)
        .await
        .vote(RaftMessage {
            cluster_id: cluster_id.to_string(),
            payload: encode(&vote),
            sender_node_id: sender,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

/// Waits until every node has applied the leader's last index, and returns
/// the leader's status then.
async fn settled(cluster: &Cluster, leader: u64) -> StatusResponse {
    let s = status_of(cluster, leader).await;
    for id in cluster.ids() {
        assert!(
            cluster
                .wait_applied(id, s.last_log_index, Duration::from_secs(10))
                .await,
            "node {id} never applied index {}",
            s.last_log_index
        );
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_append_entries_from_a_made_up_leader_is_refused_and_nothing_forged_is_committed()
{
    // One AppendEntries from "node 9, term + 1000", carrying a write, sent to
    // both followers with the right cluster id and a prev_log_id that matches
    // their logs, then again once they have asked the members they know about node 9.
    // Node 9 is no member: both refuse it each time, and no member vouches for it; no
    // node ever holds the forged resource; the term does not move and the leader stays.
    let cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let leader_address = cluster.node(leader).client_address.clone();
    write(&leader_address, thing("genuine", "u1", "", b"ok"))
        .await
        .unwrap();
    let before = settled(&cluster, leader).await;
    let forged_term = before.term + 1000;
    let forged_index = before.last_log_index + 1;
    let forged_command = cairn_fsm::Command::Write {
        resource: thing("forged", "u9", "", b"evil"),
    };
    let forged_log_id = LogId::new(CommittedLeaderId::new(forged_term, 9), forged_index);
    let request = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(forged_term, 9),
        prev_log_id: Some(LogId::new(
            CommittedLeaderId::new(before.term, leader),
            before.last_log_index,
        )),
        entries: vec![Entry {
            log_id: forged_log_id,
            payload: EntryPayload::Normal(LogPayload(forged_command.encode())),
        }],
        leader_commit: Some(forged_log_id),
    };
    for attempt in 0..2 {
        for follower in cluster.ids_except(leader).into_iter() {
            let answer = raft_client(&cluster.node(follower).peer_address)
                .await
                .append_entries(RaftMessage {
                    cluster_id: before.cluster_id.clone(),
                    payload: encode(&request),
                    sender_node_id: 9,
                    ..Default::default()
                })
                .await;
            let status = answer.expect_err("a made-up leader's AppendEntries is refused");
            // Refused for now: the follower asks the members it knows whether node 9 joined.
            assert_eq!(
                status.code(),
                tonic::Code::Unavailable,
                "attempt {attempt}, follower {follower}: {status:?}"
            );
            assert!(
                status
                    .message()
                    .contains("node 9 is not in this node's membership"),
                "{status:?}"
            );
        }
        // Time for a round of questions (at most one a second).
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    // Give a forged commit every chance to show up.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for id in cluster.ids() {
        let address = cluster.node(id).client_address.clone();
        let r = read(&address, "forged", Consistency::Eventual).await;
        assert!(
            matches!(r, Err(cairn_proto::error::ApiError::NotFound)),
            "node {id} holds the forged resource: {r:?}"
        );
        let s = status_of(&cluster, id).await;
        assert!(s.term < forged_term, "node {id} adopted the forged term");
    }
    let strong = read(&leader_address, "forged", Consistency::Strong).await;
    assert!(
        matches!(strong, Err(cairn_proto::error::ApiError::NotFound)),
        "{strong:?}"
    );
    assert_eq!(cluster.leader().await, Some(leader), "the leader stays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vote_with_the_largest_term_is_refused_and_the_cluster_keeps_its_leader() {
    // A Vote with term 2^64 - 1, from a real member's id with the right
    // cluster id, sent to every node. Accepted, it would be saved and the
    // next election would overflow the term (a panic on every restart). It
    // is refused as malformed; the leader stays and keeps serving writes.
    let cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let before = settled(&cluster, leader).await;
    for target in cluster.ids() {
        let sender = cluster.ids().into_iter().find(|id| *id != target).unwrap();
        let answer = send_vote(
            &cluster.node(target).peer_address,
            &before.cluster_id,
            sender,
            u64::MAX,
        )
        .await;
        let status = answer.expect_err("a vote with term 2^64-1 is refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains("term"), "{}", status.message());
    }
    // Several election timeouts later: same leader, same term, still writable.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(cluster.leader().await, Some(leader));
    for id in cluster.ids() {
        let s = status_of(&cluster, id).await;
        assert_eq!(s.term, before.term, "node {id} changed term");
    }
    write(
        &cluster.node(leader).client_address,
        thing("after", "u1", "", b"ok"),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vote_with_an_empty_or_wrong_cluster_id_is_refused_without_revealing_the_id() {
    // Votes with a plausible term from a real member id, but an empty or a
    // wrong cluster id: refused with PERMISSION_DENIED, and neither the
    // message nor the details carry the cluster's id. A vote from a node id
    // outside the membership is refused too.
    let cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let before = settled(&cluster, leader).await;
    let cluster_id = before.cluster_id.clone();
    assert!(!cluster_id.is_empty());
    let target = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let peer = cluster.node(target).peer_address.clone();
    for wrong in ["", "0123456789abcdef0123456789abcdef", "x"] {
        let status = send_vote(&peer, wrong, leader, before.term + 1)
            .await
            .expect_err("a vote with a wrong cluster id is refused");
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
        assert!(
            !status.message().contains(&cluster_id),
            "the refusal reveals the id: {}",
            status.message()
        );
        let details = String::from_utf8_lossy(status.details()).to_string();
        assert!(!details.contains(&cluster_id));
        let metadata = format!("{:?}", status.metadata());
        assert!(!metadata.contains(&cluster_id));
    }
    let status = send_vote(&peer, &cluster_id, 9, before.term + 1)
        .await
        .expect_err("a vote from a non-member is refused");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    // None of this disturbed the cluster.
    assert_eq!(cluster.leader().await, Some(leader));
    assert_eq!(status_of(&cluster, target).await.term, before.term);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_stored_vote_is_absurd_starts_with_a_clear_error() {
    // A data dir holding a vote with term 2^64 - 1 (as a node that accepted
    // such a vote before the bounds existed would have): the node exits at
    // once with an error naming the vote and what to do, instead of panicking
    // at its first election and again after every restart.
    let mut cluster = Cluster::start(options(1));
    cluster.wait_for_leader(LEADER_TIMEOUT).await;
    cluster.stop(1);
    let data_dir = cluster.node(1).data_dir.clone();
    {
        use openraft::storage::RaftLogStorage;
        let mut log = cairn_server::raft::LogStore::open(
            &cairn_server::raft::log_dir(&data_dir),
            Default::default(),
        )
        .expect("the stopped node's log opens");
        log.save_vote(&Vote::new(u64::MAX, 1)).await.unwrap();
    }
    cluster.spawn(1);
    let deadline = Instant::now() + Duration::from_secs(20);
    while cluster.is_running(1) {
        assert!(
            Instant::now() < deadline,
            "the node kept running on an absurd vote; log:\n{}",
            cluster.log_of(1)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = cluster.log_of(1);
    assert!(
        log.contains("the vote stored in this node's Raft log has term 18446744073709551615"),
        "no clear error in the log:\n{log}"
    );
    assert!(!log.contains("panicked"), "the node panicked:\n{log}");
}
