//! Workloads: logical client processes that drive a cluster through
//! `cairn-client` and record what they saw in a [`Recorder`].
//!
//! Every process has a *home* node, picked at random: its client lists the
//! home node first and the others after it, and before every operation the
//! home node is made the preferred endpoint again, so each operation starts at
//! the home node (a NotLeader hint or a dead node still moves it on). Strong
//! reads are therefore served, or refused, by many different nodes.
//!
//! - **register** ([`WorkloadKind::Register`]): one resource per key, its data
//!   a value unique to the write that stored it. `read` = strong read; a
//!   *write* (whatever is stored) is recorded as what it is: a strong `read`
//!   for the version, then `cas [read value, new value]` (after a definite CAS
//!   failure both are done again with a new value, up to 8 times), so the
//!   checker sees its compare; `cas [from to]` = a CAS write whose expected
//!   version is the one observed with `from` (values are unique, so "the
//!   stored version is the one that came with `from`" is "the key holds
//!   `from`"). Outcomes: `ok`; `fail` only when the store answered
//!   CasFailure/WrongUid (the compare was evaluated); `info` when the outcome
//!   is unknown or the CAS was refused before the compare (no leader). Some
//!   reads are *eventual* reads on the process's home node alone, recorded in
//!   [`Workload::eventual`] with the home node's lifetime ([`NodeLifetimes`])
//!   and checked by [`crate::monotonic`].
//! - **set**: one resource per element (`set<k>-<element>`), `add` = create (an
//!   acknowledged add's output is the version it stored), `read` = strong list of the
//!   key's prefix. With [`WorkloadOptions::payload_bytes`]
//!   (the kill loops' *large entries*), each add also carries that many bytes of random
//!   padding in the metadata key [`PADDING_KEY`] (the data, hence the element the checker
//!   sees, is unchanged), so each add is a Raft entry of that size. To keep the state
//!   (snapshots, lists, memory) bounded while the log sees only large entries, a process
//!   keeps at most [`WorkloadOptions::padded_elements_max`] of its acknowledged elements
//!   padded: past that it rewrites the oldest one without its padding (a CAS on the version
//!   its add stored, not recorded in the history: it leaves the element as it was, and
//!   cannot create one that is gone). Lists are then paged
//!   ([`WorkloadOptions::list_page_limit`]) so that each answer fits the client's 4 MiB.
//!   An add a node refuses with ResourceExhausted (a limit such as the space quota) is a
//!   definite `fail` whose output names the limit ([`refusal_output`]), so that a run can
//!   count what a limit refused ([`refused_adds`]).
//! - **append**: a list in a resource's data, `append` = strong read then CAS
//!   write of the list plus the element (retried after CAS failures), `read` =
//!   strong read.
//! - **watch**: writers write and delete resources (register-style, unique
//!   values); one watcher per node keeps a watch open on that node (reopening
//!   from its last revision after a break) and logs every event. Checked by
//!   [`crate::watch_check`] against the acknowledged writes and the final state.
//! - **lifecycle**: data writes, version-less status writes, deletes that only mark (every
//!   lifetime has a finalizer), the writes removing the finalizer, re-creations, and watch
//!   caches with a selector compared with a List: [`crate::lifecycle`], checked by
//!   [`crate::lifecycle::check`].
//!
//! Every value is unique: `process * 1_000_000 + counter`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_client::v1::{
    watch_event, Consistency, Id, ListRequest, Resource, Tenancy, Type, WatchListRequest,
};
use cairn_client::{Client, ClientError, ClientOptions, Outcome as ClientOutcome};
use cairn_proto::google::protobuf::Any;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cluster::Lifetimes;
use crate::history::{History, OpKind, Outcome, Recorder, Value};

/// Group of every resource the workloads write.
pub const GROUP: &str = "jepsen";
/// The metadata key of a set element's padding ([`WorkloadOptions::payload_bytes`]).
pub const PADDING_KEY: &str = "jepsen-padding";
/// The most bytes of resources one page of a set list may carry: the client decodes
/// answers of at most 4 MiB (tonic's default).
const LIST_PAGE_BYTES_MAX: usize = 3 * 1024 * 1024;
const TYPE_URL: &str = "jepsen/value";

/// Which workload a scenario runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorkloadKind {
    Register,
    Set,
    Append,
    Watch,
    /// Status writes, finalizers, deletion marks and a selector-fed cache
    /// ([`crate::lifecycle`]); needs cluster version 0.2, which the runner waits for.
    Lifecycle,
    /// Leases, one election and fenced writes: run by [`crate::election`] (its own
    /// candidates, final reads and checker), with the fencing nemesis only; not in
    /// [`WorkloadKind::ALL`].
    Election,
}

impl WorkloadKind {
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Register => "register",
            WorkloadKind::Set => "set",
            WorkloadKind::Append => "append",
            WorkloadKind::Watch => "watch",
            WorkloadKind::Lifecycle => "lifecycle",
            WorkloadKind::Election => "election",
        }
    }

    /// The workloads of this module, which any nemesis but the fencing one may run with.
    pub const ALL: [WorkloadKind; 5] = [
        WorkloadKind::Register,
        WorkloadKind::Set,
        WorkloadKind::Append,
        WorkloadKind::Watch,
        WorkloadKind::Lifecycle,
    ];

    fn kind_name(self) -> &'static str {
        match self {
            WorkloadKind::Register => "Register",
            WorkloadKind::Set => "SetElement",
            WorkloadKind::Append => "List",
            WorkloadKind::Watch => "Watched",
            WorkloadKind::Lifecycle => "Lifecycle",
            WorkloadKind::Election => "Election",
        }
    }
}

