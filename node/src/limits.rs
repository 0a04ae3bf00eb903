//! Per-connection and per-node budgets on the client port: requests in
//! flight per connection (`requests_per_connection_max`), open watches per
//! connection (`watches_per_connection_max`) and on the node (`watches_max`).
//!
//! A connection is named by its remote address (unique among the open
//! connections of one listener). A request over budget is refused at once,
//! before any work, with ResourceExhausted naming the limit and its value;
//! every other connection keeps being served.
//!
//! [`ConnectionLimits`] is the pure bookkeeping (counts under one short
//! mutex, released by guards on drop); [`RequestLimitLayer`] applies the
//! request budget to every call of the client server.
//!
//! Invariants: a count never goes below zero (asserted on release); an
//! entry exists only for a connection with something in flight or open.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use cairn_proto::error::ApiError;
use tonic::codegen::http;

/// The budgets, from the node configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionBudget {
    pub requests_per_connection_max: usize,
    pub watches_per_connection_max: usize,
    pub watches_max: usize,
}

#[derive(Default)]
struct Counts {
    by_connection: HashMap<SocketAddr, PerConnection>,
    watches: usize,
}

#[derive(Default, Clone, Copy)]
struct PerConnection {
    requests: usize,
    watches: usize,
}

impl PerConnection {
    fn is_idle(&self) -> bool {
        self.requests == 0 && self.watches == 0
    }
}

/// What a guard releases.
#[derive(Clone, Copy)]
enum Slot {
    Request,
    Watch,
}

/// Counts what every connection has in flight or open.
pub struct ConnectionLimits {
    budget: ConnectionBudget,
    counts: Mutex<Counts>,
}

/// Holds one request or watch slot; releases it when dropped.
pub struct Permit {
    limits: Arc<ConnectionLimits>,
    connection: Option<SocketAddr>,
    slot: Slot,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.limits.release(self.connection, self.slot);
    }
}

impl ConnectionLimits {
    pub fn new(budget: ConnectionBudget) -> Arc<ConnectionLimits> {
        Arc::new(ConnectionLimits {
            budget,
            counts: Mutex::new(Counts::default()),
        })
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for one request on `connection` (unknown connection: only the
    /// node-wide budgets apply, and requests have none).
    pub fn request(self: &Arc<Self>, connection: Option<SocketAddr>) -> Result<Permit, ApiError> {
        if let Some(c) = connection {
            let max = self.budget.requests_per_connection_max;
            let mut counts = self.counts();
            let entry = counts.by_connection.entry(c).or_default();
            if entry.requests >= max {
                let refusal = ApiError::exhausted(
                    "requests_per_connection_max",
                    max as u64,
                    format!(
                        "this connection already has {} requests in flight",
                        entry.requests
                    ),
                );
                if entry.is_idle() {
                    counts.by_connection.remove(&c);
                }
                return Err(refusal);
            }
            entry.requests += 1;
        }
        Ok(Permit {
            limits: self.clone(),
            connection,
            slot: Slot::Request,
        })
    }

    /// A slot for one open watch on `connection` and on the node.
    pub fn watch(self: &Arc<Self>, connection: Option<SocketAddr>) -> Result<Permit, ApiError> {
        let mut counts = self.counts();
        if counts.watches >= self.budget.watches_max {
            return Err(ApiError::exhausted(
                "watches_max",
                self.budget.watches_max as u64,
                format!("this node already serves {} watches", counts.watches),
            ));
        }
        if let Some(c) = connection {
            let max = self.budget.watches_per_connection_max;
            let entry = counts.by_connection.entry(c).or_default();
            if entry.watches >= max {
                let refusal = ApiError::exhausted(
                    "watches_per_connection_max",
                    max as u64,
                    format!("this connection already has {} watches open", entry.watches),
                );
                if entry.is_idle() {
                    counts.by_connection.remove(&c);
                }
                return Err(refusal);
            }
            entry.watches += 1;
        }
        counts.watches += 1;
        Ok(Permit {
            limits: self.clone(),
            connection,
            slot: Slot::Watch,
        })
    }

    fn release(&self, connection: Option<SocketAddr>, slot: Slot) {
        let mut counts = self.counts();
        if let Slot::Watch = slot {
            assert!(counts.watches > 0, "a watch slot is released once");
            counts.watches -= 1;
        }
        let Some(c) = connection else {
            return;
        };
        let entry = counts
            .by_connection
            .get_mut(&c)
            .expect("a held slot keeps its connection's entry");
        match slot {
            Slot::Request => {
                assert!(entry.requests > 0, "a request slot is released once");
                entry.requests -= 1;
            }
            Slot::Watch => {
                assert!(entry.watches > 0, "a watch slot is released once");
                entry.watches -= 1;
            }
        }
        if entry.is_idle() {
            counts.by_connection.remove(&c);
        }
    }

    /// Open watches on the node (for tests and status).
    pub fn watch_count(&self) -> usize {
        self.counts().watches
    }
}

/// The remote address of the connection a request arrived on.
pub fn connection_of<B>(request: &http::Request<B>) -> Option<SocketAddr> {
    request
        .extensions()
        .get::<crate::connections::ConnectionInfo>()
        .map(|info| info.remote_address)
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

    fn addr(port: u16) -> Option<SocketAddr> {
        Some(SocketAddr::from(([127, 0, 0, 1], port)))
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
        let a1 = l.request(addr(1)).unwrap();
        let _a2 = l.request(addr(1)).unwrap();
        let e = l.request(addr(1)).err().unwrap();
        assert_eq!(limit_of(e), "requests_per_connection_max");
        // Another connection is not affected.
        let _b1 = l.request(addr(2)).unwrap();
        drop(a1);
        let _a3 = l.request(addr(1)).unwrap();
    }

    #[test]
    fn watches_are_bounded_per_connection_and_per_node() {
        let l = limits();
        let w1 = l.watch(addr(1)).unwrap();
        let _w2 = l.watch(addr(1)).unwrap();
        assert_eq!(
            limit_of(l.watch(addr(1)).err().unwrap()),
            "watches_per_connection_max"
        );
        let _w3 = l.watch(addr(2)).unwrap();
        assert_eq!(l.watch_count(), 3);
        assert_eq!(limit_of(l.watch(addr(3)).err().unwrap()), "watches_max");
        drop(w1);
        let _w4 = l.watch(addr(3)).unwrap();
        assert_eq!(l.watch_count(), 3);
    }

    #[test]
    fn idle_connections_leave_no_entry() {
        let l = limits();
        drop(l.request(addr(1)).unwrap());
        drop(l.watch(addr(1)).unwrap());
        let _ = l.request(addr(5)).map(drop);
        assert!(l.counts().by_connection.is_empty());
        assert_eq!(l.watch_count(), 0);
    }
}
