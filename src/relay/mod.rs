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
//! The session loop is one `biased` `tokio::select!`: shutdown (and the drain deadline) >
//! receive timeout > acks > exactly-once commit and its deadlines > status updates (early,
//! then the interval tick) > new WAL. WAL is read only while fewer than `relay.max_in_flight`
//! events are unretired, so a slow or absent broker stops intake instead of growing memory; a
//! large transaction streams through the same window and is never held whole.
//!
//! # LSN progress
//! - The flush (and write/apply) position sent to PostgreSQL is always [`Checkpoint::frontier`]:
//!   the commit end LSN of the longest prefix of transactions whose every event the broker
//!   acknowledged. It starts at the slot's `confirmed_flush_lsn` (never 0/0: PostgreSQL 15 would
//!   accept a lower value and move the slot backwards) and only grows. What is sent is held
//!   back to the position up to which the publication watch ([`coverage`]) found every outbox
//!   table covered: rows inserted after the publication stops covering the table are never
//!   decoded, so nothing past that point may be confirmed; the relay stops there with exit 5.
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
//! - A data error the server reports while decoding (SQLSTATE class 22, e.g. `22021` for a
//!   byte that is not UTF-8 in a `SQL_ASCII` database) at the same transaction in
//!   [`PERMANENT_AFTER`] sessions in a row, nothing confirmed in between, is permanent: the relay
//!   stops with exit 8 and the statement that skips exactly that transaction. The reconnect
//!   backoff is reset only by a session that confirmed a new position.
//! - A progress record (`sink::progress`) follows the acknowledged frontier: written when
//!   streaming starts (no WAL is read before the broker acknowledged that first one: it is the
//!   evidence that the slot exists, see `record`), at most every second while it moves, and
//!   when the session ends. A missing slot is created only when the progress topic has no
//!   record of it.
//! - Exactly-once mode (`kafka.exactly_once`, [`exactly_once`]): events count for the
//!   checkpoint only when their Kafka transaction commits, the progress record is written inside
//!   each Kafka transaction, and what a committed Kafka transaction already holds is skipped
//!   after a restart.
//! - Acknowledged progress is remembered across sessions of one process (`acked_frontier`), so a
//!   reconnect resumes after it even if the last status update did not reach the server; only
//!   on the history and slot generation it was acknowledged on ([`lineage::start_position`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

pub mod checkpoint;
mod coverage;
mod error;
mod exactly_once;
mod kafka_txn;
mod lineage;
mod publish;
mod record;
mod slot_record;
mod stream;

pub use coverage::Change;
pub use error::{DeliveryFailure, RelayError, SendFailure, Uncovered};
pub use slot_record::{never_existed, progress_place};

use crate::config::{BrokerConfig, Config, KafkaConfig, OutboxConfig, PostgresConfig, RelayConfig};
use crate::failure::{Classify, Failure, FatalError};
use crate::fault::crash_point;
use crate::health;
use crate::lsn::Lsn;
use crate::metrics::{Health, Metrics};
use crate::outbox::{EventPosition, OutboxEvent, OutboxMapper};
use crate::pg::control::connect_control;
use crate::sink::kafka::KafkaSink;
use crate::sink::progress::{Lineage, ProgressKey};
use crate::sink::topics::Topics;
use crate::sink::transaction::{is_fencing, transactional_id, TxnError};
use crate::sink::{Ack, AckQueue, DeliveryError, Publisher, Sink, SinkError};
use crate::source::catalog::{self, CatalogError};
use crate::source::pgoutput::{self, LogicalMessage};
use crate::source::replication::{ReplicationError, ReplicationMessage, ReplicationStream};
use crate::source::session::{self, OpenError};
use crate::source::standby::Role;
use crate::timestamp::unix_micros_to_pg_micros;
use checkpoint::Checkpoint;
use error::{Recurrence, RejectedTxn, PERMANENT_AFTER};

