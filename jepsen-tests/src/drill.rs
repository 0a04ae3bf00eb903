//! Drills: one operator action on a running cluster, under a bounded and checked workload,
//! and a report of what a client saw.
//!
//! A drill starts the set workload ([`crate::workload`], the fault suite's own: concurrent
//! clients adding unique elements and listing them with strong reads), lets it run, acts,
//! lets it run again, then reads every key back with a strong read and hands the history to
//! the set checker ([`crate::set::check`]). The actions ([`Action`]):
//! - `failover`: the leader is killed with SIGKILL (or, `graceful`, hands leadership off
//!   through the admin API), a new one is awaited, and the old one started again;
//! - `rolling-restart`: each member in turn, followers first, is stopped with SIGTERM,
//!   started, and awaited until it has caught up;
//! - `partition`: the leader is cut off from the other members (it still answers clients),
//!   a new leader is awaited, then the old one's step-down, then the partition is healed and
//!   the old leader awaited until it has caught up;
//! - `restore`: a backup is taken through the leader and restored online at once; the
//!   writes acknowledged between the two are rightly undone by the restore (the set checker
//!   models restores: the backup's contents are recorded as strong reads, the restore as an
//!   operation), and no resource may carry a version below the restore's index afterwards
//!   ([`versions_backwards`]): versions stay above every one handed out before the restore.
//!
//! Members are stopped, started and partitioned through [`Members`]: `cairn dev`'s control
//! socket, or the commands an operator names (a systemd unit per node, say). Backups go
//! through [`Snapshots`]: `cairn snapshot save` and `restore`'s own code.
//! `cairn drill` is the command line over this module. [`store_report`] keeps a report in
//! the cluster (type `cairn.v1.DrillReport`, shown by the web console).
//!
//! The report ([`Report`]) gives the window in which no write was acknowledged
//! ([`write_gap`]), the leader before and after, the acknowledged writes the final reads
//! did not find (`lost_writes`), and the strong reads that went backwards (missed an element
//! an earlier operation had acknowledged or shown). The last two must be 0.
//!
//! ## Must not
//! - Call a drill clean that was not checked: a history the checker cannot decide, or a
//!   key it could not read back, is verdict `unknown`, never `pass`.
//! - Leave stopped a member it stopped: once a stop succeeded, the start is attempted even
//!   when a later step fails.
//!
//! - Leave a partition in force: once an isolation succeeded, the heal is attempted even
//!   when a later step fails.
//!
//! ## Invariants
//! - `lost_writes` and `reads_backwards` are the checker's counts, not estimates.
//! - Times in the report are milliseconds from the action's start (negative: before it).

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use cairn_client::admin::AdminClient;
use cairn_client::{Access, Client, ClientOptions};
use cairn_proto::drill_report;
use cairn_proto::v1 as pb;
use serde::Serialize;

use crate::cluster::Lifetimes;
use crate::history::{History, OpKind, Outcome, Recorder, Value};
use crate::nemesis::restore::{recorded_backup, BackupFailure, NEMESIS_PROCESS};
use crate::set::SetAnomaly;
use crate::workload::{NodeLifetimes, Workload, WorkloadKind, WorkloadOptions};
use crate::Verdict;

/// What a drill does to the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Kill the leader with SIGKILL (`graceful`: hand leadership off instead), await a new
    /// leader, start the old one again.
    Failover { graceful: bool },
    /// Stop (SIGTERM) and start each member in turn, followers first, each awaited until it
    /// has caught up.
    RollingRestart,
    /// Cut the leader off from the other members, await a new leader and the old one's
    /// step-down, heal, await the old leader caught up.
    Partition,
    /// Take a backup through the leader and restore it online at once.
    Restore,
}

impl Action {
    /// The drill's name in reports: `failover`, `failover --graceful`, `rolling-restart`,
    /// `partition`, `restore`.
    pub fn name(self) -> &'static str {
        match self {
            Action::Failover { graceful: false } => "failover",
            Action::Failover { graceful: true } => "failover --graceful",
            Action::RollingRestart => "rolling-restart",
            Action::Partition => "partition",
            Action::Restore => "restore",
        }
    }
}

