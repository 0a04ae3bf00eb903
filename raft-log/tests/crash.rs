//! Crash tests: a child process (this test binary, re-invoked) appends entries and prints every
//! acknowledged (durable) index; the parent kills it at a random moment, reopens the store and
//! checks that every acknowledged entry is present and intact, and that every entry present
//! beyond them is intact too (a store must never serve a torn entry). Variants:
//! - `kill -9`, on both engines. It keeps the page cache, so it cannot catch a missing fsync
//!   or a torn write: no test can make it fail through those, and none pretends to.
//! - a power cut on the `cairn-powercut-fs` FUSE filesystem, which drops everything not synced:
//!   sled on the default filesystem, cut after the kill; the WAL (with 1 MiB segments, so
//!   that segments rotate and are deleted behind purges all the time) on the harshest one,
//!   with torn writes *and* strict directories, cut while the child still runs (so the batch
//!   it is writing can be torn), then killed.
//! - the proofs that the power-cut test bites: it catches a store that skips its fsync (both
//!   engines), a WAL that skips its directory fsyncs, and a WAL that does not check crc32c —
//!   each through a test-only switch of `LogOptions`.
//!
//! Rounds per test: `CAIRN_CRASH_ROUNDS` (default 20). Replay a run with
//! `CAIRN_TEST_SEED=<seed printed by the test>`.

mod common;

use std::io::BufRead;
use std::io::BufReader;
use std::path::Path;
use std::process::Child;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use cairn_powercut_fs::PowerCutFs;
use cairn_powercut_fs::PowerCutOptions;
use common::LogEngineKind;
use common::LogOptions;
use common::Store;
use rand::Rng;
use rand::SeedableRng;

/// Environment variable that turns `crash_child_process_entry` into the appending child.
const CHILD_DIR_ENV: &str = "CAIRN_RAFT_LOG_CRASH_CHILD_DIR";
const CHILD_SEED_ENV: &str = "CAIRN_RAFT_LOG_CRASH_CHILD_SEED";
const CHILD_ENGINE_ENV: &str = "CAIRN_RAFT_LOG_CRASH_CHILD_ENGINE";
const CHILD_SKIP_ENV: &str = "CAIRN_RAFT_LOG_CRASH_CHILD_UNSAFE_SKIP";
const CHILD_BATCH_MAX_ENV: &str = "CAIRN_RAFT_LOG_CRASH_CHILD_BATCH_MAX";
const CHILD_ENTRY_SCALE_ENV: &str = "CAIRN_RAFT_LOG_CRASH_CHILD_ENTRY_SCALE";
const CHILD_IN_FLIGHT_ENV: &str = "CAIRN_RAFT_LOG_CRASH_CHILD_IN_FLIGHT";
/// Entry size scale when the power is cut while the child runs: entries up to ~8 KiB span
/// many sectors, so a torn batch can lose sectors holding payload only (which only the crc32c
/// checks can notice), as with the node's batched entries.
const ENTRY_SCALE_WHILE_RUNNING: usize = 32;
/// Rounds per test; the issue asks for at least 20.
const ROUNDS_ENV: &str = "CAIRN_CRASH_ROUNDS";
const ROUNDS_DEFAULT: u64 = 20;
/// Appends in flight at once in the child (their flush callbacks fire in order).
const IN_FLIGHT_APPENDS_MAX: usize = 8;
/// The WAL's segments in these tests: small, so rotation and deletion happen many times in
/// every round (a round writes megabytes), yet large enough that most power cuts find the
/// child inside a batch rather than inside a rotation.
const WAL_SEGMENT_BYTES: u64 = 1024 * 1024;

fn rounds() -> u64 {
    std::env::var(ROUNDS_ENV)
        .ok()
        .and_then(|rounds| rounds.parse().ok())
        .unwrap_or(ROUNDS_DEFAULT)
}

/// Which safety the child's store leaves out (test-only switches).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Skip {
    Nothing,
    Fsync,
    DirectoryFsync,
    CrcCheck,
}

