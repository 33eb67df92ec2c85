//! The Kafka producer: one delivery report per record, classified errors.
//!
//! The producer is librdkafka's (through `rdkafka`), configured for the outbox's guarantees:
//! `enable.idempotence=true` and `acks=all` (no loss, no duplicates or reordering from the
//! producer's own retries), `partitioner=murmur2_random` (the Java client's and Debezium's key
//! hashing, so an aggregate lands on the same partition whoever produced it), and
//! `message.timeout.ms=0` — retry until delivered, the same choice Kafka Connect makes for its
//! source connectors. A broker outage therefore never fails a record: it stalls the relay, which
//! stops reading WAL once `relay.max_in_flight` records are waiting (backpressure), and resumes
//! when the broker is back (exactly-once mode bounds a record's wait by its transaction's
//! timeout instead, as librdkafka requires). These are [`KafkaRole::Producer`]'s defaults:
//! user properties from `[kafka.properties]` override them, except those that would weaken
//! delivery (refused by the config), and consumer properties are not the producer's
//! (`config::kafka_client` has the rule).
//!
//! Each record carries its sequence number, lane and route as the delivery opaque (a plain
//! `usize`, no allocation); the delivery callback, on librdkafka's polling thread, pushes an
//! [`Ack`] into the [`AckQueue`] of the record's lane, whose length that relay's in-flight cap
//! bounds, and the relay takes the acks in batches. One producer serves one relay (lane 0), or
//! the shards of one process ([`KafkaSink::shared`], a lane per shard).
//!
//! A record over the producer's own `message.max.bytes` is refused by librdkafka in `produce()`
//! with the broker's error code; [`SinkError::Send`] says it was the producer's limit, and
//! [`describe_delivery_error`] says when the broker refused a record on delivery.
//!
//! # Invariants
//! - Every record handed to [`KafkaSink::send`] without error gets exactly one [`Ack`], in the
//!   queue of the handle that sent it: a shard never sees another shard's acks.
//! - A client error the producer cannot recover from fails every lane's queue.
//! - Records of one key are produced in the order `send` is called; the idempotent producer keeps
//!   that order within the partition across retries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::metadata::Metadata;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Message};

use super::ack::{Ack, AckQueue, BrokerError, DeliveryError, FailedRecord, PROGRESS_ROUTE};
use super::publisher::{Publisher, SinkError, NO_SUCH_PARTITION};
use super::silence::Silences;
use crate::config::{BrokerKind, KafkaConfig, KafkaRole};
use crate::failure::{
    kafka_error, untrusted_certificate, Class, Classify, Failure, UntrustedCertificate,
};
use crate::outbox::OutboxEvent;

/// A record the broker failed, as the relay reports it: for a size limit, which limits to
/// raise.
pub fn describe_delivery_error(e: &KafkaError) -> String {
    match e {
        KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge) => format!(
            "the broker refused the record as too large ({e}): raise the topic's \
             max.message.bytes (or the broker's message.max.bytes)"
        ),
        KafkaError::MessageProduction(RDKafkaErrorCode::UnknownPartition) => {
            NO_SUCH_PARTITION.to_owned()
        }
        KafkaError::MessageProduction(RDKafkaErrorCode::InvalidTimestamp) => format!(
            "the broker refused the record's timestamp ({e}): the row's outbox.columns.timestamp \
             lies further from the broker's clock than the topic allows \
             (message.timestamp.after.max.ms, one hour ahead by default on Kafka 4; \
             message.timestamp.before.max.ms behind)"
        ),
        e => e.to_string(),
    }
}

/// Routes delivery reports to the relay.
pub(super) struct SinkContext {
    /// One queue per relay sharing the producer, indexed by the lane in each record's opaque.
    lanes: Vec<Arc<AckQueue>>,
    /// The last client error logged and when: librdkafka repeats connection errors many times a
    /// second while a broker is down, and one line per change (or per minute) is enough.
    last_error: Mutex<HashMap<String, Instant>>,
    /// How long the brokers left this producer waiting (records handed over, delivery reports).
    silences: Silences,
}

