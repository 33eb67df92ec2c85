//! A mixed-fault soak on Apache Kafka: two walbox processes (the built binary next to this
//! example; one active, one hot standby) relay a steady stream of outbox transactions from a
//! throwaway PostgreSQL to a three-node KRaft cluster (the jars in the Kafka cache) while faults
//! hit one after another, and an independent `read_committed` consumer counts every event.
//!
//! ```sh
//! cargo build --release --features sandbox --bin walbox --example soak
//! target/release/examples/soak --minutes 30                  # exactly-once, a fault every 5–15 s
//! target/release/examples/soak --faults 1000 --gap 1-3       # stop after 1,000 faults
//! target/release/examples/soak --faults 50 --at-least-once
//! ```
//!
//! Faults (see `faults.rs`): the active walbox SIGKILLed or SIGTERMed (the standby takes over;
//! the stopped one comes back as the standby), the Kafka node leading a partition killed and
//! restarted, PostgreSQL restarted (fast, or immediate: a crash), the active walbox partitioned
//! from PostgreSQL, and both walbox processes cut off from Kafka (each through TCP proxies).
//! After each fault the soak waits until events flow again (an event committed after the fault
//! is in Kafka), then `--gap` seconds, then injects the next.
//!
//! Prints a line per fault, a table row every 30 s, and a summary: faults per kind, standby
//! takeovers, events committed, missing, duplicates, walbox's RSS. Exit status 1 when an event
//! is missing (or the relay does not catch up after the last fault), when events did not flow
//! again within 180 s of a fault, when a fault could not be injected or healed, or
//! (exactly-once) when the consumer read any event twice.

mod faults;
mod members;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use walbox::sandbox::broker::Broker;
use walbox::sandbox::kafka::KafkaServerOptions;
use walbox::sandbox::kafka_cluster::KafkaCluster;
use walbox::sandbox::postgres::{PgCluster, PgClusterOptions};

use faults::{Fault, Targets};
use members::Members;

/// The topic the events go to.
pub const TOPIC: &str = "soak.events";
const PARTITIONS: i32 = 4;
/// The slot and publication.
pub const SLOT: &str = "soak";
/// How long events may take to flow again after a fault.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the relay may take to catch up once the writer stopped.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);

struct Args {
    minutes: Option<f64>,
    faults: Option<u64>,
    rate: u64,
    gap: (f64, f64),
    exactly_once: bool,
    seed: u64,
    log_dir: Option<PathBuf>,
}

const USAGE: &str = "usage: soak [--minutes M] [--faults N] [--gap MIN-MAX] [--rate EVENTS_PER_S] \
                     [--at-least-once] [--seed N] [--log-dir DIR]";

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        minutes: None,
        faults: None,
        rate: 500,
        gap: (5.0, 15.0),
        exactly_once: true,
        seed: 42,
        log_dir: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .with_context(|| format!("{name} needs a value; {USAGE}"))
        };
        match arg.as_str() {
            "--minutes" => a.minutes = Some(value("--minutes")?.parse().context("--minutes")?),
            "--faults" => a.faults = Some(value("--faults")?.parse().context("--faults")?),
            "--rate" => a.rate = value("--rate")?.parse().context("--rate")?,
            "--seed" => a.seed = value("--seed")?.parse().context("--seed")?,
            "--log-dir" => a.log_dir = Some(value("--log-dir")?.into()),
            "--gap" => {
                let v = value("--gap")?;
                let (lo, hi) = v.split_once('-').unwrap_or((&v, &v));
                a.gap = (lo.parse().context("--gap")?, hi.parse().context("--gap")?);
                if a.gap.0 > a.gap.1 || a.gap.0 < 0.0 {
                    bail!("--gap {v}: give MIN-MAX seconds, MIN <= MAX");
                }
            }
            "--at-least-once" => a.exactly_once = false,
            "--bench" => {}
            other => bail!("unknown argument {other:?}; {USAGE}"),
        }
    }
    if a.rate == 0 {
        bail!("--rate must be positive");
    }
    if a.minutes.is_none() && a.faults.is_none() {
        a.minutes = Some(30.0);
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

/// What the writer committed and what the consumer read.
#[derive(Default)]
struct Tally {
    /// The highest outbox id of a transaction the writer saw commit.
    committed: AtomicI64,
    /// How often the consumer read each id.
    counts: Mutex<HashMap<i64, u32>>,
}

impl Tally {
    fn seen(&self, id: i64) -> bool {
        self.counts.lock().unwrap().contains_key(&id)
    }
    fn distinct(&self) -> usize {
        self.counts.lock().unwrap().len()
    }
    fn duplicates(&self) -> u64 {
        duplicates(&self.counts.lock().unwrap())
    }
}

/// Reads beyond the first, over all ids.
fn duplicates(counts: &HashMap<i64, u32>) -> u64 {
    counts
        .values()
        .map(|n| u64::from(n.saturating_sub(1)))
        .sum()
}

/// Counts every record of the topic by its `id` header, read_committed, from the beginning,
/// straight from the brokers (not through the proxies).
fn consume(brokers: String, tally: Arc<Tally>, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", "soak-counter")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("log_level", "0")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(TOPIC, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    while !stop.load(Ordering::Relaxed) {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            let id = m
                .headers()
                .and_then(|h| h.iter().find(|h| h.key == "id").and_then(|h| h.value))
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok());
            if let Some(id) = id {
                *tally.counts.lock().unwrap().entry(id).or_insert(0) += 1;
            }
        }
    }
    Ok(())
}

