//! The outbox mapping: pgoutput Relation + Insert messages → [`OutboxEvent`]s.
//!
//! The mapper keeps a cache of the relations PostgreSQL announced (Relation messages are sent
//! before the first change of a table in each session and again after a schema change). A
//! relation that is the configured outbox table gets its mapped columns resolved to positions
//! once; each INSERT is then mapped without looking anything up by name. Rows of other tables are
//! ignored.
//!
//! Defaults follow the seeds' schemas: key = `aggregate_id`; topic = column `topic` when the
//! table has it and it is not NULL, else `<topic_prefix><aggregate_type>`
//! (`outbox.event.<aggregate_type>`); value = `payload` as stored (jsonb/json/text as their text,
//! bytea as its bytes). Headers: `id`, `event_type`, `walbox.commit_lsn`, `walbox.index`.
//!
//! # Invariants
//! - Mapping is a pure function of the relation and the tuple: the same row always gives the same
//!   record, so a transaction replayed after a restart produces identical events.
//! - A row that cannot be mapped (NULL key, NULL payload, no topic) is an error naming the table,
//!   event id and LSN. It is never skipped.
//! - Values are zero-copy slices of the replication buffer, except bytea payloads, which are
//!   decoded from their hex text form.

use std::collections::HashMap;

use bytes::Bytes;

use crate::config::OutboxConfig;
use crate::source::lsn::Lsn;
use crate::source::pgoutput::{Insert, Relation, TupleValue};

/// `bytea`'s type OID.
const BYTEA_OID: u32 = 17;

/// Where an event sits in the WAL: the commit LSN of its transaction and its ordinal in it.
/// An LSN alone does not identify an event (all rows of a transaction share one commit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventPosition {
    /// LSN of the transaction's commit record (pgoutput Begin's `final_lsn`).
    pub commit_lsn: Lsn,
    /// 0-based ordinal of the event among the transaction's outbox events.
    pub index: u32,
}

/// One record to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    /// Destination topic.
    pub topic: String,
    /// Record key: the aggregate id.
    pub key: Bytes,
    /// Record value: the payload as stored.
    pub payload: Bytes,
    /// The row's id as text (header `id`, the consumer's dedup key).
    pub id: Bytes,
    /// Header `event_type`, when the table has the column and it is not NULL.
    pub event_type: Option<Bytes>,
    /// Position in the WAL.
    pub position: EventPosition,
}

/// Why a change could not be mapped.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// The outbox table lacks a column the mapping needs.
    #[error("outbox table {table} has no column {column:?} (set outbox.columns.{setting} to the right name)")]
    MissingColumn {
        /// `schema.table`.
        table: String,
        /// The missing column.
        column: String,
        /// The setting that names it.
        setting: &'static str,
    },
    /// The table has neither a topic nor an aggregate type column.
    #[error("outbox table {table} has neither a {topic:?} nor an {aggregate_type:?} column, so no topic can be chosen")]
    NoTopicColumn {
        /// `schema.table`.
        table: String,
        /// Configured topic column.
        topic: String,
        /// Configured aggregate type column.
        aggregate_type: String,
    },
    /// A row cannot become a record.
    #[error("cannot publish event {id} of {table} at {lsn}: {reason}")]
    InvalidEvent {
        /// `schema.table`.
        table: String,
        /// The event id (or `?` when it is NULL).
        id: String,
        /// Commit LSN of its transaction.
        lsn: Lsn,
        /// What is wrong.
        reason: String,
    },
    /// An INSERT referenced a relation never announced: a protocol violation.
    #[error("INSERT for relation {0} that was never announced by a Relation message")]
    UnknownRelation(u32),
}

/// Column positions of a relation that is the outbox table.
#[derive(Debug, Clone)]
struct MappedRelation {
    table: String,
    id: usize,
    key: usize,
    payload: usize,
    payload_is_bytea: bool,
    topic: Option<usize>,
    aggregate_type: Option<usize>,
    event_type: Option<usize>,
}

