//! High availability: several walbox processes for one slot, one active, the others hot
//! standbys that take over when it is killed or cut off from PostgreSQL.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use walbox::sandbox::broker::TopicReader;

use crate::support::events::{
    assert_per_aggregate_commit_order, distinct_ids, random_writer, write_txn, RandomWrites,
};
use crate::support::{
    self, free_port, http_get, metric, wait_until, walbox_env, TestDb, Walbox, WAIT,
};
use walbox::sandbox::proxy::{Mode, Proxy};

/// The takeover bound after SIGKILL of the active process (docs/guarantees.md, "Guarantees").
const TAKEOVER_BOUND: Duration = Duration::from_secs(10);

/// A walbox process and its HTTP port.
struct Member {
    walbox: Walbox,
    port: u16,
}

impl Member {
    fn spawn(env: &[(String, String)]) -> Member {
        let port = free_port();
        let mut env = env.to_vec();
        env.retain(|(k, _)| k != "WALBOX_HTTP_LISTEN");
        env.push(("WALBOX_HTTP_LISTEN".into(), format!("127.0.0.1:{port}")));
        Member {
            walbox: Walbox::spawn(&env),
            port,
        }
    }

    fn code(&self, path: &str) -> Option<u16> {
        http_get(self.port, path).map(|(c, _)| c)
    }

    fn ha_active(&self) -> Option<f64> {
        http_get(self.port, "/metrics").and_then(|(_, body)| metric(&body, "walbox_ha_active"))
    }
}

/// The index of the one member answering `/active` 200, when exactly one does.
fn the_active(members: &[Member]) -> Option<usize> {
    let active: Vec<usize> = (0..members.len())
        .filter(|&i| members[i].code("/active") == Some(200))
        .collect();
    (active.len() == 1).then(|| active[0])
}

#[test]
fn a_standby_takes_over_within_the_bound_after_each_sigkill_and_nothing_is_missing() {
    let db = TestDb::new("ha_kill");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 4);
    db.create_slot_and_publication(&slot);
    let env = walbox_env(&db, &slot, &broker.bootstrap_servers());

    let mut members = vec![Member::spawn(&env)];
    wait_until(WAIT, "the first walbox to stream", || {
        members[0].code("/active") == Some(200) && db.streaming(&slot)
    });
    members.push(Member::spawn(&env));
    let first_pid = members[0].walbox.pid();
    wait_until(WAIT, "the second walbox to wait as a standby", || {
        members[1]
            .walbox
            .log()
            .contains("standby: another walbox relays this slot")
    });
    // The standby is healthy and ready (to take over), but not active, and says for whom it waits.
    assert_eq!(members[1].code("/healthz"), Some(200));
    assert_eq!(members[1].code("/readyz"), Some(200));
    assert_eq!(members[1].code("/active"), Some(503));
    assert_eq!(members[1].ha_active(), Some(0.0));
    assert_eq!(members[0].ha_active(), Some(1.0));
    let log = members[1].walbox.log();
    assert!(
        log.contains("walbox leader") && log.contains(&format!("pid {first_pid}")),
        "the standby names the active process (pid {first_pid}):\n{log}"
    );

    // A writer streams 20,000 events while the active walbox is killed again and again.
    let (written, writer) = random_writer(
        &db,
        &topic,
        RandomWrites {
            seed: 23,
            total: 20_000,
            max_rows: 50,
            aggregates: 50,
            other_table_one_in: None,
        },
    );
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let mut takeovers = Vec::new();
    for round in 0..4 {
        // Let the active one relay something in this round.
        let seen = distinct_ids(&reader.records).len();
        reader.poll_until(WAIT, |r| r.len() > seen || writer.is_finished());
        let active = the_active(&members).expect("exactly one active walbox");
        let standby = 1 - active;
        let killed_at = Instant::now();
        members[active].walbox.kill();
        wait_until(WAIT, "the standby to take over and stream", || {
            members[standby].code("/active") == Some(200) && db.streaming(&slot)
        });
        let took = killed_at.elapsed();
        takeovers.push(took);
        assert!(
            took <= TAKEOVER_BOUND,
            "round {round}: takeover took {took:?} (bound {TAKEOVER_BOUND:?}); log:\n{}",
            members[standby].walbox.log()
        );
        assert!(
            members[standby].walbox.log().contains("took over"),
            "{}",
            members[standby].walbox.log()
        );
        // A new standby replaces the killed process.
        members[active] = Member::spawn(&env);
        wait_until(WAIT, "the new process to wait as a standby", || {
            members[active].code("/readyz") == Some(200)
                && members[active].code("/active") == Some(503)
        });
    }
    eprintln!("takeovers after SIGKILL: {takeovers:?}");
    writer.join().expect("writer");

    let all: HashSet<i64> = written
        .lock()
        .unwrap()
        .iter()
        .flat_map(|w| w.ids.iter().copied())
        .collect();
    assert!(
        reader.poll_until(WAIT * 2, |r| distinct_ids(r).len() >= all.len()),
        "{} of {} events arrived",
        distinct_ids(&reader.records).len(),
        all.len()
    );
    assert_eq!(
        distinct_ids(&reader.records),
        all,
        "every committed event, nothing else"
    );
    assert_per_aggregate_commit_order(&reader.records);
    for m in &mut members {
        m.walbox.terminate();
    }
    for m in &mut members {
        assert!(m.walbox.wait_exit(WAIT).success(), "{}", m.walbox.log());
    }
}

