//! Recovering from what the slot cannot replay, and stopping without leaving work behind: a
//! dropped slot, a dropped publication, a rejected event skipped by hand, SIGTERM during a
//! backlog. Each follows the message walbox prints, as an operator would.

use std::collections::{BTreeSet, HashSet};

use walbox::lsn::Lsn;
use walbox::sandbox::broker::{ConsumedRecord, TopicReader};

use crate::support::{self, since_in, wait_until, walbox_cmd, walbox_env, TestDb, Walbox, WAIT};

pub(crate) fn insert(db: &TestDb, topic: &str, n: usize) {
    db.sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) \
         SELECT 'a' || (g % 3), '{topic}', 'x', jsonb_build_object('g', g) FROM generate_series(1, {n}) g;"
    ));
}

pub(crate) fn table_ids(db: &TestDb) -> BTreeSet<String> {
    db.sql("SELECT id FROM outbox ORDER BY id")
        .lines()
        .map(str::to_owned)
        .collect()
}

pub(crate) fn ids(records: &[ConsumedRecord]) -> BTreeSet<String> {
    records
        .iter()
        .filter_map(|r| r.header_str("id").map(str::to_owned))
        .collect()
}

/// `walbox republish --since <since> --time-column created_at`, which must succeed; its output.
fn republish_since(since: &str, env: &[(String, String)]) -> String {
    let (code, out) = walbox_cmd(
        &["republish", "--since", since, "--time-column", "created_at"],
        env,
    );
    assert_eq!(code, 0, "{out}");
    out
}

fn slot_exists(db: &TestDb, slot: &str) -> bool {
    db.sql(&format!(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'"
    )) == "1"
}

#[test]
fn a_dropped_slot_stops_with_exit_7_and_the_window_until_recreated_and_republished() {
    let db = TestDb::new("slotdrop");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 2);
    let env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();

    // First start: the slot never existed, so walbox creates it.
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream from the slot it created", || {
        db.streaming(&slot)
    });
    insert(&db, &topic, 5);
    assert!(reader.poll_until(WAIT, |r| r.len() >= 5));
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    let confirmed = db.confirmed(&slot);

    // The slot disappears while walbox is stopped; events keep being committed.
    db.sql(&format!("SELECT pg_drop_replication_slot('{slot}')"));
    insert(&db, &topic, 4);

    let mut walbox = Walbox::spawn(&env);
    let status = walbox.wait_exit(WAIT);
    let line = walbox.last_line();
    assert_eq!(status.code(), Some(7), "{}", walbox.log());
    assert!(line.contains("existed and is gone"), "{line}");
    assert!(
        line.contains(&format!("confirmed up to {confirmed}")),
        "the window starts at the last confirmed position {confirmed}: {line}"
    );
    assert!(
        line.contains("walbox recreate-slot --confirm-data-loss"),
        "{line}"
    );
    assert!(
        !slot_exists(&db, &slot),
        "walbox must not recreate a slot that existed"
    );
    // A second start says the same: nothing is skipped silently.
    let mut again = Walbox::spawn(&env);
    assert_eq!(again.wait_exit(WAIT).code(), Some(7), "{}", again.log());
    assert!(!slot_exists(&db, &slot));
    let since = since_in(&line);

    // The runbook: recreate, republish the window, start.
    let (code, out) = walbox_cmd(&["recreate-slot", "--confirm-data-loss"], &env);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("old confirmed position: {confirmed}")),
        "{out}"
    );
    assert_eq!(
        since_in(&out),
        since,
        "recreate-slot prints the same window"
    );
    insert(&db, &topic, 3);
    republish_since(&since, &env);
    let mut walbox = Walbox::spawn(&env);
    let all = table_ids(&db);
    assert_eq!(all.len(), 12);
    assert!(
        reader.poll_until(WAIT, |r| ids(r) == all),
        "every row of the table reached Kafka; missing: {:?}",
        all.difference(&ids(&reader.records)).collect::<Vec<_>>()
    );
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    let republished: HashSet<String> = reader
        .records
        .iter()
        .filter(|r| r.header_str("walbox.commit_lsn") == Some("0/0"))
        .filter_map(|r| r.header_str("id").map(str::to_owned))
        .collect();
    let gap: Vec<String> = all.iter().skip(5).take(4).cloned().collect();
    assert!(
        gap.iter().all(|id| republished.contains(id)),
        "the gap {gap:?} came from republish: {republished:?}"
    );
}

