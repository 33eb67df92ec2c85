//! The relay end to end against real PostgreSQL and a real Kafka-protocol broker: delivery,
//! ordering, crashes, broker outages, PostgreSQL restarts.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use walbox::lsn::Lsn;
use walbox::sandbox::broker::TopicReader;
use walbox::sandbox::postgres::PgCluster;

use crate::support::events::{
    assert_per_aggregate_commit_order, distinct_ids, id_of, random_writer, write_txn, RandomWrites,
    Written,
};
use crate::support::{self, wait_until, walbox_env, TestDb, Walbox, WAIT};

/// The committed outbox rows as PostgreSQL stores them: id → (aggregate, topic, type, payload).
fn stored_rows(db: &TestDb) -> BTreeMap<i64, [String; 4]> {
    db.sql("SELECT id, aggregate_id, topic, event_type, payload::text FROM outbox ORDER BY id")
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.splitn(5, '|').collect();
            (
                f[0].parse().expect("id"),
                [f[1].into(), f[2].into(), f[3].into(), f[4].into()],
            )
        })
        .collect()
}

#[test]
fn every_committed_event_arrives_exactly_as_stored_in_commit_order() {
    let db = TestDb::new("e2e");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 6);
    db.create_slot_and_publication(&slot);

    // 10,000 events over 200 aggregates in transactions of 1–100 rows; some also write another
    // table, some roll back.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut script = String::new();
    let (mut committed, mut rolled_back) = (0usize, 0usize);
    while committed < 10_000 {
        let n = rng.random_range(1..=100).min(10_000 - committed);
        let rollback = rng.random_ratio(1, 10);
        script.push_str("BEGIN;\n");
        if rng.random_ratio(1, 3) {
            script.push_str("INSERT INTO payments (wallet_id, amount) VALUES ('w', 42.5);\n");
        }
        script.push_str("INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES ");
        for i in 0..n {
            let agg = rng.random_range(0..200);
            let kind = if rollback {
                "rolled.back"
            } else {
                "order.placed"
            };
            if i > 0 {
                script.push(',');
            }
            script.push_str(&format!(
                "('agg-{agg}', '{topic}', '{kind}', '{{\"agg\": {agg}, \"n\": {i}, \"note\": \"caf\u{e9} \\\"quoted\\\" ✓\", \"amount\": 12.50}}')"
            ));
        }
        script.push_str(";\n");
        if rollback {
            script.push_str("ROLLBACK;\n");
            rolled_back += n;
        } else {
            script.push_str("COMMIT;\n");
            committed += n;
        }
    }
    db.sql(&script);
    assert!(rolled_back > 0);
    let last_commit = db
        .sql("SELECT pg_current_wal_insert_lsn()")
        .parse::<Lsn>()
        .unwrap();

    let _walbox = Walbox::spawn(&walbox_env(&db, &slot, &broker.bootstrap_servers()));
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    assert!(
        reader.poll_until(WAIT, |r| r.len() >= 10_000),
        "read {} of 10000 events",
        reader.records.len()
    );
    wait_until(WAIT, "the slot to confirm the last commit", || {
        db.confirmed(&slot) >= last_commit
    });
    reader.read_to_end(WAIT).unwrap();

    let stored = stored_rows(&db);
    assert_eq!(stored.len(), 10_000);
    assert_eq!(
        reader.records.len(),
        10_000,
        "no duplicates in an undisturbed run"
    );
    for r in &reader.records {
        let id = id_of(r);
        let [agg, topic_col, kind, payload] = stored
            .get(&id)
            .unwrap_or_else(|| panic!("event {id} was not committed (rolled back?)"));
        assert_eq!(r.topic, *topic_col);
        assert_eq!(r.key.as_deref(), Some(agg.as_bytes()), "key of {id}");
        assert_eq!(
            r.payload.as_deref(),
            Some(payload.as_bytes()),
            "payload of {id}"
        );
        assert_eq!(r.header_str("event_type"), Some(kind.as_str()));
        let lsn = r
            .header_str("walbox.commit_lsn")
            .expect("commit lsn header");
        assert!(lsn.parse::<Lsn>().is_ok(), "commit lsn header {lsn:?}");
        assert!(r.header_str("walbox.index").unwrap().parse::<u32>().is_ok());
    }
    assert_eq!(distinct_ids(&reader.records).len(), 10_000);
    assert_per_aggregate_commit_order(&reader.records);
}

