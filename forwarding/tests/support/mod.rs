//! The in-process harness: a tiny simulated Raft (one shared log, every
//! appended entry committed at once) and nodes whose [`Handle`] is backed by
//! it. The leader applies its entries at once; every other node applies each
//! entry after a random 0–50 ms delay (in log order), so followers lag as
//! real ones do. Each node serves the real `ForwardingService` over tonic on
//! loopback and has a real [`Forwarder`] and [`LeaderChannel`].
//!
//! Delays come from a seeded RNG: the seed is printed, and `CAIRN_SEED`
//! replays it.
#![allow(dead_code)]

mod recorder;
pub use recorder::Recording;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cairn_forwarding::{
    Executor, Forwarder, ForwarderOptions, ForwardingServer, Handle, LeaderChannel,
    LeaderChannelOptions, LeaderReadIndex, ReadAt,
};
use cairn_fsm::{Applied, Command, FsmError, Limits, Store};
use cairn_proto::error::{ApiError, LeaderHint};
use cairn_proto::v1::*;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

/// Faults a test can inject into one node's handle; each fires once.
#[derive(Default)]
pub struct Faults {
    /// Returned by the next `propose`, before proposing.
    pub apply_error: Option<ApiError>,
    /// The next `propose` proposes (the entry commits and applies) but answers
    /// only after this delay: a lost or late answer.
    pub apply_stall: Option<Duration>,
    /// Returned by the next `confirm_read` (on the leader: also the answer to
    /// a follower's read-index call).
    pub consistency_error: Option<ApiError>,
    /// While set, this node (leading) cannot confirm a read index: no quorum.
    pub no_quorum: bool,
}

struct Entry {
    index: u64,
    command: Command,
    due: Instant,
    reply: Option<oneshot::Sender<Result<Applied, FsmError>>>,
}

struct SimNode {
    peer_address: String,
    entries: mpsc::UnboundedSender<Entry>,
    faults: Faults,
    /// Every call of `propose` on this node, refused or not.
    apply_calls: u64,
    /// Every entry this node proposed.
    proposed: u64,
    /// Every read index this node confirmed as leader (its own strong reads and
    /// followers' read-index calls).
    confirmed: u64,
    /// When set, this node's own (stale) view of the leader, returned by
    /// `leader()` instead of the simulation's truth.
    view: Option<LeaderHint>,
}

struct SimState {
    leader: Option<u64>,
    /// The last index appended; every appended entry counts as committed.
    committed: u64,
    nodes: BTreeMap<u64, SimNode>,
    rng: StdRng,
}

/// The simulated cluster: one log, one leader (or none).
pub struct Sim {
    state: Mutex<SimState>,
}

impl Sim {
    fn hint(s: &SimState) -> LeaderHint {
        match s.leader {
            Some(id) => LeaderHint {
                leader_id: Some(id),
                client_address: Some(format!("client-of-{id}")),
                peer_address: Some(s.nodes[&id].peer_address.clone()),
            },
            None => LeaderHint::default(),
        }
    }

    /// The leader node `id` sees: its frozen view if it has one, else the
    /// truth. A node refusing with NotLeader names this leader.
    fn view_of(s: &SimState, id: u64) -> LeaderHint {
        match &s.nodes[&id].view {
            Some(stale) => stale.clone(),
            None => Sim::hint(s),
        }
    }
}

/// One node's [`Handle`] over the simulation.
pub struct SimHandle {
    sim: Arc<Sim>,
    id: u64,
    store: Store,
    applied: watch::Receiver<u64>,
    /// A follower's read indexes: the real `ReadIndex` call to the leader's
    /// `ForwardingService`, over this node's leader channel.
    read_index: LeaderReadIndex,
}

impl SimHandle {
    async fn wait_applied(&self, index: u64) -> Result<(), ApiError> {
        let mut applied = self.applied.clone();
        applied
            .wait_for(|i| *i >= index)
            .await
            .map_err(|_| ApiError::Inconsistent("the applier stopped".into()))?;
        Ok(())
    }
}

