//! Outbox routing and formats: several tables, topic templates, envelopes, CloudEvents,
//! partitioned tables, the table-less outbox, dead letters, non-insert changes, schema changes.
//! Each test asserts the bytes a consumer reads.

use std::io::Write;

use prost_reflect::{DescriptorPool, DynamicMessage, Value};
use walbox::sandbox::broker::{ConsumedRecord, TopicReader};

use crate::support::{self, wait_until, walbox_env, TestDb, Walbox, WAIT};

/// Starts walbox on `db` with `toml` as its configuration file (outbox routes and Kafka
/// options); connection settings come from the environment.
fn walbox_with(db: &TestDb, brokers: &str, toml: &str) -> (Walbox, tempfile::NamedTempFile) {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(toml.as_bytes()).unwrap();
    let mut env = walbox_env(db, &db.name, brokers);
    env.push(("WALBOX_CONFIG".into(), file.path().display().to_string()));
    env.push((
        "WALBOX_LOG".into(),
        "info,walbox=debug,tokio_postgres=info".into(),
    ));
    (Walbox::spawn(&env), file)
}

/// Reads `n` records from `topics`; on failure, says what walbox `w` logged.
fn read_logged(w: &Walbox, brokers: &str, topics: &[&str], n: usize) -> Vec<ConsumedRecord> {
    let mut r = TopicReader::new(brokers, topics, WAIT).unwrap();
    assert!(
        r.poll_until(WAIT, |recs| recs.len() >= n),
        "read {} of {n} records from {topics:?}; walbox log:\n{}",
        r.records.len(),
        w.log()
    );
    r.records
}

fn headers(r: &ConsumedRecord) -> Vec<(&str, String)> {
    r.headers
        .iter()
        .map(|(k, v)| (k.as_str(), String::from_utf8_lossy(v).into_owned()))
        .collect()
}

fn text(b: &Option<Vec<u8>>) -> String {
    String::from_utf8_lossy(b.as_deref().unwrap_or_default()).into_owned()
}

#[test]
fn several_tables_each_with_its_mapping_and_both_seed_schemas() {
    let db = TestDb::new("tables");
    db.sql(
        "CREATE TABLE outbox_events (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL,
           aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb NOT NULL, tenant_id text,
           created_at timestamptz NOT NULL DEFAULT now())",
    );
    let broker = support::broker();
    let bs = broker.bootstrap_servers();
    // Topics of this test only: a real broker is shared by every test.
    let (payments, shop) = (format!("payments_{}", db.name), format!("shop_{}", db.name));
    let shop_order = format!("{shop}.order");
    for t in [&payments, &shop_order] {
        broker.create_topic(t, 2).unwrap();
    }
    let (w, _f) = walbox_with(
        &db,
        &bs,
        &format!(
            r#"
[[outbox.tables]]
table = "outbox"
[[outbox.tables]]
table = "public.outbox_events"
topic = "{shop}.${{aggregate_type}}"
cloudevents = true
cloudevents_source = "/shop"
[outbox.tables.headers]
tenant_id = "tenant"
[outbox.tables.columns]
timestamp = "created_at"
"#
        ),
    );
    wait_until(WAIT, "walbox to stream", || db.streaming(&db.name));
    let out = db.sql(&format!(
        "BEGIN;
         INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES ('w-1', '{payments}', 'payment.captured', '{{\"amount\": 10}}');
         INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, payload, tenant_id, created_at)
           VALUES ('5f0c6b1e-8d7a-4a53-9c1e-3f2b1a0d9e8c', 'order', 'o-1', 'order.placed', '{{\"items\": [1, 2]}}', 'acme', '2026-11-30 01:02:03.5+00');
         COMMIT;
         SELECT id FROM outbox;"
    ));
    let outbox_id = out.lines().last().unwrap().to_owned();
    let recs = read_logged(&w, &bs, &[&payments, &shop_order], 2);
    let p = recs.iter().find(|r| r.topic == payments).unwrap();
    let o = recs.iter().find(|r| r.topic == shop_order).unwrap();
    let lsn = p.header_str("walbox.commit_lsn").unwrap().to_owned();
    assert_eq!(text(&p.key), "w-1");
    assert_eq!(text(&p.payload), "{\"amount\": 10}");
    assert_eq!(
        headers(p),
        vec![
            ("id", outbox_id),
            ("event_type", "payment.captured".into()),
            ("walbox.commit_lsn", lsn.clone()),
            ("walbox.index", "0".into()),
            ("walbox.source", "public.outbox".into()),
        ]
    );
    assert_eq!(text(&o.key), "o-1");
    assert_eq!(text(&o.payload), "{\"items\": [1, 2]}");
    assert_eq!(
        headers(o),
        vec![
            ("id", "5f0c6b1e-8d7a-4a53-9c1e-3f2b1a0d9e8c".to_owned()),
            ("event_type", "order.placed".into()),
            ("walbox.commit_lsn", lsn),
            ("walbox.index", "1".into()),
            ("walbox.source", "public.outbox_events".into()),
            ("ce_specversion", "1.0".into()),
            ("ce_id", "5f0c6b1e-8d7a-4a53-9c1e-3f2b1a0d9e8c".into()),
            ("ce_source", "/shop".into()),
            ("ce_type", "order.placed".into()),
            ("ce_time", "2026-11-30T01:02:03.500Z".into()),
            ("ce_subject", "o-1".into()),
            ("content-type", "application/json".into()),
            ("tenant", "acme".into()),
        ]
    );
}

