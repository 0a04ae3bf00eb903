//! When this node last heard from its peers: on a leader, per member, the last reply to any
//! Raft message it sent (a heartbeat included); on any node, the last message it accepted
//! from the leader of its term. `cairn status` shows both ("last contact"), and the
//! membership checks count a voter as reachable when the leader heard from it within an
//! election timeout.
//!
//! Written by the peer client (replies) and the peer server (the leader's messages); read by
//! [`super::RaftHandle::status`]. One short mutex, never held across an await.
//!
//! Also whether a peer is failing: the calls to a peer that failed since it last answered
//! make one streak, and [`Contacts::failed`] / [`Contacts::replied`] say when the streak is
//! news for the log: once when it has lasted [`PEER_LOST_AFTER`] (a peer still starting is
//! not news), and once when the peer answers again after that. openraft's own line per failed
//! call is left out of the log at the default levels (`crate::logging`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cairn_fsm::ClusterVersion;

use super::types::NodeId;

/// How long a peer's calls must have failed before the log says so.
pub const PEER_LOST_AFTER: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
pub struct Contacts {
    /// Per peer: when it last answered a Raft message of this node, and its failing streak.
    peers: Mutex<HashMap<NodeId, Peer>>,
    /// When this node last accepted a message of the leader of its term.
    leader: Mutex<Option<Instant>>,
    /// This node's configured `data_bytes_max`, which its every Raft message and reply
    /// reports (the leader sets the cluster's space quota to the lowest reported).
    own_data_bytes_max: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct Peer {
    last_reply: Option<Instant>,
    /// When the calls that failed since the last reply began failing (`None`: none did).
    failing_since: Option<Instant>,
    /// Whether that streak was reported ([`PeerNews::Lost`]).
    reported: bool,
    /// The highest cluster version its build supports, as its last reply said.
    supported: Option<ClusterVersion>,
    /// Its configured `data_bytes_max`, as its last reply said (0: none reported).
    data_bytes_max: u64,
}

/// What the log should say after a call to a peer (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerNews {
    Nothing,
    /// Its calls have failed for `failing` (and this was not said before in the streak).
    Lost {
        failing: Duration,
    },
    /// It answers again, after `failing` of failed calls that were reported.
    Back {
        failing: Duration,
    },
}

impl Contacts {
    /// `peer` answered a message of this node just now.
    pub fn replied(&self, peer: NodeId) -> PeerNews {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let entry = peers.entry(peer).or_default();
        let now = Instant::now();
        entry.last_reply = Some(now);
        let news = match entry.failing_since.take() {
            Some(since) if entry.reported => PeerNews::Back {
                failing: now.saturating_duration_since(since),
            },
            _ => PeerNews::Nothing,
        };
        entry.reported = false;
        news
    }

    /// A call to `peer` failed just now (it could not be reached, or it refused the call).
    pub fn failed(&self, peer: NodeId) -> PeerNews {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let entry = peers.entry(peer).or_default();
        let now = Instant::now();
        let since = *entry.failing_since.get_or_insert(now);
        let failing = now.saturating_duration_since(since);
        if !entry.reported && failing >= PEER_LOST_AFTER {
            entry.reported = true;
            PeerNews::Lost { failing }
        } else {
            PeerNews::Nothing
        }
    }

    /// `peer`'s reply said that its build supports cluster versions up to `version`, and
    /// that its `data_bytes_max` is `data_bytes_max` (0: it says nothing).
    pub fn reported_support(&self, peer: NodeId, version: ClusterVersion, data_bytes_max: u64) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let entry = peers.entry(peer).or_default();
        entry.supported = Some(version);
        entry.data_bytes_max = data_bytes_max;
    }

    /// The `data_bytes_max` `peer` reported, if it answered within `within` (0: it
    /// reported none).
    pub fn data_bytes_max_recently(&self, peer: NodeId, within: Duration) -> Option<u64> {
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let entry = peers.get(&peer)?;
        let recent = entry.last_reply.is_some_and(|t| t.elapsed() <= within);
        recent.then_some(entry.data_bytes_max)
    }

    /// Sets what this node reports as its `data_bytes_max`.
    pub fn set_own_data_bytes_max(&self, bytes: u64) {
        self.own_data_bytes_max
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// What this node reports as its `data_bytes_max`.
    pub fn own_data_bytes_max(&self) -> u64 {
        self.own_data_bytes_max
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The highest cluster version `peer` supports, if it answered within `within`.
    pub fn supported_recently(&self, peer: NodeId, within: Duration) -> Option<ClusterVersion> {
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let entry = peers.get(&peer)?;
        let recent = entry.last_reply.is_some_and(|t| t.elapsed() <= within);
        recent.then_some(entry.supported).flatten()
    }

    /// This node accepted a message of its leader just now.
    pub fn heard_from_leader(&self) {
        *self.leader.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// How long ago `peer` last answered this node (`None`: never).
    pub fn since_reply(&self, peer: NodeId) -> Option<Duration> {
        self.peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&peer)
            .and_then(|p| p.last_reply)
            .map(|t| t.elapsed())
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

    /// Moves peer `peer`'s failing streak `by` into the past.
    fn age_streak(c: &Contacts, peer: NodeId, by: Duration) {
        let mut peers = c.peers.lock().unwrap();
        let since = peers
            .get_mut(&peer)
            .unwrap()
            .failing_since
            .as_mut()
            .unwrap();
        *since -= by;
    }

    #[test]
    fn a_failing_peer_is_news_once_after_a_while_and_once_when_it_answers_again() {
        let c = Contacts::default();
        // A peer still starting: failures, then an answer, and nothing to say.
        assert_eq!(c.failed(2), PeerNews::Nothing);
        assert_eq!(c.failed(2), PeerNews::Nothing);
        assert_eq!(c.replied(2), PeerNews::Nothing);

        // A peer down for longer than PEER_LOST_AFTER: said once.
        assert_eq!(c.failed(2), PeerNews::Nothing);
        age_streak(&c, 2, PEER_LOST_AFTER);
        assert!(matches!(c.failed(2), PeerNews::Lost { failing } if failing >= PEER_LOST_AFTER));
        assert_eq!(c.failed(2), PeerNews::Nothing, "said once per streak");
        assert_eq!(c.failed(3), PeerNews::Nothing, "streaks are per peer");

        // Its return is said once, and a new streak starts from nothing.
        assert!(matches!(c.replied(2), PeerNews::Back { failing } if failing >= PEER_LOST_AFTER));
        assert_eq!(c.replied(2), PeerNews::Nothing);
        assert_eq!(c.failed(2), PeerNews::Nothing);
    }
}
