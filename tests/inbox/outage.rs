//! The inbox through a broker outage: one broker of the mock cluster down (its partitions
//! leaderless, and the group coordinator with them when it lives there) while records keep
//! arriving, then up again. The inbox must resume by itself and apply every record once, in
//! per-key order; a consumer that stays stalled after the broker came back fails here.

use std::time::{Duration, Instant};

use super::{
    assert_applied_in_order, assert_exactly_once, effects, free_port, inbox_db, inbox_env, produce,
    rec, wait_metric, Form, Rec,
};
use crate::support::{self, TestDb, Walbox, WAIT};
use walbox::sandbox::broker::Broker;

/// `n` records numbered from `from`, on 12 keys, each key's payload counting 1, 2, 3, ….
fn records(from: usize, n: usize) -> Vec<Rec> {
    (from..from + n)
        .map(|i| {
            rec(
                &format!("k{}", i % 12),
                &format!("evt-{i}"),
                &format!("{{\"n\": {}}}", i / 12 + 1),
            )
        })
        .collect()
}

/// An inbox with the `form` effect on a mock cluster of its own (database, broker, topic of 6 partitions, bootstrap
/// servers, the inbox), once it processed the `first` records produced before it started;
/// `None` (saying why) on an external broker.
fn consuming(
    form: Form,
    tag: &str,
    first: usize,
) -> Option<(TestDb, Broker, String, String, Walbox)> {
    let db = inbox_db(tag);
    let broker = support::broker();
    if broker.mock_cluster().is_none() {
        eprintln!("external broker: a broker outage needs the mock cluster; skipped");
        return None;
    }
    let topic = format!("t_{}", db.name);
    broker.create_topic(&topic, 6).expect("topic");
    let brokers = broker.bootstrap_servers();
    produce(&brokers, &topic, &records(0, first));
    let port = free_port();
    let w = Walbox::spawn_subcommand(
        "inbox",
        &form.env(inbox_env(
            &db,
            &brokers,
            &format!("g_{}", db.name),
            &topic,
            port,
            &[],
        )),
    );
    wait_metric(
        port,
        "walbox_inbox_records_consumed_total",
        first as f64,
        &w,
    );
    Some((db, broker, topic, brokers, w))
}

fn a_broker_outage_while_records_arrive_stalls_nothing_after_it(form: Form) {
    let Some((db, broker, topic, brokers, mut w)) = consuming(form, "inbox_outage", 600) else {
        return;
    };
    // The outage: longer than the session timeout (3 s), so the group's membership lapses.
    broker
        .set_broker_up(1, false)
        .expect("a mock cluster")
        .expect("broker 1 down");
    let producer = {
        let brokers = brokers.clone();
        let topic = topic.clone();
        // Produced while the broker is down: the records of its partitions wait in the
        // producer until it is back.
        std::thread::spawn(move || produce(&brokers, &topic, &records(600, 600)))
    };
    std::thread::sleep(Duration::from_secs(5));
    broker
        .set_broker_up(1, true)
        .expect("a mock cluster")
        .expect("broker 1 up");
    producer.join().expect("producer");
    let back = Instant::now();
    let deadline = back + WAIT * 2;
    while effects(&db) < 1200 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        effects(&db),
        1200,
        "records applied {:.0} s after the broker came back; inbox log:\n{}",
        back.elapsed().as_secs_f64(),
        w.log()
    );
    eprintln!(
        "the inbox applied every record {:.1} s after the broker came back",
        back.elapsed().as_secs_f64()
    );
    assert!(w.running(), "the inbox exited:\n{}", w.log());
    w.terminate();
    assert!(w.wait_exit(WAIT).success(), "{}", w.log());
    assert_exactly_once(&db, 1200);
    assert_applied_in_order(&db);
}

/// Issue: the inbox logged every repeat of a broker-down error (librdkafka reports one per
/// connection attempt and per poll: about 190 lines per member for a 3 s outage). Each error
/// is logged when it first comes, and its repeats are summarised.
#[test]
fn a_broker_outage_is_logged_once_per_error_not_once_per_retry() {
    let Some((db, broker, topic, brokers, mut w)) =
        consuming(Form::PerRecord, "inbox_outage_log", 120)
    else {
        return;
    };
    for b in 1..=support::MOCK_BROKERS {
        broker
            .set_broker_up(b, false)
            .expect("a mock cluster")
            .expect("broker down");
    }
    // Fault injection: every broker away for at least 3 s, and until the inbox has tried to
    // reach one (a loaded machine may not try again within 3 s of the disconnect, and an
    // outage nobody ran into is not logged).
    std::thread::sleep(Duration::from_secs(3));
    support::wait_until_or(
        WAIT,
        "the outage to be logged",
        || {
            let log = w.log();
            log.contains("kafka client error") || log.contains("kafka consumer error")
        },
        || format!("inbox log:\n{}", w.log()),
    );
    for b in 1..=support::MOCK_BROKERS {
        broker
            .set_broker_up(b, true)
            .expect("a mock cluster")
            .expect("broker up");
    }
    produce(&brokers, &topic, &records(120, 120));
    support::wait_until(WAIT, "every record applied after the outage", || {
        effects(&db) >= 240
    });
    let log = w.log();
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("kafka client error") || l.contains("kafka consumer error"))
        .collect();
    assert!(!errors.is_empty(), "the outage was not logged:\n{log}");
    assert!(
        errors.len() <= 6,
        "{} error lines for a 3 s outage:\n{}",
        errors.len(),
        errors.join("\n")
    );
    w.terminate();
    assert!(w.wait_exit(WAIT).success(), "{}", w.log());
}

both_forms!(a_broker_outage_while_records_arrive_stalls_nothing_after_it);
