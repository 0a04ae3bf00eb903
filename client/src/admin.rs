//! The one way every admin caller reaches a cluster's `AdminService`: the `cairn` admin
//! commands (status, member, endpoint, transfer-leader, snapshot), `cairn dev` and `cairn
//! bench` finding the leader, and a node checking the cluster at start or joining it.
//!
//! An [`AdminClient`] holds the endpoints (`host:port`, `http://` or `https://`), the
//! [`crate::Access`] (TLS, token), an overall timeout, and a bound for each
//! attempt at one endpoint (connection and answer), so that a dead or stopped (SIGSTOP)
//! node costs one attempt, not the whole timeout:
//!
//! - [`AdminClient::status_at`], [`AdminClient::statuses`]: one node's status; many nodes',
//!   concurrently.
//! - [`AdminClient::first_status`]: the endpoints in turn, in rounds until the timeout, until
//!   one answers with a status the caller accepts.
//! - [`AdminClient::leader`]: the same rounds, following the leader each answer names.
//! - [`AdminClient::at_leader`]: a call at the leader, found as above and found again when the
//!   leader answers NotLeader or cannot be reached; the call itself gets what is left of the
//!   timeout.
//! - [`AdminClient::wait_caught_up`]: polls the leader until a member has caught up.
//!
//! A refusal of the caller's credentials ends every loop at once: the grants are the same on
//! every node. Errors are [`ApiError`]s (the one vocabulary, and its exit codes); running out
//! of time is `Unavailable`, naming what was tried last.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::time::Duration;

use crate::{Access, AuthenticatedChannel};
use cairn_proto::error::{ApiError, LeaderHint};
use cairn_proto::v1::admin_service_client::AdminServiceClient;
use cairn_proto::v1::{self as pb};
pub use cairn_request::Operation;
use cairn_request::{Attempts, Failure, Pacing};
use tokio::time::Instant;

/// The admin service of one node, as the client calls it.
pub type AdminRpc = AdminServiceClient<AuthenticatedChannel>;

/// The default overall timeout of an admin command (`--timeout-ms`).
pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// The most one attempt at one endpoint gets, whatever the overall timeout.
pub const ATTEMPT_TIMEOUT_MAX: Duration = Duration::from_secs(3);
/// The least one attempt gets (unless the overall timeout is shorter).
const ATTEMPT_TIMEOUT_MIN: Duration = Duration::from_millis(300);
/// The pause between two rounds over the endpoints (an election takes about this long).
const ROUND_PAUSE: Duration = Duration::from_millis(250);
/// How often [`AdminClient::wait_caught_up`] asks the leader.
const CATCH_UP_POLL: Duration = Duration::from_millis(200);
/// Snapshot chunks are 1 MiB; status answers are small.
const DECODING_BYTES_MAX: usize = 8 * 1024 * 1024;

/// How to reach a cluster's admin service: see the module docs.
#[derive(Clone, Debug)]
pub struct AdminClient {
    endpoints: Vec<String>,
    access: Access,
    timeout: Duration,
    attempt: Duration,
}

/// The leader as found: its client address and its status.
#[derive(Clone, Debug)]
pub struct Leader {
    pub address: String,
    pub status: pb::StatusResponse,
}

impl AdminClient {
    /// Endpoints tried in the order given; each attempt gets the overall `timeout` shared
    /// among the endpoints, within [300 ms, 3 s] (never more than `timeout`).
    pub fn new(endpoints: Vec<String>, access: Access, timeout: Duration) -> AdminClient {
        let share = timeout / endpoints.len().max(1) as u32;
        let attempt = share
            .clamp(ATTEMPT_TIMEOUT_MIN, ATTEMPT_TIMEOUT_MAX)
            .min(timeout);
        AdminClient {
            endpoints,
            access,
            timeout,
            attempt,
        }
    }

