//! The Redis Streams publisher: each event is one stream entry, `XADD <topic> [MAXLEN ~ n]
//! <commit LSN>-<index> key <aggregate id> payload <value> <header> <value> …` (`key` only when
//! the event has one; `payload` empty for a tombstone; every header by its name, a null header
//! as an empty value), and each progress record a string, `SET <progress_key_prefix><slot key>
//! <json>` (read back with `GET`).
//!
//! # What an `Ok` ack means
//! The `XADD`'s reply: the entry is in the primary's memory. It is on disk only when the server
//! runs with `appendonly yes` and `appendfsync always` (with `everysec`, the last second may be
//! lost; without the append-only file, everything since the last snapshot); otherwise a Redis
//! crash loses acknowledged entries, and walbox will not send them again (`walbox check` warns).
//! With `redis.wait_replicas = n`, each pipeline ends with `WAIT n <redis.wait_timeout>`, and
//! its entries are acknowledged only once n replicas have them (fewer: every entry of the
//! pipeline fails, transient).
//!
//! # Exactly once, without transactions
//! Entry ids are the events' WAL positions, `<commit LSN as u64>-<index>`, which increase in
//! the order walbox publishes (commit order), so every stream's ids increase. An event sent
//! again — after a walbox crash, a transient failure, or by a standby taking over the slot (both
//! derive the same ids) — is refused by Redis with "equal or smaller than the target stream top
//! item", and is confirmed, not assumed:
//! - the entry with exactly that id exists (`XRANGE key id id`) → `Ok`, already delivered
//!   (counted: [`RedisSink::already_delivered`]);
//! - absent, but not above the stream's `max-deleted-entry-id` (`XINFO STREAM`, Redis 7.0+: the
//!   highest id `XDEL` removed), or below its `recorded-first-entry-id` once entries were
//!   removed (`entries-added` above `length`: trimming by `MAXLEN` or `XTRIM` moves the first
//!   entry and leaves `max-deleted-entry-id` alone) → delivered, then deleted or trimmed → `Ok`;
//! - absent otherwise → a gap: another client wrote higher ids into the stream, or an earlier
//!   failure let a later entry through → fatal (`Failure::Kafka`, exit 9), naming the stream,
//!   the id and the event; never silent.
//!
//! Consequences. With `redis.maxlen`, a re-sent entry trimmed since counts as delivered (it
//! was); a gap that trimming has already passed can no longer be told from that. Another
//! producer writing to walbox's streams with automatic ids (`*`: milliseconds since the epoch,
//! above any LSN of a young cluster) makes walbox's next entry a gap. A stream deleted whole
//! (`DEL`) takes any id again: a re-send then duplicates. Two walbox processes on one slot stream
//! one at a time (the leader lock); the second's re-sends of what the first delivered are
//! confirmed as delivered, so consumers see each entry once. With `redis.wait_replicas`, a
//! re-sent entry confirmed on the primary is not waited for again.
//!
//! # Progress records
//! A string key per slot, `SET <progress_key_prefix><system id>/<database>/<slot> <json>`: the
//! last write wins, as on Kafka's compacted topic, `GET` reads it in one round trip, and no
//! stream trimming reaches it. The records go through the same queue and pipeline as the events
//! (their acks on [`PROGRESS_ROUTE`]); a failed event does not hold them back. An eviction policy
//! other than `noeviction`, or an expiry someone sets, could remove them (`walbox check` warns).
//!
//! # TLS
//! `rediss://` connects with rustls (ring), verifying the server's name and certificate
//! against `redis.tls_ca_file` or the system's roots. A failed handshake (a certificate that
//! CA did not sign, a name it does not cover), which the client reports as an I/O error, is
//! fatal, `Failure::Auth` (exit 4, as PostgreSQL's untrusted certificate): a reconnect meets the
//! same certificate. An unreachable server stays transient.
//!
//! # Ordering under pipelining
//! One connection, one task: records are taken from a bounded queue in `send` order and written
//! as one pipeline per batch (Redis executes a connection's commands in order), and a batch is
//! sent only after the previous one's replies. A later `XADD` of a pipeline can succeed after an
//! earlier one failed only for a reason of that earlier one's own: `WRONGTYPE` (the key is not a
//! stream: `Rejected`, the record's fault, which the relay's dead-letter policy handles). Any
//! other failure (`OOM`, a gap, a lost connection, a timeout: an unknown outcome) fails that
//! record and every record of the pipeline after it, and the publisher then fails every event
//! above the first failed one's position without sending it, until an event at or below that
//! position comes: the relay's next session, re-sending from its confirmed position (so no
//! record of the failed session overtakes the failed one). A lost connection or timeout drops
//! the connection; the next batch connects again. Whatever a lost connection let through is a
//! prefix of what was sent, which the re-send confirms as delivered. One case is left: an
//! `OOM` refusal followed by a success on the same stream within one pipeline (memory freed
//! between the two commands) leaves a hole the re-send reports as a gap (fatal).
//!
//! # Invariants
//! - Exactly one [`Ack`] per record `send`/`send_progress` accepted; `send` never blocks
//!   (a full queue is [`SinkError::QueueFull`]).
//! - No entry is acknowledged `Ok` that the server's reply (and the confirmation of a re-send)
//!   did not show in the stream.
//! - Refused credentials also fail the whole [`AckQueue`] ([`AckQueue::fail`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, IntoConnectionInfo, Value};
use tokio::sync::mpsc;

