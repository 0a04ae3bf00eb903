//! `ResourceService` on the client port: a thin shell over
//! `cairn_forwarding::Forwarder`, which validates and executes every request
//! (the one place that does): eventual reads and lists, ListByOwner and
//! watches from the local table; writes and deletes through Raft here on the
//! leader, forwarded to the leader from a follower; strong reads, strong lists
//! and strong watches from the local table after a read index confirmed by a
//! quorum (through the leader, on a follower) and applied here, or, with
//! `follower_strong_reads = "forward"`, strong reads and lists at the leader.
//! Strong requests never degrade to a plain local read.
//!
//! Before anything else, every call is authenticated and authorized here,
//! on the node the client talks to ([`crate::auth`]): the caller is
//! authenticated first (an unknown caller learns nothing about its request,
//! not even which field is malformed), then the request is validated (so
//! that malformed input is INVALID_ARGUMENT naming its field), then checked
//! against the caller's grant, and only then executed or forwarded.
//! Lists and ListByOwner carry the caller's read scope to the executor, on
//! this node or, with a forwarded strong list, on the leader: only what the
//! caller may see is listed and counted (against a List page's
//! `list_page_size_max`, or ListByOwner's `list_results_max`), so neither a
//! page's end nor a refusal says anything of what lies outside. Watch events are filtered
//! here, so nothing outside the caller's read scope leaves this node. An
//! open watch is decided again whenever the
//! grants are reloaded, and ends when its caller's grant changed
//! (`auth::close_when_revoked`).
//!
//! Answers carry each resource as the bytes the store keeps
//! ([`cairn_fsm::StoredResource`]): the service is
//! `cairn_proto::v1::shared::resource_service_server`, which answers on the
//! public routes with messages wire-identical to the public ones but whose
//! resource fields are those bytes. Nothing is decoded or encoded again per
//! request or per watcher; the filter above reads type and tenancy from the
//! bytes.
//!
//! Otherwise this shell only turns each call's deadline (the client's `grpc-timeout`,
//! less a margin so that the answer beats the client's own cancellation,
//! capped by the node's request timeout) into an instant, and errors into
//! statuses through `ApiError`.
//!
//! What runs once a caller is admitted is [`ResourceApi`]'s, and serves two
//! callers: this gRPC shell (after authentication and authorization) and the
//! in-process client of an embedded node ([`crate::embed`], a trusted caller
//! that sees everything). Both get the same validation, forwarding,
//! `follower_strong_reads`, node-wide watch budget (`watches_max`) and
//! test-only switches, from the one piece.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use cairn_forwarding::{Executor, Forwarder, OpenedWatch, WatchStream};
use cairn_proto::error::ApiError;
use cairn_proto::v1::shared::resource_service_server::ResourceService;
use cairn_proto::v1::{self as pb, shared};
use futures::{Stream, StreamExt as _};
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::auth::{authorize, Action, Authenticator, Visibility};
use crate::connections::ConnectionInfo;
use crate::forward::NodeHandle;

pub struct ResourceApi {
    forwarder: Forwarder<NodeHandle>,
    auth: Arc<Authenticator>,
    request_timeout: Duration,
    /// Watches per connection and per node.
    connection_limits: Option<Arc<crate::limits::ConnectionLimits>>,
    /// Who opened each watch open over gRPC on this node (its caller's
    /// principal): WatchProgress reaches only the watches its own caller opened.
    watch_openers: Arc<WatchOpeners>,
    /// DANGEROUS, test-only switches: `--unsafe-local-strong-reads` (strong reads and
    /// lists are answered as eventual ones, from this node's possibly stale state) and
    /// `--unsafe-drop-watch-events N` (every Nth change of each watch stream is dropped).
    unsafe_modes: crate::config::UnsafeModes,
    /// Rate limits per caller and fair write slots (`None`: neither, as for the
    /// in-process client).
    fairness: Option<(Arc<crate::fairness::Fairness>, crate::fairness::Rates)>,
    /// Becomes true when the node stops: every stream held open for a caller then ends
    /// (`None`: never, as for the in-process client).
    stopped: Option<tokio::sync::watch::Receiver<bool>>,
}

impl ResourceApi {
    pub fn new(
        forwarder: Forwarder<NodeHandle>,
        auth: Arc<Authenticator>,
        request_timeout: Duration,
    ) -> ResourceApi {
        ResourceApi {
            forwarder,
            auth,
            request_timeout,
            connection_limits: None,
            watch_openers: Arc::default(),
            unsafe_modes: crate::config::UnsafeModes::default(),
            fairness: None,
            stopped: None,
        }
    }

