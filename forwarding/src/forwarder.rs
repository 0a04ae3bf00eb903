//! [`Forwarder`]: where each client request runs.
//!
//! Eventual reads, eventual lists, ListByOwner and watches run here, once this node
//! has caught up since its start ([`Forwarder::caught_up_since_start`]). Writes
//! and deletes run here when this node leads and are forwarded to the leader
//! over the [`LeaderChannel`] otherwise, retrying across leader changes until
//! the request's deadline. Strong reads and lists run here too, on a follower
//! after a read index from the leader (`follower_strong_reads = "read-index"`,
//! the executor's [`ReadAt::AnyNode`]), or are forwarded like writes
//! ([`ReadAt::Leader`]); a strong watch waits here for a read index first.
//!
//! ## When an attempt is retried
//!
//! Decided by `cairn_request` (its table), the same decision the client
//! takes: this module is only the transport for the shared loop
//! (`cairn_request::run`). An attempt runs the request here when this node
//! leads, else sends it over the [`LeaderChannel`]. A write or delete is sent
//! again only after an attempt that certainly did not apply: nothing was
//! sent (no leader known, the connection could not be opened, the deadline
//! passed first), or the receiver refused with NotLeader or Unavailable,
//! which by the [`Handle`] contract it answers only before proposing (the
//! [`crate::ForwardingServer`] checks leadership first; the node's handle
//! turns every failure after proposing into Inconsistent). Any other
//! failure of a sent write ends the request with Inconsistent ("outcome
//! unknown"). Strong reads and lists have no effect and are retried after
//! anything another attempt may not meet, until the deadline. A failure
//! every node would repeat (a verdict of the contract, a refused credential,
//! a message over the size limit) is never retried, and a refusal by the
//! leader (PermissionDenied included) reaches the caller as it was answered.
//!
//! Answers come back as the leader's stored encodings (`cairn.v1.shared`)
//! and are handed on as they are: a follower neither decodes nor re-encodes
//! the resources of a strong read or list, or of a write's answer. A
//! forwarded request is re-encoded from the message the client port decoded
//! (it had to be decoded to be validated and authorized here).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use cairn_fsm::ReadScope;
use cairn_proto::error::ApiError;
use cairn_proto::error::LeaderHint;
use cairn_proto::v1::forwarding_service_client::ForwardingServiceClient;
use cairn_proto::v1::{self as pb, shared, Consistency};
use cairn_request::{Attempts, Failure, Pacing};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::channel::{LeaderChannel, Target};
use crate::executor::{Executor, OpenedWatch};
use crate::handle::{Handle, ReadAt};
use crate::metrics::{self, Method};

/// Retry pacing of a [`Forwarder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwarderOptions {
    /// First pause after an attempt that found no reachable leader; doubles
    /// up to `retry_pause_max` (always cut short by the deadline). A
    /// NotLeader answer naming a new leader is followed at once.
    pub retry_pause_initial: Duration,
    pub retry_pause_max: Duration,
    /// Largest message sent or received when forwarding.
    pub message_bytes_max: usize,
}

impl Default for ForwarderOptions {
    fn default() -> ForwarderOptions {
        ForwarderOptions {
            retry_pause_initial: Duration::from_millis(10),
            retry_pause_max: Duration::from_millis(200),
            message_bytes_max: crate::FORWARD_MESSAGE_BYTES_MAX,
        }
    }
}

/// Adds the sender's credentials (the host's cluster id and node id) to
/// every forwarded request; the leader's peer port refuses requests without them.
pub type RequestStamp = Arc<dyn Fn(&mut tonic::metadata::MetadataMap) + Send + Sync>;

/// Routes client requests to this node or to the leader.
pub struct Forwarder<H> {
    executor: Executor<H>,
    channel: Arc<LeaderChannel>,
    options: ForwarderOptions,
    stamp: Option<RequestStamp>,
    /// The shared round that confirms a read index after this node started
    /// ([`Forwarder::caught_up_since_start`]).
    catching_up: tokio::sync::OnceCell<u64>,
}

impl<H: Handle> Forwarder<H> {
    pub fn new(
        executor: Executor<H>,
        channel: Arc<LeaderChannel>,
        options: ForwarderOptions,
    ) -> Forwarder<H> {
        assert!(options.retry_pause_initial > Duration::ZERO);
        assert!(options.retry_pause_initial <= options.retry_pause_max);
        Forwarder {
            executor,
            channel,
            options,
            stamp: None,
            catching_up: tokio::sync::OnceCell::new(),
        }
    }