use super::ack::BrokerError;
use super::ack::{header_text, Ack, AckQueue, DeliveryError, FailedRecord, PROGRESS_ROUTE};
use super::redis_reply::{
    broker_error, classify_client, classify_server, entries_removed, has_entry,
    is_id_not_above_top, max_deleted_entry_id, recorded_first_entry_id, StreamId,
};
use super::silence::Silences;
use super::{Publisher, SinkError};
use crate::config::{BrokerKind, RedisConfig};
use crate::failure::{Class, Failure};
use crate::outbox::{Headers, OutboxEvent, COMMIT_LSN_HEADER, INDEX_HEADER};

/// Records waiting for the publishing task (the relay stops reading at `relay.max_in_flight`;
/// beyond this, `send` says the queue is full).
const QUEUE: usize = 100_000;

/// Records written in one pipeline at most.
const BATCH: usize = 1_000;

/// The `XADD` of an event without a WAL position (`walbox republish` reads rows from a table,
/// which carry none; their commit LSN is 0/0): its id is `<top + 1>-<n>`, one millisecond part
/// above the stream's top entry, taken on the server so nothing can come between. Entries the
/// relay publishes later carry commit LSNs above that top (a commit record is longer than one
/// byte, and the runbook republishes while walbox is stopped after a lost slot), so they stay
/// above; a relay entry of the top's own commit LSN that was still to come is refused as a gap
/// (fatal), never taken for the republished one. `ARGV[1]` counts the `XADD` options that
/// follow it (`MAXLEN ~ n`); the fields come after them. Lua's numbers are doubles: a top above
/// 2^53 (8 PiB of WAL) is refused.
const REPUBLISH_SCRIPT: &str = r#"
local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local ms = 0
if #top > 0 then ms = tonumber(string.match(top[1][1], '^(%d+)-')) end
if ms >= 9007199254740992 then
  return redis.error_reply('ERR the stream top id is beyond what a republished entry can follow')
