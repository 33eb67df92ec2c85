//! The whole configuration document: [`RawConfig`] (every section as written), its validation
//! into [`Config`] (the only type the rest of walbox sees), `walbox run`'s environment layout
//! (`LAYOUT`), and [`load`] / [`load_from`].
//!
//! Invariants: loading is file, then environment (`layers.rs`), then the `[outbox]` shorthand
//! normalised (`outbox.rs`), then deserialized with unknown keys rejected, then validated.
//! Each section validates itself, in its own file (`Raw….validate`); validation here runs them
//! in a fixed order (postgres, outbox, kafka, relay, slot, alerts, http, log), then the rules
//! across sections (the producer's queue against `relay.max_in_flight` × `postgres.shards`, no
//! logical messages with shards), and returns the first error. Every default is filled in, so a
//! [`Config`] is complete and consistent.

use std::net::SocketAddr;
use std::path::Path;

use serde::Deserialize;

use super::alerts::{AlertsConfig, RawAlerts};
use super::broker::{self, BrokerConfig};
use super::env::{EnvLayout, INBOX_PREFIX, RUN_PREFIX};
use super::error::ConfigError;
use super::http::RawHttp;
use super::kafka::{KafkaConfig, RawKafka, RawKafkaConnection};
use super::layers::read_document;
use super::log::{LogConfig, RawLog, LOG_ENV};
use super::nats::RawNats;
use super::outbox::{self, OutboxConfig, RawOutbox};
use super::postgres::{PostgresConfig, RawPgConnection, RawPostgres};
use super::rabbitmq::RawRabbitMq;
use super::redis::RawRedis;
use super::relay::{RawRelay, RelayConfig};
use super::retention::RawRetention;
use super::slot::{RawSlot, SlotConfig};

/// The configuration as written: every field optional, unknown keys rejected.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// `[postgres]`
    #[serde(default)]
    pub postgres: RawPostgres,
    /// `[outbox]`
    #[serde(default)]
    pub outbox: RawOutbox,
    /// `[kafka]`
    #[serde(default)]
    pub kafka: RawKafka,
    /// `[redis]`: publish to Redis Streams instead of Kafka.
    #[serde(default)]
    pub redis: Option<RawRedis>,
    /// `[relay]`
    #[serde(default)]
    pub relay: RawRelay,
    /// `[slot]`
    #[serde(default)]
    pub slot: RawSlot,
    /// `[alerts]`
    #[serde(default)]
    pub alerts: RawAlerts,
    /// `[http]`
    #[serde(default)]
    pub http: RawHttp,
    /// `[log]`
    #[serde(default)]
    pub log: RawLog,
    /// `[nats]`: NATS JetStream is the broker.
    #[serde(default)]
    pub nats: Option<RawNats>,
    /// `[rabbitmq]`: present when RabbitMQ is the broker.
    #[serde(default)]
    pub rabbitmq: Option<RawRabbitMq>,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// PostgreSQL side.
    pub postgres: PostgresConfig,
    /// The outbox table and its column mapping.
    pub outbox: OutboxConfig,
    /// Kafka side (the relay's broker unless `broker` names another).
    pub kafka: KafkaConfig,
    /// The broker the relay publishes to.
    pub broker: BrokerConfig,
    /// Pipeline limits and timings.
    pub relay: RelayConfig,
    /// Slot monitoring and heartbeats.
    pub slot: SlotConfig,
    /// Alert delivery.
    pub alerts: AlertsConfig,
    /// Listen address of the HTTP endpoints; `None` disables them.
    pub http_listen: Option<SocketAddr>,
    /// Validated `[log]`: format and level filter.
    pub log: LogConfig,
}

