//! The outbox mapping: pgoutput Relation + Insert messages (and logical messages) →
//! [`OutboxEvent`]s, routed and encoded per the table's [`Route`].
//!
//! The mapper keeps a cache of the relations PostgreSQL announced. Relation messages are sent
//! before the first change of a table in each session, and again after a schema change. For a
//! relation that is a configured outbox table, the mapped columns are resolved to positions
//! once, and each INSERT is then mapped without looking anything up by name. Rows of other
//! tables are ignored. With `[outbox.messages]`, the JSON content of
//! `pg_logical_emit_message(true, '<prefix>', …)` is mapped the same way, its keys standing in
//! for columns.
//!
//! # Invariants
//! - Mapping is a pure function of the route, the relation and the row. The same row always
//!   gives the same record, so a transaction replayed after a restart produces identical events.
//! - A row that cannot be mapped is an [`OutboxError::InvalidEvent`] that carries the table,
//!   the event id, the LSN and the original payload, for the route's `on_invalid` policy. Causes
//!   include a NULL key (outside `compat = "debezium"`), id or payload (without `tombstones`),
//!   a NULL routing value without `fallback_topic`, an invalid topic name, and a mapped column
//!   dropped or renamed mid-stream.
//!   Such a row is never skipped silently.
//! - Raw values are zero-copy slices of the replication buffer. The exceptions are bytea
//!   payloads (decoded from hex text) and envelopes, which are built per event.

pub mod connect;
pub mod dead_letter;
pub mod envelope;
mod event;
mod record;
mod scratch;
mod template;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::value::RawValue;

use crate::config::{OutboxConfig, Route, RouteSource};
use crate::dead_letter::Policy;
use crate::failure::{Classify, Failure};
use crate::lsn::Lsn;
use crate::source::pgoutput::{Insert, Message, Relation, TupleValue};

pub use dead_letter::{dead_letter, Rejected};
use envelope::{Payload, PayloadKind};
pub use event::{
    EventPosition, HeaderName, Headers, OutboxEvent, COMMIT_LSN_HEADER, ERROR_HEADER, INDEX_HEADER,
    KEY_HEADER, SOURCE_HEADER,
};
use template::Template;

/// Type OIDs with a special meaning for payloads.
const BYTEA_OID: u32 = 17;
const JSON_OID: u32 = 114;
const JSONB_OID: u32 = 3802;

/// Why a change could not be mapped.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// A row cannot become a record.
    #[error(transparent)]
    InvalidEvent(Box<InvalidEvent>),
    /// An INSERT referenced a relation never announced: a protocol violation.
    #[error("INSERT for relation {0} that was never announced by a Relation message")]
    UnknownRelation(u32),
}

impl Classify for OutboxError {
    fn failure(&self) -> Option<Failure> {
        match self {
            OutboxError::InvalidEvent(e) => e.failure(),
            OutboxError::UnknownRelation(_) => Some(Failure::Internal),
        }
    }
}

impl Classify for InvalidEvent {
    /// A row that can never become a record: its policy dead-letters it, or walbox stops
    /// (exit 8).
    fn failure(&self) -> Option<Failure> {
        Some(Failure::EventRejected)
    }
}

/// A row that cannot become a record, with what a dead letter needs.
#[derive(Debug, thiserror::Error)]
#[error("cannot publish event {id} of {source_name} at {lsn}: {reason}")]
pub struct InvalidEvent {
    /// Index of the route (`tables` first, then `messages`).
    pub route: usize,
    /// `schema.table` or `message:<prefix>`.
    pub source_name: Arc<str>,
    /// The event id (`?` when NULL).
    pub id: String,
    /// Commit LSN of its transaction.
    pub lsn: Lsn,
    /// Position in the WAL.
    pub position: EventPosition,
    /// What is wrong.
    pub reason: String,
    /// The key, when it could be read.
    pub key: Option<Bytes>,
    /// The payload exactly as stored, when it could be read.
    pub payload: Option<Bytes>,
}

impl InvalidEvent {
    /// What the `on_invalid` policy needs to replace this event.
    pub fn rejected(&self) -> Rejected<'_> {
        Rejected {
            topic: None,
            id: &self.id,
            source: &self.source_name,
            position: self.position,
            key: self.key.clone(),
            payload: self.payload.clone(),
        }
    }
}

