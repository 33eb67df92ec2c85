//! `walbox audit`: an independent check that every outbox row still in the table is in Kafka
//! (or Redis Streams, or NATS JetStream: [`crate::sink::readback`]; RabbitMQ's queues are
//! consumed and cannot be read back).
//!
//! The rows of the window (`--since-id`, `--since`, or all) are read in one `REPEATABLE READ`
//! snapshot and mapped by the relay's own mapper (the same code as `walbox republish`). The
//! snapshot's first statement reads the WAL insert position L: every row it sees committed
//! before L. The audit then waits (up to `--wait`) until the slot (with `postgres.shards`, every
//! shard's slot) has confirmed L, so a row the relay has not had time to deliver is not reported
//! missing, and reads each topic (and each dead-letter topic) from its beginning to the high
//! watermark it had then.
//!
//! An event of this outbox is identified by its table and its id (ids of two tables routed to
//! one topic may be equal): a record counts for a row when it is in the row's topic and carries
//! the row's `id` header, its key, and its table in the `walbox.source` header
//! ([`SOURCE_HEADER`]). A record in the route's dead-letter topic (it carries `walbox.error`)
//! counts as the row's dead letter. A row with no record and no dead letter is **missing**; one
//! with a dead letter only is **dead-lettered** (republishing would only dead-letter it again);
//! one with several records is **duplicated** (at-least-once delivery allows it; consumers drop
//! duplicates by `id`).
//!
//! # Invariants
//! - The exit status is 0 only when nothing is missing (duplicates and dead letters are
//!   reported, not failed); 14 ([`Failure::Audit`]) when something is.
//! - Records without an `id` header, or with neither `walbox.source` nor `walbox.commit_lsn`
//!   (other producers), count for nothing. A walbox record without `walbox.source` (written
//!   before walbox wrote that header) counts for the rows of its topic with its id and key.
//! - Memory is bounded by the rows of the window (an id, a key and two counts per row), not by
//!   the topics: records are counted as they are read and not kept.
//! - Findings are listed in id order (numerically for integer ids), so the first missing one is
//!   where `walbox republish --since-id` starts.
//! - The consumer reads committed records only (`isolation.level=read_committed`), commits no
//!   offsets and joins no group.
//! - A partition is read to the high watermark it had when the audit started (as a
//!   `read_uncommitted` client sees it), not to its last stable offset. Under read_committed the
//!   end of a partition is its last stable offset, which stays below records that are already
//!   committed or acknowledged in two cases: right after a Kafka transaction commits (EndTxn
//!   returns once the coordinator has decided; the commit markers reach the partitions a moment
//!   later), so in exactly-once mode the slot can confirm a transaction whose records a reader
//!   does not see yet; and behind another producer's open transaction, which hides every
//!   record after its first one until it ends. The audit waits there (logging why), for at most
//!   [`STALL`] without a record; a partition still hidden then is given up on with a warning,
//!   and its rows may be reported missing.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::Serialize;
use smallvec::SmallVec;
use tokio_postgres::types::ToSql;
use tokio_postgres::IsolationLevel;

use super::republish::{check_window, describe, insert_of, refused, select, Window};
use crate::config::{BrokerConfig, BrokerKind, Config, KafkaRole, RouteSource};
use crate::dead_letter::Policy;
use crate::failure::{Failure, FatalError};
use crate::lsn::Lsn;
use crate::outbox::{
    EventPosition, OutboxError, OutboxMapper, COMMIT_LSN_HEADER, ERROR_HEADER, SOURCE_HEADER,
};
use crate::pg::control::connect_control;
use crate::sink::kafka::{is_unused_group_refusal, reader_metadata, ReaderContext, ReaderError};
use crate::sink::readback::{self, ReadRecord};

/// At most this many ids of each kind are listed; the counts are always complete.
const LISTED: usize = 100;
/// How long one poll of the topics waits.
const POLL: Duration = Duration::from_millis(200);
/// A partition that yields nothing for this long below its high watermark is given up on
/// (its records were deleted by retention, or compacted).
const STALL: Duration = Duration::from_secs(30);

