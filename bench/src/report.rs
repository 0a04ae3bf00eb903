//! What a run reports: latency percentiles from HDR histograms, throughput,
//! errors by kind, the generator's own CPU per op and the nodes' CPU and
//! memory; printed as a table or as one JSON document.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::procfs;

/// How a report is printed: a table for a person, or one JSON object for a script (`cairn
/// bench -o json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Table,
    Json,
}

/// Latencies are recorded in microseconds, from 1 µs to 10 minutes, with three
/// significant digits.
const LATENCY_US_MAX: u64 = 600_000_000;

pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid histogram bounds")
}

/// Records one latency (saturating at the histogram's bounds).
pub(crate) fn record(h: &mut Histogram<u64>, latency: Duration) {
    let us = (latency.as_micros().min(LATENCY_US_MAX as u128) as u64).max(1);
    h.saturating_record(us);
}

/// Percentiles of one operation kind, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    pub fn of(h: &Histogram<u64>) -> Latency {
        let ms = |us: u64| us as f64 / 1000.0;
        if h.is_empty() {
            return Latency {
                count: 0,
                mean_ms: 0.0,
                p50_ms: 0.0,
                p90_ms: 0.0,
                p99_ms: 0.0,
                p999_ms: 0.0,
                max_ms: 0.0,
            };
        }
        Latency {
            count: h.len(),
            mean_ms: h.mean() / 1000.0,
            p50_ms: ms(h.value_at_quantile(0.50)),
            p90_ms: ms(h.value_at_quantile(0.90)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        }
    }
}

/// A node process on this machine, watched during the run.
#[derive(Debug, Clone, Serialize)]
pub struct ServerProcess {
    pub endpoint: String,
    pub pid: i32,
    pub rss_before_kib: Option<u64>,
    pub rss_after_kib: Option<u64>,
    pub cpu_cores: Option<f64>,
    /// CPU of this node per operation of the window, in µs.
    pub cpu_us_per_op: Option<f64>,
    /// Context switches of this node's threads per operation of the window.
    pub context_switches_per_op: Option<f64>,
}

/// Samples the watched node processes at the start and end of the window.
pub(crate) struct ServerWatch {
    processes: Vec<Watched>,
}

/// One node process and its counters at the start of the window.
struct Watched {
    endpoint: String,
    pid: i32,
    rss_before_kib: Option<u64>,
    cpu: Option<Duration>,
    context_switches: Option<u64>,
}

impl ServerWatch {
    /// Watches `pids` if given, else the local listeners of `endpoints`.
    pub fn start(endpoints: &[String], pids: &[i32]) -> ServerWatch {
        let found: Vec<(String, i32)> = if pids.is_empty() {
            endpoints
                .iter()
                .filter_map(|e| procfs::pid_listening_on(e).map(|p| (e.clone(), p)))
                .collect()
        } else {
            pids.iter().map(|p| (String::new(), *p)).collect()
        };
        ServerWatch {
            processes: found
                .into_iter()
                .map(|(endpoint, pid)| Watched {
                    endpoint,
                    pid,
                    rss_before_kib: procfs::process_rss_kib(pid),
                    cpu: procfs::process_cpu(pid),
                    context_switches: procfs::process_context_switches(pid),
                })
                .collect(),
        }
    }

    /// Restarts the CPU and context-switch counts at the start of the
    /// window (keeps the first memory sample).
    pub fn restart_cpu(&mut self) {
        for p in &mut self.processes {
            p.cpu = procfs::process_cpu(p.pid);
            p.context_switches = procfs::process_context_switches(p.pid);
        }
    }

    /// The figures of each node over a window of `elapsed` with `ops` operations.
    pub fn finish(&self, elapsed: Duration, ops: u64) -> Vec<ServerProcess> {
        self.processes
            .iter()
            .map(|p| {
                let cpu = match (p.cpu, procfs::process_cpu(p.pid)) {
                    (Some(a), Some(b)) => Some(b.saturating_sub(a)),
                    _ => None,
                };
                let switches = match (p.context_switches, procfs::process_context_switches(p.pid)) {
                    (Some(a), Some(b)) => Some(b.saturating_sub(a)),
                    _ => None,
                };
                let per_op = |total: f64| (ops > 0).then(|| total / ops as f64);
                ServerProcess {
                    endpoint: p.endpoint.clone(),
                    pid: p.pid,
                    rss_before_kib: p.rss_before_kib,
                    rss_after_kib: procfs::process_rss_kib(p.pid),
                    cpu_cores: cpu
                        .filter(|_| !elapsed.is_zero())
                        .map(|c| c.as_secs_f64() / elapsed.as_secs_f64()),
                    cpu_us_per_op: cpu.and_then(|c| per_op(c.as_secs_f64() * 1e6)),
                    context_switches_per_op: switches.and_then(|n| per_op(n as f64)),
                }
            })
            .collect()
    }
}

/// The generator's own CPU over the measurement window.
pub(crate) struct SelfCpu {
    start: Duration,
}

