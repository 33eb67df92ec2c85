//! Command-line interface: flags only, no logic. What can be checked without the database is
//! checked here (a usage error, exit status 2); `--since`, `--since-id` and `--time-column` are
//! read by PostgreSQL in the table's types, so `walbox republish` and `walbox audit` check them
//! against each table before reading rows (exit status 3 naming the argument).
//!
//! An argument several commands take is declared once and flattened into each: `--config`
//! ([`ConfigArgs`]), the window of `republish` and `audit` ([`WindowArgs`]), `--json`
//! ([`JsonArgs`]).

use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand};

use crate::config::BrokerKind;

/// `walbox --version`: the package version and the git revision it was built from.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("WALBOX_GIT_REVISION"),
    ")"
);

/// walbox relays transactional-outbox rows from PostgreSQL's WAL to Kafka (or Redis Streams,
/// NATS JetStream, RabbitMQ).
#[derive(Debug, Parser)]
#[command(name = "walbox", version = VERSION, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Relay outbox events until SIGTERM/SIGINT.
    Run {
        /// `--config`.
        #[command(flatten)]
        file: ConfigArgs,
    },
    /// Print the replication slot's health: retained WAL, lag, wal_status, alert level.
    Status {
        /// `--config`.
        #[command(flatten)]
        file: ConfigArgs,
        /// `--json`.
        #[command(flatten)]
        output: JsonArgs,
    },
    /// Check everything `run` needs (PostgreSQL settings, role, tables, publication, slot,
    /// brokers, topics, idempotent producer) and print one line per check, each failure with
    /// its fix. Exits 0 when no check failed.
    Check {
        /// `--config`.
        #[command(flatten)]
        file: ConfigArgs,
        /// `--json`.
        #[command(flatten)]
        output: JsonArgs,
    },
    /// Drop and recreate the replication slot after it was lost. Events committed between the
    /// old slot's confirmed position and the new slot's creation are NOT relayed.
    RecreateSlot {
        /// `--config`.
        #[command(flatten)]
        file: ConfigArgs,
        /// Required: you accept the data-loss window described above.
        #[arg(long)]
        confirm_data_loss: bool,
    },
    /// Change the number of shards the outbox is relayed through (postgres.shards) without
    /// reordering or losing an aggregate's events: make the new slots at one point, drain the
    /// old ones exactly up to it, drop them. Run it with walbox stopped; run it again if it was
    /// interrupted.
    Reshard {
        /// `--config`.
        #[command(flatten)]
        file: ConfigArgs,
        /// The number of shards to relay through afterwards (1 to 64).
        #[arg(long, value_name = "M")]
        to: u32,
    },
    /// Produce rows still in the outbox table(s) again, with the relay's mapping and headers:
    /// the way to fill a window no slot can replay (slot lost or dropped, publication dropped).
    /// Consumers deduplicate by the `id` header.
    #[command(group(ArgGroup::new("window").required(true).multiple(true).args(["since_id", "since"])))]
    Republish {
        /// `--config`.
        #[command(flatten)]
        file: ConfigArgs,
        /// `--since-id`, `--since`, `--time-column`.
        #[command(flatten)]
        window: WindowArgs,
        /// Give up (exit status 9) when the brokers acknowledge no record for this long.
        #[arg(long, value_name = "DURATION", default_value = "40s", value_parser = parse_wait)]
        ack_timeout: std::time::Duration,
    },
    /// Compare the outbox rows still in the table(s) with Kafka (by the `id` header) and print
    /// the missing and the duplicated ones. Exits 0 only when nothing is missing.
    Audit {
        /// `--config`.
        #[command(flatten)]
        file: ConfigArgs,
        /// `--since-id`, `--since`, `--time-column`.
        #[command(flatten)]
        window: WindowArgs,
        /// How long to wait for the slot to confirm the audited rows before reading Kafka.
        #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_wait)]
        wait: std::time::Duration,
        /// `--json`.
        #[command(flatten)]
        output: JsonArgs,
    },
    /// Print the walbox.toml equivalent to a Debezium PostgreSQL connector with the Outbox
    /// Event Router, on its slot and publication (`compat = "debezium"`). Every setting walbox
    /// cannot honour is named on stderr with its reason, and the command exits 3 unless
    /// `--allow-partial`. Secrets are never copied: they become `*_file` references.
    FromDebezium {
        /// The connector's configuration: the JSON posted to Kafka Connect's REST API, or a
        /// `.properties` file.
        #[arg(value_name = "CONFIG")]
        config: PathBuf,
        /// Print the configuration without the settings it cannot honour (still named on
        /// stderr), and exit 0.
        #[arg(long)]
        allow_partial: bool,
    },
    /// Consume topics into PostgreSQL effectively once: inbox row + effect in one transaction,
    /// then the offset commit (the consumer half).
    Inbox {
        /// inbox.toml; every setting can also come from WALBOX_INBOX_* variables.
        #[arg(long, short, env = "WALBOX_INBOX_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Print a shell completion script, e.g. `walbox completions bash >
    /// /etc/bash_completion.d/walbox`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    #[cfg(feature = "sandbox")]
    /// Run walbox end to end on a throwaway PostgreSQL cluster and an embedded Kafka-protocol
    /// broker (or a throwaway Redis, NATS or RabbitMQ server), and print what a consumer reads
    /// back.
    Demo {
        /// Number of aggregates to write events for.
        #[arg(long, default_value_t = 4)]
        aggregates: u32,
        /// Events per aggregate.
        #[arg(long, default_value_t = 3)]
        events: u32,
        /// The broker to relay to (Redis, NATS and RabbitMQ from their Debian packages).
        #[arg(long, value_enum, default_value_t = DemoBroker::Kafka)]
        broker: DemoBroker,
    },
}

