//! The kill loops ([`super::NemesisKind::KillLoop`], [`super::NemesisKind::OomKillLoop`]):
//! a node killed every few seconds under a workload of large entries, at the moments that
//! matter, and every restart required to succeed and catch up.
//!
//! Why: in issue 29 the kernel OOM-killed a leader of a cluster written with 512 KiB
//! resources, and the restarted node never started again. The old leader's unreplicated
//! entries were overwritten by the new leader, and that truncation, behind a partly evicted
//! in-memory tail of the WAL, shifted the tail against the log (fixed in c793fa1). It takes
//! entries large enough that the log's 32 MiB in-memory tail holds only part of the log, a
//! leader killed while it holds unreplicated entries, and its restart: this loop does that
//! over and over, with snapshots every ~100 entries, so that snapshots are written, sent and
//! installed, and log segments rotate and are purged, all the while.
//!
//! A round (seeded):
//! - the *victim*: the leader about half the time (only a killed leader leaves unreplicated
//!   entries for a truncation), else a random node;
//! - the *moment*: the victim's data dir is polled every [`POLL`] for up to
//!   [`MOMENT_WAIT`] until the wanted moment shows — a `*.tmp` file in `snapshots/` (a
//!   snapshot being written), a new file in `raft-log/segments/` (the log just rotated), a
//!   segment file gone (the log just purged), or whichever of them comes first; if none
//!   shows, a random moment (the log says which moment each kill hit);
//! - the kill: `kill -9` by the harness ([`Killer::Signal`]), or by the kernel
//!   ([`Killer::Kernel`]): the victim's cgroup limit is lowered to its anonymous memory plus
//!   0.5–3 MiB, so that its next allocation burst (a batch of entries, a snapshot, an
//!   install) exceeds it, and the harness waits for the OOM killer's `SIGKILL` (counted by
//!   the cgroup's `oom_kill`), then raises the limit again, as an operator would before
//!   restarting it. A kernel that does not kill within [`KERNEL_KILL_WAIT`] is helped by a
//!   `kill -9`, counted apart;
//! - down for 0.2–1.5 s, then restarted: the node must stay up and apply the leader's
//!   commit index (read after the restart) within [`CATCH_UP_WAIT`]. A killed leader stays
//!   down until another node leads (at most [`NEW_LEADER_WAIT`]): back sooner, it could be
//!   elected again with its longer log and replicate its unreplicated entries instead of
//!   having them overwritten. (Measured on 2026-11-28 with main's de3d42b and openraft's
//!   debug log of truncations: 12 of 51 leader kills were followed by a truncation of the
//!   restarted node's log with this wait, 19 of 123 without it.)
//!
//! Every [`INSTALL_ROUND_EVERY`]th round is an *install round*: a follower is taken down
//! and kept down until the leader has purged its log past the follower's last entry (so the
//! leader must send it a snapshot), then restarted, and killed again as soon as
//! `snapshots/incoming.part` shows (a snapshot from the leader being received or installed):
//! at once (chunks arriving), once the file has kept its size for [`INCOMING_STILL`] (every
//! chunk received, the install running), or 1–300 ms later (or just after the file is
//! renamed into place), a third of the time each. This probes openraft 0.9 purging the log through the snapshot's index as soon as
//! it hands the snapshot to the state machine: a node killed in between could be left with
//! a log purged past every snapshot file, and refuse to start.
//!
//! Before each round, and while waiting, every node must be running: a node that exited by
//! itself (a `FATAL` stop exits 10–15) fails the scenario with its exit status and the end
//! of its log. At the end ([`finish`]) the counts are noted in the nemesis log; the oom loop
//! must have seen at least [`KERNEL_KILLS_MIN`] kills by the kernel.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant};

use rand::seq::IndexedRandom as _;
use rand::Rng as _;

use super::{millis, NemesisContext};
use crate::cluster::Cluster;

