//! The lease handle's rule and its keeper, without a cluster:
//! - the rule of when a holder holds its lease ([`lease_state_after`]), as a table;
//! - a [`Lease`] against in-process fake lease services (`FakeLeaseNode`, answering as
//!   told): kept alive a third of its TTL apart, lost at once when a keep-alive says the
//!   lease is gone, lost no later than the last acknowledged keep-alive's sending plus
//!   the TTL when the cluster goes silent, moved to another node when one refuses or is
//!   down, revoked on drop and left alone when detached.
//!
//! The real service (expiry on the leader, attached resources deleted, elections and
//! fencing) is tested end to end in `cli/tests/system/leases.rs`.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_client::lease::{lease_state_after, KeepAliveAnswer, KeepAlivePacing};
use cairn_client::{Client, ClientOptions, Lease, LeaseLoss, LeaseState};
use cairn_proto::error::ApiError;
use cairn_proto::v1::lease_service_server::{LeaseService, LeaseServiceServer};
use cairn_proto::v1::*;
use futures::Stream;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tonic::{Request, Response, Status, Streaming};

// ------------------------------------------------------------- the rule ----

#[test]
fn the_holder_holds_its_lease_until_the_last_acknowledged_send_plus_the_ttl() {
    // Times are milliseconds after `t0`; the lease's TTL is 1000 ms and it is held until
    // 1000 (granted, sent at 0) unless the row says otherwise.
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let ttl = Duration::from_secs(1);
    let held = |until_ms| LeaseState::Held {
        until: at(until_ms),
    };
    let unconfirmed = LeaseState::Lost(LeaseLoss::Unconfirmed { ttl_ms: 1000 });
    let answer = |sent_ms, ttl_ms| {
        Some(KeepAliveAnswer {
            sent_at: at(sent_ms),
            ttl_ms,
        })
    };
    #[rustfmt::skip]
    let rows: Vec<(&str, LeaseState, Option<KeepAliveAnswer>, u64, LeaseState)> = vec![
        ("time passes within the TTL", held(1000), None, 999, held(1000)),
        ("the deadline is reached", held(1000), None, 1000, unconfirmed.clone()),
        ("an answer extends from its send time, not its arrival", held(1000), answer(300, 1000), 900, held(1300)),
        ("a late answer to an old keep-alive never shortens", held(1300), answer(100, 1000), 900, held(1300)),
        ("an answer after the deadline saves nothing", held(1000), answer(900, 1000), 1001, unconfirmed.clone()),
        ("TTL 0: the cluster says the lease is gone", held(1000), answer(300, 0), 400, LeaseState::Lost(LeaseLoss::Gone)),
        ("the TTL the cluster answers counts", held(1000), answer(300, 5000), 400, held(5300)),
        ("lost stays lost, whatever comes", LeaseState::Lost(LeaseLoss::Gone), answer(300, 1000), 400, LeaseState::Lost(LeaseLoss::Gone)),
        ("revoked stays revoked", LeaseState::Lost(LeaseLoss::Revoked), None, 5000, LeaseState::Lost(LeaseLoss::Revoked)),
    ];
    for (what, state, answer, now_ms, expected) in rows {
        assert_eq!(
            lease_state_after(&state, answer, ttl, at(now_ms)),
            expected,
            "{what}"
        );
    }
}

#[test]
fn keep_alives_go_three_per_ttl() {
    // Two keep-alives may be lost before the lease is.
    let pacing = KeepAlivePacing::for_ttl(Duration::from_millis(900));
    assert_eq!(pacing.interval, Duration::from_millis(300));
    assert_eq!(pacing.answer_wait, Duration::from_millis(300));
}

// ------------------------------------------------------ a fake service ----

/// How a [`FakeLeaseNode`] answers keep-alives.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum Mode {
    /// With the lease's TTL.
    Answer = 0,
    /// With TTL 0: no such lease.
    Gone = 1,
    /// Not at all (the stream stays open).
    Silent = 2,
    /// The stream is refused at once (UNAVAILABLE, as a node with no leader).
    Refuse = 3,
}

