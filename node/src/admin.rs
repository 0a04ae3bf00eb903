//! `AdminService`: cluster status, membership changes and leader transfer.
//!
//! Every operation needs the `admin` role ([`crate::auth`]); the check runs
//! first, before a restore upload is read or anything else is done.
//!
//! Membership changes must run on the leader; elsewhere they answer NotLeader
//! with the leader's address, which `cairn` follows.
//!
//! Leader transfer (openraft 0.9 has none): the leader checks the target has
//! every entry of its log, pauses its own heartbeats and elections, waits out
//! the followers' leader lease, then asks the target to campaign at once. The
//! target, with a complete log, wins a term the old leader then joins as a
//! follower. Safety never depends on this dance (elections are ordinary Raft
//! elections); only which node wins does. Heartbeats resume whatever happens.

use std::time::Duration;

use cairn_proto::error::ApiError;
use cairn_proto::v1::admin_service_server::AdminService;
use cairn_proto::v1::{self as pb};
use tonic::{Request, Response, Status};

use crate::auth::{AdminOperation, Authenticator};
use crate::raft::{NodeInfo, RaftHandle};

pub struct Admin {
    pub raft: RaftHandle,
    pub election_timeout: Duration,
    pub restorer: std::sync::Arc<crate::restore::Restorer>,
    pub auth: std::sync::Arc<Authenticator>,
    /// How this node reaches other nodes' client ports (TLS or plaintext),
    /// presenting this node's own token (to ask another node to campaign).
    pub access: cairn_client::Access,
}

impl Admin {
    pub async fn status(&self) -> pb::StatusResponse {
        let commit_index = self.raft.committed_index().await;
        let s = self.raft.status();
        let leader = s.leader_id;
        let role = |id: u64, voter: bool| -> String {
            if Some(id) == leader {
                "leader".into()
            } else if !voter {
                "learner".into()
            } else if id == s.node_id {
                s.state.clone()
            } else {
                "follower".into()
            }
        };
        let mut members = Vec::new();
        for (voter, map) in [(true, &s.voters), (false, &s.learners)] {
            for (id, node) in map.iter() {
                members.push(pb::Member {
                    id: *id,
                    peer_address: node.peer_address.clone(),
                    client_address: node.client_address.clone(),
                    role: role(*id, voter),
                    voter,
                    last_contact_ms: -1,
                    matched_index: s.matched.get(id).copied().unwrap_or(0),
                });
            }
        }
        pb::StatusResponse {
            node_id: s.node_id,
            cluster_id: self.raft.identity.cluster_id(),
            leader_id: leader.unwrap_or(0),
            term: s.term,
            commit_index,
            applied_index: s.applied_index,
            last_log_index: s.last_log_index,
            snapshot_index: s.snapshot_index,
            purged_index: s.purged_index,
            members,
            state: s.state,
            resource_count: self.raft.store.view().len() as u64,
            pending_restore: self
                .raft
                .store
                .pending_restore()
                .map(|p| pb::PendingRestore {
                    restore_id: p.restore_id,
                    resource_count: p.resource_count,
                    received: p.received,
                    failure: p.failure.unwrap_or_default(),
                }),
        }
    }

    async fn membership(
        &self,
        index: Result<u64, ApiError>,
    ) -> Result<pb::MembershipResponse, ApiError> {
        let log_index = index?;
        Ok(pb::MembershipResponse {
            log_index,
            status: Some(self.status().await),
        })
    }

