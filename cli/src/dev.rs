//! `cairn dev`: a local cluster of `cairn agent` child processes on loopback,
//! with data under one directory (default `.cairn-dev/`). Running it again
//! reuses the data when the layout matches and replaces it cleanly otherwise
//! (or with `--fresh`). Ctrl-C stops every node.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::builder::TypedValueParser;
use clap::Args;

use crate::common::exit;

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
}

fn layout(args: &DevArgs) -> Vec<Node> {
    (1..=args.nodes)
        .map(|id| Node {
            id,
            client: format!("127.0.0.1:{}", args.base_port as u32 + id),
            peer: format!("127.0.0.1:{}", args.base_port as u32 + 1000 + id),
        })
        .collect()
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
        ])
        .args(["--log-level", &args.log_level])
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

pub fn run(args: DevArgs) -> u8 {
    let nodes = layout(&args);
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
    let mut children = Vec::new();
    for node in &nodes {
        match spawn(&exe, &args, node, &members) {
            Ok(c) => children.push(c),
            Err(e) => {
                eprintln!("cairn dev: cannot start node {}: {e}", node.id);
                stop_all(&mut children);
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
            return exit::OK;
        }
        Some(Ok(status)) => status,
        Some(Err((why, log))) => {
            eprintln!("cairn dev: {why}");
            if !log.is_empty() {
                eprintln!("{log}");
            }
            stop_all(&mut children);
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
            "  node {}: client {}  peer {}  data {}/node-{}",
            n.id,
            n.client,
            n.peer,
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
    println!("\nPress Ctrl-C to stop the cluster.");
    runtime.block_on(stop_signals.recv());
    println!("\nStopping {} nodes...", children.len());
    stop_all(&mut children);
    exit::OK
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
            let why = match status.code() {
                Some(code) => format!("node {} exited with code {code}", node.id),
                None => format!("node {} was killed ({status})", node.id),
            };
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
