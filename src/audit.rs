//! `walbox audit`: an independent check that every outbox row still in the table is in Kafka.
//!
//! The rows of the window (`--since-id`, `--since`, or all) are read in one `REPEATABLE READ`
//! snapshot and mapped to `(topic, id)` by the relay's own mapper (the same code as `walbox
//! republish`). The snapshot's first statement reads the WAL insert position L: every row it
//! sees committed before L. The audit then waits (up to `--wait`) until the slot has confirmed
//! L, so a row the relay has not had time to deliver is not reported missing, and reads each
//! topic from its beginning to the high watermark it had then, counting the records whose `id`
//! header is one of the rows' ids. A row with no such record is **missing**; one with several
//! is **duplicated** (at-least-once delivery allows it; consumers drop duplicates by `id`).
//!
//! # Invariants
//! - The exit status is 0 only when nothing is missing (duplicates are reported, not failed);
//!   14 ([`Failure::Audit`]) when something is.
//! - Memory is bounded by the rows of the window (an id and a count per row), not by the topics:
//!   records are counted as they are read and not kept. Records of other producers, or of rows
//!   already deleted, are read and ignored.
//! - The consumer reads committed records only (`isolation.level=read_committed`), commits no
//!   offsets and joins no group.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::Serialize;
use tokio_postgres::types::ToSql;
use tokio_postgres::IsolationLevel;

use crate::config::{Config, RouteSource};
use crate::failure::{Failure, FatalError};
use crate::lsn::Lsn;
use crate::outbox::{EventPosition, OutboxMapper};
use crate::pg::control::connect_control;
use crate::republish::{check_window, describe, insert_of, refused, select, Window};
use crate::sink::kafka::ReaderContext;

/// At most this many missing or duplicated ids are listed; the counts are always complete.
const LISTED: usize = 100;
/// How long one poll of the topics waits.
const POLL: Duration = Duration::from_millis(200);
/// A partition that yields nothing for this long below its high watermark is given up on
/// (its records were deleted by retention, or compacted).
const STALL: Duration = Duration::from_secs(30);

fn fatal(failure: Failure, message: impl ToString) -> FatalError {
    FatalError {
        failure,
        message: message.to_string(),
    }
}

/// One id found missing or duplicated.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Finding {
    /// The topic the row maps to.
    pub topic: String,
    /// The row's id, as in the `id` header.
    pub id: String,
    /// Records with this id (0: missing).
    pub records: u32,
}

/// What an audit found.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Rows audited.
    pub rows: u64,
    /// Rows that could not be mapped (they go to the dead-letter topic, or stop the relay).
    pub unmapped: u64,
    /// Records read from the topics.
    pub records_read: u64,
    /// Rows with no record.
    pub missing: u64,
    /// Rows with more than one record.
    pub duplicated: u64,
    /// Up to 100 of the missing rows.
    pub missing_ids: Vec<Finding>,
    /// Up to 100 of the duplicated rows.
    pub duplicated_ids: Vec<Finding>,
    /// The slot had not confirmed every audited row when the topics were read: the newest
    /// missing ones may still be on their way.
    pub relay_behind: bool,
}

/// `walbox audit`: see the [module docs](self). Prints the report (JSON with `json`).
pub async fn audit(
    config: &Config,
    window: &Window,
    wait: Duration,
    json: bool,
) -> Result<Report, FatalError> {
    let mut client = connect_control(&config.postgres.conn)
        .await
        .map_err(|e| FatalError::of(&e))?;
    let (expected, rows, unmapped, needed) = read_rows(&mut client, config, window).await?;
    let relay_behind = !confirmed(&client, &config.postgres.slot, needed, wait).await?;
    drop(client);
    let kafka = config.kafka.clone();
    let (counts, records_read) =
        tokio::task::spawn_blocking(move || count_records(&kafka, expected))
            .await
            .map_err(|e| fatal(Failure::Internal, format!("audit task: {e}")))??;
    let mut report = Report {
        rows,
        unmapped,
        records_read,
        relay_behind,
        ..Report::default()
    };
    let mut topics: Vec<_> = counts.into_iter().collect();
    topics.sort_by(|a, b| a.0.cmp(&b.0));
    for (topic, ids) in topics {
        let mut ids: Vec<_> = ids.into_iter().collect();
        ids.sort();
        for (id, n) in ids {
            let finding = || Finding {
                topic: topic.clone(),
                id: String::from_utf8_lossy(&id).into_owned(),
                records: n,
            };
            if n == 0 {
                report.missing += 1;
                if report.missing_ids.len() < LISTED {
                    report.missing_ids.push(finding());
                }
            } else if n > 1 {
                report.duplicated += 1;
                if report.duplicated_ids.len() < LISTED {
                    report.duplicated_ids.push(finding());
                }
            }
        }
    }
    print(&report, json);
    if report.missing > 0 {
        return Err(fatal(
            Failure::Audit,
            format!(
                "{} of {} outbox rows are not in Kafka; `walbox republish --since-id <the first missing id>` produces them again",
                report.missing, report.rows
            ),
        ));
    }
    Ok(report)
}

