//! Shards (`postgres.shards`): one outbox through several slots, each a hash bucket of the
//! aggregate id, and `walbox reshard` between layouts — per-aggregate order and completeness
//! checked by an independent consumer, with SIGKILLs, broker faults under the shards' shared
//! producer, a terminated walsender and interrupted reshards.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use walbox::lsn::Lsn;
use walbox::sandbox::broker::TopicReader;

use crate::support::events::{
    assert_per_aggregate_commit_order, await_distinct, distinct_ids, stop_and_read_exactly,
    write_txn, write_txns, Written,
};
use crate::support::{
    self, free_port, http_get, major, wait_until, walbox_cmd, walbox_env, TestDb, Walbox, WAIT,
};

/// Whether this server has publication row filters; below 15 the tests check the refusal.
pub(crate) fn sharding_supported() -> bool {
    major() >= 15
}

/// The slot names of shard `k` of `n` for base slot `slot`.
pub(crate) fn shard_slot(slot: &str, k: u32, n: u32) -> String {
    format!("{slot}_{k}of{n}")
}

/// The walbox slots (and their layouts) of `db`, by name.
pub(crate) fn slots(db: &TestDb, base: &str) -> Vec<String> {
    db.sql(&format!(
        "SELECT slot_name FROM pg_replication_slots WHERE database = current_database() \
         AND (slot_name = '{base}' OR slot_name LIKE '{base}\\_%') ORDER BY slot_name"
    ))
    .lines()
    .map(str::to_owned)
    .filter(|l| !l.is_empty())
    .collect()
}

/// A labelled sample `name{slot="<slot>"}` of a Prometheus text exposition.
fn slot_metric(body: &str, name: &str, slot: &str) -> Option<f64> {
    let prefix = format!("{name}{{");
    body.lines()
        .filter(|l| l.starts_with(&prefix))
        .find(|l| l.contains(&format!("slot=\"{slot}\"")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Per id, the bucket of `n` its aggregate hashes to, as PostgreSQL computes it.
pub(crate) fn buckets(db: &TestDb, n: u32) -> HashMap<i64, u32> {
    db.sql(&format!(
        "SELECT id || ' ' || (hashtext(aggregate_id) & 2147483647) % {n} FROM outbox"
    ))
    .lines()
    .filter_map(|l| {
        let (id, b) = l.trim().split_once(' ')?;
        Some((id.parse().ok()?, b.parse().ok()?))
    })
    .collect()
}

/// A writer committing transactions of 1–8 events over 40 aggregates until stopped.
pub(crate) struct Writer {
    pub(crate) written: Arc<Mutex<Vec<Written>>>,
    pub(crate) stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    pub(crate) fn start(db: &TestDb, topic: &str) -> Writer {
        let written: Arc<Mutex<Vec<Written>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (db, topic, written, stop) =
                (db.clone(), topic.to_owned(), written.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let n = 1 + (i % 8) as usize;
                    let aggs: Vec<String> = (0..n)
                        .map(|j| format!("agg-{}", (i * 7 + j as u64 * 13) % 40))
                        .collect();
                    let w = write_txn(&db, &topic, &aggs, i.is_multiple_of(5));
                    written.lock().unwrap().push(w);
                    i += 1;
                }
            })
        };
        Writer {
            written,
            stop,
            thread: Some(thread),
        }
    }

    pub(crate) fn count(&self) -> usize {
        self.written
            .lock()
            .unwrap()
            .iter()
            .map(|w| w.ids.len())
            .sum()
    }

    /// Waits until at least `more` further events are committed.
    pub(crate) fn wait_for_more(&self, more: usize) {
        let target = self.count() + more;
        wait_until(WAIT, "the writer to commit more events", || {
            self.count() >= target
        });
    }

    /// Stops writing; returns every id committed.
    pub(crate) fn finish(mut self) -> HashSet<i64> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().expect("writer");
        self.written
            .lock()
            .unwrap()
            .iter()
            .flat_map(|w| w.ids.iter().copied())
            .collect()
    }
}

pub(crate) fn sharded_env(db: &TestDb, brokers: &str, shards: u32) -> Vec<(String, String)> {
    let mut env = walbox_env(db, &db.name, brokers);
    env.push(("WALBOX_POSTGRES_SHARDS".into(), shards.to_string()));
    env
}

