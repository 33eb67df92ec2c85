//! Managed outbox retention (`[outbox.retention]`): rows older than `keep` are deleted in short
//! batches ([`rows`], leaf partition by leaf partition for a partitioned table); a table
//! partitioned by range on the time column loses whole partitions instead, and gets the next
//! ones created ahead of time ([`partitions`]; old rows in its default partition go in batches).
//!
//! # Invariants
//! - **No row is deleted before its transaction is confirmed.** Every deletion runs in one
//!   transaction that first fixes what it can see and reads `pg_current_wal_insert_lsn()` (L):
//!   a `REPEATABLE READ` snapshot taken by that statement for row batches, an `ACCESS EXCLUSIVE`
//!   lock on the partition (all its writers have finished) for partitions. Every transaction
//!   whose rows it can delete committed before L. It then waits until the slot's
//!   `confirmed_flush_lsn` reaches L ([`confirm`]): walbox confirms only what the brokers
//!   acknowledged, so every such row is in Kafka before it is deleted. If the relay does not get
//!   there within the bound, nothing is deleted in this pass.
//! - L is reachable on an idle database: when the slot is behind, an empty transaction is
//!   committed on a second connection, so the WAL before L (the lock's own record included) is
//!   flushed and decoded, and the relay confirms past it ([`confirm`]).
//! - Deletions are not events: the publication publishes inserts only, and dropping a partition
//!   is DDL, which pgoutput does not send.
//! - Retention runs only in the active process (a term of `crate::app`), on two control
//!   connections of its own (the deletions', and the one [`confirm::nudge`] commits on), and
//!   stops with the term. A failed pass is logged and counted
//!   (`walbox_outbox_retention_errors_total`) and retried at the next interval; it never stops
//!   the relay. Every table's counters exist from the first pass on, at 0. A default partition is never dropped.
//! - A batch deletes by `ctid` within one relation (`DELETE FROM ONLY leaf`): a `ctid` is not
//!   unique across the partitions of a table, so a batch through the parent could hit young rows.
//! - Statements are bounded (`statement_timeout`, `lock_timeout`), and a batch is one short
//!   transaction, so retention never holds locks or the xmin horizon for long.

mod confirm;
mod error;
mod partitions;
pub mod rights;
mod rows;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio_postgres::Client;

use crate::config::retention::RetentionConfig;
use crate::config::{PostgresConfig, Route, RouteSource};
use crate::failure::Classify;
use crate::metrics::Metrics;
use crate::pg::control::connect_control;
pub use error::RetentionError;

/// How long one deletion waits at most for the slot to confirm the position it needs (and at
/// least, when `interval` is shorter: the relay confirms within a status interval or two).
const CONFIRM_BOUND: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(10));

/// The wait of one deletion for the slot: `interval`, within [`CONFIRM_BOUND`].
fn confirm_bound(cfg: &RetentionConfig) -> Duration {
    cfg.interval.clamp(CONFIRM_BOUND.0, CONFIRM_BOUND.1)
}
/// Bound of every retention statement.
const STATEMENT_TIMEOUT: &str = "60s";
/// Bound of waiting for a lock.
const LOCK_TIMEOUT: &str = "5s";

/// One outbox table's retention.
struct Target {
    /// The schema.
    schema: String,
    /// The table.
    table: String,
    /// `"schema"."table"`, quoted.
    qualified: String,
    /// `schema.table`, for logs and metric labels.
    label: String,
    /// The time column.
    column: String,
}

impl Target {
    /// `route`'s table and time column; `None` for the table-less route.
    fn of(route: &Route, cfg: &RetentionConfig) -> Option<Target> {
        let RouteSource::Table { schema, table } = &route.source else {
            return None;
        };
        let column = cfg.column.clone().or(route.columns.timestamp.clone())?;
        Some(Target {
            schema: schema.clone(),
            table: table.clone(),
            qualified: format!("{}.{}", quote(schema), quote(table)),
            label: format!("{schema}.{table}"),
            column,
        })
    }
}

