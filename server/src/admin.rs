//! `AdminService`: cluster status, membership changes and leader transfer.
//!
//! Every operation needs the `admin` role ([`crate::auth`]); the check runs
//! first, before a restore upload is read or anything else is done.
//!
//! Membership changes must run on the leader; elsewhere they answer NotLeader
//! with the leader's address, which `cairn` follows.
//!
//! **Membership safety** is checked here, on the leader, so that a script calling the gRPC
//! API gets the same protection as `cairn member`; refusals are `Inconsistent`
//! (FAILED_PRECONDITION, exit code 5) with a message saying what to do:
//! - Promote refuses a learner that has not caught up ([`caught_up`]): one whose log the
//!   leader has never matched (a process that never started), that is more than
//!   [`CAUGHT_UP_LAG_ENTRIES_MAX`] entries behind, or that has not answered within an
//!   election timeout. AddLearner returns once the learner is in the membership; callers
//!   wait for `Member.caught_up` in Status (`cairn member add-learner` does).
//! - RemoveMember of a voter refuses, unless forced, a change that leaves fewer voters the
//!   leader hears from (within an election timeout) than a quorum, in the current
//!   configuration or in the new one ([`removal_keeps_quorum`]): such a change could not
//!   commit (joint consensus needs both quorums), and the cluster would be stuck in the
//!   joint configuration until those voters answer.
//!
//! Leader transfer (openraft 0.9 has none): the leader checks the target has
//! every entry of its log, pauses its own heartbeats and elections, waits out
//! the followers' leader lease, then asks the target to campaign at once. The
//! target, with a complete log, wins a term the old leader then joins as a
//! follower. Safety never depends on this dance (elections are ordinary Raft
//! elections); only which node wins does. Heartbeats resume whatever happens.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cairn_fsm::ClusterVersion;
use cairn_proto::error::ApiError;
use cairn_proto::v1::admin_service_server::AdminService;
use cairn_proto::v1::{self as pb};
use tonic::{Request, Response, Status};

use crate::auth::{AdminOperation, Authenticator};
use crate::raft::{NodeInfo, RaftHandle, RaftStatus};

/// How far behind the leader's log a learner may be and still be promoted (and count as
/// caught up in `cairn status`): a little over one replication batch, so that a learner
/// keeping up with a busy leader qualifies.
pub const CAUGHT_UP_LAG_ENTRIES_MAX: u64 = 100;

#[derive(Clone)]
pub struct Admin {
    pub raft: RaftHandle,
    pub election_timeout: Duration,
    pub restorer: std::sync::Arc<crate::restore::Restorer>,
    pub auth: std::sync::Arc<Authenticator>,
    /// How this node reaches other nodes' client ports (TLS or plaintext),
    /// presenting this node's own token (to ask another node to campaign).
    pub access: cairn_client::Access,
    /// This node's data dir (its size is in Status).
    pub data_dir: PathBuf,
    /// When this node started (its uptime is in Status).
    pub started: Instant,
}

/// What a leader knows of one member's replication: how far its log is matched, and how
/// long ago it last answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub matched: Option<u64>,
    pub since_contact: Option<Duration>,
}

impl Progress {
    fn of(s: &RaftStatus, raft: &RaftHandle, id: u64) -> Progress {
        Progress {
            matched: s.matched.get(&id).copied().flatten(),
            since_contact: if id == s.node_id {
                Some(Duration::ZERO)
            } else {
                raft.contacts.since_reply(id)
            },
        }
    }

    /// Whether the leader heard from the member within `window` (the leader itself: always).
    pub fn reachable(&self, window: Duration) -> bool {
        self.since_contact.is_some_and(|d| d <= window)
    }
}

/// Whether a member has caught up with a leader whose last log index is `last_log_index`:
/// `Err` says why not, in words an operator can act on.
pub fn caught_up(progress: Progress, last_log_index: u64, window: Duration) -> Result<(), String> {
    let Some(matched) = progress.matched else {
        return Err(match progress.since_contact {
            None => "the leader has never heard from it (is its process running, with this \
                     id and peer address?)"
                .to_string(),
            Some(_) => "it has not received any entry yet (its lag is unknown)".to_string(),
        });
    };
    let lag = last_log_index.saturating_sub(matched);
    if lag > CAUGHT_UP_LAG_ENTRIES_MAX {
        return Err(format!(
            "it is {lag} entries behind the leader's log (at index {matched} of \
             {last_log_index}; at most {CAUGHT_UP_LAG_ENTRIES_MAX} behind counts as caught up)"
        ));
    }
    if !progress.reachable(window) {
        return Err(match progress.since_contact {
            Some(d) => format!(
                "the leader has not heard from it for {} ms (more than an election timeout)",
                d.as_millis()
            ),
            None => "the leader has never heard from it".to_string(),
        });
    }
    Ok(())
}

