//! The `cairn` data commands as real processes against a real cluster:
//! round trips for read, write, delete, list, owned-by and watch, their JSON
//! output, and the exit codes (0 ok, 2 usage, 3 not found, 4 CAS conflict,
//! 5 unavailable).

use crate::client_support;

use std::process::Stdio;
use std::time::Duration;

use client_support::*;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {run:?}"))
}

fn version(v: &Value) -> u64 {
    v["version"]
        .as_str()
        .expect("version")
        .parse()
        .expect("numeric version")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_round_trips_with_json_output_and_exit_codes() {
    // Each data command through the real binary, in the order a user would
    // type them, checking the exit code and the JSON of each.
    tokio::time::timeout(Duration::from_secs(240), async {
        let cluster = Cluster::start(options(3));
        cluster.wait_for_leader(LEADER_TIMEOUT).await;
        let endpoints = cluster.endpoints().join(",");
        let e = endpoints.as_str();
        let t = "demo.v1.Thing";

        // write (create) -> JSON with a generated uid and the data as JSON.
        let run = cairn(
            &[
                "write",
                "--endpoints",
                e,
                "--type",
                t,
                "--name",
                "web",
                "--data-json",
                "{\"port\": 80}",
                "-o",
                "json",
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        let web = json(&run);
        assert_eq!(web["data"]["json"]["port"], 80);
        assert_eq!(web["data"]["type_url"], "type.googleapis.com/demo.v1.Thing");
        assert_eq!(
            web["id"]["uid"].as_str().map(str::len),
            Some(26),
            "a ULID uid"
        );

        // Creating it again is a CAS conflict.
        let run = cairn(
            &["write", "--endpoints", e, "--type", t, "--name", "web"],
            None,
        )
        .await;
        assert_eq!(run.code, 4, "{run:?}");

        // read -> the same JSON; the table form names the resource.
        let run = cairn(
            &[
                "read",
                "--endpoints",
                e,
                "--type",
                t,
                "--name",
                "web",
                "-o",
                "json",
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        assert_eq!(json(&run), web);
        let run = cairn(
            &[
                "read",
                "--endpoints",
                e,
                "--type",
                t,
                "--name",
                "web",
                "--consistency",
                "eventual",
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        assert!(
            run.stdout.starts_with("TYPE")
                && run.stdout.contains("demo.v1.Thing")
                && run.stdout.contains("{\"port\":80}"),
            "{run:?}"
        );

        // Error exit codes: not found, invalid argument, usage.
        let run = cairn(
            &["read", "--endpoints", e, "--type", t, "--name", "nope"],
            None,
        )
        .await;
        assert_eq!(run.code, 3, "{run:?}");
        let run = cairn(
            &[
                "read",
                "--endpoints",
                e,
                "--type",
                t,
                "--name",
                "web",
                "--tenancy",
                "*/*",
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 2, "{run:?}");
        let run = cairn(
            &[
                "read",
                "--endpoints",
                e,
                "--type",
                "demo.Thing",
                "--name",
                "web",
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 2, "{run:?}");

        // The JSON read back, edited, written from stdin: a CAS update.
        let mut edited = web.clone();
        edited["data"]["json"]["port"] = Value::from(81);
        let text = serde_json::to_string_pretty(&edited).unwrap();
        let run = cairn(
            &["write", "--endpoints", e, "--file", "-", "-o", "json"],
            Some(&text),
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        let updated = json(&run);
        assert!(version(&updated) > version(&web));
        assert_eq!(updated["data"]["json"]["port"], 81);
        // The same document again carries a stale version.
        let run = cairn(&["write", "--endpoints", e, "--file", "-"], Some(&text)).await;
        assert_eq!(run.code, 4, "{run:?}");

        // An owner and an owned resource; owned-by finds it.
        let run = cairn(
            &[
                "write",
                "--endpoints",
                e,
                "--type",
                "demo.v1.Owner",
                "--name",
                "o",
                "-o",
                "json",
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        let owner_uid = json(&run)["id"]["uid"].as_str().unwrap().to_string();
        let owner_ref = format!("demo.v1.Owner/o/{owner_uid}");
        let run = cairn(
            &[
                "write",
                "--endpoints",
                e,
                "--type",
                t,
                "--name",
                "child",
                "--owner",
                &owner_ref,
                "--metadata",
                "team=a",
                "-o",
                "json",
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        assert_eq!(json(&run)["owner"]["uid"], owner_uid.as_str());
        let run = cairn(
            &[
                "owned-by",
                "--endpoints",
                e,
                "--type",
                "demo.v1.Owner",
                "--name",
                "o",
                "-o",
                "json",
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        let owned = json(&run);
        assert_eq!(
            owned["resources"].as_array().map(Vec::len),
            Some(1),
            "{owned}"
        );
        assert_eq!(owned["resources"][0]["id"]["name"], "child");
        let run = cairn(
            &[
                "owned-by",
                "--endpoints",
                e,
                "--type",
                "demo.v1.Owner",
                "--name",
                "missing",
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 3, "{run:?}");

        // --upsert replaces whatever is stored and keeps the uid.
        let run = cairn(
            &[
                "write",
                "--endpoints",
                e,
                "--type",
                t,
                "--name",
                "web",
                "--upsert",
                "--data-base64",
                "CJYB",
                "-o",
                "json",
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        let upserted = json(&run);
        assert_eq!(upserted["id"]["uid"], web["id"]["uid"]);
        assert_eq!(upserted["data"]["base64"], "CJYB");

        // list: both Things, in JSON with the revision; the table has a header and two rows.
        let run = cairn(
            &[
                "list",
                "--endpoints",
                e,
                "--type",
                "demo.Thing",
                "--tenancy",
                "*/*",
                "-o",
                "json",
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        let listed = json(&run);
        assert_eq!(
            listed["resources"].as_array().map(Vec::len),
            Some(2),
            "{listed}"
        );
        assert!(listed["revision"].as_u64().unwrap() >= version(&upserted));
        let run = cairn(
            &[
                "list",
                "--endpoints",
                e,
                "--type",
                t,
                "--prefix",
                "we",
                "--consistency",
                "eventual",
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        assert!(run.stdout.lines().count() <= 2, "{run:?}");

        // watch: the snapshot (two upserts) then EndOfSnapshot, as JSON lines.
        let run = cairn(
            &[
                "watch",
                "--endpoints",
                e,
                "--type",
                "demo.Thing",
                "--max-events",
                "3",
                "-o",
                "json",
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        let events: Vec<Value> = run
            .stdout
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        assert_eq!(events.len(), 3, "{run:?}");
        assert_eq!(events[0]["event"], "upsert");
        assert_eq!(events[2]["event"], "end-of-snapshot");

        // delete: a stale version conflicts; then deleted; deleting nothing succeeds.
        let run = cairn(
            &[
                "delete",
                "--endpoints",
                e,
                "--type",
                t,
                "--name",
                "web",
                "--version",
                &version(&web).to_string(),
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 4, "{run:?}");
        let run = cairn(
            &[
                "delete",
                "--endpoints",
                e,
                "--type",
                t,
                "--name",
                "web",
                "-o",
                "json",
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        assert_eq!(json(&run)["deleted"], true);
        let run = cairn(
            &[
                "delete",
                "--endpoints",
                e,
                "--type",
                t,
                "--name",
                "web",
                "-o",
                "json",
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        assert_eq!(json(&run)["deleted"], false);
        let run = cairn(
            &["read", "--endpoints", e, "--type", t, "--name", "web"],
            None,
        )
        .await;
        assert_eq!(run.code, 3, "{run:?}");
    })
    .await
    .expect("the test finishes within 240 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_reports_unavailable_when_no_endpoint_answers() {
    // Nothing listens at the endpoint: exit code 5 within the deadline.
    let dead = format!("127.0.0.1:{}", jepsen_tests::cluster::free_port());
    let started = std::time::Instant::now();
    let run = cairn(
        &[
            "read",
            "--endpoints",
            &dead,
            "--timeout-ms",
            "1000",
            "--type",
            "demo.v1.Thing",
            "--name",
            "x",
        ],
        None,
    )
    .await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_watch_prints_events_as_they_come_until_interrupted() {
    // `cairn watch` prints the snapshot, then a live write as it happens;
    // Ctrl-C (SIGINT) ends it with exit code 0.
    tokio::time::timeout(Duration::from_secs(120), async {
        let cluster = Cluster::start(options(3));
        cluster.wait_for_leader(LEADER_TIMEOUT).await;
        let endpoints = cluster.endpoints().join(",");
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["watch", "--type", "demo.Thing", "-o", "json"])
            .env("CAIRN_ENDPOINTS", &endpoints)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("cairn watch starts");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first: Value =
            serde_json::from_str(&lines.next_line().await.expect("read").expect("a line")).unwrap();
        assert_eq!(
            first["event"], "end-of-snapshot",
            "an empty store: EndOfSnapshot first"
        );

        let run = cairn(
            &[
                "write",
                "--endpoints",
                &endpoints,
                "--type",
                "demo.v1.Thing",
                "--name",
                "live",
                "--data-json",
                "{}",
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        let live: Value =
            serde_json::from_str(&lines.next_line().await.expect("read").expect("a line")).unwrap();
        assert_eq!(live["event"], "upsert");
        assert_eq!(live["resource"]["id"]["name"], "live");

        let pid = child.id().expect("running") as i32;
        // SAFETY: kill(2) on the child we spawned and still own.
        unsafe {
            libc::kill(pid, libc::SIGINT);
        }
        let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .expect("exits after SIGINT")
            .expect("exit status");
        assert_eq!(status.code(), Some(0));
    })
    .await
    .expect("the test finishes within 120 s");
}

#[test]
fn a_command_whose_reader_went_away_ends_quietly() {
    // `cairn snapshot inspect F | head -1`: the reader closes the pipe before the command
    // has printed everything. Like any Unix tool, the command ends on SIGPIPE, without a
    // panic message (it once printed "failed printing to stdout: Broken pipe", exit 101).
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["token", "new"])
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("cairn runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?} {stderr}",
        out.status
    );
}
