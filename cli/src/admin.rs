//! The admin commands of `cairn`: `status`, `endpoint health | status`, `member list |
//! add-learner | promote | remove` and `transfer-leader`. Every one reaches the cluster
//! through one [`AdminClient`] built from the global flags (`--endpoints`, `--timeout-ms`,
//! TLS, `--token`), prints a table or JSON (`-o`), and exits by the shared table
//! (`cli::exit`): 5 when the cluster cannot do it now (no leader, no quorum, a node that did
//! not answer in time, a refusal for safety).
//!
//! `cairn status` is what every member says of itself: the member list comes from the first
//! node that answers, then every member is asked for its own status, concurrently, each
//! within one attempt's bound. A member that does not answer is shown unreachable; the
//! command exits 5 when no reachable member leads, or when fewer voters answer than a
//! quorum.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use crate::common::{GlobalArgs, OutputFormat};
use cairn_proto::error::ApiError;
use cairn_proto::v1::{self as pb};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use cairn_client::admin::{describe_catch_up, leads, AdminClient, Operation};

use crate::common::{exit, exit_code_of_kind};

#[derive(Subcommand)]
pub enum MemberCommand {
    /// List the members: id, voter or learner, addresses (as the first node that answers knows
    /// them).
    List,
    /// Add a node as a non-voting learner, then wait (with a progress line) until it has
    /// caught up; start the node meanwhile (`cairn agent ... --join ADDR`). Exits 5 if it has
    /// not caught up in time (it stays a learner).
    AddLearner {
        #[arg(long)]
        id: u64,
        #[arg(long)]
        peer_address: String,
        #[arg(long)]
        client_address: String,
        /// How long to wait for the learner to catch up; 0: do not wait.
        #[arg(long, default_value_t = 60_000)]
        catch_up_timeout_ms: u64,
    },
    /// Make a learner a voter. Refused while the learner has not caught up (never started,
    /// behind, or silent), showing how far behind it is.
    Promote { id: u64 },
    /// Remove a member (voter or learner). Refused if the remaining voters the leader can
    /// reach would be fewer than a quorum, unless --force.
    Remove {
        id: u64,
        /// Propose the removal even if it leaves (or finds) no reachable quorum; it commits
        /// only once enough voters answer.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Lower the cluster version and pin it there (`--to 0.1`), so that members can be
    /// rolled back to a build of that release; then wait (with a progress line) until every
    /// member has compacted its log past every command the lower version does not allow.
    /// `--cancel` removes the pin: the version rises again once every member supports it.
    /// Refused while a member does not run a build of 0.2.0 or later.
    Downgrade {
        /// The cluster version to go down to (MAJOR.MINOR).
        #[arg(long, value_parser = cairn_fsm::ClusterVersion::parse, required_unless_present = "cancel", conflicts_with = "cancel")]
        to: Option<cairn_fsm::ClusterVersion>,
        /// Remove the pin of an earlier downgrade.
        #[arg(long)]
        cancel: bool,
        /// How long to wait for every member to compact its log; 0: do not wait.
        #[arg(long, default_value_t = 120_000)]
        compact_timeout_ms: u64,
    },
}

#[derive(Subcommand)]
pub enum EndpointCommand {
    /// Whether each endpoint serves (gRPC health: a known leader, a linearizable read,
    /// applied close to the leader's commit index), and how long it took to answer.
    Health(EndpointArgs),
    /// Each endpoint's own status: id, version, data dir size, leader or not, term, indices.
    Status(EndpointArgs),
}

#[derive(Args)]
pub struct EndpointArgs {
    /// Every member of the cluster (client addresses from the first node that answers)
    /// instead of the --endpoints given.
    #[arg(long)]
    cluster: bool,
}

#[derive(Args)]
pub struct TransferArgs {
    /// The voter to hand leadership to (default: the most up-to-date one).
    #[arg(long, default_value_t = 0)]
    to: u64,
}

/// The admin client the global flags describe.
pub fn client_of(global: &GlobalArgs) -> Result<AdminClient, ApiError> {
    let endpoints: Vec<String> = global
        .cluster
        .endpoints
        .iter()
        .map(|e| e.trim().to_string())
        .filter(|e| !e.is_empty())
        .collect();
    if endpoints.is_empty() {
        return Err(ApiError::invalid("endpoints", "no endpoint given"));
    }
    let access = crate::common::access(&global.cluster)?;
    Ok(AdminClient::new(endpoints, access, global.timeout()))
}

/// Prints `e` and returns its exit code. A refusal (`Inconsistent`) is printed as its
/// message alone: it says what was refused and why.
pub fn fail(e: &ApiError) -> u8 {
    match e {
        ApiError::Inconsistent(message) => eprintln!("cairn: {message}"),
        other => eprintln!("cairn: {other}"),
    }
    exit_code_of_kind(e.kind())
}

fn print_json(value: &Value) {
    out!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

/// Rows under a header, columns padded to their widest cell.
fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| -> String {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}", w = *w))
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    out!("{}", line(header.to_vec()));
    for row in rows {
        out!("{}", line(row.iter().map(String::as_str).collect()));
    }
}

/// `1.5 KiB`, `12.0 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `850ms`, `4.2s`, `5m02s`, `3h07m`, `2d04h`.
pub fn human_duration(ms: u64) -> String {
    let s = ms / 1000;
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{}m{:02}s", s / 60, s % 60),
        3_600_000..=86_399_999 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

fn or_dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "-".to_string())
}