    /// The same client, each attempt bounded by `attempt` instead.
    pub fn with_attempt_timeout(mut self, attempt: Duration) -> AdminClient {
        self.attempt = attempt.min(self.timeout);
        self
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    pub fn access(&self) -> &Access {
        &self.access
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn attempt_timeout(&self) -> Duration {
        self.attempt
    }

    /// The deadline of an operation starting now.
    pub fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// A connection to the admin service at `address`, made within `within`.
    pub async fn connect(&self, address: &str, within: Duration) -> Result<AdminRpc, ApiError> {
        match tokio::time::timeout(within, self.access.admin(address)).await {
            Ok(Ok(client)) => Ok(client
                .max_decoding_message_size(DECODING_BYTES_MAX)
                .max_encoding_message_size(DECODING_BYTES_MAX)),
            Ok(Err(e)) => Err(ApiError::Unavailable(e)),
            Err(_) => Err(ApiError::Unavailable(format!(
                "cannot reach {address} within {} ms",
                within.as_millis()
            ))),
        }
    }

    /// `call` at `address`, connection included, within `within`.
    pub async fn call_at<T, F, Fut>(
        &self,
        address: &str,
        within: Duration,
        call: F,
    ) -> Result<T, ApiError>
    where
        F: FnOnce(AdminRpc) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let deadline = Instant::now() + within;
        let client = self.connect(address, within).await?;
        match tokio::time::timeout_at(deadline, call(client)).await {
            Ok(answer) => answer
                .map(tonic::Response::into_inner)
                .map_err(ApiError::from),
            Err(_) => Err(ApiError::Unavailable(format!(
                "{address} did not answer within {} ms",
                within.as_millis()
            ))),
        }
    }

    /// The status of the node at `address`, within one attempt.
    pub async fn status_at(&self, address: &str) -> Result<pb::StatusResponse, ApiError> {
        self.status_within(address, self.attempt).await
    }

    /// The status of the node at `address`, within `within`.
    async fn status_within(
        &self,
        address: &str,
        within: Duration,
    ) -> Result<pb::StatusResponse, ApiError> {
        self.call_at(address, within, |mut c| async move {
            c.status(pb::StatusRequest {}).await
        })
        .await
    }

    /// The statuses of `addresses`, asked concurrently, each within one attempt.
    pub async fn statuses(
        &self,
        addresses: &[String],
    ) -> Vec<Result<pb::StatusResponse, ApiError>> {
        futures::future::join_all(addresses.iter().map(|a| self.status_at(a))).await
    }

    /// The first endpoint (asked in turn, in rounds until the timeout) whose status `accept`
    /// takes, with that status.
    pub async fn first_status(
        &self,
        accept: impl Fn(&pb::StatusResponse) -> Result<(), String>,
    ) -> Result<(String, pb::StatusResponse), ApiError> {
        let deadline = self.deadline();
        let mut last = None;
        loop {
            for address in &self.endpoints {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                let answer = self.status_within(address, self.attempt.min(left)).await;
                match answer {
                    Ok(s) => match accept(&s) {
                        Ok(()) => return Ok((address.clone(), s)),
                        Err(why) => last = Some(ApiError::Unavailable(why)),
                    },
                    Err(e) if e.is_credential_refusal() => return Err(e),
                    Err(e) => last = Some(e),
                }
            }
            if !pause_before_next_round(deadline).await {
                return Err(out_of_time(self, last));
            }
        }
    }

    /// The leader, asking the endpoints in turn and following the leader each one names.
    pub async fn leader(&self) -> Result<Leader, ApiError> {
        self.leader_by(self.deadline(), None).await
    }

    /// [`AdminClient::leader`] by `deadline`, trying `hint` (a leader's address) first.
    async fn leader_by(&self, deadline: Instant, hint: Option<String>) -> Result<Leader, ApiError> {
        let mut last = None;
        let mut hint = hint;
        loop {
            let mut queue: VecDeque<String> = hint
                .take()
                .into_iter()
                .chain(self.endpoints.iter().cloned())
                .collect();
            let mut asked = HashSet::new();
            while let Some(address) = queue.pop_front() {
                if !asked.insert(address.clone()) {
                    continue;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                let answer = self.status_within(&address, self.attempt.min(left)).await;
                match answer {
                    Ok(s) if leads(&s) => return Ok(Leader { address, status: s }),
                    Ok(s) => {
                        let named = s
                            .members
                            .iter()
                            .find(|m| s.leader_id != 0 && m.id == s.leader_id);
                        match named {
                            Some(leader) => {
                                queue.push_front(leader.client_address.clone());
                                last = Some(ApiError::Unavailable(format!(
                                    "node {} at {address} follows node {} at {}, which did not \
                                     answer as leader",
                                    s.node_id, leader.id, leader.client_address
                                )));
                            }
                            None => {
                                last = Some(ApiError::Unavailable(format!(
                                    "node {} at {address} knows no leader (it is {} in term {})",
                                    s.node_id, s.state, s.term
                                )))
                            }
                        }
                    }
                    Err(e) if e.is_credential_refusal() => return Err(e),
                    Err(e) => last = Some(e),
                }
            }
            if !pause_before_next_round(deadline).await {
                return Err(no_leader(self, last));
            }
        }
    }

    /// `call` at the leader (see the module docs): `cairn_request`'s one retry loop, whose
    /// transport finds the leader and makes the call, and whose decision says what follows a
    /// failure — a NotLeader is followed, a refusal of the credentials ends it, and a
    /// `Mutation` whose answer was lost (the deadline passed while it ran) is Inconsistent:
    /// it may still take effect.
    pub async fn at_leader<T, F, Fut>(&self, operation: Operation, call: F) -> Result<T, ApiError>
    where
        F: FnMut(AdminRpc) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let pacing = Pacing {
            pause_initial: ROUND_PAUSE,
            pause_max: ROUND_PAUSE,
            attempts_max: u32::MAX,
        };
        let mut at = AtLeader {
            client: self,
            call,
            hint: None,
        };
        cairn_request::run(operation, &mut at, &pacing, self.deadline())
            .await
            .map_err(|ended| ended.into_api_error(operation))
    }

    /// Polls the leader until it reports member `id` caught up (`Member.caught_up`), for at
    /// most `within`; `progress` sees the leader's view of the member at each poll.
    pub async fn wait_caught_up(
        &self,
        id: u64,
        within: Duration,
        mut progress: impl FnMut(&pb::Member, &pb::StatusResponse),
    ) -> Result<pb::Member, ApiError> {
        let deadline = Instant::now() + within;
        let mut last;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self
                .leader_by(Instant::now() + left.min(self.timeout), None)
                .await
            {
                Ok(leader) => {
                    let status = &leader.status;
                    let Some(member) = status.members.iter().find(|m| m.id == id) else {
                        return Err(ApiError::Inconsistent(format!(
                            "node {id} is no longer a member of the cluster"
                        )));
                    };
                    progress(member, status);
                    if member.caught_up {
                        return Ok(member.clone());
                    }
                    last = describe_catch_up(member, status);
                }
                Err(e) if e.is_credential_refusal() => return Err(e),
                Err(e) => last = e.to_string(),
            }
            if Instant::now() + CATCH_UP_POLL >= deadline {
                return Err(ApiError::Unavailable(format!(
                    "node {id} has not caught up within {} ms: {}",
                    within.as_millis(),
                    last
                )));
            }
            tokio::time::sleep(CATCH_UP_POLL).await;
        }
    }
}

