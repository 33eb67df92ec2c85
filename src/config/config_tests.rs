use super::fixture::{env, file};
use super::*;
use crate::dead_letter::Policy;
use std::path::Path;
use std::time::Duration;

const MINIMAL: &str = r#"
[postgres]
url = "postgres://walbox:secret@db:5432/app"
[kafka]
brokers = "k1:9092"
"#;

#[test]
fn defaults_follow_the_seed_schema() {
    let f = file(MINIMAL);
    let c = load_from(Some(f.path()), &mut std::iter::empty()).unwrap();
    assert_eq!(c.postgres.slot, "walbox");
    let t = c.outbox.table("public", "outbox").expect("default table");
    assert_eq!(t.columns.aggregate_id, "aggregate_id");
    assert_eq!(t.topic, "outbox.event.${aggregate_type}");
    assert_eq!(t.format, ValueFormat::Raw);
    assert_eq!(t.on_invalid, Policy::Fail);
    assert!(c.outbox.messages.is_none());
    assert_eq!(c.relay.max_in_flight, 10_000);
    assert_eq!(c.postgres.status_interval, Duration::from_secs(1));
}

#[test]
fn environment_wins_over_the_file() {
    let f = file(MINIMAL);
    let c = load_from(
        Some(f.path()),
        &mut env(&[
            ("WALBOX_KAFKA_BROKERS", "k9:9092"),
            ("WALBOX_POSTGRES_CREATE_SLOT", "true"),
            ("WALBOX_OUTBOX_TABLE", "events.outbox_events"),
            ("WALBOX_OUTBOX_COLUMNS_PAYLOAD", "body"),
            ("WALBOX_RELAY_MAX_IN_FLIGHT", "5"),
            ("WALBOX_KAFKA_PROPERTY_COMPRESSION_TYPE", "lz4"),
            ("UNRELATED", "x"),
        ])
        .into_iter(),
    )
    .unwrap();
    assert_eq!(c.kafka.brokers, "k9:9092");
    assert!(c.postgres.create_slot);
    let t = c
        .outbox
        .table("events", "outbox_events")
        .expect("table from env");
    assert_eq!(t.columns.payload, "body");
    assert_eq!(c.relay.max_in_flight, 5);
    assert_eq!(
        c.kafka
            .properties
            .get("compression.type")
            .map(String::as_str),
        Some("lz4")
    );
}

#[test]
fn environment_alone_is_enough() {
    let c = load_from(
        None,
        &mut env(&[
            ("WALBOX_POSTGRES_URL", "postgres://u@h/d"),
            ("WALBOX_KAFKA_BROKERS", "k:9092"),
        ])
        .into_iter(),
    )
    .unwrap();
    assert_eq!(c.kafka.brokers, "k:9092");
}

#[test]
fn unknown_keys_are_rejected() {
    let f = file(&format!("{MINIMAL}\n[outbox]\ntabel = \"x\"\n"));
    let e = load_from(Some(f.path()), &mut std::iter::empty()).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("tabel"), "{msg}");
    assert!(!msg.contains('\n'), "one line: {msg}");
}

#[test]
fn missing_required_settings_say_how_to_set_them() {
    let e = load_from(None, &mut std::iter::empty()).unwrap_err();
    assert!(e.to_string().contains("WALBOX_POSTGRES_URL"), "{e}");
}

#[test]
fn weakening_delivery_guarantees_is_refused() {
    let f = file(&format!(
        "{MINIMAL}\n[kafka.properties]\n\"enable.idempotence\" = \"false\"\n"
    ));
    let e = load_from(Some(f.path()), &mut std::iter::empty()).unwrap_err();
    assert!(e.to_string().contains("enable.idempotence"), "{e}");
    let f = file(&format!("{MINIMAL}\n[kafka.properties]\nacks = \"1\"\n"));
    assert!(load_from(Some(f.path()), &mut std::iter::empty()).is_err());
}