/// Sizes and pacing of a workload.
#[derive(Clone, Debug)]
pub struct WorkloadOptions {
    pub kind: WorkloadKind,
    pub processes: usize,
    pub keys: usize,
    /// Pause between two operations of one process, drawn uniformly.
    pub pause_ms: (u64, u64),
    pub client: ClientOptions,
    pub seed: u64,
    /// Set workload: bytes of random padding each add carries (0 = none); see the module
    /// docs.
    pub payload_bytes: usize,
    /// Set workload with padding: acknowledged elements a process keeps padded before it
    /// strips the oldest one's padding (`usize::MAX`: never; the data only grows).
    pub padded_elements_max: usize,
    /// Prepended to every key's resource name ([`WorkloadOptions::key`]), so that runs on
    /// one cluster (drills) do not see each other's data; empty in the fault suite.
    pub key_prefix: String,
}

impl WorkloadOptions {
    pub fn new(kind: WorkloadKind, seed: u64) -> WorkloadOptions {
        let client = ClientOptions {
            request_timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_millis(500),
            ..ClientOptions::default()
        };
        WorkloadOptions {
            kind,
            // The lifecycle workload: one process per role and more data writers
            // ([`crate::lifecycle::Role::of`]).
            processes: if kind == WorkloadKind::Lifecycle {
                7
            } else {
                6
            },
            keys: match kind {
                WorkloadKind::Register => 4,
                WorkloadKind::Set => 2,
                WorkloadKind::Append => 3,
                WorkloadKind::Watch => 6,
                WorkloadKind::Lifecycle => 4,
                WorkloadKind::Election => 1,
            },
            pause_ms: (20, 60),
            client,
            seed,
            payload_bytes: 0,
            padded_elements_max: 0,
            key_prefix: String::new(),
        }
    }

    /// The resource name (or name prefix) of key `key` in this run.
    pub fn key(&self, key: usize) -> String {
        format!("{}{}", self.key_prefix, key_name(self.kind, key))
    }

    /// The page size of set lists: every resource of a page fits one answer (0 = the
    /// node's own page size, for elements without padding).
    pub fn list_page_limit(&self) -> u32 {
        if self.payload_bytes == 0 {
            return 0;
        }
        // An element's resource: its padding plus its id, version and data.
        let element_bytes = self.payload_bytes + 1024;
        u32::try_from((LIST_PAGE_BYTES_MAX / element_bytes).max(1)).unwrap_or(u32::MAX)
    }
}

/// The output of a set add that a node refused with ResourceExhausted, naming the
/// `limit` the refusal names (`data_bytes_max` for the space quota). The outcome stays
/// `fail` (certainly not applied, so the set checker counts the element as failed, and
/// flags it if a read ever lists it); the output only says why.
pub fn refusal_output(limit: &str) -> Value {
    Value::Str(format!("resource exhausted: {limit}"))
}

/// How many adds of `history` the limit `limit` refused ([`refusal_output`]).
pub fn refused_adds(history: &History, limit: &str) -> usize {
    let refused = refusal_output(limit);
    history
        .operations()
        .iter()
        .filter(|op| op.op == OpKind::Add && op.outcome == Outcome::Fail && op.output == refused)
        .count()
}

/// `len` random characters from a 64-letter alphabet (6 bits of entropy each): padding
/// that no compression along the way can shrink much.
fn padding(rng: &mut StdRng, len: usize) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bytes = vec![0u8; len];
    rng.fill(&mut bytes[..]);
    bytes
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(b & 63)]))
        .collect()
}

/// The lifetime of the node behind each endpoint of a workload (from
/// [`crate::cluster::Cluster::lifetimes`]): an eventual read records its node's
/// lifetime when it is invoked and checks it again when it completes.
#[derive(Clone, Debug)]
pub struct NodeLifetimes {
    lifetimes: Lifetimes,
    /// The node id of each endpoint, in the endpoints' order.
    ids: Vec<u64>,
}

impl NodeLifetimes {
    pub fn new(lifetimes: Lifetimes, ids: Vec<u64>) -> NodeLifetimes {
        NodeLifetimes { lifetimes, ids }
    }

    /// The current lifetime of the node behind endpoint `endpoint` (one of the
    /// workload's: [`Workload::start`] checks there is an id for each).
    fn of(&self, endpoint: usize) -> u64 {
        self.lifetimes.of(self.ids[endpoint])
    }
}

/// The type of the workload's resources.
pub fn resource_type(kind: WorkloadKind) -> Type {
    Type {
        group: GROUP.into(),
        group_version: "v1".into(),
        kind: kind.kind_name().into(),
    }
}

pub fn tenancy() -> Tenancy {
    Tenancy {
        partition: "default".into(),
        namespace: "default".into(),
    }
}

/// The id of `name` (any lifetime when `uid` is empty).
pub fn resource_id(kind: WorkloadKind, name: &str, uid: &str) -> Id {
    Id {
        uid: uid.into(),
        name: name.into(),
        r#type: Some(resource_type(kind)),
        tenancy: Some(tenancy()),
    }
}

