//! What the console shows, as pure functions of what the node knows: the cluster view from
//! the members' statuses, a resource as JSON, the rows of the drill reports, the counts of
//! resources per type and tenancy. No I/O, no clock, no authorization (the caller's read
//! scope is a parameter): the handlers in [`super`] gather the inputs and send the outputs.
//!
//! ## Invariants
//! - Every output is bounded by its input or by a named maximum (`*_MAX` in [`super`]),
//!   and says when it left something out (`truncated`).
//! - Nothing here panics on what came from the network or the store: an undecodable
//!   payload, a report that is not JSON, a status from a node that answers as another node
//!   are all shown as such.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use cairn_fsm::ReadScope;
use cairn_proto::drill_report;
use cairn_proto::error::{reason_of, ApiError, ErrorKind};
use cairn_proto::google::protobuf::Any;
use cairn_proto::v1::{self as pb, condition};
use serde::Serialize;
use serde_json::{json, Map, Value};

// ---- The cluster --------------------------------------------------------------------------

/// One member of the membership the answering node knows, and what asking it gave.
#[derive(Debug, Clone)]
pub struct MemberAnswer {
    pub member: pb::Member,
    /// Its own status, or why there is none (unreachable, refused, answered as another node).
    pub status: Result<pb::StatusResponse, String>,
}

/// The cluster as the console shows it: the `cairn status` picture, from one node.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClusterView {
    /// The node whose console this is.
    pub node_id: u64,
    pub cluster_id: String,
    /// The reachable member that says it leads (the highest term if more than one does).
    pub leader_id: Option<u64>,
    /// The leader's term, commit index and cluster version.
    pub term: Option<u64>,
    pub commit_index: Option<u64>,
    pub cluster_version: Option<String>,
    pub voters: usize,
    pub reachable_voters: usize,
    pub quorum: usize,
    /// What is wrong: no leader, no quorum. Empty when healthy.
    pub problems: Vec<String>,
    pub members: Vec<MemberView>,
    /// Every alarm any reachable member reports, once per (name, raised index).
    pub alarms: Vec<AlarmView>,
    /// The data the leader's table accounts for, and the cluster's space quota (0: none).
    pub data_bytes: Option<u64>,
    pub data_bytes_quota: Option<u64>,
}

/// One member: its own answer, and the leader's view of its replication.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MemberView {
    pub id: u64,
    pub client_address: String,
    pub peer_address: String,
    pub voter: bool,
    pub reachable: bool,
    /// Why it did not answer.
    pub error: Option<String>,
    /// Its own state (`leader`, `follower`, `learner`, `candidate`, ...) when it answered;
    /// otherwise the leader's word for it (`unreachable`), if a leader answered.
    pub role: Option<String>,
    pub term: Option<u64>,
    /// The leader it knows (None: none, or it did not answer).
    pub leader_id: Option<u64>,
    pub commit_index: Option<u64>,
    pub applied_index: Option<u64>,
    pub last_log_index: Option<u64>,
    /// Entries of the leader's commit index it has yet to apply.
    pub lag_entries: Option<u64>,
    /// The leader's view: the last index of its log the member is known to hold, and the
    /// entries of the leader's log it has yet to receive.
    pub matched_index: Option<u64>,
    pub replication_lag_entries: Option<u64>,
    /// The leader's view: milliseconds since the leader last heard from it.
    pub last_contact_ms: Option<u64>,
    /// Its own view: milliseconds since it last heard from the leader (None on the leader).
    pub leader_contact_ms: Option<u64>,
    pub caught_up: Option<bool>,
    pub version: Option<String>,
    pub uptime_ms: Option<u64>,
    pub resource_count: Option<u64>,
}

/// One alarm, and the members that report it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AlarmView {
    pub name: String,
    pub raised_index: u64,
    pub reason: String,
    /// The members whose status reports it.
    pub reported_by: Vec<u64>,
    /// The members the alarm itself names (CORRUPT: those whose digest differed).
    pub members: Vec<u64>,
}

/// Whether the node that answered `s` says it leads.
fn leads(s: &pb::StatusResponse) -> bool {
    cairn_client::admin::leads(s)
}

fn known(ms: i64) -> Option<u64> {
    u64::try_from(ms).ok()
}

