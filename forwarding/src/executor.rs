//! [`Executor`]: the one place where a request is validated and executed on
//! this node. Answers carry each resource as its stored encoding (the
//! `cairn.v1.shared` messages): a cheap `Bytes` clone, never a new encoding. It never forwards: the [`crate::Forwarder`] decides where a
//! request runs, the [`crate::ForwardingServer`] runs what a follower sent.

use std::pin::Pin;
use std::sync::Arc;

use cairn_fsm::{
    Applied, Command, LeaseApplied, PageBounds, PageToken, ReadScope, View, WatchFilter,
};
use cairn_proto::error::ApiError;
use cairn_proto::v1::{self as pb, shared, Consistency};
use futures::Stream;

use crate::handle::{Handle, ReadAt};

/// This node's wall-clock time in Unix milliseconds: what the leader proposes with a
/// command that may mark a resource for deletion (`cairn_fsm::lifecycle`; the mark is an
/// RFC 3339 time a person reads, never a deadline, so the wall clock is the right one).
pub fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The refusal of an owner lookup that matches more than `list_results_max`
/// resources.
fn too_many_results(results_max: usize) -> ApiError {
    ApiError::exhausted(
        "list_results_max",
        results_max as u64,
        format!("the owner lookup matches more than {results_max} resources"),
    )
}

/// The stored encoding of what a write or status write (`what`) applied as: a written
/// resource whose version is its entry's index.
fn written(what: &str, (index, applied): (u64, Applied)) -> Result<bytes::Bytes, ApiError> {
    match applied {
        Applied::Written(resource) => {
            assert_eq!(
                resource.version(),
                index.to_string(),
                "a written resource's version is its entry's index"
            );
            Ok(resource.encoded().clone())
        }
        other => Err(ApiError::Internal(format!(
            "{what} at index {index} applied as {other:?}"
        ))),
    }
}

/// `command`, applied only while `fence` holds, if there is one.
fn fenced(fence: Option<pb::Fence>, command: Command) -> Command {
    match fence {
        Some(fence) => Command::Fenced {
            fence,
            command: Box::new(command),
        },
        None => command,
    }
}

/// The watch stream served to clients: events (each resource as its stored
/// bytes), then at most one error (WatchClosed, Compacted), after which the
/// stream ends. Errors are the one vocabulary, [`ApiError`]: only the gRPC
/// edge turns them into statuses, so an in-process caller gets them as they are.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<shared::WatchEvent, ApiError>> + Send>>;

/// A watch opened on this node: its id (what `WatchProgress` names it by,
/// sent to the client as [`cairn_proto::WATCH_ID_HEADER`]) and its events.
pub struct OpenedWatch {
    pub id: u64,
    pub events: WatchStream,
}

/// Validates and executes requests against this node's [`Handle`].
pub struct Executor<H> {
    handle: Arc<H>,
    /// Where a strong read or list may be confirmed ([`Handle::confirm_read`]).
    strong_reads: ReadAt,
    /// True once a read index confirmed after this node started was applied here
    /// ([`Executor::confirm_read`]); clones share it.
    caught_up: Arc<tokio::sync::watch::Sender<bool>>,
}

impl<H> Clone for Executor<H> {
    fn clone(&self) -> Self {
        Executor {
            handle: self.handle.clone(),
            strong_reads: self.strong_reads,
            caught_up: self.caught_up.clone(),
        }
    }
}

/// The consistency a request asked for; an unknown value is InvalidArgument
/// naming the field.
fn consistency(value: i32) -> Result<Consistency, ApiError> {
    Consistency::try_from(value).map_err(|_| {
        ApiError::invalid(
            "consistency",
            format!("unknown consistency value {value} (0 = eventual, 1 = strong)"),
        )
    })
}

