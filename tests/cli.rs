//! The command line itself: `--version` names the revision it was built from, and
//! `completions` prints a script for each shell that knows every subcommand.

use std::process::Command;

fn walbox(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_walbox"))
        .args(args)
        .output()
        .expect("run walbox");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn version_names_the_package_version_and_the_git_revision() {
    let (ok, out) = walbox(&["--version"]);
    assert!(ok, "{out}");
    let revision = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    assert_eq!(
        out.trim(),
        format!("walbox {} ({revision})", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn completions_know_every_subcommand() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (ok, script) = walbox(&["completions", shell]);
        assert!(ok, "{shell}");
        for sub in [
            "run",
            "check",
            "status",
            "recreate-slot",
            "republish",
            "inbox",
            "completions",
        ] {
            assert!(script.contains(sub), "{shell} completion lacks {sub}");
        }
    }
    let (ok, _) = walbox(&["completions", "tcsh"]);
    assert!(!ok, "an unknown shell is a usage error");
}
