//! Leases (`docs/contract.md`, "Leases"): a time-to-live that a client keeps alive, and
//! the resources attached to it (`Resource.lease`), which the cluster deletes through the
//! log when the lease expires or is revoked.
//!
//! - [`Client::grant_lease`] grants one and returns a [`Lease`] handle that keeps it alive
//!   by itself: one background task per handle, holding one `KeepAlive` stream to one
//!   node, sending a keep-alive every third of the TTL ([`KeepAlivePacing`]) and moving to
//!   the next node (following the client's endpoints) when a stream breaks or an answer
//!   is late. [`Client::resume_lease`] takes over an existing lease the same way (one a
//!   `cairn lease grant` made, say).
//! - [`Lease::lost`] resolves when the lease is lost, [`Lease::state`] follows every
//!   renewal; [`Lease::revoke`] revokes it; dropping the handle stops the keep-alives and
//!   revokes it (best effort, on a spawned task); [`Lease::detach`] stops the keep-alives
//!   and leaves it to expire (or to another keeper).
//! - The one-shot calls: [`Client::keep_alive_once`], [`Client::revoke_lease`],
//!   [`Client::lease_time_to_live`], [`Client::leases`].
//!
//! ## When a holder must assume its lease gone (safety first)
//!
//! The cluster's leader decides expiry on its own clock: a lease expires a TTL after the
//! leader saw its last renewal, which is never before the keep-alive carrying it was
//! *sent*. So a holder is certain to hold its lease only until **the send time of the
//! last acknowledged keep-alive (or of the grant) plus the TTL**, and not a moment
//! longer: an acknowledgement that comes late does not extend that, and one that comes
//! after it passed does not bring the lease back ([`lease_state_after`], tested as a
//! table). [`Lease::lost`] then resolves with [`LeaseLoss::Unconfirmed`], even though the
//! cluster may still hold the lease for a while (the keep-alive may have applied, and the
//! leader's TTL starts later): what the holder guards with the lease (a lock, a
//! leadership) must be given up at that moment. The rule assumes the holder's clock and
//! the leader's run at about the same rate (a monotonic clock; no synchronised time
//! needed). A holder that must not rely even on that fences its writes
//! ([`crate::Leadership::fence`]): the cluster then refuses them at apply once another
//! holder won.
//!
//! ## Transport
//!
//! The lease calls go to the client's endpoints with its TLS settings and token and its
//! deadlines, through the shared retry loop (`cairn_request::run`): a grant or revoke is
//! sent again only after an attempt that certainly did not apply, as every write;
//! time-to-live and list are reads. Any node serves them (a follower forwards grants,
//! revokes and keep-alives to the leader).
//!
//! ## Invariants
//! - A [`LeaseState`] never goes from lost back to held, and a held lease's deadline
//!   never moves back.
//! - A held lease's deadline is never later than the send time of an acknowledged
//!   keep-alive (or of the grant) plus the TTL the cluster answered.
//! - One keep-alive is outstanding at a time on a handle's stream; answers are matched
//!   to sends in order.
//! - A handle's task ends once the lease is lost, revoked, detached or dropped; the
//!   handle never revokes a lease it detached.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use cairn_proto::v1::lease_service_client::LeaseServiceClient;
use cairn_proto::v1::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseListRequest,
    LeaseListResponse, LeaseRevokeRequest, LeaseTimeToLiveRequest,
};
use cairn_request::{Failure, Operation};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::auth::AuthenticatedChannel;
use crate::error::{ClientError, Outcome};
use crate::Client;

/// The lease service of one node, as the client calls it.
type LeaseRpc = LeaseServiceClient<AuthenticatedChannel>;

// ------------------------------------------------------------ the rule ----

/// What a holder knows of its lease ([`Lease::state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// Certainly held until `until` (and perhaps longer: see the module docs).
    Held { until: Instant },
    /// Lost, for good: the handle never holds it again.
    Lost(LeaseLoss),
}

