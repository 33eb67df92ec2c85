//! `walbox_inbox_consumer_lag_records` for a group that has committed nothing: its backlog from
//! the log start (`auto.offset.reset = earliest`), not 0, while every record keeps failing.

use super::{committed, free_port, inbox_db, inbox_env, metric, produce, rec, wait_metric, Rec};
use crate::support::{self, Walbox, WAIT};

#[test]
fn a_new_group_that_processes_nothing_shows_its_whole_backlog_as_lag() {
    let db = inbox_db("inbox_lag");
    let broker = support::broker();
    let topic = format!("t_{}", db.name);
    broker.create_topic(&topic, 2).expect("topic");
    let brokers = broker.bootstrap_servers();
    let group = format!("g_{}", db.name);
    // Every record is poison and retried (almost) forever: the new group commits nothing.
    let records: Vec<Rec> = (0..30)
        .map(|i| Rec {
            partition: Some(i % 2),
            ..rec(&format!("w{i}"), &format!("evt-{i}"), r#"{"poison": true}"#)
        })
        .collect();
    produce(&brokers, &topic, &records);
    let port = free_port();
    let mut w = Walbox::spawn_subcommand(
        "inbox",
        &inbox_env(
            &db,
            &brokers,
            &group,
            &topic,
            port,
            &[("WALBOX_INBOX_EFFECT_RETRIES", "1000")],
        ),
    );
    wait_metric(port, "walbox_inbox_consumer_lag_records", 30.0, &w);
    assert!(
        metric(port, "walbox_inbox_effect_errors_total").is_some_and(|n| n >= 2.0),
        "the records are being retried"
    );
    assert_eq!(
        metric(port, "walbox_inbox_records_consumed_total"),
        Some(0.0)
    );
    w.terminate();
    assert!(w.wait_exit(WAIT).success(), "{}", w.log());
    assert_eq!(committed(&brokers, &group, &topic, 2), [None, None]);
}