    /// Ends the streams held open for callers (watches, lease keep-alives) once `stopped`
    /// turns true, so that they do not hold the node's shutdown.
    pub fn with_stop(mut self, stopped: tokio::sync::watch::Receiver<bool>) -> ResourceApi {
        self.stopped = Some(stopped);
        self
    }

    /// `stream`, ended with `last` once the node stops ([`crate::tasks::end_when_stopped`]).
    pub fn ending_at_stop<T: Send + 'static, E: Send + 'static>(
        &self,
        stream: impl Stream<Item = Result<T, E>> + Send + 'static,
        last: E,
    ) -> crate::tasks::HeldStream<T, E> {
        crate::tasks::end_when_stopped(stream, self.stopped.clone(), last)
    }

    /// Paces each caller to its rate (`default_rates` for a caller without its own) and
    /// shares the write slots fairly ([`crate::fairness`]).
    pub fn with_fairness(
        mut self,
        fairness: Arc<crate::fairness::Fairness>,
        default_rates: crate::fairness::Rates,
    ) -> ResourceApi {
        self.fairness = Some((fairness, default_rates));
        self
    }

    /// Bounds the watches open per connection and on the node.
    pub fn with_connection_limits(
        mut self,
        limits: Arc<crate::limits::ConnectionLimits>,
    ) -> ResourceApi {
        self.connection_limits = Some(limits);
        self
    }

    /// DANGEROUS, test-only (`config::UnsafeModes`): they exist so that the jepsen
    /// suite can show it catches what each breaks.
    pub fn with_unsafe_modes(mut self, modes: crate::config::UnsafeModes) -> ResourceApi {
        self.unsafe_modes = modes;
        self
    }

    /// The consistency actually served for a read or list asked at
    /// `consistency`: strong becomes eventual under the test-only unsafe
    /// flag, and only then.
    fn served(&self, consistency: i32) -> i32 {
        if self.unsafe_modes.unsafe_local_strong_reads
            && consistency == pb::Consistency::Strong as i32
        {
            pb::Consistency::Eventual as i32
        } else {
            consistency
        }
    }

    pub fn forwarder(&self) -> &Forwarder<NodeHandle> {
        &self.forwarder
    }

    /// The id of this node's cluster ("" until it knows one).
    pub fn cluster_id(&self) -> String {
        self.forwarder.executor().handle().cluster_id()
    }

    /// Tells the client which cluster answered ([`cairn_proto::CLUSTER_ID_HEADER`]).
    fn stamp_cluster_id<T>(&self, response: &mut Response<T>) {
        let cluster_id = self.cluster_id();
        if !cluster_id.is_empty() {
            insert_metadata(response, cairn_proto::CLUSTER_ID_HEADER, &cluster_id);
        }
    }

    /// Authenticates the request, then validates its message (`check`, one of the
    /// executor's checks), then authorizes the action `what` derives from it; then waits
    /// for the caller's turn ([`crate::fairness`]): paced to its rate, and for a write
    /// (`write`), a write slot, held until the returned permit is dropped.
    async fn admit<T: prost::Message, C>(
        &self,
        r: &Request<T>,
        check: impl FnOnce(&Executor<NodeHandle>, &T) -> Result<C, ApiError>,
        what: impl FnOnce(&T) -> Result<Action<'_>, ApiError>,
        write: bool,
        deadline: Instant,
    ) -> Result<(Visibility, Option<crate::fairness::SlotPermit>), ApiError> {
        let caller = self.auth.caller(r)?;
        check(self.forwarder.executor(), r.get_ref())?;
        let action = what(r.get_ref())?;
        let visibility = authorize(&caller, &action)?;
        let unrestricted = || match r.extensions().get::<ConnectionInfo>() {
            Some(c) => format!("the connection from {}", c.remote_address),
            None => "an in-process caller".to_string(),
        };
        let Some((fairness, key)) = self
            .pace(
                &caller,
                unrestricted,
                r.get_ref().encoded_len() as u64,
                deadline,
            )
            .await?
        else {
            return Ok((visibility, None));
        };
        let permit = match write {
            true => Some(fairness.write_slot(&key, deadline).await?),
            false => None,
        };
        Ok((visibility, permit))
    }

