//! [`ForwardingServer`]: the `ForwardingService` served on the peer port.
//!
//! It executes what a follower forwarded on this node, through the same
//! [`Executor`] as the client port, and never forwards again: a node that
//! does not (or no longer) lead answers NotLeader with its current hint,
//! before proposing anything. It also answers followers' `ReadIndex` calls
//! with a read index confirmed here, as leader ([`ReadAt::Leader`]).

use std::time::Duration;

use cairn_fsm::ReadScope;
use cairn_proto::error::ApiError;
use cairn_proto::v1::forwarding_service_server::{ForwardingService, ForwardingServiceServer};
use cairn_proto::v1::{self as pb, shared};
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::executor::Executor;
use crate::handle::{Handle, ReadAt};
use crate::metrics::{self, Method};

/// Serves forwarded requests on this node.
pub struct ForwardingServer<H> {
    executor: Executor<H>,
    /// Upper bound on serving one request, whatever the caller's deadline.
    request_timeout: Duration,
}

impl<H: Handle> ForwardingServer<H> {
    /// Serves over `handle`, confirming strong reads only as leader: what a
    /// follower sent is never passed on.
    pub fn new(handle: std::sync::Arc<H>, request_timeout: Duration) -> ForwardingServer<H> {
        ForwardingServer {
            executor: Executor::new(handle, ReadAt::Leader),
            request_timeout,
        }
    }

    /// The tonic service, with the default forwarding message size limit.
    pub fn into_service(self) -> ForwardingServiceServer<ForwardingServer<H>> {
        self.into_service_with_limit(crate::FORWARD_MESSAGE_BYTES_MAX)
    }

    /// The tonic service, refusing (and never sending) a message larger than
    /// `message_bytes_max`.
    pub fn into_service_with_limit(
        self,
        message_bytes_max: usize,
    ) -> ForwardingServiceServer<ForwardingServer<H>> {
        ForwardingServiceServer::new(self)
            .max_decoding_message_size(message_bytes_max)
            .max_encoding_message_size(message_bytes_max)
    }

    /// Runs one forwarded request within its deadline (the caller's
    /// `grpc-timeout` less a margin, so this answer beats tonic's own
    /// cancellation, and at most `request_timeout`), and counts it.
    async fn serve<T>(
        &self,
        method: Method,
        caller_timeout: Option<Duration>,
        work: impl std::future::Future<Output = Result<T, ApiError>>,
    ) -> Result<Response<T>, Status> {
        let limit = bounded_timeout(caller_timeout, self.request_timeout);
        let result = match tokio::time::timeout_at(Instant::now() + limit, work).await {
            Ok(r) => r,
            // A write may still commit (the one rule: cairn_request::unanswered).
            Err(_) => Err(cairn_request::unanswered(
                method.operation(),
                format_args!("no answer from the cluster within {} ms", limit.as_millis()),
            )),
        };
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => metrics::kind_label(e),
        };
        metrics::record_served(method, outcome);
        result.map(Response::new).map_err(Status::from)
    }
}

/// The time a node gives itself to answer: the caller's deadline less a
/// margin (a tenth, at most 50 ms), capped at `cap`.
pub fn bounded_timeout(caller_timeout: Option<Duration>, cap: Duration) -> Duration {
    match caller_timeout {
        None => cap,
        Some(t) => {
            let margin = (t / 10).min(Duration::from_millis(50));
            t.saturating_sub(margin).min(cap)
        }
    }
}

/// The caller's deadline as sent in `grpc-timeout`, if any and well formed.
pub fn caller_timeout<T>(r: &Request<T>) -> Option<Duration> {
    timeout_header(r, "grpc-timeout")
}

/// How long the caller of a `WatchList` waits for it to open
/// ([`cairn_proto::WATCH_OPEN_TIMEOUT_HEADER`]), if given and well formed.
pub fn watch_open_timeout<T>(r: &Request<T>) -> Option<Duration> {
    timeout_header(r, cairn_proto::WATCH_OPEN_TIMEOUT_HEADER)
}

