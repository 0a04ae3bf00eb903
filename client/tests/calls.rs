//! Client calls and helpers against in-process nodes backed by
//! `cairn_fsm::Store`: failover, leader hints, the retry rules that keep a
//! write's outcome honest, and typed errors. (The `cairn` data commands built
//! on this library are tested through the binary: `cli/tests/system/client_cli.rs`.)

mod support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cairn_client::{Client, ClientError, ClientOptions, Outcome};
use cairn_fsm::Limits;
use cairn_proto::v1::{Consistency, ListRequest, Resource, Tenancy, Type, WatchListRequest};
use serde_json::Value;
use support::{id, resource, Backing, TestNode};

fn options(request_timeout_ms: u64) -> ClientOptions {
    ClientOptions {
        request_timeout: Duration::from_millis(request_timeout_ms),
        connect_timeout: Duration::from_millis(200),
        ..ClientOptions::default()
    }
}

fn any_tenancy() -> Tenancy {
    Tenancy {
        partition: "*".into(),
        namespace: "*".into(),
    }
}

fn unversioned(group: &str, kind: &str) -> Type {
    Type {
        group: group.into(),
        group_version: String::new(),
        kind: kind.into(),
    }
}

/// A leader and a follower sharing one store, plus a dead address.
async fn cluster() -> (Backing, TestNode, TestNode, String) {
    let backing = Backing::new(Limits::default());
    let leader = TestNode::start(backing.clone()).await;
    let follower = TestNode::start(backing.clone()).await;
    *follower.control.follower_of.lock() = Some(leader.address.clone());
    let dead = TestNode::dead_address().await;
    (backing, leader, follower, dead)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_succeeds_with_one_of_three_endpoints_dead() {
    // The dead endpoint is listed first and the follower second: every call
    // fails over or follows the leader hint, and succeeds.
    let (backing, leader, follower, dead) = cluster().await;
    let client = Client::connect_with(&[&dead, &follower.address, &leader.address], options(3_000))
        .await
        .unwrap();
    let owner = client
        .create(resource("g", "Owner", "o", "", "{}"))
        .await
        .unwrap();
    let owner_id = owner.id.clone().unwrap();
    let mut child = resource("g", "A", "c", "", "{\"n\":1}");
    child.owner = Some(Box::new(owner_id.clone()));
    let created = client.create(child).await.unwrap();
    assert_eq!(created.version, "2");
    for consistency in [Consistency::Strong, Consistency::Eventual] {
        let read = client
            .read(id("g", "A", "c", ""), consistency)
            .await
            .unwrap();
        assert_eq!(read, created);
    }
    let mut next = created.clone();
    next.data = resource("g", "A", "c", "", "{\"n\":2}").data;
    let updated = client.write(next).await.unwrap();
    assert_eq!(updated.version, "3");
    let listed = client
        .list(
            unversioned("g", "A"),
            any_tenancy(),
            "",
            Consistency::Strong,
        )
        .await
        .unwrap();
    assert_eq!(listed.resources, vec![updated.clone()]);
    let owned = client.list_by_owner(owner_id).await.unwrap();
    assert_eq!(owned.resources, vec![updated.clone()]);
    let mut watch = client
        .watch_list(WatchListRequest {
            r#type: Some(unversioned("g", "A")),
            tenancy: Some(any_tenancy()),
            name_prefix: String::new(),
            start_revision: 0,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(matches!(watch.next().await, Some(Ok(_))), "snapshot upsert");
    let revision = client
        .delete(updated.id.clone().unwrap(), updated.version.clone())
        .await
        .unwrap();
    assert_eq!(revision, 4);
    assert!(matches!(
        client
            .read(id("g", "A", "c", ""), Consistency::Strong)
            .await,
        Err(ClientError::NotFound)
    ));
    assert_eq!(backing.store.applied_index(), 4, "each write applied once");
    assert!(
        follower.control.writes_received.load(Ordering::SeqCst) <= 1,
        "the hint is remembered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_not_leader_hint_outside_the_endpoint_list_is_followed() {
    // The client knows only the follower; the leader's address comes from the hint.
    let (_backing, leader, follower, _dead) = cluster().await;
    let client = Client::connect_with(&[&follower.address], options(3_000))
        .await
        .unwrap();
    let created = client
        .create(resource("g", "A", "x", "", "{}"))
        .await
        .unwrap();
    let read = client
        .read(id("g", "A", "x", ""), Consistency::Strong)
        .await
        .unwrap();
    assert_eq!(read, created);
    assert_eq!(leader.control.writes_received.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_answered_unavailable_is_retried_elsewhere_and_applies_once() {
    // Unavailable is answered before the write enters the log, so retrying
    // on the next node is safe: the write is applied exactly once.
    let backing = Backing::new(Limits::default());
    let first = TestNode::start(backing.clone()).await;
    let second = TestNode::start(backing.clone()).await;
    first.control.unavailable_writes.store(1, Ordering::SeqCst);
    let client = Client::connect_with(&[&first.address, &second.address], options(3_000))
        .await
        .unwrap();
    let created = client
        .create(resource("g", "A", "x", "", "{}"))
        .await
        .unwrap();
    assert_eq!(created.version, "1");
    assert_eq!(backing.store.applied_index(), 1);
    assert_eq!(second.control.writes_received.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_answer_never_comes_is_unknown_and_not_retried() {
    // The node applies the write and never answers: the deadline passes,
    // the outcome is Unknown (it did apply), and no other node was tried.
    let backing = Backing::new(Limits::default());
    let first = TestNode::start(backing.clone()).await;
    let second = TestNode::start(backing.clone()).await;
    first.control.hang_after_apply.store(true, Ordering::SeqCst);
    let client = Client::connect_with(&[&first.address, &second.address], options(400))
        .await
        .unwrap();
    let started = Instant::now();
    let error = client
        .create(resource("g", "A", "x", "", "{}"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, ClientError::DeadlineExceeded { .. }),
        "{error:?}"
    );
    assert_eq!(error.outcome(), Outcome::Unknown);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the deadline bounds the call"
    );
    assert_eq!(backing.store.applied_index(), 1, "it did apply");
    assert_eq!(
        second.control.writes_received.load(Ordering::SeqCst),
        0,
        "not retried"
    );
    // A read is retried instead: the second node answers it.
    let read = client
        .read(id("g", "A", "x", ""), Consistency::Eventual)
        .await;
    assert!(read.is_ok(), "{read:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_dropped_after_sending_a_write_is_unknown() {
    // The connection breaks while the write is in flight: Unavailable with
    // an Unknown outcome, not retried; create_if_absent then settles it by uid.
    let backing = Backing::new(Limits::default());
    let first = TestNode::start(backing.clone()).await;
    let second = TestNode::start(backing.clone()).await;
    first.control.hang_after_apply.store(true, Ordering::SeqCst);
    let client = Client::connect_with(&[&first.address, &second.address], options(5_000))
        .await
        .unwrap();
    let writer = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .create(resource("g", "A", "x", "u-fixed", "{}"))
                .await
        })
    };
    assert!(
        support::eventually(Duration::from_secs(5), || backing.store.applied_index()
            == 1)
        .await
    );
    first.drop_connections();
    let error = writer.await.unwrap().unwrap_err();
    assert!(
        matches!(error, ClientError::Unavailable { .. }),
        "{error:?}"
    );
    assert_eq!(error.outcome(), Outcome::Unknown);
    assert_eq!(second.control.writes_received.load(Ordering::SeqCst), 0);

    // The same situation through create_if_absent: the read finds the uid it sent.
    first.control.hang_after_apply.store(true, Ordering::SeqCst);
    let helper = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .create_if_absent(resource("g", "A", "y", "u-y", "{}"))
                .await
        })
    };
    assert!(
        support::eventually(Duration::from_secs(5), || backing.store.applied_index()
            == 2)
        .await
    );
    first.drop_connections();
    first
        .control
        .hang_after_apply
        .store(false, Ordering::SeqCst);
    let (stored, created) = helper.await.unwrap().unwrap();
    assert!(created);
    assert_eq!(stored.id.unwrap().uid, "u-y");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_moves_on_from_a_node_that_never_answers() {
    // The first node accepts the read and stays silent; after the per-attempt
    // limit the client asks the second node, well before the call's deadline.
    let backing = Backing::new(Limits::default());
    backing.put(resource("g", "A", "x", "ux", "{}"));
    let silent = TestNode::start(backing.clone()).await;
    let healthy = TestNode::start(backing.clone()).await;
    silent.control.hang_reads.store(true, Ordering::SeqCst);
    let options = ClientOptions {
        read_attempt_timeout: Duration::from_millis(200),
        ..options(5_000)
    };
    let client = Client::connect_with(&[&silent.address, &healthy.address], options)
        .await
        .unwrap();
    let started = Instant::now();
    let read = client
        .read(id("g", "A", "x", ""), Consistency::Eventual)
        .await
        .unwrap();
    assert_eq!(read.version, "1");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_dead_fails_definitely_within_the_deadline() {
    // Nothing can connect: the write certainly did not apply, and the call
    // ends at its deadline.
    let dead1 = TestNode::dead_address().await;
    let dead2 = TestNode::dead_address().await;
    let client = Client::connect_with(&[&dead1, &dead2], options(300))
        .await
        .unwrap();
    let started = Instant::now();
    let error = client
        .create(resource("g", "A", "x", "", "{}"))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        matches!(error, ClientError::DeadlineExceeded { .. }),
        "{error:?}"
    );
    assert_eq!(error.outcome(), Outcome::NotApplied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_the_message_limit_fails_at_once_instead_of_retrying() {
    // Every node would send the same 5.4 MB ListByOwner answer (it is not
    // paged), over the client's 4 MiB decoding limit: the call fails on the
    // first attempt, with the deadline (20 s) nowhere near, as a definite
    // ResourceExhausted.
    let (backing, leader, follower, _) = cluster().await;
    let payload = "x".repeat(900 * 1024);
    let owner = id("g", "Owner", "owner", "u0");
    for i in 0..6 {
        let mut big = resource("g", "Big", &format!("big-{i}"), "u1", &payload);
        big.owner = Some(Box::new(owner.clone()));
        backing.put(big);
    }
    let client = Client::connect_with(&[&leader.address, &follower.address], options(20_000))
        .await
        .unwrap();
    let started = Instant::now();
    let error = client.list_by_owner(owner).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}: {error}",
        started.elapsed()
    );
    assert!(
        matches!(&error, ClientError::ResourceExhausted { reason, .. } if reason.contains("too large")),
        "{error:?}"
    );
    assert_eq!(error.outcome(), Outcome::NotApplied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_of_large_resources_arrives_in_pages_under_the_message_limit() {
    // The same 5.4 MB of resources as a List: the node pages it under its
    // byte budget (3 MiB), so each answer fits the client's 4 MiB limit and
    // the transparent list returns all six.
    let (backing, leader, _follower, _) = cluster().await;
    let payload = "x".repeat(900 * 1024);
    for i in 0..6 {
        backing.put(resource("g", "Big", &format!("big-{i}"), "u1", &payload));
    }
    let client = Client::connect_with(&[&leader.address], options(20_000))
        .await
        .unwrap();
    let request = ListRequest {
        r#type: Some(unversioned("g", "Big")),
        tenancy: Some(any_tenancy()),
        ..ListRequest::default()
    };
    let first = client.list_page(request.clone()).await.unwrap();
    assert_eq!(first.resources.len(), 3, "a page ends before 3 MiB");
    assert!(!first.next_page_token.is_empty());
    let listed = client.list_request(request).await.unwrap();
    assert_eq!(listed.resources.len(), 6);
    assert!(listed.next_page_token.is_empty());
}

/// A leader and a follower whose pages hold at most 3 resources, with ten
/// Things stored (revision 10).
async fn paged_cluster() -> (Backing, TestNode, TestNode) {
    let backing = Backing::new(Limits {
        list_page_size_max: 3,
        ..Limits::default()
    });
    for i in 0..10 {
        backing.put(resource("g", "Thing", &format!("t{i}"), "u1", "{}"));
    }
    let leader = TestNode::start(backing.clone()).await;
    let follower = TestNode::start(backing.clone()).await;
    *follower.control.follower_of.lock() = Some(leader.address.clone());
    (backing, leader, follower)
}

fn names(resources: &[Resource]) -> Vec<String> {
    resources
        .iter()
        .map(|r| r.id.clone().unwrap_or_default().name)
        .collect()
}

fn things() -> ListRequest {
    ListRequest {
        r#type: Some(unversioned("g", "Thing")),
        tenancy: Some(any_tenancy()),
        ..ListRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_follows_every_page_and_reports_the_first_pages_revision() {
    // Pages of at most 3: list() gathers the ten Things from four pages;
    // list_page() hands out one page and its token; list_pages() walks the
    // same four pages one by one, and a change after the first page shows in
    // none of them (they all reflect revision 10). A limit smaller than the
    // node's page size is kept, a larger one capped.
    let (backing, leader, follower) = paged_cluster().await;
    let client = Client::connect_with(&[&follower.address, &leader.address], options(5_000))
        .await
        .unwrap();
    let all: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
    let listed = client
        .list(
            unversioned("g", "Thing"),
            any_tenancy(),
            "",
            Consistency::Strong,
        )
        .await
        .unwrap();
    assert_eq!(names(&listed.resources), all);
    assert_eq!(listed.revision, 10);
    assert!(listed.next_page_token.is_empty());

    let first = client.list_page(things()).await.unwrap();
    assert_eq!(names(&first.resources), ["t0", "t1", "t2"]);
    let mut pages = client.list_pages(things());
    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    while let Some(page) = pages.next().await {
        let page = page.unwrap();
        if sizes.is_empty() {
            backing.put(resource("g", "Thing", "t00-new", "u1", "{}"));
            backing.remove(&id("g", "Thing", "t9", ""));
        }
        assert_eq!(page.revision, 10);
        sizes.push(page.resources.len());
        seen.extend(names(&page.resources));
    }
    assert_eq!(sizes, [3, 3, 3, 1]);
    assert_eq!(seen, all);
    assert_eq!(pages.revision(), Some(10));
    assert!(pages.next().await.is_none(), "an ended listing stays ended");

    for (limit, page_size) in [(2, 2), (3, 3), (50, 3)] {
        let page = client
            .list_page(ListRequest { limit, ..things() })
            .await
            .unwrap();
        assert_eq!(page.resources.len(), page_size, "limit {limit}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_compacted_between_pages_starts_again_a_bounded_number_of_times() {
    // Two later pages answered Compacted: list() starts the listing over
    // twice and still returns the ten Things, from a third first page. With
    // every later page compacted it gives up after LIST_RESTARTS_MAX
    // restarts with Compacted; a listing at a fixed revision, or one the
    // caller continues from a token, is never restarted; and list_pages
    // hands the Compacted to its caller.
    let (_backing, leader, _follower) = paged_cluster().await;
    let client = Client::connect_with(&[&leader.address], options(5_000))
        .await
        .unwrap();
    let control = &leader.control;
    control.compact_later_pages.store(2, Ordering::SeqCst);
    let listed = client.list_request(things()).await.unwrap();
    assert_eq!(listed.resources.len(), 10);
    assert_eq!(control.first_pages_served.load(Ordering::SeqCst), 3);

    control.first_pages_served.store(0, Ordering::SeqCst);
    control
        .compact_later_pages
        .store(u32::MAX, Ordering::SeqCst);
    let error = client.list_request(things()).await.unwrap_err();
    assert!(matches!(error, ClientError::Compacted { .. }), "{error:?}");
    assert_eq!(
        control.first_pages_served.load(Ordering::SeqCst),
        1 + u64::from(cairn_client::LIST_RESTARTS_MAX)
    );

    control.first_pages_served.store(0, Ordering::SeqCst);
    let at_revision = client
        .list_request(ListRequest {
            revision: 10,
            ..things()
        })
        .await
        .unwrap_err();
    assert!(matches!(at_revision, ClientError::Compacted { .. }));
    assert_eq!(control.first_pages_served.load(Ordering::SeqCst), 1);

    let mut pages = client.list_pages(things());
    assert!(pages.next().await.unwrap().is_ok());
    assert!(matches!(
        pages.next().await,
        Some(Err(ClientError::Compacted { .. }))
    ));
    control.compact_later_pages.store(0, Ordering::SeqCst);
    let retried = pages.next().await.unwrap().unwrap();
    assert_eq!(
        names(&retried.resources),
        ["t3", "t4", "t5"],
        "the same page, asked again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_verdicts_arrive_as_typed_errors() {
    // NotFound, CasFailure, WrongUid, GroupVersionMismatch and InvalidArgument keep their kinds.
    let (_backing, leader, _follower, _dead) = cluster().await;
    let client = Client::connect_with(&[&leader.address], options(3_000))
        .await
        .unwrap();
    let created = client
        .create(resource("g", "A", "x", "u1", "{}"))
        .await
        .unwrap();
    assert!(matches!(
        client
            .read(id("g", "A", "missing", ""), Consistency::Eventual)
            .await,
        Err(ClientError::NotFound)
    ));
    assert!(matches!(
        client
            .read(id("g", "A", "x", "other-uid"), Consistency::Eventual)
            .await,
        Err(ClientError::NotFound)
    ));
    let stale = Resource {
        version: "999".into(),
        ..created.clone()
    };
    assert!(matches!(
        client.write(stale).await,
        Err(ClientError::CasFailure(_))
    ));
    let other_lifetime = Resource {
        version: created.version.clone(),
        ..resource("g", "A", "x", "u2", "{}")
    };
    assert!(matches!(
        client.write(other_lifetime).await,
        Err(ClientError::WrongUid(_))
    ));
    let mut v2 = id("g", "A", "x", "");
    if let Some(t) = v2.r#type.as_mut() {
        t.group_version = "v2".into();
    }
    match client.read(v2, Consistency::Eventual).await {
        Err(ClientError::GroupVersionMismatch { stored, .. }) => assert_eq!(*stored, created),
        other => panic!("{other:?}"),
    }
    match client
        .read(id("g", "A", "", ""), Consistency::Eventual)
        .await
    {
        Err(ClientError::InvalidArgument { field, .. }) => assert_eq!(field, "id.name"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helpers_create_update_and_delete_by_cas() {
    // create generates a ULID; create_if_absent returns the existing resource;
    // read_modify_write survives concurrent increments; delete_current removes whatever is current.
    let (backing, leader, _follower, _dead) = cluster().await;
    let client = Client::connect_with(&[&leader.address], options(5_000))
        .await
        .unwrap();
    let created = client
        .create(resource("g", "A", "counter", "", "{\"n\":0}"))
        .await
        .unwrap();
    let uid = created.id.clone().unwrap().uid;
    assert!(ulid::Ulid::from_string(&uid).is_ok(), "{uid}");

    let (existing, was_created) = client
        .create_if_absent(resource("g", "A", "counter", "", "{\"n\":100}"))
        .await
        .unwrap();
    assert!(!was_created);
    assert_eq!(existing, created);

    let mut tasks = Vec::new();
    for _ in 0..4 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                client
                    .read_modify_write(id("g", "A", "counter", ""), |current| {
                        let value: Value =
                            serde_json::from_slice(&current.data.as_ref().unwrap().value).unwrap();
                        let n = value["n"].as_u64().unwrap();
                        let mut next = current.clone();
                        next.data.as_mut().unwrap().value =
                            bytes::Bytes::from(format!("{{\"n\":{}}}", n + 1));
                        Some(next)
                    })
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let last = client
        .read(id("g", "A", "counter", ""), Consistency::Strong)
        .await
        .unwrap();
    assert_eq!(last.data.unwrap().value.as_ref(), b"{\"n\":40}");
    assert_eq!(last.id.unwrap().uid, uid, "the uid is kept");

    let unchanged = client
        .read_modify_write(id("g", "A", "counter", ""), |_| None)
        .await
        .unwrap();
    assert_eq!(unchanged.version, last.version);

    let deleted = client
        .delete_current(id("g", "A", "counter", ""))
        .await
        .unwrap();
    assert_eq!(deleted.map(|r| r.version), Some(last.version));
    assert!(client
        .delete_current(id("g", "A", "counter", ""))
        .await
        .unwrap()
        .is_none());
    assert!(backing.store.view().is_empty());
}
