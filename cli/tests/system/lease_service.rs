//! The lease service as a client meets it on a real three-node cluster (raw gRPC, through
//! a follower so that every call is forwarded):
//! - a lease kept alive outlives its TTL many times over, also across a kill of the
//!   leader; once its holder stops, it is revoked within its TTL plus a little, with what
//!   is attached, and watchers see the Delete;
//! - a fenced write of a deposed holder is refused FAILED_PRECONDITION, the new holder's
//!   applies.

use crate::support;

use std::time::{Duration, Instant};

use cairn_proto::error::ApiError;
use cairn_proto::v1::{
    Consistency, Fence, LeaseKeepAliveRequest, LeaseRevokeRequest, LeaseTimeToLiveRequest,
    Reference, WatchListRequest, WriteRequest,
};
use support::*;

const LEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Keeps `id` alive through whichever of `addresses` answers, every `every`, until told to
/// stop; returns how many keep-alives were acknowledged with the lease alive.
fn keep_alive(
    addresses: Vec<String>,
    id: u64,
    every: Duration,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<u64>,
) {
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut acknowledged = 0;
        let mut next = 0usize;
        loop {
            let address = &addresses[next % addresses.len()];
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
            match lease_client(address).keep_alive(stream).await {
                Ok(answers) => {
                    let mut answers = answers.into_inner();
                    loop {
                        if tx.send(LeaseKeepAliveRequest { id }).await.is_err() {
                            break;
                        }
                        match answers.message().await {
                            Ok(Some(answer)) => {
                                assert_eq!(answer.id, id);
                                assert!(answer.ttl_ms > 0, "a kept lease never vanishes");
                                acknowledged += 1;
                            }
                            _ => break,
                        }
                        tokio::select! {
                            _ = &mut stopped => return acknowledged,
                            _ = tokio::time::sleep(every) => {}
                        }
                    }
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
            next += 1;
        }
    });
    (stop, task)
}

fn election(name: &str) -> Reference {
    let id = id(name, "");
    Reference {
        r#type: id.r#type,
        tenancy: id.tenancy,
        name: name.into(),
        section: String::new(),
    }
}

