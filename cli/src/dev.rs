//! `cairn dev`: a local cluster of `cairn agent` child processes on loopback,
//! with data under one directory (default `.cairn-dev/`). Running it again
//! reuses the data when the layout matches and replaces it cleanly otherwise
//! (or with `--fresh`). Ctrl-C stops every node.
//!
//! It is built for drills: each node serves its ops listener (`/metrics`, `/livez`,
//! `/readyz`); when a node exits, `cairn dev` says which, how (exit code or signal) and
//! with the last line of its log, and with `--restart` starts it again after a delay.
//! While it runs it answers on a control socket, `DATA_DIR/control.sock`, one request
//! per connection (a line: `stop N term|kill`, `start N`, `restart N`, `isolate N`,
//! `heal`; answered `ok MESSAGE` or `error MESSAGE`): `cairn dev restart N` and the like,
//! and `cairn drill`, use it.
//!
//! `isolate N` cuts node N off from the other nodes, both ways, until `heal`: the nodes all
//! listen on loopback, so the partition is made with a `net_cls` cgroup per node and an
//! nftables table matching their packets ([`jepsen_tests::loopback`]), made on first use;
//! it needs root, and says why not otherwise.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::builder::TypedValueParser;
use clap::Args;

use crate::common::exit;
use jepsen_tests::loopback::LoopbackNet;

#[derive(Args)]
pub struct DevArgs {
    /// Number of nodes: 3 or 5.
    #[arg(long, default_value_t = 3, value_parser = clap::builder::PossibleValuesParser::new(["3", "5"]).map(|s| s.parse::<u32>().expect("3 or 5")))]
    nodes: u32,
    /// Where the nodes keep their data.
    #[arg(long, default_value = ".cairn-dev")]
    data_dir: PathBuf,
    /// Client ports are BASE+1.., peer ports BASE+1001..
    #[arg(long, default_value_t = 7000)]
    base_port: u16,
    /// Discard existing data and start a new cluster.
    #[arg(long)]
    fresh: bool,
    /// Log level passed to every node (their logs go to DATA_DIR/node-N.log): error, warn,
    /// info, debug, trace, or a filter such as info,cairn_server::raft=debug.
    #[arg(long, default_value = "info", value_parser = parse_log_level)]
    log_level: String,
    /// Serve TLS (mutual TLS between nodes), with development certificates
    /// written by `cairn tls init DATA_DIR/tls` (kept across runs).
    #[arg(long)]
    tls: bool,
    /// Start a node that exited on its own again, after --restart-delay-ms.
    #[arg(long)]
    restart: bool,
    /// How long --restart waits before it starts a node again.
    #[arg(long, default_value_t = 2_000, requires = "restart")]
    restart_delay_ms: u64,
    /// More `cairn agent` flags for every node, after `--` (`cairn dev -- --log-format json`).
    #[arg(last = true, value_name = "AGENT_FLAGS")]
    agent_flags: Vec<String>,
    #[command(subcommand)]
    action: Option<DevAction>,
}

/// `cairn dev restart N` and the like: asks the `cairn dev` running on DATA_DIR.
#[derive(clap::Subcommand)]
pub enum DevAction {
    /// Stop node N (SIGTERM, a graceful stop) and start it again.
    Restart(NodeArgs),
    /// Stop node N: SIGTERM, or SIGKILL with --kill. `cairn dev` does not restart it.
    Stop {
        #[command(flatten)]
        node: NodeArgs,
        /// SIGKILL, as a crash would.
        #[arg(long)]
        kill: bool,
    },
    /// Start node N, stopped by `cairn dev stop`, again.
    Start(NodeArgs),
    /// Cut node N off from the other nodes, both ways (clients still reach it), until
    /// `cairn dev heal`. Needs root (nftables and a net_cls cgroup per node).
    Isolate(NodeArgs),
    /// Undo `cairn dev isolate`: every node hears every other again.
    Heal {
        /// The running `cairn dev`'s data dir.
        #[arg(long, default_value = ".cairn-dev")]
        data_dir: PathBuf,
    },
}

#[derive(Args)]
pub struct NodeArgs {
    /// The node's id (1..=nodes).
    id: u32,
    /// The running `cairn dev`'s data dir.
    #[arg(long, default_value = ".cairn-dev")]
    data_dir: PathBuf,
}

