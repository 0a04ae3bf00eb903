//! Readers, listers and watchers run on their own threads while one writer
//! applies entries. The writer's sequence is a known function of the index,
//! so every view can be checked against what its revision implies, and every
//! watch against the exact committed sequence.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use bytes::Bytes;
use cairn_fsm::{Applied, Batch, Command, Limits, Store, View, WatchEventKind};
use cairn_proto::google::protobuf::Any;
use cairn_proto::v1::Resource;
use common::{filter, full_id, resource, tenancy, ty};

const ENTRIES: u64 = 6_000;
const SLOTS: u64 = 16;

/// What the entry at `index` does.
enum Step {
    /// Increment counter `slot` (a CAS write on the counters kind).
    Increment(u64),
    /// Create scratch resource `s{index}`.
    CreateScratch,
    /// Delete scratch resource `s{index - 2}`.
    DeleteScratch,
    Noop,
}

fn step(index: u64) -> Step {
    match index % 10 {
        0 => Step::Noop,
        5 => Step::CreateScratch,
        7 => Step::DeleteScratch,
        _ => Step::Increment(index % SLOTS),
    }
}

/// How many increments entries 1..=revision made: the sum every view must hold.
fn increments_through(revision: u64) -> u64 {
    (1..=revision)
        .filter(|i| matches!(step(*i), Step::Increment(_)))
        .count() as u64
}

/// The scratch names present after `revision`.
fn scratch_through(revision: u64) -> Vec<String> {
    (1..=revision)
        .filter(|i| i % 10 == 5 && i + 2 > revision)
        .map(|i| format!("s{i}"))
        .collect()
}

fn counter_id(slot: u64) -> cairn_proto::v1::Id {
    full_id(
        "u",
        &format!("c{slot:02}"),
        ty("test", "v1", "Counter"),
        tenancy("p", "n"),
    )
}

fn scratch_id(index: u64) -> cairn_proto::v1::Id {
    full_id(
        "u",
        &format!("s{index}"),
        ty("test", "v1", "Scratch"),
        tenancy("p", "n"),
    )
}

fn counter_of(r: &Resource) -> u64 {
    let bytes = r.data.as_ref().map(|d| d.value.clone()).unwrap_or_default();
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(b)
}

fn with_counter(mut r: Resource, counter: u64) -> Resource {
    r.data = Some(Any {
        type_url: "counter".into(),
        value: Bytes::copy_from_slice(&counter.to_le_bytes()),
    });
    r
}

/// Applies every entry, in batches of 1 to 5 entries (a batch is published
/// as a whole, so views land on batch boundaries; events follow each batch).
fn write_all(store: &Store) {
    let mut versions: BTreeMap<u64, (String, u64)> = BTreeMap::new();
    let mut index = 1;
    while index <= ENTRIES {
        let batch_len = 1 + index % 5;
        let mut batch = store.batch();
        for _ in 0..batch_len {
            if index > ENTRIES {
                break;
            }
            apply_one(&mut batch, index, &mut versions);
            index += 1;
        }
        batch.finish();
    }
}

fn apply_one(batch: &mut Batch<'_>, index: u64, versions: &mut BTreeMap<u64, (String, u64)>) {
    match step(index) {
        Step::Noop => batch.apply_noop(index),
        Step::Increment(slot) => {
            let (version, counter) = versions.get(&slot).cloned().unwrap_or_default();
            let r = with_counter(resource(counter_id(slot), &version), counter + 1);
            match batch.apply_owned(index, Command::Write { resource: r }) {
                Ok(Applied::Written(r)) => {
                    versions.insert(slot, (r.version().to_string(), counter + 1));
                }
                other => panic!("increment at {index}: {other:?}"),
            }
        }
        Step::CreateScratch => {
            let r = resource(scratch_id(index), "");
            assert!(matches!(
                batch.apply(index, &Command::Write { resource: r }),
                Ok(Applied::Written(_))
            ));
        }
        Step::DeleteScratch => {
            let command = Command::Delete {
                id: scratch_id(index - 2),
                version: (index - 2).to_string(),
                now_ms: 0,
                orphan: false,
            };
            assert_eq!(
                batch.apply(index, &command),
                Ok(Applied::Deleted { existed: true })
            );
        }
    }
}

/// Everything a view at its revision must show.
fn check_view(view: &View) {
    let r = view.revision();
    let counters = view.list(&ty("test", "", "Counter"), &tenancy("*", "*"), "");
    let sum: u64 = counters.iter().map(|c| counter_of(&c.resource())).sum();
    assert_eq!(
        sum,
        increments_through(r),
        "sum of counters at revision {r}"
    );
    for c in &counters {
        assert!(
            c.version().parse::<u64>().unwrap() <= r,
            "no version from the future"
        );
        assert_eq!(&view.read(c.resource().id.as_ref().unwrap()).unwrap(), c);
    }
    let scratch: Vec<String> = view
        .list(&ty("test", "", "Scratch"), &tenancy("p", "n"), "s")
        .iter()
        .map(|s| s.head().name.to_string())
        .collect();
    assert_eq!(scratch, scratch_through(r), "scratch set at revision {r}");
}

