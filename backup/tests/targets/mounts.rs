//! Directory targets on real mounts: a full one, and one that refuses writes. Mounting
//! needs root (CI runs as root): each test says so and skips otherwise.

use std::path::{Path, PathBuf};
use std::process::Command;

use cairn_backup::{BackupName, BackupTarget, Limits, TargetSpec};

use crate::support::*;

const CLUSTER: &str = "c1";

/// A tmpfs mounted at a fresh directory with `options`; unmounted (lazily) on drop.
struct Tmpfs {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    /// The mount, or why it could not be made (printed by the caller as a skip).
    fn mount(options: &str) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().join("mnt");
        std::fs::create_dir(&path).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(&path)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs -o {options} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs { path, _dir: dir })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

fn mount_or_skip(test: &str, options: &str) -> Option<Tmpfs> {
    if skip_unless_root(test, "mount -t tmpfs") {
        return None;
    }
    match Tmpfs::mount(options) {
        Ok(mount) => Some(mount),
        Err(why) => {
            println!("SKIPPED {test}: {why}");
            eprintln!("SKIPPED {test}: {why}");
            None
        }
    }
}

fn open(dir: &Path) -> BackupTarget {
    let spec = TargetSpec::parse(dir.to_str().unwrap()).unwrap();
    BackupTarget::open(&spec).unwrap().with_limits(Limits {
        part_bytes: 64 * 1024,
        ..Limits::default()
    })
}

#[tokio::test]
async fn a_full_directory_is_reported_full_and_keeps_no_partial_backup() {
    let test = "a_full_directory_is_reported_full_and_keeps_no_partial_backup";
    let Some(mount) = mount_or_skip(test, "size=256k") else {
        return;
    };
    let local = tempfile::tempdir().unwrap();
    let target = open(&mount.path);

    // 1 MiB into 256 KiB: the upload runs out of room.
    let big = write_backup_file(local.path(), "big", CLUSTER, 2, 1024 * 1024, 1);
    let name = BackupName::new(CLUSTER, 1, 2).unwrap();
    let result = target.put_verified(&big, &name, verify_file, |_| {}).await;
    assert_kind(
        result,
        "full",
        &[
            "is full",
            &mount.path.display().to_string(),
            &name.part_file_name(),
        ],
    );
    // No final object, no `.part`, no staging file: the room is given back.
    assert_eq!(dir_entries(&mount.path), Vec::<String>::new());

    // A backup that fits still goes in (the mount works; it was only full).
    let small = write_backup_file(local.path(), "small", CLUSTER, 3, 100 * 1024, 2);
    let fits = BackupName::new(CLUSTER, 2, 3).unwrap();
    target
        .put_verified(&small, &fits, verify_file, |_| {})
        .await
        .expect("a backup that fits");
    assert_eq!(dir_entries(&mount.path), vec![fits.file_name()]);
}

#[tokio::test]
async fn a_read_only_directory_refuses_and_still_lists() {
    let test = "a_read_only_directory_refuses_and_still_lists";
    // Read-only: chmod does not stop root, a read-only mount does.
    let Some(mount) = mount_or_skip(test, "ro,size=1m") else {
        return;
    };
    let local = tempfile::tempdir().unwrap();
    let target = open(&mount.path);
    let file = write_backup_file(local.path(), "snap", CLUSTER, 2, 10_000, 1);
    let name = BackupName::new(CLUSTER, 1, 2).unwrap();
    let result = target.put_verified(&file, &name, verify_file, |_| {}).await;
    assert_kind(
        result,
        "refused",
        &["refused", &mount.path.display().to_string()],
    );
    let listing = target.list().await.expect("a read-only target still lists");
    assert!(listing.backups.is_empty() && listing.ignored_count() == 0);
}