/// Starts walbox with `env` and waits until every slot of `names` is streamed from.
/// [`sharded_env`] with the HTTP endpoints on a free port: the environment, the port, and the
/// shards' slot names.
pub(crate) fn served_shards(
    db: &TestDb,
    brokers: &str,
    shards: u32,
) -> (Vec<(String, String)>, u16, Vec<String>) {
    let port = free_port();
    let mut env = sharded_env(db, brokers, shards);
    env.push(("WALBOX_HTTP_LISTEN".into(), format!("127.0.0.1:{port}")));
    let names = (0..shards)
        .map(|k| shard_slot(&db.name, k, shards))
        .collect();
    (env, port, names)
}

pub(crate) fn start_streaming(env: &[(String, String)], db: &TestDb, names: &[String]) -> Walbox {
    let walbox = Walbox::spawn(env);
    wait_until(WAIT, "every shard to stream", || {
        names.iter().all(|s| db.streaming(s))
    });
    walbox
}

#[test]
fn below_15_shards_are_refused_with_the_version_they_need() {
    if sharding_supported() {
        return;
    }
    let db = TestDb::new("shards_old");
    let broker = support::broker();
    let env = sharded_env(&db, &broker.bootstrap_servers(), 2);
    let mut walbox = Walbox::spawn(&env);
    let status = walbox.wait_exit(WAIT);
    assert_eq!(status.code(), Some(5), "{}", walbox.log());
    assert!(
        walbox
            .last_line()
            .contains("postgres.shards > 1 needs PostgreSQL 15 or newer"),
        "{}",
        walbox.last_line()
    );
    assert!(slots(&db, &db.name).is_empty(), "no slot was made");
}

#[test]
fn reshard_without_slots_never_claims_a_layout_that_does_not_exist() {
    let db = TestDb::new("reshard_none");
    let broker = support::broker();
    let env = sharded_env(&db, &broker.bootstrap_servers(), 2);
    let (code, out) = walbox_cmd(&["reshard", "--to", "2"], &env);
    assert!(!out.contains("already"), "{out}");
    if sharding_supported() {
        // Nothing to move: walbox run makes the slots.
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("no slot of postgres.slot"), "{out}");
    } else {
        // Below 15 shards cannot exist: refused as `walbox run` refuses them.
        assert_eq!(code, 5, "{out}");
        assert!(
            out.contains("shards need PostgreSQL 15 or newer (publication row filters)")
                && out.contains("keep postgres.shards = 1"),
            "{out}"
        );
    }
    assert!(slots(&db, &db.name).is_empty(), "no slot was made");
}

#[test]
fn four_shards_relay_every_event_in_per_aggregate_order_through_sigkills() {
    if !sharding_supported() {
        return;
    }
    let db = TestDb::new("shards4");
    let base = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 4);
    let (env, port, names) = served_shards(&db, &broker.bootstrap_servers(), 4);

    let mut walbox = start_streaming(&env, &db, &names);
    assert_eq!(
        slots(&db, &base),
        names,
        "one slot per shard, named after it"
    );
    let writer = Writer::start(&db, &topic);
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let mut checked = 0;
    for _ in 0..3 {
        writer.wait_for_more(300);
        walbox.kill();
        // Each shard's slot is final while walbox is dead: every event of its bucket in a
        // transaction it confirmed must be in Kafka.
        let confirmed: Vec<Lsn> = names.iter().map(|s| db.confirmed(s)).collect();
        reader.read_to_end(WAIT).unwrap();
        let present = distinct_ids(&reader.records);
        let written = writer.written.lock().unwrap();
        // Read after the lock: every id listed is committed, so it has a bucket.
        let bucket = buckets(&db, 4);
        for w in written.iter() {
            for id in &w.ids {
                let k = bucket[id] as usize;
                if w.after_commit <= confirmed[k] {
                    checked += 1;
                    assert!(
                        present.contains(id),
                        "shard {k} confirmed {} but event {id} (committed before {}) is not in Kafka",
                        confirmed[k],
                        w.after_commit
                    );
                }
            }
        }
        drop(written);
        wait_until(WAIT, "PostgreSQL to release the slots", || {
            names.iter().all(|s| !db.slot_active(s))
        });
        walbox = start_streaming(&env, &db, &names);
    }
    assert!(checked > 0, "no kill came after a confirmation");
    let all = writer.finish();
    await_distinct(&mut reader, all.len(), &walbox);

    // Every shard relayed its bucket, under its own label; the endpoints see all four.
    let (code, body) = http_get(port, "/metrics").expect("metrics");
    assert_eq!(code, 200);
    for name in &names {
        assert!(
            slot_metric(&body, "walbox_streaming", name) == Some(1.0),
            "{name} not streaming:\n{body}"
        );
        assert!(
            slot_metric(&body, "walbox_events_published_total", name).unwrap_or(0.0) > 0.0,
            "{name} published nothing since the restart:\n{body}"
        );
    }
    assert_eq!(http_get(port, "/readyz").map(|r| r.0), Some(200));
    // `walbox status` shows every shard.
    let (code, text) = walbox_cmd(&["status"], &env);
    assert_eq!(code, 0, "{text}");
    for name in &names {
        assert!(
            text.contains(&format!("slot                       {name}")),
            "{text}"
        );
    }

    // `walbox check` reports the layout.
    let (_, text) = walbox_cmd(&["check"], &env);
    assert!(
        text.contains("4 shards by hash of the aggregate id"),
        "{text}"
    );

    stop_and_read_exactly(&mut walbox, &mut reader, &all);
    assert_per_aggregate_commit_order(&reader.records);
}

