//! `cairn-powercut-fs [--torn-writes SEED] [--strict-directories] MOUNTPOINT`: mounts a
//! power-cut filesystem (see the library docs, also for the two modes) at MOUNTPOINT and
//! serves it until told to stop.
//!
//! Control, by signal to this process (its pid is printed at start):
//! - `SIGUSR1`: cut the power. Kill the processes that use the filesystem first; files they
//!   still hold open fail with `EIO` afterwards. Prints `power-cut N` on stdout when done.
//! - `SIGUSR2`: print the counters (`stats power_cuts=.. file_syncs=.. directory_syncs=..
//!   writes=..`) on stdout.
//! - `SIGTERM` or `SIGINT`: unmount and exit 0.
//!
//! Prints `mounted MOUNTPOINT pid PID` on stdout once the filesystem is ready. Exits 2 on a
//! usage error, 1 when mounting fails (for example without `/dev/fuse` or `fusermount3`).

use std::io::Write;
use std::path::PathBuf;

use cairn_powercut_fs::PowerCutFs;
use cairn_powercut_fs::PowerCutOptions;

const USAGE: &str = "usage: cairn-powercut-fs [--torn-writes SEED] [--strict-directories] MOUNTPOINT\n  SIGUSR1 = cut power, SIGUSR2 = print stats, SIGTERM/SIGINT = unmount and exit";

fn usage_error(problem: &str) -> ! {
    eprintln!("cairn-powercut-fs: {problem}\n{USAGE}");
    std::process::exit(2);
}

fn main() {
    let mut options = PowerCutOptions::default();
    let mut mountpoint = None;
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("--torn-writes") => {
                let seed = args
                    .next()
                    .and_then(|seed| seed.to_str().and_then(|s| s.parse::<u64>().ok()))
                    .unwrap_or_else(|| usage_error("--torn-writes needs a numeric SEED"));
                options.torn_writes_seed = Some(seed);
            }
            Some("--strict-directories") => options.strict_directories = true,
            Some(flag) if flag.starts_with("--") => usage_error(&format!("unknown flag {flag}")),
            _ if mountpoint.is_none() => mountpoint = Some(PathBuf::from(arg)),
            _ => usage_error("only one MOUNTPOINT"),
        }
    }
    let Some(mountpoint) = mountpoint else {
        usage_error("MOUNTPOINT is missing");
    };

    // Block the control signals in every thread (the fuser thread inherits the mask), then
    // take them synchronously with sigwait on this thread.
    // SAFETY: plain libc signal-set manipulation on a local, initialised sigset_t.
    let signals = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGUSR1, libc::SIGUSR2, libc::SIGTERM, libc::SIGINT] {
            libc::sigaddset(&mut set, signal);
        }
        let ret = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if ret != 0 {
            eprintln!("cairn-powercut-fs: pthread_sigmask failed: {ret}");
            std::process::exit(1);
        }
        set
    };

    let handle = match PowerCutFs::mount_with(&mountpoint, options) {
        Ok(handle) => handle,
        Err(error) => {
            eprintln!("cairn-powercut-fs: {error}");
            std::process::exit(1);
        }
    };
    say(&format!(
        "mounted {} pid {}",
        mountpoint.display(),
        std::process::id()
    ));

    loop {
        let mut signal: libc::c_int = 0;
        // SAFETY: `signals` is an initialised set; `signal` is a valid out-pointer.
        let ret = unsafe { libc::sigwait(&signals, &mut signal) };
        if ret != 0 {
            eprintln!("cairn-powercut-fs: sigwait failed: {ret}");
            continue;
        }
        match signal {
            libc::SIGUSR1 => {
                handle.cut_power();
                say(&format!("power-cut {}", handle.stats().power_cuts));
            }
            libc::SIGUSR2 => {
                let stats = handle.stats();
                say(&format!(
                    "stats power_cuts={} file_syncs={} directory_syncs={} writes={}",
                    stats.power_cuts, stats.file_syncs, stats.directory_syncs, stats.writes
                ));
            }
            _ => break,
        }
    }
    match handle.unmount() {
        Ok(()) => say("unmounted"),
        Err(error) => {
            eprintln!("cairn-powercut-fs: {error}");
            std::process::exit(1);
        }
    }
}

fn say(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}
