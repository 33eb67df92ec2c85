//! Slot alert levels: from a [`SlotHealth`] reading to ok / warning / critical / lost, and what
//! to tell the operator when the level changes.
//!
//! Levels, with the configurable thresholds of `[slot]`:
//! - **lost** (3): `wal_status = lost` (or an `invalidation_reason`, 17+), or the slot
//!   disappeared. Events may be gone; walbox stops. The reason names the cause where the server
//!   reports it (WAL removed, idle timeout, …).
//! - **critical** (2): retained WAL ≥ `critical_ratio` × `max_slot_wal_keep_size`, or
//!   `wal_status = unreserved` (the next checkpoint may remove WAL the slot needs).
//! - **warning** (1): retained WAL ≥ `warning_ratio` × `max_slot_wal_keep_size`; or the stream
//!   stalls ([`assess_stream`]): a failover slot's walsender waits for a slot of
//!   `synchronized_standby_slots` that is not active, or the confirmed position stood still for
//!   [`STALL_AFTER`] while the server's WAL is past it and nothing was relayed.
//! - **ok** (0) otherwise.
//!
//! With `max_slot_wal_keep_size = -1` the slot can fill its server's disk instead of being
//! invalidated, so the absolute `warning_bytes` / `critical_bytes` thresholds apply.
//!
//! Every transition is one structured log line (WARN, or ERROR for critical and lost) and, when
//! `[alerts] webhook_url` is set, one JSON document in Alertmanager's webhook format (see
//! [`webhook_payload`]).

use std::fmt;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::config::SlotConfig;
use crate::lsn::Lsn;
use crate::source::slot::{self, SlotHealth};

/// How close the slot is to endangering the primary or being lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AlertLevel {
    /// Nothing to do.
    Ok = 0,
    /// Retained WAL is growing: find out why walbox is behind.
    Warning = 1,
    /// The slot will soon be invalidated or the disk fill: act now.
    Critical = 2,
    /// The slot was invalidated: events may be lost.
    Lost = 3,
}

impl AlertLevel {
    /// The numeric value exported as `walbox_slot_alert_level`.
    pub fn value(self) -> i64 {
        self as i64
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            AlertLevel::Ok => "ok",
            AlertLevel::Warning => "warning",
            AlertLevel::Critical => "critical",
            AlertLevel::Lost => "lost",
        }
    }
}

impl fmt::Display for AlertLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A level with the reason and the advice that go with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    /// The level.
    pub level: AlertLevel,
    /// Why, with numbers.
    pub reason: String,
    /// What to do.
    pub action: &'static str,
    /// Bytes that can still be retained before the slot is invalidated (or before the critical
    /// threshold, when unlimited).
    pub headroom_bytes: Option<u64>,
}

const ACTION_OK: &str = "nothing to do";
const ACTION_WARNING: &str = "walbox is behind: check walbox_inflight_events, the broker and walbox's logs; WAL is retained until it catches up";
const ACTION_CRITICAL: &str = "act now: restore the broker or walbox, or raise max_slot_wal_keep_size (or free disk); the slot will be invalidated or the disk fill";
const ACTION_LOST: &str = "events after the last confirmed LSN may be lost: follow the runbook \"Slot lost\" in docs/operations.md before recreating the slot";

