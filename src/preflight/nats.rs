//! The NATS JetStream checks of `walbox check`: the servers answer and accept the credentials,
//! JetStream is enabled for the account, the progress bucket can be opened (or created) and
//! written and read back, and for each subject the configuration names outright (templates
//! without variables, dead-letter subjects) a stream captures it, its duplicate window is
//! reported (a warning under JetStream's 2-minute default), and walbox may publish to it.
//!
//! The publish probe stores nothing: it carries `Nats-Expected-Stream` naming a stream that
//! does not exist, which JetStream refuses (after the server's permission check, which would
//! answer with a permissions violation instead). Subjects rendered from row values are known
//! only when their first event comes: a subject no stream captures is then refused as the
//! record's fault.

use std::time::Duration;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, ErrorCode};
use bytes::Bytes;

use crate::config::{Config, NatsConfig};
use crate::outbox::OutboxMapper;
use crate::preflight::Check;
use crate::sink::nats::{open, progress_bucket, DEFAULT_DUPLICATE_WINDOW};

const SERVERS: &str = "nats servers";
const JETSTREAM: &str = "nats jetstream";
const BUCKET: &str = "nats progress bucket";

/// The stream the publish probe expects: none has this name (stream names may not hold '.').
const NO_SUCH_STREAM: &str = "walbox.check.no.such.stream";

/// Every NATS check, in order (none when the broker is not NATS).
pub async fn checks(config: &Config) -> Vec<Check> {
    let crate::config::BrokerConfig::Nats(nats) = &config.broker else {
        return Vec::new();
    };
    let subjects = OutboxMapper::new(&config.outbox).known_topics();
    let mut out = Vec::new();
    let conn = match open(nats, None).await {
        Ok(conn) => conn,
        Err(e) => {
            out.push(Check::fail(
                SERVERS,
                e.message,
                "check nats.url, the credentials and TLS settings, and that the servers run",
            ));
            for name in [JETSTREAM, BUCKET] {
                out.push(Check::skipped(name, SERVERS));
            }
            return out;
        }
    };
    out.push(Check::ok(
        SERVERS,
        format!("connected to {}", conn.client.server_info().server_name),
    ));
    // Asked raw: the client cannot parse the account info of servers before 2.10.
    let account = match conn.client.request("$JS.API.INFO", Bytes::new()).await {
        Ok(reply) => match serde_json::from_slice::<serde_json::Value>(&reply.payload) {
            Ok(v) => match v.get("error") {
                Some(e) => Err(e
                    .get("description")
                    .map_or(e.to_string(), |d| d.to_string())),
                None => Ok(()),
            },
            Err(e) => Err(format!("unreadable reply: {e}")),
        },
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = account {
        out.push(Check::fail(
            JETSTREAM,
            format!("JetStream does not answer for this account: {e}"),
            "enable JetStream (nats-server -js, or jetstream {} in the server configuration) and for the account",
        ));
        out.push(Check::skipped(BUCKET, JETSTREAM));
        return out;
    }
    out.push(Check::ok(JETSTREAM, "enabled for the account"));
    out.push(bucket_check(&conn.js, nats).await);
    for subject in subjects {
        out.push(subject_check(&conn.js, &subject, nats.ack_timeout).await);
    }
    out
}

async fn bucket_check(js: &jetstream::Context, nats: &NatsConfig) -> Check {
    let bucket = &nats.progress_bucket;
    let store = match progress_bucket(js, nats).await {
        Ok(store) => store,
        Err(e) => {
            return Check::fail(
                BUCKET,
                e.message,
                format!("create the bucket (nats kv add {bucket} --history 1 --storage file), or let walbox's user manage streams named KV_{bucket}"),
            )
        }
    };
    let key = format!("walbox-check/{}", std::process::id());
    let written = store.put(&key, Bytes::from_static(b"{}")).await;
    let read = match written {
        Ok(_) => store.get(key.clone()).await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let _ = store.purge(&key).await;
    match read {
        Ok(Some(_)) => Check::ok(BUCKET, format!("{bucket:?} written and read back")),
        Ok(None) => Check::fail(
            BUCKET,
            format!("{bucket:?} lost the record just written"),
            "check the bucket's configuration (nats kv info)",
        ),
        Err(e) => Check::fail(
            BUCKET,
            format!("cannot write and read {bucket:?}: {e}"),
            format!(
                "grant walbox's user publish on $KV.{bucket}.> and the JetStream API ($JS.API.>)"
            ),
        ),
    }
}

async fn subject_check(js: &jetstream::Context, subject: &str, timeout: Duration) -> Check {
    let name = format!("subject {subject}");
    let stream = match js.stream_by_subject(subject).await {
        Ok(stream) => stream,
        Err(e) => {
            return Check::fail(
                name,
                format!("no stream captures it ({e})"),
                format!(
                "add {subject} to a stream's subjects (nats stream edit <stream> --subjects ...)"
            ),
            )
        }
    };
    let window = match js.get_stream(&stream).await {
        Ok(s) => s.cached_info().config.duplicate_window,
        Err(e) => {
            return Check::fail(
                name,
                format!("stream {stream:?} captures it but cannot be read: {e}"),
                "grant walbox's user the JetStream API ($JS.API.STREAM.INFO.>)",
            )
        }
    };
    let probe = PublishMessage::build()
        .payload(Bytes::new())
        .header(async_nats::header::NATS_EXPECTED_STREAM, NO_SUCH_STREAM);
    let permitted = match js.send_publish(subject.to_owned(), probe).await {
        Ok(ack) => {
            match tokio::time::timeout(timeout, std::future::IntoFuture::into_future(ack)).await {
                Ok(Err(e)) if e.kind() == PublishErrorKind::Other => {
                    // JetStream's own refusal of the probe: the server let it through.
                    let jetstream = std::error::Error::source(&e)
                        .and_then(|s| s.downcast_ref::<jetstream::Error>())
                        .map(|j| j.error_code());
                    jetstream.map_or(Err(e.to_string()), |c| {
                        if c == ErrorCode::STREAM_NOT_MATCH {
                            Ok(())
                        } else {
                            Err(e.to_string())
                        }
                    })
                }
                Ok(Ok(_)) => {
                    Err("the probe was stored (JetStream ignored Nats-Expected-Stream)".into())
                }
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("no answer to the publish probe (a permissions violation?)".into()),
            }
        }
        Err(e) => Err(e.to_string()),
    };
    match permitted {
        Err(why) => Check::fail(
            name,
            format!("stream {stream:?} captures it, but the publish probe failed: {why}"),
            format!("grant walbox's user publish permission on {subject} and subscribe on _INBOX.>"),
        ),
        Ok(()) if window < DEFAULT_DUPLICATE_WINDOW => Check::warn(
            name,
            format!("stream {stream:?}, duplicate window {window:?}: a re-sent event older than that is stored twice"),
            format!("nats stream edit {stream} --dupe-window 2m (or longer than walbox's longest outage)"),
        ),
        Ok(()) => Check::ok(name, format!("stream {stream:?}, duplicate window {window:?}, publish permitted")),
    }
}