#[test]
fn topic_templates_fallbacks_and_explicit_partitions() {
    let db = TestDb::new("routes");
    db.sql(
        "CREATE TABLE events (id bigint GENERATED ALWAYS AS IDENTITY, aggregate_type text, aggregate_id text NOT NULL,
           event_type text, payload text NOT NULL, part int)",
    );
    let broker = support::broker();
    let bs = broker.bootstrap_servers();
    let (routed_topic, fallback_topic) = (
        format!("r.{}.user", db.name),
        format!("r.{}.unrouted", db.name),
    );
    broker.create_topic(&routed_topic, 4).unwrap();
    broker.create_topic(&fallback_topic, 4).unwrap();
    let (w, _f) = walbox_with(
        &db,
        &bs,
        &format!(
            r#"
[outbox]
table = "events"
topic = "r.{db}.${{aggregate_type}}"
fallback_topic = "r.{db}.unrouted"
[outbox.columns]
partition = "part"
"#,
            db = db.name
        ),
    );
    wait_until(WAIT, "walbox to stream", || db.streaming(&db.name));
    db.sql(
        "INSERT INTO events (aggregate_type, aggregate_id, event_type, payload, part)
         VALUES ('user', 'u-1', 'created', 'a', 2), (NULL, 'u-2', 'created', 'b', 3)",
    );
    let recs = read_logged(&w, &bs, &[&routed_topic, &fallback_topic], 2);
    let routed = recs.iter().find(|r| r.topic == routed_topic).unwrap();
    assert_eq!((routed.partition, text(&routed.payload).as_str()), (2, "a"));
    let fallback = recs.iter().find(|r| r.topic == fallback_topic).unwrap();
    assert_eq!(
        (fallback.partition, text(&fallback.payload).as_str()),
        (3, "b")
    );
}

