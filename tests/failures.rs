//! Bad input: each gives a one-line actionable error, a distinct exit status, and confirms
//! nothing past the last acknowledged event.

use std::collections::HashSet;
use std::io::Write;
use std::time::Duration;

use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use walbox::sandbox::broker::TopicReader;

use crate::support::events::padded_rows;
use crate::support::{self, wait_until, walbox_env, TestDb, Walbox, WAIT};

fn set(env: &mut Vec<(String, String)>, key: &str, value: &str) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_owned(), value.to_owned()));
}

/// Runs walbox with `env` until it exits; returns (exit code, last line).
fn run_to_exit(env: &[(String, String)]) -> (i32, String) {
    let mut w = Walbox::spawn(env);
    let status = w.wait_exit(WAIT);
    (status.code().unwrap_or(-1), w.last_line())
}

#[test]
fn malformed_config_file_exits_3_naming_the_key() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(
        file,
        "[postgres]\nurl = \"postgres://x@y/z\"\nslott = \"typo\""
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_walbox"))
        .args(["run", "--config"])
        .arg(file.path())
        .env_clear()
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("slott"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
}

#[test]
fn missing_table_exits_5() {
    let db = TestDb::new("notable");
    db.sql("DROP TABLE outbox");
    let broker = support::broker();
    let (code, line) = run_to_exit(&walbox_env(&db, &db.name, &broker.bootstrap_servers()));
    assert_eq!(code, 5, "{line}");
    assert!(line.contains("public.outbox does not exist"), "{line}");
}

#[test]
fn missing_column_exits_5_naming_the_setting() {
    let db = TestDb::new("nocolumn");
    let broker = support::broker();
    let mut env = walbox_env(&db, &db.name, &broker.bootstrap_servers());
    set(&mut env, "WALBOX_OUTBOX_COLUMNS_PAYLOAD", "body");
    let (code, line) = run_to_exit(&env);
    assert_eq!(code, 5, "{line}");
    assert!(
        line.contains("\"body\"") && line.contains("outbox.columns.payload"),
        "{line}"
    );
}

#[test]
fn missing_slot_without_create_slot_exits_5() {
    let db = TestDb::new("noslot");
    let broker = support::broker();
    let mut env = walbox_env(&db, &db.name, &broker.bootstrap_servers());
    set(&mut env, "WALBOX_POSTGRES_CREATE_SLOT", "false");
    let (code, line) = run_to_exit(&env);
    assert_eq!(code, 5, "{line}");
    assert!(line.contains("create_slot"), "{line}");
}

#[test]
fn slot_held_by_another_walbox_exits_6_with_on_slot_busy_fail_and_leaves_the_first_running() {
    let db = TestDb::new("slotheld");
    let broker = support::broker();
    let mut env = walbox_env(&db, &db.name, &broker.bootstrap_servers());
    set(&mut env, "WALBOX_POSTGRES_ON_SLOT_BUSY", "fail");
    let mut first = Walbox::spawn(&env);
    wait_until(WAIT, "the first walbox to hold the slot", || {
        db.streaming(&db.name)
    });
    let (code, line) = run_to_exit(&env);
    assert_eq!(code, 6, "{line}");
    assert!(line.contains("is active for PID"), "{line}");
    // What to do: find the other process, and how a second walbox belongs.
    assert!(line.contains("pg_stat_replication"), "{line}");
    assert!(line.contains("on_slot_busy = \"wait\""), "{line}");
    assert!(first.running(), "{}", first.log());
}

#[test]
fn message_larger_than_the_broker_accepts_exits_8_and_confirms_nothing_past_it() {
    let db = TestDb::new("toolarge");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 2);
    db.create_slot_and_publication(&slot);
    let insert = |n: usize, size: usize| padded_rows(&topic, n, size);
    db.sql(&insert(3, 10));
    // 2 MB: over librdkafka's and Kafka's default message.max.bytes (1 MB).
    db.sql(&insert(1, 2_000_000));
    let big_id = db.sql("SELECT max(id) FROM outbox");
    db.sql(&insert(2, 10));

    let (code, line) = run_to_exit(&walbox_env(&db, &slot, &broker.bootstrap_servers()));
    assert_eq!(code, 8, "{line}");
    assert!(
        line.contains(&format!("event {big_id} ")) && line.contains("public.outbox"),
        "the error names the event: {line}"
    );
    // librdkafka refused it in produce(), before any broker saw it: the message must say so,
    // and name the setting to raise.
    assert!(
        line.contains("the producer's message.max.bytes")
            && line.contains("[kafka.properties]")
            && !line.contains("Broker:"),
        "the error names the producer's own limit, not the broker: {line}"
    );
    let commits = db.commits(&slot);
    assert_eq!(commits.len(), 3);
    let confirmed = db.confirmed(&slot);
    assert!(
        confirmed >= commits[0].1,
        "the acknowledged first transaction (end {}) was confirmed: {confirmed}",
        commits[0].1
    );
    assert!(
        confirmed < commits[1].1,
        "confirmed {confirmed} passed the rejected event's transaction (end {})",
        commits[1].1
    );
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    reader.read_to_end(WAIT).unwrap();
    let ids: HashSet<String> = reader
        .records
        .iter()
        .filter_map(|r| r.header_str("id").map(str::to_owned))
        .collect();
    assert_eq!(
        ids,
        ["1", "2", "3"].map(String::from).into(),
        "the events before it arrived"
    );

    // Restarting does not skip it: the same error again.
    let (code, _) = run_to_exit(&walbox_env(&db, &slot, &broker.bootstrap_servers()));
    assert_eq!(code, 8);
    assert_eq!(db.confirmed(&slot), confirmed);
}

