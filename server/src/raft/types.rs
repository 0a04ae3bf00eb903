//! Cairn's openraft type configuration ([`TypeConfig`]) and the types it names: a member's
//! addresses ([`NodeInfo`]), a log entry's payload ([`LogPayload`]), what applying an entry
//! produced ([`Reply`]), and the aliases the rest of `raft/` uses. Every other file of the
//! module stands on these; this one imports none of them.

use std::fmt;

use bytes::Bytes;
use cairn_fsm::{Applied, StoredResource};
use cairn_proto::error::ApiError;
use cairn_proto::v1 as pb;
use serde::{Deserialize, Serialize};

/// A member's addresses, as stored in the Raft membership.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub peer_address: String,
    pub client_address: String,
}

impl fmt::Display for NodeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "peer={} client={}",
            self.peer_address, self.client_address
        )
    }
}

/// The payload of a normal log entry: an encoded `cairn_fsm::Command`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogPayload(#[serde(with = "serde_bytes_compat")] pub Bytes);

/// Serde for a `Bytes` field: written as serde bytes (bincode: a length and the
/// bytes), read back with one copy. Read as a `Vec<u8>` it went through serde's
/// sequence visitor one byte at a time (about 24 instructions a byte, 28 % of a
/// follower's instructions per write at 64 clients); the encoding is the same
/// either way, so logs and peers of either form agree.
mod serde_bytes_compat {
    use std::fmt;

    use bytes::Bytes;
    use serde::de::{SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(bytes)
    }

    /// Borrowed from the input where the format allows (bincode from a slice, as the
    /// peer port and the log read it: the length is checked against the input, and
    /// nothing is allocated before), then copied once.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        d.deserialize_bytes(BytesVisitor)
    }

    struct BytesVisitor;

    impl<'de> Visitor<'de> for BytesVisitor {
        type Value = Bytes;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("bytes")
        }

        fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Bytes, E> {
            Ok(Bytes::copy_from_slice(v))
        }

        fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
            Ok(Bytes::from(v))
        }

        /// Formats without a bytes type (JSON, say) write bytes as a sequence.
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
            // The hint comes from the input: bounded, never trusted for the allocation.
            let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64 * 1024));
            while let Some(b) = seq.next_element::<u8>()? {
                v.push(b);
            }
            Ok(Bytes::from(v))
        }
    }

    #[cfg(test)]
    mod tests {
        use super::super::LogPayload;
        use bytes::Bytes;

        fn config() -> bincode::config::Configuration {
            bincode::config::standard()
        }

        #[test]
        fn a_payload_reads_back_as_written_and_as_the_vec_form_wrote_it() {
            for len in [0usize, 1, 127, 128, 300, 70_000] {
                let payload = LogPayload(Bytes::from(
                    (0..len).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>(),
                ));
                let encoded = bincode::serde::encode_to_vec(&payload, config()).unwrap();
                // A Vec<u8> field, the form this replaced, encodes the same bytes.
                let as_vec = bincode::serde::encode_to_vec(payload.0.to_vec(), config()).unwrap();
                assert_eq!(encoded, as_vec, "{len} bytes");
                let (back, read): (LogPayload, usize) =
                    bincode::serde::borrow_decode_from_slice(&encoded, config()).unwrap();
                assert_eq!((back, read), (payload.clone(), encoded.len()));
                let (owned, _): (LogPayload, usize) =
                    bincode::serde::decode_from_slice(&encoded, config()).unwrap();
                assert_eq!(owned, payload);
                let json = serde_json::to_string(&payload).unwrap();
                assert_eq!(serde_json::from_str::<LogPayload>(&json).unwrap(), payload);
            }
        }

        #[test]
        fn a_payload_longer_than_its_input_is_an_error_not_an_allocation() {
            let mut encoded =
                bincode::serde::encode_to_vec(LogPayload(Bytes::from_static(b"abc")), config())
                    .unwrap();
            encoded.truncate(encoded.len() - 1);
            assert!(
                bincode::serde::decode_from_slice::<LogPayload, _>(&encoded, config()).is_err()
            );
            // A length of 2^62 (varint: 253 then a little-endian u64) before 3 bytes.
            let mut huge = vec![253u8];
            huge.extend_from_slice(&(1u64 << 62).to_le_bytes());
            huge.extend_from_slice(b"abc");
            assert!(bincode::serde::decode_from_slice::<LogPayload, _>(&huge, config()).is_err());
        }
    }
}

