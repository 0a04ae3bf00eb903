//! # cairn-request — one request layer: decide once, retry in one loop
//!
//! **Purpose.** What a caller does after an attempt of a request failed:
//! try again, follow the leader a node named, or stop and say whether the
//! request may have applied. [`decide`] holds the decision, pure (no I/O,
//! no clock) and table-tested against every error kind and every transport
//! failure; [`attempts::run`] is the one loop over it. Two transports use
//! that loop: `cairn_forwarding::Forwarder` (a follower sending a request
//! to the leader's peer port, or running it here when this node leads) and
//! `cairn_client::Client` (a caller asking the nodes' client ports).
//!
//! **What it must not do.** Send a write or delete again after an attempt
//! that may have applied; retry a failure that every node would repeat;
//! read an error's kind anywhere but from `cairn_proto::error::ApiError`'s
//! one decoder; classify anything by message text.
//!
//! ## Invariants
//! - [`decide::next_step`] answers `Retry` or `Redirect` for a mutation only
//!   after an effect that certainly did not apply (`Transient`, `Redirect`).
//! - A `Verdict` or `Recurring` effect is never retried.
//! - [`attempts::run`] makes no attempt once its deadline has passed.

#![forbid(unsafe_code)]

pub mod attempts;
pub mod decide;

pub use attempts::{run, Attempts, Ended, Pacing};
pub use decide::{classify, next_step, unanswered, Effect, Failure, Operation, Outcome, Step};

#[cfg(test)]
mod tests;
