//! Test support: one throwaway PostgreSQL cluster per test binary, one database + slot per test,
//! a Kafka-protocol broker per test (librdkafka's mock cluster, one Apache Kafka broker shared by
//! the whole binary with `WALBOX_TEST_KAFKA=apache`, or the external brokers in
//! `WALBOX_TEST_KAFKA_BROKERS`), a Redis, a NATS and a RabbitMQ server per test binary
//! ([`brokers`]), and the `walbox` binary as a child process.
//!
//! Waiting is always on a condition with a deadline ([`wait_until`]); a test that times out
//! panics with what it was waiting for.

#![allow(dead_code)]

pub mod brokers;
pub mod debezium;
pub mod events;
pub mod kafka;
pub mod standby;

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use walbox::lsn::Lsn;
use walbox::sandbox::broker::Broker;
use walbox::sandbox::postgres::{PgCluster, PgClusterOptions};

/// Generous deadline for conditions that normally hold within a second.
pub const WAIT: Duration = Duration::from_secs(60);

/// The seeds' outbox table (`000_…`), plus a business table: the demo's schema.
pub const OUTBOX_DDL: &str = walbox::sandbox::SCHEMA;

/// The PostgreSQL major the tests run on: `WALBOX_TEST_PG` (13 to 18; installed by
/// `scripts/install-deps.sh`), by default `None`, Debian's.
pub fn test_major() -> Option<u32> {
    let value = std::env::var("WALBOX_TEST_PG").ok()?;
    match value.trim().parse::<u32>() {
        Ok(major) if (13..=18).contains(&major) => Some(major),
        _ if value.trim().is_empty() => None,
        _ => panic!("WALBOX_TEST_PG={value:?}: expected a PostgreSQL major from 13 to 18"),
    }
}

/// Options for a test cluster: the major of [`test_major`], a watchdog (test clusters live
/// in statics or leaked boxes), the rest as `PgClusterOptions::default()`.
pub fn pg_options() -> PgClusterOptions {
    PgClusterOptions {
        major: test_major(),
        watchdog: true,
        ..Default::default()
    }
}

/// Starts a test cluster with `opts`, naming the major in the panic when it cannot.
pub fn start_cluster(opts: PgClusterOptions) -> PgCluster {
    let major = opts.major;
    let cluster = PgCluster::start(opts).unwrap_or_else(|e| {
        let which = major.map_or("Debian's".to_owned(), |m| m.to_string());
        panic!("start a PostgreSQL cluster ({which}): {e}")
    });
    if let Some(major) = major {
        assert_eq!(cluster.major(), major, "the cluster runs another major");
    }
    cluster
}

/// The cluster shared by every test of this binary.
pub fn cluster() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        start_cluster(PgClusterOptions {
            ssl: true,
            ..pg_options()
        })
    })
}

/// The major of the test clusters (from the running shared cluster).
pub fn major() -> u32 {
    cluster().major()
}

/// A name unique within this test run.
pub fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A database of its own, with the outbox table.
#[derive(Clone)]
pub struct TestDb {
    /// Database name (also used for the slot and topic names).
    pub name: String,
    cluster: &'static PgCluster,
}

impl TestDb {
    /// A fresh database on the shared cluster with [`OUTBOX_DDL`] applied.
    pub fn new(tag: &str) -> TestDb {
        Self::on(cluster(), tag)
    }

    /// A fresh database on `cluster`.
    pub fn on(cluster: &'static PgCluster, tag: &str) -> TestDb {
        let name = unique(tag);
        cluster.create_database(&name).expect("create database");
        cluster.psql(&name, OUTBOX_DDL).expect("create outbox");
        TestDb { name, cluster }
    }

    /// A fresh database on the shared cluster created `WITH` `options` (an encoding, say),
    /// with [`OUTBOX_DDL`] applied.
    pub fn with_options(tag: &str, options: &str) -> TestDb {
        let (name, cluster) = (unique(tag), cluster());
        cluster
            .psql(
                "postgres",
                &format!("CREATE DATABASE \"{name}\" WITH {options}"),
            )
            .expect("create database");
        cluster.psql(&name, OUTBOX_DDL).expect("create outbox");
        TestDb { name, cluster }
    }

    /// The same database on `standby`, a physical standby of this database's cluster.
    pub fn on_standby(&self, standby: &'static PgCluster) -> TestDb {
        TestDb {
            name: self.name.clone(),
            cluster: standby,
        }
    }

    /// SCRAM over TCP as the superuser.
    pub fn url(&self) -> String {
        self.cluster.url(&self.name)
    }

