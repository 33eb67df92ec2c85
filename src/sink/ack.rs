//! What a broker says about each record handed to it: the [`Ack`]s of one relay's records,
//! queued for the relay in batches ([`AckQueue`]), and the broker-neutral error of a failed one
//! ([`DeliveryError`]), which says through `failure::Classify` whether it is the record's fault,
//! transient, or fatal. Every broker's publisher ([`super::Publisher`]) reports through these, so
//! the relay's acknowledged-prefix checkpoint is the same whichever broker it publishes to.
//!
//! # Invariants
//! - A publisher pushes exactly one [`Ack`] for every record [`super::Publisher::send`] accepted,
//!   into the queue of the relay that sent it.
//! - A publisher that can deliver nothing more (credentials refused, the connection closed for
//!   good) calls [`AckQueue::fail`]: no report would otherwise ever come.

use std::sync::Mutex;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tokio::sync::Notify;

use crate::config::BrokerKind;
use crate::failure::{kafka_error, Class, Classify, Failure};
use crate::outbox::{Headers, OutboxEvent, COMMIT_LSN_HEADER, INDEX_HEADER};

/// The route tag of progress records ([`crate::sink::progress`]): their acks never reach the
/// checkpoint. Every outbox table, and the messages route, has a route index below it.
pub const PROGRESS_ROUTE: usize = (1 << 10) - 1;

const _: () = assert!(crate::config::MAX_OUTBOX_TABLES + 1 < PROGRESS_ROUTE);

/// Why a broker failed a record, or can publish nothing more.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DeliveryError {
    /// librdkafka's error (the delivery report's, or a client error).
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// Another broker's, classified by its publisher.
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

/// A failure reported by a broker other than Kafka, with its class decided where the broker's
/// reply was read (the one place that knows that broker's codes).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{broker}: {message}")]
pub struct BrokerError {
    /// Which broker said it.
    pub broker: BrokerKind,
    /// The record's fault ([`Class::Rejected`]), transient, or fatal with its exit status.
    pub class: Class,
    /// What the broker said, and what to do about it.
    pub message: String,
    /// What kind of refusal it is, when the fix depends on it (a write refused for want of a
    /// permission, or of memory); `None` otherwise.
    pub refusal: Option<Refusal>,
}

/// A kind of refusal whose fix is known, for the messages of a caller that adds its own words
/// (the progress record's, say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// walbox's user (principal) may not write there: grant it.
    Permission,
    /// The server is out of memory (Redis's `OOM`): free memory, or change its policy.
    Memory,
}

impl BrokerError {
    /// A failure of `broker` of `class`, saying `message`.
    pub fn new(broker: BrokerKind, class: Class, message: impl Into<String>) -> Self {
        BrokerError {
            broker,
            class,
            message: message.into(),
            refusal: None,
        }
    }

    /// The same failure, known to be a refusal of kind `refusal`.
    pub fn refusing(self, refusal: Refusal) -> Self {
        BrokerError {
            refusal: Some(refusal),
            ..self
        }
    }
}

impl DeliveryError {
    /// The record's fault, transient, or fatal.
    pub fn class(&self) -> Class {
        match self {
            DeliveryError::Kafka(e) => kafka_error(e),
            DeliveryError::Broker(e) => e.class,
        }
    }

    /// What kind of refusal it is, when its fix is known: Kafka's authorization codes, and
    /// what another broker's publisher said ([`BrokerError::refusal`]).
    pub fn refusal(&self) -> Option<Refusal> {
        use RDKafkaErrorCode as C;
        match self {
            DeliveryError::Kafka(e) => match e.rdkafka_error_code() {
                Some(
                    C::TopicAuthorizationFailed
                    | C::ClusterAuthorizationFailed
                    | C::TransactionalIdAuthorizationFailed,
                ) => Some(Refusal::Permission),
                _ => None,
            },
            DeliveryError::Broker(e) => e.refusal,
        }
    }

    /// Which broker said it.
    pub fn broker(&self) -> BrokerKind {
        match self {
            DeliveryError::Kafka(_) => BrokerKind::Kafka,
            DeliveryError::Broker(e) => e.broker,
        }
    }

