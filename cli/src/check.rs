//! `cairn check disk` and `cairn check perf`: is this machine, is this cluster, fit to run
//! Cairn? Both state their thresholds, print the figures they measured and a verdict, and
//! exit 0 when it passes.
//!
//! - `check disk [--data-dir DIR]` measures what a node's write-ahead log waits for: small
//!   appends to a preallocated file, each followed by `fdatasync`, as the WAL does. The
//!   threshold is etcd's guidance for its WAL: the 99th percentile of `fdatasync` under
//!   [`DISK_FSYNC_P99_MAX`] (10 ms). A slower disk delays every acknowledged write and, past
//!   the heartbeat interval, leadership itself. Exit 0 fit, 1 unfit, 2 when the directory is
//!   not one.
//! - `check perf [--load s|m|l]` runs a short standard write load against a running cluster
//!   with `cairn bench`'s load generator (closed loop, paced to the load's rate, through the
//!   leader) in the namespace `check-perf`, like `etcdctl check perf`: PASS when the cluster
//!   sustains at least 90% of the rate with a p99 latency within the load's bound and no
//!   failed write. Its resources are deleted afterwards. Exit 0 PASS, 1 FAIL, and the usual
//!   codes (5 unavailable, 6 not authorized, ...) when the load could not run.
//! - `check cache --type GROUP.KIND [--tenancy P/N] [--prefix P]` is a consistency check
//!   users run themselves: it primes a client [`WatchCache`] of the type through a watch (a
//!   snapshot, then live events), takes what the cache holds together with the revision it
//!   reflects, lists the type at that very revision (a strong, paged list of the past
//!   state), and reports every difference: a resource missing from the cache, one only in the
//!   cache, one that differs. A difference can be seen for a moment while the cache is
//!   between two changes of one log entry, so a mismatch is compared again (up to
//!   [`CACHE_CHECK_ROUNDS`] times) before it is reported. Exit 0 PASS, 1 FAIL (differences),
//!   and the usual codes when the cluster could not be read.

use std::os::unix::fs::FileExt as _;
use std::os::unix::io::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cairn_client::{ResourceKey, WatchCache, WatchSpec};
use cairn_proto::v1::{Consistency, ListRequest, Resource, Tenancy, Type};
use clap::{Args, Subcommand, ValueEnum};

use crate::common::exit;
use cairn_bench::{BenchError, LoadOptions, Report, StandardLoad};

/// etcd's guidance for WAL fsync: "the 99th percentile of fdatasync … less than 10 ms".
pub const DISK_FSYNC_P99_MAX: Duration = Duration::from_millis(10);

/// The namespace `check perf` writes in (resources of type `bench.v1.Item`).
pub const PERF_NAMESPACE: &str = "check-perf";

/// The size of each value `check perf` writes, in bytes.
const PERF_VALUE_BYTES: usize = 256;

/// The share of a load's rate that `check perf` must sustain to pass.
const PERF_THROUGHPUT_SHARE: f64 = 0.9;

#[derive(Subcommand)]
pub enum CheckCommand {
    /// Measure fdatasync latency of small appends in a directory: is it fit for a data dir?
    Disk(DiskArgs),
    /// Run a short standard write load against a running cluster: PASS or FAIL.
    Perf(PerfArgs),
    /// Prime a client cache of a type through a watch and compare it with a list of the
    /// type at the cache's revision: PASS, or FAIL with every difference.
    Cache(CacheArgs),
    /// Ask the leader to compare every member's table digest now: PASS, or FAIL naming the
    /// members that differ from the majority (the CORRUPT alarm is then raised).
    Consistency(ConsistencyArgs),
}

#[derive(Args)]
pub struct ConsistencyArgs {
    /// `--endpoints`, `--token`, TLS, `-o`, `--timeout-ms`.
    #[command(flatten)]
    global: crate::common::GlobalArgs,
}