/// Writes transactions of 1–20 events at `rate` events/s straight to PostgreSQL (not through
/// the proxies), reconnecting after each PostgreSQL restart, until `stop`.
async fn write(url: String, rate: u64, tally: Arc<Tally>, stop: Arc<AtomicBool>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let started = Instant::now();
    let mut written = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let client = match tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
            Ok((client, conn)) => {
                tokio::spawn(conn);
                client
            }
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        while !stop.load(Ordering::Relaxed) {
            let n: i64 = rng.random_range(1..=20);
            let row = client
                .query_one(
                    "WITH i AS (INSERT INTO outbox (aggregate_id, topic, event_type, payload) \
                     SELECT 'agg-' || (random() * 1000)::int, $1, 'soak', jsonb_build_object('n', g) \
                     FROM generate_series(1, $2::bigint) g RETURNING id) SELECT max(id) FROM i",
                    &[&TOPIC, &n],
                )
                .await;
            match row {
                Ok(r) => {
                    tally
                        .committed
                        .fetch_max(r.get::<_, i64>(0), Ordering::Relaxed);
                    written += n as u64;
                }
                Err(_) => break,
            }
            let due = started + Duration::from_secs_f64(written as f64 / rate as f64);
            tokio::time::sleep_until(due.into()).await;
        }
    }
}

/// The running soak: the infrastructure, the members and the figures.
struct Soak {
    pg: PgCluster,
    cluster: KafkaCluster,
    members: Members,
    tally: Arc<Tally>,
    exactly_once: bool,
    started: Instant,
    next_report: Instant,
    faults: BTreeMap<Fault, u32>,
    /// Seconds from the end of a fault to events flowing again, by kind.
    recovery: BTreeMap<Fault, Vec<f64>>,
    takeovers: u32,
    stalls: u32,
    /// Faults that could not be injected or healed.
    errors: u32,
    rss: (f64, f64),
}

impl Soak {
    /// Samples RSS, starts exited members again and prints a row every 30 s.
    fn tick(&mut self) -> anyhow::Result<()> {
        for r in self.members.rss_mib() {
            self.rss = (self.rss.0.min(r), self.rss.1.max(r));
        }
        for (i, status) in self.members.reap()? {
            println!(
                "  member {i} exited by itself ({status}); started again. Its last lines:\n{}",
                self.members.log_tail(i, 5)
            );
        }
        if Instant::now() >= self.next_report {
            self.next_report += Duration::from_secs(30);
            self.row();
        }
        Ok(())
    }

