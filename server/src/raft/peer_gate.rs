//! The peer port's edge: every Raft and forwarding RPC is checked here before
//! openraft or the executor sees it.
//!
//! A peer message is admitted only when
//! 1. it carries this node's cluster id (an empty or different one is refused
//!    with the same words, which never name the right id);
//! 2. on a TLS connection, the peer's certificate names its sender:
//!    `cairn-node-{id}` as common name or DNS name
//!    ([`cairn_tls::node_certificate_name`]). A certificate from the cluster
//!    CA that names no node (a client's) or another node cannot speak for
//!    the sender;
//! 3. its sender, named by node id, is a member of this node's current
//!    membership (voter or learner) or one of the nodes it was told about at
//!    start (the bootstrap member list, or the members of the cluster it joins
//!    through the admin path). The latter stay heard after this node holds a
//!    membership: a learner that installs a snapshot taken before its leader
//!    joined holds a membership without its leader, and must still hear it.
//!    Over TLS, where the cluster's CA vouches for the sender's node id (2), a
//!    sender outside both (a *stranger*: its joining was not seen here yet) is
//!    heard when its message shows it may know a newer membership than this
//!    node ([`stranger_may_speak`]): a leader's AppendEntries or
//!    InstallSnapshot (its vote committed), or a candidate whose log is longer
//!    than this node's; openraft's own checks (vote, leader lease, log
//!    up-to-date) then refuse a stale or removed node's message as they would a
//!    member's. Without TLS a node id vouches for nothing: a stranger whose
//!    message passes the same test is refused until a member this node knows
//!    vouches for it ([`Standing::Unvouched`]: its current membership names
//!    the stranger, asked over the peer port), and heard from then on like a
//!    node it was told about;
//! 4. (Raft messages) every term, index, size and count in it is within
//!    bounds: a term at most [`PEER_TERM_MAX`], so no increment ever
//!    overflows; entries numbered consecutively after `prev_log_id`; the
//!    sender named in the vote is the sender named in the envelope.
//!
//! A node without a cluster id yet (a new bootstrap member that is not the
//! initializer) adopts the id of the first message that passes 3.
//!
//! The pure checks ([`check_append_entries`], `check_vote`, ...) take a
//! decoded message and return what is wrong with it; [`PeerGate`] adds the
//! node's state (cluster id, membership) and turns refusals into statuses.
//!
//! Invariants: nothing openraft receives from a peer carries a term above
//! [`PEER_TERM_MAX`] or an index above [`PEER_INDEX_MAX`]; the refusal of a
//! cluster id never contains this node's cluster id (tested).

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex};

use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{EntryPayload, LogId, Vote};
use tonic::metadata::MetadataMap;

use super::identity::AdoptError;
use super::state_machine::ClusterIdentity;
use super::types::{Membership, NodeId, NodeInfo, TypeConfig};

/// The largest term a peer may send. 2^62: a cluster electing a leader
/// every millisecond needs a hundred million years to reach it, and a node
/// can add 2^62 more elections on top before a term could overflow.
pub const PEER_TERM_MAX: u64 = 1 << 62;
/// The largest log index a peer may send (same reasoning as terms).
pub const PEER_INDEX_MAX: u64 = 1 << 62;
/// The largest term a node accepts when it reads its own vote and log back
/// at start: above every term it can reach from accepted ones by its own
/// elections, far below overflow.
pub const STORED_TERM_MAX: u64 = 1 << 63;
/// Bounds on membership entries and snapshot metadata sent by peers.
pub const MEMBERS_MAX: usize = 256;
pub const ADDRESS_BYTES_MAX: usize = 512;
pub const SNAPSHOT_ID_BYTES_MAX: usize = 256;
/// No snapshot file is larger than this (1 TiB); a chunk offset beyond it is refused.
pub const SNAPSHOT_OFFSET_MAX: u64 = 1 << 40;
/// Most entries one AppendEntries may carry (nodes send at most 64).
pub const ENTRIES_MAX: usize = 4096;
/// Largest snapshot chunk (the largest `snapshot_chunk_bytes` a node accepts).
pub use crate::bounds::SNAPSHOT_CHUNK_BYTES_MAX;

/// Metadata keys of a forwarded request: the sender's cluster id and node id.
pub const CLUSTER_ID_HEADER: &str = "cairn-cluster-id";
pub const NODE_ID_HEADER: &str = "cairn-node-id";

