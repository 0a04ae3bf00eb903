//! The recovery scenario (`18-set-quorum-loss-recover`): a five-node cluster under the set
//! workload loses three nodes for good; a new cluster recovered with `cairn recover` from the
//! most up-to-date survivor must keep every add acknowledged before the loss.
//!
//! **What it runs.** Five nodes, the set workload (10 processes, each through a home node).
//! After [`WARM_UP_MS`], a follower F is `SIGSTOP`ped: for [`LAG_MS`] the other four go on
//! acknowledging adds, so F's log falls behind. Then, with the workload still running and F
//! still stopped, three nodes are `kill -9`ed at once: every node but the leader L and F. The
//! cluster has lost its quorum. For [`IN_FLIGHT_MS`] more, the workload's adds reach a leader
//! that can no longer commit them; then L and F are `kill -9`ed too (a node that lost its
//! quorum cannot be stopped in any useful way: a kill is what such a loss looks like), and the
//! workload stops. The adds in flight at the loss end with an unknown outcome (`info`).
//!
//! Then, as an operator would: the real `cairn` binary on the survivors' data dirs.
//! 1. `cairn recover --data-dir F --data-dir L -o json` must name L's dir as the most up to
//!    date (the table form is run too, for `recover.log`).
//! 2. `cairn recover --data-dir F --data-dir L --members NEW --snapshot-out FILE -o json`
//!    replays L's whole log into FILE, moves L's dir aside and seeds a fresh one at its path
//!    for the new cluster NEW: three members with new ids ([`NEW_FIRST_ID`] on) and new
//!    ports, L's path serving the first of them.
//! 3. `cairn snapshot restore --offline FILE --data-dir DIR --members NEW` seeds the other two.
//! 4. The three start with `--members NEW` ([`ClusterOptions::data_dirs`] puts the first on
//!    L's path) and elect a leader.
//!
//! Through the new cluster: one more add, the *new write* (process [`NEW_WRITE_PROCESS`]),
//! then the final reads (a strong list per set key), recorded in the same history as the
//! workload's operations.
//!
//! **What must hold.** The set checker over the whole history: no acknowledged add lost, no
//! element from nowhere (an add in flight at the loss may be present or not: the recovery keeps
//! every entry L held, committed or not). The new write is acknowledged with a version above the
//! new cluster's first index (`new_log_index` of step 2) and above every version an add was
//! acknowledged with before the loss. The run fails too if it did not test the choice of
//! survivor (F's last entry must lie below L's commit index: F misses committed entries) or did
//! too little ([`crate::runner::Minimums`]).
//!
//! **Why the leader survives.** An acknowledged add is committed: stored by a majority, and
//! then by the leader (the leader of the latest term holds every committed entry). With 3 of 5
//! nodes lost, a committed entry may in general live on lost nodes only (3 of 5 nodes are a
//! majority), and no tool can bring it back. What `cairn recover` promises the operator is
//! narrower: the new cluster holds every entry the chosen survivor held, committed or not, and
//! the survivor chosen is the one with the most up-to-date log (Raft's order: last term, last
//! index, then what it knew committed). So the test keeps the leader among the survivors (then
//! one survivor holds every acknowledged add, and the promise can be checked against the
//! history), and makes the other survivor lag (then a wrong choice loses acknowledged adds).
//!
//! **Shown to fail without the choice.** `jepsen-tests ci --only 18 --recover-from-lagging`
//! ([`Scenario::recover_from_lagging`]) recovers from F alone (`cairn recover --data-dir F
//! --members NEW`), as an operator who recovered from the survivor at hand would: the set
//! checker must then report acknowledged adds lost (docs/testing.md has a run).
//!
//! **Files** (the scenario folder): `history.jsonl` (an acknowledged add's output is the version
//! it stored); `recover.log` (every step on the history's clock, each command with its output:
//! `|` its standard output, `!` its error output); `check.txt`; `node-1.log` … `node-5.log` (the
//! lost cluster) and `node-6.log` … `node-8.log` (the new one). The data dirs (L's moved-aside
//! one among them) and the recovered snapshot (`recovery/recovered.snap`) stay when the run
//! fails.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use cairn_client::{Client, ClientOptions};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom as _;
use rand::{Rng, SeedableRng};
use serde::Deserialize;

