//! A mapped row → [`OutboxEvent`]: the record's key, topic, partition, timestamp, value and
//! headers, each from its own function, in the route's layout (`compat`).
//!
//! Invariants:
//! - Every refusal is a reason string that [`OutboxMapper::build`] turns into an
//!   [`InvalidEvent`](super::InvalidEvent) with the row's id, key and payload: a row is published
//!   whole or is the `on_invalid` policy's, never half of one.
//! - Values come from `envelope` (walbox's formats) or `connect` (the Outbox Event Router's
//!   converters); header names from `event`.

use std::sync::Arc;

use bytes::Bytes;

use super::envelope::{self, Payload, PayloadKind};
use super::event::{
    HeaderName, Headers, OutboxEvent, CE_ID, CE_SOURCE, CE_SPECVERSION, CE_SUBJECT, CE_TIME,
    CE_TYPE, COMMIT_LSN_HEADER, CONTENT_TYPE_HEADER, EVENT_TYPE_HEADER, ID_HEADER, INDEX_HEADER,
    SOURCE_HEADER,
};
use super::template::Vars;
use super::{connect, EventPosition, OutboxError, OutboxMapper, Row, Scratch};
use crate::config::{valid_topic, Compat, Converter, Route, ValueFormat};
use crate::timestamp::{self, pg_micros_to_unix_micros, pg_micros_to_unix_ms};

impl OutboxMapper {
    /// The record `row` becomes, or the row's [`InvalidEvent`](super::InvalidEvent).
    pub(super) fn build(
        &self,
        route: usize,
        row: Row<'_>,
        position: EventPosition,
    ) -> Result<OutboxEvent, OutboxError> {
        self.record(route, &row, position).map_err(|reason| {
            self.invalid(
                route,
                row.id.clone(),
                row.key.clone(),
                row.payload.as_ref().map(|p| p.bytes.clone()),
                position,
                reason,
            )
        })
    }

    fn record(
        &self,
        route: usize,
        row: &Row<'_>,
        position: EventPosition,
    ) -> Result<OutboxEvent, String> {
        let r = &self.routes[route];
        let c = &r.columns;
        if let Some(col) = row.missing.first() {
            return Err(format!(
                "column {col:?} is mapped but the table no longer has it (dropped or renamed)"
            ));
        }
        let id = row
            .id
            .clone()
            .ok_or_else(|| format!("{:?} (event id) is NULL", c.id))?;
        // The router sends a NULL key column as a null key; walbox's own layout refuses it.
        let key = match (row.key.clone(), r.compat) {
            (Some(k), _) => Some(k),
            (None, Compat::Debezium) => None,
            (None, Compat::Walbox) => return Err(format!("{:?} (key) is NULL", c.aggregate_id)),
        };
        // The router sends a NULL payload as what its converter makes of null.
        if row.payload.is_none() && !r.tombstones && r.compat == Compat::Walbox {
            return Err(format!(
                "{:?} (payload) is NULL (set tombstones = true to send a tombstone)",
                c.payload
            ));
        }
        let topic = self.topic(route, row)?;
        let partition = partition(row.partition)?;
        let timestamp_ms = match row.timestamp {
            None => pg_micros_to_unix_ms(position.commit_time),
            Some(t) => std::str::from_utf8(t)
                .ok()
                .and_then(timestamp::parse_timestamptz_ms)
                .ok_or_else(|| {
                    format!(
                        "timestamp {:?} is not a timestamptz",
                        String::from_utf8_lossy(t)
                    )
                })?,
        };
        let lsn_text = self.lsn_text(position.commit_lsn);
        let value = self.value(r, row, &id, key.as_deref(), position, &lsn_text)?;
        let mut headers = Headers::new();
        headers.push(valued(HeaderName::Static(ID_HEADER), id.clone()));
        if let (Some(t), Compat::Walbox) = (&row.event_type, r.compat) {
            headers.push(valued(HeaderName::Static(EVENT_TYPE_HEADER), t.clone()));
        }
        headers.push(valued(HeaderName::Static(COMMIT_LSN_HEADER), lsn_text));
        headers.push(valued(
            HeaderName::Static(INDEX_HEADER),
            self.scratch.borrow_mut().texts.text(position.index),
        ));
        headers.push(valued(
            HeaderName::Static(SOURCE_HEADER),
            self.sources[route].clone(),
        ));
        if let Some(ce_source) = &r.cloudevents_source {
            let kind = row.payload.as_ref().map(|p| p.kind);
            cloudevents(
                &mut headers,
                ce_source,
                &id,
                row,
                key.as_ref(),
                timestamp_ms,
            )
            .push(valued(
                HeaderName::Static(CONTENT_TYPE_HEADER),
                Bytes::from_static(envelope::content_type(r.format, kind).as_bytes()),
            ));
        }
        for (name, v) in &row.headers {
            match (v, r.compat) {
                (Some(v), _) => headers.push((name.clone(), Some(v.clone()))),
                // The router sends a NULL column as a header with a null value.
                (None, Compat::Debezium) => headers.push((name.clone(), None)),
                (None, Compat::Walbox) => {}
            }
        }
        // The router's key converter: JsonConverter's bytes instead of the column's text.
        let key = match (row.connect, r.converters.key) {
            (Some((column, _)), Converter::Json { schemas }) => {
                connect::record_key(column, key.as_deref(), schemas)
                    .map_err(|e| format!("the key: {e}"))?
            }
            _ => key,
        };
        Ok(OutboxEvent {
            topic,
            partition,
            key,
            value,
            headers,
            timestamp_ms,
            id,
            position,
            source: r.name.clone(),
        })
    }