#[test]
fn a_dropped_publication_exits_5_with_the_way_out_and_republish_fills_the_gap() {
    let db = TestDb::new("pubdrop");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 2);
    let env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream", || db.streaming(&slot));
    insert(&db, &topic, 3);
    assert!(reader.poll_until(WAIT, |r| r.len() >= 3));

    db.sql(&format!("DROP PUBLICATION \"{slot}\""));
    insert(&db, &topic, 3);
    let status = walbox.wait_exit(WAIT);
    let line = walbox.last_line();
    assert_eq!(status.code(), Some(5), "{}", walbox.log());
    assert!(line.contains("was dropped while walbox streamed"), "{line}");
    assert!(
        line.contains(&format!(
            "pg_replication_slot_advance('{slot}', pg_current_wal_lsn())"
        )),
        "{line}"
    );
    let since = since_in(&line);

    // The way out, as the message gives it.
    db.sql(&format!(
        "CREATE PUBLICATION \"{slot}\" FOR TABLE outbox WITH (publish = 'insert');
         SELECT pg_replication_slot_advance('{slot}', pg_current_wal_lsn());"
    ));
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream again", || db.streaming(&slot));
    insert(&db, &topic, 2);
    let out = republish_since(&since, &env);
    assert!(out.contains("republished"), "{out}");
    let all = table_ids(&db);
    assert_eq!(all.len(), 8);
    assert!(
        reader.poll_until(WAIT, |r| ids(r) == all),
        "every row reached Kafka; missing: {:?}",
        all.difference(&ids(&reader.records)).collect::<Vec<_>>()
    );
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

#[test]
fn republish_by_id_sends_the_rows_with_the_relays_mapping() {
    let db = TestDb::new("republishid");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 2);
    db.create_slot_and_publication(&slot);
    insert(&db, &topic, 12);
    let env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    let mut walbox = Walbox::spawn(&env);
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    assert!(reader.poll_until(WAIT, |r| r.len() >= 12));
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());

    // Ids 9..=12 again (10 > 9 numerically: the comparison is in the column's type).
    let (code, out) = walbox_cmd(&["republish", "--since-id", "9"], &env);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("republished 4 records from public.outbox"),
        "{out}"
    );
    assert!(reader.poll_until(WAIT, |r| r.len() >= 16));
    let relayed: Vec<&ConsumedRecord> = reader
        .records
        .iter()
        .filter(|r| r.header_str("walbox.commit_lsn") != Some("0/0"))
        .collect();
    let again: Vec<&ConsumedRecord> = reader
        .records
        .iter()
        .filter(|r| r.header_str("walbox.commit_lsn") == Some("0/0"))
        .collect();
    assert_eq!(
        ids(&again.iter().map(|r| (*r).clone()).collect::<Vec<_>>()),
        ["10", "11", "12", "9"].map(String::from).into()
    );
    for r in again {
        let original = relayed
            .iter()
            .find(|o| o.header_str("id") == r.header_str("id"))
            .expect("relayed original");
        assert_eq!(r.key, original.key, "same key");
        assert_eq!(r.payload, original.payload, "same value");
        assert_eq!(r.partition, original.partition, "same partition");
        assert_eq!(
            r.header_str("event_type"),
            original.header_str("event_type")
        );
    }

    let (code, out) = walbox_cmd(&["republish", "--since", "2026-01-01T00:00:00Z"], &env);
    assert_eq!(
        code, 3,
        "--since without a time column is a usage error: {out}"
    );
    assert!(out.contains("--time-column"), "{out}");
}

#[test]
fn the_exit_8_statement_skips_exactly_the_rejected_transaction() {
    let db = TestDb::new("skiptxn");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 2);
    db.create_slot_and_publication(&slot);
    insert(&db, &topic, 3);
    // 2 MB: over librdkafka's default message.max.bytes (1 MB).
    db.sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) \
         SELECT 'big', '{topic}', 'x', jsonb_build_object('pad', repeat('x', 2000000));"
    ));
    let big = db.sql("SELECT max(id) FROM outbox");
    insert(&db, &topic, 2);
    let commits = db.commits(&slot);
    assert_eq!(commits.len(), 3);

    let env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    let mut walbox = Walbox::spawn(&env);
    let status = walbox.wait_exit(WAIT);
    let line = walbox.last_line();
    assert_eq!(status.code(), Some(8), "{}", walbox.log());
    let at = line
        .find("SELECT pg_replication_slot_advance(")
        .unwrap_or_else(|| panic!("no statement in: {line}"));
    let statement = &line[at..at + line[at..].find(';').expect("statement ends with ;") + 1];
    assert_eq!(
        statement,
        format!(
            "SELECT pg_replication_slot_advance('{slot}', '{}');",
            commits[1].1
        ),
        "the statement advances to the end of the rejected transaction"
    );

    db.sql(statement);
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to confirm the last transaction", || {
        db.confirmed(&slot) >= commits[2].1
    });
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    reader.read_to_end(WAIT).unwrap();
    let mut expected = table_ids(&db);
    expected.remove(&big);
    assert_eq!(
        ids(&reader.records),
        expected,
        "everything but the skipped transaction"
    );
}

