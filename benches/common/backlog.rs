//! A backlog for a drain: the table emptied, replication slots created at one LSN, then rows
//! loaded by the bench's load procedure in transactions of a given size, with synchronous
//! commit off; the table vacuumed and a checkpoint taken before any relay starts.

use std::time::{Duration, Instant};

use tokio_postgres::Client;
use walbox::lsn::Lsn;

use crate::format::fmt_n;

/// Current WAL insert position.
pub async fn wal_lsn(admin: &Client) -> anyhow::Result<Lsn> {
    let text: String = admin
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await?
        .get(0);
    text.parse().map_err(|e| anyhow::anyhow!("{e:?}"))
}

/// Calls the load procedure `name(rows, per_tx)` with synchronous commit off. One statement
/// per message: a multi-statement query is one implicit transaction, in which the procedure
/// could not COMMIT.
async fn call_load(admin: &Client, name: &str, rows: u64, per_tx: u64) -> anyhow::Result<()> {
    admin.batch_execute("SET synchronous_commit = off").await?;
    admin
        .batch_execute(&format!("CALL {name}({rows}, {per_tx})"))
        .await?;
    admin.batch_execute("RESET synchronous_commit").await?;
    Ok(())
}

/// Empties `table`, creates `slots` (pgoutput) at one LSN, loads `rows` rows through the
/// procedure `load` in transactions of `per_tx`, vacuums and checkpoints; returns the WAL
/// position after the load and the seconds the load took.
pub async fn load(
    admin: &Client,
    table: &str,
    load: &str,
    slots: &[&str],
    rows: u64,
    per_tx: u64,
) -> anyhow::Result<(Lsn, f64)> {
    admin.batch_execute(&format!("TRUNCATE {table}")).await?;
    for s in slots {
        admin
            .execute(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                &[s],
            )
            .await?;
    }
    let t = Instant::now();
    call_load(admin, load, rows, per_tx).await?;
    let end = wal_lsn(admin).await?;
    let load_secs = t.elapsed().as_secs_f64();
    eprintln!(
        "loaded {} rows into {table} in {per_tx}-row transactions in {load_secs:.1} s",
        fmt_n(rows)
    );
    for sql in [
        &format!("VACUUM ANALYZE {table}"),
        "CHECKPOINT",
        "SELECT pg_logical_emit_message(false, 'walbox-bench', 'end')",
    ] {
        admin.batch_execute(sql).await?;
    }
    // Let the stats of the load settle so a drain's dead-tuple delta is its own.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    Ok((end, load_secs))
}
