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
//! - Status updates go out every `postgres.status_interval` (≤ 1 s) and whenever the server asks.
//! - Sessions end three ways. Shutdown: stop intake, wait (bounded) for in-flight acks, send a
//!   final status, exit. Transient error: the same wind-down as far as the connection allows; the
//!   supervisor reconnects and PostgreSQL resends every transaction after the confirmed position.
//!   Fatal error: wind down, then stop the process; nothing past the failed event is confirmed.
//! - Acknowledged progress is remembered across sessions of one process (`acked_frontier`), so a
//!   reconnect resumes after it even if the last status update did not reach the server.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use crate::checkpoint::Checkpoint;
use crate::config::Config;
use crate::failure::{Failure, FatalError};
use crate::metrics::{Health, Metrics};
use crate::monitor::HEARTBEAT_PREFIX;
use crate::outbox::{EventPosition, OutboxError, OutboxEvent, OutboxMapper};
use crate::sink::kafka::{classify, Ack, KafkaSink, Severity, SinkError};
use crate::source::catalog::{self, CatalogError};
use crate::source::conninfo::{connect_control, ConnectError};
use crate::source::lsn::Lsn;
use crate::source::pgoutput::{self, DecodeError, LogicalMessage};
use crate::source::replication::{
    ReplicationConnection, ReplicationError, ReplicationMessage, ReplicationStream, StandbyStatus,
};

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

/// Now, in microseconds since 2000-01-01.
pub fn pg_now_micros() -> i64 {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0);
    unix - PG_EPOCH_OFFSET_MICROS
}

/// Why a session ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The control connection failed.
    #[error("postgres control connection: {0}")]
    Control(#[from] ConnectError),
    /// A start-up check failed.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// The replication connection failed.
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
    /// The stream broke the protocol's rules.
    #[error("replication protocol violation: {0}")]
    Protocol(String),
}

impl RelayError {
    /// `None` for transient errors (reconnect), else the fatal failure kind.
    pub fn failure(&self) -> Option<Failure> {
        match self {
            RelayError::Control(ConnectError::Tls(_)) => Some(Failure::Auth),
            RelayError::Control(e) if e.certificate_rejected() => Some(Failure::Auth),
            RelayError::Control(e) => e
                .sqlstate()
                .and_then(|c| Failure::from_sqlstate(c, &e.to_string())),
            RelayError::Catalog(CatalogError::Query(e)) => e
                .code()
                .and_then(|c| Failure::from_sqlstate(c.code(), &e.to_string())),
            RelayError::Catalog(CatalogError::SlotLost { .. }) => Some(Failure::SlotLost),
            RelayError::Catalog(_) => Some(Failure::Schema),
            RelayError::Replication(e) => match e {
                ReplicationError::Tls(_)
                | ReplicationError::UnsupportedAuth(_)
                | ReplicationError::PasswordRequired => Some(Failure::Auth),
                ReplicationError::Protocol(_) => Some(Failure::Internal),
                _ => e
                    .sqlstate()
                    .and_then(|code| Failure::from_sqlstate(code, &e.to_string())),
            },
            RelayError::Decode(_) => Some(Failure::Internal),
            RelayError::Outbox(OutboxError::UnknownRelation(_)) => Some(Failure::Internal),
            RelayError::Outbox(OutboxError::InvalidEvent { .. }) => Some(Failure::EventRejected),
            RelayError::Outbox(_) => Some(Failure::Schema),
            RelayError::Send(f) => match &f.source {
                SinkError::Send(e) => match classify(e) {
                    Severity::Transient => None,
                    Severity::RecordRejected => Some(Failure::EventRejected),
                    Severity::Fatal => Some(Failure::Kafka),
                },
                SinkError::Config(_) => Some(Failure::Kafka),
                SinkError::QueueFull => None,
            },
            RelayError::Delivery(f) => match classify(&f.error) {
                Severity::Transient => None,
                Severity::RecordRejected => Some(Failure::EventRejected),
                Severity::Fatal => Some(Failure::Kafka),
            },
            RelayError::StreamEnded => None,
            RelayError::Protocol(_) => Some(Failure::Internal),
        }
    }

