//! The set-based effect (`effect.batch_sql`): one statement per batch, which receives the
//! batch's new records (those whose inbox row the batch's `INSERT` made) as one `jsonb` array,
//! `$records`, in offset order.
//!
//! Each element of `$records` is an object with the per-record placeholders' values:
//!
//! | field | JSON | value |
//! |---|---|---|
//! | `message_id` | string | the message id (the inbox key) |
//! | `key` | string or `null` | the record key (not UTF-8 → invalid record) |
//! | `payload` | the value itself, or `null` | the record value, which must be JSON |
//! | `headers` | object | `{"name": "value", …}`; non-UTF-8 values → invalid record |
//! | `topic`, `partition`, `offset` | string, number, number | where the record was read |
//! | `timestamp` | string (RFC 3339, UTC) or `null` | the record timestamp |
//!
//! so that `FROM jsonb_to_recordset($records) AS r(message_id text, key text, payload jsonb)`
//! reads them as rows.
//!
//! # Invariants
//! - `$records` is the statement's only placeholder and appears at least once; every use is the
//!   same parameter, sent as text and cast to `jsonb`.
//! - An element is built from checked parts only: strings are JSON-escaped and a payload is
//!   embedded only after it parsed as one JSON value, so no record can add, remove or change
//!   another record's element. A payload that is not JSON never reaches the array: it is its
//!   own record's effect error ([`Element::NotJson`]), as `$payload` would be in `effect.sql`.

use serde_json::value::RawValue;

use super::effect::{placeholder, rewrite, InvalidRecord, Record};
use crate::timestamp::rfc3339_ms;

/// The set-based effect statement, rewritten to one positional parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchSql {
    /// The statement as configured.
    pub original: String,
    /// The statement with `$records` as `($1::jsonb)`.
    pub sql: String,
}

/// The placeholder of `effect.batch_sql`.
const RECORDS: &str = "records";

impl BatchSql {
    /// Rewrites `$records` to the statement's one parameter; refuses any other placeholder (the
    /// per-record ones with a hint) and a statement without `$records`.
    pub fn parse(text: &str) -> Result<BatchSql, String> {
        let mut uses = 0;
        let sql = rewrite(text, "$records", |name| {
            if name == RECORDS {
                uses += 1;
                return Ok("($1::jsonb)".into());
            }
            Err(match placeholder(name) {
                Some(_) => format!(
                    "${name} is a per-record placeholder (effect.sql); a batch's records are the rows of $records, e.g. jsonb_to_recordset($records) AS r({name} …)"
                ),
                None => format!("unknown placeholder ${name}; the only one is $records"),
            })
        })?;
        if uses == 0 {
            return Err(
                "the statement must read the batch's records from $records, e.g. FROM jsonb_to_recordset($records) AS r(message_id text, key text, payload jsonb)"
                    .into(),
            );
        }
        Ok(BatchSql {
            original: text.to_owned(),
            sql,
        })
    }
}

/// One record as an element of `$records`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Element {
    /// The element's JSON text.
    Json(String),
    /// The payload is not JSON (why): the record's effect fails.
    NotJson(String),
}

impl Element {
    /// The element for `record` with its `message_id`; an [`InvalidRecord`] when the key or a
    /// header value is not UTF-8, or the payload is not UTF-8.
    pub fn of(record: &Record, message_id: &str) -> Result<Element, InvalidRecord> {
        let key = record.key_text()?;
        let headers = record.headers_json()?;
        let payload = match record.payload.as_deref() {
            None => None,
            Some(bytes) => {
                let text = std::str::from_utf8(bytes).map_err(|_| {
                    InvalidRecord("payload is not UTF-8 ($records carries it as JSON)".into())
                })?;
                match serde_json::from_str::<&RawValue>(text) {
                    Ok(raw) => Some(raw.get()),
                    Err(e) => {
                        return Ok(Element::NotJson(format!(
                            "the payload is not JSON ({e}); $records carries it as JSON"
                        )))
                    }
                }
            }
        };
        let mut out = String::with_capacity(96 + text_len(record) + headers.len());
        out.push_str("{\"message_id\":");
        push_str(&mut out, message_id);
        out.push_str(",\"key\":");
        match key {
            Some(k) => push_str(&mut out, k),
            None => out.push_str("null"),
        }
        out.push_str(",\"payload\":");
        out.push_str(payload.unwrap_or("null"));
        out.push_str(",\"headers\":");
        out.push_str(&headers);
        out.push_str(",\"topic\":");
        push_str(&mut out, &record.topic);
        out.push_str(&format!(
            ",\"partition\":{},\"offset\":{},\"timestamp\":",
            record.partition, record.offset
        ));
        match record.timestamp_ms {
            Some(ms) => push_str(&mut out, &rfc3339_ms(ms)),
            None => out.push_str("null"),
        }
        out.push('}');
        Ok(Element::Json(out))
    }
}

