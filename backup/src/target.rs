//! A target opened: every operation that touches it (the I/O around the pure parts).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::BackupError;
use crate::listing::{Listing, StoredBackup};
use crate::name::BackupName;
use crate::retention::{decide_retention, Retention, RetentionDecision};
use crate::spec::{SpecError, TargetSpec};

/// S3 refuses parts under 5 MiB (but the last).
const S3_PART_BYTES_MIN: usize = 5 * 1024 * 1024;
/// S3 allows at most 10 000 parts in one upload.
const PARTS_MAX: u64 = 10_000;
/// Buffer of the local file written while reading an object back or fetching it.
const LOCAL_WRITE_BUFFER_BYTES: usize = 1024 * 1024;

/// The bounds a target works within.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// A listing of more objects than this under the prefix fails ([`BackupError::TooMany`])
    /// instead of growing without end.
    pub list_objects_max: usize,
    /// Size of one uploaded part: raised to 5 MiB on S3 (its minimum), and so that a file
    /// takes at most 10 000 parts (S3's maximum).
    pub part_bytes: usize,
    /// Parts uploaded at once. An upload holds at most `part_bytes × (parts_in_flight + 1)`
    /// bytes of the file in memory.
    pub parts_in_flight: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            list_objects_max: 100_000,
            part_bytes: 8 * 1024 * 1024,
            parts_in_flight: 2,
        }
    }
}

/// What the verify callback found in the copy read back from the target: the name's
/// cluster and index must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub cluster_id: String,
    /// The log index the file reflects.
    pub index: u64,
}

/// Which transfer a [`Progress`] report is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The local file going up ([`BackupTarget::put_verified`]); counted as parts finish.
    Upload,
    /// The uploaded object coming back to be compared and verified.
    ReadBack,
    /// A backup coming down ([`BackupTarget::fetch`]).
    Fetch,
}

/// Bytes done of one transfer, for a progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub phase: Phase,
    pub done_bytes: u64,
    pub total_bytes: u64,
}

/// A place backups are stored in and read back from: an object store and a prefix in it.
/// One code path for a directory and for S3.
#[derive(Debug, Clone)]
pub struct BackupTarget {
    store: Arc<dyn ObjectStore>,
    /// Where the backups are: the root (empty) or a "folder" of the store.
    prefix: ObjectPath,
    /// How messages name the target (never with a credential).
    description: String,
    part_bytes_min: usize,
    limits: Limits,
    scratch_dir: Option<PathBuf>,
}