    /// Waits for `caller`'s turn at its rates ([`crate::fairness`]): a grant's own rates
    /// (else the node's), keyed by the grant; an unrestricted caller (authentication off)
    /// at the node's rates, keyed by `unrestricted` (the connection it came on). Returns
    /// the fairness and the key, for a write slot; `None` when fairness is off. The one
    /// rule of every request of the client port and of the web console.
    pub(crate) async fn pace(
        &self,
        caller: &crate::auth::Caller,
        unrestricted: impl FnOnce() -> String,
        bytes: u64,
        deadline: Instant,
    ) -> Result<Option<(&crate::fairness::Fairness, String)>, ApiError> {
        let Some((fairness, default_rates)) = &self.fairness else {
            return Ok(None);
        };
        let (key, rates) = match caller {
            crate::auth::Caller::Granted(grant) => (
                format!("grant {:?}", grant.name),
                crate::fairness::Rates {
                    requests_per_second: grant
                        .requests_per_second
                        .unwrap_or(default_rates.requests_per_second),
                    bytes_per_second: grant
                        .bytes_per_second
                        .unwrap_or(default_rates.bytes_per_second),
                },
            ),
            crate::auth::Caller::Unrestricted => (unrestricted(), *default_rates),
        };
        fairness.pace(&key, rates, bytes, deadline).await?;
        Ok(Some((fairness.as_ref(), key)))
    }

    /// When a request must be answered by.
    fn deadline<T>(&self, r: &Request<T>) -> Instant {
        self.deadline_within(cairn_forwarding::caller_timeout(r))
    }

    /// When a request must be answered by (for the other services of the client port).
    pub(crate) fn deadline_of<T>(&self, r: &Request<T>) -> Instant {
        self.deadline(r)
    }

    /// Authenticates the caller of `r` and authorizes `action` (a lease request, or a
    /// write a lease's revoke would make).
    pub(crate) fn authorize_lease<T>(
        &self,
        r: &Request<T>,
        action: &Action<'_>,
    ) -> Result<(), ApiError> {
        let caller = self.auth.caller(r)?;
        authorize(&caller, action).map(|_| ())
    }

    /// A lease grant, revoke or keep-alive: through Raft on the leader, forwarded from a
    /// follower.
    pub async fn lease_command(
        &self,
        r: pb::LeaseCommandRequest,
        deadline: Instant,
    ) -> Result<pb::LeaseCommandResponse, ApiError> {
        self.forwarder.lease(r, deadline).await
    }

    /// When a request whose caller waits `caller` (`None`: as long as the node allows)
    /// must be answered by: that less a margin, at most the node's request timeout.
    pub fn deadline_within(&self, caller: Option<Duration>) -> Instant {
        Instant::now() + cairn_forwarding::bounded_timeout(caller, self.request_timeout)
    }

    // ---- What an admitted caller's request runs: the gRPC shell's after
    // authentication and authorization, the in-process client's at once.

    /// Read (validated again, then here or at the leader).
    pub async fn read(
        &self,
        mut r: pb::ReadRequest,
        deadline: Instant,
    ) -> Result<shared::ReadResponse, ApiError> {
        r.consistency = self.served(r.consistency);
        self.forwarder.read(r, deadline).await
    }

    /// Write, through Raft here on the leader, else at the leader.
    pub async fn write(
        &self,
        r: pb::WriteRequest,
        deadline: Instant,
    ) -> Result<shared::WriteResponse, ApiError> {
        self.forwarder.write(r, deadline).await
    }

    /// Delete, as [`ResourceApi::write`].
    pub async fn delete(
        &self,
        r: pb::DeleteRequest,
        deadline: Instant,
    ) -> Result<pb::DeleteResponse, ApiError> {
        self.forwarder.delete(r, deadline).await
    }

    /// Status write, as [`ResourceApi::write`] (refused while the cluster version is
    /// below 0.2).
    pub async fn write_status(
        &self,
        r: pb::WriteStatusRequest,
        deadline: Instant,
    ) -> Result<shared::WriteStatusResponse, ApiError> {
        self.forwarder.write_status(r, deadline).await
    }

    /// One page of a listing, of what `visible` shows (`None`: everything).
    pub async fn list(
        &self,
        mut r: pb::ListRequest,
        visible: Option<Arc<cairn_fsm::ReadScope>>,
        deadline: Instant,
    ) -> Result<shared::ListResponse, ApiError> {
        r.consistency = self.served(r.consistency);
        self.forwarder.list(r, visible, deadline).await
    }