    fn row(&self) {
        let top = self.tally.committed.load(Ordering::Relaxed);
        let distinct = self.tally.distinct();
        let rss: Vec<String> = self
            .members
            .rss_mib()
            .iter()
            .map(|r| format!("{r:.1}"))
            .collect();
        println!(
            "| {:.1} | {} | {top} | {distinct} | {} | {} | {} |",
            self.started.elapsed().as_secs_f64() / 60.0,
            self.faults.values().sum::<u32>(),
            self.tally.duplicates(),
            top - distinct as i64,
            rss.join(" / "),
        );
    }

    /// Waits up to `timeout` for `done`, ticking meanwhile.
    fn wait(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&Self) -> bool,
    ) -> anyhow::Result<bool> {
        let deadline = Instant::now() + timeout;
        while !done(self) {
            if Instant::now() > deadline {
                return Ok(false);
            }
            self.tick()?;
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(true)
    }

    /// Waits until an event committed from now on is in Kafka.
    fn wait_flowing(&mut self) -> anyhow::Result<bool> {
        let before = self.tally.committed.load(Ordering::Relaxed);
        let deadline = Instant::now() + RECOVERY_TIMEOUT;
        if !self.wait(RECOVERY_TIMEOUT, |s| {
            s.tally.committed.load(Ordering::Relaxed) > before
        })? {
            return Ok(false);
        }
        let target = self.tally.committed.load(Ordering::Relaxed);
        let left = deadline.saturating_duration_since(Instant::now());
        self.wait(left, |s| s.tally.seen(target))
    }

    /// Injects one fault of `kind`, waits for recovery, and counts it.
    fn fault(&mut self, n: u64, kind: Fault, rng: &mut rand::rngs::StdRng) -> anyhow::Result<()> {
        let active_before = self
            .members
            .active(&self.pg)
            .and_then(|i| self.members.pids()[i]);
        let running_before: Vec<u32> = self.members.pids().into_iter().flatten().collect();
        let began = Instant::now();
        let detail = {
            let topics: &[&str] = if self.exactly_once {
                &[TOPIC, walbox::config::DEFAULT_PROGRESS_TOPIC]
            } else {
                &[TOPIC]
            };
            let mut targets = Targets {
                pg: &self.pg,
                cluster: &mut self.cluster,
                members: &mut self.members,
                topics,
            };
            // A fault that cannot be injected or healed (a broker that does not come back, a
            // walbox that ignores SIGTERM) is reported and counted; the soak goes on.
            match faults::inject(kind, &mut targets, rng) {
                Ok(detail) => detail,
                Err(e) => {
                    self.errors += 1;
                    format!("FAILED: {e:#}")
                }
            }
        };
        let injected = began.elapsed();
        *self.faults.entry(kind).or_default() += 1;
        let healed = Instant::now();
        let flowing = self.wait_flowing()?;
        let recovered = healed.elapsed().as_secs_f64();
        self.members.start_stopped()?;
        let active_after = self
            .members
            .active(&self.pg)
            .and_then(|i| self.members.pids()[i]);
        let takeover = active_after.is_some()
            && active_after != active_before
            && active_after.is_some_and(|p| running_before.contains(&p));
        if takeover {
            self.takeovers += 1;
        }
        println!(
            "fault {n} at {:.1} min: {}{}{} (took {:.1} s); events flowing again {}{}",
            self.started.elapsed().as_secs_f64() / 60.0,
            kind.label(),
            if detail.is_empty() { "" } else { ", " },
            detail,
            injected.as_secs_f64(),
            if flowing {
                format!("after {recovered:.1} s")
            } else {
                format!("NOT within {RECOVERY_TIMEOUT:?}")
            },
            if takeover {
                "; the standby took over"
            } else {
                ""
            },
        );
        if flowing {
            self.recovery.entry(kind).or_default().push(recovered);
        } else {
            self.stalls += 1;
            for i in 0..2 {
                println!(
                    "  member {i}'s last lines:\n{}",
                    self.members.log_tail(i, 10)
                );
            }
        }
        Ok(())
    }
}