/// How many of `voters` voters make a quorum (a majority).
pub fn quorum_of(voters: usize) -> usize {
    voters / 2 + 1
}

/// Whether removing voter `removed` leaves the cluster a quorum of reachable voters, in the
/// current configuration and in the new one (a joint change needs both). `Err` says why
/// not.
pub fn removal_keeps_quorum(
    voters: &BTreeSet<u64>,
    reachable: &BTreeSet<u64>,
    removed: u64,
) -> Result<(), String> {
    let unreachable = |set: &BTreeSet<u64>| -> String {
        let ids: Vec<String> = set
            .difference(reachable)
            .map(|id| format!("node {id}"))
            .collect();
        ids.join(", ")
    };
    let now = voters.intersection(reachable).count();
    let quorum = quorum_of(voters.len());
    if now < quorum {
        return Err(format!(
            "the cluster has no quorum now: the leader hears from {now} of its {} voters \
             (unreachable: {}), and no membership change can commit without a quorum",
            voters.len(),
            unreachable(voters)
        ));
    }
    let after: BTreeSet<u64> = voters.iter().copied().filter(|v| *v != removed).collect();
    let left = after.intersection(reachable).count();
    let quorum_after = quorum_of(after.len());
    if left < quorum_after {
        return Err(format!(
            "it would leave {} voters of which the leader hears from {left}, fewer than a \
             quorum of {quorum_after} (unreachable: {}): the change could not commit, and the \
             cluster would be stuck until they answer. Bring them back first (or remove an \
             unreachable voter instead)",
            after.len(),
            unreachable(&after)
        ));
    }
    Ok(())
}

/// The bytes of every file under `dir` (0 for what cannot be read).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .sum()
}

fn millis(d: Option<Duration>) -> i64 {
    d.map(|d| d.as_millis().min(i64::MAX as u128) as i64)
        .unwrap_or(-1)
}

impl Admin {
    pub async fn status(&self) -> pb::StatusResponse {
        let commit_index = self.raft.committed_index().await;
        let s = self.raft.status();
        let leader = s.leader_id;
        let leading = leader == Some(s.node_id) && s.state == "leader";
        let window = self.election_timeout;
        let mut members = Vec::new();
        for (voter, map) in [(true, &s.voters), (false, &s.learners)] {
            for (id, node) in map.iter() {
                let progress = Progress::of(&s, &self.raft, *id);
                let role = if *id == s.node_id {
                    s.state.clone()
                } else if Some(*id) == leader {
                    "leader".to_string()
                } else if !leading {
                    "unknown".to_string()
                } else if !progress.reachable(window) {
                    "unreachable".to_string()
                } else if voter {
                    "follower".to_string()
                } else {
                    "learner".to_string()
                };
                members.push(pb::Member {
                    id: *id,
                    peer_address: node.peer_address.clone(),
                    client_address: node.client_address.clone(),
                    role,
                    voter,
                    last_contact_ms: if leading {
                        millis(progress.since_contact)
                    } else {
                        -1
                    },
                    matched_index: progress.matched.unwrap_or(0),
                    matched_known: leading && progress.matched.is_some(),
                    lag_entries: match progress.matched {
                        Some(m) if leading => s.last_log_index.saturating_sub(m) as i64,
                        _ => -1,
                    },
                    caught_up: leading && caught_up(progress, s.last_log_index, window).is_ok(),
                });
            }
        }
        let data_dir = self.data_dir.clone();
        let data_dir_bytes = tokio::task::spawn_blocking(move || dir_bytes(&data_dir))
            .await
            .unwrap_or(0);
        let cluster = self.raft.store.cluster_version();
        let space = self.raft.store.space();
        let data_bytes = self.raft.store.view().usage().bytes;
        pb::StatusResponse {
            data_bytes,
            data_bytes_quota: space.quota_bytes,
            data_bytes_max: self.raft.contacts.own_data_bytes_max(),
            alarms: crate::raft::alarms(&self.raft.store),
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            data_dir_bytes,
            leader_contact_ms: if leading {
                0
            } else {
                millis(self.raft.contacts.since_leader())
            },
            caught_up_lag_entries_max: CAUGHT_UP_LAG_ENTRIES_MAX,
            cluster_version: cluster.version.to_string(),
            cluster_version_downgrade: cluster.downgrade.map(|v| v.to_string()).unwrap_or_default(),
            cluster_version_supported: cairn_fsm::ClusterVersion::SUPPORTED_MAX.to_string(),
            node_id: s.node_id,
            cluster_id: self.raft.identity.cluster_id(),
            leader_id: leader.unwrap_or(0),
            term: s.term,
            commit_index,
            applied_index: s.applied_index,
            last_log_index: s.last_log_index,
            snapshot_index: s.snapshot_index,
            purged_index: s.purged_index,
            members,
            state: s.state,
            resource_count: self.raft.store.view().len() as u64,
            pending_restore: self
                .raft
                .store
                .pending_restore()
                .map(|p| pb::PendingRestore {
                    restore_id: p.restore_id,
                    resource_count: p.resource_count,
                    received: p.received,
                    failure: p.failure.unwrap_or_default(),
                }),
        }
    }

