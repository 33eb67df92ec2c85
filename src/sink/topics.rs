//! Which topics exist, and creating the missing ones when `kafka.create_topics` is on.
//!
//! walbox never relies on the broker's automatic topic creation: the producer runs with
//! `allow.auto.create.topics=false`. Topics the config names outright (templates without
//! variables, fallback and dead-letter topics) are resolved when a session starts, with one
//! metadata request, before any WAL is read. A topic rendered from row values is looked up the
//! first time an event goes to it. A missing topic is created through the admin API
//! (`kafka.create_topics`, with `topic_partitions` and `topic_replication_factor`); otherwise
//! the event is invalid and follows its table's `on_invalid` policy.
//!
//! # Invariants
//! - A topic found (or created) is remembered for the life of the process: the hot path asks
//!   nothing.
//! - A failed lookup is remembered too, so the WAL path pays for at most one lookup per topic
//!   per [`RETRY_AFTER`]: a topic found missing stays missing for that long (creating it takes
//!   effect within it); when the cluster cannot be asked (brokers down), events are produced
//!   without asking for that long, librdkafka holds them until the brokers answer, and the
//!   relay's backpressure applies.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;

use crate::config::{KafkaConfig, KafkaRole};
use crate::failure::{Classify, Failure};
use crate::sink::kafka::KafkaSink;

/// How long one metadata lookup may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a failed lookup is remembered; see the module docs.
pub const RETRY_AFTER: Duration = Duration::from_secs(10);

/// The configuration walbox creates the progress topic with (one partition). Compacted: one
/// record per slot is all that matters. Compaction never touches a topic's active segment,
/// and in exactly-once mode each Kafka transaction adds a record and a commit marker (about
/// 450 bytes, ~45 kB/s per slot at the default interval), so the segments roll early
/// (10 minutes or 16 MiB): the uncompacted end stays a few minutes long, and start-up reads
/// back through at most that much to an idle slot's record. The cleaner takes a segment once
/// a tenth of the topic is uncompacted: the compacted part is tiny (one record per slot), so
/// cleaning is cheap and starts soon. Commit markers (and tombstones, which walbox never
/// writes) outlive compaction by `delete.retention.ms`: 10 minutes instead of a day, so a day
/// of markers does not pile up in front of an idle slot's record. `walbox check` warns about a
/// progress topic whose settings let the uncompacted end grow (see `preflight::kafka`).
pub const PROGRESS_TOPIC_CONFIG: &[(&str, &str)] = &[
    ("cleanup.policy", "compact"),
    ("segment.ms", "600000"),
    ("segment.bytes", "16777216"),
    ("min.cleanable.dirty.ratio", "0.1"),
    ("delete.retention.ms", "600000"),
];

/// The topic cache; see the module docs.
pub struct Topics {
    known: HashSet<String>,
    /// Topics found missing or that could not be created: when, and why.
    failed: HashMap<String, (Instant, TopicError)>,
    /// When the cluster last could not be asked.
    unreachable_at: Option<Instant>,
    /// [`LOOKUP_TIMEOUT`] and [`RETRY_AFTER`] (shorter in tests).
    lookup_timeout: Duration,
    retry_after: Duration,
    /// Metadata requests made.
    lookups: u64,
    create: Option<(i32, i32)>,
    admin: Option<Arc<AdminClient<DefaultClientContext>>>,
}

/// A topic that does not exist and may not be created.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TopicError {
    /// Missing, and `kafka.create_topics` is off.
    #[error("topic {0:?} does not exist (create it, or set kafka.create_topics = true)")]
    Missing(String),
    /// Creation failed.
    #[error("cannot create topic {0:?}: {1}")]
    Create(String, String),
}

impl Classify for TopicError {
    /// The event cannot go to its topic; its route's `on_invalid` policy decides what follows.
    fn failure(&self) -> Option<Failure> {
        Some(Failure::EventRejected)
    }
}

