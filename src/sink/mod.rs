//! Where events go. The relay publishes through one interface, [`Publisher`], which every
//! broker implements: hand over records in commit order, report one [`Ack`] per record on the
//! relay's [`AckQueue`], classify what the broker refused ([`DeliveryError`]), write walbox's
//! progress records where that broker keeps them. [`Sink`] is the publisher `walbox run` was
//! configured with.
//!
//! Kafka ([`kafka`]) adds what only Kafka has: its topics ([`topics`], created or checked),
//! Kafka transactions for exactly-once mode ([`transaction`]), and how long the brokers left the
//! producer waiting ([`silence`]). Every Kafka client here is configured by
//! [`crate::config::KafkaConfig::client_config`] for its role. The progress records
//! ([`progress`]) are broker-neutral JSON; where each broker keeps them is its module's choice
//! (docs/architecture.md says why).
//!
//! # Invariants (every publisher)
//! - Every record [`Publisher::send`] accepted gets exactly one [`Ack`], in the queue of the relay
//!   that sent it.
//! - Records of one destination and key reach the broker in the order `send` was called, and a
//!   retry never reorders them: a publisher that cannot keep the order after a failure fails
//!   the record (and everything sent after it) instead of re-sending on its own.
//! - An `Ok` ack means the broker holds the record durably (its module says what that means for
//!   that broker); only then may the relay confirm past it.

pub mod ack;
pub mod kafka;
pub mod progress;
pub mod rabbitmq;
mod rabbitmq_client;
pub mod silence;
pub mod topics;
pub mod transaction;

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use ack::{Ack, AckQueue, BrokerError, DeliveryError, FailedRecord, PROGRESS_ROUTE};

use rdkafka::error::KafkaError;

use crate::config::{BrokerConfig, BrokerKind, Config, KafkaConfig};
use crate::failure::{kafka_error, Class, Classify, Failure};
use crate::outbox::OutboxEvent;
use kafka::{refused_by_producer, KafkaSink};
use progress::{ProgressError, ProgressKey, ProgressRecord};

