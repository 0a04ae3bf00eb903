//! An in-process stand-in for Cairn nodes: a tonic `ResourceService` backed
//! by `cairn_fsm::Store`, with switches for the failures the client must
//! handle (follower answering NotLeader, Unavailable, a write whose answer
//! never comes, dropped connections, slow or compacted watches, listings
//! compacted between pages). Lists are paged as a node pages them.
//!
//! Several nodes may share one [`Backing`] (one store: a perfectly
//! replicated cluster) or have their own (a lagging replica).

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_client::{CacheEvent, ResourceKey};
use cairn_fsm::{
    Applied, Command, FsmError, Limits, ListFilter, PageBounds, PageToken, Store, StoredResource,
    WatchFilter,
};
use cairn_proto::error::{ApiError, LeaderHint};
use cairn_proto::google::protobuf::Any;
use cairn_proto::v1::resource_service_server::{ResourceService, ResourceServiceServer};
use cairn_proto::v1::{self as pb, Id, Resource, Tenancy, Type};
use futures::Stream;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::{Request, Response, Status};

/// One replicated store and the lock that orders its writers.
#[derive(Clone)]
pub struct Backing {
    pub store: Store,
    lock: Arc<Mutex<()>>,
}

impl Backing {
    pub fn new(limits: Limits) -> Backing {
        Backing {
            store: Store::new(limits),
            lock: Arc::new(Mutex::new(())),
        }
    }

    /// Applies a command at the next index, as the leader's log would.
    pub fn apply(&self, command: &Command) -> Result<(u64, Applied), FsmError> {
        let _writer = self.lock.lock();
        let index = self.store.applied_index() + 1;
        self.store.apply(index, command).map(|a| (index, a))
    }

    /// Writes (creating or replacing whatever is stored) and returns the stored resource.
    pub fn put(&self, mut resource: Resource) -> Resource {
        let id = resource.id.clone().unwrap_or_default();
        let stored = self
            .store
            .view()
            .read(&Id {
                uid: String::new(),
                ..id
            })
            .ok();
        resource.version = stored.map(|s| s.version().to_string()).unwrap_or_default();
        match self.apply(&Command::Write { resource }) {
            Ok((_, Applied::Written(r))) => r.resource(),
            other => panic!("put failed: {other:?}"),
        }
    }

    /// Deletes whatever is stored at the id's key.
    pub fn remove(&self, id: &Id) {
        let any = Id {
            uid: String::new(),
            ..id.clone()
        };
        let stored = self.store.view().read(&any).expect("remove: stored");
        let exact = stored.resource().id.unwrap_or_default();
        self.apply(&Command::Delete {
            id: exact,
            version: stored.version().to_string(),
            now_ms: 0,
            orphan: false,
        })
        .expect("remove applies");
    }

    /// Replaces the whole table with `resources` at `applied_index`, closing every watch.
    pub fn restore(&self, resources: Vec<Resource>, applied_index: u64) {
        let _writer = self.lock.lock();
        let mut restoration = self.store.restore();
        for r in resources {
            restoration.apply(r).expect("restorable resource");
        }
        restoration.commit(applied_index).expect("restore commits");
    }
}

/// A resource of type `group.v1.kind` in default/default, with JSON data.
pub fn resource(group: &str, kind: &str, name: &str, uid: &str, data: &str) -> Resource {
    Resource {
        id: Some(id(group, kind, name, uid)),
        data: Some(Any {
            type_url: format!("type.googleapis.com/{group}.v1.{kind}"),
            value: bytes::Bytes::copy_from_slice(data.as_bytes()),
        }),
        ..Default::default()
    }
}

pub fn id(group: &str, kind: &str, name: &str, uid: &str) -> Id {
    Id {
        uid: uid.into(),
        name: name.into(),
        r#type: Some(Type {
            group: group.into(),
            group_version: "v1".into(),
            kind: kind.into(),
        }),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }),
    }
}

