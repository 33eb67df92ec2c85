//! The publishing task: one publish in flight per subject (a FIFO per subject holds the rest),
//! one [`Ack`] per record, and the failure rule of the parent module's docs.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, kv};
use async_nats::Subject;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;

use super::classify::Judge;
use super::shared::{error, who, Connection, Shared, DEFAULT_DUPLICATE_WINDOW};
use crate::config::NatsConfig;
use crate::failure::Class;
use crate::sink::ack::{
    Ack, AckQueue, BrokerError, DeliveryError, EventIdentity, FailedRecord, PROGRESS_ROUTE,
};

/// One record handed to the task.
pub(crate) struct Job {
    /// Its entry in [`Shared`]'s pending records.
    pub ticket: u64,
    pub seq: u64,
    pub route: usize,
    pub record: Record,
}

/// What a [`Job`] publishes: an event's message (built and checked when it was handed over),
/// with what identifies the event should it fail, or a progress record.
pub(crate) enum Record {
    Event {
        message: PublishMessage,
        identity: EventIdentity,
    },
    /// A progress record: `value` under key-value key `key`.
    Progress { key: String, value: Bytes },
}

impl Job {
    fn is_progress(&self) -> bool {
        matches!(self.record, Record::Progress { .. })
    }

    /// Its FIFO: the subject (the event's interned topic, shared), or (never a valid subject:
    /// it holds a space) the progress key's.
    fn lane(&self) -> Arc<str> {
        match &self.record {
            Record::Event { identity, .. } => identity.topic.clone(),
            Record::Progress { key, .. } => Arc::from(format!("progress {key}")),
        }
    }

    /// What identifies the record in a failed ack; `None` for a progress record.
    fn failed(self) -> Option<FailedRecord> {
        match self.record {
            Record::Event { identity, .. } => Some(identity.failed()),
            Record::Progress { .. } => None,
        }
    }
}

/// A subject's FIFO: its jobs waiting behind the one in flight.
struct Lane {
    /// The subject as the client takes it, made once per lane (a clone shares it).
    subject: Subject,
    waiting: VecDeque<Job>,
}

/// What a job in flight keeps for its ack.
struct Flying {
    ticket: u64,
    seq: u64,
    route: usize,
    lane: Arc<str>,
    /// The event's identity, for its failed record; `None` for a progress record.
    identity: Option<EventIdentity>,
}

impl Flying {
    fn failed(self) -> Option<FailedRecord> {
        self.identity.map(EventIdentity::failed)
    }
}

/// Jobs taken from the queue at once.
const BATCH: usize = 64;

/// A publish's outcome: the slot of its [`Flying`], and the stream that stored it.
type Outcome = (usize, Result<Option<String>, BrokerError>);

/// What every publish's future shares (one reference count per publish).
struct Publish {
    js: jetstream::Context,
    judge: Judge,
    shared: Arc<Shared>,
}

/// The task's state.
pub(crate) struct Publishing {
    publish: Arc<Publish>,
    /// Kept so the connection lives as long as the task.
    _client: async_nats::Client,
    bucket: kv::Store,
    acks: Arc<AckQueue>,
    shared: Arc<Shared>,
    /// Lanes with a job in flight, and the jobs waiting behind it.
    lanes: HashMap<Arc<str>, Lane>,
    /// The jobs in flight, by slot (a free slot is `None` and listed in `free`).
    flying: Vec<Option<Flying>>,
    free: Vec<usize>,
    futures: FuturesUnordered<BoxFuture<'static, Outcome>>,
    /// The failure that failed every record after it, until the relay took those acks.
    poisoned: Option<BrokerError>,
    /// Streams whose duplicate window was logged.
    streams: HashSet<String>,
}

impl Publishing {
    pub(crate) fn new(
        conn: Connection,
        bucket: kv::Store,
        config: &NatsConfig,
        acks: Arc<AckQueue>,
        shared: Arc<Shared>,
    ) -> Self {
        let judge = Judge {
            js: conn.js.clone(),
            violations: conn.violations.clone(),
            who: who(config),
            ack_timeout: config.ack_timeout,
        };
        Publishing {
            publish: Arc::new(Publish {
                js: conn.js,
                judge,
                shared: shared.clone(),
            }),
            _client: conn.client,
            bucket,
            acks,
            shared,
            lanes: HashMap::new(),
            flying: Vec::new(),
            free: Vec::new(),
            futures: FuturesUnordered::new(),
            poisoned: None,
            streams: HashSet::new(),
        }
    }

