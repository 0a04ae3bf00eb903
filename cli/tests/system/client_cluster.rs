//! `cairn-client` against real `cairn` processes: every call with one of
//! three nodes dead (a follower, then the leader), and the WatchCache's
//! priming barrier and resync behind a killed-and-restarted node that
//! catches up through a snapshot install (a restore on that node).

use crate::client_support;

use std::time::Duration;

use cairn_client::{CacheStatus, Client, ClientError, WatchCache, WatchCacheOptions, WatchSpec};
use cairn_proto::v1::{watch_event, Consistency, WatchListRequest};
use client_support::*;

/// Every call of the contract and every helper, each required to succeed.
async fn every_call_succeeds(client: &Client, tag: &str) {
    let owner = client
        .create(thing("Owner", &format!("owner-{tag}"), "{}"))
        .await
        .expect("create owner");
    let owner_id = owner.id.clone().expect("owner id");
    let mut child = thing("Thing", &format!("child-{tag}"), "{\"n\":0}");
    child.owner = Some(Box::new(owner_id.clone()));
    let created = client.create(child).await.expect("create child");
    let child_id = id("Thing", &format!("child-{tag}"));

    let strong = client
        .read(child_id.clone(), Consistency::Strong)
        .await
        .expect("strong read");
    assert_eq!(strong, created);
    // An eventual read may be served by a node that has not applied it yet.
    assert!(
        eventually(Duration::from_secs(10), || {
            let (client, child_id) = (client.clone(), child_id.clone());
            async move { client.read(child_id, Consistency::Eventual).await.is_ok() }
        })
        .await,
        "eventual read"
    );

    let mut next = strong.clone();
    next.data = thing("Thing", "x", "{\"n\":1}").data;
    let updated = client.write(next).await.expect("CAS write");
    assert!(updated.version.parse::<u64>().unwrap() > created.version.parse::<u64>().unwrap());

    let modified = client
        .read_modify_write(child_id.clone(), |current| {
            let mut r = current.clone();
            r.metadata.insert("touched".into(), "yes".into());
            Some(r)
        })
        .await
        .expect("read_modify_write");
    assert_eq!(
        modified.metadata.get("touched").map(String::as_str),
        Some("yes")
    );

    let (existing, created_now) = client
        .create_if_absent(thing("Owner", &format!("owner-{tag}"), "{\"other\":1}"))
        .await
        .expect("create_if_absent");
    assert!(!created_now);
    assert_eq!(existing.id, owner.id);

    let listed = client
        .list(
            unversioned("Thing"),
            any_tenancy(),
            format!("child-{tag}"),
            Consistency::Strong,
        )
        .await
        .expect("strong list");
    assert_eq!(listed.resources, vec![modified.clone()]);
    client
        .list(
            unversioned("Thing"),
            any_tenancy(),
            "",
            Consistency::Eventual,
        )
        .await
        .expect("eventual list");
    assert!(
        eventually(Duration::from_secs(10), || {
            let (client, owner_id, modified) = (client.clone(), owner_id.clone(), modified.clone());
            async move {
                client
                    .list_by_owner(owner_id)
                    .await
                    .map(|l| l.resources.contains(&modified))
                    .unwrap_or(false)
            }
        })
        .await,
        "list by owner"
    );

    let mut watch = client
        .watch_list(WatchListRequest {
            r#type: Some(unversioned("Thing")),
            tenancy: Some(any_tenancy()),
            name_prefix: format!("child-{tag}"),
            start_revision: 0,
            ..Default::default()
        })
        .await
        .expect("watch opens");
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(event) = watch.next().await {
            if let watch_event::Event::EndOfSnapshot(_) =
                event.expect("watch event").event.expect("event body")
            {
                return true;
            }
        }
        false
    })
    .await
    .expect("snapshot within 10 s");
    assert!(end, "the watch delivered its EndOfSnapshot");

    let deleted = client
        .delete_current(child_id.clone())
        .await
        .expect("delete_current");
    assert_eq!(deleted.map(|r| r.version), Some(modified.version));
    assert!(matches!(
        client.read(child_id, Consistency::Strong).await,
        Err(ClientError::NotFound)
    ));
    client
        .delete(owner_id, owner.version.clone())
        .await
        .expect("delete by exact version");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_call_succeeds_with_one_of_three_nodes_dead() {
    // First a dead follower is the first endpoint; then, with it back, the
    // leader is killed and is the first endpoint: each call fails over (and
    // waits out the election) within its deadline.
    tokio::time::timeout(Duration::from_secs(180), async {
        let mut cluster = Cluster::start(options(3));
        let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
        let follower = cluster
            .ids()
            .into_iter()
            .find(|id| *id != leader)
            .expect("a follower");

        cluster.kill(follower);
        let mut endpoints = vec![cluster.node(follower).client_address.clone()];
        endpoints.extend(
            cluster
                .ids_except(follower)
                .into_iter()
                .map(|id| cluster.node(id).client_address.clone()),
        );
        let client = client_for(&endpoints).await;
        every_call_succeeds(&client, "follower-dead").await;

        cluster.spawn(follower);
        assert!(
            eventually(Duration::from_secs(30), || {
                let status = cluster.status(follower);
                async move { status.await.is_some() }
            })
            .await,
            "node {follower} came back"
        );
        cluster.kill(leader);
        let mut endpoints = vec![cluster.node(leader).client_address.clone()];
        endpoints.extend(
            cluster
                .ids_except(leader)
                .into_iter()
                .map(|id| cluster.node(id).client_address.clone()),
        );
        let client = client_for(&endpoints).await;
        every_call_succeeds(&client, "leader-dead").await;
    })
    .await
    .expect("the test finishes within 180 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_cache_is_primed_only_after_every_type_ended_its_snapshot() {
    // 300 resources of each of two types: right after wait_primed every one
    // of them is in the cache (an early barrier would miss some); later
    // changes arrive, and no callback ever repeats or rewinds a version.
    tokio::time::timeout(Duration::from_secs(180), async {
        let cluster = Cluster::start(options(3));
        cluster.wait_for_leader(LEADER_TIMEOUT).await;
        let client = client_for(&cluster.endpoints()).await;
        create_many(&client, "Alpha", "a-", 300).await;
        create_many(&client, "Beta", "b-", 300).await;

        let recorder = Recorder::default();
        let cache = WatchCache::start_with(
            client.clone(),
            vec![
                WatchSpec::new("demo", "Alpha"),
                WatchSpec::new("demo", "Beta"),
            ],
            WatchCacheOptions::default(),
            vec![recorder.callback()],
        )
        .expect("cache starts");
        tokio::time::timeout(Duration::from_secs(60), cache.wait_primed())
            .await
            .expect("primed within 60 s");
        assert_eq!(cache.list("demo", "Alpha").len(), 300);
        assert_eq!(cache.list("demo", "Beta").len(), 300);
        assert_eq!(recorder.count(), 600);

        for i in 0..10 {
            client
                .delete_current(id("Alpha", &format!("a-{i:05}")))
                .await
                .expect("delete");
            client
                .read_modify_write(id("Beta", &format!("b-{i:05}")), |r| {
                    let mut r = r.clone();
                    r.metadata.insert("i".into(), i.to_string());
                    Some(r)
                })
                .await
                .expect("update");
        }
        for kind in ["Alpha", "Beta"] {
            let expected = cluster_state(&client, kind).await;
            assert!(
                eventually(Duration::from_secs(30), || {
                    let same = cache_state(&cache, kind) == expected;
                    async move { same }
                })
                .await,
                "{kind}: the cache converges on the cluster's state"
            );
        }
        assert_eq!(cache.status(), CacheStatus::InSync);
        assert_eq!(recorder.violations(), Vec::<String>::new());
    })
    .await
    .expect("the test finishes within 180 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_cache_resyncs_behind_a_killed_node_that_restores_a_snapshot() {
    // The cache knows one follower only. The follower is killed; meanwhile
    // resources are deleted, changed and created, and enough other writes go
    // by that the leader compacts its log. Restarted, the follower installs
    // a snapshot (a restore, closing its watches); the cache replays or
    // resyncs, sweeps the deleted resources, ends InSync with the cluster's
    // state, and never repeats or rewinds a version.
    tokio::time::timeout(Duration::from_secs(300), async {
        let mut opts = options(3);
        opts.snapshot_log_entries = 500;
        let mut cluster = Cluster::start(opts);
        let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
        let follower = cluster
            .ids()
            .into_iter()
            .find(|id| *id != leader)
            .expect("a follower");
        let client = client_for(&cluster.endpoints()).await;
        create_many(&client, "Gamma", "g-", 50).await;

        let behind = client_for(&[cluster.node(follower).client_address.clone()]).await;
        let recorder = Recorder::default();
        let cache = WatchCache::start_with(
            behind,
            vec![WatchSpec::new("demo", "Gamma")],
            WatchCacheOptions::default(),
            vec![recorder.callback()],
        )
        .expect("cache starts");
        tokio::time::timeout(Duration::from_secs(60), cache.wait_primed())
            .await
            .expect("primed within 60 s");
        let expected = cluster_state(&client, "Gamma").await;
        assert!(
            eventually(Duration::from_secs(30), || {
                let same = cache_state(&cache, "Gamma") == expected;
                async move { same }
            })
            .await,
            "the follower's cache reaches the cluster's state"
        );

        let follower_last_log = cluster
            .status(follower)
            .await
            .expect("follower status")
            .last_log_index;
        cluster.kill(follower);
        assert!(
            eventually(Duration::from_secs(30), || {
                let waiting = cache.status() == CacheStatus::WaitingForDatastore;
                async move { waiting }
            })
            .await,
            "the cache notices its node is gone"
        );
        for i in 0..20 {
            client
                .delete_current(id("Gamma", &format!("g-{i:05}")))
                .await
                .expect("delete");
        }
        for i in 20..30 {
            client
                .read_modify_write(id("Gamma", &format!("g-{i:05}")), |r| {
                    let mut r = r.clone();
                    r.metadata.insert("changed".into(), "yes".into());
                    Some(r)
                })
                .await
                .expect("update");
        }
        create_many(&client, "Gamma", "new-", 5).await;
        // Enough entries for the leader to purge its log past what the
        // follower holds, so it can only catch up through a snapshot (how
        // many writes that takes depends on how many share an entry).
        let mut round = 0;
        loop {
            create_many(&client, "Filler", &format!("f{round}-"), 500).await;
            let status = cluster.status(leader).await.expect("leader status");
            if status.purged_index > follower_last_log {
                break;
            }
            round += 1;
            assert!(
                round < 60,
                "the leader never purged past the follower's log: {status:?}"
            );
        }

        cluster.spawn(follower);
        let expected = cluster_state(&client, "Gamma").await;
        assert_eq!(expected.len(), 35);
        assert!(
            eventually(Duration::from_secs(120), || {
                let same = cache_state(&cache, "Gamma") == expected
                    && cache.status() == CacheStatus::InSync;
                async move { same }
            })
            .await,
            "the cache converges on the restored state: {:?} vs {:?} ({:?})",
            cache_state(&cache, "Gamma"),
            expected,
            cache.stats()
        );
        let node_status = cluster.status(follower).await.expect("follower status");
        assert!(
            node_status.snapshot_index > 0,
            "the follower installed a snapshot: {node_status:?}"
        );
        let stats = cache.stats();
        assert!(
            stats.compacted >= 1 && stats.snapshots_applied >= 2,
            "a fresh snapshot was taken: {stats:?}"
        );
        assert_eq!(recorder.violations(), Vec::<String>::new());
    })
    .await
    .expect("the test finishes within 300 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_cache_resyncs_after_an_online_restore_through_the_cli() {
    // A backup is taken, then resources are deleted, changed and created.
    // `cairn snapshot restore` closes the cache's watch; the cache resyncs by
    // mark-and-sweep, drops what the restore removed, ends InSync with the
    // restored state, and no callback ever repeats or rewinds a version.
    tokio::time::timeout(Duration::from_secs(180), async {
        let cluster = Cluster::start(options(3));
        cluster.wait_for_leader(LEADER_TIMEOUT).await;
        let client = client_for(&cluster.endpoints()).await;
        create_many(&client, "Delta", "d-", 100).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let backup = dir.path().join("backup.snap");
        let endpoints = cluster.endpoints().join(",");
        let cairn = |args: &[&str]| {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
                .args(args)
                .output()
                .expect("run cairn");
            assert!(
                out.status.success(),
                "cairn {args:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        cairn(&[
            "snapshot",
            "save",
            backup.to_str().unwrap(),
            "--endpoints",
            &endpoints,
        ]);
        let backed_up: Vec<String> = cluster_state(&client, "Delta")
            .await
            .into_iter()
            .map(|s| s.split('@').next().unwrap().to_string())
            .collect();

        let recorder = Recorder::default();
        let cache = WatchCache::start_with(
            client.clone(),
            vec![WatchSpec::new("demo", "Delta")],
            WatchCacheOptions::default(),
            vec![recorder.callback()],
        )
        .expect("cache starts");
        tokio::time::timeout(Duration::from_secs(60), cache.wait_primed())
            .await
            .expect("primed within 60 s");
        for i in 0..20 {
            client
                .delete_current(id("Delta", &format!("d-{i:05}")))
                .await
                .expect("delete");
        }
        for i in 20..30 {
            client
                .read_modify_write(id("Delta", &format!("d-{i:05}")), |r| {
                    let mut r = r.clone();
                    r.metadata.insert("changed".into(), "yes".into());
                    Some(r)
                })
                .await
                .expect("update");
        }
        create_many(&client, "Delta", "new-", 5).await;
        let before_restore = cluster_state(&client, "Delta").await;
        assert!(
            eventually(Duration::from_secs(30), || {
                let same = cache_state(&cache, "Delta") == before_restore;
                async move { same }
            })
            .await,
            "the cache follows the changes"
        );
        let snapshots_before = cache.stats().snapshots_applied;

        cairn(&[
            "snapshot",
            "restore",
            "--yes",
            backup.to_str().unwrap(),
            "--endpoints",
            &endpoints,
        ]);
        let restored = cluster_state(&client, "Delta").await;
        let restored_names: Vec<String> = restored
            .iter()
            .map(|s| s.split('@').next().unwrap().to_string())
            .collect();
        assert_eq!(restored_names, backed_up, "the cluster holds the backup");
        assert!(
            eventually(Duration::from_secs(60), || {
                let same = cache_state(&cache, "Delta") == restored
                    && cache.status() == CacheStatus::InSync;
                async move { same }
            })
            .await,
            "the cache converges on the restored state: {:?} vs {:?} ({:?})",
            cache_state(&cache, "Delta").len(),
            restored.len(),
            cache.stats()
        );
        assert!(
            cache.stats().snapshots_applied > snapshots_before,
            "the cache resynced from a fresh snapshot: {:?}",
            cache.stats()
        );
        assert_eq!(recorder.violations(), Vec::<String>::new());
    })
    .await
    .expect("the test finishes within 180 s");
}
