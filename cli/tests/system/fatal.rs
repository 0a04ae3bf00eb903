//! A node that cannot do its job says so and exits, with real processes and real faults:
//! - a follower's data dir on a tmpfs that fills up: health goes NOT_SERVING, the process
//!   exits within the shutdown deadline with the "disk full" code and one line saying what
//!   to do, its memory stays bounded meanwhile, the others keep writing, and once space is
//!   freed a restart catches up;
//! - a follower started with 256 file descriptors and flooded with 1,000 connections: the
//!   connections over its limit are refused, its Raft log is never touched, and it keeps
//!   serving Raft and the client connected before the flood;
//! - SIGTERM of a leader whose peers are stopped, and of a node whose disk hangs (a frozen
//!   FUSE filesystem): the shutdown ends within `shutdown_timeout_ms`.

use crate::support;

use std::time::{Duration, Instant};

use cairn_proto::v1::Consistency;
use support::*;
use tokio::net::TcpStream;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// `--shutdown-timeout-ms` of the clusters here.
const SHUTDOWN_TIMEOUT_MS: u64 = 3_000;
/// What a process may add to the deadline before the test calls it late (scheduling on a
/// loaded 2-core machine, process exit).
const EXIT_SLACK: Duration = Duration::from_millis(2_000);

/// A `Health.Watch` stream of the whole server ("") on `address`.
async fn health_watch(address: &str) -> tonic::Streaming<tonic_health::pb::HealthCheckResponse> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .expect("connect for health");
    HealthClient::new(channel)
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("Health.Watch")
        .into_inner()
}

/// Reads the health stream until `wanted` arrives (true) or the stream ends (false).
async fn health_reaches(
    stream: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>,
    wanted: ServingStatus,
    timeout: Duration,
) -> bool {
    let wait = async {
        while let Ok(Some(answer)) = stream.message().await {
            if answer.status == wanted as i32 {
                return true;
            }
        }
        false
    };
    tokio::time::timeout(timeout, wait).await.unwrap_or(false)
}

