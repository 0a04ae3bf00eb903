//! The collection of what a removed owner owned (`cairn_fsm::lifecycle`): on the leader,
//! a loop proposes [`Command::Collect`] for the owners the replicated table says need it,
//! each entry deleting, marking or orphaning at most
//! [`cairn_fsm::lifecycle::COLLECT_BATCH_MAX`] dependents, until none is left; then it
//! waits for the next tick. Every decision is the fsm's, at apply: a step proposed twice,
//! or by a deposed leader, changes nothing more than one would.

use std::time::Duration;

use cairn_fsm::{Command, Feature};

/// How often a node with nothing to collect looks again.
pub const COLLECT_TICK: Duration = Duration::from_millis(100);
/// The most owners one pass proposes a step for before it looks at the table again.
const OWNERS_PER_PASS_MAX: usize = 16;

/// Runs for the life of the node: on the leader (holding everything committed), at cluster
/// version 0.2 or later, proposes collection steps while there is anything to collect.
pub async fn collect_dependents(raft: super::RaftHandle) {
    let mut tick = tokio::time::interval(COLLECT_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if raft
            .store
            .cluster_version()
            .require(Feature::Lifecycle)
            .is_err()
        {
            continue;
        }
        // Cheap when there is nothing to do: one look at two derived indexes.
        while !raft.store.view().collect_candidates(1).is_empty() {
            if !raft.leads_with_current_state().await {
                break;
            }
            let owners = raft.store.view().collect_candidates(OWNERS_PER_PASS_MAX);
            let mut progressed = false;
            for owner in owners {
                let now_ms = cairn_forwarding::wall_clock_ms();
                match raft.propose(Command::Collect { owner, now_ms }).await {
                    Ok((index, applied)) => {
                        progressed = true;
                        tracing::debug!(index, ?applied, "collected dependents");
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "proposing a collection failed; trying again");
                        break;
                    }
                }
            }
            if !progressed {
                break;
            }
        }
    }
}
