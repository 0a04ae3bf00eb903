//! `cairn bench`: its workloads and their flags. The load generator itself
//! (measurement window, histograms, reports, the failover probe) is
//! [`crate::bench`].

use clap::{Args, Subcommand};

use crate::bench::{
    failover, load, runtime, watch, BenchError, ConsistencyArg, FailoverArgs, LoadOptions,
};
use crate::cli::exit;

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
    Failover(FailoverArgs),
}

#[derive(Args)]
struct WriteArgs {
    #[command(flatten)]
    load: LoadOptions,
}

#[derive(Args)]
struct ReadArgs {
    #[command(flatten)]
    load: LoadOptions,
    #[arg(long, value_enum, default_value = "strong")]
    consistency: ConsistencyArg,
}

#[derive(Args)]
struct MixedArgs {
    #[command(flatten)]
    load: LoadOptions,
    #[arg(long, value_enum, default_value = "strong")]
    consistency: ConsistencyArg,
    /// Fraction of operations that are reads (the rest are writes).
    #[arg(long, default_value_t = 0.9)]
    read_fraction: f64,
}

#[derive(Args)]
struct WatchArgs {
    #[command(flatten)]
    load: LoadOptions,
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
                Workload::Write(a) => load::run(a.load, load::Mix::Write).await,
                Workload::Read(a) => load::run(a.load, load::Mix::Read(a.consistency)).await,
                Workload::List(a) => load::run(a.load, load::Mix::List(a.consistency)).await,
                Workload::CacheRead(a) => {
                    load::run(a.load, load::Mix::CacheRead(a.consistency)).await
                }
                Workload::Mixed(a) => {
                    if !(0.0..=1.0).contains(&a.read_fraction) {
                        return Err(BenchError::Option {
                            option: "--read-fraction",
                            reason: "must be between 0 and 1".into(),
                        });
                    }
                    load::run(
                        a.load,
                        load::Mix::Mixed {
                            consistency: a.consistency,
                            read_fraction: a.read_fraction,
                        },
                    )
                    .await
                }
                Workload::Watch(a) => watch::run(a.load, a.watchers, a.write_interval_ms).await,
                Workload::Failover(a) => failover::run(a).await,
            }
        })
    });
    match result {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("cairn bench: {e}");
            e.exit_code()
        }
    }
}
