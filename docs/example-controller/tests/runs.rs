//! The example controller's binary, run both ways for a few seconds:
//! in process (`--in-process`: it starts its own node, which this test reaches
//! over gRPC to write Counters), and remote (`--endpoints`: against a node
//! this test embeds). Either way each Counter written gets the status its
//! value calls for, and follows its updates; SIGTERM stops it cleanly.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn_client::{Client, ClientOptions};
use cairn_example_controller::{counter_type, FINALIZER, STATUS_KEY};
use cairn_proto::google::protobuf::Any;
use cairn_proto::v1::{condition, Consistency, DeleteRequest, Id, Resource, Tenancy};
use cairn_server::config::{parse_members, Config};
use cairn_server::embed::EmbeddedNode;
use jepsen_tests::cluster::free_port;

const WAIT: Duration = Duration::from_secs(20);

fn id(name: &str) -> Id {
    Id {
        uid: String::new(),
        name: name.into(),
        r#type: Some(counter_type()),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }),
    }
}

fn data(json: &str) -> Option<Any> {
    Some(Any {
        type_url: "type.googleapis.com/demo.v1.Counter".into(),
        value: json.as_bytes().to_vec().into(),
    })
}

/// The controller's process, killed if the test ends without stopping it.
struct Controller(Child);

