//! Criterion benchmark: pgoutput decode + outbox mapping on captured stream bytes.
//!
//! `benches/data/pgoutput-seed.hex` holds real pgoutput (proto_version 1) messages captured
//! once from PostgreSQL 15 with `pg_logical_slot_peek_binary_changes`, one hex-encoded message
//! per line: a 100-row transaction (`B R I×100 C`) followed by 100 one-row transactions
//! (`B I C` each), rows of the seeds' outbox table with a ~200-byte JSON payload. Each benchmark
//! runs the relay's per-message work — [`pgoutput::decode`], then [`OutboxMapper`] — over one
//! shape and reports events/s on one core (criterion's `elem/s`).
//!
//! Run with `cargo bench --bench decode`.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use walbox::outbox::OutboxMapper;
use walbox::source::pgoutput::Decoder;

#[path = "common/fixture.rs"]
mod fixture;

use fixture::{outbox_config, shapes};

/// Runs the relay's per-message work over `messages`; returns the number of events mapped.
fn relay_messages(mapper: &mut OutboxMapper, decoder: &mut Decoder, messages: &[Bytes]) -> usize {
    fixture::for_each_event(mapper, decoder, messages, |event| {
        black_box(event);
    }) as usize
}

/// The benchmarks: one per transaction shape.
fn decode_and_map(c: &mut Criterion) {
    let (big, small) = shapes();
    let relation = big
        .iter()
        .find(|m| m.first() == Some(&b'R'))
        .expect("fixture has a Relation message")
        .clone();
    let mut group = c.benchmark_group("decode+map");
    for (name, messages) in [("100-row tx", big), ("1-row tx", small)] {
        let mut mapper = OutboxMapper::new(&outbox_config());
        let mut decoder = Decoder::default();
        // The 1-row transactions follow the Relation message of the first one in the stream.
        relay_messages(&mut mapper, &mut decoder, std::slice::from_ref(&relation));
        let events = relay_messages(&mut mapper, &mut decoder, &messages);
        assert!(events > 0, "{name}: the fixture maps to events");
        group.throughput(Throughput::Elements(events as u64));
        group.bench_function(name, |b| {
            b.iter(|| relay_messages(&mut mapper, &mut decoder, black_box(&messages)))
        });
    }
    group.finish();
}

criterion_group!(benches, decode_and_map);
criterion_main!(benches);
