//! The session loop: one `biased` `tokio::select!` over, in that order, shutdown, the receive
//! timeout, acks, exactly-once commits, status deadlines and WAL, and what each message does to
//! the checkpoint. See the invariants in the [`super`] docs.

use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;

use super::coverage::Change;
use super::error::{DeliveryFailure, RelayError, Uncovered};
use super::kafka_txn::{commit_returned, KafkaTxn};
use super::{OpenTxn, Relay, Session, SessionEnd, EAGER_STATUS_GAP, MAX_BURST};
use crate::failure::Class;
use crate::fault::crash_point;
use crate::health::monitor::HEARTBEAT_PREFIX;
use crate::lsn::Lsn;
use crate::outbox::EventPosition;
use crate::shard::RESHARD_PREFIX;
use crate::sink::{Ack, Publisher, PROGRESS_ROUTE};
use crate::source::pgoutput::LogicalMessage;
use crate::source::replication::{ReplicationError, ReplicationMessage, StandbyStatus};
use crate::timestamp::pg_now_micros;

impl Relay {
    pub(super) async fn stream_loop(
        &mut self,
        s: &mut Session,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<SessionEnd, RelayError> {
        let status_interval = self.settings.postgres.status_interval;
        let mut status_tick = tokio::time::interval(status_interval);
        status_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The publisher's own memory bound, when lower (RabbitMQ, NATS).
        let configured_window = self
            .settings
            .relay
            .max_in_flight
            .min(self.sink.max_held().unwrap_or(usize::MAX));
        // Once shutdown is requested, intake continues only to the end of the open transaction
        // (bounded by `relay.shutdown_timeout`): its acknowledged events are then confirmed and
        // not sent again after the restart.
        let mut draining: Option<Instant> = None;
        let mut liveness = Liveness::new(self.settings.postgres.receive_timeout);
        loop {
            // Exactly-once: a commit whose progress record met a full queue goes on.
            self.drive_commit(s).await?;
            let max_in_flight = self.window(s, configured_window);
            let reading = intake_open(s, max_in_flight);
            if !reading {
                // Not reading (the broker is behind): silence is walbox's own doing.
                liveness.heard();
            }
            if draining.is_none() && *shutdown.borrow() {
                draining = Some(Instant::now() + self.settings.relay.shutdown_timeout);
            }
            if s.drained && s.txn.is_none() {
                return Ok(SessionEnd::Drained);
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
            let eos = s.eos.as_ref();
            let committing = eos.is_some_and(|t| t.committing());
            let idle_commit = s.txn.is_none() && eos.is_some_and(|t| t.committable());
            let eos_at = eos_deadline(s);
            tokio::select! {
                biased;
                changed = shutdown.changed(), if draining.is_none() => {
                    if changed.is_err() {
                        // The sender is gone: nobody can ask any more, so stop as asked.
                        draining = Some(Instant::now() + self.settings.relay.shutdown_timeout);
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(drain_deadline.into()), if draining.is_some() => continue,
                _ = tokio::time::sleep_until(liveness.deadline().into()), if reading && liveness.on() => {
                    match liveness.check()? {
                        Ping::Ask => self.send_status(s, true).await?,
                        Ping::NotYet => {}
                    }
                }
                _ = self.acks.wait() => {
                    self.take_acks(s)?;
                }
                // Exactly-once: the commit in flight returned; what was buffered meanwhile
                // is produced into the next transaction.
                outcome = commit_returned(&mut s.eos), if committing => {
                    self.on_commit_returned(s, outcome).await?;
                }
                // A Kafka transaction that reached its age bound while no PostgreSQL
                // transaction is being received starts its commit now.
                _ = tokio::time::sleep_until(eos_at.into()), if idle_commit => {
                    self.start_idle_commit(s);
                }
                // Confirm progress promptly (releasing WAL sooner), but at most every
                // EAGER_STATUS_GAP: never a status update per event (nor one per wake-up
                // while the publication watch holds the frontier back).
                _ = tokio::time::sleep_until((s.last_status_at + EAGER_STATUS_GAP).into()),
                    if s.coverage.confirmable(s.checkpoint.frontier()) > s.last_status =>
                {
                    self.send_status(s, false).await?;
                }
                _ = status_tick.tick() => {
                    // Acks are normally taken when signalled; taking them here too bounds the
                    // delay of any report whose wake-up was consumed by a cancelled branch.
                    self.take_acks(s)?;
                    self.send_status(s, false).await?;
                }
                msg = s.stream.next(), if reading => {
                    let Some(msg) = msg? else {
                        return Err(RelayError::StreamEnded);
                    };
                    liveness.heard();
                    self.on_message(s, msg).await?;
                    // Work through what the last read already buffered before polling again:
                    // one wake-up per burst of messages, not per message.
                    // The burst yields to shutdown and to a due status update.
                    let mut burst = 0;
                    while burst < MAX_BURST
                        && !s.drained
                        && intake_open(s, max_in_flight)
                        && !(draining.is_some() && s.txn.is_none())
                        && !(draining.is_none() && *shutdown.borrow())
                        && s.last_status_at.elapsed() < status_interval
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
    pub(super) fn take_acks(&mut self, s: &mut Session) -> Result<(), RelayError> {
        if let Some(e) = self.acks.fatal() {
            return Err(self.producer_error(e));
        }
        let mut batch = std::mem::take(&mut self.ack_batch);
        self.acks.drain_into(&mut batch);
        let mut first_error = None;
        for ack in batch.drain(..) {
            if ack.route == PROGRESS_ROUTE {
                // Exactly-once: its commit waits for it (a failed one fails the commit).
                if let Some(started) = s.eos.as_mut().and_then(KafkaTxn::progress_acked) {
                    self.metrics
                        .kafka_transaction_phase
                        .with_label_values(&["progress"])
                        .observe(started.elapsed().as_secs_f64());
                }
                if std::mem::take(&mut s.start_record_pending) {
                    if let Err(error) = ack.result {
                        first_error.get_or_insert(RelayError::ProgressWrite {
                            topic: self.settings.kafka.progress_topic.clone(),
                            error,
                        });
                    }
                    continue;
                }
                if let Err(e) = ack.result {
                    // Written again at the next opportunity.
                    self.progress_lsn = Lsn::ZERO;
                    tracing::warn!(error = %e, "the broker failed a progress record; writing it again");
                }
                continue;
            }
            if let Err(e) = self.on_ack(s, ack) {
                first_error.get_or_insert(e);
            }
        }
        self.ack_batch = batch;
        if s.outstanding == 0 && s.eos.as_ref().is_some_and(KafkaTxn::committing) {
            self.observe_events_acked(s);
        }
        first_error.map_or(Ok(()), Err)
    }

    fn on_ack(&mut self, s: &mut Session, ack: Ack) -> Result<(), RelayError> {
        if !s.checkpoint.owns(ack.seq) {
            return Ok(()); // from an earlier session
        }
        s.outstanding = s.outstanding.saturating_sub(1);
        if s.eos.as_ref().is_some_and(|t| ack.seq < t.discard_below) {
            return Ok(()); // of an aborted Kafka transaction
        }
        match ack.result {
            Ok(()) => {
                self.metrics.events_published.inc();
                if let Some(txn) = s.eos.as_mut().filter(|t| t.first_ack_pending) {
                    txn.first_ack_pending = false;
                    self.metrics
                        .kafka_transaction_phase
                        .with_label_values(&["first_ack"])
                        .observe(txn.opened_at.elapsed().as_secs_f64());
                }
                // Exactly-once: the Kafka commit, not the delivery report, counts an event.
                if s.eos.is_none() && s.checkpoint.ack(ack.seq) > 0 {
                    self.observe_confirmed(s);
                    crash_point!("relay::acked");
                }
                Ok(())
            }
            Err(error) => {
                self.metrics.delivery_errors.inc();
                let failed = ack.failed.unwrap_or_default();
                if error.is_batch_refusal() {
                    if s.isolated {
                        // Produced alone: this record's own timestamp was refused.
                        if let Some(outcome) =
                            self.on_rejected_delivery(s, ack.seq, ack.route, &failed, &error)
                        {
                            return outcome;
                        }
                    } else {
                        // The broker refuses a whole batch for one record's timestamp: every
                        // record of the batch reports it. The next session produces one record
                        // at a time past this one, so the record at fault is told apart.
                        let at = failed.lsn.parse().unwrap_or(Lsn::ZERO);
                        self.isolate_until = Some(self.isolate_until.unwrap_or(Lsn::ZERO).max(at));
                        tracing::warn!(
                            event_id = %failed.id, lsn = %failed.lsn, error = %error,
                            "the broker refused a batch for a record's timestamp; producing one record at a time up to this one to find which"
                        );
                    }
                } else if error.class() == Class::Rejected {
                    if let Some(outcome) =
                        self.on_rejected_delivery(s, ack.seq, ack.route, &failed, &error)
                    {
                        return outcome;
                    }
                }
                Err(RelayError::Delivery(Box::new(DeliveryFailure {
                    id: failed.id,
                    lsn: failed.lsn,
                    topic: failed.topic,
                    error,
                    alone: s.isolated,
                })))
            }
        }
    }

    pub(super) fn observe_confirmed(&mut self, s: &mut Session) {
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
        let message = s.decoder.decode(data)?;
        tracing::trace!(?message, "pgoutput");
        match message {
            LogicalMessage::Begin(b) => {
                if let Some(to) = self.settings.postgres.drain_to {
                    // The marker is decoded before any transaction committing after it.
                    if b.final_lsn >= to {
                        return Err(RelayError::Protocol(format!(
                            "a transaction committing at {} arrived before the reshard marker at {to}",
                            b.final_lsn
                        )));
                    }
                }
                if let Some(txn) = s.eos.as_mut() {
                    // Already in a committed Kafka transaction (see `exactly_once`).
                    txn.skipping = b.final_lsn < txn.skip_below;
                }
                s.checkpoint.begin();
                s.txn = Some(OpenTxn {
                    commit_lsn: b.final_lsn,
                    commit_time: b.commit_time,
                    xid: b.xid,
                    next_index: 0,
                });
                self.metrics.received_lsn.set(b.final_lsn.as_u64() as i64);
            }
            LogicalMessage::Commit(c) => {
                s.txn = None;
                if s.checkpoint.commit(c.commit_lsn, c.end_lsn, c.commit_time) > 0 {
                    self.observe_confirmed(s);
                }
                self.on_pg_commit(s, c.end_lsn, c.commit_time).await?;
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
                if skipped(s, &self.metrics) {
                    return Ok(());
                }
                let mapped = s.mapper.map_insert(&ins, position);
                s.decoder.recycle(ins.tuple);
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
            // A reshard marker: the end of a drain when it is this drain's (its LSN, the end
            // of its record, is the reshard point); any other is not an event.
            LogicalMessage::Message(m) if m.prefix == RESHARD_PREFIX => {
                if !m.transactional && self.settings.postgres.drain_to == Some(m.lsn) {
                    tracing::info!(lsn = %m.lsn, "reached the reshard point");
                    s.drained = true;
                }
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
                if skipped(s, &self.metrics) {
                    return Ok(());
                }
                let mapped = s.mapper.map_message(&m, position);
                self.publish(s, mapped, route).await?;
            }
            LogicalMessage::Type(_) | LogicalMessage::Origin(_) => {}
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
        if r.on_change.fails(op) {
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

    /// Sends the frontier as far as the publication watch released it (`relay::coverage`),
    /// then ends the session if the watch found the publication changed, or cannot read it.
    pub(super) async fn send_status(
        &mut self,
        s: &mut Session,
        reply: bool,
    ) -> Result<(), RelayError> {
        let frontier = s.coverage.confirmable(s.checkpoint.frontier());
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
            crash_point!("relay::status-sent");
            tracing::debug!(lsn = %frontier, "confirmed");
            s.last_status = frontier;
        }
        self.write_progress(frontier, false);
        if let Some((change, read_at)) = s.coverage.change() {
            return Err(self.uncovered(s, change, read_at));
        }
        match s.coverage.unreadable() {
            Some(error) => Err(RelayError::Unwatched {
                publication: self.settings.postgres.publication.clone(),
                error,
                confirmed: frontier,
            }),
            None => Ok(()),
        }
    }

    /// The error for a publication that stopped covering the outbox while streaming. The
    /// window starts at the newest confirmed commit, or at the last reading that found the
    /// table covered when that is earlier (the checkpoint may have passed the change).
    fn uncovered(&mut self, s: &Session, change: Change, read_at: Option<i64>) -> RelayError {
        let since = match (self.confirmed_commit_time, read_at) {
            (Some(t), Some(at)) if at < t => Some((at, "the last reading that found it covered")),
            (Some(t), _) => Some((t, "the newest confirmed commit")),
            (None, at) => at.map(|at| (at, "the last reading that found it covered")),
        };
        // The session's last progress record carries the same start of the window.
        self.confirmed_commit_time = since.map(|(t, _)| t);
        RelayError::Uncovered(Box::new(Uncovered {
            publication: self.settings.postgres.publication.clone(),
            slot: self.settings.postgres.slot.clone(),
            change,
            confirmed: s.coverage.bound(),
            streaming: true,
            since,
            time_column: self.time_column.clone(),
        }))
    }

    fn update_gauges(&self, s: &Session) {
        let m = &self.metrics;
        m.inflight.set(s.checkpoint.in_flight() as i64);
        // The sink lives across sessions: its count only grows.
        let already = self.sink.already_delivered();
        m.already_delivered
            .inc_by(already.saturating_sub(m.already_delivered.get()));
        if let Some(age) = self.sink.oldest_unacked() {
            m.oldest_unacked.set(age.as_secs_f64());
        }
        m.confirmed_flush_lsn
            .set(s.coverage.confirmable(s.checkpoint.frontier()).as_u64() as i64);
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

    /// Stops intake, waits (bounded) for outstanding delivery reports (none from a producer
    /// with a fatal error), and — when the connection is still usable — sends a final status
    /// update and ends the stream.
    pub(super) async fn wind_down(&mut self, s: &mut Session, connection_alive: bool) {
        let deadline = Instant::now() + self.settings.relay.shutdown_timeout;
        loop {
            if self.acks.fatal().is_some() {
                // The producer can deliver nothing more, and its reports are not taken: the
                // session's error says why (a takeover, a transaction the coordinator aborted),
                // here it would only be repeated, in words that may not fit.
                break;
            }
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
        if s.drained {
            // Every event before the reshard point is acknowledged: confirm up to it.
            if let Some(to) = self.settings.postgres.drain_to {
                s.checkpoint.keepalive(to);
            }
        }
        self.update_gauges(s);
        if connection_alive {
            // The publication watch releases what is acknowledged before the last status.
            s.coverage.settle(s.checkpoint.frontier()).await;
            if let Err(e) = self.send_status(s, false).await {
                tracing::debug!(error = %e, "final status update failed");
            }
        }
        let confirmed = s.coverage.confirmable(s.checkpoint.frontier());
        tracing::info!(confirmed = %confirmed, "replication session ended");
    }
}

/// Events not yet retired, as intake counts them: in exactly-once mode those not yet
/// delivered and those buffered behind a commit (a Kafka transaction may hold more than
/// `relay.max_in_flight`), otherwise those the checkpoint has not retired.
fn in_flight(s: &Session) -> usize {
    match &s.eos {
        Some(t) => s.outstanding + t.buffered(),
        None => s.checkpoint.in_flight(),
    }
}

impl Relay {
    /// The in-flight window: `configured`, or 1 while the records up to
    /// [`Relay::isolate_until`] are produced one at a time (after a batch refused for one of its
    /// records, or a refused record whose earlier transactions were not all confirmed); marks
    /// the session's records as produced alone meanwhile. In exactly-once mode each PostgreSQL
    /// transaction then gets a Kafka transaction of its own, so the ones before the refused
    /// record commit before it is produced.
    fn window(&mut self, s: &mut Session, configured: usize) -> usize {
        match self.isolate_until {
            Some(until) if s.checkpoint.frontier() <= until => {
                if !s.isolated {
                    tracing::info!(until = %until, "producing one record at a time");
                    s.isolated = true;
                    if let Some(txn) = s.eos.as_mut() {
                        txn.bounds.max_events = 1;
                    }
                }
                1
            }
            Some(_) => {
                self.isolate_until = None;
                s.isolated = false;
                if let (Some(txn), Some(bounds)) =
                    (s.eos.as_mut(), self.settings.kafka.exactly_once)
                {
                    txn.bounds = bounds;
                }
                tracing::info!("producing in batches again");
                configured
            }
            None => configured,
        }
    }
}

/// Whether WAL is read: fewer than `max_in_flight` events in flight, and in exactly-once mode
/// fewer than `kafka.transaction_max_bytes` buffered behind the commit in flight.
fn intake_open(s: &Session, max_in_flight: usize) -> bool {
    in_flight(s) < max_in_flight && !s.eos.as_ref().is_some_and(|t| t.buffer_full())
}

/// When exactly-once mode's open Kafka transaction reaches its age bound (far away outside
/// that mode, where the branch waiting for it is off).
fn eos_deadline(s: &Session) -> Instant {
    s.eos.as_ref().map_or_else(
        || Instant::now() + Duration::from_secs(3600),
        |t| t.deadline(),
    )
}

/// Whether the event being received belongs to a transaction a committed Kafka transaction
/// already holds (exactly-once mode, after a restart): then it is counted and not produced.
fn skipped(s: &Session, metrics: &crate::metrics::Metrics) -> bool {
    let skip = s.eos.as_ref().is_some_and(|t| t.skipping);
    if skip {
        metrics.exactly_once_skipped.inc();
    }
    skip
}

/// What the silence of the replication connection calls for.
#[derive(Debug, PartialEq, Eq)]
enum Ping {
    /// Half of `postgres.receive_timeout` without a message: ask the server for a keepalive.
    Ask,
    /// Nothing to do yet.
    NotYet,
}

/// `postgres.receive_timeout`, like PostgreSQL's `wal_receiver_timeout`: a connection from which
/// nothing arrives (no WAL, no keepalive) is asked for a keepalive halfway through the timeout
/// (a standby status update with `replyRequested`, which the walsender answers at once), and
/// presumed dead when the timeout passes. Without it a connection whose peer vanished without
/// a FIN or RST (a network partition, a host powered off) would be read from until TCP gave
/// up, which takes many minutes. The time walbox itself does not read (in-flight events at
/// `relay.max_in_flight`) does not count.
struct Liveness {
    timeout: Option<Duration>,
    last_heard: Instant,
    asked: bool,
}

impl Liveness {
    fn new(timeout: Option<Duration>) -> Self {
        Liveness {
            timeout,
            last_heard: Instant::now(),
            asked: false,
        }
    }

    fn on(&self) -> bool {
        self.timeout.is_some()
    }

    fn heard(&mut self) {
        self.last_heard = Instant::now();
        self.asked = false;
    }

    /// When the next check is due (far away when off).
    fn deadline(&self) -> Instant {
        match self.timeout {
            Some(t) if self.asked => self.last_heard + t,
            Some(t) => self.last_heard + t / 2,
            None => self.last_heard + Duration::from_secs(3600),
        }
    }

    /// At or after [`Liveness::deadline`]: ask once, then give up.
    fn check(&mut self) -> Result<Ping, ReplicationError> {
        let Some(timeout) = self.timeout else {
            return Ok(Ping::NotYet);
        };
        let silent = self.last_heard.elapsed();
        if silent >= timeout {
            return Err(ReplicationError::Silent(timeout));
        }
        if !self.asked && silent >= timeout / 2 {
            self.asked = true;
            return Ok(Ping::Ask);
        }
        Ok(Ping::NotYet)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_asks_halfway_then_gives_up() {
        let mut l = Liveness::new(Some(Duration::from_secs(10)));
        assert_eq!(l.check().unwrap(), Ping::NotYet);
        l.last_heard -= Duration::from_secs(6);
        assert_eq!(l.check().unwrap(), Ping::Ask);
        assert_eq!(l.check().unwrap(), Ping::NotYet, "asks once");
        assert_eq!(l.deadline(), l.last_heard + Duration::from_secs(10));
        l.last_heard -= Duration::from_secs(5);
        assert!(matches!(l.check(), Err(ReplicationError::Silent(_))));
        // A message resets both.
        l.heard();
        assert_eq!(l.check().unwrap(), Ping::NotYet);
        assert_eq!(l.deadline(), l.last_heard + Duration::from_secs(5));
    }

    #[test]
    fn off_never_asks_nor_gives_up() {
        let mut l = Liveness::new(None);
        l.last_heard -= Duration::from_secs(100_000);
        assert_eq!(l.check().unwrap(), Ping::NotYet);
        assert!(!l.on());
    }
}
