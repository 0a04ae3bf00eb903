//! The connection layer against garbage, with a real `cairn` process and
//! real sockets: random bytes, an HTTP/1.1 request, a truncated HTTP/2
//! preface, a preface sent 1 byte at a time, an idle HTTP/2 connection,
//! 1,000 then 20,000 idle connections, and a 100 MiB message, on the client
//! and peer ports. Each time the node closes the offending connection, logs
//! it, keeps serving, and its descriptors and memory stay bounded.
//!
//! Then the minimum receive rate (requests dribbled 1 byte a second are
//! closed; an idle watch and a slow but steady restore upload are not) and
//! the graceful idle close (GOAWAY: a request racing the close is served).

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_proto::v1::admin_service_client::AdminServiceClient;
use cairn_proto::v1::raft_service_client::RaftServiceClient;
use cairn_proto::v1::RaftMessage;
use futures::StreamExt;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HANDSHAKE_TIMEOUT_MS: u64 = 1_500;
const IDLE_TIMEOUT_MS: u64 = 3_000;

fn garbage_cluster(idle_timeout_ms: u64) -> Cluster {
    let mut o = options(1);
    o.extra_args = vec![
        "--handshake-timeout-ms".to_string(),
        HANDSHAKE_TIMEOUT_MS.to_string(),
        "--connection-idle-timeout-ms".to_string(),
        idle_timeout_ms.to_string(),
    ];
    Cluster::start(o)
}

/// Offending connections of `port` the log tells of: one line each, plus
/// those counted as `suppressed=N` (in the next line logged, or in a line of their own).
fn offences(log: &str, port: &str) -> u64 {
    let port_field = format!("port=\"{port}\"");
    log.lines()
        .filter(|l| l.contains(&port_field))
        .map(|l| {
            let suppressed = l
                .split("suppressed=")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            u64::from(l.contains("offending connection closed")) + suppressed
        })
        .sum()
}

