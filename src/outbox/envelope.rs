//! Record value encodings besides the raw payload: a JSON envelope and the protobuf envelope
//! `walbox.v1.Envelope` (`proto/walbox/v1/envelope.proto`, compiled at build time by protox and
//! prost, with no system `protoc`).
//!
//! Both envelopes carry the same fields:
//! - `id`, the event type, the aggregate type and id;
//! - the payload;
//! - the commit LSN, the commit time and the index;
//! - the source (`schema.table`);
//! - the extra `[outbox.envelope]` fields.
//!
//! In the JSON envelope, a json/jsonb payload is embedded as JSON; so is a text payload that
//! holds valid JSON when `expand_json_payload` is on. Embedded JSON is the payload's own text
//! (checked to be JSON, never re-encoded): numbers keep every digit, however far beyond f64 or
//! i64. Any other text payload is embedded as a string, and a bytea payload as a base64 string. The protobuf envelope always carries the
//! payload's bytes as stored, with their content type.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use prost::Message as _;
use serde_json::value::RawValue;

use crate::config::ValueFormat;
use crate::timestamp::rfc3339_micros;

/// The generated protobuf types (`walbox.v1`).
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/walbox.v1.rs"));
}

/// What a payload column holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadKind {
    /// json or jsonb: valid JSON text.
    Json,
    /// Any other text type.
    Text,
    /// bytea, already decoded from hex.
    Bytes,
}

/// A payload as stored, with what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    /// The bytes.
    pub bytes: Bytes,
    /// Their kind.
    pub kind: PayloadKind,
}

/// Everything an envelope holds.
pub struct Envelope<'a> {
    /// Event id.
    pub id: &'a [u8],
    /// Event type, if any.
    pub event_type: Option<&'a [u8]>,
    /// Aggregate type, if any.
    pub aggregate_type: Option<&'a [u8]>,
    /// Aggregate id.
    pub aggregate_id: &'a [u8],
    /// The payload.
    pub payload: &'a Payload,
    /// Embed JSON text payloads as JSON.
    pub expand_json: bool,
    /// Commit LSN text.
    pub commit_lsn: &'a str,
    /// Commit time, Unix microseconds.
    pub commit_time_us: i64,
    /// Index in the transaction.
    pub index: u32,
    /// `schema.table` or `message:<prefix>`.
    pub source: &'a str,
    /// Extra fields (NULL ones are left out).
    pub fields: &'a [(Arc<str>, Option<Bytes>)],
}

/// A JSON envelope field: a value, or JSON text written out as it is.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum Field<'a> {
    Raw(&'a RawValue),
    Value(serde_json::Value),
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl PayloadKind {
    /// The media type of a payload of this kind, as stored.
    pub fn content_type(self) -> &'static str {
        match self {
            PayloadKind::Json => "application/json",
            PayloadKind::Text => "text/plain",
            PayloadKind::Bytes => "application/octet-stream",
        }
    }
}

/// The media type of a record value in `format` whose payload is of `kind` (`None`: a NULL
/// payload, sent as a tombstone).
pub fn content_type(format: ValueFormat, kind: Option<PayloadKind>) -> &'static str {
    match (format, kind) {
        (ValueFormat::Json, _) => "application/json",
        (ValueFormat::Protobuf, _) => "application/protobuf",
        (ValueFormat::Raw, Some(kind)) => kind.content_type(),
        (ValueFormat::Raw, None) => "text/plain",
    }
}

impl Envelope<'_> {
    /// Encodes in `format` (`Raw` is not an envelope and returns the payload): the bytes and
    /// their media type. An error is a reason the row cannot be published.
    pub fn encode(&self, format: ValueFormat) -> Result<(Bytes, &'static str), String> {
        let bytes = match format {
            ValueFormat::Raw => self.payload.bytes.clone(),
            ValueFormat::Json => self.json()?,
            ValueFormat::Protobuf => self.protobuf(),
        };
        Ok((bytes, content_type(format, Some(self.payload.kind))))
    }

    fn json(&self) -> Result<Bytes, String> {
        let p = &self.payload;
        let as_json = match p.kind {
            PayloadKind::Json => true,
            PayloadKind::Text => self.expand_json,
            PayloadKind::Bytes => false,
        };
        // Parsed as a borrowed `RawValue`: checked to be JSON, numbers left as written (no
        // conversion through f64, which would round or refuse them).
        let raw: Option<&RawValue> = if as_json {
            std::str::from_utf8(&p.bytes)
                .ok()
                .and_then(|s| serde_json::from_str(s).ok())
        } else {
            None
        };
        let payload = match (raw, p.kind) {
            (Some(r), _) => Field::Raw(r),
            (None, PayloadKind::Json) => return Err("the json payload is not valid JSON".into()),
            (None, PayloadKind::Bytes) => Field::Value(base64(&p.bytes).into()),
            (None, PayloadKind::Text) => Field::Value(text(&p.bytes).into()),
        };
        // Sorted by name; an extra field named like a fixed one replaces it.
        let mut obj: BTreeMap<String, Field<'_>> = BTreeMap::new();
        let mut put = |name: &str, v: serde_json::Value| {
            obj.insert(name.to_owned(), Field::Value(v));
        };
        put("id", text(self.id).into());
        put("type", self.event_type.map(text).into());
        put("aggregate_type", self.aggregate_type.map(text).into());
        put("aggregate_id", text(self.aggregate_id).into());
        put("commit_lsn", self.commit_lsn.into());
        put("commit_time", rfc3339_micros(self.commit_time_us, 6).into());
        put("index", self.index.into());
        put("source", self.source.into());
        obj.insert("payload".into(), payload);
        for (name, v) in self.fields {
            if let Some(v) = v {
                obj.insert(name.to_string(), Field::Value(text(v).into()));
            }
        }
        serde_json::to_vec(&obj)
            .map(Bytes::from)
            .map_err(|e| e.to_string())
    }

    fn protobuf(&self) -> Bytes {
        let m = proto::Envelope {
            id: text(self.id),
            event_type: self.event_type.map(text).unwrap_or_default(),
            aggregate_type: self.aggregate_type.map(text).unwrap_or_default(),
            aggregate_id: text(self.aggregate_id),
            payload: self.payload.bytes.to_vec(),
            payload_content_type: self.payload.kind.content_type().into(),
            commit_lsn: self.commit_lsn.into(),
            commit_time_unix_micros: self.commit_time_us,
            index: self.index,
            source: self.source.into(),
            fields: self
                .fields
                .iter()
                .filter_map(|(k, v)| Some((k.to_string(), text(v.as_ref()?))))
                .collect(),
        };
        Bytes::from(m.encode_to_vec())
    }
}

