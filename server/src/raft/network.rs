//! Raft transport over tonic: the client side ([`Network`], one cached channel
//! per peer with HTTP/2 keepalive) and the server side ([`RaftRpcService`]).
//! Payloads are openraft's request/response types encoded with bincode 2
//! (with a byte limit, so a length prefix can never ask for more memory than
//! the message holds). Every message carries the sender's cluster id and node
//! id, and is checked by the [`PeerGate`] before openraft sees it: an empty or
//! other cluster's id, a sender outside the membership, or a term, index or
//! size out of bounds is refused. Replies are bounded the same way.
//!
//! **One stream per follower.** AppendEntries go over one long-lived bidirectional stream to
//! each peer (`AppendEntriesStream`, a [`Lane`]): no HTTP/2 stream to open, no headers to
//! encode and decode, no task to spawn on the peer per message. Messages go out in order
//! and the peer answers each in turn, exactly as a unary AppendEntries; a refusal ends the
//! stream with its status, and a stream that ends or fails answers every message still
//! waiting with UNAVAILABLE (openraft backs off and asks again on a new stream). A peer
//! whose build has no stream (an earlier release: UNIMPLEMENTED) is sent unary
//! AppendEntries for [`UNARY_FALLBACK`], then asked again. Votes and snapshot chunks stay
//! unary calls.
//!
//! **Replication that makes progress, in bounded memory.** openraft 0.9 gives every
//! AppendEntries one heartbeat interval, whatever it carries; a batch of large entries
//! would time out and be sent again for ever. So an AppendEntries that carries entries is
//! sent by a task of its own ([`InFlight`]) with a deadline that grows with its size
//! ([`transfer_timeout`]: the heartbeat interval plus the bytes at
//! [`TRANSFER_BYTES_PER_SECOND_MIN`]); openraft's call waits for it for most of a heartbeat
//! interval and, if it is still going, answers `Unreachable` (so openraft backs off, then
//! asks again). The same request asked again joins the send in flight or takes its answer;
//! one that carries the same entries and more is answered `PayloadTooLarge` with the count
//! in flight, so openraft asks at once for exactly those (a follower whose disk is slow
//! still gets its batch while the leader appends more); any other replaces it (the old
//! send is aborted). Invariants: at most one
//! AppendEntries with entries is in flight to a peer, and its answer is only ever given to
//! a call for exactly the same request (same vote, same previous log id, same entries).
//! The entries of one AppendEntries are bounded by bytes when they are read from the log
//! (`replication_batch_bytes_max`, the log's `read_bytes_max`).
//!
//! On the receiving side each sender has a byte budget ([`SenderBudgets`]): the
//! AppendEntries and snapshot chunks of one sender being processed at once hold at most
//! `peer_message_bytes_max` plus [`SMALL_MESSAGE_ROOM_BYTES`]; over it a message is refused
//! with UNAVAILABLE at once (the sender backs off), so a follower whose core is stuck does
//! not pile up retries in memory.
//!
//! **Series** (when metrics are recorded, `series::PeerSeries`): the bytes of every Raft
//! message sent to and received from each peer, requests and replies alike (the encoded
//! `RaftMessage`, without gRPC, HTTP/2 or TLS framing), and the round-trip time of
//! heartbeats, AppendEntries without entries, which a follower answers without touching its
//! disk (as etcd's prober measures the network alone). A message received is counted once the
//! peer gate admitted its sender as a member (not a stranger), so only members ever become
//! labels. A message sent is
//! counted unless it could not be delivered (UNAVAILABLE: no connection, or the peer was
//! busy).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Semaphore};

use bytes::Bytes;
use cairn_fsm::ClusterVersion;
use cairn_proto::v1::raft_service_client::RaftServiceClient;
use cairn_proto::v1::raft_service_server::{RaftService, RaftServiceServer};
use cairn_proto::v1::RaftMessage;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use prost::Message as _;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::Mutex;
use tonic::transport::{Channel, Endpoint};

use super::peer_gate::{self, Claim, PeerGate, Refusal, Standing};
use super::series::{PeerSeries, PeerSeriesMap};
use super::stages::{IndexStage, WriteStages};
use super::state_machine::ClusterIdentity;
use super::types::{NodeId, NodeInfo, Raft, TypeConfig};
use crate::rate_limit::RateLimit;

pub use crate::bounds::DECODE_BYTES_MAX;

/// Encodes a Raft message or reply (the payload of a `RaftMessage`).
pub fn encode<T: Serialize>(value: &T) -> Result<Bytes, bincode::error::EncodeError> {
    bincode::serde::encode_to_vec(value, bincode::config::standard()).map(Bytes::from)
}

/// Decodes a Raft message or reply; never panics, whatever the bytes.
/// The highest cluster version the sender of `message` supports: what it says, or
/// [`ClusterVersion::BASELINE`] when it says nothing (a build of release 0.1.0).
pub fn supported_by(message: &RaftMessage) -> ClusterVersion {
    match (
        message.cluster_version_supported_major,
        message.cluster_version_supported_minor,
    ) {
        (0, 0) => ClusterVersion::BASELINE,
        (major, minor) => ClusterVersion::new(major, minor),
    }
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::error::DecodeError> {
    let config = bincode::config::standard().with_limit::<DECODE_BYTES_MAX>();
    let (value, _) = bincode::serde::decode_from_slice(bytes, config)?;
    Ok(value)
}

/// The slowest transfer a peer connection is assumed to sustain: an AppendEntries of `n`
/// bytes is given `n / TRANSFER_BYTES_PER_SECOND_MIN` seconds beyond its base timeout.
pub const TRANSFER_BYTES_PER_SECOND_MIN: u64 = 4 * 1024 * 1024;

/// The base of an entries-carrying AppendEntries' deadline: the follower writes and syncs
/// the entries before it answers, and a loaded disk takes longer than a heartbeat interval.
const TRANSFER_BASE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long one dial of a peer's peer port (TCP and TLS handshake) may take.
const PEER_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// How long a send of `bytes` may take: a base of at least [`TRANSFER_BASE_TIMEOUT`]
/// (or `base`, if longer) plus the bytes at [`TRANSFER_BYTES_PER_SECOND_MIN`].
pub fn transfer_timeout(base: Duration, bytes: usize) -> Duration {
    let transfer_ms = (bytes as u64).saturating_mul(1000) / TRANSFER_BYTES_PER_SECOND_MIN;
    base.max(TRANSFER_BASE_TIMEOUT) + Duration::from_millis(transfer_ms)
}

/// What identifies one AppendEntries for joining a send in flight: the leader's vote, the
/// previous log id and the first and last entries' log ids (log ids identify entries).
#[derive(Clone, PartialEq, Eq, Debug)]
struct SendKey {
    vote: openraft::Vote<NodeId>,
    prev_log_id: Option<openraft::LogId<NodeId>>,
    first: openraft::LogId<NodeId>,
    last: openraft::LogId<NodeId>,
    entries: usize,
}

impl SendKey {
    /// Whether `rpc` carries this send's entries and more after them, with the same vote
    /// and previous log id (the leader appended entries since this send began).
    fn is_prefix_of(&self, rpc: &AppendEntriesRequest<TypeConfig>) -> bool {
        self.vote == rpc.vote
            && self.prev_log_id == rpc.prev_log_id
            && rpc.entries.len() > self.entries
            && rpc.entries.first().map(|e| &e.log_id) == Some(&self.first)
            && rpc.entries.get(self.entries - 1).map(|e| &e.log_id) == Some(&self.last)
    }

    fn of(rpc: &AppendEntriesRequest<TypeConfig>) -> Option<SendKey> {
        let (first, last) = rpc.entries.first().zip(rpc.entries.last())?;
        Some(SendKey {
            vote: rpc.vote,
            prev_log_id: rpc.prev_log_id,
            first: first.log_id,
            last: last.log_id,
            entries: rpc.entries.len(),
        })
    }
}

/// The answer of a send: the reply's payload, or the gRPC status it failed with.
type SendResult = Result<Bytes, tonic::Status>;

/// The one AppendEntries with entries in flight to a peer (see the module docs).
struct InFlight {
    key: SendKey,
    bytes: usize,
    started: tokio::time::Instant,
    deadline: Duration,
    answer: watch::Receiver<Option<SendResult>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Replaced or answered: a send still going is no longer wanted.
        self.task.abort();
    }
}