#[derive(Default)]
struct Shared {
    mode: AtomicU8,
    next_id: AtomicU64,
    /// When each keep-alive arrived, and whether it was answered with a TTL.
    keep_alives: Mutex<Vec<(Instant, bool)>>,
    revoked: Mutex<Vec<u64>>,
    ttl_ms: AtomicU64,
}

impl Shared {
    fn mode(&self) -> Mode {
        match self.mode.load(Ordering::SeqCst) {
            0 => Mode::Answer,
            1 => Mode::Gone,
            2 => Mode::Silent,
            _ => Mode::Refuse,
        }
    }
}

#[derive(Clone)]
struct FakeService(Arc<Shared>);

type AnswerStream = Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl LeaseService for FakeService {
    async fn grant(
        &self,
        r: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        let ttl_ms = r.into_inner().ttl_ms;
        self.0.ttl_ms.store(ttl_ms, Ordering::SeqCst);
        let id = 100 + self.0.next_id.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(LeaseGrantResponse {
            id,
            ttl_ms,
            revision: id,
        }))
    }

    async fn revoke(
        &self,
        r: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        let id = r.into_inner().id;
        self.0.revoked.lock().unwrap().push(id);
        Ok(Response::new(LeaseRevokeResponse {
            revision: 500,
            deleted_count: 2,
        }))
    }

    type KeepAliveStream = AnswerStream;

    async fn keep_alive(
        &self,
        r: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<AnswerStream>, Status> {
        if self.0.mode() == Mode::Refuse {
            return Err(Status::unavailable("test: refusing keep-alive streams"));
        }
        let shared = self.0.clone();
        let requests = r.into_inner();
        let answers =
            futures::stream::unfold((requests, shared), |(mut requests, shared)| async move {
                loop {
                    let request = match requests.message().await {
                        Ok(Some(request)) => request,
                        _ => return None,
                    };
                    let mode = shared.mode();
                    let answered = matches!(mode, Mode::Answer | Mode::Gone);
                    shared
                        .keep_alives
                        .lock()
                        .unwrap()
                        .push((Instant::now(), mode == Mode::Answer));
                    if answered {
                        let ttl_ms = if mode == Mode::Answer {
                            shared.ttl_ms.load(Ordering::SeqCst)
                        } else {
                            0
                        };
                        let answer = LeaseKeepAliveResponse {
                            id: request.id,
                            ttl_ms,
                        };
                        return Some((Ok(answer), (requests, shared)));
                    }
                }
            });
        Ok(Response::new(Box::pin(answers)))
    }

    async fn time_to_live(
        &self,
        r: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let id = r.into_inner().id;
        if self.0.revoked.lock().unwrap().contains(&id) {
            return Err(ApiError::NotFound.into());
        }
        Ok(Response::new(LeaseTimeToLiveResponse {
            lease: Some(cairn_proto::v1::Lease {
                id,
                ttl_ms: self.0.ttl_ms.load(Ordering::SeqCst),
                remaining_ms: 1,
                attached_count: 0,
                granted_revision: id,
                renewed_revision: id,
            }),
            revision: id,
        }))
    }

    async fn list(
        &self,
        _: Request<LeaseListRequest>,
    ) -> Result<Response<LeaseListResponse>, Status> {
        Ok(Response::new(LeaseListResponse::default()))
    }
}

