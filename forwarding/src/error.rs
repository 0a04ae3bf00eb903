//! The one error enum of the forwarding layer, and its one conversion into
//! the wire error ([`ApiError`], which alone maps to gRPC codes).

use cairn_proto::error::ApiError;

use crate::channel::Target;

/// Why forwarding a request to the leader did not produce the leader's
/// answer. Conditions, not bugs.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ForwardError {
    /// No leader is known: an election is under way, or the only hint names
    /// this node while it does not lead. Nothing was sent.
    #[error("no leader is known")]
    NoLeader,
    /// Opening a connection to the leader failed. Nothing was sent.
    #[error("cannot connect to leader {target}: {reason}")]
    Dial { target: Target, reason: String },
    /// The leader (or the node believed to be the leader) answered with an
    /// error of the contract; it crosses the hop with its kind intact.
    #[error("leader {target} answered: {error}")]
    Answered { target: Target, error: ApiError },
    /// The request may have reached the leader, then the connection failed
    /// without an answer. A write's outcome is unknown.
    #[error("forwarding to leader {target} failed after sending: {reason}")]
    Transport { target: Target, reason: String },
    /// The request's deadline passed. `sent` = a request was in flight (a
    /// write's outcome is unknown); otherwise nothing was applied.
    #[error("no answer within {waited_ms} ms ({detail})")]
    DeadlineExceeded {
        waited_ms: u64,
        sent: bool,
        detail: String,
    },
}

impl ForwardError {
    /// Whether the attempt that failed this way certainly had no effect on
    /// the leader, so that sending it again cannot apply a write twice.
    ///
    /// - Nothing was sent: `NoLeader`, `Dial`, `DeadlineExceeded { sent: false }`.
    /// - The receiver refused with NotLeader or Unavailable: by the
    ///   [`crate::Handle`] contract it answers those only before proposing.
    /// - Everything else (a transport failure after sending, a deadline with
    ///   a request in flight, any other answer) may have applied.
    pub fn certainly_not_applied(&self) -> bool {
        match self {
            ForwardError::NoLeader | ForwardError::Dial { .. } => true,
            ForwardError::DeadlineExceeded { sent, .. } => !sent,
            ForwardError::Answered { error, .. } => {
                matches!(error, ApiError::NotLeader { .. } | ApiError::Unavailable(_))
            }
            ForwardError::Transport { .. } => false,
        }
    }
}

impl From<ForwardError> for ApiError {
    /// The error a client receives when forwarding ended this way:
    /// the leader's own answer verbatim; Unavailable when certainly nothing
    /// was applied (retry here or elsewhere); Inconsistent when the outcome
    /// is unknown. A raw transport error never reaches a client.
    fn from(error: ForwardError) -> ApiError {
        let message = error.to_string();
        match error {
            // A NotLeader from the leader we called is a redirect we could not
            // complete in time; the client sees the contract's Unavailable
            // (nothing applied) rather than a hint to a node we could not reach.
            ForwardError::Answered {
                error: ApiError::NotLeader { .. },
                ..
            } => ApiError::Unavailable(message),
            ForwardError::Answered { error, .. } => error,
            ForwardError::NoLeader | ForwardError::Dial { .. } => ApiError::Unavailable(message),
            ForwardError::DeadlineExceeded { sent: false, .. } => ApiError::Unavailable(message),
            ForwardError::DeadlineExceeded { sent: true, .. } | ForwardError::Transport { .. } => {
                ApiError::Inconsistent(format!("outcome unknown: {message}"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_proto::error::LeaderHint;

    fn target() -> Target {
        Target {
            leader_id: 2,
            peer_address: "127.0.0.1:8002".into(),
        }
    }

    #[test]
    fn only_unsent_or_refused_attempts_count_as_not_applied() {
        // The retry rule: refusals and unsent attempts are safe, anything else is not.
        let safe = [
            ForwardError::NoLeader,
            ForwardError::Dial {
                target: target(),
                reason: "refused".into(),
            },
            ForwardError::DeadlineExceeded {
                waited_ms: 5,
                sent: false,
                detail: String::new(),
            },
            ForwardError::Answered {
                target: target(),
                error: ApiError::NotLeader {
                    hint: LeaderHint::default(),
                },
            },
            ForwardError::Answered {
                target: target(),
                error: ApiError::Unavailable("stopping".into()),
            },
        ];
        for e in safe {
            assert!(e.certainly_not_applied(), "{e:?}");
        }
        let unsafe_ = [
            ForwardError::Transport {
                target: target(),
                reason: "reset".into(),
            },
            ForwardError::DeadlineExceeded {
                waited_ms: 5,
                sent: true,
                detail: String::new(),
            },
            ForwardError::Answered {
                target: target(),
                error: ApiError::Inconsistent("lost leadership".into()),
            },
            ForwardError::Answered {
                target: target(),
                error: ApiError::Internal("bug".into()),
            },
        ];
        for e in unsafe_ {
            assert!(!e.certainly_not_applied(), "{e:?}");
        }
    }

    #[test]
    fn clients_see_contract_kinds_never_transport_errors() {
        // Unsent -> Unavailable, possibly sent -> Inconsistent, answers verbatim.
        assert!(matches!(
            ApiError::from(ForwardError::NoLeader),
            ApiError::Unavailable(_)
        ));
        assert!(matches!(
            ApiError::from(ForwardError::Dial {
                target: target(),
                reason: "refused".into()
            }),
            ApiError::Unavailable(_)
        ));
        assert!(matches!(
            ApiError::from(ForwardError::Transport {
                target: target(),
                reason: "reset".into()
            }),
            ApiError::Inconsistent(_)
        ));
        assert!(matches!(
            ApiError::from(ForwardError::DeadlineExceeded {
                waited_ms: 1,
                sent: true,
                detail: String::new()
            }),
            ApiError::Inconsistent(_)
        ));
        assert!(matches!(
            ApiError::from(ForwardError::Answered {
                target: target(),
                error: ApiError::NotLeader {
                    hint: LeaderHint::default()
                }
            }),
            ApiError::Unavailable(_)
        ));
        let cas = ApiError::CasFailure("expected 3".into());
        assert_eq!(
            ApiError::from(ForwardError::Answered {
                target: target(),
                error: cas.clone()
            }),
            cas
        );
    }
}
