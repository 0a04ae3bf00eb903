//! Durable appends of 512-byte entries, one append call and its durability point per
//! iteration, for batches of 1 and 256 entries: the WAL and sled through `LogStore`, side by
//! side with the physical limit measured in the same run on the same disk — one `write` of
//! the same number of bytes plus `fdatasync`, three ways: appending to a growing file,
//! writing into a freshly `fallocate`d file (what the WAL does), and overwriting blocks that
//! were already written. Also: batch-1 appends with 8 in flight (as openraft pipelines them),
//! to show group commit.
//!
//! Run: `cargo bench -p cairn-raft-log --bench append` (add `-- --quick` for a short run).
//! The files live in `CAIRN_BENCH_DIR` (default: the system temp dir).

use std::fs::OpenOptions;
use std::io::Cursor;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use cairn_raft_log::LogEngineKind;
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

const ENTRY_PAYLOAD_BYTES: usize = 512;
/// A WAL frame's bytes beyond the payload: 24-byte header, the entry's log id and enum tags
/// (about 8 bytes), padding.
const FRAME_OVERHEAD_BYTES: usize = 32;
/// The commit frame closing every batch.
const COMMIT_FRAME_BYTES: usize = 40;
const BATCH_SIZES: [u64; 2] = [1, 256];
const PIPELINE_DEPTH: usize = 8;
/// Size of the preallocated files of the raw baselines.
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

fn fallocate(file: &std::fs::File, len_bytes: u64) {
    // SAFETY: fallocate on a file descriptor we own.
    let ret = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len_bytes as libc::off_t) };
    assert_eq!(ret, 0, "fallocate: {}", std::io::Error::last_os_error());
}

fn appends(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("durable_append_512b");
    group.sample_size(20);
    group.warm_up_time(Duration::from_secs(2));
    group.measurement_time(Duration::from_secs(6));

    for batch in BATCH_SIZES {
        group.throughput(Throughput::Elements(batch));

        for engine in [LogEngineKind::Wal, LogEngineKind::Sled] {
            // One append call = one batch + one durability point.
            let dir = bench_dir();
            let store = LogStore::<BenchConfig>::open(dir.path(), LogOptions::with_engine(engine))
                .expect("open store");
            let mut next_index = 1u64;
            group.bench_with_input(
                BenchmarkId::new(format!("{engine}_logstore"), batch),
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
        }

        // The physical limit, same bytes (the WAL's frames and commit), same disk.
        let raw_dir = bench_dir();
        let bytes = vec![
            0x5Au8;
            batch as usize * (ENTRY_PAYLOAD_BYTES + FRAME_OVERHEAD_BYTES)
                + COMMIT_FRAME_BYTES
        ];
        let mut growing = OpenOptions::new()
            .create(true)
            .append(true)
            .open(raw_dir.path().join("growing.log"))
            .expect("open raw file");
        group.bench_with_input(
            BenchmarkId::new("raw_append_growing_file_fdatasync", batch),
            &batch,
            |b, _| {
                b.iter(|| {
                    growing.write_all(&bytes).expect("write");
                    growing.sync_data().expect("fdatasync");
                })
            },
        );
        let fallocated = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(raw_dir.path().join("fallocated.log"))
            .expect("open fallocated file");
        fallocate(&fallocated, PREALLOCATED_BYTES);
        fallocated.sync_all().expect("fsync fallocated");
        let mut fallocated_offset = 0u64;
        group.bench_with_input(
            BenchmarkId::new("raw_write_fallocated_file_fdatasync", batch),
            &batch,
            |b, _| {
                b.iter(|| {
                    if fallocated_offset + bytes.len() as u64 > PREALLOCATED_BYTES {
                        // Start over in a new preallocated file, as the WAL rotates.
                        fallocated.set_len(0).expect("truncate");
                        fallocate(&fallocated, PREALLOCATED_BYTES);
                        fallocated.sync_all().expect("fsync");
                        fallocated_offset = 0;
                    }
                    fallocated
                        .write_all_at(&bytes, fallocated_offset)
                        .expect("write");
                    fallocated.sync_data().expect("fdatasync");
                    fallocated_offset += bytes.len() as u64;
                })
            },
        );
        let written = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(raw_dir.path().join("written.log"))
            .expect("open written file");
        let slots = (PREALLOCATED_BYTES / bytes.len() as u64).max(1);
        written
            .write_all_at(&vec![0u8; (slots * bytes.len() as u64) as usize], 0)
            .expect("prewrite");
        written.sync_all().expect("fsync prewritten");
        let mut slot = 0u64;
        group.bench_with_input(
            BenchmarkId::new("raw_overwrite_written_blocks_fdatasync", batch),
            &batch,
            |b, _| {
                b.iter(|| {
                    written
                        .write_all_at(&bytes, (slot % slots) * bytes.len() as u64)
                        .expect("write");
                    written.sync_data().expect("fdatasync");
                    slot += 1;
                })
            },
        );
    }

    // Group commit: batch-1 appends with several in flight share durability points.
    group.throughput(Throughput::Elements(1));
    for engine in [LogEngineKind::Wal, LogEngineKind::Sled] {
        let dir = bench_dir();
        let store = LogStore::<BenchConfig>::open(dir.path(), LogOptions::with_engine(engine))
            .expect("open store");
        let mut next_index = 1u64;
        group.bench_function(
            BenchmarkId::new(format!("{engine}_logstore_pipelined_8_in_flight"), 1),
            |b| {
                b.iter_custom(|iterations| {
                    runtime.block_on(async {
                        let slots = Arc::new(tokio::sync::Semaphore::new(PIPELINE_DEPTH));
                        let started = Instant::now();
                        for _ in 0..iterations {
                            let permit =
                                Arc::clone(&slots).acquire_owned().await.expect("semaphore");
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
    }
    group.finish();
}

criterion_group!(benches, appends);
criterion_main!(benches);
