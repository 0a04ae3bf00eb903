//! Configuration as deployments meet it, on real processes: unrelated `CAIRN_*` variables
//! (Kubernetes service links) and host names in addresses; settings refused with their
//! name; `cairn agent --print-config`.

use crate::support;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use cairn_proto::v1::Consistency;
use support::*;

/// What Kubernetes injects for a Service named `cairn`, and a stray variable; plus the
/// client's own CAIRN_ENDPOINTS, which the node neither reads nor warns about.
fn unrelated_environment() -> Vec<(String, String)> {
    [
        ("CAIRN_PORT", "tcp://10.0.0.1:7001"),
        ("CAIRN_SERVICE_HOST", "10.0.0.1"),
        ("CAIRN_FOO", "1"),
        ("CAIRN_ENDPOINTS", "10.0.0.1:7001"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

const WARNING: &str = "ignoring environment variables that name no setting";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_host_names_and_unrelated_cairn_variables_starts_and_serves() {
    // Three `cairn agent` processes whose addresses (their own, and every member's) are
    // `localhost:PORT`, each with CAIRN_PORT, CAIRN_SERVICE_HOST and CAIRN_FOO set. Before
    // only setting names were read, each exited with code 2 ("unknown field: found `port`").
    let mut options = options(3);
    options.host = "localhost".into();
    options.env = unrelated_environment();
    let mut cluster = Cluster::start(options);
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    for id in cluster.ids() {
        assert!(
            cluster.node(id).client_address.starts_with("localhost:"),
            "{}",
            cluster.node(id).client_address
        );
    }

    // Writes through every node (followers forward to the leader's peer address, a host
    // name), and every node applies them.
    let mut names = Vec::new();
    for id in cluster.ids() {
        let name = format!("via-{id}");
        let address = cluster.node(id).client_address.clone();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match write(&address, thing(&name, "", "", b"x")).await {
                Ok(_) => break,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("write through node {id}: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("write through node {id}: {e}"),
            }
        }
        names.push(name);
    }
    names.sort();
    wait_converged(&cluster, &cluster.ids(), &names, Duration::from_secs(20)).await;
    let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let strong = read(
        &cluster.node(follower).client_address,
        "via-1",
        Consistency::Strong,
    )
    .await
    .expect("a strong read through a follower");
    assert_eq!(strong.id.unwrap().name, "via-1");

    // The command-line client reaches the nodes by host name too.
    let endpoints = cluster.endpoints().join(",");
    let out = cairn(&[
        "read",
        "--endpoints",
        &endpoints,
        "--type",
        "demo.v1.Thing",
        "--name",
        "via-2",
    ]);
    assert!(out.status.success(), "cairn read: {}", text(&out));

    // The leader goes; the others elect a new one, dialling each other by name, and it
    // comes back under its name and catches up.
    cluster.kill(leader);
    let survivors: Vec<u64> = cluster.ids_except(leader);
    let new_leader = cluster
        .wait_for_leader_among(&survivors, Duration::from_secs(30))
        .await;
    assert!(
        create_anywhere(&cluster, "after-failover", b"y", Duration::from_secs(20))
            .await
            .expect("a write after failover"),
        "acknowledged"
    );
    cluster.spawn(leader);
    names.push("after-failover".into());
    names.sort();
    wait_converged(&cluster, &cluster.ids(), &names, Duration::from_secs(30)).await;
    assert_ne!(new_leader, leader);

    // Each node warned once, naming the variables it ignored (not their values, and not
    // the client's CAIRN_ENDPOINTS).
    for id in cluster.ids() {
        let log = cluster.log_of(id);
        let warnings: Vec<&str> = log.lines().filter(|l| l.contains(WARNING)).collect();
        // Once per start: the restarted node twice.
        let starts = if id == leader { 2 } else { 1 };
        assert_eq!(warnings.len(), starts, "node {id}: {log}");
        for line in warnings {
            assert!(
                line.contains("CAIRN_FOO, CAIRN_PORT, CAIRN_SERVICE_HOST"),
                "{line}"
            );
            assert!(!line.contains("CAIRN_ENDPOINTS"), "{line}");
            assert!(!line.contains("10.0.0.1"), "values are not logged: {line}");
        }
    }

    // A fourth node joins under its host name: the learner it asks to be added as names
    // its addresses `localhost:PORT` (once refused as "not an IP:port address").
    let via = cluster.node(new_leader).client_address.clone();
    let joined = cluster.add_joining_node(&via);
    assert!(cluster.node(joined).peer_address.starts_with("localhost:"));
    wait_converged(&cluster, &[joined], &names, Duration::from_secs(30)).await;
    assert!(cluster.is_running(joined), "{}", cluster.log_of(joined));
}

#[test]
fn cairn_dev_starts_with_unrelated_cairn_variables() {
    // `cairn dev` waited 30 s and said "no leader" while each child exited at once.
    let dir = tempfile::tempdir().unwrap();
    let dev = DevCluster::start(&dir.path().join("dev"), &[], unrelated_environment())
        .unwrap_or_else(|why| panic!("cairn dev did not report a cluster: {why}"));
    drop(dev); // Ctrl-C stops the cluster
    let log = std::fs::read_to_string(dir.path().join("dev/node-1.log")).unwrap_or_default();
    assert!(log.contains(WARNING) && log.contains("CAIRN_FOO"), "{log}");
}

#[test]
fn a_killed_cairn_dev_leaves_no_node_running() {
    // `cairn dev` killed outright (SIGKILL, or a Ctrl-C that came before it listened for
    // one) left its three nodes running, orphaned, on their ports and data dirs.
    let dir = tempfile::tempdir().unwrap();
    let mut dev = DevCluster::start(&dir.path().join("dev"), &[], vec![])
        .unwrap_or_else(|why| panic!("cairn dev did not report a cluster: {why}"));
    let data_dir = dir.path().join("dev").display().to_string();
    let nodes: Vec<u32> = processes_mentioning(&data_dir)
        .into_iter()
        .filter(|pid| *pid != dev.child.id())
        .collect();
    let _ = dev.child.kill();
    let _ = dev.child.wait();
    assert_eq!(nodes.len(), 3, "three nodes ran: {nodes:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut left = processes_mentioning(&data_dir);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        left = processes_mentioning(&data_dir);
    }
    for pid in &left {
        // SAFETY: kill(2) of a leftover node of this test, so that it does not outlive it.
        unsafe {
            libc::kill(*pid as i32, libc::SIGKILL);
        }
    }
    assert!(
        left.is_empty(),
        "nodes still running after cairn dev died: {left:?}"
    );
}

/// `cairn agent ARGS` with `env`, for a configuration that must be refused (or printed) at
/// once: a node still running after 20 s is killed, and its output has no exit code.
fn agent(args: &[&str], env: &[(&str, &str)]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("agent")
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("run cairn agent");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: std::fs::read(&out).unwrap(),
        stderr: std::fs::read(&err).unwrap(),
    }
}

const ONE_NODE: &[&str] = &[
    "--node-id",
    "1",
    "--members",
    "1=127.0.0.1:1/127.0.0.1:2",
    "--peer-address",
    "127.0.0.1:1",
    "--client-address",
    "127.0.0.1:2",
];

#[test]
fn bad_settings_are_refused_at_start_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    // (flags, environment, the setting the refusal names)
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        (&["--log-level", "verbose"], &[], "`log_level`"),
        (&[], &[("CAIRN_LOG_LEVEL", "verbose")], "`log_level`"),
        (
            &["--log-level", "warn,cairn_server=loud"],
            &[],
            "`log_level`",
        ),
        (&[], &[("CAIRN_LOG_FORMAT", "xml")], "`log_format`"),
        (
            &[],
            &[("CAIRN_ELECTION_TIMEOUT_MS", "soon")],
            "`election_timeout_ms`",
        ),
        (
            &["--election-timeout-ms", "5"],
            &[],
            "`election_timeout_ms`",
        ),
        (&["--peer-address", "nowhere"], &[], "`peer_address`"),
        (
            &["--client-address", "localhost:0"],
            &[],
            "`client_address`",
        ),
        (
            &["--client-address", "bad_host!:7001"],
            &[],
            "`client_address`",
        ),
        (
            &["--members", "1=127.0.0.1:1/node-1.cairn"],
            &[],
            "`members`",
        ),
        (
            &[],
            &[("CAIRN_REQUEST_TIMEOUT_MS", "1")],
            "`request_timeout_ms`",
        ),
    ];
    for (flags, env, named) in cases {
        // ONE_NODE, with the flags under test in place of its own.
        let mut args = flags.to_vec();
        for pair in ONE_NODE.chunks(2) {
            if !flags.contains(&pair[0]) {
                args.extend_from_slice(pair);
            }
        }
        args.extend_from_slice(&["--data-dir", data]);
        let out = agent(&args, env);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(2), "{flags:?} {env:?}: {said}");
        assert!(said.contains(named), "{flags:?} {env:?}: {said}");
        for internal in ["Some(", "NodeInfo", "u64", "usize"] {
            assert!(!said.contains(internal), "{flags:?} {env:?}: {said}");
        }
        assert!(
            !std::path::Path::new(data).exists(),
            "a refused configuration starts nothing"
        );
    }
}

