//! Crashes at exact points of the path WAL → Kafka → confirmed LSN (the `fault` module's
//! points, built with `--features failpoints`), each followed by a restart that must deliver
//! every committed event. Where the random SIGKILLs of `relay.rs` hit these windows by chance,
//! these tests hit each one every time, and show that they did.

use std::collections::HashSet;
use std::os::unix::process::ExitStatusExt;

use walbox::lsn::Lsn;
use walbox::sandbox::broker::TopicReader;

use crate::support::events::{
    assert_per_aggregate_commit_order, await_distinct, id_of, outbox_ids, stop_and_read_exactly,
    write_txn, Written,
};
use crate::support::{self, wait_until, walbox_env, TestDb, Walbox, WAIT};

/// Transactions written before walbox starts, and rows in each.
const TXNS: usize = 12;
const ROWS: usize = 40;

/// What a test sees once walbox crashed at its fault point and PostgreSQL let go of the slot.
pub struct Crash {
    /// The slot's confirmed position before walbox started.
    pub before: Lsn,
    /// The slot's confirmed position after the crash (final: nobody streams).
    pub confirmed: Lsn,
    /// The transactions written before the start, in commit order.
    pub written: Vec<Written>,
    /// Their commit end LSNs, exactly (`written[i].after_commit` is only an upper bound).
    pub ends: Vec<Lsn>,
    /// The ids in Kafka right after the crash, and how often each arrived.
    pub in_kafka: Vec<i64>,
    /// The brokers, the slot and its progress topic (one of the test's own).
    pub brokers: String,
    pub slot: String,
    pub progress_topic: String,
}

/// What Kafka holds after the restart.
pub struct Delivered {
    /// The ids of every record, in the order read (duplicates included).
    pub ids: Vec<i64>,
    /// The restarted walbox's log.
    pub log: String,
}

/// Writes a backlog, runs walbox (its environment plus `extra`) with fault point `point`
/// firing after `skip` passes, waits for the crash, checks that every transaction the slot
/// confirmed is in Kafka, hands the crash to `check`, then restarts walbox and checks that
/// every committed event arrives, in per-aggregate commit order.
pub fn crash_at(
    extra: &[(&str, &str)],
    point: &str,
    skip: u32,
    check: impl FnOnce(&Crash),
) -> Delivered {
    let db = TestDb::new("fault");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 4);
    db.create_slot_and_publication(&slot);
    let before = db.confirmed(&slot);
    let aggregates: Vec<String> = (0..ROWS).map(|i| format!("agg-{}", i % 10)).collect();
    let written: Vec<Written> = (0..TXNS)
        .map(|_| write_txn(&db, &topic, &aggregates, false))
        .collect();

    let progress_topic = support::own_progress_topic(&broker, &slot);
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    env.push(("WALBOX_KAFKA_PROGRESS_TOPIC".into(), progress_topic.clone()));
    env.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let mut faulty = env.clone();
    faulty.push(("FAILPOINTS".into(), format!("{point}={skip}*off->return")));
    let mut walbox = Walbox::spawn(&faulty);
    let status = walbox.wait_exit(WAIT);
    let log = walbox.log();
    assert_eq!(
        status.signal(),
        Some(libc_sigabrt()),
        "walbox was to crash at {point}; it ended with {status:?}; log:\n{log}"
    );
    assert!(
        log.contains(&format!("fault point {point} fired")),
        "log:\n{log}"
    );
    wait_until(WAIT, "PostgreSQL to release the slot", || {
        !db.slot_active(&slot)
    });
    let confirmed = db.confirmed(&slot);

    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    reader.read_to_end(WAIT).unwrap();
    let in_kafka: Vec<i64> = reader.records.iter().map(id_of).collect();
    let present: HashSet<i64> = in_kafka.iter().copied().collect();
    for w in written.iter().filter(|w| w.after_commit <= confirmed) {
        for id in &w.ids {
            assert!(
                present.contains(id),
                "crash at {point}: the slot confirmed {confirmed} but event {id} (committed before {}) is not in Kafka",
                w.after_commit
            );
        }
    }
    let ends: Vec<Lsn> = db.commits(&slot).into_iter().map(|(_, end)| end).collect();
    assert_eq!(
        ends.len(),
        written.len(),
        "one commit per written transaction"
    );
    check(&Crash {
        before,
        confirmed,
        ends,
        written,
        in_kafka,
        brokers: broker.bootstrap_servers(),
        slot: slot.clone(),
        progress_topic,
    });

    // After the restart: the backlog, and what is written while walbox runs.
    let mut walbox = Walbox::spawn(&env);
    let more = write_txn(&db, &topic, &aggregates, true);
    let all = outbox_ids(&db);
    assert_eq!(all.len(), (TXNS + 1) * ROWS);
    assert!(more.ids.iter().all(|id| all.contains(id)));
    await_distinct(&mut reader, all.len(), &walbox);
    stop_and_read_exactly(&mut walbox, &mut reader, &all);
    assert_per_aggregate_commit_order(&reader.records);
    Delivered {
        ids: reader.records.iter().map(id_of).collect(),
        log: walbox.log(),
    }
}

