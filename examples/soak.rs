//! A bounded soak: walbox (the release binary, as a child process) relays a steady stream of
//! outbox transactions for `--minutes` while random faults hit it, and an independent consumer
//! counts every event in Kafka. Prints events, duplicates, the backlog and walbox's RSS every
//! 30 s, and a summary with the missing events at the end (exit status 1 if any is missing).
//!
//! ```sh
//! cargo build --release --features sandbox --bin walbox --example soak
//! cargo run --release --features sandbox --example soak -- --minutes 30            # exactly-once
//! cargo run --release --features sandbox --example soak -- --minutes 30 --at-least-once
//! ```
//!
//! Throwaway PostgreSQL cluster (the sandbox's), librdkafka's mock cluster with 3 brokers in
//! this process. Faults, one every 5–15 s: SIGKILL and restart; SIGTERM and restart; produce
//! requests refused for 3 s; EndTxn answered "not coordinator" / "concurrent transactions";
//! the walsender terminated; a partition's leader moved. The consumer reads `read_committed`;
//! the mock cluster writes no transaction markers, so in exactly-once mode the records of
//! transactions aborted by a kill are counted as duplicates here (a real broker hides them).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr as E};
use rdkafka::{Offset, TopicPartitionList};
use walbox::sandbox::broker::Broker;
use walbox::sandbox::postgres::{PgCluster, PgClusterOptions};

const TOPIC: &str = "soak.events";
const PARTITIONS: i32 = 4;
const SLOT: &str = "soak";

struct Args {
    minutes: f64,
    rate: u64,
    exactly_once: bool,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        minutes: 30.0,
        rate: 2_000,
        exactly_once: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--minutes" => a.minutes = it.next().context("--minutes N")?.parse()?,
            "--rate" => a.rate = it.next().context("--rate EVENTS_PER_S")?.parse()?,
            "--at-least-once" => a.exactly_once = false,
            "--bench" => {}
            other => bail!("unknown argument {other:?} (--minutes N, --rate N, --at-least-once)"),
        }
    }
    Ok(a)
}

/// The walbox binary next to this example (`target/<profile>/walbox`).
fn walbox_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let bin = exe
        .parent()
        .and_then(|examples| examples.parent())
        .map(|dir| dir.join("walbox"))
        .context("locating the walbox binary")?;
    if !bin.exists() {
        bail!(
            "{} is missing: build it first (cargo build --release --bin walbox)",
            bin.display()
        );
    }
    Ok(bin)
}

fn spawn_walbox(bin: &PathBuf, url: &str, brokers: &str, eos: bool) -> anyhow::Result<Child> {
    Ok(Command::new(bin)
        .arg("run")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("WALBOX_POSTGRES_URL", url)
        .env("WALBOX_POSTGRES_SLOT", SLOT)
        .env("WALBOX_POSTGRES_PUBLICATION", SLOT)
        .env("WALBOX_POSTGRES_CREATE_SLOT", "true")
        .env("WALBOX_POSTGRES_CREATE_PUBLICATION", "true")
        .env("WALBOX_POSTGRES_ON_SLOT_BUSY", "wait")
        .env("WALBOX_KAFKA_BROKERS", brokers)
        .env("WALBOX_KAFKA_EXACTLY_ONCE", eos.to_string())
        .env("WALBOX_HTTP_LISTEN", "off")
        .env("WALBOX_RELAY_BACKOFF_MAX", "1s")
        .env("WALBOX_LOG_LEVEL", "error")
        .stdin(Stdio::null())
        .spawn()?)
}

fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// Counts every record of the topic by its `id` header, read_committed, from the beginning.
fn consume(brokers: String, counts: Arc<Mutex<HashMap<i64, u32>>>, stop: Arc<AtomicBool>) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", "soak-counter")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(TOPIC, p, Offset::Beginning)
            .expect("partition");
    }
    consumer.assign(&tpl).expect("assign");
    while !stop.load(Ordering::Relaxed) {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            let id = m
                .headers()
                .and_then(|h| h.iter().find(|h| h.key == "id").and_then(|h| h.value))
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok());
            if let Some(id) = id {
                *counts.lock().unwrap().entry(id).or_insert(0) += 1;
            }
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args = args()?;
    let bin = walbox_binary()?;
    let mode = if args.exactly_once {
        "exactly-once"
    } else {
        "at-least-once"
    };
    let cluster = PgCluster::start(PgClusterOptions {
        watchdog: true,
        ..Default::default()
    })?;
    cluster.create_database("soak")?;
    cluster.psql("soak", walbox::sandbox::SCHEMA)?;
    // The slot exists before the first row: every row written is in its stream.
    cluster.psql(
        "soak",
        "CREATE PUBLICATION soak FOR TABLE outbox WITH (publish = 'insert'); \
         SELECT pg_create_logical_replication_slot('soak', 'pgoutput')",
    )?;
    let url = cluster.url("soak");
    let broker = Broker::mock(3)?;
    broker.create_topic(TOPIC, PARTITIONS)?;
    let brokers = broker.bootstrap_servers();
    let mock = broker.mock_cluster().context("mock cluster")?;
    eprintln!(
        "soak: {mode}, {} min, {} events/s, walbox {}",
        args.minutes,
        args.rate,
        bin.display()
    );

    let stop = Arc::new(AtomicBool::new(false));
    let consumer_stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicI64::new(0));
    let counts: Arc<Mutex<HashMap<i64, u32>>> = Arc::default();
    let consumer = {
        let (b, c, s) = (brokers.clone(), counts.clone(), consumer_stop.clone());
        std::thread::spawn(move || consume(b, c, s))
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let writer = {
        let (url, stop, committed, rate) =
            (url.clone(), stop.clone(), committed.clone(), args.rate);
        runtime.spawn(async move {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
            tokio::spawn(conn);
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            let started = Instant::now();
            let mut written = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let n: i64 = rng.random_range(1..=50);
                let row = client
                    .query_one(
                        "WITH i AS (INSERT INTO outbox (aggregate_id, topic, event_type, payload) \
                         SELECT 'agg-' || (random() * 1000)::int, $1, 'soak', jsonb_build_object('n', g) \
                         FROM generate_series(1, $2::bigint) g RETURNING id) SELECT max(id) FROM i",
                        &[&TOPIC, &n],
                    )
                    .await;
                if let Ok(r) = row {
                    committed.fetch_max(r.get::<_, i64>(0), Ordering::Relaxed);
                }
                written += n as u64;
                let due = started + Duration::from_secs_f64(written as f64 / rate as f64);
                tokio::time::sleep_until(due.into()).await;
            }
            anyhow::Ok(())
        })
    };

    let mut walbox = spawn_walbox(&bin, &url, &brokers, args.exactly_once)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let end = Instant::now() + Duration::from_secs_f64(args.minutes * 60.0);
    let started = Instant::now();
    let mut next_fault = Instant::now() + Duration::from_secs(5);
    let mut next_report = Instant::now() + Duration::from_secs(30);
    let mut faults: HashMap<&str, u32> = HashMap::new();
    let mut peak_rss = 0f64;
    println!("| minute | committed | in Kafka (distinct) | duplicates | behind | walbox RSS MiB |");
    println!("|---:|---:|---:|---:|---:|---:|");
    let report = |counts: &Mutex<HashMap<i64, u32>>, rss: f64| {
        let c = counts.lock().unwrap();
        let dup: u64 = c.values().map(|n| u64::from(n.saturating_sub(1))).sum();
        let top = committed.load(Ordering::Relaxed);
        println!(
            "| {:.1} | {top} | {} | {dup} | {} | {rss:.1} |",
            started.elapsed().as_secs_f64() / 60.0,
            c.len(),
            top - c.len() as i64,
        );
    };
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(200));
        if let Some(rss) = rss_mib(walbox.id()) {
            peak_rss = peak_rss.max(rss);
        }
        if let Some(status) = walbox.try_wait()? {
            eprintln!("soak: walbox exited ({status}); restarting");
            *faults.entry("unexpected exit").or_default() += 1;
            walbox = spawn_walbox(&bin, &url, &brokers, args.exactly_once)?;
        }
        if Instant::now() >= next_report {
            report(&counts, rss_mib(walbox.id()).unwrap_or(0.0));
            next_report += Duration::from_secs(30);
        }
        if Instant::now() < next_fault {
            continue;
        }
        next_fault = Instant::now() + Duration::from_secs(rng.random_range(5..=15));
        let fault = match rng.random_range(0..6) {
            0 => {
                walbox.kill()?;
                walbox.wait()?;
                walbox = spawn_walbox(&bin, &url, &brokers, args.exactly_once)?;
                "SIGKILL"
            }
            1 => {
                Command::new("kill")
                    .args(["-TERM", &walbox.id().to_string()])
                    .status()?;
                walbox.wait()?;
                walbox = spawn_walbox(&bin, &url, &brokers, args.exactly_once)?;
                "SIGTERM"
            }
            2 => {
                mock.request_errors(
                    RDKafkaApiKey::Produce,
                    &[E::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 100_000],
                );
                std::thread::sleep(Duration::from_secs(3));
                mock.clear_request_errors(RDKafkaApiKey::Produce);
                "produce refused 3 s"
            }
            3 => {
                mock.request_errors(
                    RDKafkaApiKey::EndTxn,
                    &[
                        E::RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
                        E::RD_KAFKA_RESP_ERR_CONCURRENT_TRANSACTIONS,
                    ],
                );
                "EndTxn errors"
            }
            4 => {
                let _ = cluster.psql(
                    "soak",
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE active_pid IS NOT NULL",
                );
                "walsender terminated"
            }
            _ => {
                let p = rng.random_range(0..PARTITIONS);
                mock.partition_leader(TOPIC, p, Some(rng.random_range(1..=3)))?;
                "leader moved"
            }
        };
        *faults.entry(fault).or_default() += 1;
    }
    // Drain: the writer stops, faults stop, walbox catches up.
    stop.store(true, Ordering::Relaxed);
    runtime.block_on(writer)??;
    let top = cluster
        .psql("soak", "SELECT count(*) FROM outbox")?
        .trim()
        .parse::<i64>()
        .unwrap_or(0);
    let counts_for_drain = counts.clone();
    let drained = {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if counts_for_drain.lock().unwrap().len() as i64 >= top || Instant::now() > deadline {
                break Instant::now() <= deadline;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    consumer_stop.store(true, Ordering::Relaxed);
    report(&counts, rss_mib(walbox.id()).unwrap_or(0.0));
    Command::new("kill")
        .args(["-TERM", &walbox.id().to_string()])
        .status()?;
    walbox.wait()?;
    let _ = consumer.join();
    let c = counts.lock().unwrap();
    // The ids the table holds (identity values can skip; only rows that exist count).
    let ids: Vec<i64> = cluster
        .psql("soak", "SELECT id FROM outbox ORDER BY id")?
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let missing_ids: Vec<i64> = ids
        .iter()
        .copied()
        .filter(|id| !c.contains_key(id))
        .collect();
    let missing = missing_ids.len();
    if let (Some(first), Some(last)) = (missing_ids.first(), missing_ids.last()) {
        eprintln!("soak: missing ids from {first} to {last}");
    }
    let duplicates: u64 = c.values().map(|n| u64::from(n.saturating_sub(1))).sum();
    let mut fault_list: Vec<String> = faults.iter().map(|(k, v)| format!("{k} ×{v}")).collect();
    fault_list.sort();
    println!(
        "\nsoak summary ({mode}, {:.0} min): {} events committed, {} in Kafka, {missing} missing, {duplicates} duplicates, walbox peak RSS {peak_rss:.1} MiB; faults: {}{}",
        args.minutes,
        ids.len(),
        c.len(),
        fault_list.join(", "),
        if drained { "" } else { "; did not catch up within 180 s" }
    );
    if missing > 0 {
        std::process::exit(1);
    }
    Ok(())
}