#[test]
fn message_the_broker_refuses_as_too_large_exits_8_naming_the_broker_limits() {
    let db = TestDb::new("brokertoolarge");
    let slot = db.name.clone();
    let topic = format!("t_{}", db.name);
    let broker = support::broker();
    let Some(mock) = broker.mock_cluster() else {
        return; // a real broker cannot be told to refuse a small record
    };
    broker.create_topic(&topic, 1).unwrap();
    db.create_slot_and_publication(&slot);
    let progress = support::own_progress_topic(&broker, &slot);
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    set(&mut env, "WALBOX_KAFKA_PROGRESS_TOPIC", &progress);
    // walbox streams once its first progress record is acknowledged.
    let mut walbox = Walbox::spawn(&env);
    let mut records = TopicReader::new(&broker.bootstrap_servers(), &[&progress], WAIT).unwrap();
    assert!(
        records.poll_until(WAIT, |r| !r.is_empty()),
        "{}",
        walbox.log()
    );
    // The broker answers the next produce requests as a broker over its size limit would (the
    // first may carry only a later progress record, which is refused harmlessly).
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE; 2],
    );
    db.sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES ('a', '{topic}', 'x', '{{}}')"
    ));
    let code = walbox.wait_exit(WAIT).code().unwrap_or(-1);
    let line = walbox.last_line();
    mock.clear_request_errors(RDKafkaApiKey::Produce);
    assert_eq!(code, 8, "{line}");
    assert!(
        line.contains("event 1 ")
            && line.contains("the broker refused")
            && line.contains("max.message.bytes"),
        "the error says the broker refused it and which limits to raise: {line}"
    );
}

/// A database whose outbox rows name their partition (`outbox.columns.partition = "part"`),
/// with a 3-partition topic, three transactions (partition 0, 99, 1) and walbox's environment
/// with `toml` appended to that setting; returns the database, the topic, the broker, the
/// environment (and its config file) and the bad row's id.
fn rows_naming_partitions(
    tag: &str,
    toml: &str,
) -> (
    TestDb,
    String,
    walbox::sandbox::broker::Broker,
    Vec<(String, String)>,
    tempfile::NamedTempFile,
    String,
) {
    let db = TestDb::new(tag);
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 3);
    db.sql("ALTER TABLE outbox ADD COLUMN part int");
    db.create_slot_and_publication(&slot);
    let row = |part: i32| {
        format!(
            "INSERT INTO outbox (aggregate_id, topic, event_type, payload, part) \
             VALUES ('a', '{topic}', 'x', '{{}}', {part});"
        )
    };
    db.sql(&row(0));
    db.sql(&row(99));
    let bad = db.sql("SELECT max(id) FROM outbox");
    db.sql(&row(1));
    let (env, file) = env_with_config(
        &db,
        &slot,
        &broker,
        &format!("[outbox]\n{toml}\n[outbox.columns]\npartition = \"part\"\n"),
    );
    (db, topic, broker, env, file, bad)
}

