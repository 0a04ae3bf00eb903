//! The client's one error enum.
//!
//! Every error says whether the operation's outcome is known ([`Outcome`]):
//! a linearizability checker records a definite failure as `fail` and an
//! unknown one as `info` (it may or may not have taken effect).

use cairn_proto::error::{
    compacted_text, group_version_mismatch_text, label_of, labelled, ApiError, ErrorKind,
};
use cairn_proto::v1::{Resource, Type};

/// Whether a failed operation may have taken effect: decided by
/// `cairn_request` (the one decision the client and the nodes share).
pub use cairn_request::Outcome;

/// Every way a client call can fail. The kinds are the contract's (section 2);
/// the cluster-level kinds (`Inconsistent`, `Unavailable`, `DeadlineExceeded`,
/// `Internal`) carry an [`Outcome`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClientError {
    /// Nothing stored at the key, or the requested uid is not the stored one.
    #[error("{}", label_of(ErrorKind::NotFound))]
    NotFound,
    /// The expected version is not the stored one.
    #[error("{}", labelled(ErrorKind::CasFailure, .0))]
    CasFailure(String),
    /// A write whose uid differs from the stored uid (an empty uid included).
    #[error("{}", labelled(ErrorKind::WrongUid, .0))]
    WrongUid(String),
    /// A read asked for another group version; carries the stored resource.
    #[error("{}", group_version_mismatch_text(requested, stored))]
    GroupVersionMismatch {
        requested: Type,
        stored: Box<Resource>,
    },
    /// The consistency asked for cannot be met now (no quorum, leadership not
    /// confirmed, or the node's own commit deadline passed on a write).
    #[error("{}", labelled(ErrorKind::Inconsistent, message))]
    Inconsistent { message: String, outcome: Outcome },
    /// The server ended a watch (restore, lagging consumer, shutdown): re-list.
    #[error("{}", labelled(ErrorKind::WatchClosed, .0))]
    WatchClosed(String),
    /// A read or watch asked for a revision older than the retained history.
    #[error("{}", compacted_text(*oldest_retained_revision))]
    Compacted { oldest_retained_revision: u64 },
    /// Malformed input; `field` is dotted (`resource.id.name`), or names the
    /// client setting at fault (`endpoints`).
    #[error("invalid argument {field}: {reason}")]
    InvalidArgument { field: String, reason: String },
    /// A node's configured limit refused the call before doing any work
    /// (certainly not applied): `limit` is the limit's configuration key,
    /// `value` its value on that node.
    #[error("resource exhausted: {reason}")]
    ResourceExhausted {
        limit: String,
        value: u64,
        reason: String,
    },
    /// No endpoint could serve the call: every one was unreachable, or no
    /// leader was known, or the connection dropped.
    #[error("{}", labelled(ErrorKind::Unavailable, message))]
    Unavailable { message: String, outcome: Outcome },
    /// The call's deadline passed before an answer arrived.
    #[error("deadline of {deadline_ms} ms exceeded ({detail})")]
    DeadlineExceeded {
        deadline_ms: u64,
        detail: String,
        outcome: Outcome,
    },
    /// A bug or an unexpected answer (a status from something that is not a
    /// Cairn node, an undecodable response).
    #[error("{}", labelled(ErrorKind::Internal, message))]
    Internal { message: String, outcome: Outcome },
    /// No token was given, or the node knows no grant for it
    /// ([`crate::ClientOptions::token`]).
    #[error("{}", labelled(ErrorKind::Unauthenticated, .0))]
    Unauthenticated(String),
    /// The token's grant lacks the permission the message names
    /// (`write on demo.v1.Thing in default/default`).
    #[error("{}", labelled(ErrorKind::PermissionDenied, .0))]
    PermissionDenied(String),
    /// The cluster's state does not allow the request: a command its cluster version does
    /// not enable yet (the message names both versions). Certainly not applied.
    #[error("{}", labelled(ErrorKind::FailedPrecondition, .0))]
    FailedPrecondition(String),
}

impl ClientError {
    /// Whether the operation may have taken effect. Only the cluster-level
    /// kinds can be [`Outcome::Unknown`]; the store's verdicts are definite.
    pub fn outcome(&self) -> Outcome {
        match self {
            ClientError::Inconsistent { outcome, .. }
            | ClientError::Unavailable { outcome, .. }
            | ClientError::DeadlineExceeded { outcome, .. }
            | ClientError::Internal { outcome, .. } => *outcome,
            _ => Outcome::NotApplied,
        }
    }

