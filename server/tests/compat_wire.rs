//! The peer messages of release 0.2.0, as it sent them between members, read by this
//! build: `tests/compat/0.2.0/wire/peer-*.bin` (`tests/compat/README.md`).
//!
//! A member talks to the others with `RaftService` (`raft.proto`): each request and reply
//! is a `RaftMessage` (cluster id, sender, the cluster version its build supports) whose
//! payload is openraft's own request or reply type, encoded with bincode 2 over serde
//! (`cairn_server::raft::{encode_raft_message, decode_raft_message}`). During a rolling
//! upgrade members of different releases replicate to each other, either way round, so
//! every later build must read these bytes and write the same ones.
//!
//! **What this guards above all is a dependency upgrade.** The payload is not a schema of
//! ours: it is whatever serde derives for openraft's types (`AppendEntriesRequest`,
//! `Entry`, `Membership`, `Vote`, `LogId`, `RaftError`...) as bincode lays them out, with
//! no field tags and no version. Upgrading openraft (0.10 is being considered: its log ids,
//! votes and errors change shape) or bincode, or changing the bincode configuration, can
//! change the bytes without a compile error or any other test failing, and a mixed cluster
//! would then stop replicating. For every request and reply of every RPC the fixture decodes
//! (the `RaftMessage` with prost, its payload with the node's own decoder) to the sample
//! below, and encoding the sample (with the node's own encoder) gives exactly the fixture's
//! bytes.
//!
//! Every RPC of `RaftService` (read from `raft.proto`) must have request and reply fixtures,
//! and every variant of the payload enums the samples cover is matched exhaustively below
//! (a new openraft variant does not compile until it has a sample). The samples and the
//! files never change; a new message gets a new sample and a new file, written once
//! (`CAIRN_WRITE_WIRE_FIXTURES=1`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use bytes::Bytes;
use cairn_fsm::Command;
use cairn_proto::google::protobuf::Any;
use cairn_proto::v1::{self as pb, RaftMessage};
use cairn_server::raft::{
    decode_raft_message, encode_raft_message, LogPayload, NodeId, NodeInfo, TypeConfig,
};
use cairn_test_support::fixtures::{self, FixtureDir};
use openraft::error::{Fatal, InstallSnapshotError, RaftError, SnapshotMismatch};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{
    AnyError, CommittedLeaderId, Entry, EntryPayload, LogId, Membership, SnapshotMeta,
    SnapshotSegmentId, StorageError, StorageIOError, StoredMembership, Vote,
};
use prost::Message;
use serde::de::DeserializeOwned;
use serde::Serialize;

use cairn_server::raft::integrity::{DigestAnswer, DigestQuestion, DigestReply};

const RAFT_PROTO: &str = include_str!("../../proto/proto/cairn/v1/raft.proto");

/// The cluster id every sample's envelope carries (as a cluster's id is: 32 hex digits).
const CLUSTER_ID: &str = "5e1f0c2a7b3d4e6f8091a2b3c4d5e6f7";

/// What a 0.2.0 build puts in `cluster_version_supported_{major,minor}` of every message
/// (`ClusterVersion::SUPPORTED_MAX` of that release; a later build says more, but these
/// bytes stay as 0.2.0 sent them).
const SUPPORTED_0_2_0: (u32, u32) = (0, 2);

/// The leader of the samples, and the follower that answers it.
const LEADER: NodeId = 1;
const FOLLOWER: NodeId = 2;

fn fixture_dir() -> FixtureDir {
    FixtureDir::in_workspace(env!("CARGO_MANIFEST_DIR"), "tests/compat/0.2.0/wire")
}

fn log_id(term: u64, leader: NodeId, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, leader), index)
}

fn node(id: NodeId) -> NodeInfo {
    NodeInfo {
        peer_address: format!("10.0.0.{id}:8301"),
        client_address: format!("10.0.0.{id}:8300"),
    }
}

/// Three voters and a learner (a member being added).
fn membership() -> Membership<NodeId, NodeInfo> {
    let nodes: BTreeMap<NodeId, NodeInfo> = (1..=4).map(|id| (id, node(id))).collect();
    Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes)
}

