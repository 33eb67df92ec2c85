//! The Kafka security examples (`examples/kafka-sasl-scram.toml`, `examples/kafka-tls.toml`)
//! load as they are shipped, with their secrets read from files where a Kubernetes Secret
//! would mount them, and librdkafka accepts the resulting producer configuration: SASL/SCRAM
//! over TLS with a CA file, and mutual TLS with a client certificate whose key is encrypted
//! with the passphrase from a file (a wrong passphrase is refused, without being shown).
//!
//! The mock cluster speaks neither TLS nor SASL; the handshakes run against the Apache Kafka
//! broker of the real-Kafka lane (`WALBOX_TEST_KAFKA=apache`, `scripts/real-kafka.sh`), whose
//! SCRAM user is written at format time: SCRAM-SHA-512 over TLS relays events, and a wrong
//! SCRAM-SHA-256 password stops walbox with exit 4 without showing it. Without that broker these
//! two tests say so and return. On the mock cluster, credentials the brokers refuse stop both
//! halves, `walbox run` and `walbox inbox`, with exit 4. On the Apache Kafka broker, a CA that
//! did not sign the brokers' certificate stops both halves with exit 4 and one line naming
//! `ssl.ca.location`, and fails `walbox check`'s brokers check with that line.

use std::path::Path;
use std::sync::Arc;

use openssl::symm::Cipher;
use walbox::config::load_from;
use walbox::sandbox::tls::issue_cert;
use walbox::sink::kafka::KafkaSink;
use walbox::sink::AckQueue;

const PG_PASSWORD: &str = "pg-password-5d2e";
const KAFKA_PASSWORD: &str = "kafka-password-0b7c";
const KEY_PASSPHRASE: &str = "key-passphrase-91fa";

/// The example with `/run/secrets/walbox/` moved to `dir`, where the secrets are written.
fn example_in(dir: &Path, example: &str, key_passphrase: &str) -> std::path::PathBuf {
    let (ca, ca_key) = issue_cert("walbox test CA", None).unwrap();
    let (client, client_key) = issue_cert("localhost", Some((&ca, &ca_key))).unwrap();
    let files: [(&str, Vec<u8>); 6] = [
        ("postgres-password", format!("{PG_PASSWORD}\n").into_bytes()),
        ("kafka-password", format!("{KAFKA_PASSWORD}\n").into_bytes()),
        ("kafka-ca.pem", ca.to_pem().unwrap()),
        ("client.pem", client.to_pem().unwrap()),
        (
            "client.key",
            client_key
                .private_key_to_pem_pkcs8_passphrase(
                    Cipher::aes_256_cbc(),
                    KEY_PASSPHRASE.as_bytes(),
                )
                .unwrap(),
        ),
        (
            "client-key-password",
            format!("{key_passphrase}\n").into_bytes(),
        ),
    ];
    for (name, content) in files {
        std::fs::write(dir.join(name), content).unwrap();
    }
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(example))
        .unwrap()
        .replace("/run/secrets/walbox/", &format!("{}/", dir.display()));
    let path = dir.join("walbox.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn the_sasl_scram_example_loads_with_its_secrets_and_librdkafka_accepts_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = example_in(dir.path(), "examples/kafka-sasl-scram.toml", KEY_PASSPHRASE);
    let config = load_from(Some(&path), &mut std::iter::empty()).expect("the example loads");
    assert_eq!(config.postgres.conn.password.as_deref(), Some(PG_PASSWORD));
    assert_eq!(
        config
            .kafka
            .properties
            .get("sasl.password")
            .map(String::as_str),
        Some(KAFKA_PASSWORD)
    );
    assert_eq!(
        config
            .kafka
            .properties
            .get("sasl.mechanisms")
            .map(String::as_str),
        Some("SCRAM-SHA-512")
    );
    assert!(!format!("{config:?}").contains(PG_PASSWORD));
    KafkaSink::new(&config.kafka, Arc::new(AckQueue::default()))
        .unwrap_or_else(|e| panic!("librdkafka refused the SASL/SCRAM settings: {e}"));
}