async fn exists(address: &str, name: &str) -> bool {
    read(address, name, Consistency::Strong).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_lease_outlives_its_ttl_and_a_leader_kill_then_expires_with_what_it_holds() {
    let mut cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = cluster.ids_except(leader)[0];
    let through = cluster.node(follower).client_address.clone();
    let ttl_ms = 1_500;
    let lease = grant_lease(&through, ttl_ms).await;
    let mut held = thing("held", "", "", b"x");
    held.lease = lease;
    write(&through, held)
        .await
        .expect("a write attached to the lease");
    let mut watch = client(&through)
        .await
        .watch_list(WatchListRequest {
            r#type: Some(thing_type()),
            tenancy: Some(tenancy()),
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();

    // Kept alive for four TTLs, with the leader killed in the middle.
    let addresses: Vec<String> = cluster
        .ids_except(leader)
        .iter()
        .map(|id| cluster.node(*id).client_address.clone())
        .collect();
    let (stop, keeper) = keep_alive(addresses.clone(), lease, Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(2 * ttl_ms)).await;
    cluster.kill(leader);
    tokio::time::sleep(Duration::from_millis(2 * ttl_ms)).await;
    assert!(
        exists(&addresses[0], "held").await,
        "a lease kept alive outlives a leader kill"
    );
    let _ = stop.send(());
    let acknowledged = keeper.await.unwrap();
    assert!(acknowledged >= 5, "{acknowledged} keep-alives answered");

    // Its holder stopped: gone within its TTL plus an election timeout and a tick.
    let stopped = Instant::now();
    let gone = async {
        while exists(&addresses[0], "held").await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_millis(ttl_ms + 3_000), gone)
        .await
        .expect("the lease expired and took its resource");
    assert!(
        stopped.elapsed() >= Duration::from_millis(ttl_ms - 400),
        "not before its TTL since the last keep-alive ({:?})",
        stopped.elapsed()
    );
    let ttl = lease_client(&addresses[0])
        .time_to_live(LeaseTimeToLiveRequest { id: lease })
        .await
        .unwrap_err();
    assert_eq!(ttl.code(), tonic::Code::NotFound, "{ttl:?}");
    // The watcher saw the Delete.
    let deleted = async {
        loop {
            let event = watch.message().await.expect("watch").expect("event");
            if let Some(cairn_proto::v1::watch_event::Event::Delete(d)) = event.event {
                return d.resource.unwrap().id.unwrap().name;
            }
        }
    };
    let deleted = tokio::time::timeout(Duration::from_secs(5), deleted).await;
    assert_eq!(deleted.ok().as_deref(), Some("held"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_holder_is_fenced_off_and_a_revoke_takes_what_is_attached() {
    let cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = cluster.ids_except(leader)[0];
    let through = cluster.node(follower).client_address.clone();

    // The first holder wins the election "leader" with its lease, and writes fenced.
    let first = grant_lease(&through, 1_000).await;
    let mut campaign = thing("leader", "", "", b"first");
    campaign.lease = first;
    let won = write(&through, campaign)
        .await
        .expect("the first holder wins");
    let first_token: u64 = won.version.parse().unwrap();
    let fenced = |token: u64, name: &str| WriteRequest {
        resource: Some(thing(name, "", "", b"fenced")),
        fence: Some(Fence {
            election: Some(election("leader")),
            token,
        }),
    };
    let mut resources = client(&through).await;
    resources
        .write(fenced(first_token, "by-first"))
        .await
        .expect("the holder's fenced write applies");

    // It pauses past its TTL: the lease expires, a second holder wins.
    let expired = async {
        while exists(&through, "leader").await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), expired)
        .await
        .expect("the first holder's lease expired");
    let second = grant_lease(&through, 10_000).await;
    let mut campaign = thing("leader", "", "", b"second");
    campaign.lease = second;
    let won = write(&through, campaign)
        .await
        .expect("the second holder wins");
    let second_token: u64 = won.version.parse().unwrap();
    assert!(second_token > first_token, "tokens only grow");

    // The first holder wakes up and writes with its old token: refused, nothing applied.
    let refused = resources
        .write(fenced(first_token, "late"))
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        refused
            .message()
            .contains(&format!("held at token {second_token}")),
        "{refused:?}"
    );
    assert!(!exists(&through, "late").await);
    resources
        .write(fenced(second_token, "by-second"))
        .await
        .expect("the new holder's fenced write applies");

    // Revoking the second lease takes the election with it.
    let revoked = lease_client(&through)
        .revoke(LeaseRevokeRequest { id: second })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(revoked.deleted_count, 1);
    assert!(!exists(&through, "leader").await);
    // A write naming a dead lease is refused, naming it.
    let mut orphan = thing("orphan", "", "", b"x");
    orphan.lease = second;
    let error = write(&through, orphan).await.unwrap_err();
    assert!(
        matches!(&error, ApiError::FailedPrecondition(m) if m.contains("does not exist")),
        "{error:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_survives_snapshots_and_a_restart_of_every_node() {
    // Snapshots every 100 entries: the lease and what is attached to it come back from a
    // snapshot when every node is killed and started again, and its holder keeps it.
    let mut options = options(3);
    options.snapshot_log_entries = 100;
    let mut cluster = Cluster::start(options);
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let through = cluster.node(leader).client_address.clone();
    let lease = grant_lease(&through, 30_000).await;
    let mut held = thing("held", "", "", b"x");
    held.lease = lease;
    write(&through, held).await.expect("attached");
    for i in 0..300 {
        write(&through, thing(&format!("filler-{i:03}"), "", "", b"f"))
            .await
            .expect("a filler write");
    }
    let before = lease_client(&through)
        .time_to_live(LeaseTimeToLiveRequest { id: lease })
        .await
        .expect("the lease")
        .into_inner()
        .lease
        .unwrap();
    for id in cluster.ids() {
        cluster.kill(id);
    }
    for id in cluster.ids() {
        cluster.spawn(id);
    }
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let through = cluster.node(leader).client_address.clone();
    let after = lease_client(&through)
        .time_to_live(LeaseTimeToLiveRequest { id: lease })
        .await
        .expect("the lease after the restart")
        .into_inner()
        .lease
        .unwrap();
    assert_eq!(
        (
            after.ttl_ms,
            after.attached_count,
            after.granted_revision,
            after.renewed_revision
        ),
        (
            before.ttl_ms,
            1,
            before.granted_revision,
            before.renewed_revision
        ),
        "the lease comes back exactly"
    );
    assert!(
        after.remaining_ms > 25_000,
        "a restart gives a full TTL: {after:?}"
    );
    let (stop, keeper) = keep_alive(vec![through.clone()], lease, Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = stop.send(());
    assert!(keeper.await.unwrap() >= 1, "kept alive after the restart");
    let revoked = lease_client(&through)
        .revoke(LeaseRevokeRequest { id: lease })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(revoked.deleted_count, 1);
    assert!(!exists(&through, "held").await);
    assert!(exists(&through, "filler-299").await);
}
