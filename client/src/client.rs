//! [`Client`]: every call of the contract against any node of a cluster, with
//! failover, leader hints, deadlines and the retry rules that keep a write's
//! outcome honest.
//!
//! ## Retry rules
//!
//! Decided by `cairn_request` (its module docs hold the table), the same
//! decision a node's forwarder takes: a write or delete is sent again (to the
//! same or another node) only after an attempt that certainly did not apply
//! (the connection could not be opened, a node answered NotLeader or
//! Unavailable); any other failure after it may have been sent ends the call
//! with [`Outcome::Unknown`]. Reads, lists and watch openings have no effect,
//! so they are retried after any failure that another node or a later
//! attempt might not have. A failure every node would repeat — a verdict of
//! the contract, a refused credential, an answer over the message size
//! limit — ends the call at once, whatever is left of its deadline.
//!
//! This module is the client's transport for the shared loop
//! (`cairn_request::run`): which endpoint to try, following a leader hint,
//! and when a round of failures calls for a pause.
//!
//! ## Deadlines
//!
//! One deadline ([`ClientOptions::request_timeout`]) covers a whole call:
//! connecting, every failover and backoff. Each attempt carries the time left
//! as its gRPC deadline, so the node stops working on it when the caller
//! stops waiting. A read, list or watch opening waits at most
//! [`ClientOptions::read_attempt_timeout`] for one node before asking the
//! next, so a paused or partitioned node cannot use up the whole deadline.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use cairn_proto::error::{ApiError, LeaderHint};
use cairn_proto::v1::resource_service_client::ResourceServiceClient;
use cairn_proto::v1::{
    Consistency, DeleteRequest, DeleteResponse, Id, ListByOwnerRequest, ListByOwnerResponse,
    ListRequest, ListResponse, ReadRequest, ReadResponse, Resource, Tenancy, Type, WatchEvent,
    WatchListRequest, WatchProgressRequest, WriteRequest, WriteStatusRequest,
};
use parking_lot::Mutex;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::auth::{AuthenticatedChannel, BearerToken, Credentials};
use cairn_request::decide::error_chain;
use cairn_request::{Attempts, Ended, Failure, Operation, Pacing};

use crate::error::{ClientError, Outcome};

/// Settings of a [`Client`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientOptions {
    /// Deadline of one call: connecting, failovers, backoff and the answer.
    pub request_timeout: Duration,
    /// How long opening one connection may take.
    pub connect_timeout: Duration,
    /// First pause after every endpoint failed in a row; doubles up to
    /// `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// HTTP/2 pings on idle connections, so a peer that went silent (killed
    /// machine, partition) is noticed and a watch on it fails over.
    pub keep_alive_interval: Duration,
    pub keep_alive_timeout: Duration,
    /// Longest wait for one node's answer to a read, list or watch opening
    /// before asking the next node (a paused or partitioned node must not
    /// eat the whole deadline). Writes and deletes wait up to the deadline:
    /// giving up on a sent write leaves its outcome unknown.
    pub read_attempt_timeout: Duration,
    /// How many CAS conflicts the helpers ([`Client::read_modify_write`],
    /// [`Client::delete_current`], [`Client::create_if_absent`]) retry.
    pub cas_attempts_max: u32,
    /// Sent as `authorization: Bearer <token>` on every call; required by a
    /// cluster whose config holds grants. `None` sends no credentials.
    pub token: Option<BearerToken>,
    /// TLS: the CA to trust and an optional client certificate. `None` with
    /// only `host:port` endpoints: plaintext; `None` with an `https://`
    /// endpoint: TLS trusting the system's CAs.
    pub tls: Option<crate::TlsOptions>,
}

impl Default for ClientOptions {
    fn default() -> ClientOptions {
        ClientOptions {
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(1),
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_millis(500),
            keep_alive_interval: Duration::from_secs(5),
            keep_alive_timeout: Duration::from_secs(5),
            read_attempt_timeout: Duration::from_secs(3),
            cas_attempts_max: 32,
            token: None,
            tls: None,
        }
    }
}

/// A handle on a Cairn cluster. Cheap to clone; clones share connections and
/// the last known leader. `Send + Sync`.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    /// The configured endpoints as URIs (`http://host:port`), never empty.
    endpoints: Vec<String>,
    options: ClientOptions,
    /// The interceptor adding `options.token` to every request.
    credentials: Credentials,
    /// TLS or plaintext, for every endpoint.
    access: crate::Access,
    routing: Mutex<Routing>,
}

struct Routing {
    /// The endpoint tried first: the last one that answered successfully (the
    /// leader after a NotLeader hint was followed).
    preferred: String,
    /// One eagerly connected channel per endpoint URI. Evicted after a
    /// transport failure, so the next attempt reconnects eagerly and a
    /// connect failure is recognised as such.
    channels: HashMap<String, Channel>,
}