use crate::cluster::{Cluster, ClusterOptions};
use crate::history::{History, OpKind, Outcome, Value};
use crate::nemesis::NemesisLog;
use crate::runner::{self, RunEnvironment, Scenario, ScenarioResult};
use crate::workload::{self, NodeLifetimes, Workload, WorkloadKind, WorkloadOptions};
use crate::Verdict;

/// The workload's time on the whole cluster before a follower is paused.
pub const WARM_UP_MS: u64 = 3_000;
/// How long the paused follower falls behind while the four others acknowledge adds.
pub const LAG_MS: u64 = 3_000;
/// How long adds still reach the leader after three nodes are lost.
pub const IN_FLIGHT_MS: u64 = 1_000;
/// The workload's time before the loss ([`Scenario::duration`] of this scenario).
pub const BEFORE_LOSS: Duration = Duration::from_millis(WARM_UP_MS + LAG_MS + IN_FLIGHT_MS);
/// The new cluster's size.
pub const NEW_NODES: usize = 3;
/// The new cluster's first member id: new ids, so that its node logs stay apart from the lost
/// cluster's (ids 1 to 5) in the scenario folder.
pub const NEW_FIRST_ID: u64 = 6;
/// The process that records the new write (the workload's are 0 to 9; the final reads'
/// `u64::MAX`). Its element is `NEW_WRITE_PROCESS * 1_000_000 + attempt`, as every value.
pub const NEW_WRITE_PROCESS: u64 = 1_000_001;
/// The nodes' `--election-timeout-ms`, as in the other scenarios.
const ELECTION_TIMEOUT_MS: u64 = 800;
/// Each `cairn` command ends within this bound (they read and write a few MiB).
const COMMAND_BOUND: Duration = Duration::from_secs(60);

/// A survivor as `cairn recover -o json` describes it.
#[derive(Clone, Debug, Deserialize)]
pub struct Survivor {
    pub data_dir: PathBuf,
    pub node_id: Option<u64>,
    pub cluster_id: String,
    pub snapshot_index: u64,
    pub last_log_term: u64,
    pub last_log_index: u64,
    pub committed_index: u64,
}

impl Survivor {
    fn describe(&self) -> String {
        format!(
            "node {} ({}): last entry {} of term {}, committed {}, snapshot {}",
            self.node_id.map_or("?".to_owned(), |id| id.to_string()),
            self.data_dir.display(),
            self.last_log_index,
            self.last_log_term,
            self.committed_index,
            self.snapshot_index
        )
    }
}

/// `cairn recover --data-dir ... -o json` without `--members`: what it read.
#[derive(Clone, Debug, Deserialize)]
pub struct Inspection {
    pub survivors: Vec<Survivor>,
    pub most_up_to_date: PathBuf,
}

/// `cairn recover ... --members ... -o json`: what it recovered.
#[derive(Clone, Debug, Deserialize)]
pub struct Recovered {
    pub survivor: Survivor,
    pub snapshot: PathBuf,
    pub kept_aside: PathBuf,
    pub resources: u64,
    pub entries_replayed: u64,
    pub entries_past_commit: u64,
    pub new_cluster_id: String,
    pub new_log_index: u64,
}

/// Who survived the loss, and their data dirs.
struct Loss {
    leader: u64,
    lagging: u64,
    leader_dir: PathBuf,
    lagging_dir: PathBuf,
}

/// What the recovery left: the new cluster and what `cairn recover` said.
struct Recovery {
    cluster: Cluster,
    inspection: Inspection,
    recovered: Recovered,
}

