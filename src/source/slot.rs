//! The replication slot's health, read on the ordinary (control) connection — never on the
//! replication connection, which must keep streaming.
//!
//! A logical slot makes PostgreSQL keep WAL from its `restart_lsn` on. If walbox falls behind
//! (broker down, paused deployment), that WAL grows until the disk fills or, with
//! `max_slot_wal_keep_size` set, until PostgreSQL invalidates the slot (`wal_status = lost`) and
//! the events in the removed WAL can no longer be relayed. [`SlotHealth`] holds every number an
//! operator needs to see that coming; `crate::health::alert` turns it into alert levels.
//!
//! One reading works on every supported major (13 and newer): columns that only newer servers
//! have (`invalidation_reason`, `inactive_since`, `failover`, `synced`: 17; the
//! `idle_replication_slot_timeout` setting: 18; `pg_stat_replication_slots`: 14) are read so
//! that they are `None` where they do not exist, never an error.
//!
//! On a standby the slot retains the standby's WAL, and both lag and retained WAL are measured
//! against `pg_last_wal_replay_lsn()`: how far the standby has replayed, which is as far as its
//! slot can be decoded.

use tokio_postgres::Client;

use crate::lsn::Lsn;

/// One reading of the slot and the settings that bound it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SlotHealth {
    /// The slot's name.
    pub slot: String,
    /// How far the server's WAL goes: `pg_current_wal_lsn()` on a primary,
    /// `pg_last_wal_replay_lsn()` on a standby (which has no current WAL position of its own).
    pub current_lsn: Lsn,
    /// Whether the server is a standby (`pg_is_in_recovery()`).
    pub in_recovery: bool,
    /// `conflicting` (PostgreSQL 16+): a standby invalidated the slot in a conflict with
    /// recovery (catalog rows removed on the primary, or `wal_level` lowered there).
    pub conflicting: bool,
    /// WAL the slot retains from here on.
    pub restart_lsn: Option<Lsn>,
    /// Last position confirmed by walbox.
    pub confirmed_flush_lsn: Option<Lsn>,
    /// `reserved`, `extended`, `unreserved` or `lost` (absent on very old servers).
    pub wal_status: Option<String>,
    /// Bytes that can still be written before the slot is in danger (NULL when unlimited or lost).
    pub safe_wal_size: Option<i64>,
    /// Whether a process streams from the slot.
    pub active: bool,
    /// That process.
    pub active_pid: Option<i32>,
    /// `max_slot_wal_keep_size` in bytes; `None` when unlimited (-1).
    pub max_slot_wal_keep_bytes: Option<u64>,
    /// `wal_keep_size` in bytes.
    pub wal_keep_bytes: u64,
    /// `max_wal_size` in bytes.
    pub max_wal_bytes: u64,
    /// `server_version_num`.
    pub server_version_num: i32,
    /// `idle_replication_slot_timeout` (PostgreSQL 18+), as PostgreSQL prints it.
    pub idle_replication_slot_timeout: Option<String>,
    /// The same in seconds; `None` before 18 and when 0 (disabled).
    pub idle_timeout_seconds: Option<u64>,
    /// Why PostgreSQL invalidated the slot (PostgreSQL 17+: `wal_removed`, `rows_removed`,
    /// `wal_level_insufficient`, 18+: `idle_timeout`); `None` while valid or before 17.
    pub invalidation_reason: Option<String>,
    /// Since when no process streams from the slot (PostgreSQL 17+), as PostgreSQL prints it.
    pub inactive_since: Option<String>,
    /// Whether the slot is synchronized to standbys for failover (PostgreSQL 17+).
    pub failover: Option<bool>,
    /// Whether this is a standby's copy synchronized from the primary (PostgreSQL 17+).
    pub synced: Option<bool>,
    /// Bytes of decoded transactions the walsender spilled to disk, cumulative
    /// (`pg_stat_replication_slots.spill_bytes`, PostgreSQL 14+).
    pub spill_bytes: Option<i64>,
}

