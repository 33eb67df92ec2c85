//! Configuration: a TOML file and `WALBOX_*` environment variables, validated into [`Config`].
//!
//! Loading is two steps, like ripgrep's low/high level arguments: the file (if any) is read into a
//! TOML table, environment variables are written over it (the environment wins), and the result
//! is deserialized into [`RawConfig`] with unknown keys rejected; [`RawConfig::validate`] then
//! checks values and produces [`Config`], the only type the rest of walbox sees.
//!
//! Every scalar setting `[section] key` can be set as `WALBOX_<SECTION>_<KEY>` (upper case),
//! e.g. `WALBOX_POSTGRES_URL`, `WALBOX_KAFKA_BROKERS`, `WALBOX_OUTBOX_COLUMNS_PAYLOAD`. Producer
//! properties are set as `WALBOX_KAFKA_PROPERTY_<NAME>` with `_` standing for `.`
//! (`WALBOX_KAFKA_PROPERTY_SASL_PASSWORD` sets `sasl.password`). Any other `WALBOX_*` variable
//! is an error naming it, like an unknown key in the file, except those that are not settings
//! (`EnvLayout::accepted`: `WALBOX_CONFIG`, `WALBOX_LOG`) or belong to others
//! (`EnvLayout::foreign`: `WALBOX_INBOX_*`, the tests' `WALBOX_TEST_*`, the benchmarks'
//! `WALBOX_BENCH_*`). `log.level` and `WALBOX_LOG` must be valid filters whose bare directives
//! are levels: `EnvFilter` would take a misspelt level for a target and silence every line.
//!
//! Secrets (the Postgres password, `sasl.password`, `ssl.key.password`, …) never appear in
//! `Debug` output or error messages. Every message that could carry a value is redacted where it
//! is made: a TOML syntax error gives the line, column and what is wrong, never the source line
//! (toml's own message quotes it); a connection string error says which part is wrong, never the
//! string; a librdkafka property librdkafka rejects is named, its value is not (librdkafka's own
//! message repeats it). librdkafka properties are checked here, when the configuration is
//! loaded, so a misspelt one is a configuration error (exit status 3) like an unknown key.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaConfRes;
use serde::Deserialize;

use crate::config::conninfo::ConnInfo;

pub mod conninfo;
pub mod outbox;

use outbox::RawOutbox;
pub use outbox::{ColumnNames, OnChange, OnInvalid, OutboxConfig, Route, RouteSource, ValueFormat};

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

/// Why a configuration could not be loaded; each message is one actionable line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML, or has unknown keys or wrongly typed values.
    #[error("invalid configuration{origin}: {message}")]
    Parse {
        /// " in <file>" or "".
        origin: String,
        /// What serde/toml said, on one line.
        message: String,
    },
    /// An environment variable had a value of the wrong type.
    #[error("invalid value for {var}: {message}")]
    Env {
        /// The variable.
        var: String,
        /// What is wrong.
        message: String,
    },
    /// A variable in walbox's namespace that sets nothing: a typo, which would otherwise be
    /// silently ignored. Its value is never shown.
    #[error("unknown environment variable {var}: no setting has that name{hint}; settings are {prefix}_<SECTION>_<KEY>, librdkafka properties {prefix}_KAFKA_PROPERTY_<NAME>")]
    UnknownEnv {
        /// The variable.
        var: String,
        /// " (did you mean …?)" or "".
        hint: String,
        /// The command's prefix, e.g. `WALBOX`.
        prefix: &'static str,
    },
    /// A value is out of range or inconsistent.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Duration written as `"500ms"`, `"10s"`, `"5m"`, `"1h"`, `"14d"` or a number of seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Secs(u64),
            Text(String),
        }
        match Repr::deserialize(d)? {
            Repr::Secs(s) => Ok(HumanDuration(Duration::from_secs(s))),
            Repr::Text(t) => parse_duration(&t)
                .map(HumanDuration)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// Parses `"500ms"`, `"10s"`, `"5m"`, `"1h"`, `"14d"` or plain seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid duration {text:?}: expected e.g. 500ms, 10s, 5m, 1h"))?;
    let d = match unit.trim() {
        "" | "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        "d" => Duration::from_secs(n.saturating_mul(86_400)),
        _ => {
            return Err(format!(
                "invalid duration {text:?}: expected e.g. 500ms, 10s, 5m, 1h"
            ))
        }
    };
    Ok(d)
}

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

