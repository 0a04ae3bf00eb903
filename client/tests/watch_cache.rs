//! WatchCache against in-process nodes backed by `cairn_fsm::Store`:
//! priming, resync after a restore, replay after a dropped connection, a
//! fresh snapshot after compaction, no rewind behind a lagging node, the
//! owner and user indexes, status callbacks with the revision, and the
//! priming barrier.

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use cairn_client::api::{ApiFuture, Event, EventKind};
use cairn_client::{
    CacheStatus, Client, ClientError, ClientOptions, Index, PrimingBarrier, StatusUpdate,
    WatchCache, WatchCacheOptions, WatchSpec,
};
use cairn_fsm::Limits;
use cairn_proto::v1::{Consistency, Id, ListRequest, Resource, WatchListRequest};
use futures::StreamExt as _;
use parking_lot::Mutex;
use support::{describe, eventually, id, resource, Backing, Recorder, TestNode};

const WAIT: Duration = Duration::from_secs(10);

fn options() -> ClientOptions {
    ClientOptions {
        request_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_millis(200),
        ..ClientOptions::default()
    }
}

fn fast_retries() -> WatchCacheOptions {
    WatchCacheOptions {
        retry_backoff_initial: Duration::from_millis(10),
        retry_backoff_max: Duration::from_millis(50),
        ..WatchCacheOptions::default()
    }
}

/// Sorted "name@version" of a type's cached resources.
fn cached(cache: &WatchCache, group: &str, kind: &str) -> Vec<String> {
    let mut v: Vec<String> = cache
        .list(group, kind)
        .iter()
        .map(|r| {
            format!(
                "{}@{}",
                r.id.as_ref().map(|i| i.name.as_str()).unwrap_or(""),
                r.version
            )
        })
        .collect();
    v.sort();
    v
}

