//! Replicas that check each other (`docs/operations.md`, "Replicas that check each other"):
//! the leader's periodic consistency check, the same check on demand
//! (`cairn check consistency`), the check of a member that has just started, and the rule
//! that a member the `CORRUPT` alarm names serves no reads.
//!
//! - **The check** ([`check`]), on the leader: its own table digest at its applied index `i`
//!   (`cairn_fsm::integrity`), and every other member's at `i` (`RaftService.StateDigest` on
//!   the peer port; each waits up to [`DIGEST_WAIT`] to apply `i`). The digests decide
//!   (`cairn_fsm::integrity::odd_ones_out`); members that differ from the majority (or all,
//!   when no digest has a majority) are named by a `CORRUPT` raise through the log, with one
//!   `ERROR` line naming them. A member that cannot answer is left out of that check, and
//!   said so. Members of different builds are not compared (their stored encodings may
//!   differ): the check is skipped while the members report different builds.
//! - **The task** ([`run`]) runs the check every `consistency_check_interval_ms` while this
//!   node leads, and at once when asked ([`Integrity::check_soon`]).
//! - **At start** ([`check_at_start`]), a member that has caught up asks the leader for its
//!   digest at the member's applied index; on a difference it logs it and asks the leader to
//!   check now (the majority decides who is named).
//! - **Reads**: a member the alarm names answers every read, list and watch `Unavailable`
//!   ([`serves_reads`]); a leader the alarm names hands leadership to another voter.
//!
//! Invariants: a raise names only members whose digest at one index differs from a strict
//! majority of the digests answered at that index (or every member that answered, when no
//! digest has a majority); the check never proposes from a node that does not lead.

use std::sync::Arc;
use std::time::Duration;

use cairn_fsm::integrity::{odd_ones_out, Verdict};
use cairn_fsm::{Command, DigestAt, IntegrityAction};
use cairn_proto::error::ApiError;
use serde::{Deserialize, Serialize};

use super::{NodeId, RaftHandle};

/// How long a member waits to apply the index it is asked about.
pub const DIGEST_WAIT: Duration = Duration::from_secs(2);
/// How long the leader waits for each member's answer (the wait, plus the round trip).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(4);

/// `RaftService.StateDigest`'s request payload (bincode, as every peer message).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DigestQuestion {
    pub index: u64,
    /// At most [`DIGEST_WAIT`]; longer waits are cut to it.
    pub wait_ms: u64,
    /// Asks the receiver, if it leads, to run a consistency check soon.
    pub check_soon: bool,
}

/// `RaftService.StateDigest`'s reply payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DigestReply {
    pub answer: DigestAnswer,
    /// The receiver's build (`CARGO_PKG_VERSION`).
    pub build: String,
}

/// [`cairn_fsm::DigestAt`], on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DigestAnswer {
    Known(u64),
    NotYet { applied_index: u64 },
    Forgotten { oldest_index: u64 },
}

impl From<DigestAt> for DigestAnswer {
    fn from(at: DigestAt) -> DigestAnswer {
        match at {
            DigestAt::Known(d) => DigestAnswer::Known(d),
            DigestAt::NotYet { applied_index } => DigestAnswer::NotYet { applied_index },
            DigestAt::Forgotten { oldest_index } => DigestAnswer::Forgotten { oldest_index },
        }
    }
}

/// This build, as members compare it.
pub(super) fn build() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// What one member answered in a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberAnswer {
    Digest(u64),
    /// Left out of this check, and why (unreachable, behind, another build).
    LeftOut(String),
}

/// One consistency check.
#[derive(Debug, Clone)]
pub struct CheckReport {
    /// The index every digest was taken at.
    pub index: u64,
    /// Each member (this node included) and what it answered.
    pub members: Vec<(NodeId, MemberAnswer)>,
    /// What the digests say (`None`: not compared; see `skipped`).
    pub verdict: Option<Verdict>,
    /// Why the digests were not compared, if they were not.
    pub skipped: Option<String>,
    /// The log index of the raise this check proposed, if it did.
    pub raised_index: Option<u64>,
}

/// The check's shared state on one node.
#[derive(Default)]
pub struct Integrity {
    soon: tokio::sync::Notify,
}

impl Integrity {
    /// Asks the task to check at once (on the leader).
    pub fn check_soon(&self) {
        self.soon.notify_one();
    }
}

/// The `CORRUPT` alarm as `cairn alarm list` shows it (None: not raised).
pub fn alarm(alarm: &cairn_fsm::CorruptAlarm) -> Option<cairn_proto::v1::Alarm> {
    alarm.is_raised().then(|| cairn_proto::v1::Alarm {
        name: "CORRUPT".into(),
        raised_index: alarm.raised_index,
        reason: format!(
            "the table digest of node(s) {:?} differed from the majority's: they serve no \
             reads; replace them (docs/operations.md, \"Replace a corrupt member\"), then \
             disarm",
            alarm.members
        ),
        members: alarm.members.clone(),
    })
}

