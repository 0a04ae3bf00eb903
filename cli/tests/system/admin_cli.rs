//! The admin commands of `cairn` as real processes against real clusters, in the situations
//! an operator reaches for them:
//! - quorum loss: `cairn status` asks every member, shows the dead ones unreachable and
//!   exits 5; `member remove` of a dead node works with the dead node first in --endpoints;
//!   a command against a stopped (SIGSTOP) node returns within its --timeout-ms;
//! - membership safety: `member promote` refuses a learner that has not caught up (one whose
//!   process never started), `member add-learner` waits for the catch-up with a timeout, and
//!   `member remove` refuses to break the quorum unless --force;
//! - safe restores: `snapshot restore` refuses --data-dir without --offline, and refuses to
//!   replace a running cluster's data without --yes when stdin is not a terminal, leaving the
//!   data as it was;
//! - `endpoint health`, `endpoint status` and `member list` output.
//!
//! `ADMIN_CLI_TEST_BINARY=/path/to/cairn` runs the same tests against another build (to show
//! what an older one did); by default they run the binary under test.

use crate::client_support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use client_support::{Cluster, ClusterOptions, Run, LEADER_TIMEOUT};
use serde_json::Value;

/// The `cairn` binary these tests run.
fn binary() -> String {
    std::env::var("ADMIN_CLI_TEST_BINARY").unwrap_or_else(|_| env!("CARGO_BIN_EXE_cairn").into())
}

fn options(nodes: usize) -> ClusterOptions {
    ClusterOptions::new(binary(), nodes)
}

/// Runs `cairn ARGS` (stdin: nothing, not a terminal), killed after 60 s.
async fn cairn(args: &[&str]) -> Run {
    client_support::run_cairn(&binary(), args, None, &[]).await
}

/// `cairn ARGS --endpoints ENDPOINTS`.
async fn cairn_at(endpoints: &str, args: &[&str]) -> Run {
    let mut all = args.to_vec();
    all.extend(["--endpoints", endpoints]);
    cairn(&all).await
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {run:?}"))
}

/// No Rust value dumps in what a person reads.
fn assert_no_internals(run: &Run) {
    let all = format!("{}{}", run.stdout, run.stderr);
    for dump in ["Some(", "None", "NodeInfo {", "LeaderHint {", "LogId {"] {
        assert!(!all.contains(dump), "{dump:?} in {run:?}");
    }
}

/// The members of `cairn status -o json`, by id: (reachable, voter, role).
fn members_of(status: &Value) -> Vec<(u64, bool, bool, String)> {
    status["members"]
        .as_array()
        .unwrap_or_else(|| panic!("no members: {status}"))
        .iter()
        .map(|m| {
            (
                m["id"].as_u64().unwrap(),
                m["reachable"].as_bool().unwrap(),
                m["voter"].as_bool().unwrap(),
                m["role"].as_str().unwrap_or("-").to_string(),
            )
        })
        .collect()
}

