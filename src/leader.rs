//! Leadership: of several walbox processes started with the same configuration for one slot,
//! exactly one streams (the active one); the others are standbys that wait and take over when it
//! dies or is cut off from PostgreSQL.
//!
//! The election is PostgreSQL's own: a session-level advisory lock on an ordinary connection
//! (the *lock connection*), keyed by the slot, in the slot's database. No extra service.
//!
//! # Invariants
//! - A process starts streaming only while it holds the lock. The lock is taken before the
//!   first replication session and checked every [`CHECK_INTERVAL`]; a check that fails or does
//!   not answer within [`CHECK_TIMEOUT`] ends the term: the relay winds down as on shutdown
//!   (confirming what the broker acknowledged, if PostgreSQL still answers), the lock connection
//!   is closed only after that, and the process becomes a standby again.
//! - Even so, the lock is an election, not the guard: PostgreSQL lets one walsender at a time use
//!   a slot (`active_pid`). A new active process whose START_REPLICATION finds the slot still
//!   held (the previous streamer's walsender has not yet noticed that its client is gone) retries
//!   every [`SLOT_BUSY_RETRY`] instead of exiting; the server releases the slot when its
//!   walsender times out (`wal_sender_timeout`) or sees the socket closed.
//! - The lock connection sets short TCP keepalives and `tcp_user_timeout` on its server session,
//!   so the backend holding the lock of a process that vanished from the network (not only one
//!   that died, whose socket the kernel closes at once) ends within about
//!   [`SERVER_DEAD_PEER_SECS`] seconds and releases the lock.
//!
//! Takeover therefore takes: after SIGKILL of the active process, its sockets close at once, the
//! lock and the slot are released, and a standby's next poll ([`STANDBY_POLL`]) wins; when the
//! active process is cut off without dying, the lock is released within
//! [`SERVER_DEAD_PEER_SECS`], and the slot when its walsender times out, so the bound is
//! `wal_sender_timeout` + a few seconds.
//!
//! The lock key is two int4s: [`LOCK_CLASS`] (`'WALB'`) and `hashtext(<slot name>)`, so
//! operators find it with
//! `SELECT * FROM pg_locks WHERE locktype = 'advisory' AND classid = 1463897154`.
//! The lock connection reports `application_name = 'walbox leader <host> pid <pid>'`, which is
//! how a standby names the process it waits for.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::conninfo::ConnInfo;
use crate::failure::{Classify, Failure, FatalError};
use crate::metrics::{Health, Metrics};
use crate::pg::control::{connect_control, ConnectError};

/// The first key of the advisory lock: `'WALB'` as a big-endian int4.
pub const LOCK_CLASS: i32 = 0x5741_4C42;

/// How often a standby tries the lock.
pub const STANDBY_POLL: Duration = Duration::from_secs(1);

/// How often the active process checks that its lock connection is alive.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// A check that takes longer than this ends the term.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(4);

/// How long a new active process waits between attempts while the slot is still held by the
/// previous streamer's walsender.
pub const SLOT_BUSY_RETRY: Duration = Duration::from_secs(1);

/// The server-side bound on noticing that the lock holder vanished: keepalives after 3 s idle,
/// then every 1 s, 3 probes; `tcp_user_timeout` for unacknowledged data.
pub const SERVER_DEAD_PEER_SECS: u64 = 6;

const SESSION_SETTINGS: &str = "SET tcp_keepalives_idle = 3; SET tcp_keepalives_interval = 1; \
     SET tcp_keepalives_count = 3; SET tcp_user_timeout = 6000";

/// Why a process is not (or no longer) the active one.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The lock connection could not be opened.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// A query on the lock connection failed.
    #[error("leader lock connection: {0}")]
    Query(#[from] tokio_postgres::Error),
    /// The lock connection did not answer in time.
    #[error("leader lock connection did not answer within {0:?}")]
    Timeout(Duration),
}

impl Classify for LeaderError {
    /// What the relay's own connection would say: refused credentials or a missing database
    /// stop walbox; a server down or restarting, or a lock connection that stopped answering,
    /// is retried.
    fn failure(&self) -> Option<Failure> {
        match self {
            LeaderError::Connect(e) => e.failure(),
            LeaderError::Query(e) => e.failure(),
            LeaderError::Timeout(_) => None,
        }
    }
}

/// The process that holds the lock, as the server reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The backend holding the lock.
    pub backend_pid: i32,
    /// Its `application_name` (`walbox leader <host> pid <pid>`).
    pub application_name: String,
    /// Its client address, when it connected over TCP.
    pub client_addr: Option<String>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (backend pid {}",
            self.application_name, self.backend_pid
        )?;
        if let Some(addr) = &self.client_addr {
            write!(f, ", client {addr}")?;
        }
        f.write_str(")")
    }
}

/// The lock, held: the term lasts while the lock connection answers.
pub struct Leadership {
    client: tokio_postgres::Client,
}

