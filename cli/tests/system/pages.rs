//! Paginated lists against real `cairn` processes: every page of a listing
//! reflects its first page's revision however the table changes between
//! pages (at the leader and through a follower, eventual and strong); a
//! page token whose revision left the history is Compacted, and the client
//! library's transparent list starts again and still returns the right
//! listing; a token that is not one, or not this listing's, is
//! InvalidArgument naming `page_token`, and one ahead of the node is
//! Unavailable; and `cairn list` pages a 100,000-resource type while the
//! node's memory stays bounded.

use crate::support;

use std::collections::BTreeMap;
use std::io::BufRead as _;
use std::time::{Duration, Instant};

use cairn_client::{Client, ClientOptions};
use cairn_proto::error::ApiError;
use cairn_proto::v1::*;
use futures::StreamExt as _;
use support::*;

const LEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// What the test wrote, by revision: the state at any revision is known
/// without asking the cluster.
#[derive(Default)]
struct Model {
    /// (revision, name, the resource stored from then on, or None: deleted).
    changes: Vec<(u64, String, Option<Resource>)>,
}

impl Model {
    /// The Things stored at `revision`, by name.
    fn at(&self, revision: u64) -> BTreeMap<String, Resource> {
        let mut state = BTreeMap::new();
        for (r, name, after) in &self.changes {
            if *r > revision {
                break;
            }
            match after {
                Some(resource) => state.insert(name.clone(), resource.clone()),
                None => state.remove(name),
            };
        }
        state
    }

    fn latest(&self) -> BTreeMap<String, Resource> {
        self.at(u64::MAX)
    }

    /// Creates `name` (nothing is stored there) with `uid`.
    async fn create(&mut self, address: &str, name: &str, uid: &str, payload: &[u8]) {
        self.write(address, thing(name, uid, "", payload)).await;
    }

    /// Replaces what is stored at `name` (same lifetime, by CAS).
    async fn replace(&mut self, address: &str, name: &str, payload: &[u8]) {
        let stored = self.latest().get(name).cloned().expect("stored");
        let id = stored.id.unwrap();
        self.write(address, thing(name, &id.uid, &stored.version, payload))
            .await;
    }

    async fn write(&mut self, address: &str, resource: Resource) {
        let name = name_of(&resource).to_string();
        let stored = write(address, resource)
            .await
            .unwrap_or_else(|e| panic!("write {name}: {e}"));
        let revision: u64 = stored.version.parse().unwrap();
        self.changes.push((revision, name, Some(stored)));
    }

    async fn delete(&mut self, address: &str, name: &str) {
        let stored = self.latest().get(name).cloned().expect("stored");
        let revision = client(address)
            .await
            .delete(DeleteRequest {
                fence: None,
                id: stored.id.clone(),
                version: stored.version.clone(),
                orphan_dependents: false,
            })
            .await
            .unwrap_or_else(|e| panic!("delete {name}: {e}"))
            .into_inner()
            .revision;
        self.changes.push((revision, name.into(), None));
    }
}

fn things(consistency: Consistency, limit: u32) -> ListRequest {
    ListRequest {
        r#type: Some(thing_type()),
        tenancy: Some(any_tenancy()),
        consistency: consistency as i32,
        limit,
        ..ListRequest::default()
    }
}

async fn page(address: &str, request: ListRequest) -> Result<ListResponse, ApiError> {
    client(address)
        .await
        .list(request)
        .await
        .map(|r| r.into_inner())
        .map_err(ApiError::from)
}

