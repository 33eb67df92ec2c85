//! Live latency: inserts at a fixed rate while a relay runs, and a consumer that notes when each
//! event arrives. Latency = time the consumer received the record − time the inserting
//! transaction's COMMIT returned to the inserter (both on this process's monotonic clock), so it
//! includes the relay, the broker's acknowledgement and a consumer fetch (`fetch.wait.max.ms=1`):
//! an upper bound of commit → broker ack. Shared by the e2e bench (the seeds' table, events
//! matched by their `id` header) and the Debezium bench (Debezium's table, matched by key).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio_postgres::NoTls;

/// Connections the inserters use.
const INSERTERS: u64 = 4;

/// The seeds' ~200-byte JSON payload for order `n`.
pub fn payload(n: i64) -> String {
    format!(
        r#"{{"order_id": {n}, "customer_id": "cust-{}", "amount": 129.99, "status": "CREATED", "items": [{{"sku": "SKU-000123", "qty": 2, "price": 49.99}}, {{"sku": "SKU-000456", "qty": 1, "price": 30.01}}]}}"#,
        n % 100_000
    )
}

/// The seeds' insert: `$1` aggregate id, `$2` topic, `$3` payload; returns the row's id.
const SEED_INSERT: &str = "INSERT INTO outbox (aggregate_id, topic, event_type, payload) \
                           VALUES ($1, $2, 'OrderCreated', $3::text::jsonb) RETURNING id";

/// Inserts one-row transactions into the seeds' `outbox` (topic `topic`) at `rate` rows/s for
/// `duration`, over [`INSERTERS`] connections; returns `(id, commit returned)` per row.
pub async fn insert_at_rate(
    pg_url: &str,
    topic: &str,
    rate: u64,
    duration: Duration,
) -> anyhow::Result<Vec<(i64, Instant)>> {
    insert_at_rate_with(pg_url, SEED_INSERT, topic, rate, duration).await
}

/// [`insert_at_rate`] with another statement `insert`: its parameters are the aggregate id
/// (`order-<n>`), the topic (or routing value) and the payload, as text; it returns the bigint
/// the consumer side matches the record by.
pub async fn insert_at_rate_with(
    pg_url: &str,
    insert: &str,
    topic: &str,
    rate: u64,
    duration: Duration,
) -> anyhow::Result<Vec<(i64, Instant)>> {
    let mut tasks = Vec::new();
    let start = Instant::now();
    for c in 0..INSERTERS {
        let (client, conn) = tokio_postgres::connect(pg_url, NoTls)
            .await
            .context("inserter: connecting")?;
        tokio::spawn(conn);
        let topic = topic.to_owned();
        let insert = insert.to_owned();
        let per_conn = rate as f64 / INSERTERS as f64;
        tasks.push(tokio::spawn(async move {
            let stmt = client.prepare(&insert).await?;
            let mut out = Vec::with_capacity((per_conn * duration.as_secs_f64()) as usize + 1);
            let mut sent: u64 = 0;
            loop {
                let elapsed = start.elapsed();
                if elapsed >= duration {
                    return Ok::<_, anyhow::Error>(out);
                }
                let due = (elapsed.as_secs_f64() * per_conn) as u64;
                while sent < due {
                    let n = (sent * INSERTERS + c) as i64;
                    let row = client
                        .query_one(&stmt, &[&format!("order-{n}"), &topic, &payload(n)])
                        .await?;
                    out.push((row.get::<_, i64>(0), Instant::now()));
                    sent += 1;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(all)
}

/// A consumer thread recording `(id header, received)` for every record of one topic.
pub struct Receiver {
    stop: Arc<AtomicBool>,
    count: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<anyhow::Result<Vec<(i64, Instant)>>>,
}

/// What a record's id is read from.
pub type IdOf = fn(&BorrowedMessage<'_>) -> Option<i64>;

/// The record's `id` header, walbox's event id for the seeds' table.
pub fn id_header(m: &BorrowedMessage<'_>) -> Option<i64> {
    m.headers()
        .and_then(|h| h.iter().find(|x| x.key == "id"))
        .and_then(|x| x.value)
        .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
}

impl Receiver {
    /// Starts reading all `partitions` of `topic` from the beginning, records identified by
    /// their `id` header.
    pub fn start(bootstrap: &str, topic: &str, partitions: i32) -> anyhow::Result<Self> {
        Receiver::start_with(bootstrap, topic, partitions, id_header)
    }

    /// [`Receiver::start`], records identified by `id_of`.
    pub fn start_with(
        bootstrap: &str,
        topic: &str,
        partitions: i32,
        id_of: IdOf,
    ) -> anyhow::Result<Self> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "walbox-bench")
            .set("enable.auto.commit", "false")
            // The same consumer for every relay and mode: read_committed (librdkafka's default,
            // stated) sees at-least-once records at once and exactly-once ones at their commit.
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "1")
            .set("fetch.min.bytes", "1")
            .set("fetch.error.backoff.ms", "10")
            .set("fetch.queue.backoff.ms", "1")
            .create()?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
        }
        consumer.assign(&tpl)?;
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicUsize::new(0));
        let (s, c) = (stop.clone(), count.clone());
        let thread = std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !s.load(Ordering::Relaxed) {
                match consumer.poll(Duration::from_millis(20)) {
                    Some(Ok(m)) => {
                        let now = Instant::now();
                        if let Some(id) = id_of(&m) {
                            seen.push((id, now));
                            c.store(seen.len(), Ordering::Relaxed);
                        }
                    }
                    Some(Err(e)) => eprintln!("bench consumer: {e}"),
                    None => {}
                }
            }
            Ok(seen)
        });
        Ok(Receiver {
            stop,
            count,
            thread,
        })
    }

    /// Waits until `expected` records arrived (or `timeout`), then stops and returns them.
    pub async fn finish(
        self,
        expected: usize,
        timeout: Duration,
    ) -> anyhow::Result<Vec<(i64, Instant)>> {
        let deadline = Instant::now() + timeout;
        while self.count.load(Ordering::Relaxed) < expected && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join())
            .await?
            .map_err(|_| anyhow::anyhow!("bench consumer panicked"))?
    }
}

/// Latency summary of one live run.
#[derive(Debug, Clone, Default)]
pub struct Latency {
    /// Rows inserted per second, achieved.
    pub achieved_rate: f64,
    /// Rows inserted.
    pub inserted: usize,
    /// Rows whose record the consumer received.
    pub received: usize,
    /// Median.
    pub p50: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Maximum.
    pub max: Duration,
}

/// Joins commits and receipts by id.
pub fn latency(
    commits: &[(i64, Instant)],
    received: &[(i64, Instant)],
    duration: Duration,
) -> Latency {
    let arrived: std::collections::HashMap<i64, Instant> = received.iter().copied().collect();
    let mut lat: Vec<Duration> = commits
        .iter()
        .filter_map(|(id, t)| arrived.get(id).map(|r| r.saturating_duration_since(*t)))
        .collect();
    lat.sort();
    let pick = |q: f64| {
        lat.get(((lat.len() as f64 * q).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or_default()
    };
    Latency {
        achieved_rate: commits.len() as f64 / duration.as_secs_f64(),
        inserted: commits.len(),
        received: lat.len(),
        p50: pick(0.50),
        p99: pick(0.99),
        max: lat.last().copied().unwrap_or_default(),
    }
}
