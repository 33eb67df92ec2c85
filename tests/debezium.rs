//! Side by side with Debezium: one outbox table in Debezium's own layout, relayed through two
//! slots, by Kafka Connect with the Debezium PostgreSQL connector and its Outbox Event Router,
//! and by walbox with `compat = "debezium"`, each under its own topic prefix on the real-Kafka
//! lane's broker. walbox's configuration is what `walbox from-debezium` makes of the connector's
//! own (on a slot of its own, under its prefix), whose routes must equal the compatibility mode
//! written by hand. After stripping the prefixes, every record must be the same: topic, partition
//! (same partition count), key bytes, value bytes, headers (names and bytes, apart from the
//! named list [`RELAY_HEADERS`] that docs/migrating.md documents), and the order within each
//! partition, hence per key. Two connector configurations: the router's defaults with header
//! placements, and custom columns with a text payload, tombstones on empty payloads,
//! `table.op.invalid.behavior=fatal` under inserts each deleted in their transaction, NULL keys,
//! a partition column and a payload over librdkafka's default size limit. Runs only with
//! `WALBOX_TEST_KAFKA=apache` (scripts/real-kafka.sh).

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Instant;

use walbox::sandbox::broker::{ConsumedRecord, TopicReader};

use crate::support::debezium::{Connect, ConnectorSpec};
use crate::support::{self, kafka, wait_until, walbox_env, TestDb, Walbox, WAIT};

/// Debezium's outbox table, as its documentation creates it, with three more columns that the
/// router places in headers (each sometimes NULL).
pub(crate) const TABLE: &str = "
DROP TABLE outbox;
CREATE TABLE outbox (
    id            uuid         PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb,
    tenant        text,
    attempt       integer,
    traceparent   text
);";

/// The routing values; each has a topic of [`PARTITIONS`] partitions per side.
pub(crate) const AGGREGATE_TYPES: [&str; 3] = ["order", "customer", "invoice"];
pub(crate) const PARTITIONS: i32 = 3;
const DBZ_PREFIX: &str = "dbz.";
const WBX_PREFIX: &str = "wbx.";

/// The router's settings: its defaults, apart from the topic (under `prefix`, stripped for the
/// comparison) and the commonly used header placements.
pub(crate) fn router(prefix: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "route.topic.replacement",
            format!("{prefix}outbox.event.${{routedByValue}}"),
        ),
        (
            "table.fields.additional.placement",
            "type:header:eventType,tenant:header:tenant,attempt:header:attempt,traceparent:header:traceparent"
                .into(),
        ),
    ]
}

/// walbox's configuration for the same table: the compatibility mode, the same placements.
fn walbox_toml() -> String {
    format!(
        "[outbox]\ntable = \"public.outbox\"\ncompat = \"debezium\"\n\
         topic = \"{WBX_PREFIX}outbox.event.${{aggregate_type}}\"\n\
         [outbox.headers]\ntype = \"eventType\"\ntenant = \"tenant\"\nattempt = \"attempt\"\n\
         traceparent = \"traceparent\"\n"
    )
}

/// One row's SQL values after `id`: aggregatetype, aggregateid, type, payload, tenant, attempt,
/// traceparent. `n` varies the payload kind and which optional columns are NULL.
fn row(n: usize, aggregate: usize) -> String {
    let agg_type = AGGREGATE_TYPES[aggregate % AGGREGATE_TYPES.len()];
    let payload = match n % 5 {
        0 => format!("jsonb_build_object('n', {n}, 'items', jsonb_build_array(1, 2.5, 'x'), 'ok', true)"),
        1 => format!("to_jsonb('plain string {n}'::text)"),
        2 => format!("jsonb_build_object('text', 'caf\u{e9} \"q\" \\\\ \u{2713} \u{65e5}\u{672c} \u{1f389} {n}')"),
        3 => "'null'::jsonb".to_owned(),
        _ => format!("'[{n}, {{\"nested\": {{\"k\": \"v\"}}}}]'::jsonb"),
    };
    let tenant = if n.is_multiple_of(3) {
        "NULL".to_owned()
    } else {
        format!("'tenant-{}'", n % 4)
    };
    let attempt = if n.is_multiple_of(4) {
        "NULL".to_owned()
    } else {
        (n % 7).to_string()
    };
    let trace = if n.is_multiple_of(2) {
        format!("'00-{n:032x}-{n:016x}-01'")
    } else {
        "NULL".to_owned()
    };
    format!(
        "gen_random_uuid(), '{agg_type}', '{agg_type}-{aggregate}', '{agg_type}.changed', {payload}, {tenant}, {attempt}, {trace}"
    )
}

