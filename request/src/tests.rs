//! The decision table, against every error kind and every transport failure.

use std::collections::BTreeSet;
use std::time::Duration;

use cairn_proto::error::{ApiError, LeaderHint};
use cairn_proto::v1::ErrorKind;
use tokio::time::Instant;

use crate::decide::*;
use crate::{run, Attempts, Ended, Pacing};

use Operation::{Mutation, Read};
use Outcome::{NotApplied, Unknown};

fn leader() -> LeaderHint {
    LeaderHint {
        leader_id: Some(2),
        client_address: Some("127.0.0.1:7002".into()),
        peer_address: Some("127.0.0.1:8002".into()),
    }
}

/// One error of every kind, with what a read and a write do after it
/// (first attempt of many).
fn every_kind() -> Vec<(ApiError, Step, Step)> {
    let stop = Step::Stop;
    vec![
        (ApiError::NotFound, stop(NotApplied), stop(NotApplied)),
        (
            ApiError::CasFailure("x".into()),
            stop(NotApplied),
            stop(NotApplied),
        ),
        (
            ApiError::WrongUid("x".into()),
            stop(NotApplied),
            stop(NotApplied),
        ),
        (
            ApiError::GroupVersionMismatch {
                requested: Default::default(),
                stored: Box::default(),
            },
            stop(NotApplied),
            stop(NotApplied),
        ),
        // A read may be confirmed elsewhere or later; a write may still commit.
        (
            ApiError::Inconsistent("x".into()),
            Step::Retry,
            stop(Unknown),
        ),
        // Refused before proposing, by the node's contract.
        (ApiError::Unavailable("x".into()), Step::Retry, Step::Retry),
        (
            ApiError::NotLeader { hint: leader() },
            Step::Redirect(leader()),
            Step::Redirect(leader()),
        ),
        (
            ApiError::NotLeader {
                hint: LeaderHint::default(),
            },
            Step::Retry,
            Step::Retry,
        ),
        (
            ApiError::WatchClosed("x".into()),
            stop(NotApplied),
            stop(NotApplied),
        ),
        (
            ApiError::Compacted {
                oldest_retained_revision: 3,
            },
            stop(NotApplied),
            stop(NotApplied),
        ),
        (
            ApiError::invalid("resource.id.name", "empty"),
            stop(NotApplied),
            stop(NotApplied),
        ),
        (
            ApiError::exhausted("list_results_max", 1, "2 results"),
            stop(NotApplied),
            stop(NotApplied),
        ),
        (
            ApiError::Internal("bug".into()),
            stop(NotApplied),
            stop(Unknown),
        ),
        (
            ApiError::Unauthenticated("x".into()),
            stop(NotApplied),
            stop(NotApplied),
        ),
        // Never rewritten: a refused permission is the same at every node.
        (
            ApiError::PermissionDenied("x".into()),
            stop(NotApplied),
            stop(NotApplied),
        ),
        // A command the cluster version does not enable: the same at every node.
        (
            ApiError::FailedPrecondition("x".into()),
            stop(NotApplied),
            stop(NotApplied),
        ),
    ]
}

#[test]
fn every_error_kind_has_its_step_for_reads_and_writes() {
    let mut covered = BTreeSet::new();
    for (error, read, write) in every_kind() {
        covered.insert(error.kind() as i32);
        let effect = classify(&Failure::Answered(error.clone()));
        assert_eq!(
            next_step(Read, effect.clone(), 1, 10),
            read,
            "read, {error:?}"
        );
        assert_eq!(
            next_step(Mutation, effect, 1, 10),
            write,
            "write, {error:?}"
        );
        // The same error through a status (the one decoder) decides the same.
        let status = tonic::Status::from(error.clone());
        assert_eq!(Failure::from_status(&status), Failure::Answered(error));
    }
    let every: BTreeSet<i32> = (0..64)
        .filter(|k| ErrorKind::try_from(*k).is_ok_and(|k| k != ErrorKind::Unspecified))
        .collect();
    assert_eq!(covered, every, "every error kind is in the table");
}

#[derive(Debug)]
struct Chain(std::io::Error);

impl std::fmt::Display for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "transport error")
    }
}

