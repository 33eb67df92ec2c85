//! Metrics and health: names defined once, served on their own listener.
//!
//! `GET /metrics` returns the Prometheus text format, `GET /healthz` answers 200 while the
//! process is alive, has not hit a fatal error and no shard is blocked (no walsender free for
//! it), `GET /readyz` answers 200 only while a
//! replication session is streaming (503 while connecting, reconnecting or stopped).
//!
//! Metric names follow `walbox_<name>_<unit>[_total]` and are part of walbox's interface:
//! dashboards and the shipped alert rules rely on them.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Every metric walbox exports.
pub struct Metrics {
    registry: Registry,
    /// `walbox_broker_info{broker}`: 1 for the broker the relay publishes to (`kafka`,
    /// `redis`, `nats`, `rabbitmq`).
    pub broker: IntGaugeVec,
    /// `walbox_broker_already_delivered_total`: events sent again that the broker already held
    /// (Redis, NATS), so a crash did not duplicate them.
    pub already_delivered: IntCounter,
    /// `walbox_broker_oldest_unacked_seconds`: how long the oldest record handed to the
    /// broker has waited for its ack (NATS: the duplicate window a stream needs at least).
    pub oldest_unacked: Gauge,
    /// `walbox_events_published_total`: events acknowledged by the broker.
    pub events_published: IntCounter,
    /// `walbox_transactions_total`: transactions confirmed to PostgreSQL.
    pub transactions: IntCounter,
    /// `walbox_inflight_events`: events produced and not yet retired.
    pub inflight: IntGauge,
    /// `walbox_confirmed_flush_lsn`: the last position confirmed to PostgreSQL, as a number.
    pub confirmed_flush_lsn: IntGauge,
    /// `walbox_received_lsn`: commit LSN of the newest transaction received.
    pub received_lsn: IntGauge,
    /// `walbox_replication_lag_seconds`: now − commit time of the newest confirmed transaction
    /// (0 when nothing is pending).
    pub replication_lag: Gauge,
    /// `walbox_commit_to_ack_seconds`: commit timestamp → every event of the transaction acked.
    pub commit_to_ack: Histogram,
    /// `walbox_delivery_errors_total`: records the broker failed.
    pub delivery_errors: IntCounter,
    /// `walbox_dead_letter_total`: events sent to a dead-letter topic.
    pub dead_letters: IntCounter,
    /// `walbox_kafka_transactions_total{outcome}`: exactly-once mode's Kafka transactions,
    /// `committed` or `aborted`.
    pub kafka_transactions: IntCounterVec,
    /// `walbox_kafka_transaction_commit_seconds`: how long `commit_transaction` took (EndTxn,
    /// once every record was released).
    pub kafka_transaction_commit: Histogram,
    /// `walbox_kafka_transaction_phase_seconds{phase}`: the other steps of a Kafka
    /// transaction, `first_ack` (begun → its first delivery report: the coordinator adding its
    /// partitions), and from the start of its commit (its progress record produced right
    /// behind its events): `acks` (→ every event acknowledged), `progress` (→ the progress
    /// record acknowledged), `flush` (the commit's thread waiting until librdkafka released
    /// every record) and `whole` (→ the commit returned, the pause after EndTxn included).
    pub kafka_transaction_phase: HistogramVec,
    /// `walbox_exactly_once_skipped_events_total`: events PostgreSQL sent again that a
    /// committed Kafka transaction already holds (skipped at start-up).
    pub exactly_once_skipped: IntCounter,
    /// `walbox_reconnects_total`: replication sessions restarted after a transient error.
    pub reconnects: IntCounter,
    /// `walbox_streaming`: 1 while a replication session is streaming.
    pub streaming: IntGauge,
    /// `walbox_slot_retained_wal_bytes`: current WAL LSN − `restart_lsn`.
    pub slot_retained_wal: IntGauge,
    /// `walbox_slot_confirmed_lag_bytes`: current WAL LSN − `confirmed_flush_lsn`.
    pub slot_confirmed_lag: IntGauge,
    /// `walbox_slot_safe_wal_size_bytes` (absent when PostgreSQL reports NULL).
    pub slot_safe_wal_size: OptionalGauge,
    /// `walbox_slot_max_wal_keep_bytes` (absent when unlimited).
    pub slot_max_wal_keep: OptionalGauge,
    /// `walbox_slot_wal_keep_used_ratio` (absent when unlimited).
    pub slot_keep_used_ratio: OptionalGauge,
    /// `walbox_slot_wal_status{status}`: 1 for the current status.
    pub slot_wal_status: IntGaugeVec,
    /// `walbox_slot_failover`: 1 when the slot is synchronized to standbys (absent before 17).
    pub slot_failover: OptionalGauge,
    /// `walbox_slot_synced`: 1 on a standby's synchronized copy (absent before 17).
    pub slot_synced: OptionalGauge,
    /// `walbox_slot_idle_timeout_seconds`: `idle_replication_slot_timeout` (absent before 18
    /// and when disabled).
    pub slot_idle_timeout: OptionalGauge,
    /// `walbox_slot_spilled_bytes`: `pg_stat_replication_slots.spill_bytes` (absent before 14).
    pub slot_spilled: OptionalGauge,
    /// `walbox_slot_alert_level`: 0 ok, 1 warning, 2 critical, 3 lost.
    pub slot_alert_level: IntGauge,
    /// `walbox_slot_active`: 1 while some process streams from the slot.
    pub slot_active: IntGauge,
    /// `walbox_slot_checks_total`: slot health readings taken.
    pub slot_checks: IntCounter,
    /// `walbox_slot_check_errors_total`: slot health readings that failed.
    pub slot_check_errors: IntCounter,
    /// `walbox_heartbeats_sent_total`: heartbeat messages written.
    pub heartbeats_sent: IntCounter,
    /// `walbox_heartbeats_received_total`: heartbeat messages seen in the stream.
    pub heartbeats_received: IntCounter,
    /// `walbox_heartbeat_round_trip_seconds`: heartbeat write → received in the stream.
    pub heartbeat_round_trip: Histogram,
    /// `walbox_ha_active`: 1 while this process holds the leader lock (it streams, or is about
    /// to), 0 while it waits as a standby.
    pub ha_active: IntGauge,
    /// `walbox_outbox_retention_rows_deleted_total{table}`: rows deleted by `[outbox.retention]`.
    pub retention_rows_deleted: IntCounterVec,
    /// `walbox_outbox_retention_partitions_dropped_total{table}`.
    pub retention_partitions_dropped: IntCounterVec,
    /// `walbox_outbox_retention_partitions_created_total{table}`.
    pub retention_partitions_created: IntCounterVec,
    /// `walbox_outbox_retention_errors_total{table}`: failed retention passes.
    pub retention_errors: IntCounterVec,
    /// `walbox_outbox_retention_last_success_timestamp_seconds{table}`.
    pub retention_last_success: GaugeVec,
    /// `walbox_catchup_wal_behind_bytes`: the slot's confirmed lag at the last reading (absent
    /// before the first), as the catch-up estimate sees it (`health::progress`).
    pub catchup_behind: OptionalGauge,
    /// `walbox_catchup_events_per_second`: events acknowledged per second over the last minute.
    pub catchup_events_rate: OptionalGauge,
    /// `walbox_catchup_drain_bytes_per_second`: how fast the confirmed lag shrinks (negative:
    /// it grows).
    pub catchup_drain_rate: OptionalGauge,
    /// `walbox_catchup_eta_seconds`: time to catch up at the drain rate (absent when the lag
    /// does not shrink).
    pub catchup_eta: OptionalGauge,
}

