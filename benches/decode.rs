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

use walbox::config::{self, OutboxConfig};
use walbox::outbox::{EventPosition, OutboxMapper};
use walbox::source::pgoutput::{self, LogicalMessage};

/// The captured stream, one hex-encoded pgoutput message per line.
const FIXTURE: &str = include_str!("data/pgoutput-seed.hex");

/// Decodes a hex line into bytes.
fn unhex(line: &str) -> Bytes {
    let nibble = |c: u8| match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => panic!("fixture is not lowercase hex"),
    };
    line.as_bytes()
        .chunks_exact(2)
        .map(|p| (nibble(p[0]) << 4) | nibble(p[1]))
        .collect::<Vec<u8>>()
        .into()
}

/// walbox's default outbox mapping (table `public.outbox`, the seeds' columns).
fn outbox_config() -> OutboxConfig {
    let env = [
        ("WALBOX_POSTGRES_URL", "postgres://bench@127.0.0.1/bench"),
        ("WALBOX_KAFKA_BROKERS", "127.0.0.1:9092"),
    ];
    config::load_from(
        None,
        &mut env.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())),
    )
    .expect("bench configuration is valid")
    .outbox
}

/// Runs the relay's per-message work over `messages`; returns the number of events mapped.
fn relay_messages(mapper: &mut OutboxMapper, messages: &[Bytes]) -> usize {
    let mut events = 0;
    let mut position = EventPosition::default();
    for m in messages {
        match pgoutput::decode(m.clone()).expect("fixture decodes") {
            LogicalMessage::Begin(b) => {
                position = EventPosition {
                    commit_lsn: b.final_lsn,
                    index: 0,
                    commit_time: b.commit_time,
                }
            }
            LogicalMessage::Relation(r) => mapper.relation(&r),
            LogicalMessage::Insert(ins) => {
                if let Some(event) = mapper.map_insert(&ins, position).expect("maps") {
                    position.index += 1;
                    black_box(event);
                    events += 1;
                }
            }
            other => {
                black_box(other);
            }
        }
    }
    events
}

/// Splits the fixture into (the 100-row transaction with its Relation, the 1-row transactions).
fn shapes() -> (Vec<Bytes>, Vec<Bytes>) {
    let all: Vec<Bytes> = FIXTURE.lines().map(unhex).collect();
    let first_commit = all
        .iter()
        .position(|m| m.first() == Some(&b'C'))
        .expect("fixture has a commit");
    let (big, small) = all.split_at(first_commit + 1);
    (big.to_vec(), small.to_vec())
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
        // The 1-row transactions follow the Relation message of the first one in the stream.
        relay_messages(&mut mapper, std::slice::from_ref(&relation));
        let events = relay_messages(&mut mapper, &messages);
        assert!(events > 0, "{name}: the fixture maps to events");
        group.throughput(Throughput::Elements(events as u64));
        group.bench_function(name, |b| {
            b.iter(|| relay_messages(&mut mapper, black_box(&messages)))
        });
    }
    group.finish();
}

criterion_group!(benches, decode_and_map);
criterion_main!(benches);
