//! `cairn snapshot save | inspect | restore`: operator backups in the format of
//! `cairn_server::snapshot_file`, with progress bars for everything a person waits for.
//!
//! The leader is found through [`cairn_client::admin::AdminClient`] (the global
//! `--endpoints`, tried in turn, each within its share of `--timeout-ms`); a transfer then
//! fails if no chunk moves for `--timeout-ms`.
//!
//! An online restore replaces the running cluster's data: it asks first on a terminal,
//! naming the cluster and what would be replaced, and is refused without `--yes` when stdin
//! is not a terminal. The flags of an offline restore (`--data-dir`, `--members`,
//! `--bump-index`) are refused without `--offline`, before anything is done.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::GlobalArgs;
use cairn_proto::error::ApiError;
use cairn_proto::v1::{self as pb};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use crate::common::exit;
use cairn_client::admin::{AdminClient, Leader};
use cairn_server::config::parse_members;
use cairn_server::snapshot_file::{
    self, SnapshotFileError, SnapshotHeader, SnapshotReader, TempFile,
};

#[derive(Subcommand)]
pub enum SnapshotCommand {
    /// Save a consistent point-in-time snapshot of the cluster to FILE.
    Save { file: PathBuf },
    /// Verify FILE and print its header and what it holds.
    Inspect { file: PathBuf },
    /// Replace the RUNNING cluster's data with FILE (asks first; --yes when not on a
    /// terminal), or with --offline seed a new cluster's data dir.
    Restore(RestoreArgs),
}

#[derive(Args)]
pub struct RestoreArgs {
    file: PathBuf,
    #[command(flatten)]
    how: RestoreHow,
}

/// How a backup is restored: the flags `cairn snapshot restore` and `cairn backup restore`
/// share, and what both then run (`restore_online`, `restore_offline`).
#[derive(Args)]
pub struct RestoreHow {
    /// Seed the data dir of one node of a NEW cluster instead (disaster recovery).
    #[arg(long)]
    offline: bool,
    /// Online: replace the running cluster's data without asking (needed when stdin is not
    /// a terminal).
    #[arg(long, short = 'y')]
    yes: bool,
    /// With --offline: the node's data dir (must not hold a cluster yet).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// With --offline: the new cluster's members, ID=PEER/CLIENT,... (the same for every node).
    #[arg(long)]
    members: Option<String>,
    /// With --offline: start the new log this far above the snapshot's index, so that no
    /// version the lost cluster handed out after the backup can match a new write
    /// [default: 1000000000].
    #[arg(long)]
    bump_index: Option<u64>,
}

/// The default of `--bump-index`.
pub(crate) const BUMP_INDEX_DEFAULT: u64 = cairn_server::seed::BUMP_INDEX_DEFAULT;

impl RestoreHow {
    /// Whether this is an offline restore (a new cluster's data dir).
    pub(crate) fn offline(&self) -> bool {
        self.offline
    }

    /// Refuses, before anything is done (a download, a prompt), what cannot go on: an
    /// online restore with an offline flag, or without `--yes` off a terminal; an offline
    /// one without `--data-dir` or `--members`. `what` names the backup, `offline_command`
    /// the command line of an offline restore of it.
    pub(crate) fn check(&self, what: &str, offline_command: &str) -> Result<(), CommandError> {
        if self.offline {
            if self.data_dir.is_none() {
                return Err(CommandError::Usage("--offline needs --data-dir".into()));
            }
            if self.members.is_none() {
                return Err(CommandError::Usage("--offline needs --members".into()));
            }
            return Ok(());
        }
        let offline_only = self.offline_flags();
        if !offline_only.is_empty() {
            return Err(CommandError::Usage(format!(
                "{} {} for seeding a NEW cluster's data dir, with --offline; without --offline, \
                 restore replaces the RUNNING cluster's data. For a new cluster: `{offline_command} \
                 --data-dir DIR --members ID=PEER/CLIENT,...`",
                offline_only.join(", "),
                if offline_only.len() == 1 { "is" } else { "are" },
            )));
        }
        require_confirmation(self.yes, || {
            format!(
                "refusing to replace the running cluster's data without a confirmation: stdin is \
                 not a terminal. Pass --yes to restore {what} into the running cluster (every node's \
                 data is replaced, every open watch closed), or --offline to seed a new cluster's \
                 data dir"
            )
        })
    }