/// One row found missing, dead-lettered or duplicated.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Finding {
    /// The topic the row maps to (its dead-letter topic for a dead-lettered row, or for a row
    /// that cannot be mapped).
    pub topic: String,
    /// The row's table (`schema.table`), as in the `walbox.source` header.
    pub table: String,
    /// The row's id, as in the `id` header.
    pub id: String,
    /// Records found in that topic (0: missing).
    pub records: u32,
}

/// What an audit found.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Rows audited.
    pub rows: u64,
    /// Rows that cannot be mapped under `on_invalid = "fail"` (the relay stops at them).
    pub unmapped: u64,
    /// Records read from the topics.
    pub records_read: u64,
    /// Rows with no record (and no dead letter).
    pub missing: u64,
    /// Rows with more than one record.
    pub duplicated: u64,
    /// Rows found only in their dead-letter topic.
    pub dead_lettered: u64,
    /// Up to 100 of the missing rows, in id order.
    pub missing_ids: Vec<Finding>,
    /// Up to 100 of the duplicated rows, in id order.
    pub duplicated_ids: Vec<Finding>,
    /// Up to 100 of the dead-lettered rows, in id order.
    pub dead_lettered_ids: Vec<Finding>,
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
    if let BrokerConfig::RabbitMq(_) = config.broker {
        return Err(FatalError::new(
            Failure::Config,
            "walbox audit reads the records back from the broker, and RabbitMQ's queues are consumed by their consumers: compare the outbox with what your consumers recorded (the inbox's table), docs/brokers.md",
        ));
    }
    let mut client = connect_control(&config.postgres.conn)
        .await
        .map_err(|e| FatalError::of(&e))?;
    let (expected, unmapped, needed) = read_rows(&mut client, config, window).await?;
    // Every slot of the layout relays some of the rows: each must have confirmed them.
    let slots: Vec<String> = config
        .postgres
        .shards()
        .into_iter()
        .map(|shard| shard.slot)
        .collect();
    let relay_behind = !confirmed(&client, &slots, needed, wait).await?;
    drop(client);
    let (expected, records_read) = read_back(config, expected).await?;
    let mut report = Report {
        rows: expected.rows.len() as u64 + unmapped,
        unmapped,
        records_read,
        relay_behind,
        ..Report::default()
    };
    let (mut missing, mut duplicated, mut dead_lettered) = (Vec::new(), Vec::new(), Vec::new());
    for row in &expected.rows {
        let finding = |topic: &Arc<str>, records: u32| Finding {
            topic: topic.to_string(),
            table: row.source.to_string(),
            id: String::from_utf8_lossy(&row.id).into_owned(),
            records,
        };
        let home = row.topic.as_ref().or(row.dead_letter.as_ref());
        match (row.records, row.dead_letters, home) {
            (0, 0, Some(topic)) => missing.push(finding(topic, 0)),
            (0, n, _) => {
                if let Some(dlq) = &row.dead_letter {
                    dead_lettered.push(finding(dlq, n));
                }
            }
            (n, _, Some(topic)) if n > 1 => duplicated.push(finding(topic, n)),
            _ => {}
        }
    }
    for (list, count, listed) in [
        (missing, &mut report.missing, &mut report.missing_ids),
        (
            duplicated,
            &mut report.duplicated,
            &mut report.duplicated_ids,
        ),
        (
            dead_lettered,
            &mut report.dead_lettered,
            &mut report.dead_lettered_ids,
        ),
    ] {
        *count = list.len() as u64;
        *listed = in_id_order(list);
    }
    print(&report, json);
    if let Some(first) = report.missing_ids.first() {
        return Err(FatalError::new(
            Failure::Audit,
            format!(
                "{} of {} outbox rows are not in {}; `walbox republish --since-id {}` produces them again (from every table)",
                report.missing, report.rows, broker_name(config), first.id
            ),
        ));
    }
    Ok(report)
}

/// The first [`LISTED`] of `findings` in id order (numerically for integer ids), then table
/// and topic.
fn in_id_order(mut findings: Vec<Finding>) -> Vec<Finding> {
    findings.sort_by(|a, b| {
        id_order(&a.id, &b.id)
            .then_with(|| a.table.cmp(&b.table))
            .then_with(|| a.topic.cmp(&b.topic))
    });
    findings.truncate(LISTED);
    findings
}