    /// Stamps every forwarded request with `stamp` (see [`RequestStamp`]).
    pub fn with_request_stamp(mut self, stamp: RequestStamp) -> Forwarder<H> {
        self.stamp = Some(stamp);
        self
    }

    pub fn executor(&self) -> &Executor<H> {
        &self.executor
    }

    pub fn channel(&self) -> &Arc<LeaderChannel> {
        &self.channel
    }

    /// Read: eventual here, strong here on the leader or at the leader.
    pub async fn read(
        &self,
        r: pb::ReadRequest,
        deadline: Instant,
    ) -> Result<shared::ReadResponse, ApiError> {
        match self.executor.check_read(&r)? {
            Consistency::Eventual => {
                self.caught_up_since_start(deadline).await?;
                self.executor.read_checked(r, Consistency::Eventual).await
            }
            Consistency::Strong => self.route(r, deadline).await,
        }
    }

    /// Write: through Raft here on the leader, else at the leader.
    pub async fn write(
        &self,
        r: pb::WriteRequest,
        deadline: Instant,
    ) -> Result<shared::WriteResponse, ApiError> {
        self.executor.check_write(&r)?;
        self.route(r, deadline).await
    }

    /// Delete: through Raft here on the leader, else at the leader.
    pub async fn delete(
        &self,
        r: pb::DeleteRequest,
        deadline: Instant,
    ) -> Result<pb::DeleteResponse, ApiError> {
        self.executor.check_delete(&r)?;
        self.route(r, deadline).await
    }

    /// Status write: through Raft here on the leader, else at the leader; refused here
    /// while the cluster version this node applied is below 0.2.
    pub async fn write_status(
        &self,
        r: pb::WriteStatusRequest,
        deadline: Instant,
    ) -> Result<shared::WriteStatusResponse, ApiError> {
        self.executor.check_write_status(&r)?;
        self.route(r, deadline).await
    }

    /// A lease grant, revoke or keep-alive: through Raft here on the leader, else at the
    /// leader; refused here while the cluster version this node applied is below 0.2.
    pub async fn lease(
        &self,
        r: pb::LeaseCommandRequest,
        deadline: Instant,
    ) -> Result<pb::LeaseCommandResponse, ApiError> {
        self.executor.check_lease(&r)?;
        // The cluster version is checked where every command is, before proposing
        // (`Handle::propose`), here on this node first: a follower never forwards it.
        self.route(r, deadline).await
    }

    /// List (one page): eventual here, strong here on the leader or at the
    /// leader. Only what `visible` shows (`None`: everything) is listed and
    /// counted against the page's bounds; a forwarded list carries it to the
    /// leader, with the whole request (limit and page token included). A
    /// later page of a strong listing reads the listing's fixed revision and
    /// needs no leader: it is served here once this node applied it.
    pub async fn list(
        &self,
        r: pb::ListRequest,
        visible: Option<Arc<ReadScope>>,
        deadline: Instant,
    ) -> Result<shared::ListResponse, ApiError> {
        match self.executor.check_list(&r)? {
            Consistency::Eventual => {
                self.caught_up_since_start(deadline).await?;
                self.executor
                    .list_checked(r, Consistency::Eventual, visible.as_deref())
                    .await
            }
            Consistency::Strong => {
                let list = ScopedList {
                    request: r,
                    visible,
                };
                self.route(list, deadline).await
            }
        }
    }

    /// ListByOwner: always here; only what `visible` shows (`None`:
    /// everything) is listed and counted.
    pub async fn list_by_owner(
        &self,
        r: pb::ListByOwnerRequest,
        visible: Option<&ReadScope>,
        deadline: Instant,
    ) -> Result<shared::ListByOwnerResponse, ApiError> {
        self.executor.check_list_by_owner(&r)?;
        self.caught_up_since_start(deadline).await?;
        self.executor.list_by_owner(r, visible)
    }