/// Needs a broker that implements CreateTopics (the mock cluster does not): the real-Kafka
/// lane (`scripts/real-kafka.sh`) or `WALBOX_TEST_KAFKA_BROKERS`.
#[test]
fn missing_topics_are_created_when_asked() {
    let broker = crate::support::broker();
    if broker.mock_cluster().is_some() {
        eprintln!("mock cluster: it does not implement CreateTopics; skipped");
        return;
    }
    let bs = broker.bootstrap_servers();
    let db = TestDb::new("create");
    let topic = format!("created.{}", db.name);
    let (w, _f) = walbox_with(
        &db,
        &bs,
        &format!(
            "[outbox]\ntopic = \"{topic}\"\n[kafka]\ncreate_topics = true\ntopic_partitions = 3\n"
        ),
    );
    wait_until(WAIT, "walbox to stream", || db.streaming(&db.name));
    db.sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES ('a', '{topic}', 'x', '{{}}')"
    ));
    let recs = read_logged(&w, &bs, &[&topic], 1);
    assert_eq!(text(&recs[0].key), "a");
}

/// Issue 42, item 12: Kafka refuses to create a topic whose name differs from an existing one
/// only in '.' and '_' (`col.x` next to `col_x`: their metric names would collide), and the
/// message said only "Broker: Invalid topic". It now keeps the reason: which topic it collides
/// with. Needs CreateTopics (the real-Kafka lane).
#[test]
fn a_topic_name_colliding_with_an_existing_one_says_with_which() {
    let broker = crate::support::broker();
    if broker.mock_cluster().is_some() {
        eprintln!("mock cluster: it does not implement CreateTopics; skipped");
        return;
    }
    let bs = broker.bootstrap_servers();
    let db = TestDb::new("collide");
    let existing = format!("col_x_{}", db.name);
    let colliding = format!("col.x_{}", db.name);
    broker.create_topic(&existing, 1).unwrap();
    let (mut w, _f) = walbox_with(&db, &bs, "[kafka]\ncreate_topics = true\n");
    wait_until(WAIT, "walbox to stream", || db.streaming(&db.name));
    db.sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES ('a', '{colliding}', 'x', '{{}}')"
    ));
    assert_eq!(w.wait_exit(WAIT).code(), Some(8), "{}", w.log());
    let line = w.last_line();
    assert!(
        line.contains(&format!("cannot create topic {colliding:?}"))
            && line.contains(&format!("collides with existing topic {existing:?}")),
        "{line}"
    );
}

#[test]
fn json_and_protobuf_envelopes_and_tombstones() {
    let db = TestDb::new("formats");
    db.sql(
        "CREATE TABLE j (id int, aggregate_type text, aggregate_id text, event_type text, payload text, region text);
         CREATE TABLE p (id int, aggregate_type text, aggregate_id text, event_type text, payload bytea)",
    );
    let broker = support::broker();
    let bs = broker.bootstrap_servers();
    let (tj, tp) = (format!("j_{}", db.name), format!("p_{}", db.name));
    broker.create_topic(&tj, 1).unwrap();
    broker.create_topic(&tp, 1).unwrap();
    let (w, _f) = walbox_with(
        &db,
        &bs,
        &format!(
            r#"
[[outbox.tables]]
table = "j"
topic = "{tj}"
format = "json"
expand_json_payload = true
tombstones = true
[outbox.tables.envelope]
region = "region"
[[outbox.tables]]
table = "p"
topic = "{tp}"
format = "protobuf"
"#
        ),
    );
    wait_until(WAIT, "walbox to stream", || db.streaming(&db.name));
    db.sql(
        "BEGIN;
         INSERT INTO j VALUES (1, 'order', 'o-1', 'placed', '{\"total\": 3}', 'eu');
         INSERT INTO j VALUES (2, 'order', 'o-1', 'deleted', NULL, NULL);
         INSERT INTO p VALUES (3, 'blob', 'b-1', 'stored', '\\x00ff10');
         COMMIT;",
    );
    let recs = read_logged(&w, &bs, &[&tj, &tp], 3);
    let lsn = recs[0].header_str("walbox.commit_lsn").unwrap().to_owned();
    let json = recs
        .iter()
        .find(|r| r.header_str("id") == Some("1"))
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(json.payload.as_deref().unwrap()).unwrap();
    let commit_time = v["commit_time"].as_str().unwrap().to_owned();
    assert!(
        commit_time.ends_with('Z') && commit_time.len() == 27,
        "{commit_time}"
    );
    assert_eq!(
        v,
        serde_json::json!({
            "id": "1", "type": "placed", "aggregate_type": "order", "aggregate_id": "o-1",
            "payload": {"total": 3}, "commit_lsn": lsn, "commit_time": commit_time,
            "index": 0, "source": "public.j", "region": "eu"
        })
    );
    let tomb = recs
        .iter()
        .find(|r| r.header_str("id") == Some("2"))
        .unwrap();
    assert_eq!(tomb.payload, None, "a NULL payload is a tombstone");
    assert_eq!(text(&tomb.key), "o-1");

    // The protobuf envelope decodes with the .proto shipped in proto/.
    let fds = protox::compile(
        ["walbox/v1/envelope.proto"],
        [concat!(env!("CARGO_MANIFEST_DIR"), "/proto")],
    )
    .unwrap();
    let pool = DescriptorPool::from_file_descriptor_set(fds).unwrap();
    let desc = pool.get_message_by_name("walbox.v1.Envelope").unwrap();
    let pb = recs.iter().find(|r| r.topic == tp).unwrap();
    let m = DynamicMessage::decode(desc, pb.payload.as_deref().unwrap()).unwrap();
    let field = |name: &str| m.get_field_by_name(name).unwrap().into_owned();
    assert_eq!(field("id"), Value::String("3".into()));
    assert_eq!(field("aggregate_id"), Value::String("b-1".into()));
    assert_eq!(
        field("payload"),
        Value::Bytes(vec![0x00, 0xff, 0x10].into())
    );
    assert_eq!(
        field("payload_content_type"),
        Value::String("application/octet-stream".into())
    );
    assert_eq!(field("commit_lsn"), Value::String(lsn));
    assert_eq!(field("index"), Value::U32(2));
    assert_eq!(field("source"), Value::String("public.p".into()));
}

