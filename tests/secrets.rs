//! Secrets from files (`postgres.password_file`, `kafka.property_files`,
//! `alerts.webhook_token_file`, as `WALBOX_…_FILE` variables the way a Kubernetes secret is
//! mounted): walbox uses them, and no secret appears in its log, in `walbox status` (text and
//! JSON), in `/metrics`, or in an error. A missing file or a secret given twice is a
//! configuration error (exit 3) naming the key and the path, never the content.

use std::process::Command;

use walbox::sandbox::broker::TopicReader;

use crate::support::events::distinct_ids;
use crate::support::{
    self, free_port, http_get, wait_until, walbox_env, TestDb, Walbox, WebhookReceiver, WAIT,
};

fn set(env: &mut Vec<(String, String)>, key: &str, value: String) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_owned(), value));
}

/// `url` without its password, and the password.
fn split_password(url: &str) -> (String, String) {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (userinfo, after) = rest.split_once('@').expect("user info");
    let (user, password) = userinfo.split_once(':').expect("a password in the URL");
    (format!("{scheme}://{user}@{after}"), password.to_owned())
}

fn walbox_command(env: &[(String, String)], args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_walbox"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().cloned())
        .output()
        .expect("run walbox")
}

#[test]
fn secrets_from_files_are_used_and_never_shown() {
    let db = TestDb::new("secrets");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 1);
    let dir = tempfile::tempdir().unwrap();
    let (url, password) = split_password(&db.url());
    assert!(password.len() >= 8, "a password worth looking for");
    let write = |name: &str, content: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{content}\n")).unwrap();
        path.display().to_string()
    };
    let kafka_secret = "kafka-secret-9f31c";
    let token = "webhook-token-77ad2";
    let hook = WebhookReceiver::start();
    let port = free_port();
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    set(&mut env, "WALBOX_POSTGRES_URL", url);
    set(
        &mut env,
        "WALBOX_POSTGRES_PASSWORD_FILE",
        write("pg-password", &password),
    );
    set(
        &mut env,
        "WALBOX_KAFKA_PROPERTY_FILE_SASL_PASSWORD",
        write("sasl-password", kafka_secret),
    );
    set(
        &mut env,
        "WALBOX_ALERTS_WEBHOOK_TOKEN_FILE",
        write("webhook-token", token),
    );
    set(&mut env, "WALBOX_ALERTS_WEBHOOK_URL", hook.url.clone());
    // Any retained WAL is above the warning threshold: the first reading sends an alert.
    set(&mut env, "WALBOX_SLOT_WARNING_BYTES", "1".into());
    set(&mut env, "WALBOX_SLOT_CHECK_INTERVAL", "200ms".into());
    set(&mut env, "WALBOX_HTTP_LISTEN", format!("127.0.0.1:{port}"));
    let mut walbox = Walbox::spawn(&env);
    wait_until(
        WAIT,
        "walbox to stream with the password from its file",
        || db.streaming(&slot),
    );
    let id: i64 = db
        .sql(&format!(
            "INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES ('a', '{topic}', 'x', '{{}}') RETURNING id"
        ))
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).contains(&id)),
        "the event arrived; log:\n{}",
        walbox.log()
    );
    wait_until(
        WAIT,
        "the alert webhook, with the token from its file",
        || !hook.heads.lock().unwrap().is_empty(),
    );
    let head = hook.heads.lock().unwrap()[0].clone();
    assert!(
        head.lines()
            .any(|l| l.eq_ignore_ascii_case(&format!("authorization: Bearer {token}"))),
        "{head}"
    );

    let metrics = http_get(port, "/metrics").expect("/metrics").1;
    let status = walbox_command(&env, &["status"]);
    let status_json = walbox_command(&env, &["status", "--json"]);
    assert!(status.status.success() && status_json.status.success());
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    let outputs = [
        ("the log", walbox.log()),
        ("/metrics", metrics),
        (
            "walbox status",
            String::from_utf8_lossy(&status.stdout).into_owned(),
        ),
        (
            "walbox status (stderr)",
            String::from_utf8_lossy(&status.stderr).into_owned(),
        ),
        (
            "walbox status --json",
            String::from_utf8_lossy(&status_json.stdout).into_owned(),
        ),
    ];
    for (what, text) in outputs {
        for secret in [password.as_str(), kafka_secret, token] {
            assert!(!text.contains(secret), "{what} shows a secret:\n{text}");
        }
    }
}