/// The ids of the records in `topics`, with their partitions.
fn ids_by_partition(brokers: &str, topics: &[&str]) -> Vec<(String, i32)> {
    let mut reader = TopicReader::new(brokers, topics, WAIT).unwrap();
    reader.read_to_end(WAIT).unwrap();
    let mut ids: Vec<(String, i32)> = reader
        .records
        .iter()
        .map(|r| {
            (
                r.header_str("id").unwrap_or_default().to_owned(),
                r.partition,
            )
        })
        .collect();
    ids.sort();
    ids
}

#[test]
fn a_partition_the_topic_lacks_exits_8_with_the_statement_that_skips_its_transaction() {
    let (db, topic, broker, env, _file, bad) = rows_naming_partitions("nopartition", "");
    let slot = db.name.clone();
    let commits = db.commits(&slot);
    assert_eq!(commits.len(), 3);
    let (code, line) = run_to_exit(&env);
    assert_eq!(code, 8, "{line}");
    assert!(
        line.contains(&format!("event {bad} ")) && line.contains("outbox.columns.partition"),
        "the error names the event and the setting: {line}"
    );
    assert!(
        db.confirmed(&slot) < commits[1].1,
        "confirmed past the rejected event"
    );
    let at = line
        .find("SELECT pg_replication_slot_advance(")
        .unwrap_or_else(|| panic!("no statement in: {line}"));
    let statement = &line[at..at + line[at..].find(';').expect("statement ends with ;") + 1];
    assert_eq!(
        statement,
        format!(
            "SELECT pg_replication_slot_advance('{slot}', '{}');",
            commits[1].1
        )
    );

    // Skipped as told: the next row is relayed, to the partition it names.
    db.sql(statement);
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to confirm the last transaction", || {
        db.confirmed(&slot) >= commits[2].1
    });
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
    assert_eq!(
        ids_by_partition(&broker.bootstrap_servers(), &[&topic]),
        [("1".to_owned(), 0), ("3".to_owned(), 1)]
    );
}

#[test]
fn a_partition_the_topic_lacks_goes_to_the_dead_letter_topic_and_later_rows_flow() {
    let dlq = support::unique("dlq_partition");
    let (db, topic, broker, env, _file, bad) = rows_naming_partitions(
        "nopartitiondlq",
        &format!("on_invalid = \"dead_letter\"\ndead_letter_topic = \"{dlq}\""),
    );
    broker.create_topic(&dlq, 1).unwrap();
    let slot = db.name.clone();
    let commits = db.commits(&slot);
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to confirm every transaction", || {
        db.confirmed(&slot) >= commits[2].1
    });
    assert!(walbox.running(), "{}", walbox.log());
    let bs = broker.bootstrap_servers();
    assert_eq!(
        ids_by_partition(&bs, &[&topic]),
        [("1".to_owned(), 0), ("3".to_owned(), 1)],
        "the rows around it arrived in the partitions they name"
    );
    let mut letters = TopicReader::new(&bs, &[&dlq], WAIT).unwrap();
    letters.read_to_end(WAIT).unwrap();
    assert_eq!(letters.records.len(), 1, "{}", walbox.log());
    let letter = &letters.records[0];
    assert_eq!(letter.header_str("id"), Some(bad.as_str()));
    let error = letter.header_str("walbox.error").unwrap_or_default();
    assert!(error.contains("Unknown partition"), "{error}");
}

#[test]
fn sigterm_drains_confirms_and_exits_0() {
    let db = TestDb::new("sigterm");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 2);
    db.create_slot_and_publication(&slot);
    db.sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) \
         SELECT 'a' || (g % 7), '{topic}', 'x', jsonb_build_object('g', g) FROM generate_series(1, 2000) g;"
    ));
    let last = db.commits(&slot)[0].1;
    let mut walbox = Walbox::spawn(&walbox_env(&db, &slot, &broker.bootstrap_servers()));
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    assert!(reader.poll_until(WAIT, |r| r.len() >= 2000));
    walbox.terminate();
    let status = walbox.wait_exit(Duration::from_secs(40));
    assert!(status.success(), "{status:?}\n{}", walbox.log());
    assert!(
        db.confirmed(&slot) >= last,
        "final status update confirmed {} < {last}",
        db.confirmed(&slot)
    );
}