    /// ListByOwner, of what `visible` shows (`None`: everything).
    pub async fn list_by_owner(
        &self,
        r: pb::ListByOwnerRequest,
        visible: Option<&cairn_fsm::ReadScope>,
        deadline: Instant,
    ) -> Result<shared::ListByOwnerResponse, ApiError> {
        self.forwarder.list_by_owner(r, visible, deadline).await
    }

    /// Opens a watch: takes its slot first (on the node, `watches_max`, and on
    /// `connection` when the request came over one), opened by `deadline` (a strong
    /// watch's read index), only events `visible` shows; the slot is held by the stream.
    pub async fn watch(
        &self,
        r: pb::WatchListRequest,
        visible: Visibility,
        connection: Option<&ConnectionInfo>,
        deadline: Instant,
    ) -> Result<OpenedWatch, ApiError> {
        let permit = match &self.connection_limits {
            Some(limits) => Some(limits.watch(connection)?),
            None => None,
        };
        let OpenedWatch { id, events } = self.forwarder.watch(r, deadline).await?;
        let events: WatchStream = match visible {
            Visibility::Everything => events,
            within => Box::pin(
                events.filter(move |event| std::future::ready(event_visible(&within, event))),
            ),
        };
        let events = drop_every_nth_change(events, self.unsafe_modes.unsafe_drop_watch_events);
        let events = self.ending_at_stop(
            events,
            ApiError::WatchClosed(
                "the node is shutting down: watch again through another member".into(),
            ),
        );
        let events = Box::pin(events.map(move |event| {
            let _held = &permit;
            event
        }));
        Ok(OpenedWatch { id, events })
    }

    /// WatchProgress: a quorum-confirmed revision, and a Progress event at or
    /// above it on each named watch of this node, by `deadline`.
    pub async fn watch_progress(
        &self,
        r: pb::WatchProgressRequest,
        deadline: Instant,
    ) -> Result<pb::WatchProgressResponse, ApiError> {
        self.forwarder.watch_progress(r, deadline).await
    }
}

/// The tonic service: a thin shell mapping `ApiError` to statuses.
pub struct ResourceGrpc(pub Arc<ResourceApi>);

/// The type and tenancy of a validated id.
fn id_parts(id: Option<&pb::Id>) -> Result<(&pb::Type, &pb::Tenancy), ApiError> {
    let id = id.ok_or_else(|| ApiError::invalid("id", "is required"))?;
    match (id.r#type.as_ref(), id.tenancy.as_ref()) {
        (Some(t), Some(tenancy)) => Ok((t, tenancy)),
        _ => Err(ApiError::invalid("id", "needs a type and a tenancy")),
    }
}

/// The tenancy a list or watch asks for, read as the executor reads it (an
/// absent one is empty fields, which validation refuses first), so that
/// authorization sees exactly what is executed.
/// What a List or WatchList asks to read, for authorization (its filter
/// was validated first, so the type is present).
fn list_action<'a>(
    type_: Option<&'a pb::Type>,
    tenancy: Option<&'a pb::Tenancy>,
) -> Result<Action<'a>, ApiError> {
    let (type_, tenancy) = list_filter(type_, tenancy)?;
    Ok(Action::List { type_, tenancy })
}

/// The type and tenancy of a List or WatchList, as [`list_action`] reads them.
fn list_filter<'a>(
    type_: Option<&'a pb::Type>,
    tenancy: Option<&'a pb::Tenancy>,
) -> Result<(&'a pb::Type, &'a pb::Tenancy), ApiError> {
    let type_ = type_.ok_or_else(|| ApiError::invalid("type", "is required"))?;
    Ok((type_, requested_tenancy(tenancy)))
}

fn requested_tenancy(t: Option<&pb::Tenancy>) -> &pb::Tenancy {
    static EMPTY: std::sync::OnceLock<pb::Tenancy> = std::sync::OnceLock::new();
    t.unwrap_or_else(|| EMPTY.get_or_init(pb::Tenancy::default))
}

#[tonic::async_trait]
impl ResourceService for ResourceGrpc {
    async fn read(
        &self,
        r: Request<pb::ReadRequest>,
    ) -> Result<Response<shared::ReadResponse>, Status> {
        let d = self.0.deadline(&r);
        self.0
            .admit(
                &r,
                Executor::check_read,
                |m| {
                    let (type_, tenancy) = id_parts(m.id.as_ref())?;
                    Ok(Action::Read { type_, tenancy })
                },
                false,
                d,
            )
            .await?;
        Ok(Response::new(self.0.read(r.into_inner(), d).await?))
    }