    /// The offline-only flags given, by name.
    fn offline_flags(&self) -> Vec<&'static str> {
        let mut given = Vec::new();
        if self.data_dir.is_some() {
            given.push("--data-dir");
        }
        if self.members.is_some() {
            given.push("--members");
        }
        if self.bump_index.is_some() {
            given.push("--bump-index");
        }
        given
    }
}

pub(crate) fn bar(total_bytes: Option<u64>, message: &str) -> ProgressBar {
    let bar = match total_bytes {
        Some(total) => ProgressBar::new(total).with_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
            )
            .expect("template")
            .progress_chars("=> "),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{spinner} {msg} {bytes} ({bytes_per_sec})")
                .expect("template"),
        ),
    };
    bar.set_message(message.to_string());
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

pub fn run(command: SnapshotCommand, global: &GlobalArgs) -> u8 {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let result = match command {
        SnapshotCommand::Save { file } => runtime.block_on(save(&file, global)),
        SnapshotCommand::Inspect { file } => inspect(&file, &file.display().to_string()),
        SnapshotCommand::Restore(args) => {
            let shown = args.file.display().to_string();
            args.how
                .check(&shown, &format!("cairn snapshot restore --offline {shown}"))
                .and_then(|()| {
                    if args.how.offline {
                        restore_offline(&args.file, &args.how)
                    } else {
                        runtime.block_on(restore_online(&args.file, &shown, &args.how, global))
                    }
                })
        }
    };
    exit_of(result)
}