/// How often an unchanged client error is logged again.
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(60);

impl ClientContext for SinkContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        // librdkafka's own lines duplicate what `error` reports; keep them for debugging.
        match level {
            RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical => {
                tracing::error!(target: "librdkafka", fac, "{log_message}")
            }
            _ => tracing::debug!(target: "librdkafka", fac, "{log_message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if let Some(message) = untrusted_certificate(&error, reason) {
            tracing::error!(error = %error, reason, "kafka TLS handshake failed on a certificate");
            let refused = untrusted_error(message);
            for lane in &self.lanes {
                lane.fail(DeliveryError::Broker(refused.clone()));
            }
            return;
        }
        if let Class::Fatal(failure) = kafka_error(&error) {
            if failure == Failure::Fenced {
                // librdkafka says "fenced by a newer instance" for the coordinator's abort of a
                // transaction past its timeout too (see `transaction`).
                tracing::error!(error = %error, reason, "kafka producer fenced, by a newer producer with its transactional.id or by the coordinator's abort of its transaction (the session's end says which)");
            } else {
                tracing::error!(error = %error, reason, "kafka producer error");
            }
            // Delivery reports would never come (records wait for the brokers forever): stop
            // every relay the producer serves.
            for lane in &self.lanes {
                lane.fail(error.clone().into());
            }
            return;
        }
        let key = error.to_string();
        let now = Instant::now();
        let mut last = match self.last_error.lock() {
            Ok(l) => l,
            Err(poisoned) => poisoned.into_inner(),
        };
        let repeat = last
            .get(&key)
            .is_some_and(|at| now.duration_since(*at) < ERROR_LOG_INTERVAL);
        if !repeat {
            tracing::warn!(error = %error, reason, "kafka client error (repeats are logged once a minute)");
            last.insert(key, now);
        }
    }
}

/// The error every Kafka client of the relay ends with on a TLS handshake that failed on a
/// certificate ([`untrusted_certificate`]'s `message`): exit 4.
pub fn untrusted_error(message: String) -> BrokerError {
    BrokerError {
        broker: BrokerKind::Kafka,
        class: Class::Fatal(Failure::Auth),
        message,
        refusal: None,
    }
}

/// The context of walbox's short-lived readers (the progress topic, `walbox audit`): they ask
/// librdkafka for partition ends (`enable.partition.eof`), and librdkafka reports each one as
/// an error event too. The end of a partition is how such a read finishes, not an error: it is
/// logged at debug level, as is the refusal of the group they never use
/// ([`is_unused_group_refusal`]); a TLS handshake that failed on a certificate is kept
/// ([`ReaderContext::untrusted`]: no retry can succeed, and the read stops with it); every other
/// client error is logged as a warning (the read itself returns it).
#[derive(Default)]
pub struct ReaderContext {
    /// A handshake that failed on a certificate, once one did.
    untrusted: UntrustedCertificate,
}

impl ReaderContext {
    /// The line of a TLS handshake that failed on a certificate, if one did (among the error
    /// events served so far).
    pub fn untrusted(&self) -> Option<String> {
        self.untrusted.line()
    }
}

impl ClientContext for ReaderContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if is_partition_end(&error) {
            tracing::debug!(error = %error, reason, "kafka reader reached a partition's end");
        } else if is_unused_group_refusal(&error) {
            tracing::debug!(error = %error, reason, "kafka reader's group refused; it uses none");
        } else if !self.untrusted.record(&error, reason) {
            tracing::warn!(error = %error, reason, "kafka client error");
        }
    }
}

/// Why a reader's metadata request failed ([`reader_metadata`]).
#[derive(Debug, thiserror::Error)]
pub enum ReaderError {
    /// librdkafka's error (no answer in time included).
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// A TLS handshake failed on a certificate: its one line ([`untrusted_certificate`]).
    #[error("{0}")]
    Untrusted(String),
}

