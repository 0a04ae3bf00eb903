//! Raft transport over tonic: the client side ([`Network`], one cached channel
//! per peer with HTTP/2 keepalive) and the server side ([`RaftRpcService`]).
//! Payloads are openraft's request/response types encoded with bincode 2.
//! Every message carries the sender's cluster id; a node of another cluster is
//! refused, so members of an old cluster cannot rejoin a restored one.

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

use super::state_machine::ClusterIdentity;
use super::{NodeId, NodeInfo, Raft, TypeConfig};

/// Largest Raft message accepted or sent (AppendEntries batches are bounded by
/// `max_payload_entries` x the 1 MiB resource limit; snapshot chunks by the chunk size).
pub const RAFT_MESSAGE_BYTES_MAX: usize = 128 * 1024 * 1024;

fn encode<T: Serialize>(value: &T) -> Result<Bytes, bincode::error::EncodeError> {
    bincode::serde::encode_to_vec(value, bincode::config::standard()).map(Bytes::from)
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::error::DecodeError> {
    let (value, _) = bincode::serde::decode_from_slice(bytes, bincode::config::standard())?;
    Ok(value)
}

/// Dials peers; one cached channel per peer address, shared by every
/// replication stream to it.
#[derive(Clone)]
pub struct Network {
    identity: Arc<ClusterIdentity>,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// Dial peers over mutual TLS with this (`None`: plaintext).
    tls: Option<cairn_tls::ClientTls>,
}

impl Network {
    pub fn new(identity: Arc<ClusterIdentity>, tls: Option<cairn_tls::ClientTls>) -> Network {
        Network {
            identity,
            channels: Arc::new(Mutex::new(HashMap::new())),
            tls,
        }
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
            .max_decoding_message_size(RAFT_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(RAFT_MESSAGE_BYTES_MAX);
        let mut request = tonic::Request::new(RaftMessage {
            cluster_id: self.network.identity.cluster_id(),
            payload,
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
        reply.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
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
        self.call(&rpc, &option, Method::AppendEntries).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, NodeInfo, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(&rpc, &option, Method::InstallSnapshot).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, NodeInfo, RaftError<NodeId>>> {
        self.call(&rpc, &option, Method::Vote).await
    }

    fn backoff(&self) -> openraft::network::Backoff {
        // A dead peer is retried every 200 ms: quick to notice a restart, cheap while it is down.
        openraft::network::Backoff::new(std::iter::repeat(Duration::from_millis(200)))
    }
}

/// Serves Raft RPCs from peers.
#[derive(Clone)]
pub struct RaftRpcService {
    raft: Raft,
    identity: Arc<ClusterIdentity>,
}

impl RaftRpcService {
    pub fn new(raft: Raft, identity: Arc<ClusterIdentity>) -> RaftRpcService {
        RaftRpcService { raft, identity }
    }

    pub fn into_server(self) -> RaftServiceServer<RaftRpcService> {
        RaftServiceServer::new(self)
            .max_decoding_message_size(RAFT_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(RAFT_MESSAGE_BYTES_MAX)
    }

    fn admit<T: DeserializeOwned>(&self, message: RaftMessage) -> Result<T, tonic::Status> {
        self.identity
            .admit(&message.cluster_id)
            .map_err(tonic::Status::permission_denied)?;
        decode(&message.payload)
            .map_err(|e| tonic::Status::invalid_argument(format!("undecodable raft message: {e}")))
    }

    fn reply<T: Serialize>(
        &self,
        value: &T,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let payload = encode(value)
            .map_err(|e| tonic::Status::internal(format!("encoding raft reply: {e}")))?;
        Ok(tonic::Response::new(RaftMessage {
            cluster_id: self.identity.cluster_id(),
            payload,
        }))
    }
}

#[tonic::async_trait]
impl RaftService for RaftRpcService {
    async fn append_entries(
        &self,
        request: tonic::Request<RaftMessage>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let rpc: AppendEntriesRequest<TypeConfig> = self.admit(request.into_inner())?;
        let result = self.raft.append_entries(rpc).await;
        self.reply(&result)
    }

    async fn vote(
        &self,
        request: tonic::Request<RaftMessage>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let rpc: VoteRequest<NodeId> = self.admit(request.into_inner())?;
        let result = self.raft.vote(rpc).await;
        self.reply(&result)
    }

    async fn install_snapshot(
        &self,
        request: tonic::Request<RaftMessage>,
    ) -> Result<tonic::Response<RaftMessage>, tonic::Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = self.admit(request.into_inner())?;
        let result = self.raft.install_snapshot(rpc).await;
        self.reply(&result)
    }
}
