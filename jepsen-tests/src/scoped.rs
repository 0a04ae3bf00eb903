//! The set workload under authentication: two tokens whose grants are
//! disjoint (`write` on `jepsen.*` in `scope-a/*`, and in `scope-b/*`) run
//! the set workload side by side on the same resource names, while the
//! nemesis partitions the network, kills nodes and moves the leader.
//!
//! What is checked, besides the set checker on each token's own history:
//! - no list a token makes (strong, across `*/*`, on any node, through any
//!   follower's forwarding hop) returns a resource outside its scope;
//! - no watch a token holds (one per node per token, opened before the first
//!   write, reopened after every break) delivers an event outside its scope;
//! - a read or a list aimed at the other scope is refused with
//!   PERMISSION_DENIED, never answered (not even with NOT_FOUND);
//! - the checks saw something: each token read elements and watched events.
//!
//! Both tokens write the same names, so a leak would also show up in the set
//! checker as elements no process of that token ever added.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_client::v1::{watch_event, Consistency, Id, Resource, Tenancy, WatchListRequest};
use cairn_client::{watch_resume_revision, BearerToken, Client, ClientError, ClientOptions};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cluster::{Cluster, ClusterOptions};
use crate::history::{OpKind, Recorder, Value};
use crate::nemesis::{self, NemesisContext, NemesisKind, NemesisLog};
use crate::net::NetworkLab;
use crate::runner::{RunEnvironment, Scenario, ScenarioResult};
use crate::workload::{self, WorkloadKind, WorkloadOptions};
use crate::{set, Verdict};

/// The partitions of the two scopes (every namespace of each).
pub const SCOPES: [&str; 2] = ["scope-a", "scope-b"];

/// Keys (name prefixes) per scope.
const KEYS: usize = 2;

/// The faults of the scenario, in turn.
pub const NEMESES: [NemesisKind; 3] = [
    NemesisKind::Partition,
    NemesisKind::Kill,
    NemesisKind::LeaderTransfer,
];

/// The tokens and the config file of an authenticated cluster.
pub struct AuthSetup {
    pub config: PathBuf,
    /// `admin = true` only: the harness's and the nodes' own token.
    pub admin_token: String,
    /// The token of each scope, in the order of [`SCOPES`].
    pub tokens: [String; 2],
}

