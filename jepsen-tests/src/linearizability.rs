//! Linearizability checking in the manner of Porcupine: Lowe's just-in-time
//! linearization (Wing & Gong's search with Lowe's cache), with P-compositionality.
//!
//! A history is split into independent [`Partition`]s (one per key). For each, the
//! call and return events of the determinate operations are sorted by time into a
//! doubly linked list. The search walks the list from its head: at a call event it
//! tries to linearize that operation now (apply it to the model state); if the
//! model accepts and the configuration (set of linearized operations, new state)
//! has not been explored before, it pushes the choice on an explicit stack, unlinks
//! the operation's two events and restarts from the head. Reaching a return event
//! (the *frontier*) means that operation should have been linearized already: the
//! search first tries the indeterminate operations called before the frontier,
//! then backtracks by popping the last choice, relinking its events and trying the
//! next candidate after it. The key is linearizable when every determinate
//! operation is linearized, and not linearizable when the stack is empty at a
//! return event.
//!
//! Indeterminate operations (`return_ns = None`: `info`, or never completed) may
//! take effect any time after their call, or never. They never block anything, so
//! they are kept out of the list; once every determinate operation is linearized,
//! the rest "never took effect".
//!
//! Reductions, each sound (they only skip configurations that another explored
//! configuration covers) and each checked against a naive search in the tests:
//! - *Dominance*: a configuration is pruned when one with the same determinate set
//!   and state but a subset of its indeterminate operations was explored.
//! - *Classes*: equal indeterminate operations (e.g. timed-out writes of one value)
//!   are linearized in call order only.
//! - *Blind operations* ([`Model::is_blind`]) are not tried right after another
//!   indeterminate operation: the configuration without that one reaches the same
//!   state.
//! - *Compact keys*: a cache entry stores the frontier and which of the operations
//!   open across it are linearized, not one bit per operation of the key.
//!
//! For a failing key the report gives the shortest illegal prefix: the search is
//! exhaustive (modulo configurations proven equivalent), so the furthest return
//! event at which it ever got stuck, R, is the first event of the history after
//! which no linearization exists: no order of the operations called before R, with
//! their recorded outcomes, linearizes every operation that returned by R, while
//! every shorter prefix can be (the partial linearization that reached R proves it).
//!
//! Cost: the search is exponential in the worst case (checking linearizability is
//! NP-complete). In practice its cost grows with the number of operations open at
//! once on a key and with the timed-out operations a key accumulates (each stays a
//! candidate at every later frontier). Measured on one core (release build) on
//! generated linearizable register histories: 20 keys, 30 clients, 60,000
//! operations, 10% timeouts: 0.1 s; 10 clients on one key, 2,000 operations, 10%
//! timeouts: 0.2-0.4 s; 10 clients on one key, 10,000 operations: under 1 s with
//! values drawn from 5, about a minute with values drawn from 1,000; 20 clients
//! on one key for 10,000 operations: not decided in 60 s. Workloads should spread
//! clients over keys (Jepsen's "independent keys") and keep each key's history to
//! a few thousand operations.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::{Error, Verdict};

/// A sequential specification, applied to one partition (key).
pub trait Model {
    /// The abstract state; compared and hashed for the cache, so keep it small.
    type State: Clone + Eq + Hash;
    /// One operation with its outcome, as the model needs it. Equal operations
    /// must have equal effects (`step` gives the same result for both).
    type Op: Eq + Hash;

    fn init(&self) -> Self::State;

    /// The state after `op` took effect in `state`, or `None` if `op` (with its
    /// recorded output) is impossible in `state`.
    fn step(&self, state: &Self::State, op: &Self::Op) -> Option<Self::State>;

    /// A human-readable rendering of a state, for reports.
    fn describe_state(&self, state: &Self::State) -> String;

    /// True if `op` is always accepted and the state after it does not depend on
    /// the state before it (a blind write). Only an optimisation hint: the default
    /// `false` is always correct.
    fn is_blind(&self, op: &Self::Op) -> bool {
        let _ = op;
        false
    }
}

/// One operation of a partition, with its real-time window.
#[derive(Clone, Debug)]
pub struct PartitionOp<O> {
    /// Index of the operation in the [`History`](crate::History), for reports.
    pub history_index: usize,
    pub call_ns: u64,
    /// `None` = indeterminate: may take effect any time after the call, or never.
    pub return_ns: Option<u64>,
    pub op: O,
}

/// The operations of one key, with the model instance that interprets them.
#[derive(Clone, Debug)]
pub struct Partition<M: Model> {
    key: String,
    model: M,
    ops: Vec<PartitionOp<M::Op>>,
}

impl<M: Model> Partition<M> {
    pub fn new(key: impl Into<String>, model: M) -> Self {
        Partition {
            key: key.into(),
            model,
            ops: Vec::new(),
        }
    }

