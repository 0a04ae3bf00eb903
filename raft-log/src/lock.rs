//! An exclusive, advisory lock on a directory: `flock(LOCK_EX | LOCK_NB)` on `<dir>/LOCK`, which
//! holds the owner's pid so that the loser can name the holder.

use std::fs::File;
use std::fs::OpenOptions;
use std::io::Read;
use std::io::Seek;
use std::io::SeekFrom;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::path::PathBuf;

use crate::LogError;

/// Name of the lock file inside a locked directory.
pub const LOCK_FILE_NAME: &str = "LOCK";

/// Holds the lock on a directory until dropped. The kernel releases an `flock` when its file
/// description closes, so a crashed holder never leaves the directory locked.
#[derive(Debug)]
pub struct DirLock {
    file: File,
    dir: PathBuf,
}

impl DirLock {
    /// Creates `dir` if needed and takes its lock, writing our pid into the lock file.
    ///
    /// Fails with [`LogError::Locked`] naming the holder's pid when another process — or another
    /// `DirLock` in this process — holds it.
    pub fn acquire(dir: &Path) -> Result<DirLock, LogError> {
        let created = !dir.exists();
        std::fs::create_dir_all(dir)
            .map_err(|e| LogError::io(format!("create directory {}", dir.display()), e))?;
        if created {
            // The new directory's name must survive a power cut before anything relies on it.
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                fsync_directory(parent)?;
            }
        }
        let path = dir.join(LOCK_FILE_NAME);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| LogError::io(format!("open lock file {}", path.display()), e))?;
        let locked = try_flock_exclusive(&file)
            .map_err(|e| LogError::io(format!("flock {}", path.display()), e))?;
        if !locked {
            let mut contents = String::new();
            let holder_pid = match file.read_to_string(&mut contents) {
                Ok(_) => contents.trim().parse::<u32>().ok(),
                Err(_) => None,
            };
            return Err(LogError::Locked {
                dir: dir.to_path_buf(),
                holder_pid,
            });
        }
        let pid = std::process::id();
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(format!("{pid}\n").as_bytes()))
            .and_then(|()| file.sync_data())
            .map_err(|e| LogError::io(format!("write pid to lock file {}", path.display()), e))?;
        Ok(DirLock {
            file,
            dir: dir.to_path_buf(),
        })
    }

    /// The locked directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// `flock(LOCK_EX | LOCK_NB)` on `file`: `Ok(false)` when another file description holds the
/// lock. The lock goes when `file` (its last handle) closes.
pub(crate) fn try_flock_exclusive(file: &File) -> std::io::Result<bool> {
    // SAFETY: flock on a file descriptor we own; no memory is passed.
    let ret = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if ret == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

/// Releases `file`'s flock now, instead of when its last handle closes: a
/// duplicate of the descriptor leaked to a process forked meanwhile (by another
/// thread, before that process's exec closes it) would keep the lock until then.
pub(crate) fn unlock(file: &File) {
    // SAFETY: flock on a file descriptor we own; no memory is passed.
    let _ = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
}

/// fsyncs a directory, so that the names created in it are durable.
pub(crate) fn fsync_directory(dir: &Path) -> Result<(), LogError> {
    File::open(dir)
        .and_then(|handle| handle.sync_all())
        .map_err(|e| LogError::io(format!("fsync directory {}", dir.display()), e))
}

/// Writes `dir/name` so that a crash leaves either no file or the whole one: the bytes go to
/// a temporary file, which is fsynced and renamed over `name`; then the directory is fsynced
/// (when `fsync_directory`), so that the name is durable too.
pub fn write_file_atomically(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    fsync_directory: bool,
) -> Result<(), LogError> {
    let path = dir.join(name);
    let temporary = dir.join(format!("{name}.tmp"));
    let write = || -> std::io::Result<()> {
        let mut file = File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, &path)
    };
    write().map_err(|e| LogError::io(format!("write {}", path.display()), e))?;
    if fsync_directory {
        self::fsync_directory(dir)?;
    }
    Ok(())
}

impl Drop for DirLock {
    fn drop(&mut self) {
        unlock(&self.file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_in_same_process_names_our_pid() {
        // Two DirLocks on one directory: the second fails and names the first holder's pid.
        let dir = tempfile::tempdir().expect("tempdir");
        let first = DirLock::acquire(dir.path()).expect("first lock");
        match DirLock::acquire(dir.path()) {
            Err(LogError::Locked { holder_pid, .. }) => {
                assert_eq!(holder_pid, Some(std::process::id()))
            }
            other => panic!("expected Locked, got {other:?}"),
        }
        drop(first);
        DirLock::acquire(dir.path()).expect("lock is free again after drop");
    }

    #[test]
    fn an_unlocked_file_frees_its_lock_while_a_duplicate_descriptor_lives() {
        // A duplicate of a locked descriptor (as a process forked meanwhile holds until
        // its exec) keeps the lock after the original closes, unless it was unlocked.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        std::fs::write(&path, b"").expect("create");
        let open = || File::open(&path).expect("open");
        for unlock_first in [false, true] {
            let probe = open();
            assert!(try_flock_exclusive(&probe).expect("flock"));
            let leaked = probe.try_clone().expect("dup");
            if unlock_first {
                unlock(&probe);
            }
            drop(probe);
            let free = try_flock_exclusive(&open()).expect("flock");
            assert_eq!(free, unlock_first, "unlocked first: {unlock_first}");
            drop(leaked);
        }
    }
}
