//! Exactly-once mode and progress records of another history or slot generation: a point-in-time
//! restore, a promoted standby or a slot made again reuse LSNs under the same record key, and a
//! record trusted from there skips new transactions as "already in Kafka" (silent loss). Each
//! test writes such a record by hand (as the walbox of that other history would have), then
//! asserts that every row reaches Kafka. The broker does not matter here: the mock cluster runs
//! them, and the real-Kafka lane too (`scripts/real-kafka.sh`).

use std::collections::HashSet;
use std::time::Duration;

use walbox::lsn::Lsn;
use walbox::sandbox::broker::TopicReader;

use crate::exactly_once::{eos_env, setup, transactions_supported, wait_for_all, Setup};
use crate::failover::wait_for_synchronized_slot;
use crate::support::events::{distinct_ids, outbox_ids, stop_and_read_exactly, write_txns};
use crate::support::{self, wait_until, TestDb, Walbox, WAIT};

/// Writes a progress record for `t`'s slot at `lsn`, outside any transaction, as another
/// walbox would have: with `lineage` (timeline, slot generation) as this one writes them, or
/// without, as an older walbox did.
fn write_progress_record(t: &Setup, lsn: &str, lineage: Option<(u32, Lsn)>) {
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let system =
        t.db.sql("SELECT system_identifier FROM pg_control_system()");
    let key = format!("{system}/{}/{}", t.db.name, t.slot);
    let mut record = serde_json::json!({
        "slot": t.slot, "database": t.db.name, "system_identifier": system,
        "confirmed_lsn": lsn, "confirmed_commit_time_us": null,
        "written_at": "2026-01-01T00:00:00Z",
    });
    if let Some((timeline, floor)) = lineage {
        record["timeline"] = timeline.into();
        record["slot_floor"] = floor.to_string().into();
    }
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", t.broker.bootstrap_servers())
        .create()
        .expect("producer");
    producer
        .send(
            BaseRecord::to("walbox.progress")
                .key(&key)
                .payload(&record.to_string()),
        )
        .map_err(|(e, _)| e)
        .expect("send");
    producer.flush(Duration::from_secs(30)).expect("flush");
}

/// Issue: after the slot-lost runbook (`recreate-slot`, then `run`), the old slot's progress
/// record still said where Kafka was; new transactions below it were skipped as relayed.
#[test]
fn recreate_slot_resets_the_progress_record() {
    let Some(t) = setup("eos_reset") else {
        return;
    };
    let brokers = t.broker.bootstrap_servers();
    // The old slot's record: 16 MB of WAL ahead of now, reached before walbox runs again.
    let now: Lsn = t.db.sql("SELECT pg_current_wal_lsn()").parse().unwrap();
    let ahead = Lsn::from(now.as_u64() + 0x100_0000);
    write_progress_record(&t, &ahead.to_string(), None);
    let env = eos_env(&t.db, &t.slot, &brokers, "1ms");
    let (code, out) = support::walbox_cmd(&["recreate-slot", "--confirm-data-loss"], &env);
    assert_eq!(code, 0, "{out}");
    write_txns(&t.db, &t.topic, &t.aggregates, 2);
    t.db.sql(
        "INSERT INTO payments (wallet_id, amount) SELECT 'w', g FROM generate_series(1, 300000) g",
    );
    let past: Lsn = t.db.sql("SELECT pg_current_wal_lsn()").parse().unwrap();
    assert!(
        past > ahead,
        "the server's WAL passed the old record: {past} ≤ {ahead}"
    );
    let mut walbox = Walbox::spawn(&env);
    let mut reader = TopicReader::new(&brokers, &[&t.topic], WAIT).unwrap();
    let all = wait_for_all(&mut reader, &t.db, &walbox);
    stop_and_read_exactly(&mut walbox, &mut reader, &all);
}

