//! The NATS JetStream publisher (`async-nats`): one PubAck per record, classified errors, and
//! progress records in a JetStream key-value bucket.
//!
//! A record is published to the subject `event.topic` (the route's topic template rendered),
//! through JetStream, with header `Nats-Msg-Id` = the event id, every walbox header as a NATS
//! header (a null header has an empty value), the key as header [`KEY_HEADER`], and the value
//! as payload (empty for a tombstone). Its [`Ack`] is `Ok` once the PubAck came back: the stream
//! capturing the subject stored it (a file-storage stream has written it to its store and
//! syncs it per JetStream's `sync_interval`, 2 minutes by default, so the record survives a
//! crash of the server process, and survives a power loss of the host once synced or replicated
//! to a quorum of an R3 stream). A PubAck saying `duplicate` is `Ok` too: the stream already
//! holds that event id.
//!
//! # Ordering under pipelining
//! At most one publish per subject waits for its PubAck; the later records of that subject
//! wait in a FIFO of their own, and records of other subjects are in flight meanwhile. Had
//! record k+1 been sent behind k, a failure of k (503 "no responders" while JetStream starts
//! up after a restart, a timeout) could leave k+1 stored and k re-sent after it. Instead a
//! failure of k fails k and every record queued or in flight after it (every subject, class
//! [`Class::Transient`], or k's fatal class), and the publisher fails every record handed to it
//! from then until the relay has taken those acks (the session is over: [`AckQueue::is_empty`]);
//! PostgreSQL re-sends them, in order, in the relay's next session. Only a record refused for
//! its own sake ([`Class::Rejected`]) lets the next record of its subject go.
//!
//! # Duplicates
//! A record failed as unknown (a timeout, a lost connection) may have been stored: its re-send
//! carries the same `Nats-Msg-Id` and the stream drops it when it comes within the stream's
//! `duplicate_window` (2 minutes by default) of the first. A crash and restart of walbox within
//! that window therefore gives no duplicate; past it, the re-sent record is stored twice.
//! [`NatsSink::unconfirmed_span`] is the age of the oldest record without its PubAck; the
//! window of each stream is logged the first time one of its subjects is published, with a
//! warning when it is shorter than 2 minutes.
//!
//! # Classification
//! - No stream captures the subject (503 no responders, and JetStream says no stream's
//!   subjects match): [`Class::Rejected`], the record's route names a subject nothing stores.
//!   503 while a stream does match (JetStream starting): transient.
//! - Larger than the server's `max_payload` or the stream's `max_msg_size`: rejected.
//! - Publish permission denied: fatal ([`Failure::Kafka`], "the publisher cannot continue").
//! - Stream full with `discard: new` ("maximum messages/bytes exceeded"), or JetStream out of
//!   resources: fatal ([`Failure::Kafka`]): every later record of the stream would be refused
//!   too, retrying cannot heal it, and a record dead-lettered past it would let the relay
//!   confirm past records the stream never stored. An operator raises the limits and restarts.
//! - Authorization refused (on connect, or on a reconnect): fatal ([`Failure::Auth`]).
//! - Timeouts, lost connections: transient.
//!
//! # Progress records
//! In the key-value bucket `nats.progress_bucket` (created with history 1 and file storage when
//! missing), under the key given (characters outside `[-/_=.a-zA-Z0-9]` replaced by `_`): the
//! newest value wins, which is what a bucket keeps, without a stream walbox must size.