pub(crate) const INSERT: &str =
    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, tenant, attempt, traceparent) VALUES ";

/// The workload: single-row and multi-row transactions over many aggregates, a rolled-back
/// transaction, and a payload past 512 KiB. Returns how many rows committed.
fn write_workload(db: &TestDb) -> usize {
    let aggregates = 40;
    let mut committed = 0;
    let mut n = 0;
    for t in 0..60 {
        let rows = if t % 4 == 0 { 1 + t % 7 } else { 1 };
        let values: Vec<String> = (0..rows)
            .map(|i| {
                n += 1;
                format!("({})", row(n, (t * 7 + i * 3) % aggregates))
            })
            .collect();
        db.sql(&format!("BEGIN; {INSERT}{}; COMMIT;", values.join(", ")));
        committed += rows;
        if t == 20 {
            db.sql(&format!(
                "BEGIN; {INSERT}({}), ({}); ROLLBACK;",
                row(1000, 1),
                row(1001, 2)
            ));
        }
    }
    // Large: a 600 KiB JSON string field, and a multi-row transaction around it.
    let large = "jsonb_build_object('blob', repeat('\u{e9}x', 300 * 1024), 'n', 1)";
    db.sql(&format!(
        "BEGIN; {INSERT}(gen_random_uuid(), 'order', 'order-1', 'order.large', {large}, 't', 1, NULL), ({}); COMMIT;",
        row(2000, 1)
    ));
    committed + 2
}

/// The records of `prefix`'s topics, by topic with the prefix stripped and partition, in
/// partition order.
pub(crate) fn read_side(
    bootstrap: &str,
    prefix: &str,
    n: usize,
    what: &str,
) -> BTreeMap<(String, i32), Vec<ConsumedRecord>> {
    let topics: Vec<String> = AGGREGATE_TYPES
        .iter()
        .map(|t| format!("{prefix}outbox.event.{t}"))
        .collect();
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let mut reader = TopicReader::new(bootstrap, &names, WAIT).expect("read topics");
    assert!(
        reader.poll_until(WAIT, |r| r.len() >= n),
        "{what}: read {} of {n} records",
        reader.records.len()
    );
    reader.read_to_end(WAIT).expect("read to the end");
    assert_eq!(
        reader.records.len(),
        n,
        "{what}: more records than committed rows"
    );
    let mut by_partition: BTreeMap<(String, i32), Vec<ConsumedRecord>> = BTreeMap::new();
    for r in reader.records {
        let topic = r.topic.strip_prefix(prefix).expect("prefixed").to_owned();
        by_partition
            .entry((topic, r.partition))
            .or_default()
            .push(r);
    }
    for records in by_partition.values_mut() {
        records.sort_by_key(|r| r.offset);
    }
    by_partition
}

/// The headers only one of the relays writes, by name, all listed in docs/migrating.md ("What
/// still differs"): walbox's own, and Debezium's context headers. Every other header is
/// compared.
pub(crate) const RELAY_HEADERS: [&str; 7] = [
    "walbox.commit_lsn",
    "walbox.index",
    "walbox.source",
    "__debezium.context.connectorLogicalName",
    "__debezium.context.connectorName",
    "__debezium.context.runId",
    "__debezium.context.taskId",
];

/// The headers a consumer of either relay reads, by name: all but [`RELAY_HEADERS`], sorted,
/// because the router places headers in its placement order and walbox in column-name order
/// (both in docs/migrating.md).
pub(crate) fn comparable_headers(r: &ConsumedRecord) -> Vec<(String, Vec<u8>)> {
    let mut headers: Vec<(String, Vec<u8>)> = r
        .headers
        .iter()
        .filter(|(k, _)| !RELAY_HEADERS.contains(&k.as_str()))
        .cloned()
        .collect();
    headers.sort();
    headers
}

