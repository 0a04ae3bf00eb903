//! The web console: a read-only page on the ops listener (`/ui`), and the JSON it polls
//! (`/ui/api/...`).
//!
//! **What it does.** One static HTML file with inline CSS and a little vanilla JavaScript
//! (`page.html`, compiled into the binary; no build step) shows, from whichever node's ops
//! listener it is opened on:
//! - the cluster: members, roles, terms, commit and applied indexes, lag and last contact,
//!   alarms ([`GET /ui/api/cluster`](Console::cluster)): this node's own status, and the
//!   status of every member it knows, asked on their client ports with this node's own
//!   credentials, as `cairn status` asks them ([`view::cluster_view`] decides the picture);
//! - resources per type and tenancy ([`GET /ui/api/types`](Console::types)), a listing
//!   ([`GET /ui/api/resources`](Console::resources)) and one resource as JSON
//!   ([`GET /ui/api/resource`](Console::resource)), as this node has applied them;
//! - a live tail of one type's changes ([`GET /ui/api/watch`](Console::watch)), as
//!   newline-delimited JSON streamed over one response;
//! - the newest drill reports `cairn drill` stored ([`GET /ui/api/drills`](Console::drills)).
//!
//! **What it must not do.** Write anything: there is no write path, every route is a GET.
//! Decide an authorization of its own: every `/ui/api/` call is authenticated by the
//! client port's [`Authenticator`] (the `Authorization: Bearer` header stands for the gRPC
//! metadata of the same name) and authorized by [`authorize`] for the [`Action`] the same
//! request would be on the client port; lists, counts and watch events show only what
//! [`Visibility`](crate::auth::Visibility) shows. Validate an identifier its own way:
//! requests are checked by the API's validation (`Executor::check_*`), with the field
//! mapped to the query parameter.
//!
//! **Order of a call**, as on the client port: authenticate (an unknown caller learns
//! nothing of its request), parse and validate the parameters (400 naming the parameter),
//! authorize (403 naming the missing permission), wait for the caller's turn at its rates
//! (the grant's `requests_per_second` and `bytes_per_second`, else the node's; 429 naming
//! the limit when the wait would pass `client_rate_wait_ms_max`), then serve. Opening a
//! tail is bounded by the stream limits instead, as opening a WatchList is. Errors are the
//! API's [`ApiError`]s, turned into HTTP statuses in one place ([`status_of`]) with a JSON
//! body ([`view::error_json`]).
//!
//! **Off**: with `web_console = "off"` the ops listener serves [`off_router`] instead: every
//! `/ui` path answers 404 saying the console is off.
//!
//! ## Invariants
//! - With grants configured, no `/ui/api/` answer is given without a known token, and
//!   none shows a resource (or a count of resources) outside the caller's read scope. The
//!   page itself (`/ui`) holds no data and is served to anyone.
//! - With no grants configured but client certificates required on the client port, the
//!   console serves no data: plain HTTP cannot present a certificate, so serving would open
//!   what the client port closes.
//! - Everything is bounded: a listing at [`query::RESOURCES_LIMIT_MAX`] resources, counts at
//!   [`TYPE_COUNTS_MAX`], drill reports at [`DRILLS_MAX`] of at most [`DRILL_PAGES_MAX`]
//!   pages, a query string at [`query::QUERY_BYTES_MAX`], console watch streams at
//!   [`WATCH_STREAMS_MAX`] per node (more are refused with 429) each for at most
//!   [`WATCH_STREAM_DURATION_MAX`], and the cluster is asked at most once per
//!   [`CLUSTER_VIEW_FRESH`] however many pages poll it (each member within
//!   [`MEMBER_STATUS_TIMEOUT`]).
//! - Nothing from the network panics: a bad query, a header that is not ASCII, bytes that
//!   do not decode are all answered as errors.

pub mod query;
pub mod view;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use cairn_forwarding::WatchStream;
use cairn_proto::error::{ApiError, ErrorKind};
use cairn_proto::v1::{self as pb, shared};
use futures::StreamExt as _;
use serde_json::{json, Value};
use tokio::sync::{Mutex, Semaphore};
use tokio::time::Instant;

use crate::admin::Admin;
use crate::auth::{authorize, Action, AdminOperation, Authenticator, Caller};
use crate::service::ResourceApi;
use view::MemberAnswer;