/// Fills the filesystem holding `dir` with a file, until it is full; returns the file.
fn fill_disk(dir: &std::path::Path) -> std::path::PathBuf {
    use std::io::Write as _;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).expect("create filler");
    let chunk = vec![0xa5u8; 64 * 1024];
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    let _ = file.sync_all();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_disk_fills_up_stops_and_catches_up_once_space_is_freed() {
    // Node 3's data dir is a 100 MiB tmpfs (the WAL preallocates a 64 MiB segment). Once the
    // cluster runs, a filler file takes every free byte; then the cluster takes writes, and
    // node 3 (snapshotting every MiB of log) needs space it does not have.
    if skip_unless_root(
        "a_follower_whose_disk_fills_up_stops_and_catches_up_once_space_is_freed",
        "mount -t tmpfs",
    ) {
        return;
    }
    let scratch = jepsen_tests::cluster::ScratchDir::new().expect("scratch dir");
    let disk = Tmpfs::mount(&scratch.path().join("node-3"), 100);
    let mut o = options(3);
    o.root = Some(scratch.path().to_path_buf());
    o.extra_args = vec![
        "--snapshot-log-bytes".into(),
        "1048576".into(),
        "--shutdown-timeout-ms".into(),
        SHUTDOWN_TIMEOUT_MS.to_string(),
    ];
    let mut cluster = Cluster::start(o);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    if cluster.leader().await == Some(3) {
        cluster
            .transfer_leader(1, Duration::from_secs(10))
            .await
            .expect("move leadership off node 3");
        cluster
            .wait_for_leader_among(&[1, 2], Duration::from_secs(10))
            .await;
    }
    let mut names = Vec::new();
    for i in 0..3 {
        let name = format!("before-{i}");
        assert!(
            create_anywhere(&cluster, &name, b"x", Duration::from_secs(10))
                .await
                .expect("write before the disk fills")
        );
        names.push(name);
    }
    names.sort();
    wait_converged(&cluster, &[1, 2, 3], &names, Duration::from_secs(20)).await;
    let node3 = cluster.node(3).client_address.clone();
    let pid = cluster.node(3).pid().expect("node 3 runs");
    let mut health = health_watch(&node3).await;
    assert!(
        health_reaches(&mut health, ServingStatus::Serving, Duration::from_secs(10)).await,
        "node 3 serves before its disk fills"
    );

    let filler = fill_disk(&disk.path);
    // Sample node 3's memory while it fails, until it is gone.
    let sampler = std::thread::spawn(move || {
        let mut rss_max = 0;
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            rss_max = rss_max.max(rss_bytes(pid));
            std::thread::sleep(Duration::from_millis(20));
        }
        rss_max
    });
    let payload = vec![b'p'; 100 * 1024];
    let writes = async {
        for i in 0..40 {
            let name = format!("full-{i:02}");
            match create_anywhere(&cluster, &name, &payload, Duration::from_secs(20)).await {
                Ok(true) => names.push(name),
                other => panic!("write {name} while node 3's disk is full: {other:?}"),
            }
        }
    };
    let (not_serving, ()) = tokio::join!(
        health_reaches(
            &mut health,
            ServingStatus::NotServing,
            Duration::from_secs(60)
        ),
        writes
    );
    let noticed = Instant::now();
    assert!(
        not_serving,
        "node 3 said NOT_SERVING before it went away; log:\n{}",
        cluster.log_of(3)
    );
    let status = cluster
        .wait_exit(3, Duration::from_millis(SHUTDOWN_TIMEOUT_MS) + EXIT_SLACK)
        .unwrap_or_else(|| {
            panic!(
                "node 3 still runs {:?} after it stopped serving; log:\n{}",
                noticed.elapsed(),
                cluster.log_of(3)
            )
        });
    assert_eq!(
        status.code(),
        Some(10),
        "exit code of a full disk: {status:?}"
    );
    let rss_max = sampler.join().expect("sampler");
    assert!(
        rss_max < 512 * 1024 * 1024,
        "node 3 held {rss_max} bytes while failing"
    );
    let log = cluster.log_of(3);
    let lines = fatal_lines(&log);
    assert_eq!(lines.len(), 1, "one fatal line: {lines:#?}");
    let line = lines[0];
    println!(
        "node 3 exited {status:?}, {:?} after NOT_SERVING: {line}",
        noticed.elapsed()
    );
    for needle in ["FATAL disk full", "node-3", "free space", "exit code 10"] {
        assert!(line.contains(needle), "{needle:?} missing from: {line}");
    }
    assert!(
        !disk.path.join("CORRUPT").exists(),
        "a full disk does not mark the data dir"
    );

    // The other two keep writing.
    for i in 0..5 {
        let name = format!("after-{i}");
        assert!(
            create_anywhere(&cluster, &name, b"y", Duration::from_secs(20))
                .await
                .expect("the cluster keeps writing without node 3")
        );
        names.push(name);
    }
    names.sort();

    // Space freed: a restart catches up.
    std::fs::remove_file(&filler).expect("free the space");
    cluster.spawn(3);
    wait_converged(&cluster, &[1, 2, 3], &names, Duration::from_secs(60)).await;
    let got = read(&node3, "after-4", Consistency::Eventual).await;
    assert!(got.is_ok(), "node 3 caught up: {got:?}");
    drop(cluster);
    drop(disk);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_with_256_descriptors_refuses_a_flood_and_keeps_serving_raft() {
    // Node 3 restarts with RLIMIT_NOFILE 256 (soft and hard: it cannot raise it) and fits its
    // connection limits under it. 1,000 connections to its client port, held open: those over
    // the limit are closed at once; while they are held, writes through the client connected
    // before the flood make node 3 build snapshots (new files); its storage never sees EMFILE
    // (no fatal line, no poisoned store), and the writes keep replicating to node 3 and being
    // applied there. (`connections.rs` covers floods under the default limit on one node;
    // this is the lowered limit, on a follower of a cluster.)
    let own_limit = raise_own_fd_limit();
    assert!(
        own_limit >= 2_048,
        "this test needs 2048 descriptors, has {own_limit}"
    );
    let mut o = options(3);
    o.extra_args = vec![
        // Long enough that a connection the node accepted holds its descriptor through the
        // writes below.
        "--handshake-timeout-ms".into(),
        "20000".into(),
        "--snapshot-log-bytes".into(),
        "1048576".into(),
    ];
    let mut cluster = Cluster::start(o);
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    if leader == 3 {
        cluster
            .transfer_leader(1, Duration::from_secs(10))
            .await
            .expect("move leadership off node 3");
    }
    let index = cluster.nodes.iter().position(|n| n.id == 3).unwrap();
    cluster.nodes[index].nofile_limit = Some(256);
    cluster.restart(3);
    let pid = cluster.node(3).pid().expect("running");
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap_or_default();
    assert!(
        limits
            .lines()
            .any(|l| l.starts_with("Max open files") && l.split_whitespace().any(|w| w == "256")),
        "node 3 runs with 256 descriptors: {limits}"
    );
    let node3 = cluster.node(3).client_address.clone();
    assert!(
        create_anywhere(&cluster, "before", b"x", Duration::from_secs(20))
            .await
            .expect("write before")
    );
    // The client connected before the flood: one channel, kept.
    let mut steady = client(&node3).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = steady
            .read(cairn_proto::v1::ReadRequest {
                id: Some(id("before", "")),
                consistency: Consistency::Eventual as i32,
                revision: 0,
            })
            .await;
        if answer.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 3 never served `before`: {answer:?}; log:\n{}",
            cluster.log_of(3)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let mut open = Vec::new();
    let mut refused = 0;
    for i in 0..1_000 {
        match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(&node3)).await {
            Ok(Ok(stream)) => open.push(stream),
            Ok(Err(_)) => refused += 1,
            Err(_) => panic!("connection {i} timed out: node 3 stopped accepting"),
        }
    }
    // Writes during the flood, through the steady client (node 3 forwards them to the
    // leader): 2 MiB, so every node builds snapshots; node 3 applies them.
    let snapshots_before = cluster.log_of(3).matches("snapshot built").count();
    let payload = vec![b'y'; 100 * 1024];
    for i in 0..20 {
        let write = steady
            .write(cairn_proto::v1::WriteRequest {
                fence: None,
                resource: Some(thing(&format!("during-{i}"), "u1", "", &payload)),
            })
            .await;
        assert!(write.is_ok(), "the steady client is served: {write:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = steady
            .read(cairn_proto::v1::ReadRequest {
                id: Some(id("during-19", "")),
                consistency: Consistency::Eventual as i32,
                revision: 0,
            })
            .await;
        if answer.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 3 never applied `during-19` (Raft stopped reaching it?): {answer:?}; log:\n{}",
            cluster.log_of(3)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while cluster.log_of(3).matches("snapshot built").count() == snapshots_before {
        assert!(
            Instant::now() < deadline,
            "node 3 built no snapshot during the flood; log:\n{}",
            cluster.log_of(3)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fds = open_fds(pid);
    assert!(
        fds <= 256,
        "node 3 holds {fds} descriptors under a limit of 256"
    );
    // Connections over the limit were closed by the node (or never accepted).
    let mut closed = refused;
    let mut buf = [0u8; 16];
    for s in &open {
        let gone = tokio::time::timeout(Duration::from_secs(3), s.readable())
            .await
            .is_ok()
            && !matches!(s.try_read(&mut buf), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock);
        if gone {
            closed += 1;
        }
    }
    println!("{refused} refused at connect, {closed} refused or closed of 1000; node 3 holds {fds} descriptors");
    assert!(
        closed >= 700,
        "only {closed} of 1000 connections were refused or closed by a node that has 256 descriptors"
    );
    drop(open);
    assert!(cluster.is_running(3), "node 3 still runs");
    let log = cluster.log_of(3);
    if let Some(line) = log
        .lines()
        .find(|l| l.contains("connection limits lowered"))
    {
        println!("{line}");
    }
    assert!(
        fatal_lines(&log).is_empty(),
        "no fatal condition: {:#?}",
        fatal_lines(&log)
    );
    assert!(
        !log.contains("poisoned"),
        "the Raft log was never touched by EMFILE:\n{log}"
    );
    assert!(
        log.contains("already holds"),
        "the refusals are logged:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_of_a_leader_whose_peers_are_stopped_ends_within_the_deadline() {
    // The leader's peers are SIGSTOPped: its leadership hand-off can never finish and its
    // replication calls hang. SIGTERM must still end the process within
    // shutdown_timeout_ms.
    let mut o = options(3);
    o.extra_args = vec![
        "--shutdown-timeout-ms".into(),
        SHUTDOWN_TIMEOUT_MS.to_string(),
    ];
    let mut cluster = Cluster::start(o);
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    assert!(
        create_anywhere(&cluster, "x", b"x", Duration::from_secs(10))
            .await
            .expect("write")
    );
    for id in cluster.ids_except(leader).into_iter() {
        cluster.pause(id);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = Instant::now();
    cluster.terminate(leader);
    let status = cluster.wait_exit(
        leader,
        Duration::from_millis(SHUTDOWN_TIMEOUT_MS) + EXIT_SLACK,
    );
    let took = sent.elapsed();
    let status = status.unwrap_or_else(|| {
        panic!(
            "the leader still runs {took:?} after SIGTERM; log:\n{}",
            cluster.log_of(leader)
        )
    });
    println!("leader {leader} exited {status:?} after {took:?}");
    assert!(
        matches!(status.code(), Some(0) | Some(14)),
        "a clean stop (0) or the deadline's code (14): {status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_of_a_node_whose_disk_hangs_gives_up_at_the_deadline() {
    // The node's data dir is a power-cut FUSE filesystem served by this test; freezing it
    // makes every disk operation hang. A write is left hanging in the WAL, then SIGTERM: the
    // node cannot stop Raft cleanly, so at shutdown_timeout_ms its watchdog logs what did
    // not stop and exits with code 14. (A thread inside a FUSE request the filesystem has
    // already taken cannot be killed until it is answered — the kernel's rule for every
    // hung disk — so the process is reaped only once the test thaws the filesystem; the
    // watchdog's line is what the deadline is measured on.)
    if let Some(reason) = cairn_powercut_fs_unavailable() {
        eprintln!("SKIPPED sigterm_of_a_node_whose_disk_hangs_gives_up_at_the_deadline: {reason}");
        return;
    }
    let mut o = options(1);
    o.powercut = true;
    o.extra_args = vec![
        "--shutdown-timeout-ms".into(),
        SHUTDOWN_TIMEOUT_MS.to_string(),
    ];
    let mut cluster = Cluster::start(o);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    assert!(
        create_anywhere(&cluster, "x", b"x", Duration::from_secs(10))
            .await
            .expect("write")
    );
    let address = cluster.node(1).client_address.clone();
    let frozen = cluster.freeze_disk(1);
    let hanging = tokio::spawn(async move { write(&address, thing("y", "u1", "", b"y")).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!hanging.is_finished(), "the write hangs on the frozen disk");
    let sent = Instant::now();
    cluster.terminate(1);
    let deadline = sent + Duration::from_millis(SHUTDOWN_TIMEOUT_MS) + EXIT_SLACK;
    let mut gave_up = None;
    while Instant::now() < deadline {
        if cluster.log_of(1).contains("shutdown did not finish") {
            gave_up = Some(sent.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(frozen);
    let status = cluster.wait_exit(1, Duration::from_secs(10));
    let log = cluster.log_of(1);
    let gave_up = gave_up.unwrap_or_else(|| panic!("no watchdog line in time; log:\n{log}"));
    println!("gave up after {gave_up:?}; exit {status:?}");
    let line = log
        .lines()
        .find(|l| l.contains("shutdown did not finish"))
        .expect("the line");
    assert!(
        line.contains("did not stop"),
        "names what did not stop: {line}"
    );
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(14),
        "the deadline's exit code; log:\n{log}"
    );
    hanging.abort();
}

/// Why the power-cut filesystem cannot be mounted here, if it cannot.
fn cairn_powercut_fs_unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !std::path::Path::new("/dev/fuse").exists() {
        return Some("it needs /dev/fuse".into());
    }
    if !root {
        return Some("it needs root (mounting FUSE); CI runs it as root".into());
    }
    None
}