/// A jsonb number keeps every digit in the JSON envelope, as in `raw`: beyond f64's precision,
/// beyond i64, and a 401-digit number beyond f64's range, which must not stop the relay.
#[test]
fn json_envelope_carries_jsonb_numbers_digit_for_digit() {
    let db = TestDb::new("jsonnum");
    let (topic, broker) = support::topic_on_broker(&db, 1);
    let bs = broker.bootstrap_servers();
    let (w, _f) = walbox_with(
        &db,
        &bs,
        &format!("[outbox]\ntopic = \"{topic}\"\nformat = \"json\"\n"),
    );
    wait_until(WAIT, "walbox to stream", || db.streaming(&db.name));
    let huge = format!("9{}", "8".repeat(400));
    db.sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES
           ('o-1', '{topic}', 'paid', '{{\"amount\": 12345678901234567890.12345678901234567890}}'),
           ('o-2', '{topic}', 'paid', '{{\"amount\": -98765432109876543210, \"units\": {huge}}}'),
           ('o-3', '{topic}', 'paid', '{{\"after\": true}}')"
    ));
    let recs = read_logged(&w, &bs, &[&topic], 3);
    // jsonb's own text of each payload: normalized layout, every digit kept.
    let stored = db.sql("SELECT payload::text FROM outbox ORDER BY id");
    let stored: Vec<&str> = stored.lines().collect();
    assert!(stored[0].contains("12345678901234567890.12345678901234567890"));
    assert!(stored[1].contains(&huge));
    let seen: Vec<String> = recs
        .iter()
        .map(|r| {
            // Read with numbers left as text, as a consumer with arbitrary precision would.
            let v: std::collections::BTreeMap<&str, &serde_json::value::RawValue> =
                serde_json::from_slice(r.payload.as_deref().unwrap()).unwrap();
            v["payload"].get().to_owned()
        })
        .collect();
    assert_eq!(seen, stored, "walbox log:\n{}", w.log());
}

