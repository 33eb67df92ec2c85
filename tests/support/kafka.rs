//! The Apache Kafka broker of the real-Kafka lane (`WALBOX_TEST_KAFKA=apache`, run by
//! `scripts/real-kafka.sh`): one single-node KRaft broker per test binary, started on first use
//! and killed by its watchdog when the binary exits; tests share it with topics and groups of
//! their own (named after their database). It has a SCRAM user ([`SCRAM_USER`]) on a
//! SASL_PLAINTEXT and a SASL_SSL listener. Its log goes to a file (`WALBOX_TEST_KAFKA_LOG`, else
//! inside its directory), whose path each test prints: shown only when the test fails.

use std::sync::OnceLock;

use walbox::sandbox::kafka::{KafkaServer, KafkaServerOptions};

/// The SCRAM user (both mechanisms) written at format time: `(name, password)`.
pub const SCRAM_USER: (&str, &str) = ("walbox", "kafka-scram-3f9a");

/// Whether `WALBOX_TEST_KAFKA=apache` asks for the Apache Kafka broker.
pub fn wanted() -> bool {
    match std::env::var("WALBOX_TEST_KAFKA") {
        Ok(v) if v.trim() == "apache" => true,
        Ok(v) if v.trim().is_empty() || v.trim() == "mock" => false,
        Ok(v) => panic!("WALBOX_TEST_KAFKA={v:?}: expected \"apache\" or \"mock\""),
        Err(_) => false,
    }
}

/// The shared Apache Kafka broker, when [`wanted`]; started on the first call.
pub fn apache() -> Option<&'static KafkaServer> {
    static SERVER: OnceLock<KafkaServer> = OnceLock::new();
    if !wanted() {
        return None;
    }
    let server = SERVER.get_or_init(|| {
        KafkaServer::start(KafkaServerOptions {
            watchdog: true,
            scram: Some((SCRAM_USER.0.to_owned(), SCRAM_USER.1.to_owned())),
            log_file: std::env::var_os("WALBOX_TEST_KAFKA_LOG").map(Into::into),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("start the Apache Kafka broker: {e}"))
    });
    eprintln!("Apache Kafka broker log: {}", server.log_path().display());
    Some(server)
}
