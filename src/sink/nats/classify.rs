//! What a NATS JetStream reply means for walbox: the record's fault, transient, or fatal (the
//! rules are in the parent module's docs). The one place that reads the client's errors.

use std::error::Error as _;
use std::sync::{Arc, Mutex};

use async_nats::jetstream::context::{
    GetStreamByNameErrorKind, GetStreamError, GetStreamErrorKind, PublishError, PublishErrorKind,
};
use async_nats::jetstream::{self, ErrorCode};

use super::shared::{error, lock};
use crate::failure::{Class, Failure};
use crate::sink::{BrokerError, Refusal};

/// JetStream's "maximum messages exceeded" / "maximum bytes exceeded" (a stream full with
/// `discard: new`) and "insufficient resources".
const STREAM_FULL: [ErrorCode; 3] = [
    ErrorCode::STREAM_STORE_FAILED,
    ErrorCode::STREAM_MAX_STREAM_BYTES_EXCEEDED,
    ErrorCode::INSUFFICIENT_RESOURCES,
];

/// `key` as a key-value key (`[-/_=.a-zA-Z0-9]`, no leading or trailing `.`), one to one:
/// every other byte, `=` itself, and a leading or trailing `.` become `=` and two hex digits
/// (`my db` → `my=20db`), so two slots never share a key. An empty key is `=`.
pub fn sanitize_key(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = String::with_capacity(key.len());
    for (i, &b) in bytes.iter().enumerate() {
        let edge_dot = b == b'.' && (i == 0 || i + 1 == bytes.len());
        if (b.is_ascii_alphanumeric() || matches!(b, b'-' | b'/' | b'_' | b'.')) && !edge_dot {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("={b:02X}"));
        }
    }
    if out.is_empty() {
        out.push('=');
    }
    out
}

/// Why `subject` cannot be published to (the record's fault), if it cannot.
pub(crate) fn check_subject(subject: &str) -> Result<(), &'static str> {
    if subject.is_empty() {
        return Err("is empty");
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("holds whitespace, which NATS subjects may not");
    }
    if subject.split('.').any(str::is_empty) {
        return Err("has an empty token (a leading, trailing or double '.')");
    }
    if subject.split('.').any(|t| t == "*" || t == ">") {
        return Err("holds a wildcard token ('*' or '>'), which a message cannot be published to");
    }
    Ok(())
}

