//! A data dir belongs to one cluster and one node, and damage in it is named: real `cairn`
//! processes on real data dirs.
//! - another cluster's dir, a dir started with another node id, and a wiped voter that tries
//!   `--join` are each refused (exit code 15) with a message naming both sides and what to do;
//! - a dir written before node ids were recorded starts, and records its id from the
//!   membership it stores;
//! - a flipped byte in a snapshot file, in a WAL segment and in a sled blob each stop the
//!   node (exit code 12) with one line naming the file, where in it, and the two ways out;
//!   the dir is then marked, and the next start is refused naming the marker;
//! - a dir whose WAL segments a newer build wrote (a newer format version) is refused (exit
//!   code 15), saying so, and never marked damaged.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::*;

/// Exit codes of `cairn agent` (`cairn_server::fatal::exit`).
const EXIT_CORRUPTION: i32 = 12;
const EXIT_DATA_DIR_REFUSED: i32 = 15;

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// `cairn agent` flags for node `id` on `data_dir`, on fresh ports, with `members`.
fn agent_args(id: u64, data_dir: &Path, peer_address: &str, members: &str) -> Vec<String> {
    vec![
        "--node-id".into(),
        id.to_string(),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--client-address".into(),
        format!("127.0.0.1:{}", jepsen_tests::cluster::free_port()),
        "--peer-address".into(),
        peer_address.to_string(),
        "--members".into(),
        members.to_string(),
    ]
}

fn fresh_peer_address() -> String {
    format!("127.0.0.1:{}", jepsen_tests::cluster::free_port())
}

fn run(args: &[String], log: &Path) -> (Option<std::process::ExitStatus>, String) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_agent(&args, log, START_TIMEOUT)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_clusters_dir_another_node_id_and_an_old_dir_are_told_apart() {
    let mut a = Cluster::start(options(3));
    a.wait_for_leader(Duration::from_secs(20)).await;
    assert!(create_anywhere(&a, "a", b"a", Duration::from_secs(10))
        .await
        .expect("write to cluster A"));
    let a_id = a.status(1).await.expect("status").cluster_id;
    let members = members_flag(&a);

    // 1. Cluster B's node 1, started as node 1 of cluster A: refused, naming both clusters.
    let mut b = Cluster::start(options(1));
    b.wait_for_leader(Duration::from_secs(20)).await;
    assert!(create_anywhere(&b, "b", b"b", Duration::from_secs(10))
        .await
        .expect("write to cluster B"));
    let b_id = b.status(1).await.expect("status").cluster_id;
    assert_ne!(a_id, b_id);
    b.stop(1);
    let b_dir = b.node(1).data_dir.clone();
    let (status, log) = run(
        &agent_args(1, &b_dir, &fresh_peer_address(), &members),
        &a.root().join("foreign.log"),
    );
    println!("{log}");
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(EXIT_DATA_DIR_REFUSED),
        "{log}"
    );
    assert!(
        log.contains(&a_id) && log.contains(&b_id),
        "the refusal names both cluster ids ({a_id}, {b_id}): {log}"
    );
    assert_eq!(fatal_lines(&log).len(), 1, "one line: {log}");

    // 2. Node 3's dir started as node 2: refused, naming both ids; node 3 still starts on it.
    a.stop(3);
    let node3_dir = a.node(3).data_dir.clone();
    let (status, log) = run(
        &agent_args(2, &node3_dir, &fresh_peer_address(), &members),
        &a.root().join("mismatch.log"),
    );
    println!("{log}");
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(EXIT_DATA_DIR_REFUSED),
        "{log}"
    );
    assert!(
        log.contains("belongs to node 3") && log.contains("configured as node 2"),
        "the refusal names both node ids: {log}"
    );
    a.spawn(3);

    // 3. A dir written before node ids were recorded: it starts, and records its id from the
    //    membership it stores...
    a.stop(2);
    let node2_dir = a.node(2).data_dir.clone();
    std::fs::remove_file(node2_dir.join("node_id")).expect("a new dir records its node id");
    // ...but not as another node: the stored membership gives node 2's peer address to node 2.
    let (status, log) = run(
        &agent_args(3, &node2_dir, &a.node(2).peer_address, &members),
        &a.root().join("old-dir-mismatch.log"),
    );
    println!("{log}");
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(EXIT_DATA_DIR_REFUSED),
        "{log}"
    );
    assert!(
        log.contains("to node 2") && log.contains("configured as node 3"),
        "{log}"
    );
    assert!(
        !node2_dir.join("node_id").exists(),
        "nothing recorded on a refusal"
    );
    a.spawn(2);
    wait_converged(&a, &[1, 2, 3], &["a".to_string()], Duration::from_secs(30)).await;
    assert_eq!(
        std::fs::read_to_string(node2_dir.join("node_id"))
            .unwrap_or_default()
            .trim(),
        "2",
        "the old dir recorded its node id"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_voter_is_refused_by_join_until_it_is_removed() {
    // Node 3 loses its data dir and is started with --join: it is still a voter, so it is
    // refused with a message saying to remove it first. Done as the message says, the same
    // command joins.
    let mut cluster = Cluster::start(options(3));
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let mut names = Vec::new();
    for i in 0..5 {
        let name = format!("n{i}");
        assert!(
            create_anywhere(&cluster, &name, b"x", Duration::from_secs(10))
                .await
                .expect("write")
        );
        names.push(name);
    }
    if cluster.leader().await == Some(3) {
        cluster
            .transfer_leader(1, Duration::from_secs(10))
            .await
            .expect("move leadership off node 3");
    }
    cluster.kill(3);
    let dir = cluster.node(3).data_dir.clone();
    std::fs::remove_dir_all(&dir).expect("wipe node 3");
    let via = cluster.node(1).client_address.clone();
    let index = cluster.nodes.iter().position(|n| n.id == 3).unwrap();
    cluster.nodes[index].bootstrap = vec!["--join".into(), via.clone()];
    cluster.spawn(3);
    let status = cluster.wait_exit(3, START_TIMEOUT);
    let log = cluster.log_of(3);
    println!("{log}");
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(EXIT_DATA_DIR_REFUSED),
        "{log}"
    );
    assert!(
        log.contains("still a voter") && log.contains("cairn member remove 3"),
        "the refusal says to remove the member first: {log}"
    );

    cluster
        .remove_member(3, Duration::from_secs(20))
        .await
        .expect("remove node 3");
    std::fs::remove_dir_all(&dir).expect("empty node 3's dir again");
    cluster.spawn(3);
    wait_converged(&cluster, &[1, 2, 3], &names, Duration::from_secs(60)).await;
}

