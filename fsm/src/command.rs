//! State-machine commands and their encoding inside Raft log entries.
//!
//! An entry's payload is `[COMMAND_FORMAT_VERSION] ++ prost(cairn.v1.log.Command)`.
//! Maps are `BTreeMap`s in the generated types, so the encoding is a pure
//! function of the command: every node proposing the same command writes the
//! same bytes.

use bytes::{BufMut, Bytes};
use cairn_proto::v1::log::{self, command::Command as LogCommand};
use cairn_proto::v1::{Fence, Id, Resource, Status};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;

use crate::capacity::CapacityAction;
use crate::integrity::IntegrityAction;
use crate::version::{ClusterVersion, Feature, VersionAction};
use crate::FsmError;

/// The first byte of every encoded command. Bumped only if the framing
/// changes; the protobuf message itself evolves by adding fields.
pub const COMMAND_FORMAT_VERSION: u8 = 1;

/// A change to the resource table, as carried by one log entry.
// Writes are the common case; boxing the resource would cost an allocation
// per command and change the API the node is written against.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Compare-and-set write; `resource.version` is the expected version
    /// (empty = create).
    Write { resource: Resource },
    /// Compare-and-set delete of the lifetime `id.uid` at `version`. From cluster version
    /// 0.2 ([`crate::lifecycle`]) a resource with finalizers is only marked, at `now_ms`
    /// (the proposing leader's Unix time), and `orphan` keeps what it owns.
    Delete {
        id: Id,
        version: String,
        now_ms: u64,
        orphan: bool,
    },
    /// Starts an online restore of `resource_count` resources (see
    /// `crate::restore` for the rules of the four restore commands).
    RestoreBegin {
        restore_id: String,
        resource_count: u64,
        /// The backup's leases (`id`, `ttl_ms`): the commit installs them.
        leases: Vec<(u64, u64)>,
    },
    /// Adds resources to the pending restore `restore_id`.
    RestoreChunk {
        restore_id: String,
        resources: Vec<Resource>,
    },
    /// Swaps the pending restore in, at this entry's index.
    RestoreCommit { restore_id: String },
    /// Discards the pending restore, if it is `restore_id`.
    RestoreAbort { restore_id: String },
    /// Writes and deletes proposed together in one entry: applied in order at
    /// the entry's index, each with its own outcome ([`crate::Applied::Batch`]).
    /// Holds only `Write` and `Delete`.
    Batch { commands: Vec<Command> },
    /// Changes the cluster version (`crate::version`; since cluster version 0.2, which a
    /// raise from 0.1 needs no permission for: every member supports it by then).
    ClusterVersion {
        action: VersionAction,
        version: ClusterVersion,
    },
    /// Replaces the entry `key` of the `status` map of the resource `id` (whose uid must be
    /// given), if `version` is empty or the stored one. Needs cluster version 0.2
    /// ([`crate::Feature::StatusWrites`]).
    WriteStatus {
        id: Id,
        key: String,
        status: Status,
        version: String,
    },
    /// Changes the cluster's space quota or its `NOSPACE` alarm ([`crate::capacity`]).
    /// Needs cluster version 0.2 ([`crate::Feature::Capacity`]).
    Capacity { action: CapacityAction },
    /// Grants a lease of `ttl_ms` ([`crate::lease`]). Needs cluster version 0.2
    /// ([`crate::Feature::Leases`]), as every lease command and `Fenced` do.
    LeaseGrant { ttl_ms: u64 },
    /// Revokes the lease `id` and deletes what is attached to it (marks, at `now_ms`, what
    /// has finalizers).
    LeaseRevoke { id: u64, now_ms: u64 },
    /// Renews the leases `ids` at this entry.
    LeaseKeepAlive { ids: Vec<u64> },
    /// The leader's verdict that leases ran out: each `(id, renewed_revision)` is
    /// revoked if that is still its last renewal ([`crate::lease::expire_decision`]).
    LeaseExpire {
        leases: Vec<(u64, u64)>,
        now_ms: u64,
    },
    /// A write, delete or status write applied only while `fence` holds: the resource it
    /// names is stored at version `fence.token`.
    Fenced { fence: Fence, command: Box<Command> },
    /// One bounded step of collecting the dependents of `owner` ([`crate::lifecycle`]):
    /// proposed by the leader. Needs cluster version 0.2 ([`crate::Feature::Lifecycle`]).
    Collect { owner: Id, now_ms: u64 },
    /// Changes the `CORRUPT` alarm ([`crate::integrity`]). Needs cluster version 0.2
    /// ([`crate::Feature::Integrity`]).
    Integrity { action: IntegrityAction },
}

