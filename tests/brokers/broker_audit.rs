//! `walbox audit` and `walbox republish` on the brokers that can be read back (Redis Streams,
//! NATS JetStream): a row the slot skipped is reported missing, with the exit status and the
//! broker named; republishing from it fills the hole, and the audit then passes. On RabbitMQ,
//! whose queues are consumed, the audit says so in one line (exit 3). And a record the broker
//! refuses stops walbox with exit 8 and the statement that skips it, nothing confirmed past it
//! (Redis, NATS, RabbitMQ).

use crate::broker_relay::{env_for, Target};
use crate::broker_targets::{NatsTarget, RabbitTarget, RedisTarget};
use crate::support::brokers::{nats, rabbitmq, redis};
use crate::support::events::distinct_ids;
use crate::support::{wait_until, walbox_output, TestDb, Walbox, WAIT};

/// Inserts one outbox row for `destination`; its id.
pub(crate) fn insert(db: &TestDb, destination: &str, agg: &str) -> i64 {
    db.sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES ('{agg}', '{destination}', 'x', '{{}}') RETURNING id"
    ))
    .lines()
    .next()
    .and_then(|l| l.trim().parse().ok())
    .expect("the new row's id")
}

/// Exit status, stdout and stderr of `walbox <args>`.
fn run(env: &[(String, String)], args: &[&str]) -> (Option<i32>, String, String) {
    let out = walbox_output(args, env);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn audit_finds_the_hole_and_republish_fills_it(target: &mut dyn Target, tag: &str, name: &str) {
    let db = TestDb::new(tag);
    let slot = db.name.clone();
    db.create_slot_and_publication(&slot);
    let env = env_for(&db, &slot, target);
    let destination = target.destination();
    for i in 0..5 {
        insert(&db, &destination, &format!("a{i}"));
    }
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "the first five events", || {
        distinct_ids(&target.read_all()).len() == 5
    });
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    // The hole: committed while walbox is stopped, then skipped by moving the slot past it.
    let hole = insert(&db, &destination, "hole");
    db.sql(&format!(
        "SELECT pg_replication_slot_advance('{slot}', pg_current_wal_lsn())"
    ));
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream again", || db.streaming(&slot));
    for i in 0..2 {
        insert(&db, &destination, &format!("b{i}"));
    }
    wait_until(WAIT, "the two later events", || {
        distinct_ids(&target.read_all()).len() == 7
    });

    let (code, stdout, stderr) = run(&env, &["audit", "--json"]);
    assert_eq!(code, Some(14), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("a JSON report");
    assert_eq!(report["rows"], 8, "{stdout}");
    assert_eq!(report["missing"], 1, "{stdout}");
    assert_eq!(report["missing_ids"][0]["id"], hole.to_string(), "{stdout}");
    assert!(
        stderr.contains(&format!("1 of 8 outbox rows are not in {name}")),
        "{stderr}"
    );

    let (code, _, stderr) = run(&env, &["republish", "--since-id", &hole.to_string()]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stdout, stderr) = run(&env, &["audit"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("audited 8 rows: 0 missing"), "{stdout}");
    assert!(distinct_ids(&target.read_all()).contains(&hole));
    // The relay goes on above the republished entries.
    let later = insert(&db, &destination, "c0");
    wait_until(WAIT, "an event after the republish", || {
        distinct_ids(&target.read_all()).contains(&later)
    });
    assert!(walbox.running(), "walbox exited:\n{}", walbox.log());
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

#[test]
fn redis_audit_finds_a_hole_and_republish_fills_it() {
    let Some(server) = redis() else { return };
    audit_finds_the_hole_and_republish_fills_it(
        &mut RedisTarget::new(server.url()),
        "redis_audit",
        "Redis",
    );
}

#[test]
fn nats_audit_finds_a_hole_and_republish_fills_it() {
    let Some(server) = nats() else { return };
    audit_finds_the_hole_and_republish_fills_it(
        &mut NatsTarget::new(server.url()),
        "nats_audit",
        "NATS",
    );
}

#[test]
fn rabbitmq_audit_says_in_one_line_that_queues_cannot_be_read_back() {
    let Some(node) = rabbitmq() else { return };
    let target = RabbitTarget::new(node.port());
    let db = TestDb::new("rabbit_audit");
    let env = env_for(&db, &db.name, &target);
    let (code, _, stderr) = run(&env, &["audit"]);
    assert_eq!(code, Some(3), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("RabbitMQ's queues are consumed"),
        "{stderr}"
    );
}

/// A record the broker refuses for its own sake (Redis: a key of another type; NATS: a
/// subject no stream captures; RabbitMQ: a routing key no queue is bound for) stops walbox
/// with exit 8, the one line naming the event, `names` and the statement that skips its
/// transaction, and nothing past it is confirmed.
fn a_refused_record_exits_8(target: &mut dyn Target, bad: &str, names: &[&str], tag: &str) {
    let db = TestDb::new(tag);
    let slot = db.name.clone();
    db.create_slot_and_publication(&slot);
    let env = env_for(&db, &slot, target);
    let good = target.destination();
    insert(&db, &good, "a");
    let refused = insert(&db, bad, "a");
    insert(&db, &good, "a");
    let commits = db.commits(&slot);
    assert_eq!(commits.len(), 3);
    let mut walbox = Walbox::spawn(&env);
    let status = walbox.wait_exit(WAIT);
    let line = walbox.last_line();
    assert_eq!(status.code(), Some(8), "{}", walbox.log());
    assert!(
        line.contains(&format!("event {refused} ")) && line.contains("pg_replication_slot_advance"),
        "the error names the event and the statement that skips it: {line}"
    );
    for name in names {
        assert!(line.contains(name), "the error names {name}: {line}");
    }
    assert!(
        db.confirmed(&slot) < commits[1].1,
        "confirmed past the refused event"
    );
    // Skipped as told: the rest is relayed, and what the refused session had already sent
    // past the refused event is confirmed as delivered, not stored twice.
    let at = line
        .find("SELECT pg_replication_slot_advance(")
        .expect("the statement");
    let statement = &line[at..at + line[at..].find(';').expect("a statement ends with ;") + 1];
    db.sql(statement);
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "the last transaction confirmed", || {
        db.confirmed(&slot) >= commits[2].1
    });
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    let records = target.read_all();
    assert_eq!(distinct_ids(&records).len(), 2, "{}", walbox.log());
    if !target.duplicates_possible() {
        assert_eq!(records.len(), 2, "each once: {}", walbox.log());
    }
    assert!(!distinct_ids(&records).contains(&refused));
}

#[test]
fn redis_a_key_of_another_type_exits_8_and_confirms_nothing_past_it() {
    let Some(server) = redis() else { return };
    let mut target = RedisTarget::new(server.url());
    let bad = crate::support::unique("not_a_stream");
    assert_eq!(server.command(&["SET", &bad, "x"]).unwrap(), "+OK\r\n");
    a_refused_record_exits_8(&mut target, &bad, &[&bad], "redis_refused");
}

#[test]
fn nats_a_subject_no_stream_captures_exits_8_and_confirms_nothing_past_it() {
    let Some(server) = nats() else { return };
    let mut target = NatsTarget::new(server.url());
    let bad = format!(
        "{}.orders",
        crate::support::unique("nostream").replace('_', "-")
    );
    a_refused_record_exits_8(&mut target, &bad, &[&bad], "nats_refused");
}

#[test]
fn rabbitmq_an_unroutable_record_exits_8_names_exchange_and_routing_key() {
    let Some(node) = rabbitmq() else { return };
    let mut target = RabbitTarget::new(node.port());
    let bad = crate::support::unique("unbound");
    let exchange = format!("exchange {:?}", target.exchange());
    let key = format!("routing key {bad:?}");
    a_refused_record_exits_8(&mut target, &bad, &[&exchange, &key], "rabbit_refused");
}
