//! The slot monitor: reads the slot's health on its own control connection at start-up and every
//! `slot.check_interval`, exports it as metrics, raises alerts on level changes, writes the
//! optional heartbeat, and stops walbox when the slot is lost.
//!
//! It never touches the replication connection and never blocks it: a failed reading is logged,
//! counted (`walbox_slot_check_errors_total`) and retried at the next tick.
//!
//! `walbox_slot_active` is 1 from the moment walbox streams from the slot (the relay sets it
//! with `walbox_streaming`), not only from the next reading; a reading never sets it to 0 while
//! walbox itself streams. Other processes holding the slot are seen at the next reading.
//!
//! # Progress
//! Every reading is also a [`progress::Sample`]: the catch-up estimate (events/s, WAL behind,
//! time to catch up) is exported as `walbox_catchup_*` and, while the WAL behind is at or above
//! `slot.catchup_threshold`, logged as one line per reading; one "caught up" line follows when
//! it drops below.
//!
//! # Heartbeat
//! With `slot.heartbeat_interval` set, the monitor writes
//! `pg_logical_emit_message(true, 'walbox.heartbeat', '{"sent_at_us": …}')`. It must be
//! transactional: a non-transactional message does not advance an otherwise idle cluster. The
//! relay recognises it when it comes back through the stream (PostgreSQL 14+, which can send
//! logical messages to pgoutput) and records the round trip in
//! `walbox_heartbeat_round_trip_seconds`; the empty transaction it rides in is confirmed like any
//! other, so the slot advances even when no table is written.
//!
//! With `postgres.primary_url` set, heartbeats are written there: when `postgres.url` is a
//! standby, which is read-only, the message is written on the primary and reaches the standby's
//! slot through physical replication. On a standby without `primary_url` no heartbeat is
//! written (a warning says so once) and the slot advances on keepalives alone.
//!
//! `primary_url` is used only while `postgres.url` is in recovery. When a reading finds it is
//! not (the standby was promoted: `pg_is_in_recovery()` turned false), heartbeats go to
//! `postgres.url` itself, the one server whose WAL the slot decodes, and a warning says so once;
//! the old primary, gone or diverged, is never written again.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::config::conninfo::ConnInfo;
use crate::config::{PostgresConfig, SlotConfig};
use crate::failure::{Failure, FatalError};
use crate::health::alert::{self, AlertLevel};
use crate::health::progress::{self, Catchup};
use crate::health::webhook::Webhook;
use crate::metrics::{Metrics, WAL_STATUSES};
use crate::pg::control::connect_control;
use crate::source::slot::{self, SlotHealth, WalSettings};
use crate::source::standby::{self, Role};
use crate::timestamp::pg_now_micros;

/// Prefix of walbox's heartbeat messages.
pub const HEARTBEAT_PREFIX: &str = "walbox.heartbeat";

/// Where the monitor reports a lost slot: the fatal error is stored, then `stop` is raised so
/// the relay winds down as on shutdown.
#[derive(Clone)]
pub struct FatalSignal {
    /// The error to exit with.
    pub error: Arc<Mutex<Option<FatalError>>>,
    /// Raised after `error` is set.
    pub stop: watch::Sender<bool>,
}

impl FatalSignal {
    fn raise(&self, e: FatalError) {
        if let Ok(mut slot) = self.error.lock() {
            slot.get_or_insert(e);
        }
        let _ = self.stop.send(true);
    }
}

/// Exports one reading as metrics.
pub fn export(metrics: &Metrics, h: &SlotHealth, level: AlertLevel) {
    metrics.slot_retained_wal.set(h.retained_bytes() as i64);
    metrics
        .slot_confirmed_lag
        .set(h.confirmed_lag_bytes() as i64);
    metrics
        .slot_safe_wal_size
        .set(h.safe_wal_size.map(|v| v as f64));
    metrics
        .slot_max_wal_keep
        .set(h.max_slot_wal_keep_bytes.map(|v| v as f64));
    metrics.slot_keep_used_ratio.set(h.keep_used_ratio());
    for s in WAL_STATUSES {
        let on = h.wal_status.as_deref() == Some(s);
        metrics
            .slot_wal_status
            .with_label_values(&[s])
            .set(on as i64);
    }
    let flag = |v: Option<bool>| v.map(|b| f64::from(u8::from(b)));
    metrics.slot_failover.set(flag(h.failover));
    metrics.slot_synced.set(flag(h.synced));
    metrics
        .slot_idle_timeout
        .set(h.idle_timeout_seconds.map(|v| v as f64));
    metrics.slot_spilled.set(h.spill_bytes.map(|v| v as f64));
    metrics.slot_alert_level.set(level.value());
    export_active(metrics, h.active);
}

