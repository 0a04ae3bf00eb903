//! `cairn lease grant | keep-alive | revoke | list | ttl`, `cairn lock` and `cairn elect`:
//! leases, and the lock and the election held with one (`docs/contract.md`, "Leases";
//! the library is [`cairn_client::lease`] and [`cairn_client::election`]).
//!
//! - `cairn lease grant --ttl 10s` prints the new lease's id; nothing keeps it alive: it
//!   expires a TTL later unless `cairn lease keep-alive ID` (or a program) renews it.
//!   Attach resources with `cairn write --lease ID`.
//! - `cairn lease keep-alive ID` renews it every third of its TTL until Ctrl-C or SIGTERM
//!   (then leaves it to expire); `--once` renews it once; `-v` prints every renewal.
//! - `cairn lease revoke ID` ends it and deletes what is attached to it; `cairn lease list`
//!   and `cairn lease ttl ID` show leases as the answering node sees them.
//! - `cairn lock NAME -- CMD ARGS...` grants a lease, waits until it holds the election
//!   NAME, runs CMD with `CAIRN_LOCK_NAME`, `CAIRN_LOCK_TOKEN` (the fencing token: pass it
//!   to what CMD writes so the cluster can refuse a deposed holder's writes) and
//!   `CAIRN_LEASE_ID`, then resigns, revokes the lease and exits with CMD's code. Ctrl-C
//!   and SIGTERM are passed on to CMD. If the lock is lost while CMD runs (the lease could
//!   not be kept alive, or the election was deleted), CMD gets SIGTERM (SIGKILL
//!   [`KILL_AFTER`] later if it is still running) and `cairn lock` exits [`exit::LOST`].
//! - `cairn elect NAME [VALUE]` campaigns as VALUE (default `HOSTNAME:PID`), prints
//!   `elected NAME token T` when it wins, and holds the election until Ctrl-C or SIGTERM
//!   (then resigns and exits 0) or until it is lost (exit [`exit::LOST`]).
//!   `cairn elect NAME --listen` prints the holder at first and at every change, until
//!   Ctrl-C.
//!
//! Durations (`--ttl`) are a whole number and a unit: `500ms`, `10s`, `2m`, `1h`
//! ([`parse_duration`]).
//!
//! ## Exit codes
//!
//! The shared table ([`crate::common`]): 0 ok, 1 error, 2 invalid argument, 3 not found
//! (no such lease), 4 CAS conflict, 5 unavailable, 6 not authorized; and
//! [`exit`]: 7 when the lease, lock or election was lost while held (`lease
//! keep-alive`, `lock`, `elect`); for `lock`, CMD's own code when it ran (128 + N when a
//! signal N ended it), 126 when it could not be started and 127 when it was not found.

use std::time::Duration;

use cairn_client::{Client, ClientError, Election, Holder, LeaseState, Outcome};
use cairn_proto::v1::Tenancy;
use clap::{Args, Subcommand};
use serde_json::json;

use crate::common::{exit, exit_code, GlobalArgs, OutputFormat};

/// How long CMD gets to end after SIGTERM once the lock is lost, before SIGKILL.
pub const KILL_AFTER: Duration = Duration::from_secs(10);
/// How long the clean-up after a loss (resign, revoke) may take before the command exits.
const CLEAN_UP_AFTER_LOSS: Duration = Duration::from_secs(2);

#[derive(Subcommand, Debug)]
pub enum LeaseCommand {
    /// Grant a lease and print its id. Nothing keeps it alive: it expires a TTL later
    /// unless renewed (`cairn lease keep-alive ID`).
    Grant {
        /// Its time to live: 500ms, 10s, 2m, 1h.
        #[arg(long, value_parser = parse_duration)]
        ttl: Duration,
    },
    /// Renew a lease every third of its TTL until Ctrl-C or SIGTERM (then leave it to
    /// expire), or once with --once. Exits 3 if there is no such lease, 7 if it is lost.
    KeepAlive {
        id: u64,
        /// Renew it once and exit.
        #[arg(long)]
        once: bool,
        /// Print every renewal.
        #[arg(short, long)]
        verbose: bool,
    },
    /// End a lease now: the cluster deletes every resource attached to it.
    Revoke { id: u64 },
    /// Every lease, as the answering node sees them (remaining time is its estimate).
    List,
    /// One lease: its TTL, remaining time and attached resources.
    Ttl { id: u64 },
}

