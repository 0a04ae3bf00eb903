//! Model-based test: random command sequences run against the Store and a
//! naive reference model (a BTreeMap of the latest state, a Vec of changes and
//! a copy of the table after every entry), comparing every result, every read
//! and list at every retained revision, and every watch stream.
//!
//! 200 cases x 50..80 steps = at least 10,000 random steps per run.

mod common;

use cairn_fsm::{
    Applied, Batch, Command, Event, FsmError, Limits, Store, StoredResource, Watch, WatchEventKind,
    WatchFilter,
};
use cairn_proto::v1::{Id, Resource, Tenancy, Type};
use common::{drain, full_id, resource, tenancy, ty};
use proptest::prelude::*;
use std::collections::{BTreeMap, VecDeque};

// Small alphabets so CAS hits, uid clashes and prefix overlaps happen often.
const TYPES: [(&str, &str); 3] = [("g1", "k1"), ("g1", "k2"), ("g2", "k1")];
const WRITTEN_TYPES: usize = 2;
const PARTITIONS: [&str; 3] = ["", "p", "*"];
const NAMESPACES: [&str; 3] = ["", "n", "*"];
const NAMES: [&str; 3] = ["a", "ab", "b"];
const PREFIXES: [&str; 5] = ["", "a", "ab", "b", "c"];
const UIDS: [&str; 3] = ["", "u1", "u2"];
const GROUP_VERSIONS: [&str; 2] = ["v1", "v2"];

/// (group, kind, partition, namespace, name): the contract's storage key.
type ModelKey = (String, String, String, String, String);
type Table = BTreeMap<ModelKey, Resource>;

#[derive(Debug, Clone, Copy)]
struct KeyChoice {
    type_: usize,
    partition: usize,
    namespace: usize,
    name: usize,
}

#[derive(Debug, Clone, Copy)]
enum UidChoice {
    /// The stored uid (or "u1" when nothing is stored).
    Current,
    Fixed(usize),
}

#[derive(Debug, Clone, Copy)]
enum VersionChoice {
    Empty,
    /// The stored version (or "1" when nothing is stored).
    Current,
    Stale(u64),
}

#[derive(Debug, Clone, Copy)]
enum Start {
    Snapshot,
    /// applied index + offset, at least 1.
    Revision(i64),
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        key: KeyChoice,
        uid: UidChoice,
        group_version: usize,
        version: VersionChoice,
        owner: Option<(KeyChoice, usize)>,
        payload: u8,
    },
    Delete {
        key: KeyChoice,
        uid: UidChoice,
        group_version: usize,
        version: VersionChoice,
    },
    Noop,
    Read {
        key: KeyChoice,
        uid: usize,
        group_version: usize,
        back: u64,
    },
    List {
        type_: usize,
        partition: usize,
        namespace: usize,
        prefix: usize,
        back: u64,
    },
    ListByOwner {
        key: KeyChoice,
        uid: usize,
    },
    Watch {
        type_: usize,
        partition: usize,
        namespace: usize,
        prefix: usize,
        start: Start,
    },
    Drain(usize),
    DropWatch(usize),
    Restore {
        gap: u64,
    },
    /// Writes, deletes and no-ops applied in one `Store::batch`.
    Batch(Vec<Op>),
}

fn written_key() -> impl Strategy<Value = KeyChoice> {
    (0..WRITTEN_TYPES, 0..2usize, 0..2usize, 0..NAMES.len()).prop_map(
        |(type_, partition, namespace, name)| KeyChoice {
            type_,
            partition,
            namespace,
            name,
        },
    )
}

fn uid_choice() -> impl Strategy<Value = UidChoice> {
    prop_oneof![
        3 => Just(UidChoice::Current),
        1 => (0..UIDS.len()).prop_map(UidChoice::Fixed),
    ]
}

fn version_choice() -> impl Strategy<Value = VersionChoice> {
    prop_oneof![
        2 => Just(VersionChoice::Empty),
        4 => Just(VersionChoice::Current),
        1 => (1..60u64).prop_map(VersionChoice::Stale),
    ]
}

