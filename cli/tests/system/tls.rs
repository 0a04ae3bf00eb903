//! TLS end to end, with real `cairn` processes and certificates written by
//! `cairn tls init`: a client without the cluster's CA is refused; a peer
//! holding a certificate from another CA cannot join, vote or forward; a
//! certificate from the cluster's CA speaks on the peer port only for the
//! node it names; the cluster keeps serving while its certificates are
//! replaced and reloaded.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_client::{ClientError, TlsOptions};
use cairn_proto::v1::forwarding_service_client::ForwardingServiceClient;
use cairn_proto::v1::raft_service_client::RaftServiceClient;
use cairn_proto::v1::{Consistency, RaftMessage, ReadRequest, WriteRequest};
use cairn_tls::{ClientFiles, ClientTls};
use support::*;
use tonic::transport::Endpoint;

/// Connects to a peer port over TLS with the node certificate `cert`/`key`,
/// trusting `ca`; `Err` = refused (in the handshake or at the first call).
async fn peer_channel(
    peer_address: &str,
    ca: &Path,
    cert: &Path,
    key: &Path,
) -> Result<tonic::transport::Channel, String> {
    let tls = ClientTls::from_files(&ClientFiles {
        ca_file: Some(ca.to_path_buf()),
        cert_file: Some(cert.to_path_buf()),
        key_file: Some(key.to_path_buf()),
    })
    .map_err(|e| e.to_string())?;
    let endpoint = Endpoint::from_shared(format!("http://{peer_address}"))
        .expect("uri")
        .timeout(Duration::from_secs(5));
    cairn_tls::connect_channel(endpoint, Some(&tls), Duration::from_secs(2))
        .await
        .map_err(|e| format!("{e:?}"))
}

