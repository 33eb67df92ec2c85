//! A throwaway single-node Apache Kafka broker (KRaft, `process.roles=broker,controller`) for the
//! tests' real-Kafka lane and the benchmarks, run from the jars that `scripts/install-kafka.sh`
//! puts in the Kafka cache ([`kafka_cache`]): `java -cp 'libs/*' kafka.Kafka`.
//!
//! Invariants:
//! - Everything of a server (configuration, storage, certificates) lives in one private
//!   temporary directory, removed when the [`KafkaServer`] is dropped, or by its watchdog
//!   ([`KafkaServerOptions::watchdog`]) once this process is gone.
//! - Every listener binds a free port on 127.0.0.1: a PLAINTEXT one for the tests, the KRaft
//!   controller's, and with [`KafkaServerOptions::scram`] a SASL_PLAINTEXT and a SASL_SSL one
//!   (SCRAM-SHA-256 and -512, the credentials written at format time; TLS with a fresh CA).
//! - The internal topics (offsets, transaction state, share state) have replication factor 1
//!   and min ISR 1, so that groups and transactions work on one node.
//! - The broker's log goes to a file ([`KafkaServer::log_path`]), never to this process's
//!   output.
//! - [`KafkaServer::start`] returns once the broker answers a metadata request.
//! - With [`KafkaServerOptions::acls`] the broker authorizes every request (KRaft's
//!   `StandardAuthorizer`, `allow.everyone.if.no.acl.found=false`): the PLAINTEXT listener's
//!   `User:ANONYMOUS` (the broker's own connections, the tests' admin clients) is a super user,
//!   and a SCRAM user may do only what [`KafkaServer::create_acls`] granted it.
//! - [`KafkaServer::start_behind_proxy`] adds a listener reached only through a [`Proxy`], for
//!   network faults between a client and a broker that keeps running.

use std::fs;
use std::io::{self, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use tempfile::TempDir;

use super::proxy::Proxy;
use super::tls::issue_cert;

/// The Kafka version `scripts/install-kafka.sh` installs (the Kafka that Debezium 3.6.1.Final
/// builds against); `WALBOX_KAFKA_VERSION` picks another installed one.
pub const KAFKA_VERSION: &str = "4.3.0";

/// The cluster id every sandbox broker is formatted with (a fresh storage each time).
const CLUSTER_ID: &str = "d2FsYm94LXRlc3RzLWtmaw";

/// How long the broker may take to answer metadata after its JVM started.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// The watchdog blocks reading stdin, a pipe whose write end only this process holds, so EOF
/// means we are gone; then it kills the broker's JVM (the one in `broker.pid`, which a restart
/// rewrites) and removes its directory.
const WATCHDOG_SCRIPT: &str =
    "trap '' HUP INT\nread -r _ || true\nkill -9 \"$(cat \"$1/broker.pid\")\" 2>/dev/null\nrm -rf \"$1\"";

/// Where installed Kafka versions live, one directory per version with its jars in `libs/`:
/// `$WALBOX_KAFKA_CACHE`, by default `/var/cache/walbox/kafka`.
pub fn kafka_cache() -> PathBuf {
    std::env::var_os("WALBOX_KAFKA_CACHE")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/var/cache/walbox/kafka"), PathBuf::from)
}

/// The version the sandbox runs: `$WALBOX_KAFKA_VERSION`, by default [`KAFKA_VERSION`].
pub fn kafka_version() -> String {
    std::env::var("WALBOX_KAFKA_VERSION")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| KAFKA_VERSION.to_owned())
}

/// Errors of the Kafka sandbox; every message is one line and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum KafkaServerError {
    /// The version's jars are not in the cache.
    #[error("Apache Kafka {0} not found in {1}; install it with: bash scripts/install-kafka.sh")]
    NotInstalled(String, String),
    /// A file-system or process-spawning operation (described) failed.
    #[error("{0}: {1}; check that java is installed and /tmp is writable")]
    Io(String, io::Error),
    /// Formatting the storage failed: its output.
    #[error("formatting the Kafka storage failed: {0}")]
    Format(String),
    /// The broker exited or did not answer in time: why, and the end of its log.
    #[error("the Kafka broker did not start ({0}); its log ends: {1}")]
    Start(String, String),
    /// The TLS certificates could not be made.
    #[error("making the broker's TLS certificates failed: {0}")]
    Tls(#[from] openssl::error::ErrorStack),
    /// The broker refused (or garbled) a CreateAcls request.
    #[error("creating ACLs failed: {0}")]
    Acls(String),
}

