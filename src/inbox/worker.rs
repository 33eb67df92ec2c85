//! One task per assigned partition: records strictly in offset order, each in its own
//! transaction, retries and the error policies.
//!
//! # Invariants
//! - A partition's records are processed one at a time, in the order the consumer delivered
//!   them; the next record starts only after the previous one committed (or was dead-lettered).
//! - [`Progress`] (the next offset to commit) moves only after the record's transaction
//!   committed, or after the dead-letter topic acknowledged it. It never moves past a record
//!   that failed under `fail`: that record's offset is never committed.
//! - Cancellation (revocation, shutdown) is honoured between records and during back-off
//!   sleeps, never in the middle of a transaction.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use tokio::sync::{mpsc, watch};

use crate::backoff::Backoff;
use crate::failure::{Failure, FatalError};

use super::config::{EffectConfig, Policy};
use super::effect::Record;
use super::metrics::InboxMetrics;
use super::store::{ErrorClass, Outcome, Pool, StoreError};

/// The next offset to commit for one partition (`-1`: nothing processed yet).
#[derive(Debug)]
pub struct Progress(AtomicI64);

impl Progress {
    /// Nothing processed yet.
    pub fn new() -> Self {
        Progress(AtomicI64::new(-1))
    }

    /// The next offset to commit, if any record was processed.
    pub fn get(&self) -> Option<i64> {
        let v = self.0.load(Ordering::Acquire);
        (v >= 0).then_some(v)
    }

    fn done(&self, offset: i64) {
        let next = offset.saturating_add(1);
        let prev = self.0.swap(next, Ordering::AcqRel);
        debug_assert!(prev < next, "progress went backwards: {prev} -> {next}");
    }
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

/// The dead-letter topic and its producer.
#[derive(Clone)]
pub struct DeadLetter {
    /// Producer (idempotent, `acks=all`).
    pub producer: FutureProducer,
    /// Topic.
    pub topic: String,
}

/// What every partition worker shares.
pub struct WorkerEnv {
    /// Connections.
    pub pool: Arc<Pool>,
    /// Effect settings.
    pub effect: EffectConfig,
    /// Dead-letter topic, when a policy needs it.
    pub dead_letter: Option<DeadLetter>,
    /// Metrics.
    pub metrics: Arc<InboxMetrics>,
    /// Where fatal errors go.
    pub fatal: mpsc::UnboundedSender<FatalError>,
}

/// Processes the records of one partition until the channel closes or `cancel` turns true.
pub async fn run(
    env: Arc<WorkerEnv>,
    mut records: mpsc::Receiver<Record>,
    mut cancel: watch::Receiver<bool>,
    progress: Arc<Progress>,
) {
    loop {
        let record = tokio::select! {
            biased;
            _ = cancel.wait_for(|c| *c) => return,
            r = records.recv() => match r {
                Some(r) => r,
                None => return,
            },
        };
        if !process(&env, &record, &mut cancel, &progress).await {
            return;
        }
    }
}

/// Sleeps for `d` unless cancelled first; returns whether to go on.
async fn pause(d: Duration, cancel: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        biased;
        _ = cancel.wait_for(|c| *c) => false,
        _ = tokio::time::sleep(d) => true,
    }
}

fn describe(record: &Record) -> String {
    format!("{}/{}@{}", record.topic, record.partition, record.offset)
}

