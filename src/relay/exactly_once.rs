//! Exactly-once mode (`kafka.exactly_once = true`): Kafka transactions around whole PostgreSQL
//! transactions, with the progress record inside them.
//!
//! ```text
//!  BEGIN … INSERT … COMMIT (end E1)  BEGIN … COMMIT (end E2)  …
//!  └──────── one Kafka transaction: events of E1, E2, …, then progress(slot, E2) ─ commit ─┐
//!                                                      checkpoint: every event up to E2 ◄─┘
//!                                                      status update: flush = E2
//! ```
//!
//! # Invariants
//! - A Kafka transaction holds only whole PostgreSQL transactions, and the progress record of
//!   the last of them: it is committed right after a PostgreSQL COMMIT (once it holds
//!   `kafka.transaction_max_events` events or is `kafka.transaction_interval` old), or while no
//!   PostgreSQL transaction is being received. A PostgreSQL transaction larger than the bound is
//!   still one Kafka transaction.
//! - The checkpoint counts an event only when its Kafka transaction commits
//!   ([`Checkpoint::ack_through`]): a delivery report alone confirms nothing, so the slot is
//!   never confirmed past the last committed Kafka transaction.
//! - At session start, once this process holds the slot (START_REPLICATION succeeded: a second
//!   process that cannot get the slot never fences the one streaming), `init_transactions`
//!   fences every earlier producer of the slot (and aborts what it left open) before the
//!   progress topic is read `read_committed`, so the record read is the last one committed.
//!   Every PostgreSQL transaction whose commit LSN is below it is already in Kafka: what
//!   PostgreSQL sends again below it is skipped (counted, not produced). The record is trusted
//!   only as far as it is of the server's timeline history and of this generation of the slot
//!   (see [`lineage`]): a record of another history is ignored or cut at the point where the
//!   histories part, duplicates rather than silent loss. This closes the window
//!   between a Kafka commit and the status update that confirms it. It relies on the broker
//!   hiding the records of aborted transactions from `read_committed` readers, as Kafka does;
//!   on a broker that does not, it still loses nothing, because a transaction's progress
//!   record is sent only after every one of its events was acknowledged.
//! - An aborted transaction confirms nothing; the session ends and the next one starts over from
//!   the slot and the progress record. A fenced producer stops the process: as a takeover by
//!   another walbox, unless the session's transaction had been open `transaction.timeout.ms`,
//!   in which case the coordinator aborted it and walbox stops as a timed-out transaction (the
//!   configuration cannot relay that PostgreSQL transaction; `kafka.transaction_interval` is
//!   always shorter than the timeout).
//! - Intake is bounded by records not yet delivered (`relay.max_in_flight`), not by records not
//!   yet committed, so a PostgreSQL transaction larger than the cap streams through; the
//!   checkpoint keeps one byte per uncommitted event.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::RelayError;
use super::lineage::{self, ServerHistory, Trust};
use super::{Relay, Session};
use crate::config::ExactlyOnce;
use crate::failure::Classify;
use crate::fault::crash_point;
use crate::lsn::Lsn;
use crate::sink::kafka::{AckQueue, KafkaSink, SinkError};
use crate::sink::progress::{self, ProgressKey};
use crate::sink::transaction::{classify_txn, transactional_id, TxnError};

/// How long one `init_transactions`, `commit_transaction` or `abort_transaction` call may take.
const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long retriable commit errors are retried before the transaction is aborted.
const COMMIT_RETRY_FOR: Duration = Duration::from_secs(60);

/// Runs one of the producer's blocking transactional calls off the runtime, bounded by
/// [`TXN_CALL_TIMEOUT`].
async fn blocking(
    sink: &KafkaSink,
    call: fn(&KafkaSink, Duration) -> Result<(), rdkafka::error::KafkaError>,
) -> Result<(), rdkafka::error::KafkaError> {
    let sink = sink.clone();
    tokio::task::spawn_blocking(move || call(&sink, TXN_CALL_TIMEOUT))
        .await
        .unwrap_or(Err(rdkafka::error::KafkaError::Canceled))
}