/// Forgets the readings of a term that ended (the process is a standby now, and the active
/// process reports the slot): the alert level back to 0 and the estimates absent, so no stale
/// value of this process fires an alert or shows on a dashboard.
pub fn forget(metrics: &Metrics) {
    metrics.slot_alert_level.set(AlertLevel::Ok.value());
    metrics.slot_active.set(0);
    metrics.catchup_behind.set(None);
    metrics.catchup_events_rate.set(None);
    metrics.catchup_drain_rate.set(None);
    metrics.catchup_eta.set(None);
}

/// Sets `walbox_slot_active` from a reading. The relay sets it to 1 when it starts streaming
/// (after `walbox_streaming`); a reading taken before that must not turn it back to 0, so
/// walbox's own stream counts as active, checked again after the write in case the relay
/// started streaming meanwhile.
fn export_active(metrics: &Metrics, read_active: bool) {
    let streaming = || metrics.streaming.get() == 1;
    let active = read_active || streaming();
    metrics.slot_active.set(active as i64);
    if !active && streaming() {
        metrics.slot_active.set(1);
    }
}

/// State kept between readings.
struct Monitor {
    /// The control connection's settings.
    conn: ConnInfo,
    /// The slot watched.
    slot_name: String,
    /// Thresholds and intervals.
    slot: SlotConfig,
    metrics: Arc<Metrics>,
    webhook: Option<Webhook>,
    fatal: FatalSignal,
    client: Option<tokio_postgres::Client>,
    /// `postgres.primary_url`, where heartbeats go when set.
    primary: Option<ConnInfo>,
    primary_client: Option<tokio_postgres::Client>,
    /// Whether `postgres.url` is a standby, once known (from a reading, or asked).
    on_standby: Option<bool>,
    /// `postgres.url` was seen in recovery, then not: promoted (logged once).
    promoted: bool,
    warned_no_heartbeat: bool,
    level: Option<AlertLevel>,
    seen_slot: bool,
    warned_unlimited: bool,
    warned_idle: bool,
    catchup: Catchup,
    /// Whether the stream stands still ([`alert::StallWatch`]).
    stall: alert::StallWatch,
}

impl Monitor {
    async fn client(&mut self) -> Option<&tokio_postgres::Client> {
        if self.client.as_ref().is_none_or(|c| c.is_closed()) {
            match connect_control(&self.conn).await {
                Ok(c) => self.client = Some(c),
                Err(e) => {
                    self.metrics.slot_check_errors.inc();
                    tracing::warn!(error = %e, "slot monitor cannot connect; retrying at the next check");
                    return None;
                }
            }
        }
        self.client.as_ref()
    }

    /// Whether `postgres.url` is a standby: from the last reading, else asked (the slot may
    /// not exist yet); `false` while the server cannot be asked.
    async fn on_standby(&mut self) -> bool {
        if self.on_standby.is_none() {
            if let Some(c) = self.client().await {
                self.on_standby = standby::role(c)
                    .await
                    .ok()
                    .map(|role| role == Role::Standby);
            }
        }
        self.on_standby.unwrap_or(false)
    }

    /// Writes one heartbeat: through `postgres.primary_url` while `postgres.url` is a standby
    /// (read-only), else through `postgres.url`; on a standby without `primary_url`, none
    /// (logged once).
    async fn heartbeat(&mut self) {
        let metrics = self.metrics.clone();
        let primary = match self.primary.clone() {
            Some(info) if self.on_standby().await => Some(info),
            _ => None,
        };
        let c = match primary {
            Some(info) => {
                if self.primary_client.as_ref().is_none_or(|c| c.is_closed()) {
                    match connect_control(&info).await {
                        Ok(c) => self.primary_client = Some(c),
                        Err(e) => {
                            tracing::warn!(error = %e, "heartbeat: cannot connect to the primary (postgres.primary_url)");
                            return;
                        }
                    }
                }
                self.primary_client.as_ref()
            }
            None if self.on_standby().await => {
                if !self.warned_no_heartbeat {
                    self.warned_no_heartbeat = true;
                    tracing::warn!("slot.heartbeat_interval is set, but postgres.url is a standby (read-only) and postgres.primary_url is not set: no heartbeats; the slot advances on keepalives alone");
                }
                return;
            }
            None => self.client().await,
        };
        let Some(c) = c else { return };
        let content = format!("{{\"sent_at_us\": {}}}", pg_now_micros());
        match c
            .execute(
                "SELECT pg_logical_emit_message(true, $1, $2::text)",
                &[&HEARTBEAT_PREFIX, &content],
            )
            .await
        {
            Ok(_) => metrics.heartbeats_sent.inc(),
            Err(e) => tracing::warn!(error = %e, "heartbeat write failed"),
        }
    }

