use super::*;
use crate::config::fixture::{env, file};

const MINIMAL: &str = r#"
[postgres]
url = "postgres://billing:secret@db:5432/billing"
[kafka]
brokers = "k1:9092"
group_id = "billing"
topics = ["outbox.event.payment"]
[effect]
sql = "SELECT billing.apply_payment($payload)"
"#;

fn load_text(text: &str, vars: &[(&str, &str)]) -> Result<InboxConfig, ConfigError> {
    let f = file(text);
    load_from(Some(f.path()), &mut env(vars).into_iter())
}

#[test]
fn defaults() {
    let c = load_text(MINIMAL, &[]).unwrap();
    assert_eq!((c.schema.as_str(), c.table.as_str()), ("public", "inbox"));
    assert_eq!(c.consumer, "billing");
    assert_eq!(c.kafka.message_id_header, "id");
    assert!(!c.effect.store_record);
    assert_eq!(c.effect.on_error, Policy::Fail);
    assert_eq!(c.retention.guard, Guard::Refuse);
    assert_eq!(c.retention.keep, None);
    assert_eq!(c.effect.batch_max, DEFAULT_BATCH_MAX);
    assert_eq!(c.effect.batch_linger, Duration::ZERO);
}

#[test]
fn environment_wins() {
    let c = load_text(
        MINIMAL,
        &[
            ("WALBOX_INBOX_KAFKA_TOPICS", "a, b"),
            ("WALBOX_INBOX_EFFECT_MAX_PARALLEL", "2"),
            ("WALBOX_INBOX_EFFECT_BATCH_MAX", "500"),
            ("WALBOX_INBOX_EFFECT_BATCH_LINGER", "5ms"),
            ("WALBOX_INBOX_RETENTION_KEEP", "14d"),
            ("WALBOX_INBOX_POSTGRES_TABLE", "app.inbox_events"),
            ("WALBOX_INBOX_KAFKA_PROPERTY_SESSION_TIMEOUT_MS", "6000"),
            ("WALBOX_KAFKA_BROKERS", "not-mine:9092"),
        ],
    )
    .unwrap();
    assert_eq!(c.kafka.topics, ["a", "b"]);
    assert_eq!(c.kafka.brokers, "k1:9092");
    assert_eq!(c.effect.max_parallel, 2);
    assert_eq!(c.effect.batch_max, 500);
    assert_eq!(c.effect.batch_linger, Duration::from_millis(5));
    assert_eq!(c.retention.keep, Some(Duration::from_secs(14 * 86_400)));
    assert_eq!(c.schema, "app");
    assert_eq!(
        c.kafka
            .properties
            .get("session.timeout.ms")
            .map(String::as_str),
        Some("6000")
    );
}

#[test]
fn no_effect_means_the_stored_inbox_form() {
    let text = MINIMAL.replace("sql = \"SELECT billing.apply_payment($payload)\"", "");
    assert!(load_text(&text, &[]).unwrap().effect.store_record);
    let e = load_text(&text, &[("WALBOX_INBOX_EFFECT_STORE_RECORD", "false")]).unwrap_err();
    assert!(e.to_string().contains("nothing would happen"), "{e}");
}

#[test]
fn refusals_are_one_line() {
    for (var, val) in [
        ("WALBOX_INBOX_KAFKA_PROPERTY_ENABLE_AUTO_COMMIT", "true"),
        ("WALBOX_INBOX_EFFECT_ON_ERROR", "dead_letter"),
        ("WALBOX_INBOX_EFFECT_ON_ERROR", "ignore"),
        ("WALBOX_INBOX_RETENTION_GUARD", "maybe"),
        ("WALBOX_INBOX_RETENTION_CLEANUP", "true"),
        ("WALBOX_INBOX_EFFECT_SQL", "SELECT f($1)"),
        ("WALBOX_INBOX_EFFECT_SQL", "SELECT f($payloadd)"),
        ("WALBOX_INBOX_KAFKA_TOPICS", ""),
        ("WALBOX_INBOX_EFFECT_MAX_PARALLEL", "0"),
        ("WALBOX_INBOX_EFFECT_BATCH_MAX", "0"),
        ("WALBOX_INBOX_EFFECT_BATCH_MAX", "10001"),
        ("WALBOX_INBOX_EFFECT_BATCH_LINGER", "2s"),
        ("WALBOX_INBOX_KAFKA_GROUP_INSTANCE_ID", " "),
        ("WALBOX_INBOX_KAFKA_PROPERTY_GROUP_INSTANCE_ID", "pod-0"),
    ] {
        let e = load_text(MINIMAL, &[(var, val)]).unwrap_err();
        let msg = e.to_string();
        assert!(
            !msg.contains('\n') && !msg.contains("secret"),
            "{var}: {msg}"
        );
    }
}

