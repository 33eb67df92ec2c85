//! Row batches: `DELETE … LIMIT batch_size` by `ctid`, one short `REPEATABLE READ` transaction
//! per batch, each behind the confirmation gate ([`super::confirm`]).

use tokio_postgres::{Client, IsolationLevel};

use super::{confirm, cutoff, quote, RetentionError, Target};
use super::{confirm_bound, LOCK_TIMEOUT, STATEMENT_TIMEOUT};
use crate::config::retention::RetentionConfig;
use crate::metrics::Metrics;

/// Deletes `target`'s rows older than `keep`, batch by batch, until a batch is not full.
pub async fn pass(
    client: &mut Client,
    slot: &str,
    target: &Target,
    cfg: &RetentionConfig,
    metrics: &Metrics,
) -> Result<(), RetentionError> {
    let column = quote(&target.column);
    let delete = format!(
        "DELETE FROM {t} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {t} WHERE {column} < {cutoff} LIMIT {n}))",
        t = target.qualified,
        cutoff = cutoff(cfg),
        n = cfg.batch_size,
    );
    let mut total = 0u64;
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
        confirm::wait(&tx, slot, needed, confirm_bound(cfg)).await?;
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
    if total > 0 {
        tracing::info!(table = %target.label, rows = total, "outbox retention deleted rows older than keep");
    }
    Ok(())
}
