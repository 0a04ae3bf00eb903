//! Elections and locks over one resource, in the manner of etcd's `concurrency` package
//! but with the store's own compare-and-set and fencing (`docs/contract.md`, "Leases"
//! and "Fencing").
//!
//! An election named NAME is the resource of type `cairn/v1/Election` ([`election_type`])
//! named NAME in a tenancy (default `default/default`). Whoever holds it is the leader:
//! its metadata `holder` ([`HOLDER_METADATA_KEY`]) is the holder's identity, and it is
//! attached to the holder's lease (`resource.lease`), so the cluster deletes it when the
//! lease expires or is revoked. The holder's **fencing token** is the resource's version
//! (a log index): a later holder's is always higher.
//!
//! - [`Election::campaign`]: create the resource (expected version empty: create-only);
//!   if someone holds it, watch it until it is deleted and try again; give up if the
//!   lease is lost meanwhile. Returns a [`Leadership`].
//! - [`Leadership::lost`]: resolves when the lease is lost ([`crate::lease`]'s rule) or
//!   the election resource is deleted or replaced (watched).
//! - [`Leadership::fence`], and the fenced calls [`Leadership::write`],
//!   [`Leadership::delete`], [`Leadership::write_status`]: applied only while the
//!   election is still held at this token; the cluster refuses them (FailedPrecondition)
//!   once another holder won, whatever the old holder's clock says.
//! - [`Leadership::resign`]: delete the election resource at its version (CAS); the
//!   lease is left alone.
//! - [`Election::leader`] reads the holder once; [`Election::observe`] follows it.
//!
//! There is no queue: when the holder goes, every waiting candidate tries to create the
//! resource and one wins.
//!
//! ## Invariants
//! - A [`Leadership`] is only returned for a resource this call created (or one already
//!   attached to the campaigning lease), at the version the store gave it.
//! - A leadership is reported lost, for good, once its lease is lost or its resource is
//!   no longer stored at its uid and token; never the other way round.
//! - An [`Observer`] reports a holder only from a complete snapshot or a later change,
//!   and never the same holder twice in a row.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use cairn_proto::v1::{
    watch_event, Consistency, DeleteRequest, Fence, Id, Reference, Resource, Tenancy, Type,
    WatchListRequest, WriteRequest, WriteStatusRequest,
};
use tokio::sync::watch;

use crate::error::ClientError;
use crate::lease::{lease_lost_error, lost_of, LeaseLoss, LeaseState};
use crate::{Client, Lease, WatchStream};

/// The group of an election's type.
pub const ELECTION_GROUP: &str = "cairn";
/// The group version of an election's type.
pub const ELECTION_GROUP_VERSION: &str = "v1";
/// The kind of an election's type.
pub const ELECTION_KIND: &str = "Election";
/// The metadata key holding the holder's identity.
pub const HOLDER_METADATA_KEY: &str = "holder";

/// `cairn/v1/Election`.
pub fn election_type() -> Type {
    Type {
        group: ELECTION_GROUP.into(),
        group_version: ELECTION_GROUP_VERSION.into(),
        kind: ELECTION_KIND.into(),
    }
}

/// `default/default`, the tenancy of an election unless another is given.
pub fn default_tenancy() -> Tenancy {
    Tenancy {
        partition: "default".into(),
        namespace: "default".into(),
    }
}

/// Who holds an election, as its resource says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The identity the holder campaigned with (metadata `holder`).
    pub identity: String,
    /// The fencing token: the version the resource was created at.
    pub token: u64,
    /// The lease it is attached to (0: none, not made by a campaign).
    pub lease: u64,
    /// The resource's uid (tells apart two holdings of one token after a restore).
    pub uid: String,
}

impl Holder {
    /// The holder an election resource names. A version that is not a number (not a
    /// Cairn version) gives token 0, which no fence accepts.
    pub fn of(resource: &Resource) -> Holder {
        Holder {
            identity: resource
                .metadata
                .get(HOLDER_METADATA_KEY)
                .cloned()
                .unwrap_or_default(),
            token: resource.version.parse().unwrap_or(0),
            lease: resource.lease,
            uid: resource
                .id
                .as_ref()
                .map(|i| i.uid.clone())
                .unwrap_or_default(),
        }
    }
}