#[test]
fn bad_values_are_one_line_errors() {
    for (var, val) in [
        ("WALBOX_POSTGRES_CREATE_SLOT", "maybe"),
        ("WALBOX_RELAY_MAX_IN_FLIGHT", "lots"),
        ("WALBOX_RELAY_SHUTDOWN_TIMEOUT", "soon"),
        ("WALBOX_HTTP_LISTEN", "port 80"),
        ("WALBOX_POSTGRES_SLOT", "Bad-Slot"),
        ("WALBOX_LOG_FORMAT", "xml"),
    ] {
        let f = file(MINIMAL);
        let e = load_from(Some(f.path()), &mut env(&[(var, val)]).into_iter()).unwrap_err();
        let msg = e.to_string();
        assert!(
            !msg.contains('\n') && !msg.contains("secret"),
            "{var}: {msg}"
        );
    }
}

#[test]
fn secrets_stay_out_of_debug_output() {
    let f = file(&format!(
        "{MINIMAL}\n[kafka.properties]\n\"sasl.password\" = \"hunter2\"\n"
    ));
    let c = load_from(Some(f.path()), &mut std::iter::empty()).unwrap();
    let dbg = format!("{c:?}");
    assert!(!dbg.contains("hunter2") && !dbg.contains("secret"), "{dbg}");
}

#[test]
fn the_shipped_example_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/walbox.toml");
    let c = load_from(Some(&path), &mut std::iter::empty()).unwrap();
    assert_eq!(c.kafka.brokers, "kafka-1:9092,kafka-2:9092,kafka-3:9092");
    assert_eq!(c.relay.max_in_flight, 10_000);
}