/// Why a peer message was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Empty or not this node's cluster id. Deliberately says nothing more.
    ClusterId,
    /// The sender is not a member of this node's cluster.
    NotMember { sender: NodeId },
    /// The TLS certificate of the connection does not name the sender
    /// (`named`: the nodes it names, sorted; empty for a client's).
    Certificate { sender: NodeId, named: Vec<NodeId> },
    /// A term, index, size or count out of bounds, or an inconsistent message.
    Malformed(String),
    /// This node could not persist the cluster id it adopted.
    Internal(String),
    /// A sender outside the membership, on a plaintext connection, whose message shows it
    /// may know a newer membership: refused until a member this node knows vouches for it
    /// (an operating condition: the sender retries).
    Unvouched { sender: NodeId },
    /// The sender's byte budget is taken by its earlier messages, still being processed
    /// (an operating condition: the sender backs off and retries).
    Busy {
        sender: NodeId,
        bytes_in_process: usize,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::ClusterId => {
                write!(
                    f,
                    "refused: the request does not carry this node's cluster id"
                )
            }
            Refusal::NotMember { sender } => write!(
                f,
                "refused: node {sender} is not a member of this node's cluster"
            ),
            Refusal::Certificate { sender, named } => {
                let required = cairn_tls::node_certificate_name(*sender);
                if named.is_empty() {
                    write!(
                        f,
                        "refused: the message claims to come from node {sender}, but the \
                         connection's TLS certificate names no node (a client certificate \
                         cannot be used on the peer port): a peer's certificate must carry \
                         {required} as its common name or a DNS name"
                    )
                } else {
                    let named: Vec<String> = named.iter().map(|id| id.to_string()).collect();
                    write!(
                        f,
                        "refused: the message claims to come from node {sender}, but the \
                         connection's TLS certificate names node {} (a peer's certificate \
                         must carry {required} as its common name or a DNS name)",
                        named.join(", ")
                    )
                }
            }
            Refusal::Unvouched { sender } => write!(
                f,
                "refused for now: node {sender} is not in this node's membership; asking the \
                 members this node knows whether it joined the cluster"
            ),
            Refusal::Malformed(why) => write!(f, "refused: malformed peer message: {why}"),
            Refusal::Internal(why) => write!(f, "cannot admit the peer: {why}"),
            Refusal::Busy {
                sender,
                bytes_in_process,
            } => write!(
                f,
                "busy: {bytes_in_process} bytes of earlier messages from node {sender} are \
                 still being processed; retry later"
            ),
        }
    }
}

impl From<Refusal> for cairn_proto::error::ApiError {
    /// A refused peer: PERMISSION_DENIED (no or another cluster's id, not a
    /// member), INVALID_ARGUMENT (a malformed message), UNAVAILABLE (busy) or INTERNAL. A
    /// forwarding follower that gets one of these from the leader's peer
    /// port tells its client UNAVAILABLE (`cairn_forwarding`'s `classify`).
    fn from(refusal: Refusal) -> cairn_proto::error::ApiError {
        use cairn_proto::error::ApiError;
        match &refusal {
            Refusal::ClusterId | Refusal::NotMember { .. } | Refusal::Certificate { .. } => {
                ApiError::PermissionDenied(refusal.to_string())
            }
            Refusal::Malformed(_) => ApiError::InvalidArgument {
                field: "message".into(),
                reason: refusal.to_string(),
            },
            Refusal::Internal(_) => ApiError::Internal(refusal.to_string()),
            Refusal::Busy { .. } | Refusal::Unvouched { .. } => {
                ApiError::Unavailable(refusal.to_string())
            }
        }
    }
}

impl From<Refusal> for tonic::Status {
    /// Through the one mapping of Cairn's errors to gRPC (`cairn_proto::error`).
    fn from(refusal: Refusal) -> tonic::Status {
        cairn_proto::error::ApiError::from(refusal).into()
    }
}

fn malformed(why: impl Into<String>) -> Refusal {
    Refusal::Malformed(why.into())
}

fn check_term(what: &str, term: u64) -> Result<(), Refusal> {
    if term > PEER_TERM_MAX {
        return Err(malformed(format!(
            "{what} term {term} is above the largest accepted term {PEER_TERM_MAX}"
        )));
    }
    Ok(())
}

fn check_log_id(what: &str, log_id: &Option<LogId<NodeId>>) -> Result<(), Refusal> {
    if let Some(l) = log_id {
        check_term(what, l.leader_id.term)?;
        if l.index > PEER_INDEX_MAX {
            return Err(malformed(format!(
                "{what} index {} is above the largest accepted index {PEER_INDEX_MAX}",
                l.index
            )));
        }
    }
    Ok(())
}

/// The vote of a request: bounded, and naming the sender of the envelope.
fn check_vote(what: &str, vote: &Vote<NodeId>, sender: NodeId) -> Result<(), Refusal> {
    check_term(what, vote.leader_id.term)?;
    if vote.leader_id.node_id != sender {
        return Err(malformed(format!(
            "{what} names node {} but the message comes from node {sender}",
            vote.leader_id.node_id
        )));
    }
    Ok(())
}