/// The page, compiled in.
const PAGE: &str = include_str!("page.html");

/// The most (type, tenancy) counts one answer holds.
pub const TYPE_COUNTS_MAX: usize = 1000;
/// The most drill reports one answer holds (the newest), and the most pages of
/// [`query::RESOURCES_LIMIT_MAX`] reports read to find them.
pub const DRILLS_MAX: usize = 50;
pub const DRILL_PAGES_MAX: usize = 10;
/// The most console watch streams one node serves at once.
pub const WATCH_STREAMS_MAX: usize = 8;
/// How long one console watch stream lasts; the page opens another after it.
pub const WATCH_STREAM_DURATION_MAX: Duration = Duration::from_secs(600);
/// How often an idle watch stream sends a keep-alive line (which also finds a closed
/// connection).
const WATCH_KEEPALIVE: Duration = Duration::from_secs(15);
/// How long a cluster view is served to every page before the members are asked again.
pub const CLUSTER_VIEW_FRESH: Duration = Duration::from_millis(800);
/// How long one member gets to answer its status.
pub const MEMBER_STATUS_TIMEOUT: Duration = Duration::from_millis(1000);
/// How long a listing or a read gets.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What the console's handlers need: shared by every request of the ops listener.
#[derive(Clone)]
pub struct Console(Arc<Inner>);

struct Inner {
    /// This node's status, and how it reaches other nodes' client ports (TLS, its token).
    admin: Admin,
    api: Arc<ResourceApi>,
    auth: Arc<Authenticator>,
    /// `tls_client_auth = "required"` on the client port.
    client_certificates_required: bool,
    streams: Arc<Semaphore>,
    /// The last cluster view and when it was made; the lock makes one collection serve
    /// every page that asks meanwhile.
    cluster: Mutex<Option<(Instant, Arc<view::ClusterView>)>>,
}

impl Console {
    pub fn new(
        admin: Admin,
        api: Arc<ResourceApi>,
        auth: Arc<Authenticator>,
        client_certificates_required: bool,
    ) -> Console {
        Console(Arc::new(Inner {
            admin,
            api,
            auth,
            client_certificates_required,
            streams: Arc::new(Semaphore::new(WATCH_STREAMS_MAX)),
            cluster: Mutex::new(None),
        }))
    }

    /// The console's routes, to merge into the ops listener's.
    pub fn router(self) -> axum::Router {
        axum::Router::new()
            .route("/ui", get(page))
            .route("/ui/", get(page))
            .route("/ui/api/cluster", get(cluster))
            .route("/ui/api/types", get(types))
            .route("/ui/api/resources", get(resources))
            .route("/ui/api/resource", get(resource))
            .route("/ui/api/watch", get(watch))
            .route("/ui/api/drills", get(drills))
            .route("/ui/api/{*rest}", get(no_endpoint))
            .with_state(self)
    }

    /// The caller of a console request: the client port's authentication, with the
    /// request's `Authorization` header as the gRPC `authorization` metadata (and no
    /// client certificate: the ops listener is plain HTTP).
    fn caller(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        self.refuse_when_certificates_required()?;
        self.0.auth.caller(&as_grpc_request(headers))
    }

    /// Waits for `caller`'s turn at its rates, as a request of the client port does once
    /// authorized ([`ResourceApi::pace`]: a grant's own rates, else the node's); with
    /// authentication off, the console's callers share one turn. Refused
    /// RESOURCE_EXHAUSTED (429) naming the limit when the wait would be too long. Returns
    /// the call's deadline ([`REQUEST_TIMEOUT`] from its start), which the wait counted
    /// against.
    async fn paced(&self, caller: &Caller, raw: Option<&str>) -> Result<Instant, ApiError> {
        let deadline = self.0.api.deadline_within(Some(REQUEST_TIMEOUT));
        let bytes = raw.map_or(0, str::len) as u64;
        self.0
            .api
            .pace(caller, || "the web console".to_string(), bytes, deadline)
            .await?;
        Ok(deadline)
    }

    fn refuse_when_certificates_required(&self) -> Result<(), ApiError> {
        if self.0.client_certificates_required && !self.0.auth.current().is_enabled() {
            return Err(ApiError::Unauthenticated(
                "the client port requires a client certificate and no grant is configured: \
                 the console (plain HTTP) cannot present one, so it serves nothing. Configure \
                 [[auth.grants]] with tokens to use it (docs/security.md)"
                    .into(),
            ));
        }
        Ok(())
    }

