//! Progress records: the evidence that a replication slot existed, kept where the events go.
//!
//! A logical slot lives only in PostgreSQL. When it disappears (dropped by hand, a restore from
//! a base backup, a failover to a server that never had it), the catalog cannot tell "this slot
//! never existed" from "this slot existed and is gone", and creating it again silently skips
//! every event committed in between. walbox therefore keeps one progress record per slot in a
//! compacted Kafka topic (`kafka.progress_topic`, default `walbox.progress`), keyed by
//! `<system identifier>/<database>/<slot>` so that deployments sharing a Kafka cluster do not
//! see each other's records. The value is JSON ([`ProgressRecord`]): the position last
//! confirmed to PostgreSQL, the commit time of the newest transaction confirmed, and where that
//! position is valid ([`Lineage`]): the server's timeline (`IDENTIFY_SYSTEM`) and the slot's
//! generation.
//!
//! # Timeline and slot generation
//! The key survives what reuses LSNs for other transactions: a promoted standby, a
//! point-in-time restore (both start a new timeline), a slot made again on a restored server.
//! A position is only meaningful on its own history, so each record says which:
//! - `timeline`: the timeline of the server the writer streamed from. PostgreSQL's timeline
//!   history (`TIMELINE_HISTORY`) says how far an earlier timeline is the current one's WAL.
//! - `slot_floor`, the slot's generation: the slot's `restart_lsn` when the writing session
//!   started (`recreate-slot`'s reset record: the point the slot was made at). PostgreSQL
//!   gives a slot no identity of its own (no id, no creation time), but it saves a slot to
//!   disk whenever its `restart_lsn` moves, so the same slot never shows less again, crash or
//!   restart in between, and its confirmed position never falls below it; a slot whose
//!   confirmed position is below a record's floor is another slot of that name (dropped and
//!   made again, or brought back by a restore). The slot's confirmed position at start would
//!   be no floor: PostgreSQL saves a confirmed position that moved alone only at the next
//!   checkpoint that finds the slot dirty, so a crash or restart takes it back. Unlike a
//!   counter kept in the topic, the floor is checked against the slot itself, and it needs
//!   nothing stored in the database.
//!
//! Exactly-once mode judges the record it reads at start with both (`relay::lineage`); a
//! record of an older walbox has neither field and counts as timeline unknown: trusted on
//! timeline 1 only (where no promotion or archive recovery ever forked the history), ignored
//! on a later timeline (so the cost of an old record is duplicates, never a skip).
//! `walbox recreate-slot` writes a reset record at the new slot's start, with its timeline and
//! generation.
//!
//! # Invariants
//! - A record is written when a session starts streaming (so a slot walbox has just created is
//!   on record), whenever the frontier moved and the last record is older than
//!   [`PROGRESS_INTERVAL`], and when a session ends. It never claims more than was confirmed
//!   to PostgreSQL: it is written after the status update that confirmed its position.
//! - Exactly-once mode (`relay::exactly_once`) writes one inside each Kafka transaction
//!   instead: the position committed to Kafka, which runs ahead of the slot's until the next
//!   status update. Read back `read_committed` at start, it says below which position
//!   PostgreSQL's transactions are in Kafka already.
//! - Records go through the relay's producer with their own delivery tag
//!   ([`crate::sink::PROGRESS_ROUTE`]); they never enter the checkpoint. A session's
//!   first record gates streaming: no WAL is read until it is acknowledged, and a refused one
//!   ends the session (`relay::record`). A later one that fails only costs a warning (the next
//!   one replaces it; in exactly-once mode it fails its Kafka transaction).
//! - The topic is read backwards from its end ([`read_last`]), so the read costs what was
//!   written after the slot's newest record, never the topic's size. The newest record is the
//!   last one of the first step back that holds the key (across partitions, the newest by
//!   record timestamp).
//! - At start-up, a missing slot is created only when the topic was read whole and holds
//!   no record for it. A record found means the slot existed and is gone: walbox stops as for a
//!   lost slot. A topic that cannot be read is a transient error: walbox never creates a slot
//!   on a guess. A principal the brokers refuse (credentials, a missing ACL) stops walbox
//!   instead (exit 4 or 9).
//! - The reader assigns its partition and names its offsets; it commits nothing and needs no
//!   right on a consumer group (see `sink::kafka::is_unused_group_refusal`).

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use crate::config::{KafkaConfig, KafkaRole};
use crate::failure::{kafka_error, Classify, Failure};
use crate::lsn::Lsn;
use crate::sink::kafka::{
    is_unused_group_refusal, reader_metadata, untrusted_error, ReaderContext, ReaderError,
};
use crate::timestamp::{pg_micros_to_unix_micros, rfc3339_micros, rfc3339_now};