/// Runs retention passes every `cfg.interval` until `stop` is raised; see the [module docs](self).
pub async fn run(
    pg: PostgresConfig,
    tables: Vec<Route>,
    cfg: RetentionConfig,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let targets: Vec<Target> = tables
        .iter()
        .filter_map(|route| Target::of(route, &cfg))
        .collect();
    // Every counter of every table exists from the start, at 0: an alert comparing them
    // (`WalboxOutboxRetentionFailing`) has a series to compare before anything was removed.
    for target in &targets {
        for counter in [
            &metrics.retention_rows_deleted,
            &metrics.retention_partitions_dropped,
            &metrics.retention_partitions_created,
            &metrics.retention_errors,
        ] {
            counter.with_label_values(&[&target.label]).inc_by(0);
        }
    }
    // The deletions' connection, and a second one for `confirm::nudge`.
    let mut client: Option<(Client, Client)> = None;
    loop {
        if *stop.borrow() {
            return;
        }
        for target in &targets {
            if client
                .as_ref()
                .is_none_or(|(c, other)| c.is_closed() || other.is_closed())
            {
                let both = async {
                    Ok::<_, crate::pg::control::ConnectError>((
                        connect_control(&pg.conn).await?,
                        connect_control(&pg.conn).await?,
                    ))
                };
                match both.await {
                    Ok(c) => client = Some(c),
                    Err(e) => {
                        metrics
                            .retention_errors
                            .with_label_values(&[&target.label])
                            .inc();
                        tracing::warn!(error = %e, "outbox retention cannot connect; retrying at the next interval");
                        break;
                    }
                }
            }
            let Some((c, other)) = client.as_mut() else {
                break;
            };
            let pass = tokio::select! {
                r = pass(c, other, &pg.slot, target, &cfg, &metrics) => r,
                _ = stop.wait_for(|s| *s) => return,
            };
            match pass {
                Ok(()) => {
                    let now = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0.0, |d| d.as_secs_f64());
                    metrics
                        .retention_last_success
                        .with_label_values(&[&target.label])
                        .set(now);
                }
                Err(RetentionError::Behind { needed, confirmed }) => {
                    tracing::info!(table = %target.label, %needed, %confirmed, "outbox retention waits for the relay: the slot has not confirmed every row it could delete; the rest waits for the next pass");
                }
                Err(e) => {
                    metrics
                        .retention_errors
                        .with_label_values(&[&target.label])
                        .inc();
                    // ERROR only when the operator must act; what passes by itself, WARN.
                    if e.failure().is_some() {
                        tracing::error!(table = %target.label, error = %e, "outbox retention failed; retrying at the next interval");
                    } else {
                        tracing::warn!(table = %target.label, error = %e, "outbox retention failed; retrying at the next interval");
                    }
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(cfg.interval) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// One pass over one table: partitions when it is partitioned by range on the time column (and
/// row batches in its default partition), else row batches in each of its leaves.
async fn pass(
    client: &mut Client,
    other: &Client,
    slot: &str,
    target: &Target,
    cfg: &RetentionConfig,
    metrics: &Metrics,
) -> Result<(), RetentionError> {
    let relations = match partitions::layout(client, target).await? {
        Some(layout) => {
            match partitions::pass(client, other, slot, target, &layout, cfg, metrics).await? {
                Some(default) => rows::leaves(client, &default).await?,
                None => Vec::new(),
            }
        }
        None => rows::leaves(client, &target.qualified).await?,
    };
    rows::pass(client, other, slot, target, &relations, cfg, metrics).await
}

fn quote(ident: &str) -> String {
    postgres_protocol::escape::escape_identifier(ident)
}

/// `now() - keep`, as SQL.
fn cutoff(cfg: &RetentionConfig) -> String {
    format!("now() - interval '{} seconds'", cfg.keep.as_secs())
}