/// A duration in the `grpc-timeout` format (digits, then one unit of H M S m u n) from
/// the metadata `name`; `None` when absent or malformed.
fn timeout_header<T>(r: &Request<T>, name: &str) -> Option<Duration> {
    let value = r.metadata().get(name)?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[tonic::async_trait]
impl<H: Handle> ForwardingService for ForwardingServer<H> {
    async fn write(
        &self,
        r: Request<pb::WriteRequest>,
    ) -> Result<Response<shared::WriteResponse>, Status> {
        let timeout = caller_timeout(&r);
        self.serve(Method::Write, timeout, self.executor.write(r.into_inner()))
            .await
    }

    async fn delete(
        &self,
        r: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let timeout = caller_timeout(&r);
        self.serve(
            Method::Delete,
            timeout,
            self.executor.delete(r.into_inner()),
        )
        .await
    }

    async fn write_status(
        &self,
        r: Request<pb::WriteStatusRequest>,
    ) -> Result<Response<shared::WriteStatusResponse>, Status> {
        let timeout = caller_timeout(&r);
        self.serve(
            Method::WriteStatus,
            timeout,
            self.executor.write_status(r.into_inner()),
        )
        .await
    }

    async fn read(
        &self,
        r: Request<pb::ReadRequest>,
    ) -> Result<Response<shared::ReadResponse>, Status> {
        let timeout = caller_timeout(&r);
        let request = r.into_inner();
        self.serve(Method::Read, timeout, async {
            // Only strong reads are forwarded; an eventual one sent here is
            // served as what it asks for, locally.
            let consistency = self.executor.check_read(&request)?;
            self.executor.read_checked(request, consistency).await
        })
        .await
    }

    async fn list(
        &self,
        r: Request<pb::ForwardedList>,
    ) -> Result<Response<shared::ListResponse>, Status> {
        let timeout = caller_timeout(&r);
        let forwarded = r.into_inner();
        self.serve(Method::List, timeout, async {
            let request = forwarded
                .request
                .ok_or_else(|| ApiError::invalid("request", "is required"))?;
            let visible = forwarded
                .read_scope
                .as_ref()
                .map(ReadScope::from_wire)
                .transpose()?;
            let consistency = self.executor.check_list(&request)?;
            self.executor
                .list_checked(request, consistency, visible.as_ref())
                .await
        })
        .await
    }

    async fn lease(
        &self,
        r: Request<pb::LeaseCommandRequest>,
    ) -> Result<Response<pb::LeaseCommandResponse>, Status> {
        let timeout = caller_timeout(&r);
        self.serve(Method::Lease, timeout, self.executor.lease(r.into_inner()))
            .await
    }

    async fn read_index(
        &self,
        r: Request<pb::ReadIndexRequest>,
    ) -> Result<Response<pb::ReadIndexResponse>, Status> {
        let timeout = caller_timeout(&r);
        self.serve(Method::ReadIndex, timeout, async {
            let index = self.executor.confirm_read(ReadAt::Leader).await?;
            Ok(pb::ReadIndexResponse { index })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_answers_before_the_callers_deadline() {
        // The margin: a tenth of the caller's timeout, at most 50 ms; capped by the node's limit.
        let cap = Duration::from_secs(5);
        assert_eq!(bounded_timeout(None, cap), cap);
        assert_eq!(
            bounded_timeout(Some(Duration::from_secs(2)), cap),
            Duration::from_millis(1950)
        );
        assert_eq!(
            bounded_timeout(Some(Duration::from_millis(100)), cap),
            Duration::from_millis(90)
        );
        assert_eq!(bounded_timeout(Some(Duration::from_secs(60)), cap), cap);
        assert_eq!(bounded_timeout(Some(Duration::ZERO), cap), Duration::ZERO);
    }
}
