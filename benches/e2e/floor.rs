//! The producer's floor: walbox's own `KafkaSink` (the same producer settings) producing the
//! events of a backlog drain with no PostgreSQL, no decoding and no mapping, in a child process
//! whose CPU is read the same way as walbox's. It is work `pg_recvlogical` does not do at all
//! (it writes the stream to `/dev/null`), so when the floor alone costs more than
//! `pg_recvlogical`, no relay built on librdkafka can cost less. A producer's cost per event
//! depends on its rate (a faster stream fills bigger batches in `linger.ms`), so the floor is run
//! twice: fed as fast as the producer takes records, and paced at the rate walbox drained the
//! same backlog, the like-for-like figure.
//!
//! The child is this executable started with [`FLOOR_ARG`] `<brokers> <events> <rate>`. It maps
//! the 100-row transaction of the benches' captured stream once (the seeds' row, to topic
//! `orders`), hands those events to the producer in turn until `<events>` were produced (at most
//! `<rate>` per second, counted from the start, when `<rate>` is not 0), keeping at most the
//! relay's default `relay.max_in_flight` unacknowledged, and prints
//! `<cpu seconds> <wall seconds>` once the last is acknowledged.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use walbox::config::{KafkaConfig, DEFAULT_MAX_IN_FLIGHT};
use walbox::outbox::OutboxMapper;
use walbox::sink::kafka::KafkaSink;
use walbox::sink::{AckQueue, SinkError};
use walbox::source::pgoutput::Decoder;

#[path = "../common/fixture.rs"]
#[allow(dead_code)]
mod fixture;

use crate::procs;

/// The argument that turns the bench executable into the producer-floor child.
pub const FLOOR_ARG: &str = "__walbox_bench_producer_floor";

/// One floor run: events produced, CPU seconds of the whole child, wall time.
#[derive(Debug, Clone, Copy, Default)]
pub struct Floor {
    pub events: u64,
    pub cpu: f64,
    pub wall: f64,
}

impl Floor {
    /// Events per second.
    pub fn rate(&self) -> f64 {
        self.events as f64 / self.wall
    }
}

/// Runs the child against `brokers` for `events` events, at most `rate` per second (`None`: as
/// fast as the producer takes them).
pub fn run(brokers: &str, events: u64, rate: Option<f64>) -> anyhow::Result<Floor> {
    let exe = std::env::current_exe().context("locating the bench executable")?;
    let rate = rate.map_or(0, |r| r as u64).to_string();
    let out = Command::new(exe)
        .args([FLOOR_ARG, brokers, &events.to_string(), &rate])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("starting the producer-floor child")?;
    if !out.status.success() {
        bail!("the producer-floor child failed ({})", out.status);
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let mut parts = line.split_whitespace().map(str::parse::<f64>);
    match (parts.next(), parts.next()) {
        (Some(Ok(cpu)), Some(Ok(wall))) => Ok(Floor { events, cpu, wall }),
        _ => bail!("the producer-floor child printed {line:?}"),
    }
}

/// Entry point of the child: never returns normally.
pub fn child_main() -> ! {
    let args: Vec<String> = std::env::args().collect();
    let number = |i: usize| args.get(i).map(|n| n.parse::<u64>());
    let code = match (args.get(2), number(3), number(4)) {
        (Some(brokers), Some(Ok(events)), Some(Ok(rate))) => match produce(brokers, events, rate) {
            Ok((cpu, wall)) => {
                println!("{cpu} {wall}");
                0
            }
            Err(e) => {
                eprintln!("producer floor: {e:#}");
                1
            }
        },
        _ => {
            eprintln!("producer floor: usage: {FLOOR_ARG} <brokers> <events> <rate>");
            2
        }
    };
    std::process::exit(code)
}

/// Produces `events` events, at most `rate` per second unless it is 0; returns (CPU seconds of
/// this process, wall seconds).
fn produce(brokers: &str, events: u64, rate: u64) -> anyhow::Result<(f64, f64)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let kafka = KafkaConfig::for_brokers(brokers);
        let acks = Arc::new(AckQueue::default());
        let sink = KafkaSink::new(&kafka, acks.clone())?;
        let (big, _) = fixture::shapes();
        let mut mapped = Vec::new();
        fixture::for_each_event(
            &mut OutboxMapper::new(&fixture::outbox_config()),
            &mut Decoder::default(),
            &big,
            |e| mapped.push(e),
        );
        let t0 = Instant::now();
        let (mut sent, mut acked) = (0u64, 0u64);
        let mut batch = Vec::new();
        while acked < events {
            let due = match rate {
                0 => events,
                r => events.min((t0.elapsed().as_secs_f64() * r as f64) as u64),
            };
            while sent < due && sent - acked < DEFAULT_MAX_IN_FLIGHT as u64 {
                match sink.send(&mapped[(sent % mapped.len() as u64) as usize], sent, 0) {
                    Ok(()) => sent += 1,
                    Err(SinkError::QueueFull) => break,
                    Err(e) => bail!("producing: {e}"),
                }
            }
            if sent < events && rate > 0 {
                // The next events fall due within a millisecond: wake for acks or for them.
                tokio::select! {
                    _ = acks.wait() => {}
                    _ = tokio::time::sleep(Duration::from_millis(1)) => {}
                }
            } else {
                acks.wait().await;
            }
            acks.drain_into(&mut batch);
            for ack in batch.drain(..) {
                ack.result.context("the broker failed a record")?;
                acked += 1;
            }
        }
        let wall = t0.elapsed().as_secs_f64();
        Ok((procs::cpu_seconds(std::process::id()), wall))
    })
}
