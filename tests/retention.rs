//! Managed outbox retention (`[outbox.retention]`): old rows go in batches, or whole partitions
//! of a table partitioned by time go and the next ones are created ahead; no row is deleted
//! while the slot has not confirmed it (the broker refusing every record holds retention
//! back, and a SIGKILL mid-retention loses nothing); deletions produce no events; a table
//! partitioned otherwise is cleaned partition by partition; a failing retention is reported
//! and the relay goes on, also when a partition cannot be created; only the active walbox runs
//! retention, and a standby starts it when it takes over.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use walbox::lsn::Lsn;
use walbox::sandbox::broker::{Broker, TopicReader};
use walbox::sandbox::postgres::{PgCluster, PgClusterOptions};

use crate::support::events::{await_distinct, distinct_ids};
use crate::support::{
    self, free_port, http_get, metric, wait_until, walbox_env, TestDb, Walbox, WAIT,
};

fn set(env: &mut Vec<(String, String)>, key: &str, value: String) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_owned(), value));
}

fn scrape(port: u16, name: &str) -> f64 {
    http_get(port, "/metrics")
        .and_then(|(_, body)| {
            body.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        })
        .unwrap_or(0.0)
}

/// Waits until the counter `name` reaches `value` (it is counted just after the commit that
/// a test observes), then checks it went no further.
fn settled(port: u16, name: &str, value: f64) {
    wait_until(WAIT, name, || scrape(port, name) >= value);
    assert_eq!(scrape(port, name), value, "{name}");
}

fn ids(out: &str) -> HashSet<i64> {
    out.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// A day before now: older than a `keep` of `1h`, not of `1d`.
const DAY_OLD: &str = "now() - interval '1 day'";
/// Inside the partition `<table>_2000` of [`partitioned_by_day`], long expired.
const IN_2000: &str = "'2000-01-01 12:00:00+00'";

/// Inserts `n` rows into `table` for `topic`, spread over `aggregates` aggregates and created
/// at `created_at` (an SQL expression); their ids.
fn insert(
    db: &TestDb,
    table: &str,
    topic: &str,
    n: u32,
    aggregates: u32,
    created_at: &str,
) -> HashSet<i64> {
    ids(&db.sql(&format!(
        "INSERT INTO {table} (aggregate_id, topic, event_type, payload, created_at) \
         SELECT 'agg-' || (i % {aggregates}), '{topic}', 'x', '{{}}', {created_at} \
         FROM generate_series(1, {n}) i RETURNING id"
    )))
}

/// Publishes the partitioned `table` (through its root) in `slot`'s publication, and creates
/// `slot`.
fn publish(db: &TestDb, table: &str, slot: &str) {
    db.sql(&format!(
        "CREATE PUBLICATION {slot} FOR TABLE {table} WITH (publish = 'insert', publish_via_partition_root = true);
         SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput');"
    ));
}

/// Creates `table`, an outbox partitioned by range of `created_at` with the expired partition
/// `<table>_2000` (the day of [`IN_2000`]) and, with `default`, the default partition
/// `<table>_rest`; then [`publish`]es it.
fn partitioned_by_day(db: &TestDb, table: &str, slot: &str, default: bool) {
    db.sql(&format!(
        "CREATE TABLE {table} (
             id bigint GENERATED ALWAYS AS IDENTITY,
             aggregate_id text NOT NULL, topic text NOT NULL, event_type text NOT NULL,
             payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
             PRIMARY KEY (id, created_at)
         ) PARTITION BY RANGE (created_at);
         CREATE TABLE {table}_2000 PARTITION OF {table}
             FOR VALUES FROM ('2000-01-01 00:00:00+00') TO ('2000-01-02 00:00:00+00');"
    ));
    if default {
        db.sql(&format!(
            "CREATE TABLE {table}_rest PARTITION OF {table} DEFAULT"
        ));
    }
    publish(db, table, slot);
}

/// Turns retention on in `env`: rows older than `keep` by `created_at`, a pass every second;
/// then `settings`, each replacing any of those. Returns the port `/metrics` is served on.
fn with_retention(env: &mut Vec<(String, String)>, keep: &str, settings: &[(&str, &str)]) -> u16 {
    let port = free_port();
    set(env, "WALBOX_HTTP_LISTEN", format!("127.0.0.1:{port}"));
    set(env, "WALBOX_OUTBOX_RETENTION_ENABLED", "true".into());
    set(env, "WALBOX_OUTBOX_RETENTION_KEEP", keep.into());
    set(env, "WALBOX_OUTBOX_RETENTION_INTERVAL", "1s".into());
    set(env, "WALBOX_OUTBOX_RETENTION_COLUMN", "created_at".into());
    for (key, value) in settings {
        set(env, key, (*value).into());
    }
    port
}

