//! Crash states rebuilt from a trace ([`crate::trace`]), in the manner of ALICE (Pillai et al.,
//! OSDI 2014): for a crash at a point of the trace, the file trees a disk could hold.
//!
//! **Contract.** Pure: no I/O but [`CrashTree::write_to`]. For a crash *point* `p` (the
//! operations at positions `< p` were issued, none after), [`window`] says, per file, which of
//! its content changes (writes, truncates, `fallocate`s) are durable — every one before the
//! file's last sync — and which are not; and per directory, which of its name changes
//! (creates, renames, unlinks) are durable and which are not. A [`Choice`] picks, for each
//! change not yet durable, whether the disk kept it; [`build`] turns the window and a choice
//! into the tree the disk holds. The model, pessimistic in the way of
//! [`crate::PowerCutFs`] (whose power cut is one choice of this model):
//!
//! - **Data.** A file's content is every change before its last `fsync`/`fdatasync`, then any
//!   subset of the later ones, applied in the order they were made (the page cache writes
//!   back in an order of its own); a write kept in part is *torn*: any subset of its 512-byte
//!   sectors reached the disk, a sector whole or not at all, the others keeping what they held.
//! - **Names.** A directory's names change in the order the changes were made: a crash keeps
//!   a prefix of them (a journal commits in order; each directory on its own, so a rename in
//!   one directory can survive while a sync of a file in another was lost). The prefix is at
//!   least what a sync made durable:
//!   - [`Semantics::FileSyncNamesFile`] (ext4 with `data=ordered`, like the filesystem's
//!     default mode): an `fsync` of a directory makes its names durable; an `fsync` of a file
//!     makes durable every name change of its directories up to the last one concerning that
//!     file, and the names of those directories in their parents, up to the root;
//!   - [`Semantics::StrictDirectories`]: only an `fsync` of a directory makes its names
//!     durable (not its own name in its parent).
//!
//!   A name whose file's data never reached the disk names an empty file (delayed allocation).
//!
//! Checking only at the points just before each sync (and at the end of the trace) loses
//! nothing: between two syncs every state of an earlier point is also a state of the later
//! one (its changes are a subset of the later point's unsynced changes), and a later point
//! knows at least as many markers.
//!
//! **Invariants.** [`build`] never keeps less than the window's durable part; the nothing-kept
//! choice and the everything-kept choice bound every other one; the same trace, window and
//! choice always give the same tree.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::collections::HashMap;
use std::ffi::OsString;
use std::hash::Hash;
use std::hash::Hasher;
use std::path::Path;
use std::path::PathBuf;

use crate::trace::TraceOp;
use crate::trace::TraceRecord;
use crate::SECTOR_BYTES;

/// The root directory's inode number, as the filesystem numbers it.
const ROOT: u64 = 1;

/// What a sync makes durable besides data (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Semantics {
    /// ext4-like: a file's sync also makes its names durable.
    FileSyncNamesFile,
    /// Only a directory's sync makes names durable.
    StrictDirectories,
}

impl Semantics {
    pub fn name(self) -> &'static str {
        match self {
            Semantics::FileSyncNamesFile => "file-sync-names-file",
            Semantics::StrictDirectories => "strict-directories",
        }
    }
}

/// One file's or directory's changes before a crash point: trace positions, in order, the
/// first `durable` of them made durable by a sync.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub positions: Vec<usize>,
    pub durable: usize,
}

impl Changes {
    /// The changes a crash may or may not have kept.
    pub fn unsynced(&self) -> &[usize] {
        &self.positions[self.durable..]
    }
}

/// What is durable and what is not at one crash point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// Operations at positions `< point` were issued.
    pub point: usize,
    pub semantics: Semantics,
    /// Content changes of every file created before the point, by inode.
    pub files: BTreeMap<u64, Changes>,
    /// Name changes of every directory, by inode (the root included).
    pub directories: BTreeMap<u64, Changes>,
    /// A path each inode had, for people.
    pub paths: BTreeMap<u64, String>,
}

/// The durability points of a trace: the positions of its syncs, then its end.
pub fn sync_points(records: &[TraceRecord]) -> Vec<usize> {
    let mut points: Vec<usize> = records
        .iter()
        .enumerate()
        .filter(|(_, record)| record.op.is_sync())
        .map(|(position, _)| position)
        .collect();
    points.push(records.len());
    points
}

