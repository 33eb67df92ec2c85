//! What the NATS publisher's handle, its publishing task and `walbox check` share: the
//! connection ([`open`]), the progress bucket, the records waiting for their acks ([`Shared`]),
//! and the error constructor. A leaf of `sink::nats`: it imports none of its siblings.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use async_nats::{ConnectErrorKind, ConnectOptions};

use crate::config::{BrokerKind, NatsAuth, NatsConfig};
use crate::failure::{Class, Failure};
use crate::sink::ack::{AckQueue, BrokerError};
use crate::sink::silence::Silences;

/// How many records may wait for the publishing task (the relay's in-flight cap is lower).
pub(crate) const QUEUE: usize = 1 << 16;

/// Records the sink holds at most (accepted and not yet acknowledged): the relay stops reading
/// at this many (`Publisher::max_held`) when `relay.max_in_flight` is higher. Each holds its
/// message (payload and NATS header map, built when handed over) until it is published, and
/// what identifies its event until its PubAck: on a 150,000-event drain (`benches/brokers.rs`), 4,000 held gave the rate of 10,000 with
/// 10 MiB less peak RSS (34 against 44 MiB).
pub(crate) const HELD: usize = 4_000;

/// JetStream's default duplicate window: a shorter one is warned about.
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// A NATS JetStream error of `class` saying `message`.
pub fn error(class: Class, message: impl Into<String>) -> BrokerError {
    BrokerError::new(BrokerKind::Nats, class, message)
}

/// What the handles and the publishing task share.
pub(crate) struct Shared {
    /// Records accepted and not yet acked, with their accept times.
    pub(crate) pending: Mutex<Pending>,
    /// Signalled when `pending` empties.
    pub(crate) idle: Condvar,
    pub(crate) silences: Silences,
    /// PubAcks that said `duplicate`: events the stream already held when they were sent
    /// again (dropped by its duplicate window).
    pub(crate) duplicates: std::sync::atomic::AtomicU64,
}

/// The records accepted and not yet acked, by ticket (handed out in order): the accept time of
/// every ticket from the oldest one waiting on, `None` once acked. Accepting and acking are
/// O(1); the oldest waiting record is the front.
#[derive(Default)]
pub(crate) struct Pending {
    /// The ticket of `since[0]`.
    first: u64,
    since: VecDeque<Option<Instant>>,
    /// The entries of `since` that are `Some`.
    waiting: usize,
}

impl Pending {
    /// The accept time of the oldest record waiting for its ack.
    pub(crate) fn oldest(&self) -> Option<Instant> {
        self.since.front().copied().flatten()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.waiting == 0
    }

    fn accept(&mut self, now: Instant) -> u64 {
        let ticket = self.first + self.since.len() as u64;
        self.since.push_back(Some(now));
        self.waiting += 1;
        ticket
    }

    fn remove(&mut self, ticket: u64) {
        let slot = usize::try_from(ticket.wrapping_sub(self.first))
            .ok()
            .and_then(|i| self.since.get_mut(i));
        if slot.and_then(Option::take).is_some() {
            self.waiting -= 1;
        }
        while let Some(None) = self.since.front() {
            self.since.pop_front();
            self.first += 1;
        }
    }
}

impl Shared {
    pub(crate) fn accept(&self) -> u64 {
        let ticket = lock(&self.pending).accept(Instant::now());
        self.silences.waiting();
        ticket
    }

    pub(crate) fn withdraw(&self, ticket: u64) {
        lock(&self.pending).remove(ticket);
        self.silences.withdrawn();
        self.idle.notify_all();
    }

    /// The record of `ticket` has its ack (pushed just before).
    pub(crate) fn done(&self, ticket: u64) {
        let mut p = lock(&self.pending);
        p.remove(ticket);
        let empty = p.is_empty();
        drop(p);
        self.silences.answered();
        if empty {
            self.idle.notify_all();
        }
    }