/// The Kafka transaction of one session.
pub(super) struct KafkaTxn {
    /// `transactional.id`.
    pub id: String,
    bounds: ExactlyOnce,
    /// A Kafka transaction is open.
    open: bool,
    started: Instant,
    /// Events produced in the open transaction.
    events: usize,
    /// The commit end LSN and commit time (PostgreSQL microseconds) of the last whole
    /// PostgreSQL transaction in the open Kafka transaction.
    last_commit: Option<(Lsn, Option<i64>)>,
    /// PostgreSQL transactions whose commit LSN is below this are in Kafka already: the
    /// position of the progress record read at start-up.
    pub skip_below: Lsn,
    /// That record's commit time (PostgreSQL microseconds), when it has one.
    skip_commit_time: Option<i64>,
    /// The PostgreSQL transaction being received is one of those.
    pub skipping: bool,
    /// Delivery reports of sequence numbers below this belong to an aborted transaction.
    pub discard_below: u64,
}

impl KafkaTxn {
    /// Whether the open transaction should be committed now (right after a PostgreSQL commit,
    /// or while none is being received).
    pub fn due(&self) -> bool {
        self.committable()
            && (self.events >= self.bounds.max_events
                || self.started.elapsed() >= self.bounds.interval)
    }

    /// When the open transaction reaches its age bound.
    pub fn deadline(&self) -> Instant {
        self.started + self.bounds.interval
    }

    /// How long the open transaction has been open (`None` when none is).
    pub fn open_for(&self) -> Option<Duration> {
        self.open.then(|| self.started.elapsed())
    }

    /// `transaction.timeout.ms`.
    pub fn timeout(&self) -> Duration {
        self.bounds.timeout
    }

    /// Whether a transaction is open and holds a whole PostgreSQL transaction.
    pub fn committable(&self) -> bool {
        self.open && self.last_commit.is_some()
    }
}

impl Relay {
    /// Starts exactly-once mode for a session on `key`'s slot: a transactional producer (the
    /// relay's sink from now on), fencing the previous one, and the last committed progress
    /// record, below which nothing is produced again. Blocking calls run off the runtime.
    pub(super) async fn begin_exactly_once(
        &mut self,
        key: &ProgressKey,
        bounds: ExactlyOnce,
        server: &ServerHistory,
    ) -> Result<KafkaTxn, RelayError> {
        let id = transactional_id(key);
        let acks = Arc::new(AckQueue::default());
        let sink = KafkaSink::transactional(&self.settings.kafka, acks.clone(), &id)
            .map_err(|e| RelayError::Transaction(TxnError::Config(e)))?;
        if let Err(e) = blocking(&sink, KafkaSink::init_transactions).await {
            return Err(RelayError::Transaction(classify_txn(&sink, &id, e)));
        }
        // From here on the old producer's reports are of no interest.
        self.sink = sink;
        self.acks = acks;
        let config = self.settings.kafka.clone();
        let lookup = key.clone();
        let record = tokio::task::spawn_blocking(move || {
            progress::read_last(&config, &lookup, TXN_CALL_TIMEOUT)
        })
        .await
        .unwrap_or_else(|_| {
            Err(progress::ProgressError::Timeout(
                self.settings.kafka.progress_topic.clone(),
            ))
        })
        .map_err(|e| RelayError::Transaction(TxnError::Progress(e)))?;
        // A record of another history or slot generation (a point-in-time restore, a promoted
        // asynchronous standby that lags, a slot made again: LSNs reused) would skip new
        // transactions as "already in Kafka": it is trusted only as far as it is ours.
        let (skip_below, skip_commit_time) = match record {
            None => (Lsn::ZERO, None),
            Some(r) => match lineage::trust(&r, server) {
                Trust::Whole => {
                    let time = r
                        .confirmed_commit_time_us
                        .map(crate::timestamp::unix_micros_to_pg_micros);
                    (r.confirmed_lsn, time)
                }
                Trust::Until(switchpoint) => {
                    tracing::warn!(
                        recorded = %r.confirmed_lsn, timeline = r.timeline, trusted_up_to = %switchpoint,
                        "the last progress record is of an earlier timeline and lies beyond the point where the server's history left it; trusted only up to that point, so transactions after it may be sent again"
                    );
                    (switchpoint, None)
                }
                Trust::Ignored(reason) => {
                    tracing::warn!(
                        recorded = %r.confirmed_lsn, timeline = r.timeline, slot_floor = ?r.slot_floor,
                        "the last progress record is ignored: {reason}; so transactions may be sent again, none is skipped"
                    );
                    (Lsn::ZERO, None)
                }
            },
        };
        tracing::info!(transactional_id = %id, committed = %skip_below, "exactly-once mode: kafka transactions ready");
        Ok(KafkaTxn {
            id,
            bounds,
            open: false,
            started: Instant::now(),
            events: 0,
            last_commit: None,
            skip_below,
            skip_commit_time,
            skipping: false,
            discard_below: 0,
        })
    }