#[test]
fn static_membership_is_off_unless_an_instance_id_is_given() {
    assert_eq!(
        load_text(MINIMAL, &[]).unwrap().kafka.group_instance_id,
        None
    );
    let c = load_text(
        MINIMAL,
        &[("WALBOX_INBOX_KAFKA_GROUP_INSTANCE_ID", "billing-0")],
    );
    assert_eq!(
        c.unwrap().kafka.group_instance_id.as_deref(),
        Some("billing-0")
    );
    let e = load_text(
        MINIMAL,
        &[("WALBOX_INBOX_KAFKA_PROPERTY_GROUP_INSTANCE_ID", "x")],
    )
    .unwrap_err();
    assert!(e.to_string().contains("kafka.group_instance_id"), "{e}");
}

#[test]
fn the_shipped_example_is_valid() {
    let c = load_text(include_str!("../../examples/inbox.toml"), &[]).unwrap();
    assert_eq!(
        c.effect.on_error,
        Policy::DeadLetter("billing.inbox.dlq".into())
    );
    assert!(c.retention.cleanup);
}

#[test]
fn unknown_keys_are_rejected() {
    let e = load_text(&format!("{MINIMAL}\n[retention]\nkeeep = \"1d\"\n"), &[]).unwrap_err();
    assert!(e.to_string().contains("keeep"), "{e}");
}

#[test]
fn unknown_inbox_variables_are_errors_and_walbox_run_variables_are_not_mine() {
    let e = load_text(MINIMAL, &[("WALBOX_INBOX_EFFECT_SQLL", "SELECT 1")]).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("WALBOX_INBOX_EFFECT_SQLL")
            && msg.contains("did you mean WALBOX_INBOX_EFFECT_SQL?")
            && !msg.contains("SELECT 1"),
        "{msg}"
    );
    load_text(
        MINIMAL,
        &[
            ("WALBOX_INBOX_CONFIG", "/etc/inbox.toml"),
            ("WALBOX_POSTGRES_SLOTT", "walbox run's problem"),
            ("WALBOX_LOG", "info"),
        ],
    )
    .unwrap();
}

#[test]
fn consumer_properties_and_log_levels_are_checked_at_load_time() {
    let e = load_text(
        MINIMAL,
        &[("WALBOX_INBOX_KAFKA_PROPERTY_SASL_PASWORD", "hunter2")],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("sasl.pasword")
            && e.contains("WALBOX_INBOX_KAFKA_PROPERTY_SASL_PASWORD")
            && !e.contains("hunter2"),
        "{e}"
    );
    let e = load_text(MINIMAL, &[("WALBOX_INBOX_LOG_LEVEL", "warning")]).unwrap_err();
    assert!(e.to_string().contains("log.level"), "{e}");
    assert!(load_text(
        MINIMAL,
        &[(
            "WALBOX_INBOX_LOG_LEVEL",
            "info,librdkafka=warn,rdkafka=warn"
        )]
    )
    .is_ok());
    let e = load_text(MINIMAL, &[("WALBOX_LOG", "warning")]).unwrap_err();
    assert!(e.to_string().contains("WALBOX_LOG"), "{e}");
}

#[test]
fn secrets_stay_out_of_debug_output() {
    let c = load_text(
        &format!("{MINIMAL}\n[kafka.properties]\n\"sasl.password\" = \"hunter2\"\n"),
        &[],
    )
    .unwrap();
    let dbg = format!("{c:?}");
    assert!(!dbg.contains("hunter2") && !dbg.contains("secret"), "{dbg}");
}

#[test]
fn every_section_refuses_its_bad_values_naming_the_key() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("WALBOX_INBOX_POSTGRES_TABLE", "a.")],
            "postgres.table \"\" must be 1 to 63 characters",
        ),
        (
            &[("WALBOX_INBOX_POSTGRES_CONSUMER", "")],
            "postgres.consumer must not be empty",
        ),
        (
            &[("WALBOX_INBOX_KAFKA_TOPICS", "")],
            "kafka.topics must list at least one topic (WALBOX_INBOX_KAFKA_TOPICS=a,b)",
        ),
        (
            &[("WALBOX_INBOX_KAFKA_MESSAGE_ID_HEADER", "")],
            "kafka.message_id_header must not be empty",
        ),
        (
            &[("WALBOX_INBOX_KAFKA_COMMIT_INTERVAL", "0s")],
            "kafka.commit_interval must be > 0",
        ),
        (
            &[(
                "WALBOX_INBOX_KAFKA_DEAD_LETTER_TOPIC",
                "outbox.event.payment",
            )],
            "kafka.dead_letter_topic must not be one of kafka.topics",
        ),
        (
            &[(
                "WALBOX_INBOX_KAFKA_PROPERTY_ISOLATION_LEVEL",
                "read_uncommitted",
            )],
            "kafka.properties.isolation.level = \"read_uncommitted\" is managed by walbox",
        ),
        (
            &[("WALBOX_INBOX_KAFKA_PROPERTY_BOOTSTRAP_SERVERS", "x")],
            "kafka.properties.bootstrap.servers = \"x\" is managed by walbox",
        ),
        (
            &[("WALBOX_INBOX_EFFECT_ON_INVALID", "dead_letter")],
            "a dead_letter policy needs kafka.dead_letter_topic",
        ),
        (
            &[("WALBOX_INBOX_EFFECT_BACKOFF_MAX", "1ms")],
            "effect.backoff_initial must be > 0 and <= effect.backoff_max",
        ),
        (
            &[("WALBOX_INBOX_EFFECT_MAX_PARALLEL", "257")],
            "effect.max_parallel must be between 1 and 256",
        ),
        (
            &[("WALBOX_INBOX_EFFECT_BATCH_MAX", "0")],
            "effect.batch_max must be between 1 and 10000",
        ),
        (
            &[("WALBOX_INBOX_EFFECT_RETRIES", "1001")],
            "effect.retries must be at most 1000",
        ),
        (
            &[("WALBOX_INBOX_RETENTION_KEEP", "0s")],
            "retention.keep must be > 0 (omit it to keep rows forever)",
        ),
        (
            &[("WALBOX_INBOX_RETENTION_CLEANUP", "true")],
            "retention.cleanup = true needs retention.keep",
        ),
        (
            &[
                ("WALBOX_INBOX_RETENTION_KEEP", "1d"),
                ("WALBOX_INBOX_RETENTION_CLEANUP_INTERVAL", "0s"),
            ],
            "retention.cleanup_interval must be > 0",
        ),
        (
            &[("WALBOX_INBOX_RETENTION_CLEANUP_BATCH", "100001")],
            "retention.cleanup_batch must be between 1 and 100000",
        ),
        (
            &[("WALBOX_INBOX_HTTP_LISTEN", "x")],
            "http.listen \"x\" is not an address like 0.0.0.0:9188 (or \"off\")",
        ),
    ];
    for (vars, message) in cases {
        let e = load_text(MINIMAL, vars).unwrap_err().to_string();
        assert!(
            e.starts_with("invalid configuration: ") && e.contains(message),
            "{vars:?}: {e:?} lacks {message:?}"
        );
    }
}

