//! Decoding on a physical standby (PostgreSQL 16+): what differs when `postgres.url` names a
//! hot standby instead of the primary.
//!
//! ```text
//! primary ──physical replication──▶ standby ──logical (walbox's slot)──▶ walbox
//!    ▲                                                                      │
//!    └── postgres.primary_url: heartbeats, pg_log_standby_snapshot() ───────┘
//! ```
//!
//! # Invariants
//! - A standby is detected with `pg_is_in_recovery()` on every session start; on a standby the
//!   checks of [`check`] hold before any slot is created or streamed: PostgreSQL 16 or newer,
//!   `hot_standby_feedback = on` (else the primary may vacuum catalog rows the slot still needs
//!   and the standby invalidates the slot), and, when `primary_url` is set, the primary's
//!   `wal_level = logical` (the standby refuses to decode otherwise).
//! - Nothing is ever written to a standby (it is read-only): heartbeats and
//!   `pg_log_standby_snapshot()` go through `postgres.primary_url`.
//! - Creating a slot on a standby waits for a running-transactions record from the primary
//!   (the primary writes one about every 15 s, and only while it has traffic). While the
//!   creation waits, [`while_slot_is_created`] asks the primary for one every
//!   [`SNAPSHOT_INTERVAL`] through `primary_url`; without it, it logs the statement to run.
//! - Lag and retained WAL on a standby are measured against `pg_last_wal_replay_lsn()` (see
//!   `source::slot`): a standby has no `pg_current_wal_lsn()`.

use std::future::Future;
use std::time::Duration;

use tokio_postgres::Client;

use crate::config::conninfo::ConnInfo;
use crate::failure::{Classify, Failure};
use crate::pg::control::connect_control;

/// Oldest server that decodes on a standby (`server_version_num`).
pub const MIN_STANDBY_VERSION: i32 = 160_000;

/// How often the primary is asked for a running-transactions record while a slot is created.
pub const SNAPSHOT_INTERVAL: Duration = Duration::from_secs(1);

/// How long slot creation may wait before walbox, without `primary_url`, says what to run.
const SNAPSHOT_HINT_AFTER: Duration = Duration::from_secs(2);

/// The statement that makes the primary write a running-transactions record.
pub const LOG_STANDBY_SNAPSHOT: &str = "SELECT pg_log_standby_snapshot()";

/// Where `postgres.url` points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A server that is not in recovery.
    Primary,
    /// A hot standby (`pg_is_in_recovery()`).
    Standby,
}

