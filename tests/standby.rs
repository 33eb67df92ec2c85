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
use walbox::sandbox::postgres::{PgCluster, PgClusterOptions};
use walbox::sandbox::standby::StandbyOptions;

use crate::support::events::{assert_per_aggregate_commit_order, distinct_ids, write_txn, Written};
use crate::support::standby::{clusters, old_pair};
use crate::support::{self, wait_until, walbox_env, TestDb, Walbox, WAIT};

/// Events the writer commits on the primary during the crash test.
const EVENTS: usize = 10_000;

/// A database on `primary` with its publication, and the same database on `standby`
/// once the standby has replayed both.
fn database_on(
    primary: &'static PgCluster,
    standby: &'static PgCluster,
    tag: &str,
) -> (TestDb, TestDb) {
    let db = TestDb::on(primary, tag);
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
    let (shared, _exclusive) = clusters();
    let standby = &shared.standby;
    let (db, replica) = database_on(&shared.primary, standby, "standby");
    let version: u32 = replica.sql("SHOW server_version_num").parse().unwrap();
    assert!(
        version >= 160_000,
        "decoding on a standby needs 16+, this is {version}"
    );
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 4);
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
            wait_until(
                WAIT,
                "walbox to stream again after the standby restart",
                || replica.streaming(&slot),
            );
            // The replication session or the leader lock's connection notices first.
            let log = walbox.log();
            assert!(
                log.contains("reconnecting") || log.contains("lost the leader lock"),
                "walbox noticed the restart: {log}"
            );
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
    // Streaming before anything is checked: what arrived may all be from earlier processes,
    // and a SIGTERM before walbox's handlers are installed would end it by the signal.
    wait_until(WAIT, "walbox to stream from the standby", || {
        replica.streaming(&slot)
    });
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
    let out = Command::new(env!("CARGO_BIN_EXE_walbox"))
        .arg("status")
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("server") && l.contains("standby"))
            && text.contains("replayed WAL LSN"),
        "{text}"
    );
}

/// Runs walbox with `env` until it exits; returns (exit code, its output).
fn run_to_exit(env: &[(String, String)]) -> (i32, String) {
    let mut w = Walbox::spawn(env);
    let status = w.wait_exit(WAIT);
    (status.code().unwrap_or(-1), w.log())
}

/// The one-line error a refused start ends with, checked to be the last line and free of the
/// superuser's password.
fn fatal_line(code: i32, log: &str, password: &str) -> String {
    assert_eq!(code, 5, "{log}");
    assert!(!log.contains(password), "a password in the output:\n{log}");
    log.lines().last().unwrap_or_default().to_owned()
}

#[test]
fn a_standby_that_cannot_decode_is_refused_with_the_fix() {
    let (shared, _exclusive) = clusters();
    let broker = support::broker();
    let password = shared.primary.password().to_owned();
    let env_for = |url: String, primary_url: Option<String>| {
        let (db, replica) = database_on(&shared.primary, &shared.no_feedback, "refused");
        let mut env = walbox_env(&replica, &db.name, &broker.bootstrap_servers());
        set(&mut env, "WALBOX_POSTGRES_URL", url);
        if let Some(p) = primary_url {
            set(&mut env, "WALBOX_POSTGRES_PRIMARY_URL", p);
        }
        env
    };

    // hot_standby_feedback = off on the standby.
    let (code, log) = run_to_exit(&env_for(shared.no_feedback.url("postgres"), None));
    let line = fatal_line(code, &log, &password);
    assert!(
        line.contains("hot_standby_feedback is off")
            && line.contains("set hot_standby_feedback = on")
            && line.contains("pg_reload_conf()"),
        "{line}"
    );

    // A PostgreSQL 15 standby; and a primary_url whose wal_level is not logical.
    let (old_primary, old_standby) = old_pair();
    let (code, log) = run_to_exit(&env_for(old_standby.url("postgres"), None));
    let line = fatal_line(code, &log, old_standby.password());
    assert!(
        line.contains("standby running PostgreSQL 15") && line.contains("needs PostgreSQL 16"),
        "{line}"
    );
    let (code, log) = run_to_exit(&env_for(
        shared.standby.url("postgres"),
        Some(old_primary.url("postgres")),
    ));
    let line = fatal_line(code, &log, old_primary.password());
    assert!(
        line.contains("wal_level is \"replica\" on the primary")
            && line.contains("set wal_level = logical"),
        "{line}"
    );
}