/// SIGABRT, which `std::process::abort` raises.
fn libc_sigabrt() -> i32 {
    6
}

#[test]
fn a_crash_after_the_broker_acked_but_before_the_status_update_loses_nothing() {
    let mut window = None;
    let delivered = crash_at(&[], "relay::acked", 2, |c| {
        // The acks had moved the frontier past a transaction the slot never heard of: it is in
        // Kafka whole, above the confirmed position.
        let present: HashSet<i64> = c.in_kafka.iter().copied().collect();
        let acked_unconfirmed: Vec<&Written> = c
            .written
            .iter()
            .zip(&c.ends)
            .filter(|(_, end)| **end > c.confirmed)
            .map(|(w, _)| w)
            .filter(|w| w.ids.iter().all(|id| present.contains(id)))
            .collect();
        assert!(
            !acked_unconfirmed.is_empty(),
            "no acknowledged transaction above the confirmed position {}: the crash missed the window",
            c.confirmed
        );
        window = Some(acked_unconfirmed[0].ids.clone());
    });
    // That transaction is sent again after the restart: at least once, never lost.
    let window = window.unwrap();
    let again = delivered
        .ids
        .iter()
        .filter(|id| window.contains(id))
        .count();
    assert!(
        again >= 2 * window.len(),
        "the acknowledged but unconfirmed transaction is delivered again after the restart"
    );
}

#[test]
fn a_crash_right_after_a_status_update_loses_nothing() {
    crash_at(&[], "relay::status-sent", 1, |c| {
        assert!(
            c.confirmed > c.before,
            "the status update sent before the crash reached PostgreSQL: confirmed {} stayed at {}",
            c.confirmed,
            c.before
        );
    });
}

#[test]
fn a_crash_in_the_middle_of_a_transactions_events_loses_nothing() {
    // The 61st event is the 21st of the second transaction.
    crash_at(&[], "relay::produced", (ROWS + 20) as u32, |c| {
        assert!(
            c.confirmed <= c.written[0].after_commit,
            "the second transaction was only half produced, yet the slot confirmed {} past the first one's end {}",
            c.confirmed,
            c.written[0].after_commit
        );
        let present: HashSet<i64> = c.in_kafka.iter().copied().collect();
        let second = &c.written[1].ids;
        assert!(
            second[ROWS / 2 + 1..]
                .iter()
                .all(|id| !present.contains(id)),
            "events after the crash point were never handed to the producer"
        );
    });
}

#[test]
fn a_crash_as_a_session_starts_confirms_nothing_and_loses_nothing() {
    crash_at(&[], "relay::session-started", 0, |c| {
        assert_eq!(
            c.confirmed, c.before,
            "a session that crashed before its first status update confirmed nothing"
        );
        assert!(c.in_kafka.is_empty(), "nothing was produced");
    });
}