/// Flips one byte in the middle of `path`; returns the offset.
fn flip_middle_byte(path: &Path) -> usize {
    let mut bytes = std::fs::read(path).expect("read");
    let offset = bytes.len() / 2;
    bytes[offset] ^= 0x20;
    std::fs::write(path, &bytes).expect("write");
    offset
}

/// Starts node 1 of `cluster` on its damaged dir twice: the first start finds the damage
/// (exit 12, one line naming `file` and the two ways out, the dir marked), the second is
/// refused naming the marker. Returns the first line.
fn expect_damage_found(cluster: &mut Cluster, file: &Path) -> String {
    let dir = cluster.node(1).data_dir.clone();
    let marker = dir.join("CORRUPT");
    cluster.spawn(1);
    let status = cluster.wait_exit(1, START_TIMEOUT);
    let log = cluster.log_of(1);
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(EXIT_CORRUPTION),
        "{log}"
    );
    let lines = fatal_lines(&log);
    assert_eq!(lines.len(), 1, "one fatal line: {lines:#?}");
    let line = lines[0].to_string();
    println!("{line}");
    for needle in [
        file.display().to_string(),
        marker.display().to_string(),
        "backup".to_string(),
        "cairn member remove 1".to_string(),
    ] {
        assert!(line.contains(&needle), "{needle:?} missing from: {line}");
    }
    assert!(marker.exists(), "the data dir is marked");

    cluster.spawn(1);
    let status = cluster.wait_exit(1, START_TIMEOUT);
    let log = cluster.log_of(1);
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(EXIT_CORRUPTION),
        "{log}"
    );
    let lines = fatal_lines(&log);
    let refusal = lines.last().expect("a second fatal line");
    assert!(
        refusal.contains("marked damaged") && refusal.contains(&marker.display().to_string()),
        "the second start is refused naming the marker: {refusal}"
    );
    line
}