/// What applying one entry produced. Only ever handed to the proposer on the
/// same node, but openraft requires it to be serializable: it is encoded with
/// the same protobuf messages and error mapping as the wire.
#[derive(Debug, Clone)]
pub struct Reply(pub Result<Applied, ApiError>);

#[derive(Serialize, Deserialize)]
enum ReplyWire {
    /// The stored resource's encoding.
    Written(#[serde(with = "serde_bytes_compat")] Bytes),
    Deleted(bool),
    RestoreBegun,
    RestoreChunkAdded(u64),
    Restored(u64),
    RestoreAborted(bool),
    /// Serialized for completeness; never read back (see `Deserialize`).
    Batch(Vec<ReplyWire>),
    Error {
        code: i32,
        message: String,
        details: Vec<u8>,
    },
    /// The cluster version after the entry: (major, minor), and the pinned downgrade's.
    ClusterVersion((u32, u32), Option<(u32, u32)>),
    /// The space quota after the entry, and the index that raised NOSPACE, if raised.
    Capacity(u64, Option<u64>),
    /// What a lease command did.
    Lease(LeaseWire),
    /// A delete that only marked: the stored resource's encoding.
    Marked(#[serde(with = "serde_bytes_compat")] Bytes),
    /// A collection step: how many resources it changed.
    Collected(u64),
    /// The CORRUPT alarm after the entry: the members named and the index that raised it.
    Integrity(Vec<u64>, u64),
}

/// [`cairn_fsm::LeaseApplied`], field by field.
#[derive(Serialize, Deserialize)]
enum LeaseWire {
    /// id, ttl_ms, granted_revision, renewed_revision.
    Granted([u64; 4]),
    Revoked {
        existed: bool,
        deleted: u64,
    },
    KeptAlive(Vec<(u64, u64)>),
    Expired {
        expired: Vec<u64>,
        deleted: u64,
    },
}

impl LeaseWire {
    fn of(applied: &cairn_fsm::LeaseApplied) -> LeaseWire {
        use cairn_fsm::LeaseApplied as A;
        match applied {
            A::Granted(l) => {
                LeaseWire::Granted([l.id, l.ttl_ms, l.granted_revision, l.renewed_revision])
            }
            A::Revoked { existed, deleted } => LeaseWire::Revoked {
                existed: *existed,
                deleted: *deleted,
            },
            A::KeptAlive(answers) => LeaseWire::KeptAlive(answers.clone()),
            A::Expired { expired, deleted } => LeaseWire::Expired {
                expired: expired.clone(),
                deleted: *deleted,
            },
        }
    }

    fn applied(self) -> cairn_fsm::LeaseApplied {
        use cairn_fsm::LeaseApplied as A;
        match self {
            LeaseWire::Granted([id, ttl_ms, granted_revision, renewed_revision]) => {
                A::Granted(cairn_fsm::Lease {
                    id,
                    ttl_ms,
                    granted_revision,
                    renewed_revision,
                })
            }
            LeaseWire::Revoked { existed, deleted } => A::Revoked { existed, deleted },
            LeaseWire::KeptAlive(answers) => A::KeptAlive(answers),
            LeaseWire::Expired { expired, deleted } => A::Expired { expired, deleted },
        }
    }
}

impl ReplyWire {
    fn of(reply: &Result<Applied, ApiError>) -> ReplyWire {
        match reply {
            Ok(Applied::Written(resource)) => ReplyWire::Written(resource.encoded().clone()),
            Ok(Applied::Deleted { existed }) => ReplyWire::Deleted(*existed),
            Ok(Applied::RestoreBegun) => ReplyWire::RestoreBegun,
            Ok(Applied::RestoreChunkAdded { received }) => ReplyWire::RestoreChunkAdded(*received),
            Ok(Applied::Restored { resource_count }) => ReplyWire::Restored(*resource_count),
            Ok(Applied::RestoreAborted { existed }) => ReplyWire::RestoreAborted(*existed),
            Ok(Applied::ClusterVersion(state)) => ReplyWire::ClusterVersion(
                (state.version.major, state.version.minor),
                state.downgrade.map(|v| (v.major, v.minor)),
            ),
            Ok(Applied::Capacity(space)) => {
                ReplyWire::Capacity(space.quota_bytes, space.alarm_index)
            }
            Ok(Applied::Lease(applied)) => ReplyWire::Lease(LeaseWire::of(applied)),
            Ok(Applied::Marked(resource)) => ReplyWire::Marked(resource.encoded().clone()),
            Ok(Applied::Collected { changed }) => ReplyWire::Collected(*changed),
            Ok(Applied::Integrity(alarm)) => {
                ReplyWire::Integrity(alarm.members.clone(), alarm.raised_index)
            }
            Ok(Applied::Batch(results)) => ReplyWire::Batch(
                results
                    .iter()
                    .map(|r| ReplyWire::of(&r.clone().map_err(ApiError::from)))
                    .collect(),
            ),
            Err(error) => {
                let status = tonic::Status::from(error.clone());
                ReplyWire::Error {
                    code: status.code() as i32,
                    message: status.message().to_string(),
                    details: status.details().to_vec(),
                }
            }
        }
    }
}

impl Serialize for Reply {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        ReplyWire::of(&self.0).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Reply {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let reply = match ReplyWire::deserialize(d)? {
            ReplyWire::Written(bytes) => {
                let resource: pb::Resource =
                    prost::Message::decode(bytes).map_err(serde::de::Error::custom)?;
                Ok(Applied::Written(StoredResource::from_resource(&resource)))
            }
            ReplyWire::Deleted(existed) => Ok(Applied::Deleted { existed }),
            ReplyWire::RestoreBegun => Ok(Applied::RestoreBegun),
            ReplyWire::RestoreChunkAdded(received) => Ok(Applied::RestoreChunkAdded { received }),
            ReplyWire::Restored(resource_count) => Ok(Applied::Restored { resource_count }),
            ReplyWire::RestoreAborted(existed) => Ok(Applied::RestoreAborted { existed }),
            ReplyWire::ClusterVersion((major, minor), downgrade) => {
                Ok(Applied::ClusterVersion(cairn_fsm::ClusterVersionState {
                    version: cairn_fsm::ClusterVersion::new(major, minor),
                    downgrade: downgrade
                        .map(|(major, minor)| cairn_fsm::ClusterVersion::new(major, minor)),
                }))
            }
            ReplyWire::Capacity(quota_bytes, alarm_index) => {
                Ok(Applied::Capacity(cairn_fsm::SpaceState {
                    quota_bytes,
                    alarm_index,
                }))
            }
            ReplyWire::Lease(wire) => Ok(Applied::Lease(wire.applied())),
            ReplyWire::Marked(bytes) => {
                let resource: pb::Resource =
                    prost::Message::decode(bytes).map_err(serde::de::Error::custom)?;
                Ok(Applied::Marked(StoredResource::from_resource(&resource)))
            }
            ReplyWire::Collected(changed) => Ok(Applied::Collected { changed }),
            ReplyWire::Integrity(members, raised_index) => {
                Ok(Applied::Integrity(cairn_fsm::CorruptAlarm {
                    members,
                    raised_index,
                }))
            }
            // A reply only ever goes to the proposer on the node that applied
            // the entry (openraft never sends it); a batch's per-command fsm
            // errors have no lossless way back from the wire form.
            ReplyWire::Batch(_) => {
                return Err(serde::de::Error::custom(
                    "a batch reply is never read back from its serialized form",
                ))
            }
            ReplyWire::Error {
                code,
                message,
                details,
            } => {
                let status =
                    tonic::Status::with_details(code.into(), message, Bytes::from(details));
                Err(ApiError::from_status(&status))
            }
        };
        Ok(Reply(reply))
    }
}

openraft::declare_raft_types!(
    /// Cairn's openraft type configuration.
    pub TypeConfig:
        D = LogPayload,
        R = Reply,
        NodeId = u64,
        Node = NodeInfo,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
pub type LogStore = cairn_raft_log::LogStore<TypeConfig>;
pub type Membership = openraft::StoredMembership<NodeId, NodeInfo>;
