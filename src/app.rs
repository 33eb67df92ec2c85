//! Wiring: metrics and HTTP endpoints, the producer, the relay, the reconnect loop and the
//! shutdown order. No business logic lives here.
//!
//! Start-up: bind the HTTP listener (a bad address fails at once), create the producer, probe the
//! brokers in the background (a warning, not an error: events wait for the broker), then run
//! replication sessions until shutdown or a fatal error. With `postgres.on_slot_busy = "wait"`
//! (the default) the sessions run in *terms*: the process first waits as a standby until it
//! holds the leader lock (`leader.rs`), and a term ends when the lock is lost, after which the
//! process is a standby again; with `"fail"` there is one term and a slot in use is exit 6.
//! While the slot is still held by the previous streamer's walsender, an active process retries
//! every second instead of exiting. The slot monitor runs beside the relay during a term,
//! on its own connection; when it finds the slot lost it stops the relay the way shutdown does
//! and walbox exits with the lost-slot status. A transient error ends the session and
//! the next one starts after a capped exponential backoff with jitter; the backoff resets only
//! once a session confirmed a new position (a session that streams and fails at the same place
//! again made no progress). A data error the server reports at the same transaction session
//! after session is permanent: the relay stops with exit 8 (`RelayError::Undecodable`).
//!
//! Shards (`postgres.shards` > 1, [`crate::shard`]): first every slot of the layout is made to
//! exist, all at one position ([`layout::prepare`]; a server short of slots or walsenders stops
//! the process before any shard streams), then each shard is one such relay, with its own
//! slot, checkpoint, slot monitor, leader lock and reconnect loop, all in this process. The
//! shards share one producer (one set of librdkafka threads, and batches that fill across
//! shards) and, with `kafka.create_topics`, one admin client; each has its own lane of
//! delivery reports ([`KafkaSink::shared`]), so an event's ack reaches only its shard. A client
//! error the producer cannot recover from stops every shard, as it would stop every per-shard
//! producer with the same configuration. In exactly-once mode each shard has its own producers
//! (a Kafka transaction belongs to one producer).
//! A transient error reconnects its shard only; a fatal error stops its shard only (`/healthz`
//! then fails) and is the process's exit status once shutdown has stopped the others. Metrics
//! carry the label `slot`; outbox retention runs in the first shard's term.
//!
//! Shutdown order (SIGTERM/SIGINT, or the `shutdown` future in tests): read to the end of the open
//! transaction, stop intake → wait up to `relay.shutdown_timeout` for in-flight acks → final
//! standby status and a clean end of the replication stream → stop the slot monitor
//! (it takes one last reading, so a slot lost meanwhile is still reported) and let the alert
//! webhook deliver what it holds (each bounded to 5 s) → flush the producer (at most 5 s more)
//! → return `Ok` (exit 0), or the fatal error.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::config::{Config, OnSlotBusy};
use crate::failure::Classify;
use crate::failure::{Class, Failure, FatalError};
use crate::health::monitor::{self, FatalSignal};
use crate::health::webhook::Webhook;
use crate::leader::{self, Leadership};
use crate::metrics::{self, Health, Metrics, ShardMetrics};
use crate::relay::{Relay, RelayError, SessionEnd, Settings};
use crate::retention;
use crate::sink::kafka::{KafkaSink, Lane};
use crate::sink::topics::Topics;
use crate::sink::{AckQueue, Publisher, Sink};

pub mod layout;

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

/// [`run`] with caller-provided metrics and health (the demo and tests read them). With
/// `postgres.shards` > 1 every shard has its own metrics (labelled with its slot) and health,
/// served together, and `handles` is not used.
pub async fn run_with(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
    handles: Handles,
) -> Result<(), FatalError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutdown requested: stopping intake, waiting for in-flight events");
        let _ = stop_tx.send(true);
    });
    if config.postgres.shards > 1 {
        return run_shards(config, stop_rx).await;
    }
    let Handles { metrics, health } = handles;
    serve_http(config.http_listen, metrics.clone(), vec![health.clone()]).await?;
    let borrowed = Borrowed::default();
    run_slot(Arc::new(config), stop_rx, metrics, health, borrowed).await
}

