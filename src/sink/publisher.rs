//! What the relay asks of a broker ([`Publisher`]), and the errors of handing it a record
//! ([`SinkError`]). Every broker's publisher implements it; the invariants every one of them
//! keeps are in the `sink` module's docs.

use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::ack::BrokerError;
use crate::config::BrokerKind;
use crate::failure::{kafka_error, Class, Classify, Failure};
use crate::outbox::OutboxEvent;

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

    /// Events sent again (after a crash, or by a standby taking over) that the broker already
    /// held and did not store twice: Redis's re-sent entries confirmed by id, NATS's
    /// duplicate PubAcks. 0 for a broker that cannot tell (Kafka's idempotent producer dedups
    /// its own retries only; RabbitMQ stores a re-send again).
    fn already_delivered(&self) -> u64 {
        0
    }

    /// Records this publisher holds at most (its memory bound) when that is fewer than
    /// `relay.max_in_flight`: the relay then stops reading at this many.
    fn max_held(&self) -> Option<usize> {
        None
    }

    /// How long the oldest record handed over has waited for its ack, when the publisher
    /// tracks it: the duplicate window a NATS stream needs at least.
    fn oldest_unacked(&self) -> Option<Duration> {
        None
    }
}

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
    /// As a publisher's error: a record refused is an event that cannot be published.
    fn failure(&self) -> Option<Failure> {
        self.class().published_failure()
    }
}

/// Why the producer refused a record in `produce()`. librdkafka reports its own size limit with
/// the broker's error code (`MSG_SIZE_TOO_LARGE`, "Broker: Message size too large"), but no
/// broker was involved: the record is over the producer's `message.max.bytes`.
pub fn refused_by_producer(e: &KafkaError) -> String {
    match e {
        KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge) => {
            "the producer refused the record before sending it: it is larger than the producer's \
             message.max.bytes (librdkafka's default: 1000000 bytes); raise \"message.max.bytes\" \
             in [kafka.properties], and check that the broker's message.max.bytes and the topic's \
             max.message.bytes accept it too"
                .to_owned()
        }
        KafkaError::MessageProduction(RDKafkaErrorCode::UnknownPartition) => {
            format!("kafka refused the record: {NO_SUCH_PARTITION}")
        }
        e => format!("kafka refused the record: {e}"),
    }
}

/// What an `UnknownPartition` refusal means: the row named the partition.
pub(super) const NO_SUCH_PARTITION: &str =
    "the topic has no partition of the number the row names \
     (outbox.columns.partition; Local: Unknown partition)";