    /// [`TestDb::url`] through a proxy on 127.0.0.1:`port`, giving up on a connection attempt
    /// after `connect_timeout` seconds.
    pub fn url_via(&self, port: u16, connect_timeout: u32) -> String {
        let direct = format!("127.0.0.1:{}/", self.cluster.port());
        let url = self.url();
        assert!(url.contains(&direct), "{url}");
        format!(
            "{}&connect_timeout={connect_timeout}",
            url.replace(&direct, &format!("127.0.0.1:{port}/"))
        )
    }

    /// The cluster's TCP address.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.cluster.port()))
    }

    /// Runs SQL and returns psql's unaligned output.
    pub fn sql(&self, sql: &str) -> String {
        self.cluster
            .psql(&self.name, sql)
            .unwrap_or_else(|e| panic!("SQL failed: {e}\n{sql}"))
            .trim()
            .to_owned()
    }

    /// Runs SQL, returning psql's error instead of panicking (for a server that may be down).
    pub fn try_sql(&self, sql: &str) -> Result<String, String> {
        self.cluster
            .psql(&self.name, sql)
            .map(|out| out.trim().to_owned())
            .map_err(|e| e.to_string())
    }

    /// The slot's `confirmed_flush_lsn` (0/0 when absent).
    pub fn confirmed(&self, slot: &str) -> Lsn {
        self.sql(&format!(
            "SELECT coalesce(confirmed_flush_lsn, '0/0') FROM pg_replication_slots WHERE slot_name = '{slot}'"
        ))
        .parse()
        .unwrap_or(Lsn::ZERO)
    }

    /// Whether a walsender streams from the slot. (Not merely `active`: a slot being created
    /// is active too, before its consistent point, and rows written then are not in its
    /// stream.)
    pub fn streaming(&self, slot: &str) -> bool {
        self.sql(&format!(
            "SELECT r.state FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid \
             WHERE s.slot_name = '{slot}' AND s.confirmed_flush_lsn IS NOT NULL"
        ))
        .lines()
        .any(|state| state == "streaming" || state == "catchup")
    }

    /// Whether some process holds the slot.
    pub fn slot_active(&self, slot: &str) -> bool {
        self.sql(&format!(
            "SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'"
        )) == "t"
    }

    /// Creates the slot and the publication walbox expects (so events written before walbox
    /// first starts are in its stream), and a second slot `<slot>_probe` at the same position
    /// for [`TestDb::commits`].
    pub fn create_slot_and_publication(&self, slot: &str) {
        self.sql(&format!(
            "CREATE PUBLICATION {slot} FOR TABLE outbox WITH (publish = 'insert');
             SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput');
             SELECT pg_create_logical_replication_slot('{slot}_probe', 'pgoutput');"
        ));
    }

    /// Every transaction with outbox rows since the slot was created, as `(commit LSN, end
    /// LSN)`, read through the probe slot (without consuming it) and walbox's own decoder.
    pub fn commits(&self, slot: &str) -> Vec<(Lsn, Lsn)> {
        let out = self.sql(&format!(
            "SELECT encode(data, 'hex') FROM pg_logical_slot_peek_binary_changes('{slot}_probe', NULL, NULL, \
             'proto_version', '1', 'publication_names', '{slot}') WHERE substr(data, 1, 1) = 'C'::bytea"
        ));
        out.lines()
            .filter(|l| !l.is_empty())
            .map(|hex| {
                let bytes: Vec<u8> = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                    .collect();
                match walbox::source::pgoutput::decode(bytes.into()) {
                    Ok(walbox::source::pgoutput::LogicalMessage::Commit(c)) => {
                        (c.commit_lsn, c.end_lsn)
                    }
                    other => panic!("not a commit: {other:?}"),
                }
            })
            .collect()
    }
}

/// Brokers in the mock cluster of [`broker`].
pub const MOCK_BROKERS: i32 = 3;

/// The mock cluster behind [`broker`], for fault injection.
pub type Mock = rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>;

/// The test's broker: the cluster in `WALBOX_TEST_KAFKA_BROKERS` when set, else the shared
/// Apache Kafka broker with `WALBOX_TEST_KAFKA=apache` ([`kafka::apache`]), else a fresh mock
/// cluster.
pub fn broker() -> Broker {
    let external = std::env::var("WALBOX_TEST_KAFKA_BROKERS").is_ok_and(|b| !b.trim().is_empty());
    if !external {
        if let Some(server) = kafka::apache() {
            let broker = Broker::External(server.bootstrap_servers());
            // As walbox creates it.
            broker
                .create_topic_with(
                    walbox::config::DEFAULT_PROGRESS_TOPIC,
                    1,
                    walbox::sink::topics::PROGRESS_TOPIC_CONFIG,
                )
                .expect("create the progress topic on the Apache Kafka broker");
            return broker;
        }
    }
    Broker::from_env_or_mock("WALBOX_TEST_KAFKA_BROKERS", MOCK_BROKERS)
        .expect("start the mock Kafka cluster")
}