impl LeaseState {
    /// Held until a TTL after `sent_at`, the send time of the grant or keep-alive the
    /// cluster acknowledged.
    pub fn held_from(sent_at: Instant, ttl: Duration) -> LeaseState {
        LeaseState::Held {
            until: sent_at + ttl,
        }
    }

    /// The deadline while held; `None` once lost.
    pub fn held_until(&self) -> Option<Instant> {
        match self {
            LeaseState::Held { until } => Some(*until),
            LeaseState::Lost(_) => None,
        }
    }

    /// Why it was lost; `None` while held.
    pub fn loss(&self) -> Option<&LeaseLoss> {
        match self {
            LeaseState::Held { .. } => None,
            LeaseState::Lost(loss) => Some(loss),
        }
    }
}

/// Why a lease is lost ([`Lease::lost`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseLoss {
    /// A keep-alive was answered with TTL 0: the cluster expired or revoked the lease
    /// (and deleted what was attached to it). It never comes back.
    #[error("the cluster expired or revoked it (a lease never comes back)")]
    Gone,
    /// No keep-alive was acknowledged within the TTL of the send time of the last
    /// acknowledged one (or of the grant): the cluster may have expired it since.
    #[error(
        "no keep-alive was acknowledged within its TTL of {ttl_ms} ms of the last \
         acknowledged one's sending: it may have expired"
    )]
    Unconfirmed { ttl_ms: u64 },
    /// This handle revoked it ([`Lease::revoke`]), or was dropped.
    #[error("it was revoked by its holder")]
    Revoked,
    /// This handle stopped keeping it alive ([`Lease::detach`]).
    #[error("its holder stopped keeping it alive")]
    Detached,
}

/// A keep-alive's answer, with when the keep-alive was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepAliveAnswer {
    /// When the request was handed to the stream (no later than the cluster saw it).
    pub sent_at: Instant,
    /// The lease's TTL from `sent_at`; 0 = no such lease (expired or revoked).
    pub ttl_ms: u64,
}

/// The state after `answer` (or after none, when only time passed) at `now`: the one
/// rule of when a holder holds its lease (see the module docs).
///
/// | state | `now` past its deadline | answer | next state |
/// |-------|-------------------------|--------|------------|
/// | lost | any | any | the same loss |
/// | held | yes | any | lost: unconfirmed (a late answer saves nothing) |
/// | held | no | none | the same |
/// | held | no | TTL 0 | lost: gone |
/// | held | no | TTL t, sent at s | held until the later of the deadline and s + t |
pub fn lease_state_after(
    state: &LeaseState,
    answer: Option<KeepAliveAnswer>,
    ttl: Duration,
    now: Instant,
) -> LeaseState {
    let until = match state {
        LeaseState::Lost(_) => return state.clone(),
        LeaseState::Held { until } => *until,
    };
    if now >= until {
        return LeaseState::Lost(LeaseLoss::Unconfirmed {
            ttl_ms: duration_ms(ttl),
        });
    }
    match answer {
        None => state.clone(),
        Some(KeepAliveAnswer { ttl_ms: 0, .. }) => LeaseState::Lost(LeaseLoss::Gone),
        Some(KeepAliveAnswer { sent_at, ttl_ms }) => LeaseState::Held {
            until: until.max(sent_at + Duration::from_millis(ttl_ms)),
        },
    }
}

/// The timing of a [`Lease`]'s keep-alives, from its TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepAlivePacing {
    /// Between the sending of two keep-alives on a healthy stream: a third of the TTL,
    /// so that two may fail before the lease is lost.
    pub interval: Duration,
    /// How long an answer may take before the stream is given up for another node.
    pub answer_wait: Duration,
    /// The pause after a node could not be reached, before the next one.
    pub retry_pause: Duration,
}

