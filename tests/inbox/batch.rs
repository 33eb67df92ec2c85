//! Batched inbox transactions (`effect.batch_max`, `effect.batch_linger`): a poison record in
//! the middle of a batch fails alone, a crash between a batch's COMMIT and its offset commit
//! applies every effect once, per-partition order holds with batches of random sizes, and a
//! stored record that fails the multi-row INSERT fails alone.

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use walbox::sandbox::broker::TopicReader;

use super::{
    assert_applied_in_order, assert_exactly_once, committed, count, effects, free_port, inbox_db,
    inbox_env, metric, produce, rec, wait_metric, Form, Rec,
};
use crate::support::{self, wait_until, Walbox, WAIT};
fn a_poison_record_in_the_middle_of_a_batch_fails_alone(form: Form) {
    let db = inbox_db("inbox_mid");
    let broker = support::broker();
    let topic = format!("t_{}", db.name);
    let dlq = format!("dlq_{}", db.name);
    broker.create_topic(&topic, 1).expect("topic");
    broker.create_topic(&dlq, 1).expect("dlq topic");
    let brokers = broker.bootstrap_servers();
    let mut records: Vec<Rec> = (0..10)
        .map(|i| rec("w", &format!("before-{i}"), "{}"))
        .collect();
    records.push(rec("w", "poison", r#"{"poison": true}"#));
    records.extend((0..10).map(|i| rec("w", &format!("after-{i}"), "{}")));
    produce(&brokers, &topic, &records);
    // The whole backlog is queued before the first batch closes.
    let batched = [
        ("WALBOX_INBOX_EFFECT_RETRIES", "1"),
        ("WALBOX_INBOX_EFFECT_BATCH_MAX", "50"),
        ("WALBOX_INBOX_EFFECT_BATCH_LINGER", "300ms"),
    ];

    // `fail`: the records before the poison commit, its offset is not committed, nothing
    // after it is applied; the failed batch was its first attempt, one retry the second.
    let group = format!("g1_{}", db.name);
    let port = free_port();
    let mut w = Walbox::spawn_subcommand(
        "inbox",
        &form.env(inbox_env(&db, &brokers, &group, &topic, port, &batched)),
    );
    let status = w.wait_exit(WAIT);
    assert_eq!(status.code(), Some(10), "{}", w.log());
    assert!(w.last_line().contains("poison"), "{}", w.last_line());
    let before: Vec<String> = (0..10).map(|i| format!("before-{i}")).collect();
    assert_eq!(
        db.sql("SELECT string_agg(message_id, ',' ORDER BY seq) FROM effects"),
        before.join(",")
    );
    assert_eq!(count(&db, "SELECT count(*) FROM inbox"), 10);
    // In the set form the whole batch's statement (21 new records) ran the poison first.
    let attempts = 2 + form.batch_attempts(21);
    assert_eq!(count(&db, "SELECT last_value FROM attempts"), attempts);
    assert_eq!(committed(&brokers, &group, &topic, 1), [Some(10)]);

    // `dead_letter`, replayed from the beginning by a new group: the ten before it are
    // absorbed, only the poison is dead-lettered, the ten after it are applied once, in order.
    let group = format!("g2_{}", db.name);
    let port = free_port();
    let mut env = batched.to_vec();
    env.extend([
        ("WALBOX_INBOX_EFFECT_ON_ERROR", "dead_letter"),
        ("WALBOX_INBOX_KAFKA_DEAD_LETTER_TOPIC", dlq.as_str()),
    ]);
    let mut w = Walbox::spawn_subcommand(
        "inbox",
        &form.env(inbox_env(&db, &brokers, &group, &topic, port, &env)),
    );
    wait_metric(port, "walbox_inbox_records_consumed_total", 21.0, &w);
    assert_eq!(metric(port, "walbox_inbox_dead_lettered_total"), Some(1.0));
    assert_eq!(metric(port, "walbox_inbox_duplicates_total"), Some(10.0));
    assert_eq!(metric(port, "walbox_inbox_effect_errors_total"), Some(2.0));
    // Twenty records committed in fewer transactions than records: they were batched.
    let sum = metric(port, "walbox_inbox_batch_records_sum");
    let transactions = metric(port, "walbox_inbox_batch_records_count").expect("histogram");
    assert_eq!(sum, Some(20.0));
    assert!(
        transactions < 20.0,
        "{transactions} transactions for 20 records"
    );
    w.terminate();
    assert!(w.wait_exit(WAIT).success(), "{}", w.log());
    let after: Vec<String> = (0..10).map(|i| format!("after-{i}")).collect();
    assert_eq!(
        db.sql("SELECT string_agg(message_id, ',' ORDER BY seq) FROM effects"),
        format!("{},{}", before.join(","), after.join(","))
    );
    assert_exactly_once(&db, 20);
    // Again with the poison and the ten after it new.
    assert_eq!(
        count(&db, "SELECT last_value FROM attempts"),
        attempts + 2 + form.batch_attempts(11)
    );
    assert_eq!(committed(&brokers, &group, &topic, 1), [Some(21)]);
    let mut reader = TopicReader::new(&brokers, &[&dlq], WAIT).expect("reader");
    assert!(reader.poll_until(WAIT, |r| !r.is_empty()), "a dead letter");
    reader
        .read_to_end(WAIT)
        .expect("read the dead-letter topic");
    assert_eq!(reader.records.len(), 1, "only the poison is dead-lettered");
    assert_eq!(reader.records[0].header_str("id"), Some("poison"));
    assert_eq!(
        reader.records[0].header_str("walbox.source_offset"),
        Some("10")
    );
}

#[cfg(feature = "failpoints")]
fn a_crash_between_a_batch_commit_and_its_offset_commit_applies_every_effect_once(form: Form) {
    use std::os::unix::process::ExitStatusExt;

    let db = inbox_db("inbox_crash");
    let broker = support::broker();
    let topic = format!("t_{}", db.name);
    broker.create_topic(&topic, 2).expect("topic");
    let brokers = broker.bootstrap_servers();
    let group = format!("g_{}", db.name);
    let total = 300;
    let records: Vec<Rec> = (0..total)
        .map(|i| rec(&format!("w{}", i % 9), &format!("evt-{i}"), "{}"))
        .collect();
    produce(&brokers, &topic, &records);

    // Four batches commit in PostgreSQL; walbox dies right after the fourth COMMIT, before
    // that batch's offsets can move.
    let port = free_port();
    let mut env = form.env(inbox_env(
        &db,
        &brokers,
        &group,
        &topic,
        port,
        &[
            ("WALBOX_INBOX_EFFECT_BATCH_MAX", "20"),
            ("WALBOX_INBOX_EFFECT_BATCH_LINGER", "200ms"),
        ],
    ));
    env.push((
        "FAILPOINTS".into(),
        "inbox::batch-committed=3*off->return".into(),
    ));
    let mut w = Walbox::spawn_subcommand("inbox", &env);
    let status = w.wait_exit(WAIT);
    assert_eq!(
        status.signal(),
        Some(6),
        "walbox inbox was to abort at inbox::batch-committed; {status:?}; log:\n{}",
        w.log()
    );
    let applied = effects(&db);
    let offsets: i64 = committed(&brokers, &group, &topic, 2)
        .iter()
        .map(|o| o.unwrap_or(0))
        .sum();
    assert!(
        applied > 4,
        "four transactions applied {applied} records: batches of one"
    );
    assert!(
        offsets < applied,
        "the last batch's offsets ({offsets} committed) must lag its {applied} effects: the crash missed the window"
    );

    let port = free_port();
    let mut w = Walbox::spawn_subcommand(
        "inbox",
        &form.env(inbox_env(&db, &brokers, &group, &topic, port, &[])),
    );
    wait_metric(
        port,
        "walbox_inbox_records_consumed_total",
        (total - offsets) as f64,
        &w,
    );
    assert_eq!(
        metric(port, "walbox_inbox_duplicates_total"),
        Some((applied - offsets) as f64),
        "every record applied before the crash and replayed is absorbed"
    );
    w.terminate();
    assert!(w.wait_exit(WAIT).success(), "{}", w.log());
    assert_exactly_once(&db, total);
}

fn order_per_partition_holds_with_batches_of_random_sizes_and_duplicates(form: Form) {
    let db = inbox_db("inbox_rand");
    let broker = support::broker();
    let topic = format!("t_{}", db.name);
    broker.create_topic(&topic, 4).expect("topic");
    let brokers = broker.bootstrap_servers();
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let batch_max = rng.random_range(2..40).to_string();
    let linger = format!("{}ms", rng.random_range(0..15));
    let port = free_port();
    let mut w = Walbox::spawn_subcommand(
        "inbox",
        &form.env(inbox_env(
            &db,
            &brokers,
            &format!("g_{}", db.name),
            &topic,
            port,
            &[
                ("WALBOX_INBOX_EFFECT_MAX_PARALLEL", "2"),
                ("WALBOX_INBOX_EFFECT_BATCH_MAX", batch_max.as_str()),
                ("WALBOX_INBOX_EFFECT_BATCH_LINGER", linger.as_str()),
            ],
        )),
    );
    // Bursts of random sizes while walbox consumes; some records are produced again (a relay
    // retry), sometimes within the same burst, so duplicates land inside batches too.
    let mut next: HashMap<String, u32> = HashMap::new();
    let mut sent: Vec<(String, String, String)> = Vec::new();
    for _ in 0..25 {
        let burst: Vec<Rec> = (0..rng.random_range(1..80))
            .map(|_| {
                if !sent.is_empty() && rng.random_bool(0.1) {
                    let (k, id, p) = &sent[rng.random_range(0..sent.len())];
                    return rec(k, id, p);
                }
                let key = format!("agg-{}", rng.random_range(0..20));
                let n = next.entry(key.clone()).or_default();
                *n += 1;
                let (id, payload) = (format!("evt-{}", sent.len()), format!("{{\"n\": {n}}}"));
                sent.push((key.clone(), id.clone(), payload.clone()));
                rec(&key, &id, &payload)
            })
            .collect();
        produce(&brokers, &topic, &burst);
    }
    let total = sent.len() as i64;
    wait_until(WAIT, "every effect", || effects(&db) == total);
    let transactions = metric(port, "walbox_inbox_batch_records_count").expect("histogram");
    let batched = metric(port, "walbox_inbox_batch_records_sum").expect("histogram");
    w.terminate();
    assert!(w.wait_exit(WAIT).success(), "{}", w.log());
    assert_exactly_once(&db, total);
    assert!(
        transactions > 4.0 && batched > transactions,
        "{batched} records in {transactions} transactions (batch_max {batch_max}, linger {linger})"
    );
    assert_applied_in_order(&db);
}

#[test]
fn a_stored_record_that_is_not_json_fails_alone_in_its_batch() {
    let db = inbox_db("inbox_stored");
    let broker = support::broker();
    let topic = format!("t_{}", db.name);
    let dlq = format!("dlq_{}", db.name);
    broker.create_topic(&topic, 1).expect("topic");
    broker.create_topic(&dlq, 1).expect("dlq topic");
    let brokers = broker.bootstrap_servers();
    let mut records: Vec<Rec> = (0..8)
        .map(|i| rec("w", &format!("e{i}"), &format!("{{\"n\": {i}}}")))
        .collect();
    records.insert(4, rec("w", "garbled", "{not json"));
    produce(&brokers, &topic, &records);
    // The stored-inbox form: no effect; the multi-row INSERT itself fails on the bad payload,
    // naming no record, so the batch is applied record by record.
    let port = free_port();
    let env: Vec<(String, String)> = inbox_env(
        &db,
        &brokers,
        &format!("g_{}", db.name),
        &topic,
        port,
        &[
            ("WALBOX_INBOX_EFFECT_RETRIES", "0"),
            ("WALBOX_INBOX_EFFECT_ON_ERROR", "dead_letter"),
            ("WALBOX_INBOX_KAFKA_DEAD_LETTER_TOPIC", &dlq),
            ("WALBOX_INBOX_EFFECT_BATCH_LINGER", "300ms"),
        ],
    )
    .into_iter()
    .filter(|(k, _)| k != "WALBOX_INBOX_EFFECT_SQL")
    .collect();
    let mut w = Walbox::spawn_subcommand("inbox", &env);
    wait_metric(port, "walbox_inbox_records_consumed_total", 9.0, &w);
    assert_eq!(metric(port, "walbox_inbox_dead_lettered_total"), Some(1.0));
    assert_eq!(metric(port, "walbox_inbox_effect_errors_total"), Some(1.0));
    w.terminate();
    assert!(w.wait_exit(WAIT).success(), "{}", w.log());
    assert_eq!(
        db.sql("SELECT string_agg(message_id || ':' || kafka_offset || ':' || (payload->>'n'), ',' ORDER BY kafka_offset) FROM inbox"),
        "e0:0:0,e1:1:1,e2:2:2,e3:3:3,e4:5:4,e5:6:5,e6:7:6,e7:8:7"
    );
    let mut reader = TopicReader::new(&brokers, &[&dlq], WAIT).expect("reader");
    assert!(reader.poll_until(WAIT, |r| !r.is_empty()), "a dead letter");
    assert_eq!(reader.records[0].header_str("id"), Some("garbled"));
}

#[test]
fn a_partition_far_behind_is_paused_and_resumed_without_losing_or_reordering_records() {
    let db = inbox_db("inbox_pause");
    let broker = support::broker();
    let topic = format!("t_{}", db.name);
    broker.create_topic(&topic, 1).expect("topic");
    let brokers = broker.bootstrap_servers();
    // More than twice the backlog bound, consumed one record per transaction: the fetcher runs
    // far ahead of the worker, so the partition is paused and resumed several times.
    let total = 2 * walbox::inbox::consumer::PAUSE_RECORDS as i64 + 500;
    let records: Vec<Rec> = (0..total)
        .map(|i| rec("w", &format!("evt-{i}"), &format!("{{\"n\": {}}}", i + 1)))
        .collect();
    produce(&brokers, &topic, &records);
    let port = free_port();
    let mut w = Walbox::spawn_subcommand(
        "inbox",
        &inbox_env(
            &db,
            &brokers,
            &format!("g_{}", db.name),
            &topic,
            port,
            &[("WALBOX_INBOX_EFFECT_BATCH_MAX", "1")],
        ),
    );
    wait_metric(
        port,
        "walbox_inbox_records_consumed_total",
        total as f64,
        &w,
    );
    let pauses = metric(port, "walbox_inbox_partition_pauses_total").expect("metric");
    w.terminate();
    assert!(w.wait_exit(WAIT).success(), "{}", w.log());
    assert!(pauses >= 1.0, "the partition was never paused: {pauses}");
    assert_exactly_once(&db, total);
    let out_of_order = db.sql(
        "SELECT count(*) FROM (SELECT kafka_offset, lag(kafka_offset) OVER (ORDER BY seq) AS prev \
         FROM effects) o WHERE prev IS NOT NULL AND kafka_offset <> prev + 1",
    );
    assert_eq!(out_of_order, "0", "records applied out of offset order");
}

both_forms!(
    a_poison_record_in_the_middle_of_a_batch_fails_alone,
    #[cfg(feature = "failpoints")]
    a_crash_between_a_batch_commit_and_its_offset_commit_applies_every_effect_once,
    order_per_partition_holds_with_batches_of_random_sizes_and_duplicates,
);
