//! A Kafka-protocol broker for the demo, the tests and the benchmarks, and a consumer that reads
//! back what walbox produced.
//!
//! By default the broker is librdkafka's mock cluster (`rdkafka::mocking::MockCluster`): real
//! Kafka protocol on real TCP sockets, in this process, with fault injection (broker down/up,
//! per-request errors, round-trip delay). An external cluster can be used instead by giving its
//! bootstrap servers; topics are then created through the admin API.
//!
//! The mock cluster lives as long as the [`Broker`] and is not `Send`: keep it on the thread
//! (or in the task) that created it.

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::{Offset, TopicPartitionList};

/// A Kafka-protocol cluster: the in-process mock or an external one.
pub enum Broker {
    /// librdkafka's mock cluster.
    Mock(MockCluster<'static, DefaultProducerContext>),
    /// An external cluster, by bootstrap servers.
    External(String),
}

/// Held while a mock cluster binds its brokers' ports, and while one takes a broker down or up
/// ([`Broker::set_broker_up`]). Taking a broker down closes its listener and binds the same
/// port again at once; a cluster created meanwhile in the same process can be handed that
/// port by the kernel, and librdkafka then aborts the process ("Failed to create mock broker
/// listener").
static MOCK_PORTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Broker {
    /// A mock cluster of `brokers` brokers, with walbox's progress topic.
    pub fn mock(brokers: i32) -> Result<Broker, KafkaError> {
        let cluster = {
            let _ports = MOCK_PORTS.lock().unwrap_or_else(|p| p.into_inner());
            MockCluster::new(brokers)?
        };
        let broker = Broker::Mock(cluster);
        broker.create_topic(crate::config::DEFAULT_PROGRESS_TOPIC, 1)?;
        Ok(broker)
    }

    /// Takes mock broker `id` down (`up = false`: connections closed, new ones refused) or
    /// brings it back, never while another mock cluster binds its ports (see `MOCK_PORTS`).
    /// `None` for an external cluster.
    pub fn set_broker_up(&self, id: i32, up: bool) -> Option<Result<(), KafkaError>> {
        let mock = self.mock_cluster()?;
        let _ports = MOCK_PORTS.lock().unwrap_or_else(|p| p.into_inner());
        Some(if up {
            mock.broker_up(id)
        } else {
            mock.broker_down(id)
        })
    }

    /// The external cluster named by environment variable `var` when it is set, else a mock
    /// cluster of `brokers` brokers; either with walbox's progress topic.
    pub fn from_env_or_mock(var: &str, brokers: i32) -> Result<Broker, KafkaError> {
        match std::env::var(var) {
            Ok(b) if !b.trim().is_empty() => {
                let broker = Broker::External(b);
                broker.create_topic(crate::config::DEFAULT_PROGRESS_TOPIC, 1)?;
                Ok(broker)
            }
            _ => Broker::mock(brokers),
        }
    }

    /// `bootstrap.servers` for clients.
    pub fn bootstrap_servers(&self) -> String {
        match self {
            Broker::Mock(m) => m.bootstrap_servers(),
            Broker::External(b) => b.clone(),
        }
    }

    /// The mock cluster, for fault injection (`None` for an external cluster).
    pub fn mock_cluster(&self) -> Option<&MockCluster<'static, DefaultProducerContext>> {
        match self {
            Broker::Mock(m) => Some(m),
            Broker::External(_) => None,
        }
    }

    /// Creates a topic (an existing one is fine).
    pub fn create_topic(&self, name: &str, partitions: i32) -> Result<(), KafkaError> {
        self.create_topic_with(name, partitions, &[])
    }

