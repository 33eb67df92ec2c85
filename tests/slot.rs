//! Slot safety: health metrics, alert levels and their webhook, the lost-slot exit, idle
//! outboxes, heartbeats, `walbox status`, and the shipped Prometheus rules.

use std::process::Command;

use walbox::sandbox::postgres::{PgCluster, PgClusterOptions};

use crate::support::{
    self, free_port, http_get, metric, wait_until, walbox_env, TestDb, Walbox, WebhookReceiver,
    WAIT,
};

/// A cluster of its own with 1 MB WAL segments and `max_slot_wal_keep_size = 64MB`, so a
/// stalled slot walks reserved → extended → unreserved → lost in a few 6 MB steps.
fn small_wal_cluster() -> &'static PgCluster {
    Box::leak(Box::new(support::start_cluster(PgClusterOptions {
        wal_segsize_mb: Some(1),
        settings: [
            ("max_slot_wal_keep_size", "64MB"),
            ("max_wal_size", "32MB"),
            ("min_wal_size", "4MB"),
            ("checkpoint_timeout", "1h"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect(),
        ..support::pg_options()
    })))
}

/// Writes about 6 MB of WAL through a table outside the publication, then checkpoints.
fn write_ballast(db: &TestDb) {
    db.sql("INSERT INTO ballast SELECT repeat(md5(g::text), 32) FROM generate_series(1, 6000) g; CHECKPOINT;");
}

fn with(env: &mut Vec<(String, String)>, key: &str, value: String) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_owned(), value));
}

fn scrape(port: u16) -> String {
    http_get(port, "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default()
}

#[test]
fn stalled_slot_alerts_warning_then_critical_then_lost_and_walbox_exits_7() {
    let db = TestDb::on(small_wal_cluster(), "alerts");
    db.sql("CREATE TABLE ballast (x text)");
    let slot = db.name.clone();
    let topic = format!("t_{}", db.name);
    let broker = support::broker();
    let Some(mock) = broker.mock_cluster() else {
        eprintln!("external broker: stalling acks needs the mock cluster; skipped");
        return;
    };
    broker.create_topic(&topic, 1).unwrap();
    let hook = WebhookReceiver::start();
    let port = free_port();
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    with(&mut env, "WALBOX_HTTP_LISTEN", format!("127.0.0.1:{port}"));
    with(&mut env, "WALBOX_SLOT_CHECK_INTERVAL", "100ms".into());
    with(&mut env, "WALBOX_ALERTS_WEBHOOK_URL", hook.url.clone());
    with(&mut env, "WALBOX_RELAY_SHUTDOWN_TIMEOUT", "1s".into());
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream", || {
        http_get(port, "/readyz").is_some_and(|(c, _)| c == 200)
    });
    wait_until(WAIT, "a first slot reading", || {
        metric(&scrape(port), "walbox_slot_alert_level") == Some(0.0)
    });

    // No more acks: one event stays in flight and the slot cannot advance.
    support::fail_every_produce(mock);
    db.sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES ('a', '{topic}', 'x', '{{}}')"
    ));
    let mut levels = vec![0.0];
    for _ in 0..40 {
        if !walbox.running() {
            break;
        }
        write_ballast(&db);
        let checks = metric(&scrape(port), "walbox_slot_checks_total").unwrap_or(0.0);
        wait_until(WAIT, "two fresh slot readings (or walbox's exit)", || {
            let body = scrape(port);
            body.is_empty()
                || metric(&body, "walbox_slot_checks_total").unwrap_or(0.0) >= checks + 2.0
        });
        if let Some(level) = metric(&scrape(port), "walbox_slot_alert_level") {
            if levels.last() != Some(&level) {
                levels.push(level);
            }
        }
    }
    let status = walbox.wait_exit(WAIT);
    let log = walbox.log();
    assert_eq!(status.code(), Some(7), "levels {levels:?}\n{log}");
    assert!(
        levels.windows(2).all(|w| w[0] < w[1]) && levels.contains(&1.0) && levels.contains(&2.0),
        "levels seen: {levels:?}"
    );
    for level in ["warning", "critical", "lost"] {
        assert!(
            log.lines()
                .any(|l| l.contains("slot alert level changed")
                    && l.contains(&format!("level={level}"))),
            "no log line for {level}:\n{log}"
        );
    }
    let last = walbox.last_line();
    assert!(last.contains("is lost") && last.contains(&slot), "{last}");
    let severities: Vec<String> = hook
        .received
        .lock()
        .unwrap()
        .iter()
        .map(|v| {
            v["alerts"][0]["labels"]["severity"]
                .as_str()
                .unwrap_or("?")
                .to_owned()
        })
        .collect();
    assert_eq!(
        severities,
        ["warning", "critical", "lost"],
        "webhook payloads"
    );
}