/// Shortest gap between two progress records written because the frontier moved.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// How far before the last confirmed commit a republish should start: transactions that were
/// still open then may commit after it with rows inserted before it.
pub const REPUBLISH_MARGIN_MICROS: i64 = 10 * 60 * 1_000_000;

/// One progress record, as stored (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressRecord {
    /// The slot.
    pub slot: String,
    /// The database the slot decodes.
    pub database: String,
    /// `IDENTIFY_SYSTEM`'s system identifier of the cluster.
    pub system_identifier: String,
    /// The position confirmed to PostgreSQL (`confirmed_flush_lsn` as walbox set it); in
    /// exactly-once mode, the position committed to Kafka.
    pub confirmed_lsn: Lsn,
    /// Commit time (Unix microseconds) of the newest transaction confirmed, when known.
    pub confirmed_commit_time_us: Option<i64>,
    /// When the record was written, RFC 3339.
    pub written_at: String,
    /// `IDENTIFY_SYSTEM`'s timeline of the server the writer streamed from (`None`: written by
    /// a walbox that did not record it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<u32>,
    /// The slot's generation: its `restart_lsn` when the writing session started
    /// (`recreate-slot`'s reset record: the point the slot was made at). The same slot never
    /// confirms less again, crash or restart in between; a slot below it is another one of
    /// that name (`None`: not recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_floor: Option<Lsn>,
    /// The walbox process that wrote it ([`writer_id`]; `None`: not recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer: Option<String>,
}

/// This process's identity in the progress records it writes: its pid and the time it first
/// wrote one, unique among the processes that share a slot (an exactly-once process tells
/// its own records from another's by it).
pub fn writer_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{}-{nanos:x}", std::process::id())
    })
}

/// Where a record's positions are valid: the timeline and the slot generation of the session
/// that writes it (see [`ProgressRecord::timeline`] and [`ProgressRecord::slot_floor`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lineage {
    /// The server's timeline.
    pub timeline: u32,
    /// The slot's `restart_lsn` when the session started.
    pub slot_floor: Lsn,
}

impl ProgressRecord {
    /// A record for `key`'s slot at `confirmed_lsn`, written on `lineage`; `commit_time` in
    /// PostgreSQL microseconds.
    pub fn new(
        key: &ProgressKey,
        lineage: Lineage,
        confirmed_lsn: Lsn,
        commit_time: Option<i64>,
    ) -> Self {
        ProgressRecord {
            slot: key.slot.clone(),
            database: key.database.clone(),
            system_identifier: key.system_identifier.clone(),
            confirmed_lsn,
            confirmed_commit_time_us: commit_time.map(pg_micros_to_unix_micros),
            written_at: rfc3339_now(),
            timeline: Some(lineage.timeline),
            slot_floor: Some(lineage.slot_floor),
            writer: Some(writer_id().to_owned()),
        }
    }

    /// The time from which a republish covers every event after `confirmed_lsn`: the newest
    /// confirmed commit (or, when unknown, the time of writing) minus
    /// [`REPUBLISH_MARGIN_MICROS`], RFC 3339.
    pub fn republish_since(&self) -> String {
        let base = self
            .confirmed_commit_time_us
            .or_else(|| {
                crate::timestamp::parse_timestamptz_ms(&self.written_at).map(|ms| ms * 1000)
            })
            .unwrap_or(0);
        rfc3339_micros(base - REPUBLISH_MARGIN_MICROS, 0)
    }