// ---------------------------------------------------------------------------------------------
// Configuration errors: exit 3, one line, and never a secret
// ---------------------------------------------------------------------------------------------

/// A password that must never be printed.
const SECRET: &str = "S3cret-never-printed";

/// Bound on a walbox that must refuse its configuration (it normally exits at once).
const CONFIG_WAIT: Duration = Duration::from_secs(20);

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// walbox's environment for `db`'s `slot` on `broker`, with a config file holding `toml`
/// (`WALBOX_CONFIG`); the file lives as long as the returned handle.
fn env_with_config(
    db: &TestDb,
    slot: &str,
    broker: &walbox::sandbox::broker::Broker,
    toml: &str,
) -> (Vec<(String, String)>, tempfile::NamedTempFile) {
    let file = config_file(toml);
    let mut env = walbox_env(db, slot, &broker.bootstrap_servers());
    set(
        &mut env,
        "WALBOX_CONFIG",
        &file.path().display().to_string(),
    );
    (env, file)
}

fn config_file(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file
}

/// Runs `walbox <subcommand>` with exactly `env` until it exits (bounded); returns its exit
/// code and everything it printed (stdout and stderr, including its log).
fn exit_and_output(subcommand: &str, env: &[(String, String)]) -> (Option<i32>, String) {
    let mut w = Walbox::spawn_subcommand(subcommand, env);
    let status = w.wait_exit(CONFIG_WAIT);
    (status.code(), w.log())
}

/// Exit status 3 with one line naming `needles`, and the secret nowhere.
fn assert_config_error(what: &str, (code, out): (Option<i32>, String), needles: &[&str]) {
    assert!(
        !out.contains(SECRET),
        "{what}: the output contains the secret:\n{out}"
    );
    assert_eq!(code, Some(3), "{what}:\n{out}");
    assert_eq!(out.trim().lines().count(), 1, "{what}: one line:\n{out}");
    for needle in needles {
        assert!(
            out.contains(needle),
            "{what}: {needle:?} missing from {out:?}"
        );
    }
}

/// A minimal valid environment of `walbox inbox` for `url`.
fn inbox_env(url: &str) -> Vec<(String, String)> {
    owned(&[
        ("WALBOX_INBOX_POSTGRES_URL", url),
        ("WALBOX_INBOX_KAFKA_BROKERS", "127.0.0.1:9"),
        ("WALBOX_INBOX_KAFKA_GROUP_ID", "g"),
        ("WALBOX_INBOX_KAFKA_TOPICS", "t"),
        ("WALBOX_INBOX_HTTP_LISTEN", "off"),
    ])
}

#[test]
fn a_toml_syntax_error_on_a_line_with_a_secret_exits_3_without_echoing_the_line() {
    for (case, text) in [
        (
            "unterminated url",
            format!("[postgres]\nurl = \"postgres://walbox:{SECRET}@db.internal/app\n"),
        ),
        (
            "unquoted password",
            format!("[kafka.properties]\n\"sasl.password\" = {SECRET}\n"),
        ),
    ] {
        let file = config_file(&text);
        let path = file.path().to_string_lossy().into_owned();
        for (subcommand, var) in [("run", "WALBOX_CONFIG"), ("inbox", "WALBOX_INBOX_CONFIG")] {
            assert_config_error(
                &format!("{subcommand}, {case}"),
                exit_and_output(subcommand, &owned(&[(var, &path)])),
                &["line 2", &path],
            );
        }
    }
}

#[test]
fn a_malformed_postgres_url_exits_3_without_echoing_it() {
    let url = format!("postgres:/walbox:{SECRET}@db.internal/app");
    let run = owned(&[
        ("WALBOX_POSTGRES_URL", &url),
        ("WALBOX_KAFKA_BROKERS", "127.0.0.1:9"),
    ]);
    assert_config_error(
        "run",
        exit_and_output("run", &run),
        &["postgres.url", "postgres://"],
    );
    assert_config_error(
        "inbox",
        exit_and_output("inbox", &inbox_env(&url)),
        &["postgres.url", "postgres://"],
    );
}

