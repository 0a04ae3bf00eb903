//! The watch checker: did every watcher see every committed change of its
//! filter exactly once, in commit order, without rewinding, and end at the
//! final state?
//!
//! Input: the watchers' logs ([`WatchRecord`]s, one stream per node, in the
//! order received), the writers' history (`write` ok = output is the version
//! it stored; `delete` ok = output is the revision of the delete, `"0"` when
//! nothing was stored), and the final state read strongly after healing.
//!
//! Per node, the log is replayed:
//! - an `open` at 0 starts a snapshot: its upserts rebuild the state, and its
//!   `end_of_snapshot` revision must not be below the last revision already
//!   seen (no rewind); an `open` at `r > 0` resumes after `r`;
//! - live upserts and deletes must have strictly increasing revisions (no
//!   duplicate, commit order), an upsert's version must be its revision, a
//!   delete must remove something the state holds, and every upserted value
//!   must come from a write that was attempted and did not certainly fail;
//! - the node *covers* the revisions from its first snapshot to the last
//!   revision it reached, except the gaps before a `resync` snapshot.
//!
//! Then: every acknowledged write whose revision a node covers must be among
//! that node's events, with the same name and value (an acknowledged delete
//! may have been a no-op, so its revision must hold that delete or nothing);
//! any two
//! nodes covering a revision must agree on the event there (or both have
//! none); and every node's final state must equal the final read.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use crate::history::{History, OpKind, Outcome, Value};
use crate::workload::WatchRecord;
use crate::{Error, Verdict};

/// A resource as the final read or a watcher's state holds it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Stored {
    pub version: String,
    pub value: Value,
}

/// One change event: kind, name, version, value.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Change {
    delete: bool,
    name: String,
    version: String,
    value: Value,
}

#[derive(Debug, Default)]
struct NodeReplay {
    state: BTreeMap<String, Stored>,
    /// Live changes by (revision, name): the writes of one log entry share
    /// its revision, each on its own name.
    changes: BTreeMap<(u64, String), Change>,
    /// Covered revision ranges `(from, to]`.
    covered: Vec<(u64, u64)>,
    last_revision: u64,
    /// The highest revision a progress notification announced: every change
    /// up to it has been delivered.
    progress_max: u64,
    /// The last completed snapshot: its revision and contents.
    last_snapshot: Option<(u64, BTreeMap<String, Stored>)>,
    snapshots: usize,
    /// Snapshots compared with a list at their revision.
    lists_compared: usize,
    errors: usize,
}

impl NodeReplay {
    fn covers(&self, revision: u64) -> bool {
        self.covered
            .iter()
            .any(|(from, to)| revision > *from && revision <= *to)
    }
}

/// The result of a watch check.
#[derive(Debug)]
pub struct WatchReport {
    pub verdict: Verdict,
    /// Human-readable findings, anomalies first.
    pub anomalies: Vec<String>,
    pub summary: Vec<String>,
}

/// The revision every watcher must reach: the last change a watch could have
/// delivered. Cairn sends no progress notifications yet, so an entry that
/// changes nothing a watch matches (a new leader's blank entry, a failed
/// compare-and-set) moves the final list's revision but no watch. This is the
/// newest version in the final state or the newest change any watcher
/// delivered (an Upsert's version: a snapshot's Upserts carry the snapshot's
/// revision, which may be such an entry), whichever is larger, capped at
/// `final_revision`. A trailing
/// delete that every watcher missed still fails the check: the watchers' final
/// state then differs from the final read.
pub fn revision_to_reach(
    log: &[WatchRecord],
    final_state: &BTreeMap<String, Stored>,
    final_revision: u64,
) -> u64 {
    let newest_stored = final_state
        .values()
        .filter_map(|s| s.version.parse::<u64>().ok());
    let newest_delivered = log.iter().filter_map(|r| match r.event.as_str() {
        "upsert" => Some(r.version.parse::<u64>().unwrap_or(r.revision)),
        "delete" => Some(r.revision),
        _ => None,
    });
    newest_stored
        .chain(newest_delivered)
        .max()
        .unwrap_or(0)
        .min(final_revision)
}

