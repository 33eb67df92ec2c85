//! The command line itself: `--version` names the revision it was built from, `completions`
//! prints a script for each shell that knows every subcommand, and bad arguments and refusals
//! of the one-shot commands are reported once, naming what is wrong.

use std::process::Command;

use std::time::Duration;

use crate::support::{self, walbox_cmd, walbox_env, TestDb, Walbox};

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
            "from-debezium",
            "completions",
        ] {
            assert!(script.contains(sub), "{shell} completion lacks {sub}");
        }
    }
    let (ok, _) = walbox(&["completions", "tcsh"]);
    assert!(!ok, "an unknown shell is a usage error");
}

/// The subcommands of the README's "Commands" table: the first word after `walbox` in each
/// row's first cell.
fn readme_commands(readme: &str) -> Vec<String> {
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Commands\n"))
        .expect("README.md has a section \"Commands\"");
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `walbox "))
        .map(|rest| rest.split([' ', '`']).next().unwrap().to_owned())
        .collect()
}

/// The README's command table and clap's subcommands are the same list.
#[test]
fn the_readme_lists_every_subcommand_and_no_other() {
    use clap::CommandFactory;
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("read README.md");
    let documented = readme_commands(&readme);
    let mut unique = documented.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        documented.len(),
        "listed twice: {documented:?}"
    );
    let declared: Vec<String> = walbox::cli::Cli::command()
        .get_subcommands()
        .map(|c| c.get_name().to_owned())
        .filter(|name| name != "help")
        .collect();
    let undocumented: Vec<&String> = declared
        .iter()
        .filter(|c| !documented.contains(c))
        .collect();
    let unknown: Vec<&String> = documented
        .iter()
        .filter(|c| !declared.contains(c))
        .collect();
    assert!(
        undocumented.is_empty(),
        "subcommands missing from README.md's command table: {undocumented:?}"
    );
    assert!(
        unknown.is_empty(),
        "README.md's command table lists commands walbox does not have: {unknown:?}"
    );
}

/// `republish` and `audit` with a window argument PostgreSQL cannot read: exit status 3 naming
/// the argument with the server's reason, before any broker is contacted.
#[test]
fn bad_window_arguments_are_refused_naming_the_argument() {
    let db = TestDb::new("badwindow");
    // No broker answers there: the arguments are refused before one is needed.
    let env = walbox_env(&db, &db.name, "127.0.0.1:1");
    for command in ["republish", "audit"] {
        for (args, arg, reason) in [
            (
                &["--since-id", "abc"][..],
                "--since-id",
                "invalid input syntax for type bigint",
            ),
            (
                &["--since-id", "99999999999999999999"],
                "--since-id",
                "out of range for type bigint",
            ),
            (
                &["--since", "garbage", "--time-column", "created_at"],
                "--since",
                "invalid input syntax for type timestamp with time zone",
            ),
            (
                &[
                    "--since",
                    "2026-01-01T00:00:00Z",
                    "--time-column",
                    "payload",
                ],
                "--time-column",
                "is jsonb, not a time",
            ),
            (
                &["--since", "2026-01-01T00:00:00Z", "--time-column", "nosuch"],
                "--time-column",
                "has no column \"nosuch\"",
            ),
        ] {
            let mut argv = vec![command];
            argv.extend_from_slice(args);
            let (code, out) = walbox_cmd(&argv, &env);
            assert_eq!(code, 3, "{argv:?}: {out}");
            assert!(
                out.contains(&format!("walbox: error: {arg}: ")),
                "{argv:?}: {out}"
            );
            assert!(out.contains(reason), "{argv:?}: {out}");
            assert!(!out.contains("db error"), "{argv:?}: {out}");
            assert_eq!(out.matches(reason).count(), 1, "printed once: {out}");
        }
    }
}

/// A statement the database refuses is reported with PostgreSQL's message, not "db error".
#[test]
fn a_refused_statement_shows_the_servers_message() {
    let db = TestDb::new("refused");
    let env = walbox_env(&db, &db.name, "127.0.0.1:1");
    db.sql("DROP TABLE outbox");
    for command in ["republish", "audit"] {
        let (code, out) = walbox_cmd(&[command, "--since-id", "1"], &env);
        assert_eq!(code, 5, "{command}: {out}");
        assert!(out.contains("does not exist"), "{command}: {out}");
        assert_eq!(
            out.matches("does not exist").count(),
            1,
            "printed once: {out}"
        );
        assert!(!out.contains("db error"), "{command}: {out}");
    }
}

/// The usage line offers either form of the window, and `--time-column` needs `--since`.
#[test]
fn republish_usage_offers_either_window() {
    let out = Command::new(env!("CARGO_BIN_EXE_walbox"))
        .args(["republish", "--help"])
        .output()
        .expect("run walbox");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("<--since-id <ID>|--since <TIME>>"), "{help}");
    for args in [
        &["republish"][..],
        &[
            "republish",
            "--since-id",
            "1",
            "--time-column",
            "created_at",
        ],
        &["republish", "--since-id", ""],
        &["audit", "--time-column", "created_at"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_walbox"))
            .args(args)
            .output()
            .expect("run walbox");
        assert_eq!(out.status.code(), Some(2), "{args:?} is a usage error");
    }
}