#[derive(Args, Debug)]
pub struct LockArgs {
    /// The lock: an election of this name.
    pub name: String,
    /// The TTL of the lease holding it: how long the lock outlives a `cairn lock` that
    /// stopped renewing it (killed, paused, cut off).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub ttl: Duration,
    /// PARTITION/NAMESPACE of the election.
    #[arg(long, default_value = "default/default", value_parser = crate::data::parse_tenancy)]
    pub tenancy: Tenancy,
    /// The command to run while holding the lock, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ElectArgs {
    /// The election.
    pub name: String,
    /// The identity to campaign as (default HOSTNAME:PID).
    #[arg(conflicts_with = "listen")]
    pub value: Option<String>,
    /// The TTL of the lease holding it.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub ttl: Duration,
    /// PARTITION/NAMESPACE of the election.
    #[arg(long, default_value = "default/default", value_parser = crate::data::parse_tenancy)]
    pub tenancy: Tenancy,
    /// Do not campaign: print the holder now and at every change, until Ctrl-C.
    #[arg(long)]
    pub listen: bool,
}

// ------------------------------------------------------------- parsing ----

/// `500ms`, `10s`, `2m`, `1h`: a whole number and a unit.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(digits_end);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (for example 500ms, 10s, 2m)"))?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" => return Err(format!("{s:?} needs a unit: ms, s, m or h")),
        other => return Err(format!("{other:?} is not a unit: use ms, s, m or h")),
    };
    let ms = n
        .checked_mul(unit_ms)
        .ok_or_else(|| format!("{s:?} is too long"))?;
    if ms == 0 {
        return Err(format!("{s:?} must be longer than 0"));
    }
    Ok(Duration::from_millis(ms))
}

/// A number of milliseconds as a person reads it: `750ms`, `10s`, `9.6s`.
pub fn format_ms(ms: u64) -> String {
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms.is_multiple_of(1_000) {
        format!("{}s", ms / 1_000)
    } else {
        format!("{}.{}s", ms / 1_000, (ms % 1_000) / 100)
    }
}

/// Who a candidate is unless told: `HOSTNAME:PID`.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}:{}", std::process::id())
}

/// The exit code of a program that `status` ended: its code, or 128 + the signal that
/// killed it (as a shell reports it).
pub fn exit_code_of_status(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(exit::ERROR),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(exit::ERROR),
        (None, None) => exit::ERROR,
    }
}

// ------------------------------------------------------------- running ----

/// Prints `e` (saying when the outcome is unknown) and returns its exit code.
fn fail(e: &ClientError) -> u8 {
    let note = match e.outcome() {
        Outcome::Unknown => " (the change may or may not have been applied)",
        Outcome::NotApplied => "",
    };
    eprintln!("error: {e}{note}");
    exit_code(e)
}

fn no_such_lease(id: u64) -> u8 {
    eprintln!("error: lease {id} does not exist: it expired or was revoked");
    exit::NOT_FOUND
}

fn client(global: &GlobalArgs) -> Result<Client, u8> {
    crate::data::client_of(global).map_err(|e| fail(&e))
}

/// Ctrl-C (SIGINT) and SIGTERM.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn listen() -> Result<Signals, u8> {
        use tokio::signal::unix::{signal, SignalKind};
        let listen = || -> std::io::Result<Signals> {
            Ok(Signals {
                interrupt: signal(SignalKind::interrupt())?,
                terminate: signal(SignalKind::terminate())?,
            })
        };
        listen().map_err(|e| {
            eprintln!("error: cannot listen for Ctrl-C and SIGTERM: {e}");
            exit::ERROR
        })
    }

    /// The next of them, as its signal number.
    async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.interrupt.recv() => libc::SIGINT,
            _ = self.terminate.recv() => libc::SIGTERM,
        }
    }
}

