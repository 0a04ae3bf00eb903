//! Leases, locks and elections as a user meets them, with the `cairn` binary (and the client
//! library for fencing) against a real three-node cluster at cluster version 0.2:
//! - `cairn lease grant` prints an id; `cairn write --lease ID` attaches a resource; a lease
//!   kept alive by `cairn lease keep-alive` outlives its TTL; `cairn lease revoke` deletes
//!   what is attached (and the keep-alive then exits 7, the lease lost); a lease nobody keeps
//!   alive expires and its resource disappears within the TTL and a couple of seconds;
//! - a lease kept alive by the library survives the death of the leader its keep-alives
//!   went to (the handle moves to another node; a new leader is elected);
//! - `cairn lock` runs its command with the fencing token in `CAIRN_LOCK_TOKEN`, exits with
//!   the command's code, and two `cairn lock`s on one name never run their commands at the
//!   same time; a lock deleted under a running command gets it SIGTERM and exits 7;
//! - `cairn elect --listen` sees the holder change after the holder is SIGKILLed: its lease
//!   expires and the other candidate wins, with a higher token;
//! - a write fenced with a token an older holder had is refused (FailedPrecondition), the
//!   current holder's fenced writes apply, and a leadership whose lease is revoked is lost.

use crate::client_support;

use std::process::Stdio;
use std::time::Duration;

use cairn_client::v1::{Consistency, WriteRequest};
use cairn_client::{ClientError, Election, LeadershipLoss};
use client_support::{
    cairn_at, client_for, eventually, id, options, run_cairn, thing, Cluster, Run, LEADER_TIMEOUT,
};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

/// A cluster with a leader, risen to cluster version 0.2 (leases need it).
async fn lease_cluster() -> (Cluster, String) {
    let cluster = Cluster::start(options(3));
    cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let endpoints = cluster.endpoints().join(",");
    client_support::wait_cluster_version_0_2(&endpoints, &[]).await;
    (cluster, endpoints)
}

/// `cairn --endpoints ENDPOINTS lock ARGS`: the cluster flags first, since after
/// `lock NAME --` everything is the command's.
async fn lock(endpoints: &str, args: &[&str]) -> Run {
    let mut all = vec!["--endpoints", endpoints, "lock"];
    all.extend(args);
    run_cairn(env!("CARGO_BIN_EXE_cairn"), &all, None, &[]).await
}

/// `cairn lease grant --ttl TTL`: the id it prints.
async fn grant(endpoints: &str, ttl: &str) -> u64 {
    let run = cairn_at(endpoints, &["lease", "grant", "--ttl", ttl]).await;
    assert_eq!(run.code, 0, "{run:?}");
    run.stdout
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("grant prints just an id ({e}): {run:?}"))
}

async fn write_leased(endpoints: &str, name: &str, lease: u64) -> Run {
    let lease = lease.to_string();
    let args = [
        "write",
        "--type",
        "demo.v1.Thing",
        "--name",
        name,
        "--data-json",
        "{}",
        "--lease",
        &lease,
    ];
    cairn_at(endpoints, &args).await
}

async fn read_code(endpoints: &str, name: &str) -> i32 {
    let run = cairn_at(
        endpoints,
        &["read", "--type", "demo.v1.Thing", "--name", name],
    )
    .await;
    run.code
}

/// A `cairn` process left running, its stdout lines on a channel.
struct Running {
    child: tokio::process::Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Running {
    fn start(endpoints: &str, args: &[&str]) -> Running {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_cairn"));
        // The cluster flags first: after `lock NAME --`, everything is the command's.
        command.args(["--endpoints", endpoints]).args(args);
        for name in [
            "CAIRN_ENDPOINTS",
            "CAIRN_TOKEN",
            "CAIRN_CACERT",
            "CAIRN_CERT",
            "CAIRN_KEY",
        ] {
            command.env_remove(name);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("cairn starts");
        let (sender, lines) = mpsc::unbounded_channel();
        let stdout = child.stdout.take().expect("stdout piped");
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        Running { child, lines }
    }

    /// The next stdout line, within `limit`.
    async fn line(&mut self, limit: Duration) -> Option<String> {
        tokio::time::timeout(limit, self.lines.recv())
            .await
            .ok()
            .flatten()
    }

    /// Lines until one satisfies `wanted`, within `limit`; every line seen, in order.
    async fn until(&mut self, limit: Duration, wanted: impl Fn(&str) -> bool) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + limit;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.line(left).await {
                Some(line) => {
                    let done = wanted(&line);
                    seen.push(line);
                    if done {
                        return seen;
                    }
                }
                None => panic!("no line as wanted within {limit:?}; saw {seen:?}"),
            }
        }
    }

