//! Raft transport over tonic: the client side ([`Network`], one cached channel
//! per peer with HTTP/2 keepalive) and the server side ([`RaftRpcService`]).
//! Payloads are openraft's request/response types encoded with bincode 2
//! (with a byte limit, so a length prefix can never ask for more memory than
//! the message holds). Every message carries the sender's cluster id and node
//! id, and is checked by the [`PeerGate`] before openraft sees it: an empty or
//! other cluster's id, a sender outside the membership, or a term, index or
//! size out of bounds is refused. Replies are bounded the same way.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_proto::v1::raft_service_client::RaftServiceClient;
use cairn_proto::v1::raft_service_server::{RaftService, RaftServiceServer};
use cairn_proto::v1::RaftMessage;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::Mutex;
use tonic::transport::{Channel, Endpoint};

use super::peer_gate::{self, PeerGate, Refusal};
use super::stages::{IndexStage, WriteStages};
use super::state_machine::ClusterIdentity;
use super::{NodeId, NodeInfo, Raft, TypeConfig};

/// bincode's own bound on what one decode may claim, and the largest
/// `peer_message_bytes_max` the config accepts: a message is never larger
/// than that gRPC limit, so no length prefix inside it can claim more.
pub const DECODE_BYTES_MAX: usize = 1 << 30;

fn encode<T: Serialize>(value: &T) -> Result<Bytes, bincode::error::EncodeError> {
    bincode::serde::encode_to_vec(value, bincode::config::standard()).map(Bytes::from)
}

/// Decodes a Raft message or reply; never panics, whatever the bytes.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::error::DecodeError> {
    let config = bincode::config::standard().with_limit::<DECODE_BYTES_MAX>();
    let (value, _) = bincode::serde::decode_from_slice(bytes, config)?;
    Ok(value)
}

/// Dials peers; one cached channel per peer address, shared by every
/// replication stream to it.
#[derive(Clone)]
pub struct Network {
    identity: Arc<ClusterIdentity>,
    node_id: NodeId,
    message_bytes_max: usize,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// The write-stage clock: a follower's acknowledgement of entries is
    /// their `replicated` time.
    stages: Arc<WriteStages>,
    /// Dial peers over mutual TLS with this (`None`: plaintext).
    tls: Option<cairn_tls::ClientTls>,
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
            stages: Arc::new(WriteStages::new(false)),
            tls,
        }
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
            .connect_timeout(Duration::from_millis(500))
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        // Each (re)connection dials with the TLS configuration current then,
        // so a reloaded certificate is used from the next connection on.
        let channel = cairn_tls::lazy_channel(endpoint, self.tls.as_ref());
        channels.insert(peer_address.to_string(), channel.clone());
        Ok(channel)
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &NodeInfo) -> PeerClient {
        PeerClient {
            target,
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
}

impl PeerClient {
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
        let channel = self.network.channel(&self.peer_address).map_err(|e| {
            RPCError::Unreachable(Unreachable::new(&std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                e,
            )))
        })?;
        let mut client = RaftServiceClient::new(channel)
            .max_decoding_message_size(self.network.message_bytes_max)
            .max_encoding_message_size(self.network.message_bytes_max);
        let mut request = tonic::Request::new(RaftMessage {
            cluster_id: self.network.identity.cluster_id(),
            payload,
            sender_node_id: self.network.node_id,
        });
        request.set_timeout(option.hard_ttl());
        let response = match method {
            Method::AppendEntries => client.append_entries(request).await,
            Method::Vote => client.vote(request).await,
            Method::InstallSnapshot => client.install_snapshot(request).await,
        };
        let message = response.map_err(|status| match status.code() {
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                RPCError::Unreachable(Unreachable::new(&status))
            }
            _ => RPCError::Network(NetworkError::new(&status)),
        })?;
        let reply: Result<Resp, RaftError<NodeId, E>> = decode(&message.into_inner().payload)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let reply = reply.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))?;
        // A reply's term is adopted by openraft: bounded like a request's.
        check_reply(&reply).map_err(|refusal| {
            RPCError::Network(NetworkError::new(&std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("reply from node {}: {refusal}", self.target),
            )))
        })?;
        Ok(reply)
    }
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
        let response: AppendEntriesResponse<NodeId> = self
            .call(
                &rpc,
                &option,
                Method::AppendEntries,
                peer_gate::check_append_entries_reply,
            )
            .await?;
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
    /// [`peer_gate::ENTRIES_MAX`], above any leader's `max_payload_entries`.
    pub entries_max: usize,
    /// Largest snapshot chunk accepted: the gate's fixed
    /// [`peer_gate::SNAPSHOT_CHUNK_BYTES_MAX`], the upper bound of
    /// `snapshot_chunk_bytes` on every node.
    pub snapshot_chunk_bytes_max: u64,
}

/// Serves Raft RPCs from peers.
#[derive(Clone)]
pub struct RaftRpcService {
    raft: Raft,
    node_id: NodeId,
    gate: Arc<PeerGate>,
    limits: RaftServerLimits,
}

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
            limits,
        }
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
        check: impl FnOnce(&T, NodeId) -> Result<(), Refusal>,
    ) -> Result<T, tonic::Status> {
        let certified = peer_gate::certified_node_ids(&request);
        let message = request.into_inner();
        let sender = message.sender_node_id;
        let admitted = self
            .gate
            .admit(&message.cluster_id, sender, certified.as_deref())
            .and_then(|()| {
                decode(&message.payload)
                    .map_err(|e| Refusal::Malformed(format!("undecodable raft message: {e}")))
            })
            .and_then(|rpc: T| check(&rpc, sender).map(|()| rpc));
        admitted.map_err(|refusal| {
            tracing::warn!(sender, %refusal, "refused a raft message");
            tonic::Status::from(refusal)
        })
    }

    fn reply<T: Serialize>(
        &self,
        value: &T,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let payload = encode(value)
            .map_err(|e| tonic::Status::internal(format!("encoding raft reply: {e}")))?;
        Ok(tonic::Response::new(RaftMessage {
            cluster_id: self.gate.cluster_id(),
            payload,
            sender_node_id: self.node_id,
        }))
    }
}

#[tonic::async_trait]
impl RaftService for RaftRpcService {
    async fn append_entries(
        &self,
        request: tonic::Request<RaftMessage>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let entries_max = self.limits.entries_max;
        let rpc: AppendEntriesRequest<TypeConfig> = self.admit(request, |rpc, sender| {
            peer_gate::check_append_entries(rpc, sender, entries_max)
        })?;
        let result = self.raft.append_entries(rpc).await;
        self.reply(&result)
    }

    async fn vote(
        &self,
        request: tonic::Request<RaftMessage>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let rpc: VoteRequest<NodeId> = self.admit(request, peer_gate::check_vote_request)?;
        let result = self.raft.vote(rpc).await;
        self.reply(&result)
    }

    async fn install_snapshot(
        &self,
        request: tonic::Request<RaftMessage>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let chunk_max = self.limits.snapshot_chunk_bytes_max;
        let rpc: InstallSnapshotRequest<TypeConfig> = self.admit(request, |rpc, sender| {
            peer_gate::check_install_snapshot(rpc, sender, chunk_max)
        })?;
        let result = self.raft.install_snapshot(rpc).await;
        self.reply(&result)
    }
}