fn check_membership(what: &str, m: &openraft::Membership<NodeId, NodeInfo>) -> Result<(), Refusal> {
    let configs = m.get_joint_config();
    if configs.is_empty() || configs.len() > 2 {
        return Err(malformed(format!(
            "{what} has {} voter sets (1 or 2 expected)",
            configs.len()
        )));
    }
    let nodes: BTreeSet<NodeId> = m.nodes().map(|(id, _)| *id).collect();
    if nodes.len() > MEMBERS_MAX {
        return Err(malformed(format!(
            "{what} has {} nodes, more than {MEMBERS_MAX}",
            nodes.len()
        )));
    }
    for config in configs {
        if let Some(missing) = config.iter().find(|id| !nodes.contains(id)) {
            return Err(malformed(format!(
                "{what} names voter {missing} without its addresses"
            )));
        }
    }
    for (id, node) in m.nodes() {
        if node.peer_address.len() > ADDRESS_BYTES_MAX
            || node.client_address.len() > ADDRESS_BYTES_MAX
        {
            return Err(malformed(format!(
                "{what} gives node {id} an address longer than {ADDRESS_BYTES_MAX} bytes"
            )));
        }
    }
    Ok(())
}

fn check_stored_membership(what: &str, m: &Membership) -> Result<(), Refusal> {
    check_log_id(what, m.log_id())?;
    check_membership(what, m.membership())
}

/// AppendEntries: bounded vote and log ids; entries numbered consecutively
/// right after `prev_log_id`, with terms between the previous entry's and
/// the leader's; at most `entries_max` of them.
pub fn check_append_entries(
    rpc: &AppendEntriesRequest<TypeConfig>,
    sender: NodeId,
    entries_max: usize,
) -> Result<(), Refusal> {
    check_vote("vote", &rpc.vote, sender)?;
    check_log_id("prev_log_id", &rpc.prev_log_id)?;
    check_log_id("leader_commit", &rpc.leader_commit)?;
    if rpc.entries.len() > entries_max {
        return Err(malformed(format!(
            "{} entries, more than {entries_max}",
            rpc.entries.len()
        )));
    }
    let leader_term = rpc.vote.leader_id.term;
    let mut expected_index = rpc.prev_log_id.map(|l| l.index + 1).unwrap_or(0);
    let mut previous_term = rpc.prev_log_id.map(|l| l.leader_id.term).unwrap_or(0);
    for entry in &rpc.entries {
        let log_id = entry.log_id;
        check_log_id("entry", &Some(log_id))?;
        if log_id.index != expected_index {
            return Err(malformed(format!(
                "entry at index {} where {expected_index} was expected",
                log_id.index
            )));
        }
        if log_id.leader_id.term < previous_term || log_id.leader_id.term > leader_term {
            return Err(malformed(format!(
                "entry {} has term {}, outside [{previous_term}, {leader_term}]",
                log_id.index, log_id.leader_id.term
            )));
        }
        if let EntryPayload::Membership(m) = &entry.payload {
            check_membership("membership entry", m)?;
        }
        expected_index = log_id.index + 1;
        previous_term = log_id.leader_id.term;
    }
    Ok(())
}

/// Vote: a bounded candidate term naming the sender, a bounded last log id
/// no newer than the candidacy.
pub fn check_vote_request(rpc: &VoteRequest<NodeId>, sender: NodeId) -> Result<(), Refusal> {
    check_vote("vote", &rpc.vote, sender)?;
    check_log_id("last_log_id", &rpc.last_log_id)?;
    if let Some(l) = rpc.last_log_id {
        if l.leader_id.term > rpc.vote.leader_id.term {
            return Err(malformed(format!(
                "last log term {} is above the candidate's term {}",
                l.leader_id.term, rpc.vote.leader_id.term
            )));
        }
    }
    Ok(())
}

/// InstallSnapshot: bounded vote, snapshot log id, membership, id, offset
/// and chunk size.
pub fn check_install_snapshot(
    rpc: &InstallSnapshotRequest<TypeConfig>,
    sender: NodeId,
    chunk_bytes_max: u64,
) -> Result<(), Refusal> {
    check_vote("vote", &rpc.vote, sender)?;
    check_log_id("snapshot last_log_id", &rpc.meta.last_log_id)?;
    check_stored_membership("snapshot membership", &rpc.meta.last_membership)?;
    if rpc.meta.snapshot_id.len() > SNAPSHOT_ID_BYTES_MAX {
        return Err(malformed(format!(
            "snapshot id of {} bytes, more than {SNAPSHOT_ID_BYTES_MAX}",
            rpc.meta.snapshot_id.len()
        )));
    }
    if rpc.data.len() as u64 > chunk_bytes_max {
        return Err(malformed(format!(
            "snapshot chunk of {} bytes, more than {chunk_bytes_max}",
            rpc.data.len()
        )));
    }
    if rpc.offset > SNAPSHOT_OFFSET_MAX {
        return Err(malformed(format!(
            "snapshot offset {} is beyond {SNAPSHOT_OFFSET_MAX}",
            rpc.offset
        )));
    }
    Ok(())
}