/// Padding of each set element ([`crate::workload::WorkloadOptions::payload_bytes`]): each
/// add is a Raft entry of about this size, so the WAL's 32 MiB in-memory tail holds about 128
/// of them, fewer than the log keeps (256 entries behind each snapshot, plus those since).
pub const PAYLOAD_BYTES: usize = 256 * 1024;
/// Acknowledged elements each workload process keeps padded: with [`PROCESSES`] processes
/// the state, hence every snapshot, holds about 6 MiB of padding.
pub const PADDED_ELEMENTS_MAX: usize = 6;
/// Workload processes of a kill-loop scenario (3 nodes; 6 on 5 nodes).
pub const PROCESSES: usize = 4;
/// `--snapshot-log-entries`: a snapshot every 100 entries, the smallest the node accepts.
pub const SNAPSHOT_LOG_ENTRIES: u64 = 100;
/// `--snapshot-log-bytes`: the smallest the node accepts (1 MiB); the size budget is then
/// the last snapshot's size.
pub const SNAPSHOT_LOG_BYTES: u64 = 1024 * 1024;
/// `--history-changes-max`: the history keeps whole resources, and the default 10,000
/// changes of 256 KiB would hold 2.5 GiB in every node.
pub const HISTORY_CHANGES_MAX: usize = 256;
/// The memory limit of every node's cgroup in the oom loop, outside the moments it is
/// lowered (a node of this workload holds about 200 MiB).
pub const MEMORY_LIMIT_BYTES: u64 = 1024 * 1024 * 1024;

/// How often the victim's data dir is looked at while waiting for a moment.
pub const POLL: Duration = Duration::from_millis(2);
/// How long a round waits for its moment before it kills at a random one.
pub const MOMENT_WAIT: Duration = Duration::from_secs(3);
/// How long a killed leader stays down, at most, waiting for another node to lead.
pub const NEW_LEADER_WAIT: Duration = Duration::from_secs(10);
/// How long `incoming.part` must keep its size before an install round takes the receive
/// for done (chunks of 4 MiB arrive a few ms apart on one machine).
pub const INCOMING_STILL: Duration = Duration::from_millis(20);
/// How long an install round waits for `incoming.part` after the restart.
pub const INSTALL_WAIT: Duration = Duration::from_secs(10);
/// How long an install round keeps its follower down, at most, waiting for the leader to
/// purge past it.
pub const PURGE_WAIT: Duration = Duration::from_secs(30);
/// How long the kernel is given to kill once the limit is lowered.
pub const KERNEL_KILL_WAIT: Duration = Duration::from_secs(10);
/// How long a restarted node has to apply the leader's commit index.
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(40);
/// Every this many rounds, an install round.
pub const INSTALL_ROUND_EVERY: usize = 4;
/// Kills by the kernel an oom loop must have seen to count.
pub const KERNEL_KILLS_MIN: usize = 2;

/// Who kills the victim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Killer {
    /// The harness: `kill -9`.
    Signal,
    /// The kernel's OOM killer, in the victim's memory cgroup.
    Kernel,
}

impl Killer {
    /// What happened at the moment: the kill itself, or the lowering of the limit.
    fn acted(self) -> &'static str {
        match self {
            Killer::Signal => "killed",
            Killer::Kernel => "limit lowered",
        }
    }
}

/// A moment that matters, seen in the victim's data dir.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Moment {
    /// A `*.tmp` file in `snapshots/`: a snapshot being written.
    SnapshotWrite,
    /// `snapshots/incoming.part`: a snapshot from the leader being received or installed.
    Install,
    /// A file in `raft-log/segments/` that was not there: the log rotated to a new segment.
    Rotation,
    /// A segment file gone: the log purged.
    Purge,
    /// A follower the leader has purged its log past, restarted and recovered (it answers
    /// Status): a snapshot to receive and install next (the oom loop's install rounds).
    InstallDue,
    /// None of the wanted moments within the wait: a random moment.
    Random,
}

impl Moment {
    pub fn name(self) -> &'static str {
        match self {
            Moment::SnapshotWrite => "snapshot being written",
            Moment::Install => "snapshot install",
            Moment::Rotation => "segment rotation",
            Moment::Purge => "segment purge",
            Moment::InstallDue => "recovered, a snapshot install due",
            Moment::Random => "random moment",
        }
    }
}

/// What the kill loops count over their rounds.
#[derive(Debug, Default)]
pub struct KillLoopRounds {
    /// Kills, by the moment they hit.
    pub kills_by_moment: BTreeMap<Moment, usize>,
    /// Kills of the node that was leader at the start of the round.
    pub leader_kills: usize,
    /// Kills by the kernel's OOM killer.
    pub kernel_kills: usize,
    /// `kill -9`s (the kill loop's, or the oom loop's when the kernel did not kill in time).
    pub signal_kills: usize,
    /// Restarts that stayed up and caught up.
    pub restarts: usize,
    /// Install rounds whose restarted follower showed `incoming.part` (kill loop), or died
    /// with it present (oom loop).
    pub installs_seen: usize,
    /// Kernel kills with a snapshot `.tmp` or `incoming.part` present at the death.
    pub kernel_kills_during_snapshot_io: usize,
    pub install_rounds: usize,
}

