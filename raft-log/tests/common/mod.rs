//! Shared by the integration tests: a type config, deterministic entries, and the child-process
//! plumbing of the crash and lock tests.

#![allow(dead_code)]

use std::io::Cursor;
use std::path::Path;

use openraft::CommittedLeaderId;
use openraft::Entry;
use openraft::EntryPayload;
use openraft::LogId;
use serde::Deserialize;
use serde::Serialize;

/// The application data of the test config: opaque command bytes, as the node's will be.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command(pub Vec<u8>);

openraft::declare_raft_types!(
    /// Type config of the tests: u64 node ids, BasicNode, openraft's Entry, `Command` data.
    pub TestConfig:
        D = Command,
        R = (),
);

pub type Store = cairn_raft_log::LogStore<TestConfig>;

pub use cairn_raft_log::LogEngineKind;
pub use cairn_raft_log::LogOptions;

/// Both engines: every log-store behaviour test runs against each.
pub const ENGINES: [LogEngineKind; 2] = [LogEngineKind::Wal, LogEngineKind::Sled];

/// Default options for `engine`.
pub fn options(engine: LogEngineKind) -> LogOptions {
    LogOptions::with_engine(engine)
}

/// WAL options with small segments (so tests rotate often) and a tail of `tail_bytes_max`.
pub fn small_wal(segment_size_bytes: u64, tail_bytes_max: u64) -> LogOptions {
    LogOptions {
        segment_size_bytes,
        tail_bytes_max,
        ..LogOptions::with_engine(LogEngineKind::Wal)
    }
}

/// The WAL's segment files in `dir`, sorted by name (base index, then id).
pub fn segment_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir.join("segments"))
        .map(|listing| {
            listing
                .filter_map(|item| item.ok().map(|item| item.path()))
                .filter(|path| path.extension().is_some_and(|ext| ext == "wal"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// Generates one `#[test]` per engine for each listed `fn name(engine: LogEngineKind)`:
/// `name::wal` and `name::sled`.
#[macro_export]
macro_rules! for_each_engine {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn wal() {
                    super::$name(cairn_raft_log::LogEngineKind::Wal)
                }
                #[test]
                fn sled() {
                    super::$name(cairn_raft_log::LogEngineKind::Sled)
                }
            }
        )*
    };
}

/// A log id of term 1 written by node 0.
pub fn log_id(index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(1, 0), index)
}

/// The payload stored at `index`, a pure function of the index so any process can check it.
pub fn payload_for(index: u64) -> Vec<u8> {
    payload_scaled(index, 1)
}

/// [`payload_for`] with `scale` times the length (16 + scale × (index % 240) bytes).
pub fn payload_scaled(index: u64, scale: usize) -> Vec<u8> {
    let len = 16 + scale * (index % 240) as usize;
    let mut state = index.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// A normal entry at `index` carrying `payload_for(index)`.
pub fn entry(index: u64) -> Entry<TestConfig> {
    entry_scaled(index, 1)
}

/// A normal entry at `index` carrying `payload_scaled(index, scale)`.
pub fn entry_scaled(index: u64, scale: usize) -> Entry<TestConfig> {
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Command(payload_scaled(index, scale))),
    }
}

/// Checks that `got` is exactly the entry the tests write at `index`.
pub fn check_entry(index: u64, got: &Entry<TestConfig>) -> Result<(), String> {
    check_entry_scaled(index, got, 1)
}

/// Checks that `got` is exactly `entry_scaled(index, scale)`.
pub fn check_entry_scaled(index: u64, got: &Entry<TestConfig>, scale: usize) -> Result<(), String> {
    if got.log_id != log_id(index) {
        return Err(format!("entry {index} has log id {}", got.log_id));
    }
    match &got.payload {
        EntryPayload::Normal(Command(bytes)) if *bytes == payload_scaled(index, scale) => Ok(()),
        other => Err(format!("entry {index} has the wrong payload: {other:?}")),
    }
}

/// The FUSE skip rule: returns `true` (and says why, loudly) when FUSE cannot be used here.
pub fn skip_without_fuse(test: &str) -> bool {
    match cairn_powercut_fs::fuse_unavailable_reason() {
        Some(reason) => {
            println!("SKIPPED {test}: FUSE is unavailable on this machine: {reason}");
            eprintln!("SKIPPED {test}: FUSE is unavailable on this machine: {reason}");
            true
        }
        None => false,
    }
}

