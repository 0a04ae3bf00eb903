//! Fuzz harnesses for every decoder of data that comes from the network or
//! the disk, as property tests over arbitrary bytes and mutations of valid
//! encodings: none may panic, each returns an error on malformed input.
//!
//! - protobuf requests (client port, and forwarded requests on the peer
//!   port, which are the same messages), then the validation they go through;
//! - Raft messages and replies (bincode), then the peer gate's checks;
//! - log entries as openraft hands them to the state machine (bincode), and
//!   the commands inside them;
//! - snapshot files and restore uploads (the same format), then the restore
//!   of what they hold into a store;
//! - the config file.
//!
//! CI runs a short pass (`PROPTEST_CASES` unset: 128 cases per property);
//! `PROPTEST_CASES=50000 cargo test --release -p cairn-server --test
//! fuzz_decoders` runs a long one (see docs/security.md).

use std::io::Cursor;

use cairn_proto::v1 as pb;
use cairn_server::raft::{
    decode_raft_message, peer_gate, LogPayload, NodeId, NodeInfo, TypeConfig,
};
use cairn_server::snapshot_file::{SnapshotEncoder, SnapshotHeader, SnapshotReader};
use cairn_test_support::fuzz::{config, mutate, mutations};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Membership, StoredMembership, Vote};
use proptest::prelude::*;
use prost::Message;

fn arbitrary_bytes() -> impl Strategy<Value = Vec<u8>> {
    cairn_test_support::fuzz::arbitrary_bytes(1024)
}

fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(value, bincode::config::standard()).expect("encodes")
}

// ---------------------------------------------------------------- protobuf

fn id(name: &str) -> pb::Id {
    pb::Id {
        uid: "u1".into(),
        name: name.into(),
        r#type: Some(pb::Type {
            group: "demo".into(),
            group_version: "v1".into(),
            kind: "Thing".into(),
        }),
        tenancy: Some(pb::Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }),
    }
}

