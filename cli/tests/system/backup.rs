//! Scheduled backups through real processes (`cairn_server::backup`): `cairn agent`s with a
//! backup target, a directory or moto's S3 server (`cairn_test_support::moto`), and
//! `cairn backup list / verify / restore` against it.
//!
//! - a directory target: backups appear, are listed, retention holds the count, `verify`
//!   passes, and `restore --offline` seeds a new cluster that holds the data;
//! - an S3 target (moto): the same, and `restore --yes` into the running cluster;
//! - a target that refuses writes (a bucket policy) and a full one (a small tmpfs): each
//!   failure is counted by kind, logged naming the target and the reason, and the node
//!   keeps serving;
//! - a spool file damaged on the leader's disk is never published (the read-back verify);
//! - across a leader transfer and a paused leader, no two members' backups overlap in time
//!   (the abort on lost leadership, and the new leader's hold-off);
//! - bad backup settings are refused at start, naming the field.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cairn_proto::v1::Consistency;
use cairn_test_support::moto::Moto;

use crate::support::*;

const LEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes a second the throttled tests write their spool at: the least allowed, so that a
/// backup of ~350 KiB takes ~5 s.
const SLOW_WRITE_BYTES_PER_SECOND: &str = "65536";

/// `--backup-*` flags for every node of a cluster.
fn with_backups(mut o: ClusterOptions, flags: &[&str]) -> ClusterOptions {
    o.extra_args.extend(flags.iter().map(|f| f.to_string()));
    o
}

