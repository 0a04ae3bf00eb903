//! Online restore: a backup file replaces the state of a running cluster,
//! through Raft, all or nothing.
//!
//! The leader receives the upload into a scratch file in its data dir
//! (bounded by `restore_upload_bytes_max`, never held in memory), verifies the
//! whole file and its resources against the node's limits, then proposes `RestoreBegin`, the resources in chunks of about
//! [`RESTORE_CHUNK_BYTES`], and `RestoreCommit`; on any error after the begin
//! it proposes `RestoreAbort`. The fsm (`cairn_fsm`, module `restore`) makes
//! the outcome the same on every node: nothing changes before the commit
//! entry, and the commit swaps everything in at once.
//!
//! A restore whose driver is gone (the leader crashed or lost leadership
//! mid-way) would stay pending forever, holding its resources in memory on
//! every node: the leader aborts any pending restore its own driver is not
//! running ([`Restorer::abort_orphans`]).
//!
//! Only a caller with the admin role gets here: the AdminService handler
//! authorizes the request before a byte of the upload is read.
//!
//! Invariants: at most one driver runs per node; a driver only proposes for
//! the restore id it began; an orphan is aborted only while this node leads
//! and its driver is not running that id.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cairn_fsm::{Applied, Command};
use cairn_proto::error::ApiError;
use cairn_proto::v1::{self as pb, Resource};
use futures::StreamExt as _;
use prost::Message as _;
use tokio::io::AsyncWriteExt as _;

use crate::raft::RaftHandle;
use crate::snapshot_file::{self, Section, SnapshotHeader, SnapshotReader};

/// Resources are proposed in chunks of about this many encoded bytes (a
/// chunk holds at least one resource, so a larger resource makes a larger
/// chunk).
pub const RESTORE_CHUNK_BYTES: usize = 1024 * 1024;

/// The online restore of one node: its scratch dir and its one driver slot.
pub struct Restorer {
    raft: RaftHandle,
    upload_path: PathBuf,
    /// Held while this node receives or drives a restore: one at a time.
    driver_slot: tokio::sync::Mutex<()>,
    /// The restore id this node's driver is running, set before its begin
    /// is proposed and cleared after its last proposal.
    running: std::sync::Mutex<Option<String>>,
    /// Largest upload accepted (`restore_upload_bytes_max`).
    upload_bytes_max: u64,
}

fn internal(what: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::Internal(format!("{what}: {e}"))
}

impl Restorer {
    pub fn new(raft: RaftHandle, data_dir: &Path, upload_bytes_max: u64) -> Arc<Restorer> {
        Arc::new(Restorer {
            raft,
            upload_path: data_dir.join("restore-upload.part"),
            driver_slot: tokio::sync::Mutex::new(()),
            running: std::sync::Mutex::new(None),
            upload_bytes_max,
        })
    }

    /// Receives an uploaded backup, verifies it and restores it. Returns the
    /// commit's log index and the number of resources restored.
    pub async fn restore_upload(
        self: &Arc<Self>,
        mut upload: impl futures::Stream<Item = Result<pb::SnapshotChunk, tonic::Status>> + Unpin + Send,
    ) -> Result<(u64, u64), ApiError> {
        self.raft.require_leader()?;
        let _slot = self.driver_slot.try_lock().map_err(|_| {
            ApiError::Inconsistent("a restore is already running on this node".into())
        })?;
        let result = async {
            let mut file = tokio::fs::File::create(&self.upload_path)
                .await
                .map_err(|e| internal("creating the upload file", e))?;
            let mut received_bytes: u64 = 0;
            while let Some(chunk) = upload.next().await {
                let chunk = chunk.map_err(|s| {
                    ApiError::Unavailable(format!("the upload stopped: {}", s.message()))
                })?;
                received_bytes += chunk.data.len() as u64;
                if received_bytes > self.upload_bytes_max {
                    return Err(ApiError::exhausted(
                        "restore_upload_bytes_max",
                        self.upload_bytes_max,
                        format!("the upload is larger than {} bytes", self.upload_bytes_max),
                    ));
                }
                file.write_all(&chunk.data)
                    .await
                    .map_err(|e| internal("writing the upload file", e))?;
            }
            file.flush()
                .await
                .map_err(|e| internal("writing the upload file", e))?;
            drop(file);
            let header = self.verify_upload().await?;
            let restore_id = format!(
                "{}-{}-{:016x}",
                self.raft.node_id,
                header.last_log_index,
                rand::random::<u64>()
            );
            self.set_running(Some(restore_id.clone()));
            let result = self.drive(&restore_id, &header).await;
            if result.is_err() {
                // Best effort: if this fails too, the next leader (or this
                // node's orphan check) aborts it.
                let _ = self
                    .raft
                    .propose(Command::RestoreAbort {
                        restore_id: restore_id.clone(),
                    })
                    .await;
            }
            result
        }
        .await;
        self.set_running(None);
        let _ = std::fs::remove_file(&self.upload_path);
        result
    }