impl crate::failure::Classify for KafkaServerError {
    /// The sandbox serves `walbox demo` and the tests: a throwaway Kafka that cannot be set up
    /// ends the demo with the internal-error status (1); the message says what to install or
    /// fix.
    fn failure(&self) -> Option<crate::failure::Failure> {
        Some(crate::failure::Failure::Internal)
    }
}

type Result<T> = std::result::Result<T, KafkaServerError>;

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> KafkaServerError {
    let what = what.into();
    move |e| KafkaServerError::Io(what, e)
}

/// How to start a [`KafkaServer`].
#[derive(Debug, Clone, Default)]
pub struct KafkaServerOptions {
    /// Also spawn a detached watchdog that kills the broker and deletes its directory once this
    /// process is gone. Set it for servers that are never dropped, e.g. kept in a `static`.
    pub watchdog: bool,
    /// A SCRAM user `(name, password)`, written at format time for both SCRAM mechanisms; adds
    /// the SASL_PLAINTEXT and SASL_SSL listeners.
    pub scram: Option<(String, String)>,
    /// Where the broker logs; by default `broker.log` in its (removed) directory.
    pub log_file: Option<PathBuf>,
    /// More `server.properties` lines (`key`, `value`), after the defaults.
    pub properties: Vec<(String, String)>,
    /// Authorize every request by ACLs (see the module docs).
    pub acls: bool,
}

/// A running single-node broker; killed and removed on drop.
pub struct KafkaServer {
    child: Child,
    watchdog: Option<Child>,
    dir: Option<TempDir>,
    plaintext: u16,
    sasl_plaintext: Option<u16>,
    sasl_ssl: Option<u16>,
    log: PathBuf,
    /// `server.properties`, in the server's directory.
    config: PathBuf,
    /// The java program and its arguments before the main class.
    command: (PathBuf, Vec<String>),
}

/// One node of a quorum: its id, its ports, and the static voters (`None`: a standalone
/// controller of its own).
pub(crate) struct Node {
    pub id: u32,
    pub plaintext: u16,
    pub controller: u16,
    /// `controller.quorum.voters` (`id@host:port,…`).
    pub voters: Option<String>,
    /// A second plaintext listener, `EXTERNAL`: the port it listens on and the port it
    /// advertises (a proxy's, forwarding to the first), so clients that bootstrap through the
    /// proxies stay behind them.
    pub external: Option<(u16, u16)>,
}

pub(crate) fn free_port() -> Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(io_err("finding a free port on 127.0.0.1"))
}

/// The last `lines` lines of `path`, on one line (` | ` between them).
fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join(" | ")
}

impl KafkaServer {
    /// Formats a fresh storage and starts the broker; returns once it answers metadata.
    pub fn start(opts: KafkaServerOptions) -> Result<KafkaServer> {
        let node = Node {
            id: 1,
            plaintext: free_port()?,
            controller: free_port()?,
            voters: None,
            external: None,
        };
        let mut server = Self::spawn_node(opts, &node)?;
        server.wait_ready()?;
        Ok(server)
    }

    /// [`KafkaServer::start`], with a second listener that advertises the returned [`Proxy`]: a
    /// client bootstrapped from the proxy's port reaches the broker through it only, so a
    /// blackhole of the proxy cuts that client off while the broker runs on (and, say, times
    /// out its transactions); the PLAINTEXT listener ([`KafkaServer::bootstrap_servers`]) stays
    /// direct.
    pub fn start_behind_proxy(opts: KafkaServerOptions) -> Result<(KafkaServer, Proxy)> {
        let listen = free_port()?;
        let proxy = Proxy::start(([127, 0, 0, 1], listen).into())
            .map_err(io_err("starting the broker's proxy"))?;
        let node = Node {
            id: 1,
            plaintext: free_port()?,
            controller: free_port()?,
            voters: None,
            external: Some((listen, proxy.port())),
        };
        let mut server = Self::spawn_node(opts, &node)?;
        server.wait_ready()?;
        Ok((server, proxy))
    }

