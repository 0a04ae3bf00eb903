//! The lifecycle workload ([`WorkloadKind::Lifecycle`], issue 34): status writes, finalizers,
//! deletion marks, re-creation and a selector-fed watch cache, under any nemesis, run by the
//! generic runner ([`crate::runner::run_scenario`]) like the register, set and watch workloads.
//!
//! **Resources.** A few keys (`lc00`, `lc01`, ...) of the type `jepsen/v1/Lifecycle`. Every
//! lifetime of a key is created with the finalizer [`FINALIZER`] (metadata `finalizers`) and
//! a label `app` of [`APPS`]; its data is a value unique to the write.
//!
//! **Processes** (each through its own home node, as every workload's; the role is
//! `process % 7`, [`Role::of`]):
//! - *data writers* (0, 1, 2): a strong read, then a CAS write on the version read that
//!   changes `data` and sets `app` to a random one of [`APPS`] (so it flips half the time),
//!   keeping the finalizers and the status exactly as read; after a CAS conflict they read
//!   and try again (up to 8 attempts). A key with nothing stored is created (a new uid,
//!   create-only), which is how a key comes back after a removal. A marked key is left alone
//!   (a marked resource may only lose finalizers);
//! - *status writers* (3, 4): `WriteStatus` of the status key `p<process>` (one per
//!   process) of the lifetime they last read, with an empty version: it must never conflict
//!   with a data write; NotFound (the lifetime was removed) is fine;
//! - the *deleter* (5): reads a key and deletes the lifetime at the version read: it has the
//!   finalizer, so the answer should say `marked` (recorded; a run needs 3 such answers,
//!   [`check::shortfall`]);
//! - the *finalizer* (6): reads a key and, when it is marked, removes the finalizer with a
//!   CAS write on the version read (same data, metadata and status): that write removes
//!   the resource.
//!
//! Beside them, one *raw watcher* per node keeps an unfiltered WatchList of the type open on
//! that node ([`Record::Event`]: every live Upsert and Delete, with the uid, finalizers and
//! mark), and two *watch caches* ([`cairn_client::WatchCache`] with the selector
//! [`SELECTOR`], through different home nodes) are compared, every 0.3–0.8 s, with a strong
//! List of the same selector: once `list_consistent` has caught the cache up with a
//! quorum-confirmed revision (a progress point), the cache's contents at its revision R
//! ([`cairn_client::WatchCache::list_with_revision`]) against the List at revision R
//! ([`Record::Compare`]).
//!
//! **History** (`history.jsonl`, [`crate::history`]): `read` (output `null` when nothing is
//! stored, else `[uid, version, app, marked, finalizers]`), `write` (input
//! `[uid, expected version, value, app]`, output the version stored), `status` (input
//! `[uid, status key, value]`; a refusal's output names it: `not-found`, `cas-failure: ...`,
//! `wrong-uid: ...`), `delete` (input `[uid, version]`, output `[revision, marked]`) and
//! `finalize` (input `[uid, version]`, output the version answered). The watch and cache
//! records go to `lifecycle.jsonl`, stamped with the history's clock
//! ([`crate::Recorder::now_ns`]).
//!
//! **Checked** ([`check`]): (1) no version-less status write conflicted; (2) no lifetime was
//! seen removed before a write removing its last finalizer had been attempted; (3) the cache
//! equals the selector's List at every progress point compared.
//! `jepsen-tests check --model lifecycle DIR` checks a folder again ([`load_run`]).
//!
//! Invariants: each change of the type is one log entry changing one resource (no owners,
//! no leases), so a revision the cache reports is never half applied; every record of a run
//! is stamped with one clock, the recorder's.

pub mod check;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_client::v1::{
    watch_event, Consistency, DeleteRequest, ListRequest, Resource, Status, Tenancy,
    WatchListRequest, WriteStatusRequest,
};
use cairn_client::{
    Client, ClientError, ClientOptions, Outcome as ClientOutcome, WatchCache, WatchCacheOptions,
    WatchSpec,
};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::history::{History, OpKind, Outcome, Recorder, Value};
use crate::workload::{self, WorkloadKind};
use crate::Error;

