//! The durable watermark: a tiny file beside the engine, `<dir>/WATERMARK`, recording a *lower
//! bound* of the last log index (entry or purge point) that the engine has made durable.
//!
//! Why: sled recovers its log by replaying records until the first one that fails its own
//! checksum and silently drops everything after it. A flipped bit in the middle of sled's log
//! would therefore make durable, acknowledged entries vanish without an error. The watermark is
//! written (no fsync) *after* each durability point, so it never claims more than was durable;
//! on open, an engine whose log ends below the watermark has lost entries, which is reported as
//! [`crate::LogError::Corrupt`] naming the first missing index.
//!
//! Truncation moves the end of the log backwards: the lowered watermark is written and fsynced
//! *before* entries are deleted, so a crash can never leave a watermark above the log.
//!
//! Layout (13 bytes, one `pwrite` at offset 0): crc32c (4, big endian) over the rest, a flag
//! byte (1 = has an index), the index (8, big endian). A torn or damaged file is ignored with a
//! warning (the watermark is a detector, not the source of truth).

use std::fs::File;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::path::PathBuf;

use crate::LogError;

/// Name of the watermark file in a store's directory.
pub(crate) const WATERMARK_FILE_NAME: &str = "WATERMARK";
const WATERMARK_LEN_BYTES: usize = 13;

pub(crate) struct Watermark {
    file: File,
    path: PathBuf,
    /// What the file says now (as far as this process wrote it).
    last_index: Option<u64>,
}

fn encode(last_index: Option<u64>) -> [u8; WATERMARK_LEN_BYTES] {
    let mut bytes = [0u8; WATERMARK_LEN_BYTES];
    if let Some(index) = last_index {
        bytes[4] = 1;
        bytes[5..13].copy_from_slice(&index.to_be_bytes());
    }
    let checksum = crc32c::crc32c(&bytes[4..]);
    bytes[..4].copy_from_slice(&checksum.to_be_bytes());
    bytes
}

fn decode(bytes: &[u8]) -> Result<Option<u64>, String> {
    if bytes.len() != WATERMARK_LEN_BYTES {
        return Err(format!(
            "watermark is {} bytes long, expected {WATERMARK_LEN_BYTES}",
            bytes.len()
        ));
    }
    let mut stored = [0u8; 4];
    stored.copy_from_slice(&bytes[..4]);
    if u32::from_be_bytes(stored) != crc32c::crc32c(&bytes[4..]) {
        return Err("watermark checksum mismatch".to_string());
    }
    match bytes[4] {
        0 => Ok(None),
        1 => {
            let mut index = [0u8; 8];
            index.copy_from_slice(&bytes[5..13]);
            Ok(Some(u64::from_be_bytes(index)))
        }
        flag => Err(format!("watermark flag byte is {flag}")),
    }
}

impl Watermark {
    /// Opens (creating) the watermark of the store in `dir` and returns it with the index it
    /// records (`None` when absent or unreadable).
    pub(crate) fn open(dir: &Path) -> Result<(Watermark, Option<u64>), LogError> {
        let path = dir.join(WATERMARK_FILE_NAME);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| LogError::io(format!("open {}", path.display()), e))?;
        let mut bytes = Vec::new();
        let len = file
            .metadata()
            .map_err(|e| LogError::io(format!("stat {}", path.display()), e))?
            .len();
        if len > 0 {
            bytes.resize(len.min(4096) as usize, 0);
            file.read_exact_at(&mut bytes, 0)
                .map_err(|e| LogError::io(format!("read {}", path.display()), e))?;
        }
        let recorded = if bytes.is_empty() {
            None
        } else {
            match decode(&bytes) {
                Ok(recorded) => recorded,
                Err(reason) => {
                    tracing::warn!(path = %path.display(), %reason, "ignoring unreadable raft log watermark");
                    None
                }
            }
        };
        Ok((
            Watermark {
                file,
                path,
                last_index: recorded,
            },
            recorded,
        ))
    }

    /// Records `last_index` after a durability point (no fsync: a lost update only makes the
    /// watermark lower, which is safe).
    pub(crate) fn advance(&mut self, last_index: Option<u64>) -> Result<(), LogError> {
        if last_index == self.last_index {
            return Ok(());
        }
        self.write(last_index)
    }

    /// Lowers the watermark to `last_index` durably, before entries above it are deleted.
    pub(crate) fn lower_durably(&mut self, last_index: Option<u64>) -> Result<(), LogError> {
        if last_index >= self.last_index {
            return Ok(());
        }
        self.write(last_index)?;
        self.file
            .sync_data()
            .map_err(|e| LogError::io(format!("fdatasync {}", self.path.display()), e))
    }

    fn write(&mut self, last_index: Option<u64>) -> Result<(), LogError> {
        let bytes = encode(last_index);
        self.file
            .write_all_at(&bytes, 0)
            .map_err(|e| LogError::io(format!("write {}", self.path.display()), e))?;
        self.last_index = last_index;
        debug_assert_eq!(decode(&bytes), Ok(last_index));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermark_round_trips_and_damage_is_ignored() {
        // Write, reopen, read back; a damaged file reads as no watermark.
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut watermark, recorded) = Watermark::open(dir.path()).expect("open");
        assert_eq!(recorded, None);
        watermark.advance(Some(41)).expect("advance");
        drop(watermark);
        let (mut watermark, recorded) = Watermark::open(dir.path()).expect("reopen");
        assert_eq!(recorded, Some(41));
        watermark.lower_durably(Some(7)).expect("lower");
        assert_eq!(Watermark::open(dir.path()).expect("reopen").1, Some(7));
        let path = dir.path().join(WATERMARK_FILE_NAME);
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[6] ^= 1;
        std::fs::write(&path, &bytes).expect("write");
        assert_eq!(Watermark::open(dir.path()).expect("reopen").1, None);
    }
}