#[test]
fn partitioned_outbox_rows_arrive_as_the_root_table() {
    let db = TestDb::new("parted");
    db.sql(
        "CREATE TABLE pout (id bigint NOT NULL, aggregate_id text NOT NULL, topic text NOT NULL,
           event_type text NOT NULL, payload jsonb NOT NULL, created_at date NOT NULL) PARTITION BY RANGE (created_at);
         CREATE TABLE pout_2026_11 PARTITION OF pout FOR VALUES FROM ('2026-11-01') TO ('2026-12-01');
         CREATE TABLE pout_2026_12 PARTITION OF pout FOR VALUES FROM ('2026-12-01') TO ('2027-01-01');",
    );
    let broker = support::broker();
    let bs = broker.bootstrap_servers();
    let topic = format!("t_{}", db.name);
    broker.create_topic(&topic, 1).unwrap();
    let (w, _f) = walbox_with(&db, &bs, "[outbox]\ntable = \"pout\"\n");
    wait_until(WAIT, "walbox to stream", || db.streaming(&db.name));
    db.sql(&format!(
        "INSERT INTO pout VALUES (1, 'a', '{topic}', 'x', '{{}}', '2026-11-15'), (2, 'a', '{topic}', 'x', '{{}}', '2026-12-15')"
    ));
    let recs = read_logged(&w, &bs, &[&topic], 2);
    let ids: Vec<&str> = recs.iter().filter_map(|r| r.header_str("id")).collect();
    assert_eq!(ids, ["1", "2"]);
    assert_eq!(
        db.sql(&format!(
            "SELECT pubviaroot FROM pg_publication WHERE pubname = '{}'",
            db.name
        )),
        "t"
    );
    // Retention is DROP PARTITION: no effect on the stream.
    db.sql("DROP TABLE pout_2026_11");

    // A publication that publishes the partitions under their own names is refused.
    let other = TestDb::new("parted2");
    other.sql(
        "CREATE TABLE pout (id bigint, aggregate_id text, topic text, event_type text, payload jsonb, created_at date) PARTITION BY RANGE (created_at);",
    );
    other.sql(&format!("CREATE PUBLICATION {} FOR TABLE pout", other.name));
    let (mut w, _f) = walbox_with(&other, &bs, "[outbox]\ntable = \"pout\"\n");
    assert_eq!(w.wait_exit(WAIT).code(), Some(5));
    assert!(
        w.last_line().contains("publish_via_partition_root"),
        "{}",
        w.last_line()
    );
}

#[test]
fn table_less_outbox_through_logical_messages() {
    let db = TestDb::new("tableless");
    db.sql(include_str!("../migrations/emit.sql"));
    let broker = support::broker();
    let bs = broker.bootstrap_servers();
    let topic = format!("m_{}", db.name);
    broker.create_topic(&topic, 1).unwrap();
    let (mut w, _f) = walbox_with(
        &db,
        &bs,
        &format!("[outbox.messages]\ntopic = \"{topic}\"\n"),
    );
    if support::major() < 14 {
        // pgoutput has no `messages` option before 14: refused at start-up, in one line, before
        // any slot is created (not silently relaying nothing).
        assert_eq!(w.wait_exit(WAIT).code(), Some(5), "{}", w.log());
        let line = w.last_line();
        assert!(
            line.contains("[outbox.messages] needs PostgreSQL 14"),
            "{line}"
        );
        let slots = format!(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{}'",
            db.name
        );
        assert_eq!(db.sql(&slots), "0", "no slot was created");
        return;
    }
    wait_until(WAIT, "walbox to stream", || db.streaming(&db.name));
    let id = db.sql(
        "BEGIN;
         INSERT INTO payments (wallet_id, amount) VALUES ('w', 5);
         SELECT walbox.emit('order', 'o-42', 'order.placed', '{\"total\": 12.5}');
         COMMIT;",
    );
    db.sql("BEGIN; SELECT walbox.emit('order', 'o-43', 'order.placed', '{}'); ROLLBACK;");
    let recs = read_logged(&w, &bs, &[&topic], 1);
    let r = &recs[0];
    assert_eq!(text(&r.key), "o-42");
    assert_eq!(text(&r.payload), "{\"total\": 12.5}");
    assert_eq!(r.header_str("id"), Some(id.lines().last().unwrap()));
    assert_eq!(r.header_str("event_type"), Some("order.placed"));
    let mut again = TopicReader::new(&bs, &[&topic], WAIT).unwrap();
    again.read_to_end(WAIT).unwrap();
    assert_eq!(
        again.records.len(),
        1,
        "the rolled-back message is not published"
    );
    assert_eq!(db.sql("SELECT count(*) FROM pg_stat_user_tables WHERE relname LIKE 'outbox%' AND n_tup_ins > 0"), "0");

    // A non-transactional message could not be confirmed with a commit: refused, not skipped.
    db.sql("SELECT pg_logical_emit_message(false, 'walbox.outbox', '{}')");
    assert_eq!(w.wait_exit(WAIT).code(), Some(8));
    assert!(
        w.last_line().contains("non-transactional"),
        "{}",
        w.last_line()
    );
}

