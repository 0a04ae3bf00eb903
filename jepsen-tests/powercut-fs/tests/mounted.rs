//! Tests through a real FUSE mount: what survives a power cut is exactly what was synced, for
//! the library API and for the `cairn-powercut-fs` binary driven by signals.

use std::fs::File;
use std::fs::OpenOptions;
use std::io::BufRead;
use std::io::BufReader;
use std::io::Read;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::process::Stdio;

use cairn_powercut_fs::fuse_unavailable_reason;
use cairn_powercut_fs::PowerCutFs;

/// Returns `true` (and says why, loudly) when FUSE cannot be used here.
fn skip_without_fuse(test: &str) -> bool {
    match fuse_unavailable_reason() {
        Some(reason) => {
            println!("SKIPPED {test}: FUSE is unavailable on this machine: {reason}");
            eprintln!("SKIPPED {test}: FUSE is unavailable on this machine: {reason}");
            true
        }
        None => false,
    }
}

fn read(path: &Path) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    File::open(path).ok()?.read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

#[test]
fn power_cut_keeps_exactly_what_was_synced() {
    // Synced data and names survive; unsynced writes, files and renames vanish; old handles get EIO.
    if skip_without_fuse("power_cut_keeps_exactly_what_was_synced") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fs = PowerCutFs::mount(dir.path()).expect("mount");
    let root = dir.path();

    let mut synced = File::create(root.join("synced")).expect("create");
    synced.write_all(b"durable").expect("write");
    synced.sync_data().expect("fdatasync");
    synced.write_all(b" lost").expect("write more");

    std::fs::create_dir(root.join("sub")).expect("mkdir");
    let mut nested = File::create(root.join("sub/nested")).expect("create nested");
    nested.write_all(b"nested").expect("write");
    nested.sync_all().expect("fsync");

    std::fs::write(root.join("unsynced"), b"gone").expect("write unsynced");
    std::fs::write(root.join("renamed-from"), b"r").expect("write");
    File::open(root.join("renamed-from"))
        .expect("open")
        .sync_all()
        .expect("fsync");
    std::fs::rename(root.join("renamed-from"), root.join("renamed-to")).expect("rename");

    let mut held = OpenOptions::new()
        .append(true)
        .open(root.join("synced"))
        .expect("open held");
    fs.cut_power();

    assert_eq!(read(&root.join("synced")), Some(b"durable".to_vec()));
    assert_eq!(read(&root.join("sub/nested")), Some(b"nested".to_vec()));
    assert_eq!(read(&root.join("unsynced")), None);
    assert_eq!(read(&root.join("renamed-from")), Some(b"r".to_vec()));
    assert_eq!(read(&root.join("renamed-to")), None);
    let error = held
        .write_all(b"x")
        .expect_err("a handle from before the cut is dead");
    assert_eq!(error.raw_os_error(), Some(libc::EIO));
    drop(held);
    drop(synced);
    drop(nested);
    assert_eq!(fs.stats().power_cuts, 1);
    fs.unmount().expect("unmount");
}

#[test]
fn directory_fsync_makes_renames_durable() {
    // write + fsync tmp, rename over the target, fsync the directory: the new content survives.
    if skip_without_fuse("directory_fsync_makes_renames_durable") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fs = PowerCutFs::mount(dir.path()).expect("mount");
    let root = dir.path();
    std::fs::write(root.join("current"), b"old").expect("write");
    File::open(root.join("current"))
        .expect("open")
        .sync_all()
        .expect("fsync");
    let mut tmp = File::create(root.join("current.tmp")).expect("create tmp");
    tmp.write_all(b"new").expect("write");
    tmp.sync_all().expect("fsync tmp");
    drop(tmp);
    std::fs::rename(root.join("current.tmp"), root.join("current")).expect("rename");
    File::open(root)
        .expect("open dir")
        .sync_all()
        .expect("fsync dir");
    fs.cut_power();
    assert_eq!(read(&root.join("current")), Some(b"new".to_vec()));
    assert_eq!(read(&root.join("current.tmp")), None);
    fs.unmount().expect("unmount");
}

#[test]
fn unmount_waits_for_a_file_closed_a_moment_later() {
    // A library's I/O thread may close its files a moment after its owner let go of it (sled's
    // do): unmounting then must wait for the close, not fail with EBUSY.
    if skip_without_fuse("unmount_waits_for_a_file_closed_a_moment_later") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fs = PowerCutFs::mount(dir.path()).expect("mount");
    // The straggler is another process (as sled's threads are, to the kernel, another file
    // holder): if unmount gave up at once, this test would fail with EBUSY rather than hang.
    let held = dir.path().join("held");
    std::fs::write(&held, b"x").expect("write");
    let mut straggler = Command::new("sh")
        .arg("-c")
        .arg("exec 3<\"$0\"; sleep 0.3")
        .arg(&held)
        .spawn()
        .expect("spawn sh");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while fs.handles_held() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the straggler never opened its file"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    fs.cut_power();
    assert_eq!(
        fs.handles_held(),
        1,
        "a handle from before the cut is still held"
    );
    fs.unmount()
        .expect("unmount once the straggler closed its file");
    assert!(straggler.wait().expect("wait for sh").success());
}