impl SlotHealth {
    /// Current WAL LSN − `restart_lsn`: the WAL this slot keeps on disk.
    pub fn retained_bytes(&self) -> u64 {
        self.restart_lsn
            .map(|r| self.current_lsn.bytes_since(r))
            .unwrap_or(0)
    }

    /// Current WAL LSN − `confirmed_flush_lsn`: how far walbox's confirmations trail the server.
    pub fn confirmed_lag_bytes(&self) -> u64 {
        self.confirmed_flush_lsn
            .map(|c| self.current_lsn.bytes_since(c))
            .unwrap_or(0)
    }

    /// Retained WAL as a share of `max_slot_wal_keep_size` (`None` when unlimited).
    pub fn keep_used_ratio(&self) -> Option<f64> {
        self.max_slot_wal_keep_bytes
            .filter(|m| *m > 0)
            .map(|m| self.retained_bytes() as f64 / m as f64)
    }

    /// The server settings read with this reading.
    pub fn settings(&self) -> WalSettings {
        WalSettings {
            current_lsn: self.current_lsn,
            in_recovery: self.in_recovery,
            max_slot_wal_keep_bytes: self.max_slot_wal_keep_bytes,
            wal_keep_bytes: self.wal_keep_bytes,
            max_wal_bytes: self.max_wal_bytes,
            server_version_num: self.server_version_num,
            idle_replication_slot_timeout: self.idle_replication_slot_timeout.clone(),
            idle_timeout_seconds: self.idle_timeout_seconds,
        }
    }

    /// Whether PostgreSQL invalidated the slot.
    pub fn is_lost(&self) -> bool {
        self.wal_status.as_deref() == Some("lost") || self.invalidation_reason.is_some()
    }
}

/// What an invalidated slot's `invalidation_reason` means, for the operator's message. Before
/// PostgreSQL 17 (no reason column) a lost slot was invalidated for WAL removal.
pub fn invalidation_cause(reason: Option<&str>) -> String {
    match reason {
        None | Some("wal_removed") => {
            "PostgreSQL removed WAL it still needed (max_slot_wal_keep_size)".into()
        }
        Some("idle_timeout") => {
            "it stayed inactive longer than idle_replication_slot_timeout".into()
        }
        Some("rows_removed") => {
            "the primary removed catalog rows it needed (a slot on a standby: set hot_standby_feedback = on)".into()
        }
        Some("wal_level_insufficient") => {
            "the primary's wal_level is no longer logical".into()
        }
        Some(other) => format!("invalidation_reason = {other}"),
    }
}

/// The columns of `pg_replication_slots` read by [`read`] whichever the server's major:
/// `to_jsonb(s) ->> '<column>'` is NULL for a column the major does not have.
const SLOT_COLUMNS: &str = "SELECT s.restart_lsn::text, s.confirmed_flush_lsn::text, \
    s.wal_status, s.safe_wal_size, s.active, s.active_pid, \
    to_jsonb(s) ->> 'invalidation_reason', to_jsonb(s) ->> 'inactive_since', \
    (to_jsonb(s) ->> 'failover')::bool, (to_jsonb(s) ->> 'synced')::bool, \
    (SELECT (to_jsonb(r) ->> 'spill_bytes')::bigint FROM pg_stat_replication_slots r \
     WHERE r.slot_name = s.slot_name), \
    coalesce((to_jsonb(s) ->> 'conflicting')::bool, false) \
    FROM pg_replication_slots s WHERE s.slot_name = $1";

/// The same before PostgreSQL 14, which has no `pg_stat_replication_slots`.
const SLOT_COLUMNS_13: &str = "SELECT s.restart_lsn::text, s.confirmed_flush_lsn::text, \
    s.wal_status, s.safe_wal_size, s.active, s.active_pid, \
    NULL::text, NULL::text, NULL::bool, NULL::bool, NULL::bigint, false \
    FROM pg_replication_slots s WHERE s.slot_name = $1";