// ------------------------------------------------------------------ status ----

/// One member as `cairn status` shows it: the membership's entry, and its own answer.
struct MemberReport {
    member: pb::Member,
    answer: Result<pb::StatusResponse, ApiError>,
}

/// The whole picture: every member's answer, the leader among them, and the verdict.
struct ClusterReport {
    cluster_id: String,
    members: Vec<MemberReport>,
    /// The reachable member that leads (the highest term, if more than one says so).
    leader: Option<pb::StatusResponse>,
    voters: usize,
    reachable_voters: usize,
}

impl ClusterReport {
    fn of(cluster_id: String, members: Vec<MemberReport>) -> ClusterReport {
        let leader =
            cairn_client::admin::leader_of(members.iter().filter_map(|m| m.answer.as_ref().ok()))
                .cloned();
        let voters = members.iter().filter(|m| m.member.voter).count();
        let reachable_voters = members
            .iter()
            .filter(|m| m.member.voter && m.answer.is_ok())
            .count();
        ClusterReport {
            cluster_id,
            members,
            leader,
            voters,
            reachable_voters,
        }
    }

    fn quorum(&self) -> usize {
        cairn_server::admin::quorum_of(self.voters)
    }

    /// What is wrong, if anything: no leader, no quorum.
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.leader.is_none() {
            let named: Vec<u64> = self
                .members
                .iter()
                .filter_map(|m| m.answer.as_ref().ok())
                .map(|s| s.leader_id)
                .filter(|id| *id != 0)
                .collect();
            problems.push(match named.first() {
                Some(id) => format!("no leader: node {id} is named leader but does not answer"),
                None => "no leader: no member knows one".to_string(),
            });
        }
        if self.reachable_voters < self.quorum() {
            problems.push(format!(
                "no quorum: {} of {} voters answer (a quorum is {})",
                self.reachable_voters,
                self.voters,
                self.quorum()
            ));
        }
        problems
    }

    /// Entries member `s` has yet to apply of what the leader committed.
    fn lag(&self, s: &pb::StatusResponse) -> Option<u64> {
        self.leader
            .as_ref()
            .map(|l| l.commit_index.saturating_sub(s.applied_index))
    }

    /// The leader's view of member `id` (replication progress), if a leader answered.
    fn leaders_view(&self, id: u64) -> Option<&pb::Member> {
        self.leader
            .as_ref()
            .and_then(|l| l.members.iter().find(|m| m.id == id))
    }

    fn summary(&self) -> String {
        let leader = match &self.leader {
            Some(l) => format!(
                "leader node {} (term {}, commit index {}, cluster version {})",
                l.node_id,
                l.term,
                l.commit_index,
                cluster_version_of(l)
            ),
            None => "NO LEADER".to_string(),
        };
        format!(
            "cluster {}: {leader}; {} of {} voters answer{}",
            if self.cluster_id.is_empty() {
                "(no id yet)"
            } else {
                &self.cluster_id
            },
            self.reachable_voters,
            self.voters,
            if self.reachable_voters < self.quorum() {
                format!(" (NO QUORUM: a quorum is {})", self.quorum())
            } else {
                String::new()
            }
        )
    }

    fn print_table(&self) {
        out!("{}", self.summary());
        let header = [
            "ID",
            "MEMBER",
            "ENDPOINT",
            "REACHABLE",
            "ROLE",
            "TERM",
            "LAST CONTACT",
            "COMMIT",
            "APPLIED",
            "LAG",
            "VERSION",
            "UPTIME",
            "DATA DIR",
            "ERROR",
        ];
        let rows: Vec<Vec<String>> = self
            .members
            .iter()
            .map(|m| {
                let mut row = vec![
                    m.member.id.to_string(),
                    member_kind(&m.member).to_string(),
                    m.member.client_address.clone(),
                ];
                match &m.answer {
                    Ok(s) => row.extend([
                        "yes".to_string(),
                        s.state.clone(),
                        s.term.to_string(),
                        if leads(s) {
                            "-".to_string()
                        } else {
                            or_dash(
                                u64::try_from(s.leader_contact_ms)
                                    .ok()
                                    .map(|ms| format!("{} ago", human_duration(ms))),
                            )
                        },
                        s.commit_index.to_string(),
                        s.applied_index.to_string(),
                        or_dash(self.lag(s).map(|l| l.to_string())),
                        s.version.clone(),
                        human_duration(s.uptime_ms),
                        human_bytes(s.data_dir_bytes),
                        String::new(),
                    ]),
                    Err(e) => {
                        let mut cells = vec!["NO".to_string()];
                        cells.extend(std::iter::repeat_n("-".to_string(), 9));
                        cells.push(e.to_string());
                        row.extend(cells);
                    }
                }
                row
            })
            .collect();
        print_table(&header, &rows);
        if let Some(l) = self.leader.as_ref() {
            out!("{}", describe_capacity(l));
        }
        let mut alarms: std::collections::BTreeMap<(String, u64), (String, Vec<u64>)> =
            Default::default();
        for m in &self.members {
            for a in m.answer.iter().flat_map(|s| &s.alarms) {
                let entry = alarms
                    .entry((a.name.clone(), a.raised_index))
                    .or_insert_with(|| (a.reason.clone(), Vec::new()));
                entry.1.push(m.member.id);
            }
        }
        for ((name, index), (reason, on)) in alarms {
            let on: Vec<String> = on.iter().map(u64::to_string).collect();
            out!(
                "ALARM {name} raised at index {index} (members {}): {reason}",
                on.join(", ")
            );
        }
        if let Some(p) = self
            .leader
            .as_ref()
            .and_then(|l| l.pending_restore.as_ref())
        {
            out!(
                "pending restore {}: {}/{} resources received{}",
                p.restore_id,
                p.received,
                p.resource_count,
                if p.failure.is_empty() {
                    String::new()
                } else {
                    format!(", failed: {}", p.failure)
                }
            );
        }
    }

    fn to_json(&self) -> Value {
        let problems = self.problems();
        let members: Vec<Value> = self
            .members
            .iter()
            .map(|m| {
                let view = self.leaders_view(m.member.id);
                let mut v = member_json(&m.member);
                if let Some(map) = v.as_object_mut() {
                    for (key, value) in [
                        ("reachable", json!(m.answer.is_ok())),
                        (
                            "error",
                            json!(m.answer.as_ref().err().map(|e| e.to_string())),
                        ),
                        (
                            "matched_index",
                            json!(view.filter(|v| v.matched_known).map(|v| v.matched_index)),
                        ),
                        ("caught_up", json!(view.map(|v| v.caught_up))),
                    ] {
                        map.insert(key.to_string(), value);
                    }
                }
                if let (Ok(s), Some(map)) = (&m.answer, v.as_object_mut()) {
                    for (key, value) in [
                        ("role", json!(s.state)),
                        ("term", json!(s.term)),
                        ("leader_id", json!(s.leader_id)),
                        (
                            "leader_contact_ms",
                            json!((s.leader_contact_ms >= 0).then_some(s.leader_contact_ms)),
                        ),
                        ("commit_index", json!(s.commit_index)),
                        ("applied_index", json!(s.applied_index)),
                        ("last_log_index", json!(s.last_log_index)),
                        ("snapshot_index", json!(s.snapshot_index)),
                        ("lag_entries", json!(self.lag(s))),
                        ("resource_count", json!(s.resource_count)),
                        ("version", json!(s.version)),
                        ("uptime_ms", json!(s.uptime_ms)),
                        ("data_dir_bytes", json!(s.data_dir_bytes)),
                        ("data_bytes", json!(s.data_bytes)),
                        ("data_bytes_quota", json!(s.data_bytes_quota)),
                        ("data_bytes_max", json!(s.data_bytes_max)),
                        (
                            "alarms",
                            json!(s
                                .alarms
                                .iter()
                                .map(|a| json!({"name": a.name, "raised_index": a.raised_index, "reason": a.reason}))
                                .collect::<Vec<_>>()),
                        ),
                    ] {
                        map.insert(key.to_string(), value);
                    }
                }
                v
            })
            .collect();
        json!({
            "cluster_id": self.cluster_id,
            "healthy": problems.is_empty(),
            "problems": problems,
            "leader_id": self.leader.as_ref().map(|l| l.node_id),
            "term": self.leader.as_ref().map(|l| l.term),
            "commit_index": self.leader.as_ref().map(|l| l.commit_index),
            "cluster_version": self.leader.as_ref().map(cluster_version_of),
            "voters": self.voters,
            "reachable_voters": self.reachable_voters,
            "quorum": self.quorum(),
            "pending_restore": self.leader.as_ref().and_then(|l| l.pending_restore.as_ref()).map(|p| json!({
                "restore_id": p.restore_id, "resource_count": p.resource_count,
                "received": p.received, "failure": p.failure,
            })),
            "members": members,
        })
    }
}