/// Ids expected per topic (each with a count of 0), how many rows were read, how many could
/// not be mapped, and the WAL position every one of them committed before.
type Expected = HashMap<String, HashMap<Vec<u8>, u32>>;

async fn read_rows(
    client: &mut tokio_postgres::Client,
    config: &Config,
    window: &Window,
) -> Result<(Expected, u64, u64, Lsn), FatalError> {
    let pg = |e: tokio_postgres::Error| refused("postgres", &e);
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(pg)?;
    // The snapshot's first statement: every row it sees committed before this position.
    let needed: String = tx
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await
        .map_err(pg)?
        .get(0);
    let needed: Lsn = needed
        .parse()
        .map_err(|_| fatal(Failure::Internal, format!("WAL position {needed:?}")))?;
    let mut mapper = OutboxMapper::new(&config.outbox);
    let mut expected = Expected::new();
    let (mut rows_read, mut unmapped) = (0u64, 0u64);
    for route in &config.outbox.tables {
        let RouteSource::Table { schema, table } = &route.source else {
            continue;
        };
        let (relation, types) = describe(&tx, schema, table).await?;
        check_window(&tx, route, &relation, &types, window).await?;
        mapper.relation(&relation);
        let sql = select(route, &relation, &types, window)?;
        let rows = tx
            .query_raw(&sql, std::iter::empty::<&(dyn ToSql + Sync)>())
            .await
            .map_err(|e| refused(&format!("reading {}", route.name), &e))?;
        let mut rows = std::pin::pin!(rows);
        while let Some(row) = rows.next().await {
            let row = row.map_err(|e| refused(&format!("reading {}", route.name), &e))?;
            rows_read += 1;
            let position = EventPosition {
                commit_lsn: Lsn::ZERO,
                index: 0,
                commit_time: 0,
            };
            match mapper.map_insert(&insert_of(&row, relation.id), position) {
                Ok(Some(event)) => {
                    expected
                        .entry(event.topic.to_string())
                        .or_default()
                        .insert(event.id.to_vec(), 0);
                }
                Ok(None) => {}
                Err(_) => unmapped += 1,
            }
        }
    }
    tx.commit().await.map_err(pg)?;
    Ok((expected, rows_read, unmapped, needed))
}

