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
//! (`EnvLayout::accepted`: `WALBOX_CONFIG`, `WALBOX_LOG`), `walbox inbox`'s (`WALBOX_INBOX_*`),
//! and those that belong to the tests, the benchmarks and the install scripts: the one list of
//! them is `EnvLayout::foreign` in `document.rs`'s `LAYOUT`. `log.level` and `WALBOX_LOG` must
//! be valid filters whose bare directives are levels: `EnvFilter` would take a misspelt level
//! for a target and silence every line.
//!
//! Secrets (the Postgres password, `sasl.password`, `ssl.key.password`, …) never appear in
//! `Debug` output or error messages. Every message that could carry a value is redacted where it
//! is made: a TOML syntax error gives the line, column and what is wrong, never the source line
//! (toml's own message quotes it); a connection string error says which part is wrong, never the
//! string; a librdkafka property librdkafka rejects is named, its value is not (librdkafka's own
//! message repeats it). librdkafka properties are checked here, when the configuration is
//! loaded, so a misspelt one is a configuration error (exit status 3) like an unknown key.
//!
//! # Files
//! This file only declares the modules and re-exports their items; each item lives in the file
//! named after what it is, and the files import one another, never this one (only the tests
//! do), so that the imports between files have no cycle. From the leaves up:
//! - `error.rs`: [`ConfigError`] and the one-line rule for messages;
//! - `units.rs`: durations (`"10s"`) and byte sizes (`"512MB"`);
//! - `conninfo.rs`: connection strings (`postgres.url`);
//! - `env.rs`: the vocabulary of the `WALBOX_*` variables (`EnvLayout`, the variable names);
//! - one file per section, each with the section as written (`Raw…`), its validation
//!   (`Raw….validate`) and its variables (`Raw…::SETTINGS`), and validated (`…Config`):
//!   `postgres.rs`, `outbox.rs`, `retention.rs`, `kafka.rs`, `relay.rs`, `slot.rs`,
//!   `alerts.rs`, `http.rs`, `log.rs`. `postgres.rs` and `kafka.rs` also hold the connection
//!   keys every command's section has (`RawPgConnection`, `RawKafkaConnection`), which
//!   `walbox inbox` (`inbox/config.rs`) reuses with `[http]` and `[log]`;
//! - `kafka_client.rs`: every Kafka client's librdkafka configuration, from the brokers, the
//!   properties and the client's role (`KafkaRole`): the one rule for which properties each
//!   client gets;
//! - `layers.rs`: the file and the environment into one TOML table, and deserializing it;
//! - `document.rs`: the whole document, `walbox run`'s variables (`LAYOUT`), [`RawConfig`] →
//!   [`Config`] (the sections' validations and the rules across them), and [`load`];
//! - `fixture.rs` (tests only): the configuration files and environments the tests load.

mod alerts;
mod broker;
pub mod conninfo;
mod document;
mod env;
mod error;
mod http;
mod kafka;
mod kafka_client;
mod layers;
mod log;
mod nats;
pub mod outbox;
mod postgres;
mod rabbitmq;
mod redis;
mod relay;
pub mod retention;
pub mod secret;
mod slot;
pub mod target;
mod units;

pub use alerts::{AlertsConfig, RawAlerts};
pub use broker::{BrokerConfig, BrokerKind};
pub use document::{load, load_from, Config, RawConfig};
pub(crate) use env::{process_env, EnvLayout, Kind, Setting, INBOX_PREFIX};
pub use error::ConfigError;
pub(crate) use kafka::{scalar_properties, RawKafkaConnection};
pub use kafka::{
    valid_topic, ExactlyOnce, KafkaConfig, RawKafka, DEFAULT_PROGRESS_TOPIC, TRANSACTION_TIMEOUT_MS,
};
pub use kafka_client::{client_config, KafkaRole};
pub(crate) use layers::read_document;
pub use log::{check_log_filter, LogConfig, LogFormat, RawLog, LOG_ENV};
pub use nats::{NatsAuth, NatsConfig, NatsTls, RawNats};
pub use outbox::{
    ColumnNames, Compat, Converter, Converters, JsonNulls, OnChange, OutboxConfig, Route,
    RouteSource, ValueFormat, MAX_OUTBOX_TABLES,
};
pub(crate) use postgres::{valid_identifier, RawPgConnection};
pub use postgres::{OnSlotBusy, PostgresConfig, RawPostgres, ShardOf, MAX_SHARDS};
pub use rabbitmq::{RabbitMqConfig, RawRabbitMq};
pub use redis::{RawRedis, RedisConfig, DEFAULT_PROGRESS_KEY_PREFIX};
pub(crate) use relay::backoff;
pub use relay::{RawRelay, RelayConfig, DEFAULT_MAX_IN_FLIGHT};
// `self::`: the `http` crate has the same name.
pub use self::http::RawHttp;
pub use slot::{RawSlot, SlotConfig};
pub use units::{parse_duration, parse_size, ByteSize, HumanDuration};

#[cfg(test)]
#[path = "broker_tests.rs"]
mod broker_tests;
#[cfg(test)]
pub(crate) mod fixture;
#[cfg(test)]
#[path = "nats_tests.rs"]
mod nats_tests;
#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