/// Whether name change `op` concerns inode `ino` (creates, moves, replaces or removes it).
fn concerns(op: &TraceOp, ino: u64) -> bool {
    match op {
        TraceOp::Create { ino: created, .. } => *created == ino,
        TraceOp::Rename {
            ino: moved,
            replaced,
            ..
        } => *moved == ino || *replaced == Some(ino),
        TraceOp::Unlink { ino: removed, .. } => *removed == ino,
        _ => false,
    }
}

/// Computes the [`Window`] of a crash at `point` (every operation before it issued).
pub fn window(records: &[TraceRecord], point: usize, semantics: Semantics) -> Window {
    assert!(
        point <= records.len(),
        "a crash point lies within the trace"
    );
    let mut files: BTreeMap<u64, Changes> = BTreeMap::new();
    let mut directories: BTreeMap<u64, Changes> = BTreeMap::new();
    directories.insert(ROOT, Changes::default());
    let mut paths = BTreeMap::from([(ROOT, "/".to_string())]);
    // The directory each directory is named in now.
    let mut parent_of: HashMap<u64, u64> = HashMap::new();
    // The directories with name changes concerning each inode.
    let mut named_in: HashMap<u64, BTreeSet<u64>> = HashMap::new();
    for (position, record) in records[..point].iter().enumerate() {
        match &record.op {
            TraceOp::Create {
                parent,
                ino,
                directory,
                ..
            } => {
                directories
                    .entry(*parent)
                    .or_default()
                    .positions
                    .push(position);
                named_in.entry(*ino).or_default().insert(*parent);
                paths.insert(*ino, record.path.clone());
                if *directory {
                    parent_of.insert(*ino, *parent);
                    directories.entry(*ino).or_default();
                } else {
                    files.entry(*ino).or_default();
                }
            }
            TraceOp::Write { ino, .. }
            | TraceOp::SetLen { ino, .. }
            | TraceOp::Fallocate { ino, .. } => {
                files.entry(*ino).or_default().positions.push(position);
            }
            TraceOp::Rename {
                parent,
                new_parent,
                ino,
                replaced,
                ..
            } => {
                directories
                    .entry(*parent)
                    .or_default()
                    .positions
                    .push(position);
                if new_parent != parent {
                    directories
                        .entry(*new_parent)
                        .or_default()
                        .positions
                        .push(position);
                }
                for concerned in std::iter::once(*ino).chain(*replaced) {
                    let dirs = named_in.entry(concerned).or_default();
                    dirs.insert(*parent);
                    dirs.insert(*new_parent);
                }
                if directories.contains_key(ino) {
                    parent_of.insert(*ino, *new_parent);
                }
            }
            TraceOp::Unlink { parent, ino, .. } => {
                directories
                    .entry(*parent)
                    .or_default()
                    .positions
                    .push(position);
                named_in.entry(*ino).or_default().insert(*parent);
            }
            TraceOp::SyncFile { ino, .. } if !directories.contains_key(ino) => {
                let changes = files.entry(*ino).or_default();
                changes.durable = changes.positions.len();
                if semantics == Semantics::FileSyncNamesFile {
                    let dirs: Vec<u64> = named_in
                        .get(ino)
                        .map(|dirs| dirs.iter().copied().collect())
                        .unwrap_or_default();
                    for dir in dirs {
                        force_through_last(records, &mut directories, dir, *ino);
                        force_chain(records, &mut directories, &parent_of, dir);
                    }
                }
            }
            TraceOp::SyncFile { ino, .. } | TraceOp::SyncDirectory { ino } => {
                let changes = directories.entry(*ino).or_default();
                changes.durable = changes.positions.len();
                if semantics == Semantics::FileSyncNamesFile {
                    force_chain(records, &mut directories, &parent_of, *ino);
                }
            }
            TraceOp::Marker(_) => {}
        }
    }
    Window {
        point,
        semantics,
        files,
        directories,
        paths,
    }
}

/// Makes durable every name change of `dir` up to its last one concerning `ino`.
fn force_through_last(
    records: &[TraceRecord],
    directories: &mut BTreeMap<u64, Changes>,
    dir: u64,
    ino: u64,
) {
    let Some(changes) = directories.get_mut(&dir) else {
        return;
    };
    if let Some(last) = changes
        .positions
        .iter()
        .rposition(|&position| concerns(&records[position].op, ino))
    {
        changes.durable = changes.durable.max(last + 1);
    }
}