/// Runs every shard of `postgres.shards` as its own relay (own slot, checkpoint, monitor and
/// leader lock; one shared producer) until each has stopped. A fatal error stops its shard
/// only: the others go on, `/healthz` fails, and the process exits with the first fatal error
/// once shutdown has stopped the rest.
async fn run_shards(config: Config, stop: watch::Receiver<bool>) -> Result<(), FatalError> {
    let shards: Vec<(Config, Arc<Metrics>, Arc<Health>)> = config
        .postgres
        .shards()
        .into_iter()
        .enumerate()
        .map(|(k, postgres)| {
            let metrics = Arc::new(Metrics::for_slot(&postgres.slot));
            let mut shard = config.clone();
            shard.postgres = postgres;
            // Only the layout makes slots, all together ([`layout`]).
            shard.postgres.create_slot = false;
            // Retention deletes from the one outbox: one shard's term does it.
            if k > 0 {
                shard.outbox.retention = None;
            }
            (shard, metrics, Arc::new(Health::default()))
        })
        .collect();
    let exposition = ShardMetrics(shards.iter().map(|(_, m, _)| m.clone()).collect());
    let healths = shards.iter().map(|(_, _, h)| h.clone()).collect();
    serve_http(config.http_listen, Arc::new(exposition), healths).await?;
    tracing::info!(shards = shards.len(), "relaying through shards");
    // One admin client for every shard's topic cache (`kafka.create_topics`).
    let topics = new_topics(&config)?;
    // Exactly-once mode: every shard makes its own transactional producer.
    let (producer, lanes) = match SharedProducer::start(&config, shards.len())? {
        Some((producer, lanes)) => (Some(producer), lanes.into_iter().map(Some).collect()),
        None => (None, vec![None; shards.len()]),
    };
    // Every shard's slot exists, at one position, before any shard streams.
    let layout_sink = match &producer {
        Some(p) => p.owner.clone(),
        None => KafkaSink::new(&config.kafka, Arc::new(AckQueue::default()))
            .map_err(|e| FatalError::of_or(&e, Failure::Kafka))?,
    };
    let mut layout_topics = topics.sharing();
    let prepared = layout::prepare(&config, &layout_sink, &mut layout_topics, stop.clone()).await;
    drop(layout_sink);
    match prepared {
        Ok(true) => {}
        Ok(false) | Err(_) => {
            if let Some(producer) = producer {
                producer.finish(config.relay.shutdown_timeout).await;
            }
            return prepared.map(drop);
        }
    }
    let slots = shards
        .into_iter()
        .zip(lanes)
        .map(|((shard, metrics, health), producer)| SlotRun {
            config: shard,
            metrics,
            health,
            borrowed: Borrowed {
                producer,
                topics: Some(topics.sharing()),
            },
        })
        .collect();
    let outcome = run_slots(slots, &stop, |slot, ended| {
        if let Err(e) = ended {
            tracing::error!(slot = %slot, error = %e.message, "shard stopped");
        }
    })
    .await;
    if let Some(producer) = producer {
        producer.finish(config.relay.shutdown_timeout).await;
    }
    outcome
}

/// One slot's relay for [`run_slots`]: its configuration (`postgres` names the slot), its
/// metrics and health, and what it borrows from the process.
pub struct SlotRun {
    /// The relay's configuration, its `postgres` section the slot's.
    pub config: Config,
    /// The slot's metrics.
    pub metrics: Arc<Metrics>,
    /// The slot's health.
    pub health: Arc<Health>,
    /// Clients shared with the other slots.
    pub borrowed: Borrowed,
}

/// Relays every slot of `slots` at once, each by [`run_slot`] in its own task (a span naming
/// its slot), until each has stopped; `ended` hears each slot's outcome as it is collected.
/// Returns the first fatal error: one slot's error stops only that slot. Shared by `walbox run`
/// with shards and `walbox reshard`'s drain.
pub async fn run_slots(
    slots: Vec<SlotRun>,
    stop: &watch::Receiver<bool>,
    mut ended: impl FnMut(&str, &Result<(), FatalError>),
) -> Result<(), FatalError> {
    let tasks: Vec<_> = slots
        .into_iter()
        .map(|run| {
            let slot = run.config.postgres.slot.clone();
            let span = tracing::info_span!("shard", slot = %slot);
            let relay = run_slot(
                Arc::new(run.config),
                stop.clone(),
                run.metrics,
                run.health,
                run.borrowed,
            );
            (slot, tokio::spawn(relay.instrument(span)))
        })
        .collect();
    let mut outcome = Ok(());
    for (slot, task) in tasks {
        let result = task.await.unwrap_or_else(|e| {
            Err(FatalError::new(
                Failure::Internal,
                format!("slot {slot} panicked: {e}"),
            ))
        });
        ended(&slot, &result);
        if let Err(e) = result {
            if outcome.is_ok() {
                outcome = Err(e);
            }
        }
    }
    outcome
}

