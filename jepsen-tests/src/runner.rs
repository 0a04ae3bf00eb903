//! The runner: scenarios (a workload plus a nemesis on a fresh cluster), the
//! `ci` suite, the `soak` loop and the broken-node proof, with everything
//! each run leaves in its results folder.
//!
//! One scenario: start the cluster (in network namespaces when it needs
//! partitions, on power-cut disks when it needs power cuts), wait for a
//! leader, run the workload while the nemesis injects faults, heal every
//! fault, stop the workload, wait for convergence, do the final reads, check
//! the history, and write `history.jsonl` (plus `watch.jsonl`), `nemesis.log`,
//! `check.txt` and the node logs into the scenario's folder. A scenario whose
//! nemesis cannot run here (not root, no FUSE, no libfaketime, no memory cgroup) is
//! *skipped* with its reason printed — never counted as passed.
//!
//! The kill loops ([`kill_loop_scenario`], [`nemesis::kill_loop`]) run the set workload
//! with 256 KiB of padding per element on nodes that snapshot every 100 entries and keep a
//! history of 256 changes; the oom loop's nodes each run in a memory cgroup.
//!
//! The quota scenario ([`quota_scenario`]) fills the cluster's space quota with the set
//! workload under kills: it fails unless the quota refused some adds
//! ([`quota_shortfall`]), and unless every node still runs when the faults end and after
//! the final reads.
//!
//! The lifecycle scenario ([`lifecycle_scenario`]) runs the lifecycle workload
//! ([`crate::lifecycle`]) through this runner like any other, once the cluster has reached
//! version 0.2; its checker is [`crate::lifecycle::check`].
//!
//! The election scenario ([`election_scenario`], run by [`crate::election::run`]) has
//! candidates campaign for one election under leases and fencing tokens, with the fencing
//! nemesis; its checker is [`crate::election::check`].
//!
//! The recovery scenario ([`recover_scenario`], run by [`crate::recover::run`]) loses a
//! quorum of a 5-node cluster for good under the set workload and recovers a new cluster
//! from the survivors with `cairn recover`; its checker is the set checker.
//!
//! The rolling upgrade ([`crate::upgrade`]) is a scenario of its own with two workloads; it
//! takes the register and set checks, the minimums ([`Minimums::shortfall`]) and the bound
//! ([`bounded`]) from here.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_client::v1::{Consistency, Tenancy};
use cairn_client::{Client, ClientOptions};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom as _;
use rand::{Rng, SeedableRng};

use crate::cluster::{Cluster, ClusterOptions};
use crate::linearizability::{CheckOptions, KeyOutcome};
use crate::models::{self, ModelKind};
use crate::nemesis::{self, NemesisContext, NemesisKind, NemesisLog};
use crate::net::NetworkLab;
use crate::watch_check::{self, Stored};
use crate::workload::{self, Workload, WorkloadKind, WorkloadOptions};
use crate::{append, monotonic, set, Verdict};

/// One scenario of a run.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub workload: WorkloadKind,
    pub nemesis: NemesisKind,
    pub nodes: usize,
    /// How long the workload runs under the nemesis.
    pub duration: Duration,
    pub seed: u64,
    /// Start every node broken on purpose (`prove-broken`); `None` in every other run.
    pub broken: Option<BrokenMode>,
    /// Run the scoped set workload on an authenticated cluster instead
    /// ([`crate::scoped`]: two tokens with disjoint scopes).
    pub auth: bool,
    /// At most this many nemesis rounds (`None`: rounds until the duration is over).
    pub rounds_max: Option<usize>,
    /// Start every node with `--data-bytes-max` this many bytes, and run the set workload
    /// with elements large enough to reach that quota ([`quota_scenario`]).
    pub quota_bytes: Option<u64>,
    /// The recovery scenario ([`crate::recover`]) only: recover from the lagging survivor
    /// alone, not from both survivors, so that acknowledged adds are lost and the scenario
    /// must fail (`ci --recover-from-lagging`: the proof that it tests the choice of survivor).
    pub recover_from_lagging: bool,
}

/// A node broken on purpose: one `--unsafe-*` switch of `cairn agent`, and the scenario
/// whose checker must catch it (`jepsen-tests prove-broken`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BrokenMode {
    /// `--unsafe-local-strong-reads`: stale strong reads; register checker, partitions.
    LocalStrongReads,
    /// `--unsafe-skip-fsync`: acknowledged writes lost by a power cut of every node; set
    /// checker, power cuts.
    SkipFsync,
    /// `--unsafe-ack-before-commit`: writes acknowledged by a leader that is then cut
    /// off never commit; set checker, partitions.
    AckBeforeCommit,
    /// `--unsafe-drop-watch-events 7`: gaps in every watch stream; watch checker.
    DropWatchEvents,
    /// `--unsafe-accept-stale-cas`: a CAS against a stale version succeeds; register
    /// checker (it sees each `cas` and each `write`'s compare).
    AcceptStaleCas,
    /// `--unsafe-ignore-fences`: the leader drops a write's fence, so a deposed holder's
    /// writes apply; election checker (checks 1 and 2: the post-pause writes), fencing nemesis.
    IgnoreFences,
    /// `--unsafe-lease-wall-clock`: leases expire on the leader's wall clock; election checker
    /// (check 4: a lease ends before its TTL), the leader's wall clock jumped every round.
    LeaseWallClock,
}

impl BrokenMode {
    pub const ALL: [BrokenMode; 7] = [
        BrokenMode::LocalStrongReads,
        BrokenMode::SkipFsync,
        BrokenMode::AckBeforeCommit,
        BrokenMode::DropWatchEvents,
        BrokenMode::AcceptStaleCas,
        BrokenMode::IgnoreFences,
        BrokenMode::LeaseWallClock,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BrokenMode::LocalStrongReads => "local-strong-reads",
            BrokenMode::SkipFsync => "skip-fsync",
            BrokenMode::AckBeforeCommit => "ack-before-commit",
            BrokenMode::DropWatchEvents => "drop-watch-events",
            BrokenMode::AcceptStaleCas => "accept-stale-cas",
            BrokenMode::IgnoreFences => "ignore-fences",
            BrokenMode::LeaseWallClock => "lease-wall-clock",
        }
    }

    /// The node flags of this mode.
    pub fn flags(self) -> Vec<String> {
        let flags: &[&str] = match self {
            BrokenMode::LocalStrongReads => &["--unsafe-local-strong-reads"],
            BrokenMode::SkipFsync => &["--unsafe-skip-fsync"],
            BrokenMode::AckBeforeCommit => &["--unsafe-ack-before-commit"],
            BrokenMode::DropWatchEvents => &["--unsafe-drop-watch-events", "7"],
            BrokenMode::AcceptStaleCas => &["--unsafe-accept-stale-cas"],
            BrokenMode::IgnoreFences => &["--unsafe-ignore-fences"],
            BrokenMode::LeaseWallClock => &["--unsafe-lease-wall-clock"],
        };
        flags.iter().map(|f| f.to_string()).collect()
    }

    /// The workload (hence the checker) and the nemesis that must catch it.
    pub fn plan(self) -> (WorkloadKind, NemesisKind) {
        match self {
            BrokenMode::LocalStrongReads => (WorkloadKind::Register, NemesisKind::Partition),
            BrokenMode::SkipFsync => (WorkloadKind::Set, NemesisKind::PowerCut),
            BrokenMode::AckBeforeCommit => (WorkloadKind::Set, NemesisKind::Partition),
            BrokenMode::DropWatchEvents => (WorkloadKind::Watch, NemesisKind::LeaderTransfer),
            BrokenMode::AcceptStaleCas => (WorkloadKind::Register, NemesisKind::LeaderTransfer),
            BrokenMode::IgnoreFences => (WorkloadKind::Election, NemesisKind::Fencing),
            BrokenMode::LeaseWallClock => (WorkloadKind::Election, NemesisKind::LeaderClock),
        }
    }

    /// Attempt `attempt` (from 1) of this mode's scenario.
    pub fn scenario(self, attempt: usize, seed: u64) -> Scenario {
        let (workload, nemesis) = self.plan();
        Scenario {
            name: format!(
                "broken-{}-{attempt:02}-{}-{}",
                self.name(),
                workload.name(),
                nemesis.name()
            ),
            workload,
            nemesis,
            nodes: 3,
            duration: Duration::from_secs(16),
            seed,
            broken: Some(self),
            auth: false,
            rounds_max: None,
            quota_bytes: None,
            recover_from_lagging: false,
        }
    }
}

