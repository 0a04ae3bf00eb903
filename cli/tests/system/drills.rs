//! `cairn dev` for drills and `cairn drill`, through the binary as an operator runs them:
//! ops listeners, exits reported and nodes restarted; each drill against `cairn dev` reports
//! no lost write; with nodes that acknowledge before commit, the failover and partition
//! drills report the loss.

use crate::support;

use std::time::Duration;

use support::*;

/// `cairn drill ARGS --dev DIR -o json` against `dev`: exit code and report.
fn drill(dev: &DevCluster, args: &[&str]) -> (i32, serde_json::Value) {
    let dir = dev.data_dir.display().to_string();
    let mut all = vec!["drill"];
    all.extend_from_slice(args);
    all.extend_from_slice(&[
        "--dev",
        &dir,
        "--before-seconds",
        "2",
        "--after-seconds",
        "2",
        "-o",
        "json",
    ]);
    let out = dev.cairn(&all);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "cairn {all:?} printed no JSON report ({e}; {}): {}",
            out.status,
            text(&out)
        )
    });
    println!("cairn {all:?}: {report:#}");
    (out.status.code().unwrap_or(-1), report)
}

fn field(report: &serde_json::Value, name: &str) -> u64 {
    report[name]
        .as_u64()
        .unwrap_or_else(|| panic!("no {name} in {report:#}"))
}