fn name_of(r: &Resource) -> &str {
    &r.id.as_ref().unwrap().name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_deletes_and_recreations_between_pages_never_change_a_listing() {
    // 40 Things, listed in pages of 7 at the leader and at a follower,
    // strong and eventual. Between every two pages the leader deletes a
    // Thing not yet served, replaces one, deletes and re-creates one (a new
    // uid), creates one among those not yet served, and changes one already
    // served. Every page carries the first page's revision, and the pages
    // together are exactly the Things stored at that revision (names, uids,
    // versions, data), in key order: what the test's own record of its
    // writes says, not what the cluster says.
    let cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = cluster.ids_except(leader)[0];
    let leader_address = cluster.node(leader).client_address.clone();
    let mut model = Model::default();
    for i in 0..40 {
        model
            .create(&leader_address, &format!("t{i:03}"), "u1", b"v1")
            .await;
    }
    let mut round = 0;
    for at in [leader, follower] {
        let address = cluster.node(at).client_address.clone();
        for consistency in [Consistency::Strong, Consistency::Eventual] {
            let mut request = things(consistency, 7);
            // An eventual first page on a follower may lag: any revision will do.
            let first = page(&address, request.clone())
                .await
                .unwrap_or_else(|e| panic!("first page at node {at}: {e}"));
            let revision = first.revision;
            let mut served: Vec<Resource> = first.resources;
            let mut token = first.next_page_token;
            let mut pages = 1;
            while !token.is_empty() {
                let last_served = name_of(served.last().unwrap()).to_string();
                let unserved: Vec<String> = model
                    .latest()
                    .keys()
                    .filter(|n| **n > last_served)
                    .cloned()
                    .collect();
                round += 1;
                if unserved.len() >= 3 {
                    model.delete(&leader_address, &unserved[0]).await;
                    model
                        .replace(&leader_address, &unserved[1], b"replaced")
                        .await;
                    model.delete(&leader_address, &unserved[2]).await;
                    model
                        .create(
                            &leader_address,
                            &unserved[2],
                            &format!("u{round}"),
                            b"again",
                        )
                        .await;
                    let new_name = format!("{}-new{round}", unserved[0]);
                    model.create(&leader_address, &new_name, "u1", b"new").await;
                }
                model
                    .replace(&leader_address, name_of(&served[0]), b"changed")
                    .await;
                request.page_token = token;
                let next = page(&address, request.clone())
                    .await
                    .unwrap_or_else(|e| panic!("page {pages} at node {at}: {e}"));
                assert_eq!(next.revision, revision, "page {pages} at node {at}");
                assert!(next.resources.len() <= 7);
                served.extend(next.resources);
                token = next.next_page_token;
                pages += 1;
            }
            let expected: Vec<Resource> = model.at(revision).into_values().collect();
            assert_eq!(
                served, expected,
                "{consistency:?} listing at node {at}, revision {revision}"
            );
            assert!(pages >= 5, "{pages} pages");
            assert_ne!(
                model.latest().into_values().collect::<Vec<_>>(),
                expected,
                "the table changed under the listing"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_tokens_that_are_compacted_malformed_foreign_or_ahead_are_refused() {
    // history_changes_max = 20. A listing's token outlives 25 later writes:
    // the next page is Compacted, naming an oldest retained revision past the
    // listing's. A token that is not one, one of another listing (another
    // prefix), and one used with another revision are InvalidArgument on
    // page_token; one of a revision the node has not applied is Unavailable.
    let mut o = options(1);
    o.extra_args = vec!["--history-changes-max".into(), "20".into()];
    let cluster = Cluster::start(o);
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let address = cluster.node(leader).client_address.clone();
    for i in 0..10 {
        write(&address, thing(&format!("t{i}"), "u1", "", b"x"))
            .await
            .unwrap();
    }
    let first = page(&address, things(Consistency::Strong, 3))
        .await
        .unwrap();
    let token = first.next_page_token.clone();
    assert!(!token.is_empty());

    let invalid = |result: Result<ListResponse, ApiError>| match result {
        Err(ApiError::InvalidArgument { field, reason }) => {
            assert_eq!(field, "page_token", "{reason}");
            reason
        }
        other => panic!("expected InvalidArgument on page_token, got {other:?}"),
    };
    let garbage = ListRequest {
        page_token: "bm90IGEgdG9rZW4".into(),
        ..things(Consistency::Eventual, 3)
    };
    invalid(page(&address, garbage).await);
    let oversized = ListRequest {
        page_token: "A".repeat(cairn_fsm::PAGE_TOKEN_CHARS_MAX + 1),
        ..things(Consistency::Eventual, 3)
    };
    invalid(page(&address, oversized).await);
    let other_listing = ListRequest {
        page_token: token.clone(),
        name_prefix: "t".into(),
        ..things(Consistency::Eventual, 3)
    };
    assert!(invalid(page(&address, other_listing).await).contains("another listing"));
    let other_revision = ListRequest {
        page_token: token.clone(),
        revision: first.revision - 1,
        ..things(Consistency::Eventual, 3)
    };
    assert!(invalid(page(&address, other_revision).await).contains("revision"));

    // A token issued at a revision far beyond this node's applied index.
    let elsewhere = cairn_fsm::Store::new(cairn_fsm::Limits::default());
    for (index, name) in [(1_000_000, "a"), (1_000_001, "b")] {
        elsewhere
            .apply(
                index,
                &cairn_fsm::Command::Write {
                    resource: thing(name, "u1", "", b"x"),
                },
            )
            .unwrap();
    }
    let (t, everything) = (thing_type(), any_tenancy());
    let filter = cairn_fsm::ListFilter {
        type_: &t,
        tenancy: &everything,
        name_prefix: "",
        selector: None,
    };
    let bounds = cairn_fsm::PageBounds {
        resources_max: 1,
        bytes_max: cairn_fsm::LIST_PAGE_BYTES_MAX,
    };
    let ahead = elsewhere.view().list_page(&filter, None, None, bounds);
    let ahead = ListRequest {
        page_token: ahead.next.unwrap().encode(),
        ..things(Consistency::Eventual, 3)
    };
    let started = Instant::now();
    match page(&address, ahead).await {
        Err(ApiError::Unavailable(reason)) => assert!(reason.contains("page_token"), "{reason}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "answered at once"
    );

    for i in 0..25 {
        write(&address, thing(&format!("other-{i}"), "u1", "", b"x"))
            .await
            .unwrap();
    }
    let next = ListRequest {
        page_token: token,
        ..things(Consistency::Strong, 3)
    };
    match page(&address, next).await {
        Err(ApiError::Compacted {
            oldest_retained_revision,
        }) => assert!(oldest_retained_revision > first.revision),
        other => panic!("expected Compacted, got {other:?}"),
    }
}

/// The number of List calls answered OUT_OF_RANGE (Compacted) by the node
/// whose ops listener is at `address`.
fn compacted_lists(address: &str) -> u64 {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address).expect("ops listener");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text.lines()
        .filter(|l| {
            l.starts_with("cairn_grpc_requests_total{")
                && l.contains("method=\"/cairn.v1.ResourceService/List\"")
                && l.contains("code=\"OUT_OF_RANGE\"")
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_starts_a_listing_again_when_its_revision_is_compacted_between_pages() {
    // history_changes_max = 20; 200 Things listed one per page by the client
    // library's transparent list while 25 writes to another kind land: the
    // writes compact the listing's revision before its last page (seen as an
    // OUT_OF_RANGE List in the node's metrics), the client starts again, and
    // the listing it returns is exactly the Things at its revision. 25
    // writes can compact at most one attempt, so the bounded restarts always
    // suffice; a round in which the writes happened to miss the listing is
    // run again, up to ten times.
    let mut o = options(1);
    o.metrics = true;
    o.extra_args = vec!["--history-changes-max".into(), "20".into()];
    let cluster = Cluster::start(o);
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let address = cluster.node(leader).client_address.clone();
    let ops = cluster.node(leader).metrics_address.clone().unwrap();
    let client = Client::connect_with(
        std::slice::from_ref(&address),
        ClientOptions {
            request_timeout: Duration::from_secs(30),
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    let expected: Vec<String> = (0..200).map(|i| format!("t{i:03}")).collect();
    futures::stream::iter(expected.clone())
        .map(|name| {
            let client = client.clone();
            async move { client.write(thing(&name, "u1", "", b"x")).await.unwrap() }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let churn = Type {
        kind: "Churn".into(),
        ..thing_type()
    };
    for round in 0..10 {
        let before = compacted_lists(&ops);
        let writer = {
            let (client, churn) = (client.clone(), churn.clone());
            tokio::spawn(async move {
                futures::stream::iter(0..25)
                    .map(|i| {
                        let client = client.clone();
                        let mut r = thing(&format!("c{round}-{i}"), "u1", "", b"x");
                        r.id.as_mut().unwrap().r#type = Some(churn.clone());
                        async move { client.write(r).await.unwrap() }
                    })
                    .buffer_unordered(25)
                    .collect::<Vec<_>>()
                    .await
            })
        };
        let listed = client
            .list_request(things(Consistency::Strong, 1))
            .await
            .expect("the listing ends, starting again if it must");
        writer.await.unwrap();
        let names: Vec<String> = listed
            .resources
            .iter()
            .map(|r| name_of(r).to_string())
            .collect();
        assert_eq!(names, expected, "round {round}");
        assert!(listed.next_page_token.is_empty());
        let restarts = compacted_lists(&ops) - before;
        println!(
            "round {round}: {restarts} compacted page(s), listing at revision {}",
            listed.revision
        );
        if restarts > 0 {
            assert!(restarts <= u64::from(cairn_client::LIST_RESTARTS_MAX));
            return;
        }
    }
    panic!("in ten rounds, the writes never compacted a listing between its pages");
}

/// Things per page of `cairn list` (the node's default `list_page_size_max`).
const PAGE_RESOURCES: usize = 1000;

/// The encoded size of a stored Thing of `payload` as the node sends it (its
/// protobuf encoding, plus the field tag and length of a list answer).
fn encoded_thing_bytes(payload: &[u8]) -> usize {
    let mut stored = thing("thing-000000", "u1", "", payload);
    stored.version = "100000".into();
    let len = prost::Message::encoded_len(&stored);
    len + 1 + prost::length_delimiter_len(len)
}

/// VmRSS (or, with `peak`, VmHWM) of process `pid` in bytes, if it runs.
fn rss_bytes(pid: u32, peak: bool) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = if peak { "VmHWM:" } else { "VmRSS:" };
    let kib: u64 = status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

const MIB: u64 = 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cairn_list_pages_a_hundred_thousand_resources_with_the_nodes_memory_bounded() {
    // 100,000 Things of ~300 bytes (~30 MB encoded) written concurrently
    // through the client library; then the real `cairn list` prints them
    // (a table, read line by line as it comes) while the node's RSS is
    // sampled. Every Thing is printed once; the node's RSS grows by far
    // less than the ~30 MB one unpaged answer would take (pages of 1,000,
    // about 0.3 MB), and the command's own peak stays small too.
    const COUNT: usize = 100_000;
    let cluster = Cluster::start(options(1));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let address = cluster.node(leader).client_address.clone();
    let node_pid = cluster.node(leader).pid().expect("the node runs");
    let client = Client::connect_with(
        std::slice::from_ref(&address),
        ClientOptions {
            request_timeout: Duration::from_secs(60),
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    let payload = vec![b'x'; 200];
    let started = Instant::now();
    futures::stream::iter(0..COUNT)
        .map(|i| {
            let (client, payload) = (client.clone(), payload.clone());
            async move {
                client
                    .write(thing(&format!("thing-{i:06}"), "u1", "", &payload))
                    .await
                    .unwrap_or_else(|e| panic!("write {i}: {e}"))
            }
        })
        .buffer_unordered(200)
        .for_each(|_| async {})
        .await;
    println!("wrote {COUNT} Things in {:?}", started.elapsed());
    // Warm-up: the first pages a node ever serves grow its allocator's arenas
    // once, whatever the listing's length. What is measured is a listing on a
    // node that has served pages before, as every listing but the first is.
    let mut warm_up = things(Consistency::Eventual, PAGE_RESOURCES as u32);
    for _ in 0..3 {
        let page = client
            .list_page(warm_up.clone())
            .await
            .expect("a warm-up page");
        warm_up.page_token = page.next_page_token;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss_bytes(node_pid, false).expect("the node's RSS");

    let started = Instant::now();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "list",
            "--endpoints",
            &address,
            "--type",
            "demo.Thing",
            "--tenancy",
            "*/*",
            "--timeout-ms",
            "30000",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run cairn list");
    let cli_pid = child.id();
    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        std::thread::spawn(move || {
            let (mut node_max, mut cli_peak) = (0, 0);
            while sampling.load(std::sync::atomic::Ordering::SeqCst) {
                node_max = node_max.max(rss_bytes(node_pid, false).unwrap_or(0));
                cli_peak = cli_peak.max(rss_bytes(cli_pid, true).unwrap_or(0));
                std::thread::sleep(Duration::from_millis(5));
            }
            (node_max, cli_peak)
        })
    };
    // Read as it comes; judged once the measurements are printed.
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(stdout).lines();
    let header = lines.next().and_then(Result::ok).unwrap_or_default();
    let (mut printed, mut out_of_order) = (0usize, Vec::new());
    let mut previous = String::new();
    for line in lines {
        let line = line.unwrap();
        let name = line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string();
        if name <= previous {
            out_of_order.push(format!("{name:?} after {previous:?}"));
        }
        previous = name;
        printed += 1;
    }
    let status = child.wait().unwrap();
    sampling.store(false, std::sync::atomic::Ordering::SeqCst);
    let (node_max, cli_peak) = sampler.join().unwrap();
    let after = rss_bytes(node_pid, false).expect("the node's RSS");
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let growth = node_max.saturating_sub(before);
    // The benchmark target (docs/benchmarks.md): growth below twice one page's
    // encoded size times the pages in flight (one: `cairn list` asks for the
    // next page after it printed the last).
    let page_bytes = PAGE_RESOURCES * encoded_thing_bytes(&payload);
    let target_bytes = 2 * page_bytes;
    println!(
        "node RSS growth {} KiB; one page {} KiB encoded ({PAGE_RESOURCES} Things); target below \
         2 x page x 1 page in flight = {} KiB: {}",
        growth / 1024,
        page_bytes / 1024,
        target_bytes / 1024,
        if growth < target_bytes as u64 {
            "met"
        } else {
            "missed"
        }
    );
    println!(
        "cairn list printed {printed} Things in {:?}; node RSS {} MiB before, at most {} MiB \
         during (+{} MiB), {} MiB after; cairn list peak RSS {} MiB",
        started.elapsed(),
        before / MIB,
        node_max / MIB,
        growth / MIB,
        after / MIB,
        cli_peak / MIB,
    );
    assert!(status.success(), "cairn list failed: {stderr}");
    assert!(header.starts_with("TYPE"), "{header}");
    assert_eq!(printed, COUNT, "{stderr}");
    assert!(
        out_of_order.is_empty(),
        "printed once each, in order: {:?}",
        &out_of_order[..out_of_order.len().min(5)]
    );
    assert!(growth < 24 * MIB, "the node grew by {} MiB", growth / MIB);
    assert!(
        cli_peak < 96 * MIB,
        "cairn list peaked at {} MiB",
        cli_peak / MIB
    );
}