#[test]
fn slot_and_alert_settings() {
    let f = file(&format!(
        "{MINIMAL}\n[slot]\ncheck_interval = \"2s\"\nwarning_bytes = \"1GB\"\nheartbeat_interval = \"30s\"\n[alerts]\nwebhook_url = \"http://am:9093/hook\"\n"
    ));
    let c = load_from(
        Some(f.path()),
        &mut env(&[("WALBOX_SLOT_CRITICAL_RATIO", "0.9")]).into_iter(),
    )
    .unwrap();
    assert_eq!(c.slot.check_interval, Duration::from_secs(2));
    assert_eq!(c.slot.warning_bytes, 1 << 30);
    assert_eq!(c.slot.critical_ratio, 0.9);
    assert_eq!(c.slot.heartbeat_interval, Some(Duration::from_secs(30)));
    assert_eq!(c.alerts.webhook_url.as_deref(), Some("http://am:9093/hook"));
    let c = load_from(Some(file(MINIMAL).path()), &mut std::iter::empty()).unwrap();
    assert_eq!(c.slot.heartbeat_interval, None);
    assert_eq!(c.slot.warning_ratio, 0.5);
    let e = load_from(
        Some(file(MINIMAL).path()),
        &mut env(&[("WALBOX_SLOT_WARNING_RATIO", "0.95")]).into_iter(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("warning_ratio"), "{e}");
}

#[test]
fn more_outbox_tables_than_one_walbox_relays_are_refused() {
    let tables = |n: usize| {
        (0..n)
            .map(|i| format!("[[outbox.tables]]\ntable = \"outbox_{i}\"\n"))
            .collect::<String>()
    };
    let f = file(&format!(
        "{MINIMAL}{}",
        tables(crate::config::MAX_OUTBOX_TABLES)
    ));
    let c = load_from(Some(f.path()), &mut std::iter::empty()).unwrap();
    assert_eq!(c.outbox.tables.len(), crate::config::MAX_OUTBOX_TABLES);
    let f = file(&format!(
        "{MINIMAL}{}",
        tables(crate::config::MAX_OUTBOX_TABLES + 1)
    ));
    let e = load_from(Some(f.path()), &mut std::iter::empty()).unwrap_err();
    assert!(e.to_string().contains("at most 1000"), "{e}");
}

#[test]
fn several_tables_and_messages() {
    let f = file(&format!(
        "{MINIMAL}
[[outbox.tables]]
table = \"outbox\"
[[outbox.tables]]
table = \"billing.outbox_events\"
topic = \"billing.${{event_type}}\"
fallback_topic = \"billing.unrouted\"
format = \"json\"
on_invalid = \"dead_letter\"
[outbox.tables.columns]
payload = \"body\"
[outbox.tables.headers]
tenant_id = \"tenant\"
[outbox.messages]
prefix = \"app.events\"
format = \"protobuf\"
"
    ));
    let c = load_from(Some(f.path()), &mut std::iter::empty()).unwrap();
    assert_eq!(c.outbox.tables.len(), 2);
    let b = c.outbox.table("billing", "outbox_events").unwrap();
    assert_eq!(b.topic, "billing.${event_type}");
    assert_eq!(b.format, ValueFormat::Json);
    assert_eq!(
        b.on_invalid,
        Policy::DeadLetter("walbox.dead_letter".into())
    );
    assert_eq!(b.headers, vec![("tenant_id".into(), "tenant".into())]);
    assert_eq!(b.columns.payload, "body");
    let m = c.outbox.messages.as_ref().unwrap();
    assert_eq!(
        m.source,
        RouteSource::Messages {
            prefix: "app.events".into()
        }
    );
    assert_eq!(m.format, ValueFormat::Protobuf);
}

#[test]
fn bad_routes_are_one_line_errors() {
    for (extra, needle) in [
        ("[outbox]\ntopic = \"x.${{nope}}\"", "unknown variable"),
        ("[outbox]\nformat = \"avro\"", "format"),
        ("[outbox]\non_invalid = \"skip\"", "on_invalid"),
        (
            "[outbox]\ntable = \"a\"\n[[outbox.tables]]\ntable = \"b\"",
            "either",
        ),
        (
            "[[outbox.tables]]\ntable = \"a\"\n[[outbox.tables]]\ntable = \"a\"",
            "twice",
        ),
        // (Single braces: `extra` is not a format string. With `{{` this was a TOML syntax
        // error, found only because toml's message quoted the line.)
        (
            "[outbox]\nenvelope = { x = \"y\" }",
            "envelope needs format",
        ),
        ("[outbox.messages]\ntable = \"x\"", "prefix"),
    ] {
        let f = file(&format!("{MINIMAL}\n{extra}\n"));
        let e = load_from(Some(f.path()), &mut std::iter::empty())
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle) && !e.contains('\n'), "{extra}: {e}");
    }
}

#[test]
fn toml_syntax_errors_give_the_position_but_never_the_line() {
    for (text, position) in [
        (
            "[postgres]\nurl = \"postgres://walbox:hunter2@db/app\n",
            "line 2, column",
        ),
        (
            "[kafka.properties]\n\"sasl.password\" = hunter2\n",
            "line 2, column 19",
        ),
    ] {
        let f = file(text);
        let e = load_from(Some(f.path()), &mut std::iter::empty())
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
        assert!(
            e.contains(position) && e.contains("TOML syntax error"),
            "{e}"
        );
        assert!(!e.contains('\n'), "one line: {e}");
    }
}

