//! Managed outbox retention (`[outbox.retention]`): old rows go in batches, or whole partitions
//! of a table partitioned by time go and the next ones are created ahead; no row is deleted
//! while the slot has not confirmed it (the broker refusing every record holds retention
//! back); deletions produce no events; a failing retention is reported and the relay goes on.

use std::collections::HashSet;

use walbox::sandbox::broker::TopicReader;

use crate::support::events::distinct_ids;
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

fn ids(out: &str) -> HashSet<i64> {
    out.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

#[test]
fn old_rows_are_deleted_in_batches_only_once_confirmed_and_no_event_is_lost() {
    let db = TestDb::new("retention_rows");
    let slot = db.name.clone();
    let topic = format!("t_{}", db.name);
    let broker = support::broker();
    let Some(mock) = broker.mock_cluster() else {
        eprintln!("external broker: holding acknowledgements back needs the mock cluster; skipped");
        return;
    };
    broker.create_topic(&topic, 2).expect("topic");
    db.create_slot_and_publication(&slot);
    // 1,000 rows a day old and 10 young ones, all in the slot's stream.
    let old = ids(&db.sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload, created_at) \
         SELECT 'agg-' || (i % 13), '{topic}', 'x', '{{}}', now() - interval '1 day' \
         FROM generate_series(1, 1000) i RETURNING id"
    )));
    let young = ids(&db.sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) \
         SELECT 'agg-' || i, '{topic}', 'x', '{{}}' FROM generate_series(1, 10) i RETURNING id"
    )));
    assert_eq!((old.len(), young.len()), (1000, 10));

    // The broker refuses every record: nothing is acknowledged, so nothing is confirmed.
    support::fail_every_produce(mock);
    let port = free_port();
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    set(&mut env, "WALBOX_HTTP_LISTEN", format!("127.0.0.1:{port}"));
    set(&mut env, "WALBOX_OUTBOX_RETENTION_KEEP", "1h".into());
    set(&mut env, "WALBOX_OUTBOX_RETENTION_INTERVAL", "1s".into());
    set(&mut env, "WALBOX_OUTBOX_RETENTION_BATCH_SIZE", "150".into());
    set(
        &mut env,
        "WALBOX_OUTBOX_RETENTION_COLUMN",
        "created_at".into(),
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
    assert_eq!(
        scrape(port, "walbox_outbox_retention_rows_deleted_total"),
        1000.0
    );
    assert!(
        scrape(
            port,
            "walbox_outbox_retention_last_success_timestamp_seconds"
        ) > 0.0
    );
    assert_eq!(scrape(port, "walbox_outbox_retention_errors_total"), 0.0);

    // Every row reached Kafka, and the deletions added nothing.
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let all: HashSet<i64> = old.union(&young).copied().collect();
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).len() >= all.len()),
        "{} of {} events; log:\n{}",
        distinct_ids(&reader.records).len(),
        all.len(),
        walbox.log()
    );
    assert_eq!(distinct_ids(&reader.records), all);
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