/// Position of the transaction being received.
#[derive(Debug, Clone, Copy)]
struct OpenTxn {
    commit_lsn: Lsn,
    commit_time: i64,
    xid: u32,
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
    /// Decodes the stream, reusing each mapped row's columns for the next.
    decoder: pgoutput::Decoder,
    txn: Option<OpenTxn>,
    /// When an ignored change to each outbox table was last logged.
    change_warned: HashMap<usize, Instant>,
    /// Records handed to the sink and not yet reported back.
    outstanding: usize,
    last_status: Lsn,
    last_status_at: Instant,
    /// Exactly-once mode's Kafka transaction; `None` in at-least-once mode.
    eos: Option<kafka_txn::KafkaTxn>,
    /// The reshard marker at `postgres.drain_to` arrived: nothing after it is read.
    drained: bool,
    /// The session's first progress record (at-least-once mode) is not acknowledged yet.
    start_record_pending: bool,
    /// Records are produced one at a time ([`Relay::isolate_until`]).
    isolated: bool,
    /// How far the publication is known to cover the outbox: nothing past it is confirmed.
    coverage: coverage::Gate,
}

/// Shortest gap between status updates sent because the frontier moved (the periodic ones
/// come every `postgres.status_interval` regardless).
const EAGER_STATUS_GAP: Duration = Duration::from_millis(20);

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
    /// `postgres.drain_to` was reached: every event committed before it is acknowledged and
    /// the slot confirmed up to it (`walbox reshard`, [`crate::cmd::reshard`]).
    Drained,
}

/// What the relay reads of the configuration: the sections of the stages it drives.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The source: connection, slot, publication, status interval.
    pub postgres: PostgresConfig,
    /// The routes.
    pub outbox: OutboxConfig,
    /// Kafka's section (the progress topic is read and written here when the broker is Kafka).
    pub kafka: KafkaConfig,
    /// The broker the relay publishes to.
    pub broker: BrokerConfig,
    /// Limits and timings of the loop.
    pub relay: RelayConfig,
    /// Whether heartbeats are emitted (their logical messages must be streamed).
    pub heartbeats: bool,
}

impl Settings {
    /// The relay's sections of `config`.
    pub fn of(config: &Config) -> Self {
        Settings {
            postgres: config.postgres.clone(),
            outbox: config.outbox.clone(),
            kafka: config.kafka.clone(),
            broker: config.broker.clone(),
            relay: config.relay.clone(),
            heartbeats: config.slot.heartbeat_interval.is_some(),
        }
    }
}

/// The relay: owns the producer across sessions; see the module docs.
pub struct Relay {
    settings: Settings,
    sink: Sink,
    acks: Arc<AckQueue>,
    /// Reused buffer for batches of acks.
    ack_batch: Vec<Ack>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    next_seq: u64,
    acked_frontier: Lsn,
    /// The timeline and slot generation `acked_frontier` was acknowledged on.
    acked_lineage: Lineage,
    topics: Topics,
    /// Set when a session confirmed a new position; the supervisor resets its backoff then
    /// (and only then: a session that streams and fails at the same place again is no
    /// progress).
    pub made_progress: bool,
    /// The data error that ended the last sessions at one transaction, and how often.
    recurrence: Option<Recurrence>,
    /// Which slot the progress records are about (known once a session identified the server).
    progress_key: Option<ProgressKey>,
    /// The timeline and slot generation the session's progress records are written on.
    lineage: Lineage,
    /// The position of the last progress record handed to the producer, and when.
    progress_lsn: Lsn,
    progress_at: Option<Instant>,
    /// Commit time (PostgreSQL microseconds) of the newest transaction confirmed.
    confirmed_commit_time: Option<i64>,
    /// Exactly-once: the position and commit time of the last progress record this process
    /// committed in Kafka. A later session of the process trusts no record read beyond it
    /// (see [`exactly_once`]).
    eos_committed: Option<(Lsn, Option<i64>)>,
    /// After the broker refused a batch for one record's timestamp: records are produced one
    /// at a time until everything up to this commit LSN is acknowledged, so the record at
    /// fault is refused alone.
    isolate_until: Option<Lsn>,
    /// The transaction of the event that stopped the last session, if one was rejected.
    rejected: Option<RejectedTxn>,
    /// Whether the last session's server was a standby (the way out of a dropped publication
    /// differs there).
    on_standby: bool,
    /// The column the printed `walbox republish --since` compares, read at session start.
    time_column: Option<String>,
}