/// What the victim's data dir shows at one look.
struct DirView {
    snapshot_tmp: bool,
    incoming: bool,
    segments: BTreeSet<OsString>,
}

fn look(data_dir: &Path) -> DirView {
    let mut view = DirView {
        snapshot_tmp: false,
        incoming: false,
        segments: BTreeSet::new(),
    };
    if let Ok(entries) = std::fs::read_dir(data_dir.join("snapshots")) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            view.snapshot_tmp |= name.ends_with(".tmp");
            view.incoming |= name == "incoming.part";
        }
    }
    if let Ok(entries) = std::fs::read_dir(data_dir.join("raft-log").join("segments")) {
        view.segments = entries.flatten().map(|e| e.file_name()).collect();
    }
    view
}

/// The first of `wanted` that `now` shows, against the segments of `before`.
fn moment_shown(before: &DirView, now: &DirView, wanted: &[Moment]) -> Option<Moment> {
    wanted.iter().copied().find(|moment| match moment {
        Moment::SnapshotWrite => now.snapshot_tmp,
        Moment::Install => now.incoming,
        Moment::Rotation => now.segments.difference(&before.segments).next().is_some(),
        Moment::Purge => before.segments.difference(&now.segments).next().is_some(),
        Moment::InstallDue | Moment::Random => false,
    })
}

/// What the victim's dir shows right now, in words (for kills whose exact moment the
/// kernel chose).
fn visible_now(data_dir: &Path) -> &'static str {
    let view = look(data_dir);
    match (view.snapshot_tmp, view.incoming) {
        (_, true) => INCOMING_PRESENT,
        (true, false) => "a snapshot .tmp present",
        (false, false) => NO_SNAPSHOT_IO,
    }
}

const INCOMING_PRESENT: &str = "incoming.part present";
const NO_SNAPSHOT_IO: &str = "no snapshot file being written";

