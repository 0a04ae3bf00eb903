//! The ops listener (`metrics_address`), through real processes and plain HTTP: `/livez`
//! never depends on quorum, `/readyz` fails without a leader and recovers, unknown paths are
//! 404, gRPC health tells the same truth as `/readyz`, and the Prometheus series are there
//! and move when writes, watches and elections happen.

use crate::support;

use std::time::{Duration, Instant};

use cairn_proto::v1::*;
use support::*;
use support::{http_get as get, try_http_get as try_get};

fn ops_address(cluster: &Cluster, id: u64) -> String {
    cluster
        .node(id)
        .metrics_address
        .clone()
        .expect("the harness gives each node a metrics address")
}

/// Polls `GET path` until its status is `want`, or panics after `timeout` with the last body.
async fn wait_status(address: &str, path: &str, want: u16, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let (status, body) = try_get(address, path).unwrap_or_else(|e| (0, e.to_string()));
        if status == want {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{path} on {address} stayed {status}, wanted {want}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The gRPC health status of the node at `address` ("" service).
async fn grpc_health(address: &str) -> i32 {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(|r| r.into_inner().status)
        .unwrap_or(-1)
}

const SERVING: i32 = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
const NOT_SERVING: i32 = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_quorum_while_livez_stays_healthy() {
    let mut o = options(3);
    o.metrics = true;
    let mut cluster = Cluster::start(o);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    for id in cluster.ids() {
        let address = ops_address(&cluster, id);
        let body = wait_status(&address, "/readyz?verbose", 200, Duration::from_secs(20)).await;
        for check in [
            "storage",
            "leader",
            "linearizable_read",
            "applied",
            "member",
        ] {
            assert!(
                body.contains(&format!("[+]{check} ok")),
                "node {id}: /readyz?verbose lists {check}: {body}"
            );
        }
        let (status, body) = get(&address, "/livez?verbose");
        assert_eq!(status, 200, "node {id} /livez: {body}");
        assert!(body.contains("[+]data_dir ok"), "{body}");
        let (status, _) = get(&address, "/healthz");
        assert_eq!(status, 404, "node {id}: an unknown path is 404");
        let (status, _) = get(&address, "/");
        assert_eq!(status, 404, "node {id}: / is 404");
    }

    // Quorum lost: the survivor is not ready (and gRPC health agrees), but stays live.
    let survivor = cluster.ids()[0];
    let address = ops_address(&cluster, survivor);
    let client_address = cluster.node(survivor).client_address.clone();
    let others: Vec<u64> = cluster.ids().into_iter().skip(1).collect();
    for id in &others {
        cluster.kill(*id);
    }
    let body = wait_status(&address, "/readyz", 503, Duration::from_secs(15)).await;
    assert!(
        body.contains("[-]"),
        "a failed /readyz names the failed checks: {body}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while grpc_health(&client_address).await != NOT_SERVING {
        assert!(
            Instant::now() < deadline,
            "gRPC health turns NOT_SERVING too"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..20 {
        let (status, body) = get(&address, "/livez");
        assert_eq!(status, 200, "/livez never depends on quorum: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Quorum back: ready again, on every node.
    for id in &others {
        cluster.restart(*id);
    }
    for id in cluster.ids() {
        wait_status(
            &ops_address(&cluster, id),
            "/readyz",
            200,
            Duration::from_secs(30),
        )
        .await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while grpc_health(&client_address).await != SERVING {
        assert!(Instant::now() < deadline, "gRPC health returns to SERVING");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of the first sample of `series` (a name with its labels, as scraped) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok()).flatten()
    })
}

fn scrape(cluster: &Cluster, id: u64) -> String {
    let (status, body) = get(&ops_address(cluster, id), "/metrics");
    assert_eq!(status, 200, "/metrics: {body}");
    body
}

fn value(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or_else(|| panic!("{series} is scraped; got:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_writes_watches_and_elections() {
    let mut o = options(3);
    o.metrics = true;
    let cluster = Cluster::start(o);
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let leader_address = cluster.node(leader).client_address.clone();

    let before = scrape(&cluster, leader);
    assert_eq!(value(&before, "cairn_server_has_leader"), 1.0);
    assert_eq!(value(&before, "cairn_server_is_leader"), 1.0);
    let term_before = value(&before, "cairn_raft_term");
    assert!(term_before >= 1.0);
    let committed_before = sample(&before, "cairn_server_proposals_committed_total").unwrap_or(0.0);

    // A watch on the leader, then 20 writes.
    let mut watcher = client(&leader_address).await;
    let mut watch = watcher
        .watch_list(WatchListRequest {
            r#type: Some(thing_type()),
            tenancy: Some(any_tenancy()),
            name_prefix: String::new(),
            start_revision: 0,
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    let _end_of_snapshot = watch.message().await.expect("a first event");
    for i in 0..20 {
        write(&leader_address, thing(&format!("m{i}"), "", "", b"x"))
            .await
            .expect("write");
    }
    let after = scrape(&cluster, leader);
    assert!(
        value(&after, "cairn_server_proposals_committed_total") >= committed_before + 20.0,
        "20 committed proposals"
    );
    assert_eq!(value(&after, "cairn_resources{type=\"demo.Thing\"}"), 20.0);
    assert_eq!(value(&after, "cairn_watches_open"), 1.0);
    assert!(value(&after, "cairn_watch_events_queued_total") >= 20.0);
    assert!(value(&after, "cairn_raft_applied_index") >= 20.0);
    assert!(
        value(&after, "cairn_raft_commit_index") >= value(&after, "cairn_raft_applied_index") - 1.0
    );
    assert!(value(&after, "cairn_disk_wal_fsync_duration_seconds_count") >= 1.0);
    assert!(
        value(
            &after,
            "cairn_grpc_requests_total{method=\"/cairn.v1.ResourceService/Write\",code=\"OK\"}"
        ) >= 20.0
    );
    assert!(
        value(
            &after,
            "cairn_grpc_request_duration_seconds_count{method=\"/cairn.v1.ResourceService/Write\"}"
        ) >= 20.0
    );
    // The peer network: on the leader, bytes to and from each follower and heartbeat round
    // trips to it; on a follower, bytes from the leader. All of them move.
    let followers: Vec<u64> = cluster.ids_except(leader);
    let peer_series = |peer: u64| {
        [
            format!("cairn_network_peer_sent_bytes_total{{to=\"{peer}\"}}"),
            format!("cairn_network_peer_received_bytes_total{{from=\"{peer}\"}}"),
            format!("cairn_network_peer_round_trip_time_seconds_count{{to=\"{peer}\"}}"),
        ]
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = scrape(&cluster, leader);
        let moved = followers.iter().all(|f| {
            peer_series(*f).iter().all(|series| {
                let was = sample(&before, series).unwrap_or(0.0);
                sample(&now, series).is_some_and(|v| v > was)
            })
        });
        if moved {
            assert!(
                now.contains(&format!(
                    "cairn_network_peer_round_trip_time_seconds_bucket{{to=\"{}\",le=\"0.0001\"}}",
                    followers[0]
                )),
                "the round trip is a histogram with buckets:\n{now}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the leader's peer series move for {followers:?}:\n{now}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let on_follower = scrape(&cluster, followers[0]);
    assert!(
        value(
            &on_follower,
            &format!("cairn_network_peer_received_bytes_total{{from=\"{leader}\"}}")
        ) > 0.0
    );
    assert!(
        value(
            &on_follower,
            &format!("cairn_network_peer_sent_bytes_total{{to=\"{leader}\"}}")
        ) > 0.0
    );

    // A refused call counts under its code.
    let refused = read(&leader_address, "missing", Consistency::Eventual).await;
    assert!(refused.is_err());
    let with_refusal = scrape(&cluster, leader);
    assert!(
        value(
            &with_refusal,
            "cairn_grpc_requests_total{method=\"/cairn.v1.ResourceService/Read\",code=\"NOT_FOUND\"}"
        ) >= 1.0
    );

    // An election: a follower sees a leader change and a new term.
    let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let changes_before = value(
        &scrape(&cluster, follower),
        "cairn_server_leader_changes_seen_total",
    );
    cluster
        .transfer_leader(follower, Duration::from_secs(10))
        .await
        .expect("transfer leadership");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = scrape(&cluster, follower);
        if value(&now, "cairn_server_leader_changes_seen_total") > changes_before
            && value(&now, "cairn_raft_term") > term_before
            && value(&now, "cairn_server_is_leader") == 1.0
        {
            break;
        }
        assert!(Instant::now() < deadline, "the election shows:\n{now}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(watch);
}

/// The alert rules in docs/monitoring are valid, and fire (or stay quiet) on the series as
/// `docs/monitoring/alerts_test.yml` feeds them. promtool comes with the `prometheus` Debian
/// package, which `.ci/run` installs; elsewhere the test says it is skipped.
#[test]
fn alert_rules_pass_promtool() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/monitoring");
    let promtool = std::process::Command::new("promtool")
        .arg("--version")
        .output();
    if promtool.is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "promtool is missing in CI: .ci/run installs the prometheus package"
        );
        eprintln!("SKIPPED alert_rules_pass_promtool: promtool is not installed (apt-get install prometheus)");
        return;
    }
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
    ] {
        let out = std::process::Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("run promtool");
        assert!(out.status.success(), "promtool {args:?}: {}", text(&out));
    }
}

// ---- The Grafana dashboard ----------------------------------------------------------------

/// The series names a PromQL expression uses: not its functions, aggregations, keywords,
/// label names or values, ranges, numbers or Grafana variables.
fn series_names(expr: &str) -> std::collections::BTreeSet<String> {
    // Strings, label matchers and ranges first (a regex in a string may hold braces).
    let mut plain = String::new();
    let mut chars = expr.chars();
    let mut inside = 0usize; // depth of `{...}` and `[...]`
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                while let Some(d) = chars.next() {
                    if d == '\\' {
                        chars.next();
                    } else if d == c {
                        break;
                    }
                }
            }
            '{' | '[' => inside += 1,
            '}' | ']' => inside = inside.saturating_sub(1),
            _ if inside > 0 => {}
            _ => plain.push(c),
        }
    }
    let tokens: Vec<char> = plain.chars().collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = std::collections::BTreeSet::new();
    let mut i = 0;
    while i < tokens.len() {
        let c = tokens[i];
        if c == '$' || c.is_ascii_digit() || c == '.' {
            // A Grafana variable or a number (0.99, 1e3): skipped whole.
            i += 1;
            while i < tokens.len() && (ident(tokens[i]) || tokens[i] == '.') {
                i += 1;
            }
            continue;
        }
        if !(c.is_ascii_alphabetic() || c == '_' || c == ':') {
            i += 1;
            continue;
        }
        let start = i;
        while i < tokens.len() && ident(tokens[i]) {
            i += 1;
        }
        let word: String = tokens[start..i].iter().collect();
        let mut next = i;
        while next < tokens.len() && tokens[next].is_whitespace() {
            next += 1;
        }
        let called = tokens.get(next) == Some(&'(');
        // `sum by (...) (...)`: an aggregation whose grouping comes first.
        let grouped = ["by", "without"].iter().any(|g| {
            let after: String = tokens[next..].iter().take(g.len() + 1).collect();
            after.len() > g.len()
                && after.starts_with(g)
                && !ident(after.chars().nth(g.len()).unwrap_or(' '))
        });
        match word.as_str() {
            // Grouping clauses: their parenthesis holds label names.
            "by" | "without" | "on" | "ignoring" | "group_left" | "group_right" => {
                if called {
                    i = next;
                    while i < tokens.len() && tokens[i] != ')' {
                        i += 1;
                    }
                }
            }
            "and" | "or" | "unless" | "bool" | "offset" | "inf" | "nan" => {}
            _ if called || grouped => {} // a function or an aggregation
            _ => {
                names.insert(word);
            }
        }
    }
    names
}

/// Every PromQL expression of a Grafana dashboard: its panels' `expr`, and the selector of
/// each `label_values(SELECTOR, LABEL)` variable.
fn dashboard_expressions(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    ("definition", serde_json::Value::String(d)) => {
                        let inner = d
                            .strip_prefix("label_values(")
                            .and_then(|r| r.rsplit_once(','))
                            .map(|(selector, _)| selector.to_string())
                            .unwrap_or_else(|| panic!("a variable other than label_values: {d}"));
                        out.push(inner);
                    }
                    _ => dashboard_expressions(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => {
            for v in items {
                dashboard_expressions(v, out);
            }
        }
        _ => {}
    }
}

#[test]
fn promql_series_names_leave_out_functions_labels_and_numbers() {
    let names = series_names(
        r#"histogram_quantile(0.99, sum by (instance, le) (rate(cairn_a_bucket{instance=~"$instance", method!~".*Watch{x}.*"}[$__rate_interval]))) > 1e-3 and on (instance) cairn_b - ignoring(kind) cairn_c:rate5m offset 5m"#,
    );
    let want: std::collections::BTreeSet<String> = ["cairn_a_bucket", "cairn_b", "cairn_c:rate5m"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(names, want);
}

/// docs/monitoring/cairn-dashboard.json names only series a real node exports, and covers
/// what an operator looks at first (checked without Grafana: every expression is parsed and
/// its series looked up in three nodes' scrapes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grafana_dashboard_uses_only_series_the_nodes_export() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/monitoring/cairn-dashboard.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the dashboard"))
            .expect("the dashboard is JSON");
    let mut expressions = Vec::new();
    dashboard_expressions(&dashboard, &mut expressions);
    assert!(expressions.len() >= 20, "{expressions:?}");
    let used: std::collections::BTreeSet<String> =
        expressions.iter().flat_map(|e| series_names(e)).collect();
    for wanted in [
        "cairn_server_has_leader",
        "cairn_server_leader_changes_seen_total",
        "cairn_raft_term",
        "cairn_raft_commit_index",
        "cairn_raft_applied_index",
        "cairn_server_proposals_committed_total",
        "cairn_server_proposals_failed_total",
        "cairn_server_proposals_pending",
        "cairn_disk_wal_write_duration_seconds_bucket",
        "cairn_disk_wal_fsync_duration_seconds_bucket",
        "cairn_network_peer_round_trip_time_seconds_bucket",
        "cairn_grpc_requests_total",
        "cairn_grpc_request_duration_seconds_bucket",
        "cairn_watches_open",
        "cairn_snapshot_save_duration_seconds_count",
        "cairn_snapshot_install_duration_seconds_count",
        "cairn_resources",
    ] {
        assert!(
            used.contains(wanted),
            "the dashboard shows {wanted}: {used:?}"
        );
    }

    let mut o = options(3);
    o.metrics = true;
    let cluster = Cluster::start(o);
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let leader_address = cluster.node(leader).client_address.clone();
    for i in 0..3 {
        write(&leader_address, thing(&format!("d{i}"), "", "", b"x"))
            .await
            .expect("write");
    }
    let mut exported = std::collections::BTreeSet::new();
    for id in cluster.ids() {
        let address = ops_address(&cluster, id);
        wait_status(&address, "/readyz", 200, Duration::from_secs(20)).await;
        for line in scrape(&cluster, id).lines().filter(|l| !l.starts_with('#')) {
            if let Some(name) = line.split(['{', ' ']).next().filter(|n| !n.is_empty()) {
                exported.insert(name.to_string());
            }
        }
    }
    let unknown: Vec<&String> = used.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard names series no node exports: {unknown:?}\nexported: {exported:?}"
    );
}