/// `--log-level`: a value the nodes' `log_level` takes
/// ([`cairn_server::logging::check_log_level`]), refused by clap otherwise.
fn parse_log_level(value: &str) -> Result<String, String> {
    cairn_server::logging::check_log_level(value).map(|()| value.to_string())
}

struct Node {
    id: u32,
    client: String,
    peer: String,
    /// The ops listener: /metrics, /livez, /readyz, the console (/ui).
    ops: String,
}

/// Client ports are BASE+N, peer ports BASE+1000+N, ops ports BASE+2000+N.
const OPS_PORT_OFFSET: u32 = 2000;

fn layout(args: &DevArgs) -> Result<Vec<Node>, String> {
    let highest = u32::from(args.base_port) + OPS_PORT_OFFSET + args.nodes;
    if highest > u32::from(u16::MAX) {
        return Err(format!(
            "--base-port {} leaves no room for the ops ports (up to {highest})",
            args.base_port
        ));
    }
    Ok((1..=args.nodes)
        .map(|id| {
            let port = |offset: u32| u32::from(args.base_port) + offset + id;
            Node {
                id,
                client: format!("127.0.0.1:{}", port(0)),
                peer: format!("127.0.0.1:{}", port(1000)),
                ops: format!("127.0.0.1:{}", port(OPS_PORT_OFFSET)),
            }
        })
        .collect())
}

/// The client addresses of the `cairn dev` cluster in `data_dir`, by node id, from the
/// layout it wrote (`ID=PEER/CLIENT,...`).
pub fn client_addresses(data_dir: &Path) -> Result<Vec<(u64, String)>, String> {
    let marker = data_dir.join("layout");
    let text = std::fs::read_to_string(&marker).map_err(|e| {
        format!(
            "no cairn dev cluster in {} (cannot read {}: {e})",
            data_dir.display(),
            marker.display()
        )
    })?;
    text.trim()
        .split(',')
        .map(|member| {
            let parsed = member.split_once('=').and_then(|(id, addresses)| {
                let id = id.parse::<u64>().ok()?;
                let (_peer, client) = addresses.split_once('/')?;
                Some((id, client.to_string()))
            });
            parsed.ok_or_else(|| format!("{} names a member {member:?}", marker.display()))
        })
        .collect()
}

/// The control socket of the `cairn dev` running on `data_dir`.
fn control_socket(data_dir: &Path) -> PathBuf {
    data_dir.join("control.sock")
}

/// Sends one request to the `cairn dev` running on `data_dir`; its answer's message.
pub async fn control(data_dir: &Path, request: &str) -> Result<String, String> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let socket = control_socket(data_dir);
    let talk = async {
        let mut stream = tokio::net::UnixStream::connect(&socket)
            .await
            .map_err(|e| {
                format!(
                    "no cairn dev is running on {} (its control socket {}: {e})",
                    data_dir.display(),
                    socket.display()
                )
            })?;
        stream
            .write_all(format!("{request}\n").as_bytes())
            .await
            .map_err(|e| format!("cannot ask cairn dev: {e}"))?;
        let mut answer = String::new();
        tokio::io::BufReader::new(stream)
            .read_line(&mut answer)
            .await
            .map_err(|e| format!("cairn dev did not answer: {e}"))?;
        Ok::<String, String>(answer)
    };
    // A stop waits up to STOP_TIMEOUT for the node to end, then kills it.
    let answer = tokio::time::timeout(STOP_TIMEOUT * 2, talk)
        .await
        .map_err(|_| format!("cairn dev did not answer {request:?} in time"))??;
    match answer.trim_end().split_once(' ') {
        Some(("ok", message)) => Ok(message.to_string()),
        Some(("error", message)) => Err(message.to_string()),
        _ => Err(format!("cairn dev answered {answer:?}")),
    }
}

