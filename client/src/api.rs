//! [`ResourceApi`]: the calls of the storage contract as one trait, served by
//! the remote [`Client`] (gRPC to any node of a cluster) and by an embedded
//! node's in-process client (`cairn_server::embed::InProcessClient`, which
//! calls the node's request layer directly). A controller written against the
//! trait — a [`crate::WatchCache`] included — runs unchanged either way.
//!
//! ## Shared values
//!
//! Answers carry each resource as an `Arc<Resource>`, decoded once per answer
//! and then shared, never copied: the in-process client decodes the store's
//! own encoding (the store keeps each resource's protobuf bytes once, made
//! when the write applied, and hands out the same bytes to every answer); the
//! remote client decodes what came over the wire. A cache keeps the very
//! `Arc` its watch delivered and hands it to every subscriber and reader.
//!
//! Why decoded values rather than a handle on the stored bytes: whoever
//! holds a resource reads its fields (data, status, owner), so a byte handle
//! would make every reader decode on every access; and keeping a decoded
//! copy beside the bytes in the store would double its memory, which the
//! store refuses by design (`cairn_fsm::StoredResource`).
//!
//! ## Errors
//!
//! [`ClientError`], the client's one vocabulary, each with its
//! [`crate::Outcome`]: both implementations say the same thing of the same
//! failure (the in-process client classifies a node's answer with the table
//! the remote client and the nodes' forwarders share, `cairn_request`).
//!
//! ## Object safety
//!
//! Every call returns a boxed future ([`ApiFuture`]), so that a program can
//! pick its client at run time and hold it as `Arc<dyn ResourceApi>`.
//! `Arc<T>` of any implementation is one too.
//!
//! ## Listings
//!
//! [`ResourceApi::list`] returns a whole listing, every page of it, as
//! [`Client::list_request`] does; both implementations gather the pages with
//! the one loop, [`whole_listing`] (every page at the first page's revision;
//! a listing of the latest state whose revision was compacted between pages
//! starts again, at most [`crate::LIST_RESTARTS_MAX`] times, within one
//! deadline).

use std::future::Future;
use std::sync::Arc;

use cairn_proto::v1::{
    watch_event, Consistency, DeleteRequest, DeleteResponse, Id, ListByOwnerResponse, ListRequest,
    ListResponse, Resource, WatchEvent, WatchListRequest, WriteStatusRequest,
};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _};
use tokio::time::Instant;

use crate::error::{ClientError, Outcome};
use crate::{Client, WatchProgress};

/// What every call of a [`ResourceApi`] returns.
pub type ApiFuture<'a, T> = BoxFuture<'a, Result<T, ClientError>>;