/// Integer ids by value (before any other), other ids by their bytes.
fn id_order(a: &str, b: &str) -> Ordering {
    match (a.parse::<i128>(), b.parse::<i128>()) {
        (Ok(x), Ok(y)) => x.cmp(&y),
        (Ok(_), Err(_)) => Ordering::Less,
        (Err(_), Ok(_)) => Ordering::Greater,
        (Err(_), Err(_)) => a.cmp(b),
    }
}

/// A row of the window, and what was found of it.
struct Row {
    /// Its route's name (`walbox.source`).
    source: Arc<str>,
    id: Bytes,
    /// Its event's topic; `None` for a row that cannot be mapped (its dead letter is expected).
    topic: Option<Arc<str>>,
    /// Its route's dead-letter topic.
    dead_letter: Option<Arc<str>>,
    records: u32,
    dead_letters: u32,
}

/// The rows (their places in [`Expected::rows`]) whose records carry an id and a key.
type ByIdAndKey = HashMap<(Bytes, Option<Bytes>), SmallVec<[usize; 1]>>;

/// The rows of the window, found by where their records are: topic, then (id, key).
#[derive(Default)]
struct Expected {
    rows: Vec<Row>,
    index: HashMap<Arc<str>, ByIdAndKey>,
}

impl Expected {
    fn add(&mut self, row: Row, key: Option<Bytes>) {
        let at = self.rows.len();
        for topic in [&row.topic, &row.dead_letter].into_iter().flatten() {
            self.index
                .entry(topic.clone())
                .or_default()
                .entry((row.id.clone(), key.clone()))
                .or_default()
                .push(at);
        }
        self.rows.push(row);
    }

    /// Counts a record of `topic` for the rows it belongs to (see the module docs).
    /// `header` gives the value of the record's first header of a name.
    fn count<'h>(
        &mut self,
        topic: &str,
        key: Option<&[u8]>,
        header: impl Fn(&str) -> Option<&'h [u8]>,
    ) {
        let Some(id) = header("id") else { return };
        let source = header(SOURCE_HEADER);
        if source.is_none() && header(COMMIT_LSN_HEADER).is_none() {
            return; // another producer's record
        }
        let dead_letter = header(ERROR_HEADER).is_some();
        let Some(rows) = self.index.get(topic).and_then(|ids| {
            ids.get(&(Bytes::copy_from_slice(id), key.map(Bytes::copy_from_slice)))
        }) else {
            return;
        };
        for &at in rows {
            let row = &mut self.rows[at];
            if source.is_some_and(|s| s != row.source.as_bytes()) {
                continue;
            }
            if dead_letter {
                if row.dead_letter.as_deref() == Some(topic) {
                    row.dead_letters += 1;
                }
            } else if row.topic.as_deref() == Some(topic) {
                row.records += 1;
            }
        }
    }
}

/// The rows of the window, how many cannot be mapped under `on_invalid = "fail"`, and the WAL
/// position every one of them committed before.
async fn read_rows(
    client: &mut tokio_postgres::Client,
    config: &Config,
    window: &Window,
) -> Result<(Expected, u64, Lsn), FatalError> {
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
        .map_err(|_| FatalError::new(Failure::Internal, format!("WAL position {needed:?}")))?;
    let mut mapper = OutboxMapper::new(&config.outbox);
    mapper.set_not_null(
        crate::source::catalog::not_null_columns(&tx, &config.outbox)
            .await
            .map_err(pg)?,
    );
    let mut expected = Expected::default();
    let mut unmapped = 0u64;
    for route in &config.outbox.tables {
        let RouteSource::Table { schema, table } = &route.source else {
            continue;
        };
        let dead_letter: Option<Arc<str>> = match &route.on_invalid {
            Policy::DeadLetter(topic) => Some(topic.as_str().into()),
            Policy::Fail => None,
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
            let position = EventPosition {
                commit_lsn: Lsn::ZERO,
                index: 0,
                commit_time: 0,
            };
            let (topic, id, key) = match mapper.map_insert(&insert_of(&row, relation.id), position)
            {
                Ok(Some(event)) => (Some(event.topic), event.id, event.key),
                Ok(None) => continue,
                // Dead-lettered by the relay, with the id and key it could read.
                Err(OutboxError::InvalidEvent(inv)) if dead_letter.is_some() => {
                    (None, Bytes::from(inv.id), inv.key)
                }
                Err(_) => {
                    unmapped += 1;
                    continue;
                }
            };
            let row = Row {
                source: route.name.clone(),
                id,
                topic,
                dead_letter: dead_letter.clone(),
                records: 0,
                dead_letters: 0,
            };
            expected.add(row, key);
        }
    }
    tx.commit().await.map_err(pg)?;
    Ok((expected, unmapped, needed))
}

