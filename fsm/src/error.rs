//! The one error enum of the fsm layer, and its one conversion to the wire.

use cairn_proto::error::{compacted_text, label_of, labelled, ApiError, ErrorKind};
use cairn_proto::v1::Type;

use crate::StoredResource;

/// Every way an fsm operation can fail. Conditions, not bugs: a broken
/// invariant panics instead.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FsmError {
    /// Nothing is stored at the key, or a non-empty requested uid differs
    /// from the stored one.
    #[error("{}", label_of(ErrorKind::NotFound))]
    NotFound,
    /// The expected version is not the stored one. `stored` is `None` when
    /// nothing is stored at the key.
    #[error(
        "CAS failure: expected version {expected:?}, {}",
        stored_version(stored)
    )]
    CasFailure {
        expected: String,
        stored: Option<String>,
    },
    /// A write whose uid differs from the stored uid (an empty uid included).
    #[error("wrong uid: given {given:?}, stored {stored:?}")]
    WrongUid { given: String, stored: String },
    /// A read asked for a group version other than the stored one.
    #[error(
        "group version mismatch: requested {:?}, stored {:?}",
        requested.group_version,
        stored.group_version()
    )]
    GroupVersionMismatch {
        requested: Type,
        stored: StoredResource,
    },
    /// The revision asked for is older than the retained history.
    #[error("{}", compacted_text(*oldest_retained_revision))]
    Compacted { oldest_retained_revision: u64 },
    /// Malformed input; `field` is dotted (`resource.id.name`).
    #[error("invalid argument {field}: {reason}")]
    InvalidArgument { field: String, reason: String },
    /// The store ended this watch (`restore`, `lagging`, `shutdown`); the
    /// consumer must re-list.
    #[error("watch closed: {reason}")]
    WatchClosed { reason: String },
    /// An online restore command that does not fit the restore in progress
    /// (another one is pending, or none with this id is).
    #[error("restore conflict: {0}")]
    RestoreConflict(String),
    /// A command or snapshot record could not be decoded.
    #[error("decode: {0}")]
    Decode(String),
    /// The cluster's state does not allow the command: one its cluster version does not
    /// enable, or a change of the cluster version that the rules refuse
    /// ([`crate::ClusterVersionState`]). The message names both versions.
    #[error("{}", labelled(ErrorKind::FailedPrecondition, .0))]
    FailedPrecondition(String),
    /// A write the space quota or a tenant quota refused ([`crate::capacity`]): `limit`
    /// names the quota, `value` its value, `reason` the usage and the write's growth.
    #[error("resource exhausted: {reason}")]
    ResourceExhausted {
        limit: String,
        value: u64,
        reason: String,
    },
}

/// What a CAS failure says is stored: `version "2" is stored`, or `nothing is stored`.
fn stored_version(stored: &Option<String>) -> String {
    match stored {
        Some(version) => format!("but version {version:?} is stored"),
        None => "but nothing is stored".to_string(),
    }
}

impl FsmError {
    /// The kind, from the one vocabulary (the wire's, see [`ApiError`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            FsmError::NotFound => ErrorKind::NotFound,
            FsmError::CasFailure { .. } => ErrorKind::CasFailure,
            FsmError::WrongUid { .. } => ErrorKind::WrongUid,
            FsmError::GroupVersionMismatch { .. } => ErrorKind::GroupVersionMismatch,
            FsmError::Compacted { .. } => ErrorKind::Compacted,
            FsmError::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            FsmError::WatchClosed { .. } => ErrorKind::WatchClosed,
            // Another restore is in the way: the consistency asked for cannot be met now.
            FsmError::RestoreConflict(_) => ErrorKind::Inconsistent,
            FsmError::Decode(_) => ErrorKind::Internal,
            FsmError::FailedPrecondition(_) => ErrorKind::FailedPrecondition,
            FsmError::ResourceExhausted { .. } => ErrorKind::ResourceExhausted,
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> FsmError {
        FsmError::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl From<FsmError> for ApiError {
    fn from(error: FsmError) -> ApiError {
        match error {
            FsmError::NotFound => ApiError::NotFound,
            e @ FsmError::CasFailure { .. } => ApiError::CasFailure(e.to_string()),
            e @ FsmError::WrongUid { .. } => ApiError::WrongUid(e.to_string()),
            FsmError::GroupVersionMismatch { requested, stored } => {
                ApiError::GroupVersionMismatch {
                    requested,
                    // Error path only: the one place a stored resource is decoded.
                    stored: Box::new(stored.resource()),
                }
            }
            FsmError::Compacted {
                oldest_retained_revision,
            } => ApiError::Compacted {
                oldest_retained_revision,
            },
            FsmError::InvalidArgument { field, reason } => {
                ApiError::InvalidArgument { field, reason }
            }
            FsmError::WatchClosed { reason } => ApiError::WatchClosed(reason),
            e @ FsmError::RestoreConflict(_) => ApiError::Inconsistent(e.to_string()),
            FsmError::Decode(message) => ApiError::Internal(format!("decode: {message}")),
            FsmError::FailedPrecondition(message) => ApiError::FailedPrecondition(message),
            FsmError::ResourceExhausted {
                limit,
                value,
                reason,
            } => ApiError::ResourceExhausted {
                limit,
                value,
                reason,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_proto::v1::Resource;

    #[test]
    fn every_fsm_error_keeps_its_kind_on_the_wire() {
        // One vocabulary: the kind an fsm error names is the kind its ApiError carries.
        let every = [
            FsmError::NotFound,
            FsmError::CasFailure {
                expected: "1".into(),
                stored: None,
            },
            FsmError::WrongUid {
                given: "a".into(),
                stored: "b".into(),
            },
            FsmError::GroupVersionMismatch {
                requested: Type::default(),
                stored: StoredResource::from_resource(&Resource::default()),
            },
            FsmError::Compacted {
                oldest_retained_revision: 3,
            },
            FsmError::invalid("resource.id.name", "must not be empty"),
            FsmError::WatchClosed {
                reason: "restore".into(),
            },
            FsmError::RestoreConflict("another restore".into()),
            FsmError::Decode("truncated".into()),
            FsmError::FailedPrecondition("WriteStatus needs cluster version 0.2".into()),
            FsmError::ResourceExhausted {
                limit: "data_bytes_max".into(),
                value: 1,
                reason: "full".into(),
            },
        ];
        for error in every {
            assert_eq!(
                ApiError::from(error.clone()).kind(),
                error.kind(),
                "{error:?}"
            );
        }
    }
}
