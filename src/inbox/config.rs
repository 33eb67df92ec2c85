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
    check_kafka_properties, deserialize, read_layers, ConfigError, EnvLayout, HumanDuration, Kind,
    LogConfig, RawHttp, RawLog,
};

use super::effect::EffectSql;
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

/// `[postgres]` as written.
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

/// `[kafka]` as written.
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
    /// The effect: one SQL statement with named placeholders.
    pub sql: Option<String>,
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
    /// User consumer properties.
    pub properties: BTreeMap<String, String>,
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
    /// The parsed effect statement, if any.
    pub sql: Option<EffectSql>,
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

/// `(section, key, kind)` of every scalar setting; `WALBOX_INBOX_<SECTION>_<KEY>` sets it, and
/// `WALBOX_INBOX_KAFKA_PROPERTY_<NAME>` a consumer property.
const SCALARS: &[(&[&str], &str, Kind)] = &[
    (&["postgres"], "url", Kind::Str),
    (&["postgres"], "password", Kind::Str),
    (&["postgres"], "table", Kind::Str),
    (&["postgres"], "consumer", Kind::Str),
    (&["kafka"], "brokers", Kind::Str),
    (&["kafka"], "group_id", Kind::Str),
    (&["kafka"], "group_instance_id", Kind::Str),
    (&["kafka"], "topics", Kind::List),
    (&["kafka"], "message_id_header", Kind::Str),
    (&["kafka"], "dead_letter_topic", Kind::Str),
    (&["kafka"], "commit_interval", Kind::Str),
    (&["effect"], "sql", Kind::Str),
    (&["effect"], "store_record", Kind::Bool),
    (&["effect"], "on_error", Kind::Str),
    (&["effect"], "on_invalid", Kind::Str),
    (&["effect"], "retries", Kind::Int),
    (&["effect"], "backoff_initial", Kind::Str),
    (&["effect"], "backoff_max", Kind::Str),
    (&["effect"], "max_parallel", Kind::Int),
    (&["effect"], "batch_max", Kind::Int),
    (&["effect"], "batch_linger", Kind::Str),
    (&["retention"], "keep", Kind::Str),
    (&["retention"], "guard", Kind::Str),
    (&["retention"], "cleanup", Kind::Bool),
    (&["retention"], "cleanup_interval", Kind::Str),
    (&["retention"], "cleanup_batch", Kind::Int),
    (&["http"], "listen", Kind::Str),
    (&["log"], "format", Kind::Str),
    (&["log"], "level", Kind::Str),
];

