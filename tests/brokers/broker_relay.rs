//! `walbox run` publishing to the brokers other than Kafka (Redis Streams, NATS JetStream,
//! RabbitMQ), each a real server (`support::brokers`): the promise is Kafka's. Every committed
//! event arrives, in per-aggregate commit order, none of a rolled-back transaction, through 20
//! SIGKILLs during 20,000 events and through a broker restart during a backlog; NATS and Redis
//! hold no duplicate across the kills (the stream's duplicate window, the entry ids taken from
//! the WAL position). Each broker is a [`Target`]: walbox's variables for it and a reader of
//! what it holds.

use std::cell::Cell;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use walbox::sandbox::broker::ConsumedRecord;

use crate::support::events::{
    assert_per_aggregate_commit_order, distinct_ids, random_writer, RandomWrites, Written,
};
use crate::support::{wait_until, wait_until_or, walbox_env, TestDb, Walbox, WAIT};

/// One broker as the tests drive it.
pub trait Target {
    /// walbox's variables for this broker (its section; `[kafka]` is left out).
    fn env(&self) -> Vec<(String, String)>;
    /// The destination the outbox rows name in their `topic` column (a stream key, a subject,
    /// a routing key), made ready to receive (a stream, a bound queue) by the target.
    fn destination(&self) -> String;
    /// Every record the destination holds now, in the broker's order.
    fn read_all(&mut self) -> Vec<ConsumedRecord>;
    /// Whether an event walbox sends again after a crash may be stored twice (RabbitMQ), or is
    /// dropped by the broker (NATS's duplicate window, Redis's entry ids).
    fn duplicates_possible(&self) -> bool;
}

/// `walbox run`'s variables for `db` and `slot` publishing to `target`.
pub fn env_for(db: &TestDb, slot: &str, target: &dyn Target) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = walbox_env(db, slot, "")
        .into_iter()
        .filter(|(k, _)| k != "WALBOX_KAFKA_BROKERS")
        .collect();
    env.extend(target.env());
    env
}

/// [`env_for`], with `extra` replacing or adding variables (credentials, TLS settings).
pub fn env_with(
    db: &TestDb,
    slot: &str,
    target: &dyn Target,
    extra: &[(&str, String)],
) -> Vec<(String, String)> {
    let mut env = env_for(db, slot, target);
    for (key, value) in extra {
        env.retain(|(k, _)| k != key);
        env.push(((*key).to_owned(), value.clone()));
    }
    env
}

/// A test's database, slot (made, with its publication), walbox's variables for `target`, and
/// the writer of `writes` into the target's destination, started.
struct Run {
    db: TestDb,
    slot: String,
    env: Vec<(String, String)>,
    destination: String,
    written: Arc<Mutex<Vec<Written>>>,
    writer: std::thread::JoinHandle<()>,
}

fn begin(target: &dyn Target, tag: &str, writes: RandomWrites) -> Run {
    let db = TestDb::new(tag);
    let slot = db.name.clone();
    db.create_slot_and_publication(&slot);
    let env = env_for(&db, &slot, target);
    let destination = target.destination();
    let (written, writer) = random_writer(&db, &destination, writes);
    Run {
        db,
        slot,
        env,
        destination,
        written,
        writer,
    }
}

/// Outbox rows for `aggregates` in a transaction that rolls back; the ids it took.
fn rolled_back(db: &TestDb, destination: &str, aggregates: &[String]) -> Vec<i64> {
    let values: Vec<String> = aggregates
        .iter()
        .map(|a| format!("('{a}', '{destination}', 'rolled.back', '{{}}'::jsonb)"))
        .collect();
    db.sql(&format!(
        "BEGIN;\nINSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES {} RETURNING id;\nROLLBACK;",
        values.join(",")
    ))
    .lines()
    .filter_map(|l| l.trim().parse().ok())
    .collect()
}

