//! The record as the inbox sees it, and the effect statement with named placeholders.
//!
//! An effect is one SQL statement, e.g. `SELECT billing.apply_payment($payload, $key)`. Named
//! placeholders are rewritten to positional parameters once, at start-up ([`EffectSql::parse`]);
//! each placeholder becomes one typed parameter:
//!
//! | placeholder | PostgreSQL type | value |
//! |---|---|---|
//! | `$payload` | `jsonb` | the record value (NULL without one; not JSON → the effect fails) |
//! | `$payload_bytes` | `bytea` | the record value as bytes |
//! | `$key` | `text` | the record key (not UTF-8 → invalid record) |
//! | `$key_bytes` | `bytea` | the record key as bytes |
//! | `$headers` | `jsonb` | `{"name": "value", …}`; non-UTF-8 values → invalid record |
//! | `$message_id` | `text` | the message id (the inbox key) |
//! | `$topic` | `text` | topic |
//! | `$partition` | `int4` | partition |
//! | `$offset` | `int8` | offset |
//! | `$timestamp` | `timestamptz` | the record timestamp (NULL without one) |
//!
//! Invariants: unknown placeholders and positional `$1` are configuration errors; nothing here
//! panics on any record (bad bytes become [`InvalidRecord`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_postgres::types::{ToSql, Type};

use crate::failure::{Classify, Failure};

/// One consumed record, owned (detached from librdkafka's buffers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The topic it was consumed from.
    pub topic: String,
    /// The partition it was consumed from.
    pub partition: i32,
    /// Its offset in that partition (the offset committed is one past it).
    pub offset: i64,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub payload: Option<Vec<u8>>,
    /// Headers in order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Milliseconds since the Unix epoch, when the record has a timestamp.
    pub timestamp_ms: Option<i64>,
}

/// Why a record cannot be processed whatever the database does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRecord(pub String);

impl Classify for InvalidRecord {
    /// The record's fault, whatever the database does: its policy dead-letters it, or the
    /// inbox stops (exit 10), as [`super::store::StoreError`] says for it.
    fn failure(&self) -> Option<Failure> {
        Some(Failure::InboxRecord)
    }
}

impl Record {
    /// The first header called `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
    }

    /// The message id: the header `name`, non-empty UTF-8.
    pub fn message_id(&self, name: &str) -> Result<&str, InvalidRecord> {
        let raw = self
            .header(name)
            .ok_or_else(|| InvalidRecord(format!("no {name:?} header")))?;
        let id = std::str::from_utf8(raw)
            .map_err(|_| InvalidRecord(format!("header {name:?} is not UTF-8")))?;
        if id.is_empty() {
            return Err(InvalidRecord(format!("header {name:?} is empty")));
        }
        Ok(id)
    }

    /// The key as text (`None` without a key).
    pub fn key_text(&self) -> Result<Option<&str>, InvalidRecord> {
        self.key
            .as_deref()
            .map(std::str::from_utf8)
            .transpose()
            .map_err(|_| InvalidRecord("key is not UTF-8".into()))
    }

    /// The payload as text for a `jsonb` parameter (`None` without a payload).
    pub fn payload_text(&self) -> Result<Option<&str>, InvalidRecord> {
        self.payload
            .as_deref()
            .map(std::str::from_utf8)
            .transpose()
            .map_err(|_| InvalidRecord("payload is not UTF-8 (use $payload_bytes)".into()))
    }

    /// The headers as a JSON object text.
    pub fn headers_json(&self) -> Result<String, InvalidRecord> {
        let mut map = serde_json::Map::new();
        for (k, v) in &self.headers {
            let v = match v {
                None => serde_json::Value::Null,
                Some(b) => serde_json::Value::String(
                    String::from_utf8(b.clone())
                        .map_err(|_| InvalidRecord(format!("header {k:?} is not UTF-8")))?,
                ),
            };
            map.entry(k.clone()).or_insert(v);
        }
        Ok(serde_json::Value::Object(map).to_string())
    }

    fn timestamp(&self) -> Option<SystemTime> {
        let ms = self.timestamp_ms?;
        let d = Duration::from_millis(ms.unsigned_abs());
        if ms >= 0 {
            UNIX_EPOCH.checked_add(d)
        } else {
            UNIX_EPOCH.checked_sub(d)
        }
    }
}

