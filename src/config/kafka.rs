//! `[kafka]`: the brokers, the producer's librdkafka properties, topic creation and the
//! progress topic; and Kafka's topic name rule ([`valid_topic`]).
//!
//! Invariants: the values of properties whose names mark them as secrets (`password`,
//! `secret`, `*.key.pem`) appear in no `Debug` output and no error. Every property is checked
//! against librdkafka when the configuration is loaded (`check_kafka_properties`); the error
//! names the property and the `<PREFIX>_KAFKA_PROPERTY_<NAME>` variable that can set it, never
//! its value. Validation ([`RawKafka::validate`]) also refuses properties that weaken delivery
//! (`enable.idempotence`, `acks`) or that `kafka.brokers` sets.
//!
//! The connection keys (`brokers` and the properties, where SASL and TLS are set) are every
//! `[kafka]` section's, `walbox inbox`'s too: [`RawKafkaConnection`] validates them for both
//! commands, each with its own rule for the properties that walbox manages.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaConfRes;
use serde::Deserialize;

use super::env::{EnvLayout, Kind, Setting};
use super::error::{one_line, ConfigError};
use super::units::{ByteSize, HumanDuration};

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
    pub transaction_interval: Option<HumanDuration>,
    /// Exactly-once mode: commit the Kafka transaction once it holds this many bytes.
    pub transaction_max_bytes: Option<ByteSize>,
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
    pub interval: Duration,
    /// … or once its events hold this many bytes (keys, values and headers). It also bounds
    /// the events read ahead and buffered while the previous transaction commits.
    pub max_bytes: usize,
    /// `transaction.timeout.ms`: the coordinator aborts a transaction open this long; always
    /// longer than `interval`.
    pub timeout: Duration,
}

/// `transaction.timeout.ms` of exactly-once mode unless `[kafka.properties]` sets it: the
/// coordinator aborts a transaction left open this long (a killed walbox's, when no successor
/// fences it first).
pub const TRANSACTION_TIMEOUT_MS: &str = "60000";

impl Default for ExactlyOnce {
    fn default() -> Self {
        ExactlyOnce {
            max_events: 10_000,
            interval: Duration::from_millis(10),
            max_bytes: 4 << 20,
            timeout: Duration::from_secs(60),
        }
    }
}

/// The connection keys of a `[kafka]` section, `walbox run`'s and `walbox inbox`'s: each
/// section declares the two fields (so that an unknown key's message lists the section's
/// keys), and hands them here to be checked.
pub(crate) struct RawKafkaConnection {
    /// `brokers`: `bootstrap.servers`.
    pub brokers: Option<String>,
    /// `[kafka.properties]`: librdkafka properties (SASL and TLS among them).
    pub properties: BTreeMap<String, String>,
}

/// A validated [`RawKafkaConnection`].
pub(crate) struct KafkaConnection {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// Properties librdkafka takes, none of them one walbox manages.
    pub properties: BTreeMap<String, String>,
}

impl RawKafkaConnection {
    /// The variable of `brokers` (`<PREFIX>_KAFKA_BROKERS`); properties have their own form
    /// (`<PREFIX>_KAFKA_PROPERTY_<NAME>`, in `env.rs`).
    pub(crate) const SETTINGS: &'static [Setting] = &[(&["kafka"], "brokers", Kind::Str)];

    /// `brokers` is required (the message names `env`'s variable for it); each property passes
    /// `managed` (the command's refusal of the properties walbox sets itself), then librdkafka.
    pub(crate) fn validate(
        self,
        env: &EnvLayout,
        managed: impl Fn(&str, &str) -> Result<(), ConfigError>,
    ) -> Result<KafkaConnection, ConfigError> {
        let brokers = self.brokers.ok_or_else(|| {
            ConfigError::Invalid(format!(
                "kafka.brokers is required (set it in the file or {})",
                env.var(&["kafka"], "brokers")
            ))
        })?;
        for (key, value) in &self.properties {
            managed(key, value)?;
        }
        check_kafka_properties(&self.properties, env)?;
        Ok(KafkaConnection {
            brokers,
            properties: self.properties,
        })
    }
}