/// Every broker of the mock cluster answers `rtt` late (`Duration::ZERO`: on time again).
pub fn delay_every_broker(mock: &Mock, rtt: Duration) {
    for b in 1..=MOCK_BROKERS {
        mock.broker_round_trip_time(b, rtt)
            .expect("set a mock broker's round trip time");
    }
}

/// Moves the leader of each of `topic`'s `partitions` partitions to the next broker.
pub fn move_partition_leaders(mock: &Mock, topic: &str, partitions: i32) {
    for p in 0..partitions {
        mock.partition_leader(topic, p, Some((p + 1) % MOCK_BROKERS + 1))
            .expect("move a partition's leader");
    }
}

/// The test's broker with a topic of `partitions` named after `db` (`t_<database>`).
pub fn topic_on_broker(db: &TestDb, partitions: i32) -> (String, Broker) {
    let topic = format!("t_{}", db.name);
    let broker = broker();
    broker
        .create_topic(&topic, partitions)
        .expect("create the test topic");
    (topic, broker)
}

/// A progress topic of the test's own on `broker` (`progress.<slot>`, one partition, with the
/// configuration walbox creates it with), for `WALBOX_KAFKA_PROGRESS_TOPIC`. A test that reads the
/// progress records back needs one: under `read_committed` the shared `walbox.progress` ends,
/// for a reader, at the first record of any other test's open Kafka transaction (a walbox
/// killed mid-transaction leaves one open until its next session or the transaction timeout).
pub fn own_progress_topic(broker: &Broker, slot: &str) -> String {
    let topic = format!("progress.{slot}");
    broker
        .create_topic_with(&topic, 1, walbox::sink::topics::PROGRESS_TOPIC_CONFIG)
        .expect("create the test's progress topic");
    topic
}

/// Waits for `cond`, polling, up to `timeout`; panics naming `what` on timeout.
pub fn wait_until(timeout: Duration, what: &str, cond: impl FnMut() -> bool) {
    wait_until_or(timeout, what, cond, String::new);
}

