//! Nemeses: the faults a scenario injects while its workload runs, and the
//! healing afterwards.
//!
//! A nemesis alternates quiet periods and faults until its time is up: it
//! picks one variant of its kind (seeded), applies it, holds it, heals it,
//! and notes each step in its log. [`heal_all`] then removes every fault that
//! could remain (paused processes, partitions, stopped nodes, skewed clocks)
//! and [`converge`] waits until a leader is elected and every node has
//! applied what it committed.
//!
//! The fencing nemesis ([`fencing`]) takes the election from its holder (isolating or
//! stopping the node it talks to, killing it, moving the leader) and jumps the leader's wall
//! clock, for the election workload ([`crate::election`]).
//!
//! The kill loops ([`kill_loop`]) are nemeses whose every round is a kill and a restart
//! that must succeed: a node that does not come back, or does not catch up, fails the
//! scenario on the spot with the end of its log.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom as _, SliceRandom as _};
use rand::Rng;

use crate::cluster::Cluster;
use crate::net::{shapes, NetworkLab};

pub mod fencing;
pub mod kill_loop;
pub(crate) mod restore;

pub use kill_loop::KillLoopRounds;
pub use restore::{RecordedSet, RestoreRounds, NEMESIS_PROCESS};

/// The kind of fault a scenario injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NemesisKind {
    /// `kill -9` of a random node, of the leader, or of a majority; restarts.
    Kill,
    /// `SIGSTOP` then `SIGCONT` of a random node or of the leader.
    Pause,
    /// Network partitions: isolate one, majority/minority, one-way, ring, bridge.
    Partition,
    /// Clock skew and clock rate changes (libfaketime; a node restart each).
    Clock,
    /// Power cuts of a minority, or of every node at once.
    PowerCut,
    /// Add a node (`--join`), remove one (`RemoveMember`; the leader every other
    /// time), under load.
    Membership,
    /// `TransferLeader` drills.
    LeaderTransfer,
    /// Membership changes with a partition cut while each is in flight (the partition
    /// starts just before the change is asked for and heals 1.5–3.5 s later).
    MembershipPartition,
    /// A tiny history (`--history-changes-max` [`COMPACTION_HISTORY_CHANGES`]) and `kill -9`
    /// of a node for a few seconds: its watchers resume from a revision the history no
    /// longer holds (Compacted) and must resynchronize from a snapshot.
    Compaction,
    /// Online restores (`cairn snapshot restore` of a backup saved earlier) with a
    /// `kill -9` of the driver, a follower or the leader part-way through or just
    /// after the commit (`restore`); set workload only: its checker models restores.
    RestoreKill,
    /// `kill -9` of a node every few seconds (the leader about half the time), aimed at a
    /// snapshot being written, a log segment rotation or purge, or (every fourth round) a
    /// snapshot install from the leader; every restart must stay up and catch up
    /// ([`kill_loop`]). Large entries: the set workload with padding.
    KillLoop,
    /// As [`NemesisKind::KillLoop`], but the kernel kills: every node runs in a memory
    /// cgroup of its own, and the victim's limit is lowered to just above its heap so that
    /// its next allocation burst gets it OOM-killed ([`crate::memcg`]).
    OomKillLoop,
    /// The election's faults ([`fencing`]): the holder's node or the leader isolated, a
    /// SIGSTOP longer than the leases' TTL, the leader's wall clock jumped by minutes, kills,
    /// leader transfers; election workload only (its checker knows the holder).
    Fencing,
    /// The leader's wall clock jumped by minutes, every round ([`fencing::leader_clock_round`]):
    /// the broken-node proof of `--unsafe-lease-wall-clock` only, with the election workload
    /// (not in [`NemesisKind::ALL`]: [`NemesisKind::Fencing`] runs it among its rounds).
    LeaderClock,
    /// A quorum lost for good: a follower `SIGSTOP`ped so that it lags, then `kill -9` of
    /// three of five nodes, then of the two survivors, and a new cluster recovered from the
    /// survivors with `cairn recover` ([`crate::recover`], which runs it as one sequence,
    /// not in rounds); set workload only. Not in [`NemesisKind::ALL`]: no other workload or
    /// scenario takes it.
    QuorumLoss,
}

/// The history a [`NemesisKind::Compaction`] cluster keeps: a node down for a second
/// under load falls behind it.
pub const COMPACTION_HISTORY_CHANGES: usize = 16;

