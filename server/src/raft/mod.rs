//! Everything openraft-specific lives in this module: the type configuration,
//! the state-machine adapter over `cairn-fsm`, the tonic transport and the
//! conversion of openraft's errors into Cairn's. The rest of the node talks to
//! [`RaftHandle`] only, so a move to another openraft version is contained here.

pub mod capacity;
mod check_quorum;
pub mod cluster_version;
pub mod collector;
pub mod contacts;
mod identity;
pub mod integrity;
mod leadership;
pub mod leases;
mod log_growth;
mod network;
pub mod peer_gate;
#[doc(hidden)]
pub mod purge_gate;
pub mod read_batch;
pub mod replay;
mod series;
pub mod stages;
mod state_machine;
#[cfg(test)]
mod suite_test;
mod types;
mod vouch;
pub mod write_batch;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cairn_fsm::{Applied, Command, Store};
use cairn_proto::error::{ApiError, LeaderHint};
use cairn_proto::v1::raft_service_server::RaftServiceServer;
use openraft::error::{ClientWriteError, RaftError};
use openraft::ChangeMembers;

pub use identity::{check_node_id, ClusterIdentity};
pub use network::{
    decode as decode_raft_message, encode as encode_raft_message, Network, RaftRpcService,
    RaftServerLimits, DECODE_BYTES_MAX,
};
pub use peer_gate::PeerGate;
pub use series::{describe_metrics, PEER_ROUND_TRIP_TIME};
pub use state_machine::StateMachine;
pub use types::{LogPayload, LogStore, Membership, NodeId, NodeInfo, Raft, Reply, TypeConfig};

use leadership::{fatal, leader_hint, leader_hint_in, leads, propose_entry, require_leader};

/// For `tests/crash_points.rs`, which opens a state machine as [`RaftHandle::start`] does
/// ([`StateMachine::open`] takes one); not an API.
#[doc(hidden)]
pub use log_growth::LogGrowth;

/// `members` (the `members` setting) as the Raft membership stores them: id → addresses.
pub fn membership_nodes(
    members: &[crate::config::MemberConfig],
) -> std::collections::BTreeMap<u64, NodeInfo> {
    members
        .iter()
        .map(|m| {
            (
                m.id,
                NodeInfo {
                    peer_address: m.peer_address.clone(),
                    client_address: m.client_address.clone(),
                },
            )
        })
        .collect()
}

/// The membership and log position of a data dir seeded by an offline restore:
/// every listed member a voter, the snapshot placed at `log_index` under term 0
/// (below any term a real leader will have). Returns (membership as stored in
/// snapshot headers, term, leader node id).
pub fn seed_membership(
    members: &BTreeMap<NodeId, NodeInfo>,
    log_index: u64,
) -> (serde_json::Value, u64, u64) {
    let log_id = openraft::LogId::new(openraft::CommittedLeaderId::new(0, 0), log_index);
    let voters: BTreeSet<NodeId> = members.keys().copied().collect();
    let membership = openraft::Membership::new(vec![voters], members.clone());
    let stored = Membership::new(Some(log_id), membership);
    (
        serde_json::to_value(&stored).expect("a membership serializes"),
        0,
        0,
    )
}

/// Raft timing and snapshot settings, from the node configuration.
#[derive(Debug, Clone)]
pub struct RaftSettings {
    pub election_timeout_ms: u64,
    pub heartbeat_interval_ms: u64,
    pub snapshot_log_entries: u64,
    /// Also build a snapshot once the log since the last one holds this many
    /// payload bytes (or the last snapshot's size, if larger).
    pub snapshot_log_bytes: u64,
    pub snapshot_chunk_bytes: u64,
    /// See [`stages`].
    pub write_stage_timing: bool,
    /// How many write entries, and how many of their bytes, the leader keeps in flight
    /// (`write_proposals_in_flight_max`, `write_proposal_bytes_in_flight_max`).
    pub write_in_flight: write_batch::InFlight,
    /// The Raft log's storage engine (`log_engine` in the configuration).
    pub log_engine: cairn_raft_log::LogEngineKind,
    /// Largest Raft message sent or received (`peer_message_bytes_max`).
    pub peer_message_bytes_max: usize,
    /// Most bytes of entries in one AppendEntries (`replication_batch_bytes_max`); one
    /// larger entry goes alone.
    pub replication_batch_bytes_max: usize,
    /// The nodes this node may hear from before it holds a membership (the
    /// bootstrap member list; a joining node learns them from the cluster).
    pub bootstrap_members: BTreeSet<NodeId>,
    /// Dial peers over mutual TLS with this (`None`: plaintext).
    pub tls: Option<cairn_tls::ClientTls>,
    /// This node's peer address: settles the node id of a data dir that records none.
    pub own_peer_address: String,
    /// DANGEROUS, test-only (`--unsafe-skip-fsync`): the Raft log skips its file and
    /// directory syncs.
    pub unsafe_skip_fsync: bool,
    /// DANGEROUS, test-only (`--unsafe-lease-wall-clock`): leases are measured on the
    /// wall clock.
    pub unsafe_lease_wall_clock: bool,
    /// The space quota this node asks for (`data_bytes_max`), reported on every Raft
    /// message; the leader sets the cluster's to the lowest reported ([`capacity`]).
    pub data_bytes_max: u64,
}

