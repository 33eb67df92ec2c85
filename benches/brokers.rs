//! Broker benchmark: walbox draining a PostgreSQL backlog into Redis Streams, NATS JetStream and
//! RabbitMQ, against a plain client of the same crate publishing the same messages to the same
//! server (walbox / plain client: the target is ≥ 0.8×), and walbox's peak RSS (target: under
//! 40 MiB).
//!
//! `cargo bench --bench brokers --features sandbox` builds the `walbox` binary and this bench,
//! then, on a throwaway PostgreSQL cluster and one throwaway server per broker
//! (`walbox::sandbox`):
//! 1. per shape (100-row transactions, then 1-row transactions), loads N outbox rows behind one
//!    slot per broker, created at the same LSN before the load (`benches/common/backlog.rs`);
//!    rows spread over 8 aggregate types and 1,000 aggregates;
//! 2. per broker, starts `walbox run` (the binary, a child process) on its slot and times it
//!    from the spawn until its `walbox_events_published_total` (events the broker acknowledged)
//!    reached N, polling `/metrics` every 5 ms, then waits for `confirmed_flush_lsn` to pass
//!    the end of the load (reported, not part of the rate: walbox confirms at its status
//!    interval), sampling its `VmHWM` every 100 ms;
//! 3. reads back what walbox stored (every event, checked by count), empties the destinations,
//!    and publishes those very messages again with a plain client (`brokers/reference.rs`):
//!    same destinations, payloads, headers/fields/properties, ids, in walbox's commit order,
//!    with the acknowledgement walbox waits for, timed from the first publish to the last ack;
//! 4. per shape, before the brokers, `pg_recvlogical` drains one more slot of the same backlog
//!    to `/dev/null` over the same Unix socket: PostgreSQL's own pace for the stream walbox
//!    reads, with no broker behind it (walbox / `pg_recvlogical` says how much of that pace a
//!    relay to each broker keeps; the plain client reads no WAL at all). The table's last
//!    column divides walbox's rate by the slower of the two, the broker's and PostgreSQL's:
//!    what walbox costs on top of the path's slower end.
//!
//! Destinations (the outbox `topic` template), the same for both runs:
//! - Redis: one stream per aggregate type, `bench.${aggregate_type}` (8 streams); the plain
//!   client writes pipelines of 1,000 `XADD`s on one connection, one pipeline at a time, with
//!   walbox's entry ids (the streams are deleted first), as walbox does;
//! - NATS: subject `bench.${aggregate_id}` (1,000 subjects) captured by one file-storage stream
//!   `BENCH` (`bench.>`), deleted and created again before each run (which also clears its
//!   duplicate window); the plain client keeps one publish per subject waiting for its PubAck,
//!   as walbox does, and is also reported with unlimited pipelining (a window of 10,000
//!   PubAcks, every subject), labelled `nats (window 10k)`;
//! - RabbitMQ: topic exchange `outbox`, routing key `${aggregate_type}`, one durable queue
//!   `bench` bound `#`, purged between runs; the plain client publishes `mandatory` on one
//!   channel in confirm mode with up to 10,000 confirms outstanding.
//!
//! What is not the same: walbox's time includes its start (connecting to PostgreSQL and the
//! broker, starting replication) and decoding the WAL; the plain client's starts at its first
//! publish on an open connection, and it has its messages in memory. walbox also writes its
//! progress records to the broker. The ratio is therefore a lower bound of walbox's publishing
//! path; the table also gives walbox's rate from its first acknowledged event to its last,
//! which leaves start-up out.
//!
//! Environment: `WALBOX_BENCH_EVENTS` (N, default 300,000), `WALBOX_BENCH_BROKERS` (comma list
//! of `redis`, `nats`, `rabbitmq`; default all), `WALBOX_BENCH_SHAPES` (comma list of rows per
//! transaction, default `100,1`), `WALBOX_BENCH_OUTPUT` (default `benches/brokers-results.md`),
//! `WALBOX_BENCH_WALBOX_LOG` (walbox's log filter, default warn), `WALBOX_BENCH_WALBOX_ENV`
//! (more `WALBOX_*` settings for walbox, `K=V;K=V`, to try one).