/// The level of a reading (`None` = the slot does not exist).
pub fn assess(health: Option<&SlotHealth>, cfg: &SlotConfig) -> Assessment {
    let Some(h) = health else {
        return Assessment {
            level: AlertLevel::Lost,
            reason: "the replication slot no longer exists".into(),
            action: ACTION_LOST,
            headroom_bytes: None,
        };
    };
    let retained = h.retained_bytes();
    if h.is_lost() {
        return Assessment {
            level: AlertLevel::Lost,
            reason: format!(
                "PostgreSQL invalidated the slot: {}",
                if h.conflicting {
                    crate::source::catalog::STANDBY_CONFLICT.to_owned()
                } else {
                    slot::invalidation_cause(h.invalidation_reason.as_deref())
                }
            ),
            action: ACTION_LOST,
            headroom_bytes: Some(0),
        };
    }
    let (level, reason, headroom) = match h.max_slot_wal_keep_bytes {
        Some(max) => {
            let ratio = h.keep_used_ratio().unwrap_or(0.0);
            let headroom = h
                .safe_wal_size
                .and_then(|s| u64::try_from(s).ok())
                .unwrap_or(max.saturating_sub(retained));
            let reason = format!(
                "retained {retained} bytes = {:.0}% of max_slot_wal_keep_size ({max} bytes), wal_status = {}",
                ratio * 100.0,
                h.wal_status.as_deref().unwrap_or("?")
            );
            let level =
                if h.wal_status.as_deref() == Some("unreserved") || ratio >= cfg.critical_ratio {
                    AlertLevel::Critical
                } else if ratio >= cfg.warning_ratio {
                    AlertLevel::Warning
                } else {
                    AlertLevel::Ok
                };
            (level, reason, Some(headroom))
        }
        None => {
            let reason = format!(
                "retained {retained} bytes with max_slot_wal_keep_size = -1 (unlimited: the slot can fill the disk); thresholds {} / {} bytes",
                cfg.warning_bytes, cfg.critical_bytes
            );
            let level = if retained >= cfg.critical_bytes {
                AlertLevel::Critical
            } else if retained >= cfg.warning_bytes {
                AlertLevel::Warning
            } else {
                AlertLevel::Ok
            };
            (
                level,
                reason,
                Some(cfg.critical_bytes.saturating_sub(retained)),
            )
        }
    };
    Assessment {
        level,
        reason,
        action: match level {
            AlertLevel::Ok => ACTION_OK,
            AlertLevel::Warning => ACTION_WARNING,
            AlertLevel::Critical => ACTION_CRITICAL,
            AlertLevel::Lost => ACTION_LOST,
        },
        headroom_bytes: headroom,
    }
}

/// How long the confirmed position may stand still while the server's WAL is past it and no
/// event is published, before the stream is reported stalled.
pub const STALL_AFTER: Duration = Duration::from_secs(10);

const ACTION_STALLED: &str = "the stream is stalled: if synchronized_standby_slots names a slot whose standby is gone, start that standby or remove the slot from the setting (ALTER SYSTEM SET synchronized_standby_slots = …; SELECT pg_reload_conf();); otherwise check walbox's log, the broker and walbox_inflight_events";

/// Consecutive readings of a stream that may stall without any error (a failover slot's
/// walsender waiting for a `synchronized_standby_slots` slot whose standby is gone): the
/// confirmed position stands still while the server's WAL is past it, and nothing is relayed.
#[derive(Debug, Default)]
pub struct StallWatch {
    /// Since when, at which confirmed position and event count, the stream stands still.
    since: Option<(Instant, Option<Lsn>, u64)>,
}

impl StallWatch {
    /// Feeds a reading and the events published so far; how long the stream has stood still,
    /// when it does (the server's WAL past the confirmed position, nothing published since).
    pub fn observe(&mut self, at: Instant, h: &SlotHealth, events: u64) -> Option<Duration> {
        let confirmed = h.confirmed_flush_lsn;
        if h.confirmed_lag_bytes() == 0 {
            self.since = None;
            return None;
        }
        match self.since {
            Some((from, c, e)) if c == confirmed && e == events => Some(at.duration_since(from)),
            _ => {
                self.since = Some((at, confirmed, events));
                Some(Duration::ZERO)
            }
        }
    }
}

/// Raises `a` to at least warning when the stream stalls: at once when the slot's walsender
/// waits for `waiting_for` (slots of `synchronized_standby_slots` that are not active, read for
/// a failover slot on the primary) while WAL is past the confirmed position, else once it stood
/// still for [`STALL_AFTER`]. The reason names the slots and the numbers.
pub fn assess_stream(
    a: Assessment,
    h: &SlotHealth,
    waiting_for: &[String],
    still_for: Option<Duration>,
) -> Assessment {
    let lag = h.confirmed_lag_bytes();
    let stalled = if !waiting_for.is_empty() && lag > 0 {
        format!(
            "the stream waits for standby slot {} named in synchronized_standby_slots (not active: its standby is gone), with the server's WAL {lag} bytes past the confirmed position",
            waiting_for.join(", ")
        )
    } else {
        match still_for {
            Some(d) if d >= STALL_AFTER => format!(
                "nothing relayed for {} s while the server's WAL is {lag} bytes past the confirmed position",
                d.as_secs()
            ),
            _ => return a,
        }
    };
    if a.level == AlertLevel::Lost {
        return a;
    }
    Assessment {
        level: a.level.max(AlertLevel::Warning),
        reason: format!("{stalled}; {}", a.reason),
        action: if a.level <= AlertLevel::Warning {
            ACTION_STALLED
        } else {
            a.action
        },
        headroom_bytes: a.headroom_bytes,
    }
}

