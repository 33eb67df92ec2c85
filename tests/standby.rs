//! Decoding on a physical standby (PostgreSQL 16+): walbox reads its slot on the standby while
//! events are committed on the primary; SIGKILLs of walbox and a restart of the standby lose
//! nothing. And the start-up checks that say how to make a standby decodable.

use std::collections::HashSet;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use walbox::lsn::Lsn;
use walbox::sandbox::broker::TopicReader;
use walbox::sandbox::postgres::PgCluster;

use crate::support::events::{assert_per_aggregate_commit_order, distinct_ids, write_txn, Written};
use crate::support::standby::{clusters, old_pair};
use crate::support::{self, wait_until, walbox_env, TestDb, Walbox, WAIT};

/// Events the writer commits on the primary during the crash test.
const EVENTS: usize = 10_000;

/// A database on the shared primary with its publication, and the same database on `standby`
/// once the standby has replayed both.
fn database_on(standby: &'static PgCluster, tag: &str) -> (TestDb, TestDb) {
    let db = TestDb::on(&clusters().primary, tag);
    let slot = &db.name;
    db.sql(&format!(
        "CREATE PUBLICATION {slot} FOR TABLE outbox WITH (publish = 'insert')"
    ));
    let replica = db.on_standby(standby);
    wait_until(WAIT, "the standby to replay the publication", || {
        standby
            .psql(
                &db.name,
                &format!("SELECT count(*) FROM pg_publication WHERE pubname = '{slot}'"),
            )
            .is_ok_and(|n| n.trim() == "1")
    });
    (db, replica)
}

fn set(env: &mut Vec<(String, String)>, key: &str, value: String) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_owned(), value));
}

#[test]
fn walbox_on_a_standby_loses_nothing_through_sigkills_and_a_standby_restart() {
    let standby = &clusters().standby;
    let (db, replica) = database_on(standby, "standby");
    let version: u32 = replica.sql("SHOW server_version_num").parse().unwrap();
    assert!(version >= 160_000, "decoding on a standby needs 16+, this is {version}");
    let slot = db.name.clone();
    let topic = format!("t_{}", db.name);
    let broker = support::broker();
    broker.create_topic(&topic, 4).expect("topic");
    let mut env = walbox_env(&replica, &slot, &broker.bootstrap_servers());
    env.push(("WALBOX_POSTGRES_PRIMARY_URL".into(), db.url()));
    env.push(("WALBOX_SLOT_HEARTBEAT_INTERVAL".into(), "100ms".into()));

    // walbox creates its slot on the standby (asking the primary for running-transactions
    // records through primary_url), never on the primary.
    let port = support::free_port();
    let mut first = env.clone();
    set(
        &mut first,
        "WALBOX_HTTP_LISTEN",
        format!("127.0.0.1:{port}"),
    );
    set(&mut first, "WALBOX_SLOT_CHECK_INTERVAL", "100ms".into());
    let mut walbox = Walbox::spawn(&first);
    wait_until(
        WAIT,
        "walbox to create its slot on the standby and stream",
        || replica.streaming(&slot),
    );
    let on_primary =
        format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'");
    assert_eq!(db.sql(&on_primary), "0", "no slot on the primary");
    assert!(
        walbox.log().contains("created replication slot"),
        "{}",
        walbox.log()
    );
    // Heartbeats are written on the primary and come back through the standby's slot; the
    // monitor reads the slot on the standby without errors.
    wait_until(WAIT, "heartbeats to come back through the standby", || {
        let body = support::http_get(port, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default();
        support::metric(&body, "walbox_heartbeats_received_total").is_some_and(|n| n >= 2.0)
            && support::metric(&body, "walbox_slot_checks_total").is_some_and(|n| n >= 2.0)
    });
    let body = support::http_get(port, "/metrics").unwrap().1;
    assert_eq!(
        support::metric(&body, "walbox_slot_check_errors_total"),
        Some(0.0),
        "{body}"
    );
    walbox.kill();

    // The writer commits events on the primary while walbox is killed, and the standby
    // restarted once, under it.
    let written: Arc<Mutex<Vec<Written>>> = Arc::default();
    let writer = {
        let (db, topic, written) = (db.clone(), topic.clone(), written.clone());
        std::thread::spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(17);
            let mut total = 0;
            while total < EVENTS {
                let n = rng.random_range(1..=50).min(EVENTS - total);
                let aggs: Vec<String> = (0..n)
                    .map(|_| format!("agg-{}", rng.random_range(0..50)))
                    .collect();
                let w = write_txn(&db, &topic, &aggs, rng.random_ratio(1, 4));
                written.lock().unwrap().push(w);
                total += n;
            }
        })
    };
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(19);
    let (mut kills, mut restarted, mut checked_txns) = (0, false, 0);
    while kills < 8 || !writer.is_finished() {
        let mut walbox = Walbox::spawn(&env);
        if kills == 3 {
            wait_until(WAIT, "walbox to stream before the standby restarts", || {
                replica.streaming(&slot)
            });
            standby.restart().expect("restart the standby");
            wait_until(WAIT, "walbox to stream again after the standby restart", || {
                replica.streaming(&slot)
            });
            assert!(walbox.log().contains("reconnecting"), "{}", walbox.log());
            restarted = true;
        }
        // Fault injection: the kill point is random by design.
        std::thread::sleep(Duration::from_millis(rng.random_range(150..900)));
        walbox.kill();
        kills += 1;
        wait_until(WAIT, "the standby to release the slot", || {
            !replica.slot_active(&slot)
        });
        // Nobody streams, so the standby slot's position is final for now: every transaction
        // it confirmed must already be in Kafka, whole.
        let confirmed = replica.confirmed(&slot);
        reader.read_to_end(WAIT).unwrap();
        let present = distinct_ids(&reader.records);
        for w in written.lock().unwrap().iter() {
            if w.after_commit <= confirmed {
                checked_txns += 1;
                for id in &w.ids {
                    assert!(
                        present.contains(id),
                        "the standby's slot confirmed {confirmed} but event {id} (committed before {}) is not in Kafka",
                        w.after_commit
                    );
                }
            }
        }
    }
    writer.join().expect("writer");
    assert!(
        restarted && checked_txns > 0,
        "no kill after a confirmation"
    );

    let mut walbox = Walbox::spawn(&env);
    assert!(
        reader.poll_until(WAIT * 2, |r| distinct_ids(r).len() >= EVENTS),
        "after {kills} kills and a standby restart, {} of {EVENTS} events arrived; log:\n{}",
        distinct_ids(&reader.records).len(),
        walbox.log()
    );
    let last = written.lock().unwrap().last().unwrap().after_commit;
    wait_until(WAIT, "the standby's slot to confirm everything", || {
        replica.confirmed(&slot) >= last
    });
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    let all: HashSet<i64> = written
        .lock()
        .unwrap()
        .iter()
        .flat_map(|w| w.ids.iter().copied())
        .collect();
    assert_eq!(all.len(), EVENTS);
    assert_eq!(
        distinct_ids(&reader.records),
        all,
        "every committed event, nothing else"
    );
    assert_per_aggregate_commit_order(&reader.records);

    // `walbox status` reads the standby: lag against the replayed WAL.
    let out = Command::new(env!("CARGO_BIN_EXE_walbox"))
        .args(["status", "--json"])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["in_recovery"], true, "{v}");
    let replayed: Lsn = v["current_lsn"].as_str().unwrap().parse().unwrap();
    assert!(replayed >= last, "replayed {replayed} < {last}: {v}");
}