    async fn write(
        &self,
        r: Request<pb::WriteRequest>,
    ) -> Result<Response<shared::WriteResponse>, Status> {
        let d = self.0.deadline(&r);
        let (_, _slot) = self
            .0
            .admit(
                &r,
                Executor::check_write,
                |m| {
                    let id = m
                        .resource
                        .as_ref()
                        .and_then(|resource| resource.id.as_ref());
                    let (type_, tenancy) = id_parts(id)?;
                    Ok(Action::Write { type_, tenancy })
                },
                true,
                d,
            )
            .await?;
        Ok(Response::new(self.0.write(r.into_inner(), d).await?))
    }

    async fn delete(
        &self,
        r: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let d = self.0.deadline(&r);
        let (_, _slot) = self
            .0
            .admit(
                &r,
                Executor::check_delete,
                |m| {
                    let (type_, tenancy) = id_parts(m.id.as_ref())?;
                    Ok(Action::Write { type_, tenancy })
                },
                true,
                d,
            )
            .await?;
        Ok(Response::new(self.0.delete(r.into_inner(), d).await?))
    }

    async fn write_status(
        &self,
        r: Request<pb::WriteStatusRequest>,
    ) -> Result<Response<shared::WriteStatusResponse>, Status> {
        let d = self.0.deadline(&r);
        let (_, _slot) = self
            .0
            .admit(
                &r,
                Executor::check_write_status,
                |m| {
                    let (type_, tenancy) = id_parts(m.id.as_ref())?;
                    Ok(Action::Write { type_, tenancy })
                },
                true,
                d,
            )
            .await?;
        Ok(Response::new(self.0.write_status(r.into_inner(), d).await?))
    }

