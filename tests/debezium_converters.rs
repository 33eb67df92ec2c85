//! Side by side with Debezium, through Connect's converters: the Outbox Event Router with
//! `JsonConverter` (schemas on and off, for keys and values) and with `StringConverter`, each
//! with `table.expand.json.payload`, against walbox configured by `walbox from-debezium` from
//! the same connector. Payloads cover what the converters and the expansion are particular
//! about: null fields, doubles (`1.0E-7`), characters outside the Basic Multilingual Plane,
//! control characters, nested objects and arrays, empty arrays and objects, longs, payloads
//! the router leaves unexpanded (mixed arrays, JSON strings, non-JSON text) and an empty
//! top-level array (a null schema). Records must be the same as in `debezium.rs`'s
//! comparison, plus the record timestamp where a column sets it. Runs only with
//! `WALBOX_TEST_KAFKA=apache` (scripts/real-kafka.sh).

use std::collections::BTreeMap;

use walbox::config::{Converter, JsonNulls};
use walbox::sandbox::broker::ConsumedRecord;

use crate::debezium::{assert_same_records, read_side, router, AGGREGATE_TYPES, PARTITIONS, TABLE};
use crate::support::debezium::{Connect, ConnectorSpec};
use crate::support::{self, kafka, wait_until, walbox_env, TestDb, Walbox, WAIT};

/// JSON payloads (SQL jsonb literals) the router expands, or leaves as they are.
const JSON_PAYLOADS: &[&str] = &[
    r#"'{"a": null, "b": 1, "c": {"d": null}}'"#,
    r#"'{"x": 0.0000001, "y": 1.5, "z": 100.0, "big": 123456789012.5, "neg": -2.5e-5, "tenth": 0.1}'"#,
    "jsonb_build_object('text', E'caf\u{e9} \"q\" \\\\ \u{2713} \u{65e5}\u{672c} \u{1f389} tab\\there\\u0001', 'n', 7)",
    r#"'{"items": [1, 2, 3], "tags": ["a", "b"], "flags": [true, false], "lines": [{"k": 1, "v": "x"}, {"k": 2, "v": "y"}]}'"#,
    r#"'{"l": 3000000000, "i": -7, "empty": [], "obj": {}, "arr": [1, null, 3]}'"#,
    r#"'{"grid": [[1, 2], [3]], "deep": {"a": {"b": {"c": [1.25]}}}}'"#,
    // Left unexpanded by the router: a mixed array, a JSON string, JSON null.
    r#"'{"mixed": [1, "x"]}'"#,
    r#"'"plain string"'"#,
    "'null'",
    // An empty top-level array: the router's schema for it is null.
    "'[]'",
    "NULL",
];

/// One side's records, by topic (prefix stripped) and partition, in partition order.
type Records = BTreeMap<(String, i32), Vec<ConsumedRecord>>;

/// The topics of `prefix`, created with [`PARTITIONS`] partitions.
fn create_topics(prefix: &str) {
    let broker = support::broker();
    for t in AGGREGATE_TYPES {
        broker
            .create_topic(&format!("{prefix}outbox.event.{t}"), PARTITIONS)
            .expect("create a topic");
    }
}