impl NemesisKind {
    pub fn name(self) -> &'static str {
        match self {
            NemesisKind::Kill => "kill",
            NemesisKind::Pause => "pause",
            NemesisKind::Partition => "partition",
            NemesisKind::Clock => "clock",
            NemesisKind::PowerCut => "power-cut",
            NemesisKind::Membership => "membership",
            NemesisKind::LeaderTransfer => "leader-transfer",
            NemesisKind::MembershipPartition => "membership-partition",
            NemesisKind::Compaction => "compaction",
            NemesisKind::RestoreKill => "restore-kill",
            NemesisKind::KillLoop => "kill-loop",
            NemesisKind::OomKillLoop => "oom-kill-loop",
            NemesisKind::Fencing => "fencing",
            NemesisKind::LeaderClock => "leader-clock",
            NemesisKind::QuorumLoss => "quorum-loss",
        }
    }

    /// Every nemesis `ci` and `soak` run: all but the broken-node proof's
    /// [`NemesisKind::LeaderClock`] and [`NemesisKind::QuorumLoss`], which only `ci`'s recovery
    /// scenario runs.
    pub const ALL: [NemesisKind; 13] = [
        NemesisKind::Kill,
        NemesisKind::Pause,
        NemesisKind::Partition,
        NemesisKind::Clock,
        NemesisKind::PowerCut,
        NemesisKind::Membership,
        NemesisKind::LeaderTransfer,
        NemesisKind::MembershipPartition,
        NemesisKind::Compaction,
        NemesisKind::RestoreKill,
        NemesisKind::KillLoop,
        NemesisKind::OomKillLoop,
        NemesisKind::Fencing,
    ];

    /// Whether this is a kill loop: large entries, frequent snapshots, a kill each round
    /// ([`kill_loop`]).
    pub fn is_kill_loop(self) -> bool {
        matches!(self, NemesisKind::KillLoop | NemesisKind::OomKillLoop)
    }

    /// Whether its cluster runs in network namespaces (partitions).
    pub fn needs_network(self) -> bool {
        matches!(
            self,
            NemesisKind::Partition | NemesisKind::MembershipPartition | NemesisKind::Fencing
        )
    }

    /// Whether its cluster runs with clock files ([`crate::cluster::ClusterOptions::live_clocks`]).
    pub fn needs_live_clocks(self) -> bool {
        matches!(
            self,
            NemesisKind::Clock | NemesisKind::Fencing | NemesisKind::LeaderClock
        )
    }

    /// Why this nemesis cannot run here, if it cannot.
    pub fn unavailable_reason(self) -> Option<String> {
        match self {
            NemesisKind::Partition | NemesisKind::MembershipPartition => {
                crate::net::unavailable_reason()
            }
            NemesisKind::PowerCut => cairn_powercut_fs::fuse_unavailable_reason(),
            NemesisKind::Clock => faketime_missing(),
            NemesisKind::OomKillLoop => crate::memcg::unavailable_reason(),
            NemesisKind::Fencing => crate::net::unavailable_reason().or_else(faketime_missing),
            NemesisKind::LeaderClock => faketime_missing(),
            _ => None,
        }
    }
}

/// Why clock faults cannot run here, if they cannot.
fn faketime_missing() -> Option<String> {
    match crate::cluster::faketime_library() {
        Some(_) => None,
        None => Some("libfaketime is not installed (Debian package `faketime`)".into()),
    }
}

/// Timestamped notes of what the nemesis did.
#[derive(Debug)]
pub struct NemesisLog {
    started: Instant,
    pub lines: Vec<String>,
    /// Faults injected.
    pub faults: usize,
}

impl NemesisLog {
    pub fn new(started: Instant) -> NemesisLog {
        NemesisLog {
            started,
            lines: Vec::new(),
            faults: 0,
        }
    }

    pub fn note(&mut self, text: impl AsRef<str>) {
        let at = self.started.elapsed().as_secs_f64();
        self.lines.push(format!("{at:8.3}s {}", text.as_ref()));
    }
}