#[test]
fn without_primary_url_slot_creation_says_what_to_run_on_the_primary() {
    let (shared, _exclusive) = clusters();
    let (db, replica) = database_on(&shared.primary, &shared.standby, "hint");
    let slot = db.name.clone();
    let broker = support::broker();
    let mut env = walbox_env(&replica, &slot, &broker.bootstrap_servers());
    env.push(("WALBOX_SLOT_HEARTBEAT_INTERVAL".into(), "100ms".into()));
    // An open transaction on the primary: no running-transactions record written before it
    // ends lets the slot's creation finish, so walbox is still waiting when the hint is due.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (client, conn) = rt
        .block_on(tokio_postgres::connect(&db.url(), tokio_postgres::NoTls))
        .expect("connect to the primary");
    rt.spawn(conn);
    rt.block_on(client.batch_execute("BEGIN; SELECT txid_current();"))
        .unwrap();

    let walbox = Walbox::spawn(&env);
    let hint = "run on the primary: SELECT pg_log_standby_snapshot();";
    wait_until(WAIT, "walbox to say what to run on the primary", || {
        walbox.log().contains(hint)
    });
    assert!(!replica.streaming(&slot), "{}", walbox.log());
    // Doing what it says (once the open transaction ended) lets the creation finish.
    rt.block_on(client.batch_execute("COMMIT")).unwrap();
    wait_until(WAIT, "the slot's creation to finish", || {
        db.sql("SELECT pg_log_standby_snapshot()");
        replica.streaming(&slot)
    });
    assert_eq!(
        walbox.log().matches(hint).count(),
        1,
        "said once: {}",
        walbox.log()
    );

    // No heartbeats without primary_url (said once); the slot still advances on keepalives
    // while the primary writes other tables.
    let lsn: Lsn = db
        .sql("INSERT INTO payments (wallet_id, amount) VALUES ('w', 1); SELECT pg_current_wal_insert_lsn();")
        .parse()
        .unwrap();
    wait_until(
        WAIT,
        "the idle slot to confirm past the other table's writes",
        || replica.confirmed(&slot) >= lsn,
    );
    let no_heartbeats = "no heartbeats; the slot advances on keepalives alone";
    assert_eq!(
        walbox.log().matches(no_heartbeats).count(),
        1,
        "{}",
        walbox.log()
    );
    // The slot retains the standby's WAL (its max_slot_wal_keep_size is -1): the warning says
    // whose disk fills.
    let log = walbox.log();
    assert!(
        log.contains("max_slot_wal_keep_size = -1")
            && log.contains("until the standby's disk is full")
            && !log.contains("primary's disk"),
        "{log}"
    );
}

