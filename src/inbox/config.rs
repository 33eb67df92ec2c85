//! `inbox.toml` and `WALBOX_INBOX_*` environment variables, validated into [`InboxConfig`].
//!
//! Same two steps as the relay's [`crate::config`]: the file (if any) is read into a TOML table,
//! environment variables are written over it (the environment wins), the result is deserialized
//! into [`RawInboxConfig`] with unknown keys rejected, and [`RawInboxConfig::validate`] checks
//! values and produces [`InboxConfig`].
//!
//! Every scalar setting `[section] key` can be set as `WALBOX_INBOX_<SECTION>_<KEY>`, e.g.
//! `WALBOX_INBOX_POSTGRES_URL`, `WALBOX_INBOX_EFFECT_SQL`; `kafka.topics` takes a comma-separated
//! list (`WALBOX_INBOX_KAFKA_TOPICS=a,b`). Consumer properties are set as
//! `WALBOX_INBOX_KAFKA_PROPERTY_<NAME>` with `_` standing for `.`. Any other `WALBOX_INBOX_*`
//! variable but `WALBOX_INBOX_CONFIG` is an error naming it; other `WALBOX_*` variables belong
//! to `walbox run` and are ignored here.
//!
//! What the inbox shares with `walbox run` comes from [`crate::config`], with its checks and
//! its variables: the connection keys of `[postgres]` (`url`, `password`) and `[kafka]`
//! (`brokers`, the properties), and the `[http]` and `[log]` sections whole. Each section
//! validates itself (`Raw….validate`); [`RawInboxConfig::validate`] runs them in order
//! (postgres, kafka, effect, retention, http, log) and adds the rules across sections (the
//! consumer defaults to the group, `dead_letter` policies need the dead-letter topic).
//!
//! Secrets (the PostgreSQL password, `sasl.password`, …) never appear in `Debug` output nor in
//! error messages, which are redacted where they are made, as the relay's are (see
//! [`crate::config`]); consumer properties are checked against librdkafka at load time.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::config::conninfo::ConnInfo;
use crate::config::{
    backoff, read_document, valid_identifier, ConfigError, EnvLayout, HumanDuration, KafkaRole,
    Kind, LogConfig, RawHttp, RawKafkaConnection, RawLog, RawPgConnection, Setting, INBOX_PREFIX,
};

use super::effect::EffectSql;
use super::set_effect::BatchSql;
use crate::dead_letter::Policy;

/// The configuration as written: every field optional, unknown keys rejected.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawInboxConfig {
    /// `[postgres]`
    #[serde(default)]
    pub postgres: RawPostgres,
    /// `[kafka]`
    #[serde(default)]
    pub kafka: RawKafka,
    /// `[effect]`
    #[serde(default)]
    pub effect: RawEffect,
    /// `[retention]`
    #[serde(default)]
    pub retention: RawRetention,
    /// `[http]`
    #[serde(default)]
    pub http: RawHttp,
    /// `[log]`
    #[serde(default)]
    pub log: RawLog,
}

/// `[postgres]` as written: the connection keys of [`RawPgConnection`], and the inbox table.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPostgres {
    /// Connection URL or libpq key=value string of the consumer's database.
    pub url: Option<String>,
    /// The password of `url`'s role (overrides one in `url`), e.g. from `password_file`.
    pub password: Option<String>,
    /// `schema.table` or `table` of the inbox.
    pub table: Option<String>,
    /// Value of the inbox's `consumer` column.
    pub consumer: Option<String>,
}

impl fmt::Debug for RawPostgres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawPostgres")
            .field("url", &self.url.as_ref().map(|_| "<redacted>"))
            .field("table", &self.table)
            .field("consumer", &self.consumer)
            .finish()
    }
}