    fn executor(&self) -> &cairn_forwarding::Executor<crate::forward::NodeHandle> {
        self.0.api.forwarder().executor()
    }

    /// `GET /ui/api/cluster`: the cluster view ([`view::ClusterView`]). Needs what `cairn
    /// status` needs: the admin role.
    pub async fn cluster(&self, headers: &HeaderMap, raw: Option<&str>) -> Result<Value, ApiError> {
        let caller = self.caller(headers)?;
        query::parse(raw, &[])?;
        authorize(&caller, &Action::Admin(AdminOperation::Status))?;
        self.paced(&caller, raw).await?;
        let view = self.cluster_view().await;
        serde_json::to_value(&*view).map_err(|e| ApiError::Internal(format!("{e}")))
    }

    /// The cluster view, made at most once per [`CLUSTER_VIEW_FRESH`].
    async fn cluster_view(&self) -> Arc<view::ClusterView> {
        let mut cached = self.0.cluster.lock().await;
        if let Some((made, view)) = cached.as_ref() {
            if made.elapsed() < CLUSTER_VIEW_FRESH {
                return view.clone();
            }
        }
        let view = Arc::new(self.collect_cluster().await);
        *cached = Some((Instant::now(), view.clone()));
        view
    }

    /// Asks every member this node knows for its status (itself without a call), each
    /// within [`MEMBER_STATUS_TIMEOUT`], concurrently.
    async fn collect_cluster(&self) -> view::ClusterView {
        let own = self.0.admin.status().await;
        let members = if own.members.is_empty() {
            // Not in a cluster yet: only itself to show.
            vec![pb::Member {
                id: own.node_id,
                client_address: "(this node)".into(),
                ..pb::Member::default()
            }]
        } else {
            own.members.clone()
        };
        let client = cairn_client::admin::AdminClient::new(
            Vec::new(),
            self.0.admin.access.clone(),
            MEMBER_STATUS_TIMEOUT,
        );
        let answers = futures::future::join_all(members.into_iter().map(|member| {
            let own = &own;
            let client = &client;
            async move {
                let status = if member.id == own.node_id {
                    Ok(own.clone())
                } else {
                    match client.status_at(&member.client_address).await {
                        Ok(s) if s.node_id != member.id => Err(format!(
                            "{} answers as node {}, not node {}",
                            member.client_address, s.node_id, member.id
                        )),
                        Ok(s) => Ok(s),
                        Err(e) => Err(e.to_string()),
                    }
                };
                MemberAnswer { member, status }
            }
        }))
        .await;
        view::cluster_view(own.node_id, &answers)
    }

    /// `GET /ui/api/types`: how many resources of each type each tenancy holds on this
    /// node, of those the caller may read. Needs read on some type (as ListByOwner, the
    /// other request over every type).
    pub async fn types(&self, headers: &HeaderMap, raw: Option<&str>) -> Result<Value, ApiError> {
        let caller = self.caller(headers)?;
        query::parse(raw, &[])?;
        let visibility = authorize(&caller, &Action::ListByOwner)?;
        self.paced(&caller, raw).await?;
        let table = self.0.admin.raft.store.view();
        let usage = table
            .usage_by_type()
            .into_iter()
            .filter(|(_, usage)| usage.count > 0)
            .map(|(key, usage)| (key, usage.count));
        let (types, truncated) = view::type_counts(
            usage,
            visibility.read_scope().map(|s| &**s),
            TYPE_COUNTS_MAX,
        );
        Ok(json!({
            "node_id": self.0.admin.raft.node_id,
            "revision": table.revision(),
            "types": types,
            "truncated": truncated,
            "limit": TYPE_COUNTS_MAX,
        }))
    }

