//! Cluster control: real `cairn agent` processes on loopback, started,
//! killed (`SIGKILL`), paused (`SIGSTOP`/`SIGCONT`), stopped (`SIGTERM`) and
//! restarted with their data dirs. Used by the node's integration tests and by
//! the fault-injection runner.
//!
//! Every process is killed when the [`Cluster`] is dropped, and every wait is
//! bounded, so a failing test never leaves a node behind or hangs.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn_proto::v1::admin_service_client::AdminServiceClient;
use cairn_proto::v1::{StatusRequest, StatusResponse};

/// How to start the cluster's nodes.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub nodes: usize,
    /// The `cairn` binary (tests pass `env!("CARGO_BIN_EXE_cairn")`).
    pub binary: PathBuf,
    pub election_timeout_ms: u64,
    pub snapshot_log_entries: u64,
    /// Extra `cairn agent` arguments for every node.
    pub extra_args: Vec<String>,
    /// Where data dirs go (default: a fresh temporary directory).
    pub root: Option<PathBuf>,
    pub log_level: String,
}

impl ClusterOptions {
    pub fn new(binary: impl Into<PathBuf>, nodes: usize) -> ClusterOptions {
        ClusterOptions {
            nodes,
            binary: binary.into(),
            election_timeout_ms: 1000,
            snapshot_log_entries: 20_000,
            extra_args: vec![],
            root: None,
            log_level: "info".into(),
        }
    }
}

/// One node: its addresses, data dir and (while running) its process.
pub struct NodeProcess {
    pub id: u64,
    pub client_address: String,
    pub peer_address: String,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    /// `--members` for a bootstrap member, `--join` for a node added later.
    pub bootstrap: Vec<String>,
    child: Option<Child>,
}

impl NodeProcess {
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
}