/// A snapshot of this node's Raft state, for status and health.
#[derive(Debug, Clone, Default)]
pub struct RaftStatus {
    pub node_id: NodeId,
    pub state: String,
    pub leader_id: Option<NodeId>,
    pub term: u64,
    pub last_log_index: u64,
    pub applied_index: u64,
    pub snapshot_index: u64,
    pub purged_index: u64,
    pub voters: BTreeMap<NodeId, NodeInfo>,
    pub learners: BTreeMap<NodeId, NodeInfo>,
    /// Leader only: per member, the matched log index (`None`: nothing matched yet).
    pub matched: BTreeMap<NodeId, Option<u64>>,
    pub millis_since_quorum_ack: Option<u64>,
}

/// At most this many entries in one AppendEntries (`replication_batch_bytes_max` bounds their
/// bytes); below [`peer_gate::ENTRIES_MAX`], what a follower admits.
pub const REPLICATION_BATCH_ENTRIES_MAX: u64 = 64;
const _: () = assert!(REPLICATION_BATCH_ENTRIES_MAX as usize <= peer_gate::ENTRIES_MAX);

/// A leader as one node's metrics name it, and the term of that node's vote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderView {
    pub hint: LeaderHint,
    pub term: u64,
}

/// The node's handle on Raft: the only way the rest of the node reaches openraft.
#[derive(Clone)]
pub struct RaftHandle {
    pub raft: Raft,
    /// Shares one leadership confirmation among concurrent strong reads.
    read_batch: read_batch::ReadBatcher,
    /// Gathers concurrent writes into batch entries.
    write_batch: write_batch::WriteBatcher,
    /// Every proposal outside the write batcher holds it shared; a leader transfer holds
    /// it exclusively while the node is quiet ([`RaftHandle::go_quiet`]).
    quiet_gate: Arc<tokio::sync::RwLock<()>>,
    state_machine: StateMachine,
    pub node_id: NodeId,
    pub store: Store,
    pub identity: Arc<ClusterIdentity>,
    /// Checks every message arriving on the peer port.
    pub gate: Arc<PeerGate>,
    /// Asks the members this node knows about a stranger on a plaintext peer port.
    vouching: Arc<vouch::Vouching>,
    peer_message_bytes_max: usize,
    /// The Raft log (a handle shared with openraft): asked what stopped it.
    log_store: LogStore,
    log_dir: PathBuf,
    /// When the peers and the leader were last heard from.
    pub contacts: Arc<contacts::Contacts>,
    /// Whether a raise of `NOSPACE` is on its way ([`capacity::raise_alarm`]).
    raising_alarm: Arc<std::sync::atomic::AtomicBool>,
    /// When this node saw each lease's last renewal ([`leases`]).
    pub leases: Arc<leases::LeaseClock>,
    /// The client side of the peer port (the consistency check asks members through it).
    network: Network,
    /// The consistency check's shared state ([`integrity`]).
    pub integrity: Arc<integrity::Integrity>,
}

/// The alarms raised in the replicated state `store` holds (`NOSPACE`, `CORRUPT`), as
/// `cairn alarm list`, `cairn status` and `/readyz?verbose` show them.
pub fn alarms(store: &Store) -> Vec<cairn_proto::v1::Alarm> {
    let mut alarms = capacity::alarms(store.space(), store.view().usage().bytes);
    alarms.extend(integrity::alarm(&store.corrupt_alarm()));
    alarms
}

fn leader_view_of(
    leader_id: Option<NodeId>,
    membership: &openraft::StoredMembership<NodeId, NodeInfo>,
    vote: &openraft::Vote<NodeId>,
) -> LeaderView {
    LeaderView {
        hint: leader_hint_in(leader_id, membership),
        term: vote.leader_id().get_term(),
    }
}

