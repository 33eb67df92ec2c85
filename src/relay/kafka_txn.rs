//! The Kafka transactions of one exactly-once session, as state: the one open in the producer,
//! the one being committed, and what is buffered behind that commit. The relay's loop
//! ([`super::exactly_once`]) drives it; this module decides nothing about the stream.
//!
//! # Invariants
//! - At most one transaction is open in the producer; while one commits (`closing`), the
//!   events read are buffered in stream order with the PostgreSQL commits between them.
//! - The fill counters (`events`, `bytes`, `started`, `last_commit`) describe the transaction
//!   being filled: the open one, or, while a commit is in flight, the buffered one.
//! - The blocking transactional calls run off the runtime and are bounded by
//!   [`TXN_CALL_TIMEOUT`]; a retriable commit error is retried for at most [`COMMIT_RETRY_FOR`],
//!   then the transaction is aborted.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use prometheus::Histogram;
use tokio::task::JoinHandle;

use crate::config::ExactlyOnce;
use crate::fault::crash_point;
use crate::lsn::Lsn;
use crate::outbox::OutboxEvent;
use crate::sink::kafka::KafkaSink;
use crate::sink::transaction::{classify_txn, OpenTxn, TxnError};

/// How long one `init_transactions`, `commit_transaction` or `abort_transaction` call may take,
/// and how long a commit waits for its events' delivery reports.
pub(super) const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long retriable commit errors are retried before the transaction is aborted.
pub(super) const COMMIT_RETRY_FOR: Duration = Duration::from_secs(60);

/// How long a commit waits after EndTxn was answered before it returns and the next
/// transaction's records go to the producer. The coordinator answers EndTxn before it has
/// written the transaction markers, and refuses the next transaction's partitions until they
/// are written (CONCURRENT_TRANSACTIONS); librdkafka asks again 20 ms later, a fixed delay.
/// Apache Kafka on one host writes the markers within a few milliseconds: a record produced
/// at once waited 20 ms more, one produced after this pause usually none (see
/// docs/performance.md). Meanwhile the next transaction's events are read and buffered.
pub(super) const MARKERS_PAUSE: Duration = Duration::from_millis(3);

/// Runs one of the producer's blocking transactional calls off the runtime, bounded by
/// [`TXN_CALL_TIMEOUT`].
pub(super) async fn blocking(
    sink: &KafkaSink,
    call: fn(&KafkaSink, Duration) -> Result<(), rdkafka::error::KafkaError>,
) -> Result<(), rdkafka::error::KafkaError> {
    let sink = sink.clone();
    tokio::task::spawn_blocking(move || call(&sink, TXN_CALL_TIMEOUT))
        .await
        .unwrap_or(Err(rdkafka::error::KafkaError::Canceled))
}

/// `commit_transaction`, retried while librdkafka calls its errors retriable (for at most
/// [`COMMIT_RETRY_FOR`]; then the transaction is aborted). Runs on a blocking thread, handed
/// over as soon as the transaction's progress record was produced, behind its events, without
/// waiting for any of their delivery reports: a Kafka transaction commits or aborts whole
/// whatever order its records were acknowledged in.
///
/// It first waits until librdkafka holds none of the transaction's records (`flush`): every
/// delivery report arrived and was served. That is the flush `commit_transaction` does
/// itself, but rust-rdkafka's polls the producer in 100 ms slices against the producer's own
/// polling thread, which takes the reports: a commit called with one record in flight took
/// 100 ms more; this wait looks every 200 µs. librdkafka then refuses to commit a transaction
/// one of whose records failed delivery (it must be aborted), so a commit that returns `Ok`
/// holds every record produced into it.
///
/// A committed transaction returns [`MARKERS_PAUSE`] after EndTxn was answered (see there);
/// `flush` observes the wait for the records, `took` how long `commit_transaction` itself took.
pub(super) fn commit_blocking(
    sink: &KafkaSink,
    id: &str,
    flush: &Histogram,
    took: &Histogram,
) -> Result<(), TxnError> {
    crash_point!("relay::eos-committing");
    let flushing = Instant::now();
    sink.wait_released(TXN_CALL_TIMEOUT);
    flush.observe(flushing.elapsed().as_secs_f64());
    crash_point!("relay::eos-flushed");
    let retry_until = Instant::now() + COMMIT_RETRY_FOR;
    let mut backoff = Duration::from_millis(50);
    let started = Instant::now();
    loop {
        match sink
            .commit_transaction(TXN_CALL_TIMEOUT)
            .map_err(|e| classify_txn(sink, id, e))
        {
            Ok(()) => {
                took.observe(started.elapsed().as_secs_f64());
                std::thread::sleep(MARKERS_PAUSE);
                return Ok(());
            }
            Err(TxnError::Retriable(e)) if Instant::now() < retry_until => {
                tracing::warn!(error = %e, retry_in = ?backoff, "committing the kafka transaction; retrying");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
            Err(TxnError::Retriable(e)) => return Err(TxnError::Abortable(e)),
            Err(e) => return Err(e),
        }
    }
}

/// The bytes an event puts into a Kafka transaction: key, value and headers.
pub(super) fn event_bytes(event: &OutboxEvent) -> usize {
    let headers: usize = event
        .headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.as_ref().map_or(0, |v| v.len()))
        .sum();
    event.key.as_ref().map_or(0, |k| k.len())
        + event.value.as_ref().map_or(0, |v| v.len())
        + headers
}