/// Writes `count` Things of `payload_bytes` each through the leader, 8 at a time.
async fn fill(cluster: &Cluster, prefix: &str, count: usize, payload_bytes: usize) {
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let address = cluster.node(leader).client_address.clone();
    let writers: Vec<_> = (0..8)
        .map(|writer| {
            let (address, prefix) = (address.clone(), prefix.to_string());
            tokio::spawn(async move {
                let payload = vec![b'x'; payload_bytes];
                for i in (writer..count).step_by(8) {
                    write(
                        &address,
                        thing(&format!("{prefix}-{i:04}"), "u1", "", &payload),
                    )
                    .await
                    .unwrap_or_else(|e| panic!("write {prefix}-{i}: {e}"));
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.expect("a writer");
    }
}

/// The value of `key=` in a log line (unquoted).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {key}="))? + key.len() + 2;
    let rest = &line[start..];
    let end = rest.find(' ').unwrap_or(rest.len());
    Some(rest[..end].trim_matches('"'))
}

/// The lines of every node's log holding `what`, with the node's id.
fn log_lines(cluster: &Cluster, what: &str) -> Vec<(u64, String)> {
    let mut lines = Vec::new();
    for id in cluster.ids() {
        for line in cluster.log_of(id).lines() {
            if line.contains(what) {
                lines.push((id, line.to_string()));
            }
        }
    }
    lines
}

/// Waits until the nodes' logs hold at least `count` lines with `what`.
async fn wait_lines(cluster: &Cluster, what: &str, count: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while log_lines(cluster, what).len() < count {
        assert!(
            Instant::now() < deadline,
            "fewer than {count} {what:?} lines after {timeout:?}; logs in {}:\n{}",
            cluster.root().display(),
            cluster
                .ids()
                .iter()
                .map(|id| cluster.log_tail(*id, 30))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `cairn backup ARGS`, which must succeed; its stdout.
fn backup_cli(args: &[&str]) -> String {
    let mut all = vec!["backup"];
    all.extend_from_slice(args);
    let out = cairn(&all);
    assert!(out.status.success(), "cairn {all:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `cairn backup list -o json` of a target: (name, index) newest first.
fn listed(target_flags: &[&str]) -> Vec<(String, u64)> {
    let mut args = vec!["list", "-o", "json"];
    args.extend_from_slice(target_flags);
    let json: serde_json::Value =
        serde_json::from_str(&backup_cli(&args)).expect("backup list -o json is JSON");
    json["backups"]
        .as_array()
        .expect("a list of backups")
        .iter()
        .map(|b| {
            (
                b["name"].as_str().expect("a name").to_string(),
                b["index"].as_u64().expect("an index"),
            )
        })
        .collect()
}

/// One GET of the ops listener.
fn scrape(cluster: &Cluster, id: u64) -> String {
    let address = cluster
        .node(id)
        .metrics_address
        .clone()
        .expect("a metrics address");
    let mut stream = std::net::TcpStream::connect(&address).expect("connect to /metrics");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// The value of `series` (name and labels, as scraped), if scraped.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok()).flatten()
    })
}

/// Waits until node `id` counts a backup failure of `kind`.
async fn wait_failure_counted(cluster: &Cluster, id: u64, kind: &str, timeout: Duration) -> f64 {
    let series = format!("cairn_backup_failures_total{{kind=\"{kind}\"}}");
    let deadline = Instant::now() + timeout;
    loop {
        let count = sample(&scrape(cluster, id), &series).unwrap_or(0.0);
        if count >= 1.0 {
            return count;
        }
        assert!(
            Instant::now() < deadline,
            "{series} stayed 0; log:\n{}",
            cluster.log_tail(id, 40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_backups_to_a_directory_are_listed_pruned_verified_and_seed_a_new_cluster() {
    // A 3-node cluster backs up every second into a directory, keeping 2. The backups
    // appear, `backup list` shows the 2 kept of the more taken, `backup verify` passes, and
    // once the cluster is gone `backup restore --offline` seeds a new one that holds every
    // write the newest backup covers.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().display().to_string();
    let mut o = with_backups(
        options(3),
        &[
            "--backup-target",
            &target,
            "--backup-interval-ms",
            "1000",
            "--backup-retain-count",
            "2",
        ],
    );
    o.metrics = true;
    let mut old = Cluster::start(o);
    fill(&old, "a", 40, 256).await;

    wait_lines(&old, "backup published", 3, Duration::from_secs(20)).await;
    let flags = ["--target", target.as_str()];
    // Retention: at most 2, once the prune that follows a publish is done.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let kept = listed(&flags);
        if kept.len() == 2 {
            break;
        }
        assert!(
            kept.len() <= 3 && Instant::now() < deadline,
            "retention keeps 2: {kept:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let table = backup_cli(&["list", "--target", &target]);
    assert!(
        table.contains("CREATED (UTC)") && table.contains("cairn-"),
        "{table}"
    );
    let published = log_lines(&old, "backup published");
    for (id, line) in &published {
        for key in ["backup", "index", "size_bytes", "duration_ms"] {
            assert!(field(line, key).is_some(), "node {id}: no {key} in {line}");
        }
    }
    let leader = old.wait_for_leader(LEADER_TIMEOUT).await;
    let metrics = scrape(&old, leader);
    let last = sample(&metrics, "cairn_backup_last_success_timestamp_seconds").unwrap_or(0.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (now - 30.0..=now + 1.0).contains(&last),
        "last success {last}, now {now}"
    );
    assert!(sample(&metrics, "cairn_backup_last_size_bytes").unwrap_or(0.0) > 0.0);
    assert_eq!(
        sample(&metrics, "cairn_backup_interval_seconds"),
        Some(1.0),
        "{metrics}"
    );

    let verified = backup_cli(&["verify", "--target", &target]);
    assert!(
        verified.contains(": OK,") && verified.contains("cluster id"),
        "{verified}"
    );

    // A write after those backups, then a backup that covers it.
    let address = old.node(leader).client_address.clone();
    let marker = write(&address, thing("marker", "u1", "", b"covered"))
        .await
        .unwrap();
    let marker_index: u64 = marker.version.parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !listed(&flags)
        .iter()
        .any(|(_, index)| *index >= marker_index)
    {
        assert!(
            Instant::now() < deadline,
            "no backup covers index {marker_index}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The cluster is lost: its backups stop, and the newest is the one to restore.
    for id in old.ids() {
        old.kill(id);
    }
    let newest = listed(&flags)[0].clone();
    assert!(newest.1 >= marker_index, "{newest:?}");

    let mut o = options(3);
    o.started_later = vec![1, 2, 3];
    let mut new = Cluster::start(o);
    let members = new.bootstrap_members().to_string();
    for id in new.ids() {
        let data_dir = new.node(id).data_dir.display().to_string();
        let seeded = backup_cli(&[
            "restore",
            "--offline",
            "--target",
            &target,
            "--data-dir",
            &data_dir,
            "--members",
            &members,
        ]);
        assert!(seeded.contains("seeded"), "{seeded}");
    }
    for id in new.ids() {
        new.spawn(id);
    }
    let leader = new.wait_for_leader(LEADER_TIMEOUT).await;
    let restored = list(&new.node(leader).client_address, Consistency::Strong)
        .await
        .unwrap();
    assert_eq!(restored.len(), 41, "40 Things and the marker");
    assert!(restored
        .iter()
        .any(|r| r.id.as_ref().unwrap().name == "marker"));
}

/// A credentials file for moto (any key works until authentication is switched on).
fn moto_credentials(dir: &Path) -> PathBuf {
    let path = dir.join("credentials");
    std::fs::write(
        &path,
        "[default]\naws_access_key_id = test-key\naws_secret_access_key = test-secret\n",
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_backups_to_s3_are_listed_verified_and_restore_the_running_cluster() {
    // A 3-node cluster backs up every second to moto's S3 (credentials from a file),
    // keeping 3. `backup list` and `backup verify NAME` read the bucket; `backup restore
    // NAME --yes` puts the cluster back to that backup: a write made after it is gone.
    let Some(moto) =
        Moto::start("scheduled_backups_to_s3_are_listed_verified_and_restore_the_running_cluster")
    else {
        return;
    };
    moto.create_bucket("cairn-backups");
    let dir = tempfile::tempdir().unwrap();
    let credentials = moto_credentials(dir.path()).display().to_string();
    let endpoint = moto.endpoint();
    let s3 = [
        "--backup-target",
        "s3://cairn-backups/prod",
        "--backup-s3-endpoint",
        &endpoint,
        "--backup-s3-region",
        "us-east-1",
        "--backup-s3-allow-http",
        "--backup-s3-credentials-file",
        &credentials,
    ];
    let mut flags = s3.to_vec();
    flags.extend(["--backup-interval-ms", "1000", "--backup-retain-count", "3"]);
    let cluster = Cluster::start(with_backups(options(3), &flags));
    fill(&cluster, "s", 30, 256).await;
    wait_lines(&cluster, "backup published", 4, Duration::from_secs(25)).await;

    let target = [
        "--target",
        "s3://cairn-backups/prod",
        "--s3-endpoint",
        &endpoint,
        "--s3-region",
        "us-east-1",
        "--s3-allow-http",
        "--s3-credentials-file",
        &credentials,
    ];
    let deadline = Instant::now() + Duration::from_secs(5);
    let kept = loop {
        let kept = listed(&target);
        if kept.len() == 3 {
            break kept;
        }
        assert!(
            kept.len() <= 4 && Instant::now() < deadline,
            "retention keeps 3: {kept:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (name, index) = kept[0].clone();
    let mut args = vec!["verify"];
    args.extend_from_slice(&target);
    args.push(&name);
    let verified = backup_cli(&args);
    assert!(
        verified.contains(&format!("{name}: OK,"))
            && verified.contains(&format!("index        {index}")),
        "{verified}"
    );

    // A write after that backup; the restore of it takes the cluster back.
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let address = cluster.node(leader).client_address.clone();
    let later = write(&address, thing("later", "u1", "", b"after the backup"))
        .await
        .unwrap();
    assert!(later.version.parse::<u64>().unwrap() > index);
    let mut args = vec!["restore", "--yes"];
    args.extend_from_slice(&target);
    args.extend(["--endpoints", &address, &name]);
    let restored = backup_cli(&args);
    assert!(restored.contains("restored"), "{restored}");
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let now = list(&cluster.node(leader).client_address, Consistency::Strong)
        .await
        .unwrap();
    assert_eq!(
        now.len(),
        30,
        "the 30 Things of the backup, without `later`"
    );
    assert!(now.iter().all(|r| r.id.as_ref().unwrap().name != "later"));

    // The flags are checked before anything is fetched: no --yes off a terminal.
    let mut args = vec!["backup", "restore"];
    args.extend_from_slice(&target);
    let refused = cairn(&args);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(text(&refused).contains("--yes"), "{}", text(&refused));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_refuses_writes_or_is_full_is_counted_and_the_node_keeps_serving() {
    // Two single-node clusters: one backs up to a bucket whose policy denies uploads
    // (credentials from the AWS environment), one to a 1 MiB tmpfs that a backup does not
    // fit in. Each failure is counted under its kind, the log names the target and the
    // reason, and the node goes on serving writes and reads.
    let test = "a_target_that_refuses_writes_or_is_full_is_counted_and_the_node_keeps_serving";
    let Some(moto) = Moto::start(test) else {
        return;
    };
    moto.create_bucket("locked-bucket");
    moto.deny_puts("locked-bucket");
    let endpoint = moto.endpoint();
    let mut o = with_backups(
        options(1),
        &[
            "--backup-target",
            "s3://locked-bucket/cairn",
            "--backup-s3-endpoint",
            &endpoint,
            "--backup-s3-allow-http",
            "--backup-interval-ms",
            "1000",
        ],
    );
    o.metrics = true;
    o.env = vec![
        ("AWS_ACCESS_KEY_ID".into(), "test-key".into()),
        ("AWS_SECRET_ACCESS_KEY".into(), "test-secret".into()),
        ("AWS_REGION".into(), "us-east-1".into()),
    ];
    let refused = Cluster::start(o);

    let full_dir = tempfile::tempdir().unwrap();
    let full = if skip_unless_root(test, "mount -t tmpfs") {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "{test}: CI=true runs as root; the full target is not tested"
        );
        None
    } else {
        let mount = Tmpfs::mount(&full_dir.path().join("full"), 1);
        let mut o = with_backups(
            options(1),
            &[
                "--backup-target",
                mount.path.to_str().unwrap(),
                "--backup-interval-ms",
                "1000",
            ],
        );
        o.metrics = true;
        Some((Cluster::start(o), mount))
    };

    fill(&refused, "r", 5, 256).await;
    if let Some((cluster, _)) = &full {
        // 2 MiB of data: a backup of it does not fit in 1 MiB.
        fill(cluster, "f", 64, 32 * 1024).await;
    }
    let mut checks = vec![(&refused, "refused", "s3://locked-bucket/cairn".to_string())];
    if let Some((cluster, mount)) = &full {
        checks.push((cluster, "full", mount.path.display().to_string()));
    }
    for (cluster, kind, target) in checks {
        wait_failure_counted(cluster, 1, kind, Duration::from_secs(20)).await;
        let failed = log_lines(cluster, "backup failed");
        let line = failed
            .iter()
            .map(|(_, l)| l)
            .find(|l| field(l, "kind") == Some(kind))
            .unwrap_or_else(|| panic!("no {kind} failure logged: {failed:?}"));
        assert!(line.contains("ERROR"), "{line}");
        assert!(line.contains(&target), "the target is named: {line}");
        assert!(line.contains(kind), "the reason is named: {line}");
        // The node keeps serving: a write and a strong read.
        let address = cluster.node(1).client_address.clone();
        write(&address, thing("after-failure", "u1", "", b"still serving"))
            .await
            .expect("the node takes writes");
        read(&address, "after-failure", Consistency::Strong)
            .await
            .expect("the node serves reads");
        assert!(
            log_lines(cluster, "backup published").is_empty(),
            "nothing was published to a {kind} target"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_file_damaged_on_the_leaders_disk_is_never_published() {
    // The leader writes its spool slowly; the test flips a byte of it on disk (a bad disk).
    // The copy read back from the target fails its verification, so that backup is not
    // published (failure kind `verify`); the next one, undamaged, is.
    let target = tempfile::tempdir().unwrap();
    let target_text = target.path().display().to_string();
    let mut o = with_backups(
        options(1),
        &[
            "--backup-target",
            &target_text,
            "--backup-interval-ms",
            "1000",
            "--backup-write-bytes-per-second-max",
            SLOW_WRITE_BYTES_PER_SECOND,
        ],
    );
    o.metrics = true;
    let cluster = Cluster::start(o);
    fill(&cluster, "d", 300, 1024).await;

    let spool = cluster.node(1).data_dir.join("backup-spool");
    let deadline = Instant::now() + Duration::from_secs(20);
    let damaged = loop {
        let growing = std::fs::read_dir(&spool).ok().and_then(|entries| {
            entries.filter_map(Result::ok).map(|e| e.path()).find(|p| {
                p.extension().is_some_and(|x| x == "snap")
                    && std::fs::metadata(p).is_ok_and(|m| m.len() > 200 * 1024)
            })
        });
        if let Some(path) = growing {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            file.seek(SeekFrom::Start(100 * 1024)).unwrap();
            let mut byte = [0u8; 1];
            file.read_exact(&mut byte).unwrap();
            file.seek(SeekFrom::Start(100 * 1024)).unwrap();
            file.write_all(&[byte[0] ^ 0xff]).unwrap();
            break path.file_name().unwrap().to_string_lossy().into_owned();
        }
        assert!(Instant::now() < deadline, "no spool file grew past 200 KiB");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Its attempt ends: not published, but failed verification.
    let deadline = Instant::now() + Duration::from_secs(20);
    let ended = loop {
        let ended: Vec<String> = cluster
            .log_of(1)
            .lines()
            .filter(|l| field(l, "backup") == Some(damaged.as_str()))
            .filter(|l| field(l, "ended_unix_ms").is_some())
            .map(str::to_string)
            .collect();
        if let Some(line) = ended.first() {
            break line.clone();
        }
        assert!(
            Instant::now() < deadline,
            "the attempt of {damaged} never ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        !ended.contains("backup published"),
        "the damaged backup was published: {ended}"
    );
    assert!(
        ended.contains("backup failed") && field(&ended, "kind") == Some("verify"),
        "{ended}"
    );
    wait_failure_counted(&cluster, 1, "verify", Duration::from_secs(5)).await;
    let published_before = log_lines(&cluster, "backup published").len();
    // The next backup, undamaged, is published.
    wait_lines(
        &cluster,
        "backup published",
        published_before + 1,
        Duration::from_secs(30),
    )
    .await;
    let kept = listed(&["--target", &target_text]);
    assert!(!kept.is_empty());
    assert!(
        kept.iter().all(|(name, _)| *name != damaged),
        "the damaged backup was published: {kept:?}"
    );
    backup_cli(&["verify", "--target", &target_text]);
}

/// One attempt's time on one node: (node, start, end) in Unix ms, from its log.
fn windows(cluster: &Cluster) -> Vec<(u64, u64, u64)> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut windows = Vec::new();
    for id in cluster.ids() {
        let log = cluster.log_of(id);
        let mut open: Vec<(String, u64)> = Vec::new();
        for line in log.lines() {
            let start = field(line, "started_unix_ms").and_then(|v| v.parse::<u64>().ok());
            let end = field(line, "ended_unix_ms").and_then(|v| v.parse::<u64>().ok());
            let name = field(line, "backup").unwrap_or("-").to_string();
            if line.contains("backup started") {
                open.push((name, start.expect("a start")));
            } else if let (Some(start), Some(end)) = (start, end) {
                open.retain(|(n, s)| !(*n == name && *s == start));
                windows.push((id, start, end));
            }
        }
        // Still running when the logs were read.
        windows.extend(open.into_iter().map(|(_, start)| (id, start, now)));
    }
    windows
}

/// Panics if two nodes' backup windows overlap.
fn assert_no_overlap(cluster: &Cluster) {
    let windows = windows(cluster);
    for (i, a) in windows.iter().enumerate() {
        for b in &windows[i + 1..] {
            if a.0 != b.0 {
                assert!(
                    a.2 < b.1 || b.2 < a.1,
                    "node {} backed up during [{}, {}] and node {} during [{}, {}]: they overlap; \
                     logs in {}",
                    a.0,
                    a.1,
                    a.2,
                    b.0,
                    b.1,
                    b.2,
                    cluster.root().display()
                );
            }
        }
    }
}

/// Waits until node `id` is in the middle of a backup of at least `resources` resources
/// (its log says it started, and says nothing of its end yet).
async fn wait_mid_backup(cluster: &Cluster, id: u64, resources: u64, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let log = cluster.log_of(id);
        let started: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("backup started"))
            .filter(|l| {
                field(l, "resources").and_then(|r| r.parse::<u64>().ok()) >= Some(resources)
            })
            .filter_map(|l| field(l, "backup"))
            .collect();
        let ended = |name: &str| {
            log.lines().any(|l| {
                field(l, "backup") == Some(name)
                    && (l.contains("backup published")
                        || l.contains("backup aborted")
                        || l.contains("backup failed"))
            })
        };
        if started.iter().any(|name| !ended(name)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {id} started no backup of {resources} resources; log:\n{}",
            cluster.log_tail(id, 30)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backups_never_run_on_two_members_at_once_across_leader_changes() {
    // Backups take ~5 s (a throttled spool). 1. The leader is mid-backup when leadership is
    // handed to another node: it aborts at once (its log says so), and the new leader
    // starts only after its hold-off. 2. The new leader is paused mid-backup (SIGSTOP) until
    // another is elected, then resumed: it cannot have noticed, but the newest leader waits
    // out its hold-off, by which time the resumed one has stepped down and aborted. In the
    // nodes' logs, no two members' backup windows overlap.
    let target = tempfile::tempdir().unwrap();
    let target_text = target.path().display().to_string();
    let mut cluster = Cluster::start(with_backups(
        options(3),
        &[
            "--backup-target",
            &target_text,
            "--backup-interval-ms",
            "1000",
            "--backup-write-bytes-per-second-max",
            SLOW_WRITE_BYTES_PER_SECOND,
        ],
    ));
    fill(&cluster, "o", 300, 1024).await;

    // 1. A transfer mid-backup.
    let first = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    wait_mid_backup(&cluster, first, 300, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let to = cluster.ids_except(first)[0];
    cluster
        .transfer_leader(to, Duration::from_secs(20))
        .await
        .expect("leadership handed over");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cluster.log_of(first).contains("backup aborted") {
        assert!(
            Instant::now() < deadline,
            "node {first} did not abort; log:\n{}",
            cluster.log_tail(first, 30)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // 2. The new leader paused mid-backup, resumed as soon as another leads.
    let second = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    wait_mid_backup(&cluster, second, 300, Duration::from_secs(15)).await;
    cluster.pause(second);
    let others = cluster.ids_except(second);
    let third = cluster.wait_for_leader_among(&others, LEADER_TIMEOUT).await;
    cluster.resume(second);
    let deadline = Instant::now() + Duration::from_secs(15);
    while cluster.log_of(second).matches("backup aborted").count() == 0 {
        assert!(
            Instant::now() < deadline,
            "node {second} did not abort once resumed; log:\n{}",
            cluster.log_tail(second, 30)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_mid_backup(&cluster, third, 300, Duration::from_secs(15)).await;
    for id in cluster.ids() {
        for line in cluster.log_of(id).lines() {
            if line.contains("cairn_server::backup") {
                println!("node {id}: {line}");
            }
        }
    }
    println!("backup windows (node, start, end): {:?}", windows(&cluster));
    assert_no_overlap(&cluster);
}

#[test]
fn bad_backup_settings_are_refused_at_start_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let data_dir = data_dir.to_str().unwrap();
    let common = [
        "--node-id",
        "1",
        "--data-dir",
        data_dir,
        "--members",
        "1=127.0.0.1:1/127.0.0.1:2",
    ];
    for (flags, field) in [
        (&["--backup-target", "relative/dir"][..], "backup_target"),
        (
            &[
                "--backup-target",
                "s3://b",
                "--backup-s3-credentials-file",
                "/nonexistent",
            ][..],
            "backup_s3_credentials_file",
        ),
        (
            &[
                "--backup-target",
                "s3://b",
                "--backup-s3-endpoint",
                "http://127.0.0.1:9",
            ][..],
            "backup_s3_endpoint",
        ),
        (&["--backup-interval-ms", "5"][..], "backup_interval_ms"),
    ] {
        let mut args = common.to_vec();
        args.extend_from_slice(flags);
        let (status, log) = run_agent(
            &args,
            &dir.path().join("agent.log"),
            Duration::from_secs(10),
        );
        assert_eq!(status.and_then(|s| s.code()), Some(2), "{flags:?}: {log}");
        assert!(log.contains(&format!("`{field}`")), "{flags:?}: {log}");
    }
}