fn write_op() -> impl Strategy<Value = Op> {
    (
        written_key(),
        uid_choice(),
        0..GROUP_VERSIONS.len(),
        version_choice(),
        proptest::option::of((written_key(), 1..UIDS.len())),
        any::<u8>(),
    )
        .prop_map(
            |(key, uid, group_version, version, owner, payload)| Op::Write {
                key,
                uid,
                group_version,
                version,
                owner,
                payload,
            },
        )
}

fn delete_op() -> impl Strategy<Value = Op> {
    (
        written_key(),
        uid_choice(),
        0..GROUP_VERSIONS.len(),
        version_choice(),
    )
        .prop_map(|(key, uid, group_version, version)| Op::Delete {
            key,
            uid,
            group_version,
            version,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => proptest::collection::vec(
            prop_oneof![3 => write_op(), 2 => delete_op(), 1 => Just(Op::Noop)],
            1..6
        )
        .prop_map(Op::Batch),
        10 => (
            written_key(),
            uid_choice(),
            0..GROUP_VERSIONS.len(),
            version_choice(),
            proptest::option::of((written_key(), 1..UIDS.len())),
            any::<u8>()
        )
            .prop_map(|(key, uid, group_version, version, owner, payload)| Op::Write {
                key,
                uid,
                group_version,
                version,
                owner,
                payload
            }),
        4 => (written_key(), uid_choice(), 0..GROUP_VERSIONS.len(), version_choice()).prop_map(
            |(key, uid, group_version, version)| Op::Delete {
                key,
                uid,
                group_version,
                version
            }
        ),
        1 => Just(Op::Noop),
        3 => (written_key(), 0..UIDS.len(), 0..GROUP_VERSIONS.len(), 0..12u64).prop_map(
            |(key, uid, group_version, back)| Op::Read {
                key,
                uid,
                group_version,
                back
            }
        ),
        3 => (0..TYPES.len(), 0..PARTITIONS.len(), 0..NAMESPACES.len(), 0..PREFIXES.len(), 0..12u64)
            .prop_map(|(type_, partition, namespace, prefix, back)| Op::List {
                type_,
                partition,
                namespace,
                prefix,
                back
            }),
        1 => (written_key(), 0..UIDS.len()).prop_map(|(key, uid)| Op::ListByOwner { key, uid }),
        2 => (
            0..TYPES.len(),
            0..PARTITIONS.len(),
            0..NAMESPACES.len(),
            0..PREFIXES.len(),
            prop_oneof![
                2 => Just(Start::Snapshot),
                1 => (-10..3i64).prop_map(Start::Revision)
            ]
        )
            .prop_map(|(type_, partition, namespace, prefix, start)| Op::Watch {
                type_,
                partition,
                namespace,
                prefix,
                start
            }),
        3 => any::<usize>().prop_map(Op::Drain),
        1 => any::<usize>().prop_map(Op::DropWatch),
        1 => (0..3u64).prop_map(|gap| Op::Restore { gap }),
    ]
}

fn key_tuple(k: KeyChoice) -> ModelKey {
    let (g, kind) = TYPES[k.type_];
    (
        g.into(),
        kind.into(),
        PARTITIONS[k.partition].into(),
        NAMESPACES[k.namespace].into(),
        NAMES[k.name].into(),
    )
}

fn make_id(k: KeyChoice, uid: &str, group_version: &str) -> Id {
    let (g, kind) = TYPES[k.type_];
    full_id(
        uid,
        NAMES[k.name],
        ty(g, group_version, kind),
        tenancy(PARTITIONS[k.partition], NAMESPACES[k.namespace]),
    )
}

fn key_of(r: &Resource) -> ModelKey {
    let id = r.id.as_ref().expect("stored resources have ids");
    let t = id.r#type.clone().unwrap_or_default();
    let ten = id.tenancy.clone().unwrap_or_default();
    (
        t.group,
        t.kind,
        ten.partition,
        ten.namespace,
        id.name.clone(),
    )
}

fn list_matches(r: &Resource, type_: &Type, ten: &Tenancy, prefix: &str) -> bool {
    let (g, k, p, ns, name) = key_of(r);
    g == type_.group
        && k == type_.kind
        && (ten.partition == "*" || ten.partition == p)
        && (ten.namespace == "*" || ten.namespace == ns)
        && name.starts_with(prefix)
}

fn owner_matches(r: &Resource, owner: &Id) -> bool {
    let Some(o) = r.owner.as_ref() else {
        return false;
    };
    let ot = o.r#type.clone().unwrap_or_default();
    let qt = owner.r#type.clone().unwrap_or_default();
    ot.group == qt.group
        && ot.kind == qt.kind
        && o.tenancy == owner.tenancy
        && o.name == owner.name
        && o.uid == owner.uid
}

/// A watch under test and what the model says it must deliver.
struct ModelWatch {
    actual: Watch,
    filter: WatchFilter,
    /// Events not yet drained, in order.
    expected: VecDeque<(WatchEventKind, Option<Resource>, u64)>,
    /// Live events sent to the buffer and not drained yet.
    buffered_live: usize,
    /// Live events at or below this revision are skipped by the consumer.
    skip_through: u64,
    closed: Option<String>,
}

struct Model {
    limits: Limits,
    table: Table,
    applied: u64,
    /// Changes since the last restore: (revision, key).
    changes: Vec<(u64, ModelKey)>,
    base_revision: u64,
    /// The table after every entry since the last restore (and at the base).
    tables: Vec<(u64, Table)>,
    watches: Vec<ModelWatch>,
}

impl Model {
    fn new(limits: Limits) -> Model {
        Model {
            limits,
            table: Table::new(),
            applied: 0,
            changes: Vec::new(),
            base_revision: 0,
            tables: vec![(0, Table::new())],
            watches: Vec::new(),
        }
    }

    fn oldest_retained(&self) -> u64 {
        let max = self.limits.history_changes_max;
        if self.changes.len() > max {
            self.changes[self.changes.len() - max - 1].0
        } else {
            self.base_revision
        }
    }

    fn table_at(&self, revision: u64) -> &Table {
        let i = self.tables.partition_point(|(r, _)| *r <= revision);
        &self.tables[i - 1].1
    }

    /// The view revision for "back" steps behind the latest (0 = latest).
    fn revision_back(&self, back: u64) -> u64 {
        if back == 0 || back >= self.applied {
            0
        } else {
            self.applied - back
        }
    }

    fn view_at(&self, revision: u64) -> Result<(u64, &Table), FsmError> {
        let r = if revision == 0 {
            self.applied
        } else {
            revision
        };
        if r < self.oldest_retained() {
            return Err(FsmError::Compacted {
                oldest_retained_revision: self.oldest_retained(),
            });
        }
        Ok((r, self.table_at(r)))
    }

    fn advance(&mut self) -> u64 {
        self.applied += 1;
        self.applied
    }

    fn record(&mut self, key: ModelKey, before: Option<Resource>, after: Option<Resource>) {
        let revision = self.applied;
        self.changes.push((revision, key));
        let (kind, subject) = match (&after, &before) {
            (Some(a), _) => (WatchEventKind::Upsert, a.clone()),
            (None, Some(b)) => (WatchEventKind::Delete, b.clone()),
            (None, None) => unreachable!(),
        };
        let cap = self.limits.watch_buffer_events;
        for w in &mut self.watches {
            if w.closed.is_some()
                || !list_matches(
                    &subject,
                    &w.filter.type_,
                    &w.filter.tenancy,
                    &w.filter.name_prefix,
                )
            {
                continue;
            }
            if w.buffered_live == cap {
                w.closed = Some("lagging".into());
                continue;
            }
            w.buffered_live += 1;
            if revision > w.skip_through {
                w.expected
                    .push_back((kind, Some(subject.clone()), revision));
            }
        }
    }

    fn end_entry(&mut self) {
        self.tables.push((self.applied, self.table.clone()));
    }

    fn write(&mut self, r: Resource) -> Result<Applied, FsmError> {
        let index = self.advance();
        let key = key_of(&r);
        let result = match self.table.get(&key) {
            None if !r.version.is_empty() => Err(FsmError::CasFailure {
                expected: r.version.clone(),
                stored: None,
            }),
            Some(s) if s.id.as_ref().unwrap().uid != r.id.as_ref().unwrap().uid => {
                Err(FsmError::WrongUid {
                    given: r.id.as_ref().unwrap().uid.clone(),
                    stored: s.id.as_ref().unwrap().uid.clone(),
                })
            }
            Some(s) if s.version != r.version => Err(FsmError::CasFailure {
                expected: r.version.clone(),
                stored: Some(s.version.clone()),
            }),
            _ => {
                let mut stored = r;
                stored.version = index.to_string();
                let before = self.table.insert(key.clone(), stored.clone());
                self.record(key, before, Some(stored.clone()));
                Ok(Applied::Written(StoredResource::from_resource(&stored)))
            }
        };
        self.end_entry();
        result
    }

    fn delete(&mut self, id: &Id, version: &str) -> Result<Applied, FsmError> {
        self.advance();
        let t = id.r#type.clone().unwrap_or_default();
        let ten = id.tenancy.clone().unwrap_or_default();
        let key = (
            t.group,
            t.kind,
            ten.partition,
            ten.namespace,
            id.name.clone(),
        );
        let result = match self.table.get(&key) {
            None => Ok(Applied::Deleted { existed: false }),
            Some(s) if s.id.as_ref().unwrap().uid != id.uid => {
                Ok(Applied::Deleted { existed: false })
            }
            Some(s) if s.version != version => Err(FsmError::CasFailure {
                expected: version.into(),
                stored: Some(s.version.clone()),
            }),
            Some(_) => {
                let before = self.table.remove(&key);
                self.record(key, before, None);
                Ok(Applied::Deleted { existed: true })
            }
        };
        self.end_entry();
        result
    }

    fn read(table: &Table, id: &Id) -> Result<Resource, FsmError> {
        let t = id.r#type.clone().unwrap_or_default();
        let ten = id.tenancy.clone().unwrap_or_default();
        let key = (
            t.group.clone(),
            t.kind.clone(),
            ten.partition,
            ten.namespace,
            id.name.clone(),
        );
        let Some(s) = table.get(&key) else {
            return Err(FsmError::NotFound);
        };
        let sid = s.id.as_ref().unwrap();
        if !id.uid.is_empty() && id.uid != sid.uid {
            return Err(FsmError::NotFound);
        }
        if sid.r#type.as_ref().unwrap().group_version != t.group_version {
            return Err(FsmError::GroupVersionMismatch {
                requested: t,
                stored: StoredResource::from_resource(s),
            });
        }
        Ok(s.clone())
    }
}

