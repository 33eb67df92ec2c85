//! Which topics exist, and creating the missing ones when `kafka.create_topics` is on.
//!
//! walbox never relies on the broker's automatic topic creation: the producer runs with
//! `allow.auto.create.topics=false`. The first time a route produces to a topic, walbox asks
//! the cluster for it. If the topic is missing, walbox creates it through the admin API
//! (`kafka.create_topics`, with `topic_partitions` and `topic_replication_factor`); otherwise
//! the event is invalid and follows its table's `on_invalid` policy. Known topics are
//! remembered, so the hot path asks nothing.
//!
//! When the cluster cannot be asked (brokers down), the event is produced anyway. librdkafka
//! then holds it until the brokers answer, and the relay's backpressure applies.

use std::collections::HashSet;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::types::RDKafkaErrorCode;

use crate::config::KafkaConfig;
use crate::failure::{Classify, Failure};
use crate::sink::kafka::KafkaSink;

/// How long one metadata lookup may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The topic cache; see the module docs.
pub struct Topics {
    known: HashSet<String>,
    create: Option<(i32, i32)>,
    admin: Option<AdminClient<DefaultClientContext>>,
}

/// A topic that does not exist and may not be created.
#[derive(Debug, thiserror::Error)]
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
            Some(_) => {
                let mut cc = ClientConfig::new();
                cc.set("bootstrap.servers", &config.brokers);
                for (k, v) in crate::sink::security_properties(&config.properties) {
                    cc.set(k, v);
                }
                Some(cc.create()?)
            }
        };
        Ok(Topics {
            known: HashSet::new(),
            create: config.create_topics,
            admin,
        })
    }

    /// Makes sure `topic` exists, or says why it cannot be used.
    pub async fn ensure(&mut self, sink: &KafkaSink, topic: &str) -> Result<(), TopicError> {
        self.ensure_as(sink, topic, None).await
    }

    /// Makes sure the progress topic exists; when walbox creates it, it has one partition and
    /// `cleanup.policy=compact` (one record per slot is all that matters).
    pub async fn ensure_progress(
        &mut self,
        sink: &KafkaSink,
        topic: &str,
    ) -> Result<(), TopicError> {
        self.ensure_as(sink, topic, Some(1)).await
    }

    /// [`Topics::ensure`]; `compacted_partitions` creates a compacted topic of that many
    /// partitions instead of one with the configured defaults.
    async fn ensure_as(
        &mut self,
        sink: &KafkaSink,
        topic: &str,
        compacted_partitions: Option<i32>,
    ) -> Result<(), TopicError> {
        if self.known.contains(topic) {
            return Ok(());
        }
        let probe = sink.clone();
        let name = topic.to_owned();
        tracing::debug!(topic, "looking the topic up");
        let exists = tokio::task::spawn_blocking(move || probe.topic_exists(&name, LOOKUP_TIMEOUT))
            .await
            .unwrap_or(Ok(false));
        match exists {
            Ok(true) => {
                self.known.insert(topic.to_owned());
                Ok(())
            }
            Err(e) => {
                tracing::debug!(topic, error = %e, "cannot look the topic up; producing anyway");
                Ok(())
            }
            Ok(false) => match (&self.admin, self.create) {
                (Some(admin), Some((partitions, replication))) => {
                    let partitions = compacted_partitions.unwrap_or(partitions);
                    let mut spec =
                        NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
                    if compacted_partitions.is_some() {
                        spec = spec.set("cleanup.policy", "compact");
                    }
                    let options = AdminOptions::new()
                        .request_timeout(Some(LOOKUP_TIMEOUT))
                        .operation_timeout(Some(LOOKUP_TIMEOUT));
                    tracing::debug!(topic, "creating topic");
                    let results = admin
                        .create_topics([&spec], &options)
                        .await
                        .map_err(|e| TopicError::Create(topic.to_owned(), e.to_string()))?;
                    for r in results {
                        match r {
                            Ok(_) => {
                                tracing::info!(topic, partitions, replication, "created topic")
                            }
                            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                            Err((_, code)) => {
                                return Err(TopicError::Create(topic.to_owned(), code.to_string()))
                            }
                        }
                    }
                    self.known.insert(topic.to_owned());
                    Ok(())
                }
                _ => Err(TopicError::Missing(topic.to_owned())),
            },
        }
    }
}
