//! Generates the gRPC code from `proto/` with the pure-Rust `protox` compiler, so a
//! fresh machine needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/tally/agent/v1/agent.proto",
        "proto/tally/raft/v1/raft.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