/// Reads `topic` until it holds every id of `all`; it must hold exactly those (`what`).
fn assert_relayed_exactly(
    broker: &Broker,
    topic: &str,
    all: &HashSet<i64>,
    walbox: &Walbox,
    what: &str,
) {
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[topic], WAIT).unwrap();
    await_distinct(&mut reader, all.len(), walbox);
    assert_eq!(&distinct_ids(&reader.records), all, "{what}");
}

/// SIGTERM, which must end `walbox` with status 0.
fn stop(walbox: &mut Walbox) {
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

#[test]
fn old_rows_are_deleted_in_batches_only_once_confirmed_and_no_event_is_lost() {
    let db = TestDb::new("retention_rows");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 2);
    let Some(mock) = broker.mock_cluster() else {
        eprintln!("external broker: holding acknowledgements back needs the mock cluster; skipped");
        return;
    };
    db.create_slot_and_publication(&slot);
    // 1,000 rows a day old and 10 young ones, all in the slot's stream.
    let old = insert(&db, "outbox", &topic, 1000, 13, DAY_OLD);
    let young = insert(&db, "outbox", &topic, 10, 10, "now()");
    assert_eq!((old.len(), young.len()), (1000, 10));

    // The broker refuses every record: nothing is acknowledged, so nothing is confirmed.
    support::fail_every_produce(mock);
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    let port = with_retention(
        &mut env,
        "1h",
        &[("WALBOX_OUTBOX_RETENTION_BATCH_SIZE", "150")],
    );
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "retention to wait for the relay twice", || {
        walbox
            .log()
            .matches("outbox retention waits for the relay")
            .count()
            >= 2
    });
    assert_eq!(
        db.sql("SELECT count(*) FROM outbox"),
        "1010",
        "nothing unconfirmed was deleted; log:\n{}",
        walbox.log()
    );

    // Acknowledgements flow again: the relay confirms, and retention deletes the old rows.
    support::restore_produce(mock);
    wait_until(WAIT, "retention to delete the old rows", || {
        db.sql("SELECT count(*) FROM outbox") == "10"
    });
    assert_eq!(
        ids(&db.sql("SELECT id FROM outbox")),
        young,
        "the young rows stay"
    );
    settled(port, "walbox_outbox_retention_rows_deleted_total", 1000.0);
    wait_until(WAIT, "a pass that succeeded", || {
        scrape(
            port,
            "walbox_outbox_retention_last_success_timestamp_seconds",
        ) > 0.0
    });
    assert_eq!(scrape(port, "walbox_outbox_retention_errors_total"), 0.0);

    // Every row reached Kafka, and the deletions added nothing.
    let all: HashSet<i64> = old.union(&young).copied().collect();
    assert_relayed_exactly(&broker, &topic, &all, &walbox, "every row, nothing else");
    stop(&mut walbox);
}

