//! `cairn bench` as a user runs it: the real binary against a real 3-node
//! cluster, every workload for a short window with `-o json`, the report read
//! back. Each run must have measured operations and no errors; the watch run
//! must deliver every write to every watcher; the failover run must find a
//! new leader and write through a survivor. Bad options exit 2 naming the
//! option.

use crate::support;

use std::time::Duration;

use serde_json::Value;
use support::*;

const LEADER_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `cairn bench ARGS --endpoints E -o json` and returns its report.
fn bench(endpoints: &str, args: &[&str]) -> Value {
    let mut all: Vec<&str> = vec!["bench"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--endpoints", endpoints, "-o", "json"]);
    let out = cairn(&all);
    assert!(out.status.success(), "cairn {all:?}: {}", text(&out));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("cairn {all:?} printed no JSON report ({e}): {}", text(&out)))
}

/// Asserts a load report measured operations of each kind in `kinds`, with
/// no errors.
fn assert_measured(report: &Value, kinds: &[&str]) {
    assert!(
        report["ops"].as_u64().unwrap_or(0) > 0,
        "no operations: {report:#}"
    );
    assert!(
        report["ops_per_s"].as_f64().unwrap_or(0.0) > 0.0,
        "{report:#}"
    );
    assert_eq!(
        report["errors"],
        serde_json::json!({}),
        "errors: {report:#}"
    );
    for kind in kinds {
        let latency = &report["latency"][kind];
        assert!(
            latency["count"].as_u64().unwrap_or(0) > 0,
            "no {kind} latencies: {report:#}"
        );
        let (p50, p99) = (latency["p50_ms"].as_f64(), latency["p99_ms"].as_f64());
        assert!(
            matches!((p50, p99), (Some(p50), Some(p99)) if 0.0 < p50 && p50 <= p99),
            "{kind} percentiles: {report:#}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_workload_runs_against_a_real_cluster_and_reports_json() {
    let cluster = Cluster::start(options(3));
    cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let endpoints = cluster.endpoints().join(",");
    let e = endpoints.as_str();
    let short = ["--duration", "1", "--warmup", "0", "--key-space", "50"];
    let with = |extra: &[&'static str]| -> Vec<&str> {
        let mut args: Vec<&str> = extra.to_vec();
        args.extend_from_slice(&short);
        args
    };

    let write = bench(e, &with(&["write", "--clients", "4", "--connections", "2"]));
    assert_eq!(write["workload"], "write");
    assert_measured(&write, &["write"]);
    assert!(
        write["resource_encoded_bytes"].as_u64().unwrap_or(0) > 256,
        "{write:#}"
    );

    for consistency in ["strong", "eventual"] {
        let read = bench(
            e,
            &with(&["read", "--consistency", consistency, "--clients", "4"]),
        );
        assert_eq!(read["consistency"], consistency);
        assert_measured(&read, &["read"]);
    }
    let list = bench(e, &with(&["list", "--clients", "2"]));
    assert_measured(&list, &["list"]);
    let mixed = bench(
        e,
        &with(&["mixed", "--read-fraction", "0.5", "--clients", "4"]),
    );
    assert_measured(&mixed, &["read", "write"]);

    let watch = bench(
        e,
        &with(&[
            "watch",
            "--watchers",
            "20",
            "--clients",
            "1",
            "--write-interval-ms",
            "20",
        ]),
    );
    let writes = watch["watch"]["writes"].as_u64().unwrap_or(0);
    assert!(writes > 0, "no watched writes: {watch:#}");
    assert_eq!(
        watch["watch"]["deliveries"].as_u64(),
        Some(writes * 20),
        "{watch:#}"
    );
    assert_eq!(watch["watch"]["missing"].as_u64(), Some(0), "{watch:#}");

    // Last: it kills the leader's process.
    let failover = bench(e, &["failover"]);
    let f = &failover["failover"];
    assert!(
        f["first_write_ms"].as_f64().is_some_and(|ms| ms > 0.0),
        "{failover:#}"
    );
    assert_ne!(f["new_leader_id"], f["killed_node_id"], "{failover:#}");
}

#[test]
fn bad_options_exit_2_naming_the_option() {
    for (args, option) in [
        (vec!["write", "--clients", "0"], "--clients"),
        (vec!["read", "--connections", "0"], "--connections"),
        (vec!["write", "--key-space", "0"], "--key-space"),
        (vec!["write", "--duration", "0"], "--duration"),
    ] {
        let mut all = vec!["bench"];
        all.extend_from_slice(&args);
        all.extend_from_slice(&["--endpoints", "127.0.0.1:9"]);
        let out = cairn(&all);
        assert_eq!(out.status.code(), Some(2), "cairn {all:?}: {}", text(&out));
        assert!(text(&out).contains(option), "cairn {all:?}: {}", text(&out));
    }
}