#[test]
fn print_config_shows_each_value_and_where_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cairn.toml");
    let hash = "ab".repeat(32);
    std::fs::write(
        &file,
        format!(
            "election_timeout_ms = 2000\nlog_level = \"info\"\n\n[[auth.grants]]\nname = \
             \"ops\"\ntoken_sha256 = \"{hash}\"\nadmin = true\n"
        ),
    )
    .unwrap();
    let data = dir.path().join("data");
    let mut args = ONE_NODE.to_vec();
    args.extend_from_slice(&[
        "--config",
        file.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
        "--log-level",
        "debug",
        "--print-config",
    ]);
    let out = agent(
        &args,
        &[
            ("CAIRN_HISTORY_CHANGES_MAX", "77"),
            ("CAIRN_PORT", "tcp://10.0.0.1:7001"),
        ],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let line = |key: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("{key} = ")))
            .unwrap_or_else(|| panic!("no {key} in {stdout}"))
            .to_string()
    };
    let file_source = format!("# file {}", file.display());
    assert!(
        line("election_timeout_ms").contains(&file_source),
        "{stdout}"
    );
    assert!(
        line("history_changes_max").contains("= 77")
            && line("history_changes_max")
                .contains("# environment variable CAIRN_HISTORY_CHANGES_MAX"),
        "{stdout}"
    );
    // The flag wins over the file.
    assert!(
        line("log_level").contains("\"debug\"") && line("log_level").contains("# flag --log-level"),
        "{stdout}"
    );
    assert!(line("node_id").contains("# flag --node-id"), "{stdout}");
    assert!(
        line("snapshot_log_entries").contains("# default"),
        "{stdout}"
    );
    assert!(
        stdout.contains("[[auth.grants]]") && stdout.contains(&file_source),
        "{stdout}"
    );
    assert!(
        !stdout.contains(&hash),
        "the token hash is not printed: {stdout}"
    );
    assert!(
        stdout.contains("CAIRN_PORT"),
        "names the ignored variable: {stdout}"
    );
    // The output is TOML (the hidden hash aside).
    stdout
        .parse::<toml::Table>()
        .unwrap_or_else(|e| panic!("not TOML: {e}\n{stdout}"));
    assert!(!data.exists(), "--print-config does not start the node");

    // An invalid configuration is printed, and refused naming the setting.
    args.extend_from_slice(&["--heartbeat-interval-ms", "1000"]);
    let out = agent(&args, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("heartbeat_interval_ms = 1000"),
        "{}",
        text(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("`heartbeat_interval_ms`"),
        "{}",
        text(&out)
    );
}