impl Classify for ReaderError {
    /// What stops any client stops the reader: the certificate (exit 4), refused credentials
    /// (4) or rights (9); anything else is its caller's to retry or to give up on.
    fn failure(&self) -> Option<Failure> {
        match self {
            ReaderError::Kafka(e) => kafka_error(e).fatal(),
            ReaderError::Untrusted(_) => Some(Failure::Auth),
        }
    }
}

/// How long the first metadata request of [`reader_metadata`] waits (each further one twice as
/// long as the one before), and how long the reader waits for the client's next event after a
/// request that failed at once.
const METADATA_SLICE: Duration = Duration::from_millis(500);

/// `consumer`'s metadata for `topic` (every topic with `None`), asked again while the brokers
/// cannot be reached (a transient error: no answer, a broken connection) for at most `timeout`;
/// any other error is returned at once. Between requests the client's error events are served,
/// and a TLS handshake that failed on a certificate ends the wait at once with its line
/// ([`ReaderError::Untrusted`]): librdkafka reports the handshake as a client error only, and
/// the request itself fails as a broken connection, or not before its timeout. The first
/// request waits [`METADATA_SLICE`], each further one twice as long, so that brokers slower
/// than that are still answered. Only before partitions are assigned: the polls would take
/// records otherwise.
pub fn reader_metadata(
    consumer: &BaseConsumer<ReaderContext>,
    topic: Option<&str>,
    timeout: Duration,
) -> Result<Metadata, ReaderError> {
    let deadline = Instant::now() + timeout;
    let left = || deadline.saturating_duration_since(Instant::now());
    let mut slice = METADATA_SLICE;
    loop {
        let e = match consumer.fetch_metadata(topic, left().min(slice)) {
            Ok(md) => return Ok(md),
            Err(e) => e,
        };
        if let Some(line) = served_untrusted(consumer) {
            return Err(ReaderError::Untrusted(line));
        }
        if kafka_error(&e) != Class::Transient || left().is_zero() {
            return Err(ReaderError::Kafka(e));
        }
        if e.rdkafka_error_code() == Some(RDKafkaErrorCode::OperationTimedOut) {
            slice = slice.saturating_mul(2);
        } else {
            // A broken connection fails the request at once: wait for the client's next
            // event (its error report, say) before asking again.
            let _ = consumer.poll(left().min(METADATA_SLICE));
        }
    }
}

/// The line of a TLS handshake that failed on a certificate, if `consumer`'s client reported
/// one: its pending error events are served first.
fn served_untrusted(consumer: &BaseConsumer<ReaderContext>) -> Option<String> {
    // Each poll serves one event; the queue holds a few at most. Bounded all the same.
    for _ in 0..64 {
        if consumer.poll(Duration::ZERO).is_none() {
            break;
        }
    }
    consumer.context().untrusted()
}

impl rdkafka::consumer::ConsumerContext for ReaderContext {}

/// Whether `error` is a group coordinator's refusal that a reader which only assigns its
/// partitions (the progress reader, `walbox audit`) can ignore. librdkafka assigns only with
/// a `group.id`, and then looks that group's coordinator up (FindCoordinator, which needs
/// Describe on the group); such a reader reads from offsets it names and commits nothing, so
/// the group is never used, and the principal needs no right on it.
pub fn is_unused_group_refusal(error: &KafkaError) -> bool {
    error.rdkafka_error_code() == Some(RDKafkaErrorCode::GroupAuthorizationFailed)
}

/// Whether `error` only says that a consumer reached the end of a partition.
pub fn is_partition_end(error: &KafkaError) -> bool {
    matches!(
        error,
        KafkaError::PartitionEOF(_) | KafkaError::Global(RDKafkaErrorCode::PartitionEOF)
    )
}

