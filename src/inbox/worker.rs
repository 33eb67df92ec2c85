//! One task per assigned partition: records strictly in offset order, in batches of up to
//! `effect.batch_max` per transaction, retries and the error policies.
//!
//! # Invariants
//! - A partition's records are processed in the order the consumer delivered them, one batch
//!   at a time; the next batch starts only after the previous one committed (or its records
//!   were dead-lettered).
//! - A batch takes what is queued, up to `effect.batch_max` records, waiting at most
//!   `effect.batch_linger` for more; a record that cannot be bound (no usable message id) ends
//!   the batch before it and follows `effect.on_invalid` on its own, in order.
//! - An effect error fails only its own record: the records before it commit as a batch, the
//!   failing record is retried alone (the failed batch counts as its first attempt), then
//!   follows `effect.on_error`; the records after it go on in batches. When the transaction
//!   fails without naming a record (a stored payload that is not JSON, a set-based effect),
//!   the batch is applied record by record until a record fails alone, so the same holds.
//! - Only the record's errors ([`Class::Effect`]: data, constraints, raised exceptions)
//!   are counted against `effect.retries` and reach `effect.on_error`; the database's (a missing
//!   object or privilege: fatal; a lost connection, resources, conflicts: retried with backoff,
//!   indefinitely) never dead-letter a record.
//! - [`Progress`] (the next offset to commit) moves only after a transaction committed, to just
//!   past its last record, or after the dead-letter topic acknowledged a record. It never moves
//!   past a record that failed under `fail`: that record's offset is never committed.
//! - Cancellation (revocation, shutdown) is honoured between transactions and during back-off
//!   sleeps, never in the middle of one; records taken from the queue but not applied are
//!   simply not committed.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::ClientContext;
use tokio::sync::{mpsc, watch};

use crate::backoff::Backoff;
use crate::dead_letter::{self, ConsumedAt, Policy};
use crate::failure::{kafka_error, untrusted_certificate, Class, Failure, FatalError};

use super::config::EffectConfig;
use super::effect::Record;
use super::metrics::InboxMetrics;
use super::store::{BatchError, Outcome, Pool, Prepared, StoreError};
use crate::fault::crash_point;

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

/// What every partition worker shares.
pub struct WorkerEnv {
    /// Connections to the inbox database.
    pub pool: Arc<Pool>,
    /// Effect settings.
    pub effect: EffectConfig,
    /// The dead-letter producer (idempotent, `acks=all`), when a policy needs it.
    pub dead_letter: Option<FutureProducer<DeadLetterContext>>,
    /// The inbox's counters, shared with `/metrics`.
    pub metrics: Arc<InboxMetrics>,
    /// Where fatal errors go.
    pub fatal: mpsc::UnboundedSender<FatalError>,
}

/// The dead-letter producer's context. A TLS handshake that failed on a certificate stops the
/// inbox (exit 4, with `failure::untrusted_certificate`'s line): librdkafka would retry it
/// forever, and a record sent meanwhile would wait for a delivery that cannot come. Every other
/// client error is logged (the delivery reports say what became of the records).
pub struct DeadLetterContext {
    /// Where the inbox's fatal errors go.
    pub fatal: mpsc::UnboundedSender<FatalError>,
}

impl ClientContext for DeadLetterContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if let Some(line) = untrusted_certificate(&error, reason) {
            tracing::error!(error = %error, reason, "kafka TLS handshake failed on a certificate");
            let message = format!("kafka dead-letter producer cannot continue: {line}");
            let _ = self.fatal.send(FatalError::new(Failure::Auth, message));
            return;
        }
        tracing::error!(error = %error, reason, "kafka dead-letter producer error");
    }
}

