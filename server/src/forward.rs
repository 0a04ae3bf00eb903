//! The node's side of forwarding: [`NodeHandle`] implements
//! `cairn_forwarding::Handle` over [`RaftHandle`], and [`start`] builds the
//! forwarder used by the client port, the `ForwardingService` served on the
//! peer port, and the task that feeds every leader change seen in Raft's
//! metrics to the cached leader channel.
//!
//! A strong read on a follower (`follower_strong_reads = "read-index"`, and
//! every strong watch) is confirmed through the leader: the follower asks it
//! for a read index (`cairn_forwarding::LeaderReadIndex`), concurrent requests
//! sharing one call that began after each of them arrived (a second
//! [`ReadBatcher`], as the leader batches its own confirmations), then waits
//! until it has applied that index and reads its own table.
//!
//! Tasks: the leader watcher, which ends when Raft stops (its metrics channel
//! closes), and the follower read-index driver.

use std::sync::Arc;
use std::time::Duration;

use cairn_forwarding::{
    Executor, Forwarder, ForwarderOptions, ForwardingServer, Handle, LeaderChannel,
    LeaderChannelOptions, LeaderReadIndex, ReadAt,
};
use cairn_fsm::{Applied, Command, Store};
use cairn_proto::error::{ApiError, LeaderHint};
use cairn_proto::v1::forwarding_service_server::ForwardingServiceServer;
use tonic::service::interceptor::InterceptedService;

use crate::config::{Config, FollowerStrongReads, UnsafeModes};
use crate::raft::read_batch::ReadBatcher;
use crate::raft::RaftHandle;

/// The longest one follower read-index call may take: the leader's election timeout (a
/// leader that cannot confirm within it is about to lose its role), at least this.
const READ_INDEX_ROUND_MIN: Duration = Duration::from_millis(100);

/// [`Handle`] over this node's Raft.
pub struct NodeHandle {
    raft: RaftHandle,
    /// Read indexes asked of the leader when this node does not lead, shared by concurrent
    /// requests (its driver is started by [`start`]).
    follower_reads: ReadBatcher,
    /// The test-only switches that act where a command is proposed (on the leader, for
    /// a write sent to it or forwarded to it): `--unsafe-accept-stale-cas` and
    /// `--unsafe-ack-before-commit`.
    unsafe_modes: UnsafeModes,
}

impl NodeHandle {
    /// The id of the cluster this node belongs to ("" before it joined one).
    pub fn cluster_id(&self) -> String {
        self.raft.identity.cluster_id()
    }

    pub fn new(
        raft: RaftHandle,
        follower_reads: ReadBatcher,
        unsafe_modes: UnsafeModes,
    ) -> NodeHandle {
        NodeHandle {
            raft,
            follower_reads,
            unsafe_modes,
        }
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
        // DANGEROUS, test-only (`--unsafe-ignore-fences`): the fence is dropped on the
        // leader, so a deposed holder's writes apply.
        let command = match command {
            Command::Fenced { command, .. } if self.unsafe_modes.unsafe_ignore_fences => *command,
            other => other,
        };
        if self.unsafe_modes.unsafe_ack_before_commit && matches!(command, Command::Write { .. }) {
            // Only a leader acknowledges a write (early, here); a follower forwards it.
            self.raft.require_leader()?;
            return Ok(self.ack_before_commit(command));
        }
        // `RaftHandle::propose` keeps the Handle contract itself: NotLeader or
        // Unavailable only before proposing, Inconsistent after. Its future (openraft's
        // `client_write` within the batcher's within its own, about 3 KB) is boxed here,
        // so that the request's futures that await it (the executor's, the forwarder's,
        // the service's) stay small instead of each holding, and copying when it is
        // created, a state as large as all of them.
        Box::pin(self.raft.propose(command)).await
    }

    async fn confirm_read(&self, at: ReadAt) -> Result<u64, ApiError> {
        match self.raft.confirm_read().await {
            Err(ApiError::NotLeader { .. }) if at == ReadAt::AnyNode => {
                let read_index = self.follower_reads.confirm().await?;
                self.raft.wait_applied_index(read_index).await?;
                Ok(read_index)
            }
            other => other,
        }
    }

