//! Losing the primary: several hosts in `postgres.url` (`target_session_attrs`), failover slots
//! (`postgres.failover_slot`, PostgreSQL 17+), and a real promotion: a primary with a physical
//! standby that synchronizes the slot (`sync_replication_slots`), the primary crashed mid-stream
//! while a writer commits, the standby promoted, walbox carrying on from the synchronized slot.
//! What the new primary's outbox holds is exactly what Kafka holds: nothing missing, and no
//! event from a commit the standby never received (`synchronized_standby_slots`). Without a
//! synchronized slot (every major before 17), the same promotion must stop walbox with exit 7
//! rather than let it create a slot on the new primary, and the runbook then recovers the gap.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use walbox::sandbox::broker::{read_topics, TopicReader};
use walbox::sandbox::postgres::{PgCluster, PgClusterOptions};
use walbox::sandbox::standby::StandbyOptions;

use crate::support::events::{assert_per_aggregate_commit_order, distinct_ids, outbox_ids};
use crate::support::{
    self, free_port, http_get, metric, since_in, wait_until, walbox_cmd, walbox_env, TestDb,
    Walbox, WebhookReceiver, WAIT,
};

pub(crate) fn set(env: &mut Vec<(String, String)>, key: &str, value: String) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_owned(), value));
}

/// `db`'s URL naming the hosts on `ports`, in that order, with `attrs`.
/// walbox's environment with `postgres.url` listing the standby first, then the primary,
/// under `target_session_attrs=read-write`.
pub(crate) fn standby_first_env(
    db: &TestDb,
    slot: &str,
    broker: &walbox::sandbox::broker::Broker,
    primary: u16,
    standby: u16,
) -> Vec<(String, String)> {
    let mut env = walbox_env(db, slot, &broker.bootstrap_servers());
    set(
        &mut env,
        "WALBOX_POSTGRES_URL",
        multi_host_url(db, primary, &[standby, primary], "read-write"),
    );
    env
}

fn multi_host_url(db: &TestDb, own_port: u16, ports: &[u16], attrs: &str) -> String {
    format!(
        "{}&target_session_attrs={attrs}",
        hosts_url(db, own_port, ports)
    )
}

/// `db`'s URL naming the hosts on `ports`, in that order, without `target_session_attrs`.
fn hosts_url(db: &TestDb, own_port: u16, ports: &[u16]) -> String {
    let direct = format!("127.0.0.1:{own_port}/");
    let url = db.url();
    assert!(url.contains(&direct), "{url}");
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    format!(
        "{}&connect_timeout=2",
        url.replace(&direct, &format!("{}/", hosts.join(",")))
    )
}

/// The major of the failover-slot tests: `WALBOX_TEST_PG` from 17 on, 17 by default; `None`
/// (with the reason printed) on an older major, whose matrix run leaves them to 17 and 18.
pub(crate) fn failover_major() -> Option<u32> {
    match support::test_major() {
        Some(m) if m < 17 => {
            println!("skipped on PostgreSQL {m}: failover slots need 17 (the matrix's 17 and 18 runs exercise this test)");
            None
        }
        Some(m) => Some(m),
        None => Some(17),
    }
}

/// A primary of `major` and a standby of it that synchronizes failover slots.
pub(crate) fn synchronizing_pair(major: u32) -> (&'static PgCluster, &'static PgCluster) {
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
                settings: vec![("sync_replication_slots".into(), "on".into())],
            })
            .expect("start the standby"),
    ));
    (primary, standby)
}

/// Waits until `replica` (the standby of `db`) holds `slot` synchronized and persistent: only
/// then does it survive a promotion. Asks `db` for running-transactions records meanwhile.
pub(crate) fn wait_for_synchronized_slot(db: &TestDb, replica: &TestDb, slot: &str) {
    wait_until(WAIT, "the standby to hold the synchronized slot", || {
        let _ = db.try_sql("SELECT pg_log_standby_snapshot()");
        replica
            .try_sql(&format!(
                "SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = '{slot}'"
            ))
            .is_ok_and(|v| v == "t")
    });
}