#[test]
fn unpublishable_rows_go_to_the_dead_letter_topic_with_their_payload() {
    let db = TestDb::new("dlq");
    db.sql(
        "CREATE TABLE loose (id int, aggregate_id text, topic text, event_type text, payload text, tenant_id text)",
    );
    let broker = support::broker();
    let bs = broker.bootstrap_servers();
    let (good, dlq) = (format!("good_{}", db.name), format!("dlq_{}", db.name));
    broker.create_topic(&good, 1).unwrap();
    broker.create_topic(&dlq, 1).unwrap();
    let (w, _f) = walbox_with(
        &db,
        &bs,
        &format!(
            "[outbox]\ntable = \"loose\"\non_invalid = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n[outbox.headers]\ntenant_id = \"tenant\"\n"
        ),
    );
    wait_until(WAIT, "walbox to stream", || db.streaming(&db.name));
    db.sql(&format!(
        "INSERT INTO loose VALUES (1, 'k', '{good}', 'x', 'p1', 't');
         INSERT INTO loose VALUES (2, NULL, '{good}', 'x', 'p2', 't');
         INSERT INTO loose VALUES (3, 'k', 'no.such.topic', 'x', 'p3', 't');
         ALTER TABLE loose DROP COLUMN tenant_id;
         INSERT INTO loose VALUES (4, 'k', '{good}', 'x', 'p4');"
    ));
    let letters = read_logged(&w, &bs, &[&dlq], 3);
    let by_id = |id: &str| {
        letters
            .iter()
            .find(|r| r.header_str("id") == Some(id))
            .unwrap()
    };
    for (id, payload, why) in [
        ("2", "p2", "(key) is NULL"),
        ("3", "p3", "no.such.topic"),
        ("4", "p4", "tenant_id"),
    ] {
        let r = by_id(id);
        assert_eq!(text(&r.payload), payload, "original payload of {id}");
        let error = r.header_str("walbox.error").unwrap();
        assert!(error.contains(why), "{id}: {error}");
        assert_eq!(r.header_str("walbox.source"), Some("public.loose"));
        assert!(r.header_str("walbox.commit_lsn").unwrap().contains('/'));
    }
    let goods = read_logged(&w, &bs, &[&good], 1);
    assert_eq!(goods.len(), 1);
    assert_eq!(text(&goods[0].payload), "p1");
    assert!(w.log().contains("dead-letter"), "{}", w.log());
    drop(w);

    // The default policy stops instead (exit 8), naming the event.
    let strict = TestDb::new("strict");
    strict.sql(
        "CREATE TABLE loose (id int, aggregate_id text, topic text, event_type text, payload text)",
    );
    let (mut w, _f) = walbox_with(&strict, &bs, "[outbox]\ntable = \"loose\"\n");
    wait_until(WAIT, "walbox to stream", || strict.streaming(&strict.name));
    strict.sql(&format!(
        "INSERT INTO loose VALUES (7, NULL, '{good}', 'x', 'p')"
    ));
    assert_eq!(w.wait_exit(WAIT).code(), Some(8));
    assert!(
        w.last_line().contains("event 7 of public.loose"),
        "{}",
        w.last_line()
    );
}

