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
//! - Per partition, records reach the worker in offset order: when a partition's queue is full,
//!   later records wait, in order, in its backlog until the queue has room.
//! - Memory is bounded: a partition whose backlog reaches [`PAUSE_RECORDS`] records or
//!   [`PAUSE_BYTES`] is paused, and resumed once the backlog is down to half of both. Pausing
//!   makes librdkafka drop what it prefetched for the partition and fetch it again on resume,
//!   which takes a fetch round trip (up to `fetch.wait.max.ms` when the fetcher waits at the end
//!   of the log): the half-full backlog keeps the worker busy meanwhile, so a pause costs no
//!   throughput. (Pausing whenever the two-batch queue filled up stalled every partition for a
//!   round trip per two batches: 10–50× slower in `cargo bench --bench inbox`.)
//! - Revocation (rebalance, shutdown): the revoked partitions' workers are cancelled, the
//!   polling thread waits until each has finished its current transaction, and their processed
//!   offsets are committed synchronously before librdkafka gives the partitions up. The next
//!   owner therefore starts exactly after the last committed transaction, except when the
//!   process dies in between, which the inbox absorbs.
//! - A static member (`kafka.group_instance_id`) sends no LeaveGroup when it stops (librdkafka
//!   closes a static member without one, KIP-345): its partitions wait for it, up to
//!   `session.timeout.ms`, instead of moving to another member and back (`inbox::group` tests
//!   this on a real broker).
//! - Offsets are also committed asynchronously every `kafka.commit_interval`.
//! - `walbox_inbox_assigned_partitions` is the set of partitions assigned minus those revoked
//!   (a cooperative assignment adds, an eager one replaces after revoking all), and each
//!   rebalance is logged with its partitions (`list`) and, on assignment, what this member owns
//!   (`owned`): a member that keeps a partition through a rebalance never logs it revoked.
//! - A client or consumer error is logged the first time it comes, then at most once a minute
//!   with how often it came meanwhile ([`super::throttle`]); except what stops the inbox: the
//!   consumer's fatal errors (refused credentials: exit 4; refused rights, librdkafka's fatal
//!   error: 9), and a TLS handshake that failed on a certificate (exit 4, with
//!   `failure::untrusted_certificate`'s line), which librdkafka would retry forever.
//! - `walbox_inbox_consumer_lag_records` counts, per partition, the records from where the group
//!   would start again to the end of the log: the committed offset, or, for a partition the
//!   group never committed, the start `auto.offset.reset` implies (the log start under
//!   `earliest`, walbox's default; the first record this process received under `latest`). A
//!   new group that processes nothing shows its whole backlog, never 0.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{Headers, Message};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::KafkaRole;
use crate::failure::{kafka_error, Class, Failure, FatalError, UntrustedCertificate};

use super::config::InboxKafka;
use super::effect::Record;
use super::metrics::InboxMetrics;
use super::throttle::Throttle;
use super::worker::{self, Progress, WorkerEnv};
use crate::metrics::Health;

/// Records queued per partition for its worker, at least: the queue holds two batches, so the
/// next one is fetched and waiting while the current one commits.
const QUEUE: usize = 64;

/// How often a client or consumer error that keeps coming is logged again (a broker outage
/// repeats the same error for every connection attempt and poll).
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// A partition's backlog at which it is paused (records)…
pub const PAUSE_RECORDS: usize = 4096;
/// … or bytes of keys, values and headers.
pub const PAUSE_BYTES: usize = 8 << 20;

/// Records of one partition waiting for room in its worker's queue, in offset order.
#[derive(Default)]
struct Backlog {
    /// Each record with its size, counted once on the way in.
    records: VecDeque<(usize, Record)>,
    bytes: usize,
}

impl Backlog {
    fn size(r: &Record) -> usize {
        let headers: usize = r
            .headers
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
            .sum();
        r.key.as_ref().map_or(0, Vec::len) + r.payload.as_ref().map_or(0, Vec::len) + headers
    }

    fn push_back(&mut self, r: Record) {
        let size = Self::size(&r);
        self.bytes += size;
        self.records.push_back((size, r));
    }

