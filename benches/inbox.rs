//! Inbox benchmark: `walbox inbox` against the per-record inbox it replaces and against
//! PostgreSQL's own rate for the same transactions, in one run, on a throwaway cluster and broker.
//!
//! `cargo bench --bench inbox`:
//! 1. starts a private PostgreSQL cluster (the sandbox's settings, `track_commit_timestamp=on`)
//!    with `migrations/inbox.sql` and 50 accounts, and the Kafka brokers to compare: librdkafka's
//!    mock cluster in a child process and a single-node Apache Kafka broker (the sandbox's, from
//!    the jars `scripts/install-kafka.sh` installs), or `WALBOX_BENCH_KAFKA_BROKERS` alone;
//! 2. produces the same N records (50 keys, an `id` header, a small JSON payload) to a 1-, a 4-
//!    and a 16-partition topic on each broker;
//! 3. for each topic, with `fsync` off and on (`ALTER SYSTEM` + reload), with the one-statement
//!    effect (`UPDATE accounts … WHERE id = $key`), with the set-based effect (one `UPDATE
//!    accounts … FROM jsonb_to_recordset($records) …` per batch, the same balances) and with the
//!    stored-record form, drains the topic from the beginning with a fresh consumer group and an
//!    empty inbox:
//!    - `walbox inbox` with the default settings (`effect.batch_max = 100`, no linger), from
//!      each broker in turn (their rates side by side in one row);
//!    - the per-record inbox (`effect.batch_max = 1`: one transaction per record, what
//!      `walbox inbox` did before batching), not for the set-based effect;
//!    - the direct reference: the same multi-row `INSERT … ON CONFLICT DO NOTHING RETURNING`,
//!      the same effect statements and one COMMIT per 100 records, issued by a plain client
//!      over the same socket on as many connections (`effect.max_parallel`), without Kafka;
//!      the set-based effect's ratio is to the one-statement effect's direct write: the same
//!      rows and balances, written the way an application would without an inbox;
//! 4. latency at fixed produce rates (1k and 10k records/s, 4 partitions, the effect form):
//!    from the producer's send call to the inbox transaction's commit timestamp
//!    (`pg_xact_commit_timestamp` of the inbox row), p50/p99/max. Against the mock cluster the
//!    consumer gets `fetch.wait.max.ms = 1`: the mock answers a fetch only when that wait
//!    expires (a real broker answers when a record arrives), which would otherwise be measured.
//!
//! Rates are records over the time from the first record applied to the last (consumer-group
//! start-up excluded; the reference has none). walbox runs in this process, like the reference,
//! and nothing else runs during a measurement. Nothing is asserted: targets are reported.
//!
//! Environment: `WALBOX_BENCH_INBOX_RECORDS` (N, default 20,000), `WALBOX_BENCH_QUICK=1`
//! (N = 5,000, 3 s latency runs), `WALBOX_BENCH_LATENCY_SECS` (default 10; 0 skips them),
//! `WALBOX_BENCH_INBOX_PARTITIONS` (default `1,4,16`; `none` runs only the latency part), `WALBOX_BENCH_INBOX_FSYNC` (`off`, `on`,
//! default `both`),
//! `WALBOX_BENCH_INBOX_FORMS` (default `effect,set,stored`),
//! `WALBOX_BENCH_INBOX_OUTPUT` (default `benches/inbox-results.md`), `WALBOX_BENCH_KAFKA_BROKERS`,
//! `WALBOX_BENCH_INBOX_KAFKA` (`mock`, `apache` or, the default, `both`; `both` runs the mock
//! alone, saying so, when Apache Kafka is not installed).

#[path = "e2e/broker.rs"]
mod broker;
#[path = "inbox/direct.rs"]
mod direct;
#[path = "common/harness.rs"]
mod harness;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls};

use walbox::inbox::config::{load_from, InboxConfig};
use walbox::inbox::metrics::InboxMetrics;
use walbox::inbox::Handles;
use walbox::sandbox::broker::Broker;
use walbox::sandbox::kafka::{KafkaServer, KafkaServerOptions};
use walbox::sandbox::postgres::PgCluster;