impl Relay {
    /// A relay with a producer whose delivery reports arrive on `acks`.
    pub fn new(
        settings: Settings,
        sink: Sink,
        acks: Arc<AckQueue>,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
        topics: Topics,
    ) -> Self {
        Relay {
            topics,
            ack_batch: Vec::new(),
            settings,
            sink,
            acks,
            metrics,
            health,
            next_seq: 0,
            acked_frontier: Lsn::ZERO,
            acked_lineage: Lineage::default(),
            made_progress: false,
            recurrence: None,
            progress_key: None,
            lineage: Lineage::default(),
            progress_lsn: Lsn::ZERO,
            progress_at: None,
            confirmed_commit_time: None,
            eos_committed: None,
            rejected: None,
            isolate_until: None,
            on_standby: false,
            time_column: None,
        }
    }

    /// The fatal error to stop with, when `e` is fatal, with what the operator needs to act on
    /// it: the data-loss window and the republish command for a lost slot, the statement that
    /// skips a rejected event's transaction, the way out of a dropped publication.
    pub fn into_fatal(&self, e: RelayError) -> Result<FatalError, RelayError> {
        // Whatever ended the session (a progress topic that cannot be read, say), a producer
        // that can never deliver is the cause to report.
        let e = match (e.failure(), self.acks.fatal()) {
            (None, Some(kafka)) => self.producer_error(kafka),
            _ => e,
        };
        let Some(failure) = e.failure() else {
            return Err(e);
        };
        let slot = &self.settings.postgres.slot;
        let message = if let RelayError::SlotGone { .. } | RelayError::SlotLost { .. } = e {
            e.to_string()
        } else if failure == Failure::SlotLost {
            format!(
                "replication slot {slot:?} is lost: {e}; last confirmed position {}: events committed after it may never be relayed. Run `walbox recreate-slot --confirm-data-loss`, then {} (runbook \"Slot lost\")",
                self.acked_frontier,
                self.republish_hint()
            )
        } else if failure == Failure::SlotInUse {
            format!(
                "{e}: another process streams from slot {slot:?}. Find it with SELECT pid, \
                 application_name, client_addr FROM pg_stat_replication WHERE pid = (SELECT \
                 active_pid FROM pg_replication_slots WHERE slot_name = {}); stop it if it is a \
                 stray client, or leave it streaming. A second walbox for the same slot belongs \
                 under postgres.on_slot_busy = \"wait\" (the default), where it waits as a hot \
                 standby; right after a restart, the old connection lets go within \
                 wal_sender_timeout",
                postgres_protocol::escape::escape_literal(slot)
            )
        } else if failure == Failure::EventRejected {
            match &self.rejected {
                Some(r) => format!("{e}; {}", r.advice(slot)),
                None => e.to_string(),
            }
        } else if e.publication_missing() {
            let (on_primary, position, on_standby) = if self.on_standby {
                (
                    " on the primary",
                    "pg_last_wal_replay_lsn()",
                    " on the standby, once it has replayed the re-creation,",
                )
            } else {
                ("", "pg_current_wal_lsn()", "")
            };
            format!(
                "{e}: the publication was dropped while walbox streamed (or is missing for changes after the confirmed position {}). Re-creating it alone does not help: PostgreSQL decodes each change with the catalog as of that change. Way out, with walbox stopped: create the publication again{on_primary}, run SELECT pg_replication_slot_advance({}, {position});{on_standby} to move the slot past the re-creation, start walbox, then {} (runbook \"Publication dropped\")",
                self.acked_frontier,
                postgres_protocol::escape::escape_literal(slot),
                self.republish_hint()
            )
        } else {
            e.to_string()
        };
        Ok(FatalError::new(failure, message))
    }

