//! The one mapping between Cairn's error kinds and gRPC status codes.
//!
//! Every layer has its own error enum (`fsm::FsmError`, the node's, the
//! client's); each takes its kind from the one [`ErrorKind`] and converts into
//! [`ApiError`] for the wire, and [`ApiError`] is the only type that turns into
//! or out of a [`tonic::Status`] ([`ApiError::from_status`] is the one decoder).
//!
//! ## The wire: the standard gRPC error model
//!
//! `grpc-status-details-bin` carries a standard `google.rpc.Status` (the
//! [`tonic_types`] messages), which any gRPC library decodes. Its `details` hold:
//! - a `google.rpc.ErrorInfo` whose `reason` is the kind's name
//!   ([`reason_of`]: `NOT_LEADER`, `CAS_FAILURE`, …) and whose `domain` is
//!   [`DOMAIN`] (`cairn.v1`): the kind survives every hop (node → node →
//!   client) even where two kinds share a gRPC code;
//! - for `InvalidArgument`, a `google.rpc.BadRequest` with the field violation
//!   (`resource.id.name`, `must not be empty`);
//! - Cairn's own detail message, packed in `google.protobuf.Any`
//!   (`type.googleapis.com/cairn.v1.NotLeaderDetails`), for the kinds that
//!   have one (see the table).
//!
//! The status message is readable on its own: it names the field of an
//! invalid argument (`resource.id.name: must not be empty`) and says what the
//! kinds without a message of their own are (`not found`).
//!
//! | kind                  | gRPC code            | notes                                        |
//! |-----------------------|----------------------|----------------------------------------------|
//! | NotFound              | NOT_FOUND            |                                              |
//! | CasFailure            | ABORTED              |                                              |
//! | WrongUid              | ALREADY_EXISTS       |                                              |
//! | GroupVersionMismatch  | OUT_OF_RANGE         | Any: `GroupVersionMismatchDetails` (requested type + stored resource) |
//! | Inconsistent          | FAILED_PRECONDITION  | consistency cannot be met on this cluster now (no quorum, leadership unconfirmed) |
//! | Unavailable           | UNAVAILABLE          | this node cannot serve now; another node may (retry elsewhere) |
//! | NotLeader             | UNAVAILABLE          | Any: `NotLeaderDetails` (the leader hint); retry at the leader |
//! | WatchClosed           | ABORTED              | the consumer must re-list                    |
//! | Compacted             | OUT_OF_RANGE         | Any: `CompactedDetails` (oldest retained revision) |
//! | InvalidArgument       | INVALID_ARGUMENT     | `google.rpc.BadRequest`: the field named     |
//! | ResourceExhausted     | RESOURCE_EXHAUSTED   | Any: `ResourceExhaustedDetails` (the limit's config key and value); certainly not applied |
//! | Internal              | INTERNAL             | a bug or an unexpected failure               |
//! | Unauthenticated       | UNAUTHENTICATED      | no token, or a token the node does not know  |
//! | PermissionDenied      | PERMISSION_DENIED    | names the missing permission                 |
//! | FailedPrecondition    | FAILED_PRECONDITION  | the cluster's state does not allow it (a command its cluster version does not enable); certainly not applied |
//!
//! A status without Cairn's `ErrorInfo` (from a proxy, a transport failure,
//! an older peer) is classified by its code alone; transport-level codes
//! become `Unavailable`, so a caller never has to parse message text.

use bytes::Bytes;
use prost::Message;
use prost_types::Any;
use tonic::Code;
use tonic_types::pb::{bad_request::FieldViolation, BadRequest, ErrorInfo};

pub use crate::v1::ErrorKind;
use crate::v1::{
    CompactedDetails, GroupVersionMismatchDetails, NotLeaderDetails, Resource,
    ResourceExhaustedDetails, Type,
};

/// The `google.rpc.ErrorInfo.domain` of every error a Cairn node answers.
pub const DOMAIN: &str = "cairn.v1";

/// The prefix of every `Any.type_url` Cairn writes (the protobuf convention).
const TYPE_URL_PREFIX: &str = "type.googleapis.com/";

/// The `ErrorInfo.reason` of a kind: its proto name without the
/// `ERROR_KIND_` prefix (`NOT_LEADER`), the UPPER_SNAKE_CASE that
/// `google.rpc.ErrorInfo` asks for.
pub fn reason_of(kind: ErrorKind) -> &'static str {
    let name = kind.as_str_name();
    name.strip_prefix("ERROR_KIND_").unwrap_or(name)
}

