//! The consumer-group side: one polling thread owns the librdkafka consumer, hands each record
//! to its partition's worker, commits processed offsets, and handles rebalances.
//!
//! ```text
//!  poll thread ──record──► partition queue (bounded) ──► worker task ──► PostgreSQL txn
//!       ▲                                                    │
//!       └──── commit(next offsets) ◄──── Progress ◄──────────┘  (after COMMIT only)
//! ```
//!
//! # Invariants
//! - `enable.auto.commit=false`: the only offsets ever committed are read from the workers'
//!   [`Progress`], which moves only after the record's transaction committed.
//! - Per partition, records reach the worker in offset order: when a partition's queue is full
//!   the partition is paused and later records wait, in order, in a pending list until the
//!   queue has room; then the partition is resumed.
//! - Revocation (rebalance, shutdown): the revoked partitions' workers are cancelled, the
//!   polling thread waits until each has finished its current transaction, and their processed
//!   offsets are committed synchronously before librdkafka gives the partitions up. The next
//!   owner therefore starts exactly after the last committed transaction, except when the
//!   process dies in between, which the inbox absorbs.
//! - Offsets are also committed asynchronously every `kafka.commit_interval`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::{mpsc, oneshot, watch};

use crate::failure::{Failure, FatalError};

use super::config::InboxKafka;
use super::effect::Record;
use super::metrics::InboxMetrics;
use super::worker::{self, Progress, WorkerEnv};
use crate::metrics::Health;

/// Records queued per partition before the partition is paused, at least: the queue holds two
/// batches, so the next one is fetched and waiting while the current one commits.
const QUEUE: usize = 64;

type Tp = (String, i32);

struct Worker {
    records: mpsc::Sender<Record>,
    cancel: watch::Sender<bool>,
    done: oneshot::Receiver<()>,
    progress: Arc<Progress>,
}

#[derive(Default)]
struct State {
    workers: HashMap<Tp, Worker>,
    pending: HashMap<Tp, VecDeque<Record>>,
    paused: HashSet<Tp>,
}

/// Shared by the polling thread and librdkafka's callbacks (which run on that thread).
struct Shared {
    runtime: tokio::runtime::Handle,
    env: Arc<WorkerEnv>,
    metrics: Arc<InboxMetrics>,
    state: Mutex<State>,
}

struct Ctx(Arc<Shared>);

