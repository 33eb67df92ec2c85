//! Every Kafka client walbox creates is configured here, from `kafka.brokers`, the user's
//! `[kafka.properties]` and the client's [`KafkaRole`]: one rule for which properties each
//! client gets ([`client_config`]).
//!
//! The rule, in the order the properties are set (a later one wins):
//! 1. the role's defaults: walbox's tuning, which the user may change ([`KafkaRole`] lists
//!    them; [`EAGER_CONNECTIONS`] is every role's);
//! 2. the user's properties that librdkafka applies to the role's kind of client: those it
//!    applies to every client (the connection, `security.protocol`, SASL, TLS, timeouts,
//!    `client.id`, `debug`) go to every role; producer properties (`linger.ms`,
//!    `compression.type`, `transaction.timeout.ms`, … : [`PRODUCER_PROPERTIES`]) only to the
//!    producers; consumer properties (`fetch.min.bytes`, `auto.offset.reset`, … :
//!    [`CONSUMER_PROPERTIES`]) only to the consumers; an admin client (a producer handle in
//!    librdkafka that produces nothing) gets neither;
//! 3. what the role's correctness rests on, which no property changes (the readers' group,
//!    offsets and isolation level, the dead-letter producer's acknowledgements), and
//!    `bootstrap.servers` from `kafka.brokers`.
//!
//! The scopes are librdkafka's own (CONFIGURATION.md's C/P column, aliases included), so no
//! client receives a property librdkafka would ignore with a warning. What that means for each
//! command: `walbox run`'s producer properties reach its producers, its consumer properties
//! (rarely set) the progress reader and `walbox audit`'s reader; `walbox inbox`'s consumer
//! properties reach its consumer, its producer properties the dead-letter producer (when a
//! policy uses the dead-letter topic). Settings that belong to one client, not to a role
//! (`transactional.id`, the inbox's `group.id` and `group.instance.id`, `walbox check`'s
//! statistics interval, the watermark reader's `isolation.level`), are set by its creator on
//! the configuration made here.
//!
//! Invariants: nothing here logs a property's value (a left-out property is logged at debug
//! level by name only); the properties a configuration may hold at all (the ones that weaken
//! delivery or that other keys set are refused) are `kafka.rs`'s and `inbox/config.rs`'s
//! validation, not this file's.

use std::collections::BTreeMap;

use rdkafka::ClientConfig;

use super::kafka::{KafkaConfig, TRANSACTION_TIMEOUT_MS};

/// What a Kafka client is for; it decides the properties it gets (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaRole {
    /// The relay's producer (and `walbox check`'s probe, `walbox republish`, the progress
    /// reset record): idempotent, `acks=all`, keys partitioned as the Java client does
    /// (`murmur2_random`), records never expire in the queue (`message.timeout.ms=0`), 5 ms
    /// linger, no topic created by producing to it.
    Producer,
    /// Exactly-once mode's producer: [`KafkaRole::Producer`]'s defaults, `linger.ms=0` (a
    /// commit waits for every record), and `message.timeout.ms` equal to
    /// `transaction.timeout.ms` (librdkafka requires it no longer), 60 s unless set.
    TransactionalProducer,
    /// `walbox inbox`'s dead-letter producer: idempotent and `acks=all` whatever the properties
    /// say (they are the consumer's, which its validation lets set `acks`).
    DeadLetterProducer,
    /// Reads the progress topic (`sink::progress`): committed records only, to the end of each
    /// partition, without a group's offsets.
    ProgressReader,
    /// Reads the relay's topics for `walbox audit`: as the progress reader, quieter.
    AuditReader,
    /// `walbox inbox`'s consumer: offsets stored and committed by walbox after the PostgreSQL
    /// transaction, committed records only, from the earliest offset when the group has none.
    InboxConsumer,
    /// The admin API: topic creation, DescribeConfigs (`walbox check`, the inbox's retention
    /// check).
    Admin,
}

/// The kind of librdkafka client a role is, which decides the user properties it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Producer,
    Consumer,
    Admin,
}

/// How every walbox client connects: to each broker as soon as it learns of it. librdkafka
/// otherwise connects only when it needs a broker, and drops its bootstrap connection once the
/// first metadata names the brokers; a request that then finds no broker up waits for a retry
/// timer. For an idempotent or transactional producer that is its producer id: 50 or 500 ms
/// before the first event, and before `init_transactions` returns (6-26 ms measured when
/// connected eagerly).
pub const EAGER_CONNECTIONS: (&str, &str) = ("enable.sparse.connections", "false");