    async fn membership(
        &self,
        index: Result<u64, ApiError>,
    ) -> Result<pb::MembershipResponse, ApiError> {
        let log_index = index?;
        Ok(pb::MembershipResponse {
            log_index,
            status: Some(self.status().await),
        })
    }

    /// The status, on the leader; `NotLeader` elsewhere.
    fn leader_status(&self) -> Result<RaftStatus, ApiError> {
        self.raft.require_leader()?;
        Ok(self.raft.status())
    }

    pub async fn add_learner(
        &self,
        id: u64,
        node: NodeInfo,
    ) -> Result<pb::MembershipResponse, ApiError> {
        let s = self.leader_status()?;
        if s.voters.contains_key(&id) {
            return Err(ApiError::invalid(
                "id",
                format!("node {id} is already a voter"),
            ));
        }
        if let Some(known) = s.learners.get(&id) {
            if *known != node {
                return Err(ApiError::invalid(
                    "id",
                    format!(
                        "node {id} is already a learner, with peer address {} and client \
                         address {}: to change its addresses, remove it first \
                         (`cairn member remove {id}`)",
                        known.peer_address, known.client_address
                    ),
                ));
            }
        }
        self.membership(self.raft.add_learner(id, node).await).await
    }

    pub async fn promote(&self, id: u64) -> Result<pb::MembershipResponse, ApiError> {
        let s = self.leader_status()?;
        if !s.voters.contains_key(&id) {
            if !s.learners.contains_key(&id) {
                return Err(ApiError::invalid(
                    "id",
                    format!(
                        "node {id} is not a member: add it as a learner first \
                         (`cairn member add-learner`)"
                    ),
                ));
            }
            let progress = Progress::of(&s, &self.raft, id);
            caught_up(progress, s.last_log_index, self.election_timeout).map_err(|why| {
                ApiError::Inconsistent(format!(
                    "refusing to promote node {id}: it has not caught up: {why}. A voter that \
                     lags weakens the quorum; wait until `cairn status` shows it caught up"
                ))
            })?;
            // A voter must run a build that supports the cluster's version (a learner of an
            // older build is kept out of the quorum).
            let cluster = self.raft.store.cluster_version().version;
            let reported = self
                .raft
                .contacts
                .supported_recently(id, crate::raft::cluster_version::REPORT_FRESH);
            if let Some(why) =
                crate::raft::cluster_version::unsupported_by(&[(id, reported)], cluster)
            {
                return Err(ApiError::FailedPrecondition(format!(
                    "refusing to promote node {id}: the cluster runs cluster version \
                     {cluster}, and {why}: restart it with a build that supports {cluster} \
                     (docs/upgrading.md), or remove it (`cairn member remove {id}`)"
                )));
            }
        }
        self.membership(self.raft.promote(id).await).await
    }

