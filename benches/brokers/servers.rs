//! The bench's brokers: one throwaway server per kind ([`ScratchBroker`]), its destinations
//! prepared and emptied between runs, walbox's variables for it, and what walbox stored read
//! back as the messages the plain client publishes again.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{bail, Context};
use async_nats::jetstream::{self, consumer, stream};
use async_nats::HeaderMap;
use bytes::Bytes;
use futures_util::StreamExt;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties, ExchangeKind};
use walbox::config::BrokerKind;
use walbox::lsn::Lsn;
use walbox::outbox::{COMMIT_LSN_HEADER, INDEX_HEADER};
use walbox::sandbox::scratch_broker::ScratchBroker;

/// The RabbitMQ exchange (the one [`ScratchBroker::env`] names) and the queue bound `#` to it.
pub const EXCHANGE: &str = "outbox";
/// The RabbitMQ queue.
const QUEUE: &str = "bench";
/// The JetStream stream capturing `bench.>`.
const STREAM: &str = "BENCH";
/// The prefix of every destination (Redis stream keys, NATS subjects).
const PREFIX: &str = "bench.";

/// A broker the bench measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Redis,
    Nats,
    RabbitMq,
}

impl std::str::FromStr for Kind {
    type Err = std::io::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "redis" => Ok(Kind::Redis),
            "nats" => Ok(Kind::Nats),
            "rabbitmq" => Ok(Kind::RabbitMq),
            other => Err(std::io::Error::other(format!(
                "{other:?}: redis, nats or rabbitmq"
            ))),
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Redis => "redis",
            Kind::Nats => "nats",
            Kind::RabbitMq => "rabbitmq",
        })
    }
}

/// How the plain client pipelines.
#[derive(Debug, Clone, Copy)]
pub enum Mode {
    /// As walbox: Redis one pipeline of 1,000 at a time, RabbitMQ a window of 10,000
    /// confirms, NATS one PubAck awaited per subject.
    AsWalbox,
    /// NATS: up to 10,000 PubAcks outstanding, any subjects.
    Window,
}

impl Kind {
    /// The plain client's runs: (label, mode); the first is the one walbox is compared to.
    pub fn reference_modes(self) -> Vec<(String, Mode)> {
        match self {
            Kind::Nats => vec![
                ("nats".into(), Mode::AsWalbox),
                ("nats (window 10k)".into(), Mode::Window),
            ],
            other => vec![(other.to_string(), Mode::AsWalbox)],
        }
    }

    /// The outbox `topic` template walbox routes with.
    fn topic(self) -> &'static str {
        match self {
            Kind::Redis => "bench.${aggregate_type}",
            Kind::Nats => "bench.${aggregate_id}",
            Kind::RabbitMq => "${aggregate_type}",
        }
    }
}

/// One message as walbox stored it, to publish again.
pub enum Message {
    /// `XADD <stream> <id> <field> <value> …`.
    Redis {
        stream: String,
        id: String,
        fields: Vec<Vec<u8>>,
    },
    /// A JetStream publish (its headers hold `Nats-Msg-Id`).
    Nats {
        subject: String,
        headers: HeaderMap,
        payload: Bytes,
    },
    /// A `basic.publish` to [`EXCHANGE`].
    Rabbit {
        routing_key: String,
        properties: Box<BasicProperties>,
        body: Vec<u8>,
    },
}

/// A running broker.
pub struct Server {
    pub kind: Kind,
    pub scratch: ScratchBroker,
}

impl Server {
    /// Starts a throwaway server of `kind` (watchdog on).
    pub async fn start(kind: Kind) -> anyhow::Result<Self> {
        let broker_kind = match kind {
            Kind::Redis => BrokerKind::Redis,
            Kind::Nats => BrokerKind::Nats,
            Kind::RabbitMq => BrokerKind::RabbitMq,
        };
        // Not `Send` (its Kafka variant holds a mock cluster): started on this thread.
        let scratch = tokio::task::block_in_place(|| ScratchBroker::start(broker_kind))
            .with_context(|| format!("starting {kind}"))?;
        Ok(Server { kind, scratch })
    }

    /// walbox's variables: the broker's, and the topic template.
    pub fn walbox_env(&self) -> Vec<(String, String)> {
        let mut env = self.scratch.env();
        env.push(("WALBOX_OUTBOX_TOPIC".into(), self.kind.topic().into()));
        env
    }

