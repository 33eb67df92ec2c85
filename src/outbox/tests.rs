use super::*;
use crate::config::{self, OutboxConfig};
use crate::source::pgoutput::{Column, TupleData};

/// The `[outbox]` section of a config file, validated.
fn outbox(toml: &str) -> OutboxConfig {
    let text =
        format!("[postgres]\nurl = \"postgres://u@h/d\"\n[kafka]\nbrokers = \"k:9092\"\n{toml}");
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
    config::load_from(Some(f.path()), &mut std::iter::empty())
        .unwrap()
        .outbox
}

fn relation(id: u32, name: &str, cols: &[(&str, u32)]) -> Relation {
    Relation {
        id,
        namespace: "public".into(),
        name: name.into(),
        replica_identity: b'd',
        columns: cols
            .iter()
            .map(|(n, oid)| Column {
                flags: 0,
                name: (*n).into(),
                type_oid: *oid,
                type_modifier: -1,
            })
            .collect(),
    }
}

fn insert(rel: u32, vals: &[Option<&str>]) -> Insert {
    Insert {
        relation_id: rel,
        tuple: TupleData {
            columns: vals
                .iter()
                .map(|v| match v {
                    Some(s) => TupleValue::Text(Bytes::copy_from_slice(s.as_bytes())),
                    None => TupleValue::Null,
                })
                .collect(),
        },
    }
}

const POS: EventPosition = EventPosition {
    commit_lsn: Lsn(0x16B3748),
    index: 2,
    commit_time: 849_315_723_000_000, // 2026-11-30T01:02:03Z
};

fn header<'a>(e: &'a OutboxEvent, name: &str) -> Option<&'a [u8]> {
    e.headers
        .iter()
        .find(|(k, _)| k.as_str() == name)
        .and_then(|(_, v)| v.as_deref())
}

const SEED_000: &[(&str, u32)] = &[
    ("id", 20),
    ("aggregate_id", 25),
    ("topic", 25),
    ("event_type", 25),
    ("payload", JSONB_OID),
];

#[test]
fn seed_schema_with_topic_column() {
    let mut m = OutboxMapper::new(&outbox(""));
    m.relation(&relation(1, "outbox", SEED_000));
    let e = m
        .map_insert(
            &insert(
                1,
                &[
                    Some("7"),
                    Some("wallet-1"),
                    Some("payments.events"),
                    Some("payment.captured"),
                    Some("{\"a\": 1}"),
                ],
            ),
            POS,
        )
        .unwrap()
        .unwrap();
    assert_eq!(&*e.topic, "payments.events");
    assert_eq!(e.key.as_deref(), Some(&b"wallet-1"[..]));
    assert_eq!(e.value.as_deref(), Some(&b"{\"a\": 1}"[..]));
    assert_eq!(header(&e, "id"), Some(&b"7"[..]));
    assert_eq!(header(&e, "event_type"), Some(&b"payment.captured"[..]));
    assert_eq!(header(&e, "walbox.commit_lsn"), Some(&b"0/16B3748"[..]));
    assert_eq!(header(&e, "walbox.index"), Some(&b"2"[..]));
    assert_eq!(header(&e, "walbox.source"), Some(e.source.as_bytes()));
    assert_eq!(&*e.source, "public.outbox");
    assert_eq!(
        e.timestamp_ms, 1_796_000_523_000,
        "record timestamp = commit time"
    );
    assert_eq!(e.partition, None);
}

#[test]
fn seed_schema_with_aggregate_type_and_bytea() {
    let mut m = OutboxMapper::new(&outbox("[outbox]\ntable = \"outbox_events\""));
    m.relation(&relation(
        9,
        "outbox_events",
        &[
            ("id", 2950),
            ("aggregate_type", 25),
            ("aggregate_id", 25),
            ("event_type", 25),
            ("payload", BYTEA_OID),
        ],
    ));
    let e = m
        .map_insert(
            &insert(
                9,
                &[
                    Some("0b6e"),
                    Some("order"),
                    Some("o-1"),
                    None,
                    Some("\\x00ff41"),
                ],
            ),
            POS,
        )
        .unwrap()
        .unwrap();
    assert_eq!(&*e.topic, "outbox.event.order");
    assert_eq!(e.value.as_deref(), Some(&[0x00, 0xff, 0x41][..]));
    assert_eq!(header(&e, "event_type"), None);
}