/// A change of membership under way: the joint configuration of {1, 2, 3} and {1, 2, 4}.
fn joint_membership() -> Membership<NodeId, NodeInfo> {
    let nodes: BTreeMap<NodeId, NodeInfo> = (1..=4).map(|id| (id, node(id))).collect();
    Membership::new(
        vec![BTreeSet::from([1, 2, 3]), BTreeSet::from([1, 2, 4])],
        nodes,
    )
}

/// A write as a client sends it, as the leader proposes it.
fn write_command() -> Command {
    Command::Write {
        resource: pb::Resource {
            id: Some(pb::Id {
                uid: "01J9ZK3Q4V6W7X8Y9Z0A1B2C3E".into(),
                name: "web-1".into(),
                r#type: Some(pb::Type {
                    group: "catalog".into(),
                    group_version: "v2".into(),
                    kind: "Endpoint".into(),
                }),
                tenancy: Some(pb::Tenancy {
                    partition: "default".into(),
                    namespace: "prod".into(),
                }),
            }),
            metadata: BTreeMap::from([("team".into(), "blue".into())]),
            data: Some(Any {
                type_url: "type.googleapis.com/catalog.v2.Endpoint".into(),
                value: Bytes::from_static(b"\x0a\x05web-1\x10\x50"),
            }),
            ..Default::default()
        },
    }
}

/// Every kind of log entry: the leader's blank entry of its term, a membership (a joint
/// one) and a normal entry holding a command.
fn entries() -> Vec<Entry<TypeConfig>> {
    let payloads: Vec<EntryPayload<TypeConfig>> = vec![
        EntryPayload::Blank,
        EntryPayload::Membership(joint_membership()),
        EntryPayload::Normal(LogPayload(write_command().encode())),
    ];
    for payload in &payloads {
        // A new kind of entry does not compile until it has a sample here.
        match payload {
            EntryPayload::Blank | EntryPayload::Membership(_) | EntryPayload::Normal(_) => {}
        }
    }
    payloads
        .into_iter()
        .zip(41..)
        .map(|(payload, index)| Entry {
            log_id: log_id(5, LEADER, index),
            payload,
        })
        .collect()
}

fn append_entries(entries: Vec<Entry<TypeConfig>>) -> AppendEntriesRequest<TypeConfig> {
    AppendEntriesRequest {
        vote: Vote::new_committed(5, LEADER),
        prev_log_id: Some(log_id(4, 3, 40)),
        entries,
        leader_commit: Some(log_id(4, 3, 39)),
    }
}

/// What an AppendEntries reply can be, by the fixture's name for it. A new variant does not
/// compile until it is named here, and given a sample and a place in the coverage test.
fn append_entries_variant(response: &AppendEntriesResponse<NodeId>) -> &'static str {
    match response {
        AppendEntriesResponse::Success => "success",
        AppendEntriesResponse::PartialSuccess(_) => "partial-success",
        AppendEntriesResponse::Conflict => "conflict",
        AppendEntriesResponse::HigherVote(_) => "higher-vote",
    }
}

/// What a reply's error can be, by the fixture's name for it. A new variant does not compile
/// until it is named here, and given a sample and a place in the coverage test.
fn fatal_variant(fatal: &Fatal<NodeId>) -> &'static str {
    match fatal {
        Fatal::StorageError(_) => "storage-error",
        Fatal::Panicked => "panicked",
        Fatal::Stopped => "stopped",
    }
}

/// A node whose log store failed.
fn storage_error() -> Fatal<NodeId> {
    Fatal::StorageError(StorageError::from(StorageIOError::write_logs(
        AnyError::error("No space left on device (os error 28)")
            .with_type(Some("std::io::error::Error")),
    )))
}

type Check = Box<dyn Fn(&[u8]) -> Result<(), String>>;

/// One fixture: its file, the RPC and the side it belongs to, the whole `RaftMessage` as
/// 0.2.0 encoded it, and the check of a payload's bytes against the sample.
struct Row {
    name: &'static str,
    rpc: &'static str,
    envelope: RaftMessage,
    check_payload: Check,
}