impl<H: Handle> Executor<H> {
    /// `strong_reads`: where strong reads and lists are confirmed. The
    /// `ForwardingServer` runs what followers sent with [`ReadAt::Leader`]
    /// (it never passes a request on); the client port's forwarder with the
    /// node's `follower_strong_reads`.
    pub fn new(handle: Arc<H>, strong_reads: ReadAt) -> Executor<H> {
        Executor {
            handle,
            strong_reads,
            caught_up: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }

    pub fn handle(&self) -> &Arc<H> {
        &self.handle
    }

    /// [`Handle::confirm_read`], and on success this node counts as caught up since its
    /// start: it has applied an index confirmed after it started ([`Executor::caught_up`]).
    /// Every confirmation on this node goes through here.
    pub async fn confirm_read(&self, at: ReadAt) -> Result<u64, ApiError> {
        let index = self.handle.confirm_read(at).await?;
        self.caught_up
            .send_if_modified(|caught_up| !std::mem::replace(caught_up, true));
        Ok(index)
    }

    /// Whether this node has applied a read index confirmed since it started (by a strong
    /// request or by the catch-up after the start), as a receiver that changes once.
    pub fn caught_up(&self) -> tokio::sync::watch::Receiver<bool> {
        self.caught_up.subscribe()
    }

    fn limits(&self) -> &cairn_fsm::Limits {
        self.handle.store().limits()
    }

    // ---- validation: pure ([`checks`], against this node's limits), run on
    // the receiving node and again on the executing one.

    /// Validates a read; returns the consistency it asks for.
    pub fn check_read(&self, r: &pb::ReadRequest) -> Result<Consistency, ApiError> {
        checks::read(self.limits(), r)
    }

    /// Validates a write (the resource as the store will check it).
    pub fn check_write(&self, r: &pb::WriteRequest) -> Result<(), ApiError> {
        checks::write(self.limits(), r)
    }

    /// Validates a delete.
    pub fn check_delete(&self, r: &pb::DeleteRequest) -> Result<(), ApiError> {
        checks::delete(self.limits(), r)
    }

    /// Validates a status write.
    pub fn check_write_status(&self, r: &pb::WriteStatusRequest) -> Result<(), ApiError> {
        checks::write_status(self.limits(), r)
    }

    /// Validates a list; returns the consistency it asks for.
    pub fn check_list(&self, r: &pb::ListRequest) -> Result<Consistency, ApiError> {
        checks::list(self.limits(), r)
    }

    /// Validates a WatchList request (the same filter rules as a List);
    /// returns the consistency it asks for.
    pub fn check_watch(&self, r: &pb::WatchListRequest) -> Result<Consistency, ApiError> {
        checks::watch(self.limits(), r)
    }

    /// Validates a ListByOwner request.
    pub fn check_list_by_owner(&self, r: &pb::ListByOwnerRequest) -> Result<(), ApiError> {
        checks::list_by_owner(self.limits(), r)
    }

    // ---- execution on this node.

    /// Validates, then reads here: a strong read first ensures strong
    /// consistency on this node (NotLeader on a follower).
    pub async fn read(&self, r: pb::ReadRequest) -> Result<shared::ReadResponse, ApiError> {
        let consistency = self.check_read(&r)?;
        self.read_checked(r, consistency).await
    }

    /// Validates, then writes through this node's Raft; NotLeader on a follower.
    pub async fn write(&self, r: pb::WriteRequest) -> Result<shared::WriteResponse, ApiError> {
        self.check_write(&r)?;
        self.write_checked(r).await
    }

    /// Validates, then deletes through this node's Raft; NotLeader on a follower.
    pub async fn delete(&self, r: pb::DeleteRequest) -> Result<pb::DeleteResponse, ApiError> {
        self.check_delete(&r)?;
        self.delete_checked(r).await
    }

    /// Validates, then writes a status entry through this node's Raft; NotLeader on a
    /// follower, FailedPrecondition while the cluster version is below 0.2.
    pub async fn write_status(
        &self,
        r: pb::WriteStatusRequest,
    ) -> Result<shared::WriteStatusResponse, ApiError> {
        self.check_write_status(&r)?;
        self.write_status_checked(r).await
    }

    /// Validates, then lists one page here: a strong list's first page
    /// first ensures strong consistency on this node (NotLeader on a
    /// follower).
    pub async fn list(&self, r: pb::ListRequest) -> Result<shared::ListResponse, ApiError> {
        let consistency = self.check_list(&r)?;
        self.list_checked(r, consistency, None).await
    }

    /// The view a request reads: for a strong request, after a read index
    /// was confirmed (here on the leader, or through it) and applied here.
    async fn view_for(&self, consistency: Consistency, revision: u64) -> Result<View, ApiError> {
        self.handle.serves_reads()?;
        let confirmed_index = match consistency {
            Consistency::Strong => Some(self.confirm_read(self.strong_reads).await?),
            Consistency::Eventual => None,
        };
        let view = self.handle.store().view_at(revision)?;
        if let (Some(index), 0) = (confirmed_index, revision) {
            // The Handle contract: the store has applied at least the index
            // returned, so the latest view reflects every acknowledged write.
            assert!(
                view.revision() >= index,
                "strong read at revision {} below the confirmed index {index}",
                view.revision()
            );
        }
        Ok(view)
    }

    pub(crate) async fn read_checked(
        &self,
        r: pb::ReadRequest,
        consistency: Consistency,
    ) -> Result<shared::ReadResponse, ApiError> {
        let view = self.view_for(consistency, r.revision).await?;
        let id =
            r.id.as_ref()
                .ok_or_else(|| ApiError::invalid("id", "is required"))?;
        let resource = view.read(id)?;
        Ok(shared::ReadResponse {
            resource: Some(resource.encoded().clone()),
            revision: view.revision(),
        })
    }

    /// One page of a listing, of what `visible` shows (`None`: everything):
    /// only that is counted against the page's bounds. The first page reads
    /// the view the request asks for (a strong one confirmed first, as any
    /// strong read); a later page reads the view at its token's revision, so
    /// every page of a listing reflects its first page's revision.
    pub(crate) async fn list_checked(
        &self,
        r: pb::ListRequest,
        consistency: Consistency,
        visible: Option<&ReadScope>,
    ) -> Result<shared::ListResponse, ApiError> {
        let selector = checks::selector(&r.selector)?;
        let filter = checks::list_filter(&r, selector.as_ref())?;
        let token = checks::page_token(&r, &filter)?;
        let view = match &token {
            None => self.view_for(consistency, r.revision).await?,
            Some(token) => self.page_view(token)?,
        };
        let bounds = PageBounds::for_request(r.limit, self.limits());
        let page = view.list_page(&filter, visible, token.as_ref(), bounds);
        Ok(shared::ListResponse {
            resources: page.resources.iter().map(|r| r.encoded().clone()).collect(),
            revision: view.revision(),
            next_page_token: page.next.map(|t| t.encode()).unwrap_or_default(),
        })
    }

    /// The view a later page of a listing reads: the one at its token's
    /// revision. A revision this node has not applied yet (the token came
    /// from a node further ahead) is Unavailable, to retry here later or
    /// elsewhere; one older than the retained history is Compacted (the
    /// listing must start again).
    fn page_view(&self, token: &PageToken) -> Result<View, ApiError> {
        let store = self.handle.store();
        let applied = store.applied_index();
        if token.revision() > applied {
            return Err(ApiError::Unavailable(format!(
                "page_token: the listing's revision {} is not applied on this node yet \
                 (applied {applied}); retry",
                token.revision()
            )));
        }
        let view = store.view_at(token.revision())?;
        assert_eq!(
            view.revision(),
            token.revision(),
            "a later page reads its listing's revision"
        );
        Ok(view)
    }

    pub(crate) async fn write_checked(
        &self,
        r: pb::WriteRequest,
    ) -> Result<shared::WriteResponse, ApiError> {
        let resource = r
            .resource
            .ok_or_else(|| ApiError::invalid("resource", "is required"))?;
        // `propose` checks leadership (the one check of this request): on a node that does
        // not lead it answers NotLeader, certainly not proposed.
        let command = fenced(r.fence, Command::Write { resource });
        let resource = written("write", self.handle.propose(command).await?)?;
        Ok(shared::WriteResponse {
            resource: Some(resource),
        })
    }

    /// A status write. [`Handle::propose`] refuses it while the cluster version is below
    /// 0.2 (`cairn_fsm::Command::needs`), on a follower before it is forwarded.
    pub(crate) async fn write_status_checked(
        &self,
        r: pb::WriteStatusRequest,
    ) -> Result<shared::WriteStatusResponse, ApiError> {
        let id = r.id.ok_or_else(|| ApiError::invalid("id", "is required"))?;
        let command = fenced(
            r.fence,
            Command::WriteStatus {
                id,
                key: r.key,
                status: r.status.unwrap_or_default(),
                version: r.version,
            },
        );
        let resource = written("status write", self.handle.propose(command).await?)?;
        Ok(shared::WriteStatusResponse {
            resource: Some(resource),
        })
    }

    pub(crate) async fn delete_checked(
        &self,
        r: pb::DeleteRequest,
    ) -> Result<pb::DeleteResponse, ApiError> {
        let id = r.id.ok_or_else(|| ApiError::invalid("id", "is required"))?;
        let command = fenced(
            r.fence,
            Command::Delete {
                id,
                version: r.version,
                now_ms: wall_clock_ms(),
                orphan: r.orphan_dependents,
            },
        );
        match self.handle.propose(command).await? {
            (index, Applied::Deleted { .. }) => {
                assert!(index > 0, "a delete entry has a log index");
                Ok(pb::DeleteResponse {
                    revision: index,
                    marked: false,
                })
            }
            (index, Applied::Marked(_)) => {
                assert!(index > 0, "a delete entry has a log index");
                Ok(pb::DeleteResponse {
                    revision: index,
                    marked: true,
                })
            }
            (index, other) => Err(ApiError::Internal(format!(
                "delete at index {index} applied as {other:?}"
            ))),
        }
    }

    /// Validates, then runs a lease grant, revoke or keep-alive through this node's Raft;
    /// NotLeader on a follower.
    pub async fn lease(
        &self,
        r: pb::LeaseCommandRequest,
    ) -> Result<pb::LeaseCommandResponse, ApiError> {
        self.check_lease(&r)?;
        self.lease_checked(r).await
    }

    /// Checks a lease command against this node's limits (`lease_ttl_min_ms`,
    /// `lease_ttl_max_ms`, `leases_max`; apply checks the hard bounds).
    pub fn check_lease(&self, r: &pb::LeaseCommandRequest) -> Result<(), ApiError> {
        checks::lease(self.limits(), self.handle.store().view().lease_count(), r)
    }

    pub(crate) async fn lease_checked(
        &self,
        r: pb::LeaseCommandRequest,
    ) -> Result<pb::LeaseCommandResponse, ApiError> {
        use pb::lease_command_request::Command as Asked;
        use pb::lease_command_response::Answer;
        let command = match r.command {
            Some(Asked::Grant(g)) => Command::LeaseGrant { ttl_ms: g.ttl_ms },
            Some(Asked::Revoke(v)) => Command::LeaseRevoke {
                id: v.id,
                now_ms: wall_clock_ms(),
            },
            Some(Asked::KeepAlive(k)) => Command::LeaseKeepAlive { ids: k.ids },
            None => return Err(ApiError::invalid("command", "is required")),
        };
        let (index, applied) = self.handle.propose(command).await?;
        let answer = match applied {
            Applied::Lease(LeaseApplied::Granted(lease)) => Answer::Grant(pb::LeaseGrantResponse {
                id: lease.id,
                ttl_ms: lease.ttl_ms,
                revision: index,
            }),
            Applied::Lease(LeaseApplied::Revoked { existed, deleted }) => {
                Answer::Revoke(pb::LeaseRevokeResponse {
                    revision: if existed { index } else { 0 },
                    deleted_count: deleted,
                })
            }
            Applied::Lease(LeaseApplied::KeptAlive(answers)) => {
                Answer::KeepAlive(pb::LeaseKeepAliveAnswers {
                    leases: answers
                        .into_iter()
                        .map(|(id, ttl_ms)| pb::LeaseKeepAliveResponse { id, ttl_ms })
                        .collect(),
                })
            }
            other => {
                return Err(ApiError::Internal(format!(
                    "lease command at index {index} applied as {other:?}"
                )))
            }
        };
        Ok(pb::LeaseCommandResponse {
            answer: Some(answer),
        })
    }

    /// ListByOwner: always local (contract section 3). Only what `visible`
    /// shows (`None`: everything) is listed and counted.
    pub fn list_by_owner(
        &self,
        r: pb::ListByOwnerRequest,
        visible: Option<&ReadScope>,
    ) -> Result<shared::ListByOwnerResponse, ApiError> {
        checks::list_by_owner(self.limits(), &r)?;
        self.handle.serves_reads()?;
        let owner = r.owner.expect("checked: an owner is given");
        let view = self.handle.store().view();
        let results_max = self.limits().list_results_max;
        let resources = view
            .list_by_owner_at_most(&owner, visible, results_max)
            .ok_or_else(|| too_many_results(results_max))?
            .iter()
            .map(|r| r.encoded().clone())
            .collect();
        Ok(shared::ListByOwnerResponse {
            resources,
            revision: view.revision(),
        })
    }

    /// WatchList: always local, opened at what this node has applied; with
    /// `confirmed_index` (a strong watch), that is at least this read index,
    /// which [`Handle::confirm_read`] confirmed and this node applied. The
    /// stream yields the fsm's events and ends after the first error
    /// (WatchClosed, Compacted).
    pub fn watch(
        &self,
        r: pb::WatchListRequest,
        confirmed_index: Option<u64>,
    ) -> Result<OpenedWatch, ApiError> {
        self.check_watch(&r)?;
        self.handle.serves_reads()?;
        if let Some(index) = confirmed_index {
            // The Handle contract: this node applied the confirmed index, so the
            // snapshot (taken from the latest state, at or above it) holds every
            // write acknowledged before the watch was requested.
            let applied = self.handle.store().applied_index();
            assert!(
                applied >= index,
                "a strong watch opens at {applied}, below the confirmed index {index}"
            );
        }
        let type_ = r.r#type.expect("checked: a watch names its type");
        let tenancy = r.tenancy.unwrap_or_default();
        let filter = WatchFilter {
            type_,
            tenancy,
            name_prefix: r.name_prefix,
            selector: checks::selector(&r.selector)?.map(std::sync::Arc::new),
        };
        let watch = self.handle.store().watch(filter, r.start_revision)?;
        let id = watch.id();
        let stream = futures::stream::unfold(Some(watch), |state| async move {
            let mut watch = state?;
            match watch.next().await {
                Ok(event) => Some((Ok(event.to_shared()), Some(watch))),
                Err(e) => Some((Err(ApiError::from(e)), None)),
            }
        });
        Ok(OpenedWatch {
            id,
            events: Box::pin(stream),
        })
    }

    /// Validates a WatchProgress request ([`checks::watch_progress`]).
    pub fn check_watch_progress(r: &pb::WatchProgressRequest) -> Result<(), ApiError> {
        checks::watch_progress(r)
    }

    /// WatchProgress, after [`Handle::confirm_read`] confirmed
    /// `confirmed_index` and this node applied it: a Progress event on each
    /// named watch of this node, at the applied revision (at or above the
    /// confirmed index). Answers with the confirmed index.
    pub fn watch_progress(
        &self,
        r: &pb::WatchProgressRequest,
        confirmed_index: u64,
    ) -> pb::WatchProgressResponse {
        let (revision, delivered_watch_ids) = self.handle.store().request_progress(&r.watch_ids);
        assert!(
            revision >= confirmed_index,
            "progress at {revision}, below the confirmed index {confirmed_index}"
        );
        pb::WatchProgressResponse {
            revision: confirmed_index,
            delivered_watch_ids,
        }
    }
}

/// The validation of every request the executor runs, as pure functions of
/// the node's configured limits: the executor's `check_*` methods call
/// them, and so can anything that must validate exactly as a node does
/// (the decoders' fuzz harness).
pub mod checks {
    use cairn_fsm::{Limits, ListFilter, PageToken, Selector};
    use cairn_proto::error::ApiError;
    use cairn_proto::v1::{self as pb, Consistency};