    /// When the newest confirmed transaction committed, RFC 3339 (or "unknown").
    pub fn confirmed_commit_time(&self) -> String {
        self.confirmed_commit_time_us
            .map(|t| rfc3339_micros(t, 3))
            .unwrap_or_else(|| "unknown".into())
    }
}

/// The `walbox republish` command that produces every row inserted from `since` (RFC 3339) on,
/// runnable as printed: with `--time-column` naming `time_column` (see
/// `crate::source::catalog::time_column`). Without a time column no `--since` can work, and the
/// way is by id: `walbox audit` lists the rows missing from Kafka.
pub fn republish_command(since: &str, time_column: Option<&str>) -> String {
    match time_column {
        Some(column) => {
            let plain = !column.is_empty()
                && column
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_');
            let column = if plain {
                column.to_owned()
            } else {
                format!("'{}'", column.replace('\'', "'\\''"))
            };
            format!("`walbox republish --since '{since}' --time-column {column}`")
        }
        None => "`walbox audit` (the outbox table has no time column for --since: audit lists the rows missing from Kafka), then `walbox republish --since-id <the first missing id>`".to_owned(),
    }
}

/// Which slot a record is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgressKey {
    /// The cluster's system identifier.
    pub system_identifier: String,
    /// The database.
    pub database: String,
    /// The slot.
    pub slot: String,
}

impl ProgressKey {
    /// The record key: `<system identifier>/<database>/<slot>`.
    pub fn record_key(&self) -> String {
        format!("{}/{}/{}", self.system_identifier, self.database, self.slot)
    }
}

/// The progress topic could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub enum ProgressError {
    /// Kafka failed.
    #[error(
        "cannot read progress topic {topic:?}: {error}{}",
        acl_advice(error, topic)
    )]
    Kafka {
        /// The topic.
        topic: String,
        /// The cause.
        error: KafkaError,
    },
    /// The topic is not there.
    #[error("progress topic {0:?} does not exist")]
    MissingTopic(String),
    /// It took too long.
    #[error("cannot read progress topic {0:?} to its end in time")]
    Timeout(String),
    /// Another broker could not be read (its message names where walbox looked).
    #[error("cannot read the progress record: {0}")]
    Broker(#[from] super::ack::BrokerError),
    /// What the broker holds there is not a progress record.
    #[error("the progress record at {place} is not walbox's: {error}")]
    Malformed {
        /// Where it was read.
        place: String,
        /// Why it does not parse.
        error: String,
    },
}

impl Classify for ProgressError {
    /// Retried (walbox waits until it can tell whether a missing slot existed), unless the
    /// brokers refused the principal: exit 4 for its credentials, 9 for a missing ACL
    /// (`failure::kafka`).
    fn failure(&self) -> Option<Failure> {
        match self {
            ProgressError::Kafka { error, .. } => kafka_error(error).fatal(),
            ProgressError::Broker(e) => e.class.fatal(),
            // Something else writes there: walbox cannot tell whether its slot existed.
            ProgressError::Malformed { .. } => Some(Failure::Config),
            ProgressError::MissingTopic(_) | ProgressError::Timeout(_) => None,
        }
    }
}

/// The ACL a refusal to read `topic` asks for (empty for any other error).
fn acl_advice(error: &KafkaError, topic: &str) -> String {
    match error.rdkafka_error_code() {
        Some(RDKafkaErrorCode::TopicAuthorizationFailed) => format!(
            " (grant walbox's principal Read on the topic: kafka-acls.sh --add --allow-principal User:<walbox> --operation Read --topic {topic})"
        ),
        _ => String::new(),
    }
}

/// How many offsets the first step of a backwards read covers; each further step (further
/// back) covers twice as many as the one before.
const FIRST_STEP: i64 = 1024;