#[test]
fn templates_fallbacks_and_explicit_partitions() {
    let cfg = outbox(
        "[outbox]\ntopic = \"${schema}.${table}.${aggregate_type}.${event_type}\"\nfallback_topic = \"unrouted.${table}\"\n[outbox.columns]\npartition = \"part\"",
    );
    let mut m = OutboxMapper::new(&cfg);
    m.relation(&relation(
        1,
        "outbox",
        &[
            ("id", 20),
            ("aggregate_id", 25),
            ("aggregate_type", 25),
            ("event_type", 25),
            ("payload", 25),
            ("part", 23),
        ],
    ));
    let e = m
        .map_insert(
            &insert(
                1,
                &[
                    Some("1"),
                    Some("k"),
                    Some("user"),
                    Some("created"),
                    Some("x"),
                    Some("3"),
                ],
            ),
            POS,
        )
        .unwrap()
        .unwrap();
    assert_eq!(&*e.topic, "public.outbox.user.created");
    assert_eq!(e.partition, Some(3));
    let e = m
        .map_insert(
            &insert(
                1,
                &[
                    Some("1"),
                    Some("k"),
                    None,
                    Some("created"),
                    Some("x"),
                    Some("0"),
                ],
            ),
            POS,
        )
        .unwrap()
        .unwrap();
    assert_eq!(&*e.topic, "unrouted.outbox");
}

/// A NATS subject or RabbitMQ routing key per aggregate: `${aggregate_id}` is the key column.
#[test]
fn templates_route_by_aggregate_id() {
    let cfg = outbox("[outbox]\ntopic = \"outbox.${aggregate_type}.${aggregate_id}\"");
    let mut m = OutboxMapper::new(&cfg);
    m.relation(&relation(
        1,
        "outbox",
        &[
            ("id", 20),
            ("aggregate_id", 25),
            ("aggregate_type", 25),
            ("event_type", 25),
            ("payload", 25),
        ],
    ));
    let e = m
        .map_insert(
            &insert(
                1,
                &[
                    Some("1"),
                    Some("o-42"),
                    Some("order"),
                    Some("created"),
                    Some("{}"),
                ],
            ),
            POS,
        )
        .unwrap()
        .unwrap();
    assert_eq!(&*e.topic, "outbox.order.o-42");
}

#[test]
fn cloudevents_headers_and_custom_headers() {
    let cfg = outbox(
        "[outbox]\ncloudevents = true\n[outbox.headers]\ntenant_id = \"tenant\"\n[outbox.columns]\ntimestamp = \"created_at\"",
    );
    let mut m = OutboxMapper::new(&cfg);
    let mut cols = SEED_000.to_vec();
    cols.push(("tenant_id", 25));
    cols.push(("created_at", 1184));
    m.relation(&relation(1, "outbox", &cols));
    let e = m
        .map_insert(
            &insert(
                1,
                &[
                    Some("7"),
                    Some("w"),
                    Some("t"),
                    Some("paid"),
                    Some("{}"),
                    Some("acme"),
                    Some("2026-11-30 01:02:04.5+00"),
                ],
            ),
            POS,
        )
        .unwrap()
        .unwrap();
    assert_eq!(header(&e, "ce_specversion"), Some(&b"1.0"[..]));
    assert_eq!(header(&e, "ce_id"), Some(&b"7"[..]));
    assert_eq!(header(&e, "ce_type"), Some(&b"paid"[..]));
    assert_eq!(header(&e, "ce_source"), Some(&b"/walbox/public.outbox"[..]));
    assert_eq!(
        header(&e, "ce_time"),
        Some(&b"2026-11-30T01:02:04.500Z"[..])
    );
    assert_eq!(header(&e, "content-type"), Some(&b"application/json"[..]));
    assert_eq!(header(&e, "tenant"), Some(&b"acme"[..]));
    assert_eq!(e.timestamp_ms, 1_796_000_524_500);
}

#[test]
fn other_tables_are_ignored_and_unknown_relations_are_errors() {
    let mut m = OutboxMapper::new(&outbox(""));
    m.relation(&relation(2, "payments", &[("id", 20)]));
    assert_eq!(m.route_of(2), None);
    assert_eq!(m.map_insert(&insert(2, &[Some("1")]), POS).unwrap(), None);
    assert!(matches!(
        m.map_insert(&insert(3, &[Some("1")]), POS),
        Err(OutboxError::UnknownRelation(3))
    ));
}