#[test]
fn updates_deletes_and_schema_changes_of_the_outbox() {
    let db = TestDb::new("changes");
    db.sql(&format!("CREATE PUBLICATION {} FOR TABLE outbox", db.name)); // all operations
    let broker = support::broker();
    let bs = broker.bootstrap_servers();
    let topic = format!("t_{}", db.name);
    broker.create_topic(&topic, 1).unwrap();
    let (mut w, _f) = walbox_with(&db, &bs, "[outbox]\ntable = \"outbox\"\n");
    wait_until(WAIT, "walbox to stream", || db.streaming(&db.name));
    let ins = |agg: &str| {
        format!("INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES ('{agg}', '{topic}', 'x', '{{}}')")
    };
    // Insert and delete in one transaction: the table stays empty, the event still flows.
    db.sql(&format!("BEGIN; {}; DELETE FROM outbox; COMMIT;", ins("a")));
    db.sql(&format!(
        "{}; UPDATE outbox SET event_type = 'y'; DELETE FROM outbox;",
        ins("b")
    ));
    db.sql(&format!(
        "ALTER TABLE outbox ADD COLUMN extra text; {}",
        ins("c")
    ));
    let recs = read_logged(&w, &bs, &[&topic], 3);
    let keys: Vec<String> = recs.iter().map(|r| text(&r.key)).collect();
    assert_eq!(
        keys,
        ["a", "b", "c"],
        "only inserts are events; ADD COLUMN keeps working"
    );
    assert_eq!(
        db.sql("SELECT count(*) FROM outbox"),
        "1",
        "only c's row is left: a and b were deleted"
    );
    assert!(w.running());
    assert!(
        w.log()
            .contains("change to an outbox table is not an event"),
        "{}",
        w.log()
    );
    w.terminate();
    assert!(w.wait_exit(WAIT).success());

    let (mut w, _f) = walbox_with(
        &db,
        &bs,
        "[outbox]\ntable = \"outbox\"\non_change = \"fail\"\n",
    );
    wait_until(WAIT, "walbox to stream", || db.streaming(&db.name));
    db.sql(&format!("{}; DELETE FROM outbox;", ins("d")));
    assert_eq!(w.wait_exit(WAIT).code(), Some(5));
    assert!(
        w.last_line()
            .contains("DELETE on outbox table public.outbox"),
        "{}",
        w.last_line()
    );

    // `fail_update` (the Outbox Event Router's `table.op.invalid.behavior=fatal`): the
    // insert-then-delete pattern flows, an UPDATE stops walbox.
    let (mut w, _f) = walbox_with(
        &db,
        &bs,
        "[outbox]\ntable = \"outbox\"\non_change = \"fail_update\"\n",
    );
    wait_until(WAIT, "walbox to stream", || db.streaming(&db.name));
    db.sql(&format!("BEGIN; {}; DELETE FROM outbox; COMMIT;", ins("e")));
    let mut r = TopicReader::new(&bs, &[&topic], WAIT).unwrap();
    assert!(
        r.poll_until(WAIT, |recs| recs.iter().any(|x| text(&x.key) == "e")),
        "e is relayed past its DELETE; walbox log:\n{}",
        w.log()
    );
    assert!(w.running(), "{}", w.log());
    db.sql(&format!(
        "{}; UPDATE outbox SET event_type = 'y';",
        ins("f")
    ));
    assert_eq!(w.wait_exit(WAIT).code(), Some(5));
    assert!(
        w.last_line()
            .contains("UPDATE on outbox table public.outbox"),
        "{}",
        w.last_line()
    );
}