/// The cluster view of node `node_id`, from its members' answers (its own among them).
pub fn cluster_view(node_id: u64, answers: &[MemberAnswer]) -> ClusterView {
    let statuses = || answers.iter().filter_map(|a| a.status.as_ref().ok());
    let leader = cairn_client::admin::leader_of(statuses());
    let cluster_id = statuses()
        .find(|s| s.node_id == node_id)
        .or_else(|| statuses().next())
        .map(|s| s.cluster_id.clone())
        .unwrap_or_default();
    let voters = answers.iter().filter(|a| a.member.voter).count();
    let reachable_voters = answers
        .iter()
        .filter(|a| a.member.voter && a.status.is_ok())
        .count();
    let quorum = crate::admin::quorum_of(voters);
    let mut problems = Vec::new();
    if leader.is_none() {
        let named = statuses().map(|s| s.leader_id).find(|id| *id != 0);
        problems.push(match named {
            Some(id) => format!("no leader: node {id} is named leader but does not answer"),
            None => "no leader: no member knows one".to_string(),
        });
    }
    if reachable_voters < quorum {
        problems.push(format!(
            "no quorum: {reachable_voters} of {voters} voters answer (a quorum is {quorum})"
        ));
    }
    let members = answers
        .iter()
        .map(|a| member_view(a, leader))
        .collect::<Vec<_>>();
    ClusterView {
        node_id,
        cluster_id,
        leader_id: leader.map(|l| l.node_id),
        term: leader.map(|l| l.term),
        commit_index: leader.map(|l| l.commit_index),
        cluster_version: leader.map(|l| l.cluster_version.clone()),
        voters,
        reachable_voters,
        quorum,
        problems,
        members,
        alarms: alarms(answers),
        data_bytes: leader.map(|l| l.data_bytes),
        data_bytes_quota: leader.map(|l| l.data_bytes_quota),
    }
}

fn member_view(answer: &MemberAnswer, leader: Option<&pb::StatusResponse>) -> MemberView {
    let m = &answer.member;
    let own = answer.status.as_ref().ok();
    let seen = leader.and_then(|l| l.members.iter().find(|v| v.id == m.id));
    let leader_is_it = leader.is_some_and(|l| l.node_id == m.id);
    MemberView {
        id: m.id,
        client_address: m.client_address.clone(),
        peer_address: m.peer_address.clone(),
        voter: m.voter,
        reachable: own.is_some(),
        error: answer.status.as_ref().err().cloned(),
        role: own
            .map(|s| s.state.clone())
            .or_else(|| seen.map(|v| v.role.clone())),
        term: own.map(|s| s.term),
        leader_id: own.and_then(|s| (s.leader_id != 0).then_some(s.leader_id)),
        commit_index: own.map(|s| s.commit_index),
        applied_index: own.map(|s| s.applied_index),
        last_log_index: own.map(|s| s.last_log_index),
        lag_entries: own
            .zip(leader)
            .map(|(s, l)| l.commit_index.saturating_sub(s.applied_index)),
        matched_index: seen.filter(|v| v.matched_known).map(|v| v.matched_index),
        replication_lag_entries: seen.and_then(|v| known(v.lag_entries)),
        last_contact_ms: seen
            .filter(|_| !leader_is_it)
            .and_then(|v| known(v.last_contact_ms)),
        leader_contact_ms: own
            .filter(|s| !leads(s))
            .and_then(|s| known(s.leader_contact_ms)),
        caught_up: seen.map(|v| v.caught_up),
        version: own.map(|s| s.version.clone()),
        uptime_ms: own.map(|s| s.uptime_ms),
        resource_count: own.map(|s| s.resource_count),
    }
}

fn alarms(answers: &[MemberAnswer]) -> Vec<AlarmView> {
    let mut merged: BTreeMap<(String, u64), AlarmView> = BTreeMap::new();
    for answer in answers {
        let Ok(status) = &answer.status else { continue };
        for alarm in &status.alarms {
            let entry = merged
                .entry((alarm.name.clone(), alarm.raised_index))
                .or_insert_with(|| AlarmView {
                    name: alarm.name.clone(),
                    raised_index: alarm.raised_index,
                    reason: alarm.reason.clone(),
                    reported_by: Vec::new(),
                    members: alarm.members.clone(),
                });
            entry.reported_by.push(answer.member.id);
        }
    }
    merged.into_values().collect()
}

// ---- Resources ----------------------------------------------------------------------------