/// How many AppendEntries may wait for their answers on one [`Lane`]; a send beyond is
/// refused UNAVAILABLE at once (openraft backs off). openraft 0.9 sends one at a time to
/// each follower, so a lane rarely holds more than one or two.
const LANE_DEPTH: usize = 64;

/// How long a peer that does not implement `AppendEntriesStream` (a build of an earlier
/// release) is sent unary AppendEntries before the stream is tried again.
const UNARY_FALLBACK: Duration = Duration::from_secs(60);

/// One long-lived `AppendEntriesStream` to a peer: messages go out in order, and each reply
/// answers the oldest message still waiting (the peer answers in order). A task reads the
/// replies; when the stream ends or fails, every message still waiting is answered with
/// the failure and the lane is closed (the next send opens another).
struct Lane {
    requests: tokio::sync::mpsc::Sender<RaftMessage>,
    waiting: Arc<Mutex<Waiting>>,
    reader: tokio::task::JoinHandle<()>,
}

/// The answers a lane owes, oldest first, and whether it is closed.
#[derive(Default)]
struct Waiting {
    replies: std::collections::VecDeque<
        tokio::sync::oneshot::Sender<Result<RaftMessage, tonic::Status>>,
    >,
    closed: bool,
}

/// A peer's lane, or that it answers only unary AppendEntries until then.
enum LaneSlot {
    Open(Arc<Lane>),
    Unary { until: tokio::time::Instant },
}

impl Lane {
    /// Opens a stream on `channel` (its reader task sends it).
    fn open(channel: Channel, message_bytes_max: usize) -> Lane {
        let (requests, outgoing) = tokio::sync::mpsc::channel(LANE_DEPTH);
        let waiting = Arc::new(Mutex::new(Waiting::default()));
        let reader = tokio::spawn(Lane::read(
            raft_client(channel, message_bytes_max),
            outgoing,
            waiting.clone(),
        ));
        Lane {
            requests,
            waiting,
            reader,
        }
    }

    fn is_closed(&self) -> bool {
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .closed
    }

    /// Sends `message` and waits for its answer for at most `timeout`. A message whose
    /// caller stopped waiting is still answered by the peer, and its answer dropped.
    async fn call(
        &self,
        message: RaftMessage,
        timeout: Duration,
    ) -> Result<RaftMessage, tonic::Status> {
        let (tell, answer) = tokio::sync::oneshot::channel();
        {
            // The message and its place among the waiting are taken together: replies come
            // in the order messages went out.
            let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            if waiting.closed {
                return Err(lane_closed());
            }
            if waiting.replies.len() >= LANE_DEPTH {
                return Err(tonic::Status::unavailable(format!(
                    "{LANE_DEPTH} AppendEntries already wait for this peer's answers"
                )));
            }
            self.requests.try_send(message).map_err(|_| lane_closed())?;
            waiting.replies.push_back(tell);
        }
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(lane_closed()),
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "no answer within {} ms",
                timeout.as_millis()
            ))),
        }
    }

    /// The reader task: opens the stream, hands each reply to the oldest waiting message,
    /// and closes the lane when the stream ends. The first message waiting then is the one
    /// the end answers (a refusal ends the stream after the message refused); the others
    /// are told the stream closed, or that the peer has no stream at all.
    async fn read(
        mut client: RaftServiceClient<Channel>,
        outgoing: tokio::sync::mpsc::Receiver<RaftMessage>,
        waiting: Arc<Mutex<Waiting>>,
    ) {
        let outgoing = tokio_stream::wrappers::ReceiverStream::new(outgoing);
        let end = match client.append_entries_stream(outgoing).await {
            Err(status) => status,
            Ok(response) => {
                let mut replies = response.into_inner();
                loop {
                    match replies.message().await {
                        Ok(Some(reply)) => {
                            let oldest = waiting
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .replies
                                .pop_front();
                            match oldest {
                                Some(tell) => {
                                    let _ = tell.send(Ok(reply));
                                }
                                None => {
                                    break tonic::Status::internal(
                                        "the peer answered a message it was not sent",
                                    )
                                }
                            }
                        }
                        Ok(None) => break lane_closed(),
                        Err(status) => break status,
                    }
                }
            }
        };
        let mut waiting = waiting.lock().unwrap_or_else(|e| e.into_inner());
        waiting.closed = true;
        let rest = if end.code() == tonic::Code::Unimplemented {
            end.clone()
        } else {
            lane_closed()
        };
        if let Some(first) = waiting.replies.pop_front() {
            let _ = first.send(Err(end));
        }
        for tell in waiting.replies.drain(..) {
            let _ = tell.send(Err(rest.clone()));
        }
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        // Replaced or the network dropped: the stream goes with it.
        self.reader.abort();
    }
}

fn lane_closed() -> tonic::Status {
    tonic::Status::unavailable("the AppendEntries stream to this peer closed")
}

