//! The faults of the election scenario ([`crate::election`]): what can take an election from
//! its holder, or tempt a cluster to end a lease early.
//!
//! [`NemesisKind::Fencing`](super::NemesisKind::Fencing) runs [`VARIANTS`] in turn, from a
//! seeded first one:
//! - **isolate the holder's node**: the node the current holder talks to (its *home*: the
//!   holder reaches the cluster through it alone, as a process on that machine would) is cut
//!   off for 2–3.5 s: its keep-alives stop reaching the leader, its lease expires, another
//!   candidate wins, and its writes after the heal must be refused;
//! - **SIGSTOP** of the holder's node or of the leader for longer than the TTL (TTL + 0.5–2 s);
//! - **the leader's wall clock jumps** by minutes, forward or back (libfaketime's clock file,
//!   [`crate::cluster::Cluster::set_clock`]), for 2–4 s: leases run on the monotonic clock,
//!   so nothing may change (with `--unsafe-lease-wall-clock`, a forward jump expires every
//!   lease at once);
//! - **kill -9** of the leader or of the holder's node, or (one round in four) of a majority,
//!   restarted after 1.5–3 s;
//! - **isolate the leader** for 2–3.5 s;
//! - **a leader transfer** to another voter.
//!
//! A quorum is left in every round but the majority kills, so that expiry can happen.
//! [`NemesisKind::LeaderClock`](super::NemesisKind::LeaderClock) (the broken-node proof of
//! `--unsafe-lease-wall-clock`) runs the clock jump alone, every round.
//!
//! Every round records a [`FaultWindow`] on the history's clock, with what it may do to a
//! lease's expiry ([`FaultEffect`]): check 3 of [`crate::election::check`] extends its
//! deadline by it.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::seq::IndexedRandom as _;
use rand::seq::SliceRandom as _;
use rand::Rng;

use super::{leader_or_random, millis, NemesisContext};
use crate::election::check::{FaultEffect, FaultWindow};
use crate::history::Recorder;
use crate::net::shapes;

/// The rounds of the fencing nemesis, in the order they come.
pub const VARIANTS: [Variant; 6] = [
    Variant::IsolateHolder,
    Variant::Pause,
    Variant::LeaderClock,
    Variant::Kill,
    Variant::IsolateLeader,
    Variant::Transfer,
];

/// One kind of round of [`VARIANTS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    IsolateHolder,
    Pause,
    LeaderClock,
    Kill,
    IsolateLeader,
    Transfer,
}

/// The wall-clock jumps of the leader: minutes forward or back.
pub const CLOCK_JUMPS: [&str; 5] = ["+300s", "-300s", "+120s", "-120s", "+600s"];

/// What the nemesis shares with the election workload.
#[derive(Clone)]
pub struct ElectionLink {
    /// The node id the current holder talks to, while someone holds the election.
    pub holder: Arc<Mutex<Option<u64>>>,
    /// The history's recorder: its clock stamps the fault windows.
    pub recorder: Recorder,
    /// Every fault so far.
    pub faults: Arc<Mutex<Vec<FaultWindow>>>,
    /// The candidates' lease TTL: a pause lasts longer.
    pub ttl: Duration,
    /// Index into [`VARIANTS`] of the first round (seeded).
    pub first_variant: usize,
}

impl ElectionLink {
    fn record(&self, what: String, from_ns: u64, effect: FaultEffect) {
        let to_ns = self.recorder.now_ns();
        self.faults.lock().push(FaultWindow {
            what,
            from_ns,
            to_ns,
            effect,
        });
    }

    /// The holder's node, or a random one when nobody holds the election.
    fn holder_or_random(&self, cx: &mut NemesisContext<'_>) -> u64 {
        let holder = *self.holder.lock();
        holder.unwrap_or_else(|| *cx.cluster.ids().choose(&mut cx.rng).expect("nodes"))
    }
}

fn link(cx: &NemesisContext<'_>) -> Result<ElectionLink, String> {
    cx.election
        .clone()
        .ok_or_else(|| "the fencing nemesis needs the election workload".to_owned())
}

