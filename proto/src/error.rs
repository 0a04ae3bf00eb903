//! The one mapping between Cairn's error kinds and gRPC status codes.
//!
//! Every layer has its own error enum (`fsm::FsmError`, the node's, the
//! client's); each converts into [`ApiError`] for the wire, and [`ApiError`] is
//! the only type that turns into or out of a [`tonic::Status`]. The kind travels
//! in the status's `details` as an [`ErrorDetails`] message, so it survives
//! every hop (node → node → client) even where two kinds share a gRPC code.
//!
//! | kind                  | gRPC code            | notes                                        |
//! |-----------------------|----------------------|----------------------------------------------|
//! | NotFound              | NOT_FOUND            |                                              |
//! | CasFailure            | ABORTED              |                                              |
//! | WrongUid              | ALREADY_EXISTS       |                                              |
//! | GroupVersionMismatch  | OUT_OF_RANGE         | details: requested type + stored resource    |
//! | Inconsistent          | FAILED_PRECONDITION  | consistency cannot be met on this cluster now (no quorum, leadership unconfirmed) |
//! | Unavailable           | UNAVAILABLE          | this node cannot serve now; another node may (retry elsewhere) |
//! | NotLeader             | UNAVAILABLE          | details: the leader hint; retry at the leader |
//! | WatchClosed           | ABORTED              | the consumer must re-list                    |
//! | Compacted             | OUT_OF_RANGE         | details: oldest retained revision            |
//! | InvalidArgument       | INVALID_ARGUMENT     | details: the field named                     |
//! | ResourceExhausted     | RESOURCE_EXHAUSTED   | details: the limit's config key and value; certainly not applied |
//! | Internal              | INTERNAL             | a bug or an unexpected failure               |
//! | Unauthenticated       | UNAUTHENTICATED      | no token, or a token the node does not know  |
//! | PermissionDenied      | PERMISSION_DENIED    | names the missing permission                 |
//!
//! A status without Cairn details (from a proxy, a transport failure, an older
//! peer) is classified by its code alone; transport-level codes become
//! `Unavailable`, so a caller never has to parse message text.

use bytes::Bytes;
use prost::Message;
use tonic::Code;

use crate::v1::{
    error_details::Detail, CompactedDetails, ErrorDetails, ErrorKind, GroupVersionMismatchDetails,
    InvalidArgumentDetails, NotLeaderDetails, Resource, ResourceExhaustedDetails, Type,
};

/// Where the leader is, as far as the answering node knows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaderHint {
    pub leader_id: Option<u64>,
    /// The leader's client address (`host:port`), if known.
    pub client_address: Option<String>,
    /// The leader's peer address (`host:port`), if known.
    pub peer_address: Option<String>,
}

impl std::fmt::Display for LeaderHint {
    /// `the leader is node 2 at 10.0.0.2:7001`, or `no leader known`: what an operator reads.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.leader_id, &self.client_address) {
            (Some(id), Some(address)) => write!(f, "the leader is node {id} at {address}"),
            (Some(id), None) => write!(f, "the leader is node {id}"),
            (None, _) => write!(f, "no leader known"),
        }
    }
}

/// An error as it crosses the wire. See the module docs for the code table.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    #[error("not found")]
    NotFound,
    #[error("CAS failure: {0}")]
    CasFailure(String),
    #[error("wrong uid: {0}")]
    WrongUid(String),
    #[error(
        "group version mismatch: requested {:?}, stored {:?}",
        requested.group_version,
        stored.id.as_ref().and_then(|id| id.r#type.as_ref()).map(|t| t.group_version.as_str()).unwrap_or("")
    )]
    GroupVersionMismatch {
        requested: Type,
        stored: Box<Resource>,
    },
    #[error("inconsistent: {0}")]
    Inconsistent(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("not leader ({hint})")]
    NotLeader { hint: LeaderHint },
    #[error("watch closed: {0}")]
    WatchClosed(String),
    #[error("compacted: the oldest retained revision is {oldest_retained_revision}")]
    Compacted { oldest_retained_revision: u64 },
    #[error("invalid argument {field}: {reason}")]
    InvalidArgument { field: String, reason: String },
    /// A configured limit refused the request before any work was done.
    /// `limit` is the limit's configuration key, `value` its value on the
    /// refusing node; `reason` says what exceeded it.
    #[error("resource exhausted: {reason}")]
    ResourceExhausted {
        limit: String,
        value: u64,
        reason: String,
    },
    #[error("internal error: {0}")]
    Internal(String),
    /// No credentials, or credentials no grant of the node's config holds.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// Known credentials whose grant lacks a permission; the message names it
    /// (`write on demo.v1.Thing in default/default`) and never anything
    /// stored.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
}