/// `[kafka]` as written: the connection keys of [`RawKafkaConnection`], and the consumer's.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKafka {
    /// `bootstrap.servers`.
    pub brokers: Option<String>,
    /// Consumer group.
    pub group_id: Option<String>,
    /// Static group membership (`group.instance.id`).
    pub group_instance_id: Option<String>,
    /// Topics to consume.
    pub topics: Option<Vec<String>>,
    /// Header holding the producer's event id.
    pub message_id_header: Option<String>,
    /// Topic receiving dead-lettered records.
    pub dead_letter_topic: Option<String>,
    /// How often processed offsets are committed.
    pub commit_interval: Option<HumanDuration>,
    /// librdkafka consumer properties.
    #[serde(default, deserialize_with = "crate::config::scalar_properties")]
    pub properties: BTreeMap<String, String>,
}

impl fmt::Debug for RawKafka {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawKafka")
            .field("brokers", &self.brokers)
            .field("group_id", &self.group_id)
            .field("topics", &self.topics)
            .finish_non_exhaustive()
    }
}

/// `[effect]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEffect {
    /// The effect: one SQL statement with named placeholders, run for each new record.
    pub sql: Option<String>,
    /// The set-based effect: one SQL statement per batch, reading the new records from
    /// `$records`.
    pub batch_sql: Option<String>,
    /// Store the record in the inbox row (the transactional-inbox form).
    pub store_record: Option<bool>,
    /// `fail` or `dead_letter` after the retries.
    pub on_error: Option<String>,
    /// `fail` or `dead_letter` for a record without a usable message id.
    pub on_invalid: Option<String>,
    /// Attempts after the first failure.
    pub retries: Option<u32>,
    /// First retry delay.
    pub backoff_initial: Option<HumanDuration>,
    /// Longest retry delay.
    pub backoff_max: Option<HumanDuration>,
    /// Partitions processed at the same time (= PostgreSQL connections).
    pub max_parallel: Option<usize>,
    /// Most records of one partition applied in one transaction.
    pub batch_max: Option<usize>,
    /// How long a partition worker waits for a batch to fill.
    pub batch_linger: Option<HumanDuration>,
}

/// `[retention]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetention {
    /// How long inbox rows are kept; absent = forever.
    pub keep: Option<HumanDuration>,
    /// `refuse`, `warn` or `off`.
    pub guard: Option<String>,
    /// Run the clean-up job.
    pub cleanup: Option<bool>,
    /// Time between clean-up runs.
    pub cleanup_interval: Option<HumanDuration>,
    /// Rows deleted per statement.
    pub cleanup_batch: Option<i64>,
}

/// What the retention guard does when the inbox keeps rows for less than a topic's replay
/// window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Refuse to start.
    Refuse,
    /// Log a warning and start.
    Warn,
    /// Do not check.
    Off,
}

/// The validated configuration of `walbox inbox`.
#[derive(Debug, Clone)]
pub struct InboxConfig {
    /// Consumer's database.
    pub conn: ConnInfo,
    /// Inbox schema.
    pub schema: String,
    /// Inbox table.
    pub table: String,
    /// Value of the `consumer` column.
    pub consumer: String,
    /// Kafka side.
    pub kafka: InboxKafka,
    /// The effect and error handling.
    pub effect: EffectConfig,
    /// Inbox retention.
    pub retention: RetentionConfig,
    /// HTTP endpoints; `None` disables them.
    pub http_listen: Option<SocketAddr>,
    /// Validated `[log]`: format and level filter.
    pub log: LogConfig,
}

/// Validated `[kafka]`.
#[derive(Clone)]
pub struct InboxKafka {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// Consumer group.
    pub group_id: String,
    /// This member's static id (`group.instance.id`): a restarted member with the same id gets
    /// its partitions back at once, without a rebalance.
    pub group_instance_id: Option<String>,
    /// Topics.
    pub topics: Vec<String>,
    /// Header with the message id.
    pub message_id_header: String,
    /// Dead-letter topic, if any.
    pub dead_letter_topic: Option<String>,
    /// Offset commit interval.
    pub commit_interval: Duration,
    /// User properties: the consumer's, and the dead-letter producer's (see
    /// `config::KafkaRole`).
    pub properties: BTreeMap<String, String>,
}

