//! The snapshot file format, shared by Raft snapshots (log compaction and
//! installation on lagging followers) and operator backups
//! (`cairn snapshot save/restore`). Documented in `docs/snapshot-format.md`.
//!
//! ```text
//! magic            8 bytes  "CAIRNSNP"
//! format_version   u32 LE   (SNAPSHOT_FORMAT_VERSION)
//! header_len       u32 LE   <= HEADER_BYTES_MAX
//! header           JSON     SnapshotHeader
//! records          resource_count x { len: u32 LE <= RECORD_BYTES_MAX, protobuf cairn.v1.Resource }
//! pending records  pending_restore.received_count x the same (Raft snapshots
//!                  taken during an online restore only; backups never have them)
//! end marker       8 bytes  "CAIRNEND"
//! checksum         u32 LE   crc32c of every byte before it
//! ```
//!
//! Files are written to `NAME.tmp`, fsynced, renamed, and the directory fsynced,
//! so a complete file is the only kind that ever carries the final name.
//!
//! Invariants: a reader yields a resource only from a file whose structure it has
//! verified up to that record; [`verify`] checks the whole file (count, end
//! marker, checksum) before a restore changes anything.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use cairn_proto::v1::Resource;
use prost::Message;
use serde::{Deserialize, Serialize};

pub const MAGIC: &[u8; 8] = b"CAIRNSNP";
pub const END_MARKER: &[u8; 8] = b"CAIRNEND";
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;
/// Room for the largest header: 100,000 leases take about 5 MiB of it. (Release 0.1.0
/// read at most 1 MiB, which a file without leases never passes.)
pub const HEADER_BYTES_MAX: u32 = 16 * 1024 * 1024;
/// A record holds one resource; resources are bounded by the fsm's limit (1 MiB
/// by default); this bound leaves room for a raised limit and protects readers.
pub const RECORD_BYTES_MAX: u32 = 64 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotHeader {
    pub cluster_id: String,
    /// The Raft log index and term the snapshot reflects (everything up to and including it).
    pub last_log_index: u64,
    pub last_log_term: u64,
    /// The node that led `last_log_term` (part of openraft's log id).
    pub last_log_leader_node_id: u64,
    /// The membership at that index, as the node's Raft module encodes it.
    pub membership: serde_json::Value,
    pub resource_count: u64,
    /// Wall-clock time the file was written, for operators only.
    pub created_at_unix_ms: u64,
    /// The state reflects log entry 0 (the initial membership, which carries
    /// no data): tells that apart from "nothing applied", which is also index
    /// 0, term 0. Absent (false) in every other case.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub applied_initial_entry: bool,
    /// The online restore in progress at `last_log_index`, whose received
    /// resources follow the table's. Absent from backups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_restore: Option<PendingRestoreHeader>,
    /// The cluster version at `last_log_index` (`"0.2"`), and the downgrade target pinned
    /// then: absent while they are the defaults (0.1, none), so a cluster that never left
    /// 0.1 writes the files release 0.1.0 wrote ([`SnapshotHeader::cluster_version`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_version_downgrade: Option<String>,
    /// The cluster's space quota at `last_log_index`, and the index that raised `NOSPACE`
    /// if it was raised then (`cairn_fsm::SpaceState`): absent while they are the
    /// defaults (none), so older readers see the files they wrote. A cluster restored from
    /// a backup takes them, and its leader then sets the quota its own members ask for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space_quota_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nospace_alarm_index: Option<u64>,
    /// The leases at `last_log_index`, each `[id, ttl_ms, granted_revision,
    /// renewed_revision]` (`cairn_fsm::Lease`): absent when there are none, so older
    /// readers see the files they wrote. A backup restored into a running cluster brings
    /// them, renewed by the restore.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<[u64; 4]>,
    /// The members the `CORRUPT` alarm names at `last_log_index`, and the index that
    /// raised it (`cairn_fsm::CorruptAlarm`): absent while it is not raised.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub corrupt_members: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corrupt_alarm_index: Option<u64>,
}

