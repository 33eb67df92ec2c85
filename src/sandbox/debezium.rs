//! Kafka Connect standalone (`org.apache.kafka.connect.cli.ConnectStandalone`) with the Debezium
//! PostgreSQL connector and its Outbox Event Router, run from the jars
//! `scripts/install-debezium.sh` puts in the Debezium cache ([`installed`]): the rig of the
//! differential and migration tests and of the Debezium benchmark.
//!
//! Invariants:
//! - Everything of a worker (its properties, file offset store, log) lives in one private
//!   temporary directory; the JVM is killed when the [`Connect`] is dropped.
//! - Connect's REST API binds a free port on 127.0.0.1; [`Connect::start`] returns only once the
//!   connector's task is `RUNNING` and the caller's check says its slot streams, so that every
//!   row committed afterwards is in its stream. Its log goes to a file, returned in the error
//!   when the start fails.
//! - Keys and values go through Connect's `StringConverter`, headers through its default
//!   `SimpleHeaderConverter`: the converters Debezium's outbox documentation pairs with the
//!   router for JSON payloads.
//! - The connector reaches PostgreSQL over TCP with the given credentials; the properties file
//!   holds the password (it is private to the temporary directory).

use std::fs;
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::http_get;

/// The Debezium release `scripts/install-debezium.sh` installs (built against the sandbox's
/// Kafka); `WALBOX_DEBEZIUM_VERSION` picks another installed one.
pub const DEBEZIUM_VERSION: &str = "3.6.1.Final";

/// How long Connect may take to start the connector's task and create its slot.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// Why Connect could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The version's jars are not in the cache.
    #[error(
        "Debezium {version} not found in {dir}; install it with: bash scripts/install-debezium.sh"
    )]
    NotInstalled {
        /// The version looked for.
        version: String,
        /// Where.
        dir: String,
    },
    /// A file or process operation failed.
    #[error("{0}: {1}")]
    Io(String, io::Error),
    /// The JVM exited before the task ran.
    #[error("Kafka Connect exited with {0}; log:\n{1}")]
    Exited(String, String),
    /// The connector's task reported `FAILED`.
    #[error("the Debezium task failed; log:\n{0}")]
    TaskFailed(String),
    /// The task did not run with its slot streaming in time.
    #[error(
        "the Debezium task did not run with its slot streaming within {START_TIMEOUT:?} \
         (task {0:?}); log:\n{1}"
    )]
    Timeout(Option<String>, String),
}

type Result<T> = std::result::Result<T, ConnectError>;

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ConnectError {
    let what = what.into();
    move |e| ConnectError::Io(what, e)
}

/// The installed version's directory (`$WALBOX_DEBEZIUM_CACHE/<version>`, by default under
/// `/var/cache/walbox/debezium`), or why it is missing.
pub fn installed() -> Result<PathBuf> {
    let cache = std::env::var_os("WALBOX_DEBEZIUM_CACHE")
        .filter(|v| !v.is_empty())
        .map_or_else(
            || PathBuf::from("/var/cache/walbox/debezium"),
            PathBuf::from,
        );
    let version = version();
    let dir = cache.join(&version);
    if dir.join(".walbox-debezium").is_file() {
        Ok(dir)
    } else {
        Err(ConnectError::NotInstalled {
            version,
            dir: dir.display().to_string(),
        })
    }
}

/// The version the sandbox runs: `$WALBOX_DEBEZIUM_VERSION`, by default [`DEBEZIUM_VERSION`].
pub fn version() -> String {
    std::env::var("WALBOX_DEBEZIUM_VERSION")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| DEBEZIUM_VERSION.to_owned())
}

/// Where the connector reads from.
pub struct Database<'a> {
    /// Host (an address on this machine).
    pub host: &'a str,
    /// TCP port.
    pub port: u16,
    /// Role (a superuser, or one allowed to replicate and to read the outbox).
    pub user: &'a str,
    /// Its password.
    pub password: &'a str,
    /// The database.
    pub dbname: &'a str,
}