/// Round `round` (from 1) of [`super::NemesisKind::Fencing`].
pub async fn round(cx: &mut NemesisContext<'_>, round: usize) -> Result<(), String> {
    let link = link(cx)?;
    let variant = VARIANTS[(link.first_variant + round - 1) % VARIANTS.len()];
    match variant {
        Variant::IsolateHolder => {
            let target = link.holder_or_random(cx);
            isolate(cx, &link, target, "the holder's node").await
        }
        Variant::IsolateLeader => {
            let target = leader_or_random(cx).await;
            isolate(cx, &link, target, "the leader").await
        }
        Variant::Pause => {
            let (target, what) = if cx.rng.random_bool(0.5) {
                (link.holder_or_random(cx), "the holder's node")
            } else {
                (leader_or_random(cx).await, "the leader")
            };
            let hold = link.ttl + millis(&mut cx.rng, (500, 2000));
            let from_ns = link.recorder.now_ns();
            cx.cluster.pause(target);
            cx.paused.insert(target);
            cx.log.faults += 1;
            cx.log.note(format!("SIGSTOP {what} {target} for {hold:?}"));
            tokio::time::sleep(hold).await;
            cx.cluster.resume(target);
            cx.paused.remove(&target);
            cx.log.note(format!("SIGCONT node {target}"));
            link.record(
                format!("SIGSTOP {what} {target}"),
                from_ns,
                FaultEffect::LeaderChange,
            );
            Ok(())
        }
        Variant::LeaderClock => leader_clock_round(cx).await,
        Variant::Kill => {
            let variant = cx.rng.random_range(0..4);
            let (targets, what) = match variant {
                0 => {
                    let mut ids = cx.cluster.ids();
                    ids.shuffle(&mut cx.rng);
                    ids.truncate(ids.len() / 2 + 1);
                    (ids, "a majority")
                }
                1 => (vec![link.holder_or_random(cx)], "the holder's node"),
                _ => (vec![leader_or_random(cx).await], "the leader"),
            };
            let from_ns = link.recorder.now_ns();
            for id in &targets {
                cx.cluster.kill(*id);
            }
            cx.log.faults += 1;
            cx.log.note(format!("kill -9 {what}: {targets:?}"));
            tokio::time::sleep(millis(&mut cx.rng, (1500, 3000))).await;
            for id in &targets {
                cx.cluster.spawn(*id);
            }
            cx.log.note(format!("restarted {targets:?}"));
            link.record(
                format!("kill -9 {what} {targets:?}"),
                from_ns,
                FaultEffect::Restart,
            );
            Ok(())
        }
        Variant::Transfer => {
            let leader = cx.cluster.leader().await;
            let others: Vec<u64> = cx
                .cluster
                .ids()
                .into_iter()
                .filter(|id| Some(*id) != leader)
                .collect();
            let to = *others.choose(&mut cx.rng).unwrap_or(&0);
            let from_ns = link.recorder.now_ns();
            match cx.cluster.transfer_leader(to, Duration::from_secs(5)).await {
                Ok(from) => {
                    cx.log.faults += 1;
                    cx.log.note(format!("TransferLeader from {from} to {to}"));
                }
                Err(e) => cx.log.note(format!("TransferLeader to {to} failed: {e}")),
            }
            // The new leader takes over within an election timeout or so.
            tokio::time::sleep(millis(&mut cx.rng, (500, 1500))).await;
            link.record(
                format!("TransferLeader to {to}"),
                from_ns,
                FaultEffect::LeaderChange,
            );
            Ok(())
        }
    }
}

/// Cuts `target` off from the other nodes for 2–3.5 s (the runner still reaches it).
async fn isolate(
    cx: &mut NemesisContext<'_>,
    link: &ElectionLink,
    target: u64,
    what: &str,
) -> Result<(), String> {
    let lab = cx
        .lab
        .clone()
        .ok_or("the fencing nemesis needs a network lab")?;
    let ids = cx.cluster.ids();
    let from_ns = link.recorder.now_ns();
    lab.partition(&shapes::isolate(target, &ids))?;
    cx.log.faults += 1;
    let hold = millis(&mut cx.rng, (2000, 3500));
    cx.log
        .note(format!("partition: isolated {what} {target} for {hold:?}"));
    tokio::time::sleep(hold).await;
    lab.heal()?;
    cx.log.note("healed the network");
    link.record(
        format!("isolated {what} {target}"),
        from_ns,
        FaultEffect::LeaderChange,
    );
    Ok(())
}

/// The leader's wall clock jumps by minutes ([`CLOCK_JUMPS`]) for 2–4 s, then back to the
/// real time (a jump the other way). The round of [`super::NemesisKind::LeaderClock`].
pub async fn leader_clock_round(cx: &mut NemesisContext<'_>) -> Result<(), String> {
    let link = link(cx)?;
    if !cx.cluster.live_clocks() {
        return Err("the leader's clock jumps need nodes with clock files (live_clocks)".into());
    }
    let leader = leader_or_random(cx).await;
    let jump = *CLOCK_JUMPS.choose(&mut cx.rng).expect("jumps");
    let from_ns = link.recorder.now_ns();
    cx.cluster.set_clock(leader, jump);
    cx.log.faults += 1;
    let hold = millis(&mut cx.rng, (2000, 4000));
    cx.log.note(format!(
        "wall clock of the leader {leader} jumped {jump} for {hold:?} (read within a second)"
    ));
    tokio::time::sleep(hold).await;
    cx.cluster.set_clock(leader, "+0");
    cx.log
        .note(format!("wall clock of {leader} back to real time"));
    // The clock file is read at most a second later: the window ends then.
    tokio::time::sleep(Duration::from_secs(1)).await;
    link.record(
        format!("wall clock of the leader {leader} {jump}"),
        from_ns,
        FaultEffect::NoDelay,
    );
    Ok(())
}