/// A lease service on a free port, answering as its [`Mode`] says.
struct FakeLeaseNode {
    address: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeLeaseNode {
    async fn start(mode: Mode) -> FakeLeaseNode {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        let shared = Arc::new(Shared::default());
        shared.mode.store(mode as u8, Ordering::SeqCst);
        let incoming = futures::stream::unfold(listener, |listener| async move {
            let accepted = listener.accept().await.map(|(stream, _)| stream);
            Some((accepted, listener))
        });
        let service = LeaseServiceServer::new(FakeService(shared.clone()));
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await;
        });
        FakeLeaseNode {
            address,
            shared,
            task,
        }
    }

    fn set(&self, mode: Mode) {
        self.shared.mode.store(mode as u8, Ordering::SeqCst);
    }

    fn keep_alives(&self) -> Vec<(Instant, bool)> {
        self.shared.keep_alives.lock().unwrap().clone()
    }

    fn revoked(&self) -> Vec<u64> {
        self.shared.revoked.lock().unwrap().clone()
    }
}

impl Drop for FakeLeaseNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn dead_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    listener.local_addr().expect("address").to_string()
}

fn client(endpoints: &[String]) -> Client {
    let options = ClientOptions {
        request_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_millis(200),
        ..ClientOptions::default()
    };
    Client::new(endpoints, options).expect("valid endpoints")
}

async fn grant(client: &Client, ttl_ms: u64) -> Lease {
    client
        .grant_lease(Duration::from_millis(ttl_ms))
        .await
        .expect("grant")
}

// ---------------------------------------------------------- the keeper ----

#[tokio::test]
async fn a_lease_is_kept_alive_a_third_of_its_ttl_apart() {
    // TTL 600 ms: a keep-alive about every 200 ms, and the lease held throughout.
    let node = FakeLeaseNode::start(Mode::Answer).await;
    let client = client(std::slice::from_ref(&node.address));
    let lease = grant(&client, 600).await;
    assert!(lease.id() >= 100);
    assert_eq!(lease.ttl(), Duration::from_millis(600));
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(lease.loss(), None, "held after 2 s: {lease:?}");
    let sent = node.keep_alives().len();
    assert!(
        (7..=13).contains(&sent),
        "about 10 keep-alives in 2 s, got {sent}"
    );
    let until = lease.held_until().expect("held");
    assert!(until > Instant::now(), "the deadline moved on");
    assert_eq!(
        lease.revoke().await,
        Ok(2),
        "revoke answers the deleted count"
    );
    assert_eq!(node.revoked(), vec![100]);
}

#[tokio::test]
async fn a_keep_alive_answered_with_ttl_zero_loses_the_lease_at_once() {
    // The cluster says the lease is gone: lost with Gone at the next keep-alive
    // (a third of the TTL), never held again, and no more keep-alives are sent.
    let node = FakeLeaseNode::start(Mode::Answer).await;
    let client = client(std::slice::from_ref(&node.address));
    let lease = grant(&client, 3000).await;
    node.set(Mode::Gone);
    let lost = tokio::time::timeout(Duration::from_millis(1500), lease.lost()).await;
    assert_eq!(lost, Ok(LeaseLoss::Gone));
    assert_eq!(lease.held_until(), None);
    let sent = node.keep_alives().len();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        node.keep_alives().len(),
        sent,
        "no keep-alive after the loss"
    );
}

#[tokio::test]
async fn a_silent_cluster_loses_the_lease_by_the_last_acknowledged_send_plus_the_ttl() {
    // The node stops answering; the handle must give the lease up no later than the last
    // acknowledged keep-alive's sending (at or before its arrival) plus the TTL, and not
    // before the node fell silent.
    let node = FakeLeaseNode::start(Mode::Answer).await;
    let client = client(std::slice::from_ref(&node.address));
    let ttl = Duration::from_millis(600);
    let lease = grant(&client, 600).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    node.set(Mode::Silent);
    let silent_at = Instant::now();
    let loss = tokio::time::timeout(Duration::from_secs(3), lease.lost())
        .await
        .expect("lost within 3 s");
    let lost_at = Instant::now();
    assert!(
        matches!(loss, LeaseLoss::Unconfirmed { ttl_ms: 600 }),
        "{loss:?}"
    );
    let last_acknowledged = node
        .keep_alives()
        .iter()
        .filter(|(_, answered)| *answered)
        .map(|(at, _)| *at)
        .max()
        .expect("some keep-alive was answered");
    assert!(
        lost_at <= last_acknowledged + ttl + Duration::from_millis(50),
        "lost {:?} after the last acknowledged keep-alive arrived (TTL {ttl:?})",
        lost_at - last_acknowledged
    );
    assert!(lost_at >= silent_at, "not lost before the node fell silent");
    assert!(
        node.keep_alives().len() > 4,
        "the handle kept trying while silent"
    );
}