    /// Formats a fresh storage for `node` and starts its JVM, without waiting for it to answer
    /// (a node of a quorum answers only once a majority of the voters runs).
    pub(crate) fn spawn_node(opts: KafkaServerOptions, node: &Node) -> Result<KafkaServer> {
        let version = kafka_version();
        let libs = kafka_cache().join(&version).join("libs");
        if !libs.join(format!("kafka_2.13-{version}.jar")).is_file() {
            return Err(KafkaServerError::NotInstalled(
                version,
                libs.display().to_string(),
            ));
        }
        let dir = tempfile::Builder::new()
            .prefix("walbox-kafka.")
            .tempdir()
            .map_err(io_err("creating the broker's directory"))?;
        let root = dir.path().to_owned();
        let log = opts
            .log_file
            .clone()
            .unwrap_or_else(|| root.join("broker.log"));
        let (plaintext, controller) = (node.plaintext, node.controller);
        let (sasl_plaintext, sasl_ssl) = match opts.scram {
            Some(_) => (Some(free_port()?), Some(free_port()?)),
            None => (None, None),
        };

        let mut listeners = vec![
            format!("PLAINTEXT://127.0.0.1:{plaintext}"),
            format!("CONTROLLER://127.0.0.1:{controller}"),
        ];
        let mut protocols = vec!["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"];
        let mut props: Vec<(String, String)> = Vec::new();
        let mut set = |k: &str, v: String| props.push((k.to_owned(), v));
        set("process.roles", "broker,controller".into());
        set("node.id", node.id.to_string());
        set("controller.listener.names", "CONTROLLER".into());
        set("inter.broker.listener.name", "PLAINTEXT".into());
        match &node.voters {
            Some(voters) => set("controller.quorum.voters", voters.clone()),
            None => set(
                "controller.quorum.bootstrap.servers",
                format!("127.0.0.1:{controller}"),
            ),
        }
        set("log.dirs", root.join("data").display().to_string());
        for (k, v) in [
            ("num.partitions", "1"),
            ("offsets.topic.replication.factor", "1"),
            ("offsets.topic.num.partitions", "1"),
            ("transaction.state.log.replication.factor", "1"),
            ("transaction.state.log.min.isr", "1"),
            ("transaction.state.log.num.partitions", "1"),
            ("share.coordinator.state.topic.replication.factor", "1"),
            ("share.coordinator.state.topic.min.isr", "1"),
            ("group.initial.rebalance.delay.ms", "0"),
            // The tests' consumers use session timeouts of a few seconds (the default floor
            // is 6 s, below which JoinGroup fails with INVALID_SESSION_TIMEOUT).
            ("group.min.session.timeout.ms", "1000"),
            // Timed-out transactions are aborted within a second, not ten.
            (
                "transaction.abort.timed.out.transaction.cleanup.interval.ms",
                "1000",
            ),
        ] {
            set(k, v.into());
        }
        if opts.acls {
            set(
                "authorizer.class.name",
                "org.apache.kafka.metadata.authorizer.StandardAuthorizer".into(),
            );
            set("allow.everyone.if.no.acl.found", "false".into());
            set("super.users", "User:ANONYMOUS".into());
        }
        if let (Some(_), Some(sp), Some(ss)) = (&opts.scram, sasl_plaintext, sasl_ssl) {
            listeners.push(format!("SASL_PLAINTEXT://127.0.0.1:{sp}"));
            listeners.push(format!("SASL_SSL://127.0.0.1:{ss}"));
            protocols.extend(["SASL_PLAINTEXT:SASL_PLAINTEXT", "SASL_SSL:SASL_SSL"]);
            set(
                "sasl.enabled.mechanisms",
                "SCRAM-SHA-256,SCRAM-SHA-512".into(),
            );
            let jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;";
            for listener in ["sasl_plaintext", "sasl_ssl"] {
                for mechanism in ["scram-sha-256", "scram-sha-512"] {
                    set(
                        &format!("listener.name.{listener}.{mechanism}.sasl.jaas.config"),
                        jaas.into(),
                    );
                }
            }
            let (ca, ca_key) = issue_cert("walbox test Kafka CA", None)?;
            let (cert, key) = issue_cert("localhost", Some((&ca, &ca_key)))?;
            let mut keystore = key.private_key_to_pem_pkcs8()?;
            keystore.extend(cert.to_pem()?);
            write(&root.join("keystore.pem"), &keystore)?;
            write(&root.join("ca.pem"), &ca.to_pem()?)?;
            set("ssl.keystore.type", "PEM".into());
            set(
                "ssl.keystore.location",
                root.join("keystore.pem").display().to_string(),
            );
        }
        let mut advertised: Vec<String> = listeners
            .iter()
            .filter(|l| !l.starts_with("CONTROLLER"))
            .cloned()
            .collect();
        if let Some((listen, advertise)) = node.external {
            listeners.push(format!("EXTERNAL://127.0.0.1:{listen}"));
            advertised.push(format!("EXTERNAL://127.0.0.1:{advertise}"));
            protocols.push("EXTERNAL:PLAINTEXT");
        }
        let advertised = advertised.join(",");
        let mut text = format!(
            "listeners={}\nadvertised.listeners={advertised}\nlistener.security.protocol.map={}\n",
            listeners.join(","),
            protocols.join(",")
        );
        for (k, v) in props.iter().chain(&opts.properties) {
            text.push_str(&format!("{k}={v}\n"));
        }
        let config = root.join("server.properties");
        write(&config, text.as_bytes())?;
        let log4j = root.join("log4j2.properties");
        write(
            &log4j,
            format!(
                "status = error\nappender.file.type = File\nappender.file.name = file\n\
                 appender.file.fileName = {}\nappender.file.layout.type = PatternLayout\n\
                 appender.file.layout.pattern = [%d] %p %m (%c)%n\n\
                 rootLogger.level = INFO\nrootLogger.appenderRef.file.ref = file\n\
                 logger.kafka.name = kafka\nlogger.kafka.level = INFO\n\
                 logger.state.name = state.change.logger\nlogger.state.level = WARN\n",
                log.display()
            )
            .as_bytes(),
        )?;

        let classpath = format!("{}/*", libs.display());
        let java = |main: &str| {
            let mut cmd = Command::new(java_program());
            cmd.args(classpath_args(&log4j, &classpath))
                .arg(main)
                .current_dir(&root)
                .stdin(Stdio::null());
            cmd
        };
        let mut format = java("kafka.tools.StorageTool");
        format.arg("format");
        // A static quorum (controller.quorum.voters) is formatted without naming controllers.
        if node.voters.is_none() {
            format.arg("--standalone");
        }
        format.args(["-t", CLUSTER_ID, "-c"]);
        format.arg(&config);
        if let Some((user, password)) = &opts.scram {
            for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-512"] {
                format
                    .arg("--add-scram")
                    .arg(format!("{mechanism}=[name={user},password={password}]"));
            }
        }
        let out = format
            .output()
            .map_err(io_err("running java (kafka.tools.StorageTool)"))?;
        if !out.status.success() {
            let text = String::from_utf8_lossy(&out.stderr);
            let last = text.lines().last().unwrap_or_default().to_owned();
            return Err(KafkaServerError::Format(format!("{}: {last}", out.status)));
        }