/// Column positions of a relation that is an outbox table.
#[derive(Debug, Clone)]
struct MappedRelation {
    route: usize,
    id: Option<usize>,
    key: Option<usize>,
    payload: Option<usize>,
    payload_kind: PayloadKind,
    /// The key and payload columns as Debezium types them (routes writing Connect's bytes).
    connect: Option<(connect::Column, connect::Column)>,
    topic: Option<usize>,
    aggregate_type: Option<usize>,
    event_type: Option<usize>,
    timestamp: Option<usize>,
    partition: Option<usize>,
    headers: Vec<(Option<usize>, HeaderName)>,
    envelope: Vec<(Option<usize>, Arc<str>)>,
    /// Mapped columns the relation no longer has (dropped or renamed mid-stream).
    missing: Vec<String>,
}

/// The values of one row, whatever its source.
struct Row<'a> {
    id: Option<Bytes>,
    key: Option<Bytes>,
    aggregate_type: Option<&'a [u8]>,
    event_type: Option<Bytes>,
    topic: Option<&'a [u8]>,
    payload: Option<Payload>,
    timestamp: Option<&'a [u8]>,
    partition: Option<&'a [u8]>,
    headers: Vec<(HeaderName, Option<Bytes>)>,
    envelope: Vec<(Arc<str>, Option<Bytes>)>,
    missing: &'a [String],
    /// The key and payload columns as Debezium types them, for a table route.
    connect: Option<(connect::Column, connect::Column)>,
}

/// Relation cache and row mapper; see the module docs.
#[derive(Debug)]
pub struct OutboxMapper {
    routes: Vec<Route>,
    /// Each route's name as the `walbox.source` header value.
    sources: Vec<Bytes>,
    templates: Vec<(Template, Option<Template>)>,
    messages: Option<usize>,
    /// `None` for relations that are not outbox tables.
    relations: HashMap<u32, Option<MappedRelation>>,
    /// Each table route's NOT NULL columns ([`OutboxMapper::set_not_null`]).
    not_null: Vec<Vec<String>>,
    /// Where header texts and topic names come from without an allocation per event.
    scratch: RefCell<Scratch>,
}

/// The mapper's reusable buffers (see `scratch`).
#[derive(Debug, Default)]
struct Scratch {
    texts: scratch::TextArena,
    topics: scratch::Topics,
    /// The topic being rendered.
    topic: String,
    /// The text of the last commit LSN mapped: every event of a transaction shares it, so it
    /// is formatted once per transaction, not per event.
    lsn: Option<(Lsn, Bytes)>,
}

impl OutboxMapper {
    /// A mapper for the configured routes.
    pub fn new(config: &OutboxConfig) -> Self {
        let mut routes = config.tables.clone();
        let messages = config.messages.clone().map(|m| {
            routes.push(m);
            routes.len() - 1
        });
        let templates = routes
            .iter()
            .map(|r| {
                (
                    Template::parse(&r.topic),
                    r.fallback_topic.as_deref().map(Template::parse),
                )
            })
            .collect();
        let sources = routes
            .iter()
            .map(|r| Bytes::copy_from_slice(r.name.as_bytes()))
            .collect();
        OutboxMapper {
            routes,
            sources,
            templates,
            messages,
            relations: HashMap::new(),
            not_null: Vec::new(),
            scratch: RefCell::new(Scratch::default()),
        }
    }

