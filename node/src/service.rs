//! `ResourceService` on the client port: validates every request, sends
//! writes, deletes and strong reads through Raft, and serves eventual reads,
//! lists, ListByOwner and watches from the local table.
//!
//! Strong reads and lists call `ensure_linearizable` (leadership confirmed by a
//! quorum, then applied ≥ committed) and never degrade to a plain local read.
//! On a follower, writes, deletes and strong reads go through the [`Backend`]'s
//! forwarder; without one they answer NotLeader with the leader's address.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use cairn_fsm::{Applied, Command, Limits, Store, WatchEventKind, WatchFilter};
use cairn_proto::error::ApiError;
use cairn_proto::v1::resource_service_server::ResourceService;
use cairn_proto::v1::{self as pb, watch_event};
use futures::Stream;
use tonic::{Request, Response, Status};

use crate::raft::RaftHandle;

/// What a strong or write request needs from the cluster: the node implements
/// it over Raft; the forwarding layer wraps it to reach the leader from a follower.
#[tonic::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Applies a write or delete through Raft; returns the log index and outcome.
    async fn apply(&self, command: Command) -> Result<(u64, Applied), ApiError>;
    /// Returns once a local read reflects every write acknowledged before the
    /// call; the revision to read at.
    async fn linearize(&self) -> Result<u64, ApiError>;
}

/// The node's own Raft: answers NotLeader on a follower.
pub struct LocalBackend {
    pub raft: RaftHandle,
}

#[tonic::async_trait]
impl Backend for LocalBackend {
    async fn apply(&self, command: Command) -> Result<(u64, Applied), ApiError> {
        self.raft.propose(&command).await
    }

    async fn linearize(&self) -> Result<u64, ApiError> {
        self.raft.ensure_linearizable().await
    }
}

pub struct ResourceApi {
    store: Store,
    limits: Arc<Limits>,
    backend: Arc<dyn Backend>,
    request_timeout: Duration,
}

impl ResourceApi {
    pub fn new(
        store: Store,
        limits: Arc<Limits>,
        backend: Arc<dyn Backend>,
        request_timeout: Duration,
    ) -> ResourceApi {
        ResourceApi {
            store,
            limits,
            backend,
            request_timeout,
        }
    }

    /// Runs `f` within the request's deadline (the smaller of the client's
    /// `grpc-timeout` and the node's request timeout).
    async fn bounded<T>(
        &self,
        deadline: Option<Duration>,
        f: impl std::future::Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        let limit = deadline.map_or(self.request_timeout, |d| d.min(self.request_timeout));
        match tokio::time::timeout(limit, f).await {
            Ok(r) => r,
            Err(_) => Err(ApiError::Inconsistent(format!(
                "no answer from the cluster within {} ms",
                limit.as_millis()
            ))),
        }
    }

    pub async fn read(
        &self,
        r: pb::ReadRequest,
        deadline: Option<Duration>,
    ) -> Result<pb::ReadResponse, ApiError> {
        let consistency = consistency(r.consistency)?;
        let id = r.id.ok_or_else(|| ApiError::invalid("id", "is required"))?;
        cairn_fsm::validate_id("id", &id, &self.limits).map_err(ApiError::from)?;
        if consistency == pb::Consistency::Strong {
            self.bounded(deadline, self.backend.linearize()).await?;
        }
        let view = self.store.view_at(r.revision).map_err(ApiError::from)?;
        let resource = view.read(&id).map_err(ApiError::from)?;
        Ok(pb::ReadResponse {
            resource: Some((*resource).clone()),
            revision: view.revision(),
        })
    }

    pub async fn write(
        &self,
        r: pb::WriteRequest,
        deadline: Option<Duration>,
    ) -> Result<pb::WriteResponse, ApiError> {
        let resource = r
            .resource
            .ok_or_else(|| ApiError::invalid("resource", "is required"))?;
        cairn_fsm::validate_write(&resource, &self.limits).map_err(ApiError::from)?;
        match self
            .bounded(deadline, self.backend.apply(Command::Write { resource }))
            .await?
        {
            (_, Applied::Written(resource)) => Ok(pb::WriteResponse {
                resource: Some((*resource).clone()),
            }),
            (index, other) => Err(ApiError::Internal(format!(
                "write at index {index} applied as {other:?}"
            ))),
        }
    }

    pub async fn delete(
        &self,
        r: pb::DeleteRequest,
        deadline: Option<Duration>,
    ) -> Result<pb::DeleteResponse, ApiError> {
        let id = r.id.ok_or_else(|| ApiError::invalid("id", "is required"))?;
        cairn_fsm::validate_id("id", &id, &self.limits).map_err(ApiError::from)?;
        match self
            .bounded(
                deadline,
                self.backend.apply(Command::Delete {
                    id,
                    version: r.version,
                }),
            )
            .await?
        {
            (index, Applied::Deleted { .. }) => Ok(pb::DeleteResponse { revision: index }),
            (index, other) => Err(ApiError::Internal(format!(
                "delete at index {index} applied as {other:?}"
            ))),
        }
    }