/// `cairn lease ...`.
pub async fn lease(command: LeaseCommand, global: &GlobalArgs) -> u8 {
    let client = match client(global) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let output = global.output;
    let done = match command {
        LeaseCommand::Grant { ttl } => grant(&client, ttl, output).await,
        LeaseCommand::KeepAlive {
            id,
            once: true,
            verbose: _,
        } => match client.keep_alive_once(id).await {
            Ok(Some(ttl)) => {
                print_renewal(output, id, ttl, None);
                Ok(exit::OK)
            }
            Ok(None) => Ok(no_such_lease(id)),
            Err(e) => Err(e),
        },
        LeaseCommand::KeepAlive {
            id,
            once: false,
            verbose,
        } => keep_alive(&client, id, verbose, output).await,
        LeaseCommand::Revoke { id } => match client.revoke_lease(id).await {
            Ok(Some(revoked)) => {
                match output {
                    OutputFormat::Json => out!(
                        "{}",
                        json!({
                            "id": id,
                            "revision": revoked.revision,
                            "deleted_count": revoked.deleted_count,
                        })
                    ),
                    OutputFormat::Table => out!(
                        "revoked lease {id}: {} attached resource{} deleted (revision {})",
                        revoked.deleted_count,
                        if revoked.deleted_count == 1 { "" } else { "s" },
                        revoked.revision
                    ),
                }
                Ok(exit::OK)
            }
            Ok(None) => Ok(no_such_lease(id)),
            Err(e) => Err(e),
        },
        LeaseCommand::List => client.leases().await.map(|listed| {
            print_leases(output, &listed.leases, Some(listed.revision));
            exit::OK
        }),
        LeaseCommand::Ttl { id } => match client.lease_time_to_live(id).await {
            Ok(Some(lease)) => {
                print_leases(output, &[lease], None);
                Ok(exit::OK)
            }
            Ok(None) => Ok(no_such_lease(id)),
            Err(e) => Err(e),
        },
    };
    done.unwrap_or_else(|e| fail(&e))
}

/// `cairn lease grant`: the lease is left to expire (or to whoever keeps it alive).
async fn grant(client: &Client, ttl: Duration, output: OutputFormat) -> Result<u8, ClientError> {
    let lease = client.grant_lease(ttl).await?;
    let ttl_ms = lease.ttl().as_millis();
    let id = lease.detach();
    match output {
        OutputFormat::Json => out!("{}", json!({ "id": id, "ttl_ms": ttl_ms })),
        OutputFormat::Table => out!("{id}"),
    }
    Ok(exit::OK)
}

/// One renewal: the TTL the cluster answered, and how long the lease is certainly held
/// from now when known (the send time of the renewal plus the TTL, minus what passed).
fn print_renewal(output: OutputFormat, id: u64, ttl: Duration, held_for: Option<Duration>) {
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    let held_ms = held_for.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    match (output, held_ms) {
        (OutputFormat::Json, _) => out!(
            "{}",
            json!({ "id": id, "ttl_ms": ttl_ms, "held_for_ms": held_ms })
        ),
        (OutputFormat::Table, None) => out!("lease {id} renewed: TTL {}", format_ms(ttl_ms)),
        (OutputFormat::Table, Some(held_ms)) => out!(
            "lease {id} renewed: TTL {}, held for at least {}",
            format_ms(ttl_ms),
            format_ms(held_ms)
        ),
    }
}