#[test]
fn a_table_partitioned_by_time_loses_old_partitions_and_gets_new_ones_ahead() {
    let db = TestDb::new("retention_parts");
    let slot = db.name.clone();
    let topic = format!("t_{}", db.name);
    let broker = support::broker();
    broker.create_topic(&topic, 1).expect("topic");
    db.sql(&format!(
        "CREATE TABLE outbox_p (
             id bigint GENERATED ALWAYS AS IDENTITY,
             aggregate_id text NOT NULL, topic text NOT NULL, event_type text NOT NULL,
             payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
             PRIMARY KEY (id, created_at)
         ) PARTITION BY RANGE (created_at);
         CREATE TABLE outbox_p_2000 PARTITION OF outbox_p
             FOR VALUES FROM ('2000-01-01 00:00:00+00') TO ('2000-01-02 00:00:00+00');
         CREATE TABLE outbox_p_rest PARTITION OF outbox_p DEFAULT;
         CREATE PUBLICATION {slot} FOR TABLE outbox_p WITH (publish = 'insert', publish_via_partition_root = true);
         SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput');"
    ));
    let old = ids(&db.sql(&format!(
        "INSERT INTO outbox_p (aggregate_id, topic, event_type, payload, created_at) \
         SELECT 'agg-' || i, '{topic}', 'x', '{{}}', '2000-01-01 12:00:00+00' \
         FROM generate_series(1, 50) i RETURNING id"
    )));
    let port = free_port();
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    set(&mut env, "WALBOX_HTTP_LISTEN", format!("127.0.0.1:{port}"));
    set(&mut env, "WALBOX_OUTBOX_TABLE", "public.outbox_p".into());
    set(&mut env, "WALBOX_OUTBOX_RETENTION_KEEP", "1d".into());
    set(&mut env, "WALBOX_OUTBOX_RETENTION_INTERVAL", "1s".into());
    set(
        &mut env,
        "WALBOX_OUTBOX_RETENTION_COLUMN",
        "created_at".into(),
    );
    set(&mut env, "WALBOX_OUTBOX_RETENTION_PREMAKE", "2".into());
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
    assert_eq!(
        scrape(port, "walbox_outbox_retention_partitions_dropped_total"),
        1.0
    );
    assert_eq!(
        scrape(port, "walbox_outbox_retention_partitions_created_total"),
        3.0
    );
    assert_eq!(
        db.sql("SELECT to_regclass('outbox_p_rest') IS NOT NULL"),
        "t",
        "the default partition stays"
    );

    // New rows land in today's partition and are relayed; the dropped ones were relayed first.
    let new = ids(&db.sql(&format!(
        "INSERT INTO outbox_p (aggregate_id, topic, event_type, payload) \
         SELECT 'agg-' || i, '{topic}', 'x', '{{}}' FROM generate_series(1, 20) i RETURNING id"
    )));
    assert_eq!(
        db.sql(&format!(
            "SELECT count(*) FROM {} WHERE created_at >= now() - interval '1 minute'",
            expected[0]
        )),
        "20"
    );
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let all: HashSet<i64> = old.union(&new).copied().collect();
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).len() >= all.len()),
        "{} of {} events; log:\n{}",
        distinct_ids(&reader.records).len(),
        all.len(),
        walbox.log()
    );
    assert_eq!(distinct_ids(&reader.records), all);
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

#[test]
fn a_failing_retention_is_counted_and_logged_while_the_relay_goes_on() {
    let db = TestDb::new("retention_fail");
    let slot = db.name.clone();
    let topic = format!("t_{}", db.name);
    let broker = support::broker();
    broker.create_topic(&topic, 1).expect("topic");
    let port = free_port();
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    set(&mut env, "WALBOX_HTTP_LISTEN", format!("127.0.0.1:{port}"));
    set(&mut env, "WALBOX_OUTBOX_RETENTION_KEEP", "1h".into());
    set(&mut env, "WALBOX_OUTBOX_RETENTION_INTERVAL", "1s".into());
    set(
        &mut env,
        "WALBOX_OUTBOX_RETENTION_COLUMN",
        "no_such_column".into(),
    );
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "two failed retention passes", || {
        scrape(port, "walbox_outbox_retention_errors_total") >= 2.0
    });
    assert!(
        walbox
            .log()
            .contains("outbox retention failed; retrying at the next interval"),
        "{}",
        walbox.log()
    );
    assert!(walbox.log().contains("no_such_column"), "{}", walbox.log());
    let id: i64 = db
        .sql(&format!(
            "INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES ('a', '{topic}', 'x', '{{}}') RETURNING id"
        ))
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).contains(&id)),
        "the relay goes on; log:\n{}",
        walbox.log()
    );
    assert!(metric(&http_get(port, "/metrics").unwrap().1, "walbox_ha_active") == Some(1.0));
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}
