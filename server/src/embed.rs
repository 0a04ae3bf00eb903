//! # A node inside your program: configuration in, a handle out
//!
//! [`EmbeddedNode::start`] runs a whole Cairn node in the calling program, on
//! its Tokio runtime, and hands back a handle; [`EmbeddedNode::client`] gives
//! an [`InProcessClient`], a [`cairn_client::ResourceApi`] that reaches the
//! node without a socket. Controllers that run beside the store (as Consul's
//! run inside its servers, over in-process gRPC) share its resources rather
//! than copy them, and the same controller code runs against a remote cluster
//! through [`cairn_client::Client`].
//!
//! ## One start-up path
//!
//! An embedded node is `cairn agent`: [`EmbeddedNode::start_with_source`] is
//! how the binary itself starts its node (`cairn_cli::agent::run`), and both end in
//! `Agent::start`. The same data-dir checks, the same servers (the node serves
//! its client and peer ports as any node does: other nodes reach it to
//! replicate, forward, join and check their membership, and remote clients may
//! use it too), the same tasks, the same fatal handling.
//!
//! ## Forming or joining a cluster
//!
//! Exactly as with the binary, through the [`Config`]:
//! - a new cluster: every node starts with the same `members`
//!   ([`crate::config::parse_members`] reads the `--members` form,
//!   `ID=PEER_ADDR/CLIENT_ADDR,...`); the member with the lowest id
//!   initializes the cluster, once. A single node lists only itself.
//! - a running cluster: `join` names a member's client address; the node joins
//!   as a learner, catches up, and becomes a voter.
//!
//! Build the [`Config`] by hand (`Config { node_id, data_dir, client_address,
//! peer_address, members, ..Config::default() }`; [`EmbeddedNode::start`]
//! validates it as the binary does) or load it as the binary does (a TOML
//! file, `CAIRN_*` variables, flag values: [`ConfigSource::load`]) and start it
//! with [`EmbeddedNode::start_with_source`], which also reloads grants and
//! certificates from that source on SIGHUP. A configuration given whole is
//! its own source ([`ConfigSource::fixed`]). Logging and metrics are the
//! program's: the node logs through `tracing` to whatever subscriber the
//! program installed (the binary installs one from `log_level`), and with
//! `metrics_address` set it installs the Prometheus recorder, as the binary does.
//!
//! ## The in-process client
//!
//! - **Direct.** It calls the node's request layer
//!   ([`crate::service::ResourceApi`], the piece the client port runs once a
//!   caller is admitted): no socket, no HTTP/2, no protobuf encoding of
//!   requests or answers on the way.
//! - **Trusted.** It bypasses the client port's grants (`[[auth.grants]]`) and
//!   sees every resource: its caller is the program that owns the node, its
//!   data dir and its node token, which no grant could keep out. A program
//!   that serves less trusted code must check that code's requests itself.
//! - **The same semantics as a remote request.** The same validation (every
//!   malformed request is InvalidArgument naming its field) and limits
//!   (`resource_bytes_max`, `list_page_size_max`, `list_results_max`, ... and
//!   the node-wide `watches_max`; the per-connection budgets have no
//!   connection to count), the same forwarding (a write on a follower goes to
//!   the leader over the peer port, as any other), strong reads as
//!   `follower_strong_reads` says, and each call bounded by the node's
//!   `request_timeout_ms` (or less: [`InProcessClient::with_request_timeout`]).
//!   Its errors are [`cairn_client::ClientError`]s, with the outcome the
//!   shared decision table gives the node's answer.
//! - **Shared, not copied.** The store keeps each resource once, as the
//!   protobuf encoding it made when the write applied; answers carry those
//!   very bytes (reference-counted), and the client decodes them once per
//!   answer into the `Arc<Resource>` every [`cairn_client::ResourceApi`]
//!   answer carries (why decoded values: `cairn_client::api`). Watch events
//!   come from the store's watch buffers the same way: never re-encoded,
//!   decoded once for their watcher.
//!
//! ## Stopping
//!
//! [`EmbeddedNode::shutdown`] stops the node as SIGTERM stops `cairn agent`:
//! health NOT_SERVING, a leader hands leadership off, then the servers and
//! Raft stop; membership never changes. A node whose Raft core stopped on its
//! own cannot go on: [`EmbeddedNode::fatal`] says why, and the program should
//! shut the node down then (the binary exits non-zero; a data dir found
//! damaged is marked and refused from then on).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_client::api::{whole_listing, ApiFuture, Event, EventKind, Listing, ResourceApi, Watch};
use cairn_client::{ClientError, Outcome, WatchProgress};
use cairn_proto::error::{ApiError, LeaderHint};
use cairn_proto::v1::{
    self as pb, shared, Consistency, Id, ListRequest, Resource, WatchListRequest,
};
use cairn_request::Operation;
use futures::StreamExt as _;
use prost::Message as _;
use tokio::time::Instant;