/// An online restore in progress when a Raft snapshot was taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingRestoreHeader {
    pub restore_id: String,
    /// How many resources the restore announced.
    pub resource_count: u64,
    /// How many it had received: the records after the table's.
    pub received_count: u64,
    /// Why it can no longer commit, if a resource was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The leases it brought, each `[id, ttl_ms]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<[u64; 2]>,
}

impl SnapshotHeader {
    /// The cluster version the file records; a file that names none was written at
    /// [`cairn_fsm::ClusterVersion::BASELINE`]. A malformed one is an error naming it.
    pub fn cluster_version(&self) -> std::result::Result<cairn_fsm::ClusterVersionState, String> {
        let parse = |field: &str, text: &str| {
            cairn_fsm::ClusterVersion::parse(text)
                .map_err(|e| format!("the snapshot header's {field}: {e}"))
        };
        let mut state = cairn_fsm::ClusterVersionState::default();
        if let Some(text) = &self.cluster_version {
            state.version = parse("cluster_version", text)?;
        }
        if let Some(text) = &self.cluster_version_downgrade {
            state.downgrade = Some(parse("cluster_version_downgrade", text)?);
        }
        Ok(state)
    }

    /// Records `state`, leaving the fields out while they are the defaults.
    pub fn set_cluster_version(&mut self, state: cairn_fsm::ClusterVersionState) {
        let baseline = cairn_fsm::ClusterVersionState::default();
        self.cluster_version =
            (state.version != baseline.version).then(|| state.version.to_string());
        self.cluster_version_downgrade = state.downgrade.map(|v| v.to_string());
    }

    /// The space quota and alarm the file records (none: the defaults).
    pub fn space(&self) -> cairn_fsm::SpaceState {
        cairn_fsm::SpaceState {
            quota_bytes: self.space_quota_bytes.unwrap_or(0),
            alarm_index: self.nospace_alarm_index,
        }
    }

    /// Records `space`, leaving the fields out while they are the defaults.
    pub fn set_space(&mut self, space: cairn_fsm::SpaceState) {
        self.space_quota_bytes = (space.quota_bytes != 0).then_some(space.quota_bytes);
        self.nospace_alarm_index = space.alarm_index;
    }

    /// The `CORRUPT` alarm the file records (none: not raised).
    pub fn corrupt_alarm(&self) -> cairn_fsm::CorruptAlarm {
        cairn_fsm::CorruptAlarm {
            members: self.corrupt_members.clone(),
            raised_index: self.corrupt_alarm_index.unwrap_or(0),
        }
    }

    /// Records `alarm`, leaving the fields out while it is not raised.
    pub fn set_corrupt_alarm(&mut self, alarm: &cairn_fsm::CorruptAlarm) {
        self.corrupt_members = alarm.members.clone();
        self.corrupt_alarm_index = alarm.is_raised().then_some(alarm.raised_index);
    }

    /// The leases the file records.
    pub fn leases(&self) -> Vec<cairn_fsm::Lease> {
        self.leases
            .iter()
            .map(
                |&[id, ttl_ms, granted_revision, renewed_revision]| cairn_fsm::Lease {
                    id,
                    ttl_ms,
                    granted_revision,
                    renewed_revision,
                },
            )
            .collect()
    }

    /// Records `leases`.
    pub fn set_leases(&mut self, leases: &[cairn_fsm::Lease]) {
        self.leases = leases
            .iter()
            .map(|l| [l.id, l.ttl_ms, l.granted_revision, l.renewed_revision])
            .collect();
    }