end
local options = tonumber(ARGV[1])
local args = {KEYS[1]}
for i = 2, options + 1 do args[#args + 1] = ARGV[i] end
args[#args + 1] = string.format('%.0f', ms + 1) .. '-*'
for i = options + 2, #ARGV do args[#args + 1] = ARGV[i] end
return redis.call('XADD', unpack(args))
"#;

/// The Redis Streams publisher; see the [module docs](self). Clones share the task.
#[derive(Clone)]
pub struct RedisSink {
    shared: Arc<Shared>,
    tx: mpsc::Sender<Job>,
}

struct Shared {
    in_flight: AtomicUsize,
    already_delivered: AtomicU64,
    silences: Silences,
}

/// One record for the task.
enum Job {
    Event(Box<EventJob>),
    Progress { key: String, value: Vec<u8> },
}

struct EventJob {
    seq: u64,
    route: usize,
    stream: Arc<str>,
    id: StreamId,
    key: Option<Bytes>,
    value: Option<Bytes>,
    headers: Headers,
    event_id: Bytes,
}

impl EventJob {
    fn failed(&self) -> FailedRecord {
        FailedRecord {
            topic: self.stream.to_string(),
            id: String::from_utf8_lossy(&self.event_id).into_owned(),
            lsn: header_text(&self.headers, COMMIT_LSN_HEADER),
            index: header_text(&self.headers, INDEX_HEADER),
            key: self.key.clone(),
            payload: self.value.clone(),
        }
    }
}

/// `host:port` of `config.url`, for messages (never the URL itself).
pub(super) fn server(config: &RedisConfig) -> String {
    config
        .url
        .as_str()
        .into_connection_info()
        .map(|i| i.addr().to_string())
        .unwrap_or_else(|_| "redis.url".to_owned())
}

/// Opens one connection with `config`'s credentials and timeouts (`reply` per reply).
pub async fn open(
    config: &RedisConfig,
    reply: Duration,
) -> Result<MultiplexedConnection, BrokerError> {
    let at = server(config);
    let info = config.url.as_str().into_connection_info().map_err(|_| {
        broker_error(
            Class::Fatal(Failure::Config),
            "redis.url is not a valid Redis URL",
        )
    })?;
    let mut settings = info.redis_settings().clone();
    if let Some(user) = &config.user {
        settings = settings.set_username(user);
    }
    if let Some(password) = &config.password {
        settings = settings.set_password(password.expose());
    }
    let info = info.set_redis_settings(settings);
    let client = match &config.tls_ca {
        Some(ca) => Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca.clone()),
            },
        ),
        None => Client::open(info),
    }
    .map_err(|e| classify_client(&e, &at, "connect", ""))?;
    let options = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(config.timeout))
        .set_response_timeout(Some(reply));
    client
        .get_multiplexed_async_connection_with_config(&options)
        .await
        .map_err(|e| {
            let mut error = classify_client(&e, &at, "connect", "");
            if error.class == Class::Transient {
                error.message = format!("cannot connect: {}", error.message);
            }
            error
        })
}

/// How long one pipeline's replies may take: `redis.timeout`, plus `WAIT`'s.
fn reply_timeout(config: &RedisConfig) -> Duration {
    if config.wait_replicas > 0 {
        config.timeout + config.wait_timeout
    } else {
        config.timeout
    }
}

/// Connects (so wrong credentials or an unreachable server are reported now) and starts the
/// publishing task on the current runtime; acks go to `acks`.
pub async fn connect(config: &RedisConfig, acks: Arc<AckQueue>) -> Result<RedisSink, SinkError> {
    let conn = open(config, reply_timeout(config)).await?;
    let (tx, rx) = mpsc::channel(QUEUE);
    let shared = Arc::new(Shared {
        in_flight: AtomicUsize::new(0),
        already_delivered: AtomicU64::new(0),
        silences: Silences::default(),
    });
    let task = Task {
        config: config.clone(),
        at: server(config),
        conn: Some(conn),
        acks,
        shared: shared.clone(),
        poison: None,
    };
    tokio::spawn(task.run(rx));
    Ok(RedisSink { shared, tx })
}

/// The newest progress record of `key` (`GET <progress_key_prefix><key>`); `None` when the
/// server holds none.
pub async fn read_progress(
    config: &RedisConfig,
    key: &str,
) -> Result<Option<Vec<u8>>, BrokerError> {
    let mut conn = open(config, config.timeout).await?;
    let name = format!("{}{key}", config.progress_key_prefix);
    let reply: Value = redis::cmd("GET")
        .arg(&name)
        .query_async(&mut conn)
        .await
        .map_err(|e| classify_client(&e, &server(config), "GET", &name))?;
    match reply {
        Value::Nil => Ok(None),
        Value::BulkString(b) => Ok(Some(b)),
        other => Err(broker_error(
            Class::Fatal(Failure::Kafka),
            format!("redis key {name:?} holds no progress record (GET answered {other:?})"),
        )),
    }
}

/// Where the progress record of `key` is kept, for messages.
pub fn progress_place(config: &RedisConfig, key: &str) -> String {
    format!("redis key \"{}{key}\"", config.progress_key_prefix)
}

impl RedisSink {
    /// Re-sent events Redis already held (confirmed by their id), since this publisher started.
    pub fn already_delivered(&self) -> u64 {
        self.shared.already_delivered.load(Ordering::Relaxed)
    }