    /// The error for a producer that cannot continue: fenced by a newer walbox in exactly-once
    /// mode, or refused and fatal.
    fn producer_error(&self, e: DeliveryError) -> RelayError {
        match e {
            DeliveryError::Kafka(error) if self.fenced() => self.fenced_error(error),
            e => RelayError::Producer(e),
        }
    }

    /// The error for a record the producer refused in `produce()`. A producer fenced meanwhile
    /// (by a newer walbox, or by the coordinator's abort of a transaction open too long)
    /// refuses every record as fatal: the fencing is the reason, as for a failed ack, and not
    /// the record.
    fn send_error(&self, event: &OutboxEvent, source: SinkError) -> RelayError {
        match source {
            SinkError::Send(error) if self.fenced() => self.fenced_error(error),
            source => error::send_failure(event, source),
        }
    }

    /// Whether this exactly-once producer was fenced (its fatal error says so).
    fn fenced(&self) -> bool {
        self.settings.kafka.exactly_once.is_some()
            && self
                .txn_sink()
                .fatal_error()
                .is_some_and(|(code, _)| is_fencing(code))
    }

    fn fenced_error(&self, error: rdkafka::error::KafkaError) -> RelayError {
        let id = self
            .progress_key
            .as_ref()
            .map(transactional_id)
            .unwrap_or_default();
        RelayError::Transaction(TxnError::Fenced { id, error })
    }

    /// How to republish what this process has not confirmed: the command with a `--since`
    /// [`crate::sink::progress::REPUBLISH_MARGIN_MICROS`] before the newest confirmed commit.
    fn republish_hint(&self) -> String {
        error::republish_window(
            self.confirmed_commit_time
                .map(|t| (t, "the newest confirmed commit")),
            self.time_column.as_deref(),
        )
    }

    /// The error for a publication found at session start not to cover an outbox table
    /// (`cause`): when the slot exists (walbox may have streamed from it while the table was
    /// covered), with its confirmed position, the newest confirmed commit from the progress
    /// record and the republish command; else `cause` itself, whose fix is then the whole way.
    async fn uncovered_at_start(&self, cause: CatalogError) -> RelayError {
        let pg = &self.settings.postgres;
        let change = match &cause {
            CatalogError::InsertsNotPublished(_) => Change::InsertsOff,
            CatalogError::TableNotPublished { table, .. } => Change::NotPublished {
                table: table.clone(),
            },
            CatalogError::PartitionsNotViaRoot { table, .. } => Change::PartitionsByName {
                table: table.clone(),
            },
            _ => return OpenError::from(cause).into(),
        };
        let Ok(client) = connect_control(&pg.conn).await else {
            return OpenError::from(cause).into();
        };
        let Ok(Some(slot)) = catalog::slot_state(&client, &pg.slot).await else {
            return OpenError::from(cause).into();
        };
        let time_column = catalog::time_column(&client, &self.settings.outbox)
            .await
            .ok()
            .flatten();
        let record = self.last_progress().await;
        RelayError::Uncovered(Box::new(Uncovered {
            publication: pg.publication.clone(),
            slot: pg.slot.clone(),
            change,
            confirmed: slot.confirmed_flush_lsn,
            streaming: false,
            since: record.and_then(|r| r.confirmed_commit_time_us).map(|t| {
                (
                    unix_micros_to_pg_micros(t),
                    "the newest confirmed commit (progress record)",
                )
            }),
            time_column,
        }))
    }

    /// The newest progress record of this relay's slot, read on connections of their own.
    async fn last_progress(&self) -> Option<crate::sink::progress::ProgressRecord> {
        let pg = &self.settings.postgres;
        let (broker, kafka) = (&self.settings.broker, &self.settings.kafka);
        health::evidence::last_progress(&pg.conn, &pg.slot, broker, kafka).await
    }

