//! The election checker: pure functions over what an election run recorded (the history of
//! the candidates, the watch log of the election resource, the nemesis's fault windows and
//! the final listing of the fenced writes), each deciding one promise of leases and fencing
//! (`docs/contract.md`, "Leases, elections and fencing"):
//!
//! 1. **One holder per token, and tokens do not overlap** ([`check_writes`], with
//!    [`tokens`]): every token (the version of a winning create, hence a revision) is seen
//!    held by one client only, and every fenced write that applied under token `T` applied at
//!    a revision inside `T`'s tenure: after `T`, and no later than the revision that deleted
//!    the election resource held at `T` (a watch's Delete, a resign or a revoke answered) and
//!    than the next higher token (whose create needed the resource gone).
//! 2. **No write of a stale holder was accepted** (also [`check_writes`]): in particular the
//!    one write a holder makes with its old token after a pause longer than its TTL must be
//!    refused, unless its tenure was still running at the revision it applied at. A write the
//!    fence refused must not be stored at the end; an acknowledged one must be, at the
//!    revision it was answered with.
//! 3. **A stopped lease goes in time** ([`check_late_expiry`]): once a holder stops renewing,
//!    its election resource is seen gone within [`Timing::expiry_deadline_ns`] of the answer
//!    to its last acknowledged renewal (its TTL, an election, two expiry ticks and a slack;
//!    faults that may cost a leader or restart nodes extend it), and no keep-alive sent after
//!    that deadline renews the lease.
//! 4. **No lease ends early** ([`check_early_expiry`]): a lease renewed by an acknowledged
//!    grant or keep-alive sent at `s` is not seen gone (a keep-alive answered 0, a campaign
//!    refused for want of it, its election resource seen deleted) before `s + TTL`, unless
//!    its owner revoked it or resigned first.
//!
//! Each sighting of an end is an upper bound on when the end happened: a watch's Delete is
//! sent after the delete applied, and a strong read, a refused fenced write, a winning create
//! and a keep-alive answered 0 are answered after their entry was decided. Each renewal's
//! send is a lower bound on when the lease's clock restarted (a node sees a renewal only once
//! it is committed). So check 4 never blames a correct cluster, and check 3 uses the answer
//! to the renewal (after it applied) as the start of its deadline.
//!
//! Invariants of the functions here: they read their inputs only (no clock, no I/O); every
//! anomaly names the operations (history indices) or watch records that show it; a lease or
//! token the records cannot judge (a keep-alive of unknown outcome that could have renewed
//! it, a deadline after the run stopped looking) is counted as not judged, never passed or
//! failed.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::history::{History, OpKind, Operation, Outcome, Value};
use crate::workload::WatchRecord;
use crate::Verdict;

/// The name of the election resource, and the key of its operations.
pub const ELECTION_KEY: &str = "leader";
/// The key of the lease operations (grant, keepalive, revoke).
pub const LEASE_KEY: &str = "lease";
/// The category of a `fenced` write (or a `resign`) the fence refused (FAILED_PRECONDITION
/// naming the fence): the first element of its `fail` output.
pub const REFUSED_BY_FENCE: &str = "refused-by-fence";
/// The category of a `campaign` refused because its lease no longer exists.
pub const LEASE_GONE: &str = "lease-gone";
/// The category of a `campaign` refused because the election was held (CAS conflict).
pub const HELD: &str = "held";
/// The process of the final reads.
pub const FINAL_PROCESS: u64 = u64::MAX;

const NS_PER_MS: u64 = 1_000_000;

/// The name of fenced write `seq` of client `process` (a resource of its own, created by
/// the write: its version is the revision it applied at).
pub fn write_name(process: u64, seq: u64) -> String {
    format!("w{process:02}-{seq:05}")
}

/// The `fail` output of an operation refused for `category`, with the node's message.
pub fn refusal(category: &str, message: &str) -> Value {
    Value::List(vec![category.into(), message.into()])
}

/// How a fault may delay the expiry of a lease (it never hastens one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultEffect {
    /// Leaves the leader and its monotonic clock alone: a jump of a wall clock.
    NoDelay,
    /// May cost the cluster its leader for an election: a partition, a SIGSTOP, a leader
    /// transfer.
    LeaderChange,
    /// Restarts nodes (and may leave no quorum until they are back): a restarted node that
    /// leads later measures every lease from when it read it back.
    Restart,
}

/// One fault of the nemesis, on the history's clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultWindow {
    pub what: String,
    pub from_ns: u64,
    /// When it was healed (for a kill: when the nodes were started again).
    pub to_ns: u64,
    pub effect: FaultEffect,
}

/// The cluster's timing, which check 3's deadline is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timing {
    /// The nodes' `--election-timeout-ms`: a follower campaigns 1.0–1.2 times this after the
    /// last heartbeat.
    pub election_timeout_ms: u64,
    /// How often the leader looks for expired leases (and every node notes renewals).
    pub expiry_tick_ms: u64,
    /// For the commit of the expiry, its delivery to a watcher and the runner's own
    /// scheduling (two cores shared with three nodes).
    pub slack_ms: u64,
    /// How long a killed node takes to start again and read its state back.
    pub restart_ms: u64,
}

impl Timing {
    /// The timing of a cluster whose nodes run with `--election-timeout-ms
    /// election_timeout_ms`.
    pub fn of_cluster(election_timeout_ms: u64) -> Timing {
        Timing {
            election_timeout_ms,
            expiry_tick_ms: 100,
            slack_ms: 1_000,
            restart_ms: 1_500,
        }
    }

    /// How long replacing a leader may take: the wait before a follower campaigns (up to
    /// 1.2 election timeouts) and a split vote (up to another), rounded up to two.
    pub fn leader_change_ms(&self) -> u64 {
        2 * self.election_timeout_ms
    }

    /// The latest moment a lease of `ttl_ms`, last renewed by a renewal answered at
    /// `renewed_ns`, may be seen alive once its owner stopped renewing: its TTL, a leader
    /// change, two expiry ticks (the renewal is noted at a tick, the expiry decided at
    /// another) and the slack; each fault overlapping the wait adds a leader change, and a
    /// restart gives the lease the whole budget again from when the node was started (plus
    /// [`Timing::restart_ms`]).
    pub fn expiry_deadline_ns(&self, renewed_ns: u64, ttl_ms: u64, faults: &[FaultWindow]) -> u64 {
        let budget_ns =
            (ttl_ms + self.leader_change_ms() + 2 * self.expiry_tick_ms + self.slack_ms)
                * NS_PER_MS;
        let leader_change_ns = self.leader_change_ms() * NS_PER_MS;
        let mut deadline = renewed_ns + budget_ns;
        let mut ordered: Vec<&FaultWindow> = faults.iter().collect();
        ordered.sort_by_key(|f| (f.from_ns, f.to_ns));
        for fault in ordered {
            // Faults that start after the deadline do not move it; the later ones neither.
            if fault.from_ns >= deadline {
                break;
            }
            if fault.to_ns <= renewed_ns {
                continue;
            }
            match fault.effect {
                FaultEffect::NoDelay => {}
                FaultEffect::LeaderChange => deadline += leader_change_ns,
                FaultEffect::Restart => {
                    deadline = (deadline + leader_change_ns)
                        .max(fault.to_ns + self.restart_ms * NS_PER_MS + budget_ns)
                }
            }
        }
        assert!(deadline >= renewed_ns + budget_ns, "faults only extend it");
        deadline
    }
}

