//! `cairn backup list | verify | restore`: what a scheduled backups' target holds (the
//! leader writes them: `cairn_server::backup`), read from the target itself, not through a
//! node. The target and its S3 settings are the agent's (`--target` and `--s3-*`, read from
//! the same `CAIRN_BACKUP_*` environment variables as `backup_target` and `backup_s3_*`),
//! parsed by the one parser of both (`cairn_server::config::BackupTargetSettings`).
//!
//! `verify` and `restore` fetch a backup (the newest, of one cluster with `--cluster-id`, or
//! the one named) into a temporary file of `--download-dir` with a progress bar; `verify`
//! then checks it whole and prints its header, `restore` hands it to `cairn snapshot
//! restore`'s own code (`crate::snapshot::restore_online` with its confirmation,
//! `crate::snapshot::restore_offline`), after the same checks of its flags, made before
//! anything is fetched.

use std::path::PathBuf;

use cairn_backup::{BackupName, BackupTarget, Listing, Phase, StoredBackup};
use cairn_server::config::BackupTargetSettings;
use clap::{Args, Subcommand};

use crate::common::{GlobalArgs, OutputFormat};
use crate::snapshot::{bar, CommandError, RestoreHow};

#[derive(Subcommand)]
pub enum BackupCommand {
    /// List the backups in a target, newest first: name, cluster, index, creation time, size.
    List(ListArgs),
    /// Fetch a backup (the newest, or NAME), verify it whole (checksum, every record) and
    /// print its header and what it holds.
    Verify(FetchArgs),
    /// Fetch a backup (the newest, or NAME) and restore it: into the RUNNING cluster (asks
    /// first; --yes when not on a terminal), or with --offline seed a new cluster's data dir.
    Restore(RestoreArgs),
}

/// Where the backups are: the agent's `backup_target` and `backup_s3_*`, as flags.
#[derive(Args, Debug, Clone)]
pub struct TargetArgs {
    /// The target: an absolute directory (or file:///DIR) or s3://BUCKET/PREFIX, as the
    /// agent's backup_target.
    #[arg(long, env = "CAIRN_BACKUP_TARGET")]
    target: String,
    /// With an s3:// target: the URL of an S3-compatible server (unset: AWS).
    #[arg(long, env = "CAIRN_BACKUP_S3_ENDPOINT")]
    s3_endpoint: Option<String>,
    /// With an s3:// target: the region to sign for (unset: AWS_REGION, else us-east-1).
    #[arg(long, env = "CAIRN_BACKUP_S3_REGION")]
    s3_region: Option<String>,
    /// With an s3:// target: allow a plain http:// endpoint.
    #[arg(long, env = "CAIRN_BACKUP_S3_ALLOW_HTTP")]
    s3_allow_http: bool,
    /// With an s3:// target: an AWS shared credentials file (profile AWS_PROFILE, else
    /// default); unset: the AWS_* environment variables.
    #[arg(long, env = "CAIRN_BACKUP_S3_CREDENTIALS_FILE")]
    s3_credentials_file: Option<PathBuf>,
}

impl TargetArgs {
    /// The target opened (an S3 bucket is reached at the first operation).
    fn open(&self) -> Result<BackupTarget, CommandError> {
        let settings = BackupTargetSettings {
            target: self.target.clone(),
            s3_endpoint: self.s3_endpoint.clone(),
            s3_region: self.s3_region.clone(),
            s3_allow_http: self.s3_allow_http,
            s3_credentials_file: self.s3_credentials_file.clone(),
        };
        let spec = settings
            .spec()
            .map_err(|e| CommandError::Usage(format!("{}: {}", flag_of(e.field), e.reason)))?;
        Ok(BackupTarget::open(&spec)?)
    }
}

/// The flag of a backup setting's key, as `cairn backup` names it.
fn flag_of(field: &str) -> &'static str {
    match field {
        "backup_s3_endpoint" => "--s3-endpoint",
        "backup_s3_region" => "--s3-region",
        "backup_s3_allow_http" => "--s3-allow-http",
        "backup_s3_credentials_file" => "--s3-credentials-file",
        _ => "--target",
    }
}

#[derive(Args)]
pub struct ListArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Only this cluster's backups.
    #[arg(long)]
    cluster_id: Option<String>,
}