/// A primary of `major` with its slot-synchronizing standby, a database on it named after `tag`
/// (and the same on the standby), its slot name, and a topic of `partitions` on the broker.
pub(crate) struct Pair {
    pub primary: &'static PgCluster,
    pub standby: &'static PgCluster,
    pub db: TestDb,
    pub replica: TestDb,
    pub slot: String,
    pub topic: String,
    pub broker: walbox::sandbox::broker::Broker,
}

pub(crate) fn pair(major: u32, tag: &str, partitions: i32) -> Pair {
    let (primary, standby) = synchronizing_pair(major);
    let db = TestDb::on(primary, tag);
    let replica = db.on_standby(standby);
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, partitions);
    Pair {
        primary,
        standby,
        db,
        replica,
        slot,
        topic,
        broker,
    }
}

/// One outbox row per transaction, on whichever server `db` names; `None` when the commit
/// failed (the server is down or read-only).
/// Waits until `walbox` streams from `db` (reached as `host`), inserts one event and waits for
/// it in Kafka: the event's id, and the reader that saw it.
fn relays_one_event(
    db: &TestDb,
    slot: &str,
    topic: &str,
    broker: &walbox::sandbox::broker::Broker,
    walbox: &Walbox,
    host: &str,
) -> (i64, TopicReader) {
    wait_until(WAIT, &format!("walbox to stream from {host}"), || {
        db.streaming(slot)
    });
    let id = insert(db, topic, 1).expect("insert");
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[topic], WAIT).unwrap();
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).contains(&id)),
        "the event arrived; log:\n{}",
        walbox.log()
    );
    (id, reader)
}

fn insert(db: &TestDb, topic: &str, n: u32) -> Option<i64> {
    db.try_sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) \
         VALUES ('agg-{}', '{topic}', 'thing.happened', '{{}}') RETURNING id;",
        n % 7
    ))
    .ok()
    .and_then(|out| out.lines().next()?.trim().parse().ok())
}

