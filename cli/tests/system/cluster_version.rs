//! The cluster version as an operator drives it, with real processes on a three-node
//! cluster (`docs/upgrading.md`):
//! - a new cluster of this build rises to cluster version 0.2 by itself, and status writes
//!   (the first command that needs 0.2) work;
//! - `cairn cluster downgrade --to 0.1` lowers and pins it, waits until every member has
//!   compacted its log past the downgrade (each member's purged index, asked of each), and
//!   from then on status writes are refused FAILED_PRECONDITION naming both versions, on
//!   the leader and on a follower alike, while data writes go on; the leader does not raise
//!   a pinned version;
//! - refused changes name what is wrong (a "downgrade" that is not below);
//! - `cairn cluster downgrade --cancel` removes the pin and the version rises again.

use crate::client_support;

use std::time::{Duration, Instant};

use client_support::{cairn_at, Cluster, ClusterOptions, Run, LEADER_TIMEOUT};
use serde_json::Value;

fn binary() -> String {
    env!("CARGO_BIN_EXE_cairn").into()
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {run:?}"))
}

/// The cluster version `cairn status` reports, as the leader has it.
async fn cluster_version(endpoints: &str) -> String {
    let run = cairn_at(endpoints, &["status", "-o", "json"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    json(&run)["cluster_version"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Waits up to `within` for `cairn status` to report `expected`.
async fn wait_cluster_version(endpoints: &str, expected: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let got = cluster_version(endpoints).await;
        if got == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "cluster version {got:?}, not {expected:?}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn write_status(endpoint: &str, observed: &str) -> Run {
    let status = format!(r#"{{"observed_generation": "{observed}"}}"#);
    cairn_at(
        endpoint,
        &[
            "write-status",
            "--type",
            "demo.v1.Thing",
            "--name",
            "a",
            "--status-key",
            "health",
            "--status",
            &status,
            "-o",
            "json",
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_pins_the_version_gates_status_writes_and_compacts_every_log_until_cancelled() {
    let cluster = Cluster::start(ClusterOptions::new(binary(), 3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let endpoints = cluster.endpoints().join(",");
    let follower = cluster
        .node(cluster.ids_except(leader)[0])
        .client_address
        .clone();
    wait_cluster_version(&endpoints, "0.2", Duration::from_secs(15)).await;

    let written = cairn_at(
        &endpoints,
        &[
            "write",
            "--type",
            "demo.v1.Thing",
            "--name",
            "a",
            "--data-json",
            "{}",
        ],
    )
    .await;
    assert_eq!(written.code, 0, "{written:?}");
    let run = write_status(&follower, "1").await;
    assert_eq!(
        run.code, 0,
        "a status write at 0.2, through a follower: {run:?}"
    );
    assert_eq!(
        json(&run)["status"]["health"]["observed_generation"],
        "1",
        "{run:?}"
    );

    // Down to 0.1: the command waits until every member compacted its log.
    let run = cairn_at(
        &endpoints,
        &[
            "cluster",
            "downgrade",
            "--to",
            "0.1",
            "--compact-timeout-ms",
            "20000",
            "-o",
            "json",
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let answer = json(&run);
    assert_eq!(answer["cluster_version"], "0.1", "{answer}");
    assert_eq!(answer["cluster_version_downgrade"], "0.1", "{answer}");
    let through = answer["log_index"].as_u64().expect("log_index");
    assert_eq!(
        answer["members"].as_array().map(Vec::len),
        Some(3),
        "{answer}"
    );
    for id in cluster.ids() {
        let status = cluster.status(id).await.expect("status");
        assert!(
            status.purged_index >= through,
            "node {id} purged through {} < {through}",
            status.purged_index
        );
        assert_eq!(status.cluster_version, "0.1", "node {id}");
        assert_eq!(status.cluster_version_downgrade, "0.1", "node {id}");
    }

    // Status writes are refused, naming both versions and the way out; data writes go on.
    for endpoint in [
        cluster.node(leader).client_address.clone(),
        follower.clone(),
    ] {
        let run = write_status(&endpoint, "2").await;
        assert_eq!(run.code, 1, "FAILED_PRECONDITION exits 1: {run:?}");
        for words in [
            "WriteStatus needs cluster version 0.2",
            "the cluster runs 0.1",
            "cairn cluster downgrade --cancel",
        ] {
            assert!(run.stderr.contains(words), "{words:?}: {run:?}");
        }
    }
    let updated = cairn_at(
        &endpoints,
        &[
            "write",
            "--type",
            "demo.v1.Thing",
            "--name",
            "a",
            "--data-json",
            r#"{"x": 2}"#,
            "--upsert",
        ],
    )
    .await;
    assert_eq!(updated.code, 0, "{updated:?}");
    // Every member supports 0.2, yet the pinned version is not raised (the leader looks
    // every second).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        cluster_version(&endpoints).await,
        "0.1 (downgrade to 0.1 pinned)"
    );

    // A "downgrade" that is not below is refused, saying why.
    let run = cairn_at(&endpoints, &["cluster", "downgrade", "--to", "0.2"]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("not below"), "{run:?}");

    // Cancelled: the version rises again, and status writes work.
    let run = cairn_at(&endpoints, &["cluster", "downgrade", "--cancel"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("cancelled"), "{run:?}");
    wait_cluster_version(&endpoints, "0.2", Duration::from_secs(15)).await;
    let run = write_status(&follower, "3").await;
    assert_eq!(run.code, 0, "{run:?}");
}