    /// librdkafka's error, when it is one.
    pub fn kafka(&self) -> Option<&KafkaError> {
        match self {
            DeliveryError::Kafka(e) => Some(e),
            DeliveryError::Broker(_) => None,
        }
    }

    /// Whether the broker refused a whole batch for one record of it (Kafka's
    /// `INVALID_TIMESTAMP`; see `relay::stream`'s `isolate_until`).
    pub fn is_batch_refusal(&self) -> bool {
        self.kafka().is_some_and(crate::failure::is_batch_refusal)
    }

    /// librdkafka's error code, when it is one.
    pub fn kafka_code(&self) -> Option<RDKafkaErrorCode> {
        self.kafka().and_then(|e| e.rdkafka_error_code())
    }
}

impl Classify for DeliveryError {
    /// As a publisher's error: a record refused is an event that cannot be published.
    fn failure(&self) -> Option<Failure> {
        self.class().published_failure()
    }
}

impl Classify for BrokerError {
    /// As [`DeliveryError`]'s.
    fn failure(&self) -> Option<Failure> {
        self.class.published_failure()
    }
}

/// The broker's verdict on one record.
#[derive(Debug)]
pub struct Ack {
    /// The record's sequence number (see `checkpoint`).
    pub seq: u64,
    /// The route (outbox table) the record came from.
    pub route: usize,
    /// `Ok` when the broker acknowledged it durably (Kafka: `acks=all`; see each broker's
    /// module for what its acknowledgement means).
    pub result: Result<(), DeliveryError>,
    /// For a failed record: what identifies it, read back from the record.
    pub failed: Option<FailedRecord>,
}

/// A record the broker failed, read back for the error message or a dead letter.
#[derive(Debug, Default, Clone)]
pub struct FailedRecord {
    /// The destination the record was sent to (topic, stream key, subject, routing key).
    pub topic: String,
    /// Header `id`.
    pub id: String,
    /// Header `walbox.commit_lsn`.
    pub lsn: String,
    /// Header `walbox.index`.
    pub index: String,
    /// The record key, as produced.
    pub key: Option<bytes::Bytes>,
    /// The record value, as produced.
    pub payload: Option<bytes::Bytes>,
}

impl FailedRecord {
    /// `event`, failed at its destination (`event.topic`).
    pub fn of_event(event: OutboxEvent) -> FailedRecord {
        EventIdentity::of(&event).failed()
    }
}

/// What a publisher keeps of an event while it waits for the broker's verdict, to build its
/// [`FailedRecord`] should it fail: the event's own buffers shared (no copy), and not the rest
/// of the event (its headers, a few hundred bytes moved with every record otherwise).
#[derive(Debug, Clone)]
pub struct EventIdentity {
    /// The destination (`event.topic`, interned).
    pub topic: std::sync::Arc<str>,
    id: bytes::Bytes,
    lsn: Option<bytes::Bytes>,
    index: Option<bytes::Bytes>,
    key: Option<bytes::Bytes>,
    payload: Option<bytes::Bytes>,
}

impl EventIdentity {
    /// What identifies `event` (its header `id`, commit LSN and index, key and value).
    pub fn of(event: &OutboxEvent) -> EventIdentity {
        EventIdentity {
            topic: event.topic.clone(),
            id: event.id.clone(),
            lsn: header_value(&event.headers, COMMIT_LSN_HEADER).cloned(),
            index: header_value(&event.headers, INDEX_HEADER).cloned(),
            key: event.key.clone(),
            payload: event.value.clone(),
        }
    }

    /// The event, failed at its destination.
    pub fn failed(self) -> FailedRecord {
        FailedRecord {
            topic: self.topic.to_string(),
            id: String::from_utf8_lossy(&self.id).into_owned(),
            lsn: text(self.lsn.as_ref()),
            index: text(self.index.as_ref()),
            key: self.key,
            payload: self.payload,
        }
    }
}

/// The value of header `name` in `headers` as text (empty when it is absent or null).
pub fn header_text(headers: &Headers, name: &str) -> String {
    text(header_value(headers, name))
}