/// One record to its end; returns whether the worker goes on.
async fn process(
    env: &WorkerEnv,
    record: &Record,
    cancel: &mut watch::Receiver<bool>,
    progress: &Progress,
) -> bool {
    let mut backoff = Backoff::new(env.effect.backoff_initial, env.effect.backoff_max);
    let mut failures = 0u32;
    loop {
        if *cancel.borrow() {
            return false;
        }
        let result = attempt(&env.pool, record).await;
        let err = match result {
            Ok(outcome) => {
                match outcome {
                    Outcome::Applied => env.metrics.effects_applied.inc(),
                    Outcome::Duplicate => {
                        tracing::debug!(record = %describe(record), "duplicate absorbed by the inbox");
                        env.metrics.duplicates.inc()
                    }
                }
                env.metrics.records_consumed.inc();
                progress.done(record.offset);
                return true;
            }
            Err(e) => e,
        };
        match err.class() {
            ErrorClass::Transient => {
                tracing::warn!(record = %describe(record), error = %err, "postgres unavailable; retrying");
            }
            ErrorClass::Effect => {
                env.metrics.effect_errors.inc();
                failures += 1;
                if failures > env.effect.retries {
                    return give_up(env, record, env.effect.on_error, &err, cancel, progress).await;
                }
                tracing::warn!(record = %describe(record), error = %err, attempt = failures, "effect failed; the transaction was rolled back, retrying");
            }
            ErrorClass::Invalid => {
                return give_up(env, record, env.effect.on_invalid, &err, cancel, progress).await
            }
            ErrorClass::Fatal(failure) => {
                let _ = env.fatal.send(FatalError {
                    failure,
                    message: format!("processing {}: {err}", describe(record)),
                });
                return false;
            }
        }
        let delay = backoff.next_delay();
        if !pause(delay, cancel).await {
            return false;
        }
    }
}

async fn attempt(pool: &Pool, record: &Record) -> Result<Outcome, StoreError> {
    let mut lease = pool.get().await?;
    let result = pool.statements().process(&mut lease.conn, record).await;
    match &result {
        Err(e) if e.broken_connection() => {}
        _ => pool.put(lease),
    }
    result
}

/// `fail`: report a fatal error (the offset stays uncommitted). `dead_letter`: produce the
/// record to the dead-letter topic, then move on.
async fn give_up(
    env: &WorkerEnv,
    record: &Record,
    policy: Policy,
    err: &StoreError,
    cancel: &mut watch::Receiver<bool>,
    progress: &Progress,
) -> bool {
    let dead_letter = match (policy, &env.dead_letter) {
        (Policy::DeadLetter, Some(d)) => d,
        _ => {
            let _ = env.fatal.send(FatalError {
                failure: Failure::InboxRecord,
                message: format!(
                    "record {} cannot be processed: {err}; its offset is not committed (fix the cause and restart, or set a dead_letter policy)",
                    describe(record)
                ),
            });
            return false;
        }
    };
    let reason = err.to_string();
    let partition = record.partition.to_string();
    let offset = record.offset.to_string();
    let mut backoff = Backoff::new(env.effect.backoff_initial, env.effect.backoff_max);
    loop {
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len() + 4);
        for (k, v) in &record.headers {
            headers = headers.insert(Header {
                key: k,
                value: v.as_deref(),
            });
        }
        headers = headers
            .insert(Header {
                key: "walbox.error",
                value: Some(reason.as_bytes()),
            })
            .insert(Header {
                key: "walbox.source_topic",
                value: Some(record.topic.as_bytes()),
            })
            .insert(Header {
                key: "walbox.source_partition",
                value: Some(partition.as_bytes()),
            })
            .insert(Header {
                key: "walbox.source_offset",
                value: Some(offset.as_bytes()),
            });
        let mut out: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&dead_letter.topic).headers(headers);
        if let Some(k) = &record.key {
            out = out.key(&k[..]);
        }
        if let Some(p) = &record.payload {
            out = out.payload(&p[..]);
        }
        match dead_letter.producer.send(out, Timeout::Never).await {
            Ok(_) => {
                tracing::warn!(record = %describe(record), error = %reason, topic = %dead_letter.topic, "record dead-lettered");
                env.metrics.dead_lettered.inc();
                env.metrics.records_consumed.inc();
                progress.done(record.offset);
                return true;
            }
            Err((e, _)) => {
                let delay = backoff.next_delay();
                tracing::warn!(record = %describe(record), error = %e, retry_in = ?delay, "cannot produce to the dead-letter topic; retrying");
                if !pause(delay, cancel).await {
                    return false;
                }
            }
        }
    }
}