    fn hand_over(&self, job: Job) -> Result<(), SinkError> {
        self.shared.in_flight.fetch_add(1, Ordering::SeqCst);
        self.shared.silences.waiting();
        match self.tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
                self.shared.silences.withdrawn();
                match e {
                    mpsc::error::TrySendError::Full(_) => Err(SinkError::QueueFull),
                    mpsc::error::TrySendError::Closed(_) => Err(broker_error(
                        Class::Fatal(Failure::Internal),
                        "the redis publishing task is gone",
                    )
                    .into()),
                }
            }
        }
    }
}

impl Publisher for RedisSink {
    fn broker(&self) -> BrokerKind {
        BrokerKind::Redis
    }

    fn send(&self, event: &OutboxEvent, seq: u64, route: usize) -> Result<(), SinkError> {
        let position = event.position;
        self.hand_over(Job::Event(Box::new(EventJob {
            seq,
            route,
            stream: event.topic.clone(),
            id: StreamId(position.commit_lsn.as_u64(), u64::from(position.index)),
            key: event.key.clone(),
            value: event.value.clone(),
            headers: event.headers.clone(),
            event_id: event.id.clone(),
        })))
    }

    fn send_progress(&self, key: &str, value: &[u8]) -> Result<(), SinkError> {
        self.hand_over(Job::Progress {
            key: key.to_owned(),
            value: value.to_vec(),
        })
    }

    fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// Polls until nothing is in flight (the task runs on the runtime's other threads).
    fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.in_flight() > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    fn silent_since(&self, from: Instant) -> Duration {
        self.shared.silences.since(from)
    }

    fn already_delivered(&self) -> u64 {
        RedisSink::already_delivered(self)
    }
}

/// The publishing task's state.
struct Task {
    config: RedisConfig,
    /// `host:port`, for messages.
    at: String,
    /// `None` after a failure: the next batch connects again.
    conn: Option<MultiplexedConnection>,
    acks: Arc<AckQueue>,
    shared: Arc<Shared>,
    /// The id of the first event failed for a reason not its own: events above it are failed
    /// unsent until one at or below it comes (the relay's re-send).
    poison: Option<StreamId>,
}

/// One record's outcome.
type Outcome = Result<(), BrokerError>;

impl Task {
    async fn run(mut self, mut rx: mpsc::Receiver<Job>) {
        let mut batch = Vec::with_capacity(BATCH);
        while let Some(first) = rx.recv().await {
            batch.push(first);
            while batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            self.publish(std::mem::take(&mut batch)).await;
        }
    }

