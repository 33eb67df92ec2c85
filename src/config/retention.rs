//! `[outbox.retention]`: managed clean-up of the outbox table(s), off by default.
//!
//! Rows older than `keep` (by `column`, by default each table's `outbox.columns.timestamp`) are
//! deleted in batches of `batch_size` every `interval`; a table partitioned by range on that
//! column loses whole partitions instead, and gets `premake` partitions of
//! `partition_interval` ahead of time. What happens at run time, and why no unconfirmed row is
//! ever deleted, is in `crate::retention`.
//!
//! Invariants (checked here): retention runs only with `enabled = true`, and then needs `keep`;
//! keys without `enabled` are an error, not ignored. `keep` is at least one minute (rows
//! younger than that are what a running relay may still resend, and what the slot-lost runbook
//! republishes from); `interval` ≥ 1 s; `1 ≤ batch_size ≤ 1,000,000`; `partition_interval` is
//! a whole number of hours that divides a day, or a whole number of days; `premake` ≤ 366.

use std::time::Duration;

use serde::Deserialize;

use super::env::{Kind, Setting};
use super::error::ConfigError;
use super::units::parse_duration;

/// `[outbox.retention]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetention {
    /// Turns retention on (off by default).
    pub enabled: Option<bool>,
    /// How long rows are kept, e.g. `"7d"`. Required when enabled.
    pub keep: Option<String>,
    /// How often a pass runs.
    pub interval: Option<String>,
    /// Rows per DELETE.
    pub batch_size: Option<u32>,
    /// The time column; default each table's `outbox.columns.timestamp`.
    pub column: Option<String>,
    /// Width of the partitions created ahead (partitioned tables).
    pub partition_interval: Option<String>,
    /// How many partitions ahead of the current one exist (partitioned tables).
    pub premake: Option<u32>,
}

/// Validated `[outbox.retention]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionConfig {
    /// Rows older than this go.
    pub keep: Duration,
    /// Between two passes.
    pub interval: Duration,
    /// Rows per DELETE statement (one short transaction each).
    pub batch_size: u32,
    /// The time column, when not each table's timestamp column.
    pub column: Option<String>,
    /// Width of a partition.
    pub partition_interval: Duration,
    /// Partitions kept ahead of the current one.
    pub premake: u32,
}

fn invalid(m: String) -> ConfigError {
    ConfigError::Invalid(m)
}

fn duration(key: &str, text: Option<&str>, default: Duration) -> Result<Duration, ConfigError> {
    match text {
        None => Ok(default),
        Some(t) => parse_duration(t).map_err(|e| invalid(format!("outbox.retention.{key}: {e}"))),
    }
}