/// Checks the watchers of `nodes` nodes. Only the nodes in `members_at_end`
/// (still in the cluster when the final state was read) must reach it; a
/// removed node's watch just stops.
pub fn check(
    log: &[WatchRecord],
    history: &History,
    final_state: &BTreeMap<String, Stored>,
    final_revision: u64,
    nodes: usize,
    members_at_end: &[usize],
) -> WatchReport {
    let mut anomalies = Vec::new();
    let mut summary = Vec::new();
    let required_revision = revision_to_reach(log, final_state, final_revision);
    // Values attempted by writes that did not certainly fail.
    let mut attempted: HashMap<(&str, &Value), Outcome> = HashMap::new();
    for op in history.operations() {
        if op.op == OpKind::Write && op.outcome != Outcome::Fail {
            attempted.insert((op.key.as_str(), &op.input), op.outcome);
        }
    }
    let mut replays = Vec::with_capacity(nodes);
    for node in 0..nodes {
        let mut r = NodeReplay::default();
        let mut snapshot: Option<BTreeMap<String, Stored>> = None;
        // The start of the current covered range, once the node is live.
        let mut range_from: Option<u64> = None;
        // Within the current stream: the revision of its last change, the
        // revision it was opened after, and the highest revision seen before
        // it was opened (its changes up to there are a replay).
        let mut stream_last = 0u64;
        let mut open_from = 0u64;
        let mut replay_through = 0u64;
        for rec in log.iter().filter(|rec| rec.node == node) {
            match rec.event.as_str() {
                "open" => {
                    if rec.revision == 0 {
                        if let Some(from) = range_from.take() {
                            r.covered.push((from, r.last_revision));
                        }
                        snapshot = Some(BTreeMap::new());
                    }
                    // Changes after `rec.revision` follow; those up to what
                    // was already seen are a replay of them.
                    stream_last = rec.revision;
                    open_from = rec.revision;
                    replay_through = r.last_revision;
                }
                "resync" | "error" => r.errors += 1,
                "end_of_snapshot" => {
                    let Some(state) = snapshot.take() else {
                        anomalies.push(format!(
                            "node {node}: EndOfSnapshot at {} without a snapshot in progress",
                            rec.revision
                        ));
                        continue;
                    };
                    if rec.revision < r.last_revision {
                        anomalies.push(format!(
                            "node {node}: rewind: a snapshot at revision {} after revision {} was seen",
                            rec.revision, r.last_revision
                        ));
                    }
                    r.snapshots += 1;
                    r.last_snapshot = Some((rec.revision, state.clone()));
                    r.state = state;
                    r.last_revision = r.last_revision.max(rec.revision);
                    range_from = Some(rec.revision);
                }
                "upsert" | "delete" if snapshot.is_some() => {
                    let state = snapshot.as_mut().expect("checked");
                    if rec.event == "delete" {
                        anomalies.push(format!(
                            "node {node}: a Delete inside a snapshot ({})",
                            rec.name
                        ));
                    } else {
                        state.insert(
                            rec.name.clone(),
                            Stored {
                                version: rec.version.clone(),
                                value: rec.value.clone(),
                            },
                        );
                    }
                }
                "upsert" | "delete" => {
                    if rec.revision < stream_last || rec.revision <= open_from {
                        anomalies.push(format!(
                            "node {node}: {} of {} at revision {} after revision {} (out of order)",
                            rec.event,
                            rec.name,
                            rec.revision,
                            stream_last.max(open_from)
                        ));
                        continue;
                    }
                    stream_last = rec.revision;
                    let change = Change {
                        delete: rec.event == "delete",
                        name: rec.name.clone(),
                        version: rec.version.clone(),
                        value: rec.value.clone(),
                    };
                    if let Some(seen) = r.changes.get(&(rec.revision, rec.name.clone())) {
                        if rec.revision > replay_through {
                            anomalies.push(format!(
                                "node {node}: {} of {} at revision {} delivered twice (duplicate)",
                                rec.event, rec.name, rec.revision
                            ));
                        } else if seen != &change {
                            anomalies.push(format!(
                                "node {node}: the replay of revision {} differs: {seen:?} then {change:?}",
                                rec.revision
                            ));
                        }
                        continue;
                    }
                    if rec.revision <= r.progress_max {
                        anomalies.push(format!(
                            "node {node}: {} of {} at revision {} after a progress notification at revision {} (which promised every change up to it)",
                            rec.event, rec.name, rec.revision, r.progress_max
                        ));
                    }
                    r.last_revision = r.last_revision.max(rec.revision);
                    if rec.event == "upsert" {
                        if rec.version != rec.revision.to_string() {
                            anomalies.push(format!(
                                "node {node}: upsert of {} at revision {} carries version {:?}",
                                rec.name, rec.revision, rec.version
                            ));
                        }
                        if !attempted.contains_key(&(rec.name.as_str(), &rec.value)) {
                            anomalies.push(format!(
                                "node {node}: upsert of {} = {} at revision {}: no such write was attempted (or it failed)",
                                rec.name, rec.value, rec.revision
                            ));
                        }
                        r.state.insert(
                            rec.name.clone(),
                            Stored {
                                version: rec.version.clone(),
                                value: rec.value.clone(),
                            },
                        );
                    } else if r.state.remove(&rec.name).is_none() {
                        anomalies.push(format!(
                            "node {node}: delete of {} at revision {} which the watch did not hold",
                            rec.name, rec.revision
                        ));
                    }
                    r.changes.insert((rec.revision, rec.name.clone()), change);
                }
                "progress" => {
                    r.last_revision = r.last_revision.max(rec.revision);
                    r.progress_max = r.progress_max.max(rec.revision);
                }
                "list" => match (&r.last_snapshot, listed_state(&rec.value)) {
                    (Some((revision, snapshot)), Some(listed)) if *revision == rec.revision => {
                        r.lists_compared += 1;
                        if snapshot != &listed {
                            let differing: Vec<&String> = snapshot
                                .keys()
                                .chain(listed.keys())
                                .filter(|k| snapshot.get(*k) != listed.get(*k))
                                .collect();
                            anomalies.push(format!(
                                "node {node}: the snapshot at revision {revision} differs from a list at that revision (differing: {differing:?})"
                            ));
                        }
                    }
                    (_, None) => anomalies.push(format!(
                        "node {node}: unreadable list record at revision {}: {}",
                        rec.revision, rec.value
                    )),
                    _ => anomalies.push(format!(
                        "node {node}: a list at revision {} follows no snapshot at that revision",
                        rec.revision
                    )),
                },
                other => anomalies.push(format!("node {node}: unknown record {other:?}")),
            }
        }
        if let Some(from) = range_from {
            r.covered.push((from, r.last_revision));
        }
        summary.push(format!(
            "node {node}: {} live changes, {} snapshots ({} compared with a list), {} breaks, reached revision {} (progress {})",
            r.changes.len(),
            r.snapshots,
            r.lists_compared,
            r.errors,
            r.last_revision,
            r.progress_max
        ));
        replays.push(r);
    }

    // Writes of unknown outcome are resolved from the watch streams: a write
    // whose value some watch delivered took effect at that revision (values
    // are unique), and is then checked like an acknowledged one.
    let mut delivered: HashMap<(&str, &Value), u64> = HashMap::new();
    for r in &replays {
        for ((revision, name), change) in &r.changes {
            if !change.delete {
                delivered.insert((name.as_str(), &change.value), *revision);
            }
        }
    }
    let (mut resolved_applied, mut unresolved) = (0usize, 0usize);
    let mut applied: Vec<(&crate::history::Operation, u64, &str)> = Vec::new();
    for op in history.operations() {
        let revision = match (&op.op, &op.output) {
            _ if op.outcome != Outcome::Ok => 0,
            (OpKind::Write | OpKind::Delete, Value::Str(s)) => s.parse::<u64>().unwrap_or(0),
            _ => 0,
        };
        if revision != 0 {
            applied.push((op, revision, "acknowledged"));
        } else if op.op == OpKind::Write && op.is_indeterminate() {
            match delivered.get(&(op.key.as_str(), &op.input)) {
                Some(&revision) => {
                    resolved_applied += 1;
                    applied.push((op, revision, "unknown-outcome"));
                }
                None => unresolved += 1,
            }
        }
    }

    // Applied changes must be seen where covered.
    let mut acknowledged = 0usize;
    for (op, revision, how) in applied {
        acknowledged += 1;
        for (node, r) in replays.iter().enumerate() {
            if !r.covers(revision) {
                continue;
            }
            match r.changes.get(&(revision, op.key.clone())) {
                Some(c) if c.delete == (op.op == OpKind::Delete) => {
                    if op.op == OpKind::Write && c.value != op.input {
                        anomalies.push(format!(
                            "node {node}: revision {revision} of {} shows {} but the {how} write stored {}",
                            op.key, c.value, op.input
                        ));
                    }
                }
                Some(c) => anomalies.push(format!(
                    "node {node}: revision {revision} is {} of {}, but the {how} {} of {} was applied there",
                    if c.delete { "a delete" } else { "an upsert" },
                    c.name,
                    op.op,
                    op.key
                )),
                // A delete of a lifetime that was already gone is acknowledged
                // with its log index but changes nothing: no event is due.
                None if op.op == OpKind::Delete => {}
                None => anomalies.push(format!(
                    "node {node}: missed the {how} {} of {} at revision {revision}",
                    op.op, op.key
                )),
            }
        }
    }

    // Nodes agree wherever both cover a revision.
    for (a, ra) in replays.iter().enumerate() {
        for (b, rb) in replays.iter().enumerate().skip(a + 1) {
            for ((revision, name), change) in &ra.changes {
                if rb.covers(*revision) {
                    match rb.changes.get(&(*revision, name.clone())) {
                        Some(other) if other == change => {}
                        Some(other) => anomalies.push(format!(
                            "nodes {a} and {b} disagree at revision {revision}: {change:?} vs {other:?}"
                        )),
                        None => anomalies.push(format!(
                            "node {b} covers revision {revision} but lacks node {a}'s change there: {change:?}"
                        )),
                    }
                }
            }
            for ((revision, name), change) in &rb.changes {
                if ra.covers(*revision) && !ra.changes.contains_key(&(*revision, name.clone())) {
                    anomalies.push(format!(
                        "node {a} covers revision {revision} but lacks node {b}'s change there: {change:?}"
                    ));
                }
            }
        }
    }

    // Final state.
    for (node, r) in replays.iter().enumerate() {
        if !members_at_end.contains(&node) {
            continue;
        }
        if r.snapshots == 0 {
            anomalies.push(format!("node {node}: the watch never delivered a snapshot"));
            continue;
        }
        if r.last_revision < required_revision {
            anomalies.push(format!(
                "node {node}: the watch reached only revision {} of the last change's {required_revision} (final {final_revision})",
                r.last_revision
            ));
            continue;
        }
        if &r.state != final_state {
            let missing: Vec<&String> = final_state
                .keys()
                .filter(|k| r.state.get(*k) != final_state.get(*k))
                .collect();
            let extra: Vec<&String> = r
                .state
                .keys()
                .filter(|k| !final_state.contains_key(*k))
                .collect();
            anomalies.push(format!(
                "node {node}: the watch's final state differs from the final read (differing: {missing:?}, extra: {extra:?})"
            ));
        }
    }
    summary.push(format!(
        "{acknowledged} applied changes checked ({resolved_applied} writes of unknown outcome resolved as applied from the watches, {unresolved} never delivered); final state {} resources at revision {final_revision}",
        final_state.len()
    ));
    WatchReport {
        verdict: if anomalies.is_empty() {
            Verdict::Valid
        } else {
            Verdict::Invalid
        },
        anomalies,
        summary,
    }
}