/// Whether `e` is JetStream's "stream not found".
pub(crate) fn is_stream_not_found(e: &GetStreamError) -> bool {
    matches!(e.kind(), GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

/// What a refused or unanswered publish to `subject` means.
pub(crate) struct Judge {
    pub js: jetstream::Context,
    /// Permission violations the server reported.
    pub violations: Arc<Mutex<Vec<String>>>,
    /// Who walbox is connected as.
    pub who: Arc<str>,
    /// `nats.ack_timeout`, for messages.
    pub ack_timeout: std::time::Duration,
}

impl Judge {
    /// The permission violation the server reported about `subject` (or about walbox's reply
    /// inboxes, which every PubAck needs), if any.
    fn violation(&self, subject: &str) -> Option<String> {
        let quoted = format!("\"{subject}\"");
        lock(&self.violations)
            .iter()
            .rev()
            .find(|v| v.contains(&quoted) || v.contains("_INBOX"))
            .cloned()
    }

    /// The broker-neutral error of `e`, a publish to `subject`.
    pub(crate) async fn publish_error(&self, subject: &str, e: PublishError) -> BrokerError {
        let jetstream = e
            .source()
            .and_then(|s| s.downcast_ref::<jetstream::Error>())
            .cloned();
        match e.kind() {
            PublishErrorKind::StreamNotFound => self.no_responders(subject).await,
            PublishErrorKind::MaxPayloadExceeded => error(
                Class::Rejected,
                format!("the record for subject {subject:?} is larger than the server's max_payload ({e}): raise max_payload in the server's configuration, or make the event smaller"),
            ),
            PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => {
                if let Some(v) = self.violation(subject) {
                    return self.denied(subject, &v);
                }
                let what = if e.kind() == PublishErrorKind::TimedOut {
                    format!("no PubAck within nats.ack_timeout ({:?})", self.ack_timeout)
                } else {
                    "the connection was lost before the PubAck".to_owned()
                };
                error(
                    Class::Transient,
                    format!("publishing to {subject:?}: {what}; the outcome is unknown, the record is sent again (the stream's duplicate window drops it if it was stored)"),
                )
            }
            _ => match jetstream {
                Some(j) if j.error_code() == ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM => error(
                    Class::Rejected,
                    format!("the stream capturing {subject:?} refused the record as larger than its max_msg_size ({j}): raise the stream's max_msg_size, or make the event smaller"),
                ),
                Some(j) if STREAM_FULL.contains(&j.error_code()) => {
                    let stream = match self.js.stream_by_subject(subject).await {
                        Ok(name) => format!("stream {name:?}"),
                        Err(_) => "the stream".to_owned(),
                    };
                    error(
                        Class::Fatal(Failure::Kafka),
                        format!("{stream}, capturing {subject:?}, refuses new records ({j}): it is full with discard policy \"new\", or JetStream is out of storage; raise the stream's max_msgs / max_bytes (e.g. `nats stream edit <stream> --max-msgs`), or free storage, and restart walbox"),
                    )
                }
                Some(j) => error(
                    Class::Transient,
                    format!("JetStream refused the record for {subject:?}: {j}"),
                ),
                None => {
                    let text = e.to_string();
                    if text.to_ascii_lowercase().contains("permissions violation") {
                        return self.denied(subject, &text);
                    }
                    error(Class::Transient, format!("publishing to {subject:?}: {text}"))
                }
            },
        }
    }

    fn denied(&self, subject: &str, violation: &str) -> BrokerError {
        error(
            Class::Fatal(Failure::Kafka),
            format!(
                "{} may not publish to {subject:?} (the server said: {violation}): grant it publish permission on the subject (and subscribe permission on _INBOX.>, for the PubAcks)",
                self.who
            ),
        )
        .refusing(Refusal::Permission)
    }

    /// 503 no responders: no stream captures `subject` (the record's route names a subject
    /// nothing stores), or JetStream is not answering (transient).
    async fn no_responders(&self, subject: &str) -> BrokerError {
        match self.js.stream_by_subject(subject).await {
            Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => error(
                Class::Rejected,
                format!("no JetStream stream captures subject {subject:?}: add the subject to a stream's subjects (e.g. `nats stream edit <stream> --subjects ...`), or change the route's topic"),
            ),
            Ok(stream) => error(
                Class::Transient,
                format!("stream {stream:?} did not answer the publish to {subject:?} (503 no responders): JetStream is starting up or the stream's leader is unavailable"),
            ),
            Err(e) => error(
                Class::Transient,
                format!("JetStream did not answer the publish to {subject:?} (503 no responders), nor the stream lookup ({e}): is JetStream enabled and up?"),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_made_valid() {
        assert_eq!(sanitize_key("7312/app/walbox"), "7312/app/walbox");
        assert_eq!(sanitize_key("a b:c"), "a=20b=3Ac");
        assert_eq!(sanitize_key(".x."), "=2Ex=2E");
        assert_eq!(sanitize_key("a=b"), "a=3Db");
        assert_eq!(sanitize_key(""), "=");
        assert_eq!(sanitize_key("é"), "=C3=A9");
        assert_ne!(sanitize_key("my db"), sanitize_key("my_db"));
    }

    #[test]
    fn subjects_are_checked() {
        assert!(check_subject("outbox.order.42").is_ok());
        for bad in ["", "a b", "a..b", ".a", "a.", "a.*", "a.>"] {
            assert!(check_subject(bad).is_err(), "{bad:?}");
        }
    }
}