/// Tag of `Command.write` and `Command.delete`, and of `WriteCommand.resource`.
const TAG_WRITE: u32 = 1;
const TAG_WRITE_RESOURCE: u32 = 1;
/// Tags of `Command.batch` and `BatchCommand.commands`.
const TAG_BATCH: u32 = 7;
const TAG_BATCH_COMMANDS: u32 = 1;

impl Command {
    /// What the command needs of the cluster version: checked before it is proposed (by
    /// the node that receives it, then by the leader) and at apply, with
    /// [`crate::ClusterVersionState::require`]. A batch holds writes and deletes only.
    pub fn needs(&self) -> Option<Feature> {
        match self {
            Command::WriteStatus { .. } => Some(Feature::StatusWrites),
            Command::Capacity { .. } => Some(Feature::Capacity),
            Command::Integrity { .. } => Some(Feature::Integrity),
            Command::LeaseGrant { .. }
            | Command::LeaseRevoke { .. }
            | Command::LeaseKeepAlive { .. }
            | Command::LeaseExpire { .. }
            | Command::Fenced { .. } => Some(Feature::Leases),
            Command::Write { resource } if resource.lease != 0 => Some(Feature::Leases),
            Command::Delete { orphan: true, .. } | Command::Collect { .. } => {
                Some(Feature::Lifecycle)
            }
            Command::RestoreBegin { leases, .. } if !leases.is_empty() => Some(Feature::Leases),
            Command::Batch { commands } => commands.iter().find_map(Command::needs),
            Command::Write { .. }
            | Command::Delete { .. }
            | Command::RestoreBegin { .. }
            | Command::RestoreChunk { .. }
            | Command::RestoreCommit { .. }
            | Command::RestoreAbort { .. }
            | Command::ClusterVersion { .. } => None,
        }
    }

    /// Encodes the command: one version byte, then the protobuf message.
    /// Deterministic: equal commands give equal bytes.
    pub fn encode(&self) -> Bytes {
        match self {
            Command::Batch { commands } => {
                let encoded: Vec<Bytes> = commands
                    .iter()
                    .map(|c| {
                        assert!(
                            matches!(c, Command::Write { .. } | Command::Delete { .. }),
                            "a batch holds only writes and deletes"
                        );
                        c.encode()
                    })
                    .collect();
                Command::encode_batch(&encoded)
            }
            Command::Write { resource } => {
                // Hand-framed `Command { write: WriteCommand { resource } }` so the
                // resource is not cloned into a wrapper message; a test checks the
                // bytes equal prost's own encoding of the wrapper.
                let resource_len = resource.encoded_len();
                let write_len = key_len(TAG_WRITE_RESOURCE)
                    + encoded_len_varint(resource_len as u64)
                    + resource_len;
                let total_len =
                    1 + key_len(TAG_WRITE) + encoded_len_varint(write_len as u64) + write_len;
                let mut buf = Vec::with_capacity(total_len);
                buf.put_u8(COMMAND_FORMAT_VERSION);
                encode_key(TAG_WRITE, WireType::LengthDelimited, &mut buf);
                encode_varint(write_len as u64, &mut buf);
                encode_key(TAG_WRITE_RESOURCE, WireType::LengthDelimited, &mut buf);
                encode_varint(resource_len as u64, &mut buf);
                // A Vec grows on demand, so encoding into it cannot run out of room.
                let encoded = resource.encode(&mut buf);
                assert!(encoded.is_ok(), "encoding into a Vec cannot fail");
                assert_eq!(buf.len(), total_len, "command length as computed");
                Bytes::from(buf)
            }
            other => {
                let message = log::Command {
                    command: Some(other.to_log()),
                };
                let mut buf = Vec::with_capacity(1 + message.encoded_len());
                buf.put_u8(COMMAND_FORMAT_VERSION);
                let encoded = message.encode(&mut buf);
                assert!(encoded.is_ok(), "encoding into a Vec cannot fail");
                Bytes::from(buf)
            }
        }
    }