/// Asserts that both sides hold the same records: the same topics and partitions, and in each,
/// in order, the same key, value and [`comparable_headers`].
pub(crate) fn assert_same_records(
    dbz: &BTreeMap<(String, i32), Vec<ConsumedRecord>>,
    wbx: &BTreeMap<(String, i32), Vec<ConsumedRecord>>,
    walbox: &Walbox,
) {
    assert_eq!(
        dbz.keys().collect::<Vec<_>>(),
        wbx.keys().collect::<Vec<_>>(),
        "the same topics and partitions hold records; walbox log:\n{}",
        walbox.log()
    );
    let text = |p: &Option<Vec<u8>>| {
        p.as_ref().map(|p| {
            (
                p.len(),
                String::from_utf8_lossy(p)
                    .chars()
                    .take(80)
                    .collect::<String>(),
            )
        })
    };
    for ((topic, partition), theirs) in dbz {
        let ours = &wbx[&(topic.clone(), *partition)];
        assert_eq!(
            ours.len(),
            theirs.len(),
            "{topic}[{partition}]: record count"
        );
        for (i, (d, w)) in theirs.iter().zip(ours).enumerate() {
            let at = format!("{topic}[{partition}] record {i}");
            assert_eq!(w.key, d.key, "{at}: key");
            assert!(
                w.payload == d.payload,
                "{at}: value differs: Debezium (bytes, start) {:?}, walbox {:?}",
                text(&d.payload),
                text(&w.payload),
            );
            assert_eq!(
                comparable_headers(w),
                comparable_headers(d),
                "{at}: headers"
            );
        }
    }
}

#[test]
fn walbox_in_debezium_compat_mode_writes_the_event_routers_records() {
    let Some(server) = kafka::apache() else {
        eprintln!("needs Apache Kafka and Kafka Connect: run with WALBOX_TEST_KAFKA=apache (scripts/real-kafka.sh); skipped");
        return;
    };
    if let Err(e) = support::debezium::installed() {
        panic!("{e}");
    }
    let bootstrap = server.bootstrap_servers();
    let broker = support::broker();
    for prefix in [DBZ_PREFIX, WBX_PREFIX] {
        for t in AGGREGATE_TYPES {
            broker
                .create_topic(&format!("{prefix}outbox.event.{t}"), PARTITIONS)
                .expect("create a topic");
        }
    }
    let db = TestDb::new("dbz");
    db.sql(TABLE);
    let dbz_slot = format!("dbz_{}", db.name);
    let wbx_slot = format!("wbx_{}", db.name);

    let router = router(DBZ_PREFIX);
    let connect = Connect::start(&ConnectorSpec {
        db: &db,
        slot: &dbz_slot,
        publication: &dbz_slot,
        bootstrap: &bootstrap,
        router: &router,
        extra: &[],
    });
    eprintln!(
        "Kafka Connect with Debezium: task running, slot streaming {:?} after start; RSS {:?} KiB",
        connect.start_time,
        connect.rss_kib()
    );

    // walbox as `walbox from-debezium` describes the connector, on a slot of its own and under
    // its own prefix; the same routes as the compatibility mode written by hand.
    let dir = tempfile::tempdir().unwrap();
    let mut env = walbox_env(&db, &wbx_slot, &bootstrap);
    env.extend(support::debezium::walbox_config(&connect, dir.path()));
    env.push((
        "WALBOX_OUTBOX_TOPIC".into(),
        format!("{WBX_PREFIX}outbox.event.${{aggregate_type}}"),
    ));
    let mut by_hand = tempfile::NamedTempFile::new().unwrap();
    by_hand.write_all(walbox_toml().as_bytes()).unwrap();
    let load = |file: &std::path::Path| {
        walbox::config::load_from(Some(file), &mut env.clone().into_iter())
            .unwrap_or_else(|e| panic!("{e}"))
            .outbox
    };
    let translated = env
        .iter()
        .find(|(k, _)| k == "WALBOX_CONFIG")
        .map(|(_, v)| std::path::PathBuf::from(v))
        .expect("WALBOX_CONFIG");
    assert_eq!(
        load(&translated),
        load(by_hand.path()),
        "from-debezium's routes"
    );
    let started = Instant::now();
    let walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox's slot to stream", || db.streaming(&wbx_slot));
    eprintln!("walbox: slot streaming {:?} after start", started.elapsed());

    let committed = write_workload(&db);
    let dbz = read_side(&bootstrap, DBZ_PREFIX, committed, "Debezium");
    let wbx = read_side(&bootstrap, WBX_PREFIX, committed, "walbox");
    eprintln!(
        "RSS after the workload: Kafka Connect {:?} KiB, walbox {:?} KiB",
        connect.rss_kib(),
        support::debezium::rss_kib(walbox.pid())
    );

    assert_same_records(&dbz, &wbx, &walbox);
    let large = dbz
        .values()
        .flatten()
        .filter(|r| r.payload.as_ref().is_some_and(|p| p.len() >= 512 * 1024))
        .count();
    assert_eq!(large, 1, "the large payload went through");
    drop(connect);
}

