//! The closed-loop workloads: write, read, list and mixed.
//!
//! Each client task owns the keys `k` with `k % clients == its index` for its
//! writes (so its compare-and-set tokens are never raced by another client of
//! the same run) and reads any key. A write sends the version the client last
//! saw for the key ("" = create); a CAS failure or wrong uid (a key changed by
//! someone else, e.g. an earlier interrupted run) is counted, then the client
//! re-reads the key's version and goes on.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_proto::error::ApiError;
use cairn_proto::v1 as pb;
use hdrhistogram::Histogram;

use super::report::{self, Format, Latency, Progress, Report, SelfCpu, ServerWatch};
use super::{
    bench_id, bench_resource, bench_tenancy, bench_type, connect, key_name, key_of,
    resource_client, targets, BenchChannel, BenchError, Cluster, ConsistencyArg, FastRng,
    LoadOptions, ResourceClient,
};

/// Which operations a run sends.
#[derive(Clone, Copy, Debug)]
pub enum Mix {
    Write,
    Read(ConsistencyArg),
    List(ConsistencyArg),
    Mixed {
        consistency: ConsistencyArg,
        read_fraction: f64,
    },
    /// Reads of a client `WatchCache` primed with the whole key space: `strong` are its
    /// consistent reads (`get_consistent`: a confirmed revision asked of the watch's node,
    /// then memory), `eventual` its plain ones (memory only).
    CacheRead(ConsistencyArg),
}

impl Mix {
    fn name(self) -> &'static str {
        match self {
            Mix::Write => "write",
            Mix::Read(_) => "read",
            Mix::List(_) => "list",
            Mix::Mixed { .. } => "mixed",
            Mix::CacheRead(_) => "cache-read",
        }
    }

    fn consistency(self) -> Option<ConsistencyArg> {
        match self {
            Mix::Write => None,
            Mix::Read(c) | Mix::List(c) | Mix::Mixed { consistency: c, .. } | Mix::CacheRead(c) => {
                Some(c)
            }
        }
    }

    /// Reads and lists need every key of the key space to exist.
    fn needs_preload(self) -> bool {
        !matches!(self, Mix::Write)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum OpKind {
    Write,
    Read,
    List,
    CacheRead,
}

impl OpKind {
    fn name(self) -> &'static str {
        match self {
            OpKind::Write => "write",
            OpKind::Read => "read",
            OpKind::List => "list",
            OpKind::CacheRead => "cache_read",
        }
    }
}

/// State every client task shares. The flags open and close the window; the
/// counters feed the progress bar and the op cap.
pub(crate) struct Shared {
    options: LoadOptions,
    mix: Mix,
    value: Bytes,
    /// The last version seen per key ("" = not stored, as far as we know).
    versions: Vec<Mutex<String>>,
    measuring: AtomicBool,
    stop: AtomicBool,
    /// Operations started in the window (for the op cap and sequential keys).
    claimed: AtomicU64,
    /// Operations finished in the window (progress only).
    finished: AtomicU64,
    failed: AtomicU64,
    op_timeout: Duration,
    /// With `--rate`: the schedule every start takes its slot from.
    pace: Option<Pace>,
    /// The cache `cache-read` reads, primed before the window opens.
    cache: std::sync::OnceLock<cairn_client::WatchCache>,
}

/// `--rate`: operations start at most every `interval`, over all clients. Each start takes
/// the next slot of one shared schedule and waits for it.
struct Pace {
    interval_ns: u64,
    started: Instant,
    next_slot_ns: AtomicU64,
}

impl Pace {
    fn new(rate: f64) -> Option<Pace> {
        (rate > 0.0).then(|| Pace {
            interval_ns: ((1e9 / rate) as u64).max(1),
            started: Instant::now(),
            next_slot_ns: AtomicU64::new(0),
        })
    }

    /// Waits for this client's next slot. A schedule that fell behind (the cluster was
    /// slower than the rate) restarts from now instead of bursting to catch up, so the
    /// rate is never exceeded over any stretch of time.
    async fn wait(&self) {
        let now_ns = self.started.elapsed().as_nanos() as u64;
        let mut next = self.next_slot_ns.load(Ordering::Relaxed);
        let slot = loop {
            let slot = next.max(now_ns);
            match self.next_slot_ns.compare_exchange_weak(
                next,
                slot + self.interval_ns,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break slot,
                Err(current) => next = current,
            }
        };
        if slot > now_ns {
            tokio::time::sleep_until((self.started + Duration::from_nanos(slot)).into()).await;
        }
    }
}