    /// Feeds a reading to the catch-up estimate, exports it, and logs the progress line.
    fn progress(&mut self, h: &SlotHealth) {
        let e = self.catchup.push(progress::Sample {
            at: std::time::Instant::now(),
            behind_bytes: h.confirmed_lag_bytes(),
            events: self.metrics.events_published.get(),
        });
        let m = &self.metrics;
        m.catchup_behind.set(Some(e.behind_bytes as f64));
        m.catchup_events_rate.set(e.events_per_second);
        m.catchup_drain_rate.set(e.drain_bytes_per_second);
        m.catchup_eta.set(e.eta.map(|d| d.as_secs_f64()));
        if let Some(line) = self.catchup.line(&e, self.slot.catchup_threshold) {
            tracing::info!(
                slot = %self.slot_name,
                wal_behind_bytes = e.behind_bytes,
                events_per_second = e.events_per_second.map(|r| r.round() as u64),
                eta_seconds = e.eta.map(|d| d.as_secs()),
                "{line}"
            );
        }
    }

    /// The start-up warnings about the server's settings, each once: the idle timeout (18+)
    /// and an unlimited `max_slot_wal_keep_size` (the WAL fills the disk of the server the slot
    /// is on: the standby's, when walbox decodes there).
    fn warn_settings(&mut self, s: &WalSettings) {
        let slot = &self.slot_name;
        if let (Some(timeout), Some(_), false) = (
            &s.idle_replication_slot_timeout,
            s.idle_timeout_seconds,
            self.warned_idle,
        ) {
            self.warned_idle = true;
            tracing::warn!(
                slot = %slot,
                idle_replication_slot_timeout = %timeout,
                "idle_replication_slot_timeout is set: if walbox stays disconnected longer than that, PostgreSQL invalidates this slot at a checkpoint and events after its confirmed position can only be republished; keep walbox outages shorter, or disable the timeout for this slot's server"
            );
        }
        if s.max_slot_wal_keep_bytes.is_none() && !self.warned_unlimited {
            self.warned_unlimited = true;
            let server = if s.in_recovery { "standby" } else { "primary" };
            tracing::warn!(
                slot = %slot,
                warning_bytes = self.slot.warning_bytes,
                critical_bytes = self.slot.critical_bytes,
                "max_slot_wal_keep_size = -1: if walbox stops confirming, this slot retains WAL until the {server}'s disk is full; set max_slot_wal_keep_size on the {server}, and alerts use the absolute slot.warning_bytes / slot.critical_bytes thresholds"
            );
        }
    }

