//! Opening a slot session: everything between "connect" and "streaming".
//!
//! ```text
//! control connection ──catalog::prepare──▶ server, wal_level, tables, publication checked;
//!                                          on a standby also 16+, hot_standby_feedback, the
//!                                          primary's wal_level (source::standby)
//! replication connection ──IDENTIFY_SYSTEM──▶ system identifier, database
//! catalog::slot_state ──▶ the slot as found (None: missing)
//!   [caller decides: create it, or stop — see relay and sink::progress]
//! START_REPLICATION SLOT … LOGICAL <start> (proto_version, publication_names[, messages])
//! ```
//!
//! # Invariants
//! - Nothing here creates a slot on its own: [`OpenSession::create_slot`] is called only by a
//!   caller that has proved the slot never existed.
//! - Streaming starts at the position the caller gives (never below the slot's
//!   `confirmed_flush_lsn`, which the caller reads from [`OpenSession::slot`]); `0/0` is never
//!   sent, because PostgreSQL 15 would accept a lower position and move the slot backwards.
//! - On a standby, a position the caller holds as acknowledged but the server has not yet
//!   replayed to is waited for ([`OpenSession::wait_for_wal`], bounded), never judged at once as
//!   of another history.
//! - `messages` is requested only from PostgreSQL 14 on (pgoutput rejects it before); on 13
//!   heartbeats still advance the slot, unmeasured, and the log says so.

use crate::config::{OutboxConfig, PostgresConfig};
use crate::failure::{Classify, Failure};
use crate::lsn::Lsn;
use crate::pg::control::{connect_control, ConnectError};
use crate::source::catalog::{self, CatalogError, SlotState};
use crate::source::replication::{
    ReplicationConnection, ReplicationError, ReplicationStream, SystemIdentity,
};
use crate::source::standby::{self, Role};

use std::time::{Duration, Instant};

/// The longest [`OpenSession::wait_for_wal`] waits for a standby's replay.
pub const WAL_WAIT: Duration = Duration::from_secs(60);
/// How long a standby's WAL position may stand still before [`OpenSession::wait_for_wal`]
/// takes it as the end of the server's history.
pub const WAL_STALL: Duration = Duration::from_secs(5);
/// How often [`OpenSession::wait_for_wal`] asks.
const WAL_POLL: Duration = Duration::from_millis(200);

/// Opening the session failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The control connection failed.
    #[error("postgres control connection: {0}")]
    Control(#[from] ConnectError),
    /// A start-up check failed.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// The replication connection failed.
    #[error("postgres replication: {0}")]
    Replication(#[from] ReplicationError),
}

impl Classify for OpenError {
    fn failure(&self) -> Option<Failure> {
        match self {
            OpenError::Control(e) => e.failure(),
            OpenError::Catalog(e) => e.failure(),
            OpenError::Replication(e) => e.failure(),
        }
    }
}

impl OpenError {
    /// The SQLSTATE of a server error, e.g. `53300` when no walsender is free.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            OpenError::Control(e) => e.sqlstate(),
            OpenError::Replication(e) => e.sqlstate(),
            OpenError::Catalog(CatalogError::Query(e)) => e.as_db_error().map(|d| d.code().code()),
            OpenError::Catalog(_) => None,
        }
    }

    /// The server setting that ran out, when the server refused for want of a walsender
    /// (`53300` … exceeds `max_wal_senders`) or of a replication slot (`53400`).
    pub fn exhausted_setting(&self) -> Option<&'static str> {
        match self.sqlstate() {
            Some("53300") if self.to_string().contains("max_wal_senders") => {
                Some("max_wal_senders")
            }
            Some("53400") => Some("max_replication_slots"),
            _ => None,
        }
    }
}

/// A checked server with a replication connection, before streaming.
pub struct OpenSession {
    control: tokio_postgres::Client,
    repl: ReplicationConnection,
    /// What `IDENTIFY_SYSTEM` said.
    pub identity: SystemIdentity,
    /// The slot as found (`None`: it does not exist).
    pub slot: Option<SlotState>,
    /// Whether `postgres.url` is the primary or a standby.
    pub role: Role,
    /// Each table route's NOT NULL columns ([`catalog::not_null_columns`]).
    pub not_null: Vec<Vec<String>>,
    /// `postgres.primary_url`, asked for running-transactions records while a slot is created
    /// on a standby.
    primary: Option<crate::config::conninfo::ConnInfo>,
    /// `postgres.failover_slot`: a slot created here is a failover slot.
    failover: bool,
}

/// Connects both connections, runs the start-up checks (creating the publication when
/// configured), identifies the server and reads the slot.
pub async fn open(pg: &PostgresConfig, outbox: &OutboxConfig) -> Result<OpenSession, OpenError> {
    let control = connect_control(&pg.conn).await?;
    let role = catalog::prepare(&control, pg, outbox).await?;
    let not_null = catalog::not_null_columns(&control, outbox)
        .await
        .map_err(catalog::CatalogError::from)?;
    let mut repl = ReplicationConnection::connect(&pg.conn).await?;
    let identity = repl.identify_system().await?;
    let mut slot = catalog::slot_state(&control, &pg.slot).await?;
    if pg.failover_slot {
        if let Some(state) = slot.filter(|s| s.failover == Some(false)) {
            repl.enable_failover(&pg.slot).await?;
            tracing::info!(slot = %pg.slot, "the slot is now a failover slot (ALTER_REPLICATION_SLOT … FAILOVER): standbys with sync_replication_slots = on keep a copy of it");
            slot = Some(catalog::SlotState {
                failover: Some(true),
                ..state
            });
        }
    }
    Ok(OpenSession {
        control,
        repl,
        identity,
        slot,
        role,
        not_null,
        primary: pg.primary.clone(),
        failover: pg.failover_slot,
    })
}