/// The second configuration's table: custom column names, a text payload (blank, empty or NULL
/// in some rows), a key column that is sometimes NULL, a partition column, a header column.
const CUSTOM_TABLE: &str = "
DROP TABLE outbox;
CREATE TABLE outbox (
    event_id   uuid    PRIMARY KEY,
    category   text    NOT NULL,
    stream_key text,
    kind       text    NOT NULL,
    body       text,
    shard      integer NOT NULL,
    tenant     text
);";

/// The router's settings for [`CUSTOM_TABLE`].
fn custom_router(prefix: &str) -> Vec<(&'static str, String)> {
    vec![
        ("table.field.event.id", "event_id".into()),
        ("table.field.event.key", "stream_key".into()),
        ("table.field.event.type", "kind".into()),
        ("table.field.event.payload", "body".into()),
        ("route.by.field", "category".into()),
        (
            "route.topic.replacement",
            format!("{prefix}outbox.event.${{routedByValue}}"),
        ),
        ("route.tombstone.on.empty.payload", "true".into()),
        ("table.op.invalid.behavior", "fatal".into()),
        ("table.field.additional.missing", "error".into()),
        (
            "table.fields.additional.placement",
            "kind:header:eventType,tenant:header,shard:partition".into(),
        ),
    ]
}

/// One [`CUSTOM_TABLE`] row's SQL values.
fn custom_row(n: usize) -> String {
    let category = AGGREGATE_TYPES[n % AGGREGATE_TYPES.len()];
    let key = if n % 5 == 2 {
        "NULL".to_owned()
    } else {
        format!("'{category}-{}'", n % 7)
    };
    let body = match n % 8 {
        0 => "NULL".to_owned(),
        1 => "''".to_owned(),
        2 => "'   '".to_owned(),
        3 => "E'\\t\\r\\n '".to_owned(),
        4 => format!("' padded {n} '"),
        5 => "E'\\u00a0'".to_owned(),
        _ => format!("'{{\"n\": {n}, \"text\": \"caf\u{e9} \u{1f389}\"}}'"),
    };
    let tenant = if n.is_multiple_of(4) {
        "NULL".to_owned()
    } else {
        format!("'tenant-{}'", n % 3)
    };
    format!(
        "(gen_random_uuid(), '{category}', {key}, '{category}.changed', {body}, {}, {tenant})",
        n % PARTITIONS as usize
    )
}