    /// `GET /ui/api/resources`: one page of a listing ([`query::list_request`]); each
    /// resource summarized ([`view::resource_summary`]); `truncated` when more match.
    pub async fn resources(
        &self,
        headers: &HeaderMap,
        raw: Option<&str>,
    ) -> Result<Value, ApiError> {
        let caller = self.caller(headers)?;
        let params = query::parse(raw, query::LIST_PARAMETERS)?;
        let request = query::list_request(&params)?;
        self.executor()
            .check_list(&request)
            .map_err(query::in_parameters)?;
        let (type_, tenancy) = (
            request.r#type.clone().unwrap_or_default(),
            request.tenancy.clone().unwrap_or_default(),
        );
        let visibility = authorize(
            &caller,
            &Action::List {
                type_: &type_,
                tenancy: &tenancy,
            },
        )?;
        let deadline = self.paced(&caller, raw).await?;
        let limit = request.limit;
        let page = self
            .0
            .api
            .list(request, visibility.read_scope().cloned(), deadline)
            .await?;
        let resources: Vec<Value> = page
            .resources
            .iter()
            .map(|encoded| match view::decode_resource(encoded) {
                Ok(r) => view::resource_summary(&r),
                Err(why) => json!({ "undecodable": why }),
            })
            .collect();
        Ok(json!({
            "revision": page.revision,
            "resources": resources,
            "truncated": !page.next_page_token.is_empty(),
            "limit": limit,
        }))
    }

    /// `GET /ui/api/resource`: one resource, whole ([`view::resource_json`]).
    pub async fn resource(
        &self,
        headers: &HeaderMap,
        raw: Option<&str>,
    ) -> Result<Value, ApiError> {
        let caller = self.caller(headers)?;
        let params = query::parse(raw, query::READ_PARAMETERS)?;
        let request = query::read_request(&params);
        self.executor()
            .check_read(&request)
            .map_err(query::in_parameters)?;
        let id = request.id.clone().unwrap_or_default();
        let (type_, tenancy) = (
            id.r#type.unwrap_or_default(),
            id.tenancy.unwrap_or_default(),
        );
        authorize(
            &caller,
            &Action::Read {
                type_: &type_,
                tenancy: &tenancy,
            },
        )?;
        let deadline = self.paced(&caller, raw).await?;
        let answer = self.0.api.read(request, deadline).await?;
        let encoded = answer.resource.ok_or(ApiError::NotFound)?;
        let resource = view::decode_resource(&encoded).map_err(ApiError::Internal)?;
        Ok(json!({
            "revision": answer.revision,
            "resource": view::resource_json(&resource),
        }))
    }

    /// `GET /ui/api/drills`: the newest [`DRILLS_MAX`] drill reports, newest first
    /// ([`view::drill_row`]). Needs read on `cairn.DrillReport` in `default/default`.
    pub async fn drills(&self, headers: &HeaderMap, raw: Option<&str>) -> Result<Value, ApiError> {
        let caller = self.caller(headers)?;
        query::parse(raw, &[])?;
        let (type_, tenancy) = (
            cairn_proto::drill_report::report_type(),
            cairn_proto::drill_report::tenancy(),
        );
        let visibility = authorize(
            &caller,
            &Action::List {
                type_: &type_,
                tenancy: &tenancy,
            },
        )?;
        let deadline = self.paced(&caller, raw).await?;
        let mut rows = Vec::new();
        let mut page_token = String::new();
        let mut revision = 0;
        for _ in 0..DRILL_PAGES_MAX {
            let page = self
                .0
                .api
                .list(
                    pb::ListRequest {
                        r#type: Some(type_.clone()),
                        tenancy: Some(tenancy.clone()),
                        consistency: pb::Consistency::Eventual as i32,
                        limit: query::RESOURCES_LIMIT_MAX,
                        page_token: std::mem::take(&mut page_token),
                        ..pb::ListRequest::default()
                    },
                    visibility.read_scope().cloned(),
                    deadline,
                )
                .await?;
            revision = page.revision;
            rows = view::newest_first(
                rows.into_iter()
                    .rev()
                    .chain(page.resources.iter().map(|encoded| {
                        match view::decode_resource(encoded) {
                            Ok(r) => view::drill_row(&r),
                            Err(why) => view::DrillRow {
                                unreadable: Some(why),
                                ..view::DrillRow::default()
                            },
                        }
                    })),
                DRILLS_MAX,
            );
            page_token = page.next_page_token;
            if page_token.is_empty() {
                break;
            }
        }
        Ok(json!({
            "revision": revision,
            "drills": rows,
            "truncated": !page_token.is_empty(),
            "reports_read_max": DRILL_PAGES_MAX * query::RESOURCES_LIMIT_MAX as usize,
        }))
    }