/// Issue: the progress record's key survives a point-in-time restore or a promoted standby,
/// which reuse LSNs; a record from that other history, far ahead of the server, made every new
/// transaction below it "already in Kafka": new rows lost without an error.
#[test]
fn a_progress_record_beyond_the_servers_wal_is_not_trusted() {
    let Some(t) = setup("eos_history") else {
        return;
    };
    let brokers = t.broker.bootstrap_servers();
    write_progress_record(&t, "FF/0", None);
    let env = eos_env(&t.db, &t.slot, &brokers, "1ms");
    write_txns(&t.db, &t.topic, &t.aggregates, 2);
    let mut walbox = Walbox::spawn(&env);
    let mut reader = TopicReader::new(&brokers, &[&t.topic], WAIT).unwrap();
    write_txns(&t.db, &t.topic, &t.aggregates, 2);
    let all = wait_for_all(&mut reader, &t.db, &walbox);
    stop_and_read_exactly(&mut walbox, &mut reader, &all);
    assert!(
        walbox.log().contains("of another history"),
        "{}",
        walbox.log()
    );
}

/// The slot's confirmed position and the server's WAL position, once `write_txns` committed
/// rows while walbox was down (their commit LSNs lie between the two).
fn backlog_between(t: &Setup) -> (Lsn, Lsn) {
    write_txns(&t.db, &t.topic, &t.aggregates, 2);
    let slot = t.db.sql(&format!(
        "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{}'",
        t.slot
    ));
    let now = t.db.sql("SELECT pg_current_wal_lsn()");
    (slot.parse().unwrap(), now.parse().unwrap())
}

/// Runs walbox in exactly-once mode over the backlog and two more transactions written after
/// it started; every row must arrive exactly once. Returns walbox's log.
fn every_row_arrives(t: &Setup) -> String {
    let brokers = t.broker.bootstrap_servers();
    let env = eos_env(&t.db, &t.slot, &brokers, "1ms");
    let mut walbox = Walbox::spawn(&env);
    let mut reader = TopicReader::new(&brokers, &[&t.topic], WAIT).unwrap();
    write_txns(&t.db, &t.topic, &t.aggregates, 2);
    let all = wait_for_all(&mut reader, &t.db, &walbox);
    stop_and_read_exactly(&mut walbox, &mut reader, &all);
    walbox.log()
}

/// Issue 34 (3): a record of another timeline (a promoted standby's old primary, a restore's
/// other branch) at a position the server has already passed: the guard against records beyond
/// the server's WAL does not catch it, and the rows committed below it were skipped.
#[test]
fn a_progress_record_of_a_timeline_outside_the_servers_history_is_not_trusted() {
    let Some(t) = setup("eos_timeline") else {
        return;
    };
    let (slot, now) = backlog_between(&t);
    assert!(
        slot < now,
        "the backlog lies below the record: {slot} < {now}"
    );
    // Timeline 7 is not in the history of the sandbox's timeline 1.
    write_progress_record(&t, &now.to_string(), Some((7, slot)));
    let log = every_row_arrives(&t);
    assert!(log.contains("timeline 7"), "{log}");
}

/// Issue 34 (3): a record of the same timeline whose writer found the slot further than it is
/// now: another generation of the slot (made again, or restored from a backup), whose
/// positions say nothing of this one's transactions.
#[test]
fn a_progress_record_of_another_generation_of_the_slot_is_not_trusted() {
    let Some(t) = setup("eos_generation") else {
        return;
    };
    let (slot, now) = backlog_between(&t);
    write_progress_record(&t, &now.to_string(), Some((1, now)));
    assert!(slot < now);
    let log = every_row_arrives(&t);
    assert!(log.contains("another generation of the slot"), "{log}");
}

