//! The brokers of `broker_relay` as [`Target`]s (walbox's variables for each, and a reader of
//! what it holds, as `ConsumedRecord`s: the destination as topic, `walbox.key` as key), and the
//! tests that run the SIGKILL loop and the broker restart on each.

use std::path::{Path, PathBuf};

use async_nats::jetstream;
use lapin::ExchangeKind;
use walbox::outbox::KEY_HEADER;
use walbox::sandbox::broker::ConsumedRecord;
use walbox::sandbox::nats::NatsOptions;
use walbox::sandbox::rabbitmq::RabbitMqOptions;
use walbox::sandbox::redis::RedisOptions;
use walbox::sandbox::scratch_broker::{drain_rabbit_queue, rabbit_channel};

use crate::broker_relay::{restart_during_backlog, sigkill_loop, Target};
use crate::nats_sink::make_stream;
use crate::rabbitmq_sink;
use crate::support::brokers::{nats, own_nats, own_rabbitmq, own_redis, rabbitmq, redis};
use crate::support::unique;

/// A record as the tests compare them: `fields` are (name, value) pairs, the key among them
/// as `key_field`.
fn record(
    topic: &str,
    key_field: &str,
    payload: Vec<u8>,
    fields: Vec<(String, Vec<u8>)>,
) -> ConsumedRecord {
    let key = fields
        .iter()
        .find(|(n, _)| n == key_field)
        .map(|(_, v)| v.clone());
    ConsumedRecord {
        topic: topic.to_owned(),
        partition: 0,
        offset: 0,
        key,
        payload: Some(payload),
        headers: fields,
        timestamp_ms: None,
    }
}

/// Redis Streams: one stream key.
pub struct RedisTarget {
    url: String,
    stream: String,
}

impl RedisTarget {
    pub fn new(url: String) -> Self {
        RedisTarget {
            url,
            stream: unique("outbox_stream"),
        }
    }
}

impl Target for RedisTarget {
    fn env(&self) -> Vec<(String, String)> {
        vec![("WALBOX_REDIS_URL".into(), self.url.clone())]
    }

    fn destination(&self) -> String {
        self.stream.clone()
    }

    fn read_all(&mut self) -> Vec<ConsumedRecord> {
        let client = redis::Client::open(self.url.as_str()).expect("redis url");
        let mut conn = client.get_connection().expect("connect to redis");
        let entries: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
            .arg(&self.stream)
            .arg("-")
            .arg("+")
            .query(&mut conn)
            .expect("XRANGE");
        entries
            .into_iter()
            .map(|(_, kv)| {
                let mut fields: Vec<(String, Vec<u8>)> = kv
                    .chunks(2)
                    .map(|p| {
                        (
                            String::from_utf8_lossy(&p[0]).into_owned(),
                            p.get(1).cloned().unwrap_or_default(),
                        )
                    })
                    .collect();
                let payload = fields
                    .iter()
                    .position(|(n, _)| n == "payload")
                    .map(|i| fields.remove(i).1)
                    .unwrap_or_default();
                record(&self.stream, "key", payload, fields)
            })
            .collect()
    }

    fn duplicates_possible(&self) -> bool {
        false
    }
}

/// NATS JetStream: a file-storage stream capturing `<name>.>`, published to `<name>.orders`.
pub struct NatsTarget {
    url: String,
    name: String,
    /// The CA the server's certificate is verified with, for a server that requires TLS.
    ca: Option<PathBuf>,
    rt: tokio::runtime::Runtime,
}

impl NatsTarget {
    pub fn new(url: String) -> Self {
        Self::connected(url, None)
    }

    /// On a server that requires TLS (`url` is `tls://…`), verified with `ca`.
    pub fn with_tls(url: String, ca: &Path) -> Self {
        Self::connected(url, Some(ca.to_owned()))
    }

    fn connected(url: String, ca: Option<PathBuf>) -> Self {
        let name = unique("outbox").replace('_', "-");
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let target = NatsTarget { url, name, ca, rt };
        target.rt.block_on(async {
            make_stream(&target.jetstream().await, &target.name).await;
        });
        target
    }

    async fn jetstream(&self) -> jetstream::Context {
        let options = match &self.ca {
            Some(ca) => async_nats::ConnectOptions::new()
                .require_tls(true)
                .add_root_certificates(ca.clone()),
            None => async_nats::ConnectOptions::new(),
        };
        jetstream::new(options.connect(&self.url).await.expect("connect to nats"))
    }

    /// The stream's name.
    pub fn stream(&self) -> &str {
        &self.name
    }
}

/// Limits stream `name` of the server at `url` to `max_messages` (-1: no limit), refusing new
/// ones when full (`discard: new`), as an operator would.
pub fn limit_nats_stream(url: &str, name: &str, max_messages: i64) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let js = jetstream::new(async_nats::connect(url).await.expect("connect to nats"));
        let mut stream = js.get_stream(name).await.expect("the stream");
        let mut config = stream.info().await.expect("stream info").config.clone();
        config.max_messages = max_messages;
        config.discard = jetstream::stream::DiscardPolicy::New;
        js.update_stream(config).await.expect("update the stream");
    });
}

impl Target for NatsTarget {
    fn env(&self) -> Vec<(String, String)> {
        vec![
            ("WALBOX_NATS_URL".into(), self.url.clone()),
            (
                "WALBOX_NATS_PROGRESS_BUCKET".into(),
                format!("{}-progress", self.name),
            ),
        ]
    }

    fn destination(&self) -> String {
        format!("{}.orders", self.name)
    }