/// How a member is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// SIGKILL: as a crash or the kernel's OOM killer would.
    Kill,
    /// SIGTERM and a wait until the process ended: as an operator's restart would.
    Terminate,
}

/// Stops, starts and partitions the members of the cluster under drill, by node id.
pub trait Members {
    /// Stops member `id`; returns once its process has ended.
    fn stop(&self, id: u64, how: Stop) -> impl Future<Output = Result<(), String>> + Send;
    /// Starts member `id` again (its data dir kept); returns once its process runs.
    fn start(&self, id: u64) -> impl Future<Output = Result<(), String>> + Send;
    /// Cuts member `id` off from every other member, both ways; clients still reach it.
    fn isolate(&self, id: u64) -> impl Future<Output = Result<(), String>> + Send;
    /// Ends the partition: every member hears every other again.
    fn heal(&self) -> impl Future<Output = Result<(), String>> + Send;
    /// What they are, for the report: `cairn dev in .cairn-dev`.
    fn describe(&self) -> String;
}

/// Backups of the cluster under drill, as an operator takes and restores them.
pub trait Snapshots {
    /// Saves a point-in-time backup through the leader; returns its log index.
    fn save(&self) -> impl Future<Output = Result<u64, String>> + Send;
    /// Restores the last saved backup into the running cluster; returns the log index of
    /// the restore.
    fn restore(&self) -> impl Future<Output = Result<u64, String>> + Send;
}

/// How a drill runs.
#[derive(Clone, Debug)]
pub struct DrillOptions {
    /// The client addresses of every member.
    pub endpoints: Vec<String>,
    /// How the admin calls reach them (TLS, token).
    pub access: Access,
    /// How the workload's clients reach them (TLS, token).
    pub client: ClientOptions,
    /// Concurrent writers.
    pub clients: usize,
    /// Workload before the action, and after it has ended.
    pub before: Duration,
    pub after: Duration,
    /// The longest wait for one step: a new leader, a member caught up.
    pub step_timeout: Duration,
    pub seed: u64,
}

/// One step of a drill, as it happened.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Step {
    /// Milliseconds from the action's start.
    pub at_ms: i64,
    pub what: String,
}

/// The window without an acknowledged write around the action.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct WriteGap {
    /// The last acknowledgement before it, and the first after it (milliseconds from the
    /// action's start).
    pub from_ms: i64,
    pub to_ms: i64,
    pub gap_ms: u64,
}

/// What a drill saw.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Report {
    pub drill: String,
    /// Against what: `cairn dev in .cairn-dev`.
    pub members: String,
    /// `pass`: nothing lost, no read backwards; `fail`: either; `unknown`: not checked
    /// (see `problems`).
    pub verdict: String,
    pub leader_before: u64,
    pub term_before: u64,
    pub leader_after: u64,
    pub term_after: u64,
    /// How long the action took, from its start to the cluster serving with every member.
    pub action_ms: u64,
    /// The longest stretch from the action's start on without an acknowledged write: the
    /// window in which writes failed, and (`to_ms`) the first acknowledged write after it.
    pub write_gap: Option<WriteGap>,
    pub writes_acknowledged: usize,
    /// Writes refused (certainly not applied), and writes whose outcome stayed unknown.
    pub writes_failed: usize,
    pub writes_unknown: usize,
    /// Acknowledged (or shown) writes that the final strong reads did not return.
    pub lost_writes: usize,
    /// Strong reads, and those that missed a write acknowledged or shown before they began.
    pub reads: usize,
    pub reads_backwards: usize,
    /// For `restore`: resources found after it with a version handed out before it
    /// ([`versions_backwards`]). Must be 0.
    pub versions_backwards: usize,
    pub steps: Vec<Step>,
    /// What kept the verdict from `pass`, one line each.
    pub problems: Vec<String>,
}

