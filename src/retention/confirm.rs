//! Waiting until the slot has confirmed a position: the gate in front of every deletion.

use std::time::{Duration, Instant};

use tokio_postgres::GenericClient;

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

/// Waits, up to `bound`, until `slot`'s `confirmed_flush_lsn` is at or past `needed`.
/// `pg_replication_slots` reads shared memory, so inside a `REPEATABLE READ` transaction it
/// still shows the live position.
pub async fn wait(
    c: &impl GenericClient,
    slot: &str,
    needed: Lsn,
    bound: Duration,
) -> Result<(), RetentionError> {
    let deadline = Instant::now() + bound;
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
        if Instant::now() >= deadline {
            return Err(RetentionError::Behind { needed, confirmed });
        }
        tokio::time::sleep(POLL).await;
    }
}