impl SelfCpu {
    pub fn start() -> SelfCpu {
        SelfCpu {
            start: procfs::self_cpu(),
        }
    }

    pub fn used(&self) -> Duration {
        procfs::self_cpu().saturating_sub(self.start)
    }
}

/// Watch-specific figures.
#[derive(Debug, Clone, Serialize)]
pub struct WatchFigures {
    pub watchers: usize,
    pub writes: u64,
    pub deliveries: u64,
    /// Deliveries expected (writes x watchers) but not received.
    pub missing: u64,
    /// Deliveries received before the writer saw its acknowledgement.
    pub before_ack: u64,
}

/// Failover-specific figures.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverFigures {
    pub killed_node_id: u64,
    pub killed_pid: i32,
    pub old_term: u64,
    pub new_leader_id: Option<u64>,
    /// From the kill to the first answer naming a new leader.
    pub leader_known_ms: Option<f64>,
    /// From the kill to the first successful write through a survivor.
    pub first_write_ms: Option<f64>,
    pub written_through: Option<String>,
    pub probes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub label: Option<String>,
    pub workload: String,
    pub consistency: Option<String>,
    pub clients: usize,
    pub connections: usize,
    /// `--rate`: the most operations started per second, when limited.
    pub rate: Option<f64>,
    pub targets: Vec<String>,
    pub value_bytes: usize,
    pub key_space: u64,
    /// Encoded size of one stored resource as the node returned it.
    pub resource_encoded_bytes: Option<usize>,
    pub elapsed_s: f64,
    /// Successful operations in the window.
    pub ops: u64,
    pub ops_per_s: f64,
    pub errors: BTreeMap<String, u64>,
    /// Per operation kind (`write`, `read`, `list`, ...).
    pub latency: BTreeMap<String, Latency>,
    pub client_cpu_us_per_op: f64,
    pub client_cpu_cores: f64,
    pub servers: Vec<ServerProcess>,
    pub watch: Option<WatchFigures>,
    pub failover: Option<FailoverFigures>,
}

impl Report {
    pub fn new(workload: &str) -> Report {
        Report {
            label: None,
            workload: workload.into(),
            consistency: None,
            clients: 0,
            connections: 0,
            rate: None,
            targets: vec![],
            value_bytes: 0,
            key_space: 0,
            resource_encoded_bytes: None,
            elapsed_s: 0.0,
            ops: 0,
            ops_per_s: 0.0,
            errors: BTreeMap::new(),
            latency: BTreeMap::new(),
            client_cpu_us_per_op: 0.0,
            client_cpu_cores: 0.0,
            servers: vec![],
            watch: None,
            failover: None,
        }
    }

    /// Fills throughput and the generator's CPU from the window.
    pub fn set_window(&mut self, ops: u64, elapsed: Duration, cpu: Duration) {
        self.ops = ops;
        self.elapsed_s = elapsed.as_secs_f64();
        self.ops_per_s = if self.elapsed_s > 0.0 {
            ops as f64 / self.elapsed_s
        } else {
            0.0
        };
        self.client_cpu_us_per_op = if ops > 0 {
            cpu.as_secs_f64() * 1e6 / ops as f64
        } else {
            0.0
        };
        self.client_cpu_cores = if self.elapsed_s > 0.0 {
            cpu.as_secs_f64() / self.elapsed_s
        } else {
            0.0
        };
    }