#[derive(Args)]
pub struct CacheArgs {
    /// `--endpoints`, `--token`, TLS, `--timeout-ms` (each call's deadline).
    #[command(flatten)]
    global: crate::common::GlobalArgs,
    /// GROUP.KIND or GROUP.GROUP_VERSION.KIND (the version is ignored).
    #[arg(long = "type", value_parser = crate::data::parse_list_type)]
    type_: Type,
    /// PARTITION/NAMESPACE; `*` matches any (`'*/*'`: every tenancy).
    #[arg(long, default_value = "*/*", value_parser = crate::data::parse_tenancy)]
    tenancy: Tenancy,
    /// Only names starting with this.
    #[arg(long, default_value = "")]
    prefix: String,
    /// Seconds to wait for the cache to prime.
    #[arg(long, default_value_t = 60.0)]
    prime_timeout: f64,
}

#[derive(Args)]
pub struct DiskArgs {
    /// The directory to measure: a data dir, or where one will be (it must exist).
    #[arg(long, default_value = ".")]
    data_dir: PathBuf,
    /// Appends to make, each followed by fdatasync.
    #[arg(long, default_value_t = 1000)]
    count: u32,
    /// Bytes of each append (etcd's fio guidance writes 2300-byte blocks).
    #[arg(long, default_value_t = 2300)]
    block_bytes: usize,
    /// Stop after this many seconds, whatever the count (the verdict then uses what was
    /// measured).
    #[arg(long, default_value_t = 30.0)]
    duration_max: f64,
}

#[derive(Args)]
pub struct PerfArgs {
    /// The cluster (`--endpoints`), and how to reach it: `--token`, TLS. The token needs
    /// `admin` (to find the leader) and `write` on `bench.Item` in `default/check-perf`.
    #[command(flatten)]
    cluster: crate::common::ClusterArgs,
    /// The load: s (50 clients, 150 writes/s), m (200 clients, 1000 writes/s) or l (500
    /// clients, 8000 writes/s).
    #[arg(long, value_enum, default_value = "s")]
    load: LoadSize,
    /// Seconds of measured load (after one second of warm-up).
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
}

pub fn run(command: CheckCommand) -> u8 {
    match command {
        CheckCommand::Disk(args) => disk(args),
        CheckCommand::Perf(args) => perf(args),
        CheckCommand::Cache(args) => cache(args),
        CheckCommand::Consistency(args) => consistency(args),
    }
}

// ---- check consistency ------------------------------------------------------------------

fn consistency(args: ConsistencyArgs) -> u8 {
    use cairn_client::admin::Operation;
    let global = &args.global;
    let client = match crate::admin::client_of(global) {
        Ok(c) => c,
        Err(e) => return crate::admin::fail(&e),
    };
    let answered = crate::common::runtime().block_on(client.at_leader(
        // It may raise the CORRUPT alarm: never sent twice blindly.
        Operation::Mutation,
        |mut c| async move {
            c.check_consistency(cairn_proto::v1::CheckConsistencyRequest {})
                .await
        },
    ));
    let r = match answered {
        Ok(r) => r,
        Err(e) => return crate::admin::fail(&e),
    };
    if global.output == crate::common::OutputFormat::Json {
        out!(
            "{}",
            serde_json::json!({
                "log_index": r.log_index,
                "verdict": r.verdict,
                "differing": r.differing,
                "skipped": r.skipped,
                "raised_index": r.raised_index,
                "members": r.members.iter().map(|m| serde_json::json!({
                    "node_id": m.node_id, "digest": m.digest, "left_out": m.left_out,
                })).collect::<Vec<_>>(),
            })
        );
    } else {
        out!("table digests at log index {}:", r.log_index);
        for m in &r.members {
            let differs = r.differing.contains(&m.node_id);
            match m.left_out.is_empty() {
                true => out!(
                    "  node {}  {}{}",
                    m.node_id,
                    m.digest,
                    if differs { "  DIFFERS" } else { "" }
                ),
                false => out!("  node {}  (left out: {})", m.node_id, m.left_out),
            }
        }
    }
    match r.verdict.as_str() {
        "agree" => {
            if global.output != crate::common::OutputFormat::Json {
                out!("PASS: every member that answered holds the same table");
            }
            exit::OK
        }
        "skipped" => {
            eprintln!("cairn check consistency: not compared: {}", r.skipped);
            exit::UNAVAILABLE
        }
        verdict => {
            eprintln!(
                "FAIL: node(s) {:?} hold a table that differs from {} (the CORRUPT alarm {}); \
                 replace them: docs/operations.md, \"Replace a corrupt member\"",
                r.differing,
                if verdict == "differ" {
                    "the majority's"
                } else {
                    "every other member's: no majority agrees"
                },
                if r.raised_index > 0 {
                    format!("was raised at index {}", r.raised_index)
                } else {
                    "names them already".to_string()
                }
            );
            exit::ERROR
        }
    }
}