/// The longest window from `action_ns` on in which no write was acknowledged: between two
/// consecutive acknowledgements (the first taken from before `action_ns`, if any), among
/// those that end after `action_ns`. `None` when nothing was acknowledged after it.
/// Times are `ns` of the history; the result is in ms from `action_ns`.
pub fn write_gap(acknowledged_ns: &[u64], action_ns: u64) -> Option<WriteGap> {
    let mut times = acknowledged_ns.to_vec();
    times.sort_unstable();
    let first_after = times.partition_point(|t| *t < action_ns);
    if first_after == times.len() {
        return None;
    }
    // The window starts at the last acknowledgement before the action (or the action).
    let mut previous = if first_after > 0 {
        times[first_after - 1]
    } else {
        action_ns
    };
    let mut widest: Option<(u64, u64)> = None;
    for &t in &times[first_after..] {
        if widest.is_none_or(|(from, to)| t - previous > to - from) {
            widest = Some((previous, t));
        }
        previous = t;
    }
    let (from, to) = widest.expect("at least one acknowledgement after the action");
    assert!(from <= to);
    let ms = |t: u64| (i128::from(t) - i128::from(action_ns)) as i64 / 1_000_000;
    Some(WriteGap {
        from_ms: ms(from),
        to_ms: ms(to),
        gap_ms: (to - from) / 1_000_000,
    })
}

/// The counts of a drill's history: (acknowledged, failed, unknown) adds, and the
/// acknowledgement times of the adds.
fn write_counts(history: &History) -> (usize, usize, usize, Vec<u64>) {
    let mut acknowledged = Vec::new();
    let (mut failed, mut unknown) = (0, 0);
    for op in history
        .operations()
        .iter()
        .filter(|op| op.op == OpKind::Add)
    {
        match (op.outcome, op.complete_ns) {
            (Outcome::Ok, Some(at)) => acknowledged.push(at),
            (Outcome::Fail, _) => failed += 1,
            _ => unknown += 1,
        }
    }
    (acknowledged.len(), failed, unknown, acknowledged)
}

/// Of the versions of the resources found after a restore, those below the restore's log
/// index: versions handed out before it. A restore restamps every resource it brings with
/// its own index (`cairn_fsm::restore`), and every write after it gets a higher one, so
/// none may be lower: a client holding a version from before the restore can never match.
pub fn versions_backwards(versions: &[u64], restore_index: u64) -> usize {
    versions.iter().filter(|v| **v < restore_index).count()
}

/// The verdict line of a report, from the checker's verdict and what else went wrong
/// (`wrong`: lost writes, reads backwards and versions backwards).
fn verdict(checked: Verdict, wrong: usize, problems: &[String]) -> &'static str {
    match checked {
        _ if wrong > 0 => "fail",
        Verdict::Invalid => "fail",
        Verdict::Valid if problems.is_empty() => "pass",
        _ => "unknown",
    }
}

/// The cluster as the members' statuses show it.
#[derive(Clone, Debug, Default)]
struct View {
    /// Node id → client address, for every member that answered.
    addresses: BTreeMap<u64, String>,
    /// The node that calls itself leader and whom a majority names, with its status.
    leader: Option<pb::StatusResponse>,
    statuses: BTreeMap<u64, pb::StatusResponse>,
}