/// `cairn dev restart|stop|start N`.
fn run_action(action: DevAction) -> u8 {
    let (data_dir, request) = match &action {
        DevAction::Restart(node) => (&node.data_dir, format!("restart {}", node.id)),
        DevAction::Stop { node, kill } => (
            &node.data_dir,
            format!("stop {} {}", node.id, if *kill { "kill" } else { "term" }),
        ),
        DevAction::Start(node) => (&node.data_dir, format!("start {}", node.id)),
        DevAction::Isolate(node) => (&node.data_dir, format!("isolate {}", node.id)),
        DevAction::Heal { data_dir } => (data_dir, "heal".to_string()),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match runtime.block_on(control(data_dir, &request)) {
        Ok(message) => {
            out!("{message}");
            exit::OK
        }
        Err(why) => {
            eprintln!("cairn dev: {why}");
            exit::ERROR
        }
    }
}

fn prepare_dir(args: &DevArgs, nodes: &[Node]) -> std::io::Result<()> {
    let marker = args.data_dir.join("layout");
    let wanted = nodes
        .iter()
        .map(|n| format!("{}={}/{}", n.id, n.peer, n.client))
        .collect::<Vec<_>>()
        .join(",");
    let existing = std::fs::read_to_string(&marker).ok();
    if args.fresh || existing.as_deref().is_some_and(|e| e.trim() != wanted) {
        if args.data_dir.exists() {
            println!(
                "Replacing the data in {} (new layout or --fresh).",
                args.data_dir.display()
            );
            std::fs::remove_dir_all(&args.data_dir)?;
        }
    } else if existing.is_some() {
        println!("Reusing the cluster data in {}.", args.data_dir.display());
    }
    std::fs::create_dir_all(&args.data_dir)?;
    std::fs::write(&marker, &wanted)
}

/// Where node `id` logs (its stdout and stderr).
fn log_file(data_dir: &Path, id: u32) -> PathBuf {
    data_dir.join(format!("node-{id}.log"))
}

fn tls_dir(args: &DevArgs) -> PathBuf {
    args.data_dir.join("tls")
}

fn spawn(exe: &Path, args: &DevArgs, node: &Node, members: &str) -> std::io::Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_file(&args.data_dir, node.id))?;
    let mut command = Command::new(exe);
    if args.tls {
        let dir = tls_dir(args);
        let id = u64::from(node.id);
        command
            .arg("agent")
            .arg("--tls-cert-file")
            .arg(crate::tls::node_cert_file(&dir, id))
            .arg("--tls-key-file")
            .arg(crate::tls::node_key_file(&dir, id))
            .arg("--tls-ca-file")
            .arg(crate::tls::ca_file(&dir));
    } else {
        command.arg("agent");
    }
    command
        .args(["--node-id", &node.id.to_string()])
        .arg("--data-dir")
        .arg(args.data_dir.join(format!("node-{}", node.id)))
        .args([
            "--client-address",
            &node.client,
            "--peer-address",
            &node.peer,
            "--members",
            members,
            "--metrics-address",
            &node.ops,
        ])
        .args(["--log-level", &args.log_level])
        .args(&args.agent_flags)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // A node gets SIGTERM when `cairn dev` dies, however it dies (SIGKILL included): a dev
    // cluster never outlives the command that started it.
    // SAFETY: prctl(PR_SET_PDEATHSIG) in the child between fork and exec: async-signal-safe,
    // touches no memory of ours.
    unsafe {
        use std::os::unix::process::CommandExt;
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.spawn()
}