/// A named placeholder of the effect statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placeholder {
    /// `$payload`
    Payload,
    /// `$payload_bytes`
    PayloadBytes,
    /// `$key`
    Key,
    /// `$key_bytes`
    KeyBytes,
    /// `$headers`
    Headers,
    /// `$message_id`
    MessageId,
    /// `$topic`
    Topic,
    /// `$partition`
    Partition,
    /// `$offset`
    Offset,
    /// `$timestamp`
    Timestamp,
}

const ALL: &[(&str, Placeholder)] = &[
    ("payload", Placeholder::Payload),
    ("payload_bytes", Placeholder::PayloadBytes),
    ("key", Placeholder::Key),
    ("key_bytes", Placeholder::KeyBytes),
    ("headers", Placeholder::Headers),
    ("message_id", Placeholder::MessageId),
    ("topic", Placeholder::Topic),
    ("partition", Placeholder::Partition),
    ("offset", Placeholder::Offset),
    ("timestamp", Placeholder::Timestamp),
];

/// The per-record placeholder called `name` (without the `$`).
pub(super) fn placeholder(name: &str) -> Option<Placeholder> {
    ALL.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
}

/// Rewrites every named placeholder `$name` of `text` to what `param(name)` returns, or fails
/// with its reason. Text inside single-quoted literals and double-quoted identifiers is left
/// alone; positional parameters (`$1`), a bare `$`, an empty statement and an unterminated
/// quote are refused.
pub(super) fn rewrite(
    text: &str,
    hint: &str,
    mut param: impl FnMut(&str) -> Result<String, String>,
) -> Result<String, String> {
    if text.trim().is_empty() {
        return Err("the statement is empty".into());
    }
    let mut sql = String::with_capacity(text.len() + 16);
    let mut chars = text.char_indices().peekable();
    let mut quote: Option<char> = None;
    while let Some((i, c)) = chars.next() {
        if let Some(q) = quote {
            sql.push(c);
            if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '\'' | '"' => {
                quote = Some(c);
                sql.push(c);
            }
            '$' => {
                let rest = &text[i + 1..];
                let len = rest
                    .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                    .unwrap_or(rest.len());
                let name = &rest[..len];
                if name.is_empty() || name.starts_with(|ch: char| ch.is_ascii_digit()) {
                    return Err(format!(
                        "use named placeholders ({hint}), not {:?}",
                        format!("${name}")
                    ));
                }
                sql.push_str(&param(name)?);
                for _ in 0..len {
                    chars.next();
                }
            }
            _ => sql.push(c),
        }
    }
    if quote.is_some() {
        return Err("unterminated quoted literal or identifier".into());
    }
    Ok(sql)
}

impl Placeholder {
    /// The parameter's declared type (`jsonb` values are sent as text and cast).
    pub fn param_type(self) -> Type {
        match self {
            Placeholder::Payload
            | Placeholder::Key
            | Placeholder::Headers
            | Placeholder::MessageId
            | Placeholder::Topic => Type::TEXT,
            Placeholder::PayloadBytes | Placeholder::KeyBytes => Type::BYTEA,
            Placeholder::Partition => Type::INT4,
            Placeholder::Offset => Type::INT8,
            Placeholder::Timestamp => Type::TIMESTAMPTZ,
        }
    }

    fn is_json(self) -> bool {
        matches!(self, Placeholder::Payload | Placeholder::Headers)
    }

    /// This placeholder's value for `record`.
    pub fn value(
        self,
        record: &Record,
        message_id: &str,
    ) -> Result<Box<dyn ToSql + Sync + Send>, InvalidRecord> {
        Ok(match self {
            Placeholder::Payload => Box::new(record.payload_text()?.map(str::to_owned)),
            Placeholder::PayloadBytes => Box::new(record.payload.clone()),
            Placeholder::Key => Box::new(record.key_text()?.map(str::to_owned)),
            Placeholder::KeyBytes => Box::new(record.key.clone()),
            Placeholder::Headers => Box::new(record.headers_json()?),
            Placeholder::MessageId => Box::new(message_id.to_owned()),
            Placeholder::Topic => Box::new(record.topic.clone()),
            Placeholder::Partition => Box::new(record.partition),
            Placeholder::Offset => Box::new(record.offset),
            Placeholder::Timestamp => Box::new(record.timestamp()),
        })
    }
}

