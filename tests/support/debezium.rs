//! The Debezium rig of the differential test: Kafka Connect standalone
//! (`org.apache.kafka.connect.cli.ConnectStandalone`) with the Debezium PostgreSQL connector and
//! its Outbox Event Router, run from the jars `scripts/install-debezium.sh` puts in the Debezium
//! cache, against the real-Kafka lane's broker.
//!
//! Invariants:
//! - Everything of a worker (its properties, file offset store, log) lives in one private
//!   temporary directory; the JVM is killed when the [`Connect`] is dropped.
//! - Connect's REST API binds a free port on 127.0.0.1; [`Connect::start`] returns only once the
//!   connector's task is `RUNNING` and its slot streams, so that every row committed afterwards
//!   is in its stream. Its log goes to a file, printed when the start fails.
//! - Keys and values go through Connect's `StringConverter`, headers through its default
//!   `SimpleHeaderConverter`: the converters Debezium's outbox documentation pairs with the
//!   router for JSON payloads.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, http_get, TestDb};

/// The Debezium release `scripts/install-debezium.sh` installs (built against the lane's
/// Kafka); `WALBOX_DEBEZIUM_VERSION` picks another installed one.
pub const DEBEZIUM_VERSION: &str = "3.6.1.Final";

/// How long Connect may take to start the connector's task and create its slot.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// The installed version's directory (`$WALBOX_DEBEZIUM_CACHE/<version>`), or why it is missing.
pub fn installed() -> Result<PathBuf, String> {
    let cache = std::env::var_os("WALBOX_DEBEZIUM_CACHE")
        .filter(|v| !v.is_empty())
        .map_or_else(
            || PathBuf::from("/var/cache/walbox/debezium"),
            PathBuf::from,
        );
    let version = std::env::var("WALBOX_DEBEZIUM_VERSION")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| DEBEZIUM_VERSION.to_owned());
    let dir = cache.join(&version);
    if dir.join(".walbox-debezium").is_file() {
        Ok(dir)
    } else {
        Err(format!(
            "Debezium {version} not found in {}; install it with: bash scripts/install-debezium.sh",
            dir.display()
        ))
    }
}

/// What the connector relays, and where.
pub struct ConnectorSpec<'a> {
    /// The database (on the shared cluster).
    pub db: &'a TestDb,
    /// Its replication slot, which it creates.
    pub slot: &'a str,
    /// Its publication, which it creates for the outbox table only.
    pub publication: &'a str,
    /// The broker's `bootstrap.servers`.
    pub bootstrap: &'a str,
    /// The router's settings (`transforms.outbox.<key>`), after `type`.
    pub router: &'a [(&'a str, String)],
}

/// A running Kafka Connect standalone worker with one Debezium PostgreSQL connector.
pub struct Connect {
    child: Child,
    dir: tempfile::TempDir,
    /// The connector's name.
    pub name: String,
    /// The REST API's port.
    pub rest_port: u16,
    /// From spawning the JVM to the task running with its slot streaming.
    pub start_time: Duration,
}

fn properties(pairs: &[(&str, String)]) -> String {
    pairs.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

impl Connect {
    /// Starts Connect with the connector of `spec`; returns once its task runs and its slot
    /// streams, or panics with the end of Connect's log.
    pub fn start(spec: &ConnectorSpec<'_>) -> Connect {
        let home = installed().unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::Builder::new()
            .prefix("walbox-connect.")
            .tempdir()
            .expect("Connect's directory");
        let root = dir.path();
        let rest_port = free_port();
        let name = format!("dbz_{}", spec.db.name);
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
        let (host, port) = ("127.0.0.1", super::cluster().port());
        let mut connector = vec![
            ("name", name.clone()),
            (
                "connector.class",
                "io.debezium.connector.postgresql.PostgresConnector".into(),
            ),
            ("tasks.max", "1".into()),
            ("database.hostname", host.into()),
            ("database.port", port.to_string()),
            ("database.user", walbox::sandbox::postgres::SUPERUSER.into()),
            ("database.password", super::cluster().password().into()),
            ("database.dbname", spec.db.name.clone()),
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
        fs::write(root.join("worker.properties"), worker).expect("worker.properties");
        fs::write(root.join("connector.properties"), properties(&connector))
            .expect("connector.properties");
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
        .expect("log4j2.properties");
        let out = fs::File::create(root.join("stdout")).expect("Connect's output file");
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
            .stdout(out.try_clone().expect("dup"))
            .stderr(out)
            .spawn()
            .expect("start java (ConnectStandalone)");
        let mut connect = Connect {
            child,
            dir,
            name,
            rest_port,
            start_time: Duration::ZERO,
        };
        eprintln!("Kafka Connect log: {}", connect.log_path().display());
        let deadline = started + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = connect.child.try_wait() {
                panic!(
                    "Kafka Connect exited with {status}; log:\n{}",
                    connect.log_tail()
                );
            }
            let state = connect.task_state();
            if state.as_deref() == Some("FAILED") {
                panic!("the Debezium task failed; log:\n{}", connect.log_tail());
            }
            if state.as_deref() == Some("RUNNING") && spec.db.streaming(spec.slot) {
                break;
            }
            if Instant::now() >= deadline {
                panic!(
                    "the Debezium task did not run with its slot streaming within {START_TIMEOUT:?} \
                     (task {state:?}); log:\n{}",
                    connect.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        connect.start_time = started.elapsed();
        connect
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
}

/// Runs `walbox from-debezium` on `connect`'s connector configuration and writes the
/// walbox.toml it prints, and the database password it leaves to a file, into `dir`. Returns
/// the variables that point walbox at both (`WALBOX_CONFIG`, `WALBOX_POSTGRES_PASSWORD_FILE`).
/// Panics when the command fails (a setting it cannot honour included) or when the password
/// appears in its output.
pub fn walbox_config(connect: &Connect, dir: &std::path::Path) -> Vec<(String, String)> {
    let connector = connect.connector_config();
    let out = super::walbox_output(
        &["from-debezium", connector.to_str().expect("a UTF-8 path")],
        &[],
    );
    let (toml, notes) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "walbox from-debezium: {:?}\n{notes}",
        out.status
    );
    let password = super::cluster().password();
    assert!(
        !toml.contains(password) && !notes.contains(password),
        "walbox from-debezium copied the password:\n{toml}\n{notes}"
    );
    let config = dir.join("walbox.toml");
    let password_file = dir.join("postgres-password");
    fs::write(&config, &toml).expect("write walbox.toml");
    fs::write(&password_file, format!("{password}\n")).expect("write the password file");
    vec![
        ("WALBOX_CONFIG".into(), config.display().to_string()),
        (
            "WALBOX_POSTGRES_PASSWORD_FILE".into(),
            password_file.display().to_string(),
        ),
    ]
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