/// An election: a name in a tenancy, on a client. Cheap to clone.
#[derive(Clone)]
pub struct Election {
    client: Client,
    name: String,
    tenancy: Tenancy,
}

impl Election {
    /// The election `name` in `tenancy` (default `default/default`).
    pub fn new(client: Client, name: impl Into<String>, tenancy: Option<Tenancy>) -> Election {
        Election {
            client,
            name: name.into(),
            tenancy: tenancy.unwrap_or_else(default_tenancy),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn tenancy(&self) -> &Tenancy {
        &self.tenancy
    }

    /// The election resource's id, any lifetime (empty uid).
    pub fn id(&self) -> Id {
        Id {
            uid: String::new(),
            name: self.name.clone(),
            r#type: Some(election_type()),
            tenancy: Some(self.tenancy.clone()),
        }
    }

    /// The election resource as a fence names it.
    pub fn reference(&self) -> Reference {
        Reference {
            r#type: Some(election_type()),
            tenancy: Some(self.tenancy.clone()),
            name: self.name.clone(),
            section: String::new(),
        }
    }

    /// The fence of the holding at `token`.
    pub fn fence(&self, token: u64) -> Fence {
        Fence {
            election: Some(self.reference()),
            token,
        }
    }

    /// The resource a candidate creates: no version (create only), a new uid, its
    /// identity, attached to its lease.
    fn candidate(&self, lease_id: u64, identity: &str) -> Resource {
        Resource {
            id: Some(Id {
                uid: crate::new_uid(),
                ..self.id()
            }),
            metadata: BTreeMap::from([(HOLDER_METADATA_KEY.to_string(), identity.to_string())]),
            lease: lease_id,
            ..Default::default()
        }
    }

    /// Campaigns with `lease` as `identity` until this candidate holds the election (see
    /// the module docs). Ends with an error when the lease is lost first
    /// (FailedPrecondition, naming the lease), or on a failure no retry can cure (a
    /// refused credential, an invalid name). A transient failure while waiting (a node
    /// gone) is retried; one of the create itself is returned.
    pub async fn campaign(
        &self,
        lease: &Lease,
        identity: impl Into<String>,
    ) -> Result<Leadership, ClientError> {
        let identity = identity.into();
        let lost = lease.lost();
        tokio::pin!(lost);
        loop {
            if let Some(loss) = lease.loss() {
                return Err(lease_lost_error(lease.id(), &loss));
            }
            let resource = self.candidate(lease.id(), &identity);
            let (stored, created) = tokio::select! {
                loss = &mut lost => return Err(lease_lost_error(lease.id(), &loss)),
                attempt = self.client.create_if_absent(resource) => attempt?,
            };
            if campaign_won(&stored, created, lease.id()) {
                return Ok(Leadership::start(self.clone(), &stored, lease));
            }
            tracing::debug!(
                election = %self.name,
                holder = ?Holder::of(&stored),
                "the election is held; waiting until it is free"
            );
            let mut observer = self.observe();
            loop {
                let change = tokio::select! {
                    loss = &mut lost => return Err(lease_lost_error(lease.id(), &loss)),
                    change = observer.next() => change?,
                };
                if change.is_none() {
                    break;
                }
            }
        }
    }

    /// The current holder, read strongly; `None` when nobody holds it.
    pub async fn leader(&self) -> Result<Option<Holder>, ClientError> {
        match self.client.read(self.id(), Consistency::Strong).await {
            Ok(resource) => Ok(Some(Holder::of(&resource))),
            Err(ClientError::NotFound) => Ok(None),
            Err(ClientError::GroupVersionMismatch { stored, .. }) => Ok(Some(Holder::of(&stored))),
            Err(e) => Err(e),
        }
    }

    /// Follows the holder: [`Observer::next`] gives the current one, then each change.
    /// Nothing is sent until the first `next`.
    pub fn observe(&self) -> Observer {
        Observer {
            election: self.clone(),
            stream: None,
            snapshot: None,
            reported: None,
            pause: PAUSE_INITIAL,
        }
    }
}

/// Whether a campaign's create (or what it found instead) makes the candidate the
/// holder: it created the resource, or the resource found is attached to its own lease
/// (an earlier campaign of the same lease won).
///
/// | created | stored resource's lease | won |
/// |---------|-------------------------|-----|
/// | yes | any | yes |
/// | no | the campaigning lease | yes |
/// | no | another lease, or none | no |
pub fn campaign_won(stored: &Resource, created: bool, lease_id: u64) -> bool {
    created || (lease_id != 0 && stored.lease == lease_id)
}

/// Whether the holding `held` still stands given what the election resource holds now
/// (`None`: nothing). Same uid and same token, or it is over.
pub fn still_held(held: &Holder, now: Option<&Holder>) -> bool {
    now.is_some_and(|now| now.uid == held.uid && now.token == held.token)
}

/// Whether a failed election watch is worth opening again: the cluster or a node was
/// unavailable, or the node ended the watch. A verdict no retry changes (a refused
/// credential, an invalid name, an old cluster) is returned to the caller.
pub fn watch_failure_is_transient(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Unavailable { .. }
            | ClientError::DeadlineExceeded { .. }
            | ClientError::Inconsistent { .. }
            | ClientError::WatchClosed(_)
            | ClientError::Compacted { .. }
    )
}

const PAUSE_INITIAL: Duration = Duration::from_millis(50);
const PAUSE_MAX: Duration = Duration::from_secs(1);

/// Follows an election's holder over a watch of its resource ([`Election::observe`]):
/// a fresh strong snapshot on every (re)opening, then the live changes.
pub struct Observer {
    election: Election,
    stream: Option<WatchStream>,
    /// The holder the snapshot under way shows so far (`Some` once it began).
    snapshot: Option<Option<Holder>>,
    /// The last holder [`Observer::next`] returned (`None`: nothing returned yet).
    reported: Option<Option<Holder>>,
    pause: Duration,
}

impl Observer {
    /// The current holder at the first call, then the next change of holder (`None`:
    /// nobody holds it). Waits as long as nothing changes; a broken watch is opened
    /// again (on another node) after a pause. An error only for a failure no retry can
    /// cure ([`watch_failure_is_transient`]).
    pub async fn next(&mut self) -> Result<Option<Holder>, ClientError> {
        loop {
            let Some(stream) = self.stream.as_mut() else {
                match self.open().await {
                    Ok(stream) => self.stream = Some(stream),
                    Err(e) if watch_failure_is_transient(&e) => self.pause(&e).await,
                    Err(e) => return Err(e),
                }
                continue;
            };
            let event = match stream.next().await {
                Some(Ok(event)) => event,
                Some(Err(e)) if !watch_failure_is_transient(&e) => return Err(e),
                ended => {
                    let e = match ended {
                        Some(Err(e)) => e,
                        _ => ClientError::WatchClosed("the node ended the watch".into()),
                    };
                    let endpoint = stream.endpoint().to_string();
                    self.stream = None;
                    self.election.client.avoid(&endpoint);
                    self.pause(&e).await;
                    continue;
                }
            };
            let exact = |r: &Option<Resource>| {
                r.as_ref()
                    .and_then(|r| r.id.as_ref())
                    .is_some_and(|id| id.name == self.election.name)
            };
            let now = match event.event {
                Some(watch_event::Event::Upsert(watch_event::Upsert { resource }))
                    if exact(&resource) =>
                {
                    let holder = resource.as_ref().map(Holder::of);
                    if let Some(snapshot) = self.snapshot.as_mut() {
                        *snapshot = holder;
                        continue;
                    }
                    holder
                }
                Some(watch_event::Event::Delete(watch_event::Delete { resource }))
                    if exact(&resource) =>
                {
                    if let Some(snapshot) = self.snapshot.as_mut() {
                        *snapshot = None;
                        continue;
                    }
                    None
                }
                Some(watch_event::Event::EndOfSnapshot(_)) => {
                    self.pause = PAUSE_INITIAL;
                    self.snapshot.take().unwrap_or_default()
                }
                _ => continue,
            };
            if self.reported.as_ref() != Some(&now) {
                self.reported = Some(now.clone());
                return Ok(now);
            }
        }
    }