impl ApiError {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ApiError::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// A refusal by the limit named `limit` (its configuration key) of
    /// `value`; the message names both after what exceeded it.
    pub fn exhausted(limit: &str, value: u64, what: impl std::fmt::Display) -> Self {
        ApiError::ResourceExhausted {
            limit: limit.to_string(),
            value,
            reason: format!("{what}: over the limit {limit} = {value}"),
        }
    }

    /// The kind, as carried in the status details.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ApiError::NotFound => ErrorKind::NotFound,
            ApiError::CasFailure(_) => ErrorKind::CasFailure,
            ApiError::WrongUid(_) => ErrorKind::WrongUid,
            ApiError::GroupVersionMismatch { .. } => ErrorKind::GroupVersionMismatch,
            ApiError::Inconsistent(_) => ErrorKind::Inconsistent,
            ApiError::Unavailable(_) => ErrorKind::Unavailable,
            ApiError::NotLeader { .. } => ErrorKind::NotLeader,
            ApiError::WatchClosed(_) => ErrorKind::WatchClosed,
            ApiError::Compacted { .. } => ErrorKind::Compacted,
            ApiError::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            ApiError::ResourceExhausted { .. } => ErrorKind::ResourceExhausted,
            ApiError::Internal(_) => ErrorKind::Internal,
            ApiError::Unauthenticated(_) => ErrorKind::Unauthenticated,
            ApiError::PermissionDenied(_) => ErrorKind::PermissionDenied,
        }
    }

    /// Whether the caller's credentials were refused (none, unknown, or without the
    /// permission). Credentials are the same at every node, so trying another node gives the
    /// same answer.
    pub fn is_credential_refusal(&self) -> bool {
        matches!(
            self,
            ApiError::Unauthenticated(_) | ApiError::PermissionDenied(_)
        )
    }

    /// The gRPC code of each kind: the table in the module docs.
    pub fn code(&self) -> Code {
        code_of(self.kind())
    }

    fn detail(&self) -> Option<Detail> {
        match self {
            ApiError::GroupVersionMismatch { requested, stored } => {
                Some(Detail::GroupVersionMismatch(GroupVersionMismatchDetails {
                    requested_type: Some(requested.clone()),
                    stored: Some((**stored).clone()),
                }))
            }
            ApiError::Compacted {
                oldest_retained_revision,
            } => Some(Detail::Compacted(CompactedDetails {
                oldest_retained_revision: *oldest_retained_revision,
            })),
            ApiError::NotLeader { hint } => Some(Detail::NotLeader(NotLeaderDetails {
                leader_id: hint.leader_id.unwrap_or(0),
                leader_client_address: hint.client_address.clone().unwrap_or_default(),
                leader_peer_address: hint.peer_address.clone().unwrap_or_default(),
            })),
            ApiError::InvalidArgument { field, .. } => {
                Some(Detail::InvalidArgument(InvalidArgumentDetails {
                    field: field.clone(),
                }))
            }
            ApiError::ResourceExhausted { limit, value, .. } => {
                Some(Detail::ResourceExhausted(ResourceExhaustedDetails {
                    limit: limit.clone(),
                    value: *value,
                }))
            }
            _ => None,
        }
    }

    /// The text part of the status (the kind and details travel separately).
    fn reason(&self) -> String {
        match self {
            ApiError::CasFailure(m)
            | ApiError::WrongUid(m)
            | ApiError::Inconsistent(m)
            | ApiError::Unavailable(m)
            | ApiError::WatchClosed(m)
            | ApiError::Internal(m)
            | ApiError::Unauthenticated(m)
            | ApiError::PermissionDenied(m) => m.clone(),
            ApiError::InvalidArgument { reason, .. }
            | ApiError::ResourceExhausted { reason, .. } => reason.clone(),
            _ => String::new(),
        }
    }

    /// Rebuilds the error from a status. Never fails: a status without Cairn
    /// details is classified by its code.
    pub fn from_status(status: &tonic::Status) -> ApiError {
        ApiError::from_cairn_status(status).unwrap_or_else(|| by_code(status))
    }

    /// The error a Cairn node answered, when `status` carries Cairn's details
    /// (they name a kind); `None` for a status made by the transport, a proxy
    /// or a server that is not Cairn. Callers deciding whether to retry tell
    /// the two apart with this, never by reading the details themselves.
    pub fn from_cairn_status(status: &tonic::Status) -> Option<ApiError> {
        let details = ErrorDetails::decode(status.details()).ok()?;
        if details.kind() == ErrorKind::Unspecified {
            return None;
        }
        Some(from_details(details, status.message()).unwrap_or_else(|| by_code(status)))
    }
}

