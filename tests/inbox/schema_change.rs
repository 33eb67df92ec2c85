//! Whose fault an effect error is: a table renamed under a running inbox is the database's, not
//! the records'. Under `on_error = "dead_letter"` no valid record may be dead-lettered for it:
//! walbox stops (exit 5) with the offsets uncommitted, and once the table is back every record
//! is applied exactly once.

use super::{
    assert_exactly_once, committed, effects, free_port, inbox_db, inbox_env, metric, produce, rec,
    Form, Rec,
};
use crate::support::{self, wait_until, Walbox, WAIT};

fn a_table_renamed_under_the_effect_stops_the_inbox_instead_of_dead_lettering_records(form: Form) {
    let db = inbox_db("inbox_rename");
    let broker = support::broker();
    let topic = format!("t_{}", db.name);
    let dlq = format!("dlq_{}", db.name);
    broker.create_topic(&topic, 1).expect("topic");
    broker.create_topic(&dlq, 1).expect("dlq topic");
    let brokers = broker.bootstrap_servers();
    let group = format!("g_{}", db.name);
    let batch = |from: usize, to: usize| -> Vec<Rec> {
        (from..to)
            .map(|i| rec("w", &format!("evt-{i}"), &format!("{{\"n\": {i}}}")))
            .collect()
    };
    let env = |port: u16| {
        form.env(inbox_env(
            &db,
            &brokers,
            &group,
            &topic,
            port,
            &[
                ("WALBOX_INBOX_EFFECT_RETRIES", "2"),
                ("WALBOX_INBOX_EFFECT_ON_ERROR", "dead_letter"),
                ("WALBOX_INBOX_KAFKA_DEAD_LETTER_TOPIC", &dlq),
            ],
        ))
    };
    produce(&brokers, &topic, &batch(0, 3));
    let port = free_port();
    let mut w = Walbox::spawn_subcommand("inbox", &env(port));
    wait_until(WAIT, "the first three effects", || effects(&db) == 3);

    // The effect's table is renamed (a migration in progress): valid records arrive meanwhile.
    db.sql("ALTER TABLE effects RENAME TO effects_moved");
    produce(&brokers, &topic, &batch(3, 8));
    let status = w.wait_exit(WAIT);
    assert_eq!(status.code(), Some(5), "{}", w.log());
    let last = w.last_line();
    assert!(
        last.contains("does not exist") && last.contains("not the record's"),
        "{last}"
    );
    assert!(
        !w.log().contains("record dead-lettered"),
        "valid records were dead-lettered:\n{}",
        w.log()
    );
    assert_eq!(committed(&brokers, &group, &topic, 1), [Some(3)]);

    // The table is back: every record is applied once, none dead-lettered.
    db.sql("ALTER TABLE effects_moved RENAME TO effects");
    let port = free_port();
    let mut w = Walbox::spawn_subcommand("inbox", &env(port));
    wait_until(WAIT, "all eight effects", || effects(&db) == 8);
    assert_eq!(metric(port, "walbox_inbox_dead_lettered_total"), Some(0.0));
    w.terminate();
    assert!(w.wait_exit(WAIT).success(), "{}", w.log());
    assert_exactly_once(&db, 8);
    assert_eq!(committed(&brokers, &group, &topic, 1), [Some(8)]);
}

both_forms!(a_table_renamed_under_the_effect_stops_the_inbox_instead_of_dead_lettering_records);