/// Switches that change how a node answers.
#[derive(Default)]
pub struct Control {
    /// Some(leader client address): answer writes, deletes and strong reads with NotLeader.
    pub follower_of: Mutex<Option<String>>,
    /// Answer this many writes/deletes with Unavailable before touching the store.
    pub unavailable_writes: AtomicU32,
    /// Apply writes, then never answer.
    pub hang_after_apply: AtomicBool,
    /// Never answer reads.
    pub hang_reads: AtomicBool,
    /// Delay before each watch event, per kind.
    pub event_delay: Mutex<HashMap<String, Duration>>,
    /// Answer every watch that starts from a revision with Compacted.
    pub compact_replays: AtomicBool,
    /// Writes and deletes received (whatever the answer).
    pub writes_received: AtomicU64,
    /// Watches opened.
    pub watches_opened: AtomicU64,
    /// Answer this many later pages of listings (those with a page token)
    /// with Compacted, as a node whose history moved past the listing's
    /// revision does.
    pub compact_later_pages: AtomicU32,
    /// First pages of listings served (requests without a page token).
    pub first_pages_served: AtomicU64,
    /// WatchProgress calls answered, and how long each takes.
    pub progress_calls: AtomicU64,
    pub progress_delay: Mutex<Duration>,
}

#[derive(Clone)]
struct Service {
    backing: Backing,
    control: Arc<Control>,
}

fn status(e: impl Into<ApiError>) -> Status {
    Status::from(e.into())
}

impl Service {
    fn not_leader(&self) -> Option<Status> {
        self.control.follower_of.lock().clone().map(|leader| {
            status(ApiError::NotLeader {
                hint: LeaderHint {
                    leader_id: Some(1),
                    client_address: Some(leader),
                    peer_address: None,
                },
            })
        })
    }

    /// The checks every write and delete goes through before applying.
    async fn before_write(&self) -> Result<(), Status> {
        self.control.writes_received.fetch_add(1, Ordering::SeqCst);
        if let Some(s) = self.not_leader() {
            return Err(s);
        }
        let refused = self
            .control
            .unavailable_writes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if refused {
            return Err(status(ApiError::Unavailable("test: shutting down".into())));
        }
        Ok(())
    }