#[test]
fn the_shared_keys_name_the_inbox_variables() {
    for (drop, message) in [
        (
            "url = \"postgres://billing:secret@db:5432/billing\"",
            "postgres.url is required (set it in the file or WALBOX_INBOX_POSTGRES_URL)",
        ),
        (
            "brokers = \"k1:9092\"",
            "kafka.brokers is required (set it in the file or WALBOX_INBOX_KAFKA_BROKERS)",
        ),
        (
            "group_id = \"billing\"",
            "kafka.group_id is required (set it in the file or WALBOX_INBOX_KAFKA_GROUP_ID)",
        ),
    ] {
        let e = load_text(&MINIMAL.replace(drop, ""), &[]).unwrap_err();
        assert_eq!(e.to_string(), format!("invalid configuration: {message}"));
    }
    // The connection's secrets may come from files, named by the inbox's variables.
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "from-a-file\n").unwrap();
    let c = load_text(
        MINIMAL,
        &[("WALBOX_INBOX_POSTGRES_PASSWORD_FILE", pw.to_str().unwrap())],
    )
    .unwrap();
    assert_eq!(c.conn.password.as_deref(), Some("from-a-file"));
}

#[test]
fn a_set_based_effect_reads_the_batch_from_records() {
    let text = MINIMAL.replace(
        "sql = \"SELECT billing.apply_payment($payload)\"",
        "batch_sql = \"SELECT billing.apply_payments($records)\"",
    );
    let c = load_text(&text, &[]).unwrap();
    let batch = c.effect.batch_sql.expect("batch_sql");
    assert_eq!(batch.sql, "SELECT billing.apply_payments(($1::jsonb))");
    assert!(c.effect.sql.is_none());
    assert!(
        !c.effect.store_record,
        "an effect: nothing stored by default"
    );
    let c = load_text(
        &text,
        &[
            ("WALBOX_INBOX_EFFECT_BATCH_SQL", "SELECT g($records)"),
            ("WALBOX_INBOX_EFFECT_STORE_RECORD", "true"),
        ],
    )
    .unwrap();
    assert_eq!(
        c.effect.batch_sql.map(|b| b.original).as_deref(),
        Some("SELECT g($records)")
    );
    assert!(c.effect.store_record);
}

#[test]
fn set_based_effect_refusals_are_one_line_and_say_why() {
    let without_sql = MINIMAL.replace("sql = \"SELECT billing.apply_payment($payload)\"", "");
    for (text, batch_sql, says) in [
        (
            MINIMAL,
            "SELECT g($records)",
            "effect.sql and effect.batch_sql are exclusive",
        ),
        (
            &without_sql,
            "SELECT g($payload)",
            "effect.batch_sql: $payload is a per-record placeholder",
        ),
        (
            &without_sql,
            "SELECT g()",
            "effect.batch_sql: the statement must read the batch's records from $records",
        ),
        (
            &without_sql,
            "SELECT g($1)",
            "effect.batch_sql: use named placeholders ($records)",
        ),
    ] {
        let e = load_text(text, &[("WALBOX_INBOX_EFFECT_BATCH_SQL", batch_sql)])
            .unwrap_err()
            .to_string();
        assert!(e.contains(says) && !e.contains('\n'), "{says}: {e}");
    }
}