        let broker = java("kafka.Kafka");
        let child = spawn_broker(broker, &config, &root)?;
        let mut server = KafkaServer {
            child,
            watchdog: None,
            dir: Some(dir),
            plaintext,
            sasl_plaintext,
            sasl_ssl,
            log,
            config,
            command: (java_program(), classpath_args(&log4j, &classpath)),
        };
        if opts.watchdog {
            server.spawn_watchdog(&root)?;
        }
        Ok(server)
    }

    /// SIGKILLs the broker's JVM (its storage stays, for [`KafkaServer::restart`]).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the broker again on its storage and ports after [`KafkaServer::kill`], and
    /// returns once it answers metadata.
    pub fn restart(&mut self) -> Result<()> {
        self.spawn_again()?;
        self.wait_ready()
    }

    /// Starts the killed broker's JVM again, without waiting for it to answer.
    pub(crate) fn spawn_again(&mut self) -> Result<()> {
        self.kill();
        let root = self.config.parent().map(Path::to_owned).unwrap_or_default();
        let mut cmd = Command::new(&self.command.0);
        cmd.args(&self.command.1)
            .arg("kafka.Kafka")
            .current_dir(&root)
            .stdin(Stdio::null());
        self.child = spawn_broker(cmd, &self.config, &root)?;
        Ok(())
    }

    /// Waits until the broker answers metadata naming itself, or fails with its log.
    pub(crate) fn wait_ready(&mut self) -> Result<()> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap_servers())
            .set("log_level", "0")
            .create()
            .map_err(|e| KafkaServerError::Start(e.to_string(), String::new()))?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(KafkaServerError::Start(
                    format!("exited with {status}"),
                    self.log_tail(),
                ));
            }
            if let Ok(md) = consumer.fetch_metadata(None, Duration::from_secs(2)) {
                if !md.brokers().is_empty() {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(KafkaServerError::Start(
                    format!("no metadata within {START_TIMEOUT:?}"),
                    self.log_tail(),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn spawn_watchdog(&mut self, root: &Path) -> Result<()> {
        let child = Command::new("/bin/sh")
            .args(["-c", WATCHDOG_SCRIPT, "walbox-kafka-watchdog"])
            .arg(root)
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(io_err("spawning the watchdog (/bin/sh)"))?;
        self.watchdog = Some(child);
        Ok(())
    }

    /// `bootstrap.servers` of the PLAINTEXT listener.
    pub fn bootstrap_servers(&self) -> String {
        format!("127.0.0.1:{}", self.plaintext)
    }

    /// `bootstrap.servers` of the SASL_PLAINTEXT listener (with [`KafkaServerOptions::scram`]).
    pub fn sasl_plaintext_servers(&self) -> Option<String> {
        self.sasl_plaintext.map(|p| format!("127.0.0.1:{p}"))
    }

    /// `bootstrap.servers` of the SASL_SSL listener (with [`KafkaServerOptions::scram`]); its
    /// certificate is valid for `localhost` and `127.0.0.1`, signed by [`KafkaServer::ca_file`].
    pub fn sasl_ssl_servers(&self) -> Option<String> {
        self.sasl_ssl.map(|p| format!("localhost:{p}"))
    }

    /// The PEM file of the CA that signed the TLS listener's certificate.
    pub fn ca_file(&self) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        self.sasl_ssl.map(|_| dir.path().join("ca.pem"))
    }

    /// The broker's log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last lines of the broker's log, on one line.
    pub fn log_tail(&self) -> String {
        tail(&self.log, 20)
    }

    /// Creates `acls` (a broker started with [`KafkaServerOptions::acls`]), as the PLAINTEXT
    /// listener's super user, in one CreateAcls request (version 1), returning once the
    /// controller committed them (the broker applies them a moment later). rust-rdkafka has no
    /// ACL API and the Kafka jars of the cache hold no command-line tool for it, so the
    /// request is written here: a handful of fixed-width fields.
    pub fn create_acls(&self, acls: &[Acl]) -> Result<()> {
        use std::io::Read;
        let failed = |what: String| KafkaServerError::Acls(what);
        let mut body = Vec::new();
        let string = |out: &mut Vec<u8>, s: &str| {
            out.extend((s.len() as i16).to_be_bytes());
            out.extend(s.as_bytes());
        };
        body.extend(30i16.to_be_bytes()); // CreateAcls
        body.extend(1i16.to_be_bytes()); // version 1: no tagged fields
        body.extend(1i32.to_be_bytes()); // correlation id
        string(&mut body, "walbox-sandbox");
        body.extend((acls.len() as i32).to_be_bytes());
        for acl in acls {
            body.push(acl.resource as u8);
            string(&mut body, &acl.name);
            body.push(if acl.prefixed { 4 } else { 3 }); // PREFIXED, LITERAL
            string(&mut body, &acl.principal);
            string(&mut body, "*");
            body.push(acl.operation as u8);
            body.push(3); // ALLOW
        }
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", self.plaintext))
            .map_err(io_err("connecting to the broker for CreateAcls"))?;
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(io_err("setting a read timeout"))?;
        let mut request = (body.len() as i32).to_be_bytes().to_vec();
        request.extend(body);
        conn.write_all(&request)
            .map_err(io_err("sending CreateAcls"))?;
        let mut size = [0u8; 4];
        conn.read_exact(&mut size)
            .map_err(io_err("reading the CreateAcls response"))?;
        let mut response = vec![0u8; i32::from_be_bytes(size).max(0) as usize];
        conn.read_exact(&mut response)
            .map_err(io_err("reading the CreateAcls response"))?;
        // Correlation id, throttle time, then the results: error code and message each.
        let mut at = 8;
        let mut take = |n: usize| -> Result<&[u8]> {
            let bytes = response
                .get(at..at + n)
                .ok_or_else(|| failed("a truncated CreateAcls response".into()))?;
            at += n;
            Ok(bytes)
        };
        let count = i32::from_be_bytes(take(4)?.try_into().unwrap_or_default());
        for acl in acls.iter().take(count.max(0) as usize) {
            let code = i16::from_be_bytes(take(2)?.try_into().unwrap_or_default());
            let len = i16::from_be_bytes(take(2)?.try_into().unwrap_or_default());
            let message = String::from_utf8_lossy(take(len.max(0) as usize)?).into_owned();
            if code != 0 {
                return Err(failed(format!("{acl:?}: error {code}: {message}")));
            }
        }
        if count as usize != acls.len() {
            return Err(failed(format!("{count} results for {} ACLs", acls.len())));
        }
        Ok(())
    }
}

/// What an [`Acl`] applies to: Kafka's resource type codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AclResource {
    /// A topic.
    Topic = 2,
    /// A consumer group.
    Group = 3,
    /// The cluster (name `kafka-cluster`).
    Cluster = 4,
    /// A transactional id.
    TransactionalId = 5,
}

/// What an [`Acl`] allows: Kafka's operation codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AclOperation {
    /// Read (implies Describe).
    Read = 3,
    /// Write (implies Describe).
    Write = 4,
    /// Create.
    Create = 5,
    /// Describe.
    Describe = 8,
    /// DescribeConfigs.
    DescribeConfigs = 10,
    /// IdempotentWrite (the cluster).
    IdempotentWrite = 12,
}

