//! Cluster control: real `cairn agent` processes on loopback, started,
//! killed (`SIGKILL`), paused (`SIGSTOP`/`SIGCONT`), stopped (`SIGTERM`) and
//! restarted with their data dirs. Used by the node's integration tests and by
//! the fault-injection runner.
//!
//! Every process is killed when the [`Cluster`] is dropped, and every wait is
//! bounded, so a failing test never leaves a node behind or hangs.
//!
//! Optional, for the fault-injection runner:
//! - [`ClusterOptions::network`]: each node runs in its own network namespace
//!   of a [`NetworkLab`] (address `10.147.x.(10+id)`, ports 7000/8000), so the
//!   lab can partition them;
//! - [`ClusterOptions::powercut`]: each node's data dir sits on its own
//!   power-cut FUSE filesystem ([`Cluster::cut_power`]);
//! - [`NodeProcess::faketime`]: the node starts under libfaketime
//!   (`LD_PRELOAD` + `FAKETIME`), for clock skew and rate changes — set
//!   directly rather than through the `faketime` wrapper, which forks and
//!   waits, so that the pid we signal is the node's own;
//! - [`ClusterOptions::live_clocks`]: every node runs under libfaketime reading its
//!   wall clock's offset and rate from a file of its own (`FAKETIME_TIMESTAMP_FILE`,
//!   re-read every second), so [`Cluster::set_clock`] jumps or drifts the clock of a
//!   *running* node; the monotonic clock is left alone, as an NTP step or a drifting
//!   wall clock would leave it;
//! - [`Cluster::lifetimes`]: how many times each node has been started, a cheap handle
//!   that others (the workloads) read while the nemesis kills and restarts nodes;
//! - [`ClusterOptions::die_with_parent`]: nodes get `PR_SET_PDEATHSIG`, so they
//!   die with the runner even if it is killed (the signal fires when the
//!   *thread* that spawned them exits: spawn only from a long-lived thread);
//! - [`ClusterOptions::memory_limit_bytes`]: each node runs in its own memory cgroup
//!   ([`crate::memcg`]) with that limit, joined between fork and exec, so that the kernel's
//!   OOM killer, not the harness, kills it when [`Cluster::memory_cgroup`]'s limit is
//!   lowered; the cgroup is removed with the node.
//!
//! A node that exits by itself (a `FATAL` stop, a panic, the OOM killer) is seen with
//! [`Cluster::exited`]; [`Cluster::log_tail`] gives the end of its log for the report
//! ([`Cluster::exit_report`]).
//!
//! Every node runs [`ClusterOptions::binary`] unless [`Cluster::set_binary`] gave it another
//! one for its next start: a rolling upgrade or a rollback replaces one member's build
//! ([`crate::upgrade`]). The `cairn agent` arguments of a start are decided in one place
//! ([`Cluster::agent_flags`] lists them), and every one of them is known to release 0.1.0's
//! `cairn agent` as well, so that a node of that release starts the same way.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_powercut_fs::{PowerCutFs, PowerCutHandle};
use cairn_proto::v1::admin_service_client::AdminServiceClient;
use cairn_proto::v1::{
    MembershipResponse, RemoveMemberRequest, StatusRequest, StatusResponse, TransferLeaderRequest,
};

use crate::net::NetworkLab;

/// Client and peer ports of a node inside its own network namespace.
pub const NAMESPACE_CLIENT_PORT: u16 = 7000;
pub const NAMESPACE_PEER_PORT: u16 = 8000;