use broker::BenchBroker;
use direct::{direct_batch, insert_sql};

/// Accounts, i.e. distinct keys.
const ACCOUNTS: usize = 50;
/// `effect.max_parallel` of every run (walbox's default) and connections of the reference.
const CONNECTIONS: usize = 4;
/// The reference's records per transaction (walbox's default `effect.batch_max`).
const DIRECT_BATCH: usize = 100;
/// The effect: one statement.
const EFFECT: &str =
    "UPDATE accounts SET balance = balance + ($payload->>'amount')::numeric WHERE id = $key";

/// The set-based effect: the same balances, one statement per batch.
const BATCH_EFFECT: &str = "UPDATE accounts a SET balance = a.balance + t.amount \
     FROM (SELECT r.key, sum((r.payload->>'amount')::numeric) AS amount \
           FROM jsonb_to_recordset($records) AS r(key text, payload jsonb) GROUP BY r.key) t \
     WHERE a.id = t.key";

/// The accounts the effect updates.
const SCHEMA: &str =
    "CREATE TABLE accounts (id text PRIMARY KEY, balance numeric NOT NULL DEFAULT 0);
INSERT INTO accounts (id) SELECT 'acct-' || n FROM generate_series(0, 49) n;";

struct Settings {
    records: usize,
    latency: Duration,
    output: PathBuf,
    partitions: Vec<i32>,
    fsync: Vec<bool>,
    forms: Vec<Form>,
    /// Compare the mock cluster …
    mock: bool,
    /// … and/or Apache Kafka.
    apache: bool,
}

impl Settings {
    fn from_env() -> anyhow::Result<Self> {
        use harness::{num, var};
        let quick = var("WALBOX_BENCH_QUICK").is_some_and(|v| v != "0");
        let partitions = match var("WALBOX_BENCH_INBOX_PARTITIONS") {
            Some(v) if v == "none" => Vec::new(),
            _ => harness::list("WALBOX_BENCH_INBOX_PARTITIONS", vec![1, 4, 16])?,
        };
        let fsync = match var("WALBOX_BENCH_INBOX_FSYNC").as_deref() {
            None | Some("both") => vec![false, true],
            Some("off") => vec![false],
            Some("on") => vec![true],
            Some(v) => bail!("WALBOX_BENCH_INBOX_FSYNC={v}: off, on or both"),
        };
        let mut forms = Vec::new();
        for name in harness::list::<String>(
            "WALBOX_BENCH_INBOX_FORMS",
            vec!["effect".into(), "set".into(), "stored".into()],
        )? {
            forms.push(match name.as_str() {
                "effect" => Form::Effect,
                "set" => Form::Set,
                "stored" => Form::Stored,
                v => bail!("WALBOX_BENCH_INBOX_FORMS: {v}: effect, set or stored"),
            });
        }
        let (mock, apache) = match var("WALBOX_BENCH_INBOX_KAFKA").as_deref() {
            None | Some("both") => (true, true),
            Some("mock") => (true, false),
            Some("apache") => (false, true),
            Some(v) => bail!("WALBOX_BENCH_INBOX_KAFKA={v}: mock, apache or both"),
        };
        Ok(Settings {
            partitions,
            fsync,
            forms,
            mock,
            apache,
            records: num(
                "WALBOX_BENCH_INBOX_RECORDS",
                if quick { 5_000 } else { 20_000 },
            )?,
            latency: Duration::from_secs(num(
                "WALBOX_BENCH_LATENCY_SECS",
                if quick { 3 } else { 10 },
            )? as u64),
            output: var("WALBOX_BENCH_INBOX_OUTPUT").map_or_else(
                || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/inbox-results.md"),
                PathBuf::from,
            ),
        })
    }
}

fn main() -> ExitCode {
    if std::env::args().any(|a| a == broker::HOST_ARG) {
        broker::host_main();
    }
    harness::main_with("inbox", run)
}

/// The inbox forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// `effect.sql` = [`EFFECT`].
    Effect,
    /// `effect.batch_sql` = [`BATCH_EFFECT`].
    Set,
    /// No effect; the record is stored in the inbox row.
    Stored,
}