/// What is read while a Kafka transaction commits, in stream order: produced into the next
/// transactions once that commit returned.
pub(super) enum Buffered {
    /// An event, with its sequence number, its size and when it was read.
    Event {
        event: Box<OutboxEvent>,
        route: usize,
        seq: u64,
        bytes: usize,
        read_at: Instant,
    },
    /// The end of a PostgreSQL transaction whose events are buffered: a place where a Kafka
    /// transaction may end.
    Commit(Lsn, i64),
}

/// Where the commit of a Kafka transaction stands.
pub(super) enum Phase {
    /// Its progress record is still to be produced (the producer's queue was full); then
    /// `commit_transaction` goes to its thread.
    Sealing,
    /// `commit_transaction` runs on a blocking thread (which first waits for the delivery
    /// reports of all its records: see [`commit_blocking`]).
    Committing {
        handle: JoinHandle<Result<(), TxnError>>,
    },
}

/// A Kafka transaction being committed.
pub(super) struct Closing {
    /// When its commit started.
    pub(super) started: Instant,
    /// Sequence number one past its last event.
    pub(super) through_seq: u64,
    /// The commit end LSN and commit time of its last PostgreSQL transaction: its progress
    /// record.
    pub(super) end_lsn: Lsn,
    pub(super) commit_time: Option<i64>,
    pub(super) phase: Phase,
    /// The delivery reports of its events all arrived (the `acks` step was observed).
    pub(super) events_acked: bool,
    /// Its progress record's delivery report arrived (the `progress` step was observed).
    pub(super) progress_acked: bool,
}

/// The Kafka transactions of one session: at most one open in the producer, and while it
/// commits, the events of the next one buffered (see the module docs).
pub(super) struct KafkaTxn {
    /// `transactional.id`.
    pub(super) id: String,
    pub(super) bounds: ExactlyOnce,
    /// A Kafka transaction is open in the producer (begun, and not yet committed or aborted).
    pub(super) open: bool,
    /// When it was begun.
    pub(super) opened_at: Instant,
    /// No delivery report of the open transaction arrived yet (its first one measures how long
    /// the coordinator took to add its partitions).
    pub(super) first_ack_pending: bool,
    /// When the first event of the transaction being filled arrived (the one open, or the
    /// next one while a commit is in flight).
    pub(super) started: Instant,
    /// Events of the transaction being filled.
    pub(super) events: usize,
    /// Their bytes (key, value, headers).
    pub(super) bytes: usize,
    /// The commit end LSN and commit time (PostgreSQL microseconds) of the last whole
    /// PostgreSQL transaction in the transaction being filled.
    pub(super) last_commit: Option<(Lsn, Option<i64>)>,
    /// The transaction being committed, if any.
    pub(super) closing: Option<Closing>,
    /// Events read while it commits, in stream order.
    pub(super) buffer: VecDeque<Buffered>,
    /// PostgreSQL transactions whose commit LSN is below this are in Kafka already: the
    /// position of the progress record read at start-up.
    pub(super) skip_below: Lsn,
    /// That record's commit time (PostgreSQL microseconds), when it has one.
    pub(super) skip_commit_time: Option<i64>,
    /// The PostgreSQL transaction being received is one of those.
    pub(super) skipping: bool,
    /// Delivery reports of sequence numbers below this belong to an aborted transaction.
    pub(super) discard_below: u64,
}

impl KafkaTxn {
    /// Whether the transaction being filled should be committed now (right after a
    /// PostgreSQL commit, or while none is being received).
    pub(super) fn due(&self) -> bool {
        self.full() || self.committable() && self.started.elapsed() >= self.bounds.interval
    }