/// Dials peers; one cached channel per peer address, shared by every
/// replication stream to it.
#[derive(Clone)]
pub struct Network {
    identity: Arc<ClusterIdentity>,
    node_id: NodeId,
    message_bytes_max: usize,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// Per peer address, its AppendEntries stream (see [`Lane`]).
    lanes: Arc<Mutex<HashMap<String, LaneSlot>>>,
    /// Per peer, the AppendEntries with entries in flight.
    in_flight: Arc<Mutex<HashMap<NodeId, InFlight>>>,
    /// The write-stage clock: a follower's acknowledgement of entries is
    /// their `replicated` time.
    stages: Arc<WriteStages>,
    /// Dial peers over mutual TLS with this (`None`: plaintext).
    tls: Option<cairn_tls::ClientTls>,
    /// Per peer, its network series (`None`: metrics are not recorded).
    series: Option<Arc<PeerSeriesMap>>,
    /// When each peer last answered (for `cairn status` and the membership checks).
    contacts: Arc<super::contacts::Contacts>,
}

impl Network {
    pub fn new(
        identity: Arc<ClusterIdentity>,
        node_id: NodeId,
        message_bytes_max: usize,
        tls: Option<cairn_tls::ClientTls>,
    ) -> Network {
        Network {
            identity,
            node_id,
            message_bytes_max,
            channels: Arc::new(Mutex::new(HashMap::new())),
            lanes: Arc::new(Mutex::new(HashMap::new())),
            in_flight: Arc::new(Mutex::new(HashMap::new())),
            stages: Arc::new(WriteStages::new(false)),
            tls,
            series: PeerSeriesMap::when_recording(),
            contacts: Default::default(),
        }
    }

    /// Records when each peer answers into `contacts`.
    pub fn set_contacts(&mut self, contacts: Arc<super::contacts::Contacts>) {
        self.contacts = contacts;
    }

    /// Records replication times into `stages`.
    pub fn set_write_stages(&mut self, stages: Arc<WriteStages>) {
        self.stages = stages;
    }

    fn channel(&self, peer_address: &str) -> Result<Channel, String> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(channel) = channels.get(peer_address) {
            return Ok(channel.clone());
        }
        let endpoint = Endpoint::from_shared(format!("http://{peer_address}"))
            .map_err(|e| format!("bad peer address {peer_address:?}: {e}"))?
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        // Each (re)connection dials (TCP without Nagle, then TLS) with the configuration
        // current then, so a reloaded certificate is used from the next connection on.
        let channel = cairn_tls::lazy_channel(endpoint, self.tls.as_ref(), PEER_CONNECT_TIMEOUT);
        channels.insert(peer_address.to_string(), channel.clone());
        Ok(channel)
    }

    /// The AppendEntries stream to `peer_address`: the open one, or a new one when it
    /// closed; `None` while the peer is sent unary AppendEntries ([`Self::unary_only`]).
    fn lane(&self, peer_address: &str) -> Option<Arc<Lane>> {
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        match lanes.get(peer_address) {
            Some(LaneSlot::Open(lane)) if !lane.is_closed() => return Some(lane.clone()),
            Some(LaneSlot::Unary { until }) if tokio::time::Instant::now() < *until => return None,
            _ => {}
        }
        let lane = Arc::new(Lane::open(
            self.channel(peer_address).ok()?,
            self.message_bytes_max,
        ));
        lanes.insert(peer_address.to_owned(), LaneSlot::Open(lane.clone()));
        Some(lane)
    }

    /// The peer at `peer_address` has no AppendEntries stream (a build of an earlier
    /// release): it is sent unary AppendEntries for [`UNARY_FALLBACK`].
    fn unary_only(&self, peer_address: &str) {
        let until = tokio::time::Instant::now() + UNARY_FALLBACK;
        self.lanes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(peer_address.to_owned(), LaneSlot::Unary { until });
    }

    /// A message from this node: its cluster id and node id around `payload`.
    fn envelope(&self, payload: Bytes) -> RaftMessage {
        RaftMessage {
            cluster_id: self.identity.cluster_id(),
            payload,
            sender_node_id: self.node_id,
            cluster_version_supported_major: ClusterVersion::SUPPORTED_MAX.major,
            cluster_version_supported_minor: ClusterVersion::SUPPORTED_MAX.minor,
            data_bytes_max: self.contacts.own_data_bytes_max(),
        }
    }

    /// Asks the node at `peer_address` for the node ids of its current membership
    /// (`RaftService.Members`), for at most `timeout`.
    pub(super) async fn members_of(
        &self,
        peer_address: &str,
        timeout: Duration,
    ) -> Result<Vec<NodeId>, String> {
        let channel = self.channel(peer_address)?;
        let payload = encode(&()).map_err(|e| e.to_string())?;
        let mut request = tonic::Request::new(self.envelope(payload));
        request.set_timeout(timeout);
        let reply = raft_client(channel, self.message_bytes_max)
            .members(request)
            .await
            .map_err(|status| status.message().to_string())?;
        let members: Vec<NodeId> = decode(&reply.into_inner().payload)
            .map_err(|e| format!("undecodable members reply: {e}"))?;
        peer_gate::check_members_reply(&members).map_err(|refusal| refusal.to_string())?;
        Ok(members)
    }

    /// Asks the node at `peer_address` for its table digest (`RaftService.StateDigest`), for
    /// at most `timeout`.
    pub(super) async fn digest_of(
        &self,
        peer_address: &str,
        question: &super::integrity::DigestQuestion,
        timeout: Duration,
    ) -> Result<super::integrity::DigestReply, String> {
        let channel = self.channel(peer_address)?;
        let payload = encode(question).map_err(|e| e.to_string())?;
        let mut request = tonic::Request::new(self.envelope(payload));
        request.set_timeout(timeout);
        let reply = raft_client(channel, self.message_bytes_max)
            .state_digest(request)
            .await
            .map_err(|status| match status.code() {
                tonic::Code::Unimplemented => {
                    "it does not answer digests (a build of an earlier release)".to_string()
                }
                _ => status.message().to_string(),
            })?;
        decode(&reply.into_inner().payload).map_err(|e| format!("undecodable digest reply: {e}"))
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &NodeInfo) -> PeerClient {
        PeerClient {
            target,
            series: self.series.as_ref().map(|peers| peers.of(target)),
            network: self.clone(),
            peer_address: node.peer_address.clone(),
        }
    }
}

/// The connection to one peer, as openraft's replication sees it.
pub struct PeerClient {
    target: NodeId,
    network: Network,
    peer_address: String,
    /// This peer's series, when metrics are recorded.
    series: Option<Arc<PeerSeries>>,
}