impl ProducerContext for SinkContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        self.silences.answered();
        let (result, failed) = match result {
            Ok(_) => (Ok(()), None),
            Err((err, msg)) => {
                let header = |name: &str| {
                    msg.headers()
                        .and_then(|h| h.iter().find(|x| x.key == name))
                        .and_then(|x| x.value)
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                        .unwrap_or_default()
                };
                let failed = FailedRecord {
                    topic: msg.topic().to_owned(),
                    id: header("id"),
                    lsn: header(crate::outbox::COMMIT_LSN_HEADER),
                    index: header(crate::outbox::INDEX_HEADER),
                    key: msg.key().map(bytes::Bytes::copy_from_slice),
                    payload: msg.payload().map(bytes::Bytes::copy_from_slice),
                };
                (Err(err.clone().into()), Some(failed))
            }
        };
        let (seq, lane, route) = unpack_opaque(opaque);
        let Some(acks) = self.lanes.get(lane) else {
            // Every opaque is packed by a handle of this producer, with its own lane.
            tracing::error!(lane, "delivery report for an unknown lane");
            return;
        };
        acks.push(Ack {
            seq,
            route,
            result,
            failed,
        });
    }
}

/// Bits of the delivery opaque that hold the route index (the lowest bits).
const ROUTE_BITS: u32 = 10;
/// Bits above the route that hold the lane: which relay sharing the producer sent the record.
const LANE_BITS: u32 = 6;
/// Bits left for the sequence number: 2^48 events per relay and process, 44 years at 200k/s.
const SEQ_BITS: u32 = usize::BITS - ROUTE_BITS - LANE_BITS;

/// How many relays one producer can serve.
pub const MAX_LANES: usize = 1 << LANE_BITS;

const _: () = assert!(crate::config::MAX_SHARDS as usize <= MAX_LANES);
// The progress records' route is the highest the opaque holds.
const _: () = assert!(PROGRESS_ROUTE == (1 << ROUTE_BITS) - 1);
const _: () = assert!(SEQ_BITS >= 48);

fn pack_opaque(seq: u64, lane: usize, route: usize) -> usize {
    debug_assert!(route < 1 << ROUTE_BITS && lane < MAX_LANES && seq < 1 << SEQ_BITS);
    ((seq as usize) << (ROUTE_BITS + LANE_BITS))
        | ((lane & (MAX_LANES - 1)) << ROUTE_BITS)
        | (route & ((1 << ROUTE_BITS) - 1))
}

fn unpack_opaque(opaque: usize) -> (u64, usize, usize) {
    (
        (opaque >> (ROUTE_BITS + LANE_BITS)) as u64,
        (opaque >> ROUTE_BITS) & (MAX_LANES - 1),
        opaque & ((1 << ROUTE_BITS) - 1),
    )
}

/// A handle on a producer shared by several relays ([`KafkaSink::shared`]) and the queue of its
/// delivery reports.
pub type Lane = (KafkaSink, Arc<AckQueue>);

/// The producer; see the module docs. Clones share one librdkafka producer and its lane.
#[derive(Clone)]
pub struct KafkaSink {
    producer: ThreadedProducer<SinkContext>,
    /// This handle's lane: where the delivery reports of the records it sends go.
    lane: usize,
    /// Where [`Publisher::send_progress`] writes (`kafka.progress_topic`).
    progress_topic: Arc<str>,
}

impl KafkaSink {
    /// Creates the producer. Delivery reports go to `acks`.
    pub fn new(config: &KafkaConfig, acks: Arc<AckQueue>) -> Result<Self, SinkError> {
        Self::with_role(config, vec![acks], KafkaRole::Producer).map_err(SinkError::Config)
    }

    /// One producer for `relays` relays (the shards of one process): a handle per relay, with
    /// its own queue of delivery reports. A client error the producer cannot recover from fails
    /// every queue.
    pub fn shared(config: &KafkaConfig, relays: usize) -> Result<Vec<Lane>, SinkError> {
        if relays > MAX_LANES {
            return Err(SinkError::Config(KafkaError::ClientCreation(format!(
                "one kafka producer serves at most {MAX_LANES} relays, not {relays}"
            ))));
        }
        let queues: Vec<Arc<AckQueue>> = (0..relays).map(|_| Arc::default()).collect();
        let sink = Self::with_role(config, queues.clone(), KafkaRole::Producer)
            .map_err(SinkError::Config)?;
        Ok(queues
            .into_iter()
            .enumerate()
            .map(|(lane, acks)| {
                let handle = KafkaSink {
                    producer: sink.producer.clone(),
                    lane,
                    progress_topic: sink.progress_topic.clone(),
                };
                (handle, acks)
            })
            .collect())
    }