/// The fixture `name` holds a message of `rpc` from `sender` around `sample`, compared with
/// `==`.
fn row<T>(name: &'static str, rpc: &'static str, sender: NodeId, sample: T) -> Row
where
    T: Serialize + DeserializeOwned + PartialEq + Debug + 'static,
{
    row_by(name, rpc, sender, sample, |a: &T, b: &T| a == b)
}

/// As [`row`], for a type without `PartialEq` (openraft's `AppendEntriesRequest`,
/// `Entry`): compared by their `Debug` text, which shows every field.
fn row_debug<T>(name: &'static str, rpc: &'static str, sender: NodeId, sample: T) -> Row
where
    T: Serialize + DeserializeOwned + Debug + 'static,
{
    row_by(name, rpc, sender, sample, |a: &T, b: &T| {
        format!("{a:?}") == format!("{b:?}")
    })
}

fn row_by<T>(
    name: &'static str,
    rpc: &'static str,
    sender: NodeId,
    sample: T,
    same: fn(&T, &T) -> bool,
) -> Row
where
    T: Serialize + DeserializeOwned + Debug + 'static,
{
    let payload = encode_raft_message(&sample).expect("a sample encodes");
    let type_name = std::any::type_name::<T>();
    Row {
        name,
        rpc,
        envelope: RaftMessage {
            cluster_id: CLUSTER_ID.into(),
            payload,
            sender_node_id: sender,
            cluster_version_supported_major: SUPPORTED_0_2_0.0,
            cluster_version_supported_minor: SUPPORTED_0_2_0.1,
            // The fixtures were written before the envelope reported data_bytes_max: they
            // stand for a sender that reports none, which every reader must accept.
            data_bytes_max: 0,
        },
        check_payload: Box::new(move |bytes: &[u8]| match decode_raft_message::<T>(bytes) {
            Ok(decoded) if same(&decoded, &sample) => Ok(()),
            Ok(decoded) => Err(format!(
                "the payload decodes as {type_name} to {decoded:?}, not the sample {sample:?}"
            )),
            Err(e) => Err(format!("the payload does not decode as {type_name}: {e}")),
        }),
    }
}

type AppendEntriesReply = Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>;
type VoteReply = Result<VoteResponse<NodeId>, RaftError<NodeId>>;
type InstallSnapshotReply =
    Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>;