fn text_len(record: &Record) -> usize {
    record.payload.as_ref().map_or(0, Vec::len) + record.key.as_ref().map_or(0, Vec::len)
}

/// Appends `s` as a JSON string.
fn push_str(out: &mut String, s: &str) {
    // Serialising a string into JSON cannot fail.
    out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "null".into()));
}

/// The `$records` array of `elements`, in order.
pub fn array<'a>(elements: impl Iterator<Item = &'a str>) -> String {
    let mut out = String::from("[");
    for (n, e) in elements.enumerate() {
        if n > 0 {
            out.push(',');
        }
        out.push_str(e);
    }
    out.push(']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(payload: &[u8]) -> Record {
        Record {
            topic: "t\"x".into(),
            partition: 2,
            offset: 7,
            key: Some(b"wallet-1".to_vec()),
            payload: Some(payload.to_vec()),
            headers: vec![("id".into(), Some(b"42".to_vec()))],
            timestamp_ms: Some(1_700_000_000_000),
        }
    }

    #[test]
    fn records_becomes_the_one_parameter() {
        let b = BatchSql::parse(
            "INSERT INTO t SELECT * FROM jsonb_to_recordset($records) r(message_id text) WHERE '$records' <> \"$records\" AND jsonb_array_length($records) > 0",
        )
        .unwrap();
        assert_eq!(
            b.sql,
            "INSERT INTO t SELECT * FROM jsonb_to_recordset(($1::jsonb)) r(message_id text) WHERE '$records' <> \"$records\" AND jsonb_array_length(($1::jsonb)) > 0"
        );
    }

    #[test]
    fn other_placeholders_and_statements_without_records_are_refused() {
        for (text, says) in [
            ("SELECT f($payload)", "per-record placeholder"),
            ("SELECT f($records, $key)", "$key is a per-record"),
            ("SELECT f($recs)", "the only one is $records"),
            ("SELECT f($1)", "$records"),
            ("SELECT 1", "must read the batch's records from $records"),
            ("SELECT '$records'", "must read"),
            ("  ", "empty"),
        ] {
            let e = BatchSql::parse(text).unwrap_err();
            assert!(e.contains(says) && !e.contains('\n'), "{text}: {e}");
        }
    }

    #[test]
    fn elements_are_json_objects_with_every_field() {
        let Element::Json(text) = Element::of(&record(br#" {"amount": 5} "#), "42").unwrap() else {
            panic!("not JSON");
        };
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "message_id": "42", "key": "wallet-1", "payload": {"amount": 5},
                "headers": {"id": "42"}, "topic": "t\"x", "partition": 2, "offset": 7,
                "timestamp": "2023-11-14T22:13:20.000Z"
            })
        );
        let none = Record {
            key: None,
            payload: None,
            timestamp_ms: None,
            ..record(b"")
        };
        let Element::Json(text) = Element::of(&none, "x").unwrap() else {
            panic!("not JSON");
        };
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["key"], serde_json::Value::Null);
        assert_eq!(v["payload"], serde_json::Value::Null);
        assert_eq!(v["timestamp"], serde_json::Value::Null);
    }

    #[test]
    fn a_payload_cannot_reach_outside_its_element() {
        // Not one JSON value: refused, never embedded.
        for bad in [
            &br#"{"a": 1}, {"message_id": "forged"}"#[..],
            b"{\"a\": 1",
            b"",
            b"not json",
        ] {
            assert!(
                matches!(Element::of(&record(bad), "1").unwrap(), Element::NotJson(_)),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(Element::of(&record(&[0xff]), "1").is_err());
        // PostgreSQL's jsonb takes numbers beyond f64, as `$payload` would.
        assert!(matches!(
            Element::of(&record(b"1e400"), "1").unwrap(),
            Element::Json(_)
        ));
        let elements = [
            Element::of(&record(b"-0.5"), "1").unwrap(),
            Element::of(&record(b"[\"]\"]"), "2").unwrap(),
        ];
        let texts: Vec<&str> = elements
            .iter()
            .map(|e| match e {
                Element::Json(t) => t.as_str(),
                Element::NotJson(why) => panic!("{why}"),
            })
            .collect();
        let v: serde_json::Value = serde_json::from_str(&array(texts.into_iter())).unwrap();
        assert_eq!(v.as_array().map(Vec::len), Some(2));
        assert_eq!(v[1]["payload"], serde_json::json!(["]"]));
    }
}