/// Ranges of consecutive ids (`a–b`), the first `max` of them.
fn ranges(ids: &[i64], max: usize) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() && out.len() < max {
        let start = ids[i];
        while i + 1 < ids.len() && ids[i + 1] == ids[i] + 1 {
            i += 1;
        }
        out.push(if ids[i] == start {
            start.to_string()
        } else {
            format!("{start}–{}", ids[i])
        });
        i += 1;
    }
    out.join(", ")
}

fn log_dir(arg: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let dir = match arg {
        Some(d) => d,
        None => tempfile::Builder::new()
            .prefix("walbox-soak.")
            .tempdir()?
            .keep(),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn main() -> anyhow::Result<()> {
    let args = args()?;
    let bin = walbox_binary()?;
    let logs = log_dir(args.log_dir.clone())?;
    let mode = if args.exactly_once {
        "exactly-once"
    } else {
        "at-least-once"
    };
    let setup = Instant::now();
    let pg = PgCluster::start(PgClusterOptions {
        watchdog: true,
        ..Default::default()
    })?;
    pg.create_database("soak")?;
    pg.psql("soak", walbox::sandbox::SCHEMA)?;
    // The slot exists before the first row: every row written is in its stream.
    pg.psql(
        "soak",
        "CREATE PUBLICATION soak FOR TABLE outbox WITH (publish = 'insert'); \
         SELECT pg_create_logical_replication_slot('soak', 'pgoutput')",
    )?;
    let cluster = KafkaCluster::start_behind_proxies(KafkaServerOptions {
        watchdog: true,
        log_file: Some(logs.join("kafka.log")),
        ..Default::default()
    })?;
    let admin = Broker::External(cluster.bootstrap_servers());
    admin.create_topic(TOPIC, PARTITIONS)?;
    admin.create_topic(walbox::config::DEFAULT_PROGRESS_TOPIC, 1)?;
    println!(
        "soak: {mode}, {}{}{} events/s, a fault every {}–{} s after recovery; walbox {}; logs in {} (set up in {:.0} s)",
        args.faults.map(|n| format!("{n} faults, ")).unwrap_or_default(),
        args.minutes.map(|m| format!("{m} min at most, ")).unwrap_or_default(),
        args.rate,
        args.gap.0,
        args.gap.1,
        bin.display(),
        logs.display(),
        setup.elapsed().as_secs_f64(),
    );

    let tally = Arc::new(Tally::default());
    let stop_writer = Arc::new(AtomicBool::new(false));
    let stop_consumer = Arc::new(AtomicBool::new(false));
    let consumer = {
        let (b, t, s) = (
            cluster.bootstrap_servers(),
            tally.clone(),
            stop_consumer.clone(),
        );
        std::thread::spawn(move || consume(b, t, s))
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let writer = runtime.spawn(write(
        pg.url("soak"),
        args.rate,
        tally.clone(),
        stop_writer.clone(),
    ));
    let members = Members::start(
        &bin,
        &pg,
        &cluster.proxied_bootstrap_servers(),
        args.exactly_once,
        &logs,
    )?;
    let started = Instant::now();
    let mut soak = Soak {
        pg,
        cluster,
        members,
        tally: tally.clone(),
        exactly_once: args.exactly_once,
        started,
        next_report: started + Duration::from_secs(30),
        faults: BTreeMap::new(),
        recovery: BTreeMap::new(),
        takeovers: 0,
        stalls: 0,
        errors: 0,
        rss: (f64::MAX, 0.0),
    };
    println!("| minute | faults | committed | in Kafka (distinct) | duplicates | behind | walbox RSS MiB |");
    println!("|---:|---:|---:|---:|---:|---:|---|");
    if !soak.wait_flowing()? {
        bail!(
            "no event reached Kafka within {RECOVERY_TIMEOUT:?} of the start; logs in {}",
            logs.display()
        );
    }

    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let end = args
        .minutes
        .map(|m| started + Duration::from_secs_f64(m * 60.0));
    let mut n = 0u64;
    while args.faults.is_none_or(|max| n < max) && end.is_none_or(|e| Instant::now() < e) {
        let gap = Duration::from_secs_f64(rng.random_range(args.gap.0..=args.gap.1));
        let until = Instant::now() + gap;
        soak.wait(gap + Duration::from_secs(1), |_| Instant::now() >= until)?;
        n += 1;
        let kind = Fault::ALL[rng.random_range(0..Fault::ALL.len())];
        soak.fault(n, kind, &mut rng)?;
    }

    // Drain: the writer stops, the relay catches up with every row the table holds.
    stop_writer.store(true, Ordering::Relaxed);
    runtime.block_on(writer)?;
    let ids: Vec<i64> = soak
        .pg
        .psql("soak", "SELECT id FROM outbox ORDER BY id")?
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let drained = soak.wait(DRAIN_TIMEOUT, |s| {
        let c = s.tally.counts.lock().unwrap();
        ids.iter().all(|id| c.contains_key(id))
    })?;
    soak.row();
    soak.members.stop()?;
    stop_consumer.store(true, Ordering::Relaxed);
    consumer.join().expect("consumer thread")?;
    let passed = summary(&soak, &args, mode, &ids, drained, &logs);
    // The clusters stop (and their directories go) before the exit status is set.
    drop(soak);
    if !passed {
        std::process::exit(1);
    }
    Ok(())
}

/// Prints the summary; whether the soak passed.
fn summary(soak: &Soak, args: &Args, mode: &str, ids: &[i64], drained: bool, logs: &Path) -> bool {
    let counts = soak.tally.counts.lock().unwrap();
    let missing: Vec<i64> = ids
        .iter()
        .copied()
        .filter(|id| !counts.contains_key(id))
        .collect();
    let duplicates = duplicates(&counts);
    let duplicated: Vec<i64> = {
        let mut d: Vec<i64> = counts
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, _)| *id)
            .collect();
        d.sort_unstable();
        d
    };
    let total: u32 = soak.faults.values().sum();
    println!(
        "\nsoak summary ({mode}, {total} faults in {:.1} min, seed {}):",
        soak.started.elapsed().as_secs_f64() / 60.0,
        args.seed
    );
    for kind in Fault::ALL {
        let times = soak.recovery.get(&kind).cloned().unwrap_or_default();
        let (mean, max) = if times.is_empty() {
            (0.0, 0.0)
        } else {
            let max = times.iter().cloned().fold(0.0, f64::max);
            (times.iter().sum::<f64>() / times.len() as f64, max)
        };
        println!(
            "  {:<32} ×{:<4} events flowing again after {mean:.1} s on average, {max:.1} s at most",
            kind.label(),
            soak.faults.get(&kind).copied().unwrap_or(0),
        );
    }
    println!(
        "  standby takeovers: {}; walbox starts: {}; exits nobody asked for: {}; recoveries over {RECOVERY_TIMEOUT:?}: {}; faults that failed: {}",
        soak.takeovers,
        soak.members.starts,
        if soak.members.unexpected_exits.is_empty() {
            "none".to_owned()
        } else {
            soak.members
                .unexpected_exits
                .iter()
                .map(|(s, n)| format!("{s} ×{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        },
        soak.stalls,
        soak.errors,
    );
    println!(
        "  events committed: {}; in Kafka: {}; missing: {}; duplicates: {duplicates}{}",
        ids.len(),
        counts.len(),
        missing.len(),
        if drained {
            String::new()
        } else {
            format!("; NOT caught up within {DRAIN_TIMEOUT:?} of the writer stopping")
        },
    );
    println!(
        "  walbox RSS: {:.1}–{:.1} MiB (every process, sampled every 50 ms)",
        if soak.rss.0 == f64::MAX {
            0.0
        } else {
            soak.rss.0
        },
        soak.rss.1
    );
    println!("  logs: {}", logs.display());
    if !missing.is_empty() {
        println!("  MISSING ids: {}", ranges(&missing, 50));
    }
    if duplicates > 0 {
        println!("  ids read more than once: {}", ranges(&duplicated, 50));
    }
    missing.is_empty()
        && drained
        && !(soak.exactly_once && duplicates > 0)
        && soak.stalls == 0
        && soak.errors == 0
}