/// Makes `dir`'s name durable in its parent, and so on up to the root.
fn force_chain(
    records: &[TraceRecord],
    directories: &mut BTreeMap<u64, Changes>,
    parent_of: &HashMap<u64, u64>,
    dir: u64,
) {
    let mut at = dir;
    let mut steps = 0;
    while at != ROOT && steps <= directories.len() {
        let Some(&parent) = parent_of.get(&at) else {
            return;
        };
        force_through_last(records, directories, parent, at);
        at = parent;
        steps += 1;
    }
}

/// Whether a crash kept one unsynced change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Keep {
    Lost,
    Whole,
    /// A write of which only the sectors marked `true` reached the disk (one flag per
    /// 512-byte sector the write touches, from the one holding its first byte).
    Torn(Vec<bool>),
}

/// For each unsynced change of a window, whether the disk kept it. Directories and files not
/// listed keep nothing unsynced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Choice {
    /// Per directory: how many of its unsynced name changes (a prefix) were kept.
    pub directories: BTreeMap<u64, usize>,
    /// Per file: one [`Keep`] per unsynced change, in order (missing ones are lost).
    pub files: BTreeMap<u64, Vec<Keep>>,
}

impl Choice {
    /// Every unsynced change kept whole: what `kill -9` leaves (the page cache survives).
    pub fn everything(window: &Window) -> Choice {
        Choice {
            directories: window
                .directories
                .iter()
                .map(|(ino, changes)| (*ino, changes.unsynced().len()))
                .collect(),
            files: window
                .files
                .iter()
                .map(|(ino, changes)| (*ino, vec![Keep::Whole; changes.unsynced().len()]))
                .collect(),
        }
    }

    /// A digest of what this choice applies in `window`: per directory the length of the
    /// prefix of its name changes, per file the changes kept (and how). Equal digests give
    /// equal trees, also at different crash points of one trace (a change kept whole before
    /// a sync and made durable by it count alike), so it skips states already planned
    /// without building them. (Different digests may still give equal trees.)
    pub fn applied_digest(&self, window: &Window) -> u64 {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for (ino, changes) in &window.directories {
            let kept = changes.durable
                + self
                    .directories
                    .get(ino)
                    .copied()
                    .unwrap_or(0)
                    .min(changes.unsynced().len());
            if kept > 0 {
                (ino, kept).hash(&mut hasher);
            }
        }
        for (ino, changes) in &window.files {
            let keeps = self.files.get(ino);
            let keep_of = |k: usize| {
                if k < changes.durable {
                    &Keep::Whole
                } else {
                    keeps
                        .and_then(|keeps| keeps.get(k - changes.durable))
                        .unwrap_or(&Keep::Lost)
                }
            };
            // The changes kept whole from the first on count as one prefix length.
            let prefix = (0..changes.positions.len())
                .take_while(|k| *keep_of(*k) == Keep::Whole)
                .count();
            (ino, prefix).hash(&mut hasher);
            for k in prefix..changes.positions.len() {
                match keep_of(k) {
                    Keep::Lost => {}
                    Keep::Whole => (changes.positions[k], 1u8).hash(&mut hasher),
                    Keep::Torn(sectors) => (changes.positions[k], 2u8, sectors).hash(&mut hasher),
                }
            }
        }
        hasher.finish()
    }

    /// The choice in words: what was kept beyond the durable part.
    pub fn describe(&self, window: &Window) -> String {
        let path = |ino: &u64| {
            window
                .paths
                .get(ino)
                .cloned()
                .unwrap_or_else(|| format!("ino {ino}"))
        };
        let mut parts = Vec::new();
        for (ino, changes) in &window.directories {
            let unsynced = changes.unsynced().len();
            if unsynced == 0 {
                continue;
            }
            let kept = self
                .directories
                .get(ino)
                .copied()
                .unwrap_or(0)
                .min(unsynced);
            parts.push(format!(
                "names of {}: {kept} of {unsynced} unsynced changes kept",
                path(ino)
            ));
        }
        for (ino, changes) in &window.files {
            let unsynced = changes.unsynced();
            if unsynced.is_empty() {
                continue;
            }
            let keeps = self.files.get(ino);
            let shown: Vec<String> = unsynced
                .iter()
                .enumerate()
                .map(|(k, position)| {
                    let keep = keeps.and_then(|keeps| keeps.get(k)).unwrap_or(&Keep::Lost);
                    let what = match keep {
                        Keep::Lost => "lost".to_string(),
                        Keep::Whole => "kept".to_string(),
                        Keep::Torn(sectors) => format!(
                            "torn (sectors kept: {:?})",
                            sectors
                                .iter()
                                .enumerate()
                                .filter(|(_, kept)| **kept)
                                .map(|(sector, _)| sector)
                                .collect::<Vec<_>>()
                        ),
                    };
                    format!("#{position} {what}")
                })
                .collect();
            parts.push(format!("data of {}: {}", path(ino), shown.join(", ")));
        }
        if parts.is_empty() {
            "nothing unsynced".to_string()
        } else {
            parts.join("; ")
        }
    }
}