    /// Adds an operation; its return cannot precede its call.
    pub fn push(
        &mut self,
        history_index: usize,
        call_ns: u64,
        return_ns: Option<u64>,
        op: M::Op,
    ) -> Result<(), Error> {
        if let Some(return_ns) = return_ns {
            if return_ns < call_ns {
                return Err(Error::InvalidOperation {
                    index: history_index,
                    reason: format!("returns at {return_ns} before its call at {call_ns}"),
                });
            }
        }
        self.ops.push(PartitionOp {
            history_index,
            call_ns,
            return_ns,
            op,
        });
        Ok(())
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn model(&self) -> &M {
        &self.model
    }

    pub fn ops(&self) -> &[PartitionOp<M::Op>] {
        &self.ops
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// Limits of a check.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// Wall-clock budget for the whole check; when exhausted, undecided keys are
    /// reported as unknown.
    pub time_budget: Duration,
    /// Approximate memory limit of one key's cache of explored (set, state) pairs.
    pub cache_bytes_max: usize,
    /// Keys checked in parallel.
    pub threads: usize,
    /// Stop the other keys' searches once one key is found not linearizable (the
    /// verdict is then decided); `false` checks every key to the end.
    pub stop_at_first_failure: bool,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            time_budget: Duration::from_secs(60),
            cache_bytes_max: 2 << 30,
            threads: std::thread::available_parallelism().map_or(1, usize::from),
            stop_at_first_failure: true,
        }
    }
}

/// Why a key was left undecided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnknownReason {
    TimeBudgetExhausted,
    CacheLimitReached,
    /// Another key was found not linearizable first, which decides the history.
    CancelledAfterAnotherKeyFailed,
}

/// One step of a partial linearization.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinearizedStep {
    /// Index of the operation in the history.
    pub operation: usize,
    /// The model state right after it.
    pub state_after: String,
}

/// Where a key stops being linearizable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IllegalPrefix {
    /// The operation (history index) whose return ends the shortest illegal prefix:
    /// it cannot be linearized before it returned, whatever the order of the others.
    pub failing_operation: usize,
    /// Number of this key's call and return events in the illegal prefix.
    pub prefix_event_count: usize,
    /// The operations invoked within the prefix (history indices, by call time).
    pub prefix_operations: Vec<usize>,
    /// Length of the partial linearization that reached the failing return.
    pub linearized_count: usize,
    /// Its last steps (at most [`LINEARIZED_TAIL_LEN`]).
    pub linearized_tail: Vec<LinearizedStep>,
}

/// How many steps of the deepest partial linearization a report keeps.
pub const LINEARIZED_TAIL_LEN: usize = 16;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyOutcome {
    Linearizable,
    NotLinearizable(Box<IllegalPrefix>),
    Unknown(UnknownReason),
}

impl KeyOutcome {
    pub fn verdict(&self) -> Verdict {
        match self {
            KeyOutcome::Linearizable => Verdict::Valid,
            KeyOutcome::NotLinearizable(_) => Verdict::Invalid,
            KeyOutcome::Unknown(_) => Verdict::Unknown,
        }
    }
}

#[derive(Clone, Debug)]
pub struct KeyReport {
    pub key: String,
    pub operation_count: usize,
    pub outcome: KeyOutcome,
    /// Search steps taken (call events tried plus backtracks).
    pub steps: u64,
}

#[derive(Clone, Debug)]
pub struct LinearizabilityReport {
    pub verdict: Verdict,
    /// One report per key, sorted by key.
    pub keys: Vec<KeyReport>,
    pub elapsed: Duration,
}

impl LinearizabilityReport {
    /// The keys found not linearizable.
    pub fn failures(&self) -> impl Iterator<Item = (&KeyReport, &IllegalPrefix)> {
        self.keys.iter().filter_map(|report| match &report.outcome {
            KeyOutcome::NotLinearizable(prefix) => Some((report, prefix.as_ref())),
            _ => None,
        })
    }
}

/// Checks every partition, in parallel, within `options`.
pub fn check<M>(partitions: Vec<Partition<M>>, options: &CheckOptions) -> LinearizabilityReport
where
    M: Model + Sync,
    M::Op: Sync,
{
    let start = Instant::now();
    let deadline = start.checked_add(options.time_budget);
    let count = partitions.len();
    let mut order: Vec<usize> = (0..count).collect();
    order.sort_by_key(|&index| Reverse(partitions[index].len()));
    let next_index = AtomicUsize::new(0);
    let cancel = AtomicBool::new(false);
    let results: Mutex<Vec<Option<(KeyOutcome, u64)>>> =
        Mutex::new((0..count).map(|_| None).collect());

    let worker = || loop {
        let position = next_index.fetch_add(1, Ordering::Relaxed);
        let Some(&index) = order.get(position) else {
            break;
        };
        let limits = Limits {
            deadline,
            cancel: &cancel,
            cache_bytes_max: options.cache_bytes_max,
        };
        let (outcome, steps) = if cancel.load(Ordering::Relaxed) {
            (
                KeyOutcome::Unknown(UnknownReason::CancelledAfterAnotherKeyFailed),
                0,
            )
        } else {
            Search::new(&partitions[index]).run(&limits)
        };
        if options.stop_at_first_failure && matches!(outcome, KeyOutcome::NotLinearizable(_)) {
            cancel.store(true, Ordering::Relaxed);
        }
        results.lock()[index] = Some((outcome, steps));
    };
    let workers = options.threads.clamp(1, count.max(1));
    if workers == 1 {
        worker();
    } else {
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(worker);
            }
        });
    }

    let mut keys: Vec<KeyReport> = partitions
        .iter()
        .zip(results.into_inner())
        .map(|(partition, result)| {
            // Every index below `count` was taken by exactly one worker.
            let (outcome, steps) = result.expect("every partition was checked");
            KeyReport {
                key: partition.key.clone(),
                operation_count: partition.len(),
                outcome,
                steps,
            }
        })
        .collect();
    keys.sort_by(|a, b| a.key.cmp(&b.key));
    let verdict = keys.iter().fold(Verdict::Valid, |verdict, key| {
        verdict.combine(key.outcome.verdict())
    });
    LinearizabilityReport {
        verdict,
        keys,
        elapsed: start.elapsed(),
    }
}