/// The transport of [`AdminClient::at_leader`]: each attempt finds the leader (following the
/// last NotLeader's hint first) and makes the call there, by the deadline.
struct AtLeader<'a, F> {
    client: &'a AdminClient,
    call: F,
    /// The leader's client address, as the last NotLeader named it.
    hint: Option<String>,
}

impl<T, F, Fut> Attempts for AtLeader<'_, F>
where
    F: FnMut(AdminRpc) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    type Response = T;

    async fn attempt(&mut self, deadline: Instant) -> Result<T, Failure> {
        let client = self.client;
        let leader = match client.leader_by(deadline, self.hint.take()).await {
            Ok(leader) => leader,
            // The same on every node: the decision stops at once.
            Err(e) if e.is_credential_refusal() => return Err(Failure::Answered(e)),
            Err(e) => return Err(Failure::NotSent(strip_kind(&e))),
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let rpc = client
            .connect(&leader.address, client.attempt.min(left))
            .await
            .map_err(|e| Failure::NotSent(strip_kind(&e)))?;
        match tokio::time::timeout_at(deadline, (self.call)(rpc)).await {
            Ok(Ok(answer)) => Ok(answer.into_inner()),
            Ok(Err(status)) => Err(Failure::from_status(&status)),
            Err(_) => Err(Failure::NoAnswer(format!(
                "the leader (node {} at {}) did not answer within {} ms (check with `cairn \
                 status`, or pass a longer --timeout-ms)",
                leader.status.node_id,
                leader.address,
                client.timeout.as_millis()
            ))),
        }
    }

    fn move_on(&mut self, _failure: &Failure, leader: Option<&LeaderHint>) -> bool {
        // A NotLeader naming the new leader is followed at once.
        self.hint = leader.and_then(|l| l.client_address.clone());
        self.hint.is_none()
    }
}