/// A file tree a disk could hold after a crash: relative paths to contents (`None` for a
/// directory), every directory before what it holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrashTree {
    pub nodes: BTreeMap<PathBuf, Option<Vec<u8>>>,
}

impl CrashTree {
    /// A digest of the whole tree, to skip states already checked.
    pub fn digest(&self) -> u64 {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.nodes.hash(&mut hasher);
        hasher.finish()
    }

    /// Creates the tree under `root` (an existing, empty directory).
    pub fn write_to(&self, root: &Path) -> std::io::Result<()> {
        for (path, content) in &self.nodes {
            let at = root.join(path);
            match content {
                None => std::fs::create_dir(&at)?,
                Some(bytes) => std::fs::write(&at, bytes)?,
            }
        }
        Ok(())
    }

    /// The content of the file at `path`, if there is one.
    pub fn file(&self, path: &Path) -> Option<&[u8]> {
        self.nodes.get(path).and_then(|content| content.as_deref())
    }
}

/// The tree a disk holds after a crash in `window` that kept what `choice` says.
pub fn build(records: &[TraceRecord], window: &Window, choice: &Choice) -> CrashTree {
    let is_directory = |ino: &u64| window.directories.contains_key(ino);
    let mut tree = CrashTree::default();
    let mut pending = vec![(ROOT, PathBuf::new())];
    let mut visited = BTreeSet::new();
    while let Some((dir, path)) = pending.pop() {
        if !visited.insert(dir) {
            continue;
        }
        for (name, ino) in names(records, window, choice, dir) {
            let child = path.join(&name);
            if is_directory(&ino) {
                if visited.contains(&ino) {
                    continue;
                }
                tree.nodes.insert(child.clone(), None);
                pending.push((ino, child));
            } else {
                tree.nodes
                    .insert(child, Some(content(records, window, choice, ino)));
            }
        }
    }
    tree
}

/// Directory `dir`'s names after its durable changes and the prefix `choice` kept.
fn names(
    records: &[TraceRecord],
    window: &Window,
    choice: &Choice,
    dir: u64,
) -> BTreeMap<OsString, u64> {
    let mut entries = BTreeMap::new();
    let Some(changes) = window.directories.get(&dir) else {
        return entries;
    };
    let kept = changes.durable
        + choice
            .directories
            .get(&dir)
            .copied()
            .unwrap_or(0)
            .min(changes.unsynced().len());
    for &position in &changes.positions[..kept] {
        match &records[position].op {
            TraceOp::Create { name, ino, .. } => {
                entries.insert(name.clone(), *ino);
            }
            TraceOp::Rename {
                parent,
                name,
                new_parent,
                new_name,
                ino,
                ..
            } => {
                if *parent == dir {
                    entries.remove(name);
                }
                if *new_parent == dir {
                    entries.insert(new_name.clone(), *ino);
                }
            }
            TraceOp::Unlink { name, .. } => {
                entries.remove(name);
            }
            other => unreachable!("a directory's changes are name changes, not {other:?}"),
        }
    }
    entries
}