    /// Whether the transaction being filled reached its size bound (events or bytes).
    pub(super) fn full(&self) -> bool {
        self.committable()
            && (self.events >= self.bounds.max_events || self.bytes >= self.bounds.max_bytes)
    }

    /// When the transaction being filled reaches its age bound.
    pub(super) fn deadline(&self) -> Instant {
        self.started + self.bounds.interval
    }

    /// The transaction open in the producer, if one is: when it was begun, and its timeout.
    pub(super) fn open_txn(&self) -> Option<OpenTxn> {
        self.open.then_some(OpenTxn {
            since: self.opened_at,
            timeout: self.bounds.timeout,
        })
    }

    /// Whether a transaction is open, holds a whole PostgreSQL transaction, and no commit is
    /// in flight.
    pub(super) fn committable(&self) -> bool {
        self.open && self.last_commit.is_some() && self.closing.is_none()
    }

    /// Whether a commit is in flight (events read now are buffered).
    pub(super) fn committing(&self) -> bool {
        self.closing.is_some()
    }

    /// Whether the commit in flight still has its progress record to produce.
    pub(super) fn sealing(&self) -> bool {
        matches!(
            self.closing.as_ref().map(|c| &c.phase),
            Some(Phase::Sealing)
        )
    }

    /// The delivery report of a progress record arrived: when the commit in flight started,
    /// the first time for that commit.
    pub(super) fn progress_acked(&mut self) -> Option<Instant> {
        let closing = self.closing.as_mut()?;
        (!std::mem::replace(&mut closing.progress_acked, true)).then_some(closing.started)
    }

    /// No delivery report of an event is outstanding: when the commit in flight started, the
    /// first time for that commit (no event is produced while a commit is in flight, so the
    /// reports outstanding are its events').
    pub(super) fn events_acked(&mut self) -> Option<Instant> {
        let closing = self.closing.as_mut()?;
        (!std::mem::replace(&mut closing.events_acked, true)).then_some(closing.started)
    }

    /// Whether the events buffered behind the commit in flight reached
    /// `kafka.transaction_max_bytes`: intake waits for the commit.
    pub(super) fn buffer_full(&self) -> bool {
        self.closing.is_some() && self.bytes >= self.bounds.max_bytes
    }

    /// Events buffered behind the commit in flight.
    pub(super) fn buffered(&self) -> usize {
        if self.closing.is_some() {
            self.events
        } else {
            0
        }
    }

    /// Whether the transaction being filled holds an event (open, or buffered).
    pub(super) fn holds_events(&self) -> bool {
        self.open && self.closing.is_none() || !self.buffer.is_empty()
    }

    /// Counts an event of `bytes`, read at `read_at`, into the transaction being filled.
    pub(super) fn count(&mut self, bytes: usize, read_at: Instant) {
        if self.events == 0 {
            self.started = read_at;
        }
        self.events += 1;
        self.bytes += bytes;
    }

    /// A fresh transaction to fill, holding what is still buffered.
    pub(super) fn reset_fill(&mut self) {
        self.events = 0;
        self.bytes = 0;
        self.last_commit = None;
        self.started = Instant::now();
        let mut counts = Vec::new();
        for item in &self.buffer {
            match item {
                Buffered::Event { bytes, read_at, .. } => counts.push((*bytes, *read_at)),
                Buffered::Commit(end, time) => self.last_commit = Some((*end, Some(*time))),
            }
        }
        for (bytes, read_at) in counts {
            self.count(bytes, read_at);
        }
    }

    /// The sequence number of the first event still buffered.
    pub(super) fn first_buffered_seq(&self) -> Option<u64> {
        self.buffer.iter().find_map(|item| match item {
            Buffered::Event { seq, .. } => Some(*seq),
            Buffered::Commit(..) => None,
        })
    }
}

/// Waits for the commit running on its blocking thread (never resolves when none is).
pub(super) async fn commit_returned(eos: &mut Option<KafkaTxn>) -> Result<(), TxnError> {
    let closing = eos.as_mut().and_then(|t| t.closing.as_mut());
    match closing.map(|c| &mut c.phase) {
        Some(Phase::Committing { handle, .. }) => handle
            .await
            .unwrap_or_else(|_| Err(TxnError::Abortable(rdkafka::error::KafkaError::Canceled))),
        _ => std::future::pending().await,
    }
}