    /// Opens a Kafka transaction if none is open; called before each event is produced.
    pub(super) fn ensure_kafka_txn(&mut self, s: &mut Session) -> Result<(), RelayError> {
        let Some(txn) = s.eos.as_mut() else {
            return Ok(());
        };
        if !txn.open {
            self.open_kafka_txn(txn)?;
        }
        txn.events += 1;
        Ok(())
    }

    /// `begin_transaction`, and a fresh count for the new transaction.
    fn open_kafka_txn(&self, txn: &mut KafkaTxn) -> Result<(), RelayError> {
        if let Err(e) = self.sink.begin_transaction() {
            return Err(RelayError::Transaction(classify_txn(
                &self.sink, &txn.id, e,
            )));
        }
        txn.open = true;
        txn.started = Instant::now();
        txn.events = 0;
        txn.last_commit = None;
        Ok(())
    }

    /// A PostgreSQL transaction ended (its events, if any, are in the open Kafka transaction):
    /// commits the Kafka transaction when it is due.
    pub(super) async fn on_pg_commit(
        &mut self,
        s: &mut Session,
        end_lsn: Lsn,
        commit_time: i64,
    ) -> Result<(), RelayError> {
        let Some(txn) = s.eos.as_mut() else {
            return Ok(());
        };
        txn.skipping = false;
        if !txn.open {
            return Ok(());
        }
        txn.last_commit = Some((end_lsn, Some(commit_time)));
        if txn.due() {
            self.commit_kafka_txn(s).await?;
        }
        Ok(())
    }