    fn ack(&self, job: &Job, outcome: Outcome) {
        let (seq, route, failed) = match job {
            Job::Event(e) => (e.seq, e.route, outcome.is_err().then(|| e.failed())),
            Job::Progress { .. } => (0, PROGRESS_ROUTE, None),
        };
        self.acks.push(Ack {
            seq,
            route,
            result: outcome.map_err(DeliveryError::Broker),
            failed,
        });
        self.shared.silences.answered();
        self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// Fails `job` because an earlier record failed (`cause`, at `first`).
    fn after_failure(first: StreamId, cause: &BrokerError) -> BrokerError {
        broker_error(
            Class::Transient,
            format!("not published: an earlier record (entry {first}) failed ({}); it is sent again with everything after it", cause.message),
        )
    }

    async fn publish(&mut self, batch: Vec<Job>) {
        // Events above a failed one wait for the re-send of the failed one.
        let mut jobs = Vec::with_capacity(batch.len());
        for job in batch {
            if let (Job::Event(e), Some(first)) = (&job, self.poison) {
                if e.id > first {
                    let cause = broker_error(Class::Transient, "see the first failure");
                    self.ack(&job, Err(Self::after_failure(first, &cause)));
                    continue;
                }
                self.poison = None;
            }
            jobs.push(job);
        }
        if jobs.is_empty() {
            return;
        }
        let outcomes = self.outcomes(&jobs).await;
        // A failure not the record's own fails everything after it.
        let mut first_failure: Option<(StreamId, BrokerError)> = None;
        for (job, outcome) in jobs.iter().zip(outcomes) {
            let outcome = match (&first_failure, job) {
                (Some((first, cause)), Job::Event(_)) => match outcome {
                    Err(e) if e.class != Class::Transient => Err(e),
                    _ => Err(Self::after_failure(*first, cause)),
                },
                _ => outcome,
            };
            if let (Err(e), Job::Event(ev)) = (&outcome, job) {
                if e.class != Class::Rejected && first_failure.is_none() {
                    first_failure = Some((ev.id, e.clone()));
                    self.poison = Some(self.poison.map_or(ev.id, |p| p.min(ev.id)));
                }
                if let Class::Fatal(Failure::Auth) = e.class {
                    self.acks.fail(DeliveryError::Broker(e.clone()));
                }
            }
            self.ack(job, outcome);
        }
    }

    /// Every job's outcome, in order (connecting first when needed).
    async fn outcomes(&mut self, jobs: &[Job]) -> Vec<Outcome> {
        let all = |e: BrokerError| jobs.iter().map(|_| Err(e.clone())).collect();
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => match open(&self.config, reply_timeout(&self.config)).await {
                Ok(c) => c,
                Err(e) => return all(e),
            },
        };
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for job in jobs {
            match job {
                Job::Event(e) => {
                    let cmd = if e.id.0 == 0 {
                        // No WAL position (`walbox republish`): the id is taken above the
                        // stream's top, on the server (see `REPUBLISH_SCRIPT`).
                        let cmd = pipe
                            .cmd("EVAL")
                            .arg(REPUBLISH_SCRIPT)
                            .arg(1)
                            .arg(&*e.stream);
                        match self.config.maxlen {
                            Some(n) => cmd.arg(3).arg("MAXLEN").arg("~").arg(n),
                            None => cmd.arg(0),
                        }
                    } else {
                        let cmd = pipe.cmd("XADD").arg(&*e.stream);
                        if let Some(n) = self.config.maxlen {
                            cmd.arg("MAXLEN").arg("~").arg(n);
                        }
                        cmd.arg(e.id.to_string())
                    };
                    if let Some(k) = &e.key {
                        cmd.arg("key").arg(&k[..]);
                    }
                    cmd.arg("payload").arg(e.value.as_deref().unwrap_or(b""));
                    for (name, value) in &e.headers {
                        cmd.arg(name.as_str()).arg(value.as_deref().unwrap_or(b""));
                    }
                }
                Job::Progress { key, value } => {
                    pipe.cmd("SET")
                        .arg(format!("{}{key}", self.config.progress_key_prefix))
                        .arg(&value[..]);
                }
            }
        }
        if self.config.wait_replicas > 0 {
            pipe.cmd("WAIT")
                .arg(self.config.wait_replicas)
                .arg(u64::try_from(self.config.wait_timeout.as_millis()).unwrap_or(u64::MAX));
        }
        let replies: Vec<Value> = match pipe.query_async(&mut conn).await {
            Ok(r) => r,
            Err(e) => {
                // Unknown outcome: the connection is not used again.
                let mut error = classify_client(&e, &self.at, "XADD", "");
                if error.class == Class::Transient {
                    error.message =
                        format!("outcome unknown, connection dropped: {}", error.message);
                }
                return all(error);
            }
        };
        let expected = jobs.len() + usize::from(self.config.wait_replicas > 0);
        if replies.len() != expected {
            return all(broker_error(
                Class::Transient,
                format!(
                    "redis at {} answered {} replies to {expected} commands; reconnecting",
                    self.at,
                    replies.len()
                ),
            ));
        }
        let mut outcomes: Vec<Outcome> = Vec::with_capacity(jobs.len());
        let mut resent = Vec::new();
        for (i, (job, reply)) in jobs.iter().zip(&replies).enumerate() {
            let (command, key) = match job {
                Job::Event(e) => ("XADD", e.stream.to_string()),
                Job::Progress { key, .. } => {
                    ("SET", format!("{}{key}", self.config.progress_key_prefix))
                }
            };
            outcomes.push(match reply {
                Value::ServerError(err) => {
                    let detail = err.details().unwrap_or("");
                    if command == "XADD" && is_id_not_above_top(err.code(), detail) {
                        resent.push(i);
                        Ok(())
                    } else {
                        Err(classify_server(err.code(), detail, command, &key))
                    }
                }
                _ => Ok(()),
            });
        }
        if self.config.wait_replicas > 0 {
            let wanted = i64::from(self.config.wait_replicas);
            match replies.last() {
                Some(Value::Int(n)) if *n >= wanted => {}
                other => {
                    let got = match other {
                        Some(Value::Int(n)) => n.to_string(),
                        _ => "an unexpected reply".to_owned(),
                    };
                    let e = broker_error(
                        Class::Transient,
                        format!("WAIT: {got} of redis.wait_replicas = {wanted} replicas acknowledged within redis.wait_timeout"),
                    );
                    for o in outcomes.iter_mut().filter(|o| o.is_ok()) {
                        *o = Err(e.clone());
                    }
                }
            }
        }
        if !resent.is_empty() {
            if let Err(e) = self.confirm(&mut conn, jobs, &resent, &mut outcomes).await {
                for &i in &resent {
                    outcomes[i] = Err(e.clone());
                }
                return outcomes;
            }
        }
        self.conn = Some(conn);
        outcomes
    }