/// The resources, decoded: so every comparison with the model also checks
/// that the stored bytes decode to exactly the resource written.
fn sorted(resources: Vec<StoredResource>) -> Vec<Resource> {
    let mut v: Vec<Resource> = resources.iter().map(StoredResource::resource).collect();
    v.sort_by_key(key_of);
    v
}

fn resolve_uid(model: &Model, key: &ModelKey, choice: UidChoice) -> String {
    match choice {
        UidChoice::Current => model
            .table
            .get(key)
            .map(|r| r.id.as_ref().unwrap().uid.clone())
            .unwrap_or_else(|| "u1".into()),
        UidChoice::Fixed(i) => UIDS[i].into(),
    }
}

fn resolve_version(model: &Model, key: &ModelKey, choice: VersionChoice) -> String {
    match choice {
        VersionChoice::Empty => String::new(),
        VersionChoice::Current => model
            .table
            .get(key)
            .map(|r| r.version.clone())
            .unwrap_or_else(|| "1".into()),
        VersionChoice::Stale(v) => v.to_string(),
    }
}

fn event_tuple(e: &Event) -> (WatchEventKind, Option<Resource>, u64) {
    (
        e.kind,
        e.resource.as_ref().map(StoredResource::resource),
        e.revision,
    )
}

/// Checks that hold after every step: the applied index, the retained
/// window, the registry size, and the whole table at every retained revision.
fn check_invariants(store: &Store, model: &Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(store.applied_index(), model.applied);
    prop_assert_eq!(store.oldest_retained_revision(), model.oldest_retained());
    let open = model.watches.iter().filter(|w| w.closed.is_none()).count();
    prop_assert_eq!(store.watch_count(), open);
    let from = model.oldest_retained().max(1);
    for r in from..=model.applied {
        let view = store
            .view_at(r)
            .map_err(|e| TestCaseError::fail(format!("view_at({r}): {e}")))?;
        prop_assert_eq!(view.revision(), r);
        let actual: Vec<Resource> = view.iter().map(StoredResource::resource).collect();
        let expected: Vec<Resource> = model.table_at(r).values().cloned().collect();
        prop_assert_eq!(actual, expected, "table at revision {}", r);
    }
    if model.oldest_retained() > 1 {
        let r = model.oldest_retained() - 1;
        let is_compacted = matches!(store.view_at(r), Err(FsmError::Compacted { .. }));
        prop_assert!(is_compacted);
    }
    Ok(())
}