impl Form {
    fn name(self) -> &'static str {
        match self {
            Form::Effect => "one-statement effect",
            Form::Set => "set-based effect",
            Form::Stored => "stored record",
        }
    }
}

/// One produced record, as the reference binds it.
struct Rec {
    id: String,
    key: String,
    payload: String,
    headers: String,
    offset: i64,
}

/// One of the Kafka brokers compared.
struct Kafka {
    /// Its name in the tables.
    name: &'static str,
    broker: BenchBroker,
    /// The Apache Kafka broker process (stopped on drop).
    _server: Option<KafkaServer>,
}

/// The brokers to compare: `WALBOX_BENCH_KAFKA_BROKERS` alone when set, else the mock cluster
/// and/or Apache Kafka as `settings` says.
fn start_brokers(settings: &Settings) -> anyhow::Result<Vec<Kafka>> {
    let external = std::env::var("WALBOX_BENCH_KAFKA_BROKERS").is_ok_and(|b| !b.trim().is_empty());
    let mut brokers = Vec::new();
    if external || settings.mock {
        let broker = BenchBroker::start()?;
        let name = if broker.is_mock() { "mock" } else { "external" };
        brokers.push(Kafka {
            name,
            broker,
            _server: None,
        });
    }
    if !external && settings.apache {
        match KafkaServer::start(KafkaServerOptions {
            watchdog: true,
            ..Default::default()
        }) {
            Ok(server) => brokers.push(Kafka {
                name: "Apache Kafka",
                broker: BenchBroker::External(Broker::External(server.bootstrap_servers())),
                _server: Some(server),
            }),
            Err(e) if settings.mock => eprintln!("inbox bench: mock cluster only: {e}"),
            Err(e) => return Err(e).context("starting Apache Kafka"),
        }
    }
    Ok(brokers)
}

struct Bench {
    cluster: PgCluster,
    brokers: Vec<Kafka>,
    /// The broker of the current measurement (an index into `brokers`).
    current: usize,
    admin: Client,
    url: String,
    runs: usize,
}

