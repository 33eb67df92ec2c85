//! Row batches: `DELETE … LIMIT batch_size` by `ctid`, one short `REPEATABLE READ` transaction
//! per batch, each behind the confirmation gate ([`super::confirm`]).
//!
//! A `ctid` names a row only within one relation: a partitioned table is cleaned leaf
//! partition by leaf partition (`DELETE FROM ONLY leaf`), never through the parent, where the
//! `ctid` of an old row in one partition would also match a young row in another.

use tokio_postgres::{Client, IsolationLevel};

use super::{confirm, cutoff, quote, RetentionError, Target};
use super::{confirm_bound, LOCK_TIMEOUT, STATEMENT_TIMEOUT};
use crate::config::retention::RetentionConfig;
use crate::metrics::Metrics;

/// The relations (`"schema"."name"`, quoted where needed) that hold `relation`'s rows: its leaf partitions when it
/// is partitioned, else the table itself.
pub async fn leaves(client: &Client, relation: &str) -> Result<Vec<String>, tokio_postgres::Error> {
    // A table that is neither partitioned nor a partition has no partition tree: itself.
    let rows = client
        .query(
            "SELECT format('%I.%I', n.nspname, c.relname) \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.oid IN (SELECT relid FROM pg_partition_tree($1::text::regclass) WHERE isleaf) \
                OR (c.oid = $1::text::regclass \
                    AND NOT EXISTS (SELECT FROM pg_partition_tree($1::text::regclass))) \
             ORDER BY 1",
            &[&relation],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Deletes the rows older than `keep` in each of `relations` (leaves of `target`), batch by
/// batch, until a batch is not full.
pub async fn pass(
    client: &mut Client,
    other: &Client,
    slot: &str,
    target: &Target,
    relations: &[String],
    cfg: &RetentionConfig,
    metrics: &Metrics,
) -> Result<(), RetentionError> {
    let column = quote(&target.column);
    let mut total = 0u64;
    for relation in relations {
        let delete = format!(
            "DELETE FROM ONLY {relation} WHERE ctid = ANY(ARRAY(\
             SELECT ctid FROM ONLY {relation} WHERE {column} < {cutoff} LIMIT {n}))",
            cutoff = cutoff(cfg),
            n = cfg.batch_size,
        );
        loop {
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .start()
                .await?;
            tx.batch_execute(&format!(
                "SET LOCAL statement_timeout = '{STATEMENT_TIMEOUT}'; SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"
            ))
            .await?;
            // The first statement takes the snapshot: every row the DELETE can see committed
            // before this position.
            let needed = confirm::insert_position(&tx).await?;
            confirm::wait(&tx, other, slot, needed, confirm_bound(cfg)).await?;
            let deleted = tx.execute(delete.as_str(), &[]).await?;
            tx.commit().await?;
            total += deleted;
            metrics
                .retention_rows_deleted
                .with_label_values(&[&target.label])
                .inc_by(deleted);
            if deleted < u64::from(cfg.batch_size) {
                break;
            }
        }
    }
    if total > 0 {
        tracing::info!(table = %target.label, rows = total, "outbox retention deleted rows older than keep");
    }
    Ok(())
}
