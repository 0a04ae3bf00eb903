//! The operator's report, replayed: three nodes, each in a 700 MiB memory cgroup, with the
//! default capacity settings, and one client writing 512 KiB resources as fast as it can.
//! Before, the kernel killed the leader at about 520 MiB of data. Now:
//! - each node derives its space quota from its cgroup's limit, and the leader sets the
//!   cluster's;
//! - the writer is acknowledged until the quota refuses it (RESOURCE_EXHAUSTED), and no node
//!   is killed: the kernel's OOM killer acted on no cgroup, every node still runs;
//! - a follower stopped before the writer started comes back to a log purged behind a
//!   snapshot, installs the leader's snapshot of the full data set, and is not killed
//!   either;
//! - NOSPACE is raised on every member (the restarted one took it with the snapshot);
//!   reads and deletes go on; deleting makes room, the alarm clears and writes are
//!   accepted again, with no restart.
//!
//! Needs root and a memory cgroup hierarchy (v1 or v2); elsewhere it says why and is skipped
//! (`.ci/run` runs as root). Prints each node's peak anonymous memory against the data size
//! (`docs/benchmarks.md`, "Memory against data").

use crate::client_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_client::ClientError;
use cairn_proto::v1::Consistency;
use client_support::{client_for, eventually, thing, Cluster, ClusterOptions, Run, LEADER_TIMEOUT};
use serde_json::Value;

const MEMORY_LIMIT_BYTES: u64 = 700 * 1024 * 1024;

fn binary() -> String {
    env!("CARGO_BIN_EXE_cairn").into()
}