/// The answer of [`Client::watch_progress`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchProgress {
    /// A revision confirmed by a quorum after the call began: every write
    /// acknowledged before it is at or below it.
    pub revision: u64,
    /// The watches that got a Progress event at or above `revision` (a watch
    /// since closed is left out).
    pub delivered_watch_ids: Vec<u64>,
    /// The cluster of the node that answered, if it said.
    pub cluster_id: Option<String>,
}

impl From<tonic::Response<cairn_proto::v1::WatchProgressResponse>> for WatchProgress {
    /// A node's answer, with the cluster its metadata names.
    fn from(response: tonic::Response<cairn_proto::v1::WatchProgressResponse>) -> WatchProgress {
        let cluster_id = metadata_str(response.metadata(), cairn_proto::CLUSTER_ID_HEADER);
        let answer = response.into_inner();
        WatchProgress {
            revision: answer.revision,
            delivered_watch_ids: answer.delivered_watch_ids,
            cluster_id,
        }
    }
}

/// A metadata value as text, if present and printable.
fn metadata_str(metadata: &tonic::metadata::MetadataMap, key: &str) -> Option<String> {
    metadata
        .get(key)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Turns `host:port` (or a URI) into the URI form used as the channel key.
pub(crate) fn endpoint_uri(address: &str) -> Result<String, ClientError> {
    let trimmed = address.trim();
    if trimmed.is_empty() {
        return Err(ClientError::invalid("endpoints", "an endpoint is empty"));
    }
    let uri = if trimmed.starts_with("http://") || trimmed.starts_with("https://") {
        trimmed.to_string()
    } else {
        format!("http://{trimmed}")
    };
    Endpoint::from_shared(uri.clone()).map_err(|e| {
        ClientError::invalid("endpoints", format!("{address:?} is not an address: {e}"))
    })?;
    Ok(uri)
}

/// The order in which one call visits endpoints: the preferred one first,
/// then the configured list round-robin; a leader hint jumps the queue.
struct Route {
    endpoints: Vec<String>,
    /// Position in `endpoints` of the last list entry handed out.
    position: usize,
    /// Attempts that failed since the last backoff pause.
    failures_in_round: usize,
}

impl Route {
    fn new(endpoints: &[String], preferred: &str) -> (Route, String) {
        assert!(!endpoints.is_empty(), "a client has at least one endpoint");
        let position = endpoints.iter().position(|e| e == preferred);
        let first = preferred.to_string();
        let route = Route {
            endpoints: endpoints.to_vec(),
            // A preferred address outside the list (a hint) is followed by
            // the list from its start.
            position: position.unwrap_or(endpoints.len() - 1),
            failures_in_round: 0,
        };
        (route, first)
    }

    fn next(&mut self) -> String {
        self.position = (self.position + 1) % self.endpoints.len();
        self.endpoints[self.position].clone()
    }

    /// Counts a failed attempt; true when every endpoint failed since the
    /// last pause (time to back off).
    fn failed(&mut self) -> bool {
        self.failures_in_round += 1;
        if self.failures_in_round >= self.endpoints.len() {
            self.failures_in_round = 0;
            true
        } else {
            false
        }
    }
}

/// The `start_revision` that resumes a watch whose last delivered change was
/// at `last_seen`: the revision just before it. Several changes can share a
/// revision (writes batched into one log entry) and a stream can break
/// between them, so that revision must come again whole; the consumer drops
/// the changes of it that it already holds. 0 (a new snapshot) when there is
/// no revision before it.
pub fn watch_resume_revision(last_seen: u64) -> u64 {
    last_seen.saturating_sub(1)
}

/// How many times [`Client::list_request`] starts a listing of the latest
/// state again after its revision was compacted between two pages (each
/// time within the call's one deadline).
pub const LIST_RESTARTS_MAX: u32 = 3;

/// The pages of one listing, fetched one at a time ([`Client::list_pages`]).
///
/// Each [`ListPages::next`] is one call with its own deadline
/// ([`ClientOptions::request_timeout`]), so a caller may take its time
/// between pages; but the listing's revision must stay in the nodes' history
/// meanwhile, or the next page is `Compacted`. Nothing is restarted behind
/// the caller's back (it already holds the earlier pages): it may start a
/// new listing. After any error, `next` asks for the same page again.
pub struct ListPages {
    client: Client,
    request: ListRequest,
    /// The token of the next page (`""`: the first); `None` once the
    /// listing has ended.
    next_page_token: Option<String>,
    /// The listing's revision, once the first page came.
    revision: Option<u64>,
}

impl ListPages {
    /// The next page, or `None` once the last page was returned.
    pub async fn next(&mut self) -> Option<Result<ListResponse, ClientError>> {
        let token = self.next_page_token.clone()?;
        let request = ListRequest {
            page_token: token,
            ..self.request.clone()
        };
        let page = match self.client.list_page(request).await {
            Ok(page) => page,
            Err(e) => return Some(Err(e)),
        };
        if let Some(revision) = self.revision {
            if let Err(e) = crate::api::check_same_listing(revision, page.revision) {
                return Some(Err(e));
            }
        }
        self.revision = Some(page.revision);
        self.next_page_token = Some(page.next_page_token.clone()).filter(|t| !t.is_empty());
        Some(Ok(page))
    }

    /// The revision every page of this listing reflects, once the first
    /// page came.
    pub fn revision(&self) -> Option<u64> {
        self.revision
    }
}

/// A server stream of watch events from one node.
pub struct WatchStream {
    endpoint: String,
    stream: tonic::Streaming<WatchEvent>,
    watch_id: Option<u64>,
    cluster_id: Option<String>,
}

impl WatchStream {
    /// The node serving this watch (`http://host:port`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The id the node gave this watch, to name it in
    /// [`Client::watch_progress`] (`None` from a node that gives none).
    pub fn watch_id(&self) -> Option<u64> {
        self.watch_id
    }

    /// The id of the cluster the serving node belongs to (`None` from a node
    /// that does not say).
    pub fn cluster_id(&self) -> Option<&str> {
        self.cluster_id.as_deref()
    }

    /// The next event; `None` when the node ended the stream without an
    /// error. A dropped connection is `Unavailable`; the node ending the
    /// watch is `WatchClosed`.
    pub async fn next(&mut self) -> Option<Result<WatchEvent, ClientError>> {
        match self.stream.message().await {
            Ok(Some(event)) => Some(Ok(event)),
            Ok(None) => None,
            Err(status) => Some(Err(match Failure::from_status(&status) {
                Failure::Answered(api) => ClientError::from_api(api, Outcome::NotApplied),
                other => ClientError::Unavailable {
                    message: format!("watch stream from {} broke: {other}", self.endpoint),
                    outcome: Outcome::NotApplied,
                },
            })),
        }
    }
}

impl Client {
    /// A client for the cluster reachable at `endpoints` (`host:port` each),
    /// with default options. Fails only on invalid endpoints: a cluster that
    /// is down now is not an error (every call fails over and retries within
    /// its deadline). Warms a connection to the first reachable endpoint.
    pub async fn connect<S: AsRef<str>>(endpoints: &[S]) -> Result<Client, ClientError> {
        Client::connect_with(endpoints, ClientOptions::default()).await
    }

    /// As [`Client::connect`], with options.
    pub async fn connect_with<S: AsRef<str>>(
        endpoints: &[S],
        options: ClientOptions,
    ) -> Result<Client, ClientError> {
        let client = Client::new(endpoints, options)?;
        let deadline = Instant::now() + client.inner.options.connect_timeout;
        for endpoint in &client.inner.endpoints {
            if client.channel(endpoint, deadline).await.is_ok() {
                client.inner.routing.lock().preferred = endpoint.clone();
                break;
            }
        }
        Ok(client)
    }

    /// A client that connects on first use (no I/O here).
    pub fn new<S: AsRef<str>>(
        endpoints: &[S],
        options: ClientOptions,
    ) -> Result<Client, ClientError> {
        if endpoints.is_empty() {
            return Err(ClientError::invalid(
                "endpoints",
                "at least one endpoint is required",
            ));
        }
        if options.request_timeout.is_zero() || options.connect_timeout.is_zero() {
            return Err(ClientError::invalid("options", "timeouts must be positive"));
        }
        let mut uris: Vec<String> = Vec::with_capacity(endpoints.len());
        for e in endpoints {
            let uri = endpoint_uri(e.as_ref())?;
            if !uris.contains(&uri) {
                uris.push(uri);
            }
        }
        let preferred = uris[0].clone();
        let wants_tls = uris.iter().any(|u| u.starts_with("https://"));
        let tls = match (&options.tls, wants_tls) {
            (Some(tls), _) => Some(tls.clone()),
            (None, true) => Some(crate::TlsOptions::default()),
            (None, false) => None,
        };
        let access = crate::Access::from_options(tls.as_ref())?;
        Ok(Client {
            inner: Arc::new(Inner {
                endpoints: uris,
                credentials: Credentials::new(options.token.as_ref()),
                options,
                access,
                routing: Mutex::new(Routing {
                    preferred,
                    channels: HashMap::new(),
                }),
            }),
        })
    }

    /// The options this client was built with.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.options
    }

    /// The configured endpoints, as URIs.
    pub fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    /// Reads one resource (contract: Read). An empty `id.uid` reads whatever
    /// lifetime is current.
    pub async fn read(&self, id: Id, consistency: Consistency) -> Result<Resource, ClientError> {
        let response = self
            .read_request(ReadRequest {
                id: Some(id),
                consistency: consistency as i32,
                revision: 0,
            })
            .await?;
        response
            .resource
            .ok_or_else(|| unexpected("a read answer without a resource"))
    }

    /// Read with every field of the request (a past revision, too); the
    /// answer carries the revision it reflects.
    pub async fn read_request(&self, request: ReadRequest) -> Result<ReadResponse, ClientError> {
        self.call(Operation::Read, move |mut c, remaining| {
            let mut r = tonic::Request::new(request.clone());
            r.set_timeout(remaining);
            async move { c.read(r).await }
        })
        .await
    }

    /// Writes `resource` as a compare-and-set: `resource.version` is the
    /// version expected to be stored ("" = create). Returns the stored
    /// resource with its new version.
    pub async fn write(&self, resource: Resource) -> Result<Resource, ClientError> {
        self.write_request(WriteRequest {
            resource: Some(resource),
            fence: None,
        })
        .await
    }

    /// A write with every option of the request: a fence
    /// ([`crate::Leadership::fence`]) makes it apply only while the election it names is
    /// still held at that token (FailedPrecondition otherwise).
    pub async fn write_request(&self, request: WriteRequest) -> Result<Resource, ClientError> {
        let response = self
            .call(Operation::Mutation, move |mut c, remaining| {
                let mut r = tonic::Request::new(request.clone());
                r.set_timeout(remaining);
                async move { c.write(r).await }
            })
            .await?;
        response.resource.ok_or_else(|| ClientError::Internal {
            message: "a write answer without a resource".into(),
            // The node acknowledged the write: it applied.
            outcome: Outcome::Unknown,
        })
    }

    /// Deletes the lifetime `id.uid` of a resource if its stored version is
    /// `version`. Nothing stored, or another lifetime stored: success, nothing
    /// deleted. Returns the revision at which the delete was applied.
    pub async fn delete(&self, id: Id, version: impl Into<String>) -> Result<u64, ClientError> {
        self.delete_request(DeleteRequest {
            id: Some(id),
            version: version.into(),
            fence: None,
            orphan_dependents: false,
        })
        .await
        .map(|r| r.revision)
    }

    /// A delete with every option of the request (a fence, as
    /// [`Client::write_request`]).
    /// Its answer says whether the resource was only marked for deletion (it has
    /// finalizers, or `orphan_dependents` keeps what it owns: `docs/contract.md`,
    /// "Lifecycle").
    pub async fn delete_request(
        &self,
        request: DeleteRequest,
    ) -> Result<DeleteResponse, ClientError> {
        self.call(Operation::Mutation, move |mut c, remaining| {
            let mut r = tonic::Request::new(request.clone());
            r.set_timeout(remaining);
            async move { c.delete(r).await }
        })
        .await
    }

    /// Replaces one entry (`request.key`) of the `status` map of the lifetime
    /// `request.id.uid` (required): checked against `request.version` only when
    /// it is not empty, so it never conflicts with a data write. Bumps the
    /// version, never the generation. Returns the stored resource.
    /// FailedPrecondition while the cluster version is below 0.2 (a cluster
    /// being upgraded from 0.1.0, or downgraded).
    pub async fn write_status(&self, request: WriteStatusRequest) -> Result<Resource, ClientError> {
        let response = self
            .call(Operation::Mutation, move |mut c, remaining| {
                let mut r = tonic::Request::new(request.clone());
                r.set_timeout(remaining);
                async move { c.write_status(r).await }
            })
            .await?;
        response.resource.ok_or_else(|| ClientError::Internal {
            message: "a status write answer without a resource".into(),
            // The node acknowledged the write: it applied.
            outcome: Outcome::Unknown,
        })
    }

    /// Lists every resource of an unversioned type (group + kind) whose
    /// tenancy matches (`*` = any) and whose name starts with `name_prefix`:
    /// the whole listing, every page of it (see [`Client::list_request`]).
    pub async fn list(
        &self,
        type_: Type,
        tenancy: Tenancy,
        name_prefix: impl Into<String>,
        consistency: Consistency,
    ) -> Result<ListResponse, ClientError> {
        self.list_request(ListRequest {
            r#type: Some(type_),
            tenancy: Some(tenancy),
            name_prefix: name_prefix.into(),
            consistency: consistency as i32,
            ..ListRequest::default()
        })
        .await
    }

    /// List with every field of the request (a past revision, a page size,
    /// a page token to continue from), paged transparently: it follows
    /// `next_page_token` to the end and returns every resource of the
    /// listing, in the order the pages came, with the revision of the first
    /// page (which every page reflects) and no next token.
    ///
    /// One deadline ([`ClientOptions::request_timeout`]) covers every page.
    /// When the listing's revision leaves the nodes' history between pages
    /// (`Compacted`), a listing of the latest state (no `revision`, no
    /// `page_token` asked) starts again from the first page, at most
    /// [`LIST_RESTARTS_MAX`] times and within that deadline; otherwise the
    /// error is returned. To hold one page at a time, use
    /// [`Client::list_pages`].
    pub async fn list_request(&self, request: ListRequest) -> Result<ListResponse, ClientError> {
        let deadline = Instant::now() + self.inner.options.request_timeout;
        let listing = crate::api::whole_listing(&request, deadline, |page, deadline| async move {
            self.list_page_by(page, deadline)
                .await
                .map(crate::Listing::from)
        })
        .await?;
        Ok(listing.into())
    }

    /// One page of a listing: the request as given (its `limit`, and its
    /// `page_token` to continue a listing), with failover and one deadline
    /// ([`ClientOptions::request_timeout`]). The answer's `next_page_token`
    /// is empty on the last page.
    pub async fn list_page(&self, request: ListRequest) -> Result<ListResponse, ClientError> {
        let deadline = Instant::now() + self.inner.options.request_timeout;
        self.list_page_by(request, deadline).await
    }

    /// The pages of the listing `request` starts, one at a time
    /// ([`ListPages::next`]): a caller with a huge type holds one page at a
    /// time. Nothing is sent until the first `next`.
    pub fn list_pages(&self, request: ListRequest) -> ListPages {
        ListPages {
            client: self.clone(),
            next_page_token: Some(request.page_token.clone()),
            request,
            revision: None,
        }
    }

    async fn list_page_by(
        &self,
        request: ListRequest,
        deadline: Instant,
    ) -> Result<ListResponse, ClientError> {
        self.call_by(Operation::Read, deadline, move |mut c, remaining| {
            let mut r = tonic::Request::new(request.clone());
            r.set_timeout(remaining);
            async move { c.list(r).await }
        })
        .await
        .map(|(response, _)| response.into_inner())
    }

    /// Every resource owned by exactly `owner` (uid included). Served by the
    /// node's local state.
    pub async fn list_by_owner(&self, owner: Id) -> Result<ListByOwnerResponse, ClientError> {
        let request = ListByOwnerRequest { owner: Some(owner) };
        self.call(Operation::Read, move |mut c, remaining| {
            let mut r = tonic::Request::new(request.clone());
            r.set_timeout(remaining);
            async move { c.list_by_owner(r).await }
        })
        .await
    }

    /// Opens a watch (contract: WatchList) on the first node that accepts it.
    /// The deadline bounds the opening only; the stream lasts until the node
    /// ends it or the connection drops.
    pub async fn watch_list(&self, request: WatchListRequest) -> Result<WatchStream, ClientError> {
        let (stream, endpoint) = self
            .call_at(Operation::Read, move |mut c, remaining| {
                // No gRPC deadline: it would end the stream. How long this attempt waits
                // for the watch to open bounds what the node does first (a STRONG
                // watch's read index), so that it answers within it.
                let mut r = tonic::Request::new(request.clone());
                let open_timeout = format!("{}m", remaining.as_millis().max(1));
                if let Ok(value) = open_timeout.parse() {
                    r.metadata_mut()
                        .insert(cairn_proto::WATCH_OPEN_TIMEOUT_HEADER, value);
                }
                async move { c.watch_list(r).await }
            })
            .await?;
        let watch_id = metadata_str(stream.metadata(), cairn_proto::WATCH_ID_HEADER)
            .and_then(|id| id.parse().ok());
        let cluster_id = metadata_str(stream.metadata(), cairn_proto::CLUSTER_ID_HEADER);
        Ok(WatchStream {
            endpoint,
            stream: stream.into_inner(),
            watch_id,
            cluster_id,
        })
    }

    /// Asks `endpoint` (a [`WatchStream::endpoint`]) for a quorum-confirmed
    /// revision and for a Progress event at or above it on each of
    /// `watch_ids` (its watches' [`WatchStream::watch_id`]s): once each of
    /// those streams has delivered its Progress, it has delivered every
    /// matching change acknowledged before this call began. Retried at that
    /// endpoint only (the watches live there) until the request timeout;
    /// Inconsistent when no revision could be confirmed.
    pub async fn watch_progress(
        &self,
        endpoint: &str,
        watch_ids: Vec<u64>,
    ) -> Result<WatchProgress, ClientError> {
        let endpoint = endpoint_uri(endpoint)?;
        let deadline = Instant::now() + self.inner.options.request_timeout;
        let request = WatchProgressRequest { watch_ids };
        let (response, _) = self
            .call_at_until(
                Operation::Read,
                deadline,
                std::slice::from_ref(&endpoint),
                &endpoint,
                move |mut c, remaining| {
                    let mut r = tonic::Request::new(request.clone());
                    r.set_timeout(remaining);
                    async move { c.watch_progress(r).await }
                },
            )
            .await?;
        Ok(WatchProgress::from(response))
    }

    /// Makes the next call start at the endpoint after `endpoint` (used when a
    /// node served something unusable, such as a stale snapshot).
    pub fn avoid(&self, endpoint: &str) {
        let endpoints = &self.inner.endpoints;
        let position = endpoints.iter().position(|e| e == endpoint);
        let next = match position {
            Some(i) => endpoints[(i + 1) % endpoints.len()].clone(),
            None => endpoints[0].clone(),
        };
        self.inner.routing.lock().preferred = next;
    }

    /// Runs one call with failover; see the module docs for the rules.
    async fn call<T, F, Fut>(&self, operation: Operation, attempt: F) -> Result<T, ClientError>
    where
        F: FnMut(ResourceServiceClient<AuthenticatedChannel>, Duration) -> Fut,
        Fut: Future<Output = Answer<T>>,
    {
        self.call_at(operation, attempt)
            .await
            .map(|(response, _)| response.into_inner())
    }

    /// As [`Client::call`], also returning the endpoint that answered.
    async fn call_at<T, F, Fut>(
        &self,
        operation: Operation,
        call: F,
    ) -> Result<(tonic::Response<T>, String), ClientError>
    where
        F: FnMut(ResourceServiceClient<AuthenticatedChannel>, Duration) -> Fut,
        Fut: Future<Output = Answer<T>>,
    {
        let deadline = Instant::now() + self.inner.options.request_timeout;
        self.call_by(operation, deadline, call).await
    }

    /// As [`Client::call_at`], ending by `deadline`: every endpoint, from the
    /// preferred one.
    async fn call_by<T, F, Fut>(
        &self,
        operation: Operation,
        deadline: Instant,
        call: F,
    ) -> Result<(tonic::Response<T>, String), ClientError>
    where
        F: FnMut(ResourceServiceClient<AuthenticatedChannel>, Duration) -> Fut,
        Fut: Future<Output = Answer<T>>,
    {
        let preferred = self.inner.routing.lock().preferred.clone();
        self.call_at_until(operation, deadline, &self.inner.endpoints, &preferred, call)
            .await
    }

    /// As [`Client::call_at`], over `endpoints` starting at `preferred`, ending
    /// by `deadline`: the shared loop (`cairn_request::run`) over [`Endpoints`].
    async fn call_at_until<T, F, Fut>(
        &self,
        operation: Operation,
        deadline: Instant,
        endpoints: &[String],
        preferred: &str,
        call: F,
    ) -> Result<(tonic::Response<T>, String), ClientError>
    where
        F: FnMut(ResourceServiceClient<AuthenticatedChannel>, Duration) -> Fut,
        Fut: Future<Output = Answer<T>>,
    {
        self.serve_until(
            operation,
            deadline,
            endpoints,
            preferred,
            ResourceServiceClient::new,
            call,
        )
        .await
    }

    /// One call of another service of the client port (`service` makes its client from
    /// a node's channel) with the same failover and deadline as the resource calls: the
    /// lease calls.
    pub(crate) async fn call_service<S, T, M, F, Fut>(
        &self,
        operation: Operation,
        service: M,
        call: F,
    ) -> Result<T, ClientError>
    where
        M: Fn(AuthenticatedChannel) -> S,
        F: FnMut(S, Duration) -> Fut,
        Fut: Future<Output = Answer<T>>,
    {
        let deadline = Instant::now() + self.inner.options.request_timeout;
        let preferred = self.inner.routing.lock().preferred.clone();
        self.serve_until(
            operation,
            deadline,
            &self.inner.endpoints,
            &preferred,
            service,
            call,
        )
        .await
        .map(|(response, _)| response.into_inner())
    }

    /// The shared loop (`cairn_request::run`) over [`Endpoints`] for any service.
    async fn serve_until<S, T, M, F, Fut>(
        &self,
        operation: Operation,
        deadline: Instant,
        endpoints: &[String],
        preferred: &str,
        service: M,
        call: F,
    ) -> Result<(tonic::Response<T>, String), ClientError>
    where
        M: Fn(AuthenticatedChannel) -> S,
        F: FnMut(S, Duration) -> Fut,
        Fut: Future<Output = Answer<T>>,
    {
        let options = &self.inner.options;
        let (route, target) = Route::new(endpoints, preferred);
        let mut endpoints = Endpoints {
            client: self,
            operation,
            route,
            target,
            service,
            call,
        };
        let pacing = Pacing {
            pause_initial: options.backoff_initial,
            pause_max: options.backoff_max,
            attempts_max: u32::MAX,
        };
        cairn_request::run(operation, &mut endpoints, &pacing, deadline)
            .await
            .map_err(|ended| call_error(ended, options.request_timeout))
    }

    /// The cached channel to `uri`, or a new eagerly connected one (bounded by
    /// the connect timeout and the call's deadline). `Err` = not connected,
    /// nothing sent.
    pub(crate) async fn channel(&self, uri: &str, deadline: Instant) -> Result<Channel, String> {
        if let Some(channel) = self.inner.routing.lock().channels.get(uri) {
            return Ok(channel.clone());
        }
        let options = &self.inner.options;
        let endpoint = self
            .inner
            .access
            .endpoint(uri)?
            .http2_keep_alive_interval(options.keep_alive_interval)
            .keep_alive_timeout(options.keep_alive_timeout)
            .keep_alive_while_idle(true);
        let limit = deadline
            .saturating_duration_since(Instant::now())
            .min(options.connect_timeout);
        let connecting = cairn_tls::connect_channel(
            endpoint,
            self.inner.access.tls.as_ref(),
            options.connect_timeout,
        );
        match tokio::time::timeout(limit, connecting).await {
            Ok(Ok(channel)) => {
                self.inner
                    .routing
                    .lock()
                    .channels
                    .insert(uri.to_string(), channel.clone());
                Ok(channel)
            }
            Ok(Err(e)) => Err(format!("cannot connect to {uri}: {}", error_chain(&e))),
            Err(_) => Err(format!(
                "cannot connect to {uri} within {} ms",
                limit.as_millis()
            )),
        }
    }

    pub(crate) fn evict(&self, uri: &str) {
        self.inner.routing.lock().channels.remove(uri);
    }

    /// `channel` with this client's credentials on every call.
    pub(crate) fn authenticated(&self, channel: Channel) -> AuthenticatedChannel {
        tonic::service::interceptor::InterceptedService::new(
            channel,
            self.inner.credentials.clone(),
        )
    }
}