/// `[postgres]` as written.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPostgres {
    /// Connection URL or libpq key=value string.
    pub url: Option<String>,
    /// Replication slot name.
    pub slot: Option<String>,
    /// Publication name.
    pub publication: Option<String>,
    /// Create the slot when it is missing.
    pub create_slot: Option<bool>,
    /// Create the publication when it is missing.
    pub create_publication: Option<bool>,
    /// Interval between standby status updates (at most 1 s).
    pub status_interval: Option<HumanDuration>,
}

impl fmt::Debug for RawPostgres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawPostgres")
            .field("url", &self.url.as_ref().map(|_| "<redacted>"))
            .field("slot", &self.slot)
            .field("publication", &self.publication)
            .finish_non_exhaustive()
    }
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
}

impl fmt::Debug for RawKafka {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawKafka")
            .field("brokers", &self.brokers)
            .field("properties", &redact_properties(&self.properties))
            .finish()
    }
}

/// `[relay]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRelay {
    /// Maximum events produced but not yet acknowledged.
    pub max_in_flight: Option<usize>,
    /// How long shutdown waits for in-flight acknowledgements.
    pub shutdown_timeout: Option<HumanDuration>,
    /// First reconnect delay.
    pub backoff_initial: Option<HumanDuration>,
    /// Longest reconnect delay.
    pub backoff_max: Option<HumanDuration>,
}

/// A byte size written as `"512MB"`, `"10GB"` (PostgreSQL's 1024-based units `kB`, `MB`, `GB`,
/// `TB`) or a number of bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Bytes(u64),
            Text(String),
        }
        match Repr::deserialize(d)? {
            Repr::Bytes(b) => Ok(ByteSize(b)),
            Repr::Text(t) => parse_size(&t)
                .map(ByteSize)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// Parses `"512MB"`, `"10GB"`, `"1TB"`, `"64kB"` (1024-based, like PostgreSQL) or plain bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let err = || format!("invalid size {text:?}: expected e.g. 512MB, 10GB");
    let n: u64 = num.parse().map_err(|_| err())?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "kB" | "KB" => 1 << 10,
        "MB" => 1 << 20,
        "GB" => 1 << 30,
        "TB" => 1 << 40,
        _ => return Err(err()),
    };
    n.checked_mul(mult).ok_or_else(err)
}

/// `[slot]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSlot {
    /// How often the slot's health is checked.
    pub check_interval: Option<HumanDuration>,
    /// Warning when retained WAL ≥ this share of `max_slot_wal_keep_size`.
    pub warning_ratio: Option<f64>,
    /// Critical when retained WAL ≥ this share of `max_slot_wal_keep_size`.
    pub critical_ratio: Option<f64>,
    /// Warning threshold when `max_slot_wal_keep_size = -1`.
    pub warning_bytes: Option<ByteSize>,
    /// Critical threshold when `max_slot_wal_keep_size = -1`.
    pub critical_bytes: Option<ByteSize>,
    /// Interval of `pg_logical_emit_message` heartbeats; `"off"` (default) disables them.
    pub heartbeat_interval: Option<String>,
}

/// `[alerts]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAlerts {
    /// URL receiving each alert level transition as JSON (Alertmanager webhook format).
    pub webhook_url: Option<String>,
    /// Delivery attempts per transition.
    pub webhook_attempts: Option<u32>,
    /// Timeout of one attempt.
    pub webhook_timeout: Option<HumanDuration>,
}

/// `[http]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp {
    /// Listen address of `/metrics`, `/healthz`, `/readyz`; `"off"` disables it.
    pub listen: Option<String>,
}

impl RawHttp {
    /// The listen address (`default` when unset), `None` for `"off"`.
    pub(crate) fn validate(self, default: &str) -> Result<Option<SocketAddr>, ConfigError> {
        let listen = self.listen.unwrap_or_else(|| default.into());
        if listen == "off" {
            return Ok(None);
        }
        listen.parse::<SocketAddr>().map(Some).map_err(|_| {
            ConfigError::Invalid(format!(
                "http.listen {listen:?} is not an address like {default} (or \"off\")"
            ))
        })
    }
}