/// What the connector relays, and where.
pub struct ConnectorSpec<'a> {
    /// The connector's name, also its `topic.prefix`.
    pub name: &'a str,
    /// The database.
    pub db: Database<'a>,
    /// Its replication slot (created by the connector unless it exists).
    pub slot: &'a str,
    /// Its publication (created for the outbox table only unless it exists).
    pub publication: &'a str,
    /// The broker's `bootstrap.servers`.
    pub bootstrap: &'a str,
    /// The router's settings (`transforms.outbox.<key>`), after `type`.
    pub router: &'a [(&'a str, String)],
    /// More connector properties, after (hence overriding) the defaults above.
    pub extra: &'a [(&'a str, String)],
}

/// A running Kafka Connect standalone worker with one Debezium PostgreSQL connector.
pub struct Connect {
    child: Child,
    dir: tempfile::TempDir,
    started: Instant,
    /// The connector's name.
    pub name: String,
    /// The REST API's port.
    pub rest_port: u16,
    /// From spawning the JVM to the task running with its slot streaming (zero until
    /// [`Connect::wait_running`] returned).
    pub start_time: Duration,
}

fn properties(pairs: &[(&str, String)]) -> String {
    pairs.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

fn free_port() -> Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(io_err("finding a free port"))
}

impl Connect {
    /// Starts Connect with the connector of `spec`; returns once its task runs and `streaming`
    /// says its slot streams.
    pub fn start(spec: &ConnectorSpec<'_>, streaming: impl FnMut() -> bool) -> Result<Connect> {
        let mut connect = Connect::spawn(spec)?;
        connect.wait_running(streaming)?;
        Ok(connect)
    }