/// The replies this node reads from the peers it calls are bounded the same
/// way: a higher term in a reply is adopted by openraft too.
pub fn check_append_entries_reply(reply: &AppendEntriesResponse<NodeId>) -> Result<(), Refusal> {
    match reply {
        AppendEntriesResponse::HigherVote(v) => check_term("reply vote", v.leader_id.term),
        AppendEntriesResponse::PartialSuccess(l) => check_log_id("reply matching", l),
        AppendEntriesResponse::Success | AppendEntriesResponse::Conflict => Ok(()),
    }
}

pub fn check_vote_reply(reply: &VoteResponse<NodeId>) -> Result<(), Refusal> {
    check_term("reply vote", reply.vote.leader_id.term)?;
    check_log_id("reply last_log_id", &reply.last_log_id)
}

/// A member's answer to this node's question of who its members are.
pub fn check_members_reply(members: &[NodeId]) -> Result<(), Refusal> {
    if members.len() > MEMBERS_MAX {
        return Err(malformed(format!(
            "a membership of {} nodes, more than {MEMBERS_MAX}",
            members.len()
        )));
    }
    Ok(())
}

pub fn check_install_snapshot_reply(
    reply: &InstallSnapshotResponse<NodeId>,
) -> Result<(), Refusal> {
    check_term("reply vote", reply.vote.leader_id.term)
}

/// A vote or log id read back from this node's own log at start. A term
/// that no node can reach means the data dir accepted a hostile or broken
/// peer's message (before this check existed) or was damaged: the node must
/// not start on it, or the next election overflows the term.
pub fn check_stored_term(what: &str, term: u64) -> Result<(), String> {
    if term > STORED_TERM_MAX {
        return Err(format!(
            "the {what} stored in this node's Raft log has term {term}, above the largest \
             term a node can reach ({STORED_TERM_MAX}); it was accepted from a hostile or \
             broken peer, or the log is damaged. This data dir cannot be used: remove the \
             node from the cluster (`cairn member remove`), empty its data dir and start it \
             again with `--join`"
        ));
    }
    Ok(())
}

/// What this node knows that the gate checks a sender against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalView {
    /// The node ids of this node's current membership (voters and learners).
    pub members: BTreeSet<NodeId>,
    /// The index of the last entry in this node's log.
    pub last_log_index: Option<u64>,
}

/// What a peer message shows about its sender (see [`stranger_may_speak`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// A forwarded request: it shows nothing.
    Nothing,
    /// AppendEntries or InstallSnapshot, sent under a vote that is `committed`
    /// (a leader's) or not.
    Leader { committed: bool },
    /// A vote request, from a candidate whose log ends at `last_log_index`.
    Candidate { last_log_index: Option<u64> },
}

impl Claim {
    pub fn of_append_entries(rpc: &AppendEntriesRequest<TypeConfig>) -> Claim {
        Claim::Leader {
            committed: rpc.vote.is_committed(),
        }
    }

    pub fn of_install_snapshot(rpc: &InstallSnapshotRequest<TypeConfig>) -> Claim {
        Claim::Leader {
            committed: rpc.vote.is_committed(),
        }
    }

    pub fn of_vote_request(rpc: &VoteRequest<NodeId>) -> Claim {
        Claim::Candidate {
            last_log_index: rpc.last_log_id.map(|l| l.index),
        }
    }
}

/// Whether a sender outside this node's membership may be heard: a leader
/// (its vote committed) may know of a membership this node has not seen yet,
/// and so may a candidate whose log is longer than this node's. Anything
/// else from a stranger is refused. Pure.
pub fn stranger_may_speak(claim: Claim, local_last_log_index: Option<u64>) -> bool {
    match claim {
        Claim::Nothing => false,
        Claim::Leader { committed } => committed,
        // `None` (an empty log) is shorter than any log.
        Claim::Candidate { last_log_index } => last_log_index > local_last_log_index,
    }
}

/// How the envelope of an admitted message stands (see [`PeerGate::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// A member of this node's membership, or (while it holds none) a node it
    /// was told about. Admitted.
    Member,
    /// Outside this node's membership, its node id vouched for by the cluster's CA (TLS):
    /// admitted only if its message passes [`PeerGate::admit_stranger`].
    Stranger,
    /// Outside this node's membership on a plaintext connection, where its node id could be
    /// made up: its message is refused ([`Refusal::Unvouched`]) even when it passes
    /// [`PeerGate::admit_stranger`], until a member this node knows vouches for it
    /// ([`PeerGate::vouched`]).
    Unvouched,
}