impl ClientContext for Ctx {
    fn stats(&self, statistics: Statistics) {
        let lag: i64 = statistics
            .topics
            .values()
            .flat_map(|t| t.partitions.values())
            .filter(|p| p.partition >= 0 && p.consumer_lag > 0)
            .map(|p| p.consumer_lag)
            .sum();
        self.0.metrics.consumer_lag.set(lag);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(error = %error, reason, "kafka client error");
    }
}

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let tps: Vec<Tp> = tpl
                    .elements()
                    .iter()
                    .map(|e| (e.topic().to_owned(), e.partition()))
                    .collect();
                tracing::info!(
                    partitions = tps.len(),
                    "partitions revoked: finishing in-flight records and committing"
                );
                self.0.stop(consumer, &tps);
            }
            Rebalance::Assign(tpl) => {
                tracing::info!(partitions = tpl.count(), "partitions assigned");
            }
            Rebalance::Error(e) => tracing::warn!(error = %e, "rebalance error"),
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock means a panic elsewhere; the state itself stays consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cancels the workers of `tps`, waits for their current transactions, commits their
    /// offsets synchronously.
    fn stop(&self, consumer: &BaseConsumer<Ctx>, tps: &[Tp]) {
        let mut stopped = Vec::new();
        let mut resume = TopicPartitionList::new();
        {
            let mut st = self.lock();
            for tp in tps {
                st.pending.remove(tp);
                if st.paused.remove(tp) {
                    resume.add_partition(&tp.0, tp.1);
                }
                if let Some(w) = st.workers.remove(tp) {
                    let _ = w.cancel.send(true);
                    stopped.push((tp.clone(), w));
                }
            }
        }
        if resume.count() > 0 {
            let _ = consumer.resume(&resume);
        }
        let mut offsets = TopicPartitionList::new();
        for ((topic, partition), w) in stopped {
            drop(w.records);
            // The worker ends after its current transaction; a dropped sender also means done.
            let _ = w.done.blocking_recv();
            if let Some(next) = w.progress.get() {
                let _ = offsets.add_partition_offset(&topic, partition, Offset::Offset(next));
            }
        }
        if offsets.count() > 0 {
            if let Err(e) = consumer.commit(&offsets, CommitMode::Sync) {
                tracing::warn!(error = %e, "committing offsets of revoked partitions failed; the inbox absorbs the replay");
            }
        }
    }

    fn spawn_worker(&self, st: &mut State, tp: &Tp) {
        let (tx, rx) = mpsc::channel(QUEUE.max(2 * self.env.effect.batch_max));
        let (cancel_tx, cancel_rx) = watch::channel(false);
        let (done_tx, done_rx) = oneshot::channel();
        let progress = Arc::new(Progress::new());
        let env = self.env.clone();
        let p = progress.clone();
        self.runtime.spawn(async move {
            worker::run(env, rx, cancel_rx, p).await;
            let _ = done_tx.send(());
        });
        st.workers.insert(
            tp.clone(),
            Worker {
                records: tx,
                cancel: cancel_tx,
                done: done_rx,
                progress,
            },
        );
    }

    /// Hands `record` to its partition's worker, keeping per-partition order.
    fn dispatch(&self, consumer: &BaseConsumer<Ctx>, record: Record) {
        let tp = (record.topic.clone(), record.partition);
        let mut st = self.lock();
        if let Some(q) = st.pending.get_mut(&tp) {
            q.push_back(record);
            return;
        }
        if !st.workers.contains_key(&tp) {
            self.spawn_worker(&mut st, &tp);
        }
        let Some(w) = st.workers.get(&tp) else { return };
        match w.records.try_send(record) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(r)) => {
                st.pending.entry(tp.clone()).or_default().push_back(r);
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(&tp.0, tp.1);
                if consumer.pause(&tpl).is_ok() {
                    st.paused.insert(tp);
                }
            }
            // The worker stopped on a fatal error; the process is stopping.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Moves pending records into queues with room; resumes partitions whose backlog is gone.
    fn flush_pending(&self, consumer: &BaseConsumer<Ctx>) {
        let mut st = self.lock();
        if st.pending.is_empty() {
            return;
        }
        let State {
            workers,
            pending,
            paused,
        } = &mut *st;
        let mut drained = Vec::new();
        for (tp, q) in pending.iter_mut() {
            let Some(w) = workers.get(tp) else {
                q.clear();
                drained.push(tp.clone());
                continue;
            };
            while let Some(r) = q.pop_front() {
                match w.records.try_send(r) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(r)) => {
                        q.push_front(r);
                        break;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        q.clear();
                        break;
                    }
                }
            }
            if q.is_empty() {
                drained.push(tp.clone());
            }
        }
        let mut resume = TopicPartitionList::new();
        for tp in drained {
            pending.remove(&tp);
            if paused.remove(&tp) {
                resume.add_partition(&tp.0, tp.1);
            }
        }
        if resume.count() > 0 {
            let _ = consumer.resume(&resume);
        }
    }

    /// Commits every worker's processed offset that moved since the last commit.
    fn commit_progress(&self, consumer: &BaseConsumer<Ctx>, committed: &mut HashMap<Tp, i64>) {
        let mut tpl = TopicPartitionList::new();
        let mut sent = Vec::new();
        {
            let st = self.lock();
            for (tp, w) in &st.workers {
                if let Some(next) = w.progress.get() {
                    if committed.get(tp) != Some(&next) {
                        let _ = tpl.add_partition_offset(&tp.0, tp.1, Offset::Offset(next));
                        sent.push((tp.clone(), next));
                    }
                }
            }
        }
        if tpl.count() == 0 {
            return;
        }
        match consumer.commit(&tpl, CommitMode::Async) {
            Ok(()) => committed.extend(sent),
            Err(e) => tracing::debug!(error = %e, "offset commit failed; retried next interval"),
        }
    }
}

