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

async fn run(args: Args) -> anyhow::Result<()> {
    if !args.in_process {
        let client = Client::connect(&args.endpoints).await?;
        tracing::info!(endpoints = ?client.endpoints(), "running against the cluster");
        let client: Arc<dyn ResourceApi> = Arc::new(client);
        cairn_example_controller::run(client, stopped()).await?;
        return Ok(());
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