/// The environment layout of `walbox run`'s configuration: `WALBOX_<SECTION>_<KEY>`.
pub(super) const LAYOUT: EnvLayout = EnvLayout {
    prefix: RUN_PREFIX,
    scalars: &[
        RawPgConnection::SETTINGS,
        RawPostgres::SETTINGS,
        RawOutbox::SETTINGS,
        RawRetention::SETTINGS,
        RawKafkaConnection::SETTINGS,
        RawKafka::SETTINGS,
        RawRedis::SETTINGS,
        RawRelay::SETTINGS,
        RawSlot::SETTINGS,
        RawAlerts::SETTINGS,
        RawHttp::SETTINGS,
        RawLog::SETTINGS,
        RawNats::SETTINGS,
        RawRabbitMq::SETTINGS,
    ],
    secrets: &[
        RawPgConnection::SECRETS,
        RawPostgres::SECRETS,
        RawAlerts::SECRETS,
        RawRedis::SECRETS,
        RawNats::SECRETS,
        RawRabbitMq::SECRETS,
    ],
    // The config file (clap reads it) and the log filter override (main reads it).
    accepted: &["WALBOX_CONFIG", LOG_ENV],
    others: &[INBOX_PREFIX],
    // The variables of the tests and benchmarks, and where the sandbox and the install scripts
    // keep other PostgreSQL majors (which ones), the Apache Kafka broker and Debezium (which
    // versions). The one list of them: docs/configuration.md's is checked against it.
    foreign: &[
        "WALBOX_TEST_",
        "WALBOX_BENCH_",
        "WALBOX_PG_CACHE",
        "WALBOX_PG_MAJORS",
        "WALBOX_KAFKA_CACHE",
        "WALBOX_KAFKA_VERSION",
        "WALBOX_DEBEZIUM_",
    ],
};

/// Loads the configuration from an optional file and the process environment.
pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
    load_from(path, &mut super::env::process_env()?.into_iter())
}

/// Loads the configuration from an optional file and the given environment (testable).
pub fn load_from(
    path: Option<&Path>,
    env: &mut dyn Iterator<Item = (String, String)>,
) -> Result<Config, ConfigError> {
    read_document::<RawConfig>(path, env, &LAYOUT, outbox::normalize)?.validate()
}

/// librdkafka's bound on records waiting in the producer.
const QUEUE_PROPERTY: &str = "queue.buffering.max.messages";
/// [`QUEUE_PROPERTY`]'s default in librdkafka.
const LIBRDKAFKA_QUEUE_DEFAULT: usize = 100_000;

impl RawConfig {
    /// Checks each section, then the rules across sections, and fills in defaults.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let postgres = self.postgres.validate(&LAYOUT)?;
        let outbox = self.outbox.validate()?;
        // Each broker section present (`[kafka]` is the default).
        let mut others = Vec::new();
        if let Some(redis) = self.redis {
            others.push(BrokerConfig::Redis(redis.validate()?));
        }
        if let Some(nats) = self.nats {
            others.push(BrokerConfig::Nats(nats.validate(&LAYOUT)?));
        }
        if let Some(rabbitmq) = self.rabbitmq {
            others.push(BrokerConfig::RabbitMq(rabbitmq.validate(&LAYOUT)?));
        }
        let (mut kafka, broker) = broker::choose(self.kafka, others, postgres.shards, &LAYOUT)?;
        let relay = self.relay.validate()?;
        let slot = self.slot.validate()?;
        let alerts = self.alerts.validate()?;
        let http_listen = self.http.validate("0.0.0.0:9187")?;
        let log = self.log.validate()?;
        size_producer_queue(&mut kafka, &relay, &postgres)?;
        connect_record_limit(&mut kafka, &outbox);
        if postgres.shards > 1 && outbox.messages.is_some() {
            return Err(ConfigError::Invalid(
                "postgres.shards > 1 cannot relay [outbox.messages]: logical messages reach every shard's slot, so each would publish them; use an outbox table, or postgres.shards = 1".into(),
            ));
        }
        Ok(Config {
            postgres,
            outbox,
            kafka,
            broker,
            relay,
            slot,
            alerts,
            http_listen,
            log,
        })
    }
}

/// A route in `compat = "debezium"` takes the records Kafka Connect's producer takes: up to its
/// `max.request.size`, 1,048,576 bytes, where librdkafka's `message.max.bytes` defaults to
/// 1,000,000. A value the user set stays.
fn connect_record_limit(kafka: &mut KafkaConfig, outbox: &OutboxConfig) {
    let debezium = outbox
        .tables
        .iter()
        .chain(&outbox.messages)
        .any(|r| r.compat == outbox::Compat::Debezium);
    if debezium {
        kafka
            .properties
            .entry("message.max.bytes".to_owned())
            .or_insert_with(|| outbox::CONNECT_MAX_REQUEST_SIZE.to_owned());
    }
}