/// Where mutations go: straight to the store, or into an open batch.
enum Target<'a, 'b> {
    Store(&'a Store),
    Batch(&'a mut Batch<'b>),
}

impl Target<'_, '_> {
    fn apply(&mut self, index: u64, command: Command) -> Result<Applied, FsmError> {
        match self {
            Target::Store(s) => s.apply(index, &command),
            Target::Batch(b) => b.apply_owned(index, command),
        }
    }

    fn noop(&mut self, index: u64) {
        match self {
            Target::Store(s) => s.apply_noop(index),
            Target::Batch(b) => b.apply_noop(index),
        }
    }
}

/// Applies a write, delete or no-op to the model and the target, comparing results.
fn mutate(op: Op, model: &mut Model, target: &mut Target<'_, '_>) -> Result<(), TestCaseError> {
    match op {
        Op::Write {
            key,
            uid,
            group_version,
            version,
            owner,
            payload,
        } => {
            let k = key_tuple(key);
            let uid = resolve_uid(model, &k, uid);
            let version = resolve_version(model, &k, version);
            let mut r = resource(make_id(key, &uid, GROUP_VERSIONS[group_version]), &version);
            r.generation = payload.to_string();
            r.owner = owner
                .map(|(o, u)| Box::new(make_id(o, UIDS[u], GROUP_VERSIONS[payload as usize % 2])));
            let expected = model.write(r.clone());
            let actual = target.apply(model.applied, Command::Write { resource: r });
            prop_assert_eq!(actual, expected);
        }
        Op::Delete {
            key,
            uid,
            group_version,
            version,
        } => {
            let k = key_tuple(key);
            let uid = resolve_uid(model, &k, uid);
            let version = resolve_version(model, &k, version);
            let id = make_id(key, &uid, GROUP_VERSIONS[group_version]);
            let expected = model.delete(&id, &version);
            let actual = target.apply(
                model.applied,
                Command::Delete {
                    id,
                    version,
                    now_ms: 0,
                    orphan: false,
                },
            );
            prop_assert_eq!(actual, expected);
        }
        Op::Noop => {
            model.advance();
            model.end_entry();
            target.noop(model.applied);
        }
        other => unreachable!("not a mutation: {other:?}"),
    }
    Ok(())
}

fn run(limits: Limits, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let store = Store::new(limits.clone());
    let mut model = Model::new(limits);
    for op in ops {
        match op {
            op @ (Op::Write { .. } | Op::Delete { .. } | Op::Noop) => {
                mutate(op, &mut model, &mut Target::Store(&store))?;
            }
            Op::Batch(ops) => {
                let mut batch = store.batch();
                for op in ops {
                    mutate(op, &mut model, &mut Target::Batch(&mut batch))?;
                }
                batch.finish();
            }
            Op::Read {
                key,
                uid,
                group_version,
                back,
            } => {
                let revision = model.revision_back(back);
                let id = make_id(key, UIDS[uid], GROUP_VERSIONS[group_version]);
                match (store.view_at(revision), model.view_at(revision)) {
                    (Ok(view), Ok((r, table))) => {
                        prop_assert_eq!(view.revision(), r);
                        let actual = view.read(&id).map(|r| r.resource());
                        prop_assert_eq!(actual, Model::read(table, &id));
                    }
                    (Err(a), Err(e)) => prop_assert_eq!(a, e),
                    (a, e) => prop_assert!(
                        false,
                        "view_at: {:?} vs {:?}",
                        a.map(|v| v.revision()),
                        e.map(|v| v.0)
                    ),
                }
            }
            Op::List {
                type_,
                partition,
                namespace,
                prefix,
                back,
            } => {
                let revision = model.revision_back(back);
                let (g, k) = TYPES[type_];
                let t = ty(g, "any", k);
                let ten = tenancy(PARTITIONS[partition], NAMESPACES[namespace]);
                match (store.view_at(revision), model.view_at(revision)) {
                    (Ok(view), Ok((_, table))) => {
                        let actual = sorted(view.list(&t, &ten, PREFIXES[prefix]));
                        let expected: Vec<Resource> = table
                            .values()
                            .filter(|r| list_matches(r, &t, &ten, PREFIXES[prefix]))
                            .cloned()
                            .collect();
                        prop_assert_eq!(actual, expected);
                    }
                    (Err(a), Err(e)) => prop_assert_eq!(a, e),
                    (a, e) => prop_assert!(
                        false,
                        "view_at: {:?} vs {:?}",
                        a.map(|v| v.revision()),
                        e.map(|v| v.0)
                    ),
                }
            }
            Op::ListByOwner { key, uid } => {
                let owner = make_id(key, UIDS[uid], "v-ignored");
                let actual = sorted(store.view().list_by_owner(&owner));
                let expected: Vec<Resource> = model
                    .table
                    .values()
                    .filter(|r| owner_matches(r, &owner))
                    .cloned()
                    .collect();
                prop_assert_eq!(actual, expected);
            }
            Op::Watch {
                type_,
                partition,
                namespace,
                prefix,
                start,
            } => {
                let (g, k) = TYPES[type_];
                let filter = WatchFilter {
                    type_: ty(g, "", k),
                    tenancy: tenancy(PARTITIONS[partition], NAMESPACES[namespace]),
                    name_prefix: PREFIXES[prefix].into(),
                    selector: None,
                };
                let start_revision = match start {
                    Start::Snapshot => 0,
                    Start::Revision(offset) => (model.applied as i64 + offset).max(1) as u64,
                };
                let mut expected = VecDeque::new();
                if start_revision == 0 {
                    for r in model.table.values() {
                        if list_matches(r, &filter.type_, &filter.tenancy, &filter.name_prefix) {
                            expected.push_back((
                                WatchEventKind::Upsert,
                                Some(r.clone()),
                                model.applied,
                            ));
                        }
                    }
                    expected.push_back((WatchEventKind::EndOfSnapshot, None, model.applied));
                } else if start_revision < model.oldest_retained() {
                    let actual = store.watch(filter, start_revision).map(|_| ());
                    prop_assert_eq!(
                        actual,
                        Err(FsmError::Compacted {
                            oldest_retained_revision: model.oldest_retained()
                        })
                    );
                    continue;
                } else {
                    for (revision, key) in &model.changes {
                        if *revision <= start_revision {
                            continue;
                        }
                        let before = model.table_at(revision - 1).get(key);
                        let after = model.table_at(*revision).get(key);
                        let (kind, subject) = match (after, before) {
                            (Some(a), _) => (WatchEventKind::Upsert, a),
                            (None, Some(b)) => (WatchEventKind::Delete, b),
                            (None, None) => unreachable!(),
                        };
                        if list_matches(
                            subject,
                            &filter.type_,
                            &filter.tenancy,
                            &filter.name_prefix,
                        ) {
                            expected.push_back((kind, Some(subject.clone()), *revision));
                        }
                    }
                }
                let actual = store
                    .watch(filter.clone(), start_revision)
                    .map_err(|e| TestCaseError::fail(format!("watch: {e}")))?;
                model.watches.push(ModelWatch {
                    actual,
                    filter,
                    expected,
                    buffered_live: 0,
                    skip_through: start_revision,
                    closed: None,
                });
            }
            Op::Drain(i) => {
                if model.watches.is_empty() {
                    continue;
                }
                let n = model.watches.len();
                let w = &mut model.watches[i % n];
                let (events, closed) = drain(&mut w.actual);
                let actual: Vec<_> = events.iter().map(event_tuple).collect();
                let expected: Vec<_> = w.expected.drain(..).collect();
                prop_assert_eq!(actual, expected);
                prop_assert_eq!(
                    closed,
                    w.closed
                        .clone()
                        .map(|reason| FsmError::WatchClosed { reason })
                );
                w.buffered_live = 0;
            }
            Op::DropWatch(i) => {
                if !model.watches.is_empty() {
                    let n = model.watches.len();
                    drop(model.watches.remove(i % n));
                }
            }
            Op::Restore { gap } => {
                let snapshot = store.snapshot();
                prop_assert_eq!(snapshot.applied_index, model.applied);
                prop_assert_eq!(snapshot.len(), model.table.len());
                let mut restoration = store.restore();
                let mut image = Vec::new();
                for r in snapshot {
                    image.push(r.resource());
                    restoration
                        .apply(r.resource())
                        .map_err(|e| TestCaseError::fail(format!("restore apply: {e}")))?;
                }
                let expected: Vec<Resource> = model.table.values().cloned().collect();
                prop_assert_eq!(image, expected);
                let index = model.applied + gap;
                restoration
                    .commit(index)
                    .map_err(|e| TestCaseError::fail(format!("commit: {e}")))?;
                model.applied = index;
                model.base_revision = index;
                model.changes.clear();
                model.tables = vec![(index, model.table.clone())];
                for w in &mut model.watches {
                    if w.closed.is_none() {
                        w.closed = Some("restore".into());
                    }
                }
            }
        }
        check_invariants(&store, &model)?;
    }
    // Every watch's remaining stream matches at the end.
    for w in &mut model.watches {
        let (events, closed) = drain(&mut w.actual);
        let actual: Vec<_> = events.iter().map(event_tuple).collect();
        let expected: Vec<_> = w.expected.drain(..).collect();
        prop_assert_eq!(actual, expected);
        prop_assert_eq!(
            closed,
            w.closed
                .clone()
                .map(|reason| FsmError::WatchClosed { reason })
        );
    }
    Ok(())
}

fn limits() -> impl Strategy<Value = Limits> {
    (
        prop_oneof![Just(0usize), Just(1), Just(3), Just(8), Just(100_000)],
        prop_oneof![Just(1usize), Just(2), Just(5), Just(4096)],
    )
        .prop_map(|(history_changes_max, watch_buffer_events)| Limits {
            history_changes_max,
            watch_buffer_events,
            ..Limits::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_store_behaves_like_the_naive_model(
        limits in limits(),
        ops in proptest::collection::vec(op(), 50..80),
    ) {
        // Random sequences of writes, deletes, reads, lists, watches and restores agree with the model.
        run(limits, ops)?;
    }
}