    async fn list(
        &self,
        r: Request<pb::ListRequest>,
    ) -> Result<Response<shared::ListResponse>, Status> {
        let d = self.0.deadline(&r);
        let (visible, _) = self
            .0
            .admit(
                &r,
                Executor::check_list,
                |m| list_action(m.r#type.as_ref(), m.tenancy.as_ref()),
                false,
                d,
            )
            .await?;
        let answer = self
            .0
            .list(r.into_inner(), visible.read_scope().cloned(), d)
            .await?;
        Ok(Response::new(answer))
    }

    async fn list_by_owner(
        &self,
        r: Request<pb::ListByOwnerRequest>,
    ) -> Result<Response<shared::ListByOwnerResponse>, Status> {
        let deadline = self.0.deadline(&r);
        let (visible, _) = self
            .0
            .admit(
                &r,
                Executor::check_list_by_owner,
                |_| Ok(Action::ListByOwner),
                false,
                deadline,
            )
            .await?;
        let answer = self
            .0
            .list_by_owner(r.into_inner(), visible.read_scope().map(|s| &**s), deadline)
            .await?;
        Ok(Response::new(answer))
    }

    type WatchListStream = GrpcWatchStream;

    async fn watch_list(
        &self,
        r: Request<pb::WatchListRequest>,
    ) -> Result<Response<GrpcWatchStream>, Status> {
        // Authenticated first (as `ResourceApi::admit` does), then
        // validated; authorized by the guard, now and again at every reload
        // of the grants.
        let caller = self.0.auth.watch_caller(&r)?;
        let principal = caller.principal().map(str::to_string);
        self.0.forwarder.executor().check_watch(r.get_ref())?;
        let (type_, tenancy) =
            list_filter(r.get_ref().r#type.as_ref(), r.get_ref().tenancy.as_ref())?;
        let guard = caller.authorize(type_, tenancy)?;
        let visible = guard.visibility().clone();
        // A strong watch waits for a read index within the time its caller waits for it
        // to open (a watch has no gRPC deadline), at most the node's request timeout.
        let deadline = self
            .0
            .deadline_within(cairn_forwarding::watch_open_timeout(&r));
        let connection = r.extensions().get::<ConnectionInfo>().cloned();
        let opened = self
            .0
            .watch(r.into_inner(), visible, connection.as_ref(), deadline)
            .await?;
        let events = crate::auth::close_when_revoked(opened.events, guard);
        let opener = self.0.watch_openers.register(opened.id, principal);
        let events: GrpcWatchStream = Box::pin(events.map(move |event| {
            let _registered = &opener;
            event.map_err(Status::from)
        }));
        let mut response = Response::new(events);
        insert_metadata(
            &mut response,
            cairn_proto::WATCH_ID_HEADER,
            &opened.id.to_string(),
        );
        self.0.stamp_cluster_id(&mut response);
        Ok(response)
    }

    async fn watch_progress(
        &self,
        r: Request<pb::WatchProgressRequest>,
    ) -> Result<Response<pb::WatchProgressResponse>, Status> {
        // Any authenticated caller: the answer holds a revision and the ids it
        // sent, and a Progress event tells a watch nothing but how far it is.
        // It reaches only the watches this caller opened here: another's would
        // take slots of that watch's buffer (and could get it closed as lagging).
        let caller = self.0.auth.caller(&r)?;
        let deadline = self.0.deadline(&r);
        let mut request = r.into_inner();
        self.0
            .watch_openers
            .keep_opened_by(&mut request.watch_ids, caller.principal());
        let answer = self.0.watch_progress(request, deadline).await?;
        let mut response = Response::new(answer);
        self.0.stamp_cluster_id(&mut response);
        Ok(response)
    }
}

/// The principal that opened each watch open over gRPC on this node. An
/// entry lives as long as its watch's stream (`OpenerEntry`), so the map
/// holds at most `watches_max` entries.
#[derive(Default)]
pub struct WatchOpeners(parking_lot::Mutex<HashMap<u64, Option<String>>>);

impl WatchOpeners {
    /// Records that `principal` opened watch `id`, until the returned entry is dropped.
    fn register(self: &Arc<Self>, id: u64, principal: Option<String>) -> OpenerEntry {
        let previous = self.0.lock().insert(id, principal);
        assert!(previous.is_none(), "a watch id names one open watch");
        OpenerEntry {
            openers: self.clone(),
            id,
        }
    }

    /// Keeps of `ids` the watches open here that `principal` opened.
    fn keep_opened_by(&self, ids: &mut Vec<u64>, principal: Option<&str>) {
        let openers = self.0.lock();
        ids.retain(|id| openers.get(id).is_some_and(|o| o.as_deref() == principal));
    }
}

/// A watch's entry in [`WatchOpeners`], removed when the stream is dropped.
struct OpenerEntry {
    openers: Arc<WatchOpeners>,
    id: u64,
}

impl Drop for OpenerEntry {
    fn drop(&mut self) {
        self.openers.0.lock().remove(&self.id);
    }
}

/// Adds `value` under `key` to a response's metadata (a value that is not
/// valid metadata is left out: ours are digits and ids).
fn insert_metadata<T>(response: &mut Response<T>, key: &'static str, value: &str) {
    if let Ok(value) = value.parse() {
        response.metadata_mut().insert(key, value);
    }
}

/// A watch stream as gRPC serves it: errors as statuses (`ApiError`'s mapping).
pub type GrpcWatchStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<shared::WatchEvent, Status>> + Send>>;

/// DANGEROUS, test-only (`--unsafe-drop-watch-events N`): the stream without its Nth,
/// 2Nth, ... change event (markers and errors pass); `n = 0` keeps every event.
fn drop_every_nth_change(events: WatchStream, n: u64) -> WatchStream {
    if n == 0 {
        return events;
    }
    let mut changes = 0u64;
    Box::pin(events.filter(move |event| {
        use shared::watch_event::Event;
        let change = matches!(
            event,
            Ok(shared::WatchEvent {
                event: Some(Event::Upsert(_) | Event::Delete(_)),
                ..
            })
        );
        if change {
            changes += 1;
        }
        std::future::ready(!(change && changes.is_multiple_of(n)))
    }))
}

/// Whether a watch event may reach the caller: a change to a resource
/// outside the read scope never does; markers (end of snapshot, progress)
/// and errors always do.
fn event_visible(visible: &Visibility, event: &Result<shared::WatchEvent, ApiError>) -> bool {
    use shared::watch_event::Event;
    let Ok(event) = event else {
        return true;
    };
    match &event.event {
        Some(Event::Upsert(u)) => u.resource.as_ref().is_some_and(|r| visible.shows(r)),
        Some(Event::Delete(d)) => d.resource.as_ref().is_some_and(|r| visible.shows(r)),
        Some(Event::EndOfSnapshot(_)) | Some(Event::Progress(_)) | None => true,
    }
}