/// The capacity line of `cairn status`: the data the leader's table accounts for, against
/// the cluster's space quota.
fn describe_capacity(s: &pb::StatusResponse) -> String {
    if s.data_bytes_quota == 0 {
        return format!(
            "data: {} (no space quota set yet; this node asks for {})",
            human_bytes(s.data_bytes),
            human_bytes(s.data_bytes_max)
        );
    }
    format!(
        "data: {} of the space quota {} ({:.0} %)",
        human_bytes(s.data_bytes),
        human_bytes(s.data_bytes_quota),
        s.data_bytes as f64 * 100.0 / s.data_bytes_quota as f64
    )
}

/// Asks every member of the cluster (see the module docs).
async fn cluster_report(client: &AdminClient) -> Result<ClusterReport, ApiError> {
    let (first_address, first) = client.first_status(|_| Ok(())).await?;
    let members = if first.members.is_empty() {
        // A node not in a cluster yet: only itself to show.
        vec![pb::Member {
            id: first.node_id,
            client_address: first_address.clone(),
            ..Default::default()
        }]
    } else {
        first.members.clone()
    };
    let answers = futures::future::join_all(members.iter().map(|m| {
        let first = &first;
        async move {
            if m.id == first.node_id {
                return Ok(first.clone());
            }
            match client.status_at(&m.client_address).await {
                Ok(s) if s.node_id != m.id => Err(ApiError::Inconsistent(format!(
                    "{} answers as node {}, not node {}",
                    m.client_address, s.node_id, m.id
                ))),
                other => other,
            }
        }
    }))
    .await;
    let members = members
        .into_iter()
        .zip(answers)
        .map(|(member, answer)| MemberReport { member, answer })
        .collect();
    Ok(ClusterReport::of(first.cluster_id.clone(), members))
}