/// The SIGKILL loop: 20 kills at random points while 20,000 events are written in
/// transactions of 1–50 rows (and a rolled-back one between kills). After each kill, every
/// event of a transaction the slot confirmed is in the broker; at the end every committed
/// event is, in per-aggregate commit order, none rolled back, and (NATS, Redis) none twice.
pub fn sigkill_loop(target: &mut dyn Target, tag: &str) {
    const TOTAL: usize = 20_000;
    let Run {
        db,
        slot,
        env,
        destination,
        written,
        writer,
    } = begin(
        target,
        tag,
        RandomWrites {
            seed: 44,
            total: TOTAL,
            max_rows: 50,
            aggregates: 100,
            other_table_one_in: Some(4),
        },
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(45);
    let mut never = HashSet::new();
    let created = db.confirmed(&slot);
    let (mut kills, mut checked) = (0, 0);
    while kills < 20 || !writer.is_finished() {
        let mut walbox = Walbox::spawn(&env);
        if kills == 0 {
            // The first kill comes once something is confirmed, so the check below checks
            // something even where start-up is slow.
            wait_until(WAIT, "walbox to confirm a transaction", || {
                written
                    .lock()
                    .unwrap()
                    .first()
                    .is_some_and(|w| db.confirmed(&slot) >= w.after_commit.max(created))
            });
        } else {
            // Fault injection: the kill point is random by design.
            std::thread::sleep(Duration::from_millis(rng.random_range(150..900)));
        }
        never.extend(rolled_back(
            &db,
            &destination,
            &[format!("agg-{}", rng.random_range(0..100))],
        ));
        walbox.kill();
        kills += 1;
        // walbox is dead: the slot's position is final for now, and every transaction it
        // confirmed must be in the broker, whole.
        let confirmed = db.confirmed(&slot);
        let present = distinct_ids(&target.read_all());
        for w in written.lock().unwrap().iter() {
            if w.after_commit <= confirmed {
                checked += 1;
                for id in &w.ids {
                    assert!(
                        present.contains(id),
                        "slot confirmed {confirmed} but event {id} (committed before {}) is not in the broker; walbox log:\n{}",
                        w.after_commit,
                        walbox.log()
                    );
                }
            }
        }
    }
    writer.join().expect("writer");
    assert!(checked > 0, "no kill happened after any confirmation");
    let mut walbox = Walbox::spawn(&env);
    await_all(target, &walbox, TOTAL, &format!("after {kills} kills"));
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    check_complete(target, &written_ids(&written), &never, TOTAL);
}

/// A broker restart while walbox drains a backlog of 10,000 events: walbox waits for the
/// broker, reconnects, and everything arrives in order (NATS, Redis: each once), with
/// nothing confirmed that the restarted broker does not hold.
pub fn restart_during_backlog(target: &mut dyn Target, restart: &mut dyn FnMut(), tag: &str) {
    const TOTAL: usize = 10_000;
    let Run {
        db,
        slot,
        env,
        written,
        writer,
        ..
    } = begin(
        target,
        tag,
        RandomWrites {
            seed: 46,
            total: TOTAL,
            max_rows: 100,
            aggregates: 50,
            other_table_one_in: None,
        },
    );
    writer.join().expect("writer");
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "the drain to begin", || !target.read_all().is_empty());
    restart();
    let confirmed = db.confirmed(&slot);
    let present = distinct_ids(&target.read_all());
    for w in written.lock().unwrap().iter() {
        if w.after_commit <= confirmed {
            for id in &w.ids {
                assert!(
                    present.contains(id),
                    "slot confirmed {confirmed} but event {id} is not in the restarted broker"
                );
            }
        }
    }
    await_all(target, &walbox, TOTAL, "after the broker restart");
    assert!(walbox.running(), "walbox exited:\n{}", walbox.log());
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    check_complete(target, &written_ids(&written), &HashSet::new(), TOTAL);
}

/// Waits until `total` distinct events arrived at `target` (`when`: after what), naming how
/// many did and walbox's log when they do not.
fn await_all(target: &mut dyn Target, walbox: &Walbox, total: usize, when: &str) {
    let arrived = Cell::new(0);
    wait_until_or(
        WAIT * 2,
        &format!("every event {when}"),
        || {
            arrived.set(distinct_ids(&target.read_all()).len());
            arrived.get() >= total
        },
        || {
            format!(
                "{when}, {} of {total} events arrived; log:\n{}",
                arrived.get(),
                walbox.log()
            )
        },
    );
}

/// Everything the writer committed.
fn written_ids(written: &Arc<Mutex<Vec<Written>>>) -> HashSet<i64> {
    written
        .lock()
        .unwrap()
        .iter()
        .flat_map(|w| w.ids.iter().copied())
        .collect()
}

/// The broker holds exactly `all` (`total` of them), in per-aggregate commit order, none of
/// `never`, and (unless the broker may store a re-sent event again) each once.
fn check_complete(target: &mut dyn Target, all: &HashSet<i64>, never: &HashSet<i64>, total: usize) {
    let records = target.read_all();
    let ids = distinct_ids(&records);
    assert_eq!(all.len(), total);
    assert_eq!(&ids, all, "the broker holds exactly the committed events");
    assert!(
        ids.is_disjoint(never),
        "an event of a rolled-back transaction was published"
    );
    assert_per_aggregate_commit_order(&records);
    if !target.duplicates_possible() {
        assert_eq!(
            records.len(),
            ids.len(),
            "{} duplicates in a broker that drops re-sent events",
            records.len() - ids.len()
        );
    }
}