/// The storage contract's calls (`docs/contract.md`), remote or in process.
/// See the module docs.
pub trait ResourceApi: Send + Sync + 'static {
    /// Reads one resource (contract: Read). An empty `id.uid` reads whatever
    /// lifetime is current.
    fn read(&self, id: Id, consistency: Consistency) -> ApiFuture<'_, Arc<Resource>>;

    /// Writes `resource` as a compare-and-set: `resource.version` is the
    /// version expected to be stored ("" = create). Returns the stored
    /// resource with its new version.
    fn write(&self, resource: Resource) -> ApiFuture<'_, Arc<Resource>>;

    /// Deletes the lifetime `id.uid` if its stored version is `version`;
    /// nothing stored, or another lifetime stored, is success. Returns the
    /// revision at which the delete applied.
    fn delete(&self, id: Id, version: String) -> ApiFuture<'_, u64> {
        Box::pin(async move {
            let request = DeleteRequest {
                id: Some(id),
                version,
                fence: None,
                orphan_dependents: false,
            };
            self.delete_request(request).await.map(|r| r.revision)
        })
    }

    /// A delete with every option of the request (a fence, `orphan_dependents`); the
    /// answer says whether the resource was only marked for deletion.
    fn delete_request(&self, request: DeleteRequest) -> ApiFuture<'_, DeleteResponse>;

    /// Replaces the entry `request.key` of the `status` map of the lifetime
    /// `request.id.uid` (required), checked against `request.version` only when
    /// it is not empty, so a controller's status write never conflicts with the
    /// writers of the data. Returns the stored resource with its new version.
    /// FailedPrecondition while the cluster version is below 0.2.
    fn write_status(&self, request: WriteStatusRequest) -> ApiFuture<'_, Arc<Resource>>;

    /// The whole listing `request` starts, every page of it (see the module
    /// docs), in the order the pages came, with the revision every page
    /// reflects and no next token.
    fn list(&self, request: ListRequest) -> ApiFuture<'_, Listing>;

    /// One page of a listing: the request as given (its `limit`, and its
    /// `page_token` to continue a listing). The answer's `next_page_token` is
    /// empty on the last page.
    fn list_page(&self, request: ListRequest) -> ApiFuture<'_, Listing>;

    /// Every resource owned by exactly `owner` (uid included), from one
    /// node's local state (never paged: `next_page_token` is empty).
    fn list_by_owner(&self, owner: Id) -> ApiFuture<'_, Listing>;

    /// Opens a watch (contract: WatchList). The call's deadline bounds the
    /// opening only; the stream lasts until the node ends it.
    fn watch_list(&self, request: WatchListRequest) -> ApiFuture<'_, Watch>;

    /// Asks the node serving the watches `watch_ids` (their [`Watch::source`]
    /// and [`Watch::watch_id`]s) for a quorum-confirmed revision and a
    /// Progress event at or above it on each of them: once each stream has
    /// delivered its Progress, it has delivered every matching change
    /// acknowledged before this call began (contract: WatchProgress).
    fn watch_progress(&self, source: &str, watch_ids: Vec<u64>) -> ApiFuture<'_, WatchProgress>;

    /// Makes the next call prefer another source than `source` (a
    /// [`Watch::source`] that served something unusable, such as a stale
    /// snapshot). A client with a single source has nothing else to prefer.
    fn avoid(&self, source: &str);
}

/// A listing or one page of it. `R` is `Arc<Resource>` for every
/// [`ResourceApi`] answer; [`Client`] gathers its own `ListResponse` pages
/// (plain resources) with the same loop.
#[derive(Debug, Clone, PartialEq)]
pub struct Listing<R = Arc<Resource>> {
    pub resources: Vec<R>,
    /// The revision every page of the listing reflects.
    pub revision: u64,
    /// The token of the next page; empty on the last page and on a whole listing.
    pub next_page_token: String,
}

impl From<ListResponse> for Listing<Resource> {
    fn from(page: ListResponse) -> Listing<Resource> {
        Listing {
            resources: page.resources,
            revision: page.revision,
            next_page_token: page.next_page_token,
        }
    }
}

impl From<Listing<Resource>> for ListResponse {
    fn from(listing: Listing<Resource>) -> ListResponse {
        ListResponse {
            resources: listing.resources,
            revision: listing.revision,
            next_page_token: listing.next_page_token,
        }
    }
}

impl Listing<Resource> {
    /// The same listing, each resource shared.
    pub fn shared(self) -> Listing {
        Listing {
            resources: self.resources.into_iter().map(Arc::new).collect(),
            revision: self.revision,
            next_page_token: self.next_page_token,
        }
    }
}

/// One event of a [`Watch`]: a change, or a marker, at `revision`.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// For a change: the revision of the entry that made it; for
    /// EndOfSnapshot: the snapshot's revision; for Progress: what the node
    /// has applied.
    pub revision: u64,
    pub kind: EventKind,
}

/// What a watch event says (contract: WatchList).
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    /// In a snapshot, a resource that matches; live, a resource written.
    Upsert(Arc<Resource>),
    /// A resource deleted, as it was last stored.
    Delete(Arc<Resource>),
    /// The snapshot is complete; live changes follow.
    EndOfSnapshot,
    /// Nothing matched changed up to `revision`.
    Progress,
}

impl Event {
    /// The event a node sent over gRPC. An event of a kind this client does
    /// not know (a newer node's) is `None`, to skip; a change without its
    /// resource is no answer a node gives: Internal.
    pub fn from_wire(event: WatchEvent) -> Result<Option<Event>, ClientError> {
        let missing = |what: &str| ClientError::Internal {
            message: format!("a watch {what} event without its resource"),
            outcome: Outcome::NotApplied,
        };
        let kind = match event.event {
            None => return Ok(None),
            Some(watch_event::Event::Upsert(u)) => {
                EventKind::Upsert(Arc::new(u.resource.ok_or_else(|| missing("upsert"))?))
            }
            Some(watch_event::Event::Delete(d)) => {
                EventKind::Delete(Arc::new(d.resource.ok_or_else(|| missing("delete"))?))
            }
            Some(watch_event::Event::EndOfSnapshot(_)) => EventKind::EndOfSnapshot,
            Some(watch_event::Event::Progress(_)) => EventKind::Progress,
        };
        Ok(Some(Event {
            revision: event.revision,
            kind,
        }))
    }
}