/// `republish` with no broker answering gives up after `--ack-timeout` with exit status 9 (a
/// producer that cannot continue), instead of waiting forever.
#[test]
fn republish_gives_up_on_unreachable_brokers_with_exit_9() {
    let db = TestDb::new("republishnobroker");
    db.sql(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES ('a', 't', 'x', '{}')",
    );
    let env = walbox_env(&db, &db.name, "127.0.0.1:1");
    let mut republish = Walbox::spawn_args(
        &["republish", "--since-id", "1", "--ack-timeout", "2s"],
        &env,
    );
    // The topic lookup (5 s) and the acknowledgement timeout (2 s), with room to spare.
    let status = republish.wait_exit(Duration::from_secs(30));
    let log = republish.log();
    assert_eq!(status.code(), Some(9), "{log}");
    assert!(log.contains("no broker acknowledged"), "{log}");
    assert!(log.contains("kafka.brokers"), "{log}");
}

/// SIGHUP neither kills `walbox run` nor goes unnoticed: it is logged and ignored, and SIGTERM
/// still stops walbox cleanly.
#[test]
fn sighup_is_logged_and_ignored() {
    let db = TestDb::new("sighup");
    let broker = crate::support::broker();
    let env = walbox_env(&db, &db.name, &broker.bootstrap_servers());
    let mut walbox = Walbox::spawn(&env);
    crate::support::wait_until(crate::support::WAIT, "walbox to stream", || {
        db.streaming(&db.name)
    });
    let sent = Command::new("kill")
        .args(["-HUP", &walbox.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success());
    crate::support::wait_until(crate::support::WAIT, "the SIGHUP log line", || {
        walbox.log().contains("SIGHUP ignored")
    });
    assert!(walbox.running(), "{}", walbox.log());
    assert!(db.streaming(&db.name), "{}", walbox.log());
    walbox.terminate();
    assert!(
        walbox.wait_exit(crate::support::WAIT).success(),
        "{}",
        walbox.log()
    );
}

/// `walbox check --json` prints a JSON report on stdout even when the configuration cannot be
/// loaded.
#[test]
fn an_unreadable_configuration_is_still_a_json_report() {
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("absent.toml");
    let env = vec![("WALBOX_CONFIG".to_owned(), absent.display().to_string())];
    let out = crate::support::walbox_output(&["check", "--json"], &env);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is no JSON ({e}): {stdout:?}"));
    assert_eq!(report["passed"], false);
    assert_eq!(report["exit_status"], 3);
    assert_eq!(report["checks"], serde_json::json!([]));
    let error = report["error"].as_str().expect("an error message");
    assert!(error.contains("absent.toml"), "{error}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

/// `walbox from-debezium`: a setting it cannot honour is named on stderr and exits 3 with
/// nothing on stdout; `--allow-partial` prints the rest; the connector's password is in no
/// output; an unreadable file is exit status 3 too.
#[test]
fn from_debezium_names_what_it_cannot_honour_and_never_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let connector = dir.path().join("connector.json");
    let config = serde_json::json!({
        "name": "outbox",
        "config": {
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "database.hostname": "db",
            "database.user": "dbz",
            "database.password": "hunter2-pg",
            "database.dbname": "shop",
            "plugin.name": "pgoutput",
            "table.include.list": "public.outbox",
            "snapshot.mode": "no_data",
            "transforms": "outbox",
            "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
            "slot.drop.on.stop": "true"
        }
    });
    std::fs::write(&connector, config.to_string()).unwrap();
    let path = connector.to_str().unwrap();
    let strict = support::walbox_output(&["from-debezium", path], &[]);
    let stderr = String::from_utf8_lossy(&strict.stderr);
    assert_eq!(strict.status.code(), Some(3), "{stderr}");
    assert!(strict.stdout.is_empty());
    assert!(
        stderr.contains("walbox: cannot honour slot.drop.on.stop: "),
        "{stderr}"
    );
    let partial = support::walbox_output(&["from-debezium", "--allow-partial", path], &[]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&partial.stdout),
        String::from_utf8_lossy(&partial.stderr),
    );
    assert_eq!(partial.status.code(), Some(0), "{stderr}");
    assert!(stdout.contains("compat = \"debezium\""), "{stdout}");
    assert!(stdout.contains("password_file = "), "{stdout}");
    assert!(!stdout.contains("hunter2") && !stderr.contains("hunter2"));
    let missing = support::walbox_output(&["from-debezium", "/nonexistent/connector.json"], &[]);
    assert_eq!(missing.status.code(), Some(3));
}
