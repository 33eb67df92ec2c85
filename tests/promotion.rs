//! Promotions onto a standby that lags what walbox acknowledged (no
//! `synchronized_standby_slots`, PostgreSQL 17's failover slots): a walbox that stays up through
//! one must relay every commit of the new primary, and exactly-once mode must send nothing twice
//! when the synchronized copy of the slot is older than the primary's slot was.

use walbox::lsn::Lsn;
use walbox::sandbox::broker::TopicReader;

use crate::failover::{
    failover_major, pair, set, standby_first_env, wait_for_synchronized_slot, Pair,
};
use crate::support::{wait_until, TestDb, Walbox, WAIT};

/// `n` single-row transactions on `db`, each keyed `{tag}-{i}`.
fn insert_tagged(db: &TestDb, topic: &str, tag: &str, n: usize) {
    let sql: String = (0..n)
        .map(|i| {
            format!(
                "INSERT INTO outbox (aggregate_id, topic, event_type, payload) \
                 VALUES ('{tag}-{i}', '{topic}', 'thing.happened', '{{}}');\n"
            )
        })
        .collect();
    db.sql(&sql);
}

/// walbox's environment on `p`: the standby listed first, a failover slot, a 5 s receive
/// timeout; `exactly_once` or not.
fn env_on(p: &Pair, exactly_once: bool) -> Vec<(String, String)> {
    let mut env = standby_first_env(
        &p.db,
        &p.slot,
        &p.broker,
        p.primary.port(),
        p.standby.port(),
    );
    set(&mut env, "WALBOX_POSTGRES_FAILOVER_SLOT", "true".into());
    set(&mut env, "WALBOX_POSTGRES_RECEIVE_TIMEOUT", "5s".into());
    if exactly_once {
        set(&mut env, "WALBOX_KAFKA_EXACTLY_ONCE", "true".into());
        // A progress topic of its own: another test's open transaction on the shared one would
        // hide the records this test's start-ups read back.
        let progress = crate::support::own_progress_topic(&p.broker, &p.slot);
        set(&mut env, "WALBOX_KAFKA_PROGRESS_TOPIC", progress);
    }
    env
}

/// Starts walbox with `env`, waits until it streams from `p`'s primary, and relays `n` events
/// tagged `tag`: the running walbox and the reader that saw them.
fn start_relaying(
    p: &Pair,
    env: &[(String, String)],
    tag: &str,
    n: usize,
) -> (Walbox, TopicReader) {
    let walbox = Walbox::spawn(env);
    wait_until(WAIT, "walbox to stream from the primary", || {
        p.db.streaming(&p.slot)
    });
    let mut reader = TopicReader::new(&p.broker.bootstrap_servers(), &[&p.topic], WAIT).unwrap();
    relay_tagged(&mut reader, &walbox, &p.db, &p.topic, tag, n);
    (walbox, reader)
}

/// Commits `n` events tagged `tag` on `db` and waits until `reader` has seen all of them.
fn relay_tagged(
    reader: &mut TopicReader,
    walbox: &Walbox,
    db: &TestDb,
    topic: &str,
    tag: &str,
    n: usize,
) {
    insert_tagged(db, topic, tag, n);
    assert!(
        reader.poll_until(WAIT, |r| tagged_keys(r, tag).len() == n),
        "{} of the {n} events tagged {tag} arrived; log:\n{}",
        tagged_keys(&reader.records, tag).len(),
        walbox.log()
    );
}