    /// Publishes what `rx` hands over until every handle is dropped and every record has its
    /// ack.
    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<Job>) {
        let mut open = true;
        let mut jobs = Vec::with_capacity(BATCH);
        while open || !self.futures.is_empty() {
            tokio::select! {
                n = rx.recv_many(&mut jobs, BATCH), if open => {
                    if n == 0 {
                        open = false;
                    }
                    for job in jobs.drain(..) {
                        self.admit(job);
                    }
                }
                Some((slot, outcome)) = self.futures.next(), if !self.futures.is_empty() => {
                    self.settle(slot, outcome);
                }
            }
        }
    }

    fn admit(&mut self, job: Job) {
        if !job.is_progress() {
            if let Some(cause) = &self.poisoned {
                // The relay has taken every ack up to the failure (its session ended on it):
                // what comes now is the next session's.
                if self.acks.is_empty() {
                    self.poisoned = None;
                } else {
                    let e = follower(cause);
                    let (ticket, seq, route) = (job.ticket, job.seq, job.route);
                    self.ack(ticket, seq, route, Err(e), job.failed());
                    return;
                }
            }
        }
        let name = job.lane();
        match self.lanes.entry(name.clone()) {
            Entry::Occupied(mut lane) => lane.get_mut().waiting.push_back(job),
            Entry::Vacant(lane) => {
                let subject = Subject::from(&*name);
                lane.insert(Lane {
                    subject: subject.clone(),
                    waiting: VecDeque::new(),
                });
                self.start(name, subject, job);
            }
        }
    }

    fn start(&mut self, lane: Arc<str>, subject: Subject, job: Job) {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.flying.push(None);
            self.flying.len() - 1
        });
        let (future, identity): (BoxFuture<'static, Outcome>, _) = match job.record {
            Record::Progress { key, value } => {
                let bucket = self.bucket.clone();
                let future = Box::pin(async move {
                    let result = bucket.put(&key, value).await.map(|_| None).map_err(|e| {
                        error(
                            Class::Transient,
                            format!("writing progress record {key:?}: {e}"),
                        )
                    });
                    (slot, result)
                });
                (future, None)
            }
            Record::Event { message, identity } => {
                let publish = self.publish.clone();
                let future = Box::pin(async move {
                    let sent = match publish.js.send_publish(subject.clone(), message).await {
                        Ok(ack) => ack.await,
                        Err(e) => Err(e),
                    };
                    let result = match sent {
                        Ok(ack) => {
                            if ack.duplicate {
                                publish.shared.duplicates.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(Some(ack.stream))
                        }
                        Err(e) => Err(publish.judge.publish_error(&subject, e).await),
                    };
                    (slot, result)
                });
                (future, Some(identity))
            }
        };
        self.flying[slot] = Some(Flying {
            ticket: job.ticket,
            seq: job.seq,
            route: job.route,
            lane,
            identity,
        });
        self.futures.push(future);
    }

    fn settle(&mut self, slot: usize, outcome: Result<Option<String>, BrokerError>) {
        let Some(f) = self.flying.get_mut(slot).and_then(Option::take) else {
            return;
        };
        self.free.push(slot);
        let progress = f.route == PROGRESS_ROUTE;
        match outcome {
            Ok(stream) => {
                if let Some(stream) = stream {
                    self.log_window(stream);
                }
                self.ack(f.ticket, f.seq, f.route, Ok(()), None);
                self.next(&f.lane);
            }
            Err(e) if progress || e.class == Class::Rejected => {
                let lane = f.lane.clone();
                self.ack(f.ticket, f.seq, f.route, Err(e), f.failed());
                self.next(&lane);
            }
            Err(e) => {
                let later = follower(&e);
                self.ack(f.ticket, f.seq, f.route, Err(e.clone()), f.failed());
                self.poisoned = Some(e);
                // Every record in flight or queued after it, whatever its subject.
                self.futures = FuturesUnordered::new();
                self.free.clear();
                for f in std::mem::take(&mut self.flying).into_iter().flatten() {
                    self.ack(f.ticket, f.seq, f.route, Err(later.clone()), f.failed());
                }
                for (_, lane) in std::mem::take(&mut self.lanes) {
                    for job in lane.waiting {
                        let (ticket, seq, route) = (job.ticket, job.seq, job.route);
                        self.ack(ticket, seq, route, Err(later.clone()), job.failed());
                    }
                }
            }
        }
    }

    /// Starts the next job of `lane`, or frees the lane.
    fn next(&mut self, name: &Arc<str>) {
        let Entry::Occupied(mut lane) = self.lanes.entry(name.clone()) else {
            return;
        };
        match lane.get_mut().waiting.pop_front() {
            Some(job) => {
                let subject = lane.get().subject.clone();
                self.start(name.clone(), subject, job);
            }
            None => {
                lane.remove();
            }
        }
    }

    fn ack(
        &self,
        ticket: u64,
        seq: u64,
        route: usize,
        result: Result<(), BrokerError>,
        failed: Option<FailedRecord>,
    ) {
        self.acks.push(Ack {
            seq,
            route,
            result: result.map_err(DeliveryError::Broker),
            failed,
        });
        self.shared.done(ticket);
    }

    /// Logs the duplicate window of `stream` the first time a record is stored in it, warning
    /// when it is shorter than JetStream's default.
    fn log_window(&mut self, stream: String) {
        if self.streams.contains(&stream) {
            return;
        }
        self.streams.insert(stream.clone());
        let js = self.publish.js.clone();
        tokio::spawn(async move {
            match js.get_stream(&stream).await {
                Ok(s) => {
                    let window = s.cached_info().config.duplicate_window;
                    if window < DEFAULT_DUPLICATE_WINDOW {
                        tracing::warn!(broker = "nats", stream, ?window, "the stream's duplicate window is shorter than JetStream's default (2 min): an event walbox re-sends after a longer outage or restart is stored twice; raise duplicate_window");
                    } else {
                        tracing::info!(broker = "nats", stream, ?window, "publishing to the stream; re-sent events within its duplicate window are dropped as duplicates");
                    }
                }
                Err(e) => {
                    tracing::debug!(broker = "nats", stream, error = %e, "reading the stream's duplicate window")
                }
            }
        });
    }
}

/// The error of a record failed because an earlier one failed with `cause`.
fn follower(cause: &BrokerError) -> BrokerError {
    let class = match cause.class {
        Class::Fatal(f) => Class::Fatal(f),
        _ => Class::Transient,
    };
    error(
        class,
        format!(
            "not published: an earlier record failed ({}); it is sent again, in order, after it",
            cause.message
        ),
    )
}
