//! `walbox inbox`: the consumer half. Effectively-once processing of Kafka records into the
//! consumer's PostgreSQL.
//!
//! The outbox half delivers every event at least once; duplicates are normal (a relay restart,
//! a producer retry, a consumer-group reset). The inbox absorbs them: each record is processed
//! in **one** PostgreSQL transaction that inserts `(consumer, message_id)` into the inbox table
//! with `ON CONFLICT DO NOTHING` and runs the effect only if that inserted a row. The message id
//! is the producer's event id (header `id`), never the Kafka offset, which changes on replay.
//!
//! ```text
//!  Kafka ─► consumer.rs (poll thread, consumer group, rebalances, offset commits)
//!              │ per-partition bounded queue
//!              ▼
//!           worker.rs (one task per partition: order, retries, fail | dead_letter)
//!              │ Pool: at most effect.max_parallel connections
//!              ▼
//!           store.rs  BEGIN; INSERT inbox … ON CONFLICT DO NOTHING; [effect]; COMMIT
//! ```
//!
//! # Invariants
//! - Kafka offsets are committed only for records whose transaction committed (or that the
//!   dead-letter topic acknowledged); a crash between the two replays records whose inbox rows
//!   exist, and the replay is absorbed.
//! - Per partition, strictly in offset order; partitions in parallel, bounded by
//!   `effect.max_parallel` connections.
//! - An effect error rolls back the inbox row with it; the record is retried, then either stops
//!   walbox with its offset uncommitted (`fail`) or goes to the dead-letter topic
//!   (`dead_letter`). A poison record is never skipped silently.
//! - The retention guard refuses to start when the inbox keeps rows for less than a topic's
//!   replay window (see [`retention`]).
//!
//! "Effectively once" covers effects inside the consumer's PostgreSQL only. An effect that calls
//! an external system must pass the message id on as that system's idempotency key.

pub mod config;
pub mod consumer;
pub mod effect;
pub mod metrics;
pub mod retention;
pub mod set_effect;
pub mod store;
pub mod throttle;
pub mod worker;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::FutureProducer;
use tokio::sync::mpsc;

use crate::backoff::Backoff;
use crate::config::KafkaRole;
use crate::failure::{Class, Failure, FatalError};

use self::config::{Guard, InboxConfig};
use self::consumer::ConsumerLoop;
use self::metrics::InboxMetrics;
use self::store::{Pool, Statements};
use self::worker::{DeadLetterContext, WorkerEnv};
use crate::metrics::{self as endpoints, Health};

pub use self::config::load;

/// How long the retention guard waits for the topic configurations.
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(15);

/// Handles a running inbox shares with its caller.
#[derive(Clone, Default)]
pub struct Handles {
    /// The inbox's counters and gauges, served on `/metrics`.
    pub metrics: Arc<InboxMetrics>,
    /// What `/healthz` and `/readyz` answer.
    pub health: Arc<Health>,
}

/// Runs `walbox inbox` until `shutdown` completes (→ `Ok`) or a fatal error.
pub async fn run(
    config: InboxConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), FatalError> {
    run_with(config, shutdown, Handles::default()).await
}

/// [`run`] with caller-provided metrics and health.
pub async fn run_with(
    config: InboxConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
    handles: Handles,
) -> Result<(), FatalError> {
    let Handles { metrics, health } = handles;
    let result = run_inner(config, shutdown, metrics, health.clone()).await;
    if let Err(e) = &result {
        health.set_fatal(e.message.clone());
    }
    result
}

