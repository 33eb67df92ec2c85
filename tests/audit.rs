//! `walbox audit` against a hole and a duplicate made on purpose: a row committed while walbox
//! was stopped and skipped by advancing the slot past it by hand is reported missing (exit 14);
//! republishing a window is reported as duplicates (not a failure); republishing the hole
//! fills it (exit 0). Rows behind an open Kafka transaction are waited for, not reported
//! missing (Apache Kafka only).

use std::process::Command;

use walbox::sandbox::broker::TopicReader;

use crate::support::events::distinct_ids;
use crate::support::{self, wait_until, walbox_env, TestDb, Walbox, WAIT};

fn walbox_command(env: &[(String, String)], args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_walbox"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().cloned())
        .output()
        .expect("run walbox");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn insert(db: &TestDb, topic: &str, agg: &str) -> i64 {
    db.sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES ('{agg}', '{topic}', 'x', '{{}}') RETURNING id"
    ))
    .lines()
    .next()
    .unwrap()
    .parse()
    .unwrap()
}

fn ids(findings: &serde_json::Value) -> Vec<String> {
    findings
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_hole_is_missing_a_republished_window_is_duplicated_and_filling_the_hole_passes() {
    let db = TestDb::new("audit");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 2);
    db.create_slot_and_publication(&slot);
    let env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    let before: Vec<i64> = (0..5)
        .map(|i| insert(&db, &topic, &format!("a{i}")))
        .collect();
    let mut walbox = Walbox::spawn(&env);
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    assert!(reader.poll_until(WAIT, |r| distinct_ids(r).len() == 5));
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());

    // The hole: committed while walbox is stopped, then skipped by moving the slot past it.
    let hole = insert(&db, &topic, "hole");
    db.sql(&format!(
        "SELECT pg_replication_slot_advance('{slot}', pg_current_wal_lsn())"
    ));
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream again", || db.streaming(&slot));
    let after: Vec<i64> = (0..2)
        .map(|i| insert(&db, &topic, &format!("b{i}")))
        .collect();
    assert!(reader.poll_until(WAIT, |r| distinct_ids(r).len() == 7));

    let (code, stdout, stderr) = walbox_command(&env, &["audit", "--json"]);
    assert_eq!(code, Some(14), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(report["rows"], 8);
    assert_eq!(report["missing"], 1);
    assert_eq!(ids(&report["missing_ids"]), [hole.to_string()]);
    assert_eq!(report["duplicated"], 0);
    assert!(
        stderr.contains("1 of 8 outbox rows are not in Kafka"),
        "{stderr}"
    );
    // Reaching a partition's end is how the read finishes: no error line for it.
    assert!(!stderr.contains("PartitionEOF"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "the one error line: {stderr}");

    // A duplicate on purpose: republish the last two rows.
    let since = after[0].to_string();
    let (code, _, stderr) = walbox_command(&env, &["republish", "--since-id", &since]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stdout, _) = walbox_command(&env, &["audit", "--json", "--since-id", &since]);
    assert_eq!(code, Some(0), "only duplicates in this window: {stdout}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (report["rows"].as_u64(), report["missing"].as_u64()),
        (Some(2), Some(0))
    );
    let mut duplicated = ids(&report["duplicated_ids"]);
    duplicated.sort();
    let mut expected: Vec<String> = after.iter().map(i64::to_string).collect();
    expected.sort();
    assert_eq!(duplicated, expected);

    // Filling the hole the way the runbook says: republish from it.
    let (code, _, stderr) = walbox_command(&env, &["republish", "--since-id", &hole.to_string()]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stdout, stderr) = walbox_command(&env, &["audit"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("audited 8 rows: 0 missing, 2 duplicated"),
        "{stdout}"
    );
    assert!(before
        .iter()
        .all(|id| !stdout.contains(&format!("id={id} "))));
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

/// Two outbox tables routed to one topic (their ids overlap), a dead-letter topic, and a
/// record of another producer with an outbox id: a row missing from Kafka is found although
/// the other table's row with the same id is there, and although the other producer's record
/// carries its id; dead-lettered rows are reported as such, never missing; missing ids are
/// listed in numeric order, and the message names the first one.
#[test]
fn two_tables_on_one_topic_dead_letters_and_other_producers_are_told_apart() {
    use std::io::Write;

    use rdkafka::config::ClientConfig;
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    let db = TestDb::new("audit_tables");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 2);
    let bs = broker.bootstrap_servers();
    let dlq = format!("dlq_{}", db.name);
    broker.create_topic(&dlq, 1).unwrap();
    // Its own identity sequence: both tables number their rows 1, 2, 3, …
    db.sql(&format!(
        "CREATE TABLE outbox_b (LIKE outbox INCLUDING ALL);
         CREATE PUBLICATION {slot} FOR TABLE outbox, outbox_b WITH (publish = 'insert');
         SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput');"
    ));
    let mut file = tempfile::NamedTempFile::new().unwrap();
    write!(
        file,
        "[[outbox.tables]]\ntable = \"outbox\"\non_invalid = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n\
         [[outbox.tables]]\ntable = \"outbox_b\"\n"
    )
    .unwrap();
    let mut env = walbox_env(&db, &slot, &bs);
    env.push(("WALBOX_CONFIG".into(), file.path().display().to_string()));
    let row = |table: &str, topic: &str| {
        db.sql(&format!(
            "INSERT INTO {table} (aggregate_id, topic, event_type, payload) VALUES ('a', '{topic}', 'x', '{{}}') RETURNING id"
        ))
        .lines()
        .next()
        .unwrap()
        .to_owned()
    };
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream", || db.streaming(&slot));
    // outbox: 1–6 relayed; 7 cannot be mapped (no valid topic name) and 8 names a topic that
    // does not exist: both dead-lettered.
    for _ in 1..=6 {
        row("outbox", &topic);
    }
    assert_eq!(row("outbox", "not a topic!"), "7");
    assert_eq!(row("outbox", &format!("nosuch_{}", db.name)), "8");
    // outbox_b: 1–9 relayed, to the same topic.
    for _ in 1..=9 {
        row("outbox_b", &topic);
    }
    let mut reader = TopicReader::new(&bs, &[&topic, &dlq], WAIT).unwrap();
    assert!(
        reader.poll_until(WAIT, |r| r.len() >= 17),
        "{} records; log:\n{}",
        reader.records.len(),
        walbox.log()
    );
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());

    // Holes in outbox at 9 and 10: committed while walbox is stopped, then skipped.
    assert_eq!(row("outbox", &topic), "9");
    assert_eq!(row("outbox", &topic), "10");
    db.sql(&format!(
        "SELECT pg_replication_slot_advance('{slot}', pg_current_wal_lsn())"
    ));
    // Another producer's record that happens to carry the id of a hole.
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .create()
        .unwrap();
    producer
        .send(BaseRecord::to(&topic).key("other").payload("{}").headers(
            OwnedHeaders::new().insert(Header {
                key: "id",
                value: Some("10"),
            }),
        ))
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(std::time::Duration::from_secs(10)).unwrap();
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream again", || db.streaming(&slot));

    let (code, stdout, stderr) = walbox_command(&env, &["audit", "--json"]);
    assert_eq!(code, Some(14), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(report["rows"], 19, "{stdout}");
    assert_eq!(report["missing"], 2, "{stdout}");
    assert_eq!(ids(&report["missing_ids"]), ["9", "10"], "{stdout}");
    for f in report["missing_ids"].as_array().unwrap() {
        assert_eq!(f["table"], "public.outbox", "{stdout}");
    }
    assert_eq!(report["dead_lettered"], 2, "{stdout}");
    assert_eq!(ids(&report["dead_lettered_ids"]), ["7", "8"], "{stdout}");
    assert_eq!(report["duplicated"], 0, "{stdout}");
    assert!(
        stderr.contains("2 of 19 outbox rows are not in Kafka") && stderr.contains("--since-id 9"),
        "{stderr}"
    );
    let (code, stdout, _) = walbox_command(&env, &["audit"]);
    assert_eq!(code, Some(14));
    let listed: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("missing"))
        .collect();
    assert!(
        listed.len() == 2 && listed[0].ends_with("id=9") && listed[1].ends_with("id=10"),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("dead-letter {dlq}")), "{stdout}");

    // Republishing from the first missing id fills both holes; dead letters fail nothing.
    let (code, _, stderr) = walbox_command(&env, &["republish", "--since-id", "9"]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stdout, stderr) = walbox_command(&env, &["audit", "--json"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (report["missing"].as_u64(), report["dead_lettered"].as_u64()),
        (Some(0), Some(2)),
        "{stdout}"
    );
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

/// Issue 34: under read_committed a partition ends at its last stable offset, below records
/// already acknowledged or committed while a Kafka transaction is open on it (another
/// producer's, or one whose commit markers are still being written). The audit read only to
/// there and reported the rows behind it missing. Here another producer's transaction,
/// opened first, hides every walbox record until the broker aborts it (its 5 s timeout):
/// the audit must wait for it and find every row. Apache Kafka only: the mock cluster has no
/// last stable offset below its high watermark.
#[test]
fn rows_behind_an_open_kafka_transaction_are_waited_for_not_reported_missing() {
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let db = TestDb::new("audit_lso");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 1);
    if broker.mock_cluster().is_some() {
        eprintln!("needs Apache Kafka (WALBOX_TEST_KAFKA=apache): the mock cluster hides no record from read_committed readers; skipped");
        return;
    }
    db.create_slot_and_publication(&slot);
    let brokers = broker.bootstrap_servers();
    let foreign: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("transactional.id", format!("foreign-{slot}"))
        .set("transaction.timeout.ms", "5000")
        .create()
        .expect("producer");
    let call = std::time::Duration::from_secs(30);
    foreign.init_transactions(call).expect("init_transactions");
    foreign.begin_transaction().expect("begin");
    foreign
        .send(BaseRecord::to(&topic).key("foreign").payload("{}"))
        .map_err(|(e, _)| e)
        .expect("send");
    foreign.flush(call).expect("flush");

    let env = walbox_env(&db, &slot, &brokers);
    let mut walbox = Walbox::spawn(&env);
    let rows: Vec<i64> = (0..5)
        .map(|i| insert(&db, &topic, &format!("a{i}")))
        .collect();
    // Acknowledged (and seen by a read_uncommitted reader), hidden from read_committed ones.
    let mut reader = TopicReader::read_uncommitted(&brokers, &[&topic], WAIT).unwrap();
    assert!(reader.poll_until(WAIT, |r| r.len() >= 6));
    let (code, stdout, stderr) = walbox_command(&env, &["audit", "--json"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(
        (report["rows"].as_u64(), report["missing"].as_u64()),
        (Some(rows.len() as u64), Some(0)),
        "{stdout}"
    );
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

#[test]
fn with_shards_the_audit_waits_for_every_shards_slot_and_no_longer() {
    if !crate::shards::sharding_supported() {
        return;
    }
    let db = TestDb::new("audit_shards");
    let (topic, broker) = support::topic_on_broker(&db, 2);
    let (env, _, names) = crate::shards::served_shards(&db, &broker.bootstrap_servers(), 2);
    let mut walbox = crate::shards::start_streaming(&env, &db, &names);
    let ids: Vec<i64> = (0..10)
        .map(|i| insert(&db, &topic, &format!("s{i}")))
        .collect();
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    assert!(reader.poll_until(WAIT, |r| distinct_ids(r).len() == ids.len()));
    // The shards' slots, not postgres.slot (which no shard streams from), say the rows are in.
    let (code, stdout, stderr) = walbox_command(&env, &["audit", "--wait", "60s"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        !stdout.contains("had not confirmed") && !stderr.contains("has not confirmed"),
        "{stdout}\n{stderr}"
    );
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}
