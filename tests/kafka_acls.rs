//! walbox on a Kafka cluster that authorizes every request (`StandardAuthorizer`,
//! `allow.everyone.if.no.acl.found=false`): a principal with exactly the ACLs that
//! docs/operations.md ("Kafka requirements") lists for a command runs it; one without a right
//! it needs is told which. One ACL'd Apache Kafka broker per test binary, started on first use,
//! with the SCRAM user [`USER`]; each test grants that user rights on topics of its own. Only
//! in the real-Kafka lane (`WALBOX_TEST_KAFKA=apache`): the mock cluster has no ACLs.

use std::sync::OnceLock;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use walbox::sandbox::broker::{Broker, TopicReader};
use walbox::sandbox::kafka::{
    Acl, AclOperation as Op, AclResource as On, KafkaServer, KafkaServerOptions,
};

use crate::support::events::{await_distinct, outbox_ids, stop_and_read_exactly, write_txns};
use crate::support::{self, kafka, wait_until, walbox_env, TestDb, Walbox, WAIT};

/// The SCRAM user walbox runs as: `(name, password)`.
const USER: (&str, &str) = ("walbox-acl", "kafka-acl-7d1c");

/// The ACL'd broker, when the real-Kafka lane runs; started on the first call.
fn acl_broker() -> Option<&'static KafkaServer> {
    static SERVER: OnceLock<KafkaServer> = OnceLock::new();
    if !kafka::wanted() {
        eprintln!(
            "needs Apache Kafka (WALBOX_TEST_KAFKA=apache): the mock cluster has no ACLs; skipped"
        );
        return None;
    }
    let server = SERVER.get_or_init(|| {
        KafkaServer::start(KafkaServerOptions {
            watchdog: true,
            scram: Some((USER.0.to_owned(), USER.1.to_owned())),
            acls: true,
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("start the ACL'd Apache Kafka broker: {e}"))
    });
    eprintln!(
        "ACL'd Apache Kafka broker log: {}",
        server.log_path().display()
    );
    Some(server)
}

/// walbox's environment for `db`'s slot, as [`USER`] over SASL_PLAINTEXT (SCRAM-SHA-256),
/// with the progress topic `progress`.
fn env_as_user(db: &TestDb, server: &KafkaServer, progress: &str) -> Vec<(String, String)> {
    let servers = server.sasl_plaintext_servers().expect("a SASL listener");
    let mut env = walbox_env(db, &db.name, &servers);
    for (k, v) in [
        ("WALBOX_KAFKA_PROPERTY_SECURITY_PROTOCOL", "SASL_PLAINTEXT"),
        ("WALBOX_KAFKA_PROPERTY_SASL_MECHANISMS", "SCRAM-SHA-256"),
        ("WALBOX_KAFKA_PROPERTY_SASL_USERNAME", USER.0),
        ("WALBOX_KAFKA_PROPERTY_SASL_PASSWORD", USER.1),
        ("WALBOX_KAFKA_PROGRESS_TOPIC", progress),
    ] {
        env.push((k.to_owned(), v.to_owned()));
    }
    env
}

/// What docs/operations.md lists for `walbox run`: Write on the event topics and the progress
/// topic, Read on the progress topic; with exactly-once, Write and Describe on transactional
/// ids prefixed `walbox/`. No group, no cluster right.
fn run_acls(topics: &[&str], progress: &str, exactly_once: bool) -> Vec<Acl> {
    let mut acls: Vec<Acl> = topics
        .iter()
        .map(|t| Acl::allow(USER.0, Op::Write, On::Topic, t))
        .collect();
    acls.push(Acl::allow(USER.0, Op::Write, On::Topic, progress));
    acls.push(Acl::allow(USER.0, Op::Read, On::Topic, progress));
    if exactly_once {
        for op in [Op::Write, Op::Describe] {
            acls.push(Acl::allow_prefixed(
                USER.0,
                op,
                On::TransactionalId,
                "walbox/",
            ));
        }
    }
    acls
}