/// A gauge that is absent from the exposition until set, and can be made absent again.
#[derive(Clone)]
pub struct OptionalGauge(GaugeVec);

impl OptionalGauge {
    /// Sets the value, or removes the series when `None`.
    pub fn set(&self, value: Option<f64>) {
        match value {
            Some(v) => self.0.with_label_values::<&str>(&[]).set(v),
            None => {
                let _ = self.0.remove_label_values::<&str>(&[]);
            }
        }
    }
}

/// The WAL statuses PostgreSQL reports for a slot.
pub const WAL_STATUSES: [&str; 4] = ["reserved", "extended", "unreserved", "lost"];

fn optional(r: &Registry, name: &str, help: &str) -> OptionalGauge {
    OptionalGauge(register(
        r,
        GaugeVec::new(Opts::new(name, help), &[]).expect("valid metric"),
    ))
}

fn counter_vec(r: &Registry, name: &str, help: &str) -> IntCounterVec {
    register(
        r,
        IntCounterVec::new(Opts::new(name, help), &["table"]).expect("valid metric"),
    )
}

fn register<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, m: T) -> T {
    r.register(Box::new(m.clone()))
        .expect("metric names are unique and valid");
    m
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Self {
        Self::in_registry(Registry::new())
    }

    /// The metrics of one shard: every series carries the label `slot` (the shard's slot),
    /// so the shards of one process are told apart on `/metrics` ([`ShardMetrics`]).
    pub fn for_slot(slot: &str) -> Self {
        let labels = std::collections::HashMap::from([("slot".to_owned(), slot.to_owned())]);
        Self::in_registry(Registry::new_custom(None, Some(labels)).expect("a valid constant label"))
    }

    fn in_registry(r: Registry) -> Self {
        let counter = |name: &str, help: &str| {
            register(&r, IntCounter::new(name, help).expect("valid metric"))
        };
        let int_gauge =
            |name: &str, help: &str| register(&r, IntGauge::new(name, help).expect("valid metric"));
        Metrics {
            events_published: counter(
                "walbox_events_published_total",
                "Events acknowledged by the Kafka broker.",
            ),
            transactions: counter(
                "walbox_transactions_total",
                "Transactions whose events are all acknowledged and confirmed to PostgreSQL.",
            ),
            inflight: int_gauge(
                "walbox_inflight_events",
                "Events produced to Kafka and not yet retired by the checkpoint.",
            ),
            confirmed_flush_lsn: int_gauge(
                "walbox_confirmed_flush_lsn",
                "Last WAL position confirmed to PostgreSQL (flush LSN as a number).",
            ),
            received_lsn: int_gauge(
                "walbox_received_lsn",
                "Commit LSN of the newest transaction received from PostgreSQL.",
            ),
            replication_lag: register(
                &r,
                Gauge::with_opts(Opts::new(
                    "walbox_replication_lag_seconds",
                    "Now minus the commit time of the newest confirmed transaction; 0 when idle.",
                ))
                .expect("valid metric"),
            ),
            commit_to_ack: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "walbox_commit_to_ack_seconds",
                        "Commit timestamp to broker acknowledgement of every event of the transaction.",
                    )
                    .buckets(vec![
                        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                        10.0, 30.0, 60.0, 300.0,
                    ]),
                )
                .expect("valid metric"),
            ),
            delivery_errors: counter(
                "walbox_delivery_errors_total",
                "Records the Kafka producer reported as failed.",
            ),
            dead_letters: counter(
                "walbox_dead_letter_total",
                "Events that could not be published and went to a dead-letter topic.",
            ),
            kafka_transactions: register(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "walbox_kafka_transactions_total",
                        "Kafka transactions of exactly-once mode, by outcome (committed, aborted).",
                    ),
                    &["outcome"],
                )
                .expect("valid metric"),
            ),
            kafka_transaction_commit: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "walbox_kafka_transaction_commit_seconds",
                        "Time to commit a Kafka transaction (flush and EndTxn), exactly-once mode.",
                    )
                    .buckets(vec![
                        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                        10.0, 30.0,
                    ]),
                )
                .expect("valid metric"),
            ),
            kafka_transaction_phase: register(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "walbox_kafka_transaction_phase_seconds",
                        "Steps of a Kafka transaction in exactly-once mode: first_ack (begun to first delivery report); from the start of its commit: acks (every event acknowledged), progress (progress record acknowledged), whole (commit returned); flush (commit thread waiting for every record to be released).",
                    )
                    .buckets(vec![
                        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                        10.0, 30.0,
                    ]),
                    &["phase"],
                )
                .expect("valid metric"),
            ),
            exactly_once_skipped: counter(
                "walbox_exactly_once_skipped_events_total",
                "Events sent again by PostgreSQL that a committed Kafka transaction already holds.",
            ),
            reconnects: counter(
                "walbox_reconnects_total",
                "Replication sessions restarted after a transient error.",
            ),
            streaming: int_gauge(
                "walbox_streaming",
                "1 while a replication session is streaming, else 0.",
            ),
            slot_retained_wal: int_gauge(
                "walbox_slot_retained_wal_bytes",
                "WAL the slot retains: current WAL LSN minus restart_lsn.",
            ),
            slot_confirmed_lag: int_gauge(
                "walbox_slot_confirmed_lag_bytes",
                "Current WAL LSN minus the slot's confirmed_flush_lsn.",
            ),
            slot_safe_wal_size: optional(
                &r,
                "walbox_slot_safe_wal_size_bytes",
                "Bytes of WAL that can be written before the slot is in danger (absent when unlimited).",
            ),
            slot_max_wal_keep: optional(
                &r,
                "walbox_slot_max_wal_keep_bytes",
                "max_slot_wal_keep_size in bytes (absent when -1, unlimited).",
            ),
            slot_keep_used_ratio: optional(
                &r,
                "walbox_slot_wal_keep_used_ratio",
                "Retained WAL divided by max_slot_wal_keep_size (absent when unlimited).",
            ),
            already_delivered: counter(
                "walbox_broker_already_delivered_total",
                "Events sent again that the broker already held and did not store twice (Redis, NATS).",
            ),
            oldest_unacked: register(
                &r,
                Gauge::with_opts(Opts::new(
                    "walbox_broker_oldest_unacked_seconds",
                    "How long the oldest record handed to the broker has waited for its ack (brokers that track it: NATS).",
                ))
                .expect("valid metric"),
            ),
            broker: register(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "walbox_broker_info",
                        "1 for the broker the relay publishes to (kafka, redis, nats, rabbitmq).",
                    ),
                    &["broker"],
                )
                .expect("valid metric"),
            ),
            slot_wal_status: register(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "walbox_slot_wal_status",
                        "1 for the slot's current wal_status (reserved, extended, unreserved, lost).",
                    ),
                    &["status"],
                )
                .expect("valid metric"),
            ),
            slot_failover: optional(
                &r,
                "walbox_slot_failover",
                "1 when the slot is synchronized to standbys for failover (PostgreSQL 17+).",
            ),
            slot_synced: optional(
                &r,
                "walbox_slot_synced",
                "1 when the slot is a standby's copy synchronized from the primary (PostgreSQL 17+).",
            ),
            slot_idle_timeout: optional(
                &r,
                "walbox_slot_idle_timeout_seconds",
                "idle_replication_slot_timeout: an inactive slot is invalidated after it (PostgreSQL 18+, absent when disabled).",
            ),
            slot_spilled: optional(
                &r,
                "walbox_slot_spilled_bytes",
                "Decoded transaction bytes the walsender spilled to disk, cumulative (PostgreSQL 14+).",
            ),
            slot_alert_level: int_gauge(
                "walbox_slot_alert_level",
                "Slot alert level: 0 ok, 1 warning, 2 critical, 3 lost.",
            ),
            slot_active: int_gauge(
                "walbox_slot_active",
                "1 while some process streams from the slot.",
            ),
            slot_checks: counter("walbox_slot_checks_total", "Slot health readings taken."),
            slot_check_errors: counter(
                "walbox_slot_check_errors_total",
                "Slot health readings that failed.",
            ),
            heartbeats_sent: counter(
                "walbox_heartbeats_sent_total",
                "Heartbeat messages written with pg_logical_emit_message.",
            ),
            heartbeats_received: counter(
                "walbox_heartbeats_received_total",
                "Heartbeat messages seen coming back through the replication stream.",
            ),
            heartbeat_round_trip: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "walbox_heartbeat_round_trip_seconds",
                        "Heartbeat written on the control connection to received in the stream.",
                    )
                    .buckets(vec![
                        0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0,
                    ]),
                )
                .expect("valid metric"),
            ),
            ha_active: int_gauge(
                "walbox_ha_active",
                "1 while this process is the active one for its slot (holds the leader lock), 0 while it waits as a standby.",
            ),
            catchup_behind: optional(
                &r,
                "walbox_catchup_wal_behind_bytes",
                "WAL behind at the last slot reading: current WAL LSN minus confirmed_flush_lsn.",
            ),
            catchup_events_rate: optional(
                &r,
                "walbox_catchup_events_per_second",
                "Events acknowledged per second over the last minute of slot readings.",
            ),
            catchup_drain_rate: optional(
                &r,
                "walbox_catchup_drain_bytes_per_second",
                "Bytes per second by which the WAL behind shrinks (negative while it grows).",
            ),
            catchup_eta: optional(
                &r,
                "walbox_catchup_eta_seconds",
                "Seconds until walbox has caught up at the current drain rate (absent when not draining).",
            ),
            retention_rows_deleted: counter_vec(
                &r,
                "walbox_outbox_retention_rows_deleted_total",
                "Outbox rows deleted by [outbox.retention], per table.",
            ),
            retention_partitions_dropped: counter_vec(
                &r,
                "walbox_outbox_retention_partitions_dropped_total",
                "Outbox partitions dropped by [outbox.retention], per table.",
            ),
            retention_partitions_created: counter_vec(
                &r,
                "walbox_outbox_retention_partitions_created_total",
                "Outbox partitions created ahead by [outbox.retention], per table.",
            ),
            retention_errors: counter_vec(
                &r,
                "walbox_outbox_retention_errors_total",
                "Failed [outbox.retention] passes, per table.",
            ),
            retention_last_success: register(
                &r,
                GaugeVec::new(
                    Opts::new(
                        "walbox_outbox_retention_last_success_timestamp_seconds",
                        "Unix time of the last [outbox.retention] pass that succeeded, per table.",
                    ),
                    &["table"],
                )
                .expect("valid metric"),
            ),
            registry: r,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        render_registry(&self.registry)
    }
}

