//! Scheduled backups: on the leader, every `backup_interval_ms`, a backup of the cluster's
//! state at a linearizable point, written to a spool file in the data dir, uploaded to the
//! target (`backup_target`: a directory or S3, through `cairn_backup`), read back and
//! verified in full before it gets its name, and older ones pruned (`backup_retain_*`).
//! Runbook: `docs/operations.md`, "Scheduled backups".
//!
//! **One task per node** ([`run`], started by the agent when `backup_target` is set and
//! `backup_interval_ms` is not 0). It does nothing until the node leads; then, in that term:
//!
//! 1. it lists the target and decides ([`decide`], pure): the next backup is due
//!    `interval` after the *newest backup of this cluster in the target* (whoever took it),
//!    so that a leader change adds no backup; not before the hold-off since this node
//!    began to lead; not before the back-off of a failure ([`retry_delay`]);
//! 2. when due (`take`): confirms leadership (a read index: the linearizable point),
//!    takes the state machine's point-in-time snapshot, streams it into a spool file
//!    (`DATA_DIR/backup-spool/`, on a blocking thread, at most
//!    `backup_write_bytes_per_second_max`), then [`BackupTarget::put_verified`]: uploads it
//!    as `<name>.part`, reads it back into the spool dir, and verifies the copy
//!    (`verify_copy`: the whole file decoded and its checksum matched by
//!    [`snapshot_file::verify`], its header the one taken, and this node still the leader
//!    of the term the backup began in) before publishing it under its name; then prunes
//!    ([`BackupTarget::apply_retention`]);
//! 3. logs it (INFO when it starts and when it is published, with its name, index, size and
//!    duration; a progress line every [`PROGRESS_LOG_INTERVAL`] of a long transfer; WARN
//!    for an abort, ERROR for a failure, naming the target and the kind), and sets the
//!    metrics ([`describe_metrics`]).
//!
//! A failure never stops the node, nor its serving: it is counted
//! (`cairn_backup_failures_total{kind}`), logged, and retried after a back-off that doubles
//! from [`RETRY_DELAY_MIN`] up to the interval.
//!
//! # Invariants
//!
//! 1. **Never two members at once, also across a leader change.** A backup runs only while
//!    this node leads in the term `T` the backup began in: the whole attempt is raced
//!    against the end of that leadership (`while_leading`), and dropped (the spool file
//!    removed, the blocking writer told to stop, the upload abandoned and its `.part`
//!    removed) as soon as this node's Raft metrics say it no longer leads `T`. A leader
//!    that does not know yet that it was deposed cannot publish either: the verify step,
//!    the last before publishing, confirms leadership in `T` (a quorum answered this
//!    leader's heartbeat of term `T`) or refuses. And a new leader waits a hold-off of
//!    [`HOLD_OFF_ELECTION_TIMEOUTS`] election timeouts after it sees itself lead before its
//!    first backup: it won its term `T' > T` at some time `e` with the votes of a quorum,
//!    which from then on answer no heartbeat of term `T`; so the old leader's last quorum
//!    acknowledgement is older than `e`, and check-quorum (`raft::check_quorum`) makes it
//!    step down by `e` + one election timeout + one heartbeat interval (≤ a third of an
//!    election timeout), before `e + 2 × election timeout`; its task then drops its backup
//!    at once. A process stalled longer than the hold-off (SIGSTOP, a VM paused) still
//!    cannot publish after `e`, since its confirmation fails; the one window left is a
//!    stall between that confirmation and the publishing copy itself.
//! 2. **A published backup was read back and verified as a whole** (the checksum and every
//!    record decoded), and names the cluster and index its header holds (the target's
//!    invariant 1, with `verify_copy` as the check; asserted again there).
//! 3. The spool dir holds only the backup in flight: leftovers are removed when the node
//!    starts ([`remove_spool_leftovers`]), the spool file when the attempt ends, however it
//!    ends (`TempFile`).
//! 4. Everything is bounded: one backup at a time, the spool is a file streamed record by
//!    record (never the state in memory twice), an upload holds at most
//!    `cairn_backup::Limits` in memory, a listing reads at most its limit of objects, and a
//!    leadership confirmation waits at most the hold-off.

use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_backup::{
    BackupError, BackupName, BackupTarget, Phase, Progress, Retention, TargetSpec, Verified,
};

use crate::config::{BackupSettingError, BackupTargetSettings, Config};
use crate::raft::RaftHandle;
use crate::snapshot_file::{self, SnapshotEncoder, SnapshotHeader, TempFile};