/// The least work a scenario must show, or it fails: a run that acknowledged few
/// writes, read little or injected few faults proves nothing, whatever its checker says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Minimums {
    /// Writes (write, cas, delete, append, add) acknowledged as done.
    pub acknowledged_writes: usize,
    /// Reads (register reads, set and list reads; the watch workload's final reads)
    /// that succeeded.
    pub successful_reads: usize,
    /// Faults the nemesis injected (one per round that did something).
    pub faults: usize,
}

impl Minimums {
    /// The minimums of a 3- or 5-node scenario of at least 16 s. The clock nemesis
    /// restarts each node it skews, so its rounds are long: one fault is enough; the
    /// watch workload's only reads are its final reads (one per key); a kill loop kills in
    /// every round, and a loop of fewer than 5 kills is not one.
    pub fn of(workload: WorkloadKind, nemesis: NemesisKind) -> Minimums {
        Minimums {
            acknowledged_writes: 100,
            successful_reads: if workload == WorkloadKind::Watch {
                3
            } else {
                30
            },
            faults: match nemesis {
                NemesisKind::Clock | NemesisKind::LeaderClock => 1,
                NemesisKind::KillLoop | NemesisKind::OomKillLoop => 5,
                _ => 2,
            },
        }
    }
}

/// What a history shows was done: (acknowledged writes, successful reads).
pub fn work_done(history: &crate::History) -> (usize, usize) {
    use crate::history::{OpKind, Outcome};
    let ok = history
        .operations()
        .iter()
        .filter(|op| op.outcome == Outcome::Ok);
    let (reads, writes): (Vec<_>, Vec<_>) = ok.partition(|op| op.op == OpKind::Read);
    // A restore (the restore nemesis's) is a fault, not a write; a lease's grant, keep-alives
    // and revoke write no data.
    let writes = writes
        .iter()
        .filter(|op| {
            !matches!(
                op.op,
                OpKind::Restore | OpKind::Grant | OpKind::KeepAlive | OpKind::Revoke
            )
        })
        .count();
    (writes, reads.len())
}

/// Why a scenario did too little to count, if it did.
pub fn shortfall(scenario: &Scenario, history: &crate::History, faults: usize) -> Option<String> {
    Minimums::of(scenario.workload, scenario.nemesis).shortfall(history, faults)
}

impl Minimums {
    /// Why `history` and `faults` fall short of these minimums, if they do.
    pub fn shortfall(&self, history: &crate::History, faults: usize) -> Option<String> {
        let (writes, reads) = work_done(history);
        let mut short = Vec::new();
        if writes < self.acknowledged_writes {
            short.push(format!(
                "{writes} acknowledged writes (at least {} required)",
                self.acknowledged_writes
            ));
        }
        if reads < self.successful_reads {
            short.push(format!(
                "{reads} successful reads (at least {} required)",
                self.successful_reads
            ));
        }
        if faults < self.faults {
            short.push(format!(
                "{faults} faults injected (at least {} required)",
                self.faults
            ));
        }
        (!short.is_empty()).then(|| format!("too little work to count: {}", short.join(", ")))
    }
}

/// The nodes' `--log-level`: `info`, or `JEPSEN_NODE_LOG_LEVEL` (e.g.
/// `info,openraft::engine::handler::following_handler=debug` logs every truncation of a
/// follower's log, `truncate_logs since=N`).
pub fn node_log_level() -> String {
    std::env::var("JEPSEN_NODE_LOG_LEVEL").unwrap_or_else(|_| "info".into())
}

/// Whether a skipped scenario is a failure: under `CI=true` (CI must run everything,
/// so a missing package or privilege is an error there, not a reason to pass).
pub fn skip_is_failure() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// How a scenario ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Passed,
    Failed(String),
    Skipped(String),
}

#[derive(Clone, Debug)]
pub struct ScenarioResult {
    pub scenario: Scenario,
    pub status: Status,
    /// The checker's verdict (`None` when the run failed before checking).
    pub verdict: Option<Verdict>,
    pub elapsed: Duration,
    pub operations: usize,
    /// Operations of the history acknowledged as written / read successfully.
    pub acknowledged_writes: usize,
    pub successful_reads: usize,
    pub faults: usize,
    /// Quota scenarios: the adds the space quota refused.
    pub quota_refusals: Option<usize>,
    pub folder: PathBuf,
}

/// What every scenario of a run shares.
pub struct RunEnvironment {
    pub binary: PathBuf,
    pub results: PathBuf,
    /// Budget of the linearizability search per scenario.
    pub check_budget: Duration,
}

/// The short suite: at least six scenarios on 3 nodes, one under authentication
/// ([`auth_scenario`]), then two kill loops ([`kill_loop_scenario`]), the quota scenario
/// ([`quota_scenario`]), the lifecycle ([`lifecycle_scenario`]), the election
/// ([`election_scenario`]) and last the recovery from a lost quorum on 5 nodes
/// ([`recover_scenario`]): 18 scenarios.
pub fn ci_scenarios(seed: u64) -> Vec<Scenario> {
    // Every nemesis at least once, each with a checker that sees what it can break:
    // stale or lost values (register, append), lost or resurrected elements (set), gaps
    // and reordering in watch streams (watch).
    let plan: [(WorkloadKind, NemesisKind); 11] = [
        (WorkloadKind::Register, NemesisKind::Partition),
        (WorkloadKind::Register, NemesisKind::Kill),
        (WorkloadKind::Append, NemesisKind::Pause),
        (WorkloadKind::Set, NemesisKind::PowerCut),
        (WorkloadKind::Watch, NemesisKind::Partition),
        (WorkloadKind::Register, NemesisKind::Clock),
        (WorkloadKind::Append, NemesisKind::Membership),
        (WorkloadKind::Set, NemesisKind::LeaderTransfer),
        (WorkloadKind::Register, NemesisKind::MembershipPartition),
        (WorkloadKind::Watch, NemesisKind::Compaction),
        (WorkloadKind::Set, NemesisKind::RestoreKill),
    ];
    plan.iter()
        .enumerate()
        .map(|(i, (w, n))| Scenario {
            name: format!("{:02}-{}-{}", i + 1, w.name(), n.name()),
            workload: *w,
            nemesis: *n,
            nodes: 3,
            duration: Duration::from_secs(18),
            seed: seed.wrapping_add(i as u64 * 7919),
            broken: None,
            auth: false,
            rounds_max: None,
            quota_bytes: None,
            recover_from_lagging: false,
        })
        .chain(std::iter::once(Scenario {
            name: "12-set-auth-partition-kill-transfer".into(),
            ..auth_scenario(seed.wrapping_add(11 * 7919))
        }))
        .chain([
            Scenario {
                name: "13-set-kill-loop".into(),
                ..kill_loop_scenario(
                    NemesisKind::KillLoop,
                    3,
                    CI_KILL_LOOP_ROUNDS,
                    seed.wrapping_add(12 * 7919),
                )
            },
            Scenario {
                name: "14-set-oom-kill-loop".into(),
                ..kill_loop_scenario(
                    NemesisKind::OomKillLoop,
                    3,
                    CI_OOM_KILL_LOOP_ROUNDS,
                    seed.wrapping_add(13 * 7919),
                )
            },
            Scenario {
                name: "15-set-quota-kill".into(),
                ..quota_scenario(seed.wrapping_add(14 * 7919))
            },
            Scenario {
                name: "16-lifecycle-kill".into(),
                ..lifecycle_scenario(seed.wrapping_add(16 * 7919))
            },
            Scenario {
                name: "17-election-fencing".into(),
                ..election_scenario(3, seed.wrapping_add(15 * 7919))
            },
            Scenario {
                name: "18-set-quorum-loss-recover".into(),
                ..recover_scenario(seed.wrapping_add(17 * 7919))
            },
        ])
        .collect()
}