impl Standing {
    /// Whether the sender is outside this node's membership (see [`PeerGate::admit_stranger`]).
    pub fn is_stranger(self) -> bool {
        self != Standing::Member
    }
}

/// The node's state a peer message is checked against.
pub struct PeerGate {
    identity: Arc<ClusterIdentity>,
    /// This node's Raft metrics: the current membership and log live there.
    view: Box<dyn Fn() -> Option<LocalView> + Send + Sync>,
    /// The nodes this node was told about at start (bootstrap members, or the members of
    /// the cluster it joined): heard besides the current membership.
    provisional: Mutex<BTreeSet<NodeId>>,
}

impl PeerGate {
    /// `view` returns this node's membership and last log index, or `None`
    /// while it holds no membership; `provisional` are the nodes it was told
    /// about (the bootstrap member list), heard besides the membership.
    pub fn new(
        identity: Arc<ClusterIdentity>,
        view: impl Fn() -> Option<LocalView> + Send + Sync + 'static,
        provisional: BTreeSet<NodeId>,
    ) -> PeerGate {
        PeerGate {
            identity,
            view: Box::new(view),
            provisional: Mutex::new(provisional),
        }
    }

    /// A node joining through the admin path learns the cluster id and the
    /// members from the node it joins through, before asking to be added.
    pub fn joining(&self, cluster_id: &str, members: BTreeSet<NodeId>) -> std::io::Result<()> {
        self.identity.set(cluster_id)?;
        *self.provisional.lock().unwrap_or_else(|e| e.into_inner()) = members;
        Ok(())
    }

    pub fn cluster_id(&self) -> String {
        self.identity.cluster_id()
    }

    /// Checks the envelope of a peer message: the connection's certificate
    /// (`certified`: the node ids it names, `None` on a plaintext
    /// connection), cluster id and sender. A [`Standing::Stranger`] is not
    /// admitted yet: its decoded message must pass [`PeerGate::admit_stranger`].
    pub fn admit(
        &self,
        cluster_id: &str,
        sender: NodeId,
        certified: Option<&[NodeId]>,
    ) -> Result<Standing, Refusal> {
        if let Some(named) = certified {
            if !named.contains(&sender) {
                return Err(Refusal::Certificate {
                    sender,
                    named: named.to_vec(),
                });
            }
        }
        if cluster_id.is_empty() {
            return Err(Refusal::ClusterId);
        }
        // Another cluster's id is refused as such, whether or not the sender is a member.
        if self.identity.is_other_cluster(cluster_id) {
            return Err(Refusal::ClusterId);
        }
        let view = (self.view)();
        let member = view.as_ref().is_some_and(|v| v.members.contains(&sender));
        let told = self
            .provisional
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&sender);
        if !member && !told {
            // A stranger is compared with a membership: a node that holds none hears none.
            // Over TLS the cluster's CA vouches for its node id (checked above); on a
            // plaintext connection a member this node knows must.
            return match (certified, view) {
                (_, None) => Err(Refusal::NotMember { sender }),
                (Some(_), Some(_)) => Ok(Standing::Stranger),
                (None, Some(_)) => Ok(Standing::Unvouched),
            };
        }
        self.adopt(cluster_id)?;
        Ok(Standing::Member)
    }

    /// Admits the message of a stranger (its envelope passed [`PeerGate::admit`] as
    /// `standing`) when what it `claim`s passes [`stranger_may_speak`] against this node's
    /// log; an [`Standing::Unvouched`] one that passes is refused with
    /// [`Refusal::Unvouched`], for the caller to ask the members it knows. A node that holds
    /// no membership hears no stranger.
    pub fn admit_stranger(
        &self,
        cluster_id: &str,
        sender: NodeId,
        standing: Standing,
        claim: Claim,
    ) -> Result<(), Refusal> {
        assert!(standing.is_stranger(), "a member's message needs no claim");
        let Some(view) = (self.view)() else {
            return Err(Refusal::NotMember { sender });
        };
        if !view.members.contains(&sender) {
            if !stranger_may_speak(claim, view.last_log_index) {
                return Err(Refusal::NotMember { sender });
            }
            if standing == Standing::Unvouched {
                return Err(Refusal::Unvouched { sender });
            }
        }
        self.adopt(cluster_id)
    }

    /// A member this node knows says `sender` is in its membership: `sender` is heard from
    /// now on, as the nodes this node was told about at start are.
    pub fn vouched(&self, sender: NodeId) {
        self.provisional
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(sender);
    }

    /// A new bootstrap member adopts the id of the initializer (or of another member that
    /// learned it from it), heard from first; the checks before may be stale by now.
    fn adopt(&self, cluster_id: &str) -> Result<(), Refusal> {
        self.identity
            .adopt_or_check(cluster_id)
            .map_err(|e| match e {
                AdoptError::OtherCluster => Refusal::ClusterId,
                AdoptError::Persist { source, .. } => {
                    Refusal::Internal(format!("cannot persist the cluster id: {source}"))
                }
            })?;
        assert!(
            !self.identity.cluster_id().is_empty(),
            "an admitted peer message leaves this node with a cluster id"
        );
        Ok(())
    }

    /// [`PeerGate::admit`] for a forwarded request: the sender's cluster id
    /// and node id travel in its metadata.
    pub fn admit_metadata(
        &self,
        metadata: &MetadataMap,
        certified: Option<&[NodeId]>,
    ) -> Result<(), Refusal> {
        let cluster_id = metadata
            .get(CLUSTER_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if cluster_id.is_empty() {
            return Err(Refusal::ClusterId);
        }
        let sender = metadata
            .get(NODE_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<NodeId>().ok())
            .ok_or_else(|| malformed(format!("missing or bad {NODE_ID_HEADER}")))?;
        match self.admit(cluster_id, sender, certified)? {
            Standing::Member => Ok(()),
            standing => self.admit_stranger(cluster_id, sender, standing, Claim::Nothing),
        }
    }
}