/// A random-enough seed for a test run, unless `CAIRN_TEST_SEED` replays one.
pub fn test_seed() -> u64 {
    if let Some(seed) = std::env::var("CAIRN_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return seed;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}

/// Re-invokes the current test binary to run only `test_name`, with `envs` set; stdout piped.
pub fn spawn_self(test_name: &str, envs: &[(&str, String)]) -> std::process::Child {
    let exe = std::env::current_exe().expect("current test binary");
    let mut command = std::process::Command::new(exe);
    command
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit());
    for (key, value) in envs {
        command.env(key, value);
    }
    command.spawn().expect("spawn child test process")
}

/// Whether `path` exists (for readability in assertions).
pub fn exists(path: &Path) -> bool {
    path.exists()
}

/// One write a [`FaultyEngine`] is asked for.
#[derive(Debug)]
pub enum Write<'a> {
    PutEntries(&'a [(u64, Vec<u8>)]),
    ReplaceEntriesFrom(&'a [(u64, Vec<u8>)]),
    DeleteEntriesFrom(u64),
    DeleteEntriesThrough(u64),
    PutMeta(&'a str),
    Sync,
}

/// The faults a test puts around sled in a [`FaultyEngine`]; every hook passes through unless a
/// test says otherwise.
pub trait Faults: Send + Sync + 'static {
    /// Before `write` reaches sled: `Ok(true)` lets it through, `Ok(false)` drops it (the call
    /// succeeds, nothing happens: a crash just before it), `Err` fails it.
    fn before(&self, _write: &Write<'_>) -> Result<bool, cairn_raft_log::LogError> {
        Ok(true)
    }
    /// After `write` ran on sled.
    fn after(
        &self,
        _sled: &cairn_raft_log::SledEngine,
        _write: &Write<'_>,
    ) -> Result<(), cairn_raft_log::LogError> {
        Ok(())
    }
    /// Every entry read back, as sled returned it.
    fn damage(&self, _entry: &mut (u64, Vec<u8>)) {}
    /// Whether a range read loses the entry at `index`.
    fn missing(&self, _index: u64) -> bool {
        false
    }
}

/// A [`cairn_raft_log::LogEngine`]: sled, with a test's [`Faults`] around every call.
pub struct FaultyEngine<F> {
    pub sled: cairn_raft_log::SledEngine,
    pub faults: F,
}

impl<F: Faults> FaultyEngine<F> {
    /// Sled in `dir/sled`, with `faults`.
    pub fn open(dir: &Path, faults: F) -> std::sync::Arc<FaultyEngine<F>> {
        std::sync::Arc::new(FaultyEngine {
            sled: cairn_raft_log::SledEngine::open(&dir.join("sled"), true).expect("sled"),
            faults,
        })
    }

    fn write(
        &self,
        write: Write<'_>,
        run: impl FnOnce(&cairn_raft_log::SledEngine) -> Result<(), cairn_raft_log::LogError>,
    ) -> Result<(), cairn_raft_log::LogError> {
        if self.faults.before(&write)? {
            run(&self.sled)?;
            self.faults.after(&self.sled, &write)?;
        }
        Ok(())
    }

    fn read_one(
        &self,
        entry: Option<(u64, Vec<u8>)>,
    ) -> Result<Option<(u64, Vec<u8>)>, cairn_raft_log::LogError> {
        Ok(entry.map(|mut entry| {
            self.faults.damage(&mut entry);
            entry
        }))
    }
}

impl<F: Faults> cairn_raft_log::LogEngine for FaultyEngine<F> {
    fn put_entries(&self, entries: &[(u64, Vec<u8>)]) -> Result<(), cairn_raft_log::LogError> {
        self.write(Write::PutEntries(entries), |sled| sled.put_entries(entries))
    }
    fn replace_entries_from(
        &self,
        entries: &[(u64, Vec<u8>)],
    ) -> Result<(), cairn_raft_log::LogError> {
        self.write(Write::ReplaceEntriesFrom(entries), |sled| {
            sled.replace_entries_from(entries)
        })
    }
    fn delete_entries_from(&self, from_index: u64) -> Result<(), cairn_raft_log::LogError> {
        self.write(Write::DeleteEntriesFrom(from_index), |sled| {
            sled.delete_entries_from(from_index)
        })
    }
    fn delete_entries_through(&self, through_index: u64) -> Result<(), cairn_raft_log::LogError> {
        self.write(Write::DeleteEntriesThrough(through_index), |sled| {
            sled.delete_entries_through(through_index)
        })
    }
    fn read_entries(
        &self,
        start: u64,
        end: Option<u64>,
        bytes_max: u64,
    ) -> Result<Vec<(u64, Vec<u8>)>, cairn_raft_log::LogError> {
        let mut entries = self.sled.read_entries(start, end, bytes_max)?;
        entries.retain(|(index, _)| !self.faults.missing(*index));
        entries
            .iter_mut()
            .for_each(|entry| self.faults.damage(entry));
        Ok(entries)
    }
    fn last_entry(&self) -> Result<Option<(u64, Vec<u8>)>, cairn_raft_log::LogError> {
        self.read_one(self.sled.last_entry()?)
    }
    fn first_entry(&self) -> Result<Option<(u64, Vec<u8>)>, cairn_raft_log::LogError> {
        self.read_one(self.sled.first_entry()?)
    }
    fn put_meta(&self, key: &str, value: &[u8]) -> Result<(), cairn_raft_log::LogError> {
        self.write(Write::PutMeta(key), |sled| sled.put_meta(key, value))
    }
    fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>, cairn_raft_log::LogError> {
        self.sled.get_meta(key)
    }
    fn sync(&self) -> Result<(), cairn_raft_log::LogError> {
        self.write(Write::Sync, |sled| sled.sync())
    }
}
