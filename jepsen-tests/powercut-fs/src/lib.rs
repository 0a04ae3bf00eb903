//! # cairn-powercut-fs: a filesystem that loses what was not synced
//!
//! **Purpose.** A FUSE filesystem for durability tests. It keeps every file in memory and
//! tracks, beside the live ("current") tree, the tree that a real disk would still hold after a
//! power loss ("durable"). [`PowerCutHandle::cut_power`] throws the current tree away and serves
//! the durable one from then on. Whatever a program did not make durable with
//! `fsync`/`fdatasync` (of the file) or `fsync` of the directory is gone, the way it would be on
//! a real machine — unlike `kill -9`, which keeps the operating system's page cache.
//!
//! What becomes durable, approximating ext4 (`data=ordered`, delayed allocation) on the
//! pessimistic side:
//! - `fsync`/`fdatasync` of a file makes its data and attributes durable, *and* every directory
//!   entry that currently names it (with the chain of parent directories up to the root), and
//!   drops durable names of it that no longer exist — ext4 commits the journal transaction that
//!   holds those entries;
//! - `fsync` of a directory makes its list of entries durable; an entry for a file that was
//!   never synced comes back as an *empty* file (the zero-length-file effect of delayed
//!   allocation);
//! - nothing else is ever durable: not `write`, `close`, `rename`, `unlink`, `truncate`, nor
//!   `sync_file_range` (which never reaches a FUSE filesystem as a sync).
//!
//! Two harsher modes, chosen with [`PowerCutOptions`] (or the binary's flags):
//! - **torn writes**: a power cut keeps a random prefix of each file's unsynced writes (in the
//!   order they were made), and the first write not kept whole is *torn*: a random number of
//!   its 512-byte sectors, chosen at random, reached the disk (the disk writes sectors in an
//!   order of its own; powersafe overwrite is assumed: sectors not written keep their old
//!   content, and a sector is written whole or not at all); a sync takes
//!   [`TORN_MODE_SYNC_LATENCY`], so a cut can come while one is in flight;
//! - **strict directories**: a file's `fsync` makes its data durable but never its name; a new,
//!   renamed or deleted name survives only an `fsync` of its directory (and a new directory
//!   only an `fsync` of its parent).
//!
//! **Trace mode** ([`PowerCutHandle::start_trace`], module [`trace`]) records every mutating
//! operation and every sync in order, with markers the test process inserts
//! ([`TraceMarker`]); [`crash_state`] rebuilds from such a trace every file tree a disk could
//! hold after a crash at any point (ALICE-style crash-point exploration).
//!
//! It is reusable: the library API is [`PowerCutFs::mount`] → [`PowerCutHandle`] with
//! [`PowerCutHandle::cut_power`] and [`PowerCutHandle::unmount`]; the `cairn-powercut-fs` binary
//! mounts one filesystem and cuts the power on `SIGUSR1` (see `src/main.rs`), so the jepsen
//! suite can cut power under whole `cairn` node processes.
//!
//! **What it must not do.** Never make anything durable that a real disk could have lost (the
//! tests built on it would then pass for the wrong reason); never let a file handle opened
//! before a power cut touch the tree after it (such handles get `EIO`, as after a reboot); never
//! cache data or attributes in the kernel (files are opened with `FOPEN_DIRECT_IO`, entry and
//! attribute TTLs are zero), so that after a cut every read sees the durable tree.
//!
//! **Concurrency model.** fuser runs one session thread that calls the [`fuser::Filesystem`]
//! methods; the state sits behind one `parking_lot::Mutex`, shared with the
//! [`PowerCutHandle`], so a power cut is atomic with respect to every filesystem operation.
//!
//! **Invariants.**
//! - The root inode exists in both trees; inode numbers are never reused, also across cuts.
//! - Every directory entry of the durable tree names an inode of the durable tree.
//! - After a cut, the current tree equals the durable tree, restricted to what is reachable
//!   from the root; a handle's epoch equals the epoch of the tree it was opened on.
//! - Trace mode: an operation is recorded, under the state lock, after it changed the current
//!   tree and before the kernel is answered; a failed operation is not recorded.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::ffi::OsString;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use std::time::SystemTime;

use fuser::Errno;
use fuser::FileAttr;
use fuser::FileHandle;
use fuser::FileType;
use fuser::Filesystem;
use fuser::FopenFlags;
use fuser::Generation;
use fuser::INodeNo;
use fuser::LockOwner;
use fuser::MountOption;
use fuser::OpenFlags;
use fuser::RenameFlags;
use fuser::ReplyAttr;
use fuser::ReplyCreate;
use fuser::ReplyData;
use fuser::ReplyDirectory;
use fuser::ReplyEmpty;
use fuser::ReplyEntry;
use fuser::ReplyOpen;
use fuser::ReplyStatfs;
use fuser::ReplyWrite;
use fuser::Request;
use fuser::TimeOrNow;
use fuser::WriteFlags;
use parking_lot::Mutex;

pub mod crash_state;
pub mod trace;

pub use trace::TraceOp;
pub use trace::TraceRecord;

/// Errors of mounting and unmounting.
#[derive(Debug, thiserror::Error)]
pub enum PowerCutError {
    /// FUSE cannot be used on this machine (no `/dev/fuse`, no `fusermount3`).
    #[error("FUSE is unavailable: {0}")]
    Unavailable(String),
    /// Mounting failed.
    #[error("cannot mount the power-cut filesystem at {mountpoint}: {source}")]
    Mount {
        mountpoint: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Unmounting failed.
    #[error("cannot unmount the power-cut filesystem at {mountpoint}: {source}")]
    Unmount {
        mountpoint: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Why FUSE cannot be used here, or `None` when it can: `/dev/fuse` must exist and be
/// openable, and unless we are root (who mounts with `mount(2)` directly) `fusermount3`
/// (Debian package `fuse3`) must be on the `PATH`. Tests that need FUSE call this and print the
/// reason when they skip.
pub fn fuse_unavailable_reason() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse does not exist".to_string());
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return Some(format!("/dev/fuse cannot be opened: {e}"));
    }
    // SAFETY: geteuid has no preconditions.
    let is_root = unsafe { libc::geteuid() } == 0;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path).any(|dir| dir.join("fusermount3").is_file());
    if !is_root && !found {
        return Some(
            "fusermount3 is not on the PATH (install the Debian package `fuse3`)".to_string(),
        );
    }
    None
}