/// Every request and reply of `RaftService`, by the fixture that holds it. Never changed:
/// add rows. A reply is what the receiver's `RaftRpcService` encodes: openraft's answer, or
/// its error.
fn samples() -> Vec<Row> {
    let snapshot_meta = SnapshotMeta {
        last_log_id: Some(log_id(5, LEADER, 199)),
        last_membership: StoredMembership::new(Some(log_id(4, 3, 12)), membership()),
        snapshot_id: "5-199-9c0f3e21".into(),
    };
    vec![
        row_debug(
            "peer-append-entries-request.bin",
            "AppendEntries",
            LEADER,
            append_entries(entries()),
        ),
        // One message of each direction of the AppendEntries stream: the same envelopes as
        // the unary call's (so the same bytes as peer-append-entries-request.bin and
        // peer-append-entries-response-success.bin).
        row_debug(
            "peer-append-entries-stream-request.bin",
            "AppendEntriesStream",
            LEADER,
            append_entries(entries()),
        ),
        row(
            "peer-append-entries-stream-response-success.bin",
            "AppendEntriesStream",
            FOLLOWER,
            AppendEntriesReply::Ok(AppendEntriesResponse::Success),
        ),
        row_debug(
            "peer-append-entries-request-heartbeat.bin",
            "AppendEntries",
            LEADER,
            append_entries(Vec::new()),
        ),
        row(
            "peer-append-entries-response-success.bin",
            "AppendEntries",
            FOLLOWER,
            AppendEntriesReply::Ok(AppendEntriesResponse::Success),
        ),
        row(
            "peer-append-entries-response-partial-success.bin",
            "AppendEntries",
            FOLLOWER,
            AppendEntriesReply::Ok(AppendEntriesResponse::PartialSuccess(Some(log_id(
                5, LEADER, 42,
            )))),
        ),
        row(
            "peer-append-entries-response-conflict.bin",
            "AppendEntries",
            FOLLOWER,
            AppendEntriesReply::Ok(AppendEntriesResponse::Conflict),
        ),
        row(
            "peer-append-entries-response-higher-vote.bin",
            "AppendEntries",
            FOLLOWER,
            AppendEntriesReply::Ok(AppendEntriesResponse::HigherVote(Vote::new(6, 3))),
        ),
        row(
            "peer-append-entries-response-storage-error.bin",
            "AppendEntries",
            FOLLOWER,
            AppendEntriesReply::Err(RaftError::Fatal(storage_error())),
        ),
        row(
            "peer-vote-request.bin",
            "Vote",
            3,
            VoteRequest::new(Vote::new(6, 3), Some(log_id(5, LEADER, 43))),
        ),
        row(
            "peer-vote-response-granted.bin",
            "Vote",
            FOLLOWER,
            VoteReply::Ok(VoteResponse::new(
                Vote::new(6, 3),
                Some(log_id(5, LEADER, 43)),
                true,
            )),
        ),
        row(
            "peer-vote-response-refused.bin",
            "Vote",
            FOLLOWER,
            VoteReply::Ok(VoteResponse::new(
                Vote::new_committed(5, LEADER),
                Some(log_id(5, LEADER, 44)),
                false,
            )),
        ),
        row(
            "peer-vote-response-stopped.bin",
            "Vote",
            FOLLOWER,
            VoteReply::Err(RaftError::Fatal(Fatal::Stopped)),
        ),
        row(
            "peer-vote-response-panicked.bin",
            "Vote",
            FOLLOWER,
            VoteReply::Err(RaftError::Fatal(Fatal::Panicked)),
        ),
        row(
            "peer-install-snapshot-request.bin",
            "InstallSnapshot",
            LEADER,
            InstallSnapshotRequest::<TypeConfig> {
                vote: Vote::new_committed(5, LEADER),
                meta: snapshot_meta,
                offset: 65_536,
                data: (0..64u8).map(|i| i.wrapping_mul(37)).collect(),
                done: false,
            },
        ),
        row(
            "peer-install-snapshot-response.bin",
            "InstallSnapshot",
            FOLLOWER,
            InstallSnapshotReply::Ok(InstallSnapshotResponse {
                vote: Vote::new_committed(5, LEADER),
            }),
        ),
        row(
            "peer-install-snapshot-response-mismatch.bin",
            "InstallSnapshot",
            FOLLOWER,
            InstallSnapshotReply::Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(
                SnapshotMismatch {
                    expect: SnapshotSegmentId {
                        id: "5-199-9c0f3e21".into(),
                        offset: 0,
                    },
                    got: SnapshotSegmentId {
                        id: "5-199-9c0f3e21".into(),
                        offset: 65_536,
                    },
                },
            ))),
        ),
        // `RaftService.Members`: an empty question, answered with the node ids of the
        // receiver's current membership.
        row("peer-members-request.bin", "Members", 4, ()),
        row(
            "peer-members-response.bin",
            "Members",
            FOLLOWER,
            Vec::<NodeId>::from([1, 2, 3, 4]),
        ),
        // `RaftService.StateDigest`: the leader's consistency check asks for a member's table
        // digest at an index; the member answers it, or that it has not applied it yet, or
        // that it no longer keeps it.
        row(
            "peer-state-digest-request.bin",
            "StateDigest",
            LEADER,
            DigestQuestion {
                index: 12,
                wait_ms: 2000,
                check_soon: false,
            },
        ),
        row(
            "peer-state-digest-response-known.bin",
            "StateDigest",
            FOLLOWER,
            DigestReply {
                answer: DigestAnswer::Known(0x3f89_f266_51e1_d573),
                build: "0.2.0".into(),
            },
        ),
        row(
            "peer-state-digest-response-not-yet.bin",
            "StateDigest",
            FOLLOWER,
            DigestReply {
                answer: DigestAnswer::NotYet { applied_index: 10 },
                build: "0.2.0".into(),
            },
        ),
        row(
            "peer-state-digest-response-forgotten.bin",
            "StateDigest",
            FOLLOWER,
            DigestReply {
                answer: DigestAnswer::Forgotten { oldest_index: 40 },
                build: "0.2.0".into(),
            },
        ),
    ]
}