#[test]
fn a_partitioned_active_walbox_loses_its_role_to_the_standby_within_the_bound() {
    let db = TestDb::new("ha_part");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 2);
    db.create_slot_and_publication(&slot);
    let env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    // The first process reaches PostgreSQL through a proxy that can partition it.
    let proxy = Proxy::start(db.addr()).expect("proxy");
    let mut env_a = env.clone();
    env_a.retain(|(k, _)| k != "WALBOX_POSTGRES_URL");
    env_a.push(("WALBOX_POSTGRES_URL".into(), db.url_via(proxy.port(), 3)));
    env_a.push(("WALBOX_RELAY_SHUTDOWN_TIMEOUT".into(), "2s".into()));
    let mut members = vec![Member::spawn(&env_a)];
    wait_until(WAIT, "the first walbox to stream", || {
        members[0].code("/active") == Some(200) && db.streaming(&slot)
    });
    members.push(Member::spawn(&env));
    wait_until(WAIT, "the second walbox to wait as a standby", || {
        members[1].code("/readyz") == Some(200) && members[1].code("/active") == Some(503)
    });
    let mut ids = HashSet::new();
    let aggs: Vec<String> = (0..100).map(|i| format!("agg-{}", i % 7)).collect();
    ids.extend(write_txn(&db, &topic, &aggs, false).ids);
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    assert!(reader.poll_until(WAIT, |r| distinct_ids(r).len() >= 100));

    // docs/guarantees.md: within wal_sender_timeout + 10 s.
    let wal_sender_timeout: u64 = db
        .sql("SELECT setting FROM pg_settings WHERE name = 'wal_sender_timeout'")
        .trim()
        .parse::<u64>()
        .expect("wal_sender_timeout in ms")
        / 1000;
    let bound = Duration::from_secs(wal_sender_timeout + 10);
    let partitioned_at = Instant::now();
    proxy.partition();
    ids.extend(write_txn(&db, &topic, &aggs, false).ids);
    wait_until(bound + WAIT, "the standby to take over and stream", || {
        members[1].code("/active") == Some(200) && db.streaming(&slot)
    });
    let took = partitioned_at.elapsed();
    eprintln!("takeover after a partition: {took:?} (bound {bound:?})");
    assert!(took <= bound, "takeover took {took:?}, bound {bound:?}");
    // The partitioned process noticed by itself and stepped down.
    wait_until(WAIT, "the partitioned walbox to step down", || {
        members[0].code("/active") == Some(503)
    });
    assert!(
        members[0].walbox.log().contains("lost the leader lock"),
        "{}",
        members[0].walbox.log()
    );
    ids.extend(write_txn(&db, &topic, &aggs, false).ids);

    // The partition heals: the old active process stays a standby of the new one.
    proxy.set(Mode::Pass);
    let new_pid = members[1].walbox.pid();
    wait_until(
        WAIT,
        "the healed process to wait for the new active one",
        || {
            members[0].walbox.log().lines().any(|l| {
                l.contains("standby: another walbox") && l.contains(&format!("pid {new_pid}"))
            })
        },
    );
    assert_eq!(members[0].code("/active"), Some(503));
    assert_eq!(members[0].ha_active(), Some(0.0));
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).len() >= ids.len()),
        "{} of {} events arrived",
        distinct_ids(&reader.records).len(),
        ids.len()
    );
    assert_eq!(
        distinct_ids(&reader.records),
        ids,
        "every committed event, nothing else"
    );
    assert_per_aggregate_commit_order(&reader.records);
    for m in &mut members {
        m.walbox.terminate();
    }
    for m in &mut members {
        assert!(m.walbox.wait_exit(WAIT).success(), "{}", m.walbox.log());
    }
}

