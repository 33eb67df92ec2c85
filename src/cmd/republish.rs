//! `walbox republish`: produce rows still in the outbox table(s) again, for a window the slot
//! cannot replay (a lost or dropped slot, a dropped publication).
//!
//! Rows are read with SQL (`SELECT col::text, …`, the text form pgoutput sends) and mapped by the
//! same [`OutboxMapper`] as the relay, through a `Relation` built from the catalog, so a
//! republished record has the topic, key, value and headers the relay gives the same row; only
//! its `walbox.commit_lsn` header is `0/0`, because a row in a table carries no LSN. Consumers
//! deduplicate by the `id` header, so republishing a window wider than the gap is harmless; a
//! narrower one loses events. The window is given as `--since-id N` (rows whose id column is
//! ≥ N) and/or `--since TIME` (rows whose `--time-column`, by default
//! `outbox.columns.timestamp`, is ≥ TIME); rows go out in that column's order, then by id.
//!
//! The window's arguments are checked against each table before any row is read or any broker
//! is contacted: `--since` and `--since-id` as PostgreSQL reads them (the id in its column's
//! type), `--time-column` as a column comparable with a time. A refused argument stops the
//! command with exit status 3, naming it and quoting the server's reason; a statement the server
//! refuses otherwise is reported with the server's message, never a bare "db error".
//!
//! # Invariants
//! - The exit status is 0 only when the broker acknowledged every selected row (or its dead
//!   letter, under `on_invalid = "dead_letter"`). Waiting is bounded: no acknowledgement for
//!   `--ack-timeout` (default [`ACK_TIMEOUT`]) stops it with exit status 9; a client error the
//!   publisher cannot recover from stops it at once with that error's status (a Kafka TLS
//!   handshake that failed on a certificate: 4, naming `ssl.ca.location`). A row that cannot be mapped under
//!   `on_invalid = "fail"` stops the command with exit status 8, naming the row.
//! - Memory is bounded: rows are streamed from the server and at most `relay.max_in_flight`
//!   records are unacknowledged at a time.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio_postgres::types::ToSql;
use tokio_postgres::GenericClient;

use crate::config::{Config, Route, RouteSource};
use crate::failure::{Class, Classify, Failure, FatalError};
use crate::lsn::Lsn;
use crate::outbox::{dead_letter, EventPosition, OutboxError, OutboxMapper, Rejected};
use crate::pg::control::{connect_control, error_chain};
use crate::sink::topics::Topics;
use crate::sink::{Ack, AckQueue, DeliveryError, Publisher, Sink, SinkError};
use crate::source::pgoutput::{Column, Insert, Relation, TupleData, TupleValue};
use crate::timestamp::pg_now_micros;
use postgres_protocol::escape::escape_identifier as quote_ident;

/// Which rows to republish.
#[derive(Debug, Clone, Default)]
pub struct Window {
    /// Rows whose id column is at least this (compared in the column's type).
    pub since_id: Option<String>,
    /// Rows whose time column is at least this `timestamptz`.
    pub since: Option<String>,
    /// The time column; default `outbox.columns.timestamp`.
    pub time_column: Option<String>,
}

/// How long `walbox republish` waits for the brokers to acknowledge a record before it gives
/// up with exit status 9, unless `--ack-timeout` says otherwise.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(40);

fn lit(s: &str) -> String {
    postgres_protocol::escape::escape_literal(s)
}

/// A statement the server refused (or a lost connection), about `what`: the server's message,
/// classified by its SQLSTATE; a cause that may pass (server restarting, network) is
/// [`Failure::Unavailable`].
pub(crate) fn refused(what: &str, e: &tokio_postgres::Error) -> FatalError {
    let failure = e.failure().unwrap_or(Failure::Unavailable);
    FatalError::new(failure, format!("{what}: {}", error_chain(e)))
}

/// The error of a window argument the server refused to read: exit status 3 naming `arg`, with
/// the server's reason, when the server found the value itself at fault (SQLSTATE classes 22,
/// data exception, and 42804/42883, no such comparison); else as [`refused`].
fn bad_argument(arg: &str, hint: &str, e: &tokio_postgres::Error) -> FatalError {
    match e.as_db_error() {
        Some(db)
            if db.code().code().starts_with("22")
                || matches!(db.code().code(), "42804" | "42883") =>
        {
            FatalError::new(Failure::Config, format!("{arg}: {}{hint}", db.message()))
        }
        _ => refused(&format!("checking {arg}"), e),
    }
}

