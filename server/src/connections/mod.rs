//! The connection layer of the client and peer ports: what a connection must
//! do before tonic (and so any handler, openraft or the fsm) sees it.
//!
//! - **A count per port** (`client_connections_max`, `peer_connections_max`):
//!   a connection over it is accepted and closed at once (never left in the
//!   kernel's backlog, where it would hang its client). The counts are kept
//!   well under the process's file-descriptor limit, whose soft value is
//!   raised to the hard one at start ([`raise_fd_limit`], as Go's runtime
//!   does), with a reserve ([`connection_budget`]) for the Raft log,
//!   snapshots and the connections this node opens: running out of
//!   descriptors never reaches the log store.
//! - **Accept errors**: EMFILE/ENFILE/ENOBUFS/ENOMEM make the accept loop
//!   back off and retry; no accept error ends it.
//! - **A handshake deadline** (`handshake_timeout_ms`): a new connection
//!   must finish its TLS handshake (TLS ports) and send the 24-byte HTTP/2
//!   client preface within it. Random bytes, an HTTP/1 request or a TLS
//!   handshake on a plaintext port are refused at their first wrong byte; a
//!   truncated preface or a client sending 1 byte/s meets the deadline.
//! - **A minimum receive rate** (`receive_bytes_per_second_min`,
//!   `receive_stall_timeout_ms`; see `receive`): while the node waits for
//!   the rest of something a client has begun (an HTTP/2 frame, a header
//!   block, a request body its handler is reading), the client must keep up
//!   that rate, falling behind by at most the stall timeout. A client that
//!   sends a request at 1 byte/s (slow-loris) is closed; a watch whose client
//!   sends nothing for hours owes nothing, and a restore upload at any sane
//!   rate is never cut. A method whose requests are a stream of messages
//!   (a follower's AppendEntries stream, lease keep-alives) owes nothing
//!   between two messages once one has come whole (`receive::GrpcMessages`).
//! - **An idle timeout** (`connection_idle_timeout_ms`): a connection with no
//!   request in flight for that long is closed the HTTP/2 way: the server
//!   sends GOAWAY (hyper's graceful shutdown) and serves every request the
//!   client sent before it saw it, so the client's channel reconnects for its
//!   next request instead of losing one. Idle means "no request", not "no
//!   bytes": pings and a request's headers trickled 1 byte/s do not keep a
//!   connection open. In-flight requests are counted by [`ActivityLayer`] (a
//!   request stays in flight until its response body ends, so an open watch
//!   keeps its connection). A client that neither closes the connection nor
//!   sends a request within `handshake_timeout_ms` of the GOAWAY is cut.
//! - **One log line per offending connection** (refused, garbage, deadline,
//!   too slow, idle), at most [`LOG_LINES_PER_SECOND`] a second per port; the rest are
//!   counted and reported once a second as `suppressed=N`.
//!
//! The verified client certificate's subject (TLS ports) travels with each
//! request in [`ConnectionInfo`] (see `crate::tls::client_cert_subject`).
//!
//! Tasks: per port, one task ([`serve`]) that accepts connections and
//! spawns, per connection, one task: its handshake, then tonic serving it.
//! Each connection gets a tonic server of its own (`serve_with_incoming_shutdown`
//! over a stream of just that connection), so that tonic's graceful shutdown
//! (GOAWAY, then the requests in flight finish) closes that one connection:
//! its shutdown signal is the connection going idle, the node stopping, or
//! the connection ending. The port's task returns once the node has stopped
//! and every connection task has ended.
//!
//! ## Invariants
//! - At most `connections_max` connections of a port are open past the
//!   accept call: each holds a semaphore permit from before its handshake
//!   until tonic drops it.
//! - A request in flight is counted exactly once, and uncounted exactly once
//!   (asserted: the count never goes below zero).
//! - A connection is told to go away at most once, and its idle line is
//!   written once.

mod receive;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use cairn_tls::rustls::ServerConfig;
use cairn_tls::Reloadable;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};

use self::receive::{FrameTracker, GrpcMessages, ReceiveMeter};
use crate::rate_limit::RateLimit;

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
pub const HTTP2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Per port, at most this many offending connections are logged one by one
/// each second; the rest are counted in one line.
pub const LOG_LINES_PER_SECOND: u32 = 200;

