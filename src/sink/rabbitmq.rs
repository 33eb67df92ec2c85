//! The RabbitMQ publisher (AMQP 0-9-1, through `lapin`): one connection, one channel in
//! publisher-confirm mode, records published in `send` order to `rabbitmq.exchange` with the
//! event's destination (`event.topic`) as routing key.
//!
//! # What an `Ok` ack means
//! A publisher confirm (`basic.ack`) without a `basic.return`. Records are published
//! `mandatory` and persistent (`delivery_mode = 2`); RabbitMQ confirms a persistent message
//! routed to durable classic queues once every such queue has written it to disk (fsync'd, or
//! delivered and acknowledged by a consumer first), and for quorum queues once a majority of
//! the queue's replicas have written it to their log. A message routed to no queue is
//! returned (`basic.return`, then confirmed): that record is failed as the record's fault
//! ([`Class::Rejected`], naming exchange and routing key), never silently acked. Durability
//! therefore also needs the user's queues to be durable (transient queues lose messages with
//! the node, whatever the confirm said).
//!
//! # Order
//! Records are published on one channel by one task, in `send` order; RabbitMQ routes and
//! enqueues the messages of one channel in publish order. Confirms are read in publish order
//! (up to [`WINDOW`] unconfirmed). On any failure but a return — a `basic.nack`, a channel or
//! connection closed, a confirm later than `rabbitmq.confirm_timeout` — the record is failed
//! and so is every record published or queued after it ([`Class::Transient`], unless the
//! broker's reply names a fatal cause), the connection is dropped, and the task ends: nothing
//! is ever re-sent here. Until the relay has taken every one of those acks from its queue,
//! `send` refuses records (transient): they may be the failed session's, sent before it saw
//! the failure. The relay takes acks on the task that sends and ends the session at the first
//! failed one, so once the queue is empty what comes is the next session's, and the first such
//! `send` connects again. A record of the failed session is thus never published on the new
//! connection ahead of an earlier record PostgreSQL will send again.
//!
//! The one reordering that remains is in the broker, not here: after a `basic.nack` for record
//! *n*, records *n+1…* published before the nack arrived may already be enqueued (RabbitMQ
//! nacks when a queue is full with `x-overflow: reject-publish`, which refuses the later records
//! too until there is room, or when a queue process failed internally), and PostgreSQL re-sends
//! *n* after them. A consumer sees *n+1…*, then *n, n+1…* again: the duplicates that
//! at-least-once delivery has anyway, with one record out of place. A connection lost with
//! records unconfirmed is the common case and does not reorder: RabbitMQ enqueues a channel's
//! messages in order, so what reached the queues is a prefix of what was published.
//!
//! # Duplicates across a crash
//! At least once: a record the broker enqueued but whose confirm walbox never received (crash,
//! connection loss, timeout) is published again by the next session. `message_id` is the
//! event id, for consumers that deduplicate.
//!
//! # Failures
//! `ACCESS_REFUSED` on connect is `Failure::Auth` (exit 4); on publish (no write permission on
//! the exchange) and `NOT_FOUND` (the exchange does not exist) `Failure::Kafka` (exit 9, "the
//! publisher cannot continue") with what to fix (the exchange is one configuration value: every
//! record would fail alike). A message over the node's `max_message_size` (RabbitMQ 3.10's
//! default: 128 MiB; the channel is closed with `PRECONDITION_FAILED`) is the record's fault:
//! the record whose size the refusal names fails `Rejected`, the others transiently.
//! A `basic.nack` is transient, its message naming exchange and routing key and the likely
//! cause (a queue full with `x-overflow: reject-publish`): consumers or the operator make room,
//! and the relay publishes the record again with backoff, logging each attempt. A failed TLS
//! handshake on connect is `Failure::Auth` (exit 4, as PostgreSQL's untrusted certificate): a
//! reconnect meets the same certificate.
//! Everything else (connection errors, the node restarting, timeouts) is transient.
//!
//! # Progress records
//! One durable queue per slot key, `<rabbitmq.progress_queue>.<key>` (see [`progress_queue`]),
//! declared by walbox with `x-max-length = 1` and `x-overflow = drop-head`: it always holds
//! the newest record, published through the default exchange (persistent, confirmed like
//! events). [`read_progress`] reads it with `basic.get` without acknowledging it and
//! requeues it, so the record stays.
//!
//! # Per-aggregate order for several consumers
//! One queue keeps commit order for every aggregate, but several consumers on one queue do not.
//! For parallel consumers with per-aggregate order, publish to an `x-consistent-hash` exchange
//! (plugin `rabbitmq_consistent_hash_exchange`, shipped with RabbitMQ) with the aggregate id as
//! routing key (the route's topic `${aggregate_id}`), bind N queues to it with weights (the
//! binding key is the weight, e.g. `"1"`), and give each queue one consumer: every aggregate
//! hashes to one queue, which holds its events in commit order.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, PublisherConfirm};
use tokio::sync::mpsc;