/// The newest committed record for `key` in the progress topic (blocking, at most `timeout`).
/// `Ok(None)` only when the topic was read completely and holds no record for `key`.
///
/// Each partition is read from its end backwards, in steps: the newest record of `key` is the
/// last one in the first step (from the end) that holds any. The first step covers the last
/// [`FIRST_STEP`] offsets, each further one twice as many as the one before, so the read
/// costs what lies between the end and the key's newest record (at most twice that), never
/// what lies before it. A slot writing to the topic finds its record in the first step; an
/// idle slot's record lies further back, behind the records written since, of which
/// compaction leaves one per key once their segment rolled (see docs/operations.md for the
/// topic settings that keep the uncompacted end small).
///
/// Records of aborted or open transactions are not read. A step ends once the committed
/// view reached its end; for the step at the end that is the high watermark read at the
/// start, so that another producer's open transaction cannot hide this slot's newer records:
/// the read then waits for that transaction to end, and times out when it outlives `timeout`.
/// Across partitions (a topic that gained partitions) the newest by record timestamp wins.
pub fn read_last(
    config: &KafkaConfig,
    key: &ProgressKey,
    timeout: Duration,
) -> Result<Option<ProgressRecord>, ProgressError> {
    let topic = config.progress_topic.as_str();
    let kafka = |error| ProgressError::Kafka {
        topic: topic.to_owned(),
        error,
    };
    // Its settings (committed records, to each partition's end) are the role's.
    let mut cc = config.client_config(KafkaRole::ProgressReader);
    let consumer: BaseConsumer<ReaderContext> = cc
        .create_with_context(ReaderContext::default())
        .map_err(kafka)?;
    // ListOffsets answers a read_committed client with the last stable offset: the high
    // watermarks come from a read_uncommitted one.
    cc.set("isolation.level", "read_uncommitted");
    let watermarks: BaseConsumer<ReaderContext> = cc
        .create_with_context(ReaderContext::default())
        .map_err(kafka)?;
    let started = Instant::now();
    let mut read = Read {
        consumer: &consumer,
        topic,
        wanted: key.record_key(),
        deadline: started + timeout,
        records: 0,
        waiting: false,
    };
    let found = read.newest(&watermarks, key);
    if let Ok(found) = &found {
        tracing::info!(
            topic,
            records_read = read.records,
            found = found.is_some(),
            took_ms = started.elapsed().as_millis() as u64,
            "read the progress topic from its end"
        );
    }
    super::kafka::close_in_background("progress-reader-close", (consumer, watermarks));
    found
}

/// A record of the key: its timestamp (milliseconds) and its value.
type Found = (i64, Option<Vec<u8>>);

/// One backwards read of the progress topic ([`read_last`]): `consumer` reads
/// `read_committed`.
struct Read<'a> {
    consumer: &'a BaseConsumer<ReaderContext>,
    topic: &'a str,
    /// The record key looked for.
    wanted: String,
    deadline: Instant,
    /// Records delivered so far (any key).
    records: u64,
    /// Whether the wait for another producer's open transaction was logged.
    waiting: bool,
}