impl PeerClient {
    /// Sends one encoded message and waits for its reply's payload, for at most `timeout`.
    /// `heartbeat`: the message is an AppendEntries without entries, whose round trip is
    /// recorded.
    fn send(
        &self,
        method: Method,
        payload: Bytes,
        timeout: Duration,
        heartbeat: bool,
    ) -> impl std::future::Future<Output = SendResult> + Send + 'static {
        let channel = self.network.channel(&self.peer_address);
        let lane = match method {
            Method::AppendEntries => self.network.lane(&self.peer_address),
            Method::Vote | Method::InstallSnapshot => None,
        };
        let network = self.network.clone();
        let peer_address = self.peer_address.clone();
        let message_bytes_max = self.network.message_bytes_max;
        let envelope = self.network.envelope(payload.clone());
        let series = self.series.clone();
        let contacts = self.network.contacts.clone();
        let target = self.target;
        async move {
            let sent_bytes = series.as_ref().map_or(0, |_| envelope.encoded_len());
            let started = (heartbeat && series.is_some()).then(tokio::time::Instant::now);
            let response = match lane {
                Some(lane) => match lane.call(envelope, timeout).await {
                    // The peer has no stream (an earlier release): it gets this message, and
                    // the next ones for a while, as unary calls (the envelope made again
                    // around the same payload bytes).
                    Err(status) if status.code() == tonic::Code::Unimplemented => {
                        network.unary_only(&peer_address);
                        let envelope = network.envelope(payload);
                        unary(channel, message_bytes_max, method, envelope, timeout).await
                    }
                    answered => answered,
                },
                None => unary(channel, message_bytes_max, method, envelope, timeout).await,
            };
            if let Some(series) = &series {
                match &response {
                    Ok(reply) => {
                        series.sent(sent_bytes);
                        series.received(reply.encoded_len());
                        if let Some(started) = started {
                            series.round_trip(started.elapsed());
                        }
                    }
                    Err(status) if status.code() != tonic::Code::Unavailable => {
                        series.sent(sent_bytes)
                    }
                    Err(_) => {}
                }
            }
            let reply = response?;
            contacts.reported_support(target, supported_by(&reply), reply.data_bytes_max);
            Ok(reply.payload)
        }
    }

    /// Decodes and checks a reply, mapping failures to openraft's errors (openraft's own,
    /// large, error type: what the `RaftNetwork` methods return).
    #[allow(clippy::result_large_err)]
    fn finish<Resp, E>(
        &self,
        result: SendResult,
        check_reply: fn(&Resp) -> Result<(), Refusal>,
    ) -> Result<Resp, RPCError<NodeId, NodeInfo, RaftError<NodeId, E>>>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let payload = result.map_err(|status| {
            self.report(self.network.contacts.failed(self.target), Some(&status));
            match status.code() {
                tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Cancelled => RPCError::Unreachable(Unreachable::new(&status)),
                _ => RPCError::Network(NetworkError::new(&status)),
            }
        })?;
        // The peer's Raft server answered: it is reachable, whatever it answered.
        self.report(self.network.contacts.replied(self.target), None);
        let reply: Result<Resp, RaftError<NodeId, E>> = decode(&payload).map_err(|e| {
            tracing::warn!(peer = self.target, error = %e, "undecodable reply from a peer");
            RPCError::Network(NetworkError::new(&e))
        })?;
        let reply = reply.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))?;
        // A reply's term is adopted by openraft: bounded like a request's.
        check_reply(&reply).map_err(|refusal| {
            tracing::warn!(peer = self.target, %refusal, "refused a peer's reply");
            RPCError::Network(NetworkError::new(&std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("reply from node {}: {refusal}", self.target),
            )))
        })?;
        Ok(reply)
    }

    /// Logs what a call's outcome is news of ([`super::contacts::PeerNews`]): a peer failing
    /// for a while, or answering again after that.
    fn report(&self, news: super::contacts::PeerNews, status: Option<&tonic::Status>) {
        use super::contacts::PeerNews;
        match news {
            PeerNews::Nothing => {}
            PeerNews::Lost { failing } => tracing::warn!(
                peer = self.target,
                address = %self.peer_address,
                failing_ms = failing.as_millis() as u64,
                error = status.map(|s| s.message()).unwrap_or_default(),
                code = ?status.map(|s| s.code()),
                "a peer has not answered this node's Raft calls for a while; retrying"
            ),
            PeerNews::Back { failing } => tracing::info!(
                peer = self.target,
                address = %self.peer_address,
                failing_ms = failing.as_millis() as u64,
                "a peer answers this node's Raft calls again"
            ),
        }
    }

    async fn call<Req, Resp, E>(
        &self,
        request: &Req,
        option: &RPCOption,
        method: Method,
        check_reply: fn(&Resp) -> Result<(), Refusal>,
    ) -> Result<Resp, RPCError<NodeId, NodeInfo, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let payload = encode(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        // AppendEntries come here only without entries (see `append_entries`): heartbeats.
        let heartbeat = matches!(method, Method::AppendEntries);
        let result = self
            .send(method, payload, option.hard_ttl(), heartbeat)
            .await;
        self.finish(result, check_reply)
    }

    /// An AppendEntries that carries entries: joins the send of the same request in flight
    /// to this peer, or replaces what is in flight with a send of its own; waits for the
    /// answer for most of openraft's time (its soft TTL) and answers `Unreachable` if the
    /// send is still going, so openraft backs off and asks again.
    async fn append_entries_in_flight(
        &self,
        key: SendKey,
        rpc: &AppendEntriesRequest<TypeConfig>,
        option: &RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, NodeInfo, RaftError<NodeId>>> {
        let mut answer = {
            let mut in_flight = self
                .network
                .in_flight
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match in_flight.get(&self.target) {
                Some(sending) if sending.key == key => sending.answer.clone(),
                Some(sending) if sending.key.is_prefix_of(rpc) => {
                    // The same entries and more: openraft asks again at once for exactly
                    // the ones in flight (and keeps to that count for a few requests), so
                    // the send goes on instead of starting over with a longer one.
                    return Err(RPCError::PayloadTooLarge(
                        PayloadTooLarge::new_entries_hint(sending.key.entries as u64),
                    ));
                }
                _ => {
                    let payload =
                        encode(rpc).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
                    let bytes = payload.len();
                    let deadline = transfer_timeout(option.hard_ttl(), bytes);
                    let (tell, answer) = watch::channel(None);
                    let send = self.send(Method::AppendEntries, payload, deadline, false);
                    let task = tokio::spawn(async move {
                        let result = send.await;
                        let _ = tell.send(Some(result));
                    });
                    let sending = InFlight {
                        key: key.clone(),
                        bytes,
                        started: tokio::time::Instant::now(),
                        deadline,
                        answer: answer.clone(),
                        task,
                    };
                    // Replaces (and so aborts) any other send to this peer.
                    in_flight.insert(self.target, sending);
                    answer
                }
            }
        };
        let waited =
            tokio::time::timeout(option.soft_ttl(), answer.wait_for(Option::is_some)).await;
        let result = match waited {
            Ok(Ok(result)) => result.clone().expect("waited for an answer"),
            Ok(Err(_)) => Err(tonic::Status::cancelled("the send was replaced")),
            Err(_) => {
                let in_flight = self
                    .network
                    .in_flight
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                let still = in_flight
                    .get(&self.target)
                    .filter(|s| s.key == key)
                    .map(|s| {
                        format!(
                            "still sending {} bytes ({} entries) to node {}: {} ms of up to {} ms",
                            s.bytes,
                            s.key.entries,
                            self.target,
                            s.started.elapsed().as_millis(),
                            s.deadline.as_millis()
                        )
                    })
                    .unwrap_or_else(|| format!("the send to node {} was replaced", self.target));
                return Err(RPCError::Unreachable(Unreachable::new(
                    &std::io::Error::new(std::io::ErrorKind::WouldBlock, still),
                )));
            }
        };
        {
            // Answered: the send is done with (its answer was given to this call).
            let mut in_flight = self
                .network
                .in_flight
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if in_flight.get(&self.target).is_some_and(|s| s.key == key) {
                in_flight.remove(&self.target);
            }
        }
        self.finish(result, peer_gate::check_append_entries_reply)
    }
}