/// What a running nemesis needs.
pub struct NemesisContext<'a> {
    pub cluster: &'a mut Cluster,
    pub lab: Option<Arc<NetworkLab>>,
    pub rng: StdRng,
    pub log: NemesisLog,
    /// Nodes this nemesis paused or skewed (healed by [`heal_all`]).
    pub paused: BTreeSet<u64>,
    pub skewed: BTreeSet<u64>,
    /// Members at the start (membership changes keep this many voters).
    pub voters: usize,
    /// The set workload's history, for a nemesis whose own operations the checker
    /// must see (the restore nemesis records its backups and restores).
    pub history: Option<RecordedSet>,
    /// What the restore nemesis keeps between rounds.
    pub restores: RestoreRounds,
    /// What the kill loops count over their rounds.
    pub kill_loop: KillLoopRounds,
    /// At most this many rounds (`None`: rounds until the time is up).
    pub rounds_max: Option<usize>,
    /// What the fencing nemesis shares with the election workload (its holder, the history's
    /// clock, the fault windows); `None` for every other workload.
    pub election: Option<fencing::ElectionLink>,
}

fn millis(rng: &mut StdRng, range: (u64, u64)) -> Duration {
    Duration::from_millis(rng.random_range(range.0..=range.1))
}

/// A random leader, or a random node when no leader is known.
async fn leader_or_random(cx: &mut NemesisContext<'_>) -> u64 {
    match cx.cluster.leader().await {
        Some(l) => l,
        None => *cx
            .cluster
            .ids()
            .choose(&mut cx.rng)
            .expect("a cluster has nodes"),
    }
}

/// Runs `kind` until `duration` has passed (or [`NemesisContext::rounds_max`] rounds are
/// done); faults are healed as they end.
pub async fn run(
    kind: NemesisKind,
    cx: &mut NemesisContext<'_>,
    duration: Duration,
) -> Result<(), String> {
    run_rotating(&[kind], cx, duration).await
}

