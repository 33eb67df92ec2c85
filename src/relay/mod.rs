//! One replication session: WAL → outbox events → Kafka → confirmed LSN.
//!
//! ```text
//!   PostgreSQL walsender                                   Kafka
//!        │ CopyData (XLogData / keepalive)                   ▲
//!        ▼                                                   │ produce (idempotent, acks=all)
//!   ReplicationStream ──► pgoutput::decode ──► OutboxMapper ─┴► KafkaSink
//!        ▲                                                         │ delivery reports (Ack)
//!        │ standby status (flush = frontier)                       ▼
//!        └───────────────────────────────────────────────── Checkpoint
//! ```
//!
//! The session loop is one `tokio::select!` with fixed priorities: shutdown > acks > status
//! deadline > new WAL. WAL is read only while fewer than `relay.max_in_flight` events are
//! unretired, so a slow or absent broker stops intake instead of growing memory; a large
//! transaction streams through the same window and is never held whole.
//!
//! # LSN progress
//! - The flush (and write/apply) position sent to PostgreSQL is always [`Checkpoint::frontier`]:
//!   the commit end LSN of the longest prefix of transactions whose every event the broker
//!   acknowledged. It starts at the slot's `confirmed_flush_lsn` (never 0/0: PostgreSQL 15 would
//!   accept a lower value and move the slot backwards) and only grows.
//! - Status updates go out every `postgres.status_interval` (≤ 1 s), whenever the server asks,
//!   and when acks move the frontier (at most every 20 ms), so confirmed WAL is released soon.
//! - Sessions end three ways. Shutdown: finish reading the open transaction (bounded by
//!   `relay.shutdown_timeout`), stop intake, wait (bounded) for in-flight acks, send a final
//!   status, then end the copy stream (CopyDone, the server's reply, Terminate) so the server has
//!   processed that status before the socket closes. Transient error: the same wind-down as far
//!   as the connection allows; the supervisor reconnects and PostgreSQL resends every
//!   transaction after the confirmed position. Fatal error: wind down, then stop the process;
//!   nothing past the failed event is confirmed. For a rejected event, walbox reads on (without
//!   producing) to its transaction's commit so the message can give the statement that skips
//!   exactly that transaction.
//! - A progress record (`sink::progress`) follows the acknowledged frontier: written when
//!   streaming starts, at most every second while it moves, and when the session ends. A missing
//!   slot is created only when the progress topic has no record of it.
//! - Acknowledged progress is remembered across sessions of one process (`acked_frontier`), so a
//!   reconnect resumes after it even if the last status update did not reach the server.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;

pub mod checkpoint;

use crate::config::Config;
use crate::config::{OnChange, OnInvalid};
use crate::failure::{Classify, Failure, FatalError};
use crate::health::monitor::HEARTBEAT_PREFIX;
use crate::lsn::Lsn;
use crate::metrics::{Health, Metrics};
use crate::outbox::{DeadLetter, EventPosition, OutboxError, OutboxEvent, OutboxMapper};
use crate::sink::kafka::{classify, Ack, AckQueue, KafkaSink, Severity, SinkError, PROGRESS_ROUTE};
use crate::sink::progress::{self, ProgressError, ProgressKey, ProgressRecord, PROGRESS_INTERVAL};
use crate::sink::topics::{TopicError, Topics};
use crate::source::catalog::CatalogError;
use crate::source::pgoutput::{self, DecodeError, LogicalMessage};
use crate::source::replication::{
    ReplicationError, ReplicationMessage, ReplicationStream, StandbyStatus,
};
use crate::source::session::{self, OpenError};
use crate::timestamp::{pg_micros_to_unix_micros, pg_now_micros, rfc3339_micros};
use checkpoint::Checkpoint;