#[test]
fn kafka_properties_are_checked_at_load_time_without_showing_values() {
    // A misspelt property, from the file or the environment: named, its value never shown.
    let f = file(&format!(
        "{MINIMAL}\n[kafka.properties]\n\"sasl.pasword\" = \"hunter2\"\n"
    ));
    let e = load_from(Some(f.path()), &mut std::iter::empty())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"sasl.pasword\"")
            && e.contains("WALBOX_KAFKA_PROPERTY_SASL_PASWORD")
            && e.contains("not a librdkafka property")
            && !e.contains("hunter2"),
        "{e}"
    );
    let e = load_from(
        Some(file(MINIMAL).path()),
        &mut env(&[("WALBOX_KAFKA_PROPERTY_SSL_KEY_PASWORD", "hunter2")]).into_iter(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("ssl.key.pasword") && !e.contains("hunter2"),
        "{e}"
    );
    // An invalid value of an ordinary property: librdkafka's reason is given.
    let e = load_from(
        Some(file(MINIMAL).path()),
        &mut env(&[("WALBOX_KAFKA_PROPERTY_LINGER_MS", "soon")]).into_iter(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("linger.ms") && e.contains("refuses: Invalid value"),
        "{e}"
    );
    // Numbers and booleans are taken as librdkafka's text; other types are refused unquoted.
    let f = file(&format!(
        "{MINIMAL}\n[kafka.properties]\n\"linger.ms\" = 20\n\"enable.idempotence\" = true\n"
    ));
    let c = load_from(Some(f.path()), &mut std::iter::empty()).unwrap();
    assert_eq!(c.kafka.properties["linger.ms"], "20");
    assert_eq!(c.kafka.properties["enable.idempotence"], "true");
    let f = file(&format!(
        "{MINIMAL}\n[kafka.properties]\n\"sasl.password\" = [\"hunter2\"]\n"
    ));
    let e = load_from(Some(f.path()), &mut std::iter::empty())
        .unwrap_err()
        .to_string();
    assert!(e.contains("sasl.password") && !e.contains("hunter2"), "{e}");
}

#[test]
fn a_webhook_url_is_never_quoted() {
    let f = file(&format!(
        "{MINIMAL}\n[alerts]\nwebhook_url = \"hooks.example.com/T0/hunter2\"\n"
    ));
    let e = load_from(Some(f.path()), &mut std::iter::empty())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("alerts.webhook_url") && !e.contains("hunter2"),
        "{e}"
    );
}