    /// The Redis URL, NATS URL or AMQP URL.
    pub fn url(&self) -> String {
        match &self.scratch {
            ScratchBroker::Redis(r) => r.url(),
            ScratchBroker::Nats(n) => n.url(),
            ScratchBroker::RabbitMq(r) => r.url(),
            ScratchBroker::Kafka(_) => unreachable!("the bench starts no Kafka"),
        }
    }

    /// A Redis connection without the client's default 500 ms reply timeout: reading back a
    /// stream of tens of thousands of entries, or deleting it, takes longer on a busy machine.
    pub async fn redis(&self) -> anyhow::Result<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(self.url())?;
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        Ok(client
            .get_multiplexed_async_connection_with_config(&config)
            .await?)
    }

    /// A JetStream context.
    pub async fn jetstream(&self) -> anyhow::Result<jetstream::Context> {
        Ok(jetstream::new(async_nats::connect(self.url()).await?))
    }

    /// An AMQP connection and a channel on it.
    pub async fn rabbit(&self) -> anyhow::Result<(Connection, lapin::Channel)> {
        let conn = Connection::connect(&self.url(), ConnectionProperties::default()).await?;
        let ch = conn.create_channel().await?;
        Ok((conn, ch))
    }

    /// The bench's Redis stream keys.
    async fn redis_streams(
        conn: &mut redis::aio::MultiplexedConnection,
    ) -> anyhow::Result<Vec<String>> {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{PREFIX}*"))
            .query_async(conn)
            .await?;
        keys.sort();
        Ok(keys)
    }

    /// Empty destinations, ready for a run: Redis streams deleted, the JetStream stream
    /// created again (its duplicate window empty), the RabbitMQ queue declared and purged.
    pub async fn reset(&self) -> anyhow::Result<()> {
        match self.kind {
            Kind::Redis => {
                let mut conn = self.redis().await?;
                for key in Self::redis_streams(&mut conn).await? {
                    let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut conn).await?;
                }
            }
            Kind::Nats => {
                let js = self.jetstream().await?;
                let _ = js.delete_stream(STREAM).await;
                js.create_stream(stream::Config {
                    name: STREAM.into(),
                    subjects: vec![format!("{PREFIX}>")],
                    storage: stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .context("creating the JetStream stream")?;
            }
            Kind::RabbitMq => {
                let (conn, ch) = self.rabbit().await?;
                let durable = |d| ExchangeDeclareOptions {
                    durable: d,
                    ..Default::default()
                };
                ch.exchange_declare(
                    EXCHANGE.into(),
                    ExchangeKind::Topic,
                    durable(true),
                    FieldTable::default(),
                )
                .await?;
                ch.queue_declare(
                    QUEUE.into(),
                    QueueDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await?;
                ch.queue_bind(
                    QUEUE.into(),
                    EXCHANGE.into(),
                    "#".into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
                ch.queue_purge(QUEUE.into(), QueuePurgeOptions::default())
                    .await?;
                conn.close(200, "reset".into()).await?;
            }
        }
        Ok(())
    }

    /// How many events the destinations hold.
    pub async fn count(&self) -> anyhow::Result<u64> {
        Ok(match self.kind {
            Kind::Redis => {
                let mut conn = self.redis().await?;
                let mut n = 0;
                for key in Self::redis_streams(&mut conn).await? {
                    let len: u64 = redis::cmd("XLEN").arg(&key).query_async(&mut conn).await?;
                    n += len;
                }
                n
            }
            Kind::Nats => {
                let js = self.jetstream().await?;
                js.get_stream(STREAM).await?.info().await?.state.messages
            }
            Kind::RabbitMq => {
                let (conn, ch) = self.rabbit().await?;
                let q = ch
                    .queue_declare(
                        QUEUE.into(),
                        QueueDeclareOptions {
                            passive: true,
                            ..Default::default()
                        },
                        FieldTable::default(),
                    )
                    .await?;
                conn.close(200, "counted".into()).await?;
                u64::from(q.message_count())
            }
        })
    }

    /// What walbox stored (up to `events` messages), in walbox's publishing order (commit
    /// order: Redis and NATS sorted by WAL position; the RabbitMQ queue is in publish order).
    pub async fn read_back(&self, events: u64) -> anyhow::Result<Vec<Message>> {
        match self.kind {
            Kind::Redis => self.read_redis().await,
            Kind::Nats => self.read_nats(events).await,
            Kind::RabbitMq => self.read_rabbit(events).await,
        }
    }

    async fn read_redis(&self) -> anyhow::Result<Vec<Message>> {
        let mut conn = self.redis().await?;
        let mut out = Vec::new();
        for key in Self::redis_streams(&mut conn).await? {
            let entries: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
                .arg(&key)
                .arg("-")
                .arg("+")
                .query_async(&mut conn)
                .await?;
            out.extend(entries.into_iter().map(|(id, fields)| Message::Redis {
                stream: key.clone(),
                id,
                fields,
            }));
        }
        // Entry ids are `<commit LSN>-<index>`: commit order.
        out.sort_by_cached_key(|m| match m {
            Message::Redis { id, .. } => {
                let (lsn, index) = id.split_once('-').unwrap_or((id, "0"));
                (
                    lsn.parse::<u64>().unwrap_or(0),
                    index.parse::<u64>().unwrap_or(0),
                )
            }
            _ => (0, 0),
        });
        Ok(out)
    }

    async fn read_nats(&self, events: u64) -> anyhow::Result<Vec<Message>> {
        let js = self.jetstream().await?;
        let s = js.get_stream(STREAM).await?;
        let consumer = s
            .create_consumer(consumer::pull::Config {
                ack_policy: consumer::AckPolicy::None,
                ..Default::default()
            })
            .await?;
        let mut messages = consumer.messages().await?;
        let mut out = Vec::with_capacity(events as usize);
        while (out.len() as u64) < events {
            let m = match tokio::time::timeout(Duration::from_secs(10), messages.next()).await {
                Ok(Some(m)) => m.map_err(|e| anyhow::anyhow!("reading back: {e}"))?,
                Ok(None) | Err(_) => break,
            };
            let m = m.message;
            out.push(Message::Nats {
                subject: m.subject.to_string(),
                headers: m.headers.unwrap_or_default(),
                payload: m.payload,
            });
        }
        let position = |h: &HeaderMap| {
            let lsn: Lsn = h
                .get(COMMIT_LSN_HEADER)
                .and_then(|v| v.as_str().parse().ok())
                .unwrap_or_default();
            let index: u64 = h
                .get(INDEX_HEADER)
                .and_then(|v| v.as_str().parse().ok())
                .unwrap_or(0);
            (lsn, index)
        };
        out.sort_by_cached_key(|m| match m {
            Message::Nats { headers, .. } => position(headers),
            _ => (Lsn::default(), 0),
        });
        Ok(out)
    }

    async fn read_rabbit(&self, events: u64) -> anyhow::Result<Vec<Message>> {
        let (conn, ch) = self.rabbit().await?;
        ch.basic_qos(10_000, BasicQosOptions::default()).await?;
        let mut consumer = ch
            .basic_consume(
                QUEUE.into(),
                "readback".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        let mut out = Vec::with_capacity(events as usize);
        while (out.len() as u64) < events {
            let d = match tokio::time::timeout(Duration::from_secs(10), consumer.next()).await {
                Ok(Some(d)) => d?,
                Ok(None) | Err(_) => break,
            };
            out.push(Message::Rabbit {
                routing_key: d.routing_key.as_str().to_owned(),
                properties: Box::new(d.properties),
                body: d.data,
            });
        }
        ch.basic_cancel("readback".into(), BasicCancelOptions::default())
            .await?;
        conn.close(200, "read".into()).await?;
        Ok(out)
    }

    /// The server's name and version.
    pub async fn version(&self) -> anyhow::Result<String> {
        Ok(match self.kind {
            Kind::Redis => {
                let mut conn = self.redis().await?;
                let info: String = redis::cmd("INFO")
                    .arg("server")
                    .query_async(&mut conn)
                    .await?;
                let v = info
                    .lines()
                    .find_map(|l| l.strip_prefix("redis_version:"))
                    .unwrap_or("?");
                format!("Redis {}", v.trim())
            }
            Kind::Nats => {
                let client = async_nats::connect(self.url()).await?;
                format!("nats-server {}", client.server_info().version)
            }
            Kind::RabbitMq => {
                let ScratchBroker::RabbitMq(r) = &self.scratch else {
                    bail!("not RabbitMQ");
                };
                let v = tokio::task::block_in_place(|| r.run("rabbitmqctl", &["version"]))?;
                format!("RabbitMQ {}", v.trim())
            }
        })
    }
}

/// How many destinations `messages` go to (for the log).
pub fn destinations(messages: &[Message]) -> usize {
    let mut seen: HashMap<&str, ()> = HashMap::new();
    for m in messages {
        let d = match m {
            Message::Redis { stream, .. } => stream.as_str(),
            Message::Nats { subject, .. } => subject.as_str(),
            Message::Rabbit { routing_key, .. } => routing_key.as_str(),
        };
        seen.insert(d, ());
    }
    seen.len()
}