/// The producer properties walbox manages: those that would weaken delivery, the transactional
/// id (exactly-once mode derives it), and the brokers.
fn producer_property(key: &str, value: &str) -> Result<(), ConfigError> {
    let weakens = match key {
        "enable.idempotence" => value != "true",
        "transactional.id" => {
            return Err(ConfigError::Invalid(
                "kafka.properties.transactional.id: walbox derives it from the slot; set kafka.exactly_once = true instead".into(),
            ))
        }
        "acks" | "request.required.acks" => value != "all" && value != "-1",
        "bootstrap.servers" | "metadata.broker.list" => {
            return Err(ConfigError::Invalid(format!(
                "kafka.properties.{key}: set kafka.brokers instead"
            )))
        }
        _ => false,
    };
    if weakens {
        return Err(ConfigError::Invalid(format!(
            "kafka.properties.{key} = {value:?} would allow lost or reordered events; walbox requires enable.idempotence=true and acks=all"
        )));
    }
    Ok(())
}

impl RawKafka {
    /// `walbox run`'s settings of `[kafka]` besides the connection's.
    pub(super) const SETTINGS: &'static [Setting] = &[
        (&["kafka"], "create_topics", Kind::Bool),
        (&["kafka"], "topic_partitions", Kind::Int),
        (&["kafka"], "topic_replication_factor", Kind::Int),
        (&["kafka"], "progress_topic", Kind::Str),
        (&["kafka"], "exactly_once", Kind::Bool),
        (&["kafka"], "transaction_max_events", Kind::Int),
        (&["kafka"], "transaction_interval", Kind::Str),
        (&["kafka"], "transaction_max_bytes", Kind::Str),
    ];

    /// Checks values and fills in defaults; `env` names the variables in messages. The
    /// producer's queue is sized later, with `[relay]` (`document.rs`).
    pub(super) fn validate(self, env: &EnvLayout) -> Result<KafkaConfig, ConfigError> {
        let connection = RawKafkaConnection {
            brokers: self.brokers,
            properties: self.properties,
        }
        .validate(env, producer_property)?;
        let progress_topic = self
            .progress_topic
            .unwrap_or_else(|| DEFAULT_PROGRESS_TOPIC.to_owned());
        if !valid_topic(&progress_topic) {
            return Err(ConfigError::Invalid(format!(
                "kafka.progress_topic {progress_topic:?} is not a valid topic name"
            )));
        }
        let exactly_once = match self.exactly_once {
            Some(true) => Some(ExactlyOnce::validate(
                self.transaction_max_events,
                self.transaction_interval,
                self.transaction_max_bytes,
                &connection.properties,
            )?),
            _ if self.transaction_max_events.is_some()
                || self.transaction_interval.is_some()
                || self.transaction_max_bytes.is_some() =>
            {
                return Err(ConfigError::Invalid(
                    "kafka.transaction_max_events, kafka.transaction_interval and kafka.transaction_max_bytes apply only with kafka.exactly_once = true; set it, or remove them".into(),
                ));
            }
            _ => None,
        };
        Ok(KafkaConfig {
            brokers: connection.brokers,
            properties: connection.properties,
            create_topics: self.create_topics.unwrap_or(false).then(|| {
                (
                    self.topic_partitions.unwrap_or(-1),
                    self.topic_replication_factor.unwrap_or(-1),
                )
            }),
            progress_topic,
            exactly_once,
        })
    }
}

impl ExactlyOnce {
    /// The transaction bounds of `kafka.exactly_once = true`, and the coordinator's timeout
    /// (`transaction.timeout.ms` in `properties`), which the interval must stay under.
    fn validate(
        max_events: Option<usize>,
        interval: Option<HumanDuration>,
        max_bytes: Option<ByteSize>,
        properties: &BTreeMap<String, String>,
    ) -> Result<Self, ConfigError> {
        let d = ExactlyOnce::default();
        let max_events = max_events.unwrap_or(d.max_events);
        let interval = interval.map_or(d.interval, |i| i.0);
        let max_bytes = max_bytes.map_or(d.max_bytes as u64, |b| b.0);
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
        let timeout_ms = properties
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
        Ok(ExactlyOnce {
            max_events,
            interval,
            max_bytes: max_bytes as usize,
            timeout,
        })
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
/// variable that can set it (`<PREFIX>_KAFKA_PROPERTY_<NAME>`), never its value: librdkafka's
/// own message repeats the value, which may be a secret.
fn check_kafka_properties(
    properties: &BTreeMap<String, String>,
    env: &EnvLayout,
) -> Result<(), ConfigError> {
    for (key, value) in properties {
        if let Some(why) = refused_property(key, value, is_secret_property(key)) {
            let var = env.property_var(key);
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