impl BackupTarget {
    /// Opens the target `spec` names: a directory must exist (it is not created: an absent
    /// mount point must not be filled on the disk under it); an S3 bucket is not reached
    /// until the first operation.
    pub fn open(spec: &TargetSpec) -> Result<BackupTarget, BackupError> {
        let description = spec.to_string();
        match spec {
            TargetSpec::Directory { path } => {
                let missing = |detail: String| BackupError::MissingTarget {
                    target: description.clone(),
                    op: "open",
                    object: "the directory".to_string(),
                    detail,
                };
                match std::fs::metadata(path) {
                    Ok(meta) if meta.is_dir() => {}
                    Ok(_) => return Err(missing("not a directory".to_string())),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        return Err(missing(e.to_string()))
                    }
                    Err(e) => {
                        let source = object_store::Error::Generic {
                            store: "LocalFileSystem",
                            source: Box::new(e),
                        };
                        return Err(BackupError::from_store(
                            &description,
                            "open",
                            "the directory",
                            source,
                        ));
                    }
                }
                let store = LocalFileSystem::new_with_prefix(path)
                    .map_err(|e| BackupError::from_store(&description, "open", "the directory", e))?
                    .with_fsync(true)
                    .with_automatic_cleanup(true);
                Ok(BackupTarget::with_store(
                    Arc::new(store),
                    ObjectPath::default(),
                    description,
                    1,
                ))
            }
            TargetSpec::S3 {
                bucket,
                prefix,
                options,
            } => {
                let explicit = options.access_key_id.is_some();
                // With explicit credentials nothing comes from the environment.
                let mut builder = if explicit {
                    AmazonS3Builder::new()
                } else {
                    AmazonS3Builder::from_env()
                };
                // One object at a time, by plain DELETE: what every S3-compatible server
                // supports (DeleteObjects is not everywhere, and Cairn never deletes in bulk).
                builder = builder
                    .with_bucket_name(bucket)
                    .with_disable_bulk_delete(true);
                if let (Some(id), Some(secret)) =
                    (&options.access_key_id, &options.secret_access_key)
                {
                    builder = builder
                        .with_access_key_id(id)
                        .with_secret_access_key(secret);
                    if let Some(token) = &options.session_token {
                        builder = builder.with_token(token);
                    }
                }
                if let Some(endpoint) = &options.endpoint {
                    builder = builder.with_endpoint(endpoint);
                }
                if let Some(region) = &options.region {
                    builder = builder.with_region(region);
                }
                if options.allow_http {
                    builder = builder.with_allow_http(true);
                }
                let store = builder.build().map_err(|e| BackupError::Spec {
                    target: description.clone(),
                    source: SpecError::S3Config { why: e.to_string() },
                })?;
                let prefix = ObjectPath::parse(prefix).map_err(|e| BackupError::Spec {
                    target: description.clone(),
                    source: SpecError::S3Config { why: e.to_string() },
                })?;
                Ok(BackupTarget::with_store(
                    Arc::new(store),
                    prefix,
                    description,
                    S3_PART_BYTES_MIN,
                ))
            }
        }
    }

    /// A target over any object store (an in-memory one in a test): backups under
    /// `prefix`, parts of at least `part_bytes_min`.
    pub fn with_store(
        store: Arc<dyn ObjectStore>,
        prefix: ObjectPath,
        description: String,
        part_bytes_min: usize,
    ) -> BackupTarget {
        BackupTarget {
            store,
            prefix,
            description,
            part_bytes_min: part_bytes_min.max(1),
            limits: Limits::default(),
            scratch_dir: None,
        }
    }

    /// The same target within other bounds.
    pub fn with_limits(mut self, limits: Limits) -> BackupTarget {
        self.limits = limits;
        self
    }

    /// Where the local copy read back by [`Self::put_verified`] is written (hidden files
    /// named `.cairn-backup-readback-*`, removed afterwards); by default the local file's
    /// own directory, which has room for a copy of it.
    pub fn with_scratch_dir(mut self, dir: PathBuf) -> BackupTarget {
        self.scratch_dir = Some(dir);
        self
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// How messages name this target.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Uploads `local_file` as the backup `name`, and publishes it only once checked:
    ///
    /// 1. streams the file to `<name>.part` in parts (bounded memory, see [`Limits`]),
    ///    computing its size and crc32c as sent;
    /// 2. reads `<name>.part` back into a local temporary file (the scratch dir), and
    ///    compares its size and crc32c with what was sent;
    /// 3. runs `verify` on that copy (on a blocking thread); what it returns must name the
    ///    cluster and index `name` does;
    /// 4. copies `<name>.part` to `name` (a hard link and a rename on a directory, a
    ///    server-side copy on S3), and checks the published object's size.
    ///
    /// `<name>.part` is then removed, whatever happened (best effort: a leftover is pruned
    /// later, [`Retention::leftover_grace`]). A failure before step 4 leaves no object named
    /// `name`; a failure of step 4's check removes it. `progress` is told the bytes done in
    /// [`Phase::Upload`] and [`Phase::ReadBack`].
    pub async fn put_verified<V>(
        &self,
        local_file: &Path,
        name: &BackupName,
        verify: V,
        mut progress: impl FnMut(Progress),
    ) -> Result<StoredBackup, BackupError>
    where
        V: FnOnce(&Path) -> Result<Verified, String> + Send + 'static,
    {
        let part = self.object_path(&name.part_file_name());
        let result = self
            .upload_check_publish(local_file, name, &part, verify, &mut progress)
            .await;
        match self.store.delete(&part).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => tracing::warn!(
                backup_target = %self.description,
                object = %name.part_file_name(),
                error = %e,
                "cannot remove a backup's temporary object; retention removes it later"
            ),
        }
        result
    }

    async fn upload_check_publish<V>(
        &self,
        local_file: &Path,
        name: &BackupName,
        part: &ObjectPath,
        verify: V,
        progress: &mut impl FnMut(Progress),
    ) -> Result<StoredBackup, BackupError>
    where
        V: FnOnce(&Path) -> Result<Verified, String> + Send + 'static,
    {
        let part_name = name.part_file_name();
        let local = |op, path: &Path, source| BackupError::Local {
            target: self.description.clone(),
            op,
            object: part_name.clone(),
            path: path.to_path_buf(),
            source,
        };
        let verify_failed = |what: String| BackupError::Verify {
            target: self.description.clone(),
            object: part_name.clone(),
            what,
        };

        // 1. Up.
        let total_bytes = tokio::fs::metadata(local_file)
            .await
            .map_err(|e| local("upload", local_file, e))?
            .len();
        if total_bytes == 0 {
            let empty = std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the file is empty: not a backup",
            );
            return Err(local("upload", local_file, empty));
        }
        let (sent_bytes, sent_crc) = self.upload(local_file, part, total_bytes, progress).await?;
        if sent_bytes != total_bytes {
            return Err(verify_failed(format!(
                "the local file {} changed during the upload: {total_bytes} bytes before, {sent_bytes} sent",
                local_file.display()
            )));
        }

        // 2. Back, and compared.
        let scratch_dir = match &self.scratch_dir {
            Some(dir) => dir.clone(),
            None => parent_dir(local_file),
        };
        let copy = tempfile::Builder::new()
            .prefix(".cairn-backup-readback-")
            .tempfile_in(&scratch_dir)
            .map_err(|e| local("read back", &scratch_dir, e))?;
        let (read_bytes, read_crc) = self
            .download(
                part,
                &part_name,
                &copy,
                sent_bytes,
                Phase::ReadBack,
                progress,
            )
            .await?;
        if (read_bytes, read_crc) != (sent_bytes, sent_crc) {
            return Err(verify_failed(format!(
                "read back {read_bytes} bytes of crc32c {read_crc:08x}, but sent {sent_bytes} bytes of crc32c {sent_crc:08x}"
            )));
        }

        // 3. Verified by the caller's check.
        let copy_path = copy.path().to_path_buf();
        let verified = tokio::task::spawn_blocking(move || verify(&copy_path))
            .await
            .map_err(|e| verify_failed(format!("the verify callback did not return: {e}")))?
            .map_err(|why| verify_failed(format!("the copy read back does not verify: {why}")))?;
        drop(copy);
        if verified.cluster_id != name.cluster_id() || verified.index != name.index() {
            return Err(verify_failed(format!(
                "the file is of cluster {} at index {}, but its name says cluster {} at index {}",
                verified.cluster_id,
                verified.index,
                name.cluster_id(),
                name.index()
            )));
        }

        // 4. Published, and checked.
        let final_path = self.object_path(&name.file_name());
        self.store
            .copy(part, &final_path)
            .await
            .map_err(|e| self.store_error("publish", &name.file_name(), e))?;
        let published = self
            .store
            .head(&final_path)
            .await
            .map_err(|e| self.store_error("check the published", &name.file_name(), e));
        let published_bytes = match published {
            Ok(meta) => meta.size,
            Err(e) => {
                self.remove_unchecked(&final_path, name).await;
                return Err(e);
            }
        };
        if published_bytes != sent_bytes {
            self.remove_unchecked(&final_path, name).await;
            return Err(BackupError::Verify {
                target: self.description.clone(),
                object: name.file_name(),
                what: format!(
                    "published as {published_bytes} bytes, but {sent_bytes} were verified"
                ),
            });
        }
        Ok(StoredBackup {
            name: name.clone(),
            size_bytes: sent_bytes,
        })
    }

    /// Removes a published object whose check failed (best effort).
    async fn remove_unchecked(&self, path: &ObjectPath, name: &BackupName) {
        if let Err(e) = self.store.delete(path).await {
            tracing::error!(
                backup_target = %self.description,
                object = %name.file_name(),
                error = %e,
                "cannot remove a published backup that failed its check"
            );
        }
    }

    /// Streams `local_file` into `part` in parts, at most `parts_in_flight` at once; returns
    /// the bytes sent (at most `total_bytes + 1`: a growing file is not followed) and their
    /// crc32c. On a failure the upload is aborted (best effort).
    async fn upload(
        &self,
        local_file: &Path,
        part: &ObjectPath,
        total_bytes: u64,
        progress: &mut impl FnMut(Progress),
    ) -> Result<(u64, u32), BackupError> {
        let object = part.filename().unwrap_or_default().to_string();
        let mut file =
            tokio::fs::File::open(local_file)
                .await
                .map_err(|source| BackupError::Local {
                    target: self.description.clone(),
                    op: "upload",
                    object: object.clone(),
                    path: local_file.to_path_buf(),
                    source,
                })?;
        let mut upload = self
            .store
            .put_multipart(part)
            .await
            .map_err(|e| self.store_error("upload", &object, e))?;
        let part_bytes = self.part_bytes(total_bytes);
        let sent = self
            .upload_parts(
                &mut file,
                local_file,
                upload.as_mut(),
                &object,
                part_bytes,
                total_bytes,
                progress,
            )
            .await;
        let sent = match sent {
            Ok(sent) => sent,
            Err(e) => {
                let _ = upload.abort().await;
                return Err(e);
            }
        };
        if let Err(e) = upload.complete().await {
            let _ = upload.abort().await;
            return Err(self.store_error("upload", &object, e));
        }
        Ok(sent)
    }

    #[allow(clippy::too_many_arguments)]
    async fn upload_parts(
        &self,
        file: &mut tokio::fs::File,
        local_file: &Path,
        upload: &mut dyn object_store::MultipartUpload,
        object: &str,
        part_bytes: usize,
        total_bytes: u64,
        progress: &mut impl FnMut(Progress),
    ) -> Result<(u64, u32), BackupError> {
        let in_flight_max = self.limits.parts_in_flight.max(1);
        let mut in_flight: tokio::task::JoinSet<Result<u64, object_store::Error>> =
            tokio::task::JoinSet::new();
        let (mut sent_bytes, mut sent_crc, mut done_bytes) = (0u64, 0u32, 0u64);
        // Reading stops one byte past the size the file had: a file still being written
        // fails the size check instead of being followed.
        let read_max = total_bytes.saturating_add(1);
        loop {
            let want = usize::try_from(read_max - sent_bytes)
                .map_or(part_bytes, |left| left.min(part_bytes));
            let chunk = read_up_to(file, want)
                .await
                .map_err(|source| BackupError::Local {
                    target: self.description.clone(),
                    op: "upload",
                    object: object.to_string(),
                    path: local_file.to_path_buf(),
                    source,
                })?;
            if chunk.is_empty() {
                break;
            }
            sent_crc = crc32c::crc32c_append(sent_crc, &chunk);
            let chunk_bytes = chunk.len() as u64;
            sent_bytes += chunk_bytes;
            while in_flight.len() >= in_flight_max {
                done_bytes += self.part_done(in_flight.join_next().await, object)?;
                progress(Progress {
                    phase: Phase::Upload,
                    done_bytes,
                    total_bytes,
                });
            }
            let put = upload.put_part(PutPayload::from(chunk));
            in_flight.spawn(async move { put.await.map(|()| chunk_bytes) });
            if sent_bytes >= read_max {
                break;
            }
        }
        while !in_flight.is_empty() {
            done_bytes += self.part_done(in_flight.join_next().await, object)?;
            progress(Progress {
                phase: Phase::Upload,
                done_bytes,
                total_bytes,
            });
        }
        Ok((sent_bytes, sent_crc))
    }

    fn part_done(
        &self,
        joined: Option<Result<Result<u64, object_store::Error>, tokio::task::JoinError>>,
        object: &str,
    ) -> Result<u64, BackupError> {
        match joined {
            None => Ok(0),
            Some(Ok(Ok(bytes))) => Ok(bytes),
            Some(Ok(Err(e))) => Err(self.store_error("upload", object, e)),
            Some(Err(e)) => Err(self.store_error(
                "upload",
                object,
                object_store::Error::JoinError { source: e },
            )),
        }
    }

    /// The part size for a file of `total_bytes`.
    fn part_bytes(&self, total_bytes: u64) -> usize {
        let for_parts_max = usize::try_from(total_bytes.div_ceil(PARTS_MAX)).unwrap_or(usize::MAX);
        self.limits
            .part_bytes
            .max(self.part_bytes_min)
            .max(for_parts_max)
            .max(1)
    }

    /// Streams the object at `path` into `file`, stopping with an error past
    /// `expected_bytes`; returns the bytes and their crc32c.
    async fn download(
        &self,
        path: &ObjectPath,
        object: &str,
        file: &tempfile::NamedTempFile,
        expected_bytes: u64,
        phase: Phase,
        progress: &mut impl FnMut(Progress),
    ) -> Result<(u64, u32), BackupError> {
        let op = match phase {
            Phase::Fetch => "fetch",
            Phase::Upload | Phase::ReadBack => "read back",
        };
        let local = |source| BackupError::Local {
            target: self.description.clone(),
            op,
            object: object.to_string(),
            path: file.path().to_path_buf(),
            source,
        };
        let got = self
            .store
            .get(path)
            .await
            .map_err(|e| self.store_error(op, object, e))?;
        let mut stream = got.into_stream();
        let std_file = file.as_file().try_clone().map_err(local)?;
        let mut out = tokio::io::BufWriter::with_capacity(
            LOCAL_WRITE_BUFFER_BYTES,
            tokio::fs::File::from_std(std_file),
        );
        let (mut bytes, mut crc) = (0u64, 0u32);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.store_error(op, object, e))?;
            bytes += chunk.len() as u64;
            if bytes > expected_bytes {
                return Err(BackupError::Verify {
                    target: self.description.clone(),
                    object: object.to_string(),
                    what: format!("the object holds more than the {expected_bytes} bytes expected"),
                });
            }
            crc = crc32c::crc32c_append(crc, &chunk);
            out.write_all(&chunk).await.map_err(local)?;
            progress(Progress {
                phase,
                done_bytes: bytes,
                total_bytes: expected_bytes,
            });
        }
        out.flush().await.map_err(local)?;
        if phase == Phase::Fetch {
            out.get_ref().sync_all().await.map_err(local)?;
        }
        Ok((bytes, crc))
    }

    /// Lists the target's backups, newest first, with what was passed over. Fails past
    /// [`Limits::list_objects_max`] objects.
    pub async fn list(&self) -> Result<Listing, BackupError> {
        let prefix = (!self.prefix.as_ref().is_empty()).then_some(&self.prefix);
        let mut stream = self.store.list(prefix);
        let mut listing = Listing::default();
        let mut seen = 0usize;
        while let Some(meta) = stream.next().await {
            let meta = meta.map_err(|e| self.store_error("list", "the objects", e))?;
            seen += 1;
            if seen > self.limits.list_objects_max {
                return Err(BackupError::TooMany {
                    target: self.description.clone(),
                    limit: self.limits.list_objects_max,
                });
            }
            let rest: Option<Vec<_>> = meta
                .location
                .prefix_match(&self.prefix)
                .map(Iterator::collect);
            let file_name = match rest.as_deref() {
                Some([only]) => Some(only.as_ref()),
                _ => None,
            };
            let modified_unix_ms =
                u64::try_from(meta.last_modified.timestamp_millis()).unwrap_or(0);
            listing.add(file_name, meta.size, modified_unix_ms);
        }
        listing.sort();
        Ok(listing)
    }

    /// Downloads the backup `name` to `dest_file`, which must not exist: written to a
    /// temporary file beside it, synced, then linked into place, so a failure leaves no
    /// `dest_file`. Returns its size. Does not verify it (the caller's verify does).
    pub async fn fetch(
        &self,
        name: &BackupName,
        dest_file: &Path,
        mut progress: impl FnMut(Progress),
    ) -> Result<u64, BackupError> {
        let object = name.file_name();
        let local = |path: &Path, source| BackupError::Local {
            target: self.description.clone(),
            op: "fetch",
            object: object.clone(),
            path: path.to_path_buf(),
            source,
        };
        let path = self.object_path(&object);
        let meta = self
            .store
            .head(&path)
            .await
            .map_err(|e| self.store_error("fetch", &object, e))?;
        let dir = parent_dir(dest_file);
        let temp = tempfile::Builder::new()
            .prefix(".cairn-backup-fetch-")
            .tempfile_in(&dir)
            .map_err(|e| local(&dir, e))?;
        let (bytes, _crc) = self
            .download(
                &path,
                &object,
                &temp,
                meta.size,
                Phase::Fetch,
                &mut progress,
            )
            .await?;
        if bytes != meta.size {
            return Err(BackupError::Verify {
                target: self.description.clone(),
                object,
                what: format!(
                    "fetched {bytes} bytes of the {} listed: it changed while fetched",
                    meta.size
                ),
            });
        }
        temp.persist_noclobber(dest_file)
            .map_err(|e| local(dest_file, e.error))?;
        Ok(bytes)
    }

    /// Deletes the backup `name`; [`BackupError::NotFound`] when there is none.
    pub async fn delete(&self, name: &BackupName) -> Result<(), BackupError> {
        let object = name.file_name();
        let path = self.object_path(&object);
        // S3 answers a delete of nothing with success: ask first, to tell the caller.
        self.store
            .head(&path)
            .await
            .map_err(|e| self.store_error("delete", &object, e))?;
        self.store
            .delete(&path)
            .await
            .map_err(|e| self.store_error("delete", &object, e))
    }

    /// Removes the temporary object `<name>.part` of an upload abandoned midway (its
    /// caller stopped: [`Self::put_verified`] was dropped); nothing there is not an error.
    /// Never touches the final name.
    pub async fn remove_part(&self, name: &BackupName) -> Result<(), BackupError> {
        let object = name.part_file_name();
        match self.store.delete(&self.object_path(&object)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.store_error("remove", &object, e)),
        }
    }

    /// Lists the target, decides with [`decide_retention`] for `cluster_id` at
    /// `now_unix_ms`, and deletes what it chose (stopping at the first failure). Returns the
    /// decision carried out.
    pub async fn apply_retention(
        &self,
        cluster_id: &str,
        now_unix_ms: u64,
        retention: &Retention,
    ) -> Result<RetentionDecision, BackupError> {
        let listing = self.list().await?;
        let decision = decide_retention(&listing, cluster_id, now_unix_ms, retention);
        let newest = listing.newest_of(cluster_id).map(|b| &b.name);
        for name in &decision.prune {
            // Invariant: the newest verified backup is never pruned (decide_retention keeps
            // it; this holds even if that changed).
            if Some(name) == newest {
                tracing::error!(backup_target = %self.description, object = %name, "retention chose the newest backup; kept");
                continue;
            }
            let object = name.file_name();
            self.store
                .delete(&self.object_path(&object))
                .await
                .map_err(|e| self.store_error("prune", &object, e))?;
        }
        for name in &decision.prune_leftovers {
            let object = name.part_file_name();
            match self.store.delete(&self.object_path(&object)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.store_error("prune", &object, e)),
            }
        }
        Ok(decision)
    }

    fn object_path(&self, file_name: &str) -> ObjectPath {
        self.prefix.clone().join(file_name)
    }

    fn store_error(&self, op: &'static str, object: &str, e: object_store::Error) -> BackupError {
        BackupError::from_store(&self.description, op, object, e)
    }
}

impl std::fmt::Display for BackupTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.description)
    }
}

/// The directory a file is in (`.` for a bare name).
fn parent_dir(file: &Path) -> PathBuf {
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Reads until `want` bytes or the end of the file.
async fn read_up_to(file: &mut tokio::fs::File, want: usize) -> std::io::Result<Bytes> {
    let mut buf = vec![0u8; want];
    let mut filled = 0;
    while filled < want {
        let n = file.read(&mut buf[filled..]).await?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    buf.truncate(filled);
    Ok(Bytes::from(buf))
}
