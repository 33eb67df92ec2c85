//! Exactly-once mode and an event the producer refuses (a record over `message.max.bytes`):
//! walbox stops at that event with every transaction before it committed in Kafka and
//! confirmed, and prints the statement that skips exactly its transaction, on the first run.
//!
//! The refused event's PostgreSQL transaction can share a Kafka transaction with the ones
//! before it, which are then aborted with it. walbox does not stop there (it could print no
//! exact statement, and the next run could end the same way): it relays once more, one
//! PostgreSQL transaction per Kafka transaction, up to the refused one.

use std::collections::HashSet;

use walbox::sandbox::broker::TopicReader;

use crate::support::events::padded_rows;
use crate::support::{self, walbox_env, TestDb, Walbox, WAIT};

#[test]
fn a_refused_event_sharing_a_kafka_transaction_stops_with_everything_before_it_confirmed() {
    let db = TestDb::new("eos_toolarge");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 2);
    db.create_slot_and_publication(&slot);
    let insert = |n: usize, size: usize| padded_rows(&topic, n, size);
    // Two transactions, the second with one event over librdkafka's message.max.bytes (1 MB).
    db.sql(&insert(3, 10));
    db.sql(&insert(1, 2_000_000));
    let big_id = db.sql("SELECT max(id) FROM outbox");
    let commits = db.commits(&slot);
    assert_eq!(commits.len(), 2);

    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    env.extend(
        [
            ("WALBOX_KAFKA_EXACTLY_ONCE", "true"),
            // Both transactions go into one Kafka transaction, which the refusal aborts.
            ("WALBOX_KAFKA_TRANSACTION_INTERVAL", "30s"),
            ("WALBOX_KAFKA_TRANSACTION_MAX_EVENTS", "1000"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned())),
    );
    let mut walbox = Walbox::spawn(&env);
    let code = walbox.wait_exit(WAIT).code().unwrap_or(-1);
    let line = walbox.last_line();
    assert_eq!(code, 8, "{}", walbox.log());
    assert!(
        line.contains(&format!("event {big_id} ")),
        "the error names the event: {line}"
    );
    let statement = format!(
        "SELECT pg_replication_slot_advance('{slot}', '{}');",
        commits[1].1
    );
    assert!(
        line.contains(&statement),
        "the first run gives the statement that skips exactly the refused transaction: {line}"
    );
    assert!(
        walbox.log().contains("relaying one at a time up to it"),
        "the first session's end says why walbox relays again: {}",
        walbox.log()
    );
    let confirmed = db.confirmed(&slot);
    assert!(
        confirmed >= commits[0].1 && confirmed < commits[1].1,
        "confirmed {confirmed}: the transaction before it (end {}), not the refused one (end {})",
        commits[0].1,
        commits[1].1
    );
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    reader.read_to_end(WAIT).unwrap();
    let ids: Vec<String> = reader
        .records
        .iter()
        .filter_map(|r| r.header_str("id").map(str::to_owned))
        .collect();
    let distinct: HashSet<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(
        distinct,
        HashSet::from(["1", "2", "3"]),
        "the events before it arrived"
    );
    // The first Kafka transaction was aborted: a broker that hides aborted records from
    // `read_committed` readers (Apache Kafka; not the mock) shows each event once.
    if support::kafka::apache().is_some() {
        assert_eq!(ids.len(), 3, "each event once: {ids:?}");
    }
}