/// `[log]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    /// `text` or `json`.
    pub format: Option<String>,
    /// A `tracing` filter, e.g. `info` or `walbox=debug`.
    pub level: Option<String>,
}

/// The variable that overrides `log.level` (read by `main`); checked like `log.level`.
pub const LOG_ENV: &str = "WALBOX_LOG";

/// Checks a `tracing` filter: comma-separated directives, each a level (`info`) or
/// `target[span{field=value}]=level`. `EnvFilter` alone would take a misspelt level such as
/// `warning` for a target name, and then log nothing at all, errors included: here a directive
/// without `=` must be a level.
pub fn check_log_filter(filter: &str) -> Result<(), String> {
    const LEVELS: &str = "trace, debug, info, warn, error or off";
    let mut directives = 0;
    for directive in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        directives += 1;
        let level = match directive.rsplit_once('=') {
            _ if directive.ends_with(']') => "",
            Some((_, level)) => level,
            None => directive,
        };
        if level
            .parse::<tracing::level_filters::LevelFilter>()
            .is_err()
        {
            return Err(if level == directive {
                format!(
                    "{directive:?} is not a level ({LEVELS}); a target takes one, e.g. \"info,walbox=debug\""
                )
            } else {
                format!("{directive:?} does not end with a level (=<{LEVELS}>)")
            });
        }
    }
    if directives == 0 {
        return Err(format!("is empty; use a level ({LEVELS})"));
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(filter)
        .map(drop)
        .map_err(|e| one_line(&e.to_string()))
}

impl RawLog {
    /// Format and level, with their defaults.
    pub(crate) fn validate(self) -> Result<LogConfig, ConfigError> {
        let format = match self.format.as_deref().unwrap_or("text") {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => {
                return Err(ConfigError::Invalid(format!(
                    "log.format {other:?} must be \"text\" or \"json\""
                )))
            }
        };
        let level = self.level.unwrap_or_else(|| "info".into());
        check_log_filter(&level)
            .map_err(|why| ConfigError::Invalid(format!("log.level {level:?}: {why}")))?;
        Ok(LogConfig { format, level })
    }
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
    /// Logging.
    pub log: LogConfig,
}

/// Validated `[postgres]`.
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    /// Parsed connection settings (password redacted in `Debug`).
    pub conn: ConnInfo,
    /// Replication slot.
    pub slot: String,
    /// Publication.
    pub publication: String,
    /// Create the slot when missing.
    pub create_slot: bool,
    /// Create the publication when missing.
    pub create_publication: bool,
    /// Interval between standby status updates.
    pub status_interval: Duration,
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
}

impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("properties", &redact_properties(&self.properties))
            .finish()
    }
}

/// Validated `[relay]`.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Maximum events produced and not yet retired by the checkpoint.
    pub max_in_flight: usize,
    /// How long shutdown waits for in-flight acknowledgements.
    pub shutdown_timeout: Duration,
    /// First reconnect delay.
    pub backoff_initial: Duration,
    /// Longest reconnect delay.
    pub backoff_max: Duration,
}

/// Validated `[slot]`.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotConfig {
    /// How often the slot's health is checked.
    pub check_interval: Duration,
    /// Warning ratio of `max_slot_wal_keep_size`.
    pub warning_ratio: f64,
    /// Critical ratio of `max_slot_wal_keep_size`.
    pub critical_ratio: f64,
    /// Warning threshold in bytes when the keep size is unlimited.
    pub warning_bytes: u64,
    /// Critical threshold in bytes when the keep size is unlimited.
    pub critical_bytes: u64,
    /// Heartbeat interval; `None` disables heartbeats.
    pub heartbeat_interval: Option<Duration>,
}

/// Validated `[alerts]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertsConfig {
    /// Webhook receiving level transitions.
    pub webhook_url: Option<String>,
    /// Delivery attempts per transition.
    pub webhook_attempts: u32,
    /// Timeout of one attempt.
    pub webhook_timeout: Duration,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Validated `[log]`.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Format.
    pub format: LogFormat,
    /// `tracing` filter directive.
    pub level: String,
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
        let mut one = ClientConfig::new();
        one.set(key, value);
        let Err(e) = one.create_native_config() else {
            continue;
        };
        let var = format!(
            "{env_prefix}_KAFKA_PROPERTY_{}",
            key.to_ascii_uppercase().replace('.', "_")
        );
        let why = match &e {
            KafkaError::ClientConfig(RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN, ..) => {
                "is not a librdkafka property: check its spelling against librdkafka's CONFIGURATION.md".to_owned()
            }
            KafkaError::ClientConfig(_, desc, ..) if !is_secret_property(key) => {
                format!("has a value librdkafka refuses: {}", one_line(desc))
            }
            _ => "has a value librdkafka refuses (the value is not shown: it may be a secret)"
                .to_owned(),
        };
        return Err(ConfigError::Invalid(format!(
            "kafka.properties.{key:?} (or {var}) {why}"
        )));
    }
    Ok(())
}