pub fn run(mut args: DevArgs) -> u8 {
    if let Some(action) = args.action.take() {
        return run_action(action);
    }
    let nodes = match layout(&args) {
        Ok(nodes) => nodes,
        Err(why) => {
            eprintln!("cairn dev: {why}");
            return exit::USAGE;
        }
    };
    if let Err(e) = prepare_dir(&args, &nodes) {
        eprintln!("cairn dev: cannot prepare {}: {e}", args.data_dir.display());
        return exit::ERROR;
    }
    let access = if args.tls {
        let dir = tls_dir(&args);
        let init = crate::tls::InitArgs {
            dir: dir.clone(),
            nodes: args.nodes,
            hosts: vec![],
            client_name: "cairn-dev-client".into(),
            force: false,
        };
        if let Err(e) = crate::tls::init(&init) {
            eprintln!(
                "cairn dev: cannot write certificates in {}: {e}",
                dir.display()
            );
            return exit::ERROR;
        }
        let options = cairn_client::TlsOptions {
            ca_file: Some(crate::tls::ca_file(&dir)),
            cert_file: Some(crate::tls::client_cert_file(&dir)),
            key_file: Some(crate::tls::client_key_file(&dir)),
        };
        match cairn_client::Access::from_options(Some(&options)) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("cairn dev: {e}");
                return exit::ERROR;
            }
        }
    } else {
        cairn_client::Access::plaintext()
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("cairn dev: cannot find my own executable: {e}");
            return exit::ERROR;
        }
    };
    let members = nodes
        .iter()
        .map(|n| format!("{}={}/{}", n.id, n.peer, n.client))
        .collect::<Vec<_>>()
        .join(",");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // Listening before any node starts: from now on Ctrl-C or SIGTERM stops the nodes
    // (their default action would end this process at once and leave the nodes running).
    let mut stop_signals = {
        let _entered = runtime.enter();
        match StopSignals::listen() {
            Ok(signals) => signals,
            Err(e) => {
                eprintln!("cairn dev: cannot listen for Ctrl-C and SIGTERM: {e}");
                return exit::ERROR;
            }
        }
    };
    let listener = {
        let _entered = runtime.enter();
        match bind_control(&args.data_dir) {
            Ok(listener) => listener,
            Err(why) => {
                eprintln!("cairn dev: {why}");
                return exit::ERROR;
            }
        }
    };
    let socket = control_socket(&args.data_dir);
    let mut children = Vec::new();
    for node in &nodes {
        match spawn(&exe, &args, node, &members) {
            Ok(c) => children.push(c),
            Err(e) => {
                eprintln!("cairn dev: cannot start node {}: {e}", node.id);
                stop_all(&mut children);
                let _ = std::fs::remove_file(&socket);
                return exit::ERROR;
            }
        }
    }
    let endpoints: Vec<String> = nodes.iter().map(|n| n.client.clone()).collect();
    let started = Instant::now();
    let waiting = async {
        let client = cairn_client::admin::AdminClient::new(
            endpoints.clone(),
            access.clone(),
            cairn_client::admin::ATTEMPT_TIMEOUT_MAX,
        );
        while started.elapsed() < Duration::from_secs(30) {
            // A node that stopped (a configuration it refused, a port in use) will not
            // come back: say so now, with its last words, rather than after 30 s.
            if let Some(stopped) = stopped_node(&args.data_dir, &nodes, &mut children) {
                return Err(stopped);
            }
            for status in client.statuses(&endpoints).await.into_iter().flatten() {
                if status.leader_id != 0 {
                    return Ok(status);
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err((
            format!(
                "no leader after 30 s; see the logs in {}",
                args.data_dir.display()
            ),
            String::new(),
        ))
    };
    let leader = runtime.block_on(async {
        tokio::select! {
            leader = waiting => Some(leader),
            () = stop_signals.recv() => None,
        }
    });
    let status = match leader {
        None => {
            println!("\nStopping {} nodes...", children.len());
            stop_all(&mut children);
            let _ = std::fs::remove_file(&socket);
            return exit::OK;
        }
        Some(Ok(status)) => status,
        Some(Err((why, log))) => {
            eprintln!("cairn dev: {why}");
            if !log.is_empty() {
                eprintln!("{log}");
            }
            stop_all(&mut children);
            let _ = std::fs::remove_file(&socket);
            return exit::ERROR;
        }
    };
    let scheme = if args.tls { "https://" } else { "" };
    let list = endpoints
        .iter()
        .map(|e| format!("{scheme}{e}"))
        .collect::<Vec<_>>()
        .join(",");
    println!(
        "Cairn dev cluster{}: {} nodes, leader is node {} (term {}).",
        if args.tls {
            " (TLS; mutual TLS between nodes)"
        } else {
            ""
        },
        nodes.len(),
        status.leader_id,
        status.term
    );
    for n in &nodes {
        println!(
            "  node {}: client {}  peer {}  ops http://{} (/metrics /livez /readyz /ui)  data {}/node-{}",
            n.id,
            n.client,
            n.peer,
            n.ops,
            args.data_dir.display(),
            n.id
        );
    }
    println!("\nTry, in another terminal:");
    println!("  export CAIRN_ENDPOINTS={list}");
    if args.tls {
        let dir = tls_dir(&args);
        println!(
            "  export CAIRN_CACERT={} CAIRN_CERT={} CAIRN_KEY={}",
            crate::tls::ca_file(&dir).display(),
            crate::tls::client_cert_file(&dir).display(),
            crate::tls::client_key_file(&dir).display()
        );
    }
    println!("  cairn status");
    println!("  cairn write --type demo.v1.Thing --name hello --data-json '{{\"hi\": 1}}'");
    println!("  cairn watch --type demo.v1.Thing");
    println!("  cairn drill failover");
    println!("  cairn dev restart 2{}", data_dir_flag(&args));
    if args.restart {
        println!(
            "\nA node that exits is started again after {} ms (--restart).",
            args.restart_delay_ms
        );
    }
    println!("\nPress Ctrl-C to stop the cluster.");
    let mut supervisor = Supervisor {
        exe,
        members,
        slots: nodes
            .into_iter()
            .zip(children)
            .map(|(node, child)| Slot {
                node,
                child: Some(child),
                restart_at: None,
            })
            .collect(),
        partitions: None,
    };
    runtime.block_on(async {
        loop {
            tokio::select! {
                () = stop_signals.recv() => break,
                accepted = listener.accept() => {
                    if let Ok((stream, _)) = accepted {
                        supervisor.serve(&args, stream).await;
                    }
                }
                () = tokio::time::sleep(WATCH_INTERVAL) => supervisor.watch(&args),
            }
        }
    });
    let Supervisor {
        slots, partitions, ..
    } = supervisor;
    let mut children: Vec<Child> = slots.into_iter().filter_map(|slot| slot.child).collect();
    println!("\nStopping {} nodes...", children.len());
    stop_all(&mut children);
    // After the nodes have left their cgroups: the drop removes the table and the cgroups.
    drop(partitions);
    let _ = std::fs::remove_file(&socket);
    exit::OK
}

/// How often `cairn dev` looks for nodes that exited.
const WATCH_INTERVAL: Duration = Duration::from_millis(200);

/// How long a stop waits for a node to end after SIGTERM before it kills it.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// The longest a control request may take to arrive.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds the control socket; refuses when another `cairn dev` answers on it, and replaces a
/// socket file left by one that died.
fn bind_control(data_dir: &Path) -> Result<tokio::net::UnixListener, String> {
    let socket = control_socket(data_dir);
    if socket.exists() {
        if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            return Err(format!(
                "another cairn dev is running on {} (its control socket {} answers)",
                data_dir.display(),
                socket.display()
            ));
        }
        std::fs::remove_file(&socket)
            .map_err(|e| format!("cannot remove the stale {}: {e}", socket.display()))?;
    }
    tokio::net::UnixListener::bind(&socket)
        .map_err(|e| format!("cannot listen on {}: {e}", socket.display()))
}

/// One node under `cairn dev`.
struct Slot {
    node: Node,
    /// `None` while it is stopped (by a request, or it exited).
    child: Option<Child>,
    /// When `--restart` starts it again.
    restart_at: Option<Instant>,
}

/// The nodes `cairn dev` runs, and how to start them.
struct Supervisor {
    exe: PathBuf,
    members: String,
    slots: Vec<Slot>,
    /// The partitions between the nodes, once `isolate` asked for one.
    partitions: Option<LoopbackNet>,
}

impl Supervisor {
    /// Says which nodes exited on their own and how; with `--restart`, starts them again
    /// once their delay has passed.
    fn watch(&mut self, args: &DevArgs) {
        let partitions = &self.partitions;
        for slot in &mut self.slots {
            let id = slot.node.id;
            if let Some(child) = &mut slot.child {
                if let Ok(Some(status)) = child.try_wait() {
                    slot.child = None;
                    let last = last_log_line(&log_file(&args.data_dir, id));
                    println!(
                        "cairn dev: node {id} {}; the last line of its log: {last}",
                        describe_exit(status)
                    );
                    if args.restart {
                        println!(
                            "cairn dev: starting node {id} again in {} ms (--restart)",
                            args.restart_delay_ms
                        );
                        slot.restart_at =
                            Some(Instant::now() + Duration::from_millis(args.restart_delay_ms));
                    } else {
                        println!(
                            "cairn dev: start it again with: cairn dev start {id}{}",
                            data_dir_flag(args)
                        );
                    }
                }
            }
            if slot.restart_at.is_some_and(|at| Instant::now() >= at) {
                slot.restart_at = None;
                match spawn(&self.exe, args, &slot.node, &self.members) {
                    Ok(child) => {
                        println!("cairn dev: node {id} started again (pid {})", child.id());
                        if let Err(why) = attach(partitions, id, &child) {
                            println!("cairn dev: node {id}: {why}");
                        }
                        slot.child = Some(child);
                    }
                    Err(e) => println!("cairn dev: cannot start node {id} again: {e}"),
                }
            }
        }
    }

    /// Answers one control request (see the module docs).
    async fn serve(&mut self, args: &DevArgs, stream: tokio::net::UnixStream) {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
        let (read, mut write) = stream.into_split();
        let mut line = String::new();
        // A request is one short line: read at most 256 bytes of it.
        let mut reader = tokio::io::BufReader::new(read.take(256));
        let answer = match tokio::time::timeout(REQUEST_TIMEOUT, reader.read_line(&mut line)).await
        {
            Ok(Ok(_)) => match self.handle(args, line.trim()).await {
                Ok(message) => format!("ok {message}\n"),
                Err(why) => format!("error {why}\n"),
            },
            Ok(Err(e)) => format!("error unreadable request: {e}\n"),
            Err(_) => "error no request within 5 s\n".to_string(),
        };
        let _ = write.write_all(answer.as_bytes()).await;
    }

    async fn handle(&mut self, args: &DevArgs, request: &str) -> Result<String, String> {
        let words: Vec<&str> = request.split_whitespace().collect();
        let (verb, id, rest) = match words.as_slice() {
            ["heal"] => return self.heal(),
            [verb, id, rest @ ..] => (*verb, *id, rest),
            _ => return Err(unknown_request(request)),
        };
        let id: u32 = id.parse().map_err(|_| format!("{id:?} is not a node id"))?;
        let nodes = self.slots.len();
        let index = (id as usize)
            .checked_sub(1)
            .filter(|i| *i < nodes)
            .ok_or_else(|| format!("no node {id}: this cluster has nodes 1 to {nodes}"))?;
        match (verb, rest) {
            ("stop", ["term"]) => self.stop(index, libc::SIGTERM).await,
            ("stop", ["kill"]) => self.stop(index, libc::SIGKILL).await,
            ("start", []) => self.start(args, index),
            ("restart", []) => {
                let stopped = if self.slots[index].child.is_some() {
                    format!("{}; ", self.stop(index, libc::SIGTERM).await?)
                } else {
                    String::new()
                };
                Ok(format!("{stopped}{}", self.start(args, index)?))
            }
            ("isolate", []) => self.isolate(index),
            _ => Err(unknown_request(request)),
        }
    }

    /// Cuts node `index` off from every other node, both ways.
    fn isolate(&mut self, index: usize) -> Result<String, String> {
        let ids: Vec<u64> = self.slots.iter().map(|s| u64::from(s.node.id)).collect();
        let id = u64::from(self.slots[index].node.id);
        let net = self.loopback_net()?;
        net.partition(&jepsen_tests::net::shapes::isolate(id, &ids))?;
        let others: Vec<String> = ids
            .iter()
            .filter(|i| **i != id)
            .map(u64::to_string)
            .collect();
        Ok(format!(
            "node {id} is cut off from node(s) {} until `heal`",
            others.join(", ")
        ))
    }

    /// Ends every partition.
    fn heal(&mut self) -> Result<String, String> {
        match &mut self.partitions {
            Some(net) => {
                net.heal()?;
                Ok("every node hears every other node".into())
            }
            None => Ok("no partition was made".into()),
        }
    }

    /// The loopback partitions, made on first use with every running node in its cgroup.
    fn loopback_net(&mut self) -> Result<&mut LoopbackNet, String> {
        if self.partitions.is_none() {
            let ports = self
                .slots
                .iter()
                .map(|s| {
                    let port = |address: &str| {
                        address
                            .rsplit_once(':')
                            .and_then(|(_, p)| p.parse::<u16>().ok())
                            .expect("cairn dev's own addresses end with a port")
                    };
                    (
                        u64::from(s.node.id),
                        vec![port(&s.node.client), port(&s.node.peer)],
                    )
                })
                .collect();
            let net = LoopbackNet::new(ports)
                .map_err(|why| format!("cannot partition the nodes here: {why}"))?;
            for slot in &self.slots {
                if let Some(child) = &slot.child {
                    net.attach(u64::from(slot.node.id), child.id())?;
                }
            }
            self.partitions = Some(net);
        }
        Ok(self.partitions.as_mut().expect("made above"))
    }

    /// Stops node `index` with `signal` (SIGKILL after STOP_TIMEOUT); `cairn dev` leaves it
    /// stopped.
    async fn stop(&mut self, index: usize, signal: i32) -> Result<String, String> {
        let slot = &mut self.slots[index];
        let id = slot.node.id;
        slot.restart_at = None;
        let Some(child) = &mut slot.child else {
            return Err(format!("node {id} is not running"));
        };
        // SAFETY: kill(2) on our own child's pid, which we have not reaped yet.
        unsafe {
            libc::kill(child.id() as i32, signal);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                _ => {
                    let _ = child.kill();
                    match child.wait() {
                        Ok(status) => break status,
                        Err(e) => return Err(format!("cannot wait for node {id}: {e}")),
                    }
                }
            }
        };
        slot.child = None;
        Ok(format!("node {id} stopped: it {}", describe_exit(status)))
    }

    fn start(&mut self, args: &DevArgs, index: usize) -> Result<String, String> {
        let slot = &mut self.slots[index];
        let id = slot.node.id;
        if let Some(child) = &slot.child {
            return Err(format!("node {id} is already running (pid {})", child.id()));
        }
        let child = spawn(&self.exe, args, &slot.node, &self.members)
            .map_err(|e| format!("cannot start node {id}: {e}"))?;
        let pid = child.id();
        let attached = attach(&self.partitions, id, &child);
        slot.child = Some(child);
        slot.restart_at = None;
        attached.map_err(|why| format!("node {id} started (pid {pid}), but {why}"))?;
        Ok(format!("node {id} started (pid {pid})"))
    }
}

