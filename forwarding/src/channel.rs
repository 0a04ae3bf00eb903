//! [`LeaderChannel`]: one cached tonic channel to the current leader's peer
//! address, dialled lazily and shared by every forwarded call.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cairn_proto::error::LeaderHint;
use parking_lot::Mutex;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::metrics;
use cairn_request::Failure;

/// A leader to forward to: its id and peer address (never this node's).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    pub leader_id: u64,
    pub peer_address: String,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {} at {}", self.leader_id, self.peer_address)
    }
}

/// How the channel dials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderChannelOptions {
    /// Bound on opening one connection (also bounded by the call's deadline).
    pub connect_timeout: Duration,
    /// HTTP/2 keepalive pings on the cached connection, so that a leader
    /// that vanished without closing its socket is noticed.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// Largest message sent or received on the channel.
    pub message_bytes_max: usize,
}

impl Default for LeaderChannelOptions {
    fn default() -> LeaderChannelOptions {
        LeaderChannelOptions {
            connect_timeout: Duration::from_millis(500),
            keepalive_interval: Duration::from_secs(2),
            keepalive_timeout: Duration::from_secs(2),
            message_bytes_max: crate::FORWARD_MESSAGE_BYTES_MAX,
        }
    }
}

/// Where the channel points and what it holds. Guarded by a short mutex,
/// never held across an `.await`.
#[derive(Default)]
struct State {
    /// The leader as the host last reported it ([`LeaderChannel::leader_changed`]).
    observed: Option<Target>,
    /// Set by a NotLeader answer from the current target naming another
    /// leader, until the host reports the next change: go there instead.
    redirect: Option<Target>,
    /// The dialled channel and the target it was dialled for.
    cached: Option<(Target, Channel)>,
    /// Number of dials finished so far, and the last failed one (its round,
    /// target and reason): callers that queued behind a failed dial of the
    /// same target share its failure instead of dialling again.
    dial_rounds: u64,
    last_failure: Option<(u64, Target, String)>,
}

impl State {
    fn target(&self) -> Option<Target> {
        self.redirect.clone().or_else(|| self.observed.clone())
    }

    /// Drops the cached channel unless it belongs to the current target.
    fn drop_stale_channel(&mut self) {
        let target = self.target();
        if self
            .cached
            .as_ref()
            .is_some_and(|(cached, _)| Some(cached) != target.as_ref())
        {
            self.cached = None;
        }
    }
}

/// One cached channel to the leader. See the crate docs for its invariants.
pub struct LeaderChannel {
    self_id: u64,
    self_peer_address: String,
    options: LeaderChannelOptions,
    state: Mutex<State>,
    /// Held while dialling: at most one dial in flight.
    dialing: tokio::sync::Mutex<()>,
    dials: AtomicU64,
    /// Dial over TLS with this (the node's certificate, the cluster CA).
    tls: Option<cairn_tls::ClientTls>,
}

impl LeaderChannel {
    /// A channel for the node `self_id` whose own peer address is
    /// `self_peer_address`; it points nowhere until a leader is reported.
    pub fn new(
        self_id: u64,
        self_peer_address: impl Into<String>,
        options: LeaderChannelOptions,
    ) -> LeaderChannel {
        LeaderChannel {
            self_id,
            self_peer_address: self_peer_address.into(),
            options,
            state: Mutex::new(State::default()),
            dialing: tokio::sync::Mutex::new(()),
            dials: AtomicU64::new(0),
            tls: None,
        }
    }

    /// Dial the leader over TLS with `tls` (`None`: plaintext).
    pub fn with_tls(mut self, tls: Option<cairn_tls::ClientTls>) -> LeaderChannel {
        self.tls = tls;
        self
    }

    /// The target a hint names, if it is usable: a known leader id and peer
    /// address, and not this node.
    fn usable(&self, hint: &LeaderHint) -> Option<Target> {
        let leader_id = hint.leader_id?;
        let peer_address = hint.peer_address.as_deref()?;
        if leader_id == self.self_id
            || peer_address.is_empty()
            || peer_address == self.self_peer_address
        {
            return None;
        }
        Some(Target {
            leader_id,
            peer_address: peer_address.to_string(),
        })
    }

    /// The host's leader-change hook: call it on every leader change seen in
    /// Raft's metrics. Drops the cached channel if it points elsewhere (the
    /// next forwarded call dials the new leader) and forgets any redirect.
    pub fn leader_changed(&self, hint: &LeaderHint) {
        let observed = self.usable(hint);
        let mut s = self.state.lock();
        if s.observed != observed {
            tracing::debug!(from = ?s.observed, to = ?observed, "forwarding: leader changed");
        }
        s.observed = observed;
        s.redirect = None;
        s.drop_stale_channel();
    }