#[test]
fn sigterm_during_a_backlog_confirms_what_it_logged_and_a_restart_sends_no_duplicate() {
    let db = TestDb::new("sigtermbacklog");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 4);
    db.create_slot_and_publication(&slot);
    // 2,000 transactions of 10 events.
    db.sql(&format!(
        "DO $$ BEGIN FOR t IN 1..2000 LOOP \
           INSERT INTO outbox (aggregate_id, topic, event_type, payload) \
           SELECT 'a' || (g % 17), '{topic}', 'x', jsonb_build_object('t', t, 'g', g) FROM generate_series(1, 10) g; \
           COMMIT; \
         END LOOP; END $$;"
    ));
    let last_end = db.sql(&format!(
        "SELECT pg_current_wal_lsn()::text FROM pg_replication_slots WHERE slot_name = '{slot}'"
    ));
    let last_end: Lsn = last_end.parse().unwrap();

    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    // A narrow in-flight window keeps the backlog long enough to stop walbox in the middle.
    env.push(("WALBOX_RELAY_MAX_IN_FLIGHT".into(), "20".into()));
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let mut walbox = Walbox::spawn(&env);
    assert!(reader.poll_until(WAIT, |r| r.len() >= 100));
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    let log = walbox.log();
    let logged: Lsn = log
        .lines()
        .find_map(|l| {
            l.contains("replication session ended")
                .then(|| l.split("confirmed=").nth(1))?
                .map(|v| v.split_whitespace().next().unwrap_or_default().to_owned())
        })
        .unwrap_or_else(|| panic!("no final position logged:\n{log}"))
        .parse()
        .expect("an LSN");
    assert!(
        logged < last_end,
        "SIGTERM came during the backlog (confirmed {logged}, backlog ends before {last_end})"
    );
    assert_eq!(
        db.confirmed(&slot),
        logged,
        "the slot's confirmed_flush_lsn is the position walbox logged"
    );

    let mut walbox = Walbox::spawn(&env);
    assert!(
        reader.poll_until(WAIT * 2, |r| r.len() >= 20_000),
        "{} of 20000 arrived; log:\n{}",
        ids(&reader.records).len(),
        walbox.log()
    );
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    reader.read_to_end(WAIT).unwrap();
    assert_eq!(ids(&reader.records).len(), 20_000);
    assert_eq!(
        reader.records.len(),
        20_000,
        "a graceful stop leaves nothing to send twice"
    );
}

#[test]
fn a_row_the_server_cannot_decode_stops_walbox_with_exit_8_and_the_statement_that_skips_it() {
    // SQL_ASCII stores any byte; the walsender converts every value to walbox's UTF8 and
    // refuses one that is not UTF-8 (22021 invalid byte sequence), each time at the same
    // transaction.
    let db = TestDb::with_options(
        "sqlascii",
        "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0",
    );
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 1);
    db.create_slot_and_publication(&slot);
    insert(&db, &topic, 3);
    let before = table_ids(&db);
    let from: Lsn = db
        .sql("SELECT pg_current_wal_insert_lsn()")
        .parse()
        .unwrap();
    db.sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES (E'agg-\\xff', '{topic}', 'x', '{{}}')"
    ));
    let to: Lsn = db
        .sql("SELECT pg_current_wal_insert_lsn()")
        .parse()
        .unwrap();
    let bad = db.sql("SELECT max(id) FROM outbox");
    insert(&db, &topic, 2);
    let end: Lsn = db
        .sql("SELECT pg_current_wal_insert_lsn()")
        .parse()
        .unwrap();

    let env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    let mut walbox = Walbox::spawn(&env);
    let status = walbox.wait_exit(WAIT);
    let (log, line) = (walbox.log(), walbox.last_line());
    assert_eq!(status.code(), Some(8), "{log}");
    assert!(line.contains("22021"), "{line}");
    // Named by its commit position, which lies where the row was written.
    let commit: Lsn = line
        .split("commit ")
        .nth(1)
        .and_then(|rest| rest.split([',', ')', ' ']).next())
        .and_then(|lsn| lsn.parse().ok())
        .unwrap_or_else(|| panic!("no commit position in: {line}"));
    assert!(
        from < commit && commit < to,
        "{from} < {commit} < {to}: {line}"
    );
    let attempts = log
        .matches("replication session ended; reconnecting")
        .count();
    assert!(
        attempts <= 3,
        "{attempts} reconnects before giving up:\n{log}"
    );

    // Everything before it was relayed, and confirmed.
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    reader.read_to_end(WAIT).unwrap();
    assert_eq!(ids(&reader.records), before, "{log}");
    assert!(db.confirmed(&slot) < commit);

    // The statement skips exactly that transaction.
    let at = line
        .find("SELECT pg_replication_slot_advance(")
        .unwrap_or_else(|| panic!("no statement in: {line}"));
    let statement = &line[at..at + line[at..].find(';').expect("statement ends with ;") + 1];
    db.sql(statement);
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to confirm the last transaction", || {
        db.confirmed(&slot) >= end
    });
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    reader.read_to_end(WAIT).unwrap();
    let mut expected = table_ids(&db);
    expected.remove(&bad);
    assert_eq!(
        ids(&reader.records),
        expected,
        "everything but the skipped transaction"
    );
}
