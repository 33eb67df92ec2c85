//! walbox and Debezium side by side: the same outbox backlog drained, and the same live load
//! relayed, by walbox (`compat = "debezium"`) and by Kafka Connect standalone with the Debezium
//! PostgreSQL connector and its Outbox Event Router, in one run, against one PostgreSQL cluster
//! and one Apache Kafka broker.
//!
//! `cargo bench --bench debezium` builds the `walbox` binary and this bench, then:
//! 1. starts a private PostgreSQL cluster (`wal_level=logical`, the sandbox's `fsync=off`) with
//!    Debezium's outbox table and a publication for it, and a single-node Apache Kafka broker
//!    ([`walbox::sandbox::kafka`]); both relays reach PostgreSQL over TCP on 127.0.0.1
//!    (SCRAM, no TLS) and the broker over PLAINTEXT on 127.0.0.1;
//! 2. backlog drain, 100-row and 1-row transactions: N rows loaded behind slots created at one
//!    LSN, one per drain; each drain starts the relay on its slot, routing to topics of its
//!    own, and ends when the topics' end offsets (high watermarks, polled every 10 ms) sum to N:
//!    the relay is measured, not a consumer. Pairs of drains, walbox first then Debezium
//!    first, alternate (`WALBOX_BENCH_PAIRS`, default 2 pairs);
//! 3. live latency: per relay, a fresh slot and one process; rows inserted at 1,000 and 5,000
//!    one-row transactions per second; a consumer of the broker notes when each record
//!    arrives (`live.rs`, shared with the e2e bench).
//!
//! Per drain: events/s from the first event in Kafka to the last (and from the process's
//! start), the relay process's CPU seconds per 100k events over the same span (and its CPU
//! until the first event: start-up), the CPU of the walsender serving its slot, the relay's
//! peak RSS (`VmHWM`), and the time from spawning the process to the first event in Kafka.
//!
//! Prints one markdown table (also written to `benches/debezium-results.md` or
//! `WALBOX_BENCH_OUTPUT`). Nothing is asserted.
//!
//! Environment: `WALBOX_BENCH_ROWS` (N, default 100,000), `WALBOX_BENCH_PAIRS` (default 2),
//! `WALBOX_BENCH_LIVE_SECS` (default 20), `WALBOX_BENCH_RATES` (default `1000,5000`),
//! `WALBOX_BENCH_OUTPUT`, `WALBOX_BENCH_WALBOX_LOG`, `WALBOX_BENCH_WALBOX_ENV` (more `WALBOX_*`
//! settings for walbox, `K=V;K=V`), `WALBOX_BENCH_DEBEZIUM_PROPS` (more connector properties,
//! `k=v;k=v`), `WALBOX_BENCH_WALBOX_SOCKET=1` (walbox over the Unix socket: a diagnosis),
//! `WALBOX_DEBEZIUM_VERSION`,
//! `WALBOX_KAFKA_VERSION`.

#[path = "../common/backlog.rs"]
mod backlog;
mod drain;
// Shared with the e2e bench, which uses the rest of it.
#[allow(dead_code)]
#[path = "../common/format.rs"]
mod format;
#[path = "../common/harness.rs"]
mod harness;
// Shared with the e2e bench, which uses the rest of it.
#[allow(dead_code)]
#[path = "../common/live.rs"]
mod live;
// Shared with the e2e bench, which uses the rest of it.
#[allow(dead_code)]
#[path = "../common/procs.rs"]
mod procs;
mod relay;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_postgres::{Client, NoTls};
use walbox::sandbox::broker::Broker;
use walbox::sandbox::kafka::{KafkaServer, KafkaServerOptions};
use walbox::sandbox::postgres::PgCluster;

use relay::Which;
use report::Report;

/// The bench database.
pub const DATABASE: &str = "bench";
/// The publication both relays read (the outbox table, inserts only).
pub const PUBLICATION: &str = "bench_outbox";
/// Partitions of every topic.
pub const PARTITIONS: i32 = 4;