    /// WatchList: always here. A strong watch first gets a read index
    /// confirmed by a quorum and applied here (`Forwarder::confirm_here`),
    /// so that its snapshot holds every write acknowledged before the request
    /// arrived.
    pub async fn watch(
        &self,
        r: pb::WatchListRequest,
        deadline: Instant,
    ) -> Result<OpenedWatch, ApiError> {
        let confirmed_index = match self.executor.check_watch(&r)? {
            Consistency::Eventual => {
                self.caught_up_since_start(deadline).await?;
                None
            }
            Consistency::Strong => Some(self.confirm_here(deadline).await?),
        };
        self.executor.watch(r, confirmed_index)
    }

    /// Returns once this node has applied a read index confirmed after it started: the one
    /// rule that keeps what it serves from its own table (eventual reads and lists,
    /// ListByOwner, eventual watches) from going back in time across a restart. A node
    /// killed and restarted replays its log only up to the commit index it last persisted,
    /// which may be below what it had applied and served before; the first such request
    /// after the start gets a read index (as a strong read does, [`Forwarder::confirm_here`])
    /// and waits until it is applied, concurrent ones share that round, and every later one
    /// passes at once. Unavailable (certainly not served: retry here or on another node)
    /// when no read index could be confirmed by `deadline`.
    async fn caught_up_since_start(&self, deadline: Instant) -> Result<(), ApiError> {
        let mut caught_up = self.executor.caught_up();
        if *caught_up.borrow_and_update() {
            return Ok(());
        }
        // Whichever comes first: the shared round confirms one, or another request (a
        // strong read, say) confirms one while this waits.
        let shared_round = self
            .catching_up
            .get_or_try_init(|| self.confirm_here(deadline));
        tokio::select! {
            confirmed = shared_round => {
                let index = confirmed.map_err(|e| {
                    ApiError::Unavailable(format!(
                        "this node has not caught up with the cluster since it started, so it \
                         serves no eventual reads yet (no read index confirmed: {e}); retry, \
                         or read from another node"
                    ))
                })?;
                tracing::debug!(index, "caught up since start: serving eventual reads");
            }
            _ = caught_up.wait_for(|caught_up| *caught_up) => {}
        }
        assert!(
            *self.executor.caught_up().borrow(),
            "a confirmed read index marks the node caught up"
        );
        Ok(())
    }

    /// Catches up once after this node's start without waiting for a request
    /// (`Forwarder::caught_up_since_start`): rounds of at most `round` each, until one
    /// read index is confirmed and applied here. The node runs it as a task from its start,
    /// so that a follower cut off from the leader later still serves eventual reads from what
    /// it holds; a request that comes first shares the round in progress.
    pub async fn catch_up_after_start(&self, round: Duration) {
        assert!(round > Duration::ZERO);
        while !*self.executor.caught_up().borrow() {
            let started = Instant::now();
            if let Err(e) = self.caught_up_since_start(started + round).await {
                tracing::debug!(error = %e, "not caught up since start yet; trying again");
                // A round ends early only when its attempts cannot go on (for example a
                // refused credential): pause for what is left of it rather than spin.
                tokio::time::sleep_until(started + round).await;
            }
        }
    }

    /// WatchProgress: always here (the watches it names are this node's), after
    /// a read index confirmed and applied here, as for a strong watch.
    pub async fn watch_progress(
        &self,
        r: pb::WatchProgressRequest,
        deadline: Instant,
    ) -> Result<pb::WatchProgressResponse, ApiError> {
        Executor::<H>::check_watch_progress(&r)?;
        let confirmed_index = self.confirm_here(deadline).await?;
        Ok(self.executor.watch_progress(&r, confirmed_index))
    }

    /// Points the channel at the leader this node's own view names, if that
    /// view changed since the host last reported it: the host's leader-change
    /// hook normally keeps the channel in step, and a request racing that hook
    /// still goes to the right node. Only this node's view, never a hint from
    /// another node's answer: a NotLeader naming nobody, from a leader that
    /// does not yet know it leads, must not erase the leader this node sees
    /// (a redirect to a node such a hint names is [`LeaderChannel::not_leader`]'s).
    fn observe_host_view(&self) {
        self.channel.observe(&self.executor.handle().leader());
    }

    /// A read index confirmed by a quorum after this call began and applied on
    /// this node (`Handle::confirm_read` at any node), retried like a strong
    /// read until `deadline`; Inconsistent if none could be.
    async fn confirm_here(&self, deadline: Instant) -> Result<u64, ApiError> {
        let mut here = ConfirmHere {
            forwarder: self,
            turns: Turns::default(),
        };
        cairn_request::run(
            cairn_request::Operation::Read,
            &mut here,
            &self.pacing(),
            deadline,
        )
        .await
        .map_err(|ended| ended.into_api_error(cairn_request::Operation::Read))
    }

