//! Backups through the `cairn` CLI against real clusters: save under write
//! load, inspect, damaged files, and the offline (disaster-recovery) restore.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cairn_proto::error::ApiError;
use cairn_proto::v1::Consistency;
use support::*;

const LEADER_TIMEOUT: Duration = Duration::from_secs(20);

/// Every resource in a snapshot file, by name.
fn resources_in(file: &Path) -> std::collections::BTreeMap<String, cairn_proto::v1::Resource> {
    let mut out = std::collections::BTreeMap::new();
    cairn_server::snapshot_file::verify(file, |r, _| {
        out.insert(r.id.as_ref().unwrap().name.clone(), r.clone());
    })
    .unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_under_load_restores_offline_into_a_new_cluster() {
    // Writers keep writing while `cairn snapshot save` runs; the file verifies,
    // and a new cluster seeded from it with `restore --offline` holds exactly
    // the file's resources, has a new cluster id, and refuses a CAS with a
    // version the old cluster handed out after the backup.
    let old = Cluster::start(options(3));
    let leader = old.wait_for_leader(LEADER_TIMEOUT).await;
    let leader_address = old.node(leader).client_address.clone();
    for i in 0..300 {
        write(
            &leader_address,
            thing(&format!("a-{i:03}"), "u1", "", b"before"),
        )
        .await
        .unwrap();
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, address) = (stop.clone(), leader_address.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                write(&address, thing(&format!("b-{i:05}"), "u1", "", b"during"))
                    .await
                    .unwrap();
                i += 1;
            }
            i
        })
    };
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("backup.snap");
    let endpoints = old.endpoints().join(",");
    let saved = cairn(&[
        "snapshot",
        "save",
        backup.to_str().unwrap(),
        "--endpoints",
        &endpoints,
    ]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written_during = writer.await.unwrap();
    assert!(saved.status.success(), "{}", text(&saved));
    assert!(text(&saved).contains("resources"), "{}", text(&saved));
    println!("{} writes ran while the snapshot was saved", written_during);

    let inspected = cairn(&["snapshot", "inspect", backup.to_str().unwrap()]);
    assert!(inspected.status.success(), "{}", text(&inspected));
    assert!(
        text(&inspected).contains("demo.v1.Thing"),
        "{}",
        text(&inspected)
    );

    let in_file = resources_in(&backup);
    assert!(in_file.len() >= 300);
    let header = cairn_server::snapshot_file::SnapshotReader::open(&backup)
        .unwrap()
        .header;
    // A write on the old cluster after the backup: its version must never match on the new one.
    let stale = write(
        &leader_address,
        thing("a-000", "u1", &in_file["a-000"].version, b"after"),
    )
    .await
    .unwrap();
    assert!(stale.version.parse::<u64>().unwrap() > header.last_log_index);

    // Seed a new 3-node cluster's data dirs, then start it.
    let root = jepsen_tests::cluster::ScratchDir::new().unwrap();
    let ports: Vec<(u16, u16)> = (0..3)
        .map(|_| {
            (
                jepsen_tests::cluster::free_port(),
                jepsen_tests::cluster::free_port(),
            )
        })
        .collect();
    let members = ports
        .iter()
        .enumerate()
        .map(|(i, (c, p))| format!("{}=127.0.0.1:{p}/127.0.0.1:{c}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let mut new = Processes(vec![]);
    for (i, (client_port, peer_port)) in ports.iter().enumerate() {
        let data_dir = root.path().join(format!("node-{}", i + 1));
        let out = cairn(&[
            "snapshot",
            "restore",
            "--offline",
            backup.to_str().unwrap(),
            "--data-dir",
            data_dir.to_str().unwrap(),
            "--members",
            &members,
        ]);
        assert!(out.status.success(), "{}", text(&out));
        let log = std::fs::File::create(root.path().join(format!("node-{}.log", i + 1))).unwrap();
        new.0.push(
            Command::new(env!("CARGO_BIN_EXE_cairn"))
                .args([
                    "agent",
                    "--node-id",
                    &(i + 1).to_string(),
                    "--members",
                    &members,
                ])
                .arg("--data-dir")
                .arg(&data_dir)
                .args(["--client-address", &format!("127.0.0.1:{client_port}")])
                .args([
                    "--peer-address",
                    &format!("127.0.0.1:{peer_port}"),
                    "--log-level",
                    "info",
                ])
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        if i == 0 {
            // Node 1 answers before 2 and 3 start: a restored data dir must
            // not be mistaken for a wiped one when a member is already up.
            let first = format!("127.0.0.1:{client_port}");
            let deadline = Instant::now() + LEADER_TIMEOUT;
            while status_of(&first).await.is_err() {
                assert!(Instant::now() < deadline, "node 1 never answered");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let new_endpoints: Vec<String> = ports
        .iter()
        .map(|(c, _)| format!("127.0.0.1:{c}"))
        .collect();
    let deadline = Instant::now() + LEADER_TIMEOUT;
    let new_status = loop {
        let mut found = None;
        for e in &new_endpoints {
            if let Ok(s) = status_of(e).await {
                if s.leader_id != 0 && s.leader_id == s.node_id {
                    found = Some((e.clone(), s));
                }
            }
        }
        if let Some(f) = found {
            break f;
        }
        assert!(
            Instant::now() < deadline,
            "the restored cluster elected no leader; logs in {}",
            root.path().display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (new_address, new_status) = new_status;
    let restored = list(&new_address, Consistency::Strong).await.unwrap();
    assert_eq!(restored.len(), in_file.len());
    for r in &restored {
        let name = &r.id.as_ref().unwrap().name;
        assert_eq!(Some(r), in_file.get(name), "{name} differs from the backup");
    }
    let old_status = old.status(leader).await.unwrap();
    assert_ne!(old_status.cluster_id, new_status.cluster_id);
    match write(&new_address, thing("a-000", "u1", &stale.version, b"stale")).await {
        Err(ApiError::CasFailure(_)) => {}
        other => panic!("a stale version from the old cluster was accepted: {other:?}"),
    }
    let fresh = write(
        &new_address,
        thing("a-000", "u1", &in_file["a-000"].version, b"new"),
    )
    .await
    .unwrap();
    assert!(fresh.version.parse::<u64>().unwrap() > stale.version.parse::<u64>().unwrap());
}

#[test]
fn damaged_backups_are_refused_each_with_its_own_message() {
    // Inspect names what is wrong with each kind of damage and exits non-zero.
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.snap");
    let header = cairn_server::snapshot_file::SnapshotHeader {
        leases: Vec::new(),
        cluster_id: "c".into(),
        last_log_index: 7,
        last_log_term: 1,
        last_log_leader_node_id: 1,
        membership: serde_json::Value::Null,
        resource_count: 2,
        created_at_unix_ms: 0,
        applied_initial_entry: false,
        pending_restore: None,
        cluster_version: None,
        cluster_version_downgrade: None,
        space_quota_bytes: None,
        nospace_alarm_index: None,
        corrupt_members: Vec::new(),
        corrupt_alarm_index: None,
    };
    let mut w = cairn_server::snapshot_file::SnapshotWriter::create(&good, &header).unwrap();
    w.append(&thing("x", "u", "3", b"1")).unwrap();
    w.append(&thing("y", "u", "5", b"2")).unwrap();
    w.finish().unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "flipped",
            {
                let mut b = bytes.clone();
                let n = b.len() - 13;
                b[n] ^= 1;
                b
            },
            "checksum",
        ),
        ("truncated", bytes[..bytes.len() - 6].to_vec(), "truncated"),
        (
            "magic",
            {
                let mut b = bytes.clone();
                b[0] = b'X';
                b
            },
            "not a Cairn snapshot",
        ),
        (
            "version",
            {
                let mut b = bytes.clone();
                b[8] = 2;
                b
            },
            "format version 2",
        ),
        ("empty", vec![], "truncated"),
    ];
    for (name, data, expected) in cases {
        let path = dir.path().join(format!("{name}.snap"));
        std::fs::write(&path, data).unwrap();
        let out = cairn(&["snapshot", "inspect", path.to_str().unwrap()]);
        assert!(!out.status.success(), "{name} accepted");
        assert!(text(&out).contains(expected), "{name}: {}", text(&out));
    }
    let out = cairn(&["snapshot", "inspect", good.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
}

/// Child processes killed when the test ends, however it ends.
struct Processes(Vec<std::process::Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The admin status of the node at `address` (plaintext, within 3 s).
async fn status_of(address: &str) -> Result<cairn_proto::v1::StatusResponse, ApiError> {
    cairn_client::admin::AdminClient::new(
        vec![address.to_string()],
        cairn_client::Access::plaintext(),
        Duration::from_secs(3),
    )
    .status_at(address)
    .await
}