    pub async fn transfer_leader(&self, to: u64) -> Result<pb::MembershipResponse, ApiError> {
        if !self.raft.is_leader() {
            return Err(ApiError::NotLeader {
                hint: self.raft.leader(),
            });
        }
        let status = self.raft.status();
        let me = self.raft.node_id;
        let target = if to != 0 {
            if to == me {
                return Ok(pb::MembershipResponse {
                    log_index: 0,
                    status: Some(self.status().await),
                });
            }
            if !status.voters.contains_key(&to) {
                return Err(ApiError::invalid("to", format!("node {to} is not a voter")));
            }
            to
        } else {
            self.raft.best_successor().ok_or_else(|| {
                ApiError::invalid("to", "there is no other voter to hand leadership to")
            })?
        };
        // (The membership may have changed since `status` was read.)
        let node: NodeInfo = status
            .voters
            .get(&target)
            .cloned()
            .ok_or_else(|| ApiError::invalid("to", format!("node {target} is not a voter")))?;
        // 1. The target must hold every entry we have.
        let caught_up = async {
            loop {
                let s = self.raft.status();
                if s.matched.get(&target).copied().unwrap_or(0) >= s.last_log_index {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        if tokio::time::timeout(self.election_timeout, caught_up)
            .await
            .is_err()
        {
            return Err(ApiError::Unavailable(format!(
                "node {target} did not catch up with the leader's log in time"
            )));
        }
        // 2. Go quiet so the followers' leases lapse, then 3. let the target campaign.
        self.raft.set_heartbeats(false);
        let result = async {
            tokio::time::sleep(self.election_timeout * 6 / 10 + Duration::from_millis(50)).await;
            let mut client =
                self.access.admin(&node.client_address).await.map_err(|e| {
                    ApiError::Unavailable(format!("cannot reach node {target}: {e}"))
                })?;
            client
                .trigger_election(pb::TriggerElectionRequest {})
                .await
                .map_err(ApiError::from)?;
            let deadline = tokio::time::Instant::now() + self.election_timeout * 3;
            while tokio::time::Instant::now() < deadline {
                let leader = self.raft.status().leader_id;
                if leader.is_some() && leader != Some(me) {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(ApiError::Unavailable(format!(
                "node {target} did not become leader in time"
            )))
        }
        .await;
        self.raft.set_heartbeats(true);
        result?;
        Ok(pb::MembershipResponse {
            log_index: 0,
            status: Some(self.status().await),
        })
    }
}

/// A `Write` that cuts what it receives into chunks of at most
/// [`SNAPSHOT_CHUNK_BYTES`] and sends them down a bounded channel, so a
/// snapshot of any size streams in constant memory.
struct ChunkSender {
    tx: tokio::sync::mpsc::Sender<Result<pb::SnapshotChunk, Status>>,
    buffer: Vec<u8>,
}

/// The size of one streamed snapshot chunk.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;

impl ChunkSender {
    fn send_buffer(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let data = std::mem::replace(&mut self.buffer, Vec::with_capacity(SNAPSHOT_CHUNK_BYTES));
        self.tx
            .blocking_send(Ok(pb::SnapshotChunk { data: data.into() }))
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away")
            })
    }
}

impl std::io::Write for ChunkSender {
    fn write(&mut self, mut bytes: &[u8]) -> std::io::Result<usize> {
        let n = bytes.len();
        while !bytes.is_empty() {
            let room = SNAPSHOT_CHUNK_BYTES - self.buffer.len();
            let take = room.min(bytes.len());
            self.buffer.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.buffer.len() == SNAPSHOT_CHUNK_BYTES {
                self.send_buffer()?;
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send_buffer()
    }
}

pub type SnapshotStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::SnapshotChunk, Status>> + Send>>;

#[tonic::async_trait]
impl AdminService for Admin {
    type SaveSnapshotStream = SnapshotStream;

    async fn save_snapshot(
        &self,
        r: Request<pb::SaveSnapshotRequest>,
    ) -> Result<Response<SnapshotStream>, Status> {
        self.auth.require_admin(&r, AdminOperation::SaveSnapshot)?;
        // A linearizable point: leadership confirmed, everything committed applied.
        self.raft.ensure_linearizable().await?;
        let (snapshot, header) = self.raft.point_in_time_snapshot()?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            let error_tx = tx.clone();
            let result = (|| {
                let sender = ChunkSender {
                    tx,
                    buffer: Vec::with_capacity(SNAPSHOT_CHUNK_BYTES),
                };
                let mut encoder = crate::snapshot_file::SnapshotEncoder::new(sender, &header)?;
                for resource in snapshot {
                    encoder.append_encoded(resource.encoded())?;
                }
                encoder.finish().map(|_| ())
            })();
            if let Err(e) = result {
                if e.kind() != std::io::ErrorKind::BrokenPipe {
                    let _ = error_tx.blocking_send(Err(Status::internal(format!(
                        "streaming the snapshot: {e}"
                    ))));
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn restore_snapshot(
        &self,
        r: Request<tonic::Streaming<pb::SnapshotChunk>>,
    ) -> Result<Response<pb::RestoreSnapshotResponse>, Status> {
        self.auth
            .require_admin(&r, AdminOperation::RestoreSnapshot)?;
        let (log_index, resource_count) = self.restorer.restore_upload(r.into_inner()).await?;
        Ok(Response::new(pb::RestoreSnapshotResponse {
            log_index,
            resource_count,
        }))
    }

    async fn status(
        &self,
        r: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        self.auth.require_admin(&r, AdminOperation::Status)?;
        Ok(Response::new(Admin::status(self).await))
    }

    async fn add_learner(
        &self,
        r: Request<pb::AddLearnerRequest>,
    ) -> Result<Response<pb::MembershipResponse>, Status> {
        self.auth.require_admin(&r, AdminOperation::AddLearner)?;
        let r = r.into_inner();
        if r.id == 0 {
            return Err(ApiError::invalid("id", "must be positive").into());
        }
        for (field, address) in [
            ("peer_address", &r.peer_address),
            ("client_address", &r.client_address),
        ] {
            if address.parse::<std::net::SocketAddr>().is_err() {
                return Err(ApiError::invalid(
                    field,
                    format!("{address:?} is not an IP:port address"),
                )
                .into());
            }
        }
        let node = NodeInfo {
            peer_address: r.peer_address,
            client_address: r.client_address,
        };
        Ok(Response::new(
            self.membership(self.raft.add_learner(r.id, node).await)
                .await?,
        ))
    }

    async fn promote(
        &self,
        r: Request<pb::PromoteRequest>,
    ) -> Result<Response<pb::MembershipResponse>, Status> {
        self.auth.require_admin(&r, AdminOperation::Promote)?;
        Ok(Response::new(
            self.membership(self.raft.promote(r.into_inner().id).await)
                .await?,
        ))
    }

    async fn remove_member(
        &self,
        r: Request<pb::RemoveMemberRequest>,
    ) -> Result<Response<pb::MembershipResponse>, Status> {
        self.auth.require_admin(&r, AdminOperation::RemoveMember)?;
        Ok(Response::new(
            self.membership(self.raft.remove(r.into_inner().id).await)
                .await?,
        ))
    }

    async fn transfer_leader(
        &self,
        r: Request<pb::TransferLeaderRequest>,
    ) -> Result<Response<pb::MembershipResponse>, Status> {
        self.auth
            .require_admin(&r, AdminOperation::TransferLeader)?;
        Ok(Response::new(
            self.transfer_leader(r.into_inner().to).await?,
        ))
    }

    async fn trigger_election(
        &self,
        r: Request<pb::TriggerElectionRequest>,
    ) -> Result<Response<pb::TriggerElectionResponse>, Status> {
        self.auth
            .require_admin(&r, AdminOperation::TriggerElection)?;
        self.raft.trigger_election().await?;
        Ok(Response::new(pb::TriggerElectionResponse {}))
    }
}
