//! Where events go: Kafka ([`kafka`]), its topics ([`topics`]), walbox's own progress
//! records ([`progress`]), and Kafka transactions for exactly-once mode ([`transaction`]), with
//! how long the brokers left the producer waiting ([`silence`]). Every Kafka client here is
//! configured by [`crate::config::KafkaConfig::client_config`] for its role.

pub mod kafka;
pub mod progress;
pub mod silence;
pub mod topics;
pub mod transaction;

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