    /// The protobuf form of every command but a batch (hand-framed; a write is too, but
    /// inside a fenced command it is a message like any other).
    fn to_log(&self) -> LogCommand {
        match self {
            Command::Batch { .. } => unreachable!("batches are hand-framed"),
            Command::Write { resource } => LogCommand::Write(log::WriteCommand {
                resource: Some(resource.clone()),
            }),
            Command::Delete {
                id,
                version,
                now_ms,
                orphan,
            } => LogCommand::Delete(log::DeleteCommand {
                id: Some(id.clone()),
                version: version.clone(),
                now_ms: *now_ms,
                orphan: *orphan,
            }),
            Command::RestoreBegin {
                restore_id,
                resource_count,
                leases,
            } => LogCommand::RestoreBegin(log::RestoreBeginCommand {
                restore_id: restore_id.clone(),
                resource_count: *resource_count,
                leases: leases
                    .iter()
                    .map(|&(id, ttl_ms)| log::LeaseRecord { id, ttl_ms })
                    .collect(),
            }),
            Command::RestoreChunk {
                restore_id,
                resources,
            } => LogCommand::RestoreChunk(log::RestoreChunkCommand {
                restore_id: restore_id.clone(),
                resources: resources.clone(),
            }),
            Command::RestoreCommit { restore_id } => {
                LogCommand::RestoreCommit(log::RestoreCommitCommand {
                    restore_id: restore_id.clone(),
                })
            }
            Command::RestoreAbort { restore_id } => {
                LogCommand::RestoreAbort(log::RestoreAbortCommand {
                    restore_id: restore_id.clone(),
                })
            }
            Command::ClusterVersion { action, version } => {
                use log::cluster_version_command::Action;
                LogCommand::ClusterVersion(log::ClusterVersionCommand {
                    action: match action {
                        VersionAction::Raise => Action::Raise,
                        VersionAction::Downgrade => Action::Downgrade,
                        VersionAction::CancelDowngrade => Action::CancelDowngrade,
                    } as i32,
                    major: version.major,
                    minor: version.minor,
                })
            }
            Command::WriteStatus {
                id,
                key,
                status,
                version,
            } => LogCommand::WriteStatus(log::WriteStatusCommand {
                id: Some(id.clone()),
                key: key.clone(),
                status: Some(status.clone()),
                version: version.clone(),
            }),
            Command::Capacity { action } => {
                use log::capacity_command::Action;
                let (action, quota_bytes) = match action {
                    CapacityAction::SetQuota(bytes) => (Action::SetQuota, *bytes),
                    CapacityAction::RaiseAlarm => (Action::RaiseAlarm, 0),
                    CapacityAction::DisarmAlarm => (Action::DisarmAlarm, 0),
                };
                LogCommand::Capacity(log::CapacityCommand {
                    action: action as i32,
                    quota_bytes,
                })
            }
            Command::LeaseGrant { ttl_ms } => {
                LogCommand::LeaseGrant(log::LeaseGrantCommand { ttl_ms: *ttl_ms })
            }
            Command::LeaseRevoke { id, now_ms } => {
                LogCommand::LeaseRevoke(log::LeaseRevokeCommand {
                    id: *id,
                    now_ms: *now_ms,
                })
            }
            Command::LeaseKeepAlive { ids } => {
                LogCommand::LeaseKeepAlive(log::LeaseKeepAliveCommand { ids: ids.clone() })
            }
            Command::LeaseExpire { leases, now_ms } => {
                LogCommand::LeaseExpire(log::LeaseExpireCommand {
                    ids: leases.iter().map(|l| l.0).collect(),
                    renewed_revisions: leases.iter().map(|l| l.1).collect(),
                    now_ms: *now_ms,
                })
            }
            Command::Collect { owner, now_ms } => LogCommand::Collect(log::CollectCommand {
                owner: Some(owner.clone()),
                now_ms: *now_ms,
            }),
            Command::Integrity { action } => {
                use log::integrity_command::Action;
                let (action, members) = match action {
                    IntegrityAction::RaiseCorrupt(members) => {
                        (Action::RaiseCorrupt, members.clone())
                    }
                    IntegrityAction::Disarm => (Action::Disarm, Vec::new()),
                };
                LogCommand::Integrity(log::IntegrityCommand {
                    action: action as i32,
                    members,
                })
            }
            Command::Fenced { fence, command } => {
                assert!(
                    command.is_fenceable(),
                    "a fence guards a write, delete or status write"
                );
                LogCommand::Fenced(Box::new(log::FencedCommand {
                    fence: Some(fence.clone()),
                    command: Some(Box::new(log::Command {
                        command: Some(command.to_log()),
                    })),
                }))
            }
        }
    }