#[test]
fn a_misspelt_kafka_property_exits_3_naming_it_but_not_its_value() {
    // A database walbox inbox can start on, so that only the property can stop it.
    let db = TestDb::new("cfg_property");
    db.sql(include_str!("../migrations/inbox.sql"));
    let file_text = format!("[kafka.properties]\n\"sasl.pasword\" = \"{SECRET}\"\n");
    let file = config_file(&file_text);
    let path = file.path().to_string_lossy().into_owned();

    let mut run = owned(&[
        ("WALBOX_POSTGRES_URL", &db.url()),
        ("WALBOX_KAFKA_BROKERS", "127.0.0.1:9"),
        ("WALBOX_HTTP_LISTEN", "off"),
    ]);
    let mut run_file = run.clone();
    run_file.push(("WALBOX_CONFIG".into(), path.clone()));
    run.push(("WALBOX_KAFKA_PROPERTY_SASL_PASWORD".into(), SECRET.into()));
    let mut inbox = inbox_env(&db.url());
    let mut inbox_file = inbox.clone();
    inbox_file.push(("WALBOX_INBOX_CONFIG".into(), path));
    inbox.push((
        "WALBOX_INBOX_KAFKA_PROPERTY_SASL_PASWORD".into(),
        SECRET.into(),
    ));
    for (what, subcommand, env) in [
        ("run, file", "run", run_file),
        ("run, environment", "run", run),
        ("inbox, file", "inbox", inbox_file),
        ("inbox, environment", "inbox", inbox),
    ] {
        assert_config_error(
            what,
            exit_and_output(subcommand, &env),
            &["sasl.pasword", "kafka.properties"],
        );
    }
}

#[test]
fn an_unknown_log_level_exits_3_instead_of_silencing_every_log_line() {
    let env = owned(&[
        ("WALBOX_POSTGRES_URL", "postgres://walbox@127.0.0.1:9/app"),
        ("WALBOX_KAFKA_BROKERS", "127.0.0.1:9"),
        ("WALBOX_HTTP_LISTEN", "off"),
        ("WALBOX_LOG_LEVEL", "warning"),
    ]);
    assert_config_error(
        "run",
        exit_and_output("run", &env),
        &["log.level", "\"warning\""],
    );
}

#[test]
fn a_walbox_variable_that_is_not_utf8_exits_3_naming_it_but_not_its_value() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let mut url = format!("postgres://walbox:{SECRET}@db.internal/app").into_bytes();
    url.push(0xff);
    for (subcommand, env) in [
        ("run", "WALBOX_POSTGRES_URL"),
        ("inbox", "WALBOX_INBOX_POSTGRES_URL"),
    ] {
        let vars: Vec<(OsString, OsString)> = vec![
            (env.into(), OsString::from_vec(url.clone())),
            // Not walbox's: its bytes are none of walbox's business.
            ("LC_SOMETHING".into(), OsString::from_vec(vec![b'x', 0xfe])),
        ];
        let mut w = Walbox::spawn_subcommand(subcommand, &vars);
        let status = w.wait_exit(CONFIG_WAIT);
        assert_config_error(
            subcommand,
            (status.code(), w.log()),
            &[env, "not valid UTF-8"],
        );
    }
}

#[test]
fn an_unknown_walbox_variable_exits_3_naming_it_but_not_its_value() {
    let mut run = owned(&[
        ("WALBOX_POSTGRES_URL", "postgres://walbox@127.0.0.1:9/app"),
        ("WALBOX_KAFKA_BROKERS", "127.0.0.1:9"),
        ("WALBOX_HTTP_LISTEN", "off"),
        // Not walbox run's, and accepted: the inbox's, the log filter, the test harness's.
        ("WALBOX_INBOX_POSTGRES_URL", "postgres://x@127.0.0.1:9/x"),
        ("WALBOX_LOG", "info"),
        ("WALBOX_TEST_KAFKA_BROKERS", "127.0.0.1:9"),
    ]);
    run.push(("WALBOX_POSTGRES_SLOTT".into(), "typo".into()));
    assert_config_error(
        "run",
        exit_and_output("run", &run),
        &[
            "WALBOX_POSTGRES_SLOTT",
            "did you mean WALBOX_POSTGRES_SLOT?",
        ],
    );
    run.retain(|(k, _)| k != "WALBOX_POSTGRES_SLOTT");
    run.push((
        "WALBOX_POSTGRES_URLL".into(),
        format!("postgres://walbox:{SECRET}@db.internal/app"),
    ));
    assert_config_error(
        "run",
        exit_and_output("run", &run),
        &["WALBOX_POSTGRES_URLL"],
    );

    let mut inbox = inbox_env("postgres://walbox@127.0.0.1:9/app");
    inbox.push(("WALBOX_KAFKA_BROKERS".into(), "walbox run's".into()));
    inbox.push(("WALBOX_INBOX_EFFECT_SQLL".into(), "SELECT 1".into()));
    assert_config_error(
        "inbox",
        exit_and_output("inbox", &inbox),
        &["WALBOX_INBOX_EFFECT_SQLL"],
    );
}