impl InboxKafka {
    /// The configuration of a client in `role` of the inbox's cluster (the consumer, the
    /// dead-letter producer, the admin client); the group is the consumer's creator's to set.
    pub fn client_config(&self, role: KafkaRole) -> rdkafka::ClientConfig {
        crate::config::client_config(&self.brokers, &self.properties, role)
    }
}

impl fmt::Debug for InboxKafka {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboxKafka")
            .field("brokers", &self.brokers)
            .field("group_id", &self.group_id)
            .field("group_instance_id", &self.group_instance_id)
            .field("topics", &self.topics)
            .field("message_id_header", &self.message_id_header)
            .field("dead_letter_topic", &self.dead_letter_topic)
            .finish_non_exhaustive()
    }
}

/// Validated `[effect]`.
#[derive(Debug, Clone)]
pub struct EffectConfig {
    /// The parsed per-record effect statement, if any.
    pub sql: Option<EffectSql>,
    /// The parsed set-based effect statement, if any (never together with `sql`).
    pub batch_sql: Option<BatchSql>,
    /// Store the record's topic, partition, offset, key, headers and payload in the inbox row.
    pub store_record: bool,
    /// After the retries.
    pub on_error: Policy,
    /// For records without a usable message id.
    pub on_invalid: Policy,
    /// Retries after the first failure.
    pub retries: u32,
    /// First retry delay.
    pub backoff_initial: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Partitions processed at once.
    pub max_parallel: usize,
    /// Most records of one partition per transaction (1: a transaction per record).
    pub batch_max: usize,
    /// How long a worker waits for more records once it has one (zero: takes what is queued).
    pub batch_linger: Duration,
}

/// Validated `[retention]`.
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    /// How long inbox rows are kept; `None` = forever.
    pub keep: Option<Duration>,
    /// Guard policy.
    pub guard: Guard,
    /// Run the clean-up job (requires `keep`).
    pub cleanup: bool,
    /// Time between clean-up runs.
    pub cleanup_interval: Duration,
    /// Rows per DELETE.
    pub cleanup_batch: i64,
}

/// The environment layout of `walbox inbox`: `WALBOX_INBOX_<SECTION>_<KEY>`.
const LAYOUT: EnvLayout = EnvLayout {
    prefix: INBOX_PREFIX,
    scalars: &[
        RawPgConnection::SETTINGS,
        RawPostgres::SETTINGS,
        RawKafkaConnection::SETTINGS,
        RawKafka::SETTINGS,
        RawEffect::SETTINGS,
        RawRetention::SETTINGS,
        RawHttp::SETTINGS,
        RawLog::SETTINGS,
    ],
    secrets: &[RawPgConnection::SECRETS],
    // The config file (clap reads it). Every other WALBOX_INBOX_* must be a setting; other
    // WALBOX_* variables are walbox run's (WALBOX_LOG is checked by the shared loader).
    accepted: &["WALBOX_INBOX_CONFIG"],
    others: &[],
    foreign: &[],
};

/// Loads the inbox configuration from an optional file and the process environment.
pub fn load(path: Option<&Path>) -> Result<InboxConfig, ConfigError> {
    load_from(path, &mut crate::config::process_env()?.into_iter())
}

/// Loads the inbox configuration from an optional file and the given environment (testable).
pub fn load_from(
    path: Option<&Path>,
    env: &mut dyn Iterator<Item = (String, String)>,
) -> Result<InboxConfig, ConfigError> {
    read_document::<RawInboxConfig>(path, env, &LAYOUT, |_| Ok(()))?.validate()
}