impl KeepAlivePacing {
    pub fn for_ttl(ttl: Duration) -> KeepAlivePacing {
        let third = (ttl / 3).max(Duration::from_millis(1));
        KeepAlivePacing {
            interval: third,
            answer_wait: third,
            retry_pause: (ttl / 20).clamp(Duration::from_millis(10), Duration::from_millis(250)),
        }
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The error of a lease that is lost, for callers that speak [`ClientError`]: the
/// cluster's own word for a lease that does not exist (FailedPrecondition).
pub fn lease_lost_error(id: u64, loss: &LeaseLoss) -> ClientError {
    ClientError::FailedPrecondition(format!("lease {id} lost: {loss}"))
}

// ---------------------------------------------------------- the handle ----

/// A granted lease, kept alive by a background task until it is lost, revoked, detached
/// or dropped. See the module docs, and when a holder must assume it lost.
pub struct Lease {
    id: u64,
    ttl: Duration,
    nodes: LeaseNodes,
    state: Arc<watch::Sender<LeaseState>>,
    keeper: tokio::task::AbortHandle,
    /// Revoked or detached: nothing left to do on drop.
    ended: bool,
}

impl Lease {
    /// Starts keeping alive the lease `id`, held as `state` says.
    fn start(nodes: LeaseNodes, id: u64, ttl: Duration, state: LeaseState) -> Lease {
        assert!(id != 0, "a lease id is never 0");
        let state = Arc::new(watch::Sender::new(state));
        let keeper = tokio::spawn(keep_alive(nodes.clone(), id, ttl, state.clone()));
        Lease {
            id,
            ttl,
            nodes,
            state,
            keeper: keeper.abort_handle(),
            ended: false,
        }
    }

    /// The lease's id: what a resource names in its `lease` field.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The TTL the cluster granted.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Until when the lease is certainly held (`None` once lost): the send time of the
    /// last acknowledged keep-alive plus the TTL.
    pub fn held_until(&self) -> Option<Instant> {
        self.state.borrow().held_until()
    }

    /// Why the lease was lost, if it was.
    pub fn loss(&self) -> Option<LeaseLoss> {
        self.state.borrow().loss().cloned()
    }

    /// The state, changed at every renewal and at the loss.
    pub fn state(&self) -> watch::Receiver<LeaseState> {
        self.state.subscribe()
    }

    /// Resolves when the lease is lost (at once if it already is), with why. Owns what
    /// it needs: it may outlive the handle, and resolves when the handle is dropped.
    pub fn lost(&self) -> impl Future<Output = LeaseLoss> + Send + 'static {
        lost_of(self.state.subscribe())
    }

    /// Revokes the lease: the cluster deletes every resource attached to it. Stops the
    /// keep-alives first. Returns how many attached resources were deleted (0 also when
    /// the lease was already gone). On an error the lease is left to expire.
    pub async fn revoke(mut self) -> Result<u64, ClientError> {
        self.end(LeaseLoss::Revoked);
        let revoked = revoke(&self.nodes, self.id).await?;
        Ok(revoked.map_or(0, |r| r.deleted_count))
    }

    /// Stops keeping the lease alive without revoking it: it expires a TTL after its
    /// last renewal, unless someone else keeps it alive ([`Client::resume_lease`]).
    /// Returns its id.
    pub fn detach(mut self) -> u64 {
        self.end(LeaseLoss::Detached);
        self.id
    }

    fn end(&mut self, loss: LeaseLoss) {
        self.ended = true;
        self.keeper.abort();
        self.state.send_if_modified(|s| {
            if matches!(s, LeaseState::Held { .. }) {
                *s = LeaseState::Lost(loss);
                true
            } else {
                false
            }
        });
    }
}

impl Drop for Lease {
    /// Stops the keep-alives and revokes the lease on a spawned task (best effort: not
    /// without a Tokio runtime, and not if the runtime stops first; the lease then
    /// expires a TTL after its last renewal).
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        self.end(LeaseLoss::Revoked);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (nodes, id) = (self.nodes.clone(), self.id);
            runtime.spawn(async move {
                if let Err(e) = revoke(&nodes, id).await {
                    tracing::debug!(lease = id, error = %e, "revoke on drop failed; the lease will expire");
                }
            });
        }
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("id", &self.id)
            .field("ttl", &self.ttl)
            .field("state", &*self.state.borrow())
            .finish()
    }
}

