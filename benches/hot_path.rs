//! Allocations and instructions per event on the relay's hot path: pgoutput decode → outbox
//! mapping → hand-off to the Kafka producer (`KafkaSink::send`, librdkafka's mock cluster in
//! this process), over the captured stream of `decode.rs`.
//!
//! ```sh
//! cargo bench --bench hot_path                        # allocations per event, both shapes
//! bash scripts/callgrind-hot-path.sh                  # instructions per event (valgrind)
//! ```
//!
//! Allocations are counted by a counting global allocator (`stats_alloc`) around the loop:
//! every Rust heap allocation of the path on any thread (the delivery callbacks on librdkafka's
//! thread included), none of librdkafka's own C allocations. `--repeat K` runs only the 100-row
//! shape K times, for the callgrind script, which counts the instructions executed inside
//! [`relay_path`] (on the calling thread) for two values of K and reports the difference per
//! event: setup and librdkafka's background threads drop out.

use std::alloc::System;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

use walbox::config::KafkaConfig;
use walbox::outbox::{EventPosition, OutboxMapper};
use walbox::sink::kafka::KafkaSink;
use walbox::sink::{Ack, AckQueue, SinkError};
use walbox::source::pgoutput::{self, Decoder, LogicalMessage};

#[path = "common/fixture.rs"]
mod fixture;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The path under test and what it needs across calls.
struct Path {
    mapper: OutboxMapper,
    decoder: Decoder,
    sink: KafkaSink,
    acks: Arc<AckQueue>,
    batch: Vec<Ack>,
    seq: u64,
}

impl Path {
    fn new(brokers: &str) -> Path {
        let kafka = KafkaConfig::for_brokers(brokers);
        let acks = Arc::new(AckQueue::default());
        Path {
            mapper: OutboxMapper::new(&fixture::outbox_config()),
            decoder: Decoder::default(),
            sink: KafkaSink::new(&kafka, acks.clone()).expect("producer"),
            acks,
            batch: Vec::with_capacity(100_000),
            seq: 0,
        }
    }

    /// Waits until every record handed over so far is acknowledged, taking the reports.
    fn settle(&mut self) {
        let _ = self.sink.flush(Duration::from_secs(30));
        self.acks.drain_into(&mut self.batch);
        assert!(
            self.batch.iter().all(|a| a.result.is_ok()),
            "the mock cluster failed a record"
        );
        self.batch.clear();
    }
}

/// Decode → map → produce over `messages`; returns the events produced. `produce = false`
/// stops after the mapping.
#[inline(never)]
fn relay_path(p: &mut Path, messages: &[Bytes], produce: bool) -> u64 {
    let Path {
        mapper,
        decoder,
        sink,
        acks,
        batch,
        seq,
    } = p;
    fixture::for_each_event(mapper, decoder, messages, |event| {
        if !produce {
            black_box(event);
            return;
        }
        loop {
            match sink.send(&event, *seq, 0) {
                Ok(()) => break,
                Err(SinkError::QueueFull) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => panic!("send: {e}"),
            }
        }
        *seq += 1;
        // As the relay does: take delivery reports in batches.
        acks.drain_into(batch);
        batch.clear();
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let repeat = args
        .iter()
        .position(|a| a == "--repeat")
        .and_then(|i| args.get(i + 1)?.parse::<u32>().ok());
    if repeat.is_none() && !args.iter().any(|a| a == "--bench") {
        println!(
            "hot_path bench: run it with `cargo bench --bench hot_path` (skipped under cargo test)"
        );
        return;
    }
    let cluster = MockCluster::<DefaultProducerContext>::new(1).expect("mock cluster");
    let (big, small) = fixture::shapes();
    let relation = big
        .iter()
        .find(|m| m.first() == Some(&b'R'))
        .expect("fixture has a Relation message")
        .clone();
    let mut path = Path::new(&cluster.bootstrap_servers());
    // The topic the fixture's rows map to.
    path.mapper.relation(
        &match pgoutput::decode(relation.clone()).expect("decodes") {
            LogicalMessage::Relation(r) => r,
            _ => unreachable!("a Relation message"),
        },
    );
    let topic = big
        .iter()
        .find_map(|m| match pgoutput::decode(m.clone()).ok()? {
            LogicalMessage::Insert(ins) => Some(
                path.mapper
                    .map_insert(&ins, EventPosition::default())
                    .ok()??
                    .topic,
            ),
            _ => None,
        })
        .expect("the fixture maps to an event");
    cluster.create_topic(&topic, 4, 1).expect("topic");
    // Warm-up: topic metadata, the producer's connections.
    assert!(relay_path(&mut path, &big, true) > 0);
    path.settle();

    if let Some(k) = repeat {
        let mut events = 0;
        for _ in 0..k {
            events += relay_path(&mut path, &big, true);
        }
        path.settle();
        println!("events {events}");
        return;
    }
    println!("| path | transactions | allocations per event | bytes allocated per event |");
    println!("|---|---|---:|---:|");
    for (shape, messages) in [("100-row", &big), ("1-row", &small)] {
        for (stage, produce) in [("decode → map", false), ("decode → map → produce", true)] {
            // Reach a steady state (buffers grown) before counting.
            relay_path(&mut path, messages, produce);
            path.settle();
            let mut events = 0;
            let region = Region::new(GLOBAL);
            for _ in 0..20 {
                events += relay_path(&mut path, messages, produce);
            }
            path.settle();
            let stats = region.change();
            println!(
                "| {stage} | {shape} | {:.2} | {:.0} |",
                stats.allocations as f64 / events as f64,
                stats.bytes_allocated as f64 / events as f64
            );
        }
    }
}