/// `effect.batch_max` by default: large enough that the transaction overhead (and, with
/// `fsync`, the WAL flush) is shared by many records, small enough that one batch stays a short
/// transaction.
pub const DEFAULT_BATCH_MAX: usize = 100;
/// The largest `effect.batch_max`.
pub const MAX_BATCH: usize = 10_000;
/// The longest `effect.batch_linger`.
const MAX_LINGER: Duration = Duration::from_secs(1);

fn invalid(message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(message.into())
}

/// `effect.on_error` / `effect.on_invalid`: `dead_letter` produces to `kafka.dead_letter_topic`.
fn policy(
    what: &str,
    value: Option<String>,
    dead_letter_topic: Option<&String>,
) -> Result<Policy, ConfigError> {
    match value.as_deref().unwrap_or("fail") {
        "fail" => Ok(Policy::Fail),
        "dead_letter" => match dead_letter_topic {
            Some(topic) => Ok(Policy::DeadLetter(topic.clone())),
            None => Err(invalid(
                "a dead_letter policy needs kafka.dead_letter_topic",
            )),
        },
        other => Err(invalid(format!(
            "{what} {other:?} must be \"fail\" or \"dead_letter\""
        ))),
    }
}

impl RawInboxConfig {
    /// Checks each section, then the rules across sections, and fills in defaults.
    pub fn validate(self) -> Result<InboxConfig, ConfigError> {
        let postgres = self.postgres.validate()?;
        let kafka = self.kafka.validate()?;
        let effect = self.effect.validate(kafka.dead_letter_topic.as_ref())?;
        let retention = self.retention.validate()?;
        let http_listen = self.http.validate("0.0.0.0:9188")?;
        let log = self.log.validate()?;
        let consumer = postgres.consumer.unwrap_or_else(|| kafka.group_id.clone());
        if consumer.is_empty() {
            return Err(invalid("postgres.consumer must not be empty"));
        }
        Ok(InboxConfig {
            conn: postgres.conn,
            schema: postgres.schema,
            table: postgres.table,
            consumer,
            kafka,
            effect,
            retention,
            http_listen,
            log,
        })
    }
}

/// Validated `[postgres]`, before the consumer's default (the group) is known.
struct InboxPostgres {
    conn: ConnInfo,
    schema: String,
    table: String,
    consumer: Option<String>,
}

impl RawPostgres {
    /// The inbox's settings of `[postgres]` besides the connection's.
    const SETTINGS: &'static [Setting] = &[
        (&["postgres"], "table", Kind::Str),
        (&["postgres"], "consumer", Kind::Str),
    ];

    fn validate(self) -> Result<InboxPostgres, ConfigError> {
        let connection = RawPgConnection {
            url: self.url,
            password: self.password,
        }
        .validate(&LAYOUT)?;
        let table = self.table.unwrap_or_else(|| "public.inbox".into());
        let (schema, table) = match table.split_once('.') {
            Some((s, t)) => (s.to_owned(), t.to_owned()),
            None => ("public".to_owned(), table),
        };
        valid_identifier("postgres.table schema", &schema)?;
        valid_identifier("postgres.table", &table)?;
        Ok(InboxPostgres {
            conn: connection.conn,
            schema,
            table,
            consumer: self.consumer,
        })
    }
}

/// The consumer properties walbox manages: offsets are stored and committed by walbox after the
/// PostgreSQL transaction, only committed records are read, and the brokers and the group are
/// their own keys.
fn consumer_property(key: &str, value: &str) -> Result<(), ConfigError> {
    let refused = match key {
        "enable.auto.commit" | "enable.auto.offset.store" => value != "false",
        "bootstrap.servers" | "metadata.broker.list" | "group.id" | "group.instance.id" => true,
        "isolation.level" => value != "read_committed",
        _ => false,
    };
    if refused {
        return Err(invalid(format!(
            "kafka.properties.{key} = {value:?} is managed by walbox (offsets are committed only after the PostgreSQL transaction; set kafka.brokers, kafka.group_id and kafka.group_instance_id instead of their properties)"
        )));
    }
    Ok(())
}