fn to_record(m: &rdkafka::message::BorrowedMessage<'_>) -> Record {
    Record {
        topic: m.topic().to_owned(),
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().map(<[u8]>::to_vec),
        payload: m.payload().map(<[u8]>::to_vec),
        headers: m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|x| (x.key.to_owned(), x.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default(),
        timestamp_ms: m.timestamp().to_millis(),
    }
}

/// walbox's consumer properties; user properties are applied over them (the config refuses
/// those that would weaken the guarantees).
pub const DEFAULT_PROPERTIES: &[(&str, &str)] = &[
    ("enable.auto.commit", "false"),
    ("enable.auto.offset.store", "false"),
    ("auto.offset.reset", "earliest"),
    ("isolation.level", "read_committed"),
    ("enable.partition.eof", "false"),
    ("statistics.interval.ms", "5000"),
    ("client.id", "walbox-inbox"),
];

/// Consumer errors that stop walbox.
fn fatal_consumer_error(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    let code = match e {
        KafkaError::MessageConsumption(c) | KafkaError::Global(c) => *c,
        _ => return false,
    };
    matches!(
        code,
        C::GroupAuthorizationFailed
            | C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::SaslAuthenticationFailed
            | C::Authentication
            | C::Fatal
    )
}

/// The consumer's polling thread.
pub struct ConsumerLoop {
    consumer: BaseConsumer<Ctx>,
    shared: Arc<Shared>,
    commit_interval: Duration,
}

impl ConsumerLoop {
    /// Creates the consumer and subscribes to the topics.
    pub fn new(
        kafka: &InboxKafka,
        env: Arc<WorkerEnv>,
        metrics: Arc<InboxMetrics>,
        runtime: tokio::runtime::Handle,
    ) -> KafkaResult<ConsumerLoop> {
        let mut cc = ClientConfig::new();
        for (k, v) in DEFAULT_PROPERTIES {
            cc.set(*k, *v);
        }
        for (k, v) in &kafka.properties {
            cc.set(k, v);
        }
        cc.set("bootstrap.servers", &kafka.brokers)
            .set("group.id", &kafka.group_id);
        let shared = Arc::new(Shared {
            runtime,
            env,
            metrics,
            state: Mutex::new(State::default()),
        });
        let consumer: BaseConsumer<Ctx> = cc.create_with_context(Ctx(shared.clone()))?;
        let topics: Vec<&str> = kafka.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        Ok(ConsumerLoop {
            consumer,
            shared,
            commit_interval: kafka.commit_interval,
        })
    }

    /// Polls until `stop`; then stops every worker and commits their offsets. Run it on its own
    /// thread: it blocks.
    pub fn run(
        self,
        stop: &AtomicBool,
        health: &Health,
        fatal: &mpsc::UnboundedSender<FatalError>,
    ) {
        let mut committed: HashMap<Tp, i64> = HashMap::new();
        let mut last_commit = Instant::now();
        health.set_ready(true);
        while !stop.load(Ordering::Acquire) {
            self.shared.flush_pending(&self.consumer);
            match self.consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    let record = to_record(&m);
                    drop(m);
                    self.shared.dispatch(&self.consumer, record);
                }
                Some(Err(e)) if fatal_consumer_error(&e) => {
                    let _ = fatal.send(FatalError {
                        failure: Failure::Kafka,
                        message: format!("kafka consumer cannot continue: {e}"),
                    });
                    break;
                }
                Some(Err(e)) => tracing::warn!(error = %e, "kafka consumer error"),
                None => {}
            }
            if last_commit.elapsed() >= self.commit_interval {
                self.shared.commit_progress(&self.consumer, &mut committed);
                last_commit = Instant::now();
            }
        }
        health.set_ready(false);
        let all: Vec<Tp> = self.shared.lock().workers.keys().cloned().collect();
        self.shared.stop(&self.consumer, &all);
        self.consumer.unsubscribe();
        tracing::info!("consumer stopped; processed offsets committed");
    }
}