/// Runs one drill: the workload, the action, the check. An `Err` means the drill could not
/// run (no leader to begin with, a member that cannot be stopped); what it did before is in
/// the message.
/// `on_step` sees each step as it happens (a command line prints it).
pub async fn run(
    action: Action,
    members: &impl Members,
    snapshots: &impl Snapshots,
    options: &DrillOptions,
    on_step: &(dyn Fn(&Step) + Sync),
) -> Result<Report, String> {
    assert!(options.clients > 0, "a drill needs at least one client");
    let admin = AdminClient::new(
        options.endpoints.clone(),
        options.access.clone(),
        Duration::from_secs(3),
    );
    let before = wait_view(&admin, &options.endpoints, options.step_timeout, |v| {
        v.leader.is_some() && v.addresses.len() == options.endpoints.len()
    })
    .await
    .map_err(|v| {
        format!(
            "the cluster is not ready for a drill: {} of {} members answered, leader {}",
            v.addresses.len(),
            options.endpoints.len(),
            v.leader
                .map_or("none".into(), |l| format!("node {}", l.node_id))
        )
    })?;
    let leader_before = before.leader.clone().expect("waited for a leader");
    let ids: Vec<u64> = before.addresses.keys().copied().collect();
    // The workload reaches the members by the addresses their statuses answered from.
    let endpoints: Vec<String> = before.addresses.values().cloned().collect();
    let mut workload_options = WorkloadOptions::new(WorkloadKind::Set, options.seed);
    workload_options.processes = options.clients;
    workload_options.pause_ms = (5, 15);
    // Each drill its own names: a later drill must not read an earlier one's elements.
    workload_options.key_prefix = format!("drill-{:08x}-", options.seed as u32);
    let keys: Vec<String> = (0..workload_options.keys)
        .map(|k| workload_options.key(k))
        .collect();
    workload_options.client = ClientOptions {
        request_timeout: Duration::from_secs(3),
        connect_timeout: Duration::from_millis(500),
        ..options.client.clone()
    };
    let mut workload = Workload::start(
        workload_options,
        &endpoints,
        NodeLifetimes::new(Lifetimes::default(), ids.clone()),
    );
    on_step(&Step {
        at_ms: -(options.before.as_millis() as i64),
        what: format!("{} writers started", options.clients),
    });
    tokio::time::sleep(options.before).await;

    let action_ns = workload.recorder.now_ns();
    let started = tokio::time::Instant::now();
    let mut steps = Vec::new();
    let at = |steps: &mut Vec<Step>, what: String| {
        let step = Step {
            at_ms: started.elapsed().as_millis() as i64,
            what,
        };
        on_step(&step);
        steps.push(step);
    };
    let reader = Client::new(&endpoints, options.client.clone()).map_err(|e| e.to_string())?;
    let drilled = Drilled {
        recorder: &workload.recorder,
        keys: &keys,
        reader: &reader,
    };
    let acted = act(
        action, members, snapshots, &drilled, &admin, &before, options, &mut steps, &at,
    )
    .await;
    let action_ms = started.elapsed().as_millis() as u64;
    let mut problems = Vec::new();
    let restored = match acted {
        Ok(restored) => restored,
        Err(why) => {
            problems.push(why);
            None
        }
    };
    tokio::time::sleep(options.after).await;
    workload.stop_processes().await;
    at(&mut steps, "writers stopped; reading every key back".into());
    if !workload.final_reads(&reader, options.step_timeout).await {
        problems.push("a key could not be read back with a strong read".into());
    }
    let resources = drill_resources(&reader, &keys).await;
    let mut versions_back = 0;
    if let (Some(restore_index), Ok(resources)) = (restored, &resources) {
        let versions: Vec<u64> = resources
            .iter()
            .filter_map(|(_, version)| version.parse().ok())
            .collect();
        versions_back = versions_backwards(&versions, restore_index);
    }
    workload.stop_watchers().await;
    let after = wait_view(&admin, &options.endpoints, options.step_timeout, |v| {
        v.leader.is_some()
    })
    .await
    .unwrap_or_else(|v| v);
    let leader_after = after.leader.clone();
    if leader_after.is_none() {
        problems.push("no leader after the drill".into());
    }

    let history = workload.recorder.history();
    let (acknowledged, failed, unknown, acknowledged_ns) = write_counts(&history);
    let (checked, lost, backwards, reads) = match crate::set::check(&history) {
        Ok(report) => {
            let lost = report
                .keys
                .iter()
                .flat_map(|k| &k.anomalies)
                .filter(|a| matches!(a, SetAnomaly::Lost { .. }))
                .count();
            let backwards = report.keys.iter().map(|k| k.stale_reads).sum::<usize>();
            let reads = report.keys.iter().map(|k| k.reads).sum::<usize>();
            for anomaly in report.keys.iter().flat_map(|k| &k.anomalies) {
                if !matches!(anomaly, SetAnomaly::Lost { .. } | SetAnomaly::Stale { .. }) {
                    problems.push(format!("{anomaly:?}"));
                }
            }
            (report.verdict, lost, backwards, reads)
        }
        Err(e) => {
            problems.push(format!("the history could not be checked: {e}"));
            (Verdict::Unknown, 0, 0, 0)
        }
    };
    if acknowledged == 0 {
        problems.push("no write was acknowledged".into());
    }
    let removed = match resources {
        Ok(resources) => remove_elements(&reader, resources).await,
        Err(e) => Err(e),
    };
    match removed {
        Ok(removed) => at(
            &mut steps,
            format!("removed the {removed} resources the drill wrote"),
        ),
        Err(e) => problems.push(format!(
            "the drill's resources (names {}*) could not all be listed and removed: {e}",
            workload.options.key_prefix
        )),
    }
    Ok(Report {
        drill: action.name().into(),
        members: members.describe(),
        verdict: verdict(checked, lost + backwards + versions_back, &problems).into(),
        leader_before: leader_before.node_id,
        term_before: leader_before.term,
        leader_after: leader_after.as_ref().map_or(0, |l| l.node_id),
        term_after: leader_after.as_ref().map_or(0, |l| l.term),
        action_ms,
        write_gap: write_gap(&acknowledged_ns, action_ns),
        writes_acknowledged: acknowledged,
        writes_failed: failed,
        writes_unknown: unknown,
        lost_writes: lost,
        reads,
        reads_backwards: backwards,
        versions_backwards: versions_back,
        steps,
        problems,
    })
}