/// The Raft service of a peer on `channel`, with messages of at most `message_bytes_max`
/// (`peer_message_bytes_max`) each way.
fn raft_client(channel: Channel, message_bytes_max: usize) -> RaftServiceClient<Channel> {
    RaftServiceClient::new(channel)
        .max_decoding_message_size(message_bytes_max)
        .max_encoding_message_size(message_bytes_max)
}

/// Sends `envelope` as one unary call of `method` on `channel`, for at most `timeout`.
async fn unary(
    channel: Result<Channel, String>,
    message_bytes_max: usize,
    method: Method,
    envelope: RaftMessage,
    timeout: Duration,
) -> Result<RaftMessage, tonic::Status> {
    // A peer that cannot be dialled is unreachable: openraft backs off (`finish`).
    let channel = channel.map_err(tonic::Status::unavailable)?;
    let mut client = raft_client(channel, message_bytes_max);
    let mut request = tonic::Request::new(envelope);
    request.set_timeout(timeout);
    let response = match method {
        Method::AppendEntries => client.append_entries(request).await,
        Method::Vote => client.vote(request).await,
        Method::InstallSnapshot => client.install_snapshot(request).await,
    };
    response.map(tonic::Response::into_inner)
}

#[derive(Clone, Copy)]
enum Method {
    AppendEntries,
    Vote,
    InstallSnapshot,
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, NodeInfo, RaftError<NodeId>>> {
        let sent = rpc.entries.first().zip(rpc.entries.last());
        let sent = sent.map(|(first, last)| (first.log_id.index, last.log_id.index));
        let response: AppendEntriesResponse<NodeId> = match SendKey::of(&rpc) {
            Some(key) => self.append_entries_in_flight(key, &rpc, &option).await?,
            None => {
                self.call(
                    &rpc,
                    &option,
                    Method::AppendEntries,
                    peer_gate::check_append_entries_reply,
                )
                .await?
            }
        };
        if let (Some((first, last)), AppendEntriesResponse::Success) = (sent, &response) {
            self.network
                .stages
                .record_indexes(IndexStage::Replicated, first, last);
        }
        Ok(response)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, NodeInfo, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(
            &rpc,
            &option,
            Method::InstallSnapshot,
            peer_gate::check_install_snapshot_reply,
        )
        .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, NodeInfo, RaftError<NodeId>>> {
        self.call(&rpc, &option, Method::Vote, peer_gate::check_vote_reply)
            .await
    }

    fn backoff(&self) -> openraft::network::Backoff {
        // A dead peer is retried every 200 ms: quick to notice a restart, cheap while it is down.
        openraft::network::Backoff::new(std::iter::repeat(Duration::from_millis(200)))
    }
}

/// What the Raft server bounds beyond the gate's fixed limits.
#[derive(Debug, Clone, Copy)]
pub struct RaftServerLimits {
    /// Largest message received or sent (`peer_message_bytes_max`).
    pub message_bytes_max: usize,
    /// Most entries accepted in one AppendEntries: the gate's fixed
    /// [`peer_gate::ENTRIES_MAX`], above any leader's [`super::REPLICATION_BATCH_ENTRIES_MAX`].
    pub entries_max: usize,
    /// Largest snapshot chunk accepted: the gate's fixed
    /// [`peer_gate::SNAPSHOT_CHUNK_BYTES_MAX`], the upper bound of
    /// `snapshot_chunk_bytes` on every node.
    pub snapshot_chunk_bytes_max: u64,
}

/// Room beside one largest message in a sender's budget, so that its heartbeats and votes
/// still pass while a large message is processed.
pub const SMALL_MESSAGE_ROOM_BYTES: usize = 1024 * 1024;

/// Per sender, a budget of the bytes of its AppendEntries and snapshot chunks being
/// processed at once: `peer_message_bytes_max` plus [`SMALL_MESSAGE_ROOM_BYTES`].
/// Senders outside this node's membership (strangers, see `peer_gate::Standing`) share
/// one budget, so made-up node ids cannot grow the map.
pub struct SenderBudgets {
    bytes_max: usize,
    budgets: Mutex<HashMap<BudgetKey, Arc<Semaphore>>>,
}

/// Whose budget a message takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum BudgetKey {
    Member(NodeId),
    Strangers,
}