/// The relay must stop reading WAL before librdkafka's queue refuses records: `max_in_flight`
/// within the queue. Shards share one producer, whose queue must hold every shard's window:
/// walbox sizes it when the user did not set it, and refuses a set queue that is too small.
fn size_producer_queue(
    kafka: &mut KafkaConfig,
    relay: &RelayConfig,
    postgres: &PostgresConfig,
) -> Result<(), ConfigError> {
    let max_in_flight = relay.max_in_flight;
    let shards = postgres.shards as usize;
    let windows = max_in_flight * shards;
    let set_queue = kafka
        .properties
        .get(QUEUE_PROPERTY)
        .and_then(|v| v.trim().parse::<usize>().ok());
    let sized_queue = match set_queue {
        Some(queue) if shards > 1 && windows > queue => {
            return Err(ConfigError::Invalid(format!(
                "relay.max_in_flight × postgres.shards ({max_in_flight} × {shards}) exceeds the producer's queue (kafka.properties.{QUEUE_PROPERTY} = {queue}), which the shards share: lower relay.max_in_flight, raise the queue, or leave it unset for walbox to size"
            )));
        }
        None if shards > 1 => windows.max(LIBRDKAFKA_QUEUE_DEFAULT),
        queue if max_in_flight > queue.unwrap_or(LIBRDKAFKA_QUEUE_DEFAULT) => {
            return Err(ConfigError::Invalid(format!(
                "relay.max_in_flight ({max_in_flight}) exceeds the producer's queue (kafka.properties.{QUEUE_PROPERTY} = {}): lower relay.max_in_flight or raise the queue",
                queue.unwrap_or(LIBRDKAFKA_QUEUE_DEFAULT)
            )));
        }
        _ => return Ok(()),
    };
    kafka
        .properties
        .insert(QUEUE_PROPERTY.to_owned(), sized_queue.to_string());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::fixture::{env, file};
    use crate::config::kafka::DEFAULT_PROGRESS_TOPIC;
    use crate::config::postgres::OnSlotBusy;
    use std::time::Duration;

    /// `walbox run`'s configuration from a minimal file, `extra` and `vars`.
    fn load_env(extra: &str, vars: &[(&str, &str)]) -> Result<Config, String> {
        let f = file(&format!(
            "[postgres]\nurl = \"postgres://walbox:secret@db/app\"\n[kafka]\nbrokers = \"k1:9092\"\n{extra}"
        ));
        load_from(Some(f.path()), &mut env(vars).into_iter()).map_err(|e| e.to_string())
    }

    #[test]
    fn every_section_refuses_its_bad_values_naming_the_key() {
        // (more of the file, variables, what the message says)
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
        let cases: &[Case] = &[
            ("", &[("WALBOX_POSTGRES_SLOT", "Bad-Slot")], "postgres.slot \"Bad-Slot\" may contain only lower-case letters, digits and underscores"),
            ("", &[("WALBOX_POSTGRES_PUBLICATION", "")], "postgres.publication \"\" must be 1 to 63 characters"),
            ("", &[("WALBOX_POSTGRES_STATUS_INTERVAL", "2s")], "postgres.status_interval must be between 1ms and 1s"),
            ("", &[("WALBOX_POSTGRES_ON_SLOT_BUSY", "maybe")], "postgres.on_slot_busy \"maybe\" must be \"wait\" or \"fail\""),
            ("", &[("WALBOX_POSTGRES_RECEIVE_TIMEOUT", "500ms")], "postgres.receive_timeout must be at least 1s (or \"off\")"),
            ("", &[("WALBOX_POSTGRES_SHARDS", "65")], "postgres.shards must be between 1 and 64"),
            ("", &[("WALBOX_POSTGRES_SHARDS", "3"), ("WALBOX_POSTGRES_SLOT", &"s".repeat(60))], "is too long for 3 shards: with the suffix \"_2of3\" it must stay within 63 characters"),
            ("", &[("WALBOX_KAFKA_PROPERTY_TRANSACTIONAL_ID", "x")], "kafka.properties.transactional.id: walbox derives it from the slot"),
            ("", &[("WALBOX_KAFKA_PROPERTY_BOOTSTRAP_SERVERS", "x")], "kafka.properties.bootstrap.servers: set kafka.brokers instead"),
            ("", &[("WALBOX_KAFKA_PROGRESS_TOPIC", "bad topic")], "kafka.progress_topic \"bad topic\" is not a valid topic name"),
            ("", &[("WALBOX_KAFKA_EXACTLY_ONCE", "true"), ("WALBOX_KAFKA_TRANSACTION_MAX_BYTES", "1")], "kafka.transaction_max_bytes must be between 1KiB and 1GiB"),
            ("", &[("WALBOX_KAFKA_EXACTLY_ONCE", "true"), ("WALBOX_KAFKA_TRANSACTION_MAX_EVENTS", "0")], "kafka.transaction_max_events must be between 1 and 10000000"),
            ("", &[("WALBOX_KAFKA_EXACTLY_ONCE", "true"), ("WALBOX_KAFKA_TRANSACTION_INTERVAL", "61s")], "kafka.transaction_interval must be between 1ms and 60s"),
            ("", &[("WALBOX_RELAY_MAX_IN_FLIGHT", "0")], "relay.max_in_flight must be between 1 and 1000000"),
            ("", &[("WALBOX_RELAY_BACKOFF_INITIAL", "1m")], "relay.backoff_initial must be > 0 and <= relay.backoff_max"),
            ("", &[("WALBOX_SLOT_CHECK_INTERVAL", "0s")], "slot.check_interval must be > 0"),
            ("", &[("WALBOX_SLOT_WARNING_BYTES", "30GB")], "slot.warning_bytes must be <= slot.critical_bytes"),
            ("", &[("WALBOX_SLOT_HEARTBEAT_INTERVAL", "0s")], "slot.heartbeat_interval must be > 0 or \"off\""),
            ("", &[("WALBOX_ALERTS_WEBHOOK_URL", "ftp://x")], "alerts.webhook_url must start with http:// or https://"),
            ("", &[("WALBOX_HTTP_LISTEN", "port 80")], "http.listen \"port 80\" is not an address like 0.0.0.0:9187 (or \"off\")"),
            ("", &[("WALBOX_LOG_FORMAT", "xml")], "log.format \"xml\" must be \"text\" or \"json\""),
            // Across sections.
            ("[outbox.messages]\nprefix = \"p\"\n", &[("WALBOX_POSTGRES_SHARDS", "2")], "postgres.shards > 1 cannot relay [outbox.messages]"),
            ("", &[("WALBOX_RELAY_MAX_IN_FLIGHT", "600"), ("WALBOX_KAFKA_PROPERTY_QUEUE_BUFFERING_MAX_MESSAGES", "500")], "relay.max_in_flight (600) exceeds the producer's queue (kafka.properties.queue.buffering.max.messages = 500)"),
        ];
        for (extra, vars, message) in cases {
            let e = load_env(extra, vars).unwrap_err();
            assert!(
                e.starts_with("invalid configuration: ") && e.contains(message),
                "{vars:?}: {e:?} lacks {message:?}"
            );
        }
    }

    #[test]
    fn each_section_fills_in_its_defaults() {
        let c = load_env("", &[]).unwrap();
        assert_eq!(c.postgres.receive_timeout, Some(Duration::from_secs(60)));
        assert_eq!(c.postgres.on_slot_busy, OnSlotBusy::Wait);
        assert_eq!(c.relay.backoff_initial, Duration::from_millis(200));
        assert_eq!(c.relay.shutdown_timeout, Duration::from_secs(30));
        assert_eq!(c.slot.check_interval, Duration::from_secs(10));
        assert_eq!(c.alerts.webhook_attempts, 5);
        assert_eq!(c.kafka.progress_topic, DEFAULT_PROGRESS_TOPIC);
        assert_eq!(c.kafka.exactly_once, None);
        assert_eq!(c.kafka.create_topics, None);
        assert!(
            c.kafka.properties.is_empty(),
            "no queue sized for one shard"
        );
        assert_eq!(
            c.http_listen,
            Some("0.0.0.0:9187".parse::<SocketAddr>().unwrap())
        );
    }
}
