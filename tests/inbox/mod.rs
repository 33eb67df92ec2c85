//! `walbox inbox` against real PostgreSQL and a real Kafka-protocol broker: duplicates absorbed
//! (produced twice, replayed from the beginning, killed between the database commit and the
//! offset commit), effect errors rolled back with their inbox row, per-partition order, the
//! retention guard, and an end-to-end run of both halves under SIGKILL.

#[macro_use]
mod forms;
mod batch;
mod group;
mod lag;
mod outage;
mod schema_change;
mod set_effect;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use walbox::sandbox::broker::TopicReader;

use crate::support::{self, wait_until, walbox_env, TestDb, Walbox, WAIT};

use self::forms::Form;

/// The inbox migration plus an effect log without uniqueness (so a double application shows)
/// and the check of both effect forms, which can be told to fail: a payload with `poison`
/// always, one with `fail_times` that many times.
fn inbox_db(tag: &str) -> TestDb {
    let db = TestDb::new(tag);
    db.sql(include_str!("../../migrations/inbox.sql"));
    db.sql(
        "CREATE TABLE effects (
             seq bigint GENERATED ALWAYS AS IDENTITY,
             message_id text NOT NULL,
             message_key text,
             payload jsonb,
             kafka_partition int,
             kafka_offset bigint
         );
         CREATE SEQUENCE attempts;
         CREATE SEQUENCE flaky_attempts;
         CREATE FUNCTION checked_payload(mid text, p jsonb) RETURNS jsonb
         LANGUAGE plpgsql AS $$
         BEGIN
             IF p ? 'poison' THEN
                 PERFORM nextval('attempts');
                 RAISE EXCEPTION 'poison record %', mid;
             END IF;
             IF p ? 'fail_times' AND nextval('flaky_attempts') <= (p->>'fail_times')::int THEN
                 RAISE EXCEPTION 'transient effect failure for %', mid;
             END IF;
             RETURN p;
         END $$;
         CREATE FUNCTION apply_effect(mid text, k text, p jsonb, part int, off bigint) RETURNS void
         LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM checked_payload(mid, p);
             INSERT INTO effects (message_id, message_key, payload, kafka_partition, kafka_offset)
             VALUES (mid, k, p, part, off);
         END $$;",
    );
    db
}

