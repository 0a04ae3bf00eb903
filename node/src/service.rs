//! `ResourceService` on the client port: a thin shell over
//! `cairn_forwarding::Forwarder`, which validates and executes every request
//! (the one place that does): eventual reads and lists, ListByOwner and
//! watches from the local table; writes, deletes, strong reads and strong
//! lists through Raft here on the leader, forwarded to the leader from a
//! follower. Strong requests never degrade to a plain local read.
//!
//! This shell only turns each call's deadline (the client's `grpc-timeout`,
//! less a margin so that the answer beats the client's own cancellation,
//! capped by the node's request timeout) into an instant, and errors into
//! statuses through `ApiError`.

use std::sync::Arc;
use std::time::Duration;

use cairn_forwarding::{Forwarder, WatchStream};
use cairn_proto::v1::resource_service_server::ResourceService;
use cairn_proto::v1::{self as pb};
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::forward::NodeHandle;

pub struct ResourceApi {
    forwarder: Forwarder<NodeHandle>,
    request_timeout: Duration,
    /// Watches per connection and per node.
    connection_limits: Option<Arc<crate::limits::ConnectionLimits>>,
    /// DANGEROUS, test-only (`--unsafe-local-strong-reads`): strong reads and
    /// lists are answered as eventual ones, from this node's possibly stale state.
    unsafe_local_strong_reads: bool,
}

impl ResourceApi {
    pub fn new(forwarder: Forwarder<NodeHandle>, request_timeout: Duration) -> ResourceApi {
        ResourceApi {
            forwarder,
            request_timeout,
            connection_limits: None,
            unsafe_local_strong_reads: false,
        }
    }

    /// Bounds the watches open per connection and on the node.
    pub fn with_connection_limits(
        mut self,
        limits: Arc<crate::limits::ConnectionLimits>,
    ) -> ResourceApi {
        self.connection_limits = Some(limits);
        self
    }

    /// DANGEROUS, test-only: serve strong reads and lists locally, without
    /// confirming leadership (see `Config::unsafe_local_strong_reads`). It
    /// exists so that the jepsen suite can show it catches stale reads.
    pub fn with_unsafe_local_strong_reads(mut self, enabled: bool) -> ResourceApi {
        self.unsafe_local_strong_reads = enabled;
        self
    }

    /// The read actually served: strong becomes eventual under the test-only
    /// unsafe flag, and only then.
    fn served(&self, mut r: pb::ReadRequest) -> pb::ReadRequest {
        if self.unsafe_local_strong_reads && r.consistency == pb::Consistency::Strong as i32 {
            r.consistency = pb::Consistency::Eventual as i32;
        }
        r
    }

    /// As [`ResourceApi::served`], for lists.
    fn served_list(&self, mut r: pb::ListRequest) -> pb::ListRequest {
        if self.unsafe_local_strong_reads && r.consistency == pb::Consistency::Strong as i32 {
            r.consistency = pb::Consistency::Eventual as i32;
        }
        r
    }

    pub fn forwarder(&self) -> &Forwarder<NodeHandle> {
        &self.forwarder
    }

    /// When a request must be answered by.
    fn deadline<T>(&self, r: &Request<T>) -> Instant {
        let caller = cairn_forwarding::caller_timeout(r);
        Instant::now() + cairn_forwarding::bounded_timeout(caller, self.request_timeout)
    }
}

/// The tonic service: a thin shell mapping `ApiError` to statuses.
pub struct ResourceGrpc(pub Arc<ResourceApi>);

#[tonic::async_trait]
impl ResourceService for ResourceGrpc {
    async fn read(
        &self,
        r: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        let d = self.0.deadline(&r);
        Ok(Response::new(
            self.0
                .forwarder
                .read(self.0.served(r.into_inner()), d)
                .await?,
        ))
    }

    async fn write(
        &self,
        r: Request<pb::WriteRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let d = self.0.deadline(&r);
        Ok(Response::new(
            self.0.forwarder.write(r.into_inner(), d).await?,
        ))
    }

    async fn delete(
        &self,
        r: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let d = self.0.deadline(&r);
        Ok(Response::new(
            self.0.forwarder.delete(r.into_inner(), d).await?,
        ))
    }

    async fn list(
        &self,
        r: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let d = self.0.deadline(&r);
        Ok(Response::new(
            self.0
                .forwarder
                .list(self.0.served_list(r.into_inner()), d)
                .await?,
        ))
    }

    async fn list_by_owner(
        &self,
        r: Request<pb::ListByOwnerRequest>,
    ) -> Result<Response<pb::ListByOwnerResponse>, Status> {
        Ok(Response::new(
            self.0.forwarder.list_by_owner(r.into_inner())?,
        ))
    }

    type WatchListStream = WatchStream;

    async fn watch_list(
        &self,
        r: Request<pb::WatchListRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        // The watch's slot is taken before any work and held by the stream.
        let permit = match &self.0.connection_limits {
            Some(limits) => Some(limits.watch(r.remote_addr())?),
            None => None,
        };
        let stream = self.0.forwarder.watch(r.into_inner())?;
        let stream = futures::StreamExt::map(stream, move |event| {
            let _held = &permit;
            event
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