#[test]
fn custom_columns_blank_payloads_deletes_and_null_keys_match_the_router() {
    let Some(server) = kafka::apache() else {
        eprintln!("needs Apache Kafka and Kafka Connect: run with WALBOX_TEST_KAFKA=apache (scripts/real-kafka.sh); skipped");
        return;
    };
    if let Err(e) = support::debezium::installed() {
        panic!("{e}");
    }
    const DBZ: &str = "dbz2.";
    const WBX: &str = "wbx2.";
    let bootstrap = server.bootstrap_servers();
    let broker = support::broker();
    for prefix in [DBZ, WBX] {
        for t in AGGREGATE_TYPES {
            broker
                .create_topic(&format!("{prefix}outbox.event.{t}"), PARTITIONS)
                .expect("create a topic");
        }
    }
    let db = TestDb::new("dbzcustom");
    db.sql(CUSTOM_TABLE);
    let dbz_slot = format!("dbz_{}", db.name);
    let wbx_slot = format!("wbx_{}", db.name);
    // walbox reads a publication of every operation, as Debezium's (and as walbox does on
    // Debezium's own publication after the switch), so that it sees the DELETEs.
    db.sql(&format!("CREATE PUBLICATION {wbx_slot} FOR TABLE outbox"));

    let router = custom_router(DBZ);
    let connect = Connect::start(&ConnectorSpec {
        db: &db,
        slot: &dbz_slot,
        publication: &dbz_slot,
        bootstrap: &bootstrap,
        router: &router,
        extra: &[],
    });
    let dir = tempfile::tempdir().unwrap();
    let mut env = walbox_env(&db, &wbx_slot, &bootstrap);
    env.extend(support::debezium::walbox_config(&connect, dir.path()));
    env.push((
        "WALBOX_OUTBOX_TOPIC".into(),
        format!("{WBX}outbox.event.${{aggregate_type}}"),
    ));
    let translated = env
        .iter()
        .find(|(k, _)| k == "WALBOX_CONFIG")
        .map(|(_, v)| std::path::PathBuf::from(v))
        .expect("WALBOX_CONFIG");
    let config = walbox::config::load_from(Some(&translated), &mut env.clone().into_iter())
        .unwrap_or_else(|e| panic!("{e}"));
    let route = &config.outbox.tables[0];
    assert_eq!(
        (route.tombstones, route.on_change, route.compat),
        (
            true,
            walbox::config::OnChange::FailOnUpdate,
            walbox::config::Compat::Debezium
        ),
        "from-debezium's route"
    );
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox's slot to stream", || db.streaming(&wbx_slot));

    // Single-row and multi-row transactions; every third one deletes its rows before it
    // commits (the router's documented pattern), which the router skips.
    let mut committed = 0;
    let mut n = 0;
    for t in 0..40 {
        let rows = 1 + t % 3;
        let values: Vec<String> = (0..rows)
            .map(|_| {
                n += 1;
                custom_row(n)
            })
            .collect();
        let delete = if t % 3 == 0 {
            "DELETE FROM outbox;"
        } else {
            ""
        };
        db.sql(&format!(
            "BEGIN; INSERT INTO outbox (event_id, category, stream_key, kind, body, shard, tenant) \
             VALUES {}; {delete} COMMIT;",
            values.join(", ")
        ));
        committed += rows;
    }
    // Over librdkafka's default message.max.bytes (1,000,000), under Connect's producer limit
    // (max.request.size, 1,048,576), which from-debezium carries over.
    db.sql(
        "INSERT INTO outbox (event_id, category, stream_key, kind, body, shard, tenant) \
         VALUES (gen_random_uuid(), 'order', 'order-large', 'order.large', repeat('x', 1010000), 1, 't')",
    );
    committed += 1;
    let dbz = read_side(&bootstrap, DBZ, committed, "Debezium");
    let wbx = read_side(&bootstrap, WBX, committed, "walbox");
    assert_same_records(&dbz, &wbx, &walbox);
    let records: Vec<&ConsumedRecord> = dbz.values().flatten().collect();
    let tombstones = records.iter().filter(|r| r.payload.is_none()).count();
    let null_keys = records.iter().filter(|r| r.key.is_none()).count();
    assert!(
        tombstones >= 3 * committed / 8 && null_keys >= committed / 5,
        "the workload has tombstones ({tombstones}) and null keys ({null_keys})"
    );
    let large = records
        .iter()
        .filter(|r| r.payload.as_ref().is_some_and(|p| p.len() == 1_010_000))
        .count();
    assert_eq!(large, 1, "the 1,010,000-byte payload went through");
    assert!(walbox.running(), "{}", walbox.log());
    drop(connect);
}