/// Checks a single partition (no threads).
pub fn check_partition<M: Model>(partition: &Partition<M>, options: &CheckOptions) -> KeyOutcome {
    let cancel = AtomicBool::new(false);
    let limits = Limits {
        deadline: Instant::now().checked_add(options.time_budget),
        cancel: &cancel,
        cache_bytes_max: options.cache_bytes_max,
    };
    Search::new(partition).run(&limits).0
}

struct Limits<'a> {
    deadline: Option<Instant>,
    cancel: &'a AtomicBool,
    cache_bytes_max: usize,
}

/// How often (in search steps) the deadline and the cancel flag are looked at.
const LIMIT_CHECK_INTERVAL_STEPS: u64 = 1024;
const _: () = assert!(LIMIT_CHECK_INTERVAL_STEPS.is_power_of_two());

const HEAD: usize = 0;

/// Which indeterminate classes a configuration tries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ClassOrder {
    All,
    /// Right after an indeterminate operation X: a blind operation Y now reaches the
    /// same state as Y without X, a configuration that dominates this one and that
    /// the configuration before X tries itself, so blind classes are skipped.
    NotBlind,
}

/// Where the search is looking for the next operation to linearize.
#[derive(Clone, Copy, Debug)]
enum Cursor {
    /// At a node of the event list (determinate operations only).
    Event(usize),
    /// Trying the indeterminate classes from `position` on in `order` (all classes,
    /// or only those that are not blind); only operations called before the
    /// frontier (the first remaining return event) are candidates.
    Indeterminate { order: ClassOrder, position: usize },
}

/// The search state of one partition.
///
/// Operations are renumbered ("local" indices) so that the determinate ones come
/// first: `0..determinate_count`. All call and return events are numbered 1..=2n in
/// time order, so a node number is also the event's position in the key's history
/// (node 0 is the head sentinel, 2n+1 the tail sentinel). Only determinate events
/// are linked into the list: indeterminate operations never return, so they never
/// block anything. They are grouped into classes of equal operations (same effect);
/// within a class they are linearized in call order, because an earlier-called
/// twin can always stand in for a later one (it is available whenever the later
/// one is), so other orders add nothing.
struct Search<'p, M: Model> {
    partition: &'p Partition<M>,
    /// Local operation index -> index in `partition.ops`.
    local_to_partition: Vec<usize>,
    determinate_count: usize,
    next: Vec<usize>,
    prev: Vec<usize>,
    /// For each node: the local operation it belongs to.
    node_op: Vec<usize>,
    node_is_call: Vec<bool>,
    call_node: Vec<usize>,
    /// Return node of each determinate operation.
    return_node: Vec<usize>,
    tail: usize,
    /// Indeterminate operations by class, each class in call order.
    classes: Vec<Vec<usize>>,
    /// Class of each indeterminate operation (indexed by `local - determinate_count`).
    class_of: Vec<usize>,
    /// How many operations of each class are linearized (always the first ones).
    class_used: Vec<usize>,
    /// The classes whose operations are not blind, in class order.
    not_blind_classes: Vec<usize>,
    /// For each return node F: the determinate operations open across it (called
    /// before F, returning after it) are `straddlers[straddler_start[F]..straddler_start[F + 1]]`.
    straddler_start: Vec<usize>,
    straddlers: Vec<usize>,
}

