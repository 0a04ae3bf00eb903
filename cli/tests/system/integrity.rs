//! Replicas that check each other, through real processes: one member's table is altered
//! outside the log (`--unsafe-alter-applied-state`, as a bad RAM bit or a bug in apply
//! would); the leader's periodic consistency check must name that member, and only it, in a
//! CORRUPT alarm raised through the log; the member must then refuse reads while the others
//! serve them; `cairn check consistency` must say FAIL naming it; and a disarm without a
//! replacement must be followed by the alarm again at the next check.

use crate::client_support;

use std::time::{Duration, Instant};

use client_support::*;
use serde_json::Value;

/// The check interval the nodes run with here.
const CHECK_INTERVAL_MS: u64 = 500;

/// The members the CORRUPT alarm names and the index that raised it, as
/// `cairn alarm list -o json` on `endpoint` shows it.
async fn corrupt_alarm(endpoint: &str) -> Option<(Vec<u64>, u64)> {
    let run = cairn_at(endpoint, &["alarm", "list", "-o", "json"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let listed: Value = serde_json::from_str(&run.stdout).expect("JSON");
    listed["alarms"]
        .as_array()
        .expect("alarms")
        .iter()
        .find(|a| a["name"] == "CORRUPT")
        .map(|a| {
            let members = a["members"]
                .as_array()
                .expect("members")
                .iter()
                .map(|m| m.as_u64().expect("id"))
                .collect();
            (members, a["raised_index"].as_u64().expect("raised_index"))
        })
}

/// Waits (up to `limit`) for the alarm to be raised by an entry after `after_index`;
/// returns whom it names, the raising index, and after how long.
async fn until_raised(
    endpoint: &str,
    after_index: u64,
    limit: Duration,
) -> (Vec<u64>, u64, Duration) {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Some((members, index)) = corrupt_alarm(endpoint).await {
            if index > after_index {
                return (members, index, started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no CORRUPT alarm within {limit:?}");
}

/// Restarts `id` through a wrapper of the binary that adds `--unsafe-alter-applied-state`.
fn restart_altered(cluster: &mut Cluster, id: u64) {
    let wrapper = cluster.root().join("cairn-altered");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {} \"$@\" --unsafe-alter-applied-state\n",
            env!("CARGO_BIN_EXE_cairn")
        ),
    )
    .expect("wrapper");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    cluster.set_binary(id, &wrapper);
    cluster.restart(id);
}

/// A 3-node cluster checking every `interval_ms` (0: on demand only) at cluster version
/// 0.2, its leader, and a follower.
async fn cluster_checking_every(interval_ms: u64) -> (Cluster, u64) {
    let mut options = options(3);
    options.extra_args.extend([
        "--consistency-check-interval-ms".to_string(),
        interval_ms.to_string(),
    ]);
    let cluster = Cluster::start(options);
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    wait_cluster_version_0_2(&cluster.endpoints().join(","), &[]).await;
    let follower = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .expect("a follower");
    (cluster, follower)
}

async fn write_things(endpoints: &str, names: &[&str]) {
    for name in names {
        let run = cairn_at(
            endpoints,
            &[
                "write",
                "--type",
                "demo.v1.Thing",
                "--name",
                name,
                "--data-json",
                "{}",
            ],
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_starts_with_a_differing_table_has_itself_checked_at_once() {
    // No periodic check: only the member's own check after its start can ask for one.
    let (mut cluster, odd) = cluster_checking_every(0).await;
    let endpoints = cluster.endpoints().join(",");
    write_things(&endpoints, &["a", "b"]).await;
    // Its table holds resources as soon as it has replayed its log: altered at once.
    restart_altered(&mut cluster, odd);
    let healthy = cluster
        .ids()
        .into_iter()
        .find(|id| *id != odd)
        .map(|id| cluster.node(id).client_address.clone())
        .expect("a healthy member");
    let (named, _, after) = until_raised(&healthy, 0, Duration::from_secs(20)).await;
    assert_eq!(named, vec![odd]);
    println!(
        "CORRUPT named node {odd} {} ms after its restart",
        after.as_millis()
    );
    assert!(
        cluster
            .log_tail(odd, 200)
            .contains("this member's table digest differs from the leader's"),
        "the member's own check found it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_table_differs_is_named_and_stops_serving_reads() {
    let (mut cluster, odd) = cluster_checking_every(CHECK_INTERVAL_MS).await;
    let endpoints = cluster.endpoints().join(",");

    // Every member agrees on an empty table.
    let pass = cairn_at(&endpoints, &["check", "consistency"]).await;
    assert_eq!(pass.code, 0, "{pass:?}");
    assert!(pass.stdout.contains("PASS"), "{pass:?}");

    // The altered member, a follower, altered once it holds a resource.
    restart_altered(&mut cluster, odd);
    let odd_endpoint = cluster.node(odd).client_address.clone();
    let healthy = cluster
        .ids()
        .into_iter()
        .find(|id| *id != odd)
        .map(|id| cluster.node(id).client_address.clone())
        .expect("a healthy member");

    // Writes: the altered member changes one of them in its own table.
    for name in ["a", "b", "c"] {
        let run = cairn_at(
            &endpoints,
            &[
                "write",
                "--type",
                "demo.v1.Thing",
                "--name",
                name,
                "--data-json",
                "{}",
            ],
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
    }

    // Named, and only it, within a few check intervals.
    let (named, raised_index, after) = until_raised(&healthy, 0, Duration::from_secs(20)).await;
    assert_eq!(named, vec![odd], "the alarm names the altered member only");
    println!(
        "CORRUPT named node {odd} {} ms after the writes (check interval {CHECK_INTERVAL_MS} ms)",
        after.as_millis()
    );

    // The named member refuses reads (Unavailable, exit 5, saying why); the others serve them.
    let refused = cairn_at(
        &odd_endpoint,
        &[
            "read",
            "--type",
            "demo.v1.Thing",
            "--name",
            "a",
            "--consistency",
            "eventual",
            "--timeout-ms",
            "1500",
        ],
    )
    .await;
    assert_eq!(refused.code, 5, "{refused:?}");
    assert!(refused.stderr.contains("serves no reads"), "{refused:?}");
    let served = cairn_at(
        &healthy,
        &[
            "read",
            "--type",
            "demo.v1.Thing",
            "--name",
            "a",
            "--consistency",
            "eventual",
        ],
    )
    .await;
    assert_eq!(served.code, 0, "{served:?}");

    // On demand: FAIL naming it.
    let fail = cairn_at(&endpoints, &["check", "consistency", "-o", "json"]).await;
    assert_eq!(fail.code, 1, "{fail:?}");
    let report: Value = serde_json::from_str(&fail.stdout).expect("JSON");
    assert_eq!(report["verdict"], "differ", "{report}");
    assert_eq!(report["differing"], serde_json::json!([odd]), "{report}");

    // A disarm without replacing the member: the next check raises it again.
    let disarm = cairn_at(&endpoints, &["alarm", "disarm"]).await;
    assert_eq!(disarm.code, 0, "{disarm:?}");
    let (again, _, _) = until_raised(&healthy, raised_index, Duration::from_secs(20)).await;
    assert_eq!(again, vec![odd]);
}