impl Read<'_> {
    fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// The read's error: a TLS handshake that failed on a certificate, when the client
    /// reported one (exit 4, whatever `error` says), or `error`.
    fn kafka(&self, error: KafkaError) -> ProgressError {
        if let Some(line) = self.consumer.context().untrusted() {
            return ProgressError::Broker(untrusted_error(line));
        }
        ProgressError::Kafka {
            topic: self.topic.to_owned(),
            error,
        }
    }

    /// The newest record of the key in any partition; `watermarks` answers with high
    /// watermarks (read_uncommitted).
    fn newest(
        &mut self,
        watermarks: &BaseConsumer<ReaderContext>,
        key: &ProgressKey,
    ) -> Result<Option<ProgressRecord>, ProgressError> {
        let topic = self.topic;
        let md = reader_metadata(self.consumer, Some(topic), self.left()).map_err(|e| match e {
            ReaderError::Kafka(e) => self.kafka(e),
            ReaderError::Untrusted(line) => ProgressError::Broker(untrusted_error(line)),
        })?;
        let partitions: Vec<i32> = md
            .topics()
            .iter()
            .filter(|t| t.name() == topic && t.error().is_none())
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        if partitions.is_empty() {
            return Err(ProgressError::MissingTopic(topic.to_owned()));
        }
        let mut newest: Option<(i64, ProgressRecord)> = None;
        for p in partitions {
            let (low, high) = watermarks
                .fetch_watermarks(topic, p, self.left())
                .map_err(|e| self.kafka(e))?;
            if let Some((at, value)) = self.last_in(p, low, high)? {
                if newest.as_ref().is_none_or(|(t, _)| at > *t) {
                    newest = Some((at, parse(value.as_deref(), key)));
                }
            }
        }
        Ok(newest.map(|(_, r)| r))
    }

    /// The last record of the key in partition `p` between `low` and `high` (the high
    /// watermark): its timestamp and value. Steps back from `high`, each step twice as long.
    fn last_in(&mut self, p: i32, low: i64, high: i64) -> Result<Option<Found>, ProgressError> {
        let (mut end, mut step) = (high, FIRST_STEP);
        while end > low {
            let start = end.saturating_sub(step).max(low);
            if let Some(found) = self.step(p, start, end)? {
                return Ok(Some(found));
            }
            end = start;
            step = step.saturating_mul(2);
        }
        Ok(None)
    }

    /// Reads partition `p` from `start` until the committed view reaches `end`; the last
    /// record of the key below `end`.
    fn step(&mut self, p: i32, start: i64, end: i64) -> Result<Option<Found>, ProgressError> {
        let topic = self.topic;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, Offset::Offset(start))
            .map_err(|e| self.kafka(e))?;
        self.consumer.assign(&tpl).map_err(|e| self.kafka(e))?;
        let mut found = None;
        loop {
            if self.left().is_zero() {
                return Err(ProgressError::Timeout(topic.to_owned()));
            }
            match self
                .consumer
                .poll(self.left().min(Duration::from_millis(200)))
            {
                Some(Ok(m)) if m.partition() == p => {
                    if m.offset() >= end {
                        return Ok(found);
                    }
                    self.records += 1;
                    if m.key() == Some(self.wanted.as_bytes()) {
                        let at = m.timestamp().to_millis().unwrap_or(0);
                        found = Some((at, m.payload().map(<[u8]>::to_vec)));
                    }
                    if m.offset() + 1 >= end {
                        return Ok(found);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(KafkaError::PartitionEOF(q))) if q == p => {
                    // Under read_committed the end is the last stable offset: an open
                    // transaction of another producer (another shard or deployment) hides
                    // every record after its first one, this slot's newer ones included. Done
                    // only once the committed view reached the step's end.
                    let at = position_of(self.consumer, topic, p);
                    if at >= end {
                        return Ok(found);
                    }
                    if !self.waiting {
                        self.waiting = true;
                        tracing::info!(
                            topic, partition = p, committed_up_to = at, high_watermark = end,
                            "an open kafka transaction of another producer hides newer records of the progress topic; waiting for it to end (at most transaction.timeout.ms)"
                        );
                    }
                }
                Some(Err(KafkaError::PartitionEOF(_))) => {}
                Some(Err(e)) if is_unused_group_refusal(&e) => {
                    tracing::debug!(error = %e, "the progress reader's group is refused; it uses none");
                }
                Some(Err(e)) => return Err(self.kafka(e)),
                // Markers, or a transaction that ended with nothing more to deliver (aborted,
                // say), move the position without a record.
                None => {
                    if position_of(self.consumer, topic, p) >= end {
                        return Ok(found);
                    }
                }
            }
        }
    }
}

/// `key`'s record from its stored `value`. A record that cannot be read still proves the slot
/// existed: it counts as one at position 0/0, of no known lineage.
fn parse(value: Option<&[u8]>, key: &ProgressKey) -> ProgressRecord {
    match value.map(serde_json::from_slice::<ProgressRecord>) {
        Some(Ok(r)) => r,
        _ => ProgressRecord {
            slot: key.slot.clone(),
            database: key.database.clone(),
            system_identifier: key.system_identifier.clone(),
            confirmed_lsn: Lsn::ZERO,
            confirmed_commit_time_us: None,
            written_at: "unknown".into(),
            timeline: None,
            slot_floor: None,
            writer: None,
        },
    }
}