/// One comparison: the router with `router` and the connector settings `extra` on `table`
/// (relaying into `dbz` topics), walbox as `from-debezium` translates it (into `wbx` topics),
/// each statement of `writes` run in turn (`rows` rows in all). `route` checks the translated
/// route. Returns both sides' records.
#[allow(clippy::too_many_arguments)]
fn compare(
    name: &str,
    table: &str,
    router: &[(&'static str, String)],
    extra: &[(&'static str, String)],
    writes: &[String],
    rows: usize,
    route: impl Fn(&walbox::config::Route),
) -> Option<[Records; 2]> {
    let Some(server) = kafka::apache() else {
        eprintln!("needs Apache Kafka and Kafka Connect: run with WALBOX_TEST_KAFKA=apache (scripts/real-kafka.sh); skipped");
        return None;
    };
    if let Err(e) = support::debezium::installed() {
        panic!("{e}");
    }
    let (dbz, wbx) = (format!("dbz{name}."), format!("wbx{name}."));
    let bootstrap = server.bootstrap_servers();
    create_topics(&dbz);
    create_topics(&wbx);
    let db = TestDb::new(&format!("dbz{name}"));
    db.sql(table);
    let dbz_slot = format!("dbz_{}", db.name);
    let wbx_slot = format!("wbx_{}", db.name);
    let connect = Connect::start(&ConnectorSpec {
        db: &db,
        slot: &dbz_slot,
        publication: &dbz_slot,
        bootstrap: &bootstrap,
        router,
        extra,
    });
    let dir = tempfile::tempdir().unwrap();
    let mut env = walbox_env(&db, &wbx_slot, &bootstrap);
    env.extend(support::debezium::walbox_config(&connect, dir.path()));
    env.push((
        "WALBOX_OUTBOX_TOPIC".into(),
        format!("{wbx}outbox.event.${{aggregate_type}}"),
    ));
    let file = env
        .iter()
        .find(|(k, _)| k == "WALBOX_CONFIG")
        .map(|(_, v)| std::path::PathBuf::from(v))
        .expect("WALBOX_CONFIG");
    let config = walbox::config::load_from(Some(&file), &mut env.clone().into_iter())
        .unwrap_or_else(|e| panic!("{e}"));
    route(&config.outbox.tables[0]);
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox's slot to stream", || db.streaming(&wbx_slot));
    for w in writes {
        db.sql(w);
    }
    let theirs = read_side(&bootstrap, &dbz, rows, "Debezium");
    let ours = read_side(&bootstrap, &wbx, rows, "walbox");
    assert_same_records(&theirs, &ours, &walbox);
    assert!(walbox.running(), "{}", walbox.log());
    drop(connect);
    Some([theirs, ours])
}

/// Rows of Debezium's own table ([`TABLE`]) with each of [`JSON_PAYLOADS`], over the three
/// aggregate types, in single-row and multi-row transactions.
fn json_rows() -> (Vec<String>, usize) {
    let mut writes = Vec::new();
    let mut rows = 0;
    for round in 0..3 {
        let values: Vec<String> = JSON_PAYLOADS
            .iter()
            .enumerate()
            .map(|(i, payload)| {
                let t = AGGREGATE_TYPES[(i + round) % AGGREGATE_TYPES.len()];
                format!(
                    "(gen_random_uuid(), '{t}', '{t}-{}', '{t}.changed', {payload}, 'tenant', {i}, NULL)",
                    i % 4
                )
            })
            .collect();
        rows += values.len();
        if round == 1 {
            writes.push(format!(
                "BEGIN; {}{}; COMMIT;",
                crate::debezium::INSERT,
                values.join(", ")
            ));
        } else {
            writes.extend(
                values
                    .iter()
                    .map(|v| format!("{}{v}", crate::debezium::INSERT)),
            );
        }
    }
    (writes, rows)
}

fn json_converter(side: &'static str, schemas: bool) -> Vec<(&'static str, String)> {
    let (class, enable) = match side {
        "key" => ("key.converter", "key.converter.schemas.enable"),
        _ => ("value.converter", "value.converter.schemas.enable"),
    };
    vec![
        (class, "org.apache.kafka.connect.json.JsonConverter".into()),
        (enable, schemas.to_string()),
    ]
}

#[test]
fn json_converter_with_schemas_and_expanded_payloads_match_the_router() {
    let mut router = router("dbzjs.");
    router.push(("table.expand.json.payload", "true".into()));
    let mut extra = json_converter("key", true);
    extra.extend(json_converter("value", true));
    let (writes, rows) = json_rows();
    let Some([dbz, _]) = compare("js", TABLE, &router, &extra, &writes, rows, |r| {
        assert!(r.expand_json_payload);
        assert_eq!(
            (r.converters.key, r.converters.value),
            (
                Converter::Json { schemas: true },
                Converter::Json { schemas: true }
            )
        );
    }) else {
        return;
    };
    // The comparison covered what it is about: schemas, dropped nulls, Java's doubles,
    // surrogate escapes, a null schema.
    let values: Vec<String> = dbz
        .values()
        .flatten()
        .filter_map(|r| {
            r.payload
                .as_deref()
                .map(|p| String::from_utf8_lossy(p).into_owned())
        })
        .collect();
    for needle in [
        "\"payload\":{\"b\":1,\"c\":{}}",
        "1.0E-7",
        "\\uD83C\\uDF89",
        "\"schema\":null",
        "\"name\":\"io.debezium.data.Json\"",
    ] {
        assert!(
            values.iter().any(|v| v.contains(needle)),
            "no record value has {needle:?}"
        );
    }
}

/// A table with a nullable text key, a text payload, and a timestamp column.
const TEXT_TABLE: &str = "
DROP TABLE outbox;
CREATE TABLE outbox (
    id            uuid      PRIMARY KEY,
    aggregatetype text      NOT NULL,
    aggregateid   text,
    type          text      NOT NULL,
    payload       text,
    created_at    timestamp NOT NULL
);";

#[test]
fn json_converter_without_schemas_expands_text_payloads_and_keeps_null_fields() {
    let router = vec![
        (
            "route.topic.replacement",
            "dbzjn.outbox.event.${routedByValue}".to_owned(),
        ),
        ("table.expand.json.payload", "true".into()),
        ("table.json.payload.null.behavior", "optional_bytes".into()),
        ("route.tombstone.on.empty.payload", "true".into()),
        ("table.field.event.timestamp", "created_at".into()),
    ];
    let mut extra = json_converter("key", false);
    extra.extend(json_converter("value", false));
    let payloads = JSON_PAYLOADS
        .iter()
        .map(|p| match *p {
            "NULL" => "NULL".to_owned(),
            p => format!("({p}::jsonb)::text"),
        })
        .chain(
            [
                "'not json'",
                "'{broken'",
                "'   '",
                "''",
                "E'\\t\"quoted\" \u{1f680}'",
            ]
            .map(String::from),
        );
    let mut writes = Vec::new();
    for (i, payload) in payloads.enumerate() {
        let t = AGGREGATE_TYPES[i % AGGREGATE_TYPES.len()];
        let key = if i % 4 == 3 {
            "NULL".to_owned()
        } else {
            format!("'{t}-{}'", i % 5)
        };
        writes.push(format!(
            "INSERT INTO outbox VALUES (gen_random_uuid(), '{t}', {key}, 'changed', {payload}, \
             timestamp '2026-12-06 10:00:00' + interval '1.5 seconds' * {i})"
        ));
    }
    let rows = writes.len();
    let Some([dbz, wbx]) = compare("jn", TEXT_TABLE, &router, &extra, &writes, rows, |r| {
        assert_eq!(r.json_nulls, JsonNulls::OptionalBytes);
        assert!(r.tombstones);
        assert_eq!(r.converters.value, Converter::Json { schemas: false });
    }) else {
        return;
    };
    // The record timestamp is the column's, on both sides.
    for (at, theirs) in &dbz {
        for (d, w) in theirs.iter().zip(&wbx[at]) {
            assert_eq!(w.timestamp_ms, d.timestamp_ms, "{at:?}: timestamp");
        }
    }
    let records: Vec<&ConsumedRecord> = dbz.values().flatten().collect();
    assert!(records.iter().any(|r| r.key.as_deref() == Some(b"null")));
    assert!(records.iter().any(|r| r.payload.is_none()));
    assert!(records
        .iter()
        .any(|r| r.payload.as_deref() == Some(b"{\"a\":null,\"b\":1,\"c\":{\"d\":null}}")));
}

#[test]
fn string_converter_writes_expanded_payloads_as_connect_structs() {
    let mut router = router("dbzst.");
    router.push(("table.expand.json.payload", "true".into()));
    let extra = json_converter("key", true);
    let (mut writes, mut rows) = json_rows();
    // A top-level array: the router's schema for it does not take its data, and
    // StringConverter writes the text.
    writes.push(format!(
        "{}(gen_random_uuid(), 'order', 'order-9', 'x', '[1, 2]', NULL, NULL, NULL)",
        crate::debezium::INSERT
    ));
    rows += 1;
    let Some([dbz, _]) = compare("st", TABLE, &router, &extra, &writes, rows, |r| {
        assert!(r.expand_json_payload);
        assert_eq!(r.converters.value, Converter::String);
    }) else {
        return;
    };
    assert!(dbz.values().flatten().any(|r| r
        .payload
        .as_deref()
        .is_some_and(|p| p.starts_with(b"Struct{"))));
}
