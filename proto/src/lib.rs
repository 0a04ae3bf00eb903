//! # cairn-proto
//!
//! Every protobuf message and gRPC service of Cairn, generated at build time
//! from `proto/` with `protox` (no `protoc` needed), plus [`error`]: the one
//! place where Cairn's error kinds are mapped to gRPC status codes and back.
//!
//! What this crate must not do: hold behaviour. It is types and their wire
//! mapping only; the rules of the contract live in `cairn-fsm` and `cairn-server`.
//!
//! ## Invariants
//! - Maps are generated as `BTreeMap`, so a message encodes to the same bytes on
//!   every node (the Raft log relies on this for deterministic commands).
//! - Field numbers of `cairn.v1.log` messages are never reused: they are on disk.
//! - Every `cairn.v1.shared` message encodes to the same bytes as its public
//!   twin when its `bytes` fields hold the encodings of the public message's
//!   resources (`tests/wire_identity.rs`), and the shared server answers on
//!   exactly the public service's routes (it is generated from them).
//! - An error crossing the wire keeps its kind ([`error::ApiError`] round-trips
//!   through `tonic::Status` losslessly for every kind).

pub mod codec;
pub mod drill_report;
pub mod error;
pub mod lifecycle;
pub mod rfc3339;

/// Protobuf well-known types, compiled here so that `Any.value` is `Bytes`.
pub mod google {
    pub mod protobuf {
        include!(concat!(env!("OUT_DIR"), "/google.protobuf.rs"));
    }
}

/// The generated packages, nested as their proto package names are, so that
/// the generated cross-package paths resolve. Generated code is not ours to
/// restyle: prost's oneof enums hold their messages inline.
#[allow(clippy::large_enum_variant)]
pub mod cairn {
    /// The `cairn.v1` package: resources, the resource and forwarding services.
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/cairn.v1.rs"));

        /// The `cairn.v1.log` package: state-machine commands as stored in the log.
        pub mod log {
            include!(concat!(env!("OUT_DIR"), "/cairn.v1.log.rs"));
        }

        /// The `cairn.v1.shared` package: the answers of `ResourceService`
        /// with each resource as its encoded bytes, wire-identical to the
        /// public messages (`proto/cairn/v1/shared.proto`), and
        /// [`resource_service_server`](shared::resource_service_server): the
        /// server of `cairn.v1.ResourceService` (its public name and routes)
        /// that answers with them. Nodes serve these; clients use the public ones.
        pub mod shared {
            include!(concat!(env!("OUT_DIR"), "/cairn.v1.shared.rs"));
            include!(concat!(env!("OUT_DIR"), "/cairn.v1.ResourceService.rs"));
        }
    }
}

pub use cairn::v1;

/// Encoded `FileDescriptorSet` of every Cairn proto, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/cairn_descriptor.bin"));

/// The HTTP/2 paths (`/package.Service/Method`) of every method whose requests are a stream
/// of messages (`rpc M(stream ...)`), read from [`FILE_DESCRIPTOR_SET`]: a reader of such a
/// request body waits between messages for as long as its client has nothing to send.
pub fn request_streaming_paths() -> &'static std::collections::BTreeSet<String> {
    static PATHS: std::sync::OnceLock<std::collections::BTreeSet<String>> =
        std::sync::OnceLock::new();
    PATHS.get_or_init(|| {
        use prost::Message as _;
        let set = prost_types::FileDescriptorSet::decode(FILE_DESCRIPTOR_SET)
            .expect("the descriptor set built with this crate decodes");
        let mut paths = std::collections::BTreeSet::new();
        for file in &set.file {
            for service in &file.service {
                for method in &service.method {
                    if method.client_streaming() {
                        paths.insert(format!(
                            "/{}.{}/{}",
                            file.package(),
                            service.name(),
                            method.name()
                        ));
                    }
                }
            }
        }
        paths
    })
}

/// Request metadata a client sets on `WatchList`: how long it waits for the watch to open,
/// in the `grpc-timeout` format (`250m`, `5S`). A watch carries no gRPC deadline (that would
/// end the stream), so a node bounds what it does before the first event (a STRONG watch's
/// read index) by this, and by its own request timeout.
pub const WATCH_OPEN_TIMEOUT_HEADER: &str = "cairn-watch-open-timeout";

/// Response metadata of `WatchList`: the id this node gave the watch (decimal), which
/// `WatchProgress` names it by.
pub const WATCH_ID_HEADER: &str = "cairn-watch-id";

/// Response metadata of `WatchList` and `WatchProgress`: the id of the cluster the
/// answering node belongs to. A client that primed a cache from one cluster and then
/// hears another (the cluster was rebuilt, or restored offline into a new one) starts
/// again from scratch.
pub const CLUSTER_ID_HEADER: &str = "cairn-cluster-id";

pub use v1::{Condition, Consistency, Id, Reference, Resource, Status, Tenancy, Type, WatchEvent};

#[cfg(test)]
mod tests {
    #[test]
    fn the_request_streaming_methods_are_read_from_the_protos() {
        let paths: Vec<&str> = super::request_streaming_paths()
            .iter()
            .map(String::as_str)
            .collect();
        assert_eq!(
            paths,
            [
                "/cairn.v1.AdminService/RestoreSnapshot",
                "/cairn.v1.LeaseService/KeepAlive",
                "/cairn.v1.RaftService/AppendEntriesStream",
            ]
        );
    }
}