    /// Whether a fence may guard the command: a write, a delete or a status write.
    pub fn is_fenceable(&self) -> bool {
        matches!(
            self,
            Command::Write { .. } | Command::Delete { .. } | Command::WriteStatus { .. }
        )
    }

    /// Encodes `Command::Batch` around commands already encoded with
    /// [`Command::encode`] (each a write or a delete), without decoding or
    /// re-encoding them: the write batcher encodes each command once, when it
    /// is submitted, and hands those bytes on. Equal to encoding the batch of
    /// the decoded commands (a test checks it).
    pub fn encode_batch(encoded: &[Bytes]) -> Bytes {
        // Hand-framed `Command { batch: BatchCommand { commands } }` around each
        // command's own body (its bytes after the version byte).
        let bodies = encoded.iter().map(|e| {
            assert_eq!(
                e.first(),
                Some(&COMMAND_FORMAT_VERSION),
                "a batched command is an encoded command"
            );
            &e[1..]
        });
        let batch_len: usize = bodies
            .clone()
            .map(|b| key_len(TAG_BATCH_COMMANDS) + encoded_len_varint(b.len() as u64) + b.len())
            .sum();
        let total_len = 1 + key_len(TAG_BATCH) + encoded_len_varint(batch_len as u64) + batch_len;
        let mut buf = Vec::with_capacity(total_len);
        buf.put_u8(COMMAND_FORMAT_VERSION);
        encode_key(TAG_BATCH, WireType::LengthDelimited, &mut buf);
        encode_varint(batch_len as u64, &mut buf);
        for body in bodies {
            encode_key(TAG_BATCH_COMMANDS, WireType::LengthDelimited, &mut buf);
            encode_varint(body.len() as u64, &mut buf);
            buf.extend_from_slice(body);
        }
        assert_eq!(buf.len(), total_len, "batch length as computed");
        Bytes::from(buf)
    }