/// Whether a status is the node's own answer (a handler ran), as opposed to
/// a connection that failed before any handler saw the request.
fn answered_by_a_handler(status: &tonic::Status) -> bool {
    // A refused handshake surfaces as the connection failing or closing.
    !matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
    ) && std::error::Error::source(status).is_none()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_the_cluster_ca_is_refused() {
    // A TLS cluster; a client with the CA writes; a client that trusts only
    // the system's CAs, and a plaintext client, are refused, and the node
    // logs each refused handshake.
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("tls");
    tls_init(&dir, &[]);
    let cluster = tls_cluster(&dir, 3, &[]);
    cluster.wait_for_leader(Duration::from_secs(20)).await;

    let trusted = tls_client(&cluster, Some(client_tls(&dir)), Duration::from_secs(10));
    trusted
        .write(thing("hello", "u1", "", b"x"))
        .await
        .expect("a client with the CA writes");

    let untrusted = tls_client(
        &cluster,
        Some(TlsOptions {
            ca_file: None,
            cert_file: None,
            key_file: None,
        }),
        Duration::from_secs(2),
    );
    match untrusted.read(id("hello", ""), Consistency::Eventual).await {
        Err(ClientError::DeadlineExceeded { detail, .. }) => {
            assert!(detail.contains("certificate"), "{detail}")
        }
        other => panic!("a client without the CA must be refused, got {other:?}"),
    }

    let plaintext = tls_client(&cluster, None, Duration::from_secs(2));
    let result = plaintext.read(id("hello", ""), Consistency::Eventual).await;
    assert!(
        result.is_err(),
        "a plaintext client must be refused: {result:?}"
    );

    let log = cluster.log_of(1) + &cluster.log_of(2) + &cluster.log_of(3);
    assert!(
        log.contains("offending connection closed") && log.contains("TLS handshake failed"),
        "the nodes log the refused handshakes; logs in {}",
        cluster.root().display()
    );
    assert!(
        !log.contains("serving PLAINTEXT"),
        "a TLS node does not claim plaintext"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_a_certificate_from_another_ca_cannot_join_vote_or_forward() {
    // Cluster CA `a`; an impostor holds node certificates from CA `b`. On
    // the peer port the impostor is refused before any handler runs (no
    // Vote, no forwarded read), while a holder of an `a` certificate reaches
    // the handlers (the control that shows the test can tell). A node with a
    // `b` certificate that tries to join never becomes a member.
    let scratch = tempfile::tempdir().unwrap();
    let a = scratch.path().join("a");
    let b = scratch.path().join("b");
    tls_init(&a, &[]);
    tls_init(&b, &["--nodes", "4"]);
    let cluster = tls_cluster(&a, 3, &[]);
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let peer = cluster.node(leader).peer_address.clone();
    let term_before = cluster.status(leader).await.expect("status").term;

    let vote = RaftMessage {
        cluster_id: String::new(),
        sender_node_id: 2,
        payload: bytes::Bytes::from_static(b"not a vote"),
        ..Default::default()
    };
    let read = ReadRequest {
        id: Some(id("nothing-here", "")),
        consistency: Consistency::Eventual as i32,
        revision: 0,
    };

    // Control: a certificate from the cluster's CA reaches the handlers.
    let member = peer_channel(
        &peer,
        &a.join("ca.pem"),
        &a.join("node-2.pem"),
        &a.join("node-2-key.pem"),
    )
    .await
    .expect("a member connects");
    let status = RaftServiceClient::new(member.clone())
        .vote(vote.clone())
        .await
        .expect_err("a garbage vote is refused by the handler");
    assert!(answered_by_a_handler(&status), "{status:?}");
    let status = ForwardingServiceClient::new(member)
        .read(read.clone())
        .await
        .expect_err("a forwarded read without the peer gate's metadata is refused");
    // Past TLS, the peer gate answers: the request names no cluster id.
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(answered_by_a_handler(&status), "{status:?}");

    // The impostor: refused in the handshake, or at its first call.
    let impostor = peer_channel(
        &peer,
        &a.join("ca.pem"),
        &b.join("node-4.pem"),
        &b.join("node-4-key.pem"),
    )
    .await;
    if let Ok(channel) = impostor {
        let status = RaftServiceClient::new(channel.clone())
            .vote(vote)
            .await
            .expect_err("an impostor's vote must not reach the handler");
        assert!(!answered_by_a_handler(&status), "{status:?}");
        let status = ForwardingServiceClient::new(channel)
            .read(read)
            .await
            .expect_err("an impostor's forwarded read must not reach the handler");
        assert!(!answered_by_a_handler(&status), "{status:?}");
    }

    // A node with a `b` certificate (trusting `a`, so only its own
    // certificate is wrong) tries to join through the leader's client port:
    // the client port refuses its certificate in the handshake, so its join
    // fails there, before any peer traffic. (A certificate of the cluster's
    // own CA claiming another node is refused by the peer gate: see
    // `a_certificate_from_the_cluster_ca_speaks_only_for_the_node_it_names`.)
    let data = scratch.path().join("impostor-data");
    let log_path = scratch.path().join("impostor.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut impostor = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["agent", "--node-id", "4", "--data-dir"])
        .arg(&data)
        .args([
            "--client-address",
            &format!("127.0.0.1:{}", jepsen_tests::cluster::free_port()),
            "--peer-address",
            &format!("127.0.0.1:{}", jepsen_tests::cluster::free_port()),
            "--join",
            &cluster.node(leader).client_address,
            "--tls-client-auth",
            "required",
            "--log-level",
            "info",
        ])
        .arg("--tls-cert-file")
        .arg(b.join("node-4.pem"))
        .arg("--tls-key-file")
        .arg(b.join("node-4-key.pem"))
        .arg("--tls-ca-file")
        .arg(a.join("ca.pem"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start the impostor");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut failed = false;
    while Instant::now() < deadline {
        if std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .contains("joining the cluster through")
        {
            failed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = impostor.kill();
    let _ = impostor.wait();
    assert!(
        failed,
        "the impostor's join must fail: {}",
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
    let status = cluster.status(leader).await.expect("status");
    let ids: Vec<u64> = status.members.iter().map(|m| m.id).collect();
    assert_eq!(ids, vec![1, 2, 3], "the impostor is no member");
    assert_eq!(status.leader_id, leader, "the cluster keeps its leader");
    assert_eq!(status.term, term_before, "no election was forced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_the_cluster_ca_speaks_only_for_the_node_it_names() {
    // On the peer port, the cluster CA's client certificate (`client.pem`)
    // cannot claim a member's id, for a Raft message or a forwarded write,
    // and node A's certificate cannot claim node B. Each envelope is
    // otherwise admissible (this cluster's id, a member's id), so only the
    // check of the certificate against the sender can refuse it.
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("tls");
    tls_init(&dir, &[]);
    let cluster = tls_cluster(&dir, 3, &[]);
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let cluster_id = cluster.status(leader).await.expect("status").cluster_id;
    let peer = cluster.node(leader).peer_address.clone();
    let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let (a, b) = (others[0], others[1]);
    let vote_from = |sender: u64| RaftMessage {
        cluster_id: cluster_id.clone(),
        sender_node_id: sender,
        payload: bytes::Bytes::from_static(b"not a vote"),
        ..Default::default()
    };
    let ca = dir.join("ca.pem");
    let node_a = peer_channel(
        &peer,
        &ca,
        &dir.join(format!("node-{a}.pem")),
        &dir.join(format!("node-{a}-key.pem")),
    )
    .await
    .expect("node A connects");

    // Control: node A's certificate claiming node A passes the gate; its
    // garbage payload is refused after it, as malformed.
    let status = RaftServiceClient::new(node_a.clone())
        .vote(vote_from(a))
        .await
        .expect_err("a garbage vote is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");

    // Node A's certificate claiming node B.
    let status = RaftServiceClient::new(node_a)
        .vote(vote_from(b))
        .await
        .expect_err("node A cannot speak for node B");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains(&format!("names node {a}"))
            && status.message().contains(&format!("cairn-node-{b}")),
        "{status:?}"
    );

    // The client certificate passes the handshake (same CA) but speaks for no node.
    let client = peer_channel(
        &peer,
        &ca,
        &dir.join("client.pem"),
        &dir.join("client-key.pem"),
    )
    .await
    .expect("the cluster CA's client certificate passes the handshake");
    let status = RaftServiceClient::new(client.clone())
        .vote(vote_from(a))
        .await
        .expect_err("a client certificate cannot send a Raft message");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("names no node"), "{status:?}");

    let mut forged = tonic::Request::new(WriteRequest {
        fence: None,
        resource: Some(thing("forged", "u1", "", b"x")),
    });
    forged
        .metadata_mut()
        .insert("cairn-cluster-id", cluster_id.parse().unwrap());
    forged
        .metadata_mut()
        .insert("cairn-node-id", a.to_string().parse().unwrap());
    let status = ForwardingServiceClient::new(client)
        .write(forged)
        .await
        .expect_err("a client certificate cannot forward a write");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("names no node"), "{status:?}");
    let trusted = tls_client(&cluster, Some(client_tls(&dir)), Duration::from_secs(10));
    match trusted.read(id("forged", ""), Consistency::Strong).await {
        Err(ClientError::NotFound) => {}
        other => panic!("the forged write must not be applied: {other:?}"),
    }
    let log = cluster.log_of(leader);
    assert!(
        log.contains("refused a raft message") && log.contains("refused a forwarded request"),
        "the leader logs the refusals; logs in {}",
        cluster.root().display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_separate_client_ca_nodes_still_call_each_others_client_ports() {
    // The client port requires client certificates from another CA than the
    // cluster's. Nodes call each other's client ports with their node
    // certificates: the start-up membership check still reaches the members
    // (a wiped member is refused, not started as an empty voter), and a new
    // node joins.
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("tls");
    let clients = scratch.path().join("clients");
    tls_init(&dir, &["--nodes", "4"]);
    tls_init(&clients, &["--nodes", "1"]);
    let client_files = TlsOptions {
        ca_file: Some(dir.join("ca.pem")),
        cert_file: Some(clients.join("client.pem")),
        key_file: Some(clients.join("client-key.pem")),
    };
    let mut o = options(3);
    o.extra_args = tls_args(&dir);
    o.extra_args.extend([
        "--tls-client-ca-file".to_string(),
        clients.join("ca.pem").display().to_string(),
        "--tls-client-auth".to_string(),
        "required".to_string(),
    ]);
    o.client_tls = Some(client_files.clone());
    let mut cluster = Cluster::start(o);
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let client = tls_client(&cluster, Some(client_files), Duration::from_secs(10));
    for i in 0..3 {
        client
            .write(thing(&format!("c{i}"), "u1", "", b"x"))
            .await
            .expect("a client with the client CA's certificate writes");
    }

    let wiped = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    cluster.kill(wiped);
    std::fs::remove_dir_all(&cluster.node(wiped).data_dir).unwrap();
    cluster.spawn(wiped);
    let status = cluster.wait_exit(wiped, Duration::from_secs(30));
    let log = cluster.log_of(wiped);
    assert!(
        status.is_some() && log.contains("already a member"),
        "the wiped member reaches the others' client ports and is refused: {log}"
    );

    let via = cluster.node(leader).client_address.clone();
    let joined = cluster.add_joining_node(&via);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let members = cluster
            .status(leader)
            .await
            .map(|s| s.members)
            .unwrap_or_default();
        if members.iter().any(|m| m.id == joined) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node {joined} did not join: {}",
            cluster.log_of(joined)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_keeps_serving_through_a_certificate_reload() {
    // Writes run all along while every node certificate is re-issued in
    // place and each node gets SIGHUP (file polling is off, so SIGHUP alone
    // must do it). New connections to both ports then see the new
    // certificates, and a new client (with the new client certificate)
    // writes. No write fails at any point.
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("tls");
    tls_init(&dir, &[]);
    let cluster = tls_cluster(&dir, 3, &["--tls-reload-interval-ms", "0"]);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let node_files = |id: u64| ClientFiles {
        ca_file: Some(dir.join("ca.pem")),
        cert_file: Some(dir.join(format!("node-{id}.pem"))),
        key_file: Some(dir.join(format!("node-{id}-key.pem"))),
    };
    let client_files = ClientFiles {
        ca_file: Some(dir.join("ca.pem")),
        cert_file: Some(dir.join("client.pem")),
        key_file: Some(dir.join("client-key.pem")),
    };
    let old: Vec<Vec<u8>> = (1..=3)
        .map(|id| first_certificate(&dir.join(format!("node-{id}.pem"))))
        .collect();
    assert_eq!(
        served_certificate(&cluster.node(1).client_address, &client_files).await,
        old[0]
    );

    let writer_client = tls_client(&cluster, Some(client_tls(&dir)), Duration::from_secs(10));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut written = 0u32;
            let mut failures = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match writer_client
                    .write(thing(&format!("w{written}"), "u1", "", b"x"))
                    .await
                {
                    Ok(_) => written += 1,
                    Err(e) => failures.push(e.to_string()),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (written, failures)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;

    tls_init(&dir, &["--force"]);
    let new: Vec<Vec<u8>> = (1..=3)
        .map(|id| first_certificate(&dir.join(format!("node-{id}.pem"))))
        .collect();
    assert_ne!(old, new, "tls init --force re-issued the node certificates");
    for id in 1..=3u64 {
        sighup(&cluster, id);
    }
    for id in 1..=3u64 {
        let node = cluster.node(id);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let client_port = served_certificate(&node.client_address, &client_files).await;
            let peer_port = served_certificate(&node.peer_address, &node_files(id)).await;
            if client_port == new[id as usize - 1] && peer_port == new[id as usize - 1] {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} still serves its old certificate after SIGHUP; logs in {}",
                cluster.root().display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (written, failures) = writer.await.unwrap();
    assert!(
        failures.is_empty(),
        "writes failed during the reload: {failures:?}"
    );
    assert!(written > 10, "the writer kept writing ({written} writes)");

    let fresh = tls_client(&cluster, Some(client_tls(&dir)), Duration::from_secs(10));
    fresh
        .write(thing("after-reload", "u1", "", b"y"))
        .await
        .expect("a new client with the new client certificate writes");
    assert!(cluster.log_of(1).contains("TLS certificates reloaded"));
}

#[test]
fn tls_init_keeps_the_ca_and_existing_certificates_unless_forced() {
    // Running it again adds what is missing and keeps the rest; --force
    // re-issues the leaves from the same CA; the CA is never replaced.
    let scratch = tempfile::tempdir().unwrap();
    let dir: PathBuf = scratch.path().join("tls");
    tls_init(&dir, &["--nodes", "1"]);
    let ca = std::fs::read(dir.join("ca.pem")).unwrap();
    let node1 = std::fs::read(dir.join("node-1.pem")).unwrap();
    tls_init(&dir, &["--nodes", "2"]);
    assert_eq!(std::fs::read(dir.join("ca.pem")).unwrap(), ca);
    assert_eq!(std::fs::read(dir.join("node-1.pem")).unwrap(), node1);
    assert!(dir.join("node-2.pem").exists());
    tls_init(&dir, &["--nodes", "2", "--force"]);
    assert_eq!(std::fs::read(dir.join("ca.pem")).unwrap(), ca);
    assert_ne!(std::fs::read(dir.join("node-1.pem")).unwrap(), node1);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(dir.join("node-1-key.pem"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(
        mode & 0o077,
        0,
        "private keys are readable by their owner only"
    );
    let bad = cairn(&["tls", "init", dir.to_str().unwrap(), "--nodes", "0"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
}
