//! Outbox events as a test writes them and a consumer reads them back: the ids a committed
//! transaction inserted, and the checks every delivery test makes on what arrived.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use walbox::lsn::Lsn;
use walbox::sandbox::broker::{ConsumedRecord, TopicReader};

use super::{TestDb, Walbox, WAIT};

/// A committed transaction as the writer saw it.
pub struct Written {
    pub ids: Vec<i64>,
    /// `pg_current_wal_insert_lsn()` right after COMMIT: at or past the commit's end LSN.
    pub after_commit: Lsn,
}

/// What [`random_writer`] writes: `total` events in transactions of 1..=`max_rows` rows, each
/// row for one of `aggregates` aggregates (`agg-0`, …), seeded so that a run can be repeated.
pub struct RandomWrites {
    pub seed: u64,
    pub total: usize,
    pub max_rows: usize,
    pub aggregates: usize,
    /// A row in a non-outbox table too, in one transaction in this many (`None`: never).
    pub other_table_one_in: Option<u32>,
}

/// A thread writing `writes` straight to PostgreSQL; every committed transaction is pushed to
/// the returned list as it commits.
pub fn random_writer(
    db: &TestDb,
    topic: &str,
    writes: RandomWrites,
) -> (Arc<Mutex<Vec<Written>>>, std::thread::JoinHandle<()>) {
    let written: Arc<Mutex<Vec<Written>>> = Arc::default();
    let (db, topic, list) = (db.clone(), topic.to_owned(), written.clone());
    let writer = std::thread::spawn(move || {
        let mut rng = StdRng::seed_from_u64(writes.seed);
        let mut total = 0;
        while total < writes.total {
            let n = rng
                .random_range(1..=writes.max_rows)
                .min(writes.total - total);
            let aggs: Vec<String> = (0..n)
                .map(|_| format!("agg-{}", rng.random_range(0..writes.aggregates)))
                .collect();
            let other = writes
                .other_table_one_in
                .is_some_and(|k| rng.random_ratio(1, k));
            let w = write_txn(&db, &topic, &aggs, other);
            list.lock().unwrap().push(w);
            total += n;
        }
    });
    (written, writer)
}

/// `n` transactions of [`write_txn`] (no other table); returns the ids of every row.
pub fn write_txns(db: &TestDb, topic: &str, aggregates: &[String], n: usize) -> Vec<i64> {
    (0..n)
        .flat_map(|_| write_txn(db, topic, aggregates, false).ids)
        .collect()
}

/// Inserts `rows` outbox rows for `aggregates[i]` in one transaction; returns ids and the LSN
/// after the commit.
pub fn write_txn(
    db: &TestDb,
    topic: &str,
    aggregates: &[String],
    also_other_table: bool,
) -> Written {
    let mut sql = String::from("BEGIN;\n");
    if also_other_table {
        sql.push_str("INSERT INTO payments (wallet_id, amount) VALUES ('w', 1);\n");
    }
    sql.push_str("INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES ");
    for (i, agg) in aggregates.iter().enumerate() {
        if i > 0 {
            sql.push(',');
        }
        sql.push_str(&format!(
            "('{agg}', '{topic}', 'thing.happened', jsonb_build_object('agg', '{agg}', 'i', {i}, 'text', 'caf\u{e9} \"q\" \\\\ ✓'))"
        ));
    }
    sql.push_str(" RETURNING id;\nCOMMIT;\nSELECT pg_current_wal_insert_lsn();");
    let out = db.sql(&sql);
    let mut lines: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
    let lsn = lines.pop().expect("lsn line").parse().expect("lsn");
    let ids = lines.iter().filter_map(|l| l.parse::<i64>().ok()).collect();
    Written {
        ids,
        after_commit: lsn,
    }
}

pub fn id_of(r: &ConsumedRecord) -> i64 {
    r.header_str("id")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("record without numeric id header: {r:?}"))
}

pub fn distinct_ids(records: &[ConsumedRecord]) -> HashSet<i64> {
    records.iter().map(id_of).collect()
}

/// Every id in `db`'s outbox table.
pub fn outbox_ids(db: &TestDb) -> HashSet<i64> {
    db.sql("SELECT id FROM outbox")
        .lines()
        .map(|l| l.trim().parse().expect("id"))
        .collect()
}

/// Reads until `reader` holds `n` distinct ids; fails with the count and `walbox`'s log.
pub fn await_distinct(reader: &mut TopicReader, n: usize, walbox: &Walbox) {
    assert!(
        reader.poll_until(WAIT, |r| distinct_ids(r).len() >= n),
        "{} of {n} events arrived; log:\n{}",
        distinct_ids(&reader.records).len(),
        walbox.log()
    );
}

/// Stops `walbox` (SIGTERM, which must end it with status 0) and reads the topics to their
/// end: they must then hold exactly the ids `all`.
pub fn stop_and_read_exactly(walbox: &mut Walbox, reader: &mut TopicReader, all: &HashSet<i64>) {
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    reader.read_to_end(WAIT).unwrap();
    assert_eq!(
        &distinct_ids(&reader.records),
        all,
        "every committed event, nothing else"
    );
}

/// How often each id occurs in `ids`.
pub fn id_counts(ids: impl IntoIterator<Item = i64>) -> HashMap<i64, usize> {
    let mut n = HashMap::new();
    for id in ids {
        *n.entry(id).or_insert(0) += 1;
    }
    n
}

/// The ids that occur more than once in `ids`.
pub fn ids_twice(ids: impl IntoIterator<Item = i64>) -> Vec<i64> {
    id_counts(ids)
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(id, _)| id)
        .collect()
}

/// Every event once, except those of an aborted Kafka transaction (`aborted`), which a broker
/// that shows aborted records may hold twice; and per-aggregate commit order.
pub fn assert_once_but_the_aborted(records: &[ConsumedRecord], aborted: &[i64]) {
    let aborted: HashSet<i64> = aborted.iter().copied().collect();
    for (id, n) in id_counts(records.iter().map(id_of)) {
        assert!(
            n == 1 || (n == 2 && aborted.contains(&id)),
            "event {id} in Kafka {n} times, and not of the aborted transaction"
        );
    }
    assert_per_aggregate_commit_order(records);
}

/// Per aggregate, the event ids in the order a consumer sees them, duplicates removed (first
/// occurrence kept), must be increasing: one writer, so id order is commit order.
pub fn assert_per_aggregate_commit_order(records: &[ConsumedRecord]) {
    let mut seen = HashSet::new();
    let mut last: HashMap<Vec<u8>, i64> = HashMap::new();
    for r in records {
        let id = id_of(r);
        if !seen.insert(id) {
            continue;
        }
        let key = r.key.clone().expect("key");
        if let Some(prev) = last.insert(key.clone(), id) {
            assert!(
                prev < id,
                "aggregate {} out of commit order: {prev} then {id}",
                String::from_utf8_lossy(&key)
            );
        }
    }
}

/// One transaction of `n` outbox rows for `topic` (aggregates `a1`…), each payload padded
/// with `size` bytes: the SQL.
pub fn padded_rows(topic: &str, n: usize, size: usize) -> String {
    format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) \
         SELECT 'a' || g, '{topic}', 'x', jsonb_build_object('pad', repeat('x', {size})) FROM generate_series(1, {n}) g;"
    )
}