#[path = "common/backlog.rs"]
mod backlog;
#[path = "common/format.rs"]
#[allow(dead_code)]
mod format;
#[path = "common/harness.rs"]
mod harness;
#[path = "common/procs.rs"]
#[allow(dead_code)]
mod procs;
#[path = "brokers/reference.rs"]
mod reference;
#[path = "brokers/servers.rs"]
mod servers;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio_postgres::{Client, NoTls};
use walbox::lsn::Lsn;

use format::{fmt_n, k, ratio};
use procs::WalboxChild;
use servers::{Kind, Server};

/// The publication walbox reads.
const PUBLICATION: &str = "walbox_bench";

/// The outbox table (the `topic` column left NULL: the route's template names the
/// destination), its publication, and the loader: 8 aggregate types, 1,000 aggregates, the
/// seeds' ~200-byte payload.
const SCHEMA: &str = r#"
CREATE TABLE outbox (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    topic          text,
    event_type     text        NOT NULL,
    payload        jsonb       NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_enabled = false);
CREATE PUBLICATION walbox_bench FOR TABLE outbox WITH (publish = 'insert');
CREATE PROCEDURE bench_load(total bigint, per_tx bigint) LANGUAGE plpgsql AS $$
DECLARE done bigint := 0; k bigint;
BEGIN
  WHILE done < total LOOP
    k := least(per_tx, total - done);
    INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
    SELECT 'type' || (n % 8), 'order-' || (n % 1000), 'OrderCreated',
           format('{"order_id": %s, "customer_id": "cust-%s", "amount": 129.99, "status": "CREATED", "items": [{"sku": "SKU-000123", "qty": 2, "price": 49.99}, {"sku": "SKU-000456", "qty": 1, "price": 30.01}]}', n, n % 100000)::jsonb
    FROM generate_series(done + 1, done + k) n;
    done := done + k;
    COMMIT;
  END LOOP;
END $$;
"#;

/// What to run, from the environment.
#[derive(Debug)]
struct Settings {
    events: u64,
    brokers: Vec<Kind>,
    shapes: Vec<u64>,
    output: PathBuf,
}

impl Settings {
    fn from_env() -> anyhow::Result<Self> {
        Ok(Settings {
            events: harness::num("WALBOX_BENCH_EVENTS", 300_000)?,
            brokers: harness::list(
                "WALBOX_BENCH_BROKERS",
                vec![Kind::Redis, Kind::Nats, Kind::RabbitMq],
            )?,
            shapes: harness::list("WALBOX_BENCH_SHAPES", vec![100, 1])?,
            output: harness::var("WALBOX_BENCH_OUTPUT").map_or_else(
                || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/brokers-results.md"),
                PathBuf::from,
            ),
        })
    }
}

/// One row of the table.
struct Row {
    broker: String,
    shape: u64,
    events: u64,
    walbox: Option<f64>,
    /// walbox's rate from its first ack on.
    steady: Option<f64>,
    plain: f64,
    /// The plain client's CPU seconds.
    plain_cpu: f64,
    /// walbox's and PostgreSQL's CPU seconds during walbox's drain.
    cpu: Option<(f64, f64)>,
    rss: Option<u64>,
    /// `pg_recvlogical` on the same backlog: events/s.
    recv: Option<f64>,
}

/// `pg_recvlogical`'s drain of one backlog.
struct Recv {
    rate: f64,
    /// Its CPU seconds, and PostgreSQL's over the same time.
    cpu: f64,
    pg_cpu: f64,
}

/// `pg_recvlogical` drains `slot` up to `end` to `/dev/null` over the Unix socket walbox uses:
/// PostgreSQL's own pace for the stream, with no broker behind it.
async fn recvlogical(
    admin: &Client,
    cluster: &walbox::sandbox::postgres::PgCluster,
    slot: &str,
    end: Lsn,
    events: u64,
) -> anyhow::Result<Recv> {
    let cpu0 = procs::postgres_cpu_seconds(cluster.data_dir());
    let t0 = Instant::now();
    let mut child = procs::recvlogical(
        cluster.bin_dir(),
        &cluster.socket_url("bench"),
        slot,
        &end.to_string(),
        PUBLICATION,
    )?;
    let deadline = t0 + Duration::from_secs(120 + events / 1_000);
    let (mut cpu, mut pg_cpu) = (0.0f64, 0.0f64);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        cpu = cpu.max(procs::cpu_seconds(child.id()));
        pg_cpu = pg_cpu.max(procs::postgres_cpu_seconds(cluster.data_dir()) - cpu0);
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("pg_recvlogical did not drain {slot} in time");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let secs = t0.elapsed().as_secs_f64();
    if !status.success() {
        bail!("pg_recvlogical failed: {status}");
    }
    if confirmed(admin, slot).await? < end {
        bail!("pg_recvlogical exited before the end of the backlog {end} on {slot}");
    }
    Ok(Recv {
        rate: events as f64 / secs,
        cpu,
        pg_cpu,
    })
}