/// Resolves when `state` is lost, or when its sender is gone (the handle dropped).
pub(crate) async fn lost_of(mut state: watch::Receiver<LeaseState>) -> LeaseLoss {
    let lost = state
        .wait_for(|s| matches!(s, LeaseState::Lost(_)))
        .await
        .ok()
        .and_then(|s| s.loss().cloned());
    lost.unwrap_or(LeaseLoss::Revoked)
}

// ---------------------------------------------------------- the calls ----

/// What [`Client::revoke_lease`] answers for a lease that existed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRevoked {
    /// The revision at which the lease and its resources went.
    pub revision: u64,
    /// How many attached resources were deleted with it.
    pub deleted_count: u64,
}

impl Client {
    /// Grants a lease of `ttl` (between the nodes' `lease_ttl_min_ms` and
    /// `lease_ttl_max_ms`) and keeps it alive until the returned handle is revoked,
    /// detached or dropped, or the lease is lost. Needs cluster version 0.2
    /// (FailedPrecondition before).
    pub async fn grant_lease(&self, ttl: Duration) -> Result<Lease, ClientError> {
        let ttl_ms = duration_ms(ttl);
        if ttl_ms == 0 {
            return Err(ClientError::invalid("ttl", "must be at least 1 ms"));
        }
        let nodes = LeaseNodes::of(self)?;
        // The TTL runs from no earlier than the first attempt's sending.
        let sent_at = Instant::now();
        let granted = nodes
            .call(Operation::Mutation, move |mut rpc, remaining| {
                let mut r = tonic::Request::new(LeaseGrantRequest { ttl_ms });
                r.set_timeout(remaining);
                async move { rpc.grant(r).await }
            })
            .await?;
        if granted.id == 0 || granted.ttl_ms == 0 {
            return Err(ClientError::Internal {
                message: format!(
                    "a grant answered lease {} with TTL {} ms",
                    granted.id, granted.ttl_ms
                ),
                outcome: Outcome::Unknown,
            });
        }
        let ttl = Duration::from_millis(granted.ttl_ms);
        let state = LeaseState::held_from(sent_at, ttl);
        Ok(Lease::start(nodes, granted.id, ttl, state))
    }

    /// Takes over keeping alive the existing lease `id` (granted by another process,
    /// `cairn lease grant` say): one keep-alive now, then as [`Client::grant_lease`]'s
    /// handle. `None` when there is no such lease (it expired or was revoked).
    pub async fn resume_lease(&self, id: u64) -> Result<Option<Lease>, ClientError> {
        let nodes = LeaseNodes::of(self)?;
        let Some(answer) = keep_alive_once(&nodes, id).await? else {
            return Ok(None);
        };
        let ttl = Duration::from_millis(answer.ttl_ms);
        let state = LeaseState::held_from(answer.sent_at, ttl);
        Ok(Some(Lease::start(nodes, id, ttl, state)))
    }

    /// Sends one keep-alive for the lease `id`. Returns the lease's TTL, counted from
    /// the sending; `None` when there is no such lease (it never comes back).
    pub async fn keep_alive_once(&self, id: u64) -> Result<Option<Duration>, ClientError> {
        let nodes = LeaseNodes::of(self)?;
        let answer = keep_alive_once(&nodes, id).await?;
        Ok(answer.map(|a| Duration::from_millis(a.ttl_ms)))
    }

    /// Revokes the lease `id`: the cluster deletes it and every resource attached to it.
    /// `None` when there was no such lease (nothing changed).
    pub async fn revoke_lease(&self, id: u64) -> Result<Option<LeaseRevoked>, ClientError> {
        revoke(&LeaseNodes::of(self)?, id).await
    }