/// What the run read once every fault was healed, and until when it looked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalState {
    /// Every fenced write stored at the end: its name ([`write_name`]) and revision.
    pub writes: BTreeMap<String, u64>,
    /// The revision of that listing.
    pub revision: u64,
    /// Until when the watchers and the final read looked (history clock): an end due later
    /// is not judged.
    pub observed_until_ns: u64,
}

/// Everything the records say about one token: one win of the election.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenRecord {
    pub token: u64,
    /// The clients seen holding it (the winning campaign, watch upserts, reads).
    pub clients: BTreeSet<u64>,
    /// The leases it was seen attached to.
    pub leases: BTreeSet<u64>,
    /// When the run first knew it existed.
    pub known_ns: u64,
    /// The revision that deleted it, when a watch's Delete, a resign or a revoke showed it.
    pub deleted_at: Option<u64>,
    /// When its holder asked to resign, or to revoke its lease: it may end then.
    pub released_ns: Option<u64>,
}

/// Something the records show that a correct cluster cannot do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Anomaly {
    /// Check 1: one token seen held by several clients.
    TokenShared { token: u64, clients: Vec<u64> },
    /// Check 1: a token won while the election was still held at a lower one (its deletion
    /// came after the higher token's create).
    TokensOverlap {
        token: u64,
        deleted_at: u64,
        next: u64,
    },
    /// Check 1: a fenced write applied under a token no record shows won, or by a client the
    /// token does not belong to.
    WriteUnderForeignToken {
        op: usize,
        process: u64,
        token: u64,
        revision: u64,
        holders: Vec<u64>,
    },
    /// Checks 1 and 2: a fenced write under `token` applied outside its tenure (before it,
    /// or after the election moved on): a stale holder's write was accepted.
    WriteOutsideTenure {
        op: usize,
        process: u64,
        token: u64,
        revision: u64,
        /// The tenure: `(token, end]`, and what ended it.
        end: u64,
        ended_by: String,
        /// The holder's one write after a pause.
        stale: bool,
    },
    /// Check 2: a write the fence refused is stored.
    RefusedButApplied { op: usize, revision: u64 },
    /// Check 1: an acknowledged fenced write is not stored at the end, or at another revision.
    AcknowledgedWriteLost {
        op: usize,
        revision: u64,
        stored: Option<u64>,
    },
    /// Check 3: a stopped lease's election resource was seen gone after its deadline (or not
    /// at all, though the run looked past the deadline).
    ExpiredLate {
        token: u64,
        lease: u64,
        /// The last acknowledged renewal (history index) and when it was answered.
        renewal: usize,
        renewed_ns: u64,
        deadline_ns: u64,
        seen_gone_ns: Option<u64>,
    },
    /// Check 3: a keep-alive sent after the lease's deadline renewed it.
    LeaseOutlived {
        lease: u64,
        renewal: usize,
        deadline_ns: u64,
        keep_alive: usize,
        sent_ns: u64,
    },
    /// Check 4: a lease seen gone before a TTL had passed since an acknowledged renewal was
    /// sent.
    ExpiredEarly {
        lease: u64,
        renewal: usize,
        sent_ns: u64,
        ttl_ms: u64,
        seen_gone_ns: u64,
        seen_by: String,
    },
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |ns: u64| ns as f64 / 1e6;
        match self {
            Anomaly::TokenShared { token, clients } => {
                write!(f, "token {token} is held by several clients: {clients:?}")
            }
            Anomaly::TokensOverlap {
                token,
                deleted_at,
                next,
            } => write!(
                f,
                "token {next} was won while token {token} was still held (deleted only at revision {deleted_at})"
            ),
            Anomaly::WriteUnderForeignToken {
                op,
                process,
                token,
                revision,
                holders,
            } => write!(
                f,
                "#{op}: process {process}'s fenced write under token {token} applied at revision {revision}, but the token belongs to {holders:?}"
            ),
            Anomaly::WriteOutsideTenure {
                op,
                process,
                token,
                revision,
                end,
                ended_by,
                stale,
            } => write!(
                f,
                "#{op}: process {process}'s {}fenced write under token {token} applied at revision {revision}, outside the token's tenure ({token}, {end}] ({ended_by})",
                if *stale { "post-pause " } else { "" }
            ),
            Anomaly::RefusedButApplied { op, revision } => write!(
                f,
                "#{op}: a fenced write refused by the fence is stored (revision {revision})"
            ),
            Anomaly::AcknowledgedWriteLost {
                op,
                revision,
                stored,
            } => match stored {
                Some(stored) => write!(
                    f,
                    "#{op}: a fenced write acknowledged at revision {revision} is stored at {stored}"
                ),
                None => write!(
                    f,
                    "#{op}: a fenced write acknowledged at revision {revision} is not stored at the end"
                ),
            },
            Anomaly::ExpiredLate {
                token,
                lease,
                renewal,
                renewed_ns,
                deadline_ns,
                seen_gone_ns,
            } => write!(
                f,
                "token {token} (lease {lease}): last renewed by #{renewal} (answered at {:.1} ms), due to go by {:.1} ms, {}",
                ms(*renewed_ns),
                ms(*deadline_ns),
                match seen_gone_ns {
                    Some(at) => format!("first seen gone at {:.1} ms ({:.1} ms late)", ms(*at), ms(at - deadline_ns)),
                    None => "never seen gone".to_owned(),
                }
            ),
            Anomaly::LeaseOutlived {
                lease,
                renewal,
                deadline_ns,
                keep_alive,
                sent_ns,
            } => write!(
                f,
                "lease {lease}: last renewed by #{renewal}, due to go by {:.1} ms, renewed again by #{keep_alive} sent at {:.1} ms",
                ms(*deadline_ns),
                ms(*sent_ns)
            ),
            Anomaly::ExpiredEarly {
                lease,
                renewal,
                sent_ns,
                ttl_ms,
                seen_gone_ns,
                seen_by,
            } => write!(
                f,
                "lease {lease}: renewed by #{renewal} sent at {:.1} ms (TTL {ttl_ms} ms, so alive until at least {:.1} ms), seen gone at {:.1} ms by {seen_by} ({:.1} ms early)",
                ms(*sent_ns),
                ms(sent_ns + ttl_ms * NS_PER_MS),
                ms(*seen_gone_ns),
                ms(sent_ns + ttl_ms * NS_PER_MS - seen_gone_ns)
            ),
        }
    }
}

/// What one check found: its anomalies and a few lines of counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Finding {
    pub anomalies: Vec<Anomaly>,
    pub summary: Vec<String>,
}

/// The counts the run must reach to have tested anything ([`Report::counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Distinct tokens won.
    pub tokens: usize,
    /// Fenced writes acknowledged.
    pub writes_acknowledged: usize,
    /// Post-pause writes attempted, and how many of them the fence refused.
    pub stale_writes: usize,
    pub stale_writes_refused: usize,
    /// Stopped leases whose end check 3 judged.
    pub stops_judged: usize,
    /// Acknowledged renewals check 4 compared with a sighting of their lease's end.
    pub renewals_compared: usize,
}

/// The whole check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub verdict: Verdict,
    pub counts: Counts,
    /// Per check: its name and what it found.
    pub checks: Vec<(&'static str, Finding)>,
}

fn uint(value: &Value) -> Option<u64> {
    match value {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::Str(s) => s.parse().ok(),
        _ => None,
    }
}

fn uints(value: &Value) -> Option<Vec<u64>> {
    match value {
        Value::List(items) => items.iter().map(uint).collect(),
        _ => None,
    }
}

/// The category of a refused operation's output ([`refusal`]).
fn category(value: &Value) -> Option<&str> {
    match value {
        Value::List(items) => match items.first() {
            Some(Value::Str(category)) => Some(category),
            _ => None,
        },
        _ => None,
    }
}