/// `walbox demo --broker`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DemoBroker {
    /// librdkafka's mock Kafka cluster.
    Kafka,
    /// Redis Streams.
    Redis,
    /// NATS JetStream.
    Nats,
    /// RabbitMQ.
    Rabbitmq,
}

impl DemoBroker {
    /// The broker it names.
    pub fn kind(self) -> BrokerKind {
        match self {
            DemoBroker::Kafka => BrokerKind::Kafka,
            DemoBroker::Redis => BrokerKind::Redis,
            DemoBroker::Nats => BrokerKind::Nats,
            DemoBroker::Rabbitmq => BrokerKind::RabbitMq,
        }
    }
}

/// `--config`: walbox.toml, for every command that reads it (`inbox` reads its own file).
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// TOML configuration file; every setting can also come from WALBOX_* variables.
    #[arg(long, short, env = "WALBOX_CONFIG")]
    pub config: Option<PathBuf>,
}

/// The rows `republish` and `audit` take: `--since-id`, `--since` (and its `--time-column`).
/// `republish` requires one of the two; `audit` without either takes every row.
#[derive(Debug, Args)]
pub struct WindowArgs {
    /// Only rows whose id column is at least this value (read in the column's type).
    #[arg(long, value_name = "ID", value_parser = non_empty)]
    pub since_id: Option<String>,
    /// Only rows whose time column is at least this timestamp (e.g. 2026-12-01T09:50:00Z).
    #[arg(long, value_name = "TIME", value_parser = non_empty)]
    pub since: Option<String>,
    /// The column holding each row's insert time (default: outbox.columns.timestamp).
    #[arg(long, value_name = "COLUMN", requires = "since", value_parser = non_empty)]
    pub time_column: Option<String>,
}

/// `--json`, for the commands that print a report.
#[derive(Debug, Args)]
pub struct JsonArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// A value that must not be empty (`--since-id ""` would select nothing or everything).
fn non_empty(text: &str) -> Result<String, String> {
    match text.trim() {
        "" => Err("must not be empty".to_owned()),
        _ => Ok(text.to_owned()),
    }
}

fn parse_wait(text: &str) -> Result<std::time::Duration, String> {
    crate::config::parse_duration(text)
}
