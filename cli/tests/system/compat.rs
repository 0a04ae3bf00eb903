//! Data written by release 0.1.0 (`tests/compat/0.1.0`, see its README): this build starts a
//! cluster on it and serves every resource it held at the same versions, raises the cluster
//! version once every member runs this build, and reads the 0.1.0 backup file. A change that
//! cannot read those files fails here.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/compat/0.1.0")
}

/// The fixture cluster's ports: its membership names them, so they cannot be chosen.
const ENDPOINTS: &str = "127.0.0.1:17001,127.0.0.1:17002,127.0.0.1:17003";

fn cairn(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .env("CAIRN_ENDPOINTS", ENDPOINTS)
        .output()
        .expect("run cairn")
}

fn json_of(args: &[&str]) -> Value {
    let out = cairn(args);
    assert!(
        out.status.success(),
        "cairn {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cairn -o json prints JSON")
}

fn fixture_json(name: &str) -> Value {
    let text = std::fs::read_to_string(fixtures().join(name)).expect("fixture");
    serde_json::from_str(&text).expect("fixture JSON")
}

/// `cairn dev` on `data_dir`, stopped (Ctrl-C) when dropped.
struct Dev(std::process::Child);

impl Drop for Dev {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGINT);
        }
        let _ = self.0.wait();
    }
}

fn start_dev(data_dir: &Path) -> Dev {
    let dev = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["dev", "--base-port", "17000", "--data-dir"])
        .arg(data_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start cairn dev");
    let dev = Dev(dev);
    let deadline = Instant::now() + Duration::from_secs(40);
    while !cairn(&["status", "-o", "json"]).status.success() {
        if Instant::now() > deadline {
            // Why the nodes did not come up: the end of each one's log.
            let tails: Vec<String> = (1..=3)
                .map(|id| {
                    let log = std::fs::read_to_string(data_dir.join(format!("node-{id}.log")))
                        .unwrap_or_default();
                    let lines: Vec<&str> = log.lines().collect();
                    format!(
                        "node {id}: {}",
                        lines[lines.len().saturating_sub(2)..].join("\n  ")
                    )
                })
                .collect();
            panic!(
                "the 0.1.0 cluster did not come up under this build within 40 s:\n{}",
                tails.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    dev
}

fn wait_until(timeout: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn listed(type_: &str) -> Value {
    json_of(&["list", "--type", type_, "--tenancy", "*/*", "-o", "json"])["resources"].clone()
}

#[test]
fn this_build_serves_a_cluster_written_by_release_0_1_0_and_raises_its_version() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("dev");
    std::fs::create_dir_all(&data_dir).unwrap();
    let unpacked = Command::new("tar")
        .arg("xzf")
        .arg(fixtures().join("data-dir-0.1.0.tar.gz"))
        .arg("-C")
        .arg(&data_dir)
        .status()
        .expect("tar");
    assert!(unpacked.success(), "unpacking the fixture");

    let _dev = start_dev(&data_dir);
    // Every resource, at its version, with its owner, metadata and status.
    assert_eq!(listed("demo.v1.Thing"), fixture_json("things.json"));
    let endpoints = listed("catalog.v2.Endpoint");
    assert_eq!(endpoints, fixture_json("endpoints.json"));

    // Every member runs this build: the leader raises the cluster version.
    let mut status = Value::Null;
    wait_until(
        Duration::from_secs(30),
        "raise of the cluster version",
        || {
            status = json_of(&["status", "-o", "json"]);
            status["cluster_version"] == "0.2"
        },
    );

    // New writes go on at later versions; the old backup is read and verified.
    let written = json_of(&[
        "write",
        "--type",
        "demo.v1.Thing",
        "--name",
        "after-upgrade",
        "--data-json",
        "{}",
        "-o",
        "json",
    ]);
    let version: u64 = written["version"].as_str().unwrap().parse().unwrap();
    assert!(version > 243, "a version after the 0.1.0 log's: {version}");
    let backup = fixtures().join("backup-0.1.0.snap");
    let inspected = cairn(&["snapshot", "inspect", backup.to_str().unwrap()]);
    assert!(
        inspected.status.success(),
        "inspect the 0.1.0 backup: {}",
        String::from_utf8_lossy(&inspected.stderr)
    );
    let text = String::from_utf8_lossy(&inspected.stdout);
    assert!(text.contains("142"), "the backup's 142 resources: {text}");
}