/// An ACL allowing `principal` (`User:<name>`) `operation` on a resource, from any host.
#[derive(Debug, Clone)]
pub struct Acl {
    /// `User:<name>`.
    pub principal: String,
    /// What it may do.
    pub operation: AclOperation,
    /// On what kind of resource.
    pub resource: AclResource,
    /// The resource's name, or its prefix when `prefixed`.
    pub name: String,
    /// Whether `name` is a prefix (else the literal name).
    pub prefixed: bool,
}

impl Acl {
    /// `user` may `operation` the resource named `name` exactly.
    pub fn allow(user: &str, operation: AclOperation, resource: AclResource, name: &str) -> Acl {
        Acl {
            principal: format!("User:{user}"),
            operation,
            resource,
            name: name.to_owned(),
            prefixed: false,
        }
    }

    /// `user` may `operation` every resource whose name starts with `prefix`.
    pub fn allow_prefixed(
        user: &str,
        operation: AclOperation,
        resource: AclResource,
        prefix: &str,
    ) -> Acl {
        Acl {
            prefixed: true,
            ..Acl::allow(user, operation, resource, prefix)
        }
    }
}

fn write(path: &Path, contents: &[u8]) -> Result<()> {
    fs::File::create(path)
        .and_then(|mut f| f.write_all(contents))
        .map_err(io_err(format!("writing {}", path.display())))
}