impl<'p, M: Model> Search<'p, M> {
    fn new(partition: &'p Partition<M>) -> Self {
        let count = partition.ops.len();
        let is_determinate = |index: &usize| partition.ops[*index].return_ns.is_some();
        let local_to_partition: Vec<usize> = (0..count)
            .filter(is_determinate)
            .chain((0..count).filter(|index| !is_determinate(index)))
            .collect();
        let determinate_count = (0..count).filter(is_determinate).count();
        // (time, is_return, is_indeterminate, op): at equal times calls come first,
        // so touching windows count as concurrent; indeterminate returns come last.
        let mut events: Vec<(u64, bool, bool, usize)> = Vec::with_capacity(2 * count);
        for (local, &index) in local_to_partition.iter().enumerate() {
            let op = &partition.ops[index];
            events.push((op.call_ns, false, false, local));
            events.push((
                op.return_ns.unwrap_or(u64::MAX),
                true,
                op.return_ns.is_none(),
                local,
            ));
        }
        events.sort_unstable();
        let tail = 2 * count + 1;
        let mut node_op = vec![usize::MAX; tail + 1];
        let mut node_is_call = vec![false; tail + 1];
        let mut call_node = vec![0; count];
        let mut return_node = vec![tail; count];
        for (position, &(_, is_return, _, local)) in events.iter().enumerate() {
            let node = position + 1;
            node_op[node] = local;
            node_is_call[node] = !is_return;
            if is_return {
                return_node[local] = node;
            } else {
                call_node[local] = node;
            }
        }
        for local in 0..count {
            // Paired with the sort order: a call always precedes its own return.
            assert!(call_node[local] < return_node[local]);
        }
        // Link the determinate events only.
        let mut next = vec![tail; tail + 1];
        let mut prev = vec![HEAD; tail + 1];
        let mut last = HEAD;
        for node in 1..tail {
            if node_op[node] < determinate_count {
                next[last] = node;
                prev[node] = last;
                last = node;
            }
        }
        next[last] = tail;
        prev[tail] = last;

        let mut class_index: HashMap<&M::Op, usize> = HashMap::new();
        let mut classes: Vec<Vec<usize>> = Vec::new();
        let mut indeterminate: Vec<usize> = (determinate_count..count).collect();
        indeterminate.sort_by_key(|&local| call_node[local]);
        let mut class_of = vec![0; count - determinate_count];
        for local in indeterminate {
            let op = &partition.ops[local_to_partition[local]].op;
            let class = *class_index.entry(op).or_insert_with(|| {
                classes.push(Vec::new());
                classes.len() - 1
            });
            classes[class].push(local);
            class_of[local - determinate_count] = class;
        }
        let class_used = vec![0; classes.len()];
        let not_blind_classes: Vec<usize> = (0..classes.len())
            .filter(|&class| {
                let op = &partition.ops[local_to_partition[classes[class][0]]].op;
                !partition.model.is_blind(op)
            })
            .collect();

        // A configuration whose first remaining return is F has linearized every
        // determinate operation returning before F, none calling after F, and some
        // of those open across F: the straddlers of F. They are few (at most the
        // number of concurrent clients), which keeps cache entries small.
        let mut straddler_start = vec![0; tail + 2];
        let mut straddlers = Vec::new();
        let mut open: Vec<usize> = Vec::new();
        let mut open_at = vec![usize::MAX; determinate_count];
        for node in 1..=tail {
            straddler_start[node] = straddlers.len();
            let local = node_op[node];
            if node == tail || local >= determinate_count {
                continue;
            }
            if node_is_call[node] {
                open_at[local] = open.len();
                open.push(local);
            } else {
                let at = open_at[local];
                assert_eq!(open[at], local);
                open.swap_remove(at);
                if let Some(&moved) = open.get(at) {
                    open_at[moved] = at;
                }
                straddlers.extend_from_slice(&open);
            }
        }
        assert!(open.is_empty(), "every determinate call has its return");
        straddler_start[tail + 1] = straddlers.len();
        Search {
            partition,
            local_to_partition,
            determinate_count,
            next,
            prev,
            node_op,
            node_is_call,
            call_node,
            return_node,
            tail,
            classes,
            class_of,
            class_used,
            not_blind_classes,
            straddler_start,
            straddlers,
        }
    }

    /// The class at `position` of `order`, if any.
    fn class_at(&self, order: ClassOrder, position: usize) -> Option<usize> {
        match order {
            ClassOrder::All => (position < self.classes.len()).then_some(position),
            ClassOrder::NotBlind => self.not_blind_classes.get(position).copied(),
        }
    }

    /// The first return event at or after `node` in the list (the tail if none).
    fn first_return(&self, mut node: usize) -> usize {
        while node != self.tail && self.node_is_call[node] {
            node = self.next[node];
        }
        node
    }

    fn straddlers_of(&self, frontier: usize) -> &[usize] {
        &self.straddlers[self.straddler_start[frontier]..self.straddler_start[frontier + 1]]
    }

    fn is_indeterminate(&self, local: usize) -> bool {
        local >= self.determinate_count
    }

    /// Unlinks both events of the determinate operation `local`.
    fn lift(&mut self, local: usize) {
        for node in [self.call_node[local], self.return_node[local]] {
            let (before, after) = (self.prev[node], self.next[node]);
            assert_eq!(self.next[before], node);
            assert_eq!(self.prev[after], node);
            self.next[before] = after;
            self.prev[after] = before;
        }
    }