#[test]
fn a_slot_the_standby_invalidates_stops_walbox_with_exit_7() {
    // A pair of its own: no other standby may hold the primary's horizon back.
    let major = crate::support::standby::standby_major();
    let primary: &'static PgCluster = Box::leak(Box::new(
        PgCluster::start(walbox::sandbox::postgres::PgClusterOptions {
            watchdog: true,
            major: Some(major),
            ..Default::default()
        })
        .expect("primary"),
    ));
    let standby: &'static PgCluster = Box::leak(Box::new(
        primary
            .start_standby(walbox::sandbox::standby::StandbyOptions {
                watchdog: true,
                ..Default::default()
            })
            .expect("standby"),
    ));
    let (db, replica) = database_on(primary, standby, "invalidated");
    let slot = db.name.clone();
    let broker = support::broker();
    let mut env = walbox_env(&replica, &slot, &broker.bootstrap_servers());
    set(
        &mut env,
        "WALBOX_POSTGRES_CREATE_PUBLICATION",
        "false".into(),
    );
    env.push(("WALBOX_POSTGRES_PRIMARY_URL".into(), db.url()));
    env.push(("WALBOX_SLOT_CHECK_INTERVAL".into(), "100ms".into()));
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream from the standby", || {
        replica.streaming(&slot)
    });

    // Feedback off: the primary's vacuum no longer spares the catalog rows the slot needs.
    replica.sql("ALTER SYSTEM SET hot_standby_feedback = off; SELECT pg_reload_conf();");
    let physical = replica.sql("SHOW primary_slot_name");
    wait_until(WAIT, "the primary to forget the standby's horizon", || {
        db.sql(&format!(
            "SELECT xmin IS NULL AND catalog_xmin IS NULL FROM pg_replication_slots WHERE slot_name = '{physical}'"
        )) == "t"
    });
    wait_until(WAIT, "walbox to stop", || {
        if walbox.running() {
            db.sql("CREATE TABLE gone (a int);\nDROP TABLE gone;\nVACUUM pg_class;");
        }
        !walbox.running()
    });
    let status = walbox.wait_exit(WAIT);
    let line = walbox.last_line();
    assert_eq!(status.code(), Some(7), "{}", walbox.log());
    assert!(
        line.contains("is lost") && line.contains("conflicted with recovery"),
        "{line}"
    );
    let wal_status =
        format!("SELECT wal_status FROM pg_replication_slots WHERE slot_name = '{slot}'");
    assert_eq!(replica.sql(&wal_status), "lost");

    // The way out works on the standby too (the new slot waits for the primary's snapshot,
    // asked for through primary_url).
    let out = Command::new(env!("CARGO_BIN_EXE_walbox"))
        .args(["recreate-slot", "--confirm-data-loss"])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("recreated replication slot"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(replica.sql(&wal_status), "reserved");
}

/// `walbox_heartbeats_received_total` on `port` (0 while the listener is not up).
fn heartbeats_received(port: u16) -> f64 {
    support::http_get(port, "/metrics")
        .and_then(|(_, body)| support::metric(&body, "walbox_heartbeats_received_total"))
        .unwrap_or(0.0)
}

#[test]
fn after_the_standby_is_promoted_heartbeats_go_to_it_not_to_the_old_primary() {
    // Its own pair: the standby is promoted, the primary crashed.
    let major = crate::support::standby::standby_major();
    let primary: &'static PgCluster =
        Box::leak(Box::new(support::start_cluster(PgClusterOptions {
            major: Some(major),
            watchdog: true,
            ..Default::default()
        })));
    let standby: &'static PgCluster = Box::leak(Box::new(
        primary
            .start_standby(StandbyOptions {
                watchdog: true,
                ..Default::default()
            })
            .expect("start the standby"),
    ));
    let (db, replica) = database_on(primary, standby, "promoted");
    let slot = db.name.clone();
    let broker = support::broker();
    let port = support::free_port();
    let mut env = walbox_env(&replica, &slot, &broker.bootstrap_servers());
    env.push(("WALBOX_POSTGRES_PRIMARY_URL".into(), db.url()));
    env.push(("WALBOX_SLOT_HEARTBEAT_INTERVAL".into(), "100ms".into()));
    set(&mut env, "WALBOX_SLOT_CHECK_INTERVAL", "100ms".into());
    set(&mut env, "WALBOX_HTTP_LISTEN", format!("127.0.0.1:{port}"));
    let walbox = Walbox::spawn(&env);
    wait_until(WAIT, "heartbeats through the primary", || {
        replica.streaming(&slot) && heartbeats_received(port) >= 2.0
    });

    primary.crash().expect("crash the primary");
    standby.promote().expect("promote the standby");
    wait_until(WAIT, "the standby to leave recovery", || {
        replica.sql("SELECT pg_is_in_recovery()") == "f"
    });
    // Heartbeats written on the new primary come back through its slot.
    let before = heartbeats_received(port);
    wait_until(WAIT, "heartbeats through the promoted standby", || {
        heartbeats_received(port) >= before + 3.0
    });
    let log = walbox.log();
    assert_eq!(
        log.matches("postgres.url is no longer a standby").count(),
        1,
        "said once; log:\n{log}"
    );
}