/// The client's transport for the shared loop: one call at the current
/// endpoint; after a failure, the leader a node named, else the next
/// endpoint, pausing once every endpoint failed in a row.
struct Endpoints<'a, M, F> {
    client: &'a Client,
    operation: Operation,
    route: Route,
    target: String,
    /// Makes the service's client from a node's channel.
    service: M,
    call: F,
}

impl<S, T, M, F, Fut> Attempts for Endpoints<'_, M, F>
where
    M: Fn(AuthenticatedChannel) -> S,
    F: FnMut(S, Duration) -> Fut,
    Fut: Future<Output = Answer<T>>,
{
    type Response = (tonic::Response<T>, String);

    async fn attempt(&mut self, deadline: Instant) -> Result<Self::Response, Failure> {
        let client = self.client;
        let options = &client.inner.options;
        let remaining = deadline.saturating_duration_since(Instant::now());
        // A read waits at most `read_attempt_timeout` for one node; a write
        // up to the deadline (giving up on a sent write leaves it unknown).
        let limit = match self.operation {
            Operation::Read => remaining.min(options.read_attempt_timeout),
            Operation::Mutation => remaining,
        };
        let target = &self.target;
        let channel = client
            .channel(target, deadline)
            .await
            .map_err(Failure::NotSent)?;
        let rpc = (self.service)(client.authenticated(channel));
        match tokio::time::timeout(limit, (self.call)(rpc, limit)).await {
            Ok(Ok(response)) => {
                client.inner.routing.lock().preferred = target.clone();
                Ok((response, target.clone()))
            }
            Ok(Err(status)) => {
                let failure = Failure::from_status(&status);
                if !matches!(failure, Failure::Answered(_)) {
                    // Reconnect eagerly next time, so that a connect failure
                    // is recognised as one.
                    client.evict(target);
                }
                Err(at(failure, target))
            }
            Err(_elapsed) => Err(Failure::NoAnswer(format!(
                "no answer from {target} within {} ms",
                limit.as_millis()
            ))),
        }
    }

    fn move_on(&mut self, failure: &Failure, leader: Option<&LeaderHint>) -> bool {
        let hinted = leader
            .and_then(|hint| hint.client_address.as_deref())
            .and_then(|a| endpoint_uri(a).ok())
            .filter(|a| *a != self.target);
        // NotLeader without a usable hint: an election may be under way.
        let no_hint = hinted.is_none()
            && matches!(failure, Failure::Answered(e) if e.kind() == cairn_proto::v1::ErrorKind::NotLeader);
        self.target = hinted.unwrap_or_else(|| self.route.next());
        self.route.failed() || no_hint
    }
}