/// A status classified by its code alone (no usable Cairn details).
fn by_code(status: &tonic::Status) -> ApiError {
    let message = status.message().to_string();
    match status.code() {
        Code::NotFound => ApiError::NotFound,
        Code::AlreadyExists => ApiError::WrongUid(message),
        Code::Aborted => ApiError::CasFailure(message),
        Code::FailedPrecondition => ApiError::Inconsistent(message),
        Code::InvalidArgument => ApiError::invalid("", message),
        Code::ResourceExhausted => ApiError::ResourceExhausted {
            limit: String::new(),
            value: 0,
            reason: message,
        },
        Code::Unauthenticated => ApiError::Unauthenticated(message),
        Code::PermissionDenied => ApiError::PermissionDenied(message),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
            ApiError::Unavailable(format!("{:?}: {message}", status.code()))
        }
        other => ApiError::Internal(format!("{other:?}: {message}")),
    }
}

fn code_of(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::CasFailure => Code::Aborted,
        ErrorKind::WrongUid => Code::AlreadyExists,
        ErrorKind::GroupVersionMismatch => Code::OutOfRange,
        ErrorKind::Inconsistent => Code::FailedPrecondition,
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::NotLeader => Code::Unavailable,
        ErrorKind::WatchClosed => Code::Aborted,
        ErrorKind::Compacted => Code::OutOfRange,
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::ResourceExhausted => Code::ResourceExhausted,
        ErrorKind::Unauthenticated => Code::Unauthenticated,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
        ErrorKind::Internal | ErrorKind::Unspecified => Code::Internal,
    }
}

fn from_details(details: ErrorDetails, message: &str) -> Option<ApiError> {
    let m = message.to_string();
    let error = match (details.kind(), details.detail) {
        (ErrorKind::NotFound, _) => ApiError::NotFound,
        (ErrorKind::CasFailure, _) => ApiError::CasFailure(m),
        (ErrorKind::WrongUid, _) => ApiError::WrongUid(m),
        (ErrorKind::GroupVersionMismatch, Some(Detail::GroupVersionMismatch(d))) => {
            ApiError::GroupVersionMismatch {
                requested: d.requested_type.unwrap_or_default(),
                stored: Box::new(d.stored.unwrap_or_default()),
            }
        }
        (ErrorKind::Inconsistent, _) => ApiError::Inconsistent(m),
        (ErrorKind::Unavailable, _) => ApiError::Unavailable(m),
        (ErrorKind::NotLeader, detail) => {
            let d = match detail {
                Some(Detail::NotLeader(d)) => d,
                _ => NotLeaderDetails::default(),
            };
            let non_empty = |s: String| if s.is_empty() { None } else { Some(s) };
            ApiError::NotLeader {
                hint: LeaderHint {
                    leader_id: if d.leader_id == 0 {
                        None
                    } else {
                        Some(d.leader_id)
                    },
                    client_address: non_empty(d.leader_client_address),
                    peer_address: non_empty(d.leader_peer_address),
                },
            }
        }
        (ErrorKind::WatchClosed, _) => ApiError::WatchClosed(m),
        (ErrorKind::Compacted, Some(Detail::Compacted(d))) => ApiError::Compacted {
            oldest_retained_revision: d.oldest_retained_revision,
        },
        (ErrorKind::InvalidArgument, detail) => {
            let field = match detail {
                Some(Detail::InvalidArgument(d)) => d.field,
                _ => String::new(),
            };
            ApiError::InvalidArgument { field, reason: m }
        }
        (ErrorKind::ResourceExhausted, detail) => {
            let d = match detail {
                Some(Detail::ResourceExhausted(d)) => d,
                _ => ResourceExhaustedDetails::default(),
            };
            ApiError::ResourceExhausted {
                limit: d.limit,
                value: d.value,
                reason: m,
            }
        }
        (ErrorKind::Internal, _) => ApiError::Internal(m),
        (ErrorKind::Unauthenticated, _) => ApiError::Unauthenticated(m),
        (ErrorKind::PermissionDenied, _) => ApiError::PermissionDenied(m),
        // A kind whose required detail is missing, or an unknown kind: fall
        // back to classifying by code.
        _ => return None,
    };
    Some(error)
}

