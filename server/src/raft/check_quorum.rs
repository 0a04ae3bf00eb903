//! Check-quorum: a leader that has not heard from a quorum of voters for an election
//! timeout steps down, so that a node that can reach a quorum (and whose log is up to date)
//! can win an election.
//!
//! openraft 0.9 never does this on its own: a leader cut off from its followers stays leader
//! for ever, and refuses the votes of a follower with a shorter log without giving up its
//! term, so a cluster whose one caught-up node is that leader cannot elect anyone. Nor can a
//! leader start an election (`trigger().elect()` is ignored on a leader).
//!
//! **How it steps down.** Every heartbeat interval the task reads this node's metrics. A
//! leader of a cluster with more than one voter whose last quorum acknowledgement
//! (`millis_since_quorum_ack`; while there has been none, the time since it was first seen
//! leading this term) is older than the election timeout grants its own vote for the next
//! term to another voter (the one it matched furthest: [`best_successor`]), through
//! openraft's vote handling (`Raft::vote`). A vote for another node makes openraft's engine
//! leave leadership and follow; after its election timeout it campaigns itself, one term
//! later. Granting a vote nobody asked for is safe: it is one vote in one term, given with
//! this node's own last log id, so the log check every vote makes still holds; that voter can
//! only win the term with a quorum of votes of its own asking.
//!
//! **Invariants.** Only a leader steps down, only after an election timeout without a quorum,
//! and never the sole voter of a cluster (it is its own quorum). The task ends when the core
//! stops.

use std::time::Duration;

use openraft::raft::VoteRequest;
use openraft::{CommittedLeaderId, LogId, RaftMetrics, Vote};

use super::leadership::leads;
use super::types::{NodeId, NodeInfo, Raft};

/// The voter a leader hands leadership to, by this node's metrics: of the voters other than
/// `me`, the one matched furthest (the likeliest to win next; one not matched yet comes after
/// every matched one), the lowest id among equals. `None` when there is no other voter.
/// The one rule for stepping down here and for `cairn transfer-leader` without a
/// target ([`super::RaftHandle::best_successor`]).
pub(super) fn best_successor(m: &RaftMetrics<NodeId, NodeInfo>, me: NodeId) -> Option<NodeId> {
    let matched = |id: NodeId| {
        m.replication
            .as_ref()
            .and_then(|r| r.get(&id).cloned().flatten())
            .map(|l| l.index)
    };
    best_of(m.membership_config.membership().voter_ids(), me, matched)
}

fn best_of(
    voters: impl Iterator<Item = NodeId>,
    me: NodeId,
    matched: impl Fn(NodeId) -> Option<u64>,
) -> Option<NodeId> {
    voters
        .filter(|id| *id != me)
        .max_by_key(|id| (matched(*id), std::cmp::Reverse(*id)))
}

/// Watches this node's metrics and makes it step down as described in the module docs.
pub(super) async fn run(raft: Raft, node_id: NodeId, election_timeout: Duration, tick: Duration) {
    let mut metrics = raft.metrics();
    // The term in which this node was first seen leading, and when.
    let mut leading_since: Option<(u64, tokio::time::Instant)> = None;
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let request = {
            let m = metrics.borrow_and_update();
            if m.running_state.is_err() {
                return;
            }
            if !leads(&m, node_id) {
                leading_since = None;
                continue;
            }
            let now = tokio::time::Instant::now();
            let since = match leading_since {
                Some((term, since)) if term == m.current_term => since,
                _ => {
                    leading_since = Some((m.current_term, now));
                    now
                }
            };
            let Some(successor) = best_successor(&m, node_id) else {
                continue;
            };
            let quiet = match m.millis_since_quorum_ack {
                Some(ms) => Duration::from_millis(ms),
                None => now - since,
            };
            if quiet <= election_timeout {
                continue;
            }
            // Every entry a leader holds beyond what it was elected with carries its own
            // term: its last log id is at most (current term, this node, last index).
            let last_log_id = m
                .last_log_index
                .map(|index| LogId::new(CommittedLeaderId::new(m.current_term, node_id), index));
            tracing::warn!(
                term = m.current_term,
                quiet_ms = quiet.as_millis() as u64,
                successor,
                "this leader has not heard from a quorum of voters for more than an election \
                 timeout: stepping down so that a node that can reach a quorum can be elected"
            );
            VoteRequest::new(Vote::new(m.current_term + 1, successor), last_log_id)
        };
        match raft.vote(request).await {
            Ok(response) if response.vote_granted => {
                leading_since = None;
            }
            Ok(response) => {
                tracing::debug!(?response, "stepping down was refused; trying again");
            }
            Err(e) => {
                tracing::debug!(error = %e, "stepping down failed");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::best_of;

    #[test]
    fn the_successor_is_the_voter_matched_furthest_then_the_lowest_id() {
        let matched = |pairs: &'static [(u64, u64)]| {
            move |id| pairs.iter().find(|(i, _)| *i == id).map(|(_, m)| *m)
        };
        let voters = || [1, 2, 3, 4].into_iter();
        assert_eq!(
            best_of(voters(), 1, matched(&[(2, 5), (3, 9), (4, 9)])),
            Some(3)
        );
        // One not matched yet comes after one matched at 0.
        assert_eq!(best_of(voters(), 1, matched(&[(3, 0)])), Some(3));
        assert_eq!(best_of(voters(), 1, matched(&[])), Some(2));
        assert_eq!(best_of([1].into_iter(), 1, matched(&[])), None);
    }
}