/// The server settings that bound every slot, read with [`read`] (and alone by `walbox
/// check`, when the slot does not exist yet).
#[derive(Debug, Clone, PartialEq)]
pub struct WalSettings {
    /// See [`SlotHealth::current_lsn`].
    pub current_lsn: Lsn,
    /// `pg_is_in_recovery()`.
    pub in_recovery: bool,
    /// `max_slot_wal_keep_size` in bytes; `None` when unlimited (-1).
    pub max_slot_wal_keep_bytes: Option<u64>,
    /// `wal_keep_size` in bytes.
    pub wal_keep_bytes: u64,
    /// `max_wal_size` in bytes.
    pub max_wal_bytes: u64,
    /// `server_version_num`.
    pub server_version_num: i32,
    /// `idle_replication_slot_timeout` (18+), as PostgreSQL prints it.
    pub idle_replication_slot_timeout: Option<String>,
    /// The same in seconds; `None` before 18 and when 0 (disabled).
    pub idle_timeout_seconds: Option<u64>,
}

/// Reads [`WalSettings`].
pub async fn settings(client: &Client) -> Result<WalSettings, tokio_postgres::Error> {
    let settings = client
        .query_one(
            "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                          ELSE pg_current_wal_lsn() END)::text, \
                    pg_size_bytes(current_setting('max_slot_wal_keep_size')), \
                    pg_size_bytes(current_setting('wal_keep_size')), \
                    pg_size_bytes(current_setting('max_wal_size')), \
                    current_setting('server_version_num')::int, \
                    current_setting('idle_replication_slot_timeout', true), \
                    (SELECT setting::bigint * CASE unit WHEN 'min' THEN 60 ELSE 1 END \
                     FROM pg_settings WHERE name = 'idle_replication_slot_timeout'), \
                    pg_is_in_recovery()",
            &[],
        )
        .await?;
    let max_keep: i64 = settings.get(1);
    Ok(WalSettings {
        current_lsn: settings
            .get::<_, Option<String>>(0)
            .and_then(|t| t.parse::<Lsn>().ok())
            .unwrap_or(Lsn::ZERO),
        in_recovery: settings.get(7),
        max_slot_wal_keep_bytes: u64::try_from(max_keep).ok(),
        wal_keep_bytes: u64::try_from(settings.get::<_, i64>(2)).unwrap_or(0),
        max_wal_bytes: u64::try_from(settings.get::<_, i64>(3)).unwrap_or(0),
        server_version_num: settings.get(4),
        idle_replication_slot_timeout: settings
            .get::<_, Option<String>>(5)
            .filter(|v| !v.is_empty()),
        idle_timeout_seconds: settings
            .get::<_, Option<i64>>(6)
            .and_then(|v| u64::try_from(v).ok())
            .filter(|v| *v > 0),
    })
}

/// Reads the slot's health. `Ok(None)` when the slot does not exist.
pub async fn read(
    client: &Client,
    slot: &str,
) -> Result<Option<SlotHealth>, tokio_postgres::Error> {
    let settings = settings(client).await?;
    let columns = if settings.server_version_num >= 140_000 {
        SLOT_COLUMNS
    } else {
        SLOT_COLUMNS_13
    };
    let row = client.query_opt(columns, &[&slot]).await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let lsn = |v: Option<String>| v.and_then(|t| t.parse::<Lsn>().ok());
    Ok(Some(SlotHealth {
        slot: slot.to_owned(),
        current_lsn: settings.current_lsn,
        restart_lsn: lsn(row.get(0)),
        confirmed_flush_lsn: lsn(row.get(1)),
        wal_status: row.get(2),
        safe_wal_size: row.get(3),
        active: row.get(4),
        active_pid: row.get(5),
        max_slot_wal_keep_bytes: settings.max_slot_wal_keep_bytes,
        wal_keep_bytes: settings.wal_keep_bytes,
        max_wal_bytes: settings.max_wal_bytes,
        server_version_num: settings.server_version_num,
        idle_replication_slot_timeout: settings.idle_replication_slot_timeout,
        idle_timeout_seconds: settings.idle_timeout_seconds,
        invalidation_reason: row.get(6),
        inactive_since: row.get(7),
        failover: row.get(8),
        synced: row.get(9),
        spill_bytes: row.get(10),
        in_recovery: settings.in_recovery,
        conflicting: row.get(11),
    }))
}