#[test]
fn a_terminated_walsender_reconnects_its_shard_only() {
    if !sharding_supported() {
        return;
    }
    let db = TestDb::new("shards_term");
    let (topic, broker) = support::topic_on_broker(&db, 2);
    let (env, port, names) = served_shards(&db, &broker.bootstrap_servers(), 3);
    let mut walbox = start_streaming(&env, &db, &names);
    let pid = |slot: &str| {
        db.sql(&format!(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = '{slot}'"
        ))
    };
    let before: Vec<String> = names.iter().map(|s| pid(s)).collect();
    db.sql(&format!(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '{}'",
        names[1]
    ));
    let reconnects = |slot: &str| {
        http_get(port, "/metrics")
            .and_then(|(_, body)| slot_metric(&body, "walbox_reconnects_total", slot))
            .unwrap_or(0.0)
    };
    wait_until(WAIT, "the shard to reconnect", || {
        reconnects(&names[1]) >= 1.0 && db.streaming(&names[1])
    });
    assert_ne!(pid(&names[1]), before[1], "a new walsender for that shard");
    for k in [0, 2] {
        assert_eq!(pid(&names[k]), before[k], "shard {k} kept its walsender");
        assert_eq!(reconnects(&names[k]), 0.0, "shard {k} did not reconnect");
    }
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let aggs: Vec<String> = (0..30).map(|i| format!("agg-{i}")).collect();
    let w = write_txn(&db, &topic, &aggs, false);
    let all: HashSet<i64> = w.ids.into_iter().collect();
    await_distinct(&mut reader, all.len(), &walbox);
    stop_and_read_exactly(&mut walbox, &mut reader, &all);
}

