//! The inbox's metrics, named once, and its `/metrics`, `/healthz`, `/readyz` listener.
//!
//! Names follow `walbox_inbox_<name>_<unit>[_total]`. `/readyz` answers 200 while the consumer
//! is running (503 while starting or stopped);
//! `/healthz` turns 503 after a fatal error.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus::{Encoder, IntCounter, IntGauge, Registry, TextEncoder};

/// Liveness and readiness of `walbox inbox`.
#[derive(Debug, Default)]
pub struct Health {
    consuming: AtomicBool,
    fatal: AtomicBool,
}

impl Health {
    /// Whether the consumer is running.
    pub fn set_consuming(&self, on: bool) {
        self.consuming.store(on, Ordering::Relaxed);
    }

    /// Whether the consumer is running.
    pub fn is_consuming(&self) -> bool {
        self.consuming.load(Ordering::Relaxed)
    }

    /// Records a fatal error: `/healthz` turns 503.
    pub fn set_fatal(&self) {
        self.set_consuming(false);
        self.fatal.store(true, Ordering::Relaxed);
    }

    /// Whether a fatal error happened.
    pub fn is_fatal(&self) -> bool {
        self.fatal.load(Ordering::Relaxed)
    }
}

/// Every metric `walbox inbox` exports.
pub struct InboxMetrics {
    registry: Registry,
    /// `walbox_inbox_records_consumed_total`: records taken from Kafka and processed (committed
    /// to PostgreSQL or dead-lettered).
    pub records_consumed: IntCounter,
    /// `walbox_inbox_duplicates_total`: records whose message id was already in the inbox.
    pub duplicates: IntCounter,
    /// `walbox_inbox_effects_applied_total`: records whose inbox row and effect committed.
    pub effects_applied: IntCounter,
    /// `walbox_inbox_effect_errors_total`: failed attempts (each retry counts).
    pub effect_errors: IntCounter,
    /// `walbox_inbox_dead_lettered_total`: records produced to the dead-letter topic.
    pub dead_lettered: IntCounter,
    /// `walbox_inbox_consumer_lag_records`: records behind the high watermark, summed over the
    /// assigned partitions (from librdkafka statistics).
    pub consumer_lag: IntGauge,
    /// `walbox_inbox_retention_deleted_total`: inbox rows removed by the clean-up job.
    pub retention_deleted: IntCounter,
}

fn register<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, m: T) -> T {
    r.register(Box::new(m.clone()))
        .expect("metric names are unique and valid");
    m
}

impl InboxMetrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Self {
        let r = Registry::new();
        let counter = |name: &str, help: &str| {
            register(&r, IntCounter::new(name, help).expect("valid metric"))
        };
        InboxMetrics {
            records_consumed: counter(
                "walbox_inbox_records_consumed_total",
                "Records consumed and processed (committed to PostgreSQL or dead-lettered).",
            ),
            duplicates: counter(
                "walbox_inbox_duplicates_total",
                "Records whose message id was already in the inbox (absorbed duplicates).",
            ),
            effects_applied: counter(
                "walbox_inbox_effects_applied_total",
                "Records whose inbox row and effect committed.",
            ),
            effect_errors: counter(
                "walbox_inbox_effect_errors_total",
                "Failed attempts to process a record (each retry counts).",
            ),
            dead_lettered: counter(
                "walbox_inbox_dead_lettered_total",
                "Records produced to the dead-letter topic.",
            ),
            consumer_lag: register(
                &r,
                IntGauge::new(
                    "walbox_inbox_consumer_lag_records",
                    "Records behind the high watermark, summed over assigned partitions.",
                )
                .expect("valid metric"),
            ),
            retention_deleted: counter(
                "walbox_inbox_retention_deleted_total",
                "Inbox rows deleted by the retention clean-up job.",
            ),
            registry: r,
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding into a Vec cannot fail");
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for InboxMetrics {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Clone)]
struct HttpState {
    metrics: Arc<InboxMetrics>,
    health: Arc<Health>,
}

async fn metrics_handler(State(s): State<HttpState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
}

async fn healthz(State(s): State<HttpState>) -> impl IntoResponse {
    if s.health.is_fatal() {
        (StatusCode::SERVICE_UNAVAILABLE, "fatal error\n")
    } else {
        (StatusCode::OK, "ok\n")
    }
}

async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    if s.health.is_consuming() {
        (StatusCode::OK, "consuming\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not consuming\n")
    }
}

/// Binds the listener and returns its address and the server future.
pub async fn bind(
    addr: SocketAddr,
    metrics: Arc<InboxMetrics>,
    health: Arc<Health>,
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
        .with_state(HttpState { metrics, health });
    Ok((local, async move { axum::serve(listener, app).await }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_documented_names() {
        let m = InboxMetrics::new();
        m.duplicates.inc();
        let text = m.render();
        for name in [
            "walbox_inbox_records_consumed_total",
            "walbox_inbox_duplicates_total 1",
            "walbox_inbox_effects_applied_total",
            "walbox_inbox_effect_errors_total",
            "walbox_inbox_consumer_lag_records",
        ] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
    }
}
