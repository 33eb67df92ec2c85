//! Shards start only as a whole layout: every shard's slot made before any shard streams, all
//! at one position; a server short of slots or walsenders stops walbox (exit 16) and fails
//! `walbox check`; a shard that later finds no walsender fails `/healthz`; a start interrupted
//! between making and moving the slots is finished by the next.

use std::collections::HashSet;
#[cfg(feature = "failpoints")]
use std::sync::atomic::Ordering;

#[cfg(feature = "failpoints")]
use walbox::lsn::Lsn;
use walbox::sandbox::broker::TopicReader;
use walbox::sandbox::postgres::{PgCluster, PgClusterOptions};

#[cfg(feature = "failpoints")]
use crate::shards::Writer;
use crate::shards::{
    buckets, served_shards, shard_slot, sharded_env, sharding_supported, slots, start_streaming,
};
#[cfg(feature = "failpoints")]
use crate::support::events::distinct_ids;
use crate::support::events::{await_distinct, stop_and_read_exactly, write_txns};
use crate::support::{self, http_get, wait_until, walbox_cmd, TestDb, Walbox, WAIT};

/// A cluster with room for two slots and two walsenders: less than three shards need.
fn short_cluster() -> &'static PgCluster {
    let settings = [("max_replication_slots", "2"), ("max_wal_senders", "2")];
    Box::leak(Box::new(support::start_cluster(PgClusterOptions {
        settings: settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..support::pg_options()
    })))
}

#[test]
fn check_counts_a_slot_and_a_walsender_for_every_shard_and_names_each_slot() {
    if !sharding_supported() {
        return;
    }
    let db = TestDb::on(short_cluster(), "shards_check");
    let broker = support::broker();
    let names: Vec<String> = (0..3).map(|k| shard_slot(&db.name, k, 3)).collect();
    let (code, text) = walbox_cmd(
        &["check"],
        &sharded_env(&db, &broker.bootstrap_servers(), 3),
    );
    assert_eq!(code, 13, "{text}");
    let line = |name: &str| line_of(&text, name);
    let slots = line("max_replication_slots");
    assert!(
        slots.starts_with("FAIL")
            && slots.contains(&names.join(", "))
            && slots.contains("fix: ALTER SYSTEM SET max_replication_slots = 3;"),
        "{text}"
    );
    let senders = line("max_wal_senders");
    assert!(
        senders.starts_with("FAIL")
            && senders.contains("the 3 shards need a walsender each")
            && senders.contains("fix: ALTER SYSTEM SET max_wal_senders = 3;"),
        "{text}"
    );
    for name in &names {
        let slot = line(&format!("slot {name}"));
        assert!(
            slot.starts_with("FAIL") && slot.contains("max_replication_slots failed"),
            "{text}"
        );
    }
    assert!(line("shards").contains(&names.join(", ")), "{text}");
    assert!(
        !text.lines().any(|l| l
            .split_once(' ')
            .is_some_and(|(_, r)| r.trim_start().starts_with("slot  "))),
        "no line for the base slot:\n{text}"
    );

    // Two shards fit; a hot standby walbox's takeover would need two more walsenders.
    let (code, text) = walbox_cmd(
        &["check"],
        &sharded_env(&db, &broker.bootstrap_servers(), 2),
    );
    assert_eq!(code, 0, "{text}");
    let senders = line_of(&text, "max_wal_senders");
    assert!(
        senders.starts_with("WARN")
            && senders.contains("2 more for a hot standby walbox")
            && senders.contains("max_wal_senders = 4"),
        "{text}"
    );
    assert!(
        line_of(&text, "max_replication_slots").starts_with("ok "),
        "{text}"
    );
}

/// The line of check `name` in a `walbox check` report.
fn line_of(text: &str, name: &str) -> String {
    text.lines()
        .find(|l| {
            l.split_once(' ')
                .is_some_and(|(_, r)| r.trim_start().starts_with(&format!("{name}  ")))
        })
        .unwrap_or_else(|| panic!("no {name} line:\n{text}"))
        .to_owned()
}