#[test]
fn exactly_once_on_a_standby_restarted_with_a_wal_backlog_sends_nothing_twice() {
    let (shared, _exclusive) = clusters();
    let standby = &shared.standby;
    let (db, replica) = database_on(&shared.primary, standby, "eos_standby");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 4);
    if !crate::exactly_once::transactions_supported(&broker) {
        return;
    }
    let mut env =
        crate::exactly_once::eos_env(&replica, &slot, &broker.bootstrap_servers(), "10ms");
    // A progress topic of its own: another test's open transaction on the shared one would
    // hide the records this test's start-ups read back.
    env.push((
        "WALBOX_KAFKA_PROGRESS_TOPIC".into(),
        support::own_progress_topic(&broker, &slot),
    ));
    env.push(("WALBOX_POSTGRES_PRIMARY_URL".into(), db.url()));
    env.push(("WALBOX_POSTGRES_RECEIVE_TIMEOUT".into(), "5s".into()));
    // No page written between restart points: the standby's minimum recovery point stays
    // at its last one (the background writer would otherwise move it past the last events).
    let bgwriter = |pages: &str| {
        standby
            .psql(
                "postgres",
                &format!(
                    "ALTER SYSTEM SET bgwriter_lru_maxpages = {pages}; SELECT pg_reload_conf();"
                ),
            )
            .expect("set bgwriter_lru_maxpages")
    };
    bgwriter("0");
    let mut walbox = Walbox::spawn(&env);
    wait_until(
        WAIT,
        "walbox to create its slot on the standby and stream",
        || replica.streaming(&slot),
    );
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let aggregates: Vec<String> = (0..20).map(|i| format!("agg-{i}")).collect();
    let mut ids: HashSet<i64> = HashSet::new();
    ids.extend(write_txn(&db, &topic, &aggregates, false).ids);
    for _ in 0..5 {
        ids.extend(write_txn(&db, &topic, &aggregates, false).ids);
    }
    let last: Lsn = db.sql("SELECT pg_current_wal_lsn()").parse().unwrap();
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).len() == ids.len()),
        "{} of {} events before the restart; log:\n{}",
        distinct_ids(&reader.records).len(),
        ids.len(),
        walbox.log()
    );
    wait_until(WAIT, "the standby's slot to confirm every event", || {
        replica.confirmed(&slot) >= last
    });

    // The standby crashes and comes back, walbox with it (one host, one restart); the new
    // walbox connects as soon as the standby takes connections, before it has replayed its
    // own WAL to the last commits.
    // The slot's position on disk is that of the standby's last restart point: only the
    // progress record says that everything up to `last` is in Kafka.
    walbox.kill();
    // After the restart, the standby replays the last commits only 3 s after they were made.
    replica.sql("ALTER SYSTEM SET recovery_min_apply_delay = '3s'");
    standby.crash().expect("crash the standby");
    standby.start_again().expect("start the standby again");
    // Its catalog first (the test's table, replayed from the last restart point): a standby that
    // does not show the outbox yet is refused as a missing table, not what is tested here.
    wait_until(WAIT, "the standby to show the outbox table again", || {
        replica.try_sql("SELECT count(*) FROM outbox").is_ok()
    });
    let mut walbox = Walbox::spawn(&env);
    let deadline = std::time::Instant::now() + WAIT;
    while !replica.streaming(&slot) {
        assert!(
            std::time::Instant::now() < deadline,
            "walbox does not stream again after the standby restart; log:\n{}",
            walbox.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    ids.extend(write_txn(&db, &topic, &aggregates, false).ids);
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).len() == ids.len()),
        "{} of {} events after the restart; log:\n{}",
        distinct_ids(&reader.records).len(),
        ids.len(),
        walbox.log()
    );
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    bgwriter("DEFAULT");
    replica.sql("ALTER SYSTEM RESET recovery_min_apply_delay; SELECT pg_reload_conf();");
    reader.read_to_end(WAIT).unwrap();
    let twice =
        crate::support::events::ids_twice(reader.records.iter().map(crate::support::events::id_of));
    assert!(
        twice.is_empty(),
        "{} events sent twice after the standby restart; log:\n{}",
        twice.len(),
        walbox.log()
    );
}
