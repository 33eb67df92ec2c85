//! Moving from Debezium to walbox on a live database, the way docs/migrating.md's runbook does
//! it: Kafka Connect with the Debezium PostgreSQL connector and its Outbox Event Router (the
//! differential test's own connector, `tests/debezium.rs`) relays part of a stream a writer
//! keeps committing, and is killed (SIGKILL: the worst case for the position it confirmed).
//! walbox then starts on Debezium's own slot and publication, with the configuration that
//! `walbox from-debezium` makes from the connector's configuration file, into the same topics.
//!
//! What must hold: the union of both relays holds every committed event, and nothing else;
//! neither relay writes an event twice; walbox writes nothing Debezium's confirmed position
//! covers, so an event is written twice only in the overlap (produced by Debezium, not yet
//! confirmed by it), and the test counts them; the two copies of such an event are the same
//! record (topic, partition, key, value, headers but the relays' own); in each partition
//! Debezium's records come
//! before walbox's, so a consumer that drops repeated `id`s reads every aggregate's events in
//! commit order. Runs only with `WALBOX_TEST_KAFKA=apache` (scripts/real-kafka.sh).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use walbox::lsn::Lsn;
use walbox::sandbox::broker::{ConsumedRecord, TopicReader};

use crate::debezium::{comparable_headers, router, AGGREGATE_TYPES, INSERT, PARTITIONS, TABLE};
use crate::support::debezium::{Connect, ConnectorSpec};
use crate::support::{self, kafka, wait_until, walbox_env, TestDb, Walbox, WAIT};

/// The topics' prefix (the shared broker holds the differential test's topics too).
const PREFIX: &str = "mig.";
/// Aggregates the writer spreads its events over.
const AGGREGATES: usize = 12;

/// Commits transactions of 1 to 4 events until `stop`, rolling every 7th back. Each event's
/// payload carries a sequence number, in commit order (one writer). Returns how many
/// transactions it began.
fn writer(db: TestDb, stop: Arc<AtomicBool>) -> JoinHandle<usize> {
    std::thread::spawn(move || {
        let (mut seq, mut txns) = (0usize, 0usize);
        while !stop.load(Ordering::Relaxed) {
            txns += 1;
            let rows: Vec<String> = (0..1 + txns % 4)
                .map(|_| {
                    seq += 1;
                    let aggregate = seq * 7 % AGGREGATES;
                    let t = AGGREGATE_TYPES[aggregate % AGGREGATE_TYPES.len()];
                    format!(
                        "(gen_random_uuid(), '{t}', '{t}-{aggregate}', '{t}.changed', \
                         jsonb_build_object('seq', {seq}), 'tenant-{}', {seq}, NULL)",
                        aggregate % 2
                    )
                })
                .collect();
            let end = if txns % 7 == 0 { "ROLLBACK" } else { "COMMIT" };
            db.sql(&format!("BEGIN; {INSERT}{}; {end};", rows.join(", ")));
        }
        txns
    })
}

/// One consumed event.
#[derive(Debug)]
struct Event {
    id: String,
    key: String,
    seq: u64,
    /// walbox's `walbox.commit_lsn` header: `None` for Debezium's records.
    commit: Option<Lsn>,
    partition: (String, i32),
    offset: i64,
}

fn event(r: &ConsumedRecord) -> Event {
    let payload: serde_json::Value =
        serde_json::from_slice(r.payload.as_deref().unwrap_or_default()).expect("JSON payload");
    Event {
        id: r.header_str("id").expect("an id header").to_owned(),
        key: String::from_utf8(r.key.clone().expect("a key")).expect("a text key"),
        seq: payload["seq"].as_u64().expect("a seq"),
        commit: r
            .header_str("walbox.commit_lsn")
            .map(|l| l.parse().expect("an LSN")),
        partition: (r.topic.clone(), r.partition),
        offset: r.offset,
    }
}

fn from_walbox(r: &ConsumedRecord) -> bool {
    r.header("walbox.commit_lsn").is_some()
}

