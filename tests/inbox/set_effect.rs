//! The set-based effect (`effect.batch_sql`) as `docs/inbox.md` shows it: one `UPDATE … FROM
//! jsonb_to_recordset($records)` per batch applies every new record once, duplicates (within a
//! batch and replayed) are absorbed, a record whose payload is not JSON fails alone while the
//! others of its batch apply, and a statement that cannot work stops walbox at start-up with
//! one line saying why.

use super::{count, free_port, inbox_db, inbox_env, metric, produce, rec, wait_metric, Rec};
use crate::support::{self, Walbox, WAIT};
use walbox::sandbox::broker::TopicReader;

/// The example of `docs/inbox.md`: the amounts of a batch's new records summed per account,
/// one `UPDATE` for the batch.
const BATCH_SQL: &str = "UPDATE accounts a SET balance = a.balance + t.amount \
     FROM (SELECT r.key, sum((r.payload->>'amount')::numeric) AS amount \
           FROM jsonb_to_recordset($records) AS r(key text, payload jsonb) \
           GROUP BY r.key) t \
     WHERE a.id = t.key";

fn set_env(
    db: &support::TestDb,
    brokers: &str,
    topic: &str,
    port: u16,
    extra: &[(&str, &str)],
) -> Vec<(String, String)> {
    inbox_env(db, brokers, &format!("g_{}", db.name), topic, port, extra)
        .into_iter()
        .filter(|(k, _)| k != "WALBOX_INBOX_EFFECT_SQL")
        .collect()
}