/// Whether the node closes `stream` within `timeout` (whatever it sends first).
async fn closed_by_node(stream: &mut TcpStream, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_every_port_is_closed_and_logged_and_the_node_keeps_serving() {
    // On both ports: random bytes and an HTTP/1.1 request are closed at
    // once; a truncated preface and a preface trickled 1 byte every 500 ms
    // meet the handshake deadline; a real HTTP/2 connection that sends no
    // request is closed by the idle timeout. Then the node still serves.
    let cluster = garbage_cluster(IDLE_TIMEOUT_MS);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let node = cluster.node(1);
    let quick = Duration::from_millis(1_000);
    let deadline = Duration::from_millis(HANDSHAKE_TIMEOUT_MS + 2_000);
    for (port, address) in [
        ("client", node.client_address.clone()),
        ("peer", node.peer_address.clone()),
    ] {
        let mut random = TcpStream::connect(&address).await.unwrap();
        let bytes: Vec<u8> = (0..64u8)
            .map(|i| i.wrapping_mul(97).wrapping_add(13))
            .collect();
        random.write_all(&bytes).await.unwrap();
        assert!(
            closed_by_node(&mut random, quick).await,
            "{port}: random bytes"
        );

        let mut http1 = TcpStream::connect(&address).await.unwrap();
        http1
            .write_all(b"GET / HTTP/1.1\r\nHost: cairn\r\n\r\n")
            .await
            .unwrap();
        assert!(closed_by_node(&mut http1, quick).await, "{port}: HTTP/1.1");

        let mut truncated = TcpStream::connect(&address).await.unwrap();
        truncated.write_all(&PREFACE[..10]).await.unwrap();
        let started = Instant::now();
        assert!(
            closed_by_node(&mut truncated, deadline).await,
            "{port}: truncated preface"
        );
        assert!(
            started.elapsed() >= Duration::from_millis(HANDSHAKE_TIMEOUT_MS / 2),
            "{port}: a truncated preface is closed by the deadline, not before"
        );

        let mut slow = TcpStream::connect(&address).await.unwrap();
        let started = Instant::now();
        let mut closed = false;
        for b in PREFACE {
            if slow.write_all(&[*b]).await.is_err()
                || closed_by_node(&mut slow, Duration::from_millis(500)).await
            {
                closed = true;
                break;
            }
        }
        assert!(
            closed && started.elapsed() < deadline,
            "{port}: a preface at 1 byte per 500 ms is closed by the deadline"
        );

        let mut idle = TcpStream::connect(&address).await.unwrap();
        // The preface and an empty SETTINGS frame: a valid, silent HTTP/2 client.
        idle.write_all(PREFACE).await.unwrap();
        idle.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
        assert!(
            !closed_by_node(&mut idle, Duration::from_millis(IDLE_TIMEOUT_MS / 2)).await,
            "{port}: a valid connection is not closed before the idle timeout"
        );
        assert!(
            closed_by_node(&mut idle, Duration::from_millis(IDLE_TIMEOUT_MS + 3_000)).await,
            "{port}: an idle connection is closed by the idle timeout"
        );
    }
    create_anywhere(&cluster, "still-serving", b"x", Duration::from_secs(10))
        .await
        .expect("the node keeps serving");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let log = cluster.log_of(1);
    for port in ["client", "peer"] {
        // random, HTTP/1.1, truncated, trickled.
        assert!(
            offences(&log, port) >= 4,
            "{port}: one line per offending connection; log:\n{log}"
        );
    }
    assert!(log.contains("HTTP/1 request"), "{log}");
    assert!(log.contains("handshake_timeout_ms"), "{log}");
    assert!(log.contains("idle connection closed"), "{log}");
    assert!(
        log.contains("serving PLAINTEXT"),
        "a plaintext node says so: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_mib_message_is_refused_on_both_ports_and_memory_stays_bounded() {
    // A 100 MiB write on the client port and a 100 MiB Raft message on the
    // peer port are refused; the node then serves a small write, and its
    // resident memory is back within 200 MiB of where it started. The peer
    // port's limit is set below the message (64 MiB), and the message's
    // envelope is valid (this cluster's id, a member as sender): only the
    // size limit can refuse it before the peer gate and the decoder see it.
    let scratch = tempfile::tempdir().unwrap();
    let config = scratch.path().join("cairn.toml");
    std::fs::write(&config, "peer_message_bytes_max = 67108864\n").unwrap();
    let mut o = options(1);
    o.extra_args = vec!["--config".into(), config.display().to_string()];
    let cluster = Cluster::start(o);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let cluster_id = cluster.status(1).await.expect("status").cluster_id;
    create_anywhere(&cluster, "warm-up", b"x", Duration::from_secs(10))
        .await
        .expect("write");
    let pid = cluster.node(1).pid().expect("running");
    let baseline = rss_bytes(pid);
    let node = cluster.node(1);
    let huge = vec![7u8; 100 * 1024 * 1024];

    let mut client = client(&node.client_address)
        .await
        .max_encoding_message_size(usize::MAX);
    let refused = client
        .write(cairn_proto::v1::WriteRequest {
            fence: None,
            resource: Some(thing("huge", "u1", "", &huge)),
        })
        .await;
    assert!(refused.is_err(), "a 100 MiB write must be refused");

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.peer_address))
        .unwrap()
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .unwrap();
    let refused = RaftServiceClient::new(channel)
        .max_encoding_message_size(usize::MAX)
        .append_entries(RaftMessage {
            cluster_id,
            sender_node_id: 1,
            payload: bytes::Bytes::from(huge),
            ..Default::default()
        })
        .await
        .expect_err("a 100 MiB Raft message must be refused");
    // Past the limit, the gate would admit the envelope and the decoder
    // refuse the payload as malformed (INVALID_ARGUMENT).
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");

    create_anywhere(&cluster, "after-huge", b"x", Duration::from_secs(10))
        .await
        .expect("the node keeps serving");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_bytes(pid);
    assert!(
        after < baseline + 200 * 1024 * 1024,
        "resident memory grew from {baseline} to {after} bytes"
    );
}

