//! End-to-end benchmark: walbox against PostgreSQL's own limit (`pg_recvlogical`) and against the
//! seeds' polling relay, in one run, on a throwaway cluster and broker (issue 5).
//!
//! `cargo bench --bench e2e` builds the `walbox` binary and this bench, then:
//! 1. starts a private PostgreSQL cluster (`wal_level=logical`, `shared_buffers=1GB`, and the
//!    sandbox's `fsync=off`) with the seeds' outbox table, partial index and a publication, and
//!    librdkafka's mock Kafka cluster in a child process (or `WALBOX_BENCH_KAFKA_BROKERS`);
//! 2. backlog drain, 100-row and 1-row transactions: N rows loaded behind slots created at
//!    the same LSN; `pg_recvlogical` drains one to `/dev/null`, the walbox binary (a child
//!    process) another, until every event is acked and `confirmed_flush_lsn` passed the end;
//!    the pair runs 4 times on slots of the same backlog, in alternating order;
//! 3. the seeds' polling relay drains the same N rows to the same broker;
//! 4. walbox's peak RSS on a 5×N-row backlog and on one N-row transaction;
//! 5. live latency at fixed insert rates for walbox and the polling relay (100 ms and 1 s);
//! 6. the primary's PostgreSQL CPU per 100k events with walbox decoding on the primary and on
//!    a physical standby (PostgreSQL 16+, a separate pair of clusters; see `standby.rs`);
//! 7. the producer's floor: walbox's producer alone on as many events, flat out and paced at
//!    walbox's drain rate (`floor.rs`);
//! 8. scaling through shards: the backlogs drained through 1, 2 and 4 shards by walbox and by
//!    as many `pg_recvlogical` processes, the hash-partitioned alternative, and the cost model
//!    fitted to them (`shards.rs`);
//! 9. exactly-once against at-least-once: walbox drains one N-row backlog (100-row
//!    transactions) in both modes, 4 times in alternating order (`eos-drain`);
//!
//! and prints one markdown table (also written to `benches/results.md` or
//! `WALBOX_BENCH_OUTPUT`). Nothing is asserted: targets are reported, never enforced.
//!
//! Environment: `WALBOX_BENCH_ROWS` (N, default 1,000,000), `WALBOX_BENCH_QUICK=1` (N = 20,000,
//! 5 s live runs), `WALBOX_BENCH_LIVE_SECS` (default 30), `WALBOX_BENCH_RATES` (default
//! `1000,5000,20000`), `WALBOX_BENCH_BIG_ROWS` (default 5×N), `WALBOX_BENCH_STANDBY_ROWS`
//! (default N, at least 100,000), `WALBOX_BENCH_STANDBY_PG` (default 16), `WALBOX_BENCH_OUTPUT`,
//! `WALBOX_BENCH_KAFKA_BROKERS`, `WALBOX_BENCH_WALBOX_LOG` (walbox's log filter, default warn),
//! `WALBOX_BENCH_LINGER_MS` (the live runs again with this `linger.ms`, default 1; `off`),
//! `WALBOX_BENCH_EOS_LINGER_MS` and `WALBOX_BENCH_EOS_INTERVAL` (the exactly-once runs'
//! `linger.ms` and `kafka.transaction_interval`, default walbox's),
//! `WALBOX_BENCH_SECTIONS` (a comma list of `drain`, `eos-drain`, `scaling`, `memory`, `live`,
//! `live-eos`, `live-poll`, `standby`; default all: a partial run's table has only those rows),
//! `WALBOX_BENCH_KAFKA` (`mock`, the default, or `apache`: a single-node Apache Kafka broker
//! from `scripts/install-deps.sh`'s cache instead of the mock cluster).

#[path = "../common/backlog.rs"]
mod backlog;
mod broker;
mod drain;
mod floor;
#[path = "../common/format.rs"]
mod format;
#[path = "../common/harness.rs"]
mod harness;
#[path = "../common/live.rs"]
mod live;
mod poller;
#[path = "../common/procs.rs"]
mod procs;
mod report;
mod shards;
mod standby;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::bail;
use tokio::sync::watch;
use tokio_postgres::{Client, NoTls};