/// `walbox republish`: see the module docs. Returns how many records were acknowledged. When
/// no acknowledgement arrives for `ack_timeout` (the brokers are unreachable or refuse to
/// answer), it stops with exit status 9: the rows it produced may arrive later, and running it
/// again only adds duplicates.
pub async fn republish(
    config: &Config,
    window: &Window,
    ack_timeout: Duration,
) -> Result<u64, FatalError> {
    if window.since_id.is_none() && window.since.is_none() {
        return Err(FatalError::new(
            Failure::Config,
            "republish needs a window: --since-id N and/or --since TIME",
        ));
    }
    let client = connect_control(&config.postgres.conn)
        .await
        .map_err(|e| FatalError::of(&e))?;
    // Every table's query, its arguments checked, before a broker is contacted.
    let mut plans = Vec::new();
    for (route_index, route) in config.outbox.tables.iter().enumerate() {
        let RouteSource::Table { schema, table } = &route.source else {
            continue;
        };
        let (relation, types) = describe(&client, schema, table).await?;
        check_window(&client, route, &relation, &types, window).await?;
        let sql = select(route, &relation, &types, window)?;
        plans.push((route_index, route, relation, sql));
    }
    let acks = Arc::new(AckQueue::default());
    let sink = crate::sink::connect(config, acks.clone())
        .await
        .map_err(|e| FatalError::of_or(&e, Failure::Kafka))?;
    let mut topics = Topics::new(&config.kafka)
        .map_err(|e| FatalError::new(Failure::Kafka, format!("kafka admin client: {e}")))?;
    let mut mapper = OutboxMapper::new(&config.outbox);
    mapper.set_not_null(
        crate::source::catalog::not_null_columns(&client, &config.outbox)
            .await
            .map_err(|e| FatalError::of(&e))?,
    );
    let mut total = 0;
    for (route_index, route, relation, sql) in plans {
        mapper.relation(&relation);
        let mut batch = Batch {
            sink: &sink,
            address_key: config.broker.address_key(),
            acks: &acks,
            max_in_flight: config.relay.max_in_flight,
            ack_timeout,
            outstanding: 0,
            acked: 0,
            reports: Vec::new(),
        };
        let rows = client
            .query_raw(&sql, std::iter::empty::<&(dyn ToSql + Sync)>())
            .await
            .map_err(|e| refused(&format!("reading {}", route.name), &e))?;
        let mut rows = std::pin::pin!(rows);
        let mut index = 0u32;
        while let Some(row) = rows.next().await {
            let row = row.map_err(|e| refused(&format!("reading {}", route.name), &e))?;
            let insert = insert_of(&row, relation.id);
            let position = EventPosition {
                commit_lsn: Lsn::ZERO,
                index,
                commit_time: pg_now_micros(),
            };
            index = index.wrapping_add(1);
            let mut event = match mapper.map_insert(&insert, position) {
                Ok(Some(event)) => event,
                Ok(None) => continue,
                Err(OutboxError::InvalidEvent(inv)) => {
                    match dead_letter(&route.on_invalid, inv.rejected(), &inv.reason) {
                        Some(letter) => letter,
                        None => return Err(FatalError::new(Failure::EventRejected, inv)),
                    }
                }
                Err(e) => return Err(FatalError::new(Failure::Internal, e)),
            };
            let checked = match &sink {
                Sink::Kafka(kafka) => topics.ensure(kafka, &event.topic).await,
                // Destinations of the other brokers need no creation: a refusal is the
                // record's, on delivery.
                _ => Ok(()),
            };
            if let Err(e) = checked {
                let id = String::from_utf8_lossy(&event.id).into_owned();
                let letter = dead_letter(
                    &route.on_invalid,
                    Rejected::event(&event, &id),
                    &e.to_string(),
                );
                match letter {
                    Some(letter) => event = letter,
                    None => return Err(FatalError::new(Failure::EventRejected, e)),
                }
            }
            batch.send(&event, route_index).await?;
        }
        batch.drain().await?;
        tracing::info!(table = %route.name, records = batch.acked, "republished");
        println!("republished {} records from {}", batch.acked, route.name);
        total += batch.acked;
    }
    if config.outbox.messages.is_some() {
        println!(
            "the table-less outbox ([outbox.messages]) keeps no rows and cannot be republished"
        );
    }
    let flushed = tokio::task::spawn_blocking(move || sink.flush(Duration::from_secs(5)))
        .await
        .unwrap_or(false);
    if !flushed {
        tracing::debug!("producer flush timed out after every record was acknowledged");
    }
    Ok(total)
}

/// A row read by [`select`] (every column as text) as the `Insert` pgoutput would send.
pub(crate) fn insert_of(row: &tokio_postgres::Row, relation_id: u32) -> Insert {
    let columns = (0..row.len())
        .map(|i| match row.get::<_, Option<&str>>(i) {
            Some(v) => TupleValue::Text(Bytes::copy_from_slice(v.as_bytes())),
            None => TupleValue::Null,
        })
        .collect();
    Insert {
        relation_id,
        tuple: TupleData { columns },
    }
}