/// The relay producer's defaults, under the user's properties.
const PRODUCER_DEFAULTS: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("partitioner", "murmur2_random"),
    ("message.timeout.ms", "0"),
    ("linger.ms", "5"),
    ("allow.auto.create.topics", "false"),
    ("client.id", "walbox"),
];

/// The inbox consumer's defaults, under the user's properties (its validation refuses values
/// of the first four that would weaken the guarantees).
const INBOX_CONSUMER_DEFAULTS: &[(&str, &str)] = &[
    ("enable.auto.commit", "false"),
    ("enable.auto.offset.store", "false"),
    ("auto.offset.reset", "earliest"),
    ("isolation.level", "read_committed"),
    ("enable.partition.eof", "false"),
    // Bound the wait for the re-fetch after a paused partition resumes, when the fetcher was
    // waiting at the end of the log or backing off (librdkafka: 500 ms, 1 s, 500 ms): with
    // librdkafka's defaults a pause costs up to a second of that partition's throughput.
    ("fetch.wait.max.ms", "100"),
    ("fetch.queue.backoff.ms", "10"),
    ("fetch.error.backoff.ms", "10"),
    ("statistics.interval.ms", "5000"),
    ("client.id", "walbox-inbox"),
    // A rebalance moves only the partitions that change owner; the others keep being processed.
    ("partition.assignment.strategy", "cooperative-sticky"),
];

/// The progress reader's settings, over the user's properties.
const PROGRESS_READER: &[(&str, &str)] = &[
    ("group.id", "walbox-progress-reader"),
    ("enable.auto.commit", "false"),
    // The end of a partition is where librdkafka says it is: in exactly-once mode the last
    // offsets are transaction markers, which are never delivered as records.
    ("enable.partition.eof", "true"),
    ("isolation.level", "read_committed"),
    // librdkafka learns it reached the end only from a fetch sent at the end, which the broker
    // holds `fetch.wait.max.ms` (500 ms by default) for new records: start-up would wait that
    // long per partition with a committed transaction's marker at its end.
    ("fetch.wait.max.ms", "10"),
    // A step stops reading at its end; what librdkafka fetched beyond it is dropped.
    ("queued.min.messages", "10000"),
    ("allow.auto.create.topics", "false"),
];

/// The audit reader's settings, over the user's properties.
const AUDIT_READER: &[(&str, &str)] = &[
    ("group.id", "walbox-audit"),
    ("enable.auto.commit", "false"),
    ("enable.auto.offset.store", "false"),
    ("isolation.level", "read_committed"),
    ("enable.partition.eof", "true"),
    ("log_level", "3"),
];

/// The dead-letter producer's settings, over the user's properties.
const DEAD_LETTER_PRODUCER: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("client.id", "walbox-inbox-dlq"),
];

/// The properties librdkafka applies to producers only (CONFIGURATION.md, "P"; global and
/// topic properties, aliases included).
pub const PRODUCER_PROPERTIES: &[&str] = &[
    "acks",
    "batch.num.messages",
    "batch.size",
    "compression.codec",
    "compression.level",
    "compression.type",
    "delivery.report.only.error",
    "delivery.timeout.ms",
    "enable.gapless.guarantee",
    "enable.idempotence",
    "linger.ms",
    "message.send.max.retries",
    "message.timeout.ms",
    "partitioner",
    "produce.offset.report",
    "queue.buffering.backpressure.threshold",
    "queue.buffering.max.kbytes",
    "queue.buffering.max.messages",
    "queue.buffering.max.ms",
    "queuing.strategy",
    "request.required.acks",
    "request.timeout.ms",
    "retries",
    "sticky.partitioning.linger.ms",
    "transaction.timeout.ms",
    "transactional.id",
];