/// The harsher behaviours of a power-cut filesystem (both off by default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PowerCutOptions {
    /// Torn writes, with this seed for the random prefixes and sectors (print it, replay it).
    pub torn_writes_seed: Option<u64>,
    /// Names survive only an `fsync` of their directory.
    pub strict_directories: bool,
}

/// The unit of a torn write.
pub const SECTOR_BYTES: u64 = 512;

/// How long [`PowerCutHandle::unmount`] waits for files still open on the filesystem to close.
pub const UNMOUNT_WAIT_FOR_CLOSE: Duration = Duration::from_secs(10);

/// Torn-writes mode: how long a sync takes (the filesystem's lock is free meanwhile), like a
/// disk flushing its cache, so that a power cut can land while a sync is in flight and find
/// the writes before it still unsynced. A sync overtaken by a cut fails with `EIO`.
pub const TORN_MODE_SYNC_LATENCY: Duration = Duration::from_micros(200);

/// An unsynced change to a file's content, remembered for torn writes.
#[derive(Clone, Debug)]
enum PendingWrite {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

/// Size reported by `statfs`, so that programs checking free space are content.
const CAPACITY_BYTES: u64 = 64 * 1024 * 1024 * 1024;
/// Block size reported by `statfs` and `getattr`.
const BLOCK_SIZE_BYTES: u32 = 4096;
/// Longest file name.
const NAME_LEN_MAX: usize = 255;

#[derive(Clone, Debug)]
enum Content {
    File(Vec<u8>),
    Directory(BTreeMap<OsString, u64>),
}

#[derive(Clone, Debug)]
struct Inode {
    content: Content,
    perm: u16,
    uid: u32,
    gid: u32,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
    crtime: SystemTime,
}

impl Inode {
    fn new(content: Content, perm: u16, uid: u32, gid: u32) -> Inode {
        let now = SystemTime::now();
        Inode {
            content,
            perm,
            uid,
            gid,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
        }
    }

    /// The same inode with no content: what a directory fsync makes durable for a file that
    /// was never synced itself.
    fn emptied(&self) -> Inode {
        let content = match self.content {
            Content::File(_) => Content::File(Vec::new()),
            Content::Directory(_) => Content::Directory(BTreeMap::new()),
        };
        Inode {
            content,
            ..self.clone()
        }
    }

    fn is_dir(&self) -> bool {
        matches!(self.content, Content::Directory(_))
    }
}

/// One tree of inodes.
#[derive(Clone, Debug)]
struct Tree {
    inodes: HashMap<u64, Inode>,
}

impl Tree {
    fn new_with_root(uid: u32, gid: u32) -> Tree {
        let mut inodes = HashMap::new();
        inodes.insert(
            ROOT,
            Inode::new(Content::Directory(BTreeMap::new()), 0o755, uid, gid),
        );
        Tree { inodes }
    }