/// Errors creating a publisher or handing it a record.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// librdkafka refused the configuration.
    #[error("kafka producer configuration rejected: {0}")]
    Config(#[source] KafkaError),
    /// The record was refused by the producer itself, in `produce()`, before any broker saw
    /// it; the message says which limit refused it (see [`refused_by_producer`]).
    #[error("{}", refused_by_producer(.0))]
    Send(#[source] KafkaError),
    /// Another broker's publisher refused the record, or cannot take any (its class says which).
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The publisher has no room now (librdkafka's local queue, a broker's window); try again
    /// shortly.
    #[error("the publisher's queue is full")]
    QueueFull,
}

impl SinkError {
    /// The record's fault ([`Class::Rejected`]), transient, or fatal.
    pub fn class(&self) -> Class {
        match self {
            SinkError::Send(e) => kafka_error(e),
            SinkError::Config(_) => Class::Fatal(Failure::Kafka),
            SinkError::Broker(e) => e.class,
            SinkError::QueueFull => Class::Transient,
        }
    }
}

impl Classify for SinkError {
    fn failure(&self) -> Option<Failure> {
        self.class().fatal()
    }
}

/// What the relay asks of a broker. Sending never blocks: a publisher that has no room returns
/// [`SinkError::QueueFull`] and the relay tries again once acks freed some.
pub trait Publisher {
    /// Which broker this is (metrics labels, log lines).
    fn broker(&self) -> BrokerKind;

    /// Hands one event over; its [`Ack`] arrives later with `seq` and `route`.
    fn send(&self, event: &OutboxEvent, seq: u64, route: usize) -> Result<(), SinkError>;

    /// Hands over the progress record `value` of the slot `key` names; its [`Ack`] arrives with
    /// route [`PROGRESS_ROUTE`].
    fn send_progress(&self, key: &str, value: &[u8]) -> Result<(), SinkError>;

    /// Records handed over whose ack has not come yet.
    fn in_flight(&self) -> usize;

    /// Waits up to `timeout` until every record handed over has its ack; whether none is left.
    fn flush(&self, timeout: Duration) -> bool;

    /// How long the broker left this publisher waiting for an answer since `from`.
    fn silent_since(&self, from: Instant) -> Duration;
}

/// The publisher of `walbox run`: one per relay (or one shared by the shards of a process).
#[derive(Clone)]
pub enum Sink {
    /// Kafka, through librdkafka.
    Kafka(KafkaSink),
    /// RabbitMQ, through lapin.
    RabbitMq(rabbitmq::RabbitMqSink),
}

impl Sink {
    /// The Kafka producer, when the broker is Kafka (topics and transactions need it).
    pub fn kafka(&self) -> Option<&KafkaSink> {
        match self {
            Sink::Kafka(k) => Some(k),
            Sink::RabbitMq(_) => None,
        }
    }

    fn publisher(&self) -> &dyn Publisher {
        match self {
            Sink::Kafka(k) => k,
            Sink::RabbitMq(r) => r,
        }
    }
}

impl From<KafkaSink> for Sink {
    fn from(sink: KafkaSink) -> Self {
        Sink::Kafka(sink)
    }
}

impl Publisher for Sink {
    fn broker(&self) -> BrokerKind {
        self.publisher().broker()
    }

    fn send(&self, event: &OutboxEvent, seq: u64, route: usize) -> Result<(), SinkError> {
        self.publisher().send(event, seq, route)
    }

    fn send_progress(&self, key: &str, value: &[u8]) -> Result<(), SinkError> {
        self.publisher().send_progress(key, value)
    }

    fn in_flight(&self) -> usize {
        self.publisher().in_flight()
    }

    fn flush(&self, timeout: Duration) -> bool {
        self.publisher().flush(timeout)
    }

    fn silent_since(&self, from: Instant) -> Duration {
        self.publisher().silent_since(from)
    }
}

/// Connects the publisher `config` names (its own, not shared with other relays); its reports
/// go to `acks`.
pub async fn connect(config: &Config, acks: Arc<AckQueue>) -> Result<Sink, SinkError> {
    match &config.broker {
        BrokerConfig::Kafka => KafkaSink::new(&config.kafka, acks).map(Sink::Kafka),
        BrokerConfig::RabbitMq(r) => rabbitmq::connect(r, acks).await.map(Sink::RabbitMq),
    }
}

/// The newest progress record of `key` where `broker` keeps them (`kafka` when the broker is
/// Kafka), reading at most `timeout`. `Ok(None)` only when the broker was read and holds none:
/// the evidence that the slot never existed.
pub async fn read_progress(
    broker: &BrokerConfig,
    kafka: &KafkaConfig,
    key: &ProgressKey,
    timeout: Duration,
) -> Result<Option<ProgressRecord>, ProgressError> {
    match broker {
        BrokerConfig::Kafka => {
            let (config, key) = (kafka.clone(), key.clone());
            let topic = config.progress_topic.clone();
            tokio::task::spawn_blocking(move || progress::read_last(&config, &key, timeout))
                .await
                .unwrap_or(Err(ProgressError::Timeout(topic)))
        }
        BrokerConfig::RabbitMq(r) => {
            let key = key.record_key();
            let place = rabbitmq::progress_queue(r, &key);
            let read = tokio::time::timeout(timeout, rabbitmq::read_progress(r, &key));
            match read.await {
                Err(_) => Err(ProgressError::Timeout(place)),
                Ok(Err(e)) => Err(ProgressError::Broker(e)),
                Ok(Ok(None)) => Ok(None),
                Ok(Ok(Some(bytes))) => parse_progress(&place, &bytes).map(Some),
            }
        }
    }
}

/// A progress record read back from a broker other than Kafka (`place` names where).
pub fn parse_progress(place: &str, value: &[u8]) -> Result<ProgressRecord, ProgressError> {
    serde_json::from_slice(value).map_err(|e| ProgressError::Malformed {
        place: place.to_owned(),
        error: e.to_string(),
    })
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