impl Handle for SimHandle {
    async fn propose(&self, command: Command) -> Result<(u64, Applied), ApiError> {
        let (reply, index, stall) = {
            let mut guard = self.sim.state.lock();
            let s = &mut *guard;
            let me = s.nodes.get_mut(&self.id).expect("a node of the sim");
            me.apply_calls += 1;
            if s.leader != Some(self.id) {
                return Err(ApiError::NotLeader {
                    hint: Sim::view_of(s, self.id),
                });
            }
            let me = s.nodes.get_mut(&self.id).expect("a node of the sim");
            if let Some(e) = me.faults.apply_error.take() {
                return Err(e);
            }
            let stall = me.faults.apply_stall.take();
            me.proposed += 1;
            s.committed += 1;
            let index = s.committed;
            let now = Instant::now();
            let (tx, rx) = oneshot::channel();
            let mut tx = Some(tx);
            let leader = s.leader;
            for (id, node) in s.nodes.iter() {
                let delay_ms = if Some(*id) == leader {
                    0
                } else {
                    s.rng.random_range(0..=50u64)
                };
                let entry = Entry {
                    index,
                    command: command.clone(),
                    due: now + Duration::from_millis(delay_ms),
                    reply: if *id == self.id { tx.take() } else { None },
                };
                let _ = node.entries.send(entry);
            }
            (rx, index, stall)
        };
        let result = reply
            .await
            .map_err(|_| ApiError::Inconsistent("the applier stopped".into()))?;
        if let Some(d) = stall {
            tokio::time::sleep(d).await;
        }
        result
            .map(|applied| (index, applied))
            .map_err(ApiError::from)
    }

    async fn confirm_read(&self, at: ReadAt) -> Result<u64, ApiError> {
        let confirmed = {
            let mut s = self.sim.state.lock();
            let leads = s.leader == Some(self.id);
            let committed = s.committed;
            let hint = Sim::view_of(&s, self.id);
            let me = s.nodes.get_mut(&self.id).expect("a node of the sim");
            if let Some(e) = me.faults.consistency_error.take() {
                return Err(e);
            }
            match (leads, at) {
                (true, _) if me.faults.no_quorum => {
                    return Err(ApiError::Inconsistent(
                        "leadership not confirmed by a quorum".into(),
                    ))
                }
                (true, _) => {
                    me.confirmed += 1;
                    Some(committed)
                }
                (false, ReadAt::Leader) => return Err(ApiError::NotLeader { hint }),
                (false, ReadAt::AnyNode) => None,
            }
        };
        // A follower asks the leader over the real ReadIndex call.
        let index = match confirmed {
            Some(index) => index,
            None => self.read_index.ask(deadline()).await?,
        };
        self.wait_applied(index).await?;
        Ok(index)
    }

    fn leader(&self) -> LeaderHint {
        Sim::view_of(&self.sim.state.lock(), self.id)
    }

    fn store(&self) -> &Store {
        &self.store
    }
}

/// One node of the harness.
pub struct Node {
    pub id: u64,
    pub peer_address: String,
    pub handle: Arc<SimHandle>,
    pub forwarder: Arc<Forwarder<SimHandle>>,
    pub channel: Arc<LeaderChannel>,
    stop: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

pub struct Harness {
    pub sim: Arc<Sim>,
    pub nodes: Vec<Node>,
    pub seed: u64,
}

/// How long a test request may take.
pub const DEADLINE: Duration = Duration::from_secs(5);

pub fn deadline() -> Instant {
    Instant::now() + DEADLINE
}

impl Harness {
    /// `count` nodes, node 1 leading; every channel told who leads.
    pub async fn start(count: usize) -> Harness {
        Harness::start_with(count, Limits::default()).await
    }

    pub async fn start_with(count: usize, limits: Limits) -> Harness {
        Harness::start_with_reads(count, limits, ReadAt::Leader).await
    }