/// openraft's refusal of a membership change, in the operator's words (openraft's own
/// messages print log ids and memberships as Rust values).
fn membership_error(e: openraft::error::ChangeMembershipError<NodeId>) -> ApiError {
    use openraft::error::ChangeMembershipError as E;
    match e {
        E::InProgress(p) => ApiError::Inconsistent(format!(
            "another membership change is still in progress (the entry at index {} is not \
             committed yet: it needs a quorum of the old and of the new voters); try again \
             once it is, or once enough voters answer",
            p.membership_log_id.map(|l| l.index).unwrap_or(0)
        )),
        E::EmptyMembership(_) => {
            ApiError::invalid("id", "the change would leave the cluster without a voter")
        }
        E::LearnerNotFound(l) => ApiError::invalid(
            "id",
            format!(
                "node {} is not a member: add it as a learner first \
                 (`cairn member add-learner`)",
                l.node_id
            ),
        ),
    }
}

/// Where a node keeps its Raft log inside its data dir.
pub fn log_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("raft-log")
}

/// Where a node keeps its state-machine snapshots inside its data dir.
pub fn snapshot_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("snapshots")
}

/// The file of the complete snapshot at `index` (of `term`) in the snapshot dir `dir`:
/// `snap-<index>-<term>.snap`, the index in 20 digits so that the names sort as the indexes
/// do. Nothing else in the dir is a complete snapshot ([`snapshot_index_of`]).
pub fn snapshot_path(dir: &Path, index: u64, term: u64) -> PathBuf {
    dir.join(format!("snap-{index:020}-{term}.snap"))
}

/// The index the name of a complete snapshot's file gives ([`snapshot_path`]); `None` for any
/// other file (a snapshot still being written or received among them).
pub fn snapshot_index_of(path: &Path) -> Option<u64> {
    path.file_name()?
        .to_str()?
        .strip_prefix("snap-")?
        .strip_suffix(".snap")?
        .split('-')
        .next()?
        .parse()
        .ok()
}

/// Whether `data_dir` holds any node state: a log, or a snapshot (which is
/// all an offline restore seeds). A data dir without either is a new node.
pub fn holds_node_state(data_dir: &Path) -> bool {
    log_dir(data_dir).exists() || snapshot_dir(data_dir).exists()
}

/// Refuses to start on a vote or log whose term no node can reach: openraft
/// would overflow the term at the next election, and panic again after every
/// restart. The vote is validated here, where it comes out of the store,
/// before openraft reads it.
async fn check_stored_state(log_store: &mut LogStore) -> anyhow::Result<()> {
    use openraft::storage::RaftLogStorage;
    if let Some(vote) = log_store.read_vote().await? {
        peer_gate::check_stored_term("vote", vote.leader_id.term).map_err(anyhow::Error::msg)?;
    }
    let state = log_store.get_log_state().await?;
    for (what, log_id) in [
        ("last log entry", state.last_log_id),
        ("purge point", state.last_purged_log_id),
    ] {
        if let Some(l) = log_id {
            peer_gate::check_stored_term(what, l.leader_id.term).map_err(anyhow::Error::msg)?;
        }
    }
    Ok(())
}

/// A log that cannot be opened because the disk refused, or because it is damaged, is a
/// fatal condition (classified); any other error (a locked dir, the wrong engine) is reported
/// as it is.
fn start_error(error: &cairn_raft_log::LogError, log_dir: &Path) -> anyhow::Error {
    match crate::fatal::FatalCause::from_log_error(error, log_dir) {
        Some(cause) => cause.into(),
        None => anyhow::anyhow!("{error}"),
    }
}