/// What an operator reads for a kind: the one human name of each kind
/// (`not found`, `CAS failure`), which every layer's error message starts with.
pub fn label_of(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::NotFound => "not found",
        ErrorKind::CasFailure => "CAS failure",
        ErrorKind::WrongUid => "wrong uid",
        ErrorKind::GroupVersionMismatch => "group version mismatch",
        ErrorKind::Inconsistent => "inconsistent",
        ErrorKind::Unavailable => "unavailable",
        ErrorKind::NotLeader => "not leader",
        ErrorKind::WatchClosed => "watch closed",
        ErrorKind::Compacted => "compacted",
        ErrorKind::InvalidArgument => "invalid argument",
        ErrorKind::ResourceExhausted => "resource exhausted",
        ErrorKind::Internal | ErrorKind::Unspecified => "internal error",
        ErrorKind::Unauthenticated => "unauthenticated",
        ErrorKind::PermissionDenied => "permission denied",
        ErrorKind::FailedPrecondition => "failed precondition",
    }
}

/// `"{label}: {message}"`, without repeating the kind's label when the
/// message already starts with it (display only: errors are never
/// classified by their text).
pub fn labelled(kind: ErrorKind, message: &str) -> String {
    let label = label_of(kind);
    let starts_with_label = message
        .get(..label.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(label));
    match (message.is_empty(), starts_with_label) {
        (true, _) => label.to_string(),
        (false, true) => message.to_string(),
        (false, false) => format!("{label}: {message}"),
    }
}