/// Rounds of the kill loop of `ci` (three of them install rounds).
pub const CI_KILL_LOOP_ROUNDS: usize = 12;
/// Rounds of the oom-kill loop of `ci` (two of them install rounds): the kernel takes up to
/// seconds to kill.
pub const CI_OOM_KILL_LOOP_ROUNDS: usize = 8;
/// Rounds of each kill loop of `soak`.
pub const SOAK_KILL_LOOP_ROUNDS: usize = 30;

/// A kill loop (`kill` is [`NemesisKind::KillLoop`] or [`NemesisKind::OomKillLoop`]) of at
/// most `rounds` rounds on `nodes` nodes, with the set workload of large entries
/// ([`nemesis::kill_loop`]). Its duration bounds the rounds too: about 5 s a round, 15 s
/// an install round.
pub fn kill_loop_scenario(kill: NemesisKind, nodes: usize, rounds: usize, seed: u64) -> Scenario {
    assert!(kill.is_kill_loop(), "{} is no kill loop", kill.name());
    let install_rounds = rounds / nemesis::kill_loop::INSTALL_ROUND_EVERY;
    let seconds = 5 * (rounds - install_rounds) + 15 * install_rounds;
    Scenario {
        name: format!("set-{}", kill.name()),
        workload: WorkloadKind::Set,
        nemesis: kill,
        nodes,
        duration: Duration::from_secs(seconds as u64),
        seed,
        broken: None,
        auth: false,
        rounds_max: Some(rounds),
        quota_bytes: None,
        recover_from_lagging: false,
    }
}

/// The scenario under authentication: two tokens with disjoint scopes run
/// the set workload through partitions, kills and leader transfers on 3
/// nodes ([`crate::scoped`]).
pub fn auth_scenario(seed: u64) -> Scenario {
    Scenario {
        name: "auth-set-partition-kill-transfer".into(),
        workload: WorkloadKind::Set,
        nemesis: NemesisKind::Partition,
        nodes: 3,
        duration: Duration::from_secs(18),
        seed,
        broken: None,
        auth: true,
        rounds_max: None,
        quota_bytes: None,
        recover_from_lagging: false,
    }
}

/// The lifecycle scenario: the lifecycle workload ([`crate::lifecycle`]) on 3 nodes under
/// kills (a random node, the leader or a majority), 18 s.
pub fn lifecycle_scenario(seed: u64) -> Scenario {
    Scenario {
        name: "lifecycle-kill".into(),
        workload: WorkloadKind::Lifecycle,
        nemesis: NemesisKind::Kill,
        nodes: 3,
        duration: Duration::from_secs(18),
        seed,
        broken: None,
        auth: false,
        rounds_max: None,
        quota_bytes: None,
        recover_from_lagging: false,
    }
}

/// How long the election scenario's faults last in `ci` (about 23 s in all).
pub const CI_ELECTION_SECONDS: u64 = 16;

/// The election scenario on `nodes` nodes ([`crate::election`]): candidates campaign for one
/// election, holders write under their fencing token, and the fencing nemesis takes the
/// election from them.
pub fn election_scenario(nodes: usize, seed: u64) -> Scenario {
    Scenario {
        name: "election-fencing".into(),
        workload: WorkloadKind::Election,
        nemesis: NemesisKind::Fencing,
        nodes,
        duration: Duration::from_secs(CI_ELECTION_SECONDS),
        seed,
        broken: None,
        auth: false,
        rounds_max: None,
        quota_bytes: None,
        recover_from_lagging: false,
    }
}

/// The recovery scenario ([`crate::recover`]): the set workload on 5 nodes, a follower
/// paused so that it lags, then 3 nodes lost for good and the other 2 killed; a new 3-node
/// cluster recovered with `cairn recover` from the most up-to-date survivor must still hold
/// every acknowledged add. Its duration is the workload's time before the loss.
pub fn recover_scenario(seed: u64) -> Scenario {
    Scenario {
        name: "set-quorum-loss-recover".into(),
        workload: WorkloadKind::Set,
        nemesis: NemesisKind::QuorumLoss,
        nodes: 5,
        duration: crate::recover::BEFORE_LOSS,
        seed,
        broken: None,
        auth: false,
        rounds_max: None,
        quota_bytes: None,
        recover_from_lagging: false,
    }
}

/// The space quota every node of [`quota_scenario`] asks for: 1 MiB, the smallest
/// `--data-bytes-max` a node accepts.
pub const QUOTA_BYTES: u64 = 1024 * 1024;
/// The padding of each element of [`quota_scenario`]
/// ([`WorkloadOptions::payload_bytes`], kept for good: the data only grows). An element
/// then counts about 4.4 KiB (its encoding, its storage key and 192 bytes), so about 235
/// acknowledged adds fill [`QUOTA_BYTES`]: 3–4 s of the set workload's writes, so that it
/// gets there within the first half of an 18 s run even when it starts with a majority
/// killed for seconds, and spends the rest of the run refused, under kills.
pub const QUOTA_PAYLOAD_BYTES: usize = 4 * 1024;
/// The configuration key the space quota's refusals name (`limit` of ResourceExhausted).
pub const SPACE_LIMIT: &str = "data_bytes_max";

/// The quota scenario: 3 nodes that each ask for a space quota of [`QUOTA_BYTES`], the set
/// workload of [`QUOTA_PAYLOAD_BYTES`] elements filling it, and kills. The cluster takes
/// the quota through its log a few seconds after it starts; from then on an add past it is
/// refused with ResourceExhausted (a definite `fail`: the set checker must never see that
/// element), and the NOSPACE alarm refuses every add after. Every acknowledged add must
/// still be read at the end; the scenario fails unless the quota refused at least one add
/// ([`quota_shortfall`]) and unless no node exited by itself.
pub fn quota_scenario(seed: u64) -> Scenario {
    Scenario {
        name: "set-quota-kill".into(),
        workload: WorkloadKind::Set,
        nemesis: NemesisKind::Kill,
        nodes: 3,
        duration: Duration::from_secs(18),
        seed,
        broken: None,
        auth: false,
        rounds_max: None,
        quota_bytes: Some(QUOTA_BYTES),
        recover_from_lagging: false,
    }
}