    /// Decodes an entry payload. Any unknown version, truncated or garbage
    /// input, or a command without its required fields, is `FsmError::Decode`.
    pub fn decode(buf: &[u8]) -> Result<Command, FsmError> {
        let Some((&version, body)) = buf.split_first() else {
            return Err(FsmError::Decode("empty command".into()));
        };
        if version != COMMAND_FORMAT_VERSION {
            return Err(FsmError::Decode(format!(
                "unknown command format version {version} (this node reads {COMMAND_FORMAT_VERSION})"
            )));
        }
        let message =
            log::Command::decode(body).map_err(|e| FsmError::Decode(format!("command: {e}")))?;
        match message.command {
            Some(LogCommand::Batch(batch)) => {
                let commands = batch
                    .commands
                    .into_iter()
                    .map(|c| match Command::from_log(c.command)? {
                        c @ (Command::Write { .. } | Command::Delete { .. }) => Ok(c),
                        _ => Err(FsmError::Decode(
                            "a batch holds only writes and deletes".into(),
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Command::Batch { commands })
            }
            other => Command::from_log(other),
        }
    }

    /// One command (not a batch) from its protobuf form.
    fn from_log(command: Option<LogCommand>) -> Result<Command, FsmError> {
        match command {
            Some(LogCommand::Batch(_)) => Err(FsmError::Decode("a batch inside a batch".into())),
            Some(LogCommand::Write(log::WriteCommand {
                resource: Some(resource),
            })) => Ok(Command::Write { resource }),
            Some(LogCommand::Write(log::WriteCommand { resource: None })) => {
                Err(FsmError::Decode("write command without a resource".into()))
            }
            Some(LogCommand::Delete(log::DeleteCommand {
                id: Some(id),
                version,
                now_ms,
                orphan,
            })) => Ok(Command::Delete {
                id,
                version,
                now_ms,
                orphan,
            }),
            Some(LogCommand::Delete(log::DeleteCommand { id: None, .. })) => {
                Err(FsmError::Decode("delete command without an id".into()))
            }
            Some(LogCommand::RestoreBegin(c)) => Ok(Command::RestoreBegin {
                restore_id: c.restore_id,
                resource_count: c.resource_count,
                leases: c.leases.iter().map(|l| (l.id, l.ttl_ms)).collect(),
            }),
            Some(LogCommand::RestoreChunk(c)) => Ok(Command::RestoreChunk {
                restore_id: c.restore_id,
                resources: c.resources,
            }),
            Some(LogCommand::RestoreCommit(c)) => Ok(Command::RestoreCommit {
                restore_id: c.restore_id,
            }),
            Some(LogCommand::RestoreAbort(c)) => Ok(Command::RestoreAbort {
                restore_id: c.restore_id,
            }),
            Some(LogCommand::ClusterVersion(c)) => {
                use log::cluster_version_command::Action;
                let action = match Action::try_from(c.action) {
                    Ok(Action::Raise) => VersionAction::Raise,
                    Ok(Action::Downgrade) => VersionAction::Downgrade,
                    Ok(Action::CancelDowngrade) => VersionAction::CancelDowngrade,
                    Err(_) => {
                        return Err(FsmError::Decode(format!(
                            "cluster version command with unknown action {}",
                            c.action
                        )))
                    }
                };
                Ok(Command::ClusterVersion {
                    action,
                    version: ClusterVersion::new(c.major, c.minor),
                })
            }
            Some(LogCommand::WriteStatus(log::WriteStatusCommand {
                id: Some(id),
                key,
                status: Some(status),
                version,
            })) => Ok(Command::WriteStatus {
                id,
                key,
                status,
                version,
            }),
            Some(LogCommand::WriteStatus(_)) => Err(FsmError::Decode(
                "write-status command without an id or a status".into(),
            )),
            Some(LogCommand::Capacity(c)) => {
                use log::capacity_command::Action;
                let action = match Action::try_from(c.action) {
                    Ok(Action::SetQuota) => CapacityAction::SetQuota(c.quota_bytes),
                    Ok(Action::RaiseAlarm) => CapacityAction::RaiseAlarm,
                    Ok(Action::DisarmAlarm) => CapacityAction::DisarmAlarm,
                    Err(_) => {
                        return Err(FsmError::Decode(format!(
                            "capacity command with unknown action {}",
                            c.action
                        )))
                    }
                };
                Ok(Command::Capacity { action })
            }
            Some(LogCommand::LeaseGrant(c)) => Ok(Command::LeaseGrant { ttl_ms: c.ttl_ms }),
            Some(LogCommand::LeaseRevoke(c)) => Ok(Command::LeaseRevoke {
                id: c.id,
                now_ms: c.now_ms,
            }),
            Some(LogCommand::LeaseKeepAlive(c)) => Ok(Command::LeaseKeepAlive { ids: c.ids }),
            Some(LogCommand::LeaseExpire(c)) => {
                if c.ids.len() != c.renewed_revisions.len() {
                    return Err(FsmError::Decode(format!(
                        "lease expiry with {} ids and {} renewals",
                        c.ids.len(),
                        c.renewed_revisions.len()
                    )));
                }
                Ok(Command::LeaseExpire {
                    leases: c.ids.into_iter().zip(c.renewed_revisions).collect(),
                    now_ms: c.now_ms,
                })
            }
            Some(LogCommand::Fenced(c)) => {
                let (Some(fence), Some(inner)) = (c.fence, c.command) else {
                    return Err(FsmError::Decode(
                        "fenced command without a fence or a command".into(),
                    ));
                };
                let command = Command::from_log(inner.command)?;
                if !command.is_fenceable() {
                    return Err(FsmError::Decode(
                        "a fence guards only a write, a delete or a status write".into(),
                    ));
                }
                Ok(Command::Fenced {
                    fence,
                    command: Box::new(command),
                })
            }
            Some(LogCommand::Collect(log::CollectCommand {
                owner: Some(owner),
                now_ms,
            })) => Ok(Command::Collect { owner, now_ms }),
            Some(LogCommand::Collect(_)) => {
                Err(FsmError::Decode("collect command without an owner".into()))
            }
            Some(LogCommand::Integrity(c)) => {
                use log::integrity_command::Action;
                if c.members.len() > crate::integrity::CORRUPT_MEMBERS_MAX {
                    return Err(FsmError::Decode(format!(
                        "integrity command naming {} members (at most {})",
                        c.members.len(),
                        crate::integrity::CORRUPT_MEMBERS_MAX
                    )));
                }
                let action = match Action::try_from(c.action) {
                    Ok(Action::RaiseCorrupt) => IntegrityAction::RaiseCorrupt(c.members),
                    Ok(Action::Disarm) => IntegrityAction::Disarm,
                    Err(_) => {
                        return Err(FsmError::Decode(format!(
                            "integrity command with unknown action {}",
                            c.action
                        )))
                    }
                };
                Ok(Command::Integrity { action })
            }
            None => Err(FsmError::Decode("command without a body".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use cairn_proto::google::protobuf::Any;
    use cairn_proto::v1::{Tenancy, Type};
    use std::collections::BTreeMap;

    fn resource() -> Resource {
        Resource {
            id: Some(Id {
                uid: "u1".into(),
                name: "web".into(),
                r#type: Some(Type {
                    group: "catalog".into(),
                    group_version: "v2".into(),
                    kind: "Service".into(),
                }),
                tenancy: Some(Tenancy {
                    partition: "default".into(),
                    namespace: "default".into(),
                }),
            }),
            version: "7".into(),
            metadata: BTreeMap::from([("b".into(), "2".into()), ("a".into(), "1".into())]),
            data: Some(Any {
                type_url: "t".into(),
                value: Bytes::from_static(&[1, 2, 3]),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn write_encoding_equals_prost_encoding_of_the_wrapper() {
        // The hand-framed write must be byte-identical to prost's encoding.
        let r = resource();
        let wrapper = log::Command {
            command: Some(LogCommand::Write(log::WriteCommand {
                resource: Some(r.clone()),
            })),
        };
        let mut expected = vec![COMMAND_FORMAT_VERSION];
        expected.extend_from_slice(&wrapper.encode_to_vec());
        assert_eq!(
            Command::Write { resource: r }.encode().as_ref(),
            &expected[..]
        );
    }

    #[test]
    fn batch_encoding_equals_prost_encoding_of_the_wrapper() {
        // The hand-framed batch must be byte-identical to prost's encoding.
        let r = resource();
        let write = log::Command {
            command: Some(LogCommand::Write(log::WriteCommand {
                resource: Some(r.clone()),
            })),
        };
        let wrapper = log::Command {
            command: Some(LogCommand::Batch(log::BatchCommand {
                commands: vec![write.clone(), write],
            })),
        };
        let mut expected = vec![COMMAND_FORMAT_VERSION];
        expected.extend_from_slice(&wrapper.encode_to_vec());
        let batch = Command::Batch {
            commands: vec![
                Command::Write {
                    resource: r.clone(),
                },
                Command::Write { resource: r },
            ],
        };
        assert_eq!(batch.encode().as_ref(), &expected[..]);
    }

    #[test]
    fn a_batch_inside_a_batch_or_a_restore_in_a_batch_does_not_decode() {
        for inner in [
            LogCommand::Batch(log::BatchCommand { commands: vec![] }),
            LogCommand::RestoreAbort(log::RestoreAbortCommand {
                restore_id: "r".into(),
            }),
        ] {
            let wrapper = log::Command {
                command: Some(LogCommand::Batch(log::BatchCommand {
                    commands: vec![log::Command {
                        command: Some(inner),
                    }],
                })),
            };
            let mut b = vec![COMMAND_FORMAT_VERSION];
            b.extend(wrapper.encode_to_vec());
            assert!(matches!(Command::decode(&b), Err(FsmError::Decode(_))));
        }
    }

    #[test]
    fn an_empty_resource_round_trips() {
        // Even a default resource is framed as a present (empty) message.
        let c = Command::Write {
            resource: Resource::default(),
        };
        assert_eq!(Command::decode(&c.encode()), Ok(c));
    }

    #[test]
    fn commands_round_trip_and_encode_deterministically() {
        // encode then decode gives the command back; encoding twice gives equal bytes.
        let commands = [
            Command::Write {
                resource: resource(),
            },
            Command::Delete {
                id: resource().id.unwrap_or_default(),
                version: "9".into(),
                now_ms: 1_764_410_400_123,
                orphan: true,
            },
            Command::Collect {
                owner: resource().id.unwrap_or_default(),
                now_ms: 1_764_410_400_123,
            },
            Command::Integrity {
                action: IntegrityAction::RaiseCorrupt(vec![3, 5]),
            },
            Command::Integrity {
                action: IntegrityAction::Disarm,
            },
            Command::RestoreBegin {
                restore_id: "r1".into(),
                resource_count: 2,
                leases: vec![(3, 10_000)],
            },
            Command::LeaseGrant { ttl_ms: 10_000 },
            Command::LeaseRevoke { id: 12, now_ms: 5 },
            Command::LeaseKeepAlive { ids: vec![12, 13] },
            Command::LeaseExpire {
                leases: vec![(12, 40), (13, 41)],
                now_ms: 5,
            },
            Command::Fenced {
                fence: Fence {
                    election: Some(cairn_proto::v1::Reference {
                        name: "leader".into(),
                        ..Default::default()
                    }),
                    token: 17,
                },
                command: Box::new(Command::Write {
                    resource: resource(),
                }),
            },
            Command::RestoreChunk {
                restore_id: "r1".into(),
                resources: vec![resource(), resource()],
            },
            Command::RestoreCommit {
                restore_id: "r1".into(),
            },
            Command::RestoreAbort {
                restore_id: "r1".into(),
            },
            Command::ClusterVersion {
                action: VersionAction::Raise,
                version: ClusterVersion::new(0, 2),
            },
            Command::ClusterVersion {
                action: VersionAction::Downgrade,
                version: ClusterVersion::new(0, 1),
            },
            Command::ClusterVersion {
                action: VersionAction::CancelDowngrade,
                version: ClusterVersion::new(0, 1),
            },
            Command::WriteStatus {
                id: resource().id.unwrap_or_default(),
                key: "consul.io/health-controller".into(),
                status: Status {
                    observed_generation: "g1".into(),
                    ..Default::default()
                },
                version: "9".into(),
            },
            Command::Batch {
                commands: vec![
                    Command::Write {
                        resource: resource(),
                    },
                    Command::Delete {
                        id: resource().id.unwrap_or_default(),
                        version: "9".into(),
                        now_ms: 0,
                        orphan: false,
                    },
                ],
            },
        ];
        for c in commands {
            let a = c.encode();
            assert_eq!(a, c.clone().encode());
            assert_eq!(a[0], COMMAND_FORMAT_VERSION);
            assert_eq!(Command::decode(&a), Ok(c));
        }
    }

    #[test]
    fn unknown_version_empty_and_garbage_are_decode_errors() {
        // Malformed payloads are typed errors, never panics.
        let good = Command::Write {
            resource: resource(),
        }
        .encode();
        let mut wrong_version = good.to_vec();
        wrong_version[0] = 2;
        assert!(matches!(
            Command::decode(&wrong_version),
            Err(FsmError::Decode(_))
        ));
        assert!(matches!(Command::decode(&[]), Err(FsmError::Decode(_))));
        assert!(matches!(Command::decode(&[1]), Err(FsmError::Decode(_))));
        assert!(matches!(
            Command::decode(&[1, 0xff, 0xff, 0xff]),
            Err(FsmError::Decode(_))
        ));
        for cut in 1..good.len() {
            // Any truncation either fails to decode or decodes to something else; never panics.
            let _ = Command::decode(&good[..cut]);
        }
        // A write without a resource, a delete without an id.
        let no_resource = log::Command {
            command: Some(LogCommand::Write(log::WriteCommand { resource: None })),
        };
        let mut b = vec![1];
        b.extend(no_resource.encode_to_vec());
        assert!(matches!(Command::decode(&b), Err(FsmError::Decode(_))));
        let no_id = log::Command {
            command: Some(LogCommand::Delete(log::DeleteCommand {
                id: None,
                version: "1".into(),
                ..Default::default()
            })),
        };
        let mut b = vec![1];
        b.extend(no_id.encode_to_vec());
        assert!(matches!(Command::decode(&b), Err(FsmError::Decode(_))));
    }
}