    /// Creates the transactional producer of exactly-once mode (see the `transaction` module),
    /// its `transactional.id` being `id` ([`KafkaRole::TransactionalProducer`]: a record may
    /// wait for delivery as long as its transaction may stay open, and `linger.ms` is 0, unless
    /// `[kafka.properties]` says otherwise).
    pub fn transactional(
        config: &KafkaConfig,
        acks: Arc<AckQueue>,
        id: &str,
    ) -> Result<Self, KafkaError> {
        let mut cc = config.client_config(KafkaRole::TransactionalProducer);
        cc.set("transactional.id", id);
        Self::create(cc, vec![acks], &config.progress_topic)
    }

    fn with_role(
        config: &KafkaConfig,
        lanes: Vec<Arc<AckQueue>>,
        role: KafkaRole,
    ) -> Result<Self, KafkaError> {
        Self::create(config.client_config(role), lanes, &config.progress_topic)
    }

    fn create(
        cc: ClientConfig,
        lanes: Vec<Arc<AckQueue>>,
        progress_topic: &str,
    ) -> Result<Self, KafkaError> {
        let producer = cc.create_with_context(SinkContext {
            lanes,
            last_error: Mutex::new(HashMap::new()),
            silences: Silences::default(),
        })?;
        Ok(KafkaSink {
            producer,
            lane: 0,
            progress_topic: progress_topic.into(),
        })
    }

    /// Hands one event to the producer; its [`Ack`] arrives later with `seq` and `route`.
    pub fn send(&self, event: &OutboxEvent, seq: u64, route: usize) -> Result<(), SinkError> {
        let mut headers = OwnedHeaders::new_with_capacity(event.headers.len());
        for (name, value) in &event.headers {
            headers = headers.insert(Header {
                key: name.as_str(),
                value: value.as_deref(),
            });
        }
        let mut record: BaseRecord<'_, [u8], [u8], usize> =
            BaseRecord::with_opaque_to(&event.topic, pack_opaque(seq, self.lane, route))
                .headers(headers)
                .timestamp(event.timestamp_ms);
        if let Some(k) = &event.key {
            record = record.key(&k[..]);
        }
        if let Some(v) = &event.value {
            record = record.payload(&v[..]);
        }
        if let Some(p) = event.partition {
            record = record.partition(p);
        }
        self.hand_over(record)
    }

    /// Hands one progress record for `topic` to the producer; its [`Ack`] arrives with route
    /// [`PROGRESS_ROUTE`].
    pub fn send_progress_to(&self, topic: &str, key: &str, value: &[u8]) -> Result<(), SinkError> {
        let record: BaseRecord<'_, str, [u8], usize> =
            BaseRecord::with_opaque_to(topic, pack_opaque(0, self.lane, PROGRESS_ROUTE))
                .key(key)
                .payload(value);
        self.hand_over(record)
    }