    pub(crate) fn in_flight(&self) -> usize {
        lock(&self.pending).waiting
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
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
        .map_err(|e| connect_error(&e, config))?;
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

/// The class and message of a failed connect: refused credentials are exit 4, and so is a
/// failed TLS handshake (see below); settings the client cannot use are exit 3; the rest
/// (an unreachable server) transient.
fn connect_error(e: &async_nats::ConnectError, config: &NatsConfig) -> BrokerError {
    let (class, hint) = match e.kind() {
        ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => (
            Class::Fatal(Failure::Auth),
            "the server refused the credentials: check nats.user and nats.password_file, nats.token_file or nats.credentials_file",
        ),
        ConnectErrorKind::ServerParse => (Class::Fatal(Failure::Config), "check nats.url"),
        // A failed handshake (a certificate the CA did not sign, a name it does not
        // cover), which the client reports as an I/O error, is exit 4 as PostgreSQL's
        // untrusted certificate: a reconnect meets the same certificate and would retry
        // forever.
        _ if tls_failure(e).is_some() => {
            let why = tls_failure(e).unwrap_or_default();
            return error(
                Class::Fatal(Failure::Auth),
                format!("cannot connect as {}: the TLS handshake failed ({why}): {TLS_HINT}", who_of(config)),
            );
        }
        ConnectErrorKind::Tls => (Class::Fatal(Failure::Config), TLS_HINT),
        _ => (Class::Transient, "is the server running and reachable?"),
    };
    error(
        class,
        format!("cannot connect as {}: {}: {hint}", who_of(config), e.kind()),
    )
}

/// What to check when the TLS handshake fails.
const TLS_HINT: &str = "check nats.tls_ca_file (the CA that signed the server's certificate), that the url's host is a name the certificate covers, nats.tls_cert_file and nats.tls_key_file, and that the server speaks TLS";

/// rustls's reason, when `e` is a failed TLS handshake.
fn tls_failure(e: &async_nats::ConnectError) -> Option<String> {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(tls) = cause.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        if let Some(inner) = cause
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
                return Some(tls.to_string());
            }
        }
        source = cause.source();
    }
    None
}

/// Who walbox connects as, for messages.
pub(crate) fn who_of(config: &NatsConfig) -> String {
    match &config.auth {
        NatsAuth::UserPassword { user, .. } => format!("user {user:?}"),
        NatsAuth::Token(_) => "the token of nats.token_file".into(),
        NatsAuth::Credentials(path) => format!("the user of {}", path.display()),
        NatsAuth::None => "no user (no credentials configured)".into(),
    }
}

pub(crate) fn who(config: &NatsConfig) -> Arc<str> {
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
            js_class(&e),
            format!(
                "cannot open or create the progress bucket {bucket:?} (nats.progress_bucket): {e}; is JetStream enabled (nats-server -js), and may {} create key-value buckets?",
                who_of(config)
            ),
        )
    })
}

/// The class of a failed JetStream API call described by `text`.
pub(crate) fn js_class(text: &str) -> Class {
    if text.to_ascii_lowercase().contains("permission") {
        Class::Fatal(Failure::Kafka)
    } else {
        Class::Transient
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_records_are_counted_and_the_oldest_waiting_one_is_the_front() {
        let mut p = Pending::default();
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(1);
        let tickets: Vec<u64> = [t0, t1, t1].into_iter().map(|t| p.accept(t)).collect();
        assert_eq!(tickets, [0, 1, 2]);
        p.remove(1);
        assert_eq!((p.waiting, p.oldest()), (2, Some(t0)));
        p.remove(0);
        assert_eq!((p.waiting, p.oldest(), p.since.len()), (1, Some(t1), 1));
        p.remove(0); // already acked: nothing changes
        p.remove(7); // never handed out
        assert_eq!(p.waiting, 1);
        p.remove(2);
        assert!(p.is_empty() && p.oldest().is_none() && p.since.is_empty());
        assert_eq!(p.accept(t0), 3);
    }

    #[test]
    fn a_refused_certificate_reported_as_an_io_error_is_a_tls_failure() {
        use async_nats::ConnectError;
        let refused = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let e = ConnectError::with_source(ConnectErrorKind::Io, refused);
        assert!(tls_failure(&e).is_some_and(|why| why.contains("UnknownIssuer")));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(
            tls_failure(&ConnectError::with_source(ConnectErrorKind::Io, reset)),
            None
        );
    }

    #[test]
    fn an_untrusted_certificate_exits_4_and_an_unreachable_server_is_retried() {
        use async_nats::ConnectError;
        let config = NatsConfig::for_url("tls://localhost:4222");
        let refused = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let e = connect_error(
            &ConnectError::with_source(ConnectErrorKind::Io, refused),
            &config,
        );
        assert_eq!(e.class, Class::Fatal(Failure::Auth), "{}", e.message);
        assert!(e.message.contains("nats.tls_ca_file"), "{}", e.message);
        let down = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = connect_error(
            &ConnectError::with_source(ConnectErrorKind::Io, down),
            &config,
        );
        assert_eq!(e.class, Class::Transient, "{}", e.message);
    }
}