fn invalid(r: Result<Option<OutboxEvent>, OutboxError>) -> Box<InvalidEvent> {
    match r {
        Err(OutboxError::InvalidEvent(e)) => e,
        other => panic!("expected an invalid event, got {other:?}"),
    }
}

#[test]
fn unpublishable_rows_carry_id_lsn_and_payload() {
    let mut m = OutboxMapper::new(&outbox(""));
    m.relation(&relation(
        1,
        "outbox",
        &[
            ("id", 20),
            ("aggregate_id", 25),
            ("topic", 25),
            ("payload", 25),
        ],
    ));
    for (row, why) in [
        ([Some("42"), None, Some("t"), Some("p")], "key"),
        ([Some("42"), Some("k"), None, Some("p")], "no topic"),
        ([Some("42"), Some("k"), Some("t"), None], "payload"),
        (
            [Some("42"), Some("k"), Some("bad topic!"), Some("p")],
            "not a valid Kafka topic",
        ),
    ] {
        let e = invalid(m.map_insert(&insert(1, &row), POS));
        let msg = e.to_string();
        assert!(
            msg.contains("event 42") && msg.contains("0/16B3748") && msg.contains(why),
            "{msg}"
        );
        assert_eq!(e.payload.as_deref(), row[3].map(str::as_bytes));
    }
}

#[test]
fn tombstones_when_enabled() {
    let mut m = OutboxMapper::new(&outbox("[outbox]\ntombstones = true"));
    m.relation(&relation(1, "outbox", SEED_000));
    let e = m
        .map_insert(
            &insert(1, &[Some("1"), Some("k"), Some("t"), Some("x"), None]),
            POS,
        )
        .unwrap()
        .unwrap();
    assert_eq!(e.value, None);
}

#[test]
fn a_dropped_mapped_column_makes_rows_invalid_not_the_stream() {
    let mut m = OutboxMapper::new(&outbox("[outbox.headers]\ntenant_id = \"tenant\""));
    m.relation(&relation(1, "outbox", SEED_000)); // tenant_id dropped
    let e = invalid(m.map_insert(
        &insert(1, &[Some("1"), Some("k"), Some("t"), Some("x"), Some("{}")]),
        POS,
    ));
    assert!(e.reason.contains("tenant_id"), "{}", e.reason);
}