impl Skip {
    fn name(self) -> &'static str {
        match self {
            Skip::Nothing => "nothing",
            Skip::Fsync => "fsync",
            Skip::DirectoryFsync => "directory-fsync",
            Skip::CrcCheck => "crc-check",
        }
    }

    fn parse(name: &str) -> Skip {
        match name {
            "fsync" => Skip::Fsync,
            "directory-fsync" => Skip::DirectoryFsync,
            "crc-check" => Skip::CrcCheck,
            _ => Skip::Nothing,
        }
    }
}

/// The options every process of a test uses for `engine`, with `skip` switched off.
fn store_options(engine: LogEngineKind, skip: Skip) -> LogOptions {
    let mut options = LogOptions::with_engine(engine);
    options.segment_size_bytes = WAL_SEGMENT_BYTES;
    options.unsafe_skip_fsync_for_tests = skip == Skip::Fsync;
    options.unsafe_skip_directory_fsync_for_tests = skip == Skip::DirectoryFsync;
    options.unsafe_skip_crc_check_for_tests = skip == Skip::CrcCheck;
    options
}

/// Child side: not a test of its own. Run by the parent with the environment above, it appends
/// batches of entries forever, prints `ACK <index>` once everything up to `<index>` is durable,
/// `PURGE <index>` before each purge and `VOTE <term>` after each saved vote. Without the
/// environment it returns at once.
#[test]
fn crash_child_process_entry() {
    // Child process entry point: does nothing unless the parent set CAIRN_RAFT_LOG_CRASH_CHILD_DIR.
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let seed: u64 = std::env::var(CHILD_SEED_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let engine = std::env::var(CHILD_ENGINE_ENV)
        .ok()
        .and_then(|name| name.parse().ok())
        .unwrap_or(LogEngineKind::Wal);
    let skip = Skip::parse(&std::env::var(CHILD_SKIP_ENV).unwrap_or_default());
    let batch_max: u64 = std::env::var(CHILD_BATCH_MAX_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    let in_flight_max: usize = std::env::var(CHILD_IN_FLIGHT_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(IN_FLIGHT_APPENDS_MAX);
    let scale: usize = std::env::var(CHILD_ENTRY_SCALE_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let store = Store::open(Path::new(&dir), store_options(engine, skip))
            .expect("child opens the store");
        let (purged, last) = store.log_state().await.expect("log state");
        let mut next_index = last.map(|id| id.index + 1).unwrap_or(1);
        let mut purged_index = purged.map(|id| id.index).unwrap_or(0);
        let acked = Arc::new(AtomicU64::new(next_index - 1));
        let mut term = store
            .vote()
            .await
            .expect("vote")
            .map(|vote| vote.leader_id.term)
            .unwrap_or(0);
        let in_flight = Arc::new(tokio::sync::Semaphore::new(in_flight_max));
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        println!("READY {next_index}");
        loop {
            let permit = Arc::clone(&in_flight)
                .acquire_owned()
                .await
                .expect("semaphore");
            let count: u64 = rng.random_range(1..=batch_max);
            let entries: Vec<_> = (next_index..next_index + count)
                .map(|index| common::entry_scaled(index, scale))
                .collect();
            let last_index = next_index + count - 1;
            let acked_by_callback = Arc::clone(&acked);
            store
                .append_with_callback(
                    entries,
                    Box::new(move |result| {
                        if result.is_ok() {
                            acked_by_callback.store(last_index, Ordering::SeqCst);
                            println!("ACK {last_index}");
                        }
                        drop(permit);
                    }),
                )
                .await
                .expect("append");
            next_index = last_index + 1;
            // Now and then compact: purge well below what is acknowledged.
            let acked_index = acked.load(Ordering::SeqCst);
            if rng.random_range(0..100) == 0 && acked_index > purged_index + 64 {
                let through = acked_index - 32;
                println!("PURGE {through}");
                store
                    .purge_through(&common::log_id(through))
                    .await
                    .expect("purge");
                purged_index = through;
            }
            // Now and then install a "snapshot": purge past the end of the log, as openraft
            // does on a follower whose log is shorter than the snapshot, and go on from there.
            if rng.random_range(0..300) == 0 {
                let through = next_index + rng.random_range(0..64);
                println!("PURGE {through}");
                store
                    .purge_through(&common::log_id(through))
                    .await
                    .expect("purge past the end");
                purged_index = through;
                next_index = through + 1;
            }
            // Now and then rewrite the last few entries with an overlapping append (a truncate
            // frame in the WAL), as a follower does when a new leader overwrites its tail. The
            // entries' bytes depend only on their index, so acknowledged ones stay intact.
            if rng.random_range(0..200) == 0 && next_index > purged_index + 8 {
                let from = next_index - rng.random_range(1..=8);
                store
                    .append_durable(
                        (from..next_index)
                            .map(|index| common::entry_scaled(index, scale))
                            .collect(),
                    )
                    .await
                    .expect("overlapping append");
            }
            if rng.random_range(0..150) == 0 {
                term += 1;
                store
                    .store_vote(&openraft::Vote::new(term, 0))
                    .await
                    .expect("save vote");
                println!("VOTE {term}");
            }
            if rng.random_range(0..10) == 0 {
                store
                    .store_committed(Some(common::log_id(acked.load(Ordering::SeqCst))))
                    .await
                    .expect("save committed");
            }
        }
    });
}

/// What the parent learned from one child's stdout.
#[derive(Debug, Default)]
struct ChildReport {
    ready: bool,
    acked_index_max: u64,
    purge_index_max: u64,
    vote_term_max: u64,
}

/// Reads the child's stdout on a thread until it closes.
fn read_child_stdout(
    child: &mut Child,
) -> (
    std::thread::JoinHandle<ChildReport>,
    std::sync::mpsc::Receiver<()>,
) {
    let stdout = child.stdout.take().expect("piped stdout");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut report = ChildReport::default();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // libtest may print "test name ... " before our first line: look at word pairs.
            let words: Vec<&str> = line.split_whitespace().collect();
            for pair in words.windows(2) {
                let Ok(index) = pair[1].parse::<u64>() else {
                    continue;
                };
                match pair[0] {
                    "READY" => {
                        report.ready = true;
                        let _ = ready_tx.send(());
                    }
                    "ACK" => report.acked_index_max = report.acked_index_max.max(index),
                    "PURGE" => report.purge_index_max = report.purge_index_max.max(index),
                    "VOTE" => report.vote_term_max = report.vote_term_max.max(index),
                    _ => {}
                }
            }
        }
        report
    });
    (reader, ready_rx)
}

