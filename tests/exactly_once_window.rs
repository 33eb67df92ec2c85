//! Exactly-once mode's commit window: a Kafka transaction's progress record is produced right
//! behind its events, before any of their delivery reports, and the commit's own thread waits
//! for those reports before EndTxn. These tests hold the reports back (every mock broker
//! answering 300 ms late), so that the progress record is certainly produced while the events
//! are unacknowledged, then fail an event or kill walbox inside that window: nothing of the
//! transaction is confirmed, and every committed event reaches Kafka, once on a broker that
//! hides aborted transactions (on the mock cluster, which does not, the aborted transaction's
//! events may be seen twice, never missing).

#[cfg(feature = "failpoints")]
use std::collections::HashSet;
use std::time::Duration;

use walbox::sandbox::broker::TopicReader;

use crate::exactly_once::{eos_env, progress_positions, setup, transactional_id, wait_for_all};
#[cfg(feature = "failpoints")]
use crate::support;
use crate::support::events::{assert_once_but_the_aborted, stop_and_read_exactly, write_txn};
#[cfg(feature = "failpoints")]
use crate::support::events::{assert_per_aggregate_commit_order, id_counts, id_of};
use crate::support::{delay_every_broker, wait_until, Walbox, WAIT};

/// How late every mock broker answers while the window is held open.
const LATE: Duration = Duration::from_millis(300);

/// An event whose delivery fails after its transaction's progress record was
/// produced. librdkafka refuses to commit that transaction, walbox aborts it and confirms
/// nothing of it; the next session does not trust the aborted transaction's progress record,
/// which a broker without transaction markers shows (it lies beyond the last record this
/// process committed), and relays the transaction again.
#[test]
fn an_event_failing_after_its_progress_record_was_produced_aborts_and_loses_nothing() {
    use rdkafka::mocking::MockCoordinator;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr as E};
    let Some(t) = setup("eos_window_fail") else {
        return;
    };
    let Some(mock) = t.broker.mock_cluster() else {
        eprintln!("external broker: broker faults need the mock cluster; skipped");
        return;
    };
    // Broker 1 coordinates the transactions, leads the progress partition and answers at
    // once; brokers 2 and 3 lead the events' partitions and answer late. Set before walbox
    // starts, so that its producer sends every request to the right broker at once.
    mock.coordinator(
        MockCoordinator::Transaction(transactional_id(&t.db, &t.slot)),
        1,
    )
    .unwrap();
    mock.partition_leader(walbox::config::DEFAULT_PROGRESS_TOPIC, 0, Some(1))
        .unwrap();
    for p in 0..4 {
        mock.partition_leader(&t.topic, p, Some(2 + p % 2)).unwrap();
    }
    for b in [2, 3] {
        mock.broker_round_trip_time(b, LATE).unwrap();
    }
    let env = eos_env(&t.db, &t.slot, &t.broker.bootstrap_servers(), "20ms");
    let mut walbox = Walbox::spawn(&env);
    let mut reader = TopicReader::new(&t.broker.bootstrap_servers(), &[&t.topic], WAIT).unwrap();
    let first = write_txn(&t.db, &t.topic, &t.aggregates, false);
    wait_for_all(&mut reader, &t.db, &walbox);
    wait_until(WAIT, "the first transaction to be confirmed", || {
        t.db.confirmed(&t.slot) >= first.after_commit
    });
    // The first produce request from here on carries events of the next transaction (its
    // progress record is produced 20 ms later): the broker refuses it for good, and answers
    // 300 ms later, long after the progress record was written and acknowledged.
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[E::RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP],
    );
    let second = write_txn(&t.db, &t.topic, &t.aggregates, false);
    wait_until(WAIT, "the transaction to be aborted", || {
        walbox.log().contains("kafka transaction aborted")
    });
    let (_, second_end) = t.db.commits(&t.slot)[1];
    let confirmed = t.db.confirmed(&t.slot);
    assert!(
        confirmed < second_end,
        "confirmed {confirmed}: into the aborted transaction ending at {second_end}"
    );
    // The window was open: the aborted transaction's progress record reached the broker
    // (the mock shows aborted records) although one of its events failed.
    let positions = progress_positions(
        &t.broker.bootstrap_servers(),
        walbox::config::DEFAULT_PROGRESS_TOPIC,
        &t.slot,
    );
    assert!(
        positions.contains(&second_end),
        "no progress record at {second_end} was produced before the event failed: {positions:?}"
    );
    delay_every_broker(mock, Duration::ZERO);
    let all = wait_for_all(&mut reader, &t.db, &walbox);
    wait_until(WAIT, "the second transaction to be confirmed", || {
        t.db.confirmed(&t.slot) >= second.after_commit
    });
    assert!(
        walbox
            .log()
            .contains("lies beyond the last one this process committed"),
        "the aborted transaction's progress record was not set aside: {}",
        walbox.log()
    );
    stop_and_read_exactly(&mut walbox, &mut reader, &all);
    assert_once_but_the_aborted(&reader.records, &second.ids);
}