use walbox::lsn::Lsn;
use walbox::sandbox::postgres::PgCluster;

use broker::BenchBroker;
use format::fmt_n;
use procs::WalboxChild;
use report::Report;

/// What turns exactly-once mode on (default transaction bounds), with
/// `WALBOX_BENCH_EOS_LINGER_MS` as its producer's `linger.ms` and `WALBOX_BENCH_EOS_INTERVAL`
/// as `kafka.transaction_interval` when set.
fn exactly_once() -> Vec<(&'static str, String)> {
    let mut vars = vec![("WALBOX_KAFKA_EXACTLY_ONCE", "true".to_owned())];
    if let Ok(linger) = std::env::var("WALBOX_BENCH_EOS_LINGER_MS") {
        vars.push(("WALBOX_KAFKA_PROPERTY_LINGER_MS", linger));
    }
    if let Ok(interval) = std::env::var("WALBOX_BENCH_EOS_INTERVAL") {
        vars.push(("WALBOX_KAFKA_TRANSACTION_INTERVAL", interval));
    }
    vars
}

/// Partitions of every topic.
const PARTITIONS: i32 = 4;
/// The publication walbox and pg_recvlogical read.
const PUBLICATION: &str = "walbox_bench";

/// The seeds' outbox table (seed 000), its partial index, and a loader procedure.
const SCHEMA: &str = r#"
CREATE TABLE outbox (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    aggregate_id  text        NOT NULL,
    topic         text        NOT NULL,
    event_type    text        NOT NULL,
    payload       jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz,
    retry_count   int         NOT NULL DEFAULT 0
) WITH (autovacuum_enabled = false);
CREATE INDEX outbox_unpublished_idx ON outbox (id) WHERE published_at IS NULL;
CREATE PUBLICATION walbox_bench FOR TABLE outbox WITH (publish = 'insert');
CREATE PROCEDURE bench_load(total bigint, per_tx bigint) LANGUAGE plpgsql AS $$
DECLARE done bigint := 0; k bigint;
BEGIN
  WHILE done < total LOOP
    k := least(per_tx, total - done);
    INSERT INTO outbox (aggregate_id, topic, event_type, payload)
    SELECT 'order-' || n, 'orders', 'OrderCreated',
           format('{"order_id": %s, "customer_id": "cust-%s", "amount": 129.99, "status": "CREATED", "items": [{"sku": "SKU-000123", "qty": 2, "price": 49.99}, {"sku": "SKU-000456", "qty": 1, "price": 30.01}]}', n, n % 100000)::jsonb
    FROM generate_series(done + 1, done + k) n;
    done := done + k;
    COMMIT;
  END LOOP;
END $$;
"#;

/// What to run, from the environment.
#[derive(Debug, Clone)]
struct Settings {
    rows: u64,
    big_rows: u64,
    standby_rows: u64,
    live: Duration,
    rates: Vec<u64>,
    quick: bool,
    output: PathBuf,
    sections: Option<Vec<String>>,
}

impl Settings {
    /// Reads the `WALBOX_BENCH_*` variables.
    fn from_env() -> anyhow::Result<Self> {
        use harness::{num, var};
        let quick = var("WALBOX_BENCH_QUICK").is_some_and(|v| v != "0");
        let rows = num("WALBOX_BENCH_ROWS", if quick { 20_000 } else { 1_000_000 })?;
        let rates = harness::list("WALBOX_BENCH_RATES", vec![1_000, 5_000, 20_000])?;
        Ok(Settings {
            rows,
            big_rows: num("WALBOX_BENCH_BIG_ROWS", rows * 5)?,
            standby_rows: num("WALBOX_BENCH_STANDBY_ROWS", rows.max(100_000))?,
            live: Duration::from_secs(num("WALBOX_BENCH_LIVE_SECS", if quick { 5 } else { 30 })?),
            rates,
            quick,
            sections: var("WALBOX_BENCH_SECTIONS")
                .map(|v| v.split(',').map(|s| s.trim().to_owned()).collect()),
            output: var("WALBOX_BENCH_OUTPUT").map_or_else(
                || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/results.md"),
                PathBuf::from,
            ),
        })
    }

