//! `cairn recover`: a new cluster from what the survivors of a lost quorum hold, offline.
//!
//! Without `--members` it only reads: for each `--data-dir` (a stopped node's), what its log
//! holds (last term and index, the commit index it knew, its snapshot), and which one holds
//! the most up-to-date log (Raft's order: last term, then last index). With `--members` it
//! also recovers from that one:
//! 1. replays every entry its log holds, committed or not, over its snapshot
//!    ([`cairn_server::raft::replay`]) into a snapshot file (`--snapshot-out`);
//! 2. moves its data dir aside (`DIR.before-recover-<unix seconds>`, kept for the report);
//! 3. seeds a fresh `DIR` for the new cluster `--members` from that file, `--bump-index`
//!    above its last entry ([`cairn_server::seed`], as `snapshot restore --offline` does),
//!    and prints the command that seeds every other new member from the same file.
//!
//! Entries past the commit index the survivor knew may hold writes that were never
//! acknowledged (their clients saw a failure or no answer): the output says how many.

use std::path::PathBuf;

use clap::Args;

use crate::common::{exit, GlobalArgs, OutputFormat};
use crate::snapshot::{bar, seed_with_progress, CommandError, BUMP_INDEX_DEFAULT};
use cairn_server::config::parse_members;
use cairn_server::raft::replay::{self, LogSummary, ReplayError};

#[derive(Args)]
pub struct RecoverArgs {
    /// A stopped survivor's data dir; repeat for each survivor whose dir is reachable here.
    #[arg(long = "data-dir", required = true)]
    data_dirs: Vec<PathBuf>,
    /// Recover: the NEW cluster's members, ID=PEER/CLIENT,... Without it, only report.
    #[arg(long)]
    members: Option<String>,
    /// With --members: where to write the recovered state, as a snapshot file that seeds
    /// the other new members [default: recovered-OLD_CLUSTER_ID-INDEX.snap beside the
    /// chosen data dir].
    #[arg(long)]
    snapshot_out: Option<PathBuf>,
    /// With --members: start the new log this far above the survivor's last entry
    /// [default: 1000000000].
    #[arg(long)]
    bump_index: Option<u64>,
}

pub fn run(args: RecoverArgs, global: &GlobalArgs) -> u8 {
    match crate::common::runtime().block_on(recover(&args, global.output)) {
        Ok(()) => exit::OK,
        Err(CommandError::Usage(e)) => {
            eprintln!("cairn: {e}");
            exit::USAGE
        }
        Err(e) => {
            eprintln!("cairn: {e}");
            exit::ERROR
        }
    }
}

/// Index of the most up-to-date survivor: the highest rank ([`LogSummary::rank`]), the first
/// given on a tie. Refuses survivors of different clusters.
pub fn choose(survivors: &[LogSummary]) -> Result<usize, String> {
    assert!(!survivors.is_empty(), "clap requires one --data-dir");
    if let Some(other) = survivors
        .iter()
        .find(|s| s.cluster_id != survivors[0].cluster_id)
    {
        return Err(format!(
            "{} belongs to cluster {:?} and {} to cluster {:?}: give the survivors of one cluster",
            survivors[0].data_dir.display(),
            survivors[0].cluster_id,
            other.data_dir.display(),
            other.cluster_id
        ));
    }
    let mut best = 0;
    for (i, s) in survivors.iter().enumerate() {
        if s.rank() > survivors[best].rank() {
            best = i;
        }
    }
    Ok(best)
}

fn replay_error(e: ReplayError) -> CommandError {
    match e {
        e @ ReplayError::NotADataDir(_) => CommandError::Usage(e.to_string()),
        e => CommandError::Damaged(e.to_string()),
    }
}