/// What a drill's action may record and read: the workload's history, its keys, and a
/// client for strong reads.
struct Drilled<'a> {
    recorder: &'a Recorder,
    keys: &'a [String],
    reader: &'a Client,
}

/// The action itself. Every member it stopped is started again, and a partition it made is
/// healed, before it returns, whatever happened in between. A `restore` returns its log
/// index.
#[allow(clippy::too_many_arguments)]
async fn act(
    action: Action,
    members: &impl Members,
    snapshots: &impl Snapshots,
    drilled: &Drilled<'_>,
    admin: &AdminClient,
    before: &View,
    options: &DrillOptions,
    steps: &mut Vec<Step>,
    at: &impl Fn(&mut Vec<Step>, String),
) -> Result<Option<u64>, String> {
    let leader = before.leader.as_ref().expect("a leader before").node_id;
    let others: Vec<u64> = before
        .addresses
        .keys()
        .copied()
        .filter(|id| *id != leader)
        .collect();
    match action {
        Action::Failover { graceful: true } => {
            at(
                steps,
                format!("asking node {leader} to hand leadership off"),
            );
            // The transfer waits for the target to catch up and win: up to a step.
            let transfer = AdminClient::new(
                options.endpoints.clone(),
                options.access.clone(),
                options.step_timeout,
            );
            transfer
                .at_leader(cairn_request::Operation::Mutation, |mut c| async move {
                    c.transfer_leader(pb::TransferLeaderRequest { to: 0 }).await
                })
                .await
                .map_err(|e| format!("the leader transfer failed: {e}"))?;
            let view = new_leader(admin, options, leader).await?;
            at(steps, leader_line(&view));
            Ok(None)
        }
        Action::Failover { graceful: false } => {
            at(
                steps,
                format!("killing node {leader}, the leader (SIGKILL)"),
            );
            members.stop(leader, Stop::Kill).await?;
            at(steps, format!("node {leader} is gone"));
            let elected = new_leader(admin, options, leader).await;
            if let Ok(view) = &elected {
                at(steps, leader_line(view));
            }
            restart(members, admin, options, leader, steps, at).await?;
            elected.map(|_| None)
        }
        Action::RollingRestart => {
            for id in others.iter().copied().chain([leader]) {
                let role = if id == leader { ", the leader" } else { "" };
                at(steps, format!("stopping node {id}{role} (SIGTERM)"));
                members.stop(id, Stop::Terminate).await?;
                at(steps, format!("node {id} stopped"));
                restart(members, admin, options, id, steps, at).await?;
            }
            Ok(None)
        }
        Action::Partition => {
            at(
                steps,
                format!("cutting node {leader}, the leader, off from the other members"),
            );
            members.isolate(leader).await?;
            let partitioned = async {
                let view = new_leader(admin, options, leader).await?;
                at(steps, leader_line(&view));
                // The old leader steps down once it has not heard a majority for an
                // election timeout (check-quorum); until then it may still call itself
                // leader, but can commit nothing.
                let deposed = wait_view(admin, &options.endpoints, options.step_timeout, |v| {
                    v.statuses.get(&leader).is_some_and(|s| s.state != "leader")
                })
                .await
                .map_err(|_| {
                    format!(
                        "node {leader}, cut off, still called itself leader {} s later",
                        options.step_timeout.as_secs()
                    )
                })?;
                let state = deposed
                    .statuses
                    .get(&leader)
                    .map_or(String::new(), |s| s.state.clone());
                at(
                    steps,
                    format!("node {leader}, cut off, stepped down ({state})"),
                );
                Ok::<(), String>(())
            }
            .await;
            // Healed whatever happened above.
            members.heal().await?;
            at(steps, "healed the partition".into());
            partitioned?;
            wait_caught_up(admin, options, leader, steps, at).await?;
            Ok(None)
        }
        Action::Restore => {
            at(steps, "saving a backup through the leader".into());
            // The backup's contents are recorded as one strong read per key, as the restore
            // nemesis records its backups.
            let (backup_index, contents) = recorded_backup(
                drilled.recorder,
                drilled.keys,
                drilled.reader,
                snapshots.save(),
            )
            .await
            .map_err(|failure| match failure {
                BackupFailure::Save(why) => format!("the backup failed: {why}"),
                BackupFailure::Contents(index, why) => format!(
                    "the backup at index {index} was saved, but its contents could not be read: \
                     {why}"
                ),
            })?;
            at(
                steps,
                format!("saved a backup at index {backup_index}; restoring it online"),
            );
            let restore = drilled
                .recorder
                .invoke(NEMESIS_PROCESS, OpKind::Restore, "", contents);
            match snapshots.restore().await {
                Ok(restore_index) => {
                    restore.ok(Value::Null);
                    at(
                        steps,
                        format!("restored at index {restore_index}; every open watch was closed"),
                    );
                    Ok(Some(restore_index))
                }
                Err(why) => {
                    // It may still take effect: the checker is told it may have, or not.
                    restore.info();
                    Err(format!("the restore failed: {why}"))
                }
            }
        }
    }
}