    /// The last holder [`Observer::next`] returned.
    pub fn current(&self) -> Option<&Option<Holder>> {
        self.reported.as_ref()
    }

    async fn open(&mut self) -> Result<WatchStream, ClientError> {
        let e = &self.election;
        let stream = e
            .client
            .watch_list(WatchListRequest {
                r#type: Some(election_type()),
                tenancy: Some(e.tenancy.clone()),
                name_prefix: e.name.clone(),
                start_revision: 0,
                consistency: Consistency::Strong as i32,
                selector: String::new(),
            })
            .await?;
        self.snapshot = Some(None);
        Ok(stream)
    }

    async fn pause(&mut self, e: &ClientError) {
        tracing::debug!(election = %self.election.name, error = %e, "election watch failed; opening it again");
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(PAUSE_MAX);
    }
}

/// Why a [`Leadership`] ended ([`Leadership::lost`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LeadershipLoss {
    /// The lease it was attached to is lost.
    #[error("lease {lease} lost: {loss}")]
    Lease { lease: u64, loss: LeaseLoss },
    /// The election resource was deleted (`None`) or now names another holding.
    #[error("{}", match .now {
        None => "the election was deleted".to_string(),
        Some(h) => format!("the election is now held by {:?} (token {})", h.identity, h.token),
    })]
    Ended { now: Option<Holder> },
    /// The election could no longer be watched (a failure no retry cures): the holder
    /// cannot tell whether it still holds it.
    #[error("the election can no longer be watched: {0}")]
    Unobservable(ClientError),
    /// [`Leadership::resign`] (or the leadership was dropped).
    #[error("resigned")]
    Resigned,
}

