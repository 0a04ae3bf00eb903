//! [`LeaderReadIndex`]: a follower asks the leader for a read index, so that it
//! can serve a strong read, list or watch from its own table.
//!
//! One call of [`LeaderReadIndex::ask`] is one `ReadIndex` RPC over the
//! [`LeaderChannel`]. The leader answers from a leadership confirmation that
//! began after the call arrived (its read batcher), so the index it returns is
//! at or above every write acknowledged before the follower's request began;
//! the follower then waits until it has applied that index (the node's
//! [`crate::Handle::confirm_read`]) and reads locally: the read-index protocol of
//! the Raft thesis (§6.4), served by followers as etcd serves them.
//!
//! Failures are mapped so that nothing stale is ever served:
//!
//! | what happened                                   | error                 |
//! |-------------------------------------------------|-----------------------|
//! | the leader answered                             | its answer (NotLeader names the new leader) |
//! | no leader known, the dial failed                | Inconsistent          |
//! | sent, then the connection lost or no answer     | Inconsistent          |
//! | a message over the size limit, a foreign status | Internal              |
//!
//! Inconsistent on a read means "could not be confirmed now": the request's
//! retry loop tries again until its deadline, then answers it.

use std::sync::Arc;
use std::time::Duration;

use cairn_proto::error::ApiError;
use cairn_proto::v1::forwarding_service_client::ForwardingServiceClient;
use cairn_proto::v1::ReadIndexRequest;
use cairn_request::Failure;
use tokio::time::Instant;

use crate::channel::LeaderChannel;
use crate::forwarder::RequestStamp;
use crate::metrics::{self, Method};

/// Asks the leader for read indexes over the node's [`LeaderChannel`].
#[derive(Clone)]
pub struct LeaderReadIndex {
    channel: Arc<LeaderChannel>,
    stamp: Option<RequestStamp>,
}

impl LeaderReadIndex {
    /// `stamp` adds this node's credentials to every call (see [`RequestStamp`]).
    pub fn new(channel: Arc<LeaderChannel>, stamp: Option<RequestStamp>) -> LeaderReadIndex {
        LeaderReadIndex { channel, stamp }
    }

    /// One `ReadIndex` call to the leader, answered by `deadline`.
    pub async fn ask(&self, deadline: Instant) -> Result<u64, ApiError> {
        let started = Instant::now();
        let result = self.call(deadline).await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(failure) => failure.label(),
        };
        metrics::record_call(Method::ReadIndex, outcome, started.elapsed());
        result.map_err(|failure| match failure {
            Failure::Answered(error) => error,
            Failure::NotSent(why) => ApiError::Inconsistent(format!(
                "no leader reachable to confirm a read index: {why}"
            )),
            Failure::Lost(why) | Failure::NoAnswer(why) => {
                ApiError::Inconsistent(format!("the leader did not confirm a read index: {why}"))
            }
            Failure::TooLarge(why) | Failure::Foreign(why) => {
                ApiError::Internal(format!("a read index call failed: {why}"))
            }
        })
    }

    async fn call(&self, deadline: Instant) -> Result<u64, Failure> {
        let (target, channel) = self.channel.get(deadline).await?;
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining == Duration::ZERO {
            return Err(Failure::NotSent(format!(
                "deadline passed before asking leader {target}"
            )));
        }
        let mut client = ForwardingServiceClient::new(channel);
        let mut call = tonic::Request::new(ReadIndexRequest {});
        if let Some(stamp) = &self.stamp {
            stamp(call.metadata_mut());
        }
        call.set_timeout(remaining);
        let failure = match tokio::time::timeout(remaining, client.read_index(call)).await {
            Ok(Ok(response)) => return Ok(response.into_inner().index),
            Ok(Err(status)) => Failure::from_status(&status),
            Err(_elapsed) => Failure::NoAnswer(format!(
                "waiting {} ms for leader {target}",
                remaining.as_millis()
            )),
        };
        match &failure {
            Failure::Answered(ApiError::NotLeader { hint }) => {
                self.channel.not_leader(&target, hint)
            }
            Failure::Answered(ApiError::Unavailable(_)) | Failure::Lost(_) => {
                self.channel.failed(&target)
            }
            _ => {}
        }
        Err(failure)
    }
}