#[test]
fn the_mutual_tls_example_needs_the_right_key_passphrase() {
    let dir = tempfile::tempdir().unwrap();
    let path = example_in(dir.path(), "examples/kafka-tls.toml", KEY_PASSPHRASE);
    let config = load_from(Some(&path), &mut std::iter::empty()).expect("the example loads");
    KafkaSink::new(&config.kafka, Arc::new(AckQueue::default()))
        .unwrap_or_else(|e| panic!("librdkafka refused the mutual TLS settings: {e}"));

    let dir = tempfile::tempdir().unwrap();
    let path = example_in(dir.path(), "examples/kafka-tls.toml", "not-the-passphrase");
    let config = load_from(Some(&path), &mut std::iter::empty()).expect("the example loads");
    let e = match KafkaSink::new(&config.kafka, Arc::new(AckQueue::default())) {
        Ok(_) => panic!("a wrong key passphrase was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.to_lowercase().contains("key"), "{e}");
    assert!(!e.contains("not-the-passphrase"), "{e}");
}

#[test]
fn brokers_refusing_the_credentials_stop_walbox_with_exit_4_without_the_password() {
    use crate::support::{self, walbox_env, TestDb};
    let db = TestDb::new("sasl_refused");
    let broker = support::broker();
    if broker.mock_cluster().is_none() {
        eprintln!("external broker: its own security settings decide; skipped");
        return;
    }
    let mut env = walbox_env(&db, &db.name, &broker.bootstrap_servers());
    for (k, v) in [
        ("WALBOX_KAFKA_PROPERTY_SECURITY_PROTOCOL", "SASL_PLAINTEXT"),
        ("WALBOX_KAFKA_PROPERTY_SASL_MECHANISMS", "PLAIN"),
        ("WALBOX_KAFKA_PROPERTY_SASL_USERNAME", "walbox"),
        ("WALBOX_KAFKA_PROPERTY_SASL_PASSWORD", KAFKA_PASSWORD),
    ] {
        env.push((k.to_owned(), v.to_owned()));
    }
    assert_refused_without_the_password(&env);
}

/// The consumer half meets the same refusal with the same verdict: exit 4, as the README's
/// exit statuses say for credentials the brokers refused, never the Kafka client's 9.
#[test]
fn brokers_refusing_the_credentials_stop_walbox_inbox_with_exit_4_without_the_password() {
    use crate::support::{self, TestDb, Walbox, WAIT};
    let db = TestDb::new("sasl_refused_inbox");
    let broker = support::broker();
    if broker.mock_cluster().is_none() {
        eprintln!("external broker: its own security settings decide; skipped");
        return;
    }
    db.sql(include_str!("../migrations/inbox.sql"));
    let env: Vec<(String, String)> = [
        ("WALBOX_INBOX_POSTGRES_URL", db.url()),
        ("WALBOX_INBOX_KAFKA_BROKERS", broker.bootstrap_servers()),
        ("WALBOX_INBOX_KAFKA_GROUP_ID", db.name.clone()),
        ("WALBOX_INBOX_KAFKA_TOPICS", db.name.clone()),
        ("WALBOX_INBOX_HTTP_LISTEN", "off".to_owned()),
        (
            "WALBOX_INBOX_KAFKA_PROPERTY_SECURITY_PROTOCOL",
            "SASL_PLAINTEXT".to_owned(),
        ),
        (
            "WALBOX_INBOX_KAFKA_PROPERTY_SASL_MECHANISMS",
            "PLAIN".to_owned(),
        ),
        (
            "WALBOX_INBOX_KAFKA_PROPERTY_SASL_USERNAME",
            "walbox".to_owned(),
        ),
        (
            "WALBOX_INBOX_KAFKA_PROPERTY_SASL_PASSWORD",
            KAFKA_PASSWORD.to_owned(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let mut inbox = Walbox::spawn_subcommand("inbox", &env);
    let status = inbox.wait_exit(WAIT);
    let log = inbox.log();
    assert_eq!(status.code(), Some(4), "{log}");
    assert!(
        inbox.last_line().contains("kafka consumer cannot continue"),
        "{}",
        inbox.last_line()
    );
    assert!(!log.contains(KAFKA_PASSWORD), "{log}");
}

/// A walbox relaying to the Apache Kafka broker's SASL listener `servers` with the SCRAM
/// `mechanism` and `password`, and `more` Kafka properties; `None` without that broker.
fn scram_env(
    db: &crate::support::TestDb,
    servers: impl FnOnce(&walbox::sandbox::kafka::KafkaServer) -> Option<String>,
    mechanism: &str,
    password: &str,
    more: &[(&str, String)],
) -> Option<Vec<(String, String)>> {
    use crate::support::{kafka, walbox_env};
    let Some(server) = kafka::apache() else {
        eprintln!("no Apache Kafka broker (WALBOX_TEST_KAFKA=apache): no handshake; skipped");
        return None;
    };
    let servers = servers(server).expect("the broker's SASL listeners");
    let mut env = walbox_env(db, &db.name, &servers);
    for (k, v) in [
        (
            "WALBOX_KAFKA_PROPERTY_SASL_MECHANISMS",
            mechanism.to_owned(),
        ),
        (
            "WALBOX_KAFKA_PROPERTY_SASL_USERNAME",
            kafka::SCRAM_USER.0.to_owned(),
        ),
        ("WALBOX_KAFKA_PROPERTY_SASL_PASSWORD", password.to_owned()),
    ] {
        env.push((k.to_owned(), v));
    }
    env.extend(more.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    Some(env)
}

/// A walbox relaying to the Apache Kafka broker's SASL_SSL listener as the SCRAM-SHA-512 user,
/// trusting the CA in `ca`; `None` without that broker.
fn sasl_ssl_env(db: &crate::support::TestDb, ca: &Path) -> Option<Vec<(String, String)>> {
    scram_env(
        db,
        |s| s.sasl_ssl_servers(),
        "SCRAM-SHA-512",
        crate::support::kafka::SCRAM_USER.1,
        &[
            (
                "WALBOX_KAFKA_PROPERTY_SECURITY_PROTOCOL",
                "SASL_SSL".to_owned(),
            ),
            (
                "WALBOX_KAFKA_PROPERTY_SSL_CA_LOCATION",
                ca.display().to_string(),
            ),
        ],
    )
}

#[test]
fn scram_sha_512_over_tls_relays_to_apache_kafka() {
    use crate::support::events::{await_distinct, outbox_ids, stop_and_read_exactly, write_txns};
    use crate::support::{self, kafka, TestDb, Walbox, WAIT};
    use walbox::sandbox::broker::TopicReader;
    let db = TestDb::new("scram_tls");
    let Some(ca) = kafka::apache().and_then(|s| s.ca_file()) else {
        eprintln!("no Apache Kafka broker (WALBOX_TEST_KAFKA=apache): no handshake; skipped");
        return;
    };
    let (topic, broker) = support::topic_on_broker(&db, 2);
    let Some(env) = sasl_ssl_env(&db, &ca) else {
        return;
    };
    db.create_slot_and_publication(&db.name);
    let aggregates: Vec<String> = (0..10).map(|i| format!("agg-{i}")).collect();
    let mut walbox = Walbox::spawn(&env);
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    write_txns(&db, &topic, &aggregates, 3);
    let all = outbox_ids(&db);
    await_distinct(&mut reader, all.len(), &walbox);
    stop_and_read_exactly(&mut walbox, &mut reader, &all);
    assert!(
        !walbox.log().contains(kafka::SCRAM_USER.1),
        "{}",
        walbox.log()
    );
}

#[test]
fn a_wrong_scram_password_stops_walbox_with_exit_4_on_apache_kafka_without_showing_it() {
    use crate::support::TestDb;
    let db = TestDb::new("scram_refused");
    let Some(env) = scram_env(
        &db,
        |s| s.sasl_plaintext_servers(),
        "SCRAM-SHA-256",
        KAFKA_PASSWORD,
        &[(
            "WALBOX_KAFKA_PROPERTY_SECURITY_PROTOCOL",
            "SASL_PLAINTEXT".to_owned(),
        )],
    ) else {
        return;
    };
    assert_refused_without_the_password(&env);
}

/// Runs walbox with `env`, whose SASL credentials the brokers refuse: it stops with exit 4,
/// saying the producer cannot continue, and the password is nowhere in its output.
fn assert_refused_without_the_password(env: &[(String, String)]) {
    use crate::support::{Walbox, WAIT};
    let mut walbox = Walbox::spawn(env);
    let status = walbox.wait_exit(WAIT);
    let log = walbox.log();
    assert_eq!(status.code(), Some(4), "{log}");
    assert!(
        walbox
            .last_line()
            .contains("kafka producer cannot continue"),
        "{}",
        walbox.last_line()
    );
    assert!(!log.contains(KAFKA_PASSWORD), "{log}");
}

#[test]
fn brokers_whose_certificate_the_ca_does_not_sign_stop_walbox_with_exit_4_naming_ssl_ca_location() {
    use crate::support::{kafka, TestDb, Walbox, WAIT};
    let db = TestDb::new("kafka_untrusted");
    let dir = tempfile::tempdir().unwrap();
    let ca = other_ca(dir.path());
    let Some(env) = sasl_ssl_env(&db, &ca) else {
        return;
    };
    db.create_slot_and_publication(&db.name);
    // Retrying cannot make the handshake succeed: walbox stops at once instead.
    let mut walbox = Walbox::spawn(&env);
    let status = walbox.wait_exit(WAIT);
    let (log, line) = (walbox.log(), walbox.last_line());
    assert_eq!(status.code(), Some(4), "{log}");
    assert!(
        line.contains("certificate") && line.contains("ssl.ca.location") && !line.contains('\n'),
        "{line}"
    );
    assert!(!log.contains(kafka::SCRAM_USER.1), "{log}");
}

/// A CA file in `dir` holding a CA that did not sign the brokers' certificate.
fn other_ca(dir: &Path) -> std::path::PathBuf {
    let (other_ca, _) = issue_cert("not the brokers' CA", None).unwrap();
    let ca = dir.join("other-ca.pem");
    std::fs::write(&ca, other_ca.to_pem().unwrap()).unwrap();
    ca
}

/// The consumer half meets the handshake the relay stops on with the same verdict: exit 4 and
/// the one line naming `ssl.ca.location`, where librdkafka alone would retry it forever.
#[test]
fn brokers_whose_certificate_the_ca_does_not_sign_stop_walbox_inbox_with_exit_4_naming_ssl_ca_location(
) {
    use crate::support::{kafka, TestDb, Walbox, WAIT};
    let db = TestDb::new("kafka_untrusted_inbox");
    let dir = tempfile::tempdir().unwrap();
    let ca = other_ca(dir.path());
    let Some(relay) = sasl_ssl_env(&db, &ca) else {
        return;
    };
    db.sql(include_str!("../migrations/inbox.sql"));
    // The relay's Kafka settings, as `walbox inbox` names them.
    let mut env: Vec<(String, String)> = relay
        .iter()
        .filter_map(|(k, v)| {
            let property = k.strip_prefix("WALBOX_KAFKA_PROPERTY_")?;
            Some((format!("WALBOX_INBOX_KAFKA_PROPERTY_{property}"), v.clone()))
        })
        .collect();
    let servers = relay
        .iter()
        .find(|(k, _)| k == "WALBOX_KAFKA_BROKERS")
        .map(|(_, v)| v.clone())
        .expect("the relay's brokers");
    for (k, v) in [
        ("WALBOX_INBOX_POSTGRES_URL", db.url()),
        ("WALBOX_INBOX_KAFKA_BROKERS", servers),
        ("WALBOX_INBOX_KAFKA_GROUP_ID", db.name.clone()),
        ("WALBOX_INBOX_KAFKA_TOPICS", db.name.clone()),
        ("WALBOX_INBOX_HTTP_LISTEN", "off".to_owned()),
    ] {
        env.push((k.to_owned(), v));
    }
    assert!(
        env.iter()
            .any(|(k, v)| k == "WALBOX_INBOX_KAFKA_PROPERTY_SSL_CA_LOCATION"
                && *v == ca.display().to_string()),
        "{env:?}"
    );
    let mut inbox = Walbox::spawn_subcommand("inbox", &env);
    let status = inbox.wait_exit(WAIT);
    let (log, line) = (inbox.log(), inbox.last_line());
    assert_eq!(status.code(), Some(4), "{log}");
    assert!(
        line.contains("kafka consumer cannot continue")
            && line.contains("certificate")
            && line.contains("ssl.ca.location")
            && !line.contains('\n'),
        "{line}"
    );
    assert!(!log.contains(kafka::SCRAM_USER.1), "{log}");
}

/// `walbox check` says what `walbox run` and `walbox inbox` stop on: the brokers check fails
/// with the same line, not as brokers that do not answer.
#[test]
fn brokers_whose_certificate_the_ca_does_not_sign_fail_the_brokers_check_naming_ssl_ca_location() {
    use crate::check::check;
    use crate::support::{kafka, TestDb};
    let db = TestDb::new("check_untrusted");
    let dir = tempfile::tempdir().unwrap();
    let ca = other_ca(dir.path());
    let Some(env) = sasl_ssl_env(&db, &ca) else {
        return;
    };
    db.create_slot_and_publication(&db.name);
    let run = check(&env, &[]);
    run.failed();
    run.expect(
        "kafka brokers",
        "FAIL",
        &[
            "the TLS handshake with the brokers failed on a certificate",
            "kafka.properties \"ssl.ca.location\"",
            "exit status 4",
        ],
    );
    assert!(
        !run.line("kafka brokers").contains("no answer"),
        "{}",
        run.stdout
    );
    run.expect("idempotent producer", "skipped", &["kafka brokers failed"]);
    assert!(
        !run.stdout.contains(kafka::SCRAM_USER.1) && !run.stderr.contains(kafka::SCRAM_USER.1),
        "{}{}",
        run.stdout,
        run.stderr
    );
}

/// A TLS listener on 127.0.0.1 that presents a certificate of a CA of its own to every
/// connection (no Kafka behind it): a client that trusts another CA fails its handshake on the
/// certificate. Its address.
fn untrusted_tls_listener() -> String {
    use openssl::ssl::{SslAcceptor, SslMethod};
    let (ca, ca_key) = issue_cert("the listener's CA", None).unwrap();
    let (cert, key) = issue_cert("localhost", Some((&ca, &ca_key))).unwrap();
    let mut acceptor = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).unwrap();
    acceptor.set_private_key(&key).unwrap();
    acceptor.set_certificate(&cert).unwrap();
    acceptor.add_extra_chain_cert(ca).unwrap();
    let acceptor = acceptor.build();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            // The client refuses the certificate: each handshake fails, as it should.
            let _ = acceptor.accept(stream);
        }
    });
    addr
}

/// The relay's start-up read of the progress topic (exactly-once mode) meets the handshake the
/// producer stops on: it returns that line, exit 4, at once instead of after its timeout.
#[test]
fn an_untrusted_certificate_ends_the_progress_read_at_once_with_exit_4() {
    use std::time::{Duration, Instant};
    use walbox::failure::{Classify, Failure};
    use walbox::sink::progress::{read_last, ProgressKey};
    let dir = tempfile::tempdir().unwrap();
    let ca = other_ca(dir.path());
    let mut config = walbox::config::KafkaConfig::for_brokers(untrusted_tls_listener());
    config
        .properties
        .insert("security.protocol".into(), "SSL".into());
    config
        .properties
        .insert("ssl.ca.location".into(), ca.display().to_string());
    let key = ProgressKey {
        system_identifier: "1".into(),
        database: "db".into(),
        slot: "slot".into(),
    };
    let timeout = Duration::from_secs(60);
    let started = Instant::now();
    let e = read_last(&config, &key, timeout).expect_err("no broker trusted");
    assert!(
        started.elapsed() < timeout / 2,
        "{:?}: {e}",
        started.elapsed()
    );
    assert_eq!(e.failure(), Some(Failure::Auth), "{e}");
    let line = e.to_string();
    assert!(
        line.contains("failed on a certificate") && line.contains("ssl.ca.location"),
        "{line}"
    );
}

/// `walbox republish`'s producer meets the same handshake: it stops with exit 4 and the line,
/// instead of waiting out `--ack-timeout` for acknowledgements that cannot come (exit 9).
#[test]
fn an_untrusted_certificate_stops_walbox_republish_with_exit_4_not_its_ack_timeout() {
    use crate::check::with;
    use crate::support::{walbox_env, walbox_output, TestDb};
    let db = TestDb::new("republish_untrusted");
    let dir = tempfile::tempdir().unwrap();
    let ca = other_ca(dir.path());
    db.sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES ('a', '{}', 'x', '{{}}')",
        db.name
    ));
    let mut env = walbox_env(&db, &db.name, &untrusted_tls_listener());
    env = with(env, "WALBOX_KAFKA_PROPERTY_SECURITY_PROTOCOL", "SSL");
    env = with(
        env,
        "WALBOX_KAFKA_PROPERTY_SSL_CA_LOCATION",
        &ca.display().to_string(),
    );
    let out = walbox_output(
        &["republish", "--since-id", "1", "--ack-timeout", "10m"],
        &env,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    let line = stderr.lines().last().unwrap_or_default();
    assert!(
        line.contains("kafka publisher cannot continue: the TLS handshake with the brokers failed on a certificate")
            && line.contains("ssl.ca.location"),
        "{stderr}"
    );
}