/// Refuses to start when the log is purged beyond what the loaded snapshot covers: the state
/// in between is lost (a damaged or missing snapshot). Without this check openraft stops at
/// start with "Failed to get log entries", naming no file.
///
/// `pub` only for `tests/crash_points.rs`, which opens each crash state as [`RaftHandle::start`]
/// does and applies this same rule; not an API.
#[doc(hidden)]
pub async fn check_snapshot_covers_log(
    log_store: &LogStore,
    state_machine: &StateMachine,
    log_dir: &Path,
) -> anyhow::Result<()> {
    let (purged, _) = log_store
        .log_state()
        .await
        .map_err(|e| start_error(&e, log_dir))?;
    let Some(purged) = purged.map(|l| l.index) else {
        return Ok(());
    };
    let applied = state_machine.applied_index();
    if applied.is_some_and(|applied| applied >= purged) {
        return Ok(());
    }
    let reached = applied.map_or("nothing".to_string(), |a| format!("index {a}"));
    let cause = match state_machine.damaged_snapshots().first() {
        Some((file, why)) => crate::fatal::FatalCause::Corruption {
            file: file.clone(),
            detail: format!(
                "the snapshot cannot be loaded ({why}); the Raft log is purged through index \
                 {purged}, so the state up to there exists only in that snapshot (the snapshots \
                 that load reach {reached})"
            ),
        },
        None => crate::fatal::FatalCause::Corruption {
            file: snapshot_dir(log_dir.parent().unwrap_or(log_dir)),
            detail: match applied {
                Some(applied) => format!(
                    "the newest snapshot file there reaches index {applied}, but the Raft log \
                     is purged through index {purged}: the state in between is lost"
                ),
                None => format!(
                    "no snapshot file is there, but the Raft log is purged through index \
                     {purged}: the state up to there is lost"
                ),
            },
        },
    };
    Err(cause.into())
}

impl RaftHandle {
    /// Opens the log and state machine under `data_dir` and starts Raft.
    pub async fn start(
        node_id: NodeId,
        data_dir: &Path,
        settings: &RaftSettings,
        limits: cairn_fsm::Limits,
        identity: Arc<ClusterIdentity>,
        tasks: &mut crate::tasks::Tasks,
    ) -> anyhow::Result<RaftHandle> {
        let config = openraft::Config {
            cluster_name: "cairn".into(),
            // openraft's follower waits `leader lease (= election_timeout_max)`
            // plus a random timeout in [min, max] after the last heartbeat before
            // it campaigns; these make that wait fall in [E, 1.2 E] for the
            // configured election timeout E.
            election_timeout_min: settings.election_timeout_ms * 4 / 10,
            election_timeout_max: settings.election_timeout_ms * 6 / 10,
            heartbeat_interval: settings.heartbeat_interval_ms,
            install_snapshot_timeout: 10_000,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(settings.snapshot_log_entries),
            // Entries kept behind a snapshot for followers that lag a little.
            // One entry can hold a batch of 256 writes, so keep few: a follower
            // further behind is sent the snapshot.
            max_in_snapshot_log_to_keep: 256,
            snapshot_max_chunk_size: settings.snapshot_chunk_bytes,
            max_payload_entries: REPLICATION_BATCH_ENTRIES_MAX,
            ..Default::default()
        }
        .validate()?;
        let log_dir = log_dir(data_dir);
        let mut log_store = LogStore::open(
            &log_dir,
            cairn_raft_log::LogOptions {
                // openraft reads each AppendEntries through the log's bounded reader.
                read_bytes_max: settings.replication_batch_bytes_max as u64,
                unsafe_skip_fsync_for_tests: settings.unsafe_skip_fsync,
                unsafe_skip_directory_fsync_for_tests: settings.unsafe_skip_fsync,
                ..cairn_raft_log::LogOptions::with_engine(settings.log_engine)
            },
        )
        .map_err(|e| start_error(&e, &log_dir))?;
        check_stored_state(&mut log_store).await?;
        let store = Store::new(limits);
        let growth = log_growth::LogGrowth::new(settings.snapshot_log_bytes);
        let stages = Arc::new(stages::WriteStages::new(settings.write_stage_timing));
        let state_machine = StateMachine::open(
            &snapshot_dir(data_dir),
            store.clone(),
            identity.clone(),
            growth.clone(),
        )?;
        state_machine.set_write_stages(stages.clone());
        check_snapshot_covers_log(&log_store, &state_machine, &log_dir).await?;
        // The snapshot just loaded is the newest durable one: purges up to it go through.
        let purge_gate =
            purge_gate::PurgeGate::new(log_store.clone(), state_machine.snapshot_index());
        state_machine.set_purge_gate(purge_gate.clone());
        if identity.node_id()?.is_none() {
            let mut sm = state_machine.clone();
            let mut reader = log_store.clone();
            let membership = openraft::storage::StorageHelper::new(&mut reader, &mut sm)
                .get_membership()
                .await
                .map_err(|e| anyhow::anyhow!("reading the stored membership: {e}"))?;
            identity::settle_node_id(
                &identity,
                data_dir,
                node_id,
                &settings.own_peer_address,
                membership.effective().membership().nodes(),
            )
            .map_err(|reason| crate::fatal::FatalCause::DataDirRefused { reason })?;
        }
        let mut network = Network::new(
            identity.clone(),
            node_id,
            settings.peer_message_bytes_max,
            settings.tls.clone(),
        );
        network.set_write_stages(stages.clone());
        let contacts = Arc::new(contacts::Contacts::default());
        contacts.set_own_data_bytes_max(settings.data_bytes_max);
        network.set_contacts(contacts.clone());
        let raft = Raft::new(
            node_id,
            Arc::new(config),
            network.clone(),
            purge_gate::GatedLog::new(purge_gate),
            state_machine.clone(),
        )
        .await?;
        let metrics = raft.metrics();
        let gate = Arc::new(PeerGate::new(
            identity.clone(),
            move || {
                let m = metrics.borrow();
                let members: BTreeSet<NodeId> = m
                    .membership_config
                    .membership()
                    .nodes()
                    .map(|(id, _)| *id)
                    .collect();
                (!members.is_empty()).then(|| peer_gate::LocalView {
                    members,
                    last_log_index: m.last_log_index,
                })
            },
            settings.bootstrap_members.clone(),
        ));
        let vouching = Arc::new(vouch::Vouching::new(
            network.clone(),
            raft.clone(),
            gate.clone(),
            node_id,
        ));
        tasks.spawn("log-growth watcher", growth.clone().run(raft.clone()));
        tasks.spawn(
            "log compaction on request",
            growth.compact_on_request(raft.clone()),
        );
        tasks.spawn(
            "check-quorum",
            check_quorum::run(
                raft.clone(),
                node_id,
                Duration::from_millis(settings.election_timeout_ms),
                Duration::from_millis(settings.heartbeat_interval_ms),
            ),
        );
        let write_batch = write_batch::WriteBatcher::start(
            raft.clone(),
            node_id,
            stages,
            settings.write_in_flight,
            tasks,
        );
        let read_batch = read_batch::ReadBatcher::new();
        let confirming = raft.clone();
        tasks.spawn(
            "read-batch driver",
            read_batch
                .clone()
                .drive(move || read_batch::confirm_with_raft(confirming.clone())),
        );
        Ok(RaftHandle {
            raft,
            read_batch,
            write_batch,
            quiet_gate: Arc::new(tokio::sync::RwLock::new(())),
            state_machine,
            node_id,
            store,
            identity,
            gate,
            vouching,
            peer_message_bytes_max: settings.peer_message_bytes_max,
            log_store,
            log_dir,
            contacts,
            raising_alarm: Default::default(),
            leases: leases::clock(settings.unsafe_lease_wall_clock),
            network,
            integrity: Default::default(),
        })
    }