#[test]
fn logical_messages_map_like_rows() {
    let mut m = OutboxMapper::new(&outbox("[outbox.messages]\nprefix = \"walbox.outbox\""));
    let msg = Message {
        transactional: true,
        lsn: Lsn(1),
        prefix: "walbox.outbox".into(),
        content: Bytes::from_static(
            br#"{"id": "e-1", "aggregate_type": "order", "aggregate_id": "o-9", "event_type": "placed", "payload": {"n": 1}}"#,
        ),
    };
    let e = m.map_message(&msg, POS).unwrap().unwrap();
    assert_eq!(&*e.topic, "outbox.event.order");
    assert_eq!(e.key.as_deref(), Some(&b"o-9"[..]));
    assert_eq!(
        e.value.as_deref(),
        Some(&br#"{"n": 1}"#[..]),
        "the payload exactly as sent"
    );
    assert_eq!(header(&e, "id"), Some(&b"e-1"[..]));
    let other = Message {
        prefix: "something.else".into(),
        ..msg.clone()
    };
    assert_eq!(m.map_message(&other, POS).unwrap(), None);
    let garbage = Message {
        content: Bytes::from_static(b"[1,2]"),
        ..msg
    };
    assert!(matches!(
        m.map_message(&garbage, POS),
        Err(OutboxError::InvalidEvent(_))
    ));
    m.relation(&relation(1, "outbox", SEED_000));
}

#[test]
fn bytea_hex() {
    assert_eq!(decode_bytea_hex(b"\\x").as_deref(), Some(&[][..]));
    assert_eq!(
        decode_bytea_hex(b"\\xDEad").as_deref(),
        Some(&[0xde, 0xad][..])
    );
    assert_eq!(decode_bytea_hex(b"\\x0"), None);
    assert_eq!(decode_bytea_hex(b"\\xzz"), None);
    assert_eq!(decode_bytea_hex(b"abc"), None);
}

/// Debezium's outbox table: `id`, `aggregatetype`, `aggregateid`, `type`, `payload`, a `topic`
/// column the router never reads, and a header column.
const DEBEZIUM_TABLE: &[(&str, u32)] = &[
    ("id", 2950),
    ("aggregatetype", 1043),
    ("aggregateid", 1043),
    ("type", 1043),
    ("topic", 25),
    ("payload", JSONB_OID),
    ("tenant", 25),
];

#[test]
fn debezium_compat_writes_the_event_routers_layout() {
    let headers = "[outbox.headers]\ntenant = \"tenant\"\ntype = \"eventType\"";
    let row = |tenant: Option<&'static str>| {
        [
            Some("0b6e"),
            Some("order"),
            Some("o-1"),
            Some("order.placed"),
            Some("elsewhere"),
            Some("{\"a\": 1}"),
            tenant,
        ]
    };
    let mut m = OutboxMapper::new(&outbox(&format!(
        "[outbox]\ncompat = \"debezium\"\n{headers}"
    )));
    m.relation(&relation(1, "outbox", DEBEZIUM_TABLE));
    let e = m.map_insert(&insert(1, &row(None)), POS).unwrap().unwrap();
    assert_eq!(&*e.topic, "outbox.event.order", "no topic column is read");
    assert_eq!(e.key.as_deref(), Some(&b"o-1"[..]));
    assert_eq!(header(&e, "id"), Some(&b"0b6e"[..]));
    assert_eq!(
        header(&e, "event_type"),
        None,
        "the router adds no type header"
    );
    assert_eq!(header(&e, "eventType"), Some(&b"order.placed"[..]));
    let tenant: Vec<_> = e
        .headers
        .iter()
        .filter(|(k, _)| k.as_str() == "tenant")
        .collect();
    assert_eq!(
        tenant.len(),
        1,
        "a NULL header column is a header with a null value"
    );
    assert_eq!(tenant[0].1, None);
    let e = m
        .map_insert(&insert(1, &row(Some("t-1"))), POS)
        .unwrap()
        .unwrap();
    assert_eq!(header(&e, "tenant"), Some(&b"t-1"[..]));

    // walbox's own layout leaves a NULL header column out and reads the topic column.
    let mut m = OutboxMapper::new(&outbox(&format!(
        "[outbox.columns]\naggregate_id = \"aggregateid\"\naggregate_type = \"aggregatetype\"\nevent_type = \"type\"\n{headers}"
    )));
    m.relation(&relation(1, "outbox", DEBEZIUM_TABLE));
    let e = m.map_insert(&insert(1, &row(None)), POS).unwrap().unwrap();
    assert_eq!(&*e.topic, "elsewhere");
    assert_eq!(header(&e, "event_type"), Some(&b"order.placed"[..]));
    assert!(e.headers.iter().all(|(k, _)| k.as_str() != "tenant"));
}

/// Debezium's table with a text payload (the router's blank-payload rule reads it as text).
const DEBEZIUM_TEXT_PAYLOAD: &[(&str, u32)] = &[
    ("id", 2950),
    ("aggregatetype", 1043),
    ("aggregateid", 1043),
    ("type", 1043),
    ("payload", 25),
];

