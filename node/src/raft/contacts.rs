//! When this node last heard from its peers: on a leader, per member, the last reply to any
//! Raft message it sent (a heartbeat included); on any node, the last message it accepted
//! from the leader of its term. `cairn status` shows both ("last contact"), and the
//! membership checks count a voter as reachable when the leader heard from it within an
//! election timeout.
//!
//! Written by the peer client (replies) and the peer server (the leader's messages); read by
//! [`super::RaftHandle::status`]. One short mutex, never held across an await.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::NodeId;

#[derive(Debug, Default)]
pub struct Contacts {
    /// Per peer, when it last answered a Raft message of this node.
    replies: Mutex<HashMap<NodeId, Instant>>,
    /// When this node last accepted a message of the leader of its term.
    leader: Mutex<Option<Instant>>,
}

impl Contacts {
    /// `peer` answered a message of this node just now.
    pub fn replied(&self, peer: NodeId) {
        self.replies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(peer, Instant::now());
    }

    /// This node accepted a message of its leader just now.
    pub fn heard_from_leader(&self) {
        *self.leader.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// How long ago `peer` last answered this node (`None`: never).
    pub fn since_reply(&self, peer: NodeId) -> Option<Duration> {
        self.replies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&peer)
            .map(Instant::elapsed)
    }

    /// How long ago this node last heard from a leader (`None`: never since it started).
    pub fn since_leader(&self) -> Option<Duration> {
        self.leader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map(|t| t.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contacts_start_unknown_and_age_from_the_last_one() {
        // Nothing heard: None; after a reply or a leader's message, a small age.
        let c = Contacts::default();
        assert_eq!(c.since_reply(2), None);
        assert_eq!(c.since_leader(), None);
        c.replied(2);
        c.heard_from_leader();
        assert!(c.since_reply(2).unwrap() < Duration::from_secs(1));
        assert_eq!(c.since_reply(3), None);
        assert!(c.since_leader().unwrap() < Duration::from_secs(1));
    }
}