/// Writes `key`'s progress record at `at` outside any transaction (visible to every reader at
/// once; blocking, at most `timeout`): `walbox recreate-slot`'s reset record, so that the new
/// slot is never measured against a record of the one it replaces. Its generation is the new
/// slot's start `at`, on the server's `timeline`.
pub fn write_reset(
    config: &KafkaConfig,
    key: &ProgressKey,
    timeline: u32,
    at: Lsn,
    timeout: Duration,
) -> Result<(), ProgressError> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let topic = config.progress_topic.as_str();
    let kafka = |error| ProgressError::Kafka {
        topic: topic.to_owned(),
        error,
    };
    // The relay's producer settings: the record lands where the relay's records of the key do.
    let producer: BaseProducer = config
        .client_config(KafkaRole::Producer)
        .create()
        .map_err(kafka)?;
    let lineage = Lineage {
        timeline,
        slot_floor: at,
    };
    let record = ProgressRecord::new(key, lineage, at, None);
    // Strings and integers only: encoding cannot fail.
    let value = serde_json::to_vec(&record).unwrap_or_default();
    let record_key = key.record_key();
    producer
        .send(BaseRecord::to(topic).key(&record_key).payload(&value))
        .map_err(|(e, _)| kafka(e))?;
    producer.flush(timeout).map_err(kafka)
}

