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
//! A commit does not stop the stream: while transaction N commits, WAL is read on and the
//! events of N+1 are buffered; they are produced once N's commit returned (a producer has one
//! open transaction at a time).
//!
//! ```text
//!  read:     N's events ─┬─ N+1's events (buffered) ─────────┬─ N+2's (buffered) ─ …
//!  producer: N's records ─ progress(N) ─ every ack ─ EndTxn(N) ┴ N+1's records ─ progress ─ …
//!                        └ commit of N starts                 └ N committed: checkpoint ≤ N
//! ```
//!
//! # Invariants
//! - A Kafka transaction holds only whole PostgreSQL transactions, and the progress record of
//!   the last of them: its commit starts right after a PostgreSQL COMMIT (once it holds
//!   `kafka.transaction_max_events` events or `kafka.transaction_max_bytes` bytes, or is
//!   `kafka.transaction_interval` old), or while no PostgreSQL transaction is being received. A
//!   PostgreSQL transaction larger than the bound is still one Kafka transaction.
//! - The commit of a Kafka transaction produces its progress record right behind its events,
//!   without waiting for their delivery reports, and hands `commit_transaction` to a blocking
//!   thread, which waits until librdkafka released every record of it (all their delivery
//!   reports served), then commits. A Kafka transaction is atomic whatever order its records
//!   were acknowledged in, and librdkafka refuses to commit one whose record failed delivery
//!   (it must be aborted): a commit that succeeds holds every event and the progress record.
//!   Meanwhile events read get their sequence numbers and are buffered with the PostgreSQL
//!   commits between them, never handed to the producer, so the transaction committing holds
//!   exactly the sequence numbers below its `through_seq` and its progress record describes
//!   exactly them. Once the commit returned, the buffer is produced into the next transaction up to the
//!   first buffered PostgreSQL commit at which that one is due, whose commit then starts.
//!   Intake stops while the buffer holds `kafka.transaction_max_bytes`.
//! - The checkpoint counts an event only when its Kafka transaction commits
//!   ([`Checkpoint::ack_through`] of its `through_seq`): a delivery report alone confirms
//!   nothing, nor does buffering, so the slot is never confirmed past the last committed Kafka
//!   transaction. A session that ends while a commit is in flight waits for its outcome; the
//!   buffered events are dropped (the next session reads them again from the slot).
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
//!   hiding the records of aborted transactions from `read_committed` readers, as Kafka does:
//!   the progress record of a transaction that was aborted (or never committed: the process
//!   died, or one of its events failed) may have been acknowledged before its events were.
//!   A later session of the same process trusts no record beyond the last one it committed
//!   itself, so on a broker that shows aborted transactions an abort the process lived
//!   through still loses nothing (its events are sent again).
//! - An aborted transaction confirms nothing; the session ends and the next one starts over from
//!   the slot and the progress record. A fenced producer stops the process: as a takeover by
//!   another walbox, unless the session's transaction had been open `transaction.timeout.ms`,
//!   in which case the coordinator aborted it ([`Relay::judge_fenced`]). If the brokers' silence
//!   during its life accounts for the excess, they were unreachable: the session ends as a
//!   transient fault, with a new producer for the next one. Otherwise walbox stops as a
//!   timed-out transaction (the configuration cannot relay that PostgreSQL transaction;
//!   `kafka.transaction_interval` is always shorter than the timeout).
//! - Intake is bounded by records not yet delivered (`relay.max_in_flight`), not by records not
//!   yet committed, so a PostgreSQL transaction larger than the cap streams through; the
//!   checkpoint keeps one byte per uncommitted event.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::RelayError;
use super::kafka_txn::{
    blocking, commit_blocking, commit_returned, event_bytes, Buffered, Closing, KafkaTxn, Phase,
    TXN_CALL_TIMEOUT,
};
use super::lineage::{self, ServerHistory, Trust};
use super::{Relay, Session, SessionEnd};
use crate::config::ExactlyOnce;
use crate::failure::Classify;
use crate::fault::crash_point;
use crate::lsn::Lsn;
use crate::outbox::OutboxEvent;
use crate::sink::kafka::KafkaSink;
use crate::sink::progress::{self, ProgressKey};
use crate::sink::transaction::{self, classify_txn, transactional_id, OpenTxn, TxnError};
use crate::sink::{AckQueue, Sink, SinkError};
use crate::source::replication::{ReplicationStream, StandbyStatus};