/// The finalizer every lifetime is created with.
pub const FINALIZER: &str = "jepsen.io/keep";
/// The metadata key of finalizers (the store's).
pub const FINALIZERS_KEY: &str = "finalizers";
/// The metadata key of a deletion mark (set by the store only).
pub const DELETION_TIMESTAMP_KEY: &str = "deletionTimestamp";
/// The label the data writers flip.
pub const APP_KEY: &str = "app";
/// The values of [`APP_KEY`].
pub const APPS: [&str; 2] = ["web", "api"];
/// The selector of the watch caches and of the Lists they are compared with.
pub const SELECTOR: &str = "app=web";
/// The cluster version that enables status writes, finalizers and selectors.
pub const LIFECYCLE_CLUSTER_VERSION: &str = "0.2";
/// How many watch caches are compared with the List.
pub const CACHES: usize = 2;
/// The file of the watchers' and caches' records in a scenario's folder.
pub const RECORDS_FILE: &str = "lifecycle.jsonl";
const HISTORY_FILE: &str = "history.jsonl";

/// What a process of the workload does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Data,
    Status,
    Deleter,
    Finalizer,
}

impl Role {
    /// The role of process `id`: 0–2 data, 3–4 status, 5 deleter, 6 finalizer, and so on
    /// modulo 7 (a 10-process workload has six data writers).
    pub fn of(id: u64) -> Role {
        match id % 7 {
            0..=2 => Role::Data,
            3 | 4 => Role::Status,
            5 => Role::Deleter,
            _ => Role::Finalizer,
        }
    }

    /// Pause between two operations, in ms: deletes and finalizations are rarer, so that a
    /// lifetime lives long enough to be written.
    fn pause_ms(self) -> (u64, u64) {
        match self {
            Role::Data | Role::Status => (20, 60),
            Role::Deleter => (150, 450),
            Role::Finalizer => (100, 350),
        }
    }
}

/// One entry of a cache or of a List: what check 3 compares.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    pub uid: String,
    pub version: String,
    pub app: String,
}

impl Entry {
    fn of(resource: &Resource) -> Entry {
        Entry {
            name: name_of(resource),
            uid: uid_of(resource),
            version: resource.version.clone(),
            app: resource.metadata.get(APP_KEY).cloned().unwrap_or_default(),
        }
    }
}

/// A record of `lifecycle.jsonl`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "snake_case")]
pub enum Record {
    /// A live change on node `node`'s unfiltered watch, received at `at_ns`.
    Event {
        node: usize,
        at_ns: u64,
        revision: u64,
        delete: bool,
        name: String,
        uid: String,
        version: String,
        app: String,
        finalizers: String,
        marked: bool,
    },
    /// A raw watch opened (`open`, at `revision`: 0 = with a snapshot) or broke (`error`).
    Watch {
        node: usize,
        at_ns: u64,
        what: String,
        revision: u64,
    },
    /// Cache `cache` caught up with a progress point (`list_consistent` invoked at
    /// `invoke_ns`), then held `cached` at `revision`; the strong List of [`SELECTOR`] at
    /// that revision returned `listed` (or failed: `error`), completed at `at_ns`.
    Compare {
        cache: usize,
        invoke_ns: u64,
        at_ns: u64,
        revision: u64,
        cached: Vec<Entry>,
        listed: Option<Vec<Entry>>,
        error: Option<String>,
    },
    /// Cache `cache` could not reach a progress point (`list_consistent` failed).
    ProgressFailed {
        cache: usize,
        at_ns: u64,
        error: String,
    },
}

/// The records of a run, shared by its tasks.
pub type Records = Arc<Mutex<Vec<Record>>>;

fn name_of(resource: &Resource) -> String {
    resource
        .id
        .as_ref()
        .map(|i| i.name.clone())
        .unwrap_or_default()
}

fn uid_of(resource: &Resource) -> String {
    resource
        .id
        .as_ref()
        .map(|i| i.uid.clone())
        .unwrap_or_default()
}