/// The producer the shards of one process share (not in exactly-once mode): its owner's
/// handle, flushed once every shard has stopped, and the background probe of its brokers.
struct SharedProducer {
    owner: KafkaSink,
    probe: tokio::task::JoinHandle<()>,
}

impl SharedProducer {
    /// Creates the producer and probes its brokers; returns it with a handle and a lane of
    /// delivery reports per shard, or `None` in exactly-once mode.
    fn start(config: &Config, shards: usize) -> Result<Option<(Self, Vec<Lane>)>, FatalError> {
        if config.kafka.exactly_once.is_some() {
            return Ok(None);
        }
        // The config sized the producer's queue for every shard's window.
        let lanes = KafkaSink::shared(&config.kafka, shards)
            .map_err(|e| FatalError::of_or(&e, Failure::Kafka))?;
        let Some((owner, _)) = lanes.first().cloned() else {
            return Ok(None);
        };
        let probe = probe_brokers(owner.clone(), config.kafka.brokers.clone());
        Ok(Some((SharedProducer { owner, probe }, lanes)))
    }

    /// Flushes the producer (every shard has stopped) and waits for the probe.
    async fn finish(self, shutdown_timeout: Duration) {
        flush(self.owner.into(), shutdown_timeout).await;
        let _ = self.probe.await;
    }
}

/// The topic cache for `config`, with its admin client when `kafka.create_topics` is on.
fn new_topics(config: &Config) -> Result<Topics, FatalError> {
    Topics::new(&config.kafka)
        .map_err(|e| FatalError::of_or(&e, Failure::Kafka).prefixed("kafka admin client"))
}

/// Clients a relay borrows from its caller instead of making its own: the shards of one
/// process share one producer (each with its own lane of delivery reports) and one admin
/// client.
#[derive(Default)]
pub struct Borrowed {
    /// This relay's handle on a shared producer, and its lane's queue. Its owner flushes it.
    pub producer: Option<Lane>,
    /// A topic cache over a shared admin client.
    pub topics: Option<Topics>,
}

/// Flushes the producer before it is dropped: at most `shutdown_timeout`, and never more than
/// 5 s.
async fn flush(sink: Sink, shutdown_timeout: Duration) {
    let timeout = shutdown_timeout.min(Duration::from_secs(5));
    let sink_broker = sink.broker();
    let flushed = tokio::task::spawn_blocking(move || {
        let ok = sink.flush(timeout);
        drop(sink);
        ok
    })
    .await
    .unwrap_or(false);
    if !flushed {
        tracing::warn!(
            broker = %sink_broker,
            "the publisher did not flush in time; unconfirmed events are sent again after restart"
        );
    }
}

/// Binds `http.listen` (when set) and serves the endpoints in the background.
async fn serve_http(
    listen: Option<std::net::SocketAddr>,
    metrics: Arc<dyn metrics::Exposition>,
    health: Vec<Arc<Health>>,
) -> Result<(), FatalError> {
    let Some(addr) = listen else {
        return Ok(());
    };
    let (local, server) = metrics::bind_shards(addr, metrics, health)
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
    Ok(())
}