async fn run() -> anyhow::Result<()> {
    let settings = Settings::from_env()?;
    let started = Instant::now();
    let cluster = harness::bench_cluster(
        &[
            ("shared_buffers", "512MB"),
            ("max_wal_size", "4GB"),
            ("track_commit_timestamp", "on"),
        ],
        &[include_str!("../migrations/inbox.sql"), SCHEMA],
    )
    .await?;
    let url = cluster.socket_url("bench");
    let (admin, conn) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(conn);
    let brokers = start_brokers(&settings)?;
    let mut bench = Bench {
        cluster,
        brokers,
        current: 0,
        admin,
        url,
        runs: 0,
    };
    let n = settings.records;
    let version: String = bench.admin.query_one("SELECT version()", &[]).await?.get(0);

    let names: Vec<&str> = bench.brokers.iter().map(|k| k.name).collect();
    let mut out = String::new();
    writeln!(
        out,
        "# walbox inbox benchmark\n\n{version}; Kafka: {}; {n} records, {ACCOUNTS} keys; \
         `effect.max_parallel = {CONNECTIONS}`; rates from the first record applied to the last.\n",
        names.join(" and ")
    )?;
    let mut header = String::from("| partitions | form | fsync |");
    for name in &names {
        write!(
            header,
            " walbox, {name} (batch_max 100) | per-record, {name} (batch_max 1) |"
        )?;
    }
    header.push_str(" direct INSERT |");
    for name in &names {
        write!(header, " ×per-record, {name} | ×direct, {name} |")?;
    }
    let columns = 4 + 4 * names.len();
    writeln!(out, "{header}\n|{}", "---|".repeat(columns))?;
    for &partitions in &settings.partitions {
        let topic = format!("inbox_{partitions}");
        let mut records = Vec::new();
        for k in 0..bench.brokers.len() {
            bench.current = k;
            records = bench.produce_backlog(&topic, partitions, n)?;
        }
        for &fsync in &settings.fsync {
            bench.set_fsync(fsync).await?;
            // The one-statement effect's direct write, which the set-based effect is compared to.
            let mut effect_direct = None;
            for &form in &settings.forms {
                let mut rates = Vec::new();
                for k in 0..bench.brokers.len() {
                    bench.current = k;
                    let batched = bench.drain(&topic, n, form, 100).await?;
                    let naive = match form {
                        Form::Set => None,
                        _ => Some(bench.drain(&topic, n, form, 1).await?),
                    };
                    rates.push((batched, naive));
                }
                let direct = match (form, effect_direct) {
                    (Form::Set, Some(d)) => d,
                    _ => {
                        let d = bench.direct(&records, partitions, form).await?;
                        if form != Form::Stored {
                            effect_direct = Some(d);
                        }
                        d
                    }
                };
                let mut line = format!(
                    "| {partitions} | {} | {} |",
                    form.name(),
                    if fsync { "on" } else { "off" }
                );
                for (batched, naive) in &rates {
                    let naive = naive.map_or("—".to_owned(), rate);
                    write!(line, " {} | {naive} |", rate(*batched))?;
                }
                write!(line, " {} |", rate(direct))?;
                for (batched, naive) in &rates {
                    let gain = naive.map_or("—".to_owned(), |n| format!("{:.1}×", batched / n));
                    write!(line, " {gain} | {:.2}× |", batched / direct)?;
                }
                eprintln!("{line}");
                writeln!(out, "{line}")?;
            }
        }
    }

    writeln!(
        out,
        "\nLatency, send → inbox commit (4 partitions, one-statement effect, {} s per rate):\n\n\
         | rate | fsync | batch_max | Kafka | p50 | p99 | max |\n|---|---|---|---|---|---|---|",
        settings.latency.as_secs()
    )?;
    for &fsync in &settings.fsync {
        if settings.latency.is_zero() {
            break;
        }
        bench.set_fsync(fsync).await?;
        for (rate, batch_max) in [(1_000, 100), (1_000, 1), (10_000, 100)] {
            for k in 0..bench.brokers.len() {
                bench.current = k;
                let l = bench.latency(rate, batch_max, settings.latency).await?;
                let line = format!(
                    "| {rate}/s | {} | {batch_max} | {} | {} | {} | {} |",
                    if fsync { "on" } else { "off" },
                    bench.brokers[k].name,
                    ms(l.p50),
                    ms(l.p99),
                    ms(l.max)
                );
                eprintln!("{line}");
                writeln!(out, "{line}")?;
            }
        }
    }
    writeln!(
        out,
        "\nTargets (reported, not asserted): ≥ 20,000 records/s with the one-statement effect; \
         ≥ 0.8 × the direct INSERT rate; p99 ≤ 20 ms at 1,000 records/s.\n\nTotal bench time: {:.0} s.",
        started.elapsed().as_secs_f64()
    )?;
    harness::publish("inbox", &settings.output, &out)?;
    bench.cluster.stop()?;
    drop(bench.brokers);
    Ok(())
}

fn rate(r: f64) -> String {
    format!("{:.0}/s", r)
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

fn producer(
    bootstrap: &str,
    linger_ms: &str,
) -> anyhow::Result<ThreadedProducer<DefaultProducerContext>> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", linger_ms)
        .create()?)
}

fn record_for(i: usize, id: String, offset: i64) -> Rec {
    let key = format!("acct-{}", i % ACCOUNTS);
    Rec {
        headers: format!("{{\"id\":\"{id}\"}}"),
        id,
        key,
        payload: format!("{{\"amount\": 1.25, \"n\": {i}}}"),
        offset,
    }
}

impl Bench {
    /// The broker of the current measurement.
    fn broker(&self) -> &BenchBroker {
        &self.brokers[self.current].broker
    }

    fn broker_mut(&mut self) -> &mut BenchBroker {
        &mut self.brokers[self.current].broker
    }