/// Why a session ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Opening the session (connections, start-up checks, slot) failed.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The replication connection failed while streaming.
    #[error("postgres replication: {0}")]
    Replication(#[from] ReplicationError),
    /// A pgoutput message could not be decoded.
    #[error("cannot decode pgoutput message: {0}")]
    Decode(#[from] DecodeError),
    /// A row could not be mapped to an event.
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    /// The producer refused an event.
    #[error(transparent)]
    Send(Box<SendFailure>),
    /// The broker failed a record.
    #[error(transparent)]
    Delivery(Box<DeliveryFailure>),
    /// The server ended the replication stream.
    #[error("postgres ended the replication stream")]
    StreamEnded,
    /// A topic is missing (or could not be created) and the event cannot be dead-lettered.
    #[error("cannot publish event {id} of {source_name} at {lsn}: {error}")]
    Topic {
        /// Event id.
        id: String,
        /// `schema.table`.
        source_name: String,
        /// Commit LSN.
        lsn: Lsn,
        /// The cause.
        error: TopicError,
    },
    /// The publication sends UPDATE/DELETE/TRUNCATE of an outbox table with `on_change = "fail"`.
    #[error("{op} on outbox table {table}: an outbox is insert-only (on_change = \"fail\"); publish only inserts: ALTER PUBLICATION … SET (publish = 'insert')")]
    Change {
        /// The operation.
        op: &'static str,
        /// `schema.table`.
        table: String,
    },
    /// An outbox message was emitted outside a transaction: it has no commit to be confirmed
    /// with, and is not rolled back with the business change.
    #[error("non-transactional logical message with prefix {prefix:?} at {lsn}: emit outbox messages with pg_logical_emit_message(true, …) (walbox.emit does)")]
    NonTransactionalMessage {
        /// The prefix.
        prefix: String,
        /// Its LSN.
        lsn: Lsn,
    },
    /// The stream broke the protocol's rules.
    #[error("replication protocol violation: {0}")]
    Protocol(String),
    /// The progress topic is missing and may not be created.
    #[error("kafka.progress_topic: {0}; walbox keeps there the evidence that its slot existed (create it with one partition and cleanup.policy=compact)")]
    ProgressTopic(TopicError),
    /// The progress topic could not be read, so a missing slot cannot be told from a new one.
    #[error("replication slot is missing and {0}, so walbox cannot tell whether the slot existed before; not creating it")]
    Progress(ProgressError),
    /// The slot is missing but a progress record shows it existed: it was dropped (or the
    /// server was restored or replaced), and the events since its last confirmed position are
    /// not in any slot.
    #[error("replication slot {slot:?} existed and is gone: walbox confirmed up to {} (newest confirmed commit at {}, recorded at {} in kafka topic {topic:?}); events committed after that were not relayed and no slot holds them. walbox does not recreate a slot that existed: run `walbox recreate-slot --confirm-data-loss`, then `walbox republish --since '{}'` to republish the window from the outbox table (runbook \"Slot lost\")", record.confirmed_lsn, record.confirmed_commit_time(), record.written_at, record.republish_since())]
    SlotGone {
        /// The slot.
        slot: String,
        /// The newest progress record.
        record: Box<ProgressRecord>,
        /// The progress topic.
        topic: String,
    },
}

impl Classify for RelayError {
    fn failure(&self) -> Option<Failure> {
        match self {
            RelayError::Open(e) => e.failure(),
            RelayError::Replication(e) => e.failure(),
            RelayError::Decode(e) => e.failure(),
            RelayError::Outbox(e) => e.failure(),
            RelayError::Send(f) => f.source.failure(),
            RelayError::Delivery(f) => f.error.failure(),
            RelayError::Topic { error, .. } => error.failure(),
            RelayError::ProgressTopic(_) => Some(Failure::Schema),
            RelayError::Progress(e) => e.failure(),
            RelayError::StreamEnded => None,
            RelayError::Change { .. } => Some(Failure::Schema),
            RelayError::NonTransactionalMessage { .. } => Some(Failure::EventRejected),
            RelayError::Protocol(_) => Some(Failure::Internal),
            RelayError::SlotGone { .. } => Some(Failure::SlotLost),
        }
    }
}

impl RelayError {
    /// The commit LSN of the transaction holding an event that cannot be published, when this
    /// error is such a rejection.
    pub fn rejected_commit_lsn(&self) -> Option<Lsn> {
        if self.failure() != Some(Failure::EventRejected) {
            return None;
        }
        match self {
            RelayError::Send(f) => Some(f.lsn),
            RelayError::Delivery(f) => f.lsn.parse().ok(),
            RelayError::Outbox(OutboxError::InvalidEvent(inv)) => Some(inv.lsn),
            RelayError::Topic { lsn, .. } => Some(*lsn),
            _ => None,
        }
    }

    /// Whether the server stopped decoding because the publication does not exist (SQLSTATE
    /// 42704 from the walsender, e.g. after `DROP PUBLICATION` while streaming).
    pub fn publication_missing(&self) -> bool {
        matches!(self, RelayError::Replication(e)
            if e.sqlstate() == Some("42704") && e.to_string().contains("publication"))
    }
}

/// The transaction of an event that cannot be published, located for the operator.
#[derive(Debug, Clone, Copy)]
struct RejectedTxn {
    commit_lsn: Lsn,
    /// Its commit end LSN: advancing the slot there skips it.
    end_lsn: Option<Lsn>,
    /// Every transaction before it is confirmed, so the advance skips nothing else.
    exact: bool,
}

impl RejectedTxn {
    fn advice(&self, slot: &str) -> String {
        let commit = self.commit_lsn;
        match self.end_lsn {
            Some(end) if self.exact => format!(
                "to drop exactly this transaction (commit {commit}, end {end}) and nothing else, with walbox stopped run: SELECT pg_replication_slot_advance({}, '{end}'); then start walbox",
                postgres_protocol::escape::escape_literal(slot)
            ),
            Some(end) => format!(
                "its transaction ends at {end}, but the transactions before it were not all acknowledged yet: restart walbox once (it stops here again with everything before it confirmed) to get the statement that drops exactly this transaction (commit {commit})"
            ),
            None => format!(
                "the end of its transaction (commit {commit}) could not be read in time: restart walbox to get the statement that drops exactly this transaction"
            ),
        }
    }
}

/// An event the producer refused before it reached the broker.
#[derive(Debug, thiserror::Error)]
#[error("cannot publish event {id} of {table} at {lsn} to topic {topic:?}: {source}")]
pub struct SendFailure {
    /// `schema.table`.
    pub table: String,
    /// Event id.
    pub id: String,
    /// Commit LSN.
    pub lsn: Lsn,
    /// Topic.
    pub topic: String,
    /// The producer's error.
    #[source]
    pub source: SinkError,
}

/// A record the broker failed.
#[derive(Debug, thiserror::Error)]
#[error("kafka failed to deliver event {id} at {lsn} to topic {topic:?}: {}", crate::sink::kafka::describe_delivery_error(.error))]
pub struct DeliveryFailure {
    /// Event id (from the record's header).
    pub id: String,
    /// Commit LSN (from the record's header).
    pub lsn: String,
    /// Topic.
    pub topic: String,
    /// The error.
    pub error: rdkafka::error::KafkaError,
}

/// The dead-letter record replacing `event`.
fn dead_letter_for(event: &OutboxEvent, topic: &str, reason: &str) -> OutboxEvent {
    DeadLetter {
        topic,
        id: &String::from_utf8_lossy(&event.id),
        source: &event.source,
        position: event.position,
        error: reason,
        key: event.key.clone(),
        payload: event.value.clone(),
    }
    .into_event()
}

fn send_failure(event: &OutboxEvent, source: SinkError) -> RelayError {
    RelayError::Send(Box::new(SendFailure {
        table: event.source.to_string(),
        id: String::from_utf8_lossy(&event.id).into_owned(),
        lsn: event.position.commit_lsn,
        topic: event.topic.clone(),
        source,
    }))
}

/// Position of the transaction being received.
#[derive(Debug, Clone, Copy)]
struct OpenTxn {
    commit_lsn: Lsn,
    commit_time: i64,
    next_index: u32,
}

impl OpenTxn {
    /// The position of the next outbox event, which it then reserves.
    fn next_position(&mut self) -> EventPosition {
        let p = EventPosition {
            commit_lsn: self.commit_lsn,
            index: self.next_index,
            commit_time: self.commit_time,
        };
        self.next_index += 1;
        p
    }
}

/// State of one session.
struct Session {
    stream: ReplicationStream,
    checkpoint: Checkpoint,
    mapper: OutboxMapper,
    txn: Option<OpenTxn>,
    /// When an ignored change to each outbox table was last logged.
    change_warned: HashMap<usize, Instant>,
    /// Records handed to the sink and not yet reported back.
    outstanding: usize,
    last_status: Lsn,
    last_status_at: Instant,
}

/// Shortest gap between status updates sent because the frontier moved (the periodic ones
/// come every `postgres.status_interval` regardless).
const EAGER_STATUS_GAP: Duration = Duration::from_millis(20);

/// How long reading the progress topic may take when the slot is missing.
const PROGRESS_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long, after a rejected event, walbox reads on to find the end of its transaction.
const LOCATE_TIMEOUT: Duration = Duration::from_secs(30);

/// Messages handled from the read buffer per wake-up before acks and deadlines are looked at
/// again.
const MAX_BURST: usize = 1024;

/// How a session ended without error.
#[derive(Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// Shutdown was requested.
    Shutdown,
}