use crate::agent::Agent;
use crate::auth::Visibility;
use crate::config::{Config, ConfigSource};
use crate::fatal::{FatalCause, ShutdownProgress};

/// A node running in this program. See the module docs.
pub struct EmbeddedNode {
    agent: Agent,
    client: InProcessClient,
    client_address: String,
    election_timeout: Duration,
    shutdown_timeout: Duration,
}

impl EmbeddedNode {
    /// Starts a node on `config`, validated first (a bad setting is an error
    /// naming it); it is its own source on SIGHUP ([`ConfigSource::fixed`]).
    /// Returns once the node serves: its ports are bound, and it has
    /// initialized its cluster or started joining one.
    pub async fn start(config: Config) -> anyhow::Result<EmbeddedNode> {
        config.validate()?;
        let source = ConfigSource::fixed(&config)?;
        EmbeddedNode::start_with_source(config, source).await
    }

    /// As [`EmbeddedNode::start`], for a `config` that `source` loaded (and
    /// loads again on SIGHUP, for the grants and certificates): `cairn agent`'s
    /// own way of starting its node.
    pub async fn start_with_source(
        config: Config,
        source: ConfigSource,
    ) -> anyhow::Result<EmbeddedNode> {
        if config.metrics_address.is_some() {
            crate::ops::install_recorder()?;
        }
        let node_id = config.node_id;
        let client_address = config.client_address.clone();
        let election_timeout = Duration::from_millis(config.election_timeout_ms);
        let shutdown_timeout = Duration::from_millis(config.shutdown_timeout_ms);
        let agent = Agent::start(config, source).await?;
        let client = InProcessClient {
            api: agent.resource_api().clone(),
            source: format!("in-process node {node_id}").into(),
            request_timeout: None,
        };
        Ok(EmbeddedNode {
            agent,
            client,
            client_address,
            election_timeout,
            shutdown_timeout,
        })
    }

    /// A client of this node that calls it in process (cheap to clone).
    pub fn client(&self) -> InProcessClient {
        self.client.clone()
    }

    pub fn node_id(&self) -> u64 {
        self.agent.raft.node_id
    }

    /// The client address this node serves (as configured).
    pub fn client_address(&self) -> &str {
        &self.client_address
    }

    /// Whether this node leads its cluster now.
    pub fn is_leader(&self) -> bool {
        self.agent.raft.is_leader()
    }

    /// The leader as this node knows it.
    pub fn leader(&self) -> LeaderHint {
        self.agent.raft.leader()
    }

    /// Waits until the node cannot go on (its Raft core stopped on its own),
    /// and says why; its log line is written (and a damaged data dir marked)
    /// by then. The program should then [`EmbeddedNode::shutdown`] it.
    pub async fn fatal(&mut self) -> FatalCause {
        self.agent.fatal().await
    }

    /// Stops the node (see the module docs); returns once it stopped.
    pub async fn shutdown(self) {
        self.shutdown_with(&ShutdownProgress::default()).await
    }

    /// As [`EmbeddedNode::shutdown`], naming the step under way in `progress`
    /// (for a watchdog that ends a process whose shutdown does not finish in
    /// `shutdown_timeout_ms`, as the binary arms one).
    pub async fn shutdown_with(self, progress: &ShutdownProgress) {
        self.agent
            .shutdown(self.election_timeout, self.shutdown_timeout, progress)
            .await;
    }
}