fn is_marked(resource: &Resource) -> bool {
    resource.metadata.contains_key(DELETION_TIMESTAMP_KEY)
}

fn finalizers_of(resource: &Resource) -> String {
    resource
        .metadata
        .get(FINALIZERS_KEY)
        .cloned()
        .unwrap_or_default()
}

/// A read's output: `[uid, version, app, marked, finalizers]`.
fn describe(resource: &Resource) -> Value {
    Value::List(vec![
        Value::Str(uid_of(resource)),
        Value::Str(resource.version.clone()),
        Value::Str(resource.metadata.get(APP_KEY).cloned().unwrap_or_default()),
        Value::Int(i64::from(is_marked(resource))),
        Value::Str(finalizers_of(resource)),
    ])
}

fn lifecycle_type() -> cairn_client::v1::Type {
    workload::resource_type(WorkloadKind::Lifecycle)
}

fn any_tenancy() -> Tenancy {
    Tenancy {
        partition: "*".into(),
        namespace: "*".into(),
    }
}

/// A strong read of key `name`, recorded as `read`: `None` when it did not succeed,
/// `Some(None)` when nothing is stored.
pub async fn recorded_read(
    client: &Client,
    recorder: &Recorder,
    process: u64,
    name: &str,
) -> Option<Option<Resource>> {
    let op = recorder.invoke(process, OpKind::Read, name, Value::Null);
    match client
        .read(
            workload::resource_id(WorkloadKind::Lifecycle, name, ""),
            Consistency::Strong,
        )
        .await
    {
        Ok(resource) => {
            op.ok(describe(&resource));
            Some(Some(resource))
        }
        Err(ClientError::NotFound) => {
            op.ok(Value::Null);
            Some(None)
        }
        Err(e) if e.outcome().is_definite() => {
            op.fail();
            None
        }
        Err(_) => {
            op.info();
            None
        }
    }
}

/// The output of a refused status write: `not-found`, `cas-failure: ...`, `wrong-uid: ...`
/// or the error's text.
pub fn status_refusal(error: &ClientError) -> String {
    match error {
        ClientError::NotFound => "not-found".into(),
        ClientError::CasFailure(m) => format!("cas-failure: {m}"),
        ClientError::WrongUid(m) => format!("wrong-uid: {m}"),
        other => other.to_string(),
    }
}

/// One logical client process of the workload.
pub(crate) struct LifecycleProcess {
    id: u64,
    client: Client,
    recorder: Recorder,
    rng: StdRng,
    keys: usize,
    counter: i64,
    /// Status writers: the lifetime each key had when last read.
    uids: BTreeMap<String, String>,
}

impl LifecycleProcess {
    pub fn new(id: u64, client: Client, recorder: Recorder, rng: StdRng, keys: usize) -> Self {
        LifecycleProcess {
            id,
            client,
            recorder,
            rng,
            keys,
            counter: 0,
            uids: BTreeMap::new(),
        }
    }

    fn next_value(&mut self) -> i64 {
        self.counter += 1;
        i64::try_from(self.id).unwrap_or(0) * 1_000_000 + self.counter
    }