    /// `GET /ui/api/watch`: opens a tail ([`query::watch_request`]) as the client port
    /// opens a WatchList: authenticated, validated, authorized by a guard decided again at
    /// every reload of the grants, events filtered by the caller's read scope, within the
    /// node's `watches_max`; and within [`WATCH_STREAMS_MAX`] console streams.
    pub async fn watch(
        &self,
        headers: &HeaderMap,
        raw: Option<&str>,
    ) -> Result<WatchStream, ApiError> {
        self.refuse_when_certificates_required()?;
        let caller = self.0.auth.watch_caller(&as_grpc_request(headers))?;
        let params = query::parse(raw, query::WATCH_PARAMETERS)?;
        let now = self.0.admin.raft.store.view().revision();
        let request = query::watch_request(&params, now)?;
        self.executor()
            .check_watch(&request)
            .map_err(query::in_parameters)?;
        let (type_, tenancy) = (
            request.r#type.clone().unwrap_or_default(),
            request.tenancy.clone().unwrap_or_default(),
        );
        let guard = caller.authorize(&type_, &tenancy)?;
        let permit = self.0.streams.clone().try_acquire_owned().map_err(|_| {
            ApiError::ResourceExhausted {
                limit: "console watch streams per node".into(),
                value: WATCH_STREAMS_MAX as u64,
                reason: format!(
                    "{WATCH_STREAMS_MAX} console watch streams are open on this node, the most \
                     it serves: close a tail (in another tab?) and try again"
                ),
            }
        })?;
        let deadline = self.0.api.deadline_within(Some(REQUEST_TIMEOUT));
        let opened = self
            .0
            .api
            .watch(request, guard.visibility().clone(), None, deadline)
            .await?;
        let events = crate::auth::close_when_revoked(opened.events, guard);
        Ok(Box::pin(events.map(move |event| {
            let _held = &permit;
            event
        })))
    }
}

/// The request the client port's authentication reads: the `Authorization` header as the
/// gRPC `authorization` metadata, and nothing else.
fn as_grpc_request(headers: &HeaderMap) -> tonic::Request<()> {
    let mut only = HeaderMap::new();
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        only.insert(header::AUTHORIZATION, value.clone());
    }
    tonic::Request::from_parts(
        tonic::metadata::MetadataMap::from_headers(only),
        tonic::Extensions::default(),
        (),
    )
}

/// The HTTP status of each error kind: the one mapping of the console.
pub fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::InvalidArgument => StatusCode::BAD_REQUEST,
        ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::GroupVersionMismatch
        | ErrorKind::CasFailure
        | ErrorKind::WrongUid
        | ErrorKind::WatchClosed
        | ErrorKind::FailedPrecondition => StatusCode::CONFLICT,
        ErrorKind::Compacted => StatusCode::GONE,
        ErrorKind::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Unavailable | ErrorKind::NotLeader | ErrorKind::Inconsistent => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        ErrorKind::Internal | ErrorKind::Unspecified => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn json_bytes(value: &Value) -> Bytes {
    // A `Value` always serializes.
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

fn json_response(status: StatusCode, value: &Value) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        json_bytes(value),
    )
        .into_response()
}

/// An answer: the JSON, or the refusal with its status ([`status_of`]) and body.
fn respond(answer: Result<Value, ApiError>) -> Response {
    match answer {
        Ok(value) => json_response(StatusCode::OK, &value),
        Err(error) => refusal(&error),
    }
}

fn refusal(error: &ApiError) -> Response {
    let mut response = json_response(status_of(error.kind()), &view::error_json(error));
    if error.kind() == ErrorKind::Unauthenticated {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"cairn\""),
        );
    }
    response
}

async fn page() -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::REFERRER_POLICY, "no-referrer"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
                 frame-ancestors 'none'",
            ),
        ],
        PAGE,
    )
        .into_response()
}

async fn cluster(
    State(console): State<Console>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    respond(console.cluster(&headers, raw.as_deref()).await)
}

async fn types(
    State(console): State<Console>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    respond(console.types(&headers, raw.as_deref()).await)
}

async fn resources(
    State(console): State<Console>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    respond(console.resources(&headers, raw.as_deref()).await)
}

