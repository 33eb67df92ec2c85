//! `[log]` and its `WALBOX_LOG` override: the log format and the `tracing` filter.
//!
//! Invariant: a filter is accepted only if it parses and each directive without `=` is a level
//! ([`check_log_filter`]): `EnvFilter` alone would take a misspelt level such as `warning` for a
//! target and then log nothing at all, errors included. `log.level` and `WALBOX_LOG` are checked
//! the same way, whichever command runs.

use serde::Deserialize;

use super::env::{Kind, Setting};
use super::error::{one_line, ConfigError};

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
    /// The settings of `[log]`, the same for every command.
    pub(crate) const SETTINGS: &'static [Setting] = &[
        (&["log"], "format", Kind::Str),
        (&["log"], "level", Kind::Str),
    ];

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
    /// Line format: human-readable text or one JSON object per line.
    pub format: LogFormat,
    /// `tracing` filter directive.
    pub level: String,
}
