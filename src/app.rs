//! Wiring: metrics and HTTP endpoints, the producer, the relay, the reconnect loop and the
//! shutdown order. No business logic lives here.
//!
//! Start-up: bind the HTTP listener (a bad address fails at once), create the producer, probe the
//! brokers in the background (a warning, not an error: events wait for the broker), then run
//! replication sessions until shutdown or a fatal error. The slot monitor runs beside the relay
//! on its own connection; when it finds the slot lost it stops the relay the way shutdown does
//! and walbox exits with the lost-slot status. A transient error ends the session and
//! the next one starts after a capped exponential backoff with jitter; the backoff resets once a
//! session reaches streaming.
//!
//! Shutdown order (SIGTERM/SIGINT, or the `shutdown` future in tests): read to the end of the open
//! transaction, stop intake → wait up to `relay.shutdown_timeout` for in-flight acks → final
//! standby status and a clean end of the replication stream → stop the slot monitor
//! (it takes one last reading, so a slot lost meanwhile is still reported) and let the alert
//! webhook deliver what it holds (each bounded to 5 s) → flush the producer (at most 5 s more)
//! → return `Ok` (exit 0), or the fatal error.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::backoff::Backoff;
use crate::config::Config;
use crate::failure::{Failure, FatalError};
use crate::health::monitor::{self, FatalSignal};
use crate::health::webhook::Webhook;
use crate::metrics::{self, Health, Metrics};
use crate::relay::{Relay, SessionEnd, Settings};
use crate::sink::kafka::{AckQueue, KafkaSink};
use crate::sink::topics::Topics;

/// Handles the running relay shares with its caller.
#[derive(Clone, Default)]
pub struct Handles {
    /// Metrics registry.
    pub metrics: Arc<Metrics>,
    /// Health state.
    pub health: Arc<Health>,
}

/// Runs walbox until `shutdown` completes (→ `Ok`) or a fatal error.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), FatalError> {
    run_with(config, shutdown, Handles::default()).await
}

/// [`run`] with caller-provided metrics and health (the demo and tests read them).
pub async fn run_with(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
    handles: Handles,
) -> Result<(), FatalError> {
    let config = Arc::new(config);
    let Handles { metrics, health } = handles;

    if let Some(addr) = config.http_listen {
        let (local, server) = metrics::bind(addr, metrics.clone(), health.clone())
            .await
            .map_err(|e| FatalError {
                failure: Failure::Config,
                message: format!("cannot listen on http.listen {addr}: {e}"),
            })?;
        tracing::info!(addr = %local, "serving /metrics, /healthz, /readyz");
        tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!(error = %e, "http server stopped");
            }
        });
    }

    let acks = Arc::new(AckQueue::default());
    let sink = KafkaSink::new(&config.kafka, acks.clone()).map_err(|e| FatalError {
        failure: Failure::Kafka,
        message: e.to_string(),
    })?;

    let (stop_tx, mut stop_rx) = watch::channel(false);
    let fatal = FatalSignal {
        error: Arc::new(Mutex::new(None)),
        stop: stop_tx.clone(),
    };
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutdown requested: stopping intake, waiting for in-flight events");
        let _ = stop_tx.send(true);
    });
    let webhook = Webhook::start(&config.alerts).map_err(|e| FatalError {
        failure: Failure::Config,
        message: format!("alerts.webhook_url: {e}"),
    })?;
    let webhook_task = webhook.as_ref().map(Webhook::finished);
    let monitor_task = tokio::spawn(monitor::run(
        config.postgres.clone(),
        config.slot.clone(),
        metrics.clone(),
        webhook,
        fatal.clone(),
        stop_rx.clone(),
    ));

    let topics = Topics::new(&config.kafka).map_err(|e| FatalError {
        failure: Failure::Kafka,
        message: format!("kafka admin client: {e}"),
    })?;
    let mut relay = Relay::new(
        Settings::of(&config),
        sink,
        acks,
        metrics.clone(),
        health.clone(),
        topics,
    );
    let probe = probe_brokers(relay.sink().clone(), config.kafka.brokers.clone());
    let mut backoff = Backoff::new(config.relay.backoff_initial, config.relay.backoff_max);
    let outcome = loop {
        match relay.run_session(&mut stop_rx).await {
            Ok(SessionEnd::Shutdown) => break Ok(()),
            Err(e) => {
                if relay.reached_streaming {
                    backoff.reset();
                }
                match relay.into_fatal(e) {
                    Ok(fatal) => break Err(fatal),
                    Err(transient) => {
                        let delay = backoff.next_delay();
                        metrics.reconnects.inc();
                        tracing::warn!(error = %transient, retry_in = ?delay, "replication session ended; reconnecting");
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = stop_rx.changed() => break Ok(()),
                        }
                    }
                }
            }
        }
    };

    // Stop the monitor (it takes a last reading, so a lost slot is reported) and let the webhook
    // deliver what it has, both bounded.
    let _ = fatal.stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), monitor_task).await;
    if let Some(done) = webhook_task {
        let _ = tokio::time::timeout(Duration::from_secs(5), done).await;
    }
    // A fatal error found by the slot monitor stopped the relay like a shutdown does.
    let outcome = match (outcome, fatal.error.lock().ok().and_then(|mut f| f.take())) {
        (Ok(()), Some(e)) => Err(e),
        (outcome, _) => outcome,
    };
    if let Err(e) = &outcome {
        health.set_fatal(e.message.clone());
    }
    let sink = relay.into_sink();
    // In-flight events were already waited for (bounded) when the session ended.
    let timeout = config.relay.shutdown_timeout.min(Duration::from_secs(5));
    let flushed = tokio::task::spawn_blocking(move || {
        let ok = sink.flush(timeout);
        drop(sink);
        ok
    })
    .await
    .unwrap_or(false);
    if !flushed {
        tracing::warn!(
            "kafka producer did not flush in time; unconfirmed events are sent again after restart"
        );
    }
    // The runtime waits for the (bounded) probe anyway when it is dropped; waiting here keeps
    // its log line before the caller's final one-line error.
    let _ = probe.await;
    outcome
}

/// Logs, in the background, whether the brokers answer; never fails start-up (events wait for
/// the broker). Ends within the probe's 5 s timeout.
fn probe_brokers(sink: KafkaSink, brokers: String) -> tokio::task::JoinHandle<()> {
    tokio::task::spawn_blocking(move || match sink.probe(Duration::from_secs(5)) {
        Ok(()) => tracing::info!(brokers = %brokers, "kafka brokers reachable"),
        Err(e) => tracing::warn!(
            brokers = %brokers,
            error = %e,
            "kafka brokers not reachable yet; events will wait for them"
        ),
    })
}
