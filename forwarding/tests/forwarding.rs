//! Forwarding over real tonic on loopback, with an in-process leader and
//! lagging followers (see `support`): what is forwarded and what stays local,
//! error kinds crossing the hop, the lagging-follower rules of the contract,
//! the retry rules, and the cached leader channel.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use cairn_forwarding::metrics as names;
use cairn_forwarding::{Handle as _, ReadAt, Target};
use cairn_proto::error::ApiError;
use cairn_proto::v1::forwarding_service_client::ForwardingServiceClient;
use cairn_proto::v1::*;
use support::*;
use tokio::time::Instant;

fn short_deadline(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

/// Asserts two outcomes are the same error, and that the error survives
/// the follower's own hop to its client (ApiError -> Status -> ApiError).
fn assert_same_error<T: std::fmt::Debug>(
    via_follower: Result<T, ApiError>,
    via_leader: Result<T, ApiError>,
) -> ApiError {
    let follower = via_follower.expect_err("the follower's answer is an error");
    let leader = via_leader.expect_err("the leader's answer is an error");
    assert_eq!(
        follower, leader,
        "the kind and details cross the hop intact"
    );
    let status = tonic::Status::from(follower.clone());
    assert_eq!(ApiError::from_status(&status), follower);
    follower
}

async fn raw_client(address: &str) -> ForwardingServiceClient<tonic::transport::Channel> {
    ForwardingServiceClient::connect(format!("http://{address}"))
        .await
        .expect("connect to a harness node")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_forwards_writes_deletes_strong_reads_and_strong_lists() {
    // Every mutating or strong request sent to a follower runs on the leader;
    // the follower never proposes anything itself.
    let h = Harness::start(2).await;
    let f = &h.node(2).forwarder;
    let written = f
        .write(write_request(thing("a", "u1", "", b"1")), deadline())
        .await
        .unwrap()
        .public()
        .resource
        .unwrap();
    assert_eq!(written.version, "1");
    let read = f
        .read(read_request(id("a", ""), Consistency::Strong), deadline())
        .await
        .unwrap();
    assert_eq!(read.public().resource.unwrap().version, "1");
    assert!(read.revision >= 1);
    let listed = f
        .list(list_request(Consistency::Strong), None, deadline())
        .await
        .unwrap();
    assert_eq!(listed.resources.len(), 1);
    let deleted = f
        .delete(
            DeleteRequest {
                fence: None,
                id: Some(id("a", "u1")),
                version: "1".into(),
                orphan_dependents: false,
            },
            deadline(),
        )
        .await
        .unwrap();
    assert_eq!(deleted.revision, 2);
    let gone = f
        .read(read_request(id("a", ""), Consistency::Strong), deadline())
        .await;
    assert_eq!(gone.unwrap_err(), ApiError::NotFound);
    assert_eq!(
        h.proposed_by(2),
        0,
        "the follower never proposed anything itself"
    );
    assert_eq!(h.proposed(), 2);
    assert_eq!(h.node(2).channel.dial_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_serves_its_own_requests_without_dialling() {
    // On the leader every request runs locally: no channel, no dial.
    let h = Harness::start(2).await;
    let f = &h.node(1).forwarder;
    f.write(write_request(thing("a", "u1", "", b"1")), deadline())
        .await
        .unwrap();
    f.read(read_request(id("a", ""), Consistency::Strong), deadline())
        .await
        .unwrap();
    f.list(list_request(Consistency::Strong), None, deadline())
        .await
        .unwrap();
    assert_eq!(h.node(1).channel.dial_count(), 0);
    assert_eq!(h.node(1).channel.target(), None, "never points at itself");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventual_requests_stay_local_even_without_a_reachable_leader() {
    // Once a follower has caught up since its start (one read index, asked of
    // the leader by its first eventual request), eventual reads and lists,
    // ListByOwner and watches are served from its own replica, with the
    // leader's server gone, and nothing more is forwarded.
    let mut h = Harness::start(2).await;
    h.node(1)
        .forwarder
        .write(write_request(thing("a", "u1", "", b"1")), deadline())
        .await
        .unwrap();
    let f = &h.node(2).forwarder;
    f.read(read_request(id("a", ""), Consistency::Eventual), deadline())
        .await
        .expect("the first eventual read catches the follower up");
    let dials = h.node(2).channel.dial_count();
    h.stop_server(1).await;
    let f = &h.node(2).forwarder;
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        match f
            .read(read_request(id("a", ""), Consistency::Eventual), deadline())
            .await
        {
            Ok(r) => {
                assert_eq!(r.public().resource.unwrap().version, "1");
                break;
            }
            Err(ApiError::NotFound) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("eventual read: {e}"),
        }
    }
    let listed = f
        .list(list_request(Consistency::Eventual), None, deadline())
        .await
        .unwrap();
    assert_eq!(listed.resources.len(), 1);
    let owned = f
        .list_by_owner(
            ListByOwnerRequest {
                owner: Some(id("owner", "u9")),
            },
            None,
            deadline(),
        )
        .await
        .unwrap();
    assert!(owned.resources.is_empty());
    let _watch = f
        .watch(
            WatchListRequest {
                r#type: Some(thing_type()),
                tenancy: Some(tenancy()),
                name_prefix: String::new(),
                start_revision: 0,
                ..Default::default()
            },
            deadline(),
        )
        .await
        .unwrap()
        .events;
    assert_eq!(
        h.node(2).channel.dial_count(),
        dials,
        "nothing was forwarded once caught up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_serves_no_eventual_request_before_it_caught_up_since_its_start() {
    // A node just started may hold less than it served before a crash (it
    // replays only up to the commit index it last persisted). Until a read
    // index confirmed since its start is applied, its eventual requests are
    // Unavailable (certainly not served: retry, or ask another node), never
    // answered from what it holds.
    let mut h = Harness::start(2).await;
    h.node(1)
        .forwarder
        .write(write_request(thing("a", "u1", "", b"1")), deadline())
        .await
        .unwrap();
    h.stop_server(1).await;
    let f = &h.node(2).forwarder;
    let short = || Instant::now() + Duration::from_millis(300);
    let assert_unavailable = |what: &str, r: Result<(), ApiError>| match r {
        Err(ApiError::Unavailable(why)) => {
            assert!(why.contains("caught up"), "{what}: {why}")
        }
        other => panic!("{what}: expected Unavailable, got {other:?}"),
    };
    let r = f
        .read(read_request(id("a", ""), Consistency::Eventual), short())
        .await;
    assert_unavailable("read", r.map(|_| ()));
    let l = f
        .list(list_request(Consistency::Eventual), None, short())
        .await;
    assert_unavailable("list", l.map(|_| ()));
    let o = f
        .list_by_owner(
            ListByOwnerRequest {
                owner: Some(id("owner", "u9")),
            },
            None,
            short(),
        )
        .await;
    assert_unavailable("list by owner", o.map(|_| ()));
    let w = f
        .watch(
            WatchListRequest {
                r#type: Some(thing_type()),
                tenancy: Some(tenancy()),
                ..Default::default()
            },
            short(),
        )
        .await;
    assert_unavailable("watch", w.map(|_| ()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_kind_crosses_the_hop_intact() {
    // Each contract kind the leader answers reaches the follower's caller
    // with its kind and details, equal to the leader's own answer.
    let limits = cairn_fsm::Limits {
        history_changes_max: 2,
        ..Default::default()
    };
    let h = Harness::start_with(2, limits).await;
    let leader = &h.node(1).forwarder;
    let follower = &h.node(2).forwarder;
    let stored = leader
        .write(write_request(thing("a", "u1", "", b"1")), deadline())
        .await
        .unwrap()
        .public()
        .resource
        .unwrap();

    // NotFound.
    let missing = read_request(id("nope", ""), Consistency::Strong);
    let e = assert_same_error(
        follower.read(missing.clone(), deadline()).await,
        leader.read(missing, deadline()).await,
    );
    assert_eq!(e, ApiError::NotFound);

    // CasFailure (the follower's attempt is refused, so the leader's is too).
    let stale = write_request(thing("a", "u1", "999", b"2"));
    let e = assert_same_error(
        follower.write(stale.clone(), deadline()).await,
        leader.write(stale, deadline()).await,
    );
    assert!(matches!(e, ApiError::CasFailure(_)), "{e:?}");

    // WrongUid.
    let other_life = write_request(thing("a", "u2", &stored.version, b"2"));
    let e = assert_same_error(
        follower.write(other_life.clone(), deadline()).await,
        leader.write(other_life, deadline()).await,
    );
    assert!(matches!(e, ApiError::WrongUid(_)), "{e:?}");

    // GroupVersionMismatch with the requested type and the stored resource.
    let mut v2 = id("a", "");
    v2.r#type.as_mut().unwrap().group_version = "v2".into();
    let e = assert_same_error(
        follower
            .read(read_request(v2.clone(), Consistency::Strong), deadline())
            .await,
        leader
            .read(read_request(v2, Consistency::Strong), deadline())
            .await,
    );
    match e {
        ApiError::GroupVersionMismatch {
            requested,
            stored: s,
        } => {
            assert_eq!(requested.group_version, "v2");
            assert_eq!(*s, stored);
        }
        other => panic!("expected GroupVersionMismatch, got {other:?}"),
    }

    // Compacted, with the oldest retained revision.
    for i in 0..4 {
        leader
            .write(
                write_request(thing(&format!("c{i}"), "u1", "", b"x")),
                deadline(),
            )
            .await
            .unwrap();
    }
    let mut old = read_request(id("a", ""), Consistency::Strong);
    old.revision = 1;
    let e = assert_same_error(
        follower.read(old.clone(), deadline()).await,
        leader.read(old, deadline()).await,
    );
    assert!(
        matches!(e, ApiError::Compacted { oldest_retained_revision } if oldest_retained_revision > 1),
        "{e:?}"
    );

    // Inconsistent from the leader's consistency check: a read has no effect,
    // so it is asked again within its deadline, and served once the leader
    // confirms (here: the next attempt).
    let inconsistent = ApiError::Inconsistent("leadership not confirmed by a quorum".into());
    h.faults(1, |f| f.consistency_error = Some(inconsistent.clone()));
    follower
        .read(read_request(id("a", ""), Consistency::Strong), deadline())
        .await
        .expect("retried after Inconsistent, then served");
    h.faults(1, |f| f.consistency_error = Some(inconsistent.clone()));
    leader
        .read(read_request(id("a", ""), Consistency::Strong), deadline())
        .await
        .expect("retried after Inconsistent, then served");

    // InvalidArgument naming its field, Internal and PermissionDenied, answered
    // by the leader's apply: never retried, and never rewritten on the way
    // (a refused permission is the same at every node).
    for injected in [
        ApiError::invalid("resource.data", "rejected by the leader"),
        ApiError::Internal("a bug".into()),
        ApiError::Inconsistent("lost leadership after proposing".into()),
        ApiError::PermissionDenied("refused: node 2 is not a member".into()),
    ] {
        let calls = h.apply_calls(1);
        h.faults(1, |f| f.apply_error = Some(injected.clone()));
        let via = follower
            .write(write_request(thing("z", "u1", "", b"z")), deadline())
            .await;
        assert_eq!(h.apply_calls(1), calls + 1, "not retried: {injected:?}");
        h.faults(1, |f| f.apply_error = Some(injected.clone()));
        let direct = leader
            .write(write_request(thing("z", "u1", "", b"z")), deadline())
            .await;
        assert_eq!(assert_same_error(via, direct), injected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_forwarding_server_never_forwards_and_refuses_with_its_hint() {
    // A follower's ForwardingService answers NotLeader naming the leader,
    // proposes nothing, and validates what it receives.
    let h = Harness::start(2).await;
    let mut c = raw_client(&h.node(2).peer_address).await;
    let status = c
        .write(write_request(thing("a", "u1", "", b"1")))
        .await
        .unwrap_err();
    match ApiError::from_status(&status) {
        ApiError::NotLeader { hint } => {
            assert_eq!(hint.leader_id, Some(1));
            assert_eq!(
                hint.peer_address.as_deref(),
                Some(h.node(1).peer_address.as_str())
            );
        }
        other => panic!("expected NotLeader, got {other:?}"),
    }
    let status = c
        .read(read_request(id("a", ""), Consistency::Strong))
        .await
        .unwrap_err();
    assert!(matches!(
        ApiError::from_status(&status),
        ApiError::NotLeader { .. }
    ));
    assert_eq!(h.proposed(), 0);
    assert_eq!(
        h.node(2).channel.dial_count(),
        0,
        "the server never forwards"
    );

    // The leader's server validates again: a malformed request names its field.
    let mut l = raw_client(&h.node(1).peer_address).await;
    let status = l
        .write(write_request(thing("", "u1", "", b"1")))
        .await
        .unwrap_err();
    match ApiError::from_status(&status) {
        ApiError::InvalidArgument { field, .. } => assert_eq!(field, "resource.id.name"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    let status = l
        .read(ReadRequest {
            id: Some(id("a", "")),
            consistency: 7,
            revision: 0,
        })
        .await
        .unwrap_err();
    match ApiError::from_status(&status) {
        ApiError::InvalidArgument { field, .. } => assert_eq!(field, "consistency"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert_eq!(h.proposed(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_follower_serves_strong_reads_of_every_acknowledged_write() {
    // Writes acknowledged by the leader are visible at once to strong reads
    // and strong lists on a follower whose replica lags 0-50 ms; its eventual
    // reads may lag (counted) but catch up.
    let h = Harness::start(2).await;
    let leader = &h.node(1).forwarder;
    let follower = &h.node(2).forwarder;
    let mut lagged = 0;
    for i in 0..60 {
        let name = format!("r{i:02}");
        let written = leader
            .write(write_request(thing(&name, "u1", "", b"x")), deadline())
            .await
            .unwrap()
            .public()
            .resource
            .unwrap();
        if follower
            .read(
                read_request(id(&name, ""), Consistency::Eventual),
                deadline(),
            )
            .await
            .is_err()
        {
            lagged += 1;
        }
        let strong = follower
            .read(read_request(id(&name, ""), Consistency::Strong), deadline())
            .await
            .unwrap();
        assert_eq!(strong.public().resource.unwrap().version, written.version);
        let listed = follower
            .list(list_request(Consistency::Strong), None, deadline())
            .await
            .unwrap();
        assert_eq!(listed.resources.len(), i + 1);
    }
    println!("eventual reads on the follower that lagged: {lagged}/60");
    assert!(
        lagged > 0,
        "the follower never lagged: the harness is not lagging"
    );
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        let eventual = follower
            .list(list_request(Consistency::Eventual), None, deadline())
            .await
            .unwrap();
        if eventual.resources.len() == 60 {
            break;
        }
        assert!(Instant::now() < until, "the follower never caught up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn with_read_indexes_a_lagging_follower_serves_strong_reads_and_lists_itself() {
    // `follower_strong_reads = "read-index"`: every write the leader
    // acknowledged is in the follower's strong reads and lists at once
    // (its replica lags 0-50 ms), and nothing but read indexes went to the
    // leader: no read or list was forwarded.
    let recorder = Recording::default();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let h =
                Harness::start_with_reads(2, cairn_fsm::Limits::default(), ReadAt::AnyNode).await;
            let leader = &h.node(1).forwarder;
            let follower = &h.node(2).forwarder;
            for i in 0..30 {
                let name = format!("r{i:02}");
                let written = leader
                    .write(write_request(thing(&name, "u1", "", b"x")), deadline())
                    .await
                    .unwrap()
                    .public()
                    .resource
                    .unwrap();
                let strong = follower
                    .read(read_request(id(&name, ""), Consistency::Strong), deadline())
                    .await
                    .unwrap();
                assert_eq!(strong.public().resource.unwrap().version, written.version);
                let listed = follower
                    .list(list_request(Consistency::Strong), None, deadline())
                    .await
                    .unwrap();
                assert_eq!(listed.resources.len(), i + 1);
            }
            assert!(
                h.confirmed_by(1) >= 60,
                "the leader confirmed each read index"
            );
        });
    });
    let forwarded = |method| {
        recorder
            .counter(names::CALLS_TOTAL, &[("method", method)])
            .unwrap_or(0)
    };
    assert_eq!(forwarded("read"), 0, "no read was forwarded");
    assert_eq!(forwarded("list"), 0, "no list was forwarded");
    assert_eq!(forwarded("read_index"), 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_read_index_that_cannot_be_confirmed_is_inconsistent_never_stale() {
    // No leader, then a leader that cannot confirm (no quorum), then a leader
    // whose port is closed: a strong read, list or watch on the follower ends
    // at its deadline with Inconsistent, never with what the follower holds.
    let mut h = Harness::start_with_reads(2, cairn_fsm::Limits::default(), ReadAt::AnyNode).await;
    h.node(1)
        .forwarder
        .write(write_request(thing("a", "u1", "", b"1")), deadline())
        .await
        .unwrap();
    let f = h.node(2).forwarder.clone();
    // Caught up since its start: the eventual read at the end is served locally.
    f.read(read_request(id("a", ""), Consistency::Eventual), deadline())
        .await
        .unwrap();
    let watch_request = WatchListRequest {
        r#type: Some(thing_type()),
        tenancy: Some(tenancy()),
        consistency: Consistency::Strong as i32,
        ..Default::default()
    };
    let assert_inconsistent = |what: &str, r: Result<(), ApiError>| match r {
        Err(ApiError::Inconsistent(_)) => {}
        other => panic!("{what}: expected Inconsistent, got {other:?}"),
    };
    h.elect(None);
    let started = Instant::now();
    let r = f
        .read(
            read_request(id("a", ""), Consistency::Strong),
            short_deadline(300),
        )
        .await;
    assert_inconsistent("no leader: read", r.map(|_| ()));
    assert!(started.elapsed() < Duration::from_secs(1));
    let l = f
        .list(list_request(Consistency::Strong), None, short_deadline(300))
        .await;
    assert_inconsistent("no leader: list", l.map(|_| ()));
    let w = f.watch(watch_request.clone(), short_deadline(300)).await;
    assert_inconsistent("no leader: watch", w.map(|_| ()));

    h.elect(1);
    h.faults(1, |f| f.no_quorum = true);
    let r = f
        .read(
            read_request(id("a", ""), Consistency::Strong),
            short_deadline(300),
        )
        .await;
    assert_inconsistent("no quorum: read", r.map(|_| ()));
    h.faults(1, |f| f.no_quorum = false);
    f.read(read_request(id("a", ""), Consistency::Strong), deadline())
        .await
        .expect("confirmed again once the leader has its quorum");

    h.stop_server(1).await;
    let r = f
        .read(
            read_request(id("a", ""), Consistency::Strong),
            short_deadline(300),
        )
        .await;
    assert_inconsistent("leader unreachable: read", r.map(|_| ()));
    let eventual = f
        .read(read_request(id("a", ""), Consistency::Eventual), deadline())
        .await
        .expect("eventual reads stay local");
    assert_eq!(eventual.public().resource.unwrap().version, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strong_watch_on_a_lagging_follower_holds_every_acknowledged_write() {
    // The follower applies each entry 0-50 ms late. A STRONG watch opened
    // right after the leader acknowledged a write has it in its snapshot,
    // every time; an EVENTUAL one opened at the same moment sometimes does
    // not (the follower had not applied it yet): the difference is counted.
    let h = Harness::start_with_reads(2, cairn_fsm::Limits::default(), ReadAt::Leader).await;
    let leader = &h.node(1).forwarder;
    let follower = &h.node(2).forwarder;
    let mut eventual_missed = 0;
    for i in 0..40 {
        let name = format!("s{i:02}");
        leader
            .write(write_request(thing(&name, "u1", "", b"x")), deadline())
            .await
            .unwrap();
        for consistency in [Consistency::Eventual, Consistency::Strong] {
            let request = WatchListRequest {
                r#type: Some(thing_type()),
                tenancy: Some(tenancy()),
                name_prefix: name.clone(),
                consistency: consistency as i32,
                ..Default::default()
            };
            let watch = follower.watch(request, deadline()).await.unwrap();
            let snapshot = snapshot_names(watch.events).await;
            match consistency {
                Consistency::Strong => assert_eq!(
                    snapshot,
                    vec![name.clone()],
                    "a strong snapshot holds the acknowledged write"
                ),
                Consistency::Eventual => eventual_missed += usize::from(snapshot.is_empty()),
            }
        }
    }
    println!("eventual snapshots without the acknowledged write: {eventual_missed}/40");
    assert!(
        eventual_missed > 0,
        "the follower never lagged: this test shows nothing"
    );
}

/// The names in a watch's snapshot (the Upserts before EndOfSnapshot).
async fn snapshot_names(mut watch: cairn_forwarding::WatchStream) -> Vec<String> {
    use futures::StreamExt;
    let mut names = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(2), watch.next())
            .await
            .expect("an event within 2 s")
            .expect("the stream stays open")
            .expect("no watch error");
        match event.public().event.unwrap() {
            watch_event::Event::Upsert(u) => names.push(u.resource.unwrap().id.unwrap().name),
            watch_event::Event::EndOfSnapshot(_) => return names,
            other => panic!("unexpected event {other:?} in a snapshot"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventual_reads_on_a_follower_never_go_backwards() {
    // While one key is updated 80 times, a follower's eventual reads see
    // versions that never decrease, and end at the last one.
    let h = Harness::start(2).await;
    let leader = h.node(1).forwarder.clone();
    let follower = h.node(2).forwarder.clone();
    let writer = tokio::spawn(async move {
        let mut version = String::new();
        for i in 0..80u32 {
            let r = leader
                .write(
                    write_request(thing("k", "u1", &version, &i.to_be_bytes())),
                    deadline(),
                )
                .await
                .unwrap()
                .public()
                .resource
                .unwrap();
            version = r.version;
        }
        version
    });
    let mut seen = 0u64;
    let mut reads = 0;
    while !writer.is_finished() {
        if let Ok(r) = follower
            .read(read_request(id("k", ""), Consistency::Eventual), deadline())
            .await
        {
            let v: u64 = r.public().resource.unwrap().version.parse().unwrap();
            assert!(v >= seen, "version went back from {seen} to {v}");
            seen = v;
            reads += 1;
        }
        tokio::task::yield_now().await;
    }
    let last: u64 = writer.await.unwrap().parse().unwrap();
    let until = Instant::now() + Duration::from_secs(2);
    while seen < last {
        assert!(
            Instant::now() < until,
            "the follower stopped at {seen} < {last}"
        );
        let r = follower
            .read(read_request(id("k", ""), Consistency::Eventual), deadline())
            .await
            .unwrap();
        let v: u64 = r.public().resource.unwrap().version.parse().unwrap();
        assert!(v >= seen);
        seen = v;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(reads > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_watch_sends_only_state_the_follower_already_holds() {
    // A watch on a lagging follower: one snapshot and one EndOfSnapshot, then
    // live events; together every write exactly once, and after each event
    // an eventual read on the follower returns that event's resource.
    let h = Harness::start(2).await;
    let leader = &h.node(1).forwarder;
    let follower = &h.node(2).forwarder;
    for i in 0..10 {
        leader
            .write(
                write_request(thing(&format!("w{i:02}"), "u1", "", b"x")),
                deadline(),
            )
            .await
            .unwrap();
    }
    // Opened while the follower may still be applying the first ten.
    let mut watch = follower
        .watch(
            WatchListRequest {
                r#type: Some(thing_type()),
                tenancy: Some(tenancy()),
                name_prefix: "w".into(),
                start_revision: 0,
                ..Default::default()
            },
            deadline(),
        )
        .await
        .unwrap()
        .events;
    for i in 10..20 {
        leader
            .write(
                write_request(thing(&format!("w{i:02}"), "u1", "", b"x")),
                deadline(),
            )
            .await
            .unwrap();
    }
    use futures::StreamExt;
    let mut names = BTreeSet::new();
    let mut in_snapshot = true;
    let mut snapshot_len = 0;
    while names.len() < 20 {
        let event = tokio::time::timeout(Duration::from_secs(2), watch.next())
            .await
            .expect("an event within 2 s")
            .expect("the stream stays open")
            .expect("no watch error");
        match event.public().event.unwrap() {
            watch_event::Event::Upsert(u) => {
                let r = u.resource.unwrap();
                let name = r.id.clone().unwrap().name;
                assert!(names.insert(name.clone()), "{name} delivered twice");
                if in_snapshot {
                    snapshot_len += 1;
                }
                let local = follower
                    .read(
                        read_request(id(&name, ""), Consistency::Eventual),
                        deadline(),
                    )
                    .await
                    .expect("the follower holds what it announced");
                assert_eq!(local.public().resource.unwrap().version, r.version);
            }
            watch_event::Event::EndOfSnapshot(_) => {
                assert!(in_snapshot, "exactly one EndOfSnapshot");
                in_snapshot = false;
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
    assert!(!in_snapshot, "EndOfSnapshot came");
    println!("follower watch: {snapshot_len} of 20 in the snapshot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_forwarded_calls_share_one_dial() {
    // 64 concurrent forwarded writes dial the leader once and reuse that channel.
    let h = Harness::start(2).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..64 {
        let f = h.node(2).forwarder.clone();
        tasks.spawn(async move {
            f.write(
                write_request(thing(&format!("c{i}"), "u1", "", b"x")),
                deadline(),
            )
            .await
            .unwrap();
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let channel = &h.node(2).channel;
    assert_eq!(channel.dial_count(), 1);
    assert_eq!(channel.cached_target().unwrap().leader_id, 1);
    assert_eq!(h.proposed(), 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_change_drops_the_channel_and_the_next_call_dials_the_new_leader() {
    // The host's leader-change hook resets the cached channel; the next call
    // dials the new leader once, and later calls reuse it.
    let h = Harness::start(3).await;
    let f = &h.node(2).forwarder;
    let channel = &h.node(2).channel;
    f.write(write_request(thing("a", "u1", "", b"1")), deadline())
        .await
        .unwrap();
    assert_eq!(channel.cached_target().unwrap().leader_id, 1);
    h.elect(3);
    assert_eq!(channel.cached_target(), None, "reset by the hook");
    assert_eq!(channel.target().unwrap().leader_id, 3);
    for i in 0..5 {
        f.write(
            write_request(thing(&format!("b{i}"), "u1", "", b"1")),
            deadline(),
        )
        .await
        .unwrap();
    }
    assert_eq!(channel.dial_count(), 2, "one dial per leader");
    assert_eq!(channel.cached_target().unwrap().leader_id, 3);
    // The new leader itself never points at itself and serves locally.
    assert_eq!(h.node(3).channel.target(), None);
    h.node(3)
        .forwarder
        .write(write_request(thing("c", "u1", "", b"1")), deadline())
        .await
        .unwrap();
    assert_eq!(h.node(3).channel.dial_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_not_leader_answer_with_a_newer_hint_redials_the_named_leader() {
    // The follower's own view is stale (it still names node 1); node 1
    // refuses with a hint naming node 3, and the call goes there at once.
    let h = Harness::start(3).await;
    let f = &h.node(2).forwarder;
    f.write(write_request(thing("a", "u1", "", b"1")), deadline())
        .await
        .unwrap();
    h.set_view(2, Some(h.leader_hint()));
    h.elect_silently(3);
    let before = h.proposed();
    let started = Instant::now();
    f.write(write_request(thing("b", "u1", "", b"1")), deadline())
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(h.proposed(), before + 1, "applied once, by the new leader");
    let channel = &h.node(2).channel;
    assert_eq!(channel.dial_count(), 2);
    assert_eq!(
        channel.cached_target(),
        Some(Target {
            leader_id: 3,
            peer_address: h.node(3).peer_address.clone()
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_refuses_before_it_knows_it_leads_is_asked_again() {
    // Right after an election a follower can hear the new leader's heartbeats
    // before the leader's own view says it leads, so the leader's first answers
    // are NotLeader naming itself, or nobody. Nothing will change the follower's
    // view after that (the leader it sees does lead), so the follower keeps that
    // leader as its target and asks again after a pause: its strong read and its
    // write are served within their deadline (before, both failed at it: "no
    // leader is known").
    for refusal in ["a hint naming itself", "no hint"] {
        let h = Harness::start_with_reads(2, cairn_fsm::Limits::default(), ReadAt::AnyNode).await;
        let hint = match refusal {
            "no hint" => cairn_proto::error::LeaderHint::default(),
            _ => h.leader_hint(),
        };
        let follower = &h.node(2).forwarder;
        h.node(1)
            .forwarder
            .write(write_request(thing("a", "u1", "", b"1")), deadline())
            .await
            .unwrap();

        h.faults(1, |f| {
            f.consistency_error = Some(ApiError::NotLeader { hint: hint.clone() })
        });
        let read = follower
            .read(read_request(id("a", ""), Consistency::Strong), deadline())
            .await
            .unwrap_or_else(|e| panic!("{refusal}: the strong read is served: {e:?}"));
        assert_eq!(read.public().resource.unwrap().version, "1");

        h.faults(1, |f| f.apply_error = Some(ApiError::NotLeader { hint }));
        let written = follower
            .write(write_request(thing("b", "u1", "", b"1")), deadline())
            .await
            .unwrap_or_else(|e| panic!("{refusal}: the write is served: {e:?}"));
        assert_eq!(written.public().resource.unwrap().id.unwrap().name, "b");
        assert_eq!(h.proposed(), 2, "{refusal}: each write applied once");
        assert_eq!(
            h.node(2).channel.target().map(|t| t.leader_id),
            Some(1),
            "{refusal}: the follower still targets the leader"
        );
    }
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_whose_stale_views_name_each_other_are_asked_at_the_loops_pace() {
    // Nobody leads. Node 2 sees node 1 as the leader; node 1 still names node 3 and node 3
    // names node 1. Each refuses naming the other, which turns node 2's channel (a new dial
    // each time). The first turn, to a node not asked yet, goes at once; a turn back to a node
    // already asked waits for the loop's pause. Before, every turn went at once: 33 to 35 dials
    // in these 600 ms, as fast as the two answered, and the write could end with a call still
    // in flight at its deadline, answered "outcome unknown" though nobody had proposed it.
    let h = Harness::start(3).await;
    h.set_view(1, Some(h.hint_naming(3)));
    h.set_view(3, Some(h.hint_naming(1)));
    h.set_view(2, Some(h.hint_naming(1)));
    h.elect(None);
    let wait = Duration::from_millis(600);
    let error = h
        .node(2)
        .forwarder
        .write(
            write_request(thing("a", "u1", "", b"1")),
            Instant::now() + wait,
        )
        .await
        .expect_err("nobody leads");
    // The loop's pauses (10 ms doubling to 200 ms) fit 6 times in 600 ms: 7 paced attempts,
    // one turn at once to a node not asked yet, and one attempt of slack.
    let options = cairn_forwarding::ForwarderOptions::default();
    let mut paced_attempts = 1;
    let (mut pause, mut elapsed) = (options.retry_pause_initial, Duration::ZERO);
    while elapsed + pause < wait {
        elapsed += pause;
        paced_attempts += 1;
        pause = (pause * 2).min(options.retry_pause_max);
    }
    let dials = h.node(2).channel.dial_count();
    assert!(
        dials <= paced_attempts + 2,
        "{dials} dials in {wait:?}: more than {paced_attempts} paced attempts and one turn at once"
    );
    assert!(dials >= 2, "both stale nodes were asked: {dials} dials");
    // Every attempt was refused before proposing, and none was in flight at the deadline:
    // the caller learns that the write certainly did not apply.
    assert!(matches!(error, ApiError::Unavailable(_)), "{error:?}");
    assert_eq!(h.proposed(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_certainly_did_not_apply_is_retried_across_a_leader_change() {
    // The leader's port refuses connections (nothing is sent); when node 3 is
    // elected 300 ms later the same write goes there and applies once.
    let mut h = Harness::start(3).await;
    h.stop_server(1).await;
    let sim_leader_change = {
        let f = h.node(2).forwarder.clone();
        tokio::spawn(async move {
            f.write(write_request(thing("a", "u1", "", b"1")), deadline())
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(h.proposed(), 0);
    h.elect(3);
    let written = sim_leader_change
        .await
        .unwrap()
        .unwrap()
        .public()
        .resource
        .unwrap();
    assert_eq!(written.version, "1");
    assert_eq!(h.proposed(), 1);
    assert!(h.node(2).channel.dial_count() >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_answer_is_retried_and_the_write_applies_once() {
    // Unavailable means "refused before proposing": the follower sends again.
    let h = Harness::start(2).await;
    h.faults(1, |f| {
        f.apply_error = Some(ApiError::Unavailable("raft is stopping".into()))
    });
    let written = h
        .node(2)
        .forwarder
        .write(write_request(thing("a", "u1", "", b"1")), deadline())
        .await
        .unwrap();
    assert_eq!(written.public().resource.unwrap().version, "1");
    assert_eq!(h.apply_calls(1), 2);
    assert_eq!(h.proposed(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_answer_is_lost_is_not_retried() {
    // The leader applies the write but answers after the deadline: the
    // follower reports Inconsistent (outcome unknown) and sends nothing more.
    let h = Harness::start(2).await;
    h.faults(1, |f| f.apply_stall = Some(Duration::from_secs(2)));
    let result = h
        .node(2)
        .forwarder
        .write(
            write_request(thing("a", "u1", "", b"1")),
            short_deadline(400),
        )
        .await;
    assert!(
        matches!(result, Err(ApiError::Inconsistent(_))),
        "{result:?}"
    );
    assert_eq!(h.apply_calls(1), 1, "sent once");
    assert_eq!(h.proposed(), 1);
    let stored = h
        .node(1)
        .forwarder
        .read(read_request(id("a", ""), Consistency::Strong), deadline())
        .await
        .unwrap();
    assert_eq!(
        stored.public().resource.unwrap().version,
        "1",
        "it did apply, once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_reachable_leader_the_caller_gets_unavailable_at_its_deadline() {
    // No leader known, then a known leader whose port is closed: every call
    // ends at its deadline with Unavailable (nothing applied), never a
    // transport error.
    let mut h = Harness::start(2).await;
    h.elect(None);
    let f = h.node(2).forwarder.clone();
    let started = Instant::now();
    let w = f
        .write(
            write_request(thing("a", "u1", "", b"1")),
            short_deadline(300),
        )
        .await;
    assert!(matches!(w, Err(ApiError::Unavailable(_))), "{w:?}");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(290) && elapsed < Duration::from_secs(1),
        "{elapsed:?}"
    );
    let r = f
        .read(
            read_request(id("a", ""), Consistency::Strong),
            short_deadline(300),
        )
        .await;
    assert!(matches!(r, Err(ApiError::Unavailable(_))), "{r:?}");

    h.elect(1);
    h.stop_server(1).await;
    for _ in 0..2 {
        let w = f
            .write(
                write_request(thing("a", "u1", "", b"1")),
                short_deadline(300),
            )
            .await;
        assert!(matches!(w, Err(ApiError::Unavailable(_))), "{w:?}");
        let l = f
            .list(list_request(Consistency::Strong), None, short_deadline(300))
            .await;
        assert!(matches!(l, Err(ApiError::Unavailable(_))), "{l:?}");
    }
    assert_eq!(h.proposed(), 0);
    assert_eq!(h.node(2).channel.cached_target(), None);
}

/// The names in a page, in order.
fn page_names(page: &cairn_proto::v1::shared::ListResponse) -> Vec<String> {
    page.public()
        .resources
        .into_iter()
        .map(|r| r.id.unwrap_or_default().name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strong_listing_through_a_follower_pages_at_its_first_revision() {
    // A follower forwards a strong list's first page to the leader with its
    // limit (2 resources come back, with a token); writes, a delete and a
    // re-creation follow, and the follower applies them; the later pages,
    // asked of the follower with no leader left at all, read the listing's
    // revision there and add up to exactly the six names of the first
    // page's revision.
    let h = Harness::start(2).await;
    let leader = &h.node(1).forwarder;
    let follower = &h.node(2).forwarder;
    for i in 0..6 {
        let name = format!("n{i}");
        leader
            .write(write_request(thing(&name, "u1", "", b"x")), deadline())
            .await
            .unwrap();
    }
    let mut request = list_request(Consistency::Strong);
    request.limit = 2;
    let first = follower
        .list(request.clone(), None, deadline())
        .await
        .unwrap();
    assert_eq!(page_names(&first), ["n0", "n1"]);
    assert_eq!(first.revision, 6);
    assert_eq!(
        h.node(2).channel.dial_count(),
        1,
        "the first page was forwarded"
    );
    leader
        .delete(
            DeleteRequest {
                fence: None,
                id: Some(id("n3", "u1")),
                version: "4".into(),
                orphan_dependents: false,
            },
            deadline(),
        )
        .await
        .unwrap();
    for name in ["n3", "n2a", "n9"] {
        leader
            .write(write_request(thing(name, "u2", "", b"y")), deadline())
            .await
            .unwrap();
    }
    // The follower holds the changes too, so its latest state is not the listing's.
    let until = Instant::now() + Duration::from_secs(2);
    while h.node(2).handle.store().applied_index() < h.committed() {
        assert!(Instant::now() < until, "the follower never caught up");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    h.elect(None);
    let mut names = page_names(&first);
    let mut token = first.next_page_token;
    while !token.is_empty() {
        request.page_token = token;
        let page = follower
            .list(request.clone(), None, deadline())
            .await
            .unwrap();
        assert_eq!(
            page.revision, 6,
            "every page reflects the first page's revision"
        );
        assert!(page.resources.len() <= 2);
        for r in page.public().resources {
            assert_eq!(r.id.as_ref().unwrap().uid, "u1", "a resource of revision 6");
        }
        names.extend(page_names(&page));
        token = page.next_page_token;
    }
    assert_eq!(names, ["n0", "n1", "n2", "n3", "n4", "n5"]);
    assert_eq!(h.proposed(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_token_ahead_of_a_node_is_unavailable_until_it_applies_that_revision() {
    // A token of revision 3 (issued by another replica of the same log)
    // given to a node that has applied nothing: Unavailable at once, no
    // waiting; once the node has applied revision 3 it serves the page.
    let h = Harness::start(2).await;
    let other = cairn_fsm::Store::new(cairn_fsm::Limits::default());
    for index in 1..=3 {
        other
            .apply(
                index,
                &cairn_fsm::Command::Write {
                    resource: thing(&format!("n{index}"), "u1", "", b"x"),
                },
            )
            .unwrap();
    }
    let (t, ten) = (thing_type(), tenancy());
    let filter = cairn_fsm::ListFilter {
        type_: &t,
        tenancy: &ten,
        name_prefix: "",
        selector: None,
    };
    let bounds = cairn_fsm::PageBounds {
        resources_max: 1,
        bytes_max: cairn_fsm::LIST_PAGE_BYTES_MAX,
    };
    let token = other
        .view()
        .list_page(&filter, None, None, bounds)
        .next
        .unwrap();
    let mut request = list_request(Consistency::Eventual);
    request.page_token = token.encode();
    let executor = h.node(2).forwarder.executor();
    let started = Instant::now();
    let early = executor.list(request.clone()).await;
    assert!(matches!(early, Err(ApiError::Unavailable(_))), "{early:?}");
    assert!(started.elapsed() < Duration::from_secs(1));
    for i in 1..=3 {
        h.node(1)
            .forwarder
            .write(
                write_request(thing(&format!("n{i}"), "u1", "", b"x")),
                deadline(),
            )
            .await
            .unwrap();
    }
    let until = Instant::now() + Duration::from_secs(2);
    let page = loop {
        match executor.list(request.clone()).await {
            Ok(page) => break page,
            Err(ApiError::Unavailable(_)) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            other => panic!("expected the page once applied, got {other:?}"),
        }
    };
    assert_eq!(page.revision, 3);
    assert_eq!(page_names(&page), ["n2", "n3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_page_token_is_refused_on_page_token_on_both_sides_of_the_hop() {
    // Garbage, a token of another listing, and a revision that disagrees
    // with the token's: InvalidArgument naming page_token, from a follower's
    // strong list (checked before forwarding) and from the leader's
    // forwarding service (checked again where it runs).
    let h = Harness::start(2).await;
    let leader = &h.node(1).forwarder;
    for i in 0..3 {
        leader
            .write(
                write_request(thing(&format!("n{i}"), "u1", "", b"x")),
                deadline(),
            )
            .await
            .unwrap();
    }
    let mut first = list_request(Consistency::Strong);
    first.limit = 1;
    let token = leader
        .list(first.clone(), None, deadline())
        .await
        .unwrap()
        .next_page_token;
    assert!(!token.is_empty());
    let mut garbage = first.clone();
    garbage.page_token = "not a token".into();
    let mut other_listing = first.clone();
    other_listing.page_token = token.clone();
    other_listing.name_prefix = "n".into();
    let mut other_revision = first.clone();
    other_revision.page_token = token.clone();
    other_revision.revision = 1;
    let mut raw = raw_client(&h.node(1).peer_address).await;
    for bad in [garbage, other_listing, other_revision] {
        for result in [
            h.node(2)
                .forwarder
                .list(bad.clone(), None, deadline())
                .await,
            raw.list(ForwardedList {
                request: Some(bad.clone()),
                read_scope: None,
            })
            .await
            .map(|r| r.into_inner())
            .map_err(ApiError::from),
        ] {
            match result {
                Err(ApiError::InvalidArgument { field, .. }) => assert_eq!(field, "page_token"),
                other => panic!("expected InvalidArgument on page_token, got {other:?}"),
            }
        }
    }
    assert_eq!(h.node(2).channel.dial_count(), 0, "nothing was forwarded");
}

#[test]
fn forwarded_calls_dials_and_latency_are_measured() {
    // With a recorder installed, one forwarded write counts one call (write,
    // ok), one dial, and one latency sample; a forwarded CasFailure counts
    // under its kind.
    let recorder = Recording::default();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let h = Harness::start(2).await;
            let f = &h.node(2).forwarder;
            f.write(write_request(thing("a", "u1", "", b"1")), deadline())
                .await
                .unwrap();
            let cas = f
                .write(write_request(thing("a", "u1", "", b"1")), deadline())
                .await;
            assert!(matches!(cas, Err(ApiError::CasFailure(_))));
        });
    });
    assert_eq!(
        recorder.counter(
            names::CALLS_TOTAL,
            &[("method", "write"), ("outcome", "ok")]
        ),
        Some(1)
    );
    assert_eq!(
        recorder.counter(
            names::CALLS_TOTAL,
            &[("method", "write"), ("outcome", "cas_failure")]
        ),
        Some(1)
    );
    assert_eq!(
        recorder.counter(names::DIALS_TOTAL, &[("outcome", "ok")]),
        Some(1)
    );
    assert_eq!(
        recorder.samples(names::LATENCY_SECONDS, &[("method", "write")]),
        Some(2),
        "one latency sample per forwarded write"
    );
    assert_eq!(
        recorder.counter(
            names::SERVED_TOTAL,
            &[("method", "write"), ("outcome", "ok")]
        ),
        Some(1)
    );
}