    /// Relinks both events of `local`, exactly undoing the matching [`Self::lift`].
    fn unlift(&mut self, local: usize) {
        for node in [self.return_node[local], self.call_node[local]] {
            let (before, after) = (self.prev[node], self.next[node]);
            assert_eq!(self.next[before], after);
            assert_eq!(self.prev[after], before);
            self.next[before] = node;
            self.prev[after] = node;
        }
    }

    /// The search. In each configuration the candidates are the determinate calls
    /// before the first remaining return event (tried first: cheaper explanations
    /// let the cache's dominance rule prune more), then the next operation of each
    /// indeterminate class, if it was called before that return.
    fn run(mut self, limits: &Limits<'_>) -> (KeyOutcome, u64) {
        let partition = self.partition;
        let model = &partition.model;
        let count = partition.ops.len();
        let mut linearized =
            LinearizedSet::new(self.determinate_count, count - self.determinate_count);
        let mut cache: Cache<M::State> = Cache::new(linearized.indeterminate.len());
        // (operation, state before it, cursor to resume from when it is undone,
        // frontier before it)
        let mut stack: Vec<(usize, M::State, Cursor, usize)> = Vec::new();
        let mut state = model.init();
        let mut cursor = Cursor::Event(self.next[HEAD]);
        // The first remaining return event of the current configuration.
        let mut frontier = self.first_return(self.next[HEAD]);
        let mut determinate_key: Vec<u64> = Vec::new();
        let mut steps = 0u64;
        let mut deepest_stuck_node = 0usize;
        let mut deepest_linearized_count = 0usize;
        let mut deepest_tail: Vec<(usize, M::State)> = Vec::new();

        loop {
            if self.next[HEAD] == self.tail {
                // Every determinate operation is linearized; the indeterminate ones
                // left may never have taken effect.
                return (KeyOutcome::Linearizable, steps);
            }
            if steps & (LIMIT_CHECK_INTERVAL_STEPS - 1) == 0 {
                if limits.cancel.load(Ordering::Relaxed) {
                    return (
                        KeyOutcome::Unknown(UnknownReason::CancelledAfterAnotherKeyFailed),
                        steps,
                    );
                }
                if limits
                    .deadline
                    .is_some_and(|deadline| Instant::now() >= deadline)
                {
                    return (
                        KeyOutcome::Unknown(UnknownReason::TimeBudgetExhausted),
                        steps,
                    );
                }
                if cache.bytes() > limits.cache_bytes_max {
                    return (KeyOutcome::Unknown(UnknownReason::CacheLimitReached), steps);
                }
            }
            steps += 1;

            // Pick the candidate at the cursor, or find that there is none left.
            let (candidate, resume) = match cursor {
                Cursor::Event(node) => {
                    // The list is not empty and ends with a return event, and a call is
                    // followed by its own return: the cursor cannot reach the tail.
                    assert!(node != self.tail && node != HEAD);
                    if self.node_is_call[node] {
                        (Some(self.node_op[node]), Cursor::Event(self.next[node]))
                    } else {
                        // Paired with the frontier bookkeeping on push and pop.
                        assert_eq!(node, frontier);
                        let after_indeterminate = stack
                            .last()
                            .is_some_and(|(top, _, _, _)| self.is_indeterminate(*top));
                        let order = if after_indeterminate {
                            ClassOrder::NotBlind
                        } else {
                            ClassOrder::All
                        };
                        cursor = Cursor::Indeterminate { order, position: 0 };
                        continue;
                    }
                }
                // Classes are numbered in the call order of their first operation:
                // once one was first called after the frontier, so were all later ones.
                Cursor::Indeterminate { order, position }
                    if self
                        .class_at(order, position)
                        .is_some_and(|class| self.call_node[self.classes[class][0]] < frontier) =>
                {
                    let resume = Cursor::Indeterminate {
                        order,
                        position: position + 1,
                    };
                    let class = match order {
                        ClassOrder::All => position,
                        ClassOrder::NotBlind => self.not_blind_classes[position],
                    };
                    let head = self.classes[class].get(self.class_used[class]).copied();
                    (
                        head.filter(|&local| self.call_node[local] < frontier),
                        resume,
                    )
                }
                Cursor::Indeterminate { .. } => {
                    // Stuck: the operation returning at `frontier` cannot be linearized here.
                    if frontier > deepest_stuck_node {
                        deepest_stuck_node = frontier;
                        deepest_linearized_count = stack.len();
                        let from = stack.len().saturating_sub(LINEARIZED_TAIL_LEN);
                        deepest_tail = (from..stack.len())
                            .map(|depth| {
                                let after = stack
                                    .get(depth + 1)
                                    .map_or(&state, |(_, before, _, _)| before);
                                (stack[depth].0, after.clone())
                            })
                            .collect();
                    }
                    let Some((undone, prior_state, resume, prior_frontier)) = stack.pop() else {
                        let prefix = self.illegal_prefix(
                            deepest_stuck_node,
                            deepest_linearized_count,
                            &deepest_tail,
                        );
                        return (KeyOutcome::NotLinearizable(Box::new(prefix)), steps);
                    };
                    linearized.remove(undone);
                    // Paired with the push: the stack depth is the number of linearized operations.
                    assert_eq!(stack.len(), linearized.len);
                    if self.is_indeterminate(undone) {
                        let class = self.class_of[undone - self.determinate_count];
                        self.class_used[class] -= 1;
                        assert_eq!(self.classes[class][self.class_used[class]], undone);
                    } else {
                        self.unlift(undone);
                    }
                    state = prior_state;
                    frontier = prior_frontier;
                    cursor = resume;
                    continue;
                }
            };
            cursor = resume;
            let Some(local) = candidate else {
                continue;
            };
            let op = &partition.ops[self.local_to_partition[local]].op;
            let Some(new_state) = model.step(&state, op) else {
                continue;
            };
            let indeterminate = self.is_indeterminate(local);
            if indeterminate {
                // Just after an indeterminate X (no determinate operation since), an
                // indeterminate Y of another class that would reach the same state
                // without X is left to the sibling configuration that skips X: it has
                // the same determinate set, fewer indeterminate operations and the
                // same state, so it dominates this one.
                if let Some((previous, before_previous, _, _)) = stack.last() {
                    let previous_class = self
                        .is_indeterminate(*previous)
                        .then(|| self.class_of[*previous - self.determinate_count]);
                    if previous_class
                        .is_some_and(|class| class != self.class_of[local - self.determinate_count])
                        && model.step(before_previous, op).as_ref() == Some(&new_state)
                    {
                        continue;
                    }
                }
            }
            linearized.insert(local);
            let mut new_frontier = frontier;
            if !indeterminate {
                self.lift(local);
                if self.return_node[local] == frontier {
                    new_frontier = self.first_return(self.next[HEAD]);
                }
            }
            if new_frontier == self.tail {
                // Every determinate operation is linearized.
                return (KeyOutcome::Linearizable, steps);
            }
            let straddlers = self.straddlers_of(new_frontier);
            determinate_key.clear();
            determinate_key.resize(straddlers.len().div_ceil(64), 0);
            for (at, &straddler) in straddlers.iter().enumerate() {
                if linearized.contains(straddler) {
                    determinate_key[at / 64] |= 1 << (at % 64);
                }
            }
            let key_hash = linearized.determinate_hash ^ hash_state(&new_state);
            let configuration = Configuration {
                frontier: new_frontier,
                determinate: &determinate_key,
                indeterminate: &linearized.indeterminate,
                state: &new_state,
            };
            if !cache.insert_unless_dominated(key_hash, &configuration) {
                if !indeterminate {
                    self.unlift(local);
                }
                linearized.remove(local);
                continue;
            }
            if indeterminate {
                let class = self.class_of[local - self.determinate_count];
                assert_eq!(self.classes[class][self.class_used[class]], local);
                self.class_used[class] += 1;
            }
            stack.push((
                local,
                std::mem::replace(&mut state, new_state),
                resume,
                frontier,
            ));
            frontier = new_frontier;
            cursor = Cursor::Event(self.next[HEAD]);
        }
    }