/// The `data` of a resource for a person: its `type_url`, its size, and its bytes as JSON
/// when they are JSON text, as text when they are UTF-8, otherwise as base64.
pub fn data_json(data: &Any) -> Value {
    let mut m = Map::new();
    m.insert("type_url".into(), Value::String(data.type_url.clone()));
    m.insert("bytes".into(), Value::from(data.value.len()));
    match std::str::from_utf8(&data.value) {
        Ok(text) => match serde_json::from_str::<Value>(text) {
            Ok(parsed) if !text.trim().is_empty() => {
                m.insert("json".into(), parsed);
            }
            _ => {
                m.insert("text".into(), Value::String(text.to_string()));
            }
        },
        Err(_) => {
            m.insert("base64".into(), Value::String(BASE64.encode(&data.value)));
        }
    }
    Value::Object(m)
}

fn type_json(t: Option<&pb::Type>) -> Value {
    let t = t.cloned().unwrap_or_default();
    json!({"group": t.group, "group_version": t.group_version, "kind": t.kind})
}

fn tenancy_json(t: Option<&pb::Tenancy>) -> Value {
    let t = t.cloned().unwrap_or_default();
    json!({"partition": t.partition, "namespace": t.namespace})
}

fn id_json(id: &pb::Id) -> Value {
    json!({
        "uid": id.uid,
        "name": id.name,
        "type": type_json(id.r#type.as_ref()),
        "tenancy": tenancy_json(id.tenancy.as_ref()),
    })
}

fn condition_json(c: &pb::Condition) -> Value {
    let state = condition::State::try_from(c.state)
        .map(|s| Value::String(s.as_str_name().trim_start_matches("STATE_").to_string()))
        .unwrap_or_else(|_| Value::from(c.state));
    let resource = c.resource.as_ref().map(|r| {
        json!({
            "type": type_json(r.r#type.as_ref()),
            "tenancy": tenancy_json(r.tenancy.as_ref()),
            "name": r.name,
            "section": r.section,
        })
    });
    json!({
        "type": c.r#type,
        "state": state,
        "reason": c.reason,
        "message": c.message,
        "resource": resource,
    })
}

/// A resource as JSON, every field shown (the `data` as [`data_json`] shows it).
pub fn resource_json(r: &pb::Resource) -> Value {
    let status: Map<String, Value> = r
        .status
        .iter()
        .map(|(key, s)| {
            let updated_at = s.updated_at.as_ref().map(|t| {
                cairn_proto::rfc3339::format_timestamp(t)
                    .map(Value::String)
                    .unwrap_or_else(|| json!({"seconds": t.seconds, "nanos": t.nanos}))
            });
            (
                key.clone(),
                json!({
                    "observed_generation": s.observed_generation,
                    "conditions": s.conditions.iter().map(condition_json).collect::<Vec<_>>(),
                    "updated_at": updated_at,
                }),
            )
        })
        .collect();
    json!({
        "id": id_json(r.id.as_ref().unwrap_or(&pb::Id::default())),
        "owner": r.owner.as_deref().map(id_json),
        "version": r.version,
        "generation": r.generation,
        "lease": r.lease,
        "metadata": r.metadata,
        "status": status,
        "data": r.data.as_ref().map(data_json),
    })
}

/// One line of a listing: what identifies a resource and what it holds, not its data.
pub fn resource_summary(r: &pb::Resource) -> Value {
    let id = r.id.clone().unwrap_or_default();
    let t = id.r#type.unwrap_or_default();
    let tenancy = id.tenancy.unwrap_or_default();
    json!({
        "name": id.name,
        "uid": id.uid,
        "group": t.group,
        "group_version": t.group_version,
        "kind": t.kind,
        "partition": tenancy.partition,
        "namespace": tenancy.namespace,
        "version": r.version,
        "data_type_url": r.data.as_ref().map(|d| d.type_url.clone()),
        "data_bytes": r.data.as_ref().map(|d| d.value.len()),
    })
}

/// A resource's bytes as the store keeps them, decoded for display; never panics.
pub fn decode_resource(encoded: &[u8]) -> Result<pb::Resource, String> {
    use prost::Message as _;
    pb::Resource::decode(encoded).map_err(|e| format!("the stored bytes do not decode: {e}"))
}

// ---- Counts per type and tenancy ----------------------------------------------------------

/// How many resources of one type (group and kind: versions share storage) one tenancy
/// holds.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TypeCount {
    pub group: String,
    pub kind: String,
    pub partition: String,
    pub namespace: String,
    pub count: u64,
}

/// The counts the caller may see (`visible`: `None` = everything), at most `max` of them;
/// `true` when some were left out. A read scope decides on type and tenancy alone, so a
/// count is shown whole or not at all.
pub fn type_counts(
    usage: impl IntoIterator<Item = ([String; 4], u64)>,
    visible: Option<&ReadScope>,
    max: usize,
) -> (Vec<TypeCount>, bool) {
    let mut shown = Vec::new();
    let mut truncated = false;
    for ([group, kind, partition, namespace], count) in usage {
        let type_ = pb::Type {
            group,
            group_version: String::new(),
            kind,
        };
        let tenancy = pb::Tenancy {
            partition,
            namespace,
        };
        if !visible.is_none_or(|scope| scope.contains(&(&type_).into(), &(&tenancy).into())) {
            continue;
        }
        if shown.len() == max {
            truncated = true;
            break;
        }
        shown.push(TypeCount {
            group: type_.group,
            kind: type_.kind,
            partition: tenancy.partition,
            namespace: tenancy.namespace,
            count,
        });
    }
    (shown, truncated)
}

// ---- Drill reports ------------------------------------------------------------------------

/// One drill report, as the drills table shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct DrillRow {
    /// The resource's name (`<unix ms, 15 digits>-<drill>`) and group version: what reads it.
    pub name: String,
    pub group_version: String,
    /// When the drill ran (unix ms), from the name.
    pub at_ms: Option<u64>,
    pub drill: String,
    pub verdict: Option<String>,
    pub members: Option<String>,
    /// The longest stretch without an acknowledged write (`write_gap.gap_ms`).
    pub gap_ms: Option<i64>,
    pub lost_writes: Option<u64>,
    pub reads_backwards: Option<u64>,
    pub leader_before: Option<u64>,
    pub term_before: Option<u64>,
    pub leader_after: Option<u64>,
    pub term_after: Option<u64>,
    pub writes_acknowledged: Option<u64>,
    pub problems: Vec<String>,
    /// Why the report could not be read (its data is not a drill report's JSON).
    pub unreadable: Option<String>,
}