// ---- check disk -------------------------------------------------------------------------

/// What `check disk` measured.
#[derive(Debug, Clone, PartialEq)]
pub struct DiskFigures {
    pub count: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub elapsed: Duration,
}

impl DiskFigures {
    /// The figures of these `fdatasync` latencies (nearest-rank percentiles).
    pub fn of(mut latencies: Vec<Duration>, elapsed: Duration) -> DiskFigures {
        latencies.sort_unstable();
        let at = |q: f64| -> Duration {
            if latencies.is_empty() {
                return Duration::ZERO;
            }
            let rank = (q * latencies.len() as f64).ceil() as usize;
            latencies[rank.clamp(1, latencies.len()) - 1]
        };
        DiskFigures {
            count: latencies.len(),
            p50: at(0.50),
            p99: at(0.99),
            max: latencies.last().copied().unwrap_or_default(),
            elapsed,
        }
    }
}

/// Whether a directory is fit for a data dir, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskVerdict {
    pub fit: bool,
    pub reason: String,
}

/// The decision of `check disk`: fit when at least one sync was measured and the p99 of
/// `fdatasync` is at most `p99_max`.
pub fn disk_verdict(figures: &DiskFigures, p99_max: Duration) -> DiskVerdict {
    if figures.count == 0 {
        return DiskVerdict {
            fit: false,
            reason: "no fdatasync finished in the time allowed".into(),
        };
    }
    let fit = figures.p99 <= p99_max;
    let reason = format!(
        "fdatasync p99 {} is {} {}",
        ms(figures.p99),
        if fit { "within" } else { "above" },
        ms(p99_max)
    );
    DiskVerdict { fit, reason }
}

/// A latency for people: µs under 0.1 ms (a tmpfs sync takes a microsecond), else ms.
fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 0.1 {
        format!("{:.1} µs", ms * 1000.0)
    } else if ms < 10.0 {
        format!("{ms:.3} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

/// The measurement's file: removed when dropped.
struct ProbeFile {
    path: PathBuf,
    file: std::fs::File,
}

impl Drop for ProbeFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl ProbeFile {
    fn create(dir: &Path, bytes: u64) -> std::io::Result<ProbeFile> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = dir.join(format!(
            ".cairn-check-disk-{}-{nanos:x}",
            std::process::id()
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        let probe = ProbeFile { path, file };
        // As a WAL segment: space reserved first, so that each sync writes data, not a
        // growing file's size.
        let len = libc::off_t::try_from(bytes).map_err(std::io::Error::other)?;
        // SAFETY: fallocate on a descriptor this function owns; no memory is passed.
        if unsafe { libc::fallocate(probe.file.as_raw_fd(), 0, 0, len) } != 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EOPNOTSUPP) {
                return Err(error);
            }
            probe.file.set_len(bytes)?;
        }
        probe.file.sync_all()?;
        Ok(probe)
    }
}

fn disk(args: DiskArgs) -> u8 {
    let dir = &args.data_dir;
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            eprintln!(
                "cairn check disk: --data-dir {}: not a directory",
                dir.display()
            );
            return exit::USAGE;
        }
        Err(e) => {
            eprintln!("cairn check disk: --data-dir {}: {e}", dir.display());
            return exit::USAGE;
        }
    }
    if args.count == 0 || args.block_bytes == 0 || args.block_bytes > 16 << 20 {
        eprintln!(
            "cairn check disk: --count must be at least 1 and --block-bytes between 1 and 16 MiB"
        );
        return exit::USAGE;
    }
    if !(args.duration_max > 0.0 && args.duration_max <= 3600.0) {
        eprintln!("cairn check disk: --duration-max must be between 0 and 3600 seconds");
        return exit::USAGE;
    }
    println!(
        "check disk: {}: {} appends of {} bytes, each followed by fdatasync (as the WAL does)",
        dir.display(),
        args.count,
        args.block_bytes
    );
    println!(
        "threshold: fdatasync p99 at most {} (etcd's guidance for a write-ahead log)",
        ms(DISK_FSYNC_P99_MAX)
    );
    let figures = match measure_disk(&args) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cairn check disk: {}: {e}", dir.display());
            return exit::ERROR;
        }
    };
    println!(
        "fdatasync: p50 {}  p99 {}  max {}  ({} syncs in {:.2} s)",
        ms(figures.p50),
        ms(figures.p99),
        ms(figures.max),
        figures.count,
        figures.elapsed.as_secs_f64()
    );
    if (figures.count as u32) < args.count {
        println!(
            "(stopped after {} s: {} of {} syncs made)",
            args.duration_max, figures.count, args.count
        );
    }
    let verdict = disk_verdict(&figures, DISK_FSYNC_P99_MAX);
    if verdict.fit {
        println!("PASS: fit for a data dir: {}", verdict.reason);
        exit::OK
    } else {
        println!(
            "FAIL: not fit for a data dir: {}; every write waits for this sync, and a slow \
             one delays heartbeats and elections",
            verdict.reason
        );
        exit::ERROR
    }
}