    /// Decides the re-sent entries `resent` (indexes into `jobs`) refused as not above their
    /// stream's top: delivered (present, or trimmed) or a gap. `Err`: the confirmation itself
    /// failed (the connection is then dropped).
    async fn confirm(
        &self,
        conn: &mut MultiplexedConnection,
        jobs: &[Job],
        resent: &[usize],
        outcomes: &mut [Outcome],
    ) -> Result<(), BrokerError> {
        let mut streams: HashMap<&str, usize> = HashMap::new();
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for &i in resent {
            if let Job::Event(e) = &jobs[i] {
                let id = e.id.to_string();
                pipe.cmd("XRANGE").arg(&*e.stream).arg(&id).arg(&id);
            }
        }
        for &i in resent {
            if let Job::Event(e) = &jobs[i] {
                let n = streams.len();
                if let std::collections::hash_map::Entry::Vacant(v) = streams.entry(&e.stream) {
                    v.insert(n);
                    pipe.cmd("XINFO").arg("STREAM").arg(&*e.stream);
                }
            }
        }
        let replies: Vec<Value> = pipe.query_async(conn).await.map_err(|e| {
            let mut error = classify_client(&e, &self.at, "XRANGE", "");
            error.message = format!("confirming re-sent entries: {}", error.message);
            error
        })?;
        if replies.len() != resent.len() + streams.len() {
            return Err(broker_error(
                Class::Transient,
                "confirming re-sent entries: reply count mismatch",
            ));
        }
        let (ranges, infos) = replies.split_at(resent.len());
        for (&i, range) in resent.iter().zip(ranges) {
            let Job::Event(e) = &jobs[i] else { continue };
            if let Value::ServerError(err) = range {
                outcomes[i] = Err(classify_server(
                    err.code(),
                    err.details().unwrap_or(""),
                    "XRANGE",
                    &e.stream,
                ));
                continue;
            }
            if has_entry(range) {
                self.shared
                    .already_delivered
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let info = streams.get(&*e.stream).and_then(|&n| infos.get(n));
            if let Some(Value::ServerError(err)) = info {
                let detail = err.details().unwrap_or("");
                outcomes[i] = Err(classify_server(err.code(), detail, "XINFO", &e.stream));
                continue;
            }
            let max_deleted = info.and_then(max_deleted_entry_id);
            // Below the first entry kept, only once entries were removed.
            let first = info
                .filter(|i| entries_removed(i))
                .and_then(recorded_first_entry_id);
            if max_deleted.is_some_and(|m| e.id <= m) || first.is_some_and(|f| e.id < f) {
                self.shared
                    .already_delivered
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let first = first.map_or_else(|| "unknown".to_owned(), |f| f.to_string());
            let deleted = max_deleted.map_or_else(
                || "unknown (XINFO STREAM gave none; Redis before 7.0?)".to_owned(),
                |m| m.to_string(),
            );
            outcomes[i] = Err(broker_error(
                Class::Fatal(Failure::Kafka),
                format!(
                    "gap in redis stream {:?}: entry {} (event {}) is absent, yet the stream holds higher ids and its max-deleted-entry-id is {deleted} and its first entry {first}: another client wrote higher ids into the stream, or an earlier entry was lost; inspect the stream (XINFO STREAM) before restarting",
                    &*e.stream,
                    e.id,
                    String::from_utf8_lossy(&e.event_id)
                ),
            ));
        }
        Ok(())
    }
}