/// `cairn status`.
pub async fn status(global: &GlobalArgs) -> u8 {
    let client = match client_of(global) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let report = match cluster_report(&client).await {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
    match global.output {
        OutputFormat::Json => print_json(&report.to_json()),
        OutputFormat::Table => report.print_table(),
    }
    let problems = report.problems();
    if problems.is_empty() {
        return exit::OK;
    }
    eprintln!("cairn: {}", problems.join("; "));
    exit::UNAVAILABLE
}

// ---------------------------------------------------------------- endpoint ----

/// The client of an endpoint command, and the addresses it covers: the endpoints, or every
/// member's (`--cluster`).
async fn targets(
    global: &GlobalArgs,
    args: &EndpointArgs,
) -> Result<(AdminClient, Vec<String>), ApiError> {
    let client = client_of(global)?;
    if !args.cluster {
        let endpoints = client.endpoints().to_vec();
        return Ok((client, endpoints));
    }
    let (address, status) = client.first_status(|_| Ok(())).await?;
    let targets = if status.members.is_empty() {
        vec![address]
    } else {
        status
            .members
            .iter()
            .map(|m| m.client_address.clone())
            .collect()
    };
    Ok((client, targets))
}

/// gRPC health of the node at `address` ("" = the whole node), within one attempt.
async fn health_of(client: &AdminClient, address: &str) -> (Result<(), String>, Duration) {
    use tonic_health::pb::health_check_response::ServingStatus;
    let started = Instant::now();
    let bound = client.attempt_timeout();
    let check = async {
        let channel = client
            .access()
            .connect(address, bound)
            .await
            .map_err(|e| e.to_string())?;
        let mut health = tonic_health::pb::health_client::HealthClient::with_interceptor(
            channel,
            client.access().credentials.clone(),
        );
        let answer = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: pb::resource_service_server::SERVICE_NAME.to_string(),
            })
            .await
            .map_err(|s| ApiError::from(s).to_string())?
            .into_inner();
        match ServingStatus::try_from(answer.status) {
            Ok(ServingStatus::Serving) => Ok(()),
            _ => Err(
                "not serving: no leader known, not caught up, or stopping (see `cairn status`)"
                    .to_string(),
            ),
        }
    };
    let result = match tokio::time::timeout(bound, check).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {} ms", bound.as_millis())),
    };
    (result, started.elapsed())
}