use super::ack::{Ack, AckQueue, BrokerError, FailedRecord, PROGRESS_ROUTE};
use super::silence::Silences;
use super::{Publisher, SinkError};
use crate::config::{BrokerKind, RabbitMqConfig};
use crate::failure::Class;
use crate::outbox::{OutboxEvent, KEY_HEADER};

/// Records published and not yet confirmed, at most. Confirms come in batches (`multiple`), so
/// a window of 2,000 keeps a local node busy; what a record costs while unconfirmed (its
/// frames, its confirm's state) is what a larger one would add to walbox's memory (measured in
/// `benches/brokers.rs`: 10,000 in flight took walbox's peak RSS from 34 to 57 MiB, for no
/// more events per second).
pub const WINDOW: usize = 2_000;
/// How long a failed publish waits for the confirms still due, whose failure may be the reason
/// the channel closed.
const CLOSE_REASON_WAIT: Duration = Duration::from_secs(5);
/// Records waiting for the publishing task, at most (then [`SinkError::QueueFull`], and the
/// relay waits for room): with [`WINDOW`], a sink holds at most 4,000 records, and the relay
/// stops reading at that many (`Publisher::max_held`) whatever `relay.max_in_flight` allows.
const QUEUE: usize = 2_000;

/// One record for the publishing task. It keeps the event as the relay built it (whose
/// fields share their buffers) and builds the AMQP properties only when it is published, and
/// its [`FailedRecord`] only when it failed: a record waiting in the queue costs the event,
/// not a copy of every header.
struct Job {
    seq: u64,
    route: usize,
    exchange: Arc<str>,
    routing_key: Arc<str>,
    record: Record,
}

/// What a [`Job`] publishes. Nearly every job is an event: boxing it would add an allocation
/// per event to spare the rare progress record some bytes.
#[allow(clippy::large_enum_variant)]
enum Record {
    Event(OutboxEvent),
    /// A progress record: its key and value.
    Progress {
        key: String,
        value: Bytes,
    },
}

impl Job {
    fn body(&self) -> &[u8] {
        match &self.record {
            Record::Event(e) => e.value.as_deref().unwrap_or_default(),
            Record::Progress { value, .. } => value,
        }
    }

    fn properties(&self) -> BasicProperties {
        match &self.record {
            Record::Event(e) => properties(e),
            Record::Progress { .. } => BasicProperties::default()
                .with_delivery_mode(2)
                .with_content_type("application/json".into()),
        }
    }

    fn failed(self) -> FailedRecord {
        match self.record {
            Record::Event(event) => FailedRecord::of_event(event),
            Record::Progress { key, value } => FailedRecord {
                topic: self.routing_key.to_string(),
                key: Some(Bytes::from(key.into_bytes())),
                payload: Some(value),
                ..Default::default()
            },
        }
    }
}

/// What the sink's handles share.
struct Shared {
    config: RabbitMqConfig,
    /// `config.exchange`, shared by every job.
    exchange: Arc<str>,
    acks: Arc<AckQueue>,
    /// The publishing task's queue (closed once the task failed).
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    /// Set by a failed task once it has pushed the ack of every record it had.
    failed: AtomicBool,
    in_flight: AtomicUsize,
    /// Signalled when `in_flight` drops to 0.
    idle: (Mutex<()>, Condvar),
    silences: Silences,
    runtime: tokio::runtime::Handle,
}