    pub async fn run(mut self, stop: Arc<AtomicBool>) {
        let role = Role::of(self.id);
        while !stop.load(Ordering::SeqCst) {
            workload::pin_home(&self.client);
            let key = self.rng.random_range(0..self.keys);
            let name = workload::key_name(WorkloadKind::Lifecycle, key);
            match role {
                Role::Data => self.data_op(&name).await,
                Role::Status => self.status_op(&name).await,
                Role::Deleter => self.delete_op(&name).await,
                Role::Finalizer => self.finalize_op(&name).await,
            }
            let (low, high) = role.pause_ms();
            let pause = self.rng.random_range(low..=high);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    async fn read(&self, name: &str) -> Option<Option<Resource>> {
        recorded_read(&self.client, &self.recorder, self.id, name).await
    }

    /// A data write (see the module docs): create when nothing is stored, else change the
    /// data and the label at the version read; after a conflict, read and try again.
    async fn data_op(&mut self, name: &str) {
        if self.rng.random_range(0..100) < 25 {
            // A plain read now and then.
            let _ = self.read(name).await;
            return;
        }
        for _ in 0..8 {
            let Some(seen) = self.read(name).await else {
                return;
            };
            let value = self.next_value();
            let app = APPS[self.rng.random_range(0..APPS.len())];
            let resource = match seen {
                None => {
                    let uid = cairn_client::new_uid();
                    let mut r = Resource {
                        id: Some(workload::resource_id(WorkloadKind::Lifecycle, name, &uid)),
                        version: String::new(),
                        data: workload::encode(&Value::Int(value)),
                        ..Resource::default()
                    };
                    r.metadata.insert(FINALIZERS_KEY.into(), FINALIZER.into());
                    r.metadata.insert(APP_KEY.into(), app.into());
                    r
                }
                Some(r) if is_marked(&r) => return,
                Some(mut r) => {
                    r.data = workload::encode(&Value::Int(value));
                    r.metadata.insert(APP_KEY.into(), app.into());
                    r
                }
            };
            let op = self.recorder.invoke(
                self.id,
                OpKind::Write,
                name,
                Value::List(vec![
                    Value::Str(uid_of(&resource)),
                    Value::Str(resource.version.clone()),
                    Value::Int(value),
                    Value::Str(app.into()),
                ]),
            );
            match self.client.write(resource).await {
                Ok(stored) => return op.ok(Value::Str(stored.version)),
                Err(e) if e.is_cas_conflict() => {
                    op.complete(Outcome::Fail, Value::Str(e.to_string()));
                    continue;
                }
                Err(e) if e.outcome() == ClientOutcome::Unknown => return op.info(),
                Err(e) => return op.complete(Outcome::Fail, Value::Str(e.to_string())),
            }
        }
    }

    /// A status write of this process's key, version "", to the lifetime last read.
    async fn status_op(&mut self, name: &str) {
        let known = self.uids.get(name).cloned();
        let uid = match known {
            Some(uid) if self.rng.random_bool(0.7) => uid,
            _ => match self.read(name).await {
                Some(Some(r)) => {
                    let uid = uid_of(&r);
                    self.uids.insert(name.to_owned(), uid.clone());
                    uid
                }
                Some(None) => {
                    self.uids.remove(name);
                    return;
                }
                None => return,
            },
        };
        let value = self.next_value();
        let key = format!("p{}", self.id);
        let op = self.recorder.invoke(
            self.id,
            OpKind::Status,
            name,
            Value::List(vec![
                Value::Str(uid.clone()),
                Value::Str(key.clone()),
                Value::Int(value),
            ]),
        );
        let request = WriteStatusRequest {
            id: Some(workload::resource_id(WorkloadKind::Lifecycle, name, &uid)),
            key,
            status: Some(Status {
                observed_generation: value.to_string(),
                ..Status::default()
            }),
            version: String::new(),
            fence: None,
        };
        match self.client.write_status(request).await {
            Ok(stored) => op.ok(Value::Str(stored.version)),
            Err(e) if e.outcome() == ClientOutcome::Unknown => op.info(),
            Err(e) => {
                if e == ClientError::NotFound {
                    self.uids.remove(name);
                }
                op.complete(Outcome::Fail, Value::Str(status_refusal(&e)));
            }
        }
    }

    /// Deletes the lifetime read, at the version read (it has the finalizer: only marked).
    async fn delete_op(&mut self, name: &str) {
        let Some(Some(seen)) = self.read(name).await else {
            return;
        };
        if is_marked(&seen) {
            return;
        }
        let uid = uid_of(&seen);
        let op = self.recorder.invoke(
            self.id,
            OpKind::Delete,
            name,
            Value::List(vec![
                Value::Str(uid.clone()),
                Value::Str(seen.version.clone()),
            ]),
        );
        let request = DeleteRequest {
            id: Some(workload::resource_id(WorkloadKind::Lifecycle, name, &uid)),
            version: seen.version.clone(),
            fence: None,
            orphan_dependents: false,
        };
        match self.client.delete_request(request).await {
            Ok(answer) => op.ok(Value::List(vec![
                Value::Int(i64::try_from(answer.revision).unwrap_or(i64::MAX)),
                Value::Int(i64::from(answer.marked)),
            ])),
            Err(e) if e.outcome() == ClientOutcome::Unknown => op.info(),
            Err(e) => op.complete(Outcome::Fail, Value::Str(e.to_string())),
        }
    }

    /// Removes the finalizer of a marked lifetime at the version read: the write that
    /// removes it removes the resource.
    async fn finalize_op(&mut self, name: &str) {
        let Some(Some(seen)) = self.read(name).await else {
            return;
        };
        if !is_marked(&seen) {
            return;
        }
        let uid = uid_of(&seen);
        let mut written = seen.clone();
        written.metadata.remove(FINALIZERS_KEY);
        let op = self.recorder.invoke(
            self.id,
            OpKind::Finalize,
            name,
            Value::List(vec![
                Value::Str(uid.clone()),
                Value::Str(seen.version.clone()),
            ]),
        );
        match self.client.write(written).await {
            Ok(stored) => op.ok(Value::Str(stored.version)),
            Err(e) if e.outcome() == ClientOutcome::Unknown => op.info(),
            Err(e) => op.complete(Outcome::Fail, Value::Str(e.to_string())),
        }
    }
}

/// One raw watcher: an unfiltered watch of the type on node `node` alone, reopened from
/// the last revision it saw after a break (or with a snapshot after Compacted). Logs every
/// live change.
pub(crate) async fn raw_watcher(
    node: usize,
    client: Client,
    records: Records,
    recorder: Recorder,
    stop: Arc<AtomicBool>,
) {
    let push = |record: Record| records.lock().push(record);
    let mut last_revision = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let start_revision = cairn_client::watch_resume_revision(last_revision);
        let request = WatchListRequest {
            r#type: Some(lifecycle_type()),
            tenancy: Some(any_tenancy()),
            name_prefix: String::new(),
            start_revision,
            consistency: Consistency::Eventual as i32,
            selector: String::new(),
        };
        let mut stream = match client.watch_list(request).await {
            Ok(s) => s,
            Err(e) => {
                if matches!(e, ClientError::Compacted { .. }) {
                    last_revision = 0;
                }
                push(Record::Watch {
                    node,
                    at_ns: recorder.now_ns(),
                    what: format!("error: {e}"),
                    revision: last_revision,
                });
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            }
        };
        push(Record::Watch {
            node,
            at_ns: recorder.now_ns(),
            what: "open".into(),
            revision: start_revision,
        });
        let mut in_snapshot = start_revision == 0;
        loop {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let item = match tokio::time::timeout(Duration::from_millis(500), stream.next()).await {
                Err(_) => continue,
                Ok(None) => break,
                Ok(Some(item)) => item,
            };
            let event = match item {
                Ok(event) => event,
                Err(e) => {
                    if matches!(e, ClientError::Compacted { .. }) {
                        last_revision = 0;
                    }
                    push(Record::Watch {
                        node,
                        at_ns: recorder.now_ns(),
                        what: format!("error: {e}"),
                        revision: last_revision,
                    });
                    break;
                }
            };
            let revision = event.revision;
            let change = match event.event {
                Some(watch_event::Event::Upsert(u)) => u.resource.map(|r| (false, r)),
                Some(watch_event::Event::Delete(d)) => d.resource.map(|r| (true, r)),
                Some(watch_event::Event::EndOfSnapshot(_)) => {
                    in_snapshot = false;
                    None
                }
                Some(watch_event::Event::Progress(_)) | None => None,
            };
            if in_snapshot {
                continue;
            }
            if let Some((delete, r)) = change {
                push(Record::Event {
                    node,
                    at_ns: recorder.now_ns(),
                    revision,
                    delete,
                    name: name_of(&r),
                    uid: uid_of(&r),
                    version: r.version.clone(),
                    app: r.metadata.get(APP_KEY).cloned().unwrap_or_default(),
                    finalizers: finalizers_of(&r),
                    marked: is_marked(&r),
                });
            }
            last_revision = last_revision.max(revision);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One watch cache of [`SELECTOR`] through `client` (home node first), compared with a
/// strong List at its revision every 0.3–0.8 s after each progress point it reaches.
pub(crate) async fn cache_comparer(
    cache_index: usize,
    client: Client,
    records: Records,
    recorder: Recorder,
    stop: Arc<AtomicBool>,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let spec = WatchSpec::new(workload::GROUP, lifecycle_type().kind).with_selector(SELECTOR);
    let options = WatchCacheOptions {
        consistent_read_timeout: Duration::from_secs(4),
        ..WatchCacheOptions::default()
    };
    let cache = match WatchCache::start(client.clone(), vec![spec], options) {
        Ok(cache) => cache,
        Err(e) => {
            records.lock().push(Record::ProgressFailed {
                cache: cache_index,
                at_ns: recorder.now_ns(),
                error: format!("the cache did not start: {e}"),
            });
            return;
        }
    };
    let kind = lifecycle_type().kind;
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..=800))).await;
        if !cache.is_primed() {
            continue;
        }
        let invoke_ns = recorder.now_ns();
        if let Err(e) = cache.list_consistent(workload::GROUP, &kind).await {
            records.lock().push(Record::ProgressFailed {
                cache: cache_index,
                at_ns: recorder.now_ns(),
                error: e.to_string(),
            });
            continue;
        }
        let Some((revision, cached)) = cache.list_with_revision(workload::GROUP, &kind) else {
            continue;
        };
        let mut cached: Vec<Entry> = cached.iter().map(|r| Entry::of(r)).collect();
        cached.sort();
        let listing = client
            .list_request(ListRequest {
                r#type: Some(lifecycle_type()),
                tenancy: Some(any_tenancy()),
                consistency: Consistency::Strong as i32,
                revision,
                selector: SELECTOR.into(),
                ..ListRequest::default()
            })
            .await;
        let (listed, error) = match listing {
            Ok(list) if list.revision == revision => {
                let mut listed: Vec<Entry> = list.resources.iter().map(Entry::of).collect();
                listed.sort();
                (Some(listed), None)
            }
            Ok(list) => (
                None,
                Some(format!(
                    "the List asked for revision {revision} answered at {}",
                    list.revision
                )),
            ),
            Err(e) => (None, Some(e.to_string())),
        };
        records.lock().push(Record::Compare {
            cache: cache_index,
            invoke_ns,
            at_ns: recorder.now_ns(),
            revision,
            cached,
            listed,
            error,
        });
    }
}

