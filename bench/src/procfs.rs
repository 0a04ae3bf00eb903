//! Process accounting from the kernel: the bench's own CPU (getrusage), and
//! the CPU and resident memory of node processes on this machine (`/proc`).
//! Everything here is best effort: a node on another machine, or a `/proc`
//! that cannot be read, gives `None`, never an error.

use std::time::Duration;

/// CPU time (user + system) this process has used so far.
pub(crate) fn self_cpu() -> Duration {
    // SAFETY: getrusage writes into the struct we hand it and nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    if rc != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as u64
    } else {
        100
    }
}

/// CPU time (user + system) process `pid` has used so far.
pub(crate) fn process_cpu(pid: i32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: fields are counted after its ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let ticks = clock_ticks_per_second();
    Some(Duration::from_micros((utime + stime) * 1_000_000 / ticks))
}

/// Context switches (voluntary and involuntary) of every live thread of
/// process `pid` so far: each voluntary one is a thread going to sleep, to be
/// woken again, so their count per operation is the wake-ups an operation
/// costs. Threads that ended are not counted (Linux keeps no total of theirs
/// per process), so a window in which threads exit (tokio's blocking pool
/// retires idle threads after 10 s) under-counts.
pub(crate) fn process_context_switches(pid: i32) -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        // A thread that ended between the listing and the read is skipped.
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        for line in status.lines() {
            let count = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"));
            if let Some(n) = count.and_then(|v| v.trim().parse::<u64>().ok()) {
                total += n;
            }
        }
    }
    Some(total)
}

/// Resident memory of process `pid`, in KiB.
pub(crate) fn process_rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The local process listening on `address`'s TCP port, if any.
pub(crate) fn pid_listening_on(address: &str) -> Option<i32> {
    let port: u16 = address.rsplit_once(':')?.1.parse().ok()?;
    let inode = listening_inode(port)?;
    let wanted = format!("socket:[{inode}]");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path())
                .is_ok_and(|target| target.as_os_str() == wanted.as_str())
            {
                return Some(pid);
            }
        }
    }
    None
}

/// The inode of the listening TCP socket on `port` (IPv4 or IPv6).
fn listening_inode(port: u16) -> Option<u64> {
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        if let Some(inode) = find_listener(&text, port) {
            return Some(inode);
        }
    }
    None
}

/// Parses a `/proc/net/tcp` table for a socket in LISTEN state (0A) on `port`.
fn find_listener(table: &str, port: u16) -> Option<u64> {
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(local), Some(state), Some(inode)) = (fields.get(1), fields.get(3), fields.get(9))
        else {
            continue;
        };
        let Some((_, port_hex)) = local.rsplit_once(':') else {
            continue;
        };
        if *state == "0A" && u16::from_str_radix(port_hex, 16).ok() == Some(port) {
            if let Ok(inode) = inode.parse::<u64>() {
                if inode != 0 {
                    return Some(inode);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_is_found_by_port_in_a_proc_net_tcp_table() {
        // Picks the LISTEN row of the wanted port, ignoring established ones.
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1B59 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 100 0 0 10 0\n\
   1: 0100007F:1B59 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0 20 4 30 10 -1\n";
        assert_eq!(find_listener(table, 7001), Some(4242));
        assert_eq!(find_listener(table, 7002), None);
        assert_eq!(find_listener("garbage\nnot a table", 7001), None);
    }

    #[test]
    fn this_process_has_cpu_and_memory_figures() {
        // /proc and getrusage answer for the test process itself.
        let pid = std::process::id() as i32;
        let switches = process_context_switches(pid).expect("context switches");
        std::thread::sleep(std::time::Duration::from_millis(5)); // one voluntary switch at least
        assert!(process_context_switches(pid).unwrap() > switches);
        let me = std::process::id() as i32;
        assert!(process_rss_kib(me).is_some_and(|k| k > 0));
        assert!(process_cpu(me).is_some());
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(20) {}
        assert!(self_cpu() > Duration::ZERO);
    }

    #[test]
    fn a_local_listener_is_mapped_to_this_process() {
        // A socket this process listens on is found, with this process's pid.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        assert_eq!(pid_listening_on(&address), Some(std::process::id() as i32));
    }
}