    fn illegal_prefix(
        &self,
        stuck_node: usize,
        linearized_count: usize,
        tail: &[(usize, M::State)],
    ) -> IllegalPrefix {
        // Paired with the loop: failure is only declared at a determinate return.
        assert!(stuck_node > HEAD && stuck_node < self.tail);
        assert!(!self.node_is_call[stuck_node] && !self.is_indeterminate(self.node_op[stuck_node]));
        let ops = &self.partition.ops;
        let history_index = |local: usize| ops[self.local_to_partition[local]].history_index;
        let mut prefix: Vec<usize> = (0..ops.len())
            .filter(|&local| self.call_node[local] < stuck_node)
            .collect();
        prefix.sort_by_key(|&local| self.call_node[local]);
        IllegalPrefix {
            failing_operation: history_index(self.node_op[stuck_node]),
            prefix_event_count: stuck_node,
            prefix_operations: prefix.into_iter().map(history_index).collect(),
            linearized_count,
            linearized_tail: tail
                .iter()
                .map(|(local, state)| LinearizedStep {
                    operation: history_index(*local),
                    state_after: self.partition.model.describe_state(state),
                })
                .collect(),
        }
    }
}

/// The operations linearized so far: one bitset for the determinate operations
/// (with its Zobrist hash kept up to date) and one for the indeterminate ones.
struct LinearizedSet {
    determinate_count: usize,
    determinate: Vec<u64>,
    indeterminate: Vec<u64>,
    determinate_hash: u64,
    zobrist: Vec<u64>,
    len: usize,
}

impl LinearizedSet {
    fn new(determinate_count: usize, indeterminate_count: usize) -> Self {
        LinearizedSet {
            determinate_count,
            determinate: vec![0; determinate_count.div_ceil(64)],
            indeterminate: vec![0; indeterminate_count.div_ceil(64)],
            determinate_hash: 0,
            zobrist: (0..determinate_count as u64).map(splitmix64).collect(),
            len: 0,
        }
    }