/// Opens `count` connections to `address` that send nothing. Connections
/// the node closes are reaped as it goes (so that this process stays under
/// its own descriptor limit); returns the ones still open, and the highest
/// descriptor count and resident memory of the node seen meanwhile.
async fn flood(address: &str, count: usize, pid: u32) -> (Vec<TcpStream>, usize, u64) {
    let mut open: Vec<TcpStream> = Vec::new();
    let (mut fds_max, mut rss_max) = (0usize, 0u64);
    for i in 0..count {
        let stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(address))
            .await
            .unwrap_or_else(|_| panic!("connection {i} timed out: the node stopped accepting"))
            .unwrap_or_else(|e| panic!("connection {i} failed: {e}"));
        open.push(stream);
        if i % 500 == 499 {
            let mut buf = [0u8; 16];
            // Still open = nothing to read yet; EOF or an error = the node closed it.
            open.retain(|s| {
                matches!(s.try_read(&mut buf), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock)
            });
            fds_max = fds_max.max(open_fds(pid));
            rss_max = rss_max.max(rss_bytes(pid));
        }
    }
    fds_max = fds_max.max(open_fds(pid));
    rss_max = rss_max.max(rss_bytes(pid));
    (open, fds_max, rss_max)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_then_twenty_thousand_idle_connections_are_bounded_and_closed() {
    // 1,000 connections that never send a byte, then 20,000 more (the
    // client port's default limit is 2,048). The node closes every one (by
    // the handshake deadline, or at once when over the limit), logs each,
    // keeps its descriptors under the limit and its memory bounded, and a
    // client connected before the flood keeps writing during it.
    let own_limit = raise_own_fd_limit();
    assert!(
        own_limit >= 4_096,
        "this test needs 4096 descriptors, has {own_limit}"
    );
    // The idle timeout is long here: the steady client waits through the
    // whole flood without a request, and this test is about the flood.
    let cluster = garbage_cluster(600_000);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let node = cluster.node(1);
    let pid = node.pid().expect("running");
    let mut steady = client(&node.client_address).await;
    let mut n = 0;
    let mut write = |name: String| {
        n += 1;
        let resource = thing(&name, "u1", "", b"x");
        let mut c = steady.clone();
        async move {
            c.write(cairn_proto::v1::WriteRequest {
                fence: None,
                resource: Some(resource),
            })
            .await
        }
    };
    write("before".into())
        .await
        .expect("write before the flood");
    let baseline = rss_bytes(pid);

    for (round, count) in [(1, 1_000usize), (2, 20_000)] {
        let (mut open, fds_max, rss_max) = flood(&node.client_address, count, pid).await;
        write(format!("during-{round}"))
            .await
            .unwrap_or_else(|e| panic!("round {round}: a connected client is still served: {e}"));
        assert!(
            fds_max <= 2_048 + 256,
            "round {round}: the node held {fds_max} descriptors (client_connections_max is 2048)"
        );
        assert!(
            rss_max < baseline + 200 * 1024 * 1024,
            "round {round}: resident memory grew from {baseline} to {rss_max} bytes"
        );
        let wait = Duration::from_millis(HANDSHAKE_TIMEOUT_MS + 5_000);
        for (i, s) in open.iter_mut().enumerate() {
            assert!(
                closed_by_node(s, wait).await,
                "round {round}: idle connection {i} was not closed by the node"
            );
        }
    }
    steady = client(&node.client_address).await;
    steady
        .write(cairn_proto::v1::WriteRequest {
            fence: None,
            resource: Some(thing("after", "u1", "", b"x")),
        })
        .await
        .expect("a new client is served after the flood");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let log = cluster.log_of(1);
    let told = offences(&log, "client");
    assert!(
        told >= 21_000,
        "every idle connection is logged or counted: {told} of 21000"
    );
}