#[test]
fn walbox_resumes_on_debeziums_slot_and_the_union_holds_every_committed_event() {
    let Some(server) = kafka::apache() else {
        eprintln!("needs Apache Kafka and Kafka Connect: run with WALBOX_TEST_KAFKA=apache (scripts/real-kafka.sh); skipped");
        return;
    };
    if let Err(e) = support::debezium::installed() {
        panic!("{e}");
    }
    let bootstrap = server.bootstrap_servers();
    let broker = support::broker();
    let topics: Vec<String> = AGGREGATE_TYPES
        .iter()
        .map(|t| format!("{PREFIX}outbox.event.{t}"))
        .collect();
    for topic in &topics {
        broker
            .create_topic(topic, PARTITIONS)
            .expect("create a topic");
    }
    let db = TestDb::new("dbzmig");
    db.sql(TABLE);
    let slot = format!("dbz_{}", db.name);
    let router = router(PREFIX);
    let mut connect = Connect::start(&ConnectorSpec {
        db: &db,
        slot: &slot,
        publication: &slot,
        bootstrap: &bootstrap,
        router: &router,
        extra: &[],
    });
    let created = db.confirmed(&slot);

    // Debezium relays part of the stream, and dies while the writer writes on.
    let stop = Arc::new(AtomicBool::new(false));
    let writing = writer(db.clone(), stop.clone());
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let mut reader = TopicReader::new(&bootstrap, &names, WAIT).expect("read topics");
    assert!(
        reader.poll_until(WAIT, |r| r.len() >= 150),
        "Debezium relayed {} records; log:\n{}",
        reader.records.len(),
        connect.log_tail()
    );
    wait_until(WAIT, "Debezium to confirm a position", || {
        db.confirmed(&slot) > created
    });
    connect.kill();
    wait_until(WAIT, "Debezium's walsender to let the slot go", || {
        !db.slot_active(&slot)
    });
    let confirmed = db.confirmed(&slot);

    // walbox, configured from the connector's own configuration; the harness's settings
    // without those the printed file must give.
    let dir = tempfile::tempdir().expect("a directory");
    let mut env: Vec<(String, String)> = walbox_env(&db, &slot, &bootstrap)
        .into_iter()
        .filter(|(k, _)| !k.starts_with("WALBOX_POSTGRES_") || k.ends_with("STATUS_INTERVAL"))
        .collect();
    env.extend(support::debezium::walbox_config(&connect, dir.path()));
    let toml = std::fs::read_to_string(dir.path().join("walbox.toml")).expect("walbox.toml");
    assert!(toml.contains(&format!("slot = \"{slot}\"")), "{toml}");
    let walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream from Debezium's slot", || {
        db.streaming(&slot)
    });
    assert!(
        reader.poll_until(WAIT, |r| r.iter().filter(|r| from_walbox(r)).count() >= 100),
        "walbox relayed {} records; log:\n{}",
        reader.records.iter().filter(|r| from_walbox(r)).count(),
        walbox.log()
    );
    stop.store(true, Ordering::Relaxed);
    let txns = writing.join().expect("the writer");

    // Every committed event, by id: (aggregate id, seq).
    let committed: HashMap<String, (String, u64)> = db
        .sql("SELECT id, aggregateid, payload->>'seq' FROM outbox")
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            (
                f[0].to_owned(),
                (f[1].to_owned(), f[2].parse().expect("seq")),
            )
        })
        .collect();
    let seen = |r: &[ConsumedRecord]| -> BTreeSet<String> {
        r.iter()
            .filter_map(|r| r.header_str("id").map(str::to_owned))
            .collect()
    };
    assert!(
        reader.poll_until(WAIT, |r| {
            let ids = seen(r);
            committed.keys().all(|id| ids.contains(id))
        }),
        "{} of {} committed events relayed; walbox log:\n{}",
        committed
            .keys()
            .filter(|id| seen(&reader.records).contains(*id))
            .count(),
        committed.len(),
        walbox.log()
    );
    reader.read_to_end(WAIT).expect("read to the end");
    let events: Vec<Event> = reader.records.iter().map(event).collect();

    // Nothing but committed events, each at most once per relay.
    let mut copies: BTreeMap<(&str, bool), usize> = BTreeMap::new();
    for e in &events {
        let (key, seq) = committed
            .get(&e.id)
            .unwrap_or_else(|| panic!("{} was never committed (rolled back?)", e.id));
        assert_eq!((key, *seq), (&e.key, e.seq), "{}: key and payload", e.id);
        *copies.entry((&e.id, e.commit.is_some())).or_default() += 1;
    }
    let twice: Vec<_> = copies.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "a relay wrote events twice: {twice:?}");

    // walbox starts where Debezium confirmed: none of its records is covered by that position.
    for e in &events {
        if let Some(commit) = e.commit {
            assert!(
                commit >= confirmed,
                "walbox relayed {} (commit {commit}) though Debezium had confirmed {confirmed}",
                e.id
            );
        }
    }
    let debezium = events.iter().filter(|e| e.commit.is_none()).count();
    let ours = events.len() - debezium;
    let overlap: Vec<&str> = copies
        .keys()
        .filter(|(id, walbox)| *walbox && copies.contains_key(&(*id, false)))
        .map(|(id, _)| *id)
        .collect();
    eprintln!(
        "{txns} transactions begun, {} events committed; Debezium relayed {debezium} and confirmed \
         {confirmed}; walbox relayed {ours} from there; duplicates (the overlap: produced by \
         Debezium past its confirmed position): {}",
        committed.len(),
        overlap.len()
    );
    assert!(
        debezium > 0 && ours > 0,
        "both relays relayed part of the stream"
    );
    // The overlap's events, written by both: the same record from each (the walbox that
    // from-debezium describes writes the router's records).
    let mut pairs: HashMap<&str, Vec<&ConsumedRecord>> = HashMap::new();
    for r in &reader.records {
        pairs
            .entry(r.header_str("id").unwrap_or_default())
            .or_default()
            .push(r);
    }
    for id in &overlap {
        let (d, w) = match pairs[id].as_slice() {
            [a, b] if from_walbox(b) => (*a, *b),
            [a, b] => (*b, *a),
            other => panic!("{id}: {} records", other.len()),
        };
        assert_eq!(
            (&w.topic, w.partition, &w.key, &w.payload),
            (&d.topic, d.partition, &d.key, &d.payload),
            "{id}: topic, partition, key, value"
        );
        assert_eq!(
            comparable_headers(w),
            comparable_headers(d),
            "{id}: headers"
        );
    }
    assert_eq!(
        debezium + ours,
        committed.len() + overlap.len(),
        "every committed event, duplicated only in the overlap"
    );

    // Per partition, Debezium's records, then walbox's; per key, after dropping repeated ids,
    // the key's committed events in commit order.
    let mut partitions: BTreeMap<&(String, i32), Vec<&Event>> = BTreeMap::new();
    for e in &events {
        partitions.entry(&e.partition).or_default().push(e);
    }
    let mut home: BTreeMap<&str, &(String, i32)> = BTreeMap::new();
    for e in &events {
        let first = *home.entry(&e.key).or_insert(&e.partition);
        assert_eq!(
            first, &e.partition,
            "{}: both relays pick one partition",
            e.key
        );
    }
    let mut per_key: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut delivered: BTreeSet<&str> = BTreeSet::new();
    for (partition, records) in &mut partitions {
        records.sort_by_key(|e| e.offset);
        let first_walbox = records.iter().position(|e| e.commit.is_some());
        if let Some(i) = first_walbox {
            assert!(
                records[i..].iter().all(|e| e.commit.is_some()),
                "{partition:?}: a Debezium record after walbox's first"
            );
        }
        for e in records.iter() {
            if delivered.insert(&e.id) {
                per_key.entry(&e.key).or_default().push(e.seq);
            }
        }
    }
    let mut expected: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (key, seq) in committed.values() {
        expected.entry(key).or_default().push(*seq);
    }
    for seqs in expected.values_mut() {
        seqs.sort_unstable();
    }
    assert_eq!(
        per_key, expected,
        "each aggregate's events, deduplicated by id, in commit order"
    );
    drop(walbox);
}
