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
    // the agent's Spark Connect client (the `spark` feature): Spark's own package and
    // names, so the method paths are the server's; the client side only
    if std::env::var_os("CARGO_FEATURE_SPARK").is_some() {
        let spark = "proto/spark/connect/tally_spark_connect.proto";
        println!("cargo:rerun-if-changed={spark}");
        let fds = protox::compile([spark], ["proto"])?;
        tonic_prost_build::configure()
            .build_server(false)
            .compile_fds(fds)?;
    }
    Ok(())
}