/// `synchronized_standby_slots` (PostgreSQL 17+; empty before and when unset), and the slots it
/// names that are not active physical slots. A failover slot's walsender sends nothing the
/// standbys of those slots have not received: one of them gone, and the stream stalls (the
/// server says so only in a WARNING on the replication connection).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StandbySlots {
    /// The setting as written.
    pub setting: String,
    /// The slots it names that do not exist or are not active physical slots, sorted.
    pub waiting_for: Vec<String>,
}

/// Reads [`StandbySlots`] (on the primary: the setting means nothing on a standby).
pub async fn standby_slots(client: &Client) -> Result<StandbySlots, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT coalesce(current_setting('synchronized_standby_slots', true), ''), \
                    coalesce((SELECT array_agg(trim(s) ORDER BY trim(s)) \
                     FROM unnest(string_to_array(current_setting('synchronized_standby_slots', true), ',')) s \
                     WHERE trim(s) <> '' AND NOT EXISTS (SELECT 1 FROM pg_replication_slots r \
                        WHERE r.slot_name = trim(s) AND r.slot_type = 'physical' AND r.active)), '{}')",
            &[],
        )
        .await?;
    Ok(StandbySlots {
        setting: row.get(0),
        waiting_for: row.get(1),
    })
}

/// How many replication slots and walsenders the server has, how many are taken, and how many
/// of those are a layout's own (its slots, and the walsenders streaming from them): what a
/// layout of `ours.len()` slots still needs is counted from this, by `walbox run` before it
/// creates a layout's slots and by `walbox check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    /// `max_replication_slots`.
    pub max_slots: u32,
    /// Replication slots that exist (any database, any kind).
    pub used_slots: u32,
    /// `max_wal_senders`.
    pub max_senders: u32,
    /// Walsenders running (replication connections, streaming or not).
    pub used_senders: u32,
    /// The layout's slots that exist.
    pub existing: Vec<String>,
    /// The layout's slots a walsender streams from.
    pub active: Vec<String>,
}

impl Capacity {
    /// Slots still to create for a layout of `count` slots.
    pub fn missing_slots(&self, count: usize) -> usize {
        count.saturating_sub(self.existing.len())
    }

    /// Replication slots that would be free after creating the missing ones (negative: short).
    pub fn slots_left(&self, count: usize) -> i64 {
        i64::from(self.max_slots) - i64::from(self.used_slots) - self.missing_slots(count) as i64
    }

    /// Walsenders that would be free with every one of the `count` slots streamed from, plus
    /// `extra` more connections (negative: short). Walsenders already streaming from the
    /// layout's slots are counted as the layout's own.
    pub fn senders_left(&self, count: usize, extra: usize) -> i64 {
        let others = i64::from(self.used_senders) - self.active.len() as i64;
        i64::from(self.max_senders) - others - (count + extra) as i64
    }

    /// `max_replication_slots` a layout of `count` slots needs, everything else staying.
    pub fn slots_needed(&self, count: usize) -> i64 {
        i64::from(self.max_slots) - self.slots_left(count)
    }

    /// `max_wal_senders` a layout of `count` slots (plus `extra` connections) needs.
    pub fn senders_needed(&self, count: usize, extra: usize) -> i64 {
        i64::from(self.max_senders) - self.senders_left(count, extra)
    }
}