    use super::consistency;

    /// A read; returns the consistency it asks for.
    pub fn read(limits: &Limits, r: &pb::ReadRequest) -> Result<Consistency, ApiError> {
        let consistency = consistency(r.consistency)?;
        let id =
            r.id.as_ref()
                .ok_or_else(|| ApiError::invalid("id", "is required"))?;
        cairn_fsm::validate_id("id", id, limits)?;
        Ok(consistency)
    }

    /// A write (the resource as the store will check it).
    pub fn write(limits: &Limits, r: &pb::WriteRequest) -> Result<(), ApiError> {
        let resource = r
            .resource
            .as_ref()
            .ok_or_else(|| ApiError::invalid("resource", "is required"))?;
        cairn_fsm::validate_write(resource, limits)?;
        cairn_fsm::capacity::validate_quota_write(resource)?;
        fence(limits, r.fence.as_ref())
    }

    /// A fence, if any: it names a resource and a token (whether it holds is checked at
    /// apply).
    pub fn fence(limits: &Limits, fence: Option<&pb::Fence>) -> Result<(), ApiError> {
        if let Some(fence) = fence {
            cairn_fsm::validate_fence(fence, limits)?;
        }
        Ok(())
    }

    /// A lease command, against this node's limits; `lease_count` leases exist.
    pub fn lease(
        limits: &Limits,
        lease_count: usize,
        r: &pb::LeaseCommandRequest,
    ) -> Result<(), ApiError> {
        use pb::lease_command_request::Command as Asked;
        match &r.command {
            Some(Asked::Grant(g)) => {
                cairn_fsm::lease::check_ttl(
                    g.ttl_ms,
                    limits.lease_ttl_min_ms,
                    limits.lease_ttl_max_ms,
                    " (lease_ttl_min_ms..=lease_ttl_max_ms)",
                )?;
                cairn_fsm::lease::check_grant(g.ttl_ms, lease_count, limits.leases_max)?;
            }
            Some(Asked::Revoke(v)) if v.id == 0 => {
                return Err(ApiError::invalid("id", "0 is not a lease id"))
            }
            Some(Asked::Revoke(_)) => {}
            Some(Asked::KeepAlive(k)) => cairn_fsm::lease::check_ids(&k.ids)?,
            None => return Err(ApiError::invalid("command", "is required")),
        }
        Ok(())
    }

