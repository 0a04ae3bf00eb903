//! Compiles the .proto files with `protox` (pure Rust), so no `protoc` is needed,
//! then generates the server of `cairn.v1.ResourceService` that answers with
//! the `cairn.v1.shared` messages (see `proto/cairn/v1/shared.proto`).

use std::collections::HashSet;

const RESOURCE_SERVICE: &str = "ResourceService";
const SHARED_PACKAGE: &str = "cairn.v1.shared";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/cairn/v1/resource.proto",
        "proto/cairn/v1/lease.proto",
        "proto/cairn/v1/shared.proto",
        "proto/cairn/v1/errors.proto",
        "proto/cairn/v1/forwarding.proto",
        "proto/cairn/v1/log.proto",
        "proto/cairn/v1/raft.proto",
        "proto/cairn/v1/admin.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("cairn_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;

    // The shared server: the public service's routes, request types and
    // streaming, read from its descriptor (so the two cannot drift apart);
    // each answer that has a twin in `cairn.v1.shared` is answered with it.
    let shared_messages: HashSet<String> = descriptors
        .file
        .iter()
        .filter(|f| f.package() == SHARED_PACKAGE)
        .flat_map(|f| f.message_type.iter().map(|m| m.name().to_string()))
        .collect();
    let public = descriptors
        .file
        .iter()
        .filter(|f| f.package() == "cairn.v1")
        .flat_map(|f| f.service.iter())
        .find(|s| s.name() == RESOURCE_SERVICE)
        .ok_or("cairn.v1.ResourceService is not declared")?;
    let mut service = tonic_build::manual::Service::builder()
        .package("cairn.v1")
        .name(RESOURCE_SERVICE);
    for method in &public.method {
        let input = method
            .input_type()
            .strip_prefix(".cairn.v1.")
            .ok_or("a ResourceService request outside cairn.v1")?;
        let output = method
            .output_type()
            .strip_prefix(".cairn.v1.")
            .ok_or("a ResourceService answer outside cairn.v1")?;
        let output_path = if shared_messages.contains(output) {
            format!("crate::v1::shared::{output}")
        } else {
            format!("crate::v1::{output}")
        };
        let mut builder = tonic_build::manual::Method::builder()
            .name(snake_case(method.name()))
            .route_name(method.name())
            .input_type(format!("crate::v1::{input}"))
            .output_type(output_path)
            .codec_path("crate::codec::SizedCodec");
        if method.client_streaming() {
            builder = builder.client_streaming();
        }
        if method.server_streaming() {
            builder = builder.server_streaming();
        }
        service = service.method(builder.build());
    }
    tonic_build::manual::Builder::new()
        .build_client(false)
        .compile(&[service.build()]);

    tonic_prost_build::configure()
        // Deterministic encoding: maps become BTreeMaps (sorted keys), so a
        // command encodes to the same bytes on every node.
        .btree_map(".")
        // Payload bytes (google.protobuf.Any.value, the shared answers'
        // resources) are shared, not copied.
        .bytes(".")
        // A resource's owner is usually absent: boxed, an absent owner takes
        // 8 bytes of every stored resource instead of an inline Id's 160.
        .boxed(".cairn.v1.Resource.owner")
        .compile_well_known_types(true)
        .compile_fds(descriptors)?;
    Ok(())
}

/// `ListByOwner` -> `list_by_owner`.
fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}
