//! The connection layer against garbage, with a real `cairn` process and
//! real sockets: random bytes, an HTTP/1.1 request, a truncated HTTP/2
//! preface, a preface sent 1 byte at a time, an idle HTTP/2 connection,
//! 1,000 then 20,000 idle connections, and a 100 MiB message, on the client
//! and peer ports. Each time the node closes the offending connection, logs
//! it, keeps serving, and its descriptors and memory stay bounded.

mod support;

use std::time::{Duration, Instant};

use cairn_proto::v1::raft_service_client::RaftServiceClient;
use cairn_proto::v1::RaftMessage;
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
/// those counted in `suppressed=N` lines.
fn offences(log: &str, port: &str) -> u64 {
    let port_field = format!("port=\"{port}\"");
    log.lines()
        .filter(|l| l.contains(&port_field))
        .map(|l| {
            if l.contains("offending connection closed") {
                1
            } else if let Some(rest) = l.split("suppressed=").nth(1) {
                rest.split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0)
            } else {
                0
            }
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
    // resident memory is back within 200 MiB of where it started.
    let cluster = garbage_cluster(IDLE_TIMEOUT_MS);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
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
            cluster_id: String::new(),
            sender_node_id: 0,
            payload: bytes::Bytes::from(huge),
        })
        .await;
    assert!(
        refused.is_err(),
        "a 100 MiB Raft message of garbage must be refused"
    );

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
