//! Compiles proto/credbroker/v1/*.proto with protox (pure Rust, so no `protoc` on the
//! build machine) and generates prost messages plus tonic clients and servers, and the
//! messages alone (in `messages/`, for a build without the `transport` feature). The encoded
//! descriptor set is written next to the code so the broker can serve gRPC reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["credbroker/v1/token.proto", "credbroker/v1/admin.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let fds = protox::compile(files, ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("credbroker_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // No `connect()` helper: it would tie the client to tonic's TCP transport, and every
        // caller here dials a Unix socket with its own connector.
        .build_transport(false)
        .compile_fds(fds.clone())?;
    let messages = out.join("messages");
    std::fs::create_dir_all(&messages)?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .build_transport(false)
        .out_dir(messages)
        .compile_fds(fds)?;
    Ok(())
}