const EFFECT: &str = "SELECT apply_effect($message_id, $key, $payload, $partition, $offset)";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// The environment of a `walbox inbox` consuming `topics` into `db`.
fn inbox_env(
    db: &TestDb,
    brokers: &str,
    group: &str,
    topics: &str,
    port: u16,
    extra: &[(&str, &str)],
) -> Vec<(String, String)> {
    let mut env: BTreeMap<String, String> = [
        ("WALBOX_INBOX_POSTGRES_URL", db.url()),
        ("WALBOX_INBOX_POSTGRES_CONSUMER", "billing".to_owned()),
        ("WALBOX_INBOX_KAFKA_BROKERS", brokers.to_owned()),
        ("WALBOX_INBOX_KAFKA_GROUP_ID", group.to_owned()),
        ("WALBOX_INBOX_KAFKA_TOPICS", topics.to_owned()),
        ("WALBOX_INBOX_KAFKA_COMMIT_INTERVAL", "100ms".to_owned()),
        (
            "WALBOX_INBOX_KAFKA_PROPERTY_SESSION_TIMEOUT_MS",
            "3000".to_owned(),
        ),
        (
            "WALBOX_INBOX_KAFKA_PROPERTY_HEARTBEAT_INTERVAL_MS",
            "300".to_owned(),
        ),
        (
            "WALBOX_INBOX_KAFKA_PROPERTY_STATISTICS_INTERVAL_MS",
            "500".to_owned(),
        ),
        ("WALBOX_INBOX_EFFECT_SQL", EFFECT.to_owned()),
        ("WALBOX_INBOX_EFFECT_BACKOFF_INITIAL", "10ms".to_owned()),
        ("WALBOX_INBOX_EFFECT_BACKOFF_MAX", "50ms".to_owned()),
        ("WALBOX_INBOX_HTTP_LISTEN", format!("127.0.0.1:{port}")),
        (
            "WALBOX_INBOX_LOG_LEVEL",
            "info,librdkafka=warn,rdkafka=warn".to_owned(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for (k, v) in extra {
        env.insert((*k).to_owned(), (*v).to_owned());
    }
    env.into_iter().collect()
}

/// A metric's value from `/metrics` (`None` while the listener is not up).
fn metric(port: u16, name: &str) -> Option<f64> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn wait_metric(port: u16, name: &str, want: f64, w: &Walbox) {
    let deadline = std::time::Instant::now() + WAIT;
    while metric(port, name) != Some(want) {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {name} = {want} (now {:?}); walbox log:\n{}",
            metric(port, name),
            w.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One record to produce.
struct Rec {
    key: String,
    id: Option<String>,
    payload: String,
    partition: Option<i32>,
}

fn rec(key: &str, id: &str, payload: &str) -> Rec {
    Rec {
        key: key.into(),
        id: Some(id.into()),
        payload: payload.into(),
        partition: None,
    }
}

fn produce(brokers: &str, topic: &str, records: &[Rec]) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("partitioner", "murmur2_random")
        .create()
        .expect("producer");
    for r in records {
        let mut headers = OwnedHeaders::new();
        if let Some(id) = &r.id {
            headers = headers.insert(Header {
                key: "id",
                value: Some(id.as_bytes()),
            });
        }
        let mut br = BaseRecord::to(topic)
            .key(r.key.as_bytes())
            .payload(r.payload.as_bytes())
            .headers(headers);
        if let Some(p) = r.partition {
            br = br.partition(p);
        }
        producer.send(br).map_err(|(e, _)| e).expect("send");
    }
    producer.flush(WAIT).expect("flush");
}

/// The group's committed offset per partition (`None`: nothing committed).
fn committed(brokers: &str, group: &str, topic: &str, partitions: i32) -> Vec<Option<i64>> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = c.committed_offsets(tpl, WAIT).expect("committed offsets");
    (0..partitions)
        .map(|p| match got.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        })
        .collect()
}

fn count(db: &TestDb, sql: &str) -> i64 {
    db.sql(sql)
        .parse()
        .unwrap_or_else(|_| panic!("a number from {sql}"))
}

fn effects(db: &TestDb) -> i64 {
    count(db, "SELECT count(*) FROM effects")
}

/// Every message id applied exactly once.
fn assert_exactly_once(db: &TestDb, expected: i64) {
    let dupes = db.sql(
        "SELECT coalesce(string_agg(message_id || ' x' || n, ', '), '') FROM (SELECT message_id, count(*) n FROM effects GROUP BY 1 HAVING count(*) > 1) d",
    );
    assert!(dupes.is_empty(), "effects applied more than once: {dupes}");
    assert_eq!(effects(db), expected, "effects applied");
    assert_eq!(
        count(db, "SELECT count(*) FROM inbox"),
        expected,
        "inbox rows"
    );
}

/// In the order the effects ran: per key `n` = 1, 2, 3, …; per partition increasing offsets.
/// Returns the partitions that were used.
fn assert_applied_in_order(db: &TestDb) -> HashSet<String> {
    let rows = db.sql(
        "SELECT message_key, payload->>'n', kafka_partition, kafka_offset FROM effects ORDER BY seq",
    );
    let mut per_key: HashMap<String, u32> = HashMap::new();
    let mut per_partition: HashMap<String, i64> = HashMap::new();
    for line in rows.lines() {
        let f: Vec<&str> = line.split('|').collect();
        let n: u32 = f[1].parse().expect("n");
        let last = per_key.insert(f[0].to_owned(), n).unwrap_or(0);
        assert_eq!(n, last + 1, "key {} applied out of order", f[0]);
        let off: i64 = f[3].parse().expect("offset");
        let prev = per_partition.insert(f[2].to_owned(), off).unwrap_or(-1);
        assert!(
            off > prev,
            "partition {} out of order: {prev} then {off}",
            f[2]
        );
    }
    per_partition.into_keys().collect()
}

fn records_produced_twice_and_replayed_from_the_beginning_apply_once(form: Form) {
    let db = inbox_db("inbox_dupes");
    let broker = support::broker();
    let topic = format!("t_{}", db.name);
    broker.create_topic(&topic, 3).expect("topic");
    let brokers = broker.bootstrap_servers();
    let records: Vec<Rec> = (0..60)
        .map(|i| {
            rec(
                &format!("w{}", i % 7),
                &format!("evt-{i}"),
                &format!("{{\"n\": {i}}}"),
            )
        })
        .collect();
    produce(&brokers, &topic, &records);
    produce(&brokers, &topic, &records); // the relay retried: every event twice

    let port = free_port();
    let mut w = Walbox::spawn_subcommand(
        "inbox",
        &form.env(inbox_env(
            &db,
            &brokers,
            &format!("g1_{}", db.name),
            &topic,
            port,
            &[],
        )),
    );
    wait_metric(port, "walbox_inbox_records_consumed_total", 120.0, &w);
    assert_eq!(metric(port, "walbox_inbox_duplicates_total"), Some(60.0));
    assert_eq!(
        metric(port, "walbox_inbox_effects_applied_total"),
        Some(60.0)
    );
    w.terminate();
    assert!(w.wait_exit(WAIT).success(), "{}", w.log());
    assert_exactly_once(&db, 60);

    // A replay from the beginning (a new group starting at the earliest offset, as a reset
    // does): all 120 records again, every one absorbed.
    let port = free_port();
    let mut w = Walbox::spawn_subcommand(
        "inbox",
        &form.env(inbox_env(
            &db,
            &brokers,
            &format!("g2_{}", db.name),
            &topic,
            port,
            &[],
        )),
    );
    wait_metric(port, "walbox_inbox_records_consumed_total", 120.0, &w);
    assert_eq!(metric(port, "walbox_inbox_duplicates_total"), Some(120.0));
    assert_eq!(
        metric(port, "walbox_inbox_effects_applied_total"),
        Some(0.0)
    );
    w.terminate();
    assert!(w.wait_exit(WAIT).success(), "{}", w.log());
    assert_exactly_once(&db, 60);
}

fn killed_between_the_database_commit_and_the_offset_commit(form: Form) {
    let db = inbox_db("inbox_kill");
    let broker = support::broker();
    let topic = format!("t_{}", db.name);
    broker.create_topic(&topic, 2).expect("topic");
    let brokers = broker.bootstrap_servers();
    let group = format!("g_{}", db.name);
    let records: Vec<Rec> = (0..40)
        .map(|i| rec(&format!("w{}", i % 5), &format!("evt-{i}"), "{}"))
        .collect();
    produce(&brokers, &topic, &records);

    // Offsets are committed only every hour: every transaction commits, no offset does.
    let port = free_port();
    let mut w = Walbox::spawn_subcommand(
        "inbox",
        &form.env(inbox_env(
            &db,
            &brokers,
            &group,
            &topic,
            port,
            &[("WALBOX_INBOX_KAFKA_COMMIT_INTERVAL", "1h")],
        )),
    );
    wait_until(WAIT, "all 40 effects", || effects(&db) == 40);
    w.kill();
    assert_eq!(
        committed(&brokers, &group, &topic, 2),
        [None, None],
        "no offset was committed before the kill"
    );

    let port = free_port();
    let mut w = Walbox::spawn_subcommand(
        "inbox",
        &form.env(inbox_env(&db, &brokers, &group, &topic, port, &[])),
    );
    wait_metric(port, "walbox_inbox_records_consumed_total", 40.0, &w);
    assert_eq!(metric(port, "walbox_inbox_duplicates_total"), Some(40.0));
    w.terminate();
    assert!(w.wait_exit(WAIT).success(), "{}", w.log());
    assert_exactly_once(&db, 40);
    let offsets = committed(&brokers, &group, &topic, 2);
    assert_eq!(
        offsets.iter().map(|o| o.unwrap_or(0)).sum::<i64>(),
        40,
        "every offset committed after a clean shutdown: {offsets:?}"
    );
}

fn an_effect_error_rolls_back_the_inbox_row_then_fails_or_dead_letters(form: Form) {
    let db = inbox_db("inbox_err");
    let broker = support::broker();
    let topic = format!("t_{}", db.name);
    let dlq = format!("dlq_{}", db.name);
    broker.create_topic(&topic, 1).expect("topic");
    broker.create_topic(&dlq, 1).expect("dlq topic");
    let brokers = broker.bootstrap_servers();
    let group = format!("g_{}", db.name);
    let no_id = Rec {
        id: None,
        ..rec("w", "", "{}")
    };
    produce(
        &brokers,
        &topic,
        &[
            rec("w", "ok-1", "{}"),
            rec("w", "poison", r#"{"poison": true}"#),
            rec("w", "flaky", r#"{"fail_times": 2}"#),
            no_id,
            rec("w", "ok-2", "{}"),
        ],
    );

    // `fail`: three attempts (retries = 2), then exit 10; the poison leaves no inbox row, and
    // its offset is not committed.
    let port = free_port();
    let mut w = Walbox::spawn_subcommand(
        "inbox",
        &form.env(inbox_env(
            &db,
            &brokers,
            &group,
            &topic,
            port,
            &[
                ("WALBOX_INBOX_EFFECT_RETRIES", "2"),
                // The backlog of three records before the id-less one in one batch.
                ("WALBOX_INBOX_EFFECT_BATCH_LINGER", "300ms"),
            ],
        )),
    );
    let status = w.wait_exit(WAIT);
    assert_eq!(status.code(), Some(10), "{}", w.log());
    assert!(w.last_line().contains("poison"), "{}", w.last_line());
    assert_eq!(
        db.sql("SELECT string_agg(message_id, ',') FROM effects"),
        "ok-1"
    );
    assert_eq!(
        db.sql("SELECT string_agg(message_id, ',') FROM inbox"),
        "ok-1"
    );
    // The set form's statement of the whole batch (ok-1, poison, flaky) ran the poison too.
    assert_eq!(
        count(&db, "SELECT last_value FROM attempts"),
        3 + form.batch_attempts(3)
    );
    assert_eq!(committed(&brokers, &group, &topic, 1), [Some(1)]);

    // `dead_letter`: the poison and the id-less record go to the dead-letter topic, the flaky
    // one succeeds on its third attempt, once.
    let port = free_port();
    let mut w = Walbox::spawn_subcommand(
        "inbox",
        &form.env(inbox_env(
            &db,
            &brokers,
            &group,
            &topic,
            port,
            &[
                ("WALBOX_INBOX_EFFECT_RETRIES", "2"),
                ("WALBOX_INBOX_EFFECT_ON_ERROR", "dead_letter"),
                ("WALBOX_INBOX_EFFECT_ON_INVALID", "dead_letter"),
                ("WALBOX_INBOX_KAFKA_DEAD_LETTER_TOPIC", &dlq),
            ],
        )),
    );
    wait_metric(port, "walbox_inbox_records_consumed_total", 4.0, &w);
    assert_eq!(metric(port, "walbox_inbox_dead_lettered_total"), Some(2.0));
    // poison: 3 attempts; flaky: 2 failures before it succeeds.
    assert_eq!(metric(port, "walbox_inbox_effect_errors_total"), Some(5.0));
    w.terminate();
    assert!(w.wait_exit(WAIT).success(), "{}", w.log());
    assert_eq!(
        db.sql("SELECT string_agg(message_id, ',' ORDER BY seq) FROM effects"),
        "ok-1,flaky,ok-2"
    );
    assert_eq!(
        db.sql("SELECT string_agg(message_id, ',' ORDER BY message_id) FROM inbox"),
        "flaky,ok-1,ok-2"
    );
    let mut reader = TopicReader::new(&brokers, &[&dlq], WAIT).expect("reader");
    assert!(
        reader.poll_until(WAIT, |r| r.len() >= 2),
        "two dead letters"
    );
    let first = &reader.records[0];
    assert_eq!(first.header_str("id"), Some("poison"));
    assert_eq!(first.header_str("walbox.source_offset"), Some("1"));
    assert!(first
        .header_str("walbox.error")
        .is_some_and(|e| e.contains("poison record")));
    assert!(reader.records[1]
        .header_str("walbox.error")
        .is_some_and(|e| e.contains("no \"id\" header")));
    assert_eq!(committed(&brokers, &group, &topic, 1), [Some(5)]);
}

fn order_per_partition_is_preserved_with_partitions_in_parallel(form: Form) {
    let db = inbox_db("inbox_order");
    let broker = support::broker();
    let topic = format!("t_{}", db.name);
    broker.create_topic(&topic, 4).expect("topic");
    let brokers = broker.bootstrap_servers();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut next: HashMap<String, u32> = HashMap::new();
    let records: Vec<Rec> = (0..800)
        .map(|i| {
            let key = format!("agg-{}", rng.random_range(0..20));
            let n = next.entry(key.clone()).or_default();
            *n += 1;
            rec(&key, &format!("evt-{i}"), &format!("{{\"n\": {n}}}"))
        })
        .collect();
    produce(&brokers, &topic, &records);
    let port = free_port();
    let mut w = Walbox::spawn_subcommand(
        "inbox",
        &form.env(inbox_env(
            &db,
            &brokers,
            &format!("g_{}", db.name),
            &topic,
            port,
            &[("WALBOX_INBOX_EFFECT_MAX_PARALLEL", "4")],
        )),
    );
    wait_until(WAIT, "all 800 effects", || effects(&db) == 800);
    w.terminate();
    assert!(w.wait_exit(WAIT).success(), "{}", w.log());
    assert_exactly_once(&db, 800);
    let partitions_used = assert_applied_in_order(&db);
    assert!(partitions_used.len() > 1, "records spread over partitions");
}

#[test]
fn the_retention_guard_refuses_a_window_it_cannot_show_is_covered() {
    let db = inbox_db("inbox_guard");
    let broker = support::broker();
    let topic = format!("t_{}", db.name);
    broker.create_topic(&topic, 1).expect("topic");
    let brokers = broker.bootstrap_servers();
    let port = free_port();
    let mut w = Walbox::spawn_subcommand(
        "inbox",
        &inbox_env(
            &db,
            &brokers,
            &format!("g_{}", db.name),
            &topic,
            port,
            &[("WALBOX_INBOX_RETENTION_KEEP", "1d")],
        ),
    );
    let status = w.wait_exit(WAIT);
    assert_eq!(status.code(), Some(11), "{}", w.log());
    let line = w.last_line();
    if broker.mock_cluster().is_some() {
        // librdkafka's mock cluster does not implement DescribeConfigs: the guard cannot show
        // the inbox is safe, so it refuses (the too-short comparison itself is unit-tested in
        // inbox::retention).
        assert!(line.contains("cannot show"), "{line}");
    } else {
        // A real broker's default topic: retention.ms 7d + segment.ms 7d > 1d.
        assert!(line.contains("replay"), "{line}");
    }
    // `warn` starts anyway.
    produce(&brokers, &topic, &[rec("w", "e1", "{}")]);
    let port = free_port();
    let mut w = Walbox::spawn_subcommand(
        "inbox",
        &inbox_env(
            &db,
            &brokers,
            &format!("g_{}", db.name),
            &topic,
            port,
            &[
                ("WALBOX_INBOX_RETENTION_KEEP", "1d"),
                ("WALBOX_INBOX_RETENTION_GUARD", "warn"),
            ],
        ),
    );
    wait_until(WAIT, "the effect", || effects(&db) == 1);
    w.terminate();
    assert!(w.wait_exit(WAIT).success(), "{}", w.log());
}

fn both_halves_under_sigkill_apply_every_event_exactly_once(form: Form) {
    let producer_db = TestDb::new("e2e_outbox");
    let consumer_db = inbox_db("e2e_inbox");
    let broker = support::broker();
    let brokers = broker.bootstrap_servers();
    let topic = format!("t_{}", producer_db.name);
    broker.create_topic(&topic, 3).expect("topic");
    let slot = producer_db.name.clone();
    producer_db.create_slot_and_publication(&slot);
    let group = format!("g_{}", consumer_db.name);
    let relay_env = walbox_env(&producer_db, &slot, &brokers);
    let inbox = |port| {
        form.env(inbox_env(
            &consumer_db,
            &brokers,
            &group,
            &topic,
            port,
            &[(
                "WALBOX_INBOX_EFFECT_SQL",
                "SELECT apply_effect($message_id, $key, $payload, $partition, $offset)",
            )],
        ))
    };

    let batches = 30;
    let per_batch = 40;
    let total = (batches * per_batch) as i64;
    let write = |b: usize| {
        let mut sql =
            String::from("INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES ");
        for i in 0..per_batch {
            if i > 0 {
                sql.push(',');
            }
            sql.push_str(&format!(
                "('agg-{}', '{topic}', 'paid', jsonb_build_object('b', {b}, 'i', {i}))",
                (b * per_batch + i) % 17
            ));
        }
        producer_db.sql(&sql);
    };

    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut relay = Walbox::spawn(&relay_env);
    let mut consumer = Walbox::spawn_subcommand("inbox", &inbox(free_port()));
    let mut written = 0;
    for round in 0..5 {
        for _ in 0..batches / 5 {
            write(written);
            written += 1;
        }
        // Kill at a random point of progress: after some (not all) of this round's effects.
        let target = (effects(&consumer_db)
            + rng.random_range(1..(per_batch * batches / 5) as i64))
        .min((written * per_batch) as i64);
        wait_until(WAIT, "effects to progress before the kill", || {
            effects(&consumer_db) >= target
        });
        match round % 3 {
            0 => relay.kill(),
            1 => consumer.kill(),
            _ => {
                relay.kill();
                consumer.kill();
            }
        }
        if !relay.running() {
            relay = Walbox::spawn(&relay_env);
        }
        if !consumer.running() {
            consumer = Walbox::spawn_subcommand("inbox", &inbox(free_port()));
        }
    }
    wait_until(WAIT, "every event's effect", || {
        effects(&consumer_db) >= total
    });
    // Give any duplicate a chance to show: the relay confirms, the inbox drains to the end.
    relay.terminate();
    assert!(relay.wait_exit(WAIT).success(), "{}", relay.log());
    consumer.terminate();
    assert!(consumer.wait_exit(WAIT).success(), "{}", consumer.log());
    assert_eq!(count(&producer_db, "SELECT count(*) FROM outbox"), total);
    assert_exactly_once(&consumer_db, total);
    let ids = consumer_db
        .sql("SELECT min(message_id::bigint) || '-' || max(message_id::bigint) FROM effects");
    assert_eq!(ids, format!("1-{total}"));
}

both_forms!(
    records_produced_twice_and_replayed_from_the_beginning_apply_once,
    killed_between_the_database_commit_and_the_offset_commit,
    an_effect_error_rolls_back_the_inbox_row_then_fails_or_dead_letters,
    order_per_partition_is_preserved_with_partitions_in_parallel,
    both_halves_under_sigkill_apply_every_event_exactly_once,
);