/// Reads [`Capacity`] for the layout whose slots are `ours`.
pub async fn capacity(client: &Client, ours: &[String]) -> Result<Capacity, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT current_setting('max_replication_slots')::int, \
                    (SELECT count(*) FROM pg_replication_slots)::int, \
                    current_setting('max_wal_senders')::int, \
                    (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender')::int, \
                    coalesce((SELECT array_agg(slot_name::text ORDER BY slot_name) \
                              FROM pg_replication_slots WHERE slot_name = ANY($1)), '{}'), \
                    coalesce((SELECT array_agg(slot_name::text ORDER BY slot_name) \
                              FROM pg_replication_slots WHERE slot_name = ANY($1) AND active), '{}')",
            &[&ours],
        )
        .await?;
    let count = |i: usize| u32::try_from(row.get::<_, i32>(i)).unwrap_or(0);
    Ok(Capacity {
        max_slots: count(0),
        used_slots: count(1),
        max_senders: count(2),
        used_senders: count(3),
        existing: row.get(4),
        active: row.get(5),
    })
}

/// Moves a slot that no walsender streams from forward to `to`
/// (`pg_replication_slot_advance`); returns where it is now, which is short of `to` when the
/// server has not flushed (on a standby: replayed) that far yet.
pub async fn advance(client: &Client, slot: &str, to: Lsn) -> Result<Lsn, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT end_lsn::text FROM pg_replication_slot_advance($1, $2::text::pg_lsn)",
            &[&slot, &to.to_string()],
        )
        .await?;
    Ok(row
        .get::<_, Option<String>>(0)
        .and_then(|t| t.parse().ok())
        .unwrap_or(Lsn::ZERO))
}

/// Drops the slot (which must not be active) and creates it again with pgoutput; returns the new
/// slot's consistent point. Events committed between the old slot's confirmed position and that
/// point are not in the new slot's stream. `failover` (PostgreSQL 17+, the old slot's flag) is
/// kept: a slot synchronized to standbys stays so.
pub async fn recreate(
    client: &Client,
    slot: &str,
    failover: Option<bool>,
) -> Result<Lsn, tokio_postgres::Error> {
    client
        .execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    // The fifth argument (failover) exists from 17 on: passed only when the old slot had it.
    let row = match failover {
        Some(true) => {
            client
                .query_one(
                    "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)",
                    &[&slot],
                )
                .await?
        }
        _ => {
            client
                .query_one(
                    "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
                    &[&slot],
                )
                .await?
        }
    };
    Ok(row
        .get::<_, Option<String>>(0)
        .and_then(|t| t.parse().ok())
        .unwrap_or(Lsn::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> SlotHealth {
        SlotHealth {
            slot: "s".into(),
            current_lsn: Lsn(1000),
            restart_lsn: Some(Lsn(400)),
            confirmed_flush_lsn: Some(Lsn(900)),
            wal_status: Some("reserved".into()),
            safe_wal_size: Some(600),
            active: true,
            active_pid: Some(1),
            max_slot_wal_keep_bytes: Some(1200),
            wal_keep_bytes: 0,
            max_wal_bytes: 1 << 30,
            server_version_num: 150018,
            idle_replication_slot_timeout: None,
            idle_timeout_seconds: None,
            invalidation_reason: None,
            inactive_since: None,
            failover: None,
            synced: None,
            spill_bytes: None,
            in_recovery: false,
            conflicting: false,
        }
    }

    #[test]
    fn derived_numbers() {
        let h = health();
        assert_eq!(h.retained_bytes(), 600);
        assert_eq!(h.confirmed_lag_bytes(), 100);
        assert_eq!(h.keep_used_ratio(), Some(0.5));
        let unlimited = SlotHealth {
            max_slot_wal_keep_bytes: None,
            ..h
        };
        assert_eq!(unlimited.keep_used_ratio(), None);
    }

    #[test]
    fn an_invalidation_reason_means_lost_and_names_its_cause() {
        let idle = SlotHealth {
            wal_status: Some("reserved".into()),
            invalidation_reason: Some("idle_timeout".into()),
            ..health()
        };
        assert!(idle.is_lost());
        assert!(!health().is_lost());
        let cause = invalidation_cause(idle.invalidation_reason.as_deref());
        assert!(cause.contains("idle_replication_slot_timeout"), "{cause}");
        assert!(invalidation_cause(None).contains("max_slot_wal_keep_size"));
        assert!(invalidation_cause(Some("new_reason")).contains("new_reason"));
    }
}
