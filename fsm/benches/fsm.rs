//! Criterion benches of the fsm hot paths: apply, point reads, lists,
//! watch fan-out. Run: `cargo bench -p cairn-fsm --bench fsm`.
//!
//! Every bench reports the *CPU time of the benchmark thread*
//! (`CLOCK_THREAD_CPUTIME_ID`), not wall time: the machines these run on are
//! shared, and CPU time leaves out the time the thread waits for a core. Set
//! `CAIRN_BENCH_WALL=1` to measure wall time instead.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_fsm::{Applied, Command, Limits, Store, Watch, WatchFilter};
use cairn_proto::google::protobuf::Any;
use cairn_proto::v1::{Id, Resource, Tenancy, Type};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const TABLE_LEN: u64 = 10_000;

/// A clock for one thread: its CPU time, or wall time when CAIRN_BENCH_WALL is set.
#[derive(Clone, Copy)]
struct Clock {
    wall: bool,
}

/// A start point of [`Clock`].
enum Mark {
    Wall(Instant),
    Cpu(Duration),
}

fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; the clock id is valid on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "CLOCK_THREAD_CPUTIME_ID is available");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

impl Clock {
    fn from_env() -> Clock {
        Clock {
            wall: std::env::var_os("CAIRN_BENCH_WALL").is_some(),
        }
    }

    fn start(self) -> Mark {
        if self.wall {
            Mark::Wall(Instant::now())
        } else {
            Mark::Cpu(thread_cpu_time())
        }
    }

    fn elapsed(self, mark: Mark) -> Duration {
        match mark {
            Mark::Wall(t) => t.elapsed(),
            Mark::Cpu(t) => thread_cpu_time().saturating_sub(t),
        }
    }

    /// Times `iters` calls of `f`.
    fn time<R>(self, iters: u64, mut f: impl FnMut() -> R) -> Duration {
        let mark = self.start();
        for _ in 0..iters {
            black_box(f());
        }
        self.elapsed(mark)
    }
}

fn id(kind: &str, i: u64) -> Id {
    Id {
        uid: "01HQZX3V9K5W2M8N4P6R7T0Y1A".into(),
        name: format!("service-{i:06}"),
        r#type: Some(Type {
            group: "catalog".into(),
            group_version: "v2beta1".into(),
            kind: kind.into(),
        }),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }),
    }
}

fn resource(kind: &str, i: u64, version: &str) -> Resource {
    Resource {
        id: Some(id(kind, i)),
        version: version.into(),
        data: Some(Any {
            type_url: "type.googleapis.com/hashicorp.consul.catalog.v2beta1.Service".into(),
            value: Bytes::from(vec![0xab; 256]),
        }),
        ..Default::default()
    }
}

/// A store holding `TABLE_LEN` resources of kind "Service"; returns it, the
/// next log index and every resource's current version.
fn populated(limits: Limits) -> (Store, u64, Vec<String>) {
    let store = Store::new(limits);
    let mut versions = Vec::with_capacity(TABLE_LEN as usize);
    for i in 0..TABLE_LEN {
        let index = i + 1;
        match store.apply(
            index,
            &Command::Write {
                resource: resource("Service", i, ""),
            },
        ) {
            Ok(Applied::Written(r)) => versions.push(r.version().to_string()),
            other => panic!("populate: {other:?}"),
        }
    }
    (store, TABLE_LEN + 1, versions)
}

/// The updates that a run of `count` entries will apply: each a CAS write of
/// the next slot with the version it will hold by then (versions are log
/// indexes, so they are known in advance).
struct Updates {
    next_index: u64,
    versions: Vec<String>,
    slot: u64,
}

impl Updates {
    fn batch(&mut self, count: u64) -> (u64, Vec<Command>) {
        let first_index = self.next_index;
        let commands = (0..count)
            .map(|_| {
                self.slot = (self.slot + 7919) % TABLE_LEN;
                let version = std::mem::replace(
                    &mut self.versions[self.slot as usize],
                    self.next_index.to_string(),
                );
                self.next_index += 1;
                Command::Write {
                    resource: resource("Service", self.slot, &version),
                }
            })
            .collect();
        (first_index, commands)
    }
}

