//! A table partitioned by range on the time column: partitions are created `premake` intervals
//! ahead (named `<table>_pYYYYMMDD`, or `<table>_pYYYYMMDD_HH24` for intervals shorter than a
//! day, bounds in UTC), and a partition whose upper bound is at or before `now() - keep` is
//! dropped, behind the confirmation gate ([`super::confirm`]): the partition is locked first
//! (its writers have all finished), then the WAL position read, then confirmed, then dropped.
//! A default partition, or one bounded by `MAXVALUE`, is never dropped; old rows in the default
//! partition are deleted in batches ([`super::rows`]). A partition that would overlap an
//! existing one is not created (the existing one covers the range). A failed creation does not
//! keep expired partitions from being dropped.

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::{confirm, cutoff, quote, RetentionError, Target};
use super::{confirm_bound, LOCK_TIMEOUT, STATEMENT_TIMEOUT};
use crate::config::retention::RetentionConfig;
use crate::metrics::Metrics;

/// How the table is partitioned, when by range on the time column.
pub struct Layout {
    /// The time column's SQL type (`timestamp with time zone`, …).
    column_type: String,
}

/// `Some` when `target` is partitioned by range on its time column; `None` for a plain table
/// (or one partitioned otherwise, which row batches handle).
pub async fn layout(
    client: &Client,
    target: &Target,
) -> Result<Option<Layout>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT p.partstrat::text, p.partnatts::int, a.attname::text, format_type(a.atttypid, a.atttypmod) \
             FROM pg_partitioned_table p \
             JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0] \
             WHERE p.partrelid = $1::text::regclass",
            &[&target.qualified],
        )
        .await?;
    Ok(row.and_then(|r| {
        let (strategy, keys, column): (String, i32, String) = (r.get(0), r.get(1), r.get(2));
        (strategy == "r" && keys == 1 && column == target.column).then(|| Layout {
            column_type: r.get(3),
        })
    }))
}

/// Creates the partitions ahead, then drops the expired ones (also when creating failed: a
/// failed creation is reported after the drops). Returns the default partition, if any: rows
/// in it have no partition to expire with, and are deleted in batches instead.
pub async fn pass(
    client: &mut Client,
    other: &Client,
    slot: &str,
    target: &Target,
    layout: &Layout,
    cfg: &RetentionConfig,
    metrics: &Metrics,
) -> Result<Option<String>, RetentionError> {
    let created = premake(client, target, cfg, metrics).await;
    let children = children(client, target, layout, cfg).await?;
    for partition in &children.expired {
        let tx = client.transaction().await?;
        tx.batch_execute(&format!(
            "SET LOCAL statement_timeout = '{STATEMENT_TIMEOUT}'; SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'; \
             LOCK TABLE {partition} IN ACCESS EXCLUSIVE MODE"
        ))
        .await?;
        // Every transaction that wrote to the partition has ended: each committed before this.
        // The lock's own record lies before it too, unflushed: `wait` makes it reachable.
        let needed = confirm::insert_position(&tx).await?;
        confirm::wait(&tx, other, slot, needed, confirm_bound(cfg)).await?;
        tx.batch_execute(&format!("DROP TABLE {partition}")).await?;
        tx.commit().await?;
        metrics
            .retention_partitions_dropped
            .with_label_values(&[&target.label])
            .inc();
        tracing::info!(table = %target.label, %partition, "outbox retention dropped a partition older than keep");
    }
    created?;
    Ok(children.default)
}

/// A partitioned table's children, as retention sees them.
struct Children {
    /// Partitions (as `regclass` text) whose upper bound is at or before `now() - keep`.
    expired: Vec<String>,
    /// The default partition.
    default: Option<String>,
}

