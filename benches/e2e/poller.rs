//! The polling relay from the seeds, implemented faithfully for comparison.
//!
//! One loop iteration (`pollOnce` in the seed article) is one transaction: `SELECT id, topic,
//! aggregate_id, payload FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT 100 FOR UPDATE
//! SKIP LOCKED`, produce the batch keyed by `aggregate_id`, wait for every acknowledgement
//! (idempotent producer, `acks=all`, like franz-go's `ProduceSync` defaults; `linger.ms=0`, also
//! franz-go's default and the most favourable setting for a loop that waits for its acks), then
//! `UPDATE outbox SET published_at = now() WHERE id = ANY($1)` and `COMMIT`. The table has the
//! seeds' partial index `(id) WHERE published_at IS NULL`. Records also carry an `id` header (the
//! seeds put the event id in the envelope) so the latency probe can match them.
//!
//! Backlog drain polls back to back until a poll finds nothing. With a poll interval, every tick
//! polls batches until one comes back smaller than 100 (the seeds' ticker loop, which otherwise
//! could not keep up with more than 100 events per tick).

use std::time::Duration;

use anyhow::{bail, Context};
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::sync::watch;
use tokio_postgres::types::{FromSql, Type};
use tokio_postgres::{Client, NoTls, Statement};

/// Rows per poll, as in the seeds.
pub const BATCH: usize = 100;

/// A column's raw text bytes: jsonb without its version byte, as pgx hands a payload to the seeds.
struct RawText(Vec<u8>);

impl<'a> FromSql<'a> for RawText {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let body = if *ty == Type::JSONB {
            raw.get(1..).unwrap_or_default()
        } else {
            raw
        };
        Ok(RawText(body.to_vec()))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// The polling relay: one connection, one producer.
pub struct Poller {
    client: Client,
    producer: FutureProducer,
    select: Statement,
    update: Statement,
}

impl Poller {
    /// Connects to PostgreSQL at `pg_url` and creates the producer for `brokers`.
    pub async fn connect(pg_url: &str, brokers: &str) -> anyhow::Result<Self> {
        let (client, conn) = tokio_postgres::connect(pg_url, NoTls)
            .await
            .context("poller: connecting to PostgreSQL")?;
        tokio::spawn(conn);
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "0")
            .set("partitioner", "murmur2_random")
            .create()
            .context("poller: creating the producer")?;
        let select = client
            .prepare(
                "SELECT id, topic, aggregate_id, payload FROM outbox WHERE published_at IS NULL \
                 ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED",
            )
            .await?;
        let update = client
            .prepare("UPDATE outbox SET published_at = now() WHERE id = ANY($1)")
            .await?;
        Ok(Poller {
            client,
            producer,
            select,
            update,
        })
    }

    /// One poll: select, produce, wait for acks, mark published, commit. Returns the row count.
    pub async fn poll_once(&mut self) -> anyhow::Result<usize> {
        let tx = self.client.transaction().await?;
        let rows = tx.query(&self.select, &[]).await?;
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(0);
        }
        let mut ids = Vec::with_capacity(rows.len());
        let mut deliveries = Vec::with_capacity(rows.len());
        for row in &rows {
            let id: i64 = row.get(0);
            let topic: &str = row.get(1);
            let key: &str = row.get(2);
            let payload: RawText = row.get(3);
            let id_text = id.to_string();
            let headers = OwnedHeaders::new().insert(Header {
                key: "id",
                value: Some(id_text.as_bytes()),
            });
            let record = FutureRecord::to(topic)
                .key(key)
                .payload(&payload.0)
                .headers(headers);
            match self.producer.send_result(record) {
                Ok(d) => deliveries.push(d),
                Err((e, _)) => bail!("poller: produce refused: {e}"),
            }
            ids.push(id);
        }
        for d in deliveries {
            match d.await {
                Ok(Ok(_)) => {}
                Ok(Err((e, _))) => bail!("poller: delivery failed: {e}"),
                Err(_) => bail!("poller: producer dropped a delivery"),
            }
        }
        tx.execute(&self.update, &[&ids]).await?;
        tx.commit().await?;
        Ok(rows.len())
    }

    /// Polls back to back until the table has no unpublished row; returns the rows published.
    pub async fn drain(&mut self) -> anyhow::Result<u64> {
        let mut total = 0;
        loop {
            match self.poll_once().await? {
                0 => return Ok(total),
                n => total += n as u64,
            }
        }
    }

    /// Polls every `interval` until `stop` turns true; returns the rows published.
    pub async fn run(
        &mut self,
        interval: Duration,
        mut stop: watch::Receiver<bool>,
    ) -> anyhow::Result<u64> {
        let mut tick = tokio::time::interval(interval);
        let mut total = 0;
        loop {
            tokio::select! {
                _ = stop.changed() => return Ok(total),
                _ = tick.tick() => {
                    loop {
                        let n = self.poll_once().await?;
                        total += n as u64;
                        if n < BATCH {
                            break;
                        }
                    }
                }
            }
        }
    }

    /// Makes this backend flush its table statistics when it next goes idle.
    pub async fn flush_stats(&self) -> anyhow::Result<()> {
        self.client
            .batch_execute("SELECT pg_stat_force_next_flush()")
            .await?;
        Ok(())
    }
}