    /// The fatal error to stop with, if this error is fatal.
    pub fn into_fatal(self) -> Result<FatalError, RelayError> {
        match self.failure() {
            Some(failure) => Ok(FatalError {
                failure,
                message: self.to_string(),
            }),
            None => Err(self),
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
#[error("kafka failed to deliver event {id} at {lsn} to topic {topic:?}: {error}")]
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

/// Position of the transaction being received.
#[derive(Debug, Clone, Copy)]
struct OpenTxn {
    commit_lsn: Lsn,
    next_index: u32,
}

/// State of one session.
struct Session {
    stream: ReplicationStream,
    checkpoint: Checkpoint,
    mapper: OutboxMapper,
    txn: Option<OpenTxn>,
    /// Records handed to the sink and not yet reported back.
    outstanding: usize,
    last_status: Lsn,
}

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
    acks: mpsc::UnboundedReceiver<Ack>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    next_seq: u64,
    acked_frontier: Lsn,
    /// Set once a session reached streaming; the supervisor resets its backoff then.
    pub reached_streaming: bool,
}

impl Relay {
    /// A relay with a producer whose delivery reports arrive on `acks`.
    pub fn new(
        config: Arc<Config>,
        sink: KafkaSink,
        acks: mpsc::UnboundedReceiver<Ack>,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    ) -> Self {
        Relay {
            config,
            sink,
            acks,
            metrics,
            health,
            next_seq: 0,
            acked_frontier: Lsn::ZERO,
            reached_streaming: false,
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
        let control = connect_control(&pg.conn).await?;
        catalog::prepare(&control, pg, &self.config.outbox).await?;
        let mut repl = ReplicationConnection::connect(&pg.conn).await?;
        let slot = match catalog::slot_state(&control, &pg.slot).await? {
            Some(s) => s,
            None if pg.create_slot => {
                let at = repl.create_logical_slot(&pg.slot).await?;
                tracing::info!(slot = %pg.slot, consistent_point = %at, "created replication slot");
                catalog::slot_state(&control, &pg.slot)
                    .await?
                    .ok_or_else(|| CatalogError::MissingSlot(pg.slot.clone()))?
            }
            None => return Err(CatalogError::MissingSlot(pg.slot.clone()).into()),
        };
        drop(control);
        let start = slot.confirmed_flush_lsn.max(self.acked_frontier);
        let publication = pg.publication.clone();
        let mut options = vec![
            ("proto_version", "1"),
            ("publication_names", publication.as_str()),
        ];
        // Logical messages reach pgoutput only on request, and only from PostgreSQL 14 on.
        if self.config.slot.heartbeat_interval.is_some() && repl.server_version_num() >= 140_000 {
            options.push(("messages", "true"));
        }
        let stream = repl.start_logical(&pg.slot, start, &options).await?;
        tracing::info!(slot = %pg.slot, start = %start, "streaming");
        self.health.set_streaming(true);
        self.metrics.streaming.set(1);
        self.metrics.confirmed_flush_lsn.set(start.as_u64() as i64);
        self.reached_streaming = true;
        let mut session = Session {
            stream,
            checkpoint: Checkpoint::new(start, self.next_seq),
            mapper: OutboxMapper::new(self.config.outbox.clone()),
            txn: None,
            outstanding: 0,
            last_status: start,
        };
        let result = self.stream_loop(&mut session, shutdown).await;
        self.health.set_streaming(false);
        self.metrics.streaming.set(0);
        let connection_alive = !matches!(
            result,
            Err(RelayError::Replication(_)) | Err(RelayError::StreamEnded)
        );
        self.wind_down(&mut session, connection_alive).await;
        self.next_seq = session.checkpoint.next_seq();
        self.acked_frontier = self.acked_frontier.max(session.checkpoint.frontier());
        result
    }

    async fn stream_loop(
        &mut self,
        s: &mut Session,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<SessionEnd, RelayError> {
        let mut status_tick = tokio::time::interval(self.config.postgres.status_interval);
        status_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let max_in_flight = self.config.relay.max_in_flight;
        loop {
            if *shutdown.borrow() {
                return Ok(SessionEnd::Shutdown);
            }
            tokio::select! {
                biased;
                _ = shutdown.changed() => return Ok(SessionEnd::Shutdown),
                Some(ack) = self.acks.recv() => {
                    self.on_ack(s, ack)?;
                    // Drain what else is ready without yielding to intake.
                    while let Ok(ack) = self.acks.try_recv() {
                        self.on_ack(s, ack)?;
                    }
                }
                _ = status_tick.tick() => self.send_status(s, false).await?,
                msg = s.stream.next(), if s.checkpoint.in_flight() < max_in_flight => {
                    match msg? {
                        Some(ReplicationMessage::XLogData { data, .. }) => self.on_wal(s, data).await?,
                        Some(ReplicationMessage::Keepalive { wal_end, reply_requested, .. }) => {
                            s.checkpoint.keepalive(wal_end);
                            if reply_requested {
                                self.send_status(s, false).await?;
                            }
                        }
                        None => return Err(RelayError::StreamEnded),
                    }
                }
            }
        }
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
                Err(RelayError::Delivery(Box::new(DeliveryFailure {
                    id: failed.id,
                    lsn: failed.lsn,
                    topic: failed.topic,
                    error,
                })))
            }
        }
    }

    fn observe_confirmed(&self, s: &mut Session) {
        let now = pg_now_micros();
        for c in s.checkpoint.drain_confirmed() {
            self.metrics.transactions.inc();
            self.metrics
                .commit_to_ack
                .observe((now - c.commit_time).max(0) as f64 / 1e6);
        }
    }

    async fn on_wal(&mut self, s: &mut Session, data: Bytes) -> Result<(), RelayError> {
        match pgoutput::decode(data)? {
            LogicalMessage::Begin(b) => {
                s.checkpoint.begin();
                s.txn = Some(OpenTxn {
                    commit_lsn: b.final_lsn,
                    next_index: 0,
                });
                self.metrics.received_lsn.set(b.final_lsn.as_u64() as i64);
            }
            LogicalMessage::Commit(c) => {
                s.txn = None;
                if s.checkpoint.commit(c.end_lsn, c.commit_time) > 0 {
                    self.observe_confirmed(s);
                }
            }
            LogicalMessage::Relation(r) => s.mapper.relation(&r)?,
            LogicalMessage::Insert(ins) => {
                let Some(txn) = s.txn.as_mut() else {
                    return Err(RelayError::Protocol("INSERT outside a transaction".into()));
                };
                let position = EventPosition {
                    commit_lsn: txn.commit_lsn,
                    index: txn.next_index,
                };
                if let Some(event) = s.mapper.map_insert(&ins, position)? {
                    txn.next_index += 1;
                    self.produce(s, &event, ins.relation_id).await?;
                }
            }
            LogicalMessage::Update(u) => self.ignored_change(s, u.relation_id, "UPDATE"),
            LogicalMessage::Delete(d) => self.ignored_change(s, d.relation_id, "DELETE"),
            LogicalMessage::Truncate(t) => {
                for id in t.relation_ids {
                    self.ignored_change(s, id, "TRUNCATE");
                }
            }
            LogicalMessage::Message(m) if m.prefix == HEARTBEAT_PREFIX => {
                self.on_heartbeat(&m.content)
            }
            LogicalMessage::Type(_) | LogicalMessage::Origin(_) | LogicalMessage::Message(_) => {}
        }
        Ok(())
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

    fn ignored_change(&self, s: &Session, relation_id: u32, op: &str) {
        if let Some(table) = s.mapper.table_name(relation_id) {
            tracing::warn!(table, op, "change to the outbox table is not an event; ignored (publish only inserts: ALTER PUBLICATION … SET (publish = 'insert'))");
        }
    }

    async fn produce(
        &mut self,
        s: &mut Session,
        event: &OutboxEvent,
        relation_id: u32,
    ) -> Result<(), RelayError> {
        let seq = s.checkpoint.next_seq();
        loop {
            match self.sink.send(event, seq) {
                Ok(()) => break,
                Err(SinkError::QueueFull) => {
                    // librdkafka's queue is smaller than the in-flight cap: let it drain.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(source) => {
                    return Err(RelayError::Send(Box::new(SendFailure {
                        table: s.mapper.table_name(relation_id).unwrap_or("?").to_owned(),
                        id: String::from_utf8_lossy(&event.id).into_owned(),
                        lsn: event.position.commit_lsn,
                        topic: event.topic.clone(),
                        source,
                    })))
                }
            }
        }
        let assigned = s.checkpoint.event();
        debug_assert_eq!(assigned, seq);
        s.outstanding += 1;
        Ok(())
    }

    async fn send_status(&self, s: &mut Session, reply: bool) -> Result<(), RelayError> {
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
        if frontier != s.last_status {
            tracing::debug!(lsn = %frontier, "confirmed");
            s.last_status = frontier;
        }
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
        while s.outstanding > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.acks.recv()).await {
                Ok(Some(ack)) => {
                    if let Err(e) = self.on_ack(s, ack) {
                        tracing::warn!(error = %e, "delivery failed while stopping; the event will be sent again after restart");
                    }
                }
                Ok(None) => break,
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