    fn pacing(&self) -> Pacing {
        Pacing {
            pause_initial: self.options.retry_pause_initial,
            pause_max: self.options.retry_pause_max,
            attempts_max: u32::MAX,
        }
    }

    /// Runs a validated request on the leader: here if this node leads,
    /// else forwarded; the shared loop decides what follows a failure.
    async fn route<R: Forwardable>(
        &self,
        request: R,
        deadline: Instant,
    ) -> Result<R::Response, ApiError> {
        let operation = R::METHOD.operation();
        let mut leader = ToLeader {
            forwarder: self,
            request,
            target: None,
            turns: Turns::default(),
        };
        cairn_request::run(operation, &mut leader, &self.pacing(), deadline)
            .await
            .map_err(|ended| {
                tracing::debug!(
                    method = R::METHOD.label(),
                    ?ended,
                    "forwarding: not retried"
                );
                ended.into_api_error(operation)
            })
    }

    /// One forwarded call to the current leader; `target` is set once it is known.
    async fn forward_once<R: Forwardable>(
        &self,
        request: &R,
        target: &mut Option<Target>,
        deadline: Instant,
    ) -> Result<R::Response, Failure> {
        let (to, channel) = self.channel.get(deadline).await?;
        *target = Some(to.clone());
        let now = Instant::now();
        if now >= deadline {
            return Err(Failure::NotSent(format!(
                "deadline passed before sending to leader {to}"
            )));
        }
        let remaining = deadline - now;
        let mut client = ForwardingServiceClient::new(channel)
            .max_decoding_message_size(self.options.message_bytes_max)
            .max_encoding_message_size(self.options.message_bytes_max);
        let mut call = Request::new(request.clone());
        if let Some(stamp) = &self.stamp {
            stamp(call.metadata_mut());
        }
        // The leader stops working on it when we stop waiting.
        call.set_timeout(remaining);
        match tokio::time::timeout(remaining, R::remote(&mut client, call)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(Failure::from_status(&status)),
            Err(_elapsed) => Err(Failure::NoAnswer(format!(
                "waiting {} ms for leader {to}",
                millis(remaining)
            ))),
        }
    }
}

/// The forwarder's transport for the shared loop: this node when it leads,
/// else the leader over the [`LeaderChannel`], kept in step with what each
/// failure says about the leader.
struct ToLeader<'a, H, R> {
    forwarder: &'a Forwarder<H>,
    request: R,
    /// The leader the last attempt was sent to (none: run here, or unsent).
    target: Option<Target>,
    turns: Turns,
}

impl<H: Handle, R: Forwardable> Attempts for ToLeader<'_, H, R> {
    type Response = R::Response;

    async fn attempt(&mut self, deadline: Instant) -> Result<R::Response, Failure> {
        let forwarder = self.forwarder;
        self.target = None;
        // Not yet a target asked: this attempt may run here.
        self.turns.before = forwarder.channel.target();
        // Run here first: the handle checks leadership (the one check of this request) and
        // answers NotLeader, certainly not proposed, on a node that does not lead.
        let started = Instant::now();
        // Boxed, as the forwarded call below: the request's run here holds the request
        // and its command at each layer down to Raft, so the futures that await it here
        // (this one, the shared loop's, the service's) would each be as large again.
        let local = Box::pin(self.request.clone().local(&forwarder.executor));
        match tokio::time::timeout_at(deadline, local).await {
            Ok(Err(ApiError::NotLeader { .. })) => {}
            Ok(result) => return result.map_err(Failure::Answered),
            Err(_elapsed) => return Err(not_done_here(started)),
        }
        forwarder.observe_host_view();
        self.turns.before_attempt(&forwarder.channel);
        let started = Instant::now();
        // Boxed: a forwarded call's future (a tonic client's) is large, and only a
        // follower makes it; the leader's requests stay small.
        let result =
            Box::pin(forwarder.forward_once(&self.request, &mut self.target, deadline)).await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(failure) => failure.label(),
        };
        metrics::record_call(R::METHOD, outcome, started.elapsed());
        result
    }

    fn move_on(&mut self, failure: &Failure, leader: Option<&LeaderHint>) -> bool {
        let channel = &self.forwarder.channel;
        tracing::debug!(method = R::METHOD.label(), %failure, "forwarding: retrying");
        if let Some(target) = &self.target {
            match failure {
                Failure::Answered(ApiError::NotLeader { hint }) => channel.not_leader(target, hint),
                Failure::Answered(ApiError::Unavailable(_)) | Failure::Lost(_) => {
                    channel.failed(target)
                }
                _ => {}
            }
        }
        !self.turns.followed_a_new_leader(channel, leader)
    }
}