/// The properties librdkafka applies to consumers only (CONFIGURATION.md, "C"; global and
/// topic properties, aliases included).
pub const CONSUMER_PROPERTIES: &[&str] = &[
    "auto.commit.enable",
    "auto.commit.interval.ms",
    "auto.offset.reset",
    "check.crcs",
    "consume.callback.max.messages",
    "coordinator.query.interval.ms",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.partition.eof",
    "fetch.error.backoff.ms",
    "fetch.max.bytes",
    "fetch.message.max.bytes",
    "fetch.min.bytes",
    "fetch.queue.backoff.ms",
    "fetch.wait.max.ms",
    "group.id",
    "group.instance.id",
    "group.protocol",
    "group.protocol.type",
    "group.remote.assignor",
    "heartbeat.interval.ms",
    "isolation.level",
    "max.partition.fetch.bytes",
    "max.poll.interval.ms",
    "offset.store.method",
    "offset.store.path",
    "offset.store.sync.interval.ms",
    "partition.assignment.strategy",
    "queued.max.messages.kbytes",
    "queued.min.messages",
    "session.timeout.ms",
];

impl KafkaRole {
    fn kind(self) -> Kind {
        match self {
            KafkaRole::Producer | KafkaRole::TransactionalProducer => Kind::Producer,
            KafkaRole::DeadLetterProducer => Kind::Producer,
            KafkaRole::ProgressReader | KafkaRole::AuditReader | KafkaRole::InboxConsumer => {
                Kind::Consumer
            }
            KafkaRole::Admin => Kind::Admin,
        }
    }

    /// Step 1: the role's defaults; `properties` gives the transaction timeout.
    fn defaults(self, properties: &BTreeMap<String, String>) -> Vec<(&'static str, String)> {
        let fixed: &[(&'static str, &'static str)] = match self {
            KafkaRole::Producer | KafkaRole::TransactionalProducer => PRODUCER_DEFAULTS,
            KafkaRole::InboxConsumer => INBOX_CONSUMER_DEFAULTS,
            _ => &[],
        };
        let mut out: Vec<(&'static str, String)> = std::iter::once(EAGER_CONNECTIONS)
            .chain(fixed.iter().copied())
            .map(|(k, v)| (k, v.to_owned()))
            .collect();
        if self == KafkaRole::TransactionalProducer {
            let timeout = properties
                .get("transaction.timeout.ms")
                .map_or(TRANSACTION_TIMEOUT_MS, String::as_str);
            out.push(("transaction.timeout.ms", timeout.to_owned()));
            out.push(("message.timeout.ms", timeout.to_owned()));
            // A commit waits for every record's acknowledgement, the progress record last and
            // alone: lingering only delays it (a transaction's records are handed over
            // together and batch without it).
            out.push(("linger.ms", "0".to_owned()));
        }
        out
    }

    /// Step 3: what no property changes.
    fn fixed(self) -> &'static [(&'static str, &'static str)] {
        match self {
            KafkaRole::ProgressReader => PROGRESS_READER,
            KafkaRole::AuditReader => AUDIT_READER,
            KafkaRole::DeadLetterProducer => DEAD_LETTER_PRODUCER,
            _ => &[],
        }
    }

    /// Whether librdkafka applies the user property `name` to this role's kind of client.
    pub fn takes(self, name: &str) -> bool {
        match self.kind() {
            Kind::Producer => !CONSUMER_PROPERTIES.contains(&name),
            Kind::Consumer => !PRODUCER_PROPERTIES.contains(&name),
            Kind::Admin => {
                !CONSUMER_PROPERTIES.contains(&name) && !PRODUCER_PROPERTIES.contains(&name)
            }
        }
    }
}

/// The configuration of a client in `role` of the cluster at `brokers`, with the user's
/// `properties` (see the module docs for the rule).
pub fn client_config(
    brokers: &str,
    properties: &BTreeMap<String, String>,
    role: KafkaRole,
) -> ClientConfig {
    let mut cc = ClientConfig::new();
    for (k, v) in role.defaults(properties) {
        cc.set(k, v);
    }
    let (taken, left): (Vec<_>, Vec<_>) = properties.iter().partition(|(k, _)| role.takes(k));
    for (k, v) in taken {
        cc.set(k, v);
    }
    if !left.is_empty() {
        let names: Vec<&str> = left.iter().map(|(k, _)| k.as_str()).collect();
        tracing::debug!(?role, properties = ?names, "kafka properties this client does not take");
    }
    for (k, v) in role.fixed() {
        cc.set(*k, *v);
    }
    cc.set("bootstrap.servers", brokers);
    cc
}

impl KafkaConfig {
    /// The configuration of a client in `role` of the relay's cluster ([`client_config`]).
    pub fn client_config(&self, role: KafkaRole) -> ClientConfig {
        client_config(&self.brokers, &self.properties, role)
    }
}

#[cfg(test)]
#[path = "kafka_client_tests.rs"]
mod tests;
