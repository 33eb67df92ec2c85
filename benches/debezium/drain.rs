//! Backlog drains: N rows loaded behind one slot per drain (all created at one LSN), then each
//! relay started on its slot in turn, in pairs of alternating order. A drain ends when the end
//! offsets of its topic's partitions sum to N, polled every [`POLL`]: the time the last event
//! is in Kafka, the same for both relays, whatever a consumer would add.

use std::time::Duration;

use anyhow::{bail, Context};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::procs;
use crate::relay::{Relay, Which};
use crate::{Bench, PARTITIONS};

/// How often the end offsets (and the processes' CPU) are read.
const POLL: Duration = Duration::from_millis(10);
/// How long one drain may take.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(600);
/// The routing value (`aggregatetype`) of the backlog's rows (`bench_load`'s).
const AGGREGATE: &str = "orders";

/// One drain's measurements.
#[derive(Debug, Clone)]
pub struct Drain {
    /// Which relay.
    pub which: Which,
    /// Events in Kafka at the end.
    pub events: u64,
    /// Process spawned → first event in Kafka.
    pub first: Duration,
    /// Process spawned → last event in Kafka.
    pub last: Duration,
    /// The relay's CPU seconds from its start to the first event in Kafka.
    pub relay_cpu_start: f64,
    /// The relay's CPU seconds from the first event to the last.
    pub relay_cpu_drain: f64,
    /// CPU seconds of the walsender serving the slot, from its start to the last event.
    pub walsender_cpu: f64,
    /// The relay's peak resident set size (`VmHWM`), bytes.
    pub peak_rss: u64,
}

impl Drain {
    /// Events per second from the first event in Kafka to the last.
    pub fn rate(&self) -> f64 {
        self.events as f64 / (self.last - self.first).as_secs_f64().max(1e-3)
    }

    /// Events per second from the process's start to the last event in Kafka.
    pub fn rate_from_start(&self) -> f64 {
        self.events as f64 / self.last.as_secs_f64()
    }

    /// The relay's CPU seconds per 100k events, first event to last.
    pub fn relay_cpu_per_100k(&self) -> f64 {
        self.relay_cpu_drain * 100_000.0 / self.events as f64
    }

    /// The walsender's CPU seconds per 100k events.
    pub fn walsender_cpu_per_100k(&self) -> f64 {
        self.walsender_cpu * 100_000.0 / self.events as f64
    }
}

/// The sum of the end offsets (high watermarks) of `topic`'s partitions.
fn end_offsets(consumer: &BaseConsumer, topic: &str) -> anyhow::Result<u64> {
    let mut sum = 0;
    for p in 0..PARTITIONS {
        let (_, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(5))
            .with_context(|| format!("end offset of {topic}[{p}]"))?;
        sum += u64::try_from(high).unwrap_or(0);
    }
    Ok(sum)
}

impl Bench {
    /// Loads the backlog of `per_tx`-row transactions behind one slot per drain, runs the pairs
    /// (walbox first, then Debezium first, alternating) and drops the slots.
    pub async fn drain_pairs(&self, per_tx: u64) -> anyhow::Result<Vec<(Drain, Drain)>> {
        let n = self.settings.rows;
        let pairs = self.settings.pairs;
        let slots: Vec<String> = (0..pairs)
            .flat_map(|i| {
                [
                    format!("drain{per_tx}_{i}_wbx"),
                    format!("drain{per_tx}_{i}_dbz"),
                ]
            })
            .collect();
        let names: Vec<&str> = slots.iter().map(String::as_str).collect();
        crate::backlog::load(&self.admin, "outbox", "bench_load", &names, n, per_tx).await?;
        let mut out = Vec::new();
        for i in 0..pairs {
            let order = if i % 2 == 0 {
                [Which::Walbox, Which::Debezium]
            } else {
                [Which::Debezium, Which::Walbox]
            };
            let mut pair = Vec::new();
            for which in order {
                let short = if which == Which::Walbox { "wbx" } else { "dbz" };
                let slot = format!("drain{per_tx}_{i}_{short}");
                let d = self
                    .drain(which, &slot, &format!("d{per_tx}x{i}"), n)
                    .await?;
                eprintln!(
                    "drain {per_tx}-row tx, pair {i}, {}: {:.0} events/s (from start {:.0}/s), \
                     first event after {:.2} s, relay CPU {:.2} s/100k (+{:.2} s start-up), \
                     walsender CPU {:.2} s/100k, peak RSS {} MiB",
                    which.name(),
                    d.rate(),
                    d.rate_from_start(),
                    d.first.as_secs_f64(),
                    d.relay_cpu_per_100k(),
                    d.relay_cpu_start,
                    d.walsender_cpu_per_100k(),
                    d.peak_rss >> 20
                );
                pair.push(d);
            }
            let (a, b) = (pair.remove(0), pair.remove(0));
            out.push(if a.which == Which::Walbox {
                (a, b)
            } else {
                (b, a)
            });
        }
        self.drop_slots().await?;
        Ok(out)
    }

    /// One drain of `n` events by `which` from `slot` into the topic of `run`.
    async fn drain(&self, which: Which, slot: &str, run: &str, n: u64) -> anyhow::Result<Drain> {
        let topic = which.topic(run, AGGREGATE);
        self.create_topic(&topic)?;
        let bootstrap = self.kafka.bootstrap_servers();
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .create()?;
        let (mut relay, started) =
            Relay::spawn(which, &self.cluster, &bootstrap, slot, run, &self.settings)?;
        let pid = relay.pid();
        let mut walsender = None;
        let mut first: Option<(Duration, f64)> = None;
        let mut offsets_error = None;
        let (events, last, relay_cpu, walsender_cpu, peak_rss) = loop {
            relay.check_alive()?;
            if walsender.is_none() {
                walsender = self.walsender(slot).await?;
            }
            // The CPU readings precede the offsets: a reading after the last event cannot
            // include work done after it.
            let relay_cpu = procs::cpu_seconds(pid);
            let ws_cpu = walsender.map_or(0.0, procs::cpu_seconds);
            let rss = procs::peak_rss(pid).unwrap_or(0);
            // A topic just created may not have its leaders yet: an error reads as no events.
            let events = match tokio::task::block_in_place(|| end_offsets(&consumer, &topic)) {
                Ok(n) => n,
                Err(e) => {
                    offsets_error = Some(e);
                    0
                }
            };
            let now = started.elapsed();
            if events > 0 && first.is_none() {
                first = Some((now, relay_cpu));
            }
            if events >= n {
                break (events, now, relay_cpu, ws_cpu, rss);
            }
            if now > DRAIN_TIMEOUT {
                bail!(
                    "{} drained {events} of {n} events in {DRAIN_TIMEOUT:?} (last end-offset \
                     error: {offsets_error:?})",
                    which.name()
                );
            }
            tokio::time::sleep(POLL).await;
        };
        relay.stop()?;
        let (first, relay_cpu_start) = first.unwrap_or((last, relay_cpu));
        Ok(Drain {
            which,
            events,
            first,
            last,
            relay_cpu_start,
            relay_cpu_drain: relay_cpu - relay_cpu_start,
            walsender_cpu,
            peak_rss,
        })
    }
}
