//! Why `walbox from-debezium` cannot translate a connector configuration at all
//! ([`DebeziumError`]); settings it merely cannot honour are findings, not errors
//! (`mapping.rs`).
//!
//! Invariants: every message is one line and names keys, lines and columns, never a value that
//! could be a secret. All are configuration errors (exit status 3). A leaf: imports nothing
//! from the rest of the folder.

use std::path::PathBuf;

use crate::config::ConfigError;
use crate::failure::{Classify, Failure};

/// Why a connector configuration cannot be translated.
#[derive(Debug, thiserror::Error)]
pub enum DebeziumError {
    /// The file could not be read.
    #[error("cannot read the connector configuration {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The JSON does not parse.
    #[error(
        "the connector configuration is not valid JSON at line {line}, column {column}: {what}"
    )]
    Json {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong, without the input.
        what: &'static str,
    },
    /// A `.properties` line cannot be read.
    #[error("the connector configuration's line {line} cannot be read: {what}")]
    Properties {
        /// 1-based line.
        line: usize,
        /// What is wrong, without the input.
        what: &'static str,
    },
    /// The JSON is not a connector configuration.
    #[error("not a Kafka Connect connector configuration: {0}")]
    Shape(String),
    /// Another connector than Debezium's PostgreSQL connector.
    #[error("connector.class is {0:?}: walbox replaces io.debezium.connector.postgresql.PostgresConnector only")]
    NotPostgres(String),
    /// A setting walbox needs is missing.
    #[error("{0} is missing: the connector configuration must name it")]
    Missing(&'static str),
    /// A setting has a value walbox cannot use.
    #[error("{key}: {reason}")]
    Invalid {
        /// The connector setting.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The translation does not load as a walbox configuration.
    #[error("the walbox configuration made from it is invalid ({0}); the connector setting behind that key needs a change")]
    Output(ConfigError),
}

impl Classify for DebeziumError {
    fn failure(&self) -> Option<Failure> {
        Some(Failure::Config)
    }
}