impl std::error::Error for Chain {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

fn transport(kind: std::io::ErrorKind) -> tonic::Status {
    let mut status = tonic::Status::unavailable("transport error");
    status.set_source(std::sync::Arc::new(Chain(std::io::Error::from(kind))));
    status
}

#[test]
fn every_transport_failure_has_its_step_for_reads_and_writes() {
    let cases = [
        // Nothing left this process: safe to send anywhere.
        (
            transport(std::io::ErrorKind::ConnectionRefused),
            "not_sent",
            Step::Retry,
            Step::Retry,
        ),
        (
            transport(std::io::ErrorKind::HostUnreachable),
            "not_sent",
            Step::Retry,
            Step::Retry,
        ),
        // Unavailable after sending: a write may have reached the node.
        (
            transport(std::io::ErrorKind::ConnectionReset),
            "lost",
            Step::Retry,
            Step::Stop(Unknown),
        ),
        (
            tonic::Status::unavailable("connection reset"),
            "lost",
            Step::Retry,
            Step::Stop(Unknown),
        ),
        (
            tonic::Status::unknown("h2 protocol error"),
            "lost",
            Step::Retry,
            Step::Stop(Unknown),
        ),
        // The deadline the call carried passed.
        (
            tonic::Status::deadline_exceeded("timeout expired"),
            "no_answer",
            Step::Retry,
            Step::Stop(Unknown),
        ),
        (
            tonic::Status::cancelled("timeout expired"),
            "no_answer",
            Step::Retry,
            Step::Stop(Unknown),
        ),
        // Over a message limit: every node answers the same; never retried.
        (
            tonic::Status::out_of_range(
                "Error, decoded message length too large: found 23068672 bytes, the limit is: 4194304 bytes",
            ),
            "too_large",
            Step::Stop(NotApplied),
            Step::Stop(Unknown),
        ),
        (
            tonic::Status::resource_exhausted("message length too large"),
            "too_large",
            Step::Stop(NotApplied),
            Step::Stop(Unknown),
        ),
        // A server that does not know the call (a node of an older release): it certainly
        // did not run it.
        (
            tonic::Status::unimplemented("no such method"),
            "failed_precondition",
            Step::Stop(NotApplied),
            Step::Stop(NotApplied),
        ),
        // Not a Cairn server.
        (
            tonic::Status::permission_denied("a proxy said no"),
            "foreign",
            Step::Stop(NotApplied),
            Step::Stop(Unknown),
        ),
    ];
    for (status, label, read, write) in cases {
        let failure = Failure::from_status(&status);
        assert_eq!(failure.label(), label, "{status:?}");
        let effect = classify(&failure);
        assert_eq!(next_step(Read, effect.clone(), 1, 10), read, "{failure}");
        assert_eq!(next_step(Mutation, effect, 1, 10), write, "{failure}");
    }
    // A garbled details field is not a Cairn answer.
    let garbled =
        tonic::Status::with_details(tonic::Code::Unavailable, "x", bytes_of(&[0xff, 0x01]));
    assert_eq!(Failure::from_status(&garbled).label(), "lost");
    // Failures made by the caller itself.
    for (failure, read, write) in [
        (
            Failure::NotSent("no leader known".into()),
            Step::Retry,
            Step::Retry,
        ),
        (
            Failure::NoAnswer("attempt timed out".into()),
            Step::Retry,
            Step::Stop(Unknown),
        ),
    ] {
        let effect = classify(&failure);
        assert_eq!(next_step(Read, effect.clone(), 1, 10), read);
        assert_eq!(next_step(Mutation, effect, 1, 10), write);
    }
}

fn bytes_of(b: &'static [u8]) -> tonic::codegen::Bytes {
    tonic::codegen::Bytes::from_static(b)
}

#[test]
fn the_last_attempt_stops_with_nothing_applied() {
    for effect in [Effect::Transient, Effect::Redirect(leader())] {
        assert_eq!(
            next_step(Mutation, effect.clone(), 3, 3),
            Step::Stop(NotApplied)
        );
        assert_eq!(next_step(Read, effect, 3, 3), Step::Stop(NotApplied));
    }
    assert_eq!(
        next_step(Read, Effect::Unsure, 3, 3),
        Step::Stop(NotApplied)
    );
    assert_eq!(
        next_step(Mutation, Effect::Unsure, 1, 3),
        Step::Stop(Unknown)
    );
}

/// A transport whose attempts fail as scripted, counting them.
struct Scripted {
    failures: Vec<Failure>,
    made: usize,
    redirects: usize,
}

impl Attempts for Scripted {
    type Response = &'static str;

