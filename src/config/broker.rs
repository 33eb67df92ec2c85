//! Which broker `walbox run` publishes to: Kafka (`[kafka]`, the default), or the one other
//! broker section the configuration has. A configuration names one broker; the relay, its
//! progress records and every command that reads back what was published use it.

use std::fmt;

use super::env::EnvLayout;
use super::error::ConfigError;
use super::kafka::{KafkaConfig, RawKafka};
use super::nats::NatsConfig;
use super::rabbitmq::RabbitMqConfig;
use super::redis::RedisConfig;

/// A broker walbox publishes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BrokerKind {
    /// Apache Kafka (and the Kafka protocol's other servers), through librdkafka.
    Kafka,
    /// Redis Streams.
    Redis,
    /// NATS JetStream.
    Nats,
    /// RabbitMQ (AMQP 0-9-1).
    RabbitMq,
}

impl BrokerKind {
    /// The broker's name in metrics labels, logs and the configuration's section names.
    pub fn name(self) -> &'static str {
        match self {
            BrokerKind::Kafka => "kafka",
            BrokerKind::Redis => "redis",
            BrokerKind::Nats => "nats",
            BrokerKind::RabbitMq => "rabbitmq",
        }
    }
}

impl fmt::Display for BrokerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The broker `walbox run` publishes to, with its section when it is not Kafka (Kafka's is
/// `Config::kafka`, always present: the inbox and the Kafka-only commands read it too).
#[derive(Debug, Clone, Default)]
pub enum BrokerConfig {
    /// `[kafka]`.
    #[default]
    Kafka,
    /// `[redis]`: Redis Streams.
    Redis(RedisConfig),
    /// `[nats]`.
    Nats(NatsConfig),
    /// `[rabbitmq]`.
    RabbitMq(RabbitMqConfig),
}

impl BrokerConfig {
    /// The setting that says where the broker is (`kafka.brokers`, `redis.url`, …), for
    /// messages about a broker that does not answer.
    pub fn address_key(&self) -> &'static str {
        match self {
            BrokerConfig::Kafka => "kafka.brokers",
            BrokerConfig::Redis(_) => "redis.url",
            BrokerConfig::Nats(_) => "nats.url",
            BrokerConfig::RabbitMq(_) => "rabbitmq.url",
        }
    }

    /// Which broker this is.
    pub fn kind(&self) -> BrokerKind {
        match self {
            BrokerConfig::Kafka => BrokerKind::Kafka,
            BrokerConfig::Redis(_) => BrokerKind::Redis,
            BrokerConfig::Nats(_) => BrokerKind::Nats,
            BrokerConfig::RabbitMq(_) => BrokerKind::RabbitMq,
        }
    }
}

/// The broker of a configuration: Kafka unless another broker's section is present (`others`,
/// at most one). With another broker, `[kafka]` may not set what `walbox run` would use
/// (`brokers`, exactly-once mode), and the relay runs one slot (`postgres.shards = 1`): the
/// shards of one process share a Kafka producer, which no other broker has.
pub(super) fn choose(
    kafka: RawKafka,
    others: Vec<BrokerConfig>,
    shards: u32,
    env: &EnvLayout,
) -> Result<(KafkaConfig, BrokerConfig), ConfigError> {
    let mut others = others.into_iter();
    let Some(other) = others.next() else {
        return Ok((kafka.validate(env)?, BrokerConfig::Kafka));
    };
    if let Some(second) = others.next() {
        return Err(ConfigError::Invalid(format!(
            "[{}] and [{}] both configured: walbox run publishes to one broker; remove one",
            other.kind(),
            second.kind()
        )));
    }
    if kafka.brokers.is_some() || kafka.exactly_once.is_some() {
        return Err(ConfigError::Invalid(format!(
            "[{}] and [kafka] both configured: walbox run publishes to one broker; remove kafka.brokers (and kafka.exactly_once), or the [{}] section",
            other.kind(),
            other.kind()
        )));
    }
    if shards > 1 {
        return Err(ConfigError::Invalid(format!(
            "postgres.shards > 1 publishes to Kafka only (its shards share one producer); with [{}] run one walbox per slot",
            other.kind()
        )));
    }
    Ok((KafkaConfig::for_brokers(""), other))
}