/// Relays one slot until `shutdown` is raised, a fatal error, or (with `postgres.drain_to`,
/// `walbox reshard`) the slot is drained; the fatal error (also one the slot monitor found) is
/// returned after the producer is flushed. A client in `borrowed` is used instead of one of
/// its own; a borrowed producer is neither probed nor flushed here (its owner does both).
pub async fn run_slot(
    config: Arc<Config>,
    mut shutdown: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    borrowed: Borrowed,
) -> Result<(), FatalError> {
    let owns_producer = borrowed.producer.is_none();
    metrics
        .broker
        .with_label_values(&[config.broker.kind().name()])
        .set(1);
    let (sink, acks) = match borrowed.producer {
        Some((sink, acks)) => (Sink::Kafka(sink), acks),
        None => {
            let acks = Arc::new(AckQueue::default());
            match connect_sink(&config, &acks, &mut shutdown).await? {
                Some(sink) => (sink, acks),
                // Shut down while the broker was unreachable.
                None => return Ok(()),
            }
        }
    };

    // This slot's stop: raised by shutdown, or by the slot monitor's fatal signal.
    let (stop_tx, mut stop_rx) = watch::channel(*shutdown.borrow());
    let fatal = FatalSignal {
        error: Arc::new(Mutex::new(None)),
        stop: stop_tx.clone(),
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => {
                let _ = stop_tx.send(true);
            }
            _ = stop_tx.closed() => {}
        }
    });
    let webhook = Webhook::start(&config.alerts)
        .map_err(|e| FatalError::of_or(&e, Failure::Config).prefixed("alerts.webhook_url"))?;
    let webhook_task = webhook.as_ref().map(Webhook::finished);

    let topics = match borrowed.topics {
        Some(topics) => topics,
        None => new_topics(&config)?,
    };
    let mut relay = Relay::new(
        Settings::of(&config),
        sink,
        acks,
        metrics.clone(),
        health.clone(),
        topics,
    );
    // A shared producer is probed once, by its owner.
    let probe = match relay.sink() {
        Sink::Kafka(k) if owns_producer => {
            Some(probe_brokers(k.clone(), config.kafka.brokers.clone()))
        }
        _ => None,
    };
    let mut backoff = Backoff::new(config.relay.backoff_initial, config.relay.backoff_max);
    let wait_for_slot = config.postgres.on_slot_busy == OnSlotBusy::Wait;
    let outcome = loop {
        // A standby until this process holds the leader lock (`on_slot_busy = "wait"`).
        let leadership = if wait_for_slot {
            let acquired = leader::acquire(
                &config.postgres.conn,
                &config.postgres.slot,
                &metrics,
                &health,
                &mut stop_rx,
            )
            .await;
            match acquired {
                Ok(Some(l)) => Some(Arc::new(l)),
                Ok(None) => break Ok(()),
                Err(fatal) => break Err(fatal),
            }
        } else {
            None
        };
        metrics.ha_active.set(1);
        health.set_active(true);
        health.set_ready(false);
        let term = Term::start(leadership.clone(), stop_rx.clone());
        let monitor_task = tokio::spawn(monitor::run(
            config.postgres.clone(),
            config.slot.clone(),
            metrics.clone(),
            webhook.clone(),
            fatal.clone(),
            term.stop.clone(),
        ));
        // Outbox retention belongs to the active process: it runs for the term.
        let retention_task = config.outbox.retention.clone().map(|cfg| {
            tokio::spawn(retention::run(
                config.postgres.clone(),
                config.outbox.tables.clone(),
                cfg,
                metrics.clone(),
                term.stop.clone(),
            ))
        });
        let mut term_stop = term.stop.clone();
        let mut slot_busy_logged = false;
        let ended = loop {
            match relay.run_session(&mut term_stop).await {
                Ok(SessionEnd::Shutdown | SessionEnd::Drained) => break Ok(()),
                Err(e) => {
                    if relay.made_progress {
                        backoff.reset();
                    }
                    // A shard the server has no walsender for: the others go on (its slot
                    // keeps its rows), `/healthz` fails until it streams.
                    if let (Some(_), RelayError::Open(open)) = (config.postgres.shard, &e) {
                        if let Some(setting) = open.exhausted_setting() {
                            health.set_blocked(Some(format!(
                                "shard {} cannot stream: {e}; raise {setting} (ALTER SYSTEM SET …; then restart PostgreSQL): its slot keeps its rows until then",
                                config.postgres.slot
                            )));
                        }
                    }
                    // The previous streamer's walsender still holds the slot: it lets go when it
                    // notices its client is gone (at the latest after wal_sender_timeout).
                    let delay = if wait_for_slot && e.failure() == Some(Failure::SlotInUse) {
                        if !std::mem::replace(&mut slot_busy_logged, true) {
                            tracing::info!(error = %e, retry_every = ?leader::SLOT_BUSY_RETRY, "active, but the slot is still held by the previous streamer's walsender; PostgreSQL releases it when that walsender notices its client is gone (at the latest after wal_sender_timeout)");
                        }
                        leader::SLOT_BUSY_RETRY
                    } else {
                        match relay.into_fatal(e) {
                            Ok(fatal) => break Err(fatal),
                            Err(transient) => {
                                let delay = backoff.next_delay();
                                metrics.reconnects.inc();
                                tracing::warn!(error = %transient, retry_in = ?delay, "replication session ended; reconnecting");
                                delay
                            }
                        }
                    };
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = term_stop.changed() => break Ok(()),
                    }
                }
            }
        };
        // Stop the monitor (it takes a last reading, so a lost slot is reported), bounded.
        let lost = term.end();
        let _ = tokio::time::timeout(Duration::from_secs(5), monitor_task).await;
        if let Some(task) = retention_task {
            // A deletion in progress is rolled back by dropping its connection.
            task.abort();
            let _ = task.await;
        }
        // The relay has stopped streaming: only now may the lock go.
        drop(leadership);
        if ended.is_err() || !lost || *stop_rx.borrow() {
            break ended;
        }
        metrics.ha_active.set(0);
        health.set_active(false);
        monitor::forget(&metrics);
        tracing::warn!("no longer the active walbox: waiting as a standby");
    };

    let _ = fatal.stop.send(true);
    // The delivery task finishes once every handle is gone.
    drop(webhook);
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
    // In-flight events were already waited for (bounded) when the session ended. A shared
    // producer still serves other shards: its owner flushes it.
    let sink = relay.into_sink();
    if owns_producer {
        flush(sink, config.relay.shutdown_timeout).await;
    }
    // The runtime waits for the (bounded) probe anyway when it is dropped; waiting here keeps
    // its log line before the caller's final one-line error.
    if let Some(probe) = probe {
        let _ = probe.await;
    }
    outcome
}