#[test]
fn a_table_partitioned_by_time_loses_old_partitions_and_gets_new_ones_ahead() {
    let db = TestDb::new("retention_parts");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 1);
    partitioned_by_day(&db, "outbox_p", &slot, true);
    let old = insert(&db, "outbox_p", &topic, 50, 50, IN_2000);
    // Old rows without a partition of their own land in the default partition.
    let stray = insert(&db, "outbox_p", &topic, 5, 5, "'1999-06-01 12:00:00+00'");
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    let port = with_retention(
        &mut env,
        "1d",
        &[
            ("WALBOX_OUTBOX_TABLE", "public.outbox_p"),
            ("WALBOX_OUTBOX_RETENTION_PREMAKE", "2"),
        ],
    );
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "the expired partition to be dropped", || {
        db.sql("SELECT to_regclass('outbox_p_2000') IS NULL") == "t"
    });
    // Today's partition and two more, named by their UTC day.
    let expected: Vec<String> = db
        .sql(
            "SELECT 'outbox_p_p' || to_char((now() AT TIME ZONE 'UTC')::date + k, 'YYYYMMDD') \
             FROM generate_series(0, 2) k ORDER BY 1",
        )
        .lines()
        .map(str::to_owned)
        .collect();
    wait_until(WAIT, "the partitions ahead", || {
        expected
            .iter()
            .all(|p| db.sql(&format!("SELECT to_regclass('{p}') IS NOT NULL")) == "t")
    });
    settled(
        port,
        "walbox_outbox_retention_partitions_dropped_total",
        1.0,
    );
    settled(
        port,
        "walbox_outbox_retention_partitions_created_total",
        3.0,
    );
    assert_eq!(
        db.sql("SELECT to_regclass('outbox_p_rest') IS NOT NULL"),
        "t",
        "the default partition stays"
    );
    wait_until(WAIT, "the old rows of the default partition to go", || {
        db.sql("SELECT count(*) FROM outbox_p_rest") == "0"
    });
    settled(port, "walbox_outbox_retention_rows_deleted_total", 5.0);

    // New rows land in today's partition and are relayed; the dropped ones were relayed first.
    let new = insert(&db, "outbox_p", &topic, 20, 20, "now()");
    assert_eq!(
        db.sql(&format!(
            "SELECT count(*) FROM {} WHERE created_at >= now() - interval '1 minute'",
            expected[0]
        )),
        "20"
    );
    let all: HashSet<i64> = old.iter().chain(&stray).chain(&new).copied().collect();
    assert_relayed_exactly(&broker, &topic, &all, &walbox, "every row, nothing else");
    stop(&mut walbox);
}

#[test]
fn a_failing_retention_is_counted_and_logged_while_the_relay_goes_on() {
    let db = TestDb::new("retention_fail");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 1);
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    let port = with_retention(
        &mut env,
        "1h",
        &[("WALBOX_OUTBOX_RETENTION_COLUMN", "no_such_column")],
    );
    let mut walbox = Walbox::spawn(&env);
    // Passes before the slot exists fail for that reason; wait for one that failed on the
    // column, logged and counted.
    wait_until(
        WAIT,
        "a retention pass failing on the missing column",
        || {
            walbox.log().lines().any(|l| {
                l.contains("outbox retention failed; retrying at the next interval")
                    && l.contains("no_such_column")
            })
        },
    );
    assert!(
        scrape(port, "walbox_outbox_retention_errors_total") >= 1.0,
        "{}",
        walbox.log()
    );
    let inserted = insert(&db, "outbox", &topic, 1, 1, "now()");
    let id = *inserted.iter().next().unwrap();
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).contains(&id)),
        "the relay goes on; log:\n{}",
        walbox.log()
    );
    let body = http_get(port, "/metrics").unwrap().1;
    assert!(metric(&body, "walbox_ha_active") == Some(1.0));
    // Nothing was ever removed, and the counters say so (the alert compares them).
    for name in [
        "walbox_outbox_retention_rows_deleted_total",
        "walbox_outbox_retention_partitions_dropped_total",
    ] {
        assert_eq!(
            metric(&body, &format!("{name}{{table=\"public.outbox\"}}")),
            Some(0.0),
            "{name} in:\n{body}"
        );
    }
    stop(&mut walbox);
}

#[test]
fn a_table_partitioned_otherwise_keeps_the_young_rows_of_every_partition() {
    // Partitioned by id: rows mode. A ctid is unique only within one partition; old rows in
    // the first partition share ctids with young rows in the second.
    let db = TestDb::new("retention_leaves");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 1);
    db.sql(
        "CREATE TABLE outbox_i (
             id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             aggregate_id text NOT NULL, topic text NOT NULL, event_type text NOT NULL,
             payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now()
         ) PARTITION BY RANGE (id);
         CREATE TABLE outbox_i_1 PARTITION OF outbox_i FOR VALUES FROM (1) TO (1001);
         CREATE TABLE outbox_i_2 PARTITION OF outbox_i FOR VALUES FROM (1001) TO (MAXVALUE);",
    );
    publish(&db, "outbox_i", &slot);
    let old = insert(&db, "outbox_i", &topic, 1000, 1000, DAY_OLD);
    let young = insert(&db, "outbox_i", &topic, 100, 100, "now()");
    assert_eq!(db.sql("SELECT count(*) FROM outbox_i_2"), "100");
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    let port = with_retention(
        &mut env,
        "1h",
        &[
            ("WALBOX_OUTBOX_TABLE", "public.outbox_i"),
            ("WALBOX_OUTBOX_RETENTION_BATCH_SIZE", "300"),
        ],
    );
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "retention to delete the old rows", || {
        db.sql("SELECT count(*) FROM outbox_i_1") == "0"
    });
    assert_eq!(
        ids(&db.sql("SELECT id FROM outbox_i")),
        young,
        "every young row stays; log:\n{}",
        walbox.log()
    );
    settled(port, "walbox_outbox_retention_rows_deleted_total", 1000.0);
    let all: HashSet<i64> = old.union(&young).copied().collect();
    assert_relayed_exactly(&broker, &topic, &all, &walbox, "every row, nothing else");
    stop(&mut walbox);
}

