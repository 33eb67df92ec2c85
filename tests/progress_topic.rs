//! The progress topic grown large: start-up reads it from its end, so a topic of millions of
//! records costs what lies between its end and the slot's newest record. Apache Kafka only
//! (the real-Kafka lane): transaction markers and the last stable offset are the broker's.

use std::collections::HashSet;
use std::time::Duration;

use walbox::sandbox::broker::TopicReader;

use crate::exactly_once::eos_env;
use crate::support::events::{await_distinct, stop_and_read_exactly, write_txns};
use crate::support::{self, TestDb, Walbox, WAIT};

/// Issue 42, item 4: every Kafka transaction adds a record and a commit marker to the one
/// progress partition, and a topic with the broker's segment defaults is compacted only once
/// a 1 GiB or 7-day segment rolls. Start-up read that whole uncompacted tail from the
/// beginning within 30 s, and a timeout started it over: a grown topic stalled walbox for
/// good. A progress topic holding 2,000,000 committed records (this slot's and nine others',
/// in transactions of 100,000) must not make start-up read it: walbox reads it from its end
/// (the records it read are counted in its log: a few thousand, however large the topic),
/// takes the newest record of its own key (which says the first rows are in Kafka already)
/// and relays the rows after it. The time the read took is printed, never asserted.
#[test]
fn a_progress_topic_grown_to_millions_of_records_is_read_from_its_end() {
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use walbox::sandbox::broker::Broker;
    use walbox::sandbox::kafka::{KafkaServer, KafkaServerOptions};
    if support::kafka::apache().is_none() {
        eprintln!("needs Apache Kafka (WALBOX_TEST_KAFKA=apache): transaction markers and the last stable offset; skipped");
        return;
    }
    // A broker of its own: the test writes about 700 MB.
    let server = KafkaServer::start(KafkaServerOptions {
        watchdog: true,
        ..Default::default()
    })
    .expect("start a broker");
    let brokers = server.bootstrap_servers();
    let broker = Broker::External(brokers.clone());
    let db = TestDb::new("eos_grown");
    let slot = db.name.clone();
    let topic = format!("t_{slot}");
    broker.create_topic(&topic, 2).unwrap();
    // As an earlier walbox created it: compacted, with the broker's segment defaults.
    let progress = format!("progress.{slot}");
    broker
        .create_topic_with(&progress, 1, &[("cleanup.policy", "compact")])
        .unwrap();
    db.create_slot_and_publication(&slot);
    let aggregates: Vec<String> = (0..10).map(|i| format!("agg-{i}")).collect();
    let relayed_before = write_txns(&db, &topic, &aggregates, 3);
    let at = db.sql("SELECT pg_current_wal_lsn()");
    let floor = db.sql(&format!(
        "SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = '{slot}'"
    ));
    let system = db.sql("SELECT system_identifier FROM pg_control_system()");
    let own = format!("{system}/{}/{slot}", db.name);
    let record = |key: &str, lsn: &str| {
        serde_json::json!({
            "slot": key.rsplit('/').next(), "database": db.name, "system_identifier": system,
            "confirmed_lsn": lsn, "confirmed_commit_time_us": null,
            "written_at": "2026-01-01T00:00:00Z", "timeline": 1, "slot_floor": floor,
        })
        .to_string()
    };
    let others: Vec<String> = (0..9)
        .map(|i| format!("{system}/{}/other{i}", db.name))
        .collect();

    let filling = std::time::Instant::now();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("transactional.id", format!("filler-{slot}"))
        .set("linger.ms", "50")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "200000")
        .set("queue.buffering.max.kbytes", "1048576")
        .create()
        .expect("producer");
    let call = Duration::from_secs(120);
    producer.init_transactions(call).expect("init_transactions");
    const RECORDS: usize = 2_000_000;
    const PER_TXN: usize = 100_000;
    let (old, newest) = (record(&own, "0/0"), record(&own, &at));
    let other_values: Vec<String> = others.iter().map(|k| record(k, &at)).collect();
    for txn in 0..RECORDS / PER_TXN {
        producer.begin_transaction().expect("begin");
        for i in 0..PER_TXN {
            let n = txn * PER_TXN + i;
            // Every tenth record is this slot's: old ones, then the newest, 1,001 records from
            // the end; the others' follow it.
            let (key, value) = match n {
                _ if n == RECORDS - 1_010 => (own.as_str(), newest.as_str()),
                _ if n.is_multiple_of(10) && n < RECORDS - 1_010 => (own.as_str(), old.as_str()),
                _ => (others[n % 9].as_str(), other_values[n % 9].as_str()),
            };
            let mut record = BaseRecord::to(&progress).key(key).payload(value);
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((
                        rdkafka::error::KafkaError::MessageProduction(
                            rdkafka::types::RDKafkaErrorCode::QueueFull,
                        ),
                        r,
                    )) => {
                        record = r;
                        producer.poll(Duration::from_millis(10));
                    }
                    Err((e, _)) => panic!("produce: {e}"),
                }
            }
        }
        producer.commit_transaction(call).expect("commit");
    }
    eprintln!(
        "filled the progress topic with {RECORDS} records in {:.1} s",
        filling.elapsed().as_secs_f64()
    );
    let relayed_after = write_txns(&db, &topic, &aggregates, 3);

    let env = {
        let mut env = eos_env(&db, &slot, &brokers, "10ms");
        env.push(("WALBOX_KAFKA_PROGRESS_TOPIC".into(), progress.clone()));
        env
    };
    let started = std::time::Instant::now();
    let mut walbox = Walbox::spawn(&env);
    let mut reader = TopicReader::new(&brokers, &[&topic], WAIT).unwrap();
    // The newest record of this slot says the first rows are in Kafka: only the later ones
    // come (an older record, 0/0, would send the first ones too).
    let after: HashSet<i64> = relayed_after.into_iter().collect();
    await_distinct(&mut reader, after.len(), &walbox);
    let ready = walbox
        .log()
        .lines()
        .find(|l| l.contains("kafka transactions ready"))
        .map(str::to_owned)
        .unwrap_or_default();
    eprintln!(
        "start-up to the last row relayed: {:.2} s; {ready}",
        started.elapsed().as_secs_f64()
    );
    stop_and_read_exactly(&mut walbox, &mut reader, &after);
    assert!(relayed_before.iter().all(|id| !after.contains(id)));
    let log = walbox.log();
    let line = log
        .lines()
        .find(|l| l.contains("read the progress topic from its end"))
        .unwrap_or_else(|| panic!("no line for the progress read in:\n{log}"));
    let records_read: usize = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("records_read=")?.parse().ok())
        .unwrap_or_else(|| panic!("no records_read in: {line}"));
    eprintln!("{line}");
    assert!(
        records_read < RECORDS / 100,
        "start-up read {records_read} of the {RECORDS} records: {line}"
    );
}