#[test]
fn sigkill_at_random_points_loses_nothing_and_never_confirms_unacked_events() {
    let db = TestDb::new("crash");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 4);
    db.create_slot_and_publication(&slot);
    let env = walbox_env(&db, &slot, &broker.bootstrap_servers());

    // The writer streams 50,000 events in transactions of 1–50 rows while walbox is killed.
    let (written, writer) = random_writer(
        &db,
        &topic,
        RandomWrites {
            seed: 11,
            total: 50_000,
            max_rows: 50,
            aggregates: 100,
            other_table_one_in: Some(4),
        },
    );

    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let mut kills = 0;
    let mut checked_txns = 0;
    let created = db.confirmed(&slot);
    while kills < 20 || !writer.is_finished() {
        let mut walbox = Walbox::spawn(&env);
        if kills == 0 {
            // The first kill comes once something is confirmed, so that the check below
            // checks something even where start-up is slow (a real broker under load takes
            // longer than the random window to a first confirmation).
            wait_until(WAIT, "walbox to confirm a transaction", || {
                written
                    .lock()
                    .unwrap()
                    .first()
                    .is_some_and(|w| db.confirmed(&slot) >= w.after_commit.max(created))
            });
        } else {
            // Fault injection: the kill point is random by design.
            std::thread::sleep(Duration::from_millis(rng.random_range(150..900)));
        }
        walbox.kill();
        kills += 1;
        // walbox is dead, so the slot's position is final for now: every transaction it
        // confirmed must already be in Kafka, whole.
        let confirmed = db.confirmed(&slot);
        reader.read_to_end(WAIT).unwrap();
        let present = distinct_ids(&reader.records);
        for w in written.lock().unwrap().iter() {
            if w.after_commit <= confirmed {
                checked_txns += 1;
                for id in &w.ids {
                    assert!(
                        present.contains(id),
                        "slot confirmed {confirmed} but event {id} (committed before {}) is not in Kafka",
                        w.after_commit
                    );
                }
            }
        }
    }
    writer.join().expect("writer");
    assert!(checked_txns > 0, "no kill happened after any confirmation");

    let mut walbox = Walbox::spawn(&env);
    assert!(
        reader.poll_until(WAIT * 2, |r| distinct_ids(r).len() >= 50_000),
        "after {kills} kills, {} of 50000 events arrived; log:\n{}",
        distinct_ids(&reader.records).len(),
        walbox.log()
    );
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    let all: HashSet<i64> = written
        .lock()
        .unwrap()
        .iter()
        .flat_map(|w| w.ids.iter().copied())
        .collect();
    assert_eq!(all.len(), 50_000);
    assert_eq!(
        distinct_ids(&reader.records),
        all,
        "every committed event, nothing else"
    );
    assert_per_aggregate_commit_order(&reader.records);
}

#[test]
fn broker_outage_holds_the_slot_and_everything_arrives_after_recovery() {
    let db = TestDb::new("outage");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 3);
    let Some(mock) = broker.mock_cluster() else {
        eprintln!("external broker: outage injection needs the mock cluster; skipped");
        return;
    };
    db.create_slot_and_publication(&slot);
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    // librdkafka's own account of the outage, printed if the test fails.
    env.push((
        "WALBOX_KAFKA_PROPERTY_DEBUG".into(),
        "eos,broker,msg".into(),
    ));
    env.retain(|(k, _)| k != "WALBOX_LOG_LEVEL");
    env.push(("WALBOX_LOG_LEVEL".into(), "info,librdkafka=debug".into()));
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream from its slot", || {
        db.streaming(&slot)
    });
    let aggs: Vec<String> = (0..10).map(|i| format!("a{i}")).collect();
    let before = write_txn(&db, &topic, &aggs, false);
    wait_until(WAIT, "the first events to be confirmed", || {
        db.confirmed(&slot) >= before.after_commit
    });

    support::fail_every_produce(mock);
    let during: Vec<Written> = (0..5)
        .map(|_| write_txn(&db, &topic, &aggs, true))
        .collect();
    let last = during.last().unwrap().after_commit;
    // The walsender has sent everything, and walbox keeps answering with status updates…
    wait_until(
        WAIT,
        "the walsender to send the outage's transactions",
        || {
            db.sql(&format!(
            "SELECT sent_lsn >= '{last}' FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = '{slot}'"
        )) == "t"
        },
    );
    let t0 = db.sql("SELECT now()");
    wait_until(WAIT, "several status updates during the outage", || {
        db.sql(&format!(
            "SELECT reply_time > '{t0}'::timestamptz + interval '500 ms' FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = '{slot}'"
        )) == "t"
    });
    // …but none of them confirms an event the broker has not acknowledged. (The position
    // may still creep up to the first outage transaction: keepalives while idle confirm WAL
    // that other databases of the cluster write.)
    let commits = db.commits(&slot);
    assert_eq!(
        commits.len(),
        6,
        "one transaction before the outage, five during it"
    );
    let confirmed = db.confirmed(&slot);
    assert!(
        confirmed >= commits[0].1 && confirmed < commits[1].1,
        "confirmed_flush_lsn {confirmed} passed the first unacknowledged transaction (end {})",
        commits[1].1
    );
    assert!(
        walbox.running(),
        "a broker outage is not fatal:\n{}",
        walbox.log()
    );

    support::restore_produce(mock);
    let expected: HashSet<i64> = std::iter::once(&before)
        .chain(&during)
        .flat_map(|w| w.ids.iter().copied())
        .collect();
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).is_superset(&expected)),
        "after recovery {} of {} events arrived; walbox log:\n{}",
        distinct_ids(&reader.records).len(),
        expected.len(),
        walbox.log()
    );
    wait_until(WAIT, "the slot to confirm past the outage", || {
        db.confirmed(&slot) >= last
    });
    assert_per_aggregate_commit_order(&reader.records);
}