    fn signal(&self, signal: i32) {
        let pid = self.child.id().expect("running") as i32;
        // SAFETY: kill(2) on a child of this test that has not been reaped.
        unsafe {
            libc::kill(pid, signal);
        }
    }

    /// Waits for the exit (at most `limit`): its code and stderr.
    async fn exit(self, limit: Duration) -> (i32, String) {
        let output = tokio::time::timeout(limit, self.child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("no exit within {limit:?}"))
            .expect("wait");
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }
}

/// `elected NAME token T` → T.
fn elected_token(line: &str) -> u64 {
    line.rsplit_once(" token ")
        .and_then(|(_, t)| t.trim().parse().ok())
        .unwrap_or_else(|| panic!("not `elected NAME token T`: {line}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_holds_its_resources_while_kept_alive_and_takes_them_when_revoked_or_expired() {
    let (_cluster, endpoints) = lease_cluster().await;

    // Grant: just the id; in JSON, the id and the TTL.
    let run = cairn_at(&endpoints, &["lease", "grant", "--ttl", "2s", "-o", "json"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let granted: Value = serde_json::from_str(&run.stdout).expect("JSON");
    assert!(granted["id"].as_u64().is_some_and(|id| id > 0), "{granted}");
    assert_eq!(granted["ttl_ms"], 2000);

    // Kept alive, a lease outlives its TTL, and so does what is attached to it.
    let kept = grant(&endpoints, "1s").await;
    let keeper = Running::start(&endpoints, &["lease", "keep-alive", &kept.to_string()]);
    let run = write_leased(&endpoints, "kept", kept).await;
    assert_eq!(run.code, 0, "{run:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        read_code(&endpoints, "kept").await,
        0,
        "attached and kept alive: still there after 3 TTLs"
    );
    let run = cairn_at(
        &endpoints,
        &["lease", "ttl", &kept.to_string(), "-o", "json"],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let ttl: Value = serde_json::from_str(run.stdout.trim()).expect("JSON");
    assert_eq!(ttl["attached_count"], 1, "{ttl}");
    let run = cairn_at(&endpoints, &["lease", "list", "-o", "json"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let listed: Value = serde_json::from_str(&run.stdout).expect("JSON");
    assert!(
        listed["leases"]
            .as_array()
            .is_some_and(|l| l.iter().any(|l| l["id"] == kept)),
        "{listed}"
    );

    // Revoked: the attached resource goes at once, and the keeper learns the lease is
    // gone (exit 7, saying so).
    let run = cairn_at(&endpoints, &["lease", "revoke", &kept.to_string()]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout.contains("1 attached resource deleted"),
        "{run:?}"
    );
    assert_eq!(
        read_code(&endpoints, "kept").await,
        3,
        "deleted with its lease"
    );
    let (code, stderr) = keeper.exit(Duration::from_secs(10)).await;
    assert_eq!(
        code, 7,
        "the keeper exits 7 once its lease is gone: {stderr}"
    );
    assert!(stderr.contains(&format!("lease {kept} lost")), "{stderr}");
    let run = cairn_at(&endpoints, &["lease", "revoke", &kept.to_string()]).await;
    assert_eq!(run.code, 3, "a lease never comes back: {run:?}");

    // Not kept alive: the lease expires on its own and takes its resource with it,
    // within the TTL and a couple of seconds.
    let left = grant(&endpoints, "1s").await;
    let run = write_leased(&endpoints, "left", left).await;
    assert_eq!(run.code, 0, "{run:?}");
    let written = tokio::time::Instant::now();
    let gone = eventually(Duration::from_secs(4), || async {
        read_code(&endpoints, "left").await == 3
    })
    .await;
    assert!(gone, "expired with its lease within 1 s + 3 s");
    assert!(
        written.elapsed() >= Duration::from_millis(500),
        "not before its TTL could run out: {:?}",
        written.elapsed()
    );
    let run = cairn_at(&endpoints, &["lease", "ttl", &left.to_string()]).await;
    assert_eq!(run.code, 3, "{run:?}");
    let run = cairn_at(
        &endpoints,
        &["lease", "keep-alive", &left.to_string(), "--once"],
    )
    .await;
    assert_eq!(run.code, 3, "{run:?}");
    assert!(run.stderr.contains("does not exist"), "{run:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cairn_lock_runs_its_command_with_the_token_and_never_two_at_once() {
    let (_cluster, endpoints) = lease_cluster().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("log");
    let log = log.to_str().expect("a UTF-8 path");

    // The command sees the lock's name, token and lease, and its exit code comes back.
    let run = lock(
        &endpoints,
        &[
            "job",
            "--ttl",
            "2s",
            "--",
            "sh",
            "-c",
            "echo \"$CAIRN_LOCK_NAME $CAIRN_LOCK_TOKEN $CAIRN_LEASE_ID\"; exit 3",
        ],
    )
    .await;
    assert_eq!(run.code, 3, "the command's exit code: {run:?}");
    let words: Vec<&str> = run.stdout.split_whitespace().collect();
    assert_eq!(words.len(), 3, "{run:?}");
    assert_eq!(words[0], "job");
    assert!(words[1].parse::<u64>().is_ok_and(|t| t > 0), "{run:?}");
    assert!(words[2].parse::<u64>().is_ok_and(|l| l > 0), "{run:?}");

    // Two lockers, three rounds each: the commands' start and end lines never interleave,
    // and each holder's token is above the last one's.
    let script = format!(
        "echo \"start $CAIRN_LOCK_TOKEN\" >> {log}; sleep 0.3; echo \"end $CAIRN_LOCK_TOKEN\" >> {log}"
    );
    let mut lockers = Vec::new();
    for _ in 0..2 {
        let (endpoints, script) = (endpoints.clone(), script.clone());
        lockers.push(tokio::spawn(async move {
            for _ in 0..3 {
                let run = lock(
                    &endpoints,
                    &["shared", "--ttl", "2s", "--", "sh", "-c", &script],
                )
                .await;
                assert_eq!(run.code, 0, "{run:?}");
            }
        }));
    }
    for locker in lockers {
        locker.await.expect("locker");
    }
    let lines = std::fs::read_to_string(log).expect("the log");
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(lines.len(), 12, "six runs: {lines:?}");
    let mut last_token = 0;
    for pair in lines.chunks(2) {
        let start = pair[0].strip_prefix("start ").expect("a start line");
        let end = pair[1].strip_prefix("end ").expect("its end next");
        assert_eq!(start, end, "one holder at a time: {lines:?}");
        let token: u64 = start.parse().expect("a token");
        assert!(token > last_token, "tokens grow: {lines:?}");
        last_token = token;
    }

    // The lock deleted under a running command: it gets SIGTERM, `cairn lock` exits 7.
    let mut locker = Running::start(
        &endpoints,
        &[
            "lock",
            "doomed",
            "--ttl",
            "2s",
            "--",
            "sh",
            "-c",
            "trap 'echo terminated; exit 0' TERM; echo running; while true; do sleep 0.1; done",
        ],
    );
    assert_eq!(
        locker.line(Duration::from_secs(20)).await.as_deref(),
        Some("running")
    );
    let run = cairn_at(
        &endpoints,
        &["delete", "--type", "cairn.v1.Election", "--name", "doomed"],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        locker.line(Duration::from_secs(10)).await.as_deref(),
        Some("terminated"),
        "the command got SIGTERM"
    );
    let (code, stderr) = locker.exit(Duration::from_secs(10)).await;
    assert_eq!(code, 7, "{stderr}");
    assert!(stderr.contains("lost the lock doomed"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_s_election_passes_to_the_other_candidate_and_listeners_see_it() {
    let (_cluster, endpoints) = lease_cluster().await;
    let mut listener = Running::start(&endpoints, &["elect", "primary", "--listen"]);
    assert_eq!(
        listener.line(Duration::from_secs(20)).await.as_deref(),
        Some("primary: no holder")
    );

    let mut alpha = Running::start(&endpoints, &["elect", "primary", "alpha", "--ttl", "1s"]);
    let line = alpha
        .line(Duration::from_secs(20))
        .await
        .expect("alpha wins");
    assert!(line.starts_with("elected primary token "), "{line}");
    let alpha_token = elected_token(&line);
    listener
        .until(Duration::from_secs(10), |l| {
            l == format!("primary: alpha (token {alpha_token})")
        })
        .await;

    // Beta waits while alpha holds.
    let mut beta = Running::start(&endpoints, &["elect", "primary", "beta", "--ttl", "1s"]);
    assert_eq!(
        beta.line(Duration::from_secs(2)).await,
        None,
        "beta does not win while alpha holds"
    );

    // Alpha dies without a word: its lease expires after its TTL, the election resource
    // goes with it, and beta wins with a higher token.
    alpha.signal(libc::SIGKILL);
    let killed = tokio::time::Instant::now();
    let line = beta
        .line(Duration::from_secs(10))
        .await
        .expect("beta wins once alpha's lease expired");
    let beta_token = elected_token(&line);
    assert!(beta_token > alpha_token, "{beta_token} > {alpha_token}");
    assert!(
        killed.elapsed() >= Duration::from_millis(500),
        "not before alpha's lease could expire: {:?}",
        killed.elapsed()
    );
    let seen = listener
        .until(Duration::from_secs(10), |l| {
            l == format!("primary: beta (token {beta_token})")
        })
        .await;
    assert!(
        seen.iter().all(|l| l.starts_with("primary: ")),
        "one line per holder: {seen:?}"
    );

    // Beta resigns on Ctrl-C: exit 0, and the listener sees nobody.
    beta.signal(libc::SIGINT);
    let (code, stderr) = beta.exit(Duration::from_secs(10)).await;
    assert_eq!(code, 0, "{stderr}");
    listener
        .until(Duration::from_secs(10), |l| l == "primary: no holder")
        .await;
    listener.signal(libc::SIGINT);
    let (code, stderr) = listener.exit(Duration::from_secs(10)).await;
    assert_eq!(code, 0, "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_fenced_by_an_old_holder_s_token_is_refused() {
    let (cluster, _endpoints) = lease_cluster().await;
    let client = client_for(&cluster.endpoints()).await;
    let election = Election::new(client.clone(), "writer", None);

    let first_lease = client
        .grant_lease(Duration::from_secs(2))
        .await
        .expect("grant");
    let first = election
        .campaign(&first_lease, "first")
        .await
        .expect("the first candidate wins an empty election");
    let stale_fence = first.fence();
    let written = first
        .write(thing("Fenced", "data", "{\"by\": \"first\"}"))
        .await
        .expect("the holder's fenced write applies");

    // The first holder's lease is revoked: its leadership is lost, and a second
    // candidate wins with a higher token.
    let lost = first.lost();
    first_lease.revoke().await.expect("revoke");
    assert!(
        matches!(lost.await, LeadershipLoss::Lease { .. }),
        "lost with its lease"
    );
    let second_lease = client
        .grant_lease(Duration::from_secs(2))
        .await
        .expect("grant");
    let second = election
        .campaign(&second_lease, "second")
        .await
        .expect("the second candidate wins");
    assert!(second.token() > stale_fence.token);
    assert_eq!(
        election.leader().await.expect("leader").map(|h| h.identity),
        Some("second".to_string())
    );

    // A write fenced with the first holder's token is refused, whatever its sender
    // believes; the second holder's applies.
    let mut update = written.clone();
    update.data = thing("Fenced", "data", "{\"by\": \"stale\"}").data;
    let refused = client
        .write_request(WriteRequest {
            resource: Some(update.clone()),
            fence: Some(stale_fence),
        })
        .await;
    assert!(
        matches!(refused, Err(ClientError::FailedPrecondition(ref m)) if m.contains("fence")),
        "{refused:?}"
    );
    let stored = client
        .read(id("Fenced", "data"), Consistency::Strong)
        .await
        .expect("read");
    assert_eq!(
        stored.version, written.version,
        "the stale write did not apply"
    );
    second
        .write(update)
        .await
        .expect("the current holder's fenced write applies");
    second.resign().await.expect("resign");
    assert_eq!(election.leader().await.expect("leader"), None);
    second_lease.revoke().await.expect("revoke");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_kept_by_the_library_outlives_the_death_of_the_leader_it_talked_to() {
    // The handle's keep-alives go to the leader (first endpoint); the leader is killed: the
    // handle moves to another node, a new leader is elected, and neither the lease nor its
    // resource is lost, well past the TTL.
    let (mut cluster, _endpoints) = lease_cluster().await;
    let leader = cluster.leader().await.expect("a leader");
    let mut endpoints = vec![cluster.node(leader).client_address.clone()];
    for other in cluster.ids_except(leader) {
        endpoints.push(cluster.node(other).client_address.clone());
    }
    let client = client_for(&endpoints).await;
    let ttl = Duration::from_secs(5);
    let lease = client.grant_lease(ttl).await.expect("grant");
    let mut resource = thing("Leased", "kept", "{}");
    resource.lease = lease.id();
    client.create(resource).await.expect("attached");

    cluster.kill(leader);
    let survivors = cluster.ids_except(leader);
    cluster
        .wait_for_leader_among(&survivors, LEADER_TIMEOUT)
        .await;
    tokio::time::sleep(ttl + Duration::from_secs(2)).await;
    assert_eq!(lease.loss(), None, "still held: {lease:?}");
    let remaining = client
        .lease_time_to_live(lease.id())
        .await
        .expect("time to live");
    assert!(
        remaining.is_some_and(|l| l.attached_count == 1),
        "the cluster holds it, with its resource: {remaining:?}"
    );
    assert!(client
        .read(id("Leased", "kept"), Consistency::Strong)
        .await
        .is_ok());
    assert_eq!(lease.revoke().await, Ok(1), "revoked with its resource");
}