    /// Every record in the file: the table's, then the pending restore's.
    pub fn record_count(&self) -> u64 {
        self.resource_count
            + self
                .pending_restore
                .as_ref()
                .map(|p| p.received_count)
                .unwrap_or(0)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotFileError {
    #[error("I/O error on {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("not a Cairn snapshot (bad magic at byte 0)")]
    BadMagic,
    #[error("snapshot format version {found} is not supported (this build reads version {SNAPSHOT_FORMAT_VERSION})")]
    UnsupportedVersion { found: u32 },
    #[error("damaged snapshot: {what} at byte {offset}")]
    Damaged { what: String, offset: u64 },
    #[error("checksum mismatch: file says {stored:#010x}, contents hash to {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
}

type Result<T> = std::result::Result<T, SnapshotFileError>;

/// Encodes a snapshot into any writer (a file, or chunks streamed to a client).
pub struct SnapshotEncoder<W: Write> {
    out: W,
    crc: u32,
    written_bytes: u64,
    records_expected: u64,
    records_written: u64,
}

impl<W: Write> SnapshotEncoder<W> {
    pub fn new(out: W, header: &SnapshotHeader) -> io::Result<SnapshotEncoder<W>> {
        let mut encoder = SnapshotEncoder {
            out,
            crc: 0,
            written_bytes: 0,
            records_expected: header.record_count(),
            records_written: 0,
        };
        let header_json = serde_json::to_vec(header).expect("a header always serializes");
        assert!(
            header_json.len() as u64 <= HEADER_BYTES_MAX as u64,
            "snapshot header too large"
        );
        encoder.put(MAGIC)?;
        encoder.put(&SNAPSHOT_FORMAT_VERSION.to_le_bytes())?;
        encoder.put(&(header_json.len() as u32).to_le_bytes())?;
        encoder.put(&header_json)?;
        Ok(encoder)
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        self.written_bytes += bytes.len() as u64;
        self.out.write_all(bytes)
    }

    /// Appends one record: a resource's encoding, as the store keeps it
    /// ([`cairn_fsm::StoredResource::encoded`]), written as it is.
    pub fn append_encoded(&mut self, encoded: &[u8]) -> io::Result<()> {
        assert!(
            self.records_written < self.records_expected,
            "more records than the header announced"
        );
        assert!(
            encoded.len() as u64 <= RECORD_BYTES_MAX as u64,
            "resource larger than a snapshot record"
        );
        self.put(&(encoded.len() as u32).to_le_bytes())?;
        self.put(encoded)?;
        self.records_written += 1;
        Ok(())
    }

    /// Appends one record, encoding `resource` first.
    pub fn append(&mut self, resource: &Resource) -> io::Result<()> {
        self.append_encoded(&resource.encode_to_vec())
    }

    pub fn written_bytes(&self) -> u64 {
        self.written_bytes
    }

    /// Writes the end marker and checksum; returns the writer, the total size and the checksum.
    pub fn finish(mut self) -> io::Result<(W, u64, u32)> {
        assert_eq!(
            self.records_written, self.records_expected,
            "record count differs from the header"
        );
        self.put(END_MARKER)?;
        let crc = self.crc;
        self.out.write_all(&crc.to_le_bytes())?;
        self.out.flush()?;
        Ok((self.out, self.written_bytes + 4, crc))
    }
}

/// A file being written under a temporary name: removed when dropped, unless
/// [`TempFile::keep`] says it was renamed into place. A write that fails or is abandoned
/// gives its space back (a full disk, mostly) and leaves no half-written file.
pub struct TempFile {
    path: PathBuf,
    kept: bool,
}

impl TempFile {
    /// Creates (or truncates) the file at `path`, which is removed on drop from now on.
    pub fn create(path: PathBuf) -> io::Result<(TempFile, File)> {
        let file = File::create(&path)?;
        Ok((TempFile { path, kept: false }, file))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file was renamed into place: nothing is removed.
    pub fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.kept {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Writes a snapshot file; call [`SnapshotWriter::finish`] to make it visible. Dropped
/// unfinished (or failing in `finish` before its rename), it removes its temporary file.
pub struct SnapshotWriter {
    encoder: SnapshotEncoder<BufWriter<File>>,
    tmp: TempFile,
    final_path: PathBuf,
}

impl SnapshotWriter {
    pub fn create(final_path: &Path, header: &SnapshotHeader) -> Result<SnapshotWriter> {
        let tmp_path = final_path.with_extension("tmp");
        let io = |source| SnapshotFileError::Io {
            path: tmp_path.clone(),
            source,
        };
        let (tmp, file) = TempFile::create(tmp_path.clone()).map_err(io)?;
        let encoder =
            SnapshotEncoder::new(BufWriter::with_capacity(1 << 20, file), header).map_err(io)?;
        Ok(SnapshotWriter {
            encoder,
            tmp,
            final_path: final_path.to_path_buf(),
        })
    }

    /// As [`SnapshotEncoder::append_encoded`].
    pub fn append_encoded(&mut self, encoded: &[u8]) -> Result<()> {
        let path = &self.tmp.path;
        self.encoder
            .append_encoded(encoded)
            .map_err(|source| SnapshotFileError::Io {
                path: path.clone(),
                source,
            })
    }

    /// As [`SnapshotEncoder::append`].
    pub fn append(&mut self, resource: &Resource) -> Result<()> {
        self.append_encoded(&resource.encode_to_vec())
    }

    pub fn written_bytes(&self) -> u64 {
        self.encoder.written_bytes()
    }

    /// Writes the trailer, fsyncs, renames into place and fsyncs the directory.
    /// Returns the file's size and checksum.
    pub fn finish(self) -> Result<(u64, u32)> {
        let io = |path: &Path, source| SnapshotFileError::Io {
            path: path.to_path_buf(),
            source,
        };
        let tmp = self.tmp;
        let (out, size, crc) = self.encoder.finish().map_err(|e| io(tmp.path(), e))?;
        let file = out
            .into_inner()
            .map_err(|e| io(tmp.path(), e.into_error()))?;
        file.sync_all().map_err(|e| io(tmp.path(), e))?;
        fs::rename(tmp.path(), &self.final_path).map_err(|e| io(&self.final_path, e))?;
        tmp.keep();
        crate::durable::sync_parent(&self.final_path).map_err(|e| io(&self.final_path, e))?;
        Ok((size, crc))
    }
}

/// Reads a snapshot file record by record, checking structure as it goes.
pub struct SnapshotReader<R: Read> {
    input: R,
    /// What the I/O errors name: the file, or `<snapshot>` for any other input.
    path: PathBuf,
    pub header: SnapshotHeader,
    crc: u32,
    offset: u64,
    records_read: u64,
}

impl SnapshotReader<BufReader<File>> {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|source| SnapshotFileError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        SnapshotReader::reading(BufReader::with_capacity(1 << 20, file), path.to_path_buf())
    }
}

impl<R: Read> SnapshotReader<R> {
    pub fn new(input: R) -> Result<Self> {
        SnapshotReader::reading(input, PathBuf::from("<snapshot>"))
    }

    fn reading(input: R, path: PathBuf) -> Result<Self> {
        let mut reader = SnapshotReader {
            input,
            path,
            header: SnapshotHeader {
                cluster_id: String::new(),
                last_log_index: 0,
                last_log_term: 0,
                last_log_leader_node_id: 0,
                membership: serde_json::Value::Null,
                resource_count: 0,
                created_at_unix_ms: 0,
                applied_initial_entry: false,
                pending_restore: None,
                cluster_version: None,
                cluster_version_downgrade: None,
                space_quota_bytes: None,
                nospace_alarm_index: None,
                corrupt_members: Vec::new(),
                corrupt_alarm_index: None,
                leases: Vec::new(),
            },
            crc: 0,
            offset: 0,
            records_read: 0,
        };
        let mut magic = [0u8; 8];
        reader.take(&mut magic, "magic")?;
        if &magic != MAGIC {
            return Err(SnapshotFileError::BadMagic);
        }
        let version = reader.u32("format version")?;
        if version != SNAPSHOT_FORMAT_VERSION {
            return Err(SnapshotFileError::UnsupportedVersion { found: version });
        }
        let header_len = reader.u32("header length")?;
        if header_len > HEADER_BYTES_MAX {
            return Err(reader.damaged(format!(
                "header length {header_len} exceeds {HEADER_BYTES_MAX}"
            )));
        }
        let mut header = vec![0u8; header_len as usize];
        reader.take(&mut header, "header")?;
        reader.header =
            serde_json::from_slice(&header).map_err(|e| SnapshotFileError::Damaged {
                what: format!("undecodable header: {e}"),
                offset: 16,
            })?;
        Ok(reader)
    }

    fn damaged(&self, what: String) -> SnapshotFileError {
        SnapshotFileError::Damaged {
            what,
            offset: self.offset,
        }
    }

    fn take(&mut self, buf: &mut [u8], what: &str) -> Result<()> {
        match self.input.read_exact(buf) {
            Ok(()) => {
                self.crc = crc32c::crc32c_append(self.crc, buf);
                self.offset += buf.len() as u64;
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                Err(self.damaged(format!("file truncated while reading the {what}")))
            }
            Err(source) => Err(SnapshotFileError::Io {
                path: self.path.clone(),
                source,
            }),
        }
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let mut b = [0u8; 4];
        self.take(&mut b, what)?;
        Ok(u32::from_le_bytes(b))
    }

    /// The byte offset reached so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The next resource of the table (not of a pending restore), or `None`
    /// after the table's last record. Does not check the trailer: use it on a
    /// file that passed [`verify`].
    pub fn next_table_resource(&mut self) -> Result<Option<Resource>> {
        if self.next_section() != Section::Table {
            return Ok(None);
        }
        self.next_resource()
    }

    /// How many records have been read: the first `header.resource_count`
    /// are the table's, the rest the pending restore's.
    pub fn records_read(&self) -> u64 {
        self.records_read
    }

    /// The section the next record belongs to.
    fn next_section(&self) -> Section {
        if self.records_read < self.header.resource_count {
            Section::Table
        } else {
            Section::PendingRestore
        }
    }

    /// As [`SnapshotReader::next_resource`], with the section the record belongs to.
    pub fn next_record(&mut self) -> Result<Option<(Resource, Section)>> {
        let section = self.next_section();
        Ok(self.next_resource()?.map(|resource| (resource, section)))
    }

    /// The next record's resource (see [`SnapshotReader::next_record`] for
    /// its section), or `None` after the last one once the trailer and
    /// checksum have been verified.
    pub fn next_resource(&mut self) -> Result<Option<Resource>> {
        if self.records_read == self.header.record_count() {
            let mut end = [0u8; 8];
            self.take(&mut end, "end marker")?;
            if &end != END_MARKER {
                return Err(self.damaged(
                    "missing end marker (more records than the header announced?)".into(),
                ));
            }
            let computed = self.crc;
            let mut stored = [0u8; 4];
            self.input
                .read_exact(&mut stored)
                .map_err(|_| self.damaged("file truncated while reading the checksum".into()))?;
            let stored = u32::from_le_bytes(stored);
            if stored != computed {
                return Err(SnapshotFileError::Checksum { stored, computed });
            }
            let mut extra = [0u8; 1];
            if self
                .input
                .read(&mut extra)
                .map_err(|source| SnapshotFileError::Io {
                    path: self.path.clone(),
                    source,
                })?
                != 0
            {
                return Err(SnapshotFileError::Damaged {
                    what: "trailing bytes after the checksum".into(),
                    offset: self.offset + 4,
                });
            }
            return Ok(None);
        }
        let record_offset = self.offset;
        let len = self.u32("record length")?;
        if len > RECORD_BYTES_MAX {
            return Err(SnapshotFileError::Damaged {
                what: format!(
                    "record {} claims {len} bytes (max {RECORD_BYTES_MAX})",
                    self.records_read
                ),
                offset: record_offset,
            });
        }
        let mut bytes = vec![0u8; len as usize];
        self.take(&mut bytes, "record")?;
        let resource =
            Resource::decode(bytes.as_slice()).map_err(|e| SnapshotFileError::Damaged {
                what: format!("record {} does not decode: {e}", self.records_read),
                offset: record_offset,
            })?;
        self.records_read += 1;
        Ok(Some(resource))
    }
}

/// Reads the whole file and checks its structure and checksum, calling
/// `visit` on every resource. Nothing is trusted until this returns Ok.
pub fn verify(path: &Path, mut visit: impl FnMut(&Resource, Section)) -> Result<SnapshotHeader> {
    let mut reader = SnapshotReader::open(path)?;
    while let Some((resource, section)) = reader.next_record()? {
        visit(&resource, section);
    }
    Ok(reader.header)
}

/// The section of a snapshot file a record belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// The resource table.
    Table,
    /// The resources of a restore pending when the snapshot was taken.
    PendingRestore,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(count: u64) -> SnapshotHeader {
        SnapshotHeader {
            cluster_id: "c1".into(),
            last_log_index: 9,
            last_log_term: 2,
            last_log_leader_node_id: 1,
            membership: serde_json::json!({"voters": [1, 2, 3]}),
            resource_count: count,
            created_at_unix_ms: 0,
            applied_initial_entry: false,
            pending_restore: None,
            cluster_version: None,
            cluster_version_downgrade: None,
            space_quota_bytes: None,
            nospace_alarm_index: None,
            corrupt_members: Vec::new(),
            corrupt_alarm_index: None,
            leases: Vec::new(),
        }
    }

    fn resource(name: &str) -> Resource {
        Resource {
            id: Some(cairn_proto::v1::Id {
                name: name.into(),
                uid: "u".into(),
                ..Default::default()
            }),
            version: "3".into(),
            ..Default::default()
        }
    }

    fn write(dir: &Path, names: &[&str]) -> PathBuf {
        let path = dir.join("s.snap");
        let mut w = SnapshotWriter::create(&path, &header(names.len() as u64)).unwrap();
        for n in names {
            w.append(&resource(n)).unwrap();
        }
        w.finish().unwrap();
        path
    }

    #[test]
    fn a_written_snapshot_reads_back_whole() {
        // What is written comes back in order, with its header, and verifies.
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), &["a", "b", "c"]);
        let mut names = vec![];
        let h = verify(&path, |r, _| {
            names.push(r.id.as_ref().unwrap().name.clone())
        })
        .unwrap();
        assert_eq!(h, header(3));
        assert_eq!(names, ["a", "b", "c"]);
        assert!(!path.with_extension("tmp").exists());
    }

    #[test]
    fn an_unfinished_snapshot_leaves_no_temporary_file() {
        // Dropped before `finish` (a failed write, an abandoned one), the writer removes its
        // temporary file; a finished one is renamed into place. Failed before SnapshotWriter
        // removed it itself: each caller cleaned up, or not (the offline restore did not).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.snap");
        let mut w = SnapshotWriter::create(&path, &header(2)).unwrap();
        w.append(&resource("a")).unwrap();
        assert!(path.with_extension("tmp").exists());
        drop(w);
        assert!(!path.with_extension("tmp").exists());
        assert!(!path.exists());
        write(dir.path(), &["a"]);
        assert!(path.exists() && !path.with_extension("tmp").exists());
    }

    #[test]
    fn every_kind_of_damage_has_its_own_error() {
        // Flipped byte, truncation, wrong magic, other version and empty file are told apart.
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), &["a", "b"]);
        let good = fs::read(&path).unwrap();
        let check = |bytes: Vec<u8>| {
            let p = dir.path().join("bad.snap");
            fs::write(&p, bytes).unwrap();
            verify(&p, |_, _| {}).unwrap_err()
        };
        let mut flipped = good.clone();
        let i = good.len() - 20;
        flipped[i] ^= 0x40;
        assert!(matches!(
            check(flipped),
            SnapshotFileError::Checksum { .. } | SnapshotFileError::Damaged { .. }
        ));
        assert!(matches!(
            check(good[..good.len() - 9].to_vec()),
            SnapshotFileError::Damaged { .. }
        ));
        let mut magic = good.clone();
        magic[0] = b'X';
        assert!(matches!(check(magic), SnapshotFileError::BadMagic));
        let mut version = good.clone();
        version[8] = 9;
        assert!(matches!(
            check(version),
            SnapshotFileError::UnsupportedVersion { found: 9 }
        ));
        assert!(matches!(
            check(vec![]),
            SnapshotFileError::Damaged { offset: 0, .. }
        ));
    }
}
