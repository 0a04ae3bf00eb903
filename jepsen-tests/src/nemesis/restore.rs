//! The restore nemesis ([`super::NemesisKind::RestoreKill`]): `kill -9` of a node
//! during an online restore, with the set workload running.
//!
//! A round: (sometimes) `cairn snapshot save` a backup, recorded in the history as
//! one strong read per set key (its contents: a strong list right after the save,
//! keeping the resources whose version is at most the backup's index — the state
//! at that index, since no restore runs meanwhile); then `cairn snapshot restore`
//! of the latest or an older backup through the leader (the *driver*), recorded as
//! a `restore` operation whose input is the backup; while it runs, `kill -9` of
//! the driver, a follower or the leader of the moment, chosen by the seed, at a
//! seeded moment: shortly after the upload starts, as soon as the driver shows
//! the restore pending (its chunks are being replicated), or right after the
//! command returns (just after the commit); then the node restarts.
//!
//! A restore that did not answer "restored" is *settled* before anything else:
//! its driver is killed (if this round did not already) and restarted, then a
//! strong list must succeed. The driver runs only in that process, so after a
//! strong read served by a leader of a later term, its entries are applied or
//! never will be: the restore took effect before that point, or never. The
//! operation is completed `info` at that moment (see [`crate::history`]), so the
//! checker ([`crate::set`]) knows the window in which it may have taken effect.
//! Every round ends with no restore pending, so restores never overlap.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_client::v1::{Consistency, Id, ListResponse, Resource, Type};
use cairn_client::{Client, ClientOptions};
use cairn_proto::google::protobuf::Any;
use rand::seq::IndexedRandom as _;
use rand::Rng as _;

use super::{millis, NemesisContext};
use crate::history::{OpKind, Recorder, Value};
use crate::workload::{self, WorkloadKind};

/// The process id of the nemesis's own operations in a history (and of a drill's).
pub const NEMESIS_PROCESS: u64 = 1_000_000;

/// Resources of another type written once, so that a backup spans a few Raft
/// chunks of about 1 MiB and a restore takes long enough to be cut part-way.
const BALLAST_RESOURCES: usize = 40;
const BALLAST_BYTES: usize = 48 * 1024;

/// Bound of every step of the `cairn` command (`--timeout-ms`).
const COMMAND_TIMEOUT_MS: u64 = 5000;

/// The set workload's history and keys, for the operations this nemesis records.
#[derive(Clone)]
pub struct RecordedSet {
    pub recorder: Recorder,
    /// The set keys (name prefixes) the workload reads.
    pub keys: Vec<String>,
}

/// What the restore nemesis keeps between rounds.
#[derive(Default)]
pub struct RestoreRounds {
    ballast_written: bool,
    backups: Vec<Backup>,
}

struct Backup {
    path: PathBuf,
    /// `[[key, [elements]], ...]`: the input of a `restore` operation.
    contents: Value,
}

/// When the kill comes.
#[derive(Clone, Copy, Debug)]
enum Moment {
    /// 0–300 ms after the command starts: usually during the upload or the
    /// leader's verification.
    DuringUpload,
    /// As soon as the driver shows the restore pending: its chunks are being
    /// replicated.
    WhilePending,
    /// Right after the command returns (just after the commit).
    AfterCommit,
}

/// Whom the kill hits.
#[derive(Clone, Copy, Debug)]
enum Target {
    Driver,
    Follower,
    /// The leader at the moment of the kill (usually the driver).
    Leader,
}

fn client(endpoints: &[String]) -> Result<Client, String> {
    Client::new(
        endpoints,
        ClientOptions {
            request_timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_millis(500),
            ..ClientOptions::default()
        },
    )
    .map_err(|e| e.to_string())
}