/// Polls node `id`'s data dir until one of `wanted` shows, `bound` passes, or the node
/// exits by itself (then an error with its log).
async fn wait_for_moment(
    cluster: &mut Cluster,
    id: u64,
    wanted: &[Moment],
    bound: Duration,
) -> Result<Moment, String> {
    let data_dir = cluster.node(id).data_dir.clone();
    let before = look(&data_dir);
    let deadline = Instant::now() + bound;
    let mut next_liveness_check = Instant::now();
    loop {
        if let Some(moment) = moment_shown(&before, &look(&data_dir), wanted) {
            return Ok(moment);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(Moment::Random);
        }
        if now >= next_liveness_check {
            if let Some(status) = cluster.exited(id) {
                return Err(cluster.exit_report(id, status));
            }
            next_liveness_check = now + Duration::from_millis(50);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// How the victim went down.
struct Kill {
    /// Words for the log: "kill -9", "OOM-killed by the kernel 230 ms after ...".
    how: String,
}

/// Kills `victim` with `killer` (see the module docs), counted as a fault at `moment`; its
/// process is gone when this returns `Ok`.
async fn take_down(
    cx: &mut NemesisContext<'_>,
    victim: u64,
    killer: Killer,
    moment: Moment,
) -> Result<Kill, String> {
    if let Some(status) = cx.cluster.exited(victim) {
        return Err(cx.cluster.exit_report(victim, status));
    }
    *cx.kill_loop.kills_by_moment.entry(moment).or_default() += 1;
    cx.log.faults += 1;
    match killer {
        Killer::Signal => {
            cx.cluster.kill(victim);
            cx.kill_loop.signal_kills += 1;
            Ok(Kill {
                how: "kill -9".into(),
            })
        }
        Killer::Kernel => kernel_kill(cx, victim).await,
    }
}

/// Lowers `victim`'s memory limit to its anonymous memory plus 0.5–3 MiB (again every 2.5 s,
/// as its heap changes) until the kernel OOM-kills it; `kill -9` after
/// [`KERNEL_KILL_WAIT`]. The limit is raised again once it is dead.
async fn kernel_kill(cx: &mut NemesisContext<'_>, victim: u64) -> Result<Kill, String> {
    let cgroup_error = |e: String| format!("node {victim}'s memory cgroup: {e}");
    let data_dir = cx.cluster.node(victim).data_dir.clone();
    let oom_kills_before = {
        let cgroup = cx
            .cluster
            .memory_cgroup(victim)
            .ok_or_else(|| format!("node {victim} runs in no memory cgroup"))?;
        cgroup.oom_kills().map_err(cgroup_error)?
    };
    let started = Instant::now();
    let deadline = started + KERNEL_KILL_WAIT;
    let mut next_lowering = started;
    let mut lowered_to = 0u64;
    let mut anonymous = 0u64;
    let outcome = loop {
        let now = Instant::now();
        if let Some(status) = cx.cluster.exited(victim) {
            break Some(status);
        }
        if now >= deadline {
            break None;
        }
        if now >= next_lowering {
            let margin = cx.rng.random_range(512..=3072u64) * 1024;
            let cgroup = cx.cluster.memory_cgroup(victim).expect("checked above");
            anonymous = cgroup.anonymous_bytes().map_err(cgroup_error)?;
            lowered_to = anonymous + margin;
            // v1 refuses a limit it cannot reclaim down to (EBUSY): the next try is higher.
            let _ = cgroup.set_limit(lowered_to);
            next_lowering = now + Duration::from_millis(2500);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let at_death = visible_now(&data_dir);
    let waited = started.elapsed();
    let oom_kills_after = cx
        .cluster
        .memory_cgroup(victim)
        .expect("checked above")
        .oom_kills()
        .map_err(cgroup_error)?;
    let mib = |bytes: u64| bytes / (1024 * 1024);
    let how = match outcome {
        Some(status) => {
            use std::os::unix::process::ExitStatusExt as _;
            raise_limit(cx, victim)?;
            if status.signal() != Some(libc::SIGKILL) || oom_kills_after <= oom_kills_before {
                // Died otherwise than by the OOM killer while its limit was low.
                return Err(format!(
                    "{} (its memory limit had been lowered to {} MiB {} ms before; the \
                     cgroup counts {} OOM kills, {} before)",
                    cx.cluster.exit_report(victim, status),
                    mib(lowered_to),
                    waited.as_millis(),
                    oom_kills_after,
                    oom_kills_before
                ));
            }
            cx.kill_loop.kernel_kills += 1;
            if at_death != NO_SNAPSHOT_IO {
                cx.kill_loop.kernel_kills_during_snapshot_io += 1;
            }
            if at_death == INCOMING_PRESENT {
                cx.kill_loop.installs_seen += 1;
            }
            format!(
                "OOM-killed by the kernel {} ms after its limit was lowered to {} MiB (heap {} \
                 MiB; {at_death})",
                waited.as_millis(),
                mib(lowered_to),
                mib(anonymous)
            )
        }
        None => {
            cx.cluster.kill(victim);
            raise_limit(cx, victim)?;
            cx.kill_loop.signal_kills += 1;
            format!(
                "kill -9 (the kernel had not killed it {} s after its limit was lowered to {} \
                 MiB, heap {} MiB; {at_death})",
                KERNEL_KILL_WAIT.as_secs(),
                mib(lowered_to),
                mib(anonymous)
            )
        }
    };
    // Reap it: the process is gone, the harness forgets it.
    cx.cluster.kill(victim);
    Ok(Kill { how })
}

/// Raises the victim's limit again, once it is dead.
fn raise_limit(cx: &mut NemesisContext<'_>, victim: u64) -> Result<(), String> {
    if let Some(cgroup) = cx.cluster.memory_cgroup(victim) {
        cgroup
            .set_limit(MEMORY_LIMIT_BYTES)
            .map_err(|e| format!("node {victim}'s memory cgroup: {e}"))?;
    }
    Ok(())
}

/// Waits until the (re)started `victim` has applied the leader's commit index (read once
/// the victim runs); fails if it, or any other node, exits meanwhile, or if it has not
/// caught up within [`CATCH_UP_WAIT`]. Returns (the index it reached, how long it took).
async fn catch_up(cx: &mut NemesisContext<'_>, victim: u64) -> Result<(u64, Duration), String> {
    let caught_up = cx.cluster.wait_caught_up(victim, CATCH_UP_WAIT).await?;
    cx.kill_loop.restarts += 1;
    Ok(caught_up)
}

/// One round of a kill loop (see the module docs); `round` counts from 1.
pub async fn round(
    cx: &mut NemesisContext<'_>,
    killer: Killer,
    round: usize,
) -> Result<(), String> {
    cx.cluster.check_all_running()?;
    if round.is_multiple_of(INSTALL_ROUND_EVERY) {
        return install_round(cx, killer, round).await;
    }
    let leader = cx.cluster.leader().await;
    let victim = match leader {
        Some(leader) if cx.rng.random_bool(0.5) => leader,
        _ => *cx.cluster.ids().choose(&mut cx.rng).expect("nodes"),
    };
    const WANTED: [&[Moment]; 4] = [
        &[Moment::SnapshotWrite],
        &[Moment::Rotation],
        &[Moment::Purge],
        &[Moment::SnapshotWrite, Moment::Rotation, Moment::Purge],
    ];
    let wanted = *WANTED.choose(&mut cx.rng).expect("moments");
    let moment = wait_for_moment(cx.cluster, victim, wanted, MOMENT_WAIT).await?;
    let kill = take_down(cx, victim, killer, moment).await?;
    let role = if Some(victim) == leader {
        cx.kill_loop.leader_kills += 1;
        "the leader"
    } else {
        "not the leader"
    };
    let wanted_names: Vec<&str> = wanted.iter().map(|m| m.name()).collect();
    cx.log.note(format!(
        "round {round}: node {victim} ({role}) {}; {} at: {} (waited for: {})",
        kill.how,
        killer.acted(),
        moment.name(),
        wanted_names.join(" or ")
    ));
    if Some(victim) == leader {
        match wait_new_leader(cx, victim).await? {
            Some(new_leader) => cx.log.note(format!(
                "round {round}: node {new_leader} leads; restarting node {victim}"
            )),
            None => cx.log.note(format!(
                "round {round}: no other node leads within {NEW_LEADER_WAIT:?}; restarting node \
                 {victim}"
            )),
        }
    }
    tokio::time::sleep(millis(&mut cx.rng, (200, 1500))).await;
    cx.cluster.spawn(victim);
    let (applied, took) = catch_up(cx, victim).await?;
    cx.log.note(format!(
        "round {round}: node {victim} restarted and caught up (applied {applied}) in {:.1} s",
        took.as_secs_f64()
    ));
    Ok(())
}

/// Waits until a node other than `victim` (a killed leader) leads; `None` after
/// [`NEW_LEADER_WAIT`]. Fails if a node exits by itself meanwhile.
async fn wait_new_leader(cx: &mut NemesisContext<'_>, victim: u64) -> Result<Option<u64>, String> {
    let deadline = Instant::now() + NEW_LEADER_WAIT;
    while Instant::now() < deadline {
        cx.cluster.check_all_running()?;
        if let Some(leader) = cx.cluster.leader().await.filter(|l| *l != victim) {
            return Ok(Some(leader));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(None)
}

/// An install round (see the module docs).
async fn install_round(
    cx: &mut NemesisContext<'_>,
    killer: Killer,
    round: usize,
) -> Result<(), String> {
    cx.kill_loop.install_rounds += 1;
    let Some(leader) = cx.cluster.leader().await else {
        cx.log
            .note(format!("round {round} (install): no leader, nothing done"));
        return Ok(());
    };
    let followers = cx.cluster.ids_except(leader);
    let victim = *followers.choose(&mut cx.rng).expect("a follower");
    let kill = take_down(cx, victim, killer, Moment::Random).await?;
    // The victim's log ends at or before the leader's (read once the victim is gone: the
    // kernel may take seconds to kill it).
    let last_log_index = match cx.cluster.leader().await {
        Some(leader) => cx
            .cluster
            .status(leader)
            .await
            .map_or(0, |s| s.last_log_index),
        None => 0,
    };
    cx.log.note(format!(
        "round {round} (install): node {victim} (a follower) {}; {} at: {}; kept down until \
         the leader purges past its last log index {last_log_index}",
        kill.how,
        killer.acted(),
        Moment::Random.name()
    ));
    let purged = wait_purged_past(cx, last_log_index).await?;
    match purged {
        Some((leader, purged)) => cx.log.note(format!(
            "round {round} (install): leader {leader} purged its log through {purged}"
        )),
        None => cx.log.note(format!(
            "round {round} (install): the leader did not purge past {last_log_index} within \
             {PURGE_WAIT:?}: restarting node {victim} anyway"
        )),
    }
    cx.cluster.spawn(victim);
    if killer == Killer::Kernel {
        // The kernel kills when the node next allocates more than a few MiB: lowered once the
        // restarted node has recovered (it answers Status), the limit is hit by the snapshot
        // it must receive and install (a copy of the whole state), if by nothing sooner.
        let deadline = Instant::now() + INSTALL_WAIT;
        while cx.cluster.status(victim).await.is_none() && Instant::now() < deadline {
            if let Some(status) = cx.cluster.exited(victim) {
                return Err(cx.cluster.exit_report(victim, status));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let kill = take_down(cx, victim, killer, Moment::InstallDue).await?;
        cx.log.note(format!(
            "round {round} (install): node {victim} {}; {} at: {}",
            kill.how,
            killer.acted(),
            Moment::InstallDue.name()
        ));
        tokio::time::sleep(millis(&mut cx.rng, (200, 1000))).await;
        cx.cluster.spawn(victim);
        let (applied, took) = catch_up(cx, victim).await?;
        cx.log.note(format!(
            "round {round} (install): node {victim} restarted and caught up (applied {applied}) \
             in {:.1} s",
            took.as_secs_f64()
        ));
        return Ok(());
    }
    let moment = wait_for_moment(cx.cluster, victim, &[Moment::Install], INSTALL_WAIT).await?;
    if moment != Moment::Install {
        cx.log.note(format!(
            "round {round} (install): node {victim} restarted, no incoming.part within \
             {INSTALL_WAIT:?}: no second kill"
        ));
    } else {
        cx.kill_loop.installs_seen += 1;
        let incoming = cx
            .cluster
            .node(victim)
            .data_dir
            .join("snapshots")
            .join("incoming.part");
        let shown = Instant::now();
        let when = match cx.rng.random_range(0..3) {
            // While the chunks arrive.
            0 => "incoming.part present, as it showed".to_string(),
            // Once the file has stopped growing: every chunk received, the install running
            // (openraft purges the log as it hands the snapshot over).
            1 => match wait_still(&incoming, INCOMING_STILL, INSTALL_WAIT).await {
                Some(bytes) => format!(
                    "incoming.part at {bytes} bytes for {} ms, {} ms after it showed",
                    INCOMING_STILL.as_millis(),
                    shown.elapsed().as_millis()
                ),
                None => "just after incoming.part was renamed into place".into(),
            },
            // A random moment of the receive and install.
            _ => {
                let until = Instant::now() + millis(&mut cx.rng, (1, 300));
                while Instant::now() < until && incoming.exists() {
                    tokio::time::sleep(POLL).await;
                }
                if incoming.exists() {
                    format!(
                        "incoming.part present, {} ms after it showed",
                        shown.elapsed().as_millis()
                    )
                } else {
                    "just after incoming.part was renamed into place".into()
                }
            }
        };
        let kill = take_down(cx, victim, killer, Moment::Install).await?;
        cx.log.note(format!(
            "round {round} (install): node {victim} {}; {} at: {} ({when})",
            kill.how,
            killer.acted(),
            Moment::Install.name()
        ));
        tokio::time::sleep(millis(&mut cx.rng, (200, 1000))).await;
        cx.cluster.spawn(victim);
    }
    let (applied, took) = catch_up(cx, victim).await?;
    cx.log.note(format!(
        "round {round} (install): node {victim} restarted and caught up (applied {applied}) in \
         {:.1} s",
        took.as_secs_f64()
    ));
    Ok(())
}

/// Waits until `file` has kept its size for `still` (returns that size), or is gone or
/// `bound` has passed (`None`).
async fn wait_still(file: &Path, still: Duration, bound: Duration) -> Option<u64> {
    let deadline = Instant::now() + bound;
    let mut last: Option<(u64, Instant)> = None;
    while Instant::now() < deadline {
        let bytes = std::fs::metadata(file).ok()?.len();
        match last {
            Some((previous, since)) if previous == bytes => {
                if since.elapsed() >= still {
                    return Some(bytes);
                }
            }
            _ => last = Some((bytes, Instant::now())),
        }
        tokio::time::sleep(POLL).await;
    }
    None
}

/// Waits until the leader's log is purged past `index`; returns (leader, purged index), or
/// `None` after [`PURGE_WAIT`]. Fails if a node exits meanwhile.
async fn wait_purged_past(
    cx: &mut NemesisContext<'_>,
    index: u64,
) -> Result<Option<(u64, u64)>, String> {
    let deadline = Instant::now() + PURGE_WAIT;
    while Instant::now() < deadline {
        for id in cx.cluster.ids() {
            // The victim is down: its process is gone, not exited by itself.
            if let Some(status) = cx.cluster.exited(id) {
                return Err(cx.cluster.exit_report(id, status));
            }
        }
        if let Some(leader) = cx.cluster.leader().await {
            if let Some(status) = cx.cluster.status(leader).await {
                if status.purged_index > index {
                    return Ok(Some((leader, status.purged_index)));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(None)
}

/// After the last round: every node must be running; notes the counts; an oom loop must
/// have seen at least [`KERNEL_KILLS_MIN`] kills by the kernel.
pub fn finish(cx: &mut NemesisContext<'_>, killer: Killer) -> Result<(), String> {
    cx.cluster.check_all_running()?;
    let counts = &cx.kill_loop;
    let moments: Vec<String> = counts
        .kills_by_moment
        .iter()
        .map(|(moment, n)| format!("{} {n}", moment.name()))
        .collect();
    let kills: usize = counts.kills_by_moment.values().sum();
    let summary = format!(
        "kill loop: {kills} kills ({} of the leader; {} by the kernel ({} with a snapshot being \
         written or received), {} kill -9), by moment: {}; {} restarts caught up; install \
         rounds {}, incoming.part seen in {}",
        counts.leader_kills,
        counts.kernel_kills,
        counts.kernel_kills_during_snapshot_io,
        counts.signal_kills,
        moments.join(", "),
        counts.restarts,
        counts.install_rounds,
        counts.installs_seen
    );
    let kernel_kills = counts.kernel_kills;
    cx.log.note(summary);
    if killer == Killer::Kernel && kernel_kills < KERNEL_KILLS_MIN {
        return Err(format!(
            "too little work to count: the kernel killed {kernel_kills} times (at least \
             {KERNEL_KILLS_MIN} required)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(tmp: bool, incoming: bool, segments: &[&str]) -> DirView {
        DirView {
            snapshot_tmp: tmp,
            incoming,
            segments: segments.iter().map(OsString::from).collect(),
        }
    }

    #[test]
    fn a_moment_is_seen_only_when_the_dir_shows_it() {
        let before = view(false, false, &["1.wal", "2.wal"]);
        let all = [
            Moment::SnapshotWrite,
            Moment::Install,
            Moment::Rotation,
            Moment::Purge,
        ];
        assert_eq!(moment_shown(&before, &before, &all), None);
        let rotated = view(false, false, &["1.wal", "2.wal", "3.wal"]);
        assert_eq!(
            moment_shown(&before, &rotated, &all),
            Some(Moment::Rotation)
        );
        assert_eq!(moment_shown(&before, &rotated, &[Moment::Purge]), None);
        let purged = view(false, false, &["2.wal"]);
        assert_eq!(moment_shown(&before, &purged, &all), Some(Moment::Purge));
        let writing = view(true, false, &["1.wal", "2.wal"]);
        assert_eq!(
            moment_shown(&before, &writing, &all),
            Some(Moment::SnapshotWrite)
        );
        assert_eq!(moment_shown(&before, &writing, &[Moment::Install]), None);
        let installing = view(false, true, &["1.wal", "2.wal"]);
        assert_eq!(
            moment_shown(&before, &installing, &[Moment::Install]),
            Some(Moment::Install)
        );
    }

    #[test]
    fn a_look_at_a_data_dir_finds_snapshots_being_written_and_segments() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("snapshots")).expect("snapshots");
        std::fs::create_dir_all(dir.path().join("raft-log/segments")).expect("segments");
        let seen = look(dir.path());
        assert!(!seen.snapshot_tmp && !seen.incoming && seen.segments.is_empty());
        std::fs::write(dir.path().join("snapshots/snap-1-1.tmp"), b"").expect("tmp");
        std::fs::write(dir.path().join("snapshots/incoming.part"), b"").expect("part");
        std::fs::write(dir.path().join("raft-log/segments/a.wal"), b"").expect("wal");
        let seen = look(dir.path());
        assert!(seen.snapshot_tmp && seen.incoming);
        assert_eq!(seen.segments.len(), 1);
    }
}