/// The failure with the endpoint it happened at (a node's answer names itself).
fn at(failure: Failure, target: &str) -> Failure {
    match failure {
        Failure::NotSent(m) => Failure::NotSent(format!("{target}: {m}")),
        Failure::Lost(m) => Failure::Lost(format!("{target}: {m}")),
        Failure::NoAnswer(m) => Failure::NoAnswer(format!("waiting for {target}: {m}")),
        Failure::TooLarge(m) => Failure::TooLarge(format!("{target}: {m}")),
        Failure::Foreign(m) => Failure::Foreign(format!("{target}: {m}")),
        answered => answered,
    }
}

/// The error a caller gets when the loop ended without an answer. A read that ran out of
/// time while the nodes answered Inconsistent (no read index could be confirmed) gets
/// Inconsistent, as the nodes answer it: never a stale read, and more telling than the
/// deadline.
fn call_error(ended: Ended, timeout: Duration) -> ClientError {
    let deadline_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    let (failure, outcome) = match ended {
        Ended::OutOfTime {
            last: Some(Failure::Answered(api @ ApiError::Inconsistent(_))),
        } => return ClientError::from_api(api, Outcome::NotApplied),
        Ended::OutOfTime { last } => {
            return ClientError::DeadlineExceeded {
                deadline_ms,
                detail: last.map_or_else(|| "no endpoint tried".to_string(), |f| f.to_string()),
                outcome: Outcome::NotApplied,
            }
        }
        Ended::Stopped { failure, outcome } => (failure, outcome),
    };
    match failure {
        Failure::Answered(api) => ClientError::from_api(api, outcome),
        Failure::NotSent(message) | Failure::Lost(message) => {
            ClientError::Unavailable { message, outcome }
        }
        Failure::NoAnswer(detail) => ClientError::DeadlineExceeded {
            deadline_ms,
            detail,
            outcome,
        },
        // Over a message size limit: the same at every node.
        Failure::TooLarge(reason) if outcome.is_definite() => ClientError::ResourceExhausted {
            limit: String::new(),
            value: 0,
            reason,
        },
        Failure::TooLarge(message) | Failure::Foreign(message) => {
            ClientError::Internal { message, outcome }
        }
    }
}

