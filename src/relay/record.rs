//! The relay's progress records (`sink::progress`): the session's first one, which gates
//! streaming, the ones that follow the acknowledged frontier, and the committed position a
//! standby must have replayed before a record is judged.
//!
//! # Invariants
//! - No WAL is read before the session's first record is acknowledged (at-least-once mode; in
//!   exactly-once mode it is committed in a Kafka transaction of its own): the record is the
//!   evidence that the slot exists, and a slot that streamed without it could later be
//!   recreated silently, or a shard slot advanced past rows it never relayed.
//! - A later record never claims more than was confirmed to PostgreSQL; a failed one only costs
//!   a warning (the next one replaces it).

use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{Relay, RelayError, Session};
use crate::lsn::Lsn;
use crate::sink::progress::{self, ProgressKey, ProgressRecord, PROGRESS_INTERVAL};
use crate::sink::{Publisher, SinkError};

/// How long the read of [`Relay::committed_position`] may take: it only tells a standby's
/// start how far to wait for replay; the read after fencing is the one that decides (and waits
/// for another producer's open transaction as long as it must).
const COMMITTED_HINT_TIMEOUT: Duration = Duration::from_secs(5);

impl Relay {
    /// In exactly-once mode, the position the last progress record of `key` says is committed
    /// to Kafka (what a standby must have replayed before the record can be judged);
    /// [`Lsn::ZERO`] otherwise, or when the topic cannot be read now (the read after fencing
    /// decides, and reports its own errors).
    pub(super) async fn committed_position(&self, key: &ProgressKey) -> Lsn {
        if self.settings.kafka.exactly_once.is_none() {
            return Lsn::ZERO;
        }
        let (config, lookup) = (self.settings.kafka.clone(), key.clone());
        let read = tokio::task::spawn_blocking(move || {
            progress::read_last(&config, &lookup, COMMITTED_HINT_TIMEOUT)
        })
        .await;
        match read {
            Ok(Ok(record)) => record.map_or(Lsn::ZERO, |r| r.confirmed_lsn),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "reading the progress record before streaming from a standby");
                Lsn::ZERO
            }
            Err(_) => Lsn::ZERO,
        }
    }

    /// Hands a progress record for `frontier` (everything up to it acknowledged by the broker)
    /// to the producer: when the frontier moved, at most every [`PROGRESS_INTERVAL`] unless
    /// `force`. Failures only cost a warning; the next record replaces this one.
    pub(super) fn write_progress(&mut self, frontier: Lsn, force: bool) {
        let Some(key) = &self.progress_key else {
            return;
        };
        if self.settings.kafka.exactly_once.is_some() {
            // Written inside each Kafka transaction instead (see `exactly_once`).
            return;
        }
        if frontier == Lsn::ZERO
            || (!force && frontier <= self.progress_lsn)
            || (!force
                && self
                    .progress_at
                    .is_some_and(|t| t.elapsed() < PROGRESS_INTERVAL))
        {
            return;
        }
        match self.send_progress(key, frontier, self.confirmed_commit_time) {
            Ok(()) => {
                self.progress_lsn = frontier;
                self.progress_at = Some(Instant::now());
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot write the progress record; retrying with the next one")
            }
        }
    }

    /// Writes the session's first progress record at `start` and waits until the broker
    /// acknowledged it: the record is the evidence that the slot exists, which keeps a lost slot
    /// from being recreated silently and a layout change from advancing shard slots past rows
    /// they never relayed, so a walbox that cannot write it does not stream at all.
    pub(super) async fn record_start(
        &mut self,
        s: &mut Session,
        start: Lsn,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), RelayError> {
        if s.eos.is_some() {
            return self.eos_start_record(s, start).await;
        }
        let Some(key) = self.progress_key.clone() else {
            return Ok(());
        };
        let topic = self.settings.kafka.progress_topic.clone();
        let write_error = |error| RelayError::ProgressWrite {
            topic: topic.clone(),
            error,
        };
        self.send_progress(&key, start, self.confirmed_commit_time)
            .map_err(|e| {
                write_error(match e {
                    SinkError::Config(e) | SinkError::Send(e) => e.into(),
                    SinkError::Broker(e) => e.into(),
                    SinkError::QueueFull => rdkafka::error::KafkaError::MessageProduction(
                        rdkafka::types::RDKafkaErrorCode::QueueFull,
                    )
                    .into(),
                })
            })?;
        s.start_record_pending = true;
        while s.start_record_pending {
            if *shutdown.borrow() {
                return Ok(());
            }
            tokio::select! {
                biased;
                _ = shutdown.changed() => {}
                _ = self.acks.wait() => {}
                // A report that came before the wait began is taken on the next turn.
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
            self.take_acks(s)?;
        }
        self.progress_lsn = start;
        self.progress_at = Some(Instant::now());
        Ok(())
    }

    /// Hands `key`'s progress record at `lsn` to the producer (inside the open Kafka
    /// transaction in exactly-once mode); its ack arrives with route `PROGRESS_ROUTE`.
    pub(super) fn send_progress(
        &self,
        key: &ProgressKey,
        lsn: Lsn,
        commit_time: Option<i64>,
    ) -> Result<(), SinkError> {
        let record = ProgressRecord::new(key, self.lineage, lsn, commit_time);
        // Strings and integers only: encoding cannot fail.
        let value = serde_json::to_vec(&record).unwrap_or_default();
        self.sink.send_progress(&key.record_key(), &value)
    }
}