/// The Prometheus text exposition of a registry.
pub fn render_registry(registry: &Registry) -> String {
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut buf)
        .expect("text encoding into a Vec cannot fail");
    String::from_utf8(buf).unwrap_or_default()
}

/// The metrics of every shard of a process, exposed together: the samples of one metric from
/// every shard under one `# HELP`/`# TYPE` header, told apart by their `slot` label.
pub struct ShardMetrics(pub Vec<Arc<Metrics>>);

impl Exposition for ShardMetrics {
    fn render(&self) -> String {
        let mut families: Vec<prometheus::proto::MetricFamily> = Vec::new();
        for m in &self.0 {
            for family in m.registry.gather() {
                match families.iter_mut().find(|f| f.name() == family.name()) {
                    Some(f) => f.mut_metric().extend(family.get_metric().iter().cloned()),
                    None => families.push(family),
                }
            }
        }
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&families, &mut buf)
            .expect("text encoding into a Vec cannot fail");
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// Something `/metrics` can expose: the relay's metrics, or `walbox inbox`'s.
pub trait Exposition: Send + Sync + 'static {
    /// The Prometheus text format.
    fn render(&self) -> String;
}

impl Exposition for Metrics {
    fn render(&self) -> String {
        Metrics::render(self)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Liveness and readiness, shared between the worker (the relay's replication session, the
/// inbox's consumer) and the HTTP endpoints.
#[derive(Default)]
pub struct Health {
    ready: AtomicBool,
    active: AtomicBool,
    fatal: Mutex<Option<String>>,
    blocked: Mutex<Option<String>>,
}

impl Health {
    /// Whether the worker is doing its job (streaming, consuming): `/readyz`.
    pub fn set_ready(&self, on: bool) {
        self.ready.store(on, Ordering::Relaxed);
    }

    /// See [`Health::set_ready`].
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Whether this process is the active one for its slot: `/active` (a standby answers 503).
    pub fn set_active(&self, on: bool) {
        self.active.store(on, Ordering::Relaxed);
    }

    /// See [`Health::set_active`].
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Records a fatal error: `/healthz` turns 503 with this message.
    pub fn set_fatal(&self, message: String) {
        self.set_ready(false);
        if let Ok(mut f) = self.fatal.lock() {
            *f = Some(message);
        }
    }

    /// Records why the worker cannot start although it keeps trying (a shard without a free
    /// walsender), or that it can again (`None`): `/healthz` fails meanwhile.
    pub fn set_blocked(&self, reason: Option<String>) {
        if let Ok(mut b) = self.blocked.lock() {
            *b = reason;
        }
    }

    /// The fatal error, else why the worker is blocked: what `/healthz` fails with.
    fn fatal(&self) -> Option<String> {
        let fatal = self.fatal.lock().ok().and_then(|f| f.clone());
        fatal.or_else(|| self.blocked.lock().ok().and_then(|b| b.clone()))
    }
}

/// What the endpoints answer from: one [`Health`] per shard (one for an unsharded relay and for
/// `walbox inbox`). `/healthz` fails when any shard hit a fatal error, `/readyz` succeeds when
/// every shard streams, `/active` when any shard is active.
#[derive(Clone)]
struct HttpState {
    metrics: Arc<dyn Exposition>,
    health: Arc<[Arc<Health>]>,
}

impl HttpState {
    fn fatal(&self) -> Option<String> {
        let all: Vec<String> = self.health.iter().filter_map(|h| h.fatal()).collect();
        (!all.is_empty()).then(|| all.join("; "))
    }
}

async fn metrics_handler(State(s): State<HttpState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
}

async fn healthz(State(s): State<HttpState>) -> impl IntoResponse {
    match s.fatal() {
        None => (StatusCode::OK, "ok\n".to_owned()),
        Some(m) => (StatusCode::SERVICE_UNAVAILABLE, format!("{m}\n")),
    }
}

async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    if s.health.iter().all(|h| h.is_ready()) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn active(State(s): State<HttpState>) -> impl IntoResponse {
    if s.health.iter().any(|h| h.is_active()) {
        (StatusCode::OK, "active\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "standby\n")
    }
}

/// Binds the HTTP listener of `/metrics`, `/healthz`, `/readyz` and `/active` (so a bad address
/// fails at start-up) and returns its address and the server future.
pub async fn bind(
    addr: SocketAddr,
    metrics: Arc<dyn Exposition>,
    health: Arc<Health>,
) -> std::io::Result<(
    SocketAddr,
    impl std::future::Future<Output = std::io::Result<()>>,
)> {
    bind_shards(addr, metrics, vec![health]).await
}

/// [`bind`] for a relay of several shards, each with its own [`Health`].
pub async fn bind_shards(
    addr: SocketAddr,
    metrics: Arc<dyn Exposition>,
    health: Vec<Arc<Health>>,
) -> std::io::Result<(
    SocketAddr,
    impl std::future::Future<Output = std::io::Result<()>>,
)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/active", get(active))
        .with_state(HttpState {
            metrics,
            health: health.into(),
        });
    Ok((local, async move { axum::serve(listener, app).await }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_documented_names() {
        let m = Metrics::new();
        m.events_published.inc_by(3);
        let text = m.render();
        for name in [
            "walbox_events_published_total 3",
            "walbox_transactions_total",
            "walbox_inflight_events",
            "walbox_confirmed_flush_lsn",
            "walbox_replication_lag_seconds",
            "walbox_commit_to_ack_seconds_bucket",
        ] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
    }

    #[test]
    fn optional_gauges_appear_and_disappear() {
        let m = Metrics::new();
        assert!(!m.render().contains("walbox_slot_safe_wal_size_bytes "));
        m.slot_safe_wal_size.set(Some(42.0));
        assert!(m.render().contains("walbox_slot_safe_wal_size_bytes 42"));
        m.slot_safe_wal_size.set(None);
        assert!(!m.render().contains("walbox_slot_safe_wal_size_bytes "));
    }
}
