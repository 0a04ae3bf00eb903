//! Cairn's errors read from outside Rust: a Python grpcio script
//! (`grpc_error_model.py`) provokes each error kind it can reach against a
//! real three-node cluster and decodes `grpc-status-details-bin` with the
//! standard `google.rpc.Status` (grpcio-status, googleapis-common-protos) and
//! nothing of Cairn's code; Cairn's own detail messages are unpacked from
//! `Any` with classes generated from `proto/` by grpcio-tools at run time.
//!
//! Needs `python3` with `grpcio`, `grpcio-status`, `grpcio-tools` and
//! `googleapis-common-protos` (`.ci/run` installs them). Without them the test
//! says it is skipped, except under `CI=true`, where that is a failure.

use crate::support;

use std::process::Command;
use std::time::Duration;

use support::*;

const LEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Smaller than the script's filler writes, so an old revision is compacted.
const HISTORY_CHANGES_MAX: &str = "10";
/// Smaller than the script's filler writes (owned by one resource), so
/// listing them by owner is refused.
const LIST_RESULTS_MAX: &str = "5";
/// The script's PAGE_SIZE_MAX: its listing of the fillers takes several pages.
const LIST_PAGE_SIZE_MAX: &str = "7";
/// Far fewer than the script's burst of writes to a watch it does not read.
const WATCH_BUFFER_EVENTS: &str = "8";
const PYTHON_MODULES: &str = "grpc, grpc_status, grpc_tools, google.rpc.error_details_pb2";

fn python_has_the_modules() -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {PYTHON_MODULES}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_kind_reads_as_a_standard_google_rpc_status_from_python() {
    if !python_has_the_modules() {
        let message = format!("python3 cannot import {PYTHON_MODULES} (.ci/run installs them)");
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{message}");
        eprintln!(
            "SKIPPED every_error_kind_reads_as_a_standard_google_rpc_status_from_python: {message}"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (admin, admin_hash) = new_token();
    let (ops, ops_hash) = new_token();
    let (reader, reader_hash) = new_token();
    let node_token_file = dir.path().join("node.token");
    std::fs::write(&node_token_file, format!("{admin}\n")).unwrap();
    let config = dir.path().join("cairn.toml");
    std::fs::write(
        &config,
        format!(
            r#"list_results_max = {LIST_RESULTS_MAX}
list_page_size_max = {LIST_PAGE_SIZE_MAX}
watch_buffer_events = {WATCH_BUFFER_EVENTS}

[auth]
node_token_file = "{}"

[[auth.grants]]
name = "admin"
{admin_hash}
admin = true

[[auth.grants]]
name = "ops"
{ops_hash}
write = {{ types = ["*"], tenancies = ["*"] }}

[[auth.grants]]
name = "reader"
{reader_hash}
read = {{ types = ["demo.Thing"], tenancies = ["default/*"] }}
"#,
            node_token_file.display()
        ),
    )
    .unwrap();
    let mut o = options(3);
    o.extra_args = vec![
        "--config".into(),
        config.display().to_string(),
        "--history-changes-max".into(),
        HISTORY_CHANGES_MAX.into(),
    ];
    o.admin_token = Some(admin.clone());
    let cluster = Cluster::start(o);
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = cluster.ids_except(leader)[0];
    // Every node must know the leader for the follower's hint to name it.
    for id in cluster.ids() {
        let deadline = std::time::Instant::now() + LEADER_TIMEOUT;
        while cluster.status(id).await.map(|s| s.leader_id) != Some(leader) {
            assert!(
                std::time::Instant::now() < deadline,
                "node {id} never learned the leader"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let manifest = env!("CARGO_MANIFEST_DIR");
    let output = Command::new("python3")
        .arg(format!("{manifest}/tests/grpc_error_model.py"))
        .arg(format!("{manifest}/../proto/proto"))
        .arg(&cluster.node(leader).client_address)
        .arg(&cluster.node(follower).client_address)
        .args([&ops, &reader, &admin])
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the Python client failed:\n{stdout}\n{stderr}"
    );
    for kind in [
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "CAS_FAILURE",
        "WRONG_UID",
        "GROUP_VERSION_MISMATCH",
        "COMPACTED",
        "RESOURCE_EXHAUSTED",
        "PAGES",
        "INVALID_ARGUMENT page_token",
        "UNAUTHENTICATED",
        "PERMISSION_DENIED",
        "NOT_LEADER",
        "WATCH_CLOSED",
    ] {
        assert!(
            stdout.lines().any(|l| l == format!("checked {kind}")),
            "{kind} was not checked:\n{stdout}\n{stderr}"
        );
    }
}