/// The client of watch cache `index`: its home node first.
pub(crate) fn cache_client(
    endpoints: &[String],
    index: usize,
    options: &ClientOptions,
) -> Option<Client> {
    workload::process_client(endpoints, index % endpoints.len(), options)
}

/// Writes `lifecycle.jsonl` into `folder`.
pub fn save_records(folder: &Path, records: &[Record]) {
    let mut text = String::new();
    for record in records {
        // Records of plain strings and integers always serialize.
        text.push_str(&serde_json::to_string(record).unwrap_or_default());
        text.push('\n');
    }
    crate::runner::write_file(&folder.join(RECORDS_FILE), &text);
}

/// Loads `history.jsonl` and `lifecycle.jsonl` of a lifecycle scenario's folder.
pub fn load_run(folder: &Path) -> Result<(History, Vec<Record>), Error> {
    let read = |name: &str| {
        let path = folder.join(name);
        std::fs::read_to_string(&path).map_err(|source| Error::Open { path, source })
    };
    let history = History::from_jsonl_str(&read(HISTORY_FILE)?)?;
    let mut records = Vec::new();
    for (index, line) in read(RECORDS_FILE)?.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        records.push(serde_json::from_str(line).map_err(|e| Error::Parse {
            line: index + 1,
            reason: format!("{RECORDS_FILE}: {e}"),
        })?);
    }
    Ok((history, records))
}