#[test]
fn sigkill_during_retention_loses_no_event() {
    let db = TestDb::new("retention_kill");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 2);
    db.create_slot_and_publication(&slot);
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    let port = with_retention(
        &mut env,
        "1h",
        &[("WALBOX_OUTBOX_RETENTION_BATCH_SIZE", "50")],
    );

    // The writer commits rows that are older than keep the moment they exist (back-dated),
    // so retention always has rows to delete that the relay may not have confirmed yet.
    let stop_writing = Arc::new(AtomicBool::new(false));
    let written: Arc<Mutex<HashSet<i64>>> = Arc::default();
    let writer = {
        let (db, topic, stop_writing, written) = (
            db.clone(),
            topic.clone(),
            stop_writing.clone(),
            written.clone(),
        );
        std::thread::spawn(move || {
            while !stop_writing.load(Ordering::Relaxed) {
                let new = insert(&db, "outbox", &topic, 40, 7, DAY_OLD);
                written.lock().unwrap().extend(new);
            }
        })
    };
    // Three lives, each killed once its retention has deleted rows.
    for life in 0..3 {
        let mut walbox = Walbox::spawn(&env);
        wait_until(WAIT, "retention to delete rows", || {
            scrape(port, "walbox_outbox_retention_rows_deleted_total") >= 100.0
        });
        walbox.kill();
        eprintln!(
            "life {life}: killed with {} rows in the table",
            db.sql("SELECT count(*) FROM outbox")
        );
    }
    let mut walbox = Walbox::spawn(&env);
    stop_writing.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let written = written.lock().unwrap().clone();
    assert!(written.len() >= 300, "{} rows written", written.len());
    wait_until(WAIT, "retention to delete every row", || {
        db.sql("SELECT count(*) FROM outbox") == "0"
    });
    assert_relayed_exactly(
        &broker,
        &topic,
        &written,
        &walbox,
        "every deleted row was in Kafka first",
    );
    stop(&mut walbox);
}

#[test]
fn a_partition_that_cannot_be_created_is_reported_and_the_rest_goes_on() {
    // Today's rows sit in the default partition: today's partition cannot be created.
    let db = TestDb::new("retention_premake");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 1);
    partitioned_by_day(&db, "outbox_d", &slot, true);
    insert(&db, "outbox_d", &topic, 1, 1, IN_2000);
    insert(&db, "outbox_d", &topic, 1, 1, "now()");
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    let port = with_retention(
        &mut env,
        "1d",
        &[
            ("WALBOX_OUTBOX_TABLE", "public.outbox_d"),
            ("WALBOX_OUTBOX_RETENTION_PREMAKE", "2"),
        ],
    );
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "a failed pass", || {
        scrape(port, "walbox_outbox_retention_errors_total") >= 1.0
    });
    // Counted, then logged.
    wait_until(
        WAIT,
        "the failure in the log, naming the default partition",
        || {
            let log = walbox.log();
            log.contains("outbox retention failed") && log.contains("default partition")
        },
    );
    // The expired partition is dropped and the later days are created all the same (the
    // next two, whatever the day is by now).
    wait_until(WAIT, "the expired partition to be dropped", || {
        db.sql("SELECT to_regclass('outbox_d_2000') IS NULL") == "t"
    });
    wait_until(WAIT, "the partitions of the later days", || {
        scrape(port, "walbox_outbox_retention_partitions_created_total") >= 2.0
    });
    assert_eq!(db.sql("SELECT count(*) FROM outbox_d_rest"), "1");
    assert!(metric(&http_get(port, "/metrics").unwrap().1, "walbox_ha_active") == Some(1.0));
    stop(&mut walbox);
}