impl SenderBudgets {
    pub fn new(message_bytes_max: usize) -> SenderBudgets {
        SenderBudgets {
            bytes_max: message_bytes_max + SMALL_MESSAGE_ROOM_BYTES,
            budgets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes `bytes` of `sender`'s budget until the permit is dropped, or refuses at once.
    pub fn take(
        &self,
        sender: NodeId,
        standing: Standing,
        bytes: usize,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, Refusal> {
        let key = match standing {
            Standing::Member => BudgetKey::Member(sender),
            Standing::Stranger | Standing::Unvouched => BudgetKey::Strangers,
        };
        // A message over the budget was already refused by gRPC's size limit.
        assert!(
            bytes <= self.bytes_max,
            "a message is never larger than peer_message_bytes_max"
        );
        let budget = {
            let mut budgets = self.budgets.lock().unwrap_or_else(|e| e.into_inner());
            // Members (the gate admitted them) and one entry for strangers: a handful.
            budgets
                .entry(key)
                .or_insert_with(|| Arc::new(Semaphore::new(self.bytes_max)))
                .clone()
        };
        let permits = u32::try_from(bytes).expect("a message is under 1 GiB");
        budget
            .clone()
            .try_acquire_many_owned(permits.max(1))
            .map_err(|_| Refusal::Busy {
                sender,
                bytes_in_process: self.bytes_max - budget.available_permits(),
            })
    }
}

/// Serves Raft RPCs from peers.
#[derive(Clone)]
pub struct RaftRpcService {
    raft: Raft,
    node_id: NodeId,
    gate: Arc<PeerGate>,
    limits: RaftServerLimits,
    budgets: Arc<SenderBudgets>,
    /// Per sender, its network series (`None`: metrics are not recorded).
    series: Option<Arc<PeerSeriesMap>>,
    /// When this node last accepted a message of its leader.
    contacts: Arc<super::contacts::Contacts>,
    /// Asks the members this node knows about an unvouched stranger (`None`: it stays
    /// refused).
    vouching: Option<AskAbout>,
    /// Refusals are logged at most once a second.
    refusal_lines: Arc<RateLimit>,
    /// The table whose digests `StateDigest` answers, and the check it may wake (`None`:
    /// answered Unavailable).
    digests: Option<(cairn_fsm::Store, Arc<super::integrity::Integrity>)>,
    /// Turns true when the node shuts down: AppendEntries streams then end.
    stopped: Option<watch::Receiver<bool>>,
}

/// Asks the members this node knows whether a stranger the peer gate refused as unvouched
/// is one of theirs (`vouch::Vouching::ask_about`, which asks through this module's client
/// side: the server side takes it as a parameter).
pub type AskAbout = Arc<dyn Fn(NodeId) + Send + Sync>;

impl RaftRpcService {
    pub fn new(
        raft: Raft,
        node_id: NodeId,
        gate: Arc<PeerGate>,
        limits: RaftServerLimits,
    ) -> RaftRpcService {
        RaftRpcService {
            raft,
            node_id,
            gate,
            budgets: Arc::new(SenderBudgets::new(limits.message_bytes_max)),
            limits,
            series: PeerSeriesMap::when_recording(),
            contacts: Default::default(),
            vouching: None,
            refusal_lines: Arc::new(RateLimit::once_a_second()),
            digests: None,
            stopped: None,
        }
    }

    /// Answers `StateDigest` from `store`'s digests, waking `integrity`'s check when asked.
    pub fn with_digests(
        mut self,
        store: cairn_fsm::Store,
        integrity: Arc<super::integrity::Integrity>,
    ) -> RaftRpcService {
        self.digests = Some((store, integrity));
        self
    }

    /// Ends every AppendEntries stream once `stopped` turns true.
    pub fn with_stop(mut self, stopped: watch::Receiver<bool>) -> RaftRpcService {
        self.stopped = Some(stopped);
        self
    }

    /// Asks the members this node knows about an unvouched stranger through `vouching`.
    pub fn with_vouching(mut self, vouching: AskAbout) -> RaftRpcService {
        self.vouching = Some(vouching);
        self
    }

    /// The size of a message received, when it will be counted (metrics are recorded).
    fn received_bytes(&self, message: &RaftMessage) -> Option<usize> {
        self.series.as_ref().map(|_| message.encoded_len())
    }

    /// Counts an admitted message of `sender` (`received` bytes) and the reply to it.
    fn count(
        &self,
        sender: NodeId,
        standing: Standing,
        received: Option<usize>,
        reply: Option<&RaftMessage>,
    ) {
        let (Some(peers), Some(received)) = (&self.series, received) else {
            return;
        };
        // A stranger's id could be made up: only members become labels.
        if standing.is_stranger() {
            return;
        }
        let series = peers.of(sender);
        series.received(received);
        if let Some(reply) = reply {
            series.sent(reply.encoded_len());
        }
    }

    /// Records when this node accepts its leader's messages into `contacts`.
    pub fn with_contacts(mut self, contacts: Arc<super::contacts::Contacts>) -> RaftRpcService {
        self.contacts = contacts;
        self
    }

    pub fn into_server(self) -> RaftServiceServer<RaftRpcService> {
        let bytes_max = self.limits.message_bytes_max;
        RaftServiceServer::new(self)
            .max_decoding_message_size(bytes_max)
            .max_encoding_message_size(bytes_max)
    }

    /// The envelope first (cluster id, sender), then the payload's bounds.
    fn admit<T: DeserializeOwned>(
        &self,
        request: tonic::Request<RaftMessage>,
        claim: fn(&T) -> Claim,
        check: impl FnOnce(&T, NodeId) -> Result<(), Refusal>,
    ) -> Result<(T, Standing), tonic::Status> {
        self.admit_within_budget(request, false, claim, check)
            .map(|(rpc, standing, _)| (rpc, standing))
    }

    /// [`Self::admit`]; with `budgeted`, the sender's byte budget for this message is taken
    /// once the envelope is admitted and before the payload is decoded, and held by the
    /// returned permit (see [`SenderBudgets`]). A stranger's message is admitted only after
    /// its bounds are checked and what it `claim`s passes the gate.
    fn admit_within_budget<T: DeserializeOwned>(
        &self,
        request: tonic::Request<RaftMessage>,
        budgeted: bool,
        claim: fn(&T) -> Claim,
        check: impl FnOnce(&T, NodeId) -> Result<(), Refusal>,
    ) -> Result<(T, Standing, Option<tokio::sync::OwnedSemaphorePermit>), tonic::Status> {
        let certified = peer_gate::certified_node_ids(&request);
        self.admit_message(
            certified.as_deref(),
            request.into_inner(),
            budgeted,
            claim,
            check,
        )
    }

    /// [`Self::admit_within_budget`] of one message of a stream, whose connection's
    /// certificate named the node ids `certified` (the stream's request carries them).
    fn admit_message<T: DeserializeOwned>(
        &self,
        certified: Option<&[NodeId]>,
        message: RaftMessage,
        budgeted: bool,
        claim: fn(&T) -> Claim,
        check: impl FnOnce(&T, NodeId) -> Result<(), Refusal>,
    ) -> Result<(T, Standing, Option<tokio::sync::OwnedSemaphorePermit>), tonic::Status> {
        let sender = message.sender_node_id;
        let admitted = self
            .gate
            .admit(&message.cluster_id, sender, certified)
            .and_then(|standing| {
                let permit = budgeted
                    .then(|| self.budgets.take(sender, standing, message.payload.len()))
                    .transpose()?;
                Ok((standing, permit))
            })
            .and_then(|(standing, permit)| {
                let rpc: T = decode(&message.payload)
                    .map_err(|e| Refusal::Malformed(format!("undecodable raft message: {e}")))?;
                check(&rpc, sender)?;
                if standing.is_stranger() {
                    self.gate
                        .admit_stranger(&message.cluster_id, sender, standing, claim(&rpc))?;
                }
                Ok((rpc, standing, permit))
            });
        admitted.map_err(|refusal| self.refused(sender, refusal))
    }

    /// Logs a refusal (operating conditions at debug, the rest at most once a second),
    /// asks about an unvouched stranger, and answers the sender.
    fn refused(&self, sender: NodeId, refusal: Refusal) -> tonic::Status {
        match refusal {
            Refusal::Busy { .. } => tracing::debug!(sender, %refusal, "refused a raft message"),
            Refusal::Unvouched { sender } => {
                tracing::debug!(sender, %refusal, "refused a raft message");
                if let Some(ask_about) = &self.vouching {
                    ask_about(sender);
                }
            }
            _ => {
                if let Some(suppressed) = self.refusal_lines.take() {
                    tracing::warn!(
                        sender,
                        %refusal,
                        suppressed,
                        "refused a raft message (suppressed: refusals not logged since the \
                         last one)"
                    );
                }
            }
        }
        tonic::Status::from(refusal)
    }

    /// Admits one AppendEntries (whose connection's certificate named `certified`), hands it
    /// to the core, and answers.
    async fn append_entries_message(
        &self,
        certified: Option<&[NodeId]>,
        message: RaftMessage,
    ) -> Result<RaftMessage, tonic::Status> {
        let entries_max = self.limits.entries_max;
        let sender = message.sender_node_id;
        let received = self.received_bytes(&message);
        // The budget is held until the core has answered.
        let (rpc, standing, _budget): (AppendEntriesRequest<TypeConfig>, _, _) = self
            .admit_message(
                certified,
                message,
                true,
                Claim::of_append_entries,
                |rpc, sender| peer_gate::check_append_entries(rpc, sender, entries_max),
            )?;
        let result = self.raft.append_entries(rpc).await;
        // Only the leader of a term sends AppendEntries; one of an older term is refused.
        if matches!(&result, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
            self.contacts.heard_from_leader();
        }
        let reply = self.reply(&result).map(tonic::Response::into_inner);
        self.count(sender, standing, received, reply.as_ref().ok());
        reply
    }

    fn reply<T: Serialize>(
        &self,
        value: &T,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let payload = encode(value).map_err(|e| {
            tonic::Status::from(cairn_proto::error::ApiError::Internal(format!(
                "encoding raft reply: {e}"
            )))
        })?;
        Ok(tonic::Response::new(RaftMessage {
            cluster_id: self.gate.cluster_id(),
            payload,
            sender_node_id: self.node_id,
            cluster_version_supported_major: ClusterVersion::SUPPORTED_MAX.major,
            cluster_version_supported_minor: ClusterVersion::SUPPORTED_MAX.minor,
            data_bytes_max: self.contacts.own_data_bytes_max(),
        }))
    }
}

#[tonic::async_trait]
impl RaftService for RaftRpcService {
    async fn append_entries(
        &self,
        request: tonic::Request<RaftMessage>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let certified = peer_gate::certified_node_ids(&request);
        self.append_entries_message(certified.as_deref(), request.into_inner())
            .await
            .map(tonic::Response::new)
    }

    type AppendEntriesStreamStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<RaftMessage, tonic::Status>> + Send>>;

    /// AppendEntries over one long-lived stream (see the module docs): each message is
    /// answered in turn, exactly as [`Self::append_entries`] answers one; a refusal ends the
    /// stream with its status (the sender opens another).
    async fn append_entries_stream(
        &self,
        request: tonic::Request<tonic::Streaming<RaftMessage>>,
    ) -> Result<tonic::Response<Self::AppendEntriesStreamStream>, tonic::Status> {
        let certified = peer_gate::certified_node_ids(&request);
        let state = (self.clone(), certified, request.into_inner(), false);
        let replies = futures::stream::unfold(
            state,
            |(service, certified, mut incoming, refused)| async move {
                if refused {
                    return None;
                }
                // The sender closed its side or the connection failed: the stream ends.
                let message = incoming.message().await.ok().flatten()?;
                let reply = service
                    .append_entries_message(certified.as_deref(), message)
                    .await;
                let refused = reply.is_err();
                Some((reply, (service, certified, incoming, refused)))
            },
        );
        // This node is shutting down: the stream ends UNAVAILABLE (its sender then opens a
        // stream to the next leader's address, or to this node's again once it is back).
        Ok(tonic::Response::new(crate::tasks::end_when_stopped(
            replies,
            self.stopped.clone(),
            tonic::Status::unavailable("the node is shutting down"),
        )))
    }

    async fn vote(
        &self,
        request: tonic::Request<RaftMessage>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let (sender, received) = (
            request.get_ref().sender_node_id,
            self.received_bytes(request.get_ref()),
        );
        let (rpc, standing): (VoteRequest<NodeId>, _) = self.admit(
            request,
            Claim::of_vote_request,
            peer_gate::check_vote_request,
        )?;
        let result = self.raft.vote(rpc).await;
        let reply = self.reply(&result);
        self.count(
            sender,
            standing,
            received,
            reply.as_ref().ok().map(tonic::Response::get_ref),
        );
        reply
    }

    async fn install_snapshot(
        &self,
        request: tonic::Request<RaftMessage>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let chunk_max = self.limits.snapshot_chunk_bytes_max;
        let (sender, received) = (
            request.get_ref().sender_node_id,
            self.received_bytes(request.get_ref()),
        );
        let (rpc, standing, _budget): (InstallSnapshotRequest<TypeConfig>, _, _) = self
            .admit_within_budget(request, true, Claim::of_install_snapshot, |rpc, sender| {
                peer_gate::check_install_snapshot(rpc, sender, chunk_max)
            })?;
        let result = self.raft.install_snapshot(rpc).await;
        if result.is_ok() {
            self.contacts.heard_from_leader();
        }
        let reply = self.reply(&result);
        self.count(
            sender,
            standing,
            received,
            reply.as_ref().ok().map(tonic::Response::get_ref),
        );
        reply
    }

    /// Answers a member this node knows with the node ids of its current membership (see
    /// `vouch::Vouching`). A stranger's question is refused: it shows nothing.
    async fn members(
        &self,
        request: tonic::Request<RaftMessage>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let ((), _): ((), _) = self.admit(request, |_| Claim::Nothing, |_, _| Ok(()))?;
        let members: Vec<NodeId> = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect();
        self.reply(&members)
    }

    /// Answers a member with this node's table digest at an index (see
    /// `super::integrity`). A stranger's question is refused: it shows nothing.
    async fn state_digest(
        &self,
        request: tonic::Request<RaftMessage>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let (question, standing): (super::integrity::DigestQuestion, _) =
            self.admit(request, |_| Claim::Nothing, |_, _| Ok(()))?;
        if standing.is_stranger() {
            return Err(tonic::Status::permission_denied(
                "digests are answered to members only",
            ));
        }
        let Some((store, integrity)) = &self.digests else {
            return Err(tonic::Status::unavailable(
                "this node answers no digests yet",
            ));
        };
        let leads = self.raft.metrics().borrow().current_leader == Some(self.node_id);
        let answer = super::integrity::answer(store, integrity, leads, &question).await;
        self.reply(&answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a peer server was sent, by which path.
    #[derive(Default)]
    struct Sent {
        unary: std::sync::atomic::AtomicUsize,
        streams: std::sync::atomic::AtomicUsize,
        streamed: std::sync::atomic::AtomicUsize,
    }

    /// A peer that answers every AppendEntries with `Success`, over the stream or not
    /// (`streams: false` is a build of an earlier release, which has no stream).
    #[derive(Clone)]
    struct Peer {
        streams: bool,
        sent: Arc<Sent>,
    }

    fn success() -> RaftMessage {
        let answer: Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>> =
            Ok(AppendEntriesResponse::Success);
        RaftMessage {
            cluster_id: "c".into(),
            payload: encode(&answer).unwrap(),
            sender_node_id: 2,
            cluster_version_supported_major: 0,
            cluster_version_supported_minor: 0,
            data_bytes_max: 0,
        }
    }

    #[tonic::async_trait]
    impl RaftService for Peer {
        async fn append_entries(
            &self,
            _: tonic::Request<RaftMessage>,
        ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
            self.sent
                .unary
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(tonic::Response::new(success()))
        }

        type AppendEntriesStreamStream = std::pin::Pin<
            Box<dyn futures::Stream<Item = Result<RaftMessage, tonic::Status>> + Send>,
        >;

        async fn append_entries_stream(
            &self,
            request: tonic::Request<tonic::Streaming<RaftMessage>>,
        ) -> Result<tonic::Response<Self::AppendEntriesStreamStream>, tonic::Status> {
            self.sent
                .streams
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if !self.streams {
                return Err(tonic::Status::unimplemented("no such method"));
            }
            let sent = self.sent.clone();
            let replies = futures::stream::unfold(request.into_inner(), move |mut incoming| {
                let sent = sent.clone();
                async move {
                    incoming.message().await.ok().flatten()?;
                    sent.streamed
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Some((Ok(success()), incoming))
                }
            });
            Ok(tonic::Response::new(Box::pin(replies)))
        }

        async fn vote(
            &self,
            _: tonic::Request<RaftMessage>,
        ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
            Err(tonic::Status::unimplemented("not in this test"))
        }

        async fn install_snapshot(
            &self,
            _: tonic::Request<RaftMessage>,
        ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
            Err(tonic::Status::unimplemented("not in this test"))
        }

        async fn members(
            &self,
            _: tonic::Request<RaftMessage>,
        ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
            Err(tonic::Status::unimplemented("not in this test"))
        }

        async fn state_digest(
            &self,
            _: tonic::Request<RaftMessage>,
        ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
            Err(tonic::Status::unimplemented("not in this test"))
        }
    }

    /// Serves `peer` on a loopback port of its own; its address.
    async fn serve(peer: Peer) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let incoming = futures::stream::unfold(listener, |listener| async move {
            Some((listener.accept().await.map(|(stream, _)| stream), listener))
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RaftServiceServer::new(peer))
                .serve_with_incoming(incoming),
        );
        address
    }

    #[tokio::test]
    async fn append_entries_share_one_stream_and_a_peer_without_it_gets_unary_calls() {
        for streams in [true, false] {
            let sent = Arc::new(Sent::default());
            let peer_address = serve(Peer {
                streams,
                sent: sent.clone(),
            })
            .await;
            let dir = tempfile::tempdir().unwrap();
            let identity = Arc::new(ClusterIdentity::open(dir.path()).unwrap());
            let client = PeerClient {
                target: 2,
                network: Network::new(identity, 1, 1024 * 1024, None),
                peer_address,
                series: None,
            };
            for _ in 0..5 {
                let payload = encode(&()).unwrap();
                let answer = client
                    .send(Method::AppendEntries, payload, Duration::from_secs(5), true)
                    .await
                    .expect("answered");
                let answer: Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>> =
                    decode(&answer).unwrap();
                assert!(matches!(answer, Ok(AppendEntriesResponse::Success)));
            }
            let count =
                |n: &std::sync::atomic::AtomicUsize| n.load(std::sync::atomic::Ordering::SeqCst);
            // One stream carries every message; a peer without it is asked once, then
            // sent unary calls (the message that found out included).
            assert_eq!(count(&sent.streams), 1, "streams: {streams}");
            if streams {
                assert_eq!((count(&sent.streamed), count(&sent.unary)), (5, 0));
            } else {
                assert_eq!((count(&sent.streamed), count(&sent.unary)), (0, 5));
            }
        }
    }

    #[test]
    fn a_sender_budget_holds_one_largest_message_and_lets_small_ones_by() {
        // While one largest message of node 2 is processed, its heartbeats still pass, a
        // second large message is refused at once (UNAVAILABLE), and node 3 has its own
        // budget; once the first is done, the budget is whole again.
        const MAX: usize = 8 * 1024 * 1024;
        let budgets = SenderBudgets::new(MAX);
        let large = budgets
            .take(2, Standing::Member, MAX)
            .expect("the first largest message");
        let heartbeat = budgets
            .take(2, Standing::Member, 200)
            .expect("a heartbeat beside it");
        let refused = budgets
            .take(2, Standing::Member, MAX / 2)
            .expect_err("a second large message");
        assert!(
            matches!(refused, Refusal::Busy { sender: 2, bytes_in_process } if bytes_in_process == MAX + 200),
            "{refused}"
        );
        let status = tonic::Status::from(refused);
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        let _other = budgets
            .take(3, Standing::Member, MAX)
            .expect("another sender's budget");
        drop((large, heartbeat));
        let _whole = budgets
            .take(2, Standing::Member, MAX)
            .expect("the budget is whole again");
    }

    #[test]
    fn strangers_share_one_budget() {
        // Senders outside the membership could be made up by the dozen: together they get
        // one sender's budget, and a member keeps its own.
        const MAX: usize = 8 * 1024 * 1024;
        let budgets = SenderBudgets::new(MAX);
        let _large = budgets
            .take(7, Standing::Stranger, MAX)
            .expect("a stranger's largest message");
        let refused = budgets
            .take(8, Standing::Stranger, MAX / 2)
            .expect_err("another stranger shares the budget");
        assert!(
            matches!(refused, Refusal::Busy { sender: 8, .. }),
            "{refused}"
        );
        let _member = budgets
            .take(8, Standing::Member, MAX)
            .expect("node 8 as a member has its own budget");
    }

    #[test]
    fn a_send_is_given_time_for_its_size() {
        // At least a second; 4 MiB/s beyond it; never less than openraft's own TTL.
        let base = Duration::from_millis(100);
        assert_eq!(transfer_timeout(base, 0), Duration::from_secs(1));
        assert_eq!(
            transfer_timeout(base, 60 * 1024 * 1024),
            Duration::from_secs(16)
        );
        assert_eq!(
            transfer_timeout(Duration::from_secs(5), 4 * 1024 * 1024),
            Duration::from_secs(6)
        );
    }
}
