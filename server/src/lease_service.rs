//! `cairn.v1.LeaseService` on the client port: grant, revoke, keep alive, look at and list
//! leases (`docs/contract.md`, "Leases").
//!
//! - Grant, revoke and keep-alive go through the log, on the leader: a follower forwards
//!   them ([`ResourceApi::lease_command`], the forwarder's one route).
//! - **Keep-alives are gathered** ([`KeepAliveBatcher`]): every keep-alive arriving on this
//!   node, on any stream, waits in one bounded queue; one task takes everything queued (at
//!   most [`LEASE_IDS_PER_ENTRY_MAX`] ids) into one log entry while the previous entry
//!   commits. 10,000 leases renewed every few seconds cost a few entries a second.
//! - A KeepAlive stream answers in the order it was asked, with at most
//!   [`KEEP_ALIVES_IN_FLIGHT_PER_STREAM_MAX`] answers pending: a client that sends faster
//!   than the log commits is slowed down, never buffered without bound.
//! - TimeToLive and List answer from this node's replica and lease clock: on a follower,
//!   `remaining_ms` is its own estimate (the leader decides).
//! - Authorization: a grant with a write scope or admin ([`Action::Lease`]); a revoke also
//!   needs write on everything attached to the lease.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use cairn_fsm::lease::LEASE_IDS_PER_ENTRY_MAX;
use cairn_fsm::Store;
use cairn_proto::error::ApiError;
use cairn_proto::v1 as pb;
use cairn_proto::v1::lease_command_request::Command as Asked;
use cairn_proto::v1::lease_command_response::Answer;
use futures::{Stream, StreamExt as _};
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status, Streaming};

use crate::auth::Action;
use crate::raft::leases::LeaseClock;
use crate::service::ResourceApi;

/// Most keep-alives waiting on this node for their entry.
pub const KEEP_ALIVES_QUEUED_MAX: usize = 100_000;
/// Most answers one KeepAlive stream may have pending.
pub const KEEP_ALIVES_IN_FLIGHT_PER_STREAM_MAX: usize = 1024;

type Waiter = (u64, oneshot::Sender<Result<u64, ApiError>>);

/// Gathers the keep-alives arriving on this node into log entries.
#[derive(Clone)]
pub struct KeepAliveBatcher {
    queue: mpsc::Sender<Waiter>,
}

impl KeepAliveBatcher {
    /// The batcher and the task that drives it (run for the life of the node).
    pub fn start(
        api: Arc<ResourceApi>,
    ) -> (KeepAliveBatcher, impl std::future::Future<Output = ()>) {
        let (queue, waiting) = mpsc::channel(KEEP_ALIVES_QUEUED_MAX);
        (KeepAliveBatcher { queue }, drive(api, waiting))
    }

    /// Renews the lease `id`: its TTL, or 0 when it does not exist.
    pub async fn keep_alive(&self, id: u64) -> Result<u64, ApiError> {
        if id == 0 {
            return Err(ApiError::invalid("id", "0 is not a lease id"));
        }
        let (answer, answered) = oneshot::channel();
        self.queue
            .send((id, answer))
            .await
            .map_err(|_| ApiError::Unavailable("the node is shutting down".into()))?;
        answered
            .await
            .map_err(|_| ApiError::Unavailable("the node is shutting down".into()))?
    }
}

