//! Lease workloads (`docs/contract.md`, "Leases"):
//! - [`run`] (`cairn bench leases`): grants `--count` leases and keeps them all alive at
//!   their TTL (a keep-alive every third of it, over `--streams` KeepAlive streams, as a
//!   client library does), and reports what that costs the nodes: CPU per lease and
//!   second, and resident memory per lease;
//! - [`election`] (`cairn bench election`): a holder with a lease of `--ttl` stops
//!   renewing; a second candidate campaigns through a follower until it wins, and writes
//!   fenced; reports the time from the holder's last acknowledged keep-alive (its send
//!   time) to the next holder's first accepted write.
//!
//! Both leave nothing behind: their leases are revoked, their resources go with them.

use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_proto::v1::{self as pb, lease_service_client::LeaseServiceClient};
use clap::Args;
use futures::{stream, StreamExt as _};

use super::report::Format;
use super::{bench_resource, connect, discover, procfs, resource_client, run_id, BenchError};
use super::{BenchChannel, Cluster};

/// `cairn bench leases`'s options.
#[derive(Args, Clone)]
pub struct LeasesArgs {
    /// Leases to grant and keep alive.
    #[arg(long, default_value_t = 10_000)]
    count: u64,
    /// Their TTL, in milliseconds.
    #[arg(long = "ttl-ms", default_value_t = 10_000)]
    ttl_ms: u64,
    /// KeepAlive streams the leases share.
    #[arg(long, default_value_t = 4)]
    streams: usize,
    /// Length of the measurement window, in seconds.
    #[arg(long = "duration", default_value_t = 30.0)]
    duration_s: f64,
    /// Node processes to measure (default: the local processes listening on the endpoints).
    #[arg(long, value_delimiter = ',')]
    server_pids: Vec<i32>,
}

/// `cairn bench election`'s options.
#[derive(Args, Clone)]
pub struct ElectionArgs {
    /// The holders' lease TTL, in milliseconds.
    #[arg(long = "ttl-ms", default_value_t = 2_000)]
    ttl_ms: u64,
    /// How many hand-overs to measure.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Pause between two campaign attempts of the waiting candidate, in milliseconds.
    #[arg(long = "probe-interval-ms", default_value_t = 10)]
    probe_interval_ms: u64,
    #[arg(long, default_value = "bench")]
    namespace: String,
}

fn lease_client(channel: BenchChannel) -> LeaseServiceClient<BenchChannel> {
    LeaseServiceClient::new(channel)
}

/// CPU time and resident memory of `pids`, summed.
fn node_usage(pids: &[i32]) -> (Duration, u64) {
    let cpu = pids.iter().filter_map(|p| procfs::process_cpu(*p)).sum();
    let rss_kib = pids
        .iter()
        .filter_map(|p| procfs::process_rss_kib(*p))
        .sum();
    (cpu, rss_kib)
}

