//! Compiles the .proto files with `protox` (pure Rust), so no `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/cairn/v1/resource.proto",
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
    tonic_prost_build::configure()
        // Deterministic encoding: maps become BTreeMaps (sorted keys), so a
        // command encodes to the same bytes on every node.
        .btree_map(".")
        // Payload bytes (google.protobuf.Any.value) are shared, not copied.
        .bytes(".")
        // A resource's owner is usually absent: boxed, an absent owner takes
        // 8 bytes of every stored resource instead of an inline Id's 160.
        .boxed(".cairn.v1.Resource.owner")
        .compile_well_known_types(true)
        .compile_fds(descriptors)?;
    Ok(())
}