    fn read_all(&mut self) -> Vec<ConsumedRecord> {
        let name = self.name.clone();
        self.rt.block_on(async {
            let js = self.jetstream().await;
            let mut s = js.get_stream(&name).await.expect("the stream");
            let info = s.info().await.expect("stream info");
            let mut out = Vec::new();
            if info.state.messages == 0 {
                return out;
            }
            for seq in info.state.first_sequence..=info.state.last_sequence {
                let m = s.get_raw_message(seq).await.expect("a stored message");
                let fields: Vec<(String, Vec<u8>)> = m
                    .headers
                    .iter()
                    .flat_map(|(n, vs)| {
                        vs.iter()
                            .map(move |v| (n.to_string(), v.as_str().as_bytes().to_vec()))
                    })
                    .collect();
                out.push(record(&m.subject, KEY_HEADER, m.payload.to_vec(), fields));
            }
            out
        })
    }

    fn duplicates_possible(&self) -> bool {
        false
    }
}

/// RabbitMQ: a topic exchange and one durable queue bound to the destination (no other
/// routing key reaches a queue); reading takes the messages off the queue, so the target keeps
/// what it read.
pub struct RabbitTarget {
    port: u16,
    exchange: String,
    queue: String,
    read: Vec<ConsumedRecord>,
    rt: tokio::runtime::Runtime,
}

impl RabbitTarget {
    pub fn new(port: u16) -> Self {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let (exchange, queue) = (unique("outbox_x"), unique("outbox_q"));
        let target = RabbitTarget {
            port,
            exchange,
            queue,
            read: Vec::new(),
            rt,
        };
        target.rt.block_on(async {
            let (conn, ch) = rabbit_channel(target.port)
                .await
                .expect("connect to rabbitmq");
            rabbitmq_sink::exchange(&ch, &target.exchange, ExchangeKind::Topic).await;
            rabbitmq_sink::queue(&ch, &target.queue, &target.exchange, &target.destination()).await;
            conn.close(200, "declared".into()).await.expect("close");
        });
        target
    }

    /// The exchange walbox publishes to.
    pub fn exchange(&self) -> &str {
        &self.exchange
    }

    /// The queue bound to the destination.
    pub fn queue(&self) -> &str {
        &self.queue
    }
}

impl Target for RabbitTarget {
    fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "WALBOX_RABBITMQ_URL".into(),
                format!("amqp://guest@127.0.0.1:{}/%2f", self.port),
            ),
            ("WALBOX_RABBITMQ_PASSWORD".into(), "guest".into()),
            ("WALBOX_RABBITMQ_EXCHANGE".into(), self.exchange.clone()),
        ]
    }

    fn destination(&self) -> String {
        "orders".into()
    }

    fn read_all(&mut self) -> Vec<ConsumedRecord> {
        let taken = self
            .rt
            .block_on(drain_rabbit_queue(self.port, &self.queue))
            .expect("drain the queue");
        self.read.extend(taken);
        self.read.clone()
    }

    fn duplicates_possible(&self) -> bool {
        true
    }
}

#[test]
fn redis_sigkill_loop_loses_nothing_and_duplicates_nothing() {
    let Some(server) = redis() else { return };
    sigkill_loop(&mut RedisTarget::new(server.url()), "redis_kills");
}

#[test]
fn nats_sigkill_loop_loses_nothing_and_duplicates_nothing() {
    let Some(server) = nats() else { return };
    sigkill_loop(&mut NatsTarget::new(server.url()), "nats_kills");
}

#[test]
fn rabbitmq_sigkill_loop_loses_nothing_and_keeps_commit_order() {
    let Some(node) = rabbitmq() else { return };
    sigkill_loop(&mut RabbitTarget::new(node.port()), "rabbit_kills");
}

#[test]
fn redis_restart_during_a_backlog_loses_nothing() {
    let Some(mut server) = own_redis(RedisOptions {
        appendonly: true,
        ..Default::default()
    }) else {
        return;
    };
    let mut target = RedisTarget::new(server.url());
    restart_during_backlog(
        &mut target,
        &mut || server.restart().expect("restart redis"),
        "redis_restart",
    );
}

#[test]
fn nats_restart_during_a_backlog_loses_nothing() {
    let Some(mut server) = own_nats(NatsOptions::default()) else {
        return;
    };
    let mut target = NatsTarget::new(server.url());
    restart_during_backlog(
        &mut target,
        &mut || server.restart().expect("restart nats"),
        "nats_restart",
    );
}

#[test]
fn rabbitmq_restart_during_a_backlog_loses_nothing() {
    let Some(mut node) = own_rabbitmq(RabbitMqOptions::default()) else {
        return;
    };
    let mut target = RabbitTarget::new(node.port());
    restart_during_backlog(
        &mut target,
        &mut || node.restart().expect("restart rabbitmq"),
        "rabbit_restart",
    );
}

/// `walbox demo --broker …`: the demonstration runs end to end on each broker, and what it
/// reads back is every event, the rolled-back one absent.
#[test]
fn the_demo_runs_on_each_broker() {
    for (broker, present) in [
        ("kafka", true),
        ("redis", redis().is_some()),
        ("nats", nats().is_some()),
        ("rabbitmq", rabbitmq().is_some()),
    ] {
        if !present {
            continue;
        }
        let out = crate::support::walbox_output(
            &[
                "demo",
                "--broker",
                broker,
                "--aggregates",
                "3",
                "--events",
                "2",
            ],
            &[],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{broker}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rows = stdout.lines().filter(|l| l.contains("\"round\"")).count();
        assert_eq!(rows, 6, "{broker}: {stdout}");
        assert!(!stdout.contains("rolled_back"), "{broker}: {stdout}");
        assert!(
            stdout.contains("walbox stopped cleanly"),
            "{broker}: {stdout}"
        );
    }
}
