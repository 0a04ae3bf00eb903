//! The rolling upgrade and rollback (`jepsen-tests upgrade`; issue 31): a running cluster of
//! an earlier release is upgraded to this build member by member under load, with one member
//! rolled back to the earlier build and forward again on the way.
//!
//! The earlier release is one of `tests/compat/releases.toml` (the newest by default), built
//! from its pinned commit ([`release`]). Three nodes start on it; the register and the set
//! workloads run from then until the end; the nodes move, in a seeded order a, b, c, with r
//! one of a and b (seeded):
//!
//! | step | a, b, c run |
//! | --- | --- |
//! | start | earlier, earlier, earlier |
//! | a, then b, to this build | this, this, earlier |
//! | hold: a member of this build leads for [`HOLD`] | this, this, earlier |
//! | r back to the earlier build, then to this build again | this, this, earlier |
//! | c to this build | this, this, this |
//!
//! What must hold:
//! - every move: SIGTERM, a clean exit (status 0) within [`STOP_WAIT`], the other build started
//!   on the same data dir, answering as its release, and caught up with the leader's commit
//!   index within [`CATCH_UP_WAIT`]; some write acknowledged between the SIGTERM and the catch-up
//!   (writes flow through every move); no node ever exits by itself;
//! - the cluster version never leaves the one the cluster started at while any member is set
//!   to the earlier build (down or up): a watcher asks every node for its status every [`POLL`]
//!   and counts an answer as premature only when a member was on the earlier build both before
//!   the question and after the answer. Its answers must include some from a leader of this
//!   build while a member of the earlier build was present, or the check proved nothing; after
//!   the hold, this build's members must say the cluster version is still the starting one;
//! - once c runs this build, every member reports the cluster version this build supports
//!   within [`RAISE_WAIT`] of c's start;
//! - the histories: the register history linearizable and its eventual reads monotonic per
//!   node, the set history without a lost acknowledged element or any other anomaly (zero
//!   anomalies), and both with enough work done to count ([`runner::Minimums`]).
//!
//! A 0.1.0 node's status has no cluster version: it runs at 0.1 (`docs/upgrading.md`). Once
//! the cluster version has risen the earlier build must not be started again; this scenario
//! does not. It writes `upgrade.log` (every step, timed), `register-history.jsonl`,
//! `set-history.jsonl`, `eventual.jsonl`, `check.txt` and the node logs into its folder.

pub mod release;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_client::{Client, ClientOptions};
use cairn_proto::v1::StatusResponse;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use rand::{Rng, SeedableRng};

use crate::cluster::{Cluster, ClusterOptions, StatusProbe};
use crate::nemesis::{self, NemesisLog};
use crate::runner::{self, Minimums, RunEnvironment, Status};
use crate::workload::{self, Workload, WorkloadKind, WorkloadOptions};
use crate::Verdict;

/// How long a member has to exit after SIGTERM.
pub const STOP_WAIT: Duration = Duration::from_secs(20);
/// How long a started member has to catch up with the leader's commit index.
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(40);
/// How long a leader of this build serves with a member of the earlier build present before
/// the rollback: longer than a member's report stays fresh (3 s) plus two of the leader's
/// checks (1 s apart), so that a build that raises without every member's report has done so.
pub const HOLD: Duration = Duration::from_secs(6);
/// How long after the last member's start every member must report the raised version.
pub const RAISE_WAIT: Duration = Duration::from_secs(30);
/// How often the watcher asks every node for its status.
pub const POLL: Duration = Duration::from_millis(250);
/// How long a leader transfer to a member of this build may take, retries included.
const TRANSFER_WAIT: Duration = Duration::from_secs(20);
/// Writes between two steps, drawn uniformly (ms).
const BETWEEN_STEPS_MS: (u64, u64) = (2000, 3500);
/// Members moved from one build to the other in a run: a, b, r twice, c.
pub const MOVES: usize = 5;
/// The cluster version of a node whose status has none: a build of release 0.1.0.
const UNRECORDED_CLUSTER_VERSION: &str = "0.1";