#[test]
fn a_promoted_standby_carries_the_stream_on_with_nothing_missing_and_nothing_phantom() {
    // Failover slots are 17+: the default run uses 17's binaries, a matrix run on an older
    // major leaves this test to the 17 and 18 runs.
    let Some(major) = failover_major() else {
        return;
    };
    let (primary, standby) = synchronizing_pair(major);
    // No change reaches walbox before the standby has it: the primary's walsender waits for the
    // standby's physical slot.
    let physical = standby
        .psql("postgres", "SHOW primary_slot_name;")
        .unwrap()
        .trim()
        .to_owned();
    primary
        .psql(
            "postgres",
            &format!(
                "ALTER SYSTEM SET synchronized_standby_slots = '{physical}'; SELECT pg_reload_conf();"
            ),
        )
        .unwrap();

    let db = TestDb::on(primary, "failover");
    let replica = db.on_standby(standby);
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 3);
    wait_until(WAIT, "the standby to replay the outbox table", || {
        replica.try_sql("SELECT count(*) FROM outbox").is_ok()
    });

    // A failover slot belongs on the primary: pointed at the standby alone, walbox refuses.
    let mut on_standby = walbox_env(&db, &slot, &broker.bootstrap_servers());
    set(&mut on_standby, "WALBOX_POSTGRES_URL", replica.url());
    set(
        &mut on_standby,
        "WALBOX_POSTGRES_FAILOVER_SLOT",
        "true".into(),
    );
    let (code, out) = walbox_cmd(&["run"], &on_standby);
    assert_eq!(code, 5, "{out}");
    assert!(
        out.contains("postgres.failover_slot applies to a slot on the primary, but postgres.url names a standby"),
        "{out}"
    );

    // The standby is listed first: read-write passes it over while it is in recovery.
    let mut env = standby_first_env(&db, &slot, &broker, primary.port(), standby.port());
    set(&mut env, "WALBOX_POSTGRES_FAILOVER_SLOT", "true".into());
    set(&mut env, "WALBOX_POSTGRES_RECEIVE_TIMEOUT", "5s".into());
    let port = free_port();
    set(&mut env, "WALBOX_HTTP_LISTEN", format!("127.0.0.1:{port}"));
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream from the primary", || {
        db.streaming(&slot)
    });
    assert_eq!(
        db.sql(&format!(
            "SELECT failover FROM pg_replication_slots WHERE slot_name = '{slot}'"
        )),
        "t",
        "walbox created a failover slot"
    );

    // The preflight agrees: a failover slot, and the standby's slot named and active.
    let (_, stdout) = walbox_cmd(&["check"], &env);
    let line = stdout
        .lines()
        .find(|l| l.contains("failover slot  "))
        .unwrap_or_else(|| panic!("no failover slot check in:\n{stdout}"));
    assert!(
        line.starts_with("ok")
            && line.contains(&format!(
                "the slot is a failover slot; synchronized_standby_slots = {physical}"
            )),
        "{line}"
    );

    // A writer commits on whichever server accepts writes, throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let committed: Arc<Mutex<Vec<i64>>> = Arc::default();
    let writer = {
        let (dbs, topic, stop, committed) = (
            [db.clone(), replica.clone()],
            topic.clone(),
            stop.clone(),
            committed.clone(),
        );
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                for db in &dbs {
                    if let Some(id) = insert(db, &topic, n) {
                        committed.lock().unwrap().push(id);
                        n += 1;
                        break;
                    }
                }
            }
        })
    };
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    assert!(
        reader.poll_until(WAIT, |r| r.len() > 200),
        "events before the failover; log:\n{}",
        walbox.log()
    );

    // The slot survives a promotion only once the standby holds it synchronized and persisted.
    wait_for_synchronized_slot(&db, &replica, &slot);

    let before = committed.lock().unwrap().len();
    primary.crash().expect("crash the primary");
    standby.promote().expect("promote the standby");
    wait_until(WAIT, "walbox to stream from the promoted standby", || {
        replica.streaming(&slot)
    });
    let after = committed.lock().unwrap().len();
    wait_until(WAIT, "commits on the new primary", || {
        committed.lock().unwrap().len() > after + 100
    });
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");

    // What the new primary holds is the truth: every commit acknowledged by the old primary
    // but never received by the standby is gone, and must not be in Kafka either.
    let truth = outbox_ids(&replica);
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).len() >= truth.len()),
        "{} of {} events arrived; log:\n{}",
        distinct_ids(&reader.records).len(),
        truth.len(),
        walbox.log()
    );
    let seen = distinct_ids(&reader.records);
    let missing: Vec<_> = truth.difference(&seen).collect();
    let phantom: Vec<_> = seen.difference(&truth).collect();
    assert!(
        missing.is_empty() && phantom.is_empty(),
        "missing {missing:?}, phantom {phantom:?}; log:\n{}",
        walbox.log()
    );
    assert_per_aggregate_commit_order(&reader.records);
    println!(
        "failover on PostgreSQL {major}: {} events, {before} committed before the crash, {} on record in the new primary",
        seen.len(),
        truth.len()
    );
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

#[test]
fn a_dead_first_host_is_passed_over() {
    let db = TestDb::new("multihost");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 1);
    let own = db.addr().port();
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    set(
        &mut env,
        "WALBOX_POSTGRES_URL",
        multi_host_url(&db, own, &[free_port(), own], "any"),
    );
    let mut walbox = Walbox::spawn(&env);
    relays_one_event(&db, &slot, &topic, &broker, &walbox, "the second host");
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