/// The node flags of a scenario's quota: `--data-bytes-max N` (none without a quota).
pub fn quota_flags(scenario: &Scenario) -> Vec<String> {
    scenario
        .quota_bytes
        .map(|bytes| vec!["--data-bytes-max".to_owned(), bytes.to_string()])
        .unwrap_or_default()
}

/// Why a quota scenario tested nothing, if it did not: the quota of `quota_bytes` never
/// refused an add (`refused` adds of the history were refused by it), so the run never
/// reached it and only showed what every other set scenario shows.
pub fn quota_shortfall(quota_bytes: u64, refused: usize) -> Option<String> {
    (refused == 0).then(|| {
        format!(
            "the quota never refused an add (data_bytes_max = {quota_bytes} bytes): the \
             workload never reached it, so nothing near the quota was tested"
        )
    })
}

/// Seconds since the Unix epoch as `YYYY-MM-DDTHH-MM-SSZ` (UTC).
pub fn timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}-{:02}-{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The workspace this program was built from (its sources: `tests/compat/`, the git clone).
pub fn workspace_dir() -> Result<PathBuf, String> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| "no workspace directory".to_owned())
}

/// Locates (building it if needed) the `cairn` binary next to this program:
/// `cargo build -p cairn-cli --bin cairn` in the same profile, so that a
/// stale node is never tested.
pub fn cairn_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    let dir = exe
        .parent()
        .ok_or("the current exe has no directory")?
        .to_path_buf();
    let release = dir.file_name().is_some_and(|n| n == "release");
    let workspace = workspace_dir()?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = std::process::Command::new(cargo);
    command
        .current_dir(&workspace)
        .args(["build", "--quiet", "-p", "cairn-cli", "--bin", "cairn"]);
    if release {
        command.arg("--release");
    }
    println!(
        "building the node: cargo build -p cairn-cli --bin cairn{}",
        if release { " --release" } else { "" }
    );
    match command.status() {
        Ok(s) if s.success() => {}
        Ok(s) => return Err(format!("building cairn failed ({s})")),
        Err(e) => {
            eprintln!("jepsen: cannot run cargo ({e}); using the cairn binary next to this one")
        }
    }
    let binary = dir.join("cairn");
    if binary.is_file() {
        Ok(binary)
    } else {
        Err(format!("no cairn binary at {}", binary.display()))
    }
}

pub(crate) fn write_file(path: &Path, text: &str) {
    if let Err(e) = std::fs::write(path, text) {
        eprintln!("jepsen: cannot write {}: {e}", path.display());
    }
}