fn files_in(dir: &Path, extension: Option<&str>) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files
        .retain(|p| p.is_file() && extension.is_none_or(|x| p.extension().is_some_and(|e| e == x)));
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_the_snapshot_names_the_snapshot_file() {
    // A snapshot every 100 entries; after 500 writes the log is purged behind it, so the
    // state it holds exists nowhere else. One byte of it flipped: today's node says which
    // file, instead of openraft's "Failed to get log entries, expected index: [0, 64)".
    let mut o = options(1);
    o.snapshot_log_entries = 100;
    let mut cluster = Cluster::start(o);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let address = cluster.node(1).client_address.clone();
    for i in 0..500 {
        write(&address, thing(&format!("r{i:03}"), "u1", "", b"payload"))
            .await
            .expect("write");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while cluster.status(1).await.map(|s| s.purged_index).unwrap_or(0) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the log was never purged"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.stop(1);
    let snapshots = files_in(&cluster.node(1).data_dir.join("snapshots"), Some("snap"));
    // The node loads its newest snapshot (names sort by index); an older one may not be
    // deleted yet when the node stops.
    let newest = snapshots.last().expect("a snapshot file");
    flip_middle_byte(newest);
    let line = expect_damage_found(&mut cluster, newest);
    assert!(
        line.contains("byte") || line.contains("checksum"),
        "says where or what: {line}"
    );
}

/// Starts node 1 of `cluster` on a dir a newer build wrote (`file` in a newer format):
/// refused with exit 15, one line naming the file and "a newer release", nothing marked.
fn expect_newer_refused(cluster: &mut Cluster, file: &str) {
    let marker = cluster.node(1).data_dir.join("CORRUPT");
    cluster.spawn(1);
    let status = cluster.wait_exit(1, START_TIMEOUT);
    let log = cluster.log_of(1);
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(EXIT_DATA_DIR_REFUSED),
        "{log}"
    );
    // The log holds every start's lines: this start's is the last.
    let line = *fatal_lines(&log).last().expect("a fatal line");
    for needle in [
        file,
        "a newer release of Cairn wrote it",
        "docs/upgrading.md",
    ] {
        assert!(line.contains(needle), "{needle:?} missing from: {line}");
    }
    assert!(
        !marker.exists(),
        "an intact newer dir is not marked damaged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_of_a_newer_format_is_refused_as_newer_never_marked_damaged() {
    // What a rollback past a format change looks like: the WAL segments say a format version
    // above this build's (their headers intact: a checksum covers them). Refused (exit 15),
    // not damage. (A snapshot's version field has no checksum of its own, so a strange
    // version there is damage: the node falls back to an older snapshot or stops, exit 12.)
    let mut o = options(1);
    o.snapshot_log_entries = 100;
    let mut cluster = Cluster::start(o);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let address = cluster.node(1).client_address.clone();
    for i in 0..220 {
        write(&address, thing(&format!("r{i:03}"), "u1", "", b"payload"))
            .await
            .expect("write");
    }
    let snapshots_dir = cluster.node(1).data_dir.join("snapshots");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while files_in(&snapshots_dir, Some("snap")).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no snapshot was taken"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.stop(1);
    let log_dir = cluster.node(1).data_dir.join("raft-log");
    let rewritten =
        cairn_raft_log::test_hooks::rewrite_segment_format_version(&log_dir, 2).expect("rewrite");
    assert!(rewritten > 0);
    expect_newer_refused(&mut cluster, ".wal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_a_wal_segment_names_the_segment_and_the_index() {
    let mut cluster = Cluster::start(options(1));
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let address = cluster.node(1).client_address.clone();
    let marked = b"flip-me-flip-me-flip-me-flip-me-flip-me";
    write(&address, thing("marked", "u1", "", marked))
        .await
        .expect("write");
    for i in 0..20 {
        write(&address, thing(&format!("after{i}"), "u1", "", b"x"))
            .await
            .expect("write");
    }
    cluster.stop(1);
    let segments = files_in(
        &cluster.node(1).data_dir.join("raft-log").join("segments"),
        Some("wal"),
    );
    let mut damaged = None;
    for segment in &segments {
        let mut bytes = std::fs::read(segment).expect("read segment");
        if let Some(offset) = bytes.windows(marked.len()).position(|w| w == marked) {
            bytes[offset + marked.len() / 2] ^= 0x20;
            std::fs::write(segment, &bytes).expect("write segment");
            damaged = Some(segment.clone());
            break;
        }
    }
    let damaged = damaged.expect("the marked payload is in a segment");
    let line = expect_damage_found(&mut cluster, &damaged);
    assert!(line.contains("entry index"), "names the index: {line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_a_sled_blob_names_the_blob() {
    // With the sled engine, a value over 128 KiB is a file of its own (`sled/blobs/N`). sled
    // drops a damaged blob (and what follows it) while recovering, and says so only in a
    // warning; the node names the blob.
    let config_dir = tempfile::tempdir().expect("config dir");
    let config = config_dir.path().join("sled.toml");
    std::fs::write(&config, "log_engine = \"sled\"\n").expect("config file");
    let mut o = options(1);
    o.extra_args = vec!["--config".into(), config.display().to_string()];
    let mut cluster = Cluster::start(o);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let address = cluster.node(1).client_address.clone();
    write(&address, thing("big", "u1", "", &vec![b'b'; 300 * 1024]))
        .await
        .expect("write a large resource");
    for i in 0..5 {
        write(&address, thing(&format!("after{i}"), "u1", "", b"x"))
            .await
            .expect("write");
    }
    cluster.stop(1);
    let blobs = files_in(
        &cluster
            .node(1)
            .data_dir
            .join("raft-log")
            .join("sled")
            .join("blobs"),
        None,
    );
    assert!(!blobs.is_empty(), "sled keeps the large entry in a blob");
    for blob in &blobs {
        flip_middle_byte(blob);
    }
    let line = expect_damage_found(&mut cluster, &blobs[0]);
    assert!(line.contains("sled blob"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_member_whose_status_call_is_refused_does_not_start() {
    // Grants on. Node 3 loses its data dir and restarts with a node token
    // that has no admin grant: the members answer its start-up status call
    // PERMISSION_DENIED. It must not start as if nobody had answered (a
    // voter with an empty log); it refuses, saying which setting is missing.
    let scratch = tempfile::tempdir().unwrap();
    let (admin, admin_hash) = new_token();
    let (writer, writer_hash) = new_token();
    let node_token = scratch.path().join("node.token");
    std::fs::write(&node_token, &admin).unwrap();
    let config = scratch.path().join("cairn.toml");
    std::fs::write(
        &config,
        format!(
            "[auth]\nnode_token_file = \"{}\"\n\n[[auth.grants]]\nname = \"admin\"\n{admin_hash}\n\
             admin = true\n\n[[auth.grants]]\nname = \"writer\"\n{writer_hash}\n\
             write = {{ types = [\"*\"], tenancies = [\"*\"] }}\n",
            node_token.display()
        ),
    )
    .unwrap();
    let mut o = options(3);
    o.extra_args = vec!["--config".into(), config.display().to_string()];
    o.admin_token = Some(admin.clone());
    let mut cluster = Cluster::start(o);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let client = cairn_client::Client::new(
        &cluster.endpoints(),
        cairn_client::ClientOptions {
            token: Some(cairn_client::BearerToken::new(writer.clone()).unwrap()),
            ..cairn_client::ClientOptions::default()
        },
    )
    .unwrap();
    for i in 0..3 {
        client
            .write(thing(&format!("n{i}"), "u1", "", b"x"))
            .await
            .expect("write");
    }
    if cluster.leader().await == Some(3) {
        cluster
            .transfer_leader(1, Duration::from_secs(10))
            .await
            .expect("move leadership off node 3");
    }
    cluster.kill(3);
    std::fs::remove_dir_all(&cluster.node(3).data_dir).expect("wipe node 3");
    // The token file every node reads at start now holds the writer's token;
    // the running nodes keep the admin token they read.
    std::fs::write(&node_token, &writer).unwrap();
    cluster.spawn(3);
    let status = cluster.wait_exit(3, START_TIMEOUT);
    let log = cluster.log_of(3);
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(EXIT_DATA_DIR_REFUSED),
        "node 3 must refuse to start: {log}"
    );
    assert!(
        log.contains("refused this node's status call") && log.contains("auth.node_token_file"),
        "the refusal names the missing admin node token: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_at_once_waits_for_its_predecessor_to_release_the_data_dir() {
    // A rolling restart by hand: the old process may still be stopping (handing leadership
    // off) when the new one starts. The new one waits for the data dir's lock, up to its
    // shutdown_timeout_ms, instead of failing at once; a lock held longer than that is
    // another node on the same dir, and is refused naming the holder.
    let mut o = options(1);
    o.extra_args = vec!["--shutdown-timeout-ms".into(), "2000".into()];
    let mut cluster = Cluster::start(o);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    cluster.kill(1);
    let data_dir = cluster.node(1).data_dir.clone();

    // The predecessor (here: this test) lets go after 1 s: the node starts and serves.
    let held = cairn_raft_log::DirLock::acquire(&data_dir).expect("take the lock");
    cluster.spawn(1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        cluster.is_running(1),
        "the node waits for the lock: {}",
        cluster.log_of(1)
    );
    drop(held);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    assert!(
        cluster.log_of(1).contains("waiting for it to exit"),
        "the wait is said: {}",
        cluster.log_of(1)
    );

    // Held for longer than shutdown_timeout_ms: refused, naming the holder's pid.
    cluster.kill(1);
    let _held = cairn_raft_log::DirLock::acquire(&data_dir).expect("take the lock");
    cluster.spawn(1);
    let status = cluster.wait_exit(1, Duration::from_secs(20));
    assert!(status.is_some_and(|s| !s.success()), "{status:?}");
    let log = cluster.log_of(1);
    assert!(
        log.contains("another node runs on this data dir")
            && log.contains(&format!("holder pid: {}", std::process::id())),
        "{log}"
    );
}
