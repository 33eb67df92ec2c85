//! The two walbox processes of the soak: one active, one hot standby (leader election on
//! PostgreSQL's advisory lock, `postgres.on_slot_busy = "wait"`).
//!
//! Invariants:
//! - Member `i` always reaches PostgreSQL through its own proxy (`proxy(i)`), so one member can
//!   be partitioned from PostgreSQL while the other is not; both reach Kafka through the
//!   cluster's proxies.
//! - A member that exited on its own is started again at once by [`Members::reap`], and what it
//!   exited with is counted; one that a fault stopped stays down until
//!   [`Members::start_stopped`] (after the other one took over).
//! - Each member appends its output to its own log file, across restarts.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use walbox::sandbox::postgres::PgCluster;
use walbox::sandbox::proxy::Proxy;

use crate::SLOT;

/// How long a SIGTERMed member may take to drain and exit before it is SIGKILLed.
const TERM_TIMEOUT: Duration = Duration::from_secs(60);

/// One member slot: its process (if running), its PostgreSQL proxy and its log.
struct Member {
    child: Option<Child>,
    proxy: Proxy,
    log: PathBuf,
}

/// The two members.
pub struct Members {
    bin: PathBuf,
    /// The environment shared by both, without the PostgreSQL URL.
    env: Vec<(String, String)>,
    /// The PostgreSQL URL with `{port}` where the member's proxy port goes.
    url_template: String,
    members: Vec<Member>,
    /// Exits nobody asked for, by exit status.
    pub unexpected_exits: BTreeMap<String, u32>,
    /// Starts, first ones included.
    pub starts: u32,
}

/// Where `pg`'s `soak` database is reached through a proxy on `port`.
fn url_template(pg: &PgCluster) -> String {
    let url = pg.url("soak");
    let direct = format!("127.0.0.1:{}/", pg.port());
    format!(
        "{}&connect_timeout=5",
        url.replace(&direct, "127.0.0.1:{port}/")
    )
}

impl Members {
    /// Starts two members of `bin` for `pg`'s `soak` database and the Kafka cluster at
    /// `brokers` (its proxies).
    pub fn start(
        bin: &Path,
        pg: &PgCluster,
        brokers: &str,
        exactly_once: bool,
        logs: &Path,
    ) -> anyhow::Result<Members> {
        let env: Vec<(String, String)> = [
            ("WALBOX_POSTGRES_SLOT", SLOT),
            ("WALBOX_POSTGRES_PUBLICATION", SLOT),
            ("WALBOX_POSTGRES_ON_SLOT_BUSY", "wait"),
            ("WALBOX_KAFKA_BROKERS", brokers),
            (
                "WALBOX_KAFKA_EXACTLY_ONCE",
                if exactly_once { "true" } else { "false" },
            ),
            ("WALBOX_HTTP_LISTEN", "off"),
            ("WALBOX_RELAY_BACKOFF_INITIAL", "50ms"),
            ("WALBOX_RELAY_BACKOFF_MAX", "300ms"),
            ("WALBOX_LOG_LEVEL", "info,librdkafka=warn,rdkafka=warn"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let mut members = Vec::new();
        for name in ["a", "b"] {
            let addr = ([127, 0, 0, 1], pg.port()).into();
            members.push(Member {
                child: None,
                proxy: Proxy::start(addr).context("starting a PostgreSQL proxy")?,
                log: logs.join(format!("walbox-{name}.log")),
            });
        }
        let mut m = Members {
            bin: bin.to_owned(),
            env,
            url_template: url_template(pg),
            members,
            unexpected_exits: BTreeMap::new(),
            starts: 0,
        };
        m.spawn(0)?;
        m.spawn(1)?;
        Ok(m)
    }

    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let member = &mut self.members[i];
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&member.log)
            .with_context(|| format!("opening {}", member.log.display()))?;
        let url = self
            .url_template
            .replace("{port}", &member.proxy.port().to_string());
        let child = Command::new(&self.bin)
            .arg("run")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("WALBOX_POSTGRES_URL", url)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        member.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    /// The process ids of the running members, by member.
    pub fn pids(&self) -> Vec<Option<u32>> {
        self.members
            .iter()
            .map(|m| m.child.as_ref().map(Child::id))
            .collect()
    }

    /// The member holding the leader lock, per PostgreSQL (`None` when nobody holds it or
    /// PostgreSQL does not answer).
    pub fn active(&self, pg: &PgCluster) -> Option<usize> {
        let holder = pg
            .psql(
                "soak",
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
                 WHERE l.locktype = 'advisory' AND l.classid = 1463897154 AND l.granted",
            )
            .ok()?;
        let pid: u32 = holder.trim().rsplit(' ').next()?.parse().ok()?;
        self.pids().iter().position(|p| *p == Some(pid))
    }

    /// SIGKILLs member `i`; it stays down until [`Members::start_stopped`].
    pub fn sigkill(&mut self, i: usize) -> anyhow::Result<()> {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            child.wait()?;
        }
        Ok(())
    }

    /// SIGTERMs member `i` and waits for it to exit (SIGKILL after [`TERM_TIMEOUT`]); it stays
    /// down until [`Members::start_stopped`]. Returns whether it exited by itself, and its exit
    /// status.
    pub fn sigterm(&mut self, i: usize) -> anyhow::Result<(bool, String)> {
        match self.members[i].child.take() {
            Some(mut child) => terminate(&mut child),
            None => Ok((true, String::from("not running"))),
        }
    }

    /// Starts every member that a fault stopped.
    pub fn start_stopped(&mut self) -> anyhow::Result<()> {
        for i in 0..self.members.len() {
            if self.members[i].child.is_none() {
                self.spawn(i)?;
            }
        }
        Ok(())
    }

    /// Starts again every member that exited on its own; returns (member, exit status) for each.
    pub fn reap(&mut self) -> anyhow::Result<Vec<(usize, String)>> {
        let mut exited = Vec::new();
        for i in 0..self.members.len() {
            let status = match self.members[i].child.as_mut() {
                Some(child) => child.try_wait()?,
                None => None,
            };
            if let Some(status) = status {
                let status = status.to_string();
                *self.unexpected_exits.entry(status.clone()).or_default() += 1;
                exited.push((i, status));
                self.spawn(i)?;
            }
        }
        Ok(exited)
    }

    /// The PostgreSQL proxy of member `i`.
    pub fn proxy(&self, i: usize) -> &Proxy {
        &self.members[i].proxy
    }

    /// The resident set size of each running member, MiB.
    pub fn rss_mib(&self) -> Vec<f64> {
        self.pids()
            .into_iter()
            .flatten()
            .filter_map(rss_mib)
            .collect()
    }

    /// The last `lines` lines of member `i`'s log.
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.members[i].log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// SIGTERMs both members and waits for them (not started again).
    pub fn stop(&mut self) -> anyhow::Result<()> {
        for m in &mut self.members {
            if let Some(mut child) = m.child.take() {
                terminate(&mut child)?;
            }
        }
        Ok(())
    }
}

/// SIGTERM, then wait up to [`TERM_TIMEOUT`], then SIGKILL: (exited by itself, exit status).
fn terminate(child: &mut Child) -> anyhow::Result<(bool, String)> {
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .stderr(Stdio::null())
        .status()?;
    let deadline = Instant::now() + TERM_TIMEOUT;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            return Ok((true, status.to_string()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    Ok((false, child.wait()?.to_string()))
}

/// The resident set size of process `pid`, MiB.
pub fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}