/// Takes every keep-alive queued (up to an entry's worth), proposes them as one entry,
/// and answers each; ends when every batcher handle is gone.
async fn drive(api: Arc<ResourceApi>, mut waiting: mpsc::Receiver<Waiter>) {
    let mut batch: Vec<Waiter> = Vec::new();
    loop {
        let Some(first) = waiting.recv().await else {
            return;
        };
        batch.push(first);
        while batch.len() < LEASE_IDS_PER_ENTRY_MAX {
            match waiting.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let mut ids: Vec<u64> = batch.iter().map(|w| w.0).collect();
        ids.sort_unstable();
        ids.dedup();
        assert!(
            ids.len() <= LEASE_IDS_PER_ENTRY_MAX,
            "an entry's worth of leases"
        );
        let request = pb::LeaseCommandRequest {
            command: Some(Asked::KeepAlive(pb::LeaseKeepAlives { ids })),
        };
        let answers = match api.lease_command(request, api.deadline_within(None)).await {
            Ok(pb::LeaseCommandResponse {
                answer: Some(Answer::KeepAlive(answers)),
            }) => Ok(answers
                .leases
                .into_iter()
                .map(|l| (l.id, l.ttl_ms))
                .collect::<HashMap<u64, u64>>()),
            Ok(other) => Err(ApiError::Internal(format!(
                "a keep-alive answered as {other:?}"
            ))),
            Err(e) => Err(e),
        };
        for (id, waiter) in batch.drain(..) {
            let answer = match &answers {
                Ok(ttls) => Ok(ttls.get(&id).copied().unwrap_or(0)),
                Err(e) => Err(e.clone()),
            };
            let _ = waiter.send(answer);
        }
    }
}

/// The `LeaseService` of the client port.
pub struct LeaseGrpc {
    api: Arc<ResourceApi>,
    keep_alives: KeepAliveBatcher,
    store: Store,
    clock: Arc<LeaseClock>,
}

impl LeaseGrpc {
    pub fn new(
        api: Arc<ResourceApi>,
        keep_alives: KeepAliveBatcher,
        store: Store,
        clock: Arc<LeaseClock>,
    ) -> LeaseGrpc {
        LeaseGrpc {
            api,
            keep_alives,
            store,
            clock,
        }
    }

    /// The lease `id` as this node sees it.
    fn lease(&self, view: &cairn_fsm::View, id: u64) -> Option<pb::Lease> {
        let (lease, attached_count) = view.lease(id)?;
        Some(pb::Lease {
            id,
            ttl_ms: lease.ttl_ms,
            remaining_ms: self.clock.remaining_ms(&lease, self.clock.now_ms()),
            attached_count,
            granted_revision: lease.granted_revision,
            renewed_revision: lease.renewed_revision,
        })
    }
}

type KeepAliveStream =
    Pin<Box<dyn Stream<Item = Result<pb::LeaseKeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::lease_service_server::LeaseService for LeaseGrpc {
    async fn grant(
        &self,
        r: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        let deadline = self.api.deadline_of(&r);
        self.api.authorize_lease(&r, &Action::Lease)?;
        let request = pb::LeaseCommandRequest {
            command: Some(Asked::Grant(r.into_inner())),
        };
        match self.api.lease_command(request, deadline).await?.answer {
            Some(Answer::Grant(granted)) => Ok(Response::new(granted)),
            other => Err(ApiError::Internal(format!("a grant answered as {other:?}")).into()),
        }
    }

    async fn revoke(
        &self,
        r: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        let deadline = self.api.deadline_of(&r);
        self.api.authorize_lease(&r, &Action::Lease)?;
        // What goes with the lease must be the caller's to delete.
        for attached in self.store.view().resources_of_lease(r.get_ref().id) {
            let resource = attached.resource();
            let id = resource.id.unwrap_or_default();
            let (type_, tenancy) = (
                id.r#type.unwrap_or_default(),
                id.tenancy.unwrap_or_default(),
            );
            self.api.authorize_lease(
                &r,
                &Action::Write {
                    type_: &type_,
                    tenancy: &tenancy,
                },
            )?;
        }
        let request = pb::LeaseCommandRequest {
            command: Some(Asked::Revoke(r.into_inner())),
        };
        match self.api.lease_command(request, deadline).await?.answer {
            Some(Answer::Revoke(revoked)) => Ok(Response::new(revoked)),
            other => Err(ApiError::Internal(format!("a revoke answered as {other:?}")).into()),
        }
    }

    type KeepAliveStream = KeepAliveStream;

    async fn keep_alive(
        &self,
        r: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<KeepAliveStream>, Status> {
        self.api.authorize_lease(&r, &Action::Lease)?;
        let batcher = self.keep_alives.clone();
        let asked = r.into_inner().map(move |request| {
            let batcher = batcher.clone();
            async move {
                let request = request?;
                let ttl_ms = batcher.keep_alive(request.id).await?;
                Ok::<_, Status>(pb::LeaseKeepAliveResponse {
                    id: request.id,
                    ttl_ms,
                })
            }
        });
        // In order, at most KEEP_ALIVES_IN_FLIGHT_PER_STREAM_MAX pending; the stream ends
        // after its first error.
        let answers =
            asked
                .buffered(KEEP_ALIVES_IN_FLIGHT_PER_STREAM_MAX)
                .scan(false, |failed, answer| {
                    let end = *failed;
                    *failed |= answer.is_err();
                    futures::future::ready((!end).then_some(answer))
                });
        Ok(Response::new(
            self.api.ending_at_stop(
                answers,
                ApiError::Unavailable(
                    "the node is shutting down: keep the lease alive through another member".into(),
                )
                .into(),
            ),
        ))
    }

    async fn time_to_live(
        &self,
        r: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        self.api.authorize_lease(&r, &Action::Lease)?;
        let view = self.store.view();
        let lease = self
            .lease(&view, r.get_ref().id)
            .ok_or(ApiError::NotFound)?;
        Ok(Response::new(pb::LeaseTimeToLiveResponse {
            lease: Some(lease),
            revision: view.revision(),
        }))
    }

    async fn list(
        &self,
        r: Request<pb::LeaseListRequest>,
    ) -> Result<Response<pb::LeaseListResponse>, Status> {
        self.api.authorize_lease(&r, &Action::Lease)?;
        let view = self.store.view();
        let leases = view
            .leases()
            .filter_map(|l| self.lease(&view, l.id))
            .collect();
        Ok(Response::new(pb::LeaseListResponse {
            leases,
            revision: view.revision(),
        }))
    }
}
