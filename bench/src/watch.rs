//! The watch workload: `--watchers` WatchList streams, each on a node picked
//! at random, all watching the names this run writes; `--clients` writers at
//! the leader (or spread with `--target all`) each write one resource every
//! `--write-interval-ms`. Delivery latency is measured in this one process
//! (one clock): from the writer's acknowledgement of the write whose version
//! is revision R to each watcher's receipt of the event at revision R, and for
//! each write, to its receipt by the last watcher. The proto defines a
//! version as the decimal index of the entry that carried the write, which is
//! the event's revision: that is the join key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_proto::error::ApiError;
use cairn_proto::v1::{self as pb, watch_event};

use super::report::{self, Format, Latency, Progress, Report, SelfCpu, ServerWatch, WatchFigures};
use super::{
    bench_resource, bench_tenancy, bench_type, connect, resource_client, run_id, targets,
    BenchChannel, BenchError, Cluster, FastRng, LoadOptions, ResourceClient,
    WATCHERS_PER_CONNECTION,
};

/// How long watchers may lag behind the last write before the run ends.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

struct WatchShared {
    stop: AtomicBool,
    ready: AtomicUsize,
    /// The highest revision written so far (watchers stop once past it after `stop`).
    last_revision: AtomicU64,
    received: AtomicU64,
}

/// One acknowledged write: when it was sent and acknowledged.
struct Written {
    revision: u64,
    sent: Instant,
    acknowledged: Instant,
}

struct WriterResult {
    written: Vec<Written>,
    latency: hdrhistogram::Histogram<u64>,
    errors: HashMap<String, u64>,
}