    /// A delete.
    pub fn delete(limits: &Limits, r: &pb::DeleteRequest) -> Result<(), ApiError> {
        fence(limits, r.fence.as_ref())?;
        let id =
            r.id.as_ref()
                .ok_or_else(|| ApiError::invalid("id", "is required"))?;
        cairn_fsm::validate_id("id", id, limits)?;
        if r.version.len() > limits.name_bytes_max {
            return Err(ApiError::invalid(
                "version",
                format!(
                    "is {} bytes, more than the limit of {}",
                    r.version.len(),
                    limits.name_bytes_max
                ),
            ));
        }
        Ok(())
    }

    /// A status write (as the store will check it at apply).
    pub fn write_status(limits: &Limits, r: &pb::WriteStatusRequest) -> Result<(), ApiError> {
        let id =
            r.id.as_ref()
                .ok_or_else(|| ApiError::invalid("id", "is required"))?;
        let status = r
            .status
            .as_ref()
            .ok_or_else(|| ApiError::invalid("status", "is required"))?;
        cairn_fsm::validate_write_status(id, &r.key, status, &r.version, limits)?;
        fence(limits, r.fence.as_ref())
    }

    /// A list; returns the consistency it asks for. Its page token, if
    /// any, must be one of this listing (see [`page_token`]).
    pub fn list(limits: &Limits, r: &pb::ListRequest) -> Result<Consistency, ApiError> {
        let consistency = consistency(r.consistency)?;
        filter(
            limits,
            r.r#type.as_ref(),
            r.tenancy.as_ref(),
            &r.name_prefix,
        )?;
        let selector = selector(&r.selector)?;
        page_token(r, &list_filter(r, selector.as_ref())?)?;
        Ok(consistency)
    }

