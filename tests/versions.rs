//! What differs between PostgreSQL majors, tested on the major the tests run on
//! (`WALBOX_TEST_PG`): slot columns that only newer servers have (failover flags and
//! `inactive_since` from 17, spill statistics from 14), and the idle-timeout invalidation of 18.
//! The table-less outbox (14+) and heartbeats (measured from 14) are tested in `routing` and
//! `slot`, on every major.

use std::process::Command;

use walbox::sandbox::postgres::PgClusterOptions;

use crate::support::{
    self, free_port, http_get, metric, printed_command, wait_until, walbox_cmd, walbox_env, TestDb,
    Walbox, WAIT,
};

fn scrape(port: u16) -> String {
    http_get(port, "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default()
}

/// `walbox status [--json]` for `db`'s slot of the same name: (exit code, stdout).
fn status(db: &TestDb, json: bool) -> (Option<i32>, String) {
    let broker = support::broker();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_walbox"));
    cmd.arg("status");
    if json {
        cmd.arg("--json");
    }
    let out = cmd
        .env_clear()
        .envs(walbox_env(db, &db.name, &broker.bootstrap_servers()))
        .output()
        .expect("run walbox status");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    (out.status.code(), format!("{stdout}{stderr}"))
}

#[test]
fn slot_columns_of_newer_majors_are_read_where_the_server_has_them() {
    let major = support::major();
    let db = TestDb::new("columns");
    let slot = db.name.clone();
    db.sql(&format!(
        "CREATE PUBLICATION {slot} FOR TABLE outbox WITH (publish = 'insert')"
    ));
    if major >= 17 {
        // The fifth argument, failover, exists from 17 on.
        db.sql(&format!(
            "SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput', false, false, true)"
        ));
    } else {
        db.sql(&format!(
            "SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"
        ));
    }

    let (code, out) = status(&db, true);
    assert_eq!(code, Some(0), "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("status --json is JSON");
    assert_eq!(
        v["server_version_num"].as_i64().map(|n| n / 10_000),
        Some(major.into())
    );
    assert_eq!(v["alert_level"], "ok", "{v:#}");
    if major >= 17 {
        assert_eq!(v["failover"], true, "{v:#}");
        assert_eq!(v["synced"], false, "{v:#}");
        let since = v["inactive_since"].as_str().expect("inactive_since on 17+");
        assert!(since.starts_with("20"), "{since}");
    } else {
        for key in ["failover", "synced", "inactive_since"] {
            assert!(v[key].is_null(), "{key} before 17: {v:#}");
        }
    }
    assert!(v["invalidation_reason"].is_null(), "{v:#}");
    if major >= 14 {
        assert_eq!(v["spill_bytes"], 0, "{v:#}");
    } else {
        assert!(v["spill_bytes"].is_null(), "{v:#}");
    }
    // 18 has the setting, off by default; it is never reported as a timeout of 0 seconds.
    assert_eq!(
        v["idle_replication_slot_timeout"].as_str(),
        (major >= 18).then_some("0"),
        "{v:#}"
    );
    assert!(v["idle_timeout_seconds"].is_null(), "{v:#}");

    let (code, text) = status(&db, false);
    assert_eq!(code, Some(0), "{text}");
    let has_line = |key: &str, value: &str| {
        text.lines()
            .any(|l| l.starts_with(key) && l.trim_end().ends_with(value))
    };
    assert_eq!(has_line("failover", "yes"), major >= 17, "{text}");
    assert_eq!(has_line("synced", "no"), major >= 17, "{text}");

    // The same numbers as metrics, from a running walbox.
    let broker = support::broker();
    let port = free_port();
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    env.push(("WALBOX_HTTP_LISTEN".into(), format!("127.0.0.1:{port}")));
    env.push(("WALBOX_SLOT_CHECK_INTERVAL".into(), "100ms".into()));
    let walbox = Walbox::spawn(&env);
    wait_until(WAIT, "a slot reading in /metrics", || {
        metric(&scrape(port), "walbox_slot_checks_total").is_some_and(|n| n >= 1.0)
    });
    let body = scrape(port);
    let expected_failover = (major >= 17).then_some(1.0);
    assert_eq!(
        metric(&body, "walbox_slot_failover"),
        expected_failover,
        "{body}"
    );
    assert_eq!(
        metric(&body, "walbox_slot_synced"),
        (major >= 17).then_some(0.0)
    );
    assert_eq!(
        metric(&body, "walbox_slot_spilled_bytes").is_some(),
        major >= 14
    );
    assert_eq!(metric(&body, "walbox_slot_idle_timeout_seconds"), None);
    drop(walbox);
}

#[test]
fn a_slot_invalidated_for_idleness_is_reported_with_its_cause_and_exits_7() {
    let setting = "idle_replication_slot_timeout";
    if support::major() < 18 {
        // The setting does not exist before 18: a slot is never invalidated for idleness.
        let db = TestDb::new("noidle");
        let sql = format!("SELECT count(*) FROM pg_settings WHERE name = '{setting}'");
        assert_eq!(db.sql(&sql), "0");
        return;
    }
    // Its own cluster: a one-second timeout would invalidate the shared cluster's idle slots.
    let cluster = Box::leak(Box::new(support::start_cluster(PgClusterOptions {
        settings: vec![(setting.into(), "1s".into())],
        ..support::pg_options()
    })));
    let db = TestDb::on(cluster, "idle");
    let slot = db.name.clone();
    let topic = format!("t_{slot}");
    let broker = support::broker();
    broker.create_topic(&topic, 1).expect("topic");
    let port = free_port();
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    env.push(("WALBOX_HTTP_LISTEN".into(), format!("127.0.0.1:{port}")));
    env.push(("WALBOX_SLOT_CHECK_INTERVAL".into(), "100ms".into()));
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream", || db.streaming(&slot));
    wait_until(WAIT, "the idle timeout in /metrics", || {
        metric(&scrape(port), "walbox_slot_idle_timeout_seconds") == Some(1.0)
    });
    assert!(
        walbox
            .log()
            .contains("idle_replication_slot_timeout is set"),
        "{}",
        walbox.log()
    );
    // While walbox streams, the slot is active and checkpoints leave it alone.
    db.sql("CHECKPOINT");
    db.sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES ('a', '{topic}', 'x', '{{}}')"
    ));
    let end = db.sql("SELECT pg_current_wal_lsn()").parse().unwrap();
    wait_until(WAIT, "walbox to confirm the event", || {
        db.confirmed(&slot) >= end
    });
    let reason =
        format!("SELECT invalidation_reason FROM pg_replication_slots WHERE slot_name = '{slot}'");
    assert_eq!(db.sql(&reason), "");

    // Stopped for longer than the timeout: the next checkpoint invalidates the slot.
    walbox.kill();
    wait_until(WAIT, "a checkpoint to invalidate the idle slot", || {
        db.sql("CHECKPOINT");
        db.sql(&reason) == "idle_timeout"
    });
    let (code, out) = status(&db, true);
    assert_eq!(code, Some(0), "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["alert_level"], "lost", "{v:#}");
    assert_eq!(v["invalidation_reason"], "idle_timeout", "{v:#}");
    assert!(v["reason"].as_str().unwrap().contains(setting), "{v:#}");

    // A new process (its own frontier empty) says it once, with the slot's real position and
    // a republish command that runs as printed (the config names no time column).
    let confirmed = db.confirmed(&slot);
    assert_ne!(confirmed, walbox::lsn::Lsn::ZERO);
    let mut again = Walbox::spawn(&env);
    assert_eq!(again.wait_exit(WAIT).code(), Some(7), "{}", again.log());
    let line = again.last_line();
    assert!(
        line.contains("is lost") && line.contains(&slot) && line.contains(setting),
        "{line}"
    );
    assert_eq!(line.matches("is lost").count(), 1, "said once: {line}");
    assert!(
        line.contains(&format!("confirmed up to {confirmed}")) && !line.contains(" 0/0"),
        "the slot's position ({confirmed}): {line}"
    );
    let republish = printed_command(&line, "republish");
    assert!(republish.iter().any(|a| a == "--time-column"), "{line}");
    let (code, out) = walbox_cmd(&["recreate-slot", "--confirm-data-loss"], &env);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        printed_command(&out, "republish"),
        republish,
        "recreate-slot prints the same command: {out}"
    );
    let args: Vec<&str> = republish.iter().map(String::as_str).collect();
    let (code, out) = walbox_cmd(&args, &env);
    assert_eq!(code, 0, "the printed command runs: {args:?}\n{out}");
    assert!(out.contains("republished 1 records"), "{out}");
}

#[test]
fn recreate_slot_keeps_a_failover_slot_a_failover_slot() {
    let major = support::major();
    let db = TestDb::new("recreate");
    let slot = db.name.clone();
    let failover = if major >= 17 {
        ", false, false, true"
    } else {
        ""
    };
    db.sql(&format!(
        "CREATE PUBLICATION {slot} FOR TABLE outbox WITH (publish = 'insert');
         SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput'{failover});"
    ));
    let before: String = db.sql(&format!(
        "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{slot}'"
    ));
    db.sql("SELECT pg_logical_emit_message(true, 'x', 'moves the WAL on')");
    let broker = support::broker();
    let out = Command::new(env!("CARGO_BIN_EXE_walbox"))
        .args(["recreate-slot", "--confirm-data-loss"])
        .env_clear()
        .envs(walbox_env(&db, &slot, &broker.bootstrap_servers()))
        .output()
        .expect("run walbox recreate-slot");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = db.sql(&format!(
        "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{slot}'"
    ));
    assert_ne!(before, after, "a new slot, at a new position");
    if major >= 17 {
        let flag = format!("SELECT failover FROM pg_replication_slots WHERE slot_name = '{slot}'");
        assert_eq!(db.sql(&flag), "t", "{text}");
        assert!(text.contains("failover: kept"), "{text}");
    } else {
        assert!(!text.contains("failover:"), "{text}");
    }
}

#[test]
fn start_up_warnings_and_check_name_the_slot_settings_before_the_slot_exists() {
    // On 18 a cluster of its own with the idle timeout set (an hour: no slot of it is
    // invalidated); before 18 there is no such setting, and the shared cluster's
    // max_slot_wal_keep_size = -1 is the warning to see.
    let major = support::major();
    let cluster: &'static walbox::sandbox::postgres::PgCluster = if major >= 18 {
        Box::leak(Box::new(support::start_cluster(PgClusterOptions {
            settings: vec![("idle_replication_slot_timeout".into(), "1h".into())],
            ..support::pg_options()
        })))
    } else {
        support::cluster()
    };
    let db = TestDb::on(cluster, "startwarn");
    let slot = db.name.clone();
    let broker = support::broker();
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    // walbox creates the slot; the monitor's next reading is an hour away.
    env.push(("WALBOX_SLOT_CHECK_INTERVAL".into(), "1h".into()));
    let walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to create its slot and stream", || {
        db.streaming(&slot)
    });
    let warnings = [
        (true, "max_slot_wal_keep_size = -1"),
        (major >= 18, "idle_replication_slot_timeout is set"),
    ];
    wait_until(WAIT, "the start-up warnings", || {
        let log = walbox.log();
        warnings
            .iter()
            .all(|(due, text)| !due || log.contains(text))
    });
    assert!(
        walbox.log().contains("until the primary's disk is full"),
        "{}",
        walbox.log()
    );
    drop(walbox);

    let (_, out) = walbox_cmd(&["check"], &env);
    let line = out
        .lines()
        .find(|l| l.contains("idle_replication_slot_timeout "));
    match major {
        18.. => {
            let line = line.unwrap_or_else(|| panic!("no idle timeout check in:\n{out}"));
            assert!(
                line.starts_with("WARN")
                    && line.contains("1h")
                    && line.contains("invalidates the slot"),
                "{line}"
            );
        }
        _ => assert!(line.is_none(), "no such setting before 18:\n{out}"),
    }
}