    /// Whether `section` is part of this run (`WALBOX_BENCH_SECTIONS`).
    fn runs(&self, section: &str) -> bool {
        self.sections
            .as_ref()
            .is_none_or(|list| list.iter().any(|s| s == section))
    }
}

fn main() -> ExitCode {
    if std::env::args().any(|a| a == broker::HOST_ARG) {
        broker::host_main();
    }
    if std::env::args().nth(1).as_deref() == Some(floor::FLOOR_ARG) {
        floor::child_main();
    }
    harness::main_with("e2e", run)
}

/// The bench's handle on the cluster, the broker and an admin connection.
struct Bench {
    settings: Settings,
    cluster: PgCluster,
    broker: BenchBroker,
    admin: Client,
    url: String,
}

/// One drain's measurements.
#[derive(Debug, Clone, Default)]
struct Drain {
    events: u64,
    /// Start → every event acknowledged (for pg_recvlogical: → exit).
    acked: Duration,
    /// Start → acknowledged and `confirmed_flush_lsn` past the end.
    confirmed: Duration,
    /// CPU seconds of all PostgreSQL server processes during the drain.
    pg_cpu: f64,
    /// CPU seconds of the relay itself (walbox or pg_recvlogical).
    relay_cpu: Option<f64>,
    /// Peak RSS of the relay process.
    peak_rss: Option<u64>,
    /// WAL written during the drain.
    wal_bytes: u64,
    /// `n_dead_tup` of the outbox table added during the drain.
    dead_tuples: i64,
}

/// A walbox process's threads (the most it had) and context switches (voluntary and
/// involuntary, summed over its threads) over a drain.
#[derive(Debug, Clone, Copy, Default)]
struct Switches {
    threads: u64,
    switches: u64,
}

impl Drain {
    /// Events per second over `confirmed`.
    fn rate(&self) -> f64 {
        self.events as f64 / self.confirmed.as_secs_f64()
    }
}