/// What one attempt returns.
type Answer<T> = Result<tonic::Response<T>, tonic::Status>;

fn unexpected(what: &str) -> ClientError {
    ClientError::Internal {
        message: what.to_string(),
        outcome: Outcome::NotApplied,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_normalised_to_uris_and_bad_ones_rejected() {
        // host:port gains http://; a URI stays; empty and garbage are InvalidArgument.
        assert_eq!(
            endpoint_uri("127.0.0.1:7001").ok(),
            Some("http://127.0.0.1:7001".into())
        );
        assert_eq!(endpoint_uri(" http://h:1 ").ok(), Some("http://h:1".into()));
        assert!(matches!(
            endpoint_uri(""),
            Err(ClientError::InvalidArgument { .. })
        ));
        assert!(matches!(
            endpoint_uri("a b:c"),
            Err(ClientError::InvalidArgument { .. })
        ));
        assert!(matches!(
            Client::new::<&str>(&[], ClientOptions::default()),
            Err(ClientError::InvalidArgument { .. })
        ));
    }

    #[test]
    fn a_call_out_of_time_after_inconsistent_answers_is_inconsistent() {
        // A strong read on a node cut off from its leader: every attempt answered
        // Inconsistent until the deadline. The caller gets Inconsistent, not the deadline.
        let timeout = Duration::from_secs(3);
        let after_inconsistent = Ended::OutOfTime {
            last: Some(Failure::Answered(ApiError::Inconsistent(
                "no read index".into(),
            ))),
        };
        match call_error(after_inconsistent, timeout) {
            ClientError::Inconsistent { outcome, .. } => assert_eq!(outcome, Outcome::NotApplied),
            other => panic!("expected Inconsistent, got {other:?}"),
        }
        let after_no_answer = Ended::OutOfTime {
            last: Some(Failure::NoAnswer("slow".into())),
        };
        assert!(matches!(
            call_error(after_no_answer, timeout),
            ClientError::DeadlineExceeded { .. }
        ));
    }

    #[test]
    fn a_route_starts_at_the_preferred_endpoint_and_cycles_the_list() {
        // Preferred first, then the list round-robin; a full round of failures asks for a pause.
        let list: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let (mut route, first) = Route::new(&list, "b");
        assert_eq!(first, "b");
        assert_eq!(route.next(), "c");
        assert_eq!(route.next(), "a");
        assert!(!route.failed());
        assert!(!route.failed());
        assert!(route.failed());
        let (mut route, first) = Route::new(&list, "hint");
        assert_eq!(first, "hint");
        assert_eq!(route.next(), "a");
    }
}