/// A new leader's first backup waits this many election timeouts (invariant 1).
pub const HOLD_OFF_ELECTION_TIMEOUTS: u32 = 2;
/// The first retry after a failure; each further failure doubles it, up to the interval.
pub const RETRY_DELAY_MIN: Duration = Duration::from_secs(1);
/// A long transfer logs its progress at most this often.
pub const PROGRESS_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// The spool dir, under the data dir.
pub const SPOOL_DIR: &str = "backup-spool";
/// The spool file's write buffer: it grows on disk in steps of this (and the write
/// throttle waits between them).
const SPOOL_WRITE_BUFFER_BYTES: usize = 64 * 1024;
/// How long a throttled writer sleeps at most before it looks at the abort flag again.
const ABORT_CHECK_INTERVAL: Duration = Duration::from_millis(50);
/// How often the task looks at this node's leadership when no change was signalled.
const LEADERSHIP_POLL: Duration = Duration::from_millis(200);
/// How long removing an abandoned upload's `.part` may take.
const REMOVE_PART_TIMEOUT: Duration = Duration::from_secs(10);

pub const LAST_SUCCESS_TIMESTAMP: &str = "cairn_backup_last_success_timestamp_seconds";
pub const LAST_SIZE_BYTES: &str = "cairn_backup_last_size_bytes";
pub const FAILURES: &str = "cairn_backup_failures_total";
pub const DURATION: &str = "cairn_backup_duration_seconds";
pub const INTERVAL_SECONDS: &str = "cairn_backup_interval_seconds";

/// Every `kind` of [`FAILURES`]: the target's ([`BackupError::kind`]) and this module's
/// own ([`Failure::kind`]).
pub const FAILURE_KINDS: [&str; 13] = [
    "spec",
    "missing_target",
    "refused",
    "full",
    "not_found",
    "verify",
    "too_many",
    "local",
    "io",
    "settings",
    "snapshot",
    "spool",
    "aborted",
];

/// Describes the series, and registers the failure kinds at 0 (so that an alert sees them
/// before the first failure). Called once the recorder is installed.
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!(
        LAST_SUCCESS_TIMESTAMP,
        Unit::Seconds,
        "Creation time (Unix seconds) of the newest verified backup this node published or, \
         leading, found in the target; 0 while it knows of none."
    );
    describe_gauge!(LAST_SIZE_BYTES, Unit::Bytes, "Size of that backup.");
    describe_counter!(
        FAILURES,
        "Scheduled backups (and target listings) that failed on this node, by kind: the \
         target's (refused, full, missing_target, verify, io, ...), settings, snapshot, \
         spool (the local spool file), or aborted (this node stopped leading)."
    );
    describe_histogram!(
        DURATION,
        Unit::Seconds,
        "Time to take, upload, verify and publish one scheduled backup."
    );
    describe_gauge!(
        INTERVAL_SECONDS,
        Unit::Seconds,
        "backup_interval_ms of this node, in seconds; 0 when scheduled backups are off."
    );
    for kind in FAILURE_KINDS {
        metrics::counter!(FAILURES, "kind" => kind).absolute(0);
    }
    metrics::gauge!(LAST_SUCCESS_TIMESTAMP).set(0.0);
    metrics::gauge!(LAST_SIZE_BYTES).set(0.0);
    metrics::gauge!(INTERVAL_SECONDS).set(0.0);
    let _ = metrics::histogram!(DURATION);
}

/// When backups are due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub interval: Duration,
    /// A new leader's wait before its first backup (invariant 1).
    pub hold_off: Duration,
}

/// What [`decide`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Situation {
    /// How long this node has led in its current term (as its task saw it).
    pub leading_for: Duration,
    pub now_unix_ms: u64,
    /// Creation time of the newest backup of this cluster in the target; `None`: none.
    pub newest_created_unix_ms: Option<u64>,
    /// After a failure: no attempt before this.
    pub retry_at_unix_ms: Option<u64>,
}

/// What the leader does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Take a backup now.
    Take,
    /// Still within the hold-off: decide again after this long.
    HoldOff(Duration),
    /// Not due (or backing off): decide again after this long.
    Wait(Duration),
}

/// Whether a backup is due (pure). `due` is the newest backup's creation + `interval`:
///
/// | leading for      | newest backup                       | retry at  | next |
/// |------------------|-------------------------------------|-----------|------|
/// | < hold-off       | any                                 | any       | `HoldOff(hold-off − leading for)` |
/// | ≥ hold-off       | none                                | none, past | `Take` |
/// | ≥ hold-off       | `due` ≤ now                         | none, past | `Take` |
/// | ≥ hold-off       | `due` > now, created ≤ now + interval | none, past | `Wait(due − now)` |
/// | ≥ hold-off       | created > now + interval (a clock set back) | none, past | `Take`: a backup dated in the future must not stop the schedule |
/// | ≥ hold-off       | any                                 | future    | `Wait` until both the retry time and `due` |
pub fn decide(situation: &Situation, timing: &Timing) -> Next {
    if situation.leading_for < timing.hold_off {
        return Next::HoldOff(timing.hold_off - situation.leading_for);
    }
    let now = situation.now_unix_ms;
    let interval_ms = u64::try_from(timing.interval.as_millis()).unwrap_or(u64::MAX);
    let due = match situation.newest_created_unix_ms {
        None => now,
        Some(created) if created > now.saturating_add(interval_ms) => now,
        Some(created) => created.saturating_add(interval_ms),
    };
    let not_before = due.max(situation.retry_at_unix_ms.unwrap_or(0));
    if not_before <= now {
        Next::Take
    } else {
        Next::Wait(Duration::from_millis(not_before - now))
    }
}

