//! The election workload's processes: candidates that campaign for one election through
//! their home node, keep their leases alive, write under their fencing token while they
//! hold, and sometimes pause, resign, revoke or stop renewing; and one watcher per node on
//! the election resource. Everything is recorded on one clock (the [`Recorder`]'s): the
//! candidates' operations in the history, the watchers' events in the watch log.
//!
//! A candidate talks to its home node alone (one endpoint): it stands for a process on that
//! machine, so isolating, stopping or killing the node cuts the candidate off with it, and
//! its lease runs out while it may still believe it holds.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_client::v1::{
    watch_event, Consistency, DeleteRequest, Fence, Id, ReadRequest, Reference, Resource, Tenancy,
    Type, WatchListRequest, WriteRequest,
};
use cairn_client::{Access, Client, ClientError, ClientOptions};
use cairn_proto::v1::lease_service_client::LeaseServiceClient;
use cairn_proto::v1::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseRevokeRequest,
};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::check::{
    refusal, write_name, FencedInput, ELECTION_KEY, FINAL_PROCESS, HELD, LEASE_GONE, LEASE_KEY,
    REFUSED_BY_FENCE,
};
use crate::history::{OpKind, Outcome, Recorder, Value};
use crate::workload::{self, WatchRecord};

/// The type of the election resource.
pub fn election_type() -> Type {
    Type {
        group: workload::GROUP.into(),
        group_version: "v1".into(),
        kind: "Election".into(),
    }
}

/// The type of the fenced writes' resources.
pub fn write_type() -> Type {
    Type {
        group: workload::GROUP.into(),
        group_version: "v1".into(),
        kind: "Fenced".into(),
    }
}

fn tenancy() -> Tenancy {
    Tenancy {
        partition: "default".into(),
        namespace: "default".into(),
    }
}

fn election_id(uid: &str) -> Id {
    Id {
        uid: uid.into(),
        name: ELECTION_KEY.into(),
        r#type: Some(election_type()),
        tenancy: Some(tenancy()),
    }
}

/// The fence of a write under `token`.
fn fence(token: u64) -> Fence {
    Fence {
        election: Some(Reference {
            r#type: Some(election_type()),
            tenancy: Some(tenancy()),
            name: ELECTION_KEY.into(),
            section: String::new(),
        }),
        token,
    }
}

/// How a holder's tenure ends when the workload ends it (the nemesis ends others), in turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Stop everything, keep-alives included, for longer than the TTL (the in-process
    /// stand-in for a SIGSTOP of the holder's process), then make one more fenced write
    /// with the old token before noticing the loss.
    Pause,
    /// Delete the election resource at its version (fenced).
    Resign,
    /// Stop renewing the lease, and keep writing until the fence refuses.
    StopRenewing,
    /// Revoke the lease: the election resource goes with it.
    Revoke,
}

/// The order endings come in: pauses most often (they make the stale writes).
pub const ENDINGS: [Ending; 6] = [
    Ending::Pause,
    Ending::Resign,
    Ending::Pause,
    Ending::StopRenewing,
    Ending::Pause,
    Ending::Revoke,
];

/// Sizes and pacing of the workload.
#[derive(Clone, Debug)]
pub struct ElectionOptions {
    pub candidates: usize,
    pub ttl_ms: u64,
    /// How long a holder holds before its ending, drawn uniformly.
    pub tenure_ms: (u64, u64),
    /// Pause between two fenced writes.
    pub write_pause_ms: (u64, u64),
    /// How often a waiting candidate reads the election.
    pub poll_ms: (u64, u64),
    pub client: ClientOptions,
    pub seed: u64,
}

impl ElectionOptions {
    pub fn new(seed: u64) -> ElectionOptions {
        ElectionOptions {
            candidates: 4,
            ttl_ms: super::TTL_MS,
            tenure_ms: (600, 1800),
            write_pause_ms: (20, 60),
            poll_ms: (80, 200),
            client: ClientOptions {
                request_timeout: Duration::from_secs(3),
                connect_timeout: Duration::from_millis(500),
                ..ClientOptions::default()
            },
            seed,
        }
    }
}