    /// As [`Harness::start_with`]; every forwarder confirms strong reads
    /// `strong_reads` (`AnyNode`: a follower asks the leader for a read index).
    pub async fn start_with_reads(count: usize, limits: Limits, strong_reads: ReadAt) -> Harness {
        let seed = std::env::var("CAIRN_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random::<u64>);
        println!("harness seed {seed} (replay with CAIRN_SEED={seed})");
        let sim = Arc::new(Sim {
            state: Mutex::new(SimState {
                leader: None,
                committed: 0,
                nodes: BTreeMap::new(),
                rng: StdRng::seed_from_u64(seed),
            }),
        });
        let mut nodes = Vec::new();
        for id in 1..=count as u64 {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind loopback");
            let peer_address = listener.local_addr().expect("local addr").to_string();
            let store = Store::new(limits.clone());
            let (entries_tx, mut entries_rx) = mpsc::unbounded_channel::<Entry>();
            let (applied_tx, applied_rx) = watch::channel(0u64);
            let applier_store = store.clone();
            tokio::spawn(async move {
                let mut previous_due = Instant::now();
                while let Some(entry) = entries_rx.recv().await {
                    let due = entry.due.max(previous_due);
                    previous_due = due;
                    tokio::time::sleep_until(due).await;
                    let result = applier_store.apply_owned(entry.index, entry.command);
                    applied_tx.send_replace(entry.index);
                    if let Some(reply) = entry.reply {
                        let _ = reply.send(result);
                    }
                }
            });
            sim.state.lock().nodes.insert(
                id,
                SimNode {
                    peer_address: peer_address.clone(),
                    entries: entries_tx,
                    faults: Faults::default(),
                    apply_calls: 0,
                    proposed: 0,
                    confirmed: 0,
                    view: None,
                },
            );
            let channel = Arc::new(LeaderChannel::new(
                id,
                peer_address.clone(),
                LeaderChannelOptions::default(),
            ));
            let handle = Arc::new(SimHandle {
                sim: sim.clone(),
                id,
                store,
                applied: applied_rx,
                read_index: LeaderReadIndex::new(channel.clone(), None),
            });
            let forwarder = Arc::new(Forwarder::new(
                Executor::new(handle.clone(), strong_reads),
                channel.clone(),
                ForwarderOptions::default(),
            ));
            let server = ForwardingServer::new(handle.clone(), DEADLINE);
            let (stop_tx, stop_rx) = oneshot::channel::<()>();
            let task = tokio::spawn(async move {
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                let _ = tonic::transport::Server::builder()
                    .add_service(server.into_service())
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stop_rx.await;
                    })
                    .await;
            });
            nodes.push(Node {
                id,
                peer_address,
                handle,
                forwarder,
                channel,
                stop: Some(stop_tx),
                server: Some(task),
            });
        }
        let harness = Harness { sim, nodes, seed };
        harness.elect(1);
        harness
    }

    pub fn node(&self, id: u64) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    /// Makes `id` the leader (None = no leader) and runs every node's
    /// leader-change hook, as the node's metrics watcher does.
    pub fn elect(&self, id: impl Into<Option<u64>>) {
        self.elect_silently(id);
        for n in &self.nodes {
            n.channel.leader_changed(&n.handle.leader());
        }
    }

    /// Makes `id` the leader without telling any channel (a hook that has
    /// not run yet).
    pub fn elect_silently(&self, id: impl Into<Option<u64>>) {
        self.sim.state.lock().leader = id.into();
    }

    pub fn leader_hint(&self) -> LeaderHint {
        Sim::hint(&self.sim.state.lock())
    }

    /// A hint naming node `id` as the leader, as node `id`'s own answers would.
    pub fn hint_naming(&self, id: u64) -> LeaderHint {
        LeaderHint {
            leader_id: Some(id),
            client_address: Some(format!("client-of-{id}")),
            peer_address: Some(self.node(id).peer_address.clone()),
        }
    }