const LAYOUT: EnvLayout = EnvLayout {
    prefix: "WALBOX_INBOX",
    scalars: SCALARS,
    secrets: &[(&["postgres"], "url"), (&["postgres"], "password")],
    // The config file (clap reads it). Every other WALBOX_INBOX_* must be a setting; other
    // WALBOX_* variables are walbox run's (WALBOX_LOG is checked by the shared loader).
    accepted: &["WALBOX_INBOX_CONFIG"],
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
    let (table, origin) = read_layers(path, env, &LAYOUT)?;
    deserialize::<RawInboxConfig>(table, origin)?.validate()
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

fn identifier(what: &str, s: &str) -> Result<(), ConfigError> {
    if s.is_empty() || s.len() > 63 {
        return Err(invalid(format!("{what} {s:?} must be 1 to 63 characters")));
    }
    Ok(())
}

impl RawInboxConfig {
    /// Checks values and fills in defaults.
    pub fn validate(self) -> Result<InboxConfig, ConfigError> {
        let url = self.postgres.url.ok_or_else(|| {
            invalid("postgres.url is required (set it in the file or WALBOX_INBOX_POSTGRES_URL)")
        })?;
        let mut conn: ConnInfo = url
            .parse()
            .map_err(|e| invalid(format!("postgres.url: {e}")))?;
        if let Some(password) = self.postgres.password {
            conn.password = Some(password);
        }
        let table = self.postgres.table.unwrap_or_else(|| "public.inbox".into());
        let (schema, table) = match table.split_once('.') {
            Some((s, t)) => (s.to_owned(), t.to_owned()),
            None => ("public".to_owned(), table),
        };
        identifier("postgres.table schema", &schema)?;
        identifier("postgres.table", &table)?;

        let k = self.kafka;
        let brokers = k.brokers.ok_or_else(|| {
            invalid("kafka.brokers is required (set it in the file or WALBOX_INBOX_KAFKA_BROKERS)")
        })?;
        let group_id = k.group_id.ok_or_else(|| {
            invalid(
                "kafka.group_id is required (set it in the file or WALBOX_INBOX_KAFKA_GROUP_ID)",
            )
        })?;
        let topics = k.topics.unwrap_or_default();
        if topics.is_empty() || topics.iter().any(|t| t.trim().is_empty()) {
            return Err(invalid(
                "kafka.topics must list at least one topic (WALBOX_INBOX_KAFKA_TOPICS=a,b)",
            ));
        }
        for (key, v) in &k.properties {
            let refused = match key.as_str() {
                "enable.auto.commit" | "enable.auto.offset.store" => v != "false",
                "bootstrap.servers" | "metadata.broker.list" | "group.id" | "group.instance.id" => {
                    true
                }
                "isolation.level" => v != "read_committed",
                _ => false,
            };
            if refused {
                return Err(invalid(format!(
                    "kafka.properties.{key} = {v:?} is managed by walbox (offsets are committed only after the PostgreSQL transaction; set kafka.brokers, kafka.group_id and kafka.group_instance_id instead of their properties)"
                )));
            }
        }
        check_kafka_properties(&k.properties, LAYOUT.prefix)?;
        let group_instance_id = k.group_instance_id;
        if group_instance_id
            .as_ref()
            .is_some_and(|id| id.trim().is_empty())
        {
            return Err(invalid(
                "kafka.group_instance_id must not be empty (leave it out for dynamic membership)",
            ));
        }
        let consumer = self.postgres.consumer.unwrap_or_else(|| group_id.clone());
        if consumer.is_empty() {
            return Err(invalid("postgres.consumer must not be empty"));
        }
        let message_id_header = k.message_id_header.unwrap_or_else(|| "id".into());
        if message_id_header.is_empty() {
            return Err(invalid("kafka.message_id_header must not be empty"));
        }
        let commit_interval = k
            .commit_interval
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(1));
        if commit_interval.is_zero() {
            return Err(invalid("kafka.commit_interval must be > 0"));
        }

        let e = self.effect;
        let sql = match e.sql {
            Some(text) => {
                Some(EffectSql::parse(&text).map_err(|m| invalid(format!("effect.sql: {m}")))?)
            }
            None => None,
        };
        let store_record = e.store_record.unwrap_or(sql.is_none());
        if sql.is_none() && !store_record {
            return Err(invalid(
                "effect.sql is not set and effect.store_record = false: nothing would happen to the records",
            ));
        }
        let dead_letter_topic = k.dead_letter_topic.filter(|t| !t.is_empty());
        let on_error = policy("effect.on_error", e.on_error, dead_letter_topic.as_ref())?;
        let on_invalid = policy(
            "effect.on_invalid",
            e.on_invalid,
            dead_letter_topic.as_ref(),
        )?;
        if let Some(dlq) = &dead_letter_topic {
            if topics.contains(dlq) {
                return Err(invalid(
                    "kafka.dead_letter_topic must not be one of kafka.topics",
                ));
            }
        }
        let backoff_initial = e
            .backoff_initial
            .map(|d| d.0)
            .unwrap_or(Duration::from_millis(100));
        let backoff_max = e
            .backoff_max
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(10));
        if backoff_initial.is_zero() || backoff_max < backoff_initial {
            return Err(invalid(
                "effect.backoff_initial must be > 0 and <= effect.backoff_max",
            ));
        }
        let max_parallel = e.max_parallel.unwrap_or(4);
        if !(1..=256).contains(&max_parallel) {
            return Err(invalid("effect.max_parallel must be between 1 and 256"));
        }
        let batch_max = e.batch_max.unwrap_or(DEFAULT_BATCH_MAX);
        if !(1..=MAX_BATCH).contains(&batch_max) {
            return Err(invalid(format!(
                "effect.batch_max must be between 1 and {MAX_BATCH}"
            )));
        }
        let batch_linger = e.batch_linger.map(|d| d.0).unwrap_or(Duration::ZERO);
        if batch_linger > MAX_LINGER {
            return Err(invalid(format!(
                "effect.batch_linger must be at most {}ms (it delays every record of a quiet partition)",
                MAX_LINGER.as_millis()
            )));
        }
        let retries = e.retries.unwrap_or(5);
        if retries > 1000 {
            return Err(invalid("effect.retries must be at most 1000"));
        }

        let r = self.retention;
        let keep = r.keep.map(|d| d.0);
        if keep.is_some_and(|d| d.is_zero()) {
            return Err(invalid(
                "retention.keep must be > 0 (omit it to keep rows forever)",
            ));
        }
        let guard = match r.guard.as_deref().unwrap_or("refuse") {
            "refuse" => Guard::Refuse,
            "warn" => Guard::Warn,
            "off" => Guard::Off,
            other => {
                return Err(invalid(format!(
                    "retention.guard {other:?} must be \"refuse\", \"warn\" or \"off\""
                )))
            }
        };
        let cleanup = r.cleanup.unwrap_or(false);
        if cleanup && keep.is_none() {
            return Err(invalid("retention.cleanup = true needs retention.keep"));
        }
        let cleanup_interval = r
            .cleanup_interval
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(600));
        if cleanup_interval.is_zero() {
            return Err(invalid("retention.cleanup_interval must be > 0"));
        }
        let cleanup_batch = r.cleanup_batch.unwrap_or(1000);
        if !(1..=100_000).contains(&cleanup_batch) {
            return Err(invalid(
                "retention.cleanup_batch must be between 1 and 100000",
            ));
        }

        let http_listen = self.http.validate("0.0.0.0:9188")?;
        let log = self.log.validate()?;

        Ok(InboxConfig {
            conn,
            schema,
            table,
            consumer,
            kafka: InboxKafka {
                brokers,
                group_id,
                group_instance_id,
                topics,
                message_id_header,
                dead_letter_topic,
                commit_interval,
                properties: k.properties,
            },
            effect: EffectConfig {
                sql,
                store_record,
                on_error,
                on_invalid,
                retries,
                backoff_initial,
                backoff_max,
                max_parallel,
                batch_max,
                batch_linger,
            },
            retention: RetentionConfig {
                keep,
                guard,
                cleanup,
                cleanup_interval,
                cleanup_batch,
            },
            http_listen,
            log,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

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
}