/// The value of the first header `name` in `headers` (`None` when it is absent or null).
fn header_value<'h>(headers: &'h Headers, name: &str) -> Option<&'h bytes::Bytes> {
    headers
        .iter()
        .find(|(n, _)| n.as_str() == name)
        .and_then(|(_, v)| v.as_ref())
}

/// A header value as text (empty when there is none).
fn text(value: Option<&bytes::Bytes>) -> String {
    value
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}

/// Delivery reports waiting for the relay. The publisher (librdkafka's polling thread, or a
/// broker's publishing task) pushes one per record;
/// the relay is woken once per batch (when the queue turns non-empty) and takes the whole batch
/// at once, instead of one channel hop and possible wake-up per record.
#[derive(Default)]
pub struct AckQueue {
    pending: Mutex<Vec<Ack>>,
    ready: Notify,
    /// A client error after which the publisher cannot deliver anything (authentication or
    /// authorization refused, librdkafka's fatal error): no delivery report would ever come.
    fatal: Mutex<Option<DeliveryError>>,
}

impl AckQueue {
    /// Queues one report, waking the relay when the queue was empty.
    pub fn push(&self, ack: Ack) {
        let mut pending = match self.pending.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        let was_empty = pending.is_empty();
        pending.push(ack);
        drop(pending);
        if was_empty {
            // Stores a permit when nobody waits, so no batch is ever missed.
            self.ready.notify_one();
        }
    }

    /// Records a client error the publisher cannot recover from, and wakes the relay.
    pub fn fail(&self, error: DeliveryError) {
        let mut fatal = match self.fatal.lock() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        };
        fatal.get_or_insert(error);
        drop(fatal);
        self.ready.notify_one();
    }

    /// The client error the producer cannot recover from, if one happened.
    pub fn fatal(&self) -> Option<DeliveryError> {
        match self.fatal.lock() {
            Ok(f) => f.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Waits until reports may be waiting (spurious wake-ups are possible).
    pub async fn wait(&self) {
        self.ready.notified().await;
    }

    /// Whether no report waits: the relay has taken every report pushed so far.
    pub fn is_empty(&self) -> bool {
        match self.pending.lock() {
            Ok(p) => p.is_empty(),
            Err(poisoned) => poisoned.into_inner().is_empty(),
        }
    }

    /// Moves every waiting report into `out` (which should be empty; its capacity is reused).
    pub fn drain_into(&self, out: &mut Vec<Ack>) {
        let mut pending = match self.pending.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        std::mem::swap(&mut *pending, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::{EventPosition, HeaderName};
    use bytes::Bytes;

    #[test]
    fn a_failed_event_is_identified_by_its_id_lsn_index_key_and_value() {
        let event = OutboxEvent {
            topic: "orders".into(),
            partition: None,
            key: Some(Bytes::from_static(b"order-7")),
            value: Some(Bytes::from_static(b"{}")),
            headers: [
                (HeaderName::Static("id"), Some(Bytes::from_static(b"e-1"))),
                (
                    HeaderName::Static(COMMIT_LSN_HEADER),
                    Some(Bytes::from_static(b"0/16B3D00")),
                ),
                (HeaderName::Static(INDEX_HEADER), None),
            ]
            .into_iter()
            .collect(),
            timestamp_ms: 0,
            id: Bytes::from_static(b"e-1"),
            position: EventPosition::default(),
            source: "public.outbox".into(),
        };
        let failed = EventIdentity::of(&event).failed();
        assert_eq!(
            (&*failed.topic, &*failed.id, &*failed.lsn, &*failed.index),
            ("orders", "e-1", "0/16B3D00", "")
        );
        assert_eq!(failed.key.as_deref(), Some(&b"order-7"[..]));
        assert_eq!(failed.payload.as_deref(), Some(&b"{}"[..]));
        // The same texts the record's headers give (`header_text`, what the Redis publisher
        // reads), and the same record `of_event` gives.
        assert_eq!(
            (&failed.lsn, &failed.index),
            (
                &header_text(&event.headers, COMMIT_LSN_HEADER),
                &header_text(&event.headers, INDEX_HEADER)
            )
        );
        let whole = FailedRecord::of_event(event);
        assert_eq!((whole.lsn, whole.index), (failed.lsn, failed.index));
    }
}
