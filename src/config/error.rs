//! Why a configuration could not be loaded ([`ConfigError`]), and the one-line rule for
//! messages (`one_line`).
//!
//! Invariants: every message is one actionable line: multi-line toml, serde and librdkafka
//! messages are folded by `one_line`. No message carries a value that could be a secret; the
//! code that makes a message redacts it there (see the `config` module docs). A leaf: this file
//! imports nothing from the rest of `config`, and every other file may import it.

use std::path::PathBuf;

use crate::failure::{Classify, Failure};

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

impl Classify for ConfigError {
    /// Always exit 3: a configuration does not get better by retrying.
    fn failure(&self) -> Option<Failure> {
        Some(Failure::Config)
    }
}

/// Joins a multi-line (toml/serde) error message into one line.
pub(crate) fn one_line(s: &str) -> String {
    s.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.chars().all(|c| c == '|' || c == '^' || c == ' '))
        .collect::<Vec<_>>()
        .join(" ")
}
