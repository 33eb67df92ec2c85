//! The NATS JetStream publisher (`async-nats`): one PubAck per record, classified errors, and
//! progress records in a JetStream key-value bucket.
//!
//! A record is published to the subject `event.topic` (the route's topic template rendered),
//! through JetStream, with header `Nats-Msg-Id` = the event id, every walbox header as a NATS
//! header (a null header has an empty value), the key as header [`KEY_HEADER`], and the value
//! as payload (empty for a tombstone). Its [`Ack`](super::Ack) is `Ok` once the PubAck came
//! back: the stream capturing the subject stored it (a file-storage stream has written it to
//! its store and syncs it per JetStream's `sync_interval`, 2 minutes by default, so the record
//! survives a crash of the server process, and a power loss of the host once synced, or once
//! replicated to a quorum of an R3 stream). A PubAck saying `duplicate` is `Ok` too: the
//! stream already holds that event id.
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
//! - Publish permission denied (the server's "Permissions Violation for Publish", seen when the
//!   PubAck does not come): fatal, `Failure::Kafka` ("the publisher cannot continue"), naming
//!   the subject and the user.
//! - Stream full with `discard: new` ("maximum messages/bytes exceeded"), or JetStream out of
//!   resources: fatal, `Failure::Kafka`: every later record of the stream would be refused too,
//!   retrying cannot heal it, and a record dead-lettered past it would let the relay confirm
//!   past records the stream never stored. An operator raises the limits and restarts walbox.
//! - Authorization refused (on connect, or on a reconnect): fatal, `Failure::Auth`.
//! - A failed TLS handshake on connect (the server's certificate not signed by
//!   `nats.tls_ca_file`'s CA or the system's roots, a name it does not cover): fatal,
//!   `Failure::Auth` (exit 4, as PostgreSQL's untrusted certificate), whether the client calls
//!   it a TLS or an I/O error (it reports a refused certificate as the latter): a reconnect
//!   meets the same certificate. TLS settings it cannot load are `Failure::Config`.
//! - Timeouts, lost connections: transient.
//!
//! # Progress records
//! In the key-value bucket `nats.progress_bucket` (created with history 1 and file storage when
//! missing), under the key given (`<system id>/<database>/<slot>`; characters a key may not
//! hold are written `=` and two hex digits, see [`sanitize_key`]): the newest value wins, which
//! is what a bucket keeps, without a stream walbox must size.

mod classify;
mod headers;
mod shared;
mod task;

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;
use tokio::sync::mpsc;

use super::ack::{AckQueue, BrokerError, EventIdentity, PROGRESS_ROUTE};
use super::silence::Silences;
use super::{Publisher, SinkError};
use crate::config::{BrokerKind, NatsConfig};
use crate::failure::Class;
use crate::outbox::OutboxEvent;

pub use classify::sanitize_key;
pub use shared::{error, DEFAULT_DUPLICATE_WINDOW};
use shared::{lock, Pending, Shared, HELD, QUEUE};
pub(crate) use shared::{open, progress_bucket};
use task::{Job, Publishing, Record};

/// The NATS JetStream publisher of one relay; see the [module docs](self). Clones share it.
#[derive(Clone)]
pub struct NatsSink {
    tx: mpsc::Sender<Job>,
    shared: Arc<Shared>,
}

/// Connects the publisher; its acks go to `acks`. Opens (or creates) the progress bucket.
pub async fn connect(config: &NatsConfig, acks: Arc<AckQueue>) -> Result<NatsSink, SinkError> {
    let conn = open(config, Some(acks.clone())).await?;
    let bucket = progress_bucket(&conn.js, config).await?;
    let shared = Arc::new(Shared {
        pending: Mutex::new(Pending::default()),
        idle: Condvar::new(),
        silences: Silences::default(),
        duplicates: Default::default(),
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
            .oldest()
            .map_or(Duration::ZERO, |t| t.elapsed())
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

impl Publisher for NatsSink {
    fn broker(&self) -> BrokerKind {
        BrokerKind::Nats
    }

    fn send(&self, event: &OutboxEvent, seq: u64, route: usize) -> Result<(), SinkError> {
        let subject: &str = &event.topic;
        if let Err(why) = classify::check_subject(subject) {
            return Err(error(Class::Rejected, format!("subject {subject:?} {why}")).into());
        }
        let message = headers::message(event).map_err(|why| error(Class::Rejected, why))?;
        let ticket = self.shared.accept();
        self.hand_over(Job {
            ticket,
            seq,
            route,
            record: Record::Event {
                message,
                identity: EventIdentity::of(event),
            },
        })
    }

    fn send_progress(&self, key: &str, value: &[u8]) -> Result<(), SinkError> {
        let ticket = self.shared.accept();
        self.hand_over(Job {
            ticket,
            seq: 0,
            route: PROGRESS_ROUTE,
            record: Record::Progress {
                key: sanitize_key(key),
                value: Bytes::copy_from_slice(value),
            },
        })
    }

    fn in_flight(&self) -> usize {
        self.shared.in_flight()
    }

    fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut p = lock(&self.shared.pending);
        while !p.is_empty() {
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

    fn already_delivered(&self) -> u64 {
        self.shared
            .duplicates
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn oldest_unacked(&self) -> Option<Duration> {
        Some(self.unconfirmed_span())
    }

    fn max_held(&self) -> Option<usize> {
        Some(HELD)
    }
}

/// A JetStream context on `config`'s servers, for reading back (`sink::readback`).
pub async fn open_for_reading(config: &NatsConfig) -> Result<jetstream::Context, BrokerError> {
    Ok(open(config, None).await?.js)
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