// ------------------------------------------------- minimum receive rate

/// The stall timeout of the receive-rate tests (the rate is the default, 1024 bytes/s).
const STALL_TIMEOUT_MS: u64 = 2_000;

/// An HTTP/2 frame: header (length, type, flags, stream id) and payload.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut frame = vec![len[1], len[2], len[3], kind, flags];
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// The HEADERS frame of a gRPC call of `path` on stream 1: HPACK literals
/// without indexing or Huffman coding, the plainest encoding there is.
fn grpc_headers(path: &str, flags: u8) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "cairn"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        block.push(0);
        block.push(name.len() as u8);
        block.extend_from_slice(name.as_bytes());
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }
    h2_frame(HEADERS, flags, 1, &block)
}

/// The first bytes of every raw client: the preface and an empty SETTINGS frame.
fn h2_start() -> Vec<u8> {
    let mut start = PREFACE.to_vec();
    start.extend_from_slice(&h2_frame(4, 0, 0, &[]));
    start
}

/// A gRPC message frame holding an empty WriteRequest.
const EMPTY_GRPC_MESSAGE: [u8; 5] = [0, 0, 0, 0, 0];

const WRITE_PATH: &str = "/cairn.v1.ResourceService/Write";

/// Reads frames from `stream` until one of type `kind` arrives on stream 1
/// (true), or the connection closes or `timeout` passes (false).
async fn frame_arrives(stream: &mut TcpStream, kind: u8, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while buffer.len() >= 9 {
            let len = u32::from_be_bytes([0, buffer[0], buffer[1], buffer[2]]) as usize;
            if buffer.len() < 9 + len {
                break;
            }
            let stream_id = u32::from_be_bytes([buffer[5], buffer[6], buffer[7], buffer[8]]);
            if buffer[3] == kind && stream_id == 1 {
                return true;
            }
            buffer.drain(..9 + len);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buffer.extend_from_slice(&chunk[..n]),
            _ => return false,
        }
    }
}