/// The relay: owns the producer across sessions; see the module docs.
pub struct Relay {
    config: Arc<Config>,
    sink: KafkaSink,
    acks: Arc<AckQueue>,
    /// Reused buffer for batches of acks.
    ack_batch: Vec<Ack>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    next_seq: u64,
    acked_frontier: Lsn,
    topics: Topics,
    /// Set once a session reached streaming; the supervisor resets its backoff then.
    pub reached_streaming: bool,
    /// Which slot the progress records are about (known once a session identified the server).
    progress_key: Option<ProgressKey>,
    /// The position of the last progress record handed to the producer, and when.
    progress_lsn: Lsn,
    progress_at: Option<Instant>,
    /// Commit time (PostgreSQL microseconds) of the newest transaction confirmed.
    confirmed_commit_time: Option<i64>,
    /// The transaction of the event that stopped the last session, if one was rejected.
    rejected: Option<RejectedTxn>,
}

impl Relay {
    /// A relay with a producer whose delivery reports arrive on `acks`.
    pub fn new(
        config: Arc<Config>,
        sink: KafkaSink,
        acks: Arc<AckQueue>,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
        topics: Topics,
    ) -> Self {
        Relay {
            topics,
            ack_batch: Vec::new(),
            config,
            sink,
            acks,
            metrics,
            health,
            next_seq: 0,
            acked_frontier: Lsn::ZERO,
            reached_streaming: false,
            progress_key: None,
            progress_lsn: Lsn::ZERO,
            progress_at: None,
            confirmed_commit_time: None,
            rejected: None,
        }
    }