/// [`wait_until`], whose panic on timeout also shows `detail()` (a log, the rows seen).
pub fn wait_until_or(
    timeout: Duration,
    what: &str,
    mut cond: impl FnMut() -> bool,
    detail: impl FnOnce() -> String,
) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        if Instant::now() >= deadline {
            panic!("timed out waiting for {what}\n{}", detail());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `walbox run` child process.
pub struct Walbox {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// The environment of a walbox relaying `db`'s outbox through `slot` to `brokers`.
pub fn walbox_env(db: &TestDb, slot: &str, brokers: &str) -> Vec<(String, String)> {
    [
        ("WALBOX_POSTGRES_URL", db.url()),
        ("WALBOX_POSTGRES_SLOT", slot.to_owned()),
        ("WALBOX_POSTGRES_PUBLICATION", slot.to_owned()),
        ("WALBOX_POSTGRES_CREATE_SLOT", "true".to_owned()),
        ("WALBOX_POSTGRES_CREATE_PUBLICATION", "true".to_owned()),
        ("WALBOX_KAFKA_BROKERS", brokers.to_owned()),
        ("WALBOX_HTTP_LISTEN", "off".to_owned()),
        ("WALBOX_RELAY_BACKOFF_INITIAL", "50ms".to_owned()),
        ("WALBOX_RELAY_BACKOFF_MAX", "1s".to_owned()),
        ("WALBOX_POSTGRES_STATUS_INTERVAL", "100ms".to_owned()),
        (
            "WALBOX_LOG_LEVEL",
            "info,librdkafka=warn,rdkafka=warn".to_owned(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Runs `walbox <args…>` with exactly `env` (plus PATH) to completion.
pub fn walbox_output(args: &[&str], env: &[(String, String)]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_walbox"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run walbox")
}

/// Runs `walbox <args…>` with `env` to completion: (exit code, stdout + stderr).
pub fn walbox_cmd(args: &[&str], env: &[(String, String)]) -> (i32, String) {
    let out = walbox_output(args, env);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// The value quoted after `walbox republish --since ` in `text`.
pub fn since_in(text: &str) -> String {
    let at = text
        .find("walbox republish --since '")
        .unwrap_or_else(|| panic!("no republish command in: {text}"));
    let rest = &text[at + "walbox republish --since '".len()..];
    rest[..rest.find('\'').expect("closing quote")].to_owned()
}

/// The arguments of the first command `text` prints in backquotes as `` `walbox <command> …` ``,
/// split as a shell would split them (single quotes only), without the leading `walbox`.
pub fn printed_command(text: &str, command: &str) -> Vec<String> {
    let start = format!("`walbox {command}");
    let at = text
        .find(&start)
        .unwrap_or_else(|| panic!("no `walbox {command}` command in: {text}"));
    let rest = &text[at + 1..];
    let line = &rest[..rest.find('`').expect("closing backquote")];
    let (mut args, mut arg, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
    for c in line.chars() {
        match c {
            '\'' => (quoted, any) = (!quoted, true),
            ' ' if !quoted => {
                if any {
                    args.push(std::mem::take(&mut arg));
                }
                any = false;
            }
            c => (arg, any) = (arg + &c.to_string(), true),
        }
    }
    if any {
        args.push(arg);
    }
    assert!(!quoted, "unbalanced quotes in {line}");
    assert!(
        !line.contains('<'),
        "a placeholder in the printed command: {line}"
    );
    args.remove(0);
    args
}

impl Walbox {
    /// Starts `walbox run` with exactly `env` (plus PATH) as its environment.
    pub fn spawn(env: &[(String, String)]) -> Walbox {
        Self::spawn_subcommand("run", env)
    }

    /// Starts `walbox <subcommand>` with exactly `env` (plus PATH) as its environment.
    pub fn spawn_subcommand<K: AsRef<std::ffi::OsStr>, V: AsRef<std::ffi::OsStr>>(
        subcommand: &str,
        env: &[(K, V)],
    ) -> Walbox {
        Self::spawn_args(&[subcommand], env)
    }

    /// Starts `walbox <args…>` with exactly `env` (plus PATH) as its environment.
    pub fn spawn_args<K: AsRef<std::ffi::OsStr>, V: AsRef<std::ffi::OsStr>>(
        args: &[&str],
        env: &[(K, V)],
    ) -> Walbox {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("walbox.log");
        let out = File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_walbox"))
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup"))
            .stderr(out)
            .spawn()
            .expect("spawn walbox");
        Walbox {
            child,
            log,
            _dir: dir,
        }
    }

    /// SIGKILL, and reap.
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM (graceful shutdown).
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "walbox did not exit within {timeout:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last line it printed (the fatal error line).
    pub fn last_line(&self) -> String {
        self.log().lines().last().unwrap_or_default().to_owned()
    }
}

impl Drop for Walbox {
    fn drop(&mut self) {
        self.kill();
    }
}

pub use walbox::sandbox::http_get;

/// The value of an unlabelled sample `name` in a Prometheus text exposition.
pub fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A local HTTP server that records the JSON bodies POSTed to it and answers 200.
pub struct WebhookReceiver {
    /// Its URL.
    pub url: String,
    /// Bodies received, in order.
    pub received: Arc<Mutex<Vec<serde_json::Value>>>,
    /// The request heads (request line and headers) received, in order.
    pub heads: Arc<Mutex<Vec<String>>>,
}

impl WebhookReceiver {
    /// Starts listening on a free port.
    pub fn start() -> WebhookReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let received: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
        let sink = received.clone();
        let heads: Arc<Mutex<Vec<String>>> = Arc::default();
        let head_sink = heads.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let body = loop {
                    let Ok(n) = conn.read(&mut chunk) else {
                        break None;
                    };
                    if n == 0 {
                        break None;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len = head
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if body.len() >= len {
                            head_sink.lock().unwrap().push(head.to_owned());
                            break Some(body[..len].to_owned());
                        }
                    }
                };
                let _ = conn.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
                if let Some(v) = body.and_then(|b| serde_json::from_str(&b).ok()) {
                    sink.lock().unwrap().push(v);
                }
            }
        });
        WebhookReceiver {
            url,
            received,
            heads,
        }
    }
}

/// Makes every produce request of the mock cluster fail (retriably) until
/// [`restore_produce`] — an outage that librdkafka's idempotent producer rides out by retrying.
/// (Taking mock brokers down instead re-binds their ports, which can race with other sockets of
/// the test process and abort it.)
pub fn fail_every_produce(mock: &Mock) {
    use rdkafka::types::RDKafkaRespErr;
    let errors = vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS; 100_000];
    mock.request_errors(rdkafka::types::RDKafkaApiKey::Produce, &errors);
}

/// Ends [`fail_every_produce`].
pub fn restore_produce(mock: &Mock) {
    mock.clear_request_errors(rdkafka::types::RDKafkaApiKey::Produce);
}