#[test]
fn one_statement_per_batch_applies_every_new_record_once() {
    let db = inbox_db("inbox_set");
    db.sql(
        "CREATE TABLE accounts (id text PRIMARY KEY, balance numeric NOT NULL DEFAULT 0);
         INSERT INTO accounts (id) SELECT 'acct-' || n FROM generate_series(0, 4) n;",
    );
    let broker = support::broker();
    let topic = format!("t_{}", db.name);
    let dlq = format!("dlq_{}", db.name);
    broker.create_topic(&topic, 2).expect("topic");
    broker.create_topic(&dlq, 1).expect("dlq topic");
    let brokers = broker.bootstrap_servers();
    // Account i receives i + 1 payments of 1.5; the relay sent some twice (the repeat lands
    // in the same batch or a later one), and one record's payload is not JSON.
    let mut records: Vec<Rec> = Vec::new();
    for i in 0..5 {
        for j in 0..=i {
            let r = || {
                rec(
                    &format!("acct-{i}"),
                    &format!("pay-{i}-{j}"),
                    r#"{"amount": 1.5}"#,
                )
            };
            records.push(r());
            if j % 2 == 0 {
                records.push(r());
            }
        }
    }
    records.insert(7, rec("acct-0", "garbled", "{\"amount\": 1.5"));
    produce(&brokers, &topic, &records);
    let payments = 15;

    let port = free_port();
    let mut w = Walbox::spawn_subcommand(
        "inbox",
        &set_env(
            &db,
            &brokers,
            &topic,
            port,
            &[
                ("WALBOX_INBOX_EFFECT_BATCH_SQL", BATCH_SQL),
                ("WALBOX_INBOX_EFFECT_BATCH_LINGER", "300ms"),
                ("WALBOX_INBOX_EFFECT_RETRIES", "1"),
                ("WALBOX_INBOX_EFFECT_ON_ERROR", "dead_letter"),
                ("WALBOX_INBOX_KAFKA_DEAD_LETTER_TOPIC", &dlq),
            ],
        ),
    );
    wait_metric(
        port,
        "walbox_inbox_records_consumed_total",
        records.len() as f64,
        &w,
    );
    assert_eq!(
        metric(port, "walbox_inbox_effects_applied_total"),
        Some(payments as f64)
    );
    assert_eq!(metric(port, "walbox_inbox_dead_lettered_total"), Some(1.0));
    let transactions = metric(port, "walbox_inbox_batch_records_count").expect("histogram");
    w.terminate();
    assert!(w.wait_exit(WAIT).success(), "{}", w.log());
    assert_eq!(
        db.sql("SELECT string_agg(id || '=' || balance, ',' ORDER BY id) FROM accounts"),
        "acct-0=1.5,acct-1=3.0,acct-2=4.5,acct-3=6.0,acct-4=7.5"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM inbox"), payments);
    assert!(
        transactions < (records.len() - 1) as f64,
        "{transactions} transactions for {} records: not batched",
        records.len() - 1
    );
    let mut reader = TopicReader::new(&brokers, &[&dlq], WAIT).expect("reader");
    assert!(reader.poll_until(WAIT, |r| !r.is_empty()), "a dead letter");
    assert_eq!(reader.records[0].header_str("id"), Some("garbled"));
    assert!(reader.records[0]
        .header_str("walbox.error")
        .is_some_and(|e| e.contains("not JSON")));

    // Replayed from the beginning by a new group: every record absorbed, no balance moves
    // (the garbled one is dead-lettered again: it never had an inbox row).
    let port = free_port();
    let env: Vec<(String, String)> = set_env(
        &db,
        &brokers,
        &topic,
        port,
        &[
            ("WALBOX_INBOX_EFFECT_BATCH_SQL", BATCH_SQL),
            ("WALBOX_INBOX_EFFECT_RETRIES", "0"),
            ("WALBOX_INBOX_EFFECT_ON_ERROR", "dead_letter"),
            ("WALBOX_INBOX_KAFKA_DEAD_LETTER_TOPIC", &dlq),
        ],
    )
    .into_iter()
    .map(|(k, v)| match k.as_str() {
        "WALBOX_INBOX_KAFKA_GROUP_ID" => (k, format!("{v}_replay")),
        _ => (k, v),
    })
    .collect();
    let mut w = Walbox::spawn_subcommand("inbox", &env);
    wait_metric(
        port,
        "walbox_inbox_records_consumed_total",
        records.len() as f64,
        &w,
    );
    assert_eq!(
        metric(port, "walbox_inbox_effects_applied_total"),
        Some(0.0)
    );
    w.terminate();
    assert!(w.wait_exit(WAIT).success(), "{}", w.log());
    assert_eq!(
        db.sql("SELECT sum(balance) FROM accounts"),
        format!("{:.1}", payments as f64 * 1.5)
    );
}

#[test]
fn a_statement_that_cannot_work_stops_walbox_at_start_up_in_one_line() {
    let db = inbox_db("inbox_set_refused");
    let broker = support::broker();
    let topic = format!("t_{}", db.name);
    broker.create_topic(&topic, 1).expect("topic");
    let brokers = broker.bootstrap_servers();
    for (batch_sql, status, says) in [
        // The configuration: exit 3 before anything is reached.
        (
            "SELECT apply_effect($message_id, $key, $payload, $partition, $offset)",
            3,
            "effect.batch_sql: $message_id is a per-record placeholder",
        ),
        (
            "SELECT count(*) FROM effects",
            3,
            "must read the batch's records from $records",
        ),
        // The database: preparing the statement finds no such column, exit 5.
        (
            "INSERT INTO effects (message_id, amount) SELECT r.message_id, 1 FROM jsonb_to_recordset($records) AS r(message_id text)",
            5,
            "preparing the effect statement",
        ),
    ] {
        let mut w = Walbox::spawn_subcommand(
            "inbox",
            &set_env(
                &db,
                &brokers,
                &topic,
                free_port(),
                &[("WALBOX_INBOX_EFFECT_BATCH_SQL", batch_sql)],
            ),
        );
        let exit = w.wait_exit(WAIT);
        assert_eq!(exit.code(), Some(status), "{batch_sql}: {}", w.log());
        assert!(w.last_line().contains(says), "{batch_sql}: {}", w.log());
    }
    let both = inbox_env(
        &db,
        &brokers,
        "g",
        &topic,
        free_port(),
        &[(
            "WALBOX_INBOX_EFFECT_BATCH_SQL",
            "SELECT jsonb_array_length($records)",
        )],
    );
    let mut w = Walbox::spawn_subcommand("inbox", &both);
    assert_eq!(w.wait_exit(WAIT).code(), Some(3), "{}", w.log());
    assert!(
        w.last_line()
            .contains("effect.sql and effect.batch_sql are exclusive"),
        "{}",
        w.log()
    );
}

/// The second example of `docs/inbox.md`: every field a record has reaches the statement
/// (the timestamp as `timestamptz`, the offset, a `null` payload).
#[test]
fn the_records_fields_reach_the_statement() {
    let db = inbox_db("inbox_set_fields");
    db.sql(
        "CREATE SCHEMA billing;
         CREATE TABLE billing.payments (event_id text, account text, amount numeric, paid_at timestamptz,
             seq bigint GENERATED ALWAYS AS IDENTITY);",
    );
    let broker = support::broker();
    let topic = format!("t_{}", db.name);
    broker.create_topic(&topic, 1).expect("topic");
    let brokers = broker.bootstrap_servers();
    produce(
        &brokers,
        &topic,
        &[
            rec("acct-1", "e1", r#"{"amount": 2.5}"#),
            rec("acct-2", "e2", "null"),
            rec("acct-1", "e3", r#"{"amount": 1}"#),
        ],
    );
    let port = free_port();
    let mut w = Walbox::spawn_subcommand(
        "inbox",
        &set_env(
            &db,
            &brokers,
            &topic,
            port,
            &[(
                "WALBOX_INBOX_EFFECT_BATCH_SQL",
                "INSERT INTO billing.payments (event_id, account, amount, paid_at)
                 SELECT r.message_id, r.key, (r.payload->>'amount')::numeric, r.\"timestamp\"
                   FROM jsonb_to_recordset($records)
                        AS r(message_id text, key text, payload jsonb, \"timestamp\" timestamptz, \"offset\" bigint)
                  ORDER BY r.\"offset\"",
            )],
        ),
    );
    wait_metric(port, "walbox_inbox_effects_applied_total", 3.0, &w);
    w.terminate();
    assert!(w.wait_exit(WAIT).success(), "{}", w.log());
    assert_eq!(
        db.sql(
            "SELECT string_agg(event_id || ':' || account || ':' || coalesce(amount::text, '-') || ':' \
             || (abs(extract(epoch FROM now() - paid_at)) < 600)::text, ',' ORDER BY seq) FROM billing.payments"
        ),
        "e1:acct-1:2.5:true,e2:acct-2:-:true,e3:acct-1:1:true"
    );
}