/// Holding an election ([`Election::campaign`]): its token, the fence that carries it,
/// and a watch of whether it still holds. Dropping it stops the watch and leaves the
/// election resource (and the lease) as they are.
pub struct Leadership {
    election: Election,
    holder: Holder,
    state: Arc<watch::Sender<Option<LeadershipLoss>>>,
    watcher: tokio::task::AbortHandle,
}

impl Leadership {
    fn start(election: Election, stored: &Resource, lease: &Lease) -> Leadership {
        let holder = Holder::of(stored);
        assert!(
            holder.token != 0,
            "a created election resource has a Cairn version"
        );
        let state = Arc::new(watch::Sender::new(None));
        let watcher = tokio::spawn(watch_leadership(
            election.observe(),
            holder.clone(),
            lease.id(),
            lease.state(),
            state.clone(),
        ));
        Leadership {
            election,
            holder,
            state,
            watcher: watcher.abort_handle(),
        }
    }

    /// The fencing token: the version the election resource was created at.
    pub fn token(&self) -> u64 {
        self.holder.token
    }

    /// The holding as stored (identity, token, lease, uid).
    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    pub fn election(&self) -> &Election {
        &self.election
    }

    /// The fence of this holding: a write carrying it applies only while the election
    /// is still stored at this token.
    pub fn fence(&self) -> Fence {
        self.election.fence(self.holder.token)
    }

    /// Why the leadership ended, if it did.
    pub fn loss(&self) -> Option<LeadershipLoss> {
        self.state.borrow().clone()
    }

    /// Resolves when the leadership is lost (at once if it is), with why: the lease is
    /// lost ([`crate::lease`]'s rule: at the send time of the last acknowledged
    /// keep-alive plus the TTL), or the election resource was deleted or replaced.
    pub fn lost(&self) -> impl Future<Output = LeadershipLoss> + Send + 'static {
        let mut state = self.state.subscribe();
        async move {
            let loss = state
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|s| s.clone());
            loss.unwrap_or(LeadershipLoss::Resigned)
        }
    }

    /// Gives the election up: deletes its resource at this holding's uid and version
    /// (compare-and-set). Success also when it was no longer this holding's (deleted,
    /// or another holder's since). The lease is left alone.
    pub async fn resign(self) -> Result<(), ClientError> {
        self.watcher.abort();
        self.state
            .send_if_modified(|s| s.is_none() && s.replace(LeadershipLoss::Resigned).is_none());
        let id = Id {
            uid: self.holder.uid.clone(),
            ..self.election.id()
        };
        match self
            .election
            .client
            .delete(id, self.holder.token.to_string())
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_cas_conflict() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Writes `resource` fenced by this holding ([`Client::write_request`]).
    pub async fn write(&self, resource: Resource) -> Result<Resource, ClientError> {
        self.election
            .client
            .write_request(WriteRequest {
                resource: Some(resource),
                fence: Some(self.fence()),
            })
            .await
    }

    /// Deletes the lifetime `id.uid` at `version`, fenced by this holding
    /// ([`Client::delete_request`]).
    pub async fn delete(&self, id: Id, version: impl Into<String>) -> Result<u64, ClientError> {
        self.election
            .client
            .delete_request(DeleteRequest {
                id: Some(id),
                version: version.into(),
                fence: Some(self.fence()),
                orphan_dependents: false,
            })
            .await
            .map(|r| r.revision)
    }

    /// Writes a status entry, fenced by this holding ([`Client::write_status`]).
    pub async fn write_status(
        &self,
        mut request: WriteStatusRequest,
    ) -> Result<Resource, ClientError> {
        request.fence = Some(self.fence());
        self.election.client.write_status(request).await
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.election.name)
            .field("holder", &self.holder)
            .field("loss", &*self.state.borrow())
            .finish()
    }
}

