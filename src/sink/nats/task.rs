//! The publishing task: one publish in flight per subject (a FIFO per subject holds the rest),
//! one [`Ack`] per record, and the failure rule of the parent module's docs.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, kv};
use async_nats::HeaderMap;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;

use super::classify::Judge;
use super::shared::{error, who, Connection, Shared, DEFAULT_DUPLICATE_WINDOW};
use crate::config::NatsConfig;
use crate::failure::Class;
use crate::sink::ack::{Ack, AckQueue, BrokerError, DeliveryError, FailedRecord, PROGRESS_ROUTE};

/// One record handed to the task.
pub(crate) struct Job {
    /// Its entry in [`Shared`]'s pending records.
    pub ticket: u64,
    pub seq: u64,
    pub route: usize,
    /// The subject (an event) or the key-value key (a progress record).
    pub subject: String,
    pub msg_id: String,
    pub headers: HeaderMap,
    pub payload: Bytes,
    /// What identifies an event in a failed ack; `None` for a progress record.
    pub failed: Option<FailedRecord>,
}

impl Job {
    /// A progress record: `value` under key-value key `key`.
    pub(crate) fn progress(ticket: u64, key: String, value: Bytes) -> Job {
        Job {
            ticket,
            seq: 0,
            route: PROGRESS_ROUTE,
            subject: key,
            msg_id: String::new(),
            headers: HeaderMap::new(),
            payload: value,
            failed: None,
        }
    }

    fn is_progress(&self) -> bool {
        self.route == PROGRESS_ROUTE
    }

    /// Its FIFO: the subject, or (never a valid subject: it holds a space) the progress key's.
    fn lane(&self) -> String {
        if self.is_progress() {
            format!("progress {}", self.subject)
        } else {
            self.subject.clone()
        }
    }
}

/// What a job in flight keeps for its ack.
struct Flying {
    seq: u64,
    route: usize,
    lane: String,
    failed: Option<FailedRecord>,
}

/// A publish's outcome: the job's ticket, and the stream that stored it.
type Outcome = (u64, Result<Option<String>, BrokerError>);

/// The task's state.
pub(crate) struct Publishing {
    js: jetstream::Context,
    /// Kept so the connection lives as long as the task.
    _client: async_nats::Client,
    bucket: kv::Store,
    judge: Arc<Judge>,
    acks: Arc<AckQueue>,
    shared: Arc<Shared>,
    /// Lanes with a job in flight, and the jobs waiting behind it.
    lanes: HashMap<String, VecDeque<Job>>,
    flying: HashMap<u64, Flying>,
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
        let judge = Arc::new(Judge {
            js: conn.js.clone(),
            violations: conn.violations.clone(),
            who: who(config),
            ack_timeout: config.ack_timeout,
        });
        Publishing {
            js: conn.js,
            _client: conn.client,
            bucket,
            judge,
            acks,
            shared,
            lanes: HashMap::new(),
            flying: HashMap::new(),
            futures: FuturesUnordered::new(),
            poisoned: None,
            streams: HashSet::new(),
        }
    }

    /// Publishes what `rx` hands over until every handle is dropped and every record has its
    /// ack.
    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<Job>) {
        let mut open = true;
        while open || !self.futures.is_empty() {
            tokio::select! {
                job = rx.recv(), if open => match job {
                    Some(job) => self.admit(job),
                    None => open = false,
                },
                Some((ticket, outcome)) = self.futures.next(), if !self.futures.is_empty() => {
                    self.settle(ticket, outcome);
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
                    self.ack(job.ticket, job.seq, job.route, Err(e), job.failed);
                    return;
                }
            }
        }
        let lane = job.lane();
        match self.lanes.get_mut(&lane) {
            Some(waiting) => waiting.push_back(job),
            None => {
                self.lanes.insert(lane.clone(), VecDeque::new());
                self.start(lane, job);
            }
        }
    }

    fn start(&mut self, lane: String, job: Job) {
        let ticket = job.ticket;
        let future: BoxFuture<'static, Outcome> = if job.is_progress() {
            let bucket = self.bucket.clone();
            let (key, value) = (job.subject, job.payload);
            Box::pin(async move {
                let result = bucket.put(&key, value).await.map(|_| None).map_err(|e| {
                    error(
                        Class::Transient,
                        format!("writing progress record {key:?}: {e}"),
                    )
                });
                (ticket, result)
            })
        } else {
            let (js, judge, shared) = (self.js.clone(), self.judge.clone(), self.shared.clone());
            let subject = job.subject;
            let message = PublishMessage::build()
                .payload(job.payload)
                .headers(job.headers)
                .message_id(&job.msg_id);
            Box::pin(async move {
                let sent = match js.send_publish(subject.clone(), message).await {
                    Ok(ack) => ack.await,
                    Err(e) => Err(e),
                };
                let result = match sent {
                    Ok(ack) => {
                        if ack.duplicate {
                            shared.duplicates.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Some(ack.stream))
                    }
                    Err(e) => Err(judge.publish_error(&subject, e).await),
                };
                (ticket, result)
            })
        };
        self.flying.insert(
            ticket,
            Flying {
                seq: job.seq,
                route: job.route,
                lane,
                failed: job.failed,
            },
        );
        self.futures.push(future);
    }

    fn settle(&mut self, ticket: u64, outcome: Result<Option<String>, BrokerError>) {
        let Some(f) = self.flying.remove(&ticket) else {
            return;
        };
        let progress = f.route == PROGRESS_ROUTE;
        match outcome {
            Ok(stream) => {
                if let Some(stream) = stream {
                    self.log_window(stream);
                }
                self.ack(ticket, f.seq, f.route, Ok(()), None);
                self.next(&f.lane);
            }
            Err(e) if progress || e.class == Class::Rejected => {
                self.ack(ticket, f.seq, f.route, Err(e), f.failed);
                self.next(&f.lane);
            }
            Err(e) => {
                let later = follower(&e);
                self.ack(ticket, f.seq, f.route, Err(e.clone()), f.failed);
                self.poisoned = Some(e);
                // Every record in flight or queued after it, whatever its subject.
                self.futures = FuturesUnordered::new();
                for (ticket, f) in std::mem::take(&mut self.flying) {
                    self.ack(ticket, f.seq, f.route, Err(later.clone()), f.failed);
                }
                for (_, waiting) in std::mem::take(&mut self.lanes) {
                    for job in waiting {
                        self.ack(
                            job.ticket,
                            job.seq,
                            job.route,
                            Err(later.clone()),
                            job.failed,
                        );
                    }
                }
            }
        }
    }

    /// Starts the next job of `lane`, or frees the lane.
    fn next(&mut self, lane: &str) {
        match self.lanes.get_mut(lane).and_then(VecDeque::pop_front) {
            Some(job) => self.start(lane.to_owned(), job),
            None => {
                self.lanes.remove(lane);
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
        let failed = if result.is_err() { failed } else { None };
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
        let js = self.js.clone();
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
