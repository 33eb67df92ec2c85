//! One throwaway broker of any kind walbox publishes to, for `walbox demo --broker`: started,
//! given a destination that stores what walbox sends there (a topic; a Redis stream needs
//! nothing; a JetStream stream capturing it; a RabbitMQ exchange with a queue bound to it),
//! named to walbox through its variables, and read back as [`ConsumedRecord`]s (the
//! destination as topic, a position as offset, the aggregate id as key).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use async_nats::jetstream::{self, stream};
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};

use super::broker::{read_topics, Broker, ConsumedRecord};
use super::nats::{NatsOptions, NatsServer};
use super::rabbitmq::{RabbitMq, RabbitMqOptions};
use super::redis::{RedisOptions, RedisServer};
use crate::config::{BrokerKind, NatsConfig, RedisConfig};
use crate::outbox::KEY_HEADER;
use crate::sink::readback::{self, ReadRecord};

/// The exchange and queue the RabbitMQ broker routes a destination through.
const EXCHANGE: &str = "outbox";

/// A running throwaway broker; dropped, it is stopped and removed.
pub enum ScratchBroker {
    /// librdkafka's mock cluster (3 brokers).
    Kafka(Broker),
    /// A Redis server, in memory.
    Redis(RedisServer),
    /// A NATS server with JetStream.
    Nats(NatsServer),
    /// A RabbitMQ node.
    RabbitMq(RabbitMq),
}

impl ScratchBroker {
    /// Starts a broker of `kind` (blocking: RabbitMQ takes a few seconds).
    pub fn start(kind: BrokerKind) -> Result<Self> {
        Ok(match kind {
            BrokerKind::Kafka => ScratchBroker::Kafka(Broker::mock(3)?),
            BrokerKind::Redis => ScratchBroker::Redis(RedisServer::start(RedisOptions {
                watchdog: true,
                ..Default::default()
            })?),
            BrokerKind::Nats => ScratchBroker::Nats(NatsServer::start(NatsOptions {
                watchdog: true,
                ..Default::default()
            })?),
            BrokerKind::RabbitMq => ScratchBroker::RabbitMq(RabbitMq::start(RabbitMqOptions {
                watchdog: true,
                ..Default::default()
            })?),
        })
    }

    /// What it is and where, for the demo's output.
    pub fn describe(&self) -> String {
        match self {
            ScratchBroker::Kafka(b) => format!(
                "kafka (librdkafka mock cluster, 3 brokers): {}",
                b.bootstrap_servers()
            ),
            ScratchBroker::Redis(r) => format!("redis: {}", r.url()),
            ScratchBroker::Nats(n) => format!("nats (JetStream): {}", n.url()),
            ScratchBroker::RabbitMq(r) => format!("rabbitmq: {} (exchange {EXCHANGE:?})", r.url()),
        }
    }

    /// walbox's variables for this broker.
    pub fn env(&self) -> Vec<(String, String)> {
        let vars: Vec<(&str, String)> = match self {
            ScratchBroker::Kafka(b) => vec![("WALBOX_KAFKA_BROKERS", b.bootstrap_servers())],
            ScratchBroker::Redis(r) => vec![("WALBOX_REDIS_URL", r.url())],
            ScratchBroker::Nats(n) => vec![("WALBOX_NATS_URL", n.url())],
            ScratchBroker::RabbitMq(r) => vec![
                (
                    "WALBOX_RABBITMQ_URL",
                    format!("amqp://guest@127.0.0.1:{}/%2f", r.port()),
                ),
                ("WALBOX_RABBITMQ_PASSWORD", "guest".into()),
                ("WALBOX_RABBITMQ_EXCHANGE", EXCHANGE.into()),
            ],
        };
        vars.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
    }

