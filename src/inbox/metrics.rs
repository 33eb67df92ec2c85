//! The inbox's metrics, named once, and its `/metrics`, `/healthz`, `/readyz` listener.
//!
//! Names follow `walbox_inbox_<name>_<unit>[_total]`. `/readyz` answers 200 while the consumer
//! is running (503 while starting or stopped);
//! `/healthz` turns 503 after a fatal error.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge, Registry};

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
    /// `walbox_inbox_database_errors_total`: failed attempts that were the database's fault
    /// (connection, resources, restart, conflict), retried without counting against
    /// `effect.retries`.
    pub database_errors: IntCounter,
    /// `walbox_inbox_consumer_lag_records`: records behind the end of the log, summed over the
    /// assigned partitions (from librdkafka statistics), counted from where the group would
    /// start again (see [`super::consumer`]).
    pub consumer_lag: IntGauge,
    /// `walbox_inbox_retention_deleted_total`: inbox rows removed by the clean-up job.
    pub retention_deleted: IntCounter,
    /// `walbox_inbox_batch_records`: records per committed transaction.
    pub batch_records: Histogram,
    /// `walbox_inbox_partition_pauses_total`: partitions paused because their backlog reached
    /// its bound (the workers are behind the fetcher).
    pub partition_pauses: IntCounter,
    /// `walbox_inbox_assigned_partitions`: partitions this member owns now.
    pub assigned_partitions: IntGauge,
    /// `walbox_inbox_partitions_revoked_total`: partitions taken from this member by
    /// rebalances; a cooperative rebalance revokes only those that move.
    pub partitions_revoked: IntCounter,
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
            database_errors: counter(
                "walbox_inbox_database_errors_total",
                "Failed attempts that were the database's fault (connection, resources, restart, conflict), retried.",
            ),
            consumer_lag: register(
                &r,
                IntGauge::new(
                    "walbox_inbox_consumer_lag_records",
                    "Records behind the end of the log, from the committed offset (or where auto.offset.reset starts), summed over assigned partitions.",
                )
                .expect("valid metric"),
            ),
            retention_deleted: counter(
                "walbox_inbox_retention_deleted_total",
                "Inbox rows deleted by the retention clean-up job.",
            ),
            partition_pauses: counter(
                "walbox_inbox_partition_pauses_total",
                "Partitions paused because their backlog of fetched records reached its bound.",
            ),
            assigned_partitions: register(
                &r,
                IntGauge::new(
                    "walbox_inbox_assigned_partitions",
                    "Partitions assigned to this member of the consumer group now.",
                )
                .expect("valid metric"),
            ),
            partitions_revoked: counter(
                "walbox_inbox_partitions_revoked_total",
                "Partitions revoked from this member by rebalances.",
            ),
            batch_records: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "walbox_inbox_batch_records",
                        "Records per committed inbox transaction.",
                    )
                    .buckets(vec![
                        1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 10000.0,
                    ]),
                )
                .expect("valid metric"),
            ),
            registry: r,
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        crate::metrics::render_registry(&self.registry)
    }
}

impl Default for InboxMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl crate::metrics::Exposition for InboxMetrics {
    fn render(&self) -> String {
        InboxMetrics::render(self)
    }
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
            "walbox_inbox_database_errors_total",
            "walbox_inbox_consumer_lag_records",
            "walbox_inbox_batch_records_bucket",
            "walbox_inbox_assigned_partitions 0",
            "walbox_inbox_partitions_revoked_total 0",
        ] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
    }
}