#[test]
fn a_progress_record_that_cannot_be_written_stops_walbox_before_it_streams() {
    let db = TestDb::new("progdeny");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 1);
    let Some(mock) = broker.mock_cluster() else {
        eprintln!("external broker: denying Write needs the mock cluster; skipped");
        return;
    };
    db.create_slot_and_publication(&slot);
    let progress = support::own_progress_topic(&broker, &slot);
    let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
    env.push(("WALBOX_KAFKA_PROGRESS_TOPIC".into(), progress.clone()));
    db.sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) \
         VALUES ('a', '{topic}', 'thing.happened', '{{}}')"
    ));
    // The principal may not write: the first records walbox produces are refused. (Nothing
    // but the progress record can come first: no event is read before it is acknowledged.)
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED; 3],
    );
    let mut walbox = Walbox::spawn(&env);
    let status = walbox.wait_exit(WAIT);
    let line = walbox.last_line();
    assert_eq!(status.code(), Some(9), "{}", walbox.log());
    assert!(
        line.contains("cannot write the progress record") && line.contains(&progress),
        "{line}"
    );
    // Nothing was streamed, so nothing was confirmed: the row is still ahead of the slot.
    let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
    reader.read_to_end(WAIT).unwrap();
    assert!(reader.records.is_empty(), "{:?}", reader.records);

    // With Write granted, the same slot relays the row.
    mock.clear_request_errors(RDKafkaApiKey::Produce);
    let mut walbox = Walbox::spawn(&env);
    assert!(
        reader.poll_until(WAIT, |r| r.len() == 1),
        "the row after Write was granted; log:\n{}",
        walbox.log()
    );
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

/// A timestamp column hours ahead: Kafka 4 refuses it (`log.message.timestamp.after.max.ms`),
/// and with it the whole batch it was in. The record at fault is told apart from the others of
/// its batch and is the record's fault at once, in both modes: exit 8 with the statement that
/// skips its transaction, the rows before it delivered once, nothing after it.
#[test]
fn a_timestamp_the_broker_refuses_stops_at_that_record_in_both_modes() {
    if std::env::var("WALBOX_TEST_KAFKA").as_deref() != Ok("apache") {
        eprintln!(
            "the mock cluster accepts any timestamp: Apache Kafka only (scripts/real-kafka.sh)"
        );
        return;
    }
    for exactly_once in [false, true] {
        let db = TestDb::new(if exactly_once {
            "futurets_eos"
        } else {
            "futurets"
        });
        let slot = db.name.clone();
        let (topic, broker) = support::topic_on_broker(&db, 1);
        db.create_slot_and_publication(&slot);
        let mut env = walbox_env(&db, &slot, &broker.bootstrap_servers());
        set(&mut env, "WALBOX_OUTBOX_COLUMNS_TIMESTAMP", "created_at");
        if exactly_once {
            set(&mut env, "WALBOX_KAFKA_EXACTLY_ONCE", "true");
        }
        // One transaction of good rows, then one whose second row is two hours ahead: one batch.
        let ids = db.sql(&format!(
            "INSERT INTO outbox (aggregate_id, topic, event_type, payload) \
             SELECT 'a', '{topic}', 'x', '{{}}' FROM generate_series(1, 5) RETURNING id;\n\
             BEGIN;\n\
             INSERT INTO outbox (aggregate_id, topic, event_type, payload) \
             VALUES ('a', '{topic}', 'x', '{{}}') RETURNING id;\n\
             INSERT INTO outbox (aggregate_id, topic, event_type, payload, created_at) \
             VALUES ('a', '{topic}', 'x', '{{}}', now() + interval '2 hours') RETURNING id;\n\
             COMMIT;"
        ));
        let ids: Vec<&str> = ids.lines().filter(|l| !l.is_empty()).collect();
        let (good, bad) = (&ids[..6], ids[6]);
        let commits = db.commits(&slot);
        assert_eq!(commits.len(), 2);
        // Exactly-once: the transaction before it may share its Kafka transaction, aborted with
        // it; the first run still stops with that one committed and the exact skip statement.
        let (code, line) = run_to_exit(&env);
        assert_eq!(code, 8, "exactly_once={exactly_once}: {line}");
        assert!(
            line.contains(&format!("event {bad} ")) && line.contains("timestamp"),
            "exactly_once={exactly_once}: the record at fault is named: {line}"
        );
        let statement = format!(
            "SELECT pg_replication_slot_advance('{slot}', '{}');",
            commits[1].1
        );
        assert!(
            line.contains(&statement),
            "exactly_once={exactly_once}: {line}"
        );
        assert!(
            db.confirmed(&slot) < commits[1].1,
            "confirmed past the refused event"
        );
        let mut reader = TopicReader::new(&broker.bootstrap_servers(), &[&topic], WAIT).unwrap();
        reader.read_to_end(WAIT).unwrap();
        let delivered: Vec<String> = reader
            .records
            .iter()
            .map(|r| r.header_str("id").unwrap_or_default().to_owned())
            .collect();
        // The row before it in its transaction: delivered at-least-once (a skip drops the
        // rest), hidden with its aborted Kafka transaction in exactly-once mode.
        let expected = if exactly_once { &good[..5] } else { good };
        assert_eq!(
            delivered, expected,
            "exactly_once={exactly_once}: the rows before it, once each"
        );
    }
}