#[test]
fn reshard_1_to_4_to_2_during_a_stream_keeps_every_aggregates_order() {
    if !sharding_supported() {
        return;
    }
    let db = TestDb::new("reshard");
    let base = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 4);
    let brokers = broker.bootstrap_servers();
    let one = sharded_env(&db, &brokers, 1);
    let four = sharded_env(&db, &brokers, 4);
    let two = sharded_env(&db, &brokers, 2);
    let layout = |n: u32| -> Vec<String> {
        match n {
            1 => vec![base.clone()],
            n => (0..n).map(|k| shard_slot(&base, k, n)).collect(),
        }
    };

    let mut walbox = start_streaming(&one, &db, &layout(1));
    let writer = Writer::start(&db, &topic);
    let mut reader = TopicReader::new(&brokers, &[&topic], WAIT).unwrap();
    writer.wait_for_more(200);
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());

    // 1 → 4 while the writer goes on.
    writer.wait_for_more(100);
    let (code, out) = walbox_cmd(&["reshard", "--to", "4"], &four);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("resharded at"), "{out}");
    assert_eq!(slots(&db, &base), layout(4));
    // The old layout's configuration is refused, with the way out.
    let (code, out) = walbox_cmd(&["run"], &one);
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("relayed through 4 shard(s)") && out.contains("postgres.shards = 4"),
        "{out}"
    );
    let (code, out) = walbox_cmd(&["check"], &one);
    assert_eq!(code, 13, "{out}");
    assert!(out.contains("set postgres.shards = 4"), "{out}");
    let mut walbox = start_streaming(&four, &db, &layout(4));
    writer.wait_for_more(300);
    // Not while walbox streams.
    let (code, out) = walbox_cmd(&["reshard", "--to", "2"], &two);
    assert_eq!(code, 6, "{out}");
    assert!(out.contains("is active: stop walbox"), "{out}");
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());

    // 4 → 2.
    writer.wait_for_more(100);
    let (code, out) = walbox_cmd(&["reshard", "--to", "2"], &two);
    assert_eq!(code, 0, "{out}");
    assert_eq!(slots(&db, &base), layout(2));
    let pubs = db.sql(&format!(
        "SELECT pubname FROM pg_publication WHERE pubname LIKE '{base}\\_%' ORDER BY 1"
    ));
    assert_eq!(
        pubs.lines().collect::<Vec<_>>(),
        layout(2),
        "the 4-shard publications are gone"
    );
    let mut walbox = start_streaming(&two, &db, &layout(2));
    writer.wait_for_more(200);
    let all = writer.finish();
    await_distinct(&mut reader, all.len(), &walbox);
    stop_and_read_exactly(&mut walbox, &mut reader, &all);
    assert_per_aggregate_commit_order(&reader.records);
}

/// Runs `walbox reshard --to <to>` with fault point `point` firing; it must crash there.
#[cfg(feature = "failpoints")]
fn reshard_crashing_at(env: &[(String, String)], to: u32, point: &str) {
    let mut faulty = env.to_vec();
    faulty.push(("FAILPOINTS".into(), format!("{point}=return")));
    let (code, out) = walbox_cmd(&["reshard", "--to", &to.to_string()], &faulty);
    assert!(
        out.contains(&format!("fault point {point} fired")),
        "exit {code}: {out}"
    );
}

#[cfg(feature = "failpoints")]
#[test]
fn an_interrupted_reshard_finishes_when_run_again_and_loses_nothing() {
    if !sharding_supported() {
        return;
    }
    let db = TestDb::new("reshard_crash");
    let base = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 4);
    let brokers = broker.bootstrap_servers();
    let one = sharded_env(&db, &brokers, 1);
    let two = sharded_env(&db, &brokers, 2);
    let three = sharded_env(&db, &brokers, 3);
    let mut reader = TopicReader::new(&brokers, &[&topic], WAIT).unwrap();

    let mut walbox = start_streaming(&one, &db, std::slice::from_ref(&base));
    let writer = Writer::start(&db, &topic);
    writer.wait_for_more(100);
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());

    // Crashed after draining, before dropping anything: the next run makes the new slots
    // again at a later point and drains on from there.
    writer.wait_for_more(100);
    reshard_crashing_at(&two, 2, "reshard::drained");
    let (code, out) = walbox_cmd(&["run"], &two);
    assert_eq!(code, 3, "an unfinished reshard is refused: {out}");
    assert!(out.contains("did not finish"), "{out}");
    writer.wait_for_more(100);
    let (code, out) = walbox_cmd(&["reshard", "--to", "2"], &two);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("of an unfinished run"), "{out}");
    let mut walbox = start_streaming(
        &two,
        &db,
        &[shard_slot(&base, 0, 2), shard_slot(&base, 1, 2)],
    );
    writer.wait_for_more(200);
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());

    // Crashed after dropping one old slot: the next run drops the rest and keeps the new ones.
    writer.wait_for_more(100);
    reshard_crashing_at(&three, 3, "reshard::old-slot-dropped");
    let (code, out) = walbox_cmd(&["reshard", "--to", "3"], &three);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("finishing an interrupted reshard"), "{out}");
    let names: Vec<String> = (0..3).map(|k| shard_slot(&base, k, 3)).collect();
    assert_eq!(slots(&db, &base), names);
    let mut walbox = start_streaming(&three, &db, &names);
    writer.wait_for_more(200);
    let all = writer.finish();
    await_distinct(&mut reader, all.len(), &walbox);
    stop_and_read_exactly(&mut walbox, &mut reader, &all);
    assert_per_aggregate_commit_order(&reader.records);
}