    /// The metadata selector of a List or WatchList ("" = none), parsed: bad syntax is
    /// InvalidArgument on `selector`, saying where and what.
    pub fn selector(text: &str) -> Result<Option<Selector>, ApiError> {
        match text.trim().is_empty() {
            true => Ok(None),
            false => Selector::parse(text)
                .map(Some)
                .map_err(|e| ApiError::invalid("selector", e.to_string())),
        }
    }

    /// The filter of a list request: its type (required) and tenancy (none:
    /// the default one), name prefix and `selector` (parsed from the request's).
    pub fn list_filter<'a>(
        r: &'a pb::ListRequest,
        selector: Option<&'a Selector>,
    ) -> Result<ListFilter<'a>, ApiError> {
        /// The tenancy of a request that names none.
        static DEFAULT_TENANCY: pb::Tenancy = pb::Tenancy {
            partition: String::new(),
            namespace: String::new(),
        };
        let type_ = r
            .r#type
            .as_ref()
            .ok_or_else(|| ApiError::invalid("type", "is required"))?;
        Ok(ListFilter {
            type_,
            tenancy: r.tenancy.as_ref().unwrap_or(&DEFAULT_TENANCY),
            name_prefix: &r.name_prefix,
            selector,
        })
    }

    /// The page token of a list of `filter` (`None`: a first page), decoded
    /// and checked: a malformed token, one of another listing, or one whose
    /// revision disagrees with the request's `revision` (0 = follow the
    /// token) is InvalidArgument on `page_token`.
    pub fn page_token(
        r: &pb::ListRequest,
        filter: &ListFilter<'_>,
    ) -> Result<Option<PageToken>, ApiError> {
        if r.page_token.is_empty() {
            return Ok(None);
        }
        let token = PageToken::decode(&r.page_token, filter)?;
        if r.revision != 0 && r.revision != token.revision() {
            return Err(ApiError::invalid(
                "page_token",
                format!(
                    "continues a listing at revision {}, but the request asks for revision {}",
                    token.revision(),
                    r.revision
                ),
            ));
        }
        Ok(Some(token))
    }

    /// A WatchProgress names at most [`WATCH_PROGRESS_IDS_MAX`] watches.
    pub fn watch_progress(r: &pb::WatchProgressRequest) -> Result<(), ApiError> {
        if r.watch_ids.len() > WATCH_PROGRESS_IDS_MAX {
            return Err(ApiError::invalid(
                "watch_ids",
                format!(
                    "names {} watches, more than {WATCH_PROGRESS_IDS_MAX}",
                    r.watch_ids.len()
                ),
            ));
        }
        Ok(())
    }

    /// The most watches one WatchProgress names (a cache has one watch per type).
    pub const WATCH_PROGRESS_IDS_MAX: usize = 1024;

    /// A WatchList request (the same filter rules as a List); returns the
    /// consistency it asks for.
    pub fn watch(limits: &Limits, r: &pb::WatchListRequest) -> Result<Consistency, ApiError> {
        let consistency = consistency(r.consistency)?;
        filter(
            limits,
            r.r#type.as_ref(),
            r.tenancy.as_ref(),
            &r.name_prefix,
        )?;
        selector(&r.selector)?;
        Ok(consistency)
    }

    /// A ListByOwner request: its owner id.
    pub fn list_by_owner(limits: &Limits, r: &pb::ListByOwnerRequest) -> Result<(), ApiError> {
        let owner = r
            .owner
            .as_ref()
            .ok_or_else(|| ApiError::invalid("owner", "is required"))?;
        cairn_fsm::validate_id("owner", owner, limits)?;
        Ok(())
    }

    /// The one rule for a List's or a WatchList's filter: a type is
    /// required; the tenancy defaults to the empty (default) one.
    fn filter(
        limits: &Limits,
        type_: Option<&pb::Type>,
        tenancy: Option<&pb::Tenancy>,
        name_prefix: &str,
    ) -> Result<(), ApiError> {
        let type_ = type_.ok_or_else(|| ApiError::invalid("type", "is required"))?;
        let default_tenancy = pb::Tenancy::default();
        let tenancy = tenancy.unwrap_or(&default_tenancy);
        cairn_fsm::validate_list(type_, tenancy, name_prefix, limits)?;
        Ok(())
    }
}