/// Sorted "name@version" of what the store holds for a type.
fn stored(backing: &Backing, group: &str, kind: &str) -> Vec<String> {
    let mut v: Vec<String> = backing
        .store
        .view()
        .iter()
        .filter(|r| r.head().group() == group && r.head().kind() == kind)
        .map(|r| format!("{}@{}", r.head().name, r.version()))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_primed_returns_only_after_every_type_delivered_its_snapshot() {
    // Type B's snapshot trickles in slowly; a barrier released after type A
    // alone (or before B's EndOfSnapshot) would find B's resources missing.
    let backing = Backing::new(Limits::default());
    for i in 0..20 {
        backing.put(resource(
            "g",
            "A",
            &format!("a{i:02}"),
            &format!("ua{i}"),
            "{}",
        ));
        backing.put(resource(
            "g",
            "B",
            &format!("b{i:02}"),
            &format!("ub{i}"),
            "{}",
        ));
    }
    let node = TestNode::start(backing.clone()).await;
    node.control
        .event_delay
        .lock()
        .insert("B".into(), Duration::from_millis(10));
    let client = Client::connect_with(&[node.address.as_str()], options())
        .await
        .unwrap();
    let recorder = Recorder::default();
    let cache = WatchCache::start_with(
        client,
        vec![WatchSpec::new("g", "A"), WatchSpec::new("g", "B")],
        fast_retries(),
        vec![recorder.callback()],
    )
    .unwrap();
    assert!(!cache.is_primed());
    // While B's snapshot is still arriving the cache reports a resync.
    assert!(eventually(WAIT, || cache.status() == CacheStatus::ResyncInProgress).await);
    assert!(!cache.is_primed());
    tokio::time::timeout(WAIT, cache.wait_primed())
        .await
        .expect("primed");
    assert_eq!(cache.list("g", "A").len(), 20);
    assert_eq!(
        cache.list("g", "B").len(),
        20,
        "every B resource is there once primed"
    );
    assert_eq!(
        recorder.len(),
        40,
        "callbacks for the whole snapshot ran before the barrier"
    );
    assert_eq!(cache.status(), CacheStatus::InSync);
    assert!(cache.get(&id("g", "B", "b19", "")).is_some());
    assert!(cache.get(&id("g", "B", "b19", "wrong-uid")).is_none());
    assert_eq!(recorder.violations(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_waits_for_the_datastore_then_primes_when_it_appears() {
    // With no node up the status is WaitingForDatastore and the barrier holds;
    // once the node starts the cache primes and goes InSync.
    let backing = Backing::new(Limits::default());
    backing.put(resource("g", "A", "x", "ux", "{}"));
    let mut node = TestNode::start(backing.clone()).await;
    node.stop().await;
    let client = Client::new(&[node.address.as_str()], options()).unwrap();
    let cache = WatchCache::start(client, vec![WatchSpec::new("g", "A")], fast_retries()).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(cache.status(), CacheStatus::WaitingForDatastore);
    assert!(!cache.is_primed());
    node.restart().await;
    tokio::time::timeout(WAIT, cache.wait_primed())
        .await
        .expect("primed");
    assert_eq!(cached(&cache, "g", "A"), vec!["x@1".to_string()]);
    assert!(eventually(WAIT, || cache.status() == CacheStatus::InSync).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_closes_the_watch_and_the_cache_resyncs_and_sweeps() {
    // The restore closes the watch; the replay request is refused as
    // compacted (the history went with the restore), so the cache takes a
    // fresh snapshot and emits exactly the difference: the changed and new
    // resources as Upserts and a Delete for what the restore removed.
    let backing = Backing::new(Limits::default());
    let a = backing.put(resource("g", "A", "a", "ua", "{}"));
    backing.put(resource("g", "A", "b", "ub", "{}"));
    let c = backing.put(resource("g", "A", "c", "uc", "{}"));
    let node = TestNode::start(backing.clone()).await;
    let client = Client::connect_with(&[node.address.as_str()], options())
        .await
        .unwrap();
    let recorder = Recorder::default();
    let cache = WatchCache::start_with(
        client,
        vec![WatchSpec::new("g", "A")],
        fast_retries(),
        vec![recorder.callback()],
    )
    .unwrap();
    tokio::time::timeout(WAIT, cache.wait_primed())
        .await
        .expect("primed");
    assert_eq!(recorder.len(), 3);

    let applied = backing.store.applied_index();
    let restored_at = applied + 10;
    let c_changed = Resource {
        version: (applied + 5).to_string(),
        data: Some(cairn_proto::google::protobuf::Any {
            type_url: "t".into(),
            value: bytes::Bytes::from_static(b"{\"changed\":true}"),
        }),
        ..c.clone()
    };
    let d = Resource {
        version: (applied + 7).to_string(),
        ..resource("g", "A", "d", "ud", "{}")
    };
    backing.restore(vec![a.clone(), c_changed, d], restored_at);

    assert!(
        eventually(WAIT, || cached(&cache, "g", "A")
            == stored(&backing, "g", "A"))
        .await,
        "cache {:?} store {:?}",
        cached(&cache, "g", "A"),
        stored(&backing, "g", "A")
    );
    assert!(eventually(WAIT, || cache.status() == CacheStatus::InSync).await);
    let after: Vec<String> = recorder.events()[3..].iter().map(describe).collect();
    let (u, v) = (applied + 5, applied + 7);
    assert_eq!(
        after,
        vec![format!("+c@{u}"), format!("+d@{v}"), "-b@2".to_string()]
    );
    let stats = cache.stats();
    assert_eq!(stats.snapshots_applied, 2);
    assert!(stats.compacted >= 1, "{stats:?}");
    assert_eq!(recorder.violations(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_resumes_from_the_last_revision_without_repeats() {
    // While the node is down, three changes happen; after it restarts the
    // cache replays exactly those, in order, without a new snapshot.
    let backing = Backing::new(Limits::default());
    backing.put(resource("g", "A", "a", "ua", "{}"));
    backing.put(resource("g", "A", "b", "ub", "{}"));
    let mut node = TestNode::start(backing.clone()).await;
    let client = Client::connect_with(&[node.address.as_str()], options())
        .await
        .unwrap();
    let recorder = Recorder::default();
    let cache = WatchCache::start_with(
        client,
        vec![WatchSpec::new("g", "A")],
        fast_retries(),
        vec![recorder.callback()],
    )
    .unwrap();
    tokio::time::timeout(WAIT, cache.wait_primed())
        .await
        .expect("primed");

    node.stop().await;
    assert!(eventually(WAIT, || cache.status() == CacheStatus::WaitingForDatastore).await);
    backing.put(resource("g", "A", "c", "uc", "{}")); // 3
    backing.put(resource("g", "A", "a", "ua", "{\"v\":2}")); // 4
    backing.remove(&id("g", "A", "b", "")); // 5
    node.restart().await;

    assert!(
        eventually(WAIT, || recorder.len() == 5).await,
        "{:?}",
        recorder.events()
    );
    let after: Vec<String> = recorder.events()[2..].iter().map(describe).collect();
    assert_eq!(after, vec!["+c@3", "+a@4", "-b@2"]);
    assert!(eventually(WAIT, || cache.status() == CacheStatus::InSync).await);
    assert_eq!(cached(&cache, "g", "A"), stored(&backing, "g", "A"));
    let stats = cache.stats();
    assert_eq!(stats.snapshots_applied, 1, "{stats:?}");
    assert!(stats.replays >= 1, "{stats:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(recorder.len(), 5, "nothing repeated");
    assert_eq!(recorder.violations(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_history_forces_a_fresh_snapshot_and_a_sweep() {
    // The store keeps only 3 changes; 10 happen while the node is down, so
    // the replay is refused as compacted and the cache resyncs from a
    // snapshot, deleting what is gone and upserting only what changed.
    let backing = Backing::new(Limits {
        history_changes_max: 3,
        ..Limits::default()
    });
    backing.put(resource("g", "A", "a", "ua", "{}")); // 1
    backing.put(resource("g", "A", "b", "ub", "{}")); // 2
    backing.put(resource("g", "A", "keep", "uk", "{}")); // 3
    let mut node = TestNode::start(backing.clone()).await;
    let client = Client::connect_with(&[node.address.as_str()], options())
        .await
        .unwrap();
    let recorder = Recorder::default();
    let cache = WatchCache::start_with(
        client,
        vec![WatchSpec::new("g", "A")],
        fast_retries(),
        vec![recorder.callback()],
    )
    .unwrap();
    tokio::time::timeout(WAIT, cache.wait_primed())
        .await
        .expect("primed");

    node.stop().await;
    backing.remove(&id("g", "A", "a", "")); // 4
    for i in 0..8 {
        backing.put(resource("g", "A", "b", "ub", &format!("{{\"i\":{i}}}"))); // 5..12
    }
    backing.put(resource("g", "A", "c", "uc", "{}")); // 13
    node.restart().await;

    assert!(
        eventually(WAIT, || cached(&cache, "g", "A")
            == stored(&backing, "g", "A"))
        .await,
        "cache {:?} store {:?}",
        cached(&cache, "g", "A"),
        stored(&backing, "g", "A")
    );
    let after: Vec<String> = recorder.events()[3..].iter().map(describe).collect();
    assert_eq!(after, vec!["+b@12", "+c@13", "-a@1"]);
    let stats = cache.stats();
    assert!(stats.compacted >= 1, "{stats:?}");
    assert_eq!(stats.snapshots_applied, 2, "{stats:?}");
    assert_eq!(recorder.violations(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_node_never_rewinds_the_cache() {
    // The cache follows node F to revision 15. F goes down; the other node L
    // is at revision 10 and refuses replays, so the cache must take a
    // snapshot from L, which is older than what it shows: it discards it
    // and keeps trying until L has caught up, then applies only what is new.
    let f = Backing::new(Limits::default());
    let l = Backing::new(Limits::default());
    let mut history = Vec::new();
    for i in 0..10 {
        history.push(resource(
            "g",
            "A",
            &format!("r{}", i % 4),
            &format!("u{}", i % 4),
            &format!("{{\"i\":{i}}}"),
        ));
    }
    for r in &history {
        f.put(r.clone());
        l.put(r.clone());
    }
    let mut node_f = TestNode::start(f.clone()).await;
    let node_l = TestNode::start(l.clone()).await;
    node_l.control.compact_replays.store(true, Ordering::SeqCst);
    let client = Client::connect_with(
        &[node_f.address.as_str(), node_l.address.as_str()],
        options(),
    )
    .await
    .unwrap();
    let recorder = Recorder::default();
    let cache = WatchCache::start_with(
        client,
        vec![WatchSpec::new("g", "A")],
        fast_retries(),
        vec![recorder.callback()],
    )
    .unwrap();
    tokio::time::timeout(WAIT, cache.wait_primed())
        .await
        .expect("primed");
    assert_eq!(node_f.control.watches_opened.load(Ordering::SeqCst), 1);

    let mut later = Vec::new();
    for i in 10..15 {
        later.push(resource(
            "g",
            "A",
            &format!("r{}", i % 4),
            &format!("u{}", i % 4),
            &format!("{{\"i\":{i}}}"),
        ));
    }
    for r in &later {
        f.put(r.clone());
    }
    assert!(eventually(WAIT, || cached(&cache, "g", "A") == stored(&f, "g", "A")).await);
    let seen_before = recorder.len();

    node_f.stop().await;
    assert!(
        eventually(WAIT, || cache.stats().stale_snapshots_discarded >= 2).await,
        "{:?}",
        cache.stats()
    );
    assert_eq!(
        cached(&cache, "g", "A"),
        stored(&f, "g", "A"),
        "the cache kept the newer state"
    );
    assert_eq!(
        recorder.len(),
        seen_before,
        "nothing from the stale snapshots reached subscribers"
    );
    assert!(!matches!(cache.status(), CacheStatus::InSync));

    for r in &later {
        l.put(r.clone());
    }
    l.put(resource("g", "A", "r9", "u9", "{}")); // 16: new on L only
    assert!(
        eventually(WAIT, || cached(&cache, "g", "A") == stored(&l, "g", "A")).await,
        "cache {:?} store {:?}",
        cached(&cache, "g", "A"),
        stored(&l, "g", "A")
    );
    let after: Vec<String> = recorder.events()[seen_before..]
        .iter()
        .map(describe)
        .collect();
    assert_eq!(after, vec!["+r9@16"], "only the change L has beyond F");
    assert!(eventually(WAIT, || cache.status() == CacheStatus::InSync).await);
    assert_eq!(recorder.violations(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_subscriber_first_gets_the_cached_resources_then_live_changes() {
    // subscribe() replays the current contents before any live change, with no gap.
    let backing = Backing::new(Limits::default());
    backing.put(resource("g", "A", "a", "ua", "{}"));
    let node = TestNode::start(backing.clone()).await;
    let client = Client::connect_with(&[node.address.as_str()], options())
        .await
        .unwrap();
    let cache = WatchCache::start(client, vec![WatchSpec::new("g", "A")], fast_retries()).unwrap();
    tokio::time::timeout(WAIT, cache.wait_primed())
        .await
        .expect("primed");
    let recorder = Recorder::default();
    let mut callback = recorder.callback();
    let subscription = cache.subscribe(move |e| callback(e));
    backing.put(resource("g", "A", "b", "ub", "{}"));
    assert!(eventually(WAIT, || recorder.len() == 2).await);
    let seen: Vec<String> = recorder.events().iter().map(describe).collect();
    assert_eq!(seen, vec!["+a@1", "+b@2"]);
    assert!(cache.unsubscribe(subscription));
    backing.put(resource("g", "A", "c", "uc", "{}"));
    assert!(eventually(WAIT, || cache.list("g", "A").len() == 3).await);
    assert_eq!(recorder.len(), 2, "no events after unsubscribing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_with_a_selector_holds_exactly_the_matching_resources_as_they_change() {
    // A resource that stops matching leaves the cache (the node sends a Delete), one that
    // starts matching enters it; the cache always equals the store's matching resources.
    let backing = Backing::new(Limits::default());
    backing.put(tiered("A", "a", "web", None));
    backing.put(tiered("A", "b", "db", None));
    let node = TestNode::start(backing.clone()).await;
    let client = Client::connect_with(&[node.address.as_str()], options())
        .await
        .unwrap();
    let spec = WatchSpec::new("g", "A").with_selector("tier=web");
    let cache = WatchCache::start(client, vec![spec], fast_retries()).unwrap();
    tokio::time::timeout(WAIT, cache.wait_primed())
        .await
        .expect("primed");
    let names = |cache: &WatchCache| -> Vec<String> {
        let mut v: Vec<String> = kind_names(&cache.list("g", "A"));
        v.sort();
        v
    };
    assert_eq!(names(&cache), ["A/a"]);
    backing.put(tiered("A", "a", "db", None)); // stops matching
    backing.put(tiered("A", "b", "web", None)); // starts matching
    backing.put(tiered("A", "c", "web", None)); // new, matching
    assert!(
        eventually(WAIT, || names(&cache) == ["A/b", "A/c"]).await,
        "{:?}",
        names(&cache)
    );
}

/// "Kind/name" of each resource, in the order given.
fn kind_names(resources: &[Arc<Resource>]) -> Vec<String> {
    resources
        .iter()
        .map(|r| {
            let id = r.id.as_ref().expect("id");
            format!("{}/{}", id.r#type.as_ref().expect("type").kind, id.name)
        })
        .collect()
}

/// A resource of `kind` with a `tier` metadata entry and an owner.
fn tiered(kind: &str, name: &str, tier: &str, owner: Option<&Resource>) -> Resource {
    let mut r = resource("g", kind, name, "", "{}");
    r.metadata.insert("tier".into(), tier.into());
    r.owner = owner.map(|o| Box::new(o.id.clone().expect("owner id")));
    r
}

fn by_tier() -> Index {
    Index::new("by-tier", |r: &Resource| {
        r.metadata.get("tier").cloned().into_iter().collect()
    })
}

/// Waits until the cache holds `id` at `version` (or, with `None`, nothing
/// at `id`'s key).
async fn cached_at(cache: &WatchCache, id: &Id, version: Option<&str>) {
    let any_uid = Id {
        uid: String::new(),
        ..id.clone()
    };
    assert!(
        eventually(WAIT, || cache
            .get(&any_uid)
            .map(|r| r.version.clone())
            .as_deref()
            == version)
        .await,
        "{id:?} never reached {version:?} in the cache"
    );
}

/// What the node answers to ListByOwner, as "Kind/name" in storage-key order.
async fn node_owned(client: &Client, owner: &Id) -> Vec<String> {
    let mut owned: Vec<Arc<Resource>> = client
        .list_by_owner(owner.clone())
        .await
        .expect("list by owner")
        .resources
        .into_iter()
        .map(Arc::new)
        .collect();
    owned.sort_by_key(|r| cairn_client::ResourceKey::of(r));
    kind_names(&owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_index_and_a_user_index_follow_writes_deletes_and_owner_changes() {
    // Once the cache holds a write (or lacks a deleted key), the indexes say
    // exactly the same at once: the owner index agrees with the node's
    // ListByOwner across both watched kinds, the user index with the tiers.
    let backing = Backing::new(Limits::default());
    let node = TestNode::start(backing.clone()).await;
    let client = Client::connect_with(&[node.address.as_str()], options())
        .await
        .unwrap();
    let o1 = client
        .create(resource("g", "Owner", "o1", "", "{}"))
        .await
        .unwrap();
    let o2 = client
        .create(resource("g", "Owner", "o2", "", "{}"))
        .await
        .unwrap();
    let a1 = client
        .create(tiered("A", "a1", "web", Some(&o1)))
        .await
        .unwrap();
    let cache = WatchCache::builder(
        client.clone(),
        vec![WatchSpec::new("g", "A"), WatchSpec::new("g", "B")],
    )
    .options(fast_retries())
    .index(by_tier())
    .start()
    .unwrap();
    tokio::time::timeout(WAIT, cache.wait_primed())
        .await
        .expect("primed");
    let o1_id = o1.id.clone().unwrap();
    let o2_id = o2.id.clone().unwrap();
    assert_eq!(kind_names(&cache.list_by_owner(&o1_id)), vec!["A/a1"]);
    assert_eq!(
        kind_names(&cache.by_index("by-tier", "web").unwrap()),
        vec!["A/a1"]
    );

    // Writes of both kinds under o1.
    let a2 = client
        .create(tiered("A", "a2", "db", Some(&o1)))
        .await
        .unwrap();
    let b1 = client
        .create(tiered("B", "b1", "web", Some(&o1)))
        .await
        .unwrap();
    cached_at(&cache, a2.id.as_ref().unwrap(), Some(&a2.version)).await;
    cached_at(&cache, b1.id.as_ref().unwrap(), Some(&b1.version)).await;
    let owned = cache.list_by_owner(&o1_id);
    assert_eq!(kind_names(&owned), vec!["A/a1", "A/a2", "B/b1"]);
    assert_eq!(kind_names(&owned), node_owned(&client, &o1_id).await);
    assert_eq!(
        kind_names(&cache.by_index("by-tier", "web").unwrap()),
        vec!["A/a1", "B/b1"]
    );
    assert_eq!(
        kind_names(&cache.by_index("by-tier", "db").unwrap()),
        vec!["A/a2"]
    );
    // The index hands out the table's own resource, not a copy.
    let a2_cached = cache.get(a2.id.as_ref().unwrap()).unwrap();
    assert!(Arc::ptr_eq(&owned[1], &a2_cached));

    // a1 changes owner and tier.
    let a1_moved = client
        .read_modify_write(a1.id.clone().unwrap(), |r| {
            let mut next = tiered("A", "a1", "db", Some(&o2));
            next.id = r.id.clone();
            Some(next)
        })
        .await
        .unwrap();
    cached_at(&cache, a1.id.as_ref().unwrap(), Some(&a1_moved.version)).await;
    assert_eq!(
        kind_names(&cache.list_by_owner(&o1_id)),
        vec!["A/a2", "B/b1"]
    );
    assert_eq!(kind_names(&cache.list_by_owner(&o2_id)), vec!["A/a1"]);
    assert_eq!(
        kind_names(&cache.list_by_owner(&o1_id)),
        node_owned(&client, &o1_id).await
    );
    assert_eq!(
        kind_names(&cache.list_by_owner(&o2_id)),
        node_owned(&client, &o2_id).await
    );
    assert_eq!(
        kind_names(&cache.by_index("by-tier", "web").unwrap()),
        vec!["B/b1"]
    );
    assert_eq!(
        kind_names(&cache.by_index("by-tier", "db").unwrap()),
        vec!["A/a1", "A/a2"]
    );

    // a2 is deleted.
    client.delete_current(a2.id.clone().unwrap()).await.unwrap();
    cached_at(&cache, a2.id.as_ref().unwrap(), None).await;
    assert_eq!(kind_names(&cache.list_by_owner(&o1_id)), vec!["B/b1"]);
    assert_eq!(
        kind_names(&cache.list_by_owner(&o1_id)),
        node_owned(&client, &o1_id).await
    );
    assert_eq!(
        kind_names(&cache.by_index("by-tier", "db").unwrap()),
        vec!["A/a1"]
    );

    // As the node's rule: another uid finds nothing, another group version the same.
    let other_lifetime = Id {
        uid: "another-uid".into(),
        ..o1_id.clone()
    };
    assert!(cache.list_by_owner(&other_lifetime).is_empty());
    assert!(node_owned(&client, &other_lifetime).await.is_empty());
    let mut other_version = o1_id.clone();
    other_version.r#type.as_mut().unwrap().group_version = "v9".into();
    assert_eq!(
        kind_names(&cache.list_by_owner(&other_version)),
        vec!["B/b1"]
    );
    assert_eq!(node_owned(&client, &other_version).await, vec!["B/b1"]);

    match cache.by_index("by-colour", "red") {
        Err(ClientError::InvalidArgument { field, reason }) => {
            assert_eq!(field, "index");
            assert!(reason.contains("by-colour"), "{reason}");
        }
        other => panic!("an unknown index must be InvalidArgument, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_declared_twice_is_refused_when_the_cache_starts() {
    let client = Client::new(&[TestNode::dead_address().await.as_str()], options()).unwrap();
    let started = WatchCache::builder(client, vec![WatchSpec::new("g", "A")])
        .index(by_tier())
        .index(by_tier())
        .start();
    match started {
        Err(ClientError::InvalidArgument { field, reason }) => {
            assert_eq!(field, "indexes[1].name");
            assert!(reason.contains("by-tier"), "{reason}");
        }
        Err(other) => panic!("expected InvalidArgument, got {other:?}"),
        Ok(_) => panic!("a repeated index name was accepted"),
    }
}

/// Records status updates.
fn status_recorder() -> (
    Arc<Mutex<Vec<StatusUpdate>>>,
    impl FnMut(&StatusUpdate) + Send + 'static,
) {
    let seen: Arc<Mutex<Vec<StatusUpdate>>> = Arc::default();
    let sink = seen.clone();
    (seen, move |u: &StatusUpdate| sink.lock().push(*u))
}

fn statuses(seen: &Mutex<Vec<StatusUpdate>>) -> Vec<CacheStatus> {
    seen.lock().iter().map(|u| u.status).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_callbacks_go_from_waiting_to_resync_to_in_sync_with_the_revision() {
    // Started while the node is down: WaitingForDatastore (no revision), then
    // ResyncInProgress, then InSync with a revision that covers every write
    // acknowledged before the cache started. A callback registered late
    // gets InSync first; later changes reach both, in order, and a
    // reconnection does not un-prime the cache.
    let backing = Backing::new(Limits::default());
    let mut node = TestNode::start(backing.clone()).await;
    let client = Client::connect_with(&[node.address.as_str()], options())
        .await
        .unwrap();
    client
        .create(resource("g", "A", "x", "", "{}"))
        .await
        .unwrap();
    let last = client
        .create(resource("g", "A", "y", "", "{}"))
        .await
        .unwrap();
    let acknowledged: u64 = last.version.parse().unwrap();
    node.stop().await;

    let (first, on_first) = status_recorder();
    let cache = WatchCache::builder(client, vec![WatchSpec::new("g", "A")])
        .options(fast_retries())
        .on_status(on_first)
        .start()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        first.lock().clone(),
        vec![StatusUpdate {
            status: CacheStatus::WaitingForDatastore,
            revision: None
        }]
    );
    assert_eq!(cache.revision(), None);

    node.restart().await;
    tokio::time::timeout(WAIT, cache.wait_primed())
        .await
        .expect("primed");
    assert!(
        eventually(WAIT, || first.lock().len() == 3).await,
        "{:?}",
        first.lock()
    );
    assert_eq!(
        statuses(&first),
        vec![
            CacheStatus::WaitingForDatastore,
            CacheStatus::ResyncInProgress,
            CacheStatus::InSync
        ]
    );
    let in_sync = first.lock()[2];
    let revision = in_sync.revision.expect("InSync carries a revision");
    assert!(revision >= acknowledged, "{revision} < {acknowledged}");
    assert_eq!(*cache.status_changes().borrow(), in_sync);
    assert_eq!(cache.revision(), Some(revision));

    let (late, on_late) = status_recorder();
    cache.on_status(on_late);
    assert_eq!(
        late.lock().clone(),
        vec![in_sync],
        "the current status first"
    );

    // A reconnection: both callbacks see it, in order; priming stays.
    node.stop().await;
    assert!(eventually(WAIT, || statuses(&late).len() == 2).await);
    let waiting = late.lock()[1];
    assert_eq!(waiting.status, CacheStatus::WaitingForDatastore);
    assert!(
        waiting.revision >= Some(revision),
        "the revision never goes back"
    );
    assert!(
        cache.is_primed(),
        "a reconnection does not un-prime the cache"
    );
    node.restart().await;
    assert!(
        eventually(WAIT, || statuses(&late).last()
            == Some(&CacheStatus::InSync))
        .await
    );
    let expected_tail = statuses(&late);
    assert_eq!(
        statuses(&first)[2..],
        expected_tail[..],
        "both saw the same changes"
    );
    assert_eq!(
        expected_tail[..2],
        [CacheStatus::InSync, CacheStatus::WaitingForDatastore]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_priming_barrier_opens_only_once_every_registered_cache_is_primed() {
    // Two caches on different kinds; B's snapshot trickles in. While it does,
    // a bounded wait fails naming B's cache only; the full wait returns once
    // B is primed too, with every B resource in; a later reconnection leaves
    // the barrier open.
    let backing = Backing::new(Limits::default());
    for i in 0..20 {
        backing.put(resource(
            "g",
            "A",
            &format!("a{i:02}"),
            &format!("ua{i}"),
            "{}",
        ));
        backing.put(resource(
            "g",
            "B",
            &format!("b{i:02}"),
            &format!("ub{i}"),
            "{}",
        ));
    }
    let mut node = TestNode::start(backing.clone()).await;
    node.control
        .event_delay
        .lock()
        .insert("B".into(), Duration::from_millis(30));
    let client = Client::connect_with(&[node.address.as_str()], options())
        .await
        .unwrap();
    let barrier = PrimingBarrier::new();
    assert!(barrier.is_primed(), "a barrier without caches is open");
    let cache_a = WatchCache::start(
        client.clone(),
        vec![WatchSpec::new("g", "A")],
        fast_retries(),
    )
    .unwrap();
    let cache_b =
        WatchCache::start(client, vec![WatchSpec::new("g", "B")], fast_retries()).unwrap();
    barrier.register(&cache_a);
    barrier.register(&cache_b);

    tokio::time::timeout(WAIT, cache_a.wait_primed())
        .await
        .expect("A primed");
    assert!(!cache_b.is_primed(), "B's snapshot takes 600 ms");
    match barrier.wait_timeout(Duration::from_millis(20)).await {
        Err(ClientError::DeadlineExceeded {
            detail,
            deadline_ms,
            ..
        }) => {
            assert_eq!(deadline_ms, 20);
            assert!(detail.contains("#2 [g.B]"), "{detail}");
            assert!(!detail.contains("g.A"), "A is primed: {detail}");
        }
        other => panic!("expected DeadlineExceeded, got {other:?}"),
    }
    assert!(!barrier.is_primed());

    tokio::time::timeout(WAIT, barrier.clone().wait())
        .await
        .expect("the barrier opens")
        .expect("no cache was dropped");
    assert!(cache_a.is_primed() && cache_b.is_primed());
    assert_eq!(cache_b.list("g", "B").len(), 20, "B's whole snapshot is in");

    node.stop().await;
    assert!(
        eventually(WAIT, || cache_b.status()
            == CacheStatus::WaitingForDatastore)
        .await
    );
    assert!(barrier.is_primed(), "primed means the first snapshot is in");
    barrier
        .wait_timeout(Duration::from_millis(1))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_barrier_reports_a_cache_dropped_before_it_primed() {
    // It can never prime: the wait ends with an error instead of hanging.
    let client = Client::new(&[TestNode::dead_address().await.as_str()], options()).unwrap();
    let barrier = PrimingBarrier::new();
    let cache = WatchCache::start(client, vec![WatchSpec::new("g", "A")], fast_retries()).unwrap();
    barrier.register(&cache);
    drop(cache);
    match tokio::time::timeout(WAIT, barrier.wait())
        .await
        .expect("the wait ends")
    {
        Err(ClientError::InvalidArgument { field, reason }) => {
            assert_eq!(field, "barrier");
            assert!(reason.contains("#1 [g.A]"), "{reason}");
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_consistent_reads_share_watch_progress_calls() {
    // 64 consistent reads asked at once, while each WatchProgress call takes
    // 20 ms: they share a few calls (one in flight; the next names the watches
    // of every read queued meanwhile), not one each, and every one of them
    // holds the write made just before.
    let backing = Backing::new(Limits::default());
    backing.put(resource("g", "A", "a", "ua", "{}"));
    let node = TestNode::start(backing.clone()).await;
    *node.control.progress_delay.lock() = Duration::from_millis(20);
    let client = Client::connect_with(&[node.address.as_str()], options())
        .await
        .unwrap();
    let cache = Arc::new(
        WatchCache::start(
            client,
            vec![WatchSpec::new("g", "A")],
            WatchCacheOptions::default(),
        )
        .unwrap(),
    );
    cache.wait_primed().await;
    let written = backing.put(resource("g", "A", "b", "ub", "{}"));
    let reads: Vec<_> = (0..64)
        .map(|_| {
            let cache = cache.clone();
            tokio::spawn(async move { cache.get_consistent(&id("g", "A", "b", "")).await })
        })
        .collect();
    for read in reads {
        let found = read.await.unwrap().expect("a consistent read");
        assert_eq!(
            found.map(|r| r.version.clone()),
            Some(written.version.clone()),
            "the write made just before"
        );
    }
    let calls = node.control.progress_calls.load(Ordering::SeqCst);
    println!("64 consistent reads, {calls} WatchProgress calls");
    assert!(calls <= 4, "{calls} WatchProgress calls for 64 reads");
}

/// How a scripted watch goes on after its events.
#[derive(Clone)]
enum Tail {
    /// The stream ends (the node went away).
    Ends,
    /// The stream stays open and quiet.
    StaysOpen,
    /// The stream ends once the test says so.
    EndsWhen(Arc<tokio::sync::Notify>),
}

/// One scripted watch: the cluster its node names, its events, its tail.
type Scripted = (Option<&'static str>, Vec<Event>, Tail);

/// A `ResourceApi` that answers each `watch_list` of a kind with the next
/// watch scripted for that kind, and records the start revisions asked.
#[derive(Default)]
struct ScriptedWatches {
    scripts: Mutex<std::collections::HashMap<String, std::collections::VecDeque<Scripted>>>,
    start_revisions: Arc<Mutex<Vec<(String, u64)>>>,
}

impl ScriptedWatches {
    fn script(self, kind: &str, watches: Vec<Scripted>) -> ScriptedWatches {
        self.scripts.lock().insert(kind.to_string(), watches.into());
        self
    }

    fn asked(&self, kind: &str) -> Vec<u64> {
        let asked = self.start_revisions.lock();
        asked
            .iter()
            .filter(|(k, _)| k == kind)
            .map(|(_, r)| *r)
            .collect()
    }
}

impl cairn_client::ResourceApi for ScriptedWatches {
    fn read(&self, _: Id, _: Consistency) -> ApiFuture<'_, Arc<Resource>> {
        Box::pin(async { Err(unscripted()) })
    }
    fn write(&self, _: Resource) -> ApiFuture<'_, Arc<Resource>> {
        Box::pin(async { Err(unscripted()) })
    }
    fn delete_request(
        &self,
        _: cairn_proto::v1::DeleteRequest,
    ) -> ApiFuture<'_, cairn_proto::v1::DeleteResponse> {
        Box::pin(async { Err(unscripted()) })
    }
    fn write_status(&self, _: cairn_proto::v1::WriteStatusRequest) -> ApiFuture<'_, Arc<Resource>> {
        Box::pin(async { Err(unscripted()) })
    }
    fn list(&self, _: ListRequest) -> ApiFuture<'_, cairn_client::Listing> {
        Box::pin(async { Err(unscripted()) })
    }
    fn list_page(&self, _: ListRequest) -> ApiFuture<'_, cairn_client::Listing> {
        Box::pin(async { Err(unscripted()) })
    }
    fn list_by_owner(&self, _: Id) -> ApiFuture<'_, cairn_client::Listing> {
        Box::pin(async { Err(unscripted()) })
    }
    fn watch_list(&self, request: WatchListRequest) -> ApiFuture<'_, cairn_client::Watch> {
        let kind = request.r#type.map(|t| t.kind).unwrap_or_default();
        self.start_revisions
            .lock()
            .push((kind.clone(), request.start_revision));
        let next = self
            .scripts
            .lock()
            .get_mut(&kind)
            .and_then(|script| script.pop_front());
        Box::pin(async move {
            let (cluster, events, tail) = next.ok_or_else(unscripted)?;
            let events = futures::stream::iter(events.into_iter().map(Ok));
            let events: futures::stream::BoxStream<'static, _> = match tail {
                Tail::Ends => events.boxed(),
                Tail::StaysOpen => events.chain(futures::stream::pending()).boxed(),
                Tail::EndsWhen(notify) => events
                    .chain(
                        futures::stream::once(async move { notify.notified().await })
                            .filter_map(|()| async { None }),
                    )
                    .boxed(),
            };
            Ok(cairn_client::Watch::new(
                "node",
                None,
                cluster.map(str::to_string),
                events,
            ))
        })
    }
    fn watch_progress(&self, _: &str, _: Vec<u64>) -> ApiFuture<'_, cairn_client::WatchProgress> {
        Box::pin(async { Err(unscripted()) })
    }
    fn avoid(&self, _: &str) {}
}

fn unscripted() -> ClientError {
    ClientError::Unauthenticated("not in the script".into())
}

/// An Upsert of `g.kind` `name` (uid `name`) at `revision`, holding `data`.
fn upsert(kind: &str, name: &str, revision: u64, data: &str) -> Event {
    let mut r = resource("g", kind, name, name, data);
    r.version = revision.to_string();
    Event {
        revision,
        kind: EventKind::Upsert(Arc::new(r)),
    }
}

fn end_of_snapshot(revision: u64) -> Event {
    Event {
        revision,
        kind: EventKind::EndOfSnapshot,
    }
}

/// Waits until the cache holds `expected` for `g.kind`; panics naming what it holds.
async fn holds(cache: &WatchCache, kind: &str, expected: &[&str], api: &ScriptedWatches) {
    let converged = eventually(WAIT, || cached(cache, "g", kind) == expected).await;
    assert!(
        converged,
        "the cache holds {expected:?} of {kind}: {:?} ({:?}; watches asked from {:?})",
        cached(cache, "g", kind),
        cache.stats(),
        api.asked(kind)
    );
}

#[tokio::test]
async fn a_watch_from_a_node_that_names_no_cluster_is_never_used() {
    // The cache primes from cluster X at revision 40; the stream ends. The
    // next node it reaches names no cluster (wiped, not yet joined to the new
    // cluster Y formed at the same addresses): its watch, resumed at 40,
    // would skip Y's history by revision and deliver whatever follows
    // ("ghost"). The cache must not use it; it tries again, hears Y, and
    // resyncs from scratch to exactly Y's state.
    let api = Arc::new(ScriptedWatches::default().script(
        "A",
        vec![
            (
                Some("X"),
                vec![upsert("A", "old", 40, "{}"), end_of_snapshot(40)],
                Tail::Ends,
            ),
            (None, vec![upsert("A", "ghost", 41, "{}")], Tail::StaysOpen),
            (Some("Y"), vec![], Tail::StaysOpen),
            (
                Some("Y"),
                vec![upsert("A", "new", 3, "{}"), end_of_snapshot(3)],
                Tail::StaysOpen,
            ),
        ],
    ));
    let cache =
        WatchCache::start(api.clone(), vec![WatchSpec::new("g", "A")], fast_retries()).unwrap();
    holds(&cache, "A", &["new@3"], &api).await;
    let stats = cache.stats();
    assert_eq!(stats.cluster_changes, 1, "{stats:?}");
    assert_eq!(stats.replays, 0, "no watch was resumed: {stats:?}");
    assert_eq!(
        api.asked("A"),
        [0, 39, 39, 0],
        "snapshot, two resumes, snapshot"
    );
}

#[tokio::test]
async fn a_cluster_change_heard_by_one_type_resyncs_a_type_whose_stream_is_quiet() {
    // Types A and B prime from cluster X. A's stream ends and its next watch
    // names cluster Y. B's stream to X stays open and quiet: it must resync
    // from Y all the same, never holding X's B beside Y's A.
    let a_ends = Arc::new(tokio::sync::Notify::new());
    let api = Arc::new(
        ScriptedWatches::default()
            .script(
                "A",
                vec![
                    (
                        Some("X"),
                        vec![upsert("A", "a-x", 10, "{}"), end_of_snapshot(10)],
                        Tail::EndsWhen(a_ends.clone()),
                    ),
                    (Some("Y"), vec![], Tail::StaysOpen),
                    (
                        Some("Y"),
                        vec![upsert("A", "a-y", 2, "{}"), end_of_snapshot(2)],
                        Tail::StaysOpen,
                    ),
                ],
            )
            .script(
                "B",
                vec![
                    (
                        Some("X"),
                        vec![upsert("B", "b-x", 10, "{}"), end_of_snapshot(10)],
                        Tail::StaysOpen,
                    ),
                    (
                        Some("Y"),
                        vec![upsert("B", "b-y", 2, "{}"), end_of_snapshot(2)],
                        Tail::StaysOpen,
                    ),
                ],
            ),
    );
    let cache = WatchCache::start(
        api.clone(),
        vec![WatchSpec::new("g", "A"), WatchSpec::new("g", "B")],
        fast_retries(),
    )
    .unwrap();
    cache.wait_primed().await;
    a_ends.notify_one();
    holds(&cache, "A", &["a-y@2"], &api).await;
    holds(&cache, "B", &["b-y@2"], &api).await;
    assert_eq!(cache.stats().cluster_changes, 1, "{:?}", cache.stats());
}

#[tokio::test]
async fn a_resync_from_another_cluster_replaces_a_resource_of_the_same_uid_and_version() {
    // Versions are log indexes, unique within one cluster only: cluster Y
    // (restored from a backup of X, then written) holds the same uid at the
    // same version as the cache's copy from X, with other data. The resync
    // must replace it, and tell subscribers.
    let api = Arc::new(ScriptedWatches::default().script(
        "A",
        vec![
            (
                Some("X"),
                vec![upsert("A", "r", 5, r#"{"from":"x"}"#), end_of_snapshot(5)],
                Tail::Ends,
            ),
            (Some("Y"), vec![], Tail::StaysOpen),
            (
                Some("Y"),
                vec![upsert("A", "r", 5, r#"{"from":"y"}"#), end_of_snapshot(5)],
                Tail::StaysOpen,
            ),
        ],
    ));
    let cache =
        WatchCache::start(api.clone(), vec![WatchSpec::new("g", "A")], fast_retries()).unwrap();
    cache.wait_primed().await;
    let from_y = eventually(WAIT, || {
        cache
            .get(&id("g", "A", "r", ""))
            .and_then(|r| r.data.clone())
            .is_some_and(|d| d.value.as_ref() == br#"{"from":"y"}"#)
    })
    .await;
    assert!(
        from_y,
        "Y's resource replaced X's: {:?} ({:?})",
        cache.get(&id("g", "A", "r", "")),
        cache.stats()
    );
}
