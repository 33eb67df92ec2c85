//! Reading back what walbox published, for `walbox audit`, from the brokers whose records stay
//! readable once delivered: Redis Streams (`XRANGE` of each stream, oldest first) and NATS
//! JetStream (the messages of the streams capturing the subjects, in stream order). Each record
//! is handed to the caller as a [`ReadRecord`]: its destination, its key, and its headers (a
//! Redis entry's fields; a NATS message's headers). Kafka's reader is `cmd/audit.rs`'s own
//! (partitions, watermarks, transactions). RabbitMQ's queues are consumed by their consumers:
//! what walbox published cannot be read back there.
//!
//! # Invariants
//! - A destination is read to the end it had when its read began; records added later are
//!   not waited for (the audit has waited for the slot's confirmation before it reads).
//! - Nothing is written: no consumer group, no acknowledgement, no durable consumer.

use std::collections::{BTreeMap, HashSet};

use async_nats::jetstream::stream::LastRawMessageErrorKind;

use super::ack::BrokerError;
use crate::config::{NatsConfig, RedisConfig};
use crate::failure::Class;
use crate::outbox::KEY_HEADER;

/// Entries read per `XRANGE`.
const REDIS_PAGE: usize = 1_000;

/// One record read back.
pub struct ReadRecord<'a> {
    /// The stream key or subject it was read from.
    pub destination: &'a str,
    /// Its key (the aggregate id), when it has one.
    pub key: Option<&'a [u8]>,
    /// Its value (empty for a tombstone).
    pub payload: &'a [u8],
    /// Its headers (Redis: every field but `payload`), in order.
    pub fields: &'a [(String, Vec<u8>)],
}

impl ReadRecord<'_> {
    /// The value of the record's first header (Redis: field) named `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// Every entry of each stream of `streams`, oldest first, handed to `each`; how many.
pub async fn read_redis(
    config: &RedisConfig,
    streams: &[String],
    each: &mut dyn FnMut(&ReadRecord<'_>),
) -> Result<u64, BrokerError> {
    let mut conn = super::redis::open(config, config.timeout).await?;
    let mut read = 0;
    for stream in streams {
        let mut from = "-".to_owned();
        loop {
            let page: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
                .arg(stream)
                .arg(&from)
                .arg("+")
                .arg("COUNT")
                .arg(REDIS_PAGE)
                .query_async(&mut conn)
                .await
                .map_err(|e| {
                    super::redis_reply::classify_client(
                        &e,
                        &super::redis::server(config),
                        "XRANGE",
                        stream,
                    )
                })?;
            let Some((last, _)) = page.last() else {
                break;
            };
            from = format!("({last}");
            let full = page.len() == REDIS_PAGE;
            for (_, kv) in page {
                let mut fields: Vec<(String, Vec<u8>)> = kv
                    .chunks(2)
                    .map(|p| {
                        let name = String::from_utf8_lossy(&p[0]).into_owned();
                        (name, p.get(1).cloned().unwrap_or_default())
                    })
                    .collect();
                let payload = fields
                    .iter()
                    .position(|(n, _)| n == "payload")
                    .map(|i| fields.remove(i).1)
                    .unwrap_or_default();
                let key = fields
                    .iter()
                    .find(|(n, _)| n == "key")
                    .map(|(_, v)| v.as_slice());
                each(&ReadRecord {
                    destination: stream,
                    key,
                    payload: &payload,
                    fields: &fields,
                });
                read += 1;
            }
            if !full {
                break;
            }
        }
    }
    Ok(read)
}

/// Every message of `subjects`, in the order of the streams capturing them, handed to `each`;
/// how many. A subject no stream captures holds nothing.
pub async fn read_nats(
    config: &NatsConfig,
    subjects: &[String],
    each: &mut dyn FnMut(&ReadRecord<'_>),
) -> Result<u64, BrokerError> {
    let conn = super::nats::open_for_reading(config).await?;
    let wanted: HashSet<&str> = subjects.iter().map(String::as_str).collect();
    // Each stream once, however many of the subjects it captures.
    let mut streams = BTreeMap::new();
    for subject in subjects {
        if let Ok(name) = conn.stream_by_subject(subject.as_str()).await {
            streams.entry(name).or_insert(());
        }
    }
    let failed =
        |what: String| BrokerError::new(crate::config::BrokerKind::Nats, Class::Transient, what);
    let mut read = 0;
    for name in streams.into_keys() {
        let mut stream = conn
            .get_stream(name.as_str())
            .await
            .map_err(|e| failed(format!("cannot open stream {name:?}: {e}")))?;
        let state = stream
            .info()
            .await
            .map_err(|e| failed(format!("cannot read stream {name:?}'s state: {e}")))?
            .state
            .clone();
        if state.messages == 0 {
            continue;
        }
        for seq in state.first_sequence..=state.last_sequence {
            let m = match stream.get_raw_message(seq).await {
                Ok(m) => m,
                // Deleted from the middle of the stream.
                Err(e) if matches!(e.kind(), LastRawMessageErrorKind::NoMessageFound) => continue,
                Err(e) => return Err(failed(format!("reading stream {name:?} at {seq}: {e}"))),
            };
            let subject = m.subject.to_string();
            if !wanted.contains(subject.as_str()) {
                continue;
            }
            let fields: Vec<(String, Vec<u8>)> = m
                .headers
                .iter()
                .flat_map(|(n, vs)| {
                    vs.iter()
                        .map(move |v| (n.to_string(), v.as_str().as_bytes().to_vec()))
                })
                .collect();
            let key = fields
                .iter()
                .find(|(n, _)| n == KEY_HEADER)
                .map(|(_, v)| v.as_slice());
            each(&ReadRecord {
                destination: &subject,
                key,
                payload: &m.payload,
                fields: &fields,
            });
            read += 1;
        }
    }
    Ok(read)
}
