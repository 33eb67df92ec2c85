use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::producer::{BaseProducer, ProducerContext};
use rdkafka::ClientContext;

use super::*;
use crate::config::kafka::refused_property;

const ROLES: [KafkaRole; 7] = [
    KafkaRole::Producer,
    KafkaRole::TransactionalProducer,
    KafkaRole::DeadLetterProducer,
    KafkaRole::ProgressReader,
    KafkaRole::AuditReader,
    KafkaRole::InboxConsumer,
    KafkaRole::Admin,
];

fn properties(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// SASL over TLS, a connection setting outside the `security.`/`sasl.`/`ssl.` prefixes, a
/// producer property and a consumer property.
fn secured() -> BTreeMap<String, String> {
    properties(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanisms", "SCRAM-SHA-512"),
        ("sasl.username", "walbox"),
        ("sasl.password", "hunter2"),
        ("ssl.ca.location", "/etc/kafka/ca.pem"),
        ("enable.ssl.certificate.verification", "false"),
        ("client.dns.lookup", "use_all_dns_ips"),
        ("compression.type", "zstd"),
        ("fetch.min.bytes", "1024"),
    ])
}

#[test]
fn every_role_gets_the_connection_and_only_its_own_kind_of_properties() {
    let props = secured();
    for role in ROLES {
        let cc = client_config("b1:9092,b2:9092", &props, role);
        assert_eq!(
            cc.get("bootstrap.servers"),
            Some("b1:9092,b2:9092"),
            "{role:?}"
        );
        assert_eq!(
            cc.get("enable.sparse.connections"),
            Some("false"),
            "{role:?}"
        );
        for key in [
            "security.protocol",
            "sasl.mechanisms",
            "sasl.username",
            "sasl.password",
            "ssl.ca.location",
            "enable.ssl.certificate.verification",
            "client.dns.lookup",
        ] {
            assert_eq!(cc.get(key), Some(props[key].as_str()), "{role:?} {key}");
        }
        let (producer, consumer) = match role {
            KafkaRole::Producer | KafkaRole::TransactionalProducer => (true, false),
            KafkaRole::DeadLetterProducer => (true, false),
            KafkaRole::ProgressReader | KafkaRole::AuditReader | KafkaRole::InboxConsumer => {
                (false, true)
            }
            KafkaRole::Admin => (false, false),
        };
        assert_eq!(cc.get("compression.type").is_some(), producer, "{role:?}");
        assert_eq!(cc.get("fetch.min.bytes").is_some(), consumer, "{role:?}");
    }
}

#[test]
fn walbox_defaults_yield_to_properties_and_its_fixed_settings_do_not() {
    let props = properties(&[
        ("linger.ms", "20"),
        ("client.id", "orders"),
        ("transaction.timeout.ms", "30000"),
        ("isolation.level", "read_uncommitted"),
        ("enable.partition.eof", "false"),
        ("acks", "1"),
        ("auto.offset.reset", "latest"),
    ]);
    let get = |role, key| {
        client_config("b:9092", &props, role)
            .get(key)
            .map(str::to_owned)
    };
    let some = |v: &str| Some(v.to_owned());
    // Defaults: the user's value wins.
    assert_eq!(get(KafkaRole::Producer, "linger.ms"), some("20"));
    assert_eq!(get(KafkaRole::Producer, "client.id"), some("orders"));
    assert_eq!(
        get(KafkaRole::Producer, "partitioner"),
        some("murmur2_random")
    );
    assert_eq!(get(KafkaRole::InboxConsumer, "client.id"), some("orders"));
    assert_eq!(
        get(KafkaRole::InboxConsumer, "auto.offset.reset"),
        some("latest")
    );
    assert_eq!(
        get(KafkaRole::TransactionalProducer, "message.timeout.ms"),
        some("30000")
    );
    assert_eq!(
        get(KafkaRole::TransactionalProducer, "linger.ms"),
        some("20")
    );
    // Fixed: walbox's value wins.
    for role in [KafkaRole::ProgressReader, KafkaRole::AuditReader] {
        assert_eq!(
            get(role, "isolation.level"),
            some("read_committed"),
            "{role:?}"
        );
        assert_eq!(get(role, "enable.partition.eof"), some("true"), "{role:?}");
        assert_eq!(get(role, "enable.auto.commit"), some("false"), "{role:?}");
    }
    assert_eq!(get(KafkaRole::DeadLetterProducer, "acks"), some("all"));
    assert_eq!(
        get(KafkaRole::DeadLetterProducer, "enable.idempotence"),
        some("true")
    );
    // The transaction timeout without a property.
    let none = BTreeMap::new();
    let tx = client_config("b:9092", &none, KafkaRole::TransactionalProducer);
    assert_eq!(
        tx.get("transaction.timeout.ms"),
        Some(TRANSACTION_TIMEOUT_MS)
    );
    assert_eq!(tx.get("message.timeout.ms"), Some(TRANSACTION_TIMEOUT_MS));
    assert_eq!(tx.get("linger.ms"), Some("0"));
}

