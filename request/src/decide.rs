//! The decision after a failed attempt: pure (no I/O, no clock).
//!
//! [`Failure::from_status`] sorts what came back from one gRPC call;
//! [`classify`] says what that failure tells about the request
//! ([`Effect`]); [`next_step`] says what to do next ([`Step`]): try again,
//! follow a leader hint, or stop with an [`Outcome`].
//!
//! | failure                                           | effect        | read            | write or delete  |
//! |---------------------------------------------------|---------------|-----------------|------------------|
//! | nothing sent (no target, connect refused/timeout) | Transient     | retry           | retry            |
//! | answered Unavailable, NotLeader without a hint    | Transient     | retry           | retry            |
//! | answered NotLeader naming the leader              | Redirect      | go there        | go there         |
//! | sent, connection lost / no answer in time         | Unsure        | retry           | stop, Unknown    |
//! | answered Inconsistent                             | Unsure        | retry           | stop, Unknown    |
//! | a verdict: NotFound, CasFailure, WrongUid, GroupVersionMismatch, WatchClosed, Compacted, InvalidArgument, ResourceExhausted, Unauthenticated, PermissionDenied, FailedPrecondition | Verdict | stop, NotApplied | stop, NotApplied |
//! | UNIMPLEMENTED (a node of an older release: read as FailedPrecondition) | Verdict | stop, NotApplied | stop, NotApplied |
//! | answered Internal                                 | Recurring     | stop, NotApplied | stop, Unknown   |
//! | a message over a size limit; a foreign status     | Recurring     | stop, NotApplied | stop, Unknown   |
//!
//! Why: every write is a compare-and-set, so a write that did apply and is
//! sent again fails with CasFailure — the caller would be told "failed" about
//! a write that happened. A write is therefore sent again only after an
//! attempt that **certainly did not apply**: nothing was sent, or a node
//! refused with NotLeader or Unavailable, which by the node's contract it
//! answers only before proposing. Reads have no effect, so they are retried
//! after anything another attempt might not meet. A failure that recurs at
//! every node (a verdict of the contract, a credential refusal, a message
//! over a size limit, a bug) is never retried: retrying it only spends the
//! caller's deadline.

use std::fmt;

use cairn_proto::error::{ApiError, LeaderHint};
use tonic::Code;

/// Whether a request changes the store (decides what may be sent again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Read, list, list by owner, watch opening: no effect.
    Read,
    /// Write or delete.
    Mutation,
}

/// Whether a request that failed may have taken effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Certainly not applied: refused before any effect, or never received by
    /// a node that could apply it. Reads always fail this way.
    NotApplied,
    /// May have been applied, now or later: a write was sent and its answer
    /// lost, or the node could not tell.
    Unknown,
}

impl Outcome {
    /// Whether the outcome is known (the request certainly did not apply).
    pub fn is_definite(self) -> bool {
        self == Outcome::NotApplied
    }
}

/// How one attempt failed, as far as the caller can tell.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// A Cairn node answered with this error (its status carried Cairn's details).
    Answered(ApiError),
    /// Nothing was sent: no node to send to is known, or the connection could
    /// not be opened (refused, unreachable, timed out).
    NotSent(String),
    /// The request may have been sent; then the connection failed, or a
    /// status without Cairn's details came back (a proxy, the transport).
    Lost(String),
    /// The request was sent and no answer came within the attempt's time.
    NoAnswer(String),
    /// A message was over a size limit (the request here or there, or the
    /// answer): every node would answer the same.
    TooLarge(String),
    /// A status without Cairn's details whose code no transport failure
    /// produces (UNIMPLEMENTED from a server that is not Cairn, ...): every
    /// attempt would end the same.
    Foreign(String),
}