/// The table as pgoutput would announce it: every column, in order, with its type (and the
/// types' SQL names).
pub(crate) async fn describe(
    client: &impl GenericClient,
    schema: &str,
    table: &str,
) -> Result<(Relation, Vec<String>), FatalError> {
    let name = format!("{}.{}", quote_ident(schema), quote_ident(table));
    let rows = client
        .query(
            "SELECT c.oid, a.attname, a.atttypid, a.atttypmod, format_type(a.atttypid, a.atttypmod) \
             FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid \
             WHERE c.oid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped \
             ORDER BY a.attnum",
            &[&name],
        )
        .await
        .map_err(|e| refused(&format!("outbox table {schema}.{table}"), &e))?;
    let id: u32 = rows.first().map(|r| r.get(0)).ok_or_else(|| {
        FatalError::new(
            Failure::Schema,
            format!("outbox table {schema}.{table} has no columns"),
        )
    })?;
    let types = rows.iter().map(|r| r.get(4)).collect();
    let relation = Relation {
        id,
        namespace: schema.to_owned(),
        name: table.to_owned(),
        replica_identity: b'd',
        columns: rows
            .iter()
            .map(|r| Column {
                flags: 0,
                name: r.get(1),
                type_oid: r.get(2),
                type_modifier: r.get(3),
            })
            .collect(),
    };
    Ok((relation, types))
}

/// The column `--since` compares with: `--time-column`, else `outbox.columns.timestamp`.
fn time_column<'a>(route: &'a Route, window: &'a Window) -> Result<&'a str, FatalError> {
    window
        .time_column
        .as_deref()
        .or(route.columns.timestamp.as_deref())
        .ok_or_else(|| {
            FatalError::new(
                Failure::Config,
                "--since needs the column holding each row's insert time: pass --time-column <column> (or set outbox.columns.timestamp)",
            )
        })
}

/// Checks `window`'s arguments against `route`'s table (described by `relation` and `types`)
/// as the server reads them, before any row is read: `--since` is a time, `--time-column` is
/// comparable with one, `--since-id` is a value of the id column's type. See the module docs.
pub(crate) async fn check_window(
    client: &impl GenericClient,
    route: &Route,
    relation: &Relation,
    types: &[String],
    window: &Window,
) -> Result<(), FatalError> {
    let RouteSource::Table { schema, table } = &route.source else {
        return Ok(());
    };
    let position = |c: &str| relation.columns.iter().position(|col| col.name == c);
    if let Some(since) = &window.since {
        client
            .query_one("SELECT $1::text::timestamptz", &[since])
            .await
            .map_err(|e| bad_argument("--since", " (e.g. 2026-12-01T09:50:00Z)", &e))?;
        let column = time_column(route, window)?;
        if let Some(i) = position(column) {
            let probe = format!(
                "SELECT 1 FROM {}.{} WHERE {} >= $1::text::timestamptz LIMIT 0",
                quote_ident(schema),
                quote_ident(table),
                quote_ident(column)
            );
            client.query(&probe, &[since]).await.map_err(|e| {
                let hint = format!(
                    " (column {column:?} of {} is {}, not a time: name a timestamptz, timestamp \
                     or date column)",
                    route.name, types[i]
                );
                bad_argument("--time-column", &hint, &e)
            })?;
        } else if window.time_column.is_some() {
            // A name the operator typed: an argument to fix, like a time it cannot read.
            return Err(FatalError::new(
                Failure::Config,
                format!(
                    "--time-column: outbox table {} has no column {column:?} (name its timestamptz, timestamp or date column)",
                    route.name
                ),
            ));
        }
    }
    if let (Some(since_id), Some(i)) = (&window.since_id, position(&route.columns.id)) {
        let probe = format!("SELECT CAST($1::text AS {})::text", types[i]);
        client.query_one(&probe, &[since_id]).await.map_err(|e| {
            let hint = format!(
                " (the id column {:?} of {} is {})",
                route.columns.id, route.name, types[i]
            );
            bad_argument("--since-id", &hint, &e)
        })?;
    }
    Ok(())
}