async fn run() -> anyhow::Result<()> {
    let settings = Settings::from_env()?;
    let started = Instant::now();
    eprintln!("e2e bench: {settings:?}");
    let cluster = harness::bench_cluster(
        &[
            ("shared_buffers", "1GB"),
            ("max_wal_size", "4GB"),
            ("max_slot_wal_keep_size", "-1"),
        ],
        &[SCHEMA],
    )
    .await?;
    let url = cluster.socket_url("bench");
    let (admin, conn) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(conn);
    let mut broker = BenchBroker::start()?;
    broker.create_topic("orders", PARTITIONS)?;
    let mut bench = Bench {
        settings,
        cluster,
        broker,
        admin,
        url,
    };
    let mut report = Report::new(&bench.settings, &bench.broker);
    report.pg_version = bench
        .admin
        .query_one("SELECT version()", &[])
        .await?
        .get::<_, String>(0);

    let n = bench.settings.rows;
    if bench.settings.runs("drain") {
        // 1. Backlog drain, 100-row transactions; then the polling relay on the same rows.
        let pair_slots = drain::pair_slots("100");
        let mut slots: Vec<&str> = pair_slots.iter().map(String::as_str).collect();
        slots.push("walbox_eos_100");
        let end = bench.backlog(&slots, n, 100).await?;
        let pairs = bench.drain_pairs("100", end, n).await?;
        let (wb, recv) = &pairs[0];
        report.drain("100-row tx", wb, recv);
        report.drain_pairs("100-row tx", bench.broker.is_mock(), &pairs);
        // The same backlog in exactly-once mode (Kafka transactions, default bounds).
        let eos = bench
            .drain_walbox_with("walbox_eos_100", end, n, &exactly_once())
            .await?;
        report.exactly_once_drain("100-row tx", &eos, wb, recv);
        bench.drop_slots().await?;
        let poll = bench.drain_poller(n).await?;
        report.poller(wb, &poll, recv);
        report.memory(&format!("{} -row backlog (100-row tx)", fmt_n(n)), wb);

        // 2. Backlog drain, 1-row transactions.
        let pair_slots = drain::pair_slots("1");
        let slots: Vec<&str> = pair_slots.iter().map(String::as_str).collect();
        let end = bench.backlog(&slots, n, 1).await?;
        let pairs1 = bench.drain_pairs("1", end, n).await?;
        let (wb1, recv1) = &pairs1[0];
        report.drain("1-row tx", wb1, recv1);
        report.drain_pairs("1-row tx", bench.broker.is_mock(), &pairs1);
        report.memory(&format!("{} -row backlog (1-row tx)", fmt_n(n)), wb1);
        bench.drop_slots().await?;
        // The producer alone, on the same number of events: the floor of walbox's relay CPU,
        // fed flat out and paced at walbox's 100-row drain rate.
        let brokers = bench.broker.bootstrap();
        let floor = floor::run(&brokers, n, None)?;
        let paced = floor::run(&brokers, n, Some(wb.rate()))?;
        let drains = [("100-row", wb, recv), ("1-row", wb1, recv1)];
        report.floor(&floor, &paced, &drains);
    }

    if bench.settings.runs("eos-drain") {
        // Exactly-once against at-least-once on one backlog, alternating pairs.
        let slots = drain::eos_pair_slots();
        let slots: Vec<&str> = slots.iter().map(String::as_str).collect();
        let end = bench.backlog(&slots, n, 100).await?;
        let pairs = bench.drain_eos_pairs(end, n, &exactly_once()).await?;
        report.exactly_once_pairs("100-row tx", &pairs);
        bench.drop_slots().await?;
    }

    if bench.settings.runs("scaling") {
        // Scaling: 1, 2 and 4 shards against as many pg_recvlogical processes, on the same
        // backlog each; and the hash-partitioned alternative at 4 shards.
        let runs = bench.scaling(n, 100).await?;
        let partitioned = bench.partitioned(n, 100).await?;
        report.scaling("100-row tx", &runs, &partitioned);
        let runs1 = bench.scaling(n, 1).await?;
        report.scaling_rows("1-row tx", &runs1);
        report.cost_model(&runs, &runs1);
    }

    if bench.settings.runs("memory") {
        // 3. Memory: a bigger backlog and one huge transaction.
        let big = bench.settings.big_rows;
        let end = bench.backlog(&["walbox_big"], big, 100).await?;
        let wb_big = bench.drain_walbox("walbox_big", end, big).await?;
        report.memory(
            &format!("{} -row backlog (100-row tx)", fmt_n(big)),
            &wb_big,
        );
        bench.drop_slots().await?;
        let end = bench.backlog(&["walbox_one"], n, n).await?;
        let wb_one = bench.drain_walbox("walbox_one", end, n).await?;
        report.memory(&format!("one {} -row transaction", fmt_n(n)), &wb_one);
        bench.drop_slots().await?;
    }

    if bench.settings.runs("live") {
        // 4. Live latency.
        for run in bench.live_walbox("walbox_live", &[]).await? {
            report.live("walbox", run.rate, &run.lat, Some(run.p99));
        }
        // The same runs with another linger.ms (`WALBOX_BENCH_LINGER_MS`, default 1; "off" skips
        // them): how much of the latency is the producer's wait for a fuller batch.
        let linger = std::env::var("WALBOX_BENCH_LINGER_MS").unwrap_or_else(|_| "1".into());
        if linger != "off" {
            let extra = [("WALBOX_KAFKA_PROPERTY_LINGER_MS", linger.clone())];
            for run in bench.live_walbox("walbox_live_linger", &extra).await? {
                let name = match run.p99 {
                    Some(h) => format!(
                        "walbox, linger.ms = {linger} (walbox_commit_to_ack_seconds p99 ≤ {} ms)",
                        h * 1000.0
                    ),
                    None => format!("walbox, linger.ms = {linger}"),
                };
                report.live(&name, run.rate, &run.lat, None);
            }
        }
    }
    if bench.settings.runs("live-eos") {
        // Exactly-once: a consumer sees a record once its Kafka transaction commits (on the mock
        // cluster, which has no transaction markers, as soon as it is written; walbox's commit →
        // confirmed histogram then gives the commit → Kafka commit time).
        for run in bench
            .live_walbox("walbox_live_eos", &exactly_once())
            .await?
        {
            // Where a Kafka transaction's time goes: walbox's mean per step, and how many
            // transactions each step kept over 10 ms (librdkafka's 20 ms retry of a refused
            // AddPartitionsToTxn shows there) and over 25 ms.
            let steps: Vec<String> = run
                .steps
                .iter()
                .map(|(step, ms)| format!("{step} {ms:.1}"))
                .collect();
            let steps = match steps.is_empty() {
                true => String::new(),
                false => {
                    let slow: Vec<String> = run
                        .slow_steps
                        .iter()
                        .map(|(step, over10, over25, all)| {
                            format!("{step} {over10} / {over25} of {all}")
                        })
                        .collect();
                    format!(
                        "; mean ms per Kafka transaction: {}; steps over 10 / 25 ms: {}",
                        steps.join(", "),
                        slow.join(", ")
                    )
                }
            };
            let name = match run.p99 {
                Some(h) => format!(
                    "walbox, exactly-once (commit → Kafka commit p99 ≤ {} ms{steps})",
                    h * 1000.0
                ),
                None => format!("walbox, exactly-once{steps}"),
            };
            report.live(&name, run.rate, &run.lat, None);
        }
    }
    if bench.settings.runs("live-poll") {
        let rates = bench.settings.rates.clone();
        for interval in [Duration::from_millis(100), Duration::from_secs(1)] {
            for &rate in &rates {
                bench.admin.batch_execute("TRUNCATE outbox").await?;
                let name = format!("live-poll{}ms-{rate}", interval.as_millis());
                let lat = bench.live(&name, rate, Some(interval)).await?;
                report.live(
                    &format!("polling relay, {} ms interval", interval.as_millis()),
                    rate,
                    &lat,
                    None,
                );
            }
        }
    }

    // 5. The primary's cost, walbox decoding on the primary and on a standby.
    if bench.settings.runs("standby") {
        let pair = standby::Pair::start().await?;
        let rows = bench.settings.standby_rows;
        let on_primary = pair
            .drain(standby::Decoder::Primary, rows, &bench.broker)
            .await?;
        let on_standby = pair
            .drain(standby::Decoder::Standby, rows, &bench.broker)
            .await?;
        report.primary_cost(&on_primary, &on_standby, &pair.version);
    }

    report.elapsed = started.elapsed();
    harness::publish("e2e", &bench.settings.output, &report.render())?;
    drop(bench);
    Ok(())
}