/// The in-process client of an [`EmbeddedNode`]: a [`ResourceApi`] over the
/// node's request layer. Cheap to clone; clones share the node. See the
/// module docs for what it does and does not do.
#[derive(Clone)]
pub struct InProcessClient {
    api: Arc<crate::service::ResourceApi>,
    /// What [`Watch::source`] says: `in-process node N`.
    source: Arc<str>,
    /// How long a call may take, at most the node's `request_timeout_ms`
    /// (`None`: that long).
    request_timeout: Option<Duration>,
}

impl InProcessClient {
    /// The same client, each call bounded by `timeout` (and always by the
    /// node's `request_timeout_ms`).
    pub fn with_request_timeout(mut self, timeout: Duration) -> InProcessClient {
        self.request_timeout = Some(timeout);
        self
    }

    fn deadline(&self) -> Instant {
        self.api.deadline_within(self.request_timeout)
    }

    async fn page(&self, request: ListRequest, deadline: Instant) -> Result<Listing, ClientError> {
        let page = self
            .api
            .list(request, None, deadline)
            .await
            .map_err(read_failed)?;
        Ok(Listing {
            resources: decode_all(&page.resources)?,
            revision: page.revision,
            next_page_token: page.next_page_token,
        })
    }
}

impl std::fmt::Debug for InProcessClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessClient")
            .field("source", &self.source)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

impl ResourceApi for InProcessClient {
    fn read(&self, id: Id, consistency: Consistency) -> ApiFuture<'_, Arc<Resource>> {
        Box::pin(async move {
            let request = pb::ReadRequest {
                id: Some(id),
                consistency: consistency as i32,
                revision: 0,
            };
            let answer = self
                .api
                .read(request, self.deadline())
                .await
                .map_err(read_failed)?;
            decode_one(answer.resource, "read", Outcome::NotApplied)
        })
    }

    fn write(&self, resource: Resource) -> ApiFuture<'_, Arc<Resource>> {
        Box::pin(async move {
            let request = pb::WriteRequest {
                fence: None,
                resource: Some(resource),
            };
            let answer = self
                .api
                .write(request, self.deadline())
                .await
                .map_err(|e| ClientError::from_node_answer(e, Operation::Mutation))?;
            // The node acknowledged the write: it applied, whatever follows.
            decode_one(answer.resource, "write", Outcome::Unknown)
        })
    }

    fn delete_request(&self, request: pb::DeleteRequest) -> ApiFuture<'_, pb::DeleteResponse> {
        Box::pin(async move {
            self.api
                .delete(request, self.deadline())
                .await
                .map_err(|e| ClientError::from_node_answer(e, Operation::Mutation))
        })
    }

    fn write_status(&self, request: pb::WriteStatusRequest) -> ApiFuture<'_, Arc<Resource>> {
        Box::pin(async move {
            let answer = self
                .api
                .write_status(request, self.deadline())
                .await
                .map_err(|e| ClientError::from_node_answer(e, Operation::Mutation))?;
            // The node acknowledged the write: it applied, whatever follows.
            decode_one(answer.resource, "status write", Outcome::Unknown)
        })
    }

    fn list(&self, request: ListRequest) -> ApiFuture<'_, Listing> {
        Box::pin(async move {
            whole_listing(&request, self.deadline(), |page, deadline| {
                self.page(page, deadline)
            })
            .await
        })
    }

    fn list_page(&self, request: ListRequest) -> ApiFuture<'_, Listing> {
        Box::pin(self.page(request, self.deadline()))
    }

    fn list_by_owner(&self, owner: Id) -> ApiFuture<'_, Listing> {
        Box::pin(async move {
            let request = pb::ListByOwnerRequest { owner: Some(owner) };
            let answer = self
                .api
                .list_by_owner(request, None, self.deadline())
                .await
                .map_err(read_failed)?;
            Ok(Listing {
                resources: decode_all(&answer.resources)?,
                revision: answer.revision,
                next_page_token: String::new(),
            })
        })
    }

    fn watch_list(&self, request: WatchListRequest) -> ApiFuture<'_, Watch> {
        Box::pin(async move {
            let opened = self
                .api
                .watch(request, Visibility::Everything, None, self.deadline())
                .await
                .map_err(read_failed)?;
            // The node's stream ends after its one error; so does this one.
            let events = opened.events.filter_map(|event| {
                std::future::ready(match event {
                    Ok(event) => watch_event(event).transpose(),
                    Err(e) => Some(Err(read_failed(e))),
                })
            });
            let cluster_id = Some(self.api.cluster_id()).filter(|id| !id.is_empty());
            Ok(Watch::new(
                self.source.to_string(),
                Some(opened.id),
                cluster_id,
                events,
            ))
        })
    }

    /// The watches named are this node's (`source` must be this client's).
    fn watch_progress(&self, source: &str, watch_ids: Vec<u64>) -> ApiFuture<'_, WatchProgress> {
        let elsewhere = (source != &*self.source).then(|| {
            ClientError::invalid(
                "source",
                format!(
                    "{source:?} is not this node ({:?}): its watches are not here",
                    self.source
                ),
            )
        });
        Box::pin(async move {
            if let Some(e) = elsewhere {
                return Err(e);
            }
            let request = pb::WatchProgressRequest { watch_ids };
            let answer = self
                .api
                .watch_progress(request, self.deadline())
                .await
                .map_err(read_failed)?;
            Ok(WatchProgress {
                revision: answer.revision,
                delivered_watch_ids: answer.delivered_watch_ids,
                cluster_id: Some(self.api.cluster_id()).filter(|id| !id.is_empty()),
            })
        })
    }

    /// One node, one source: there is no other to prefer. A watch that served
    /// a stale snapshot is simply opened again (after the caller's pause),
    /// by when this node has applied more.
    fn avoid(&self, _source: &str) {}
}