    /// The fatal error to stop with, when `e` is fatal, with what the operator needs to act on
    /// it: the data-loss window and the republish command for a lost slot, the statement that
    /// skips a rejected event's transaction, the way out of a dropped publication.
    pub fn into_fatal(&self, e: RelayError) -> Result<FatalError, RelayError> {
        let Some(failure) = e.failure() else {
            return Err(e);
        };
        let slot = &self.config.postgres.slot;
        let message = if let RelayError::SlotGone { .. } = e {
            e.to_string()
        } else if failure == Failure::SlotLost {
            format!(
                "replication slot {slot:?} is lost: {e}; last confirmed position {}: events committed after it may never be relayed. Run `walbox recreate-slot --confirm-data-loss`, then {} (runbook \"Slot lost\")",
                self.acked_frontier,
                self.republish_hint()
            )
        } else if failure == Failure::EventRejected {
            match &self.rejected {
                Some(r) => format!("{e}; {}", r.advice(slot)),
                None => e.to_string(),
            }
        } else if e.publication_missing() {
            format!(
                "{e}: the publication was dropped while walbox streamed (or is missing for changes after the confirmed position {}). Re-creating it alone does not help: PostgreSQL decodes each change with the catalog as of that change. Way out, with walbox stopped: create the publication again, run SELECT pg_replication_slot_advance({}, pg_current_wal_lsn()); to move the slot past the re-creation, start walbox, then {} (runbook \"Publication dropped\")",
                self.acked_frontier,
                postgres_protocol::escape::escape_literal(slot),
                self.republish_hint()
            )
        } else {
            e.to_string()
        };
        Ok(FatalError { failure, message })
    }

    /// How to republish what this process has not confirmed: the command with a `--since`
    /// [`progress::REPUBLISH_MARGIN_MICROS`] before the newest confirmed commit.
    fn republish_hint(&self) -> String {
        match self.confirmed_commit_time {
            Some(t) => format!(
                "republish the window from the outbox table with `walbox republish --since '{}'` (10 minutes before the newest confirmed commit at {}; consumers deduplicate by id)",
                rfc3339_micros(pg_micros_to_unix_micros(t) - progress::REPUBLISH_MARGIN_MICROS, 0),
                rfc3339_micros(pg_micros_to_unix_micros(t), 3)
            ),
            None => "republish the rows inserted since walbox last confirmed (walbox_confirmed_flush_lsn stopped moving) with `walbox republish --since <time>`; consumers deduplicate by id".into(),
        }
    }

    /// Highest position this process knows to be fully acknowledged.
    pub fn acked_frontier(&self) -> Lsn {
        self.acked_frontier
    }

    /// The producer (for start-up probes).
    pub fn sink(&self) -> &KafkaSink {
        &self.sink
    }