mod classify;
mod task;

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use async_nats::{ConnectErrorKind, ConnectOptions, HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use tokio::sync::mpsc;

use super::ack::{AckQueue, BrokerError, FailedRecord};
use super::silence::Silences;
use super::{Publisher, SinkError};
use crate::config::{BrokerKind, NatsAuth, NatsConfig};
use crate::failure::{Class, Failure};
use crate::outbox::{OutboxEvent, COMMIT_LSN_HEADER, INDEX_HEADER, KEY_HEADER};

pub use classify::sanitize_key;
use task::{Job, Publishing};

/// How many records may wait for the publishing task (the relay's in-flight cap is lower).
const QUEUE: usize = 1 << 16;

/// JetStream's default duplicate window: a shorter one is warned about.
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// A NATS JetStream error of `class` saying `message`.
pub fn error(class: Class, message: impl Into<String>) -> BrokerError {
    BrokerError::new(BrokerKind::Nats, class, message)
}

/// What the handles and the publishing task share.
pub(crate) struct Shared {
    /// Records accepted and not yet acked: accept time by ticket.
    pending: Mutex<Pending>,
    /// Signalled when `pending` empties.
    idle: Condvar,
    silences: Silences,
}

#[derive(Default)]
struct Pending {
    next_ticket: u64,
    since: BTreeMap<u64, Instant>,
}

impl Shared {
    fn accept(&self) -> u64 {
        let mut p = lock(&self.pending);
        let ticket = p.next_ticket;
        p.next_ticket += 1;
        p.since.insert(ticket, Instant::now());
        drop(p);
        self.silences.waiting();
        ticket
    }

    fn withdraw(&self, ticket: u64) {
        lock(&self.pending).since.remove(&ticket);
        self.silences.withdrawn();
        self.idle.notify_all();
    }

    /// The record of `ticket` has its ack (pushed just before).
    pub(crate) fn done(&self, ticket: u64) {
        let mut p = lock(&self.pending);
        p.since.remove(&ticket);
        let empty = p.since.is_empty();
        drop(p);
        self.silences.answered();
        if empty {
            self.idle.notify_all();
        }
    }

    fn in_flight(&self) -> usize {
        lock(&self.pending).since.len()
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// The NATS JetStream publisher of one relay; see the [module docs](self). Clones share it.
#[derive(Clone)]
pub struct NatsSink {
    tx: mpsc::Sender<Job>,
    shared: Arc<Shared>,
}

/// A connected client and its JetStream context.
pub(crate) struct Connection {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    /// Permission violations the server reported (their text), newest last.
    pub violations: Arc<Mutex<Vec<String>>>,
}

/// Connects to `config`'s servers; a refusal of the credentials is fatal ([`Failure::Auth`]),
/// and once connected, a refusal on a reconnect is reported through `acks` (when given).
pub(crate) async fn open(
    config: &NatsConfig,
    acks: Option<Arc<AckQueue>>,
) -> Result<Connection, BrokerError> {
    let mut options =
        match &config.auth {
            NatsAuth::Credentials(path) => ConnectOptions::with_credentials_file(path)
                .await
                .map_err(|e| {
                    error(
                        Class::Fatal(Failure::Config),
                        format!("cannot read nats.credentials_file {}: {e}", path.display()),
                    )
                })?,
            NatsAuth::UserPassword { user, password } => {
                ConnectOptions::new().user_and_password(user.clone(), password.expose().to_owned())
            }
            NatsAuth::Token(token) => ConnectOptions::new().token(token.expose().to_owned()),
            NatsAuth::None => ConnectOptions::new(),
        };
    if let Some(tls) = &config.tls {
        options = options.require_tls(true);
        if let Some(ca) = &tls.ca_file {
            options = options.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &tls.client {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
    }
    let violations = Arc::new(Mutex::new(Vec::new()));
    let seen = violations.clone();
    let who = who(config);
    options = options
        .name("walbox")
        .connection_timeout(config.ack_timeout)
        .request_timeout(Some(config.ack_timeout))
        .event_callback(move |event| {
            let (acks, seen, who) = (acks.clone(), seen.clone(), who.clone());
            async move {
                match event {
                    async_nats::Event::ServerError(async_nats::ServerError::AuthorizationViolation) => {
                        if let Some(acks) = &acks {
                            acks.fail(
                                error(
                                    Class::Fatal(Failure::Auth),
                                    format!("the server refused the credentials of {who} (authorization violation): check nats.user and nats.password_file, nats.token_file or nats.credentials_file"),
                                )
                                .into(),
                            );
                        }
                    }
                    async_nats::Event::ServerError(async_nats::ServerError::Other(text))
                        if text.to_ascii_lowercase().contains("permissions violation") =>
                    {
                        tracing::error!(broker = "nats", "{text}");
                        let mut seen = lock(&seen);
                        if seen.len() >= 64 {
                            seen.remove(0);
                        }
                        seen.push(text);
                    }
                    other => tracing::debug!(broker = "nats", event = %other, "nats client"),
                }
            }
        });
    let client = options
        .connect(config.servers.as_slice())
        .await
        .map_err(|e| {
            let (class, hint) = match e.kind() {
                ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => (
                    Class::Fatal(Failure::Auth),
                    "the server refused the credentials: check nats.user and nats.password_file, nats.token_file or nats.credentials_file",
                ),
                ConnectErrorKind::ServerParse => (Class::Fatal(Failure::Config), "check nats.url"),
                ConnectErrorKind::Tls => (
                    Class::Fatal(Failure::Config),
                    "check nats.tls_ca_file, nats.tls_cert_file and nats.tls_key_file, and that the server speaks TLS",
                ),
                _ => (Class::Transient, "is the server running and reachable?"),
            };
            error(class, format!("cannot connect as {}: {}: {hint}", who_of(config), e.kind()))
        })?;
    let js = jetstream::ContextBuilder::new()
        .timeout(config.ack_timeout)
        .max_ack_inflight(QUEUE)
        .backpressure_on_inflight(true)
        .build(client.clone());
    Ok(Connection {
        client,
        js,
        violations,
    })
}

/// Who walbox connects as, for messages.
fn who_of(config: &NatsConfig) -> String {
    match &config.auth {
        NatsAuth::UserPassword { user, .. } => format!("user {user:?}"),
        NatsAuth::Token(_) => "the token of nats.token_file".into(),
        NatsAuth::Credentials(path) => format!("the user of {}", path.display()),
        NatsAuth::None => "no user (no credentials configured)".into(),
    }
}

fn who(config: &NatsConfig) -> Arc<str> {
    who_of(config).into()
}

/// The progress bucket of `config`, created (history 1, file storage) when missing.
pub(crate) async fn progress_bucket(
    js: &jetstream::Context,
    config: &NatsConfig,
) -> Result<kv::Store, BrokerError> {
    let bucket = &config.progress_bucket;
    if let Ok(store) = js.get_key_value(bucket.as_str()).await {
        return Ok(store);
    }
    // The bucket's stream as `create_key_value` would make it; created directly because that
    // call first reads the account's JetStream info, whose reply from servers before 2.10 the
    // client cannot parse (it lacks `reserved_memory`).
    let created = js
        .create_stream(jetstream::stream::Config {
            name: format!("KV_{bucket}"),
            description: Some("walbox progress records (one per replication slot)".into()),
            subjects: vec![format!("$KV.{bucket}.>")],
            max_messages_per_subject: 1,
            storage: jetstream::stream::StorageType::File,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            num_replicas: 1,
            discard: jetstream::stream::DiscardPolicy::New,
            ..Default::default()
        })
        .await;
    let opened = match created {
        Ok(_) => js
            .get_key_value(bucket.as_str())
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    opened.map_err(|e| {
        error(
            classify::js_class(&e),
            format!(
                "cannot open or create the progress bucket {bucket:?} (nats.progress_bucket): {e}; is JetStream enabled (nats-server -js), and may {} create key-value buckets?",
                who_of(config)
            ),
        )
    })
}

/// Connects the publisher; its acks go to `acks`. Opens (or creates) the progress bucket.
pub async fn connect(config: &NatsConfig, acks: Arc<AckQueue>) -> Result<NatsSink, SinkError> {
    let conn = open(config, Some(acks.clone())).await?;
    let bucket = progress_bucket(&conn.js, config).await?;
    let shared = Arc::new(Shared {
        pending: Mutex::new(Pending::default()),
        idle: Condvar::new(),
        silences: Silences::default(),
    });
    let (tx, rx) = mpsc::channel(QUEUE);
    let publishing = Publishing::new(conn, bucket, config, acks, shared.clone());
    tokio::spawn(publishing.run(rx));
    Ok(NatsSink { tx, shared })
}

impl NatsSink {
    /// How long the oldest record handed over has waited for its PubAck (zero when none
    /// waits). The streams' `duplicate_window` must be longer than walbox's longest
    /// unconfirmed span for a re-send to be dropped as a duplicate.
    pub fn unconfirmed_span(&self) -> Duration {
        lock(&self.shared.pending)
            .since
            .values()
            .next()
            .map_or(Duration::ZERO, Instant::elapsed)
    }

    fn hand_over(&self, job: Job) -> Result<(), SinkError> {
        match self.tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(job)) => {
                self.shared.withdraw(job.ticket);
                Err(SinkError::QueueFull)
            }
            Err(mpsc::error::TrySendError::Closed(job)) => {
                self.shared.withdraw(job.ticket);
                Err(error(
                    Class::Transient,
                    "the publishing task has ended (the client was closed)",
                )
                .into())
            }
        }
    }
}

/// The NATS headers of `event`, or why it cannot be carried (the record's fault).
fn headers(event: &OutboxEvent) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    for (name, value) in &event.headers {
        let name = name.as_str();
        let header = HeaderName::try_from(name).map_err(|_| {
            format!("header name {name:?} is not a NATS header name (printable ASCII, no ':')")
        })?;
        let value = match value {
            None => HeaderValue::default(),
            Some(v) => text_value(name, v)?,
        };
        map.append(header, value);
    }
    if let Some(key) = &event.key {
        map.insert(KEY_HEADER, text_value(KEY_HEADER, key)?);
    }
    Ok(map)
}

fn text_value(name: &str, value: &[u8]) -> Result<HeaderValue, String> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| HeaderValue::try_from(v).ok())
        .ok_or_else(|| {
            format!(
                "header {name:?} is not UTF-8 text without line breaks, which NATS headers carry"
            )
        })
}

impl Publisher for NatsSink {
    fn broker(&self) -> BrokerKind {
        BrokerKind::Nats
    }

    fn send(&self, event: &OutboxEvent, seq: u64, route: usize) -> Result<(), SinkError> {
        let subject: &str = &event.topic;
        if let Err(why) = classify::check_subject(subject) {
            return Err(error(Class::Rejected, format!("subject {subject:?} {why}")).into());
        }
        let headers = headers(event).map_err(|why| error(Class::Rejected, why))?;
        let id = String::from_utf8_lossy(&event.id).into_owned();
        let header = |name: &str| {
            event
                .headers
                .iter()
                .find(|(n, _)| n.as_str() == name)
                .and_then(|(_, v)| v.as_ref())
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default()
        };
        let failed = FailedRecord {
            topic: subject.to_owned(),
            id: id.clone(),
            lsn: header(COMMIT_LSN_HEADER),
            index: header(INDEX_HEADER),
            key: event.key.clone(),
            payload: event.value.clone(),
        };
        let ticket = self.shared.accept();
        self.hand_over(Job {
            ticket,
            seq,
            route,
            subject: subject.to_owned(),
            msg_id: id,
            headers,
            payload: event.value.clone().unwrap_or_default(),
            failed: Some(failed),
        })
    }

    fn send_progress(&self, key: &str, value: &[u8]) -> Result<(), SinkError> {
        let ticket = self.shared.accept();
        self.hand_over(Job::progress(
            ticket,
            sanitize_key(key),
            Bytes::copy_from_slice(value),
        ))
    }

    fn in_flight(&self) -> usize {
        self.shared.in_flight()
    }

    fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut p = lock(&self.shared.pending);
        while !p.since.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            p = match self.shared.idle.wait_timeout(p, left) {
                Ok((g, _)) => g,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        true
    }

    fn silent_since(&self, from: Instant) -> Duration {
        self.shared.silences.since(from)
    }
}

/// The newest progress record of `key` in `config`'s bucket; `None` when the bucket holds none
/// for it, or when the bucket does not exist: walbox creates it before writing any record, so
/// a missing bucket means no slot was ever recorded there (nobody deletes it but an operator).
pub async fn read_progress(config: &NatsConfig, key: &str) -> Result<Option<Vec<u8>>, BrokerError> {
    let conn = open(config, None).await?;
    let bucket = &config.progress_bucket;
    let store = match conn.js.get_key_value(bucket.as_str()).await {
        Ok(store) => store,
        Err(e) => {
            // Only JetStream's own "stream not found" for the bucket's stream counts as absent.
            match conn.js.get_stream(format!("KV_{bucket}")).await {
                Err(g) if classify::is_stream_not_found(&g) => return Ok(None),
                _ => {
                    return Err(error(
                        Class::Transient,
                        format!("cannot open the progress bucket {bucket:?}: {e}"),
                    ))
                }
            }
        }
    };
    store
        .get(sanitize_key(key))
        .await
        .map(|v| v.map(|b| b.to_vec()))
        .map_err(|e| {
            error(
                Class::Transient,
                format!("cannot read progress record {key:?} from bucket {bucket:?}: {e}"),
            )
        })
}