/// `cairn token new`: the token and its `token_sha256 = "..."` line.
fn new_token(binary: &Path) -> Result<(String, String), String> {
    let output = std::process::Command::new(binary)
        .args(["token", "new"])
        .output()
        .map_err(|e| format!("cannot run {} token new: {e}", binary.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut lines = stdout.lines();
    match (output.status.success(), lines.next(), lines.next()) {
        (true, Some(token), Some(hash)) if hash.starts_with("token_sha256") => {
            Ok((token.to_string(), hash.to_string()))
        }
        _ => Err(format!("cairn token new failed: {stdout}")),
    }
}

/// Makes the tokens and writes `auth.toml` (and the node token) in `folder`.
pub fn write_auth_config(binary: &Path, folder: &Path) -> Result<AuthSetup, String> {
    let (admin_token, admin_hash) = new_token(binary)?;
    let (a, a_hash) = new_token(binary)?;
    let (b, b_hash) = new_token(binary)?;
    let node_token = folder.join("node.token");
    std::fs::write(&node_token, &admin_token)
        .map_err(|e| format!("cannot write {}: {e}", node_token.display()))?;
    let scope = |name: &str, scope: &str, hash: &str| {
        format!(
            "[[auth.grants]]\nname = \"{name}\"\n{hash}\n\
             write = {{ types = [\"{}.*\"], tenancies = [\"{scope}/*\"] }}\n",
            workload::GROUP
        )
    };
    let config = format!(
        "[auth]\nnode_token_file = \"{}\"\n\n[[auth.grants]]\nname = \"harness\"\n{admin_hash}\nadmin = true\n\n{}\n{}",
        node_token.display(),
        scope("a", SCOPES[0], &a_hash),
        scope("b", SCOPES[1], &b_hash),
    );
    let path = folder.join("auth.toml");
    std::fs::write(&path, config).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(AuthSetup {
        config: path,
        admin_token,
        tokens: [a, b],
    })
}

/// What the scope checks found.
#[derive(Default)]
pub struct Audit {
    /// Every sighting of a resource outside the scope of the token that saw
    /// it, and every out-of-scope request that was answered.
    violations: Mutex<Vec<String>>,
    /// Per scope: elements returned by successful reads.
    elements_read: [AtomicUsize; 2],
    /// Per scope: Upsert/Delete events delivered to its watchers.
    events_watched: [AtomicUsize; 2],
    /// Per scope: out-of-scope requests refused with PERMISSION_DENIED.
    probes_denied: [AtomicUsize; 2],
}

impl Audit {
    fn violation(&self, text: String) {
        self.violations.lock().push(text);
    }

    /// Checks that `resource`, seen by the token of `scope`, lies inside it.
    fn check_seen(&self, scope: usize, how: &str, resource: &Resource) {
        let partition = resource
            .id
            .as_ref()
            .and_then(|id| id.tenancy.as_ref())
            .map(|t| t.partition.as_str())
            .unwrap_or("<none>");
        if partition != SCOPES[scope] {
            let name = resource.id.as_ref().map(|i| i.name.as_str()).unwrap_or("");
            self.violation(format!(
                "the token of {} {how} {name} in {partition}",
                SCOPES[scope]
            ));
        }
    }

    /// The report lines, and whether the audit passed.
    pub fn report(&self) -> (Vec<String>, bool) {
        let violations = self.violations.lock().clone();
        let mut lines = Vec::new();
        let mut ok = violations.is_empty();
        for (i, scope) in SCOPES.iter().enumerate() {
            let read = self.elements_read[i].load(Ordering::SeqCst);
            let watched = self.events_watched[i].load(Ordering::SeqCst);
            let denied = self.probes_denied[i].load(Ordering::SeqCst);
            lines.push(format!(
                "{scope}: {read} elements read, {watched} events watched, {denied} out-of-scope requests denied"
            ));
            if read == 0 || watched == 0 || denied == 0 {
                ok = false;
                lines.push(format!(
                    "  {scope}: a check saw nothing, so it proved nothing"
                ));
            }
        }
        lines.push(format!("scope violations: {}", violations.len()));
        lines.extend(violations.into_iter().take(40).map(|v| format!("  {v}")));
        (lines, ok)
    }
}

fn scope_tenancy(scope: usize) -> Tenancy {
    Tenancy {
        partition: SCOPES[scope].into(),
        namespace: "ns".into(),
    }
}

fn every_tenancy() -> Tenancy {
    Tenancy {
        partition: "*".into(),
        namespace: "*".into(),
    }
}

fn prefix(key: usize) -> String {
    workload::key_name(WorkloadKind::Set, key)
}

/// The history key of a scope's set (its elements are its own).
fn history_key(scope: usize, key: usize) -> String {
    format!("{}/{}", SCOPES[scope], prefix(key))
}

/// A strong list of `key` across every tenancy, by the token of `scope`,
/// recorded as a read of that scope's set; true when it succeeded.
async fn scoped_read(
    client: &Client,
    recorder: &Recorder,
    audit: &Audit,
    process: u64,
    scope: usize,
    key: usize,
) -> bool {
    let op = recorder.invoke(process, OpKind::Read, history_key(scope, key), Value::Null);
    match client
        .list(
            workload::resource_type(WorkloadKind::Set),
            every_tenancy(),
            prefix(key),
            Consistency::Strong,
        )
        .await
    {
        Ok(list) => {
            for r in &list.resources {
                audit.check_seen(scope, "listed", r);
            }
            audit.elements_read[scope].fetch_add(list.resources.len(), Ordering::SeqCst);
            let mut elements: Vec<Value> = list.resources.iter().map(workload::decode).collect();
            elements.sort();
            op.ok(Value::List(elements));
            true
        }
        Err(_) => {
            op.fail();
            false
        }
    }
}

/// A read and a list aimed at the other scope: PERMISSION_DENIED, or a
/// failure to reach any node; any answer is a violation.
async fn probe_other_scope(client: &Client, audit: &Audit, scope: usize) {
    let other = 1 - scope;
    let id = Id {
        uid: String::new(),
        name: format!("{}0", prefix(0)),
        r#type: Some(workload::resource_type(WorkloadKind::Set)),
        tenancy: Some(scope_tenancy(other)),
    };
    let judge = |what: &str, result: Result<String, ClientError>| match result {
        Err(ClientError::PermissionDenied(_)) => {
            audit.probes_denied[scope].fetch_add(1, Ordering::SeqCst);
        }
        Ok(answer) => audit.violation(format!(
            "the token of {} was answered a {what} in {}: {answer}",
            SCOPES[scope], SCOPES[other]
        )),
        Err(ClientError::NotFound) => audit.violation(format!(
            "the token of {} learned that nothing is stored at a {what} in {}",
            SCOPES[scope], SCOPES[other]
        )),
        Err(_) => {} // no node reachable, no leader: says nothing about scopes
    };
    judge(
        "read",
        client
            .read(id, Consistency::Strong)
            .await
            .map(|r| format!("{:?}", r.id)),
    );
    let other_tenancy = Tenancy {
        partition: SCOPES[other].into(),
        namespace: "*".into(),
    };
    judge(
        "list",
        client
            .list(
                workload::resource_type(WorkloadKind::Set),
                other_tenancy,
                "",
                Consistency::Eventual,
            )
            .await
            .map(|l| format!("{} resources", l.resources.len())),
    );
}

/// One logical client process of one scope.
struct Process {
    id: u64,
    scope: usize,
    client: Client,
    recorder: Recorder,
    audit: Arc<Audit>,
    rng: StdRng,
    counter: i64,
}

impl Process {
    async fn run(mut self, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::SeqCst) {
            workload::pin_home(&self.client);
            let key = self.rng.random_range(0..KEYS);
            let choice = self.rng.random_range(0..100);
            if choice < 70 {
                self.add(key).await;
            } else if choice < 90 {
                scoped_read(
                    &self.client,
                    &self.recorder,
                    &self.audit,
                    self.id,
                    self.scope,
                    key,
                )
                .await;
            } else {
                probe_other_scope(&self.client, &self.audit, self.scope).await;
            }
            let pause = self.rng.random_range(20..=60);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    async fn add(&mut self, key: usize) {
        self.counter += 1;
        let element = Value::Int(i64::try_from(self.id).unwrap_or(0) * 1_000_000 + self.counter);
        let name = format!("{}{element}", prefix(key));
        let op = self.recorder.invoke(
            self.id,
            OpKind::Add,
            history_key(self.scope, key),
            element.clone(),
        );
        let resource = Resource {
            id: Some(Id {
                uid: cairn_client::new_uid(),
                name,
                r#type: Some(workload::resource_type(WorkloadKind::Set)),
                tenancy: Some(scope_tenancy(self.scope)),
            }),
            data: workload::encode(&element),
            ..Resource::default()
        };
        match self.client.write(resource).await {
            Ok(stored) => {
                self.audit.check_seen(self.scope, "was answered", &stored);
                op.ok(Value::Null)
            }
            Err(e) if e.is_cas_conflict() => op.info(),
            Err(e) if e.outcome().is_definite() => op.fail(),
            Err(_) => op.info(),
        }
    }
}

/// Keeps a watch of every set element on one node open for one scope's
/// token, reopening it after each break, and audits every event.
async fn watcher(client: Client, scope: usize, audit: Arc<Audit>, stop: Arc<AtomicBool>) {
    let mut start_revision = 0;
    while !stop.load(Ordering::SeqCst) {
        let request = WatchListRequest {
            r#type: Some(workload::resource_type(WorkloadKind::Set)),
            tenancy: Some(every_tenancy()),
            name_prefix: String::new(),
            start_revision,
            consistency: Consistency::Eventual as i32,
            selector: String::new(),
        };
        let mut stream = match client.watch_list(request).await {
            Ok(s) => s,
            Err(ClientError::Compacted { .. }) => {
                start_revision = 0;
                continue;
            }
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        while let Some(event) = stream.next().await {
            let Ok(event) = event else {
                break;
            };
            let resource = match event.event {
                Some(watch_event::Event::Upsert(u)) => u.resource,
                Some(watch_event::Event::Delete(d)) => d.resource,
                _ => continue,
            };
            if let Some(r) = resource {
                audit.check_seen(scope, "was sent a watch event of", &r);
                audit.events_watched[scope].fetch_add(1, Ordering::SeqCst);
            }
            start_revision = watch_resume_revision(event.revision);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The running workload.
pub struct ScopedWorkload {
    pub recorder: Recorder,
    pub audit: Arc<Audit>,
    client_options: ClientOptions,
    stop: Arc<AtomicBool>,
    stop_watchers: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    watchers: Vec<tokio::task::JoinHandle<()>>,
}

fn with_token(options: &ClientOptions, token: &str) -> Result<ClientOptions, String> {
    Ok(ClientOptions {
        token: Some(BearerToken::new(token).map_err(|e| e.to_string())?),
        ..options.clone()
    })
}

impl ScopedWorkload {
    /// Starts the watchers (one per node per scope), then six processes,
    /// three per scope, each homed on a random node.
    pub fn start(seed: u64, endpoints: &[String], tokens: &[String; 2]) -> Result<Self, String> {
        let client_options = WorkloadOptions::new(WorkloadKind::Set, seed).client;
        let recorder = Recorder::new();
        let audit = Arc::new(Audit::default());
        let stop = Arc::new(AtomicBool::new(false));
        let stop_watchers = Arc::new(AtomicBool::new(false));
        let mut rng = StdRng::seed_from_u64(seed);
        let mut watchers = Vec::new();
        for (scope, token) in tokens.iter().enumerate() {
            let options = with_token(&client_options, token)?;
            for endpoint in endpoints {
                let client = Client::new(std::slice::from_ref(endpoint), options.clone())
                    .map_err(|e| e.to_string())?;
                watchers.push(tokio::spawn(watcher(
                    client,
                    scope,
                    audit.clone(),
                    stop_watchers.clone(),
                )));
            }
        }
        let mut tasks = Vec::new();
        for process in 0..6u64 {
            let scope = (process % 2) as usize;
            let options = with_token(&client_options, &tokens[scope])?;
            let home = rng.random_range(0..endpoints.len());
            let client = workload::process_client(endpoints, home, &options)
                .ok_or("cannot build a client")?;
            let p = Process {
                id: process,
                scope,
                client,
                recorder: recorder.clone(),
                audit: audit.clone(),
                rng: StdRng::seed_from_u64(rng.random()),
                counter: 0,
            };
            tasks.push(tokio::spawn(p.run(stop.clone())));
        }
        Ok(ScopedWorkload {
            recorder,
            audit,
            client_options,
            stop,
            stop_watchers,
            tasks,
            watchers,
        })
    }

    pub async fn stop_processes(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now()
            + self.client_options.request_timeout * 10
            + Duration::from_secs(5);
        for task in self.tasks.drain(..) {
            let abort = task.abort_handle();
            if tokio::time::timeout_at(deadline, task).await.is_err() {
                abort.abort();
            }
        }
    }

    pub async fn stop_watchers(&mut self) {
        self.stop_watchers.store(true, Ordering::SeqCst);
        for task in self.watchers.drain(..) {
            task.abort();
            let _ = task.await;
        }
    }

    /// One final strong read per key and scope, through every node in
    /// turn, retried until it succeeds or `timeout` passes.
    pub async fn final_reads(
        &self,
        endpoints: &[String],
        tokens: &[String; 2],
        timeout: Duration,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut all = true;
        for (scope, token) in tokens.iter().enumerate() {
            let Ok(options) = with_token(
                &ClientOptions {
                    request_timeout: Duration::from_secs(5),
                    ..ClientOptions::default()
                },
                token,
            ) else {
                return false;
            };
            let Ok(client) = Client::new(endpoints, options) else {
                return false;
            };
            for key in 0..KEYS {
                let mut done = false;
                while !done && tokio::time::Instant::now() < deadline {
                    done = scoped_read(&client, &self.recorder, &self.audit, u64::MAX, scope, key)
                        .await;
                    if !done {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                all &= done;
            }
        }
        all
    }
}

impl Drop for ScopedWorkload {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.stop_watchers.store(true, Ordering::SeqCst);
        for t in self.tasks.iter().chain(self.watchers.iter()) {
            t.abort();
        }
    }
}

/// The scenario: see the module docs. Writes `auth.toml`, `history.jsonl`,
/// `nemesis.log` and `check.txt` into `folder`.
pub async fn run(
    scenario: &Scenario,
    env: &RunEnvironment,
    folder: &Path,
    result: &mut ScenarioResult,
) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(scenario.seed);
    let setup = write_auth_config(&env.binary, folder)?;
    let lab = Arc::new(NetworkLab::new()?);
    let mut options = ClusterOptions::new(&env.binary, scenario.nodes);
    options.root = Some(folder.to_path_buf());
    options.election_timeout_ms = 800;
    options.snapshot_log_entries = 500;
    options.network = Some(lab.clone());
    options.die_with_parent = true;
    options.log_level = "info".into();
    options.extra_args = vec!["--config".into(), setup.config.display().to_string()];
    options.admin_token = Some(setup.admin_token.clone());
    let mut cluster = Cluster::try_start(options)?;
    let endpoints = cluster.endpoints();
    let deadline = Instant::now() + Duration::from_secs(20);
    let first_leader = loop {
        if let Some(l) = cluster.leader().await {
            break l;
        }
        if Instant::now() > deadline {
            return Err("no leader within 20 s (logs in the scenario folder)".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let mut workload = ScopedWorkload::start(rng.random(), &endpoints, &setup.tokens)?;
    let mut cx = NemesisContext {
        cluster: &mut cluster,
        lab: Some(lab.clone()),
        rng: StdRng::seed_from_u64(rng.random()),
        log: NemesisLog::new(Instant::now()),
        paused: Default::default(),
        skewed: Default::default(),
        voters: scenario.nodes,
        history: None,
        restores: Default::default(),
        kill_loop: Default::default(),
        rounds_max: scenario.rounds_max,
        election: None,
    };
    cx.log.note(format!(
        "authenticated cluster of {} up, leader {first_leader}",
        scenario.nodes
    ));
    let nemesis_result = nemesis::run_rotating(&NEMESES, &mut cx, scenario.duration).await;
    let heal_result = nemesis::heal_all(&mut cx);
    let NemesisContext {
        log: mut nemesis_log,
        ..
    } = cx;
    workload.stop_processes().await;
    nemesis_log.note("workload stopped");
    result.faults = nemesis_log.faults;
    let mut failure: Option<String> = None;
    if let Err(e) = nemesis_result.and(heal_result) {
        failure = Some(format!("nemesis: {e}"));
    }
    if let Err(e) = nemesis::converge(&cluster, Duration::from_secs(40)).await {
        failure.get_or_insert(format!("the cluster did not converge after healing: {e}"));
    }
    nemesis_log.note("converged");
    if !workload
        .final_reads(&cluster.endpoints(), &setup.tokens, Duration::from_secs(30))
        .await
    {
        failure.get_or_insert("the final reads did not succeed within 30 s".into());
    }
    // Let the watchers receive the last events before they stop.
    tokio::time::sleep(Duration::from_secs(1)).await;
    workload.stop_watchers().await;
    nemesis_log.note("final reads done");
    let _ = std::fs::write(
        folder.join("nemesis.log"),
        nemesis_log.lines.join("\n") + "\n",
    );

    let history = workload.recorder.history();
    result.operations = history.len();
    (result.acknowledged_writes, result.successful_reads) = crate::runner::work_done(&history);
    if let Some(short) = crate::runner::shortfall(scenario, &history, result.faults) {
        failure.get_or_insert(short);
    }
    let mut jsonl = Vec::new();
    if history.write_jsonl(&mut jsonl).is_ok() {
        let _ = std::fs::write(folder.join("history.jsonl"), &jsonl);
    }
    let mut report = String::new();
    let set_report = set::check(&history).map_err(|e| e.to_string())?;
    report.push_str(&format!("set checker: {:?}\n", set_report.verdict));
    for key in &set_report.keys {
        report.push_str(&format!(
            "  key {}: {:?}, {} acknowledged, {} indeterminate, {} failed, anomalies {:?}\n",
            key.key,
            key.verdict,
            key.acknowledged_elements,
            key.indeterminate_elements,
            key.failed_elements,
            key.anomalies.iter().take(10).collect::<Vec<_>>()
        ));
    }
    let (audit_lines, audit_ok) = workload.audit.report();
    report.push_str("scope audit:\n");
    for line in &audit_lines {
        report.push_str(&format!("  {line}\n"));
    }
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for op in history.operations() {
        *counts
            .entry(format!("{} {}", op.op, op.outcome))
            .or_default() += 1;
    }
    report.push_str(&format!("operations: {counts:?}\n"));
    let _ = std::fs::write(folder.join("check.txt"), &report);
    let verdict = if audit_ok {
        set_report.verdict
    } else {
        Verdict::Invalid
    };
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