/// `group version mismatch: requested "v2", stored "v1"`: every layer's text of the kind.
pub fn group_version_mismatch_text(requested: &Type, stored: &Resource) -> String {
    let stored_group_version = stored
        .id
        .as_ref()
        .and_then(|id| id.r#type.as_ref())
        .map(|t| t.group_version.as_str())
        .unwrap_or("");
    format!(
        "{}: requested {:?}, stored {:?}",
        label_of(ErrorKind::GroupVersionMismatch),
        requested.group_version,
        stored_group_version
    )
}

/// `compacted: the oldest retained revision is 42`: every layer's text of the kind.
pub fn compacted_text(oldest_retained_revision: u64) -> String {
    format!(
        "{}: the oldest retained revision is {oldest_retained_revision}",
        label_of(ErrorKind::Compacted)
    )
}

/// The kind an `ErrorInfo.reason` names, if any (the inverse of [`reason_of`]).
fn kind_of_reason(reason: &str) -> Option<ErrorKind> {
    ErrorKind::from_str_name(&format!("ERROR_KIND_{reason}"))
        .filter(|kind| *kind != ErrorKind::Unspecified)
}

/// One of Cairn's own detail messages, and its full protobuf name.
trait CairnDetail: Message + Default {
    const FULL_NAME: &'static str;
}
impl CairnDetail for GroupVersionMismatchDetails {
    const FULL_NAME: &'static str = "cairn.v1.GroupVersionMismatchDetails";
}
impl CairnDetail for CompactedDetails {
    const FULL_NAME: &'static str = "cairn.v1.CompactedDetails";
}
impl CairnDetail for NotLeaderDetails {
    const FULL_NAME: &'static str = "cairn.v1.NotLeaderDetails";
}
impl CairnDetail for ResourceExhaustedDetails {
    const FULL_NAME: &'static str = "cairn.v1.ResourceExhaustedDetails";
}
const ERROR_INFO: &str = "google.rpc.ErrorInfo";
const BAD_REQUEST: &str = "google.rpc.BadRequest";

fn pack(full_name: &str, message: &impl Message) -> Any {
    Any {
        type_url: format!("{TYPE_URL_PREFIX}{full_name}"),
        value: message.encode_to_vec(),
    }
}

/// The first detail of type `full_name` that decodes, if any.
fn unpack<M: Message + Default>(details: &[Any], full_name: &str) -> Option<M> {
    details
        .iter()
        .filter(|any| any.type_url.strip_prefix(TYPE_URL_PREFIX) == Some(full_name))
        .find_map(|any| M::decode(any.value.as_slice()).ok())
}

fn unpack_cairn<M: CairnDetail>(details: &[Any]) -> Option<M> {
    unpack(details, M::FULL_NAME)
}

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
    #[error("{}", label_of(ErrorKind::NotFound))]
    NotFound,
    #[error("{}", labelled(ErrorKind::CasFailure, .0))]
    CasFailure(String),
    #[error("{}", labelled(ErrorKind::WrongUid, .0))]
    WrongUid(String),
    #[error("{}", group_version_mismatch_text(requested, stored))]
    GroupVersionMismatch {
        requested: Type,
        stored: Box<Resource>,
    },
    #[error("{}", labelled(ErrorKind::Inconsistent, .0))]
    Inconsistent(String),
    #[error("{}", labelled(ErrorKind::Unavailable, .0))]
    Unavailable(String),
    #[error("not leader ({hint})")]
    NotLeader { hint: LeaderHint },
    #[error("{}", labelled(ErrorKind::WatchClosed, .0))]
    WatchClosed(String),
    #[error("{}", compacted_text(*oldest_retained_revision))]
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
    #[error("{}", labelled(ErrorKind::Internal, .0))]
    Internal(String),
    /// No credentials, or credentials no grant of the node's config holds.
    #[error("{}", labelled(ErrorKind::Unauthenticated, .0))]
    Unauthenticated(String),
    /// Known credentials whose grant lacks a permission; the message names it
    /// (`write on demo.v1.Thing in default/default`) and never anything
    /// stored.
    #[error("{}", labelled(ErrorKind::PermissionDenied, .0))]
    PermissionDenied(String),
    /// The cluster's state does not allow the request (a command its cluster version does
    /// not enable yet); the message names what (both versions). Certainly not applied.
    #[error("{}", labelled(ErrorKind::FailedPrecondition, .0))]
    FailedPrecondition(String),
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
            ApiError::FailedPrecondition(_) => ErrorKind::FailedPrecondition,
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

    /// Cairn's own detail message of this error, packed, for the kinds that have one.
    fn packed_detail(&self) -> Option<Any> {
        match self {
            ApiError::GroupVersionMismatch { requested, stored } => Some(pack(
                GroupVersionMismatchDetails::FULL_NAME,
                &GroupVersionMismatchDetails {
                    requested_type: Some(requested.clone()),
                    stored: Some((**stored).clone()),
                },
            )),
            ApiError::Compacted {
                oldest_retained_revision,
            } => Some(pack(
                CompactedDetails::FULL_NAME,
                &CompactedDetails {
                    oldest_retained_revision: *oldest_retained_revision,
                },
            )),
            ApiError::NotLeader { hint } => Some(pack(
                NotLeaderDetails::FULL_NAME,
                &NotLeaderDetails {
                    leader_id: hint.leader_id.unwrap_or(0),
                    leader_client_address: hint.client_address.clone().unwrap_or_default(),
                    leader_peer_address: hint.peer_address.clone().unwrap_or_default(),
                },
            )),
            ApiError::ResourceExhausted { limit, value, .. } => Some(pack(
                ResourceExhaustedDetails::FULL_NAME,
                &ResourceExhaustedDetails {
                    limit: limit.clone(),
                    value: *value,
                },
            )),
            _ => None,
        }
    }

    /// The status message: the kind's own text, which names the field of an
    /// invalid argument (`resource.id.name: must not be empty`); the kinds
    /// without text of their own say what they are (`not found`).
    fn message(&self) -> String {
        match self {
            ApiError::CasFailure(m)
            | ApiError::WrongUid(m)
            | ApiError::Inconsistent(m)
            | ApiError::Unavailable(m)
            | ApiError::WatchClosed(m)
            | ApiError::Internal(m)
            | ApiError::Unauthenticated(m)
            | ApiError::PermissionDenied(m)
            | ApiError::FailedPrecondition(m) => m.clone(),
            ApiError::InvalidArgument { field, reason } if field.is_empty() => reason.clone(),
            ApiError::InvalidArgument { field, reason } => format!("{field}: {reason}"),
            ApiError::ResourceExhausted { reason, .. } => reason.clone(),
            ApiError::NotFound
            | ApiError::GroupVersionMismatch { .. }
            | ApiError::NotLeader { .. }
            | ApiError::Compacted { .. } => self.to_string(),
        }
    }

    /// The standard `google.rpc.Status` of this error (module docs).
    fn rpc_status(&self) -> tonic_types::Status {
        let mut details = vec![pack(
            ERROR_INFO,
            &ErrorInfo {
                reason: reason_of(self.kind()).to_string(),
                domain: DOMAIN.to_string(),
                metadata: Default::default(),
            },
        )];
        if let ApiError::InvalidArgument { field, reason } = self {
            details.push(pack(
                BAD_REQUEST,
                &BadRequest {
                    field_violations: vec![FieldViolation {
                        field: field.clone(),
                        description: reason.clone(),
                        ..Default::default()
                    }],
                },
            ));
        }
        details.extend(self.packed_detail());
        tonic_types::Status {
            code: self.code() as i32,
            message: self.message(),
            details,
        }
    }

    /// Rebuilds the error from a status: the one decoder of Cairn's errors.
    /// Never fails: a status without Cairn's `ErrorInfo` is classified by its
    /// code.
    /// What an UNIMPLEMENTED answer means to a Cairn client: the server does not know the
    /// call, so it certainly did not run it. A node of an older release answers so for a
    /// call added later (`WriteStatus` on release 0.1.0): FailedPrecondition, saying so.
    pub fn unimplemented(message: &str) -> ApiError {
        ApiError::FailedPrecondition(format!(
            "the server does not implement this call (UNIMPLEMENTED{}{message}): a node of an \
             older release of Cairn does not know it; `cairn status` shows each member's \
             release and the cluster version (docs/upgrading.md)",
            if message.is_empty() { "" } else { ": " }
        ))
    }

    pub fn from_status(status: &tonic::Status) -> ApiError {
        if let Some(error) = ApiError::from_cairn_status(status) {
            return error;
        }
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
            Code::Unimplemented => ApiError::unimplemented(&message),
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
                ApiError::Unavailable(format!("{:?}: {message}", status.code()))
            }
            other => ApiError::Internal(format!("{other:?}: {message}")),
        }
    }

    /// The error a Cairn node answered with, or `None` when the status does
    /// not come from a Cairn node (no `ErrorInfo` of domain [`DOMAIN`] naming
    /// a kind): a proxy's, the transport's, a foreign server's. The retry
    /// loops tell a node's verdict from a transport failure with this.
    pub fn from_cairn_status(status: &tonic::Status) -> Option<ApiError> {
        if status.details().is_empty() {
            return None;
        }
        let rpc = tonic_types::Status::decode(status.details()).ok()?;
        let info: ErrorInfo = unpack(&rpc.details, ERROR_INFO)?;
        if info.domain != DOMAIN {
            return None;
        }
        from_details(
            kind_of_reason(&info.reason)?,
            &rpc.details,
            status.message(),
        )
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
        ErrorKind::FailedPrecondition => Code::FailedPrecondition,
        ErrorKind::Internal | ErrorKind::Unspecified => Code::Internal,
    }
}