/// `cairn endpoint health [--cluster]`.
pub async fn endpoint_health(global: &GlobalArgs, args: &EndpointArgs) -> u8 {
    let (client, targets) = match targets(global, args).await {
        Ok(found) => found,
        Err(e) => return fail(&e),
    };
    let results = futures::future::join_all(targets.iter().map(|t| health_of(&client, t))).await;
    let healthy = results.iter().all(|(r, _)| r.is_ok());
    match global.output {
        OutputFormat::Json => print_json(&Value::Array(
            targets
                .iter()
                .zip(&results)
                .map(|(t, (r, took))| {
                    json!({
                        "endpoint": t,
                        "health": r.is_ok(),
                        "took_ms": took.as_secs_f64() * 1000.0,
                        "error": r.as_ref().err(),
                    })
                })
                .collect(),
        )),
        OutputFormat::Table => {
            for (t, (r, took)) in targets.iter().zip(&results) {
                let took = format!("{:.1}ms", took.as_secs_f64() * 1000.0);
                match r {
                    Ok(()) => out!("{t} is healthy: took {took}"),
                    Err(e) => out!("{t} is unhealthy: {e} (took {took})"),
                }
            }
        }
    }
    if healthy {
        exit::OK
    } else {
        eprintln!("cairn: unhealthy endpoints");
        exit::UNAVAILABLE
    }
}

/// `cairn endpoint status [--cluster]`.
pub async fn endpoint_status(global: &GlobalArgs, args: &EndpointArgs) -> u8 {
    let (client, targets) = match targets(global, args).await {
        Ok(found) => found,
        Err(e) => return fail(&e),
    };
    let answers = client.statuses(&targets).await;
    if let Some(Err(e)) = answers
        .iter()
        .find(|a| matches!(a, Err(e) if e.is_credential_refusal()))
    {
        return fail(e);
    }
    match global.output {
        OutputFormat::Json => print_json(&Value::Array(
            targets
                .iter()
                .zip(&answers)
                .map(|(t, a)| match a {
                    Ok(s) => json!({
                        "endpoint": t, "reachable": true, "id": s.node_id,
                        "cluster_id": s.cluster_id, "version": s.version,
                        "data_dir_bytes": s.data_dir_bytes,
                        "is_leader": leads(s),
                        "is_learner": s.state == "learner", "role": s.state,
                        "leader_id": s.leader_id, "term": s.term,
                        "commit_index": s.commit_index, "applied_index": s.applied_index,
                        "resource_count": s.resource_count, "uptime_ms": s.uptime_ms,
                        "error": null,
                    }),
                    Err(e) => json!({"endpoint": t, "reachable": false, "error": e.to_string()}),
                })
                .collect(),
        )),
        OutputFormat::Table => {
            let rows: Vec<Vec<String>> = targets
                .iter()
                .zip(&answers)
                .map(|(t, a)| match a {
                    Ok(s) => vec![
                        t.clone(),
                        s.node_id.to_string(),
                        s.version.clone(),
                        human_bytes(s.data_dir_bytes),
                        leads(s).to_string(),
                        (s.state == "learner").to_string(),
                        s.term.to_string(),
                        s.commit_index.to_string(),
                        s.applied_index.to_string(),
                        String::new(),
                    ],
                    Err(e) => {
                        let mut row = vec![t.clone()];
                        row.extend(std::iter::repeat_n("-".to_string(), 8));
                        row.push(e.to_string());
                        row
                    }
                })
                .collect();
            print_table(
                &[
                    "ENDPOINT",
                    "ID",
                    "VERSION",
                    "DATA DIR",
                    "IS LEADER",
                    "IS LEARNER",
                    "TERM",
                    "COMMIT",
                    "APPLIED",
                    "ERROR",
                ],
                &rows,
            );
        }
    }
    if answers.iter().all(Result::is_ok) {
        exit::OK
    } else {
        eprintln!("cairn: some endpoints did not answer");
        exit::UNAVAILABLE
    }
}

// ------------------------------------------------------------------ member ----

fn member_kind(m: &pb::Member) -> &'static str {
    if m.voter {
        "voter"
    } else {
        "learner"
    }
}

/// A member as the JSON outputs show it.
fn member_json(m: &pb::Member) -> Value {
    json!({
        "id": m.id, "voter": m.voter,
        "peer_address": m.peer_address, "client_address": m.client_address,
    })
}