    /// The topic: the row's topic column, else the route's template, else its fallback.
    fn topic(&self, route: usize, row: &Row<'_>) -> Result<Arc<str>, String> {
        let r = &self.routes[route];
        let mut scratch = self.scratch.borrow_mut();
        let Scratch { topics, topic, .. } = &mut *scratch;
        topic.clear();
        let rendered = match row.topic.and_then(|t| std::str::from_utf8(t).ok()) {
            Some(t) => {
                topic.push_str(t);
                true
            }
            None => {
                let vars = Vars {
                    aggregate_type: row.aggregate_type,
                    aggregate_id: row.key.as_deref(),
                    event_type: row.event_type.as_deref(),
                    source: &r.source,
                };
                let (template, fallback) = &self.templates[route];
                template.render_into(&vars, topic)
                    || fallback
                        .as_ref()
                        .is_some_and(|f| f.render_into(&vars, topic))
            }
        };
        if !rendered {
            return Err(format!(
                "no topic: a routing value of {:?} is NULL and no fallback_topic is set",
                r.topic
            ));
        }
        if !valid_topic(topic) {
            return Err(format!("{topic:?} is not a valid Kafka topic name"));
        }
        Ok(topics.intern(topic))
    }

    /// The record value: nothing (a tombstone), the payload, walbox's envelope of it, or what
    /// the Outbox Event Router's converter writes.
    fn value(
        &self,
        r: &Route,
        row: &Row<'_>,
        id: &[u8],
        key: Option<&[u8]>,
        position: EventPosition,
        lsn_text: &[u8],
    ) -> Result<Option<Bytes>, String> {
        Ok(match (&row.payload, r.format) {
            (None, _) if r.tombstones || row.connect.is_none() => None,
            (Some(p), _) if r.tombstones && r.compat == Compat::Debezium && router_blank(p) => None,
            (p, _) if row.connect.is_some() => {
                let (_, column) = row.connect.expect("checked");
                let expand = r.expand_json_payload.then_some(r.json_nulls);
                let raw = p.as_ref().map(|p| &p.bytes);
                connect::record_value(column, &r.columns.payload, raw, expand, r.converters.value)
                    .map_err(|e| format!("the payload: {e}"))?
            }
            (None, _) => None,
            (Some(p), ValueFormat::Raw) => Some(p.bytes.clone()),
            (Some(p), format) => {
                let env = envelope::Envelope {
                    id,
                    event_type: row.event_type.as_deref(),
                    aggregate_type: row.aggregate_type,
                    aggregate_id: key.unwrap_or_default(),
                    payload: p,
                    expand_json: r.expand_json_payload,
                    commit_lsn: std::str::from_utf8(lsn_text).unwrap_or_default(),
                    commit_time_us: pg_micros_to_unix_micros(position.commit_time),
                    index: position.index,
                    source: &r.name,
                    fields: &row.envelope,
                };
                Some(env.encode(format)?.0)
            }
        })
    }
}

/// The explicit partition, when the row has a partition column.
fn partition(value: Option<&[u8]>) -> Result<Option<i32>, String> {
    let Some(p) = value else {
        return Ok(None);
    };
    match std::str::from_utf8(p)
        .ok()
        .and_then(|s| s.parse::<i32>().ok())
    {
        Some(n) if n >= 0 => Ok(Some(n)),
        _ => Err(format!(
            "partition {:?} is not a non-negative integer",
            String::from_utf8_lossy(p)
        )),
    }
}

/// CloudEvents binary-mode headers but `content-type`, which the caller adds.
fn cloudevents<'h>(
    headers: &'h mut Headers,
    source: &str,
    id: &Bytes,
    row: &Row<'_>,
    key: Option<&Bytes>,
    timestamp_ms: i64,
) -> &'h mut Headers {
    headers.push(valued(
        HeaderName::Static(CE_SPECVERSION),
        Bytes::from_static(b"1.0"),
    ));
    headers.push(valued(HeaderName::Static(CE_ID), id.clone()));
    headers.push(valued(
        HeaderName::Static(CE_SOURCE),
        Bytes::copy_from_slice(source.as_bytes()),
    ));
    if let Some(t) = &row.event_type {
        headers.push(valued(HeaderName::Static(CE_TYPE), t.clone()));
    }
    headers.push(valued(
        HeaderName::Static(CE_TIME),
        Bytes::from(timestamp::rfc3339_ms(timestamp_ms)),
    ));
    if let Some(key) = key {
        headers.push(valued(HeaderName::Static(CE_SUBJECT), key.clone()));
    }
    headers
}

/// Whether the Outbox Event Router (`route.tombstone.on.empty.payload=true`) takes `p` for an
/// empty payload and sends a tombstone: its rule is `payload.toString().trim().isEmpty()`, and
/// Java's `trim` strips every character up to U+0020 from both ends. A bytea payload reaches it
/// as a byte array, whose `toString()` is never empty; any other column as its text (jsonb
/// and json never print blank).
fn router_blank(p: &Payload) -> bool {
    p.kind != PayloadKind::Bytes && p.bytes.iter().all(|b| *b <= b' ')
}

/// A header with a value.
fn valued(name: HeaderName, value: Bytes) -> (HeaderName, Option<Bytes>) {
    (name, Some(value))
}