/// The scenario (see the module docs). Writes its files into `folder`.
pub async fn run(
    scenario: &Scenario,
    env: &RunEnvironment,
    folder: &Path,
    result: &mut ScenarioResult,
) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(scenario.seed);
    let mut options = ClusterOptions::new(&env.binary, scenario.nodes);
    options.root = Some(folder.to_path_buf());
    options.election_timeout_ms = ELECTION_TIMEOUT_MS;
    // A snapshot every 500 entries: the survivors' logs start after a snapshot, so the replay
    // applies a snapshot and then the entries after it.
    options.snapshot_log_entries = 500;
    options.die_with_parent = true;
    options.log_level = runner::node_log_level();
    let mut old = Cluster::try_start(options.clone())?;
    let first_leader = runner::wait_leader(&old, Duration::from_secs(20)).await?;

    let mut workload_options = WorkloadOptions::new(WorkloadKind::Set, rng.random());
    workload_options.processes = 10;
    let lifetimes = NodeLifetimes::new(old.lifetimes(), old.ids());
    let mut workload = Workload::start(workload_options, &old.endpoints(), lifetimes);
    let mut log = NemesisLog::new(workload.recorder.started());
    log.note(format!(
        "cluster of {} up, leader {first_leader}; the set workload runs ({} processes)",
        scenario.nodes, workload.options.processes
    ));
    let mut failure: Option<String> = None;
    let loss = lose_quorum(&mut old, &mut rng, &mut log).await;
    workload.stop_processes().await;
    log.note("workload stopped");
    drop(old);
    let recovery = match loss {
        Ok(loss) => {
            recover(
                scenario,
                env,
                folder,
                &options,
                &loss,
                &mut log,
                &mut failure,
            )
            .await
        }
        Err(e) => Err(format!("losing the quorum: {e}")),
    };
    let mut report = String::new();
    match &recovery {
        Ok(recovery) => {
            if let Err(e) = after_recovery(recovery, &workload, &mut log, &mut report).await {
                failure.get_or_insert(e);
            }
        }
        Err(e) => {
            log.note(format!("FAILED: {e}"));
            failure.get_or_insert(e.clone());
        }
    }
    runner::write_file(&folder.join("recover.log"), &(log.lines.join("\n") + "\n"));

    let history = workload.recorder.history();
    let mut jsonl = Vec::new();
    if history.write_jsonl(&mut jsonl).is_ok() {
        let _ = std::fs::write(folder.join("history.jsonl"), &jsonl);
    }
    result.operations = history.len();
    result.faults = log.faults;
    (result.acknowledged_writes, result.successful_reads) = runner::work_done(&history);
    if let Some(short) = runner::shortfall(scenario, &history, result.faults) {
        failure.get_or_insert(short);
    }
    if let Ok(recovery) = &recovery {
        if let Err(e) = check_new_write(&history, &recovery.recovered, &mut report) {
            failure.get_or_insert(e);
        }
    }
    let verdict = runner::check_set(&history, &mut report)?;
    let _ = writeln!(report, "operations: {}", runner::outcome_counts(&history));
    runner::write_file(&folder.join("check.txt"), &report);
    result.verdict = Some(verdict);
    drop(recovery);
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