/// Debezium's outbox table (its documentation's columns), the publication, and a loader.
const SCHEMA: &str = r#"
CREATE TABLE outbox (
    id            uuid         PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb
) WITH (autovacuum_enabled = false);
CREATE PUBLICATION bench_outbox FOR TABLE outbox WITH (publish = 'insert');
CREATE PROCEDURE bench_load(total bigint, per_tx bigint) LANGUAGE plpgsql AS $$
DECLARE done bigint := 0; k bigint;
BEGIN
  WHILE done < total LOOP
    k := least(per_tx, total - done);
    INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
    SELECT gen_random_uuid(), 'orders', 'order-' || n, 'OrderCreated',
           format('{"order_id": %s, "customer_id": "cust-%s", "amount": 129.99, "status": "CREATED", "items": [{"sku": "SKU-000123", "qty": 2, "price": 49.99}, {"sku": "SKU-000456", "qty": 1, "price": 30.01}]}', n, n % 100000)::jsonb
    FROM generate_series(done + 1, done + k) n;
    done := done + k;
    COMMIT;
  END LOOP;
END $$;
"#;

/// The live runs' insert (see [`live::insert_at_rate_with`]): the aggregate id `order-<n>`
/// is the record's key for both relays, and `n` what the consumer matches it by.
const LIVE_INSERT: &str = "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
                           VALUES (gen_random_uuid(), $2, $1, 'OrderCreated', $3::text::jsonb) \
                           RETURNING substr(aggregateid, 7)::bigint";

/// The live runs' record id: `n` of the key `order-<n>`.
fn key_id(m: &rdkafka::message::BorrowedMessage<'_>) -> Option<i64> {
    use rdkafka::Message;
    std::str::from_utf8(m.key()?)
        .ok()?
        .strip_prefix("order-")?
        .parse()
        .ok()
}

/// What to run, from the environment.
#[derive(Debug, Clone)]
pub struct Settings {
    rows: u64,
    pairs: u32,
    live: Duration,
    rates: Vec<u64>,
    output: PathBuf,
    /// More `WALBOX_*` variables for walbox (`WALBOX_BENCH_WALBOX_ENV`, `K=V;K=V`).
    walbox_env: Vec<(String, String)>,
    /// More connector properties for Debezium (`WALBOX_BENCH_DEBEZIUM_PROPS`, `k=v;k=v`).
    debezium_props: Vec<(String, String)>,
    /// walbox over the Unix socket instead of TCP (`WALBOX_BENCH_WALBOX_SOCKET=1`; a diagnosis,
    /// the two relays then use different transports).
    walbox_socket: bool,
}

impl Settings {
    fn from_env() -> anyhow::Result<Self> {
        use harness::{num, var};
        Ok(Settings {
            rows: num("WALBOX_BENCH_ROWS", 100_000)?,
            pairs: num("WALBOX_BENCH_PAIRS", 2u32)?.max(1),
            live: Duration::from_secs(num("WALBOX_BENCH_LIVE_SECS", 20)?),
            rates: harness::list("WALBOX_BENCH_RATES", vec![1_000, 5_000])?,
            output: var("WALBOX_BENCH_OUTPUT").map_or_else(
                || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/debezium-results.md"),
                PathBuf::from,
            ),
            walbox_env: harness::assignments("WALBOX_BENCH_WALBOX_ENV")?,
            debezium_props: harness::assignments("WALBOX_BENCH_DEBEZIUM_PROPS")?,
            walbox_socket: var("WALBOX_BENCH_WALBOX_SOCKET").is_some_and(|v| v != "0"),
        })
    }
}

fn main() -> ExitCode {
    harness::main_with("debezium", run)
}

/// The bench's handle on the cluster, the broker and an admin connection.
pub struct Bench {
    settings: Settings,
    cluster: PgCluster,
    kafka: KafkaServer,
    broker: Broker,
    admin: Client,
}