/// Standard base64 with padding.
pub(crate) fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(payload: &'a Payload, fields: &'a [(Arc<str>, Option<Bytes>)]) -> Envelope<'a> {
        Envelope {
            id: b"42",
            event_type: Some(b"order.placed"),
            aggregate_type: Some(b"order"),
            aggregate_id: b"o-1",
            payload,
            expand_json: false,
            commit_lsn: "0/16B3748",
            commit_time_us: 1_796_000_523_123_456,
            index: 3,
            source: "public.outbox",
            fields,
        }
    }

    #[test]
    fn json_envelope_embeds_json_payloads() {
        let p = Payload {
            bytes: Bytes::from_static(br#"{"a": [1, 2]}"#),
            kind: PayloadKind::Json,
        };
        let fields = [(Arc::from("tenant"), Some(Bytes::from_static(b"t1")))];
        let v: serde_json::Value =
            serde_json::from_slice(&env(&p, &fields).encode(ValueFormat::Json).unwrap().0).unwrap();
        assert_eq!(v["payload"]["a"][1], 2);
        assert_eq!(v["id"], "42");
        assert_eq!(v["type"], "order.placed");
        assert_eq!(v["commit_time"], "2026-11-30T01:02:03.123456Z");
        assert_eq!(v["tenant"], "t1");
        assert_eq!(v["index"], 3);
    }

    #[test]
    fn json_envelope_keeps_every_digit_of_a_number() {
        // Beyond f64's 17 significant digits, beyond i64 and u64, and beyond f64's range.
        let huge = format!("1{}", "0".repeat(400));
        let payload = format!(
            r#"{{"amount":12345678901234567890.12345678901234567890,"big":-98765432109876543210,"huge":{huge},"tiny":1e-400}}"#
        );
        for kind in [PayloadKind::Json, PayloadKind::Text] {
            let p = Payload {
                bytes: Bytes::from(payload.clone()),
                kind,
            };
            let mut e = env(&p, &[]);
            e.expand_json = true;
            let out = e.encode(ValueFormat::Json).unwrap().0;
            // Read with numbers left as text: the envelope is JSON, the payload its own text.
            let v: BTreeMap<&str, &RawValue> = serde_json::from_slice(&out).unwrap();
            assert_eq!(v["payload"].get(), payload, "{kind:?}");
            assert_eq!(v["id"].get(), r#""42""#);
        }
    }

    #[test]
    fn text_payloads_expand_only_when_asked() {
        let p = Payload {
            bytes: Bytes::from_static(br#"{"x":1}"#),
            kind: PayloadKind::Text,
        };
        let mut e = env(&p, &[]);
        let v: serde_json::Value =
            serde_json::from_slice(&e.encode(ValueFormat::Json).unwrap().0).unwrap();
        assert_eq!(v["payload"], r#"{"x":1}"#);
        e.expand_json = true;
        let v: serde_json::Value =
            serde_json::from_slice(&e.encode(ValueFormat::Json).unwrap().0).unwrap();
        assert_eq!(v["payload"]["x"], 1);
        let bad = Payload {
            bytes: Bytes::from_static(b"not json"),
            kind: PayloadKind::Text,
        };
        let mut e = env(&bad, &[]);
        e.expand_json = true;
        let v: serde_json::Value =
            serde_json::from_slice(&e.encode(ValueFormat::Json).unwrap().0).unwrap();
        assert_eq!(v["payload"], "not json", "invalid JSON text stays a string");
    }

    #[test]
    fn bytes_payloads_are_base64_in_json() {
        let p = Payload {
            bytes: Bytes::from_static(&[0, 255, 1, 2]),
            kind: PayloadKind::Bytes,
        };
        let v: serde_json::Value =
            serde_json::from_slice(&env(&p, &[]).encode(ValueFormat::Json).unwrap().0).unwrap();
        assert_eq!(v["payload"], "AP8BAg==");
    }

    #[test]
    fn protobuf_round_trips() {
        let p = Payload {
            bytes: Bytes::from_static(b"{}"),
            kind: PayloadKind::Json,
        };
        let (b, content_type) = env(&p, &[]).encode(ValueFormat::Protobuf).unwrap();
        assert_eq!(content_type, "application/protobuf");
        let m = proto::Envelope::decode(&b[..]).unwrap();
        assert_eq!(m.id, "42");
        assert_eq!(m.payload, b"{}");
        assert_eq!(m.payload_content_type, "application/json");
        assert_eq!(m.commit_time_unix_micros, 1_796_000_523_123_456);
    }

    #[test]
    fn base64_matches_rfc4648() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }
}