/// The resource name of a key.
pub fn key_name(kind: WorkloadKind, key: usize) -> String {
    match kind {
        WorkloadKind::Register => format!("reg{key:02}"),
        WorkloadKind::Set => format!("set{key:02}-"),
        WorkloadKind::Append => format!("list{key:02}"),
        WorkloadKind::Watch => format!("w{key:02}"),
        WorkloadKind::Lifecycle => format!("lc{key:02}"),
        WorkloadKind::Election => crate::election::check::ELECTION_KEY.to_owned(),
    }
}

pub(crate) fn encode(value: &Value) -> Option<Any> {
    // Serializing a Value cannot fail (no maps with non-string keys, no floats).
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    Some(Any {
        type_url: TYPE_URL.into(),
        value: Bytes::from(bytes),
    })
}

/// The value a resource carries; something undecodable is reported as a
/// string value that no write produced (the checkers then flag it).
pub fn decode(resource: &Resource) -> Value {
    match &resource.data {
        Some(any) if any.type_url == TYPE_URL => serde_json::from_slice(&any.value)
            .unwrap_or_else(|e| Value::Str(format!("<undecodable data: {e}>"))),
        Some(any) => Value::Str(format!("<foreign data type {}>", any.type_url)),
        None => Value::Str("<no data>".into()),
    }
}

fn new_resource(
    kind: WorkloadKind,
    name: &str,
    uid: &str,
    version: &str,
    value: &Value,
) -> Resource {
    Resource {
        id: Some(resource_id(kind, name, uid)),
        version: version.into(),
        data: encode(value),
        ..Resource::default()
    }
}

/// A client whose first endpoint is `home`.
pub(crate) fn process_client(
    endpoints: &[String],
    home: usize,
    options: &ClientOptions,
) -> Option<Client> {
    let n = endpoints.len();
    let rotated: Vec<String> = (0..n).map(|i| endpoints[(home + i) % n].clone()).collect();
    Client::new(&rotated, options.clone()).ok()
}

/// Makes the client's home node (its first endpoint) the preferred one again.
pub(crate) fn pin_home(client: &Client) {
    // `avoid(e)` prefers the endpoint after `e`; after the last one comes the first.
    if let Some(last) = client.endpoints().last() {
        client.avoid(&last.clone());
    }
}

/// What the current state of a key looks like to a process.
struct Observed {
    uid: String,
    version: String,
    value: Value,
}

/// A strong read: `Ok(None)` = nothing stored.
async fn read_key(
    client: &Client,
    kind: WorkloadKind,
    name: &str,
) -> Result<Option<Observed>, ClientError> {
    match client
        .read(resource_id(kind, name, ""), Consistency::Strong)
        .await
    {
        Ok(resource) => Ok(Some(Observed {
            uid: resource
                .id
                .as_ref()
                .map(|i| i.uid.clone())
                .unwrap_or_default(),
            version: resource.version.clone(),
            value: decode(&resource),
        })),
        Err(ClientError::NotFound) => Ok(None),
        Err(e) => Err(e),
    }
}

/// How a blind write (read for the version, then CAS) ended.
enum WriteResult {
    /// Stored at this version.
    Written(String),
    /// Certainly not applied.
    NotApplied,
    /// May have applied.
    Unknown,
}

/// Writes `value` whatever is stored: read the version, CAS, and start over
/// after a CAS conflict (up to 8 attempts). Stops at the first attempt whose
/// outcome is unknown.
async fn blind_write(
    client: &Client,
    kind: WorkloadKind,
    name: &str,
    value: &Value,
) -> WriteResult {
    for _ in 0..8 {
        let (uid, version) = match read_key(client, kind, name).await {
            Ok(Some(o)) => (o.uid, o.version),
            Ok(None) => (cairn_client::new_uid(), String::new()),
            Err(_) => return WriteResult::NotApplied,
        };
        match client
            .write(new_resource(kind, name, &uid, &version, value))
            .await
        {
            Ok(stored) => return WriteResult::Written(stored.version),
            Err(e) if e.is_cas_conflict() => continue,
            Err(e) if e.outcome() == ClientOutcome::Unknown => return WriteResult::Unknown,
            Err(_) => return WriteResult::NotApplied,
        }
    }
    WriteResult::NotApplied
}

/// One event a watcher received (or a marker of a reopened watch).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WatchRecord {
    /// The node watched (index into the endpoints).
    pub node: usize,
    /// "open" (revision = where it starts, 0 = with a snapshot), "upsert",
    /// "delete", "end_of_snapshot", "list" (right after an end_of_snapshot:
    /// an eventual list on the same node at its revision, the value as
    /// [`crate::watch_check::list_record_value`] writes it), "progress",
    /// "resync" (history compacted: the next open is a fresh snapshot) or
    /// "error" (version = the message).
    pub event: String,
    pub revision: u64,
    pub name: String,
    pub version: String,
    pub value: Value,
    /// Nanoseconds since the workload started.
    pub at_ns: u64,
}

/// What a running workload shares with its tasks.
pub struct Workload {
    pub options: WorkloadOptions,
    pub recorder: Recorder,
    /// Eventual reads, each served by one node alone (register workload):
    /// `read` with `[node, lifetime]` as input (the node's index among the
    /// endpoints, and how many times it had been started when the read was
    /// invoked) and `[version, value]` as output (version 0 = nothing stored).
    /// A read during which the node was restarted is recorded `info`: either
    /// lifetime may have served it. Kept apart from [`Workload::recorder`]:
    /// they are not linearizable, only monotonic per node lifetime.
    pub eventual: Recorder,
    pub watch_log: Arc<Mutex<Vec<WatchRecord>>>,
    /// The lifecycle workload's raw watch events and cache comparisons
    /// ([`crate::lifecycle::Record`]), on the recorder's clock.
    pub lifecycle_log: crate::lifecycle::Records,
    stop: Arc<AtomicBool>,
    stop_watchers: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    watchers: Vec<tokio::task::JoinHandle<()>>,
    started: std::time::Instant,
}

