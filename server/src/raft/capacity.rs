//! The space quota and its alarm on a running node (the replicated rules are
//! [`cairn_fsm::capacity`]'s; the operator's view is `docs/operations.md`, "Capacity").
//!
//! - Every Raft message and reply carries the sender's configured `data_bytes_max`
//!   (`RaftMessage.data_bytes_max`). The leader sets the cluster's quota, through the log,
//!   to the lowest that it and its members report ([`quota_target`], a pure decision).
//! - The leader checks every write against the quotas before it proposes it
//!   ([`cairn_fsm::Store::check_capacity`]); a write the space quota refuses there raises
//!   `NOSPACE` through the log ([`raise_alarm`]), once. Apply checks again on every
//!   replica, with the exact size.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_fsm::{Applied, CapacityAction, Command, Feature, SpaceState};
use cairn_proto::error::ApiError;

use super::cluster_version::REPORT_FRESH;
use super::types::NodeId;

/// How often the leader considers changing the quota.
pub const QUOTA_INTERVAL: Duration = Duration::from_secs(1);

/// The quota the leader sets, if it should change it: the lowest `data_bytes_max` that it
/// (`own`) and its members report (`Some(0)`: a member that reports none, a build of 0.1.0,
/// which does not count; `None`: a member not heard from within [`REPORT_FRESH`]). While a
/// member is silent the quota may only go down (or be set for the first time): a silent
/// member may have asked for less.
pub fn quota_target(current: u64, own: u64, members: &[(NodeId, Option<u64>)]) -> Option<u64> {
    let mut lowest = own;
    let mut all_heard = true;
    for (_, reported) in members {
        match reported {
            Some(0) => {}
            Some(bytes) => lowest = lowest.min(*bytes),
            None => all_heard = false,
        }
    }
    let allowed = all_heard || current == 0 || lowest < current;
    (allowed && lowest != current).then_some(lowest)
}

/// The alarms of `space`, as `cairn alarm list` and `cairn status` show them.
pub fn alarms(space: SpaceState, usage_bytes: u64) -> Vec<cairn_proto::v1::Alarm> {
    space
        .alarm_index
        .map(|raised_index| cairn_proto::v1::Alarm {
            name: "NOSPACE".into(),
            raised_index,
            reason: format!(
                "the space quota refused a write: {usage_bytes} of {} bytes are used; writes \
                 that grow the data are refused until usage is at or below {} bytes (delete \
                 resources) or the alarm is disarmed",
                space.quota_bytes,
                space.low_water_bytes()
            ),
            members: Vec::new(),
        })
        .into_iter()
        .collect()
}

/// On the leader, every [`QUOTA_INTERVAL`]: sets the cluster's quota when
/// [`quota_target`] says so. Runs for the life of the node (a task of the agent).
pub async fn keep_quota(raft: super::RaftHandle) {
    let mut tick = tokio::time::interval(QUOTA_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // A new leader first applies what its log holds: the quota it would compare with
        // may be in it.
        if raft
            .store
            .cluster_version()
            .require(Feature::Capacity)
            .is_err()
            || !raft.leads_with_current_state().await
        {
            continue;
        }
        let status = raft.status();
        let members: Vec<(NodeId, Option<u64>)> = status
            .voters
            .keys()
            .chain(status.learners.keys())
            .filter(|id| **id != raft.node_id)
            .map(|id| {
                (
                    *id,
                    raft.contacts.data_bytes_max_recently(*id, REPORT_FRESH),
                )
            })
            .collect();
        let current = raft.store.space().quota_bytes;
        let own = raft.contacts.own_data_bytes_max();
        let Some(target) = quota_target(current, own, &members) else {
            continue;
        };
        match propose(&raft, CapacityAction::SetQuota(target)).await {
            Ok((index, _)) => tracing::info!(
                from_bytes = current,
                to_bytes = target,
                index,
                "set the cluster's space quota: the lowest data_bytes_max its members ask for"
            ),
            Err(e) => tracing::debug!(error = %e, "setting the space quota failed; trying again"),
        }
    }
}

/// Proposes a capacity change; returns its index and the space state after it.
pub async fn propose(
    raft: &super::RaftHandle,
    action: CapacityAction,
) -> Result<(u64, SpaceState), ApiError> {
    match raft.propose(Command::Capacity { action }).await? {
        (index, Applied::Capacity(space)) => Ok((index, space)),
        (index, other) => Err(ApiError::Internal(format!(
            "a capacity change at index {index} applied as {other:?}"
        ))),
    }
}

/// Raises `NOSPACE` through the log, in the background, unless a raise is already on its
/// way (`raising`): called by the leader when the space quota refused a write before it
/// was proposed.
pub fn raise_alarm(raft: &super::RaftHandle, raising: Arc<AtomicBool>) {
    if raising.swap(true, Ordering::AcqRel) {
        return;
    }
    let raft = raft.clone();
    tokio::spawn(async move {
        match propose(&raft, CapacityAction::RaiseAlarm).await {
            Ok((index, space)) if space.alarm_index.is_some() => tracing::warn!(
                index,
                quota_bytes = space.quota_bytes,
                usage_bytes = raft.store.view().usage().bytes,
                "NOSPACE alarm raised: the space quota refuses writes that grow the data"
            ),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "raising the NOSPACE alarm failed"),
        }
        raising.store(false, Ordering::Release);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quota_is_the_lowest_reported_and_goes_up_only_when_every_member_answered() {
        // (current, own, members) -> target
        let table: &[(u64, u64, &[Option<u64>], Option<u64>)] = &[
            (0, 100, &[Some(80), Some(90)], Some(80)),
            (80, 100, &[Some(80), Some(90)], None),
            // A member of 0.1.0 reports nothing: it does not count.
            (0, 100, &[Some(0), Some(90)], Some(90)),
            // A silent member holds a raise back, not a lowering nor a first setting.
            (80, 100, &[None, Some(90)], None),
            (80, 100, &[None, Some(70)], Some(70)),
            (0, 100, &[None, Some(90)], Some(90)),
            // Every member asks for more: the quota goes up.
            (80, 100, &[Some(120), Some(110)], Some(100)),
            // A single node.
            (0, 100, &[], Some(100)),
        ];
        for (current, own, reports, expected) in table {
            let members: Vec<(NodeId, Option<u64>)> = reports
                .iter()
                .enumerate()
                .map(|(i, r)| (i as u64 + 2, *r))
                .collect();
            assert_eq!(
                quota_target(*current, *own, &members),
                *expected,
                "current {current}, own {own}, members {reports:?}"
            );
        }
    }
}
