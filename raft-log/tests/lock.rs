//! Data-dir lock: a second process opening the same directory gets a clear error naming the
//! holder's pid; the lock dies with its holder.

mod common;

use std::io::BufRead;
use std::io::BufReader;
use std::path::Path;
use std::time::Duration;

use cairn_raft_log::LogError;
use cairn_raft_log::LogOptions;
use common::Store;

const HOLDER_DIR_ENV: &str = "CAIRN_RAFT_LOG_LOCK_HOLDER_DIR";

/// Child side: not a test of its own. With the environment set, opens the store, prints
/// `LOCKED <pid>` and sleeps until killed; without it, returns at once.
#[test]
fn lock_holder_process_entry() {
    // Child process entry point: does nothing unless the parent set CAIRN_RAFT_LOG_LOCK_HOLDER_DIR.
    let Ok(dir) = std::env::var(HOLDER_DIR_ENV) else {
        return;
    };
    let _store =
        Store::open(Path::new(&dir), LogOptions::default()).expect("holder opens the store");
    println!("LOCKED {}", std::process::id());
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn second_process_opening_the_same_dir_gets_an_error_naming_the_holder_pid() {
    // A child process holds the store open; opening it here fails with Locked { holder_pid }
    // equal to the child's pid, and the message says so. After the child is killed, it opens.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = common::spawn_self(
        "lock_holder_process_entry",
        &[(HOLDER_DIR_ENV, dir.path().display().to_string())],
    );
    let stdout = child.stdout.take().expect("stdout");
    let mut announced = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read child stdout");
        if let Some(pid) = line.split("LOCKED ").nth(1) {
            announced = pid.trim().parse::<u32>().ok();
            break;
        }
    }
    let child_pid = child.id();
    assert_eq!(announced, Some(child_pid), "child announced its lock");

    let result = Store::open(dir.path(), LogOptions::default());
    let _ = child.kill();
    let _ = child.wait();
    match result {
        Err(
            error @ LogError::Locked {
                holder_pid: Some(pid),
                ..
            },
        ) => {
            let message = error.to_string();
            println!("second open reports: {message}");
            assert_eq!(pid, child_pid);
            assert!(
                message.contains(&child_pid.to_string()),
                "message names the pid: {message}"
            );
            assert!(
                message.contains("locked"),
                "message says what is wrong: {message}"
            );
        }
        other => panic!("expected Locked naming pid {child_pid}, got {other:?}"),
    }
    Store::open(dir.path(), LogOptions::default()).expect("the lock died with its holder");
}