#[test]
fn debezium_compat_tombstones_blank_payloads_as_the_router_does() {
    let mut m = OutboxMapper::new(&outbox(
        "[outbox]\ncompat = \"debezium\"\ntombstones = true",
    ));
    m.relation(&relation(1, "outbox", DEBEZIUM_TEXT_PAYLOAD));
    let value = |payload: Option<&str>| {
        m.map_insert(
            &insert(
                1,
                &[Some("0b6e"), Some("order"), Some("o-1"), Some("t"), payload],
            ),
            POS,
        )
        .unwrap()
        .unwrap()
        .value
    };
    for blank in [None, Some(""), Some("   "), Some("\t\r\n \u{1f}")] {
        assert_eq!(value(blank), None, "{blank:?} is a tombstone");
    }
    // Java's trim keeps U+00A0 and other non-ASCII blanks.
    for kept in [" x ", "\u{a0}", " \u{3000} "] {
        assert_eq!(value(Some(kept)).as_deref(), Some(kept.as_bytes()));
    }
    // A bytea payload reaches the router as bytes, never blank.
    let bytea: Vec<(&str, u32)> = DEBEZIUM_TEXT_PAYLOAD
        .iter()
        .map(|&(n, t)| (n, if n == "payload" { BYTEA_OID } else { t }))
        .collect();
    m.relation(&relation(2, "outbox", &bytea));
    let e = m
        .map_insert(
            &insert(
                2,
                &[
                    Some("0b6e"),
                    Some("order"),
                    Some("o-1"),
                    Some("t"),
                    Some("\\x20"),
                ],
            ),
            POS,
        )
        .unwrap()
        .unwrap();
    assert_eq!(e.value.as_deref(), Some(&b" "[..]));
    // Without tombstones, or in walbox's own layout, a blank payload is sent as it is.
    for toml in [
        "[outbox]\ncompat = \"debezium\"",
        "[outbox]\ntombstones = true\n[outbox.columns]\naggregate_id = \"aggregateid\"\naggregate_type = \"aggregatetype\"",
    ] {
        let mut m = OutboxMapper::new(&outbox(toml));
        m.relation(&relation(1, "outbox", DEBEZIUM_TEXT_PAYLOAD));
        let e = m
            .map_insert(
                &insert(
                    1,
                    &[
                        Some("0b6e"),
                        Some("order"),
                        Some("o-1"),
                        Some("t"),
                        Some("  "),
                    ],
                ),
                POS,
            )
            .unwrap()
            .unwrap();
        assert_eq!(e.value.as_deref(), Some(&b"  "[..]), "{toml}");
    }
}

#[test]
fn debezium_compat_sends_a_null_key_column_as_a_null_key() {
    let row = [Some("0b6e"), Some("order"), None, Some("t"), Some("{}")];
    let mut m = OutboxMapper::new(&outbox("[outbox]\ncompat = \"debezium\""));
    m.relation(&relation(1, "outbox", DEBEZIUM_TEXT_PAYLOAD));
    let e = m.map_insert(&insert(1, &row), POS).unwrap().unwrap();
    assert_eq!(e.key, None);
    assert_eq!(e.value.as_deref(), Some(&b"{}"[..]));
    // walbox's own layout refuses it.
    let mut m = OutboxMapper::new(&outbox("[outbox.columns]\naggregate_id = \"aggregateid\""));
    m.relation(&relation(1, "outbox", DEBEZIUM_TEXT_PAYLOAD));
    assert!(invalid(m.map_insert(&insert(1, &row), POS))
        .reason
        .contains("(key) is NULL"));
}

#[test]
fn debezium_compat_writes_json_converter_bytes() {
    let cols: &[(&str, u32)] = &[
        ("id", 2950),
        ("aggregatetype", 1043),
        ("aggregateid", 1043),
        ("type", 1043),
        ("payload", JSONB_OID),
    ];
    let toml = "[outbox]\ncompat = \"debezium\"\nexpand_json_payload = true\n\
                [outbox.converters]\nkey = \"json\"\nvalue = \"json\"\nvalue_schemas = false";
    let mut m = OutboxMapper::new(&outbox(toml));
    m.set_not_null(vec![vec!["id".into(), "aggregateid".into()]]);
    m.relation(&relation(1, "outbox", cols));
    let row = |payload: Option<&'static str>| {
        [
            Some("0f8fad5b-d9cb-469f-a165-70867728950e"),
            Some("order"),
            Some("o-1"),
            Some("t"),
            payload,
        ]
    };
    let e = m
        .map_insert(
            &insert(1, &row(Some("{\"a\": null, \"x\": 0.0000001}"))),
            POS,
        )
        .unwrap()
        .unwrap();
    assert_eq!(
        e.key.as_deref(),
        Some(&b"{\"schema\":{\"type\":\"string\",\"optional\":false},\"payload\":\"o-1\"}"[..])
    );
    assert_eq!(e.value.as_deref(), Some(&b"{\"x\":1.0E-7}"[..]));
    // A NULL payload without tombstones is JsonConverter's null, not an invalid row.
    let e = m.map_insert(&insert(1, &row(None)), POS).unwrap().unwrap();
    assert_eq!(e.value.as_deref(), Some(&b"null"[..]));
    // A payload Debezium's task fails on (a top-level array under expansion) is the row's
    // fault, with the reason.
    assert!(invalid(m.map_insert(&insert(1, &row(Some("[1, 2]"))), POS))
        .reason
        .contains("JsonConverter"));
}