/// Kinds of values settable from the environment.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    /// A string.
    Str,
    /// `true`/`false` (also 1/0, yes/no, on/off).
    Bool,
    /// An integer.
    Int,
    /// A number.
    Float,
    /// A comma-separated list of strings.
    List,
}

/// Which environment variables override which keys of one configuration file.
pub(crate) struct EnvLayout {
    /// Variable prefix, e.g. `WALBOX`: `WALBOX_<PATH>_<KEY>` sets `[path] key`, and
    /// `WALBOX_KAFKA_PROPERTY_<NAME>` sets `[kafka.properties] name` (`_` standing for `.`).
    pub prefix: &'static str,
    /// `(section path, key, kind)` of every settable key.
    pub scalars: &'static [(&'static [&'static str], &'static str, Kind)],
    /// Variables with the prefix that this command reads but that set nothing here.
    pub accepted: &'static [&'static str],
    /// Prefixes within `<prefix>_` that belong to others (another command, the test and
    /// benchmark harnesses). Every other `<prefix>_*` variable must be a setting: an unknown
    /// one is an error, like an unknown key in the file.
    pub foreign: &'static [&'static str],
}

/// The environment layout of `walbox run`'s configuration.
const LAYOUT: EnvLayout = EnvLayout {
    prefix: "WALBOX",
    scalars: SCALARS,
    // The config file (clap reads it) and the log filter override (main reads it).
    accepted: &["WALBOX_CONFIG", LOG_ENV],
    // `walbox inbox`'s, and the variables of the tests and benchmarks.
    foreign: &["WALBOX_INBOX_", "WALBOX_TEST_", "WALBOX_BENCH_"],
};

impl EnvLayout {
    /// `<prefix>_<PATH>_<KEY>` of a setting.
    fn var(&self, path: &[&str], key: &str) -> String {
        let mut name = String::from(self.prefix);
        for p in path {
            name.push('_');
            name.push_str(&p.to_ascii_uppercase());
        }
        name.push('_');
        name.push_str(&key.to_ascii_uppercase());
        name
    }

    /// Whether `var` is in this command's namespace and yet not a variable it knows.
    fn is_unknown(&self, var: &str) -> bool {
        var.strip_prefix(self.prefix)
            .is_some_and(|rest| rest.starts_with('_'))
            && !self.accepted.contains(&var)
            && !self.foreign.iter().any(|p| var.starts_with(p))
    }

    /// " (did you mean X?)" for the known variable closest to `var`, if close.
    fn suggestion(&self, var: &str) -> String {
        self.scalars
            .iter()
            .map(|(path, key, _)| self.var(path, key))
            .chain(self.accepted.iter().map(|v| (*v).to_owned()))
            .map(|known| (edit_distance(var, &known), known))
            .filter(|(d, _)| *d <= 2)
            .min()
            .map(|(_, known)| format!(" (did you mean {known}?)"))
            .unwrap_or_default()
    }
}