/// The consumer's next offset in `topic`'s partition `p` (0 when unknown).
fn position_of(consumer: &BaseConsumer<ReaderContext>, topic: &str, p: i32) -> i64 {
    consumer
        .position()
        .ok()
        .and_then(|tpl| match tpl.find_partition(topic, p)?.offset() {
            Offset::Offset(at) => Some(at),
            _ => None,
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a client with `context` logs (at warn level and above) while it reads an empty
    /// partition of the mock cluster to its end.
    fn logged_reading_to_the_end<C: rdkafka::consumer::ConsumerContext + 'static>(
        context: C,
    ) -> String {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mock = rdkafka::mocking::MockCluster::new(1).unwrap();
        mock.create_topic("t", 1, 1).unwrap();
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let consumer: BaseConsumer<C> = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", mock.bootstrap_servers())
                .set("group.id", "eof")
                .set("enable.partition.eof", "true")
                .create_with_context(context)
                .unwrap();
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset("t", 0, Offset::Beginning).unwrap();
            consumer.assign(&tpl).unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                assert!(Instant::now() < deadline, "no partition end");
                if let Some(Err(KafkaError::PartitionEOF(_))) =
                    consumer.poll(Duration::from_millis(100))
                {
                    break;
                }
            }
        });
        let text = String::from_utf8_lossy(&buffer.0.lock().unwrap()).into_owned();
        text
    }

    #[test]
    fn reaching_a_partitions_end_logs_no_error() {
        // librdkafka reports the end as an error event: rdkafka's default context logs it at
        // error level, which is what the readers' context must not do.
        let default = logged_reading_to_the_end(rdkafka::consumer::DefaultConsumerContext);
        assert!(default.contains("PartitionEOF"), "{default}");
        let reader = logged_reading_to_the_end(ReaderContext::default());
        assert!(!reader.contains("PartitionEOF"), "{reader}");
    }

    /// The backwards steps find each key's newest record wherever it lies: at the end, far
    /// back (several steps, each twice as long), in the first record; and a key the topic
    /// does not hold only after the whole partition was read.
    #[test]
    fn the_newest_record_of_a_key_is_found_stepping_back_from_the_end() {
        use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
        let mock = rdkafka::mocking::MockCluster::new(1).unwrap();
        mock.create_topic("progress", 1, 1).unwrap();
        let producer: BaseProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", mock.bootstrap_servers())
            .create()
            .unwrap();
        let key = |slot: &str| ProgressKey {
            system_identifier: "1".into(),
            database: "app".into(),
            slot: slot.into(),
        };
        let lineage = Lineage::default();
        const RECORDS: u64 = 20_000;
        for n in 0..RECORDS {
            // "first" at offset 0 only; "far" at 10 and 3,000; "busy" at every other offset;
            // "last" at the last one.
            let slot = match n {
                0 => "first",
                10 | 3_000 => "far",
                n if n == RECORDS - 1 => "last",
                n if n % 2 == 0 => "busy",
                _ => "other",
            };
            let record = ProgressRecord::new(&key(slot), lineage, Lsn(n), None);
            let value = serde_json::to_vec(&record).unwrap();
            producer
                .send(
                    BaseRecord::to("progress")
                        .key(&key(slot).record_key())
                        .payload(&value),
                )
                .map_err(|(e, _)| e)
                .unwrap();
        }
        producer.flush(Duration::from_secs(30)).unwrap();
        let mut config = KafkaConfig::for_brokers(mock.bootstrap_servers());
        config.progress_topic = "progress".into();
        let found = |slot: &str| {
            read_last(&config, &key(slot), Duration::from_secs(30))
                .unwrap()
                .map(|r| r.confirmed_lsn)
        };
        assert_eq!(found("last"), Some(Lsn(RECORDS - 1)));
        assert_eq!(found("busy"), Some(Lsn(RECORDS - 2)));
        assert_eq!(found("far"), Some(Lsn(3_000)));
        assert_eq!(found("first"), Some(Lsn(0)));
        assert_eq!(found("never"), None);
    }

    #[test]
    fn a_refused_principal_stops_and_is_told_the_acl_while_the_rest_is_retried() {
        let error = |code| ProgressError::Kafka {
            topic: "walbox.progress".into(),
            error: KafkaError::MessageConsumption(code),
        };
        let denied = error(RDKafkaErrorCode::TopicAuthorizationFailed);
        assert_eq!(denied.failure(), Some(Failure::Kafka));
        let message = denied.to_string();
        assert!(
            message.contains("--operation Read --topic walbox.progress"),
            "{message}"
        );
        let auth = error(RDKafkaErrorCode::SaslAuthenticationFailed);
        assert_eq!(auth.failure(), Some(Failure::Auth));
        let down = error(RDKafkaErrorCode::AllBrokersDown);
        assert_eq!(down.failure(), None);
        assert!(!down.to_string().contains("kafka-acls"));
        assert_eq!(ProgressError::Timeout("t".into()).failure(), None);
    }

    #[test]
    fn record_round_trips_and_suggests_a_margin() {
        let key = ProgressKey {
            system_identifier: "7300000000000000001".into(),
            database: "app".into(),
            slot: "walbox".into(),
        };
        assert_eq!(key.record_key(), "7300000000000000001/app/walbox");
        // 2026-12-01T10:00:00Z in PostgreSQL microseconds.
        let commit = 1_796_119_200_000_000 - crate::timestamp::PG_EPOCH_OFFSET_MICROS;
        let lineage = Lineage {
            timeline: 2,
            slot_floor: "0/1000000".parse().unwrap(),
        };
        let r = ProgressRecord::new(&key, lineage, "0/16B3748".parse().unwrap(), Some(commit));
        let json = serde_json::to_vec(&r).unwrap();
        let back: ProgressRecord = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, r);
        assert_eq!(r.confirmed_commit_time(), "2026-12-01T10:00:00.000Z");
        assert_eq!(r.republish_since(), "2026-12-01T09:50:00Z");
        assert_eq!(
            (r.timeline, r.slot_floor),
            (Some(2), Some(lineage.slot_floor))
        );
        // An older walbox's record has neither: it still reads.
        let old = br#"{"slot":"walbox","database":"app","system_identifier":"1","confirmed_lsn":"0/10","confirmed_commit_time_us":null,"written_at":"x"}"#;
        let old: ProgressRecord = serde_json::from_slice(old).unwrap();
        assert_eq!((old.timeline, old.slot_floor), (None, None));
    }

    #[test]
    fn the_republish_command_names_its_time_column() {
        let since = "2026-12-01T09:50:00Z";
        assert_eq!(
            republish_command(since, Some("created_at")),
            "`walbox republish --since '2026-12-01T09:50:00Z' --time-column created_at`"
        );
        assert!(republish_command(since, Some("made at")).ends_with("--time-column 'made at'`"));
        let by_id = republish_command(since, None);
        assert!(
            by_id.contains("walbox audit") && by_id.contains("--since-id"),
            "{by_id}"
        );
    }
}