/// When the power goes relative to the SIGKILL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CutAt {
    /// After the child is dead: whatever it started (an `fdatasync` in flight) is finished.
    AfterKill,
    /// While the child runs, as a real power cut: the batch it was writing may be torn. The
    /// child's later writes on its old handles fail with EIO, so it can acknowledge nothing
    /// written after the cut; it is killed right after.
    WhileRunning,
}

fn entry_scale(cut_at: CutAt) -> usize {
    match cut_at {
        CutAt::WhileRunning => ENTRY_SCALE_WHILE_RUNNING,
        CutAt::AfterKill => 1,
    }
}

/// Runs one child on `dir`, cuts (`cut`, at `cut_at`) and kills it with SIGKILL after
/// `kill_after`, and returns what it acknowledged.
fn run_child_round(
    dir: &Path,
    seed: u64,
    engine: LogEngineKind,
    skip: Skip,
    kill_after: Duration,
    cut_at: CutAt,
    cut: impl FnOnce(),
) -> ChildReport {
    // A WAL without crc checks is only fooled when a torn batch loses sectors holding payload
    // alone: small batches (one append of 1-2 large entries in flight) make that likely.
    let (batch_max, in_flight) = if skip == Skip::CrcCheck {
        (2, 1)
    } else {
        (16, IN_FLIGHT_APPENDS_MAX)
    };
    let envs = vec![
        (CHILD_IN_FLIGHT_ENV, in_flight.to_string()),
        (CHILD_DIR_ENV, dir.display().to_string()),
        (CHILD_SEED_ENV, seed.to_string()),
        (CHILD_ENGINE_ENV, engine.to_string()),
        (CHILD_SKIP_ENV, skip.name().to_string()),
        (CHILD_BATCH_MAX_ENV, batch_max.to_string()),
        (CHILD_ENTRY_SCALE_ENV, entry_scale(cut_at).to_string()),
    ];
    let mut child = common::spawn_self("crash_child_process_entry", &envs);
    let (reader, ready) = read_child_stdout(&mut child);
    let ready_in_time = ready.recv_timeout(Duration::from_secs(60)).is_ok();
    if ready_in_time {
        std::thread::sleep(kill_after);
    }
    let mut cut = Some(cut);
    if cut_at == CutAt::WhileRunning {
        (cut.take().expect("cut once"))();
    }
    // SIGKILL, then reap: after wait() the process can issue no more I/O.
    let _ = child.kill();
    let status = child.wait().expect("wait for child");
    if let Some(cut) = cut {
        cut();
    }
    let report = reader.join().expect("stdout reader");
    assert!(
        ready_in_time && report.ready,
        "child never became ready (status {status})"
    );
    report
}