/// The back-off after `failures` failures in a row (1 or more): [`RETRY_DELAY_MIN`],
/// doubled for each further one, never over `interval` (pure).
pub fn retry_delay(failures: u32, interval: Duration) -> Duration {
    let doublings = failures.saturating_sub(1).min(30);
    RETRY_DELAY_MIN
        .saturating_mul(1u32 << doublings)
        .min(interval)
        .max(RETRY_DELAY_MIN.min(interval))
}

/// How long a writer limited to `bytes_per_second` (0: no limit) that wrote `written_bytes`
/// in `elapsed` must wait before it writes more (pure).
pub fn throttle_wait(written_bytes: u64, elapsed: Duration, bytes_per_second: u64) -> Duration {
    if bytes_per_second == 0 {
        return Duration::ZERO;
    }
    let allowed = Duration::from_secs_f64(written_bytes as f64 / bytes_per_second as f64);
    allowed.saturating_sub(elapsed)
}

/// The check of a copy read back from the target (pure, past the file's own verification):
/// the header `read` must be the one `taken` and name the cluster and index `name` does.
pub fn check_copy(
    read: &SnapshotHeader,
    taken: &SnapshotHeader,
    name: &BackupName,
) -> Result<Verified, String> {
    if read.cluster_id != name.cluster_id() || read.last_log_index != name.index() {
        return Err(format!(
            "the copy holds cluster {} at index {}, but its name says cluster {} at index {}",
            read.cluster_id,
            read.last_log_index,
            name.cluster_id(),
            name.index()
        ));
    }
    if read != taken {
        return Err(format!(
            "the copy's header (index {}, term {}, {} resources) is not the one written \
             (index {}, term {}, {} resources)",
            read.last_log_index,
            read.last_log_term,
            read.resource_count,
            taken.last_log_index,
            taken.last_log_term,
            taken.resource_count
        ));
    }
    if read.pending_restore.is_some() {
        return Err("the copy holds a pending restore: not a backup".into());
    }
    Ok(Verified {
        cluster_id: read.cluster_id.clone(),
        index: read.last_log_index,
    })
}

/// The settings of the scheduled backups, from the node's configuration.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub target: BackupTargetSettings,
    pub timing: Timing,
    pub retention: Retention,
    pub write_bytes_per_second_max: u64,
    /// `DATA_DIR/backup-spool`.
    pub spool_dir: PathBuf,
    /// How long a leadership confirmation may take.
    pub confirm_timeout: Duration,
}

impl Schedule {
    /// The schedule `config` asks for; `None` when scheduled backups are off (no
    /// `backup_target`, or `backup_interval_ms` 0).
    pub fn of(config: &Config) -> Option<Schedule> {
        let target = config.backup_target_settings()?;
        if config.backup_interval_ms == 0 {
            return None;
        }
        let election_timeout = Duration::from_millis(config.election_timeout_ms);
        let hold_off = election_timeout * HOLD_OFF_ELECTION_TIMEOUTS;
        Some(Schedule {
            target,
            timing: Timing {
                interval: Duration::from_millis(config.backup_interval_ms),
                hold_off,
            },
            retention: config.backup_retention(),
            write_bytes_per_second_max: config.backup_write_bytes_per_second_max,
            spool_dir: spool_dir(&config.data_dir),
            confirm_timeout: hold_off,
        })
    }
}

/// `DATA_DIR/backup-spool`.
pub fn spool_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(SPOOL_DIR)
}