/// Relation cache and row mapper; see the module docs.
#[derive(Debug)]
pub struct OutboxMapper {
    config: OutboxConfig,
    /// `None` for relations that are not the outbox table.
    relations: HashMap<u32, Option<MappedRelation>>,
}

impl OutboxMapper {
    /// A mapper for the configured table.
    pub fn new(config: OutboxConfig) -> Self {
        OutboxMapper {
            config,
            relations: HashMap::new(),
        }
    }

    /// Records a Relation message; resolves the mapping when it is the outbox table.
    pub fn relation(&mut self, rel: &Relation) -> Result<(), OutboxError> {
        let is_outbox = rel.name == self.config.table && rel.namespace == self.config.schema;
        let mapped = if is_outbox {
            Some(self.resolve(rel)?)
        } else {
            None
        };
        self.relations.insert(rel.id, mapped);
        Ok(())
    }

    /// Whether `relation_id` is the outbox table (false for unknown relations).
    pub fn is_outbox(&self, relation_id: u32) -> bool {
        matches!(self.relations.get(&relation_id), Some(Some(_)))
    }

    /// `schema.table` of a known outbox relation.
    pub fn table_name(&self, relation_id: u32) -> Option<&str> {
        match self.relations.get(&relation_id) {
            Some(Some(m)) => Some(&m.table),
            _ => None,
        }
    }

    fn resolve(&self, rel: &Relation) -> Result<MappedRelation, OutboxError> {
        let c = &self.config.columns;
        let table = format!("{}.{}", rel.namespace, rel.name);
        let find = |name: &str| rel.columns.iter().position(|col| col.name == name);
        let need = |name: &str, setting: &'static str| {
            find(name).ok_or_else(|| OutboxError::MissingColumn {
                table: table.clone(),
                column: name.to_owned(),
                setting,
            })
        };
        let id = need(&c.id, "id")?;
        let key = need(&c.aggregate_id, "aggregate_id")?;
        let payload = need(&c.payload, "payload")?;
        let topic = find(&c.topic);
        let aggregate_type = find(&c.aggregate_type);
        if topic.is_none() && aggregate_type.is_none() {
            return Err(OutboxError::NoTopicColumn {
                table,
                topic: c.topic.clone(),
                aggregate_type: c.aggregate_type.clone(),
            });
        }
        Ok(MappedRelation {
            payload_is_bytea: rel.columns[payload].type_oid == BYTEA_OID,
            table,
            id,
            key,
            payload,
            topic,
            aggregate_type,
            event_type: find(&c.event_type),
        })
    }

    /// Maps an INSERT. `Ok(None)` when the row is not in the outbox table.
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
        let text = |idx: usize| -> Option<&Bytes> {
            match cols.get(idx) {
                Some(TupleValue::Text(b)) | Some(TupleValue::Binary(b)) => Some(b),
                _ => None,
            }
        };
        let id = text(m.id).cloned();
        let invalid = |reason: String| OutboxError::InvalidEvent {
            table: m.table.clone(),
            id: id
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_else(|| "?".into()),
            lsn: position.commit_lsn,
            reason,
        };
        let c = &self.config.columns;
        let Some(id_value) = id.clone() else {
            return Err(invalid(format!("column {:?} (event id) is NULL", c.id)));
        };
        let key = text(m.key)
            .cloned()
            .ok_or_else(|| invalid(format!("column {:?} (key) is NULL", c.aggregate_id)))?;
        let raw_payload = text(m.payload)
            .ok_or_else(|| invalid(format!("column {:?} (payload) is NULL", c.payload)))?;
        let payload = if m.payload_is_bytea {
            decode_bytea_hex(raw_payload).ok_or_else(|| {
                invalid(format!(
                    "column {:?} is not in bytea hex format (set bytea_output = 'hex')",
                    c.payload
                ))
            })?
        } else {
            raw_payload.clone()
        };
        let topic = match (m.topic.and_then(text), m.aggregate_type.and_then(text)) {
            (Some(t), _) => utf8(t).map(str::to_owned),
            (None, Some(agg)) => utf8(agg).map(|a| format!("{}{a}", self.config.topic_prefix)),
            (None, None) => None,
        }
        .ok_or_else(|| {
            invalid(format!(
                "no topic: column {:?} and column {:?} are NULL or not UTF-8",
                c.topic, c.aggregate_type
            ))
        })?;
        if topic.is_empty() {
            return Err(invalid("the topic name is empty".into()));
        }
        Ok(Some(OutboxEvent {
            topic,
            key,
            payload,
            id: id_value,
            event_type: m.event_type.and_then(text).cloned(),
            position,
        }))
    }
}

