//! The node's side of forwarding: [`NodeHandle`] implements
//! `cairn_forwarding::Handle` over [`RaftHandle`], and [`start`] builds the
//! forwarder used by the client port, the `ForwardingService` served on the
//! peer port, and the task that feeds every leader change seen in Raft's
//! metrics to the cached leader channel.
//!
//! Tasks: one, the leader watcher; it ends when Raft stops (its metrics
//! channel closes).

use std::sync::Arc;
use std::time::Duration;

use cairn_forwarding::{
    Executor, Forwarder, ForwarderOptions, ForwardingServer, Handle, LeaderChannel,
    LeaderChannelOptions,
};
use cairn_fsm::{Applied, Command, Store};
use cairn_proto::error::{ApiError, LeaderHint};
use cairn_proto::v1::forwarding_service_server::ForwardingServiceServer;

use crate::raft::RaftHandle;

/// [`Handle`] over this node's Raft.
pub struct NodeHandle {
    raft: RaftHandle,
}

impl NodeHandle {
    pub fn new(raft: RaftHandle) -> NodeHandle {
        NodeHandle { raft }
    }
}

impl Handle for NodeHandle {
    async fn apply(&self, command: Command) -> Result<(u64, Applied), ApiError> {
        // Refused before proposing: certainly not in the log, safe to retry
        // at the leader (the Handle contract).
        if !self.raft.is_leader() {
            return Err(ApiError::NotLeader {
                hint: self.raft.leader(),
            });
        }
        match self.raft.propose(command).await {
            // openraft answers ForwardToLeader both when it refuses an entry
            // and when an entry it had appended was truncated by a new leader
            // (in clusters of five or more another node may still hold and
            // commit that entry). The two cannot be told apart, so after
            // proposing, a lost leadership is an unknown outcome.
            Err(ApiError::NotLeader { hint }) => Err(ApiError::Inconsistent(format!(
                "leadership was lost while the command was proposed (leader now {:?}); \
                 it may still commit",
                hint.leader_id
            ))),
            // Raft stopping while the command was in flight: it may have been
            // appended and may commit under the next leader.
            Err(ApiError::Unavailable(message)) => Err(ApiError::Inconsistent(format!(
                "{message}; the command may still commit"
            ))),
            other => other,
        }
    }

    fn is_leader(&self) -> bool {
        self.raft.is_leader()
    }

    async fn ensure_strong_consistency(&self) -> Result<u64, ApiError> {
        self.raft.ensure_linearizable().await
    }

    fn leader(&self) -> LeaderHint {
        self.raft.leader()
    }

    fn store(&self) -> &Store {
        &self.raft.store
    }
}

/// What the agent serves: the forwarder for the client port and the
/// `ForwardingService` for the peer port.
pub struct Forwarding {
    pub forwarder: Forwarder<NodeHandle>,
    pub service: ForwardingServiceServer<ForwardingServer<NodeHandle>>,
}

/// Builds the forwarding pieces of a node and spawns its leader watcher.
/// `request_timeout` bounds every forwarded request served here.
/// `tls`: dial the leader's peer port over mutual TLS with it.
pub fn start(
    raft: &RaftHandle,
    peer_address: &str,
    request_timeout: Duration,
    tls: Option<cairn_tls::ClientTls>,
) -> Forwarding {
    cairn_forwarding::metrics::describe();
    let handle = Arc::new(NodeHandle::new(raft.clone()));
    let channel = Arc::new(
        LeaderChannel::new(raft.node_id, peer_address, LeaderChannelOptions::default())
            .with_tls(tls),
    );
    tokio::spawn(watch_leader(raft.clone(), channel.clone()));
    Forwarding {
        forwarder: Forwarder::new(
            Executor::new(handle.clone()),
            channel,
            ForwarderOptions::default(),
        ),
        service: ForwardingServer::new(Executor::new(handle), request_timeout).into_service(),
    }
}

/// Calls the channel's leader-change hook on every leader change seen in
/// Raft's metrics, until Raft stops.
async fn watch_leader(raft: RaftHandle, channel: Arc<LeaderChannel>) {
    let mut known = raft.leader();
    channel.leader_changed(&known);
    while let Some(hint) = raft.leader_changed(&known).await {
        tracing::info!(leader = ?hint.leader_id, "leader changed");
        channel.leader_changed(&hint);
        known = hint;
    }
}
