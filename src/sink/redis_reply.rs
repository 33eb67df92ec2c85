//! What Redis says, read for the Redis Streams publisher (`sink::redis`): the class of each
//! error reply and of each client error ([`classify_server`], [`classify_client`]), stream entry
//! ids ([`StreamId`]), and the `max-deleted-entry-id` of `XINFO STREAM`
//! ([`max_deleted_entry_id`]).
//!
//! Invariants: nothing here panics on a reply, whatever its shape; an unknown error reply is
//! fatal (walbox stops and says what Redis said) rather than retried forever; no message quotes
//! a password (Redis never echoes one; the connection URL is not quoted, only host and port).

use std::fmt;

use redis::{RedisError, Value};

use crate::config::BrokerKind;
use crate::failure::{Class, Failure};

use super::ack::{BrokerError, Refusal};

/// The error Redis gives an `XADD` whose explicit id is not above the stream's last.
pub const ID_NOT_ABOVE_TOP: &str = "equal or smaller than the target stream top item";

/// A stream entry id `<ms>-<seq>`; walbox's are `<commit LSN>-<index>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u64, pub u64);

impl StreamId {
    /// `<ms>-<seq>`, or `None` when `text` is not one.
    pub fn parse(text: &str) -> Option<StreamId> {
        let (ms, seq) = text.split_once('-')?;
        Some(StreamId(ms.parse().ok()?, seq.parse().ok()?))
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

/// A failure of the Redis broker.
pub fn broker_error(class: Class, message: impl Into<String>) -> BrokerError {
    BrokerError::new(BrokerKind::Redis, class, message)
}

/// Whether an error reply is the refusal of an id not above the stream's top: a re-sent entry,
/// or a gap (`sink::redis` tells which).
pub fn is_id_not_above_top(code: &str, detail: &str) -> bool {
    code == "ERR" && detail.contains(ID_NOT_ABOVE_TOP)
}

/// The class of an error reply `code` (`WRONGTYPE`, `OOM`, …) with `detail` to `command` on
/// `key`, and the message saying what to do.
pub fn classify_server(code: &str, detail: &str, command: &str, key: &str) -> BrokerError {
    let said = if detail.is_empty() {
        code.to_owned()
    } else {
        format!("{code} {detail}")
    };
    let refusal = match code {
        "NOPERM" => Some(Refusal::Permission),
        "OOM" => Some(Refusal::Memory),
        _ => None,
    };
    let (class, message) = match code {
        "WRONGPASS" | "NOAUTH" => (
            Class::Fatal(Failure::Auth),
            format!("redis refused the credentials ({code}): check redis.user and redis.password_file"),
        ),
        "NOPERM" => (
            Class::Fatal(Failure::Kafka),
            format!(
                "redis refused {command} on key {key:?} for walbox's user ({said}): grant it, e.g. ACL SETUSER <user> +{} ~{key}",
                command.to_ascii_lowercase()
            ),
        ),
        "WRONGTYPE" => (
            Class::Rejected,
            format!("redis refused {command} on key {key:?}: the key holds another type than a stream ({said}); route the event elsewhere or remove the key"),
        ),
        "OOM" => (
            Class::Transient,
            format!("redis is out of memory and refuses writes ({said}): raise maxmemory, trim streams (redis.maxlen), or let consumers catch up"),
        ),
        "READONLY" => (
            Class::Fatal(Failure::Kafka),
            format!("redis.url names a read-only replica ({said}): point redis.url at the primary"),
        ),
        "LOADING" | "BUSY" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" => (
            Class::Transient,
            format!("redis is not ready ({said})"),
        ),
        "MOVED" | "ASK" | "CROSSSLOT" => (
            Class::Fatal(Failure::Kafka),
            format!("redis.url names a Redis Cluster node ({said}): walbox publishes to a standalone primary only"),
        ),
        "ERR" if detail.contains("must be greater than 0-0") => (
            Class::Rejected,
            format!("redis refused the entry id of an event at WAL position 0/0 on stream {key:?} ({said})"),
        ),
        _ => (
            Class::Fatal(Failure::Kafka),
            format!("redis refused {command} on key {key:?}: {said}"),
        ),
    };
    let error = broker_error(class, message);
    match refusal {
        Some(refusal) => error.refusing(refusal),
        None => error,
    }
}

/// The class of a client error (connection, timeout, protocol, or an error reply the client
/// returned as an error), `at` naming the server (`host:port`) for messages.
pub fn classify_client(e: &RedisError, at: &str, command: &str, key: &str) -> BrokerError {
    use redis::ErrorKind;
    if let Some(code) = e.code() {
        return classify_server(code, e.detail().unwrap_or(""), command, key);
    }
    match e.kind() {
        ErrorKind::AuthenticationFailed => broker_error(
            Class::Fatal(Failure::Auth),
            format!(
                "redis at {at} refused the credentials: check redis.user and redis.password_file"
            ),
        ),
        _ if tls_failure(e).is_some() => broker_error(
            Class::Fatal(Failure::Auth),
            format!(
                "the TLS handshake with redis at {at} failed ({}): check redis.tls_ca_file (the CA that signed the server's certificate), that the url's host is a name the certificate covers, and that the port speaks TLS (rediss://)",
                tls_failure(e).unwrap_or_default()
            ),
        ),
        ErrorKind::InvalidClientConfig => broker_error(
            Class::Fatal(Failure::Config),
            format!("redis client configuration refused: {e}"),
        ),
        _ if e.is_timeout() => broker_error(
            Class::Transient,
            format!("redis at {at} did not answer within redis.timeout: {e}"),
        ),
        _ => broker_error(Class::Transient, format!("redis at {at}: {e}")),
    }
}

/// rustls's reason, when `e` is a failed TLS handshake (the server's certificate not signed by
/// `redis.tls_ca_file`'s CA or the system's roots, a name it does not cover, a port without
/// TLS). The client reports it as an I/O error, which it would retry; but a reconnect meets
/// the same certificate, so it is exit 4, as PostgreSQL's untrusted certificate.
fn tls_failure(e: &RedisError) -> Option<String> {
    use std::error::Error;
    use std::sync::Arc;
    let source = e.source()?;
    // The client keeps the I/O error behind an `Arc`, whose `source` skips it.
    let io = source
        .downcast_ref::<Arc<dyn Error + Send + Sync>>()
        .and_then(|arc| arc.downcast_ref::<std::io::Error>())
        .or_else(|| source.downcast_ref::<std::io::Error>())?;
    io.get_ref()?
        .downcast_ref::<rustls::Error>()
        .map(ToString::to_string)
}

/// The text of a bulk or simple string reply.
pub fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// The `max-deleted-entry-id` of an `XINFO STREAM` reply (RESP2 array of names and values, or
/// RESP3 map): the highest id `XDEL` removed (trimming does not raise it); `None` when the
/// reply has none (Redis before 7.0) or is not one.
pub fn max_deleted_entry_id(reply: &Value) -> Option<StreamId> {
    info_id(reply, "max-deleted-entry-id")
}

/// The `recorded-first-entry-id` of an `XINFO STREAM` reply: the stream's first entry, which
/// trimming (`MAXLEN`, `XTRIM`) moves up; `None` as for [`max_deleted_entry_id`].
pub fn recorded_first_entry_id(reply: &Value) -> Option<StreamId> {
    info_id(reply, "recorded-first-entry-id")
}

/// Whether entries left the stream (`entries-added` above `length`: trimmed or deleted), from
/// an `XINFO STREAM` reply; `false` when it does not say.
pub fn entries_removed(reply: &Value) -> bool {
    let int = |field| match info_field(reply, field) {
        Some(Value::Int(n)) => Some(*n),
        _ => None,
    };
    matches!((int("entries-added"), int("length")), (Some(added), Some(len)) if added > len)
}

/// The id under `field` of an `XINFO STREAM` reply.
fn info_id(reply: &Value, field: &str) -> Option<StreamId> {
    StreamId::parse(&text(info_field(reply, field)?)?)
}

/// The value under `field` of an `XINFO STREAM` reply.
fn info_field<'a>(reply: &'a Value, field: &str) -> Option<&'a Value> {
    let pairs: Vec<(&Value, &Value)> = match reply {
        Value::Array(items) => items.chunks_exact(2).map(|p| (&p[0], &p[1])).collect(),
        Value::Map(items) => items.iter().map(|(k, v)| (k, v)).collect(),
        _ => return None,
    };
    pairs
        .into_iter()
        .find(|(name, _)| text(name).as_deref() == Some(field))
        .map(|(_, value)| value)
}