    fn toggle(&mut self, local: usize, expect_present: bool) {
        let (words, bit_index) = match local.checked_sub(self.determinate_count) {
            None => {
                self.determinate_hash ^= self.zobrist[local];
                (&mut self.determinate, local)
            }
            Some(indeterminate) => (&mut self.indeterminate, indeterminate),
        };
        let (word, bit) = (bit_index / 64, 1u64 << (bit_index % 64));
        assert_eq!(
            words[word] & bit != 0,
            expect_present,
            "linearized set out of step with the stack"
        );
        words[word] ^= bit;
    }

    fn contains(&self, local: usize) -> bool {
        let (words, bit_index) = match local.checked_sub(self.determinate_count) {
            None => (&self.determinate, local),
            Some(indeterminate) => (&self.indeterminate, indeterminate),
        };
        words[bit_index / 64] & (1 << (bit_index % 64)) != 0
    }

    fn insert(&mut self, local: usize) {
        self.toggle(local, false);
        self.len += 1;
    }

    fn remove(&mut self, local: usize) {
        self.toggle(local, true);
        self.len -= 1;
    }
}

/// A configuration of the search, in the compact form the cache stores.
struct Configuration<'a, S> {
    /// The first remaining return event. Every determinate operation returning
    /// before it is linearized and none called after it is.
    frontier: usize,
    /// Which straddlers of `frontier` are linearized (bit i = i-th straddler).
    determinate: &'a [u64],
    /// Which indeterminate operations are linearized.
    indeterminate: &'a [u64],
    state: &'a S,
}

/// The configurations already explored. Keyed by the Zobrist hash of the set of
/// linearized determinate operations combined with the state's hash; entries are
/// compared in full, so a hash collision never prunes a distinct configuration.
/// (frontier, straddler bits) identifies the determinate set exactly, in a few
/// words instead of one bit per operation of the key.
///
/// Dominance: a configuration (D ∪ I, s) is pruned when (D ∪ I', s) was explored
/// with I' ⊆ I (I, I' indeterminate). Every continuation of the larger one is a
/// continuation of the smaller one, which simply leaves the extra indeterminate
/// operations out ("never took effect"); with I' = I this is Lowe's exact cache.
///
/// Storage is flat (no allocation per entry): `heads` maps a hash to its newest
/// entry, entries with the same hash are chained through `next`, and an entry's
/// bits (determinate, then indeterminate) sit in `words` from `offset`.
struct Cache<S> {
    heads: HashMap<u64, usize, BuildHasherDefault<PrehashedHasher>>,
    entries: Vec<CacheEntry<S>>,
    words: Vec<u64>,
    indeterminate_words: usize,
}

struct CacheEntry<S> {
    state: S,
    next: usize,
    frontier: usize,
    offset: usize,
    determinate_words: usize,
}

/// End of a chain of cache entries.
const NO_ENTRY: usize = usize::MAX;

impl<S: Clone + Eq> Cache<S> {
    fn new(indeterminate_words: usize) -> Self {
        Cache {
            heads: HashMap::default(),
            entries: Vec::new(),
            words: Vec::new(),
            indeterminate_words,
        }
    }

    /// Approximate memory held.
    fn bytes(&self) -> usize {
        self.words.capacity() * std::mem::size_of::<u64>()
            + self.entries.capacity() * std::mem::size_of::<CacheEntry<S>>()
            + self.heads.capacity() * (2 * std::mem::size_of::<u64>() + 1)
    }

    /// Records the configuration; false if it (or one dominating it) was explored.
    fn insert_unless_dominated(&mut self, hash: u64, configuration: &Configuration<'_, S>) -> bool {
        // Paired with `new`: every configuration of one search has the same shape.
        assert_eq!(configuration.indeterminate.len(), self.indeterminate_words);
        let head = self.heads.get(&hash).copied().unwrap_or(NO_ENTRY);
        let mut at = head;
        while at != NO_ENTRY {
            let entry = &self.entries[at];
            if entry.frontier == configuration.frontier && entry.state == *configuration.state {
                let words = &self.words[entry.offset
                    ..entry.offset + entry.determinate_words + self.indeterminate_words];
                let (determinate, indeterminate) = words.split_at(entry.determinate_words);
                if determinate == configuration.determinate
                    && indeterminate
                        .iter()
                        .zip(configuration.indeterminate)
                        .all(|(seen, now)| seen & !now == 0)
                {
                    return false;
                }
            }
            at = entry.next;
        }
        self.heads.insert(hash, self.entries.len());
        self.entries.push(CacheEntry {
            state: configuration.state.clone(),
            next: head,
            frontier: configuration.frontier,
            offset: self.words.len(),
            determinate_words: configuration.determinate.len(),
        });
        self.words.extend_from_slice(configuration.determinate);
        self.words.extend_from_slice(configuration.indeterminate);
        true
    }
}