    /// Puts back the record [`Backlog::pop_front`] gave with its size.
    fn push_front(&mut self, (size, r): (usize, Record)) {
        self.bytes += size;
        self.records.push_front((size, r));
    }

    fn pop_front(&mut self) -> Option<(usize, Record)> {
        let (size, r) = self.records.pop_front()?;
        self.bytes -= size;
        Some((size, r))
    }

    fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn clear(&mut self) {
        self.records.clear();
        self.bytes = 0;
    }

    /// Time to pause the partition.
    fn full(&self) -> bool {
        self.records.len() >= PAUSE_RECORDS || self.bytes >= PAUSE_BYTES
    }

    /// Time to resume it.
    fn half(&self) -> bool {
        self.records.len() <= PAUSE_RECORDS / 2 && self.bytes <= PAUSE_BYTES / 2
    }
}

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
    pending: HashMap<Tp, Backlog>,
    paused: HashSet<Tp>,
    /// The first offset received per partition since it was assigned (for the lag of a
    /// partition with nothing committed under `auto.offset.reset = latest`).
    first: HashMap<Tp, i64>,
    /// The partitions the group assigned to this member now (assignments minus revocations).
    assigned: std::collections::BTreeSet<Tp>,
}

/// Where a partition the group never committed starts again: what `auto.offset.reset` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reset {
    /// `earliest` (walbox's default), `smallest`, `beginning`: the log start.
    Earliest,
    /// `latest`, `largest`, `end`, `error`: the end of the log when it was assigned.
    Latest,
}

impl Reset {
    fn of(properties: &std::collections::BTreeMap<String, String>) -> Reset {
        let value = properties
            .get("auto.offset.reset")
            .map(|v| v.trim().to_ascii_lowercase());
        match value.as_deref() {
            None | Some("earliest" | "smallest" | "beginning") => Reset::Earliest,
            Some(_) => Reset::Latest,
        }
    }
}

/// Records behind on one partition (librdkafka statistics): from the committed offset to the
/// end of the log (the last stable offset, as `isolation.level = read_committed`); with nothing
/// committed, from where [`Reset`] starts, `first` being the first offset received.
fn partition_lag(p: &rdkafka::statistics::Partition, reset: Reset, first: Option<i64>) -> i64 {
    if p.consumer_lag >= 0 {
        return p.consumer_lag;
    }
    // Committed, or not consumed here (another member's, or not fetched yet): librdkafka's -1.
    if p.committed_offset >= 0 || p.fetch_state != "active" {
        return 0;
    }
    let end = if p.ls_offset >= 0 {
        p.ls_offset
    } else {
        p.hi_offset
    };
    let start = match reset {
        Reset::Earliest => p.lo_offset,
        Reset::Latest => first.unwrap_or(end),
    };
    if start < 0 || end < 0 {
        return 0;
    }
    (end - start).max(0)
}

/// Shared by the polling thread and librdkafka's callbacks (which run on that thread).
struct Shared {
    runtime: tokio::runtime::Handle,
    reset: Reset,
    env: Arc<WorkerEnv>,
    metrics: Arc<InboxMetrics>,
    state: Mutex<State>,
    /// The client's and the consumer's errors logged (see [`Shared::warn`]).
    errors: Mutex<Throttle>,
    /// The line of a TLS handshake that failed on a certificate, once one did: the polling
    /// thread stops the inbox with it (exit 4).
    untrusted: UntrustedCertificate,
}

struct Ctx(Arc<Shared>);

