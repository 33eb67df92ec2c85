//! An event's NATS message: walbox's headers and the key as header values, the event id as
//! `Nats-Msg-Id`, the value as payload. What cannot be carried (a header name NATS does not
//! take, a value that is not text without line breaks) is the record's fault: [`message`]
//! builds the message when the record is handed over, so the relay learns it at once, and the
//! headers are checked and built once.

use async_nats::jetstream::message::PublishMessage;
use async_nats::{HeaderMap, HeaderName, HeaderValue};

use crate::outbox::{self, OutboxEvent, KEY_HEADER};

/// The NATS headers of `event` (without `Nats-Msg-Id`), or why it cannot be carried.
fn headers(event: &OutboxEvent) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    for (name, value) in &event.headers {
        let header = match name {
            // walbox's own names: no copy.
            outbox::HeaderName::Static(s) if valid_name(s) => HeaderName::from_static(s),
            other => {
                let name = other.as_str();
                HeaderName::try_from(name).map_err(|_| name_fault(name))?
            }
        };
        match value {
            None => map.append(header, HeaderValue::default()),
            Some(v) => map.append(header, text(name.as_str(), v)?),
        }
    }
    if let Some(key) = &event.key {
        map.insert(KEY_HEADER, text(KEY_HEADER, key)?);
    }
    Ok(map)
}

/// `event` as the message to publish: its headers, the event id as `Nats-Msg-Id`, the value
/// as payload (empty for a tombstone).
pub(super) fn message(event: &OutboxEvent) -> Result<PublishMessage, String> {
    Ok(PublishMessage::build()
        .payload(event.value.clone().unwrap_or_default())
        .headers(headers(event)?)
        .message_id(String::from_utf8_lossy(&event.id)))
}

/// Whether NATS takes `name` as a header name (the client's rule: printable ASCII, no ':').
fn valid_name(name: &str) -> bool {
    !name.contains(|c: char| !c.is_ascii_graphic() || c == ':')
}

fn name_fault(name: &str) -> String {
    format!("header name {name:?} is not a NATS header name (printable ASCII, no ':')")
}

/// `value` as a header value: UTF-8 text without line breaks.
fn text<'v>(name: &str, value: &'v [u8]) -> Result<&'v str, String> {
    std::str::from_utf8(value)
        .ok()
        .filter(|v| !v.contains(['\r', '\n']))
        .ok_or_else(|| {
            format!(
                "header {name:?} is not UTF-8 text without line breaks, which NATS headers carry"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::{EventPosition, Headers};
    use bytes::Bytes;

    fn event(headers: &[(outbox::HeaderName, &str)], key: &str) -> OutboxEvent {
        let headers: Headers = headers
            .iter()
            .map(|(n, v)| (n.clone(), Some(Bytes::from(v.to_string()))))
            .collect();
        OutboxEvent {
            topic: "orders.1".into(),
            partition: None,
            key: Some(Bytes::from(key.to_owned())),
            value: None,
            headers,
            timestamp_ms: 0,
            id: Bytes::from_static(b"e-1"),
            position: EventPosition::default(),
            source: "public.outbox".into(),
        }
    }

    #[test]
    fn every_header_is_carried_and_what_nats_cannot_carry_is_named() {
        let own = outbox::HeaderName::Static("walbox.index");
        let custom = outbox::HeaderName::Custom("x-tenant".into());
        let ok = event(&[(own.clone(), "3"), (custom.clone(), "acme")], "k");
        assert!(message(&ok).is_ok());
        let map = headers(&ok).unwrap();
        assert_eq!(map.get("walbox.index").map(|v| v.as_str()), Some("3"));
        assert_eq!(map.get("x-tenant").map(|v| v.as_str()), Some("acme"));
        assert_eq!(map.get(KEY_HEADER).map(|v| v.as_str()), Some("k"));
        for (bad, names) in [
            (
                event(&[(outbox::HeaderName::Custom("a:b".into()), "v")], "k"),
                "header name \"a:b\"",
            ),
            (
                event(&[(outbox::HeaderName::Static("bad name"), "v")], "k"),
                "header name \"bad name\"",
            ),
            (
                event(&[(custom.clone(), "two\nlines")], "k"),
                "header \"x-tenant\"",
            ),
            (event(&[(own, "3")], "line\r"), "header \"walbox.key\""),
        ] {
            let Err(why) = message(&bad) else {
                panic!("{names}: carried");
            };
            assert!(why.starts_with(names), "{why}");
        }
    }
}