impl Shared {
    fn push(&self, job: Job, result: Result<(), BrokerError>) {
        self.silences.answered();
        let (seq, route) = (job.seq, job.route);
        let failed = result.is_err().then(|| job.failed());
        self.acks.push(Ack {
            seq,
            route,
            result: result.map_err(Into::into),
            failed,
        });
        if self.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _guard = lock(&self.idle.0);
            self.idle.1.notify_all();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// The publisher; see the [module docs](self). Clones share one connection.
#[derive(Clone)]
pub struct RabbitMqSink {
    shared: Arc<Shared>,
}

/// Connects (on the current tokio runtime) and starts the publishing task; acks go to `acks`.
pub async fn connect(
    config: &RabbitMqConfig,
    acks: Arc<AckQueue>,
) -> Result<RabbitMqSink, SinkError> {
    let link = open(config).await?;
    let shared = Arc::new(Shared {
        config: config.clone(),
        exchange: Arc::from(config.exchange.as_str()),
        acks,
        tx: Mutex::new(None),
        failed: AtomicBool::new(false),
        in_flight: AtomicUsize::new(0),
        idle: (Mutex::new(()), Condvar::new()),
        silences: Silences::default(),
        runtime: tokio::runtime::Handle::current(),
    });
    let sink = RabbitMqSink { shared };
    *lock(&sink.shared.tx) = Some(sink.start(Some(link)));
    Ok(sink)
}

/// An open connection and its confirm-mode channel.
struct Link {
    conn: Connection,
    channel: Channel,
    /// Progress queues declared on this connection.
    declared: HashSet<String>,
}

/// Connects, opens a channel and selects confirms.
async fn open(config: &RabbitMqConfig) -> Result<Link, BrokerError> {
    let conn = dial(config).await?;
    let channel = conn
        .create_channel()
        .await
        .map_err(|e| classify(&e, "opening a channel", config))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| classify(&e, "selecting publisher confirms", config))?;
    Ok(Link {
        conn,
        channel,
        declared: HashSet::new(),
    })
}

impl RabbitMqSink {
    /// Starts a publishing task on `link` (or on a connection it opens first).
    fn start(&self, link: Option<Link>) -> mpsc::Sender<Job> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let shared = self.shared.clone();
        self.shared.runtime.spawn(run(shared, link, rx));
        tx
    }

    fn hand_over(&self, job: Job) -> Result<(), SinkError> {
        let refused = || -> SinkError {
            err(
                Class::Transient,
                "publishing stopped after a failure (see the failed record's error); the next session connects again",
            )
            .into()
        };
        let mut tx = lock(&self.shared.tx);
        if tx.as_ref().is_some_and(mpsc::Sender::is_closed) {
            // The task failed. Records sent until the relay has taken every failed ack may be
            // the failed session's: refused, never published on a new connection ahead of
            // the records PostgreSQL will send again. The relay takes acks on the task that
            // sends, and ends the session at the first failed one: once the queue is empty,
            // what comes is the next session's.
            if !self.shared.failed.load(Ordering::Acquire) || !self.shared.acks.is_empty() {
                return Err(refused());
            }
            *tx = None;
        }
        let sender = match tx.as_ref() {
            Some(s) => s.clone(),
            None => {
                self.shared.failed.store(false, Ordering::Release);
                let s = self.start(None);
                *tx = Some(s.clone());
                s
            }
        };
        // Counted before the send: its ack may come before `send` returns.
        self.shared.in_flight.fetch_add(1, Ordering::AcqRel);
        self.shared.silences.waiting();
        match sender.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.shared.silences.withdrawn();
                self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
                match e {
                    mpsc::error::TrySendError::Full(_) => Err(SinkError::QueueFull),
                    // The task failed just now.
                    mpsc::error::TrySendError::Closed(_) => Err(refused()),
                }
            }
        }
    }
}