fn measure_disk(args: &DiskArgs) -> std::io::Result<DiskFigures> {
    let count = args.count as u64;
    let block = vec![0xA5u8; args.block_bytes];
    let probe = ProbeFile::create(&args.data_dir, count * args.block_bytes as u64)?;
    let progress = indicatif::ProgressBar::new(count);
    progress.set_style(
        indicatif::ProgressStyle::with_template("fdatasync [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.duration_max);
    let mut latencies = Vec::with_capacity(args.count as usize);
    for i in 0..count {
        if Instant::now() >= deadline {
            break;
        }
        probe
            .file
            .write_all_at(&block, i * args.block_bytes as u64)?;
        let sync = Instant::now();
        probe.file.sync_data()?;
        latencies.push(sync.elapsed());
        if i % 16 == 0 {
            progress.set_position(i + 1);
        }
    }
    progress.finish_and_clear();
    Ok(DiskFigures::of(latencies, started.elapsed()))
}

// ---- check perf -------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum LoadSize {
    S,
    M,
    L,
}

/// A standard load and its thresholds (etcd's sizes: the same clients and rates).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerfLoad {
    pub name: &'static str,
    pub clients: usize,
    /// Writes started per second, over all clients.
    pub rate: f64,
    /// The least throughput that passes, in writes per second (`PERF_THROUGHPUT_SHARE` of
    /// the rate).
    pub throughput_min: f64,
    /// The highest p99 write latency that passes.
    pub p99_max: Duration,
}

impl LoadSize {
    pub fn load(self) -> PerfLoad {
        let (name, clients, rate) = match self {
            LoadSize::S => ("s", 50, 150.0),
            LoadSize::M => ("m", 200, 1000.0),
            LoadSize::L => ("l", 500, 8000.0),
        };
        PerfLoad {
            name,
            clients,
            rate,
            throughput_min: rate * PERF_THROUGHPUT_SHARE,
            p99_max: Duration::from_millis(100),
        }
    }
}

/// What `check perf` measured.
#[derive(Debug, Clone, PartialEq)]
pub struct PerfFigures {
    /// Acknowledged writes per second over the window.
    pub throughput: f64,
    pub p99: Duration,
    pub writes: u64,
    pub failed: u64,
}

impl PerfFigures {
    fn of(report: &Report) -> PerfFigures {
        let p99_ms = report.latency.get("write").map_or(0.0, |l| l.p99_ms);
        PerfFigures {
            throughput: report.ops_per_s,
            p99: Duration::from_secs_f64(p99_ms / 1000.0),
            writes: report.ops,
            failed: report.errors.values().sum(),
        }
    }
}

/// One line of the verdict: a threshold, met or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerfLine {
    pub pass: bool,
    pub text: String,
}