#[test]
fn a_missing_secret_file_or_a_secret_given_twice_exits_3_without_the_secret() {
    let db = TestDb::new("secrets_bad");
    let broker = support::broker();
    let dir = tempfile::tempdir().unwrap();
    let (_, password) = split_password(&db.url());
    let file = dir.path().join("pw");
    std::fs::write(&file, &password).unwrap();
    let base = walbox_env(&db, &db.name, &broker.bootstrap_servers());

    let mut missing = base.clone();
    set(
        &mut missing,
        "WALBOX_POSTGRES_PASSWORD_FILE",
        "/run/secrets/walbox/absent".into(),
    );
    let out = walbox_command(&missing, &["run"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("postgres.password_file: cannot read /run/secrets/walbox/absent"),
        "{stderr}"
    );

    // postgres.url (with its password) and postgres.url_file both set.
    let mut twice = base.clone();
    set(
        &mut twice,
        "WALBOX_POSTGRES_URL_FILE",
        file.display().to_string(),
    );
    let out = walbox_command(&twice, &["run"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("set postgres.url or postgres.url_file, not both"),
        "{stderr}"
    );
    for text in [stderr.as_ref(), &String::from_utf8_lossy(&out.stdout)] {
        assert!(!text.contains(&password), "{text}");
    }
}

#[test]
fn walbox_inbox_reads_its_secrets_from_files_too() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, content: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, content).unwrap();
        p.display().to_string()
    };
    let pw = file("pw", "inbox-s3cr3t\n");
    let sasl = file("sasl", "inbox-k4fk4\n");
    let env = [
        (
            "WALBOX_INBOX_POSTGRES_URL",
            "postgres://billing@db:5432/billing",
        ),
        ("WALBOX_INBOX_POSTGRES_PASSWORD_FILE", pw.as_str()),
        (
            "WALBOX_INBOX_KAFKA_PROPERTY_FILE_SASL_PASSWORD",
            sasl.as_str(),
        ),
        ("WALBOX_INBOX_KAFKA_BROKERS", "k1:9092"),
        ("WALBOX_INBOX_KAFKA_GROUP_ID", "billing"),
        ("WALBOX_INBOX_KAFKA_TOPICS", "outbox.event.payment"),
        ("WALBOX_INBOX_EFFECT_SQL", "SELECT 1"),
    ];
    let mut vars = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
    let config = walbox::inbox::config::load_from(None, &mut vars).unwrap();
    assert_eq!(config.conn.password.as_deref(), Some("inbox-s3cr3t"));
    assert_eq!(
        config
            .kafka
            .properties
            .get("sasl.password")
            .map(String::as_str),
        Some("inbox-k4fk4")
    );
}

/// A URL whose password holds an unencoded `?` (and `&`, `=`), which libpq accepts: walbox
/// connects with it, and no part of the password appears in its output.
#[test]
fn a_question_mark_in_a_url_password_connects_as_with_libpq() {
    let db = TestDb::new("qmark");
    let broker = support::broker();
    let role = format!("q_{}", db.name);
    let password = "abc?LEAK4&x=y";
    db.sql(&format!(
        "CREATE ROLE {role} LOGIN REPLICATION PASSWORD '{password}'"
    ));
    let url = format!(
        "postgresql://{role}:{password}@{}/{}?sslmode=disable",
        db.addr(),
        db.name
    );
    let mut env = walbox_env(&db, &db.name, &broker.bootstrap_servers());
    set(&mut env, "WALBOX_POSTGRES_URL", url);
    let out = walbox_command(&env, &["check"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let postgres = stdout
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("postgres"))
        .unwrap_or_else(|| panic!("no postgres line: {stdout}\n{stderr}"));
    assert!(postgres.starts_with("ok "), "{stdout}\n{stderr}");
    for text in [&stdout, &stderr] {
        assert!(!text.contains("LEAK4"), "{text}");
    }
}

/// The `postgres` line of `walbox check` with `env`, and the whole output.
fn postgres_check_line(env: &[(String, String)]) -> (String, String) {
    let out = walbox_command(env, &["check"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("postgres"))
        .unwrap_or_else(|| panic!("no postgres line: {text}"))
        .to_owned();
    (line, text)
}

#[test]
fn a_password_from_its_file_or_no_password_at_all_gets_its_own_fix() {
    let db = TestDb::new("check_pwfile");
    let broker = support::broker();
    let secret = "not-the-password-9c1e";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pg-password");
    std::fs::write(&file, secret).unwrap();
    let (no_password, _) = split_password(&db.url());
    let mut env = walbox_env(&db, &db.name, &broker.bootstrap_servers());
    set(&mut env, "WALBOX_POSTGRES_URL", no_password);
    // A wrong password read from postgres.password_file is not blamed on postgres.url.
    let mut from_file = env.clone();
    set(
        &mut from_file,
        "WALBOX_POSTGRES_PASSWORD_FILE",
        file.display().to_string(),
    );
    let (line, text) = postgres_check_line(&from_file);
    assert!(line.starts_with("FAIL "), "{text}");
    assert!(line.contains("28P01"), "{line}");
    assert!(
        line.contains(
            "fix: check the user in postgres.url and the password in postgres.password_file"
        ),
        "{line}"
    );
    assert!(!text.contains(secret), "{text}");

    // No password at all: say so, not "check that PostgreSQL runs".
    let (line, text) = postgres_check_line(&env);
    assert!(line.starts_with("FAIL "), "{text}");
    assert!(
        line.contains("fix: the server asks for a password and none is set")
            && line.contains("postgres.password_file"),
        "{line}"
    );
}
