//! Where events go. The relay publishes through one interface, [`Publisher`], which every
//! broker implements: hand over records in commit order, report one [`Ack`] per record on the
//! relay's [`AckQueue`], classify what the broker refused ([`DeliveryError`]), write walbox's
//! progress records where that broker keeps them. [`Sink`] is the publisher `walbox run` was
//! configured with.
//!
//! What a broker holds can be read back for `walbox audit` from Redis and NATS
//! ([`readback`]).
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
pub mod nats;
pub mod progress;
mod publisher;
pub mod rabbitmq;
mod rabbitmq_client;
pub mod readback;
pub mod redis;
pub mod redis_reply;
pub mod silence;
pub mod topics;
pub mod transaction;

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use ack::{Ack, AckQueue, BrokerError, DeliveryError, FailedRecord, Refusal, PROGRESS_ROUTE};
pub use kafka::close_in_background;
pub use publisher::{Publisher, SinkError};

use crate::config::{BrokerConfig, BrokerKind, Config, KafkaConfig};
use crate::failure::Class;
use crate::lsn::Lsn;
use crate::outbox::OutboxEvent;
use kafka::KafkaSink;
use progress::{ProgressError, ProgressKey, ProgressRecord};

/// The publisher of `walbox run`: one per relay (or one shared by the shards of a process).
#[derive(Clone)]
pub enum Sink {
    /// Kafka, through librdkafka.
    Kafka(KafkaSink),
    /// Redis Streams.
    Redis(redis::RedisSink),
    /// NATS JetStream.
    Nats(nats::NatsSink),
    /// RabbitMQ, through lapin.
    RabbitMq(rabbitmq::RabbitMqSink),
}

impl Sink {
    /// The Kafka producer, when the broker is Kafka (topics and transactions need it).
    pub fn kafka(&self) -> Option<&KafkaSink> {
        match self {
            Sink::Kafka(k) => Some(k),
            Sink::Redis(_) | Sink::Nats(_) | Sink::RabbitMq(_) => None,
        }
    }

    fn publisher(&self) -> &dyn Publisher {
        match self {
            Sink::Kafka(k) => k,
            Sink::Redis(r) => r,
            Sink::Nats(n) => n,
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

    fn already_delivered(&self) -> u64 {
        self.publisher().already_delivered()
    }

    fn oldest_unacked(&self) -> Option<Duration> {
        self.publisher().oldest_unacked()
    }

    fn max_held(&self) -> Option<usize> {
        self.publisher().max_held()
    }
}

/// Connects the publisher `config` names (its own, not shared with other relays); its reports
/// go to `acks`.
pub async fn connect(config: &Config, acks: Arc<AckQueue>) -> Result<Sink, SinkError> {
    match &config.broker {
        BrokerConfig::Kafka => KafkaSink::new(&config.kafka, acks).map(Sink::Kafka),
        BrokerConfig::Redis(redis) => redis::connect(redis, acks).await.map(Sink::Redis),
        BrokerConfig::Nats(n) => nats::connect(n, acks).await.map(Sink::Nats),
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
        BrokerConfig::Redis(redis) => {
            let record_key = key.record_key();
            let place = redis::progress_place(redis, &record_key);
            let read = tokio::time::timeout(timeout, redis::read_progress(redis, &record_key));
            match read.await {
                Ok(Ok(Some(value))) => parse_progress(&place, &value).map(Some),
                Ok(Ok(None)) => Ok(None),
                Ok(Err(e)) => Err(ProgressError::Broker(e)),
                Err(_) => Err(ProgressError::Broker(BrokerError::new(
                    BrokerKind::Redis,
                    Class::Transient,
                    format!("cannot read {place} within {timeout:?}"),
                ))),
            }
        }
        BrokerConfig::Nats(n) => {
            let key = key.record_key();
            let read = tokio::time::timeout(timeout, nats::read_progress(n, &key))
                .await
                .unwrap_or_else(|_| {
                    Err(nats::error(
                        Class::Transient,
                        format!("reading progress record {key:?} took longer than {timeout:?}"),
                    ))
                })?;
            let place = format!(
                "nats bucket {:?} key {:?}",
                n.progress_bucket,
                nats::sanitize_key(&key)
            );
            read.map(|v| parse_progress(&place, &v)).transpose()
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

/// Writes `key`'s progress record for a slot made anew at `at` on `timeline` (`walbox
/// recreate-slot`) where the broker keeps them, and waits (at most `timeout`) for the broker
/// to acknowledge it.
pub async fn reset_progress(
    config: &Config,
    key: &ProgressKey,
    timeline: u32,
    at: Lsn,
    timeout: Duration,
) -> Result<(), ProgressError> {
    match &config.broker {
        BrokerConfig::Kafka => {
            let (kafka, key) = (config.kafka.clone(), key.clone());
            let topic = kafka.progress_topic.clone();
            tokio::task::spawn_blocking(move || {
                progress::write_reset(&kafka, &key, timeline, at, timeout)
            })
            .await
            .unwrap_or(Err(ProgressError::Timeout(topic)))
        }
        _ => {
            let lineage = progress::Lineage {
                timeline,
                slot_floor: at,
            };
            let record = ProgressRecord::new(key, lineage, at, None);
            publish_progress(config, key, &record, timeout).await
        }
    }
}

/// Sends `key`'s progress record `record` through a publisher of its own and waits (at most
/// `timeout`) for its ack: how the brokers without a blocking client write one record.
pub async fn publish_progress(
    config: &Config,
    key: &ProgressKey,
    record: &ProgressRecord,
    timeout: Duration,
) -> Result<(), ProgressError> {
    let acks = Arc::new(AckQueue::default());
    let broker = config.broker.kind();
    let unanswered = || {
        BrokerError::new(
            broker,
            Class::Transient,
            format!("no acknowledgement of the progress record within {timeout:?}"),
        )
    };
    let sink = connect(config, acks.clone()).await.map_err(|e| match e {
        SinkError::Broker(e) => ProgressError::Broker(e),
        e => ProgressError::Broker(BrokerError::new(broker, e.class(), e.to_string())),
    })?;
    // Strings and integers only: encoding cannot fail.
    let value = serde_json::to_vec(record).unwrap_or_default();
    sink.send_progress(&key.record_key(), &value)
        .map_err(|e| ProgressError::Broker(BrokerError::new(broker, e.class(), e.to_string())))?;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let mut acks_now = Vec::new();
        acks.drain_into(&mut acks_now);
        if let Some(ack) = acks_now.into_iter().find(|a| a.route == PROGRESS_ROUTE) {
            return ack.result.map_err(|e| match e {
                DeliveryError::Broker(e) => ProgressError::Broker(e),
                DeliveryError::Kafka(e) => ProgressError::Kafka {
                    topic: config.kafka.progress_topic.clone(),
                    error: e,
                },
            });
        }
        if let Some(e) = acks.fatal() {
            return Err(ProgressError::Broker(BrokerError::new(
                broker,
                e.class(),
                e.to_string(),
            )));
        }
        if tokio::time::timeout_at(deadline, acks.wait())
            .await
            .is_err()
        {
            return Err(ProgressError::Broker(unanswered()));
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