fn updates(limits: Limits) -> (Store, Updates) {
    let (store, next_index, versions) = populated(limits);
    (
        store,
        Updates {
            next_index,
            versions,
            slot: 0,
        },
    )
}

fn check(applied: Result<Applied, cairn_fsm::FsmError>) {
    assert!(matches!(applied, Ok(Applied::Written(_))), "{applied:?}");
}

fn bench_apply(c: &mut Criterion) {
    let clock = Clock::from_env();
    let mut group = c.benchmark_group("apply");
    group.throughput(Throughput::Elements(1));

    // A CAS update of a 256-byte resource in a 10k table (borrowed command:
    // the store copies the resource once). Only the applies are timed.
    group.bench_function("update_256B_borrowed", |b| {
        let (store, mut u) = updates(Limits::default());
        b.iter_custom(|iters| {
            let (first, commands) = u.batch(iters);
            let mark = clock.start();
            for (i, command) in commands.iter().enumerate() {
                check(store.apply(first + i as u64, command));
            }
            clock.elapsed(mark)
        })
    });

    // The same updates applied 64 entries per `Store::batch` (one publish per
    // batch), as the node does with the entries of one Raft apply call.
    group.bench_function("update_256B_batches_of_64", |b| {
        let (store, mut u) = updates(Limits::default());
        b.iter_custom(|iters| {
            let (first, commands) = u.batch(iters);
            let mark = clock.start();
            for (n, chunk) in commands.chunks(64).enumerate() {
                let mut batch = store.batch();
                for (i, command) in chunk.iter().enumerate() {
                    check(batch.apply(first + (n * 64 + i) as u64, command));
                }
                batch.finish();
            }
            clock.elapsed(mark)
        })
    });

    // The whole path of a log entry: decode the payload, apply it by value.
    group.bench_function("decode_and_apply_owned_256B", |b| {
        let (store, mut u) = updates(Limits::default());
        b.iter_custom(|iters| {
            let (first, commands) = u.batch(iters);
            let payloads: Vec<Bytes> = commands.iter().map(Command::encode).collect();
            let mark = clock.start();
            for (i, payload) in payloads.iter().enumerate() {
                let command = Command::decode(payload).expect("decodes");
                check(store.apply_owned(first + i as u64, command));
            }
            clock.elapsed(mark)
        })
    });

    // Encoding alone (the proposer's side).
    let command = Command::Write {
        resource: resource("Service", 1, "5"),
    };
    group.bench_function("encode_256B", |b| {
        b.iter_custom(|iters| clock.time(iters, || command.encode()))
    });
    group.finish();
}

fn bench_read(c: &mut Criterion) {
    let clock = Clock::from_env();
    let mut group = c.benchmark_group("read");
    group.throughput(Throughput::Elements(1));
    let ids: Vec<Id> = (0..TABLE_LEN).map(|i| id("Service", i)).collect();
    group.bench_function("point_read_latest_view_10k", |b| {
        let (store, _, _) = populated(Limits::default());
        let mut i = 0usize;
        b.iter_custom(|iters| {
            clock.time(iters, || {
                i = (i + 7919) % ids.len();
                store.view().read(&ids[i]).expect("found")
            })
        })
    });
    group.bench_function("point_read_held_view_10k", |b| {
        let (store, _, _) = populated(Limits::default());
        let view = store.view();
        let mut i = 0usize;
        b.iter_custom(|iters| {
            clock.time(iters, || {
                i = (i + 7919) % ids.len();
                view.read(&ids[i]).expect("found")
            })
        })
    });
    group.finish();
}

fn services() -> Type {
    Type {
        group: "catalog".into(),
        group_version: String::new(),
        kind: "Service".into(),
    }
}

fn tenancy(partition: &str, namespace: &str) -> Tenancy {
    Tenancy {
        partition: partition.into(),
        namespace: namespace.into(),
    }
}

