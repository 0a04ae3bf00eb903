//! Per-connection and per-node budgets on the client port: requests in
//! flight per connection (`requests_per_connection_max`), open watches per
//! connection (`watches_per_connection_max`) and on the node (`watches_max`).
//!
//! A request over budget is refused at once, before any work, with
//! ResourceExhausted naming the limit and its value; every other connection
//! keeps being served.
//!
//! The per-connection counts live with the connection
//! ([`ConnectionInfo::take_slot`], beside its requests in flight), so they
//! end with it; [`ConnectionLimits`] holds the budgets and the node's watch
//! count. [`RequestLimitLayer`] applies the request budget to every call of
//! the client server.
//!
//! Invariants: a count never goes below zero (asserted on release); a node's
//! watch count is the number of watch [`Permit`]s alive.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use cairn_proto::error::ApiError;
use tonic::codegen::http;

use crate::connections::{ConnectionInfo, Slot, SlotKind};

/// The budgets, from the node configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionBudget {
    pub requests_per_connection_max: usize,
    pub watches_per_connection_max: usize,
    pub watches_max: usize,
}

/// The budgets, and the watches open on the node.
pub struct ConnectionLimits {
    budget: ConnectionBudget,
    watches: AtomicUsize,
}

/// Holds one request or watch slot; releases it when dropped.
pub struct Permit {
    _connection: Option<Slot>,
    /// Set for a watch: the node-wide count it holds.
    node_watch: Option<Arc<ConnectionLimits>>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(limits) = &self.node_watch {
            let before = limits.watches.fetch_sub(1, Ordering::SeqCst);
            assert!(before > 0, "a watch slot is released once");
        }
    }
}

/// A slot of `kind` on `connection` under its budget `max` (named `limit`);
/// no slot when the connection is unknown.
fn connection_slot(
    connection: Option<&ConnectionInfo>,
    kind: SlotKind,
    limit: &str,
    max: usize,
) -> Result<Option<Slot>, ApiError> {
    let Some(connection) = connection else {
        return Ok(None);
    };
    connection.take_slot(kind, max).map(Some).map_err(|held| {
        let what = match kind {
            SlotKind::Request => "requests in flight",
            SlotKind::Watch => "watches open",
        };
        ApiError::exhausted(
            limit,
            max as u64,
            format!("this connection already has {held} {what}"),
        )
    })
}

impl ConnectionLimits {
    pub fn new(budget: ConnectionBudget) -> Arc<ConnectionLimits> {
        Arc::new(ConnectionLimits {
            budget,
            watches: AtomicUsize::new(0),
        })
    }

    /// A slot for one request on `connection` (unknown connection: only the
    /// node-wide budgets apply, and requests have none).
    pub fn request(&self, connection: Option<&ConnectionInfo>) -> Result<Permit, ApiError> {
        let slot = connection_slot(
            connection,
            SlotKind::Request,
            "requests_per_connection_max",
            self.budget.requests_per_connection_max,
        )?;
        Ok(Permit {
            _connection: slot,
            node_watch: None,
        })
    }

    /// A slot for one open watch on `connection` and on the node.
    pub fn watch(
        self: &Arc<Self>,
        connection: Option<&ConnectionInfo>,
    ) -> Result<Permit, ApiError> {
        let max = self.budget.watches_max;
        self.watches
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |open| {
                (open < max).then_some(open + 1)
            })
            .map_err(|open| {
                ApiError::exhausted(
                    "watches_max",
                    max as u64,
                    format!("this node already serves {open} watches"),
                )
            })?;
        // Holds the node's count from here: released if the connection refuses.
        let mut permit = Permit {
            _connection: None,
            node_watch: Some(self.clone()),
        };
        permit._connection = connection_slot(
            connection,
            SlotKind::Watch,
            "watches_per_connection_max",
            self.budget.watches_per_connection_max,
        )?;
        Ok(permit)
    }

    /// Open watches on the node (for tests and status).
    pub fn watch_count(&self) -> usize {
        self.watches.load(Ordering::SeqCst)
    }
}

/// The connection a request arrived on.
pub fn connection_of<B>(request: &http::Request<B>) -> Option<&ConnectionInfo> {
    request.extensions().get::<ConnectionInfo>()
}

/// Applies `requests_per_connection_max` to every call of a server, and
/// names `client_message_bytes_max` when gRPC refuses a message over it.
#[derive(Clone)]
pub struct RequestLimitLayer {
    limits: Arc<ConnectionLimits>,
    message_bytes_max: usize,
}

impl RequestLimitLayer {
    pub fn new(limits: Arc<ConnectionLimits>, message_bytes_max: usize) -> RequestLimitLayer {
        RequestLimitLayer {
            limits,
            message_bytes_max,
        }
    }
}

