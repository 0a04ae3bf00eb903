//! What the target tests share: backup-like files and their check, and a clock.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cairn_backup::{BackupError, Progress, Verified};

pub const HOUR_MS: u64 = 3_600_000;

pub fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Writes a stand-in for a snapshot file: a header line naming the cluster and index,
/// `body_bytes` of pseudo-random bytes (from `seed`), and the crc32c of all that, so that
/// [`verify_file`] tells a whole, unaltered copy from anything else.
pub fn write_backup_file(
    dir: &Path,
    file_name: &str,
    cluster_id: &str,
    index: u64,
    body_bytes: usize,
    seed: u64,
) -> PathBuf {
    let mut content = format!("cairn-test {cluster_id} {index}\n").into_bytes();
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    content.extend((0..body_bytes).map(|_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state as u8
    }));
    let crc = crc32c::crc32c(&content);
    content.extend_from_slice(&crc.to_le_bytes());
    let path = dir.join(file_name);
    std::fs::write(&path, &content).expect("write a backup file");
    path
}

/// The check a caller passes to `put_verified` (the server passes its snapshot check):
/// the trailing crc32c must match, and the header names the cluster and index.
pub fn verify_file(path: &Path) -> Result<Verified, String> {
    let content =
        std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if content.len() < 4 {
        return Err("shorter than its checksum".into());
    }
    let (data, crc) = content.split_at(content.len() - 4);
    let crc = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if crc32c::crc32c(data) != crc {
        return Err("checksum mismatch".into());
    }
    let header_end = data.iter().position(|&b| b == b'\n').ok_or("no header")?;
    let header = std::str::from_utf8(&data[..header_end]).map_err(|_| "header is not UTF-8")?;
    match header.split(' ').collect::<Vec<_>>().as_slice() {
        ["cairn-test", cluster_id, index] => Ok(Verified {
            cluster_id: cluster_id.to_string(),
            index: index.parse().map_err(|_| "bad index")?,
        }),
        _ => Err(format!("bad header {header:?}")),
    }
}

/// What a test expects of a failure: its kind, and words its message holds.
#[track_caller]
pub fn assert_kind<T: std::fmt::Debug>(
    result: Result<T, BackupError>,
    kind: &str,
    words: &[&str],
) -> BackupError {
    let error = result.expect_err("the operation should have failed");
    let message = error.to_string();
    assert_eq!(error.kind(), kind, "{message}");
    for word in words {
        assert!(message.contains(word), "{word:?} is not in: {message}");
    }
    error
}

/// Checks a transfer's progress reports: every phase's bytes grow and end at its total.
#[track_caller]
pub fn assert_progress_complete(events: &[Progress], phase: cairn_backup::Phase, total_bytes: u64) {
    let of_phase: Vec<&Progress> = events.iter().filter(|p| p.phase == phase).collect();
    assert!(!of_phase.is_empty(), "no {phase:?} progress in {events:?}");
    assert!(
        of_phase
            .windows(2)
            .all(|w| w[0].done_bytes <= w[1].done_bytes),
        "{of_phase:?}"
    );
    assert!(
        of_phase.iter().all(|p| p.total_bytes == total_bytes),
        "{of_phase:?}"
    );
    assert_eq!(
        of_phase.last().map(|p| p.done_bytes),
        Some(total_bytes),
        "{of_phase:?}"
    );
}

/// The names in a directory, sorted (sub-directories end with `/`).
pub fn dir_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read the directory")
        .map(|e| {
            let e = e.expect("a directory entry");
            let slash = if e.path().is_dir() { "/" } else { "" };
            format!("{}{slash}", e.file_name().to_string_lossy())
        })
        .collect();
    names.sort();
    names
}

/// Sets a file's modification time `age` ago.
pub fn set_age(path: &Path, age: Duration) {
    let file = std::fs::File::options()
        .write(true)
        .open(path)
        .expect("open to set its time");
    file.set_modified(SystemTime::now() - age)
        .expect("set the modification time");
}

/// Whether the test process may mount file systems; prints why not.
pub fn skip_unless_root(test: &str, needs: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return false;
    }
    println!("SKIPPED {test}: it needs root ({needs}); CI runs it as root");
    eprintln!("SKIPPED {test}: it needs root ({needs}); CI runs it as root");
    true
}