/// SIGTERM while `reshard` drains (the brokers unreachable, so the drain cannot finish): it
/// exits 17 ("interrupted: run it again"), not 12, and never claims a shard drained; run again
/// with the brokers back, it finishes and nothing is lost.
#[test]
fn a_reshard_stopped_by_sigterm_exits_17_and_claims_no_drain() {
    if !sharding_supported() {
        return;
    }
    let db = TestDb::new("reshard_sigterm");
    let base = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 4);
    let brokers = broker.bootstrap_servers();
    let one = sharded_env(&db, &brokers, 1);
    let two = sharded_env(&db, &brokers, 2);
    let mut reader = TopicReader::new(&brokers, &[&topic], WAIT).unwrap();
    let mut walbox = start_streaming(&one, &db, std::slice::from_ref(&base));
    let writer = Writer::start(&db, &topic);
    writer.wait_for_more(50);
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    writer.wait_for_more(50);

    let mut unreachable = two.clone();
    unreachable.retain(|(k, _)| k != "WALBOX_KAFKA_BROKERS");
    unreachable.push(("WALBOX_KAFKA_BROKERS".into(), "127.0.0.1:1".into()));
    unreachable.push(("WALBOX_RELAY_SHUTDOWN_TIMEOUT".into(), "1s".into()));
    let mut reshard = Walbox::spawn_args(&["reshard", "--to", "2"], &unreachable);
    wait_until(WAIT, "the reshard to drain", || {
        reshard.log().contains(&format!("draining {base} from"))
    });
    reshard.terminate();
    let status = reshard.wait_exit(WAIT);
    let log = reshard.log();
    assert_eq!(status.code(), Some(17), "{log}");
    assert!(!log.contains(&format!("drained {base}")), "{log}");
    assert!(log.contains("interrupted"), "{log}");
    assert!(log.contains("run it again with the same --to"), "{log}");

    writer.wait_for_more(50);
    let (code, out) = walbox_cmd(&["reshard", "--to", "2"], &two);
    assert_eq!(code, 0, "{out}");
    let names = [shard_slot(&base, 0, 2), shard_slot(&base, 1, 2)];
    let mut walbox = start_streaming(&two, &db, &names);
    writer.wait_for_more(50);
    let all = writer.finish();
    await_distinct(&mut reader, all.len(), &walbox);
    stop_and_read_exactly(&mut walbox, &mut reader, &all);
    assert_per_aggregate_commit_order(&reader.records);
}

#[test]
fn a_fatal_error_stops_its_shard_only() {
    if !sharding_supported() {
        return;
    }
    let db = TestDb::new("shards_fatal");
    let (topic, broker) = support::topic_on_broker(&db, 2);
    let (env, port, names) = served_shards(&db, &broker.bootstrap_servers(), 2);
    let mut walbox = start_streaming(&env, &db, &names);
    // Shard 1's slot disappears under it (its progress record proves it existed): fatal.
    db.sql(&format!(
        "DO $$ BEGIN
           FOR i IN 1..1000 LOOP
             PERFORM pg_terminate_backend(active_pid) FROM pg_replication_slots
               WHERE slot_name = '{0}' AND active;
             BEGIN
               PERFORM pg_drop_replication_slot('{0}');
               RETURN;
             EXCEPTION WHEN object_in_use THEN PERFORM pg_sleep(0.005);
             END;
           END LOOP;
           RAISE 'the slot stayed in use';
         END $$",
        names[1]
    ));
    wait_until(WAIT, "/healthz to report the lost shard", || {
        http_get(port, "/healthz").is_some_and(|(code, body)| {
            code == 503 && body.contains(&names[1]) && body.contains("existed and is gone")
        })
    });
    assert!(walbox.running(), "the other shard goes on");
    assert!(db.streaming(&names[0]), "shard 0 still streams");
    // Shard 0's bucket is still relayed.
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let aggs: Vec<String> = (0..20).map(|i| format!("agg-{i}")).collect();
    let w = write_txn(&db, &topic, &aggs, false);
    let bucket = buckets(&db, 2);
    let shard0: HashSet<i64> = w.ids.iter().copied().filter(|id| bucket[id] == 0).collect();
    assert!(!shard0.is_empty() && shard0.len() < w.ids.len());
    await_distinct(&mut reader, shard0.len(), &walbox);
    // The process ends with the lost shard's status once shut down.
    walbox.terminate();
    let status = walbox.wait_exit(WAIT);
    assert_eq!(status.code(), Some(7), "{}", walbox.log());
    reader.read_to_end(WAIT).unwrap();
    assert_eq!(
        distinct_ids(&reader.records),
        shard0,
        "shard 0's bucket, and only it"
    );
}