/// Issue 34 (3), as it happens: an asynchronous standby that lags holds the failover slot
/// (PostgreSQL 17+); walbox relays on the primary past what the standby received; the primary
/// crashes and the standby is promoted (timeline 2). The last progress record, of timeline 1,
/// lies beyond the point where timeline 2 began, and the new primary writes past it before
/// walbox starts there: trusted whole, it skipped the new primary's first transactions.
#[test]
fn a_lagging_standby_promoted_after_a_crash_has_none_of_its_transactions_skipped() {
    use walbox::sandbox::postgres::{PgCluster, PgClusterOptions};
    use walbox::sandbox::standby::StandbyOptions;
    let major = match support::test_major() {
        Some(m) if m < 17 => {
            println!("skipped on PostgreSQL {m}: a slot survives a promotion from 17 on (failover slots)");
            return;
        }
        Some(m) => m,
        None => 17,
    };
    let primary: &'static PgCluster =
        Box::leak(Box::new(support::start_cluster(PgClusterOptions {
            major: Some(major),
            watchdog: true,
            ..Default::default()
        })));
    let standby: &'static PgCluster = Box::leak(Box::new(
        primary
            .start_standby(StandbyOptions {
                watchdog: true,
                settings: vec![("sync_replication_slots".into(), "on".into())],
            })
            .expect("start the standby"),
    ));
    let db = TestDb::on(primary, "eos_promoted");
    let replica = db.on_standby(standby);
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 3);
    if !transactions_supported(&broker) {
        return;
    }
    let brokers = broker.bootstrap_servers();
    let aggregates: Vec<String> = (0..20).map(|i| format!("agg-{}", i % 5)).collect();
    let mut env = eos_env(&db, &slot, &brokers, "1ms");
    env.push(("WALBOX_POSTGRES_FAILOVER_SLOT".into(), "true".into()));
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream from the primary", || {
        db.streaming(&slot)
    });
    let mut reader = TopicReader::new(&brokers, &[&topic], WAIT).unwrap();
    write_txns(&db, &topic, &aggregates, 2);
    wait_for_all(&mut reader, &db, &walbox);
    wait_for_synchronized_slot(&db, &replica, &slot);

    // The standby stops receiving: from here on it lags.
    standby
        .psql(
            "postgres",
            "ALTER SYSTEM SET primary_conninfo = ''; SELECT pg_reload_conf();",
        )
        .unwrap();
    wait_until(WAIT, "the standby's WAL receiver to stop", || {
        standby
            .psql("postgres", "SELECT count(*) FROM pg_stat_wal_receiver;")
            .is_ok_and(|n| n.trim() == "0")
    });
    // walbox relays what only the primary has; the progress record moves far past the standby.
    db.sql(
        "INSERT INTO payments (wallet_id, amount) SELECT 'w', g FROM generate_series(1, 300000) g",
    );
    write_txns(&db, &topic, &aggregates, 2);
    wait_for_all(&mut reader, &db, &walbox);
    let recorded: Lsn = db.sql("SELECT pg_current_wal_lsn()").parse().unwrap();
    primary.crash().expect("crash the primary");
    walbox.kill();
    standby.promote().expect("promote the standby");

    // Timeline 2's first transactions, below the old record's position; ids apart from the
    // old primary's (which the new primary may hand out again).
    replica.sql("SELECT setval(pg_get_serial_sequence('outbox', 'id'), 1000000)");
    write_txns(&replica, &topic, &aggregates, 2);
    let first: Lsn = replica.sql("SELECT pg_current_wal_lsn()").parse().unwrap();
    assert!(
        first < recorded,
        "timeline 2 starts below the record: {first} < {recorded}"
    );
    // The new primary's WAL passes the old record before walbox starts there.
    wait_until(WAIT, "the new primary's WAL to pass the old record", || {
        replica.sql("INSERT INTO payments (wallet_id, amount) VALUES ('w', 1)");
        replica.sql("SELECT pg_switch_wal()");
        replica
            .sql("SELECT pg_current_wal_lsn()")
            .parse::<Lsn>()
            .unwrap()
            > recorded
    });

    let mut env = eos_env(&replica, &slot, &brokers, "1ms");
    env.push(("WALBOX_POSTGRES_FAILOVER_SLOT".into(), "true".into()));
    let mut walbox = Walbox::spawn(&env);
    write_txns(&replica, &topic, &aggregates, 2);
    let new: HashSet<i64> = outbox_ids(&replica)
        .into_iter()
        .filter(|id| *id > 1_000_000)
        .collect();
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).is_superset(&new)),
        "missing {:?}; log:\n{}",
        new.difference(&distinct_ids(&reader.records))
            .collect::<Vec<_>>(),
        walbox.log()
    );
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    assert!(
        walbox.log().contains("earlier timeline"),
        "{}",
        walbox.log()
    );
}