/// Pause of the accept loop after the process ran out of descriptors or memory.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The limits of one port.
#[derive(Debug, Clone)]
pub struct PortLimits {
    /// `client` or `peer`: names the port (and its config keys) in log lines.
    pub port: &'static str,
    pub connections_max: usize,
    pub handshake_timeout: Duration,
    /// `None`: idle connections are never closed.
    pub idle_timeout: Option<Duration>,
    /// `None`: no minimum receive rate.
    pub receive_rate: Option<ReceiveRate>,
}

/// The minimum receive rate of a port (see `receive`).
#[derive(Debug, Clone, Copy)]
pub struct ReceiveRate {
    /// `receive_bytes_per_second_min`.
    pub bytes_per_second_min: u64,
    /// `receive_stall_timeout_ms`: how far behind the rate a client may fall.
    pub stall_timeout: Duration,
}

impl PortLimits {
    /// Why a connection too slow for the minimum rate was closed.
    fn too_slow(&self) -> String {
        let rate = self
            .receive_rate
            .expect("only a port with a minimum rate finds a connection too slow");
        format!(
            "sent a request slower than {} bytes/s, falling more than {} ms behind (receive_bytes_per_second_min, receive_stall_timeout_ms)",
            rate.bytes_per_second_min,
            rate.stall_timeout.as_millis()
        )
    }
}

/// What a request's handler may know about its connection; tonic puts it in
/// every request's extensions.
#[derive(Clone)]
pub struct ConnectionInfo {
    pub remote_address: SocketAddr,
    /// The subject (common name, else the whole name) of the client
    /// certificate the TLS handshake verified; `None` without TLS or without
    /// a client certificate.
    pub client_subject: Option<String>,
    /// The node ids the verified client certificate names
    /// (`cairn_tls::certificate_node_ids`; empty for a client's certificate
    /// or none); `None` on a plaintext connection. The peer gate admits a
    /// peer message only from a node its certificate names.
    pub certified_node_ids: Option<Arc<[u64]>>,
    activity: Arc<Activity>,
}

/// Who the TLS handshake says the client is.
struct Certified {
    subject: Option<String>,
    node_ids: Arc<[u64]>,
}

/// Requests in flight on one connection, and since when there were none;
/// the slots its handlers hold against the per-connection budgets
/// (`crate::limits`); what the connection owes against the minimum receive
/// rate; and the signal that tells its server to send GOAWAY.
struct Activity {
    origin: Instant,
    in_flight: AtomicUsize,
    /// Held [`Slot`]s, by [`SlotKind`].
    slots: [AtomicUsize; 2],
    idle_since_ms: AtomicU64,
    /// `None` when the port has no minimum rate.
    receive: Option<Mutex<Receive>>,
    /// Notified once, when the connection has been idle past its timeout.
    go_away: Notify,
}

/// The receive meter of a connection, and the waker of the task reading it
/// (woken when a request body starts waiting, so that its deadline is armed).
struct Receive {
    meter: ReceiveMeter,
    reader: Option<Waker>,
}

impl Activity {
    fn new(receive_rate: Option<ReceiveRate>) -> Activity {
        let origin = Instant::now();
        Activity {
            origin,
            in_flight: AtomicUsize::new(0),
            slots: [AtomicUsize::new(0), AtomicUsize::new(0)],
            idle_since_ms: AtomicU64::new(0),
            receive: receive_rate.map(|rate| {
                Mutex::new(Receive {
                    meter: ReceiveMeter::new(rate.bytes_per_second_min, rate.stall_timeout, origin),
                    reader: None,
                })
            }),
            go_away: Notify::new(),
        }
    }

    fn begin(self: &Arc<Self>) -> RequestGuard {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        RequestGuard(self.clone())
    }

    /// When the connection last had no request in flight; `None` while one is.
    fn idle_since(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        Some(self.origin + Duration::from_millis(self.idle_since_ms.load(Ordering::SeqCst)))
    }

    /// A request body's handler starts or stops waiting for its bytes.
    fn body_waiting(&self, waiting: bool) {
        let Some(receive) = &self.receive else {
            return;
        };
        let mut receive = receive.lock();
        receive.meter.body_waiting(waiting, Instant::now());
        let reader = if waiting { receive.reader.take() } else { None };
        drop(receive);
        if let Some(reader) = reader {
            reader.wake();
        }
    }

    /// Whether the connection's port has a minimum receive rate.
    fn meters_receive(&self) -> bool {
        self.receive.is_some()
    }