/// File `ino`'s content after its durable changes and those `choice` kept.
fn content(records: &[TraceRecord], window: &Window, choice: &Choice, ino: u64) -> Vec<u8> {
    let mut data = Vec::new();
    let Some(changes) = window.files.get(&ino) else {
        return data;
    };
    let keeps = choice.files.get(&ino);
    for (k, &position) in changes.positions.iter().enumerate() {
        let keep = if k < changes.durable {
            &Keep::Whole
        } else {
            keeps
                .and_then(|keeps| keeps.get(k - changes.durable))
                .unwrap_or(&Keep::Lost)
        };
        if *keep == Keep::Lost {
            continue;
        }
        match &records[position].op {
            TraceOp::Write {
                offset,
                data: bytes,
                ..
            } => match keep {
                Keep::Torn(sectors) => {
                    let first_sector = offset / SECTOR_BYTES;
                    let end = offset + bytes.len() as u64;
                    for (n, kept) in sectors.iter().enumerate() {
                        let sector = first_sector + n as u64;
                        let from = (sector * SECTOR_BYTES).max(*offset);
                        let to = ((sector + 1) * SECTOR_BYTES).min(end);
                        if *kept && from < to {
                            let slice = &bytes[(from - offset) as usize..(to - offset) as usize];
                            crate::write_at(&mut data, from, slice);
                        }
                    }
                }
                _ => crate::write_at(&mut data, *offset, bytes),
            },
            TraceOp::SetLen { len_bytes, .. } => data.resize(*len_bytes as usize, 0),
            TraceOp::Fallocate { end_bytes, .. } => {
                if (data.len() as u64) < *end_bytes {
                    data.resize(*end_bytes as usize, 0);
                }
            }
            other => unreachable!("a file's changes are content changes, not {other:?}"),
        }
    }
    data
}

/// The sectors a write of `len_bytes` at `offset` touches.
pub fn sectors_of(offset: u64, len_bytes: u64) -> usize {
    if len_bytes == 0 {
        return 0;
    }
    let first = offset / SECTOR_BYTES;
    let last = (offset + len_bytes).div_ceil(SECTOR_BYTES);
    (last - first) as usize
}

/// Which family a planned crash state belongs to (the budget keeps the earlier ones first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PlanClass {
    /// Nothing unsynced kept, or everything kept.
    Extreme,
    /// One directory's or one file's unsynced changes in turn, everything else kept.
    Systematic,
    /// A random subset of everything.
    Random,
}

/// One crash state to build and check.
#[derive(Clone, Debug)]
pub struct Planned {
    pub class: PlanClass,
    pub label: String,
    pub choice: Choice,
}

/// At most this many prefixes of one file's or directory's unsynced changes are planned.
pub const PREFIXES_PER_ITEM_MAX: usize = 8;
/// A window with at most this many combinations of its unsynced changes (each kept whole or
/// lost) has every one of them planned.
pub const EXHAUSTIVE_STATES_MAX: usize = 32;

/// The crash states to check at one window: nothing kept; everything kept; for each
/// directory, prefixes of its unsynced name changes (everything else kept); for each file,
/// prefixes of its unsynced changes with the next one torn at random sectors (everything
/// else kept); every combination of changes kept whole or lost, when there are at most
/// [`EXHAUSTIVE_STATES_MAX`]; and `random_states` random subsets. `random` is the caller's
/// seeded source.
pub fn plan(
    records: &[TraceRecord],
    window: &Window,
    random_states: usize,
    random: &mut dyn FnMut() -> u64,
) -> Vec<Planned> {
    let everything = Choice::everything(window);
    let mut planned = vec![
        Planned {
            class: PlanClass::Extreme,
            label: "nothing unsynced kept".to_string(),
            choice: Choice::default(),
        },
        Planned {
            class: PlanClass::Extreme,
            label: "everything kept".to_string(),
            choice: everything.clone(),
        },
    ];
    let path = |ino: &u64| window.paths.get(ino).cloned().unwrap_or_default();
    for (ino, changes) in &window.directories {
        let unsynced = changes.unsynced().len();
        for kept in spread(unsynced) {
            if kept == unsynced {
                continue;
            }
            let mut choice = everything.clone();
            choice.directories.insert(*ino, kept);
            planned.push(Planned {
                class: PlanClass::Systematic,
                label: format!("names of {}: first {kept} of {unsynced}", path(ino)),
                choice,
            });
        }
    }
    for (ino, changes) in &window.files {
        let unsynced = changes.unsynced();
        for kept in spread(unsynced.len()) {
            if kept == unsynced.len() {
                continue;
            }
            let mut keeps = vec![Keep::Whole; kept];
            keeps.push(random_tear(&records[unsynced[kept]].op, random));
            let mut choice = everything.clone();
            choice.files.insert(*ino, keeps);
            planned.push(Planned {
                class: PlanClass::Systematic,
                label: format!(
                    "data of {}: first {kept} of {} kept, the next torn",
                    path(ino),
                    unsynced.len()
                ),
                choice,
            });
        }
    }
    planned.extend(exhaustive(window));
    for n in 0..random_states {
        let mut choice = Choice::default();
        for (ino, changes) in &window.directories {
            let unsynced = changes.unsynced().len() as u64;
            if unsynced > 0 {
                choice
                    .directories
                    .insert(*ino, (random() % (unsynced + 1)) as usize);
            }
        }
        for (ino, changes) in &window.files {
            let keeps: Vec<Keep> = changes
                .unsynced()
                .iter()
                .map(|&position| match random() % 5 {
                    0 | 1 => Keep::Lost,
                    2 | 3 => Keep::Whole,
                    _ => random_tear(&records[position].op, random),
                })
                .collect();
            if !keeps.is_empty() {
                choice.files.insert(*ino, keeps);
            }
        }
        planned.push(Planned {
            class: PlanClass::Random,
            label: format!("random subset {n}"),
            choice,
        });
    }
    planned
}