/// Processes the records of one partition until the channel closes or `cancel` turns true.
pub async fn run(
    env: Arc<WorkerEnv>,
    mut records: mpsc::Receiver<Record>,
    mut cancel: watch::Receiver<bool>,
    progress: Arc<Progress>,
) {
    let max = env.effect.batch_max;
    let mut batch = Vec::with_capacity(max);
    loop {
        let first = tokio::select! {
            biased;
            _ = cancel.wait_for(|c| *c) => return,
            r = records.recv() => match r {
                Some(r) => r,
                None => return,
            },
        };
        batch.push(first);
        while batch.len() < max {
            match records.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        if batch.len() < max && !env.effect.batch_linger.is_zero() {
            let deadline = tokio::time::Instant::now() + env.effect.batch_linger;
            while batch.len() < max {
                tokio::select! {
                    biased;
                    _ = cancel.wait_for(|c| *c) => return,
                    _ = tokio::time::sleep_until(deadline) => break,
                    r = records.recv() => match r {
                        Some(r) => batch.push(r),
                        None => break,
                    },
                }
            }
        }
        if !process(&env, batch.drain(..), &mut cancel, &progress).await {
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

/// One batch to its end: runs of bindable records are applied, each invalid record follows
/// `on_invalid` in its place. Returns whether the worker goes on.
async fn process(
    env: &WorkerEnv,
    batch: impl Iterator<Item = Record>,
    cancel: &mut watch::Receiver<bool>,
    progress: &Progress,
) -> bool {
    let statements = env.pool.statements();
    let mut run = Vec::new();
    for record in batch {
        match statements.prepare(record) {
            Ok(p) => run.push(p),
            Err(rejected) => {
                let (record, invalid) = *rejected;
                if !apply(env, &run, cancel, progress).await {
                    return false;
                }
                run.clear();
                let reason = StoreError::Invalid(invalid).to_string();
                if !give_up(
                    env,
                    &record,
                    &env.effect.on_invalid,
                    &reason,
                    cancel,
                    progress,
                )
                .await
                {
                    return false;
                }
            }
        }
    }
    apply(env, &run, cancel, progress).await
}

/// A record whose effect failed, and how often.
struct Failing {
    /// Its index in the records being applied.
    at: usize,
    /// Failed attempts so far.
    failures: u32,
    /// The last error, for the log and the dead letter.
    error: String,
}

/// Applies `records` in order, in as few transactions as their failures allow; see the module
/// invariants. Returns whether the worker goes on.
async fn apply(
    env: &WorkerEnv,
    records: &[Prepared],
    cancel: &mut watch::Receiver<bool>,
    progress: &Progress,
) -> bool {
    let new_backoff = || Backoff::new(env.effect.backoff_initial, env.effect.backoff_max);
    let mut backoff = new_backoff();
    let mut start = 0;
    // The records before it go first, then it alone.
    let mut failing: Option<Failing> = None;
    // Records before this index go one per transaction (a failure named no record).
    let mut alone_until = 0;
    while start < records.len() {
        if *cancel.borrow() {
            return false;
        }
        let end = match &failing {
            Some(f) if f.at == start => {
                if f.failures > env.effect.retries {
                    let record = &records[start].record;
                    if !give_up(
                        env,
                        record,
                        &env.effect.on_error,
                        &f.error,
                        cancel,
                        progress,
                    )
                    .await
                    {
                        return false;
                    }
                    failing = None;
                    start += 1;
                    continue;
                }
                if !pause(backoff.next_delay(), cancel).await {
                    return false;
                }
                start + 1
            }
            Some(f) => f.at,
            None if start < alone_until => start + 1,
            None => records.len(),
        };
        let chunk = &records[start..end];
        let err = match attempt(&env.pool, chunk).await {
            Ok(outcomes) => {
                crash_point!("inbox::batch-committed");
                record_outcomes(env, chunk, &outcomes);
                progress.done(chunk[chunk.len() - 1].record.offset);
                if failing.as_ref().is_some_and(|f| f.at < end) {
                    failing = None;
                    backoff = new_backoff();
                }
                start = end;
                continue;
            }
            Err(e) => e,
        };
        let head = describe(&chunk[0].record);
        match err.error.class() {
            Class::Transient => {
                env.metrics.database_errors.inc();
                let delay = backoff.next_delay();
                tracing::warn!(record = %head, records = chunk.len(), error = %err.error, retry_in = ?delay, "postgres cannot process records now (not the records' fault, not counted against effect.retries); retrying");
                if !pause(delay, cancel).await {
                    return false;
                }
            }
            Class::Fatal(failure) => {
                let _ = env.fatal.send(FatalError::new(
                    failure,
                    format!(
                        "processing {head}: {}; the database's error, not the record's: nothing was dead-lettered and the offset is not committed; fix it (a renamed or dropped table or function, a privilege, the credentials), then restart",
                        err.error
                    ),
                ));
                return false;
            }
            Class::Effect | Class::Rejected => {
                let at = match err.at {
                    Some(k) => start + k,
                    None if chunk.len() == 1 => start,
                    None => {
                        // The transaction failed as a whole (e.g. a stored payload that is not
                        // JSON, a set-based effect): find the record by applying them one at a
                        // time.
                        tracing::info!(record = %head, records = chunk.len(), error = %err.error, "batch failed; applying its records one by one");
                        alone_until = end;
                        continue;
                    }
                };
                env.metrics.effect_errors.inc();
                let failures = match &failing {
                    Some(f) if f.at == at => f.failures.saturating_add(1),
                    _ => 1,
                };
                let error = err.error.to_string();
                // The failing record is found: the records after it go on in batches.
                alone_until = 0;
                if failures <= env.effect.retries {
                    tracing::warn!(record = %describe(&records[at].record), error = %error, attempt = failures, "effect failed; the transaction was rolled back, retrying");
                }
                failing = Some(Failing {
                    at,
                    failures,
                    error,
                });
            }
        }
    }
    true
}

fn record_outcomes(env: &WorkerEnv, chunk: &[Prepared], outcomes: &[Outcome]) {
    for (p, outcome) in chunk.iter().zip(outcomes) {
        match outcome {
            Outcome::Applied => env.metrics.effects_applied.inc(),
            Outcome::Duplicate => {
                tracing::debug!(record = %describe(&p.record), "duplicate absorbed by the inbox");
                env.metrics.duplicates.inc()
            }
        }
    }
    env.metrics.records_consumed.inc_by(chunk.len() as u64);
    env.metrics.batch_records.observe(chunk.len() as f64);
}

async fn attempt(pool: &Pool, chunk: &[Prepared]) -> Result<Vec<Outcome>, BatchError> {
    let mut lease = pool
        .get()
        .await
        .map_err(|error| BatchError { at: None, error })?;
    let result = pool.statements().apply(&mut lease.conn, chunk).await;
    match &result {
        Err(e) if e.error.broken_connection() => {}
        _ => pool.put(lease),
    }
    result
}

/// `fail`: report a fatal error (the offset stays uncommitted). `dead_letter`: produce the
/// record to the dead-letter topic, then move on.
async fn give_up(
    env: &WorkerEnv,
    record: &Record,
    policy: &Policy,
    reason: &str,
    cancel: &mut watch::Receiver<bool>,
    progress: &Progress,
) -> bool {
    let (topic, producer) = match (policy, &env.dead_letter) {
        (Policy::DeadLetter(topic), Some(producer)) => (topic, producer),
        _ => {
            let _ = env.fatal.send(FatalError::new(
                Failure::InboxRecord,
                format!(
                    "record {} cannot be processed: {reason}; its offset is not committed (fix the cause and restart, or set a dead_letter policy)",
                    describe(record)
                ),
            ));
            return false;
        }
    };
    let mut backoff = Backoff::new(env.effect.backoff_initial, env.effect.backoff_max);
    loop {
        let headers = dead_letter::consumed_record_headers(
            &record.headers,
            reason,
            ConsumedAt {
                topic: &record.topic,
                partition: record.partition,
                offset: record.offset,
            },
        );
        let mut out: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
        if let Some(k) = &record.key {
            out = out.key(&k[..]);
        }
        if let Some(p) = &record.payload {
            out = out.payload(&p[..]);
        }
        match producer.send(out, Timeout::Never).await {
            Ok(_) => {
                tracing::warn!(record = %describe(record), error = %reason, topic = %topic, "record dead-lettered");
                env.metrics.dead_lettered.inc();
                env.metrics.records_consumed.inc();
                progress.done(record.offset);
                return true;
            }
            Err((e, _)) => {
                // Brokers that refuse walbox's credentials or rights never take it: stop, as
                // the consumer does.
                if let Class::Fatal(failure) = kafka_error(&e) {
                    let _ = env.fatal.send(FatalError::new(
                        failure,
                        format!(
                            "cannot produce record {} to the dead-letter topic {topic:?}: {e}; its offset is not committed",
                            describe(record)
                        ),
                    ));
                    return false;
                }
                let delay = backoff.next_delay();
                tracing::warn!(record = %describe(record), error = %e, retry_in = ?delay, "cannot produce to the dead-letter topic; retrying");
                if !pause(delay, cancel).await {
                    return false;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::RDKafkaErrorCode;

    #[test]
    fn an_untrusted_certificate_stops_the_inbox_and_other_client_errors_do_not() {
        let (fatal, mut errors) = mpsc::unbounded_channel();
        let context = DeadLetterContext { fatal };
        context.error(
            KafkaError::Global(RDKafkaErrorCode::SSL),
            "SSL handshake failed: Disconnected: connection reset by peer",
        );
        context.error(
            KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "1/1 brokers are down",
        );
        assert!(
            errors.try_recv().is_err(),
            "a transient error stopped the inbox"
        );
        context.error(
            KafkaError::Global(RDKafkaErrorCode::SSL),
            "ssl://broker:9093/1: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed",
        );
        let stop = errors.try_recv().expect("the inbox stops");
        assert_eq!(stop.failure, Failure::Auth);
        assert!(
            stop.message
                .starts_with("kafka dead-letter producer cannot continue: ")
                && stop.message.contains("ssl.ca.location"),
            "{}",
            stop.message
        );
    }
}
