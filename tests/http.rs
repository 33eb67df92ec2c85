//! The HTTP endpoints of a running walbox: metrics, liveness, readiness.

use std::net::TcpListener;

use walbox::sandbox::broker::TopicReader;

use crate::support::{self, http_get as get, metric, wait_until, walbox_env, TestDb, Walbox, WAIT};

#[test]
fn metrics_health_and_readiness_reflect_the_relay() {
    let db = TestDb::new("http");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 2);
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    env.retain(|(k, _)| k != "WALBOX_HTTP_LISTEN");
    env.push(("WALBOX_HTTP_LISTEN".into(), format!("127.0.0.1:{port}")));
    let walbox = Walbox::spawn(&env);

    wait_until(WAIT, "/readyz to report streaming", || {
        get(port, "/readyz").is_some_and(|(code, _)| code == 200)
    });
    assert_eq!(get(port, "/healthz").map(|(c, _)| c), Some(200));
    db.sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) \
         SELECT 'a' || g, '{topic}', 'x', '{{}}' FROM generate_series(1, 25) g"
    ));
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    assert!(reader.poll_until(WAIT, |r| r.len() >= 25));
    wait_until(WAIT, "the metrics to count the events", || {
        get(port, "/metrics").is_some_and(|(_, body)| {
            metric(&body, "walbox_events_published_total") == Some(25.0)
                && metric(&body, "walbox_transactions_total") == Some(1.0)
                && metric(&body, "walbox_confirmed_flush_lsn").is_some_and(|v| v > 0.0)
        })
    });
    let (_, body) = get(port, "/metrics").unwrap();
    for name in [
        "walbox_inflight_events",
        "walbox_replication_lag_seconds",
        "walbox_commit_to_ack_seconds_count",
        "walbox_streaming",
    ] {
        assert!(metric(&body, name).is_some(), "{name} missing:\n{body}");
    }
    drop(walbox);
}

#[test]
fn slot_active_is_1_as_soon_as_walbox_streams() {
    let db = TestDb::new("http_active");
    let slot = db.name.clone();
    // The slot exists before walbox starts, so the monitor's first reading finds it inactive.
    db.create_slot_and_publication(&slot);
    let broker = support::broker();
    let port = support::free_port();
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    env.retain(|(k, _)| k != "WALBOX_HTTP_LISTEN");
    env.push(("WALBOX_HTTP_LISTEN".into(), format!("127.0.0.1:{port}")));
    // No second reading during the test: the gauge must not depend on it.
    env.push(("WALBOX_SLOT_CHECK_INTERVAL".into(), "1h".into()));
    let walbox = Walbox::spawn(&env);

    let mut body = String::new();
    wait_until(WAIT, "/metrics to report walbox_streaming 1", || {
        body = get(port, "/metrics").map(|(_, b)| b).unwrap_or_default();
        metric(&body, "walbox_streaming") == Some(1.0)
    });
    assert!(db.slot_active(&slot), "{}", walbox.log());
    assert_eq!(
        metric(&body, "walbox_slot_active"),
        Some(1.0),
        "walbox streams from the slot, so it is active:\n{body}"
    );
    let (_, later) = get(port, "/metrics").unwrap();
    assert_eq!(metric(&later, "walbox_slot_active"), Some(1.0), "{later}");
    drop(walbox);
}