/// The AMQP properties of `event`.
fn properties(event: &OutboxEvent) -> BasicProperties {
    let mut headers = FieldTable::default();
    let mut props = BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(String::from_utf8_lossy(&event.id).as_ref().into());
    for (name, value) in &event.headers {
        let name = name.as_str();
        let v = match value {
            Some(v) => {
                if name == "event_type" {
                    props = props.with_type(String::from_utf8_lossy(v).as_ref().into());
                } else if name == "content-type" {
                    props = props.with_content_type(String::from_utf8_lossy(v).as_ref().into());
                }
                AMQPValue::LongString(LongString::from(v.to_vec()))
            }
            None => AMQPValue::Void,
        };
        headers.insert(ShortString::from(name), v);
    }
    if let Some(key) = &event.key {
        headers.insert(
            KEY_HEADER.into(),
            AMQPValue::LongString(LongString::from(key.to_vec())),
        );
    }
    if let Ok(secs) = u64::try_from(event.timestamp_ms / 1000) {
        props = props.with_timestamp(secs);
    }
    props.with_headers(headers)
}

impl Publisher for RabbitMqSink {
    fn broker(&self) -> BrokerKind {
        BrokerKind::RabbitMq
    }

    fn send(&self, event: &OutboxEvent, seq: u64, route: usize) -> Result<(), SinkError> {
        self.hand_over(Job {
            seq,
            route,
            exchange: self.shared.exchange.clone(),
            routing_key: event.topic.clone(),
            record: Record::Event(event.clone()),
        })
    }

    fn send_progress(&self, key: &str, value: &[u8]) -> Result<(), SinkError> {
        let queue = progress_queue(&self.shared.config, key);
        self.hand_over(Job {
            seq: 0,
            route: PROGRESS_ROUTE,
            exchange: Arc::from(""),
            routing_key: Arc::from(queue),
            record: Record::Progress {
                key: key.to_owned(),
                value: Bytes::copy_from_slice(value),
            },
        })
    }

    fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Acquire)
    }

    fn max_held(&self) -> Option<usize> {
        Some(WINDOW + QUEUE)
    }

    fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut guard = lock(&self.shared.idle.0);
        while self.in_flight() > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            guard = match self.shared.idle.1.wait_timeout(guard, left) {
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

/// A record published and waiting for its confirm.
struct Published {
    job: Job,
    confirm: Pin<Box<PublisherConfirm>>,
}

/// What woke the publishing task.
enum Step {
    Confirmed(lapin::Result<Confirmation>),
    Job(Option<Job>),
    TimedOut,
}

/// The publishing task: publishes what `rx` brings, reads confirms in order, acks each record;
/// on a failure fails everything left and ends (see the module docs).
async fn run(shared: Arc<Shared>, link: Option<Link>, mut rx: mpsc::Receiver<Job>) {
    let config = shared.config.clone();
    let mut link = match link {
        Some(l) => l,
        None => match open(&config).await {
            Ok(l) => l,
            Err(e) => return fail_rest(&shared, Vec::new(), &mut rx, e),
        },
    };
    let mut pending: VecDeque<Published> = VecDeque::new();
    let timer = tokio::time::sleep(config.confirm_timeout);
    tokio::pin!(timer);
    let mut timer_armed = false;
    loop {
        if !timer_armed && !pending.is_empty() {
            timer
                .as_mut()
                .reset(tokio::time::Instant::now() + config.confirm_timeout);
            timer_armed = true;
        }
        let step = std::future::poll_fn(|cx| {
            if let Some(front) = pending.front_mut() {
                if let Poll::Ready(r) = front.confirm.as_mut().poll(cx) {
                    return Poll::Ready(Step::Confirmed(r));
                }
                if timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Step::TimedOut);
                }
            }
            if pending.len() < WINDOW {
                if let Poll::Ready(j) = rx.poll_recv(cx) {
                    return Poll::Ready(Step::Job(j));
                }
            }
            Poll::Pending
        })
        .await;
        match step {
            Step::Job(None) => {
                // Every handle is gone: wait for the confirms still due, then close.
                if pending.is_empty() {
                    let _ = link.conn.close(200, "walbox done".into()).await;
                    return;
                }
                // `rx` is closed and empty: poll_recv keeps returning None, harmlessly.
                rx.close();
                while let Some(p) = pending.pop_front() {
                    let r = confirm_result(
                        tokio::time::timeout(config.confirm_timeout, p.confirm).await,
                        &p.job,
                        &config,
                    );
                    shared.push(p.job, r);
                }
                let _ = link.conn.close(200, "walbox done".into()).await;
                return;
            }
            Step::Job(Some(job)) => match publish(&mut link, &job).await {
                Ok(confirm) => pending.push_back(Published {
                    job,
                    confirm: Box::pin(confirm),
                }),
                Err(e) => {
                    let mut e = classify(&e, "publishing", &config);
                    // A node closing the channel over a record (too large, …) fails the next
                    // publish ("invalid channel state") before that record's confirm carries
                    // the reason: the confirms still due are read first, those acknowledged
                    // acked, and the first failed one's reason is the failure.
                    let wait = config.confirm_timeout.min(CLOSE_REASON_WAIT);
                    while let Some(front) = pending.front_mut() {
                        match tokio::time::timeout(wait, front.confirm.as_mut()).await {
                            Ok(Ok(Confirmation::Ack(None) | Confirmation::NotRequested)) => {
                                if let Some(p) = pending.pop_front() {
                                    shared.push(p.job, Ok(()));
                                }
                            }
                            Ok(Err(reason)) => {
                                e = classify(&reason, "waiting for the publisher confirm", &config);
                                break;
                            }
                            _ => break,
                        }
                    }
                    let mut jobs = jobs_of(pending);
                    jobs.push(job);
                    return fail_rest(&shared, jobs, &mut rx, e);
                }
            },
            Step::TimedOut => {
                let e = err(
                    Class::Transient,
                    format!(
                        "no publisher confirm within rabbitmq.confirm_timeout ({:?}); the node is overloaded or unreachable",
                        config.confirm_timeout
                    ),
                );
                return fail_rest(&shared, jobs_of(pending), &mut rx, e);
            }
            Step::Confirmed(result) => {
                timer_armed = false;
                let Some(p) = pending.pop_front() else {
                    continue;
                };
                match result {
                    Ok(Confirmation::Ack(None)) | Ok(Confirmation::NotRequested) => {
                        shared.push(p.job, Ok(()))
                    }
                    Ok(Confirmation::Ack(Some(returned))) => {
                        let e = err(
                            Class::Rejected,
                            format!(
                                "the message was returned unroutable ({} {}): exchange {:?} routes routing key {:?} to no queue; bind a queue for it",
                                returned.reply_code, returned.reply_text, p.job.exchange, p.job.routing_key
                            ),
                        );
                        shared.push(p.job, Err(e));
                    }
                    Ok(Confirmation::Nack(_)) => {
                        let e = nacked(&p.job);
                        pending.push_front(p);
                        return fail_rest(&shared, jobs_of(pending), &mut rx, e);
                    }
                    Err(e) => {
                        let e = classify(&e, "waiting for the publisher confirm", &config);
                        pending.push_front(p);
                        return fail_rest(&shared, jobs_of(pending), &mut rx, e);
                    }
                }
            }
        }
    }
}

/// The records of `pending`, in publish order.
fn jobs_of(pending: VecDeque<Published>) -> Vec<Job> {
    pending.into_iter().map(|p| p.job).collect()
}

/// One confirm read at shutdown.
fn confirm_result(
    r: Result<lapin::Result<Confirmation>, tokio::time::error::Elapsed>,
    job: &Job,
    config: &RabbitMqConfig,
) -> Result<(), BrokerError> {
    match r {
        Ok(Ok(Confirmation::Ack(None) | Confirmation::NotRequested)) => Ok(()),
        Ok(Ok(Confirmation::Ack(Some(_)))) => Err(err(
            Class::Rejected,
            format!(
                "the message was returned unroutable: exchange {:?} routes routing key {:?} to no queue",
                job.exchange, job.routing_key
            ),
        )),
        Ok(Ok(Confirmation::Nack(_))) => Err(nacked(job)),
        Ok(Err(e)) => Err(classify(&e, "waiting for the publisher confirm", config)),
        Err(_) => Err(err(Class::Transient, "no publisher confirm before shutdown")),
    }
}