/// `cairn lease keep-alive ID`: until Ctrl-C or SIGTERM, or until the lease is lost. It
/// never revokes the lease: it only stops renewing it.
async fn keep_alive(
    client: &Client,
    id: u64,
    verbose: bool,
    output: OutputFormat,
) -> Result<u8, ClientError> {
    let mut signals = match Signals::listen() {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let Some(lease) = client.resume_lease(id).await? else {
        return Ok(no_such_lease(id));
    };
    let ttl_ms = u64::try_from(lease.ttl().as_millis()).unwrap_or(u64::MAX);
    eprintln!(
        "keeping lease {id} alive (TTL {}) until Ctrl-C",
        format_ms(ttl_ms)
    );
    let mut state = lease.state();
    loop {
        let now = state.borrow_and_update().clone();
        match now {
            LeaseState::Lost(loss) => {
                eprintln!("error: lease {id} lost: {loss}");
                // Whatever the cluster still holds is left to expire, never revoked here.
                lease.detach();
                return Ok(exit::LOST);
            }
            LeaseState::Held { until } if verbose => {
                let held_for = until.saturating_duration_since(tokio::time::Instant::now());
                print_renewal(output, id, lease.ttl(), Some(held_for));
            }
            LeaseState::Held { .. } => {}
        }
        tokio::select! {
            _ = signals.recv() => {
                lease.detach();
                return Ok(exit::OK);
            }
            changed = state.changed() => {
                if changed.is_err() {
                    eprintln!("error: lease {id}: its keeper stopped");
                    lease.detach();
                    return Ok(exit::ERROR);
                }
            }
        }
    }
}

fn print_leases(output: OutputFormat, leases: &[cairn_proto::v1::Lease], revision: Option<u64>) {
    let as_json = |l: &cairn_proto::v1::Lease| {
        json!({
            "id": l.id,
            "ttl_ms": l.ttl_ms,
            "remaining_ms": l.remaining_ms,
            "attached_count": l.attached_count,
            "granted_revision": l.granted_revision,
            "renewed_revision": l.renewed_revision,
        })
    };
    match (output, revision) {
        (OutputFormat::Json, Some(revision)) => out!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "leases": leases.iter().map(as_json).collect::<Vec<_>>(),
                "revision": revision,
            }))
            .unwrap_or_default()
        ),
        (OutputFormat::Json, None) => {
            for l in leases {
                out!("{}", as_json(l));
            }
        }
        (OutputFormat::Table, _) => {
            out!(
                "{:<20} {:>10} {:>10} {:>9}",
                "ID",
                "TTL",
                "REMAINING",
                "ATTACHED"
            );
            for l in leases {
                out!(
                    "{:<20} {:>10} {:>10} {:>9}",
                    l.id,
                    format_ms(l.ttl_ms),
                    format_ms(l.remaining_ms),
                    l.attached_count
                );
            }
        }
    }
}

/// `cairn lock NAME -- CMD ARGS...`.
pub async fn lock(args: LockArgs, global: &GlobalArgs) -> u8 {
    let mut signals = match Signals::listen() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let client = match client(global) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let lease = match client.grant_lease(args.ttl).await {
        Ok(lease) => lease,
        Err(e) => return fail(&e),
    };
    let election = Election::new(client, &args.name, Some(args.tenancy.clone()));
    let leadership = tokio::select! {
        won = election.campaign(&lease, default_identity()) => match won {
            Ok(leadership) => leadership,
            Err(e) => {
                let code = fail(&e);
                let _ = tokio::time::timeout(CLEAN_UP_AFTER_LOSS, lease.revoke()).await;
                return code;
            }
        },
        _ = signals.recv() => {
            eprintln!("error: interrupted before the lock {} was acquired; the command did not run", args.name);
            let _ = tokio::time::timeout(CLEAN_UP_AFTER_LOSS, lease.revoke()).await;
            return exit::ERROR;
        }
    };
    let token = leadership.token();
    let spawned = tokio::process::Command::new(&args.command[0])
        .args(&args.command[1..])
        .env("CAIRN_LOCK_NAME", &args.name)
        .env("CAIRN_LOCK_TOKEN", token.to_string())
        .env("CAIRN_LEASE_ID", lease.id().to_string())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            eprintln!("error: cannot run {:?}: {e}", args.command[0]);
            let _ = leadership.resign().await;
            let _ = lease.revoke().await;
            return match e.kind() {
                std::io::ErrorKind::NotFound => exit::COMMAND_NOT_FOUND,
                _ => exit::CANNOT_RUN,
            };
        }
    };
    let pid = child.id().and_then(|p| i32::try_from(p).ok());
    let lost = leadership.lost();
    tokio::pin!(lost);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            signal = signals.recv() => {
                // Ctrl-C or SIGTERM: CMD decides; the lock is released once it exits.
                if let Some(pid) = pid {
                    send_signal(pid, signal);
                }
            }
            loss = &mut lost => {
                eprintln!(
                    "error: lost the lock {} (token {token}) while the command ran: {loss}; \
                     sending it SIGTERM",
                    args.name
                );
                if let Some(pid) = pid {
                    send_signal(pid, libc::SIGTERM);
                }
                match tokio::time::timeout(KILL_AFTER, child.wait()).await {
                    Ok(_) => {}
                    Err(_) => {
                        eprintln!(
                            "error: the command still runs {} s after SIGTERM: SIGKILL",
                            KILL_AFTER.as_secs()
                        );
                        let _ = child.kill().await;
                    }
                }
                let _ = tokio::time::timeout(CLEAN_UP_AFTER_LOSS, lease.revoke()).await;
                return exit::LOST;
            }
        }
    };
    let code = match status {
        Ok(status) => exit_code_of_status(status),
        Err(e) => {
            eprintln!("error: cannot wait for the command: {e}");
            exit::ERROR
        }
    };
    if let Err(e) = leadership.resign().await {
        eprintln!(
            "warning: cannot resign the lock {}: {e}; revoking its lease",
            args.name
        );
    }
    if let Err(e) = lease.revoke().await {
        eprintln!("warning: cannot revoke lease: {e}; it expires within its TTL");
    }
    code
}