/// Upper bound (a bucket bound) of the p99 of `walbox_commit_to_ack_seconds` between two scrapes.
fn histogram_p99(before: &procs::WalboxMetrics, after: &procs::WalboxMetrics) -> Option<f64> {
    let delta: Vec<(f64, u64)> = after
        .commit_to_ack
        .iter()
        .map(|(le, c)| {
            let b = before
                .commit_to_ack
                .iter()
                .find(|(l, _)| l == le)
                .map_or(0, |(_, c)| *c);
            (*le, c.saturating_sub(b))
        })
        .collect();
    let total = delta.last()?.1;
    if total == 0 {
        return None;
    }
    delta
        .iter()
        .find(|(_, c)| *c as f64 >= 0.99 * total as f64)
        .map(|(le, _)| *le)
}

impl Bench {
    /// Current WAL insert position.
    async fn wal_lsn(&self) -> anyhow::Result<Lsn> {
        backlog::wal_lsn(&self.admin).await
    }

    /// `n_dead_tup` of the outbox table, after a fresh statistics snapshot.
    async fn dead_tuples(&self) -> anyhow::Result<i64> {
        self.admin
            .batch_execute("SELECT pg_stat_clear_snapshot()")
            .await?;
        Ok(self
            .admin
            .query_one(
                "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox'",
                &[],
            )
            .await?
            .get(0))
    }

    /// Empties the outbox, creates `slots` at one LSN, loads `rows` rows in transactions of
    /// `per_tx`, vacuums and checkpoints; returns the WAL position after the load.
    async fn backlog(&self, slots: &[&str], rows: u64, per_tx: u64) -> anyhow::Result<Lsn> {
        Ok(self
            .backlog_into("outbox", "bench_load", slots, rows, per_tx)
            .await?
            .0)
    }

