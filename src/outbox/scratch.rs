//! Per-event text without a heap allocation per event: the `walbox.commit_lsn` and
//! `walbox.index` header values come from a shared arena, and topics are interned.
//!
//! # Invariants
//! - [`TextArena::text`] writes into a 16 KiB chunk and hands out a `Bytes` view of it; a new
//!   chunk is allocated only when the current one is full, so a value costs an allocation once
//!   per ~1,000 values. A chunk is freed when the last value taken from it is dropped
//!   (librdkafka copies header values; nothing keeps them long).
//! - [`Topics::intern`] returns the same `Arc<str>` for the same topic while it is remembered
//!   (at most [`MAX_TOPICS`] distinct topics; past that the set starts over, which costs an
//!   allocation per new topic, never a wrong topic).

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

/// Size of one arena chunk.
const CHUNK: usize = 16 * 1024;

/// The longest text written at once (an LSN `XXXXXXXX/XXXXXXXX` or a `u32`).
const MAX_TEXT: usize = 32;

/// Distinct topics remembered by [`Topics`].
pub const MAX_TOPICS: usize = 1024;

/// Short texts carved out of shared chunks.
#[derive(Debug, Default)]
pub struct TextArena {
    buf: BytesMut,
}

impl TextArena {
    /// `value` formatted, as `Bytes` sharing the arena's current chunk.
    pub fn text(&mut self, value: impl std::fmt::Display) -> Bytes {
        if self.buf.capacity() - self.buf.len() < MAX_TEXT {
            self.buf = BytesMut::with_capacity(CHUNK);
        }
        // Writing into a BytesMut cannot fail.
        let _ = write!(self.buf, "{value}");
        self.buf.split().freeze()
    }
}

/// Interned topic names.
#[derive(Debug, Default)]
pub struct Topics {
    known: HashSet<Arc<str>>,
    /// The topic of the previous event: most events go where the one before went.
    last: Option<Arc<str>>,
}

impl Topics {
    /// The shared name for `topic`.
    pub fn intern(&mut self, topic: &str) -> Arc<str> {
        if let Some(t) = self.last.as_ref().filter(|t| &***t == topic) {
            return t.clone();
        }
        if let Some(t) = self.known.get(topic) {
            self.last = Some(t.clone());
            return t.clone();
        }
        if self.known.len() >= MAX_TOPICS {
            self.known.clear();
        }
        let t: Arc<str> = Arc::from(topic);
        self.known.insert(t.clone());
        self.last = Some(t.clone());
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_exact_and_independent_across_chunks() {
        let mut arena = TextArena::default();
        let values: Vec<Bytes> = (0..5_000u32).map(|i| arena.text(i)).collect();
        for (i, v) in values.iter().enumerate() {
            assert_eq!(&v[..], i.to_string().as_bytes());
        }
        let lsn = arena.text(crate::lsn::Lsn(0x1_0000_0000 + 0x16B3748));
        assert_eq!(&lsn[..], b"1/16B3748");
    }

    #[test]
    fn a_topic_is_shared_until_the_set_starts_over() {
        let mut topics = Topics::default();
        let a = topics.intern("orders");
        let b = topics.intern("orders");
        assert!(Arc::ptr_eq(&a, &b));
        for i in 0..MAX_TOPICS {
            topics.intern(&format!("t{i}"));
        }
        let c = topics.intern("orders");
        assert_eq!(&*c, "orders");
    }
}