    fn leader(&self) -> LeaderHint {
        self.raft.leader()
    }

    fn serves_reads(&self) -> Result<(), ApiError> {
        crate::raft::integrity::serves_reads(&self.raft)
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

/// Builds the forwarding pieces of a node and spawns its leader watcher and follower
/// read-index driver. From `config`: `request_timeout_ms` bounds every forwarded request
/// served here, `client_message_bytes_max` every forwarded message, sent or received,
/// `follower_strong_reads` where strong reads and lists run. `tls`: dial the leader's peer
/// port over mutual TLS with it.
pub fn start(
    raft: &RaftHandle,
    config: &Config,
    tls: Option<cairn_tls::ClientTls>,
    tasks: &mut crate::tasks::Tasks,
) -> Forwarding {
    cairn_forwarding::metrics::describe();
    let message_bytes_max = config.client_message_bytes_max;
    let channel = Arc::new(
        LeaderChannel::new(
            raft.node_id,
            &config.peer_address,
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
    let follower_reads = ReadBatcher::new();
    let read_index = LeaderReadIndex::new(channel.clone(), Some(stamp.clone()));
    let round_max = Duration::from_millis(config.election_timeout_ms).max(READ_INDEX_ROUND_MIN);
    tasks.spawn(
        "follower read-index driver",
        follower_reads.clone().drive(move || {
            let read_index = read_index.clone();
            async move {
                let deadline = tokio::time::Instant::now() + round_max;
                read_index.ask(deadline).await
            }
        }),
    );
    let handle = Arc::new(NodeHandle::new(
        raft.clone(),
        follower_reads,
        config.unsafe_modes.clone(),
    ));
    let request_timeout = Duration::from_millis(config.request_timeout_ms);
    let service = ForwardingServer::new(handle.clone(), request_timeout)
        .into_service_with_limit(message_bytes_max);
    let strong_reads = match config.follower_strong_reads {
        FollowerStrongReads::ReadIndex => ReadAt::AnyNode,
        FollowerStrongReads::Forward => ReadAt::Leader,
    };
    Forwarding {
        forwarder: Forwarder::new(
            Executor::new(handle, strong_reads),
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

/// Leader changes this node has seen (a series of the ops port, counted here).
pub const LEADER_CHANGES: &str = "cairn_server_leader_changes_seen_total";

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
            metrics::counter!(LEADER_CHANGES).increment(1);
        }
        // A new term with the same leader also clears a "not the leader" redirect.
        channel.leader_changed(&view.hint);
        known = view;
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use cairn_forwarding::{Forwarder, Handle};

    use super::NodeHandle;

    /// The size of the future `f` returns (without calling it).
    fn future_bytes<'a, A: 'a, B, C, F: Future>(_: impl FnOnce(&'a A, B, C) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    fn future_bytes_1<'a, A: 'a, B, F: Future>(_: impl FnOnce(&'a A, B) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    #[test]
    fn a_write_request_future_stays_small_above_the_boxed_proposal() {
        // Each layer of a write (the service, the forwarder, the executor, this handle)
        // holds its own state and, when it starts, copies the future it awaits into it:
        // were Raft's proposal (openraft's `client_write` in the batcher's, about 3 KB)
        // not boxed below this handle, and the forwarder's two paths below it, every
        // layer would be as large again, and every write would copy each of them
        // (8.4 KB at the service, 2026-11-30). Measured with rustc 1.95: 696 bytes here,
        // 2.6 KB at the forwarder; the bounds leave room for another compiler.
        let handle = future_bytes_1(<NodeHandle as Handle>::propose);
        let raft = future_bytes_1(crate::raft::RaftHandle::propose);
        let forwarder = future_bytes(Forwarder::<NodeHandle>::write);
        assert!(
            handle < raft,
            "the handle's future ({handle} B) holds Raft's ({raft} B) boxed"
        );
        assert!(
            handle <= 1024,
            "the handle's write future is {handle} bytes"
        );
        assert!(
            forwarder <= 4096,
            "the forwarder's write future is {forwarder} bytes"
        );
    }
}