    /// Waits until openraft's core has stopped, and returns its error (`Fatal::Stopped` after
    /// a requested shutdown). Returns at once if it already has.
    ///
    /// Watches the server metrics (vote, role, leader, membership), which change only on
    /// those events, and whose sender the core drops when it ends: the full metrics are sent
    /// several times per write, and every watcher of them is woken each time.
    pub async fn core_stopped(&self) -> String {
        let mut server = self.raft.server_metrics();
        loop {
            if let Err(fatal) = &self.raft.metrics().borrow().running_state {
                return fatal.to_string();
            }
            if server.changed().await.is_err() {
                // The core ended; its last full metrics say why.
                return match &self.raft.metrics().borrow().running_state {
                    Err(fatal) => fatal.to_string(),
                    Ok(()) => "the core task ended".to_string(),
                };
            }
        }
    }

    /// Why openraft's core stopped, classified: damaged data first (it marks the data dir),
    /// then the Raft log's failure, then the state machine's, else the core's own error.
    pub fn fatal_cause(&self, core_error: &str) -> crate::fatal::FatalCause {
        use crate::fatal::FatalCause;
        let log = self.log_store.failure().map(|e| {
            // A running log stops on any failure: one neither damage nor the operating
            // system's is a storage failure all the same.
            FatalCause::from_log_error(&e, &self.log_dir).unwrap_or_else(|| {
                FatalCause::StorageFailed {
                    path: self.log_dir.clone(),
                    doing: e.to_string(),
                }
            })
        });
        let state_machine = self.state_machine.failure();
        let damaged = |c: &Option<FatalCause>| c.as_ref().is_some_and(|c| c.leaves_marker());
        if damaged(&log) {
            return log.expect("checked");
        }
        if damaged(&state_machine) {
            return state_machine.expect("checked");
        }
        log.or(state_machine)
            .unwrap_or_else(|| FatalCause::RaftStopped {
                reason: core_error.to_string(),
            })
    }