/// The ids of the members the leader lists, and whether each is a voter.
async fn membership(cluster: &Cluster) -> Vec<(u64, bool)> {
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let status = cluster.status(leader).await.expect("leader status");
    status.members.iter().map(|m| (m.id, m.voter)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_asks_every_member_and_exits_5_without_a_quorum() {
    // Healthy: every member answers for itself (role, term, version, uptime, data dir), and
    // the command exits 0. With 2 of 3 nodes killed: they show unreachable, the command says
    // there is no quorum and exits 5 (the old status printed the leader's view and exited 0).
    let mut cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let endpoints = cluster.endpoints().join(",");
    // A member started last may still be joining as a learner when the leader is elected
    // (on a loaded machine): the healthy picture is the one once every member followed.
    let deadline = std::time::Instant::now() + LEADER_TIMEOUT;
    let status = loop {
        let run = cairn_at(&endpoints, &["status", "-o", "json"]).await;
        assert_eq!(run.code, 0, "{run:?}");
        let status = json(&run);
        let settled = status["members"].as_array().is_some_and(|ms| {
            ms.iter()
                .all(|m| m["role"] == "leader" || m["role"] == "follower")
        });
        if settled || std::time::Instant::now() > deadline {
            break status;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(status["healthy"], true, "{status}");
    assert_eq!(status["leader_id"], leader, "{status}");
    for m in status["members"].as_array().unwrap() {
        assert_eq!(m["reachable"], true, "{m}");
        assert!(m["version"].as_str().is_some_and(|v| !v.is_empty()), "{m}");
        assert!(m["data_dir_bytes"].as_u64().unwrap() > 0, "{m}");
        assert!(m["uptime_ms"].as_u64().is_some(), "{m}");
        assert!(m["lag_entries"].as_u64().is_some(), "{m}");
        let own_role = if m["id"] == leader {
            "leader"
        } else {
            "follower"
        };
        assert_eq!(m["role"], own_role, "{m}");
        if m["id"] != leader {
            assert!(m["leader_contact_ms"].as_u64().is_some(), "{m}");
        }
    }
    let table = cairn_at(&endpoints, &["status"]).await;
    assert_eq!(table.code, 0, "{table:?}");
    for column in [
        "REACHABLE",
        "ROLE",
        "LAST CONTACT",
        "LAG",
        "VERSION",
        "UPTIME",
        "DATA DIR",
    ] {
        assert!(table.stdout.contains(column), "{column}: {table:?}");
    }

    let survivor = leader;
    let dead: Vec<u64> = cluster.ids_except(leader);
    for id in &dead {
        cluster.kill(*id);
    }
    // Asked through a dead endpoint first, and then with the survivor first.
    for order in [
        format!(
            "{},{}",
            cluster.node(dead[0]).client_address,
            cluster.node(survivor).client_address
        ),
        endpoints.clone(),
    ] {
        let started = Instant::now();
        let run = cairn_at(&order, &["status", "-o", "json", "--timeout-ms", "5000"]).await;
        assert!(started.elapsed() < Duration::from_secs(15), "{run:?}");
        assert_eq!(run.code, 5, "no quorum: exit 5: {run:?}");
        assert!(run.stderr.contains("no quorum"), "{run:?}");
        let status = json(&run);
        assert_eq!(status["healthy"], false, "{status}");
        for (id, reachable, voter, _) in members_of(&status) {
            assert!(voter);
            assert_eq!(reachable, id == survivor, "node {id}: {status}");
        }
        assert_no_internals(&run);
    }
    let table = cairn_at(&endpoints, &["status"]).await;
    assert_eq!(table.code, 5, "{table:?}");
    assert!(table.stdout.contains("1 of 3 voters answer"), "{table:?}");
    assert_eq!(table.stdout.matches(" NO ").count(), 2, "{table:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_remove_of_a_dead_node_tries_the_next_endpoint() {
    // Replacing a dead node: its address first in --endpoints (as in a script written when
    // it was alive) costs one refused connection; the removal goes to the leader.
    let mut cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let dead = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    cluster.kill(dead);
    let mut endpoints = vec![cluster.node(dead).client_address.clone()];
    endpoints.extend(
        cluster
            .ids_except(dead)
            .into_iter()
            .map(|id| cluster.node(id).client_address.clone()),
    );
    let run = cairn_at(
        &endpoints.join(","),
        &["member", "remove", &dead.to_string()],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout.contains(&format!("removed node {dead}")),
        "{run:?}"
    );
    assert!(
        !membership(&cluster).await.iter().any(|(id, _)| *id == dead),
        "node {dead} is still a member"
    );
    // transfer-leader and member list also get past the dead endpoint.
    let run = cairn_at(&endpoints.join(","), &["member", "list", "-o", "json"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        json(&run)["members"].as_array().unwrap().len(),
        2,
        "{run:?}"
    );
    let run = cairn_at(&endpoints.join(","), &["transfer-leader"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("leadership moved from node"), "{run:?}");
    // A removed or never-added node is named as such, not as "not a voter".
    let run = cairn_at(&endpoints.join(","), &["transfer-leader", "--to", "9"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("node 9 is not a member"), "{run:?}");
    let run = cairn_at(&endpoints.join(","), &["member", "remove", "9"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("node 9 is not a member"), "{run:?}");
    assert_no_internals(&run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_against_a_stopped_node_returns_within_its_timeout() {
    // A SIGSTOPped node accepts connections but never answers: every attempt at it is
    // bounded, so a command with only that endpoint fails within --timeout-ms (the old
    // membership commands waited for ever), and one with more endpoints goes on to them.
    let mut cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let stopped = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    cluster.pause(stopped);
    let stopped_address = cluster.node(stopped).client_address.clone();
    for args in [
        &["member", "promote", "9"][..],
        &["member", "remove", "9"],
        &["transfer-leader"],
        &["status"],
        &["member", "list"],
    ] {
        let mut all = args.to_vec();
        all.extend(["--timeout-ms", "2000"]);
        let started = Instant::now();
        let run = cairn_at(&stopped_address, &all).await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(6),
            "{args:?} took {took:?}: {run:?}"
        );
        assert_eq!(run.code, 5, "{args:?}: {run:?}");
        assert_no_internals(&run);
    }
    let mut endpoints = vec![stopped_address];
    endpoints.extend(
        cluster
            .ids_except(stopped)
            .into_iter()
            .map(|id| cluster.node(id).client_address.clone()),
    );
    let started = Instant::now();
    let run = cairn_at(
        &endpoints.join(","),
        &["status", "-o", "json", "--timeout-ms", "4000"],
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(10), "{run:?}");
    assert_eq!(run.code, 0, "two of three answer: a quorum: {run:?}");
    let reachable: Vec<(u64, bool)> = members_of(&json(&run))
        .into_iter()
        .map(|(id, reachable, _, _)| (id, reachable))
        .collect();
    assert!(reachable.contains(&(stopped, false)), "{run:?}");
    cluster.resume(stopped);
}

/// A fourth node's process, killed on drop.
struct Extra(std::process::Child);

impl Drop for Extra {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promote_refuses_a_learner_that_has_not_caught_up() {
    // Node 4 is added as a learner but its process is not started: add-learner waits for the
    // catch-up and gives up after its timeout (exit 5, it stays a learner), and promote
    // refuses it, saying the leader never heard from it (the old promote made it a voter).
    // Started with --join, it finds itself a learner, catches up, and then promote works.
    let cluster = Cluster::start(options(3));
    cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let endpoints = cluster.endpoints().join(",");
    for i in 0..20 {
        let run = cairn_at(
            &endpoints,
            &[
                "write",
                "--type",
                "demo.v1.Thing",
                "--name",
                &format!("t{i}"),
                "--data-json",
                "{}",
            ],
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
    }
    let peer = format!("127.0.0.1:{}", jepsen_tests::cluster::free_port());
    let client = format!("127.0.0.1:{}", jepsen_tests::cluster::free_port());
    let started = Instant::now();
    let run = cairn_at(
        &endpoints,
        &[
            "member",
            "add-learner",
            "--id",
            "4",
            "--peer-address",
            &peer,
            "--client-address",
            &client,
            "--catch-up-timeout-ms",
            "1500",
        ],
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(15), "{run:?}");
    assert_eq!(run.code, 5, "not caught up in time: {run:?}");
    assert!(run.stderr.contains("has not caught up"), "{run:?}");
    assert!(run.stderr.contains("stays a learner"), "{run:?}");
    assert!(
        membership(&cluster).await.contains(&(4, false)),
        "node 4 is a learner"
    );

    let run = cairn_at(&endpoints, &["member", "promote", "4"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.contains("refusing to promote node 4"), "{run:?}");
    assert!(run.stderr.contains("never heard from it"), "{run:?}");
    assert_no_internals(&run);
    assert!(
        membership(&cluster).await.contains(&(4, false)),
        "a refused promotion changes nothing"
    );
    let run = cairn_at(&endpoints, &["member", "promote", "9"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("node 9 is not a member"), "{run:?}");

    // Start it: it joins as the learner it already is, and catches up.
    let data_dir = cluster.root().join("node-4-data");
    let log = std::fs::File::create(cluster.root().join("node-4.log")).unwrap();
    let _node4 = Extra(
        std::process::Command::new(binary())
            .args(["agent", "--node-id", "4", "--data-dir"])
            .arg(&data_dir)
            .args(["--client-address", &client, "--peer-address", &peer])
            .args(["--join", &cluster.node(1).client_address])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let run = cairn_at(
        &endpoints,
        &[
            "member",
            "add-learner",
            "--id",
            "4",
            "--peer-address",
            &peer,
            "--client-address",
            &client,
            "--catch-up-timeout-ms",
            "30000",
        ],
    )
    .await;
    assert_eq!(run.code, 0, "caught up: {run:?}");
    assert!(run.stdout.contains("has caught up"), "{run:?}");
    assert!(
        membership(&cluster).await.contains(&(4, false)),
        "a node added by hand waits to be promoted"
    );
    let run = cairn_at(&endpoints, &["member", "promote", "4"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("node 4 is a voter"), "{run:?}");
    assert!(membership(&cluster).await.contains(&(4, true)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_refuses_to_break_the_quorum_unless_forced() {
    // One follower down: removing the other would leave two voters of which the leader
    // hears from one. Refused (exit 5) naming the down node, and nothing changes. With
    // --force the change is proposed; it commits once the down node is back.
    let mut cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let endpoints = cluster.endpoints().join(",");
    let others: Vec<u64> = cluster.ids_except(leader);
    let (stopped, removed) = (others[0], others[1]);
    cluster.kill(stopped);
    // The leader counts a voter unreachable once it has not heard from it for an election
    // timeout (1 s here).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let run = cairn_at(&endpoints, &["member", "remove", &removed.to_string()]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(
        run.stderr
            .contains(&format!("refusing to remove node {removed}")),
        "{run:?}"
    );
    assert!(run.stderr.contains(&format!("node {stopped}")), "{run:?}");
    assert!(run.stderr.contains("--force"), "{run:?}");
    assert_no_internals(&run);
    assert_eq!(membership(&cluster).await.len(), 3, "nothing changed");

    let binary = binary();
    let removed_arg = removed.to_string();
    let forced = tokio::process::Command::new(&binary)
        .args([
            "member",
            "remove",
            &removed_arg,
            "--force",
            "--timeout-ms",
            "30000",
        ])
        .args(["--endpoints", &endpoints])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.spawn(stopped);
    let out = tokio::time::timeout(Duration::from_secs(40), forced.wait_with_output())
        .await
        .expect("the forced removal ends")
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains(&format!("removed node {removed}")), "{text}");
    cluster.kill(removed);
    let members = membership(&cluster).await;
    assert!(!members.iter().any(|(id, _)| *id == removed), "{members:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_health_endpoint_status_and_member_list() {
    // One node killed: endpoint health says which endpoints are healthy and exits 5;
    // --cluster covers every member from one endpoint; endpoint status shows each node's own
    // view (one leader); member list shows ids, voter/learner and addresses.
    let mut cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let endpoints = cluster.endpoints().join(",");
    // Health turns SERVING shortly after the election (a linearizable read passed).
    let deadline = Instant::now() + Duration::from_secs(15);
    let run = loop {
        let run = cairn_at(&endpoints, &["endpoint", "health"]).await;
        if run.code == 0 || Instant::now() > deadline {
            break run;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout.matches("is healthy").count(), 3, "{run:?}");
    let run = cairn_at(&endpoints, &["member", "list"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    for id in cluster.ids() {
        let node = cluster.node(id);
        assert!(run.stdout.contains(&node.peer_address), "{run:?}");
        assert!(run.stdout.contains(&node.client_address), "{run:?}");
    }
    assert_eq!(run.stdout.matches("voter").count(), 3, "{run:?}");
    let run = cairn_at(&endpoints, &["member", "list", "-o", "json"]).await;
    let listed = json(&run);
    assert_eq!(listed["members"].as_array().unwrap().len(), 3, "{listed}");

    let dead = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    cluster.kill(dead);
    let dead_address = cluster.node(dead).client_address.clone();
    let run = cairn_at(&endpoints, &["endpoint", "health", "-o", "json"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    let health = json(&run);
    let health = health.as_array().unwrap();
    assert_eq!(health.len(), 3);
    for h in health {
        assert_eq!(h["health"], h["endpoint"] != dead_address.as_str(), "{h}");
    }
    // --cluster: every member, from one endpoint given as a URL.
    let one = format!("http://{}", cluster.node(leader).client_address);
    let run = cairn_at(&one, &["endpoint", "health", "--cluster"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert_eq!(run.stdout.matches("is healthy").count(), 2, "{run:?}");
    assert!(
        run.stdout.contains(&format!("{dead_address} is unhealthy")),
        "{run:?}"
    );
    let run = cairn_at(&one, &["endpoint", "status", "--cluster", "-o", "json"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    let statuses = json(&run);
    let statuses = statuses.as_array().unwrap();
    assert_eq!(statuses.len(), 3, "{run:?}");
    assert_eq!(
        statuses.iter().filter(|s| s["is_leader"] == true).count(),
        1,
        "{run:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| s["reachable"] == false).count(),
        1,
        "{run:?}"
    );
    let run = cairn_at(&one, &["endpoint", "status", "--cluster"]).await;
    for column in [
        "ENDPOINT",
        "ID",
        "VERSION",
        "DATA DIR",
        "IS LEADER",
        "TERM",
        "APPLIED",
    ] {
        assert!(run.stdout.contains(column), "{column}: {run:?}");
    }
    assert_no_internals(&run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_is_refused_without_offline_for_its_flags_or_without_yes() {
    // `snapshot restore --data-dir zz backup` once replaced the running cluster's data and
    // exited 0. It is refused (exit 2, saying --offline), as is an online restore without
    // --yes when stdin is not a terminal (saying --yes); the data is unchanged after both.
    // With --yes it replaces the data.
    let cluster = Cluster::start(options(3));
    cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let endpoints = cluster.endpoints().join(",");
    let write = |name: &'static str| {
        let endpoints = endpoints.clone();
        async move {
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
    };
    let names = || async {
        let run = cairn_at(&endpoints, &["list", "--type", "demo.Thing", "-o", "json"]).await;
        assert_eq!(run.code, 0, "{run:?}");
        let mut names: Vec<String> = json(&run)["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"]["name"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        names
    };
    write("before").await;
    let backup = cluster.root().join("backup.snap");
    let backup = backup.to_str().unwrap();
    let run = cairn_at(&endpoints, &["snapshot", "save", backup]).await;
    assert_eq!(run.code, 0, "{run:?}");
    write("after").await;
    assert_eq!(names().await, ["after", "before"]);

    let zz = cluster.root().join("zz");
    let run = cairn_at(
        &endpoints,
        &[
            "snapshot",
            "restore",
            "--data-dir",
            zz.to_str().unwrap(),
            backup,
        ],
    )
    .await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("--offline"), "{run:?}");
    assert!(!zz.exists(), "nothing seeded");
    assert_eq!(
        names().await,
        ["after", "before"],
        "the cluster's data is unchanged"
    );
    let run = cairn_at(
        &endpoints,
        &[
            "snapshot",
            "restore",
            "--members",
            "1=127.0.0.1:1/127.0.0.1:2",
            backup,
        ],
    )
    .await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("--offline"), "{run:?}");

    let run = cairn_at(&endpoints, &["snapshot", "restore", backup]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("--yes"), "{run:?}");
    assert!(run.stderr.contains("not a terminal"), "{run:?}");
    assert_eq!(
        names().await,
        ["after", "before"],
        "the cluster's data is unchanged"
    );

    let run = cairn_at(&endpoints, &["snapshot", "restore", "--yes", backup]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("restored"), "{run:?}");
    assert_eq!(names().await, ["before"], "the backup replaced the data");
}