#[test]
fn failover_slot_before_17_stops_or_turns_an_existing_slot_into_one() {
    let db = TestDb::new("fslot");
    let slot = db.name.clone();
    let broker = support::broker();
    db.create_slot_and_publication(&slot);
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    set(&mut env, "WALBOX_POSTGRES_FAILOVER_SLOT", "true".into());
    let mut walbox = Walbox::spawn(&env);
    if support::major() < 17 {
        let status = walbox.wait_exit(WAIT);
        assert_eq!(status.code(), Some(5), "{}", walbox.log());
        assert!(
            walbox
                .log()
                .contains("postgres.failover_slot needs PostgreSQL 17 or newer"),
            "{}",
            walbox.log()
        );
        return;
    }
    wait_until(WAIT, "walbox to stream", || db.streaming(&slot));
    assert_eq!(
        db.sql(&format!(
            "SELECT failover FROM pg_replication_slots WHERE slot_name = '{slot}'"
        )),
        "t",
        "the existing slot became a failover slot; log:\n{}",
        walbox.log()
    );
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

#[test]
fn a_promotion_without_a_synchronized_slot_stops_walbox_with_exit_7_and_the_runbook() {
    // Every major: before 17 a logical slot is never copied to a standby, and from 17 on it is
    // not either without failover slots and sync_replication_slots.
    let primary: &'static PgCluster =
        Box::leak(Box::new(support::start_cluster(support::pg_options())));
    let standby: &'static PgCluster = Box::leak(Box::new(
        primary
            .start_standby(StandbyOptions {
                watchdog: true,
                ..Default::default()
            })
            .expect("start the standby"),
    ));
    let db = TestDb::on(primary, "nofailover");
    let replica = db.on_standby(standby);
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 1);

    let env = standby_first_env(&db, &slot, &broker, primary.port(), standby.port());
    // The standby, listed first, is passed over while it is in recovery.
    let mut walbox = Walbox::spawn(&env);
    let (id, mut reader) = relays_one_event(&db, &slot, &topic, &broker, &walbox, "the primary");
    // The progress topic holds the slot's record: the evidence that it existed.
    let key = format!("/{}/{slot}", db.name);
    let progress = read_topics(
        &broker.bootstrap_servers(),
        &["walbox.progress"],
        WAIT,
        |r| {
            r.iter().any(|rec| {
                rec.key
                    .as_deref()
                    .is_some_and(|k| k.ends_with(key.as_bytes()))
            })
        },
    )
    .expect("read the progress topic");
    assert!(
        progress.iter().any(|rec| rec
            .key
            .as_deref()
            .is_some_and(|k| k.ends_with(key.as_bytes()))),
        "no progress record for {key}; log:\n{}",
        walbox.log()
    );
    wait_until(WAIT, "the standby to replay the event", || {
        replica.try_sql(&format!("SELECT count(*) FROM outbox WHERE id = {id}")) == Ok("1".into())
    });

    // The primary dies: the standby answers but is in recovery, so no host will do, and walbox
    // keeps trying (transient), naming each host with its reason.
    primary.crash().expect("crash the primary");
    let standby_label = format!("127.0.0.1:{}: is a standby (in recovery)", standby.port());
    wait_until(WAIT, "walbox to find no host accepting writes", || {
        walbox.log().lines().any(|l| {
            l.contains("no host of postgres.url is a server accepting writes (target_session_attrs=read-write)")
                && l.contains(&format!("127.0.0.1:{}: ", primary.port()))
                && l.contains(&standby_label)
        })
    });
    assert!(walbox.running(), "{}", walbox.log());

    // Promoted, the standby accepts writes but has no slot: walbox does not create one on a
    // guess (events committed after the slot's confirmed position would be skipped silently).
    standby.promote().expect("promote the standby");
    let status = walbox.wait_exit(WAIT);
    let line = walbox.last_line();
    assert_eq!(status.code(), Some(7), "{}", walbox.log());
    assert!(line.contains("existed and is gone"), "{line}");
    assert!(
        line.contains("walbox recreate-slot --confirm-data-loss") && line.contains("Slot lost"),
        "the runbook: {line}"
    );
    assert_eq!(
        replica.sql(&format!(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'"
        )),
        "0",
        "walbox must not create a slot on the promoted standby"
    );

    // The runbook, against the new primary (which the same url now picks): recreate the
    // slot, republish the window, start. A row committed on the new primary while walbox was
    // stopped arrives through republish; then Kafka holds exactly the new primary's outbox.
    let since = since_in(&line);
    let gap = insert(&replica, &topic, 2).expect("insert on the new primary");
    let (code, recreated) = walbox_cmd(&["recreate-slot", "--confirm-data-loss"], &env);
    assert_eq!(code, 0, "{recreated}");
    let republish = [
        "republish",
        "--since",
        &since,
        "--time-column",
        "created_at",
    ];
    let (code, republished) = walbox_cmd(&republish, &env);
    assert_eq!(code, 0, "{republished}");
    let log = walbox.log();
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream from the new primary", || {
        replica.streaming(&slot)
    });
    let later = insert(&replica, &topic, 3).expect("insert on the new primary");
    let truth = outbox_ids(&replica);
    assert!(truth.contains(&id) && truth.contains(&gap) && truth.contains(&later));
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r) == truth),
        "Kafka {:?}, the new primary {truth:?}; log:\n{}",
        distinct_ids(&reader.records),
        walbox.log()
    );
    assert!(
        reader
            .records
            .iter()
            .any(|r| r.header_str("id") == Some(&gap.to_string())
                && r.header_str("walbox.commit_lsn") == Some("0/0")),
        "the row committed while walbox was stopped came from republish"
    );
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    for text in [log, recreated, republished, walbox.log()] {
        assert!(
            !text.contains(primary.password()),
            "the password appeared in walbox's output"
        );
    }
}