/// Puts a node just started in its partition cgroup, when partitions were made: a node
/// started again during a partition stays on its side.
fn attach(partitions: &Option<LoopbackNet>, id: u32, child: &Child) -> Result<(), String> {
    match partitions {
        Some(net) => net
            .attach(u64::from(id), child.id())
            .map_err(|why| format!("it could not be put on its side of the partition: {why}")),
        None => Ok(()),
    }
}

fn unknown_request(request: &str) -> String {
    format!("unknown request {request:?} (stop N term|kill, start N, restart N, isolate N, heal)")
}

/// ` --data-dir DIR` when it is not the default, for the commands `cairn dev` suggests.
fn data_dir_flag(args: &DevArgs) -> String {
    if args.data_dir == Path::new(".cairn-dev") {
        String::new()
    } else {
        format!(" --data-dir {}", args.data_dir.display())
    }
}

/// `exited with code 1`, `was killed by signal 9 (SIGKILL)`.
fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal} ({})", signal_name(signal)),
        _ => format!("ended ({status})"),
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        _ => "another signal",
    }
}

/// The last non-empty line of a node's log, or why there is none.
fn last_log_line(log: &Path) -> String {
    match std::fs::read_to_string(log) {
        Ok(text) => text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map_or_else(|| format!("({} is empty)", log.display()), str::to_string),
        Err(e) => format!("(cannot read {}: {e})", log.display()),
    }
}