impl RawRetention {
    /// The settings of `[outbox.retention]`.
    pub(super) const SETTINGS: &'static [Setting] = &[
        (&["outbox", "retention"], "enabled", Kind::Bool),
        (&["outbox", "retention"], "keep", Kind::Str),
        (&["outbox", "retention"], "interval", Kind::Str),
        (&["outbox", "retention"], "batch_size", Kind::Int),
        (&["outbox", "retention"], "column", Kind::Str),
        (&["outbox", "retention"], "partition_interval", Kind::Str),
        (&["outbox", "retention"], "premake", Kind::Int),
    ];

    /// Checks values and fills in defaults; `None` when retention is off (`enabled` not true).
    /// Keys set without `enabled` are refused rather than ignored: retention deletes rows, so
    /// it is switched on (or explicitly off) in so many words.
    pub fn validate(self) -> Result<Option<RetentionConfig>, ConfigError> {
        let any_key = self.keep.is_some()
            || self.interval.is_some()
            || self.batch_size.is_some()
            || self.column.is_some()
            || self.partition_interval.is_some()
            || self.premake.is_some();
        match self.enabled {
            Some(false) => return Ok(None),
            None if any_key => {
                return Err(invalid(
                    "[outbox.retention] is set but not enabled: add outbox.retention.enabled = true (WALBOX_OUTBOX_RETENTION_ENABLED=true), or enabled = false to keep it off"
                        .into(),
                ))
            }
            None => return Ok(None),
            Some(true) => {}
        }
        let Some(keep) = self.keep.as_deref() else {
            return Err(invalid(
                "outbox.retention.enabled = true needs keep, how long rows stay (e.g. keep = \"7d\")"
                    .into(),
            ));
        };
        let keep = duration("keep", Some(keep), Duration::ZERO)?;
        if keep < Duration::from_secs(60) {
            return Err(invalid(
                "outbox.retention.keep must be at least 1m (keep rows for as long as you may need to republish them)".into(),
            ));
        }
        let interval = duration(
            "interval",
            self.interval.as_deref(),
            Duration::from_secs(60),
        )?;
        if interval < Duration::from_secs(1) {
            return Err(invalid(
                "outbox.retention.interval must be at least 1s".into(),
            ));
        }
        let batch_size = self.batch_size.unwrap_or(5000);
        if !(1..=1_000_000).contains(&batch_size) {
            return Err(invalid(
                "outbox.retention.batch_size must be between 1 and 1000000".into(),
            ));
        }
        let partition_interval = duration(
            "partition_interval",
            self.partition_interval.as_deref(),
            Duration::from_secs(86_400),
        )?;
        let secs = partition_interval.as_secs();
        let whole_hours = secs > 0 && secs % 3600 == 0 && partition_interval.subsec_nanos() == 0;
        if !(whole_hours && (86_400 % secs == 0 || secs % 86_400 == 0)) {
            return Err(invalid(
                "outbox.retention.partition_interval must be whole hours dividing a day (1h, 2h, 6h, …) or whole days (1d, 7d, …)".into(),
            ));
        }
        let premake = self.premake.unwrap_or(3);
        if premake > 366 {
            return Err(invalid(
                "outbox.retention.premake must be at most 366".into(),
            ));
        }
        Ok(Some(RetentionConfig {
            keep,
            interval,
            batch_size,
            column: self.column,
            partition_interval,
            premake,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(toml: &str) -> RawRetention {
        toml::from_str(toml).unwrap()
    }

    #[test]
    fn off_without_keep_and_defaults_with_it() {
        assert_eq!(raw("").validate().unwrap(), None);
        assert_eq!(
            raw("enabled = false\nkeep = \"7d\"").validate().unwrap(),
            None
        );
        let c = raw("enabled = true\nkeep = \"7d\"")
            .validate()
            .unwrap()
            .unwrap();
        assert_eq!(c.keep, Duration::from_secs(7 * 86_400));
        assert_eq!(c.interval, Duration::from_secs(60));
        assert_eq!((c.batch_size, c.premake), (5000, 3));
        assert_eq!(c.partition_interval, Duration::from_secs(86_400));
    }

    #[test]
    fn bad_values_say_what_to_set() {
        let e = raw("keep = \"7d\"").validate().unwrap_err().to_string();
        assert!(e.contains("add outbox.retention.enabled = true"), "{e}");
        for (toml, needle) in [
            ("", "needs keep"),
            ("keep = \"10s\"", "at least 1m"),
            (
                "keep = \"1d\"\ninterval = \"100ms\"",
                "interval must be at least 1s",
            ),
            (
                "keep = \"1d\"\nbatch_size = 0",
                "batch_size must be between",
            ),
            (
                "keep = \"1d\"\npartition_interval = \"5h\"",
                "whole hours dividing a day",
            ),
            (
                "keep = \"1d\"\npartition_interval = \"90m\"",
                "whole hours dividing a day",
            ),
            ("keep = \"soon\"", "outbox.retention.keep"),
        ] {
            let e = raw(&format!("enabled = true\n{toml}"))
                .validate()
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{toml}: {e}");
        }
        assert!(
            raw("enabled = true\nkeep = \"1d\"\npartition_interval = \"7d\"")
                .validate()
                .is_ok()
        );
    }
}