    /// Writes the worker's and the connector's configuration and spawns the JVM; returns at
    /// once.
    pub fn spawn(spec: &ConnectorSpec<'_>) -> Result<Connect> {
        let home = installed()?;
        let dir = tempfile::Builder::new()
            .prefix("walbox-connect.")
            .tempdir()
            .map_err(io_err("creating Connect's directory"))?;
        let root = dir.path();
        let rest_port = free_port()?;
        let name = spec.name.to_owned();
        let worker = properties(&[
            ("bootstrap.servers", spec.bootstrap.to_owned()),
            (
                "key.converter",
                "org.apache.kafka.connect.storage.StringConverter".into(),
            ),
            (
                "value.converter",
                "org.apache.kafka.connect.storage.StringConverter".into(),
            ),
            (
                "offset.storage.file.filename",
                root.join("offsets").display().to_string(),
            ),
            ("offset.flush.interval.ms", "1000".into()),
            ("listeners", format!("http://127.0.0.1:{rest_port}")),
            ("plugin.path", home.join("plugins").display().to_string()),
            // Payloads up to the broker's default message.max.bytes (1 MiB).
            ("producer.max.request.size", "1048576".into()),
        ]);
        let db = &spec.db;
        let mut connector = vec![
            ("name", name.clone()),
            (
                "connector.class",
                "io.debezium.connector.postgresql.PostgresConnector".into(),
            ),
            ("tasks.max", "1".into()),
            ("database.hostname", db.host.into()),
            ("database.port", db.port.to_string()),
            ("database.user", db.user.into()),
            ("database.password", db.password.into()),
            ("database.dbname", db.dbname.into()),
            ("topic.prefix", name.clone()),
            ("plugin.name", "pgoutput".into()),
            ("slot.name", spec.slot.into()),
            ("publication.name", spec.publication.into()),
            ("publication.autocreate.mode", "filtered".into()),
            ("table.include.list", "public.outbox".into()),
            ("snapshot.mode", "no_data".into()),
            ("tombstones.on.delete", "false".into()),
            ("transforms", "outbox".into()),
            (
                "transforms.outbox.type",
                "io.debezium.transforms.outbox.EventRouter".into(),
            ),
        ];
        let router: Vec<(String, String)> = spec
            .router
            .iter()
            .map(|(k, v)| (format!("transforms.outbox.{k}"), v.clone()))
            .collect();
        connector.extend(router.iter().map(|(k, v)| (k.as_str(), v.clone())));
        connector.extend(spec.extra.iter().cloned());
        fs::write(root.join("worker.properties"), worker).map_err(io_err("worker.properties"))?;
        fs::write(root.join("connector.properties"), properties(&connector))
            .map_err(io_err("connector.properties"))?;
        let log = root.join("connect.log");
        fs::write(
            root.join("log4j2.properties"),
            format!(
                "status = error\nappender.file.type = File\nappender.file.name = file\n\
                 appender.file.fileName = {}\nappender.file.layout.type = PatternLayout\n\
                 appender.file.layout.pattern = [%d] %p %m (%c)%n\n\
                 rootLogger.level = INFO\nrootLogger.appenderRef.file.ref = file\n",
                log.display()
            ),
        )
        .map_err(io_err("log4j2.properties"))?;
        let out = fs::File::create(root.join("stdout")).map_err(io_err("Connect's output file"))?;
        let err = out.try_clone().map_err(io_err("Connect's output file"))?;
        let started = Instant::now();
        let child = Command::new("java")
            .arg("-Xms128m")
            .arg("-Xmx512m")
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                root.join("log4j2.properties").display()
            ))
            .arg("-cp")
            .arg(format!("{}/*", home.join("connect").display()))
            .arg("org.apache.kafka.connect.cli.ConnectStandalone")
            .arg(root.join("worker.properties"))
            .arg(root.join("connector.properties"))
            .current_dir(root)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(io_err("starting java (ConnectStandalone)"))?;
        Ok(Connect {
            child,
            dir,
            started,
            name,
            rest_port,
            start_time: Duration::ZERO,
        })
    }

    /// Waits until the connector's task is `RUNNING` and `streaming` says its slot streams;
    /// sets [`Connect::start_time`].
    pub fn wait_running(&mut self, mut streaming: impl FnMut() -> bool) -> Result<()> {
        let deadline = self.started + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(ConnectError::Exited(status.to_string(), self.log_tail()));
            }
            let state = self.task_state();
            if state.as_deref() == Some("FAILED") {
                return Err(ConnectError::TaskFailed(self.log_tail()));
            }
            if state.as_deref() == Some("RUNNING") && streaming() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(ConnectError::Timeout(state, self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.start_time = self.started.elapsed();
        Ok(())
    }

    /// When the JVM was spawned.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The JVM's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails when the JVM has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(ConnectError::Exited(status.to_string(), self.log_tail())),
            Ok(None) => Ok(()),
            Err(e) => Err(ConnectError::Io("waiting for Kafka Connect".into(), e)),
        }
    }

    /// The state of the connector's task 0 (`RUNNING`, `FAILED`, …), from the REST API.
    pub fn task_state(&self) -> Option<String> {
        let (code, body) = http_get(self.rest_port, &format!("/connectors/{}/status", self.name))?;
        if code != 200 {
            return None;
        }
        let status: serde_json::Value = serde_json::from_str(&body).ok()?;
        status["tasks"][0]["state"].as_str().map(str::to_owned)
    }

    /// The connector's configuration as Connect was given it: a `.properties` file, password
    /// included.
    pub fn connector_config(&self) -> PathBuf {
        self.dir.path().join("connector.properties")
    }

    /// Kills the JVM at once (SIGKILL), as a crash would: the slot keeps the position Debezium
    /// last confirmed, which may be behind what it produced.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The JVM's resident set size in KiB, while it runs.
    pub fn rss_kib(&self) -> Option<u64> {
        rss_kib(self.child.id())
    }

    /// Connect's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("connect.log")
    }

    /// The last 60 lines of Connect's log and output.
    pub fn log_tail(&self) -> String {
        let mut text = fs::read_to_string(self.log_path()).unwrap_or_default();
        text.push_str(&fs::read_to_string(self.dir.path().join("stdout")).unwrap_or_default());
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    /// The worker's directory (its configuration, offsets and log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A process's resident set size in KiB (`VmRSS`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

impl Drop for Connect {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
