//! Compiles `proto/walbox/v1/envelope.proto` with protox (a protobuf compiler in Rust), so the
//! build needs no system `protoc`; and records the git revision for `walbox --version`
//! (`WALBOX_GIT_REVISION`: `git rev-parse --short=12 HEAD`, or "unknown" outside a checkout).

use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/walbox/v1/envelope.proto");
    // A new commit or branch moves HEAD or the ref it names: only those are watched (a
    // directory of refs would rebuild on every commit of every branch and worktree).
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
            if std::path::Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    let revision = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=WALBOX_GIT_REVISION={revision}");
    let fds = protox::compile(["walbox/v1/envelope.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