/// The first node whose process has exited: what happened, and the last lines of its log.
fn stopped_node(
    data_dir: &Path,
    nodes: &[Node],
    children: &mut [Child],
) -> Option<(String, String)> {
    for (node, child) in nodes.iter().zip(children.iter_mut()) {
        if let Ok(Some(status)) = child.try_wait() {
            let log = log_file(data_dir, node.id);
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(10)..].join("\n");
            let why = format!("node {} {}", node.id, describe_exit(status));
            let why = if tail.is_empty() {
                format!("{why} (its log, {}, is empty)", log.display())
            } else {
                format!("{why}; the end of its log, {}:", log.display())
            };
            return Some((why, tail));
        }
    }
    None
}

/// Ctrl-C (SIGINT) and SIGTERM, listened to from before the first node starts.
struct StopSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Starts listening (inside a tokio runtime).
    fn listen() -> std::io::Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(StopSignals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// Waits for the first of them.
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {},
            _ = self.terminate.recv() => {},
        }
    }
}

fn stop_all(children: &mut [Child]) {
    for c in children.iter() {
        // SIGTERM: each node shuts down gracefully.
        unsafe {
            libc::kill(c.id() as i32, libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    for c in children.iter_mut() {
        loop {
            match c.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
            }
        }
    }
}