#[test]
fn every_scoped_property_is_librdkafkas_and_has_one_scope() {
    for name in PRODUCER_PROPERTIES.iter().chain(CONSUMER_PROPERTIES) {
        let why = refused_property(name, "1", true).unwrap_or_default();
        assert!(!why.contains("not a librdkafka property"), "{name}: {why}");
    }
    for name in PRODUCER_PROPERTIES {
        assert!(!CONSUMER_PROPERTIES.contains(name), "{name}");
    }
}

/// Keeps librdkafka's log lines.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<String>>>);

impl ClientContext for Capture {
    fn log(&self, _: RDKafkaLogLevel, fac: &str, message: &str) {
        self.0.lock().unwrap().push(format!("{fac}: {message}"));
    }
}

impl ConsumerContext for Capture {}

impl ProducerContext for Capture {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

/// librdkafka's warnings at the creation of a client of `role` (a producer handle for the
/// producers and the admin client, a consumer for the readers).
fn warnings(props: &BTreeMap<String, String>, role: KafkaRole) -> Vec<String> {
    let capture = Capture::default();
    let mut cc = client_config("127.0.0.1:9", props, role);
    cc.set_log_level(RDKafkaLogLevel::Warning);
    if role == KafkaRole::InboxConsumer || role == KafkaRole::AuditReader {
        // Consumers need no group to be created; the inbox's comes from its own key.
        cc.set("group.id", "test");
    }
    // rust-rdkafka routes librdkafka's log lines to the client's main queue: they reach the
    // context when the client is polled, which serves every line queued by its creation.
    match role.kind() {
        Kind::Consumer => {
            serve_logs(&cc.create_with_context::<_, BaseConsumer<_>>(capture.clone()))
        }
        _ => {
            let p = cc.create_with_context::<_, BaseProducer<_>>(capture.clone());
            if let Ok(p) = &p {
                p.poll(Duration::from_millis(100));
            }
        }
    }
    let lines = capture.0.lock().unwrap().clone();
    lines
        .into_iter()
        .filter(|l| l.contains("will be ignored"))
        .collect()
}

/// Polls a consumer once, which serves the log lines its creation queued.
fn serve_logs<C: ConsumerContext>(consumer: &rdkafka::error::KafkaResult<BaseConsumer<C>>) {
    if let Ok(c) = consumer {
        let _ = c.poll(Duration::from_millis(100));
    }
}

#[test]
fn librdkafka_ignores_no_property_a_role_gets() {
    // SASL without TLS: a TLS client needs its CA file to exist.
    let props = properties(&[
        ("security.protocol", "SASL_PLAINTEXT"),
        ("sasl.mechanisms", "PLAIN"),
        ("sasl.username", "walbox"),
        ("sasl.password", "hunter2"),
        ("compression.type", "zstd"),
        ("linger.ms", "20"),
        ("fetch.min.bytes", "1024"),
        ("auto.offset.reset", "latest"),
    ]);
    for role in ROLES {
        assert_eq!(warnings(&props, role), Vec::<String>::new(), "{role:?}");
    }
    // What a reader given every property draws (librdkafka names an alias by its property:
    // `compression.codec` for `compression.type`).
    let capture = Capture::default();
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", "127.0.0.1:9")
        .set("group.id", "test")
        .set_log_level(RDKafkaLogLevel::Warning);
    for (k, v) in &props {
        cc.set(k, v);
    }
    serve_logs(&cc.create_with_context::<_, BaseConsumer<_>>(capture.clone()));
    let lines = capture.0.lock().unwrap().clone();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("is a producer property and will be ignored")),
        "{lines:?}"
    );
}