impl ClientContext for Ctx {
    fn stats(&self, statistics: Statistics) {
        let st = self.0.lock();
        let lag: i64 = statistics
            .topics
            .iter()
            .flat_map(|(topic, t)| t.partitions.values().map(move |p| (topic, p)))
            .filter(|(_, p)| p.partition >= 0)
            .map(|(topic, p)| {
                let first = st.first.get(&(topic.clone(), p.partition)).copied();
                partition_lag(p, self.0.reset, first)
            })
            .sum();
        self.0.metrics.consumer_lag.set(lag);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // librdkafka would retry the handshake forever: no retry can succeed.
        if !self.0.untrusted.record(&error, reason) {
            self.0.warn("kafka client error", &error, reason);
        }
    }
}

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let tps = partitions_of(tpl);
                tracing::info!(
                    partitions = tps.len(),
                    list = %list(&tps),
                    "partitions revoked: finishing in-flight records and committing"
                );
                self.0.stop(consumer, &tps);
                let mut st = self.0.lock();
                for tp in &tps {
                    st.assigned.remove(tp);
                }
                self.0.metrics.partitions_revoked.inc_by(tps.len() as u64);
                self.0
                    .metrics
                    .assigned_partitions
                    .set(st.assigned.len() as i64);
            }
            Rebalance::Assign(tpl) => {
                // Cooperative: only the partitions added; eager: the whole new assignment.
                let tps = partitions_of(tpl);
                let mut st = self.0.lock();
                st.assigned.extend(tps.iter().cloned());
                let owned: Vec<Tp> = st.assigned.iter().cloned().collect();
                self.0.metrics.assigned_partitions.set(owned.len() as i64);
                tracing::info!(
                    partitions = tps.len(),
                    list = %list(&tps),
                    owned = %list(&owned),
                    "partitions assigned"
                );
            }
            Rebalance::Error(e) => tracing::warn!(error = %e, "rebalance error"),
        }
    }
}

fn partitions_of(tpl: &TopicPartitionList) -> Vec<Tp> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