/// The decision of `check perf`: one line per threshold; it passes when every line does.
pub fn perf_verdict(load: &PerfLoad, figures: &PerfFigures) -> Vec<PerfLine> {
    let throughput_ok = figures.throughput >= load.throughput_min;
    let p99_ok = figures.writes > 0 && figures.p99 <= load.p99_max;
    vec![
        PerfLine {
            pass: throughput_ok,
            text: format!(
                "throughput {:.1} writes/s ({} {:.0})",
                figures.throughput,
                if throughput_ok {
                    "at least"
                } else {
                    "below the least of"
                },
                load.throughput_min
            ),
        },
        PerfLine {
            pass: p99_ok,
            text: if figures.writes == 0 {
                "p99 latency unknown: no write was acknowledged".into()
            } else {
                format!(
                    "p99 latency {} ({} {})",
                    ms(figures.p99),
                    if p99_ok { "at most" } else { "above" },
                    ms(load.p99_max)
                )
            },
        },
        PerfLine {
            pass: figures.failed == 0,
            text: if figures.failed == 0 {
                format!("no failed writes ({} acknowledged)", figures.writes)
            } else {
                format!(
                    "{} failed writes ({} acknowledged)",
                    figures.failed, figures.writes
                )
            },
        },
    ]
}

fn perf(args: PerfArgs) -> u8 {
    if !(args.duration > 0.0 && args.duration <= 3600.0) {
        eprintln!("cairn check perf: --duration must be between 0 and 3600 seconds");
        return exit::USAGE;
    }
    let load = args.load.load();
    let cluster = crate::bench::cluster_of(&args.cluster);
    let options = LoadOptions::standard_writes(
        StandardLoad {
            clients: load.clients,
            connections: load.clients.div_ceil(25),
            rate: load.rate,
            duration_s: args.duration,
            warmup_s: 1.0,
            key_space: load.clients as u64 * 2,
            value_bytes: PERF_VALUE_BYTES,
        },
        PERF_NAMESPACE,
    );
    println!(
        "check perf: load {}: {} clients, {} writes/s of {PERF_VALUE_BYTES}-byte values for {} \
         s, through the leader, in namespace {PERF_NAMESPACE}",
        load.name, load.clients, load.rate, args.duration
    );
    println!(
        "thresholds: throughput at least {:.0} writes/s ({:.0}% of {}), p99 latency at most {}, \
         no failed writes",
        load.throughput_min,
        PERF_THROUGHPUT_SHARE * 100.0,
        load.rate,
        ms(load.p99_max)
    );
    let outcome: Result<(Report, Result<u64, BenchError>), BenchError> = cairn_bench::runtime()
        .and_then(|runtime| {
            runtime.block_on(async {
                let report = cairn_bench::measure_writes(&cluster, options.clone()).await?;
                let removed = cairn_bench::remove_keys(&cluster, &options).await;
                Ok((report, removed))
            })
        });
    let (report, removed) = match outcome {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cairn check perf: {e}");
            return crate::bench::exit_code(&e);
        }
    };
    if let Some(leader) = report.targets.first() {
        println!("leader: {leader}");
    }
    let lines = perf_verdict(&load, &PerfFigures::of(&report));
    for line in &lines {
        println!("{}: {}", if line.pass { "PASS" } else { "FAIL" }, line.text);
    }
    if !report.errors.is_empty() {
        println!("failed writes by kind: {}", report.error_counts());
    }
    match removed {
        Ok(n) => println!("removed the {n} resources it wrote"),
        Err(e) => eprintln!(
            "cairn check perf: could not remove its resources in namespace {PERF_NAMESPACE}: {e}"
        ),
    }
    if lines.iter().all(|l| l.pass) {
        println!("PASS");
        exit::OK
    } else {
        println!("FAIL");
        exit::ERROR
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(p99_ms: f64, count: usize) -> DiskFigures {
        DiskFigures {
            count,
            p50: Duration::from_secs_f64(p99_ms / 2000.0),
            p99: Duration::from_secs_f64(p99_ms / 1000.0),
            max: Duration::from_secs_f64(p99_ms / 1000.0),
            elapsed: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_disk_is_fit_up_to_the_threshold_and_unfit_above_it() {
        // At or under 10 ms: fit; just over: unfit; nothing measured: unfit.
        let max = DISK_FSYNC_P99_MAX;
        assert!(disk_verdict(&figures(0.2, 1000), max).fit);
        assert!(disk_verdict(&figures(10.0, 1000), max).fit);
        let slow = disk_verdict(&figures(10.5, 1000), max);
        assert!(!slow.fit);
        assert!(slow.reason.contains("above 10.0 ms"), "{}", slow.reason);
        assert!(slow.reason.contains("10.5 ms"), "{}", slow.reason);
        assert!(!disk_verdict(&figures(0.1, 0), max).fit);
    }

    #[test]
    fn disk_percentiles_are_nearest_rank() {
        // 1..=100 ms: p50 is 50 ms, p99 99 ms, max 100 ms; one sample is every percentile.
        let latencies: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let f = DiskFigures::of(latencies, Duration::from_secs(5));
        assert_eq!(f.count, 100);
        assert_eq!(f.p50, Duration::from_millis(50));
        assert_eq!(f.p99, Duration::from_millis(99));
        assert_eq!(f.max, Duration::from_millis(100));
        let one = DiskFigures::of(vec![Duration::from_millis(3)], Duration::from_secs(1));
        assert_eq!(
            (one.p50, one.p99),
            (Duration::from_millis(3), Duration::from_millis(3))
        );
        assert_eq!(DiskFigures::of(vec![], Duration::ZERO).count, 0);
    }

    #[test]
    fn perf_passes_only_when_every_threshold_is_met() {
        let load = LoadSize::S.load();
        assert_eq!(
            (load.clients, load.rate, load.throughput_min),
            (50, 150.0, 135.0)
        );
        let good = PerfFigures {
            throughput: 149.0,
            p99: Duration::from_millis(8),
            writes: 4470,
            failed: 0,
        };
        assert!(perf_verdict(&load, &good).iter().all(|l| l.pass));
        // Each threshold alone fails the run, and its line says which.
        let slow = PerfFigures {
            throughput: 120.0,
            ..good.clone()
        };
        let lines = perf_verdict(&load, &slow);
        assert!(
            !lines[0].pass && lines[1].pass && lines[2].pass,
            "{lines:?}"
        );
        assert!(lines[0].text.contains("below"), "{lines:?}");
        let late = PerfFigures {
            p99: Duration::from_millis(150),
            ..good.clone()
        };
        let lines = perf_verdict(&load, &late);
        assert!(
            lines[0].pass && !lines[1].pass && lines[2].pass,
            "{lines:?}"
        );
        let failing = PerfFigures {
            failed: 1,
            ..good.clone()
        };
        assert!(!perf_verdict(&load, &failing)[2].pass);
        // Nothing acknowledged: no throughput and no latency to speak of.
        let none = PerfFigures {
            throughput: 0.0,
            p99: Duration::ZERO,
            writes: 0,
            failed: 30,
        };
        assert!(perf_verdict(&load, &none).iter().all(|l| !l.pass));
        // The edge of each threshold passes.
        let edge = PerfFigures {
            throughput: 135.0,
            p99: Duration::from_millis(100),
            ..good
        };
        assert!(perf_verdict(&load, &edge).iter().all(|l| l.pass));
    }

    fn resource(name: &str, version: &str) -> Resource {
        Resource {
            id: Some(cairn_proto::v1::Id {
                uid: "u".into(),
                name: name.into(),
                r#type: Some(Type {
                    group: "g".into(),
                    group_version: "v1".into(),
                    kind: "K".into(),
                }),
                tenancy: Some(Tenancy {
                    partition: "p".into(),
                    namespace: "n".into(),
                }),
            }),
            version: version.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_cache_check_names_what_is_missing_extra_or_different() {
        // Same keys and resources: no difference. Otherwise each key is named
        // once: missing from the cache, only in it, or at another version.
        let cluster = [resource("a", "1"), resource("b", "2"), resource("c", "3")];
        assert!(cache_differences(&cluster, &cluster).is_empty());
        let cache = [resource("b", "5"), resource("c", "3"), resource("d", "4")];
        let found: Vec<String> = cache_differences(&cache, &cluster)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            found,
            [
                "missing from the cache: g.K p/n/a (version 1)",
                "differs: g.K p/n/b: the cache holds version 5, the cluster 2",
                "only in the cache: g.K p/n/d (version 4)",
            ]
        );
    }
}

// ---- check cache ------------------------------------------------------------------------

/// How many times `check cache` compares before it reports a difference.
pub const CACHE_CHECK_ROUNDS: usize = 3;

/// The pause between two comparisons of `check cache`.
const CACHE_CHECK_PAUSE: Duration = Duration::from_millis(500);

/// The most differences `check cache` prints (it counts them all).
const CACHE_DIFFERENCES_SHOWN_MAX: usize = 20;

/// One difference between a cache and the cluster at the same revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheDifference {
    /// At the revision, the cluster held it and the cache did not.
    Missing { key: String, version: String },
    /// The cache held it and the cluster did not.
    Extra { key: String, version: String },
    /// Both held the key, not the same resource.
    Differs {
        key: String,
        cache_version: String,
        cluster_version: String,
    },
}