    /// The error for a slot found lost at session start, with the progress record's newest
    /// confirmed commit (this process may have confirmed nothing yet) and the republish
    /// command's time column, each read on a connection of its own (the session's failed).
    async fn slot_lost(&self, slot: String, confirmed: Lsn, cause: String) -> RelayError {
        let pg = &self.settings.postgres;
        let record = self.last_progress().await;
        let time_column = match connect_control(&pg.conn).await {
            Ok(client) => catalog::time_column(&client, &self.settings.outbox)
                .await
                .ok()
                .flatten(),
            Err(_) => self.time_column.clone(),
        };
        RelayError::SlotLost {
            slot,
            confirmed,
            cause,
            record: record.map(Box::new),
            time_column,
        }
    }

    /// Highest position this process knows to be fully acknowledged.
    pub fn acked_frontier(&self) -> Lsn {
        self.acked_frontier
    }

    /// The publisher (for start-up probes).
    pub fn sink(&self) -> &Sink {
        &self.sink
    }

    /// The transactional producer of exactly-once mode, which publishes to Kafka only (the
    /// configuration refuses `kafka.exactly_once` with another broker).
    fn txn_sink(&self) -> &KafkaSink {
        match &self.sink {
            Sink::Kafka(k) => k,
            // Exactly-once mode is this function's only caller, and the configuration refuses
            // it with any other broker (`config::broker::choose`).
            other => unreachable!("exactly-once mode publishing to {}", other.broker()),
        }
    }