    /// Makes `destination` store what walbox sends there (`partitions` for a Kafka topic).
    pub async fn prepare(&self, destination: &str, partitions: i32) -> Result<()> {
        match self {
            ScratchBroker::Kafka(b) => b.create_topic(destination, partitions)?,
            ScratchBroker::Redis(_) => {}
            ScratchBroker::Nats(n) => {
                let js = jetstream::new(async_nats::connect(n.url()).await?);
                js.create_stream(stream::Config {
                    name: destination.replace('.', "_"),
                    subjects: vec![destination.to_owned()],
                    storage: stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .context("creating the JetStream stream")?;
            }
            ScratchBroker::RabbitMq(r) => {
                let (conn, ch) = rabbit_channel(r.port()).await?;
                ch.exchange_declare(
                    EXCHANGE.into(),
                    ExchangeKind::Topic,
                    ExchangeDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await?;
                ch.queue_declare(
                    destination.into(),
                    QueueDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await?;
                ch.queue_bind(
                    destination.into(),
                    EXCHANGE.into(),
                    destination.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
                conn.close(200, "declared".into()).await?;
            }
        }
        Ok(())
    }

    /// What `destination` holds, read until there are `expected` records or `timeout` passed
    /// (a RabbitMQ queue is emptied by the read).
    pub async fn read(
        &self,
        destination: &str,
        expected: usize,
        timeout: Duration,
    ) -> Result<Vec<ConsumedRecord>> {
        let deadline = Instant::now() + timeout;
        let mut records = Vec::new();
        loop {
            match self {
                ScratchBroker::Kafka(b) => {
                    let (bootstrap, topic) = (b.bootstrap_servers(), destination.to_owned());
                    records = tokio::task::spawn_blocking(move || {
                        read_topics(&bootstrap, &[&topic], timeout, |r| r.len() >= expected)
                    })
                    .await??;
                }
                ScratchBroker::Redis(_) | ScratchBroker::Nats(_) => {
                    records = read_back(self, destination).await?
                }
                ScratchBroker::RabbitMq(r) => {
                    records.extend(drain_rabbit_queue(r.port(), destination).await?)
                }
            }
            if records.len() >= expected || Instant::now() >= deadline {
                return Ok(records);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A record read back, as the demo prints it.
fn record(
    topic: &str,
    offset: usize,
    key: Option<&[u8]>,
    payload: Vec<u8>,
    headers: Vec<(String, Vec<u8>)>,
) -> ConsumedRecord {
    ConsumedRecord {
        topic: topic.to_owned(),
        partition: 0,
        offset: offset as i64,
        key: key.map(<[u8]>::to_vec),
        payload: Some(payload),
        headers,
        timestamp_ms: None,
    }
}

/// What the brokers that can be read back hold at `destination` (`sink::readback`).
async fn read_back(broker: &ScratchBroker, destination: &str) -> Result<Vec<ConsumedRecord>> {
    let mut out = Vec::new();
    let mut each = |r: &ReadRecord<'_>| {
        let offset = out.len();
        out.push(record(
            r.destination,
            offset,
            r.key,
            r.payload.to_vec(),
            r.fields.to_vec(),
        ))
    };
    let wanted = [destination.to_owned()];
    match broker {
        ScratchBroker::Redis(r) => {
            readback::read_redis(&RedisConfig::for_url(r.url()), &wanted, &mut each).await?
        }
        ScratchBroker::Nats(n) => {
            readback::read_nats(&NatsConfig::for_url(&n.url()), &wanted, &mut each).await?
        }
        ScratchBroker::Kafka(_) | ScratchBroker::RabbitMq(_) => 0,
    };
    Ok(out)
}

/// A connection to the node on `port` as its default user, and a channel on it.
pub async fn rabbit_channel(port: u16) -> Result<(Connection, lapin::Channel)> {
    let url = format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
    let conn = Connection::connect(&url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    Ok((conn, ch))
}

/// Takes every message off `queue` of the node on `port` (the aggregate id as key).
pub async fn drain_rabbit_queue(port: u16, queue: &str) -> Result<Vec<ConsumedRecord>> {
    let (conn, ch) = rabbit_channel(port).await?;
    let mut out = Vec::new();
    while let Some(m) = ch
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await?
    {
        let d = m.delivery;
        let headers: Vec<(String, Vec<u8>)> = d
            .properties
            .headers()
            .as_ref()
            .map(|h| {
                h.inner()
                    .iter()
                    .map(|(n, v)| (n.as_str().to_owned(), amqp_bytes(v)))
                    .collect()
            })
            .unwrap_or_default();
        let offset = d.delivery_tag as usize;
        let key = headers
            .iter()
            .find(|(n, _)| n == KEY_HEADER)
            .map(|(_, v)| v.clone());
        out.push(record(queue, offset, key.as_deref(), d.data, headers));
    }
    if let Err(e) = conn.close(200, "read".into()).await {
        bail!("closing the reading connection: {e}");
    }
    Ok(out)
}

/// An AMQP header value as the bytes walbox put in it.
fn amqp_bytes(v: &AMQPValue) -> Vec<u8> {
    match v {
        AMQPValue::LongString(s) => s.as_bytes().to_vec(),
        AMQPValue::ShortString(s) => s.as_str().as_bytes().to_vec(),
        AMQPValue::ByteArray(b) => b.as_slice().to_vec(),
        _ => Vec::new(),
    }
}