    /// The failed operations by kind, `KIND COUNT` joined by commas (`Unavailable 3,
    /// ClientTimeout 1`); empty when none failed.
    pub fn error_counts(&self) -> String {
        self.errors
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Prints the report on stdout, in `format`.
    pub fn print(&self, format: Format) {
        match format {
            Format::Json => match serde_json::to_string_pretty(self) {
                Ok(s) => println!("{s}"),
                Err(e) => eprintln!("cairn bench: cannot encode the report: {e}"),
            },
            Format::Table => self.print_table(),
        }
    }

    fn print_table(&self) {
        let mut head = format!("workload {}", self.workload);
        if let Some(c) = &self.consistency {
            head.push_str(&format!(" ({c})"));
        }
        if let Some(l) = &self.label {
            head.push_str(&format!("  [{l}]"));
        }
        println!("{head}");
        if self.failover.is_none() {
            let rate = self
                .rate
                .map_or(String::new(), |r| format!("  rate {r} ops/s"));
            println!(
                "clients {}  connections {}{rate}  value {} B  key space {}  targets {}",
                self.clients,
                self.connections,
                self.value_bytes,
                self.key_space,
                self.targets.join(",")
            );
            println!(
                "elapsed {:.2} s  ops {}  ops/s {:.1}",
                self.elapsed_s, self.ops, self.ops_per_s
            );
        }
        if self.errors.is_empty() {
            println!("errors: none");
        } else {
            println!("errors: {}", self.error_counts());
        }
        if !self.latency.is_empty() {
            println!(
                "{:<24} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
                "latency (ms)", "count", "mean", "p50", "p90", "p99", "p99.9", "max"
            );
            for (name, l) in &self.latency {
                println!(
                    "{:<24} {:>9} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                    name, l.count, l.mean_ms, l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms
                );
            }
        }
        if let Some(w) = &self.watch {
            println!(
                "watchers {}  writes {}  deliveries {}  missing {}  delivered before the ack {}",
                w.watchers, w.writes, w.deliveries, w.missing, w.before_ack
            );
        }
        if let Some(f) = &self.failover {
            let ms = |v: Option<f64>| v.map_or("never".to_string(), |v| format!("{v:.1} ms"));
            println!(
                "killed node {} (pid {}, term {})  new leader {}",
                f.killed_node_id,
                f.killed_pid,
                f.old_term,
                f.new_leader_id.map_or("none".into(), |i| i.to_string())
            );
            println!(
                "new leader known after {}  first write after {} (through {})  probes {}",
                ms(f.leader_known_ms),
                ms(f.first_write_ms),
                f.written_through.as_deref().unwrap_or("-"),
                f.probes
            );
        }
        if let Some(b) = self.resource_encoded_bytes {
            println!("stored resource: {b} B encoded");
        }
        if self.failover.is_none() {
            println!(
                "generator CPU {:.1} µs/op ({:.2} cores)",
                self.client_cpu_us_per_op, self.client_cpu_cores
            );
        }
        let figure =
            |v: Option<f64>, digits: usize| v.map_or("?".to_string(), |v| format!("{v:.digits$}"));
        for s in &self.servers {
            let kib = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
            println!(
                "node pid {} {}: CPU {} cores, {} µs/op, {} context switches/op, RSS {} -> {} KiB",
                s.pid,
                s.endpoint,
                figure(s.cpu_cores, 2),
                figure(s.cpu_us_per_op, 1),
                figure(s.context_switches_per_op, 2),
                kib(s.rss_before_kib),
                kib(s.rss_after_kib)
            );
        }
        if self.servers.len() > 1 {
            let sum = |f: fn(&ServerProcess) -> Option<f64>| -> Option<f64> {
                self.servers.iter().map(f).sum()
            };
            println!(
                "all nodes: CPU {} µs/op, {} context switches/op",
                figure(sum(|s| s.cpu_us_per_op), 1),
                figure(sum(|s| s.context_switches_per_op), 2)
            );
        }
    }
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub(crate) struct Progress {
    bar: indicatif::ProgressBar,
    started: Instant,
    total: Duration,
}

impl Progress {
    pub fn new(what: &str, total: Duration) -> Progress {
        let bar = indicatif::ProgressBar::new(total.as_millis().max(1) as u64);
        let style = indicatif::ProgressStyle::with_template(
            "{prefix} [{elapsed_precise}] [{bar:30}] {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(what.to_string());
        Progress {
            bar,
            started: Instant::now(),
            total,
        }
    }

    pub fn update(&self, ops: u64, errors: u64) {
        let elapsed = self.started.elapsed();
        self.bar
            .set_position(elapsed.min(self.total).as_millis() as u64);
        let rate = ops as f64 / elapsed.as_secs_f64().max(1e-9);
        self.bar
            .set_message(format!("ops {ops}  {rate:.0}/s  errors {errors}"));
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_recorded_latencies() {
        // 1..=1000 ms recorded once each: p50 is about 500 ms, max 1000 ms.
        let mut h = new_histogram();
        for ms in 1..=1000u64 {
            record(&mut h, Duration::from_millis(ms));
        }
        let l = Latency::of(&h);
        assert_eq!(l.count, 1000);
        assert!((l.p50_ms - 500.0).abs() < 1.0, "{l:?}");
        assert!((l.p99_ms - 990.0).abs() < 1.5, "{l:?}");
        assert!((l.max_ms - 1000.0).abs() < 1.0, "{l:?}");
    }

    #[test]
    fn extreme_latencies_saturate_instead_of_failing() {
        // Zero and absurdly long latencies are clamped to the histogram's range.
        let mut h = new_histogram();
        record(&mut h, Duration::ZERO);
        record(&mut h, Duration::from_secs(100_000));
        assert_eq!(h.len(), 2);
        assert!(Latency::of(&h).max_ms >= 599_000.0);
    }

    #[test]
    fn throughput_and_cpu_per_op_follow_the_window() {
        // 1000 ops in 2 s with 0.5 s of CPU: 500 ops/s, 500 µs/op, 0.25 cores.
        let mut r = Report::new("write");
        r.set_window(1000, Duration::from_secs(2), Duration::from_millis(500));
        assert!((r.ops_per_s - 500.0).abs() < 1e-9);
        assert!((r.client_cpu_us_per_op - 500.0).abs() < 1e-9);
        assert!((r.client_cpu_cores - 0.25).abs() < 1e-9);
        let json = serde_json::to_value(&r).expect("json");
        assert_eq!(json["ops"], 1000);
    }
}