async fn run_inner(
    config: InboxConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
    metrics: Arc<InboxMetrics>,
    health: Arc<Health>,
) -> Result<(), FatalError> {
    if let Some(addr) = config.http_listen {
        let (local, server) = endpoints::bind(addr, metrics.clone(), health.clone())
            .await
            .map_err(|e| {
                FatalError::new(
                    Failure::Config,
                    format!("cannot listen on http.listen {addr}: {e}"),
                )
            })?;
        tracing::info!(addr = %local, "serving /metrics, /healthz, /readyz");
        tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!(error = %e, "http server stopped");
            }
        });
    }

    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutdown requested: finishing in-flight records");
        let _ = stop_tx.send(true);
    });

    // Start-up check: the inbox table and the effect's objects exist (statements prepare).
    let statements = Arc::new(Statements::new(&config));
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    let first = loop {
        match statements.connect().await {
            Ok(c) => break c,
            Err(e) => match e.class() {
                Class::Transient => {
                    let delay = backoff.next_delay();
                    tracing::warn!(error = %e, retry_in = ?delay, "cannot reach PostgreSQL yet");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = stop_rx.wait_for(|s| *s) => return Ok(()),
                    }
                }
                // Preparing checks names and privileges: no record is involved, so what would
                // be a record's error is the schema's.
                class @ (Class::Fatal(_) | Class::Effect | Class::Rejected) => {
                    let failure = class.fatal().unwrap_or(Failure::Schema);
                    return Err(FatalError::new(
                        failure,
                        match e {
                            store::StoreError::Effect(_) => {
                                format!("preparing the effect statement: {e}")
                            }
                            _ => format!("inbox {}: {e}", statements.table()),
                        },
                    ));
                }
            },
        }
    };

    check_retention(&config).await?;

    let pool = Arc::new(Pool::new(statements.clone(), config.effect.max_parallel));
    if config.retention.cleanup {
        spawn_cleanup(&config, statements.clone(), metrics.clone(), first);
    } else {
        drop(first);
    }

    let (fatal_tx, mut fatal_rx) = mpsc::unbounded_channel();
    let needs_dlq =
        config.effect.on_error.topic().is_some() || config.effect.on_invalid.topic().is_some();
    let dead_letter = match needs_dlq {
        true => {
            let context = DeadLetterContext {
                fatal: fatal_tx.clone(),
            };
            let producer: FutureProducer<DeadLetterContext> = config
                .kafka
                .client_config(KafkaRole::DeadLetterProducer)
                .create_with_context(context)
                .map_err(|e| {
                    FatalError::of_or(&e, Failure::Kafka).prefixed("dead-letter producer")
                })?;
            Some(producer)
        }
        false => None,
    };

    let env = Arc::new(WorkerEnv {
        pool,
        effect: config.effect.clone(),
        dead_letter,
        metrics: metrics.clone(),
        fatal: fatal_tx.clone(),
    });
    let consumer = ConsumerLoop::new(
        &config.kafka,
        env,
        metrics.clone(),
        tokio::runtime::Handle::current(),
    )
    .map_err(|e| FatalError::of_or(&e, Failure::Kafka).prefixed("kafka consumer"))?;
    tracing::info!(
        group = %config.kafka.group_id,
        topics = ?config.kafka.topics,
        inbox = %statements.table(),
        consumer = %config.consumer,
        "consuming"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let thread_stop = stop.clone();
    let thread_health = health.clone();
    let thread_fatal = fatal_tx.clone();
    let poller = tokio::task::spawn_blocking(move || {
        consumer.run(&thread_stop, &thread_health, &thread_fatal);
    });

    let outcome = tokio::select! {
        biased;
        f = fatal_rx.recv() => match f {
            Some(f) => Err(f),
            None => Ok(()),
        },
        _ = stop_rx.wait_for(|s| *s) => Ok(()),
    };
    stop.store(true, Ordering::Release);
    if poller.await.is_err() {
        return Err(FatalError::new(
            Failure::Internal,
            "the consumer thread panicked",
        ));
    }
    // A fatal error reported while stopping still wins over a clean shutdown.
    match (outcome, fatal_rx.try_recv()) {
        (Ok(()), Ok(f)) => Err(f),
        (o, _) => o,
    }
}

async fn check_retention(config: &InboxConfig) -> Result<(), FatalError> {
    let r = &config.retention;
    let Some(keep) = r.keep else {
        return Ok(());
    };
    if r.guard == Guard::Off {
        return Ok(());
    }
    let refuse = |message: String| -> Result<(), FatalError> {
        match r.guard {
            Guard::Refuse => Err(FatalError::new(Failure::Retention, message)),
            _ => {
                tracing::warn!("{message}");
                Ok(())
            }
        }
    };
    match retention::describe(&config.kafka, DESCRIBE_TIMEOUT).await {
        Ok(topics) => {
            for t in &topics {
                if let Err(m) = retention::check(Some(keep), t) {
                    refuse(m)?;
                } else {
                    tracing::info!(topic = %t.topic, replay_window = ?t.replay_window(), keep = ?keep, "retention guard passed");
                }
            }
            Ok(())
        }
        // No retry can succeed, whatever the guard's setting: the consumer would meet it next.
        Err(retention::DescribeError::Untrusted(line)) => Err(FatalError::new(
            Failure::Auth,
            format!("kafka admin client cannot continue: {line}"),
        )),
        Err(e) => refuse(format!(
            "retention guard: {e}; cannot show that retention.keep covers the topics' replay window (grant DescribeConfigs, or set retention.guard = \"warn\")"
        )),
    }
}

fn spawn_cleanup(
    config: &InboxConfig,
    statements: Arc<Statements>,
    metrics: Arc<InboxMetrics>,
    first: store::Conn,
) {
    let Some(keep) = config.retention.keep else {
        return;
    };
    let batch = config.retention.cleanup_batch;
    let interval = config.retention.cleanup_interval;
    tokio::spawn(async move {
        let mut conn = Some(first);
        loop {
            let c = match conn.take() {
                Some(c) => c,
                None => match statements.connect().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "retention clean-up cannot connect");
                        tokio::time::sleep(interval).await;
                        continue;
                    }
                },
            };
            let mut total = 0u64;
            let healthy = loop {
                match statements.delete_expired(&c, keep, batch).await {
                    Ok(n) => {
                        total += n;
                        metrics.retention_deleted.inc_by(n);
                        if n < batch.unsigned_abs() {
                            break true;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "retention clean-up failed");
                        break !e.broken_connection();
                    }
                }
            };
            if total > 0 {
                tracing::info!(
                    deleted = total,
                    "retention clean-up removed expired inbox rows"
                );
            }
            if healthy {
                conn = Some(c);
            }
            tokio::time::sleep(interval).await;
        }
    });
}