/// Waits up to `wait` until `slot` has confirmed `needed`; false when it has not.
async fn confirmed(
    client: &tokio_postgres::Client,
    slot: &str,
    needed: Lsn,
    wait: Duration,
) -> Result<bool, FatalError> {
    let deadline = Instant::now() + wait;
    loop {
        let row = client
            .query_opt(
                "SELECT coalesce(confirmed_flush_lsn, '0/0')::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .map_err(|e| refused("postgres", &e))?;
        let confirmed: Lsn = row
            .and_then(|r| r.get::<_, String>(0).parse().ok())
            .unwrap_or(Lsn::ZERO);
        if confirmed >= needed {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            tracing::warn!(%needed, %confirmed, "the slot has not confirmed every audited row: the newest rows reported missing may still be on their way");
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads every topic of `expected` from the beginning to its current high watermark, counting
/// the records of the expected ids.
fn count_records(
    kafka: &crate::config::KafkaConfig,
    mut expected: Expected,
) -> Result<(Expected, u64), FatalError> {
    let kafka_err = |e: rdkafka::error::KafkaError| fatal(Failure::Kafka, format!("kafka: {e}"));
    let mut cc = ClientConfig::new();
    for (k, v) in &kafka.properties {
        cc.set(k, v);
    }
    cc.set("bootstrap.servers", &kafka.brokers)
        .set("group.id", "walbox-audit")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("log_level", "3");
    let consumer: BaseConsumer<ReaderContext> =
        cc.create_with_context(ReaderContext).map_err(kafka_err)?;
    let timeout = Duration::from_secs(10);
    let mut tpl = TopicPartitionList::new();
    let mut ends: HashMap<(String, i32), i64> = HashMap::new();
    for topic in expected.keys() {
        let metadata = consumer
            .fetch_metadata(Some(topic), timeout)
            .map_err(kafka_err)?;
        for t in metadata.topics() {
            for p in t.partitions() {
                let (low, high) = consumer
                    .fetch_watermarks(topic, p.id(), timeout)
                    .map_err(kafka_err)?;
                if high > low {
                    tpl.add_partition_offset(topic, p.id(), Offset::Beginning)
                        .map_err(kafka_err)?;
                    ends.insert((topic.clone(), p.id()), high);
                }
            }
        }
    }
    if ends.is_empty() {
        return Ok((expected, 0));
    }
    consumer.assign(&tpl).map_err(kafka_err)?;
    let mut read = 0u64;
    let mut last_progress = Instant::now();
    while !ends.is_empty() {
        let Some(message) = consumer.poll(POLL) else {
            if last_progress.elapsed() > STALL {
                tracing::warn!(partitions = ends.len(), "partitions yield nothing below their high watermark; the audit stops reading them");
                break;
            }
            continue;
        };
        let m = match message {
            // Transaction markers end a partition without being delivered.
            // Transaction markers end a partition without being delivered: its end is where
            // the consumer's position reached the high watermark.
            Err(rdkafka::error::KafkaError::PartitionEOF(_)) => {
                if let Ok(positions) = consumer.position() {
                    for e in positions.elements() {
                        if let Offset::Offset(at) = e.offset() {
                            let key = (e.topic().to_owned(), e.partition());
                            if ends.get(&key).is_some_and(|end| at >= *end) {
                                ends.remove(&key);
                            }
                        }
                    }
                }
                continue;
            }
            other => other.map_err(kafka_err)?,
        };
        last_progress = Instant::now();
        read += 1;
        let key = (m.topic().to_owned(), m.partition());
        if let Some(ids) = expected.get_mut(m.topic()) {
            if let Some(id) = m
                .headers()
                .and_then(|h| h.iter().find(|h| h.key == "id").and_then(|h| h.value))
            {
                if let Some(n) = ids.get_mut(id) {
                    *n += 1;
                }
            }
        }
        if ends.get(&key).is_some_and(|end| m.offset() + 1 >= *end) {
            ends.remove(&key);
        }
    }
    Ok((expected, read))
}

fn print(report: &Report, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).unwrap_or_default()
        );
        return;
    }
    println!(
        "audited {} rows: {} missing, {} duplicated ({} records read{})",
        report.rows,
        report.missing,
        report.duplicated,
        report.records_read,
        if report.unmapped > 0 {
            format!(", {} rows not mappable", report.unmapped)
        } else {
            String::new()
        }
    );
    for f in &report.missing_ids {
        println!("missing     {}  id={}", f.topic, f.id);
    }
    if report.missing > report.missing_ids.len() as u64 {
        println!(
            "missing     … and {} more",
            report.missing - report.missing_ids.len() as u64
        );
    }
    for f in &report.duplicated_ids {
        println!(
            "duplicated  {}  id={}  {} records",
            f.topic, f.id, f.records
        );
    }
    if report.duplicated > report.duplicated_ids.len() as u64 {
        println!(
            "duplicated  … and {} more",
            report.duplicated - report.duplicated_ids.len() as u64
        );
    }
    if report.relay_behind {
        println!("note: the slot had not confirmed every audited row; run the audit again before acting on the newest missing ids");
    }
}
