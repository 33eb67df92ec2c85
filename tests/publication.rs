//! The publication stops covering the outbox while walbox streams: rows inserted after the
//! change are never decoded, so walbox must not confirm past it, must stop with exit 5 and the
//! way to republish them, and must say so again at a restart. Each case follows the message as
//! an operator would, and every row of the outbox must reach Kafka.

use std::collections::BTreeSet;

use walbox::lsn::Lsn;
use walbox::sandbox::broker::TopicReader;

use crate::recovery::{ids, insert, table_ids};
use crate::support::{
    self, printed_command, since_in, walbox_cmd, walbox_env, TestDb, Walbox, WAIT,
};

/// An outbox table that replaces the first one, its ids far from the first one's.
const NEW_OUTBOX: &str = "CREATE TABLE outbox (
    id            bigint GENERATED ALWAYS AS IDENTITY (START WITH 1000) PRIMARY KEY,
    aggregate_id  text        NOT NULL,
    topic         text        NOT NULL,
    event_type    text        NOT NULL,
    payload       jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);";

/// One way of no longer covering the outbox.
struct Case {
    tag: &'static str,
    /// SQL that stops covering the outbox (`{p}`: the publication, `{new}`: [`NEW_OUTBOX`],
    /// `{topic}`: the test's topic) and selects `pg_current_wal_lsn()` right after the change.
    change: &'static str,
    /// Whether a start finds the outbox uncovered (a replaced table published again is not).
    refused_at_start: bool,
}

/// Streams 3 rows, applies `case`, inserts 3 more; then walbox must stop with exit 5 without
/// confirming past the change, a restart must refuse with the same way out, and following it
/// (the printed statement, a start, the printed `walbox republish`) must bring every row of
/// the outbox to Kafka.
fn stops_before_confirming_past_the_change(case: Case) {
    let db = TestDb::new(case.tag);
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 2);
    let env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let mut walbox = Walbox::spawn(&env);
    support::wait_until(WAIT, "walbox to stream", || db.streaming(&slot));
    insert(&db, &topic, 3);
    assert!(
        reader.poll_until(WAIT, |r| r.len() >= 3),
        "rows before the change"
    );
    let before = table_ids(&db);

    let sql = case
        .change
        .replace("{p}", &format!("\"{slot}\""))
        .replace("{new}", NEW_OUTBOX)
        .replace("{topic}", &topic);
    let changed: Lsn = db.sql(&sql).parse().expect("the change's LSN");
    insert(&db, &topic, 3);

    let status = walbox.wait_exit(WAIT);
    let line = walbox.last_line();
    assert_eq!(status.code(), Some(5), "{}", walbox.log());
    assert!(
        line.contains("stopped covering an outbox table while walbox streamed")
            && line.contains("runbook \"Publication changed\""),
        "{line}"
    );
    let confirmed = db.confirmed(&slot);
    assert!(
        confirmed <= changed,
        "the slot is confirmed up to {confirmed}, past the change at {changed}: {line}"
    );
    let republish = printed_command(&line, "republish");

    if case.refused_at_start {
        let mut again = Walbox::spawn(&env);
        let status = again.wait_exit(WAIT);
        let refusal = again.last_line();
        assert_eq!(status.code(), Some(5), "{}", again.log());
        assert!(
            refusal.contains("does not cover an outbox table")
                && refusal.contains(&format!("confirmed up to {confirmed}")),
            "{refusal}"
        );
        // The window starts no later than the first message's.
        assert!(since_in(&refusal) <= since_in(&line), "{refusal}\n{line}");
        assert_eq!(db.confirmed(&slot), confirmed);
    }

    // The way out, as printed: the statement that covers the table again, a start, the
    // republish command.
    // (A reading between the two statements of a replacement finds no table: create it again,
    // then add it; one between the replacement and its publication advises adding it, done
    // since.)
    let way_out = &line[line.find("Way out: ").expect("a way out")..];
    let start = way_out.find("start walbox").expect("then start walbox");
    if let Some(at) = way_out[..start].find("ALTER PUBLICATION") {
        let statement = &way_out[at..start - ", ".len()];
        if let Err(e) = db.try_sql(statement) {
            assert!(e.contains("is already member of publication"), "{e}");
        }
    }
    let mut walbox = Walbox::spawn(&env);
    support::wait_until(WAIT, "walbox to stream again", || db.streaming(&slot));
    let args: Vec<&str> = republish.iter().map(String::as_str).collect();
    let (code, out) = walbox_cmd(&args, &env);
    assert_eq!(code, 0, "{out}");
    let all: BTreeSet<String> = before.union(&table_ids(&db)).cloned().collect();
    assert!(
        reader.poll_until(WAIT, |r| ids(r).is_superset(&all)),
        "every row reached Kafka; missing: {:?}",
        all.difference(&ids(&reader.records)).collect::<Vec<_>>()
    );
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

#[test]
fn the_outbox_dropped_from_the_publication() {
    stops_before_confirming_past_the_change(Case {
        tag: "pub_droptable",
        change: "ALTER PUBLICATION {p} DROP TABLE outbox; SELECT pg_current_wal_lsn();",
        refused_at_start: true,
    });
}

#[test]
fn the_publication_set_to_another_table() {
    stops_before_confirming_past_the_change(Case {
        tag: "pub_settable",
        change: "ALTER PUBLICATION {p} SET TABLE payments; SELECT pg_current_wal_lsn();",
        refused_at_start: true,
    });
}

#[test]
fn the_publication_no_longer_publishing_inserts() {
    stops_before_confirming_past_the_change(Case {
        tag: "pub_noinsert",
        change:
            "ALTER PUBLICATION {p} SET (publish = 'update, delete'); SELECT pg_current_wal_lsn();",
        refused_at_start: true,
    });
}

#[test]
fn the_outbox_renamed_and_created_again() {
    stops_before_confirming_past_the_change(Case {
        tag: "pub_renameswap",
        change: "ALTER TABLE outbox RENAME TO outbox_old; {new} SELECT pg_current_wal_lsn();",
        refused_at_start: true,
    });
}

#[test]
fn the_outbox_dropped_and_created_again() {
    stops_before_confirming_past_the_change(Case {
        tag: "pub_dropswap",
        change: "DROP TABLE outbox; {new} SELECT pg_current_wal_lsn();",
        refused_at_start: true,
    });
}

/// The publication includes the new table a moment later: only its OID tells, and the rows
/// inserted in between are missing all the same.
#[test]
fn the_outbox_replaced_and_published_again() {
    stops_before_confirming_past_the_change(Case {
        tag: "pub_swapadd",
        change: "ALTER TABLE outbox RENAME TO outbox_old; {new} SELECT pg_current_wal_lsn();
                 INSERT INTO outbox (aggregate_id, topic, event_type, payload)
                   SELECT 'w', '{topic}', 'x', jsonb_build_object('g', g) FROM generate_series(1, 3) g;
                 ALTER PUBLICATION {p} ADD TABLE outbox;",
        refused_at_start: false,
    });
}
