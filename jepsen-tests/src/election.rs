//! The election scenario: leases, one election and fencing tokens under faults.
//!
//! **What it runs.** Four candidates ([`workload`]) campaign for one election (the resource
//! `jepsen/v1/Election` named `leader`) through different home nodes, each talking to its
//! home node alone. A candidate grants a lease of [`TTL_MS`] and keeps it alive (a
//! keep-alive every TTL/3 on one stream), creates the election resource attached to the
//! lease (create-only: the version it gets is its *token*), and while it holds writes every
//! 20–60 ms under `fence = {election, token}`, each write a resource of its own whose version
//! is the revision it applied at. A candidate that finds the election held polls it with
//! strong reads until it is gone. After 0.6–1.8 s a holder's tenure ends, in turn: a
//! **pause** (everything stops, keep-alives included, for the TTL plus 1–2.5 s: the
//! in-process stand-in for a SIGSTOP of the holder's own process, which the harness cannot
//! send to a task; then one more fenced write with the old token, before the holder learns it
//! lost), a **resign** (a fenced delete of the election at its version), **stop renewing**
//! (writes go on until the fence refuses one) or a **revoke** of the lease. One watcher per
//! node watches the election resource. The faults ([`crate::nemesis::fencing`]) isolate the
//! holder's node or the leader, SIGSTOP a node past the TTL, jump the leader's wall clock by
//! minutes, kill nodes and move the leader.
//!
//! **What is checked** ([`check`]): one holder per token and fenced writes inside their
//! token's tenure (1); no stale holder's write accepted, the post-pause writes above all (2);
//! a stopped lease's resource gone within its TTL, an election and a slack (3); no lease
//! ending before a TTL has passed since an acknowledged renewal was sent (4). The run fails
//! too if it did too little to test these ([`shortfall`]).
//!
//! **Files** (the scenario folder): `history.jsonl` (the candidates' operations, see
//! [`crate::history`] for the election kinds), `watch.jsonl` (the watchers' events),
//! `faults.jsonl` (the nemesis's fault windows), `election.json` ([`RunRecord`]: the timing
//! and the final state), `nemesis.log` (its times on the history's clock), `check.txt`.
//! `jepsen-tests check --model election DIR` checks them again ([`load_run`]).
//!
//! Invariants: every record of a run (operations, watch events, fault windows) is stamped
//! with one clock, the history recorder's; the checker decides from the files alone.

pub mod check;
pub mod workload;

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cairn_client::{Client, ClientOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::cluster::{Cluster, ClusterOptions};
use crate::history::History;
use crate::nemesis::{self, fencing, NemesisContext, NemesisLog};
use crate::net::NetworkLab;
use crate::runner::{self, RunEnvironment, Scenario, ScenarioResult};
use crate::workload::WatchRecord;
use crate::{Error, Verdict};

use check::{Counts, FaultWindow, FinalState, Timing};
use workload::{ElectionOptions, ElectionWorkload};

/// The candidates' lease TTL: long enough for a keep-alive round trip under load, short
/// enough that a 16 s run sees several holders.
pub const TTL_MS: u64 = 1_500;
/// The nodes' `--election-timeout-ms` in this scenario.
pub const ELECTION_TIMEOUT_MS: u64 = 800;

/// The cluster version that enables leases and fences.
const LEASES_CLUSTER_VERSION: &str = "0.2";

/// Waits until every node reports the cluster version `version` (the lifecycle workload
/// waits for it too, in the runner).
pub(crate) async fn wait_cluster_version(
    cluster: &Cluster,
    version: &str,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let mut reported = Vec::new();
        for id in cluster.ids() {
            reported.push(cluster.status(id).await.map(|s| s.cluster_version));
        }
        if reported.iter().all(|v| v.as_deref() == Some(version)) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "the cluster did not reach version {version} within {timeout:?}: {reported:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What `election.json` holds: the timing the checker used and what the run read at the end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub timing: Timing,
    pub final_state: FinalState,
}

const HISTORY_FILE: &str = "history.jsonl";
const WATCH_FILE: &str = "watch.jsonl";
const FAULTS_FILE: &str = "faults.jsonl";
const RUN_FILE: &str = "election.json";

/// Why a run did too little to have tested the election, if it did: fewer than two tokens
/// (the election never changed hands), no post-pause write, no stopped lease judged by
/// check 3, no renewal compared by check 4.
pub fn shortfall(counts: &Counts) -> Option<String> {
    let mut short = Vec::new();
    if counts.tokens < 2 {
        short.push(format!(
            "{} tokens won (at least 2 required)",
            counts.tokens
        ));
    }
    if counts.stale_writes == 0 {
        short.push("no write after a pause".to_owned());
    }
    if counts.stops_judged == 0 {
        short.push("no stopped lease judged".to_owned());
    }
    if counts.renewals_compared == 0 {
        short.push("no renewal compared with the end of its lease".to_owned());
    }
    (!short.is_empty()).then(|| format!("too little election to count: {}", short.join(", ")))
}

fn write_lines<T: Serialize>(path: &Path, records: &[T]) {
    let mut text = String::new();
    for record in records {
        // Records of plain strings, integers and values always serialize.
        text.push_str(&serde_json::to_string(record).unwrap_or_default());
        text.push('\n');
    }
    runner::write_file(path, &text);
}

fn read_lines<T: serde::de::DeserializeOwned>(folder: &Path, name: &str) -> Result<Vec<T>, Error> {
    let path = folder.join(name);
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Open {
        path: path.clone(),
        source,
    })?;
    let mut records = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        records.push(serde_json::from_str(line).map_err(|e| Error::Parse {
            line: index + 1,
            reason: format!("{name}: {e}"),
        })?);
    }
    Ok(records)
}