/// `topic[0,2] other[1]`, partitions sorted: the form of the rebalance log lines.
fn list(tps: &[Tp]) -> String {
    let mut by_topic: std::collections::BTreeMap<&str, Vec<i32>> = Default::default();
    for (t, p) in tps {
        by_topic.entry(t.as_str()).or_default().push(*p);
    }
    let parts: Vec<String> = by_topic
        .into_iter()
        .map(|(t, mut ps)| {
            ps.sort_unstable();
            let ps: Vec<String> = ps.iter().map(i32::to_string).collect();
            format!("{t}[{}]", ps.join(","))
        })
        .collect();
    parts.join(" ")
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock means a panic elsewhere; the state itself stays consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Logs `what`: `error` (with librdkafka's `reason`, if any) the first time, then at most
    /// once per [`ERROR_LOG_INTERVAL`] with how often it came meanwhile ([`Throttle`]).
    fn warn(&self, what: &str, error: &KafkaError, reason: &str) {
        let key = format!("{what}: {error}");
        let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(repeats) = errors.admit(&key, Instant::now()) {
            tracing::warn!(%error, reason, repeats, "{what} (repeats are logged once a minute, with their count)");
        }
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
                st.first.remove(tp);
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
        if offsets.count() > 0 && consumer.assignment_lost() {
            // The session lapsed (coordinator unreachable, or the poll thread held too long):
            // the group already gave the partitions away, so the commit would be refused, and
            // waiting for it would hold this thread, with every error report behind it, until
            // the coordinator is back. The next owner replays from the last commit; the
            // inbox's dedup absorbs the replay.
            tracing::warn!(
                partitions = offsets.count(),
                "partitions lost with the group session: their last offsets are not committed; the inbox absorbs the replay"
            );
        } else if offsets.count() > 0 {
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
        st.first.entry(tp.clone()).or_insert(record.offset);
        let record = match st.pending.get_mut(&tp) {
            Some(q) => {
                q.push_back(record);
                None
            }
            None => Some(record),
        };
        if let Some(record) = record {
            if !st.workers.contains_key(&tp) {
                self.spawn_worker(&mut st, &tp);
            }
            let Some(w) = st.workers.get(&tp) else { return };
            match w.records.try_send(record) {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(r)) => {
                    st.pending.entry(tp.clone()).or_default().push_back(r);
                }
                // The worker stopped on a fatal error; the process is stopping.
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            }
        }
        let full = st.pending.get(&tp).is_some_and(Backlog::full);
        if full && !st.paused.contains(&tp) {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&tp.0, tp.1);
            if consumer.pause(&tpl).is_ok() {
                self.metrics.partition_pauses.inc();
                st.paused.insert(tp);
            }
        }
    }

    /// Moves backlogged records into queues with room; resumes paused partitions whose
    /// backlog is down to half. Returns whether records are still waiting.
    fn flush_pending(&self, consumer: &BaseConsumer<Ctx>) -> bool {
        let mut st = self.lock();
        if st.pending.is_empty() {
            return false;
        }
        let State {
            workers,
            pending,
            paused,
            ..
        } = &mut *st;
        let mut drained = Vec::new();
        let mut resumed = Vec::new();
        for (tp, q) in pending.iter_mut() {
            let Some(w) = workers.get(tp) else {
                q.clear();
                drained.push(tp.clone());
                continue;
            };
            while let Some((size, r)) = q.pop_front() {
                match w.records.try_send(r) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(r)) => {
                        q.push_front((size, r));
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
            } else if q.half() && paused.contains(tp) {
                resumed.push(tp.clone());
            }
        }
        for tp in drained {
            pending.remove(&tp);
            if paused.contains(&tp) {
                resumed.push(tp);
            }
        }
        let mut resume = TopicPartitionList::new();
        for tp in resumed {
            paused.remove(&tp);
            resume.add_partition(&tp.0, tp.1);
        }
        if resume.count() > 0 {
            let _ = consumer.resume(&resume);
        }
        !pending.is_empty()
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

/// The consumer's polling thread.
pub struct ConsumerLoop {
    consumer: BaseConsumer<Ctx>,
    shared: Arc<Shared>,
    commit_interval: Duration,
    /// `kafka.group_instance_id` is set: a fatal error may be a fence by a member with the
    /// same id, which librdkafka reports as a generic fatal error.
    static_member: bool,
}

impl ConsumerLoop {
    /// Creates the consumer and subscribes to the topics.
    pub fn new(
        kafka: &InboxKafka,
        env: Arc<WorkerEnv>,
        metrics: Arc<InboxMetrics>,
        runtime: tokio::runtime::Handle,
    ) -> KafkaResult<ConsumerLoop> {
        let mut cc = kafka.client_config(KafkaRole::InboxConsumer);
        cc.set("group.id", &kafka.group_id);
        if let Some(id) = &kafka.group_instance_id {
            cc.set("group.instance.id", id);
        }
        let shared = Arc::new(Shared {
            runtime,
            reset: Reset::of(&kafka.properties),
            env,
            metrics,
            state: Mutex::new(State::default()),
            errors: Mutex::new(Throttle::new(ERROR_LOG_INTERVAL)),
            untrusted: UntrustedCertificate::default(),
        });
        let consumer: BaseConsumer<Ctx> = cc.create_with_context(Ctx(shared.clone()))?;
        let topics: Vec<&str> = kafka.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        Ok(ConsumerLoop {
            consumer,
            shared,
            commit_interval: kafka.commit_interval,
            static_member: kafka.group_instance_id.is_some(),
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
            // While records wait for room, come back soon to hand them over.
            let waiting = self.shared.flush_pending(&self.consumer);
            let wait = Duration::from_millis(if waiting { 2 } else { 100 });
            match self.consumer.poll(wait) {
                Some(Ok(m)) => {
                    let record = to_record(&m);
                    drop(m);
                    self.shared.dispatch(&self.consumer, record);
                }
                // What stops the relay's producer stops the consumer: refused credentials (4),
                // refused rights or librdkafka's fatal error (9).
                Some(Err(e)) => match kafka_error(&e) {
                    Class::Fatal(failure) => {
                        let message = if self.static_member {
                            format!("kafka consumer cannot continue: {e} (with kafka.group_instance_id set, a second member with the same id fences this one: give each walbox inbox its own)")
                        } else {
                            format!("kafka consumer cannot continue: {e}")
                        };
                        let _ = fatal.send(FatalError::new(failure, message));
                        break;
                    }
                    // The certificate the client reported stops it below.
                    _ if self.shared.untrusted.line().is_some() => {}
                    _ => self.shared.warn("kafka consumer error", &e, ""),
                },
                None => {}
            }
            // The client reports the handshake (to [`Ctx`]) before the poll returns its code
            // (`_SSL`, transient alone).
            if let Some(line) = self.shared.untrusted.line() {
                let message = format!("kafka consumer cannot continue: {line}");
                let _ = fatal.send(FatalError::new(Failure::Auth, message));
                break;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn record(offset: i64, payload: usize) -> Record {
        Record {
            topic: "t".into(),
            partition: 0,
            offset,
            key: Some(b"k".to_vec()),
            payload: Some(vec![b'x'; payload]),
            headers: vec![("id".into(), Some(offset.to_string().into_bytes()))],
            timestamp_ms: None,
        }
    }

    #[test]
    fn a_backlog_is_full_at_either_bound_and_half_below_both() {
        let mut b = Backlog::default();
        for i in 0..PAUSE_RECORDS as i64 - 1 {
            b.push_back(record(i, 10));
        }
        assert!(!b.full());
        b.push_back(record(PAUSE_RECORDS as i64, 10));
        assert!(b.full(), "{} records", b.records.len());
        while b.records.len() > PAUSE_RECORDS / 2 {
            b.pop_front();
        }
        assert!(b.half());

        let mut b = Backlog::default();
        b.push_back(record(0, PAUSE_BYTES));
        assert!(b.full(), "{} bytes", b.bytes);
        let r = b.pop_front().expect("a record");
        assert_eq!(b.bytes, 0, "popping gives its bytes back");
        b.push_front(r);
        assert!(b.full() && !b.half());
        b.clear();
        assert!(b.is_empty() && b.half() && b.bytes == 0);
    }

    fn stats(committed: i64, lo: i64, ls: i64) -> rdkafka::statistics::Partition {
        rdkafka::statistics::Partition {
            partition: 0,
            fetch_state: "active".into(),
            committed_offset: committed,
            consumer_lag: if committed >= 0 { ls - committed } else { -1 },
            lo_offset: lo,
            hi_offset: ls,
            ls_offset: ls,
            ..Default::default()
        }
    }

    #[test]
    fn a_partition_the_group_never_committed_lags_from_where_it_would_start_again() {
        // Committed: librdkafka's own lag.
        assert_eq!(partition_lag(&stats(30, 10, 50), Reset::Earliest, None), 20);
        // Nothing committed (librdkafka reports -1001 and a lag of -1): from the log start…
        assert_eq!(
            partition_lag(&stats(-1001, 10, 50), Reset::Earliest, Some(12)),
            40
        );
        // … or, under `latest`, from the first record received (none yet: nothing behind).
        assert_eq!(
            partition_lag(&stats(-1001, 10, 50), Reset::Latest, Some(45)),
            5
        );
        assert_eq!(partition_lag(&stats(-1001, 10, 50), Reset::Latest, None), 0);
        // Not fetched yet, or not consumed by this member: nothing known.
        assert_eq!(
            partition_lag(&stats(-1001, -1001, -1001), Reset::Earliest, None),
            0
        );
        let elsewhere = rdkafka::statistics::Partition {
            fetch_state: "none".into(),
            ..stats(-1001, 10, 50)
        };
        assert_eq!(partition_lag(&elsewhere, Reset::Earliest, None), 0);
        let reset = |v: &str| Reset::of(&[("auto.offset.reset".to_owned(), v.to_owned())].into());
        assert_eq!(Reset::of(&Default::default()), Reset::Earliest);
        assert_eq!(reset("smallest"), Reset::Earliest);
        assert_eq!(reset("Latest"), Reset::Latest);
        assert_eq!(reset("error"), Reset::Latest);
    }

    #[test]
    fn a_backlog_keeps_offset_order_through_a_push_front() {
        let mut b = Backlog::default();
        for i in 0..3 {
            b.push_back(record(i, 1));
        }
        let first = b.pop_front().expect("a record");
        b.push_front(first);
        let order: Vec<i64> = std::iter::from_fn(|| b.pop_front())
            .map(|(_, r)| r.offset)
            .collect();
        assert_eq!(order, [0, 1, 2]);
    }
}