/// Levenshtein distance between two ASCII-ish names.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// `(section path, key, kind)` of every scalar setting; `WALBOX_<PATH>_<KEY>` sets it.
const SCALARS: &[(&[&str], &str, Kind)] = &[
    (&["postgres"], "url", Kind::Str),
    (&["postgres"], "slot", Kind::Str),
    (&["postgres"], "publication", Kind::Str),
    (&["postgres"], "create_slot", Kind::Bool),
    (&["postgres"], "create_publication", Kind::Bool),
    (&["postgres"], "status_interval", Kind::Str),
    (&["outbox"], "table", Kind::Str),
    (&["outbox"], "topic_prefix", Kind::Str),
    (&["outbox"], "topic", Kind::Str),
    (&["outbox"], "fallback_topic", Kind::Str),
    (&["outbox"], "format", Kind::Str),
    (&["outbox"], "expand_json_payload", Kind::Bool),
    (&["outbox"], "cloudevents", Kind::Bool),
    (&["outbox"], "cloudevents_source", Kind::Str),
    (&["outbox"], "tombstones", Kind::Bool),
    (&["outbox"], "on_invalid", Kind::Str),
    (&["outbox"], "dead_letter_topic", Kind::Str),
    (&["outbox"], "on_change", Kind::Str),
    (&["outbox", "columns"], "id", Kind::Str),
    (&["outbox", "columns"], "aggregate_id", Kind::Str),
    (&["outbox", "columns"], "aggregate_type", Kind::Str),
    (&["outbox", "columns"], "event_type", Kind::Str),
    (&["outbox", "columns"], "topic", Kind::Str),
    (&["outbox", "columns"], "payload", Kind::Str),
    (&["outbox", "columns"], "timestamp", Kind::Str),
    (&["outbox", "columns"], "partition", Kind::Str),
    (&["kafka"], "brokers", Kind::Str),
    (&["kafka"], "create_topics", Kind::Bool),
    (&["kafka"], "topic_partitions", Kind::Int),
    (&["kafka"], "topic_replication_factor", Kind::Int),
    (&["kafka"], "progress_topic", Kind::Str),
    (&["relay"], "max_in_flight", Kind::Int),
    (&["relay"], "shutdown_timeout", Kind::Str),
    (&["relay"], "backoff_initial", Kind::Str),
    (&["relay"], "backoff_max", Kind::Str),
    (&["slot"], "check_interval", Kind::Str),
    (&["slot"], "warning_ratio", Kind::Float),
    (&["slot"], "critical_ratio", Kind::Float),
    (&["slot"], "warning_bytes", Kind::Str),
    (&["slot"], "critical_bytes", Kind::Str),
    (&["slot"], "heartbeat_interval", Kind::Str),
    (&["alerts"], "webhook_url", Kind::Str),
    (&["alerts"], "webhook_attempts", Kind::Int),
    (&["alerts"], "webhook_timeout", Kind::Str),
    (&["http"], "listen", Kind::Str),
    (&["log"], "format", Kind::Str),
    (&["log"], "level", Kind::Str),
];

fn table_at<'a>(root: &'a mut toml::Table, path: &[&str]) -> Result<&'a mut toml::Table, String> {
    let mut t = root;
    for p in path {
        let entry = t
            .entry((*p).to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = entry
            .as_table_mut()
            .ok_or_else(|| format!("`{p}` must be a table"))?;
    }
    Ok(t)
}

/// Writes the variables of `env` that `layout` names over `root`.
fn apply_env(
    root: &mut toml::Table,
    env: &mut dyn Iterator<Item = (String, String)>,
    layout: &EnvLayout,
) -> Result<(), ConfigError> {
    let property_prefix = format!("{}_KAFKA_PROPERTY_", layout.prefix);
    for (var, value) in env {
        if var == LOG_ENV {
            // Whichever command runs, main lets it override log.level: check it the same way.
            check_log_filter(&value).map_err(|message| ConfigError::Env {
                var: var.clone(),
                message,
            })?;
            continue;
        }
        if let Some(name) = var.strip_prefix(&property_prefix) {
            let key = name.to_ascii_lowercase().replace('_', ".");
            let t =
                table_at(root, &["kafka", "properties"]).map_err(|message| ConfigError::Env {
                    var: var.clone(),
                    message,
                })?;
            t.insert(key, toml::Value::String(value));
            continue;
        }
        let Some((path, key, kind)) = layout
            .scalars
            .iter()
            .find(|(path, key, _)| layout.var(path, key) == var)
        else {
            if layout.is_unknown(&var) {
                return Err(ConfigError::UnknownEnv {
                    hint: layout.suggestion(&var),
                    var,
                    prefix: layout.prefix,
                });
            }
            continue;
        };
        let bad = |what: &str| ConfigError::Env {
            var: var.clone(),
            message: format!("expected {what}, got {value:?}"),
        };
        let v = match kind {
            Kind::Str => toml::Value::String(value.clone()),
            Kind::List => toml::Value::Array(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| toml::Value::String(s.to_owned()))
                    .collect(),
            ),
            Kind::Bool => match value.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => toml::Value::Boolean(true),
                "false" | "0" | "no" | "off" => toml::Value::Boolean(false),
                _ => return Err(bad("true or false")),
            },
            Kind::Float => toml::Value::Float(value.parse().map_err(|_| bad("a number"))?),
            Kind::Int => toml::Value::Integer(value.parse().map_err(|_| bad("an integer"))?),
        };
        let t = table_at(root, path).map_err(|message| ConfigError::Env { var, message })?;
        t.insert((*key).to_owned(), v);
    }
    Ok(())
}