    /// The gRPC service answering Raft RPCs from peers.
    /// The Raft service of the peer port; its AppendEntries streams end once `stopped`
    /// turns true (the node is shutting down), so that the port's graceful shutdown is not
    /// held by them.
    pub fn rpc_service(
        &self,
        stopped: tokio::sync::watch::Receiver<bool>,
    ) -> RaftServiceServer<RaftRpcService> {
        let limits = RaftServerLimits {
            message_bytes_max: self.peer_message_bytes_max,
            entries_max: peer_gate::ENTRIES_MAX,
            snapshot_chunk_bytes_max: peer_gate::SNAPSHOT_CHUNK_BYTES_MAX,
        };
        RaftRpcService::new(self.raft.clone(), self.node_id, self.gate.clone(), limits)
            .with_contacts(self.contacts.clone())
            .with_stop(stopped)
            .with_digests(self.store.clone(), self.integrity.clone())
            .with_vouching({
                let vouching = self.vouching.clone();
                Arc::new(move |stranger| vouching.ask_about(stranger))
            })
            .into_server()
    }

    /// Initializes a new cluster with `members` as voters. Only called on a node
    /// whose log is empty; a no-op (Ok(false)) when the node is already initialized.
    pub async fn initialize(&self, members: BTreeMap<NodeId, NodeInfo>) -> anyhow::Result<bool> {
        if self.raft.is_initialized().await? {
            return Ok(false);
        }
        self.raft.initialize(members).await?;
        Ok(true)
    }

    pub async fn is_initialized(&self) -> bool {
        self.raft.is_initialized().await.unwrap_or(false)
    }

    /// Proposes a command and waits until it is committed and applied here.
    ///
    /// Outcomes a client can rely on (the `cairn_forwarding::Handle`
    /// contract): `NotLeader` or `Unavailable` only when the command was
    /// refused before it was proposed (certainly not applied). A leader that
    /// loses leadership, or a node that shuts down, while the entry is in
    /// flight may still see it committed by the next leader: that is reported
    /// as `Inconsistent` (outcome unknown), never as a definite failure.
    ///
    /// Leadership is checked here, once per request, before anything is
    /// encoded or queued; nothing above asks whether this node leads.
    ///
    /// A write or delete may share its entry with other writes (see
    /// [`write_batch`]); every other command is an entry of its own.
    pub async fn propose(&self, command: Command) -> Result<(u64, Applied), ApiError> {
        // A command the cluster version does not allow is refused here, on the node that
        // received it (a follower never forwards one to a leader of an older build) and
        // again on the leader before it enters the log; apply checks once more.
        if let Some(feature) = command.needs() {
            self.store.cluster_version().require(feature)?;
        }
        // Refused before proposing: not a proposal (a follower's forwarded writes come
        // here first, and must not count as failed proposals).
        self.require_leader()?;
        // The quotas, on the leader, before the log (apply checks again with the exact
        // size). A write the space quota refuses raises NOSPACE through the log.
        if let Err(refusal) = self.store.check_capacity(&command) {
            let space = self.store.space();
            if cairn_fsm::capacity::is_space_refusal(&refusal) && space.alarm_index.is_none() {
                capacity::raise_alarm(self, self.raising_alarm.clone());
            }
            return Err(refusal.into());
        }
        let pending = series::Pending::start();
        let result = match command {
            Command::Write { .. } | Command::Delete { .. } => {
                self.write_batch.propose(command).await
            }
            other => {
                // Held while a leader transfer keeps this node quiet; then certainly not
                // proposed if leadership moved meanwhile.
                let _open = self.quiet_gate.read().await;
                match self.require_leader() {
                    Ok(()) => propose_entry(&self.raft, other.encode()).await,
                    Err(not_leader) => Err(not_leader),
                }
            }
        };
        pending.answered(series::failure_of(&result));
        result
    }

    /// Confirms leadership with a quorum and waits until this node has applied
    /// everything committed before the call: a read after this is linearizable.
    /// Concurrent callers share one confirmation that started after each of
    /// them arrived (see [`read_batch`]).
    ///
    /// A node that does not lead answers NotLeader at once (the request's one leadership
    /// check), without a round through the read batcher and openraft's core.
    pub async fn confirm_read(&self) -> Result<u64, ApiError> {
        self.require_leader()?;
        let read_index = self.read_batch.confirm().await?;
        // A linearizable read waits until the read index is applied.
        self.wait_applied_index(read_index).await?;
        Ok(read_index)
    }

