//! Faults between walbox and PostgreSQL: through a TCP proxy (`support::proxy`), a slow link,
//! connections cut with RST, and a blackhole longer than `postgres.receive_timeout`; and
//! PostgreSQL crashing (`-m immediate`) mid-stream and recovering from WAL. walbox must recover
//! by itself, and every committed event must arrive, in per-aggregate order. (Faults between
//! walbox and the brokers are injected by the mock cluster itself: see `relay.rs` and
//! `failures.rs`; its brokers advertise their own addresses, so a proxy cannot sit in between.)

use std::collections::HashSet;
use std::time::Duration;

use walbox::sandbox::broker::TopicReader;
use walbox::sandbox::postgres::PgCluster;

use crate::support::events::{
    assert_per_aggregate_commit_order, await_distinct, distinct_ids, random_writer,
    stop_and_read_exactly, write_txn, write_txns, RandomWrites,
};
use crate::support::{
    self, free_port, http_get, metric, wait_until, walbox_env, TestDb, Walbox, WAIT,
};
use walbox::sandbox::proxy::{Mode, Proxy};

fn with(env: &mut Vec<(String, String)>, key: &str, value: String) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_owned(), value));
}

#[test]
fn a_slow_reset_and_blackholed_link_to_postgres_loses_nothing() {
    let db = TestDb::new("fault_pg");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 4);
    db.create_slot_and_publication(&slot);
    let proxy = Proxy::start(db.addr()).expect("proxy");
    let port = free_port();
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    with(&mut env, "WALBOX_POSTGRES_URL", db.url_via(proxy.port(), 3));
    // Shorter than the leader lock check (4 s), so the silence is what ends the session.
    with(&mut env, "WALBOX_POSTGRES_RECEIVE_TIMEOUT", "2s".into());
    with(&mut env, "WALBOX_HTTP_LISTEN", format!("127.0.0.1:{port}"));
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream through the proxy", || {
        db.streaming(&slot)
    });

    // The writer goes straight to PostgreSQL: only walbox's link is faulted.
    let (written, writer) = random_writer(
        &db,
        &topic,
        RandomWrites {
            seed: 31,
            total: 6_000,
            max_rows: 20,
            aggregates: 40,
            other_table_one_in: None,
        },
    );
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let more = |reader: &mut TopicReader, what: &str| {
        let seen = reader.records.len();
        assert!(
            reader.poll_until(WAIT, |r| r.len() > seen + 100),
            "{what}: no progress; log:\n{}",
            walbox.log()
        );
    };
    more(&mut reader, "before any fault");

    // A slow link: 20 ms per chunk, both ways.
    proxy.set(Mode::Delay(Duration::from_millis(20)));
    more(&mut reader, "on a slow link");
    proxy.set(Mode::Pass);

    // Every connection cut with RST: walbox reconnects.
    let reconnects = |port| {
        http_get(port, "/metrics")
            .and_then(|(_, b)| metric(&b, "walbox_reconnects_total"))
            .unwrap_or(0.0)
    };
    let before = reconnects(port);
    proxy.reset();
    wait_until(WAIT, "a reconnect after the reset", || {
        reconnects(port) > before
    });
    // The reset also cut the leader lock's connection: walbox steps down (at the lock's next
    // check) and, alone, takes the lock again. The blackhole below must find the session of
    // that new term streaming, not one being set up or about to be ended by the lost lock.
    wait_until(WAIT, "walbox to stream again in a new term", || {
        let log = walbox.log();
        let taken = log
            .rfind("active one (leader lock taken)")
            .max(log.rfind("took over:"));
        log.matches("lost the leader lock").count() >= 1
            && taken > log.rfind("lost the leader lock")
            && log.rfind("streaming slot=") > taken
            && http_get(port, "/active").is_some_and(|(status, _)| status == 200)
            && db.streaming(&slot)
    });
    more(&mut reader, "after the reset");

    // A blackhole longer than postgres.receive_timeout: walbox gives the silent connection up
    // by itself (nothing closes it), then comes back when the network does.
    proxy.set(Mode::Blackhole);
    let deadline = std::time::Instant::now() + WAIT;
    while !walbox.log().contains("the connection is presumed dead") {
        assert!(
            std::time::Instant::now() < deadline,
            "walbox did not presume the blackholed connection dead; log:\n{}",
            walbox.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    proxy.set(Mode::Pass);
    more(&mut reader, "after the blackhole");

    writer.join().expect("writer");
    let all: HashSet<i64> = written
        .lock()
        .unwrap()
        .iter()
        .flat_map(|w| w.ids.iter().copied())
        .collect();
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).len() >= all.len()),
        "{} of {} events arrived; log:\n{}",
        distinct_ids(&reader.records).len(),
        all.len(),
        walbox.log()
    );
    assert_eq!(
        distinct_ids(&reader.records),
        all,
        "every committed event, nothing else"
    );
    assert_per_aggregate_commit_order(&reader.records);
    assert!(proxy.accepted() > 2, "walbox reconnected through the proxy");
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