impl From<ApiError> for tonic::Status {
    fn from(error: ApiError) -> tonic::Status {
        let details = ErrorDetails {
            kind: error.kind() as i32,
            detail: error.detail(),
        };
        tonic::Status::with_details(
            error.code(),
            error.reason(),
            Bytes::from(details.encode_to_vec()),
        )
    }
}

impl From<tonic::Status> for ApiError {
    fn from(status: tonic::Status) -> ApiError {
        ApiError::from_status(&status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::Id as ID;

    fn every_kind() -> Vec<ApiError> {
        vec![
            ApiError::NotFound,
            ApiError::CasFailure("expected 3, stored 5".into()),
            ApiError::WrongUid("stored uid u1".into()),
            ApiError::GroupVersionMismatch {
                requested: Type {
                    group: "g".into(),
                    group_version: "v2".into(),
                    kind: "k".into(),
                },
                stored: Box::new(Resource {
                    id: Some(ID {
                        name: "n".into(),
                        ..Default::default()
                    }),
                    version: "7".into(),
                    ..Default::default()
                }),
            },
            ApiError::Inconsistent("no leader".into()),
            ApiError::Unavailable("shutting down".into()),
            ApiError::NotLeader {
                hint: LeaderHint {
                    leader_id: Some(2),
                    client_address: Some("127.0.0.1:7002".into()),
                    peer_address: Some("127.0.0.1:8002".into()),
                },
            },
            ApiError::NotLeader {
                hint: LeaderHint::default(),
            },
            ApiError::WatchClosed("restore".into()),
            ApiError::Compacted {
                oldest_retained_revision: 42,
            },
            ApiError::invalid("resource.id.name", "must not be empty"),
            ApiError::exhausted("list_results_max", 100, "the list matched 101 resources"),
            ApiError::Internal("boom".into()),
            ApiError::Unauthenticated("no token given".into()),
            ApiError::PermissionDenied("write on demo.v1.Thing in default/default".into()),
        ]
    }

    #[test]
    fn every_kind_round_trips_through_a_status() {
        for error in every_kind() {
            let status = tonic::Status::from(error.clone());
            assert_eq!(status.code(), error.code(), "{error:?}");
            assert_eq!(ApiError::from_status(&status), error);
        }
    }

    #[test]
    fn kinds_sharing_a_code_stay_apart() {
        let cas = tonic::Status::from(ApiError::CasFailure(String::new()));
        let closed = tonic::Status::from(ApiError::WatchClosed(String::new()));
        assert_eq!(cas.code(), closed.code());
        assert_ne!(
            ApiError::from_status(&cas).kind(),
            ApiError::from_status(&closed).kind()
        );
    }

    #[test]
    fn a_status_without_details_is_classified_by_code() {
        assert_eq!(
            ApiError::from_status(&tonic::Status::not_found("x")),
            ApiError::NotFound
        );
        assert!(matches!(
            ApiError::from_status(&tonic::Status::unavailable("connection refused")),
            ApiError::Unavailable(_)
        ));
        assert!(matches!(
            ApiError::from_status(&tonic::Status::failed_precondition("x")),
            ApiError::Inconsistent(_)
        ));
        assert_eq!(
            ApiError::from_status(&tonic::Status::unauthenticated("who?")),
            ApiError::Unauthenticated("who?".into())
        );
        assert_eq!(
            ApiError::from_status(&tonic::Status::permission_denied("read on a.K in p/n")),
            ApiError::PermissionDenied("read on a.K in p/n".into())
        );
        assert!(matches!(
            ApiError::from_status(&tonic::Status::data_loss("x")),
            ApiError::Internal(_)
        ));
    }

    #[test]
    fn garbage_details_never_panic() {
        let status = tonic::Status::with_details(
            Code::Aborted,
            "m",
            Bytes::from_static(&[0xff, 0xff, 0x01]),
        );
        assert!(matches!(
            ApiError::from_status(&status),
            ApiError::CasFailure(_)
        ));
    }
}
