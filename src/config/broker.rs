//! Which broker `walbox run` publishes to: Kafka (`[kafka]`, the default), or the one other
//! broker section the configuration has. A configuration names one broker; the relay, its
//! progress records and every command that reads back what was published use it.

use std::fmt;

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
}

impl BrokerConfig {
    /// Which broker this is.
    pub fn kind(&self) -> BrokerKind {
        match self {
            BrokerConfig::Kafka => BrokerKind::Kafka,
        }
    }
}
