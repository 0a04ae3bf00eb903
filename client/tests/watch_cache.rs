//! WatchCache against in-process nodes backed by `cairn_fsm::Store`:
//! priming, resync after a restore, replay after a dropped connection, a
//! fresh snapshot after compaction, and no rewind behind a lagging node.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use cairn_client::{CacheStatus, Client, ClientOptions, WatchCache, WatchCacheOptions, WatchSpec};
use cairn_fsm::Limits;
use cairn_proto::v1::Resource;
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