/// Grants, keeps alive, measures, revokes.
pub async fn run(cluster: &Cluster, args: LeasesArgs, format: Format) -> Result<(), BenchError> {
    if args.count == 0 || args.streams == 0 || args.ttl_ms < 300 {
        return Err(BenchError::Option {
            option: "--count/--streams/--ttl-ms",
            reason: "need at least one lease, one stream and a TTL of 300 ms".into(),
        });
    }
    let access = cluster.access()?;
    let view = discover(&cluster.endpoints, &access).await?;
    let pids: Vec<i32> = match args.server_pids.is_empty() {
        false => args.server_pids.clone(),
        true => cluster
            .endpoints
            .iter()
            .filter_map(|e| procfs::pid_listening_on(e))
            .collect(),
    };
    let channel = connect(&access, &view.leader_address).await?;
    let (_, rss_before_kib) = node_usage(&pids);

    eprintln!("granting {} leases of {} ms", args.count, args.ttl_ms);
    let granted: Vec<Result<u64, tonic::Status>> = stream::iter(0..args.count)
        .map(|_| {
            let mut client = lease_client(channel.clone());
            async move {
                client
                    .grant(pb::LeaseGrantRequest {
                        ttl_ms: args.ttl_ms,
                    })
                    .await
                    .map(|r| r.into_inner().id)
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let ids: Vec<u64> = granted
        .iter()
        .filter_map(|g| g.as_ref().ok().copied())
        .collect();
    if let Some(Err(e)) = granted.iter().find(|g| g.is_err()) {
        eprintln!(
            "{} grants failed, the first: {e}",
            args.count as usize - ids.len()
        );
    }

    // Every stream renews its share every third of the TTL, for the warm-up and the window.
    let every = Duration::from_millis(args.ttl_ms / 3);
    let warmup = every;
    let window = Duration::from_secs_f64(args.duration_s.clamp(1.0, 3600.0));
    let stop_at = Instant::now() + warmup + window;
    let shares: Vec<Vec<u64>> = (0..args.streams)
        .map(|s| ids.iter().skip(s).step_by(args.streams).copied().collect())
        .collect();
    let keepers: Vec<_> = shares
        .into_iter()
        .map(|share| {
            let mut client = lease_client(channel.clone());
            tokio::spawn(async move {
                let (mut acknowledged, mut lost) = (0u64, 0u64);
                let (tx, rx) = tokio::sync::mpsc::channel(share.len().max(1));
                let requests = tokio_stream::wrappers::ReceiverStream::new(rx);
                let Ok(answers) = client.keep_alive(requests).await else {
                    return (acknowledged, lost);
                };
                let mut answers = answers.into_inner();
                while Instant::now() < stop_at {
                    let round = Instant::now();
                    for id in &share {
                        if tx
                            .send(pb::LeaseKeepAliveRequest { id: *id })
                            .await
                            .is_err()
                        {
                            return (acknowledged, lost);
                        }
                    }
                    for _ in &share {
                        match answers.message().await {
                            Ok(Some(a)) if a.ttl_ms > 0 => acknowledged += 1,
                            Ok(Some(_)) => lost += 1,
                            _ => return (acknowledged, lost),
                        }
                    }
                    tokio::time::sleep(every.saturating_sub(round.elapsed())).await;
                }
                (acknowledged, lost)
            })
        })
        .collect();
    tokio::time::sleep(warmup).await;
    let (cpu_start, rss_kept_kib) = node_usage(&pids);
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let (cpu_end, _) = node_usage(&pids);
    let elapsed = started.elapsed();
    let (mut acknowledged, mut lost) = (0, 0);
    for keeper in keepers {
        if let Ok((a, l)) = keeper.await {
            acknowledged += a;
            lost += l;
        }
    }
    eprintln!("revoking");
    let _: Vec<_> = stream::iter(ids.clone())
        .map(|id| {
            let mut client = lease_client(channel.clone());
            async move { client.revoke(pb::LeaseRevokeRequest { id }).await }
        })
        .buffer_unordered(64)
        .collect()
        .await;

    let leases = ids.len() as f64;
    let cpu_s = (cpu_end.saturating_sub(cpu_start)).as_secs_f64();
    let cores = cpu_s / elapsed.as_secs_f64();
    let figures = serde_json::json!({
        "workload": "leases",
        "leases": ids.len(),
        "ttl_ms": args.ttl_ms,
        "streams": args.streams,
        "window_s": elapsed.as_secs_f64(),
        "keep_alives_acknowledged": acknowledged,
        "keep_alives_per_s": acknowledged as f64 / (elapsed + warmup).as_secs_f64(),
        "leases_lost": lost,
        "nodes_measured": pids.len(),
        "nodes_cpu_cores": cores,
        "nodes_cpu_us_per_lease_per_s": cores * 1e6 / leases,
        "nodes_rss_bytes_per_lease": (rss_kept_kib.saturating_sub(rss_before_kib) as f64 * 1024.0)
            / leases,
    });
    print_figures(&figures, format);
    Ok(())
}

/// Measures hand-overs of an election whose holder stops renewing.
pub async fn election(
    cluster: &Cluster,
    args: ElectionArgs,
    format: Format,
) -> Result<(), BenchError> {
    let access = cluster.access()?;
    let view = discover(&cluster.endpoints, &access).await?;
    let through = cluster
        .endpoints
        .iter()
        .find(|e| **e != view.leader_address)
        .unwrap_or(&view.leader_address)
        .clone();
    let channel = connect(&access, &through).await?;
    let run = run_id();
    let mut handovers_ms = Vec::new();
    for round in 0..args.rounds {
        let mut leases = lease_client(channel.clone());
        let mut resources = resource_client(channel.clone());
        let name = format!("election-{run}-{round}");
        let campaign = |lease: u64| {
            let mut r = bench_resource(&args.namespace, name.clone(), String::new(), Bytes::new());
            r.lease = lease;
            pb::WriteRequest {
                resource: Some(r),
                fence: None,
            }
        };
        let first = leases
            .grant(pb::LeaseGrantRequest {
                ttl_ms: args.ttl_ms,
            })
            .await
            .map_err(|s| BenchError::Api(s.into()))?
            .into_inner()
            .id;
        resources
            .write(campaign(first))
            .await
            .map_err(|s| BenchError::Api(s.into()))?;
        let second = leases
            .grant(pb::LeaseGrantRequest {
                ttl_ms: 60_000.max(args.ttl_ms * 10),
            })
            .await
            .map_err(|s| BenchError::Api(s.into()))?
            .into_inner()
            .id;
        // The holder's last keep-alive: from its send time, the lease lives a TTL.
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let mut answers = leases
            .keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .map_err(|s| BenchError::Api(s.into()))?
            .into_inner();
        let sent = Instant::now();
        let _ = tx.send(pb::LeaseKeepAliveRequest { id: first }).await;
        let _ = answers.message().await;
        drop(tx);
        // The second candidate campaigns until it wins, then writes fenced.
        let deadline = sent + Duration::from_millis(args.ttl_ms * 5 + 10_000);
        let token = loop {
            if Instant::now() > deadline {
                return Err(BenchError::Setup(format!(
                    "round {round}: the second candidate did not win within {} ms",
                    args.ttl_ms * 5 + 10_000
                )));
            }
            if let Ok(won) = resources.write(campaign(second)).await {
                let version = won.into_inner().resource.map(|r| r.version);
                break version
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or_default();
            }
            tokio::time::sleep(Duration::from_millis(args.probe_interval_ms)).await;
        };
        let mut fenced = bench_resource(
            &args.namespace,
            format!("{name}-work"),
            String::new(),
            Bytes::from_static(b"w"),
        );
        fenced.lease = second;
        let id = bench_resource(&args.namespace, name.clone(), String::new(), Bytes::new()).id;
        resources
            .write(pb::WriteRequest {
                resource: Some(fenced),
                fence: Some(pb::Fence {
                    election: id.map(|id| pb::Reference {
                        r#type: id.r#type,
                        tenancy: id.tenancy,
                        name: id.name,
                        section: String::new(),
                    }),
                    token,
                }),
            })
            .await
            .map_err(|s| BenchError::Api(s.into()))?;
        let handover = sent.elapsed();
        eprintln!("round {round}: {} ms", handover.as_millis());
        handovers_ms.push(handover.as_secs_f64() * 1e3);
        let _ = leases.revoke(pb::LeaseRevokeRequest { id: second }).await;
    }
    handovers_ms.sort_by(f64::total_cmp);
    let figures = serde_json::json!({
        "workload": "election",
        "ttl_ms": args.ttl_ms,
        "rounds": handovers_ms.len(),
        "handover_ms_min": handovers_ms.first(),
        "handover_ms_median": handovers_ms.get(handovers_ms.len() / 2),
        "handover_ms_max": handovers_ms.last(),
        "handover_ms_over_ttl_median": handovers_ms.get(handovers_ms.len() / 2).map(|m| m - args.ttl_ms as f64),
    });
    print_figures(&figures, format);
    Ok(())
}

fn print_figures(figures: &serde_json::Value, format: Format) {
    match format {
        Format::Json => println!("{figures}"),
        Format::Table => {
            if let Some(map) = figures.as_object() {
                for (key, value) in map {
                    println!("{key:<32} {value}");
                }
            }
        }
    }
}