#[test]
fn binary_cuts_power_on_sigusr1_and_unmounts_on_sigterm() {
    // The binary prints `mounted`, cuts power on SIGUSR1 (`power-cut 1`), exits 0 on SIGTERM.
    if skip_without_fuse("binary_cuts_power_on_sigusr1_and_unmounts_on_sigterm") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn-powercut-fs"))
        .arg(dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn binary");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a line").expect("utf-8");
    assert!(first.starts_with("mounted "), "first line: {first}");
    std::fs::write(dir.path().join("a"), b"unsynced").expect("write");
    let pid = child.id() as libc::pid_t;
    // SAFETY: sending a signal to our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR1) }, 0);
    assert_eq!(lines.next().expect("a line").expect("utf-8"), "power-cut 1");
    assert_eq!(read(&dir.path().join("a")), None);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    assert_eq!(lines.next().expect("a line").expect("utf-8"), "unmounted");
    assert!(child.wait().expect("wait").success());
}

#[test]
fn trace_mode_records_changes_and_syncs_in_order_with_markers() {
    // Through a real mount: a file written, synced and renamed into place, with markers before
    // and after the sync, comes back as that sequence; the crash states of the trace hold the
    // old name and nothing unsynced before the directory sync, the new name after it.
    use cairn_powercut_fs::crash_state;
    use cairn_powercut_fs::crash_state::Semantics;
    use cairn_powercut_fs::TraceOp;
    if skip_without_fuse("trace_mode_records_changes_and_syncs_in_order_with_markers") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let fs = PowerCutFs::mount(dir.path()).expect("mount");
    assert!(fs.start_trace(), "an empty filesystem can be traced");
    let marker = fs.marker();
    let root = dir.path();
    let mut file = File::create(root.join("f.tmp")).expect("create");
    file.write_all(&[7u8; 1500]).expect("write");
    marker.mark(1);
    file.sync_data().expect("fdatasync");
    marker.mark(2);
    std::fs::rename(root.join("f.tmp"), root.join("f")).expect("rename");
    File::open(root)
        .expect("open root")
        .sync_all()
        .expect("fsync root");
    drop(file);
    let trace = fs.take_trace();
    let ops: Vec<&TraceOp> = trace.iter().map(|record| &record.op).collect();
    let position = |wanted: &dyn Fn(&TraceOp) -> bool| {
        ops.iter()
            .position(|op| wanted(op))
            .unwrap_or_else(|| panic!("{trace:#?}"))
    };
    let create = position(&|op| matches!(op, TraceOp::Create { name, .. } if name == "f.tmp"));
    let write = position(&|op| matches!(op, TraceOp::Write { data, .. } if data.len() == 1500));
    let first_mark = position(&|op| *op == TraceOp::Marker(1));
    let sync = position(&|op| {
        matches!(
            op,
            TraceOp::SyncFile {
                data_only: true,
                ..
            }
        )
    });
    let second_mark = position(&|op| *op == TraceOp::Marker(2));
    let rename = position(&|op| matches!(op, TraceOp::Rename { new_name, .. } if new_name == "f"));
    let sync_root = position(&|op| matches!(op, TraceOp::SyncDirectory { ino: 1 }));
    assert!(
        create < write
            && write < first_mark
            && first_mark < sync
            && sync < second_mark
            && second_mark < rename
            && rename < sync_root,
        "{trace:#?}"
    );
    for semantics in [Semantics::FileSyncNamesFile, Semantics::StrictDirectories] {
        let before = crash_state::window(&trace, sync_root, semantics);
        let tree = crash_state::build(&trace, &before, &crash_state::Choice::default());
        assert!(
            tree.file(Path::new("f")).is_none(),
            "{semantics:?}: {tree:?}"
        );
        let after = crash_state::window(&trace, trace.len(), semantics);
        let tree = crash_state::build(&trace, &after, &crash_state::Choice::default());
        assert_eq!(
            tree.file(Path::new("f")),
            Some(&[7u8; 1500][..]),
            "{semantics:?}"
        );
        assert!(tree.file(Path::new("f.tmp")).is_none());
    }
    fs.unmount().expect("unmount");
}