    /// Under one lock: records `sent` (the bytes of request frames the client
    /// just sent, and whether its frames now owe), then `Err` when the
    /// connection is too slow; else when it will be if nothing more arrives
    /// (`None`: it owes nothing). Registers `reader` to be woken when a
    /// request body starts waiting.
    fn check_receive(
        &self,
        sent: Option<(u64, bool)>,
        reader: &Waker,
        now: Instant,
    ) -> Result<Option<Instant>, ()> {
        let Some(receive) = &self.receive else {
            return Ok(None);
        };
        let mut receive = receive.lock();
        if let Some((request_bytes, frames_owe)) = sent {
            receive.meter.received(request_bytes, frames_owe, now);
        }
        if !receive.reader.as_ref().is_some_and(|w| w.will_wake(reader)) {
            receive.reader = Some(reader.clone());
        }
        if receive.meter.exhausted(now) {
            return Err(());
        }
        Ok(receive.meter.deadline())
    }
}

/// What a per-connection budget counts (`crate::limits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotKind {
    /// A call whose handler has not answered yet.
    Request = 0,
    /// An open watch stream.
    Watch = 1,
}

/// One of a connection's budgeted slots; released when dropped.
pub struct Slot {
    activity: Arc<Activity>,
    kind: SlotKind,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let before = self.activity.slots[self.kind as usize].fetch_sub(1, Ordering::SeqCst);
        assert!(
            before > 0,
            "a connection's slot was released more often than taken"
        );
    }
}

impl ConnectionInfo {
    /// A connection's info as a plaintext connection from `remote_address`
    /// would carry it, for tests of what reads it.
    #[cfg(test)]
    pub(crate) fn for_tests(remote_address: SocketAddr) -> ConnectionInfo {
        ConnectionInfo {
            remote_address,
            client_subject: None,
            certified_node_ids: None,
            activity: Arc::new(Activity::new(None)),
        }
    }

    /// One slot of `kind` on this connection, if it holds fewer than `max`;
    /// otherwise `Err` with how many it holds.
    pub fn take_slot(&self, kind: SlotKind, max: usize) -> Result<Slot, usize> {
        let count = &self.activity.slots[kind as usize];
        count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                (held < max).then_some(held + 1)
            })
            .map(|_| Slot {
                activity: self.activity.clone(),
                kind,
            })
    }
}

/// One request in flight; dropped when its response body ends (or is dropped).
pub struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let elapsed_ms = u64::try_from(self.0.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        // The time first: whoever sees the count reach 0 sees it.
        self.0.idle_since_ms.store(elapsed_ms, Ordering::SeqCst);
        let before = self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        assert!(
            before > 0,
            "a request was uncounted more often than counted"
        );
    }
}

/// Rate-limited log lines about offending connections of one port.
struct OffenceLog {
    port: &'static str,
    lines: RateLimit,
}

impl OffenceLog {
    fn new(port: &'static str) -> OffenceLog {
        OffenceLog {
            port,
            lines: RateLimit::new(LOG_LINES_PER_SECOND, Duration::from_secs(1)),
        }
    }

    fn offending(&self, remote: SocketAddr, reason: &str, idle: bool) {
        let Some(suppressed) = self.lines.take() else {
            return;
        };
        if idle {
            tracing::info!(port = self.port, %remote, reason, suppressed, "idle connection closed");
        } else {
            tracing::warn!(
                port = self.port,
                %remote,
                reason,
                suppressed,
                "offending connection closed"
            );
        }
    }

    fn flush(&self) {
        if let Some(suppressed) = self.lines.flush() {
            tracing::warn!(
                port = self.port,
                suppressed,
                "offending connections closed without a line each (log rate limit)"
            );
        }
    }
}

/// The gRPC server of a port, with the node's HTTP/2 settings and
/// [`ActivityLayer`]; each connection is served by a clone of it.
pub type GrpcRouter =
    tonic::transport::server::Router<tower_layer::Stack<ActivityLayer, tower_layer::Identity>>;

