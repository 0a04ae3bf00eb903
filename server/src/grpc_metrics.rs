//! gRPC requests by method and status code, with their latency (`cairn_grpc_requests_total`,
//! `cairn_grpc_request_duration_seconds`): a wrapper around each of the client port's services,
//! outside the request limits so that refusals count too. Without a metrics recorder (no
//! `metrics_address`) it passes calls through untouched.
//!
//! A gRPC status travels in the response headers (a trailers-only answer, which is how tonic
//! sends an error before any message) or in the trailers after the body. The layer wraps the
//! body and records the call once, when the status is seen or the body ends; a body dropped
//! before its end (the client went away) is recorded as `CANCELLED`. For a stream (a watch)
//! the latency is the stream's lifetime.
//!
//! Invariant: every request is recorded exactly once (`Recording::finish` takes itself).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use http_body::{Body, Frame};

pub const REQUESTS: &str = "cairn_grpc_requests_total";
pub const DURATION: &str = "cairn_grpc_request_duration_seconds";

pub fn describe() {
    metrics::describe_counter!(
        REQUESTS,
        "gRPC requests served on the client port, by method and status code."
    );
    metrics::describe_histogram!(
        DURATION,
        metrics::Unit::Seconds,
        "gRPC request latency on the client port, by method (a stream: its lifetime)."
    );
}

/// `inner`, with its calls counted and timed.
pub fn wrap<S>(inner: S) -> GrpcMetrics<S> {
    GrpcMetrics { inner }
}

#[derive(Clone)]
pub struct GrpcMetrics<S> {
    inner: S,
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for GrpcMetrics<S> {
    const NAME: &'static str = S::NAME;
}

/// One request in flight, recorded once.
struct Recording {
    method: String,
    started: Instant,
}

impl Recording {
    fn finish(self, code: &'static str) {
        metrics::counter!(REQUESTS, "method" => self.method.clone(), "code" => code).increment(1);
        metrics::histogram!(DURATION, "method" => self.method)
            .record(self.started.elapsed().as_secs_f64());
    }
}

/// The name of a gRPC status code number, as Prometheus users expect it (etcd's
/// `grpc_server_handled_total` uses the same names).
pub fn code_name(code: &str) -> &'static str {
    match code.trim() {
        "0" => "OK",
        "1" => "CANCELLED",
        "2" => "UNKNOWN",
        "3" => "INVALID_ARGUMENT",
        "4" => "DEADLINE_EXCEEDED",
        "5" => "NOT_FOUND",
        "6" => "ALREADY_EXISTS",
        "7" => "PERMISSION_DENIED",
        "8" => "RESOURCE_EXHAUSTED",
        "9" => "FAILED_PRECONDITION",
        "10" => "ABORTED",
        "11" => "OUT_OF_RANGE",
        "12" => "UNIMPLEMENTED",
        "13" => "INTERNAL",
        "14" => "UNAVAILABLE",
        "15" => "DATA_LOSS",
        "16" => "UNAUTHENTICATED",
        _ => "UNKNOWN",
    }
}

fn status_of(headers: &http::HeaderMap) -> Option<&'static str> {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .map(code_name)
}

impl<S, B> tonic::codegen::Service<http::Request<B>> for GrpcMetrics<S>
where
    S: tonic::codegen::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if !crate::recorder::recording() {
            // No recorder (no metrics_address): nothing to record, nothing to allocate.
            return Box::pin(self.inner.call(request));
        }
        let recording = Recording {
            method: request.uri().path().to_string(),
            started: Instant::now(),
        };
        let future = self.inner.call(request);
        Box::pin(async move {
            let response = match future.await {
                Ok(response) => response,
                Err(e) => {
                    recording.finish("UNAVAILABLE");
                    return Err(e);
                }
            };
            let (parts, body) = response.into_parts();
            let recording = match status_of(&parts.headers) {
                // Trailers-only: the status is already here.
                Some(code) => {
                    recording.finish(code);
                    None
                }
                None => Some(recording),
            };
            Ok(http::Response::from_parts(
                parts,
                tonic::body::Body::new(RecordedBody {
                    inner: body,
                    recording,
                }),
            ))
        })
    }
}

/// A response body that records its call when the status arrives in the trailers.
struct RecordedBody<B> {
    inner: B,
    recording: Option<Recording>,
}

impl<B> Drop for RecordedBody<B> {
    fn drop(&mut self) {
        if let Some(recording) = self.recording.take() {
            recording.finish("CANCELLED");
        }
    }
}

impl<B: Body + Unpin> Body for RecordedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(code) = frame.trailers_ref().and_then(status_of) {
                    if let Some(recording) = this.recording.take() {
                        recording.finish(code);
                    }
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if let Some(recording) = this.recording.take() {
                    recording.finish("INTERNAL");
                }
            }
            Poll::Ready(None) => {
                // Ended without a status: gRPC calls that an OK.
                if let Some(recording) = this.recording.take() {
                    recording.finish("OK");
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