/// Exactly-once with a hot standby: the first process loses the slot (partitioned from
/// PostgreSQL), the standby commits further, and the first takes the slot back when the
/// standby is partitioned in turn. It trusts the progress record the standby committed, so
/// nothing is sent again: a `read_committed` reader on Apache Kafka sees each event once (the
/// mock cluster also shows aborted transactions' records, so there only the set is checked).
#[test]
fn a_process_taking_its_slot_back_trusts_what_the_standby_committed_meanwhile() {
    let db = TestDb::new("ha_eos_back");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 2);
    db.create_slot_and_publication(&slot);
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    env.push(("WALBOX_KAFKA_EXACTLY_ONCE".into(), "true".into()));
    env.push(("WALBOX_RELAY_SHUTDOWN_TIMEOUT".into(), "2s".into()));
    let proxies = [
        Proxy::start(db.addr()).expect("proxy"),
        Proxy::start(db.addr()).expect("proxy"),
    ];
    let via = |proxy: &Proxy| {
        let mut e = env.clone();
        e.retain(|(k, _)| k != "WALBOX_POSTGRES_URL");
        e.push(("WALBOX_POSTGRES_URL".into(), db.url_via(proxy.port(), 3)));
        e
    };
    let mut members = vec![Member::spawn(&via(&proxies[0]))];
    wait_until(WAIT, "the first walbox to stream", || {
        members[0].code("/active") == Some(200) && db.streaming(&slot)
    });
    members.push(Member::spawn(&via(&proxies[1])));
    wait_until(WAIT, "the second walbox to wait as a standby", || {
        members[1].code("/readyz") == Some(200) && members[1].code("/active") == Some(503)
    });
    // docs/guarantees.md: a partitioned active process is replaced within wal_sender_timeout
    // + 10 s.
    let wal_sender_timeout: u64 = db
        .sql("SELECT setting FROM pg_settings WHERE name = 'wal_sender_timeout'")
        .trim()
        .parse::<u64>()
        .expect("wal_sender_timeout in ms");
    let takeover = Duration::from_millis(wal_sender_timeout) + Duration::from_secs(10) + WAIT;
    let aggs: Vec<String> = (0..50).map(|i| format!("agg-{}", i % 7)).collect();
    let mut ids = HashSet::new();
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let mut hand_over = |from: usize, to: usize, ids: &mut HashSet<i64>| {
        ids.extend(write_txn(&db, &topic, &aggs, false).ids);
        assert!(
            reader.poll_until(WAIT, |r| distinct_ids(r).len() >= ids.len()),
            "{}",
            members[from].walbox.log()
        );
        proxies[from].partition();
        proxies[to].set(Mode::Pass);
        wait_until(takeover, "the other walbox to take over and stream", || {
            members[to].code("/active") == Some(200) && db.streaming(&slot)
        });
    };
    hand_over(0, 1, &mut ids);
    hand_over(1, 0, &mut ids);
    ids.extend(write_txn(&db, &topic, &aggs, false).ids);
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).len() >= ids.len()),
        "{} of {} events arrived",
        distinct_ids(&reader.records).len(),
        ids.len()
    );
    assert_eq!(distinct_ids(&reader.records), ids, "every committed event");
    assert!(
        !members[0]
            .walbox
            .log()
            .contains("lies beyond the last one this process committed"),
        "the first process distrusted the standby's progress record: {}",
        members[0].walbox.log()
    );
    if support::kafka::apache().is_some() {
        let mut all = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
        all.read_to_end(WAIT).unwrap();
        assert_eq!(all.records.len(), ids.len(), "each event once");
    }
    assert_per_aggregate_commit_order(&reader.records);
    for m in &mut members {
        m.walbox.terminate();
    }
}