/// At most this many leaders a request remembers having asked; a cluster has
/// a few nodes, so a request turned to more than this is paced from then on.
const ASKED_MAX: usize = 8;

/// Where one request's attempts went, to decide whether the next one goes at
/// once. Both transports ([`ToLeader`], [`ConfirmHere`]) decide through it. It
/// holds ids, not targets, so that a forwarded request allocates nothing for it.
#[derive(Default)]
struct Turns {
    /// The channel's target before the last attempt.
    before: Option<Target>,
    /// The ids of the leaders this request has been sent to: the first
    /// `asked_len` of them.
    asked: [u64; ASKED_MAX],
    asked_len: usize,
}

impl Turns {
    fn asked(&self) -> &[u64] {
        &self.asked[..self.asked_len]
    }

    /// Notes the target the next attempt goes to.
    fn before_attempt(&mut self, channel: &LeaderChannel) {
        self.before = channel.target();
        if let Some(target) = &self.before {
            if !self.asked().contains(&target.leader_id) && self.asked_len < ASKED_MAX {
                self.asked[self.asked_len] = target.leader_id;
                self.asked_len += 1;
            }
        }
        assert!(self.asked_len <= ASKED_MAX);
    }

    /// Whether the next attempt follows a NotLeader that named a new leader
    /// (`leader`), the channel's target having moved to a node this request
    /// has not asked yet: then it goes at once; any other retry is paced by
    /// the loop. A NotLeader naming the node that answered leaves the target
    /// where it was, so it is paced too; so is a turn back to a node already
    /// asked, so that two nodes whose stale views name each other are asked
    /// at the loop's pace, not as fast as they answer (each turn dials anew).
    fn followed_a_new_leader(&self, channel: &LeaderChannel, leader: Option<&LeaderHint>) -> bool {
        let Some(now) = channel.target() else {
            return false;
        };
        leader.is_some()
            && Some(&now) != self.before.as_ref()
            && !self.asked().contains(&now.leader_id)
            && self.asked_len < ASKED_MAX
    }
}

/// A request run here that did not end by its deadline: a strong read whose
/// read index was not confirmed or applied in time, or a write not answered
/// in time (it may still commit). Inconsistent either way: never a stale read,
/// never "certainly not applied".
fn not_done_here(started: Instant) -> Failure {
    Failure::Answered(ApiError::Inconsistent(format!(
        "not done on this node within {} ms (no quorum-confirmed answer in time)",
        millis(started.elapsed())
    )))
}

/// The transport of a strong watch's confirmation: [`Handle::confirm_read`]
/// here, on any node; a NotLeader from the leader asked names the next one.
struct ConfirmHere<'a, H> {
    forwarder: &'a Forwarder<H>,
    turns: Turns,
}

impl<H: Handle> Attempts for ConfirmHere<'_, H> {
    type Response = u64;

    async fn attempt(&mut self, deadline: Instant) -> Result<u64, Failure> {
        let started = Instant::now();
        self.turns.before_attempt(&self.forwarder.channel);
        let confirm = self.forwarder.executor.confirm_read(ReadAt::AnyNode);
        let result = match tokio::time::timeout_at(deadline, confirm).await {
            Ok(result) => result.map_err(Failure::Answered),
            Err(_elapsed) => Err(not_done_here(started)),
        };
        if let Err(failure) = &result {
            tracing::debug!(?failure, "no read index confirmed here");
        }
        result
    }

    fn move_on(&mut self, failure: &Failure, leader: Option<&LeaderHint>) -> bool {
        if let Failure::Answered(ApiError::NotLeader { .. }) = failure {
            self.forwarder.observe_host_view();
        }
        !self
            .turns
            .followed_a_new_leader(&self.forwarder.channel, leader)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A request that can run on the leader: locally through the [`Executor`]
/// or remotely through the `ForwardingService`.
trait Forwardable: Clone + Send + Sync + 'static {
    type Response: Send + 'static;
    const METHOD: Method;

    /// Runs the (validated) request on this node.
    fn local<H: Handle>(
        self,
        executor: &Executor<H>,
    ) -> impl Future<Output = Result<Self::Response, ApiError>> + Send;

    /// Sends the request to the leader.
    fn remote(
        client: &mut ForwardingServiceClient<Channel>,
        request: Request<Self>,
    ) -> impl Future<Output = Result<Response<Self::Response>, Status>> + Send;
}

