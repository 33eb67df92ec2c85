//! The `on_invalid` policy: what becomes of an event that cannot be published as it is.
//!
//! An event can be rejected at four points: the mapper cannot turn the row into a record
//! ([`super::InvalidEvent`]), its topic does not exist and may not be created, the producer
//! refuses the record (too large, invalid topic), or the broker fails it in a delivery report.
//! Each of them asks [`dead_letter`], the one place the policy is written:
//! - `on_invalid = "fail"`: no replacement; the relay stops (exit 8) and confirms nothing past
//!   the event.
//! - `on_invalid = "dead_letter"`: the record that replaces the event. It carries the original key
//!   and payload to the dead-letter topic, with headers naming the error, the source and the WAL
//!   position. It takes the event's place in the stream (same sequence number, same position), so
//!   ordering and confirmation work as for any other event.
//!
//! # Invariants
//! - A dead letter is never dead-lettered again: an event that was already headed for its
//!   route's dead-letter topic and cannot be published fails the relay.
//! - A dead letter keeps the event's position (commit LSN, index, commit time), whichever point
//!   rejected it; its record timestamp is the commit time.

use std::sync::Arc;

use bytes::Bytes;

use super::event::{
    EventPosition, HeaderName, OutboxEvent, COMMIT_LSN_HEADER, ERROR_HEADER, INDEX_HEADER,
    SOURCE_HEADER,
};
use crate::dead_letter::Policy;
use crate::timestamp::pg_micros_to_unix_ms;

/// An event that cannot be published as it is, with what its dead letter needs.
#[derive(Debug, Clone)]
pub struct Rejected<'a> {
    /// The topic the event was meant for; `None` when the row never got as far as a topic.
    pub topic: Option<&'a str>,
    /// Event id (`?` when unknown).
    pub id: &'a str,
    /// `schema.table` or `message:<prefix>`.
    pub source: &'a str,
    /// Where the event sits in the WAL.
    pub position: EventPosition,
    /// Original key.
    pub key: Option<Bytes>,
    /// Original payload bytes.
    pub payload: Option<Bytes>,
}

impl<'a> Rejected<'a> {
    /// A mapped event that could not be produced; `id` is its id as text.
    pub fn event(event: &'a OutboxEvent, id: &'a str) -> Self {
        Rejected {
            topic: Some(&event.topic),
            id,
            source: &event.source,
            position: event.position,
            key: event.key.clone(),
            payload: event.value.clone(),
        }
    }
}

/// The route's `on_invalid` policy applied to `rejected`, which could not be published because
/// of `reason`: the dead letter to produce in its place, or `None` when the relay must stop
/// (see the module docs).
pub fn dead_letter(policy: &Policy, rejected: Rejected<'_>, reason: &str) -> Option<OutboxEvent> {
    let Policy::DeadLetter(topic) = policy else {
        return None;
    };
    if rejected.topic == Some(topic.as_str()) {
        return None;
    }
    let id = Bytes::copy_from_slice(rejected.id.as_bytes());
    let position = rejected.position;
    Some(OutboxEvent {
        topic: topic.as_str().into(),
        partition: None,
        key: rejected.key,
        value: rejected.payload,
        headers: smallvec::smallvec![
            (HeaderName::Static("id"), Some(id.clone())),
            (
                HeaderName::Static(ERROR_HEADER),
                Some(Bytes::copy_from_slice(reason.as_bytes())),
            ),
            (
                HeaderName::Static(SOURCE_HEADER),
                Some(Bytes::copy_from_slice(rejected.source.as_bytes())),
            ),
            (
                HeaderName::Static(COMMIT_LSN_HEADER),
                Some(Bytes::from(position.commit_lsn.to_string())),
            ),
            (
                HeaderName::Static(INDEX_HEADER),
                Some(Bytes::from(position.index.to_string())),
            ),
        ],
        timestamp_ms: pg_micros_to_unix_ms(position.commit_time),
        id,
        position,
        source: Arc::from(rejected.source),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lsn::Lsn;

    fn rejected(topic: Option<&str>) -> Rejected<'_> {
        Rejected {
            topic,
            id: "e-1",
            source: "public.outbox",
            position: EventPosition {
                commit_lsn: Lsn(0x16B_3748),
                index: 2,
                commit_time: 851_000_000_000_000,
            },
            key: Some(Bytes::from_static(b"order-7")),
            payload: Some(Bytes::from_static(b"{\"total\":1}")),
        }
    }

    fn header<'e>(e: &'e OutboxEvent, name: &str) -> &'e [u8] {
        e.headers
            .iter()
            .find(|(h, _)| h.as_str() == name)
            .and_then(|(_, v)| v.as_deref())
            .unwrap_or_else(|| panic!("no header {name}"))
    }

    #[test]
    fn fail_has_no_replacement() {
        assert!(dead_letter(&Policy::Fail, rejected(Some("orders")), "too large").is_none());
    }

    #[test]
    fn a_dead_letter_keeps_key_payload_and_position() {
        let policy = Policy::DeadLetter("walbox.dead_letter".into());
        let letter = dead_letter(&policy, rejected(Some("orders")), "too large").unwrap();
        assert_eq!(&*letter.topic, "walbox.dead_letter");
        assert_eq!(letter.key.as_deref(), Some(&b"order-7"[..]));
        assert_eq!(letter.value.as_deref(), Some(&b"{\"total\":1}"[..]));
        assert_eq!(letter.position, rejected(None).position);
        assert_eq!(
            letter.timestamp_ms,
            pg_micros_to_unix_ms(851_000_000_000_000)
        );
        assert_eq!(header(&letter, "id"), b"e-1");
        assert_eq!(header(&letter, "walbox.error"), b"too large");
        assert_eq!(header(&letter, "walbox.source"), b"public.outbox");
        assert_eq!(header(&letter, "walbox.commit_lsn"), b"0/16B3748");
        assert_eq!(header(&letter, "walbox.index"), b"2");
    }

    #[test]
    fn a_row_without_a_topic_is_dead_lettered() {
        let policy = Policy::DeadLetter("dlq".into());
        assert!(dead_letter(&policy, rejected(None), "NULL id").is_some());
    }

    #[test]
    fn a_dead_letter_is_never_dead_lettered_again() {
        let policy = Policy::DeadLetter("dlq".into());
        assert!(dead_letter(&policy, rejected(Some("dlq")), "too large").is_none());
    }
}