/// A fenced write as recorded: `[token, seq, stale]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FencedInput {
    pub token: u64,
    pub seq: u64,
    pub stale: bool,
}

impl FencedInput {
    pub fn value(&self) -> Value {
        Value::List(vec![
            Value::Int(self.token as i64),
            Value::Int(self.seq as i64),
            Value::Int(i64::from(self.stale)),
        ])
    }

    fn parse(value: &Value) -> Option<FencedInput> {
        match uints(value)?.as_slice() {
            [token, seq, stale] => Some(FencedInput {
                token: *token,
                seq: *seq,
                stale: *stale != 0,
            }),
            _ => None,
        }
    }
}

/// The holder a read or a watch saw: `[token, client, lease]` (reads) or the version and
/// `[client, lease]` (watch records).
fn holder_of_read(output: &Value) -> Option<(u64, u64, u64)> {
    match uints(output)?.as_slice() {
        [token, client, lease] => Some((*token, *client, *lease)),
        _ => None,
    }
}

fn holder_of_record(record: &WatchRecord) -> Option<(u64, u64, u64)> {
    let token = record.version.parse().ok()?;
    match uints(&record.value)?.as_slice() {
        [client, lease] => Some((token, *client, *lease)),
        _ => None,
    }
}

fn is_election(op: &Operation) -> bool {
    op.key == ELECTION_KEY
}