fn resource(name: &str) -> pb::Resource {
    let mut r = pb::Resource {
        id: Some(id(name)),
        owner: Some(Box::new(id("owner"))),
        version: "3".into(),
        data: Some(cairn_proto::google::protobuf::Any {
            type_url: "demo/bytes".into(),
            value: bytes::Bytes::from_static(b"payload"),
        }),
        ..Default::default()
    };
    r.metadata.insert("k".into(), "v".into());
    r.status.insert(
        "s".into(),
        pb::Status {
            conditions: vec![pb::Condition {
                r#type: "Ready".into(),
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    r
}

/// A page token a node issues for a listing of `filter` at revision 2 (the
/// first of two resources served), so that mutations reach its decoder.
fn page_token(filter: &cairn_fsm::ListFilter<'_>) -> String {
    let store = cairn_fsm::Store::new(cairn_fsm::Limits::default());
    for (index, name) in [(1, "a1"), (2, "a2")] {
        store
            .apply(
                index,
                &cairn_fsm::Command::Write {
                    resource: pb::Resource {
                        version: String::new(),
                        // What the seed list's selector asks for.
                        metadata: [("app", "web"), ("env", "prod")]
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .into(),
                        ..resource(name)
                    },
                },
            )
            .expect("a seed resource applies");
    }
    let bounds = cairn_fsm::PageBounds {
        resources_max: 1,
        bytes_max: cairn_fsm::LIST_PAGE_BYTES_MAX,
    };
    let page = store.view().list_page(filter, None, None, bounds);
    page.next.expect("a second page").encode()
}

/// Valid encodings of every request message, tagged with their type.
fn request_seeds() -> Vec<(usize, Vec<u8>)> {
    let list_tenancy = pb::Tenancy {
        partition: "*".into(),
        namespace: "default".into(),
    };
    let list_type = id("x").r#type.expect("a type");
    let list_selector = "app=web,env in (prod)";
    let parsed_selector = cairn_fsm::Selector::parse(list_selector).expect("a valid selector");
    let list = pb::ListRequest {
        page_token: page_token(&cairn_fsm::ListFilter {
            type_: &list_type,
            tenancy: &list_tenancy,
            name_prefix: "a",
            selector: Some(&parsed_selector),
        }),
        r#type: Some(list_type.clone()),
        tenancy: Some(list_tenancy.clone()),
        name_prefix: "a".into(),
        consistency: 1,
        revision: 2,
        limit: 10,
        selector: list_selector.into(),
    };
    vec![
        (
            0,
            pb::WriteRequest {
                fence: None,
                resource: Some(resource("a")),
            }
            .encode_to_vec(),
        ),
        (
            1,
            pb::ReadRequest {
                id: Some(id("a")),
                consistency: 1,
                revision: 2,
            }
            .encode_to_vec(),
        ),
        (
            2,
            pb::DeleteRequest {
                fence: None,
                id: Some(id("a")),
                version: "3".into(),
                orphan_dependents: false,
            }
            .encode_to_vec(),
        ),
        (3, list.encode_to_vec()),
        (
            4,
            pb::ListByOwnerRequest {
                owner: Some(id("o")),
            }
            .encode_to_vec(),
        ),
        (
            5,
            pb::WatchListRequest {
                r#type: list.r#type.clone(),
                tenancy: list.tenancy.clone(),
                name_prefix: "a".into(),
                start_revision: 9,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            6,
            pb::SnapshotChunk {
                data: bytes::Bytes::from_static(b"CAIRNSNP"),
            }
            .encode_to_vec(),
        ),
        (
            7,
            pb::ForwardedList {
                request: Some(list.clone()),
                read_scope: Some(pb::ReadScope {
                    any_of: vec![pb::ScopePatterns {
                        types: vec!["demo.*".into(), "x.Thing".into()],
                        tenancies: vec!["default/*".into()],
                    }],
                }),
            }
            .encode_to_vec(),
        ),
    ]
}

/// Decodes `bytes` as request type `kind` and runs the validation the node
/// runs before any work: the executor's own checks
/// (`cairn_forwarding::checks`), not a copy of them.
fn decode_request(kind: usize, bytes: &[u8]) {
    use cairn_forwarding::checks;
    let limits = cairn_fsm::Limits::default();
    match kind {
        0 => {
            if let Ok(r) = pb::WriteRequest::decode(bytes) {
                let _ = checks::write(&limits, &r);
            }
        }
        1 => {
            if let Ok(r) = pb::ReadRequest::decode(bytes) {
                let _ = checks::read(&limits, &r);
            }
        }
        2 => {
            if let Ok(r) = pb::DeleteRequest::decode(bytes) {
                let _ = checks::delete(&limits, &r);
            }
        }
        3 => {
            if let Ok(r) = pb::ListRequest::decode(bytes) {
                let _ = checks::list(&limits, &r);
            }
        }
        4 => {
            if let Ok(r) = pb::ListByOwnerRequest::decode(bytes) {
                let _ = checks::list_by_owner(&limits, &r);
            }
        }
        5 => {
            if let Ok(r) = pb::WatchListRequest::decode(bytes) {
                let _ = checks::watch(&limits, &r);
            }
        }
        7 => {
            if let Ok(r) = pb::ForwardedList::decode(bytes) {
                if let Some(list) = &r.request {
                    let _ = checks::list(&limits, list);
                }
                if let Some(scope) = &r.read_scope {
                    let _ = cairn_fsm::ReadScope::from_wire(scope);
                }
            }
        }
        _ => {
            let _ = pb::SnapshotChunk::decode(bytes);
            let _ = pb::AddLearnerRequest::decode(bytes);
            let _ = pb::StatusRequest::decode(bytes);
        }
    }
}

// ---------------------------------------------------------------- raft

fn log_id(term: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn membership() -> Membership<NodeId, NodeInfo> {
    let nodes: std::collections::BTreeMap<NodeId, NodeInfo> = (1..=3)
        .map(|i| {
            (
                i,
                NodeInfo {
                    peer_address: format!("127.0.0.1:800{i}"),
                    client_address: format!("127.0.0.1:700{i}"),
                },
            )
        })
        .collect();
    Membership::new(vec![nodes.keys().copied().collect()], nodes)
}

/// Valid encodings of every Raft message and reply, tagged with their type.
fn raft_seeds() -> Vec<(usize, Vec<u8>)> {
    let command = cairn_fsm::Command::Write {
        resource: resource("a"),
    };
    let append = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(3, 1),
        prev_log_id: Some(log_id(2, 5)),
        entries: vec![
            Entry {
                log_id: log_id(3, 6),
                payload: EntryPayload::Blank,
            },
            Entry {
                log_id: log_id(3, 7),
                payload: EntryPayload::Normal(LogPayload(command.encode())),
            },
            Entry {
                log_id: log_id(3, 8),
                payload: EntryPayload::Membership(membership()),
            },
        ],
        leader_commit: Some(log_id(3, 6)),
    };
    let snapshot = InstallSnapshotRequest::<TypeConfig> {
        vote: Vote::new_committed(3, 1),
        meta: openraft::SnapshotMeta {
            last_log_id: Some(log_id(3, 8)),
            last_membership: StoredMembership::new(Some(log_id(3, 8)), membership()),
            snapshot_id: "3-8".into(),
        },
        offset: 0,
        data: b"CAIRNSNP data".to_vec(),
        done: false,
    };
    let vote_reply: Result<VoteResponse<NodeId>, openraft::error::RaftError<NodeId>> =
        Ok(VoteResponse::new(Vote::new(3, 1), Some(log_id(2, 5)), true));
    let append_reply: Result<AppendEntriesResponse<NodeId>, openraft::error::RaftError<NodeId>> =
        Ok(AppendEntriesResponse::HigherVote(Vote::new(4, 2)));
    let snapshot_reply: Result<
        InstallSnapshotResponse<NodeId>,
        openraft::error::RaftError<NodeId, openraft::error::InstallSnapshotError>,
    > = Ok(InstallSnapshotResponse {
        vote: Vote::new(3, 1),
    });
    vec![
        (0, encode(&append)),
        (
            1,
            encode(&VoteRequest::new(Vote::new(4, 2), Some(log_id(3, 8)))),
        ),
        (2, encode(&snapshot)),
        (3, encode(&vote_reply)),
        (4, encode(&append_reply)),
        (5, encode(&snapshot_reply)),
        (6, encode(&append.entries[1])),
    ]
}

/// Decodes `bytes` as Raft message `kind` and runs what the peer port runs
/// on it before openraft sees it (and, for an entry, what the state machine
/// runs on its command).
fn decode_raft(kind: usize, bytes: &[u8]) {
    match kind {
        0 => {
            if let Ok(rpc) = decode_raft_message::<AppendEntriesRequest<TypeConfig>>(bytes) {
                let _ = peer_gate::check_append_entries(&rpc, 1, peer_gate::ENTRIES_MAX);
            }
        }
        1 => {
            if let Ok(rpc) = decode_raft_message::<VoteRequest<NodeId>>(bytes) {
                let _ = peer_gate::check_vote_request(&rpc, 2);
            }
        }
        2 => {
            if let Ok(rpc) = decode_raft_message::<InstallSnapshotRequest<TypeConfig>>(bytes) {
                let _ =
                    peer_gate::check_install_snapshot(&rpc, 1, peer_gate::SNAPSHOT_CHUNK_BYTES_MAX);
            }
        }
        3 => {
            type Reply = Result<VoteResponse<NodeId>, openraft::error::RaftError<NodeId>>;
            if let Ok(Ok(reply)) = decode_raft_message::<Reply>(bytes) {
                let _ = peer_gate::check_vote_reply(&reply);
            }
        }
        4 => {
            type Reply = Result<AppendEntriesResponse<NodeId>, openraft::error::RaftError<NodeId>>;
            if let Ok(Ok(reply)) = decode_raft_message::<Reply>(bytes) {
                let _ = peer_gate::check_append_entries_reply(&reply);
            }
        }
        5 => {
            type Reply = Result<
                InstallSnapshotResponse<NodeId>,
                openraft::error::RaftError<NodeId, openraft::error::InstallSnapshotError>,
            >;
            if let Ok(Ok(reply)) = decode_raft_message::<Reply>(bytes) {
                let _ = peer_gate::check_install_snapshot_reply(&reply);
            }
        }
        _ => {
            if let Ok(entry) = decode_raft_message::<Entry<TypeConfig>>(bytes) {
                if let EntryPayload::Normal(LogPayload(payload)) = entry.payload {
                    if let Ok(command) = cairn_fsm::Command::decode(&payload) {
                        let store = cairn_fsm::Store::new(Default::default());
                        let _ = store.apply_owned(1, command);
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------- snapshots

fn snapshot_seed() -> Vec<u8> {
    let header = SnapshotHeader {
        leases: Vec::new(),
        cluster_id: "c0ffee".into(),
        last_log_index: 9,
        last_log_term: 2,
        last_log_leader_node_id: 1,
        membership: serde_json::json!({"log_id": null, "membership": {"configs": [], "nodes": {}}}),
        resource_count: 2,
        created_at_unix_ms: 1,
        applied_initial_entry: false,
        pending_restore: None,
        cluster_version: None,
        cluster_version_downgrade: None,
        space_quota_bytes: None,
        nospace_alarm_index: None,
        corrupt_members: Vec::new(),
        corrupt_alarm_index: None,
    };
    let mut encoder = SnapshotEncoder::new(Vec::new(), &header).expect("encoder");
    encoder.append(&resource("a")).expect("append");
    encoder.append(&resource("b")).expect("append");
    encoder.finish().expect("finish").0
}

/// Reads a snapshot file or restore upload whole, as `verify` does, then
/// restores what it held into a store, as a restore does.
fn read_snapshot(bytes: &[u8]) {
    let Ok(mut reader) = SnapshotReader::new(Cursor::new(bytes)) else {
        return;
    };
    let mut resources = Vec::new();
    loop {
        match reader.next_resource() {
            Ok(Some(r)) => resources.push(r),
            Ok(None) => break,
            Err(_) => return,
        }
    }
    let store = cairn_fsm::Store::new(Default::default());
    let mut restoration = store.restore();
    for r in resources {
        if restoration.apply(r).is_err() {
            restoration.abort();
            return;
        }
    }
    let _ = restoration.commit(reader.header.last_log_index.max(1));
}

// ---------------------------------------------------------------- config

const CONFIG_SEED: &str = r#"node_id = 1
data_dir = "/tmp/cairn-fuzz"
election_timeout_ms = 2000
list_results_max = 500
list_page_size_max = 50
watches_max = 100
[[members]]
id = 1
peer_address = "127.0.0.1:8001"
client_address = "127.0.0.1:7001"
"#;

fn load_config(text: &[u8]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cairn.toml");
    std::fs::write(&path, text).expect("write");
    let flags = figment::providers::Serialized::defaults(serde_json::json!({}));
    let _ = cairn_server::config::Config::load(Some(&path), flags);
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn protobuf_requests_never_panic_on_arbitrary_bytes(kind in 0usize..8, bytes in arbitrary_bytes()) {
        decode_request(kind, &bytes);
    }

    #[test]
    fn protobuf_requests_never_panic_on_mutated_requests(seed in 0usize..8, m in mutations()) {
        let (kind, bytes) = request_seeds()[seed].clone();
        decode_request(kind, &mutate(bytes, &m));
    }

    #[test]
    fn raft_messages_never_panic_on_arbitrary_bytes(kind in 0usize..7, bytes in arbitrary_bytes()) {
        decode_raft(kind, &bytes);
    }

    #[test]
    fn raft_messages_never_panic_on_mutated_messages(seed in 0usize..7, m in mutations()) {
        let (kind, bytes) = raft_seeds()[seed].clone();
        decode_raft(kind, &mutate(bytes, &m));
    }

    #[test]
    fn snapshot_files_never_panic_on_arbitrary_bytes(bytes in arbitrary_bytes()) {
        read_snapshot(&bytes);
    }

    #[test]
    fn snapshot_files_never_panic_when_mutated(m in mutations()) {
        read_snapshot(&mutate(snapshot_seed(), &m));
    }

    #[test]
    fn config_files_never_panic_on_arbitrary_text(bytes in arbitrary_bytes()) {
        load_config(&bytes);
    }

    #[test]
    fn config_files_never_panic_when_mutated(m in mutations()) {
        load_config(&mutate(CONFIG_SEED.as_bytes().to_vec(), &m));
    }
}

#[test]
fn the_seeds_are_valid_so_that_mutations_reach_deep() {
    // Every seed decodes and passes its checks before it is mutated.
    for (kind, bytes) in raft_seeds() {
        match kind {
            0 => {
                let rpc: AppendEntriesRequest<TypeConfig> = decode_raft_message(&bytes).unwrap();
                peer_gate::check_append_entries(&rpc, 1, peer_gate::ENTRIES_MAX).unwrap();
            }
            1 => {
                let rpc: VoteRequest<NodeId> = decode_raft_message(&bytes).unwrap();
                peer_gate::check_vote_request(&rpc, 2).unwrap();
            }
            2 => {
                let rpc: InstallSnapshotRequest<TypeConfig> = decode_raft_message(&bytes).unwrap();
                peer_gate::check_install_snapshot(&rpc, 1, peer_gate::SNAPSHOT_CHUNK_BYTES_MAX)
                    .unwrap();
            }
            _ => {}
        }
    }
    let mut reader = SnapshotReader::new(Cursor::new(snapshot_seed())).unwrap();
    let mut count = 0;
    while reader.next_resource().unwrap().is_some() {
        count += 1;
    }
    assert_eq!(count, 2);
    for (kind, bytes) in request_seeds() {
        if kind == 0 {
            let r = pb::WriteRequest::decode(bytes.as_slice()).unwrap();
            cairn_forwarding::checks::write(&Default::default(), &r).unwrap();
        }
        if kind == 3 {
            // The list seed's page token is one a node accepts.
            let r = pb::ListRequest::decode(bytes.as_slice()).unwrap();
            cairn_forwarding::checks::list(&Default::default(), &r).unwrap();
        }
        if kind == 7 {
            let r = pb::ForwardedList::decode(bytes.as_slice()).unwrap();
            cairn_fsm::ReadScope::from_wire(r.read_scope.as_ref().unwrap()).unwrap();
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cairn.toml");
    std::fs::write(&path, CONFIG_SEED).unwrap();
    let flags = figment::providers::Serialized::defaults(serde_json::json!({}));
    let config = cairn_server::config::Config::load(Some(&path), flags).unwrap();
    assert_eq!(config.list_results_max, 500);
    assert_eq!(config.list_page_size_max, 50);
}
