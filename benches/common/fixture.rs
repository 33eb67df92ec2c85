//! The captured pgoutput stream the benches replay: `benches/data/pgoutput-seed.hex`, one
//! hex-encoded message per line (see `decode.rs`), and walbox's default outbox mapping.

use bytes::Bytes;

use walbox::config::{self, OutboxConfig};
use walbox::outbox::{EventPosition, OutboxEvent, OutboxMapper};
use walbox::source::pgoutput::{Decoder, LogicalMessage};

/// The captured stream, one hex-encoded pgoutput message per line.
const FIXTURE: &str = include_str!("../data/pgoutput-seed.hex");

/// Decodes a hex line into bytes.
pub fn unhex(line: &str) -> Bytes {
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
pub fn outbox_config() -> OutboxConfig {
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

/// Splits the fixture into (the 100-row transaction with its Relation, the 1-row transactions).
pub fn shapes() -> (Vec<Bytes>, Vec<Bytes>) {
    let all: Vec<Bytes> = FIXTURE.lines().map(unhex).collect();
    let first_commit = all
        .iter()
        .position(|m| m.first() == Some(&b'C'))
        .expect("fixture has a commit");
    let (big, small) = all.split_at(first_commit + 1);
    (big.to_vec(), small.to_vec())
}

/// The relay's per-message work over `messages`: decode, then map (handing each row back to
/// the decoder, as the relay does); `f` gets every event. Returns the number of events.
#[inline(always)]
pub fn for_each_event(
    mapper: &mut OutboxMapper,
    decoder: &mut Decoder,
    messages: &[Bytes],
    mut f: impl FnMut(OutboxEvent),
) -> u64 {
    let mut events = 0;
    let mut position = EventPosition::default();
    for m in messages {
        match decoder.decode(m.clone()).expect("fixture decodes") {
            LogicalMessage::Begin(b) => {
                position = EventPosition {
                    commit_lsn: b.final_lsn,
                    index: 0,
                    commit_time: b.commit_time,
                }
            }
            LogicalMessage::Relation(r) => mapper.relation(&r),
            LogicalMessage::Insert(ins) => {
                let mapped = mapper.map_insert(&ins, position).expect("maps");
                decoder.recycle(ins.tuple);
                if let Some(event) = mapped {
                    position.index += 1;
                    events += 1;
                    f(event);
                }
            }
            other => {
                std::hint::black_box(other);
            }
        }
    }
    events
}