#[test]
fn an_idle_outbox_does_not_pin_wal_while_other_tables_are_written() {
    let db = TestDb::on(small_wal_cluster(), "idle");
    db.sql("CREATE TABLE ballast (x text)");
    let slot = db.name.clone();
    let broker = support::broker();
    let port = free_port();
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    with(&mut env, "WALBOX_HTTP_LISTEN", format!("127.0.0.1:{port}"));
    with(&mut env, "WALBOX_SLOT_CHECK_INTERVAL", "100ms".into());
    let walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream", || db.streaming(&slot));
    for _ in 0..8 {
        write_ballast(&db); // 48 MB in all, 75% of max_slot_wal_keep_size
    }
    wait_until(WAIT, "the idle slot to release WAL", || {
        let body = scrape(port);
        metric(&body, "walbox_slot_retained_wal_bytes").is_some_and(|b| b < 16.0 * 1048576.0)
            && metric(&body, "walbox_slot_alert_level") == Some(0.0)
    });
    drop(walbox);
}

#[test]
fn heartbeats_come_back_through_the_stream() {
    let db = TestDb::new("heartbeat");
    let broker = support::broker();
    let port = free_port();
    let mut env = walbox_env(&db, &db.name, &broker.bootstrap_servers());
    with(&mut env, "WALBOX_HTTP_LISTEN", format!("127.0.0.1:{port}"));
    with(&mut env, "WALBOX_SLOT_HEARTBEAT_INTERVAL", "100ms".into());
    with(&mut env, "WALBOX_SLOT_CHECK_INTERVAL", "100ms".into());
    let walbox = Walbox::spawn(&env);
    if support::major() < 14 {
        // Before 14 pgoutput cannot send logical messages: the heartbeat is written, its empty
        // transaction still moves the slot, but no round trip is measured.
        wait_until(WAIT, "walbox to stream", || db.streaming(&db.name));
        let start = db.confirmed(&db.name);
        wait_until(WAIT, "heartbeats to be written and confirmed", || {
            let body = scrape(port);
            metric(&body, "walbox_heartbeats_sent_total").is_some_and(|n| n >= 3.0)
                && db.confirmed(&db.name) > start
        });
        let body = scrape(port);
        assert_eq!(metric(&body, "walbox_heartbeats_received_total"), Some(0.0));
        let line = "heartbeats are written but not measured: PostgreSQL 13";
        assert!(walbox.log().contains(line), "{}", walbox.log());
        return;
    }
    wait_until(WAIT, "heartbeats to round-trip and a slot reading", || {
        let body = scrape(port);
        metric(&body, "walbox_heartbeats_received_total").is_some_and(|n| n >= 3.0)
            && metric(&body, "walbox_heartbeat_round_trip_seconds_count").is_some_and(|n| n >= 3.0)
            && body.contains("walbox_slot_wal_status{status=\"reserved\"} 1")
    });
    let body = scrape(port);
    for name in [
        "walbox_slot_retained_wal_bytes",
        "walbox_slot_confirmed_lag_bytes",
        "walbox_slot_alert_level",
        "walbox_events_published_total",
        "walbox_transactions_total",
        "walbox_inflight_events",
        "walbox_confirmed_flush_lsn",
        "walbox_replication_lag_seconds",
        "walbox_commit_to_ack_seconds_count",
        "walbox_heartbeats_sent_total",
    ] {
        assert!(metric(&body, name).is_some(), "{name} missing:\n{body}");
    }
    // The shared cluster runs with max_slot_wal_keep_size = -1: no keep-size gauges.
    assert!(metric(&body, "walbox_slot_max_wal_keep_bytes").is_none());
    assert!(metric(&body, "walbox_slot_wal_keep_used_ratio").is_none());
    assert!(walbox.log().contains("max_slot_wal_keep_size = -1"));
    drop(walbox);
}

#[test]
fn status_prints_the_slot_health_as_json() {
    let db = TestDb::new("status");
    db.create_slot_and_publication(&db.name);
    let broker = support::broker();
    let out = Command::new(env!("CARGO_BIN_EXE_walbox"))
        .args(["status", "--json"])
        .env_clear()
        .envs(walbox_env(&db, &db.name, &broker.bootstrap_servers()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["slot"], db.name.as_str());
    assert_eq!(v["wal_status"], "reserved");
    assert_eq!(v["alert_level"], "ok");
    assert_eq!(v["active"], false);
    assert!(v["retained_wal_bytes"].is_u64());
    assert!(v["current_lsn"].as_str().unwrap().contains('/'));

    let out = Command::new(env!("CARGO_BIN_EXE_walbox"))
        .args(["status"])
        .env_clear()
        .envs(walbox_env(&db, "no_such_slot", &broker.bootstrap_servers()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5));
}

#[test]
fn shipped_alert_rules_pass_promtool() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus");
    let out = Command::new("promtool")
        .args(["test", "rules", "alerts_test.yml"])
        .current_dir(dir)
        .output()
        .expect("promtool not found: install it with scripts/install-deps.sh (Debian package prometheus)");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