/// The time and the drill a report's name carries: `001764448000000-failover` is
/// (1764448000000, "failover").
pub fn parse_drill_name(name: &str) -> (Option<u64>, String) {
    match name.split_once('-') {
        Some((ms, drill)) if ms.len() == 15 && ms.bytes().all(|b| b.is_ascii_digit()) => {
            (ms.parse().ok(), drill.to_string())
        }
        _ => (None, name.to_string()),
    }
}

/// The row of one drill report resource.
pub fn drill_row(r: &pb::Resource) -> DrillRow {
    let id = r.id.clone().unwrap_or_default();
    let (at_ms, drill) = parse_drill_name(&id.name);
    let mut row = DrillRow {
        name: id.name,
        group_version: id.r#type.unwrap_or_default().group_version,
        at_ms,
        drill,
        ..DrillRow::default()
    };
    let report = match r.data.as_ref() {
        None => Err("it holds no data".to_string()),
        Some(data) if data.type_url != drill_report::TYPE_URL => Err(format!(
            "its data is {:?}, not {:?}",
            data.type_url,
            drill_report::TYPE_URL
        )),
        Some(data) => serde_json::from_slice::<Value>(&data.value)
            .map_err(|e| format!("its data is not JSON: {e}"))
            .and_then(|v| match v {
                Value::Object(map) => Ok(map),
                _ => Err("its data is JSON but not an object".to_string()),
            }),
    };
    let report = match report {
        Ok(report) => report,
        Err(why) => {
            row.unreadable = Some(why);
            return row;
        }
    };
    let text = |key: &str| report.get(key).and_then(Value::as_str).map(str::to_string);
    let number = |key: &str| report.get(key).and_then(Value::as_u64);
    if let Some(drill) = text("drill") {
        row.drill = drill;
    }
    row.verdict = text("verdict");
    row.members = text("members");
    row.gap_ms = report
        .get("write_gap")
        .and_then(|g| g.get("gap_ms"))
        .and_then(Value::as_i64);
    row.lost_writes = number("lost_writes");
    row.reads_backwards = number("reads_backwards");
    row.leader_before = number("leader_before");
    row.term_before = number("term_before");
    row.leader_after = number("leader_after");
    row.term_after = number("term_after");
    row.writes_acknowledged = number("writes_acknowledged");
    row.problems = report
        .get("problems")
        .and_then(Value::as_array)
        .map(|p| {
            p.iter()
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    row
}

/// Keeps the `max` newest of drill report rows given oldest first (names sort by time), and
/// answers them newest first.
pub fn newest_first(rows: impl IntoIterator<Item = DrillRow>, max: usize) -> Vec<DrillRow> {
    let mut kept = std::collections::VecDeque::with_capacity(max.min(1024));
    for row in rows {
        if max == 0 {
            break;
        }
        if kept.len() == max {
            kept.pop_front();
        }
        kept.push_back(row);
    }
    kept.into_iter().rev().collect()
}

// ---- Errors -------------------------------------------------------------------------------

/// The JSON body of a refusal: the kind's name (`PERMISSION_DENIED`), the message (naming the
/// missing permission, or the bad parameter), and the parameter when one is to blame.
pub fn error_json(error: &ApiError) -> Value {
    let parameter = match error {
        ApiError::InvalidArgument { field, .. } if !field.is_empty() => Some(field.as_str()),
        _ => None,
    };
    error_body(error.kind(), &error.to_string(), parameter)
}

/// The JSON body of any error answer ([`error_json`]'s shape): `kind`, `message`, `parameter`.
pub fn error_body(kind: ErrorKind, message: &str, parameter: Option<&str>) -> Value {
    json!({
        "error": {
            "kind": reason_of(kind),
            "message": message,
            "parameter": parameter,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn member(id: u64, voter: bool) -> pb::Member {
        pb::Member {
            id,
            client_address: format!("127.0.0.1:700{id}"),
            peer_address: format!("127.0.0.1:800{id}"),
            voter,
            ..Default::default()
        }
    }

    /// Node `id`'s status: `state` in `term`, knowing `leader` (0: none), at `applied`.
    fn status(id: u64, state: &str, term: u64, leader: u64, applied: u64) -> pb::StatusResponse {
        pb::StatusResponse {
            node_id: id,
            cluster_id: "c1".into(),
            state: state.into(),
            term,
            leader_id: leader,
            commit_index: applied,
            applied_index: applied,
            last_log_index: applied,
            leader_contact_ms: if state == "leader" { 0 } else { 40 },
            ..Default::default()
        }
    }

    fn answer(id: u64, status: Result<pb::StatusResponse, &str>) -> MemberAnswer {
        MemberAnswer {
            member: member(id, true),
            status: status.map_err(str::to_string),
        }
    }

    /// The leader's status naming its view of each member: (id, matched, last contact ms).
    fn leading(id: u64, term: u64, commit: u64, seen: &[(u64, u64, i64)]) -> pb::StatusResponse {
        let mut s = status(id, "leader", term, id, commit);
        s.members = seen
            .iter()
            .map(|(m, matched, contact)| pb::Member {
                role: if *contact < 0 {
                    "unreachable".into()
                } else if *m == id {
                    "leader".into()
                } else {
                    "follower".into()
                },
                matched_index: *matched,
                matched_known: true,
                lag_entries: commit.saturating_sub(*matched) as i64,
                last_contact_ms: *contact,
                caught_up: *contact >= 0,
                ..member(*m, true)
            })
            .collect();
        s
    }

    #[test]
    fn the_cluster_view_names_the_leader_quorum_and_problems() {
        struct Case {
            what: &'static str,
            answers: Vec<MemberAnswer>,
            leader: Option<u64>,
            reachable_voters: usize,
            problems: &'static [&'static str],
        }
        let cases = [
            Case {
                what: "healthy: every member answers, node 1 leads",
                answers: vec![
                    answer(
                        1,
                        Ok(leading(1, 2, 10, &[(1, 10, 0), (2, 10, 5), (3, 9, 7)])),
                    ),
                    answer(2, Ok(status(2, "follower", 2, 1, 10))),
                    answer(3, Ok(status(3, "follower", 2, 1, 9))),
                ],
                leader: Some(1),
                reachable_voters: 3,
                problems: &[],
            },
            Case {
                what: "the leader was killed: the survivors still name it",
                answers: vec![
                    answer(1, Err("connection refused")),
                    answer(2, Ok(status(2, "follower", 2, 1, 10))),
                    answer(3, Ok(status(3, "candidate", 3, 0, 10))),
                ],
                leader: None,
                reachable_voters: 2,
                problems: &["no leader: node 1 is named leader but does not answer"],
            },
            Case {
                what: "a new leader after the failover (a stale one in an older term loses)",
                answers: vec![
                    answer(1, Ok(leading(1, 2, 10, &[]))),
                    answer(2, Ok(leading(2, 3, 12, &[]))),
                    answer(3, Ok(status(3, "follower", 3, 2, 12))),
                ],
                leader: Some(2),
                reachable_voters: 3,
                problems: &[],
            },
            Case {
                what: "alone: no leader, no quorum",
                answers: vec![
                    answer(1, Err("refused")),
                    answer(2, Err("refused")),
                    answer(3, Ok(status(3, "candidate", 5, 0, 10))),
                ],
                leader: None,
                reachable_voters: 1,
                problems: &[
                    "no leader: no member knows one",
                    "no quorum: 1 of 3 voters answer (a quorum is 2)",
                ],
            },
        ];
        for case in cases {
            let view = cluster_view(3, &case.answers);
            assert_eq!(view.leader_id, case.leader, "{}", case.what);
            assert_eq!(
                view.reachable_voters, case.reachable_voters,
                "{}",
                case.what
            );
            assert_eq!(view.voters, 3, "{}", case.what);
            assert_eq!(view.quorum, 2, "{}", case.what);
            assert_eq!(view.problems, case.problems, "{}", case.what);
            assert_eq!(view.node_id, 3, "{}", case.what);
            assert_eq!(view.cluster_id, "c1", "{}", case.what);
            assert_eq!(view.members.len(), 3, "{}", case.what);
        }
    }

    #[test]
    fn a_member_shows_its_own_answer_and_the_leaders_view_of_it() {
        let answers = vec![
            answer(
                1,
                Ok(leading(1, 2, 10, &[(1, 10, 0), (2, 7, 5), (3, 0, -1)])),
            ),
            answer(2, Ok(status(2, "follower", 2, 1, 8))),
            answer(3, Err("cannot reach 127.0.0.1:7003 within 1000 ms")),
        ];
        let view = cluster_view(2, &answers);
        let [leader, follower, gone] = &view.members[..] else {
            panic!("three members: {view:?}");
        };
        assert_eq!(view.term, Some(2));
        assert_eq!(view.commit_index, Some(10));
        // The leader: no last contact with itself, no leader contact.
        assert_eq!(leader.role.as_deref(), Some("leader"));
        assert_eq!(leader.last_contact_ms, None);
        assert_eq!(leader.leader_contact_ms, None);
        assert_eq!(leader.lag_entries, Some(0));
        // A follower: its own indexes, lag behind the leader's commit index, both contacts.
        assert_eq!(follower.role.as_deref(), Some("follower"));
        assert_eq!(follower.applied_index, Some(8));
        assert_eq!(follower.lag_entries, Some(2));
        assert_eq!(follower.matched_index, Some(7));
        assert_eq!(follower.replication_lag_entries, Some(3));
        assert_eq!(follower.last_contact_ms, Some(5));
        assert_eq!(follower.leader_contact_ms, Some(40));
        assert_eq!(follower.leader_id, Some(1));
        // A member that does not answer: the leader's word for it, and why.
        assert!(!gone.reachable);
        assert_eq!(gone.role.as_deref(), Some("unreachable"));
        assert_eq!(gone.term, None);
        assert_eq!(
            gone.last_contact_ms, None,
            "never heard from: unknown, not 0"
        );
        assert_eq!(gone.caught_up, Some(false));
        assert!(gone.error.as_deref().unwrap().contains("cannot reach"));
    }

    #[test]
    fn alarms_are_merged_across_members() {
        let mut one = status(1, "leader", 2, 1, 10);
        let mut two = status(2, "follower", 2, 1, 10);
        let nospace = pb::Alarm {
            name: "NOSPACE".into(),
            raised_index: 9,
            reason: "the space quota refused a write".into(),
            members: vec![],
        };
        let corrupt = pb::Alarm {
            name: "CORRUPT".into(),
            raised_index: 7,
            reason: "digests differ".into(),
            members: vec![3],
        };
        one.alarms = vec![nospace.clone(), corrupt.clone()];
        two.alarms = vec![nospace];
        let view = cluster_view(1, &[answer(1, Ok(one)), answer(2, Ok(two))]);
        let names: Vec<(&str, &[u64], &[u64])> = view
            .alarms
            .iter()
            .map(|a| {
                (
                    a.name.as_str(),
                    a.reported_by.as_slice(),
                    a.members.as_slice(),
                )
            })
            .collect();
        assert_eq!(
            names,
            vec![
                ("CORRUPT", &[1u64][..], &[3u64][..]),
                ("NOSPACE", &[1, 2][..], &[][..])
            ]
        );
    }

    #[test]
    fn data_is_shown_as_json_text_or_base64() {
        let any = |value: &[u8]| Any {
            type_url: "demo/x".into(),
            value: Bytes::copy_from_slice(value),
        };
        let cases: [(&str, &[u8], &str, Value); 5] = [
            ("JSON text", br#"{"a":1}"#, "json", json!({"a": 1})),
            ("a JSON string", br#""hi""#, "json", json!("hi")),
            (
                "UTF-8 that is not JSON",
                b"hello world",
                "text",
                json!("hello world"),
            ),
            ("empty", b"", "text", json!("")),
            ("not UTF-8", &[0xff, 0x00, 0x80], "base64", json!("/wCA")),
        ];
        for (what, bytes, form, shown) in cases {
            let data = data_json(&any(bytes));
            assert_eq!(data["type_url"], "demo/x", "{what}");
            assert_eq!(data["bytes"], bytes.len(), "{what}");
            assert_eq!(data[form], shown, "{what}: {data}");
        }
    }

    #[test]
    fn a_resource_is_shown_whole_and_undecodable_bytes_are_an_error() {
        let r = pb::Resource {
            id: Some(pb::Id {
                uid: "u1".into(),
                name: "web".into(),
                r#type: Some(pb::Type {
                    group: "demo".into(),
                    group_version: "v1".into(),
                    kind: "Thing".into(),
                }),
                tenancy: Some(pb::Tenancy {
                    partition: "default".into(),
                    namespace: "default".into(),
                }),
            }),
            version: "12".into(),
            metadata: [("team".to_string(), "a".to_string())].into(),
            data: Some(Any {
                type_url: "demo/json".into(),
                value: Bytes::from_static(b"[1,2]"),
            }),
            ..Default::default()
        };
        let shown = resource_json(&r);
        assert_eq!(shown["id"]["type"]["kind"], "Thing");
        assert_eq!(shown["id"]["tenancy"]["namespace"], "default");
        assert_eq!(shown["version"], "12");
        assert_eq!(shown["metadata"]["team"], "a");
        assert_eq!(shown["data"]["json"], json!([1, 2]));
        let summary = resource_summary(&r);
        assert_eq!(summary["name"], "web");
        assert_eq!(summary["data_bytes"], 5);
        assert!(decode_resource(&[0xff, 0xff, 0xff]).is_err());
    }

    fn scope(types: &[&str], tenancies: &[&str]) -> ReadScope {
        let strings = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        ReadScope::new(vec![cairn_fsm::Scope::parse(
            &strings(types),
            &strings(tenancies),
        )
        .unwrap()])
    }

    #[test]
    fn counts_show_only_what_the_read_scope_covers_up_to_the_bound() {
        let usage = || {
            [
                ("demo", "Thing", "default", "default", 3),
                ("demo", "Thing", "team-a", "web", 2),
                ("demo", "Other", "default", "default", 1),
                ("cairn", "DrillReport", "default", "default", 4),
            ]
            .map(|(g, k, p, n, count)| ([g, k, p, n].map(str::to_string), count))
        };
        let cases: [(&str, Option<ReadScope>, usize, usize, bool); 5] = [
            ("everything", None, 100, 4, false),
            ("bounded", None, 2, 2, true),
            (
                "one type",
                Some(scope(&["demo.Thing"], &["*"])),
                100,
                2,
                false,
            ),
            (
                "one tenancy",
                Some(scope(&["*"], &["team-a/*"])),
                100,
                1,
                false,
            ),
            ("nothing", Some(scope(&["other.*"], &["*"])), 100, 0, false),
        ];
        for (what, visible, max, shown, truncated) in cases {
            let (counts, cut) = type_counts(usage(), visible.as_ref(), max);
            assert_eq!(counts.len(), shown, "{what}: {counts:?}");
            assert_eq!(cut, truncated, "{what}");
        }
    }

    fn report(name: &str, type_url: &str, value: &[u8]) -> pb::Resource {
        pb::Resource {
            id: Some(pb::Id {
                name: name.into(),
                r#type: Some(drill_report::report_type()),
                tenancy: Some(drill_report::tenancy()),
                ..Default::default()
            }),
            data: Some(Any {
                type_url: type_url.into(),
                value: Bytes::copy_from_slice(value),
            }),
            ..Default::default()
        }
    }

    const FAILOVER: &str = r#"{"drill":"failover","members":"cairn dev in .cairn-dev","verdict":"pass","leader_before":1,"term_before":2,"leader_after":3,"term_after":3,"action_ms":1400,"write_gap":{"from_ms":-3,"to_ms":1145,"gap_ms":1148},"writes_acknowledged":1500,"writes_failed":3,"writes_unknown":1,"lost_writes":0,"reads":700,"reads_backwards":0,"steps":[{"at_ms":0,"what":"killing node 1"}],"problems":[]}"#;

    #[test]
    fn a_drill_report_becomes_a_row_and_a_bad_one_says_why() {
        let row = drill_row(&report(
            "001764448000000-failover",
            drill_report::TYPE_URL,
            FAILOVER.as_bytes(),
        ));
        assert_eq!(row.at_ms, Some(1_764_448_000_000));
        assert_eq!(row.drill, "failover");
        assert_eq!(row.verdict.as_deref(), Some("pass"));
        assert_eq!(row.gap_ms, Some(1148));
        assert_eq!(row.lost_writes, Some(0));
        assert_eq!(row.reads_backwards, Some(0));
        assert_eq!((row.leader_before, row.leader_after), (Some(1), Some(3)));
        assert_eq!((row.term_before, row.term_after), (Some(2), Some(3)));
        assert_eq!(row.unreadable, None);

        let no_gap = FAILOVER.replace(r#"{"from_ms":-3,"to_ms":1145,"gap_ms":1148}"#, "null");
        let row = drill_row(&report(
            "001764448000001-rolling_restart",
            drill_report::TYPE_URL,
            no_gap.as_bytes(),
        ));
        assert_eq!(row.gap_ms, None, "write_gap may be null");

        for (what, r, why) in [
            (
                "another type_url",
                report("001764448000002-x", "demo/json", b"{}"),
                "not \"cairn/drill-report+json\"",
            ),
            (
                "not JSON",
                report("001764448000003-x", drill_report::TYPE_URL, b"\xff"),
                "not JSON",
            ),
            (
                "JSON, not an object",
                report("001764448000004-x", drill_report::TYPE_URL, b"[1]"),
                "not an object",
            ),
        ] {
            let row = drill_row(&r);
            assert!(
                row.unreadable.as_deref().is_some_and(|u| u.contains(why)),
                "{what}: {row:?}"
            );
            assert_eq!(row.drill, "x", "{what}: the name still says which drill");
        }
    }

    #[test]
    fn drill_names_carry_the_time_and_the_drill() {
        let cases = [
            (
                "001764448000000-failover",
                Some(1_764_448_000_000),
                "failover",
            ),
            (
                "001764448000000-failover_--graceful",
                Some(1_764_448_000_000),
                "failover_--graceful",
            ),
            ("1764448000000-failover", None, "1764448000000-failover"),
            ("abcdefghijklmno-x", None, "abcdefghijklmno-x"),
            ("no-time", None, "no-time"),
            ("", None, ""),
        ];
        for (name, at, drill) in cases {
            assert_eq!(parse_drill_name(name), (at, drill.to_string()), "{name}");
        }
    }

    #[test]
    fn the_newest_reports_come_first_and_are_bounded() {
        let rows = |n: u64| {
            (0..n).map(|i| DrillRow {
                name: format!("{i:015}-d"),
                ..Default::default()
            })
        };
        let names = |rows: Vec<DrillRow>| rows.into_iter().map(|r| r.name).collect::<Vec<_>>();
        assert_eq!(
            names(newest_first(rows(5), 3)),
            [
                "000000000000004-d",
                "000000000000003-d",
                "000000000000002-d"
            ]
        );
        assert_eq!(names(newest_first(rows(2), 3)).len(), 2);
        assert!(newest_first(rows(2), 0).is_empty());
    }

    #[test]
    fn an_error_body_names_its_kind_and_parameter() {
        let denied = error_json(&ApiError::PermissionDenied(
            "grant \"reader\" lacks admin (for Status)".into(),
        ));
        assert_eq!(denied["error"]["kind"], "PERMISSION_DENIED");
        assert!(denied["error"]["message"]
            .as_str()
            .unwrap()
            .contains("lacks admin"));
        assert_eq!(denied["error"]["parameter"], Value::Null);
        let invalid = error_json(&ApiError::invalid("limit", "must be from 1 to 500"));
        assert_eq!(invalid["error"]["kind"], "INVALID_ARGUMENT");
        assert_eq!(invalid["error"]["parameter"], "limit");
    }
}