    /// Runs one session until shutdown or an error.
    pub async fn run_session(
        &mut self,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<SessionEnd, RelayError> {
        self.made_progress = false;
        let pg = &self.settings.postgres.clone();
        let mut open = match session::open(pg, &self.settings.outbox).await {
            Ok(open) => open,
            Err(OpenError::Catalog(CatalogError::SlotLost {
                slot,
                confirmed,
                cause,
            })) => return Err(self.slot_lost(slot, confirmed, cause).await),
            Err(OpenError::Catalog(
                e @ (CatalogError::TableNotPublished { .. }
                | CatalogError::InsertsNotPublished(_)
                | CatalogError::PartitionsNotViaRoot { .. }),
            )) => return Err(self.uncovered_at_start(e).await),
            Err(e) => return Err(e.into()),
        };
        self.on_standby = open.role == Role::Standby;
        self.time_column = open.time_column(&self.settings.outbox).await;
        let key = ProgressKey {
            system_identifier: open.identity.system_id.clone(),
            database: open.identity.dbname.clone().unwrap_or_default(),
            slot: pg.slot.clone(),
        };
        // A producer that can never deliver (refused credentials) stops walbox before the
        // progress topic is read with the same settings, to its timeout.
        if let Some(e) = self.acks.fatal() {
            return Err(self.producer_error(e));
        }
        if let Sink::Kafka(sink) = &self.sink {
            let progress_topic = self.settings.kafka.progress_topic.clone();
            self.topics
                .ensure_progress(sink, &progress_topic)
                .await
                .map_err(RelayError::ProgressTopic)?;
        }
        let slot = match open.slot {
            Some(s) => s,
            None => {
                // A missing slot is created only when the progress topic proves it never
                // existed; see `sink::progress`.
                match never_existed(
                    &self.settings.broker,
                    &self.settings.kafka,
                    &key,
                    self.time_column.clone(),
                )
                .await
                {
                    Err(gone @ RelayError::SlotGone { .. }) => return Err(gone),
                    Ok(()) if pg.create_slot => open.create_slot(&pg.slot).await?,
                    Err(e) if pg.create_slot => return Err(e),
                    _ => {
                        return Err(
                            OpenError::from(CatalogError::MissingSlot(pg.slot.clone())).into()
                        )
                    }
                }
            }
        };
        let eos_key = key.clone();
        if self.progress_key.as_ref() != Some(&key) {
            // Another cluster, database or slot: nothing acknowledged before speaks for it.
            self.progress_key = Some(key);
            self.progress_lsn = Lsn::ZERO;
            self.acked_frontier = Lsn::ZERO;
        }
        // Topics the config names are looked up now, not on the WAL path.
        let mut mapper = OutboxMapper::new(&self.settings.outbox);
        mapper.set_not_null(open.not_null.clone());
        if let Sink::Kafka(sink) = &self.sink {
            self.topics.resolve(sink, &mapper.known_topics()).await;
        }
        // Logical messages carry heartbeats, the table-less outbox and the reshard marker.
        let messages = self.settings.heartbeats
            || self.settings.outbox.messages.is_some()
            || pg.drain_to.is_some();
        let mut server = lineage::ServerHistory {
            timelines: lineage::timelines(&mut open).await,
            wal_at: open.identity.xlogpos,
            slot_confirmed: slot.confirmed_flush_lsn,
        };
        if open.role == Role::Standby {
            // A restarted hot standby takes connections before it has replayed its own WAL: what
            // was acknowledged on it would look like another history's until replay gets there.
            let target = self
                .acked_frontier
                .max(self.committed_position(&eos_key).await);
            if target > server.wal_at {
                server.wal_at = open.wait_for_wal(target).await?;
            }
        }
        // What this process acknowledged counts only on the history and slot generation it was
        // acknowledged on (`relay::lineage`): a promotion onto a lagging standby, a restore or
        // another cluster behind the URL reuse those positions for other commits.
        let start = lineage::start_position(self.acked_frontier, self.acked_lineage, &server);
        // The slot's generation is its restart_lsn, not its confirmed position: PostgreSQL
        // saves a confirmed position that moved alone only at the next checkpoint that finds
        // the slot dirty (before 17 not even at shutdown), so after a crash or a restart the
        // same slot can show less than a session found; its restart_lsn is saved whenever it
        // moves (see `relay::lineage`).
        self.lineage = Lineage {
            timeline: open.identity.timeline,
            slot_floor: slot.restart_lsn,
        };
        self.acked_frontier = start;
        self.acked_lineage = self.lineage;
        // Exactly-once trusts the last progress record only as far as it is of this history
        // and this slot (`lineage`).
        let server = self.settings.kafka.exactly_once.map(|_| server);
        let covered = coverage::baseline(&open, &pg.publication, &self.settings.outbox).await?;
        let mut stream = open.start(pg, start, messages).await?;
        // Exactly-once: only once this process holds the slot does it fence the previous
        // producer and read what that one committed (a second process that cannot get the
        // slot must not stop the one streaming). That can wait on another producer's open
        // transaction: status updates at `start` keep the walsender from timing out meanwhile.
        let eos = match (self.settings.kafka.exactly_once, server) {
            (Some(bounds), Some(server)) => Some(
                self.begin_keeping_alive(&mut stream, start, &eos_key, bounds, &server)
                    .await?,
            ),
            _ => None,
        };
        self.health.set_ready(true);
        self.health.set_blocked(None);
        // The slot is active: walbox streams from it (the monitor's reading may be older). Set
        // before `streaming`, so a scrape that sees walbox streaming sees the slot active too.
        self.metrics.slot_active.set(1);
        self.metrics.streaming.set(1);
        self.metrics.confirmed_flush_lsn.set(start.as_u64() as i64);
        crash_point!("relay::session-started");
        let mut session = Session {
            stream,
            checkpoint: Checkpoint::new(start, self.next_seq),
            mapper,
            decoder: pgoutput::Decoder::default(),
            txn: None,
            change_warned: HashMap::new(),
            outstanding: 0,
            last_status: start,
            last_status_at: Instant::now(),
            eos,
            drained: false,
            start_record_pending: false,
            isolated: false,
            coverage: coverage::Gate::start(
                &pg.conn,
                &pg.publication,
                covered,
                pg.status_interval,
                start,
            ),
        };
        // Nothing is streamed before the slot is on record in the progress topic (exactly-once
        // mode writes that record in a transaction of its own).
        let result = match self.record_start(&mut session, start, shutdown).await {
            Ok(()) => self.stream_loop(&mut session, shutdown).await,
            Err(e) => Err(e),
        };
        let open_txn = session.eos.as_ref().and_then(|t| t.open_txn());
        let result = match self.end_kafka_txn(&mut session, result.is_ok()).await {
            // Fenced (or worse): that is why nothing more can be relayed.
            Err(e) => Err(e),
            Ok(()) => result,
        };
        // Fenced with a transaction open past its timeout: the coordinator aborted it, after
        // an outage of the brokers or because it was held open too long.
        let result = self.judge_fenced(&mut session, result, open_txn);
        self.health.set_ready(false);
        self.metrics.streaming.set(0);
        let connection_alive = !matches!(
            result,
            Err(RelayError::Replication(_)) | Err(RelayError::StreamEnded)
        );
        self.wind_down(&mut session, connection_alive).await;
        // A drain ends only once the slot is confirmed up to the reshard point.
        let result = match (result, pg.drain_to) {
            (Ok(SessionEnd::Drained), Some(to)) if session.checkpoint.frontier() < to => {
                Err(RelayError::Undrained {
                    to,
                    confirmed: session.checkpoint.frontier(),
                })
            }
            (result, _) => result,
        };
        let progressed = session.checkpoint.frontier() > start;
        self.made_progress = progressed;
        let mut result = self.permanent(result, &session, progressed);
        self.rejected = None;
        if let Some(commit_lsn) = result
            .as_ref()
            .err()
            .and_then(RelayError::rejected_commit_lsn)
        {
            let rejected = self
                .locate(&mut session, commit_lsn, connection_alive)
                .await;
            // Transactions before it were not all confirmed (exactly-once: they shared its
            // Kafka transaction and were aborted with it). Stopping now would print no exact
            // skip, and the next run could end the same way: the next session relays one
            // record, and one PostgreSQL transaction per Kafka transaction, up to it, and stops
            // there with everything before it confirmed.
            if !rejected.exact && !session.isolated {
                self.isolate_until = Some(self.isolate_until.unwrap_or(Lsn::ZERO).max(commit_lsn));
                if let Err(e) = result {
                    result = Err(RelayError::Isolating(Box::new(e)));
                }
            } else {
                self.rejected = Some(rejected);
            }
        }
        self.next_seq = session.checkpoint.next_seq();
        // A session whose publication watch found a change, or could not read the publication,
        // remembers no more than the watch released: a reconnect must not start beyond a
        // change this session was not allowed to confirm past.
        let frontier = session.checkpoint.frontier();
        let watch_failed =
            session.coverage.change().is_some() || session.coverage.unreadable().is_some();
        let acknowledged = if watch_failed {
            session.coverage.confirmable(frontier)
        } else {
            frontier
        };
        self.acked_frontier = self.acked_frontier.max(acknowledged);
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

    /// `result`, or [`RelayError::Undecodable`] when it is the same data error at the same
    /// transaction (every transaction before it acknowledged) for the [`PERMANENT_AFTER`]th
    /// session in a row, with no new position confirmed in between.
    fn permanent(
        &mut self,
        result: Result<SessionEnd, RelayError>,
        s: &Session,
        progressed: bool,
    ) -> Result<SessionEnd, RelayError> {
        let txn = s.txn.filter(|_| s.checkpoint.oldest_pending().is_none());
        let seen = match (&result, txn) {
            (Err(RelayError::Replication(e)), Some(t)) => e.sqlstate().map(|c| (c, t.commit_lsn)),
            _ => None,
        };
        let times = Recurrence::observe(&mut self.recurrence, seen, progressed);
        match (result, txn) {
            (Err(RelayError::Replication(error)), Some(t)) if times >= PERMANENT_AFTER => {
                self.recurrence = None;
                Err(RelayError::Undecodable {
                    slot: self.settings.postgres.slot.clone(),
                    commit_lsn: t.commit_lsn,
                    xid: t.xid,
                    read: t.next_index,
                    times,
                    error,
                })
            }
            (result, _) => result,
        }
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

    /// Ends the relay: hands back the sink so the caller can flush it.
    pub fn into_sink(self) -> Sink {
        self.sink
    }
}