impl Failure {
    /// Sorts the status one call returned. A status carrying Cairn's details
    /// is a node's answer ([`ApiError::from_cairn_status`], the one decoder);
    /// any other is sorted by its code and by its error chain (a connect
    /// failure means nothing was sent), never by its message text.
    pub fn from_status(status: &tonic::Status) -> Failure {
        if let Some(error) = ApiError::from_cairn_status(status) {
            return Failure::Answered(error);
        }
        let source = std::error::Error::source(status);
        let text = match source {
            Some(source) => format!("{:?}: {}", status.code(), error_chain(source)),
            None => format!("{:?}: {}", status.code(), status.message()),
        };
        if source.is_some_and(is_connect_failure) {
            return Failure::NotSent(text);
        }
        if status.code() == Code::Unimplemented {
            // The server does not know the call: it certainly did not run it.
            return Failure::Answered(ApiError::unimplemented(status.message()));
        }
        match status.code() {
            // tonic's codec refuses a message over its limit with OUT_OF_RANGE
            // (and one over 4 GiB with RESOURCE_EXHAUSTED); Cairn's own
            // statuses of these codes always carry details.
            Code::OutOfRange | Code::ResourceExhausted => Failure::TooLarge(text),
            Code::DeadlineExceeded | Code::Cancelled => Failure::NoAnswer(text),
            Code::Unavailable | Code::Unknown | Code::Internal | Code::DataLoss | Code::Aborted => {
                Failure::Lost(text)
            }
            _ => Failure::Foreign(text),
        }
    }

    /// A short label for metrics: the answered kind, or how the call failed.
    pub fn label(&self) -> &'static str {
        match self {
            Failure::Answered(e) => kind_label(e),
            Failure::NotSent(_) => "not_sent",
            Failure::Lost(_) => "lost",
            Failure::NoAnswer(_) => "no_answer",
            Failure::TooLarge(_) => "too_large",
            Failure::Foreign(_) => "foreign",
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Answered(e) => write!(f, "{e}"),
            Failure::NotSent(m) => write!(f, "not sent: {m}"),
            Failure::Lost(m) => write!(f, "connection lost: {m}"),
            Failure::NoAnswer(m) => write!(f, "no answer: {m}"),
            Failure::TooLarge(m) => write!(f, "message too large: {m}"),
            Failure::Foreign(m) => write!(f, "not a Cairn answer: {m}"),
        }
    }
}

/// What a failure tells about the request (see the module's table).
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Certainly not applied; the leader is known: send it there.
    Redirect(LeaderHint),
    /// Certainly not applied; another attempt (elsewhere, or later) may succeed.
    Transient,
    /// May have applied; another attempt may succeed.
    Unsure,
    /// Certainly not applied, and every node answers the same.
    Verdict,
    /// May have applied, and every attempt would fail the same.
    Recurring,
}

/// What `failure` tells about the request: the one place that decides it.
pub fn classify(failure: &Failure) -> Effect {
    match failure {
        Failure::Answered(error) => match error {
            ApiError::NotLeader { hint } => {
                let named = hint.leader_id.is_some()
                    && (hint.client_address.is_some() || hint.peer_address.is_some());
                if named {
                    Effect::Redirect(hint.clone())
                } else {
                    Effect::Transient
                }
            }
            // By the node's contract: answered only before proposing.
            ApiError::Unavailable(_) => Effect::Transient,
            // A write: its commit timed out or leadership was lost after
            // proposing (it may still commit). A read: leadership could not
            // be confirmed here now; another node or a later term may.
            ApiError::Inconsistent(_) => Effect::Unsure,
            // A bug does not go away on retrying, and a write that met one
            // may have applied first.
            ApiError::Internal(_) => Effect::Recurring,
            ApiError::NotFound
            | ApiError::CasFailure(_)
            | ApiError::WrongUid(_)
            | ApiError::GroupVersionMismatch { .. }
            | ApiError::WatchClosed(_)
            | ApiError::Compacted { .. }
            | ApiError::InvalidArgument { .. }
            | ApiError::ResourceExhausted { .. }
            | ApiError::Unauthenticated(_)
            | ApiError::PermissionDenied(_)
            // The cluster version decides, the same on every node until it changes.
            | ApiError::FailedPrecondition(_) => Effect::Verdict,
        },
        Failure::NotSent(_) => Effect::Transient,
        Failure::Lost(_) | Failure::NoAnswer(_) => Effect::Unsure,
        Failure::TooLarge(_) | Failure::Foreign(_) => Effect::Recurring,
    }
}

/// What to do after an attempt failed.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Try again (elsewhere, or after a pause).
    Retry,
    /// Try again at the leader the hint names, at once.
    Redirect(LeaderHint),
    /// Give up: the caller gets the failure, with this outcome.
    Stop(Outcome),
}

