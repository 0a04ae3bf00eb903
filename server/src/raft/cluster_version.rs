//! The cluster version on a running node (`docs/upgrading.md`; the replicated rules are
//! `cairn_fsm::ClusterVersionState`'s).
//!
//! - Every Raft message and reply carries the highest cluster version its sender's build
//!   supports (`RaftMessage.cluster_version_supported_*`; absent from a build of release
//!   0.1.0, which means 0.1). The leader keeps what each member's last reply said
//!   ([`super::contacts::Contacts::reported_support`]).
//! - The leader raises the cluster version through the log once every voter and learner has
//!   answered within [`REPORT_FRESH`] saying that it supports the higher one
//!   ([`raise_target`], a pure decision), and never while a downgrade is pinned.
//! - A node never runs at a cluster version its build does not support: applying such a
//!   raise, or loading such a snapshot, stops it ([`check_supported`]) before it serves
//!   anything under rules it does not know.

use std::time::Duration;

use cairn_fsm::{Applied, ClusterVersion, ClusterVersionState, Command, VersionAction};
use cairn_proto::error::ApiError;

use super::types::NodeId;
use crate::fatal::FatalCause;

/// How recent a member's report of its supported version must be to count: a member that
/// has not answered for this long may have been restarted with another build.
pub const REPORT_FRESH: Duration = Duration::from_secs(3);

/// How often the leader considers raising the cluster version.
pub const RAISE_INTERVAL: Duration = Duration::from_secs(1);

/// Whether this build may run at `state`; `source` says where the version came from (the
/// log entry or the snapshot). The refusal names both versions and what to do.
pub fn check_supported(state: ClusterVersionState, source: &str) -> Result<(), FatalCause> {
    if state.version.is_supported_here() {
        return Ok(());
    }
    Err(FatalCause::DataDirRefused {
        reason: format!(
            "{source} sets the cluster version to {}, and this build ({}) supports cluster \
             versions {} to {}: run a build that supports {} on this node",
            state.version,
            env!("CARGO_PKG_VERSION"),
            ClusterVersion::SUPPORTED_MIN,
            ClusterVersion::SUPPORTED_MAX,
            state.version,
        ),
    })
}

/// The version the leader raises the cluster to, if any: the lowest of what every member
/// supports (`own` for the leader itself; `None` for a member that has not answered
/// recently, which holds the raise back), when it is above the current version and no
/// downgrade is pinned.
pub fn raise_target(
    current: ClusterVersionState,
    own: ClusterVersion,
    members: &[(NodeId, Option<ClusterVersion>)],
) -> Option<ClusterVersion> {
    if current.downgrade.is_some() {
        return None;
    }
    let mut target = own;
    for (_, supported) in members {
        target = target.min((*supported)?);
    }
    (target > current.version).then_some(target)
}

/// The lowest cluster version whose builds know [`Command::ClusterVersion`] (release
/// 0.2.0): every member must support it before one is proposed, raise, downgrade or
/// cancel (an older build could not apply it).
pub const COMMAND_SINCE: ClusterVersion = ClusterVersion::new(0, 2);

/// What every member other than this node (the leader) last reported of its build's
/// support, `None` for a member not heard from within [`REPORT_FRESH`].
fn member_reports(raft: &super::RaftHandle) -> Vec<(NodeId, Option<ClusterVersion>)> {
    let status = raft.status();
    status
        .voters
        .keys()
        .chain(status.learners.keys())
        .filter(|id| **id != raft.node_id)
        .map(|id| (*id, raft.contacts.supported_recently(*id, REPORT_FRESH)))
        .collect()
}

/// Why a command needing `version` of every member's build may not be proposed now: the
/// members that did not report supporting it recently, named with what they reported.
pub fn unsupported_by(
    members: &[(NodeId, Option<ClusterVersion>)],
    version: ClusterVersion,
) -> Option<String> {
    let short: Vec<String> = members
        .iter()
        .filter_map(|(id, supported)| match supported {
            Some(v) if *v >= version => None,
            Some(v) => Some(format!("node {id} runs a build that supports up to {v}")),
            None => Some(format!(
                "node {id} has not answered within {} s",
                REPORT_FRESH.as_secs()
            )),
        })
        .collect();
    (!short.is_empty()).then(|| short.join("; "))
}

/// `cairn cluster downgrade --to V` (`Some(V)`) or `--cancel` (`None`), on the leader.
/// Returns the cluster version after it and the log index an older build's data dirs must
/// be compacted through (for a cancel: the change's index).
///
/// A downgrade is proposed twice: the second, a no-op by the table of
/// [`cairn_fsm::ClusterVersionState::decide`], is a barrier. A command is checked against
/// the cluster version right before it is proposed ([`super::RaftHandle::propose`]), so
/// every command checked before the first was applied (and so allowed under the higher
/// version) was proposed before the second. Each member compacts its log through the
/// index it has applied when it applies a downgrade (a snapshot, then a purge:
/// [`super::LogGrowth::compact_through`]); after the barrier, its log holds no command
/// that the lower version does not allow.
pub async fn change(
    raft: &super::RaftHandle,
    downgrade_to: Option<ClusterVersion>,
) -> Result<(ClusterVersionState, u64), ApiError> {
    raft.require_leader()?;
    if let Some(why) = unsupported_by(&member_reports(raft), COMMAND_SINCE) {
        return Err(ApiError::FailedPrecondition(format!(
            "a change of the cluster version is a command of release 0.2.0 or later, and not \
             every member is known to run one: {why}. Upgrade those members, or wait until \
             they answer, then try again"
        )));
    }
    let current = raft.store.cluster_version();
    let command = Command::ClusterVersion {
        action: match downgrade_to {
            Some(_) => VersionAction::Downgrade,
            None => VersionAction::CancelDowngrade,
        },
        version: downgrade_to.unwrap_or(current.version),
    };
    let (index, state) = propose_change(raft, command.clone()).await?;
    if downgrade_to.is_none() {
        return Ok((state, index));
    }
    let (barrier, state) = propose_change(raft, command).await?;
    assert!(barrier > index, "the barrier follows the downgrade");
    tracing::info!(cluster_version = %state, barrier, "downgraded the cluster version");
    Ok((state, barrier))
}