    pub async fn remove_member(
        &self,
        id: u64,
        force: bool,
    ) -> Result<pb::MembershipResponse, ApiError> {
        let s = self.leader_status()?;
        if !s.voters.contains_key(&id) && !s.learners.contains_key(&id) {
            return Err(ApiError::invalid(
                "id",
                format!("node {id} is not a member of the cluster"),
            ));
        }
        if s.voters.contains_key(&id) && !force {
            let voters: BTreeSet<u64> = s.voters.keys().copied().collect();
            let reachable: BTreeSet<u64> = voters
                .iter()
                .copied()
                .filter(|v| Progress::of(&s, &self.raft, *v).reachable(self.election_timeout))
                .collect();
            removal_keeps_quorum(&voters, &reachable, id).map_err(|why| {
                ApiError::Inconsistent(format!(
                    "refusing to remove node {id}: {why}. `--force` (RemoveMember with force) \
                     proposes it anyway: it commits only once enough voters answer"
                ))
            })?;
        }
        self.membership(self.raft.remove(id).await).await
    }

    /// `cairn cluster downgrade`: lowers and pins the cluster version (`Some(to)`), or
    /// removes the pin (`None`), on the leader. See [`crate::raft::cluster_version`].
    pub async fn change_cluster_version(
        &self,
        downgrade_to: Option<ClusterVersion>,
    ) -> Result<pb::ClusterVersionResponse, ApiError> {
        let (state, log_index) =
            crate::raft::cluster_version::change(&self.raft, downgrade_to).await?;
        Ok(pb::ClusterVersionResponse {
            cluster_version: state.version.to_string(),
            cluster_version_downgrade: state.downgrade.map(|v| v.to_string()).unwrap_or_default(),
            log_index,
        })
    }

    /// `cairn alarm list` (this node's view) and `cairn alarm disarm` (on the leader,
    /// through the log).
    pub async fn alarm(&self, disarm: bool) -> Result<pb::AlarmResponse, ApiError> {
        let mut log_index = 0;
        if disarm {
            (log_index, _) =
                crate::raft::capacity::propose(&self.raft, cairn_fsm::CapacityAction::DisarmAlarm)
                    .await?;
            if self.raft.store.corrupt_alarm().is_raised() {
                (log_index, _) = self
                    .raft
                    .propose(cairn_fsm::Command::Integrity {
                        action: cairn_fsm::IntegrityAction::Disarm,
                    })
                    .await?;
            }
        }
        Ok(pb::AlarmResponse {
            alarms: crate::raft::alarms(&self.raft.store),
            log_index,
        })
    }

    /// `cairn check consistency`: one consistency check now, on the leader (NotLeader
    /// elsewhere); it raises `CORRUPT` as the periodic one does.
    pub async fn check_consistency(&self) -> Result<pb::CheckConsistencyResponse, ApiError> {
        let report = crate::raft::integrity::check(&self.raft).await?;
        use crate::raft::integrity::MemberAnswer;
        use cairn_fsm::integrity::Verdict;
        Ok(pb::CheckConsistencyResponse {
            log_index: report.index,
            members: report
                .members
                .iter()
                .map(|(id, answer)| pb::MemberDigest {
                    node_id: *id,
                    digest: match answer {
                        MemberAnswer::Digest(d) => format!("{d:016x}"),
                        MemberAnswer::LeftOut(_) => String::new(),
                    },
                    left_out: match answer {
                        MemberAnswer::Digest(_) => String::new(),
                        MemberAnswer::LeftOut(why) => why.clone(),
                    },
                })
                .collect(),
            verdict: match &report.verdict {
                None => "skipped",
                Some(Verdict::Agree) => "agree",
                Some(Verdict::Differ(_)) => "differ",
                Some(Verdict::NoMajority(_)) => "no-majority",
            }
            .to_string(),
            differing: match report.verdict {
                Some(Verdict::Differ(m)) | Some(Verdict::NoMajority(m)) => m,
                _ => Vec::new(),
            },
            skipped: report.skipped.unwrap_or_default(),
            raised_index: report.raised_index.unwrap_or(0),
        })
    }