impl RawKafka {
    /// The inbox's settings of `[kafka]` besides the connection's.
    const SETTINGS: &'static [Setting] = &[
        (&["kafka"], "group_id", Kind::Str),
        (&["kafka"], "group_instance_id", Kind::Str),
        (&["kafka"], "topics", Kind::List),
        (&["kafka"], "message_id_header", Kind::Str),
        (&["kafka"], "dead_letter_topic", Kind::Str),
        (&["kafka"], "commit_interval", Kind::Str),
    ];

    fn validate(self) -> Result<InboxKafka, ConfigError> {
        let connection = RawKafkaConnection {
            brokers: self.brokers,
            properties: self.properties,
        }
        .validate(&LAYOUT, consumer_property)?;
        let group_id = self.group_id.ok_or_else(|| {
            invalid(format!(
                "kafka.group_id is required (set it in the file or {})",
                LAYOUT.var(&["kafka"], "group_id")
            ))
        })?;
        let topics = self.topics.unwrap_or_default();
        if topics.is_empty() || topics.iter().any(|t| t.trim().is_empty()) {
            return Err(invalid(format!(
                "kafka.topics must list at least one topic ({}=a,b)",
                LAYOUT.var(&["kafka"], "topics")
            )));
        }
        let group_instance_id = self.group_instance_id;
        if group_instance_id
            .as_ref()
            .is_some_and(|id| id.trim().is_empty())
        {
            return Err(invalid(
                "kafka.group_instance_id must not be empty (leave it out for dynamic membership)",
            ));
        }
        let message_id_header = self.message_id_header.unwrap_or_else(|| "id".into());
        if message_id_header.is_empty() {
            return Err(invalid("kafka.message_id_header must not be empty"));
        }
        let dead_letter_topic = self.dead_letter_topic.filter(|t| !t.is_empty());
        if let Some(dlq) = &dead_letter_topic {
            if topics.contains(dlq) {
                return Err(invalid(
                    "kafka.dead_letter_topic must not be one of kafka.topics",
                ));
            }
        }
        let commit_interval = self
            .commit_interval
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(1));
        if commit_interval.is_zero() {
            return Err(invalid("kafka.commit_interval must be > 0"));
        }
        Ok(InboxKafka {
            brokers: connection.brokers,
            group_id,
            group_instance_id,
            topics,
            message_id_header,
            dead_letter_topic,
            commit_interval,
            properties: connection.properties,
        })
    }
}

