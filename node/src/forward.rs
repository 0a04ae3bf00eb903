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
use tonic::service::interceptor::InterceptedService;

use crate::config::UnsafeModes;
use crate::raft::RaftHandle;

/// [`Handle`] over this node's Raft.
pub struct NodeHandle {
    raft: RaftHandle,
    /// The test-only switches that act where a command is proposed (on the leader, for
    /// a write sent to it or forwarded to it): `--unsafe-accept-stale-cas` and
    /// `--unsafe-ack-before-commit`.
    unsafe_modes: UnsafeModes,
}

impl NodeHandle {
    pub fn new(raft: RaftHandle, unsafe_modes: UnsafeModes) -> NodeHandle {
        NodeHandle { raft, unsafe_modes }
    }

    /// DANGEROUS, test-only (`--unsafe-accept-stale-cas`): a write's expected version
    /// becomes the version stored here, so a compare against a stale version succeeds.
    fn accept_stale_cas(&self, command: Command) -> Command {
        match command {
            Command::Write { mut resource } if !resource.version.is_empty() => {
                if let Some(stored) = resource
                    .id
                    .as_ref()
                    .and_then(|id| self.raft.store.view().read(id).ok())
                {
                    resource.version = stored.version().to_owned();
                }
                Command::Write { resource }
            }
            other => other,
        }
    }

    /// DANGEROUS, test-only (`--unsafe-ack-before-commit`): a write is proposed in the
    /// background and answered at once as written, at the index it would get if nothing
    /// else came first; a write that never commits (its leader was cut off or died) was
    /// acknowledged all the same.
    fn ack_before_commit(&self, command: Command) -> (u64, Applied) {
        let Command::Write { resource } = &command else {
            unreachable!("only writes are acknowledged early")
        };
        let index = self
            .raft
            .raft
            .metrics()
            .borrow()
            .last_log_index
            .unwrap_or(0)
            + 1;
        let mut written = resource.clone();
        written.version = index.to_string();
        let raft = self.raft.clone();
        tokio::spawn(async move {
            let _ = raft.propose(command).await;
        });
        (
            index,
            Applied::Written(cairn_fsm::StoredResource::from_resource(&written)),
        )
    }
}

impl Handle for NodeHandle {
    async fn propose(&self, command: Command) -> Result<(u64, Applied), ApiError> {
        let command = if self.unsafe_modes.unsafe_accept_stale_cas {
            self.accept_stale_cas(command)
        } else {
            command
        };
        if self.unsafe_modes.unsafe_ack_before_commit && matches!(command, Command::Write { .. }) {
            // Only a leader acknowledges a write (early, here); a follower forwards it.
            self.raft.require_leader()?;
            return Ok(self.ack_before_commit(command));
        }
        // `RaftHandle::propose` keeps the Handle contract itself: NotLeader or
        // Unavailable only before proposing, Inconsistent after.
        self.raft.propose(command).await
    }

    async fn confirm_read(&self) -> Result<u64, ApiError> {
        self.raft.confirm_read().await
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
    pub service:
        InterceptedService<ForwardingServiceServer<ForwardingServer<NodeHandle>>, PeerCheck>,
}

/// The peer gate in front of the `ForwardingService`: a forwarded request
/// must carry this node's cluster id and come from a member, whose TLS
/// certificate (if the port has TLS) names it.
#[derive(Clone)]
pub struct PeerCheck(Arc<crate::raft::PeerGate>);

impl tonic::service::Interceptor for PeerCheck {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let certified = crate::raft::peer_gate::certified_node_ids(&request);
        match self
            .0
            .admit_metadata(request.metadata(), certified.as_deref())
        {
            Ok(()) => Ok(request),
            Err(refusal) => {
                tracing::warn!(%refusal, "refused a forwarded request");
                Err(refusal.into())
            }
        }
    }
}

/// Builds the forwarding pieces of a node and spawns its leader watcher.
/// `request_timeout` bounds every forwarded request served here;
/// `message_bytes_max` every forwarded message, sent or received.
/// `tls`: dial the leader's peer port over mutual TLS with it.
pub fn start(
    raft: &RaftHandle,
    peer_address: &str,
    request_timeout: Duration,
    message_bytes_max: usize,
    tls: Option<cairn_tls::ClientTls>,
    unsafe_modes: UnsafeModes,
    tasks: &mut crate::tasks::Tasks,
) -> Forwarding {
    cairn_forwarding::metrics::describe();
    let handle = Arc::new(NodeHandle::new(raft.clone(), unsafe_modes));
    let channel = Arc::new(
        LeaderChannel::new(
            raft.node_id,
            peer_address,
            LeaderChannelOptions {
                message_bytes_max,
                ..LeaderChannelOptions::default()
            },
        )
        .with_tls(tls),
    );
    tasks.spawn(
        "leader watcher",
        watch_leader(raft.clone(), channel.clone()),
    );
    let gate = raft.gate.clone();
    let node_id = raft.node_id;
    let stamp: cairn_forwarding::RequestStamp = Arc::new(move |metadata| {
        crate::raft::peer_gate::stamp(metadata, &gate.cluster_id(), node_id)
    });
    let service = ForwardingServer::new(Executor::new(handle.clone()), request_timeout)
        .into_service_with_limit(message_bytes_max);
    Forwarding {
        forwarder: Forwarder::new(
            Executor::new(handle),
            channel,
            ForwarderOptions {
                message_bytes_max,
                ..ForwarderOptions::default()
            },
        )
        .with_request_stamp(stamp),
        service: InterceptedService::new(service, PeerCheck(raft.gate.clone())),
    }
}

/// Calls the channel's leader-change hook on every leader change (or new term) seen in
/// Raft's metrics, and counts leader changes (`cairn_server_leader_changes_seen_total`),
/// until Raft stops.
async fn watch_leader(raft: RaftHandle, channel: Arc<LeaderChannel>) {
    let mut known = raft.leader_view();
    channel.leader_changed(&known.hint);
    while let Some(view) = raft.leader_view_changed(&known).await {
        if view.hint != known.hint {
            tracing::info!(leader = ?view.hint.leader_id, "leader changed");
        }
        if view.hint.leader_id != known.hint.leader_id && view.hint.leader_id.is_some() {
            metrics::counter!(crate::ops::LEADER_CHANGES).increment(1);
        }
        // A new term with the same leader also clears a "not the leader" redirect.
        channel.leader_changed(&view.hint);
        known = view;
    }
}