/// The error of `kind` from the status's details and message, or `None` when
/// a detail the kind cannot do without is missing (then the code decides).
fn from_details(kind: ErrorKind, details: &[Any], message: &str) -> Option<ApiError> {
    let m = message.to_string();
    let error = match kind {
        ErrorKind::NotFound => ApiError::NotFound,
        ErrorKind::CasFailure => ApiError::CasFailure(m),
        ErrorKind::WrongUid => ApiError::WrongUid(m),
        ErrorKind::GroupVersionMismatch => {
            let d: GroupVersionMismatchDetails = unpack_cairn(details)?;
            ApiError::GroupVersionMismatch {
                requested: d.requested_type.unwrap_or_default(),
                stored: Box::new(d.stored.unwrap_or_default()),
            }
        }
        ErrorKind::Inconsistent => ApiError::Inconsistent(m),
        ErrorKind::Unavailable => ApiError::Unavailable(m),
        ErrorKind::NotLeader => {
            let d: NotLeaderDetails = unpack_cairn(details).unwrap_or_default();
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
        ErrorKind::WatchClosed => ApiError::WatchClosed(m),
        ErrorKind::Compacted => {
            let d: CompactedDetails = unpack_cairn(details)?;
            ApiError::Compacted {
                oldest_retained_revision: d.oldest_retained_revision,
            }
        }
        ErrorKind::InvalidArgument => {
            let violation = unpack::<BadRequest>(details, BAD_REQUEST)
                .and_then(|b| b.field_violations.into_iter().next());
            match violation {
                Some(v) => ApiError::InvalidArgument {
                    field: v.field,
                    reason: v.description,
                },
                None => ApiError::invalid("", m),
            }
        }
        ErrorKind::ResourceExhausted => {
            let d: ResourceExhaustedDetails = unpack_cairn(details).unwrap_or_default();
            ApiError::ResourceExhausted {
                limit: d.limit,
                value: d.value,
                reason: m,
            }
        }
        ErrorKind::Internal => ApiError::Internal(m),
        ErrorKind::Unauthenticated => ApiError::Unauthenticated(m),
        ErrorKind::PermissionDenied => ApiError::PermissionDenied(m),
        ErrorKind::FailedPrecondition => ApiError::FailedPrecondition(m),
        ErrorKind::Unspecified => return None,
    };
    Some(error)
}

impl From<ApiError> for tonic::Status {
    /// Every `tonic::Status` Cairn answers with is built here.
    fn from(error: ApiError) -> tonic::Status {
        let rpc = error.rpc_status();
        tonic::Status::with_details(
            error.code(),
            rpc.message.clone(),
            Bytes::from(rpc.encode_to_vec()),
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
            ApiError::FailedPrecondition(
                "WriteStatus needs cluster version 0.2; the cluster runs 0.1".into(),
            ),
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
    fn the_details_are_a_standard_google_rpc_status() {
        // What a client in any language reads: ErrorInfo names the kind in
        // Cairn's domain, BadRequest names the field, and the kind's own
        // detail is an Any of Cairn's message.
        for error in every_kind() {
            let status = tonic::Status::from(error.clone());
            let rpc = tonic_types::Status::decode(status.details()).expect("a google.rpc.Status");
            assert_eq!(rpc.code, status.code() as i32);
            assert_eq!(rpc.message, status.message());
            let info: ErrorInfo = unpack(&rpc.details, ERROR_INFO).expect("an ErrorInfo");
            assert_eq!(info.domain, "cairn.v1");
            assert_eq!(info.reason, reason_of(error.kind()));
            assert!(!info.reason.starts_with("ERROR_KIND"));
            let type_urls: Vec<&str> = rpc.details.iter().map(|a| a.type_url.as_str()).collect();
            let expected_own = match error.kind() {
                ErrorKind::GroupVersionMismatch => Some("cairn.v1.GroupVersionMismatchDetails"),
                ErrorKind::Compacted => Some("cairn.v1.CompactedDetails"),
                ErrorKind::NotLeader => Some("cairn.v1.NotLeaderDetails"),
                ErrorKind::ResourceExhausted => Some("cairn.v1.ResourceExhaustedDetails"),
                _ => None,
            };
            let own = type_urls
                .iter()
                .find(|url| url.contains("cairn.v1."))
                .map(|url| url.trim_start_matches(TYPE_URL_PREFIX));
            assert_eq!(own, expected_own, "{error:?}: {type_urls:?}");
            assert_eq!(
                type_urls.contains(&"type.googleapis.com/google.rpc.BadRequest"),
                error.kind() == ErrorKind::InvalidArgument,
                "{error:?}"
            );
            assert!(!status.message().is_empty(), "{error:?} has no message");
        }
    }

    #[test]
    fn an_invalid_argument_names_its_field_in_the_message_and_in_bad_request() {
        let status =
            tonic::Status::from(ApiError::invalid("resource.id.name", "must not be empty"));
        assert_eq!(status.message(), "resource.id.name: must not be empty");
        let rpc = tonic_types::Status::decode(status.details()).unwrap();
        let bad: BadRequest = unpack(&rpc.details, BAD_REQUEST).unwrap();
        assert_eq!(bad.field_violations[0].field, "resource.id.name");
        assert_eq!(bad.field_violations[0].description, "must not be empty");
    }

    #[test]
    fn an_error_info_of_another_domain_is_not_a_cairn_answer() {
        // A proxy or another service may use ErrorInfo too: only Cairn's domain names a kind.
        let foreign = tonic_types::Status {
            code: Code::Aborted as i32,
            message: "m".into(),
            details: vec![pack(
                ERROR_INFO,
                &ErrorInfo {
                    reason: "CAS_FAILURE".into(),
                    domain: "example.com".into(),
                    metadata: Default::default(),
                },
            )],
        };
        let status =
            tonic::Status::with_details(Code::Aborted, "m", Bytes::from(foreign.encode_to_vec()));
        assert_eq!(ApiError::from_cairn_status(&status), None);
        let ours = tonic::Status::from(ApiError::CasFailure("m".into()));
        assert_eq!(
            ApiError::from_cairn_status(&ours),
            Some(ApiError::CasFailure("m".into()))
        );
        assert_eq!(
            ApiError::from_cairn_status(&tonic::Status::aborted("m")),
            None
        );
    }

    #[test]
    fn every_kind_has_a_reason_that_names_it_back() {
        for error in every_kind() {
            assert_eq!(kind_of_reason(reason_of(error.kind())), Some(error.kind()));
        }
        assert_eq!(kind_of_reason("UNSPECIFIED"), None);
        assert_eq!(kind_of_reason("no such kind"), None);
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