    /// The index this node's state machine has applied, from its metrics.
    fn applied_index(&self) -> u64 {
        self.raft
            .metrics()
            .borrow()
            .last_applied
            .map(|l| l.index)
            .unwrap_or(0)
    }

    /// The current leader hint, from this node's metrics.
    pub fn leader(&self) -> LeaderHint {
        self.leader_view().hint
    }

    /// The leader this node's metrics name, with the term of this node's vote.
    pub fn leader_view(&self) -> LeaderView {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        leader_view_of(m.current_leader, &m.membership_config, &m.vote)
    }

    /// Waits until the leader or the term in this node's metrics differs from `known` and
    /// returns the new view; `None` once Raft has stopped. A new term counts even when it
    /// names the same leader: a node that refused a forwarded call as "not the leader" in the
    /// old term may lead in the new one.
    ///
    /// Watches the server metrics, which change only with the vote, role, leader or
    /// membership (not at every write, as the full metrics do).
    pub async fn leader_view_changed(&self, known: &LeaderView) -> Option<LeaderView> {
        let mut metrics = self.raft.server_metrics();
        loop {
            let view = {
                let m = metrics.borrow_and_update();
                leader_view_of(m.current_leader, &m.membership_config, &m.vote)
            };
            if &view != known {
                return Some(view);
            }
            metrics.changed().await.ok()?;
        }
    }

    /// The peer address of the leader this node knows, if it knows one (and it is not this
    /// node).
    pub fn leader_address(&self) -> Option<String> {
        let status = self.status();
        let leader = status.leader_id.filter(|id| *id != self.node_id)?;
        status
            .voters
            .get(&leader)
            .or_else(|| status.learners.get(&leader))
            .map(|node| node.peer_address.clone())
    }

    pub fn is_leader(&self) -> bool {
        leads(&self.raft.metrics().borrow(), self.node_id)
    }

    /// `Ok` on the leader; elsewhere NotLeader with the leader this node knows.
    pub fn require_leader(&self) -> Result<(), ApiError> {
        require_leader(&self.raft, self.node_id)
    }

    /// The voter this node, leading, would hand leadership to (see
    /// `check_quorum::best_successor`); `None` when there is no other voter.
    pub fn best_successor(&self) -> Option<NodeId> {
        check_quorum::best_successor(&self.raft.metrics().borrow(), self.node_id)
    }

    pub fn status(&self) -> RaftStatus {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voter_ids: BTreeSet<NodeId> = membership.voter_ids().collect();
        let mut voters = BTreeMap::new();
        let mut learners = BTreeMap::new();
        for (id, node) in membership.nodes() {
            if voter_ids.contains(id) {
                voters.insert(*id, node.clone());
            } else {
                learners.insert(*id, node.clone());
            }
        }
        let matched = m
            .replication
            .as_ref()
            .map(|r| {
                r.iter()
                    .map(|(id, log_id)| (*id, log_id.map(|l| l.index)))
                    .collect()
            })
            .unwrap_or_default();
        RaftStatus {
            node_id: m.id,
            state: format!("{:?}", m.state).to_lowercase(),
            leader_id: m.current_leader,
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index: m.last_applied.map(|l| l.index).unwrap_or(0),
            snapshot_index: m.snapshot.map(|l| l.index).unwrap_or(0),
            purged_index: m.purged.map(|l| l.index).unwrap_or(0),
            voters,
            learners,
            matched,
            millis_since_quorum_ack: m.millis_since_quorum_ack,
        }
    }

    /// The committed index as this node knows it.
    /// Whether this node leads and its state machine holds everything committed: it has
    /// committed an entry of its own term (so every entry of earlier terms it holds is
    /// committed) and applied up to it. Until then a new leader's state may be older than
    /// its log (what the replicated quota is, for one).
    pub async fn leads_with_current_state(&self) -> bool {
        if !self.is_leader() {
            return false;
        }
        let term = self.status().term;
        let committed = self
            .raft
            .with_raft_state(|s| s.committed)
            .await
            .ok()
            .flatten();
        committed.is_some_and(|c| c.leader_id.term == term && self.store.applied_index() >= c.index)
    }

    pub async fn committed_index(&self) -> u64 {
        self.raft
            .with_raft_state(|s| s.committed.map(|l| l.index).unwrap_or(0))
            .await
            .unwrap_or(0)
    }