impl Controller {
    fn start(args: &[&str], log: &std::path::Path) -> Controller {
        let file = std::fs::File::create(log).expect("a log file");
        let child = Command::new(env!("CARGO_BIN_EXE_example-controller"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("the log"))
            .stderr(file)
            .spawn()
            .expect("start example-controller");
        Controller(child)
    }

    /// SIGTERM, then the exit status within `WAIT`.
    fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on the child this test started.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.0.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "SIGTERM did not stop it");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until the Counter `name` carries the controller's condition with
/// `reason` (and `state`), reading strongly; returns it.
async fn wait_for_status(
    client: &Client,
    name: &str,
    state: condition::State,
    reason: &str,
    log: &std::path::Path,
) -> Resource {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(counter) = client.read(id(name), Consistency::Strong).await {
            let condition = counter
                .status
                .get(STATUS_KEY)
                .and_then(|s| s.conditions.first());
            if condition.is_some_and(|c| c.reason == reason && c.state == state as i32) {
                return counter;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{name} never got reason {reason}; the controller's log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes `json` as the data of the Counter `name` (created if absent), retrying
/// when the controller's own status write got in between.
async fn set_value(client: &Client, name: &str, json: &str) {
    let created = client
        .create_if_absent(Resource {
            id: Some(id(name)),
            data: data(json),
            ..Default::default()
        })
        .await
        .expect("create");
    if created.1 {
        return;
    }
    client
        .read_modify_write(id(name), |current| {
            let mut next = current.clone();
            next.data = data(json);
            Some(next)
        })
        .await
        .expect("update");
}

/// What both runs check, through `client`, of a controller writing to its `log`.
async fn the_controller_reconciles(client: &Client, log: &std::path::Path) {
    use condition::State::{False, True};
    set_value(client, "c1", r#"{"value": 3}"#).await;
    set_value(client, "c2", r#"{"value": 10}"#).await;
    wait_for_status(client, "c1", True, "Odd", log).await;
    wait_for_status(client, "c2", True, "Even", log).await;
    set_value(client, "c1", r#"{"value": 4}"#).await;
    let c1 = wait_for_status(client, "c1", True, "Even", log).await;
    assert_eq!(
        c1.status[STATUS_KEY].conditions[0].message,
        "value 4 is even"
    );
    set_value(client, "c2", r#"{"value": "ten"}"#).await;
    wait_for_status(client, "c2", False, "InvalidData", log).await;
    // Nothing more to do: the status stays as written, no write loop.
    let settled = client.read(id("c1"), Consistency::Strong).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = client.read(id("c1"), Consistency::Strong).await.unwrap();
    assert_eq!(
        later.version, settled.version,
        "a reconciled Counter is left alone"
    );
    // Its status entry follows the generation the store set, and it holds the finalizer.
    assert_eq!(
        later.status[STATUS_KEY].observed_generation, later.generation,
        "the status says which generation it saw"
    );
    assert!(later.metadata["finalizers"].contains(FINALIZER));
    // A deleted Counter waits (marked) until the controller finalized it, then goes.
    let answer = client
        .delete_request(DeleteRequest {
            id: later.id.clone(),
            version: later.version.clone(),
            fence: None,
            orphan_dependents: false,
        })
        .await
        .unwrap();
    assert!(answer.marked, "the finalizer holds the Counter back");
    let deadline = Instant::now() + WAIT;
    while client.read(id("c1"), Consistency::Strong).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "the controller never finalized c1; its log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A single node embedded in the test, its data in `dir`; and its client address.
async fn embedded_node(dir: &std::path::Path) -> (EmbeddedNode, String) {
    let client_address = format!("127.0.0.1:{}", free_port());
    let peer_address = format!("127.0.0.1:{}", free_port());
    let node = EmbeddedNode::start(Config {
        node_id: 1,
        data_dir: dir.join("data"),
        members: parse_members(&format!("1={peer_address}/{client_address}")).unwrap(),
        client_address: client_address.clone(),
        peer_address,
        ..Config::default()
    })
    .await
    .expect("the node starts");
    (node, client_address)
}

fn remote_client(address: &str) -> Client {
    Client::new(
        &[address],
        ClientOptions {
            request_timeout: Duration::from_secs(10),
            ..ClientOptions::default()
        },
    )
    .expect("a client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_it_reconciles_the_counters_of_its_own_node() {
    // `--in-process`: the controller starts a node in its own process; this test
    // writes Counters to that node over gRPC and reads the statuses back.
    let dir = tempfile::tempdir().unwrap();
    let client_address = format!("127.0.0.1:{}", free_port());
    let peer_address = format!("127.0.0.1:{}", free_port());
    let log = dir.path().join("controller.log");
    let data_dir = dir.path().join("data");
    let controller = Controller::start(
        &[
            "--in-process",
            "--data-dir",
            data_dir.to_str().unwrap(),
            "--client-address",
            &client_address,
            "--peer-address",
            &peer_address,
        ],
        &log,
    );
    let client = remote_client(&client_address);
    the_controller_reconciles(&client, &log).await;
    let status = controller.stop();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{status}: {text}");
    assert!(text.contains("running in process"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_it_reconciles_the_counters_of_the_cluster_it_reaches() {
    // `--endpoints`: the same controller against a node over gRPC (a node this test
    // embeds; any cluster would do).
    let dir = tempfile::tempdir().unwrap();
    let (node, client_address) = embedded_node(dir.path()).await;
    let log = dir.path().join("controller.log");
    let controller = Controller::start(&["--endpoints", &client_address], &log);
    let client = remote_client(&client_address);
    the_controller_reconciles(&client, &log).await;
    let status = controller.stop();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{status}: {text}");
    assert!(text.contains("running against the cluster"), "{text}");
    node.shutdown().await;
}

/// Whether `log` says its replica is leading.
fn leads(log: &std::path::Path) -> bool {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains("leading: reconciling")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_only_one_reconciles_and_the_other_takes_over_when_it_dies() {
    // Two replicas against one cluster: one wins the election and reconciles (fenced), the
    // other waits; kill -9 the leading one and the other takes over within its lease TTL.
    let dir = tempfile::tempdir().unwrap();
    let (node, client_address) = embedded_node(dir.path()).await;
    let logs = [dir.path().join("a.log"), dir.path().join("b.log")];
    let mut replicas: Vec<Option<Controller>> = ["a", "b"]
        .iter()
        .zip(&logs)
        .map(|(name, log)| {
            Some(Controller::start(
                &[
                    "--endpoints",
                    &client_address,
                    "--replica",
                    name,
                    "--lease-ttl-ms",
                    "1500",
                ],
                log,
            ))
        })
        .collect();
    let client = remote_client(&client_address);
    use condition::State::True;
    set_value(&client, "c1", r#"{"value": 1}"#).await;
    wait_for_status(&client, "c1", True, "Odd", &logs[0]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let leading: Vec<usize> = (0..2).filter(|i| leads(&logs[*i])).collect();
    assert_eq!(leading.len(), 1, "exactly one replica leads: {leading:?}");
    let (leader, other) = (leading[0], 1 - leading[0]);
    // The leader dies without resigning: its lease expires, the other takes over.
    drop(replicas[leader].take());
    set_value(&client, "c2", r#"{"value": 2}"#).await;
    wait_for_status(&client, "c2", True, "Even", &logs[other]).await;
    assert!(leads(&logs[other]), "the other replica took over");
    let status = replicas[other].take().unwrap().stop();
    let text = std::fs::read_to_string(&logs[other]).unwrap_or_default();
    assert!(status.success(), "{status}: {text}");
    node.shutdown().await;
}
