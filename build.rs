//! Compiles `proto/walbox/v1/envelope.proto` with protox (a protobuf compiler in Rust), so the
//! build needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/walbox/v1/envelope.proto");
    let fds = protox::compile(["walbox/v1/envelope.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