    /// The kind, from the one vocabulary. A client-side deadline is
    /// `Unavailable`: no node answered in time.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ClientError::NotFound => ErrorKind::NotFound,
            ClientError::CasFailure(_) => ErrorKind::CasFailure,
            ClientError::WrongUid(_) => ErrorKind::WrongUid,
            ClientError::GroupVersionMismatch { .. } => ErrorKind::GroupVersionMismatch,
            ClientError::Inconsistent { .. } => ErrorKind::Inconsistent,
            ClientError::WatchClosed(_) => ErrorKind::WatchClosed,
            ClientError::Compacted { .. } => ErrorKind::Compacted,
            ClientError::InvalidArgument { .. } => ErrorKind::InvalidArgument,
            ClientError::ResourceExhausted { .. } => ErrorKind::ResourceExhausted,
            ClientError::Unavailable { .. } | ClientError::DeadlineExceeded { .. } => {
                ErrorKind::Unavailable
            }
            ClientError::Internal { .. } => ErrorKind::Internal,
            ClientError::Unauthenticated(_) => ErrorKind::Unauthenticated,
            ClientError::PermissionDenied(_) => ErrorKind::PermissionDenied,
            ClientError::FailedPrecondition(_) => ErrorKind::FailedPrecondition,
        }
    }

    /// CasFailure or WrongUid: someone else's write won.
    pub fn is_cas_conflict(&self) -> bool {
        matches!(self, ClientError::CasFailure(_) | ClientError::WrongUid(_))
    }

    /// A [`ClientError::InvalidArgument`] naming `field`.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ClientError {
        ClientError::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// A node's final answer to a request it ran for a caller in its own
    /// process (its forwarder already retried what may be retried), with the
    /// outcome the shared decision table gives that answer to `operation`
    /// (`cairn_request`): Inconsistent or Internal on a write may have
    /// applied; Unavailable, a verdict, or any failure of a read did not.
    pub fn from_node_answer(error: ApiError, operation: cairn_request::Operation) -> ClientError {
        use cairn_request::{classify, next_step, Failure, Step};
        let failure = Failure::Answered(error);
        // One attempt was made, and it was the last: only the outcome is asked.
        let outcome = match next_step(operation, classify(&failure), 1, 1) {
            Step::Stop(outcome) => outcome,
            Step::Retry | Step::Redirect(_) => Outcome::NotApplied,
        };
        match failure {
            Failure::Answered(error) => ClientError::from_api(error, outcome),
            _ => unreachable!("built as an answer above"),
        }
    }

    /// Maps a node's verdict to the client's kind. `NotLeader` is followed by
    /// the retry loop and only surfaces here when it gave up: Unavailable.
    pub(crate) fn from_api(error: ApiError, outcome_if_unsure: Outcome) -> ClientError {
        match error {
            ApiError::NotFound => ClientError::NotFound,
            ApiError::CasFailure(m) => ClientError::CasFailure(m),
            ApiError::WrongUid(m) => ClientError::WrongUid(m),
            ApiError::GroupVersionMismatch { requested, stored } => {
                ClientError::GroupVersionMismatch { requested, stored }
            }
            ApiError::Inconsistent(message) => ClientError::Inconsistent {
                message,
                outcome: outcome_if_unsure,
            },
            ApiError::Unavailable(message) => ClientError::Unavailable {
                message,
                outcome: outcome_if_unsure,
            },
            ApiError::NotLeader { hint } => ClientError::Unavailable {
                message: format!(
                    "no leader reachable (last hint: {})",
                    hint.client_address.as_deref().unwrap_or("none")
                ),
                outcome: Outcome::NotApplied,
            },
            ApiError::WatchClosed(m) => ClientError::WatchClosed(m),
            ApiError::Compacted {
                oldest_retained_revision,
            } => ClientError::Compacted {
                oldest_retained_revision,
            },
            ApiError::InvalidArgument { field, reason } => {
                ClientError::InvalidArgument { field, reason }
            }
            ApiError::ResourceExhausted {
                limit,
                value,
                reason,
            } => ClientError::ResourceExhausted {
                limit,
                value,
                reason,
            },
            ApiError::Internal(message) => ClientError::Internal {
                message,
                outcome: outcome_if_unsure,
            },
            ApiError::Unauthenticated(m) => ClientError::Unauthenticated(m),
            ApiError::PermissionDenied(m) => ClientError::PermissionDenied(m),
            ApiError::FailedPrecondition(m) => ClientError::FailedPrecondition(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_proto::error::LeaderHint;

    #[test]
    fn store_verdicts_are_definite_and_cluster_kinds_carry_the_given_outcome() {
        // The store's own answers never leave the outcome open; cluster-level ones do.
        for api in [
            ApiError::NotFound,
            ApiError::CasFailure("x".into()),
            ApiError::WrongUid("x".into()),
            ApiError::invalid("f", "r"),
            ApiError::WatchClosed("restore".into()),
            ApiError::Compacted {
                oldest_retained_revision: 3,
            },
            ApiError::Unauthenticated("no token".into()),
            ApiError::PermissionDenied("write on a.v1.K in p/n".into()),
            ApiError::FailedPrecondition("WriteStatus needs cluster version 0.2".into()),
        ] {
            let e = ClientError::from_api(api, Outcome::Unknown);
            assert_eq!(e.outcome(), Outcome::NotApplied, "{e:?}");
        }
        for api in [
            ApiError::Inconsistent("x".into()),
            ApiError::Unavailable("x".into()),
            ApiError::Internal("x".into()),
        ] {
            let e = ClientError::from_api(api.clone(), Outcome::Unknown);
            assert_eq!(e.outcome(), Outcome::Unknown, "{e:?}");
            let e = ClientError::from_api(api, Outcome::NotApplied);
            assert!(e.outcome().is_definite());
        }
        let e = ClientError::from_api(
            ApiError::NotLeader {
                hint: LeaderHint::default(),
            },
            Outcome::Unknown,
        );
        assert!(matches!(
            e,
            ClientError::Unavailable {
                outcome: Outcome::NotApplied,
                ..
            }
        ));
    }

    #[test]
    fn an_in_process_answer_gets_the_outcome_of_the_shared_table() {
        // A write the node could not finish may have applied; one it refused
        // before proposing, a verdict, or any failed read did not.
        use cairn_request::Operation::{Mutation, Read};
        let cases = [
            (
                ApiError::Inconsistent("x".into()),
                Mutation,
                Outcome::Unknown,
            ),
            (ApiError::Internal("x".into()), Mutation, Outcome::Unknown),
            (
                ApiError::Unavailable("x".into()),
                Mutation,
                Outcome::NotApplied,
            ),
            (
                ApiError::CasFailure("x".into()),
                Mutation,
                Outcome::NotApplied,
            ),
            (
                ApiError::Inconsistent("x".into()),
                Read,
                Outcome::NotApplied,
            ),
            (ApiError::Internal("x".into()), Read, Outcome::NotApplied),
            (ApiError::NotFound, Read, Outcome::NotApplied),
        ];
        for (api, operation, outcome) in cases {
            let kind = api.kind();
            let e = ClientError::from_node_answer(api, operation);
            assert_eq!(e.kind(), kind, "{e:?}");
            assert_eq!(e.outcome(), outcome, "{e:?} on a {operation:?}");
        }
    }

    #[test]
    fn a_node_verdict_keeps_its_kind_in_the_client() {
        // One vocabulary: the client's kind is the node's, except NotLeader,
        // which the retry loop follows and which surfaces only as Unavailable.
        for api in [
            ApiError::NotFound,
            ApiError::CasFailure("x".into()),
            ApiError::WrongUid("x".into()),
            ApiError::GroupVersionMismatch {
                requested: Type::default(),
                stored: Box::default(),
            },
            ApiError::Inconsistent("x".into()),
            ApiError::Unavailable("x".into()),
            ApiError::WatchClosed("x".into()),
            ApiError::Compacted {
                oldest_retained_revision: 3,
            },
            ApiError::invalid("f", "r"),
            ApiError::exhausted("list_results_max", 3, "a list of 4"),
            ApiError::Internal("x".into()),
            ApiError::Unauthenticated("x".into()),
            ApiError::PermissionDenied("x".into()),
            ApiError::FailedPrecondition("x".into()),
        ] {
            let kind = api.kind();
            assert_eq!(ClientError::from_api(api, Outcome::Unknown).kind(), kind);
        }
        let not_leader = ApiError::NotLeader {
            hint: LeaderHint::default(),
        };
        assert_eq!(
            ClientError::from_api(not_leader, Outcome::Unknown).kind(),
            ErrorKind::Unavailable
        );
    }

    #[test]
    fn messages_do_not_repeat_the_kind() {
        // The node's message often starts with the kind already; it is shown once.
        assert_eq!(
            ClientError::CasFailure("CAS failure: expected 1".into()).to_string(),
            "CAS failure: expected 1"
        );
        assert_eq!(
            ClientError::WrongUid("given u1".into()).to_string(),
            "wrong uid: given u1"
        );
        assert_eq!(
            ClientError::WatchClosed(String::new()).to_string(),
            "watch closed"
        );
    }

    #[test]
    fn cas_conflict_covers_cas_failure_and_wrong_uid_only() {
        // Exit code 4 and the CAS retry loops rely on exactly these two kinds.
        assert!(ClientError::CasFailure(String::new()).is_cas_conflict());
        assert!(ClientError::WrongUid(String::new()).is_cas_conflict());
        assert!(!ClientError::NotFound.is_cas_conflict());
    }
}