    fn entries(&self, dir: u64) -> Result<&BTreeMap<OsString, u64>, Errno> {
        match self.inodes.get(&dir).map(|i| &i.content) {
            Some(Content::Directory(entries)) => Ok(entries),
            Some(Content::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn entries_mut(&mut self, dir: u64) -> Result<&mut BTreeMap<OsString, u64>, Errno> {
        match self.inodes.get_mut(&dir).map(|i| &mut i.content) {
            Some(Content::Directory(entries)) => Ok(entries),
            Some(Content::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    /// Every (directory, name) naming `ino`.
    fn links_to(&self, ino: u64) -> Vec<(u64, OsString)> {
        let mut links = Vec::new();
        for (&dir, inode) in &self.inodes {
            if let Content::Directory(entries) = &inode.content {
                for (name, &child) in entries {
                    if child == ino {
                        links.push((dir, name.clone()));
                    }
                }
            }
        }
        links.sort();
        links
    }

    /// Drops every inode not reachable from the root.
    fn collect_garbage(&mut self) {
        let mut reachable = std::collections::HashSet::new();
        let mut pending = vec![ROOT];
        while let Some(ino) = pending.pop() {
            if !reachable.insert(ino) {
                continue;
            }
            if let Some(Inode {
                content: Content::Directory(entries),
                ..
            }) = self.inodes.get(&ino)
            {
                pending.extend(entries.values().copied());
            }
        }
        self.inodes.retain(|ino, _| reachable.contains(ino));
    }
}

const ROOT: u64 = 1;
/// Kernel caches nothing: every lookup and getattr comes back to us, so a power cut is seen
/// at once.
const TTL: Duration = Duration::ZERO;

/// Counters of what the filesystem did, for tests and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PowerCutStats {
    /// Power cuts so far.
    pub power_cuts: u64,
    /// `fsync`/`fdatasync` calls on files.
    pub file_syncs: u64,
    /// `fsync` calls on directories.
    pub directory_syncs: u64,
    /// `write` calls.
    pub writes: u64,
    /// Torn-writes mode: writes torn by power cuts (some of their sectors lost).
    pub torn_writes: u64,
    /// Torn-writes mode: unsynced writes dropped whole by power cuts.
    pub lost_writes: u64,
}

struct State {
    current: Tree,
    durable: Tree,
    next_ino: u64,
    /// Bumped by every power cut; handles carry the epoch they were opened in.
    epoch: u64,
    open_handles: HashMap<u64, u32>,
    /// Handles the kernel holds, of every epoch: each open is matched by one release, which
    /// the kernel sends only after the last `close` of that file. Unmounting waits for zero.
    handles_held: u64,
    stats: PowerCutStats,
    options: PowerCutOptions,
    /// Torn-writes mode: per inode, the content changes since its last sync.
    pending: HashMap<u64, Vec<PendingWrite>>,
    /// Torn-writes mode: xorshift state.
    rng: u64,
    /// Trace mode: every mutating operation and marker, in order (`None`: not tracing).
    trace: Option<Vec<TraceRecord>>,
}

impl State {
    #[cfg(test)]
    fn new(uid: u32, gid: u32) -> State {
        State::with_options(uid, gid, PowerCutOptions::default())
    }

    fn with_options(uid: u32, gid: u32, options: PowerCutOptions) -> State {
        let tree = Tree::new_with_root(uid, gid);
        State {
            current: tree.clone(),
            durable: tree,
            next_ino: ROOT + 1,
            epoch: 1,
            open_handles: HashMap::new(),
            handles_held: 0,
            stats: PowerCutStats::default(),
            options,
            pending: HashMap::new(),
            // xorshift must not start at zero.
            rng: options.torn_writes_seed.unwrap_or(0) | 1,
            trace: None,
        }
    }

    fn random(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Torn-writes mode: remembers an unsynced content change.
    fn remember(&mut self, ino: u64, change: PendingWrite) {
        if self.options.torn_writes_seed.is_some() {
            self.pending.entry(ino).or_default().push(change);
        }
    }

    /// Torn-writes mode, at a cut: every durable file gets a random prefix of its unsynced
    /// changes, the first change not kept whole torn sector by sector.
    fn apply_torn_writes(&mut self) {
        let mut pending: Vec<(u64, Vec<PendingWrite>)> = self.pending.drain().collect();
        pending.sort_by_key(|(ino, _)| *ino);
        for (ino, changes) in pending {
            if changes.is_empty() {
                continue;
            }
            let kept_whole = (self.random() % changes.len() as u64) as usize;
            let torn_sectors: Vec<bool> = match &changes[kept_whole] {
                PendingWrite::Write { offset, data } => {
                    // The disk wrote the sectors in an order of its own and stopped after a
                    // random number of them: a random count of randomly chosen sectors survive.
                    let first = offset / SECTOR_BYTES;
                    let last = (offset + data.len() as u64).div_ceil(SECTOR_BYTES);
                    let sectors = (last - first) as usize;
                    let survivors = (self.random() % (sectors as u64 + 1)) as usize;
                    let mut order: Vec<usize> = (0..sectors).collect();
                    for i in (1..sectors).rev() {
                        let j = (self.random() % (i as u64 + 1)) as usize;
                        order.swap(i, j);
                    }
                    let mut kept = vec![false; sectors];
                    for &sector in &order[..survivors] {
                        kept[sector] = true;
                    }
                    kept
                }
                PendingWrite::SetLen(_) => Vec::new(),
            };
            let Some(Inode {
                content: Content::File(data),
                ..
            }) = self.durable.inodes.get_mut(&ino)
            else {
                continue;
            };
            for change in &changes[..kept_whole] {
                match change {
                    PendingWrite::Write {
                        offset,
                        data: bytes,
                    } => {
                        write_at(data, *offset, bytes);
                    }
                    PendingWrite::SetLen(len) => data.resize(*len as usize, 0),
                }
            }
            self.stats.lost_writes += (changes.len() - kept_whole - 1) as u64;
            if let PendingWrite::Write {
                offset,
                data: bytes,
            } = &changes[kept_whole]
            {
                self.stats.torn_writes += 1;
                let first_sector = offset / SECTOR_BYTES;
                for (position, keep) in torn_sectors.iter().enumerate() {
                    if !keep {
                        continue;
                    }
                    let sector = first_sector + position as u64;
                    let from = (sector * SECTOR_BYTES).max(*offset);
                    let to = ((sector + 1) * SECTOR_BYTES).min(offset + bytes.len() as u64);
                    let slice = &bytes[(from - offset) as usize..(to - offset) as usize];
                    write_at(data, from, slice);
                }
            }
        }
    }

    /// Trace mode: appends `op` (with the path it concerns now, for people) to the trace.
    fn record(&mut self, op: TraceOp) {
        if self.trace.is_none() {
            return;
        }
        let path = match &op {
            TraceOp::Create { parent, name, .. }
            | TraceOp::Rename { parent, name, .. }
            | TraceOp::Unlink { parent, name, .. } => self.path_in(*parent, name),
            TraceOp::Write { ino, .. }
            | TraceOp::SetLen { ino, .. }
            | TraceOp::Fallocate { ino, .. }
            | TraceOp::SyncFile { ino, .. }
            | TraceOp::SyncDirectory { ino } => self.path_of(*ino),
            TraceOp::Marker(_) => String::new(),
        };
        if let Some(trace) = self.trace.as_mut() {
            trace.push(TraceRecord { op, path });
        }
    }

    /// A current path of `ino` (`/` for the root, `?` when it has no name).
    fn path_of(&self, ino: u64) -> String {
        if ino == ROOT {
            return "/".to_string();
        }
        match self.current.links_to(ino).into_iter().next() {
            Some((parent, name)) => self.path_in(parent, &name),
            None => format!("?(ino {ino})"),
        }
    }

    fn path_in(&self, parent: u64, name: &OsStr) -> String {
        let mut path = self.path_of(parent);
        if !path.ends_with('/') {
            path.push('/');
        }
        path.push_str(&name.to_string_lossy());
        path
    }

    fn attr(&self, ino: u64) -> Result<FileAttr, Errno> {
        let inode = self.current.inodes.get(&ino).ok_or(Errno::ENOENT)?;
        let (kind, size, nlink) = match &inode.content {
            Content::File(data) => (
                FileType::RegularFile,
                data.len() as u64,
                self.current.links_to(ino).len().max(1) as u32,
            ),
            Content::Directory(entries) => {
                let subdirs = entries
                    .values()
                    .filter(|child| self.current.inodes.get(child).is_some_and(Inode::is_dir))
                    .count();
                (
                    FileType::Directory,
                    BLOCK_SIZE_BYTES as u64,
                    2 + subdirs as u32,
                )
            }
        };
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: inode.atime,
            mtime: inode.mtime,
            ctime: inode.ctime,
            crtime: inode.crtime,
            kind,
            perm: inode.perm,
            nlink,
            uid: inode.uid,
            gid: inode.gid,
            rdev: 0,
            blksize: BLOCK_SIZE_BYTES,
            flags: 0,
        })
    }

    fn check_handle(&self, fh: FileHandle) -> Result<(), Errno> {
        if fh.0 == self.epoch {
            Ok(())
        } else {
            // Opened before a power cut: that process's view of the disk is gone.
            Err(Errno::EIO)
        }
    }

    fn open_handle(&mut self, ino: u64) -> FileHandle {
        self.handles_held += 1;
        *self.open_handles.entry(ino).or_insert(0) += 1;
        FileHandle(self.epoch)
    }

    fn release_handle(&mut self, ino: u64, fh: FileHandle) {
        // The kernel releases each handle once; saturating, so a confused kernel cannot
        // panic the serving thread (which would hang every process using the mount).
        self.handles_held = self.handles_held.saturating_sub(1);
        if fh.0 != self.epoch {
            return;
        }
        if let Some(count) = self.open_handles.get_mut(&ino) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.open_handles.remove(&ino);
                self.drop_if_orphan(ino);
            }
        }
    }

    /// Forgets an unlinked, closed inode of the current tree.
    fn drop_if_orphan(&mut self, ino: u64) {
        if ino != ROOT
            && !self.open_handles.contains_key(&ino)
            && self.current.links_to(ino).is_empty()
        {
            self.current.inodes.remove(&ino);
        }
    }

    fn create_node(
        &mut self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        content: Content,
        mode: u32,
        umask: u32,
    ) -> Result<u64, Errno> {
        if name.len() > NAME_LEN_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if self.current.entries(parent)?.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let perm = (mode & !umask & 0o7777) as u16;
        let directory = matches!(content, Content::Directory(_));
        self.current
            .inodes
            .insert(ino, Inode::new(content, perm, req.uid(), req.gid()));
        self.current
            .entries_mut(parent)?
            .insert(name.to_os_string(), ino);
        touch_dir(&mut self.current, parent);
        self.record(TraceOp::Create {
            parent,
            name: name.to_os_string(),
            ino,
            directory,
        });
        Ok(ino)
    }

    /// The directory containing directory `dir` and its name there, in `tree`.
    fn parent_of_dir(tree: &Tree, dir: u64) -> Option<(u64, OsString)> {
        tree.links_to(dir).into_iter().next()
    }

    /// Makes sure directory `dir` exists in the durable tree, linked from its current parent
    /// chain up to the root (creating empty durable directories where needed).
    fn ensure_durable_dir(&mut self, dir: u64) {
        let mut chain = Vec::new();
        let mut at = dir;
        while at != ROOT {
            let Some((parent, name)) = State::parent_of_dir(&self.current, at) else {
                // Unlinked directory: nothing can name it durably.
                return;
            };
            chain.push((parent, name, at));
            at = parent;
        }
        for (parent, name, child) in chain.into_iter().rev() {
            if !self.durable.inodes.contains_key(&child) {
                if let Some(inode) = self.current.inodes.get(&child) {
                    let emptied = inode.emptied();
                    self.durable.inodes.insert(child, emptied);
                }
            }
            if let Ok(entries) = self.durable.entries_mut(parent) {
                entries.insert(name, child);
            }
        }
    }

    /// `fsync`/`fdatasync` of a file (ext4: the file's data, attributes and the directory
    /// entries naming it).
    fn sync_file(&mut self, ino: u64) -> Result<(), Errno> {
        let inode = self.current.inodes.get(&ino).ok_or(Errno::ENOENT)?.clone();
        if inode.is_dir() {
            return self.sync_dir(ino);
        }
        self.durable.inodes.insert(ino, inode);
        self.pending.remove(&ino);
        if self.options.strict_directories {
            // The data only: names wait for an fsync of their directory.
            self.stats.file_syncs += 1;
            return Ok(());
        }
        let links = self.current.links_to(ino);
        for (parent, name) in &links {
            self.ensure_durable_dir(*parent);
            if let Ok(entries) = self.durable.entries_mut(*parent) {
                entries.insert(name.clone(), ino);
            }
        }
        // Names of this inode that the durable tree has but the current tree no longer has.
        let stale: Vec<(u64, OsString)> = self
            .durable
            .links_to(ino)
            .into_iter()
            .filter(|link| !links.contains(link))
            .collect();
        for (parent, name) in stale {
            if let Ok(entries) = self.durable.entries_mut(parent) {
                entries.remove(&name);
            }
        }
        self.stats.file_syncs += 1;
        Ok(())
    }

    /// `fsync` of a directory: its entries become durable.
    fn sync_dir(&mut self, dir: u64) -> Result<(), Errno> {
        let inode = self.current.inodes.get(&dir).ok_or(Errno::ENOENT)?.clone();
        let Content::Directory(entries) = &inode.content else {
            return Err(Errno::ENOTDIR);
        };
        if !self.options.strict_directories {
            self.ensure_durable_dir(dir);
        }
        for child in entries.values() {
            if !self.durable.inodes.contains_key(child) {
                if let Some(child_inode) = self.current.inodes.get(child) {
                    let emptied = child_inode.emptied();
                    self.durable.inodes.insert(*child, emptied);
                }
            }
        }
        let mut durable_dir = inode.clone();
        durable_dir.content = Content::Directory(entries.clone());
        self.durable.inodes.insert(dir, durable_dir);
        self.stats.directory_syncs += 1;
        Ok(())
    }

    fn cut_power(&mut self) {
        self.apply_torn_writes();
        self.durable.collect_garbage();
        assert!(
            self.durable.inodes.contains_key(&ROOT),
            "the durable tree keeps its root"
        );
        self.current = self.durable.clone();
        self.epoch += 1;
        self.open_handles.clear();
        self.stats.power_cuts += 1;
        assert!(self.current.entries(ROOT).is_ok());
    }
}

/// Writes `bytes` into `data` at `offset`, growing it with zeros if needed.
fn write_at(data: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
    let start = offset as usize;
    let end = start + bytes.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[start..end].copy_from_slice(bytes);
}

fn touch_dir(tree: &mut Tree, dir: u64) {
    if let Some(inode) = tree.inodes.get_mut(&dir) {
        let now = SystemTime::now();
        inode.mtime = now;
        inode.ctime = now;
    }
}

fn time_of(time: TimeOrNow) -> SystemTime {
    match time {
        TimeOrNow::SpecificTime(time) => time,
        TimeOrNow::Now => SystemTime::now(),
    }
}

/// The [`fuser::Filesystem`] implementation; shared state with [`PowerCutHandle`].
struct PowerCutFilesystem {
    state: Arc<Mutex<State>>,
}

impl PowerCutFilesystem {
    /// Torn-writes mode: waits like a disk flush, without holding the state lock.
    fn sync_latency(&self) {
        let torn = self.state.lock().options.torn_writes_seed.is_some();
        if torn {
            std::thread::sleep(TORN_MODE_SYNC_LATENCY);
        }
    }
}

impl Filesystem for PowerCutFilesystem {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let state = self.state.lock();
        let result = state
            .current
            .entries(parent.0)
            .and_then(|entries| entries.get(name).copied().ok_or(Errno::ENOENT))
            .and_then(|ino| state.attr(ino));
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.state.lock().attr(ino.0) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut state = self.state.lock();
        if let Some(fh) = fh {
            if let Err(e) = state.check_handle(fh) {
                reply.error(e);
                return;
            }
        }
        let mut resized = None;
        let Some(inode) = state.current.inodes.get_mut(&ino.0) else {
            reply.error(Errno::ENOENT);
            return;
        };
        if let Some(size) = size {
            match &mut inode.content {
                Content::File(data) => match usize::try_from(size) {
                    Ok(size) if (size as u64) <= CAPACITY_BYTES => {
                        data.resize(size, 0);
                        resized = Some(size as u64);
                    }
                    _ => {
                        reply.error(Errno::EFBIG);
                        return;
                    }
                },
                Content::Directory(_) => {
                    reply.error(Errno::EISDIR);
                    return;
                }
            }
            inode.mtime = SystemTime::now();
        }
        if let Some(mode) = mode {
            inode.perm = (mode & 0o7777) as u16;
        }
        if let Some(uid) = uid {
            inode.uid = uid;
        }
        if let Some(gid) = gid {
            inode.gid = gid;
        }
        if let Some(atime) = atime {
            inode.atime = time_of(atime);
        }
        if let Some(mtime) = mtime {
            inode.mtime = time_of(mtime);
        }
        inode.ctime = SystemTime::now();
        if let Some(len) = resized {
            state.remember(ino.0, PendingWrite::SetLen(len));
            state.record(TraceOp::SetLen {
                ino: ino.0,
                len_bytes: len,
            });
        }
        match state.attr(ino.0) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            // Only regular files: devices, fifos and sockets have no use in a durability test.
            reply.error(Errno::EPERM);
            return;
        }
        let mut state = self.state.lock();
        let result = state
            .create_node(req, parent.0, name, Content::File(Vec::new()), mode, umask)
            .and_then(|ino| state.attr(ino));
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut state = self.state.lock();
        let result = state
            .create_node(
                req,
                parent.0,
                name,
                Content::Directory(BTreeMap::new()),
                mode,
                umask,
            )
            .and_then(|ino| state.attr(ino));
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut state = self.state.lock();
        let result = (|| {
            let ino = *state
                .current
                .entries(parent.0)?
                .get(name)
                .ok_or(Errno::ENOENT)?;
            if state.current.inodes.get(&ino).is_some_and(Inode::is_dir) {
                return Err(Errno::EISDIR);
            }
            let directory = false;
            state.current.entries_mut(parent.0)?.remove(name);
            touch_dir(&mut state.current, parent.0);
            state.record(TraceOp::Unlink {
                parent: parent.0,
                name: name.to_os_string(),
                ino,
                directory,
            });
            state.drop_if_orphan(ino);
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut state = self.state.lock();
        let result = (|| {
            let ino = *state
                .current
                .entries(parent.0)?
                .get(name)
                .ok_or(Errno::ENOENT)?;
            if !state.current.entries(ino)?.is_empty() {
                return Err(Errno::ENOTEMPTY);
            }
            let directory = true;
            state.current.entries_mut(parent.0)?.remove(name);
            touch_dir(&mut state.current, parent.0);
            state.record(TraceOp::Unlink {
                parent: parent.0,
                name: name.to_os_string(),
                ino,
                directory,
            });
            state.drop_if_orphan(ino);
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut state = self.state.lock();
        let result = (|| {
            if !(flags - RenameFlags::RENAME_NOREPLACE).is_empty() {
                return Err(Errno::EINVAL);
            }
            if newname.len() > NAME_LEN_MAX {
                return Err(Errno::ENAMETOOLONG);
            }
            let source = *state
                .current
                .entries(parent.0)?
                .get(name)
                .ok_or(Errno::ENOENT)?;
            let source_is_dir = state.current.inodes.get(&source).is_some_and(Inode::is_dir);
            if source_is_dir {
                // A directory cannot move below itself.
                let mut at = newparent.0;
                loop {
                    if at == source {
                        return Err(Errno::EINVAL);
                    }
                    if at == ROOT {
                        break;
                    }
                    match State::parent_of_dir(&state.current, at) {
                        Some((up, _)) => at = up,
                        None => break,
                    }
                }
            }
            let target = state.current.entries(newparent.0)?.get(newname).copied();
            if let Some(target) = target {
                if target == source {
                    return Ok(());
                }
                if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                    return Err(Errno::EEXIST);
                }
                let target_is_dir = state.current.inodes.get(&target).is_some_and(Inode::is_dir);
                match (source_is_dir, target_is_dir) {
                    (true, false) => return Err(Errno::ENOTDIR),
                    (false, true) => return Err(Errno::EISDIR),
                    (true, true) if !state.current.entries(target)?.is_empty() => {
                        return Err(Errno::ENOTEMPTY)
                    }
                    _ => {}
                }
            }
            state.current.entries_mut(parent.0)?.remove(name);
            state
                .current
                .entries_mut(newparent.0)?
                .insert(newname.to_os_string(), source);
            touch_dir(&mut state.current, parent.0);
            touch_dir(&mut state.current, newparent.0);
            state.record(TraceOp::Rename {
                parent: parent.0,
                name: name.to_os_string(),
                new_parent: newparent.0,
                new_name: newname.to_os_string(),
                ino: source,
                replaced: target,
            });
            if let Some(target) = target {
                state.drop_if_orphan(target);
            }
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut state = self.state.lock();
        match state.current.inodes.get(&ino.0) {
            Some(inode) if inode.is_dir() => reply.error(Errno::EISDIR),
            Some(_) => {
                let fh = state.open_handle(ino.0);
                reply.opened(fh, FopenFlags::FOPEN_DIRECT_IO);
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut state = self.state.lock();
        if let Err(e) = state.check_handle(fh) {
            reply.error(e);
            return;
        }
        match state.current.inodes.get_mut(&ino.0) {
            Some(Inode {
                content: Content::File(data),
                atime,
                ..
            }) => {
                let start = usize::try_from(offset)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                let end = start.saturating_add(size as usize).min(data.len());
                *atime = SystemTime::now();
                reply.data(&data[start..end]);
            }
            Some(_) => reply.error(Errno::EISDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut state = self.state.lock();
        if let Err(e) = state.check_handle(fh) {
            reply.error(e);
            return;
        }
        state.stats.writes += 1;
        match state.current.inodes.get_mut(&ino.0) {
            Some(Inode {
                content: Content::File(bytes),
                mtime,
                ctime,
                ..
            }) => {
                let end = offset.checked_add(data.len() as u64);
                let Some(end) = end.filter(|end| *end <= CAPACITY_BYTES) else {
                    reply.error(Errno::EFBIG);
                    return;
                };
                let (start, end) = (offset as usize, end as usize);
                if bytes.len() < end {
                    bytes.resize(end, 0);
                }
                bytes[start..end].copy_from_slice(data);
                let now = SystemTime::now();
                *mtime = now;
                *ctime = now;
                state.remember(
                    ino.0,
                    PendingWrite::Write {
                        offset,
                        data: data.to_vec(),
                    },
                );
                if state.trace.is_some() {
                    state.record(TraceOp::Write {
                        ino: ino.0,
                        offset,
                        data: data.to_vec(),
                    });
                }
                reply.written(data.len() as u32);
            }
            Some(_) => reply.error(Errno::EISDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close() is no durability point.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.state.lock().release_handle(ino.0, fh);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.sync_latency();
        let mut state = self.state.lock();
        match state.check_handle(fh).and_then(|()| state.sync_file(ino.0)) {
            Ok(()) => {
                let directory = state.current.inodes.get(&ino.0).is_some_and(Inode::is_dir);
                state.record(if directory {
                    TraceOp::SyncDirectory { ino: ino.0 }
                } else {
                    TraceOp::SyncFile {
                        ino: ino.0,
                        data_only: datasync,
                    }
                });
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut state = self.state.lock();
        match state.current.inodes.get(&ino.0) {
            Some(inode) if inode.is_dir() => {
                let fh = state.open_handle(ino.0);
                reply.opened(fh, FopenFlags::empty());
            }
            Some(_) => reply.error(Errno::ENOTDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let state = self.state.lock();
        if let Err(e) = state.check_handle(fh) {
            reply.error(e);
            return;
        }
        let entries = match state.current.entries(ino.0) {
            Ok(entries) => entries,
            Err(e) => {
                reply.error(e);
                return;
            }
        };
        let parent = State::parent_of_dir(&state.current, ino.0)
            .map(|(p, _)| p)
            .unwrap_or(ROOT);
        let mut listing: Vec<(u64, FileType, OsString)> = vec![
            (ino.0, FileType::Directory, OsString::from(".")),
            (parent, FileType::Directory, OsString::from("..")),
        ];
        for (name, &child) in entries {
            let kind = if state.current.inodes.get(&child).is_some_and(Inode::is_dir) {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            listing.push((child, kind, name.clone()));
        }
        for (position, (child, kind, name)) in listing.into_iter().enumerate().skip(offset as usize)
        {
            if reply.add(INodeNo(child), (position + 1) as u64, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.state.lock().release_handle(ino.0, fh);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.sync_latency();
        let mut state = self.state.lock();
        match state.check_handle(fh).and_then(|()| state.sync_dir(ino.0)) {
            Ok(()) => {
                state.record(TraceOp::SyncDirectory { ino: ino.0 });
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let state = self.state.lock();
        let used_bytes: u64 = state
            .current
            .inodes
            .values()
            .map(|inode| match &inode.content {
                Content::File(data) => data.len() as u64,
                Content::Directory(_) => BLOCK_SIZE_BYTES as u64,
            })
            .sum();
        let blocks = CAPACITY_BYTES / BLOCK_SIZE_BYTES as u64;
        let free = blocks.saturating_sub(used_bytes.div_ceil(BLOCK_SIZE_BYTES as u64));
        let files = state.current.inodes.len() as u64;
        reply.statfs(
            blocks,
            free,
            free,
            files + 1_000_000,
            1_000_000,
            BLOCK_SIZE_BYTES,
            NAME_LEN_MAX as u32,
            BLOCK_SIZE_BYTES,
        );
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // Permission checks are left to the kernel's defaults; only existence is ours.
        if self.state.lock().current.inodes.contains_key(&ino.0) {
            reply.ok();
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut state = self.state.lock();
        let result = state
            .create_node(req, parent.0, name, Content::File(Vec::new()), mode, umask)
            .and_then(|ino| state.attr(ino).map(|attr| (ino, attr)));
        match result {
            Ok((ino, attr)) => {
                let fh = state.open_handle(ino);
                reply.created(&TTL, &attr, Generation(0), fh, FopenFlags::FOPEN_DIRECT_IO);
            }
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mut state = self.state.lock();
        if let Err(e) = state.check_handle(fh) {
            reply.error(e);
            return;
        }
        if mode != 0 {
            reply.error(Errno::EOPNOTSUPP);
            return;
        }
        match state.current.inodes.get_mut(&ino.0) {
            Some(Inode {
                content: Content::File(data),
                ..
            }) => match offset
                .checked_add(length)
                .filter(|end| *end <= CAPACITY_BYTES)
            {
                Some(end) => {
                    if (data.len() as u64) < end {
                        data.resize(end as usize, 0);
                        state.remember(ino.0, PendingWrite::SetLen(end));
                    }
                    state.record(TraceOp::Fallocate {
                        ino: ino.0,
                        end_bytes: end,
                    });
                    reply.ok();
                }
                None => reply.error(Errno::EFBIG),
            },
            Some(_) => reply.error(Errno::EISDIR),
            None => reply.error(Errno::ENOENT),
        }
    }
}

/// Entry point of the library API.
pub struct PowerCutFs;

impl PowerCutFs {
    /// Mounts a new, empty power-cut filesystem at `mountpoint` (an existing, empty directory),
    /// served by a background thread until the handle is unmounted or dropped.
    ///
    /// As root this mounts with `mount(2)` directly. If the process dies without unmounting,
    /// a dead mount ("Transport endpoint is not connected") stays behind: `umount -l` it.
    pub fn mount(mountpoint: &Path) -> Result<PowerCutHandle, PowerCutError> {
        Self::mount_with(mountpoint, PowerCutOptions::default())
    }

    /// [`PowerCutFs::mount`] with the harsher modes of `options`.
    pub fn mount_with(
        mountpoint: &Path,
        options: PowerCutOptions,
    ) -> Result<PowerCutHandle, PowerCutError> {
        if let Some(reason) = fuse_unavailable_reason() {
            return Err(PowerCutError::Unavailable(reason));
        }
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let state = Arc::new(Mutex::new(State::with_options(uid, gid, options)));
        let filesystem = PowerCutFilesystem {
            state: Arc::clone(&state),
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName("cairn-powercut".to_string()),
            MountOption::Subtype("cairn-powercut".to_string()),
            MountOption::RW,
        ];
        config.acl = fuser::SessionACL::All;
        let session = fuser::spawn_mount(filesystem, mountpoint, &config).map_err(|source| {
            PowerCutError::Mount {
                mountpoint: mountpoint.to_path_buf(),
                source,
            }
        })?;
        Ok(PowerCutHandle {
            session: Some(session),
            state,
            mountpoint: mountpoint.to_path_buf(),
        })
    }
}

/// Inserts markers into a filesystem's trace ([`PowerCutHandle::marker`]); cheap to clone,
/// usable from any thread (a library's I/O thread running a durability callback, say).
#[derive(Clone)]
pub struct TraceMarker {
    state: Arc<Mutex<State>>,
}

impl TraceMarker {
    /// Appends `Marker(id)` to the trace, after every operation the filesystem has applied
    /// (dropped when tracing is off).
    pub fn mark(&self, id: u64) {
        self.state.lock().record(TraceOp::Marker(id));
    }
}

/// A frozen filesystem ([`PowerCutHandle::freeze`]); dropping it thaws the filesystem.
pub struct Freeze {
    release: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Freeze {
    fn drop(&mut self) {
        drop(self.release.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A mounted power-cut filesystem. Dropping it unmounts (errors are logged).
pub struct PowerCutHandle {
    session: Option<fuser::BackgroundSession>,
    state: Arc<Mutex<State>>,
    mountpoint: PathBuf,
}

impl PowerCutHandle {
    /// Where the filesystem is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Cuts the power: everything not made durable is lost at once, handles opened before the
    /// cut fail with `EIO`, and the filesystem serves the durable tree from now on. Kill the
    /// processes using the filesystem first (as a power cut would), then cut.
    pub fn cut_power(&self) {
        self.state.lock().cut_power();
    }

    /// Freezes the filesystem: every operation on it blocks (the serving thread waits for the
    /// state) until the returned guard is dropped. For tests of programs whose disk hangs.
    pub fn freeze(&self) -> Freeze {
        let state = Arc::clone(&self.state);
        let (held, frozen) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("powercut-freeze".into())
            .spawn(move || {
                let _guard = state.lock();
                let _ = held.send(());
                let _ = released.recv();
            })
            .expect("spawn the freezing thread");
        let _ = frozen.recv();
        Freeze {
            release: Some(release),
            thread: Some(thread),
        }
    }

    /// Starts trace mode (see [`trace`]): from now on every mutating operation and every sync
    /// is recorded, in order, until [`PowerCutHandle::take_trace`]. Refused (`false`) unless
    /// the filesystem is still empty, since a trace must rebuild everything from its start.
    pub fn start_trace(&self) -> bool {
        let mut state = self.state.lock();
        let empty = state
            .current
            .entries(ROOT)
            .is_ok_and(|entries| entries.is_empty());
        if empty {
            state.trace = Some(Vec::new());
        }
        empty
    }

    /// A handle that inserts markers into this filesystem's trace, from any thread.
    pub fn marker(&self) -> TraceMarker {
        TraceMarker {
            state: Arc::clone(&self.state),
        }
    }

    /// Stops trace mode and returns what was recorded (empty if it was never started).
    pub fn take_trace(&self) -> Vec<TraceRecord> {
        self.state.lock().trace.take().unwrap_or_default()
    }

    /// What the filesystem has done so far.
    pub fn stats(&self) -> PowerCutStats {
        self.state.lock().stats
    }

    /// Unmounts and waits for the serving thread to stop. Files still open on the filesystem
    /// (a killed process's, or a library's I/O thread that closes its files a moment after its
    /// owner let go) are waited for, up to [`UNMOUNT_WAIT_FOR_CLOSE`]; the kernel refuses to
    /// unmount (`EBUSY`) while any is open.
    pub fn unmount(mut self) -> Result<(), PowerCutError> {
        self.unmount_inner()
    }

    /// Handles the kernel still holds on this filesystem.
    pub fn handles_held(&self) -> u64 {
        self.state.lock().handles_held
    }

    fn unmount_inner(&mut self) -> Result<(), PowerCutError> {
        let deadline = std::time::Instant::now() + UNMOUNT_WAIT_FOR_CLOSE;
        while self.session.is_some()
            && self.handles_held() > 0
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        match self.session.take() {
            Some(session) => session
                .umount_and_join()
                .map_err(|source| PowerCutError::Unmount {
                    mountpoint: self.mountpoint.clone(),
                    source,
                }),
            None => Ok(()),
        }
    }
}

impl Drop for PowerCutHandle {
    fn drop(&mut self) {
        if let Err(error) = self.unmount_inner() {
            tracing::warn!(%error, "unmount on drop failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(state: &mut State, parent: u64, name: &str, data: &[u8]) -> u64 {
        let ino = state.next_ino;
        state.next_ino += 1;
        state
            .current
            .inodes
            .insert(ino, Inode::new(Content::File(data.to_vec()), 0o644, 0, 0));
        state
            .current
            .entries_mut(parent)
            .expect("dir")
            .insert(name.into(), ino);
        ino
    }

    fn dir(state: &mut State, parent: u64, name: &str) -> u64 {
        let ino = state.next_ino;
        state.next_ino += 1;
        state.current.inodes.insert(
            ino,
            Inode::new(Content::Directory(BTreeMap::new()), 0o755, 0, 0),
        );
        state
            .current
            .entries_mut(parent)
            .expect("dir")
            .insert(name.into(), ino);
        ino
    }

    fn data_at(state: &State, parent: u64, name: &str) -> Option<Vec<u8>> {
        let ino = *state.current.entries(parent).ok()?.get(OsStr::new(name))?;
        match &state.current.inodes.get(&ino)?.content {
            Content::File(data) => Some(data.clone()),
            Content::Directory(_) => None,
        }
    }

    #[test]
    fn unsynced_file_vanishes_on_power_cut() {
        // A file created and written but never synced does not survive a cut.
        let mut state = State::new(0, 0);
        file(&mut state, ROOT, "a", b"hello");
        state.cut_power();
        assert_eq!(data_at(&state, ROOT, "a"), None);
    }

    #[test]
    fn file_fsync_makes_data_and_its_name_durable_with_parent_directories() {
        // fsync of a file in a new sub-directory keeps the data, the name and the directory.
        let mut state = State::new(0, 0);
        let sub = dir(&mut state, ROOT, "sub");
        let ino = file(&mut state, sub, "a", b"hello");
        state.sync_file(ino).expect("sync");
        if let Some(Inode {
            content: Content::File(data),
            ..
        }) = state.current.inodes.get_mut(&ino)
        {
            data.extend_from_slice(b" world, not synced");
        }
        state.cut_power();
        let sub = *state
            .current
            .entries(ROOT)
            .expect("root")
            .get(OsStr::new("sub"))
            .expect("sub survives");
        assert_eq!(data_at(&state, sub, "a"), Some(b"hello".to_vec()));
    }

    #[test]
    fn directory_fsync_keeps_names_but_not_unsynced_data() {
        // fsync of the directory keeps the entry of a never-synced file, as an empty file.
        let mut state = State::new(0, 0);
        file(&mut state, ROOT, "a", b"data");
        state.sync_dir(ROOT).expect("sync dir");
        state.cut_power();
        assert_eq!(data_at(&state, ROOT, "a"), Some(Vec::new()));
    }

    #[test]
    fn unsynced_rename_and_unlink_are_undone_by_power_cut() {
        // A synced file renamed, and another unlinked, without a directory fsync: both undone.
        let mut state = State::new(0, 0);
        let a = file(&mut state, ROOT, "a", b"A");
        let b = file(&mut state, ROOT, "b", b"B");
        state.sync_file(a).expect("sync a");
        state.sync_file(b).expect("sync b");
        let entries = state.current.entries_mut(ROOT).expect("root");
        entries.remove(OsStr::new("a"));
        entries.insert("c".into(), a);
        entries.remove(OsStr::new("b"));
        state.cut_power();
        assert_eq!(data_at(&state, ROOT, "a"), Some(b"A".to_vec()));
        assert_eq!(data_at(&state, ROOT, "b"), Some(b"B".to_vec()));
        assert_eq!(data_at(&state, ROOT, "c"), None);
    }

    #[test]
    fn handles_from_before_a_cut_get_eio() {
        // A handle's epoch is checked: after a cut, old handles fail with EIO.
        let mut state = State::new(0, 0);
        let a = file(&mut state, ROOT, "a", b"A");
        let fh = state.open_handle(a);
        assert!(state.check_handle(fh).is_ok());
        state.cut_power();
        assert_eq!(state.check_handle(fh), Err(Errno::EIO));
    }

    fn torn(seed: u64) -> State {
        State::with_options(
            0,
            0,
            PowerCutOptions {
                torn_writes_seed: Some(seed),
                strict_directories: false,
            },
        )
    }

    /// Writes `data` at `offset` of file `ino` as the write handler does.
    fn write(state: &mut State, ino: u64, offset: u64, data: &[u8]) {
        if let Some(Inode {
            content: Content::File(bytes),
            ..
        }) = state.current.inodes.get_mut(&ino)
        {
            write_at(bytes, offset, data);
        }
        state.remember(
            ino,
            PendingWrite::Write {
                offset,
                data: data.to_vec(),
            },
        );
    }

    #[test]
    fn torn_writes_keep_a_prefix_of_unsynced_writes_and_tear_the_next_by_sector() {
        // A synced file gets three unsynced 1 KiB writes of 0xAA, 0xBB, 0xCC one after the
        // other. After a cut, every write before the torn one is whole, the torn one holds
        // whole sectors only, and nothing after it survives. Over many seeds, every outcome
        // from "nothing" to "two whole writes plus part of the third" shows up.
        let mut outcomes = std::collections::BTreeSet::new();
        for seed in 1..200u64 {
            let mut state = torn(seed);
            let ino = file(&mut state, ROOT, "f", &[]);
            state.sync_file(ino).expect("sync");
            for (position, byte) in [0xAAu8, 0xBB, 0xCC].iter().enumerate() {
                write(&mut state, ino, position as u64 * 1024, &[*byte; 1024]);
            }
            state.cut_power();
            let data = data_at(&state, ROOT, "f").expect("file survives");
            let sectors: Vec<u8> = data
                .chunks(SECTOR_BYTES as usize)
                .map(|sector| {
                    assert!(sector.iter().all(|b| *b == sector[0]), "sectors are whole");
                    sector[0]
                })
                .collect();
            // Whole writes first, then part of one, then nothing.
            let whole = sectors
                .chunks(2)
                .take_while(|w| w.len() == 2 && w[0] != 0 && w[1] != 0)
                .count();
            assert!(
                sectors.iter().skip((whole + 1) * 2).all(|b| *b == 0),
                "{sectors:?}"
            );
            outcomes.insert(sectors);
        }
        assert!(outcomes.len() >= 5, "varied outcomes: {outcomes:?}");
    }

    #[test]
    fn strict_directories_lose_a_synced_file_whose_directory_was_not_synced() {
        // Strict mode: fsync of a new file keeps its data but not its name; only an fsync of
        // the directory makes the name durable.
        let options = PowerCutOptions {
            torn_writes_seed: None,
            strict_directories: true,
        };
        let mut state = State::with_options(0, 0, options);
        let a = file(&mut state, ROOT, "a", b"A");
        state.sync_file(a).expect("sync a");
        state.cut_power();
        assert_eq!(
            data_at(&state, ROOT, "a"),
            None,
            "the name was never made durable"
        );
        let b = file(&mut state, ROOT, "b", b"B");
        state.sync_file(b).expect("sync b");
        state.sync_dir(ROOT).expect("sync root");
        state.cut_power();
        assert_eq!(data_at(&state, ROOT, "b"), Some(b"B".to_vec()));
    }
}