impl std::fmt::Display for CacheDifference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CacheDifference::Missing { key, version } => {
                write!(f, "missing from the cache: {key} (version {version})")
            }
            CacheDifference::Extra { key, version } => {
                write!(f, "only in the cache: {key} (version {version})")
            }
            CacheDifference::Differs {
                key,
                cache_version,
                cluster_version,
            } => write!(
                f,
                "differs: {key}: the cache holds version {cache_version}, the cluster {cluster_version}"
            ),
        }
    }
}

/// Every difference between what a cache held and what the cluster held at the same
/// revision, in key order. Pure.
pub fn cache_differences(cache: &[Resource], cluster: &[Resource]) -> Vec<CacheDifference> {
    use std::collections::BTreeMap;
    let by_key = |resources: &[Resource]| -> BTreeMap<ResourceKey, Resource> {
        resources
            .iter()
            .map(|r| (ResourceKey::of(r), r.clone()))
            .collect()
    };
    let (cache, cluster) = (by_key(cache), by_key(cluster));
    let label = |k: &ResourceKey| {
        format!(
            "{}.{} {}/{}/{}",
            k.group, k.kind, k.partition, k.namespace, k.name
        )
    };
    let mut differences = Vec::new();
    for (key, theirs) in &cluster {
        match cache.get(key) {
            None => differences.push(CacheDifference::Missing {
                key: label(key),
                version: theirs.version.clone(),
            }),
            Some(ours) if ours != theirs => differences.push(CacheDifference::Differs {
                key: label(key),
                cache_version: ours.version.clone(),
                cluster_version: theirs.version.clone(),
            }),
            Some(_) => {}
        }
    }
    for (key, ours) in &cache {
        if !cluster.contains_key(key) {
            differences.push(CacheDifference::Extra {
                key: label(key),
                version: ours.version.clone(),
            });
        }
    }
    differences
}