/// Whether the node that answered `s` says it leads.
pub fn leads(s: &pb::StatusResponse) -> bool {
    s.state == "leader" && s.leader_id == s.node_id
}

/// The leader as members' statuses show it, to report what is there: of the members that
/// say they lead, the one of the highest term (a deposed leader that has not heard of the
/// new term yet still says it leads). `cairn status` and the web console.
pub fn leader_of<'a>(
    statuses: impl IntoIterator<Item = &'a pb::StatusResponse>,
) -> Option<&'a pb::StatusResponse> {
    statuses
        .into_iter()
        .filter(|s| leads(s))
        .max_by_key(|s| s.term)
}

/// The leader as members' statuses confirm it, to act on: a member that says it leads and
/// that a majority of the `members` names as leader (itself included). A leader cut off
/// from the others may say it leads for an election timeout; the majority no longer names
/// it. `cairn drill` and the fault suite.
pub fn confirmed_leader<'a>(
    statuses: impl IntoIterator<Item = &'a pb::StatusResponse> + Clone,
    members: usize,
) -> Option<&'a pb::StatusResponse> {
    let majority = members / 2 + 1;
    statuses
        .clone()
        .into_iter()
        .filter(|s| leads(s))
        .find(|claimant| {
            statuses
                .clone()
                .into_iter()
                .filter(|s| s.leader_id == claimant.node_id)
                .count()
                >= majority
        })
}

/// Where a member's catch-up stands, as the leader's status shows it.
pub fn describe_catch_up(member: &pb::Member, leader: &pb::StatusResponse) -> String {
    if !member.matched_known {
        if member.last_contact_ms < 0 {
            return format!(
                "the leader has never heard from node {} (is its process running, with peer \
                 address {}?)",
                member.id, member.peer_address
            );
        }
        return format!("node {} has not received any entry yet", member.id);
    }
    format!(
        "node {} is at index {} of {} ({} entries behind; caught up at {} or fewer{})",
        member.id,
        member.matched_index,
        leader.last_log_index,
        member.lag_entries.max(0),
        leader.caught_up_lag_entries_max,
        if member.last_contact_ms > 0 {
            format!(", last heard {} ms ago", member.last_contact_ms)
        } else {
            String::new()
        }
    )
}

/// Sleeps before another round unless that would pass `deadline`; false when no round is
/// left.
async fn pause_before_next_round(deadline: Instant) -> bool {
    if Instant::now() + ROUND_PAUSE >= deadline {
        return false;
    }
    tokio::time::sleep(ROUND_PAUSE).await;
    true
}

fn out_of_time(client: &AdminClient, last: Option<ApiError>) -> ApiError {
    match last {
        Some(e) if client.endpoints.len() == 1 => e,
        Some(e) => ApiError::Unavailable(format!(
            "no endpoint of {} answered within {} ms (last: {})",
            client.endpoints.join(","),
            client.timeout.as_millis(),
            strip_kind(&e)
        )),
        None => ApiError::invalid("endpoints", "no endpoint given"),
    }
}

fn no_leader(client: &AdminClient, last: Option<ApiError>) -> ApiError {
    match last {
        None if client.endpoints.is_empty() => ApiError::invalid("endpoints", "no endpoint given"),
        None => ApiError::Unavailable(format!(
            "no leader found within {} ms",
            client.timeout.as_millis()
        )),
        Some(e) => ApiError::Unavailable(format!(
            "no leader found within {} ms through {} (last: {})",
            client.timeout.as_millis(),
            client.endpoints.join(","),
            strip_kind(&e)
        )),
    }
}