fn bench_list(c: &mut Criterion) {
    let clock = Clock::from_env();
    let mut group = c.benchmark_group("list");
    group.throughput(Throughput::Elements(TABLE_LEN));
    group.bench_function("list_10k_of_10k", |b| {
        let (store, _, _) = populated(Limits::default());
        let exact = tenancy("default", "default");
        b.iter_custom(|iters| {
            clock.time(iters, || {
                let listed = store.view().list(&services(), &exact, "");
                assert_eq!(listed.len() as u64, TABLE_LEN);
                listed
            })
        })
    });
    group.bench_function("list_10k_of_10k_wildcard_tenancy", |b| {
        let (store, _, _) = populated(Limits::default());
        let any = tenancy("*", "*");
        b.iter_custom(|iters| {
            clock.time(iters, || {
                let listed = store.view().list(&services(), &any, "");
                assert_eq!(listed.len() as u64, TABLE_LEN);
                listed
            })
        })
    });
    // A wildcard partition with a literal namespace and a name prefix: the
    // scan covers the type and every key is filtered.
    group.bench_function("list_10k_of_10k_filtered", |b| {
        let (store, _, _) = populated(Limits::default());
        let any_partition = tenancy("*", "default");
        b.iter_custom(|iters| {
            clock.time(iters, || {
                let listed = store.view().list(&services(), &any_partition, "service-");
                assert_eq!(listed.len() as u64, TABLE_LEN);
                listed
            })
        })
    });
    group.bench_function("snapshot_iterate_10k", |b| {
        let (store, _, _) = populated(Limits::default());
        b.iter_custom(|iters| clock.time(iters, || store.snapshot().count()))
    });
    // Opening a watch and reading its 10k-resource snapshot to EndOfSnapshot.
    group.bench_function("watch_snapshot_10k", |b| {
        let (store, _, _) = populated(Limits::default());
        b.iter_custom(|iters| {
            clock.time(iters, || {
                let mut watch = store
                    .watch(
                        WatchFilter {
                            type_: services(),
                            tenancy: tenancy("default", "*"),
                            name_prefix: String::new(),
                            selector: None,
                        },
                        0,
                    )
                    .expect("watch");
                let mut n = 0u64;
                while let Ok(Some(e)) = watch.try_next() {
                    n += 1;
                    if e.resource.is_none() {
                        break;
                    }
                }
                assert_eq!(n, TABLE_LEN + 1);
                n
            })
        })
    });
    group.finish();
}

fn drain(watches: &mut [Watch]) {
    for w in watches {
        while let Ok(Some(_)) = w.try_next() {}
    }
}

fn bench_fan_out(c: &mut Criterion) {
    const WATCHERS: usize = 1_000;
    let clock = Clock::from_env();
    let mut group = c.benchmark_group("fan_out");
    group.throughput(Throughput::Elements(1));
    // One write delivered to 1,000 matching watchers (started from the
    // current revision: no snapshot). Only the applies are timed; the
    // watchers are drained between chunks (untimed) so none lags.
    group.bench_function("one_write_to_1000_watchers", |b| {
        let (store, mut u) = updates(Limits::default());
        let mut watches: Vec<Watch> = (0..WATCHERS)
            .map(|_| {
                store
                    .watch(
                        WatchFilter {
                            type_: services(),
                            tenancy: tenancy("default", "*"),
                            name_prefix: "service-".into(),
                            selector: None,
                        },
                        store.applied_index(),
                    )
                    .expect("watch")
            })
            .collect();
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let chunk = left.min(1_000);
                left -= chunk;
                let (first, commands) = u.batch(chunk);
                let mark = clock.start();
                for (i, command) in commands.iter().enumerate() {
                    check(store.apply(first + i as u64, command));
                }
                total += clock.elapsed(mark);
                drain(&mut watches);
            }
            total
        });
        assert_eq!(store.watch_count(), WATCHERS, "no watcher lagged");
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench_apply, bench_read, bench_list, bench_fan_out
}
criterion_main!(benches);