/// The node ids the certificate of a request's connection names; `None` on
/// a plaintext connection (see [`PeerGate::admit`]).
pub fn certified_node_ids<T>(request: &tonic::Request<T>) -> Option<Arc<[NodeId]>> {
    request
        .extensions()
        .get::<crate::connections::ConnectionInfo>()
        .and_then(|info| info.certified_node_ids.clone())
}

/// Stamps a forwarded request with this node's cluster id and node id.
pub fn stamp(metadata: &mut MetadataMap, cluster_id: &str, node_id: NodeId) {
    if let Ok(v) = cluster_id.parse() {
        metadata.insert(CLUSTER_ID_HEADER, v);
    }
    if let Ok(v) = node_id.to_string().parse() {
        metadata.insert(NODE_ID_HEADER, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, Entry};

    fn log_id(term: u64, index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn blank(term: u64, index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: log_id(term, index),
            payload: EntryPayload::Blank,
        }
    }

    fn gate(dir: &std::path::Path, members: &[NodeId]) -> PeerGate {
        let identity = Arc::new(ClusterIdentity::open(dir).unwrap());
        identity.set("c0ffee").unwrap();
        let members: BTreeSet<NodeId> = members.iter().copied().collect();
        let view = LocalView {
            members,
            last_log_index: Some(40),
        };
        PeerGate::new(identity, move || Some(view.clone()), BTreeSet::new())
    }

    #[test]
    fn a_wrong_or_empty_cluster_id_is_refused_without_naming_the_right_one() {
        let dir = tempfile::tempdir().unwrap();
        let g = gate(dir.path(), &[1, 2, 3]);
        assert_eq!(g.admit("c0ffee", 2, None), Ok(Standing::Member));
        for wrong in ["", "c0ffef", "c0ffee0", "other"] {
            let refusal = g.admit(wrong, 2, None).unwrap_err();
            assert_eq!(refusal, Refusal::ClusterId);
            let status = tonic::Status::from(refusal);
            assert_eq!(status.code(), tonic::Code::PermissionDenied);
            assert!(!status.message().contains("c0ffee"), "{}", status.message());
        }
    }

    #[test]
    fn over_tls_the_certificate_must_name_the_sender() {
        // A member's id claimed by a certificate that names no node (a
        // client's) or another node is refused before anything else, and
        // the refusal says which name the certificate needs.
        let dir = tempfile::tempdir().unwrap();
        let g = gate(dir.path(), &[1, 2, 3]);
        assert_eq!(g.admit("c0ffee", 2, Some(&[2])), Ok(Standing::Member));
        assert_eq!(g.admit("c0ffee", 2, Some(&[1, 2])), Ok(Standing::Member));
        let client = g.admit("c0ffee", 2, Some(&[])).unwrap_err();
        assert_eq!(
            client,
            Refusal::Certificate {
                sender: 2,
                named: vec![]
            }
        );
        let status = tonic::Status::from(client);
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(status.message().contains("cairn-node-2"), "{status:?}");
        let other = g.admit("c0ffee", 3, Some(&[2])).unwrap_err();
        assert!(other.to_string().contains("names node 2"), "{other}");
        let mut m = MetadataMap::new();
        stamp(&mut m, "c0ffee", 3);
        assert!(matches!(
            g.admit_metadata(&m, Some(&[2])),
            Err(Refusal::Certificate { sender: 3, .. })
        ));
    }

    #[test]
    fn a_sender_outside_the_membership_is_heard_only_over_tls_as_a_leader_or_a_candidate_ahead() {
        // This node (members 1-3) has its log up to index 40. Over TLS, with a certificate
        // naming node 9, it is a stranger: its message must show it may know more than this
        // node. Without TLS, node 9 may be a made-up id: such a message is refused until a
        // member vouches for node 9.
        let dir = tempfile::tempdir().unwrap();
        let g = gate(dir.path(), &[1, 2, 3]);
        let refused = Err(Refusal::NotMember { sender: 9 });
        let mut m = MetadataMap::new();
        stamp(&mut m, "c0ffee", 9);
        assert_eq!(g.admit_metadata(&m, None), refused);

        assert_eq!(g.admit("c0ffee", 9, Some(&[9])), Ok(Standing::Stranger));
        assert_eq!(g.admit("c0ffee", 9, None), Ok(Standing::Unvouched));
        // A forwarded request shows nothing; a candidate with no longer a log than this
        // node's, or a sender whose vote is not committed, are refused.
        for claim in [
            Claim::Nothing,
            Claim::Leader { committed: false },
            Claim::Candidate {
                last_log_index: Some(40),
            },
            Claim::Candidate {
                last_log_index: None,
            },
        ] {
            for standing in [Standing::Stranger, Standing::Unvouched] {
                let got = g.admit_stranger("c0ffee", 9, standing, claim);
                assert_eq!(got, refused, "{claim:?} {standing:?}");
            }
        }
        // A leader (committed vote) may run a membership this node has not seen, and a
        // candidate with a longer log may too: openraft's checks decide what follows.
        for claim in [
            Claim::Leader { committed: true },
            Claim::Candidate {
                last_log_index: Some(41),
            },
        ] {
            let tls = g.admit_stranger("c0ffee", 9, Standing::Stranger, claim);
            assert_eq!(tls, Ok(()), "{claim:?}");
            let plaintext = g.admit_stranger("c0ffee", 9, Standing::Unvouched, claim);
            assert_eq!(
                plaintext,
                Err(Refusal::Unvouched { sender: 9 }),
                "{claim:?}"
            );
        }
        assert_eq!(g.admit("c0ffef", 9, Some(&[9])), Err(Refusal::ClusterId));
        assert_eq!(g.admit_metadata(&m, Some(&[9])), refused);
        // Vouched for by a member, node 9 is heard over plaintext like a node this one was
        // told about.
        g.vouched(9);
        assert_eq!(g.admit("c0ffee", 9, None), Ok(Standing::Member));
        assert_eq!(g.admit_metadata(&m, None), Ok(()));
    }

    #[test]
    fn the_nodes_it_was_told_about_stay_heard_once_a_node_holds_a_membership() {
        // A learner that joined through node 4 installed a snapshot whose membership (1-3)
        // predates node 4, its leader: node 4 stays heard, over plaintext too.
        let dir = tempfile::tempdir().unwrap();
        let identity = Arc::new(ClusterIdentity::open(dir.path()).unwrap());
        identity.set("c0ffee").unwrap();
        let view = LocalView {
            members: BTreeSet::from([1, 2, 3, 5]),
            last_log_index: Some(40),
        };
        let g = PeerGate::new(identity, move || Some(view.clone()), BTreeSet::new());
        assert_eq!(g.admit("c0ffee", 4, None), Ok(Standing::Unvouched));
        g.joining("c0ffee", BTreeSet::from([1, 2, 3, 4])).unwrap();
        assert_eq!(g.admit("c0ffee", 4, None), Ok(Standing::Member));
    }

    #[test]
    fn a_node_without_a_membership_hears_no_stranger() {
        let dir = tempfile::tempdir().unwrap();
        let identity = Arc::new(ClusterIdentity::open(dir.path()).unwrap());
        let g = PeerGate::new(identity.clone(), || None, BTreeSet::from([1, 2, 3]));
        let leader = Claim::Leader { committed: true };
        for standing in [Standing::Stranger, Standing::Unvouched] {
            assert_eq!(
                g.admit_stranger("abc", 9, standing, leader),
                Err(Refusal::NotMember { sender: 9 })
            );
        }
        assert_eq!(
            g.admit("abc", 9, None),
            Err(Refusal::NotMember { sender: 9 })
        );
        assert_eq!(identity.cluster_id(), "");
    }

    #[test]
    fn a_new_node_adopts_a_cluster_id_only_from_a_node_it_was_told_about() {
        let dir = tempfile::tempdir().unwrap();
        let identity = Arc::new(ClusterIdentity::open(dir.path()).unwrap());
        let g = PeerGate::new(identity.clone(), || None, BTreeSet::from([1, 2, 3]));
        assert_eq!(
            g.admit("abc", 9, None),
            Err(Refusal::NotMember { sender: 9 })
        );
        assert_eq!(identity.cluster_id(), "");
        assert_eq!(g.admit("abc", 1, None), Ok(Standing::Member));
        assert_eq!(identity.cluster_id(), "abc");
        assert_eq!(g.admit("abd", 1, None), Err(Refusal::ClusterId));
    }

    #[test]
    fn of_two_ids_offered_at_once_to_a_new_node_one_is_adopted_and_the_other_refused() {
        // Another id gets adopted between the gate's look at this node's (none) and its
        // adoption of the sender's: here by the membership lookup, which runs in between.
        // The sender is refused, not admitted under the other cluster's id. (Before the fix
        // the adoption kept the other id without a word and the sender was admitted.)
        let dir = tempfile::tempdir().unwrap();
        let identity = Arc::new(ClusterIdentity::open(dir.path()).unwrap());
        let racer = identity.clone();
        let g = PeerGate::new(
            identity.clone(),
            move || {
                racer.set("other").unwrap();
                None
            },
            BTreeSet::from([1]),
        );
        assert_eq!(g.admit("abc", 1, None), Err(Refusal::ClusterId));
        assert_eq!(identity.cluster_id(), "other");
        assert_eq!(g.admit("other", 1, None), Ok(Standing::Member));
    }

    #[test]
    fn forwarded_requests_carry_the_id_in_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let g = gate(dir.path(), &[1, 2]);
        let mut m = MetadataMap::new();
        assert_eq!(g.admit_metadata(&m, None), Err(Refusal::ClusterId));
        stamp(&mut m, "c0ffee", 2);
        assert_eq!(g.admit_metadata(&m, None), Ok(()));
        stamp(&mut m, "c0ffee", 7);
        assert_eq!(
            g.admit_metadata(&m, None),
            Err(Refusal::NotMember { sender: 7 })
        );
    }

    #[test]
    fn a_vote_near_the_end_of_the_term_space_is_refused() {
        let ok = VoteRequest::new(Vote::new(5, 2), Some(log_id(4, 10)));
        assert_eq!(check_vote_request(&ok, 2), Ok(()));
        let max = VoteRequest::new(Vote::new(u64::MAX, 2), Some(log_id(4, 10)));
        assert!(matches!(
            check_vote_request(&max, 2),
            Err(Refusal::Malformed(_))
        ));
        let edge = VoteRequest::new(Vote::new(PEER_TERM_MAX, 2), None);
        assert_eq!(check_vote_request(&edge, 2), Ok(()));
        let over = VoteRequest::new(Vote::new(PEER_TERM_MAX + 1, 2), None);
        assert!(check_vote_request(&over, 2).is_err());
        // The vote must name the sender.
        assert!(check_vote_request(&ok, 3).is_err());
        // A last log newer than the candidacy is nonsense.
        let newer = VoteRequest::new(Vote::new(5, 2), Some(log_id(6, 10)));
        assert!(check_vote_request(&newer, 2).is_err());
    }

    #[test]
    fn append_entries_must_be_consecutive_and_bounded() {
        let request =
            |prev: Option<LogId<NodeId>>, entries: Vec<Entry<TypeConfig>>| AppendEntriesRequest::<
                TypeConfig,
            > {
                vote: Vote::new_committed(7, 1),
                prev_log_id: prev,
                leader_commit: Some(log_id(7, 3)),
                entries,
            };
        let good = request(Some(log_id(6, 3)), vec![blank(6, 4), blank(7, 5)]);
        assert_eq!(check_append_entries(&good, 1, 64), Ok(()));
        assert_eq!(
            check_append_entries(&request(None, vec![blank(1, 0)]), 1, 64),
            Ok(())
        );
        for bad in [
            request(Some(log_id(6, 3)), vec![blank(6, 5)]),
            request(Some(log_id(6, 3)), vec![blank(6, 4), blank(6, 4)]),
            request(Some(log_id(6, 3)), vec![blank(5, 4)]),
            request(Some(log_id(6, 3)), vec![blank(8, 4)]),
            request(Some(log_id(6, u64::MAX)), vec![]),
            request(Some(log_id(u64::MAX, 3)), vec![]),
        ] {
            assert!(check_append_entries(&bad, 1, 64).is_err(), "{bad:?}");
        }
        assert!(
            check_append_entries(&good, 2, 64).is_err(),
            "sender mismatch"
        );
        assert!(
            check_append_entries(&good, 1, 1).is_err(),
            "too many entries"
        );
    }

    #[test]
    fn a_stored_term_beyond_reach_is_a_clear_error() {
        assert!(check_stored_term("vote", 12).is_ok());
        let e = check_stored_term("vote", u64::MAX).unwrap_err();
        assert!(e.contains("--join"), "{e}");
    }
}