/// `Ok` unless the `CORRUPT` alarm names this node: then `Unavailable`, naming why and
/// what to do.
pub fn serves_reads(raft: &RaftHandle) -> Result<(), ApiError> {
    let alarm = raft.store.corrupt_alarm();
    if !alarm.names(raft.node_id) {
        return Ok(());
    }
    Err(ApiError::Unavailable(format!(
        "node {} serves no reads: the CORRUPT alarm (raised by the entry at index {}) names \
         it, its table differs from the majority's; ask another member, and replace this one \
         (docs/operations.md, \"Replace a corrupt member\")",
        raft.node_id, alarm.raised_index
    )))
}

/// Answers `RaftService.StateDigest` on this node (`leads`: whether it leads).
pub(super) async fn answer(
    store: &cairn_fsm::Store,
    integrity: &Integrity,
    leads: bool,
    question: &DigestQuestion,
) -> DigestReply {
    if question.check_soon && leads {
        integrity.check_soon();
    }
    let wait = Duration::from_millis(question.wait_ms).min(DIGEST_WAIT);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let at = store.digest_at(question.index);
        if !matches!(at, DigestAt::NotYet { .. }) || tokio::time::Instant::now() >= deadline {
            return DigestReply {
                answer: at.into(),
                build: build(),
            };
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs one consistency check (on the leader; NotLeader elsewhere), and raises `CORRUPT`
/// when members differ.
pub async fn check(raft: &RaftHandle) -> Result<CheckReport, ApiError> {
    raft.require_leader()?;
    let index = raft.store.applied_index();
    let own = match raft.store.digest_at(index) {
        DigestAt::Known(d) => d,
        other => {
            return Err(ApiError::Unavailable(format!(
            "this leader's digest at its applied index {index} is unknown ({other:?}): try again"
        )))
        }
    };
    let status = raft.status();
    let others: Vec<(NodeId, String)> = status
        .voters
        .iter()
        .chain(status.learners.iter())
        .filter(|(id, _)| **id != raft.node_id)
        .map(|(id, node)| (*id, node.peer_address.clone()))
        .collect();
    let question = DigestQuestion {
        index,
        wait_ms: DIGEST_WAIT.as_millis() as u64,
        check_soon: false,
    };
    let asks = others.iter().map(|(id, address)| {
        let question = question.clone();
        async move {
            let reply = raft
                .network
                .digest_of(address, &question, ANSWER_TIMEOUT)
                .await;
            (*id, reply)
        }
    });
    let replies = futures::future::join_all(asks).await;
    let own_build = build();
    let mut members = vec![(raft.node_id, MemberAnswer::Digest(own))];
    let mut other_build = None;
    for (id, reply) in replies {
        let answer = match reply {
            Err(e) => MemberAnswer::LeftOut(format!("no answer: {e}")),
            Ok(reply) if reply.build != own_build => {
                other_build.get_or_insert((id, reply.build.clone()));
                MemberAnswer::LeftOut(format!("runs build {}", reply.build))
            }
            Ok(reply) => match reply.answer {
                DigestAnswer::Known(d) => MemberAnswer::Digest(d),
                DigestAnswer::NotYet { applied_index } => MemberAnswer::LeftOut(format!(
                    "had applied only index {applied_index} after {} ms",
                    DIGEST_WAIT.as_millis()
                )),
                DigestAnswer::Forgotten { oldest_index } => MemberAnswer::LeftOut(format!(
                    "keeps digests from index {oldest_index} on (it installed a snapshot since)"
                )),
            },
        };
        members.push((id, answer));
    }
    members.sort_by_key(|(id, _)| *id);
    let mut report = CheckReport {
        index,
        members,
        verdict: None,
        skipped: None,
        raised_index: None,
    };
    if let Some((id, other)) = other_build {
        report.skipped = Some(format!(
            "the members run different builds (node {id}: {other}, this leader: {own_build}): \
             digests are compared only between members of one build"
        ));
        super::series::consistency_check("skipped");
        return Ok(report);
    }
    let answers: Vec<(NodeId, u64)> = report
        .members
        .iter()
        .filter_map(|(id, a)| match a {
            MemberAnswer::Digest(d) => Some((*id, *d)),
            MemberAnswer::LeftOut(_) => None,
        })
        .collect();
    let verdict = odd_ones_out(&answers);
    let named = match &verdict {
        Verdict::Agree => None,
        Verdict::Differ(m) | Verdict::NoMajority(m) => Some(m.clone()),
    };
    super::series::consistency_check(match verdict {
        Verdict::Agree => "agree",
        Verdict::Differ(_) => "differ",
        Verdict::NoMajority(_) => "no-majority",
    });
    report.verdict = Some(verdict);
    let Some(named) = named else {
        tracing::debug!(
            index,
            members = answers.len(),
            "consistency check: digests agree"
        );
        return Ok(report);
    };
    let alarm = raft.store.corrupt_alarm();
    if named.iter().all(|m| alarm.names(*m)) {
        tracing::debug!(index, members = ?named, "consistency check: the CORRUPT alarm names the members that differ already");
        return Ok(report);
    }
    tracing::error!(
        index,
        members = ?named,
        answers = ?answers,
        "CORRUPT: the table digest of node(s) {named:?} at index {index} differs from the \
         majority's; raising the CORRUPT alarm: they stop serving reads. Replace them \
         (docs/operations.md, \"Replace a corrupt member\")"
    );
    let (log_index, _) = raft
        .propose(Command::Integrity {
            action: IntegrityAction::RaiseCorrupt(named),
        })
        .await?;
    report.raised_index = Some(log_index);
    Ok(report)
}

/// Hands leadership to another voter (the admin service's transfer, given from above).
pub type HandOff =
    Arc<dyn Fn() -> futures::future::BoxFuture<'static, Result<(), ApiError>> + Send + Sync>;

/// The leader's periodic check, every `interval` while this node leads and whenever asked;
/// a leader the alarm names hands leadership to another voter with `hand_off`.
/// `interval` = 0: only when asked.
pub async fn run(raft: RaftHandle, interval: Duration, hand_off: HandOff) {
    loop {
        let periodic = async {
            match interval.is_zero() {
                true => std::future::pending().await,
                false => tokio::time::sleep(interval).await,
            }
        };
        tokio::select! {
            _ = periodic => {}
            _ = raft.integrity.soon.notified() => {}
        }
        if !raft.leads_with_current_state().await {
            continue;
        }
        if let Err(e) = check(&raft).await {
            tracing::warn!(error = %e, "consistency check failed");
        }
        if raft.store.corrupt_alarm().names(raft.node_id) && raft.is_leader() {
            tracing::error!("the CORRUPT alarm names this leader: handing leadership off");
            if let Err(e) = hand_off().await {
                tracing::warn!(error = %e, "handing leadership off failed");
            }
        }
    }
}

/// Once this member has caught up after its start, compares its digest at its applied
/// index with the leader's; on a difference, logs it and asks the leader to check now.
/// Gives up quietly after `patience` (a leader that never answers is another problem).
pub async fn check_at_start(raft: RaftHandle, patience: Duration) {
    let deadline = tokio::time::Instant::now() + patience;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if raft.is_leader() {
            // The periodic check covers a leader.
            return;
        }
        let Some(leader) = raft.leader_address() else {
            continue;
        };
        let index = raft.store.applied_index();
        let committed = raft.committed_index().await;
        if index == 0 || index + 16 < committed {
            continue;
        }
        let DigestAt::Known(own) = raft.store.digest_at(index) else {
            continue;
        };
        let question = DigestQuestion {
            index,
            wait_ms: DIGEST_WAIT.as_millis() as u64,
            check_soon: false,
        };
        let Ok(reply) = raft
            .network
            .digest_of(&leader, &question, ANSWER_TIMEOUT)
            .await
        else {
            continue;
        };
        match reply.answer {
            _ if reply.build != build() => return,
            DigestAnswer::Known(theirs) if theirs == own => {
                tracing::info!(
                    index,
                    "start-up consistency check: this member's table digest equals the leader's"
                );
                return;
            }
            DigestAnswer::Known(theirs) => {
                tracing::error!(
                    index,
                    own,
                    leader = theirs,
                    "start-up consistency check: this member's table digest differs from the \
                     leader's; asking the leader to check every member now"
                );
                let ask = DigestQuestion {
                    check_soon: true,
                    ..question
                };
                let _ = raft.network.digest_of(&leader, &ask, ANSWER_TIMEOUT).await;
                return;
            }
            DigestAnswer::NotYet { .. } | DigestAnswer::Forgotten { .. } => continue,
        }
    }
}

/// DANGEROUS, test-only (`--unsafe-alter-applied-state`): once this member's table holds a
/// resource, changes that resource's data in this member's table only, outside the log.
pub async fn unsafe_alter_applied_state(raft: RaftHandle) {
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(key) = raft.store.unsafe_alter_one_resource_for_tests() {
            tracing::warn!(
                key = %key.replace('\0', "/"),
                "--unsafe-alter-applied-state: changed one resource in this member's table, \
                 outside the log"
            );
            return;
        }
    }
}