    /// Verifies the whole upload, and every resource of its table against
    /// this node's configured limits (the fsm applies a restore against its
    /// fixed hard bounds only): a refusal comes before anything is proposed.
    async fn verify_upload(&self) -> Result<SnapshotHeader, ApiError> {
        let path = self.upload_path.clone();
        let limits = self.raft.store.limits().clone();
        let (verified, refused) = tokio::task::spawn_blocking(move || {
            let mut refused = None;
            let mut record = 0u64;
            let verified = snapshot_file::verify(&path, |resource, section| {
                record += 1;
                if refused.is_none() && section == Section::Table {
                    if let Err(e) = cairn_fsm::validate_write(resource, &limits) {
                        refused = Some(format!("resource {record} of the backup: {e}"));
                    }
                }
            });
            (verified, refused)
        })
        .await
        .map_err(|e| internal("verifying", e))?;
        let header = verified.map_err(|e| ApiError::invalid("snapshot", e.to_string()))?;
        match refused {
            Some(reason) => Err(ApiError::invalid("snapshot", reason)),
            None => Ok(header),
        }
    }

    fn set_running(&self, id: Option<String>) {
        *self.running.lock().unwrap_or_else(|e| e.into_inner()) = id;
    }

    /// Proposes the begin, the chunks and the commit of a verified file.
    async fn drive(
        &self,
        restore_id: &str,
        header: &SnapshotHeader,
    ) -> Result<(u64, u64), ApiError> {
        tracing::info!(
            restore_id,
            resources = header.resource_count,
            from_index = header.last_log_index,
            "online restore: begin"
        );
        self.raft
            .propose(Command::RestoreBegin {
                restore_id: restore_id.to_string(),
                resource_count: header.resource_count,
                leases: header.leases.iter().map(|l| (l[0], l[1])).collect(),
            })
            .await?;
        // The file is read on a blocking thread, a chunk or two ahead.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Vec<Resource>, ApiError>>(2);
        let path = self.upload_path.clone();
        let reader = tokio::task::spawn_blocking(move || {
            let mut reader = match SnapshotReader::open(&path) {
                Ok(r) => r,
                Err(e) => {
                    let _ = tx.blocking_send(Err(ApiError::invalid("snapshot", e.to_string())));
                    return;
                }
            };
            let mut chunk = Vec::new();
            let mut chunk_bytes = 0;
            loop {
                match reader.next_table_resource() {
                    Ok(Some(resource)) => {
                        let size = resource.encoded_len();
                        if !chunk.is_empty() && chunk_bytes + size > RESTORE_CHUNK_BYTES {
                            if tx.blocking_send(Ok(std::mem::take(&mut chunk))).is_err() {
                                return;
                            }
                            chunk_bytes = 0;
                        }
                        chunk_bytes += size;
                        chunk.push(resource);
                    }
                    Ok(None) => {
                        if !chunk.is_empty() {
                            let _ = tx.blocking_send(Ok(chunk));
                        }
                        return;
                    }
                    Err(e) => {
                        let _ = tx.blocking_send(Err(ApiError::invalid("snapshot", e.to_string())));
                        return;
                    }
                }
            }
        });
        let mut sent: u64 = 0;
        while let Some(chunk) = rx.recv().await {
            let chunk = chunk?;
            sent += chunk.len() as u64;
            self.raft
                .propose(Command::RestoreChunk {
                    restore_id: restore_id.to_string(),
                    resources: chunk,
                })
                .await?;
            tracing::debug!(restore_id, sent, "online restore: chunk committed");
        }
        reader
            .await
            .map_err(|e| internal("reading the upload", e))?;
        let (index, applied) = self
            .raft
            .propose(Command::RestoreCommit {
                restore_id: restore_id.to_string(),
            })
            .await?;
        match applied {
            Applied::Restored { resource_count } => {
                tracing::info!(
                    restore_id,
                    index,
                    resource_count,
                    "online restore: committed"
                );
                Ok((index, resource_count))
            }
            other => Err(ApiError::Internal(format!(
                "restore commit applied as {other:?}"
            ))),
        }
    }

    /// While this node leads, aborts every pending restore its own driver is
    /// not running. Checks every `interval`, for the life of the process.
    pub async fn abort_orphans(self: Arc<Self>, interval: Duration) {
        loop {
            tokio::time::sleep(interval).await;
            if !self.raft.is_leader() {
                continue;
            }
            // Pending is read before the driver slot: a driver sets its id
            // before proposing the begin, so a restore it runs is never
            // mistaken for an orphan.
            let Some(pending) = self.raft.store.pending_restore() else {
                continue;
            };
            let running = self
                .running
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if running.as_deref() == Some(pending.restore_id.as_str()) {
                continue;
            }
            tracing::warn!(
                restore_id = %pending.restore_id,
                "aborting an online restore whose driver is gone"
            );
            match self
                .raft
                .propose(Command::RestoreAbort {
                    restore_id: pending.restore_id.clone(),
                })
                .await
            {
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "could not abort an orphaned restore"),
            }
        }
    }
}