/// One of the two builds of the scenario.
#[derive(Clone, Debug)]
pub struct Build {
    /// `MAJOR.MINOR.PATCH`: what its `cairn --version` and its status say.
    pub release: String,
    pub binary: PathBuf,
}

/// Which of the two builds a member runs (or will at its next start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Earlier,
    Current,
}

/// The builds of a run.
#[derive(Clone, Debug)]
pub struct Builds {
    pub earlier: Build,
    pub current: Build,
}

impl Builds {
    fn of(&self, side: Side) -> &Build {
        match side {
            Side::Earlier => &self.earlier,
            Side::Current => &self.current,
        }
    }
}

/// The cluster version a status reports; 0.1 when it has none (a build of release 0.1.0).
pub fn cluster_version_of(status: &StatusResponse) -> &str {
    if status.cluster_version.is_empty() {
        UNRECORDED_CLUSTER_VERSION
    } else {
        &status.cluster_version
    }
}

/// The highest cluster version a status says its build supports.
fn supported_of(status: &StatusResponse) -> &str {
    if status.cluster_version_supported.is_empty() {
        UNRECORDED_CLUSTER_VERSION
    } else {
        &status.cluster_version_supported
    }
}

/// `MAJOR.MINOR` as numbers, for comparing.
fn version_numbers(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Which build each member is set to, as the scenario last set it (before a start with the
/// other build); shared with the watcher.
#[derive(Clone, Default)]
struct Sides(Arc<Mutex<BTreeMap<u64, Side>>>);

impl Sides {
    fn set(&self, id: u64, side: Side) {
        self.0.lock().insert(id, side);
    }

    fn of(&self, id: u64) -> Side {
        self.0.lock().get(&id).copied().unwrap_or(Side::Earlier)
    }

    /// The members set to the earlier build.
    fn earlier(&self) -> Vec<u64> {
        self.0
            .lock()
            .iter()
            .filter(|(_, side)| **side == Side::Earlier)
            .map(|(id, _)| *id)
            .collect()
    }
}

/// What the watcher saw.
#[derive(Debug, Default)]
struct Watched {
    /// Status answers.
    answers: usize,
    /// Answers of a leader of this build while a member was on the earlier build.
    current_leader_answers: usize,
    /// Answers of a cluster version other than the starting one while a member was on the
    /// earlier build (the first few, described).
    premature: Vec<String>,
    premature_count: usize,
}

/// Asks every node for its status every [`POLL`] until `stop`; see the module docs.
/// `current` is this build's release.
async fn watch(
    probe: StatusProbe,
    sides: Sides,
    starting: String,
    current: String,
    started: Instant,
    stop: Arc<AtomicBool>,
) -> Watched {
    let mut watched = Watched::default();
    while !stop.load(Ordering::SeqCst) {
        for id in probe.ids() {
            let before = sides.earlier();
            let Some(status) = probe.status(id).await else {
                continue;
            };
            let after = sides.earlier();
            watched.answers += 1;
            // A member on the earlier build all the while the question was out.
            let Some(earlier) = before.iter().find(|e| after.contains(e)) else {
                continue;
            };
            if status.version == current && status.state == "leader" {
                watched.current_leader_answers += 1;
            }
            let version = cluster_version_of(&status);
            if version != starting {
                watched.premature_count += 1;
                if watched.premature.len() < 5 {
                    watched.premature.push(format!(
                        "at {:.1} s node {id} (release {}, {}) reported cluster version {version} \
                         while node {earlier} was set to the earlier build",
                        started.elapsed().as_secs_f64(),
                        status.version,
                        status.state
                    ));
                }
            }
        }
        tokio::time::sleep(POLL).await;
    }
    watched
}

/// A run's result.
#[derive(Clone, Debug)]
pub struct UpgradeResult {
    pub status: Status,
    pub elapsed: Duration,
    pub folder: PathBuf,
    /// Members moved from one build to the other.
    pub moves: usize,
    /// (operations, acknowledged writes, successful reads) of the register and the set
    /// workloads.
    pub register: (usize, usize, usize),
    pub set: (usize, usize, usize),
    /// The cluster version at the start and at the end, and how long after the last member's
    /// start every member reported the end one.
    pub cluster_versions: (String, String),
    pub raised_after: Option<Duration>,
}

/// The scenario's folder in the results.
pub fn folder_of(env: &RunEnvironment, builds: &Builds) -> PathBuf {
    env.results.join(format!(
        "upgrade-{}-to-{}",
        builds.earlier.release, builds.current.release
    ))
}

/// The scenario bounded by `bound` (a panic or a timeout is a failure, its nodes killed).
pub async fn run_bounded(
    builds: Builds,
    env: Arc<RunEnvironment>,
    seed: u64,
    bound: Duration,
) -> UpgradeResult {
    let started = Instant::now();
    let folder = folder_of(&env, &builds);
    match runner::bounded(bound, async move { run(&builds, &env, seed).await }).await {
        Ok(result) => result,
        Err(why) => UpgradeResult {
            status: Status::Failed(why),
            elapsed: started.elapsed(),
            folder,
            moves: 0,
            register: (0, 0, 0),
            set: (0, 0, 0),
            cluster_versions: (String::new(), String::new()),
            raised_after: None,
        },
    }
}

/// What the steps share.
struct Upgrade<'a> {
    builds: &'a Builds,
    cluster: Cluster,
    sides: Sides,
    log: NemesisLog,
    rng: StdRng,
    register: Workload,
    set: Workload,
    moves: usize,
    /// The cluster version at the start, and the one this build supports.
    starting: String,
    target: Option<String>,
    raised_after: Option<Duration>,
}

impl Upgrade<'_> {
    /// Prints a progress line and keeps it for `upgrade.log`.
    fn note(&mut self, text: impl AsRef<str>) {
        println!("  upgrade: {}", text.as_ref());
        self.log.note(text);
    }

    /// Writes acknowledged so far, both workloads.
    fn acknowledged(&self) -> usize {
        runner::work_done(&self.register.recorder.history()).0
            + runner::work_done(&self.set.recorder.history()).0
    }

    async fn leader_note(&self) -> String {
        match self.cluster.leader().await {
            Some(l) => format!("leader {l} ({})", self.builds.of(self.sides.of(l)).release),
            None => "no leader".into(),
        }
    }

    /// Lets the workloads write for a while.
    async fn writes_flow(&mut self) {
        let pause = self
            .rng
            .random_range(BETWEEN_STEPS_MS.0..=BETWEEN_STEPS_MS.1);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }

    /// Moves member `id` to the build of `to` (see the module docs).
    async fn move_member(&mut self, id: u64, to: Side) -> Result<(), String> {
        let from = self.builds.of(self.sides.of(id)).release.clone();
        let build = self.builds.of(to).clone();
        let acknowledged = self.acknowledged();
        let leader = self.leader_note().await;
        self.note(format!("node {id}: SIGTERM (release {from}; {leader})"));
        let stopping = Instant::now();
        match self.cluster.stop_gracefully(id, STOP_WAIT).await {
            Some(status) if status.success() => {}
            Some(status) => {
                return Err(format!(
                    "node {id} (release {from}) did not stop cleanly on SIGTERM ({status}); the \
                     end of its log:\n    {}",
                    self.cluster.log_tail(id, 8).replace('\n', "\n    ")
                ))
            }
            None => {
                return Err(format!(
                    "node {id} (release {from}) did not exit within {STOP_WAIT:?} of SIGTERM \
                     (killed); the end of its log:\n    {}",
                    self.cluster.log_tail(id, 8).replace('\n', "\n    ")
                ))
            }
        }
        let stopped_in = stopping.elapsed();
        self.sides.set(id, to);
        self.cluster.set_binary(id, &build.binary);
        self.cluster.spawn(id);
        let (applied, took) = self.cluster.wait_caught_up(id, CATCH_UP_WAIT).await?;
        let status = self
            .cluster
            .status(id)
            .await
            .ok_or_else(|| format!("node {id} stopped answering right after it caught up"))?;
        if status.version != build.release {
            return Err(format!(
                "node {id} answers as release {:?}, not {} (the binary {})",
                status.version,
                build.release,
                build.binary.display()
            ));
        }
        let during = self.acknowledged() - acknowledged;
        if during == 0 {
            return Err(format!(
                "no write was acknowledged while node {id} moved from release {from} to {} \
                 ({:.1} s): writes must flow through every move",
                build.release,
                stopping.elapsed().as_secs_f64()
            ));
        }
        self.moves += 1;
        let leader = self.leader_note().await;
        self.note(format!(
            "node {id}: release {} caught up (applied {applied}) {:.1} s after its start; exited \
             in {:.2} s; {during} writes acknowledged meanwhile; {leader}; cluster version {}",
            build.release,
            took.as_secs_f64(),
            stopped_in.as_secs_f64(),
            cluster_version_of(&status)
        ));
        Ok(())
    }

    /// Makes a member of this build lead (a leader transfer when one of the earlier build
    /// leads); returns it.
    async fn current_leader(&mut self, candidates: &[u64]) -> Result<u64, String> {
        let deadline = Instant::now() + TRANSFER_WAIT;
        let mut last = String::from("no leader");
        while Instant::now() < deadline {
            if let Some(leader) = self.cluster.leader().await {
                if self.sides.of(leader) == Side::Current {
                    return Ok(leader);
                }
                let to = candidates[self.rng.random_range(0..candidates.len())];
                match self
                    .cluster
                    .transfer_leader(to, Duration::from_secs(5))
                    .await
                {
                    Ok(from) => {
                        self.note(format!("TransferLeader from {from} to {to}"));
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                    Err(e) => last = e,
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(format!(
            "no member of this build ({candidates:?}) came to lead within {TRANSFER_WAIT:?}: \
             {last}"
        ))
    }

    /// Every member's status, or which did not answer.
    async fn statuses(&self) -> Result<Vec<(u64, StatusResponse)>, String> {
        let mut all = Vec::new();
        for id in self.cluster.ids() {
            let status = self
                .cluster
                .status(id)
                .await
                .ok_or_else(|| format!("node {id} did not answer its status"))?;
            all.push((id, status));
        }
        Ok(all)
    }

    /// Fails unless every member reports the starting cluster version, and every member of
    /// this build reports the target as its highest.
    async fn check_not_raised(&mut self) -> Result<(), String> {
        let mut said = Vec::new();
        let mut wrong = false;
        for (id, status) in self.statuses().await? {
            let version = cluster_version_of(&status);
            let side = self.sides.of(id);
            wrong |= version != self.starting;
            if side == Side::Current {
                wrong |= Some(supported_of(&status)) != self.target.as_deref();
            }
            said.push(format!(
                "node {id} (release {}): cluster version {version}, supports up to {}",
                status.version,
                supported_of(&status)
            ));
        }
        if wrong {
            return Err(format!(
                "with a member of the earlier build present, the members must report cluster \
                 version {} and this build's up to {}: {}",
                self.starting,
                self.target.as_deref().unwrap_or("?"),
                said.join("; ")
            ));
        }
        self.note(format!("cluster version held: {}", said.join("; ")));
        Ok(())
    }

    /// Waits until every member reports the target cluster version.
    async fn wait_raised(&mut self, last_started: Instant) -> Result<(), String> {
        let target = self.target.clone().ok_or("no target cluster version")?;
        let deadline = last_started + RAISE_WAIT;
        loop {
            self.cluster.check_all_running()?;
            let mut said = Vec::new();
            let mut all = true;
            for id in self.cluster.ids() {
                let version = self
                    .cluster
                    .status(id)
                    .await
                    .map(|s| cluster_version_of(&s).to_owned());
                all &= version.as_deref() == Some(target.as_str());
                said.push(format!(
                    "node {id}: {}",
                    version.as_deref().unwrap_or("no answer")
                ));
            }
            if all {
                let after = last_started.elapsed();
                self.raised_after = Some(after);
                self.note(format!(
                    "cluster version {target} on every member, {:.1} s after the last member's \
                     start",
                    after.as_secs_f64()
                ));
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the cluster version did not reach {target} on every member within \
                     {RAISE_WAIT:?} of the last member's start: {}",
                    said.join(", ")
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The steps of the module docs, after the start.
    async fn steps(&mut self) -> Result<(), String> {
        let mut order = self.cluster.ids();
        order.shuffle(&mut self.rng);
        let [a, b, c] = order[..] else {
            return Err(format!("the upgrade runs on 3 nodes, not {}", order.len()));
        };
        let rolled_back = if self.rng.random_bool(0.5) { a } else { b };
        self.note(format!(
            "plan: node {a}, then {b}, to release {}; node {rolled_back} back to {} and forward \
             again; node {c} last",
            self.builds.current.release, self.builds.earlier.release
        ));
        self.writes_flow().await;
        for id in [a, b] {
            self.move_member(id, Side::Current).await?;
            if self.target.is_none() {
                let status = self
                    .cluster
                    .status(id)
                    .await
                    .ok_or_else(|| format!("node {id} did not answer its status"))?;
                let target = supported_of(&status).to_owned();
                if version_numbers(&target) < version_numbers(&self.starting) {
                    return Err(format!(
                        "release {} supports cluster versions up to {target}, below the \
                         cluster's {}",
                        self.builds.current.release, self.starting
                    ));
                }
                self.note(format!(
                    "release {} supports cluster versions up to {target}; the cluster runs at {}",
                    self.builds.current.release, self.starting
                ));
                self.target = Some(target);
            }
            self.writes_flow().await;
        }
        let leader = self.current_leader(&[a, b]).await?;
        self.note(format!(
            "hold: node {leader} (release {}) leads, node {c} runs release {}; the cluster \
             version must stay {} for {HOLD:?}",
            self.builds.current.release, self.builds.earlier.release, self.starting
        ));
        tokio::time::sleep(HOLD).await;
        self.cluster.check_all_running()?;
        self.check_not_raised().await?;
        self.move_member(rolled_back, Side::Earlier).await?;
        self.writes_flow().await;
        self.check_not_raised().await?;
        self.move_member(rolled_back, Side::Current).await?;
        self.writes_flow().await;
        let last_started = Instant::now();
        self.move_member(c, Side::Current).await?;
        self.wait_raised(last_started).await?;
        self.writes_flow().await;
        self.cluster.check_all_running()
    }
}

/// The scenario (see the module docs).
pub async fn run(builds: &Builds, env: &RunEnvironment, seed: u64) -> UpgradeResult {
    let started = Instant::now();
    let folder = folder_of(env, builds);
    let mut result = UpgradeResult {
        status: Status::Passed,
        elapsed: Duration::ZERO,
        folder: folder.clone(),
        moves: 0,
        register: (0, 0, 0),
        set: (0, 0, 0),
        cluster_versions: (String::new(), String::new()),
        raised_after: None,
    };
    let outcome = match std::fs::create_dir_all(&folder) {
        Ok(()) => run_inner(builds, env, seed, &folder, &mut result).await,
        Err(e) => Err(format!("cannot create {}: {e}", folder.display())),
    };
    result.elapsed = started.elapsed();
    match outcome {
        Ok(()) => {
            // Keep the logs and histories, not the data dirs.
            for e in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
                if e.path().is_dir() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        Err(why) => result.status = Status::Failed(why),
    }
    result
}

async fn run_inner(
    builds: &Builds,
    env: &RunEnvironment,
    seed: u64,
    folder: &Path,
    result: &mut UpgradeResult,
) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut options = ClusterOptions::new(&builds.earlier.binary, 3);
    options.root = Some(folder.to_path_buf());
    options.election_timeout_ms = 800;
    // Snapshots all along: each build loads the other's.
    options.snapshot_log_entries = 500;
    options.die_with_parent = true;
    options.log_level = runner::node_log_level();
    let cluster = Cluster::try_start(options)?;
    for id in cluster.ids() {
        release::check_agent_flags(&builds.earlier.binary, &cluster.agent_flags(id))?;
    }
    let sides = Sides::default();
    for id in cluster.ids() {
        sides.set(id, Side::Earlier);
    }
    let log_started = Instant::now();
    let mut log = NemesisLog::new(log_started);
    let first_leader = runner::wait_leader(&cluster, Duration::from_secs(20)).await?;
    let starting = {
        let status = cluster
            .status(first_leader)
            .await
            .ok_or_else(|| format!("leader {first_leader} did not answer its status"))?;
        if status.version != builds.earlier.release {
            return Err(format!(
                "node {first_leader} answers as release {:?}, not {}",
                status.version, builds.earlier.release
            ));
        }
        cluster_version_of(&status).to_owned()
    };
    let line = format!(
        "3 nodes of release {} up, leader {first_leader}, cluster version {starting}",
        builds.earlier.release
    );
    println!("  upgrade: {line}");
    log.note(line);
    let endpoints = cluster.endpoints();
    let lifetimes = || workload::NodeLifetimes::new(cluster.lifetimes(), cluster.ids());
    let register = Workload::start(
        WorkloadOptions::new(WorkloadKind::Register, rng.random()),
        &endpoints,
        lifetimes(),
    );
    let set = Workload::start(
        WorkloadOptions::new(WorkloadKind::Set, rng.random()),
        &endpoints,
        lifetimes(),
    );
    let stop_watch = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn(watch(
        cluster.status_probe(),
        sides.clone(),
        starting.clone(),
        builds.current.release.clone(),
        log_started,
        stop_watch.clone(),
    ));
    let mut upgrade = Upgrade {
        builds,
        cluster,
        sides,
        log,
        rng: StdRng::seed_from_u64(rng.random()),
        register,
        set,
        moves: 0,
        starting: starting.clone(),
        target: None,
        raised_after: None,
    };
    let mut failures: Vec<String> = Vec::new();
    if let Err(e) = upgrade.steps().await {
        upgrade.note(format!("FAILED: {e}"));
        failures.push(e);
    }
    // Steps cut short do too little work: that is not worth a failure of its own.
    let steps_done = failures.is_empty();
    stop_watch.store(true, Ordering::SeqCst);
    let watched = watcher
        .await
        .map_err(|e| format!("the cluster version watcher failed: {e}"))?;
    let Upgrade {
        cluster,
        mut log,
        mut register,
        mut set,
        moves,
        target,
        raised_after,
        ..
    } = upgrade;
    register.stop_processes().await;
    set.stop_processes().await;
    log.note("workloads stopped");
    result.moves = moves;
    result.raised_after = raised_after;
    result.cluster_versions = (starting.clone(), target.unwrap_or_default());
    if let Err(e) = nemesis::converge(&cluster, Duration::from_secs(40)).await {
        failures.push(format!("the cluster did not converge at the end: {e}"));
    }
    let final_client = Client::new(
        &cluster.endpoints(),
        ClientOptions {
            request_timeout: Duration::from_secs(5),
            ..ClientOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    for workload in [&register, &set] {
        if !workload
            .final_reads(&final_client, Duration::from_secs(30))
            .await
        {
            failures.push(format!(
                "the {} workload's final reads did not succeed within 30 s",
                workload.options.kind.name()
            ));
        }
    }
    log.note("final reads done");
    let mut report = String::new();
    let _ = writeln!(
        report,
        "cluster version watcher: {} status answers, {} from a leader of release {} while a \
         member ran release {}, {} with a cluster version other than {starting} while a member \
         ran release {}",
        watched.answers,
        watched.current_leader_answers,
        builds.current.release,
        builds.earlier.release,
        watched.premature_count,
        builds.earlier.release
    );
    for line in &watched.premature {
        let _ = writeln!(report, "  {line}");
    }
    if watched.premature_count > 0 {
        failures.push(format!(
            "the cluster version left {starting} while a member ran release {} ({} answers; \
             the first: {})",
            builds.earlier.release, watched.premature_count, watched.premature[0]
        ));
    } else if watched.current_leader_answers == 0 && failures.is_empty() {
        failures.push(format!(
            "no leader of release {} answered while a member ran release {}: the hold proved \
             nothing",
            builds.current.release, builds.earlier.release
        ));
    }
    // Both histories, each checked by its own checker.
    let mut verdict = Verdict::Valid;
    for workload in [&register, &set] {
        let kind = workload.options.kind;
        let history = workload.recorder.history();
        let mut jsonl = Vec::new();
        if history.write_jsonl(&mut jsonl).is_ok() {
            let _ = std::fs::write(
                folder.join(format!("{}-history.jsonl", kind.name())),
                &jsonl,
            );
        }
        let (writes, reads) = runner::work_done(&history);
        let counts = (history.len(), writes, reads);
        match kind {
            WorkloadKind::Register => result.register = counts,
            _ => result.set = counts,
        }
        let checked = match kind {
            WorkloadKind::Register => runner::check_register(
                &history,
                &workload.eventual.history(),
                env.check_budget,
                folder,
                &mut report,
            )?,
            _ => runner::check_set(&history, &mut report)?,
        };
        let _ = writeln!(
            report,
            "{} operations: {}",
            kind.name(),
            runner::outcome_counts(&history)
        );
        verdict = verdict.combine(checked);
        let minimums = Minimums {
            acknowledged_writes: 100,
            successful_reads: 30,
            faults: MOVES,
        };
        if let Some(short) = minimums.shortfall(&history, moves).filter(|_| steps_done) {
            failures.push(format!("{}: {short}", kind.name()));
        }
    }
    runner::write_file(&folder.join("check.txt"), &report);
    runner::write_file(&folder.join("upgrade.log"), &(log.lines.join("\n") + "\n"));
    drop(cluster);
    match verdict {
        Verdict::Valid => {}
        Verdict::Invalid => failures.insert(
            0,
            format!("checker: INVALID (see {}/check.txt)", folder.display()),
        ),
        Verdict::Unknown => failures.push(format!(
            "checker: UNKNOWN (see {}/check.txt)",
            folder.display()
        )),
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

/// Prints a run's result line.
pub fn print_result(builds: &Builds, result: &UpgradeResult) {
    let (start, end) = &result.cluster_versions;
    let raised = result.raised_after.map_or(String::new(), |after| {
        format!(
            "; cluster version {start} -> {end} {:.1} s after the last member's start",
            after.as_secs_f64()
        )
    });
    let work = format!(
        "{:.1}s, {} moves; register: {} ops, {} writes acknowledged, {} reads; set: {} ops, {} \
         adds acknowledged, {} reads{raised}",
        result.elapsed.as_secs_f64(),
        result.moves,
        result.register.0,
        result.register.1,
        result.register.2,
        result.set.0,
        result.set.1,
        result.set.2
    );
    let name = format!(
        "upgrade {} -> {}",
        builds.earlier.release, builds.current.release
    );
    match &result.status {
        Status::Passed => println!("PASS {name} ({work})"),
        Status::Failed(why) => println!("FAIL {name} ({work}): {why}"),
        Status::Skipped(why) => println!("SKIP {name}: {why}"),
    }
}

/// Writes `summary.txt` of an upgrade run.
pub fn write_summary(
    results: &Path,
    seed: u64,
    builds: &Builds,
    result: &UpgradeResult,
    lines: &[String],
) {
    let mut text = String::new();
    let _ = writeln!(text, "command: upgrade");
    let _ = writeln!(text, "seed: {seed}");
    for line in lines {
        let _ = writeln!(text, "{line}");
    }
    let _ = writeln!(
        text,
        "earlier build: release {} ({})",
        builds.earlier.release,
        builds.earlier.binary.display()
    );
    let _ = writeln!(
        text,
        "current build: release {} ({})",
        builds.current.release,
        builds.current.binary.display()
    );
    let _ = writeln!(text, "scenario: {:.1}s", result.elapsed.as_secs_f64());
    match &result.status {
        Status::Passed => {
            let _ = writeln!(text, "PASS");
        }
        Status::Failed(why) => {
            let _ = writeln!(text, "FAIL: {why}");
            let _ = writeln!(
                text,
                "replay with: cargo run -p jepsen-tests --release -- upgrade --seed {seed}"
            );
        }
        Status::Skipped(why) => {
            let _ = writeln!(text, "SKIP: {why}");
        }
    }
    runner::write_file(&results.join("summary.txt"), &text);
}
