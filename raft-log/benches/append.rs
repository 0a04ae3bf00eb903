//! Durable appends per second on sled (one durability point per append) for batches of 1, 16
//! and 256 entries of 256 bytes, side by side with the physical limit measured in the same run
//! on the same disk: a raw `write` of the same number of bytes followed by `fdatasync`.
//! Also: batch-1 appends with 8 in flight (as openraft pipelines them), to show group commit.
//!
//! Run: `CARGO_TARGET_DIR=/work/target-raftlog cargo bench -p cairn-raft-log --bench append`
//! The files live in `CAIRN_BENCH_DIR` (default: the system temp dir).

use std::fs::OpenOptions;
use std::io::Cursor;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use cairn_raft_log::LogOptions;
use cairn_raft_log::LogStore;
use criterion::criterion_group;
use criterion::criterion_main;
use criterion::BenchmarkId;
use criterion::Criterion;
use criterion::Throughput;
use openraft::CommittedLeaderId;
use openraft::Entry;
use openraft::EntryPayload;
use openraft::LogId;
use serde::Deserialize;
use serde::Serialize;

/// Opaque command bytes, as the node's.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command(pub Vec<u8>);

openraft::declare_raft_types!(
    /// Bench type config.
    pub BenchConfig:
        D = Command,
        R = (),
);

const ENTRY_PAYLOAD_BYTES: usize = 256;
const BATCH_SIZES: [u64; 3] = [1, 16, 256];
const PIPELINE_DEPTH: usize = 8;
/// Size of the preallocated file of the in-place baseline.
const PREALLOCATED_BYTES: u64 = 64 * 1024 * 1024;

fn bench_dir() -> tempfile::TempDir {
    match std::env::var_os("CAIRN_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir).expect("tempdir in CAIRN_BENCH_DIR"),
        None => tempfile::tempdir().expect("tempdir"),
    }
}

fn entry(index: u64) -> Entry<BenchConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 0), index),
        payload: EntryPayload::Normal(Command(vec![(index % 251) as u8; ENTRY_PAYLOAD_BYTES])),
    }
}

fn appends(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("durable_append");
    group.sample_size(20);
    group.warm_up_time(Duration::from_secs(2));
    group.measurement_time(Duration::from_secs(6));

    for batch in BATCH_SIZES {
        group.throughput(Throughput::Elements(batch));

        // sled through LogStore: one append call = one batch + one durability point.
        let dir = bench_dir();
        let store =
            LogStore::<BenchConfig>::open(dir.path(), LogOptions::default()).expect("open store");
        let mut next_index = 1u64;
        group.bench_with_input(
            BenchmarkId::new("sled_logstore", batch),
            &batch,
            |b, &batch| {
                b.iter(|| {
                    let entries: Vec<_> = (next_index..next_index + batch).map(entry).collect();
                    next_index += batch;
                    runtime
                        .block_on(store.append_durable(entries))
                        .expect("append");
                })
            },
        );
        drop(store);

        // The physical limit, same bytes, same disk: one write + fdatasync per append. Two
        // flavours: appending to a growing file (each fdatasync also commits the new size in
        // the ext4 journal), and overwriting a preallocated file in place (data only).
        let raw_dir = bench_dir();
        let bytes = vec![0x5Au8; batch as usize * (ENTRY_PAYLOAD_BYTES + 32)];
        let mut growing = OpenOptions::new()
            .create(true)
            .append(true)
            .open(raw_dir.path().join("growing.log"))
            .expect("open raw file");
        group.bench_with_input(
            BenchmarkId::new("raw_append_fdatasync", batch),
            &batch,
            |b, _| {
                b.iter(|| {
                    growing.write_all(&bytes).expect("write");
                    growing.sync_data().expect("fdatasync");
                })
            },
        );
        let preallocated_path = raw_dir.path().join("preallocated.log");
        let preallocated = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&preallocated_path)
            .expect("open preallocated file");
        let slots = (PREALLOCATED_BYTES / bytes.len() as u64).max(1);
        preallocated
            .write_all_at(&vec![0u8; (slots * bytes.len() as u64) as usize], 0)
            .expect("preallocate");
        preallocated.sync_all().expect("fsync preallocated");
        let mut slot = 0u64;
        group.bench_with_input(
            BenchmarkId::new("raw_overwrite_fdatasync", batch),
            &batch,
            |b, _| {
                b.iter(|| {
                    preallocated
                        .write_all_at(&bytes, (slot % slots) * bytes.len() as u64)
                        .expect("write");
                    preallocated.sync_data().expect("fdatasync");
                    slot += 1;
                })
            },
        );
    }

    // Group commit: batch-1 appends with several in flight share durability points.
    group.throughput(Throughput::Elements(1));
    let dir = bench_dir();
    let store =
        LogStore::<BenchConfig>::open(dir.path(), LogOptions::default()).expect("open store");
    let mut next_index = 1u64;
    group.bench_function(
        BenchmarkId::new("sled_logstore_pipelined_8_in_flight", 1),
        |b| {
            b.iter_custom(|iterations| {
                runtime.block_on(async {
                    let slots = Arc::new(tokio::sync::Semaphore::new(PIPELINE_DEPTH));
                    let started = Instant::now();
                    for _ in 0..iterations {
                        let permit = Arc::clone(&slots).acquire_owned().await.expect("semaphore");
                        let entries = vec![entry(next_index)];
                        next_index += 1;
                        store
                            .append_with_callback(
                                entries,
                                Box::new(move |result| {
                                    result.expect("durable");
                                    drop(permit);
                                }),
                            )
                            .await
                            .expect("append");
                    }
                    // Wait for the last appends to become durable.
                    let _all = slots
                        .acquire_many(PIPELINE_DEPTH as u32)
                        .await
                        .expect("drain");
                    started.elapsed()
                })
            })
        },
    );
    drop(store);
    group.finish();
}

/// Keeps `Cursor` (used by `declare_raft_types!`) referenced.
#[allow(dead_code)]
type SnapshotData = Cursor<Vec<u8>>;

criterion_group!(benches, appends);
criterion_main!(benches);