async fn resource(
    State(console): State<Console>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    respond(console.resource(&headers, raw.as_deref()).await)
}

async fn drills(
    State(console): State<Console>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    respond(console.drills(&headers, raw.as_deref()).await)
}

/// The console's routes on a node whose console is off (`web_console = "off"`): every
/// `/ui` path answers 404, saying so and how to turn it on.
pub fn off_router() -> axum::Router {
    axum::Router::new()
        .route("/ui", get(console_off))
        .route("/ui/", get(console_off))
        .route("/ui/{*rest}", get(console_off))
}

async fn console_off() -> Response {
    not_found(
        "the web console is off on this node (web_console = \"off\"); /metrics, /livez and \
         /readyz are served",
    )
}

async fn no_endpoint() -> Response {
    not_found(
        "no such console endpoint: /ui/api/ has cluster, types, resources, resource, watch \
         and drills",
    )
}

/// A 404 for a path the console does not serve, saying why.
fn not_found(message: &str) -> Response {
    json_response(
        status_of(ErrorKind::NotFound),
        &view::error_body(ErrorKind::NotFound, message, None),
    )
}

async fn watch(
    State(console): State<Console>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let events = match console.watch(&headers, raw.as_deref()).await {
        Ok(events) => events,
        Err(error) => return refusal(&error),
    };
    let body = axum::body::Body::from_stream(tail_lines(events));
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (header::CACHE_CONTROL, "no-store"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// One line of a tail: a JSON object and a newline.
fn line(value: &Value) -> Result<Bytes, Infallible> {
    let mut bytes = serde_json::to_vec(value).unwrap_or_default();
    bytes.push(b'\n');
    Ok(Bytes::from(bytes))
}

/// The line of one watch event ([`view::resource_json`] for a change).
pub fn event_json(event: &shared::WatchEvent) -> Value {
    use shared::watch_event::Event;
    let change = |kind: &str, resource: &Option<Bytes>| {
        let shown = match resource.as_deref().map(view::decode_resource) {
            Some(Ok(r)) => view::resource_json(&r),
            Some(Err(why)) => json!({ "undecodable": why }),
            None => Value::Null,
        };
        json!({"type": kind, "revision": event.revision, "resource": shown})
    };
    match &event.event {
        Some(Event::Upsert(u)) => change("upsert", &u.resource),
        Some(Event::Delete(d)) => change("delete", &d.resource),
        Some(Event::EndOfSnapshot(_)) => {
            json!({"type": "end_of_snapshot", "revision": event.revision})
        }
        Some(Event::Progress(_)) | None => json!({"type": "progress", "revision": event.revision}),
    }
}

/// The lines of a tail: `open`, then one line per event, a `keepalive` line every
/// [`WATCH_KEEPALIVE`] of silence, and a last line (`error` or `end`) when the watch ends,
/// fails, or has lasted [`WATCH_STREAM_DURATION_MAX`].
fn tail_lines(
    events: WatchStream,
) -> impl futures::Stream<Item = Result<Bytes, Infallible>> + Send {
    struct Tail {
        events: WatchStream,
        keepalive: tokio::time::Interval,
        ends_at: Instant,
        opened: bool,
        ended: bool,
    }
    let tail = Tail {
        events,
        keepalive: tokio::time::interval_at(Instant::now() + WATCH_KEEPALIVE, WATCH_KEEPALIVE),
        ends_at: Instant::now() + WATCH_STREAM_DURATION_MAX,
        opened: false,
        ended: false,
    };
    futures::stream::unfold(tail, |mut tail| async move {
        if tail.ended {
            return None;
        }
        if !tail.opened {
            tail.opened = true;
            return Some((line(&json!({"type": "open"})), tail));
        }
        let value = tokio::select! {
            event = tail.events.next() => match event {
                Some(Ok(event)) => {
                    tail.keepalive.reset();
                    event_json(&event)
                }
                Some(Err(error)) => {
                    tail.ended = true;
                    let mut value = view::error_json(&error);
                    value["type"] = json!("error");
                    value
                }
                None => {
                    tail.ended = true;
                    json!({"type": "end", "reason": "the watch ended"})
                }
            },
            _ = tail.keepalive.tick() => json!({"type": "keepalive"}),
            () = tokio::time::sleep_until(tail.ends_at) => {
                tail.ended = true;
                json!({"type": "end", "reason": format!(
                    "a console watch stream lasts at most {} s: open another",
                    WATCH_STREAM_DURATION_MAX.as_secs()
                )})
            }
        };
        Some((line(&value), tail))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_kind_has_one_http_status() {
        use ErrorKind::*;
        let table = [
            (InvalidArgument, 400),
            (Unauthenticated, 401),
            (PermissionDenied, 403),
            (NotFound, 404),
            (GroupVersionMismatch, 409),
            (CasFailure, 409),
            (WrongUid, 409),
            (WatchClosed, 409),
            (FailedPrecondition, 409),
            (Compacted, 410),
            (ResourceExhausted, 429),
            (Unavailable, 503),
            (NotLeader, 503),
            (Inconsistent, 503),
            (Internal, 500),
            (Unspecified, 500),
        ];
        for (kind, status) in table {
            assert_eq!(status_of(kind).as_u16(), status, "{kind:?}");
        }
    }

    #[test]
    fn only_the_authorization_header_reaches_authentication() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer t0k3n"),
        );
        headers.insert("grpc-timeout", HeaderValue::from_static("1S"));
        let request = as_grpc_request(&headers);
        assert_eq!(
            request
                .metadata()
                .get("authorization")
                .unwrap()
                .to_str()
                .unwrap(),
            "Bearer t0k3n"
        );
        assert!(request.metadata().get("grpc-timeout").is_none());
        let request = as_grpc_request(&HeaderMap::new());
        assert!(request.metadata().get("authorization").is_none());
    }

    #[test]
    fn a_token_is_decided_by_the_client_ports_table() {
        use crate::config::{AuthConfig, GrantConfig};
        let token = "cairn-console-test-token";
        let table = crate::auth::GrantTable::from_config(&AuthConfig {
            grants: vec![GrantConfig {
                name: "admin".into(),
                token_sha256: Some(crate::auth::token_sha256_hex(token)),
                admin: true,
                ..GrantConfig::default()
            }],
            ..AuthConfig::default()
        })
        .unwrap();
        let auth = Authenticator::new(table);
        let with = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, HeaderValue::from_static(value));
            auth.caller(&as_grpc_request(&headers))
        };
        assert!(matches!(
            with("Bearer cairn-console-test-token"),
            Ok(Caller::Granted(_))
        ));
        assert!(matches!(
            with("bearer cairn-console-test-token"),
            Ok(Caller::Granted(_))
        ));
        for bad in [
            "Bearer wrong",
            "Basic abc",
            "cairn-console-test-token",
            "Bearer ",
        ] {
            assert!(
                matches!(with(bad), Err(ApiError::Unauthenticated(_))),
                "{bad}"
            );
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_bytes(b"Bearer \xe9t\xe9").unwrap(),
        );
        assert!(matches!(
            auth.caller(&as_grpc_request(&headers)),
            Err(ApiError::Unauthenticated(_))
        ));
        assert!(matches!(
            auth.caller(&as_grpc_request(&HeaderMap::new())),
            Err(ApiError::Unauthenticated(_))
        ));
    }

    #[test]
    fn watch_events_become_lines() {
        use shared::watch_event::{Event, Progress, Upsert};
        let resource = pb::Resource {
            id: Some(pb::Id {
                name: "web".into(),
                ..Default::default()
            }),
            version: "5".into(),
            ..Default::default()
        };
        let upsert = shared::WatchEvent {
            event: Some(Event::Upsert(Upsert {
                resource: Some(Bytes::from(prost::Message::encode_to_vec(&resource))),
            })),
            revision: 5,
        };
        let shown = event_json(&upsert);
        assert_eq!(shown["type"], "upsert");
        assert_eq!(shown["revision"], 5);
        assert_eq!(shown["resource"]["id"]["name"], "web");
        let garbage = shared::WatchEvent {
            event: Some(Event::Upsert(Upsert {
                resource: Some(Bytes::from_static(&[0xff, 0xff])),
            })),
            revision: 6,
        };
        assert!(event_json(&garbage)["resource"]["undecodable"].is_string());
        let progress = shared::WatchEvent {
            event: Some(Event::Progress(Progress {})),
            revision: 7,
        };
        assert_eq!(event_json(&progress)["type"], "progress");
    }
}