#[test]
fn only_the_active_walbox_runs_retention_and_a_standby_starts_it_when_it_takes_over() {
    let db = TestDb::new("retention_ha");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 1);
    db.create_slot_and_publication(&slot);
    insert(&db, "outbox", &topic, 300, 300, DAY_OLD);
    let written: Lsn = db
        .sql("SELECT pg_current_wal_insert_lsn()")
        .parse()
        .unwrap();
    // The active process runs without retention, and confirms every row.
    let env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    let mut active = Walbox::spawn(&env);
    wait_until(WAIT, "the rows to be confirmed", || {
        db.confirmed(&slot) >= written
    });
    // The standby has retention on: it must not run it while it waits.
    let mut env = env.clone();
    let port = with_retention(&mut env, "1h", &[]);
    let mut standby = Walbox::spawn(&env);
    wait_until(WAIT, "the second walbox to wait as a standby", || {
        standby
            .log()
            .contains("standby: another walbox relays this slot")
    });
    assert_eq!(db.sql("SELECT count(*) FROM outbox"), "300");
    active.kill();
    wait_until(WAIT, "the new active walbox to delete the old rows", || {
        db.sql("SELECT count(*) FROM outbox") == "0"
    });
    // The pass logs once its last batch is committed.
    wait_until(WAIT, "the deletion in the log", || {
        standby
            .log()
            .contains("outbox retention deleted rows older than keep")
    });
    let log = standby.log();
    let took_over = log
        .find("took over: this walbox is now the active one")
        .unwrap_or_else(|| panic!("no takeover in the log:\n{log}"));
    let deleted = log
        .find("outbox retention deleted rows older than keep")
        .unwrap_or_else(|| panic!("no deletion in the log:\n{log}"));
    assert!(
        took_over < deleted,
        "retention ran before the takeover:\n{log}"
    );
    settled(port, "walbox_outbox_retention_rows_deleted_total", 300.0);
    stop(&mut standby);
}

#[test]
fn an_idle_database_loses_its_expired_partition_within_two_intervals() {
    // Its own cluster, where nothing but walbox runs (WAL is the cluster's): no commit of
    // anyone else moves the slot past the position a drop waits for.
    let cluster: &'static PgCluster =
        Box::leak(Box::new(support::start_cluster(PgClusterOptions {
            settings: vec![("autovacuum".into(), "off".into())],
            ..support::pg_options()
        })));
    let db = TestDb::on(cluster, "retention_idle");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 1);
    partitioned_by_day(&db, "outbox_q", &slot, false);
    let old = insert(&db, "outbox_q", &topic, 20, 20, IN_2000);
    // Today's partition exists already, under the name retention gives it: the passes create
    // nothing.
    let today = db.sql(
        "SELECT 'outbox_q_p' || to_char(d, 'YYYYMMDD'), to_char(d, 'YYYY-MM-DD HH24:MI:SS'), \
                to_char(d + interval '1 day', 'YYYY-MM-DD HH24:MI:SS') \
         FROM (SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AS d) s",
    );
    let [name, from, to]: [&str; 3] = today
        .split('|')
        .collect::<Vec<_>>()
        .try_into()
        .unwrap_or_else(|_| panic!("{today}"));
    db.sql(&format!(
        "CREATE TABLE {name} PARTITION OF outbox_q FOR VALUES FROM ('{from}+00') TO ('{to}+00')"
    ));
    let interval = std::time::Duration::from_secs(3);
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    let port = with_retention(
        &mut env,
        "1d",
        &[
            ("WALBOX_OUTBOX_TABLE", "public.outbox_q"),
            ("WALBOX_OUTBOX_RETENTION_INTERVAL", "3s"),
            ("WALBOX_OUTBOX_RETENTION_PREMAKE", "0"),
        ],
    );
    let mut walbox = Walbox::spawn(&env);
    // Once the old rows are relayed and confirmed, nothing happens in the database.
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).len() >= old.len()),
        "{}",
        walbox.log()
    );
    wait_until(2 * interval, "the expired partition to be dropped", || {
        db.sql("SELECT to_regclass('outbox_q_2000') IS NULL") == "t"
    });
    settled(
        port,
        "walbox_outbox_retention_partitions_dropped_total",
        1.0,
    );
    assert_eq!(
        scrape(port, "walbox_outbox_retention_partitions_created_total"),
        0.0
    );
    // Every row of the dropped partition was in Kafka first.
    assert_eq!(distinct_ids(&reader.records), old);
    stop(&mut walbox);
}