    /// [`Bench::backlog`] into `table` through its load procedure `load`; also returns the
    /// seconds the load took.
    async fn backlog_into(
        &self,
        table: &str,
        load: &str,
        slots: &[&str],
        rows: u64,
        per_tx: u64,
    ) -> anyhow::Result<(Lsn, f64)> {
        backlog::load(&self.admin, table, load, slots, rows, per_tx).await
    }

    /// Drops every replication slot.
    async fn drop_slots(&self) -> anyhow::Result<()> {
        self.admin
            .batch_execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots")
            .await?;
        Ok(())
    }

    /// `confirmed_flush_lsn` of `slot`.
    async fn confirmed(&self, slot: &str) -> anyhow::Result<Lsn> {
        let text: Option<String> = self
            .admin
            .query_one(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await?
            .get(0);
        text.unwrap_or_default()
            .parse()
            .map_err(|e| anyhow::anyhow!("{e:?}"))
    }

    /// Waits until walbox created and holds `slot`.
    async fn wait_slot(&self, slot: &str, walbox: &mut WalboxChild) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            walbox.check_alive()?;
            let active = self
                .admin
                .query_opt(
                    "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active",
                    &[&slot],
                )
                .await?;
            if active.is_some() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("walbox did not start streaming from {slot}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One live run: inserts into `topic` at `rate` for the configured time while walbox (already
    /// running) or, with `poll`, the polling relay at that interval relays them.
    /// Live runs at every rate through one walbox on a fresh slot `slot` (with the `extra`
    /// variables): per rate, the latency and walbox's commit → confirmed p99 over that run.
    async fn live_walbox(
        &mut self,
        slot: &str,
        extra: &[(&str, String)],
    ) -> anyhow::Result<Vec<LiveRun>> {
        self.admin.batch_execute("TRUNCATE outbox").await?;
        let brokers = self.broker.bootstrap();
        let mut walbox = WalboxChild::start(&self.url, slot, PUBLICATION, &brokers, true, extra)?;
        self.wait_slot(slot, &mut walbox).await?;
        let mut runs = Vec::new();
        for rate in self.settings.rates.clone() {
            let before = walbox.metrics().unwrap_or_default();
            let lat = self
                .live(&format!("live-{slot}-{rate}"), rate, None)
                .await?;
            let after = walbox.metrics().unwrap_or_default();
            runs.push(LiveRun {
                rate,
                p99: histogram_p99(&before, &after),
                steps: after.txn_step_means(&before),
                slow_steps: after.txn_steps_slow(&before),
                lat,
            });
        }
        walbox.stop()?;
        self.drop_slots().await?;
        Ok(runs)
    }

    async fn live(
        &mut self,
        topic: &str,
        rate: u64,
        poll: Option<Duration>,
    ) -> anyhow::Result<live::Latency> {
        self.broker.create_topic(topic, PARTITIONS)?;
        let receiver = live::Receiver::start(&self.broker.bootstrap(), topic, PARTITIONS)?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let poller = match poll {
            Some(interval) => {
                let mut p = poller::Poller::connect(&self.url, &self.broker.bootstrap()).await?;
                Some(tokio::spawn(async move { p.run(interval, stop_rx).await }))
            }
            None => None,
        };
        // Let the consumer finish its start-up (metadata, offset look-ups, first fetch) so its
        // warm-up is not counted as latency.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let duration = self.settings.live;
        let commits = live::insert_at_rate(&self.url, topic, rate, duration).await?;
        let received = receiver
            .finish(commits.len(), Duration::from_secs(60))
            .await?;
        let _ = stop_tx.send(true);
        if let Some(p) = poller {
            p.await??;
        }
        let lat = live::latency(&commits, &received, duration);
        eprintln!("live {topic}: {lat:?}");
        Ok(lat)
    }
}

/// One live run of walbox at one rate.
struct LiveRun {
    rate: u64,
    lat: live::Latency,
    /// walbox's commit → confirmed p99 over the run (its histogram's bucket).
    p99: Option<f64>,
    /// Exactly-once mode: mean milliseconds per Kafka transaction of each step.
    steps: Vec<(String, f64)>,
    /// Exactly-once mode: per step, the transactions for which it took over 10 ms and over
    /// 25 ms, and all of them.
    slow_steps: Vec<(String, u64, u64, u64)>,
}
