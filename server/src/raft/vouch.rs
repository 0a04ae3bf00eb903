//! Vouching for a stranger on a plaintext peer port.
//!
//! A node that was away (partitioned, paused, stopped) while another node joined may
//! hear that node as its leader, or as a candidate ahead of it, before its own log names
//! it. Over TLS the cluster's CA vouches for the stranger's node id; on a plaintext peer
//! port a node id could be made up, so the peer gate refuses the stranger
//! ([`Refusal::Unvouched`](super::peer_gate::Refusal)) and this module asks the members
//! this node knows, over their peer ports, for their membership. When one of them names
//! the stranger, the gate hears it from then on ([`PeerGate::vouched`]); the stranger
//! retries its message, and openraft's own checks (vote, lease, log) decide the rest.
//!
//! Invariants: rounds of questions start at most once per [`ROUND_INTERVAL`], whatever
//! strangers send, and each asks each member once, for at most [`ASK_TIMEOUT`]; only a
//! member of this node's current membership is asked, never the stranger itself.

use std::sync::Arc;
use std::time::Duration;

use crate::rate_limit::RateLimit;

use super::network::Network;
use super::peer_gate::PeerGate;
use super::types::{NodeId, Raft};

/// The shortest time between two rounds of questions.
pub const ROUND_INTERVAL: Duration = Duration::from_secs(1);
/// How long one member is given to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(1);

pub struct Vouching {
    network: Network,
    raft: Raft,
    gate: Arc<PeerGate>,
    node_id: NodeId,
    /// At most one round per [`ROUND_INTERVAL`].
    rounds: RateLimit,
}

impl Vouching {
    pub fn new(network: Network, raft: Raft, gate: Arc<PeerGate>, node_id: NodeId) -> Vouching {
        Vouching {
            network,
            raft,
            gate,
            node_id,
            rounds: RateLimit::new(1, ROUND_INTERVAL),
        }
    }

    /// Asks the members this node knows whether `stranger` is one of theirs, unless a round
    /// started less than [`ROUND_INTERVAL`] ago. Returns at once; the round runs in a task
    /// of its own, bounded by [`ASK_TIMEOUT`] per member.
    pub fn ask_about(self: &Arc<Self>, stranger: NodeId) {
        if self.rounds.take().is_none() {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move { this.round(stranger).await });
    }

    async fn round(&self, stranger: NodeId) {
        let members: Vec<(NodeId, String)> = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            m.membership_config
                .membership()
                .nodes()
                .filter(|(id, _)| **id != self.node_id && **id != stranger)
                .map(|(id, info)| (*id, info.peer_address.clone()))
                .collect()
        };
        assert!(
            members.iter().all(|(id, _)| *id != stranger),
            "the stranger never vouches for itself"
        );
        for (member, address) in members {
            match self.network.members_of(&address, ASK_TIMEOUT).await {
                Ok(theirs) if theirs.contains(&stranger) => {
                    tracing::info!(
                        stranger,
                        vouched_by = member,
                        "a member vouches for a node this node's membership does not name \
                         yet; hearing it"
                    );
                    self.gate.vouched(stranger);
                    return;
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(stranger, member, %error, "could not ask a member")
                }
            }
        }
        tracing::info!(
            stranger,
            "a node outside this node's membership sends as a leader or a candidate ahead \
             of it, and no member this node could reach names it: still refused"
        );
    }
}
