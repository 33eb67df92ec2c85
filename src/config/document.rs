//! The whole configuration document: [`RawConfig`] (every section as written), its validation
//! into [`Config`] (the only type the rest of walbox sees), and [`load`] / [`load_from`].
//!
//! Invariants: loading is file, then environment (`layers.rs`), then the `[outbox]` shorthand
//! normalised (`outbox.rs`), then deserialized with unknown keys rejected, then validated.
//! Validation checks the sections in a fixed order (postgres, outbox, kafka, relay, slot,
//! alerts, the progress topic, http, log) and returns the first error; it fills in every
//! default, so a [`Config`] is complete and consistent.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::alerts::{AlertsConfig, RawAlerts};
use super::conninfo::ConnInfo;
use super::env::LAYOUT;
use super::error::ConfigError;
use super::http::RawHttp;
use super::kafka::{
    check_kafka_properties, valid_topic, ExactlyOnce, KafkaConfig, RawKafka,
    DEFAULT_PROGRESS_TOPIC, TRANSACTION_TIMEOUT_MS,
};
use super::layers::{deserialize, read_layers};
use super::log::{LogConfig, RawLog};
use super::outbox::{self, OutboxConfig, RawOutbox};
use super::postgres::{valid_identifier, OnSlotBusy, PostgresConfig, RawPostgres};
use super::relay::{RawRelay, RelayConfig, DEFAULT_MAX_IN_FLIGHT};
use super::secret::Secret;
use super::slot::{RawSlot, SlotConfig};
use super::units::parse_duration;

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
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// PostgreSQL side.
    pub postgres: PostgresConfig,
    /// The outbox table and its column mapping.
    pub outbox: OutboxConfig,
    /// Kafka side.
    pub kafka: KafkaConfig,
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

/// Loads the configuration from an optional file and the process environment.
pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
    load_from(path, &mut super::env::process_env()?.into_iter())
}

/// Loads the configuration from an optional file and the given environment (testable).
pub fn load_from(
    path: Option<&Path>,
    env: &mut dyn Iterator<Item = (String, String)>,
) -> Result<Config, ConfigError> {
    let (mut table, origin) = read_layers(path, env, &LAYOUT)?;
    outbox::normalize(&mut table)?;
    deserialize::<RawConfig>(table, origin)?.validate()
}

/// librdkafka's bound on records waiting in the producer.
const QUEUE_PROPERTY: &str = "queue.buffering.max.messages";
/// [`QUEUE_PROPERTY`]'s default in librdkafka.
const LIBRDKAFKA_QUEUE_DEFAULT: usize = 100_000;