    /// The host's current view of the leader, seen by a caller: the same as
    /// [`LeaderChannel::leader_changed`] when it differs from the last view
    /// reported, nothing otherwise (so a redirect learnt since stays).
    pub fn observe(&self, hint: &LeaderHint) {
        let observed = self.usable(hint);
        if self.state.lock().observed != observed {
            self.leader_changed(hint);
        }
    }

    /// `answered_by` refused a forwarded call with NotLeader and `hint`. If
    /// it is still the target and the hint names another usable node (a newer
    /// hint than ours), the channel turns to that node until the host reports
    /// its next change. A hint naming nobody else leaves the target as it is:
    /// a node that has just won an election sends heartbeats before its own
    /// view says it leads, so its first answers name itself or nobody, and the
    /// host's view (which names it) will not change again. The caller's retry
    /// loop paces the next attempt. A late answer from an old target is ignored.
    pub fn not_leader(&self, answered_by: &Target, hint: &LeaderHint) {
        let mut s = self.state.lock();
        if s.target().as_ref() != Some(answered_by) {
            return;
        }
        let Some(named) = self.usable(hint).filter(|t| t != answered_by) else {
            tracing::debug!(%answered_by, "forwarding: NotLeader naming nobody else; target kept");
            return;
        };
        tracing::debug!(%answered_by, to = %named, "forwarding: redirected by a NotLeader answer");
        s.redirect = Some(named);
        s.drop_stale_channel();
    }

    /// A call to `target` failed in transport: drop its channel so that the
    /// next call dials again (the target stays until the host or an answer
    /// moves it).
    pub fn failed(&self, target: &Target) {
        let mut s = self.state.lock();
        if s.cached.as_ref().is_some_and(|(t, _)| t == target) {
            s.cached = None;
        }
    }

    /// The leader calls go to now, if one is known.
    pub fn target(&self) -> Option<Target> {
        self.state.lock().target()
    }

    /// The target of the cached channel, if one is cached.
    pub fn cached_target(&self) -> Option<Target> {
        self.state.lock().cached.as_ref().map(|(t, _)| t.clone())
    }

    /// How many dials this channel has made (successful or not).
    pub fn dial_count(&self) -> u64 {
        self.dials.load(Ordering::Relaxed)
    }

    /// The channel to the current leader, dialling it if needed. Concurrent
    /// callers share one dial. `NoLeader` when none is known; `Dial` when the
    /// connection could not be opened (nothing was sent);
    /// `DeadlineExceeded { sent: false }` when the deadline passed first.
    pub async fn get(&self, deadline: Instant) -> Result<(Target, Channel), Failure> {
        loop {
            let (target, round) = {
                let s = self.state.lock();
                let target = s.target().ok_or_else(no_leader)?;
                if let Some((cached, channel)) = &s.cached {
                    if *cached == target {
                        return Ok((target, channel.clone()));
                    }
                }
                (target, s.dial_rounds)
            };
            let waited = tokio::time::timeout_at(deadline, self.dialing.lock()).await;
            let Ok(_dialing) = waited else {
                return Err(self.deadline_error(&target));
            };
            {
                // Another caller may have dialled (or failed to) while we waited.
                let s = self.state.lock();
                let current = s.target().ok_or_else(no_leader)?;
                if current != target {
                    continue;
                }
                if let Some((cached, channel)) = &s.cached {
                    if *cached == target {
                        return Ok((target, channel.clone()));
                    }
                }
                if let Some((failed_round, failed, reason)) = &s.last_failure {
                    if *failed_round > round && *failed == target {
                        return Err(dial_failed(&target, reason));
                    }
                }
            }
            let dialled = self.dial(&target, deadline).await;
            let mut s = self.state.lock();
            s.dial_rounds += 1;
            match dialled {
                Ok(channel) => {
                    s.last_failure = None;
                    if s.target().as_ref() == Some(&target) {
                        s.cached = Some((target.clone(), channel.clone()));
                        return Ok((target, channel));
                    }
                    // The leader changed while we dialled: this channel is
                    // for a node that no longer leads; resolve again.
                }
                Err(reason) => {
                    let round = s.dial_rounds;
                    s.last_failure = Some((round, target.clone(), reason.clone()));
                    if Instant::now() >= deadline {
                        return Err(self.deadline_error(&target));
                    }
                    return Err(dial_failed(&target, &reason));
                }
            }
        }
    }

    fn deadline_error(&self, target: &Target) -> Failure {
        Failure::NotSent(format!("the deadline passed connecting to leader {target}"))
    }