    /// Hands `record` to librdkafka; from then on it is outstanding until its delivery report.
    fn hand_over<K: rdkafka::message::ToBytes + ?Sized>(
        &self,
        record: BaseRecord<'_, K, [u8], usize>,
    ) -> Result<(), SinkError> {
        // Counted before the send: its report may come before `send` returns.
        let silences = &self.producer.context().silences;
        silences.waiting();
        let result = self.producer.send(record);
        if result.is_err() {
            silences.withdrawn();
        }
        match result {
            Ok(()) => Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                Err(SinkError::QueueFull)
            }
            Err((e, _)) => Err(SinkError::Send(e)),
        }
    }

    /// How long the brokers left this producer waiting since `from` (see [`Silences`]).
    pub fn silent_since(&self, from: Instant) -> Duration {
        self.producer.context().silences.since(from)
    }

    /// Runs `call`, a blocking request to the brokers, counted as outstanding in [`Silences`]
    /// until it returns.
    pub(super) fn waiting_on<T>(&self, call: impl FnOnce() -> T) -> T {
        let silences = &self.producer.context().silences;
        silences.waiting();
        let result = call();
        silences.answered();
        result
    }

    /// Whether the cluster knows `topic` (blocking, up to `timeout`). `Err` when the cluster
    /// could not be asked.
    pub fn topic_exists(&self, topic: &str, timeout: Duration) -> Result<bool, KafkaError> {
        let md = self
            .producer
            .client()
            .fetch_metadata(Some(topic), timeout)?;
        Ok(md
            .topics()
            .iter()
            .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty()))
    }

    /// Every topic the cluster has (with at least one partition), in one metadata request.
    pub fn existing_topics(
        &self,
        timeout: Duration,
    ) -> Result<std::collections::HashSet<String>, KafkaError> {
        let md = self.producer.client().fetch_metadata(None, timeout)?;
        Ok(md
            .topics()
            .iter()
            .filter(|t| t.error().is_none() && !t.partitions().is_empty())
            .map(|t| t.name().to_owned())
            .collect())
    }

    /// The librdkafka producer.
    pub(super) fn producer(&self) -> &ThreadedProducer<SinkContext> {
        &self.producer
    }

    /// Records handed to librdkafka and not yet reported.
    pub fn in_flight(&self) -> i32 {
        self.producer.in_flight_count()
    }

    /// Waits up to `timeout` for every record to be delivered or failed.
    pub fn flush(&self, timeout: Duration) -> bool {
        self.producer.flush(timeout).is_ok()
    }

    /// Asks the cluster for metadata: proves the brokers are reachable and credentials work.
    pub fn probe(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.producer
            .client()
            .fetch_metadata(None, timeout)
            .map(|_| ())
    }
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

impl Publisher for KafkaSink {
    fn broker(&self) -> BrokerKind {
        BrokerKind::Kafka
    }

    fn send(&self, event: &OutboxEvent, seq: u64, route: usize) -> Result<(), SinkError> {
        KafkaSink::send(self, event, seq, route)
    }

    fn send_progress(&self, key: &str, value: &[u8]) -> Result<(), SinkError> {
        self.send_progress_to(&self.progress_topic, key, value)
    }

    fn in_flight(&self) -> usize {
        usize::try_from(KafkaSink::in_flight(self)).unwrap_or(0)
    }

    fn flush(&self, timeout: Duration) -> bool {
        KafkaSink::flush(self, timeout)
    }

