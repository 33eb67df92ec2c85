//! Waiting until the slot has confirmed a position: the gate in front of every deletion.
//!
//! # Invariants
//! - The position waited for is one the relay can reach on an idle database. The walsender
//!   decodes only flushed WAL, and records that are not commits (the `ACCESS EXCLUSIVE` lock's
//!   own record, written when a partition is locked) are not flushed until something commits.
//!   So when the slot is behind, [`wait`] commits an empty transaction with an xid on a
//!   second connection ([`nudge`]): its commit record lies past the position and flushes every
//!   record before it, the walsender decodes past the position, and the relay confirms it
//!   (from a keepalive when nothing is in flight). The nudge changes nothing the gate proves:
//!   the position is still read after the lock or snapshot, and still has to be confirmed.

use std::time::{Duration, Instant};

use tokio_postgres::{Client, GenericClient};

use super::RetentionError;
use crate::lsn::Lsn;

/// How often the slot is read while waiting.
const POLL: Duration = Duration::from_millis(100);

/// The current WAL insert position: every transaction visible to the caller's snapshot (or that
/// wrote to a table the caller has locked) committed before it.
pub async fn insert_position(c: &impl GenericClient) -> Result<Lsn, RetentionError> {
    let text: String = c
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await?
        .get(0);
    text.parse()
        .map_err(|_| RetentionError::Layout(format!("unexpected WAL position {text:?}")))
}

/// Commits, on `c`, a transaction that has an xid and changes nothing: its commit record
/// flushes the WAL before it (locally: `synchronous_commit = local` waits for no standby).
/// PostgreSQL 15+ sends nothing for it; 13 and 14 send an empty transaction.
pub async fn nudge(c: &Client) -> Result<(), RetentionError> {
    c.batch_execute(
        "BEGIN; SET LOCAL synchronous_commit = local; SELECT pg_current_xact_id(); COMMIT",
    )
    .await?;
    Ok(())
}

/// Waits, up to `bound`, until `slot`'s `confirmed_flush_lsn` is at or past `needed`; when the
/// slot is behind at the first reading, [`nudge`]s on `other` (a connection that holds no lock
/// and no snapshot of the caller). `pg_replication_slots` reads shared memory, so inside a
/// `REPEATABLE READ` transaction it still shows the live position.
pub async fn wait(
    c: &impl GenericClient,
    other: &Client,
    slot: &str,
    needed: Lsn,
    bound: Duration,
) -> Result<(), RetentionError> {
    let deadline = Instant::now() + bound;
    let mut nudged = false;
    loop {
        let row = c
            .query_opt(
                "SELECT coalesce(confirmed_flush_lsn, '0/0')::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await?;
        let Some(row) = row else {
            return Err(RetentionError::NoSlot(slot.to_owned()));
        };
        let text: String = row.get(0);
        let confirmed: Lsn = text.parse().unwrap_or(Lsn::ZERO);
        if confirmed >= needed {
            return Ok(());
        }
        if !std::mem::replace(&mut nudged, true) {
            nudge(other).await?;
        }
        if Instant::now() >= deadline {
            return Err(RetentionError::Behind { needed, confirmed });
        }
        tokio::time::sleep(POLL).await;
    }
}
