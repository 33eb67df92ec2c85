//! Dead letters: the one policy for what walbox cannot handle, and the headers that say why.
//!
//! Both halves meet records they cannot process: the relay an outbox event it cannot publish
//! (`on_invalid`; `outbox/dead_letter.rs` builds the replacement event), `walbox republish` the
//! same, and the inbox a consumed record whose effect keeps failing or that is not a valid event
//! (`on_error`, `on_invalid`; `inbox/worker.rs` produces it). All of them decide with
//! [`Policy`] and name the cause with the headers below, so a consumer of any dead-letter topic
//! reads one format.
//!
//! # Invariants
//! - [`Policy::Fail`] stops the process before anything past the record is confirmed (the
//!   relay's slot, the inbox's offset); nothing is skipped silently.
//! - [`Policy::DeadLetter`] carries its topic: a policy that dead-letters always knows where.
//! - A dead letter carries the original key, payload and headers unchanged, plus
//!   [`ERROR_HEADER`] and the headers that locate the original (the WAL position for the relay,
//!   [`SOURCE_TOPIC_HEADER`], [`SOURCE_PARTITION_HEADER`] and [`SOURCE_OFFSET_HEADER`] for the
//!   inbox).

use rdkafka::message::{Header, OwnedHeaders};

/// What becomes of a record that cannot be handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// Stop with a fatal error; nothing past the record is confirmed.
    Fail,
    /// Produce the original record to this topic with headers naming the error, and go on.
    DeadLetter(String),
}

impl Policy {
    /// The dead-letter topic, when the policy dead-letters.
    pub fn topic(&self) -> Option<&str> {
        match self {
            Policy::Fail => None,
            Policy::DeadLetter(topic) => Some(topic),
        }
    }
}

/// The header every dead letter carries: why the original could not be handled.
pub const ERROR_HEADER: &str = "walbox.error";

/// The header naming the topic a consumed record was dead-lettered from (the inbox).
pub const SOURCE_TOPIC_HEADER: &str = "walbox.source_topic";

/// The header naming the partition a consumed record was dead-lettered from (the inbox).
pub const SOURCE_PARTITION_HEADER: &str = "walbox.source_partition";

/// The header naming the offset a consumed record was dead-lettered from (the inbox).
pub const SOURCE_OFFSET_HEADER: &str = "walbox.source_offset";

/// Where a consumed record came from.
#[derive(Debug, Clone, Copy)]
pub struct ConsumedAt<'a> {
    /// Its topic.
    pub topic: &'a str,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
}

/// The headers of a consumed record's dead letter: the record's own headers, then the error
/// and where the record was consumed.
pub fn consumed_record_headers(
    original: &[(String, Option<Vec<u8>>)],
    reason: &str,
    at: ConsumedAt<'_>,
) -> OwnedHeaders {
    let partition = at.partition.to_string();
    let offset = at.offset.to_string();
    let mut headers = OwnedHeaders::new_with_capacity(original.len() + 4);
    for (key, value) in original {
        headers = headers.insert(Header {
            key,
            value: value.as_deref(),
        });
    }
    [
        (ERROR_HEADER, reason),
        (SOURCE_TOPIC_HEADER, at.topic),
        (SOURCE_PARTITION_HEADER, &partition),
        (SOURCE_OFFSET_HEADER, &offset),
    ]
    .into_iter()
    .fold(headers, |headers, (key, value)| {
        headers.insert(Header {
            key,
            value: Some(value.as_bytes()),
        })
    })
}

#[cfg(test)]
mod tests {
    use rdkafka::message::Headers;

    use super::*;

    #[test]
    fn a_consumed_records_dead_letter_keeps_its_headers_and_says_where_it_came_from() {
        let original = vec![
            ("id".to_owned(), Some(b"42".to_vec())),
            ("trace".to_owned(), None),
        ];
        let headers = consumed_record_headers(
            &original,
            "effect failed",
            ConsumedAt {
                topic: "payments.events",
                partition: 3,
                offset: 17,
            },
        );
        let got: Vec<(String, Option<Vec<u8>>)> = headers
            .iter()
            .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
            .collect();
        let want: Vec<(String, Option<Vec<u8>>)> = [
            ("id", Some("42")),
            ("trace", None),
            ("walbox.error", Some("effect failed")),
            ("walbox.source_topic", Some("payments.events")),
            ("walbox.source_partition", Some("3")),
            ("walbox.source_offset", Some("17")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.map(|v| v.as_bytes().to_vec())))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn only_a_dead_letter_policy_has_a_topic() {
        assert_eq!(Policy::Fail.topic(), None);
        assert_eq!(Policy::DeadLetter("dlq".into()).topic(), Some("dlq"));
    }
}
