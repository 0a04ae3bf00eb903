//! Who leads, as openraft's metrics say it ([`leads`], [`require_leader`]), and openraft's
//! answers to a proposal in Cairn's words ([`propose_entry`], [`fatal`]): the one mapping of
//! each, shared by the handle and the batchers.

use std::fmt;

use bytes::Bytes;
use cairn_fsm::Applied;
use cairn_proto::error::{ApiError, LeaderHint};
use openraft::error::{ClientWriteError, RaftError};
use openraft::ServerState;

use super::types::{LogPayload, NodeId, NodeInfo, Raft, TypeConfig};

pub(super) fn leader_hint(leader_id: Option<NodeId>, node: Option<NodeInfo>) -> LeaderHint {
    LeaderHint {
        leader_id,
        client_address: node.as_ref().map(|n| n.client_address.clone()),
        peer_address: node.map(|n| n.peer_address),
    }
}

/// The leader `leader_id` with its addresses from `membership` (none when it is not listed).
pub(super) fn leader_hint_in(
    leader_id: Option<NodeId>,
    membership: &openraft::StoredMembership<NodeId, NodeInfo>,
) -> LeaderHint {
    let node = leader_id.and_then(|id| membership.membership().get_node(&id).cloned());
    leader_hint(leader_id, node)
}

pub(super) fn fatal<E: fmt::Display>(e: E) -> ApiError {
    ApiError::Unavailable(format!("raft is shutting down: {e}"))
}

/// Proposes one entry and waits until it is committed and applied here (the
/// outcomes are those of `RaftHandle::propose`; see [`outcome_of`]).
pub(super) async fn propose_entry(raft: &Raft, payload: Bytes) -> Result<(u64, Applied), ApiError> {
    outcome_of(raft.client_write(LogPayload(payload)).await)
}

/// An entry handed to the Raft core ([`submit_entry`]), whose outcome is still to come.
pub(super) type Submitted =
    <<TypeConfig as openraft::RaftTypeConfig>::Responder as openraft::raft::responder::Responder<
        TypeConfig,
    >>::Receiver;

/// Hands one entry to the Raft core and returns at once with the receiver of its outcome
/// (openraft's `client_write_ff`): entries submitted one after another enter the log in
/// that order, whoever awaits their outcomes. `await_entry` awaits one.
pub(super) async fn submit_entry(raft: &Raft, payload: Bytes) -> Result<Submitted, ApiError> {
    raft.client_write_ff(LogPayload(payload))
        .await
        .map_err(|fatal| outcome_of(Err(RaftError::Fatal(fatal))).expect_err("an error"))
}

/// The outcome of an entry [`submit_entry`] handed to the Raft core.
pub(super) async fn await_entry(submitted: Submitted) -> Result<(u64, Applied), ApiError> {
    match submitted.await {
        Ok(result) => outcome_of(result.map_err(RaftError::APIError)),
        // The core dropped the entry's responder: it stopped.
        Err(_) => outcome_of(Err(RaftError::Fatal(openraft::error::Fatal::Stopped))),
    }
}

/// The one mapping of openraft's answers to a proposal. The caller checked
/// leadership first ([`require_leader`]: `NotLeader`, certainly not in the log,
/// so the client may redirect it); once the entry was handed to the core,
/// openraft's `ForwardToLeader` is ambiguous — it answers so both when its core
/// refuses the entry and when an entry it had appended was truncated by a new
/// leader (in clusters of five or more another node may still hold and commit
/// it) — so it is `Inconsistent`, an unknown outcome.
fn outcome_of(
    result: Result<
        openraft::raft::ClientWriteResponse<TypeConfig>,
        RaftError<NodeId, ClientWriteError<NodeId, NodeInfo>>,
    >,
) -> Result<(u64, Applied), ApiError> {
    match result {
        Ok(response) => response
            .data
            .0
            .map(|applied| (response.log_id.index, applied)),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
            Err(ApiError::Inconsistent(format!(
                "leadership was lost while the command was proposed ({}); it may still commit",
                leader_hint(f.leader_id, f.leader_node)
            )))
        }
        Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => Err(
            ApiError::Internal(format!("unexpected membership error on a data write: {e}")),
        ),
        Err(RaftError::Fatal(e)) => Err(ApiError::Inconsistent(format!(
            "raft stopped while the command was in flight; it may still commit: {e}"
        ))),
    }
}

/// Whether metrics `m` say node `node_id` leads: the one definition of leading.
pub(super) fn leads(m: &openraft::RaftMetrics<NodeId, NodeInfo>, node_id: NodeId) -> bool {
    m.current_leader == Some(node_id) && m.state == ServerState::Leader
}

/// `Ok` when this node leads; else `NotLeader` with the leader it knows. Reads
/// openraft's metrics in place (under their read lock), cloning only the
/// leader's addresses when it is another node.
pub(super) fn require_leader(raft: &Raft, node_id: NodeId) -> Result<(), ApiError> {
    let metrics = raft.metrics();
    let m = metrics.borrow();
    if leads(&m, node_id) {
        return Ok(());
    }
    Err(ApiError::NotLeader {
        hint: leader_hint_in(m.current_leader, &m.membership_config),
    })
}