/// Waits until the broker applies the ACLs just created: [`USER`] sees each of `topics`.
fn await_described(server: &KafkaServer, topics: &[&str]) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set(
            "bootstrap.servers",
            server.sasl_plaintext_servers().unwrap(),
        )
        .set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanisms", "SCRAM-SHA-256")
        .set("sasl.username", USER.0)
        .set("sasl.password", USER.1)
        .set("log_level", "0")
        .create()
        .unwrap();
    wait_until(WAIT, "the broker to apply the ACLs", || {
        topics.iter().all(|topic| {
            consumer
                .fetch_metadata(Some(topic), Duration::from_secs(5))
                .is_ok_and(|md| {
                    md.topics()
                        .iter()
                        .any(|t| t.name() == *topic && t.error().is_none())
                })
        })
    });
}

/// Issue 42, item 11: exactly-once start-up reads the progress topic with a reader that only
/// assigns its partition; it needs no group right. With exactly the documented ACLs walbox
/// starts and relays every event once (before, it retried GroupAuthorizationFailed forever).
#[test]
fn exactly_once_relays_with_exactly_the_documented_acls() {
    let Some(server) = acl_broker() else { return };
    let admin = Broker::External(server.bootstrap_servers());
    let db = TestDb::new("acl_eos");
    let topic = format!("t_{}", db.name);
    admin.create_topic(&topic, 2).unwrap();
    let progress = support::own_progress_topic(&admin, &db.name);
    server
        .create_acls(&run_acls(&[&topic], &progress, true))
        .unwrap();
    await_described(server, &[&topic, &progress]);
    db.create_slot_and_publication(&db.name);
    let mut env = env_as_user(&db, server, &progress);
    env.push(("WALBOX_KAFKA_EXACTLY_ONCE".into(), "true".into()));

    let mut reader = TopicReader::new(&admin.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let aggregates: Vec<String> = (0..5).map(|i| format!("agg-{i}")).collect();
    // The first start finds the progress topic empty; the second reads the first one's
    // records back, through the reader that used to need the group.
    let mut walbox = Walbox::spawn(&env);
    write_txns(&db, &topic, &aggregates, 4);
    await_distinct(&mut reader, outbox_ids(&db).len(), &walbox);
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());

    write_txns(&db, &topic, &aggregates, 4);
    let mut walbox = Walbox::spawn(&env);
    let all = outbox_ids(&db);
    await_distinct(&mut reader, all.len(), &walbox);
    stop_and_read_exactly(&mut walbox, &mut reader, &all);
    assert!(
        !walbox.log().contains("GroupAuthorizationFailed"),
        "{}",
        walbox.log()
    );
}

/// The documented ACLs of the other commands: `walbox run` at-least-once creates its slot
/// (after reading the progress topic for a record of it), `walbox audit` reads the topic back
/// (Read on it) and `walbox check` passes its Kafka checks (DescribeConfigs on the progress
/// topic besides `run`'s rights). No group right for any of them.
#[test]
fn at_least_once_audit_and_check_run_with_exactly_the_documented_acls() {
    let Some(server) = acl_broker() else { return };
    let admin = Broker::External(server.bootstrap_servers());
    let db = TestDb::new("acl_alo");
    let topic = format!("t_{}", db.name);
    admin.create_topic(&topic, 2).unwrap();
    let progress = support::own_progress_topic(&admin, &db.name);
    let mut acls = run_acls(&[&topic], &progress, false);
    acls.push(Acl::allow(USER.0, Op::Read, On::Topic, &topic));
    acls.push(Acl::allow(
        USER.0,
        Op::DescribeConfigs,
        On::Topic,
        &progress,
    ));
    server.create_acls(&acls).unwrap();
    await_described(server, &[&topic, &progress]);
    let env = env_as_user(&db, server, &progress);

    // No slot yet: walbox reads the progress topic, finds no record, creates it.
    let mut walbox = Walbox::spawn(&env);
    wait_until(WAIT, "walbox to stream", || db.streaming(&db.name));
    let mut reader = TopicReader::new(&admin.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let aggregates: Vec<String> = (0..5).map(|i| format!("agg-{i}")).collect();
    write_txns(&db, &topic, &aggregates, 4);
    let all = outbox_ids(&db);
    await_distinct(&mut reader, all.len(), &walbox);
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());

    let out = support::walbox_output(&["audit"], &env);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with(&format!("audited {} rows: 0 missing", all.len())),
        "{stdout}"
    );

    let run = crate::check::check(&env, &[]);
    run.expect("kafka brokers", "ok", &[]);
    run.expect(&format!("topic {progress}"), "ok", &[]);
    run.expect("idempotent producer", "ok", &[]);
    run.expect("progress topic cleanup.policy", "ok", &[]);
}

