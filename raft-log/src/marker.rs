//! The engine marker: `<dir>/ENGINE` holds the name of the engine that writes the directory,
//! so that a node configured with the other engine refuses to start instead of starting with
//! an empty log.

use std::path::Path;

use crate::LogEngineKind;
use crate::LogError;

/// Name of the marker file in a store's directory.
pub(crate) const ENGINE_FILE_NAME: &str = "ENGINE";
/// What the sled engine keeps in a store's directory (also before markers existed).
pub(crate) const SLED_SUBDIR: &str = "sled";
/// The WAL's segment directory.
pub(crate) const WAL_SEGMENTS_SUBDIR: &str = "segments";
/// The WAL's metadata (a sled database).
pub(crate) const WAL_META_SUBDIR: &str = "meta";

/// Checks that `dir` (locked by the caller) belongs to `requested`, recording it when the
/// directory is new. A directory written before markers existed is recognised by its contents.
pub(crate) fn check_or_record(
    dir: &Path,
    requested: LogEngineKind,
    fsync_directory: bool,
) -> Result<(), LogError> {
    let path = dir.join(ENGINE_FILE_NAME);
    let found =
        match std::fs::read_to_string(&path) {
            Ok(text) => Some(text.trim().parse::<LogEngineKind>().map_err(|reason| {
                LogError::CorruptMeta {
                    key: "ENGINE",
                    reason: format!("{}: {reason}", path.display()),
                }
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if dir.join(SLED_SUBDIR).exists() {
                    Some(LogEngineKind::Sled)
                } else if dir.join(WAL_META_SUBDIR).exists()
                    || dir.join(WAL_SEGMENTS_SUBDIR).exists()
                {
                    Some(LogEngineKind::Wal)
                } else {
                    None
                }
            }
            Err(e) => return Err(LogError::io(format!("read {}", path.display()), e)),
        };
    match found {
        Some(found) if found != requested => Err(LogError::EngineMismatch {
            dir: dir.to_path_buf(),
            found,
            requested,
        }),
        Some(_) if path.exists() => Ok(()),
        _ => {
            // New directory (or one from before markers): record the engine durably before
            // anything else is written, so a crash cannot leave files without a marker, nor
            // an empty marker (written to a temporary file, then renamed).
            crate::lock::write_file_atomically(
                dir,
                ENGINE_FILE_NAME,
                format!("{requested}\n").as_bytes(),
                fsync_directory,
            )?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_is_recorded_then_enforced() {
        // A new dir records the engine; the same engine opens it again, the other is refused
        // with a message that says what to do.
        let dir = tempfile::tempdir().expect("tempdir");
        check_or_record(dir.path(), LogEngineKind::Wal, true).expect("record");
        check_or_record(dir.path(), LogEngineKind::Wal, true).expect("same engine");
        let error = check_or_record(dir.path(), LogEngineKind::Sled, true).expect_err("refused");
        let message = error.to_string();
        assert!(message.contains("log_engine = \"wal\""), "{message}");
    }

    #[test]
    fn directory_from_before_markers_is_recognised_as_sled() {
        // An old data dir has `sled/` and no marker: it is sled's, and the WAL refuses it.
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join(SLED_SUBDIR)).expect("mkdir");
        assert!(matches!(
            check_or_record(dir.path(), LogEngineKind::Wal, true),
            Err(LogError::EngineMismatch {
                found: LogEngineKind::Sled,
                ..
            })
        ));
        check_or_record(dir.path(), LogEngineKind::Sled, true).expect("sled opens it");
        assert!(dir.path().join(ENGINE_FILE_NAME).exists());
    }
}