/// Reads `target`'s partitions: the expired ones and the default one.
async fn children(
    client: &Client,
    target: &Target,
    layout: &Layout,
    cfg: &RetentionConfig,
) -> Result<Children, RetentionError> {
    let rows = client
        .query(
            "SELECT c.oid::regclass::text, pg_get_expr(c.relpartbound, c.oid) \
             FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = $1::text::regclass ORDER BY 1",
            &[&target.qualified],
        )
        .await?;
    let mut out = Children {
        expired: Vec::new(),
        default: None,
    };
    for row in rows {
        let (name, bound): (String, Option<String>) = (row.get(0), row.get(1));
        if bound.as_deref() == Some("DEFAULT") {
            out.default = Some(name);
            continue;
        }
        let Some(upper) = bound.as_deref().and_then(upper_bound) else {
            continue;
        };
        let expired: bool = client
            .query_one(
                &format!(
                    "SELECT $1::text::{ty} <= ({cutoff})::{ty}",
                    ty = layout.column_type,
                    cutoff = cutoff(cfg)
                ),
                &[&upper],
            )
            .await?
            .get(0);
        if expired {
            out.expired.push(name);
        }
    }
    Ok(out)
}

/// The `TO ('…')` value of a range partition's bound; `None` for `DEFAULT` or `MAXVALUE`.
fn upper_bound(bound: &str) -> Option<String> {
    let (_, after) = bound.split_once(" TO ('")?;
    let (value, _) = after.split_once("')")?;
    Some(value.to_owned())
}

/// Creates the current partition and `premake` more, where missing; one that cannot be created
/// (the default partition holds rows of its range) does not keep the others from being created.
async fn premake(
    client: &Client,
    target: &Target,
    cfg: &RetentionConfig,
    metrics: &Metrics,
) -> Result<(), RetentionError> {
    let width = cfg.partition_interval.as_secs();
    let format = if width.is_multiple_of(86_400) {
        "YYYYMMDD"
    } else {
        "YYYYMMDD\"_\"HH24"
    };
    let mut failed = None;
    for k in 0..=u64::from(cfg.premake) {
        let row = client
            .query_one(
                &format!(
                    "SELECT to_char(b AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'), \
                            to_char((b + interval '{width} seconds') AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'), \
                            to_char(b AT TIME ZONE 'UTC', '{format}') \
                     FROM (SELECT to_timestamp(floor(extract(epoch FROM now()) / {width}) * {width} + {k} * {width}) AS b) s"
                ),
                &[],
            )
            .await?;
        let (from, to, suffix): (String, String, String) = (row.get(0), row.get(1), row.get(2));
        let suffix = format!("_p{suffix}");
        let mut base = target.table.clone();
        while base.len() + suffix.len() > 63 {
            base.pop();
        }
        let name = format!(
            "{}.{}",
            quote(&target.schema),
            quote(&format!("{base}{suffix}"))
        );
        let exists: bool = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
            .await?
            .get(0);
        if exists {
            continue;
        }
        let create = format!(
            "CREATE TABLE {name} PARTITION OF {parent} FOR VALUES FROM ('{from}+00') TO ('{to}+00')",
            parent = target.qualified
        );
        match client.batch_execute(&create).await {
            Ok(()) => {
                metrics
                    .retention_partitions_created
                    .with_label_values(&[&target.label])
                    .inc();
                tracing::info!(table = %target.label, partition = %name, %from, %to, "outbox retention created a partition ahead");
            }
            // An existing partition (of another name) covers the range already.
            Err(e) if e.code() == Some(&SqlState::INVALID_OBJECT_DEFINITION) => {
                tracing::debug!(table = %target.label, partition = %name, error = %e, "range covered by an existing partition");
            }
            // Tried for the later ranges too; the first failure is reported.
            Err(e) => {
                tracing::debug!(table = %target.label, partition = %name, error = %e, "cannot create a partition ahead");
                failed.get_or_insert(e);
            }
        }
    }
    failed.map_or(Ok(()), |e| Err(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_upper_bound_of_a_range_partition() {
        assert_eq!(
            upper_bound("FOR VALUES FROM ('2026-12-01 00:00:00+00') TO ('2026-12-02 00:00:00+00')")
                .as_deref(),
            Some("2026-12-02 00:00:00+00")
        );
        assert_eq!(upper_bound("DEFAULT"), None);
        assert_eq!(
            upper_bound("FOR VALUES FROM ('2026-12-01') TO (MAXVALUE)"),
            None
        );
    }
}