#[test]
fn shards_sharing_one_producer_lose_nothing_when_the_broker_fails_and_walbox_dies() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr as E};
    if !sharding_supported() {
        return;
    }
    let db = TestDb::new("shards_faults");
    let (topic, broker) = support::topic_on_broker(&db, 3);
    let Some(mock) = broker.mock_cluster() else {
        eprintln!("external broker: broker faults need the mock cluster; skipped");
        return;
    };
    let (env, port, names) = served_shards(&db, &broker.bootstrap_servers(), 3);
    let mut walbox = start_streaming(&env, &db, &names);
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let aggs: Vec<String> = (0..30).map(|i| format!("agg-{}", i % 13)).collect();
    let mut ids = HashSet::new();
    ids.extend(write_txns(&db, &topic, &aggs, 5));
    // Produce requests (each carrying several shards' records) are refused for a while, then
    // every broker answers late while partition leaders move: the producer retries, and each
    // shard's acks still reach only that shard.
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[E::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 8],
    );
    ids.extend(write_txns(&db, &topic, &aggs, 10));
    support::delay_every_broker(mock, std::time::Duration::from_millis(200));
    ids.extend(write_txns(&db, &topic, &aggs, 5));
    support::move_partition_leaders(mock, &topic, 3);
    ids.extend(write_txns(&db, &topic, &aggs, 5));
    // Every shard relayed part of it, through the one producer.
    wait_until(WAIT, "every shard to publish", || {
        http_get(port, "/metrics").is_some_and(|(_, body)| {
            names.iter().all(|n| {
                slot_metric(&body, "walbox_events_published_total", n).is_some_and(|v| v > 0.0)
            })
        })
    });
    // Killed while the broker is slow: what was not confirmed is sent again.
    walbox.kill();
    wait_until(WAIT, "PostgreSQL to release the slots", || {
        names.iter().all(|s| !db.slot_active(s))
    });
    ids.extend(write_txns(&db, &topic, &aggs, 5));
    support::delay_every_broker(mock, std::time::Duration::ZERO);
    walbox = start_streaming(&env, &db, &names);
    ids.extend(write_txns(&db, &topic, &aggs, 5));
    if !reader.poll_until(WAIT, |r| distinct_ids(r).len() >= ids.len()) {
        // Lost, or not yet delivered? Say which: the missing ids, how far each slot confirmed,
        // and what the relay counts as published and in flight.
        let mut missing: Vec<i64> = ids
            .difference(&distinct_ids(&reader.records))
            .copied()
            .collect();
        missing.sort_unstable();
        let slots = db.sql(
            "SELECT slot_name, confirmed_flush_lsn, pg_current_wal_lsn() FROM pg_replication_slots",
        );
        let metrics = http_get(port, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default();
        let relay: Vec<&str> = metrics
            .lines()
            .filter(|l| {
                l.starts_with("walbox_events_published_total") || l.starts_with("walbox_inflight")
            })
            .collect();
        panic!(
            "{} of {} events arrived; missing {missing:?}\nslots:\n{slots}\nrelay:\n{}\nlog:\n{}",
            distinct_ids(&reader.records).len(),
            ids.len(),
            relay.join("\n"),
            walbox.log()
        );
    }
    stop_and_read_exactly(&mut walbox, &mut reader, &ids);
    assert_per_aggregate_commit_order(&reader.records);
}