/// Removes what an earlier run left in the spool dir (a crash mid-backup); creates the dir.
/// Called at start, before Raft serves anything, whether backups are on or not.
pub fn remove_spool_leftovers(data_dir: &Path) -> std::io::Result<usize> {
    let dir = spool_dir(data_dir);
    let mut removed = 0;
    match std::fs::read_dir(&dir) {
        Ok(entries) => {
            for entry in entries {
                let path = entry?.path();
                if path.is_dir() {
                    std::fs::remove_dir_all(&path)?;
                } else {
                    std::fs::remove_file(&path)?;
                }
                removed += 1;
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if removed > 0 {
        tracing::info!(dir = %dir.display(), removed, "removed the leftovers of an unfinished backup");
    }
    Ok(removed)
}

/// Why one attempt (a listing, or a backup) failed. One vocabulary: [`Failure::kind`].
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error(transparent)]
    Target(#[from] BackupError),
    #[error("backup settings: {0}")]
    Settings(#[from] BackupSettingError),
    #[error("cannot take the snapshot: {0}")]
    Snapshot(String),
    #[error("cannot write the spool file {}: {source}", path.display())]
    Spool {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("aborted: {0}")]
    Aborted(String),
}

impl Failure {
    /// The `kind` label of [`FAILURES`] (one of [`FAILURE_KINDS`]).
    pub fn kind(&self) -> &'static str {
        match self {
            Failure::Target(e) => e.kind(),
            Failure::Settings(_) => "settings",
            Failure::Snapshot(_) => "snapshot",
            Failure::Spool { .. } => "spool",
            Failure::Aborted(_) => "aborted",
        }
    }
}

/// A published backup.
#[derive(Debug, Clone)]
pub struct Taken {
    pub name: BackupName,
    pub size_bytes: u64,
    pub pruned: usize,
    pub kept: usize,
}

/// The backup in flight, for the clean-up of an abandoned attempt.
type InFlight = Arc<parking_lot::Mutex<Option<(BackupTarget, BackupName)>>>;

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whether this node leads in `term`.
fn leads_in(raft: &RaftHandle, term: u64) -> bool {
    raft.is_leader() && raft.status().term == term
}

/// Returns once this node no longer leads in `term` (or Raft stopped). Woken by every
/// change of the leader or term in Raft's metrics, and looks again every
/// [`LEADERSHIP_POLL`] besides.
async fn leadership_lost(raft: &RaftHandle, term: u64) {
    loop {
        // The view first: a change after it wakes the wait below at once.
        let view = raft.leader_view();
        if !leads_in(raft, term) {
            return;
        }
        if let Ok(None) =
            tokio::time::timeout(LEADERSHIP_POLL, raft.leader_view_changed(&view)).await
        {
            return;
        }
    }
}

/// Runs `work` while this node leads in `term`: `None` (and `work` dropped) as soon as it
/// does not (invariant 1).
async fn while_leading<T>(
    raft: &RaftHandle,
    term: u64,
    work: impl Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        biased;
        () = leadership_lost(raft, term) => None,
        out = work => Some(out),
    }
}

/// Waits until this node leads; its term, or `None` once Raft stopped.
async fn wait_to_lead(raft: &RaftHandle) -> Option<u64> {
    loop {
        // The view first: a change after it wakes the wait below at once.
        let view = raft.leader_view();
        if raft.is_leader() {
            return Some(raft.status().term);
        }
        if let Ok(None) =
            tokio::time::timeout(LEADERSHIP_POLL, raft.leader_view_changed(&view)).await
        {
            return None;
        }
    }
}

/// Opens the target the settings name, its read-back copies in the spool dir.
fn open_target(schedule: &Schedule) -> Result<BackupTarget, Failure> {
    let spec: TargetSpec = schedule.target.spec()?;
    Ok(BackupTarget::open(&spec)?.with_scratch_dir(schedule.spool_dir.clone()))
}

/// The scheduled backups' task, for the life of the node (see the module docs).
pub async fn run(raft: RaftHandle, schedule: Schedule) {
    metrics::gauge!(INTERVAL_SECONDS).set(schedule.timing.interval.as_secs_f64());
    if let Err(e) = std::fs::create_dir_all(&schedule.spool_dir) {
        tracing::error!(dir = %schedule.spool_dir.display(), error = %e, "cannot create the backup spool dir; backups will fail until it can be");
    }
    let target_text = schedule
        .target
        .spec()
        .map_or_else(|_| schedule.target.target.clone(), |s| s.to_string());
    tracing::info!(
        backup_target = %target_text,
        interval_ms = schedule.timing.interval.as_millis() as u64,
        retain_count = schedule.retention.retain_count,
        retain_age_ms = schedule.retention.retain_age.map(|a| a.as_millis() as u64),
        "scheduled backups on: the leader takes them"
    );
    let mut failures: u32 = 0;
    let mut retry_at_unix_ms: Option<u64> = None;
    let in_flight: InFlight = Arc::default();
    while let Some(term) = wait_to_lead(&raft).await {
        let leading_since = Instant::now();
        tracing::info!(
            term,
            hold_off_ms = schedule.timing.hold_off.as_millis() as u64,
            "leading: scheduled backups start after the hold-off"
        );
        loop {
            let attempt = while_leading(&raft, term, async {
                let target = open_target(&schedule)?;
                let listing = target.list().await?;
                let cluster_id = raft.identity.cluster_id();
                Ok::<_, Failure>((target, listing.newest_of(&cluster_id).cloned()))
            })
            .await;
            let Some(listed) = attempt else { break };
            let (target, newest) = match listed {
                Ok(listed) => listed,
                Err(failure) => {
                    failures += 1;
                    let delay = retry_delay(failures, schedule.timing.interval);
                    report_failure(&failure, &target_text, None, now_unix_ms(), delay);
                    retry_at_unix_ms = Some(now_unix_ms() + delay.as_millis() as u64);
                    if while_leading(&raft, term, tokio::time::sleep(delay))
                        .await
                        .is_none()
                    {
                        break;
                    }
                    continue;
                }
            };
            if let Some(newest) = &newest {
                metrics::gauge!(LAST_SUCCESS_TIMESTAMP)
                    .set(newest.created_unix_ms() as f64 / 1000.0);
                metrics::gauge!(LAST_SIZE_BYTES).set(newest.size_bytes as f64);
            }
            let situation = Situation {
                leading_for: leading_since.elapsed(),
                now_unix_ms: now_unix_ms(),
                newest_created_unix_ms: newest.as_ref().map(|b| b.created_unix_ms()),
                retry_at_unix_ms,
            };
            if let Some(created) = situation.newest_created_unix_ms {
                let interval_ms = schedule.timing.interval.as_millis() as u64;
                if created > situation.now_unix_ms.saturating_add(interval_ms) {
                    tracing::warn!(backup_target = %target_text, newest_created_unix_ms = created, now_unix_ms = situation.now_unix_ms, "the newest backup is dated more than an interval in the future (a clock set back?): taking one now");
                }
            }
            let wait = match decide(&situation, &schedule.timing) {
                Next::HoldOff(wait) | Next::Wait(wait) => wait,
                Next::Take => {
                    let started_unix_ms = now_unix_ms();
                    let started = Instant::now();
                    let outcome = while_leading(
                        &raft,
                        term,
                        take(&raft, term, &schedule, target, &in_flight, started_unix_ms),
                    )
                    .await
                    .unwrap_or_else(|| {
                        Err(Failure::Aborted(
                            "this node no longer leads the term the backup began in".into(),
                        ))
                    });
                    let ended_unix_ms = now_unix_ms();
                    let abandoned = in_flight.lock().take();
                    let backup_text = abandoned
                        .as_ref()
                        .map_or_else(|| "-".to_string(), |(_, name)| name.to_string());
                    match outcome {
                        Ok(taken) => {
                            failures = 0;
                            retry_at_unix_ms = None;
                            let duration = started.elapsed();
                            metrics::histogram!(DURATION).record(duration.as_secs_f64());
                            metrics::gauge!(LAST_SUCCESS_TIMESTAMP)
                                .set(taken.name.created_unix_ms() as f64 / 1000.0);
                            metrics::gauge!(LAST_SIZE_BYTES).set(taken.size_bytes as f64);
                            tracing::info!(
                                backup = %taken.name,
                                index = taken.name.index(),
                                size_bytes = taken.size_bytes,
                                duration_ms = duration.as_millis() as u64,
                                pruned = taken.pruned,
                                kept = taken.kept,
                                backup_target = %target_text,
                                started_unix_ms,
                                ended_unix_ms,
                                "backup published"
                            );
                            continue;
                        }
                        Err(failure) => {
                            if let Some((target, name)) = abandoned {
                                // Best effort, after the fact: a `.part` left behind is
                                // pruned by retention later anyway.
                                match tokio::time::timeout(
                                    REMOVE_PART_TIMEOUT,
                                    target.remove_part(&name),
                                )
                                .await
                                {
                                    Ok(Ok(())) => {}
                                    Ok(Err(e)) => {
                                        tracing::warn!(backup = %name, error = %e, "cannot remove the abandoned backup's temporary object; retention removes it later")
                                    }
                                    Err(_) => {
                                        tracing::warn!(backup = %name, "removing the abandoned backup's temporary object timed out; retention removes it later")
                                    }
                                }
                            }
                            if matches!(failure, Failure::Aborted(_)) {
                                metrics::counter!(FAILURES, "kind" => failure.kind()).increment(1);
                                tracing::warn!(
                                    backup = %backup_text,
                                    backup_target = %target_text,
                                    kind = failure.kind(),
                                    started_unix_ms,
                                    ended_unix_ms,
                                    reason = %failure,
                                    "backup aborted: this node stopped leading (the new leader takes the next one)"
                                );
                                break;
                            }
                            failures += 1;
                            let delay = retry_delay(failures, schedule.timing.interval);
                            retry_at_unix_ms = Some(ended_unix_ms + delay.as_millis() as u64);
                            report_failure(
                                &failure,
                                &target_text,
                                Some((&backup_text, started_unix_ms, ended_unix_ms)),
                                ended_unix_ms,
                                delay,
                            );
                            delay
                        }
                    }
                }
            };
            if while_leading(&raft, term, tokio::time::sleep(wait))
                .await
                .is_none()
            {
                break;
            }
        }
    }
}

/// Counts and logs one failure (ERROR: it names the target and the kind).
fn report_failure(
    failure: &Failure,
    target: &str,
    attempt: Option<(&str, u64, u64)>,
    now_unix_ms: u64,
    retry_in: Duration,
) {
    metrics::counter!(FAILURES, "kind" => failure.kind()).increment(1);
    tracing::error!(
        backup = attempt.map(|a| a.0),
        backup_target = %target,
        kind = failure.kind(),
        started_unix_ms = attempt.map(|a| a.1),
        ended_unix_ms = attempt.map(|a| a.2),
        retry_at_unix_ms = now_unix_ms + retry_in.as_millis() as u64,
        error = %failure,
        "backup failed; the node goes on serving, and tries again after {} ms",
        retry_in.as_millis()
    );
}

/// Sets the flag when dropped: the blocking spool writer stops at its next record.
struct AbortOnDrop(Arc<AtomicBool>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Takes one backup as leader of `term` (steps 2 of the module docs): confirm, snapshot,
/// spool, upload and verify, publish, prune.
async fn take(
    raft: &RaftHandle,
    term: u64,
    schedule: &Schedule,
    target: BackupTarget,
    in_flight: &InFlight,
    started_unix_ms: u64,
) -> Result<Taken, Failure> {
    let not_leading = |why: String| Failure::Aborted(why);
    // The linearizable point: leadership confirmed, everything committed applied.
    match tokio::time::timeout(schedule.confirm_timeout, raft.confirm_read()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(not_leading(format!("leadership not confirmed: {e}"))),
        Err(_) => {
            return Err(not_leading(format!(
                "leadership not confirmed within {} ms",
                schedule.confirm_timeout.as_millis()
            )))
        }
    }
    if !leads_in(raft, term) {
        return Err(not_leading("no longer the leader of the term".into()));
    }
    let (snapshot, header) = raft
        .point_in_time_snapshot()
        .map_err(|e| Failure::Snapshot(e.to_string()))?;
    let name = BackupName::new(&header.cluster_id, started_unix_ms, header.last_log_index)
        .map_err(|e| Failure::Snapshot(format!("no backup name for this cluster: {e}")))?;
    *in_flight.lock() = Some((target.clone(), name.clone()));
    tracing::info!(
        backup = %name,
        index = name.index(),
        term,
        resources = header.resource_count,
        backup_target = %target,
        started_unix_ms,
        "backup started"
    );

    // The spool file, written on a blocking thread that stops when this future is dropped.
    let spool_path = schedule.spool_dir.join(name.file_name());
    let abort = Arc::new(AtomicBool::new(false));
    let _abort_on_drop = AbortOnDrop(abort.clone());
    let written = {
        let (path, header, abort) = (spool_path.clone(), header.clone(), abort.clone());
        let rate = schedule.write_bytes_per_second_max;
        tokio::task::spawn_blocking(move || write_spool(&path, &header, snapshot, &abort, rate))
            .await
            .map_err(|e| Failure::Spool {
                path: spool_path.clone(),
                source: std::io::Error::other(e.to_string()),
            })?
    };
    let (spool, spool_bytes) = written.map_err(|source| {
        if source.kind() == std::io::ErrorKind::Interrupted && abort.load(Ordering::SeqCst) {
            not_leading("stopped while writing the spool file".into())
        } else {
            Failure::Spool {
                path: spool_path.clone(),
                source,
            }
        }
    })?;
    tracing::info!(backup = %name, spool_bytes, "backup spooled; uploading");

    // Up, back, verified (and leadership confirmed again), published.
    let deposed = Arc::new(AtomicBool::new(false));
    let verify = {
        let (raft, header, name, deposed) =
            (raft.clone(), header.clone(), name.clone(), deposed.clone());
        let handle = tokio::runtime::Handle::current();
        let confirm_timeout = schedule.confirm_timeout;
        move |copy: &Path| {
            verify_copy(
                copy,
                &header,
                &name,
                &raft,
                term,
                &handle,
                confirm_timeout,
                &deposed,
            )
        }
    };
    let mut last_logged = Instant::now();
    let progress = |p: Progress| {
        if last_logged.elapsed() >= PROGRESS_LOG_INTERVAL {
            last_logged = Instant::now();
            let phase = match p.phase {
                Phase::Upload => "upload",
                Phase::ReadBack => "read back",
                Phase::Fetch => "fetch",
            };
            tracing::info!(backup = %name, phase, done_bytes = p.done_bytes, total_bytes = p.total_bytes, "backup in progress");
        }
    };
    let stored = target
        .put_verified(spool.path(), &name, verify, progress)
        .await
        .map_err(|e| {
            if deposed.load(Ordering::SeqCst) {
                not_leading(format!("not published: {e}"))
            } else {
                Failure::Target(e)
            }
        })?;
    drop(spool);
    // Published: nothing is left to clean up if what follows is abandoned.
    in_flight.lock().take();
    assert_eq!(
        stored.size_bytes, spool_bytes,
        "the target published the size it verified"
    );

    let decision = target
        .apply_retention(name.cluster_id(), now_unix_ms(), &schedule.retention)
        .await;
    let (pruned, kept) = match decision {
        Ok(decision) => {
            for pruned in &decision.prune {
                tracing::info!(backup = %pruned, "backup pruned (retention)");
            }
            (decision.prune.len(), decision.kept)
        }
        Err(e) => {
            // The backup is published; the prune is tried again after the next one.
            metrics::counter!(FAILURES, "kind" => e.kind()).increment(1);
            tracing::error!(backup_target = %target, kind = e.kind(), error = %e, "pruning old backups failed; tried again after the next backup");
            (0, 0)
        }
    };
    Ok(Taken {
        name,
        size_bytes: stored.size_bytes,
        pruned,
        kept,
    })
}

/// The verify callback of [`BackupTarget::put_verified`] (on a blocking thread): the copy
/// read back verified whole ([`snapshot_file::verify`]: every record decoded, the checksum
/// matched), its header checked ([`check_copy`]), and then, last before publishing, this
/// node's leadership of `term` confirmed again (invariant 1); `deposed` says the refusal
/// was that.
#[allow(clippy::too_many_arguments)]
fn verify_copy(
    copy: &Path,
    taken: &SnapshotHeader,
    name: &BackupName,
    raft: &RaftHandle,
    term: u64,
    runtime: &tokio::runtime::Handle,
    confirm_timeout: Duration,
    deposed: &AtomicBool,
) -> Result<Verified, String> {
    let read = snapshot_file::verify(copy, |_, _| {}).map_err(|e| e.to_string())?;
    let verified = check_copy(&read, taken, name)?;
    debug_assert_eq!(
        (verified.cluster_id.as_str(), verified.index),
        (name.cluster_id(), name.index())
    );
    let confirmed = runtime
        .block_on(async { tokio::time::timeout(confirm_timeout, raft.confirm_read()).await });
    let refused = match confirmed {
        Ok(Ok(_)) if leads_in(raft, term) => return Ok(verified),
        Ok(Ok(_)) => format!("this node no longer leads term {term}, in which the backup began"),
        Ok(Err(e)) => format!("leadership not confirmed before publishing: {e}"),
        Err(_) => format!(
            "leadership not confirmed within {} ms before publishing",
            confirm_timeout.as_millis()
        ),
    };
    deposed.store(true, Ordering::SeqCst);
    Err(refused)
}

/// Writes the snapshot into a spool file at `path` (removed when the returned guard is
/// dropped): streamed record by record through a small buffer, at most `bytes_per_second`
/// (0: no limit); stops with `Interrupted` once `abort` is set. Returns the file's size.
fn write_spool(
    path: &Path,
    header: &SnapshotHeader,
    snapshot: cairn_fsm::Snapshot,
    abort: &AtomicBool,
    bytes_per_second: u64,
) -> std::io::Result<(TempFile, u64)> {
    let interrupted = || std::io::Error::new(std::io::ErrorKind::Interrupted, "aborted");
    let (guard, file) = TempFile::create(path.to_path_buf())?;
    let started = Instant::now();
    let mut encoder = SnapshotEncoder::new(
        std::io::BufWriter::with_capacity(SPOOL_WRITE_BUFFER_BYTES, file),
        header,
    )?;
    let mut throttled_at = 0u64;
    for resource in snapshot {
        if abort.load(Ordering::Relaxed) {
            return Err(interrupted());
        }
        encoder.append_encoded(resource.encoded())?;
        let written = encoder.written_bytes();
        if bytes_per_second > 0 && written - throttled_at >= SPOOL_WRITE_BUFFER_BYTES as u64 {
            throttled_at = written;
            let mut wait = throttle_wait(written, started.elapsed(), bytes_per_second);
            while !wait.is_zero() {
                if abort.load(Ordering::Relaxed) {
                    return Err(interrupted());
                }
                let step = wait.min(ABORT_CHECK_INTERVAL);
                std::thread::sleep(step);
                wait -= step;
            }
        }
    }
    let (mut out, size_bytes, _crc) = encoder.finish()?;
    out.flush()?;
    let file = out.into_inner().map_err(|e| e.into_error())?;
    let on_disk = file.metadata()?.len();
    assert_eq!(on_disk, size_bytes, "the spool file holds what was encoded");
    Ok((guard, size_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000;

    #[test]
    fn a_backup_is_due_an_interval_after_the_newest_and_never_within_the_hold_off() {
        let timing = Timing {
            interval: Duration::from_secs(60),
            hold_off: Duration::from_secs(2),
        };
        let now = 1_000_000 * S;
        let situation =
            |leading_for_ms: u64, newest: Option<u64>, retry_at: Option<u64>| Situation {
                leading_for: Duration::from_millis(leading_for_ms),
                now_unix_ms: now,
                newest_created_unix_ms: newest,
                retry_at_unix_ms: retry_at,
            };
        let wait = |ms| Next::Wait(Duration::from_millis(ms));
        // (leading for ms, newest created, retry at, next)
        let table: Vec<(u64, Option<u64>, Option<u64>, Next)> = vec![
            // Within the hold-off: wait it out, whatever the target holds.
            (0, None, None, Next::HoldOff(Duration::from_secs(2))),
            (
                1_500,
                Some(now - 3_600 * S),
                None,
                Next::HoldOff(Duration::from_millis(500)),
            ),
            // No backup yet, or the newest an interval old or more: now.
            (2_000, None, None, Next::Take),
            (9_999, Some(now - 60 * S), None, Next::Take),
            (9_999, Some(now - 3_600 * S), None, Next::Take),
            // The newest is younger than the interval: wait for the rest of it.
            (9_999, Some(now - 59 * S), None, wait(S)),
            (9_999, Some(now), None, wait(60 * S)),
            // Dated in the future, within an interval: wait until an interval after it.
            (9_999, Some(now + 30 * S), None, wait(90 * S)),
            // Dated more than an interval in the future (a clock set back): now.
            (9_999, Some(now + 61 * S), None, Next::Take),
            // Backing off after a failure: not before the retry time...
            (9_999, None, Some(now + 5 * S), wait(5 * S)),
            (9_999, Some(now - 3_600 * S), Some(now + 5 * S), wait(5 * S)),
            (9_999, None, Some(now - S), Next::Take),
            (9_999, None, Some(now), Next::Take),
            // ... nor before the newest's due time.
            (9_999, Some(now - 30 * S), Some(now + 5 * S), wait(30 * S)),
        ];
        for (leading_for_ms, newest, retry_at, next) in table {
            assert_eq!(
                decide(&situation(leading_for_ms, newest, retry_at), &timing),
                next,
                "leading for {leading_for_ms} ms, newest {newest:?}, retry at {retry_at:?}"
            );
        }
    }

    #[test]
    fn the_back_off_doubles_from_a_second_up_to_the_interval() {
        let hour = Duration::from_secs(3_600);
        let table: Vec<(u32, Duration, Duration)> = vec![
            (1, hour, Duration::from_secs(1)),
            (2, hour, Duration::from_secs(2)),
            (5, hour, Duration::from_secs(16)),
            (12, hour, Duration::from_secs(2_048)),
            (13, hour, hour),
            (1_000, hour, hour),
            (u32::MAX, hour, hour),
            (0, hour, Duration::from_secs(1)),
            (3, Duration::from_secs(2), Duration::from_secs(2)),
            (1, Duration::from_millis(500), Duration::from_millis(500)),
        ];
        for (failures, interval, delay) in table {
            assert_eq!(
                retry_delay(failures, interval),
                delay,
                "{failures} failures"
            );
        }
    }

    #[test]
    fn a_throttled_writer_waits_until_its_rate_allows_what_it_wrote() {
        let table: Vec<(u64, u64, u64, u64)> = vec![
            // (written bytes, elapsed ms, bytes a second, wait ms)
            (1_000, 0, 0, 0),
            (1_000, 0, 1_000, 1_000),
            (1_000, 400, 1_000, 600),
            (1_000, 1_000, 1_000, 0),
            (1_000, 5_000, 1_000, 0),
            (65_536, 0, 65_536, 1_000),
        ];
        for (written, elapsed_ms, rate, wait_ms) in table {
            assert_eq!(
                throttle_wait(written, Duration::from_millis(elapsed_ms), rate).as_millis() as u64,
                wait_ms,
                "{written} bytes in {elapsed_ms} ms at {rate}/s"
            );
        }
    }

    fn header(cluster_id: &str, index: u64) -> SnapshotHeader {
        SnapshotHeader {
            cluster_id: cluster_id.into(),
            last_log_index: index,
            last_log_term: 2,
            last_log_leader_node_id: 1,
            membership: serde_json::json!({}),
            resource_count: 3,
            created_at_unix_ms: 5,
            applied_initial_entry: false,
            pending_restore: None,
            cluster_version: None,
            cluster_version_downgrade: None,
            space_quota_bytes: None,
            nospace_alarm_index: None,
            leases: vec![],
            corrupt_members: vec![],
            corrupt_alarm_index: None,
        }
    }

    #[test]
    fn a_copy_must_hold_the_header_taken_and_named() {
        let name = BackupName::new("c1", 10, 7).unwrap();
        let taken = header("c1", 7);
        assert_eq!(
            check_copy(&taken, &taken, &name),
            Ok(Verified {
                cluster_id: "c1".into(),
                index: 7
            })
        );
        let other_cluster = header("c2", 7);
        let other_index = header("c1", 8);
        let mut other_count = header("c1", 7);
        other_count.resource_count = 4;
        let mut pending = header("c1", 7);
        pending.pending_restore = Some(crate::snapshot_file::PendingRestoreHeader {
            restore_id: "r".into(),
            resource_count: 1,
            received_count: 0,
            failure: None,
            leases: vec![],
        });
        for (read, words) in [
            (&other_cluster, "cluster c2 at index 7"),
            (&other_index, "cluster c1 at index 8"),
            (&other_count, "4 resources"),
            (&pending, "not the one written"),
        ] {
            let refused = check_copy(read, &taken, &name).unwrap_err();
            assert!(refused.contains(words), "{refused}");
        }
        let mut pending_taken = taken.clone();
        pending_taken.pending_restore = pending.pending_restore.clone();
        assert!(check_copy(&pending, &pending_taken, &name)
            .unwrap_err()
            .contains("pending restore"));
    }

    #[test]
    fn spool_leftovers_are_removed_at_start() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(remove_spool_leftovers(dir.path()).unwrap(), 0);
        let spool = spool_dir(dir.path());
        std::fs::create_dir_all(spool.join("sub")).unwrap();
        std::fs::write(spool.join("cairn-c1-1-2.snap"), b"x").unwrap();
        std::fs::write(spool.join(".cairn-backup-readback-x"), b"x").unwrap();
        assert_eq!(remove_spool_leftovers(dir.path()).unwrap(), 3);
        assert_eq!(std::fs::read_dir(&spool).unwrap().count(), 0);
    }
}