impl Forwardable for pb::WriteRequest {
    type Response = shared::WriteResponse;
    const METHOD: Method = Method::Write;

    fn local<H: Handle>(
        self,
        executor: &Executor<H>,
    ) -> impl Future<Output = Result<Self::Response, ApiError>> + Send {
        executor.write_checked(self)
    }

    fn remote(
        client: &mut ForwardingServiceClient<Channel>,
        request: Request<Self>,
    ) -> impl Future<Output = Result<Response<Self::Response>, Status>> + Send {
        client.write(request)
    }
}

impl Forwardable for pb::DeleteRequest {
    type Response = pb::DeleteResponse;
    const METHOD: Method = Method::Delete;

    fn local<H: Handle>(
        self,
        executor: &Executor<H>,
    ) -> impl Future<Output = Result<Self::Response, ApiError>> + Send {
        executor.delete_checked(self)
    }

    fn remote(
        client: &mut ForwardingServiceClient<Channel>,
        request: Request<Self>,
    ) -> impl Future<Output = Result<Response<Self::Response>, Status>> + Send {
        client.delete(request)
    }
}

impl Forwardable for pb::WriteStatusRequest {
    type Response = shared::WriteStatusResponse;
    const METHOD: Method = Method::WriteStatus;

    fn local<H: Handle>(
        self,
        executor: &Executor<H>,
    ) -> impl Future<Output = Result<Self::Response, ApiError>> + Send {
        executor.write_status_checked(self)
    }

    fn remote(
        client: &mut ForwardingServiceClient<Channel>,
        request: Request<Self>,
    ) -> impl Future<Output = Result<Response<Self::Response>, Status>> + Send {
        client.write_status(request)
    }
}

impl Forwardable for pb::LeaseCommandRequest {
    type Response = pb::LeaseCommandResponse;
    const METHOD: Method = Method::Lease;

    fn local<H: Handle>(
        self,
        executor: &Executor<H>,
    ) -> impl Future<Output = Result<Self::Response, ApiError>> + Send {
        executor.lease_checked(self)
    }

    fn remote(
        client: &mut ForwardingServiceClient<Channel>,
        request: Request<Self>,
    ) -> impl Future<Output = Result<Response<Self::Response>, Status>> + Send {
        client.lease(request)
    }
}

impl Forwardable for pb::ReadRequest {
    type Response = shared::ReadResponse;
    const METHOD: Method = Method::Read;

    fn local<H: Handle>(
        self,
        executor: &Executor<H>,
    ) -> impl Future<Output = Result<Self::Response, ApiError>> + Send {
        executor.read_checked(self, Consistency::Strong)
    }

    fn remote(
        client: &mut ForwardingServiceClient<Channel>,
        request: Request<Self>,
    ) -> impl Future<Output = Result<Response<Self::Response>, Status>> + Send {
        client.read(request)
    }
}

/// A strong list, with the read scope of the client it serves.
#[derive(Clone)]
struct ScopedList {
    request: pb::ListRequest,
    visible: Option<Arc<ReadScope>>,
}

impl Forwardable for ScopedList {
    type Response = shared::ListResponse;
    const METHOD: Method = Method::List;

    async fn local<H: Handle>(self, executor: &Executor<H>) -> Result<Self::Response, ApiError> {
        executor
            .list_checked(self.request, Consistency::Strong, self.visible.as_deref())
            .await
    }

    fn remote(
        client: &mut ForwardingServiceClient<Channel>,
        request: Request<Self>,
    ) -> impl Future<Output = Result<Response<Self::Response>, Status>> + Send {
        client.list(request.map(|list| pb::ForwardedList {
            request: Some(list.request),
            read_scope: list.visible.map(|v| v.to_wire()),
        }))
    }
}