/// The keys `{tag}-…` among `records`.
fn tagged_keys(records: &[walbox::sandbox::broker::ConsumedRecord], tag: &str) -> Vec<String> {
    let prefix = format!("{tag}-");
    let mut keys: Vec<String> = records
        .iter()
        .filter_map(|r| r.key.as_deref())
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .filter(|k| k.starts_with(&prefix))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

#[test]
fn a_walbox_that_stays_up_through_a_promotion_onto_a_lagging_standby_relays_every_new_commit() {
    stays_up_through_a_lagging_promotion(false);
}

#[test]
fn exactly_once_stays_up_through_a_promotion_onto_a_lagging_standby_and_relays_every_new_commit() {
    stays_up_through_a_lagging_promotion(true);
}

/// walbox (at-least-once, or `exactly_once`) keeps running while a standby that lags what it
/// acknowledged is promoted: every commit of the new primary reaches Kafka.
fn stays_up_through_a_lagging_promotion(exactly_once: bool) {
    let Some(major) = failover_major() else {
        return;
    };
    // No synchronized_standby_slots: the primary's walsender sends walbox commits the standby
    // never receives, so what walbox acknowledged runs ahead of the standby's history.
    let p = pair(major, "lagfail", 3);
    if exactly_once && !crate::exactly_once::transactions_supported(&p.broker) {
        return;
    }
    let (primary, standby, db, replica, slot, topic) =
        (p.primary, p.standby, &p.db, &p.replica, &p.slot, &p.topic);
    let env = env_on(&p, exactly_once);
    let (mut walbox, mut reader) = start_relaying(&p, &env, "shared", 100);
    wait_for_synchronized_slot(db, replica, slot);
    wait_until(WAIT, "the standby to replay the first events", || {
        replica.try_sql("SELECT count(*) FROM outbox") == Ok("100".into())
    });

    // The standby stops receiving; walbox relays and confirms 100 more on the primary.
    standby.stop().expect("stop the standby");
    insert_tagged(db, topic, "orphaned", 100);
    let end = db.sql("SELECT pg_current_wal_lsn()").parse().unwrap();
    assert!(
        reader.poll_until(WAIT, |r| tagged_keys(r, "orphaned").len() == 100),
        "the events the standby never received; log:\n{}",
        walbox.log()
    );
    wait_until(WAIT, "walbox to confirm them", || db.confirmed(slot) >= end);

    // The primary dies; the lagging standby comes back and is promoted. walbox, still
    // running, reconnects through the same URL to the new primary.
    primary.crash().expect("crash the primary");
    standby.start_again().expect("start the standby again");
    standby.promote().expect("promote the standby");
    wait_until(WAIT, "walbox to stream from the promoted standby", || {
        replica.streaming(slot)
    });
    insert_tagged(replica, topic, "promoted", 100);
    let arrived = reader.poll_until(WAIT, |r| tagged_keys(r, "promoted").len() == 100);
    let got = tagged_keys(&reader.records, "promoted");
    assert!(
        arrived,
        "{} of the 100 events committed on the promoted standby reached Kafka; log:\n{}",
        got.len(),
        walbox.log()
    );
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

#[test]
fn exactly_once_sends_nothing_twice_from_a_failover_slot_promoted_after_walbox_restarted() {
    let Some(major) = failover_major() else {
        return;
    };
    let p = pair(major, "eosfail", 3);
    if p.broker.mock_cluster().is_some() {
        // Its consumers see aborted transactions' records too: duplicates are not walbox's.
        eprintln!("exactly-once duplicates need a broker with transaction markers: Apache Kafka only (scripts/real-kafka.sh)");
        return;
    }
    let (primary, standby, db, replica, slot, topic) =
        (p.primary, p.standby, &p.db, &p.replica, &p.slot, &p.topic);
    let env = env_on(&p, true);
    let (mut walbox, mut reader) = start_relaying(&p, &env, "synced", 50);
    wait_for_synchronized_slot(db, replica, slot);
    // The standby stops synchronizing the slot but still receives WAL: its copy of the slot
    // stays where it is while the primary's moves on.
    replica.sql("ALTER SYSTEM SET sync_replication_slots = off; SELECT pg_reload_conf();");
    wait_until(WAIT, "the slot synchronization to stop", || {
        replica
            .try_sql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'slotsync worker'")
            .is_ok_and(|n| n == "0")
    });
    let copy: Lsn = replica
        .sql(&format!(
            "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{slot}'"
        ))
        .parse()
        .unwrap();
    insert_tagged(db, topic, "shared", 50);
    let shared_end: Lsn = db.sql("SELECT pg_current_wal_lsn()").parse().unwrap();
    assert!(
        reader.poll_until(WAIT, |r| tagged_keys(r, "shared").len() == 50),
        "the events both servers hold; log:\n{}",
        walbox.log()
    );
    wait_until(WAIT, "the standby to replay them", || {
        replica
            .try_sql("SELECT pg_last_wal_replay_lsn()")
            .is_ok_and(|l| l.parse::<Lsn>().is_ok_and(|l| l >= shared_end))
    });
    standby.stop().expect("stop the standby");
    // The primary's slot moves past the standby's copy; walbox restarts on the primary, so its
    // progress records carry the newer slot generation.
    wait_until(
        WAIT,
        "the primary's slot to move past the standby's copy",
        || {
            let _ = db.try_sql("SELECT pg_log_standby_snapshot()");
            db.try_sql(&format!(
            "SELECT restart_lsn > '{copy}' FROM pg_replication_slots WHERE slot_name = '{slot}'"
        ))
            .is_ok_and(|v| v == "t")
        },
    );
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    let mut walbox = Walbox::spawn(&env);
    relay_tagged(&mut reader, &walbox, db, topic, "orphaned", 50);
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());

    // The primary dies; the standby is promoted with its older copy of the slot.
    primary.crash().expect("crash the primary");
    standby.start_again().expect("start the standby again");
    standby.promote().expect("promote the standby");
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream from the promoted standby", || {
        replica.streaming(slot)
    });
    relay_tagged(&mut reader, &walbox, replica, topic, "promoted", 50);
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    reader.read_to_end(WAIT).unwrap();
    let keys: Vec<String> = reader
        .records
        .iter()
        .filter_map(|r| r.key.as_deref())
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    let twice: std::collections::BTreeSet<&String> = keys
        .iter()
        .filter(|k| keys.iter().filter(|o| o == k).count() > 1)
        .collect();
    assert!(
        twice.is_empty(),
        "{} events sent twice: {twice:?}; log:\n{}",
        twice.len(),
        walbox.log()
    );
}
