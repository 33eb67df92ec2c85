//! Compiles `proto/walbox/v1/envelope.proto` with protox (a protobuf compiler in Rust), so the
//! build needs no system `protoc`; and records the git revision for `walbox --version`
//! (`WALBOX_GIT_REVISION`: `git rev-parse --short=12 HEAD`, or "unknown" outside a checkout).

use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/walbox/v1/envelope.proto");
    // A new commit or branch moves HEAD or the ref it names.
    for path in [".git/HEAD", ".git/refs/heads", ".git/packed-refs"] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let revision = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=WALBOX_GIT_REVISION={revision}");
    let fds = protox::compile(["walbox/v1/envelope.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