/// What one client task measured.
struct ClientResult {
    histograms: BTreeMap<OpKind, Histogram<u64>>,
    errors: BTreeMap<String, u64>,
    last_done: Option<Instant>,
    stored_bytes: Option<usize>,
}

/// Why one operation failed, as counted in the report.
fn error_kind(e: &Result<ApiError, ()>) -> String {
    match e {
        Ok(api) => format!("{:?}", api.kind()),
        Err(()) => "ClientTimeout".into(),
    }
}

/// Runs the workload and prints its report in `format`.
pub async fn run(
    cluster: &Cluster,
    options: LoadOptions,
    mix: Mix,
    format: Format,
) -> Result<(), BenchError> {
    measure(cluster, options, mix).await?.print(format);
    Ok(())
}

/// Runs the workload and returns its report.
pub async fn measure(
    cluster: &Cluster,
    options: LoadOptions,
    mix: Mix,
) -> Result<Report, BenchError> {
    options.validate(cluster)?;
    let access = cluster.access()?;
    let addresses = targets(cluster, &options, &access).await?;
    let mut channels = Vec::with_capacity(options.connections);
    for i in 0..options.connections {
        channels.push(connect(&access, &addresses[i % addresses.len()]).await?);
    }
    let shared = Arc::new(Shared {
        value: Bytes::from(vec![b'v'; options.value_bytes]),
        versions: (0..options.key_space)
            .map(|_| Mutex::new(String::new()))
            .collect(),
        measuring: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        claimed: AtomicU64::new(0),
        finished: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        op_timeout: options.op_timeout(),
        pace: Pace::new(options.rate),
        cache: std::sync::OnceLock::new(),
        options,
        mix,
    });
    learn_versions(&shared, resource_client(channels[0].clone())).await?;
    if mix.needs_preload() {
        preload(&shared, &channels).await?;
    }
    if let Mix::CacheRead(_) = mix {
        let cache = primed_cache(cluster, &shared.options, &addresses).await?;
        assert!(shared.cache.set(cache).is_ok(), "the cache is primed once");
    }
    let options = &shared.options;
    let mut servers = ServerWatch::start(&cluster.endpoints, &options.server_pids);

    let mut tasks = Vec::with_capacity(options.clients);
    for index in 0..options.clients {
        let client = resource_client(channels[index % channels.len()].clone());
        tasks.push(tokio::spawn(client_task(shared.clone(), client, index)));
    }
    let progress = Progress::new(
        mix.name(),
        Duration::from_secs_f64(options.warmup_s + options.duration_s),
    );
    let warmup_end = Instant::now() + Duration::from_secs_f64(options.warmup_s);
    while Instant::now() < warmup_end && !tasks.iter().all(|t| t.is_finished()) {
        progress.update(0, 0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    servers.restart_cpu();
    let cpu = SelfCpu::start();
    let window_start = Instant::now();
    shared.measuring.store(true, Ordering::SeqCst);
    let deadline = window_start + Duration::from_secs_f64(options.duration_s);
    let mut ended_by_time = false;
    loop {
        if tasks.iter().all(|t| t.is_finished()) {
            break;
        }
        let now = Instant::now();
        if now >= deadline {
            ended_by_time = true;
            break;
        }
        progress.update(
            shared.finished.load(Ordering::Relaxed),
            shared.failed.load(Ordering::Relaxed),
        );
        tokio::time::sleep((deadline - now).min(Duration::from_millis(100))).await;
    }
    shared.stop.store(true, Ordering::SeqCst);
    let window_end = Instant::now();
    let cpu_used = cpu.used();
    progress.finish();

    let mut histograms: BTreeMap<OpKind, Histogram<u64>> = BTreeMap::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut last_done: Option<Instant> = None;
    let mut stored_bytes = None;
    for task in tasks {
        let r = task
            .await
            .map_err(|e| BenchError::Setup(format!("a client task failed: {e}")))?;
        for (kind, h) in r.histograms {
            let total = histograms.entry(kind).or_insert_with(report::new_histogram);
            total
                .add(&h)
                .map_err(|e| BenchError::Setup(format!("cannot merge histograms: {e}")))?;
        }
        for (k, n) in r.errors {
            *errors.entry(k).or_insert(0) += n;
        }
        last_done = last_done.max(r.last_done);
        stored_bytes = stored_bytes.or(r.stored_bytes);
    }
    // A run ended by the op cap ends when its last operation did.
    let window = if ended_by_time {
        deadline - window_start
    } else {
        last_done.unwrap_or(window_end).max(window_start) - window_start
    };
    let ops: u64 = histograms.values().map(|h| h.len()).sum();
    let mut report = Report::new(mix.name());
    report.label = options.label.clone();
    report.consistency = mix.consistency().map(|c| c.name().to_string());
    report.clients = options.clients;
    report.connections = options.connections;
    report.targets = addresses;
    report.value_bytes = options.value_bytes;
    report.key_space = options.key_space;
    report.resource_encoded_bytes = stored_bytes;
    report.set_window(ops, window, cpu_used);
    report.errors = errors;
    if histograms.len() > 1 {
        let mut all = report::new_histogram();
        for h in histograms.values() {
            all.add(h)
                .map_err(|e| BenchError::Setup(format!("cannot merge histograms: {e}")))?;
        }
        report.latency.insert("all".into(), Latency::of(&all));
    }
    for (kind, h) in &histograms {
        report.latency.insert(kind.name().into(), Latency::of(h));
    }
    report.servers = servers.finish(window, report.ops);
    report.rate = (options.rate > 0.0).then_some(options.rate);
    Ok(report)
}

/// Deletes every resource of the bench's type in `options`' namespace (through the
/// leader); returns how many it deleted. For runs that must not leave their keys behind
/// (`cairn check perf`).
pub async fn remove_keys(cluster: &Cluster, options: &LoadOptions) -> Result<u64, BenchError> {
    let access = cluster.access()?;
    let leader = super::discover(&cluster.endpoints, &access)
        .await?
        .leader_address;
    let mut client = resource_client(connect(&access, &leader).await?);
    let timeout = options.op_timeout();
    let listed = list_stored(&mut client, &options.namespace, "", timeout).await?;
    let mut deleted = 0;
    for resource in listed {
        let mut request = tonic::Request::new(pb::DeleteRequest {
            fence: None,
            id: resource.id,
            version: resource.version,
            orphan_dependents: false,
        });
        request.set_timeout(timeout);
        client
            .delete(request)
            .await
            .map_err(|s| BenchError::Api(ApiError::from_status(&s)))?;
        deleted += 1;
    }
    Ok(deleted)
}

/// The bench's resources stored in `namespace` whose names start with `name_prefix` (a
/// strong listing, every page of it, each page given `timeout`).
async fn list_stored(
    client: &mut ResourceClient,
    namespace: &str,
    name_prefix: &str,
    timeout: Duration,
) -> Result<Vec<pb::Resource>, BenchError> {
    let mut resources = Vec::new();
    let mut page_token = String::new();
    loop {
        let mut request = tonic::Request::new(pb::ListRequest {
            r#type: Some(bench_type()),
            tenancy: Some(bench_tenancy(namespace)),
            name_prefix: name_prefix.into(),
            consistency: pb::Consistency::Strong as i32,
            page_token,
            ..pb::ListRequest::default()
        });
        request.set_timeout(timeout);
        let page = client
            .list(request)
            .await
            .map_err(|s| BenchError::Api(ApiError::from_status(&s)))?
            .into_inner();
        resources.extend(page.resources);
        if page.next_page_token.is_empty() {
            return Ok(resources);
        }
        page_token = page.next_page_token;
    }
}

/// Reads the versions of the bench keys already stored (an earlier run's), so
/// that the first writes are correct compare-and-sets.
async fn learn_versions(shared: &Shared, mut client: ResourceClient) -> Result<(), BenchError> {
    // A cluster without quorum answers nothing: the run fails instead of waiting for ever.
    let timeout = shared.op_timeout.max(Duration::from_secs(5));
    let stored = list_stored(&mut client, &shared.options.namespace, "k", timeout).await?;
    for r in stored {
        let Some(k) = r.id.as_ref().and_then(|id| key_of(&id.name)) else {
            continue;
        };
        if let Some(slot) = shared.versions.get(k as usize) {
            *lock(slot) = r.version;
        }
    }
    Ok(())
}

/// Creates every key of the key space that is not stored yet.
async fn preload(shared: &Arc<Shared>, channels: &[BenchChannel]) -> Result<(), BenchError> {
    let missing: Vec<u64> = (0..shared.options.key_space)
        .filter(|k| lock(&shared.versions[*k as usize]).is_empty())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let missing = Arc::new(missing);
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let progress = Progress::new("preload", Duration::from_secs(60));
    let mut tasks = Vec::new();
    for i in 0..shared.options.clients.max(16) {
        let mut client = resource_client(channels[i % channels.len()].clone());
        let (shared, missing, next, done) =
            (shared.clone(), missing.clone(), next.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(&k) = missing.get(i) else {
                    return Ok::<(), ApiError>(());
                };
                write_key(&shared, &mut client, k).await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    while !tasks.iter().all(|t| t.is_finished()) {
        progress.update(done.load(Ordering::Relaxed), 0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    progress.finish();
    for t in tasks {
        t.await
            .map_err(|e| BenchError::Setup(format!("a preload task failed: {e}")))??;
    }
    Ok(())
}

fn lock(slot: &Mutex<String>) -> std::sync::MutexGuard<'_, String> {
    // A poisoned slot only means another client task panicked mid-update; the
    // string is still a valid (if stale) CAS token, and CAS makes stale safe.
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

/// One compare-and-set write of key `k`; remembers the new version. On a CAS
/// failure or wrong uid, learns the stored version and returns the error.
async fn write_key(
    shared: &Shared,
    client: &mut ResourceClient,
    k: u64,
) -> Result<usize, ApiError> {
    let slot = &shared.versions[k as usize];
    let expected = lock(slot).clone();
    let resource = bench_resource(
        &shared.options.namespace,
        key_name(k),
        expected,
        shared.value.clone(),
    );
    match client
        .write(pb::WriteRequest {
            fence: None,
            resource: Some(resource),
        })
        .await
    {
        Ok(response) => {
            let stored = response.into_inner().resource.unwrap_or_default();
            let size = prost::Message::encoded_len(&stored);
            *lock(slot) = stored.version;
            Ok(size)
        }
        Err(status) => {
            let error = ApiError::from_status(&status);
            if matches!(error, ApiError::CasFailure(_) | ApiError::WrongUid(_)) {
                refresh_version(shared, client, k).await;
            }
            Err(error)
        }
    }
}

/// After a CAS failure: learn the key's stored version (or that it is absent).
async fn refresh_version(shared: &Shared, client: &mut ResourceClient, k: u64) {
    let request = pb::ReadRequest {
        id: Some(bench_id(&shared.options.namespace, key_name(k))),
        consistency: pb::Consistency::Strong as i32,
        revision: 0,
    };
    let version = match client.read(request).await {
        Ok(r) => r
            .into_inner()
            .resource
            .map(|r| r.version)
            .unwrap_or_default(),
        Err(s) if ApiError::from_status(&s) == ApiError::NotFound => String::new(),
        Err(_) => return,
    };
    *lock(&shared.versions[k as usize]) = version;
}

async fn client_task(
    shared: Arc<Shared>,
    mut client: ResourceClient,
    index: usize,
) -> ClientResult {
    let options = &shared.options;
    let clients = options.clients as u64;
    let key_space = options.key_space;
    // Keys this client may write: index, index + clients, ... below key_space.
    let owned = if key_space > index as u64 {
        (key_space - index as u64).div_ceil(clients)
    } else {
        0
    };
    let mut rng = FastRng::new(index as u64 + 1);
    let mut result = ClientResult {
        histograms: BTreeMap::new(),
        errors: BTreeMap::new(),
        last_done: None,
        stored_bytes: None,
    };
    loop {
        if let Some(pace) = &shared.pace {
            pace.wait().await;
        }
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let measuring = shared.measuring.load(Ordering::Relaxed);
        let claimed = if measuring {
            let i = shared.claimed.fetch_add(1, Ordering::Relaxed);
            if i >= options.max_ops {
                break;
            }
            Some(i)
        } else {
            None
        };
        let kind = match shared.mix {
            Mix::Write => OpKind::Write,
            Mix::Read(_) => OpKind::Read,
            Mix::List(_) => OpKind::List,
            Mix::CacheRead(_) => OpKind::CacheRead,
            Mix::Mixed { read_fraction, .. } => {
                if rng.next_f64() < read_fraction {
                    OpKind::Read
                } else {
                    OpKind::Write
                }
            }
        };
        let k = match (options.sequential_keys, claimed) {
            (true, Some(i)) => i % key_space,
            _ if kind == OpKind::Write && owned > 0 => index as u64 + clients * rng.below(owned),
            _ => rng.below(key_space),
        };
        let started = Instant::now();
        let outcome =
            tokio::time::timeout(shared.op_timeout, one_op(&shared, &mut client, kind, k)).await;
        let done = Instant::now();
        if claimed.is_none() || shared.stop.load(Ordering::Relaxed) {
            // Warm-up, or finished after the window closed: not counted.
            if outcome.is_err() && shared.stop.load(Ordering::Relaxed) {
                break;
            }
            continue;
        }
        match outcome {
            Ok(Ok(stored)) => {
                let h = result
                    .histograms
                    .entry(kind)
                    .or_insert_with(report::new_histogram);
                report::record(h, done - started);
                result.last_done = Some(done);
                if stored.is_some() {
                    result.stored_bytes = stored;
                }
                shared.finished.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(e)) => {
                *result.errors.entry(error_kind(&Ok(e))).or_insert(0) += 1;
                shared.failed.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                *result.errors.entry(error_kind(&Err(()))).or_insert(0) += 1;
                shared.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    result
}

/// One operation; a write returns the encoded size of the stored resource.
async fn one_op(
    shared: &Shared,
    client: &mut ResourceClient,
    kind: OpKind,
    k: u64,
) -> Result<Option<usize>, ApiError> {
    let consistency = shared
        .mix
        .consistency()
        .map_or(pb::Consistency::Strong, |c| c.proto()) as i32;
    match kind {
        OpKind::Write => write_key(shared, client, k).await.map(Some),
        OpKind::Read => {
            let request = pb::ReadRequest {
                id: Some(bench_id(&shared.options.namespace, key_name(k))),
                consistency,
                revision: 0,
            };
            client
                .read(request)
                .await
                .map(|_| None)
                .map_err(|s| ApiError::from_status(&s))
        }
        OpKind::CacheRead => {
            let Some(cache) = shared.cache.get() else {
                unreachable!("a cache-read run primes its cache before any operation")
            };
            let id = bench_id(&shared.options.namespace, key_name(k));
            let found = match shared.mix.consistency() {
                Some(ConsistencyArg::Strong) => cache.get_consistent(&id).await,
                _ => {
                    // A plain read never waits: let the other tasks (the window's
                    // coordinator among them) run between two.
                    tokio::task::yield_now().await;
                    Ok(cache.get(&id))
                }
            };
            match found {
                Ok(Some(_)) => Ok(None),
                Ok(None) => Err(ApiError::NotFound),
                Err(e) => Err(api_error_of(&e)),
            }
        }
        OpKind::List => {
            // One page (at most list_page_size_max): what a List costs.
            let request = pb::ListRequest {
                r#type: Some(bench_type()),
                tenancy: Some(bench_tenancy(&shared.options.namespace)),
                name_prefix: String::new(),
                consistency,
                ..pb::ListRequest::default()
            };
            client
                .list(request)
                .await
                .map(|_| None)
                .map_err(|s| ApiError::from_status(&s))
        }
    }
}

/// A `WatchCache` of the run's namespace over `addresses` (the run's targets), primed.
async fn primed_cache(
    cluster: &Cluster,
    options: &LoadOptions,
    addresses: &[String],
) -> Result<cairn_client::WatchCache, BenchError> {
    let client = cluster
        .client_at(addresses, options.op_timeout())
        .map_err(|e| BenchError::Setup(e.to_string()))?;
    let spec = cairn_client::WatchSpec::new(bench_type().group, bench_type().kind)
        .with_tenancy(bench_tenancy(&options.namespace));
    let cache = cairn_client::WatchCache::start(client, vec![spec], Default::default())
        .map_err(|e| BenchError::Setup(e.to_string()))?;
    let progress = Progress::new("priming the cache", Duration::from_secs(60));
    let primed = tokio::time::timeout(Duration::from_secs(60), cache.wait_primed()).await;
    progress.finish();
    primed.map_err(|_| BenchError::Setup("the cache did not prime within 60 s".into()))?;
    Ok(cache)
}

/// A client library error as the report counts it: by its kind.
fn api_error_of(e: &cairn_client::ClientError) -> ApiError {
    use cairn_proto::v1::ErrorKind;
    match e.kind() {
        ErrorKind::Inconsistent => ApiError::Inconsistent(e.to_string()),
        ErrorKind::InvalidArgument => ApiError::invalid("request", e.to_string()),
        _ => ApiError::Unavailable(e.to_string()),
    }
}
