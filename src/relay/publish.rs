//! Handing events to the producer, and the `on_invalid` policy at each point an event can be
//! rejected: unmappable row, missing topic, record refused by the producer, record failed by
//! the broker. The policy itself is [`crate::outbox::dead_letter`]; this module only asks it
//! and sends what it answers under the rejected event's sequence number.
//!
//! # Invariants
//! - Every event gets exactly one sequence number, taken when it is first handed to the
//!   producer (or, in exactly-once mode, buffered behind a Kafka commit in flight); its dead
//!   letter (if any) reuses it, so the checkpoint sees one event either way.
//! - A record librdkafka cannot queue (queue full) is retried, never dropped: the queue drains
//!   as deliveries complete, and `relay.max_in_flight` is at most its size.

use std::time::Duration;

use super::error::{send_failure, RelayError};
use super::{Relay, Session};
use crate::failure::Class;
use crate::fault::crash_point;
use crate::outbox::{self, EventPosition, OutboxError, OutboxEvent, Rejected};
use crate::sink::{DeliveryError, FailedRecord, Publisher, Sink, SinkError};
use crate::timestamp::pg_now_micros;

impl Relay {
    /// Produces a mapped event, or applies the route's `on_invalid` policy to a row that could
    /// not be mapped.
    pub(super) async fn publish(
        &mut self,
        s: &mut Session,
        mapped: Result<Option<OutboxEvent>, OutboxError>,
        route: usize,
    ) -> Result<(), RelayError> {
        match mapped {
            Ok(Some(event)) => self.produce(s, &event, route).await,
            Ok(None) => Ok(()),
            Err(OutboxError::InvalidEvent(inv)) => {
                match self.dead_letter(s, route, inv.rejected(), &inv.reason) {
                    Some(letter) => self.produce(s, &letter, route).await,
                    None => Err(OutboxError::InvalidEvent(inv).into()),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The route's `on_invalid` policy for `rejected`: the dead letter to send in its place
    /// (counted and logged), or `None` when the relay must stop.
    fn dead_letter(
        &self,
        s: &Session,
        route: usize,
        rejected: Rejected<'_>,
        reason: &str,
    ) -> Option<OutboxEvent> {
        let (source, id, lsn) = (rejected.source, rejected.id, rejected.position.commit_lsn);
        let letter = outbox::dead_letter(&s.mapper.route(route).on_invalid, rejected, reason)?;
        self.metrics.dead_letters.inc();
        tracing::warn!(source, id, %lsn, reason, topic = %letter.topic, "event sent to the dead-letter topic");
        Some(letter)
    }

    /// Makes sure the event's topic can be used, then hands the event to the producer under
    /// the next sequence number.
    async fn produce(
        &mut self,
        s: &mut Session,
        event: &OutboxEvent,
        route: usize,
    ) -> Result<(), RelayError> {
        let checked = match &self.sink {
            Sink::Kafka(sink) => self.topics.ensure(sink, &event.topic).await,
            // A stream is created by its first XADD.
            Sink::Redis(_) => Ok(()),
            // JetStream has no topics to create: a subject no stream captures is refused on
            // publish, as the record's fault.
            Sink::Nats(_) => Ok(()),
            // The exchange routes; there is no destination to create or check per event.
            Sink::RabbitMq(_) => Ok(()),
        };
        if let Err(error) = checked {
            let id = String::from_utf8_lossy(&event.id);
            let reason = error.to_string();
            if let Some(letter) = self.dead_letter(s, route, Rejected::event(event, &id), &reason) {
                return Box::pin(self.produce(s, &letter, route)).await;
            }
            return Err(RelayError::Topic {
                id: id.into_owned(),
                source_name: event.source.to_string(),
                lsn: event.position.commit_lsn,
                error,
            });
        }
        if self.ensure_kafka_txn(s, event, route)? {
            // Buffered behind the Kafka commit in flight (exactly-once mode).
            return Ok(());
        }
        let seq = s.checkpoint.next_seq();
        self.send(s, event, seq, route).await?;
        let assigned = s.checkpoint.event();
        debug_assert_eq!(assigned, seq);
        s.outstanding += 1;
        crash_point!("relay::produced");
        Ok(())
    }

    /// Hands a record to the sink, waiting while librdkafka's queue is full; a record the
    /// producer refuses outright is dead-lettered (when the route says so) or an error.
    pub(super) async fn send(
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
                    // The queue holds records of earlier events: let deliveries drain it.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(e) if e.class() == Class::Rejected => {
                    let id = String::from_utf8_lossy(&event.id);
                    let reason = format!(
                        "{} refused the record for {:?}: {e}",
                        self.sink.broker(),
                        event.topic
                    );
                    return match self.dead_letter(s, route, Rejected::event(event, &id), &reason) {
                        Some(letter) => Box::pin(self.send(s, &letter, seq, route)).await,
                        None => Err(send_failure(event, e)),
                    };
                }
                Err(source) => return Err(self.send_error(event, source)),
            }
        }
    }

    /// A record the broker failed for good (too large, invalid, …): its dead letter is sent
    /// under the same sequence number when the route says so; otherwise the delivery error
    /// ends the session.
    pub(super) fn on_rejected_delivery(
        &mut self,
        s: &mut Session,
        seq: u64,
        route: usize,
        failed: &FailedRecord,
        error: &DeliveryError,
    ) -> Option<Result<(), RelayError>> {
        if s.eos.is_some() {
            // The Kafka transaction cannot commit after a failed record: the error ends the
            // session (see `exactly_once`).
            return None;
        }
        let position = failed_position(s, failed);
        let reason = format!(
            "{} refused the record for {:?}: {error}",
            self.sink.broker(),
            failed.topic
        );
        let rejected = Rejected {
            topic: Some(&failed.topic),
            id: &failed.id,
            source: &s.mapper.route(route).name,
            position,
            key: failed.key.clone(),
            payload: failed.payload.clone(),
        };
        let letter = self.dead_letter(s, route, rejected, &reason)?;
        Some(match self.sink.send(&letter, seq, route) {
            Ok(()) => {
                s.outstanding += 1;
                Ok(())
            }
            Err(source) => Err(send_failure(&letter, source)),
        })
    }
}

/// Where a failed record's event sits, read back from its headers; the commit time is its
/// transaction's (still pending, or the one being received).
fn failed_position(s: &Session, failed: &FailedRecord) -> EventPosition {
    let commit_lsn = failed.lsn.parse().unwrap_or_default();
    let commit_time = s
        .checkpoint
        .pending_commit_time(commit_lsn)
        .or_else(|| {
            s.txn
                .filter(|t| t.commit_lsn == commit_lsn)
                .map(|t| t.commit_time)
        })
        .unwrap_or_else(pg_now_micros);
    EventPosition {
        commit_lsn,
        index: failed.index.parse().unwrap_or_default(),
        commit_time,
    }
}