/// The task of a [`Leadership`]: publishes its loss, the first of the lease's and the
/// election resource's.
async fn watch_leadership(
    mut observer: Observer,
    held: Holder,
    lease_id: u64,
    lease: watch::Receiver<LeaseState>,
    state: Arc<watch::Sender<Option<LeadershipLoss>>>,
) {
    let lease_lost = lost_of(lease);
    tokio::pin!(lease_lost);
    let loss = loop {
        tokio::select! {
            loss = &mut lease_lost => break LeadershipLoss::Lease { lease: lease_id, loss },
            change = observer.next() => match change {
                Ok(now) if still_held(&held, now.as_ref()) => {}
                Ok(now) => break LeadershipLoss::Ended { now },
                Err(e) => break LeadershipLoss::Unobservable(e),
            },
        }
    };
    state.send_if_modified(|s| s.is_none() && s.replace(loss).is_none());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Outcome;

    fn holder(uid: &str, token: u64) -> Holder {
        Holder {
            identity: "a".into(),
            token,
            lease: 7,
            uid: uid.into(),
        }
    }

    #[test]
    fn a_campaign_wins_by_creating_or_by_finding_its_own_lease() {
        let stored = |lease| Resource {
            lease,
            version: "12".into(),
            ..Default::default()
        };
        for (created, stored_lease, lease, won) in [
            (true, 7, 7, true),
            (true, 0, 7, true),
            (false, 7, 7, true),
            (false, 8, 7, false),
            (false, 0, 7, false),
            (false, 0, 0, false),
        ] {
            assert_eq!(
                campaign_won(&stored(stored_lease), created, lease),
                won,
                "created {created}, stored lease {stored_lease}, campaigning lease {lease}"
            );
        }
    }

    #[test]
    fn a_holding_stands_only_while_its_uid_and_token_are_stored() {
        let held = holder("u1", 12);
        for (now, stands) in [
            (Some(holder("u1", 12)), true),
            (None, false),
            (Some(holder("u1", 15)), false),
            (Some(holder("u2", 12)), false),
        ] {
            assert_eq!(still_held(&held, now.as_ref()), stands, "{now:?}");
        }
    }

    #[test]
    fn an_election_watch_is_opened_again_only_after_transient_failures() {
        let unavailable = ClientError::Unavailable {
            message: "x".into(),
            outcome: Outcome::NotApplied,
        };
        for (e, transient) in [
            (unavailable, true),
            (ClientError::WatchClosed("lagging".into()), true),
            (
                ClientError::Compacted {
                    oldest_retained_revision: 3,
                },
                true,
            ),
            (ClientError::PermissionDenied("read".into()), false),
            (ClientError::Unauthenticated("no token".into()), false),
            (ClientError::invalid("name", "empty"), false),
            (ClientError::FailedPrecondition("0.1".into()), false),
        ] {
            assert_eq!(watch_failure_is_transient(&e), transient, "{e:?}");
        }
    }

    #[test]
    fn a_holder_is_read_from_the_election_resource() {
        let mut r = Resource {
            id: Some(Id {
                uid: "u9".into(),
                ..Default::default()
            }),
            version: "41".into(),
            lease: 3,
            ..Default::default()
        };
        r.metadata
            .insert(HOLDER_METADATA_KEY.into(), "host:12".into());
        assert_eq!(
            Holder::of(&r),
            Holder {
                identity: "host:12".into(),
                token: 41,
                lease: 3,
                uid: "u9".into()
            }
        );
        r.version = "not-a-number".into();
        assert_eq!(Holder::of(&r).token, 0, "no fence accepts token 0");
    }
}