/// Serves one port: accepts connections within its limits, puts each through
/// its handshake, and serves it with `router` until it closes, goes idle
/// (GOAWAY) or the node stops. Returns once `stopped` is set and every
/// connection task has ended.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Reloadable<ServerConfig>>,
    limits: PortLimits,
    router: GrpcRouter,
    mut stopped: watch::Receiver<bool>,
) {
    let router = Arc::new(router);
    let slots = Arc::new(Semaphore::new(limits.connections_max));
    let log = Arc::new(OffenceLog::new(limits.port));
    let mut flush = tokio::time::interval(Duration::from_secs(1));
    let exhaustion_lines = RateLimit::once_a_second();
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = stopped.wait_for(|s| *s) => break,
            _ = flush.tick() => {
                log.flush();
                continue;
            }
            Some(_) = connections.join_next() => continue,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, remote)) => {
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    drop(stream);
                    log.offending(
                        remote,
                        &format!(
                            "refused: the {} port already holds {} connections ({}_connections_max)",
                            limits.port, limits.connections_max, limits.port
                        ),
                        false,
                    );
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let config = tls.as_ref().map(Reloadable::current);
                connections.spawn(connection(
                    stream,
                    remote,
                    permit,
                    config,
                    limits.clone(),
                    log.clone(),
                    router.clone(),
                    stopped.clone(),
                ));
            }
            Err(e) if is_exhaustion(&e) => {
                if let Some(suppressed) = exhaustion_lines.take() {
                    tracing::error!(
                        port = limits.port,
                        error = %e,
                        suppressed,
                        "cannot accept connections (out of descriptors or memory); retrying"
                    );
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
            Err(e) => {
                // ECONNABORTED and the like: that connection is gone, the listener is not.
                tracing::debug!(port = limits.port, error = %e, "accept failed");
            }
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// Whether an accept error means the process (or system) is out of
/// descriptors or memory: back off, the listener is fine.
fn is_exhaustion(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// One accepted connection: its handshake, then its own tonic server, whose
/// shutdown (GOAWAY, then the requests in flight finish) comes when the
/// connection goes idle, the node stops, or the connection ends.
#[allow(clippy::too_many_arguments)]
async fn connection(
    stream: TcpStream,
    remote: SocketAddr,
    permit: OwnedSemaphorePermit,
    tls: Option<Arc<ServerConfig>>,
    limits: PortLimits,
    log: Arc<OffenceLog>,
    router: Arc<GrpcRouter>,
    mut stopped: watch::Receiver<bool>,
) {
    let (closed, mut connection_ended) = oneshot::channel::<()>();
    let connection = tokio::select! {
        _ = stopped.wait_for(|s| *s) => return,
        connection = handshake(stream, remote, permit, tls, limits, log, closed) => connection,
    };
    let Some(connection) = connection else {
        return;
    };
    let activity = connection.info.activity.clone();
    let shutdown = async move {
        tokio::select! {
            _ = activity.go_away.notified() => {}
            _ = stopped.wait_for(|s| *s) => {}
            _ = &mut connection_ended => {}
        }
    };
    // The connection, then nothing: tonic takes it and waits for `shutdown`.
    let incoming = futures::stream::once(std::future::ready(Ok::<_, io::Error>(connection)))
        .chain(futures::stream::pending());
    if let Err(e) = (*router)
        .clone()
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
    {
        tracing::debug!(%remote, error = %e, "serving a connection failed");
    }
}

/// The TLS handshake and the HTTP/2 preface, within the handshake deadline;
/// `None` (and one log line) when the connection failed them. `closed` is
/// dropped with the connection.
async fn handshake(
    stream: TcpStream,
    remote: SocketAddr,
    permit: OwnedSemaphorePermit,
    tls: Option<Arc<ServerConfig>>,
    limits: PortLimits,
    log: Arc<OffenceLog>,
    closed: oneshot::Sender<()>,
) -> Option<Connection> {
    let with_tls = tls.is_some();
    let (io, certified) =
        match tokio::time::timeout(limits.handshake_timeout, open(stream, tls)).await {
            Ok(Ok(opened)) => opened,
            Ok(Err(reason)) => {
                log.offending(remote, &reason, false);
                return None;
            }
            Err(_) => {
                log.offending(
                    remote,
                    &format!(
                        "did not finish {}the HTTP/2 preface within {} ms (handshake_timeout_ms)",
                        if with_tls {
                            "the TLS handshake and "
                        } else {
                            ""
                        },
                        limits.handshake_timeout.as_millis()
                    ),
                    false,
                );
                return None;
            }
        };
    let info = ConnectionInfo {
        remote_address: remote,
        client_subject: certified.as_ref().and_then(|c| c.subject.clone()),
        certified_node_ids: certified.map(|c| c.node_ids),
        activity: Arc::new(Activity::new(limits.receive_rate)),
    };
    Some(Connection {
        io,
        replayed: 0,
        frames: FrameTracker::default(),
        clock: Box::pin(tokio::time::sleep(Duration::ZERO)),
        armed: None,
        told_to_go_away: None,
        limits,
        info,
        log,
        _closed: closed,
        _permit: permit,
    })
}

/// TLS handshake (if any; then who the client certificate says the client
/// is), then the HTTP/2 preface.
async fn open(
    stream: TcpStream,
    tls: Option<Arc<ServerConfig>>,
) -> Result<(Io, Option<Certified>), String> {
    let (mut io, certified) = match tls {
        None => (Io::Plain(stream), None),
        Some(config) => {
            let stream = cairn_tls::tokio_rustls::TlsAcceptor::from(config)
                .accept(stream)
                .await
                .map_err(|e| format!("TLS handshake failed: {e}"))?;
            let leaf = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first());
            let certified = Certified {
                subject: leaf.and_then(cairn_tls::certificate_subject),
                node_ids: leaf
                    .map(cairn_tls::certificate_node_ids)
                    .unwrap_or_default()
                    .into(),
            };
            (Io::Tls(Box::new(stream)), Some(certified))
        }
    };
    read_preface(&mut io).await?;
    Ok((io, certified))
}

/// Reads the HTTP/2 preface, refusing at the first byte that differs.
async fn read_preface(io: &mut Io) -> Result<(), String> {
    let mut buffer = [0u8; HTTP2_PREFACE.len()];
    let mut filled = 0;
    while filled < buffer.len() {
        let n = io
            .read(&mut buffer[filled..])
            .await
            .map_err(|e| format!("read failed before the HTTP/2 preface: {e}"))?;
        if n == 0 {
            return Err(if filled == 0 {
                "closed without sending anything".to_string()
            } else {
                format!("closed after {filled} bytes of a truncated HTTP/2 preface")
            });
        }
        filled += n;
        if buffer[..filled] != HTTP2_PREFACE[..filled] {
            return Err(describe_garbage(&buffer[..filled]));
        }
    }
    Ok(())
}

/// What a connection sent instead of the HTTP/2 preface (non-empty).
pub fn describe_garbage(bytes: &[u8]) -> String {
    assert!(!bytes.is_empty(), "garbage is at least one byte");
    const METHODS: [&[u8]; 9] = [
        b"GET ",
        b"POST ",
        b"PUT ",
        b"HEAD ",
        b"DELETE ",
        b"OPTIONS ",
        b"PATCH ",
        b"CONNECT ",
        b"TRACE ",
    ];
    if bytes[0] == 0x16 {
        "sent a TLS handshake to a plaintext port".into()
    } else if METHODS
        .iter()
        .any(|m| bytes.starts_with(m) || m.starts_with(bytes))
        || bytes.starts_with(b"PRI * HTTP/1")
    {
        "sent an HTTP/1 request (this port speaks gRPC over HTTP/2 only)".into()
    } else {
        format!("sent {} bytes that are not an HTTP/2 preface", bytes.len())
    }
}

enum Io {
    Plain(TcpStream),
    Tls(Box<cairn_tls::tokio_rustls::server::TlsStream<TcpStream>>),
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// An accepted connection past its handshake, as tonic serves it. Replays
/// the preface already read; follows the client's frames for the minimum
/// receive rate; tells its server to go away once idle past the idle timeout;
/// and closes itself (a read error) when too slow, or when still open without
/// a request `handshake_timeout` after it was told to go away.
pub struct Connection {
    io: Io,
    /// Bytes of [`HTTP2_PREFACE`] handed to tonic so far.
    replayed: usize,
    frames: FrameTracker,
    /// Wakes the reading task at the next deadline (receive rate, idle timeout, going away).
    clock: Pin<Box<Sleep>>,
    /// The deadline `clock` is set to; `None` once it fired.
    armed: Option<Instant>,
    /// When the connection was told to go away (GOAWAY).
    told_to_go_away: Option<Instant>,
    limits: PortLimits,
    info: ConnectionInfo,
    log: Arc<OffenceLog>,
    /// Dropped with the connection: ends its server.
    _closed: oneshot::Sender<()>,
    _permit: OwnedSemaphorePermit,
}

/// The earlier of two optional deadlines.
fn earliest(a: Option<Instant>, b: Instant) -> Option<Instant> {
    Some(a.map_or(b, |a| a.min(b)))
}

impl Connection {
    /// Records what the client just `sent` (see [`Activity::check_receive`]),
    /// then applies the minimum receive rate and the idle timeout: `Err`
    /// closes the connection. Arms the clock for the next deadline.
    fn enforce(&mut self, cx: &mut Context<'_>, mut sent: Option<(u64, bool)>) -> io::Result<()> {
        let activity: &Activity = &self.info.activity;
        loop {
            let now = Instant::now();
            let Ok(mut next) = activity.check_receive(sent.take(), cx.waker(), now) else {
                self.log
                    .offending(self.info.remote_address, &self.limits.too_slow(), false);
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client sent its request too slowly",
                ));
            };
            if let Some(idle_timeout) = self.limits.idle_timeout {
                let idle_since = activity.idle_since();
                match self.told_to_go_away {
                    None => match idle_since {
                        Some(since) if since + idle_timeout <= now => {
                            self.log.offending(
                                self.info.remote_address,
                                &format!(
                                    "no request for {} ms (connection_idle_timeout_ms); sent GOAWAY",
                                    idle_timeout.as_millis()
                                ),
                                true,
                            );
                            self.told_to_go_away = Some(now);
                            activity.go_away.notify_one();
                            continue;
                        }
                        Some(since) => next = earliest(next, since + idle_timeout),
                        None => next = earliest(next, now + idle_timeout),
                    },
                    Some(told) => {
                        let grace = self.limits.handshake_timeout;
                        match idle_since {
                            Some(since) if since.max(told) + grace <= now => {
                                return Err(io::Error::new(
                                    io::ErrorKind::TimedOut,
                                    "told to go away, the connection stayed open without a request",
                                ));
                            }
                            Some(since) => next = earliest(next, since.max(told) + grace),
                            None => next = earliest(next, now + grace),
                        }
                    }
                }
            }
            let Some(at) = next else {
                return Ok(());
            };
            // Armed lazily: a later deadline waits for the earlier one to fire.
            if self.armed.is_none_or(|armed| at < armed) {
                self.clock.as_mut().reset(at);
                self.armed = Some(at);
            }
            if self.clock.as_mut().poll(cx).is_pending() {
                return Ok(());
            }
            self.armed = None;
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.replayed < HTTP2_PREFACE.len() {
            let rest = &HTTP2_PREFACE[this.replayed..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        let filled = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        // Frames are followed only where a minimum rate needs them.
        let sent = match polled {
            Poll::Ready(Ok(())) if this.info.activity.meters_receive() => {
                let request_bytes = this.frames.feed(&buf.filled()[filled..]);
                Some((request_bytes, this.frames.owes()))
            }
            _ => None,
        };
        if let Err(e) = this.enforce(cx, sent) {
            return Poll::Ready(Err(e));
        }
        polled
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    /// No, whatever the socket could ([`cairn_tls::WRITE_VECTORED`]): h2 then coalesces the
    /// small frames of every response ready into one `write`.
    fn is_write_vectored(&self) -> bool {
        cairn_tls::WRITE_VECTORED
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        self.info.clone()
    }
}

/// Counts each request in flight on its connection until its response body
/// ends (see the idle timeout), and tells the connection's receive meter
/// when the request's handler waits for more of its body (see `receive`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ActivityLayer;

impl<S> tower_layer::Layer<S> for ActivityLayer {
    type Service = ActivityService<S>;

    fn layer(&self, inner: S) -> ActivityService<S> {
        ActivityService { inner }
    }
}

#[derive(Debug, Clone)]
pub struct ActivityService<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ResponseBody> tower_service::Service<http::Request<tonic::body::Body>>
    for ActivityService<S>
where
    S: tower_service::Service<
        http::Request<tonic::body::Body>,
        Response = http::Response<ResponseBody>,
    >,
    S::Future: Send + 'static,
    ResponseBody: Send + 'static,
{
    type Response = http::Response<TrackedBody<ResponseBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let activity = request
            .extensions()
            .get::<ConnectionInfo>()
            .map(|info| info.activity.clone());
        let guard = activity.as_ref().map(|activity| activity.begin());
        let request = match activity {
            Some(activity) if activity.receive.is_some() => {
                let messages = cairn_proto::request_streaming_paths()
                    .contains(request.uri().path())
                    .then(GrpcMessages::default);
                request.map(|inner| {
                    tonic::body::Body::new(MeteredBody {
                        inner,
                        activity,
                        waiting: false,
                        messages,
                    })
                })
            }
            _ => request,
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|inner| TrackedBody {
                inner,
                _guard: guard,
            }))
        })
    }
}

/// A request body that tells its connection's receive meter while its
/// handler waits for bytes the client has not sent yet.
struct MeteredBody {
    inner: tonic::body::Body,
    activity: Arc<Activity>,
    /// The last poll found no bytes (the meter counts this body as waiting).
    waiting: bool,
    /// For a method whose requests are a stream: where the messages stand (waiting
    /// between two of them owes nothing once one has come whole).
    messages: Option<GrpcMessages>,
}

impl MeteredBody {
    fn set_waiting(&mut self, waiting: bool) {
        if self.waiting != waiting {
            self.waiting = waiting;
            self.activity.body_waiting(waiting);
        }
    }
}

impl http_body::Body for MeteredBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let (Some(messages), Poll::Ready(Some(Ok(frame)))) = (&mut this.messages, &polled) {
            if let Some(data) = frame.data_ref() {
                messages.feed(data);
            }
        }
        let owes = this.messages.as_ref().is_none_or(GrpcMessages::owes);
        this.set_waiting(polled.is_pending() && owes);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for MeteredBody {
    fn drop(&mut self) {
        self.set_waiting(false);
    }
}

/// A response body that keeps its request counted until it is dropped.
pub struct TrackedBody<B> {
    inner: B,
    _guard: Option<RequestGuard>,
}

impl<B: http_body::Body + Unpin> http_body::Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Raises the soft RLIMIT_NOFILE to the hard limit; returns the soft limit
/// in force afterwards.
pub fn raise_fd_limit() -> io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write/read the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let wanted = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) } == 0 {
            limit.rlim_cur = limit.rlim_max;
        }
    }
    Ok(limit.rlim_cur)
}