    /// Opens one connection to `target` (bounded by the connect timeout and
    /// the deadline). Counted, successful or not.
    async fn dial(&self, target: &Target, deadline: Instant) -> Result<Channel, String> {
        assert_ne!(
            target.leader_id, self.self_id,
            "the leader channel never dials itself"
        );
        assert_ne!(
            target.peer_address, self.self_peer_address,
            "the leader channel never dials its own peer address"
        );
        self.dials.fetch_add(1, Ordering::Relaxed);
        let endpoint = match Endpoint::from_shared(format!("http://{}", target.peer_address)) {
            Ok(e) => e,
            Err(e) => {
                metrics::record_dial(false);
                return Err(format!("bad peer address: {e}"));
            }
        };
        let endpoint = endpoint
            .http2_keep_alive_interval(self.options.keepalive_interval)
            .keep_alive_timeout(self.options.keepalive_timeout)
            .keep_alive_while_idle(true);
        let bound = deadline.min(Instant::now() + self.options.connect_timeout);
        let connecting =
            cairn_tls::connect_channel(endpoint, self.tls.as_ref(), self.options.connect_timeout);
        let result = match tokio::time::timeout_at(bound, connecting).await {
            Ok(Ok(channel)) => Ok(channel),
            Ok(Err(e)) => Err(cairn_request::decide::error_chain(&e)),
            Err(_) => Err(format!(
                "connect timed out after {} ms",
                self.options.connect_timeout.as_millis()
            )),
        };
        metrics::record_dial(result.is_ok());
        tracing::debug!(%target, ok = result.is_ok(), "forwarding: dialled the leader");
        result
    }
}

fn no_leader() -> Failure {
    Failure::NotSent("no leader is known".into())
}

fn dial_failed(target: &Target, reason: &str) -> Failure {
    Failure::NotSent(format!("cannot connect to leader {target}: {reason}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint(id: u64, peer: &str) -> LeaderHint {
        LeaderHint {
            leader_id: Some(id),
            client_address: None,
            peer_address: Some(peer.into()),
        }
    }

    #[test]
    fn a_hint_naming_this_node_means_no_leader() {
        // Neither this node's id nor its peer address is ever a target.
        let c = LeaderChannel::new(1, "127.0.0.1:8001", LeaderChannelOptions::default());
        c.leader_changed(&hint(1, "127.0.0.1:8001"));
        assert_eq!(c.target(), None);
        c.leader_changed(&hint(3, "127.0.0.1:8001"));
        assert_eq!(c.target(), None);
        c.leader_changed(&LeaderHint::default());
        assert_eq!(c.target(), None);
        c.leader_changed(&hint(2, "127.0.0.1:8002"));
        assert_eq!(
            c.target(),
            Some(Target {
                leader_id: 2,
                peer_address: "127.0.0.1:8002".into()
            })
        );
    }

    #[test]
    fn not_leader_redirects_until_the_host_reports_a_change() {
        // A NotLeader answer from the target moves it; stale answers and the
        // host's unchanged view do not; the host's next change wins.
        let c = LeaderChannel::new(1, "127.0.0.1:8001", LeaderChannelOptions::default());
        c.leader_changed(&hint(2, "127.0.0.1:8002"));
        let two = c.target().unwrap();
        c.not_leader(&two, &hint(3, "127.0.0.1:8003"));
        let three = c.target().unwrap();
        assert_eq!(three.leader_id, 3);
        // A late answer from 2 (no longer the target) changes nothing.
        c.not_leader(&two, &LeaderHint::default());
        assert_eq!(c.target(), Some(three.clone()));
        // The host still sees 2: observing the same view keeps the redirect.
        c.observe(&hint(2, "127.0.0.1:8002"));
        assert_eq!(c.target(), Some(three.clone()));
        // 3 refuses naming itself, or nobody (it has just been elected and its
        // own view does not say so yet): it stays the target.
        c.not_leader(&three, &hint(3, "127.0.0.1:8003"));
        assert_eq!(c.target(), Some(three.clone()));
        c.not_leader(&three, &LeaderHint::default());
        assert_eq!(c.target(), Some(three));
        // The host's next change wins over the redirect.
        c.leader_changed(&hint(4, "127.0.0.1:8004"));
        assert_eq!(c.target().unwrap().leader_id, 4);
    }

    #[tokio::test]
    async fn an_unreachable_leader_is_a_dial_error_and_counted() {
        // Dialling a closed port fails with Dial (nothing sent), counted once per attempt.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let c = LeaderChannel::new(1, "127.0.0.1:1", LeaderChannelOptions::default());
        c.leader_changed(&hint(2, &format!("127.0.0.1:{port}")));
        let deadline = Instant::now() + Duration::from_secs(2);
        match c.get(deadline).await {
            Err(Failure::NotSent(reason)) => assert!(reason.contains("node 2"), "{reason}"),
            other => panic!("expected a dial error, got {other:?}"),
        }
        assert_eq!(c.dial_count(), 1);
        assert_eq!(c.cached_target(), None);
        c.leader_changed(&LeaderHint::default());
        assert!(matches!(c.get(deadline).await, Err(Failure::NotSent(_))));
        assert_eq!(c.dial_count(), 1);
    }
}