    /// Creates a topic with topic `configs` such as `("cleanup.policy", "compact")` (an
    /// existing one is fine; the mock cluster ignores them).
    pub fn create_topic_with(
        &self,
        name: &str,
        partitions: i32,
        configs: &[(&str, &str)],
    ) -> Result<(), KafkaError> {
        match self {
            Broker::Mock(m) => m.create_topic(name, partitions, 1),
            Broker::External(b) => {
                let admin: AdminClient<DefaultClientContext> =
                    ClientConfig::new().set("bootstrap.servers", b).create()?;
                let topic = configs.iter().fold(
                    NewTopic::new(name, partitions, TopicReplication::Fixed(-1)),
                    |topic, (k, v)| topic.set(k, v),
                );
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| KafkaError::AdminOpCreation(e.to_string()))?;
                let results = rt.block_on(admin.create_topics([&topic], &AdminOptions::new()))?;
                for r in results {
                    if let Err((_, code)) = r {
                        if code != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists {
                            return Err(KafkaError::AdminOp(code));
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

/// One record as a consumer reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumedRecord {
    /// The topic it was read from.
    pub topic: String,
    /// The partition it was read from.
    pub partition: i32,
    /// Its offset in that partition.
    pub offset: i64,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub payload: Option<Vec<u8>>,
    /// Headers in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The record's timestamp, in milliseconds since the epoch, when it has one.
    pub timestamp_ms: Option<i64>,
}

impl ConsumedRecord {
    /// The first header called `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The first header called `name`, as UTF-8 text.
    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.header(name).and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// Reads every partition of `topics` from the beginning until `done` says enough was read or
/// `timeout` passes; returns what was read, in per-partition order.
pub fn read_topics(
    bootstrap: &str,
    topics: &[&str],
    timeout: Duration,
    done: impl FnMut(&[ConsumedRecord]) -> bool,
) -> Result<Vec<ConsumedRecord>, KafkaError> {
    let mut reader = TopicReader::new(bootstrap, topics, timeout)?;
    reader.poll_until(timeout, done);
    Ok(reader.records)
}

/// An incremental reader of every partition of some topics, from the beginning.
pub struct TopicReader {
    consumer: BaseConsumer,
    partitions: Vec<(String, i32)>,
    /// Next offset to read, per entry of `partitions`.
    next: Vec<i64>,
    /// Everything read so far, in per-partition order.
    pub records: Vec<ConsumedRecord>,
}

impl TopicReader {
    /// Assigns every partition of `topics` (waiting up to `timeout` for them to exist); reads
    /// `read_committed`, librdkafka's default: records of aborted or open Kafka transactions are
    /// never delivered (on a broker that writes transaction markers).
    pub fn new(bootstrap: &str, topics: &[&str], timeout: Duration) -> Result<Self, KafkaError> {
        Self::with_isolation(bootstrap, topics, timeout, "read_committed")
    }

    /// [`TopicReader::new`], reading `read_uncommitted`: the records of open and aborted Kafka
    /// transactions too.
    pub fn read_uncommitted(
        bootstrap: &str,
        topics: &[&str],
        timeout: Duration,
    ) -> Result<Self, KafkaError> {
        Self::with_isolation(bootstrap, topics, timeout, "read_uncommitted")
    }

    fn with_isolation(
        bootstrap: &str,
        topics: &[&str],
        timeout: Duration,
        isolation: &str,
    ) -> Result<Self, KafkaError> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("isolation.level", isolation)
            .set("group.id", "walbox-reader")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .create()?;
        let deadline = Instant::now() + timeout;
        let mut tpl = TopicPartitionList::new();
        let mut partitions = Vec::new();
        for topic in topics {
            let count = loop {
                let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(5))?;
                let n = md
                    .topics()
                    .iter()
                    .find(|t| t.name() == *topic)
                    .map(|t| t.partitions().len())
                    .unwrap_or(0);
                if n > 0 || Instant::now() >= deadline {
                    break n;
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            for p in 0..count as i32 {
                tpl.add_partition_offset(topic, p, Offset::Beginning)?;
                partitions.push(((*topic).to_owned(), p));
            }
        }
        consumer.assign(&tpl)?;
        let next = vec![0; partitions.len()];
        Ok(TopicReader {
            consumer,
            partitions,
            next,
            records: Vec::new(),
        })
    }

    /// Waits up to 100 ms for a record, then takes every record already fetched (up to a
    /// bound), so that callers checking a condition do so once per batch, not per record.
    fn poll_once(&mut self) {
        let mut wait = Duration::from_millis(100);
        for _ in 0..10_000 {
            if !self.poll_one(wait) {
                return;
            }
            wait = Duration::ZERO;
        }
    }

    /// One record, if one arrives within `wait`; whether one did.
    fn poll_one(&mut self, wait: Duration) -> bool {
        match self.consumer.poll(wait) {
            Some(Ok(m)) => {
                let rec = ConsumedRecord {
                    topic: m.topic().to_owned(),
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    payload: m.payload().map(<[u8]>::to_vec),
                    headers: m
                        .headers()
                        .map(|h| {
                            h.iter()
                                .map(|x| (x.key.to_owned(), x.value.unwrap_or_default().to_vec()))
                                .collect()
                        })
                        .unwrap_or_default(),
                    timestamp_ms: m.timestamp().to_millis(),
                };
                if let Some(i) = self
                    .partitions
                    .iter()
                    .position(|(t, p)| *t == rec.topic && *p == rec.partition)
                {
                    self.next[i] = rec.offset + 1;
                }
                self.records.push(rec);
                true
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "consumer error");
                false
            }
            None => false,
        }
    }

    /// Polls until `done(records)` or `timeout`; returns whether `done` was reached.
    pub fn poll_until(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&[ConsumedRecord]) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if done(&self.records) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            self.poll_once();
        }
    }

    /// Reads everything the partitions hold right now: up to their high watermarks, or, for a
    /// `read_committed` reader, their last stable offsets (ListOffsets answers it so): records
    /// behind any producer's open transaction are not read.
    pub fn read_to_end(&mut self, timeout: Duration) -> Result<(), KafkaError> {
        let mut high = Vec::with_capacity(self.partitions.len());
        for (t, p) in &self.partitions {
            high.push(
                self.consumer
                    .fetch_watermarks(t, *p, Duration::from_secs(5))?
                    .1,
            );
        }
        let deadline = Instant::now() + timeout;
        while self.next.iter().zip(&high).any(|(n, h)| n < h) {
            if Instant::now() >= deadline {
                return Err(KafkaError::MessageConsumption(
                    rdkafka::types::RDKafkaErrorCode::OperationTimedOut,
                ));
            }
            self.poll_once();
            // Transaction markers take offsets but are never delivered: the consumer's
            // position passes them.
            if let Ok(positions) = self.consumer.position() {
                for e in positions.elements() {
                    if let (Offset::Offset(at), Some(i)) = (
                        e.offset(),
                        self.partitions
                            .iter()
                            .position(|(t, p)| t == e.topic() && *p == e.partition()),
                    ) {
                        self.next[i] = self.next[i].max(at);
                    }
                }
            }
        }
        Ok(())
    }
}