impl RawConfig {
    /// Checks values and fills in defaults.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let url = self.postgres.url.ok_or_else(|| {
            ConfigError::Invalid(
                "postgres.url is required (set it in the file or WALBOX_POSTGRES_URL)".into(),
            )
        })?;
        let mut conn: ConnInfo = url
            .parse()
            .map_err(|e| ConfigError::Invalid(format!("postgres.url: {e}")))?;
        let mut password_key = "postgres.url";
        if let Some(password) = self.postgres.password {
            conn.password = Some(password);
            password_key = "postgres.password_file (or postgres.password)";
        }
        let failover_slot = self.postgres.failover_slot.unwrap_or(false);
        super::postgres::failover_hosts(&mut conn, failover_slot)?;
        let primary: Option<ConnInfo> = self
            .postgres
            .primary_url
            .map(|u| u.parse())
            .transpose()
            .map_err(|e| ConfigError::Invalid(format!("postgres.primary_url: {e}")))?;
        let slot = self.postgres.slot.unwrap_or_else(|| "walbox".into());
        if !slot
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(ConfigError::Invalid(format!(
                "postgres.slot {slot:?} may contain only lower-case letters, digits and underscores"
            )));
        }
        valid_identifier("postgres.slot", &slot)?;
        let publication = self.postgres.publication.unwrap_or_else(|| "walbox".into());
        valid_identifier("postgres.publication", &publication)?;
        let status_interval = self
            .postgres
            .status_interval
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(1));
        if status_interval.is_zero() || status_interval > Duration::from_secs(1) {
            return Err(ConfigError::Invalid(
                "postgres.status_interval must be between 1ms and 1s".into(),
            ));
        }

        let outbox = self.outbox.validate()?;

        let brokers = self.kafka.brokers.ok_or_else(|| {
            ConfigError::Invalid(
                "kafka.brokers is required (set it in the file or WALBOX_KAFKA_BROKERS)".into(),
            )
        })?;
        for (k, v) in &self.kafka.properties {
            let weakens = match k.as_str() {
                "enable.idempotence" => v != "true",
                "transactional.id" => {
                    return Err(ConfigError::Invalid(
                        "kafka.properties.transactional.id: walbox derives it from the slot; set kafka.exactly_once = true instead".into(),
                    ))
                }
                "acks" | "request.required.acks" => v != "all" && v != "-1",
                "bootstrap.servers" | "metadata.broker.list" => {
                    return Err(ConfigError::Invalid(format!(
                        "kafka.properties.{k}: set kafka.brokers instead"
                    )))
                }
                _ => false,
            };
            if weakens {
                return Err(ConfigError::Invalid(format!(
                    "kafka.properties.{k} = {v:?} would allow lost or reordered events; walbox requires enable.idempotence=true and acks=all"
                )));
            }
        }
        check_kafka_properties(&self.kafka.properties, LAYOUT.prefix)?;

        let max_in_flight = self.relay.max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT);
        if !(1..=1_000_000).contains(&max_in_flight) {
            return Err(ConfigError::Invalid(
                "relay.max_in_flight must be between 1 and 1000000".into(),
            ));
        }
        // The relay must stop reading WAL before librdkafka's queue refuses records. Shards
        // share one producer, whose queue must hold every shard's window: walbox sizes it when
        // the user did not set it, and refuses a set queue that is too small.
        let shards = self.postgres.shards.unwrap_or(1) as usize;
        let windows = max_in_flight * shards;
        let set_queue = self
            .kafka
            .properties
            .get(QUEUE_PROPERTY)
            .and_then(|v| v.trim().parse::<usize>().ok());
        let sized_queue = match set_queue {
            Some(queue) if shards > 1 && windows > queue => {
                return Err(ConfigError::Invalid(format!(
                    "relay.max_in_flight × postgres.shards ({max_in_flight} × {shards}) exceeds the producer's queue (kafka.properties.{QUEUE_PROPERTY} = {queue}), which the shards share: lower relay.max_in_flight, raise the queue, or leave it unset for walbox to size"
                )));
            }
            None if shards > 1 => Some(windows.max(LIBRDKAFKA_QUEUE_DEFAULT)),
            queue if max_in_flight > queue.unwrap_or(LIBRDKAFKA_QUEUE_DEFAULT) => {
                return Err(ConfigError::Invalid(format!(
                    "relay.max_in_flight ({max_in_flight}) exceeds the producer's queue (kafka.properties.{QUEUE_PROPERTY} = {}): lower relay.max_in_flight or raise the queue",
                    queue.unwrap_or(LIBRDKAFKA_QUEUE_DEFAULT)
                )));
            }
            _ => None,
        };
        let backoff_initial = self
            .relay
            .backoff_initial
            .map(|d| d.0)
            .unwrap_or(Duration::from_millis(200));
        let backoff_max = self
            .relay
            .backoff_max
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(30));
        if backoff_initial.is_zero() || backoff_max < backoff_initial {
            return Err(ConfigError::Invalid(
                "relay.backoff_initial must be > 0 and <= relay.backoff_max".into(),
            ));
        }

        let slot_cfg = SlotConfig {
            check_interval: self
                .slot
                .check_interval
                .map(|d| d.0)
                .unwrap_or(Duration::from_secs(10)),
            warning_ratio: self.slot.warning_ratio.unwrap_or(0.5),
            critical_ratio: self.slot.critical_ratio.unwrap_or(0.8),
            warning_bytes: self.slot.warning_bytes.map(|b| b.0).unwrap_or(5 << 30),
            critical_bytes: self.slot.critical_bytes.map(|b| b.0).unwrap_or(20 << 30),
            catchup_threshold: self.slot.catchup_threshold.map(|b| b.0).unwrap_or(16 << 20),
            heartbeat_interval: match self.slot.heartbeat_interval.as_deref() {
                None | Some("off") => None,
                Some(t) => Some(parse_duration(t).map_err(|e| {
                    ConfigError::Invalid(format!("slot.heartbeat_interval: {e} (or \"off\")"))
                })?),
            },
        };
        if slot_cfg.check_interval.is_zero() {
            return Err(ConfigError::Invalid(
                "slot.check_interval must be > 0".into(),
            ));
        }
        if !(0.0 < slot_cfg.warning_ratio
            && slot_cfg.warning_ratio <= slot_cfg.critical_ratio
            && slot_cfg.critical_ratio <= 1.0)
        {
            return Err(ConfigError::Invalid(
                "slot ratios must satisfy 0 < warning_ratio <= critical_ratio <= 1".into(),
            ));
        }
        if slot_cfg.warning_bytes > slot_cfg.critical_bytes {
            return Err(ConfigError::Invalid(
                "slot.warning_bytes must be <= slot.critical_bytes".into(),
            ));
        }
        if slot_cfg.heartbeat_interval.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::Invalid(
                "slot.heartbeat_interval must be > 0 or \"off\"".into(),
            ));
        }
        if let Some(url) = &self.alerts.webhook_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                // Not quoted: webhook URLs often embed a token.
                return Err(ConfigError::Invalid(
                    "alerts.webhook_url must start with http:// or https://".into(),
                ));
            }
        }
        let alerts = AlertsConfig {
            webhook_url: self.alerts.webhook_url,
            webhook_token: self.alerts.webhook_token.map(Secret::new),
            webhook_attempts: self.alerts.webhook_attempts.unwrap_or(5).max(1),
            webhook_timeout: self
                .alerts
                .webhook_timeout
                .map(|d| d.0)
                .unwrap_or(Duration::from_secs(5)),
        };

        let progress_topic = self
            .kafka
            .progress_topic
            .unwrap_or_else(|| DEFAULT_PROGRESS_TOPIC.to_owned());
        if !valid_topic(&progress_topic) {
            return Err(ConfigError::Invalid(format!(
                "kafka.progress_topic {progress_topic:?} is not a valid topic name"
            )));
        }

        let exactly_once = match self.kafka.exactly_once {
            Some(true) => {
                let d = ExactlyOnce::default();
                let max_events = self.kafka.transaction_max_events.unwrap_or(d.max_events);
                let interval = self.kafka.transaction_interval.map_or(d.interval, |i| i.0);
                let max_bytes = self
                    .kafka
                    .transaction_max_bytes
                    .map_or(d.max_bytes as u64, |b| b.0);
                if !(1 << 10..=1 << 30).contains(&max_bytes) {
                    return Err(ConfigError::Invalid(
                        "kafka.transaction_max_bytes must be between 1KiB and 1GiB".into(),
                    ));
                }
                if !(1..=10_000_000).contains(&max_events) {
                    return Err(ConfigError::Invalid(
                        "kafka.transaction_max_events must be between 1 and 10000000".into(),
                    ));
                }
                if interval.is_zero() || interval > Duration::from_secs(60) {
                    return Err(ConfigError::Invalid(
                        "kafka.transaction_interval must be between 1ms and 60s".into(),
                    ));
                }
                let timeout_ms = self
                    .kafka
                    .properties
                    .get("transaction.timeout.ms")
                    .map_or(TRANSACTION_TIMEOUT_MS, String::as_str);
                let timeout = timeout_ms
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|ms| *ms > 0)
                    .map(Duration::from_millis)
                    .ok_or_else(|| {
                        ConfigError::Invalid(format!(
                            "kafka.properties.transaction.timeout.ms = {timeout_ms:?} is not a number of milliseconds above 0"
                        ))
                    })?;
                if interval >= timeout {
                    return Err(ConfigError::Invalid(format!(
                        "kafka.transaction_interval ({interval:?}) must be shorter than the kafka transaction timeout (kafka.properties.transaction.timeout.ms = {timeout_ms}), after which the coordinator aborts the transaction: lower the interval or raise the timeout"
                    )));
                }
                Some(ExactlyOnce {
                    max_events,
                    interval,
                    max_bytes: max_bytes as usize,
                    timeout,
                })
            }
            _ if self.kafka.transaction_max_events.is_some()
                || self.kafka.transaction_interval.is_some()
                || self.kafka.transaction_max_bytes.is_some() =>
            {
                return Err(ConfigError::Invalid(
                    "kafka.transaction_max_events, kafka.transaction_interval and kafka.transaction_max_bytes apply only with kafka.exactly_once = true; set it, or remove them".into(),
                ));
            }
            _ => None,
        };

        let shards = self.postgres.shards.unwrap_or(1);
        super::postgres::validate_shards(shards, &slot, &publication, outbox.messages.is_some())?;

        let http_listen = self.http.validate("0.0.0.0:9187")?;
        let log = self.log.validate()?;

        Ok(Config {
            postgres: PostgresConfig {
                conn,
                password_key,
                primary,
                slot,
                publication,
                create_slot: self.postgres.create_slot.unwrap_or(false),
                create_publication: self.postgres.create_publication.unwrap_or(false),
                status_interval,
                on_slot_busy: OnSlotBusy::parse(self.postgres.on_slot_busy.as_deref())?,
                receive_timeout: match self.postgres.receive_timeout.as_deref() {
                    Some("off") | Some("0") => None,
                    None => Some(Duration::from_secs(60)),
                    Some(t) => {
                        let d = parse_duration(t).map_err(|e| {
                            ConfigError::Invalid(format!(
                                "postgres.receive_timeout: {e} (or \"off\")"
                            ))
                        })?;
                        if d < Duration::from_secs(1) {
                            return Err(ConfigError::Invalid(
                                "postgres.receive_timeout must be at least 1s (or \"off\")".into(),
                            ));
                        }
                        Some(d)
                    }
                },
                failover_slot,
                shards,
                shard: None,
                drain_to: None,
            },
            outbox,
            kafka: KafkaConfig {
                brokers,
                properties: {
                    let mut properties = self.kafka.properties;
                    if let Some(queue) = sized_queue {
                        properties.insert(QUEUE_PROPERTY.to_owned(), queue.to_string());
                    }
                    properties
                },
                create_topics: self.kafka.create_topics.unwrap_or(false).then(|| {
                    (
                        self.kafka.topic_partitions.unwrap_or(-1),
                        self.kafka.topic_replication_factor.unwrap_or(-1),
                    )
                }),
                progress_topic,
                exactly_once,
            },
            relay: RelayConfig {
                max_in_flight,
                shutdown_timeout: self
                    .relay
                    .shutdown_timeout
                    .map(|d| d.0)
                    .unwrap_or(Duration::from_secs(30)),
                backoff_initial,
                backoff_max,
            },
            slot: slot_cfg,
            alerts,
            http_listen,
            log,
        })
    }
}