/// The exit code of a command's outcome (the one table, [`exit`]).
pub(crate) fn exit_of(result: Result<(), CommandError>) -> u8 {
    match result {
        Ok(()) => exit::OK,
        Err(CommandError::NotFound(e)) => {
            eprintln!("cairn: {e}");
            exit::NOT_FOUND
        }
        Err(CommandError::Target(e)) => {
            eprintln!("cairn: {e}");
            match e.kind() {
                "not_found" | "missing_target" => exit::NOT_FOUND,
                "refused" => exit::DENIED,
                "spec" => exit::USAGE,
                _ => exit::ERROR,
            }
        }
        Err(CommandError::Api(e)) => crate::admin::fail(&e),
        Err(e @ CommandError::Cancelled) => {
            eprintln!("cairn: {e}");
            exit::ERROR
        }
        Err(e @ CommandError::Damaged(_)) => {
            eprintln!("cairn: {e}");
            exit::ERROR
        }
        Err(CommandError::File(e)) => {
            eprintln!("cairn: {e}");
            exit::ERROR
        }
        Err(CommandError::Usage(e)) => {
            eprintln!("cairn: {e}");
            exit::USAGE
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum CommandError {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error(transparent)]
    File(#[from] SnapshotFileError),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Damaged(String),
    #[error("restore cancelled: nothing was changed")]
    Cancelled,
    /// What is not there (a backup a target does not hold).
    #[error("{0}")]
    NotFound(String),
    /// A backup target's failure (`cairn backup`).
    #[error(transparent)]
    Target(#[from] cairn_backup::BackupError),
}

fn io_error(path: &Path, source: std::io::Error) -> CommandError {
    CommandError::File(SnapshotFileError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Waits for `step` for at most `timeout`: a transfer in which nothing moves for that long
/// fails.
async fn moving<T>(
    timeout: Duration,
    what: &str,
    step: impl std::future::Future<Output = T>,
) -> Result<T, ApiError> {
    tokio::time::timeout(timeout, step).await.map_err(|_| {
        ApiError::Unavailable(format!(
            "{what}: nothing moved for {} ms (--timeout-ms)",
            timeout.as_millis()
        ))
    })
}

async fn save(file: &Path, global: &GlobalArgs) -> Result<(), CommandError> {
    let client = crate::admin::client_of(global)?;
    let (header, size, crc) = save_with(&client, file).await?;
    println!(
        "saved {}: index {}, term {}, {} resources, {} bytes, crc32c {:08x}",
        file.display(),
        header.last_log_index,
        header.last_log_term,
        header.resource_count,
        size,
        crc
    );
    Ok(())
}

/// Saves a point-in-time snapshot from the leader `client` finds into `file`, verified
/// before it gets its name; returns its header, size and checksum (`cairn snapshot save`,
/// and `cairn drill restore`'s backup).
pub(crate) async fn save_with(
    client: &AdminClient,
    file: &Path,
) -> Result<(SnapshotHeader, u64, u32), CommandError> {
    let Leader { address, .. } = client.leader().await?;
    let leader = address;
    let timeout = client.timeout();
    let mut admin = client.connect(&leader, client.attempt_timeout()).await?;
    let mut stream = moving(
        timeout,
        "starting the snapshot",
        admin.save_snapshot(pb::SaveSnapshotRequest {}),
    )
    .await?
    .map_err(ApiError::from)?
    .into_inner();
    // Removed on any failure below (TempFile's drop); kept once renamed into place.
    let part = file.with_extension("part");
    let (part, out) = TempFile::create(part.clone()).map_err(|e| io_error(&part, e))?;
    let tmp = part.path();
    let mut out = std::io::BufWriter::new(out);
    let progress = bar(None, &format!("saving from {leader}"));
    let received = async {
        while let Some(chunk) = moving(timeout, "saving the snapshot", stream.message())
            .await?
            .map_err(ApiError::from)?
        {
            out.write_all(&chunk.data).map_err(|e| io_error(tmp, e))?;
            progress.inc(chunk.data.len() as u64);
        }
        Ok::<(), CommandError>(())
    }
    .await;
    progress.finish_and_clear();
    received?;
    let file_handle = out
        .into_inner()
        .map_err(|e| io_error(tmp, e.into_error()))?;
    file_handle.sync_all().map_err(|e| io_error(tmp, e))?;
    // Never give a damaged file the final name.
    let (header, size, crc) = verify_with_checksum(tmp)?;
    std::fs::rename(tmp, file).map_err(|e| io_error(file, e))?;
    part.keep();
    cairn_server::durable::sync_parent(file).map_err(|e| io_error(file, e))?;
    Ok((header, size, crc))
}

/// Verifies a whole file; returns its header, size and checksum.
fn verify_with_checksum(path: &Path) -> Result<(SnapshotHeader, u64, u32), CommandError> {
    let header = snapshot_file::verify(path, |_, _| {})?;
    let bytes = std::fs::metadata(path)
        .map_err(|e| io_error(path, e))?
        .len();
    let mut f = std::fs::File::open(path).map_err(|e| io_error(path, e))?;
    let mut tail = [0u8; 4];
    use std::io::Seek;
    f.seek(std::io::SeekFrom::End(-4))
        .map_err(|e| io_error(path, e))?;
    f.read_exact(&mut tail).map_err(|e| io_error(path, e))?;
    Ok((header, bytes, u32::from_le_bytes(tail)))
}

/// Verifies `file` whole (a progress bar), then prints its header and what it holds; `shown`
/// names it (the file, or the backup it was fetched from).
pub(crate) fn inspect(file: &Path, shown: &str) -> Result<(), CommandError> {
    let size = std::fs::metadata(file)
        .map_err(|e| io_error(file, e))?
        .len();
    let progress = bar(Some(size), "verifying");
    let mut reader = match SnapshotReader::open(file) {
        Ok(r) => r,
        Err(e) => {
            progress.finish_and_clear();
            return Err(CommandError::Damaged(format!("{shown}: DAMAGED: {e}")));
        }
    };
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    loop {
        match reader.next_resource() {
            Ok(Some(r)) => {
                let id = r.id.unwrap_or_default();
                let t = id.r#type.unwrap_or_default();
                let tenancy = id.tenancy.unwrap_or_default();
                *counts
                    .entry((
                        format!("{}.{}.{}", t.group, t.group_version, t.kind),
                        format!("{}/{}", tenancy.partition, tenancy.namespace),
                    ))
                    .or_default() += 1;
                progress.set_position(reader.offset());
            }
            Ok(None) => break,
            Err(e) => {
                progress.finish_and_clear();
                return Err(CommandError::Damaged(format!("{shown}: DAMAGED: {e}")));
            }
        }
    }
    progress.finish_and_clear();
    let h = &reader.header;
    println!(
        "{shown}: OK, {size} bytes, format version {}",
        snapshot_file::SNAPSHOT_FORMAT_VERSION
    );
    println!("cluster id   {}", h.cluster_id);
    println!("index        {}", h.last_log_index);
    println!("term         {}", h.last_log_term);
    println!("resources    {}", h.resource_count);
    println!("membership   {}", h.membership);
    println!("\n{:<40} {:<30} {:>10}", "TYPE", "TENANCY", "COUNT");
    for ((t, tenancy), n) in counts {
        println!("{t:<40} {tenancy:<30} {n:>10}");
    }
    Ok(())
}

/// Asks on the terminal whether to replace the running cluster's data (the answer must be
/// `yes`); refuses without one unless `--yes` was given.
fn confirm(
    yes: bool,
    shown: &str,
    leader: &Leader,
    header: &SnapshotHeader,
    size: u64,
) -> Result<(), CommandError> {
    if yes {
        return Ok(());
    }
    let s = &leader.status;
    let members: Vec<String> = s
        .members
        .iter()
        .map(|m| format!("node {} at {}", m.id, m.client_address))
        .collect();
    eprintln!(
        "This REPLACES ALL THE DATA of the running cluster {cluster} ({count} members: \
         {members}; {resources} resources at commit index {commit}) with {file} ({backup} \
         resources of cluster {from} at index {index}, {size} bytes). Every node's data is \
         replaced and every open watch is closed.",
        cluster = s.cluster_id,
        count = s.members.len(),
        members = members.join(", "),
        resources = s.resource_count,
        commit = s.commit_index,
        file = shown,
        backup = header.resource_count,
        from = header.cluster_id,
        index = header.last_log_index,
    );
    ask_yes("Type yes to restore: ")
}

/// Whether a command may go on to replace the running cluster's data: with `yes` (`--yes`),
/// or with a terminal to ask on later ([`ask_yes`]); a usage error saying `refusal` otherwise.
/// (`cairn snapshot restore`, `cairn backup restore`, `cairn drill restore`.)
pub(crate) fn require_confirmation(
    yes: bool,
    refusal: impl FnOnce() -> String,
) -> Result<(), CommandError> {
    if yes || crate::admin::interactive() {
        Ok(())
    } else {
        Err(CommandError::Usage(refusal()))
    }
}

/// Asks `question` on the terminal; anything but `yes` cancels.
pub(crate) fn ask_yes(question: &str) -> Result<(), CommandError> {
    eprint!("{question}");
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .map_err(|e| CommandError::Usage(format!("cannot read the answer: {e}")))?;
    if answer.trim() == "yes" {
        Ok(())
    } else {
        Err(CommandError::Cancelled)
    }
}

/// Replaces the running cluster's data with `file` (named `shown`), once `how` passed
/// [`RestoreHow::check`]: verified here, confirmed (unless `--yes`), uploaded to the leader,
/// which verifies it again and replicates it.
pub(crate) async fn restore_online(
    file: &Path,
    shown: &str,
    how: &RestoreHow,
    global: &GlobalArgs,
) -> Result<(), CommandError> {
    let client = crate::admin::client_of(global)?;
    let (header, response) = restore_with(&client, file, shown, how.yes).await?;
    println!(
        "restored {shown} ({} resources from index {}) at log index {}; every open watch was closed",
        response.resource_count,
        header.last_log_index,
        response.log_index
    );
    Ok(())
}

/// Replaces the data of the cluster `client` reaches with `file` (named `shown`): verified
/// here, confirmed on the terminal unless `yes`, uploaded to the leader, which verifies it
/// again and replicates it. Returns the backup's header and the leader's answer
/// (`cairn snapshot restore`, `cairn backup restore`, `cairn drill restore`).
pub(crate) async fn restore_with(
    client: &AdminClient,
    file: &Path,
    shown: &str,
    yes: bool,
) -> Result<(SnapshotHeader, pb::RestoreSnapshotResponse), CommandError> {
    let size = std::fs::metadata(file)
        .map_err(|e| io_error(file, e))?
        .len();
    // The whole file is verified here first, and again by the leader before anything changes.
    let check = bar(Some(size), "verifying");
    let header = snapshot_file::verify(file, |_, _| {});
    check.finish_and_clear();
    let header = header?;
    let found = client.leader().await?;
    confirm(yes, shown, &found, &header, size)?;
    let leader = found.address.clone();
    let timeout = client.timeout();
    let mut admin = client.connect(&leader, client.attempt_timeout()).await?;
    let progress = bar(Some(size), &format!("uploading to {leader}"));
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::SnapshotChunk>(4);
    let path = file.to_path_buf();
    let reading_progress = progress.clone();
    let reader = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let mut f = std::fs::File::open(&path)?;
        let mut buf = vec![0u8; cairn_server::admin::SNAPSHOT_CHUNK_BYTES];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                reading_progress
                    .set_message("uploaded; the leader verifies and replicates it".to_string());
                return Ok(());
            }
            reading_progress.inc(n as u64);
            let chunk = pb::SnapshotChunk {
                data: buf[..n].to_vec().into(),
            };
            // A leader that takes nothing for the timeout fails the upload (the call's
            // error, reported below, says so).
            let sent = tokio::runtime::Handle::current()
                .block_on(tokio::time::timeout(timeout, tx.send(chunk)));
            if !matches!(sent, Ok(Ok(()))) {
                return Ok(()); // the call ended early; its error is reported below
            }
        }
    });
    let response = admin
        .restore_snapshot(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(ApiError::from);
    progress.finish_and_clear();
    reader
        .await
        .map_err(|e| CommandError::Usage(e.to_string()))?
        .map_err(|e| io_error(file, e))?;
    Ok((header, response?.into_inner()))
}

/// Seeds one node's data dir of a new cluster from a backup
/// ([`cairn_server::seed::seed_data_dir`], which `cairn recover` uses too), once `how`
/// passed [`RestoreHow::check`].
pub(crate) fn restore_offline(file: &Path, how: &RestoreHow) -> Result<(), CommandError> {
    let data_dir = how
        .data_dir
        .as_ref()
        .ok_or_else(|| CommandError::Usage("--offline needs --data-dir".into()))?;
    let members = how
        .members
        .as_ref()
        .ok_or_else(|| CommandError::Usage("--offline needs --members".into()))?;
    let members =
        parse_members(members).map_err(|e| CommandError::Usage(format!("--members: {e}")))?;
    let bump_index = how.bump_index.unwrap_or(BUMP_INDEX_DEFAULT);
    let seeded = seed_with_progress(file, data_dir, &members, bump_index)?;
    println!(
        "seeded {}: {} resources from index {} of cluster {:?}; the new cluster {} starts at log index {}",
        data_dir.display(),
        seeded.source.resource_count,
        seeded.source.last_log_index,
        seeded.source.cluster_id,
        seeded.cluster_id,
        seeded.log_index
    );
    println!(
        "start the node with the same --members and this --data-dir; do the same for every member"
    );
    Ok(())
}

/// [`cairn_server::seed::seed_data_dir`] with a progress bar per phase.
pub(crate) fn seed_with_progress(
    file: &Path,
    data_dir: &Path,
    members: &[cairn_server::config::MemberConfig],
    bump_index: u64,
) -> Result<cairn_server::seed::Seeded, CommandError> {
    let mut shown: Option<(&'static str, ProgressBar)> = None;
    let result = cairn_server::seed::seed_data_dir(
        file,
        data_dir,
        members,
        bump_index,
        |phase, done, total| {
            if shown.as_ref().is_none_or(|(p, _)| *p != phase) {
                if let Some((_, old)) = shown.take() {
                    old.finish_and_clear();
                }
                shown = Some((phase, bar(Some(total), phase)));
            }
            if let Some((_, bar)) = &shown {
                bar.set_position(done);
            }
        },
    );
    if let Some((_, bar)) = shown {
        bar.finish_and_clear();
    }
    result.map_err(|e| match e {
        cairn_server::seed::SeedError::Usage(m) => CommandError::Usage(m),
        e @ cairn_server::seed::SeedError::NotEmpty(_) => CommandError::Usage(e.to_string()),
        cairn_server::seed::SeedError::File(e) => CommandError::File(e),
    })
}