    /// The lease `id` as the answering node sees it (its remaining time is that node's
    /// estimate); `None` when there is no such lease.
    pub async fn lease_time_to_live(
        &self,
        id: u64,
    ) -> Result<Option<cairn_proto::v1::Lease>, ClientError> {
        let nodes = LeaseNodes::of(self)?;
        let answer = nodes
            .call(Operation::Read, move |mut rpc, remaining| {
                let mut r = tonic::Request::new(LeaseTimeToLiveRequest { id });
                r.set_timeout(remaining);
                async move { rpc.time_to_live(r).await }
            })
            .await;
        match answer {
            Ok(answer) => answer
                .lease
                .map(Some)
                .ok_or_else(|| unexpected("a time-to-live answer without its lease")),
            Err(ClientError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every lease, as the answering node sees them, with the revision it reflects.
    pub async fn leases(&self) -> Result<LeaseListResponse, ClientError> {
        LeaseNodes::of(self)?
            .call(Operation::Read, move |mut rpc, remaining| {
                let mut r = tonic::Request::new(LeaseListRequest {});
                r.set_timeout(remaining);
                async move { rpc.list(r).await }
            })
            .await
    }
}

async fn revoke(nodes: &LeaseNodes, id: u64) -> Result<Option<LeaseRevoked>, ClientError> {
    let answer = nodes
        .call(Operation::Mutation, move |mut rpc, remaining| {
            let mut r = tonic::Request::new(LeaseRevokeRequest { id });
            r.set_timeout(remaining);
            async move { rpc.revoke(r).await }
        })
        .await?;
    Ok((answer.revision != 0).then_some(LeaseRevoked {
        revision: answer.revision,
        deleted_count: answer.deleted_count,
    }))
}

/// One keep-alive on a stream of its own, with failover, within the request timeout.
/// `None`: no such lease.
async fn keep_alive_once(
    nodes: &LeaseNodes,
    id: u64,
) -> Result<Option<KeepAliveAnswer>, ClientError> {
    let answer = nodes
        .call(Operation::Read, move |rpc, remaining| async move {
            let mut stream = KeepAliveStream::open(rpc, id, remaining).await?;
            match tokio::time::timeout(remaining, stream.answer()).await {
                Ok(Ok(answer)) => Ok(tonic::Response::new(answer)),
                Ok(Err(status)) => Err(status),
                Err(_) => Err(tonic::Status::deadline_exceeded("no keep-alive answer")),
            }
        })
        .await?;
    Ok((answer.ttl_ms != 0).then_some(answer))
}

fn unexpected(what: &str) -> ClientError {
    ClientError::Internal {
        message: what.to_string(),
        outcome: Outcome::NotApplied,
    }
}

// ------------------------------------------------------- keeping alive ----

/// One `KeepAlive` stream to one node, with the send time of the keep-alive
/// outstanding on it.
struct KeepAliveStream {
    id: u64,
    requests: mpsc::Sender<LeaseKeepAliveRequest>,
    answers: tonic::Streaming<LeaseKeepAliveResponse>,
    /// When the keep-alive waiting for its answer was sent (at most one).
    outstanding: Option<Instant>,
}

impl KeepAliveStream {
    /// Opens a stream and sends the first keep-alive on it, waiting at most `within`
    /// for the node to accept the stream.
    async fn open(
        mut rpc: LeaseRpc,
        id: u64,
        within: Duration,
    ) -> Result<KeepAliveStream, tonic::Status> {
        // Room for the one outstanding keep-alive and the next.
        let (requests, receiver) = mpsc::channel(2);
        let sent_at = Instant::now();
        requests
            .try_send(LeaseKeepAliveRequest { id })
            .map_err(|_| tonic::Status::internal("a new keep-alive stream is full"))?;
        let opening = rpc.keep_alive(tokio_stream::wrappers::ReceiverStream::new(receiver));
        let answers = match tokio::time::timeout(within, opening).await {
            Ok(opened) => opened?.into_inner(),
            Err(_) => {
                return Err(tonic::Status::deadline_exceeded(
                    "the keep-alive stream did not open in time",
                ))
            }
        };
        Ok(KeepAliveStream {
            id,
            requests,
            answers,
            outstanding: Some(sent_at),
        })
    }

    /// Sends a keep-alive; false when the stream is gone.
    fn send(&mut self) -> bool {
        assert!(
            self.outstanding.is_none(),
            "one keep-alive outstanding at a time"
        );
        let sent_at = Instant::now();
        let sent = self
            .requests
            .try_send(LeaseKeepAliveRequest { id: self.id })
            .is_ok();
        if sent {
            self.outstanding = Some(sent_at);
        }
        sent
    }

    /// The answer to the outstanding keep-alive.
    async fn answer(&mut self) -> Result<KeepAliveAnswer, tonic::Status> {
        let Some(sent_at) = self.outstanding else {
            return std::future::pending().await;
        };
        let answer =
            self.answers.message().await?.ok_or_else(|| {
                tonic::Status::unavailable("the node ended the keep-alive stream")
            })?;
        if answer.id != self.id {
            return Err(tonic::Status::internal(format!(
                "a keep-alive of lease {} answered for lease {}",
                self.id, answer.id
            )));
        }
        self.outstanding = None;
        Ok(KeepAliveAnswer {
            sent_at,
            ttl_ms: answer.ttl_ms,
        })
    }
}

/// The task of a [`Lease`]: keeps the lease `id` alive and publishes its state, until
/// it is lost (or the handle aborts it).
async fn keep_alive(
    nodes: LeaseNodes,
    id: u64,
    ttl: Duration,
    state: Arc<watch::Sender<LeaseState>>,
) {
    let pacing = KeepAlivePacing::for_ttl(ttl);
    let publish = |answer: Option<KeepAliveAnswer>| {
        state.send_if_modified(|s| {
            let next = lease_state_after(s, answer, ttl, Instant::now());
            let changed = next != *s;
            *s = next;
            changed
        });
    };
    let mut stream: Option<KeepAliveStream> = None;
    // The grant (or the resuming keep-alive) was just acknowledged.
    let mut next_send = Instant::now() + pacing.interval;
    loop {
        let Some(until) = state.borrow().held_until() else {
            return;
        };
        let Some(open) = stream.as_mut() else {
            let within = pacing
                .answer_wait
                .min(until.saturating_duration_since(Instant::now()));
            let opened = tokio::select! {
                opened = nodes.open_keep_alive(id, within) => opened,
                _ = tokio::time::sleep_until(until) => {
                    publish(None);
                    continue;
                }
            };
            match opened {
                Ok(opened) => stream = Some(opened),
                Err(failure) => {
                    tracing::debug!(lease = id, %failure, "cannot open a keep-alive stream; trying the next node");
                    let pause = Instant::now() + pacing.retry_pause;
                    tokio::time::sleep_until(pause.min(until)).await;
                    publish(None);
                }
            }
            continue;
        };
        let answer_due = open.outstanding.map(|sent_at| sent_at + pacing.answer_wait);
        tokio::select! {
            _ = tokio::time::sleep_until(until) => publish(None),
            _ = tokio::time::sleep_until(next_send), if open.outstanding.is_none() => {
                next_send = Instant::now() + pacing.interval;
                if !open.send() {
                    nodes.move_on();
                    stream = None;
                }
            }
            _ = tokio::time::sleep_until(answer_due.unwrap_or(until)), if answer_due.is_some() => {
                tracing::debug!(lease = id, "no keep-alive answer in time; trying the next node");
                nodes.move_on();
                stream = None;
            }
            answer = open.answer() => match answer {
                Ok(answer) => {
                    publish(Some(answer));
                    if answer.ttl_ms == 0 {
                        return;
                    }
                }
                Err(status) => {
                    let failure = Failure::from_status(&status);
                    tracing::debug!(lease = id, %failure, "the keep-alive stream broke; trying the next node");
                    if !matches!(failure, Failure::Answered(_)) {
                        nodes.evict_current();
                    }
                    nodes.move_on();
                    stream = None;
                    // Reopen at once: the next keep-alive goes with the new stream.
                }
            },
        }
    }
}

// ----------------------------------------------------------- transport ----

/// How the lease calls reach the nodes: the client's own calls (its endpoints, channels,
/// credentials, failover and deadlines, [`Client::call_service`]) for grants, revokes and
/// the one-shot calls; and, for the keep-alive stream, the endpoint to open it at next.
#[derive(Clone)]
struct LeaseNodes {
    client: Client,
    /// Where the next keep-alive stream opens.
    preferred: Arc<Mutex<String>>,
}

impl LeaseNodes {
    fn of(client: &Client) -> Result<LeaseNodes, ClientError> {
        let first = client.endpoints().first().cloned();
        let first = first.unwrap_or_else(|| unreachable!("a client has at least one endpoint"));
        Ok(LeaseNodes {
            client: client.clone(),
            preferred: Arc::new(Mutex::new(first)),
        })
    }

    /// The lease service at `uri`, on the client's channel to it (connected within the
    /// connect timeout and the time left). `Err`: not connected, nothing sent.
    async fn rpc(&self, uri: &str, deadline: Instant) -> Result<LeaseRpc, String> {
        let channel = self.client.channel(uri, deadline).await?;
        Ok(LeaseServiceClient::new(self.client.authenticated(channel)))
    }

    fn preferred(&self) -> String {
        self.preferred.lock().clone()
    }

    /// The next endpoint becomes the preferred one (the current one failed).
    fn move_on(&self) {
        let endpoints = self.client.endpoints();
        let mut preferred = self.preferred.lock();
        let position = endpoints.iter().position(|e| *e == *preferred);
        *preferred = match position {
            Some(i) => endpoints[(i + 1) % endpoints.len()].clone(),
            None => endpoints[0].clone(),
        };
    }

    /// Forgets the channel of the preferred endpoint (reconnect eagerly next time).
    fn evict_current(&self) {
        self.client.evict(&self.preferred());
    }

    /// Opens a keep-alive stream at the preferred endpoint, sending one keep-alive.
    async fn open_keep_alive(&self, id: u64, within: Duration) -> Result<KeepAliveStream, Failure> {
        let target = self.preferred();
        let deadline = Instant::now() + within;
        let rpc = match self.rpc(&target, deadline).await {
            Ok(rpc) => rpc,
            Err(message) => {
                self.move_on();
                return Err(Failure::NotSent(message));
            }
        };
        KeepAliveStream::open(rpc, id, within)
            .await
            .map_err(|status| {
                let failure = Failure::from_status(&status);
                if !matches!(failure, Failure::Answered(_)) {
                    self.evict_current();
                }
                self.move_on();
                failure
            })
    }

    /// One call with the client's failover and deadline.
    async fn call<T, F, Fut>(&self, operation: Operation, call: F) -> Result<T, ClientError>
    where
        F: FnMut(LeaseRpc, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.client
            .call_service(operation, LeaseServiceClient::new, call)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacing_sends_three_keep_alives_per_ttl() {
        // Two keep-alives may fail before the lease is lost; a failed node is left fast.
        let p = KeepAlivePacing::for_ttl(Duration::from_secs(3));
        assert_eq!(p.interval, Duration::from_secs(1));
        assert_eq!(p.answer_wait, Duration::from_secs(1));
        assert_eq!(p.retry_pause, Duration::from_millis(150));
        let p = KeepAlivePacing::for_ttl(Duration::from_secs(60));
        assert_eq!(p.retry_pause, Duration::from_millis(250));
        let p = KeepAlivePacing::for_ttl(Duration::from_millis(100));
        assert_eq!(p.retry_pause, Duration::from_millis(10));
    }
}