fn print_survivors(survivors: &[LogSummary], best: usize) {
    out!(
        "{:<40} {:>5} {:>10} {:>12} {:>12} {:>12}  ",
        "DATA DIR",
        "NODE",
        "LAST TERM",
        "LAST INDEX",
        "COMMITTED",
        "SNAPSHOT"
    );
    for (i, s) in survivors.iter().enumerate() {
        out!(
            "{:<40} {:>5} {:>10} {:>12} {:>12} {:>12}  {}",
            s.data_dir.display().to_string(),
            s.node_id.map_or("-".to_string(), |id| id.to_string()),
            s.last_log_term,
            s.last_log_index,
            s.committed_index,
            s.snapshot_index,
            if i == best { "<- most up to date" } else { "" }
        );
    }
}

async fn recover(args: &RecoverArgs, output: OutputFormat) -> Result<(), CommandError> {
    let members = match &args.members {
        Some(m) => {
            Some(parse_members(m).map_err(|e| CommandError::Usage(format!("--members: {e}")))?)
        }
        None => {
            for (given, flag) in [
                (args.snapshot_out.is_some(), "--snapshot-out"),
                (args.bump_index.is_some(), "--bump-index"),
            ] {
                if given {
                    return Err(CommandError::Usage(format!(
                        "{flag} belongs to a recovery: give --members too"
                    )));
                }
            }
            None
        }
    };
    let mut survivors = Vec::new();
    for dir in &args.data_dirs {
        survivors.push(replay::inspect(dir).await.map_err(replay_error)?);
    }
    let best = choose(&survivors).map_err(CommandError::Usage)?;
    let Some(members) = members else {
        match output {
            OutputFormat::Json => out!(
                "{}",
                serde_json::json!({ "survivors": survivors, "most_up_to_date": survivors[best].data_dir })
            ),
            OutputFormat::Table => {
                print_survivors(&survivors, best);
                out!(
                    "recover from {} with: cairn recover --data-dir {} --members ID=PEER/CLIENT,...",
                    survivors[best].data_dir.display(),
                    survivors[best].data_dir.display()
                );
            }
        }
        return Ok(());
    };
    if members.is_empty() {
        return Err(CommandError::Usage("--members is empty".into()));
    }
    let bump_index = args.bump_index.unwrap_or(BUMP_INDEX_DEFAULT);
    if bump_index == 0 {
        return Err(CommandError::Usage("--bump-index must be positive".into()));
    }
    let chosen = &survivors[best];
    if output == OutputFormat::Table {
        print_survivors(&survivors, best);
    }
    let dir = chosen.data_dir.clone();
    let snapshot_out = args.snapshot_out.clone().unwrap_or_else(|| {
        dir.with_file_name(format!(
            "recovered-{}-{}.snap",
            chosen.cluster_id, chosen.last_log_index
        ))
    });
    if snapshot_out.exists() {
        return Err(CommandError::Usage(format!(
            "{} exists already: remove it or give --snapshot-out",
            snapshot_out.display()
        )));
    }
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let file_name = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "data".into());
    let aside = dir.with_file_name(format!("{file_name}.before-recover-{seconds}"));
    if aside.exists() {
        return Err(CommandError::Usage(format!(
            "{} exists already: try again in a second",
            aside.display()
        )));
    }
    // 1. Replay.
    let progress = bar(
        Some(chosen.last_log_index - chosen.snapshot_index),
        "replaying",
    );
    progress.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} entries ({eta})")
            .expect("template")
            .progress_chars("=> "),
    );
    let replayed = replay::replay(&dir, &snapshot_out, |done, _| progress.set_position(done))
        .await
        .map_err(replay_error)?;
    progress.finish_and_clear();
    assert_eq!(
        replayed.header.last_log_index, chosen.last_log_index,
        "the replay reached the survivor's last entry"
    );
    // 2. Keep the survivor's data aside, 3. seed its dir for the new cluster.
    std::fs::rename(&dir, &aside).map_err(|e| {
        CommandError::Damaged(format!(
            "moving {} to {}: {e}",
            dir.display(),
            aside.display()
        ))
    })?;
    let seeded = seed_with_progress(&snapshot_out, &dir, &members, bump_index)?;
    let past_commit = chosen.last_log_index.saturating_sub(chosen.committed_index);
    let members_text = args.members.clone().unwrap_or_default();
    match output {
        OutputFormat::Json => out!(
            "{}",
            serde_json::json!({
                "survivor": chosen,
                "snapshot": snapshot_out,
                "kept_aside": aside,
                "resources": replayed.header.resource_count,
                "entries_replayed": replayed.entries_applied,
                "entries_past_commit": past_commit,
                "new_cluster_id": seeded.cluster_id,
                "new_log_index": seeded.log_index,
            })
        ),
        OutputFormat::Table => {
            out!(
                "recovered {} resources from {} (node {}): its snapshot at index {} and {} log \
                 entries after it, through index {} (term {})",
                replayed.header.resource_count,
                aside.display(),
                chosen.node_id.map_or("?".into(), |id| id.to_string()),
                chosen.snapshot_index,
                replayed.entries_applied,
                chosen.last_log_index,
                chosen.last_log_term
            );
            if past_commit == 0 {
                out!(
                    "every entry it held was known to it as committed (through index {})",
                    chosen.committed_index
                );
            } else {
                out!(
                    "{past_commit} {} (indexes {} to {}) past the commit index it knew ({}): \
                     kept, and may hold writes that were never acknowledged",
                    if past_commit == 1 {
                        "entry lies"
                    } else {
                        "entries lie"
                    },
                    chosen.committed_index + 1,
                    chosen.last_log_index,
                    chosen.committed_index
                );
            }
            out!(
                "seeded {} for the new cluster {} (log index {}); the state is in {}, the old \
                 data in {}",
                dir.display(),
                seeded.cluster_id,
                seeded.log_index,
                snapshot_out.display(),
                aside.display()
            );
            out!(
                "seed every other new member with: cairn snapshot restore --offline {} \
                 --data-dir DIR --members {members_text}{}",
                snapshot_out.display(),
                if bump_index == BUMP_INDEX_DEFAULT {
                    String::new()
                } else {
                    format!(" --bump-index {bump_index}")
                }
            );
            out!("then start every new member with those --members (docs/operations.md, \"Quorum loss\")");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn survivor(dir: &str, cluster: &str, term: u64, index: u64, committed: u64) -> LogSummary {
        LogSummary {
            data_dir: dir.into(),
            node_id: None,
            cluster_id: cluster.into(),
            snapshot_index: 0,
            last_log_term: term,
            last_log_index: index,
            committed_index: committed,
        }
    }

    #[test]
    fn the_most_up_to_date_log_is_chosen_in_rafts_order() {
        // (survivors as (dir, term, last index, committed), expected choice)
        type Case = (&'static [(&'static str, u64, u64, u64)], &'static str);
        let table: &[Case] = &[
            (&[("a", 2, 10, 9)], "a"),
            // A higher last term wins over a longer log of an older term.
            (&[("a", 2, 90, 80), ("b", 3, 50, 40)], "b"),
            // Same term: the longer log.
            (&[("a", 3, 50, 40), ("b", 3, 60, 40)], "b"),
            // Same last entry: the one that knew more to be committed.
            (&[("a", 3, 60, 40), ("b", 3, 60, 59)], "b"),
            // A full tie: the first given.
            (&[("a", 3, 60, 59), ("b", 3, 60, 59)], "a"),
        ];
        for (given, expected) in table {
            let survivors: Vec<_> = given
                .iter()
                .map(|(d, t, i, c)| survivor(d, "c1", *t, *i, *c))
                .collect();
            let chosen = choose(&survivors).expect("one cluster");
            assert_eq!(
                survivors[chosen].data_dir,
                PathBuf::from(expected),
                "{given:?}"
            );
        }
    }

    #[test]
    fn survivors_of_two_clusters_are_refused() {
        let e = choose(&[survivor("a", "c1", 1, 1, 1), survivor("b", "c2", 1, 1, 1)])
            .expect_err("two clusters");
        assert!(e.contains("\"c1\"") && e.contains("\"c2\""), "{e}");
    }
}