/// Runs the watch workload and prints its report in `format`.
pub async fn run(
    cluster: &Cluster,
    options: LoadOptions,
    watchers: usize,
    write_interval_ms: u64,
    format: Format,
) -> Result<(), BenchError> {
    options.validate(cluster)?;
    if watchers == 0 {
        return Err(BenchError::Option {
            option: "--watchers",
            reason: "must be at least 1".into(),
        });
    }
    let prefix = format!("w{}-", run_id());
    let access = cluster.access()?;
    let writer_addresses = targets(cluster, &options, &access).await?;
    let mut writer_channels = Vec::new();
    for i in 0..options.connections {
        writer_channels
            .push(connect(&access, &writer_addresses[i % writer_addresses.len()]).await?);
    }
    // Watch connections: per endpoint, enough for its share of the watchers.
    let endpoints = &cluster.endpoints;
    let per_endpoint = watchers
        .div_ceil(endpoints.len())
        .div_ceil(WATCHERS_PER_CONNECTION)
        .max(1);
    let mut watch_channels: Vec<Vec<BenchChannel>> = Vec::new();
    for e in endpoints {
        let mut list = Vec::new();
        for _ in 0..per_endpoint {
            list.push(connect(&access, e).await?);
        }
        watch_channels.push(list);
    }

    let shared = Arc::new(WatchShared {
        stop: AtomicBool::new(false),
        ready: AtomicUsize::new(0),
        last_revision: AtomicU64::new(0),
        received: AtomicU64::new(0),
    });
    let mut rng = FastRng::new(0x5eed);
    let mut watcher_tasks = Vec::with_capacity(watchers);
    let mut opened_on = vec![0usize; endpoints.len()];
    for _ in 0..watchers {
        let e = rng.below(endpoints.len() as u64) as usize;
        let channel = watch_channels[e][opened_on[e] % per_endpoint].clone();
        opened_on[e] += 1;
        let request = pb::WatchListRequest {
            r#type: Some(bench_type()),
            tenancy: Some(bench_tenancy(&options.namespace)),
            name_prefix: prefix.clone(),
            start_revision: 0,
            consistency: pb::Consistency::Eventual as i32,
            selector: String::new(),
        };
        watcher_tasks.push(tokio::spawn(watcher(shared.clone(), channel, request)));
    }
    let progress = Progress::new("watchers", Duration::from_secs(30));
    let opened = Instant::now();
    while shared.ready.load(Ordering::Relaxed) < watchers {
        if opened.elapsed() > Duration::from_secs(30) {
            shared.stop.store(true, Ordering::SeqCst);
            return Err(BenchError::Setup(format!(
                "only {} of {watchers} watches opened within 30 s",
                shared.ready.load(Ordering::Relaxed)
            )));
        }
        if watcher_tasks.iter().any(|t| t.is_finished()) {
            shared.stop.store(true, Ordering::SeqCst);
            return Err(BenchError::Setup(
                "a watch ended before it was ready".into(),
            ));
        }
        progress.update(shared.ready.load(Ordering::Relaxed) as u64, 0);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    progress.finish();

    let mut servers = ServerWatch::start(endpoints, &options.server_pids);
    servers.restart_cpu();
    let cpu = SelfCpu::start();
    let window_start = Instant::now();
    let deadline = window_start + Duration::from_secs_f64(options.duration_s);
    let claimed = Arc::new(AtomicU64::new(0));
    let value = Bytes::from(vec![b'v'; options.value_bytes]);
    let mut writer_tasks = Vec::new();
    for i in 0..options.clients {
        let client = resource_client(writer_channels[i % writer_channels.len()].clone());
        writer_tasks.push(tokio::spawn(writer(
            client,
            shared.clone(),
            claimed.clone(),
            WriterPlan {
                namespace: options.namespace.clone(),
                name: format!("{prefix}{i}"),
                value: value.clone(),
                interval: Duration::from_millis(write_interval_ms),
                deadline,
                max_ops: options.max_ops,
                op_timeout: options.op_timeout(),
            },
        )));
    }
    let progress = Progress::new("watch", Duration::from_secs_f64(options.duration_s));
    while !writer_tasks.iter().all(|t| t.is_finished()) {
        progress.update(claimed.load(Ordering::Relaxed), 0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    progress.finish();
    let writes_end = Instant::now();
    let mut written = Vec::new();
    let mut write_latency = report::new_histogram();
    let mut errors: std::collections::BTreeMap<String, u64> = Default::default();
    for t in writer_tasks {
        let r = t
            .await
            .map_err(|e| BenchError::Setup(format!("a writer failed: {e}")))?;
        written.extend(r.written);
        write_latency
            .add(&r.latency)
            .map_err(|e| BenchError::Setup(format!("cannot merge histograms: {e}")))?;
        for (k, n) in r.errors {
            *errors.entry(k).or_insert(0) += n;
        }
    }
    // Let the watchers catch up with the last write, then stop them.
    let expected = written.len() as u64 * watchers as u64;
    let drain_end = Instant::now() + DRAIN_TIMEOUT;
    while shared.received.load(Ordering::Relaxed) < expected && Instant::now() < drain_end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shared.stop.store(true, Ordering::SeqCst);
    let cpu_used = cpu.used();
    let window = writes_end - window_start;

    let by_revision: HashMap<u64, &Written> = written.iter().map(|w| (w.revision, w)).collect();
    let mut from_ack = report::new_histogram();
    let mut from_send = report::new_histogram();
    let mut last_receipt: HashMap<u64, Instant> = HashMap::with_capacity(written.len());
    let mut deliveries = 0u64;
    let mut before_ack = 0u64;
    for t in watcher_tasks {
        let receipts = match t.await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                *errors.entry(format!("watch {:?}", e.kind())).or_insert(0) += 1;
                continue;
            }
            Err(e) => return Err(BenchError::Setup(format!("a watcher failed: {e}"))),
        };
        for (revision, received) in receipts {
            let Some(w) = by_revision.get(&revision) else {
                continue;
            };
            deliveries += 1;
            if received < w.acknowledged {
                before_ack += 1;
            }
            report::record(
                &mut from_ack,
                received.saturating_duration_since(w.acknowledged),
            );
            report::record(&mut from_send, received - w.sent);
            let last = last_receipt.entry(revision).or_insert(received);
            *last = (*last).max(received);
        }
    }
    let mut every_watcher = report::new_histogram();
    for w in &written {
        if let Some(last) = last_receipt.get(&w.revision) {
            report::record(
                &mut every_watcher,
                last.saturating_duration_since(w.acknowledged),
            );
        }
    }

    let mut report = Report::new("watch");
    report.label = options.label.clone();
    report.clients = options.clients;
    report.connections = options.connections;
    report.targets = writer_addresses;
    report.value_bytes = options.value_bytes;
    report.key_space = options.clients as u64;
    report.set_window(written.len() as u64, window, cpu_used);
    report.errors = errors;
    report
        .latency
        .insert("write".into(), Latency::of(&write_latency));
    report
        .latency
        .insert("delivery (from ack)".into(), Latency::of(&from_ack));
    report
        .latency
        .insert("delivery (from send)".into(), Latency::of(&from_send));
    report.latency.insert(
        "last watcher (from ack)".into(),
        Latency::of(&every_watcher),
    );
    report.watch = Some(WatchFigures {
        watchers,
        writes: written.len() as u64,
        deliveries,
        missing: expected.saturating_sub(deliveries),
        before_ack,
    });
    report.servers = servers.finish(window, report.ops);
    report.print(format);
    Ok(())
}

/// Opens one watch, waits for the end of its snapshot, then records the
/// revision and receipt time of every upsert until told to stop.
async fn watcher(
    shared: Arc<WatchShared>,
    channel: BenchChannel,
    request: pb::WatchListRequest,
) -> Result<Vec<(u64, Instant)>, ApiError> {
    let mut client = resource_client(channel);
    let mut stream = client
        .watch_list(request)
        .await
        .map_err(|s| ApiError::from_status(&s))?
        .into_inner();
    let mut receipts = Vec::new();
    let mut ready = false;
    loop {
        let stop = shared.stop.load(Ordering::Relaxed);
        let next = tokio::time::timeout(Duration::from_millis(200), stream.message()).await;
        let event = match next {
            Err(_) if stop => break,
            Err(_) => continue,
            Ok(Ok(Some(event))) => event,
            Ok(Ok(None)) => break,
            Ok(Err(s)) if stop => {
                let _ = s;
                break;
            }
            Ok(Err(s)) => return Err(ApiError::from_status(&s)),
        };
        let received = Instant::now();
        match event.event {
            Some(watch_event::Event::EndOfSnapshot(_)) if !ready => {
                ready = true;
                shared.ready.fetch_add(1, Ordering::Relaxed);
            }
            Some(watch_event::Event::Upsert(_)) if ready => {
                receipts.push((event.revision, received));
                shared.received.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
    Ok(receipts)
}

struct WriterPlan {
    namespace: String,
    name: String,
    value: Bytes,
    interval: Duration,
    deadline: Instant,
    max_ops: u64,
    op_timeout: Duration,
}

/// Writes one resource (its own name) every `interval` until the deadline or
/// the op cap; compare-and-set on the version it last wrote.
async fn writer(
    mut client: ResourceClient,
    shared: Arc<WatchShared>,
    claimed: Arc<AtomicU64>,
    plan: WriterPlan,
) -> WriterResult {
    let mut result = WriterResult {
        written: Vec::new(),
        latency: report::new_histogram(),
        errors: HashMap::new(),
    };
    let mut version = String::new();
    let mut next = Instant::now();
    while Instant::now() < plan.deadline {
        if claimed.fetch_add(1, Ordering::Relaxed) >= plan.max_ops {
            break;
        }
        let resource = bench_resource(
            &plan.namespace,
            plan.name.clone(),
            version.clone(),
            plan.value.clone(),
        );
        let sent = Instant::now();
        let outcome = tokio::time::timeout(
            plan.op_timeout,
            client.write(pb::WriteRequest {
                fence: None,
                resource: Some(resource),
            }),
        )
        .await;
        let acknowledged = Instant::now();
        match outcome {
            Ok(Ok(response)) => {
                let stored = response.into_inner().resource.unwrap_or_default();
                match stored.version.parse::<u64>() {
                    Ok(revision) => {
                        shared.last_revision.fetch_max(revision, Ordering::Relaxed);
                        result.written.push(Written {
                            revision,
                            sent,
                            acknowledged,
                        });
                        report::record(&mut result.latency, acknowledged - sent);
                    }
                    Err(_) => {
                        *result.errors.entry("UnparsableVersion".into()).or_insert(0) += 1;
                    }
                }
                version = stored.version;
            }
            Ok(Err(status)) => {
                let e = ApiError::from_status(&status);
                *result.errors.entry(format!("{:?}", e.kind())).or_insert(0) += 1;
                version = stored_version(&mut client, &plan).await.unwrap_or(version);
            }
            Err(_) => {
                *result.errors.entry("ClientTimeout".into()).or_insert(0) += 1;
                version = stored_version(&mut client, &plan).await.unwrap_or(version);
            }
        }
        next += plan.interval;
        let now = Instant::now();
        if next > now {
            tokio::time::sleep(next - now).await;
        } else {
            next = now;
        }
    }
    result
}

/// After a failed or timed-out write (whose outcome is unknown): the version
/// stored now ("" = none), or None when it cannot be read.
async fn stored_version(client: &mut ResourceClient, plan: &WriterPlan) -> Option<String> {
    let request = pb::ReadRequest {
        id: Some(super::bench_id(&plan.namespace, plan.name.clone())),
        consistency: pb::Consistency::Strong as i32,
        revision: 0,
    };
    match client.read(request).await {
        Ok(r) => Some(
            r.into_inner()
                .resource
                .map(|r| r.version)
                .unwrap_or_default(),
        ),
        Err(s) if ApiError::from_status(&s) == ApiError::NotFound => Some(String::new()),
        Err(_) => None,
    }
}