impl Topics {
    /// An empty cache for `config`.
    pub fn new(config: &KafkaConfig) -> Result<Self, rdkafka::error::KafkaError> {
        let admin = match config.create_topics {
            None => None,
            Some(_) => Some(config.client_config(KafkaRole::Admin).create()?),
        };
        Ok(Topics::over(admin.map(Arc::new), config.create_topics))
    }

    /// An empty cache over the same admin client (one client for the shards of a process).
    pub fn sharing(&self) -> Self {
        Topics::over(self.admin.clone(), self.create)
    }

    fn over(
        admin: Option<Arc<AdminClient<DefaultClientContext>>>,
        create: Option<(i32, i32)>,
    ) -> Self {
        Topics {
            known: HashSet::new(),
            failed: HashMap::new(),
            unreachable_at: None,
            lookup_timeout: LOOKUP_TIMEOUT,
            retry_after: RETRY_AFTER,
            lookups: 0,
            create,
            admin,
        }
    }

    /// Resolves `topics` (those the config names) with one metadata request: the ones that
    /// exist are remembered, missing ones are created when `kafka.create_topics` is on, and
    /// the rest are remembered as missing (with a warning: their events follow `on_invalid`).
    /// When the cluster cannot be asked, nothing is remembered and each topic is looked up
    /// when its first event comes.
    pub async fn resolve(&mut self, sink: &KafkaSink, topics: &[String]) {
        let unknown: Vec<String> = topics
            .iter()
            .filter(|t| !self.known.contains(*t))
            .cloned()
            .collect();
        if unknown.is_empty() {
            return;
        }
        let probe = sink.clone();
        let timeout = self.lookup_timeout;
        self.lookups += 1;
        let existing = tokio::task::spawn_blocking(move || probe.existing_topics(timeout)).await;
        let existing = match existing {
            Ok(Ok(existing)) => existing,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot list the topics; each is looked up when first used");
                return;
            }
            Err(_) => return,
        };
        for topic in unknown {
            if existing.contains(&topic) {
                self.known.insert(topic);
                continue;
            }
            let created = self.create_missing(&topic, None).await;
            if let Err(e) = self.remember(&topic, created) {
                tracing::warn!(error = %e, "a topic named in the config is missing; events for it follow their table's on_invalid policy");
            }
        }
    }

    /// Makes sure `topic` exists, or says why it cannot be used.
    pub async fn ensure(&mut self, sink: &KafkaSink, topic: &str) -> Result<(), TopicError> {
        self.ensure_as(sink, topic, None).await
    }

    /// Makes sure the progress topic exists; when walbox creates it, it has one partition and
    /// [`PROGRESS_TOPIC_CONFIG`].
    pub async fn ensure_progress(
        &mut self,
        sink: &KafkaSink,
        topic: &str,
    ) -> Result<(), TopicError> {
        self.ensure_as(sink, topic, Some(1)).await
    }

    /// [`Topics::ensure`]; `compacted_partitions` creates a topic of that many partitions
    /// with [`PROGRESS_TOPIC_CONFIG`] instead of one with the configured defaults.
    async fn ensure_as(
        &mut self,
        sink: &KafkaSink,
        topic: &str,
        compacted_partitions: Option<i32>,
    ) -> Result<(), TopicError> {
        if let Some((at, error)) = self.failed.get(topic) {
            if at.elapsed() < self.retry_after {
                return Err(error.clone());
            }
        }
        let result = self.lookup(sink, topic, compacted_partitions).await;
        self.remember(topic, result)
    }

    /// Remembers the outcome of looking `topic` up (a failure for [`Topics::retry_after`]).
    fn remember(&mut self, topic: &str, result: Result<(), TopicError>) -> Result<(), TopicError> {
        match &result {
            Ok(()) => {
                self.failed.remove(topic);
            }
            Err(e) => {
                self.failed
                    .insert(topic.to_owned(), (Instant::now(), e.clone()));
            }
        }
        result
    }

    /// Looks `topic` up (and creates it when allowed); [`Topics::ensure_as`] remembers the
    /// outcome.
    async fn lookup(
        &mut self,
        sink: &KafkaSink,
        topic: &str,
        compacted_partitions: Option<i32>,
    ) -> Result<(), TopicError> {
        if self.known.contains(topic) {
            return Ok(());
        }
        if self
            .unreachable_at
            .is_some_and(|at| at.elapsed() < self.retry_after)
        {
            return Ok(());
        }
        let probe = sink.clone();
        let name = topic.to_owned();
        let timeout = self.lookup_timeout;
        self.lookups += 1;
        tracing::debug!(topic, "looking the topic up");
        let exists = tokio::task::spawn_blocking(move || probe.topic_exists(&name, timeout))
            .await
            .unwrap_or(Ok(false));
        match exists {
            Ok(true) => {
                self.known.insert(topic.to_owned());
                Ok(())
            }
            Err(e) => {
                tracing::debug!(topic, error = %e, "cannot look the topic up; producing anyway");
                self.unreachable_at = Some(Instant::now());
                Ok(())
            }
            Ok(false) => self.create_missing(topic, compacted_partitions).await,
        }
    }

    /// Creates the missing `topic` when `kafka.create_topics` is on (with
    /// [`PROGRESS_TOPIC_CONFIG`] and `compacted_partitions` partitions, when given); otherwise
    /// says it is missing.
    async fn create_missing(
        &mut self,
        topic: &str,
        compacted_partitions: Option<i32>,
    ) -> Result<(), TopicError> {
        let (Some(admin), Some((partitions, replication))) = (&self.admin, self.create) else {
            return Err(TopicError::Missing(topic.to_owned()));
        };
        let partitions = compacted_partitions.unwrap_or(partitions);
        let mut spec = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
        if compacted_partitions.is_some() {
            for (key, value) in PROGRESS_TOPIC_CONFIG {
                spec = spec.set(key, value);
            }
        }
        let options = AdminOptions::new()
            .request_timeout(Some(self.lookup_timeout))
            .operation_timeout(Some(self.lookup_timeout));
        tracing::debug!(topic, "creating topic");
        let results = admin
            .create_topics([&spec], &options)
            .await
            .map_err(|e| TopicError::Create(topic.to_owned(), e.to_string()))?;
        for r in results {
            match r {
                Ok(_) => tracing::info!(topic, partitions, replication, "created topic"),
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code @ RDKafkaErrorCode::InvalidTopic)) => {
                    let reason = invalid_topic(admin.clone(), topic, self.lookup_timeout).await;
                    return Err(TopicError::Create(
                        topic.to_owned(),
                        format!("{code}: {reason}"),
                    ));
                }
                Err((_, code)) => {
                    return Err(TopicError::Create(topic.to_owned(), code.to_string()))
                }
            }
        }
        self.known.insert(topic.to_owned());
        Ok(())
    }
}