fn cache(args: CacheArgs) -> u8 {
    if !(args.prime_timeout > 0.0 && args.prime_timeout <= 3600.0) {
        eprintln!("cairn check cache: --prime-timeout must be between 0 and 3600 seconds");
        return exit::USAGE;
    }
    let what = format!(
        "{}.{} in {}/{}{}",
        args.type_.group,
        args.type_.kind,
        args.tenancy.partition,
        args.tenancy.namespace,
        if args.prefix.is_empty() {
            String::new()
        } else {
            format!(" named {}*", args.prefix)
        }
    );
    let outcome = cairn_bench::runtime()
        .map_err(|e| CacheCheckError::Setup(e.to_string()))
        .and_then(|runtime| runtime.block_on(check_cache(&args, &what)));
    match outcome {
        Ok(CacheVerdict::Same { revision, count }) => {
            println!(
                "PASS: the cache holds exactly what the cluster held at revision {revision} \
                 ({count} resources)"
            );
            exit::OK
        }
        Ok(CacheVerdict::Different {
            revision,
            differences,
        }) => {
            for d in differences.iter().take(CACHE_DIFFERENCES_SHOWN_MAX) {
                println!("{d}");
            }
            if differences.len() > CACHE_DIFFERENCES_SHOWN_MAX {
                println!(
                    "... and {} more",
                    differences.len() - CACHE_DIFFERENCES_SHOWN_MAX
                );
            }
            println!(
                "FAIL: {} differences between the cache and the cluster at revision {revision} \
                 (seen in {CACHE_CHECK_ROUNDS} comparisons in a row)",
                differences.len()
            );
            1
        }
        Err(CacheCheckError::Setup(e)) => {
            eprintln!("cairn check cache: {e}");
            exit::ERROR
        }
        Err(CacheCheckError::Client(e)) => {
            eprintln!("cairn check cache: {e}");
            crate::common::exit_code(&e)
        }
    }
}