async fn status(endpoints: &str) -> Value {
    let run: Run = client_support::run_cairn(
        &binary(),
        &["status", "-o", "json", "--endpoints", endpoints],
        None,
        &[],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {run:?}"))
}

fn every_member(s: &Value, check: impl Fn(&Value) -> bool) -> bool {
    s["members"]
        .as_array()
        .is_some_and(|m| m.len() == 3 && m.iter().all(check))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_writer_fills_the_quota_and_no_node_dies() {
    if let Some(reason) = jepsen_tests::memcg::unavailable_reason() {
        eprintln!("SKIPPED a_runaway_writer_fills_the_quota_and_no_node_dies: {reason}");
        return;
    }
    let mut options = ClusterOptions::new(binary(), 3);
    options.memory_limit_bytes = Some(MEMORY_LIMIT_BYTES);
    let mut cluster = Cluster::start(options);
    cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let endpoints = cluster.endpoints().join(",");
    let (expected_quota, _) = cairn_server::memory::capacity_defaults(MEMORY_LIMIT_BYTES);
    assert!(
        eventually(Duration::from_secs(20), || async {
            every_member(&status(&endpoints).await, |m| {
                m["data_bytes_quota"].as_u64() == Some(expected_quota)
            })
        })
        .await,
        "every node derives its quota from its cgroup's {MEMORY_LIMIT_BYTES} bytes: {}",
        status(&endpoints).await
    );

    // Sample each node's heap while the writer runs.
    let peaks: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(vec![0; 3]));
    let cgroups: Vec<std::path::PathBuf> = cluster
        .ids()
        .iter()
        .map(|id| {
            cluster
                .memory_cgroup(*id)
                .expect("a cgroup")
                .path()
                .to_path_buf()
        })
        .collect();
    let sampling = {
        let peaks = peaks.clone();
        tokio::spawn(async move {
            loop {
                for (i, path) in cgroups.iter().enumerate() {
                    let stat =
                        std::fs::read_to_string(path.join("memory.stat")).unwrap_or_default();
                    let anon = stat.lines().find_map(|l| {
                        let (k, v) = l.split_once(' ')?;
                        (k == "rss" || k == "anon")
                            .then(|| v.trim().parse::<u64>().ok())
                            .flatten()
                    });
                    if let Some(anon) = anon {
                        let mut peaks = peaks.lock().unwrap();
                        peaks[i] = peaks[i].max(anon);
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    // A follower misses the whole fill: it will come back to a log purged behind snapshots.
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let absent = cluster.ids_except(leader)[0];
    cluster.kill(absent);

    let client = client_for(&cluster.endpoints()).await;
    let payload = format!(r#"{{"fill": "{}"}}"#, "x".repeat(512 * 1024));
    let mut written = Vec::new();
    let refusal = loop {
        let name = format!("blob-{}", written.len());
        match client.create(thing("Blob", &name, &payload)).await {
            Ok(stored) => written.push(stored),
            Err(e) => break e,
        }
        assert!(written.len() < 2_000, "the quota never refused the writer");
    };
    assert!(
        matches!(refusal, ClientError::ResourceExhausted { .. }),
        "the writer is refused by the quota, not by a dead node: {refusal:?}"
    );
    let data_mib = written.len() as u64 / 2;
    eprintln!(
        "acknowledged {} writes of 512 KiB ({data_mib} MiB) before: {refusal}",
        written.len()
    );

    // The follower comes back and installs a snapshot of the full data set.
    let fill_peaks = std::mem::replace(&mut *peaks.lock().unwrap(), vec![0; 3]);
    cluster.spawn(absent);
    let (index, took) = cluster
        .wait_caught_up(absent, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| panic!("the follower catches up: {e}"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let catch_up_peaks = peaks.lock().unwrap().clone();
    assert!(
        cluster
            .log_of(absent)
            .contains("installed snapshot from the leader"),
        "the follower installed a snapshot:\n{}",
        cluster.log_tail(absent, 20)
    );
    eprintln!("node {absent} caught up to index {index} in {took:?}");

    // Every member agrees on NOSPACE; reads go on.
    assert!(
        eventually(Duration::from_secs(15), || async {
            every_member(&status(&endpoints).await, |m| {
                m["alarms"][0]["name"].as_str() == Some("NOSPACE")
            })
        })
        .await,
        "NOSPACE on every member: {}",
        status(&endpoints).await
    );
    let last = written.last().unwrap().id.clone().unwrap();
    client
        .read(last, Consistency::Strong)
        .await
        .expect("a read under NOSPACE");

    // Deletes make room; the alarm clears; writes go on.
    let fifth = written.len() / 5 + 1;
    for stored in written.drain(..fifth) {
        client
            .delete(stored.id.clone().unwrap(), stored.version.clone())
            .await
            .expect("a delete under NOSPACE");
    }
    assert!(
        eventually(Duration::from_secs(15), || async {
            every_member(&status(&endpoints).await, |m| {
                m["alarms"].as_array().is_some_and(Vec::is_empty)
            })
        })
        .await,
        "the alarm clears once room is made: {}",
        status(&endpoints).await
    );
    client
        .create(thing("Blob", "after", &payload))
        .await
        .expect("a write once room was made");
    sampling.abort();

    // Nobody died: the kernel killed nothing, and every node still runs.
    for (i, id) in cluster.ids().into_iter().enumerate() {
        let cgroup = cluster.memory_cgroup(id).expect("a cgroup");
        assert_eq!(
            cgroup.oom_kills(),
            Ok(0),
            "node {id} was OOM-killed:\n{}",
            cluster.log_tail(id, 20)
        );
        assert!(
            cluster.is_running(id),
            "node {id} runs:\n{}",
            cluster.log_tail(id, 20)
        );
        let role = if id == leader {
            "leader"
        } else if id == absent {
            "restarted follower"
        } else {
            "follower"
        };
        eprintln!(
            "node {id} ({role}): peak anonymous memory {} MiB while the writer filled {data_mib} \
             MiB, {} MiB while the restarted follower caught up (limit {} MiB)",
            fill_peaks[i] >> 20,
            catch_up_peaks[i] >> 20,
            MEMORY_LIMIT_BYTES >> 20
        );
    }
}