/// An open watch: its events, then at most one error (WatchClosed,
/// Compacted, a broken stream), after which it ends.
pub struct Watch {
    source: String,
    watch_id: Option<u64>,
    cluster_id: Option<String>,
    events: BoxStream<'static, Result<Event, ClientError>>,
}

impl Watch {
    /// A watch served by `source` (an endpoint, or the in-process node's
    /// name), which named it `watch_id` and its cluster `cluster_id` (if it
    /// did), delivering `events`.
    pub fn new(
        source: impl Into<String>,
        watch_id: Option<u64>,
        cluster_id: Option<String>,
        events: impl Stream<Item = Result<Event, ClientError>> + Send + 'static,
    ) -> Watch {
        Watch {
            source: source.into(),
            watch_id,
            cluster_id,
            events: events.boxed(),
        }
    }

    /// Who serves this watch (for [`ResourceApi::avoid`] and
    /// [`ResourceApi::watch_progress`]).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The id the serving node gave this watch, to name it in
    /// [`ResourceApi::watch_progress`] (`None` from a node that gives none).
    pub fn watch_id(&self) -> Option<u64> {
        self.watch_id
    }

    /// The id of the serving node's cluster (`None` from a node that does not say).
    pub fn cluster_id(&self) -> Option<&str> {
        self.cluster_id.as_deref()
    }

    /// The next event; `None` once the stream ended without an error.
    pub async fn next(&mut self) -> Option<Result<Event, ClientError>> {
        self.events.next().await
    }
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("source", &self.source)
            .field("watch_id", &self.watch_id)
            .field("cluster_id", &self.cluster_id)
            .finish_non_exhaustive()
    }
}

/// Gathers the whole listing `request` starts, page by page through `page`
/// (one page of a request, by a deadline), by `deadline`: the one paging loop
/// of both clients. Every page must reflect the first page's revision. When
/// that revision leaves the nodes' history between pages (`Compacted`), a
/// listing of the latest state (no `revision`, no `page_token` asked)
/// starts again from its first page, at most [`crate::LIST_RESTARTS_MAX`]
/// times and before `deadline`; otherwise the error is returned.
pub async fn whole_listing<R, F, Fut>(
    request: &ListRequest,
    deadline: Instant,
    mut page: F,
) -> Result<Listing<R>, ClientError>
where
    F: FnMut(ListRequest, Instant) -> Fut,
    Fut: Future<Output = Result<Listing<R>, ClientError>>,
{
    let restartable = request.revision == 0 && request.page_token.is_empty();
    let mut restarts = 0;
    loop {
        match pages_to_end(request, deadline, &mut page).await {
            Err(ClientError::Compacted {
                oldest_retained_revision,
            }) if restartable
                && restarts < crate::LIST_RESTARTS_MAX
                && Instant::now() < deadline =>
            {
                restarts += 1;
                tracing::debug!(
                    oldest_retained_revision,
                    restarts,
                    "list: the listing's revision was compacted between pages; starting again"
                );
            }
            result => return result,
        }
    }
}

/// Every page of the listing `request` starts, gathered, by `deadline`.
async fn pages_to_end<R, F, Fut>(
    request: &ListRequest,
    deadline: Instant,
    page: &mut F,
) -> Result<Listing<R>, ClientError>
where
    F: FnMut(ListRequest, Instant) -> Fut,
    Fut: Future<Output = Result<Listing<R>, ClientError>>,
{
    let mut listing = page(request.clone(), deadline).await?;
    if request.revision != 0 {
        // A listing asked at a revision reflects that revision, from its first page on.
        check_same_listing(request.revision, listing.revision)?;
    }
    let mut token = std::mem::take(&mut listing.next_page_token);
    while !token.is_empty() {
        let next = ListRequest {
            page_token: token,
            ..request.clone()
        };
        let more = page(next, deadline).await?;
        check_same_listing(listing.revision, more.revision)?;
        listing.resources.extend(more.resources);
        token = more.next_page_token;
    }
    Ok(listing)
}