/// The step after the `attempt`-th attempt (counted from 1) of an
/// `operation` failed with `effect`; at most `attempts_max` attempts are made.
pub fn next_step(operation: Operation, effect: Effect, attempt: u32, attempts_max: u32) -> Step {
    let unsure = match operation {
        Operation::Read => Outcome::NotApplied,
        Operation::Mutation => Outcome::Unknown,
    };
    match effect {
        Effect::Verdict => Step::Stop(Outcome::NotApplied),
        Effect::Recurring => Step::Stop(unsure),
        Effect::Unsure if operation == Operation::Mutation => Step::Stop(Outcome::Unknown),
        _ if attempt >= attempts_max => Step::Stop(Outcome::NotApplied),
        Effect::Redirect(hint) => Step::Redirect(hint),
        Effect::Transient | Effect::Unsure => Step::Retry,
    }
}

/// The error a node's caller gets when a request it sent on (or ran here)
/// got no answer in time: a write may still commit (Inconsistent, outcome
/// unknown); a read had no effect (Unavailable: retry here or elsewhere).
pub fn unanswered(operation: Operation, what: impl fmt::Display) -> ApiError {
    match operation {
        Operation::Mutation => ApiError::Inconsistent(format!("outcome unknown: {what}")),
        Operation::Read => ApiError::Unavailable(what.to_string()),
    }
}

impl crate::Ended {
    /// The error a node answers its caller with when [`crate::run`] ended
    /// without an answer: a Cairn node's answer as it came (a NotLeader it
    /// could not follow is Unavailable); nothing sent is Unavailable; a write
    /// whose outcome is unknown is Inconsistent; a message over a size limit
    /// is ResourceExhausted. Never a raw transport error.
    pub fn into_api_error(self, operation: Operation) -> ApiError {
        let (failure, outcome) = match self {
            crate::Ended::OutOfTime { last } => {
                return match last {
                    Some(Failure::Answered(
                        ApiError::NotLeader { .. } | ApiError::Unavailable(_),
                    ))
                    | None => ApiError::Unavailable(format!(
                        "no leader answered in time ({})",
                        last.map_or_else(|| "no attempt could be made".into(), |f| f.to_string())
                    )),
                    Some(Failure::Answered(error)) => error,
                    Some(other) => ApiError::Unavailable(format!("no answer in time ({other})")),
                }
            }
            crate::Ended::Stopped { failure, outcome } => (failure, outcome),
        };
        match (failure, outcome) {
            (Failure::Answered(ApiError::NotLeader { hint }), _) => {
                ApiError::Unavailable(format!("not redirected in time ({hint})"))
            }
            (Failure::Answered(error), _) => error,
            (failure, Outcome::Unknown) => unanswered(operation, failure),
            (Failure::TooLarge(reason), Outcome::NotApplied) => ApiError::ResourceExhausted {
                limit: String::new(),
                value: 0,
                reason,
            },
            (Failure::Foreign(m), Outcome::NotApplied) => ApiError::Internal(m),
            (failure, Outcome::NotApplied) => ApiError::Unavailable(failure.to_string()),
        }
    }
}

/// The metrics label of an error kind.
pub fn kind_label(error: &ApiError) -> &'static str {
    match error {
        ApiError::NotFound => "not_found",
        ApiError::CasFailure(_) => "cas_failure",
        ApiError::WrongUid(_) => "wrong_uid",
        ApiError::GroupVersionMismatch { .. } => "group_version_mismatch",
        ApiError::Inconsistent(_) => "inconsistent",
        ApiError::Unavailable(_) => "unavailable",
        ApiError::NotLeader { .. } => "not_leader",
        ApiError::WatchClosed(_) => "watch_closed",
        ApiError::Compacted { .. } => "compacted",
        ApiError::InvalidArgument { .. } => "invalid_argument",
        ApiError::ResourceExhausted { .. } => "resource_exhausted",
        ApiError::Internal(_) => "internal",
        ApiError::Unauthenticated(_) => "unauthenticated",
        ApiError::PermissionDenied(_) => "permission_denied",
        ApiError::FailedPrecondition(_) => "failed_precondition",
    }
}

/// Whether an error chain shows a failure to open the connection, which
/// happens before any byte of a request is sent: tonic's `ConnectError`, or
/// an I/O error only a connect can raise.
pub fn is_connect_failure(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.downcast_ref::<tonic::ConnectError>().is_some() {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::AddrNotAvailable
                    | std::io::ErrorKind::NetworkUnreachable
                    | std::io::ErrorKind::HostUnreachable
            ) {
                return true;
            }
        }
        current = e.source();
    }
    false
}

/// "outer: inner: innermost" for an error and its sources (tonic's top-level
/// message alone is often just "transport error").
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut current = error.source();
    while let Some(e) = current {
        let s = e.to_string();
        if !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
        current = e.source();
    }
    text
}