/// Every token the records show, with who held it, its lease, when it was first known,
/// how it ended and when its holder released it.
pub fn tokens(history: &History, watch: &[WatchRecord]) -> BTreeMap<u64, TokenRecord> {
    let mut tokens: BTreeMap<u64, TokenRecord> = BTreeMap::new();
    let mut note = |token: u64, client: u64, lease: u64, at_ns: u64| {
        let record = tokens.entry(token).or_insert_with(|| TokenRecord {
            token,
            known_ns: at_ns,
            ..TokenRecord::default()
        });
        record.clients.insert(client);
        record.leases.insert(lease);
        record.known_ns = record.known_ns.min(at_ns);
    };
    let ops = history.operations();
    for op in ops.iter().filter(|op| is_election(op)) {
        let Some(complete_ns) = op.complete_ns else {
            continue;
        };
        match (op.op, op.outcome) {
            (OpKind::Campaign, Outcome::Ok) => {
                if let (Some(token), Some(lease)) = (uint(&op.output), uint(&op.input)) {
                    note(token, op.process, lease, complete_ns);
                }
            }
            (OpKind::Read, Outcome::Ok) => {
                if let Some((token, client, lease)) = holder_of_read(&op.output) {
                    note(token, client, lease, complete_ns);
                }
            }
            _ => {}
        }
    }
    for record in watch.iter().filter(|r| r.name == ELECTION_KEY) {
        if record.event == "upsert" {
            if let Some((token, client, lease)) = holder_of_record(record) {
                note(token, client, lease, record.at_ns);
            }
        }
    }
    // How each ended: a watch's Delete, a resign answered, a revoke answered.
    let ended = |tokens: &mut BTreeMap<u64, TokenRecord>, token: u64, revision: u64| {
        if let Some(record) = tokens.get_mut(&token) {
            record.deleted_at = Some(record.deleted_at.map_or(revision, |d| d.min(revision)));
        }
    };
    for record in watch.iter().filter(|r| r.name == ELECTION_KEY) {
        if record.event == "delete" {
            if let Ok(token) = record.version.parse() {
                ended(&mut tokens, token, record.revision);
            }
        }
    }
    for op in ops {
        match (op.op, op.outcome) {
            (OpKind::Resign, Outcome::Ok) => {
                if let (Some(token), Some(revision)) = (uint(&op.input), uint(&op.output)) {
                    if revision > 0 {
                        ended(&mut tokens, token, revision);
                    }
                }
            }
            (OpKind::Revoke, Outcome::Ok) => {
                if let (Some(lease), Some(revision)) = (uint(&op.input), uint(&op.output)) {
                    let of_lease: Vec<u64> = tokens
                        .values()
                        .filter(|t| t.leases.contains(&lease) && t.token < revision)
                        .map(|t| t.token)
                        .collect();
                    for token in of_lease {
                        // Only one that was still held then: the earlier ones ended before.
                        if tokens[&token].deleted_at.is_none_or(|d| d >= revision) {
                            ended(&mut tokens, token, revision);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    // Released: a resign of the token, or a revoke of its lease, was asked for.
    for op in ops {
        let released: Vec<u64> = match op.op {
            OpKind::Resign => uint(&op.input).into_iter().collect(),
            OpKind::Revoke => match uint(&op.input) {
                Some(lease) => tokens
                    .values()
                    .filter(|t| t.leases.contains(&lease))
                    .map(|t| t.token)
                    .collect(),
                None => vec![],
            },
            _ => continue,
        };
        for token in released {
            if let Some(record) = tokens.get_mut(&token) {
                record.released_ns = Some(
                    record
                        .released_ns
                        .map_or(op.invoke_ns, |r| r.min(op.invoke_ns)),
                );
            }
        }
    }
    tokens
}

/// The end of `token`'s tenure: the revision that deleted it, or (if earlier, or the only
/// thing known) the next higher token, whose create needed it gone; `None` when it was still
/// held at the end as far as the records show.
pub fn tenure_end(tokens: &BTreeMap<u64, TokenRecord>, token: u64) -> Option<(u64, String)> {
    let deleted = tokens
        .get(&token)
        .and_then(|t| t.deleted_at)
        .map(|d| (d, format!("deleted at revision {d}")));
    let next = tokens
        .range(token + 1..)
        .next()
        .map(|(next, _)| (*next, format!("token {next} won at revision {next}")));
    match (deleted, next) {
        (Some(d), Some(n)) => Some(if d.0 <= n.0 { d } else { n }),
        (d, n) => d.or(n),
    }
}

/// Check 1's part about tokens alone: each held by one client, and none won while a lower
/// one was still held.
pub fn check_tokens(tokens: &BTreeMap<u64, TokenRecord>) -> Finding {
    let mut finding = Finding::default();
    for record in tokens.values() {
        if record.clients.len() > 1 {
            finding.anomalies.push(Anomaly::TokenShared {
                token: record.token,
                clients: record.clients.iter().copied().collect(),
            });
        }
        if let (Some(deleted_at), Some((next, _))) =
            (record.deleted_at, tokens.range(record.token + 1..).next())
        {
            if deleted_at > *next {
                finding.anomalies.push(Anomaly::TokensOverlap {
                    token: record.token,
                    deleted_at,
                    next: *next,
                });
            }
        }
    }
    let clients: BTreeSet<u64> = tokens.values().flat_map(|t| t.clients.clone()).collect();
    finding.summary.push(format!(
        "{} tokens won by {} clients, {} of them seen deleted",
        tokens.len(),
        clients.len(),
        tokens.values().filter(|t| t.deleted_at.is_some()).count()
    ));
    finding
}

/// Checks 1 and 2 on the fenced writes: each applied one inside its token's tenure, by the
/// token's holder; none the fence refused stored; every acknowledged one stored at its
/// revision.
pub fn check_writes(
    history: &History,
    tokens: &BTreeMap<u64, TokenRecord>,
    last: &FinalState,
) -> Finding {
    let mut finding = Finding::default();
    let (mut acknowledged, mut refused, mut unknown, mut unknown_applied) = (0, 0, 0, 0);
    let (mut stale, mut stale_refused, mut stale_applied) = (0, 0, 0);
    for (index, op) in history.operations().iter().enumerate() {
        if op.op != OpKind::Fenced {
            continue;
        }
        let Some(input) = FencedInput::parse(&op.input) else {
            continue;
        };
        let stored = last.writes.get(&write_name(op.process, input.seq)).copied();
        stale += usize::from(input.stale);
        let applied_at = match (op.outcome, op.complete_ns) {
            (Outcome::Ok, Some(_)) => {
                acknowledged += 1;
                let revision = uint(&op.output).unwrap_or(0);
                if stored != Some(revision) {
                    finding.anomalies.push(Anomaly::AcknowledgedWriteLost {
                        op: index,
                        revision,
                        stored,
                    });
                }
                Some(revision)
            }
            (Outcome::Fail, Some(_)) => {
                let by_fence = category(&op.output) == Some(REFUSED_BY_FENCE);
                refused += usize::from(by_fence);
                stale_refused += usize::from(by_fence && input.stale);
                if let Some(revision) = stored {
                    finding.anomalies.push(Anomaly::RefusedButApplied {
                        op: index,
                        revision,
                    });
                }
                None
            }
            _ => {
                unknown += 1;
                unknown_applied += usize::from(stored.is_some());
                stored
            }
        };
        let Some(revision) = applied_at else {
            continue;
        };
        stale_applied += usize::from(input.stale);
        let holders: Vec<u64> = tokens
            .get(&input.token)
            .map(|t| t.clients.iter().copied().collect())
            .unwrap_or_default();
        if !holders.contains(&op.process) {
            finding.anomalies.push(Anomaly::WriteUnderForeignToken {
                op: index,
                process: op.process,
                token: input.token,
                revision,
                holders,
            });
            continue;
        }
        let outside = match tenure_end(tokens, input.token) {
            // A write in the entry of its token's own create can only follow it.
            _ if revision < input.token => Some((input.token, "before the token existed".into())),
            // In the same entry as the end (a batch of writes), it may have come first.
            Some((end, ended_by)) if revision > end => Some((end, ended_by)),
            _ => None,
        };
        if let Some((end, ended_by)) = outside {
            finding.anomalies.push(Anomaly::WriteOutsideTenure {
                op: index,
                process: op.process,
                token: input.token,
                revision,
                end,
                ended_by,
                stale: input.stale,
            });
        }
    }
    finding.summary.push(format!(
        "fenced writes: {acknowledged} acknowledged, {refused} refused by the fence, {unknown} of unknown outcome ({unknown_applied} of them stored)"
    ));
    finding.summary.push(format!(
        "post-pause writes under an old token: {stale}, {stale_refused} refused by the fence, {stale_applied} applied (allowed only within the token's tenure)"
    ));
    finding
}

/// Every sighting of each token's end (history clock, what saw it), earliest first: a
/// watch's Delete; a strong read invoked after the token was known that shows another
/// holder or none; a create of a higher token; a fenced write under it refused by the fence;
/// a keep-alive of its lease answered 0, or a campaign refused for want of its lease.
pub fn token_ends(
    history: &History,
    watch: &[WatchRecord],
    tokens: &BTreeMap<u64, TokenRecord>,
) -> BTreeMap<u64, Vec<(u64, String)>> {
    let mut ends: BTreeMap<u64, Vec<(u64, String)>> = BTreeMap::new();
    let lease_ends = lease_sightings(history);
    for record in tokens.values() {
        let token = record.token;
        let seen = ends.entry(token).or_default();
        for (i, r) in watch.iter().enumerate() {
            if r.name == ELECTION_KEY && r.event == "delete" && r.version == token.to_string() {
                seen.push((r.at_ns, format!("watch record {i} (node {})", r.node)));
            }
        }
        for (index, op) in history.operations().iter().enumerate() {
            let Some(complete_ns) = op.complete_ns else {
                continue;
            };
            let shows_end = match (op.op, op.outcome) {
                (OpKind::Read, Outcome::Ok) if is_election(op) => {
                    op.invoke_ns > record.known_ns
                        && holder_of_read(&op.output).is_none_or(|(t, _, _)| t != token)
                }
                (OpKind::Campaign, Outcome::Ok) => uint(&op.output).is_some_and(|t| t > token),
                (OpKind::Fenced, Outcome::Fail) => {
                    category(&op.output) == Some(REFUSED_BY_FENCE)
                        && FencedInput::parse(&op.input).is_some_and(|i| i.token == token)
                }
                _ => false,
            };
            if shows_end {
                seen.push((complete_ns, format!("#{index} ({})", op.op)));
            }
        }
        for lease in &record.leases {
            for (at_ns, index) in lease_ends.get(lease).into_iter().flatten() {
                seen.push((*at_ns, format!("#{index} (lease {lease} gone)")));
            }
        }
        seen.sort();
    }
    ends
}

/// When each lease was seen gone by its owner: a keep-alive answered 0, a campaign refused
/// because the lease does not exist (completion time, history index).
fn lease_sightings(history: &History) -> BTreeMap<u64, Vec<(u64, usize)>> {
    let mut seen: BTreeMap<u64, Vec<(u64, usize)>> = BTreeMap::new();
    for (index, op) in history.operations().iter().enumerate() {
        let (Some(complete_ns), Some(lease)) = (op.complete_ns, uint(&op.input)) else {
            continue;
        };
        let gone = match (op.op, op.outcome) {
            (OpKind::KeepAlive, Outcome::Ok) => uint(&op.output) == Some(0),
            (OpKind::Campaign, Outcome::Fail) => category(&op.output) == Some(LEASE_GONE),
            _ => false,
        };
        if gone {
            seen.entry(lease).or_default().push((complete_ns, index));
        }
    }
    seen
}

/// One lease's renewals (its grant and its keep-alives, history indices, in the order they
/// were sent) and its TTL.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseRecord {
    pub lease: u64,
    pub ttl_ms: u64,
    pub renewals: Vec<usize>,
    /// When its owner asked to revoke it.
    pub revoked_ns: Option<u64>,
}

/// Every lease granted (an acknowledged grant), with its renewals.
pub fn leases(history: &History) -> BTreeMap<u64, LeaseRecord> {
    let ops = history.operations();
    let mut leases: BTreeMap<u64, LeaseRecord> = BTreeMap::new();
    for (index, op) in ops.iter().enumerate() {
        if let (OpKind::Grant, Outcome::Ok) = (op.op, op.outcome) {
            let (Some(ttl_ms), Some(answer)) = (uint(&op.input), uints(&op.output)) else {
                continue;
            };
            if let Some(lease) = answer.first() {
                leases.insert(
                    *lease,
                    LeaseRecord {
                        lease: *lease,
                        ttl_ms,
                        renewals: vec![index],
                        revoked_ns: None,
                    },
                );
            }
        }
    }
    for (index, op) in ops.iter().enumerate() {
        let Some(lease) = uint(&op.input) else {
            continue;
        };
        let Some(record) = leases.get_mut(&lease) else {
            continue;
        };
        match op.op {
            OpKind::KeepAlive => record.renewals.push(index),
            OpKind::Revoke => {
                record.revoked_ns = Some(
                    record
                        .revoked_ns
                        .map_or(op.invoke_ns, |r| r.min(op.invoke_ns)),
                )
            }
            _ => {}
        }
    }
    for record in leases.values_mut() {
        record.renewals.sort_by_key(|i| (ops[*i].invoke_ns, *i));
    }
    leases
}

/// Whether renewal `op` (a grant or a keep-alive) was acknowledged as renewing its lease.
fn renewed(op: &Operation) -> bool {
    op.outcome == Outcome::Ok
        && op.complete_ns.is_some()
        && match op.op {
            OpKind::Grant => true,
            OpKind::KeepAlive => uint(&op.output).is_some_and(|ttl| ttl > 0),
            _ => false,
        }
}

/// Check 3: every lease whose owner stopped renewing (no keep-alive sent until its deadline,
/// or the next one answered 0) is seen gone, through its election resource, by the deadline;
/// and no keep-alive sent after a deadline renews a lease.
pub fn check_late_expiry(
    history: &History,
    leases: &BTreeMap<u64, LeaseRecord>,
    tokens: &BTreeMap<u64, TokenRecord>,
    ends: &BTreeMap<u64, Vec<(u64, String)>>,
    faults: &[FaultWindow],
    timing: &Timing,
    observed_until_ns: u64,
) -> (Finding, usize) {
    let ops = history.operations();
    let mut finding = Finding::default();
    let (mut judged, mut unknown_renewal, mut too_late_to_see) = (0, 0, 0);
    let mut lateness_ms: Vec<f64> = Vec::new();
    for record in leases.values() {
        for (position, &renewal) in record.renewals.iter().enumerate() {
            let op = &ops[renewal];
            if !renewed(op) {
                continue;
            }
            let renewed_ns = op.complete_ns.unwrap_or(op.invoke_ns);
            let deadline_ns = timing.expiry_deadline_ns(renewed_ns, record.ttl_ms, faults);
            let next = record.renewals.get(position + 1).map(|&i| (i, &ops[i]));
            let stopped = match next {
                None => true,
                Some((index, next)) if next.invoke_ns > deadline_ns => {
                    if renewed(next) {
                        finding.anomalies.push(Anomaly::LeaseOutlived {
                            lease: record.lease,
                            renewal,
                            deadline_ns,
                            keep_alive: index,
                            sent_ns: next.invoke_ns,
                        });
                        break;
                    }
                    true
                }
                // Sent in time: it renewed the lease (or may have), unless it found it gone.
                Some((_, next)) => next.outcome == Outcome::Ok && uint(&next.output) == Some(0),
            };
            if !stopped {
                continue;
            }
            if record.revoked_ns.is_some_and(|r| r < deadline_ns) {
                break;
            }
            // A keep-alive of unknown outcome, sent any time before, may still have renewed it.
            if record.renewals[..position]
                .iter()
                .any(|&i| ops[i].op == OpKind::KeepAlive && ops[i].is_indeterminate())
            {
                unknown_renewal += 1;
                break;
            }
            for token in tokens.values().filter(|t| {
                t.leases.contains(&record.lease)
                    && t.known_ns < deadline_ns
                    && t.released_ns.is_none_or(|r| r >= deadline_ns)
            }) {
                let sightings = ends
                    .get(&token.token)
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                // Seen gone before this renewal was sent: not this stop's token.
                if sightings.iter().any(|(at, _)| *at <= op.invoke_ns) {
                    continue;
                }
                let seen_gone = sightings.first().map(|(at, _)| *at);
                if deadline_ns >= observed_until_ns && seen_gone.is_none_or(|at| at > deadline_ns) {
                    too_late_to_see += 1;
                    continue;
                }
                judged += 1;
                match seen_gone {
                    Some(at) if at <= deadline_ns => {
                        lateness_ms.push((at - renewed_ns) as f64 / 1e6);
                    }
                    _ => finding.anomalies.push(Anomaly::ExpiredLate {
                        token: token.token,
                        lease: record.lease,
                        renewal,
                        renewed_ns,
                        deadline_ns,
                        seen_gone_ns: seen_gone,
                    }),
                }
            }
            // One stop per lease: after it the lease is gone.
            break;
        }
    }
    lateness_ms.sort_by(f64::total_cmp);
    finding.summary.push(format!(
        "stopped leases judged: {judged} (not judged: {unknown_renewal} with a keep-alive of unknown outcome, {too_late_to_see} due after the run stopped looking); seen gone {} ms after the last renewal's answer (min/median/max)",
        match (lateness_ms.first(), lateness_ms.get(lateness_ms.len() / 2), lateness_ms.last()) {
            (Some(a), Some(b), Some(c)) => format!("{a:.0}/{b:.0}/{c:.0}"),
            _ => "-".into(),
        }
    ));
    (finding, judged)
}

/// Check 4: no lease seen gone (by its owner, or through its election resource) before a
/// TTL had passed since the send of an acknowledged renewal, unless its owner revoked it or
/// resigned first.
pub fn check_early_expiry(
    history: &History,
    leases: &BTreeMap<u64, LeaseRecord>,
    tokens: &BTreeMap<u64, TokenRecord>,
    ends: &BTreeMap<u64, Vec<(u64, String)>>,
) -> (Finding, usize) {
    let ops = history.operations();
    let mut finding = Finding::default();
    let by_owner = lease_sightings(history);
    let mut compared = 0;
    let mut margin_ms: Option<f64> = None;
    for record in leases.values() {
        // Sightings of its end, each with what saw it.
        let mut seen: Vec<(u64, String)> = by_owner
            .get(&record.lease)
            .into_iter()
            .flatten()
            .map(|(at, index)| (*at, format!("#{index} ({})", ops[*index].op)))
            .collect();
        for token in tokens.values().filter(|t| t.leases.contains(&record.lease)) {
            for (at, by) in ends.get(&token.token).into_iter().flatten() {
                // A resign ends the token, not the lease.
                if token.released_ns.is_none_or(|r| r > *at) {
                    seen.push((*at, format!("{by}, token {}", token.token)));
                }
            }
        }
        seen.retain(|(at, _)| record.revoked_ns.is_none_or(|r| r > *at));
        let Some((first_seen, by)) = seen.into_iter().min() else {
            continue;
        };
        for &renewal in &record.renewals {
            let op = &ops[renewal];
            if !renewed(op) || op.invoke_ns > first_seen {
                continue;
            }
            compared += 1;
            let alive_until = op.invoke_ns + record.ttl_ms * NS_PER_MS;
            let margin = (first_seen as f64 - alive_until as f64) / 1e6;
            margin_ms = Some(margin_ms.map_or(margin, |m: f64| m.min(margin)));
            if first_seen < alive_until {
                finding.anomalies.push(Anomaly::ExpiredEarly {
                    lease: record.lease,
                    renewal,
                    sent_ns: op.invoke_ns,
                    ttl_ms: record.ttl_ms,
                    seen_gone_ns: first_seen,
                    seen_by: by.clone(),
                });
            }
        }
    }
    finding.summary.push(format!(
        "acknowledged renewals compared with their lease's first sighting of its end: {compared}; smallest margin past the promised TTL: {}",
        margin_ms.map_or("-".into(), |m| format!("{m:.0} ms"))
    ));
    (finding, compared)
}

/// Runs every check.
pub fn check(
    history: &History,
    watch: &[WatchRecord],
    faults: &[FaultWindow],
    last: &FinalState,
    timing: &Timing,
) -> Report {
    let tokens = tokens(history, watch);
    let leases = leases(history);
    let ends = token_ends(history, watch, &tokens);
    let token_finding = check_tokens(&tokens);
    let write_finding = check_writes(history, &tokens, last);
    let (late, stops_judged) = check_late_expiry(
        history,
        &leases,
        &tokens,
        &ends,
        faults,
        timing,
        last.observed_until_ns,
    );
    let (early, renewals_compared) = check_early_expiry(history, &leases, &tokens, &ends);
    let ops = history.operations();
    let counts = Counts {
        tokens: tokens.len(),
        writes_acknowledged: ops
            .iter()
            .filter(|op| op.op == OpKind::Fenced && op.outcome == Outcome::Ok)
            .count(),
        stale_writes: ops
            .iter()
            .filter(|op| op.op == OpKind::Fenced)
            .filter_map(|op| FencedInput::parse(&op.input))
            .filter(|i| i.stale)
            .count(),
        stale_writes_refused: ops
            .iter()
            .filter(|op| op.op == OpKind::Fenced && category(&op.output) == Some(REFUSED_BY_FENCE))
            .filter_map(|op| FencedInput::parse(&op.input))
            .filter(|i| i.stale)
            .count(),
        stops_judged,
        renewals_compared,
    };
    let checks = vec![
        ("tokens (1)", token_finding),
        ("fenced writes (1, 2)", write_finding),
        ("stopped leases go in time (3)", late),
        ("no lease ends early (4)", early),
    ];
    let verdict = if checks.iter().any(|(_, f)| !f.anomalies.is_empty()) {
        Verdict::Invalid
    } else {
        Verdict::Valid
    };
    Report {
        verdict,
        counts,
        checks,
    }
}

#[cfg(test)]
mod tests {
    //! Each check on small histories, as tables: what a correct cluster may produce passes,
    //! and each way a broken one shows itself is found, named by its anomaly.

    use super::*;

    const MS: u64 = NS_PER_MS;

    /// A history under construction; times in milliseconds.
    #[derive(Default, Clone)]
    struct Script {
        ops: Vec<Operation>,
        watch: Vec<WatchRecord>,
        writes: BTreeMap<String, u64>,
        faults: Vec<FaultWindow>,
    }

    fn int(n: u64) -> Value {
        Value::Int(n as i64)
    }

    impl Script {
        #[allow(clippy::too_many_arguments)]
        fn op(
            mut self,
            process: u64,
            op: OpKind,
            input: Value,
            outcome: Outcome,
            output: Value,
            invoke_ms: u64,
            complete_ms: Option<u64>,
        ) -> Script {
            let key = match op {
                OpKind::Grant | OpKind::KeepAlive | OpKind::Revoke => LEASE_KEY,
                _ => ELECTION_KEY,
            };
            self.ops.push(Operation {
                process,
                op,
                key: key.into(),
                input,
                output,
                outcome,
                invoke_ns: invoke_ms * MS,
                complete_ns: complete_ms.map(|c| c * MS),
            });
            self
        }

        /// Client `process` is granted lease `lease` (TTL 1,500 ms), asked at `at` and
        /// answered 1 ms later.
        fn grant(self, process: u64, lease: u64, at: u64) -> Script {
            self.op(
                process,
                OpKind::Grant,
                int(1500),
                Outcome::Ok,
                Value::List(vec![int(lease), int(lease)]),
                at,
                Some(at + 1),
            )
        }

        /// A keep-alive of `lease` sent at `at`, answered `ttl` 1 ms later.
        fn keep_alive(self, process: u64, lease: u64, at: u64, ttl: u64) -> Script {
            self.op(
                process,
                OpKind::KeepAlive,
                int(lease),
                Outcome::Ok,
                int(ttl),
                at,
                Some(at + 1),
            )
        }

        /// A keep-alive sent at `at` that was never answered.
        fn keep_alive_lost(self, process: u64, lease: u64, at: u64) -> Script {
            self.op(
                process,
                OpKind::KeepAlive,
                int(lease),
                Outcome::Info,
                Value::Null,
                at,
                Some(at + 1500),
            )
        }

        /// Client `process` wins `token` with `lease`, answered at `at`.
        fn win(self, process: u64, lease: u64, token: u64, at: u64) -> Script {
            self.op(
                process,
                OpKind::Campaign,
                int(lease),
                Outcome::Ok,
                int(token),
                at - 1,
                Some(at),
            )
        }

        /// Fenced write `seq` of `process` under `token`: `applied` = answered with that
        /// revision (and stored), `None` = refused by the fence.
        fn write(
            mut self,
            process: u64,
            token: u64,
            seq: u64,
            stale: bool,
            applied: Option<u64>,
            at: u64,
        ) -> Script {
            let input = FencedInput { token, seq, stale }.value();
            match applied {
                Some(revision) => {
                    self.writes.insert(write_name(process, seq), revision);
                    self.op(
                        process,
                        OpKind::Fenced,
                        input,
                        Outcome::Ok,
                        int(revision),
                        at,
                        Some(at + 1),
                    )
                }
                None => self.op(
                    process,
                    OpKind::Fenced,
                    input,
                    Outcome::Fail,
                    refusal(REFUSED_BY_FENCE, "fence: not held"),
                    at,
                    Some(at + 1),
                ),
            }
        }

        /// A watch record of `event` ("upsert", "delete") of `token`, held by `client` with
        /// `lease`, at `revision`, received at `at`.
        fn watched(
            mut self,
            event: &str,
            token: u64,
            client: u64,
            lease: u64,
            revision: u64,
            at: u64,
        ) -> Script {
            self.watch.push(WatchRecord {
                node: 0,
                event: event.into(),
                revision,
                name: ELECTION_KEY.into(),
                version: token.to_string(),
                value: Value::List(vec![int(client), int(lease)]),
                at_ns: at * MS,
            });
            self
        }

        fn history(&self) -> History {
            History::new(self.ops.clone()).expect("a valid history")
        }

        fn last(&self, observed_until_ms: u64) -> FinalState {
            FinalState {
                writes: self.writes.clone(),
                revision: 1000,
                observed_until_ns: observed_until_ms * MS,
            }
        }

        fn report(&self, observed_until_ms: u64) -> Report {
            check(
                &self.history(),
                &self.watch,
                &self.faults,
                &self.last(observed_until_ms),
                &Timing::of_cluster(800),
            )
        }
    }

    /// Two holders one after the other, as a correct cluster has them: client 0 wins token
    /// 10 with lease 5 and writes at revisions 11 and 12; its resource is deleted at 20
    /// (seen 3 s in, the lease granted at 0 was never renewed); client 1 is granted lease 6,
    /// wins token 25 with it and writes at 26.
    fn two_holders() -> Script {
        Script::default()
            .grant(0, 5, 0)
            .grant(1, 6, 3_000)
            .win(0, 5, 10, 10)
            .watched("upsert", 10, 0, 5, 10, 11)
            .write(0, 10, 1, false, Some(11), 20)
            .write(0, 10, 2, false, Some(12), 40)
            .watched("delete", 10, 0, 5, 20, 3000)
            .win(1, 6, 25, 3100)
            .watched("upsert", 25, 1, 6, 25, 3101)
            .write(1, 25, 1, false, Some(26), 3200)
    }

    /// The kinds of anomaly a finding holds, for tables.
    fn kinds(anomalies: &[Anomaly]) -> Vec<&'static str> {
        anomalies
            .iter()
            .map(|a| match a {
                Anomaly::TokenShared { .. } => "token-shared",
                Anomaly::TokensOverlap { .. } => "tokens-overlap",
                Anomaly::WriteUnderForeignToken { .. } => "foreign-token",
                Anomaly::WriteOutsideTenure { stale: true, .. } => "stale-write-accepted",
                Anomaly::WriteOutsideTenure { stale: false, .. } => "write-outside-tenure",
                Anomaly::RefusedButApplied { .. } => "refused-but-applied",
                Anomaly::AcknowledgedWriteLost { .. } => "acknowledged-write-lost",
                Anomaly::ExpiredLate { .. } => "expired-late",
                Anomaly::LeaseOutlived { .. } => "lease-outlived",
                Anomaly::ExpiredEarly { .. } => "expired-early",
            })
            .collect()
    }

    fn token_and_write_anomalies(script: &Script) -> Vec<&'static str> {
        let history = script.history();
        let tokens = tokens(&history, &script.watch);
        let mut found = kinds(&check_tokens(&tokens).anomalies);
        found.extend(kinds(
            &check_writes(&history, &tokens, &script.last(10_000)).anomalies,
        ));
        found
    }

    #[test]
    fn fenced_writes_must_apply_within_their_tokens_tenure() {
        let mut stored_elsewhere = two_holders();
        stored_elsewhere.writes.insert(write_name(0, 2), 13);
        let mut refused_but_stored = two_holders().write(0, 10, 3, true, None, 3300);
        refused_but_stored.writes.insert(write_name(0, 3), 27);
        let mut lost = two_holders();
        lost.writes.remove(&write_name(1, 1));
        let mut unknown_applied_late = two_holders().op(
            0,
            OpKind::Fenced,
            FencedInput {
                token: 10,
                seq: 3,
                stale: false,
            }
            .value(),
            Outcome::Info,
            Value::Null,
            2000,
            Some(5000),
        );
        unknown_applied_late.writes.insert(write_name(0, 3), 24);
        let mut unknown_applied_in_time = unknown_applied_late.clone();
        unknown_applied_in_time.writes.insert(write_name(0, 3), 19);
        // (what happened, the records, the anomalies found)
        let table: Vec<(&str, Script, Vec<&str>)> = vec![
            ("two holders one after the other", two_holders(), vec![]),
            (
                "the deposed holder's post-pause write refused",
                two_holders().write(0, 10, 3, true, None, 3300),
                vec![],
            ),
            (
                "the deposed holder's post-pause write accepted after the next win",
                two_holders().write(0, 10, 3, true, Some(27), 3300),
                vec!["stale-write-accepted"],
            ),
            (
                "a write accepted after the deletion, before anyone else won",
                two_holders().write(0, 10, 3, false, Some(21), 2900),
                vec!["write-outside-tenure"],
            ),
            (
                "a write in the entry that deleted its token (a batch: it may have come first)",
                two_holders().write(0, 10, 3, false, Some(20), 2900),
                vec![],
            ),
            (
                "a write under a token before the token existed",
                two_holders().write(1, 25, 2, false, Some(24), 3300),
                vec!["write-outside-tenure"],
            ),
            (
                "the end known only from the next token: a write before it is in its tenure",
                {
                    let mut s = two_holders().write(0, 10, 3, false, Some(22), 2900);
                    s.watch.retain(|r| r.event != "delete");
                    s
                },
                vec![],
            ),
            (
                "the end known only from the next token: a write after it is not",
                {
                    let mut s = two_holders().write(0, 10, 3, true, Some(26), 3300);
                    s.watch.retain(|r| r.event != "delete");
                    s
                },
                vec!["stale-write-accepted"],
            ),
            (
                "a write of unknown outcome stored within its tenure",
                unknown_applied_in_time,
                vec![],
            ),
            (
                "a write of unknown outcome stored after its tenure",
                unknown_applied_late,
                vec!["write-outside-tenure"],
            ),
            (
                "a write refused by the fence, stored anyway",
                refused_but_stored,
                vec!["refused-but-applied"],
            ),
            (
                "an acknowledged write missing at the end",
                lost,
                vec!["acknowledged-write-lost"],
            ),
            (
                "an acknowledged write stored at another revision",
                stored_elsewhere,
                vec!["acknowledged-write-lost"],
            ),
            (
                "a write under another client's token",
                two_holders().write(2, 25, 1, false, Some(27), 3300),
                vec!["foreign-token"],
            ),
            (
                "one token seen held by two clients",
                two_holders().watched("upsert", 25, 2, 7, 25, 3102),
                vec!["token-shared"],
            ),
            (
                "a token won while the one before was still held",
                {
                    let mut s = two_holders();
                    s.watch.retain(|r| r.event != "delete");
                    s.watched("delete", 10, 0, 5, 30, 3_000)
                },
                vec!["tokens-overlap"],
            ),
        ];
        for (what, script, expected) in table {
            assert_eq!(token_and_write_anomalies(&script), expected, "{what}");
        }
    }

    #[test]
    fn a_tenure_ends_at_its_deletion_or_at_the_next_token() {
        let history = two_holders().history();
        let mut tokens = tokens(&history, &two_holders().watch);
        assert_eq!(tokens.keys().copied().collect::<Vec<_>>(), [10, 25]);
        assert_eq!(tokens[&10].clients, BTreeSet::from([0]));
        assert_eq!(tokens[&10].leases, BTreeSet::from([5]));
        assert_eq!(tokens[&10].known_ns, 10 * MS);
        assert_eq!(tenure_end(&tokens, 10).map(|e| e.0), Some(20));
        assert_eq!(tenure_end(&tokens, 25), None);
        tokens.get_mut(&10).expect("token 10").deleted_at = None;
        assert_eq!(tenure_end(&tokens, 10).map(|e| e.0), Some(25));
    }

    #[test]
    fn the_expiry_deadline_grows_with_the_faults_that_overlap_it() {
        let timing = Timing::of_cluster(800);
        // TTL 1,500 + two elections 1,600 + two ticks 200 + slack 1,000.
        let budget = 4_300;
        let window = |from_ms: u64, to_ms: u64, effect| FaultWindow {
            what: "fault".into(),
            from_ns: from_ms * MS,
            to_ns: to_ms * MS,
            effect,
        };
        // (the faults, the deadline of a renewal answered at 1,000 ms)
        let table: Vec<(Vec<FaultWindow>, u64)> = vec![
            (vec![], 1_000 + budget),
            (
                vec![window(2_000, 3_000, FaultEffect::NoDelay)],
                1_000 + budget,
            ),
            (
                vec![window(2_000, 3_000, FaultEffect::LeaderChange)],
                1_000 + budget + 1_600,
            ),
            // Before the renewal, or after the deadline: no effect.
            (vec![window(0, 900, FaultEffect::Restart)], 1_000 + budget),
            (
                vec![window(6_000, 9_000, FaultEffect::Restart)],
                1_000 + budget,
            ),
            // A restart: the whole budget again from the restart, plus the start-up.
            (
                vec![window(2_000, 5_000, FaultEffect::Restart)],
                5_000 + 1_500 + budget,
            ),
            // A fault that starts inside a deadline an earlier fault extended counts too.
            (
                vec![
                    window(2_000, 3_000, FaultEffect::LeaderChange),
                    window(5_500, 6_000, FaultEffect::LeaderChange),
                ],
                1_000 + budget + 2 * 1_600,
            ),
        ];
        for (faults, deadline_ms) in table {
            assert_eq!(
                timing.expiry_deadline_ns(1_000 * MS, 1_500, &faults),
                deadline_ms * MS,
                "{faults:?}"
            );
        }
    }

    /// Client 0 holds token 10 with lease 5 (TTL 1,500 ms), renews it at 500 and 1,000 ms
    /// (answered at 1,001: the deadline is 1,001 + 4,300 = 5,301 ms), then stops.
    fn a_stopped_holder() -> Script {
        Script::default()
            .grant(0, 5, 0)
            .win(0, 5, 10, 10)
            .watched("upsert", 10, 0, 5, 10, 11)
            .keep_alive(0, 5, 500, 1500)
            .keep_alive(0, 5, 1000, 1500)
    }

    fn late_anomalies(script: &Script, observed_until_ms: u64) -> (Vec<&'static str>, usize) {
        let history = script.history();
        let tokens = tokens(&history, &script.watch);
        let ends = token_ends(&history, &script.watch, &tokens);
        let (finding, judged) = check_late_expiry(
            &history,
            &leases(&history),
            &tokens,
            &ends,
            &script.faults,
            &Timing::of_cluster(800),
            observed_until_ms * MS,
        );
        (kinds(&finding.anomalies), judged)
    }

    #[test]
    fn a_stopped_lease_must_be_seen_gone_by_its_deadline() {
        let restarted = {
            let mut s = a_stopped_holder().watched("delete", 10, 0, 5, 40, 6_000);
            s.faults.push(FaultWindow {
                what: "kill -9 the leader".into(),
                from_ns: 2_000 * MS,
                to_ns: 5_000 * MS,
                effect: FaultEffect::Restart,
            });
            s
        };
        // (what happened, until when the run looked (ms), anomalies, stops judged)
        let table: Vec<(&str, Script, u64, Vec<&str>, usize)> = vec![
            (
                "deleted 1.5 s after the last renewal",
                a_stopped_holder().watched("delete", 10, 0, 5, 40, 2_600),
                10_000,
                vec![],
                1,
            ),
            (
                "seen gone first by another candidate's win",
                a_stopped_holder().win(1, 6, 40, 2_700),
                10_000,
                vec![],
                1,
            ),
            (
                "seen gone first by the holder's next keep-alive, answered 0",
                a_stopped_holder().keep_alive(0, 5, 3_000, 0),
                10_000,
                vec![],
                1,
            ),
            (
                "deleted after the deadline",
                a_stopped_holder().watched("delete", 10, 0, 5, 40, 6_000),
                10_000,
                vec!["expired-late"],
                1,
            ),
            (
                "never deleted, though the run looked long after the deadline",
                a_stopped_holder(),
                10_000,
                vec!["expired-late"],
                1,
            ),
            (
                "a kill in the wait gives it the budget again from the restart",
                restarted,
                10_000,
                vec![],
                1,
            ),
            (
                "the run stopped looking before the deadline: not judged",
                a_stopped_holder(),
                5_000,
                vec![],
                0,
            ),
            (
                "a keep-alive of unknown outcome before the stop may have renewed it: not judged",
                Script::default()
                    .grant(0, 5, 0)
                    .win(0, 5, 10, 10)
                    .keep_alive_lost(0, 5, 200)
                    .keep_alive(0, 5, 1_000, 1_500),
                10_000,
                vec![],
                0,
            ),
            (
                "resigned: not an expiry",
                a_stopped_holder().op(
                    0,
                    OpKind::Resign,
                    int(10),
                    Outcome::Ok,
                    int(30),
                    1_100,
                    Some(1_101),
                ),
                10_000,
                vec![],
                0,
            ),
            (
                "a keep-alive sent after the deadline renewed it",
                a_stopped_holder()
                    .watched("delete", 10, 0, 5, 40, 2_600)
                    .keep_alive(0, 5, 7_000, 1_500),
                10_000,
                vec!["lease-outlived"],
                0,
            ),
        ];
        for (what, script, observed_until_ms, expected, judged) in table {
            assert_eq!(
                late_anomalies(&script, observed_until_ms),
                (expected, judged),
                "{what}"
            );
        }
    }

    fn early_anomalies(script: &Script) -> Vec<&'static str> {
        let history = script.history();
        let tokens = tokens(&history, &script.watch);
        let ends = token_ends(&history, &script.watch, &tokens);
        kinds(
            &check_early_expiry(&history, &leases(&history), &tokens, &ends)
                .0
                .anomalies,
        )
    }

    #[test]
    fn no_lease_may_end_before_a_ttl_after_an_acknowledged_renewal_was_sent() {
        // The last renewal was sent at 1,000 ms: the lease lives until at least 2,500 ms.
        let table: Vec<(&str, Script, Vec<&str>)> = vec![
            (
                "its resource deleted after the TTL",
                a_stopped_holder().watched("delete", 10, 0, 5, 40, 2_600),
                vec![],
            ),
            (
                "its resource deleted before the TTL ran out",
                a_stopped_holder().watched("delete", 10, 0, 5, 40, 2_400),
                vec!["expired-early"],
            ),
            (
                "its next keep-alive answered 0 before the TTL ran out",
                a_stopped_holder().keep_alive(0, 5, 2_000, 0),
                vec!["expired-early"],
            ),
            (
                "another candidate's strong read found nobody before the TTL ran out",
                a_stopped_holder().op(
                    1,
                    OpKind::Read,
                    Value::Null,
                    Outcome::Ok,
                    Value::Null,
                    2_000,
                    Some(2_100),
                ),
                vec!["expired-early"],
            ),
            (
                "a strong read invoked before the token was known proves nothing",
                a_stopped_holder().op(
                    1,
                    OpKind::Read,
                    Value::Null,
                    Outcome::Ok,
                    Value::Null,
                    5,
                    Some(20),
                ),
                vec![],
            ),
            (
                "the holder's own write refused by the fence before the TTL ran out",
                a_stopped_holder().write(0, 10, 1, false, None, 2_000),
                vec!["expired-early"],
            ),
            (
                "another candidate won before the TTL ran out",
                a_stopped_holder().win(1, 6, 40, 2_300),
                vec!["expired-early"],
            ),
            (
                "the holder resigned: its resource may go at once",
                a_stopped_holder()
                    .op(
                        0,
                        OpKind::Resign,
                        int(10),
                        Outcome::Ok,
                        int(30),
                        1_100,
                        Some(1_101),
                    )
                    .watched("delete", 10, 0, 5, 30, 1_102),
                vec![],
            ),
            (
                "the holder revoked its lease: it goes at once",
                a_stopped_holder()
                    .op(
                        0,
                        OpKind::Revoke,
                        int(5),
                        Outcome::Ok,
                        int(30),
                        1_100,
                        Some(1_101),
                    )
                    .watched("delete", 10, 0, 5, 30, 1_102)
                    .keep_alive(0, 5, 1_200, 0),
                vec![],
            ),
        ];
        for (what, script, expected) in table {
            assert_eq!(early_anomalies(&script), expected, "{what}");
        }
    }

    #[test]
    fn the_whole_check_is_valid_only_without_anomalies_and_counts_what_it_saw() {
        // Lease 6, last renewed at 3,000 ms, is due to go by 7,301 ms: after the run stopped
        // looking, so only lease 5's stop is judged.
        let valid = two_holders()
            .keep_alive(0, 5, 500, 1_500)
            .write(0, 10, 3, true, None, 3_300)
            .report(7_000);
        assert_eq!(valid.verdict, Verdict::Valid, "{valid:?}");
        assert_eq!(
            valid.counts,
            Counts {
                tokens: 2,
                writes_acknowledged: 3,
                stale_writes: 1,
                stale_writes_refused: 1,
                stops_judged: 1,
                renewals_compared: 2,
            }
        );
        let invalid = two_holders()
            .write(0, 10, 3, true, Some(27), 3_300)
            .report(7_000);
        assert_eq!(invalid.verdict, Verdict::Invalid);
        let text = invalid
            .checks
            .iter()
            .flat_map(|(_, f)| f.anomalies.iter().map(ToString::to_string))
            .collect::<Vec<_>>();
        assert_eq!(
            text,
            [
                "#7: process 0's post-pause fenced write under token 10 applied at revision 27, \
              outside the token's tenure (10, 20] (deleted at revision 20)"
            ]
        );
    }
}