/// Sets `setting` on `db`'s cluster and restarts it.
fn set_and_restart(db: &TestDb, cluster: &PgCluster, setting: &str, to: u32) {
    db.sql(&format!("ALTER SYSTEM SET {setting} = {to}"));
    cluster.restart().expect("restart PostgreSQL");
    assert_eq!(db.sql(&format!("SHOW {setting}")).trim(), to.to_string());
}

/// Runs walbox with `env` to its exit: it must stop with 16 before any shard streams, create
/// no slot, and name what to raise; returns its last line.
fn refused_for_capacity(
    env: &[(String, String)],
    db: &TestDb,
    port: u16,
    kept: &[String],
) -> String {
    let mut walbox = Walbox::spawn(env);
    let mut streamed = false;
    let status = {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            if !walbox.running() {
                break walbox.wait_exit(WAIT);
            }
            // No shard may stream meanwhile, and no health check may pass with one that does.
            if db
                .sql("SELECT count(*) FROM pg_replication_slots WHERE active")
                .trim()
                != "0"
            {
                streamed = true;
            }
            if streamed && http_get(port, "/healthz").is_some_and(|(c, _)| c == 200) {
                panic!(
                    "some shards stream while another cannot, and /healthz says 200:\n{}",
                    walbox.log()
                );
            }
            assert!(
                std::time::Instant::now() < deadline,
                "walbox did not stop:\n{}",
                walbox.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    assert_eq!(status.code(), Some(16), "{}", walbox.log());
    assert!(!streamed, "a shard streamed:\n{}", walbox.log());
    assert_eq!(slots(db, &db.name), kept, "no slot was created");
    walbox.last_line()
}

#[test]
fn a_server_short_of_slots_or_walsenders_stops_every_shard_and_no_row_is_lost() {
    if !sharding_supported() {
        return;
    }
    // A cluster of its own: the test raises its limits.
    let cluster = short_cluster();
    let db = TestDb::on(cluster, "shards_short");
    let (topic, broker) = support::topic_on_broker(&db, 3);
    let (env, port, names) = served_shards(&db, &broker.bootstrap_servers(), 3);
    let aggs: Vec<String> = (0..30).map(|i| format!("agg-{i}")).collect();

    // Two slots and two walsenders for three shards: walbox stops before any shard streams.
    let line = refused_for_capacity(&env, &db, port, &[]);
    assert!(
        line.contains("postgres.shards = 3 needs")
            && line.contains("max_replication_slots to at least 3")
            && line.contains("max_wal_senders to at least 3"),
        "{line}"
    );
    // Rows committed now are relayed by no shard (no slot exists), not by some of them.
    write_txns(&db, &topic, &aggs, 2);

    // Enough slots, still two walsenders.
    set_and_restart(&db, cluster, "max_replication_slots", 4);
    let line = refused_for_capacity(&env, &db, port, &[]);
    assert!(
        line.contains("max_wal_senders to at least 3") && !line.contains("max_replication_slots"),
        "{line}"
    );

    // A slot of the layout made earlier (by hand, or by a start that stopped half-way) holds
    // rows of its bucket that the other shards' slots, made later, cannot have: the layout
    // starts after them, for every shard alike.
    db.sql(&format!(
        "SELECT pg_create_logical_replication_slot('{}', 'pgoutput')",
        names[0]
    ));
    write_txns(&db, &topic, &aggs, 2);
    let line = refused_for_capacity(&env, &db, port, &names[..1]);
    assert!(line.contains("max_wal_senders to at least 3"), "{line}");

    // Limits raised: every shard starts, and every row committed from then on arrives, in
    // every shard, with nothing of the rows before.
    set_and_restart(&db, cluster, "max_wal_senders", 4);
    let mut walbox = start_streaming(&env, &db, &names);
    assert_eq!(slots(&db, &db.name), names);
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let mut all: HashSet<i64> = write_txns(&db, &topic, &aggs, 5).into_iter().collect();
    let bucket = buckets(&db, 3);
    for k in 0..3 {
        assert!(
            all.iter().any(|id| bucket[id] == k),
            "no row of shard {k}: choose other aggregates"
        );
    }
    await_distinct(&mut reader, all.len(), &walbox);
    assert!(
        walbox.log().contains("all at one position"),
        "{}",
        walbox.log()
    );
    // The slot made by hand held rows that no shard relays now: the log says which, and how to
    // republish them.
    let warned = walbox
        .log()
        .lines()
        .find(|l| l.contains(&format!("shard slot {} stood at", names[0])))
        .map(str::to_owned);
    assert!(
        warned.as_deref().is_some_and(|l| l.contains("WARN")
            && l.contains("relayed by no shard")
            && l.contains("walbox republish --since")),
        "{}",
        walbox.log()
    );

    // Later the server restarts with a walsender fewer than the shards need: one shard waits,
    // its slot keeps its rows, and /healthz fails, naming the setting, until it streams.
    set_and_restart(&db, cluster, "max_wal_senders", 2);
    wait_until(WAIT, "/healthz to fail naming max_wal_senders", || {
        http_get(port, "/healthz")
            .is_some_and(|(code, body)| code == 503 && body.contains("raise max_wal_senders"))
    });
    all.extend(write_txns(&db, &topic, &aggs, 3));
    set_and_restart(&db, cluster, "max_wal_senders", 4);
    wait_until(WAIT, "every shard to stream again", || {
        names.iter().all(|s| db.streaming(s))
    });
    wait_until(WAIT, "/healthz to pass again", || {
        http_get(port, "/healthz").is_some_and(|(code, _)| code == 200)
    });
    await_distinct(&mut reader, all.len(), &walbox);
    stop_and_read_exactly(&mut walbox, &mut reader, &all);
}

#[cfg(feature = "failpoints")]
#[test]
fn a_start_stopped_between_making_and_moving_the_slots_is_finished_by_the_next() {
    if !sharding_supported() {
        return;
    }
    let db = TestDb::new("shards_layout_crash");
    let (topic, broker) = support::topic_on_broker(&db, 3);
    let (env, _, names) = served_shards(&db, &broker.bootstrap_servers(), 3);
    let writer = Writer::start(&db, &topic);
    writer.wait_for_more(20);
    let mut faulty = env.clone();
    faulty.push(("FAILPOINTS".into(), "layout::slots-created=return".into()));
    let mut crashed = Walbox::spawn(&faulty);
    crashed.wait_exit(WAIT);
    assert!(
        crashed
            .log()
            .contains("fault point layout::slots-created fired"),
        "{}",
        crashed.log()
    );
    assert_eq!(slots(&db, &db.name), names, "every slot was made");
    let positions: Vec<Lsn> = names.iter().map(|s| db.confirmed(s)).collect();
    let point = *positions.iter().max().unwrap();
    assert!(
        positions.iter().any(|p| *p < point),
        "the writer moved the WAL between the slots: {positions:?}"
    );

    let mut walbox = start_streaming(&env, &db, &names);
    let before = writer.written.lock().unwrap().len();
    writer.wait_for_more(100);
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    writer.stop.store(true, Ordering::SeqCst);
    let (after, early) = {
        let written = writer.written.lock().unwrap();
        // Every transaction of the restarted relay arrives; none committed before the
        // layout's position does, in any shard.
        let after: HashSet<i64> = written[before..]
            .iter()
            .flat_map(|w| w.ids.clone())
            .collect();
        let early: HashSet<i64> = written
            .iter()
            .filter(|w| w.after_commit <= point)
            .flat_map(|w| w.ids.clone())
            .collect();
        (after, early)
    };
    assert!(
        !early.is_empty(),
        "rows committed before the layout's position"
    );
    await_distinct(&mut reader, after.len(), &walbox);
    let all = writer.finish();
    walbox.terminate();
    assert_eq!(walbox.wait_exit(WAIT).code(), Some(0), "{}", walbox.log());
    reader.read_to_end(WAIT).unwrap();
    let present = distinct_ids(&reader.records);
    assert!(
        after.is_subset(&present),
        "a transaction of the restarted relay is missing"
    );
    assert!(present.is_subset(&all));
    let relayed_early: Vec<&i64> = early.intersection(&present).collect();
    assert!(
        relayed_early.is_empty(),
        "committed before the layout's position {point}, relayed by some shard: {relayed_early:?}"
    );
}