/// Logs a level transition as one structured line.
pub fn log_transition(slot: &str, from: AlertLevel, a: &Assessment, health: Option<&SlotHealth>) {
    let ratio = health.and_then(SlotHealth::keep_used_ratio);
    let retained = health.map(SlotHealth::retained_bytes);
    match a.level {
        AlertLevel::Ok | AlertLevel::Warning => tracing::warn!(
            slot, level = %a.level, previous = %from, ratio, retained_bytes = retained,
            headroom_bytes = a.headroom_bytes, reason = %a.reason, action = a.action,
            "slot alert level changed"
        ),
        AlertLevel::Critical | AlertLevel::Lost => tracing::error!(
            slot, level = %a.level, previous = %from, ratio, retained_bytes = retained,
            headroom_bytes = a.headroom_bytes, reason = %a.reason, action = a.action,
            "slot alert level changed"
        ),
    }
}

/// The JSON sent to the webhook for a transition: Alertmanager's webhook format (version 4), one
/// alert named `WalboxSlot`, `status` `resolved` when the new level is ok, else `firing`, with
/// labels `slot` and `severity` (the level) and the numbers in annotations.
pub fn webhook_payload(
    slot: &str,
    from: AlertLevel,
    a: &Assessment,
    health: Option<&SlotHealth>,
    at_rfc3339: &str,
) -> serde_json::Value {
    let status = if a.level == AlertLevel::Ok {
        "resolved"
    } else {
        "firing"
    };
    let severity = if a.level == AlertLevel::Ok {
        from.name()
    } else {
        a.level.name()
    };
    let labels = json!({ "alertname": "WalboxSlot", "slot": slot, "severity": severity });
    json!({
        "version": "4",
        "status": status,
        "receiver": "walbox",
        "groupKey": format!("walbox:{slot}"),
        "groupLabels": { "alertname": "WalboxSlot", "slot": slot },
        "commonLabels": labels,
        "commonAnnotations": {},
        "externalURL": "",
        "alerts": [{
            "status": status,
            "labels": labels,
            "annotations": {
                "summary": format!("walbox slot {slot}: {} (was {})", a.level, from),
                "description": format!("{}; {}", a.reason, a.action),
                "level": a.level.name(),
                "previous_level": from.name(),
                "retained_bytes": health.map(SlotHealth::retained_bytes),
                "keep_used_ratio": health.and_then(SlotHealth::keep_used_ratio),
                "headroom_bytes": a.headroom_bytes,
                "wal_status": health.and_then(|h| h.wal_status.clone()),
                "confirmed_flush_lsn": health.and_then(|h| h.confirmed_flush_lsn).map(|l| l.to_string()),
            },
            "startsAt": at_rfc3339,
            "endsAt": if status == "resolved" { at_rfc3339 } else { "0001-01-01T00:00:00Z" },
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> SlotConfig {
        SlotConfig {
            check_interval: Duration::from_secs(10),
            warning_ratio: 0.5,
            critical_ratio: 0.8,
            warning_bytes: 100,
            critical_bytes: 200,
            heartbeat_interval: None,
            catchup_threshold: 16 << 20,
        }
    }

    fn health(retained: u64, max: Option<u64>, status: &str) -> SlotHealth {
        SlotHealth {
            slot: "s".into(),
            current_lsn: Lsn(10_000),
            restart_lsn: Some(Lsn(10_000 - retained)),
            confirmed_flush_lsn: Some(Lsn(10_000)),
            wal_status: Some(status.into()),
            safe_wal_size: None,
            active: true,
            active_pid: Some(7),
            max_slot_wal_keep_bytes: max,
            wal_keep_bytes: 0,
            in_recovery: false,
            conflicting: false,
            max_wal_bytes: 0,
            server_version_num: 150000,
            idle_replication_slot_timeout: None,
            idle_timeout_seconds: None,
            invalidation_reason: None,
            inactive_since: None,
            failover: None,
            synced: None,
            spill_bytes: None,
        }
    }

    #[test]
    fn ratio_thresholds() {
        let c = cfg();
        assert_eq!(
            assess(Some(&health(10, Some(1000), "reserved")), &c).level,
            AlertLevel::Ok
        );
        assert_eq!(
            assess(Some(&health(500, Some(1000), "extended")), &c).level,
            AlertLevel::Warning
        );
        assert_eq!(
            assess(Some(&health(800, Some(1000), "extended")), &c).level,
            AlertLevel::Critical
        );
        assert_eq!(
            assess(Some(&health(10, Some(1000), "unreserved")), &c).level,
            AlertLevel::Critical
        );
        assert_eq!(
            assess(Some(&health(10, Some(1000), "lost")), &c).level,
            AlertLevel::Lost
        );
        assert_eq!(assess(None, &c).level, AlertLevel::Lost);
    }

    #[test]
    fn absolute_thresholds_when_unlimited() {
        let c = cfg();
        assert_eq!(
            assess(Some(&health(99, None, "reserved")), &c).level,
            AlertLevel::Ok
        );
        let a = assess(Some(&health(150, None, "reserved")), &c);
        assert_eq!(a.level, AlertLevel::Warning);
        assert!(a.reason.contains("unlimited"));
        assert_eq!(a.headroom_bytes, Some(50));
        assert_eq!(
            assess(Some(&health(250, None, "extended")), &c).level,
            AlertLevel::Critical
        );
    }

    #[test]
    fn a_stalled_stream_raises_the_level_and_names_the_standby_slot() {
        let c = cfg();
        let mut h = health(10, Some(1000), "reserved");
        h.confirmed_flush_lsn = Some(Lsn(9_000));
        let ok = assess(Some(&h), &c);
        assert_eq!(ok.level, AlertLevel::Ok);
        let waiting = vec!["gone".to_owned()];
        let a = assess_stream(ok.clone(), &h, &waiting, None);
        assert_eq!(a.level, AlertLevel::Warning);
        assert!(
            a.reason.contains("gone") && a.reason.contains("1000 bytes"),
            "{}",
            a.reason
        );
        // Without a named slot: only once the stream stood still long enough.
        let t = Instant::now();
        let mut watch = StallWatch::default();
        assert_eq!(watch.observe(t, &h, 5), Some(Duration::ZERO));
        let still = watch.observe(t + STALL_AFTER, &h, 5);
        assert_eq!(still, Some(STALL_AFTER));
        assert_eq!(
            assess_stream(ok.clone(), &h, &[], still).level,
            AlertLevel::Warning
        );
        assert_eq!(
            assess_stream(ok.clone(), &h, &[], Some(Duration::from_secs(1))).level,
            AlertLevel::Ok
        );
        // An event published, or the WAL caught up with: it moves again.
        assert_eq!(
            watch.observe(t + STALL_AFTER * 2, &h, 6),
            Some(Duration::ZERO)
        );
        h.confirmed_flush_lsn = Some(h.current_lsn);
        assert_eq!(watch.observe(t + STALL_AFTER * 3, &h, 6), None);
        assert_eq!(assess_stream(ok, &h, &waiting, None).level, AlertLevel::Ok);
    }

    #[test]
    fn webhook_payload_is_alertmanager_shaped() {
        let h = health(500, Some(1000), "extended");
        let a = assess(Some(&h), &cfg());
        let v = webhook_payload("s", AlertLevel::Ok, &a, Some(&h), "2026-01-01T00:00:00Z");
        assert_eq!(v["version"], "4");
        assert_eq!(v["status"], "firing");
        assert_eq!(v["alerts"][0]["labels"]["severity"], "warning");
        assert_eq!(v["alerts"][0]["annotations"]["previous_level"], "ok");
        assert_eq!(v["alerts"][0]["annotations"]["retained_bytes"], 500);
        let ok = assess(Some(&health(1, Some(1000), "reserved")), &cfg());
        let v = webhook_payload("s", AlertLevel::Warning, &ok, Some(&h), "t");
        assert_eq!(v["status"], "resolved");
        assert_eq!(v["alerts"][0]["labels"]["severity"], "warning");
    }
}