/// An error unless a page at `page_revision` continues the listing at
/// `revision`: every page of a listing reflects its first page's revision.
pub(crate) fn check_same_listing(revision: u64, page_revision: u64) -> Result<(), ClientError> {
    if page_revision == revision {
        return Ok(());
    }
    Err(ClientError::Internal {
        message: format!(
            "a page of a listing at revision {revision} answered at revision {page_revision}"
        ),
        outcome: Outcome::NotApplied,
    })
}

impl ResourceApi for Client {
    fn read(&self, id: Id, consistency: Consistency) -> ApiFuture<'_, Arc<Resource>> {
        Box::pin(async move { Client::read(self, id, consistency).await.map(Arc::new) })
    }

    fn write(&self, resource: Resource) -> ApiFuture<'_, Arc<Resource>> {
        Box::pin(async move { Client::write(self, resource).await.map(Arc::new) })
    }

    fn delete_request(&self, request: DeleteRequest) -> ApiFuture<'_, DeleteResponse> {
        Box::pin(Client::delete_request(self, request))
    }

    fn write_status(&self, request: WriteStatusRequest) -> ApiFuture<'_, Arc<Resource>> {
        Box::pin(async move { Client::write_status(self, request).await.map(Arc::new) })
    }

    fn list(&self, request: ListRequest) -> ApiFuture<'_, Listing> {
        Box::pin(async move {
            let listing = Client::list_request(self, request).await?;
            Ok(Listing::from(listing).shared())
        })
    }

    fn list_page(&self, request: ListRequest) -> ApiFuture<'_, Listing> {
        Box::pin(async move {
            let page = Client::list_page(self, request).await?;
            Ok(Listing::from(page).shared())
        })
    }

    fn list_by_owner(&self, owner: Id) -> ApiFuture<'_, Listing> {
        Box::pin(async move {
            let ListByOwnerResponse {
                resources,
                revision,
            } = Client::list_by_owner(self, owner).await?;
            Ok(Listing {
                resources: resources.into_iter().map(Arc::new).collect(),
                revision,
                next_page_token: String::new(),
            })
        })
    }

    fn watch_list(&self, request: WatchListRequest) -> ApiFuture<'_, Watch> {
        Box::pin(async move {
            let stream = Client::watch_list(self, request).await?;
            let source = stream.endpoint().to_string();
            let watch_id = stream.watch_id();
            let cluster_id = stream.cluster_id().map(str::to_string);
            let events = futures::stream::unfold(Some(stream), |state| async move {
                let mut stream = state?;
                loop {
                    match stream.next().await? {
                        Ok(event) => match Event::from_wire(event) {
                            Ok(Some(event)) => return Some((Ok(event), Some(stream))),
                            Ok(None) => continue,
                            Err(e) => return Some((Err(e), None)),
                        },
                        Err(e) => return Some((Err(e), None)),
                    }
                }
            });
            Ok(Watch::new(source, watch_id, cluster_id, events))
        })
    }

    fn watch_progress(&self, source: &str, watch_ids: Vec<u64>) -> ApiFuture<'_, WatchProgress> {
        let source = source.to_string();
        Box::pin(async move { Client::watch_progress(self, &source, watch_ids).await })
    }

    fn avoid(&self, source: &str) {
        Client::avoid(self, source)
    }
}