#[derive(Args)]
pub struct FetchArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// The backup's name (`cairn backup list`); default: the newest.
    name: Option<String>,
    /// Without NAME: the newest of this cluster's backups (default: of any cluster).
    #[arg(long)]
    cluster_id: Option<String>,
    /// Where the backup is downloaded to (a temporary file, removed afterwards; it needs
    /// room for the whole backup).
    #[arg(long, env = "TMPDIR", default_value = "/tmp")]
    download_dir: PathBuf,
}

#[derive(Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    fetch: FetchArgs,
    #[command(flatten)]
    how: RestoreHow,
}

pub fn run(command: BackupCommand, global: &GlobalArgs) -> u8 {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let result = match command {
        BackupCommand::List(args) => runtime.block_on(list(&args, global.output)),
        BackupCommand::Verify(args) => runtime.block_on(verify(&args)),
        BackupCommand::Restore(args) => runtime.block_on(restore(&args, global)),
    };
    crate::snapshot::exit_of(result)
}

/// The backups `listing` holds of `cluster_id` (all of them without one), newest first.
fn of_cluster<'a>(listing: &'a Listing, cluster_id: Option<&str>) -> Vec<&'a StoredBackup> {
    listing
        .backups
        .iter()
        .filter(|b| cluster_id.is_none_or(|id| b.cluster_id() == id))
        .collect()
}

/// A Unix time in milliseconds as UTC, `2026-11-29T13:47:59.123Z` (civil from days:
/// Howard Hinnant's algorithm).
fn utc(unix_ms: u64) -> String {
    let days = (unix_ms / 86_400_000) as i64;
    let ms_of_day = unix_ms % 86_400_000;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        ms_of_day / 3_600_000,
        ms_of_day / 60_000 % 60,
        ms_of_day / 1_000 % 60,
        ms_of_day % 1_000
    )
}

async fn list(args: &ListArgs, output: OutputFormat) -> Result<(), CommandError> {
    let target = args.target.open()?;
    let listing = target.list().await?;
    let backups = of_cluster(&listing, args.cluster_id.as_deref());
    match output {
        OutputFormat::Json => {
            let rows: Vec<serde_json::Value> = backups
                .iter()
                .map(|b| {
                    serde_json::json!({
                        "name": b.name.file_name(),
                        "cluster_id": b.cluster_id(),
                        "index": b.index(),
                        "created_unix_ms": b.created_unix_ms(),
                        "created": utc(b.created_unix_ms()),
                        "size_bytes": b.size_bytes,
                    })
                })
                .collect();
            out!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "target": target.description(),
                    "backups": rows,
                    "leftovers": listing.leftovers.len(),
                    "foreign_objects": listing.foreign_count,
                }))
                .unwrap_or_default()
            );
        }
        OutputFormat::Table => {
            out!(
                "{:<24} {:>12} {:>14}  NAME",
                "CREATED (UTC)",
                "INDEX",
                "SIZE (BYTES)"
            );
            for b in &backups {
                out!(
                    "{:<24} {:>12} {:>14}  {}",
                    utc(b.created_unix_ms()),
                    b.index(),
                    b.size_bytes,
                    b.name
                );
            }
            eprintln!(
                "{} backup(s) in {}{}",
                backups.len(),
                target.description(),
                match listing.ignored_count() {
                    0 => String::new(),
                    n => format!(
                        " ({} unfinished upload(s) and {} other object(s) passed over)",
                        listing.leftovers.len(),
                        n - listing.leftovers.len()
                    ),
                }
            );
        }
    }
    Ok(())
}

