//! `example-controller`: the Counter controller of `cairn_example_controller`,
//! run against a cluster (`--endpoints`) or inside an embedded single node
//! (`--in-process --data-dir DIR`). The controller code is the same either
//! way; only the client differs. See `docs/controller.md`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use cairn_client::{Client, ResourceApi};
use cairn_server::config::{parse_members, Config, LogFormat};
use cairn_server::embed::EmbeddedNode;
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "example-controller",
    about = "Keeps every demo.v1.Counter's status saying whether its value is even or odd"
)]
struct Args {
    /// Run against this cluster's client addresses, HOST:PORT,... (e.g. `cairn dev`'s).
    #[arg(
        long,
        value_delimiter = ',',
        required_unless_present = "in_process",
        conflicts_with = "in_process"
    )]
    endpoints: Vec<String>,
    /// Start a single Cairn node in this process and run against it, in process.
    #[arg(long, requires = "data_dir")]
    in_process: bool,
    /// The embedded node's data dir (with --in-process).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The embedded node's client address: other programs (`cairn read`, ...) reach it there.
    #[arg(long, default_value = "127.0.0.1:7501")]
    client_address: String,
    /// The embedded node's peer address.
    #[arg(long, default_value = "127.0.0.1:8501")]
    peer_address: String,
    /// With --endpoints: the election the replicas hold, so that only one reconciles.
    #[arg(long, default_value = "example-controller")]
    election: String,
    /// This replica's name in the election (default: host name and process id).
    #[arg(long)]
    replica: Option<String>,
    /// The TTL of this replica's lease: how long after it dies another takes over.
    #[arg(long, default_value_t = 3_000)]
    lease_ttl_ms: u64,
    /// error, warn, info, debug, trace, or a filter such as info,cairn_server=debug
    /// (the node's own log filter, `cairn agent --log-level`).
    #[arg(long, default_value = "info")]
    log_level: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    // The node's own logging, as `cairn agent` sets it up.
    cairn_server::logging::init(&args.log_level, LogFormat::Text);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("example-controller: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("example-controller: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Ctrl-C or SIGTERM, as a flag every replica loop reads.
fn stop_signal() -> tokio::sync::watch::Receiver<bool> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        self::stopped().await;
        let _ = stop.send(true);
    });
    stopped
}

/// Ctrl-C or SIGTERM.
async fn stopped() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
}

/// One replica against a cluster: it campaigns for the election, reconciles only while it
/// holds it (every write fenced with its token), and campaigns again when it loses it.
/// A stop resigns, so another replica takes over at once.
async fn replica(client: Client, args: &Args) -> anyhow::Result<()> {
    let mut stop = stop_signal();
    let identity = args
        .replica
        .clone()
        .unwrap_or_else(|| format!("{}:{}", hostname(), std::process::id()));
    let election = cairn_client::Election::new(client.clone(), args.election.clone(), None);
    let ttl = std::time::Duration::from_millis(args.lease_ttl_ms);
    while !*stop.borrow() {
        let lease = match client.grant_lease(ttl).await {
            Ok(lease) => lease,
            Err(e) => {
                // A cluster still rising to version 0.2, or between leaders.
                tracing::warn!(error = %e, "cannot grant a lease yet; trying again");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                continue;
            }
        };
        tracing::info!(election = %args.election, replica = %identity, "waiting to lead");
        let leadership = tokio::select! {
            won = election.campaign(&lease, identity.clone()) => match won {
                Ok(leadership) => leadership,
                Err(e) => {
                    tracing::warn!(error = %e, "campaign failed; trying again");
                    continue;
                }
            },
            _ = stop.wait_for(|s| *s) => break,
        };
        tracing::info!(token = leadership.token(), replica = %identity, "leading: reconciling");
        let fenced: Arc<dyn ResourceApi> = Arc::new(cairn_example_controller::Fenced {
            client: client.clone(),
            fence: leadership.fence(),
        });
        let lost = leadership.lost();
        let mut stopping = stop.clone();
        let until = async move {
            tokio::select! {
                loss = lost => tracing::warn!(?loss, "lost the election: stopped reconciling"),
                _ = stopping.wait_for(|s| *s) => {}
            }
        };
        cairn_example_controller::run(fenced, until).await?;
        if *stop.borrow() {
            let _ = leadership.resign().await;
            let _ = lease.revoke().await;
        }
    }
    Ok(())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

async fn run(args: Args) -> anyhow::Result<()> {
    if !args.in_process {
        let client = Client::connect(&args.endpoints).await?;
        tracing::info!(endpoints = ?client.endpoints(), "running against the cluster");
        return replica(client, &args).await;
    }
    let data_dir = args.data_dir.context("--in-process needs --data-dir")?;
    let members = format!("1={}/{}", args.peer_address, args.client_address);
    let config = Config {
        node_id: 1,
        data_dir,
        client_address: args.client_address,
        peer_address: args.peer_address,
        members: parse_members(&members).map_err(anyhow::Error::msg)?,
        ..Config::default()
    };
    let mut node = EmbeddedNode::start(config).await?;
    tracing::info!(
        client_address = node.client_address(),
        "running in process, inside an embedded node"
    );
    let client: Arc<dyn ResourceApi> = Arc::new(node.client());
    let outcome = tokio::select! {
        result = cairn_example_controller::run(client, stopped()) => result.map_err(anyhow::Error::from),
        cause = node.fatal() => Err(anyhow::anyhow!("the embedded node stopped: {cause}")),
    };
    node.shutdown().await;
    outcome
}