/// A read's (list's, watch's) failure: nothing applied.
fn read_failed(error: ApiError) -> ClientError {
    ClientError::from_node_answer(error, Operation::Read)
}

/// A resource of an answer, from the stored encoding the node handed out.
/// Those bytes always decode (the store made them); if they did not, that is
/// a bug to report, never a panic.
fn decode(encoded: &Bytes, outcome: Outcome) -> Result<Arc<Resource>, ClientError> {
    Resource::decode(encoded.as_ref())
        .map(Arc::new)
        .map_err(|e| ClientError::Internal {
            message: format!("a resource the node answered with does not decode: {e}"),
            outcome,
        })
}

fn decode_all(encoded: &[Bytes]) -> Result<Vec<Arc<Resource>>, ClientError> {
    encoded
        .iter()
        .map(|bytes| decode(bytes, Outcome::NotApplied))
        .collect()
}

/// The one resource of a read's or write's answer (`what`).
fn decode_one(
    encoded: Option<Bytes>,
    what: &str,
    outcome: Outcome,
) -> Result<Arc<Resource>, ClientError> {
    match encoded {
        Some(bytes) => decode(&bytes, outcome),
        None => Err(ClientError::Internal {
            message: format!("a {what} answer without a resource"),
            outcome,
        }),
    }
}

/// A watch event as the node's stream carries it (resources as stored
/// bytes), as [`ResourceApi`] hands it out; `None` for an event of no kind.
fn watch_event(event: shared::WatchEvent) -> Result<Option<Event>, ClientError> {
    use shared::watch_event::Event as Wire;
    let change = |resource: Option<Bytes>, what| decode_one(resource, what, Outcome::NotApplied);
    let kind = match event.event {
        None => return Ok(None),
        Some(Wire::Upsert(u)) => EventKind::Upsert(change(u.resource, "watch upsert")?),
        Some(Wire::Delete(d)) => EventKind::Delete(change(d.resource, "watch delete")?),
        Some(Wire::EndOfSnapshot(_)) => EventKind::EndOfSnapshot,
        Some(Wire::Progress(_)) => EventKind::Progress,
    };
    Ok(Some(Event {
        revision: event.revision,
        kind,
    }))
}