#[test]
fn views_are_consistent_points_in_time_and_watches_see_exactly_the_committed_sequence() {
    // Concurrent readers, listers and watchers against one writer; every observation is checked.
    let store = Store::new(Limits {
        watch_buffer_events: 1 << 20,
        watch_buffer_bytes_max: 1 << 30,
        watch_buffers_bytes_max: 1 << 32,
        history_changes_max: 10_000,
        ..Limits::default()
    });
    let done = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();

    // Readers: latest views (monotonic) and past views within the history.
    for reader in 0..2 {
        let store = store.clone();
        let done = done.clone();
        handles.push(thread::spawn(move || {
            let mut last = 0;
            let mut checked = 0u64;
            while !done.load(Ordering::Acquire) || checked == 0 {
                let view = store.view();
                assert!(view.revision() >= last, "views never go back");
                last = view.revision();
                check_view(&view);
                if reader == 1 && last > 50 {
                    if let Ok(past) = store.view_at(last - 37) {
                        assert_eq!(past.revision(), last - 37);
                        check_view(&past);
                    }
                }
                checked += 1;
            }
            checked
        }));
    }

    // Watchers: each opens successive watches and replays them to the end.
    // Watchers start at staggered times so that some watches are opened mid-stream.
    for watcher_number in 0..4u64 {
        let store = store.clone();
        let watcher = watcher_number % 2;
        handles.push(thread::spawn(move || {
            thread::sleep(std::time::Duration::from_millis(3 * watcher_number));
            let mut rounds = 0u64;
            loop {
                let kind = if watcher == 0 { "Counter" } else { "Scratch" };
                let mut watch = store
                    .watch(filter(ty("test", "", kind), tenancy("*", "*"), ""), 0)
                    .unwrap();
                let mut state: BTreeMap<String, Resource> = BTreeMap::new();
                let eos_revision = loop {
                    let e = watch.next_blocking().unwrap();
                    match e.kind {
                        WatchEventKind::Upsert => {
                            let r = e.resource.unwrap();
                            state.insert(r.head().name.to_string(), r.resource());
                        }
                        WatchEventKind::EndOfSnapshot => break e.revision,
                        WatchEventKind::Delete => panic!("a delete inside a snapshot"),
                        WatchEventKind::Progress => panic!("a Progress nobody asked for"),
                    }
                };
                if watcher == 0 {
                    let sum: u64 = state.values().map(counter_of).sum();
                    assert_eq!(sum, increments_through(eos_revision));
                } else {
                    assert_eq!(
                        state.keys().cloned().collect::<Vec<_>>(),
                        scratch_through(eos_revision)
                    );
                }
                // The live events must be exactly the matching entries after the
                // snapshot, up to this round's target; then the watch is dropped
                // and a new one opened mid-stream.
                let target = (eos_revision + 700).min(ENTRIES);
                let expected: Vec<u64> = (eos_revision + 1..=target)
                    .filter(|i| match step(*i) {
                        Step::Increment(_) => watcher == 0,
                        Step::CreateScratch | Step::DeleteScratch => watcher == 1,
                        Step::Noop => false,
                    })
                    .collect();
                let mut seen_through = eos_revision;
                for want in expected {
                    let e = watch.next_blocking().unwrap();
                    seen_through = e.revision;
                    assert_eq!(e.revision, want, "no gap, no duplicate, commit order");
                    let r = e.resource.unwrap();
                    let name = r.head().name.to_string();
                    match e.kind {
                        WatchEventKind::Upsert => {
                            assert_eq!(r.version(), want.to_string());
                            state.insert(name, r.resource());
                        }
                        WatchEventKind::Delete => {
                            assert!(state.remove(&name).is_some());
                        }
                        WatchEventKind::EndOfSnapshot => panic!("a second EndOfSnapshot"),
                        WatchEventKind::Progress => panic!("a Progress nobody asked for"),
                    }
                }
                // What the watch rebuilt is the table at the last event's revision
                // (entries after it up to the target did not touch this kind).
                let past = store.view_at(seen_through).unwrap();
                let table: BTreeMap<String, Resource> = past
                    .list(&ty("test", "", kind), &tenancy("*", "*"), "")
                    .iter()
                    .map(|r| (r.head().name.to_string(), r.resource()))
                    .collect();
                assert_eq!(state, table, "watch state at revision {seen_through}");
                rounds += 1;
                if target == ENTRIES {
                    return rounds;
                }
            }
        }));
    }

    write_all(&store);
    done.store(true, Ordering::Release);
    for h in handles {
        assert!(h.join().unwrap() > 0);
    }
    check_view(&store.view());
    assert_eq!(store.watch_count(), 0);
}