async fn propose_change(
    raft: &super::RaftHandle,
    command: Command,
) -> Result<(u64, ClusterVersionState), ApiError> {
    match raft.propose(command).await? {
        (index, Applied::ClusterVersion(state)) => Ok((index, state)),
        (index, other) => Err(ApiError::Internal(format!(
            "a cluster version change at index {index} applied as {other:?}"
        ))),
    }
}

/// On the leader, every [`RAISE_INTERVAL`]: raises the cluster version when [`raise_target`]
/// says so. Runs for the life of the node (a task of the agent).
pub async fn raise_when_supported(raft: super::RaftHandle) {
    let mut tick = tokio::time::interval(RAISE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !raft.is_leader() {
            continue;
        }
        let members = member_reports(&raft);
        let current = raft.store.cluster_version();
        let Some(target) = raise_target(current, ClusterVersion::SUPPORTED_MAX, &members) else {
            continue;
        };
        match raft
            .propose(Command::ClusterVersion {
                action: VersionAction::Raise,
                version: target,
            })
            .await
        {
            Ok((index, _)) => tracing::info!(
                from = %current.version,
                to = %target,
                index,
                "raised the cluster version: every member supports it"
            ),
            Err(e) => {
                tracing::debug!(error = %e, to = %target, "raising the cluster version failed; trying again")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V01: ClusterVersion = ClusterVersion::new(0, 1);
    const V02: ClusterVersion = ClusterVersion::new(0, 2);
    const V03: ClusterVersion = ClusterVersion::new(0, 3);

    fn at(version: ClusterVersion, downgrade: Option<ClusterVersion>) -> ClusterVersionState {
        ClusterVersionState { version, downgrade }
    }

    /// (current, own, members' reports, raise to)
    type Row = (
        ClusterVersionState,
        ClusterVersion,
        Vec<Option<ClusterVersion>>,
        Option<ClusterVersion>,
    );

    #[test]
    fn the_leader_raises_to_the_lowest_version_every_member_supports() {
        // (current, own, members' reports, raise to)
        let table: [Row; 8] = [
            // Every member upgraded: raise.
            (at(V01, None), V02, vec![Some(V02), Some(V02)], Some(V02)),
            // One member still runs 0.1.0: hold.
            (at(V01, None), V02, vec![Some(V02), Some(V01)], None),
            // One member has not answered recently: hold.
            (at(V01, None), V02, vec![Some(V02), None], None),
            // A newer member does not pull the cluster above the leader's build.
            (at(V01, None), V02, vec![Some(V03), Some(V03)], Some(V02)),
            // Already there.
            (at(V02, None), V02, vec![Some(V02), Some(V02)], None),
            // A pinned downgrade holds the version down.
            (at(V01, Some(V01)), V02, vec![Some(V02), Some(V02)], None),
            // A cluster of one.
            (at(V01, None), V02, vec![], Some(V02)),
            // Never down by a raise.
            (at(V03, None), V02, vec![Some(V02)], None),
        ];
        for (current, own, reports, expected) in table {
            let members: Vec<_> = reports
                .into_iter()
                .enumerate()
                .map(|(i, r)| (i as u64 + 2, r))
                .collect();
            assert_eq!(
                raise_target(current, own, &members),
                expected,
                "{current} {own} {members:?}"
            );
        }
    }

    #[test]
    fn a_build_refuses_a_cluster_version_it_does_not_support_naming_both() {
        assert!(check_supported(at(V01, None), "the snapshot").is_ok());
        assert!(check_supported(at(V02, None), "the snapshot").is_ok());
        let refused = check_supported(at(V03, None), "the log entry at index 7").unwrap_err();
        let text = refused.to_string();
        assert!(
            text.contains("the log entry at index 7 sets the cluster version to 0.3"),
            "{text}"
        );
        assert!(
            text.contains("supports cluster versions 0.1 to 0.2"),
            "{text}"
        );
        assert_eq!(refused.exit_code(), crate::fatal::exit::DATA_DIR_REFUSED);
    }

    #[test]
    fn a_command_needing_a_version_of_every_build_names_each_member_short_of_it() {
        // (members' reports, needed, refusal names)
        type Reports = Vec<(NodeId, Option<ClusterVersion>)>;
        let table: [(Reports, ClusterVersion, Option<&str>); 4] = [
            (vec![(2, Some(V02)), (3, Some(V03))], V02, None),
            (
                vec![(2, Some(V02)), (3, Some(V01))],
                V02,
                Some("node 3 runs a build that supports up to 0.1"),
            ),
            (
                vec![(2, None), (3, Some(V02))],
                V02,
                Some("node 2 has not answered within 3 s"),
            ),
            (vec![(4, Some(V01))], V01, None),
        ];
        for (members, needed, names) in table {
            let got = unsupported_by(&members, needed);
            match names {
                None => assert_eq!(got, None, "{members:?}"),
                Some(words) => assert!(
                    got.as_deref().is_some_and(|g| g.contains(words)),
                    "{members:?}: {got:?}"
                ),
            }
        }
    }
}