enum CacheVerdict {
    Same {
        revision: u64,
        count: usize,
    },
    Different {
        revision: u64,
        differences: Vec<CacheDifference>,
    },
}

enum CacheCheckError {
    /// The check itself could not run (no runtime).
    Setup(String),
    Client(cairn_client::ClientError),
}

impl From<cairn_client::ClientError> for CacheCheckError {
    fn from(e: cairn_client::ClientError) -> CacheCheckError {
        CacheCheckError::Client(e)
    }
}

async fn check_cache(args: &CacheArgs, what: &str) -> Result<CacheVerdict, CacheCheckError> {
    let client = crate::data::client_of(&args.global)?;
    let spec = WatchSpec {
        type_: args.type_.clone(),
        tenancy: args.tenancy.clone(),
        name_prefix: args.prefix.clone(),
        selector: String::new(),
    };
    let (group, kind) = (args.type_.group.as_str(), args.type_.kind.as_str());
    let cache = WatchCache::start(client.clone(), vec![spec], Default::default())?;
    let spinner = indicatif::ProgressBar::new_spinner().with_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    spinner.set_message(format!("priming a cache of {what}"));
    spinner.enable_steady_tick(Duration::from_millis(100));
    let started = Instant::now();
    let primed = tokio::time::timeout(
        Duration::from_secs_f64(args.prime_timeout),
        cache.wait_primed(),
    )
    .await;
    spinner.finish_and_clear();
    if primed.is_err() {
        return Err(cairn_client::ClientError::Unavailable {
            message: format!(
                "the cache of {what} did not prime within {} s",
                args.prime_timeout
            ),
            outcome: cairn_client::Outcome::NotApplied,
        }
        .into());
    }
    println!(
        "check cache: {what}: primed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let mut round = 0;
    loop {
        round += 1;
        let Some((revision, cached)) = cache.list_with_revision(group, kind) else {
            // Resyncing from scratch: the cluster changed under it.
            if round < CACHE_CHECK_ROUNDS {
                tokio::time::sleep(CACHE_CHECK_PAUSE).await;
                continue;
            }
            return Err(cairn_client::ClientError::Unavailable {
                message: format!("the cache of {what} is resyncing: the cluster changed"),
                outcome: cairn_client::Outcome::NotApplied,
            }
            .into());
        };
        let request = ListRequest {
            r#type: Some(args.type_.clone()),
            tenancy: Some(args.tenancy.clone()),
            name_prefix: args.prefix.clone(),
            consistency: Consistency::Strong as i32,
            revision,
            ..ListRequest::default()
        };
        let listed = match client.list_request(request).await {
            Ok(listed) => listed,
            // The cache's revision left the cluster's history: compare at a newer one.
            Err(cairn_client::ClientError::Compacted { .. }) if round < CACHE_CHECK_ROUNDS => {
                tokio::time::sleep(CACHE_CHECK_PAUSE).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let cached: Vec<Resource> = cached.iter().map(|r| (**r).clone()).collect();
        println!(
            "cache at revision {revision}: {} resources; cluster at revision {revision}: {}",
            cached.len(),
            listed.resources.len()
        );
        let differences = cache_differences(&cached, &listed.resources);
        if differences.is_empty() {
            return Ok(CacheVerdict::Same {
                revision,
                count: cached.len(),
            });
        }
        if round >= CACHE_CHECK_ROUNDS {
            return Ok(CacheVerdict::Different {
                revision,
                differences,
            });
        }
        tokio::time::sleep(CACHE_CHECK_PAUSE).await;
    }
}
