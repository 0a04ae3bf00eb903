//! # jepsen-tests
//!
//! Black-box fault testing of Cairn clusters, in the manner of Jepsen but in Rust.
//! This part of the crate is the *analysis* half: it records and loads histories of
//! client operations and decides whether they are correct.
//!
//! - [`history`]: operations as JSON lines (one line per operation: process, kind,
//!   key, input, output, outcome, invoke and complete timestamps), the [`Recorder`]
//!   that workloads use to log operations cheaply from many tasks, and a parser for
//!   the Jepsen log format of the Porcupine test histories.
//! - [`linearizability`]: a linearizability checker in the manner of Porcupine —
//!   Lowe's just-in-time linearization with P-compositionality (one search per key),
//!   an explicit stack, a cache of (linearized set, state) already explored, a time
//!   budget that yields [`Verdict::Unknown`] rather than a false verdict, and for a
//!   failing key the shortest illegal prefix.
//! - [`models`]: the sequential specifications checked against: a CAS register and
//!   a key-value map partitioned by key.
//! - [`set`] and [`append`]: cheaper checkers for the set and list-append workloads.
//! - [`monotonic`]: eventual reads never go backwards on one node.
//! - [`election::check`]: leases and fencing tokens: one holder per token, no stale
//!   holder's write accepted, a stopped lease gone in time, no lease ending early.
//!
//! The binary (`src/main.rs`) exposes them as `jepsen-tests check`.
//!
//! The *fault-injection* half drives real `cairn` processes:
//!
//! - [`cluster`]: start, kill (`SIGKILL`), pause (`SIGSTOP`/`SIGCONT`), stop and
//!   restart nodes; optionally each in its own network namespace, on its own
//!   power-cut filesystem, under libfaketime; membership and leader transfer
//!   through the admin API.
//! - [`net`]: network namespaces on a bridge and nftables partitions (isolate
//!   one, halves, one-way, ring, bridge); root only, otherwise a stated skip.
//! - [`nemesis`]: the faults a scenario injects and the healing afterwards; among them
//!   the kill loops ([`nemesis::kill_loop`]): a node killed every few seconds, by `kill -9`
//!   or by the kernel's OOM killer, under large entries and frequent snapshots, and every
//!   restart required to succeed and catch up.
//! - [`memcg`]: memory cgroups (v1 or v2) that let the kernel do the killing.
//! - [`workload`]: register, set, append and watch workloads through
//!   `cairn-client`, each logical process against a random node.
//! - [`watch_check`]: exactly-once, in-order, no-rewind delivery of watch
//!   events, checked against the acknowledged writes and the final state.
//! - [`election`]: candidates campaigning for one election with leases, holders writing
//!   under their fencing token, through the fencing nemesis ([`nemesis::fencing`]).
//! - [`lifecycle`]: status writes, finalizers, deletion marks, re-creations and a
//!   selector-fed watch cache, under any nemesis; its checker is [`lifecycle::check`].
//! - [`recover`]: a 5-node cluster loses its quorum for good under the set workload, and a
//!   new cluster recovered from the survivors with `cairn recover` must keep every
//!   acknowledged add.
//! - [`runner`]: scenarios, the `ci` suite, `soak` and `prove-broken`, and the
//!   results folder (histories, node logs, nemesis logs, summary with seed).
//! - [`drill`]: one operator action (the leader killed or handed off, a rolling restart) on
//!   a running cluster under the set workload, reported as a client saw it; `cairn drill`
//!   runs it against `cairn dev` or any cluster whose members it can stop and start.
//! - [`upgrade`]: the rolling upgrade from an earlier release, built from the commit
//!   `tests/compat/releases.toml` pins, to this build, with a rollback on the way, under the
//!   register and set workloads.
//!
//! ## What this crate must not do
//! - Report a history as correct (or incorrect) without having decided it: running
//!   out of time or memory is [`Verdict::Unknown`], never a guess.
//! - Panic on a malformed history file: bad input is an [`Error`] naming the line or
//!   the operation. Broken internal invariants (a corrupted linked list, a stack that
//!   does not match the linearized set) do panic.
//! - Depend on anything outside the crate at test time: the reference histories live
//!   in `testdata/`.
//!
//! ## Concurrency model
//! Recording: a [`Recorder`] is `Clone + Send + Sync`; each clone appends finished
//! operations to one `Vec` behind a mutex, taken once per completed operation.
//! Checking: keys are independent (P-compositionality), so the checker runs one
//! single-threaded search per key on a small pool of scoped threads; the first key
//! found non-linearizable cancels the searches still running. Each search owns all
//! of its state; the only shared data are the immutable history, an atomic work
//! index, an atomic cancel flag and the result slots.
//! Fault runs: one single-threaded Tokio runtime on the main thread runs the
//! workload processes and watchers (tasks), the nemesis and the runner; nodes
//! are child processes spawned from that thread (their parent-death signal is
//! tied to it); the power-cut filesystems are served by their own FUSE threads,
//! so a node's disk I/O never waits for the runtime.
//!
//! ## Invariants
//! - A scenario whose fault cannot be injected here is reported as skipped,
//!   never as passed; every scenario heals all faults before its final reads.
//! - Every node process, namespace, mount and memory cgroup a run creates is removed
//!   when the run ends (drop, Ctrl-C, SIGTERM), and what a dead run left is removed at
//!   the next start.
//! - Every operation has `complete_ns >= invoke_ns` when it has a completion; `ok`
//!   and `fail` operations always have one (checked when a history is built).
//! - An indeterminate operation (`info`, or never completed) may take effect at any
//!   point after its invocation, or never: its return event is placed after every
//!   determinate event.
//! - During a search, an operation is marked linearized exactly when it is on the
//!   explicit stack (and, if determinate, unlinked from the event list); the stack
//!   depth equals the number of operations marked.
//! - A search reports "linearizable" only after linearizing every determinate
//!   operation of the key, and "not linearizable" only after exhausting every
//!   linearization (modulo the cache); anything else is "unknown".
//! - The verdict of a history is "not linearizable" if any key is, else "unknown" if
//!   any key is undecided, else "linearizable".

