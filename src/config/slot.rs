//! `[slot]`: slot monitoring: how often the slot's retained WAL is checked, the warning and
//! critical thresholds (shares of `max_slot_wal_keep_size`, or bytes when it is unlimited), and
//! the optional `pg_logical_emit_message` heartbeat, and the WAL behind from which progress is
//! reported (`catchup_threshold`, default 16 MiB: one WAL segment).
//!
//! Invariants (checked by `RawConfig::validate`, in `document.rs`): `check_interval > 0`,
//! `0 < warning_ratio <= critical_ratio <= 1`, `warning_bytes <= critical_bytes`, and the
//! heartbeat interval is `"off"` (`None`) or positive.

use std::time::Duration;

use serde::Deserialize;

use super::units::{ByteSize, HumanDuration};

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