/// Everything `check --model election DIR` needs from a run's folder.
pub struct LoadedRun {
    pub history: History,
    pub watch: Vec<WatchRecord>,
    pub faults: Vec<FaultWindow>,
    pub record: RunRecord,
}

/// Loads what [`run`] wrote into `folder`; malformed input is an error naming the file and line.
pub fn load_run(folder: &Path) -> Result<LoadedRun, Error> {
    let history_path = folder.join(HISTORY_FILE);
    let text = std::fs::read_to_string(&history_path).map_err(|source| Error::Open {
        path: history_path,
        source,
    })?;
    let history = History::from_jsonl_str(&text)?;
    let watch = read_lines(folder, WATCH_FILE)?;
    let faults = read_lines(folder, FAULTS_FILE)?;
    let path = folder.join(RUN_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Open { path, source })?;
    let record = serde_json::from_str(&text).map_err(|e| Error::Parse {
        line: e.line(),
        reason: format!("{RUN_FILE}: {e}"),
    })?;
    Ok(LoadedRun {
        history,
        watch,
        faults,
        record,
    })
}

/// The checker's report as text (`check.txt`, and `check --model election`).
pub fn describe(report: &check::Report, shown_max: usize) -> String {
    crate::findings::describe_checks(
        &format!("election checker: {:?}", report.verdict),
        "",
        report
            .checks
            .iter()
            .map(|(name, f)| crate::findings::CheckText {
                name,
                summary: &f.summary,
                anomalies: &f.anomalies,
            }),
        shown_max,
    )
}