    async fn attempt(&mut self, _deadline: Instant) -> Result<&'static str, Failure> {
        let i = self.made;
        self.made += 1;
        match self.failures.get(i) {
            Some(f) => Err(f.clone()),
            None => Ok("answer"),
        }
    }

    fn move_on(&mut self, _failure: &Failure, leader: Option<&LeaderHint>) -> bool {
        self.redirects += usize::from(leader.is_some());
        leader.is_none()
    }
}

fn pacing() -> Pacing {
    Pacing {
        pause_initial: Duration::from_millis(1),
        pause_max: Duration::from_millis(5),
        attempts_max: u32::MAX,
    }
}

fn scripted(failures: Vec<Failure>) -> Scripted {
    Scripted {
        failures,
        made: 0,
        redirects: 0,
    }
}

#[tokio::test]
async fn the_loop_retries_what_did_not_apply_and_stops_at_once_on_the_rest() {
    let deadline = Instant::now() + Duration::from_secs(10);
    // Refused, redirected, not sent: the write goes on and is answered.
    let mut t = scripted(vec![
        Failure::Answered(ApiError::Unavailable("stopping".into())),
        Failure::Answered(ApiError::NotLeader { hint: leader() }),
        Failure::NotSent("refused".into()),
    ]);
    assert_eq!(
        run(Mutation, &mut t, &pacing(), deadline).await,
        Ok("answer")
    );
    assert_eq!((t.made, t.redirects), (4, 1));
    // Lost after sending: a write stops at once, outcome unknown; a read goes on.
    let lost = Failure::Lost("reset".into());
    let mut t = scripted(vec![lost.clone()]);
    assert_eq!(
        run(Mutation, &mut t, &pacing(), deadline).await,
        Err(Ended::Stopped {
            failure: lost.clone(),
            outcome: Unknown
        })
    );
    assert_eq!(t.made, 1);
    let mut t = scripted(vec![lost]);
    assert_eq!(run(Read, &mut t, &pacing(), deadline).await, Ok("answer"));
    // Too large: a read stops after one attempt, long before its deadline.
    let started = Instant::now();
    let large = Failure::TooLarge("decoded message length too large".into());
    let mut t = scripted(vec![large.clone(); 1000]);
    assert_eq!(
        run(Read, &mut t, &pacing(), deadline).await,
        Err(Ended::Stopped {
            failure: large,
            outcome: NotApplied
        })
    );
    assert_eq!(t.made, 1);
    assert!(started.elapsed() < Duration::from_secs(1));
    // Nothing ever answers: out of time, naming the last failure.
    let mut t = scripted(vec![Failure::NotSent("refused".into()); 100_000]);
    let ended = run(
        Read,
        &mut t,
        &pacing(),
        Instant::now() + Duration::from_millis(50),
    )
    .await;
    assert!(
        matches!(
            ended,
            Err(Ended::OutOfTime {
                last: Some(Failure::NotSent(_))
            })
        ),
        "{ended:?}"
    );
    // Nodes answer Inconsistent (no read index confirmed), then the deadline cuts the
    // last attempt short: out of time, naming the nodes' answer, not the cut.
    let inconsistent = Failure::Answered(ApiError::Inconsistent("no read index".into()));
    let mut script = vec![inconsistent.clone(); 3];
    script.extend(vec![Failure::NoAnswer("cut short".into()); 100_000]);
    let mut t = scripted(script);
    let ended = run(
        Read,
        &mut t,
        &pacing(),
        Instant::now() + Duration::from_millis(50),
    )
    .await;
    assert_eq!(
        ended,
        Err(Ended::OutOfTime {
            last: Some(inconsistent)
        })
    );
}