/// The value of a `list` watch record: the resources a list at a snapshot's
/// revision returned, as `[[name version value] ...]`.
pub fn list_record_value(resources: BTreeMap<String, Stored>) -> Value {
    Value::List(
        resources
            .into_iter()
            .map(|(name, stored)| {
                Value::List(vec![
                    Value::Str(name),
                    Value::Str(stored.version),
                    stored.value,
                ])
            })
            .collect(),
    )
}

/// The resources of a `list` record; `None` when it is not in the form
/// [`list_record_value`] writes.
fn listed_state(value: &Value) -> Option<BTreeMap<String, Stored>> {
    value
        .as_list()?
        .iter()
        .map(|entry| match entry.as_list()? {
            [Value::Str(name), Value::Str(version), value] => Some((
                name.clone(),
                Stored {
                    version: version.clone(),
                    value: value.clone(),
                },
            )),
            _ => None,
        })
        .collect()
}

/// What a watch run leaves besides its history and watch log, so that
/// `jepsen-tests check --model watch DIR` can check it again offline
/// (`watch-final.json` in the scenario's folder).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WatchFinal {
    /// The final strong list, by name.
    pub state: BTreeMap<String, Stored>,
    /// Its revision.
    pub revision: u64,
    /// Watchers (one per node) in the run.
    pub nodes: usize,
    /// The nodes still members when the final list was read.
    pub members_at_end: Vec<usize>,
}