#[test]
fn every_peer_message_of_0_2_0_decodes_and_encodes_to_its_fixture() {
    let dir = fixture_dir();
    let mut failures = Vec::new();
    for row in samples() {
        let path = dir.path(row.name);
        let encoded = row.envelope.encode_to_vec();
        let fixture = match dir.bytes(row.name, &encoded) {
            Ok(bytes) => bytes,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        match RaftMessage::decode(fixture.as_slice()) {
            Err(e) => failures.push(format!(
                "{}: does not decode as a RaftMessage: {e}",
                path.display()
            )),
            Ok(message) => {
                let envelope = |m: &RaftMessage| {
                    (
                        m.cluster_id.clone(),
                        m.sender_node_id,
                        m.cluster_version_supported_major,
                        m.cluster_version_supported_minor,
                    )
                };
                if envelope(&message) != envelope(&row.envelope) {
                    failures.push(format!(
                        "{}: the envelope (cluster id, sender, supported version) decodes to \
                         {:?}, not {:?}",
                        path.display(),
                        envelope(&message),
                        envelope(&row.envelope)
                    ));
                }
                if let Err(e) = (row.check_payload)(&message.payload) {
                    failures.push(format!("{}: {e}", path.display()));
                }
            }
        }
        if encoded != fixture {
            failures.push(format!(
                "{}: the sample encodes to other bytes than the fixture's ({} bytes, not {}): \
                 a 0.2.0 member would not read what this build sends\n    fixture: {:02x?}\n    \
                 encoded: {:02x?}",
                path.display(),
                encoded.len(),
                fixture.len(),
                fixture,
                encoded
            ));
        }
    }
    fixtures::assert_no_failures("peer message", &failures);
}

#[test]
fn every_raft_rpc_and_reply_variant_has_a_fixture_and_every_fixture_a_sample() {
    let rows = samples();
    let names: BTreeSet<&str> = rows.iter().map(|r| r.name).collect();
    let mut failures = Vec::new();
    for row in &rows {
        let prefix = format!("peer-{}-", fixtures::kebab(row.rpc));
        if !row.name.starts_with(&prefix) {
            failures.push(format!(
                "{}: a {} message, named otherwise",
                row.name, row.rpc
            ));
        }
    }
    let rpcs = fixtures::rpcs(RAFT_PROTO);
    assert!(rpcs.len() >= 4, "raft.proto's RPCs not read: {rpcs:?}");
    for rpc in &rpcs {
        for side in ["request", "response"] {
            let prefix = format!("peer-{}-{side}", fixtures::kebab(&rpc.name));
            if !names.iter().any(|n| n.starts_with(&prefix)) {
                failures.push(format!(
                    "RaftService.{} has no {side} sample ({prefix}*.bin)",
                    rpc.name
                ));
            }
        }
    }
    // Every variant of the replies and their errors, by the names the matches above give
    // (a variant added there is added here too).
    let replies = [
        AppendEntriesResponse::Success,
        AppendEntriesResponse::PartialSuccess(None),
        AppendEntriesResponse::Conflict,
        AppendEntriesResponse::HigherVote(Vote::default()),
    ];
    let errors = [storage_error(), Fatal::Panicked, Fatal::Stopped];
    let variants = replies
        .iter()
        .map(|r| {
            format!(
                "peer-append-entries-response-{}.bin",
                append_entries_variant(r)
            )
        })
        .chain(errors.iter().map(|f| format!("-{}.bin", fatal_variant(f))));
    for variant in variants {
        if !names.iter().any(|n| n.ends_with(&variant)) {
            failures.push(format!("no sample ends with {variant}"));
        }
    }
    // A fixture no sample reads is a fixture no test checks.
    for file in fixture_dir().names_with_prefix("peer-") {
        if !names.contains(file.as_str()) {
            failures.push(format!(
                "{}: no sample reads it",
                fixture_dir().path(&file).display()
            ));
        }
    }
    fixtures::assert_no_failures("peer message", &failures);
}
