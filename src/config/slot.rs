//! `[slot]`: slot monitoring: how often the slot's retained WAL is checked, the warning and
//! critical thresholds (shares of `max_slot_wal_keep_size`, or bytes when it is unlimited), and
//! the optional `pg_logical_emit_message` heartbeat, and the WAL behind from which progress is
//! reported (`catchup_threshold`, default 16 MiB: one WAL segment).
//!
//! Invariants (checked by [`RawSlot::validate`]): `check_interval > 0`,
//! `0 < warning_ratio <= critical_ratio <= 1`, `warning_bytes <= critical_bytes`, and the
//! heartbeat interval is `"off"` (`None`) or positive.

use std::time::Duration;

use serde::Deserialize;

use super::env::{Kind, Setting};
use super::error::ConfigError;
use super::units::{parse_duration, ByteSize, HumanDuration};

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
    /// WAL behind at or above which a progress line is logged at every reading.
    pub catchup_threshold: Option<ByteSize>,
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
    /// WAL behind (bytes) at or above which walbox logs a progress line at every reading and
    /// `walbox status` measures the drain rate.
    pub catchup_threshold: u64,
}

impl RawSlot {
    /// The settings of `[slot]`.
    pub(super) const SETTINGS: &'static [Setting] = &[
        (&["slot"], "check_interval", Kind::Str),
        (&["slot"], "warning_ratio", Kind::Float),
        (&["slot"], "critical_ratio", Kind::Float),
        (&["slot"], "warning_bytes", Kind::Str),
        (&["slot"], "catchup_threshold", Kind::Str),
        (&["slot"], "critical_bytes", Kind::Str),
        (&["slot"], "heartbeat_interval", Kind::Str),
    ];

    /// Checks values and fills in defaults.
    pub(super) fn validate(self) -> Result<SlotConfig, ConfigError> {
        let slot = SlotConfig {
            check_interval: self
                .check_interval
                .map(|d| d.0)
                .unwrap_or(Duration::from_secs(10)),
            warning_ratio: self.warning_ratio.unwrap_or(0.5),
            critical_ratio: self.critical_ratio.unwrap_or(0.8),
            warning_bytes: self.warning_bytes.map(|b| b.0).unwrap_or(5 << 30),
            critical_bytes: self.critical_bytes.map(|b| b.0).unwrap_or(20 << 30),
            catchup_threshold: self.catchup_threshold.map(|b| b.0).unwrap_or(16 << 20),
            heartbeat_interval: match self.heartbeat_interval.as_deref() {
                None | Some("off") => None,
                Some(t) => Some(parse_duration(t).map_err(|e| {
                    ConfigError::Invalid(format!("slot.heartbeat_interval: {e} (or \"off\")"))
                })?),
            },
        };
        if slot.check_interval.is_zero() {
            return Err(ConfigError::Invalid(
                "slot.check_interval must be > 0".into(),
            ));
        }
        if !(0.0 < slot.warning_ratio
            && slot.warning_ratio <= slot.critical_ratio
            && slot.critical_ratio <= 1.0)
        {
            return Err(ConfigError::Invalid(
                "slot ratios must satisfy 0 < warning_ratio <= critical_ratio <= 1".into(),
            ));
        }
        if slot.warning_bytes > slot.critical_bytes {
            return Err(ConfigError::Invalid(
                "slot.warning_bytes must be <= slot.critical_bytes".into(),
            ));
        }
        if slot.heartbeat_interval.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::Invalid(
                "slot.heartbeat_interval must be > 0 or \"off\"".into(),
            ));
        }
        Ok(slot)
    }
}
