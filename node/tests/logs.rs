//! What a node logs at start, through a real process: one line per listener with the
//! address it is bound to, and none of openraft's INFO chatter at the `info` level (openraft's
//! warnings still pass: see `cairn_node::logging`), in the JSON format too.

mod support;

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