async fn run() -> anyhow::Result<()> {
    let settings = Settings::from_env()?;
    let started = Instant::now();
    eprintln!("debezium bench: {settings:?}");
    walbox::sandbox::debezium::installed()?;
    let cluster = harness::bench_cluster(
        &[("max_wal_size", "4GB"), ("max_slot_wal_keep_size", "-1")],
        &[SCHEMA],
    )
    .await?;
    let (admin, conn) = tokio_postgres::connect(&cluster.socket_url(DATABASE), NoTls).await?;
    tokio::spawn(conn);
    let kafka = tokio::task::spawn_blocking(|| {
        KafkaServer::start(KafkaServerOptions {
            watchdog: true,
            ..Default::default()
        })
    })
    .await?
    .context("starting Apache Kafka (scripts/install-deps.sh installs it)")?;
    let broker = Broker::External(kafka.bootstrap_servers());
    tokio::task::block_in_place(|| broker.create_topic(walbox::config::DEFAULT_PROGRESS_TOPIC, 1))?;
    let bench = Bench {
        settings,
        cluster,
        kafka,
        broker,
        admin,
    };
    let mut report = Report::new(&bench.settings);
    report.pg_version = bench
        .admin
        .query_one("SELECT version()", &[])
        .await?
        .get::<_, String>(0);

    for per_tx in [100, 1] {
        let drains = bench.drain_pairs(per_tx).await?;
        report.drains(per_tx, &drains);
    }
    for which in [Which::Walbox, Which::Debezium] {
        for (rate, lat) in bench.live(which).await? {
            report.live(which, rate, &lat);
        }
    }

    report.elapsed = started.elapsed();
    harness::publish("debezium", &bench.settings.output, &report.render())?;
    Ok(())
}

impl Bench {
    /// Creates `topic` with [`PARTITIONS`] partitions (off the runtime: the admin call blocks).
    fn create_topic(&self, topic: &str) -> anyhow::Result<()> {
        Ok(tokio::task::block_in_place(|| {
            self.broker.create_topic(topic, PARTITIONS)
        })?)
    }

    /// Drops every replication slot.
    async fn drop_slots(&self) -> anyhow::Result<()> {
        self.admin
            .batch_execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots")
            .await?;
        Ok(())
    }

    /// The pid of the walsender holding `slot`, once one does.
    async fn walsender(&self, slot: &str) -> anyhow::Result<Option<u32>> {
        let row = self
            .admin
            .query_opt(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await?;
        Ok(row
            .and_then(|r| r.get::<_, Option<i32>>(0))
            .and_then(|p| u32::try_from(p).ok()))
    }

    /// Whether `slot` streams (its walsender is past start-up).
    async fn streaming(&self, slot: &str) -> anyhow::Result<bool> {
        let row = self
            .admin
            .query_opt(
                "SELECT r.state FROM pg_replication_slots s \
                 JOIN pg_stat_replication r ON r.pid = s.active_pid \
                 WHERE s.slot_name = $1",
                &[&slot],
            )
            .await?;
        Ok(row.is_some_and(|r| {
            matches!(
                r.get::<_, Option<String>>(0).as_deref(),
                Some("streaming" | "catchup")
            )
        }))
    }

    /// Per relay: a fresh slot, the relay started on it and streaming, then one live run per
    /// rate into a topic of its own; the relay's latencies by rate.
    async fn live(&self, which: Which) -> anyhow::Result<Vec<(u64, live::Latency)>> {
        self.admin.batch_execute("TRUNCATE outbox").await?;
        let slot = format!("live_{}", which.name().to_lowercase());
        self.admin
            .execute(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                &[&slot],
            )
            .await?;
        let rates = self.settings.rates.clone();
        for rate in &rates {
            self.create_topic(&which.topic("live", &format!("r{rate}")))?;
        }
        let bootstrap = self.kafka.bootstrap_servers();
        let (mut relay, _) = relay::Relay::spawn(
            which,
            &self.cluster,
            &bootstrap,
            &slot,
            "live",
            &self.settings,
        )?;
        let deadline = Instant::now() + Duration::from_secs(180);
        while !self.streaming(&slot).await? {
            relay.check_alive()?;
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} did not stream from {slot} within 180 s",
                which.name()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut runs = Vec::new();
        for rate in rates {
            let topic = which.topic("live", &format!("r{rate}"));
            let receiver = live::Receiver::start_with(&bootstrap, &topic, PARTITIONS, key_id)?;
            // Let the consumer finish its start-up so its warm-up is not counted as latency.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let commits = live::insert_at_rate_with(
                &self.cluster.url(DATABASE),
                LIVE_INSERT,
                &format!("r{rate}"),
                rate,
                self.settings.live,
            )
            .await?;
            let received = receiver
                .finish(commits.len(), Duration::from_secs(60))
                .await?;
            let lat = live::latency(&commits, &received, self.settings.live);
            eprintln!("live {} at {rate}/s: {lat:?}", which.name());
            runs.push((rate, lat));
        }
        relay.stop()?;
        self.drop_slots().await?;
        Ok(runs)
    }
}