/// Runs `cairn ARGS` to its end, bounded; returns (success, stdout, stderr).
async fn cairn(binary: &Path, args: &[&str]) -> Result<(bool, String, String), String> {
    let child = tokio::process::Command::new(binary)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    let bound = Duration::from_millis(COMMAND_TIMEOUT_MS * 8);
    let output = tokio::time::timeout(bound, child.wait_with_output())
        .await
        .map_err(|_| format!("`cairn {}` did not end within {bound:?}", args.join(" ")))?
        .map_err(|e| format!("`cairn {}`: {e}", args.join(" ")))?;
    Ok((
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

/// The last line of a command's error output, for the nemesis log.
fn last_line(text: &str) -> &str {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
}

async fn write_ballast(endpoints: &[String]) -> Result<(), String> {
    let client = client(endpoints)?;
    let kind = Type {
        group: workload::GROUP.into(),
        group_version: "v1".into(),
        kind: "Ballast".into(),
    };
    for i in 0..BALLAST_RESOURCES {
        let resource = Resource {
            id: Some(Id {
                uid: cairn_client::new_uid(),
                name: format!("ballast{i:03}"),
                r#type: Some(kind.clone()),
                tenancy: Some(workload::tenancy()),
            }),
            data: Some(Any {
                type_url: "jepsen/ballast".into(),
                value: Bytes::from(vec![b'b'; BALLAST_BYTES]),
            }),
            ..Resource::default()
        };
        client
            .write(resource)
            .await
            .map_err(|e| format!("ballast {i}: {e}"))?;
    }
    Ok(())
}

/// A strong list of the set workload's resources, asked again until one succeeds or
/// `timeout` passes (then the last error).
async fn strong_list(client: &Client, timeout: Duration) -> Result<ListResponse, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match client
            .list(
                workload::resource_type(WorkloadKind::Set),
                workload::tenancy(),
                "",
                Consistency::Strong,
            )
            .await
        {
            Ok(list) => return Ok(list),
            Err(e) if Instant::now() > deadline => return Err(e.to_string()),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The set workload's elements by key, from a strong list, keeping those whose
/// version is at most `index`: what the cluster held at log index `index`, when no restore
/// ran since (a backup's contents).
async fn set_at(client: &Client, keys: &[String], index: u64) -> Result<Vec<Vec<Value>>, String> {
    let list = strong_list(client, Duration::from_secs(15))
        .await
        .map_err(|e| format!("strong list: {e}"))?;
    let mut by_key = vec![Vec::new(); keys.len()];
    for resource in &list.resources {
        let version: u64 = resource
            .version
            .parse()
            .map_err(|_| format!("a set element with version {:?}", resource.version))?;
        let name = resource.id.as_ref().map_or("", |id| id.name.as_str());
        if version > index {
            continue;
        }
        if let Some(k) = keys.iter().position(|key| name.starts_with(key.as_str())) {
            by_key[k].push(workload::decode(resource));
        }
    }
    for elements in &mut by_key {
        elements.sort();
    }
    Ok(by_key)
}

/// Why a recorded backup ([`recorded_backup`]) has no contents.
pub(crate) enum BackupFailure {
    /// The save itself failed.
    Save(String),
    /// Saved at this index, but the cluster's contents at it could not be read.
    Contents(u64, String),
}

/// A backup recorded in the set workload's history: one strong read per key, invoked before
/// `save` starts and completed with what the cluster held at the index `save` returns (or
/// failed, when either step fails). Returns the index and the contents, `[[key,
/// [elements]], ...]`: the input of the `restore` operation that restores it. The restore
/// nemesis and `cairn drill restore` both record their backups so.
pub(crate) async fn recorded_backup(
    recorder: &Recorder,
    keys: &[String],
    client: &Client,
    save: impl std::future::Future<Output = Result<u64, String>>,
) -> Result<(u64, Value), BackupFailure> {
    let reads: Vec<_> = keys
        .iter()
        .map(|key| recorder.invoke(NEMESIS_PROCESS, OpKind::Read, key.clone(), Value::Null))
        .collect();
    let index = match save.await {
        Ok(index) => index,
        Err(why) => {
            reads.into_iter().for_each(|read| read.fail());
            return Err(BackupFailure::Save(why));
        }
    };
    match set_at(client, keys, index).await {
        Ok(by_key) => {
            let mut contents = Vec::new();
            for ((read, key), elements) in reads.into_iter().zip(keys).zip(by_key) {
                read.ok(Value::List(elements.clone()));
                contents.push(Value::List(vec![
                    Value::Str(key.clone()),
                    Value::List(elements),
                ]));
            }
            Ok((index, Value::List(contents)))
        }
        Err(e) => {
            reads.into_iter().for_each(|read| read.fail());
            Err(BackupFailure::Contents(index, e))
        }
    }
}

/// `cairn snapshot save`, recorded as one strong read per key; returns the backup.
async fn save(
    cx: &mut NemesisContext<'_>,
    set: &RecordedSet,
    number: usize,
) -> Result<Option<Backup>, String> {
    let dir = cx.cluster.root().join("backups");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("backup-{number:03}.snap"));
    let endpoints = cx.cluster.endpoints();
    let binary = cx.cluster.options.binary.clone();
    let path_text = path.to_string_lossy().into_owned();
    let timeout = COMMAND_TIMEOUT_MS.to_string();
    let joined = endpoints.join(",");
    let command = async {
        let (saved, stdout, stderr) = cairn(
            &binary,
            &[
                "snapshot",
                "save",
                &path_text,
                "--endpoints",
                &joined,
                "--timeout-ms",
                &timeout,
            ],
        )
        .await?;
        // "saved FILE: index N, term T, ..."
        stdout
            .split("index ")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|digits| digits.parse::<u64>().ok())
            .filter(|_| saved)
            .ok_or_else(|| last_line(&stderr).to_string())
    };
    match recorded_backup(&set.recorder, &set.keys, &client(&endpoints)?, command).await {
        Ok((index, contents)) => {
            let sizes: Vec<usize> = contents
                .as_list()
                .unwrap_or(&[])
                .iter()
                .map(|pair| {
                    pair.as_list()
                        .and_then(|p| p[1].as_list())
                        .map_or(0, <[Value]>::len)
                })
                .collect();
            cx.log.note(format!(
                "saved {} at index {index}: set elements per key {sizes:?}",
                path.display()
            ));
            Ok(Some(Backup { path, contents }))
        }
        Err(BackupFailure::Save(why)) => {
            cx.log.note(format!("snapshot save failed: {why}"));
            Ok(None)
        }
        Err(BackupFailure::Contents(_, e)) => {
            cx.log.note(format!(
                "saved {}, but its contents are unknown: {e}",
                path.display()
            ));
            Ok(None)
        }
    }
}

/// One round (see the module doc).
pub(super) async fn round(cx: &mut NemesisContext<'_>) -> Result<(), String> {
    let set = cx
        .history
        .clone()
        .ok_or("the restore nemesis needs the set workload's history")?;
    let endpoints = cx.cluster.endpoints();
    if !cx.restores.ballast_written {
        write_ballast(&endpoints).await?;
        cx.restores.ballast_written = true;
        cx.log.note(format!(
            "wrote {BALLAST_RESOURCES} ballast resources of {BALLAST_BYTES} bytes"
        ));
    }
    if cx.restores.backups.is_empty() || cx.rng.random_bool(0.6) {
        let number = cx.restores.backups.len() + 1;
        if let Some(backup) = save(cx, &set, number).await? {
            cx.restores.backups.push(backup);
        }
    }
    let Some(latest) = cx.restores.backups.len().checked_sub(1) else {
        return Ok(());
    };
    // The latest backup, or an older one (which brings back what later restores removed).
    let which = if cx.rng.random_bool(0.5) {
        latest
    } else {
        cx.rng.random_range(0..=latest)
    };
    let Some(driver) = cx.cluster.leader().await else {
        cx.log.note("restore: no leader, nothing done");
        return Ok(());
    };
    let moment = *[
        Moment::DuringUpload,
        Moment::WhilePending,
        Moment::AfterCommit,
    ]
    .choose(&mut cx.rng)
    .expect("moments");
    let target = *[Target::Driver, Target::Follower, Target::Leader]
        .choose(&mut cx.rng)
        .expect("targets");
    let delay = millis(&mut cx.rng, (0, 300));
    let down = millis(&mut cx.rng, (500, 2000));

    let backup = &cx.restores.backups[which];
    let path_text = backup.path.to_string_lossy().into_owned();
    let binary = cx.cluster.options.binary.clone();
    let driver_address = cx.cluster.node(driver).client_address.clone();
    cx.log.note(format!(
        "restore of {} through leader {driver}; kill the {target:?} ({moment:?})",
        backup.path.display()
    ));
    let op = set.recorder.invoke(
        NEMESIS_PROCESS,
        OpKind::Restore,
        "",
        backup.contents.clone(),
    );
    // The command runs on its own; an answer of "restored" completes the operation at once.
    let command = tokio::spawn(async move {
        let timeout = COMMAND_TIMEOUT_MS.to_string();
        let result = cairn(
            &binary,
            &[
                "snapshot",
                "restore",
                "--yes",
                &path_text,
                "--endpoints",
                &driver_address,
                "--timeout-ms",
                &timeout,
            ],
        )
        .await;
        match result {
            Ok((true, stdout, _)) => {
                op.ok(Value::Null);
                (None, format!("restored: {}", last_line(&stdout)))
            }
            Ok((false, _, stderr)) => (Some(op), format!("failed: {}", last_line(&stderr))),
            Err(e) => (Some(op), e),
        }
    });
    let command = match moment {
        Moment::DuringUpload => {
            tokio::time::sleep(delay).await;
            Some(command)
        }
        Moment::WhilePending => {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !command.is_finished() && Instant::now() < deadline {
                if cx
                    .cluster
                    .status(driver)
                    .await
                    .is_some_and(|s| s.pending_restore.is_some())
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Some(command)
        }
        Moment::AfterCommit => {
            let ended = command
                .await
                .map_err(|e| format!("the restore command task: {e}"))?;
            cx.log.note(format!("restore command {}", ended.1));
            // Kill below, then settle.
            return finish(cx, driver, target, down, ended.0).await;
        }
    };
    let killed = kill(cx, driver, target).await;
    let ended = command
        .expect("the command is still running")
        .await
        .map_err(|e| format!("the restore command task: {e}"))?;
    cx.log.note(format!("restore command {}", ended.1));
    tokio::time::sleep(down).await;
    cx.cluster.spawn(killed);
    cx.log.note(format!("restarted {killed}"));
    settle(cx, driver, killed == driver, ended.0).await
}

/// The kill of the moment [`Moment::AfterCommit`], then the restart and settling.
async fn finish(
    cx: &mut NemesisContext<'_>,
    driver: u64,
    target: Target,
    down: Duration,
    unsettled: Option<crate::history::OpHandle>,
) -> Result<(), String> {
    let killed = kill(cx, driver, target).await;
    tokio::time::sleep(down).await;
    cx.cluster.spawn(killed);
    cx.log.note(format!("restarted {killed}"));
    settle(cx, driver, killed == driver, unsettled).await
}

/// `kill -9` of `target`; returns the node killed.
async fn kill(cx: &mut NemesisContext<'_>, driver: u64, target: Target) -> u64 {
    let followers = cx.cluster.ids_except(driver);
    let node = match target {
        Target::Driver => driver,
        Target::Follower => *followers.choose(&mut cx.rng).unwrap_or(&driver),
        Target::Leader => cx.cluster.leader().await.unwrap_or(driver),
    };
    cx.cluster.kill(node);
    cx.log.faults += 1;
    cx.log.note(format!(
        "kill -9 node {node} ({target:?}; the driver is {driver})"
    ));
    node
}

/// Settles a restore whose command did not answer "restored" (see the module
/// doc), then waits until no restore is pending.
async fn settle(
    cx: &mut NemesisContext<'_>,
    driver: u64,
    driver_killed: bool,
    unsettled: Option<crate::history::OpHandle>,
) -> Result<(), String> {
    if let Some(op) = unsettled {
        if !driver_killed {
            cx.cluster.kill(driver);
            tokio::time::sleep(Duration::from_millis(300)).await;
            cx.cluster.spawn(driver);
            cx.log.note(format!(
                "settling: killed and restarted the driver {driver}"
            ));
        }
        strong_list(&client(&cx.cluster.endpoints())?, Duration::from_secs(30))
            .await
            .map_err(|e| format!("could not settle a restore: no strong list within 30 s: {e}"))?;
        op.info();
        cx.log
            .note("settled the restore (a strong list after its driver died)");
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Some(leader) = cx.cluster.leader().await {
            if cx
                .cluster
                .status(leader)
                .await
                .is_some_and(|s| s.pending_restore.is_none())
            {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cx.log
        .note("a restore is still pending 15 s after the round");
    Ok(())
}