/// Reopens the store (with the same switches as the child) and checks every acknowledged entry
/// above the purge point, and every entry present beyond them.
fn verify_acknowledged(
    dir: &Path,
    engine: LogEngineKind,
    skip: Skip,
    scale: usize,
    report: &ChildReport,
) -> Result<(), String> {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let store = Store::open(dir, store_options(engine, skip))
            .map_err(|e| format!("reopen failed: {e}"))?;
        let (purged, last) = store
            .log_state()
            .await
            .map_err(|e| format!("log state: {e}"))?;
        let purged_index = purged.map(|id| id.index).unwrap_or(0);
        if purged_index > report.purge_index_max {
            return Err(format!(
                "purged through {purged_index}, but the child never purged beyond {}",
                report.purge_index_max
            ));
        }
        let last_index = last.map(|id| id.index).unwrap_or(0);
        if last_index < report.acked_index_max {
            return Err(format!(
                "log ends at {last_index}, but {} was acknowledged",
                report.acked_index_max
            ));
        }
        let entries = store
            .read_entries(purged_index + 1..=last_index)
            .await
            .map_err(|e| format!("read entries: {e}"))?;
        let expected_len = last_index.saturating_sub(purged_index);
        if entries.len() as u64 != expected_len {
            return Err(format!(
                "read {} entries in {}..={last_index}, expected {expected_len}",
                entries.len(),
                purged_index + 1
            ));
        }
        for (offset, entry) in entries.iter().enumerate() {
            common::check_entry_scaled(purged_index + 1 + offset as u64, entry, scale)?;
        }
        let vote_term = store
            .vote()
            .await
            .map_err(|e| format!("vote: {e}"))?
            .map(|v| v.leader_id.term)
            .unwrap_or(0);
        if vote_term < report.vote_term_max {
            return Err(format!(
                "vote term {vote_term} after reopen, but term {} was saved",
                report.vote_term_max
            ));
        }
        Ok(())
    })
}