/// Connects the publisher of `config` (its reports to `acks`). A broker that cannot be reached
/// yet is waited for, with the relay's backoff, as the relay waits for PostgreSQL: nothing is
/// read from the slot meanwhile, so nothing is at risk. Refused credentials, a refused
/// configuration and the like stop walbox with their exit status. `None` when `shutdown` was
/// raised while waiting.
async fn connect_sink(
    config: &Config,
    acks: &Arc<AckQueue>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<Sink>, FatalError> {
    let mut backoff = Backoff::new(config.relay.backoff_initial, config.relay.backoff_max);
    loop {
        match crate::sink::connect(config, acks.clone()).await {
            Ok(sink) => return Ok(Some(sink)),
            Err(e) if e.class() == Class::Transient => {
                let delay = backoff.next_delay();
                tracing::warn!(broker = %config.broker.kind(), error = %e, retry_in = ?delay, "the broker cannot be reached yet; nothing is read from the slot until it can");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.wait_for(|stop| *stop) => return Ok(None),
                }
            }
            Err(e) => return Err(FatalError::of_or(&e, Failure::Kafka)),
        }
    }
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

/// One term as the active process: its `stop` is raised by shutdown (or the monitor's fatal
/// signal, which raises shutdown's channel) or by the loss of the leader lock.
struct Term {
    /// The relay's and the monitor's stop for this term.
    stop: watch::Receiver<bool>,
    lost: Arc<AtomicBool>,
    watcher: tokio::task::JoinHandle<()>,
    raise: watch::Sender<bool>,
}

impl Term {
    fn start(leadership: Option<Arc<Leadership>>, mut shutdown: watch::Receiver<bool>) -> Term {
        let (raise, stop) = watch::channel(*shutdown.borrow());
        let lost = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (raise, lost) = (raise.clone(), lost.clone());
            tokio::spawn(async move {
                match leadership {
                    Some(l) => {
                        if let Some(e) = l.lost(&mut shutdown).await {
                            // Every PostgreSQL restart ends the lock's connection too: a warning, and no
                            // claim of a standby that may not exist.
                            tracing::warn!(error = %e, "lost the leader lock: stopping the relay until this process holds it again (another walbox of this slot, if one runs, may take over meanwhile)");
                            lost.store(true, Ordering::SeqCst);
                        }
                    }
                    None => {
                        let _ = shutdown.wait_for(|stop| *stop).await;
                    }
                }
                let _ = raise.send(true);
            })
        };
        Term {
            stop,
            lost,
            watcher,
            raise,
        }
    }

    /// Ends the term (stops the monitor); returns whether it ended because the lock was lost.
    fn end(self) -> bool {
        self.watcher.abort();
        let _ = self.raise.send(true);
        self.lost.load(Ordering::SeqCst)
    }
}
