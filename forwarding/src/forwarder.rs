//! [`Forwarder`]: where each client request runs.
//!
//! Eventual reads, eventual lists, ListByOwner and watches run here. Writes,
//! deletes, strong reads and strong lists run here when this node leads and
//! are forwarded to the leader over the [`LeaderChannel`] otherwise, retrying
//! across leader changes until the request's deadline.
//!
//! ## When an attempt is retried
//!
//! Every write is a compare-and-set, so a write that did apply and is sent
//! again fails with CasFailure (or WrongUid): the client would be told
//! "failed" about a write that happened, and a create that another client
//! deleted in between would even be applied twice. So a write or delete is
//! sent again only after an attempt that **certainly did not apply**
//! ([`ForwardError::certainly_not_applied`]):
//! - nothing was sent: no leader known, the connection could not be opened
//!   (connect refused or timed out — tonic reports these as a `ConnectError`
//!   before any byte of the request leaves), or the deadline passed before
//!   sending;
//! - the receiver refused with NotLeader or Unavailable, which by the
//!   [`Handle`] contract it answers only before proposing (the
//!   [`crate::ForwardingServer`] checks leadership first; the node's handle
//!   turns every failure after proposing into Inconsistent).
//!
//! Any other failure of a sent write — the connection dropping, no answer
//! before the deadline, a status without Cairn details — ends the request
//! with Inconsistent ("outcome unknown"), which clients treat as possibly
//! applied. The same holds on this node when it leads: a local apply that
//! times out is Inconsistent, a local NotLeader (refused before proposing)
//! turns the request into a forwarded one.
//!
//! Strong reads and lists have no effect, so they are retried after any
//! failure that another attempt or another leader might not have (no
//! leader, dial failure, transport failure, NotLeader, Unavailable). A
//! verdict of the contract (NotFound, Compacted, Inconsistent, ...) is
//! returned as it is.
//!
//! When the deadline passes with no attempt in flight the answer is
//! Unavailable: nothing was applied, and a retry (here or elsewhere) can help.
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
use cairn_proto::v1::forwarding_service_client::ForwardingServiceClient;
use cairn_proto::v1::{self as pb, shared, Consistency};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::channel::{error_chain, LeaderChannel, Target};
use crate::error::ForwardError;
use crate::executor::{Executor, WatchStream};
use crate::handle::Handle;
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
            Consistency::Eventual => self.executor.read_checked(r, Consistency::Eventual).await,
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

    /// List: eventual here, strong here on the leader or at the leader.
    /// Only what `visible` shows (`None`: everything) is listed and counted
    /// against `list_results_max`; a forwarded list carries it to the leader.
    pub async fn list(
        &self,
        r: pb::ListRequest,
        visible: Option<Arc<ReadScope>>,
        deadline: Instant,
    ) -> Result<shared::ListResponse, ApiError> {
        match self.executor.check_list(&r)? {
            Consistency::Eventual => {
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
    pub fn list_by_owner(
        &self,
        r: pb::ListByOwnerRequest,
        visible: Option<&ReadScope>,
    ) -> Result<shared::ListByOwnerResponse, ApiError> {
        self.executor.list_by_owner(r, visible)
    }

    /// WatchList: always here.
    pub fn watch(&self, r: pb::WatchListRequest) -> Result<WatchStream, ApiError> {
        self.executor.watch(r)
    }

    /// Runs a validated request on the leader: here if this node leads,
    /// else forwarded, retrying by the rules in the module docs.
    async fn route<R: Forwardable>(
        &self,
        request: R,
        deadline: Instant,
    ) -> Result<R::Response, ApiError> {
        let method = R::METHOD;
        let started = Instant::now();
        let mut pause = self.options.retry_pause_initial;
        // The last failure of an attempt that certainly had no effect.
        let mut last: Option<ForwardError> = None;
        loop {
            if Instant::now() >= deadline {
                let detail = match &last {
                    Some(e) => e.to_string(),
                    None => "no attempt could be made".to_string(),
                };
                return Err(ForwardError::DeadlineExceeded {
                    waited_ms: millis(started.elapsed()),
                    sent: false,
                    detail,
                }
                .into());
            }
            let handle = self.executor.handle();
            if handle.is_leader() {
                match tokio::time::timeout_at(deadline, request.clone().local(&self.executor)).await
                {
                    Err(_elapsed) => {
                        // A local write may still commit: Inconsistent, never Unavailable.
                        return Err(ApiError::Inconsistent(format!(
                            "no answer from the cluster within {} ms",
                            millis(started.elapsed())
                        )));
                    }
                    Ok(Err(ApiError::NotLeader { .. })) => {
                        // Refused before proposing (the Handle contract): this
                        // node just lost leadership; continue as a follower.
                        last = Some(ForwardError::NoLeader);
                        self.pause(&mut pause, deadline).await;
                        continue;
                    }
                    Ok(result) => return result,
                }
            }
            // The host's leader-change hook normally keeps the channel in
            // step; a request racing that hook still goes to the right node.
            self.channel.observe(&handle.leader());
            let previous_target = self.channel.target();
            let attempt_started = Instant::now();
            let result = self.forward_once(&request, deadline).await;
            let outcome = match &result {
                Ok(_) => "ok",
                Err(e) => metrics::forward_label(e),
            };
            metrics::record_call(method, outcome, attempt_started.elapsed());
            let error = match result {
                Ok(response) => return Ok(response),
                Err(e) => e,
            };
            let retry = if method.mutates() {
                error.certainly_not_applied()
            } else {
                read_may_succeed_elsewhere(&error)
            };
            match &error {
                ForwardError::Answered {
                    target,
                    error: ApiError::NotLeader { hint },
                } => self.channel.not_leader(target, hint),
                ForwardError::Answered {
                    target,
                    error: ApiError::Unavailable(_),
                }
                | ForwardError::Transport { target, .. } => self.channel.failed(target),
                _ => {}
            }
            if !retry {
                tracing::debug!(method = method.label(), %error, "forwarding: not retried");
                return Err(error.into());
            }
            tracing::debug!(method = method.label(), %error, "forwarding: retrying");
            let redirected = matches!(
                &error,
                ForwardError::Answered {
                    error: ApiError::NotLeader { .. },
                    ..
                }
            ) && self.channel.target().is_some()
                && self.channel.target() != previous_target;
            last = Some(error);
            if !redirected {
                self.pause(&mut pause, deadline).await;
            }
        }
    }

    /// One forwarded call to the current leader.
    async fn forward_once<R: Forwardable>(
        &self,
        request: &R,
        deadline: Instant,
    ) -> Result<R::Response, ForwardError> {
        let (target, channel) = self.channel.get(deadline).await?;
        let now = Instant::now();
        if now >= deadline {
            return Err(ForwardError::DeadlineExceeded {
                waited_ms: 0,
                sent: false,
                detail: format!("before sending to leader {target}"),
            });
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
            Ok(Err(status)) => Err(classify(&status, target)),
            Err(_elapsed) => Err(ForwardError::DeadlineExceeded {
                waited_ms: millis(remaining),
                sent: true,
                detail: format!("waiting for leader {target}"),
            }),
        }
    }

    async fn pause(&self, pause: &mut Duration, deadline: Instant) {
        let until = deadline.min(Instant::now() + *pause);
        tokio::time::sleep_until(until).await;
        *pause = (*pause * 2).min(self.options.retry_pause_max);
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Whether a strong read or list that failed this way may succeed on a
/// later attempt (it had no effect either way).
fn read_may_succeed_elsewhere(error: &ForwardError) -> bool {
    match error {
        ForwardError::NoLeader | ForwardError::Dial { .. } | ForwardError::Transport { .. } => true,
        ForwardError::Answered { error, .. } => {
            matches!(error, ApiError::NotLeader { .. } | ApiError::Unavailable(_))
        }
        ForwardError::DeadlineExceeded { .. } => false,
    }
}

/// Sorts a failed call: an answer of a Cairn node (its details name a kind)
/// keeps its kind; a failure to connect means nothing was sent; anything
/// else is a transport failure after the request may have been sent.
fn classify(status: &Status, target: Target) -> ForwardError {
    if let Some(error) = ApiError::from_cairn_status(status) {
        let error = match error {
            // The leader's peer port authenticates this node, not the client
            // (whose grant was checked here): its refusal means the request
            // was not taken, never that the client lacks a permission.
            ApiError::PermissionDenied(reason) | ApiError::Unauthenticated(reason) => {
                ApiError::Unavailable(format!(
                    "{target} refused this node's forwarded request: {reason}"
                ))
            }
            error => error,
        };
        return ForwardError::Answered { target, error };
    }
    let reason = format!(
        "{:?}: {}",
        status.code(),
        std::error::Error::source(status)
            .map(error_chain)
            .unwrap_or_else(|| status.message().to_string())
    );
    if std::error::Error::source(status).is_some_and(is_connect_failure) {
        ForwardError::Dial { target, reason }
    } else {
        ForwardError::Transport { target, reason }
    }
}

/// Whether an error chain shows a failure to open the connection, which
/// happens before any byte of a request is sent.
fn is_connect_failure(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.downcast_ref::<tonic::ConnectError>().is_some() {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::AddrNotAvailable
                    | std::io::ErrorKind::NetworkUnreachable
                    | std::io::ErrorKind::HostUnreachable
            ) {
                return true;
            }
        }
        current = e.source();
    }
    false
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

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target {
            leader_id: 1,
            peer_address: "127.0.0.1:8101".into(),
        }
    }

    #[test]
    fn a_refusal_of_the_leaders_peer_port_reaches_the_client_as_unavailable() {
        // The leader's peer gate refused this node (not the client): the client is told the
        // request was not taken (UNAVAILABLE, retry), not that it lacks a permission.
        for refusal in [
            ApiError::PermissionDenied("refused: node 3 is not a member".into()),
            ApiError::Unauthenticated("no cluster id".into()),
        ] {
            match classify(&Status::from(refusal), target()) {
                ForwardError::Answered {
                    error: ApiError::Unavailable(reason),
                    ..
                } => assert!(
                    reason.contains("refused this node's forwarded request"),
                    "{reason}"
                ),
                other => panic!("expected UNAVAILABLE, got {other:?}"),
            }
        }
    }

    #[test]
    fn other_answers_of_the_leader_keep_their_kind() {
        match classify(&Status::from(ApiError::NotFound), target()) {
            ForwardError::Answered {
                error: ApiError::NotFound,
                ..
            } => {}
            other => panic!("expected NotFound, got {other:?}"),
        }
        // No Cairn details: a transport failure, whose outcome is unknown.
        assert!(matches!(
            classify(&Status::unavailable("connection reset"), target()),
            ForwardError::Transport { .. }
        ));
    }
}
