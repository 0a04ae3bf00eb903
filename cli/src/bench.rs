//! `cairn bench`: its workloads and their flags. The load generator itself
//! (measurement window, histograms, reports, the failover probe) is
//! [`cairn_bench`]: this module hands it the cluster the global flags name
//! ([`cluster_of`]), the workload's options, and the report's format, and maps its
//! errors to the exit-code table ([`exit_code`]).

use clap::{Args, Subcommand};

use cairn_bench::{
    failover, load, runtime, watch, BenchError, Cluster, ConsistencyArg, FailoverArgs, Format,
    LoadOptions,
};

use crate::common::exit;
use crate::common::{ClusterArgs, OutputFormat};

/// `cairn bench WORKLOAD`.
#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    workload: Workload,
}

#[derive(Subcommand)]
enum Workload {
    /// Compare-and-set writes: creates of new keys, then updates of known ones.
    Write(WriteArgs),
    /// Reads of random keys (the key space is created first if missing).
    Read(ReadArgs),
    /// Lists of the whole bench namespace (size it with --key-space).
    List(ReadArgs),
    /// Reads and writes of random keys, in a ratio.
    Mixed(MixedArgs),
    /// Reads of random keys from a client WatchCache primed with the key space: strong =
    /// its consistent reads (a confirmed revision, then memory), eventual = memory only.
    CacheRead(ReadArgs),
    /// N watchers on random nodes; writers at the leader; delivery latency.
    Watch(WatchArgs),
    /// kill -9 the leader, then time the first successful write through a survivor.
    Failover(FailoverRun),
    /// Grant N leases and keep them alive at their TTL: the nodes' CPU and memory per lease.
    Leases(LeasesRun),
    /// A holder stops renewing: time to the next holder's first accepted fenced write.
    Election(ElectionRun),
}

#[derive(Args)]
struct LeasesRun {
    /// The cluster (`--endpoints`), and how to reach it: `--token`, TLS.
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    options: cairn_bench::leases::LeasesArgs,
    #[arg(short, long, value_enum, default_value = "table")]
    output: OutputFormat,
}

#[derive(Args)]
struct ElectionRun {
    /// The cluster (`--endpoints`), and how to reach it: `--token`, TLS.
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    options: cairn_bench::leases::ElectionArgs,
    #[arg(short, long, value_enum, default_value = "table")]
    output: OutputFormat,
}

/// What every load workload takes: the cluster, the load's own options, the report's
/// format.
#[derive(Args)]
struct LoadArgs {
    /// The cluster (`--endpoints`), and how to reach it: `--token`, TLS.
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    options: LoadOptions,
    #[arg(short, long, value_enum, default_value = "table")]
    output: OutputFormat,
}

/// `cairn bench failover`: the cluster, the measurement's options, the report's format.
#[derive(Args)]
struct FailoverRun {
    /// The cluster (`--endpoints`), and how to reach it: `--token`, TLS.
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    options: FailoverArgs,
    #[arg(short, long, value_enum, default_value = "table")]
    output: OutputFormat,
}

#[derive(Args)]
struct WriteArgs {
    #[command(flatten)]
    load: LoadArgs,
}

#[derive(Args)]
struct ReadArgs {
    #[command(flatten)]
    load: LoadArgs,
    #[arg(long, value_enum, default_value = "strong")]
    consistency: ConsistencyArg,
}

#[derive(Args)]
struct MixedArgs {
    #[command(flatten)]
    load: LoadArgs,
    #[arg(long, value_enum, default_value = "strong")]
    consistency: ConsistencyArg,
    /// Fraction of operations that are reads (the rest are writes).
    #[arg(long, default_value_t = 0.9)]
    read_fraction: f64,
}

#[derive(Args)]
struct WatchArgs {
    #[command(flatten)]
    load: LoadArgs,
    /// Watch streams, each on a node picked at random.
    #[arg(long, default_value_t = 1_000)]
    watchers: usize,
    /// Pause between two writes of one writer (--clients is the writer count), in ms.
    #[arg(long = "write-interval-ms", default_value_t = 20)]
    write_interval_ms: u64,
}

pub fn run(args: BenchArgs) -> u8 {
    let result = runtime().and_then(|runtime| {
        runtime.block_on(async move {
            match args.workload {
                Workload::Write(a) => a.load.run(load::Mix::Write).await,
                Workload::Read(a) => a.load.run(load::Mix::Read(a.consistency)).await,
                Workload::List(a) => a.load.run(load::Mix::List(a.consistency)).await,
                Workload::CacheRead(a) => a.load.run(load::Mix::CacheRead(a.consistency)).await,
                Workload::Mixed(a) => {
                    if !(0.0..=1.0).contains(&a.read_fraction) {
                        return Err(BenchError::Option {
                            option: "--read-fraction",
                            reason: "must be between 0 and 1".into(),
                        });
                    }
                    a.load
                        .run(load::Mix::Mixed {
                            consistency: a.consistency,
                            read_fraction: a.read_fraction,
                        })
                        .await
                }
                Workload::Watch(a) => {
                    let load = a.load;
                    watch::run(
                        &cluster_of(&load.cluster),
                        load.options,
                        a.watchers,
                        a.write_interval_ms,
                        format_of(load.output),
                    )
                    .await
                }
                Workload::Failover(a) => {
                    failover::run(&cluster_of(&a.cluster), a.options, format_of(a.output)).await
                }
                Workload::Leases(a) => {
                    cairn_bench::leases::run(
                        &cluster_of(&a.cluster),
                        a.options,
                        format_of(a.output),
                    )
                    .await
                }
                Workload::Election(a) => {
                    cairn_bench::leases::election(
                        &cluster_of(&a.cluster),
                        a.options,
                        format_of(a.output),
                    )
                    .await
                }
            }
        })
    });
    match result {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("cairn bench: {e}");
            exit_code(&e)
        }
    }
}

impl LoadArgs {
    async fn run(self, mix: load::Mix) -> Result<(), BenchError> {
        load::run(
            &cluster_of(&self.cluster),
            self.options,
            mix,
            format_of(self.output),
        )
        .await
    }
}

/// The cluster the flags name, as the load generator takes it.
pub fn cluster_of(cluster: &ClusterArgs) -> Cluster {
    Cluster {
        endpoints: cluster.endpoints.clone(),
        token: cluster.token.clone(),
        tls: cluster.tls.options(&cluster.endpoints),
    }
}

/// `-o` as a report's format.
fn format_of(output: OutputFormat) -> Format {
    match output {
        OutputFormat::Table => Format::Table,
        OutputFormat::Json => Format::Json,
    }
}

/// The exit code of a bench error, by the one table ([`crate::common`]): a bad option or
/// unusable credentials are usage errors, an unreachable cluster is unavailable, a node's
/// answer exits by its kind.
pub fn exit_code(e: &BenchError) -> u8 {
    match e {
        BenchError::Option { .. } | BenchError::Access(_) | BenchError::Endpoint { .. } => {
            exit::USAGE
        }
        BenchError::Api(e) => crate::common::exit_code_of_kind(e.kind()),
        BenchError::Connect { .. } | BenchError::Unreachable(_) | BenchError::NoLeader(_) => {
            exit::UNAVAILABLE
        }
        BenchError::Setup(_) => exit::ERROR,
    }
}