/// As [`run`], taking the rounds from `kinds` in turn (a partition, then a
/// kill, then a leader transfer...). Every kind must be able to run here.
pub async fn run_rotating(
    kinds: &[NemesisKind],
    cx: &mut NemesisContext<'_>,
    duration: Duration,
) -> Result<(), String> {
    assert!(
        !kinds.is_empty(),
        "a rotating nemesis needs at least one kind"
    );
    let deadline = Instant::now() + duration;
    // Let the workload warm up first.
    tokio::time::sleep(millis(&mut cx.rng, (1000, 2000))).await;
    let mut round = 0usize;
    while Instant::now() + Duration::from_secs(2) < deadline
        && cx.rounds_max.is_none_or(|max| round < max)
    {
        let kind = kinds[round % kinds.len()];
        round += 1;
        match kind {
            NemesisKind::Kill => kill_round(cx).await,
            NemesisKind::Pause => pause_round(cx).await,
            NemesisKind::Partition => partition_round(cx).await?,
            NemesisKind::Clock => clock_round(cx, round).await,
            NemesisKind::PowerCut => power_cut_round(cx, round).await,
            NemesisKind::Membership => membership_round(cx, round).await?,
            NemesisKind::LeaderTransfer => transfer_round(cx).await,
            NemesisKind::MembershipPartition => membership_partition_round(cx, round).await?,
            NemesisKind::Compaction => compaction_round(cx).await,
            NemesisKind::RestoreKill => restore::round(cx).await?,
            NemesisKind::KillLoop => kill_loop::round(cx, kill_loop::Killer::Signal, round).await?,
            NemesisKind::OomKillLoop => {
                kill_loop::round(cx, kill_loop::Killer::Kernel, round).await?
            }
            NemesisKind::Fencing => fencing::round(cx, round).await?,
            NemesisKind::LeaderClock => fencing::leader_clock_round(cx).await?,
            NemesisKind::QuorumLoss => {
                return Err("the quorum loss is one sequence of crate::recover, not rounds".into())
            }
        }
        // A kill loop's round ends with its node caught up: a short pause is enough.
        let quiet = if kind.is_kill_loop() {
            millis(&mut cx.rng, (300, 1000))
        } else {
            millis(&mut cx.rng, (1000, 2500))
        };
        tokio::time::sleep(quiet.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
    if let Some(killer) = kinds.iter().find_map(|kind| match kind {
        NemesisKind::KillLoop => Some(kill_loop::Killer::Signal),
        NemesisKind::OomKillLoop => Some(kill_loop::Killer::Kernel),
        _ => None,
    }) {
        kill_loop::finish(cx, killer)?;
    }
    Ok(())
}

async fn kill_round(cx: &mut NemesisContext<'_>) {
    let ids = cx.cluster.ids();
    let variant = cx.rng.random_range(0..3);
    let targets: Vec<u64> = match variant {
        0 => vec![*ids.choose(&mut cx.rng).expect("nodes")],
        1 => vec![leader_or_random(cx).await],
        _ => {
            let mut shuffled = ids.clone();
            shuffled.shuffle(&mut cx.rng);
            shuffled.truncate(ids.len() / 2 + 1);
            shuffled
        }
    };
    let what = ["a random node", "the leader", "a majority"][variant];
    for id in &targets {
        cx.cluster.kill(*id);
    }
    cx.log.faults += 1;
    cx.log.note(format!("kill -9 {what}: {targets:?}"));
    tokio::time::sleep(millis(&mut cx.rng, (1500, 4000))).await;
    for id in &targets {
        cx.cluster.spawn(*id);
    }
    cx.log.note(format!("restarted {targets:?}"));
}

async fn pause_round(cx: &mut NemesisContext<'_>) {
    let target = if cx.rng.random_bool(0.5) {
        leader_or_random(cx).await
    } else {
        *cx.cluster.ids().choose(&mut cx.rng).expect("nodes")
    };
    cx.cluster.pause(target);
    cx.paused.insert(target);
    cx.log.faults += 1;
    cx.log.note(format!("SIGSTOP node {target}"));
    tokio::time::sleep(millis(&mut cx.rng, (1500, 4000))).await;
    cx.cluster.resume(target);
    cx.paused.remove(&target);
    cx.log.note(format!("SIGCONT node {target}"));
}

async fn partition_round(cx: &mut NemesisContext<'_>) -> Result<(), String> {
    let lab = cx
        .lab
        .clone()
        .ok_or("the partition nemesis needs a network lab")?;
    let mut ids = cx.cluster.ids();
    let variants: &[&str] = if ids.len() >= 5 {
        &[
            "isolate-random",
            "isolate-leader",
            "halves",
            "one-way",
            "ring",
            "bridge",
        ]
    } else {
        &[
            "isolate-random",
            "isolate-leader",
            "halves",
            "one-way",
            "bridge",
        ]
    };
    let variant = *variants.choose(&mut cx.rng).expect("variants");
    ids.shuffle(&mut cx.rng);
    let leader = leader_or_random(cx).await;
    let grudge = match variant {
        "isolate-random" => shapes::isolate(ids[0], &ids),
        "isolate-leader" => shapes::isolate(leader, &ids),
        "halves" => {
            let minority = (ids.len() - 1) / 2;
            shapes::split(&ids[..minority], &ids[minority..])
        }
        // The leader (usually) stops hearing the others; they still hear it.
        "one-way" => shapes::deaf(leader, &ids),
        "ring" => shapes::ring(&ids),
        _ => shapes::bridge(ids[0], &ids),
    };
    lab.partition(&grudge)?;
    cx.log.faults += 1;
    cx.log.note(format!(
        "partition {variant} (leader was {leader}): drops {grudge:?}"
    ));
    tokio::time::sleep(millis(&mut cx.rng, (2500, 5000))).await;
    lab.heal()?;
    cx.log.note("healed the network");
    Ok(())
}

/// Odd rounds (with [`crate::cluster::ClusterOptions::live_clocks`]): the wall clocks of
/// running nodes jump or drift, then come back. Even rounds: nodes restart under a
/// skewed or faster/slower clock (monotonic included), then restart on the real one.
async fn clock_round(cx: &mut NemesisContext<'_>, round: usize) {
    if round % 2 == 1 && cx.cluster.live_clocks() {
        return live_clock_round(cx).await;
    }
    const SPECS: [&str; 6] = ["+9s", "-9s", "+120s", "+0 x2", "+0 x0.5", "-3s x1.5"];
    let ids = cx.cluster.ids();
    let count = cx.rng.random_range(1..=ids.len());
    let mut targets = ids.clone();
    targets.shuffle(&mut cx.rng);
    targets.truncate(count);
    let mut applied = Vec::new();
    for id in &targets {
        let spec = SPECS.choose(&mut cx.rng).expect("specs").to_string();
        cx.cluster.stop(*id);
        cx.cluster.set_faketime(*id, Some(spec.clone()));
        cx.cluster.spawn(*id);
        cx.skewed.insert(*id);
        applied.push(format!("{id}: {spec:?}"));
    }
    cx.log.faults += 1;
    cx.log
        .note(format!("restarted under faketime: {}", applied.join(", ")));
    tokio::time::sleep(millis(&mut cx.rng, (3000, 6000))).await;
    for id in &targets {
        cx.cluster.stop(*id);
        cx.cluster.set_faketime(*id, None);
        cx.cluster.spawn(*id);
        cx.skewed.remove(id);
    }
    cx.log
        .note(format!("restarted {targets:?} on the real clock"));
}

async fn live_clock_round(cx: &mut NemesisContext<'_>) {
    const SPECS: [&str; 7] = [
        "+9s",
        "-9s",
        "+300s",
        "-300s",
        "+0 x3",
        "+0 x0.3",
        "+20s x1.5",
    ];
    let mut targets = cx.cluster.ids();
    targets.shuffle(&mut cx.rng);
    targets.truncate(cx.rng.random_range(1..=targets.len()));
    let mut applied = Vec::new();
    for id in &targets {
        let spec = *SPECS.choose(&mut cx.rng).expect("specs");
        cx.cluster.set_clock(*id, spec);
        applied.push(format!("{id}: {spec:?}"));
    }
    cx.log.faults += 1;
    cx.log.note(format!(
        "wall clocks of running nodes jumped or drift: {}",
        applied.join(", ")
    ));
    tokio::time::sleep(millis(&mut cx.rng, (3000, 6000))).await;
    for id in &targets {
        cx.cluster.set_clock(*id, "+0");
    }
    cx.log
        .note(format!("wall clocks of {targets:?} back to real time"));
}

async fn power_cut_round(cx: &mut NemesisContext<'_>, round: usize) {
    let mut ids = cx.cluster.ids();
    ids.shuffle(&mut cx.rng);
    // Every other round cuts every node; the others a minority.
    let all = round.is_multiple_of(2);
    let targets: Vec<u64> = if all {
        ids.clone()
    } else {
        ids[..(ids.len() - 1) / 2].to_vec()
    };
    for id in &targets {
        cx.cluster.cut_power(*id);
    }
    cx.log.faults += 1;
    cx.log.note(format!(
        "power cut ({}): {targets:?}",
        if all { "all nodes" } else { "a minority" }
    ));
    tokio::time::sleep(millis(&mut cx.rng, (500, 1500))).await;
    for id in &targets {
        cx.cluster.spawn(*id);
    }
    cx.log.note(format!("powered on {targets:?}"));
    tokio::time::sleep(millis(&mut cx.rng, (1500, 3000))).await;
}

/// Adds a node when the cluster has its starting size, else removes one: the leader
/// every other removal (round), another voter otherwise.
async fn membership_round(cx: &mut NemesisContext<'_>, round: usize) -> Result<(), String> {
    let leader = cx.cluster.leader().await;
    if cx.cluster.ids().len() <= cx.voters {
        let Some(leader) = leader else {
            cx.log.note("membership: no leader, nothing changed");
            return Ok(());
        };
        let via = cx.cluster.node(leader).client_address.clone();
        let id = cx.cluster.try_add_joining_node(&via)?;
        cx.log.faults += 1;
        cx.log.note(format!("started node {id} with --join {via}"));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let voter = match cx.cluster.leader().await {
                Some(l) => cx
                    .cluster
                    .status(l)
                    .await
                    .is_some_and(|s| s.members.iter().any(|m| m.id == id && m.voter)),
                None => false,
            };
            if voter {
                cx.log.note(format!("node {id} is a voter"));
                break;
            }
            if Instant::now() > deadline {
                cx.log
                    .note(format!("node {id} did not become a voter within 20 s"));
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    } else {
        let remove_leader = round.is_multiple_of(4) && leader.is_some();
        let candidates: Vec<u64> = cx
            .cluster
            .ids()
            .into_iter()
            .filter(|id| (Some(*id) == leader) == remove_leader)
            .collect();
        let Some(&target) = candidates.choose(&mut cx.rng) else {
            return Ok(());
        };
        let what = if remove_leader {
            "the leader"
        } else {
            "a follower"
        };
        match cx
            .cluster
            .remove_member(target, Duration::from_secs(15))
            .await
        {
            Ok(_) => {
                cx.cluster.forget(target);
                cx.log.faults += 1;
                cx.log.note(format!(
                    "removed {what} {target} (RemoveMember) and stopped it"
                ));
            }
            Err(e) => cx.log.note(format!("removing {what} {target} failed: {e}")),
        }
    }
    Ok(())
}

/// A partition (one node isolated, the leader half the time) cut just before a
/// membership change is asked for and healed 1.5–3.5 s later, while the change is
/// usually still in flight: it runs with a node unreachable, and may lose its leader
/// half-way.
async fn membership_partition_round(
    cx: &mut NemesisContext<'_>,
    round: usize,
) -> Result<(), String> {
    let lab = cx
        .lab
        .clone()
        .ok_or("the membership-partition nemesis needs a network lab")?;
    let ids = cx.cluster.ids();
    let target = if cx.rng.random_bool(0.5) {
        leader_or_random(cx).await
    } else {
        *ids.choose(&mut cx.rng).expect("nodes")
    };
    lab.partition(&shapes::isolate(target, &ids))?;
    cx.log.faults += 1;
    let hold = millis(&mut cx.rng, (1500, 3500));
    cx.log.note(format!(
        "partition: isolated node {target} for {hold:?}, across a membership change"
    ));
    // The partition heals while the change is usually still in flight.
    let healer = tokio::spawn({
        let lab = lab.clone();
        async move {
            tokio::time::sleep(hold).await;
            lab.heal()
        }
    });
    tokio::time::sleep(millis(&mut cx.rng, (200, 800))).await;
    let changed = membership_round(cx, round).await;
    healer
        .await
        .map_err(|e| format!("the partition healer failed: {e}"))??;
    cx.log.note("healed the network");
    changed
}

/// `kill -9` of a random node for 1.5–3 s under a tiny history (see
/// [`NemesisKind::Compaction`]).
async fn compaction_round(cx: &mut NemesisContext<'_>) {
    let target = *cx.cluster.ids().choose(&mut cx.rng).expect("nodes");
    cx.cluster.kill(target);
    cx.log.faults += 1;
    cx.log.note(format!(
        "kill -9 node {target}: its watchers fall behind a history of {COMPACTION_HISTORY_CHANGES} changes"
    ));
    tokio::time::sleep(millis(&mut cx.rng, (1500, 3000))).await;
    cx.cluster.spawn(target);
    cx.log.note(format!("restarted {target}"));
}

async fn transfer_round(cx: &mut NemesisContext<'_>) {
    let ids = cx.cluster.ids();
    let leader = cx.cluster.leader().await;
    let others: Vec<u64> = ids.into_iter().filter(|id| Some(*id) != leader).collect();
    let to = if cx.rng.random_bool(0.2) {
        0
    } else {
        *others.choose(&mut cx.rng).unwrap_or(&0)
    };
    match cx.cluster.transfer_leader(to, Duration::from_secs(5)).await {
        Ok(from) => {
            cx.log.faults += 1;
            cx.log.note(format!("TransferLeader from {from} to {to}"));
        }
        Err(e) => cx.log.note(format!("TransferLeader to {to} failed: {e}")),
    }
    tokio::time::sleep(millis(&mut cx.rng, (500, 1500))).await;
}

/// Removes every fault that can remain: resumes paused nodes, heals the
/// network, restarts skewed nodes on the real clock and starts stopped ones.
pub fn heal_all(cx: &mut NemesisContext<'_>) -> Result<(), String> {
    for id in cx.cluster.ids() {
        cx.cluster.resume(id);
    }
    cx.paused.clear();
    if let Some(lab) = &cx.lab {
        lab.heal()?;
    }
    if cx.cluster.live_clocks() {
        for id in cx.cluster.ids() {
            cx.cluster.set_clock(id, "+0");
        }
    }
    for id in std::mem::take(&mut cx.skewed) {
        cx.cluster.stop(id);
        cx.cluster.set_faketime(id, None);
        cx.cluster.spawn(id);
    }
    for id in cx.cluster.ids() {
        if !cx.cluster.is_running(id) {
            cx.cluster.spawn(id);
        }
    }
    cx.log.note("healed everything");
    Ok(())
}

/// Waits until a leader is elected and every node has applied the leader's
/// commit index. Returns a description of what did not converge.
pub async fn converge(cluster: &Cluster, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let leader = loop {
        if let Some(l) = cluster.leader().await {
            break l;
        }
        if Instant::now() > deadline {
            return Err(format!("no leader within {timeout:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let commit = cluster
        .status(leader)
        .await
        .map(|s| s.commit_index)
        .ok_or_else(|| format!("leader {leader} stopped answering"))?;
    for id in cluster.ids() {
        let left = deadline.saturating_duration_since(Instant::now());
        if !cluster.wait_applied(id, commit, left).await {
            return Err(format!(
                "node {id} did not apply index {commit} within {timeout:?}"
            ));
        }
    }
    Ok(())
}