impl RawEffect {
    /// The settings of `[effect]`.
    const SETTINGS: &'static [Setting] = &[
        (&["effect"], "sql", Kind::Str),
        (&["effect"], "batch_sql", Kind::Str),
        (&["effect"], "store_record", Kind::Bool),
        (&["effect"], "on_error", Kind::Str),
        (&["effect"], "on_invalid", Kind::Str),
        (&["effect"], "retries", Kind::Int),
        (&["effect"], "backoff_initial", Kind::Str),
        (&["effect"], "backoff_max", Kind::Str),
        (&["effect"], "max_parallel", Kind::Int),
        (&["effect"], "batch_max", Kind::Int),
        (&["effect"], "batch_linger", Kind::Str),
    ];

    /// Checks values and fills in defaults; a `dead_letter` policy produces to
    /// `dead_letter_topic` (`kafka.dead_letter_topic`), which it needs.
    fn validate(self, dead_letter_topic: Option<&String>) -> Result<EffectConfig, ConfigError> {
        let sql = match self.sql {
            Some(text) => {
                Some(EffectSql::parse(&text).map_err(|m| invalid(format!("effect.sql: {m}")))?)
            }
            None => None,
        };
        let batch_sql = match self.batch_sql {
            Some(text) => Some(
                BatchSql::parse(&text).map_err(|m| invalid(format!("effect.batch_sql: {m}")))?,
            ),
            None => None,
        };
        if sql.is_some() && batch_sql.is_some() {
            return Err(invalid(
                "effect.sql and effect.batch_sql are exclusive: set effect.sql to run a statement for each record, or effect.batch_sql to run one for each batch",
            ));
        }
        let effect = sql.is_some() || batch_sql.is_some();
        let store_record = self.store_record.unwrap_or(!effect);
        if !effect && !store_record {
            return Err(invalid(
                "effect.sql and effect.batch_sql are not set and effect.store_record = false: nothing would happen to the records",
            ));
        }
        let on_error = policy("effect.on_error", self.on_error, dead_letter_topic)?;
        let on_invalid = policy("effect.on_invalid", self.on_invalid, dead_letter_topic)?;
        let (backoff_initial, backoff_max) = backoff(
            "effect",
            (self.backoff_initial, self.backoff_max),
            (Duration::from_millis(100), Duration::from_secs(10)),
        )?;
        let max_parallel = self.max_parallel.unwrap_or(4);
        if !(1..=256).contains(&max_parallel) {
            return Err(invalid("effect.max_parallel must be between 1 and 256"));
        }
        let batch_max = self.batch_max.unwrap_or(DEFAULT_BATCH_MAX);
        if !(1..=MAX_BATCH).contains(&batch_max) {
            return Err(invalid(format!(
                "effect.batch_max must be between 1 and {MAX_BATCH}"
            )));
        }
        let batch_linger = self.batch_linger.map(|d| d.0).unwrap_or(Duration::ZERO);
        if batch_linger > MAX_LINGER {
            return Err(invalid(format!(
                "effect.batch_linger must be at most {}ms (it delays every record of a quiet partition)",
                MAX_LINGER.as_millis()
            )));
        }
        let retries = self.retries.unwrap_or(5);
        if retries > 1000 {
            return Err(invalid("effect.retries must be at most 1000"));
        }
        Ok(EffectConfig {
            sql,
            batch_sql,
            store_record,
            on_error,
            on_invalid,
            retries,
            backoff_initial,
            backoff_max,
            max_parallel,
            batch_max,
            batch_linger,
        })
    }
}

impl RawRetention {
    /// The settings of `[retention]`.
    const SETTINGS: &'static [Setting] = &[
        (&["retention"], "keep", Kind::Str),
        (&["retention"], "guard", Kind::Str),
        (&["retention"], "cleanup", Kind::Bool),
        (&["retention"], "cleanup_interval", Kind::Str),
        (&["retention"], "cleanup_batch", Kind::Int),
    ];

    fn validate(self) -> Result<RetentionConfig, ConfigError> {
        let keep = self.keep.map(|d| d.0);
        if keep.is_some_and(|d| d.is_zero()) {
            return Err(invalid(
                "retention.keep must be > 0 (omit it to keep rows forever)",
            ));
        }
        let guard = match self.guard.as_deref().unwrap_or("refuse") {
            "refuse" => Guard::Refuse,
            "warn" => Guard::Warn,
            "off" => Guard::Off,
            other => {
                return Err(invalid(format!(
                    "retention.guard {other:?} must be \"refuse\", \"warn\" or \"off\""
                )))
            }
        };
        let cleanup = self.cleanup.unwrap_or(false);
        if cleanup && keep.is_none() {
            return Err(invalid("retention.cleanup = true needs retention.keep"));
        }
        let cleanup_interval = self
            .cleanup_interval
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(600));
        if cleanup_interval.is_zero() {
            return Err(invalid("retention.cleanup_interval must be > 0"));
        }
        let cleanup_batch = self.cleanup_batch.unwrap_or(1000);
        if !(1..=100_000).contains(&cleanup_batch) {
            return Err(invalid(
                "retention.cleanup_batch must be between 1 and 100000",
            ));
        }
        Ok(RetentionConfig {
            keep,
            guard,
            cleanup,
            cleanup_interval,
            cleanup_batch,
        })
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