/// Runs the rounds on one accumulating store in `dir`; `cut` runs with each kill.
fn crash_rounds(test: &str, dir: &Path, engine: LogEngineKind, cut_at: CutAt, cut: impl Fn()) {
    let rounds = rounds();
    let seed = common::test_seed();
    println!("{test}: seed {seed} (replay with CAIRN_TEST_SEED={seed}), {rounds} rounds");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut total = ChildReport::default();
    let started = Instant::now();
    for round in 0..rounds {
        let kill_after = Duration::from_millis(rng.random_range(5..400));
        let report = run_child_round(
            dir,
            seed.wrapping_add(round),
            engine,
            Skip::Nothing,
            kill_after,
            cut_at,
            &cut,
        );
        total.acked_index_max = total.acked_index_max.max(report.acked_index_max);
        total.purge_index_max = total.purge_index_max.max(report.purge_index_max);
        total.vote_term_max = total.vote_term_max.max(report.vote_term_max);
        if let Err(problem) =
            verify_acknowledged(dir, engine, Skip::Nothing, entry_scale(cut_at), &total)
        {
            panic!("{test}: round {round} (seed {seed}, killed after {kill_after:?}): {problem}");
        }
        println!(
            "{test}: round {round}: killed after {kill_after:?}, {} entries acknowledged so far, purged through <= {}, vote term >= {}, all intact",
            total.acked_index_max, total.purge_index_max, total.vote_term_max
        );
    }
    assert!(
        total.acked_index_max > 0,
        "{test}: no entry was ever acknowledged"
    );
    println!("{test}: {rounds} rounds in {:?}", started.elapsed());
}

fn kill_9_at_random_moments_loses_no_acknowledged_entry(engine: LogEngineKind) {
    // Append in a child, SIGKILL it at a random moment, reopen, check every ack; repeat.
    let dir = tempfile::tempdir().expect("tempdir");
    let store_dir = dir.path().join("log");
    crash_rounds(
        &format!("kill_9_{engine}"),
        &store_dir,
        engine,
        CutAt::AfterKill,
        || {},
    );
}

for_each_engine!(kill_9_at_random_moments_loses_no_acknowledged_entry);

#[test]
fn sled_power_cut_at_random_moments_loses_no_acknowledged_entry() {
    // On the power-cut FUSE filesystem: SIGKILL the child, cut power (dropping all unsynced
    // data), reopen, check every acknowledged entry; repeat.
    if common::skip_without_fuse("sled_power_cut_at_random_moments_loses_no_acknowledged_entry") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fs = PowerCutFs::mount(dir.path()).expect("mount power-cut filesystem");
    let store_dir = dir.path().join("log");
    crash_rounds(
        "power_cut_sled",
        &store_dir,
        LogEngineKind::Sled,
        CutAt::AfterKill,
        || fs.cut_power(),
    );
    let stats = fs.stats();
    assert_eq!(stats.power_cuts, rounds());
    assert!(
        stats.file_syncs > 0,
        "the store never fsynced a file: {stats:?}"
    );
    fs.unmount().expect("unmount");
}

/// The harshest filesystem: torn writes and strict directories.
fn harsh(seed: u64) -> PowerCutOptions {
    PowerCutOptions {
        torn_writes_seed: Some(seed),
        strict_directories: true,
    }
}

#[test]
fn wal_power_cut_with_torn_writes_and_strict_directories_loses_no_acknowledged_entry() {
    // The WAL on the harshest power-cut filesystem (torn writes: a random prefix of the
    // unsynced writes survives, the next one torn by sector; strict directories: names survive
    // only a directory fsync): every round, acknowledged entries survive and no torn entry is
    // served.
    if common::skip_without_fuse(
        "wal_power_cut_with_torn_writes_and_strict_directories_loses_no_acknowledged_entry",
    ) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fs_seed = common::test_seed();
    println!("power-cut filesystem seed {fs_seed}");
    let fs =
        PowerCutFs::mount_with(dir.path(), harsh(fs_seed)).expect("mount power-cut filesystem");
    let store_dir = dir.path().join("log");
    crash_rounds(
        "power_cut_wal",
        &store_dir,
        LogEngineKind::Wal,
        CutAt::WhileRunning,
        || fs.cut_power(),
    );
    let stats = fs.stats();
    assert_eq!(stats.power_cuts, rounds());
    assert!(
        stats.file_syncs > 0 && stats.directory_syncs > 0,
        "{stats:?}"
    );
    fs.unmount().expect("unmount");
}

