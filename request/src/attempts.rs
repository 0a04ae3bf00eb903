//! [`run`]: the one retry loop. The forwarder (to the leader's peer port)
//! and the client (to any node's client port) each implement [`Attempts`],
//! their transport; what follows a failure is decided by
//! [`crate::decide`] alone.

use std::future::Future;
use std::time::Duration;

use cairn_proto::error::LeaderHint;
use tokio::time::Instant;

use crate::decide::{classify, next_step, Failure, Operation, Outcome, Step};

/// A transport: makes one attempt, and moves on after a failure.
pub trait Attempts {
    type Response;

    /// Makes one attempt at the current target; must end by `deadline`.
    fn attempt(
        &mut self,
        deadline: Instant,
    ) -> impl Future<Output = Result<Self::Response, Failure>>;

    /// The attempt failed with `failure` and another follows: choose its
    /// target (`leader` when the failure named the leader). Returns whether
    /// to pause before it.
    fn move_on(&mut self, failure: &Failure, leader: Option<&LeaderHint>) -> bool;
}

/// Pacing of [`run`]: pauses double from `pause_initial` up to `pause_max`,
/// always cut short by the deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pacing {
    pub pause_initial: Duration,
    pub pause_max: Duration,
    /// At most this many attempts (the deadline usually ends the loop first).
    pub attempts_max: u32,
}

/// Why [`run`] ended without an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Ended {
    /// The decision was to stop after this failure.
    Stopped { failure: Failure, outcome: Outcome },
    /// The deadline passed between attempts; every attempt so far certainly
    /// did not apply. `last`: the last answer a node gave (a failure without
    /// an answer, such as the final attempt the deadline cut short, does not
    /// hide why the nodes refused), else the last failure; `None` if no
    /// attempt was made.
    OutOfTime { last: Option<Failure> },
}

/// Makes attempts until one succeeds, the decision says stop, or `deadline`
/// passes.
pub async fn run<A: Attempts>(
    operation: Operation,
    attempts: &mut A,
    pacing: &Pacing,
    deadline: Instant,
) -> Result<A::Response, Ended> {
    let mut pause = pacing.pause_initial;
    let mut last = None;
    let mut made = 0u32;
    loop {
        if Instant::now() >= deadline {
            return Err(Ended::OutOfTime { last });
        }
        let failure = match attempts.attempt(deadline).await {
            Ok(response) => return Ok(response),
            Err(failure) => failure,
        };
        made = made.saturating_add(1);
        let wait = match next_step(operation, classify(&failure), made, pacing.attempts_max) {
            Step::Stop(outcome) => return Err(Ended::Stopped { failure, outcome }),
            Step::Redirect(leader) => attempts.move_on(&failure, Some(&leader)),
            Step::Retry => attempts.move_on(&failure, None),
        };
        let answered = |f: &Failure| matches!(f, Failure::Answered(_));
        if answered(&failure) || !last.as_ref().is_some_and(answered) {
            last = Some(failure);
        }
        if wait {
            tokio::time::sleep_until(deadline.min(Instant::now() + pause)).await;
            pause = (pause * 2).min(pacing.pause_max);
        }
    }
}