pub struct Cluster {
    pub options: ClusterOptions,
    pub nodes: Vec<NodeProcess>,
    root: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

/// A free loopback port (bound, then released, so the node can take it).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("cannot bind a loopback port");
    listener.local_addr().expect("local addr").port()
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a pid we spawned; failure (already gone) is harmless.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

impl Cluster {
    /// Starts `options.nodes` bootstrap members and returns at once (see [`Cluster::wait_for_leader`]).
    pub fn start(options: ClusterOptions) -> Cluster {
        let (root, temp) = match &options.root {
            Some(r) => (r.clone(), None),
            None => {
                let t = tempfile::tempdir().expect("temp dir");
                (t.path().to_path_buf(), Some(t))
            }
        };
        let mut nodes: Vec<NodeProcess> = (1..=options.nodes as u64)
            .map(|id| NodeProcess {
                id,
                client_address: format!("127.0.0.1:{}", free_port()),
                peer_address: format!("127.0.0.1:{}", free_port()),
                data_dir: root.join(format!("node-{id}")),
                log_path: root.join(format!("node-{id}.log")),
                bootstrap: vec![],
                child: None,
            })
            .collect();
        let members = nodes
            .iter()
            .map(|n| format!("{}={}/{}", n.id, n.peer_address, n.client_address))
            .collect::<Vec<_>>()
            .join(",");
        for n in &mut nodes {
            n.bootstrap = vec!["--members".into(), members.clone()];
        }
        let mut cluster = Cluster {
            options,
            nodes,
            root,
            _temp: temp,
        };
        for id in 1..=cluster.nodes.len() as u64 {
            cluster.spawn(id);
        }
        cluster
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn node(&self, id: u64) -> &NodeProcess {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    fn node_mut(&mut self, id: u64) -> &mut NodeProcess {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// Client addresses of every node (running or not).
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| n.client_address.clone())
            .collect()
    }

    /// Starts node `id`'s process with its data dir (a restart keeps the data).
    pub fn spawn(&mut self, id: u64) {
        let options = self.options.clone();
        let node = self.node_mut(id);
        assert!(
            node.child.is_none() || !node.is_running(),
            "node {id} is already running"
        );
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log_path)
            .expect("node log");
        let child = Command::new(&options.binary)
            .arg("agent")
            .args(["--node-id", &id.to_string()])
            .arg("--data-dir")
            .arg(&node.data_dir)
            .args([
                "--client-address",
                &node.client_address,
                "--peer-address",
                &node.peer_address,
            ])
            .args(&node.bootstrap)
            .args([
                "--election-timeout-ms",
                &options.election_timeout_ms.to_string(),
            ])
            .args([
                "--snapshot-log-entries",
                &options.snapshot_log_entries.to_string(),
            ])
            .args(["--log-level", &options.log_level])
            .args(&options.extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", options.binary.display()));
        node.child = Some(child);
    }

    /// Adds a new node that joins through `via` (a member's client address);
    /// returns its id once its process is started.
    pub fn add_joining_node(&mut self, via: &str) -> u64 {
        let id = self.nodes.iter().map(|n| n.id).max().unwrap_or(0) + 1;
        self.nodes.push(NodeProcess {
            id,
            client_address: format!("127.0.0.1:{}", free_port()),
            peer_address: format!("127.0.0.1:{}", free_port()),
            data_dir: self.root.join(format!("node-{id}")),
            log_path: self.root.join(format!("node-{id}.log")),
            bootstrap: vec!["--join".into(), via.to_string()],
            child: None,
        });
        self.spawn(id);
        id
    }

    /// `kill -9`: the process dies at once, with whatever it had not persisted.
    pub fn kill(&mut self, id: u64) {
        let node = self.node_mut(id);
        if let Some(mut c) = node.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait (bounded) for a graceful exit.
    pub fn stop(&mut self, id: u64) {
        let node = self.node_mut(id);
        if let Some(mut c) = node.child.take() {
            signal(c.id(), libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn pause(&mut self, id: u64) {
        if let Some(pid) = self.node(id).pid() {
            signal(pid, libc::SIGSTOP);
        }
    }

    pub fn resume(&mut self, id: u64) {
        if let Some(pid) = self.node(id).pid() {
            signal(pid, libc::SIGCONT);
        }
    }

    pub fn restart(&mut self, id: u64) {
        self.kill(id);
        self.spawn(id);
    }

    pub fn is_running(&mut self, id: u64) -> bool {
        self.node_mut(id).is_running()
    }

    /// The node's log so far (for failure messages).
    pub fn log_of(&self, id: u64) -> String {
        std::fs::read_to_string(&self.node(id).log_path).unwrap_or_default()
    }

    /// The admin status of node `id`, if it answers within a second.
    pub async fn status(&self, id: u64) -> Option<StatusResponse> {
        let address = format!("http://{}", self.node(id).client_address);
        let fut = async {
            let mut c = AdminServiceClient::connect(address).await.ok()?;
            c.status(StatusRequest {})
                .await
                .ok()
                .map(|r| r.into_inner())
        };
        tokio::time::timeout(Duration::from_secs(1), fut)
            .await
            .ok()
            .flatten()
    }

    /// Waits until a node reports itself leader, and (if `among` is given) only
    /// counts nodes in `among`. Panics with the node logs after `timeout`.
    pub async fn wait_for_leader_among(&self, among: &[u64], timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            for id in among {
                if let Some(s) = self.status(*id).await {
                    if s.leader_id == *id && s.state == "leader" {
                        return *id;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "no leader among {among:?} within {timeout:?}; logs in {}",
            self.root.display()
        );
    }

    pub async fn wait_for_leader(&self, timeout: Duration) -> u64 {
        let ids = self.ids();
        self.wait_for_leader_among(&ids, timeout).await
    }

    /// Waits until node `id` has applied at least `index`.
    pub async fn wait_applied(&self, id: u64, index: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.status(id).await {
                if s.applied_index >= index {
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(pid) = n.pid() {
                signal(pid, libc::SIGCONT);
            }
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}
