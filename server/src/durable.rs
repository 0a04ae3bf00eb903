//! The node's small files on disk, written and read one way: the data dir's identity files
//! (`raft::identity`, and the cluster id `cairn snapshot restore --offline` seeds) and the
//! damaged-data marker (`fatal`); and the one directory fsync after a snapshot file's rename
//! (`snapshot_file`, `cairn snapshot save`).
//!
//! Invariants: a crash leaves a file written here old or new, never torn (the Raft log's
//! [`cairn_raft_log::write_file_atomically`]: temporary file, fsync, rename, fsync of the
//! directory); a read here never reads more than one byte beyond its bound.

use std::io::{self, Read as _};
use std::path::Path;

/// Writes `bytes` to `path` durably: a crash leaves the old file or the new one.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let (Some(dir), Some(name)) = (parent(path), path.file_name().and_then(|n| n.to_str())) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file in a directory", path.display()),
        ));
    };
    cairn_raft_log::write_file_atomically(dir, name, bytes, true).map_err(|e| match e {
        // The operating system's error, as a write here always returned it.
        cairn_raft_log::LogError::Io { source, .. } => source,
        other => io::Error::other(other.to_string()),
    })
}

/// Reads a small text file, trimmed; `None` when it does not exist. A file longer than
/// `bytes_max` is refused (`InvalidData`) after reading at most one byte more.
pub(crate) fn read_small(path: &Path, bytes_max: u64) -> io::Result<Option<String>> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    file.take(bytes_max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > bytes_max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} holds more than {bytes_max} bytes", path.display()),
        ));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not text: {e}", path.display()),
        )
    })?;
    Ok(Some(text.trim().to_string()))
}

/// fsyncs the directory holding `path`, so that a name created in it (a rename) is durable.
pub fn sync_parent(path: &Path) -> io::Result<()> {
    let Some(dir) = parent(path) else {
        return Ok(());
    };
    std::fs::File::open(dir)?.sync_all()
}

/// The directory holding `path`: `.` for a bare file name, `None` for a root.
fn parent(path: &Path) -> Option<&Path> {
    path.parent().map(|dir| {
        if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_file_is_written_whole_and_read_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster_id");
        assert_eq!(read_small(&path, 16).unwrap(), None);
        write_atomically(&path, b"c0ffee\n").unwrap();
        write_atomically(&path, b"decaf\n").unwrap();
        assert_eq!(read_small(&path, 16).unwrap().as_deref(), Some("decaf"));
        assert!(!dir.path().join("cluster_id.tmp").exists());
        std::fs::write(&path, [b'x'; 17]).unwrap();
        let e = read_small(&path, 16).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("more than 16 bytes"), "{e}");
    }
}