#[test]
fn both_hosts_without_session_attrs_reach_the_primary_and_the_synchronized_copy_is_refused_with_the_fix(
) {
    let Some(major) = failover_major() else {
        return;
    };
    let p = pair(major, "bothhosts", 1);
    let (primary, standby, db, replica) = (p.primary, p.standby, p.db, p.replica);
    let (slot, topic, broker) = (p.slot, p.topic, p.broker);
    wait_until(WAIT, "the standby to replay the outbox table", || {
        replica.try_sql("SELECT count(*) FROM outbox").is_ok()
    });

    // Both servers, the standby first, no target_session_attrs: with failover_slot walbox
    // reads them as read-write, so the standby is passed over, in `check` as in `run`.
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    set(
        &mut env,
        "WALBOX_POSTGRES_URL",
        hosts_url(&db, primary.port(), &[standby.port(), primary.port()]),
    );
    set(&mut env, "WALBOX_POSTGRES_FAILOVER_SLOT", "true".into());
    let (_, out) = walbox_cmd(&["check"], &env);
    let line = |name: &str| {
        out.lines()
            .find(|l| {
                l.split_once(' ')
                    .is_some_and(|(_, l)| l.trim_start().starts_with(&format!("{name} ")))
            })
            .unwrap_or_else(|| panic!("no {name} check in:\n{out}"))
            .to_owned()
    };
    assert!(line("server").ends_with("primary"), "{out}");
    let failover = line("failover slot");
    assert!(
        !failover.starts_with("FAIL") && failover.contains("target_session_attrs=read-write"),
        "{failover}"
    );
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream from the primary (or stop)", || {
        db.streaming(&slot) || !walbox.running()
    });
    assert!(walbox.running(), "{}", walbox.log());
    relays_one_event(&db, &slot, &topic, &broker, &walbox, "the primary");

    // The standby holds a synchronized copy of the failover slot.
    wait_for_synchronized_slot(&db, &replica, &slot);
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());

    // Pointed at the standby without failover_slot, walbox may not use that copy: `check`
    // fails the slot and `run` stops with the same words and the way out.
    let on_standby = walbox_env(&replica, &slot, &broker.bootstrap_servers());
    let (code, out) = walbox_cmd(&["check"], &on_standby);
    assert_eq!(code, 13, "{out}");
    let slot_line = out
        .lines()
        .find(|l| {
            l.split_once(' ').is_some_and(|(status, rest)| {
                status == "FAIL" && rest.trim_start().starts_with("slot ")
            })
        })
        .unwrap_or_else(|| panic!("the slot check does not fail:\n{out}"));
    let said = "is synchronized from the primary";
    assert!(
        slot_line.contains(said) && slot_line.contains("postgres.failover_slot = true"),
        "{slot_line}"
    );
    let (code, out) = walbox_cmd(&["run"], &on_standby);
    assert_eq!(code, 5, "{out}");
    let last = out.lines().last().unwrap_or_default();
    assert!(
        last.contains(said)
            && last.contains("postgres.failover_slot = true")
            && last.contains("another postgres.slot")
            && !last.contains("55000"),
        "{last}"
    );
    assert!(!out.contains(primary.password()), "a password in:\n{out}");
}