    pub async fn list(
        &self,
        r: pb::ListRequest,
        deadline: Option<Duration>,
    ) -> Result<pb::ListResponse, ApiError> {
        let consistency = consistency(r.consistency)?;
        let type_ = r
            .r#type
            .ok_or_else(|| ApiError::invalid("type", "is required"))?;
        let tenancy = r.tenancy.unwrap_or_default();
        cairn_fsm::validate_list(&type_, &tenancy, &r.name_prefix, &self.limits)
            .map_err(ApiError::from)?;
        if consistency == pb::Consistency::Strong {
            self.bounded(deadline, self.backend.linearize()).await?;
        }
        let view = self.store.view_at(r.revision).map_err(ApiError::from)?;
        let resources = view
            .list(&type_, &tenancy, &r.name_prefix)
            .into_iter()
            .map(|r| (*r).clone())
            .collect();
        Ok(pb::ListResponse {
            resources,
            revision: view.revision(),
        })
    }

    pub fn list_by_owner(
        &self,
        r: pb::ListByOwnerRequest,
    ) -> Result<pb::ListByOwnerResponse, ApiError> {
        let owner = r
            .owner
            .ok_or_else(|| ApiError::invalid("owner", "is required"))?;
        cairn_fsm::validate_id("owner", &owner, &self.limits).map_err(ApiError::from)?;
        let view = self.store.view();
        let resources = view
            .list_by_owner(&owner)
            .into_iter()
            .map(|r| (*r).clone())
            .collect();
        Ok(pb::ListByOwnerResponse {
            resources,
            revision: view.revision(),
        })
    }

    pub fn watch(&self, r: pb::WatchListRequest) -> Result<WatchStream, ApiError> {
        let type_ = r
            .r#type
            .ok_or_else(|| ApiError::invalid("type", "is required"))?;
        let tenancy = r.tenancy.unwrap_or_default();
        cairn_fsm::validate_list(&type_, &tenancy, &r.name_prefix, &self.limits)
            .map_err(ApiError::from)?;
        let filter = WatchFilter {
            type_,
            tenancy,
            name_prefix: r.name_prefix,
        };
        let watch = self
            .store
            .watch(filter, r.start_revision)
            .map_err(ApiError::from)?;
        let stream = futures::stream::unfold(Some(watch), |state| async move {
            let mut watch = state?;
            match watch.next().await {
                Ok(event) => Some((Ok(to_proto(event)), Some(watch))),
                Err(e) => Some((Err(Status::from(ApiError::from(e))), None)),
            }
        });
        Ok(Box::pin(stream))
    }
}

pub type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

fn to_proto(event: cairn_fsm::Event) -> pb::WatchEvent {
    let resource = event.resource.map(|r| (*r).clone());
    let event_kind = match event.kind {
        WatchEventKind::Upsert => watch_event::Event::Upsert(watch_event::Upsert { resource }),
        WatchEventKind::Delete => watch_event::Event::Delete(watch_event::Delete { resource }),
        WatchEventKind::EndOfSnapshot => {
            watch_event::Event::EndOfSnapshot(watch_event::EndOfSnapshot {})
        }
    };
    pb::WatchEvent {
        event: Some(event_kind),
        revision: event.revision,
    }
}

fn consistency(value: i32) -> Result<pb::Consistency, ApiError> {
    pb::Consistency::try_from(value).map_err(|_| {
        ApiError::invalid(
            "consistency",
            format!("unknown consistency value {value} (0 = eventual, 1 = strong)"),
        )
    })
}

fn deadline<T>(r: &Request<T>) -> Option<Duration> {
    let value = r.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The tonic service: a thin shell mapping [`ApiError`] to statuses.
pub struct ResourceGrpc(pub Arc<ResourceApi>);

#[tonic::async_trait]
impl ResourceService for ResourceGrpc {
    async fn read(
        &self,
        r: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        let d = deadline(&r);
        Ok(Response::new(self.0.read(r.into_inner(), d).await?))
    }

    async fn write(
        &self,
        r: Request<pb::WriteRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let d = deadline(&r);
        Ok(Response::new(self.0.write(r.into_inner(), d).await?))
    }

    async fn delete(
        &self,
        r: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let d = deadline(&r);
        Ok(Response::new(self.0.delete(r.into_inner(), d).await?))
    }

    async fn list(
        &self,
        r: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let d = deadline(&r);
        Ok(Response::new(self.0.list(r.into_inner(), d).await?))
    }

    async fn list_by_owner(
        &self,
        r: Request<pb::ListByOwnerRequest>,
    ) -> Result<Response<pb::ListByOwnerResponse>, Status> {
        Ok(Response::new(self.0.list_by_owner(r.into_inner())?))
    }

    type WatchListStream = WatchStream;

    async fn watch_list(
        &self,
        r: Request<pb::WatchListRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        Ok(Response::new(self.0.watch(r.into_inner())?))
    }
}