    pub fn faults<T>(&self, id: u64, f: impl FnOnce(&mut Faults) -> T) -> T {
        let mut s = self.sim.state.lock();
        f(&mut s.nodes.get_mut(&id).expect("a node of the sim").faults)
    }

    /// Freezes `id`'s view of the leader at `view` (None = follow the truth).
    pub fn set_view(&self, id: u64, view: Option<LeaderHint>) {
        self.sim
            .state
            .lock()
            .nodes
            .get_mut(&id)
            .expect("a node of the sim")
            .view = view;
    }

    /// The read indexes node `id` confirmed as leader.
    pub fn confirmed_by(&self, id: u64) -> u64 {
        self.sim.state.lock().nodes[&id].confirmed
    }

    pub fn apply_calls(&self, id: u64) -> u64 {
        self.sim.state.lock().nodes[&id].apply_calls
    }

    /// Entries proposed by node `id`.
    pub fn proposed_by(&self, id: u64) -> u64 {
        self.sim.state.lock().nodes[&id].proposed
    }

    /// Entries proposed by every node together.
    pub fn proposed(&self) -> u64 {
        self.sim
            .state
            .lock()
            .nodes
            .values()
            .map(|n| n.proposed)
            .sum()
    }

    pub fn committed(&self) -> u64 {
        self.sim.state.lock().committed
    }

    /// Stops `id`'s forwarding server (its port then refuses connections).
    pub async fn stop_server(&mut self, id: u64) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"));
        if let Some(stop) = node.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = node.server.take() {
            let _ = task.await;
        }
    }
}

// ---- resources

/// The public message a client decodes from a node's answer: the shared
/// answers are wire-identical to the public ones, so the bytes of one decode
/// as the other.
pub trait Public {
    type Message: prost::Message + Default;

    fn public(&self) -> Self::Message
    where
        Self: prost::Message + Sized,
    {
        <Self::Message as prost::Message>::decode(prost::Message::encode_to_vec(self).as_slice())
            .expect("a shared answer decodes as its public twin")
    }
}

impl Public for shared::ReadResponse {
    type Message = ReadResponse;
}

impl Public for shared::WriteResponse {
    type Message = WriteResponse;
}

impl Public for shared::ListResponse {
    type Message = ListResponse;
}

impl Public for shared::ListByOwnerResponse {
    type Message = ListByOwnerResponse;
}

impl Public for shared::WatchEvent {
    type Message = WatchEvent;
}

pub fn thing_type() -> Type {
    Type {
        group: "demo".into(),
        group_version: "v1".into(),
        kind: "Thing".into(),
    }
}

pub fn tenancy() -> Tenancy {
    Tenancy {
        partition: "default".into(),
        namespace: "default".into(),
    }
}

pub fn id(name: &str, uid: &str) -> Id {
    Id {
        uid: uid.into(),
        name: name.into(),
        r#type: Some(thing_type()),
        tenancy: Some(tenancy()),
    }
}

pub fn thing(name: &str, uid: &str, version: &str, payload: &[u8]) -> Resource {
    Resource {
        id: Some(id(name, uid)),
        version: version.into(),
        data: Some(cairn_proto::google::protobuf::Any {
            type_url: "demo/bytes".into(),
            value: bytes::Bytes::copy_from_slice(payload),
        }),
        ..Default::default()
    }
}

pub fn write_request(resource: Resource) -> WriteRequest {
    WriteRequest {
        fence: None,
        resource: Some(resource),
    }
}

pub fn read_request(id: Id, consistency: Consistency) -> ReadRequest {
    ReadRequest {
        id: Some(id),
        consistency: consistency as i32,
        revision: 0,
    }
}

pub fn list_request(consistency: Consistency) -> ListRequest {
    ListRequest {
        r#type: Some(thing_type()),
        tenancy: Some(tenancy()),
        name_prefix: String::new(),
        consistency: consistency as i32,
        ..ListRequest::default()
    }
}