    /// Runs one session until shutdown or an error.
    pub async fn run_session(
        &mut self,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<SessionEnd, RelayError> {
        self.reached_streaming = false;
        let pg = &self.config.postgres;
        let mut open = session::open(pg, &self.config.outbox).await?;
        let key = ProgressKey {
            system_identifier: open.identity.system_id.clone(),
            database: open.identity.dbname.clone().unwrap_or_default(),
            slot: pg.slot.clone(),
        };
        let progress_topic = self.config.kafka.progress_topic.clone();
        self.topics
            .ensure_progress(&self.sink, &progress_topic)
            .await
            .map_err(RelayError::ProgressTopic)?;
        let slot = match open.slot {
            Some(s) => s,
            None => {
                // A missing slot is created only when the progress topic proves it never
                // existed; see `sink::progress`.
                let config = self.config.kafka.clone();
                let lookup = key.clone();
                let evidence = tokio::task::spawn_blocking(move || {
                    progress::read_last(&config, &lookup, PROGRESS_READ_TIMEOUT)
                })
                .await
                .unwrap_or_else(|_| Err(ProgressError::Timeout(progress_topic.clone())));
                match evidence {
                    Ok(Some(record)) => {
                        return Err(RelayError::SlotGone {
                            slot: pg.slot.clone(),
                            record: Box::new(record),
                            topic: progress_topic,
                        })
                    }
                    Ok(None) if pg.create_slot => open.create_slot(&pg.slot).await?,
                    Err(e) if pg.create_slot => return Err(RelayError::Progress(e)),
                    _ => {
                        return Err(
                            OpenError::from(CatalogError::MissingSlot(pg.slot.clone())).into()
                        )
                    }
                }
            }
        };
        if self.progress_key.as_ref() != Some(&key) {
            self.progress_key = Some(key);
            self.progress_lsn = Lsn::ZERO;
        }
        let start = slot.confirmed_flush_lsn.max(self.acked_frontier);
        // Logical messages carry heartbeats and the table-less outbox.
        let messages =
            self.config.slot.heartbeat_interval.is_some() || self.config.outbox.messages.is_some();
        let stream = open.start(pg, start, messages).await?;
        self.health.set_ready(true);
        self.metrics.streaming.set(1);
        // The slot is active: walbox streams from it (the monitor's reading may be older).
        self.metrics.slot_active.set(1);
        self.metrics.confirmed_flush_lsn.set(start.as_u64() as i64);
        self.reached_streaming = true;
        self.write_progress(start, true);
        let mut session = Session {
            stream,
            checkpoint: Checkpoint::new(start, self.next_seq),
            mapper: OutboxMapper::new(&self.config.outbox),
            txn: None,
            change_warned: HashMap::new(),
            outstanding: 0,
            last_status: start,
            last_status_at: Instant::now(),
        };
        let result = self.stream_loop(&mut session, shutdown).await;
        self.health.set_ready(false);
        self.metrics.streaming.set(0);
        let connection_alive = !matches!(
            result,
            Err(RelayError::Replication(_)) | Err(RelayError::StreamEnded)
        );
        self.wind_down(&mut session, connection_alive).await;
        self.rejected = None;
        if let Some(commit_lsn) = result
            .as_ref()
            .err()
            .and_then(RelayError::rejected_commit_lsn)
        {
            self.rejected = Some(
                self.locate(&mut session, commit_lsn, connection_alive)
                    .await,
            );
        }
        self.next_seq = session.checkpoint.next_seq();
        self.acked_frontier = self.acked_frontier.max(session.checkpoint.frontier());
        self.write_progress(self.acked_frontier, true);
        if connection_alive {
            // CopyDone, wait for the server's end of the copy, Terminate: the final status
            // update is processed before the socket closes, and the server logs no EOF.
            if let Err(e) = session.stream.finish().await {
                tracing::debug!(error = %e, "ending the replication stream");
            }
        }
        result
    }

    /// Finds the transaction of a rejected event: its end LSN (from the pending commits, or by
    /// reading the stream on to its commit, bounded) and whether everything before it is
    /// confirmed. Nothing read here is produced or confirmed.
    async fn locate(&mut self, s: &mut Session, commit_lsn: Lsn, alive: bool) -> RejectedTxn {
        let exact = match s.checkpoint.oldest_pending() {
            Some((oldest, _)) => oldest == commit_lsn,
            None => s.txn.is_some_and(|t| t.commit_lsn == commit_lsn),
        };
        let mut end_lsn = s.checkpoint.pending_end(commit_lsn);
        if end_lsn.is_none() && alive {
            let scan = async {
                while let Some(msg) = s.stream.next().await? {
                    if let ReplicationMessage::XLogData { data, .. } = msg {
                        if let Ok(LogicalMessage::Commit(c)) = pgoutput::decode(data) {
                            if c.commit_lsn == commit_lsn {
                                return Ok(Some(c.end_lsn));
                            }
                        }
                    }
                }
                Ok::<_, ReplicationError>(None)
            };
            end_lsn = match tokio::time::timeout(LOCATE_TIMEOUT, scan).await {
                Ok(Ok(end)) => end,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "reading on to the rejected transaction's commit");
                    None
                }
                Err(_) => None,
            };
        }
        RejectedTxn {
            commit_lsn,
            end_lsn,
            exact,
        }
    }

    /// Hands a progress record for `frontier` (everything up to it acknowledged by the broker)
    /// to the producer: when the frontier moved, at most every [`PROGRESS_INTERVAL`] unless
    /// `force`. Failures only cost a warning; the next record replaces this one.
    fn write_progress(&mut self, frontier: Lsn, force: bool) {
        let Some(key) = &self.progress_key else {
            return;
        };
        if frontier == Lsn::ZERO
            || (!force && frontier <= self.progress_lsn)
            || (!force
                && self
                    .progress_at
                    .is_some_and(|t| t.elapsed() < PROGRESS_INTERVAL))
        {
            return;
        }
        let record = ProgressRecord::new(key, frontier, self.confirmed_commit_time);
        let value = match serde_json::to_vec(&record) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "cannot encode the progress record");
                return;
            }
        };
        match self
            .sink
            .send_progress(&self.config.kafka.progress_topic, &key.record_key(), &value)
        {
            Ok(()) => {
                self.progress_lsn = frontier;
                self.progress_at = Some(Instant::now());
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot write the progress record; retrying with the next one")
            }
        }
    }

    async fn stream_loop(
        &mut self,
        s: &mut Session,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<SessionEnd, RelayError> {
        let mut status_tick = tokio::time::interval(self.config.postgres.status_interval);
        status_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let max_in_flight = self.config.relay.max_in_flight;
        // Once shutdown is requested, intake continues only to the end of the open transaction
        // (bounded by `relay.shutdown_timeout`): its acknowledged events are then confirmed and
        // not sent again after the restart.
        let mut draining: Option<Instant> = None;
        loop {
            if draining.is_none() && *shutdown.borrow() {
                draining = Some(Instant::now() + self.config.relay.shutdown_timeout);
            }
            if let Some(deadline) = draining {
                if s.txn.is_none() {
                    return Ok(SessionEnd::Shutdown);
                }
                if Instant::now() >= deadline {
                    tracing::warn!("stopping in the middle of a transaction; its events are sent again after restart");
                    return Ok(SessionEnd::Shutdown);
                }
            }
            let drain_deadline = draining.unwrap_or_else(Instant::now);
            tokio::select! {
                biased;
                changed = shutdown.changed(), if draining.is_none() => {
                    if changed.is_err() {
                        // The sender is gone: nobody can ask any more, so stop as asked.
                        draining = Some(Instant::now() + self.config.relay.shutdown_timeout);
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(drain_deadline.into()), if draining.is_some() => continue,
                _ = self.acks.wait() => {
                    self.take_acks(s)?;
                }
                // Confirm progress promptly (releasing WAL sooner), but at most every
                // EAGER_STATUS_GAP: never a status update per event.
                _ = tokio::time::sleep_until((s.last_status_at + EAGER_STATUS_GAP).into()),
                    if s.checkpoint.frontier() > s.last_status =>
                {
                    self.send_status(s, false).await?;
                }
                _ = status_tick.tick() => {
                    // Acks are normally taken when signalled; taking them here too bounds the
                    // delay of any report whose wake-up was consumed by a cancelled branch.
                    self.take_acks(s)?;
                    self.send_status(s, false).await?;
                }
                msg = s.stream.next(), if s.checkpoint.in_flight() < max_in_flight => {
                    let Some(msg) = msg? else {
                        return Err(RelayError::StreamEnded);
                    };
                    self.on_message(s, msg).await?;
                    // Work through what the last read already buffered before polling again:
                    // one wake-up per burst of messages, not per message.
                    let mut burst = 0;
                    while burst < MAX_BURST
                        && s.checkpoint.in_flight() < max_in_flight
                        && !(draining.is_some() && s.txn.is_none())
                    {
                        match s.stream.next_buffered()? {
                            Some(msg) => self.on_message(s, msg).await?,
                            None => break,
                        }
                        burst += 1;
                    }
                }
            }
        }
    }

    async fn on_message(
        &mut self,
        s: &mut Session,
        msg: ReplicationMessage,
    ) -> Result<(), RelayError> {
        match msg {
            ReplicationMessage::XLogData { data, .. } => self.on_wal(s, data).await,
            ReplicationMessage::Keepalive {
                wal_end,
                reply_requested,
                ..
            } => {
                s.checkpoint.keepalive(wal_end);
                if reply_requested {
                    self.send_status(s, false).await?;
                }
                Ok(())
            }
        }
    }

    /// Handles every waiting delivery report. All of them are accounted for even when one
    /// fails (the first failure is returned).
    fn take_acks(&mut self, s: &mut Session) -> Result<(), RelayError> {
        let mut batch = std::mem::take(&mut self.ack_batch);
        self.acks.drain_into(&mut batch);
        let mut first_error = None;
        for ack in batch.drain(..) {
            if ack.route == PROGRESS_ROUTE {
                if let Err(e) = ack.result {
                    // Written again at the next opportunity.
                    self.progress_lsn = Lsn::ZERO;
                    tracing::warn!(error = %e, topic = %self.config.kafka.progress_topic, "kafka failed a progress record; writing it again");
                }
                continue;
            }
            if let Err(e) = self.on_ack(s, ack) {
                first_error.get_or_insert(e);
            }
        }
        self.ack_batch = batch;
        first_error.map_or(Ok(()), Err)
    }

    fn on_ack(&mut self, s: &mut Session, ack: Ack) -> Result<(), RelayError> {
        if !s.checkpoint.owns(ack.seq) {
            return Ok(()); // from an earlier session
        }
        s.outstanding = s.outstanding.saturating_sub(1);
        match ack.result {
            Ok(()) => {
                self.metrics.events_published.inc();
                if s.checkpoint.ack(ack.seq) > 0 {
                    self.observe_confirmed(s);
                }
                Ok(())
            }
            Err(error) => {
                self.metrics.delivery_errors.inc();
                let failed = ack.failed.unwrap_or_default();
                let rejected = classify(&error) == Severity::RecordRejected;
                if let (true, OnInvalid::DeadLetter(dlq)) =
                    (rejected, &s.mapper.route(ack.route).on_invalid)
                {
                    if failed.topic != *dlq {
                        let position = EventPosition {
                            commit_lsn: failed.lsn.parse().unwrap_or_default(),
                            index: failed.index.parse().unwrap_or_default(),
                            commit_time: pg_now_micros(),
                        };
                        let reason = format!(
                            "kafka refused the record for topic {:?}: {error}",
                            failed.topic
                        );
                        let letter = DeadLetter {
                            topic: dlq,
                            id: &failed.id,
                            source: &s.mapper.route(ack.route).name,
                            position,
                            error: &reason,
                            key: failed.key.clone(),
                            payload: failed.payload.clone(),
                        }
                        .into_event();
                        return self.resend_dead_letter(s, letter, ack.seq, ack.route);
                    }
                }
                Err(RelayError::Delivery(Box::new(DeliveryFailure {
                    id: failed.id,
                    lsn: failed.lsn,
                    topic: failed.topic,
                    error,
                })))
            }
        }
    }

    fn observe_confirmed(&mut self, s: &mut Session) {
        let now = pg_now_micros();
        for c in s.checkpoint.drain_confirmed() {
            self.confirmed_commit_time = Some(c.commit_time);
            self.metrics.transactions.inc();
            self.metrics
                .commit_to_ack
                .observe((now - c.commit_time).max(0) as f64 / 1e6);
        }
    }

    async fn on_wal(&mut self, s: &mut Session, data: Bytes) -> Result<(), RelayError> {
        let message = pgoutput::decode(data)?;
        tracing::trace!(?message, "pgoutput");
        match message {
            LogicalMessage::Begin(b) => {
                s.checkpoint.begin();
                s.txn = Some(OpenTxn {
                    commit_lsn: b.final_lsn,
                    commit_time: b.commit_time,
                    next_index: 0,
                });
                self.metrics.received_lsn.set(b.final_lsn.as_u64() as i64);
            }
            LogicalMessage::Commit(c) => {
                s.txn = None;
                if s.checkpoint.commit(c.commit_lsn, c.end_lsn, c.commit_time) > 0 {
                    self.observe_confirmed(s);
                }
            }
            LogicalMessage::Relation(r) => s.mapper.relation(&r),
            LogicalMessage::Insert(ins) => {
                let Some(route) = s.mapper.route_of(ins.relation_id) else {
                    // Not an outbox table (or an unannounced relation: the mapper says which).
                    s.mapper.map_insert(&ins, EventPosition::default())?;
                    return Ok(());
                };
                let position = match s.txn.as_mut() {
                    Some(txn) => txn.next_position(),
                    None => {
                        return Err(RelayError::Protocol("INSERT outside a transaction".into()))
                    }
                };
                let mapped = s.mapper.map_insert(&ins, position);
                self.publish(s, mapped, route).await?;
            }
            LogicalMessage::Update(u) => self.outbox_change(s, u.relation_id, "UPDATE")?,
            LogicalMessage::Delete(d) => self.outbox_change(s, d.relation_id, "DELETE")?,
            LogicalMessage::Truncate(t) => {
                for id in t.relation_ids {
                    self.outbox_change(s, id, "TRUNCATE")?;
                }
            }
            LogicalMessage::Message(m) if m.prefix == HEARTBEAT_PREFIX => {
                self.on_heartbeat(&m.content)
            }
            LogicalMessage::Message(m) => {
                let Some(route) = s.mapper.message_route(&m.prefix) else {
                    return Ok(());
                };
                let position = match (m.transactional, s.txn.as_mut()) {
                    (true, Some(txn)) => txn.next_position(),
                    _ => {
                        return Err(RelayError::NonTransactionalMessage {
                            prefix: m.prefix.clone(),
                            lsn: m.lsn,
                        })
                    }
                };
                let mapped = s.mapper.map_message(&m, position);
                self.publish(s, mapped, route).await?;
            }
            LogicalMessage::Type(_) | LogicalMessage::Origin(_) => {}
        }
        Ok(())
    }

    /// Produces a mapped event, or applies the route's `on_invalid` policy to a row that could
    /// not be mapped.
    async fn publish(
        &mut self,
        s: &mut Session,
        mapped: Result<Option<OutboxEvent>, OutboxError>,
        route: usize,
    ) -> Result<(), RelayError> {
        match mapped {
            Ok(Some(event)) => self.produce(s, &event, route).await,
            Ok(None) => Ok(()),
            Err(OutboxError::InvalidEvent(inv)) => match &s.mapper.route(route).on_invalid {
                OnInvalid::Fail => Err(OutboxError::InvalidEvent(inv).into()),
                OnInvalid::DeadLetter(dlq) => {
                    tracing::warn!(source = %inv.source_name, id = %inv.id, lsn = %inv.lsn, reason = %inv.reason, topic = %dlq, "event sent to the dead-letter topic");
                    let letter = inv.dead_letter(dlq);
                    self.produce(s, &letter, route).await?;
                    self.metrics.dead_letters.inc();
                    Ok(())
                }
            },
            Err(e) => Err(e.into()),
        }
    }

    fn on_heartbeat(&self, content: &[u8]) {
        self.metrics.heartbeats_received.inc();
        let sent = serde_json::from_slice::<serde_json::Value>(content)
            .ok()
            .and_then(|v| v.get("sent_at_us").and_then(serde_json::Value::as_i64));
        if let Some(sent) = sent {
            let rtt = (pg_now_micros() - sent).max(0) as f64 / 1e6;
            self.metrics.heartbeat_round_trip.observe(rtt);
            tracing::debug!(round_trip_s = rtt, "heartbeat received");
        }
    }

    /// An UPDATE, DELETE or TRUNCATE: never an event. Warns (once a minute per table) or fails,
    /// per the table's `on_change`.
    fn outbox_change(
        &self,
        s: &mut Session,
        relation_id: u32,
        op: &'static str,
    ) -> Result<(), RelayError> {
        let Some(route) = s.mapper.route_of(relation_id) else {
            return Ok(());
        };
        let r = s.mapper.route(route);
        if r.on_change == OnChange::Fail {
            return Err(RelayError::Change {
                op,
                table: r.name.to_string(),
            });
        }
        let now = Instant::now();
        let due = s
            .change_warned
            .get(&route)
            .is_none_or(|at| now.duration_since(*at) >= Duration::from_secs(60));
        if due {
            s.change_warned.insert(route, now);
            tracing::warn!(table = %r.name, op, "change to an outbox table is not an event; ignored (repeats are logged once a minute; publish only inserts: ALTER PUBLICATION … SET (publish = 'insert'))");
        }
        Ok(())
    }

    async fn produce(
        &mut self,
        s: &mut Session,
        event: &OutboxEvent,
        route: usize,
    ) -> Result<(), RelayError> {
        if let Err(error) = self.topics.ensure(&self.sink, &event.topic).await {
            if let OnInvalid::DeadLetter(dlq) = &s.mapper.route(route).on_invalid {
                if event.topic != *dlq {
                    let letter = dead_letter_for(event, dlq, &error.to_string());
                    self.metrics.dead_letters.inc();
                    return Box::pin(self.produce(s, &letter, route)).await;
                }
            }
            return Err(RelayError::Topic {
                id: String::from_utf8_lossy(&event.id).into_owned(),
                source_name: event.source.to_string(),
                lsn: event.position.commit_lsn,
                error,
            });
        }
        let seq = s.checkpoint.next_seq();
        self.send(s, event, seq, route).await?;
        let assigned = s.checkpoint.event();
        debug_assert_eq!(assigned, seq);
        s.outstanding += 1;
        Ok(())
    }

    /// Hands a record to the sink, waiting while librdkafka's queue is full; a record the
    /// producer refuses outright is dead-lettered (when the route says so) or an error.
    async fn send(
        &mut self,
        s: &mut Session,
        event: &OutboxEvent,
        seq: u64,
        route: usize,
    ) -> Result<(), RelayError> {
        loop {
            match self.sink.send(event, seq, route) {
                Ok(()) => return Ok(()),
                Err(SinkError::QueueFull) => {
                    // librdkafka's queue is smaller than the in-flight cap: let it drain.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(SinkError::Send(e)) if classify(&e) == Severity::RecordRejected => {
                    match &s.mapper.route(route).on_invalid {
                        OnInvalid::DeadLetter(dlq) if event.topic != *dlq => {
                            let reason = format!(
                                "kafka refused the record for topic {:?}: {e}",
                                event.topic
                            );
                            let letter = dead_letter_for(event, dlq, &reason);
                            self.metrics.dead_letters.inc();
                            return Box::pin(self.send(s, &letter, seq, route)).await;
                        }
                        _ => return Err(send_failure(event, SinkError::Send(e))),
                    }
                }
                Err(source) => return Err(send_failure(event, source)),
            }
        }
    }

    /// Re-sends a failed record's dead letter under the same sequence number.
    fn resend_dead_letter(
        &mut self,
        s: &mut Session,
        letter: OutboxEvent,
        seq: u64,
        route: usize,
    ) -> Result<(), RelayError> {
        match self.sink.send(&letter, seq, route) {
            Ok(()) => {
                s.outstanding += 1;
                self.metrics.dead_letters.inc();
                tracing::warn!(id = %String::from_utf8_lossy(&letter.id), topic = %letter.topic, "kafka refused an event; sent to the dead-letter topic");
                Ok(())
            }
            Err(source) => Err(send_failure(&letter, source)),
        }
    }

    async fn send_status(&mut self, s: &mut Session, reply: bool) -> Result<(), RelayError> {
        let frontier = s.checkpoint.frontier();
        self.update_gauges(s);
        if frontier == Lsn::ZERO {
            return Ok(());
        }
        s.stream
            .send_status(StandbyStatus {
                write: frontier,
                flush: frontier,
                apply: frontier,
                reply_requested: reply,
            })
            .await?;
        s.last_status_at = Instant::now();
        if frontier != s.last_status {
            tracing::debug!(lsn = %frontier, "confirmed");
            s.last_status = frontier;
        }
        self.write_progress(frontier, false);
        Ok(())
    }

    fn update_gauges(&self, s: &Session) {
        let m = &self.metrics;
        m.inflight.set(s.checkpoint.in_flight() as i64);
        m.confirmed_flush_lsn
            .set(s.checkpoint.frontier().as_u64() as i64);
        let lag = if s.checkpoint.is_idle() {
            0.0
        } else {
            s.checkpoint
                .newest_confirmed()
                .map(|c| (pg_now_micros() - c.commit_time).max(0) as f64 / 1e6)
                .unwrap_or(0.0)
        };
        m.replication_lag.set(lag);
    }

    /// Stops intake, waits (bounded) for outstanding delivery reports, and — when the
    /// connection is still usable — sends a final status update and ends the stream.
    async fn wind_down(&mut self, s: &mut Session, connection_alive: bool) {
        let deadline = Instant::now() + self.config.relay.shutdown_timeout;
        loop {
            if let Err(e) = self.take_acks(s) {
                tracing::warn!(error = %e, "delivery failed while stopping; the event will be sent again after restart");
            }
            if s.outstanding == 0 {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let acks = self.acks.clone();
            match tokio::time::timeout(left, acks.wait()).await {
                Ok(()) => {}
                Err(_) => {
                    tracing::warn!(
                        outstanding = s.outstanding,
                        "gave up waiting for kafka acknowledgements; unacknowledged events will be sent again after restart"
                    );
                    break;
                }
            }
        }
        self.update_gauges(s);
        if connection_alive {
            if let Err(e) = self.send_status(s, false).await {
                tracing::debug!(error = %e, "final status update failed");
            }
        }
        tracing::info!(confirmed = %s.checkpoint.frontier(), "replication session ended");
    }

    /// Ends the relay: hands back the sink so the caller can flush it.
    pub fn into_sink(self) -> KafkaSink {
        self.sink
    }
}