fn print_members(output: OutputFormat, cluster_id: &str, members: &[pb::Member]) {
    match output {
        OutputFormat::Json => print_json(&json!({
            "cluster_id": cluster_id,
            "members": members.iter().map(member_json).collect::<Vec<_>>(),
        })),
        OutputFormat::Table => print_table(
            &["ID", "MEMBER", "PEER ADDRESS", "CLIENT ADDRESS"],
            &members
                .iter()
                .map(|m| {
                    vec![
                        m.id.to_string(),
                        member_kind(m).to_string(),
                        m.peer_address.clone(),
                        m.client_address.clone(),
                    ]
                })
                .collect::<Vec<_>>(),
        ),
    }
}

/// What a membership command prints once done: a line (table) or the change (JSON).
fn print_change(output: OutputFormat, line: &str, r: &pb::MembershipResponse) {
    match output {
        OutputFormat::Table => out!("{line}"),
        OutputFormat::Json => {
            let members: Vec<Value> = r
                .status
                .iter()
                .flat_map(|s| s.members.iter())
                .map(member_json)
                .collect();
            print_json(&json!({"result": line, "log_index": r.log_index, "members": members}))
        }
    }
}

/// `cairn member ...`.
pub async fn member(command: MemberCommand, global: &GlobalArgs) -> u8 {
    let client = match client_of(global) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let output = global.output;
    match command {
        MemberCommand::List => match client.first_status(|_| Ok(())).await {
            Ok((_, s)) => {
                print_members(output, &s.cluster_id, &s.members);
                exit::OK
            }
            Err(e) => fail(&e),
        },
        MemberCommand::AddLearner {
            id,
            peer_address,
            client_address,
            catch_up_timeout_ms,
        } => {
            add_learner(
                &client,
                output,
                pb::AddLearnerRequest {
                    id,
                    peer_address,
                    client_address,
                },
                Duration::from_millis(catch_up_timeout_ms),
            )
            .await
        }
        MemberCommand::Promote { id } => {
            match client
                .at_leader(Operation::Mutation, |mut c| async move {
                    c.promote(pb::PromoteRequest { id }).await
                })
                .await
            {
                Ok(r) => {
                    print_change(
                        output,
                        &format!(
                            "node {id} is a voter (membership at log index {})",
                            r.log_index
                        ),
                        &r,
                    );
                    exit::OK
                }
                Err(e) => fail(&e),
            }
        }
        MemberCommand::Remove { id, force } => {
            match client
                .at_leader(Operation::Mutation, |mut c| async move {
                    c.remove_member(pb::RemoveMemberRequest { id, force }).await
                })
                .await
            {
                Ok(r) => {
                    print_change(
                        output,
                        &format!(
                            "removed node {id} (membership at log index {}); stop its process",
                            r.log_index
                        ),
                        &r,
                    );
                    exit::OK
                }
                Err(e) => fail(&e),
            }
        }
    }
}

