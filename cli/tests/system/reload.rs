//! What a running cluster takes up without a restart, with real `cairn`
//! processes: certificate files replaced in place (no signal: the node
//! notices the new bytes), a broken replacement that must leave the old
//! certificate serving, and grants reloaded on SIGHUP: a revoked token is
//! refused at once and its open watches end, a kept one goes on, a bad
//! config changes nothing; the node token, read again on SIGHUP, is what a
//! node presents to the others from then on. (`tls.rs` covers the
//! certificate reload on SIGHUP.)

use crate::support;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_client::{BearerToken, Client, ClientError, ClientOptions, WatchStream};
use cairn_proto::v1::{watch_event, Consistency, Tenancy, WatchListRequest};
use cairn_tls::ClientFiles;
use support::*;

/// The serial number and subject of a DER certificate, as hex and text.
fn serial_and_subject(der: &[u8]) -> (String, String) {
    let (_, parsed) = x509_parser::parse_x509_certificate(der).expect("a certificate");
    (parsed.raw_serial_as_string(), parsed.subject().to_string())
}

/// Writes `contents` to `path` through a temporary file and a rename, as a
/// careful operator (or a certificate manager) replaces a file.
fn replace_file(path: &Path, contents: &[u8]) {
    let temporary = path.with_extension("new");
    std::fs::write(&temporary, contents).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

/// New certificates for the nodes of `dir`, from its CA, written in `next`.
fn reissue(dir: &Path, next: &Path) {
    std::fs::create_dir_all(next).unwrap();
    for file in ["ca.pem", "ca-key.pem"] {
        std::fs::copy(dir.join(file), next.join(file)).unwrap();
    }
    tls_init(next, &[]);
}

/// Keeps writing through `client` until told to stop; returns how many
/// writes succeeded and every failure.
fn keep_writing(
    client: Client,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u32, Vec<String>)> {
    tokio::spawn(async move {
        let mut written = 0u32;
        let mut failures = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            match client
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
}

/// Waits until node `id` serves `expected` on both its ports to a new connection.
async fn wait_served(cluster: &Cluster, dir: &Path, id: u64, expected: &[u8], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (client_port, peer_port) = served_on_both_ports(cluster, dir, id).await;
        if client_port == expected && peer_port == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {id} does not serve {what} within 15 s; logs in {}",
            cluster.root().display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The certificates node `id` presents on its client and peer ports.
async fn served_on_both_ports(cluster: &Cluster, dir: &Path, id: u64) -> (Vec<u8>, Vec<u8>) {
    let node = cluster.node(id);
    let as_client = ClientFiles {
        ca_file: Some(dir.join("ca.pem")),
        cert_file: Some(dir.join("client.pem")),
        key_file: Some(dir.join("client-key.pem")),
    };
    // The peer port wants a node certificate; node 2's is one.
    let as_peer = ClientFiles {
        ca_file: Some(dir.join("ca.pem")),
        cert_file: Some(dir.join("node-2.pem")),
        key_file: Some(dir.join("node-2-key.pem")),
    };
    (
        served_certificate(&node.client_address, &as_client).await,
        served_certificate(&node.peer_address, &as_peer).await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_files_replaced_in_place_are_served_without_a_signal() {
    // A client writes all along. Every node's certificate and key are
    // replaced (rename into place, no SIGHUP): within a few polls every node
    // serves its new certificate (another serial, the same subject) on both
    // ports. Then node 1's key is replaced by garbage: the node logs the
    // failure once, naming the file, and keeps serving the certificate in
    // force; a good key afterwards is taken up. No write fails.
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("tls");
    tls_init(&dir, &[]);
    let cluster = tls_cluster(&dir, 3, &["--tls-reload-interval-ms", "200"]);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let node_cert = |id: u64| dir.join(format!("node-{id}.pem"));
    let node_key = |id: u64| dir.join(format!("node-{id}-key.pem"));
    let old: Vec<Vec<u8>> = (1..=3)
        .map(|id| first_certificate(&node_cert(id)))
        .collect();
    wait_served(&cluster, &dir, 1, &old[0], "its first certificate").await;

    let stop = Arc::new(AtomicBool::new(false));
    let writer = keep_writing(
        tls_client(&cluster, Some(client_tls(&dir)), Duration::from_secs(10)),
        stop.clone(),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    // New certificates, moved into place: the key first, then the certificate.
    let next = scratch.path().join("next");
    reissue(&dir, &next);
    for id in 1..=3u64 {
        for (from, to) in [
            (next.join(format!("node-{id}-key.pem")), node_key(id)),
            (next.join(format!("node-{id}.pem")), node_cert(id)),
        ] {
            std::fs::rename(from, to).unwrap();
        }
    }
    let new: Vec<Vec<u8>> = (1..=3)
        .map(|id| first_certificate(&node_cert(id)))
        .collect();
    for id in 1..=3u64 {
        let i = id as usize - 1;
        assert_ne!(new[i], old[i]);
        wait_served(&cluster, &dir, id, &new[i], "its new certificate").await;
        let (old_serial, old_subject) = serial_and_subject(&old[i]);
        let (new_serial, new_subject) = serial_and_subject(&new[i]);
        assert_ne!(old_serial, new_serial, "node {id}: a new serial is served");
        assert_eq!(old_subject, new_subject, "node {id}: the same subject");
        assert!(
            cluster.log_of(id).contains("TLS certificates reloaded")
                && cluster.log_of(id).contains("files changed"),
            "node {id} says why it reloaded; logs in {}",
            cluster.root().display()
        );
    }

    // A broken replacement: garbage where node 1's key was.
    let good_key = std::fs::read(node_key(1)).unwrap();
    replace_file(
        &node_key(1),
        b"-----BEGIN NOTHING-----\ngarbage\n-----END NOTHING-----\n",
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let key_failure = |log: &str| {
        log.lines()
            .any(|l| l.contains("TLS reload failed") && l.contains("node-1-key.pem"))
    };
    while !key_failure(&cluster.log_of(1)) {
        assert!(
            Instant::now() < deadline,
            "node 1 does not log the broken key; logs in {}",
            cluster.root().display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Several polls later: still the certificate in force, one failure line.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        served_on_both_ports(&cluster, &dir, 1).await,
        (new[0].clone(), new[0].clone()),
        "node 1 keeps serving the certificate in force"
    );
    let log = cluster.log_of(1);
    let failures: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("TLS reload failed"))
        .collect();
    assert_eq!(
        failures.len(),
        1,
        "one line per broken change: {failures:#?}"
    );
    assert!(
        failures[0].contains("node-1-key.pem") && failures[0].contains("ERROR"),
        "{}",
        failures[0]
    );

    // A good pair again (from a third issue): taken up.
    let third = scratch.path().join("third");
    reissue(&dir, &third);
    std::fs::rename(third.join("node-1-key.pem"), node_key(1)).unwrap();
    std::fs::rename(third.join("node-1.pem"), node_cert(1)).unwrap();
    let third_cert = first_certificate(&node_cert(1));
    wait_served(&cluster, &dir, 1, &third_cert, "the repaired certificate").await;
    drop(good_key);

    stop.store(true, Ordering::Relaxed);
    let (written, failures) = writer.await.unwrap();
    assert!(
        failures.is_empty(),
        "writes failed during the reloads: {failures:?}"
    );
    assert!(written > 10, "the writer kept writing ({written} writes)");
}

/// A grant of `role` (`read` or `write`) on every demo type in `tenancies`.
fn grant(name: &str, hash_line: &str, role: &str, tenancies: &str) -> String {
    format!(
        "\n[[auth.grants]]\nname = \"{name}\"\n{hash_line}\n{role} = {{ types = [\"demo.*\"], tenancies = [{tenancies}] }}\n"
    )
}

fn token_client(endpoints: &[String], token: &str) -> Client {
    Client::new(
        endpoints,
        ClientOptions {
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_millis(500),
            token: Some(BearerToken::new(token).unwrap()),
            ..ClientOptions::default()
        },
    )
    .unwrap()
}

fn every_thing() -> WatchListRequest {
    WatchListRequest {
        r#type: Some(thing_type()),
        tenancy: Some(any_tenancy()),
        name_prefix: String::new(),
        start_revision: 0,
        ..Default::default()
    }
}

/// The next event of a watch that is not a marker: a change's resource
/// name, or the error that ended the watch; `None` when it ended cleanly.
async fn next_of(watch: &mut WatchStream) -> Option<Result<String, ClientError>> {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(15), watch.next())
            .await
            .expect("a watch event within 15 s")?;
        match event {
            Err(e) => return Some(Err(e)),
            Ok(event) => match event.event {
                Some(watch_event::Event::Upsert(u)) => {
                    return Some(Ok(u.resource.and_then(|r| r.id).unwrap().name))
                }
                Some(watch_event::Event::Delete(d)) => {
                    return Some(Ok(d.resource.and_then(|r| r.id).unwrap().name))
                }
                _ => continue,
            },
        }
    }
}

/// Waits until the log of every node in `ids` holds `needle`.
async fn wait_logged(cluster: &Cluster, ids: &[u64], needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ids.iter().all(|id| cluster.log_of(*id).contains(needle)) {
        assert!(
            Instant::now() < deadline,
            "not every node of {ids:?} logged {needle:?}; logs in {}",
            cluster.root().display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_reload_on_sighup_and_revoked_watches_end() {
    // Four tokens: `keep` (write, stays), `revoke` (write, removed), `narrow`
    // (read on */*, narrowed to default/*) and `fresh` (added). Each of
    // keep, revoke and narrow holds a watch of every Thing. The config file
    // is rewritten and every node gets SIGHUP: revoke is refused on every
    // node and its watch ends UNAUTHENTICATED; narrow's watch ends with
    // WatchClosed (its grant changed) and a new list shows only its new
    // scope; keep's watch goes on; fresh works. A config that does not
    // parse, and one without grants, change nothing and are logged.
    let dir = tempfile::tempdir().unwrap();
    let (admin, admin_hash) = new_token();
    let (keep, keep_hash) = new_token();
    let (revoke, revoke_hash) = new_token();
    let (narrow, narrow_hash) = new_token();
    let (fresh, fresh_hash) = new_token();
    let node_token = dir.path().join("node.token");
    std::fs::write(&node_token, &admin).unwrap();
    let header = format!(
        "[auth]\nnode_token_file = \"{}\"\n\n[[auth.grants]]\nname = \"admin\"\n{admin_hash}\nadmin = true\n",
        node_token.display()
    );
    let config = dir.path().join("cairn.toml");
    let before = format!(
        "{header}{}{}{}",
        grant("keep", &keep_hash, "write", "\"*\""),
        grant("revoke", &revoke_hash, "write", "\"*\""),
        grant("narrow", &narrow_hash, "read", "\"*\""),
    );
    std::fs::write(&config, &before).unwrap();
    let mut o = options(3);
    o.extra_args = vec!["--config".into(), config.display().to_string()];
    o.admin_token = Some(admin.clone());
    let cluster = Cluster::start(o);
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let endpoints = cluster.endpoints();
    let on_node =
        |id: u64, token: &str| token_client(&[cluster.node(id).client_address.clone()], token);

    let keeper = token_client(&endpoints, &keep);
    keeper.write(thing("d1", "u1", "", b"x")).await.unwrap();
    let mut other = thing("t1", "u1", "", b"x");
    other.id.as_mut().unwrap().tenancy = Some(Tenancy {
        partition: "team".into(),
        namespace: "web".into(),
    });
    keeper.write(other).await.unwrap();
    // Watches on different nodes: the leader and the followers.
    let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let mut keep_watch = on_node(follower, &keep)
        .watch_list(every_thing())
        .await
        .unwrap();
    let mut revoke_watch = on_node(follower, &revoke)
        .watch_list(every_thing())
        .await
        .unwrap();
    let mut revoke_watch_on_leader = on_node(leader, &revoke)
        .watch_list(every_thing())
        .await
        .unwrap();
    let mut narrow_watch = on_node(leader, &narrow)
        .watch_list(every_thing())
        .await
        .unwrap();
    for watch in [
        &mut keep_watch,
        &mut revoke_watch,
        &mut revoke_watch_on_leader,
        &mut narrow_watch,
    ] {
        let mut seen = vec![
            next_of(watch).await.unwrap().unwrap(),
            next_of(watch).await.unwrap().unwrap(),
        ];
        seen.sort();
        assert_eq!(seen, ["d1", "t1"]);
    }

    // The new grants: revoke gone, narrow narrowed, fresh added, keep kept
    // (and a setting that needs a restart).
    let after = format!(
        "history_changes_max = 5000\n{header}{}{}{}",
        grant("keep", &keep_hash, "write", "\"*\""),
        grant("narrow", &narrow_hash, "read", "\"default/*\""),
        grant("fresh", &fresh_hash, "write", "\"*\""),
    );
    replace_file(&config, after.as_bytes());
    for id in cluster.ids() {
        sighup(&cluster, id);
    }
    wait_logged(
        &cluster,
        &cluster.ids(),
        "grants reloaded from the configuration",
    )
    .await;
    for id in cluster.ids() {
        let refused = on_node(id, &revoke)
            .read(id_of("d1"), Consistency::Eventual)
            .await;
        assert!(
            matches!(refused, Err(ClientError::Unauthenticated(_))),
            "node {id}: the revoked token is refused: {refused:?}"
        );
        // Strong reads: a follower may not have applied d1 yet, and this checks
        // each node's grants, not its progress.
        on_node(id, &keep)
            .read(id_of("d1"), Consistency::Strong)
            .await
            .unwrap_or_else(|e| panic!("node {id}: the kept token reads: {e}"));
        on_node(id, &fresh)
            .read(id_of("d1"), Consistency::Strong)
            .await
            .unwrap_or_else(|e| panic!("node {id}: the added token reads: {e}"));
    }
    assert!(
        cluster.log_of(1).contains("history_changes_max")
            && cluster.log_of(1).contains("next restart"),
        "the node says which settings wait for a restart"
    );

    // The revoked token's watches end with the refusal; narrow's with
    // WatchClosed; keep's goes on.
    keeper.write(thing("d2", "u1", "", b"x")).await.unwrap();
    for watch in [&mut revoke_watch, &mut revoke_watch_on_leader] {
        match next_of(watch).await {
            Some(Err(ClientError::Unauthenticated(_))) => {}
            other => panic!("a revoked token's watch must end UNAUTHENTICATED, got {other:?}"),
        }
        assert!(next_of(watch).await.is_none(), "and then end");
    }
    match next_of(&mut narrow_watch).await {
        Some(Err(ClientError::WatchClosed(m))) => assert!(m.contains("grant"), "{m}"),
        other => panic!("a narrowed grant's watch must end WatchClosed, got {other:?}"),
    }
    assert_eq!(next_of(&mut keep_watch).await.unwrap().unwrap(), "d2");
    let narrowed = on_node(leader, &narrow)
        .list(thing_type(), any_tenancy(), "", Consistency::Strong)
        .await
        .unwrap();
    let mut names: Vec<String> = narrowed
        .resources
        .into_iter()
        .map(|r| r.id.unwrap().name)
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["d1", "d2"],
        "the narrowed grant lists default/* only"
    );

    // A config that does not parse: logged, nothing changes.
    replace_file(&config, b"[[auth.grants]\nname = \n");
    sighup(&cluster, 1);
    wait_logged(&cluster, &[1], "the configuration does not load").await;
    // A config without grants would open the port: refused, nothing changes.
    replace_file(&config, b"history_changes_max = 5000\n");
    sighup(&cluster, 1);
    wait_logged(&cluster, &[1], "never turns authentication off").await;
    let node_1 = |token: &str| on_node(1, token);
    node_1(&fresh)
        .read(id_of("d1"), Consistency::Eventual)
        .await
        .unwrap();
    let refused = node_1(&revoke)
        .read(id_of("d1"), Consistency::Eventual)
        .await;
    assert!(
        matches!(refused, Err(ClientError::Unauthenticated(_))),
        "{refused:?}"
    );
    let anonymous = Client::new(
        &[cluster.node(1).client_address.clone()],
        ClientOptions::default(),
    )
    .unwrap()
    .read(id_of("d1"), Consistency::Eventual)
    .await;
    assert!(
        matches!(anonymous, Err(ClientError::Unauthenticated(_))),
        "{anonymous:?}"
    );
    let log = cluster.log_of(1);
    assert_eq!(
        log.matches("grants reload failed").count(),
        2,
        "each failed reload is logged once; logs in {}",
        cluster.root().display()
    );
}

/// The id of the Thing `name` in default/default.
fn id_of(name: &str) -> cairn_proto::v1::Id {
    id(name, "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_token_is_read_again_on_sighup() {
    // A leader transfer makes the leader call the target's client port with
    // its node token. Every node's token file is replaced by a token without
    // admin and the nodes get SIGHUP: the transfer is refused. With the
    // admin token back and another SIGHUP, it goes through.
    let dir = tempfile::tempdir().unwrap();
    let (admin, admin_hash) = new_token();
    let (reader, reader_hash) = new_token();
    let node_token = dir.path().join("node.token");
    std::fs::write(&node_token, &admin).unwrap();
    let config = dir.path().join("cairn.toml");
    std::fs::write(
        &config,
        format!(
            "[auth]\nnode_token_file = \"{}\"\n\n[[auth.grants]]\nname = \"admin\"\n{admin_hash}\n\
             admin = true\n{}",
            node_token.display(),
            grant("reader", &reader_hash, "read", "\"*\""),
        ),
    )
    .unwrap();
    let mut o = options(3);
    o.extra_args = vec!["--config".into(), config.display().to_string()];
    o.admin_token = Some(admin.clone());
    let cluster = Cluster::start(o);
    cluster.wait_for_leader(Duration::from_secs(20)).await;

    let reload_all = |times: usize| {
        for id in cluster.ids() {
            sighup(&cluster, id);
        }
        let cluster = &cluster;
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !cluster
                .ids()
                .into_iter()
                .all(|id| cluster.log_of(id).matches("node token reloaded").count() >= times)
            {
                assert!(
                    Instant::now() < deadline,
                    "the nodes did not reload their token"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let other_than = |leader: u64| cluster.ids().into_iter().find(|id| *id != leader).unwrap();

    replace_file(&node_token, reader.as_bytes());
    reload_all(1).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let refused = cluster
        .transfer_leader(other_than(leader), Duration::from_secs(20))
        .await
        .expect_err("a node presenting a token without admin cannot hand leadership off");
    assert!(
        refused.to_lowercase().contains("permission"),
        "the target refused the leader's token: {refused}"
    );

    replace_file(&node_token, admin.as_bytes());
    reload_all(2).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let target = other_than(leader);
    cluster
        .transfer_leader(target, Duration::from_secs(20))
        .await
        .expect("with the admin token back, the transfer goes through");
}