/// The JVM's arguments before the main class: heap, log configuration, class path.
fn classpath_args(log4j: &Path, classpath: &str) -> Vec<String> {
    vec![
        "-Xms256m".into(),
        "-Xmx1g".into(),
        format!("-Dlog4j2.configurationFile={}", log4j.display()),
        "-cp".into(),
        classpath.into(),
    ]
}

/// Runs `kafka.Kafka` (`cmd`) on `config`, its output appended to `stdout` in `root`, in a
/// process group of its own (Ctrl-C on the terminal goes to the tests, which stop it).
fn spawn_broker(mut cmd: Command, config: &Path, root: &Path) -> Result<Child> {
    let stdout = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("stdout"))
        .map_err(io_err("creating the broker's output file"))?;
    let child = cmd
        .arg(config)
        .stdout(stdout.try_clone().map_err(io_err("dup"))?)
        .stderr(stdout)
        .process_group(0)
        .spawn()
        .map_err(io_err("starting java (kafka.Kafka)"))?;
    write(&root.join("broker.pid"), child.id().to_string().as_bytes())?;
    Ok(child)
}

/// `$JAVA_HOME/bin/java` when set, else `java` from `PATH`.
fn java_program() -> PathBuf {
    std::env::var_os("JAVA_HOME")
        .filter(|v| !v.is_empty())
        .map(|home| PathBuf::from(home).join("bin/java"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("java"))
}

impl Drop for KafkaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Closing the watchdog's stdin ends it; the directory goes with `dir`.
        if let Some(mut w) = self.watchdog.take() {
            drop(w.stdin.take());
            let _ = w.wait();
        }
        self.dir.take();
    }
}