impl OpenSession {
    /// The column `walbox republish --since` compares ([`catalog::time_column`]); `None` when
    /// there is none or it cannot be read.
    pub async fn time_column(&self, outbox: &OutboxConfig) -> Option<String> {
        catalog::time_column(&self.control, outbox)
            .await
            .ok()
            .flatten()
    }

    /// What `publication` covers of `tables` (`(schema, table)`) now: the publication watch's
    /// first reading ([`crate::source::publication`]), taken before streaming starts.
    pub async fn publication(
        &self,
        publication: &str,
        tables: &[(String, String)],
    ) -> Result<crate::source::publication::Coverage, OpenError> {
        crate::source::publication::read(&self.control, publication, tables)
            .await
            .map_err(|e| CatalogError::Query(e).into())
    }

    /// The ancestors of the server's current timeline (see [`crate::source::timeline`]).
    pub async fn timeline_history(
        &mut self,
    ) -> Result<crate::source::timeline::TimelineHistory, OpenError> {
        Ok(self.repl.timeline_history(self.identity.timeline).await?)
    }

    /// On a standby, waits until the server's WAL position (`IDENTIFY_SYSTEM`: the WAL it has
    /// replayed or received) reaches `target`, and returns the position it got to. A hot
    /// standby restarted after a crash takes connections once it is consistent, before it has
    /// replayed the rest of its own WAL. The wait ends at `target`, when the position stops
    /// moving for [`WAL_STALL`] (this server's history ends below `target`), when the timeline
    /// changes, or after [`WAL_WAIT`] in all.
    pub async fn wait_for_wal(&mut self, target: Lsn) -> Result<Lsn, OpenError> {
        let started = Instant::now();
        let mut at = self.identity.xlogpos;
        let mut moved = Instant::now();
        tracing::info!(
            wal_at = %at, target = %target,
            "the standby has not yet replayed its WAL up to what walbox acknowledged on it; waiting for its replay"
        );
        while at < target && moved.elapsed() < WAL_STALL && started.elapsed() < WAL_WAIT {
            tokio::time::sleep(WAL_POLL).await;
            let now = self.repl.identify_system().await?;
            if now.timeline != self.identity.timeline {
                break;
            }
            if now.xlogpos > at {
                at = now.xlogpos;
                moved = Instant::now();
            }
        }
        tracing::info!(
            wal_at = %at, target = %target, waited_ms = started.elapsed().as_millis() as u64,
            "the standby's WAL position after waiting for its replay"
        );
        self.identity.xlogpos = at;
        Ok(at)
    }

    /// Creates the missing slot (pgoutput, no snapshot) and reads it back. On a standby the
    /// creation waits for a running-transactions record from the primary, asked for through
    /// `postgres.primary_url` (see [`standby::while_slot_is_created`]).
    pub async fn create_slot(&mut self, slot: &str) -> Result<SlotState, OpenError> {
        let create = self.repl.create_logical_slot(slot, self.failover);
        let at = match self.role {
            Role::Primary => create.await?,
            Role::Standby => {
                standby::while_slot_is_created(self.primary.as_ref(), slot, create).await?
            }
        };
        tracing::info!(slot, consistent_point = %at, "created replication slot (the broker holds no progress record of it: it never existed)");
        let state = catalog::slot_state(&self.control, slot)
            .await?
            .ok_or_else(|| CatalogError::MissingSlot(slot.to_owned()))?;
        self.slot = Some(state);
        Ok(state)
    }

    /// `START_REPLICATION` from `start`; `messages` asks for logical messages (heartbeats, the
    /// table-less outbox) where the server supports them.
    pub async fn start(
        self,
        pg: &PostgresConfig,
        start: Lsn,
        messages: bool,
    ) -> Result<ReplicationStream, OpenError> {
        drop(self.control);
        let mut options = vec![
            ("proto_version", "1"),
            ("publication_names", pg.publication.as_str()),
        ];
        if messages && self.repl.server_version_num() >= 140_000 {
            options.push(("messages", "true"));
        } else if messages {
            // Only heartbeats get here: catalog::prepare refuses [outbox.messages] before 14.
            tracing::warn!(
                server_version_num = self.repl.server_version_num(),
                "heartbeats are written but not measured: PostgreSQL 13 cannot stream logical messages to pgoutput (14+), so walbox_heartbeat_round_trip_seconds stays empty; each heartbeat's empty transaction still advances the slot"
            );
        }
        let stream = self.repl.start_logical(&pg.slot, start, &options).await?;
        tracing::info!(slot = %pg.slot, start = %start, "streaming");
        Ok(stream)
    }
}