    /// Waits until this node's applied index reaches `index` (unbounded: the caller cuts it
    /// off at its deadline); Unavailable once Raft stops.
    pub async fn wait_applied_index(&self, index: u64) -> Result<(), ApiError> {
        if self.applied_index() < index {
            self.raft
                .wait(None)
                .applied_index_at_least(Some(index), "wait_applied_index")
                .await
                .map_err(fatal)?;
        }
        assert!(
            self.applied_index() >= index,
            "waited until the applied index reached {index}"
        );
        Ok(())
    }

    /// Waits until this node's applied index reaches `index`, or the timeout passes.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> bool {
        self.raft
            .wait(Some(timeout))
            .applied_index_at_least(Some(index), "wait_applied")
            .await
            .is_ok()
    }

    /// Adds a learner; returns once the change is committed, without waiting for the learner
    /// to catch up (its progress shows in [`RaftHandle::status`]: `matched`).
    pub async fn add_learner(&self, id: NodeId, node: NodeInfo) -> Result<u64, ApiError> {
        let r = self.raft.add_learner(id, node, false).await;
        self.membership_result(r)
    }

    /// Makes `id` a voter (it must already be a learner or a voter).
    pub async fn promote(&self, id: NodeId) -> Result<u64, ApiError> {
        let r = self
            .raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await;
        self.membership_result(r)
    }

    /// Removes `id` from the cluster (as a voter and as a node).
    pub async fn remove(&self, id: NodeId) -> Result<u64, ApiError> {
        let status = self.status();
        let r = if status.voters.contains_key(&id) {
            self.raft
                .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
                .await
        } else if status.learners.contains_key(&id) {
            self.raft
                .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
                .await
        } else {
            return Err(ApiError::invalid(
                "id",
                format!("node {id} is not a member"),
            ));
        };
        self.membership_result(r)
    }

    fn membership_result(
        &self,
        r: Result<
            openraft::raft::ClientWriteResponse<TypeConfig>,
            RaftError<NodeId, ClientWriteError<NodeId, NodeInfo>>,
        >,
    ) -> Result<u64, ApiError> {
        match r {
            Ok(response) => Ok(response.log_id.index),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(ApiError::NotLeader {
                    hint: leader_hint(f.leader_id, f.leader_node),
                })
            }
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                Err(membership_error(e))
            }
            Err(RaftError::Fatal(e)) => Err(fatal(e)),
        }
    }

    /// Starts an election on this node now.
    pub async fn trigger_election(&self) -> Result<(), ApiError> {
        self.raft.trigger().elect().await.map_err(fatal)
    }

    /// Makes this node quiet for a leader transfer, until the guard drops: no heartbeat, no
    /// election timer, and no write proposed (those that arrive wait; see
    /// [`write_batch::WriteBatcher::hold`]), so that its followers' leases lapse and the
    /// successor's first campaign wins.
    pub async fn go_quiet(&self) -> Quiet {
        let writes = self.write_batch.hold().await;
        let others = self.quiet_gate.clone().write_owned().await;
        self.raft.runtime_config().heartbeat(false);
        self.raft.runtime_config().elect(false);
        Quiet {
            raft: self.raft.clone(),
            _held: (writes, others),
        }
    }

    /// The table at one point in time, with the header of a snapshot file for it.
    /// The table for a backup: an online restore in progress is not part of
    /// it (a backup holds committed state only).
    pub fn point_in_time_snapshot(
        &self,
    ) -> Result<(cairn_fsm::Snapshot, crate::snapshot_file::SnapshotHeader), ApiError> {
        let (mut snapshot, mut header) = self
            .state_machine
            .consistent_snapshot()
            .map_err(ApiError::Unavailable)?;
        snapshot.pending = None;
        header.pending_restore = None;
        Ok((snapshot, header))
    }

    /// Builds a snapshot now and waits for it (used before planned shutdowns and in tests).
    pub async fn trigger_snapshot(&self) -> Result<(), ApiError> {
        self.raft.trigger().snapshot().await.map_err(fatal)
    }

    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
    }
}

/// A node gone quiet for a leader transfer ([`RaftHandle::go_quiet`]): heartbeats and the
/// election timer come back, and held writes are proposed, when it drops.
pub struct Quiet {
    raft: Raft,
    _held: (
        tokio::sync::OwnedSemaphorePermit,
        tokio::sync::OwnedRwLockWriteGuard<()>,
    ),
}

impl Drop for Quiet {
    fn drop(&mut self) {
        self.raft.runtime_config().heartbeat(true);
        self.raft.runtime_config().elect(true);
    }
}
