//! What a node logs, through real processes: one line per listener with the address it is
//! bound to, none of openraft's INFO chatter at the `info` level, and none of openraft's
//! routine warnings about peers still starting or down: the node says once that a peer is
//! not answering, and once that it is back (see `cairn_server::logging`), in the JSON format too.

use crate::support;

use std::time::Duration;

use serde_json::Value;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_logs_each_listener_once_and_keeps_openraft_info_below_info() {
    let mut o = options(1);
    o.metrics = true;
    o.extra_args = vec!["--log-format".into(), "json".into()];
    let cluster = Cluster::start(o);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let node = cluster.node(1);
    let ops = node.metrics_address.clone().expect("a metrics address");
    // The ops listener starts last: wait for its line.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let lines: Vec<Value> = loop {
        let log = cluster.log_of(1);
        let lines: Vec<Value> = log
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a JSON line ({e}): {l:?}")))
            .collect();
        if lines.iter().any(|l| l["fields"]["address"] == ops.as_str())
            || std::time::Instant::now() > deadline
        {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for (port, address) in [
        ("peer port", &node.peer_address),
        ("client port", &node.client_address),
        ("ops port", &ops),
    ] {
        let found: Vec<&Value> = lines
            .iter()
            .filter(|l| {
                l["level"] == "INFO"
                    && l["fields"]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains(port))
            })
            .collect();
        assert_eq!(found.len(), 1, "one line for the {port}: {lines:#?}");
        assert_eq!(found[0]["fields"]["address"], address.as_str(), "{found:?}");
    }
    let chatter: Vec<&Value> = lines
        .iter()
        .filter(|l| {
            l["target"]
                .as_str()
                .is_some_and(|t| t.starts_with("openraft"))
                && (l["level"] == "INFO" || l["level"] == "DEBUG")
        })
        .collect();
    assert!(
        chatter.is_empty(),
        "openraft's INFO stays below the info level: {chatter:#?}"
    );
    // The node's own lifecycle lines are there.
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "initialized a new cluster"),
        "{lines:#?}"
    );
}

/// The node's log as JSON lines.
fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a JSON line ({e}): {l:?}")))
        .collect()
}

fn message(line: &Value) -> &str {
    line["fields"]["message"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_starts_late_or_goes_down_is_said_once_not_per_retry() {
    // Node 3 starts 3 s after the others; later node 2 is down for 8 s. openraft retries
    // every 200 ms and would log three lines per retry; the log says once that node 2 is not
    // answering (after 5 s), and once that it is back. A peer still starting says nothing.
    let mut o = options(3);
    o.started_later = vec![3];
    o.extra_args = vec!["--log-format".into(), "json".into()];
    let mut cluster = Cluster::start(o);
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.spawn(3);
    wait_converged(&cluster, &[3], &[], Duration::from_secs(20)).await;

    let down = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    cluster.kill(down);
    tokio::time::sleep(Duration::from_secs(8)).await;
    cluster.spawn(down);
    let name = "after-return".to_string();
    assert!(
        create_anywhere(&cluster, &name, b"x", Duration::from_secs(20))
            .await
            .unwrap()
    );
    wait_converged(&cluster, &[down], &[name], Duration::from_secs(20)).await;

    let lines = json_lines(&cluster.log_of(leader));
    let routine: Vec<&Value> = lines
        .iter()
        .filter(|l| match l["target"].as_str().unwrap_or_default() {
            t if t.starts_with("openraft::replication") => true,
            "openraft::engine::handler::replication_handler" => true,
            // The core's warnings (late replies ignored), and its errors about one peer.
            "openraft::core::raft_core" => l["level"] == "WARN" || !l["fields"]["target"].is_null(),
            _ => false,
        })
        .collect();
    assert!(
        routine.is_empty(),
        "openraft's routine retries stay out of the leader's log: {routine:#?}"
    );
    let peer_lines = |text: &str| -> Vec<&Value> {
        lines
            .iter()
            .filter(|l| message(l).contains(text) && l["fields"]["peer"] == down)
            .collect()
    };
    let lost = peer_lines("has not answered");
    assert_eq!(
        lost.len(),
        1,
        "said once that node {down} is down: {lines:#?}"
    );
    assert_eq!(lost[0]["level"], "WARN");
    let back = peer_lines("answers this node's Raft calls again");
    assert_eq!(
        back.len(),
        1,
        "said once that node {down} is back: {lines:#?}"
    );
    assert_eq!(back[0]["level"], "INFO");
    // Node 3, starting 3 s late, was never said to be down.
    assert!(
        !lines.iter().any(|l| message(l).contains("has not answered")
            && l["fields"]["peer"] == 3
            && down != 3),
        "{lines:#?}"
    );
}