fn utf8(b: &Bytes) -> Option<&str> {
    std::str::from_utf8(b).ok()
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
mod tests {
    use super::*;
    use crate::config::ColumnNames;
    use crate::source::pgoutput::{Column, TupleData};

    fn config() -> OutboxConfig {
        OutboxConfig {
            schema: "public".into(),
            table: "outbox".into(),
            topic_prefix: "outbox.event.".into(),
            columns: ColumnNames {
                id: "id".into(),
                aggregate_id: "aggregate_id".into(),
                aggregate_type: "aggregate_type".into(),
                event_type: "event_type".into(),
                topic: "topic".into(),
                payload: "payload".into(),
            },
        }
    }

    fn relation(id: u32, name: &str, cols: &[(&str, u32)]) -> Relation {
        Relation {
            id,
            namespace: "public".into(),
            name: name.into(),
            replica_identity: b'd',
            columns: cols
                .iter()
                .map(|(n, oid)| Column {
                    flags: 0,
                    name: (*n).into(),
                    type_oid: *oid,
                    type_modifier: -1,
                })
                .collect(),
        }
    }

    fn insert(rel: u32, vals: &[Option<&str>]) -> Insert {
        Insert {
            relation_id: rel,
            tuple: TupleData {
                columns: vals
                    .iter()
                    .map(|v| match v {
                        Some(s) => TupleValue::Text(Bytes::copy_from_slice(s.as_bytes())),
                        None => TupleValue::Null,
                    })
                    .collect(),
            },
        }
    }

    const POS: EventPosition = EventPosition {
        commit_lsn: Lsn(0x16B3748),
        index: 2,
    };

    #[test]
    fn seed_schema_with_topic_column() {
        // 000_…: outbox(id bigint, aggregate_id, topic, event_type, payload jsonb, …)
        let mut m = OutboxMapper::new(config());
        m.relation(&relation(
            1,
            "outbox",
            &[
                ("id", 20),
                ("aggregate_id", 25),
                ("topic", 25),
                ("event_type", 25),
                ("payload", 3802),
            ],
        ))
        .unwrap();
        let e = m
            .map_insert(
                &insert(
                    1,
                    &[
                        Some("7"),
                        Some("wallet-1"),
                        Some("payments.events"),
                        Some("payment.captured"),
                        Some("{\"a\": 1}"),
                    ],
                ),
                POS,
            )
            .unwrap()
            .unwrap();
        assert_eq!(e.topic, "payments.events");
        assert_eq!(&e.key[..], b"wallet-1");
        assert_eq!(&e.payload[..], b"{\"a\": 1}");
        assert_eq!(&e.id[..], b"7");
        assert_eq!(e.event_type.as_deref(), Some(&b"payment.captured"[..]));
        assert_eq!(e.position, POS);
    }

    #[test]
    fn seed_schema_with_aggregate_type_and_bytea() {
        // 003_…: outbox_events(id uuid, aggregate_type, aggregate_id, event_type, payload, …)
        let mut c = config();
        c.table = "outbox_events".into();
        let mut m = OutboxMapper::new(c);
        m.relation(&relation(
            9,
            "outbox_events",
            &[
                ("id", 2950),
                ("aggregate_type", 25),
                ("aggregate_id", 25),
                ("event_type", 25),
                ("payload", BYTEA_OID),
            ],
        ))
        .unwrap();
        let e = m
            .map_insert(
                &insert(
                    9,
                    &[
                        Some("0b6e…"),
                        Some("order"),
                        Some("o-1"),
                        None,
                        Some("\\x00ff41"),
                    ],
                ),
                POS,
            )
            .unwrap()
            .unwrap();
        assert_eq!(e.topic, "outbox.event.order");
        assert_eq!(&e.payload[..], &[0x00, 0xff, 0x41]);
        assert_eq!(e.event_type, None);
    }

    #[test]
    fn topic_falls_back_to_aggregate_type_when_null() {
        let mut m = OutboxMapper::new(config());
        m.relation(&relation(
            1,
            "outbox",
            &[
                ("id", 20),
                ("aggregate_id", 25),
                ("aggregate_type", 25),
                ("topic", 25),
                ("payload", 25),
            ],
        ))
        .unwrap();
        let e = m
            .map_insert(
                &insert(1, &[Some("1"), Some("k"), Some("user"), None, Some("x")]),
                POS,
            )
            .unwrap()
            .unwrap();
        assert_eq!(e.topic, "outbox.event.user");
    }

    #[test]
    fn other_tables_are_ignored() {
        let mut m = OutboxMapper::new(config());
        m.relation(&relation(2, "payments", &[("id", 20)])).unwrap();
        assert!(!m.is_outbox(2));
        assert_eq!(m.map_insert(&insert(2, &[Some("1")]), POS).unwrap(), None);
        assert!(matches!(
            m.map_insert(&insert(3, &[Some("1")]), POS),
            Err(OutboxError::UnknownRelation(3))
        ));
    }

    #[test]
    fn missing_columns_name_the_setting() {
        let mut m = OutboxMapper::new(config());
        let err = m
            .relation(&relation(
                1,
                "outbox",
                &[("id", 20), ("topic", 25), ("payload", 25)],
            ))
            .unwrap_err();
        assert!(
            err.to_string().contains("outbox.columns.aggregate_id"),
            "{err}"
        );
        let err = m
            .relation(&relation(
                1,
                "outbox",
                &[("id", 20), ("aggregate_id", 25), ("payload", 25)],
            ))
            .unwrap_err();
        assert!(matches!(err, OutboxError::NoTopicColumn { .. }));
    }

    #[test]
    fn unpublishable_rows_are_errors_with_id_and_lsn() {
        let mut m = OutboxMapper::new(config());
        m.relation(&relation(
            1,
            "outbox",
            &[
                ("id", 20),
                ("aggregate_id", 25),
                ("topic", 25),
                ("payload", 25),
            ],
        ))
        .unwrap();
        for row in [
            [Some("42"), None, Some("t"), Some("p")],
            [Some("42"), Some("k"), None, Some("p")],
            [Some("42"), Some("k"), Some("t"), None],
        ] {
            let err = m.map_insert(&insert(1, &row), POS).unwrap_err().to_string();
            assert!(
                err.contains("event 42") && err.contains("0/16B3748"),
                "{err}"
            );
        }
    }

    #[test]
    fn bytea_hex() {
        assert_eq!(decode_bytea_hex(b"\\x").as_deref(), Some(&[][..]));
        assert_eq!(
            decode_bytea_hex(b"\\xDEad").as_deref(),
            Some(&[0xde, 0xad][..])
        );
        assert_eq!(decode_bytea_hex(b"\\x0"), None);
        assert_eq!(decode_bytea_hex(b"\\xzz"), None);
        assert_eq!(decode_bytea_hex(b"abc"), None);
    }
}