/// Runs one scenario; never panics on a cluster that misbehaves.
pub async fn run_scenario(scenario: &Scenario, env: &RunEnvironment) -> ScenarioResult {
    let started = Instant::now();
    let folder = env.results.join(&scenario.name);
    let mut result = ScenarioResult {
        scenario: scenario.clone(),
        status: Status::Passed,
        verdict: None,
        elapsed: Duration::ZERO,
        operations: 0,
        acknowledged_writes: 0,
        successful_reads: 0,
        faults: 0,
        quota_refusals: None,
        folder: folder.clone(),
    };
    if let Some(reason) = scenario.nemesis.unavailable_reason() {
        result.status = Status::Skipped(reason);
        return result;
    }
    if let Err(e) = std::fs::create_dir_all(&folder) {
        result.status = Status::Failed(format!("cannot create {}: {e}", folder.display()));
        return result;
    }
    let outcome = if scenario.auth {
        crate::scoped::run(scenario, env, &folder, &mut result).await
    } else if scenario.workload == WorkloadKind::Election {
        crate::election::run(scenario, env, &folder, &mut result).await
    } else if scenario.nemesis == NemesisKind::QuorumLoss {
        crate::recover::run(scenario, env, &folder, &mut result).await
    } else {
        run_scenario_inner(scenario, env, &folder, &mut result).await
    };
    result.elapsed = started.elapsed();
    if let Err(e) = outcome {
        result.status = Status::Failed(e);
    }
    if result.status == Status::Passed {
        // Keep the logs and histories, not the data dirs.
        if let Ok(entries) = std::fs::read_dir(&folder) {
            for e in entries.flatten() {
                if e.path().is_dir() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }
    result
}

async fn run_scenario_inner(
    scenario: &Scenario,
    env: &RunEnvironment,
    folder: &Path,
    result: &mut ScenarioResult,
) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(scenario.seed);
    let lab = if scenario.nemesis.needs_network() {
        Some(Arc::new(NetworkLab::new()?))
    } else {
        None
    };
    let mut options = ClusterOptions::new(&env.binary, scenario.nodes);
    options.root = Some(folder.to_path_buf());
    options.election_timeout_ms = 800;
    options.snapshot_log_entries = 500;
    options.network = lab.clone();
    options.powercut = scenario.nemesis == NemesisKind::PowerCut;
    options.live_clocks = scenario.nemesis.needs_live_clocks();
    if scenario.nemesis == NemesisKind::Compaction {
        options.extra_args.extend([
            "--history-changes-max".to_owned(),
            nemesis::COMPACTION_HISTORY_CHANGES.to_string(),
        ]);
    }
    // Power cuts as harsh as the disk model allows: unsynced writes torn sector by sector,
    // names lost unless their directory was synced.
    options.powercut_options = cairn_powercut_fs::PowerCutOptions {
        torn_writes_seed: Some(scenario.seed),
        strict_directories: true,
    };
    if scenario.nemesis.is_kill_loop() {
        // Large entries, a snapshot every 100 entries ([`nemesis::kill_loop`]).
        use nemesis::kill_loop;
        options.snapshot_log_entries = kill_loop::SNAPSHOT_LOG_ENTRIES;
        options.extra_args.extend([
            "--snapshot-log-bytes".to_owned(),
            kill_loop::SNAPSHOT_LOG_BYTES.to_string(),
            "--history-changes-max".to_owned(),
            kill_loop::HISTORY_CHANGES_MAX.to_string(),
        ]);
    }
    if scenario.nemesis == NemesisKind::OomKillLoop {
        options.memory_limit_bytes = Some(nemesis::kill_loop::MEMORY_LIMIT_BYTES);
    }
    options.extra_args.extend(quota_flags(scenario));
    options.die_with_parent = true;
    options.log_level = node_log_level();
    if let Some(mode) = scenario.broken {
        options.extra_args.extend(mode.flags());
    }
    let mut cluster = Cluster::try_start(options)?;
    let endpoints = cluster.endpoints();
    let first_leader = wait_leader(&cluster, Duration::from_secs(20)).await?;
    if scenario.workload == WorkloadKind::Lifecycle {
        // Status writes, finalizers and selectors need cluster version 0.2, which a fresh
        // cluster reaches within seconds.
        crate::election::wait_cluster_version(
            &cluster,
            crate::lifecycle::LIFECYCLE_CLUSTER_VERSION,
            Duration::from_secs(20),
        )
        .await?;
    }

    let mut workload_options = WorkloadOptions::new(scenario.workload, rng.random());
    if scenario.nodes >= 5 {
        workload_options.processes = 10;
    }
    if scenario.nemesis.is_kill_loop() {
        use nemesis::kill_loop;
        workload_options.payload_bytes = kill_loop::PAYLOAD_BYTES;
        workload_options.padded_elements_max = kill_loop::PADDED_ELEMENTS_MAX;
        workload_options.processes = if scenario.nodes >= 5 {
            kill_loop::PROCESSES + 2
        } else {
            kill_loop::PROCESSES
        };
    }
    if scenario.quota_bytes.is_some() {
        workload_options.payload_bytes = QUOTA_PAYLOAD_BYTES;
        workload_options.padded_elements_max = usize::MAX;
    }
    let lifetimes = workload::NodeLifetimes::new(cluster.lifetimes(), cluster.ids());
    let mut workload = Workload::start(workload_options, &endpoints, lifetimes);
    let mut cx = NemesisContext {
        cluster: &mut cluster,
        lab: lab.clone(),
        rng: StdRng::seed_from_u64(rng.random()),
        log: NemesisLog::new(Instant::now()),
        paused: Default::default(),
        skewed: Default::default(),
        voters: scenario.nodes,
        history: (scenario.workload == WorkloadKind::Set).then(|| nemesis::RecordedSet {
            recorder: workload.recorder.clone(),
            keys: (0..workload.options.keys)
                .map(|key| workload::key_name(WorkloadKind::Set, key))
                .collect(),
        }),
        restores: Default::default(),
        kill_loop: Default::default(),
        rounds_max: scenario.rounds_max,
        election: None,
    };
    cx.log.note(format!(
        "cluster of {} up, leader {first_leader}",
        scenario.nodes
    ));
    let nemesis_result = nemesis::run(scenario.nemesis, &mut cx, scenario.duration).await;
    // Before healing: it starts every node that is down, one that exited by itself too.
    let exited_under_faults = match scenario.quota_bytes {
        Some(_) => cx.cluster.check_all_running().err(),
        None => None,
    };
    let heal_result = nemesis::heal_all(&mut cx);
    let NemesisContext {
        log: mut nemesis_log,
        ..
    } = cx;
    workload.stop_processes().await;
    nemesis_log.note("workload stopped");
    result.faults = nemesis_log.faults;
    let mut failure: Option<String> = exited_under_faults;
    if let Err(e) = nemesis_result.and(heal_result) {
        failure.get_or_insert(format!("nemesis: {e}"));
    }
    if let Err(e) = nemesis::converge(&cluster, Duration::from_secs(40)).await {
        failure.get_or_insert(format!("the cluster did not converge after healing: {e}"));
    }
    nemesis_log.note("converged");

    // Final reads, through every node in turn.
    let all_endpoints = cluster.endpoints();
    let final_client = Client::new(
        &all_endpoints,
        ClientOptions {
            request_timeout: Duration::from_secs(5),
            ..ClientOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    if !workload
        .final_reads(&final_client, Duration::from_secs(30))
        .await
    {
        failure.get_or_insert("the final reads did not succeed within 30 s".into());
    }
    if scenario.quota_bytes.is_some() {
        if let Err(e) = cluster.check_all_running() {
            failure.get_or_insert(e);
        }
    }
    let mut report = String::new();
    let mut watch_final = None;
    // Watchers whose node is still in the cluster (membership changes remove some).
    let members_at_end: Vec<usize> = (0..endpoints.len())
        .filter(|i| all_endpoints.contains(&endpoints[*i]))
        .collect();
    if scenario.workload == WorkloadKind::Watch {
        match final_list(&final_client).await {
            Ok((state, revision)) => {
                // Let every watcher reach the last change they could see.
                let deadline = Instant::now() + Duration::from_secs(20);
                while workload.watchers_revision(&members_at_end)
                    < watch_check::revision_to_reach(&workload.watch_log.lock(), &state, revision)
                    && Instant::now() < deadline
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                watch_final = Some((state, revision));
            }
            Err(e) => {
                failure.get_or_insert(format!("final list failed: {e}"));
            }
        }
        workload.stop_watchers().await;
    }
    if scenario.workload == WorkloadKind::Lifecycle {
        // A few more progress points compared on the healed, quiet cluster.
        tokio::time::sleep(Duration::from_secs(2)).await;
        workload.stop_watchers().await;
    }
    nemesis_log.note("final reads done");
    write_file(
        &folder.join("nemesis.log"),
        &(nemesis_log.lines.join("\n") + "\n"),
    );

    let history = workload.recorder.history();
    result.operations = history.len();
    (result.acknowledged_writes, result.successful_reads) = work_done(&history);
    if let Some(short) = shortfall(scenario, &history, result.faults) {
        failure.get_or_insert(short);
    }
    if let Some(quota) = scenario.quota_bytes {
        let refused = workload::refused_adds(&history, SPACE_LIMIT);
        result.quota_refusals = Some(refused);
        let _ = writeln!(
            report,
            "quota: data_bytes_max = {quota} bytes; {} adds acknowledged, {refused} refused by it",
            result.acknowledged_writes
        );
        if let Some(short) = quota_shortfall(quota, refused) {
            failure.get_or_insert(short);
        }
    }
    let mut jsonl = Vec::new();
    if history.write_jsonl(&mut jsonl).is_ok() {
        let _ = std::fs::write(folder.join("history.jsonl"), &jsonl);
    }
    let verdict = match scenario.workload {
        WorkloadKind::Register => check_register(
            &history,
            &workload.eventual.history(),
            env.check_budget,
            folder,
            &mut report,
        )?,
        WorkloadKind::Set => check_set(&history, &mut report)?,
        WorkloadKind::Append => {
            let r = append::check(&history).map_err(|e| e.to_string())?;
            let _ = writeln!(report, "append checker: {:?}", r.verdict);
            for key in &r.keys {
                let _ = writeln!(
                    report,
                    "  key {}: {:?}, longest list {}, {} reads, {} acknowledged, {} indeterminate, anomalies {:?}",
                    key.key,
                    key.verdict,
                    key.longest_len,
                    key.reads,
                    key.acknowledged_appends,
                    key.indeterminate_appends,
                    key.anomalies.iter().take(10).collect::<Vec<_>>()
                );
            }
            r.verdict
        }
        WorkloadKind::Watch => {
            let log = workload.watch_log.lock().clone();
            // Saved for `check --model watch <folder>`.
            let last = watch_final
                .as_ref()
                .map(|(state, revision)| watch_check::WatchFinal {
                    state: state.clone(),
                    revision: *revision,
                    nodes: endpoints.len(),
                    members_at_end: members_at_end.clone(),
                });
            if let Err(e) = watch_check::save_run(folder, &log, last.as_ref()) {
                eprintln!("jepsen: {e}");
            }
            match &watch_final {
                Some((state, revision)) => {
                    let r = watch_check::check(
                        &log,
                        &history,
                        state,
                        *revision,
                        endpoints.len(),
                        &members_at_end,
                    );
                    let _ = writeln!(report, "watch checker: {:?}", r.verdict);
                    for line in r.summary.iter().chain(r.anomalies.iter().take(40)) {
                        let _ = writeln!(report, "  {line}");
                    }
                    r.verdict
                }
                None => Verdict::Unknown,
            }
        }
        WorkloadKind::Lifecycle => {
            let records = workload.lifecycle_log.lock().clone();
            crate::lifecycle::save_records(folder, &records);
            let r = crate::lifecycle::check::check(&history, &records);
            report.push_str(&crate::lifecycle::check::describe(&r, 40));
            if let Some(short) = crate::lifecycle::check::shortfall(&r.counts) {
                failure.get_or_insert(short);
            }
            r.verdict
        }
        WorkloadKind::Election => unreachable!("run_scenario runs it with crate::election::run"),
    };
    let counts = outcome_counts(&history);
    let _ = writeln!(report, "operations: {counts}");
    write_file(&folder.join("check.txt"), &report);
    result.verdict = Some(verdict);
    drop(cluster);
    drop(lab);
    match (verdict, failure) {
        (Verdict::Invalid, _) => Err(format!(
            "checker: INVALID (see {}/check.txt)",
            folder.display()
        )),
        (_, Some(f)) => Err(f),
        (Verdict::Unknown, None) => Err(format!(
            "checker: UNKNOWN (see {}/check.txt)",
            folder.display()
        )),
        (Verdict::Valid, None) => Ok(()),
    }
}

/// Checks a register workload's history (linearizable, within `budget`) and its eventual
/// reads (monotonic per node; written to `folder/eventual.jsonl`), and writes what each
/// checker found into `report`. The verdict combines both.
pub(crate) fn check_register(
    history: &crate::History,
    eventual: &crate::History,
    budget: Duration,
    folder: &Path,
    report: &mut String,
) -> Result<Verdict, String> {
    let options = CheckOptions {
        time_budget: budget,
        ..CheckOptions::default()
    };
    let r = models::check(history, ModelKind::Register, &options).map_err(|e| e.to_string())?;
    let _ = writeln!(
        report,
        "register checker: {:?} ({} keys, {:?})",
        r.verdict,
        r.keys.len(),
        r.elapsed
    );
    for key in &r.keys {
        let _ = writeln!(
            report,
            "  key {}: {} ops, {:?}",
            key.key,
            key.operation_count,
            short_outcome(&key.outcome)
        );
        if let KeyOutcome::NotLinearizable(prefix) = &key.outcome {
            let ops = history.operations();
            let _ = writeln!(
                report,
                "    cannot linearize #{}: {}",
                prefix.failing_operation, ops[prefix.failing_operation]
            );
            for i in prefix.prefix_operations.iter().rev().take(12).rev() {
                let _ = writeln!(report, "      #{i} {}", ops[*i]);
            }
        }
    }
    // Eventual reads: monotonic per node (checked offline with
    // `check --model monotonic eventual.jsonl`).
    let mut jsonl = Vec::new();
    if eventual.write_jsonl(&mut jsonl).is_ok() {
        let _ = std::fs::write(folder.join("eventual.jsonl"), &jsonl);
    }
    let m = monotonic::check(eventual).map_err(|e| e.to_string())?;
    let _ = writeln!(
        report,
        "monotonic-reads checker: {:?} ({} eventual reads on {} node/key pairs)",
        m.verdict, m.reads, m.series
    );
    for anomaly in m.anomalies.iter().take(20) {
        let _ = writeln!(report, "  {anomaly}");
    }
    Ok(r.verdict.combine(m.verdict))
}

/// Checks a set workload's history (no acknowledged element lost, none from nowhere) and
/// writes what the checker found into `report`.
pub(crate) fn check_set(history: &crate::History, report: &mut String) -> Result<Verdict, String> {
    let r = set::check(history).map_err(|e| e.to_string())?;
    let _ = writeln!(report, "set checker: {:?}", r.verdict);
    for fate in &r.restores {
        let _ = writeln!(report, "  {fate}");
    }
    for key in &r.keys {
        let _ = writeln!(
            report,
            "  key {}: {:?}, {} reads ({} stale), {} acknowledged, {} indeterminate ({} present), {} failed, anomalies {:?}",
            key.key,
            key.verdict,
            key.reads,
            key.stale_reads,
            key.acknowledged_elements,
            key.indeterminate_elements,
            key.indeterminate_elements_present,
            key.failed_elements,
            key.anomalies.iter().take(10).collect::<Vec<_>>()
        );
    }
    Ok(r.verdict)
}

fn short_outcome(outcome: &KeyOutcome) -> String {
    match outcome {
        KeyOutcome::Linearizable => "linearizable".into(),
        KeyOutcome::NotLinearizable(_) => "NOT linearizable".into(),
        KeyOutcome::Unknown(reason) => format!("unknown ({reason:?})"),
    }
}

pub(crate) fn outcome_counts(history: &crate::History) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for op in history.operations() {
        *counts
            .entry(format!("{} {}", op.op, op.outcome))
            .or_default() += 1;
    }
    counts
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) async fn wait_leader(cluster: &Cluster, timeout: Duration) -> Result<u64, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(l) = cluster.leader().await {
            return Ok(l);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "no leader within {timeout:?} (logs in the scenario folder)"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The watch workload's final state: a strong list of its type.
async fn final_list(client: &Client) -> Result<(BTreeMap<String, Stored>, u64), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client
            .list(
                workload::resource_type(WorkloadKind::Watch),
                Tenancy {
                    partition: "*".into(),
                    namespace: "*".into(),
                },
                "",
                Consistency::Strong,
            )
            .await
        {
            Ok(list) => {
                let state = list
                    .resources
                    .iter()
                    .map(|r| {
                        (
                            r.id.as_ref().map(|i| i.name.clone()).unwrap_or_default(),
                            Stored {
                                version: r.version.clone(),
                                value: workload::decode(r),
                            },
                        )
                    })
                    .collect();
                return Ok((state, list.revision));
            }
            Err(e) if Instant::now() > deadline => return Err(e.to_string()),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Runs a scenario as its own task, bounded by `bound`: a panic or a timeout
/// is a failure of that scenario (the task is dropped, which kills its nodes
/// and removes its namespaces and mounts), never of the whole run.
pub async fn run_bounded(
    scenario: Scenario,
    env: Arc<RunEnvironment>,
    bound: Duration,
) -> ScenarioResult {
    let folder = env.results.join(&scenario.name);
    let started = Instant::now();
    let task_scenario = scenario.clone();
    let status = match bounded(
        bound,
        async move { run_scenario(&task_scenario, &env).await },
    )
    .await
    {
        Ok(result) => return result,
        Err(why) => Status::Failed(why),
    };
    ScenarioResult {
        scenario,
        status,
        verdict: None,
        elapsed: started.elapsed(),
        operations: 0,
        acknowledged_writes: 0,
        successful_reads: 0,
        faults: 0,
        quota_refusals: None,
        folder,
    }
}

/// Runs `run` as its own task, bounded by `bound`: its output, or why there is none (it
/// panicked, or did not finish in time and was dropped, with whatever it owned: nodes,
/// namespaces, mounts).
pub async fn bounded<T: Send + 'static>(
    bound: Duration,
    run: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T, String> {
    let mut task = tokio::spawn(run);
    match tokio::time::timeout(bound, &mut task).await {
        Ok(Ok(output)) => Ok(output),
        Ok(Err(e)) if e.is_panic() => {
            let payload = e.into_panic();
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "a panic".into());
            Err(format!("panicked: {message}"))
        }
        Ok(Err(e)) => Err(format!("the scenario task failed: {e}")),
        Err(_) => {
            task.abort();
            let _ = task.await;
            Err(format!("did not finish within {bound:?}"))
        }
    }
}

/// Prints a scenario's result line.
pub fn print_result(r: &ScenarioResult) {
    match &r.status {
        Status::Passed => println!(
            "PASS {} ({:.1}s, {} ops: {} writes acknowledged, {} reads; {} faults{})",
            r.scenario.name,
            r.elapsed.as_secs_f64(),
            r.operations,
            r.acknowledged_writes,
            r.successful_reads,
            r.faults,
            quota_note(r)
        ),
        Status::Failed(why) => println!(
            "FAIL {} ({:.1}s, {} ops: {} writes acknowledged, {} reads; {} faults{}): {why}",
            r.scenario.name,
            r.elapsed.as_secs_f64(),
            r.operations,
            r.acknowledged_writes,
            r.successful_reads,
            r.faults,
            quota_note(r)
        ),
        Status::Skipped(why) => println!("SKIP {}: {why}", r.scenario.name),
    }
}

/// `; quota 1048576 bytes: 431 adds acknowledged, 610 refused` for a quota scenario that
/// got as far as its history; empty otherwise.
fn quota_note(r: &ScenarioResult) -> String {
    match (r.scenario.quota_bytes, r.quota_refusals) {
        (Some(quota), Some(refused)) => format!(
            "; quota {quota} bytes: {} adds acknowledged, {refused} refused",
            r.acknowledged_writes
        ),
        _ => String::new(),
    }
}

/// Writes `summary.txt` of a run.
pub fn write_summary(
    results_dir: &Path,
    command: &str,
    seed: u64,
    results: &[ScenarioResult],
    elapsed: Duration,
) {
    let mut text = String::new();
    let _ = writeln!(text, "command: {command}");
    let _ = writeln!(text, "seed: {seed}");
    let _ = writeln!(text, "elapsed: {:.1}s", elapsed.as_secs_f64());
    for r in results {
        let status = match &r.status {
            Status::Passed => "PASS".to_string(),
            Status::Failed(why) => format!("FAIL: {why}"),
            Status::Skipped(why) => format!("SKIP: {why}"),
        };
        let _ = writeln!(
            text,
            "{} workload={} nemesis={} nodes={} seed={} ops={} acknowledged_writes={} successful_reads={} faults={}{} elapsed={:.1}s verdict={:?} {status}",
            r.scenario.name,
            r.scenario.workload.name(),
            r.scenario.nemesis.name(),
            r.scenario.nodes,
            r.scenario.seed,
            r.operations,
            r.acknowledged_writes,
            r.successful_reads,
            r.faults,
            r.quota_refusals
                .map(|refused| format!(" quota_refusals={refused}"))
                .unwrap_or_default(),
            r.elapsed.as_secs_f64(),
            r.verdict
        );
    }
    let passed = results
        .iter()
        .filter(|r| r.status == Status::Passed)
        .count();
    let failed = results
        .iter()
        .filter(|r| matches!(r.status, Status::Failed(_)))
        .count();
    let skipped = results
        .iter()
        .filter(|r| matches!(r.status, Status::Skipped(_)))
        .count();
    let _ = writeln!(text, "{passed} passed, {failed} failed, {skipped} skipped");
    if failed > 0 {
        let _ = writeln!(
            text,
            "replay with: cargo run -p jepsen-tests --release -- {command} --seed {seed}"
        );
    }
    write_file(&results_dir.join("summary.txt"), &text);
}

/// The soak plan: scenario `i` of a 5-node soak (every nemesis in turn, a
/// random workload each; the watch workload with compaction; the kill loops with the set
/// workload of large entries, [`SOAK_KILL_LOOP_ROUNDS`] rounds, about 3 minutes).
pub fn soak_scenario(i: usize, seed: u64) -> Scenario {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(i as u64 * 104_729));
    let nemesis = NemesisKind::ALL[i % NemesisKind::ALL.len()];
    // Compaction breaks only what watches see; restores are modelled by the set
    // checker alone; the fencing nemesis needs the election's holder, and the election
    // workload runs with it alone; every other nemesis meets every other workload.
    let workload = match nemesis {
        NemesisKind::Compaction => WorkloadKind::Watch,
        NemesisKind::RestoreKill => WorkloadKind::Set,
        NemesisKind::Fencing => WorkloadKind::Election,
        _ => *WorkloadKind::ALL.choose(&mut rng).expect("workloads"),
    };
    if nemesis.is_kill_loop() {
        return Scenario {
            name: format!("{:03}-set-{}", i + 1, nemesis.name()),
            ..kill_loop_scenario(nemesis, 5, SOAK_KILL_LOOP_ROUNDS, rng.random())
        };
    }
    Scenario {
        name: format!("{:03}-{}-{}", i + 1, workload.name(), nemesis.name()),
        workload,
        nemesis,
        nodes: 5,
        duration: Duration::from_secs(30),
        seed: rng.random(),
        broken: None,
        auth: false,
        rounds_max: None,
        quota_bytes: None,
        recover_from_lagging: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{OpKind, Outcome, Recorder, Value};

    #[test]
    fn the_ci_suite_and_the_soak_run_every_nemesis() {
        let ci: Vec<NemesisKind> = ci_scenarios(1).iter().map(|s| s.nemesis).collect();
        let soak: Vec<NemesisKind> = (0..NemesisKind::ALL.len())
            .map(|i| soak_scenario(i, 1).nemesis)
            .collect();
        for kind in NemesisKind::ALL {
            assert!(
                ci.contains(&kind),
                "ci never runs the {} nemesis",
                kind.name()
            );
            assert!(soak.contains(&kind), "soak never runs {}", kind.name());
        }
        // Compaction breaks only what watches see: it always runs with the watch workload.
        for s in ci_scenarios(1).iter().chain(
            (0..18)
                .map(|i| soak_scenario(i, 1))
                .collect::<Vec<_>>()
                .iter(),
        ) {
            if s.nemesis == NemesisKind::Compaction {
                assert_eq!(s.workload, WorkloadKind::Watch, "{}", s.name);
            }
            // Only the set checker models a restore.
            if s.nemesis == NemesisKind::RestoreKill {
                assert_eq!(s.workload, WorkloadKind::Set, "{}", s.name);
            }
            // The election and its faults go together, and nowhere else.
            assert_eq!(
                s.nemesis == NemesisKind::Fencing,
                s.workload == WorkloadKind::Election,
                "{}",
                s.name
            );
            // The kill loops run the set workload of large entries, for a bounded number
            // of rounds.
            if s.nemesis.is_kill_loop() {
                assert_eq!(s.workload, WorkloadKind::Set, "{}", s.name);
                assert!(s.rounds_max.is_some(), "{}", s.name);
            } else {
                assert_eq!(s.rounds_max, None, "{}", s.name);
            }
            assert_eq!(s.broken, None, "{}", s.name);
        }
    }

    #[test]
    fn the_election_runs_in_ci_short_and_on_three_nodes() {
        let ci = ci_scenarios(1);
        let election = &ci[ci.len() - 2];
        assert_eq!(election.name, "17-election-fencing");
        assert_eq!(
            (election.workload, election.nemesis, election.nodes),
            (WorkloadKind::Election, NemesisKind::Fencing, 3)
        );
        // CI time is tight: about 23 s with the cluster's start, the heal and the check.
        assert!(election.duration <= Duration::from_secs(18));
        // Numbered in the order they run.
        for (i, s) in ci.iter().enumerate() {
            assert!(s.name.starts_with(&format!("{:02}-", i + 1)), "{}", s.name);
        }
    }

    #[test]
    fn the_recovery_from_a_lost_quorum_ends_ci_on_five_nodes_and_nowhere_else() {
        let ci = ci_scenarios(1);
        let recover = ci.last().expect("scenarios");
        assert_eq!(recover.name, "18-set-quorum-loss-recover");
        assert_eq!(
            (recover.workload, recover.nemesis, recover.nodes),
            (WorkloadKind::Set, NemesisKind::QuorumLoss, 5)
        );
        // CI time is tight: seconds of workload before the loss, then the recovery.
        assert!(recover.duration <= Duration::from_secs(10));
        // It recovers from the best survivor; only `ci --recover-from-lagging` says otherwise.
        let soak: Vec<Scenario> = (0..40).map(|i| soak_scenario(i, 1)).collect();
        for s in ci.iter().chain(&soak) {
            assert!(!s.recover_from_lagging, "{}", s.name);
            assert_eq!(
                s.nemesis == NemesisKind::QuorumLoss,
                s.name == recover.name,
                "{}",
                s.name
            );
        }
        assert!(!NemesisKind::ALL.contains(&NemesisKind::QuorumLoss));
    }

    #[test]
    fn the_lifecycle_runs_in_ci_under_kills_on_three_nodes_before_the_election() {
        let ci = ci_scenarios(1);
        let lifecycle: Vec<&Scenario> = ci
            .iter()
            .filter(|s| s.workload == WorkloadKind::Lifecycle)
            .collect();
        assert_eq!(lifecycle.len(), 1, "one lifecycle scenario in ci");
        let s = lifecycle[0];
        assert_eq!(s.name, "16-lifecycle-kill");
        assert_eq!((s.nemesis, s.nodes), (NemesisKind::Kill, 3));
        assert!(s.duration <= Duration::from_secs(18));
        assert_eq!(ci[ci.len() - 3].name, s.name);
        // The soak may pick it with any nemesis but those that need their own workload.
        assert!(WorkloadKind::ALL.contains(&WorkloadKind::Lifecycle));
    }

    #[test]
    fn only_the_quota_scenario_starts_its_nodes_with_a_quota() {
        let ci = ci_scenarios(1);
        let quota = ci
            .iter()
            .find(|s| s.quota_bytes.is_some())
            .expect("a quota scenario");
        assert_eq!(quota.name, "15-set-quota-kill");
        assert_eq!(
            (quota.workload, quota.nemesis, quota.nodes),
            (WorkloadKind::Set, NemesisKind::Kill, 3)
        );
        // The smallest quota a node accepts, so that the workload reaches it soon.
        assert_eq!(quota.quota_bytes, Some(1024 * 1024));
        assert_eq!(quota_flags(quota), ["--data-bytes-max", "1048576"]);
        // Every other scenario runs with the nodes' default quota.
        let others: Vec<Scenario> = ci
            .iter()
            .filter(|s| s.name != quota.name)
            .cloned()
            .chain((0..18).map(|i| soak_scenario(i, 1)))
            .chain(BrokenMode::ALL.map(|mode| mode.scenario(1, 1)))
            .collect();
        for s in &others {
            assert_eq!(s.quota_bytes, None, "{}", s.name);
            assert!(quota_flags(s).is_empty(), "{}", s.name);
        }
    }

    /// Adds of 1 and 2 acknowledged, 3 refused by the space quota, 4 by a tenant quota, 5
    /// failed otherwise; then a read listing `read`.
    fn quota_history(read: &[i64]) -> crate::History {
        let recorder = Recorder::new();
        for element in [1, 2] {
            recorder
                .invoke(0, OpKind::Add, "s", Value::Int(element))
                .ok(Value::Null);
        }
        recorder
            .invoke(0, OpKind::Add, "s", Value::Int(3))
            .complete(Outcome::Fail, workload::refusal_output(SPACE_LIMIT));
        recorder
            .invoke(0, OpKind::Add, "s", Value::Int(4))
            .complete(Outcome::Fail, workload::refusal_output("quota q bytes"));
        recorder.invoke(0, OpKind::Add, "s", Value::Int(5)).fail();
        recorder
            .invoke(1, OpKind::Read, "s", Value::Null)
            .ok(Value::List(read.iter().map(|&e| Value::Int(e)).collect()));
        recorder.history()
    }

    #[test]
    fn an_add_the_quota_refused_is_counted_and_is_a_definite_failure() {
        // Only the space quota's refusals count as the quota's.
        let history = quota_history(&[1, 2]);
        assert_eq!(workload::refused_adds(&history, SPACE_LIMIT), 1);
        assert_eq!(work_done(&history), (2, 1));
        // Refused is certainly not added: neither lost nor expected in a read...
        let report = set::check(&history).expect("a set history");
        assert_eq!(report.verdict, Verdict::Valid);
        let key = &report.keys[0];
        assert_eq!((key.acknowledged_elements, key.failed_elements), (2, 3));
        // ... and a read that lists it shows a refusal that applied after all.
        let report = set::check(&quota_history(&[1, 2, 3])).expect("a set history");
        assert_eq!(report.verdict, Verdict::Invalid);
        assert_eq!(
            report.keys[0].anomalies,
            vec![set::SetAnomaly::FailedButPresent {
                element: Value::Int(3),
                read: 5,
                add: 2
            }]
        );
    }

    #[test]
    fn a_quota_scenario_the_quota_never_refused_fails() {
        let why = quota_shortfall(QUOTA_BYTES, 0).expect("nothing refused");
        assert!(why.contains("the quota never refused"), "{why}");
        assert_eq!(quota_shortfall(QUOTA_BYTES, 1), None);
    }

    #[test]
    fn every_broken_mode_is_one_unsafe_flag_and_a_scenario_of_its_own() {
        let mut flags = std::collections::BTreeSet::new();
        for mode in BrokenMode::ALL {
            let f = mode.flags();
            assert!(f[0].starts_with("--unsafe-"), "{f:?}");
            assert!(flags.insert(f[0].clone()), "two modes share {}", f[0]);
            let s = mode.scenario(1, 7);
            assert_eq!(s.broken, Some(mode));
            assert_eq!((s.workload, s.nemesis), mode.plan());
            assert!(s.name.contains(mode.name()));
        }
    }

    /// A history of `writes` acknowledged adds and `reads` successful reads, plus failed
    /// and indeterminate operations that must not count.
    fn history(writes: usize, reads: usize) -> crate::History {
        let recorder = Recorder::new();
        for i in 0..writes {
            recorder
                .invoke(0, OpKind::Add, "s", Value::Int(i as i64))
                .ok(Value::Null);
        }
        for _ in 0..reads {
            recorder
                .invoke(1, OpKind::Read, "s", Value::Null)
                .ok(Value::Null);
        }
        recorder.invoke(2, OpKind::Add, "s", Value::Int(-1)).info();
        recorder.invoke(3, OpKind::Read, "s", Value::Null).fail();
        recorder.history()
    }

    #[test]
    fn a_scenario_that_did_too_little_fails_naming_what_it_lacked() {
        let scenario = ci_scenarios(1)
            .into_iter()
            .find(|s| s.workload == WorkloadKind::Set && s.nemesis == NemesisKind::PowerCut)
            .expect("a set power-cut scenario");
        let minimums = Minimums::of(WorkloadKind::Set, NemesisKind::PowerCut);
        let enough = history(minimums.acknowledged_writes, minimums.successful_reads);
        assert_eq!(
            work_done(&enough),
            (minimums.acknowledged_writes, minimums.successful_reads)
        );
        assert_eq!(shortfall(&scenario, &enough, minimums.faults), None);
        let few_writes = history(minimums.acknowledged_writes - 1, minimums.successful_reads);
        let why = shortfall(&scenario, &few_writes, minimums.faults).expect("too few writes");
        assert!(why.contains("acknowledged writes"), "{why}");
        let few_reads = history(minimums.acknowledged_writes, minimums.successful_reads - 1);
        let why = shortfall(&scenario, &few_reads, minimums.faults).expect("too few reads");
        assert!(why.contains("successful reads"), "{why}");
        let why = shortfall(&scenario, &enough, minimums.faults - 1).expect("too few faults");
        assert!(why.contains("faults"), "{why}");
    }
}