#[test]
fn a_stream_waiting_for_a_gone_standby_is_logged_alerted_and_named_then_relays_everything() {
    let Some(major) = failover_major() else {
        return;
    };
    // No standby at all: synchronized_standby_slots names a physical slot nobody streams from,
    // as when the standby is gone.
    let primary: &'static PgCluster =
        Box::leak(Box::new(support::start_cluster(PgClusterOptions {
            major: Some(major),
            watchdog: true,
            ..Default::default()
        })));
    let gone = "gone_standby";
    primary
        .psql(
            "postgres",
            &format!(
                "SELECT pg_create_physical_replication_slot('{gone}', true);
                 ALTER SYSTEM SET synchronized_standby_slots = '{gone}'; SELECT pg_reload_conf();"
            ),
        )
        .unwrap();
    let db = TestDb::on(primary, "stall");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 1);
    let hook = WebhookReceiver::start();
    let port = free_port();
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    set(&mut env, "WALBOX_POSTGRES_FAILOVER_SLOT", "true".into());
    set(&mut env, "WALBOX_HTTP_LISTEN", format!("127.0.0.1:{port}"));
    set(&mut env, "WALBOX_SLOT_CHECK_INTERVAL", "100ms".into());
    set(&mut env, "WALBOX_ALERTS_WEBHOOK_URL", hook.url.clone());
    let walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream", || db.streaming(&slot));
    let scrape = || {
        http_get(port, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default()
    };
    wait_until(WAIT, "a first slot reading", || {
        metric(&scrape(), "walbox_slot_checks_total").is_some_and(|n| n >= 1.0)
    });

    // An event the walsender holds back: the server's warning is logged, the alert level
    // rises and names the slot, in the webhook and in `walbox status`.
    let id = insert(&db, &topic, 1).expect("insert");
    wait_until(
        WAIT,
        "the server's warning in the log and the alert",
        || {
            let log = walbox.log();
            log.contains("PostgreSQL warning on the replication connection")
                && log.contains(gone)
                && metric(&scrape(), "walbox_slot_alert_level") == Some(1.0)
        },
    );
    // The webhook is posted after the gauge moves: wait for the delivery, then check it.
    let warned = || {
        hook.received.lock().unwrap().iter().any(|v| {
            v["alerts"][0]["labels"]["severity"] == "warning"
                && v["alerts"][0]["annotations"]["description"]
                    .as_str()
                    .is_some_and(|d| d.contains(gone) && d.contains("synchronized_standby_slots"))
        })
    };
    wait_until(WAIT, "a webhook warning naming the standby slot", warned);
    let (code, text) = walbox_cmd(&["status"], &env);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("waiting for standby slot") && l.contains(gone))
            && text
                .lines()
                .any(|l| l.starts_with("alert level") && l.contains("warning")),
        "{text}"
    );
    let (code, json) = walbox_cmd(&["status", "--json"], &env);
    assert_eq!(code, 0, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(v["waiting_for_standby_slots"][0], gone, "{v:#}");

    // The standby's slot taken out of the setting: the event arrives, the level is ok again.
    primary
        .psql(
            "postgres",
            "ALTER SYSTEM RESET synchronized_standby_slots; SELECT pg_reload_conf();",
        )
        .unwrap();
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).contains(&id)),
        "the held-back event arrived; log:\n{}",
        walbox.log()
    );
    wait_until(WAIT, "the alert level back to ok", || {
        metric(&scrape(), "walbox_slot_alert_level") == Some(0.0)
    });
    assert_eq!(distinct_ids(&reader.records), [id].into());
}