    fn silent_since(&self, from: Instant) -> Duration {
        KafkaSink::silent_since(self, from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opaque_packs_sequence_lane_and_route() {
        let max_seq = (1u64 << SEQ_BITS) - 1;
        for (seq, lane, route) in [
            (0, 0, 0),
            (1, MAX_LANES - 1, PROGRESS_ROUTE),
            (1 << 40, 7, 7),
            (max_seq, 63, 1000),
        ] {
            assert_eq!(
                unpack_opaque(pack_opaque(seq, lane, route)),
                (seq, lane, route)
            );
        }
    }

    /// Shards share one producer: every record's report reaches the queue of the handle that
    /// sent it, with its sequence number and route, and no other queue.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_shared_producer_reports_each_record_to_its_own_lane() {
        use rdkafka::mocking::MockCluster;
        use rdkafka::producer::DefaultProducerContext;
        let cluster = MockCluster::<DefaultProducerContext>::new(1).unwrap();
        cluster.create_topic("orders", 2, 1).unwrap();
        let config = KafkaConfig::for_brokers(cluster.bootstrap_servers());
        let (sinks, lanes): (Vec<KafkaSink>, Vec<Arc<AckQueue>>) =
            KafkaSink::shared(&config, 3).unwrap().into_iter().unzip();
        const PER_LANE: u64 = 50;
        for (lane, sink) in sinks.iter().enumerate() {
            for i in 0..PER_LANE {
                let event = OutboxEvent {
                    topic: "orders".into(),
                    partition: None,
                    key: Some(bytes::Bytes::from(format!("agg-{i}"))),
                    value: Some(bytes::Bytes::from_static(b"{}")),
                    headers: Default::default(),
                    timestamp_ms: 0,
                    id: bytes::Bytes::from(format!("{lane}-{i}")),
                    position: Default::default(),
                    source: "public.outbox".into(),
                };
                // Lanes interleave their sequence numbers, so a report in the wrong queue shows.
                sink.send(&event, i * 3 + lane as u64, lane + 1).unwrap();
            }
        }
        for (lane, queue) in lanes.iter().enumerate() {
            let mut acks = Vec::new();
            while (acks.len() as u64) < PER_LANE {
                tokio::time::timeout(Duration::from_secs(30), queue.wait())
                    .await
                    .expect("delivery reports within 30 s");
                let mut batch = Vec::new();
                queue.drain_into(&mut batch);
                acks.extend(batch);
            }
            let mut seqs: Vec<u64> = acks.iter().map(|a| a.seq).collect();
            seqs.sort_unstable();
            let expected: Vec<u64> = (0..PER_LANE).map(|i| i * 3 + lane as u64).collect();
            assert_eq!(seqs, expected, "lane {lane} got exactly its own records");
            assert!(acks.iter().all(|a| a.result.is_ok() && a.route == lane + 1));
        }
        assert!(sinks[0].flush(Duration::from_secs(10)));
        for queue in &lanes {
            let mut rest = Vec::new();
            queue.drain_into(&mut rest);
            assert!(
                rest.is_empty(),
                "no report arrived twice or in another lane"
            );
        }
    }

    /// A client error the producer cannot recover from reaches every shard it serves; one it
    /// recovers from reaches none.
    #[test]
    fn a_fatal_client_error_fails_every_lane() {
        let lanes: Vec<Arc<AckQueue>> = (0..3).map(|_| Arc::default()).collect();
        let context = SinkContext {
            lanes: lanes.clone(),
            last_error: Mutex::new(HashMap::new()),
            silences: Silences::default(),
        };
        context.error(
            KafkaError::MessageProduction(RDKafkaErrorCode::BrokerTransportFailure),
            "transient",
        );
        assert!(lanes.iter().all(|l| l.fatal().is_none()));
        context.error(
            KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed),
            "fatal",
        );
        assert!(lanes.iter().all(|l| l.fatal().is_some()));
    }

    #[test]
    fn one_producer_serves_at_most_max_lanes_relays() {
        let e = KafkaSink::shared(&KafkaConfig::for_brokers("127.0.0.1:9"), MAX_LANES + 1)
            .err()
            .expect("too many lanes are refused");
        assert!(e.to_string().contains("at most 64 relays"), "{e}");
    }

    #[test]
    fn size_refusals_name_the_limit_that_refused() {
        let too_large = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        let producer = SinkError::Send(too_large.clone()).to_string();
        assert!(
            producer.contains("the producer's message.max.bytes") && !producer.contains("Broker:"),
            "{producer}"
        );
        let broker = describe_delivery_error(&too_large);
        assert!(
            broker.contains("the broker refused") && broker.contains("max.message.bytes"),
            "{broker}"
        );
        let partition = KafkaError::MessageProduction(RDKafkaErrorCode::UnknownPartition);
        for refused in [
            SinkError::Send(partition.clone()).to_string(),
            describe_delivery_error(&partition),
        ] {
            assert!(
                refused.contains("no partition") && refused.contains("outbox.columns.partition"),
                "{refused}"
            );
        }
        let other = KafkaError::MessageProduction(RDKafkaErrorCode::UnknownTopic);
        assert!(SinkError::Send(other.clone())
            .to_string()
            .starts_with("kafka refused the record: "));
        assert_eq!(describe_delivery_error(&other), other.to_string());
    }
}