pub mod append;
pub mod cluster;
pub mod drill;
pub mod election;
pub mod error;
pub mod findings;
pub mod history;
pub mod lifecycle;
pub mod linearizability;
pub mod loopback;
pub mod memcg;
pub mod models;
pub mod monotonic;
pub mod nemesis;
pub mod net;
pub mod recover;
pub mod runner;
pub mod scoped;
pub mod set;
pub mod upgrade;
pub mod watch_check;
pub mod workload;

pub use error::Error;
pub use history::{History, OpHandle, OpKind, Operation, Outcome, Recorder, Value};

/// The result of a check, shared by every checker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The history satisfies the property (linearizable, or no set/append anomaly).
    Valid,
    /// The history violates the property; the report says where.
    Invalid,
    /// The checker could not decide (time budget or memory limit reached, or the
    /// history holds too little to judge, e.g. no final read).
    Unknown,
}

impl Verdict {
    /// Process exit code of `jepsen-tests check`: 0 valid, 1 invalid, 2 unknown.
    pub fn exit_code(self) -> i32 {
        match self {
            Verdict::Valid => 0,
            Verdict::Invalid => 1,
            Verdict::Unknown => 2,
        }
    }

    /// Combines the verdicts of independent parts (keys): any invalid part makes the
    /// whole invalid, else any unknown part makes it unknown.
    pub fn combine(self, other: Verdict) -> Verdict {
        match (self, other) {
            (Verdict::Invalid, _) | (_, Verdict::Invalid) => Verdict::Invalid,
            (Verdict::Unknown, _) | (_, Verdict::Unknown) => Verdict::Unknown,
            (Verdict::Valid, Verdict::Valid) => Verdict::Valid,
        }
    }
}
