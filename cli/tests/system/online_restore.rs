//! Online restore into a running cluster: through the CLI with open watches,
//! damaged uploads refused by the leader, and restores interrupted by a
//! client going away or the leader being killed mid-way — every node ends
//! fully old or fully new, never mixed.

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use cairn_proto::error::ApiError;
use cairn_proto::v1::admin_service_client::AdminServiceClient;
use cairn_proto::v1::watch_event::Event;
use cairn_proto::v1::{Consistency, Resource, SnapshotChunk, WatchListRequest};
use support::*;

const LEADER_TIMEOUT: Duration = Duration::from_secs(20);
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(20);

/// Writes `count` Things named `{prefix}-NNNNN` with `payload_bytes` of data.
async fn fill(address: &str, prefix: &str, count: usize, payload_bytes: usize) {
    let payload = vec![b'x'; payload_bytes];
    for i in 0..count {
        write(
            address,
            thing(&format!("{prefix}-{i:05}"), "u1", "", &payload),
        )
        .await
        .unwrap();
    }
}

/// Saves a backup through the CLI; returns its resources by name.
fn save(cluster: &Cluster, file: &Path) -> BTreeMap<String, Resource> {
    let out = cairn(&[
        "snapshot",
        "save",
        file.to_str().unwrap(),
        "--endpoints",
        &cluster.endpoints().join(","),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let mut resources = BTreeMap::new();
    cairn_server::snapshot_file::verify(file, |r, _| {
        resources.insert(r.id.as_ref().unwrap().name.clone(), r.clone());
    })
    .unwrap();
    resources
}

/// Every Thing on `address` by name (eventual list).
async fn things_on(address: &str) -> Option<BTreeMap<String, Resource>> {
    let resources = list(address, Consistency::Eventual).await.ok()?;
    Some(
        resources
            .into_iter()
            .map(|r| (r.id.as_ref().unwrap().name.clone(), r))
            .collect(),
    )
}

/// Waits until every node of `ids` holds exactly the names of `expected`;
/// returns what one of them holds.
async fn converge(
    cluster: &Cluster,
    ids: &[u64],
    expected: &BTreeMap<String, Resource>,
) -> BTreeMap<String, Resource> {
    let want: Vec<&String> = expected.keys().collect();
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    loop {
        let mut held = Vec::new();
        for id in ids {
            held.push(things_on(&cluster.node(*id).client_address).await);
        }
        if held
            .iter()
            .all(|h| h.as_ref().map(|h| h.keys().collect::<Vec<_>>()) == Some(want.clone()))
        {
            return held.pop().flatten().unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "nodes did not converge on {} resources: {:?}",
            expected.len(),
            held.iter()
                .map(|h| h.as_ref().map(|h| h.len()))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Uploads `bytes` to `address`'s RestoreSnapshot in 64 KiB pieces.
async fn upload(address: &str, bytes: Vec<u8>) -> Result<(u64, u64), ApiError> {
    let mut admin = AdminServiceClient::connect(format!("http://{address}"))
        .await
        .unwrap();
    let chunks: Vec<SnapshotChunk> = bytes
        .chunks(64 * 1024)
        .map(|c| SnapshotChunk {
            data: c.to_vec().into(),
        })
        .collect();
    admin
        .restore_snapshot(futures::stream::iter(chunks))
        .await
        .map(|r| {
            let r = r.into_inner();
            (r.log_index, r.resource_count)
        })
        .map_err(ApiError::from)
}

async fn pending_on(cluster: &Cluster, id: u64) -> Option<String> {
    cluster
        .status(id)
        .await
        .and_then(|s| s.pending_restore)
        .map(|p| p.restore_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_restores_online_into_the_same_cluster_and_closes_every_watch() {
    // After `cairn snapshot restore`, every node holds exactly the backup,
    // every watch open before it ended with WatchClosed, new watches see the
    // restored state, and every version is greater than any handed out before.
    let cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let leader_address = cluster.node(leader).client_address.clone();
    fill(&leader_address, "a", 200, 100).await;
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("backup.snap");
    let in_backup = save(&cluster, &backup);
    assert_eq!(in_backup.len(), 200);
    // Changes after the backup, which the restore must undo.
    fill(&leader_address, "b", 20, 10).await;
    let changed = write(
        &leader_address,
        thing("a-00000", "u1", &in_backup["a-00000"].version, b"changed"),
    )
    .await
    .unwrap();
    let version_before: u64 = changed.version.parse().unwrap();

    let mut watches = Vec::new();
    for id in cluster.ids() {
        let mut stream = client(&cluster.node(id).client_address)
            .await
            .watch_list(WatchListRequest {
                r#type: Some(thing_type()),
                tenancy: Some(tenancy()),
                name_prefix: String::new(),
                start_revision: 0,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        // Read through the snapshot so the watch is live.
        loop {
            let e = stream.message().await.unwrap().unwrap();
            if matches!(e.event, Some(Event::EndOfSnapshot(_))) {
                break;
            }
        }
        watches.push((id, stream));
    }

    let out = cairn(&[
        "snapshot",
        "restore",
        "--yes",
        backup.to_str().unwrap(),
        "--endpoints",
        &cluster.endpoints().join(","),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("restored"), "{}", text(&out));

    for (id, mut stream) in watches {
        let ended = tokio::time::timeout(CONVERGE_TIMEOUT, async {
            loop {
                match stream.message().await {
                    Ok(Some(_)) => continue,
                    Ok(None) => return None,
                    Err(status) => return Some(ApiError::from_status(&status)),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("node {id}: the watch stayed open after the restore"));
        assert!(
            matches!(ended, Some(ApiError::WatchClosed(_))),
            "node {id}: the watch ended with {ended:?}"
        );
    }

    let restored = converge(&cluster, &cluster.ids(), &in_backup).await;
    let restored_version: u64 = restored["a-00000"].version.parse().unwrap();
    assert!(restored_version > version_before);
    for (name, r) in &restored {
        assert_eq!(r.data, in_backup[name].data, "{name}: data differs");
        assert_eq!(r.version, restored_version.to_string(), "{name}");
    }
    // A version from before the restore matches nothing; a fresh one works.
    match write(
        &leader_address,
        thing("a-00000", "u1", &changed.version, b"stale"),
    )
    .await
    {
        Err(ApiError::CasFailure(_)) => {}
        other => panic!("a version from before the restore was accepted: {other:?}"),
    }
    let after = write(
        &leader_address,
        thing("a-00000", "u1", &restored_version.to_string(), b"new"),
    )
    .await
    .unwrap();
    assert!(after.version.parse::<u64>().unwrap() > restored_version);
    // A new watch starts from the restored state.
    let mut stream = client(&leader_address)
        .await
        .watch_list(WatchListRequest {
            r#type: Some(thing_type()),
            tenancy: Some(tenancy()),
            name_prefix: "b-".into(),
            start_revision: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert!(
        matches!(first.event, Some(Event::EndOfSnapshot(_))),
        "the b- things written after the backup are gone: {first:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_or_cut_uploads_change_nothing() {
    // The leader verifies the whole upload before proposing anything: a
    // flipped byte, a truncated file, a wrong magic, another format version,
    // an empty file, and an upload whose client goes away are each refused
    // and leave every node's state and version as it was.
    let cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let leader_address = cluster.node(leader).client_address.clone();
    fill(&leader_address, "a", 50, 100).await;
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("backup.snap");
    let before = save(&cluster, &backup);
    let good = std::fs::read(&backup).unwrap();

    let mut flipped = good.clone();
    let at = good.len() / 2;
    flipped[at] ^= 0x40;
    let mut magic = good.clone();
    magic[0] = b'X';
    let mut version = good.clone();
    version[8] = 9;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("flipped byte", flipped, ""),
        ("truncated", good[..good.len() - 100].to_vec(), "truncated"),
        ("wrong magic", magic, "not a Cairn snapshot"),
        ("other format version", version, "format version 9"),
        ("empty", vec![], "truncated"),
    ];
    for (case, bytes, says) in cases {
        match upload(&leader_address, bytes).await {
            Err(ApiError::InvalidArgument { field, reason }) => {
                assert_eq!(field, "snapshot", "{case}");
                assert!(reason.contains(says), "{case}: {reason}");
            }
            other => panic!("{case}: expected InvalidArgument, got {other:?}"),
        }
    }

    // A client that goes away halfway through its upload.
    {
        let mut admin = AdminServiceClient::connect(format!("http://{leader_address}"))
            .await
            .unwrap();
        let half = good[..good.len() / 2].to_vec();
        let stream = futures::stream::iter(vec![SnapshotChunk { data: half.into() }])
            .chain(futures::stream::pending());
        let call = admin.restore_snapshot(stream);
        let _ = tokio::time::timeout(Duration::from_millis(500), call).await;
    }

    // Every node still holds exactly the old state, versions included, and
    // no restore is left pending.
    let now = converge(&cluster, &cluster.ids(), &before).await;
    assert_eq!(now, before);
    for id in cluster.ids() {
        assert_eq!(pending_on(&cluster, id).await, None, "node {id}");
    }
    // The file itself still restores.
    let (index, count) = upload(&leader_address, good).await.unwrap();
    assert_eq!(count, 50);
    assert!(index > before["a-00049"].version.parse::<u64>().unwrap());
}

use futures::StreamExt as _;

/// A backup of 400 resources of 20 KiB (~8 MiB: several 1 MiB chunks, so a
/// restore takes a while), and a cluster that then holds another state, `old`.
struct RestoreScenario {
    _dir: tempfile::TempDir,
    backup: std::path::PathBuf,
    in_backup: BTreeMap<String, Resource>,
    old: BTreeMap<String, Resource>,
}

async fn restore_scenario(cluster: &Cluster, leader_address: &str) -> RestoreScenario {
    fill(leader_address, "a", 400, 20 * 1024).await;
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("backup.snap");
    let in_backup = save(cluster, &backup);
    // The state the cluster holds when the restore starts: different names.
    for (name, r) in &in_backup {
        if name.as_str() < "a-00200" {
            let deleted = client(leader_address)
                .await
                .delete(cairn_proto::v1::DeleteRequest {
                    fence: None,
                    id: r.id.clone(),
                    version: r.version.clone(),
                    orphan_dependents: false,
                })
                .await;
            deleted.unwrap();
        }
    }
    fill(leader_address, "c", 10, 10).await;
    let old = things_on(leader_address).await.unwrap();
    assert_eq!(old.len(), 210);
    RestoreScenario {
        _dir: dir,
        backup,
        in_backup,
        old,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_whose_leader_is_killed_midway_leaves_every_node_fully_old_or_fully_new() {
    // The leader dies between the restore's begin and its commit: the next
    // leader aborts the orphaned restore, every node keeps the old state, and
    // the same backup then restores completely.
    let mut cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let leader_address = cluster.node(leader).client_address.clone();
    let RestoreScenario {
        _dir,
        backup,
        in_backup,
        old,
    } = restore_scenario(&cluster, &leader_address).await;

    let bytes = std::fs::read(&backup).unwrap();
    let address = leader_address.clone();
    let restore = tokio::spawn(async move { upload(&address, bytes).await });
    // Kill the leader as soon as its state machine holds the pending restore.
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    while pending_on(&cluster, leader).await.is_none() {
        assert!(Instant::now() < deadline, "the restore never began");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cluster.kill(leader);
    let outcome = restore.await.unwrap();
    let survivors: Vec<u64> = cluster.ids().into_iter().filter(|i| *i != leader).collect();
    let new_leader = cluster
        .wait_for_leader_among(&survivors, LEADER_TIMEOUT)
        .await;
    match outcome {
        // The commit made it before the kill: fully new everywhere.
        Ok(_) => {
            converge(&cluster, &survivors, &in_backup).await;
            return;
        }
        Err(e) => println!("the killed leader's restore ended with: {e}"),
    }
    // The orphan is aborted by the new leader; nothing changed anywhere.
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    for id in &survivors {
        while pending_on(&cluster, *id).await.is_some() {
            assert!(
                Instant::now() < deadline,
                "node {id} still holds the restore"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(converge(&cluster, &survivors, &old).await, old);
    cluster.restart(leader);
    assert_eq!(converge(&cluster, &cluster.ids(), &old).await, old);
    // And the backup restores completely afterwards.
    let (_, count) = upload(
        &cluster.node(new_leader).client_address,
        std::fs::read(&backup).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(count, 400);
    converge(&cluster, &cluster.ids(), &in_backup).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_killed_midway_through_a_restore_comes_back_fully_new() {
    // A follower dies while it holds the pending restore; the leader and the
    // other follower are still a quorum, so the restore commits. Restarted,
    // the follower finishes what its log holds, catches up on the rest, and
    // ends with exactly the backup: no pending restore, nothing old left.
    let mut cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let leader_address = cluster.node(leader).client_address.clone();
    let scenario = restore_scenario(&cluster, &leader_address).await;
    let follower = cluster.ids().into_iter().find(|i| *i != leader).unwrap();

    let bytes = std::fs::read(&scenario.backup).unwrap();
    let address = leader_address.clone();
    let restore = tokio::spawn(async move { upload(&address, bytes).await });
    let deadline = Instant::now() + CONVERGE_TIMEOUT;
    while pending_on(&cluster, follower).await.is_none() {
        assert!(
            Instant::now() < deadline,
            "the restore never began on node {follower}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cluster.kill(follower);
    let (_, count) = restore
        .await
        .unwrap()
        .expect("two of three nodes commit the restore");
    assert_eq!(count, 400);
    let others: Vec<u64> = cluster
        .ids()
        .into_iter()
        .filter(|i| *i != follower)
        .collect();
    converge(&cluster, &others, &scenario.in_backup).await;
    cluster.restart(follower);
    converge(&cluster, &cluster.ids(), &scenario.in_backup).await;
    assert_eq!(pending_on(&cluster, follower).await, None);
}