/// The scenario (see the module docs). Writes its files into `folder`.
pub async fn run(
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
    options.election_timeout_ms = ELECTION_TIMEOUT_MS;
    options.snapshot_log_entries = 500;
    options.network = lab.clone();
    options.live_clocks = true;
    options.die_with_parent = true;
    options.log_level = runner::node_log_level();
    if let Some(mode) = scenario.broken {
        options.extra_args.extend(mode.flags());
    }
    let mut cluster = Cluster::try_start(options)?;
    let endpoints = cluster.endpoints();
    let first_leader = runner::wait_leader(&cluster, Duration::from_secs(20)).await?;
    // A new cluster raises itself to the version that has leases within seconds: the
    // candidates start then, not refused for the first seconds of the run.
    wait_cluster_version(&cluster, LEASES_CLUSTER_VERSION, Duration::from_secs(20)).await?;

    let mut election_options = ElectionOptions::new(rng.random());
    if scenario.nodes >= 5 {
        election_options.candidates = 6;
    }
    let ttl = Duration::from_millis(election_options.ttl_ms);
    let mut workload = ElectionWorkload::start(election_options, &endpoints, &cluster.ids());
    let link = fencing::ElectionLink {
        holder: workload.holder.clone(),
        recorder: workload.recorder.clone(),
        faults: Default::default(),
        ttl,
        first_variant: rng.random_range(0..fencing::VARIANTS.len()),
    };
    let mut cx = NemesisContext {
        cluster: &mut cluster,
        lab: lab.clone(),
        rng: StdRng::seed_from_u64(rng.random()),
        // The history's clock: nemesis.log's times are the history's.
        log: NemesisLog::new(workload.recorder.started()),
        paused: Default::default(),
        skewed: Default::default(),
        voters: scenario.nodes,
        history: None,
        restores: Default::default(),
        kill_loop: Default::default(),
        rounds_max: scenario.rounds_max,
        election: Some(link.clone()),
    };
    cx.log.note(format!(
        "cluster of {} up, leader {first_leader}",
        scenario.nodes
    ));
    let nemesis_result = nemesis::run(scenario.nemesis, &mut cx, scenario.duration).await;
    let heal_result = nemesis::heal_all(&mut cx);
    let NemesisContext {
        log: mut nemesis_log,
        ..
    } = cx;
    workload.stop_candidates().await;
    nemesis_log.note("candidates stopped");
    result.faults = nemesis_log.faults;
    let mut failure: Option<String> = None;
    if let Err(e) = nemesis_result.and(heal_result) {
        failure.get_or_insert(format!("nemesis: {e}"));
    }
    if let Err(e) = nemesis::converge(&cluster, Duration::from_secs(40)).await {
        failure.get_or_insert(format!("the cluster did not converge after healing: {e}"));
    }
    nemesis_log.note("converged");

    // Final reads, through every node in turn: the election, then every fenced write stored.
    let final_client = Client::new(
        &cluster.endpoints(),
        ClientOptions {
            request_timeout: Duration::from_secs(5),
            ..ClientOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let observed_until_ns = match workload
        .final_read(&final_client, Duration::from_secs(30))
        .await
    {
        Some(at) => at,
        None => {
            failure.get_or_insert("the final read did not succeed within 30 s".into());
            workload.recorder.now_ns()
        }
    };
    let mut final_state = FinalState {
        observed_until_ns,
        ..FinalState::default()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match workload::stored_writes(&final_client).await {
            Ok((writes, revision)) => {
                final_state.writes = writes;
                final_state.revision = revision;
                break;
            }
            Err(e) if tokio::time::Instant::now() > deadline => {
                failure.get_or_insert(format!("the final list failed: {e}"));
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    workload.stop_watchers().await;
    nemesis_log.note("final reads done");
    runner::write_file(
        &folder.join("nemesis.log"),
        &(nemesis_log.lines.join("\n") + "\n"),
    );

    let history = workload.recorder.history();
    let watch = workload.watch_log.lock().clone();
    let faults = link.faults.lock().clone();
    let record = RunRecord {
        timing: Timing::of_cluster(ELECTION_TIMEOUT_MS),
        final_state,
    };
    let mut jsonl = Vec::new();
    if history.write_jsonl(&mut jsonl).is_ok() {
        let _ = std::fs::write(folder.join(HISTORY_FILE), &jsonl);
    }
    write_lines(&folder.join(WATCH_FILE), &watch);
    write_lines(&folder.join(FAULTS_FILE), &faults);
    runner::write_file(
        &folder.join(RUN_FILE),
        &(serde_json::to_string_pretty(&record).unwrap_or_default() + "\n"),
    );

    result.operations = history.len();
    (result.acknowledged_writes, result.successful_reads) = runner::work_done(&history);
    if let Some(short) = runner::shortfall(scenario, &history, result.faults) {
        failure.get_or_insert(short);
    }
    let report = check::check(
        &history,
        &watch,
        &faults,
        &record.final_state,
        &record.timing,
    );
    if let Some(short) = shortfall(&report.counts) {
        failure.get_or_insert(short);
    }
    let mut text = describe(&report, 40);
    let _ = writeln!(text, "operations: {}", runner::outcome_counts(&history));
    runner::write_file(&folder.join("check.txt"), &text);
    result.verdict = Some(report.verdict);
    drop(cluster);
    drop(lab);
    match (report.verdict, failure) {
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