/// The libfaketime preload library, if the `faketime` package is installed.
pub fn faketime_library() -> Option<PathBuf> {
    let mut candidates = vec![
        PathBuf::from("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),
        PathBuf::from("/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"),
        PathBuf::from("/usr/lib/faketime/libfaketime.so.1"),
        PathBuf::from("/usr/local/lib/faketime/libfaketime.so.1"),
    ];
    if let Ok(entries) = std::fs::read_dir("/usr/lib") {
        for e in entries.flatten() {
            candidates.push(e.path().join("faketime/libfaketime.so.1"));
        }
    }
    candidates.into_iter().find(|p| p.is_file())
}

/// How to start the cluster's nodes.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub nodes: usize,
    /// The `cairn` binary (tests pass `env!("CARGO_BIN_EXE_cairn")`).
    pub binary: PathBuf,
    pub election_timeout_ms: u64,
    pub snapshot_log_entries: u64,
    /// Extra `cairn agent` arguments for every node; `{id}` in one is
    /// replaced by the node's id (e.g. `--tls-cert-file DIR/node-{id}.pem`).
    pub extra_args: Vec<String>,
    /// TLS settings of the cluster's own admin calls (status, remove,
    /// transfer); `None`: plaintext.
    pub client_tls: Option<cairn_client::TlsOptions>,
    /// Where data dirs go (default: a fresh temporary directory).
    pub root: Option<PathBuf>,
    pub log_level: String,
    /// Run every node in its own namespace of this lab (partitions possible).
    pub network: Option<Arc<NetworkLab>>,
    /// Put every node's data dir on its own power-cut filesystem.
    pub powercut: bool,
    /// Start every node under libfaketime with a clock file ([`Cluster::set_clock`]).
    pub live_clocks: bool,
    /// ... with these harsher behaviours (torn writes, strict directories; each node's
    /// torn-write seed is this one plus its id).
    pub powercut_options: cairn_powercut_fs::PowerCutOptions,
    /// Kill the nodes when the thread that spawned them exits.
    pub die_with_parent: bool,
    /// Serve each node's Prometheus metrics on a port of its own
    /// ([`NodeProcess::metrics_address`]).
    pub metrics: bool,
    /// The token sent with every admin call this harness makes (status,
    /// membership, leader transfer), for clusters whose config holds grants.
    pub admin_token: Option<String>,
    /// The host of every node's addresses outside a network lab: `127.0.0.1`, or a name
    /// that resolves to it (`localhost`).
    pub host: String,
    /// Environment variables set for every node process.
    pub env: Vec<(String, String)>,
    /// Bootstrap members that [`Cluster::start`] places but does not spawn: a test starts
    /// them later with [`Cluster::spawn`] (a member whose machine came up late).
    pub started_later: Vec<u64>,
    /// Run every node in a memory cgroup of its own with this limit ([`crate::memcg`]);
    /// placing a node fails when no memory cgroup can be created here.
    pub memory_limit_bytes: Option<u64>,
    /// The first bootstrap member's id; the others follow (`first_id`, `first_id + 1`, ...).
    /// A cluster started after another in the same root takes ids of its own, so that its
    /// node logs (`ROOT/node-ID.log`) and data dirs stay apart from the first one's.
    pub first_id: u64,
    /// Data dirs of given nodes, in place of `ROOT/node-ID`: a node started on a data dir
    /// prepared beforehand (seeded offline for a new cluster, say, where an earlier node's
    /// data dir was). Not with [`ClusterOptions::powercut`].
    pub data_dirs: BTreeMap<u64, PathBuf>,
}