    pub async fn transfer_leader(&self, to: u64) -> Result<pb::MembershipResponse, ApiError> {
        let status = self.leader_status()?;
        let me = self.raft.node_id;
        let target = if to != 0 {
            if to == me {
                return Ok(pb::MembershipResponse {
                    log_index: 0,
                    status: Some(self.status().await),
                });
            }
            if status.learners.contains_key(&to) {
                return Err(ApiError::invalid(
                    "to",
                    format!(
                        "node {to} is a learner: promote it first (`cairn member promote {to}`)"
                    ),
                ));
            }
            if !status.voters.contains_key(&to) {
                return Err(ApiError::invalid(
                    "to",
                    format!("node {to} is not a member of the cluster"),
                ));
            }
            to
        } else {
            self.raft.best_successor().ok_or_else(|| {
                ApiError::invalid("to", "there is no other voter to hand leadership to")
            })?
        };
        // (The membership may have changed since `status` was read.)
        let node: NodeInfo = status.voters.get(&target).cloned().ok_or_else(|| {
            ApiError::Inconsistent(format!(
                "node {target} is no longer a voter (the membership changed meanwhile)"
            ))
        })?;
        let progress = Progress::of(&status, &self.raft, target);
        if !progress.reachable(self.election_timeout) {
            return Err(ApiError::Unavailable(format!(
                "node {target} does not answer the leader ({}): start it, or hand leadership \
                 to another voter",
                match progress.since_contact {
                    Some(d) => format!("last heard {} ms ago", d.as_millis()),
                    None => "never heard from".to_string(),
                }
            )));
        }
        // 1. Go quiet: no heartbeat, no write proposed (they wait), so that nothing renews
        // the followers' leases from now on...
        let quiet = self.raft.go_quiet().await;
        // 2. ...the target must hold every entry we have...
        let caught_up = async {
            loop {
                let s = self.raft.status();
                if s.matched.get(&target).copied().flatten().unwrap_or(0) >= s.last_log_index {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        if tokio::time::timeout(self.election_timeout, caught_up)
            .await
            .is_err()
        {
            return Err(ApiError::Unavailable(format!(
                "node {target} did not catch up with the leader's log in time"
            )));
        }
        // 3. ...and once the followers' leases have lapsed, the target campaigns.
        let result = async {
            tokio::time::sleep(self.election_timeout * 6 / 10 + Duration::from_millis(50)).await;
            let mut client =
                self.access.admin(&node.client_address).await.map_err(|e| {
                    ApiError::Unavailable(format!("cannot reach node {target}: {e}"))
                })?;
            client
                .trigger_election(pb::TriggerElectionRequest {})
                .await
                .map_err(ApiError::from)?;
            let deadline = tokio::time::Instant::now() + self.election_timeout * 3;
            while tokio::time::Instant::now() < deadline {
                let leader = self.raft.status().leader_id;
                if leader.is_some() && leader != Some(me) {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(ApiError::Unavailable(format!(
                "node {target} did not become leader in time"
            )))
        }
        .await;
        drop(quiet);
        result?;
        Ok(pb::MembershipResponse {
            log_index: 0,
            status: Some(self.status().await),
        })
    }
}

/// A `Write` that cuts what it receives into chunks of at most
/// [`SNAPSHOT_CHUNK_BYTES`] and sends them down a bounded channel, so a
/// snapshot of any size streams in constant memory.
struct ChunkSender {
    tx: tokio::sync::mpsc::Sender<Result<pb::SnapshotChunk, Status>>,
    buffer: Vec<u8>,
}

/// The size of one streamed snapshot chunk.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;

impl ChunkSender {
    fn send_buffer(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let data = std::mem::replace(&mut self.buffer, Vec::with_capacity(SNAPSHOT_CHUNK_BYTES));
        self.tx
            .blocking_send(Ok(pb::SnapshotChunk { data: data.into() }))
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away")
            })
    }
}

impl std::io::Write for ChunkSender {
    fn write(&mut self, mut bytes: &[u8]) -> std::io::Result<usize> {
        let n = bytes.len();
        while !bytes.is_empty() {
            let room = SNAPSHOT_CHUNK_BYTES - self.buffer.len();
            let take = room.min(bytes.len());
            self.buffer.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.buffer.len() == SNAPSHOT_CHUNK_BYTES {
                self.send_buffer()?;
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send_buffer()
    }
}

pub type SnapshotStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::SnapshotChunk, Status>> + Send>>;

#[tonic::async_trait]
impl AdminService for Admin {
    type SaveSnapshotStream = SnapshotStream;

    async fn save_snapshot(
        &self,
        r: Request<pb::SaveSnapshotRequest>,
    ) -> Result<Response<SnapshotStream>, Status> {
        self.auth.require_admin(&r, AdminOperation::SaveSnapshot)?;
        // A linearizable point: leadership confirmed, everything committed applied.
        self.raft.confirm_read().await?;
        let (snapshot, header) = self.raft.point_in_time_snapshot()?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            let error_tx = tx.clone();
            let result = (|| {
                let sender = ChunkSender {
                    tx,
                    buffer: Vec::with_capacity(SNAPSHOT_CHUNK_BYTES),
                };
                let mut encoder = crate::snapshot_file::SnapshotEncoder::new(sender, &header)?;
                for resource in snapshot {
                    encoder.append_encoded(resource.encoded())?;
                }
                encoder.finish().map(|_| ())
            })();
            if let Err(e) = result {
                if e.kind() != std::io::ErrorKind::BrokenPipe {
                    let _ = error_tx.blocking_send(Err(Status::from(ApiError::Internal(format!(
                        "streaming the snapshot: {e}"
                    )))));
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn restore_snapshot(
        &self,
        r: Request<tonic::Streaming<pb::SnapshotChunk>>,
    ) -> Result<Response<pb::RestoreSnapshotResponse>, Status> {
        self.auth
            .require_admin(&r, AdminOperation::RestoreSnapshot)?;
        let (log_index, resource_count) = self.restorer.restore_upload(r.into_inner()).await?;
        Ok(Response::new(pb::RestoreSnapshotResponse {
            log_index,
            resource_count,
        }))
    }

    async fn status(
        &self,
        r: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        self.auth.require_admin(&r, AdminOperation::Status)?;
        Ok(Response::new(Admin::status(self).await))
    }

    async fn add_learner(
        &self,
        r: Request<pb::AddLearnerRequest>,
    ) -> Result<Response<pb::MembershipResponse>, Status> {
        self.auth.require_admin(&r, AdminOperation::AddLearner)?;
        let r = r.into_inner();
        if r.id == 0 {
            return Err(ApiError::invalid("id", "must be positive").into());
        }
        for (field, address) in [
            ("peer_address", &r.peer_address),
            ("client_address", &r.client_address),
        ] {
            if let Err(reason) = crate::config::parse_host_port(address) {
                return Err(ApiError::invalid(field, reason).into());
            }
        }
        let node = NodeInfo {
            peer_address: r.peer_address,
            client_address: r.client_address,
        };
        Ok(Response::new(Admin::add_learner(self, r.id, node).await?))
    }

    async fn promote(
        &self,
        r: Request<pb::PromoteRequest>,
    ) -> Result<Response<pb::MembershipResponse>, Status> {
        self.auth.require_admin(&r, AdminOperation::Promote)?;
        Ok(Response::new(
            Admin::promote(self, r.into_inner().id).await?,
        ))
    }

    async fn remove_member(
        &self,
        r: Request<pb::RemoveMemberRequest>,
    ) -> Result<Response<pb::MembershipResponse>, Status> {
        self.auth.require_admin(&r, AdminOperation::RemoveMember)?;
        let r = r.into_inner();
        Ok(Response::new(
            Admin::remove_member(self, r.id, r.force).await?,
        ))
    }

    async fn transfer_leader(
        &self,
        r: Request<pb::TransferLeaderRequest>,
    ) -> Result<Response<pb::MembershipResponse>, Status> {
        self.auth
            .require_admin(&r, AdminOperation::TransferLeader)?;
        Ok(Response::new(
            self.transfer_leader(r.into_inner().to).await?,
        ))
    }

    async fn cluster_version(
        &self,
        r: Request<pb::ClusterVersionRequest>,
    ) -> Result<Response<pb::ClusterVersionResponse>, Status> {
        self.auth
            .require_admin(&r, AdminOperation::ClusterVersion)?;
        let r = r.into_inner();
        let downgrade_to = match (r.downgrade_to.is_empty(), r.cancel_downgrade) {
            (false, false) => Some(
                ClusterVersion::parse(&r.downgrade_to)
                    .map_err(|reason| ApiError::invalid("downgrade_to", reason))?,
            ),
            (true, true) => None,
            (false, true) => {
                return Err(ApiError::invalid(
                    "cancel_downgrade",
                    "give either downgrade_to or cancel_downgrade, not both",
                )
                .into())
            }
            (true, false) => {
                return Err(ApiError::invalid(
                    "downgrade_to",
                    "is required (a version such as 0.1), unless cancel_downgrade is set",
                )
                .into())
            }
        };
        Ok(Response::new(
            self.change_cluster_version(downgrade_to).await?,
        ))
    }

    async fn check_consistency(
        &self,
        r: Request<pb::CheckConsistencyRequest>,
    ) -> Result<Response<pb::CheckConsistencyResponse>, Status> {
        self.auth
            .require_admin(&r, AdminOperation::CheckConsistency)?;
        Ok(Response::new(self.check_consistency().await?))
    }

    async fn alarm(
        &self,
        r: Request<pb::AlarmRequest>,
    ) -> Result<Response<pb::AlarmResponse>, Status> {
        self.auth.require_admin(&r, AdminOperation::Alarm)?;
        Ok(Response::new(self.alarm(r.into_inner().disarm).await?))
    }

    async fn trigger_election(
        &self,
        r: Request<pb::TriggerElectionRequest>,
    ) -> Result<Response<pb::TriggerElectionResponse>, Status> {
        self.auth
            .require_admin(&r, AdminOperation::TriggerElection)?;
        self.raft.trigger_election().await?;
        Ok(Response::new(pb::TriggerElectionResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(1);

    fn progress(matched: Option<u64>, since_ms: Option<u64>) -> Progress {
        Progress {
            matched,
            since_contact: since_ms.map(Duration::from_millis),
        }
    }

    #[test]
    fn a_learner_is_caught_up_when_matched_close_and_recently_heard() {
        // Never heard (a process not started), matched nothing, too far behind, or silent for
        // longer than the window: not caught up, each saying why. Close and recent: caught up.
        let never = caught_up(progress(None, None), 50, WINDOW).unwrap_err();
        assert!(never.contains("never heard"), "{never}");
        let empty = caught_up(progress(None, Some(10)), 50, WINDOW).unwrap_err();
        assert!(empty.contains("lag is unknown"), "{empty}");
        let behind = caught_up(progress(Some(10), Some(10)), 500, WINDOW).unwrap_err();
        assert!(behind.contains("490 entries behind"), "{behind}");
        let silent = caught_up(progress(Some(500), Some(5_000)), 500, WINDOW).unwrap_err();
        assert!(silent.contains("5000 ms"), "{silent}");
        assert!(caught_up(
            progress(Some(500 - CAUGHT_UP_LAG_ENTRIES_MAX), Some(10)),
            500,
            WINDOW
        )
        .is_ok());
    }

    #[test]
    fn a_removal_must_leave_a_reachable_quorum_before_and_after() {
        // Three voters, 3 unreachable: removing 3 leaves {1, 2}, both reachable: fine;
        // removing 2 leaves {1, 3} with only 1 reachable: refused, naming node 3. Two voters,
        // one unreachable: no quorum now, whatever is removed.
        let set = |ids: &[u64]| ids.iter().copied().collect::<BTreeSet<u64>>();
        assert!(removal_keeps_quorum(&set(&[1, 2, 3]), &set(&[1, 2]), 3).is_ok());
        let e = removal_keeps_quorum(&set(&[1, 2, 3]), &set(&[1, 2]), 2).unwrap_err();
        assert!(e.contains("node 3") && e.contains("quorum of 2"), "{e}");
        let e = removal_keeps_quorum(&set(&[1, 2]), &set(&[1]), 2).unwrap_err();
        assert!(e.contains("no quorum now"), "{e}");
        // Five voters, two unreachable: removing a reachable one leaves 2 of 4: refused.
        assert!(removal_keeps_quorum(&set(&[1, 2, 3, 4, 5]), &set(&[1, 2, 3]), 2).is_err());
        assert!(removal_keeps_quorum(&set(&[1, 2, 3, 4, 5]), &set(&[1, 2, 3]), 5).is_ok());
        // Every voter reachable: any removal is fine.
        assert!(removal_keeps_quorum(&set(&[1, 2, 3]), &set(&[1, 2, 3]), 1).is_ok());
    }
}
