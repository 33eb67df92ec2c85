//! Where events go: Kafka ([`kafka`]), its topics ([`topics`]), walbox's own progress
//! records ([`progress`]), and Kafka transactions for exactly-once mode ([`transaction`]), with
//! how long the brokers left the producer waiting ([`silence`]).

use std::collections::BTreeMap;

use rdkafka::ClientConfig;

use crate::config::KafkaConfig;

pub mod kafka;
pub mod progress;
pub mod silence;
pub mod topics;
pub mod transaction;

/// The user's producer properties that every other client of the same cluster (admin,
/// progress reader) needs too: security settings, not producer tuning.
pub fn security_properties(
    properties: &BTreeMap<String, String>,
) -> impl Iterator<Item = (&str, &str)> {
    properties
        .iter()
        .filter(|(k, _)| {
            k.starts_with("security.") || k.starts_with("sasl.") || k.starts_with("ssl.")
        })
        .map(|(k, v)| (k.as_str(), v.as_str()))
}

/// How every walbox client of the relay's cluster connects: to each broker as soon as it
/// learns of it. librdkafka otherwise connects only when it needs a broker, and drops its
/// bootstrap connection once the first metadata names the brokers; a request that then finds
/// no broker up waits for a retry timer. For an idempotent or transactional producer that is
/// its producer id: 50 or 500 ms before the first event, and before `init_transactions`
/// returns (6-26 ms measured when connected eagerly).
pub const EAGER_CONNECTIONS: (&str, &str) = ("enable.sparse.connections", "false");

/// The configuration of a client other than the relay's producer (admin, progress reader, the
/// reset record's producer): the brokers, [`security_properties`] and [`EAGER_CONNECTIONS`].
pub fn client_config(config: &KafkaConfig) -> ClientConfig {
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &config.brokers)
        .set(EAGER_CONNECTIONS.0, EAGER_CONNECTIONS.1);
    for (k, v) in security_properties(&config.properties) {
        cc.set(k, v);
    }
    cc
}

/// Drops `client` on a thread of its own, named `name`: closing a librdkafka client waits for
/// its threads to wind down (tens to hundreds of milliseconds), which start-up need not. When
/// no thread can be started, it is dropped here.
pub fn close_in_background<T: Send + 'static>(name: &str, client: T) {
    if let Err(e) = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || drop(client))
    {
        tracing::debug!(error = %e, "closing a kafka client on this thread");
    }
}