    /// Every topic the config names outright: templates without variables, fallback topics and
    /// dead-letter topics, each once. Topics rendered from row values are not among them.
    pub fn known_topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = Vec::new();
        let mut add = |t: &str| {
            if !topics.iter().any(|k| k == t) {
                topics.push(t.to_owned());
            }
        };
        for (route, (topic, fallback)) in self.routes.iter().zip(&self.templates) {
            for literal in [Some(topic), fallback.as_ref()]
                .into_iter()
                .flatten()
                .filter_map(Template::literal)
            {
                add(literal);
            }
            if let Policy::DeadLetter(dlq) = &route.on_invalid {
                add(dlq);
            }
        }
        topics
    }

    /// Each table route's NOT NULL columns, in `outbox.tables` order, as the catalog says
    /// ([`crate::source::catalog::not_null_columns`]): they make a column's Connect schema
    /// required for routes that write Connect's bytes. Set before the first Relation message.
    pub fn set_not_null(&mut self, per_route: Vec<Vec<String>>) {
        self.not_null = per_route;
    }

    /// The route with this index.
    pub fn route(&self, index: usize) -> &Route {
        &self.routes[index]
    }

    /// Records a Relation message; resolves the mapping when it is an outbox table.
    pub fn relation(&mut self, rel: &Relation) {
        let route = self.routes.iter().position(|r| {
            matches!(&r.source, RouteSource::Table { schema, table } if *table == rel.name && *schema == rel.namespace)
        });
        let mapped = route.map(|i| self.resolve(i, rel));
        self.relations.insert(rel.id, mapped);
    }

    /// The route index of an outbox relation (`None` for other or unknown relations).
    pub fn route_of(&self, relation_id: u32) -> Option<usize> {
        match self.relations.get(&relation_id) {
            Some(Some(m)) => Some(m.route),
            _ => None,
        }
    }

    fn resolve(&self, route: usize, rel: &Relation) -> MappedRelation {
        let c = &self.routes[route].columns;
        let find = |name: &str| rel.columns.iter().position(|col| col.name == name);
        let mut missing = Vec::new();
        let mut need = |name: &str| {
            let found = find(name);
            if found.is_none() {
                missing.push(name.to_owned());
            }
            found
        };
        let id = need(&c.id);
        let key = need(&c.aggregate_id);
        let payload = need(&c.payload);
        let timestamp = c.timestamp.as_deref().and_then(&mut need);
        let partition = c.partition.as_deref().and_then(&mut need);
        let headers = self.routes[route]
            .headers
            .iter()
            .map(|(col, h)| (need(col), HeaderName::Custom(h.as_str().into())))
            .collect();
        let envelope = self.routes[route]
            .envelope
            .iter()
            .map(|(col, f)| (need(col), Arc::from(f.as_str())))
            .collect();
        let topic = c.topic.as_deref().and_then(find);
        let aggregate_type = find(&c.aggregate_type);
        let payload_kind = match payload.map(|i| rel.columns[i].type_oid) {
            Some(BYTEA_OID) => PayloadKind::Bytes,
            Some(JSON_OID | JSONB_OID) => PayloadKind::Json,
            _ => PayloadKind::Text,
        };
        let r = &self.routes[route];
        let column = |i: Option<usize>, name: &str| connect::Column {
            ty: i
                .and_then(|i| connect::ColumnType::of_oid(rel.columns[i].type_oid))
                .unwrap_or(connect::ColumnType::Text),
            nullable: !self
                .not_null
                .get(route)
                .is_some_and(|cols| cols.iter().any(|c| c == name)),
        };
        let connect = r
            .writes_connect_bytes()
            .then(|| (column(key, &c.aggregate_id), column(payload, &c.payload)));
        MappedRelation {
            route,
            id,
            key,
            payload,
            payload_kind,
            connect,
            topic,
            aggregate_type,
            event_type: find(&c.event_type),
            timestamp,
            partition,
            headers,
            envelope,
            missing,
        }
    }

    /// Maps an INSERT. `Ok(None)` when the row is not in an outbox table.
    pub fn map_insert(
        &self,
        insert: &Insert,
        position: EventPosition,
    ) -> Result<Option<OutboxEvent>, OutboxError> {
        let m = match self.relations.get(&insert.relation_id) {
            Some(Some(m)) => m,
            Some(None) => return Ok(None),
            None => return Err(OutboxError::UnknownRelation(insert.relation_id)),
        };
        let cols = &insert.tuple.columns;
        let value = |idx: Option<usize>| -> Option<&Bytes> {
            match cols.get(idx?) {
                Some(TupleValue::Text(b)) | Some(TupleValue::Binary(b)) => Some(b),
                _ => None,
            }
        };
        let payload = match value(m.payload) {
            None => None,
            Some(raw) if m.payload_kind == PayloadKind::Bytes => match decode_bytea_hex(raw) {
                Some(b) => Some(Payload {
                    bytes: b,
                    kind: PayloadKind::Bytes,
                }),
                None => {
                    return Err(self.invalid(
                        m.route,
                        value(m.id).cloned(),
                        value(m.key).cloned(),
                        Some(raw.clone()),
                        position,
                        "the bytea payload is not in hex format (set bytea_output = 'hex')".into(),
                    ))
                }
            },
            Some(raw) => Some(Payload {
                bytes: raw.clone(),
                kind: m.payload_kind,
            }),
        };
        let row = Row {
            id: value(m.id).cloned(),
            key: value(m.key).cloned(),
            aggregate_type: value(m.aggregate_type).map(|b| &b[..]),
            event_type: value(m.event_type).cloned(),
            topic: value(m.topic).map(|b| &b[..]),
            payload,
            timestamp: value(m.timestamp).map(|b| &b[..]),
            partition: value(m.partition).map(|b| &b[..]),
            headers: m
                .headers
                .iter()
                .map(|(i, h)| (h.clone(), value(*i).cloned()))
                .collect(),
            envelope: m
                .envelope
                .iter()
                .map(|(i, f)| (f.clone(), value(*i).cloned()))
                .collect(),
            missing: &m.missing,
            connect: m.connect,
        };
        self.build(m.route, row, position).map(Some)
    }

    /// The route of the table-less outbox, when `prefix` is its prefix.
    pub fn message_route(&self, prefix: &str) -> Option<usize> {
        let i = self.messages?;
        matches!(&self.routes[i].source, RouteSource::Messages { prefix: p } if p == prefix)
            .then_some(i)
    }

    /// Maps a logical message. `Ok(None)` when its prefix is not the configured one (or the
    /// table-less outbox is off).
    pub fn map_message(
        &self,
        msg: &Message,
        position: EventPosition,
    ) -> Result<Option<OutboxEvent>, OutboxError> {
        let Some(route) = self.messages else {
            return Ok(None);
        };
        if !matches!(&self.routes[route].source, RouteSource::Messages { prefix } if *prefix == msg.prefix)
        {
            return Ok(None);
        }
        let fields: HashMap<String, &RawValue> = match serde_json::from_slice(&msg.content) {
            Ok(f) => f,
            Err(_) => {
                return Err(self.invalid(
                    route,
                    None,
                    None,
                    Some(msg.content.clone()),
                    position,
                    "message content is not a JSON object".into(),
                ))
            }
        };
        let c = &self.routes[route].columns;
        // A JSON string field is its text; any other value is its JSON text, exactly as sent.
        let field = |k: &str| -> Option<(Bytes, bool)> {
            let raw = fields.get(k)?.get();
            if raw == "null" {
                None
            } else if raw.starts_with('"') {
                let s: String = serde_json::from_str(raw).ok()?;
                Some((Bytes::from(s), false))
            } else {
                Some((msg.content.slice_ref(raw.as_bytes()), true))
            }
        };
        let text = |k: &str| field(k).map(|(b, _)| b);
        let payload = field(&c.payload).map(|(bytes, is_json)| Payload {
            bytes,
            kind: if is_json {
                PayloadKind::Json
            } else {
                PayloadKind::Text
            },
        });
        let aggregate_type = text(&c.aggregate_type);
        let topic = c.topic.as_deref().and_then(text);
        let timestamp = c.timestamp.as_deref().and_then(text);
        let partition = c.partition.as_deref().and_then(text);
        let route_cfg = &self.routes[route];
        let row = Row {
            id: text(&c.id),
            key: text(&c.aggregate_id),
            aggregate_type: aggregate_type.as_deref(),
            event_type: text(&c.event_type),
            topic: topic.as_deref(),
            payload,
            timestamp: timestamp.as_deref(),
            partition: partition.as_deref(),
            headers: route_cfg
                .headers
                .iter()
                .map(|(k, h)| (HeaderName::Custom(h.as_str().into()), text(k)))
                .collect(),
            envelope: route_cfg
                .envelope
                .iter()
                .map(|(k, f)| (Arc::from(f.as_str()), text(k)))
                .collect(),
            missing: &[],
            connect: None,
        };
        self.build(route, row, position).map(Some)
    }

    /// `lsn` as text (`0/16B3748`), cached per transaction.
    fn lsn_text(&self, lsn: Lsn) -> Bytes {
        let mut scratch = self.scratch.borrow_mut();
        let Scratch {
            texts, lsn: cached, ..
        } = &mut *scratch;
        match cached {
            Some((at, text)) if *at == lsn => text.clone(),
            _ => cached.insert((lsn, texts.text(lsn))).1.clone(),
        }
    }

    fn invalid(
        &self,
        route: usize,
        id: Option<Bytes>,
        key: Option<Bytes>,
        payload: Option<Bytes>,
        position: EventPosition,
        reason: String,
    ) -> OutboxError {
        OutboxError::InvalidEvent(Box::new(InvalidEvent {
            route,
            source_name: self.routes[route].name.clone(),
            id: id
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_else(|| "?".into()),
            lsn: position.commit_lsn,
            position,
            reason,
            key,
            payload,
        }))
    }
}

/// Decodes bytea's text output `\x0a1b…` into bytes.
fn decode_bytea_hex(text: &[u8]) -> Option<Bytes> {
    let hex = text.strip_prefix(b"\\x")?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = Vec::with_capacity(hex.len() / 2);
    for pair in hex.chunks_exact(2) {
        out.push(nibble(pair[0])? << 4 | nibble(pair[1])?);
    }
    Some(Bytes::from(out))
}

#[cfg(test)]
mod tests;