/// The connection limits that fit under `fd_limit` descriptors. A quarter
/// (at least 256) is reserved for the log store, snapshots, outgoing
/// connections and the connections being refused; if the configured limits
/// do not fit in the rest, both are scaled down in proportion (each at
/// least 1). Returns (client, peer, reserve).
pub fn connection_budget(fd_limit: u64, client: usize, peer: usize) -> (usize, usize, u64) {
    let reserve = (fd_limit / 4).max(256);
    let available = fd_limit.saturating_sub(reserve);
    let wanted = (client + peer) as u64;
    if wanted <= available {
        return (client, peer, reserve);
    }
    let scale = |n: usize| ((n as u64 * available / wanted) as usize).max(1);
    let (c, p) = (scale(client), scale(peer));
    assert!(
        (c + p) as u64 <= available.max(2),
        "scaled limits {c}+{p} exceed the {available} descriptors available"
    );
    (c, p, reserve)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_limits_leave_a_reserve_of_descriptors() {
        // Plenty of descriptors: the configured limits stand.
        assert_eq!(connection_budget(20_000, 2_048, 256), (2_048, 256, 5_000));
        // A 1024 limit: 256 reserved, the rest split in proportion.
        let (c, p, reserve) = connection_budget(1_024, 2_048, 256);
        assert_eq!(reserve, 256);
        assert!(c + p <= 768 && c > p && p >= 1, "{c} {p}");
        // Absurdly low: still at least one connection per port.
        let (c, p, _) = connection_budget(16, 10, 10);
        assert!(c >= 1 && p >= 1);
    }

    #[test]
    fn garbage_is_described_by_what_it_looks_like() {
        assert!(describe_garbage(b"GET / HTTP/1.1\r\n").contains("HTTP/1"));
        assert!(describe_garbage(b"PO").contains("HTTP/1"));
        assert!(describe_garbage(&[0x16, 3, 1]).contains("TLS handshake"));
        assert!(describe_garbage(&[0xde, 0xad]).contains("2 bytes"));
    }

    #[test]
    fn a_request_guard_marks_the_connection_busy_until_dropped() {
        let activity = Arc::new(Activity::new(None));
        assert!(activity.idle_since().is_some());
        let guard = activity.begin();
        let second = activity.begin();
        assert!(activity.idle_since().is_none());
        drop(guard);
        assert!(activity.idle_since().is_none());
        drop(second);
        assert!(activity.idle_since().is_some());
    }
}