/// Waits up to `wait` until every slot of `slots` (the layout's: one, or one per shard) has
/// confirmed `needed`; false when one has not (a missing slot confirms nothing).
async fn confirmed(
    client: &tokio_postgres::Client,
    slots: &[String],
    needed: Lsn,
    wait: Duration,
) -> Result<bool, FatalError> {
    let deadline = Instant::now() + wait;
    loop {
        let row = client
            .query_one(
                "SELECT CASE WHEN count(s.slot_name) = cardinality($1::text[]) \
                 THEN coalesce(min(s.confirmed_flush_lsn), '0/0') ELSE '0/0' END::text \
                 FROM unnest($1::text[]) AS n(name) \
                 LEFT JOIN pg_replication_slots s ON s.slot_name = n.name",
                &[&slots],
            )
            .await
            .map_err(|e| refused("postgres", &e))?;
        let confirmed: Lsn = row.get::<_, String>(0).parse().unwrap_or(Lsn::ZERO);
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

/// The broker as the report names it.
fn broker_name(config: &Config) -> &'static str {
    match config.broker.kind() {
        BrokerKind::Kafka => "Kafka",
        BrokerKind::Redis => "Redis",
        BrokerKind::Nats => "NATS",
        BrokerKind::RabbitMq => "RabbitMQ",
    }
}

/// Reads every destination of `expected` (dead-letter ones included) from the broker, to the
/// end it has now, counting the records of the expected rows; how many records were read.
async fn read_back(config: &Config, mut expected: Expected) -> Result<(Expected, u64), FatalError> {
    let mut destinations: Vec<String> = expected.index.keys().map(|t| t.to_string()).collect();
    destinations.sort_unstable();
    let mut count = |r: &ReadRecord<'_>| expected.count(r.destination, r.key, |n| r.header(n));
    let read = match &config.broker {
        BrokerConfig::Kafka => {
            let kafka = config.kafka.clone();
            return tokio::task::spawn_blocking(move || count_records(&kafka, expected))
                .await
                .map_err(|e| FatalError::new(Failure::Internal, format!("audit task: {e}")))?;
        }
        BrokerConfig::Redis(r) => readback::read_redis(r, &destinations, &mut count).await,
        BrokerConfig::Nats(n) => readback::read_nats(n, &destinations, &mut count).await,
        BrokerConfig::RabbitMq(_) => Ok(0),
    }
    .map_err(|e| FatalError::of_or(&e, Failure::Unavailable))?;
    Ok((expected, read))
}

/// Reads every topic of `expected` (dead-letter topics included) from the beginning to its
/// current high watermark, counting the records of the expected rows.
fn count_records(
    kafka: &crate::config::KafkaConfig,
    mut expected: Expected,
) -> Result<(Expected, u64), FatalError> {
    let kafka_err =
        |e: rdkafka::error::KafkaError| FatalError::new(Failure::Kafka, format!("kafka: {e}"));
    let mut cc = kafka.client_config(KafkaRole::AuditReader);
    let consumer: BaseConsumer<ReaderContext> = cc
        .create_with_context(ReaderContext::default())
        .map_err(kafka_err)?;
    // A TLS handshake that failed on a certificate stops the audit with its line (exit 4),
    // whatever the call that failed said.
    let untrusted = |line: String| FatalError::new(Failure::Auth, format!("kafka: {line}"));
    let failed = |e: rdkafka::error::KafkaError| match consumer.context().untrusted() {
        Some(line) => untrusted(line),
        None => kafka_err(e),
    };
    // ListOffsets answers a read_committed client with the last stable offset: the high
    // watermarks come from a read_uncommitted one.
    cc.set("isolation.level", "read_uncommitted");
    let watermarks: BaseConsumer<ReaderContext> = cc
        .create_with_context(ReaderContext::default())
        .map_err(kafka_err)?;
    let timeout = Duration::from_secs(10);
    let mut tpl = TopicPartitionList::new();
    let mut ends: HashMap<(String, i32), i64> = HashMap::new();
    let mut topics: Vec<&str> = expected.index.keys().map(|t| &**t).collect();
    topics.sort_unstable();
    for topic in topics {
        let metadata = reader_metadata(&consumer, Some(topic), timeout).map_err(|e| match e {
            ReaderError::Kafka(e) => failed(e),
            ReaderError::Untrusted(line) => untrusted(line),
        })?;
        for t in metadata.topics() {
            for p in t.partitions() {
                let (low, high) = watermarks
                    .fetch_watermarks(topic, p.id(), timeout)
                    .map_err(failed)?;
                if high > low {
                    tpl.add_partition_offset(topic, p.id(), Offset::Beginning)
                        .map_err(failed)?;
                    ends.insert((topic.to_owned(), p.id()), high);
                }
            }
        }
    }
    if ends.is_empty() {
        return Ok((expected, 0));
    }
    consumer.assign(&tpl).map_err(failed)?;
    let mut read = 0u64;
    let mut last_progress = Instant::now();
    let mut waiting = false;
    while !ends.is_empty() {
        let Some(message) = consumer.poll(POLL) else {
            // An aborted transaction, or markers, can move the position without a record.
            retire_reached(&consumer, &mut ends);
            if !ends.is_empty() && last_progress.elapsed() > STALL {
                tracing::warn!(partitions = ends.len(), "partitions yield nothing below their high watermark (records deleted or compacted, or a kafka transaction open for longer); the audit stops reading them, and their rows may be reported missing");
                break;
            }
            continue;
        };
        let m = match message {
            // Transaction markers end a partition without being delivered: its end is where
            // the consumer's position reached the high watermark. Below it, the committed
            // view stops at the last stable offset: wait (see the module docs).
            Err(rdkafka::error::KafkaError::PartitionEOF(p)) => {
                retire_reached(&consumer, &mut ends);
                if !waiting && ends.keys().any(|(_, q)| *q == p) {
                    waiting = true;
                    tracing::info!(
                        partition = p,
                        "the committed view of a partition ends below its high watermark (a kafka transaction's commit markers still being written, or another producer's transaction still open); waiting for it"
                    );
                }
                continue;
            }
            Err(e) if is_unused_group_refusal(&e) => {
                tracing::debug!(error = %e, "the audit's group is refused; it uses none");
                continue;
            }
            other => other.map_err(failed)?,
        };
        last_progress = Instant::now();
        read += 1;
        let key = (m.topic().to_owned(), m.partition());
        let headers = m.headers();
        expected.count(m.topic(), m.key(), |name| {
            headers.and_then(|h| h.iter().find(|h| h.key == name).and_then(|h| h.value))
        });
        if ends.get(&key).is_some_and(|end| m.offset() + 1 >= *end) {
            ends.remove(&key);
        }
    }
    Ok((expected, read))
}

/// Removes from `ends` each partition the consumer's position has reached.
fn retire_reached(consumer: &BaseConsumer<ReaderContext>, ends: &mut HashMap<(String, i32), i64>) {
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
}

fn print(report: &Report, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).unwrap_or_default()
        );
        return;
    }
    let mut extra = String::new();
    if report.dead_lettered > 0 {
        extra += &format!(", {} dead-lettered", report.dead_lettered);
    }
    if report.unmapped > 0 {
        extra += &format!(", {} rows not mappable", report.unmapped);
    }
    println!(
        "audited {} rows: {} missing, {} duplicated{extra} ({} records read)",
        report.rows, report.missing, report.duplicated, report.records_read,
    );
    for (label, findings, total) in [
        ("missing    ", &report.missing_ids, report.missing),
        (
            "dead-letter",
            &report.dead_lettered_ids,
            report.dead_lettered,
        ),
        ("duplicated ", &report.duplicated_ids, report.duplicated),
    ] {
        for f in findings {
            let records = if f.records > 1 {
                format!("  {} records", f.records)
            } else {
                String::new()
            };
            println!("{label} {}  {}  id={}{records}", f.topic, f.table, f.id);
        }
        if total > findings.len() as u64 {
            println!("{label} … and {} more", total - findings.len() as u64);
        }
    }
    if report.relay_behind {
        println!("note: the slot had not confirmed every audited row; run the audit again before acting on the newest missing ids");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finding(id: &str, table: &str) -> Finding {
        Finding {
            topic: "t".into(),
            table: table.into(),
            id: id.into(),
            records: 0,
        }
    }

    /// Rows `public.a` 1 and `public.b` 1 on topic `t` (key `k`), `public.a` with the
    /// dead-letter topic `dlq`.
    fn two_tables() -> Expected {
        let mut expected = Expected::default();
        for (source, dead_letter) in [("public.a", Some("dlq")), ("public.b", None)] {
            let row = Row {
                source: source.into(),
                id: Bytes::from_static(b"1"),
                topic: Some("t".into()),
                dead_letter: dead_letter.map(Arc::from),
                records: 0,
                dead_letters: 0,
            };
            expected.add(row, Some(Bytes::from_static(b"k")));
        }
        expected
    }

    fn record(expected: &mut Expected, topic: &str, key: &str, headers: &[(&str, &str)]) {
        expected.count(topic, Some(key.as_bytes()), |name| {
            headers
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.as_bytes())
        });
    }

    fn counts(expected: &Expected) -> Vec<(u32, u32)> {
        expected
            .rows
            .iter()
            .map(|r| (r.records, r.dead_letters))
            .collect()
    }

    #[test]
    fn a_record_counts_for_the_row_of_its_table_id_and_key() {
        let mut e = two_tables();
        let walbox = |source| {
            [
                ("id", "1"),
                ("walbox.commit_lsn", "0/1"),
                ("walbox.source", source),
            ]
        };
        record(&mut e, "t", "k", &walbox("public.b"));
        assert_eq!(counts(&e), [(0, 0), (1, 0)]);
        // Another key, another topic, another table: not these rows.
        record(&mut e, "t", "other", &walbox("public.a"));
        record(&mut e, "u", "k", &walbox("public.a"));
        record(&mut e, "t", "k", &walbox("public.c"));
        assert_eq!(counts(&e), [(0, 0), (1, 0)]);
        // Another producer's record with the same id counts for nothing.
        record(&mut e, "t", "k", &[("id", "1")]);
        assert_eq!(counts(&e), [(0, 0), (1, 0)]);
        // A record written before walbox.source existed counts by topic, id and key.
        record(
            &mut e,
            "t",
            "k",
            &[("id", "1"), ("walbox.commit_lsn", "0/1")],
        );
        assert_eq!(counts(&e), [(1, 0), (2, 0)]);
    }

    #[test]
    fn a_dead_letter_counts_in_its_routes_dead_letter_topic_only() {
        let mut e = two_tables();
        let letter = |source| {
            [
                ("id", "1"),
                ("walbox.error", "too large"),
                ("walbox.source", source),
                ("walbox.commit_lsn", "0/1"),
            ]
        };
        record(&mut e, "dlq", "k", &letter("public.a"));
        record(&mut e, "dlq", "k", &letter("public.b"));
        assert_eq!(counts(&e), [(0, 1), (0, 0)]);
        // A dead letter in the event's own topic is not a delivery.
        record(&mut e, "t", "k", &letter("public.a"));
        assert_eq!(counts(&e), [(0, 1), (0, 0)]);
    }

    #[test]
    fn findings_are_in_numeric_id_order_then_by_table() {
        let listed = in_id_order(vec![
            finding("100", "public.a"),
            finding("91", "public.b"),
            finding("e-1", "public.c"),
            finding("91", "public.a"),
            finding("-3", "public.a"),
        ]);
        let order: Vec<(&str, &str)> = listed
            .iter()
            .map(|f| (f.id.as_str(), f.table.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                ("-3", "public.a"),
                ("91", "public.a"),
                ("91", "public.b"),
                ("100", "public.a"),
                ("e-1", "public.c")
            ]
        );
    }
}