impl ClusterOptions {
    pub fn new(binary: impl Into<PathBuf>, nodes: usize) -> ClusterOptions {
        ClusterOptions {
            nodes,
            binary: binary.into(),
            election_timeout_ms: 1000,
            snapshot_log_entries: 20_000,
            extra_args: vec![],
            client_tls: None,
            root: None,
            log_level: "info".into(),
            network: None,
            powercut: false,
            live_clocks: false,
            powercut_options: Default::default(),
            die_with_parent: false,
            metrics: false,
            admin_token: None,
            host: "127.0.0.1".into(),
            env: vec![],
            started_later: vec![],
            memory_limit_bytes: None,
            first_id: 1,
            data_dirs: BTreeMap::new(),
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
    /// libfaketime's `FAKETIME` for the next start (`+5s`, `-3s`, `+0 x1.5`...).
    pub faketime: Option<String>,
    /// The network namespace the node runs in (with [`ClusterOptions::network`]).
    pub namespace: Option<String>,
    /// Where the node serves Prometheus metrics (with [`ClusterOptions::metrics`]).
    pub metrics_address: Option<String>,
    /// `RLIMIT_NOFILE` (soft and hard) for the next start; `None`: inherited.
    pub nofile_limit: Option<u64>,
    /// The binary of the node's next start, when not [`ClusterOptions::binary`]
    /// ([`Cluster::set_binary`]).
    binary: Option<PathBuf>,
    /// The power-cut filesystem under the data dir (with [`ClusterOptions::powercut`]).
    disk: Option<PowerCutHandle>,
    child: Option<Child>,
    /// The node's memory cgroup (with [`ClusterOptions::memory_limit_bytes`]); removed
    /// when the node is dropped, after [`Cluster`]'s drop has killed and reaped its process.
    memory_cgroup: Option<crate::memcg::MemoryCgroup>,
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

/// Each node's lifetime: how many times its process has been started (0 = never).
/// Bumped by [`Cluster::spawn`] *before* the process starts, under a lock, and only after
/// the previous process is gone; so a reader that sees lifetime L of a node before
/// sending a request, and L again after the answer, was answered by lifetime L's
/// process (or by no process). Clones share the counters.
#[derive(Clone, Debug, Default)]
pub struct Lifetimes {
    started: Arc<parking_lot::Mutex<HashMap<u64, u64>>>,
}

impl Lifetimes {
    /// Node `id`'s current lifetime: the number of times it has been started.
    pub fn of(&self, id: u64) -> u64 {
        self.started.lock().get(&id).copied().unwrap_or(0)
    }

    /// Begins node `id`'s next lifetime; returns it.
    fn begin(&self, id: u64) -> u64 {
        let mut started = self.started.lock();
        let lifetime = started.entry(id).or_insert(0);
        *lifetime += 1;
        *lifetime
    }
}

pub struct Cluster {
    pub options: ClusterOptions,
    pub nodes: Vec<NodeProcess>,
    lifetimes: Lifetimes,
    root: PathBuf,
    /// The bootstrap members' `--members` value.
    members: String,
    _temp: Option<ScratchDir>,
    /// The highest node id ever used here: ids of removed nodes are never reused.
    highest_id: u64,
}

/// A new node's addresses, namespace and data dir (and its mounted disk).
fn place_node(options: &ClusterOptions, root: &Path, id: u64) -> Result<NodeProcess, String> {
    let (client_address, peer_address, namespace) = match &options.network {
        Some(lab) => {
            let node = lab.add_node(id)?;
            (
                format!("{}:{NAMESPACE_CLIENT_PORT}", node.ip),
                format!("{}:{NAMESPACE_PEER_PORT}", node.ip),
                Some(node.namespace),
            )
        }
        None => (
            format!("{}:{}", options.host, free_port()),
            format!("{}:{}", options.host, free_port()),
            None,
        ),
    };
    let memory_cgroup = match options.memory_limit_bytes {
        Some(limit) => {
            let hierarchy = crate::memcg::Hierarchy::find()?;
            Some(crate::memcg::MemoryCgroup::create(&hierarchy, id, limit)?)
        }
        None => None,
    };
    let given_data_dir = options.data_dirs.get(&id);
    if given_data_dir.is_some() && options.powercut {
        return Err(format!(
            "node {id} is given a data dir and the nodes run on power-cut disks: one or the other"
        ));
    }
    let (data_dir, disk) = if let Some(dir) = given_data_dir {
        (dir.clone(), None)
    } else if options.powercut {
        let mountpoint = root.join(format!("node-{id}-disk"));
        std::fs::create_dir_all(&mountpoint)
            .map_err(|e| format!("cannot create {}: {e}", mountpoint.display()))?;
        let mut disk_options = options.powercut_options;
        disk_options.torn_writes_seed = disk_options.torn_writes_seed.map(|s| s.wrapping_add(id));
        let disk = PowerCutFs::mount_with(&mountpoint, disk_options).map_err(|e| e.to_string())?;
        (mountpoint.join("data"), Some(disk))
    } else {
        (root.join(format!("node-{id}")), None)
    };
    Ok(NodeProcess {
        id,
        client_address,
        peer_address,
        data_dir,
        log_path: root.join(format!("node-{id}.log")),
        bootstrap: vec![],
        faketime: None,
        metrics_address: (options.metrics && options.network.is_none())
            .then(|| format!("{}:{}", options.host, free_port())),
        nofile_limit: None,
        namespace,
        binary: None,
        disk,
        child: None,
        memory_cgroup,
    })
}

/// The clock file of the node whose log is `log_path` (beside it).
fn clock_file(log_path: &Path) -> PathBuf {
    log_path.with_extension("faketime")
}

/// Replaces a clock file at once (libfaketime never reads half a spec).
fn write_clock_file(file: &Path, spec: &str) {
    let temporary = file.with_extension("faketime.new");
    std::fs::write(&temporary, format!("{spec}\n"))
        .and_then(|()| std::fs::rename(&temporary, file))
        .unwrap_or_else(|e| panic!("cannot write the clock file {}: {e}", file.display()));
}

/// A loopback port no other node of this process was given, free when
/// checked. Taken below Linux's ephemeral range (32768 and up), so an
/// outgoing connection can never grab it between this check and the node's
/// bind (port 0 handed out ephemeral ports, and a node then found its port
/// taken now and then); each process starts at its own offset.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = std::process::id().wrapping_mul(7_919) % SPAN;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < SPAN, "no free loopback port left below 32000");
        let port = (LOW + (offset + n) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a pid we spawned; failure (already gone) is harmless.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// The `cairn agent` arguments of `node`'s next start: the one place that decides them. Each
/// flag here is one that release 0.1.0's `cairn agent` knows too (`jepsen-tests upgrade`
/// checks the earlier build's `agent --help` lists every one before it starts a node of it);
/// [`ClusterOptions::extra_args`] are the caller's to choose.
fn agent_args(options: &ClusterOptions, node: &NodeProcess) -> Vec<OsString> {
    let id = node.id.to_string();
    let mut args: Vec<OsString> = vec![
        "agent".into(),
        "--node-id".into(),
        id.clone().into(),
        "--data-dir".into(),
        node.data_dir.clone().into(),
        "--client-address".into(),
        node.client_address.clone().into(),
        "--peer-address".into(),
        node.peer_address.clone().into(),
    ];
    args.extend(node.bootstrap.iter().map(OsString::from));
    args.extend([
        "--election-timeout-ms".into(),
        options.election_timeout_ms.to_string().into(),
        "--snapshot-log-entries".into(),
        options.snapshot_log_entries.to_string().into(),
        "--log-level".into(),
        options.log_level.clone().into(),
    ]);
    if let Some(address) = &node.metrics_address {
        args.extend(["--metrics-address".into(), address.into()]);
    }
    args.extend(
        options
            .extra_args
            .iter()
            .map(|a| OsString::from(a.replace("{id}", &id))),
    );
    args
}

/// An admin client of `address` (over TLS when `client_tls` is given), carrying `admin_token`.
async fn admin_client(
    client_tls: Option<&cairn_client::TlsOptions>,
    admin_token: Option<&str>,
    address: &str,
) -> Result<AdminServiceClient<cairn_client::AuthenticatedChannel>, String> {
    let token = admin_token
        .map(|t| cairn_client::BearerToken::new(t.to_owned()))
        .transpose()
        .map_err(|e| e.to_string())?;
    let access = cairn_client::Access::from_options(client_tls)
        .map_err(|e| e.to_string())?
        .with_token(token.as_ref());
    access.admin(address).await
}

/// The admin status of the node at `address`, if it answers within a second.
async fn status_at(
    client_tls: Option<&cairn_client::TlsOptions>,
    admin_token: Option<&str>,
    address: &str,
) -> Option<StatusResponse> {
    let fut = async {
        let mut c = admin_client(client_tls, admin_token, address).await.ok()?;
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

/// Asks the nodes of a cluster for their admin status from a task of its own, while the
/// [`Cluster`] stays with whoever starts and stops the nodes ([`Cluster::status_probe`]):
/// each node's client address and the cluster's admin credentials.
#[derive(Clone, Debug)]
pub struct StatusProbe {
    addresses: BTreeMap<u64, String>,
    client_tls: Option<cairn_client::TlsOptions>,
    admin_token: Option<String>,
}

impl StatusProbe {
    /// The nodes it asks.
    pub fn ids(&self) -> Vec<u64> {
        self.addresses.keys().copied().collect()
    }

    /// The admin status of node `id`, if it answers within a second (`None` as well for a
    /// node the probe does not know).
    pub async fn status(&self, id: u64) -> Option<StatusResponse> {
        let address = self.addresses.get(&id)?;
        status_at(
            self.client_tls.as_ref(),
            self.admin_token.as_deref(),
            address,
        )
        .await
    }
}

impl Cluster {
    /// Starts `options.nodes` bootstrap members (ids from [`ClusterOptions::first_id`]) and
    /// returns at once (see [`Cluster::wait_for_leader`]). Panics when the nodes cannot be
    /// placed (see [`Cluster::try_start`]).
    pub fn start(options: ClusterOptions) -> Cluster {
        Cluster::try_start(options).unwrap_or_else(|e| panic!("cannot start the cluster: {e}"))
    }

    /// As [`Cluster::start`], but a namespace or filesystem that cannot be set
    /// up is an error.
    pub fn try_start(options: ClusterOptions) -> Result<Cluster, String> {
        let (root, temp) = match &options.root {
            Some(r) => {
                std::fs::create_dir_all(r)
                    .map_err(|e| format!("cannot create {}: {e}", r.display()))?;
                (r.clone(), None)
            }
            None => {
                let t = ScratchDir::new()?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let mut nodes = Vec::with_capacity(options.nodes);
        for id in (options.first_id..).take(options.nodes) {
            nodes.push(place_node(&options, &root, id)?);
        }
        let members = nodes
            .iter()
            .map(|n| format!("{}={}/{}", n.id, n.peer_address, n.client_address))
            .collect::<Vec<_>>()
            .join(",");
        for n in &mut nodes {
            n.bootstrap = vec!["--members".into(), members.clone()];
        }
        let highest_id = nodes.iter().map(|n| n.id).max().unwrap_or(0);
        let mut cluster = Cluster {
            options,
            nodes,
            root,
            members,
            _temp: temp,
            highest_id,
            lifetimes: Lifetimes::default(),
        };
        for id in cluster.ids() {
            if !cluster.options.started_later.contains(&id) {
                cluster.spawn(id);
            }
        }
        Ok(cluster)
    }

    /// The bootstrap members' `--members` value (`ID=PEER/CLIENT,...`): what a data dir
    /// seeded offline for this cluster (`cairn snapshot restore --offline`, `cairn recover`)
    /// must name, before [`Cluster::spawn`] starts its node ([`ClusterOptions::started_later`]).
    pub fn bootstrap_members(&self) -> &str {
        &self.members
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A handle on every node's lifetime (see [`Lifetimes`]), kept up to date by
    /// [`Cluster::spawn`] for as long as the cluster lives.
    pub fn lifetimes(&self) -> Lifetimes {
        self.lifetimes.clone()
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

    /// Runs node `id` from `binary` from its next start on ([`Cluster::spawn`],
    /// [`Cluster::restart`]), with the same data dir and arguments: a rolling upgrade, or a
    /// rollback, of one member. The running process, if any, is left alone.
    pub fn set_binary(&mut self, id: u64, binary: impl Into<PathBuf>) {
        self.node_mut(id).binary = Some(binary.into());
    }

    /// The binary node `id` runs from its next start: [`Cluster::set_binary`]'s, or
    /// [`ClusterOptions::binary`].
    pub fn binary_of(&self, id: u64) -> &Path {
        self.node(id)
            .binary
            .as_deref()
            .unwrap_or(&self.options.binary)
    }

    /// The flags (`--name`) of node `id`'s next `cairn agent` start, in order, without their
    /// values: what a build must know to be started by this harness.
    pub fn agent_flags(&self, id: u64) -> Vec<String> {
        agent_args(&self.options, self.node(id))
            .iter()
            .filter_map(|a| a.to_str())
            .filter(|a| a.starts_with("--"))
            .map(str::to_owned)
            .collect()
    }

    /// A [`StatusProbe`] of the cluster's nodes as they are now (nodes added later are not
    /// in it).
    pub fn status_probe(&self) -> StatusProbe {
        StatusProbe {
            addresses: self
                .nodes
                .iter()
                .map(|n| (n.id, n.client_address.clone()))
                .collect(),
            client_tls: self.options.client_tls.clone(),
            admin_token: self.options.admin_token.clone(),
        }
    }

    /// Every node's id but `id`'s (the survivors of a killed leader, say).
    pub fn ids_except(&self, id: u64) -> Vec<u64> {
        self.nodes
            .iter()
            .map(|n| n.id)
            .filter(|n| *n != id)
            .collect()
    }

    /// Client addresses of every node (running or not).
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| n.client_address.clone())
            .collect()
    }

    /// Starts node `id`'s process with its data dir (a restart keeps the data), in
    /// the node's next lifetime ([`Cluster::lifetimes`]).
    pub fn spawn(&mut self, id: u64) {
        let options = self.options.clone();
        let lifetimes = self.lifetimes.clone();
        let node = self.node_mut(id);
        assert!(
            node.child.is_none() || !node.is_running(),
            "node {id} is already running"
        );
        // Before the process exists: nothing it answers can be taken for the old lifetime's.
        lifetimes.begin(id);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log_path)
            .expect("node log");
        let binary = node
            .binary
            .clone()
            .unwrap_or_else(|| options.binary.clone());
        let mut command = match &node.namespace {
            Some(namespace) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", namespace]).arg(&binary);
                c
            }
            None => Command::new(&binary),
        };
        if let Some(spec) = &node.faketime {
            let library = faketime_library().unwrap_or_else(|| {
                panic!("libfaketime is not installed (Debian package `faketime`)")
            });
            command
                .env("LD_PRELOAD", library)
                .env("FAKETIME", spec)
                .env("FAKETIME_DONT_RESET", "1");
        } else if options.live_clocks {
            let library = faketime_library().unwrap_or_else(|| {
                panic!("libfaketime is not installed (Debian package `faketime`)")
            });
            let file = clock_file(&node.log_path);
            if !file.exists() {
                write_clock_file(&file, "+0");
            }
            command
                .env("LD_PRELOAD", library)
                .env("FAKETIME_TIMESTAMP_FILE", &file)
                .env("FAKETIME_CACHE_DURATION", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .env("FAKETIME_DONT_RESET", "1");
        }
        command.envs(options.env.iter().map(|(k, v)| (k, v)));
        if let Some(limit) = node.nofile_limit {
            let limit = libc::rlimit {
                rlim_cur: limit as libc::rlim_t,
                rlim_max: limit as libc::rlim_t,
            };
            // SAFETY: setrlimit is async-signal-safe; the struct is copied into the closure.
            unsafe {
                command.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        // Opened here, written between fork and exec ("0": the writing process itself), so
        // that everything the node allocates is charged to its cgroup. Closed at exec.
        let cgroup_procs = node.memory_cgroup.as_ref().map(|cgroup| {
            let path = cgroup.procs_file();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()))
        });
        if let Some(procs) = &cgroup_procs {
            use std::os::fd::AsRawFd as _;
            let fd = procs.as_raw_fd();
            // SAFETY: write(2) is async-signal-safe; the fd stays open until after the spawn.
            unsafe {
                command.pre_exec(move || {
                    let text = b"0\n";
                    if libc::write(fd, text.as_ptr().cast(), text.len()) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        if options.die_with_parent {
            // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                command.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
        }
        let child = command
            .args(agent_args(&options, node))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        drop(cgroup_procs);
        node.child = Some(child);
    }

    /// Adds a new node that joins through `via` (a member's client address);
    /// returns its id once its process is started.
    pub fn add_joining_node(&mut self, via: &str) -> u64 {
        self.try_add_joining_node(via)
            .unwrap_or_else(|e| panic!("cannot add a node: {e}"))
    }

    /// As [`Cluster::add_joining_node`], with placement errors returned.
    pub fn try_add_joining_node(&mut self, via: &str) -> Result<u64, String> {
        let id = self
            .highest_id
            .max(self.nodes.iter().map(|n| n.id).max().unwrap_or(0))
            + 1;
        self.highest_id = id;
        let mut node = place_node(&self.options, &self.root, id)?;
        node.bootstrap = vec!["--join".into(), via.to_string()];
        self.nodes.push(node);
        self.spawn(id);
        Ok(id)
    }

    /// Forgets node `id` after it left the cluster: kills it, unmounts its
    /// disk and removes its namespace. Its log stays.
    pub fn forget(&mut self, id: u64) {
        self.kill(id);
        if let Some(position) = self.nodes.iter().position(|n| n.id == id) {
            let node = self.nodes.remove(position);
            if let Some(disk) = node.disk {
                let _ = disk.unmount();
            }
        }
        if let Some(lab) = &self.options.network {
            lab.remove_node(id);
        }
    }

    /// Power cut: `kill -9` the node, then drop everything its disk had not
    /// made durable. Panics without [`ClusterOptions::powercut`].
    pub fn cut_power(&mut self, id: u64) {
        self.kill(id);
        let node = self.node(id);
        let disk = node
            .disk
            .as_ref()
            .unwrap_or_else(|| panic!("node {id} has no power-cut disk"));
        disk.cut_power();
    }

    /// Whether the nodes run with clock files ([`ClusterOptions::live_clocks`]).
    pub fn live_clocks(&self) -> bool {
        self.options.live_clocks
    }

    /// With [`ClusterOptions::live_clocks`]: sets the running node `id`'s wall clock to
    /// libfaketime's `spec` (`+9s`, `-120s`, `+0 x2`...; `+0` is the real clock) within
    /// about a second, without a restart.
    pub fn set_clock(&self, id: u64, spec: &str) {
        assert!(self.options.live_clocks, "set_clock needs live_clocks");
        write_clock_file(&clock_file(&self.node(id).log_path), spec);
    }

    /// Sets (or clears) node `id`'s libfaketime spec for its next start.
    pub fn set_faketime(&mut self, id: u64, spec: Option<String>) {
        self.node_mut(id).faketime = spec;
    }

    /// `kill -9`: the process dies at once, with whatever it had not persisted.
    pub fn kill(&mut self, id: u64) {
        let node = self.node_mut(id);
        if let Some(mut c) = node.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait (bounded) for a graceful exit; `kill -9` after 20 s.
    pub fn stop(&mut self, id: u64) {
        self.terminate(id);
        if self.wait_exit(id, Duration::from_secs(20)).is_none() {
            self.kill(id);
        }
    }

    /// Sends SIGTERM and returns at once (see [`Cluster::wait_exit`]).
    pub fn terminate(&mut self, id: u64) {
        if let Some(pid) = self.node(id).pid() {
            signal(pid, libc::SIGTERM);
        }
    }

    /// Waits (bounded) for node `id`'s process to end on its own; returns how it ended, or
    /// `None` if it still runs after `timeout` (it is left running).
    pub fn wait_exit(&mut self, id: u64, timeout: Duration) -> Option<std::process::ExitStatus> {
        let node = self.node_mut(id);
        let child = node.child.as_mut()?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                node.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, then waits (bounded) for node `id` to exit without blocking the runtime, so
    /// that the workloads keep running meanwhile; returns how it ended, or `None` if it still
    /// ran after `timeout` (it is then killed with `kill -9`). `None` too for a node that was
    /// not running.
    pub async fn stop_gracefully(
        &mut self,
        id: u64,
        timeout: Duration,
    ) -> Option<std::process::ExitStatus> {
        self.node(id).pid()?;
        self.terminate(id);
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.wait_exit(id, Duration::ZERO) {
                return Some(status);
            }
            if Instant::now() >= deadline {
                self.kill(id);
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Blocks every operation on node `id`'s power-cut disk until the returned guard is
    /// dropped: storage that hangs. Panics without [`ClusterOptions::powercut`].
    pub fn freeze_disk(&self, id: u64) -> cairn_powercut_fs::Freeze {
        self.node(id)
            .disk
            .as_ref()
            .unwrap_or_else(|| panic!("node {id} has no power-cut disk"))
            .freeze()
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

    /// How node `id`'s process ended, if it was started and has ended without the harness
    /// killing or stopping it ([`Cluster::kill`] and [`Cluster::stop`] forget the process):
    /// a node that stopped by itself.
    pub fn exited(&mut self, id: u64) -> Option<std::process::ExitStatus> {
        self.node_mut(id)
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// A node that exited by itself: its exit status and the end of its log.
    pub fn exit_report(&self, id: u64, status: std::process::ExitStatus) -> String {
        let tail: Vec<String> = self
            .log_tail(id, 8)
            .lines()
            .map(|line| line.chars().take(400).collect())
            .collect();
        format!(
            "node {id} exited by itself ({status}); the end of its log ({}):\n    {}",
            self.node(id).log_path.display(),
            tail.join("\n    ")
        )
    }

    /// Fails, with [`Cluster::exit_report`], when a node exited by itself.
    pub fn check_all_running(&mut self) -> Result<(), String> {
        for id in self.ids() {
            if let Some(status) = self.exited(id) {
                return Err(self.exit_report(id, status));
            }
        }
        Ok(())
    }

    /// Waits until the (re)started node `id` has applied the leader's commit index (read
    /// once `id` answers); fails if it, or any other node, exits meanwhile, or if it has not
    /// caught up within `timeout`. Returns (the index it reached, how long it took).
    pub async fn wait_caught_up(
        &mut self,
        id: u64,
        timeout: Duration,
    ) -> Result<(u64, Duration), String> {
        let started = Instant::now();
        let deadline = started + timeout;
        let mut target: Option<u64> = None;
        let mut applied = 0u64;
        loop {
            self.check_all_running()?;
            if target.is_none() {
                if let Some(leader) = self.leader().await {
                    target = self.status(leader).await.map(|s| s.commit_index);
                }
            }
            if let Some(status) = self.status(id).await {
                applied = status.applied_index;
                if target.is_some_and(|t| applied >= t) {
                    return Ok((applied, started.elapsed()));
                }
            }
            if Instant::now() >= deadline {
                let target = target.map_or("unknown (no leader)".to_string(), |t| t.to_string());
                return Err(format!(
                    "node {id} did not catch up within {timeout:?} of its restart: it \
                     applied {applied}, the leader's commit index was {target}; the end of its \
                     log ({}):\n    {}",
                    self.node(id).log_path.display(),
                    self.log_tail(id, 8).replace('\n', "\n    ")
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Node `id`'s memory cgroup (with [`ClusterOptions::memory_limit_bytes`]).
    pub fn memory_cgroup(&self, id: u64) -> Option<&crate::memcg::MemoryCgroup> {
        self.node(id).memory_cgroup.as_ref()
    }

    /// The last `lines` lines of node `id`'s log (for failure messages).
    pub fn log_tail(&self, id: u64, lines: usize) -> String {
        let log = self.log_of(id);
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The node's log so far (for failure messages).
    pub fn log_of(&self, id: u64) -> String {
        std::fs::read_to_string(&self.node(id).log_path).unwrap_or_default()
    }

    /// An admin client of `address`, over TLS when the options say so,
    /// carrying [`ClusterOptions::admin_token`].
    pub async fn admin(
        &self,
        address: &str,
    ) -> Result<AdminServiceClient<cairn_client::AuthenticatedChannel>, String> {
        admin_client(
            self.options.client_tls.as_ref(),
            self.options.admin_token.as_deref(),
            address,
        )
        .await
    }

    /// The admin status of node `id`, if it answers within a second.
    pub async fn status(&self, id: u64) -> Option<StatusResponse> {
        status_at(
            self.options.client_tls.as_ref(),
            self.options.admin_token.as_deref(),
            &self.node(id).client_address,
        )
        .await
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

    /// The node that calls itself leader and whom a majority of the nodes
    /// name as leader, if any (each status asked with a 1 s bound).
    pub async fn leader(&self) -> Option<u64> {
        let mut statuses = Vec::new();
        for id in self.ids() {
            statuses.extend(self.status(id).await);
        }
        cairn_client::admin::confirmed_leader(&statuses, self.nodes.len()).map(|s| s.node_id)
    }

    /// Calls `RemoveMember(id)` at the leader (bounded by `timeout`).
    pub async fn remove_member(
        &self,
        id: u64,
        timeout: Duration,
    ) -> Result<MembershipResponse, String> {
        let deadline = Instant::now() + timeout;
        let mut last = String::from("no leader found");
        while Instant::now() < deadline {
            if let Some(leader) = self.leader().await {
                let address = self.node(leader).client_address.clone();
                let call = async {
                    let mut c = self.admin(&address).await?;
                    c.remove_member(RemoveMemberRequest { id, force: false })
                        .await
                        .map(|r| r.into_inner())
                        .map_err(|e| e.to_string())
                };
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, call).await {
                    Ok(Ok(r)) => return Ok(r),
                    Ok(Err(e)) => last = e,
                    Err(_) => last = "timed out".into(),
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(format!("removing node {id}: {last}"))
    }

    /// Asks the leader to hand leadership to `to` (0 = the most up-to-date
    /// voter); returns the former leader.
    /// Asks the leader to hand leadership to `to`. A transfer the leader answers Unavailable
    /// (the target did not catch up or win in time: a loaded machine) is asked again, as an
    /// operator would, until `timeout`. Returns the leader it transferred from.
    pub async fn transfer_leader(&self, to: u64, timeout: Duration) -> Result<u64, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let leader = self.leader().await.ok_or("no leader to transfer from")?;
            if leader == to {
                return Ok(leader);
            }
            let address = self.node(leader).client_address.clone();
            let call = async {
                let mut c = self.admin(&address).await.map_err(|e| (false, e))?;
                c.transfer_leader(TransferLeaderRequest { to })
                    .await
                    .map(|_| ())
                    .map_err(|e| (e.code() == tonic::Code::Unavailable, e.to_string()))
            };
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, call).await {
                Ok(Ok(())) => return Ok(leader),
                Ok(Err((true, _))) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok(Err((_, e))) => return Err(format!("transfer from {leader} to {to}: {e}")),
                Err(_) => return Err(format!("transfer from {leader} to {to}: timed out")),
            }
        }
    }

    pub async fn wait_for_leader(&self, timeout: Duration) -> u64 {
        let ids = self.ids();
        self.wait_for_leader_among(&ids, timeout).await
    }

    /// Waits until the membership node `at` reports has node `id` as a voter.
    pub async fn wait_voter(&self, at: u64, id: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.status(at).await {
                if s.members.iter().any(|m| m.id == id && m.voter) {
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
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

/// A temporary directory for a test's nodes. Removed when the test passes;
/// when it panics, the directory is kept and the tail of every `*.log` in it
/// is printed, so a failure on a CI machine that is gone afterwards still
/// shows what the nodes said.
pub struct ScratchDir {
    dir: Option<tempfile::TempDir>,
}

/// Lines of each node log printed when a test fails.
const LOG_TAIL_LINES: usize = 60;

impl ScratchDir {
    pub fn new() -> Result<ScratchDir, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        Ok(ScratchDir { dir: Some(dir) })
    }

    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("present until drop").path()
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let dir = self.dir.take().expect("present until drop").keep();
        let mut logs: Vec<PathBuf> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        logs.sort();
        for log in logs {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
            eprintln!("----- last {} lines of {} -----", tail.len(), log.display());
            for l in tail {
                eprintln!("{l}");
            }
        }
        eprintln!("----- test dir kept: {} -----", dir.display());
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
        // Processes are gone: the disks can be unmounted.
        for n in &mut self.nodes {
            if let Some(disk) = n.disk.take() {
                let _ = disk.unmount();
            }
        }
        if let Some(lab) = &self.options.network {
            for n in &self.nodes {
                lab.remove_node(n.id);
            }
        }
    }
}
