//! `cairn check disk` and `cairn check perf` as an operator runs them: the real binary on a
//! tmpfs directory, and against a real 3-node cluster whose grants require a token. The
//! threshold decisions themselves are unit tests of `cairn_cli::check`'s verdict functions.

use crate::support;

use std::path::Path;
use std::time::Duration;

use support::*;

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn check_disk_on_tmpfs_passes_and_prints_its_figures() {
    // /dev/shm is a tmpfs: its fdatasync returns at once.
    let shm = Path::new("/dev/shm");
    assert!(shm.is_dir(), "/dev/shm (a tmpfs) is there on Linux");
    let dir = tempfile::Builder::new()
        .prefix("cairn-check-disk")
        .tempdir_in(shm)
        .expect("a directory on tmpfs");
    let path = dir.path().to_str().expect("utf-8");
    let out = cairn(&["check", "disk", "--data-dir", path, "--count", "300"]);
    let printed = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for expected in [
        "300 appends of 2300 bytes",
        "threshold: fdatasync p99 at most 10.0 ms",
        "fdatasync: p50 ",
        " p99 ",
        "(300 syncs in ",
        "PASS: fit for a data dir",
    ] {
        assert!(printed.contains(expected), "{expected:?} in:\n{printed}");
    }
    // The measurement's file is gone.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(
        left.is_empty(),
        "check disk leaves nothing behind: {left:?}"
    );
}

#[test]
fn check_disk_refuses_a_directory_that_is_not_one_naming_it() {
    let out = cairn(&["check", "disk", "--data-dir", "/nonexistent/cairn-data"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        stderr(&out).contains("--data-dir /nonexistent/cairn-data")
            && stderr(&out).contains("No such file or directory"),
        "{}",
        text(&out)
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    let path = file.path().to_str().unwrap();
    let out = cairn(&["check", "disk", "--data-dir", path]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        stderr(&out).contains(&format!("--data-dir {path}: not a directory")),
        "{}",
        text(&out)
    );
}

#[test]
fn check_perf_names_every_endpoint_it_cannot_reach() {
    let (a, b) = (
        format!("127.0.0.1:{}", jepsen_tests::cluster::free_port()),
        format!("127.0.0.1:{}", jepsen_tests::cluster::free_port()),
    );
    let endpoints = format!("{a},{b}");
    let out = cairn(&[
        "check",
        "perf",
        "--endpoints",
        &endpoints,
        "--duration",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(5), "unavailable: {}", text(&out));
    let e = stderr(&out);
    assert!(
        e.contains("no endpoint answered") && e.contains(&a) && e.contains(&b),
        "{}",
        text(&out)
    );
}

/// A config whose only grant is an admin token (also the nodes' own) that may also write
/// `check perf`'s resources.
fn admin_config(dir: &Path) -> (String, std::path::PathBuf) {
    let (token, hash_line) = new_token();
    let token_file = dir.join("node.token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let config = dir.join("auth.toml");
    std::fs::write(
        &config,
        format!(
            "[auth]\nnode_token_file = \"{}\"\n\n[[auth.grants]]\nname = \"admin\"\n{hash_line}\n\
             admin = true\nwrite = {{ types = [\"bench.Item\"], tenancies = [\"default/check-perf\"] }}\n",
            token_file.display()
        ),
    )
    .unwrap();
    (token, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_perf_runs_the_standard_load_with_a_token_and_exits_per_its_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let (token, config) = admin_config(dir.path());
    let mut o = options(3);
    o.extra_args = vec!["--config".into(), config.display().to_string()];
    o.admin_token = Some(token.clone());
    let cluster = Cluster::start(o);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let endpoints = cluster.endpoints().join(",");

    // Without the token the cluster refuses, and the check says so (exit 6).
    let out = cairn(&[
        "check",
        "perf",
        "--endpoints",
        &endpoints,
        "--duration",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out));

    let out = cairn(&[
        "check",
        "perf",
        "--endpoints",
        &endpoints,
        "--token",
        &token,
        "--load",
        "s",
        "--duration",
        "2",
    ]);
    let printed = stdout(&out);
    assert!(
        printed.contains(
            "thresholds: throughput at least 135 writes/s (90% of 150), p99 latency at most \
             100.0 ms, no failed writes"
        ),
        "{}",
        text(&out)
    );
    let verdicts: Vec<&str> = printed
        .lines()
        .filter(|l| l.starts_with("PASS: ") || l.starts_with("FAIL: "))
        .collect();
    assert_eq!(verdicts.len(), 3, "one line per threshold: {}", text(&out));
    assert!(verdicts[0].contains("throughput "), "{verdicts:?}");
    assert!(verdicts[1].contains("p99 latency "), "{verdicts:?}");
    assert!(verdicts[2].contains("failed writes"), "{verdicts:?}");
    let last = printed.lines().last().unwrap_or_default();
    let all_passed = verdicts.iter().all(|l| l.starts_with("PASS: "));
    assert_eq!(
        last,
        if all_passed { "PASS" } else { "FAIL" },
        "{}",
        text(&out)
    );
    assert_eq!(
        out.status.code(),
        Some(if all_passed { 0 } else { 1 }),
        "the exit code follows the verdict: {}",
        text(&out)
    );
    // It cleans up: every key it wrote (at most 2 per client) is deleted.
    let removed: u64 = printed
        .lines()
        .find_map(|l| {
            l.strip_prefix("removed the ")?
                .strip_suffix(" resources it wrote")
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a line saying what it removed: {}", text(&out)));
    assert!((1..=100).contains(&removed), "{}", text(&out));
}

/// `cairn check cache` of `demo.Thing` against `cluster`.
fn check_cache(cluster: &jepsen_tests::cluster::Cluster) -> std::process::Output {
    let endpoints = cluster.endpoints().join(",");
    cairn(&[
        "check",
        "cache",
        "--type",
        "demo.Thing",
        "--endpoints",
        &endpoints,
    ])
}

/// A cluster of three with `extra_args`, holding 30 `demo.Thing`s written
/// through its leader.
async fn cluster_with_things(extra_args: &[&str]) -> jepsen_tests::cluster::Cluster {
    let mut o = options(3);
    o.extra_args = extra_args.iter().map(|a| a.to_string()).collect();
    let cluster = jepsen_tests::cluster::Cluster::start(o);
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let address = cluster.node(leader).client_address.clone();
    for i in 0..30 {
        write(&address, thing(&format!("t{i:02}"), "u1", "", b"x"))
            .await
            .expect("write");
    }
    cluster
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_cache_passes_on_a_sound_cluster_and_names_what_a_lossy_watch_missed() {
    // On a sound cluster the primed cache equals the list at its revision:
    // PASS, exit 0. On nodes that drop every 7th change of each watch stream
    // (`--unsafe-drop-watch-events 7`: a broken watch path), the cache misses
    // resources the list holds: FAIL, exit 1, each one named.
    let sound = cluster_with_things(&[]).await;
    let out = check_cache(&sound);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stdout(&out).contains("primed in"), "{}", text(&out));
    assert!(
        stdout(&out).contains("PASS: the cache holds exactly what the cluster held at revision"),
        "{}",
        text(&out)
    );
    assert!(stdout(&out).contains("(30 resources)"), "{}", text(&out));
    drop(sound);

    let lossy = cluster_with_things(&["--unsafe-drop-watch-events", "7"]).await;
    let out = check_cache(&lossy);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stdout(&out).contains("missing from the cache: demo.Thing default/default/t"),
        "{}",
        text(&out)
    );
    assert!(
        stdout(&out).contains("FAIL: 4 differences"),
        "{}",
        text(&out)
    );
}