/// The loss, with the workload running: a follower paused so that it lags, then every node but
/// the leader and it killed at once, then those two.
async fn lose_quorum(
    old: &mut Cluster,
    rng: &mut StdRng,
    log: &mut NemesisLog,
) -> Result<Loss, String> {
    tokio::time::sleep(Duration::from_millis(WARM_UP_MS)).await;
    let ids = old.ids();
    let leader = leader_among(old, &ids, Duration::from_secs(10)).await?;
    let followers = old.ids_except(leader);
    let lagging = *followers
        .choose(rng)
        .expect("a 5-node cluster has followers");
    old.pause(lagging);
    log.faults += 1;
    log.note(format!(
        "SIGSTOP node {lagging} (a follower; the leader is {leader}): its log falls behind \
         while the four others acknowledge adds"
    ));
    tokio::time::sleep(Duration::from_millis(LAG_MS)).await;
    // The leader of now (the same one unless an election happened meanwhile) holds every
    // committed entry.
    let running = old.ids_except(lagging);
    let leader = leader_among(old, &running, Duration::from_secs(10)).await?;
    let lost: Vec<u64> = running.into_iter().filter(|id| *id != leader).collect();
    for id in &lost {
        old.kill(*id);
    }
    log.faults += 1;
    log.note(format!(
        "kill -9 nodes {lost:?} at once: the quorum is lost for good; the survivors are the \
         leader {leader} and the lagging node {lagging} (still stopped)"
    ));
    tokio::time::sleep(Duration::from_millis(IN_FLIGHT_MS)).await;
    old.kill(leader);
    old.kill(lagging);
    log.note(format!(
        "kill -9 the survivors {leader} and {lagging}: every node is down"
    ));
    Ok(Loss {
        leader,
        lagging,
        leader_dir: old.node(leader).data_dir.clone(),
        lagging_dir: old.node(lagging).data_dir.clone(),
    })
}