/// What the candidates share with each other and the nemesis.
struct Shared {
    stop: AtomicBool,
    /// The home node of the current holder.
    holder: Arc<Mutex<Option<u64>>>,
    /// The next ending ([`ENDINGS`]).
    endings: AtomicUsize,
}

/// A running election workload.
pub struct ElectionWorkload {
    pub recorder: Recorder,
    pub watch_log: Arc<Mutex<Vec<WatchRecord>>>,
    /// The home node of the current holder ([`crate::nemesis::fencing::ElectionLink`]).
    pub holder: Arc<Mutex<Option<u64>>>,
    pub options: ElectionOptions,
    shared: Arc<Shared>,
    stop_watchers: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    watchers: Vec<tokio::task::JoinHandle<()>>,
}

impl ElectionWorkload {
    /// Starts the candidates (home nodes spread over the nodes from a seeded one) and one
    /// watcher per node. `ids` are the nodes behind `endpoints`, in order.
    pub fn start(options: ElectionOptions, endpoints: &[String], ids: &[u64]) -> ElectionWorkload {
        assert!(!endpoints.is_empty(), "a workload needs at least one node");
        assert_eq!(ids.len(), endpoints.len(), "one node id per endpoint");
        let recorder = Recorder::new();
        let watch_log = Arc::new(Mutex::new(Vec::new()));
        let holder = Arc::new(Mutex::new(None));
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            holder: holder.clone(),
            endings: AtomicUsize::new(0),
        });
        let stop_watchers = Arc::new(AtomicBool::new(false));
        let mut rng = StdRng::seed_from_u64(options.seed);
        let first_home = rng.random_range(0..endpoints.len());
        let mut tasks = Vec::new();
        for process in 0..options.candidates as u64 {
            let home = (first_home + process as usize) % endpoints.len();
            let Ok(client) = Client::new(&[endpoints[home].clone()], options.client.clone()) else {
                continue;
            };
            let candidate = Candidate {
                id: process,
                node: ids[home],
                address: endpoints[home].clone(),
                client,
                channel: None,
                recorder: recorder.clone(),
                rng: StdRng::seed_from_u64(rng.random()),
                options: options.clone(),
                shared: shared.clone(),
                lease: None,
                seq: 0,
            };
            tasks.push(tokio::spawn(candidate.run()));
        }
        let mut watchers = Vec::new();
        for (node, endpoint) in endpoints.iter().enumerate() {
            let Ok(client) = Client::new(std::slice::from_ref(endpoint), options.client.clone())
            else {
                continue;
            };
            watchers.push(tokio::spawn(watcher(
                node,
                client,
                watch_log.clone(),
                recorder.clone(),
                stop_watchers.clone(),
            )));
        }
        ElectionWorkload {
            recorder,
            watch_log,
            holder,
            options,
            shared,
            stop_watchers,
            tasks,
            watchers,
        }
    }

    /// Stops the candidates and waits for their operations in flight (bounded; stragglers
    /// are aborted, their operations recorded as never completed). Their leases are left to
    /// expire.
    pub async fn stop_candidates(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let limit = self.options.client.request_timeout * 3 + Duration::from_secs(5);
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

    /// The final strong read of the election (recorded, by [`FINAL_PROCESS`]), retried
    /// through every node until it succeeds or `timeout` passes; returns when it was invoked.
    pub async fn final_read(&self, client: &Client, timeout: Duration) -> Option<u64> {
        let deadline = tokio::time::Instant::now() + timeout;
        while tokio::time::Instant::now() < deadline {
            let invoked_ns = self.recorder.now_ns();
            if recorded_read(client, &self.recorder, FINAL_PROCESS)
                .await
                .is_some()
            {
                return Some(invoked_ns);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        None
    }
}

impl Drop for ElectionWorkload {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.stop_watchers.store(true, Ordering::SeqCst);
        for t in self.tasks.iter().chain(self.watchers.iter()) {
            t.abort();
        }
    }
}

/// Every fenced write stored now: name and version (its revision), from a strong list, and
/// the list's revision.
pub async fn stored_writes(
    client: &Client,
) -> Result<(std::collections::BTreeMap<String, u64>, u64), ClientError> {
    let list = client
        .list(write_type(), tenancy(), "w", Consistency::Strong)
        .await?;
    let writes = list
        .resources
        .iter()
        .map(|r| {
            (
                r.id.as_ref().map(|i| i.name.clone()).unwrap_or_default(),
                r.version.parse().unwrap_or(0),
            )
        })
        .collect();
    Ok((writes, list.revision))
}

/// The holder a read shows: `[token, client, lease]`, or null when nobody holds it.
fn holder_value(resource: &Resource) -> Value {
    let client = match workload::decode(resource) {
        Value::List(items) => items.first().cloned().unwrap_or_default(),
        _ => Value::Null,
    };
    Value::List(vec![
        Value::Int(resource.version.parse().unwrap_or(-1)),
        client,
        Value::Int(i64::try_from(resource.lease).unwrap_or(-1)),
    ])
}

/// A strong read of the election, recorded: `Some(Some((token, uid, output)))` when held,
/// `Some(None)` when not, `None` when the read did not succeed.
async fn recorded_read(
    client: &Client,
    recorder: &Recorder,
    process: u64,
) -> Option<Option<(u64, String, Value)>> {
    let op = recorder.invoke(process, OpKind::Read, ELECTION_KEY, Value::Null);
    let answer = client
        .read_request(ReadRequest {
            id: Some(election_id("")),
            consistency: Consistency::Strong as i32,
            revision: 0,
        })
        .await;
    match answer {
        Ok(response) => {
            let Some(resource) = response.resource else {
                op.ok(Value::Null);
                return Some(None);
            };
            let output = holder_value(&resource);
            op.ok(output.clone());
            let token = resource.version.parse().unwrap_or(0);
            let uid = resource.id.map(|i| i.uid).unwrap_or_default();
            Some(Some((token, uid, output)))
        }
        Err(ClientError::NotFound) => {
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

/// How a lease call (grant, revoke) that failed with `status` is recorded: a node's verdict
/// that certainly did not apply (a refusal, no leader) is `fail` with the node's message;
/// Inconsistent or Internal (may have applied), or a transport failure, is `info`.
fn lease_call_failed(op: crate::history::OpHandle, status: &tonic::Status) {
    use cairn_proto::error::ApiError;
    match ApiError::from_cairn_status(status) {
        Some(ApiError::Inconsistent(_) | ApiError::Internal(_)) | None => op.info(),
        Some(verdict) => op.complete(Outcome::Fail, refusal("refused", &verdict.to_string())),
    }
}

/// The state a lease's keeper shares with its candidate.
#[derive(Default)]
struct KeeperState {
    /// Keep-alives are sent while this is set.
    renewing: AtomicBool,
    /// A keep-alive is between its send and its answer.
    in_flight: AtomicBool,
    /// A keep-alive was answered 0: the lease is gone for good.
    gone: AtomicBool,
    stop: AtomicBool,
}

/// A lease of a candidate and the task that keeps it alive.
struct Lease {
    id: u64,
    state: Arc<KeeperState>,
    task: tokio::task::JoinHandle<()>,
}

impl Lease {
    fn gone(&self) -> bool {
        self.state.gone.load(Ordering::SeqCst)
    }

    /// Stops sending keep-alives; returns once none is in flight.
    async fn hold_renewals(&self) {
        self.state.renewing.store(false, Ordering::SeqCst);
        while self.state.in_flight.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn resume_renewals(&self) {
        self.state.renewing.store(true, Ordering::SeqCst);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        self.task.abort();
    }
}

/// Opens a KeepAlive stream on `address`: the sender of its requests and its answers.
async fn open_keep_alive(
    address: &str,
) -> Option<(
    tokio::sync::mpsc::Sender<LeaseKeepAliveRequest>,
    tonic::Streaming<LeaseKeepAliveResponse>,
)> {
    let opening = async {
        let channel = Access::plaintext()
            .connect(address, Duration::from_millis(500))
            .await
            .ok()?;
        let (sender, receiver) = tokio::sync::mpsc::channel(4);
        let answers = LeaseServiceClient::new(channel)
            .keep_alive(ReceiverStream::new(receiver))
            .await
            .ok()?
            .into_inner();
        Some((sender, answers))
    };
    tokio::time::timeout(Duration::from_secs(1), opening)
        .await
        .ok()
        .flatten()
}

/// Keeps lease `lease` alive through `address`: a keep-alive every TTL/3 while renewing, each
/// answer awaited for at most the TTL (then the stream is dropped and opened again), until a
/// keep-alive answers 0 or the lease is dropped.
async fn keep_alive(
    address: String,
    lease: u64,
    ttl_ms: u64,
    process: u64,
    recorder: Recorder,
    state: Arc<KeeperState>,
) {
    let interval = Duration::from_millis(ttl_ms / 3);
    let answer_within = Duration::from_millis(ttl_ms);
    let mut stream = None;
    while !state.stop.load(Ordering::SeqCst) && !state.gone.load(Ordering::SeqCst) {
        // In flight first, then the check: a candidate that stops the renewals and then
        // finds nothing in flight knows no keep-alive will be sent.
        state.in_flight.store(true, Ordering::SeqCst);
        if !state.renewing.load(Ordering::SeqCst) {
            state.in_flight.store(false, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        if stream.is_none() {
            stream = open_keep_alive(&address).await;
        }
        let Some((sender, answers)) = stream.as_mut() else {
            state.in_flight.store(false, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let op = recorder.invoke(
            process,
            OpKind::KeepAlive,
            LEASE_KEY,
            Value::Int(lease as i64),
        );
        let answer = match sender.send(LeaseKeepAliveRequest { id: lease }).await {
            Ok(()) => tokio::time::timeout(answer_within, answers.message())
                .await
                .ok()
                .and_then(|a| a.ok())
                .flatten(),
            Err(_) => None,
        };
        match answer {
            Some(answer) => {
                op.ok(Value::Int(answer.ttl_ms as i64));
                if answer.ttl_ms == 0 {
                    state.gone.store(true, Ordering::SeqCst);
                }
            }
            None => {
                op.info();
                stream = None;
            }
        }
        state.in_flight.store(false, Ordering::SeqCst);
        tokio::time::sleep(interval).await;
    }
}

/// How a campaign ended.
enum Campaign {
    Won {
        token: u64,
        uid: String,
    },
    Held,
    LeaseGone,
    /// Refused for another reason, or unknown: look again.
    Unsure,
}

/// How a fenced write ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Written {
    Applied,
    RefusedByFence,
    Other,
}

/// One candidate.
struct Candidate {
    id: u64,
    /// Its home node's id and client address.
    node: u64,
    address: String,
    /// A client of the home node alone.
    client: Client,
    channel: Option<Channel>,
    recorder: Recorder,
    rng: StdRng,
    options: ElectionOptions,
    shared: Arc<Shared>,
    lease: Option<Lease>,
    /// The next fenced write's sequence number.
    seq: u64,
}

impl Candidate {
    fn stopped(&self) -> bool {
        self.shared.stop.load(Ordering::SeqCst)
    }

    /// Sleeps `duration`, or less once the workload stops.
    async fn sleep(&self, duration: Duration) {
        let until = tokio::time::Instant::now() + duration;
        while !self.stopped() && tokio::time::Instant::now() < until {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            tokio::time::sleep(left.min(Duration::from_millis(50))).await;
        }
    }

    fn millis(&mut self, range: (u64, u64)) -> Duration {
        Duration::from_millis(self.rng.random_range(range.0..=range.1))
    }

    async fn run(mut self) {
        while !self.stopped() {
            if self.lease.as_ref().is_none_or(Lease::gone) {
                self.lease = None;
                if !self.grant().await {
                    let pause = self.millis((200, 400));
                    self.sleep(pause).await;
                    continue;
                }
            }
            match self.campaign().await {
                Campaign::Won { token, uid } => self.hold(token, uid).await,
                Campaign::Held | Campaign::Unsure => self.wait_until_free().await,
                Campaign::LeaseGone => self.lease = None,
            }
        }
        self.lease = None;
    }

    async fn lease_client(&mut self) -> Option<LeaseServiceClient<Channel>> {
        if self.channel.is_none() {
            self.channel = Access::plaintext()
                .connect(&self.address, Duration::from_millis(500))
                .await
                .ok();
        }
        self.channel.clone().map(LeaseServiceClient::new)
    }

    /// Grants a lease and starts keeping it alive; false when none was granted.
    async fn grant(&mut self) -> bool {
        let ttl_ms = self.options.ttl_ms;
        let op = self
            .recorder
            .invoke(self.id, OpKind::Grant, LEASE_KEY, Value::Int(ttl_ms as i64));
        let Some(mut leases) = self.lease_client().await else {
            // Nothing was sent.
            op.fail();
            return false;
        };
        let answer = tokio::time::timeout(
            self.options.client.request_timeout,
            leases.grant(LeaseGrantRequest { ttl_ms }),
        )
        .await;
        match answer {
            Ok(Ok(granted)) => {
                let granted = granted.into_inner();
                op.ok(Value::List(vec![
                    Value::Int(granted.id as i64),
                    Value::Int(granted.revision as i64),
                ]));
                let state = Arc::new(KeeperState::default());
                state.renewing.store(true, Ordering::SeqCst);
                let task = tokio::spawn(keep_alive(
                    self.address.clone(),
                    granted.id,
                    granted.ttl_ms,
                    self.id,
                    self.recorder.clone(),
                    state.clone(),
                ));
                self.lease = Some(Lease {
                    id: granted.id,
                    state,
                    task,
                });
                true
            }
            Ok(Err(status)) => {
                lease_call_failed(op, &status);
                false
            }
            Err(_) => {
                op.info();
                self.channel = None;
                false
            }
        }
    }

    fn lease_id(&self) -> u64 {
        self.lease.as_ref().map_or(0, |l| l.id)
    }

    /// The create-only write of the election resource, attached to the lease.
    async fn campaign(&mut self) -> Campaign {
        let lease = self.lease_id();
        let uid = cairn_client::new_uid();
        let op = self.recorder.invoke(
            self.id,
            OpKind::Campaign,
            ELECTION_KEY,
            Value::Int(lease as i64),
        );
        let resource = Resource {
            id: Some(election_id(&uid)),
            version: String::new(),
            lease,
            data: workload::encode(&Value::List(vec![
                Value::Int(self.id as i64),
                Value::Int(lease as i64),
            ])),
            ..Resource::default()
        };
        match self.client.write(resource).await {
            Ok(stored) => {
                let token = stored.version.parse().unwrap_or(0);
                op.ok(Value::Int(token as i64));
                Campaign::Won { token, uid }
            }
            Err(e) if e.is_cas_conflict() => {
                op.complete(Outcome::Fail, refusal(HELD, &e.to_string()));
                Campaign::Held
            }
            Err(ClientError::FailedPrecondition(message)) if message.contains("lease") => {
                op.complete(Outcome::Fail, refusal(LEASE_GONE, &message));
                Campaign::LeaseGone
            }
            Err(e) if e.outcome().is_definite() => {
                op.complete(Outcome::Fail, refusal("refused", &e.to_string()));
                Campaign::Unsure
            }
            Err(_) => {
                op.info();
                Campaign::Unsure
            }
        }
    }

    /// Reads the election until nobody holds it (then campaigns again), or until the read
    /// shows this candidate holding it (a campaign whose answer was lost), or the lease is gone.
    async fn wait_until_free(&mut self) {
        while !self.stopped() {
            if self.lease.as_ref().is_none_or(Lease::gone) {
                return;
            }
            let pause = self.millis(self.options.poll_ms);
            self.sleep(pause).await;
            match recorded_read(&self.client, &self.recorder, self.id).await {
                Some(None) => return,
                Some(Some((token, uid, output))) => {
                    let mine = Value::List(vec![
                        Value::Int(token as i64),
                        Value::Int(self.id as i64),
                        Value::Int(self.lease_id() as i64),
                    ]);
                    if output == mine {
                        return self.hold(token, uid).await;
                    }
                }
                None => {}
            }
        }
    }

    /// One fenced write under `token`: a resource of its own ([`write_name`]), created.
    async fn fenced_write(&mut self, token: u64, stale: bool) -> Written {
        self.seq += 1;
        let input = FencedInput {
            token,
            seq: self.seq,
            stale,
        };
        let op = self
            .recorder
            .invoke(self.id, OpKind::Fenced, ELECTION_KEY, input.value());
        let resource = Resource {
            id: Some(Id {
                uid: cairn_client::new_uid(),
                name: write_name(self.id, self.seq),
                r#type: Some(write_type()),
                tenancy: Some(tenancy()),
            }),
            version: String::new(),
            data: workload::encode(&input.value()),
            ..Resource::default()
        };
        let answer = self
            .client
            .write_request(WriteRequest {
                resource: Some(resource),
                fence: Some(fence(token)),
            })
            .await;
        match answer {
            Ok(stored) => {
                op.ok(Value::Int(stored.version.parse().unwrap_or(-1)));
                Written::Applied
            }
            Err(ClientError::FailedPrecondition(message)) if message.contains("fence") => {
                op.complete(Outcome::Fail, refusal(REFUSED_BY_FENCE, &message));
                Written::RefusedByFence
            }
            Err(e) if e.outcome().is_definite() => {
                op.complete(Outcome::Fail, refusal("refused", &e.to_string()));
                Written::Other
            }
            Err(_) => {
                op.info();
                Written::Other
            }
        }
    }

    /// Holds the election at `token`: fenced writes until the tenure's ending (or until the
    /// fence refuses one, or the lease is gone).
    async fn hold(&mut self, token: u64, uid: String) {
        *self.shared.holder.lock() = Some(self.node);
        let tenure = self.millis(self.options.tenure_ms);
        let mut ending_at = tokio::time::Instant::now() + tenure;
        let mut renewing = true;
        while !self.stopped() {
            if self.lease.as_ref().is_none_or(Lease::gone) {
                break;
            }
            if tokio::time::Instant::now() >= ending_at {
                let ending =
                    ENDINGS[self.shared.endings.fetch_add(1, Ordering::SeqCst) % ENDINGS.len()];
                match ending {
                    Ending::Pause => {
                        if let Some(lease) = &self.lease {
                            lease.hold_renewals().await;
                        }
                        let pause =
                            Duration::from_millis(self.options.ttl_ms) + self.millis((1000, 2500));
                        self.sleep(pause).await;
                        if self.stopped() {
                            // Cut short: not a pause past the TTL.
                            break;
                        }
                        let written = self.fenced_write(token, true).await;
                        if let Some(lease) = &self.lease {
                            lease.resume_renewals();
                        }
                        if written == Written::RefusedByFence {
                            break;
                        }
                        let tenure = self.millis(self.options.tenure_ms);
                        ending_at = tokio::time::Instant::now() + tenure;
                        continue;
                    }
                    Ending::Resign => {
                        self.resign(token, &uid).await;
                        let cool_down = self.millis((200, 600));
                        self.sleep(cool_down).await;
                        break;
                    }
                    Ending::Revoke => {
                        self.revoke().await;
                        break;
                    }
                    Ending::StopRenewing if renewing => {
                        if let Some(lease) = &self.lease {
                            lease.hold_renewals().await;
                        }
                        renewing = false;
                        // Writes until the fence refuses.
                        ending_at += Duration::from_secs(3600);
                    }
                    Ending::StopRenewing => {}
                }
            }
            if self.fenced_write(token, false).await == Written::RefusedByFence {
                break;
            }
            let pause = self.millis(self.options.write_pause_ms);
            self.sleep(pause).await;
        }
        if !renewing {
            // Abandoned: it expires on its own.
            self.lease = None;
        }
        let mut holder = self.shared.holder.lock();
        if *holder == Some(self.node) {
            *holder = None;
        }
    }

    /// Deletes the election resource at `token` (fenced).
    async fn resign(&mut self, token: u64, uid: &str) {
        let op = self.recorder.invoke(
            self.id,
            OpKind::Resign,
            ELECTION_KEY,
            Value::Int(token as i64),
        );
        let answer = self
            .client
            .delete_request(DeleteRequest {
                id: Some(election_id(uid)),
                version: token.to_string(),
                fence: Some(fence(token)),
                orphan_dependents: false,
            })
            .await;
        match answer {
            Ok(answer) => op.ok(Value::Int(answer.revision as i64)),
            Err(ClientError::FailedPrecondition(message)) if message.contains("fence") => {
                op.complete(Outcome::Fail, refusal(REFUSED_BY_FENCE, &message))
            }
            Err(e) if e.is_cas_conflict() => {
                op.complete(Outcome::Fail, refusal(HELD, &e.to_string()))
            }
            Err(e) if e.outcome().is_definite() => {
                op.complete(Outcome::Fail, refusal("refused", &e.to_string()))
            }
            Err(_) => op.info(),
        }
    }

    /// Revokes the lease (and with it the election resource); the lease is dropped either way.
    async fn revoke(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        lease.hold_renewals().await;
        let op = self.recorder.invoke(
            self.id,
            OpKind::Revoke,
            LEASE_KEY,
            Value::Int(lease.id as i64),
        );
        let Some(mut leases) = self.lease_client().await else {
            op.fail();
            return;
        };
        let answer = tokio::time::timeout(
            self.options.client.request_timeout,
            leases.revoke(LeaseRevokeRequest { id: lease.id }),
        )
        .await;
        match answer {
            Ok(Ok(revoked)) => op.ok(Value::Int(revoked.into_inner().revision as i64)),
            Ok(Err(status)) => lease_call_failed(op, &status),
            Err(_) => {
                op.info();
                self.channel = None;
            }
        }
    }
}

/// One watcher: keeps a watch of the election resource open on its node, reopening from
/// the last revision it saw (or with a fresh snapshot after a compaction), and logs every
/// event with the history's clock. The value of an upsert or delete is `[client, lease]`.
async fn watcher(
    node: usize,
    client: Client,
    log: Arc<Mutex<Vec<WatchRecord>>>,
    recorder: Recorder,
    stop: Arc<AtomicBool>,
) {
    let push = |event: &str, revision: u64, version: String, value: Value| {
        log.lock().push(WatchRecord {
            node,
            event: event.into(),
            revision,
            name: ELECTION_KEY.into(),
            version,
            value,
            at_ns: recorder.now_ns(),
        });
    };
    let holder = |resource: &Resource| {
        let client = match workload::decode(resource) {
            Value::List(items) => items.first().cloned().unwrap_or_default(),
            _ => Value::Null,
        };
        Value::List(vec![
            client,
            Value::Int(i64::try_from(resource.lease).unwrap_or(-1)),
        ])
    };
    let mut last_revision = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let start_revision = cairn_client::watch_resume_revision(last_revision);
        let request = WatchListRequest {
            r#type: Some(election_type()),
            tenancy: Some(tenancy()),
            name_prefix: ELECTION_KEY.into(),
            start_revision,
            consistency: Consistency::Eventual as i32,
            selector: String::new(),
        };
        let mut stream = match client.watch_list(request).await {
            Ok(s) => s,
            Err(ClientError::Compacted { .. }) => {
                push("resync", last_revision, String::new(), Value::Null);
                last_revision = 0;
                continue;
            }
            Err(e) => {
                push("error", last_revision, e.to_string(), Value::Null);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        push("open", start_revision, String::new(), Value::Null);
        let mut in_snapshot = start_revision == 0;
        loop {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let item = match tokio::time::timeout(Duration::from_millis(300), stream.next()).await {
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
                            push("upsert", revision, r.version.clone(), holder(&r));
                        }
                        Some(watch_event::Event::Delete(d)) => {
                            let r = d.resource.unwrap_or_default();
                            push("delete", revision, r.version.clone(), holder(&r));
                        }
                        Some(watch_event::Event::EndOfSnapshot(_)) => {
                            push("end_of_snapshot", revision, String::new(), Value::Null);
                            in_snapshot = false;
                        }
                        Some(watch_event::Event::Progress(_)) | None => {}
                    }
                    if !in_snapshot {
                        last_revision = last_revision.max(revision);
                    }
                }
                Err(ClientError::Compacted { .. }) => {
                    push("resync", last_revision, String::new(), Value::Null);
                    last_revision = 0;
                    break;
                }
                Err(e) => {
                    push("error", last_revision, e.to_string(), Value::Null);
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