/// An error's message without its kind's prefix (for an error quoted inside another).
fn strip_kind(e: &ApiError) -> String {
    match e {
        ApiError::Unavailable(m) | ApiError::Inconsistent(m) => m.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(node_id: u64, state: &str, leader_id: u64, term: u64) -> pb::StatusResponse {
        pb::StatusResponse {
            node_id,
            state: state.into(),
            leader_id,
            term,
            ..pb::StatusResponse::default()
        }
    }

    #[test]
    fn the_leader_shown_is_the_highest_claim_and_the_leader_acted_on_is_named_by_a_majority() {
        // (statuses as (node, state, leader named, term), members, shown, confirmed)
        type Case = (
            &'static [(u64, &'static str, u64, u64)],
            usize,
            Option<u64>,
            Option<u64>,
        );
        let table: &[Case] = &[
            // A healthy cluster: both rules agree.
            (
                &[
                    (1, "leader", 1, 2),
                    (2, "follower", 1, 2),
                    (3, "follower", 1, 2),
                ],
                3,
                Some(1),
                Some(1),
            ),
            // Node 1 cut off still says it leads in term 2; 2 and 3 moved on to node 2.
            (
                &[
                    (1, "leader", 1, 2),
                    (2, "leader", 2, 3),
                    (3, "follower", 2, 3),
                ],
                3,
                Some(2),
                Some(2),
            ),
            // Only the old leader answers: shown, but not confirmed.
            (&[(1, "leader", 1, 2)], 3, Some(1), None),
            // A follower naming a leader that does not answer: none either way.
            (
                &[(2, "follower", 1, 2), (3, "follower", 1, 2)],
                3,
                None,
                None,
            ),
            // A candidate names no leader.
            (
                &[(1, "candidate", 0, 4), (2, "follower", 0, 4)],
                3,
                None,
                None,
            ),
            // Five members: two votes are no majority.
            (
                &[(1, "leader", 1, 2), (2, "follower", 1, 2)],
                5,
                Some(1),
                None,
            ),
        ];
        for (statuses, members, shown, confirmed) in table {
            let statuses: Vec<pb::StatusResponse> = statuses
                .iter()
                .map(|(n, state, l, t)| status(*n, state, *l, *t))
                .collect();
            assert_eq!(
                leader_of(&statuses).map(|s| s.node_id),
                *shown,
                "{statuses:?}"
            );
            assert_eq!(
                confirmed_leader(&statuses, *members).map(|s| s.node_id),
                *confirmed,
                "{statuses:?} of {members}"
            );
        }
    }

    fn client(endpoints: usize, timeout_ms: u64) -> AdminClient {
        AdminClient::new(
            (0..endpoints)
                .map(|i| format!("127.0.0.1:{}", 1 + i))
                .collect(),
            Access::plaintext(),
            Duration::from_millis(timeout_ms),
        )
    }

    #[test]
    fn each_attempt_gets_a_share_of_the_timeout_within_bounds() {
        // 10 s over 3 endpoints: 3 s each (the cap); 2 s over 4: 500 ms; 1 s over 10: the
        // 300 ms floor; a 100 ms timeout: never more than the timeout.
        assert_eq!(client(3, 10_000).attempt_timeout(), ATTEMPT_TIMEOUT_MAX);
        assert_eq!(
            client(4, 2_000).attempt_timeout(),
            Duration::from_millis(500)
        );
        assert_eq!(client(10, 1_000).attempt_timeout(), ATTEMPT_TIMEOUT_MIN);
        assert_eq!(client(1, 100).attempt_timeout(), Duration::from_millis(100));
    }

    #[tokio::test]
    async fn dead_endpoints_end_within_the_timeout_naming_the_last_error() {
        // Nothing listens on ports 1 and 2: the loops give up by their timeout, with an
        // Unavailable that names what was tried.
        let c = client(2, 1_000);
        let started = std::time::Instant::now();
        let e = c.leader().await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(3), "{e}");
        assert!(
            matches!(&e, ApiError::Unavailable(m) if m.contains("no leader found")),
            "{e}"
        );
        let e = c.first_status(|_| Ok(())).await.unwrap_err();
        assert!(
            matches!(&e, ApiError::Unavailable(m) if m.contains("127.0.0.1:1")),
            "{e}"
        );
        assert!(!e.to_string().contains("Some("), "{e}");
        // A change that was never sent (no leader found) is Unavailable: certainly not done.
        let e = c
            .at_leader(Operation::Mutation, |mut c| async move {
                c.promote(pb::PromoteRequest { id: 9 }).await
            })
            .await
            .unwrap_err();
        assert!(
            matches!(&e, ApiError::Unavailable(m) if m.contains("no leader found")),
            "{e}"
        );
    }
}