/// Every combination of a window's unsynced changes, each kept whole or lost (a prefix per
/// directory), when there are at most [`EXHAUSTIVE_STATES_MAX`]; none otherwise.
fn exhaustive(window: &Window) -> Vec<Planned> {
    // One digit per directory (its prefix length) and per unsynced file change (kept or not).
    let mut radixes: Vec<(Digit, usize)> = Vec::new();
    for (ino, changes) in &window.directories {
        let unsynced = changes.unsynced().len();
        if unsynced > 0 {
            radixes.push((Digit::Directory(*ino), unsynced + 1));
        }
    }
    for (ino, changes) in &window.files {
        for k in 0..changes.unsynced().len() {
            radixes.push((Digit::FileChange(*ino, k), 2));
        }
    }
    let combinations = radixes
        .iter()
        .try_fold(1usize, |product, (_, radix)| product.checked_mul(*radix))
        .unwrap_or(usize::MAX);
    if combinations > EXHAUSTIVE_STATES_MAX {
        return Vec::new();
    }
    (0..combinations)
        .map(|mut number| {
            let mut choice = Choice::default();
            for (digit, radix) in &radixes {
                let value = number % radix;
                number /= radix;
                match digit {
                    Digit::Directory(ino) => {
                        choice.directories.insert(*ino, value);
                    }
                    Digit::FileChange(ino, k) => {
                        let unsynced = window.files[ino].unsynced().len();
                        let keeps = choice
                            .files
                            .entry(*ino)
                            .or_insert_with(|| vec![Keep::Lost; unsynced]);
                        keeps[*k] = if value == 1 { Keep::Whole } else { Keep::Lost };
                    }
                }
            }
            Planned {
                class: PlanClass::Systematic,
                label: "one of every combination".to_string(),
                choice,
            }
        })
        .collect()
}

/// What one digit of [`exhaustive`]'s counter stands for.
enum Digit {
    Directory(u64),
    FileChange(u64, usize),
}

/// Up to [`PREFIXES_PER_ITEM_MAX`] prefix lengths of `0..=len`, spread evenly, always with
/// 0 and `len`.
fn spread(len: usize) -> Vec<usize> {
    if len == 0 {
        return Vec::new();
    }
    if len < PREFIXES_PER_ITEM_MAX {
        return (0..=len).collect();
    }
    let mut lengths: Vec<usize> = (0..PREFIXES_PER_ITEM_MAX)
        .map(|n| n * len / (PREFIXES_PER_ITEM_MAX - 1))
        .collect();
    lengths.dedup();
    lengths
}