/// The same refused timestamp under `on_invalid = "dead_letter"`: the record at fault, alone,
/// goes to the dead-letter topic, and every other row of its batch to its topic.
#[test]
fn a_timestamp_the_broker_refuses_is_dead_lettered_alone() {
    if std::env::var("WALBOX_TEST_KAFKA").as_deref() != Ok("apache") {
        eprintln!(
            "the mock cluster accepts any timestamp: Apache Kafka only (scripts/real-kafka.sh)"
        );
        return;
    }
    let db = TestDb::new("futurets_dlq");
    let slot = db.name.clone();
    let (topic, broker) = support::topic_on_broker(&db, 1);
    let dlq = support::unique("dlq_timestamp");
    broker.create_topic(&dlq, 1).unwrap();
    db.create_slot_and_publication(&slot);
    let (env, _config) = env_with_config(
        &db,
        &slot,
        &broker,
        &format!(
            "[outbox]\non_invalid = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n[outbox.columns]\ntimestamp = \"created_at\"\n"
        ),
    );
    let ids = db.sql(&format!(
        "INSERT INTO outbox (aggregate_id, topic, event_type, payload) \
         SELECT 'a', '{topic}', 'x', '{{}}' FROM generate_series(1, 5) RETURNING id;\n\
         INSERT INTO outbox (aggregate_id, topic, event_type, payload, created_at) \
         VALUES ('a', '{topic}', 'x', '{{}}', now() + interval '2 hours') RETURNING id;\n\
         INSERT INTO outbox (aggregate_id, topic, event_type, payload) \
         VALUES ('a', '{topic}', 'x', '{{}}') RETURNING id;"
    ));
    let ids: Vec<String> = ids
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    let bad = ids[5].clone();
    let commits = db.commits(&slot);
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to confirm every transaction", || {
        db.confirmed(&slot) >= commits.last().unwrap().1
    });
    assert!(walbox.running(), "{}", walbox.log());
    let bs = broker.bootstrap_servers();
    let mut reader = TopicReader::new(&bs, &[&topic], WAIT).unwrap();
    reader.read_to_end(WAIT).unwrap();
    let delivered: Vec<String> = reader
        .records
        .iter()
        .map(|r| r.header_str("id").unwrap_or_default().to_owned())
        .collect();
    let others: Vec<String> = ids.iter().filter(|i| **i != bad).cloned().collect();
    assert_eq!(delivered, others, "every other row once: {}", walbox.log());
    let mut letters = TopicReader::new(&bs, &[&dlq], WAIT).unwrap();
    letters.read_to_end(WAIT).unwrap();
    let letters: Vec<&str> = letters
        .records
        .iter()
        .filter_map(|r| r.header_str("id"))
        .collect();
    assert_eq!(letters, [bad.as_str()], "{}", walbox.log());
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}