#[tokio::test]
async fn the_keeper_moves_to_another_node_when_one_refuses_or_is_down() {
    // The first endpoint is down, the second refuses keep-alive streams, the third
    // answers: the grant and the keep-alives find their way; the lease stays held.
    let refusing = FakeLeaseNode::start(Mode::Refuse).await;
    let answering = FakeLeaseNode::start(Mode::Answer).await;
    let endpoints = vec![
        dead_address().await,
        refusing.address.clone(),
        answering.address.clone(),
    ];
    // Each fake node answers keep-alives with the TTL it last granted: whichever node
    // grants, both answer 900 ms.
    for node in [&refusing, &answering] {
        node.shared.ttl_ms.store(900, Ordering::SeqCst);
    }
    let client = client(&endpoints);
    let lease = grant(&client, 900).await;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(lease.loss(), None, "held: {lease:?}");
    assert!(
        answering.keep_alives().len() >= 4,
        "the answering node keeps the lease alive: {}",
        answering.keep_alives().len()
    );
    // The answering node now refuses too, and the refusing one answers: the handle
    // moves back.
    answering.set(Mode::Refuse);
    refusing.set(Mode::Answer);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(lease.loss(), None, "held after moving: {lease:?}");
    assert!(
        !refusing.keep_alives().is_empty(),
        "moved to the other node"
    );
}

#[tokio::test]
async fn a_dropped_lease_is_revoked_and_a_detached_one_is_not() {
    let node = FakeLeaseNode::start(Mode::Answer).await;
    let client = client(std::slice::from_ref(&node.address));
    let dropped = grant(&client, 3000).await;
    let dropped_id = dropped.id();
    let lost = dropped.lost();
    drop(dropped);
    assert_eq!(
        lost.await,
        LeaseLoss::Revoked,
        "a dropped handle's lease is lost to its watchers"
    );
    let revoked = tokio::time::timeout(Duration::from_secs(3), async {
        while !node.revoked().contains(&dropped_id) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(revoked.is_ok(), "revoked on drop: {:?}", node.revoked());

    let detached = grant(&client, 600).await;
    let detached_id = detached.detach();
    let sent = node.keep_alives().len();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        node.keep_alives().len(),
        sent,
        "no keep-alive once detached"
    );
    assert!(!node.revoked().contains(&detached_id), "never revoked");
}

#[tokio::test]
async fn the_one_shot_calls_say_none_for_a_lease_that_is_gone() {
    // keep_alive_once, revoke_lease and lease_time_to_live answer None, not an error,
    // for a lease that does not exist; resume_lease too.
    let node = FakeLeaseNode::start(Mode::Answer).await;
    let client = client(std::slice::from_ref(&node.address));
    let lease = grant(&client, 2000).await;
    let id = lease.detach();
    assert_eq!(
        client.keep_alive_once(id).await,
        Ok(Some(Duration::from_secs(2)))
    );
    let resumed = client.resume_lease(id).await.expect("resume");
    let resumed = resumed.expect("the lease exists");
    assert_eq!(resumed.ttl(), Duration::from_secs(2));
    assert_eq!(resumed.revoke().await, Ok(2));
    assert_eq!(client.lease_time_to_live(id).await, Ok(None));
    node.set(Mode::Gone);
    assert_eq!(client.keep_alive_once(id).await, Ok(None));
    assert!(matches!(client.resume_lease(id).await, Ok(None)));
}