#[test]
fn cairn_dev_serves_ops_listeners_reports_exits_and_restarts_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("dev");
    let mut dev = DevCluster::start(
        &data_dir,
        &["--restart", "--restart-delay-ms", "500"],
        vec![],
    )
    .unwrap_or_else(|why| panic!("{why}"));
    let dir_flag = data_dir.display().to_string();

    // The banner names each ops listener, and each serves /livez, /readyz and /metrics.
    dev.wait_for_line(|l| l.starts_with("Press Ctrl-C"), Duration::from_secs(5));
    for id in 1..=3 {
        let ops = dev.ops_address(id);
        assert!(
            dev.seen
                .iter()
                .any(|l| l.contains(&format!("ops http://{ops}"))),
            "the banner names node {id}'s ops listener: {:#?}",
            dev.seen
        );
        let livez = http_get(&ops, "/livez");
        assert_eq!(livez.0, 200, "{livez:?}");
        assert!(http_get(&ops, "/metrics").1.contains("cairn_"));
    }
    let ready = (1..=3).any(|id| http_get(&dev.ops_address(id), "/readyz").0 == 200);
    assert!(ready, "a node of the cluster is ready");

    // A node killed outside `cairn dev`: it says which, how, with its log's last line, and
    // (--restart) starts it again.
    let pid = dev.node_pid(2).expect("node 2 runs");
    // SAFETY: kill(2) on a node of this test's cluster.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
    let said = dev
        .wait_for_line(|l| l.contains("node 2 was killed"), Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no word of node 2's death: {:#?}", dev.seen));
    assert!(
        said.contains("signal 9 (SIGKILL)") && said.contains("the last line of its log: 20"),
        "{said}"
    );
    dev.wait_for_line(
        |l| l.contains("node 2 started again"),
        Duration::from_secs(10),
    )
    .unwrap_or_else(|| panic!("node 2 was not started again: {:#?}", dev.seen));
    assert_ne!(dev.node_pid(2), Some(pid), "a new process");

    // `cairn dev restart N` stops the node gracefully and starts it again.
    let before = dev.node_pid(3).expect("node 3 runs");
    let out = dev.cairn(&["dev", "restart", "3", "--data-dir", &dir_flag]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("node 3 stopped: it exited with code 0; node 3 started"),
        "{}",
        text(&out)
    );
    assert_ne!(dev.node_pid(3), Some(before));

    // A node stopped on request stays stopped (no --restart for it) until started.
    let out = dev.cairn(&["dev", "stop", "1", "--kill", "--data-dir", &dir_flag]);
    assert!(
        text(&out).contains("node 1 stopped: it was killed by signal 9 (SIGKILL)"),
        "{}",
        text(&out)
    );
    assert!(dev
        .wait_for_line(|l| l.contains("node 1"), Duration::from_secs(2))
        .is_none());
    assert_eq!(dev.node_pid(1), None);
    let out = dev.cairn(&["dev", "start", "1", "--data-dir", &dir_flag]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(dev.node_pid(1).is_some());

    // Mistakes are named.
    let out = dev.cairn(&["dev", "start", "1", "--data-dir", &dir_flag]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("node 1 is already running"),
        "{}",
        text(&out)
    );
    let out = dev.cairn(&["dev", "restart", "7", "--data-dir", &dir_flag]);
    assert!(
        text(&out).contains("no node 7: this cluster has nodes 1 to 3"),
        "{}",
        text(&out)
    );
    let nowhere = dir.path().join("nowhere").display().to_string();
    let out = dev.cairn(&["dev", "restart", "1", "--data-dir", &nowhere]);
    assert!(
        text(&out).contains("no cairn dev is running on"),
        "{}",
        text(&out)
    );
}

/// Whether the partition drill can run here: it cuts loopback nodes apart with nftables and
/// net_cls cgroups (root). Under `CI=true` it must.
fn partitions_possible() -> bool {
    match jepsen_tests::loopback::unavailable_reason() {
        None => true,
        Some(why) if std::env::var_os("CI").is_some() => {
            panic!("CI must run the partition drill, but: {why}")
        }
        Some(why) => {
            println!("SKIP the partition drill: {why}");
            false
        }
    }
}

#[test]
fn every_drill_against_cairn_dev_reports_no_lost_write() {
    let dir = tempfile::tempdir().unwrap();
    let dev = DevCluster::start(&dir.path().join("dev"), &[], vec![])
        .unwrap_or_else(|why| panic!("{why}"));
    let partitions = partitions_possible();
    // (arguments, the leader changes)
    let mut drills: Vec<(&[&str], bool)> = vec![
        (&["failover"], true),
        (&["failover", "--graceful"], true),
        (&["rolling-restart"], true),
        (&["restore", "--yes"], false),
    ];
    if partitions {
        drills.push((&["partition"], true));
    }
    for (args, leader_changes) in &drills {
        let (code, report) = drill(&dev, args);
        assert_eq!(report["verdict"], "pass", "{args:?}: {report:#}");
        assert_eq!(code, 0, "{args:?}");
        assert_eq!(field(&report, "lost_writes"), 0, "{args:?}");
        assert_eq!(field(&report, "reads_backwards"), 0, "{args:?}");
        assert_eq!(field(&report, "versions_backwards"), 0, "{args:?}");
        assert!(field(&report, "writes_acknowledged") > 100, "{args:?}");
        assert!(field(&report, "reads") > 10, "{args:?}");
        assert!(report["write_gap"]["to_ms"].as_i64().is_some(), "{args:?}");
        let (before, after) = (
            field(&report, "leader_before"),
            field(&report, "leader_after"),
        );
        assert!(before != 0 && after != 0);
        if *leader_changes {
            assert_ne!(before, after, "{args:?}: the leader changed");
        }
        let steps = report["steps"].to_string();
        match args[0] {
            "partition" => assert!(
                steps.contains("cut off, stepped down") && steps.contains("healed"),
                "{steps}"
            ),
            "restore" => assert!(steps.contains("restored at index"), "{steps}"),
            _ => {}
        }
    }
    // Each report is kept in the cluster, for the web console and `cairn list`.
    let out = dev.cairn(&[
        "list",
        "--type",
        "cairn.v1.DrillReport",
        "--endpoints",
        &dev.client_address(1),
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let kept: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = kept
        .as_array()
        .or_else(|| kept["resources"].as_array())
        .unwrap_or_else(|| panic!("a list: {kept:#}"))
        .iter()
        .filter_map(|r| r["id"]["name"].as_str())
        .collect();
    assert_eq!(names.len(), drills.len(), "{names:?}");
    assert!(
        names.iter().any(|n| n.ends_with("-failover_graceful")),
        "{names:?}"
    );
}

/// With several write entries in flight on the leader (the default is one), a leader killed
/// or handed off under 64 clients still loses no acknowledged write: every write's outcome
/// is its own entry's, and a hand-off holds every slot before it goes quiet.
#[test]
fn several_write_entries_in_flight_lose_no_write_through_failovers() {
    let dir = tempfile::tempdir().unwrap();
    let dev = DevCluster::start(
        &dir.path().join("dev"),
        &[],
        vec![("CAIRN_WRITE_PROPOSALS_IN_FLIGHT_MAX".into(), "8".into())],
    )
    .unwrap_or_else(|why| panic!("{why}"));
    for args in [
        &["failover", "--clients", "64"][..],
        &["failover", "--graceful", "--clients", "64"],
    ] {
        let (code, report) = drill(&dev, args);
        assert_eq!(report["verdict"], "pass", "{args:?}: {report:#}");
        assert_eq!(code, 0, "{args:?}");
        assert_eq!(field(&report, "lost_writes"), 0, "{args:?}");
        assert_eq!(field(&report, "reads_backwards"), 0, "{args:?}");
        assert!(field(&report, "writes_acknowledged") > 100, "{args:?}");
        assert_ne!(
            field(&report, "leader_before"),
            field(&report, "leader_after"),
            "{args:?}"
        );
    }
}

/// A restore drill replaces the cluster's data: off a terminal it needs --yes.
#[test]
fn the_restore_drill_asks_first() {
    // Against any cluster, before anything is done (a terminal would be asked).
    let out = cairn(&[
        "drill",
        "restore",
        "--endpoints",
        "127.0.0.1:1",
        "--start-command",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("Pass --yes"), "{}", text(&out));
}

/// Runs drill `args` (at most three times) against nodes that acknowledge a write before it
/// commits (a test-only broken mode) until one reports lost writes; it must fail then, with
/// exit code 1.
fn drill_reports_writes_acknowledged_before_commit_as_lost(args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let dev = DevCluster::start(
        &dir.path().join("dev"),
        &["--", "--unsafe-ack-before-commit"],
        vec![],
    )
    .unwrap_or_else(|why| panic!("{why}"));
    let mut seen = Vec::new();
    for attempt in 1..=3 {
        let (code, report) = drill(&dev, args);
        let lost = field(&report, "lost_writes");
        seen.push(lost);
        if lost > 0 {
            assert_eq!(report["verdict"], "fail", "{report:#}");
            assert_eq!(code, 1);
            println!("{args:?}, attempt {attempt}: {lost} acknowledged writes lost");
            return;
        }
    }
    panic!("no {args:?} drill reported a lost write: {seen:?}");
}

#[test]
fn the_failover_drill_reports_writes_acknowledged_before_commit_as_lost() {
    // Killing the leader loses what it acknowledged and had not replicated.
    drill_reports_writes_acknowledged_before_commit_as_lost(&["failover", "--clients", "32"]);
}

#[test]
fn the_partition_drill_reports_writes_acknowledged_before_commit_as_lost() {
    // The leader cut off from the others (its clients still reach it) acknowledges writes
    // no quorum ever commits; after the heal its log is replaced, and the drill says so.
    if !partitions_possible() {
        return;
    }
    drill_reports_writes_acknowledged_before_commit_as_lost(&["partition", "--clients", "32"]);
}