/// Why the brokers refused to create `topic` as invalid. The broker says why (a name that
/// collides with an existing topic's, an illegal character), but librdkafka's result as
/// rust-rdkafka gives it keeps only the code: the reason is found again here. Kafka refuses a
/// name that differs from an existing topic's only in '.' and '_' (their metric names would be
/// the same).
async fn invalid_topic(
    admin: Arc<AdminClient<DefaultClientContext>>,
    topic: &str,
    timeout: Duration,
) -> String {
    let existing = tokio::task::spawn_blocking(move || {
        admin.inner().fetch_metadata(None, timeout).map(|md| {
            md.topics()
                .iter()
                .map(|t| t.name().to_owned())
                .collect::<Vec<_>>()
        })
    })
    .await;
    let names = match existing {
        Ok(Ok(names)) => names,
        _ => Vec::new(),
    };
    match colliding(topic, &names) {
        Some(other) => format!(
            "topic {topic:?} collides with existing topic {other:?}: Kafka refuses two topic names that differ only in '.' and '_'"
        ),
        None => "a topic name has at most 249 characters, each a letter, a digit, '.', '_' or '-', and is not \".\" or \"..\"".to_owned(),
    }
}

/// The topic of `existing` whose name differs from `topic` only in '.' and '_'.
fn colliding<'a>(topic: &str, existing: &'a [String]) -> Option<&'a str> {
    let unified = |name: &str| name.replace('.', "_");
    existing
        .iter()
        .find(|name| name.as_str() != topic && unified(name) == unified(topic))
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::DefaultProducerContext;

    use super::*;
    use crate::sink::AckQueue;

    fn config(brokers: String) -> KafkaConfig {
        KafkaConfig::for_brokers(brokers)
    }

    fn sink(config: &KafkaConfig) -> KafkaSink {
        KafkaSink::new(config, Arc::new(AckQueue::default())).unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn config_topics_resolve_at_start_and_a_miss_is_remembered() {
        let cluster = MockCluster::<DefaultProducerContext>::new(1).unwrap();
        cluster.create_topic("orders", 2, 1).unwrap();
        let config = config(cluster.bootstrap_servers());
        let sink = sink(&config);
        let mut topics = Topics::new(&config).unwrap();

        topics
            .resolve(&sink, &["orders".into(), "payments".into()])
            .await;
        assert_eq!(
            topics.lookups, 1,
            "one metadata request for every config topic"
        );
        topics.ensure(&sink, "orders").await.unwrap();
        let miss = topics.ensure(&sink, "payments").await.unwrap_err();
        assert!(matches!(miss, TopicError::Missing(ref t) if t == "payments"));
        assert_eq!(topics.lookups, 1, "the WAL path asked nothing");

        // Created meanwhile: still missing until the remembered miss expires, then found.
        cluster.create_topic("payments", 1, 1).unwrap();
        assert!(topics.ensure(&sink, "payments").await.is_err());
        assert_eq!(topics.lookups, 1);
        topics.retry_after = Duration::ZERO;
        topics.ensure(&sink, "payments").await.unwrap();
        assert_eq!(topics.lookups, 2);
        topics.ensure(&sink, "payments").await.unwrap();
        assert_eq!(topics.lookups, 2, "a found topic is never asked for again");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn an_unreachable_cluster_is_asked_once_per_retry_interval() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let config = config(addr.to_string());
        let sink = sink(&config);
        let mut topics = Topics::new(&config).unwrap();
        topics.lookup_timeout = Duration::from_millis(200);

        topics.resolve(&sink, &["orders".into()]).await;
        assert_eq!(topics.lookups, 1);
        // Events are produced without asking (librdkafka holds them until brokers answer).
        topics.ensure(&sink, "orders").await.unwrap();
        assert_eq!(topics.lookups, 2);
        topics.ensure(&sink, "orders").await.unwrap();
        topics.ensure(&sink, "customers").await.unwrap();
        assert_eq!(
            topics.lookups, 2,
            "no lookup while the cluster is known unreachable"
        );
    }

    #[test]
    fn a_name_differing_only_in_dots_and_underscores_collides() {
        let existing = ["col_x".to_owned(), "orders".to_owned(), "a.b_c".to_owned()];
        assert_eq!(colliding("col.x", &existing), Some("col_x"));
        assert_eq!(colliding("a_b.c", &existing), Some("a.b_c"));
        assert_eq!(colliding("col_x", &existing), None);
        assert_eq!(colliding("col-x", &existing), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn caches_sharing_one_admin_client_keep_their_own_knowledge() {
        // (Creating topics needs CreateTopics, which the mock cluster lacks: see
        // tests/routing.rs, `missing_topics_are_created_when_asked`.)
        let cluster = MockCluster::<DefaultProducerContext>::new(1).unwrap();
        cluster.create_topic("orders", 2, 1).unwrap();
        let mut config = config(cluster.bootstrap_servers());
        config.create_topics = Some((3, 1));
        let sink = sink(&config);
        let mut first = Topics::new(&config).unwrap();
        let mut second = first.sharing();
        let (a, b) = (first.admin.as_ref(), second.admin.as_ref());
        assert!(Arc::ptr_eq(a.unwrap(), b.unwrap()), "one admin client");

        first.resolve(&sink, &["orders".into()]).await;
        assert!(first.known.contains("orders"));
        assert!(second.known.is_empty(), "a new cache knows nothing");
        second.ensure(&sink, "orders").await.unwrap();
        assert_eq!((first.lookups, second.lookups), (1, 1));
    }
}