/// Hasher for keys that are already well-mixed 64-bit hashes.
#[derive(Default)]
struct PrehashedHasher(u64);

impl Hasher for PrehashedHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

/// A small, fast, deterministic hasher for model states.
#[derive(Default)]
struct StateHasher(u64);

impl Hasher for StateHasher {
    fn finish(&self) -> u64 {
        splitmix64(self.0)
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x517C_C1B7_2722_0A95);
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
}

fn hash_state<S: Hash>(state: &S) -> u64 {
    let mut hasher = StateHasher::default();
    state.hash(&mut hasher);
    hasher.finish()
}

fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A register of small integers with read and write only, for engine tests.
    struct TinyRegister;

    #[derive(Debug, PartialEq, Eq, Hash)]
    enum TinyOp {
        Read(i32),
        Write(i32),
    }

    impl Model for TinyRegister {
        type State = i32;
        type Op = TinyOp;

        fn init(&self) -> i32 {
            0
        }

        fn step(&self, state: &i32, op: &TinyOp) -> Option<i32> {
            match op {
                TinyOp::Read(value) => (value == state).then_some(*state),
                TinyOp::Write(value) => Some(*value),
            }
        }

        fn describe_state(&self, state: &i32) -> String {
            state.to_string()
        }
    }

    fn partition(ops: Vec<(u64, Option<u64>, TinyOp)>) -> Partition<TinyRegister> {
        let mut partition = Partition::new("k", TinyRegister);
        for (index, (call_ns, return_ns, op)) in ops.into_iter().enumerate() {
            partition.push(index, call_ns, return_ns, op).unwrap();
        }
        partition
    }

    #[test]
    fn concurrent_write_and_read_linearize_either_way() {
        // A read overlapping a write may see the old or the new value.
        let options = CheckOptions::default();
        for seen in [0, 1] {
            let p = partition(vec![
                (0, Some(10), TinyOp::Write(1)),
                (5, Some(15), TinyOp::Read(seen)),
            ]);
            assert_eq!(check_partition(&p, &options), KeyOutcome::Linearizable);
        }
    }

    #[test]
    fn stale_read_after_acknowledged_write_is_reported_with_its_prefix() {
        // A read that starts after a write returned must see it; the report names the read.
        let p = partition(vec![
            (0, Some(10), TinyOp::Write(1)),
            (20, Some(30), TinyOp::Write(2)),
            (40, Some(50), TinyOp::Read(1)),
            (60, Some(70), TinyOp::Read(2)),
        ]);
        let KeyOutcome::NotLinearizable(prefix) = check_partition(&p, &CheckOptions::default())
        else {
            panic!("expected a violation");
        };
        assert_eq!(prefix.failing_operation, 2);
        assert_eq!(prefix.prefix_event_count, 6);
        assert_eq!(prefix.prefix_operations, vec![0, 1, 2]);
        assert_eq!(prefix.linearized_count, 2);
        let states: Vec<&str> = prefix
            .linearized_tail
            .iter()
            .map(|step| step.state_after.as_str())
            .collect();
        assert_eq!(states, vec!["1", "2"]);
    }

    #[test]
    fn indeterminate_write_may_take_effect_late_or_never() {
        // A write without a return can explain a later read, or be ignored.
        let options = CheckOptions::default();
        for seen in [0, 7] {
            let p = partition(vec![
                (0, None, TinyOp::Write(7)),
                (100, Some(110), TinyOp::Read(seen)),
            ]);
            assert_eq!(check_partition(&p, &options), KeyOutcome::Linearizable);
        }
        let p = partition(vec![
            (50, None, TinyOp::Write(7)),
            (0, Some(10), TinyOp::Read(7)),
        ]);
        assert!(matches!(
            check_partition(&p, &options),
            KeyOutcome::NotLinearizable(_)
        ));
    }

    #[test]
    fn zero_time_budget_yields_unknown_not_a_verdict() {
        // With no time at all the checker must say "unknown".
        let p = partition(vec![(0, Some(1), TinyOp::Read(5))]);
        let options = CheckOptions {
            time_budget: Duration::ZERO,
            ..CheckOptions::default()
        };
        assert_eq!(
            check_partition(&p, &options),
            KeyOutcome::Unknown(UnknownReason::TimeBudgetExhausted)
        );
    }

    #[test]
    fn one_failing_key_makes_the_history_invalid() {
        // Keys are checked independently and the verdicts combine.
        let good = partition(vec![
            (0, Some(1), TinyOp::Write(3)),
            (2, Some(3), TinyOp::Read(3)),
        ]);
        let mut bad = partition(vec![(0, Some(1), TinyOp::Read(9))]);
        bad.key = "b".into();
        let options = CheckOptions {
            threads: 2,
            ..CheckOptions::default()
        };
        let report = check(vec![good, bad], &options);
        assert_eq!(report.verdict, Verdict::Invalid);
        assert_eq!(report.failures().count(), 1);
        assert_eq!(report.failures().next().unwrap().0.key, "b");
    }
}