/// Runs rounds of a store with `skip` on fresh directories until a power cut loses or damages
/// what it acknowledged, at most `rounds_max` times. Returns the rounds that caught it.
fn detect(
    test: &str,
    engine: LogEngineKind,
    skip: Skip,
    fs_options: PowerCutOptions,
    rounds_max: u64,
) -> Vec<u64> {
    let dir = tempfile::tempdir().expect("tempdir");
    let fs = PowerCutFs::mount_with(dir.path(), fs_options).expect("mount power-cut filesystem");
    let seed = common::test_seed();
    println!("{test}: seed {seed} (replay with CAIRN_TEST_SEED={seed}), {fs_options:?}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut detected = Vec::new();
    for round in 0..rounds_max {
        let store_dir = dir.path().join(format!("log-{round}"));
        let kill_after = Duration::from_millis(rng.random_range(50..400));
        let cut_at = match engine {
            LogEngineKind::Wal => CutAt::WhileRunning,
            LogEngineKind::Sled => CutAt::AfterKill,
        };
        let report = run_child_round(
            &store_dir,
            seed.wrapping_add(round),
            engine,
            skip,
            kill_after,
            cut_at,
            || fs.cut_power(),
        );
        if report.acked_index_max == 0 {
            println!("{test}: round {round}: nothing acknowledged before the kill");
            continue;
        }
        match verify_acknowledged(&store_dir, engine, skip, entry_scale(cut_at), &report) {
            Ok(()) => println!(
                "{test}: round {round}: {} acknowledged, none lost or damaged",
                report.acked_index_max
            ),
            Err(problem) => {
                println!("{test}: round {round}: caught: {problem}");
                detected.push(round);
                break;
            }
        }
    }
    println!("{test}: filesystem: {:?}", fs.stats());
    fs.unmount().expect("unmount");
    detected
}

fn power_cut_test_detects_a_store_that_skips_fsync(engine: LogEngineKind) {
    // With the unsafe skip-fsync switch on, a power cut must lose acknowledged entries in one
    // of the rounds (each on a fresh store): proof that the power-cut test bites.
    if common::skip_without_fuse("power_cut_test_detects_a_store_that_skips_fsync") {
        return;
    }
    let fs_options = match engine {
        LogEngineKind::Wal => harsh(common::test_seed()),
        LogEngineKind::Sled => PowerCutOptions::default(),
    };
    let caught = detect(
        &format!("skip_fsync_{engine}"),
        engine,
        Skip::Fsync,
        fs_options,
        rounds(),
    );
    assert!(
        !caught.is_empty(),
        "skipping fsync lost nothing in {} power cuts: the power-cut test does not bite",
        rounds()
    );
}

for_each_engine!(power_cut_test_detects_a_store_that_skips_fsync);

#[test]
fn power_cut_test_detects_a_wal_that_skips_its_directory_fsyncs() {
    // With strict directories, a WAL that never fsyncs a directory loses its new files' names
    // (the engine marker, a new segment) at the power cut: acknowledged entries vanish.
    if common::skip_without_fuse("power_cut_test_detects_a_wal_that_skips_its_directory_fsyncs") {
        return;
    }
    let caught = detect(
        "skip_directory_fsync",
        LogEngineKind::Wal,
        Skip::DirectoryFsync,
        harsh(common::test_seed()),
        rounds(),
    );
    assert!(
        !caught.is_empty(),
        "skipping directory fsyncs lost nothing in {} power cuts",
        rounds()
    );
}

#[test]
fn power_cut_test_detects_a_wal_that_does_not_check_crcs() {
    // With torn writes, the batch being written at the cut can keep its commit frame but lose
    // a sector in the middle: a WAL that skips its crc32c checks reads that batch back as
    // data and serves a damaged entry (or fails to decode it). Torn batches come at random, so
    // this runs up to three times the usual rounds, stopping at the first catch.
    if common::skip_without_fuse("power_cut_test_detects_a_wal_that_does_not_check_crcs") {
        return;
    }
    let caught = detect(
        "skip_crc_check",
        LogEngineKind::Wal,
        Skip::CrcCheck,
        harsh(common::test_seed()),
        3 * rounds(),
    );
    assert!(
        !caught.is_empty(),
        "a WAL without crc checks went unnoticed in {} power cuts",
        3 * rounds()
    );
}