/// The query for `route`'s rows in `window`.
pub(crate) fn select(
    route: &Route,
    relation: &Relation,
    types: &[String],
    window: &Window,
) -> Result<String, FatalError> {
    let RouteSource::Table { schema, table } = &route.source else {
        unreachable!("only table routes are republished");
    };
    let position = |c: &str| relation.columns.iter().position(|col| col.name == c);
    let has = |c: &str| position(c).is_some();
    let id = &route.columns.id;
    let mut filters = Vec::new();
    let mut order = Vec::new();
    if let Some(since) = &window.since {
        let column = time_column(route, window)?;
        if !has(column) {
            return Err(FatalError::new(
                Failure::Schema,
                format!(
                    "outbox table {} has no column {column:?} (--time-column)",
                    route.name
                ),
            ));
        }
        filters.push(format!(
            "{} >= {}::timestamptz",
            quote_ident(column),
            lit(since)
        ));
        order.push(quote_ident(column));
    }
    if let Some(since_id) = &window.since_id {
        let Some(i) = position(id) else {
            return Err(FatalError::new(
                Failure::Schema,
                format!("outbox table {} has no id column {id:?}", route.name),
            ));
        };
        // Compared in the id column's own type, so that 9 < 10 for numbers.
        filters.push(format!(
            "{} >= CAST({} AS {})",
            quote_ident(id),
            lit(since_id),
            types[i]
        ));
    }
    order.push(quote_ident(id));
    if filters.is_empty() {
        // `walbox audit` without a window: every row.
        filters.push("true".to_owned());
    }
    let columns: Vec<String> = relation
        .columns
        .iter()
        .map(|c| format!("{}::text", quote_ident(&c.name)))
        .collect();
    Ok(format!(
        "SELECT {} FROM {}.{} WHERE {} ORDER BY {}",
        columns.join(", "),
        quote_ident(schema),
        quote_ident(table),
        filters.join(" AND "),
        order.join(", ")
    ))
}

/// Records handed to the producer and their acknowledgements.
struct Batch<'a> {
    sink: &'a Sink,
    /// The setting naming the broker (`kafka.brokers`, …), for the message of a silent one.
    address_key: &'static str,
    acks: &'a AckQueue,
    max_in_flight: usize,
    ack_timeout: Duration,
    outstanding: usize,
    acked: u64,
    reports: Vec<Ack>,
}

impl Batch<'_> {
    async fn send(
        &mut self,
        event: &crate::outbox::OutboxEvent,
        route: usize,
    ) -> Result<(), FatalError> {
        while self.outstanding >= self.max_in_flight {
            self.wait().await?;
        }
        loop {
            match self.sink.send(event, 0, route) {
                Ok(()) => break,
                Err(SinkError::QueueFull) => self.wait().await?,
                Err(e) => {
                    return Err(FatalError::new(
                        Failure::EventRejected,
                        format!(
                            "cannot republish event {} to {:?}: {e}",
                            String::from_utf8_lossy(&event.id),
                            event.topic
                        ),
                    ))
                }
            }
        }
        self.outstanding += 1;
        Ok(())
    }

    async fn wait(&mut self) -> Result<(), FatalError> {
        self.stopped()?;
        let waited = tokio::time::timeout(self.ack_timeout, self.acks.wait()).await;
        self.stopped()?;
        if waited.is_err() {
            return Err(FatalError::new(
                Failure::Kafka,
                format!(
                    "no broker acknowledged a republished record for {:?} ({} acknowledged, {} \
                     waiting): check that {} is reachable (walbox check), then run \
                     the same republish again (consumers drop the duplicates by id)",
                    self.ack_timeout, self.acked, self.outstanding, self.address_key
                ),
            ));
        }
        self.acks.drain_into(&mut self.reports);
        for ack in self.reports.drain(..) {
            self.outstanding = self.outstanding.saturating_sub(1);
            match ack.result {
                Ok(()) => self.acked += 1,
                Err(e) => {
                    let failure = match e.class() {
                        Class::Rejected => Failure::EventRejected,
                        Class::Fatal(f) => f,
                        Class::Transient | Class::Effect => Failure::Kafka,
                    };
                    let id = ack.failed.map(|f| f.id).unwrap_or_default();
                    return Err(FatalError::new(
                        failure,
                        format!(
                            "{} failed to deliver republished event {id}: {e}",
                            e.broker()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The client error the producer cannot recover from, once it reported one (a TLS
    /// handshake that failed on a certificate, say: exit 4), instead of waiting out the
    /// acknowledgements that cannot come.
    fn stopped(&self) -> Result<(), FatalError> {
        let Some(e) = self.acks.fatal() else {
            return Ok(());
        };
        let failure = e.class().fatal().unwrap_or(Failure::Kafka);
        Err(FatalError::new(
            failure,
            format!(
                "{} publisher cannot continue: {}",
                e.broker(),
                match &e {
                    DeliveryError::Broker(b) => b.message.clone(),
                    DeliveryError::Kafka(k) => k.to_string(),
                }
            ),
        ))
    }

    async fn drain(&mut self) -> Result<(), FatalError> {
        while self.outstanding > 0 {
            self.wait().await?;
        }
        Ok(())
    }
}