/// `cairn member add-learner`: adds, then waits for the catch-up with a progress line on
/// stderr (drawn only on a terminal).
async fn add_learner(
    client: &AdminClient,
    output: OutputFormat,
    request: pb::AddLearnerRequest,
    catch_up_timeout: Duration,
) -> u8 {
    let id = request.id;
    let added = client
        .at_leader(Operation::Mutation, |mut c| {
            let request = request.clone();
            async move { c.add_learner(request).await }
        })
        .await;
    let r = match added {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
    if catch_up_timeout.is_zero() {
        print_change(
            output,
            &format!(
                "added node {id} as a learner (membership at log index {}); not waiting for \
                 it to catch up",
                r.log_index
            ),
            &r,
        );
        return exit::OK;
    }
    eprintln!(
        "cairn: added node {id} as a learner (membership at log index {}); waiting up to {} \
         for it to catch up (start it now if it is not running)",
        r.log_index,
        human_duration(catch_up_timeout.as_millis() as u64)
    );
    let progress = indicatif::ProgressBar::new_spinner()
        .with_style(indicatif::ProgressStyle::with_template("{spinner} {msg}").expect("template"));
    progress.enable_steady_tick(Duration::from_millis(100));
    let waited = client
        .wait_caught_up(id, catch_up_timeout, |member, leader| {
            progress.set_message(describe_catch_up(member, leader));
        })
        .await;
    progress.finish_and_clear();
    match waited {
        Ok(member) => {
            print_change(
                output,
                &format!(
                    "node {id} is a learner and has caught up (index {}); make it a voter with \
                     `cairn member promote {id}`",
                    member.matched_index
                ),
                &r,
            );
            exit::OK
        }
        Err(e) => {
            let code = fail(&e);
            eprintln!(
                "cairn: node {id} stays a learner; once `cairn status` shows it caught up, \
                 `cairn member promote {id}` (or `cairn member remove {id}` to undo)"
            );
            code
        }
    }
}

/// `cairn transfer-leader [--to ID]`.
pub async fn transfer_leader(args: &TransferArgs, global: &GlobalArgs) -> u8 {
    let client = match client_of(global) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let to = args.to;
    match client
        .at_leader(Operation::Mutation, |mut c| async move {
            c.transfer_leader(pb::TransferLeaderRequest { to }).await
        })
        .await
    {
        Ok(r) => {
            let line = match &r.status {
                Some(s) if s.leader_id == s.node_id => format!("node {} already leads", s.node_id),
                Some(s) => format!(
                    "leadership moved from node {} to node {} (term {})",
                    s.node_id, s.leader_id, s.term
                ),
                None => "leadership moved".to_string(),
            };
            print_change(global.output, &line, &r);
            exit::OK
        }
        Err(e) => fail(&e),
    }
}

/// `cairn cluster ...`.
pub async fn cluster(command: ClusterCommand, global: &GlobalArgs) -> u8 {
    let client = match client_of(global) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let ClusterCommand::Downgrade {
        to,
        cancel,
        compact_timeout_ms,
    } = command;
    let request = pb::ClusterVersionRequest {
        downgrade_to: to.map(|v| v.to_string()).unwrap_or_default(),
        cancel_downgrade: cancel,
    };
    let changed = client
        .at_leader(Operation::Mutation, |mut c| {
            let request = request.clone();
            async move { c.cluster_version(request).await }
        })
        .await;
    let r = match changed {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
    let version = describe_cluster_version(&r.cluster_version, &r.cluster_version_downgrade);
    if cancel {
        let line = format!(
            "the downgrade is cancelled; the cluster version is {version} and rises once every \
             member supports a higher one (log index {})",
            r.log_index
        );
        print_version_change(global.output, &line, &r, &[]);
        return exit::OK;
    }
    let compact_timeout = Duration::from_millis(compact_timeout_ms);
    if compact_timeout.is_zero() {
        let line = format!(
            "the cluster version is {version}; not waiting for the members to compact their \
             logs through index {} (each member's purged index in `cairn status -o json`)",
            r.log_index
        );
        print_version_change(global.output, &line, &r, &[]);
        return exit::OK;
    }
    eprintln!(
        "cairn: the cluster version is {version}; waiting up to {} for every member to compact \
         its log through index {}",
        human_duration(compact_timeout_ms),
        r.log_index
    );
    let progress = indicatif::ProgressBar::new_spinner()
        .with_style(indicatif::ProgressStyle::with_template("{spinner} {msg}").expect("template"));
    progress.enable_steady_tick(Duration::from_millis(100));
    let waited = wait_compacted(&client, r.log_index, compact_timeout, |line| {
        progress.set_message(line.to_string())
    })
    .await;
    progress.finish_and_clear();
    match waited {
        Ok(members) => {
            let line = format!(
                "the cluster version is {version}, and every member has compacted its log \
                 through index {}: members may now be replaced, one at a time, by a build that \
                 supports {} (docs/upgrading.md)",
                r.log_index, r.cluster_version
            );
            print_version_change(global.output, &line, &r, &members);
            exit::OK
        }
        Err(e) => {
            let code = fail(&e);
            eprintln!(
                "cairn: the downgrade is in place, but do not start an older build on a member \
                 until `cairn status -o json` shows its purged_index at or above {}",
                r.log_index
            );
            code
        }
    }
}

fn print_version_change(
    output: OutputFormat,
    line: &str,
    r: &pb::ClusterVersionResponse,
    members: &[(u64, u64)],
) {
    match output {
        OutputFormat::Table => out!("{line}"),
        OutputFormat::Json => {
            let compacted: Vec<Value> = members
                .iter()
                .map(|(id, purged)| json!({"id": id, "purged_index": purged}))
                .collect();
            print_json(&json!({
                "result": line,
                "cluster_version": r.cluster_version,
                "cluster_version_downgrade": r.cluster_version_downgrade,
                "log_index": r.log_index,
                "members": compacted,
            }))
        }
    }
}

/// Polls every member (as the first node that answers lists them) until each reports its
/// log purged through `index`, for at most `within`; `progress` sees one line per poll.
/// Returns each member's id and purged index.
async fn wait_compacted(
    client: &AdminClient,
    index: u64,
    within: Duration,
    progress: impl Fn(&str),
) -> Result<Vec<(u64, u64)>, ApiError> {
    let deadline = Instant::now() + within;
    loop {
        let (_, any) = client.first_status(|_| Ok(())).await?;
        let addresses: Vec<String> = any
            .members
            .iter()
            .map(|m| m.client_address.clone())
            .collect();
        let statuses = client.statuses(&addresses).await;
        let mut done = Vec::new();
        let mut waiting = Vec::new();
        for (member, status) in any.members.iter().zip(statuses) {
            match status {
                Ok(s) if s.purged_index >= index => done.push((member.id, s.purged_index)),
                Ok(s) => waiting.push(format!(
                    "node {} purged through {} (snapshot at {})",
                    member.id, s.purged_index, s.snapshot_index
                )),
                Err(e) => waiting.push(format!("node {} does not answer: {e}", member.id)),
            }
        }
        if waiting.is_empty() {
            return Ok(done);
        }
        let line = format!(
            "{} of {} members compacted; waiting for {}",
            done.len(),
            any.members.len(),
            waiting.join(", ")
        );
        if Instant::now() >= deadline {
            return Err(ApiError::Unavailable(format!(
                "not every member compacted its log through index {index} within {}: {line}",
                human_duration(within.as_millis() as u64)
            )));
        }
        progress(&line);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Whether this process talks to a person (for confirmations).
pub fn interactive() -> bool {
    std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// The cluster version a member's status reports (`0.2`, with the downgrade pinned, if
/// any); a member of release 0.1.0 reports none, which is 0.1.
fn cluster_version_of(status: &pb::StatusResponse) -> String {
    let version = cairn_fsm::ClusterVersion::reported(&status.cluster_version)
        .map(|v| v.to_string())
        .unwrap_or_else(|_| status.cluster_version.clone());
    describe_cluster_version(&version, &status.cluster_version_downgrade)
}

/// A cluster version as `cairn` prints it: `0.1`, or `0.1 (downgrade to 0.1 pinned)`.
fn describe_cluster_version(version: &str, downgrade: &str) -> String {
    if downgrade.is_empty() {
        version.to_string()
    } else {
        format!("{version} (downgrade to {downgrade} pinned)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, voter: bool) -> pb::Member {
        pb::Member {
            id,
            voter,
            client_address: format!("127.0.0.1:{id}"),
            ..Default::default()
        }
    }

    fn answer(
        id: u64,
        state: &str,
        leader: u64,
        term: u64,
    ) -> Result<pb::StatusResponse, ApiError> {
        Ok(pb::StatusResponse {
            node_id: id,
            state: state.into(),
            leader_id: leader,
            term,
            commit_index: 10,
            applied_index: 8,
            ..Default::default()
        })
    }

    #[test]
    fn a_report_names_no_leader_and_no_quorum() {
        // Two of three voters unreachable: no quorum (and the survivor leads no one); one
        // unreachable: healthy, with lag from the leader's commit index.
        let down = || Err(ApiError::Unavailable("cannot reach".into()));
        let report = ClusterReport::of(
            "c".into(),
            vec![
                MemberReport {
                    member: member(1, true),
                    answer: answer(1, "follower", 0, 3),
                },
                MemberReport {
                    member: member(2, true),
                    answer: down(),
                },
                MemberReport {
                    member: member(3, true),
                    answer: down(),
                },
            ],
        );
        let problems = report.problems();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("no leader"), "{problems:?}");
        assert!(problems[1].contains("1 of 3 voters"), "{problems:?}");
        let json = report.to_json();
        assert_eq!(json["healthy"], false);
        assert_eq!(json["members"][1]["reachable"], false);

        let report = ClusterReport::of(
            "c".into(),
            vec![
                MemberReport {
                    member: member(1, true),
                    answer: answer(1, "leader", 1, 3),
                },
                MemberReport {
                    member: member(2, true),
                    answer: answer(2, "follower", 1, 3),
                },
                MemberReport {
                    member: member(3, true),
                    answer: down(),
                },
                MemberReport {
                    member: member(4, false),
                    answer: down(),
                },
            ],
        );
        assert!(report.problems().is_empty(), "{:?}", report.problems());
        assert_eq!(report.to_json()["members"][1]["lag_entries"], 2);
        assert!(
            report.summary().contains("2 of 3 voters"),
            "{}",
            report.summary()
        );
    }

    #[test]
    fn sizes_and_durations_read_as_a_person_writes_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 * 1024 * 1024), "5.0 MiB");
        assert_eq!(human_duration(850), "850ms");
        assert_eq!(human_duration(4_200), "4.2s");
        assert_eq!(human_duration(302_000), "5m02s");
        assert_eq!(human_duration(3 * 3_600_000 + 7 * 60_000), "3h07m");
        assert_eq!(human_duration(2 * 86_400_000 + 4 * 3_600_000), "2d04h");
    }
}