/// File names of a watch run's folder.
pub const HISTORY_FILE: &str = "history.jsonl";
pub const WATCH_LOG_FILE: &str = "watch.jsonl";
pub const FINAL_FILE: &str = "watch-final.json";

/// Writes the watch log and, when the final list succeeded, the final state
/// into `folder` (the history is written by the runner with every other
/// workload's).
pub fn save_run(
    folder: &Path,
    log: &[WatchRecord],
    last: Option<&WatchFinal>,
) -> Result<(), Error> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| Error::Io {
            context: format!("writing {}", path.display()),
            source,
        }
    };
    let mut text = String::new();
    for record in log {
        // A WatchRecord always serializes (strings, integers, values).
        text.push_str(&serde_json::to_string(record).unwrap_or_default());
        text.push('\n');
    }
    let path = folder.join(WATCH_LOG_FILE);
    std::fs::write(&path, text).map_err(io(&path))?;
    let Some(last) = last else {
        return Ok(());
    };
    let path = folder.join(FINAL_FILE);
    let json = serde_json::to_string_pretty(last).unwrap_or_default();
    std::fs::write(&path, json + "\n").map_err(io(&path))
}

/// Loads what [`save_run`] and the runner wrote: the history, the watch log
/// and the final state. Malformed input is an error naming the file and line.
pub fn load_run(folder: &Path) -> Result<(History, Vec<WatchRecord>, WatchFinal), Error> {
    let read = |name: &str| {
        let path = folder.join(name);
        std::fs::read_to_string(&path).map_err(|source| Error::Open { path, source })
    };
    let history = History::from_jsonl_str(&read(HISTORY_FILE)?)?;
    let mut log = Vec::new();
    for (line_index, line) in read(WATCH_LOG_FILE)?.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        log.push(
            serde_json::from_str::<WatchRecord>(line).map_err(|error| Error::Parse {
                line: line_index + 1,
                reason: format!("{WATCH_LOG_FILE}: {error}"),
            })?,
        );
    }
    let last: WatchFinal =
        serde_json::from_str(&read(FINAL_FILE)?).map_err(|error| Error::Parse {
            line: error.line(),
            reason: format!("{FINAL_FILE}: {error}"),
        })?;
    if let Some(member) = last.members_at_end.iter().find(|m| **m >= last.nodes) {
        return Err(Error::Parse {
            line: 0,
            reason: format!(
                "{FINAL_FILE}: member {member} is not one of the {} nodes",
                last.nodes
            ),
        });
    }
    Ok((history, log, last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Operation;

    fn rec(node: usize, event: &str, revision: u64, name: &str, value: i64) -> WatchRecord {
        WatchRecord {
            node,
            event: event.into(),
            revision,
            name: name.into(),
            version: if name.is_empty() {
                String::new()
            } else {
                revision.to_string()
            },
            value: if name.is_empty() {
                Value::Null
            } else {
                Value::Int(value)
            },
            at_ns: 0,
        }
    }

    fn write(key: &str, value: i64, version: u64) -> Operation {
        Operation {
            process: 0,
            op: OpKind::Write,
            key: key.into(),
            input: Value::Int(value),
            output: Value::Str(version.to_string()),
            outcome: Outcome::Ok,
            invoke_ns: 0,
            complete_ns: Some(1),
        }
    }

    fn final_state(entries: &[(&str, u64, i64)]) -> BTreeMap<String, Stored> {
        entries
            .iter()
            .map(|(n, v, x)| {
                (
                    n.to_string(),
                    Stored {
                        version: v.to_string(),
                        value: Value::Int(*x),
                    },
                )
            })
            .collect()
    }

    fn stream(node: usize, skip: Option<u64>) -> Vec<WatchRecord> {
        let mut v = vec![
            rec(node, "open", 0, "", 0),
            rec(node, "end_of_snapshot", 1, "", 0),
        ];
        for (revision, value) in [(2u64, 10i64), (3, 11), (4, 12)] {
            if Some(revision) != skip {
                v.push(rec(node, "upsert", revision, "a", value));
            }
        }
        v
    }

    #[test]
    fn watchers_that_saw_every_change_pass() {
        // Two nodes see the same three writes after an empty snapshot and end at the final state.
        let history = History::new(vec![
            write("a", 10, 2),
            write("a", 11, 3),
            write("a", 12, 4),
        ])
        .unwrap();
        let mut log = stream(0, None);
        log.extend(stream(1, None));
        let report = check(&log, &history, &final_state(&[("a", 4, 12)]), 4, 2, &[0, 1]);
        assert_eq!(report.verdict, Verdict::Valid, "{:?}", report.anomalies);
    }

    #[test]
    fn a_final_revision_past_the_last_change_is_reached_by_the_last_change() {
        // The final list is at revision 5, a new leader's blank entry that no
        // watch can deliver: watchers that reached the last change (4) pass.
        let history = History::new(vec![
            write("a", 10, 2),
            write("a", 11, 3),
            write("a", 12, 4),
        ])
        .unwrap();
        let mut log = stream(0, None);
        log.extend(stream(1, None));
        let report = check(&log, &history, &final_state(&[("a", 4, 12)]), 5, 2, &[0, 1]);
        assert_eq!(report.verdict, Verdict::Valid, "{:?}", report.anomalies);
    }

    #[test]
    fn a_snapshot_taken_after_a_blank_entry_does_not_raise_the_revision_to_reach() {
        // Node 0 re-watched after the last change (4) and a blank entry (5): its
        // snapshot's Upserts carry revision 5. Node 1 stayed live and delivered 4,
        // the last change: it reached everything a watch could deliver.
        let history = History::new(vec![
            write("a", 10, 2),
            write("a", 11, 3),
            write("a", 12, 4),
        ])
        .unwrap();
        let mut log = stream(0, None);
        log.push(rec(0, "open", 0, "", 0));
        let mut snapshot_upsert = rec(0, "upsert", 5, "a", 12);
        snapshot_upsert.version = "4".into();
        log.push(snapshot_upsert);
        log.push(rec(0, "end_of_snapshot", 5, "", 0));
        log.extend(stream(1, None));
        assert_eq!(revision_to_reach(&log, &final_state(&[("a", 4, 12)]), 5), 4);
        let report = check(&log, &history, &final_state(&[("a", 4, 12)]), 5, 2, &[0, 1]);
        assert_eq!(report.verdict, Verdict::Valid, "{:?}", report.anomalies);
    }

    #[test]
    fn a_watcher_short_of_the_last_change_is_reported() {
        // Node 1 stops at revision 3: it never reached the last change (4),
        // even though the final revision (5) is past every change.
        let history = History::new(vec![
            write("a", 10, 2),
            write("a", 11, 3),
            write("a", 12, 4),
        ])
        .unwrap();
        let mut log = stream(0, None);
        let mut short = stream(1, None);
        short.pop();
        log.extend(short);
        let report = check(&log, &history, &final_state(&[("a", 4, 12)]), 5, 2, &[0, 1]);
        assert_eq!(report.verdict, Verdict::Invalid);
        assert!(
            report
                .anomalies
                .iter()
                .any(|a| a.contains("node 1: the watch reached only revision 3")),
            "{:?}",
            report.anomalies
        );
    }

    #[test]
    fn a_missed_acknowledged_write_is_reported() {
        // Node 1 skips revision 3: the acknowledged write there is missing from it.
        let history = History::new(vec![
            write("a", 10, 2),
            write("a", 11, 3),
            write("a", 12, 4),
        ])
        .unwrap();
        let mut log = stream(0, None);
        log.extend(stream(1, Some(3)));
        let report = check(&log, &history, &final_state(&[("a", 4, 12)]), 4, 2, &[0, 1]);
        assert_eq!(report.verdict, Verdict::Invalid);
        assert!(
            report.anomalies.iter().any(|a| a.contains("missed")),
            "{:?}",
            report.anomalies
        );
    }

    #[test]
    fn a_duplicated_event_is_reported() {
        // Revision 3 delivered twice is a duplicate.
        let history = History::new(vec![
            write("a", 10, 2),
            write("a", 11, 3),
            write("a", 12, 4),
        ])
        .unwrap();
        let mut log = stream(0, None);
        log.insert(4, rec(0, "upsert", 3, "a", 11));
        let report = check(&log, &history, &final_state(&[("a", 4, 12)]), 4, 1, &[0]);
        assert!(
            report.anomalies.iter().any(|a| a.contains("duplicate")),
            "{:?}",
            report.anomalies
        );
    }

    #[test]
    fn a_snapshot_behind_what_was_seen_is_a_rewind() {
        // After reaching revision 4, a new snapshot at revision 2 is a rewind.
        let history = History::new(vec![
            write("a", 10, 2),
            write("a", 11, 3),
            write("a", 12, 4),
        ])
        .unwrap();
        let mut log = stream(0, None);
        log.push(rec(0, "open", 0, "", 0));
        log.push(rec(0, "upsert", 2, "a", 10));
        log.push(rec(0, "end_of_snapshot", 2, "", 0));
        let report = check(&log, &history, &final_state(&[("a", 4, 12)]), 4, 1, &[0]);
        assert!(
            report.anomalies.iter().any(|a| a.contains("rewind")),
            "{:?}",
            report.anomalies
        );
    }

    #[test]
    fn a_watch_ending_away_from_the_final_state_is_reported() {
        // The final read holds another value than the watch ended with.
        let history = History::new(vec![
            write("a", 10, 2),
            write("a", 11, 3),
            write("a", 12, 4),
        ])
        .unwrap();
        let log = stream(0, None);
        let report = check(
            &log,
            &history,
            &final_state(&[("a", 4, 12), ("b", 1, 5)]),
            4,
            1,
            &[0],
        );
        assert!(
            report.anomalies.iter().any(|a| a.contains("final state")),
            "{:?}",
            report.anomalies
        );
    }

    fn history3() -> History {
        History::new(vec![
            write("a", 10, 2),
            write("a", 11, 3),
            write("a", 12, 4),
        ])
        .unwrap()
    }

    #[test]
    fn a_progress_notification_followed_by_a_change_at_or_below_it_is_reported() {
        // Node 0 is told "progress at 3" before the change at revision 3
        // arrives: the notification promised every change up to 3.
        let mut log = stream(0, None);
        log.insert(3, rec(0, "progress", 3, "", 0));
        let report = check(&log, &history3(), &final_state(&[("a", 4, 12)]), 4, 1, &[0]);
        assert_eq!(report.verdict, Verdict::Invalid);
        assert!(
            report
                .anomalies
                .iter()
                .any(|a| a.contains("after a progress notification at revision 3")),
            "{:?}",
            report.anomalies
        );
    }

    #[test]
    fn progress_notifications_before_later_changes_pass() {
        // Progress at 2 and at 3, each after the change there, then revision 4.
        let mut log = stream(0, None);
        log.insert(4, rec(0, "progress", 3, "", 0));
        log.insert(3, rec(0, "progress", 2, "", 0));
        let report = check(&log, &history3(), &final_state(&[("a", 4, 12)]), 4, 1, &[0]);
        assert_eq!(report.verdict, Verdict::Valid, "{:?}", report.anomalies);
    }

    fn listed(entries: &[(&str, u64, i64)]) -> Value {
        list_record_value(final_state(entries))
    }

    #[test]
    fn a_snapshot_that_differs_from_a_list_at_its_revision_is_reported() {
        // The snapshot at revision 1 holds a = 10 at version 1; a list at
        // revision 1 on that node holds a = 9: one of them is wrong.
        let history = History::new(vec![write("a", 10, 1), write("a", 11, 2)]).unwrap();
        let mut log = vec![
            rec(0, "open", 0, "", 0),
            rec(0, "upsert", 1, "a", 10),
            rec(0, "end_of_snapshot", 1, "", 0),
        ];
        let mut list = rec(0, "list", 1, "", 0);
        list.value = listed(&[("a", 1, 9)]);
        log.push(list);
        log.push(rec(0, "upsert", 2, "a", 11));
        let report = check(&log, &history, &final_state(&[("a", 2, 11)]), 2, 1, &[0]);
        assert_eq!(report.verdict, Verdict::Invalid);
        assert!(
            report
                .anomalies
                .iter()
                .any(|a| a.contains("the snapshot at revision 1 differs from a list")),
            "{:?}",
            report.anomalies
        );
    }

    #[test]
    fn a_snapshot_equal_to_the_list_at_its_revision_passes() {
        // The same run with a list that agrees with the snapshot.
        let history = History::new(vec![write("a", 10, 1), write("a", 11, 2)]).unwrap();
        let mut log = vec![
            rec(0, "open", 0, "", 0),
            rec(0, "upsert", 1, "a", 10),
            rec(0, "end_of_snapshot", 1, "", 0),
        ];
        let mut list = rec(0, "list", 1, "", 0);
        list.value = listed(&[("a", 1, 10)]);
        log.push(list);
        log.push(rec(0, "upsert", 2, "a", 11));
        let report = check(&log, &history, &final_state(&[("a", 2, 11)]), 2, 1, &[0]);
        assert_eq!(report.verdict, Verdict::Valid, "{:?}", report.anomalies);
        assert!(report.summary[0].contains("(1 compared with a list)"));
    }

    fn unknown_write(key: &str, value: i64) -> Operation {
        Operation {
            outcome: Outcome::Info,
            output: Value::Null,
            complete_ns: None,
            ..write(key, value, 0)
        }
    }

    #[test]
    fn a_write_of_unknown_outcome_that_a_watch_delivered_is_checked_as_applied() {
        // The write of 11 timed out; node 0 delivered it at revision 3, so it
        // took effect there, and node 1, covering revision 3, must have it.
        let history = History::new(vec![
            write("a", 10, 2),
            unknown_write("a", 11),
            write("a", 12, 4),
        ])
        .unwrap();
        let mut log = stream(0, None);
        log.extend(stream(1, None));
        let report = check(&log, &history, &final_state(&[("a", 4, 12)]), 4, 2, &[0, 1]);
        assert_eq!(report.verdict, Verdict::Valid, "{:?}", report.anomalies);
        assert!(
            report.summary.iter().any(|l| l.contains(
                "1 writes of unknown outcome resolved as applied from the watches, 0 never delivered"
            )),
            "{:?}",
            report.summary
        );
        let mut log = stream(0, None);
        log.extend(stream(1, Some(3)));
        let report = check(&log, &history, &final_state(&[("a", 4, 12)]), 4, 2, &[0, 1]);
        assert_eq!(report.verdict, Verdict::Invalid);
        assert!(
            report
                .anomalies
                .iter()
                .any(|a| a.contains("node 1: missed the unknown-outcome write of a at revision 3")),
            "{:?}",
            report.anomalies
        );
    }

    #[test]
    fn a_saved_run_is_checked_again_offline_with_the_same_verdict() {
        // save_run + the history file, then load_run: the same inputs, the
        // same findings (here: node 1 missed revision 3).
        let folder = tempfile::tempdir().unwrap();
        let history = history3();
        let mut log = stream(0, None);
        log.extend(stream(1, Some(3)));
        let last = WatchFinal {
            state: final_state(&[("a", 4, 12)]),
            revision: 4,
            nodes: 2,
            members_at_end: vec![0, 1],
        };
        save_run(folder.path(), &log, Some(&last)).unwrap();
        let mut jsonl = Vec::new();
        history.write_jsonl(&mut jsonl).unwrap();
        std::fs::write(folder.path().join(HISTORY_FILE), jsonl).unwrap();
        let (loaded_history, loaded_log, loaded_last) = load_run(folder.path()).unwrap();
        assert_eq!(
            (&loaded_history, &loaded_log, &loaded_last),
            (&history, &log, &last)
        );
        let report = check(&loaded_log, &loaded_history, &last.state, 4, 2, &[0, 1]);
        assert_eq!(report.verdict, Verdict::Invalid);
        // A final state naming a node the run did not have is refused.
        let bad = WatchFinal {
            members_at_end: vec![5],
            ..last
        };
        save_run(folder.path(), &log, Some(&bad)).unwrap();
        assert!(matches!(load_run(folder.path()), Err(Error::Parse { .. })));
    }
}