#[test]
fn log_levels_must_be_levels() {
    let load = |vars: &[(&str, &str)]| {
        load_from(Some(file(MINIMAL).path()), &mut env(vars).into_iter()).map(|c| c.log.level)
    };
    for good in [
        "info",
        "WARN",
        "info,librdkafka=warn,rdkafka=warn",
        "warn,walbox=debug",
        "walbox::relay=trace",
        "off",
    ] {
        assert_eq!(load(&[("WALBOX_LOG_LEVEL", good)]).unwrap(), good);
    }
    for (bad, needle) in [
        ("warning", "\"warning\" is not a level"),
        ("info,walbox", "\"walbox\" is not a level"),
        ("walbox=loud", "does not end with a level"),
        ("", "empty"),
        (" , ", "empty"),
    ] {
        let e = load(&[("WALBOX_LOG_LEVEL", bad)]).unwrap_err().to_string();
        assert!(
            e.contains("log.level") && e.contains(needle),
            "{bad:?}: {e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }
    // The WALBOX_LOG override is checked the same way.
    assert!(load(&[("WALBOX_LOG", "debug,librdkafka=warn")]).is_ok());
    let e = load(&[("WALBOX_LOG", "warning")]).unwrap_err().to_string();
    assert!(e.contains("WALBOX_LOG") && e.contains("not a level"), "{e}");
}

#[test]
fn unknown_walbox_variables_are_errors_naming_them() {
    let load = |vars: &[(&str, &str)]| {
        load_from(Some(file(MINIMAL).path()), &mut env(vars).into_iter())
            .map(drop)
            .map_err(|e| e.to_string())
    };
    let e = load(&[("WALBOX_POSTGRES_SLOTT", "typo")]).unwrap_err();
    assert!(
        e.contains("unknown environment variable WALBOX_POSTGRES_SLOTT")
            && e.contains("did you mean WALBOX_POSTGRES_SLOT?")
            && !e.contains("typo"),
        "{e}"
    );
    // The value is never shown: it may be a secret.
    let e = load(&[("WALBOX_POSTGRES_URLL", "postgres://u:hunter2@h/d")]).unwrap_err();
    assert!(
        e.contains("WALBOX_POSTGRES_URLL") && !e.contains("hunter2"),
        "{e}"
    );
    let e = load(&[("WALBOX_OUTBOX_MESSAGES_PREFIX", "x")]).unwrap_err();
    assert!(e.contains("WALBOX_OUTBOX_MESSAGES_PREFIX"), "{e}");
    // Only the version cache's own variables are accepted, not a WALBOX_PG_ namespace.
    let e = load(&[("WALBOX_PG_URL", "postgres://u@h/d")]).unwrap_err();
    assert!(
        e.contains("unknown environment variable WALBOX_PG_URL"),
        "{e}"
    );
    // walbox inbox's are WALBOX_INBOX_*, not every name that begins like it.
    let e = load(&[("WALBOX_INBOXX_URL", "x")]).unwrap_err();
    assert!(
        e.contains("unknown environment variable WALBOX_INBOXX_URL"),
        "{e}"
    );
    // Not settings, or not walbox run's: accepted.
    load(&[
        ("WALBOX_CONFIG", "/etc/walbox.toml"),
        ("WALBOX_LOG", "info"),
        ("WALBOX_INBOX_POSTGRES_URL", "postgres://u@h/d"),
        ("WALBOX_INBOX_ANYTHING", "x"),
        ("WALBOX_TEST_KAFKA_BROKERS", "k:9092"),
        ("WALBOX_BENCH_QUICK", "1"),
        ("WALBOX_PG_CACHE", "/var/cache/walbox/postgresql"),
        ("WALBOX_PG_MAJORS", "13 18"),
        ("WALBOX_KAFKA_CACHE", "/var/cache/walbox/kafka"),
        ("WALBOX_KAFKA_VERSION", "4.3.0"),
        ("WALBOX_DEBEZIUM_CACHE", "/var/cache/walbox/debezium"),
        ("WALBOXER", "x"),
        ("OTHER_WALBOX_X", "x"),
        ("WALBOX_KAFKA_PROPERTY_COMPRESSION_TYPE", "lz4"),
    ])
    .unwrap();
}

#[test]
fn max_in_flight_may_not_exceed_the_producers_queue() {
    let over = |extra: &str| {
        let f = file(&format!("{MINIMAL}{extra}"));
        load_from(Some(f.path()), &mut std::iter::empty())
    };
    let e = over("[relay]\nmax_in_flight = 200000\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("relay.max_in_flight (200000)") && e.contains("= 100000"),
        "librdkafka's default queue is the bound: {e}"
    );
    let e = over("[relay]\nmax_in_flight = 600\n[kafka.properties]\n\"queue.buffering.max.messages\" = \"500\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("queue.buffering.max.messages = 500"), "{e}");
    let c = over("[relay]\nmax_in_flight = 500\n[kafka.properties]\n\"queue.buffering.max.messages\" = \"500\"\n")
        .unwrap();
    assert_eq!(c.relay.max_in_flight, 500);
    // Shards share one producer: a queue the user sized must hold every shard's window.
    let sharded = |shards: &str, extra: &str| {
        let f = file(&format!("{MINIMAL}{extra}"));
        load_from(
            Some(f.path()),
            &mut env(&[("WALBOX_POSTGRES_SHARDS", shards)]).into_iter(),
        )
    };
    let queue = |n: u32| {
        format!("[relay]\nmax_in_flight = 500\n[kafka.properties]\n\"queue.buffering.max.messages\" = \"{n}\"\n")
    };
    let e = sharded("4", &queue(1500)).unwrap_err().to_string();
    assert!(e.contains("500 × 4") && e.contains("= 1500"), "{e}");
    assert_eq!(sharded("4", &queue(2000)).unwrap().postgres.shards, 4);
    // Unset, walbox sizes it: 64 shards of the default window are accepted.
    assert!(sharded("64", "").is_ok());
    // librdkafka's default while it is large enough, else every shard's window; a queue the
    // user set is kept; one relay keeps librdkafka's own default.
    let sized = |c: Config| {
        c.kafka
            .properties
            .get("queue.buffering.max.messages")
            .cloned()
    };
    assert_eq!(sized(sharded("4", "").unwrap()).as_deref(), Some("100000"));
    assert_eq!(sized(sharded("64", "").unwrap()).as_deref(), Some("640000"));
    let set = "[kafka.properties]\n\"queue.buffering.max.messages\" = \"2000000\"\n";
    assert_eq!(
        sized(sharded("64", set).unwrap()).as_deref(),
        Some("2000000")
    );
    assert_eq!(sized(over("").unwrap()), None);
}

#[test]
fn the_primary_of_a_standby_is_optional_and_never_shown() {
    let f = file(MINIMAL);
    let c = load_from(Some(f.path()), &mut std::iter::empty()).unwrap();
    assert!(c.postgres.primary.is_none());
    let primary = "postgres://walbox:hunter2@primary:5432/app";
    let c = load_from(
        Some(f.path()),
        &mut env(&[("WALBOX_POSTGRES_PRIMARY_URL", primary)]).into_iter(),
    )
    .unwrap();
    let p = c
        .postgres
        .primary
        .as_ref()
        .expect("primary_url from the environment");
    assert!(p.to_string().contains("@primary:5432/app"), "{p}");
    assert_eq!(p.password.as_deref(), Some("hunter2"));
    let dbg = format!("{c:?}");
    assert!(!dbg.contains("hunter2"), "{dbg}");
    let f = file(&MINIMAL.replace(
        "[kafka]",
        "primary_url = \"host=primary user=walbox password=hunter2 sslmode=sometimes\"\n[kafka]",
    ));
    let e = load_from(Some(f.path()), &mut std::iter::empty())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("postgres.primary_url") && !e.contains("hunter2") && !e.contains('\n'),
        "{e}"
    );
}

#[test]
fn exactly_once_is_off_by_default_and_its_bounds_need_it() {
    let base = [
        ("WALBOX_POSTGRES_URL", "postgres://u@h/d"),
        ("WALBOX_KAFKA_BROKERS", "k:9092"),
    ];
    let load = |extra: &[(&str, &str)]| {
        let mut pairs = base.to_vec();
        pairs.extend_from_slice(extra);
        load_from(None, &mut env(&pairs).into_iter())
    };
    assert_eq!(load(&[]).unwrap().kafka.exactly_once, None);
    let on = load(&[("WALBOX_KAFKA_EXACTLY_ONCE", "true")]).unwrap();
    assert_eq!(on.kafka.exactly_once, Some(ExactlyOnce::default()));
    let tuned = load(&[
        ("WALBOX_KAFKA_EXACTLY_ONCE", "true"),
        ("WALBOX_KAFKA_TRANSACTION_MAX_EVENTS", "500"),
        ("WALBOX_KAFKA_TRANSACTION_INTERVAL", "1s"),
        ("WALBOX_KAFKA_TRANSACTION_MAX_BYTES", "64kB"),
    ])
    .unwrap();
    assert_eq!(
        tuned.kafka.exactly_once,
        Some(ExactlyOnce {
            max_events: 500,
            interval: Duration::from_secs(1),
            max_bytes: 64 << 10,
            timeout: Duration::from_secs(60),
        })
    );
    // The interval must be shorter than the transaction timeout (librdkafka's default 60 s).
    for (interval, timeout) in [
        ("60s", None),
        ("10s", Some("10000")),
        ("11s", Some("10000")),
    ] {
        let mut pairs = vec![
            ("WALBOX_KAFKA_EXACTLY_ONCE", "true"),
            ("WALBOX_KAFKA_TRANSACTION_INTERVAL", interval),
        ];
        pairs.extend(timeout.map(|t| ("WALBOX_KAFKA_PROPERTY_TRANSACTION_TIMEOUT_MS", t)));
        let e = load(&pairs).unwrap_err().to_string();
        assert!(
            e.contains("must be shorter than the kafka transaction timeout"),
            "{e}"
        );
    }
    let short = load(&[
        ("WALBOX_KAFKA_EXACTLY_ONCE", "true"),
        ("WALBOX_KAFKA_TRANSACTION_INTERVAL", "9s"),
        ("WALBOX_KAFKA_PROPERTY_TRANSACTION_TIMEOUT_MS", "10000"),
    ])
    .unwrap();
    assert_eq!(
        short.kafka.exactly_once.map(|e| e.timeout),
        Some(Duration::from_secs(10))
    );
    let e = load(&[
        ("WALBOX_KAFKA_EXACTLY_ONCE", "true"),
        ("WALBOX_KAFKA_PROPERTY_TRANSACTION_TIMEOUT_MS", "soon"),
    ])
    .unwrap_err()
    .to_string();
    assert!(e.contains("transaction.timeout.ms"), "{e}");
    let e = load(&[("WALBOX_KAFKA_TRANSACTION_INTERVAL", "1s")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("kafka.exactly_once = true"), "{e}");
    let e = load(&[
        ("WALBOX_KAFKA_EXACTLY_ONCE", "true"),
        ("WALBOX_KAFKA_TRANSACTION_INTERVAL", "0s"),
    ])
    .unwrap_err()
    .to_string();
    assert!(e.contains("kafka.transaction_interval"), "{e}");
    for bytes in ["1000", "2GB"] {
        let e = load(&[
            ("WALBOX_KAFKA_EXACTLY_ONCE", "true"),
            ("WALBOX_KAFKA_TRANSACTION_MAX_BYTES", bytes),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("kafka.transaction_max_bytes"), "{e}");
    }
    let e = load(&[("WALBOX_KAFKA_TRANSACTION_MAX_BYTES", "1MB")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("kafka.exactly_once = true"), "{e}");
    let e = load(&[("WALBOX_KAFKA_PROPERTY_TRANSACTIONAL_ID", "mine")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("derives it from the slot"), "{e}");
}

#[test]
fn a_failover_slot_with_several_hosts_reaches_the_primary_only() {
    use crate::config::target::SessionAttrs;
    let load = |url: &str, failover: &str| {
        load_from(
            None,
            &mut env(&[
                ("WALBOX_POSTGRES_URL", url),
                ("WALBOX_KAFKA_BROKERS", "k1:9092"),
                ("WALBOX_POSTGRES_FAILOVER_SLOT", failover),
            ])
            .into_iter(),
        )
    };
    let two = "postgres://walbox:secret@db-a:5432,db-b:5432/app";
    let attrs = |c: Config| c.postgres.conn.target_session_attrs;
    assert_eq!(attrs(load(two, "true").unwrap()), SessionAttrs::ReadWrite);
    assert_eq!(attrs(load(two, "false").unwrap()), SessionAttrs::Any);
    let one = "postgres://walbox:secret@db-a:5432/app";
    assert_eq!(attrs(load(one, "true").unwrap()), SessionAttrs::Any);
    let primary = format!("{two}?target_session_attrs=primary");
    assert_eq!(
        attrs(load(&primary, "true").unwrap()),
        SessionAttrs::Primary
    );
    let standby = format!("{two}?target_session_attrs=prefer-standby");
    let e = load(&standby, "true").unwrap_err().to_string();
    assert!(
        e.contains("target_session_attrs=read-write") && !e.contains("secret"),
        "{e}"
    );
}

#[test]
fn a_refused_property_file_is_named_by_its_file_key_without_its_content() {
    let secret = file("verysecret-not-a-number\n");
    let path = secret.path().display().to_string();
    let from_file = file(&format!(
        "{MINIMAL}\n[kafka.property_files]\n\"linger.ms\" = {path:?}\n"
    ));
    let minimal = file(MINIMAL);
    let from_env = env(&[("WALBOX_KAFKA_PROPERTY_FILE_LINGER_MS", path.as_str())]);
    for (config, mut vars) in [(from_file.path(), Vec::new()), (minimal.path(), from_env)] {
        let e = load_from(Some(config), &mut vars.drain(..))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("kafka.property_files.linger.ms")
                && e.contains("WALBOX_KAFKA_PROPERTY_FILE_LINGER_MS")
                && e.contains(&path)
                && e.contains("refuses")
                && !e.contains("kafka.properties")
                && !e.contains("verysecret"),
            "{e}"
        );
    }
}

#[test]
fn outbox_compat_picks_the_routers_column_defaults() {
    let load = |toml: &str| {
        load_from(
            Some(file(&format!("{MINIMAL}{toml}")).path()),
            &mut std::iter::empty(),
        )
    };
    let c = load("[outbox]\ncompat = \"debezium\"").unwrap();
    let cols = &c.outbox.tables[0].columns;
    assert_eq!(
        (
            cols.id.as_str(),
            cols.aggregate_id.as_str(),
            cols.aggregate_type.as_str()
        ),
        ("id", "aggregateid", "aggregatetype")
    );
    assert_eq!(
        (cols.event_type.as_str(), cols.payload.as_str()),
        ("type", "payload")
    );
    assert_eq!(cols.topic, None);
    let c = load("[outbox]\ncompat = \"debezium\"\n[outbox.columns]\ntopic = \"dest\"").unwrap();
    assert_eq!(c.outbox.tables[0].columns.topic.as_deref(), Some("dest"));
    let c = load("").unwrap();
    assert_eq!(c.outbox.tables[0].columns.topic.as_deref(), Some("topic"));
    let e = load("[outbox]\ncompat = \"kafka-connect\"")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("outbox.compat \"kafka-connect\" must be \"walbox\" or \"debezium\""),
        "{e}"
    );
}

#[test]
fn the_configuration_doc_names_every_variable_walbox_run_leaves_alone() {
    let doc = include_str!("../../docs/configuration.md");
    let layout = &super::document::LAYOUT;
    let names = layout
        .accepted
        .iter()
        .map(|v| format!("`{v}`"))
        .chain(layout.others.iter().map(|p| format!("`{p}_*`")))
        .chain(layout.foreign.iter().map(|p| match p.strip_suffix('_') {
            Some(namespace) => format!("`{namespace}_*`"),
            None => format!("`{p}`"),
        }));
    for name in names {
        assert!(
            doc.contains(&name),
            "docs/configuration.md does not name {name}, which walbox run accepts"
        );
    }
}

#[test]
fn a_debezium_route_takes_connects_record_size_and_converters() {
    let load = |extra: &str| {
        let f = file(&format!("{MINIMAL}{extra}"));
        load_from(Some(f.path()), &mut std::iter::empty())
    };
    let c = load("[outbox]\ncompat = \"debezium\"\n").unwrap();
    assert_eq!(
        c.kafka
            .properties
            .get("message.max.bytes")
            .map(String::as_str),
        Some("1048576")
    );
    let c = load("[outbox]\ncompat = \"debezium\"\n[kafka.properties]\n\"message.max.bytes\" = \"2000000\"\n");
    assert_eq!(
        c.unwrap()
            .kafka
            .properties
            .get("message.max.bytes")
            .map(String::as_str),
        Some("2000000")
    );
    assert!(!load("")
        .unwrap()
        .kafka
        .properties
        .contains_key("message.max.bytes"));
    // Converters belong to the compatibility mode, schemas to the JSON converter.
    for (extra, says) in [
        ("[outbox.converters]\nvalue = \"json\"\n", "needs compat"),
        (
            "[outbox]\ncompat = \"debezium\"\n[outbox.converters]\nkey_schemas = false\n",
            "needs converters.key",
        ),
        (
            "[outbox]\ncompat = \"debezium\"\n[outbox.converters]\nvalue = \"avro\"\n",
            "must be \"string\" or \"json\"",
        ),
        (
            "[outbox]\ncompat = \"debezium\"\njson_payload_null_behavior = \"optional_bytes\"\n",
            "expand_json_payload = true",
        ),
        (
            "[outbox]\ncompat = \"debezium\"\nformat = \"json\"\n",
            "format must be \"raw\"",
        ),
    ] {
        let e = load(extra).unwrap_err().to_string();
        assert!(e.contains(says), "{extra}: {e}");
    }
}