impl Workload {
    /// Starts the processes (and, for the watch workload, one watcher per node).
    /// `lifetimes` names the node behind each endpoint.
    pub fn start(
        options: WorkloadOptions,
        endpoints: &[String],
        lifetimes: NodeLifetimes,
    ) -> Workload {
        assert!(!endpoints.is_empty(), "a workload needs at least one node");
        assert_ne!(
            options.kind,
            WorkloadKind::Election,
            "the election workload runs in crate::election"
        );
        assert_eq!(
            lifetimes.ids.len(),
            endpoints.len(),
            "one node id per endpoint"
        );
        let recorder = Recorder::new();
        let eventual = Recorder::new();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_watchers = Arc::new(AtomicBool::new(false));
        let watch_log = Arc::new(Mutex::new(Vec::new()));
        let lifecycle_log: crate::lifecycle::Records = Arc::new(Mutex::new(Vec::new()));
        let started = std::time::Instant::now();
        let mut rng = StdRng::seed_from_u64(options.seed);
        let mut tasks = Vec::new();
        for process in 0..options.processes as u64 {
            let home = rng.random_range(0..endpoints.len());
            let Some(client) = process_client(endpoints, home, &options.client) else {
                continue;
            };
            let process_rng = StdRng::seed_from_u64(rng.random());
            if options.kind == WorkloadKind::Lifecycle {
                let p = crate::lifecycle::LifecycleProcess::new(
                    process,
                    client,
                    recorder.clone(),
                    process_rng,
                    options.keys,
                );
                tasks.push(tokio::spawn(p.run(stop.clone())));
                continue;
            }
            let home_client = Client::new(&[endpoints[home].clone()], options.client.clone()).ok();
            let p = Process {
                id: process,
                client,
                recorder: recorder.clone(),
                home,
                home_client,
                eventual: eventual.clone(),
                lifetimes: lifetimes.clone(),
                kind: options.kind,
                keys: options.keys,
                pause_ms: options.pause_ms,
                rng: process_rng,
                counter: 0,
                seen: BTreeMap::new(),
                payload_bytes: options.payload_bytes,
                padded_elements_max: options.padded_elements_max,
                key_prefix: options.key_prefix.clone(),
                list_page_limit: options.list_page_limit(),
                padded: VecDeque::new(),
            };
            let stop = stop.clone();
            tasks.push(tokio::spawn(p.run(stop)));
        }
        let mut watchers = Vec::new();
        if options.kind == WorkloadKind::Watch {
            for (node, endpoint) in endpoints.iter().enumerate() {
                let Ok(client) =
                    Client::new(std::slice::from_ref(endpoint), options.client.clone())
                else {
                    continue;
                };
                watchers.push(tokio::spawn(watcher(
                    node,
                    client,
                    watch_log.clone(),
                    stop_watchers.clone(),
                    started,
                )));
            }
        }
        if options.kind == WorkloadKind::Lifecycle {
            // One raw watcher per node (check 2), and the selector caches (check 3).
            for (node, endpoint) in endpoints.iter().enumerate() {
                let Ok(client) =
                    Client::new(std::slice::from_ref(endpoint), options.client.clone())
                else {
                    continue;
                };
                watchers.push(tokio::spawn(crate::lifecycle::raw_watcher(
                    node,
                    client,
                    lifecycle_log.clone(),
                    recorder.clone(),
                    stop_watchers.clone(),
                )));
            }
            for cache in 0..crate::lifecycle::CACHES {
                let Some(client) =
                    crate::lifecycle::cache_client(endpoints, cache, &options.client)
                else {
                    continue;
                };
                watchers.push(tokio::spawn(crate::lifecycle::cache_comparer(
                    cache,
                    client,
                    lifecycle_log.clone(),
                    recorder.clone(),
                    stop_watchers.clone(),
                    rng.random(),
                )));
            }
        }
        Workload {
            options,
            recorder,
            eventual,
            watch_log,
            lifecycle_log,
            stop,
            stop_watchers,
            tasks,
            watchers,
            started,
        }
    }

    /// Stops the processes and waits for their operations in flight (bounded
    /// by the request timeout plus a margin; stragglers are aborted and their
    /// operations recorded as never completed).
    pub async fn stop_processes(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let limit = self.options.client.request_timeout * 10 + Duration::from_secs(5);
        let deadline = tokio::time::Instant::now() + limit;
        for task in self.tasks.drain(..) {
            let abort = task.abort_handle();
            if tokio::time::timeout_at(deadline, task).await.is_err() {
                abort.abort();
            }
        }
    }

    /// Stops the watchers.
    pub async fn stop_watchers(&mut self) {
        self.stop_watchers.store(true, Ordering::SeqCst);
        for task in self.watchers.drain(..) {
            task.abort();
            let _ = task.await;
        }
    }