    /// Commits the open Kafka transaction with the progress record of its last PostgreSQL
    /// transaction, then counts its events in the checkpoint. Only called while no PostgreSQL
    /// transaction is partly in it: every event produced so far is then in it whole, so it
    /// holds every sequence number below the checkpoint's next one.
    pub(super) async fn commit_kafka_txn(&mut self, s: &mut Session) -> Result<(), RelayError> {
        let Some(txn) = s.eos.as_mut() else {
            return Ok(());
        };
        let Some((end_lsn, commit_time)) = txn.last_commit.filter(|_| txn.open) else {
            return Ok(());
        };
        let id = txn.id.clone();
        let through_seq = s.checkpoint.next_seq();
        // Every event of the transaction is acknowledged before its progress record is sent:
        // a progress record a broker shows always follows all of its events, even on a broker
        // that shows aborted transactions to read_committed readers (see the module docs).
        let deadline = Instant::now() + TXN_CALL_TIMEOUT;
        loop {
            // A failed record ends the session here (the transaction is then aborted).
            self.take_acks(s)?;
            if s.outstanding == 0 {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RelayError::Transaction(TxnError::Abortable(
                    rdkafka::error::KafkaError::Flush(
                        rdkafka::types::RDKafkaErrorCode::OperationTimedOut,
                    ),
                )));
            }
            let acks = self.acks.clone();
            let _ = tokio::time::timeout(left, acks.wait()).await;
        }
        if let Some(key) = self.progress_key.clone() {
            loop {
                match self.send_progress(&key, end_lsn, commit_time) {
                    Ok(()) => break,
                    Err(SinkError::QueueFull) => {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(SinkError::Send(e)) | Err(SinkError::Config(e)) => {
                        return Err(RelayError::Transaction(classify_txn(&self.sink, &id, e)));
                    }
                }
            }
        }
        crash_point!("relay::eos-before-commit");
        let started = Instant::now();
        let retry_until = started + COMMIT_RETRY_FOR;
        let mut backoff = Duration::from_millis(50);
        loop {
            let result = blocking(&self.sink, KafkaSink::commit_transaction).await;
            match result.map_err(|e| classify_txn(&self.sink, &id, e)) {
                Ok(()) => break,
                Err(TxnError::Retriable(e)) if Instant::now() < retry_until => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "committing the kafka transaction; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(TxnError::Retriable(e)) => {
                    return Err(RelayError::Transaction(TxnError::Abortable(e)));
                }
                Err(e) => return Err(RelayError::Transaction(e)),
            }
        }
        self.metrics
            .kafka_transaction_commit
            .observe(started.elapsed().as_secs_f64());
        self.metrics
            .kafka_transactions
            .with_label_values(&["committed"])
            .inc();
        if let Some(txn) = s.eos.as_mut() {
            // Its count and last commit are reset when the next one opens.
            txn.open = false;
        }
        crash_point!("relay::eos-committed");
        if s.checkpoint.ack_through(through_seq) > 0 {
            self.observe_confirmed(s);
        }
        Ok(())
    }

    /// Aborts the open Kafka transaction, if any: nothing of it is confirmed, and its records'
    /// delivery reports are ignored from now on. `Err` only when the producer cannot go on
    /// (fenced by a newer walbox, say).
    pub(super) async fn abort_kafka_txn(&mut self, s: &mut Session) -> Result<(), RelayError> {
        let next_seq = s.checkpoint.next_seq();
        let Some(txn) = s.eos.as_mut() else {
            return Ok(());
        };
        txn.discard_below = next_seq;
        if !txn.open {
            return Ok(());
        }
        txn.open = false;
        let id = txn.id.clone();
        let result = blocking(&self.sink, KafkaSink::abort_transaction).await;
        self.metrics
            .kafka_transactions
            .with_label_values(&["aborted"])
            .inc();
        match result.map_err(|e| classify_txn(&self.sink, &id, e)) {
            Ok(()) => {
                tracing::info!("kafka transaction aborted; its events are sent again from the slot's confirmed position");
                Ok(())
            }
            Err(e) if e.failure().is_some() => Err(RelayError::Transaction(e)),
            // The coordinator aborts it when the next session fences this producer, or after
            // transaction.timeout.ms.
            Err(e) => {
                tracing::warn!(error = %e, "aborting the kafka transaction failed; the next session's producer aborts it");
                Ok(())
            }
        }
    }

    /// Ends the session's Kafka transaction: committed when the session ends cleanly between
    /// PostgreSQL transactions, aborted otherwise. `Err` when the producer cannot go on (fenced,
    /// say): that is then the session's error, whatever ended it.
    pub(super) async fn end_kafka_txn(
        &mut self,
        s: &mut Session,
        clean: bool,
    ) -> Result<(), RelayError> {
        let Some(txn) = s.eos.as_ref() else {
            return Ok(());
        };
        if clean && s.txn.is_none() && txn.committable() {
            match self.commit_kafka_txn(s).await {
                Ok(()) => return Ok(()),
                Err(e) if e.failure().is_some() => {
                    let _ = self.abort_kafka_txn(s).await;
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "committing the last kafka transaction failed")
                }
            }
        }
        self.abort_kafka_txn(s).await
    }

    /// Writes the session's first progress record in a transaction of its own (exactly-once
    /// mode cannot write outside one): the evidence that the slot exists. Its position is the
    /// session's `start` (the slot's confirmed position), or the position read at start-up
    /// when that is further, with that record's commit time: the progress record never moves
    /// backwards, or a crash before the next commit would make the next session send again
    /// what lies between the two.
    pub(super) async fn eos_start_record(
        &mut self,
        s: &mut Session,
        start: Lsn,
    ) -> Result<(), RelayError> {
        let Some(txn) = s.eos.as_mut() else {
            return Ok(());
        };
        self.open_kafka_txn(txn)?;
        txn.last_commit = Some(if txn.skip_below > start {
            (txn.skip_below, txn.skip_commit_time)
        } else {
            (start, self.confirmed_commit_time)
        });
        self.commit_kafka_txn(s).await
    }
}
