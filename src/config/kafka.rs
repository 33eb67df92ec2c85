//! `[kafka]`: the brokers, the producer's librdkafka properties, topic creation and the
//! progress topic; and Kafka's topic name rule ([`valid_topic`]).
//!
//! Invariants: the values of properties whose names mark them as secrets (`password`,
//! `secret`, `*.key.pem`) appear in no `Debug` output and no error. Every property is checked
//! against librdkafka when the configuration is loaded (`check_kafka_properties`); the error
//! names the property and the `<PREFIX>_KAFKA_PROPERTY_<NAME>` variable that can set it, never
//! its value. Validation (`RawConfig::validate`, in `document.rs`) also refuses properties
//! that weaken delivery (`enable.idempotence`, `acks`) or that `kafka.brokers` sets.

use std::collections::BTreeMap;
use std::fmt;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaConfRes;
use serde::Deserialize;

use super::error::{one_line, ConfigError};

/// `kafka.progress_topic` unless set.
pub const DEFAULT_PROGRESS_TOPIC: &str = "walbox.progress";

/// Kafka's topic name rule: 1–249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn valid_topic(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 249
        && t != "."
        && t != ".."
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// `[kafka]` as written.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKafka {
    /// `bootstrap.servers`.
    pub brokers: Option<String>,
    /// librdkafka producer properties.
    #[serde(default, deserialize_with = "scalar_properties")]
    pub properties: BTreeMap<String, String>,
    /// Create missing topics through the admin API.
    pub create_topics: Option<bool>,
    /// Partitions of created topics (-1: the broker's default).
    pub topic_partitions: Option<i32>,
    /// Replication factor of created topics (-1: the broker's default).
    pub topic_replication_factor: Option<i32>,
    /// Compacted topic for walbox's progress records.
    pub progress_topic: Option<String>,
    /// Exactly-once mode: a transactional producer (see `relay::exactly_once`).
    pub exactly_once: Option<bool>,
    /// Exactly-once mode: commit the Kafka transaction after this many events.
    pub transaction_max_events: Option<usize>,
    /// Exactly-once mode: commit the Kafka transaction at least this often.
    pub transaction_interval: Option<super::units::HumanDuration>,
    /// Exactly-once mode: commit the Kafka transaction once it holds this many bytes.
    pub transaction_max_bytes: Option<super::units::ByteSize>,
}

impl fmt::Debug for RawKafka {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawKafka")
            .field("brokers", &self.brokers)
            .field("properties", &redact_properties(&self.properties))
            .finish()
    }
}

/// Validated `[kafka]`.
#[derive(Clone)]
pub struct KafkaConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// Producer properties given by the user (walbox's own defaults are applied by the sink).
    pub properties: BTreeMap<String, String>,
    /// Create missing topics, with these partitions and replication factor.
    pub create_topics: Option<(i32, i32)>,
    /// Compacted topic holding one progress record per slot (see `sink::progress`).
    pub progress_topic: String,
    /// Exactly-once mode and its transaction bounds; `None`: at-least-once.
    pub exactly_once: Option<ExactlyOnce>,
}

/// `kafka.exactly_once = true`: how Kafka transactions are cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExactlyOnce {
    /// A Kafka transaction is committed at the first PostgreSQL commit after this many events.
    pub max_events: usize,
    /// … or after this long since it began (at the next PostgreSQL commit, or when idle).
    pub interval: std::time::Duration,
    /// … or once its events hold this many bytes (keys, values and headers). It also bounds
    /// the events read ahead and buffered while the previous transaction commits.
    pub max_bytes: usize,
    /// `transaction.timeout.ms`: the coordinator aborts a transaction open this long; always
    /// longer than `interval`.
    pub timeout: std::time::Duration,
}

/// `transaction.timeout.ms` of exactly-once mode unless `[kafka.properties]` sets it: the
/// coordinator aborts a transaction left open this long (a killed walbox's, when no successor
/// fences it first).
pub const TRANSACTION_TIMEOUT_MS: &str = "60000";

impl Default for ExactlyOnce {
    fn default() -> Self {
        ExactlyOnce {
            max_events: 10_000,
            interval: std::time::Duration::from_millis(10),
            max_bytes: 4 << 20,
            timeout: std::time::Duration::from_secs(60),
        }
    }
}

impl KafkaConfig {
    /// `brokers` with every other setting at its default: no user properties, no topic
    /// creation, the default progress topic, at-least-once.
    pub fn for_brokers(brokers: impl Into<String>) -> Self {
        KafkaConfig {
            brokers: brokers.into(),
            properties: BTreeMap::new(),
            create_topics: None,
            progress_topic: DEFAULT_PROGRESS_TOPIC.into(),
            exactly_once: None,
        }
    }
}

impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("properties", &redact_properties(&self.properties))
            .finish()
    }
}

/// Property names whose values are secrets.
fn is_secret_property(name: &str) -> bool {
    name.contains("password") || name.contains("secret") || name.ends_with(".key.pem")
}

fn redact_properties(p: &BTreeMap<String, String>) -> BTreeMap<&str, &str> {
    p.iter()
        .map(|(k, v)| {
            let v = if is_secret_property(k) {
                "<redacted>"
            } else {
                v.as_str()
            };
            (k.as_str(), v)
        })
        .collect()
}

/// `[kafka.properties]` as written: strings, or numbers and booleans (librdkafka takes every
/// value as text). A value of another type is refused without quoting it (serde's message
/// would, and the value may be a password).
pub(crate) fn scalar_properties<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    BTreeMap::<String, toml::Value>::deserialize(d)?
        .into_iter()
        .map(|(k, v)| {
            let text = match v {
                toml::Value::String(s) => s,
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                _ => {
                    return Err(serde::de::Error::custom(format!(
                        "kafka.properties.{k:?} must be a string, a number or a boolean"
                    )))
                }
            };
            Ok((k, text))
        })
        .collect()
}

/// Checks every property as librdkafka will when the client is created, so that a misspelt or
/// invalid one is a configuration error at start-up. The error names the property and the
/// variable that can set it (`<env_prefix>_KAFKA_PROPERTY_<NAME>`), never its value: librdkafka's
/// own message repeats the value, which may be a secret.
pub(crate) fn check_kafka_properties(
    properties: &BTreeMap<String, String>,
    env_prefix: &str,
) -> Result<(), ConfigError> {
    for (key, value) in properties {
        if let Some(why) = refused_property(key, value, is_secret_property(key)) {
            let var = format!(
                "{env_prefix}_KAFKA_PROPERTY_{}",
                key.to_ascii_uppercase().replace('.', "_")
            );
            return Err(ConfigError::Invalid(format!(
                "kafka.properties.{key:?} (or {var}) {why}"
            )));
        }
    }
    Ok(())
}

/// Why librdkafka refuses `key = value`, or `None` when it takes it. With `hidden`, the value
/// is not shown (librdkafka's own message repeats it).
pub(crate) fn refused_property(key: &str, value: &str, hidden: bool) -> Option<String> {
    let mut one = ClientConfig::new();
    one.set(key, value);
    let e = one.create_native_config().err()?;
    Some(match &e {
        KafkaError::ClientConfig(RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN, ..) => {
            "is not a librdkafka property: check its spelling against librdkafka's CONFIGURATION.md"
                .to_owned()
        }
        KafkaError::ClientConfig(_, desc, ..) if !hidden => {
            format!("has a value librdkafka refuses: {}", one_line(desc))
        }
        _ => {
            "has a value librdkafka refuses (the value is not shown: it may be a secret)".to_owned()
        }
    })
}