/// Whether an `XRANGE` reply holds an entry.
pub fn has_entry(reply: &Value) -> bool {
    matches!(reply, Value::Array(items) if !items.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn ids_parse_print_and_order() {
        assert_eq!(StreamId::parse("23-4"), Some(StreamId(23, 4)));
        assert_eq!(StreamId(23, 4).to_string(), "23-4");
        for bad in ["", "1", "a-1", "1-", "-1", "1-2-3"] {
            assert_eq!(StreamId::parse(bad), None, "{bad}");
        }
        assert!(StreamId(2, 0) > StreamId(1, 9));
    }

    #[test]
    fn error_replies_are_classified() {
        let class = |code: &str, detail: &str| classify_server(code, detail, "XADD", "s").class;
        assert_eq!(class("WRONGPASS", "x"), Class::Fatal(Failure::Auth));
        assert_eq!(class("NOAUTH", "x"), Class::Fatal(Failure::Auth));
        assert_eq!(class("NOPERM", "x"), Class::Fatal(Failure::Kafka));
        assert_eq!(class("WRONGTYPE", "x"), Class::Rejected);
        assert_eq!(class("OOM", "command not allowed"), Class::Transient);
        assert_eq!(class("READONLY", "x"), Class::Fatal(Failure::Kafka));
        assert_eq!(class("LOADING", "x"), Class::Transient);
        assert_eq!(class("ERR", "something new"), Class::Fatal(Failure::Kafka));
        let m = classify_server("READONLY", "You can't write", "XADD", "s").message;
        assert!(m.contains("point redis.url at the primary"), "{m}");
        let m = classify_server("OOM", "command not allowed", "XADD", "s").message;
        assert!(m.contains("maxmemory"), "{m}");
        let refusal = |code: &str| classify_server(code, "x", "SET", "p").refusal;
        assert_eq!(refusal("OOM"), Some(Refusal::Memory));
        assert_eq!(refusal("NOPERM"), Some(Refusal::Permission));
        assert_eq!(refusal("READONLY"), None);
        let m = classify_server("NOPERM", "no permissions", "XADD", "orders").message;
        assert!(m.contains("XADD") && m.contains("\"orders\""), "{m}");
        assert!(is_id_not_above_top(
            "ERR",
            "The ID specified in XADD is equal or smaller than the target stream top item"
        ));
    }

    #[test]
    fn an_untrusted_certificate_exits_4_and_an_unreachable_server_is_retried() {
        let refused = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let e = classify_client(&refused.into(), "localhost:6380", "connect", "");
        assert_eq!(e.class, Class::Fatal(Failure::Auth), "{}", e.message);
        assert!(
            e.message.contains("redis.tls_ca_file") && e.message.contains("UnknownIssuer"),
            "{}",
            e.message
        );
        for kind in [
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::ConnectionReset,
        ] {
            let down = RedisError::from(std::io::Error::from(kind));
            let e = classify_client(&down, "localhost:6380", "connect", "");
            assert_eq!(e.class, Class::Transient, "{}", e.message);
        }
    }

    #[test]
    fn xinfo_stream_gives_the_max_deleted_entry_id() {
        let resp2 = Value::Array(vec![
            bulk("length"),
            Value::Int(3),
            bulk("max-deleted-entry-id"),
            bulk("17-2"),
        ]);
        assert_eq!(max_deleted_entry_id(&resp2), Some(StreamId(17, 2)));
        assert_eq!(recorded_first_entry_id(&resp2), None);
        assert!(!entries_removed(&resp2));
        let trimmed = Value::Array(vec![
            bulk("length"),
            Value::Int(3),
            bulk("entries-added"),
            Value::Int(5),
        ]);
        assert!(entries_removed(&trimmed));
        let resp3 = Value::Map(vec![(bulk("max-deleted-entry-id"), bulk("0-0"))]);
        assert_eq!(max_deleted_entry_id(&resp3), Some(StreamId(0, 0)));
        assert_eq!(max_deleted_entry_id(&Value::Nil), None);
        assert_eq!(max_deleted_entry_id(&Value::Array(vec![bulk("x")])), None);
        assert!(has_entry(&Value::Array(vec![Value::Nil])));
        assert!(!has_entry(&Value::Array(vec![])));
    }
}
