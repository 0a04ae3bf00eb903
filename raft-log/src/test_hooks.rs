//! Hooks for tests that damage a *closed* store on purpose, to prove that the damage is
//! reported. Not for production use: nothing here keeps the log consistent.

use std::path::Path;

use crate::codec;
use crate::codec::entry_key;
use crate::store::SLED_SUBDIR;
use crate::DirLock;
use crate::LogError;

/// Rewrites the stored bytes (checksum and payload) of the entry at `index` in the closed log
/// store at `dir` with `damage`, bypassing the checksum. Returns `false` when no such entry
/// exists. Takes the directory lock, so it fails while the store is open.
pub fn rewrite_stored_entry(
    dir: &Path,
    index: u64,
    damage: impl FnOnce(&mut Vec<u8>),
) -> Result<bool, LogError> {
    let _lock = DirLock::acquire(dir)?;
    let sled_dir = dir.join(SLED_SUBDIR);
    let engine = |e| LogError::engine(&sled_dir, e);
    let db = sled::Config::new().path(&sled_dir).open().map_err(engine)?;
    let entries = db.open_tree("entries").map_err(engine)?;
    let Some(stored) = entries.get(entry_key(index)).map_err(engine)? else {
        return Ok(false);
    };
    let mut bytes = stored.to_vec();
    damage(&mut bytes);
    entries.insert(entry_key(index), bytes).map_err(engine)?;
    db.flush().map_err(engine)?;
    Ok(true)
}

/// Like [`rewrite_stored_entry`], but `damage` edits the entry's bincode payload, and the value
/// is sealed again with a valid checksum: the damage then reaches the decoder instead of stopping
/// at the checksum (this is how the fuzz harness gets past it). Returns `false` when no such
/// entry exists or its checksum already fails.
pub fn rewrite_stored_entry_payload(
    dir: &Path,
    index: u64,
    damage: impl FnOnce(&mut Vec<u8>),
) -> Result<bool, LogError> {
    let mut resealed = false;
    let found = rewrite_stored_entry(dir, index, |stored| {
        let Ok(payload) = codec::unseal(&entry_key(index), stored) else {
            return;
        };
        let mut payload = payload.to_vec();
        damage(&mut payload);
        *stored = codec::seal_entry(index, &payload);
        resealed = true;
    })?;
    Ok(found && resealed)
}

/// Deletes the stored entry at `index` in the closed log store at `dir`, leaving a hole.
pub fn delete_stored_entry(dir: &Path, index: u64) -> Result<bool, LogError> {
    let _lock = DirLock::acquire(dir)?;
    let sled_dir = dir.join(SLED_SUBDIR);
    let engine = |e| LogError::engine(&sled_dir, e);
    let db = sled::Config::new().path(&sled_dir).open().map_err(engine)?;
    let entries = db.open_tree("entries").map_err(engine)?;
    let removed = entries.remove(entry_key(index)).map_err(engine)?.is_some();
    db.flush().map_err(engine)?;
    Ok(removed)
}

/// Rewrites the header of every WAL segment of the closed log store at `dir` to say format
/// `version`, sealed again with a valid checksum: how a data dir written by a build of another
/// format looks to this one. Returns how many segments it rewrote. Takes the directory lock.
pub fn rewrite_segment_format_version(dir: &Path, version: u32) -> Result<usize, LogError> {
    use crate::wal::format;
    let _lock = DirLock::acquire(dir)?;
    let segments = dir.join(crate::marker::WAL_SEGMENTS_SUBDIR);
    let io = |doing: &str, e| LogError::io(format!("{doing} {}", segments.display()), e);
    let mut rewritten = 0;
    for entry in std::fs::read_dir(&segments).map_err(|e| io("list", e))? {
        let path = entry.map_err(|e| io("list", e))?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let Some((base_index, segment_id)) =
            name.as_deref().and_then(format::parse_segment_file_name)
        else {
            continue;
        };
        let mut bytes = std::fs::read(&path).map_err(|e| io("read", e))?;
        let header = format::segment_header_of_version(version, segment_id, base_index);
        if bytes.len() < header.len() {
            continue;
        }
        bytes[..header.len()].copy_from_slice(&header);
        std::fs::write(&path, &bytes).map_err(|e| io("write", e))?;
        rewritten += 1;
    }
    Ok(rewritten)
}