/// walbox killed on the commit's thread, its transaction's progress record produced
/// and its events not yet acknowledged (on the mock cluster, every answer 300 ms late; on
/// Apache Kafka, as fast as the broker answers). The next process aborts the transaction as
/// it fences the dead one, reads the progress record committed before it, and relays the
/// transaction again: nothing of it was confirmed, and a `read_committed` reader sees each
/// event once on Apache Kafka.
#[cfg(feature = "failpoints")]
#[test]
fn a_kill_while_a_committing_transactions_events_are_unacknowledged_confirms_nothing_of_it() {
    use std::os::unix::process::ExitStatusExt;
    let Some(t) = setup("eos_window_kill") else {
        return;
    };
    let progress = support::own_progress_topic(&t.broker, &t.slot);
    let mut env = eos_env(&t.db, &t.slot, &t.broker.bootstrap_servers(), "20ms");
    env.push(("WALBOX_KAFKA_PROGRESS_TOPIC".into(), progress));
    let first = write_txn(&t.db, &t.topic, &t.aggregates, false);
    let mock = t.broker.mock_cluster();
    if let Some(mock) = mock {
        delay_every_broker(mock, LATE);
    }
    // The session's first commit is its start record; the second holds `first`.
    let mut faulty = env.clone();
    faulty.push((
        "FAILPOINTS".into(),
        "relay::eos-committing=1*off->return".into(),
    ));
    let mut crashed = Walbox::spawn(&faulty);
    let status = crashed.wait_exit(WAIT);
    let log = crashed.log();
    assert_eq!(
        status.signal(),
        Some(6),
        "walbox was to crash: {status:?}; log:\n{log}"
    );
    assert!(
        log.contains("fault point relay::eos-committing fired"),
        "log:\n{log}"
    );
    if let Some(mock) = mock {
        delay_every_broker(mock, Duration::ZERO);
    }
    wait_until(WAIT, "PostgreSQL to release the slot", || {
        !t.db.slot_active(&t.slot)
    });
    let (_, first_end) = t.db.commits(&t.slot)[0];
    let confirmed = t.db.confirmed(&t.slot);
    assert!(
        confirmed < first_end,
        "confirmed {confirmed}: into the transaction killed while committing (it ends at {first_end})"
    );
    let mut walbox = Walbox::spawn(&env);
    let mut reader = TopicReader::new(&t.broker.bootstrap_servers(), &[&t.topic], WAIT).unwrap();
    let all = wait_for_all(&mut reader, &t.db, &walbox);
    stop_and_read_exactly(&mut walbox, &mut reader, &all);
    let first_ids: HashSet<i64> = first.ids.iter().copied().collect();
    for (id, n) in id_counts(reader.records.iter().map(id_of)) {
        assert!(
            n == 1 || (mock.is_some() && n == 2 && first_ids.contains(&id)),
            "event {id} in Kafka {n} times"
        );
    }
    assert_per_aggregate_commit_order(&reader.records);
}