#[test]
fn postgres_restart_mid_stream_reconnects_and_loses_nothing() {
    // Its own cluster: restarting the shared one would disturb the other tests.
    let cluster: &'static PgCluster =
        Box::leak(Box::new(support::start_cluster(support::pg_options())));
    let db = TestDb::on(cluster, "pgrestart");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 3);
    let mut walbox = Walbox::spawn(&walbox_env(&db, &slot, &broker.bootstrap_servers()));
    wait_until(WAIT, "walbox to stream from its slot", || {
        db.streaming(&slot)
    });

    let aggs: Vec<String> = (0..20).map(|i| format!("a{i}")).collect();
    let mut written: Vec<Written> = (0..10)
        .map(|_| write_txn(&db, &topic, &aggs, false))
        .collect();
    cluster.restart().expect("restart postgres");
    written.extend((0..10).map(|_| write_txn(&db, &topic, &aggs, false)));

    let expected: HashSet<i64> = written.iter().flat_map(|w| w.ids.iter().copied()).collect();
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).is_superset(&expected)),
        "after the restart {} of {} events arrived",
        distinct_ids(&reader.records).len(),
        expected.len()
    );
    let last = written.last().unwrap().after_commit;
    wait_until(WAIT, "the slot to confirm everything", || {
        db.confirmed(&slot) >= last
    });
    assert!(walbox.running(), "walbox exited:\n{}", walbox.log());
    assert!(walbox.log().contains("reconnecting"), "{}", walbox.log());
    // A restart is no error of walbox's, and no standby was ever started.
    let log = walbox.log();
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" ERROR ") || l.contains("a standby takes over"))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    assert_per_aggregate_commit_order(&reader.records);
}

/// A `Duration` as its `Debug` text (`31.2ms`, `1.05s`) at the start of `text`.
fn debug_duration(text: &str) -> Option<Duration> {
    let text = text.split_whitespace().next()?;
    let at = text.find(|c: char| c.is_ascii_alphabetic() || c == 'µ')?;
    let (number, unit) = text.split_at(at);
    let n: f64 = number.parse().ok()?;
    let seconds = match unit {
        "s" => n,
        "ms" => n / 1e3,
        "µs" => n / 1e6,
        "ns" => n / 1e9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(seconds))
}

#[test]
fn sessions_that_end_where_they_started_back_off_longer_each_time() {
    // Its own cluster: WAL of the other tests' databases would let every session confirm a
    // new position (from keepalives), which is progress.
    let cluster: &'static PgCluster =
        Box::leak(Box::new(support::start_cluster(support::pg_options())));
    let db = TestDb::on(cluster, "backoff");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 1);
    db.create_slot_and_publication(&slot);
    // Backoff from 50 ms, doubling up to 1 s.
    let walbox = Walbox::spawn(&walbox_env(&db, &slot, &broker.bootstrap_servers()));
    let delays = || -> Vec<Duration> {
        walbox
            .log()
            .lines()
            .filter(|l| l.contains("replication session ended; reconnecting"))
            .filter_map(|l| debug_duration(l.split("retry_in=").nth(1)?))
            .collect()
    };
    let cut = |n: usize| {
        wait_until(WAIT, "walbox to stream", || db.streaming(&slot));
        db.sql(&format!(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '{slot}' AND active_pid IS NOT NULL"
        ));
        wait_until(WAIT, "walbox to reconnect", || delays().len() >= n);
    };
    // Sessions that stream and end with nothing new confirmed: 50, 100, 200, 400, 800 ms.
    for n in 1..=5 {
        cut(n);
    }
    let grown = delays();
    assert!(
        grown.iter().max() >= Some(&Duration::from_millis(200)),
        "the backoff grows while no session makes progress: {grown:?}\n{}",
        walbox.log()
    );
    // A session that relays an event confirms a new position: the next delay starts over.
    wait_until(WAIT, "walbox to stream", || db.streaming(&slot));
    let written = write_txn(&db, &topic, &["a".to_owned()], false);
    wait_until(WAIT, "the event to be confirmed", || {
        db.confirmed(&slot) >= written.after_commit
    });
    cut(6);
    let after = delays()[5];
    assert!(
        after <= Duration::from_millis(50),
        "progress resets the backoff: {:?}",
        delays()
    );
}