impl<T: ResourceApi + ?Sized> ResourceApi for Arc<T> {
    fn read(&self, id: Id, consistency: Consistency) -> ApiFuture<'_, Arc<Resource>> {
        (**self).read(id, consistency)
    }

    fn write(&self, resource: Resource) -> ApiFuture<'_, Arc<Resource>> {
        (**self).write(resource)
    }

    fn delete_request(&self, request: DeleteRequest) -> ApiFuture<'_, DeleteResponse> {
        (**self).delete_request(request)
    }

    fn write_status(&self, request: WriteStatusRequest) -> ApiFuture<'_, Arc<Resource>> {
        (**self).write_status(request)
    }

    fn list(&self, request: ListRequest) -> ApiFuture<'_, Listing> {
        (**self).list(request)
    }

    fn list_page(&self, request: ListRequest) -> ApiFuture<'_, Listing> {
        (**self).list_page(request)
    }

    fn list_by_owner(&self, owner: Id) -> ApiFuture<'_, Listing> {
        (**self).list_by_owner(owner)
    }

    fn watch_list(&self, request: WatchListRequest) -> ApiFuture<'_, Watch> {
        (**self).watch_list(request)
    }

    fn watch_progress(&self, source: &str, watch_ids: Vec<u64>) -> ApiFuture<'_, WatchProgress> {
        (**self).watch_progress(source, watch_ids)
    }

    fn avoid(&self, source: &str) {
        (**self).avoid(source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(names: &[&str], revision: u64, next: &str) -> Listing<String> {
        Listing {
            resources: names.iter().map(|s| s.to_string()).collect(),
            revision,
            next_page_token: next.into(),
        }
    }

    #[tokio::test]
    async fn a_whole_listing_follows_the_tokens_and_starts_again_after_compaction() {
        // Pages a, b (token "2") then c; the first attempt's second page was
        // compacted: the listing starts again and ends whole, at one revision.
        let mut calls = Vec::new();
        let mut compacted_once = false;
        let listing = whole_listing(&ListRequest::default(), far(), |r, _| {
            calls.push(r.page_token.clone());
            let answer = match r.page_token.as_str() {
                "" => Ok(listed(&["a", "b"], 7, "2")),
                "2" if !compacted_once => {
                    compacted_once = true;
                    Err(ClientError::Compacted {
                        oldest_retained_revision: 9,
                    })
                }
                _ => Ok(listed(&["c"], 7, "")),
            };
            async move { answer }
        })
        .await
        .unwrap();
        assert_eq!(listing, listed(&["a", "b", "c"], 7, ""));
        assert_eq!(calls, ["", "2", "", "2"]);
    }

    #[tokio::test]
    async fn a_page_at_another_revision_is_an_error_and_a_pinned_listing_is_not_restarted() {
        // A second page at another revision: Internal. A listing at a fixed
        // revision whose pages were compacted: Compacted, not restarted.
        let moved = whole_listing(&ListRequest::default(), far(), |r, _| {
            let revision = if r.page_token.is_empty() { 7 } else { 8 };
            let next = if r.page_token.is_empty() { "2" } else { "" };
            async move { Ok(listed(&["x"], revision, next)) }
        })
        .await;
        assert!(
            matches!(moved, Err(ClientError::Internal { .. })),
            "{moved:?}"
        );
        let pinned = ListRequest {
            revision: 7,
            ..ListRequest::default()
        };
        let mut calls = 0;
        let compacted = whole_listing(&pinned, far(), |r, _| {
            calls += 1;
            let answer = if r.page_token.is_empty() {
                Ok(listed(&["a"], 7, "2"))
            } else {
                Err(ClientError::Compacted {
                    oldest_retained_revision: 9,
                })
            };
            async move { answer }
        })
        .await;
        assert!(matches!(compacted, Err(ClientError::Compacted { .. })));
        assert_eq!(calls, 2);
        // A first page at another revision than the one asked: Internal too.
        let elsewhere =
            whole_listing(&pinned, far(), |_, _| async { Ok(listed(&["a"], 8, "")) }).await;
        assert!(
            matches!(elsewhere, Err(ClientError::Internal { .. })),
            "{elsewhere:?}"
        );
    }

    #[test]
    fn wire_events_become_shared_events_and_unknown_kinds_are_skipped() {
        let upsert = WatchEvent {
            event: Some(watch_event::Event::Upsert(watch_event::Upsert {
                resource: Some(Resource::default()),
            })),
            revision: 4,
        };
        assert_eq!(
            Event::from_wire(upsert).unwrap(),
            Some(Event {
                revision: 4,
                kind: EventKind::Upsert(Arc::new(Resource::default()))
            })
        );
        let unknown = WatchEvent {
            event: None,
            revision: 5,
        };
        assert_eq!(Event::from_wire(unknown).unwrap(), None);
        let empty_delete = WatchEvent {
            event: Some(watch_event::Event::Delete(watch_event::Delete {
                resource: None,
            })),
            revision: 6,
        };
        assert!(matches!(
            Event::from_wire(empty_delete),
            Err(ClientError::Internal { .. })
        ));
    }

    fn far() -> Instant {
        Instant::now() + std::time::Duration::from_secs(60)
    }
}