    /// One reading: metrics, alert transitions, lost-slot stop. Returns the level, if read.
    async fn check(&mut self) -> Option<AlertLevel> {
        let slot_name = self.slot_name.clone();
        let first = !self.seen_slot;
        let c = self.client().await?;
        let (health, settings, waiting_for) = match slot::read(c, &slot_name).await {
            // Not created yet (create_slot = true and the relay has not started): the
            // settings' warnings are due at start-up all the same.
            Ok(None) if first => (None, slot::settings(c).await.ok(), Vec::new()),
            // A failover slot's stream waits for the standbys of synchronized_standby_slots.
            Ok(Some(h)) if h.failover == Some(true) && !h.in_recovery => {
                let waiting = match slot::standby_slots(c).await {
                    Ok(s) => s.waiting_for,
                    Err(e) => {
                        tracing::debug!(error = %e, "reading synchronized_standby_slots");
                        Vec::new()
                    }
                };
                (Some(h), None, waiting)
            }
            Ok(h) => (h, None, Vec::new()),
            Err(e) => {
                self.metrics.slot_check_errors.inc();
                tracing::warn!(error = %e, "slot health check failed");
                return None;
            }
        };
        self.metrics.slot_checks.inc();
        if let Some(h) = &health {
            if self.on_standby == Some(true) && !h.in_recovery && !self.promoted {
                self.promoted = true;
                self.primary_client = None;
                if self.primary.is_some() {
                    tracing::warn!(
                        slot = %slot_name,
                        "postgres.url is no longer a standby (it was promoted: pg_is_in_recovery() is false): heartbeats are now written there, no longer through postgres.primary_url; remove postgres.primary_url, or point it to the new primary"
                    );
                }
            }
            self.on_standby = Some(h.in_recovery);
        }
        if health.is_none() && first {
            if let Some(settings) = settings {
                self.warn_settings(&settings);
            }
            return None;
        }
        self.seen_slot = true;
        let mut assessment = alert::assess(health.as_ref(), &self.slot);
        if let Some(h) = &health {
            let events = self.metrics.events_published.get();
            let still = self.stall.observe(std::time::Instant::now(), h, events);
            assessment = alert::assess_stream(assessment, h, &waiting_for, still);
        }
        if let Some(h) = &health {
            export(&self.metrics, h, assessment.level);
            self.progress(h);
            self.warn_settings(&h.settings());
        } else {
            self.metrics.slot_alert_level.set(AlertLevel::Lost.value());
        }
        let previous = self.level.unwrap_or(AlertLevel::Ok);
        if self.level != Some(assessment.level)
            && (self.level.is_some() || assessment.level != AlertLevel::Ok)
        {
            alert::log_transition(&slot_name, previous, &assessment, health.as_ref());
            if let Some(w) = &self.webhook {
                w.notify(alert::webhook_payload(
                    &slot_name,
                    previous,
                    &assessment,
                    health.as_ref(),
                    &crate::timestamp::rfc3339_now(),
                ));
            }
        }
        self.level = Some(assessment.level);
        if assessment.level == AlertLevel::Lost {
            let confirmed = health
                .as_ref()
                .and_then(|h| h.confirmed_flush_lsn)
                .map(|l| l.to_string())
                .unwrap_or_else(|| "unknown".into());
            self.fatal.raise(FatalError::new(
                Failure::SlotLost,
                format!(
                    "replication slot {slot_name:?} is lost ({}); last confirmed position {confirmed}: events committed after it may never be relayed. See the runbook \"Slot lost\" in docs/operations.md; recreate the slot only with `walbox recreate-slot`",
                    assessment.reason
                ),
            ));
        }
        Some(assessment.level)
    }
}

/// Runs until `stop` is raised, then takes one last reading (so a slot lost while walbox stops
/// is still reported). Raises `fatal` when the slot is lost.
pub async fn run(
    postgres: PostgresConfig,
    slot: SlotConfig,
    metrics: Arc<Metrics>,
    webhook: Option<Webhook>,
    fatal: FatalSignal,
    mut stop: watch::Receiver<bool>,
) {
    let mut check = tokio::time::interval(slot.check_interval);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let heartbeat_on = slot.heartbeat_interval.is_some();
    let every = slot.heartbeat_interval.unwrap_or(Duration::from_secs(3600));
    let mut heartbeat = tokio::time::interval(every);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut m = Monitor {
        conn: postgres.conn,
        primary: postgres.primary,
        primary_client: None,
        on_standby: None,
        promoted: false,
        warned_no_heartbeat: false,
        slot_name: postgres.slot,
        slot,
        metrics,
        webhook,
        fatal,
        client: None,
        level: None,
        seen_slot: false,
        warned_unlimited: false,
        warned_idle: false,
        catchup: Catchup::default(),
        stall: alert::StallWatch::default(),
    };
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => break,
            _ = check.tick() => {
                if m.check().await == Some(AlertLevel::Lost) {
                    return;
                }
            }
            _ = heartbeat.tick(), if heartbeat_on => m.heartbeat().await,
        }
        if *stop.borrow() {
            break;
        }
    }
    m.check().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_never_clears_slot_active_while_walbox_streams() {
        let m = Metrics::new();
        m.streaming.set(1);
        m.slot_active.set(1);
        // A reading taken before the relay reached streaming says inactive.
        export_active(&m, false);
        assert_eq!(m.slot_active.get(), 1);
        // Not streaming: the reading decides, both ways.
        m.streaming.set(0);
        export_active(&m, false);
        assert_eq!(m.slot_active.get(), 0);
        export_active(&m, true);
        assert_eq!(m.slot_active.get(), 1);
    }
}