#[test]
fn postgres_crashing_mid_stream_and_recovering_loses_nothing() {
    // Its own cluster: crashing the shared one would disturb the other tests.
    let cluster: &'static PgCluster =
        Box::leak(Box::new(support::start_cluster(support::pg_options())));
    let db = TestDb::on(cluster, "pgcrash");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 3);
    let mut walbox = Walbox::spawn(&walbox_env(&db, &slot, &broker.bootstrap_servers()));
    wait_until(WAIT, "walbox to stream from its slot", || {
        db.streaming(&slot)
    });
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let aggs: Vec<String> = (0..50).map(|i| format!("a{}", i % 9)).collect();
    let mut ids = HashSet::new();
    for round in 0..3 {
        // A burst committed right before the crash: walbox is still reading and producing it
        // when every backend, its walsender included, is killed.
        for _ in 0..20 {
            ids.extend(write_txn(&db, &topic, &aggs, round % 2 == 0).ids);
        }
        cluster.crash().expect("crash postgres");
        cluster.start_again().expect("recover postgres");
        wait_until(WAIT, "walbox to stream again", || db.streaming(&slot));
    }
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).len() >= ids.len()),
        "after three crashes {} of {} events arrived; log:\n{}",
        distinct_ids(&reader.records).len(),
        ids.len(),
        walbox.log()
    );
    assert_eq!(
        distinct_ids(&reader.records),
        ids,
        "every committed event, nothing else"
    );
    assert_per_aggregate_commit_order(&reader.records);
    assert!(walbox.running(), "walbox exited:\n{}", walbox.log());
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

#[test]
fn a_slow_broker_and_moving_partition_leaders_lose_nothing() {
    let db = TestDb::new("fault_kafka");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 3);
    let Some(mock) = broker.mock_cluster() else {
        eprintln!("external broker: broker faults need the mock cluster; skipped");
        return;
    };
    db.create_slot_and_publication(&slot);
    let mut walbox = Walbox::spawn(&walbox_env(&db, &slot, &broker.bootstrap_servers()));
    wait_until(WAIT, "walbox to stream", || db.streaming(&slot));
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let aggs: Vec<String> = (0..30).map(|i| format!("k{}", i % 11)).collect();
    let mut ids = HashSet::new();
    ids.extend(write_txns(&db, &topic, &aggs, 10));
    // Every broker answers 300 ms late.
    support::delay_every_broker(mock, Duration::from_millis(300));
    ids.extend(write_txns(&db, &topic, &aggs, 10));
    assert!(reader.poll_until(WAIT, |r| distinct_ids(r).len() >= ids.len()));
    // Every partition's leader moves to the next broker while events are produced.
    ids.extend(write_txns(&db, &topic, &aggs, 10));
    support::move_partition_leaders(mock, &topic, 3);
    ids.extend(write_txns(&db, &topic, &aggs, 10));
    support::delay_every_broker(mock, Duration::ZERO);
    ids.extend(write_txns(&db, &topic, &aggs, 10));
    await_distinct(&mut reader, ids.len(), &walbox);
    stop_and_read_exactly(&mut walbox, &mut reader, &ids);
    assert_per_aggregate_commit_order(&reader.records);
}