    async fn after_apply(&self) {
        if self.control.hang_after_apply.load(Ordering::SeqCst) {
            futures::future::pending::<()>().await;
        }
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

#[tonic::async_trait]
impl ResourceService for Service {
    async fn read(
        &self,
        r: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        let r = r.into_inner();
        if self.control.hang_reads.load(Ordering::SeqCst) {
            futures::future::pending::<()>().await;
        }
        if r.consistency == pb::Consistency::Strong as i32 {
            if let Some(s) = self.not_leader() {
                return Err(s);
            }
        }
        let id =
            r.id.ok_or_else(|| status(ApiError::invalid("id", "is required")))?;
        cairn_fsm::validate_id("id", &id, self.backing.store.limits()).map_err(status)?;
        let view = self.backing.store.view_at(r.revision).map_err(status)?;
        let resource = view.read(&id).map_err(status)?;
        Ok(Response::new(pb::ReadResponse {
            resource: Some(resource.resource()),
            revision: view.revision(),
        }))
    }

    async fn write(
        &self,
        r: Request<pb::WriteRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        self.before_write().await?;
        let resource = r
            .into_inner()
            .resource
            .ok_or_else(|| status(ApiError::invalid("resource", "is required")))?;
        cairn_fsm::validate_write(&resource, self.backing.store.limits()).map_err(status)?;
        let applied = self
            .backing
            .apply(&Command::Write { resource })
            .map_err(status)?;
        self.after_apply().await;
        match applied {
            (_, Applied::Written(r)) => Ok(Response::new(pb::WriteResponse {
                resource: Some(r.resource()),
            })),
            other => Err(status(ApiError::Internal(format!("{other:?}")))),
        }
    }

    async fn write_status(
        &self,
        r: Request<pb::WriteStatusRequest>,
    ) -> Result<Response<pb::WriteStatusResponse>, Status> {
        self.before_write().await?;
        let r = r.into_inner();
        let id =
            r.id.ok_or_else(|| status(ApiError::invalid("id", "is required")))?;
        let command = Command::WriteStatus {
            id,
            key: r.key,
            status: r.status.unwrap_or_default(),
            version: r.version,
        };
        let applied = self.backing.apply(&command).map_err(status)?;
        self.after_apply().await;
        match applied {
            (_, Applied::Written(r)) => Ok(Response::new(pb::WriteStatusResponse {
                resource: Some(r.resource()),
            })),
            other => Err(status(ApiError::Internal(format!("{other:?}")))),
        }
    }

    async fn delete(
        &self,
        r: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        self.before_write().await?;
        let r = r.into_inner();
        let id =
            r.id.ok_or_else(|| status(ApiError::invalid("id", "is required")))?;
        cairn_fsm::validate_id("id", &id, self.backing.store.limits()).map_err(status)?;
        let (index, applied) = self
            .backing
            .apply(&Command::Delete {
                id,
                version: r.version,
                now_ms: 0,
                orphan: r.orphan_dependents,
            })
            .map_err(status)?;
        self.after_apply().await;
        Ok(Response::new(pb::DeleteResponse {
            revision: index,
            marked: matches!(applied, Applied::Marked(_)),
        }))
    }

    async fn list(
        &self,
        r: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let r = r.into_inner();
        if r.consistency == pb::Consistency::Strong as i32 {
            if let Some(s) = self.not_leader() {
                return Err(s);
            }
        }
        let type_ = r
            .r#type
            .ok_or_else(|| status(ApiError::invalid("type", "is required")))?;
        let tenancy = r.tenancy.unwrap_or_default();
        cairn_fsm::validate_list(
            &type_,
            &tenancy,
            &r.name_prefix,
            self.backing.store.limits(),
        )
        .map_err(status)?;
        // Paged as a node pages (`cairn_forwarding`'s executor): later pages
        // at the token's revision.
        let filter = ListFilter {
            type_: &type_,
            tenancy: &tenancy,
            name_prefix: &r.name_prefix,
            selector: None,
        };
        let token = match r.page_token.as_str() {
            "" => None,
            text => Some(PageToken::decode(text, &filter).map_err(status)?),
        };
        let revision = match &token {
            None => {
                self.control
                    .first_pages_served
                    .fetch_add(1, Ordering::SeqCst);
                r.revision
            }
            Some(token) => {
                let compact = self
                    .control
                    .compact_later_pages
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
                if compact {
                    return Err(status(ApiError::Compacted {
                        oldest_retained_revision: token.revision() + 1,
                    }));
                }
                token.revision()
            }
        };
        let view = self.backing.store.view_at(revision).map_err(status)?;
        let bounds = PageBounds::for_request(r.limit, self.backing.store.limits());
        let page = view.list_page(&filter, None, token.as_ref(), bounds);
        Ok(Response::new(pb::ListResponse {
            resources: page
                .resources
                .iter()
                .map(StoredResource::resource)
                .collect(),
            revision: view.revision(),
            next_page_token: page.next.map(|t| t.encode()).unwrap_or_default(),
        }))
    }

    async fn list_by_owner(
        &self,
        r: Request<pb::ListByOwnerRequest>,
    ) -> Result<Response<pb::ListByOwnerResponse>, Status> {
        let owner = r
            .into_inner()
            .owner
            .ok_or_else(|| status(ApiError::invalid("owner", "is required")))?;
        let view = self.backing.store.view();
        let resources = view
            .list_by_owner(&owner)
            .iter()
            .map(StoredResource::resource)
            .collect();
        Ok(Response::new(pb::ListByOwnerResponse {
            resources,
            revision: view.revision(),
        }))
    }

    type WatchListStream = EventStream;

    async fn watch_list(
        &self,
        r: Request<pb::WatchListRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let r = r.into_inner();
        self.control.watches_opened.fetch_add(1, Ordering::SeqCst);
        if r.start_revision > 0 && self.control.compact_replays.load(Ordering::SeqCst) {
            return Err(status(ApiError::Compacted {
                oldest_retained_revision: self.backing.store.applied_index(),
            }));
        }
        let type_ = r
            .r#type
            .ok_or_else(|| status(ApiError::invalid("type", "is required")))?;
        let delay = self.control.event_delay.lock().get(&type_.kind).copied();
        let selector = match r.selector.trim().is_empty() {
            true => None,
            false => Some(std::sync::Arc::new(
                cairn_fsm::Selector::parse(&r.selector)
                    .map_err(|e| status(ApiError::invalid("selector", e.to_string())))?,
            )),
        };
        let filter = WatchFilter {
            type_,
            tenancy: r.tenancy.unwrap_or_default(),
            name_prefix: r.name_prefix,
            selector,
        };
        let watch = self
            .backing
            .store
            .watch(filter, r.start_revision)
            .map_err(status)?;
        let watch_id = watch.id();
        let stream = futures::stream::unfold(Some(watch), move |state| async move {
            let mut watch = state?;
            if let Some(d) = delay {
                tokio::time::sleep(d).await;
            }
            match watch.next().await {
                Ok(event) => Some((Ok(to_proto(event)), Some(watch))),
                Err(e) => Some((Err(status(e)), None)),
            }
        });
        let mut response = Response::new(Box::pin(stream) as EventStream);
        response.metadata_mut().insert(
            cairn_proto::WATCH_ID_HEADER,
            watch_id.to_string().parse().expect("digits"),
        );
        Ok(response)
    }

    /// One node, always the leader: its applied index is confirmed.
    async fn watch_progress(
        &self,
        r: Request<pb::WatchProgressRequest>,
    ) -> Result<Response<pb::WatchProgressResponse>, Status> {
        self.control.progress_calls.fetch_add(1, Ordering::SeqCst);
        let delay = *self.control.progress_delay.lock();
        tokio::time::sleep(delay).await;
        let (revision, delivered_watch_ids) = self
            .backing
            .store
            .request_progress(&r.into_inner().watch_ids);
        Ok(Response::new(pb::WatchProgressResponse {
            revision,
            delivered_watch_ids,
        }))
    }
}

fn to_proto(event: cairn_fsm::Event) -> pb::WatchEvent {
    event.to_proto()
}

/// A running (or stopped) in-process node.
pub struct TestNode {
    /// `127.0.0.1:PORT`, stable across restarts.
    pub address: String,
    pub backing: Backing,
    pub control: Arc<Control>,
    running: Option<Running>,
}

struct Running {
    task: JoinHandle<()>,
    /// A duplicate of every accepted socket, to cut connections.
    sockets: Arc<Mutex<Vec<std::net::TcpStream>>>,
}

impl TestNode {
    /// Starts a node on a free port.
    pub async fn start(backing: Backing) -> TestNode {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("local address").to_string();
        let mut node = TestNode {
            address,
            backing,
            control: Arc::new(Control::default()),
            running: None,
        };
        node.serve(listener);
        node
    }

    /// A free address with nothing listening (connections are refused).
    pub async fn dead_address() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        listener.local_addr().expect("local address").to_string()
    }

    fn serve(&mut self, listener: TcpListener) {
        let sockets: Arc<Mutex<Vec<std::net::TcpStream>>> = Arc::default();
        let accepted = sockets.clone();
        let incoming = futures::stream::unfold(listener, move |listener| {
            let accepted = accepted.clone();
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let std_stream = stream.into_std().expect("into_std");
                    let duplicate = std_stream.try_clone().expect("clone socket");
                    accepted.lock().push(duplicate);
                    let stream = tokio::net::TcpStream::from_std(std_stream).expect("from_std");
                    return Some((Ok::<_, std::io::Error>(stream), listener));
                }
            }
        });
        let service = Service {
            backing: self.backing.clone(),
            control: self.control.clone(),
        };
        let task = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(ResourceServiceServer::new(service))
                .serve_with_incoming(incoming)
                .await;
            if let Err(e) = served {
                eprintln!("test node stopped: {e}");
            }
        });
        self.running = Some(Running { task, sockets });
    }

    /// Cuts every connection (the peers see them drop) but keeps listening.
    pub fn drop_connections(&self) {
        if let Some(running) = &self.running {
            for s in running.sockets.lock().drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }

    /// Stops listening and cuts every connection: the node is down.
    pub async fn stop(&mut self) {
        if let Some(running) = self.running.take() {
            running.task.abort();
            let _ = running.task.await;
            for s in running.sockets.lock().drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }

    /// Starts serving again on the same address.
    pub async fn restart(&mut self) {
        assert!(self.running.is_none(), "restart of a running node");
        let address: SocketAddr = self.address.parse().expect("address");
        let mut attempts = 0;
        let listener = loop {
            match TcpListener::bind(address).await {
                Ok(l) => break l,
                Err(e) if attempts < 50 => {
                    attempts += 1;
                    eprintln!("rebind {address}: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("cannot rebind {address}: {e}"),
            }
        };
        self.serve(listener);
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            running.task.abort();
            for s in running.sockets.lock().drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Records cache events and checks, as they arrive, that no key's version
/// ever goes back or repeats and that every Delete removes what was there.
#[derive(Clone, Default)]
pub struct Recorder {
    inner: Arc<Mutex<RecorderState>>,
}

#[derive(Default)]
struct RecorderState {
    events: Vec<CacheEvent>,
    /// Per key: the last version seen and whether it is currently deleted.
    last: HashMap<ResourceKey, (u64, bool)>,
    violations: Vec<String>,
}

impl Recorder {
    pub fn callback(&self) -> Box<dyn FnMut(&CacheEvent) + Send> {
        let inner = self.inner.clone();
        Box::new(move |event: &CacheEvent| {
            let mut s = inner.lock();
            let r = event.resource();
            let key = ResourceKey::of(r);
            let version: u64 = r.version.parse().unwrap_or(0);
            let last = s.last.get(&key).copied();
            match (event, last) {
                (CacheEvent::Upsert(_), Some((v, _))) if version <= v => {
                    s.violations
                        .push(format!("{key:?}: upsert of version {version} after {v}"));
                }
                (CacheEvent::Delete(_), None) | (CacheEvent::Delete(_), Some((_, true))) => {
                    s.violations
                        .push(format!("{key:?}: delete of a key not cached"));
                }
                (CacheEvent::Delete(_), Some((v, false))) if v != version => {
                    s.violations
                        .push(format!("{key:?}: delete of version {version}, cached {v}"));
                }
                _ => {}
            }
            let deleted = matches!(event, CacheEvent::Delete(_));
            s.last.insert(key, (version, deleted));
            s.events.push(event.clone());
        })
    }

    pub fn events(&self) -> Vec<CacheEvent> {
        self.inner.lock().events.clone()
    }

    pub fn len(&self) -> usize {
        self.inner.lock().events.len()
    }

    pub fn violations(&self) -> Vec<String> {
        self.inner.lock().violations.clone()
    }
}

/// A short description of an event: "+name@version" or "-name@version".
pub fn describe(event: &CacheEvent) -> String {
    let r = event.resource();
    let name = r.id.as_ref().map(|i| i.name.as_str()).unwrap_or("");
    match event {
        CacheEvent::Upsert(_) => format!("+{name}@{}", r.version),
        CacheEvent::Delete(_) => format!("-{name}@{}", r.version),
    }
}

/// Waits until `condition` holds, polling every 5 ms, at most `limit`.
pub async fn eventually(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if condition() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