/// tonic refuses a request message over the decoding limit with
/// OUT_OF_RANGE and its own words, before the handler runs; this turns that
/// refusal into the node's: ResourceExhausted naming the limit's config key.
fn name_the_message_limit(
    response: http::Response<tonic::body::Body>,
    message_bytes_max: usize,
) -> http::Response<tonic::body::Body> {
    let Some(status) = tonic::Status::from_header_map(response.headers()) else {
        return response;
    };
    if status.code() != tonic::Code::OutOfRange
        || !status
            .message()
            .starts_with("Error, decoded message length too large")
    {
        return response;
    }
    tonic::Status::from(ApiError::exhausted(
        "client_message_bytes_max",
        message_bytes_max as u64,
        "the request message is too large",
    ))
    .into_http()
}

impl RequestLimitLayer {
    /// `inner`, with its calls counted and bounded.
    pub fn wrap<S>(&self, inner: S) -> RequestLimit<S> {
        RequestLimit {
            inner,
            limits: self.limits.clone(),
            message_bytes_max: self.message_bytes_max,
        }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for RequestLimit<S> {
    const NAME: &'static str = S::NAME;
}

/// See [`RequestLimitLayer`]. A streaming call holds its slot until its
/// handler has answered (the stream itself is counted by the watch budget).
#[derive(Clone)]
pub struct RequestLimit<S> {
    inner: S,
    limits: Arc<ConnectionLimits>,
    message_bytes_max: usize,
}

impl<S, B> tonic::codegen::Service<http::Request<B>> for RequestLimit<S>
where
    S: tonic::codegen::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match self.limits.request(connection_of(&request)) {
            Ok(permit) => {
                let answer = self.inner.call(request);
                let message_bytes_max = self.message_bytes_max;
                Box::pin(async move {
                    let response = answer.await;
                    drop(permit);
                    response.map(|r| name_the_message_limit(r, message_bytes_max))
                })
            }
            Err(refusal) => {
                let response = tonic::Status::from(refusal).into_http();
                Box::pin(async move { Ok(response) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Arc<ConnectionLimits> {
        ConnectionLimits::new(ConnectionBudget {
            requests_per_connection_max: 2,
            watches_per_connection_max: 2,
            watches_max: 3,
        })
    }

    fn connection(port: u16) -> ConnectionInfo {
        ConnectionInfo::for_tests(([127, 0, 0, 1], port).into())
    }

    fn limit_of(e: ApiError) -> String {
        match e {
            ApiError::ResourceExhausted { limit, .. } => limit,
            other => panic!("expected ResourceExhausted, got {other:?}"),
        }
    }

    #[test]
    fn requests_are_bounded_per_connection_and_released_on_drop() {
        let l = limits();
        let (a, b) = (connection(1), connection(2));
        let a1 = l.request(Some(&a)).unwrap();
        let _a2 = l.request(Some(&a)).unwrap();
        let e = l.request(Some(&a)).err().unwrap();
        assert_eq!(limit_of(e), "requests_per_connection_max");
        // Another connection is not affected, nor a request of no known connection.
        let _b1 = l.request(Some(&b)).unwrap();
        let _unknown = l.request(None).unwrap();
        drop(a1);
        let _a3 = l.request(Some(&a)).unwrap();
    }

    #[test]
    fn watches_are_bounded_per_connection_and_per_node() {
        let l = limits();
        let (a, b, c) = (connection(1), connection(2), connection(3));
        let w1 = l.watch(Some(&a)).unwrap();
        let _w2 = l.watch(Some(&a)).unwrap();
        assert_eq!(
            limit_of(l.watch(Some(&a)).err().unwrap()),
            "watches_per_connection_max"
        );
        // The refusal by the connection's budget took no slot of the node's.
        assert_eq!(l.watch_count(), 2);
        let _w3 = l.watch(Some(&b)).unwrap();
        assert_eq!(l.watch_count(), 3);
        assert_eq!(limit_of(l.watch(Some(&c)).err().unwrap()), "watches_max");
        drop(w1);
        let _w4 = l.watch(Some(&c)).unwrap();
        assert_eq!(l.watch_count(), 3);
    }

    #[test]
    fn requests_and_watches_are_counted_apart() {
        // Two watches open on a connection leave its two request slots free.
        let l = limits();
        let a = connection(1);
        let _w = (l.watch(Some(&a)).unwrap(), l.watch(Some(&a)).unwrap());
        let _r = (l.request(Some(&a)).unwrap(), l.request(Some(&a)).unwrap());
        assert_eq!(
            limit_of(l.request(Some(&a)).err().unwrap()),
            "requests_per_connection_max"
        );
    }
}