/// A write torn at a random, strict, non-empty subset of its sectors (lost when it has one
/// sector or none); any other change lost.
fn random_tear(op: &TraceOp, random: &mut dyn FnMut() -> u64) -> Keep {
    let TraceOp::Write { offset, data, .. } = op else {
        return Keep::Lost;
    };
    let sectors = sectors_of(*offset, data.len() as u64);
    if sectors < 2 {
        return Keep::Lost;
    }
    loop {
        let kept: Vec<bool> = (0..sectors).map(|_| random() & 1 == 0).collect();
        let count = kept.iter().filter(|k| **k).count();
        if count > 0 && count < sectors {
            return Keep::Torn(kept);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(op: TraceOp) -> TraceRecord {
        TraceRecord {
            op,
            path: String::new(),
        }
    }

    fn create(parent: u64, name: &str, ino: u64, directory: bool) -> TraceRecord {
        record(TraceOp::Create {
            parent,
            name: name.into(),
            ino,
            directory,
        })
    }

    fn write(ino: u64, offset: u64, data: &[u8]) -> TraceRecord {
        record(TraceOp::Write {
            ino,
            offset,
            data: data.to_vec(),
        })
    }

    fn sync(ino: u64) -> TraceRecord {
        record(TraceOp::SyncFile {
            ino,
            data_only: false,
        })
    }

    fn sync_dir(ino: u64) -> TraceRecord {
        record(TraceOp::SyncDirectory { ino })
    }

    fn rename(dir: u64, from: &str, to: &str, ino: u64, replaced: Option<u64>) -> TraceRecord {
        record(TraceOp::Rename {
            parent: dir,
            name: from.into(),
            new_parent: dir,
            new_name: to.into(),
            ino,
            replaced,
        })
    }

    fn file<'t>(tree: &'t CrashTree, path: &str) -> Option<&'t [u8]> {
        tree.file(Path::new(path))
    }

    #[test]
    fn nothing_kept_is_the_synced_part_and_everything_kept_is_the_live_tree() {
        // A file written, synced, written again: the crash keeps the first write at least and
        // the second at most; an unsynced new file is gone with nothing kept.
        let records = vec![
            create(ROOT, "a", 2, false),
            write(2, 0, b"one"),
            sync(2),
            write(2, 3, b"two"),
            create(ROOT, "b", 3, false),
            write(3, 0, b"bee"),
        ];
        let window = window(&records, records.len(), Semantics::FileSyncNamesFile);
        let nothing = build(&records, &window, &Choice::default());
        assert_eq!(file(&nothing, "a"), Some(&b"one"[..]));
        assert_eq!(file(&nothing, "b"), None, "b's name was never made durable");
        let everything = build(&records, &window, &Choice::everything(&window));
        assert_eq!(file(&everything, "a"), Some(&b"onetwo"[..]));
        assert_eq!(file(&everything, "b"), Some(&b"bee"[..]));
    }

    #[test]
    fn a_file_sync_names_the_file_only_in_the_default_semantics() {
        // Strict directories: the synced file's name is lost without a directory sync; with
        // one, it stays, and the data synced before it too.
        let records = vec![
            create(ROOT, "d", 2, true),
            create(2, "f", 3, false),
            write(3, 0, b"data"),
            sync(3),
        ];
        let default = window(&records, 4, Semantics::FileSyncNamesFile);
        let tree = build(&records, &default, &Choice::default());
        assert_eq!(
            file(&tree, "d/f"),
            Some(&b"data"[..]),
            "name and chain durable"
        );
        let strict = window(&records, 4, Semantics::StrictDirectories);
        let tree = build(&records, &strict, &Choice::default());
        assert!(tree.nodes.is_empty(), "{tree:?}");
        let mut records = records;
        records.push(sync_dir(2));
        records.push(sync_dir(ROOT));
        let strict = window(&records, 6, Semantics::StrictDirectories);
        let tree = build(&records, &strict, &Choice::default());
        assert_eq!(file(&tree, "d/f"), Some(&b"data"[..]));
    }

    #[test]
    fn an_unsynced_rename_keeps_the_old_name_and_a_synced_directory_the_new_one() {
        // The atomic-replace pattern: tmp written and synced, renamed over the old file.
        let records = vec![
            create(ROOT, "f", 2, false),
            write(2, 0, b"old"),
            sync(2),
            sync_dir(ROOT),
            create(ROOT, "f.tmp", 3, false),
            write(3, 0, b"new"),
            sync(3),
            rename(ROOT, "f.tmp", "f", 3, Some(2)),
            sync_dir(ROOT),
        ];
        for semantics in [Semantics::FileSyncNamesFile, Semantics::StrictDirectories] {
            let before = window(&records, 8, semantics);
            let tree = build(&records, &before, &Choice::default());
            assert_eq!(file(&tree, "f"), Some(&b"old"[..]), "{semantics:?}");
            let kept = build(&records, &before, &Choice::everything(&before));
            assert_eq!(file(&kept, "f"), Some(&b"new"[..]));
            assert_eq!(file(&kept, "f.tmp"), None);
            let after = window(&records, 9, semantics);
            let tree = build(&records, &after, &Choice::default());
            assert_eq!(file(&tree, "f"), Some(&b"new"[..]), "{semantics:?}");
        }
    }

    #[test]
    fn a_torn_write_keeps_whole_sectors_only() {
        // A 1536-byte write over three sectors, torn to its first and last: the middle sector
        // holds what it held before (zeros of the preallocation).
        let records = vec![
            create(ROOT, "s", 2, false),
            record(TraceOp::Fallocate {
                ino: 2,
                end_bytes: 2048,
            }),
            sync(2),
            write(2, 0, &[7u8; 1536]),
        ];
        let window = window(&records, 4, Semantics::FileSyncNamesFile);
        let choice = Choice {
            files: BTreeMap::from([(2, vec![Keep::Torn(vec![true, false, true])])]),
            ..Choice::default()
        };
        let tree = build(&records, &window, &choice);
        let data = file(&tree, "s").expect("s");
        assert_eq!(data.len(), 2048);
        assert!(data[..512].iter().all(|b| *b == 7));
        assert!(data[512..1024].iter().all(|b| *b == 0));
        assert!(data[1024..1536].iter().all(|b| *b == 7));
    }

    #[test]
    fn names_of_one_directory_survive_in_order() {
        // Two creates in one directory, neither synced: a crash keeps none, the first, or
        // both — never the second alone.
        let records = vec![create(ROOT, "x", 2, false), create(ROOT, "y", 3, false)];
        let window = window(&records, 2, Semantics::StrictDirectories);
        let mut seen = BTreeSet::new();
        let mut state = 7u64;
        let mut random = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for planned in plan(&records, &window, 20, &mut random) {
            let tree = build(&records, &window, &planned.choice);
            let names: Vec<String> = tree.nodes.keys().map(|p| p.display().to_string()).collect();
            seen.insert(names);
        }
        let expected: BTreeSet<Vec<String>> =
            [vec![], vec!["x".into()], vec!["x".into(), "y".into()]]
                .into_iter()
                .collect();
        assert_eq!(seen, expected);
    }

    #[test]
    fn a_small_window_plans_every_combination() {
        // Two unsynced writes to one file and one unsynced create: 2 x 2 x 2 combinations,
        // each among the planned states.
        let records = vec![
            create(ROOT, "a", 2, false),
            sync(2),
            sync_dir(ROOT),
            write(2, 0, b"x"),
            write(2, 1, b"y"),
            create(ROOT, "b", 3, false),
        ];
        let window = window(&records, records.len(), Semantics::StrictDirectories);
        let mut random = || 4u64;
        let trees: BTreeSet<Vec<(PathBuf, Option<Vec<u8>>)>> =
            plan(&records, &window, 0, &mut random)
                .iter()
                .map(|planned| {
                    build(&records, &window, &planned.choice)
                        .nodes
                        .into_iter()
                        .collect()
                })
                .collect();
        for a in [&b""[..], b"x", b"\0y", b"xy"] {
            for b in [false, true] {
                let mut expected = vec![(PathBuf::from("a"), Some(a.to_vec()))];
                if b {
                    expected.push((PathBuf::from("b"), Some(Vec::new())));
                }
                assert!(trees.contains(&expected), "{a:?} {b}: {trees:?}");
            }
        }
    }

    #[test]
    fn equal_applied_digests_give_equal_trees_across_points() {
        // A write kept whole before its sync and the same write made durable by it: one
        // digest, one tree; a lost write: another digest.
        let records = vec![
            create(ROOT, "a", 2, false),
            sync(2),
            write(2, 0, b"x"),
            sync(2),
        ];
        let before = window(&records, 3, Semantics::FileSyncNamesFile);
        let after = window(&records, 4, Semantics::FileSyncNamesFile);
        let kept = Choice::everything(&before);
        assert_eq!(
            kept.applied_digest(&before),
            Choice::default().applied_digest(&after)
        );
        assert_eq!(
            build(&records, &before, &kept),
            build(&records, &after, &Choice::default())
        );
        assert_ne!(
            Choice::default().applied_digest(&before),
            Choice::default().applied_digest(&after)
        );
    }

    #[test]
    fn sync_points_are_the_syncs_and_the_end() {
        let records = vec![
            create(ROOT, "a", 2, false),
            sync(2),
            write(2, 0, b"x"),
            sync_dir(ROOT),
        ];
        assert_eq!(sync_points(&records), vec![1, 3, 4]);
    }
}