fn send_signal(pid: i32, signal: i32) {
    // SAFETY: kill(2) on the child this process started and has not reaped yet.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// `cairn elect NAME [VALUE]` and `cairn elect NAME --listen`.
pub async fn elect(args: ElectArgs, global: &GlobalArgs) -> u8 {
    let mut signals = match Signals::listen() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let client = match client(global) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let election = Election::new(client.clone(), &args.name, Some(args.tenancy.clone()));
    if args.listen {
        return listen(&election, &mut signals, global.output).await;
    }
    let identity = args.value.clone().unwrap_or_else(default_identity);
    let lease = match client.grant_lease(args.ttl).await {
        Ok(lease) => lease,
        Err(e) => return fail(&e),
    };
    let leadership = tokio::select! {
        won = election.campaign(&lease, identity.clone()) => match won {
            Ok(leadership) => leadership,
            Err(e) => {
                let code = fail(&e);
                let _ = tokio::time::timeout(CLEAN_UP_AFTER_LOSS, lease.revoke()).await;
                return code;
            }
        },
        _ = signals.recv() => {
            let _ = tokio::time::timeout(CLEAN_UP_AFTER_LOSS, lease.revoke()).await;
            return exit::OK;
        }
    };
    let token = leadership.token();
    match global.output {
        OutputFormat::Json => out!(
            "{}",
            json!({
                "name": args.name,
                "holder": identity,
                "token": token,
                "lease": lease.id(),
            })
        ),
        OutputFormat::Table => out!("elected {} token {token}", args.name),
    }
    tokio::select! {
        _ = signals.recv() => {
            let mut code = exit::OK;
            if let Err(e) = leadership.resign().await {
                code = fail(&e);
            }
            if let Err(e) = lease.revoke().await {
                eprintln!("warning: cannot revoke lease: {e}; it expires within its TTL");
            }
            code
        }
        loss = leadership.lost() => {
            eprintln!("error: lost the election {} (token {token}): {loss}", args.name);
            let _ = tokio::time::timeout(CLEAN_UP_AFTER_LOSS, lease.revoke()).await;
            exit::LOST
        }
    }
}

/// `cairn elect NAME --listen`: one line per holder, until Ctrl-C or SIGTERM.
async fn listen(election: &Election, signals: &mut Signals, output: OutputFormat) -> u8 {
    let mut observer = election.observe();
    loop {
        let holder = tokio::select! {
            _ = signals.recv() => return exit::OK,
            next = observer.next() => match next {
                Ok(holder) => holder,
                Err(e) => return fail(&e),
            },
        };
        out!("{}", holder_line(output, election.name(), holder.as_ref()));
    }
}

/// One line of `cairn elect --listen`: `NAME: IDENTITY (token T)` or `NAME: no holder`;
/// in JSON, `{"name", "holder", "token"}` (null without a holder).
pub fn holder_line(output: OutputFormat, name: &str, holder: Option<&Holder>) -> String {
    match (output, holder) {
        (OutputFormat::Json, Some(h)) => {
            json!({ "name": name, "holder": h.identity, "token": h.token }).to_string()
        }
        (OutputFormat::Json, None) => {
            json!({ "name": name, "holder": null, "token": null }).to_string()
        }
        (OutputFormat::Table, Some(h)) => format!("{name}: {} (token {})", h.identity, h.token),
        (OutputFormat::Table, None) => format!("{name}: no holder"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_a_whole_number_and_a_unit() {
        for (text, parsed) in [
            ("500ms", Ok(Duration::from_millis(500))),
            ("10s", Ok(Duration::from_secs(10))),
            ("2m", Ok(Duration::from_secs(120))),
            ("1h", Ok(Duration::from_secs(3600))),
            (" 3s ", Ok(Duration::from_secs(3))),
        ] {
            assert_eq!(parse_duration(text), parsed, "{text}");
        }
        for (text, complaint) in [
            ("10", "needs a unit"),
            ("10d", "is not a unit"),
            ("1.5s", "is not a unit"),
            ("s", "is not a duration"),
            ("0s", "longer than 0"),
            ("99999999999999999h", "too long"),
        ] {
            let e = parse_duration(text).expect_err(text);
            assert!(e.contains(complaint), "{text}: {e}");
        }
    }

    #[test]
    fn milliseconds_read_as_a_person_reads_them() {
        for (ms, text) in [
            (0, "0ms"),
            (750, "750ms"),
            (1000, "1s"),
            (9_650, "9.6s"),
            (120_000, "120s"),
        ] {
            assert_eq!(format_ms(ms), text);
        }
    }

    #[test]
    fn a_finished_command_s_exit_code_is_its_own_or_128_plus_its_signal() {
        use std::os::unix::process::ExitStatusExt as _;
        use std::process::ExitStatus;
        // The raw wait status: code << 8 for an exit, the signal number for a kill.
        for (raw, code) in [(0, 0), (3 << 8, 3), (255 << 8, 255), (9, 137), (15, 143)] {
            assert_eq!(
                exit_code_of_status(ExitStatus::from_raw(raw)),
                code,
                "{raw}"
            );
        }
    }

    #[test]
    fn a_listener_line_names_the_holder_and_its_token() {
        let holder = Holder {
            identity: "web-1:42".into(),
            token: 17,
            lease: 9,
            uid: "u".into(),
        };
        assert_eq!(
            holder_line(OutputFormat::Table, "db", Some(&holder)),
            "db: web-1:42 (token 17)"
        );
        assert_eq!(
            holder_line(OutputFormat::Table, "db", None),
            "db: no holder"
        );
        let json: serde_json::Value =
            serde_json::from_str(&holder_line(OutputFormat::Json, "db", Some(&holder))).unwrap();
        assert_eq!(
            json,
            json!({"name": "db", "holder": "web-1:42", "token": 17})
        );
        let json: serde_json::Value =
            serde_json::from_str(&holder_line(OutputFormat::Json, "db", None)).unwrap();
        assert_eq!(json, json!({"name": "db", "holder": null, "token": null}));
    }

    #[test]
    fn the_lost_exit_code_is_apart_from_the_shared_table() {
        // 7 is no kind's code, so a script tells a lost lock from every other failure.
        use cairn_proto::error::ErrorKind;
        for kind in [
            ErrorKind::NotFound,
            ErrorKind::CasFailure,
            ErrorKind::Unavailable,
            ErrorKind::InvalidArgument,
            ErrorKind::PermissionDenied,
            ErrorKind::FailedPrecondition,
            ErrorKind::Internal,
        ] {
            assert_ne!(crate::exit_code_of_kind(kind), exit::LOST, "{kind:?}");
        }
    }
}