impl Leadership {
    /// Waits until the lock connection fails a check (the term is over; the lock is then gone
    /// or about to be, and the caller must stop streaming) or `stop` is raised (returns `None`).
    pub async fn lost(&self, stop: &mut watch::Receiver<bool>) -> Option<LeaderError> {
        let mut tick = tokio::time::interval(CHECK_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.changed() => return None,
                _ = tick.tick() => {}
            }
            if *stop.borrow() {
                return None;
            }
            match tokio::time::timeout(CHECK_TIMEOUT, self.client.simple_query("SELECT 1")).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Some(LeaderError::Query(e)),
                Err(_) => return Some(LeaderError::Timeout(CHECK_TIMEOUT)),
            }
        }
    }
}

/// This process's name on the lock connection: `walbox leader <host> pid <pid>`.
pub fn application_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".into());
    format!("walbox leader {host} pid {}", std::process::id())
}

/// One attempt on the standby's lock connection (opened, and set up, when it is missing or
/// closed). `Ok(Ok(_))`: this process is active; `Ok(Err(holder))`: another process holds the
/// lock (named when the server still shows it).
async fn try_acquire(
    client: &mut Option<tokio_postgres::Client>,
    conn: &ConnInfo,
    slot: &str,
) -> Result<Result<Leadership, Option<Holder>>, LeaderError> {
    // Taken out while in use: on an error it is dropped, and the next attempt reconnects.
    let c = match client.take() {
        Some(c) if !c.is_closed() => c,
        _ => {
            let c = connect_control(conn).await?;
            let name = postgres_protocol::escape::escape_literal(&application_name());
            c.batch_execute(&format!(
                "{SESSION_SETTINGS}; SET application_name = {name}"
            ))
            .await?;
            c
        }
    };
    let got: bool = c
        .query_one(
            "SELECT pg_try_advisory_lock($1, hashtext($2))",
            &[&LOCK_CLASS, &slot],
        )
        .await?
        .get(0);
    if got {
        return Ok(Ok(Leadership { client: c }));
    }
    let holder = c
        .query_opt(
            "SELECT a.pid, coalesce(a.application_name, ''), host(a.client_addr) \
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 \
               AND l.classid = ($1::int4)::oid AND l.objid = (hashtext($2))::oid \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[&LOCK_CLASS, &slot],
        )
        .await?
        .map(|row| Holder {
            backend_pid: row.get(0),
            application_name: row.get(1),
            client_addr: row.get(2),
        });
    *client = Some(c);
    Ok(Err(holder))
}

/// Waits as a standby until this process holds the lock for `slot` (→ `Ok(Some)`), or `stop`
/// is raised (→ `Ok(None)`). Meanwhile `walbox_ha_active` is 0, `/readyz` answers 200 (ready to
/// take over) and `/active` 503; a line says whom it waits for, again when that changes. A
/// connection failure every retry would repeat (wrong password, missing database, TLS refused)
/// is returned as the error to exit with, as the relay's own connection would; others
/// (PostgreSQL down or restarting) are retried.
pub async fn acquire(
    conn: &ConnInfo,
    slot: &str,
    metrics: &Metrics,
    health: &Arc<Health>,
    stop: &mut watch::Receiver<bool>,
) -> Result<Option<Leadership>, FatalError> {
    let mut waiting_for: Option<Option<Holder>> = None;
    let mut warned_error = false;
    let mut client = None;
    loop {
        if *stop.borrow() {
            return Ok(None);
        }
        match try_acquire(&mut client, conn, slot).await {
            Ok(Ok(leadership)) => {
                if waiting_for.is_some() {
                    tracing::info!(slot, "took over: this walbox is now the active one");
                } else {
                    tracing::info!(slot, "this walbox is the active one (leader lock taken)");
                }
                metrics.ha_active.set(1);
                health.set_active(true);
                return Ok(Some(leadership));
            }
            Ok(Err(holder)) => {
                metrics.ha_active.set(0);
                health.set_active(false);
                health.set_ready(true);
                warned_error = false;
                if waiting_for.as_ref() != Some(&holder) {
                    match &holder {
                        Some(h) => tracing::info!(
                            slot,
                            active = %h,
                            "standby: another walbox relays this slot; waiting to take over"
                        ),
                        None => tracing::info!(
                            slot,
                            "standby: another walbox relays this slot; waiting to take over"
                        ),
                    }
                    waiting_for = Some(holder);
                }
            }
            Err(e) if e.failure().is_some() => return Err(FatalError::of(&e)),
            Err(e) => {
                metrics.ha_active.set(0);
                health.set_active(false);
                health.set_ready(false);
                if !warned_error {
                    warned_error = true;
                    tracing::warn!(slot, error = %e, "cannot take or check the leader lock; retrying");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(STANDBY_POLL) => {}
            _ = stop.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_class_spells_walb() {
        assert_eq!(&LOCK_CLASS.to_be_bytes(), b"WALB");
        assert_eq!(LOCK_CLASS, 1_463_897_154);
    }

    #[test]
    fn the_application_name_names_host_and_pid() {
        let name = application_name();
        assert!(name.starts_with("walbox leader "), "{name}");
        assert!(
            name.ends_with(&format!(" pid {}", std::process::id())),
            "{name}"
        );
    }
}