/// The effect statement, rewritten to positional parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectSql {
    /// The statement as configured.
    pub original: String,
    /// The statement with `$n` parameters.
    pub sql: String,
    /// Parameter `$n` is `params[n - 1]`.
    pub params: Vec<Placeholder>,
}

impl EffectSql {
    /// Rewrites named placeholders to `$1, $2, …` (the same name, the same parameter). Text
    /// inside single-quoted literals and double-quoted identifiers is left alone.
    pub fn parse(text: &str) -> Result<EffectSql, String> {
        let mut params: Vec<Placeholder> = Vec::new();
        let sql = rewrite(text, "$payload, $key, …", |name| {
            let Some(p) = placeholder(name) else {
                let known: Vec<String> = ALL.iter().map(|(n, _)| format!("${n}")).collect();
                return Err(format!(
                    "unknown placeholder ${name}; known: {}",
                    known.join(", ")
                ));
            };
            let n = match params.iter().position(|q| *q == p) {
                Some(k) => k + 1,
                None => {
                    params.push(p);
                    params.len()
                }
            };
            Ok(if p.is_json() {
                format!("(${n}::jsonb)")
            } else {
                format!("${n}")
            })
        })?;
        Ok(EffectSql {
            original: text.to_owned(),
            sql,
            params,
        })
    }

    /// The declared parameter types, for `prepare_typed`.
    pub fn types(&self) -> Vec<Type> {
        self.params.iter().map(|p| p.param_type()).collect()
    }

    /// The parameter values for `record`.
    pub fn values(
        &self,
        record: &Record,
        message_id: &str,
    ) -> Result<Vec<Box<dyn ToSql + Sync + Send>>, InvalidRecord> {
        self.params
            .iter()
            .map(|p| p.value(record, message_id))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            topic: "t".into(),
            partition: 2,
            offset: 7,
            key: Some(b"wallet-1".to_vec()),
            payload: Some(br#"{"amount": 5}"#.to_vec()),
            headers: vec![
                ("id".into(), Some(b"42".to_vec())),
                ("event_type".into(), Some(b"paid".to_vec())),
            ],
            timestamp_ms: Some(1_700_000_000_000),
        }
    }

    #[test]
    fn placeholders_become_typed_parameters() {
        let e = EffectSql::parse(
            "SELECT apply($payload, $key, $payload, '$not_a_param', \"$col\", $offset)",
        )
        .unwrap();
        assert_eq!(
            e.sql,
            "SELECT apply(($1::jsonb), $2, ($1::jsonb), '$not_a_param', \"$col\", $3)"
        );
        assert_eq!(
            e.params,
            [Placeholder::Payload, Placeholder::Key, Placeholder::Offset]
        );
        assert_eq!(e.types(), [Type::TEXT, Type::TEXT, Type::INT8]);
        assert_eq!(e.values(&record(), "42").unwrap().len(), 3);
    }

    #[test]
    fn bad_statements_are_refused() {
        assert!(EffectSql::parse("SELECT f($1)").is_err());
        assert!(EffectSql::parse("SELECT f($payloads)").is_err());
        assert!(EffectSql::parse("SELECT f($)").is_err());
        assert!(EffectSql::parse("SELECT 'open").is_err());
        assert!(EffectSql::parse("  ").is_err());
    }

    #[test]
    fn message_ids() {
        let mut r = record();
        assert_eq!(r.message_id("id"), Ok("42"));
        assert!(r.message_id("event_id").is_err());
        r.headers[0].1 = Some(vec![0xff, 0xfe]);
        assert!(r.message_id("id").is_err());
        r.headers[0].1 = Some(Vec::new());
        assert!(r.message_id("id").is_err());
        r.headers[0].1 = None;
        assert!(r.message_id("id").is_err());
    }

    #[test]
    fn garbage_never_panics() {
        let r = Record {
            key: Some(vec![0xc3]),
            payload: Some(vec![0xff]),
            headers: vec![("h".into(), Some(vec![0x80]))],
            timestamp_ms: Some(i64::MIN),
            ..record()
        };
        assert!(r.key_text().is_err());
        assert!(r.payload_text().is_err());
        assert!(r.headers_json().is_err());
        assert!(Placeholder::KeyBytes.value(&r, "x").is_ok());
        assert!(Placeholder::Timestamp.value(&r, "x").is_ok());
    }

    #[test]
    fn headers_as_json() {
        assert_eq!(
            record().headers_json().unwrap(),
            r#"{"event_type":"paid","id":"42"}"#
        );
    }
}