/// The node among `ids` that calls itself leader and that a majority of the cluster's nodes
/// name as leader (counting only the answers of `ids`), waited for up to `timeout`.
async fn leader_among(cluster: &Cluster, ids: &[u64], timeout: Duration) -> Result<u64, String> {
    let majority = cluster.nodes.len() / 2 + 1;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let mut named = Vec::new();
        let mut claims = Vec::new();
        for &id in ids {
            if let Some(s) = cluster.status(id).await {
                named.push(s.leader_id);
                if s.state == "leader" && s.leader_id == id {
                    claims.push(id);
                }
            }
        }
        if let Some(leader) = claims
            .into_iter()
            .find(|c| named.iter().filter(|n| *n == c).count() >= majority)
        {
            return Ok(leader);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("no leader among nodes {ids:?} within {timeout:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Steps 1 to 4 of the module docs: the survivors inspected, the recovery, the other new
/// members seeded, the new cluster started. A lagging node that missed no committed entry is
/// put in `failure` (the run did not test the choice), and the recovery goes on.
async fn recover(
    scenario: &Scenario,
    env: &RunEnvironment,
    folder: &Path,
    options: &ClusterOptions,
    loss: &Loss,
    log: &mut NemesisLog,
    failure: &mut Option<String>,
) -> Result<Recovery, String> {
    let (lagging_dir, leader_dir) = (loss.lagging_dir.clone(), loss.leader_dir.clone());
    let survivors = [path_text(&lagging_dir), path_text(&leader_dir)];
    let mut inspect: Vec<String> = vec!["recover".into()];
    for dir in &survivors {
        inspect.extend(["--data-dir".into(), dir.clone()]);
    }
    // 1. What each survivor holds.
    cairn(&env.binary, &inspect, log).await?;
    inspect.extend(["-o".into(), "json".into()]);
    let text = cairn(&env.binary, &inspect, log).await?;
    let inspection: Inspection = serde_json::from_str(&text)
        .map_err(|e| format!("`cairn recover -o json` answered what is no inspection: {e}"))?;
    let find = |dir: &Path| {
        inspection
            .survivors
            .iter()
            .find(|s| s.data_dir == dir)
            .cloned()
            .ok_or_else(|| format!("`cairn recover` did not describe {}", dir.display()))
    };
    let (lagging, leader) = (find(&lagging_dir)?, find(&leader_dir)?);
    log.note(format!("the leader's log: {}", leader.describe()));
    log.note(format!("the lagging node's log: {}", lagging.describe()));
    if inspection.most_up_to_date != leader_dir {
        return Err(format!(
            "`cairn recover` named {} as the most up-to-date survivor, not the leader's data dir {}",
            inspection.most_up_to_date.display(),
            leader_dir.display()
        ));
    }
    for (survivor, id) in [(&leader, loss.leader), (&lagging, loss.lagging)] {
        if survivor.node_id.is_some_and(|recorded| recorded != id) {
            return Err(format!(
                "`cairn recover` says {} is node {:?}'s, not node {id}'s",
                survivor.data_dir.display(),
                survivor.node_id
            ));
        }
    }
    if lagging.last_log_index >= leader.committed_index {
        failure.get_or_insert(format!(
            "the choice of survivor was not tested: the lagging node held every entry the \
             leader knew committed (its last entry {}, the leader's commit index {})",
            lagging.last_log_index, leader.committed_index
        ));
    }
    log.note(format!(
        "`cairn recover` names the leader's dir the most up to date; the lagging node misses \
         {} of the entries the leader knew committed",
        leader
            .committed_index
            .saturating_sub(lagging.last_log_index)
    ));

    // 2. The recovery, into the first new member's data dir (the chosen survivor's path).
    let (chosen_dir, from) = if scenario.recover_from_lagging {
        log.note(
            "--recover-from-lagging: recovering from the lagging node alone (this run must \
             FAIL: acknowledged adds lost)",
        );
        (lagging_dir.clone(), vec![path_text(&lagging_dir)])
    } else {
        (leader_dir.clone(), survivors.to_vec())
    };
    let mut new_options = options.clone();
    new_options.nodes = NEW_NODES;
    new_options.first_id = NEW_FIRST_ID;
    new_options.started_later = (NEW_FIRST_ID..).take(NEW_NODES).collect();
    new_options
        .data_dirs
        .insert(NEW_FIRST_ID, chosen_dir.clone());
    let mut cluster = Cluster::try_start(new_options)?;
    let members = cluster.bootstrap_members().to_owned();
    log.note(format!(
        "the new cluster: nodes {:?}, node {NEW_FIRST_ID} on {}: --members {members}",
        cluster.ids(),
        chosen_dir.display()
    ));
    let recovery_dir = folder.join("recovery");
    std::fs::create_dir_all(&recovery_dir)
        .map_err(|e| format!("cannot create {}: {e}", recovery_dir.display()))?;
    let snapshot = path_text(&recovery_dir.join("recovered.snap"));
    let mut args: Vec<String> = vec!["recover".into()];
    for dir in from {
        args.extend(["--data-dir".into(), dir]);
    }
    args.extend([
        "--members".into(),
        members.clone(),
        "--snapshot-out".into(),
        snapshot.clone(),
        "-o".into(),
        "json".into(),
    ]);
    let text = cairn(&env.binary, &args, log).await?;
    let recovered: Recovered = serde_json::from_str(&text)
        .map_err(|e| format!("`cairn recover --members` answered what is no recovery: {e}"))?;
    if recovered.survivor.data_dir != chosen_dir {
        return Err(format!(
            "`cairn recover` recovered from {}, not from {}",
            recovered.survivor.data_dir.display(),
            chosen_dir.display()
        ));
    }
    log.note(format!(
        "recovered {} resources from {} ({} entries replayed after its snapshot, {} of them past \
         the commit index it knew); kept aside: {}; new cluster {} from index {}",
        recovered.resources,
        recovered.survivor.describe(),
        recovered.entries_replayed,
        recovered.entries_past_commit,
        recovered.kept_aside.display(),
        recovered.new_cluster_id,
        recovered.new_log_index
    ));

    // 3. The other new members, seeded from the same file.
    for id in cluster.ids().into_iter().skip(1) {
        let dir = path_text(&cluster.node(id).data_dir);
        let args: Vec<String> = [
            "snapshot",
            "restore",
            "--offline",
            &snapshot,
            "--data-dir",
            &dir,
            "--members",
            &members,
        ]
        .map(str::to_owned)
        .to_vec();
        cairn(&env.binary, &args, log).await?;
    }

    // 4. The new cluster.
    for id in cluster.ids() {
        cluster.spawn(id);
    }
    let leader = runner::wait_leader(&cluster, Duration::from_secs(30)).await?;
    log.note(format!(
        "the new cluster of {NEW_NODES} is up, leader {leader}"
    ));
    Ok(Recovery {
        cluster,
        inspection,
        recovered,
    })
}

fn path_text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// Through the new cluster: the new write (retried with a new element until one is
/// acknowledged, for up to 20 s), then the final reads, both recorded in the workload's history.
async fn after_recovery(
    recovery: &Recovery,
    workload: &Workload,
    log: &mut NemesisLog,
    report: &mut String,
) -> Result<(), String> {
    let client = Client::new(
        &recovery.cluster.endpoints(),
        ClientOptions {
            request_timeout: Duration::from_secs(5),
            ..ClientOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let key = workload::key_name(WorkloadKind::Set, 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut added = None;
    for attempt in 1.. {
        let element = Value::Int(NEW_WRITE_PROCESS as i64 * 1_000_000 + attempt);
        added = workload::set_add(
            &client,
            &workload.recorder,
            NEW_WRITE_PROCESS,
            &key,
            &element,
            None,
        )
        .await;
        if added.is_some() || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let Some(added) = added else {
        return Err("the new cluster acknowledged no write within 20 s".into());
    };
    log.note(format!(
        "the new write {} acknowledged at version {}",
        added.name, added.version
    ));
    let read = workload.final_reads(&client, Duration::from_secs(30)).await;
    log.note("final reads done");
    let _ = writeln!(
        report,
        "recovery: the survivors {}; recovered from {} ({} resources, {} entries replayed, {} \
         past its commit index); the new cluster starts at index {}",
        recovery
            .inspection
            .survivors
            .iter()
            .map(Survivor::describe)
            .collect::<Vec<_>>()
            .join("; "),
        recovery.recovered.survivor.data_dir.display(),
        recovery.recovered.resources,
        recovery.recovered.entries_replayed,
        recovery.recovered.entries_past_commit,
        recovery.recovered.new_log_index
    );
    if !read {
        return Err("the final reads did not succeed within 30 s".into());
    }
    Ok(())
}

/// The version each acknowledged add of `history` stored, by process.
fn acknowledged_versions(history: &History) -> Vec<(u64, u64)> {
    history
        .operations()
        .iter()
        .filter(|op| op.op == OpKind::Add && op.outcome == Outcome::Ok)
        .filter_map(|op| match &op.output {
            Value::Str(version) => version.parse().ok().map(|v| (op.process, v)),
            _ => None,
        })
        .collect()
}

/// The new write is acknowledged, at a version above the new cluster's first index and above
/// every version an add was acknowledged with before the loss.
fn check_new_write(
    history: &History,
    recovered: &Recovered,
    report: &mut String,
) -> Result<(), String> {
    let versions = acknowledged_versions(history);
    let before_loss_max = versions
        .iter()
        .filter(|(process, _)| *process != NEW_WRITE_PROCESS)
        .map(|(_, v)| *v)
        .max()
        .unwrap_or(0);
    let Some(new_version) = versions
        .iter()
        .filter(|(process, _)| *process == NEW_WRITE_PROCESS)
        .map(|(_, v)| *v)
        .max()
    else {
        return Err("no new write was acknowledged after the recovery".into());
    };
    let _ = writeln!(
        report,
        "new write: version {new_version}; the highest version acknowledged before the loss {}; \
         the new cluster's first index {}",
        before_loss_max, recovered.new_log_index
    );
    if new_version <= before_loss_max || new_version <= recovered.new_log_index {
        return Err(format!(
            "the new write got version {new_version}, not above both the highest version \
             acknowledged before the loss ({before_loss_max}) and the new cluster's first index \
             ({})",
            recovered.new_log_index
        ));
    }
    Ok(())
}

/// Runs `cairn ARGS` to its end (bounded), noting the command and its output in `log`; its
/// standard output, or why it failed.
async fn cairn(binary: &Path, args: &[String], log: &mut NemesisLog) -> Result<String, String> {
    let command = format!("cairn {}", args.join(" "));
    log.note(format!("$ {command}"));
    let child = tokio::process::Command::new(binary)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    let output = tokio::time::timeout(COMMAND_BOUND, child.wait_with_output())
        .await
        .map_err(|_| format!("`{command}` did not end within {COMMAND_BOUND:?}"))?
        .map_err(|e| format!("`{command}`: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    for line in stdout.lines() {
        log.lines.push(format!("          | {line}"));
    }
    for line in stderr.lines() {
        log.lines.push(format!("          ! {line}"));
    }
    if !output.status.success() {
        let why = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(format!("`{command}` failed ({}): {why}", output.status));
    }
    Ok(stdout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Recorder;

    fn recovered() -> Recovered {
        let survivor = Survivor {
            data_dir: "node-3".into(),
            node_id: Some(3),
            cluster_id: "c".into(),
            snapshot_index: 500,
            last_log_term: 2,
            last_log_index: 900,
            committed_index: 890,
        };
        Recovered {
            survivor,
            snapshot: "recovered.snap".into(),
            kept_aside: "node-3.before-recover-1".into(),
            resources: 800,
            entries_replayed: 400,
            entries_past_commit: 10,
            new_cluster_id: "d".into(),
            new_log_index: 1_000_000_900,
        }
    }

    /// Adds acknowledged at `old` versions by a workload process, then the new write's at `new`.
    fn history(old: &[u64], new: Option<u64>) -> History {
        let recorder = Recorder::new();
        for (i, v) in old.iter().enumerate() {
            recorder
                .invoke(0, OpKind::Add, "set00-", Value::Int(i as i64))
                .ok(Value::Str(v.to_string()));
        }
        // An add in flight at the loss has no version.
        recorder
            .invoke(1, OpKind::Add, "set00-", Value::Int(99))
            .info();
        if let Some(v) = new {
            recorder
                .invoke(NEW_WRITE_PROCESS, OpKind::Add, "set00-", Value::Int(7))
                .ok(Value::Str(v.to_string()));
        }
        recorder.history()
    }

    #[test]
    fn the_new_write_must_come_above_every_old_version_and_the_new_first_index() {
        let mut report = String::new();
        let r = recovered();
        assert_eq!(
            check_new_write(&history(&[5, 900], Some(1_000_000_902)), &r, &mut report),
            Ok(())
        );
        // Below the new cluster's first index: the bump did not happen.
        let e = check_new_write(&history(&[5, 900], Some(902)), &r, &mut report)
            .expect_err("below the first index");
        assert!(e.contains("first index"), "{e}");
        // Not above a version the lost cluster handed out.
        let e = check_new_write(
            &history(&[5, 2_000_000_000], Some(1_000_000_902)),
            &r,
            &mut report,
        )
        .expect_err("below an old version");
        assert!(e.contains("before the loss (2000000000)"), "{e}");
        let e = check_new_write(&history(&[5], None), &r, &mut report).expect_err("no new write");
        assert!(e.contains("no new write"), "{e}");
    }

    #[test]
    fn the_json_of_cairn_recover_is_read() {
        let inspection: Inspection = serde_json::from_str(
            r#"{"survivors":[{"data_dir":"/r/node-2","node_id":2,"cluster_id":"c","snapshot_index":0,
                "last_log_term":1,"last_log_index":40,"committed_index":40},
               {"data_dir":"/r/node-4","node_id":null,"cluster_id":"c","snapshot_index":500,
                "last_log_term":1,"last_log_index":900,"committed_index":890}],
               "most_up_to_date":"/r/node-4"}"#,
        )
        .expect("an inspection");
        assert_eq!(inspection.most_up_to_date, PathBuf::from("/r/node-4"));
        assert_eq!(inspection.survivors[1].committed_index, 890);
        assert_eq!(inspection.survivors[1].node_id, None);
    }
}