fn main() -> ExitCode {
    harness::main_with("brokers", run)
}

/// `confirmed_flush_lsn` of `slot`.
async fn confirmed(admin: &Client, slot: &str) -> anyhow::Result<Lsn> {
    let text: Option<String> = admin
        .query_one(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?
        .get(0);
    text.context("slot without confirmed_flush_lsn")?
        .parse()
        .map_err(|e| anyhow::anyhow!("{e:?}"))
}

/// One walbox drain.
struct Drained {
    /// Spawn → every event acknowledged by the broker (`walbox_events_published_total`).
    secs: f64,
    /// Spawn → the first event acknowledged (`/metrics`, polled every 20 ms).
    first_ack: Option<f64>,
    /// Spawn → the slot confirmed the end of the backlog.
    confirmed: f64,
    /// Peak `VmHWM`.
    rss: u64,
    /// walbox's CPU seconds until the last ack.
    cpu: f64,
    /// PostgreSQL's CPU seconds (walsender and all) over the same time.
    pg_cpu: f64,
}

/// walbox drains `slot` into `server`: timed until the broker acknowledged all `events`, and
/// until the slot confirmed `end`.
async fn drain(
    admin: &Client,
    pg: (&str, &Path),
    server: &Server,
    slot: &str,
    end: Lsn,
    events: u64,
) -> anyhow::Result<Drained> {
    let mut env = server.walbox_env();
    // Extra settings to try (`WALBOX_BENCH_WALBOX_ENV="WALBOX_RELAY_MAX_IN_FLIGHT=2000;…"`).
    env.extend(harness::assignments("WALBOX_BENCH_WALBOX_ENV")?);
    let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let (pg_url, data_dir) = pg;
    let pg_cpu0 = procs::postgres_cpu_seconds(data_dir);
    let t0 = Instant::now();
    let mut walbox = WalboxChild::start_on(pg_url, slot, PUBLICATION, false, &env)?;
    let pid = walbox.pid();
    let deadline = t0 + Duration::from_secs(120 + events / 1_000);
    let mut rss = 0u64;
    let mut next_sample = t0;
    let mut first_ack = None;
    let mut acked = None;
    let (mut cpu, mut pg_cpu) = (0.0, 0.0);
    let confirmed_at = loop {
        walbox.check_alive()?;
        if Instant::now() >= next_sample {
            rss = rss.max(procs::peak_rss(pid).unwrap_or(0));
            next_sample += Duration::from_millis(100);
        }
        if acked.is_none() {
            let published = walbox.metrics().map_or(0, |m| m.published);
            if first_ack.is_none() && published > 0 {
                first_ack = Some(t0.elapsed().as_secs_f64());
            }
            if published >= events {
                acked = Some(t0.elapsed().as_secs_f64());
                cpu = procs::cpu_seconds(pid);
                pg_cpu = procs::postgres_cpu_seconds(data_dir) - pg_cpu0;
            }
        }
        if acked.is_some() && confirmed(admin, slot).await? >= end {
            break t0.elapsed().as_secs_f64();
        }
        if Instant::now() > deadline {
            bail!("walbox did not drain {slot} in time");
        }
        tokio::time::sleep(Duration::from_millis(if acked.is_some() { 20 } else { 5 })).await;
    };
    rss = rss.max(procs::peak_rss(pid).unwrap_or(0));
    walbox.stop()?;
    Ok(Drained {
        secs: acked.unwrap_or(confirmed_at),
        first_ack,
        confirmed: confirmed_at,
        rss,
        cpu,
        pg_cpu,
    })
}

async fn run() -> anyhow::Result<()> {
    let settings = Settings::from_env()?;
    eprintln!("brokers bench: {settings:?}");
    let cluster = harness::bench_cluster(
        &[
            ("shared_buffers", "1GB"),
            ("max_wal_size", "4GB"),
            ("max_slot_wal_keep_size", "-1"),
        ],
        &[SCHEMA],
    )
    .await?;
    let pg_url = cluster.socket_url("bench");
    let (admin, conn) = tokio_postgres::connect(&pg_url, NoTls).await?;
    tokio::spawn(conn);
    let pg_version: String = admin.query_one("SHOW server_version", &[]).await?.get(0);
    let mut servers = Vec::new();
    for kind in &settings.brokers {
        let started = Instant::now();
        let server = Server::start(*kind).await?;
        eprintln!("{kind} started in {:?}", started.elapsed());
        servers.push(server);
    }
    let mut rows = Vec::new();
    for &shape in &settings.shapes {
        let mut slots: Vec<String> = servers
            .iter()
            .map(|s| format!("bench_{}_{shape}", s.kind))
            .collect();
        let recv_slot = format!("bench_recvlogical_{shape}");
        slots.push(recv_slot.clone());
        let slot_refs: Vec<&str> = slots.iter().map(String::as_str).collect();
        let (end, _) = backlog::load(
            &admin,
            "outbox",
            "bench_load",
            &slot_refs,
            settings.events,
            shape,
        )
        .await?;
        let recv = recvlogical(&admin, &cluster, &recv_slot, end, settings.events).await?;
        eprintln!(
            "pg_recvlogical {shape}-row: {:.0} events/s, CPU {:.1} s, PostgreSQL {:.1} s",
            recv.rate, recv.cpu, recv.pg_cpu
        );
        for (server, slot) in servers.iter().zip(&slots) {
            let pg = (pg_url.as_str(), cluster.data_dir());
            let measured = measure(&admin, pg, server, slot, end, settings.events, shape).await?;
            rows.extend(measured.into_iter().map(|r| Row {
                recv: r.cpu.map(|_| recv.rate),
                ..r
            }));
        }
        rows.push(Row {
            broker: format!(
                "pg_recvlogical (CPU {:.1} + {:.1} s)",
                recv.cpu, recv.pg_cpu
            ),
            shape,
            events: settings.events,
            walbox: None,
            steady: None,
            plain: recv.rate,
            plain_cpu: recv.cpu,
            cpu: None,
            rss: None,
            recv: None,
        });
        for slot in &slots {
            admin
                .execute("SELECT pg_drop_replication_slot($1)", &[slot])
                .await?;
        }
    }
    let mut versions = vec![format!("PostgreSQL {pg_version}")];
    for s in &servers {
        versions.push(s.version().await?);
    }
    let table = report(&settings, &rows, &versions);
    harness::publish("brokers", &settings.output, &table)
}

/// walbox, then the plain client(s), on one broker and one backlog.
async fn measure(
    admin: &Client,
    pg: (&str, &Path),
    server: &Server,
    slot: &str,
    end: Lsn,
    events: u64,
    shape: u64,
) -> anyhow::Result<Vec<Row>> {
    server.reset().await?;
    let d = drain(admin, pg, server, slot, end, events).await?;
    let walbox_rate = events as f64 / d.secs;
    // Past start-up: from the first ack (the first batch's events left out of the count).
    let steady = d
        .first_ack
        .filter(|f| *f < d.secs)
        .map(|f| events as f64 / (d.secs - f));
    eprintln!(
        "{} {shape}-row: walbox {walbox_rate:.0} events/s ({:.2} s, first ack at {:?} s, slot confirmed at {:.2} s), peak RSS {}, CPU walbox {:.1} s, PostgreSQL {:.1} s",
        server.kind,
        d.secs,
        d.first_ack,
        d.confirmed,
        format::mib(d.rss),
        d.cpu,
        d.pg_cpu
    );
    let messages = server.read_back(events).await?;
    if messages.len() as u64 != events {
        bail!(
            "{}: the broker holds {} of {events} events",
            server.kind,
            messages.len()
        );
    }
    eprintln!(
        "{}: read back {} messages, {} destinations",
        server.kind,
        fmt_n(messages.len() as u64),
        servers::destinations(&messages)
    );
    let mut rows = Vec::new();
    for (label, mode) in server.kind.reference_modes() {
        server.reset().await?;
        let cpu0 = procs::cpu_seconds(std::process::id());
        let secs = reference::publish(server, &messages, mode).await?;
        let plain_cpu = procs::cpu_seconds(std::process::id()) - cpu0;
        let held = server.count().await?;
        if held != events {
            bail!("{label}: the broker holds {held} of {events} events after the plain client");
        }
        let plain = events as f64 / secs;
        eprintln!(
            "{label} {shape}-row: plain client {plain:.0} events/s ({secs:.2} s, CPU {plain_cpu:.1} s)"
        );
        let is_walbox_mode = rows.is_empty();
        rows.push(Row {
            broker: label.to_owned(),
            shape,
            events,
            walbox: Some(walbox_rate),
            steady,
            plain,
            plain_cpu,
            cpu: is_walbox_mode.then_some((d.cpu, d.pg_cpu)),
            rss: is_walbox_mode.then_some(d.rss),
            recv: None,
        });
    }
    server.reset().await?;
    Ok(rows)
}

/// The markdown table.
fn report(settings: &Settings, rows: &[Row], versions: &[String]) -> String {
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut t = String::new();
    t.push_str("# walbox against plain broker clients\n\n");
    t.push_str(&format!(
        "{date}; nproc {nproc}; {}; {} events per drain.\n\n",
        format::machine(),
        fmt_n(settings.events)
    ));
    t.push_str(&format!("Servers: {}.\n\n", versions.join("; ")));
    t.push_str(
        "| broker | shape | events | walbox events/s | plain client events/s | ratio (target ≥ 0.8×) | walbox peak RSS MiB (target < 40) | walbox events/s from its 1st ack | ratio from 1st ack | CPU s: walbox + PostgreSQL / plain client | walbox / pg_recvlogical | walbox / the slower of the two |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        t.push_str(&format!(
            "| {} | {}-row tx | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.broker,
            r.shape,
            fmt_n(r.events),
            r.walbox.map_or("–".into(), k),
            k(r.plain),
            r.walbox.map_or("–".into(), |w| ratio(w, r.plain)),
            r.rss.map_or("–".into(), |b| format!(
                "{:.1}",
                b as f64 / (1024.0 * 1024.0)
            )),
            r.steady.map_or("–".into(), k),
            r.steady.map_or("–".into(), |w| ratio(w, r.plain)),
            r.cpu.map_or_else(
                || format!("– / {:.1}", r.plain_cpu),
                |(w, pg)| format!("{w:.1} + {pg:.1} / {:.1}", r.plain_cpu)
            ),
            match (r.walbox, r.recv) {
                (Some(w), Some(p)) => ratio(w, p),
                _ => "–".into(),
            },
            match (r.walbox, r.recv) {
                (Some(w), Some(p)) => ratio(w, p.min(r.plain)),
                _ => "–".into(),
            },
        ));
    }
    t.push_str(
        "\nwalbox: from spawning `walbox run` until the broker acknowledged the last event \
         (`walbox_events_published_total`; includes start-up and decoding). Plain client: the same messages read back from the \
         broker, published again from memory, first publish → last ack. `nats (window 10k)`: the \
         plain client without walbox's one-in-flight-per-subject rule. \"From 1st ack\": all \
         events over the time from walbox's first acknowledged event to its last (its \
         `/metrics`), which leaves start-up out (an upper bound: the first batch is \
         counted but not timed). CPU: walbox's CPU seconds and the PostgreSQL server's (its \
         walsender decoding the WAL, and the rest) until walbox's last ack, against the plain \
         client's (the bench process); the broker's own CPU is in neither, and on a machine of \
         few cores the three processes of walbox's path share them. `pg_recvlogical`: the \
         same backlog on a slot of its own drained to `/dev/null` over the same Unix socket, \
         before the brokers' runs (its events/s in the plain-client column, its CPU and \
         PostgreSQL's in its label); walbox / pg_recvlogical is how much of PostgreSQL's own \
         pace walbox's relay to that broker keeps. The last column holds walbox against the \
         slower of its path's two ends, measured apart: the broker taking the messages from \
         memory (the plain client) and PostgreSQL streaming the WAL with no broker behind it \
         (`pg_recvlogical`). A relay cannot be faster than either; this ratio is what walbox \
         itself costs.\n",
    );
    t
}