/// Sends `prefix` at once, then `dribble` one piece a second, until the
/// node closes the connection; returns how long after the first dribbled
/// piece that was, or `None` if it never closed within `limit`.
async fn dribble(
    address: &str,
    prefix: Vec<u8>,
    dribble: Vec<Vec<u8>>,
    limit: Duration,
) -> Option<Duration> {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(&prefix).await.unwrap();
    let started = Instant::now();
    for piece in dribble {
        if started.elapsed() > limit {
            return None;
        }
        if stream.write_all(&piece).await.is_err()
            || closed_by_node(&mut stream, Duration::from_secs(1)).await
        {
            return Some(started.elapsed());
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_dribbled_at_one_byte_a_second_are_closed_while_a_watch_and_other_clients_are_served(
) {
    // receive_stall_timeout_ms = 2000, at the default 1024 bytes/s. Three
    // slow clients begin a Write and then send 1 byte a second: its HEADERS
    // frame; a DATA frame's payload; one-byte DATA frames (each frame whole,
    // so only the waiting request body owes). Each is closed within the
    // bound (and not at once, as a protocol error would be), with one log
    // line each. Meanwhile a watch opened before them, on which nothing
    // moves either way (its client sends nothing, and no write matches it),
    // stays open and then receives the next matching write; another client
    // writes all along. The same raw request sent at full speed is
    // answered: the slow ones are refused for their pace, not their bytes.
    let mut o = options(1);
    o.extra_args = vec![
        "--receive-stall-timeout-ms".into(),
        STALL_TIMEOUT_MS.to_string(),
        "--connection-idle-timeout-ms".into(),
        "600000".into(),
    ];
    let cluster = Cluster::start(o);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let address = cluster.node(1).client_address.clone();

    let mut watcher = client(&address).await;
    let mut watch = watcher
        .watch_list(cairn_proto::v1::WatchListRequest {
            r#type: Some(thing_type()),
            tenancy: Some(tenancy()),
            name_prefix: "watched-".into(),
            start_revision: 0,
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    let first = watch.message().await.expect("event").expect("open");
    assert!(
        matches!(
            first.event,
            Some(cairn_proto::v1::watch_event::Event::EndOfSnapshot(_))
        ),
        "{first:?}"
    );

    let mut fast = TcpStream::connect(&address).await.unwrap();
    let mut request = h2_start();
    request.extend_from_slice(&grpc_headers(WRITE_PATH, END_HEADERS));
    request.extend_from_slice(&h2_frame(DATA, END_STREAM, 1, &EMPTY_GRPC_MESSAGE));
    fast.write_all(&request).await.unwrap();
    assert!(
        frame_arrives(&mut fast, HEADERS, Duration::from_secs(5)).await,
        "the raw request at full speed is answered"
    );

    let headers = grpc_headers(WRITE_PATH, END_HEADERS);
    // A 64-byte message (its content never matters: it never arrives).
    let mut message = vec![0, 0, 0, 0, 64];
    message.extend_from_slice(&[0u8; 64]);
    let data = h2_frame(DATA, END_STREAM, 1, &message);
    let mut headers_whole = h2_start();
    headers_whole.extend_from_slice(&headers);
    let mut data_header_whole = headers_whole.clone();
    data_header_whole.extend_from_slice(&data[..9]);
    let slow_clients = [
        (
            "HEADERS byte by byte",
            h2_start(),
            headers.iter().map(|b| vec![*b]).collect::<Vec<_>>(),
        ),
        (
            "a DATA payload byte by byte",
            data_header_whole,
            data[9..].iter().map(|b| vec![*b]).collect(),
        ),
        (
            "one-byte DATA frames",
            headers_whole,
            (0..30).map(|_| h2_frame(DATA, 0, 1, &[0])).collect(),
        ),
    ];
    let limit = Duration::from_millis(STALL_TIMEOUT_MS + 3_000);
    let mut slow = Vec::new();
    for (name, prefix, pieces) in slow_clients {
        let address = address.clone();
        slow.push((
            name,
            tokio::spawn(async move { dribble(&address, prefix, pieces, limit).await }),
        ));
    }
    let mut writer = client(&address).await;
    let mut written = 0;
    let started = Instant::now();
    // Past the bound: each slow client is closed by then, or never will be.
    while started.elapsed() < limit {
        writer
            .write(cairn_proto::v1::WriteRequest {
                fence: None,
                resource: Some(thing(&format!("steady-{written}"), "u1", "", b"x")),
            })
            .await
            .expect("another client is served meanwhile");
        written += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for (name, task) in slow {
        let closed_after = task.await.unwrap();
        match closed_after {
            Some(after) => assert!(
                after >= Duration::from_millis(STALL_TIMEOUT_MS / 2),
                "{name}: closed after {after:?}, before the stall timeout could pass"
            ),
            None => panic!("{name}: not closed within {limit:?}"),
        }
    }

    // The watch, silent all along, is still served.
    writer
        .write(cairn_proto::v1::WriteRequest {
            fence: None,
            resource: Some(thing("watched-1", "u1", "", b"x")),
        })
        .await
        .expect("write");
    let event = tokio::time::timeout(Duration::from_secs(5), watch.message())
        .await
        .expect("the watch is still served")
        .expect("no error")
        .expect("open");
    assert!(
        matches!(
            event.event,
            Some(cairn_proto::v1::watch_event::Event::Upsert(_))
        ),
        "{event:?}"
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let log = cluster.log_of(1);
    let lines = log
        .lines()
        .filter(|l| l.contains("receive_bytes_per_second_min"))
        .count();
    assert_eq!(lines, 3, "one line per slow connection:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_but_steady_restore_upload_is_not_cut() {
    // receive_stall_timeout_ms = 2000 at 1024 bytes/s. A restore upload is a
    // long client stream: sent at 4 KiB/s (512 bytes every 125 ms) for
    // several stall timeouts, it completes.
    let mut o = options(1);
    o.extra_args = vec![
        "--receive-stall-timeout-ms".into(),
        STALL_TIMEOUT_MS.to_string(),
    ];
    let cluster = Cluster::start(o);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let address = cluster.node(1).client_address.clone();
    for i in 0..24 {
        create_anywhere(
            &cluster,
            &format!("r{i}"),
            &[7u8; 1024],
            Duration::from_secs(10),
        )
        .await
        .expect("write");
    }
    let mut admin = AdminServiceClient::connect(format!("http://{address}"))
        .await
        .unwrap();
    let mut saved = admin
        .save_snapshot(cairn_proto::v1::SaveSnapshotRequest {})
        .await
        .expect("save")
        .into_inner();
    let mut bytes = Vec::new();
    while let Some(chunk) = saved.message().await.expect("chunk") {
        bytes.extend_from_slice(&chunk.data);
    }
    assert!(bytes.len() >= 20 * 1024, "a {}-byte snapshot", bytes.len());
    let pieces: Vec<Vec<u8>> = bytes.chunks(512).map(<[u8]>::to_vec).collect();
    let upload = futures::stream::iter(pieces).then(|data| async move {
        tokio::time::sleep(Duration::from_millis(125)).await;
        cairn_proto::v1::SnapshotChunk { data: data.into() }
    });
    let started = Instant::now();
    let restored = admin
        .restore_snapshot(upload)
        .await
        .expect("a steady upload completes")
        .into_inner();
    assert_eq!(restored.resource_count, 24);
    assert!(
        started.elapsed() >= Duration::from_millis(2 * STALL_TIMEOUT_MS),
        "the upload lasted {:?}, longer than the stall timeout",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_streams_that_go_quiet_between_messages_are_not_cut() {
    // receive_stall_timeout_ms = 2000 at 1024 bytes/s. A method whose requests are a stream
    // of messages waits between two of them for as long as its client has nothing to say:
    // lease keep-alives 3 s apart on one KeepAlive stream are each answered on it, and the
    // leader's AppendEntries streams, which carry a heartbeat only every 500 ms (far under
    // the minimum rate), keep their peer connections. Inside a message, and before the
    // first, the client owes as for any request (the dribble test above).
    let mut o = options(3);
    o.extra_args = vec![
        "--receive-stall-timeout-ms".into(),
        STALL_TIMEOUT_MS.to_string(),
        "--heartbeat-interval-ms".into(),
        "500".into(),
    ];
    o.election_timeout_ms = 3_000;
    let cluster = Cluster::start(o);
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let address = cluster.node(leader).client_address.clone();
    let id = grant_lease(&address, 30_000).await;
    let (requests, mut answers) = keep_alive_stream(&address).await;
    for round in 0..4 {
        requests
            .send(cairn_proto::v1::LeaseKeepAliveRequest { id })
            .await
            .unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(5), answers.message())
            .await
            .unwrap_or_else(|_| panic!("round {round}: no answer within 5 s"))
            .unwrap_or_else(|status| panic!("round {round}: the stream was cut: {status:?}"))
            .unwrap_or_else(|| panic!("round {round}: the stream ended"));
        assert_eq!(answer.id, id);
        assert!(answer.ttl_ms > 0, "round {round}: the lease lives");
        tokio::time::sleep(Duration::from_millis(STALL_TIMEOUT_MS + 1_000)).await;
    }
    for node in 1..=3 {
        let log = cluster.log_of(node);
        assert!(
            !log.contains("slower than"),
            "node {node} closed a connection as too slow:\n{log}"
        );
    }
}

// ------------------------------------------------- graceful idle close

/// A TCP proxy whose server-to-client direction is `delay` late, as over a
/// slow link; counts the connections it accepts.
struct DelayProxy {
    address: String,
    accepted: Arc<AtomicUsize>,
}

async fn delay_proxy(upstream: String, delay: Duration) -> DelayProxy {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            count.fetch_add(1, Ordering::SeqCst);
            let server = TcpStream::connect(&upstream).await.unwrap();
            let (mut client_read, client_write) = client.into_split();
            let (server_read, mut server_write) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                let _ = server_write.shutdown().await;
            });
            tokio::spawn(delayed_copy(server_read, client_write, delay));
        }
    });
    DelayProxy { address, accepted }
}

/// Copies `from` to `to`, each chunk (and the end) `delay` after it was read.
async fn delayed_copy(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (sender, mut receiver) =
        tokio::sync::mpsc::unbounded_channel::<(Instant, Option<Vec<u8>>)>();
    tokio::spawn(async move {
        while let Some((at, chunk)) = receiver.recv().await {
            tokio::time::sleep_until(at.into()).await;
            match chunk {
                Some(bytes) if to.write_all(&bytes).await.is_ok() => {}
                _ => {
                    let _ = to.shutdown().await;
                    return;
                }
            }
        }
    });
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let chunk = match from.read(&mut buffer).await {
            Ok(n) if n > 0 => Some(buffer[..n].to_vec()),
            _ => None,
        };
        let end = chunk.is_none();
        let _ = sender.send((Instant::now() + delay, chunk));
        if end {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_with_goaway_and_a_request_racing_the_close_is_served() {
    // connection_idle_timeout_ms = 2000, and a client whose link delays what
    // the node sends by 2 s. The client's last request ends; 2 s later (by
    // the node's clock) the node closes the idle connection — and the client,
    // not having seen that yet, sends a request, which reaches the node 1 s
    // after the close began. Closed the HTTP/2 way (GOAWAY, then the requests
    // the client sent before it saw it are served), that request succeeds; a
    // connection just dropped would lose it. The next request goes over a
    // new connection: the old one was closed.
    const IDLE_MS: u64 = 2_000;
    const DELAY: Duration = Duration::from_secs(2);
    let mut o = options(1);
    o.extra_args = vec!["--connection-idle-timeout-ms".into(), IDLE_MS.to_string()];
    let cluster = Cluster::start(o);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let proxy = delay_proxy(cluster.node(1).client_address.clone(), DELAY).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", proxy.address))
        .unwrap()
        .timeout(Duration::from_secs(30))
        .connect_lazy();
    let mut c = cairn_proto::v1::resource_service_client::ResourceServiceClient::new(channel);
    let write = |name: &str| cairn_proto::v1::WriteRequest {
        fence: None,
        resource: Some(thing(name, "u1", "", b"x")),
    };
    c.write(write("warm-up")).await.expect("first request");
    // The node saw the request end about DELAY before the client did; it
    // sends GOAWAY at IDLE_MS after that, which the client sees DELAY later.
    // Halfway between: the request leaves after the GOAWAY left the node,
    // before the client sees it.
    let done = Instant::now();
    tokio::time::sleep(Duration::from_millis(IDLE_MS) - DELAY / 2).await;
    let raced = c.write(write("racing-the-close")).await;
    let raced_at = done.elapsed();
    raced.unwrap_or_else(|e| {
        panic!("the request racing the idle close failed ({raced_at:?} after the first): {e}")
    });
    assert_eq!(
        proxy.accepted.load(Ordering::SeqCst),
        1,
        "served on the old connection"
    );

    tokio::time::sleep(DELAY * 2).await;
    c.write(write("after-the-close"))
        .await
        .expect("a later request");
    assert_eq!(
        proxy.accepted.load(Ordering::SeqCst),
        2,
        "the old connection was closed, the channel reconnected"
    );
    let log = cluster.log_of(1);
    assert!(
        log.contains("idle connection closed") && log.contains("sent GOAWAY"),
        "{log}"
    );
}