    /// Produces `n` records to a new topic, each key to one partition (as the relay does).
    fn produce_backlog(
        &mut self,
        topic: &str,
        partitions: i32,
        n: usize,
    ) -> anyhow::Result<Vec<Rec>> {
        tokio::task::block_in_place(|| self.broker_mut().create_topic(topic, partitions))?;
        let p = producer(&self.broker().bootstrap(), "5")?;
        let mut records = Vec::with_capacity(n);
        for i in 0..n {
            let r = record_for(i, format!("{topic}-{i}"), i as i64);
            let partition = (i % ACCOUNTS) as i32 % partitions;
            let mut br = BaseRecord::to(topic)
                .key(r.key.as_bytes())
                .payload(r.payload.as_bytes())
                .partition(partition)
                .headers(OwnedHeaders::new().insert(Header {
                    key: "id",
                    value: Some(r.id.as_bytes()),
                }));
            loop {
                match p.send(br) {
                    Ok(()) => break,
                    Err((_, back)) => {
                        // Queue full: let it drain.
                        p.poll(Duration::from_millis(10));
                        br = back;
                    }
                }
            }
            records.push(r);
        }
        p.flush(Duration::from_secs(60))?;
        Ok(records)
    }

    async fn set_fsync(&self, on: bool) -> anyhow::Result<()> {
        self.admin
            .batch_execute(&format!(
                "ALTER SYSTEM SET fsync = {}",
                if on { "on" } else { "off" }
            ))
            .await?;
        self.admin.batch_execute("SELECT pg_reload_conf()").await?;
        // A reload is asynchronous: wait until a new session sees it.
        let want = if on { "on" } else { "off" };
        for _ in 0..500 {
            let (c, conn) = tokio_postgres::connect(&self.url, NoTls).await?;
            let h = tokio::spawn(conn);
            let v: String = c.query_one("SHOW fsync", &[]).await?.get(0);
            drop(c);
            let _ = h.await;
            if v == want {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        bail!("fsync did not become {want}")
    }

    /// An empty inbox and a checkpoint, so every run starts from the same state.
    async fn reset(&self) -> anyhow::Result<()> {
        self.admin.batch_execute("TRUNCATE inbox").await?;
        self.admin.batch_execute("VACUUM accounts").await?;
        self.admin.batch_execute("CHECKPOINT").await?;
        Ok(())
    }

    fn inbox_config(
        &mut self,
        topic: &str,
        form: Form,
        batch_max: usize,
        latency: bool,
    ) -> anyhow::Result<InboxConfig> {
        self.runs += 1;
        let mut env: Vec<(String, String)> = [
            ("WALBOX_INBOX_POSTGRES_URL", self.url.clone()),
            ("WALBOX_INBOX_KAFKA_BROKERS", self.broker().bootstrap()),
            (
                "WALBOX_INBOX_KAFKA_GROUP_ID",
                format!("bench-{}", self.runs),
            ),
            ("WALBOX_INBOX_POSTGRES_CONSUMER", "bench".to_owned()),
            ("WALBOX_INBOX_KAFKA_TOPICS", topic.to_owned()),
            ("WALBOX_INBOX_EFFECT_BATCH_MAX", batch_max.to_string()),
            ("WALBOX_INBOX_EFFECT_MAX_PARALLEL", CONNECTIONS.to_string()),
            ("WALBOX_INBOX_HTTP_LISTEN", "off".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        match form {
            Form::Effect => env.push(("WALBOX_INBOX_EFFECT_SQL".into(), EFFECT.into())),
            Form::Set => env.push(("WALBOX_INBOX_EFFECT_BATCH_SQL".into(), BATCH_EFFECT.into())),
            Form::Stored => {}
        }
        if latency && self.broker().is_mock() {
            // The mock cluster answers a fetch when `fetch.wait.max.ms` expires, not when a
            // record arrives (a real broker does): without this the latency would be the
            // mock's fetch wait. Only the latency runs set it; the drains keep the defaults.
            env.push((
                "WALBOX_INBOX_KAFKA_PROPERTY_FETCH_WAIT_MAX_MS".into(),
                "1".into(),
            ));
        }
        Ok(load_from(None, &mut env.into_iter())?)
    }

    /// Runs `walbox inbox` in this process until `done` says so; returns its metrics.
    async fn with_inbox<F, Fut>(&self, config: InboxConfig, done: F) -> anyhow::Result<()>
    where
        F: FnOnce(Arc<InboxMetrics>) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<()>>,
    {
        let handles = Handles::default();
        let metrics = handles.metrics.clone();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(walbox::inbox::run_with(
            config,
            async move {
                let _ = stop_rx.await;
            },
            handles,
        ));
        let result = tokio::select! {
            r = done(metrics) => r,
            r = async { task_result(&task).await } => r,
        };
        let _ = stop_tx.send(());
        let ended = task.await;
        result?;
        match ended {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => bail!("walbox inbox stopped: {}", e.message),
            Err(e) => bail!("walbox inbox panicked: {e}"),
        }
    }

    /// Drains `topic` (n records) with `walbox inbox`; records per second.
    async fn drain(
        &mut self,
        topic: &str,
        n: usize,
        form: Form,
        batch_max: usize,
    ) -> anyhow::Result<f64> {
        self.reset().await?;
        let config = self.inbox_config(topic, form, batch_max, false)?;
        let mut rate = 0.0;
        self.with_inbox(config, |m| async {
            let m = m;
            let deadline = Instant::now() + Duration::from_secs(600);
            let mut first: Option<(Instant, u64)> = None;
            loop {
                let done = m.records_consumed.get();
                if first.is_none() && done > 0 {
                    first = Some((Instant::now(), done));
                }
                if done >= n as u64 {
                    let (t0, c0) = first.unwrap_or((Instant::now(), 0));
                    let span = t0.elapsed().as_secs_f64().max(1e-6);
                    rate = (done - c0) as f64 / span;
                    eprintln!(
                        "  {topic}, {}, batch_max {batch_max}: {rate:.0}/s, {} partition pauses, {:.0} records per transaction",
                        form.name(),
                        m.partition_pauses.get(),
                        m.batch_records.get_sample_sum() / m.batch_records.get_sample_count().max(1) as f64
                    );
                    return Ok(());
                }
                if Instant::now() > deadline {
                    bail!("walbox inbox applied {done} of {n} records in 10 minutes");
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await?;
        Ok(rate)
    }

    /// The same transactions, issued directly: per partition, batches of [`DIRECT_BATCH`]
    /// records in offset order, partitions spread over [`CONNECTIONS`] connections.
    async fn direct(&self, records: &[Rec], partitions: i32, form: Form) -> anyhow::Result<f64> {
        self.reset().await?;
        let mut per_partition: Vec<Vec<&Rec>> = vec![Vec::new(); partitions as usize];
        for r in records {
            let p = records_partition(r, partitions);
            per_partition[p].push(r);
        }
        let streams = CONNECTIONS.min(partitions as usize);
        let mut lanes: Vec<Vec<Vec<&Rec>>> = vec![Vec::new(); streams];
        for (p, recs) in per_partition.into_iter().enumerate() {
            lanes[p % streams].push(recs);
        }
        let mut clients = Vec::new();
        for _ in 0..streams {
            let (c, conn) = tokio_postgres::connect(&self.url, NoTls).await?;
            tokio::spawn(conn);
            clients.push(c);
        }
        let t0 = Instant::now();
        let work = clients.iter_mut().zip(&lanes).map(|(c, lane)| async move {
            let insert = c.prepare(insert_sql(form)).await?;
            // As walbox rewrites EFFECT: `$payload` → `($1::jsonb)`, sent as text.
            let effect = c
                .prepare_typed(
                    "UPDATE accounts SET balance = balance + (($1::jsonb)->>'amount')::numeric WHERE id = $2",
                    &[Type::TEXT, Type::TEXT],
                )
                .await?;
            for partition in lane {
                for chunk in partition.chunks(DIRECT_BATCH) {
                    direct_batch(c, &insert, &effect, chunk, form).await?;
                }
            }
            anyhow::Ok(())
        });
        for r in futures_util::future::join_all(work).await {
            r?;
        }
        Ok(records.len() as f64 / t0.elapsed().as_secs_f64())
    }

    /// Produces at `rate` records/s for `secs` to a 4-partition topic while `walbox inbox`
    /// consumes it; the send → commit latency of every record.
    async fn latency(
        &mut self,
        rate: u64,
        batch_max: usize,
        secs: Duration,
    ) -> anyhow::Result<Latency> {
        self.reset().await?;
        let topic = format!("latency_{}", self.runs);
        tokio::task::block_in_place(|| self.broker_mut().create_topic(&topic, 4))?;
        let config = self.inbox_config(&topic, Form::Effect, batch_max, true)?;
        let bootstrap = self.broker().bootstrap();
        let total = (rate * secs.as_secs()) as usize;
        let mut sent: HashMap<String, i64> = HashMap::with_capacity(total);
        let sent_ref = &mut sent;
        let topic_ref = topic.as_str();
        self.with_inbox(config, |m| async move {
            // The consumer group joins before the first record is sent.
            wait_ready(&bootstrap, topic_ref, &m).await?;
            let p = producer(&bootstrap, "0")?;
            let start = Instant::now();
            let mut i = 0usize;
            while i < total {
                let due = ((start.elapsed().as_secs_f64() * rate as f64) as usize).min(total);
                while i < due {
                    let id = format!("{topic_ref}-{i}");
                    let key = format!("acct-{}", i % ACCOUNTS);
                    let payload = format!("{{\"amount\": 1.25, \"n\": {i}}}");
                    sent_ref.insert(id.clone(), now_us());
                    p.send(
                        BaseRecord::to(topic_ref)
                            .key(key.as_bytes())
                            .payload(payload.as_bytes())
                            .partition((i % ACCOUNTS) as i32 % 4)
                            .headers(OwnedHeaders::new().insert(Header {
                                key: "id",
                                value: Some(id.as_bytes()),
                            })),
                    )
                    .map_err(|(e, _)| e)?;
                    i += 1;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            p.flush(Duration::from_secs(30))?;
            let deadline = Instant::now() + Duration::from_secs(300);
            // The warm-up record of wait_ready is counted too.
            while m.records_consumed.get() < total as u64 + 1 {
                if Instant::now() > deadline {
                    bail!("the inbox did not catch up within 5 minutes");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok(())
        })
        .await?;
        let rows = self
            .admin
            .query(
                "SELECT message_id, (extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1000000)::int8 FROM inbox",
                &[],
            )
            .await?;
        let mut lat: Vec<i64> = rows
            .iter()
            .filter_map(|r| {
                let id: String = r.get(0);
                let committed: i64 = r.get(1);
                sent.get(&id).map(|s| committed - s)
            })
            .collect();
        if lat.len() != total {
            bail!("{} of {total} records have a commit timestamp", lat.len());
        }
        lat.sort_unstable();
        let at = |q: f64| {
            Duration::from_micros(lat[((lat.len() - 1) as f64 * q) as usize].max(0) as u64)
        };
        Ok(Latency {
            p50: at(0.5),
            p99: at(0.99),
            max: at(1.0),
        })
    }
}

async fn task_result(
    task: &tokio::task::JoinHandle<Result<(), walbox::failure::FatalError>>,
) -> anyhow::Result<()> {
    // Resolves only if walbox stops by itself (an error): polled alongside the measurement.
    while !task.is_finished() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("walbox inbox stopped during the measurement")
}

/// Sends one record and waits until it is applied: the group has joined and fetches.
async fn wait_ready(bootstrap: &str, topic: &str, m: &InboxMetrics) -> anyhow::Result<()> {
    let p = producer(bootstrap, "0")?;
    p.send(
        BaseRecord::to(topic)
            .key("acct-0")
            .payload("{\"amount\": 0}")
            .headers(OwnedHeaders::new().insert(Header {
                key: "id",
                value: Some("warm-up".as_bytes()),
            })),
    )
    .map_err(|(e, _)| e)?;
    p.flush(Duration::from_secs(30))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while m.records_consumed.get() == 0 {
        if Instant::now() > deadline {
            bail!("the inbox did not start consuming within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

struct Latency {
    p50: Duration,
    p99: Duration,
    max: Duration,
}

fn records_partition(r: &Rec, partitions: i32) -> usize {
    let i: usize = r.key.trim_start_matches("acct-").parse().unwrap_or(0);
    (i % ACCOUNTS) % partitions as usize
}