/// The error of a record the node nacked: a queue it routes to is full and refuses new
/// messages (`x-overflow: reject-publish` at `x-max-length` / `x-max-length-bytes`, by
/// argument or policy), or a queue process failed. Transient: consumers taking messages off
/// the queue (or the operator raising its limit) heal it, and the relay sends the record again
/// with backoff, nothing confirmed past it; each attempt logs this message.
fn nacked(job: &Job) -> BrokerError {
    err(
        Class::Transient,
        format!(
            "the node refused the message for exchange {:?}, routing key {:?} (basic.nack): a queue it routes to is full with x-overflow reject-publish (x-max-length / x-max-length-bytes), or failed to take it; let its consumers catch up or raise the queue's limit (a policy's max-length); walbox sends it again",
            job.exchange, job.routing_key
        ),
    )
}

/// Publishes `job` on `link`, declaring its progress queue first when it is one.
async fn publish(link: &mut Link, job: &Job) -> lapin::Result<PublisherConfirm> {
    if job.route == PROGRESS_ROUTE && !link.declared.contains(&*job.routing_key) {
        link.channel
            .queue_declare(
                (*job.routing_key).into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                progress_arguments(),
            )
            .await?;
        link.declared.insert(job.routing_key.to_string());
    }
    link.channel
        .basic_publish(
            (*job.exchange).into(),
            (*job.routing_key).into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            job.body(),
            job.properties(),
        )
        .await
}

/// Fails every record of `jobs` (the first with `error`, the rest transient, except the
/// record a size refusal names) and everything still queued, closing `rx` first; then marks
/// the sink failed (see `hand_over`). Holds the sender's lock throughout, so a `hand_over`
/// that finds the failed acks taken also finds the sink marked failed.
fn fail_rest(
    shared: &Shared,
    mut jobs: Vec<Job>,
    rx: &mut mpsc::Receiver<Job>,
    error: BrokerError,
) {
    let _sender = lock(&shared.tx);
    rx.close();
    tracing::warn!(error = %error, "rabbitmq publisher stopped; records after the failure fail transiently");
    let size = (error.class == Class::Rejected)
        .then(|| refused_size(&error.message))
        .flatten();
    while let Ok(job) = rx.try_recv() {
        jobs.push(job);
    }
    // The record a size refusal names (by its size); else the first gets the error itself.
    let culprit = match size {
        Some(n) => jobs.iter().position(|j| j.body().len() as u64 == n),
        None if error.class == Class::Rejected => None,
        None => Some(0),
    };
    let transient = err(
        Class::Transient,
        format!(
            "not confirmed: an earlier record failed ({})",
            error.message
        ),
    );
    for (i, job) in jobs.into_iter().enumerate() {
        let e = if Some(i) == culprit {
            error.clone()
        } else {
            transient.clone()
        };
        shared.push(job, Err(e));
    }
    shared.failed.store(true, Ordering::Release);
}

/// The size in RabbitMQ's refusal `message size N is larger than configured max size M`.
fn refused_size(message: &str) -> Option<u64> {
    let rest = message.split("message size ").nth(1)?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

use super::rabbitmq_client::{classify, err};
pub(crate) use super::rabbitmq_client::{dial, is_not_found, progress_arguments};
pub use super::rabbitmq_client::{progress_queue, read_progress};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_queue_names_are_safe() {
        let c = RabbitMqConfig::for_url("amqp://u@h");
        assert_eq!(
            progress_queue(&c, "db/walbox slot"),
            "walbox.progress.db_walbox_slot"
        );
    }

    #[test]
    fn refused_size_is_read() {
        assert_eq!(
            refused_size("PRECONDITION_FAILED - message size 134217729 is larger than configured max size 134217728"),
            Some(134_217_729)
        );
        assert_eq!(refused_size("PRECONDITION_FAILED - other"), None);
    }
}