    /// Nanoseconds since the workload started (the watch log's clock).
    pub fn elapsed_ns(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The final reads after the faults are healed, recorded in the history:
    /// one strong read (or list) per key through `client`, retried until it
    /// succeeds or `timeout` passes. Returns false if some key could not be read.
    pub async fn final_reads(&self, client: &Client, timeout: Duration) -> bool {
        let kind = self.options.kind;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut all = true;
        for key in 0..self.options.keys {
            let name = self.options.key(key);
            let mut done = false;
            while !done && tokio::time::Instant::now() < deadline {
                done = match kind {
                    WorkloadKind::Set => {
                        let page = self.options.list_page_limit();
                        set_read(client, &self.recorder, u64::MAX, &name, page).await
                    }
                    WorkloadKind::Register | WorkloadKind::Append | WorkloadKind::Watch => {
                        value_read(client, &self.recorder, u64::MAX, kind, &name).await
                    }
                    WorkloadKind::Lifecycle => {
                        crate::lifecycle::recorded_read(client, &self.recorder, u64::MAX, &name)
                            .await
                            .is_some()
                    }
                    WorkloadKind::Election => {
                        unreachable!(
                            "the election workload is crate::election's, never started here"
                        )
                    }
                };
                if !done {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            all &= done;
        }
        all
    }

    /// The latest revision every watcher of `nodes` has reached (0 if one has
    /// seen nothing).
    pub fn watchers_revision(&self, nodes: &[usize]) -> u64 {
        let log = self.watch_log.lock();
        nodes
            .iter()
            .map(|&node| {
                log.iter()
                    .filter(|r| r.node == node)
                    .map(|r| r.revision)
                    .max()
                    .unwrap_or(0)
            })
            .min()
            .unwrap_or(0)
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.stop_watchers.store(true, Ordering::SeqCst);
        for t in self.tasks.iter().chain(self.watchers.iter()) {
            t.abort();
        }
    }
}

/// A strong read of a register/list key, recorded; true when it succeeded.
async fn value_read(
    client: &Client,
    recorder: &Recorder,
    process: u64,
    kind: WorkloadKind,
    name: &str,
) -> bool {
    let op = recorder.invoke(process, OpKind::Read, name, Value::Null);
    match read_key(client, kind, name).await {
        Ok(Some(o)) => {
            op.ok(o.value);
            true
        }
        Ok(None) => {
            // An absent list is the empty list; an absent register is nil.
            op.ok(if kind == WorkloadKind::Append {
                Value::List(vec![])
            } else {
                Value::Null
            });
            true
        }
        Err(e) if e.outcome().is_definite() => {
            op.fail();
            false
        }
        Err(_) => {
            op.info();
            false
        }
    }
}

/// A strong list of a set key's prefix, recorded as a read of the set; pages of at most
/// `page_limit` resources (0 = the node's page size), all at the first page's revision.
async fn set_read(
    client: &Client,
    recorder: &Recorder,
    process: u64,
    prefix: &str,
    page_limit: u32,
) -> bool {
    let op = recorder.invoke(process, OpKind::Read, prefix, Value::Null);
    match client
        .list_request(ListRequest {
            r#type: Some(resource_type(WorkloadKind::Set)),
            tenancy: Some(tenancy()),
            name_prefix: prefix.into(),
            consistency: Consistency::Strong as i32,
            limit: page_limit,
            ..ListRequest::default()
        })
        .await
    {
        Ok(list) => {
            let mut elements: Vec<Value> = list.resources.iter().map(decode).collect();
            elements.sort();
            op.ok(Value::List(elements));
            true
        }
        Err(_) => {
            op.fail();
            false
        }
    }
}

/// A set element whose add was acknowledged: its resource's name and uid, and the version
/// the add stored.
pub(crate) struct Added {
    pub name: String,
    pub uid: String,
    pub version: String,
}

/// Adds `element` to the set `prefix` (creates the resource `<prefix><element>`, with
/// `padding` in [`PADDING_KEY`] if given), recorded as `add` by `process`: `ok` with the
/// version stored as its output; `fail` when certainly not applied (with the limit that
/// refused it, [`refusal_output`]); `info` when it may have applied. `Some` when acknowledged.
pub(crate) async fn set_add(
    client: &Client,
    recorder: &Recorder,
    process: u64,
    prefix: &str,
    element: &Value,
    padding: Option<String>,
) -> Option<Added> {
    let name = format!("{prefix}{element}");
    let uid = cairn_client::new_uid();
    let mut resource = new_resource(WorkloadKind::Set, &name, &uid, "", element);
    if let Some(padding) = padding {
        resource.metadata.insert(PADDING_KEY.into(), padding);
    }
    let op = recorder.invoke(process, OpKind::Add, prefix, element.clone());
    match client.write(resource).await {
        Ok(stored) => {
            op.ok(Value::Str(stored.version.clone()));
            Some(Added {
                name,
                uid,
                version: stored.version,
            })
        }
        // Nobody else creates this name: a conflict would mean an earlier attempt applied,
        // which never happens (no retries); unknown.
        Err(e) if e.is_cas_conflict() => {
            op.info();
            None
        }
        // Definite (the client never retries a write after an attempt that may have
        // applied), with the limit that refused it.
        Err(ClientError::ResourceExhausted { limit, .. }) => {
            op.complete(Outcome::Fail, refusal_output(&limit));
            None
        }
        Err(e) if e.outcome().is_definite() => {
            op.fail();
            None
        }
        Err(_) => {
            op.info();
            None
        }
    }
}

/// How a recorded CAS ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CasResult {
    Applied,
    /// The compare was evaluated and did not match.
    Failed,
    /// Unknown, or refused before the compare.
    Unknown,
}

/// One logical client process.
struct Process {
    id: u64,
    client: Client,
    recorder: Recorder,
    /// The home node and a client bound to it alone (eventual reads).
    home: usize,
    home_client: Option<Client>,
    eventual: Recorder,
    lifetimes: NodeLifetimes,
    kind: WorkloadKind,
    keys: usize,
    pause_ms: (u64, u64),
    rng: StdRng,
    counter: i64,
    /// Per key: (value, uid, version) pairs this process has observed, newest last.
    seen: BTreeMap<String, Vec<(Value, String, String)>>,
    /// Set workload: see [`WorkloadOptions::payload_bytes`].
    payload_bytes: usize,
    padded_elements_max: usize,
    key_prefix: String,
    list_page_limit: u32,
    /// This process's acknowledged elements that still carry their padding, oldest first.
    padded: VecDeque<PaddedElement>,
}

/// An acknowledged set element that still carries its padding, as its add stored it.
struct PaddedElement {
    name: String,
    uid: String,
    version: String,
    element: Value,
}

impl Process {
    fn next_value(&mut self) -> Value {
        self.counter += 1;
        Value::Int(i64::try_from(self.id).unwrap_or(0) * 1_000_000 + self.counter)
    }

    async fn run(mut self, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::SeqCst) {
            pin_home(&self.client);
            let key = self.rng.random_range(0..self.keys);
            let name = format!("{}{}", self.key_prefix, key_name(self.kind, key));
            match self.kind {
                WorkloadKind::Register => self.register_op(&name).await,
                WorkloadKind::Set => self.set_op(&name).await,
                WorkloadKind::Append => self.append_op(&name).await,
                WorkloadKind::Watch => self.watch_writer_op(&name).await,
                WorkloadKind::Lifecycle => {
                    unreachable!("the lifecycle workload runs crate::lifecycle's processes")
                }
                WorkloadKind::Election => {
                    unreachable!("the election workload is crate::election's, never started here")
                }
            }
            let pause = self.rng.random_range(self.pause_ms.0..=self.pause_ms.1);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    fn remember(&mut self, name: &str, observed: &Observed) {
        let seen = self.seen.entry(name.to_owned()).or_default();
        if seen.last().is_none_or(|(_, _, v)| *v != observed.version) {
            seen.push((
                observed.value.clone(),
                observed.uid.clone(),
                observed.version.clone(),
            ));
            if seen.len() > 16 {
                seen.remove(0);
            }
        }
    }

    async fn register_op(&mut self, name: &str) {
        let choice = self.rng.random_range(0..100);
        if choice < 40 {
            self.recorded_read(name).await;
        } else if choice < 50 {
            self.eventual_read(name).await;
        } else if choice < 75 {
            // A write whatever is stored: recorded as what it is, a strong
            // read for the version, then a CAS from the value read (so the
            // checker sees the compare); after a definite CAS failure it
            // starts over with a new value (up to 8 attempts).
            for _ in 0..8 {
                let Some(observed) = self.recorded_read(name).await else {
                    return;
                };
                let (from, uid, version) = match observed {
                    Some(o) => (o.value, o.uid, o.version),
                    None => (Value::Null, cairn_client::new_uid(), String::new()),
                };
                if self.recorded_cas(name, from, uid, version).await != CasResult::Failed {
                    return;
                }
            }
        } else {
            // CAS from a value this process observed (the latest, or an older
            // one, which makes a definite failure likely), or from nil.
            let seen = self.seen.get(name).cloned().unwrap_or_default();
            let (from, uid, version) = if seen.is_empty() {
                (Value::Null, cairn_client::new_uid(), String::new())
            } else if self.rng.random_bool(0.7) {
                seen[seen.len() - 1].clone()
            } else {
                seen[self.rng.random_range(0..seen.len())].clone()
            };
            self.recorded_cas(name, from, uid, version).await;
        }
    }

    /// A strong read of a register, recorded: `None` when it did not succeed,
    /// `Some(None)` when nothing is stored.
    async fn recorded_read(&mut self, name: &str) -> Option<Option<Observed>> {
        let op = self
            .recorder
            .invoke(self.id, OpKind::Read, name, Value::Null);
        match read_key(&self.client, WorkloadKind::Register, name).await {
            Ok(Some(o)) => {
                op.ok(o.value.clone());
                self.remember(name, &o);
                Some(Some(o))
            }
            Ok(None) => {
                op.ok(Value::Null);
                Some(None)
            }
            Err(e) if e.outcome().is_definite() => {
                op.fail();
                None
            }
            Err(_) => {
                op.info();
                None
            }
        }
    }

    /// An eventual read of a register on the home node only, recorded in the
    /// eventual history with the node's lifetime (see [`Workload::eventual`]).
    async fn eventual_read(&mut self, name: &str) {
        let Some(client) = &self.home_client else {
            return;
        };
        let lifetime = self.lifetimes.of(self.home);
        let op = self.eventual.invoke(
            self.id,
            OpKind::Read,
            name,
            Value::List(vec![
                Value::Int(i64::try_from(self.home).unwrap_or(i64::MAX)),
                Value::Int(i64::try_from(lifetime).unwrap_or(i64::MAX)),
            ]),
        );
        let answer = client
            .read(
                resource_id(WorkloadKind::Register, name, ""),
                Consistency::Eventual,
            )
            .await;
        if self.lifetimes.of(self.home) != lifetime {
            // Restarted meanwhile: the answer may come from either lifetime.
            op.info();
            return;
        }
        match answer {
            Ok(resource) => {
                let version = resource.version.parse::<i64>().unwrap_or(-1);
                op.ok(Value::List(vec![Value::Int(version), decode(&resource)]));
            }
            Err(ClientError::NotFound) => op.ok(Value::List(vec![Value::Int(0), Value::Null])),
            Err(e) if e.outcome().is_definite() => op.fail(),
            Err(_) => op.info(),
        }
    }

    /// A CAS of a register from `from` (stored as `uid`/`version`) to a new
    /// value, recorded as `cas [from to]`.
    async fn recorded_cas(
        &mut self,
        name: &str,
        from: Value,
        uid: String,
        version: String,
    ) -> CasResult {
        let to = self.next_value();
        let op = self.recorder.invoke(
            self.id,
            OpKind::Cas,
            name,
            Value::List(vec![from, to.clone()]),
        );
        match self
            .client
            .write(new_resource(
                WorkloadKind::Register,
                name,
                &uid,
                &version,
                &to,
            ))
            .await
        {
            Ok(stored) => {
                op.ok(Value::Null);
                let observed = Observed {
                    uid,
                    version: stored.version,
                    value: to,
                };
                self.remember(name, &observed);
                CasResult::Applied
            }
            // The store compared and refused: the key did not hold `from`.
            Err(e) if e.is_cas_conflict() => {
                op.fail();
                CasResult::Failed
            }
            // Refused before the compare, or unknown: the weaker `info`.
            Err(_) => {
                op.info();
                CasResult::Unknown
            }
        }
    }

    async fn set_op(&mut self, prefix: &str) {
        if self.rng.random_range(0..100) < 80 {
            let element = self.next_value();
            let padding =
                (self.payload_bytes > 0).then(|| padding(&mut self.rng, self.payload_bytes));
            let added = set_add(
                &self.client,
                &self.recorder,
                self.id,
                prefix,
                &element,
                padding,
            )
            .await;
            // Only padded elements are kept track of, to strip their padding later.
            if let Some(added) = added.filter(|_| self.payload_bytes > 0) {
                self.padded.push_back(PaddedElement {
                    name: added.name,
                    uid: added.uid,
                    version: added.version,
                    element,
                });
                self.strip_padding().await;
            }
        } else {
            let page = self.list_page_limit;
            set_read(&self.client, &self.recorder, self.id, prefix, page).await;
        }
    }

    /// Rewrites this process's oldest padded elements without their padding until at most
    /// `padded_elements_max` are left (see the module docs). Not recorded: the element stays
    /// what it was. A rewrite that fails leaves that element padded for good.
    async fn strip_padding(&mut self) {
        while self.padded.len() > self.padded_elements_max {
            let Some(oldest) = self.padded.pop_front() else {
                return;
            };
            let stripped = new_resource(
                WorkloadKind::Set,
                &oldest.name,
                &oldest.uid,
                &oldest.version,
                &oldest.element,
            );
            let _ = self.client.write(stripped).await;
        }
    }

    async fn append_op(&mut self, name: &str) {
        if self.rng.random_range(0..100) < 60 {
            let element = self.next_value();
            let op = self
                .recorder
                .invoke(self.id, OpKind::Append, name, element.clone());
            for _ in 0..8 {
                let (uid, version, mut list) =
                    match read_key(&self.client, WorkloadKind::Append, name).await {
                        Ok(Some(o)) => (
                            o.uid,
                            o.version,
                            o.value.as_list().map(<[Value]>::to_vec).unwrap_or_default(),
                        ),
                        Ok(None) => (cairn_client::new_uid(), String::new(), vec![]),
                        // Every earlier attempt certainly failed.
                        Err(_) => return op.fail(),
                    };
                list.push(element.clone());
                match self
                    .client
                    .write(new_resource(
                        WorkloadKind::Append,
                        name,
                        &uid,
                        &version,
                        &Value::List(list),
                    ))
                    .await
                {
                    Ok(_) => return op.ok(Value::Null),
                    Err(e) if e.is_cas_conflict() => continue,
                    Err(e) if e.outcome() == ClientOutcome::Unknown => return op.info(),
                    Err(_) => return op.fail(),
                }
            }
            op.fail();
        } else {
            value_read(
                &self.client,
                &self.recorder,
                self.id,
                WorkloadKind::Append,
                name,
            )
            .await;
        }
    }

    async fn watch_writer_op(&mut self, name: &str) {
        if self.rng.random_range(0..100) < 90 {
            let value = self.next_value();
            let op = self
                .recorder
                .invoke(self.id, OpKind::Write, name, value.clone());
            match blind_write(&self.client, WorkloadKind::Watch, name, &value).await {
                // The version (the revision of the change) is kept for the watch check.
                WriteResult::Written(version) => op.ok(Value::Str(version)),
                WriteResult::NotApplied => op.fail(),
                WriteResult::Unknown => op.info(),
            }
        } else {
            // Delete whatever is current (read, then delete by version).
            let op = self
                .recorder
                .invoke(self.id, OpKind::Delete, name, Value::Null);
            let current = match read_key(&self.client, WorkloadKind::Watch, name).await {
                Ok(Some(o)) => o,
                Ok(None) => return op.ok(Value::Null),
                Err(_) => return op.fail(),
            };
            match self
                .client
                .delete(
                    resource_id(WorkloadKind::Watch, name, &current.uid),
                    current.version,
                )
                .await
            {
                Ok(revision) => op.ok(Value::Str(revision.to_string())),
                Err(e) if e.outcome().is_definite() => op.fail(),
                Err(_) => op.info(),
            }
        }
    }
}

/// An eventual list of the watch workload's resources at `revision` on the
/// client's one node, as a `list` watch record's value.
async fn list_at(client: &Client, revision: u64) -> Option<Value> {
    let request = ListRequest {
        r#type: Some(resource_type(WorkloadKind::Watch)),
        tenancy: Some(Tenancy {
            partition: "*".into(),
            namespace: "*".into(),
        }),
        name_prefix: String::new(),
        consistency: Consistency::Eventual as i32,
        revision,
        ..ListRequest::default()
    };
    let list = client.list_request(request).await.ok()?;
    if list.revision != revision {
        return Some(Value::Str(format!(
            "<list asked for revision {revision} answered at {}>",
            list.revision
        )));
    }
    let resources = list
        .resources
        .iter()
        .map(|r| {
            (
                r.id.as_ref().map(|i| i.name.clone()).unwrap_or_default(),
                crate::watch_check::Stored {
                    version: r.version.clone(),
                    value: decode(r),
                },
            )
        })
        .collect();
    Some(crate::watch_check::list_record_value(resources))
}

/// One watcher: keeps a watch open on its node, reopening from the last
/// revision it saw (or with a fresh snapshot when that history is compacted).
async fn watcher(
    node: usize,
    client: Client,
    log: Arc<Mutex<Vec<WatchRecord>>>,
    stop: Arc<AtomicBool>,
    started: std::time::Instant,
) {
    let now = || u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let push = |event: &str, revision: u64, name: String, version: String, value: Value| {
        log.lock().push(WatchRecord {
            node,
            event: event.into(),
            revision,
            name,
            version,
            value,
            at_ns: now(),
        });
    };
    let mut last_revision = 0u64;
    while !stop.load(Ordering::SeqCst) {
        // That revision comes again whole; the checker knows a replay.
        let start_revision = cairn_client::watch_resume_revision(last_revision);
        let request = WatchListRequest {
            r#type: Some(resource_type(WorkloadKind::Watch)),
            tenancy: Some(Tenancy {
                partition: "*".into(),
                namespace: "*".into(),
            }),
            name_prefix: String::new(),
            start_revision,
            consistency: Consistency::Eventual as i32,
            selector: String::new(),
        };
        let mut stream = match client.watch_list(request).await {
            Ok(s) => s,
            Err(ClientError::Compacted { .. }) => {
                push(
                    "resync",
                    last_revision,
                    String::new(),
                    String::new(),
                    Value::Null,
                );
                last_revision = 0;
                continue;
            }
            Err(e) => {
                push(
                    "error",
                    last_revision,
                    String::new(),
                    e.to_string(),
                    Value::Null,
                );
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            }
        };
        // "open" at 0 = a snapshot follows; at r > 0 = changes after r follow.
        push(
            "open",
            start_revision,
            String::new(),
            String::new(),
            Value::Null,
        );
        if start_revision == 0 {
            last_revision = 0;
        }
        // Until EndOfSnapshot, events are the snapshot: a break then means
        // starting over with a new snapshot, not resuming from their revisions.
        let mut in_snapshot = start_revision == 0;
        loop {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let next = tokio::time::timeout(Duration::from_millis(500), stream.next()).await;
            let item = match next {
                Err(_) => continue,
                Ok(None) => break,
                Ok(Some(item)) => item,
            };
            match item {
                Ok(event) => {
                    let revision = event.revision;
                    match event.event {
                        Some(watch_event::Event::Upsert(u)) => {
                            let r = u.resource.unwrap_or_default();
                            let name = r.id.as_ref().map(|i| i.name.clone()).unwrap_or_default();
                            push("upsert", revision, name, r.version.clone(), decode(&r));
                        }
                        Some(watch_event::Event::Delete(d)) => {
                            let r = d.resource.unwrap_or_default();
                            let name = r.id.as_ref().map(|i| i.name.clone()).unwrap_or_default();
                            push("delete", revision, name, r.version.clone(), decode(&r));
                        }
                        Some(watch_event::Event::EndOfSnapshot(_)) => {
                            push(
                                "end_of_snapshot",
                                revision,
                                String::new(),
                                String::new(),
                                Value::Null,
                            );
                            in_snapshot = false;
                            // A list at the snapshot's revision on the same
                            // node, for the checker to compare with the
                            // snapshot (nothing is logged if it fails).
                            if let Some(listed) = list_at(&client, revision).await {
                                push("list", revision, String::new(), String::new(), listed);
                            }
                        }
                        Some(watch_event::Event::Progress(_)) => {
                            push(
                                "progress",
                                revision,
                                String::new(),
                                String::new(),
                                Value::Null,
                            );
                        }
                        None => {}
                    }
                    if !in_snapshot {
                        last_revision = last_revision.max(revision);
                    }
                }
                Err(ClientError::Compacted { .. }) => {
                    push(
                        "resync",
                        last_revision,
                        String::new(),
                        String::new(),
                        Value::Null,
                    );
                    last_revision = 0;
                    break;
                }
                Err(e) => {
                    push(
                        "error",
                        last_revision,
                        String::new(),
                        e.to_string(),
                        Value::Null,
                    );
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