/// A standby cannot be decoded from.
#[derive(Debug, thiserror::Error)]
pub enum StandbyError {
    /// A query on the standby failed.
    #[error("postgres: {0}")]
    Query(#[from] tokio_postgres::Error),
    /// Logical decoding on a standby needs PostgreSQL 16.
    #[error("postgres.url points to a standby running PostgreSQL {0}: logical decoding on a standby needs PostgreSQL 16 or newer; point postgres.url to the primary, or upgrade")]
    TooOld(String),
    /// `hot_standby_feedback` is off on the standby.
    #[error("hot_standby_feedback is off on the standby postgres.url points to: set hot_standby_feedback = on in its postgresql.conf and run SELECT pg_reload_conf() (without it the primary removes catalog rows the slot needs and the standby invalidates the slot)")]
    NoFeedback,
    /// The primary's `wal_level` is not `logical`.
    #[error("wal_level is {0:?} on the primary (postgres.primary_url): set wal_level = logical in the primary's postgresql.conf and restart it; a standby decodes only WAL written with wal_level = logical")]
    PrimaryWalLevel(String),
    /// `postgres.primary_url` names a server that is in recovery itself.
    #[error("postgres.primary_url points to a server in recovery: it must name the primary (the server that accepts writes)")]
    PrimaryInRecovery,
    /// The publication is missing, and a standby cannot create it.
    #[error("publication {0:?} does not exist on the standby, which is read-only: create it on the primary with CREATE PUBLICATION {0} FOR TABLE <outbox> WITH (publish = 'insert')")]
    MissingPublication(String),
}

impl Classify for StandbyError {
    fn failure(&self) -> Option<Failure> {
        match self {
            StandbyError::Query(e) => e.failure(),
            _ => Some(Failure::Schema),
        }
    }
}

/// Whether `client` is connected to a standby.
pub async fn role(client: &Client) -> Result<Role, tokio_postgres::Error> {
    let row = client.query_one("SELECT pg_is_in_recovery()", &[]).await?;
    Ok(if row.get::<_, bool>(0) {
        Role::Standby
    } else {
        Role::Primary
    })
}

/// The start-up checks of a standby (see the module docs); `num` and `version` are the
/// standby's `server_version_num` and `server_version`. An unreachable primary is not fatal
/// (the standby can still be decoded): it is logged, and its `wal_level` is not checked.
pub async fn check(
    standby: &Client,
    primary: Option<&ConnInfo>,
    num: i32,
    version: &str,
) -> Result<(), StandbyError> {
    if num < MIN_STANDBY_VERSION {
        return Err(StandbyError::TooOld(version.to_owned()));
    }
    let row = standby
        .query_one(
            "SELECT current_setting('hot_standby_feedback')::bool, current_setting('primary_slot_name')",
            &[],
        )
        .await?;
    if !row.get::<_, bool>(0) {
        return Err(StandbyError::NoFeedback);
    }
    if row.get::<_, String>(1).is_empty() {
        tracing::warn!("the standby has no primary_slot_name: while it is disconnected from the primary, hot_standby_feedback does not hold back vacuum there and the standby may invalidate walbox's slot; create a physical slot on the primary and set primary_slot_name on the standby");
    }
    let Some(primary) = primary else {
        tracing::info!("decoding on a standby without postgres.primary_url: no heartbeats (the slot advances on keepalives alone) and no pg_log_standby_snapshot() when a slot is created");
        return Ok(());
    };
    let client = match connect_control(primary).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "cannot reach the primary (postgres.primary_url) to check its wal_level; decoding on the standby goes on");
            return Ok(());
        }
    };
    let row = client
        .query_one(
            "SELECT pg_is_in_recovery(), current_setting('wal_level')",
            &[],
        )
        .await?;
    if row.get::<_, bool>(0) {
        return Err(StandbyError::PrimaryInRecovery);
    }
    let wal_level: String = row.get(1);
    if wal_level != "logical" {
        return Err(StandbyError::PrimaryWalLevel(wal_level));
    }
    Ok(())
}

/// Runs `create` (a slot creation on a standby) while asking the primary for a
/// running-transactions record every [`SNAPSHOT_INTERVAL`] through `primary`; without
/// `primary`, or when it cannot be reached, logs once what to run there.
pub async fn while_slot_is_created<T>(
    primary: Option<&ConnInfo>,
    slot: &str,
    create: impl Future<Output = T>,
) -> T {
    tokio::pin!(create);
    let start = tokio::time::Instant::now();
    // The first tick is immediate: the creation has been sent (polled once) by then.
    let mut tick = tokio::time::interval(SNAPSHOT_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client: Option<Client> = None;
    let (mut hinted, mut requested) = (false, 0u32);
    loop {
        tokio::select! {
            biased;
            created = &mut create => {
                tracing::info!(slot, requested, "slot creation on the standby done; running-transactions records asked of the primary: {requested}");
                return created;
            }
            _ = tick.tick() => {}
        }
        let written = match primary {
            Some(info) => log_standby_snapshot(info, &mut client).await,
            None => Err("postgres.primary_url is not set".to_owned()),
        };
        match written {
            Ok(()) => requested += 1,
            Err(why) if !hinted && start.elapsed() >= SNAPSHOT_HINT_AFTER => {
                hinted = true;
                tracing::warn!(slot, reason = %why, "creating the slot on a standby waits for a running-transactions record from the primary (written about every 15 s while the primary has traffic); to finish now, run on the primary: {LOG_STANDBY_SNAPSHOT};");
            }
            Err(_) => {}
        }
    }
}

/// `SELECT pg_log_standby_snapshot()` on the primary, connecting first when needed.
async fn log_standby_snapshot(info: &ConnInfo, client: &mut Option<Client>) -> Result<(), String> {
    if client.as_ref().is_none_or(|c| c.is_closed()) {
        *client = Some(connect_control(info).await.map_err(|e| e.to_string())?);
    }
    let c = client.as_ref().expect("connected above");
    c.batch_execute(LOG_STANDBY_SNAPSHOT)
        .await
        .map_err(|e| format!("{LOG_STANDBY_SNAPSHOT} failed on the primary: {e}"))
}