/// Every resource of the drill's keys (listed by name prefix, strongly), with its version.
async fn drill_resources(
    client: &Client,
    keys: &[String],
) -> Result<Vec<(pb::Id, String)>, String> {
    let mut found = Vec::new();
    for key in keys {
        let listing = client
            .list_request(pb::ListRequest {
                r#type: Some(crate::workload::resource_type(WorkloadKind::Set)),
                tenancy: Some(crate::workload::tenancy()),
                name_prefix: key.clone(),
                consistency: pb::Consistency::Strong as i32,
                ..pb::ListRequest::default()
            })
            .await
            .map_err(|e| e.to_string())?;
        found.extend(
            listing
                .resources
                .into_iter()
                .filter_map(|r| Some((r.id?, r.version))),
        );
    }
    Ok(found)
}

/// Deletes `resources`, [`REMOVERS`] at a time; how many.
async fn remove_elements(
    client: &Client,
    mut resources: Vec<(pb::Id, String)>,
) -> Result<usize, String> {
    let removed = resources.len();
    let share = resources.len().div_ceil(REMOVERS).max(1);
    let mut removers = tokio::task::JoinSet::new();
    while !resources.is_empty() {
        let batch: Vec<(pb::Id, String)> = resources.drain(..share.min(resources.len())).collect();
        let client = client.clone();
        removers.spawn(async move {
            for (id, version) in batch {
                client
                    .delete(id, version)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        });
    }
    while let Some(done) = removers.join_next().await {
        done.map_err(|e| e.to_string())??;
    }
    Ok(removed)
}

/// The drill reports a cluster keeps ([`store_report`]).
pub const REPORTS_KEPT: usize = 20;

/// Keeps `report` in the cluster (where `cairn_proto::drill_report` says) and removes the
/// oldest beyond [`REPORTS_KEPT`]; returns the name.
pub async fn store_report(
    client: &Client,
    report: &Report,
    unix_ms: u64,
) -> Result<String, String> {
    let name = drill_report::report_name(&report.drill, unix_ms);
    // Compact, with sorted keys (through a `Value`): the form `cairn list` shows as JSON.
    let value = serde_json::to_value(report).expect("a report serializes");
    let json = serde_json::to_vec(&value).expect("a value serializes");
    let resource = pb::Resource {
        id: Some(pb::Id {
            uid: cairn_client::new_uid(),
            name: name.clone(),
            r#type: Some(drill_report::report_type()),
            tenancy: Some(drill_report::tenancy()),
        }),
        metadata: [
            ("drill".to_string(), report.drill.clone()),
            ("verdict".to_string(), report.verdict.clone()),
        ]
        .into(),
        data: Some(cairn_proto::google::protobuf::Any {
            type_url: drill_report::TYPE_URL.into(),
            value: json.into(),
        }),
        ..pb::Resource::default()
    };
    client
        .write(resource)
        .await
        .map_err(|e| format!("cannot write {name}: {e}"))?;
    let kept = client
        .list_request(pb::ListRequest {
            r#type: Some(drill_report::report_type()),
            tenancy: Some(drill_report::tenancy()),
            consistency: pb::Consistency::Strong as i32,
            ..pb::ListRequest::default()
        })
        .await
        .map_err(|e| format!("cannot list the reports kept: {e}"))?;
    let mut kept: Vec<(pb::Id, String)> = kept
        .resources
        .into_iter()
        .filter_map(|r| Some((r.id?, r.version)))
        .collect();
    kept.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    let excess = kept.len().saturating_sub(REPORTS_KEPT);
    for (id, version) in kept.into_iter().take(excess) {
        client
            .delete(id, version)
            .await
            .map_err(|e| format!("cannot remove an old report: {e}"))?;
    }
    Ok(name)
}

/// Concurrent deletes when a drill removes what it wrote.
const REMOVERS: usize = 8;

/// Starts member `id` and waits until it has caught up with the leader.
async fn restart(
    members: &impl Members,
    admin: &AdminClient,
    options: &DrillOptions,
    id: u64,
    steps: &mut Vec<Step>,
    at: &impl Fn(&mut Vec<Step>, String),
) -> Result<(), String> {
    members.start(id).await?;
    at(steps, format!("started node {id}"));
    wait_caught_up(admin, options, id, steps, at).await
}

/// Waits until member `id` follows the leader and has applied its commit index.
async fn wait_caught_up(
    admin: &AdminClient,
    options: &DrillOptions,
    id: u64,
    steps: &mut Vec<Step>,
    at: &impl Fn(&mut Vec<Step>, String),
) -> Result<(), String> {
    let caught_up = wait_view(admin, &options.endpoints, options.step_timeout, |v| {
        let (Some(leader), Some(member)) = (&v.leader, v.statuses.get(&id)) else {
            return false;
        };
        member.leader_id == leader.node_id && member.applied_index >= leader.commit_index
    })
    .await
    .map_err(|_| {
        format!(
            "node {id} did not catch up within {} s",
            options.step_timeout.as_secs()
        )
    })?;
    let applied = caught_up.statuses.get(&id).map_or(0, |s| s.applied_index);
    at(
        steps,
        format!("node {id} caught up (applied index {applied})"),
    );
    Ok(())
}

/// Waits for a leader other than `old`.
async fn new_leader(admin: &AdminClient, options: &DrillOptions, old: u64) -> Result<View, String> {
    wait_view(admin, &options.endpoints, options.step_timeout, |v| {
        v.leader.as_ref().is_some_and(|l| l.node_id != old)
    })
    .await
    .map_err(|_| format!("no new leader within {} s", options.step_timeout.as_secs()))
}

fn leader_line(view: &View) -> String {
    let leader = view.leader.as_ref().expect("a view with a leader");
    format!("node {} leads (term {})", leader.node_id, leader.term)
}

/// Asks every endpoint for its status until `ready` takes the view (`Err` with the last view
/// after `timeout`).
async fn wait_view(
    admin: &AdminClient,
    endpoints: &[String],
    timeout: Duration,
    ready: impl Fn(&View) -> bool,
) -> Result<View, View> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let view = view_of(admin, endpoints).await;
        if ready(&view) {
            return Ok(view);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(view);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn view_of(admin: &AdminClient, endpoints: &[String]) -> View {
    let mut view = View::default();
    for (address, status) in endpoints.iter().zip(admin.statuses(endpoints).await) {
        let Ok(status) = status else { continue };
        view.addresses.insert(status.node_id, address.clone());
        view.statuses.insert(status.node_id, status);
    }
    view.leader =
        cairn_client::admin::confirmed_leader(view.statuses.values(), endpoints.len()).cloned();
    view
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_write_gap_is_the_widest_window_without_an_acknowledgement_from_the_action_on() {
        let action = 1_000 * MS;
        // (acknowledgement times in ms, expected (from, to, gap) in ms from the action)
        // (acknowledgement times in ms, expected (from, to, gap) in ms from the action)
        type Case = (&'static [u64], Option<(i64, i64, u64)>);
        let table: &[Case] = &[
            // Nothing acknowledged after the action: no gap to report.
            (&[100, 900], None),
            (&[], None),
            // Steady writes: the widest window starts at the last one before the action.
            (&[990, 1_010, 1_020], Some((-10, 10, 20))),
            // An outage: from the last ack before the kill to the first after the election.
            (&[995, 1_001, 2_300, 2_310], Some((1, 1_300, 1_299))),
            (&[998, 2_000, 2_001], Some((-2, 1_000, 1_002))),
            // Nothing before the action: the window starts at it.
            (&[1_500, 1_510], Some((0, 500, 500))),
            // Unsorted input.
            (&[2_310, 995, 2_300], Some((-5, 1_300, 1_305))),
        ];
        for (acks, expected) in table {
            let ns: Vec<u64> = acks.iter().map(|t| t * MS).collect();
            let got = write_gap(&ns, action).map(|g| (g.from_ms, g.to_ms, g.gap_ms));
            assert_eq!(got, *expected, "acks {acks:?}");
        }
    }

    #[test]
    fn after_a_restore_no_resource_has_a_version_from_before_it() {
        // (versions found after the restore, restore index, expected count)
        let table: &[(&[u64], u64, usize)] = &[
            // Restored resources carry the restore's index; later writes more.
            (&[1_940, 1_940, 1_941, 2_500], 1_940, 0),
            (&[], 1_940, 0),
            // A resource the restore should have restamped or removed.
            (&[1_935, 1_940, 1_941], 1_940, 1),
            (&[1, 2, 3], 1_940, 3),
        ];
        for (versions, restore, expected) in table {
            assert_eq!(
                versions_backwards(versions, *restore),
                *expected,
                "{versions:?} after a restore at {restore}"
            );
        }
    }

    #[test]
    fn a_drill_passes_only_when_checked_with_nothing_lost_or_backwards() {
        let none: &[String] = &[];
        let some = &["a key could not be read back".to_string()];
        // (checker, lost, backwards, problems, verdict)
        let table: &[(Verdict, usize, usize, &[String], &str)] = &[
            (Verdict::Valid, 0, 0, none, "pass"),
            (Verdict::Valid, 0, 0, some, "unknown"),
            (Verdict::Unknown, 0, 0, none, "unknown"),
            (Verdict::Invalid, 0, 0, none, "fail"),
            (Verdict::Invalid, 3, 0, none, "fail"),
            (Verdict::Unknown, 1, 0, some, "fail"),
            (Verdict::Valid, 0, 2, none, "fail"),
        ];
        for (checked, lost, backwards, problems, expected) in table {
            assert_eq!(
                verdict(*checked, *lost + *backwards, problems),
                *expected,
                "{checked:?} lost {lost} backwards {backwards} problems {problems:?}"
            );
        }
    }
}