/// A fetched backup: its temporary file (removed with the directory when dropped).
struct Fetched {
    name: BackupName,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

/// Fetches the backup `args` names (or the newest) with a progress bar.
async fn fetch(args: &FetchArgs, target: &BackupTarget) -> Result<Fetched, CommandError> {
    let listing = target.list().await?;
    let backups = of_cluster(&listing, args.cluster_id.as_deref());
    let chosen = match &args.name {
        Some(name) => {
            let name = BackupName::parse(name.trim())
                .map_err(|e| CommandError::Usage(format!("NAME: {e}")))?;
            backups
                .iter()
                .find(|b| b.name == name)
                .map(|b| (*b).clone())
                .ok_or_else(|| {
                    CommandError::NotFound(format!(
                        "{} holds no backup {name}{} (`cairn backup list` shows what it holds)",
                        target.description(),
                        args.cluster_id
                            .as_deref()
                            .map(|id| format!(" of cluster {id}"))
                            .unwrap_or_default()
                    ))
                })?
        }
        None => backups.first().map(|b| (*b).clone()).ok_or_else(|| {
            CommandError::NotFound(format!(
                "{} holds no backup{}",
                target.description(),
                args.cluster_id
                    .as_deref()
                    .map(|id| format!(" of cluster {id}"))
                    .unwrap_or_default()
            ))
        })?,
    };
    let dir = tempfile::Builder::new()
        .prefix(".cairn-backup-")
        .tempdir_in(&args.download_dir)
        .map_err(|e| {
            CommandError::Usage(format!(
                "--download-dir {}: {e}",
                args.download_dir.display()
            ))
        })?;
    let path = dir.path().join(chosen.name.file_name());
    let progress = bar(
        Some(chosen.size_bytes),
        &format!("fetching {}", chosen.name),
    );
    let fetched = target
        .fetch(&chosen.name, &path, |p| {
            if p.phase == Phase::Fetch {
                progress.set_position(p.done_bytes);
            }
        })
        .await;
    progress.finish_and_clear();
    fetched?;
    Ok(Fetched {
        name: chosen.name,
        path,
        _dir: dir,
    })
}

/// The header of a fetched backup must name the cluster and index its name does.
fn check_names(fetched: &Fetched) -> Result<(), CommandError> {
    let header = cairn_server::snapshot_file::SnapshotReader::open(&fetched.path)?.header;
    if header.cluster_id != fetched.name.cluster_id()
        || header.last_log_index != fetched.name.index()
    {
        return Err(CommandError::Damaged(format!(
            "{}: DAMAGED: it holds cluster {} at index {}, but its name says cluster {} at index {}",
            fetched.name,
            header.cluster_id,
            header.last_log_index,
            fetched.name.cluster_id(),
            fetched.name.index()
        )));
    }
    Ok(())
}

async fn verify(args: &FetchArgs) -> Result<(), CommandError> {
    let target = args.target.open()?;
    let fetched = fetch(args, &target).await?;
    check_names(&fetched)?;
    println!("{}: fetched from {}", fetched.name, target.description());
    crate::snapshot::inspect(&fetched.path, &fetched.name.to_string())
}

async fn restore(args: &RestoreArgs, global: &GlobalArgs) -> Result<(), CommandError> {
    // The flags are checked before anything is fetched.
    let shown = args
        .fetch
        .name
        .clone()
        .unwrap_or_else(|| "the newest backup".to_string());
    let offline_command = format!(
        "cairn backup restore --offline --target {} {}",
        args.fetch.target.target,
        args.fetch.name.as_deref().unwrap_or("")
    );
    args.how.check(&shown, offline_command.trim_end())?;
    let target = args.fetch.target.open()?;
    let fetched = fetch(&args.fetch, &target).await?;
    check_names(&fetched)?;
    let shown = format!("{} (from {})", fetched.name, target.description());
    if args.how.offline() {
        crate::snapshot::restore_offline(&fetched.path, &args.how)
    } else {
        crate::snapshot::restore_online(&fetched.path, &shown, &args.how, global).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_shown_in_utc() {
        for (unix_ms, text) in [
            (0, "1970-01-01T00:00:00.000Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
            (1_764_418_800_123, "2025-11-29T12:20:00.123Z"),
            (4_102_444_799_999, "2099-12-31T23:59:59.999Z"),
        ] {
            assert_eq!(utc(unix_ms), text, "{unix_ms}");
        }
    }

    #[test]
    fn a_setting_error_names_the_flag() {
        for (field, flag) in [
            ("backup_target", "--target"),
            ("backup_s3_endpoint", "--s3-endpoint"),
            ("backup_s3_region", "--s3-region"),
            ("backup_s3_allow_http", "--s3-allow-http"),
            ("backup_s3_credentials_file", "--s3-credentials-file"),
        ] {
            assert_eq!(flag_of(field), flag);
        }
    }
}