impl Relay {
    /// [`Self::begin_exactly_once`], sending status updates at `start` meanwhile: it can wait on
    /// another producer's open transaction, and the walsender ends a connection that sends no
    /// status for `wal_sender_timeout`.
    pub(super) async fn begin_keeping_alive(
        &mut self,
        stream: &mut ReplicationStream,
        start: Lsn,
        key: &ProgressKey,
        bounds: ExactlyOnce,
        server: &ServerHistory,
    ) -> Result<KafkaTxn, RelayError> {
        let status_interval = self.settings.postgres.status_interval;
        let begin = self.begin_exactly_once(key, bounds, server);
        tokio::pin!(begin);
        let mut tick = tokio::time::interval(status_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                began = &mut begin => return began,
                _ = tick.tick() => {
                    let at = StandbyStatus { write: start, flush: start, apply: start, reply_requested: false };
                    if let Err(e) = stream.send_status(at).await {
                        tracing::debug!(error = %e, "a status update while exactly-once mode starts");
                    }
                }
            }
        }
    }

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
        let started = Instant::now();
        if let Err(e) = blocking(&sink, KafkaSink::init_transactions).await {
            return Err(RelayError::Transaction(classify_txn(&sink, &id, e)));
        }
        let init_took = started.elapsed();
        // From here on the old producer's reports are of no interest.
        let old = std::mem::replace(&mut self.sink, Sink::Kafka(sink));
        self.acks = acks;
        crate::sink::close_in_background("producer-close", old);
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
        let written_here = record
            .as_ref()
            .is_some_and(|r| r.writer.as_deref() == Some(progress::writer_id()));
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
        // A record this process wrote beyond the last one it committed is of a transaction it
        // aborted (a failed record, a refused commit): on a broker that shows aborted
        // transactions to `read_committed` readers, its events may never have been written, so
        // it is not trusted. A record another process wrote (a hot standby that held the slot
        // meanwhile and committed past this one) is trusted as read.
        let (skip_below, skip_commit_time) = match self.eos_committed {
            Some((mine, time)) if written_here && skip_below > mine => {
                tracing::warn!(
                    recorded = %skip_below, committed = %mine,
                    "the last progress record lies beyond the last one this process committed: the broker shows aborted transactions; trusted only up to the committed one"
                );
                (mine, time)
            }
            _ => (skip_below, skip_commit_time),
        };
        tracing::info!(
            transactional_id = %id, committed = %skip_below,
            init_ms = init_took.as_millis() as u64,
            progress_read_ms = (started.elapsed() - init_took).as_millis() as u64,
            "exactly-once mode: kafka transactions ready"
        );
        Ok(KafkaTxn {
            id,
            bounds,
            open: false,
            opened_at: Instant::now(),
            first_ack_pending: false,
            started: Instant::now(),
            events: 0,
            bytes: 0,
            last_commit: None,
            closing: None,
            buffer: VecDeque::new(),
            skip_below,
            skip_commit_time,
            skipping: false,
            discard_below: 0,
        })
    }

    /// Counts `event` into the Kafka transaction being filled, opening one in the producer if
    /// none is open. `true` when a commit is in flight: the event is then buffered under the
    /// next sequence number, produced once that commit returned, and not handed to the
    /// producer now.
    pub(super) fn ensure_kafka_txn(
        &mut self,
        s: &mut Session,
        event: &OutboxEvent,
        route: usize,
    ) -> Result<bool, RelayError> {
        let Some(txn) = s.eos.as_mut() else {
            return Ok(false);
        };
        let (bytes, now) = (event_bytes(event), Instant::now());
        if txn.closing.is_some() {
            txn.count(bytes, now);
            let seq = s.checkpoint.event();
            txn.buffer.push_back(Buffered::Event {
                event: Box::new(event.clone()),
                route,
                seq,
                bytes,
                read_at: now,
            });
            crash_point!("relay::eos-buffered");
            return Ok(true);
        }
        if !txn.open {
            self.open_kafka_txn(txn)?;
        }
        txn.count(bytes, now);
        Ok(false)
    }

    /// `begin_transaction`.
    fn open_kafka_txn(&self, txn: &mut KafkaTxn) -> Result<(), RelayError> {
        if let Err(e) = self.txn_sink().begin_transaction() {
            return Err(RelayError::Transaction(classify_txn(
                self.txn_sink(),
                &txn.id,
                e,
            )));
        }
        txn.open = true;
        txn.opened_at = Instant::now();
        txn.first_ack_pending = true;
        Ok(())
    }

    /// A PostgreSQL transaction ended (its events, if any, are in the Kafka transaction being
    /// filled): starts its commit when it is due.
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
        if !txn.holds_events() {
            return Ok(());
        }
        txn.last_commit = Some((end_lsn, Some(commit_time)));
        if txn.closing.is_some() {
            txn.buffer.push_back(Buffered::Commit(end_lsn, commit_time));
        } else if txn.due() {
            let through_seq = s.checkpoint.next_seq();
            self.start_commit(s, through_seq);
            self.drive_commit(s).await?;
        }
        Ok(())
    }

    /// Starts committing the open Kafka transaction, with the progress record of its last
    /// PostgreSQL transaction; it holds every sequence number below `through_seq`, and only
    /// those. Called only where no PostgreSQL transaction is partly in it: right after a
    /// PostgreSQL commit was received or replayed from the buffer, or while none is being
    /// received. From here until the commit returns, events read are buffered.
    pub(super) fn start_commit(&mut self, s: &mut Session, through_seq: u64) {
        let Some(txn) = s.eos.as_mut().filter(|t| t.committable()) else {
            return;
        };
        let Some((end_lsn, commit_time)) = txn.last_commit else {
            return;
        };
        txn.closing = Some(Closing {
            started: Instant::now(),
            through_seq,
            end_lsn,
            commit_time,
            phase: Phase::Sealing,
            events_acked: false,
            progress_acked: false,
        });
        txn.reset_fill();
    }

    /// Starts committing the open Kafka transaction while no PostgreSQL transaction is being
    /// received (its age bound, the end of the session).
    pub(super) fn start_idle_commit(&mut self, s: &mut Session) {
        if s.txn.is_none() && s.eos.as_ref().is_some_and(|t| t.buffer.is_empty()) {
            let through_seq = s.checkpoint.next_seq();
            self.start_commit(s, through_seq);
        }
    }

    /// Moves the commit just started on: produces its progress record right behind its
    /// events, without waiting for their delivery reports (the Kafka transaction commits or
    /// aborts whole: see the module docs), and hands `commit_transaction` to a blocking thread
    /// (which waits for every report first: see [`commit_blocking`]). Called right after
    /// [`Self::start_commit`], and at the loop's head while the producer's queue is full.
    pub(super) async fn drive_commit(&mut self, s: &mut Session) -> Result<(), RelayError> {
        let Some(txn) = s.eos.as_mut().filter(|t| t.sealing()) else {
            return Ok(());
        };
        let id = txn.id.clone();
        let Some(closing) = txn.closing.as_ref() else {
            return Ok(());
        };
        let (end_lsn, commit_time) = (closing.end_lsn, closing.commit_time);
        if s.outstanding == 0 {
            self.observe_events_acked(s);
        }
        if let Some(key) = self.progress_key.clone() {
            loop {
                match self.send_progress(&key, end_lsn, commit_time) {
                    Ok(()) => break,
                    Err(SinkError::QueueFull) => {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(SinkError::Send(e)) | Err(SinkError::Config(e)) => {
                        return Err(RelayError::Transaction(classify_txn(
                            self.txn_sink(),
                            &id,
                            e,
                        )));
                    }
                    // Only Kafka runs exactly-once mode.
                    Err(SinkError::Broker(e)) => return Err(RelayError::Producer(e.into())),
                }
            }
        }
        crash_point!("relay::eos-before-commit");
        let sink = self.txn_sink().clone();
        let flush = self
            .metrics
            .kafka_transaction_phase
            .with_label_values(&["flush"]);
        let took = self.metrics.kafka_transaction_commit.clone();
        let handle =
            tokio::task::spawn_blocking(move || commit_blocking(&sink, &id, &flush, &took));
        if let Some(closing) = s.eos.as_mut().and_then(|t| t.closing.as_mut()) {
            closing.phase = Phase::Committing { handle };
        }
        Ok(())
    }

    /// Every event of the commit in flight is acknowledged: observes the `acks` step (commit
    /// started → that moment), once per commit.
    pub(super) fn observe_events_acked(&mut self, s: &mut Session) {
        if let Some(started) = s.eos.as_mut().and_then(KafkaTxn::events_acked) {
            self.metrics
                .kafka_transaction_phase
                .with_label_values(&["acks"])
                .observe(started.elapsed().as_secs_f64());
        }
    }

    /// The commit in flight returned `outcome`. Committed: its events count for the
    /// checkpoint (never one past its `through_seq`), and the buffered events are produced
    /// into the next transaction, up to the first buffered PostgreSQL commit at which it is
    /// full; its commit then starts, and the rest stays buffered behind it. Its age bound is
    /// looked at only once the buffer is through (what waited behind a commit is committed
    /// together, not one PostgreSQL transaction per commit). Failed: the error, with the
    /// transaction still open for the abort.
    pub(super) async fn on_commit_returned(
        &mut self,
        s: &mut Session,
        outcome: Result<(), TxnError>,
    ) -> Result<(), RelayError> {
        self.settle_commit(s, outcome)?;
        // The committed transaction's delivery reports are all in (its commit waited for
        // them): taken before the next transaction opens, they time none of its steps.
        self.take_acks(s)?;
        let Some(txn) = s.eos.as_mut() else {
            return Ok(());
        };
        if txn.buffer.is_empty() {
            return Ok(());
        }
        self.open_kafka_txn(txn)?;
        txn.events = 0;
        txn.bytes = 0;
        txn.last_commit = None;
        // Whether the last item produced ended a PostgreSQL transaction.
        let mut at_commit = false;
        while let Some(item) = s.eos.as_mut().and_then(|t| t.buffer.pop_front()) {
            at_commit = matches!(item, Buffered::Commit(..));
            match item {
                Buffered::Event {
                    event,
                    route,
                    seq,
                    bytes,
                    read_at,
                } => {
                    self.send(s, &event, seq, route).await?;
                    s.outstanding += 1;
                    if let Some(txn) = s.eos.as_mut() {
                        txn.count(bytes, read_at);
                    }
                    crash_point!("relay::produced");
                }
                Buffered::Commit(end_lsn, commit_time) => {
                    let Some(txn) = s.eos.as_mut() else {
                        return Ok(());
                    };
                    txn.last_commit = Some((end_lsn, Some(commit_time)));
                    if txn.full() {
                        let through_seq = txn
                            .first_buffered_seq()
                            .unwrap_or_else(|| s.checkpoint.next_seq());
                        self.start_commit(s, through_seq);
                        return self.drive_commit(s).await;
                    }
                }
            }
        }
        // Through the buffer, which ended with a PostgreSQL commit: no event of a later one
        // has a sequence number yet.
        if at_commit && s.eos.as_ref().is_some_and(KafkaTxn::due) {
            let through_seq = s.checkpoint.next_seq();
            self.start_commit(s, through_seq);
            self.drive_commit(s).await?;
        }
        Ok(())
    }

    /// Records the outcome of the commit that returned: counts the committed transaction's
    /// events in the checkpoint, or hands back the error (the transaction stays open, to be
    /// aborted).
    fn settle_commit(
        &mut self,
        s: &mut Session,
        outcome: Result<(), TxnError>,
    ) -> Result<(), RelayError> {
        let Some(txn) = s.eos.as_mut() else {
            return Ok(());
        };
        let Some(closing) = txn.closing.take() else {
            return Ok(());
        };
        outcome.map_err(RelayError::Transaction)?;
        self.metrics
            .kafka_transactions
            .with_label_values(&["committed"])
            .inc();
        self.metrics
            .kafka_transaction_phase
            .with_label_values(&["whole"])
            .observe(closing.started.elapsed().as_secs_f64());
        txn.open = false;
        self.eos_committed = Some((closing.end_lsn, closing.commit_time));
        crash_point!("relay::eos-committed");
        if s.checkpoint.ack_through(closing.through_seq) > 0 {
            self.observe_confirmed(s);
        }
        Ok(())
    }

    /// Commits the transaction being filled and waits for it: first the commit in flight, if
    /// any, then (once its buffered events are produced) the open transaction.
    pub(super) async fn commit_kafka_txn(&mut self, s: &mut Session) -> Result<(), RelayError> {
        self.finish_commit(s).await?;
        self.start_idle_commit(s);
        self.finish_commit(s).await
    }

    /// Waits until no commit is in flight: its progress record, `commit_transaction` (with
    /// the delivery reports it waits for), and the production of the events buffered
    /// meanwhile.
    async fn finish_commit(&mut self, s: &mut Session) -> Result<(), RelayError> {
        loop {
            let Some(txn) = s.eos.as_mut() else {
                return Ok(());
            };
            if !txn.committing() {
                return Ok(());
            }
            if txn.sealing() {
                self.drive_commit(s).await?;
                continue;
            }
            let outcome = commit_returned(&mut s.eos).await;
            self.on_commit_returned(s, outcome).await?;
        }
    }

    /// Aborts the open Kafka transaction, if any, once its records' delivery reports are in
    /// ([`Relay::acknowledged`]; when some never come, the next session's producer aborts it
    /// as it fences this one): nothing of it is confirmed, and its records' delivery reports
    /// are ignored from now on. `Err` only when the producer cannot go on (fenced by a newer
    /// walbox, say).
    pub(super) async fn abort_kafka_txn(&mut self, s: &mut Session) -> Result<(), RelayError> {
        let next_seq = s.checkpoint.next_seq();
        let Some(txn) = s.eos.as_mut() else {
            return Ok(());
        };
        txn.buffer.clear();
        txn.closing = None;
        txn.reset_fill();
        let open = std::mem::replace(&mut txn.open, false);
        if open && !self.acknowledged(s).await {
            tracing::warn!(outstanding = s.outstanding, "the kafka transaction's records are not all acknowledged: not aborting it; the next session's producer aborts it");
        }
        let Some(txn) = s.eos.as_mut() else {
            return Ok(());
        };
        txn.discard_below = next_seq;
        if !open || s.outstanding > 0 {
            return Ok(());
        }
        let id = txn.id.clone();
        let result = blocking(self.txn_sink(), KafkaSink::abort_transaction).await;
        self.metrics
            .kafka_transactions
            .with_label_values(&["aborted"])
            .inc();
        match result.map_err(|e| classify_txn(self.txn_sink(), &id, e)) {
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

    /// Waits (bounded by `relay.shutdown_timeout`) for the delivery reports of every record
    /// produced; `true` when none is outstanding. The coordinator accepts an abort only once
    /// the transaction holds a partition: right after the previous commit, the first records
    /// of the next transaction may still wait for that (the previous transaction's markers),
    /// and an abort then is refused (INVALID_TXN_STATE), which librdkafka makes fatal.
    async fn acknowledged(&mut self, s: &mut Session) -> bool {
        let deadline = Instant::now() + self.settings.relay.shutdown_timeout;
        while s.outstanding > 0 && self.acks.fatal().is_none() {
            // A failed record is accounted for too; the abort is what follows it.
            let _ = self.take_acks(s);
            let left = deadline.saturating_duration_since(Instant::now());
            if s.outstanding == 0 || left.is_zero() {
                break;
            }
            let acks = self.acks.clone();
            let _ = tokio::time::timeout(left, acks.wait()).await;
        }
        s.outstanding == 0
    }

    /// Ends the session's Kafka transactions: committed when the session ends cleanly between
    /// PostgreSQL transactions, aborted otherwise (after a commit in flight returned: what it
    /// committed counts, the events buffered behind it are dropped). `Err` when the producer
    /// cannot go on (fenced, say): that is then the session's error, whatever ended it.
    pub(super) async fn end_kafka_txn(
        &mut self,
        s: &mut Session,
        clean: bool,
    ) -> Result<(), RelayError> {
        if s.eos.is_none() {
            return Ok(());
        }
        let fatal = |e: &RelayError| e.failure().is_some();
        if clean && s.txn.is_none() {
            match self.commit_kafka_txn(s).await {
                Ok(()) => return Ok(()),
                Err(e) if fatal(&e) => {
                    let _ = self.abort_kafka_txn(s).await;
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "committing the last kafka transaction failed")
                }
            }
        } else if s.eos.as_ref().is_some_and(|t| !t.sealing()) {
            // A commit on its blocking thread: its outcome decides what is confirmed.
            let outcome = match s.eos.as_ref().is_some_and(KafkaTxn::committing) {
                true => Some(commit_returned(&mut s.eos).await),
                false => None,
            };
            if let Some(Err(e)) = outcome.map(|o| self.settle_commit(s, o)) {
                if fatal(&e) {
                    let _ = self.abort_kafka_txn(s).await;
                    return Err(e);
                }
                tracing::warn!(error = %e, "committing the kafka transaction failed");
            }
        }
        self.abort_kafka_txn(s).await
    }

    /// The session's `result` once its Kafka transactions ended, judged when the producer was
    /// fenced while the transaction `open` had been open at least its timeout: the coordinator
    /// aborted it ([`transaction::timed_out_or`]). When that was an outage of the brokers, the
    /// session ends as a transient fault and the fenced producer, which can never be used
    /// again, is replaced by a fresh one for the next session (which makes its own
    /// transactional producer): its fatal error would otherwise stop walbox as a takeover, and
    /// the delivery reports its records still owe will never come (an aborted transaction
    /// confirms nothing: they are not awaited).
    pub(super) fn judge_fenced(
        &mut self,
        s: &mut Session,
        result: Result<SessionEnd, RelayError>,
        open: Option<OpenTxn>,
    ) -> Result<SessionEnd, RelayError> {
        let (e, open) = match (result, open) {
            (Err(RelayError::Transaction(e)), Some(open)) => (e, open),
            (result, _) => return result,
        };
        let e = transaction::timed_out_or(e, open, self.txn_sink());
        if let TxnError::Interrupted { .. } = e {
            let acks = Arc::new(AckQueue::default());
            match KafkaSink::new(&self.settings.kafka, acks.clone()) {
                Ok(sink) => {
                    let fenced = std::mem::replace(&mut self.sink, Sink::Kafka(sink));
                    self.acks = acks;
                    s.outstanding = 0;
                    crate::sink::close_in_background("producer-close", fenced);
                }
                Err(error) => {
                    tracing::warn!(%error, "a new kafka producer could not be made; the next session tries again")
                }
            }
        }
        Err(RelayError::Transaction(e))
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