/// `walbox inbox` with the documented ACLs: Read on its topics and its group, and, with
/// `retention.keep`, DescribeConfigs on the topics for the retention guard.
#[test]
fn the_inbox_consumes_with_exactly_the_documented_acls() {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let Some(server) = acl_broker() else { return };
    let admin = Broker::External(server.bootstrap_servers());
    let db = TestDb::new("acl_inbox");
    db.sql(include_str!("../migrations/inbox.sql"));
    db.sql("CREATE TABLE seen (id text)");
    let (topic, group) = (format!("t_{}", db.name), format!("g_{}", db.name));
    admin
        .create_topic_with(&topic, 2, &[("retention.ms", "86400000")])
        .unwrap();
    server
        .create_acls(&[
            Acl::allow(USER.0, Op::Read, On::Topic, &topic),
            Acl::allow(USER.0, Op::DescribeConfigs, On::Topic, &topic),
            Acl::allow(USER.0, Op::Read, On::Group, &group),
        ])
        .unwrap();
    await_described(server, &[&topic]);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", admin.bootstrap_servers())
        .create()
        .unwrap();
    for i in 0..20 {
        let id = format!("m-{i}");
        let headers = OwnedHeaders::new().insert(Header {
            key: "id",
            value: Some(id.as_bytes()),
        });
        producer
            .send(
                BaseRecord::to(&topic)
                    .key(&id)
                    .payload("{}")
                    .headers(headers),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(WAIT).unwrap();

    let servers = server.sasl_plaintext_servers().unwrap();
    let env: Vec<(String, String)> = [
        ("WALBOX_INBOX_POSTGRES_URL", db.url()),
        ("WALBOX_INBOX_KAFKA_BROKERS", servers),
        ("WALBOX_INBOX_KAFKA_GROUP_ID", group.clone()),
        ("WALBOX_INBOX_KAFKA_TOPICS", topic.clone()),
        ("WALBOX_INBOX_HTTP_LISTEN", "off".into()),
        (
            "WALBOX_INBOX_EFFECT_SQL",
            "INSERT INTO seen VALUES ($message_id)".into(),
        ),
        ("WALBOX_INBOX_RETENTION_KEEP", "10d".into()),
        (
            "WALBOX_INBOX_KAFKA_PROPERTY_SECURITY_PROTOCOL",
            "SASL_PLAINTEXT".into(),
        ),
        (
            "WALBOX_INBOX_KAFKA_PROPERTY_SASL_MECHANISMS",
            "SCRAM-SHA-256".into(),
        ),
        ("WALBOX_INBOX_KAFKA_PROPERTY_SASL_USERNAME", USER.0.into()),
        ("WALBOX_INBOX_KAFKA_PROPERTY_SASL_PASSWORD", USER.1.into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let mut inbox = Walbox::spawn_subcommand("inbox", &env);
    wait_until(WAIT, "the inbox to apply every record", || {
        assert!(inbox.running(), "{}", inbox.log());
        db.sql("SELECT count(DISTINCT id) FROM seen") == "20"
    });
    inbox.terminate();
    assert!(inbox.wait_exit(WAIT).success(), "{}", inbox.log());
}

/// Issue 42, item 12: a progress topic the principal may not describe is left out of the
/// cluster's topic list, as if it did not exist; `walbox check` said it did not exist. It now
/// says the principal is not authorized, and which ACL to grant.
#[test]
fn check_names_the_acl_of_a_progress_topic_the_principal_may_not_describe() {
    let Some(server) = acl_broker() else { return };
    let admin = Broker::External(server.bootstrap_servers());
    let db = TestDb::new("acl_check");
    db.create_slot_and_publication(&db.name);
    // It exists, and walbox's principal has no right on it.
    let progress = support::own_progress_topic(&admin, &db.name);
    let run = crate::check::check(&env_as_user(&db, server, &progress), &[]);
    run.failed();
    run.expect(
        &format!("topic {progress}"),
        "FAIL",
        &[
            "not authorized to describe",
            &format!("--operation Write --operation Read --topic {progress}"),
        ],
    );
    assert!(
        !run.line(&format!("topic {progress}"))
            .contains("does not exist"),
        "{}",
        run.stdout
    );
}

/// Issue 42, item 6: without Write on the progress topic, `walbox check` says so, and `walbox
/// run` (two shards) stops before any shard streams: no slot moves past a row, and once Write
/// is granted every row arrives.
#[test]
fn without_write_on_the_progress_topic_check_and_run_refuse_and_nothing_is_lost() {
    let Some(server) = acl_broker() else { return };
    let admin = Broker::External(server.bootstrap_servers());
    let db = TestDb::new("acl_nowrite");
    let topic = format!("t_{}", db.name);
    admin.create_topic(&topic, 2).unwrap();
    let progress = support::own_progress_topic(&admin, &db.name);
    // run's rights, but only Read and Describe on the progress topic.
    let mut acls: Vec<Acl> = run_acls(&[&topic], &progress, false)
        .into_iter()
        .filter(|a| !(a.operation == Op::Write && a.name == progress))
        .collect();
    acls.push(Acl::allow(USER.0, Op::Describe, On::Topic, &progress));
    acls.push(Acl::allow(
        USER.0,
        Op::DescribeConfigs,
        On::Topic,
        &progress,
    ));
    server.create_acls(&acls).unwrap();
    await_described(server, &[&topic, &progress]);
    let mut env = env_as_user(&db, server, &progress);
    env.push(("WALBOX_POSTGRES_SHARDS".into(), "2".into()));

    let out = support::walbox_output(&["check"], &env);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("progress topic write"))
        .unwrap_or_else(|| panic!("no progress write check in:\n{stdout}"));
    assert!(line.starts_with("FAIL"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "grant walbox's principal Write on topic {progress}"
        )),
        "{stdout}"
    );

    let aggregates: Vec<String> = (0..10).map(|i| format!("agg-{i}")).collect();
    let mut walbox = Walbox::spawn(&env);
    let status = walbox.wait_exit(WAIT);
    assert_eq!(status.code(), Some(9), "{}", walbox.log());
    assert!(
        walbox
            .last_line()
            .contains("cannot write the progress record"),
        "{}",
        walbox.log()
    );
    // Rows committed now are ahead of every shard's slot.
    write_txns(&db, &topic, &aggregates, 3);

    server
        .create_acls(&[Acl::allow(USER.0, Op::Write, On::Topic, &progress)])
        .unwrap();
    let mut reader = TopicReader::new(&admin.bootstrap_servers(), &[&topic], WAIT).unwrap();
    let mut walbox = Walbox::spawn(&env);
    let all = outbox_ids(&db);
    await_distinct(&mut reader, all.len(), &walbox);
    stop_and_read_exactly(&mut walbox, &mut reader, &all);
}