/// Reads an optional TOML file and writes the environment over it (the environment wins).
/// Returns the table and " in <file>" (or "") for error messages.
pub(crate) fn read_layers(
    path: Option<&Path>,
    env: &mut dyn Iterator<Item = (String, String)>,
    layout: &EnvLayout,
) -> Result<(toml::Table, String), ConfigError> {
    let (mut table, origin) = match path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.to_owned(),
                source,
            })?;
            let origin = format!(" in {}", p.display());
            let table = text
                .parse::<toml::Table>()
                .map_err(|e| ConfigError::Parse {
                    origin: origin.clone(),
                    message: syntax_error(&text, &e),
                })?;
            (table, origin)
        }
        None => (toml::Table::new(), String::new()),
    };
    apply_env(&mut table, env, layout)?;
    Ok((table, origin))
}

/// A TOML syntax error as "line L, column C: what is wrong". toml's `Display` quotes the whole
/// source line, which may hold a password: only its message is used.
fn syntax_error(text: &str, e: &toml::de::Error) -> String {
    let what = one_line(e.message());
    let Some(span) = e.span() else {
        return format!("TOML syntax error: {what}");
    };
    let before = &text.as_bytes()[..span.start.min(text.len())];
    let line_start = before
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |i| i + 1);
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    format!("TOML syntax error at line {line}, column {column}: {what}")
}

/// Deserializes a layered table, naming the file in errors.
pub(crate) fn deserialize<T: serde::de::DeserializeOwned>(
    table: toml::Table,
    origin: String,
) -> Result<T, ConfigError> {
    T::deserialize(table).map_err(|e| ConfigError::Parse {
        origin,
        message: one_line(&e.to_string()),
    })
}

/// Loads the configuration from an optional file and the process environment.
pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
    load_from(path, &mut std::env::vars())
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

/// Joins a multi-line (toml/serde) error message into one line.
pub(crate) fn one_line(s: &str) -> String {
    s.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.chars().all(|c| c == '|' || c == '^' || c == ' '))
        .collect::<Vec<_>>()
        .join(" ")
}

fn valid_identifier(what: &str, s: &str) -> Result<(), ConfigError> {
    if s.is_empty() || s.len() > 63 {
        return Err(ConfigError::Invalid(format!(
            "{what} {s:?} must be 1 to 63 characters"
        )));
    }
    Ok(())
}

impl RawConfig {
    /// Checks values and fills in defaults.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let url = self.postgres.url.ok_or_else(|| {
            ConfigError::Invalid(
                "postgres.url is required (set it in the file or WALBOX_POSTGRES_URL)".into(),
            )
        })?;
        let conn: ConnInfo = url
            .parse()
            .map_err(|e| ConfigError::Invalid(format!("postgres.url: {e}")))?;
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

        let max_in_flight = self.relay.max_in_flight.unwrap_or(10_000);
        if !(1..=1_000_000).contains(&max_in_flight) {
            return Err(ConfigError::Invalid(
                "relay.max_in_flight must be between 1 and 1000000".into(),
            ));
        }
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

        let http_listen = self.http.validate("0.0.0.0:9187")?;
        let log = self.log.validate()?;

        Ok(Config {
            postgres: PostgresConfig {
                conn,
                slot,
                publication,
                create_slot: self.postgres.create_slot.unwrap_or(false),
                create_publication: self.postgres.create_publication.unwrap_or(false),
                status_interval,
            },
            outbox,
            kafka: KafkaConfig {
                brokers,
                properties: self.kafka.properties,
                create_topics: self.kafka.create_topics.unwrap_or(false).then(|| {
                    (
                        self.kafka.topic_partitions.unwrap_or(-1),
                        self.kafka.topic_replication_factor.unwrap_or(-1),
                    )
                }),
                progress_topic,
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

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
