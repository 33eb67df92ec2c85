//! What the throwaway message brokers ([`redis`](super::redis), [`nats`](super::nats),
//! [`rabbitmq`](super::rabbitmq)) have in common: a server process run from an installed
//! program, in a private directory, on a port of its own, until it is dropped.
//!
//! Invariants:
//! - A [`Daemon`] owns one private directory under the system's temporary directory: the
//!   server's configuration, data and log (`server.log`, its stdout and stderr). Dropping the
//!   [`Daemon`] kills the server's process group and removes the directory; with a watchdog
//!   ([`Daemon::spawn_watchdog`]) the same happens once this process is gone, for servers kept
//!   in a `static`.
//! - The server runs in a process group of its own (Ctrl-C on the terminal goes to the tests,
//!   which stop it); [`Daemon::stop`] and [`Daemon::kill`] signal the whole group, so a wrapper
//!   script and the program it started go together.
//! - [`Daemon::start_again`] runs the same command again: same directory, same port, same data.
//!   The log is appended to, never truncated.
//! - Readiness is a probe polled with a deadline ([`Daemon::wait_ready`]), never a blind sleep;
//!   a server that exits or does not answer in time is an error quoting the end of its log.

use std::fs;
use std::io;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// The watchdog blocks reading stdin, a pipe whose write end only this process holds, so EOF
/// means we are gone; then it kills the server's process group (the one in `server.pid`, which
/// a restart rewrites), runs the directory's `cleanup` script when there is one, and removes
/// the directory. (`env kill`: dash's builtin takes no `--`, which a negative pid needs.)
const WATCHDOG_SCRIPT: &str = "trap '' HUP INT\nread -r _ || true\n\
    [ -f \"$1/server.pid\" ] && env kill -KILL -- \"-$(cat \"$1/server.pid\")\" 2>/dev/null\n\
    [ -f \"$1/cleanup\" ] && sh \"$1/cleanup\" >/dev/null 2>&1\nrm -rf \"$1\"";

/// How long [`Daemon::stop`] waits for the server to exit on SIGTERM before it SIGKILLs it.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors of the broker sandboxes; every message is one line and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The server's program is not installed: the program, and the Debian package that has it.
    #[error(
        "{0} not found; install it with: apt-get install -y {1} (or bash scripts/install-deps.sh)"
    )]
    NotInstalled(String, String),
    /// A file-system or process-spawning operation (described) failed.
    #[error("{0}: {1}; check that /tmp is writable and not full")]
    Io(String, io::Error),
    /// The server exited or did not answer in time: which server, why, the end of its log and
    /// the log's path.
    #[error("{0} did not start ({1}); its log ends: {2} (log: {log})", log = .3.display())]
    Start(String, String, String, PathBuf),
    /// A program run against the server (described) failed: its status and output.
    #[error("`{0}` failed ({1}): {2}")]
    Command(String, String, String),
}

impl crate::failure::Classify for DaemonError {
    /// The broker sandboxes serve the tests: a broker that cannot be set up ends them with the
    /// internal-error status (1); the message says what to install or fix.
    fn failure(&self) -> Option<crate::failure::Failure> {
        Some(crate::failure::Failure::Internal)
    }
}

pub(super) type Result<T, E = DaemonError> = std::result::Result<T, E>;

pub(super) fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> DaemonError {
    let what = what.into();
    move |e| DaemonError::Io(what, e)
}

/// `program` from `PATH`, else from one of `dirs` (Debian puts some servers in `/usr/sbin`,
/// which is not on every user's `PATH`); `package` names the Debian package in the error.
pub(super) fn find_program(program: &str, dirs: &[&str], package: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(dirs.iter().map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| DaemonError::NotInstalled(program.to_owned(), package.to_owned()))
}

/// A currently free TCP port on 127.0.0.1 (racy by nature: a server that cannot bind it fails
/// to start, and says so in its log).
pub(super) fn free_port() -> Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(io_err("finding a free TCP port on 127.0.0.1"))
}

/// The TLS files of a server in a [`Daemon`]'s directory: a fresh CA (`ca.crt`), and the
/// server's certificate (`server.crt`, for `localhost` and `127.0.0.1`, signed by that CA) and
/// its PKCS#8 key (`server.key`), all PEM.
#[derive(Debug, Clone)]
pub(super) struct TlsFiles {
    pub(super) ca: PathBuf,
    pub(super) cert: PathBuf,
    pub(super) key: PathBuf,
}

/// Issues a CA named after `daemon`'s server and a server certificate it signs (see
/// [`super::tls::issue_cert`]), written to `daemon`'s directory.
pub(super) fn issue_tls_files(daemon: &Daemon) -> Result<TlsFiles> {
    use super::tls::issue_cert;
    let failed = |e: openssl::error::ErrorStack| {
        DaemonError::Command(
            "issue TLS certificates".into(),
            "openssl".into(),
            e.to_string(),
        )
    };
    let (ca, ca_key) =
        issue_cert(&format!("walbox test {} CA", daemon.name), None).map_err(failed)?;
    let (cert, key) = issue_cert("localhost", Some((&ca, &ca_key))).map_err(failed)?;
    Ok(TlsFiles {
        ca: daemon.write("ca.crt", &ca.to_pem().map_err(failed)?)?,
        cert: daemon.write("server.crt", &cert.to_pem().map_err(failed)?)?,
        key: daemon.write(
            "server.key",
            &key.private_key_to_pem_pkcs8().map_err(failed)?,
        )?,
    })
}

/// A server process and its private directory; see the [module docs](self).
#[derive(Debug)]
pub(super) struct Daemon {
    /// What the errors call the server ("Redis", …).
    name: &'static str,
    dir: Option<TempDir>,
    root: PathBuf,
    log: PathBuf,
    /// The program and its arguments and environment; run again by `start_again`.
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
    watchdog: Option<Child>,
}

impl Daemon {
    /// A server that is not running yet: a fresh private directory named after `prefix`.
    pub(super) fn new(name: &'static str, prefix: &str, program: PathBuf) -> Result<Daemon> {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .map_err(io_err(format!("creating the {name} directory")))?;
        let root = dir.path().to_owned();
        Ok(Daemon {
            name,
            log: root.join("server.log"),
            root,
            dir: Some(dir),
            program,
            args: Vec::new(),
            env: Vec::new(),
            child: None,
            watchdog: None,
        })
    }

    /// The private directory.
    pub(super) fn root(&self) -> &Path {
        &self.root
    }

    /// The server's log: its stdout and stderr, appended to across restarts.
    pub(super) fn log_path(&self) -> &Path {
        &self.log
    }

    /// Sets the arguments and environment [`Daemon::start_again`] runs the program with.
    pub(super) fn set_command(&mut self, args: Vec<String>, env: Vec<(String, String)>) {
        self.args = args;
        self.env = env;
    }

    /// Writes `contents` to `name` in the private directory; returns its path.
    pub(super) fn write(&self, name: &str, contents: &[u8]) -> Result<PathBuf> {
        let path = self.root.join(name);
        fs::write(&path, contents).map_err(io_err(format!("writing {}", path.display())))?;
        Ok(path)
    }

    /// Runs the program (once any earlier run has been killed), its output appended to the
    /// log, in a process group of its own; returns at once.
    pub(super) fn spawn(&mut self) -> Result<()> {
        self.kill();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(io_err(format!("opening {}", self.log.display())))?;
        let err = log.try_clone().map_err(io_err("duplicating the log"))?;
        let child = Command::new(&self.program)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("LC_ALL", "C.UTF-8")
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(io_err(format!("starting {}", self.program.display())))?;
        self.write("server.pid", child.id().to_string().as_bytes())?;
        self.child = Some(child);
        Ok(())
    }

    /// Polls `probe` until it says the server is ready, for at most `timeout`; fails when the
    /// server exits first or the time is up, quoting the end of the log.
    pub(super) fn wait_ready(
        &mut self,
        timeout: Duration,
        mut probe: impl FnMut() -> bool,
    ) -> Result<Duration> {
        let started = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(self.start_error(format!("exited with {status}")));
                }
            } else {
                return Err(self.start_error("not running".to_owned()));
            }
            if probe() {
                return Ok(started.elapsed());
            }
            if started.elapsed() >= timeout {
                return Err(self.start_error(format!("no answer within {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A [`DaemonError::Start`] saying `why`, with the last lines of the log.
    pub(super) fn start_error(&self, why: String) -> DaemonError {
        DaemonError::Start(
            self.name.to_owned(),
            why,
            self.log_tail(10),
            self.log.clone(),
        )
    }

    /// The last `lines` non-empty lines of the log, on one line (` | ` between them).
    pub(super) fn log_tail(&self, lines: usize) -> String {
        let text = fs::read(&self.log).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        match all[all.len().saturating_sub(lines)..].join(" | ") {
            tail if tail.is_empty() => "nothing was logged".to_owned(),
            tail => tail,
        }
    }

    /// Stops the server the orderly way: SIGTERM to its process group, then waits for it to
    /// exit (SIGKILL after [`STOP_TIMEOUT`]). Its data stays for [`Daemon::start_again`].
    pub(super) fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if matches!(child.try_wait(), Ok(None)) {
            signal_group(child.id(), "TERM");
            let deadline = Instant::now() + STOP_TIMEOUT;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        signal_group(child.id(), "KILL");
        let _ = child.wait();
        wait_group_gone(child.id());
        Ok(())
    }

    /// Kills the server's process group the way a crash does (SIGKILL): no shutdown, only what
    /// the server had written survives. A no-op when it is not running.
    pub(super) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal_group(child.id(), "KILL");
            let _ = child.wait();
            wait_group_gone(child.id());
        }
    }

    /// Spawns the detached watchdog (see [`WATCHDOG_SCRIPT`]); its stdin's write end stays in
    /// `self` until the [`Daemon`] is dropped or this process exits.
    pub(super) fn spawn_watchdog(&mut self) -> Result<()> {
        let child = Command::new("/bin/sh")
            .args(["-c", WATCHDOG_SCRIPT, "walbox-broker-watchdog"])
            .arg(&self.root)
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
}

/// A server on 127.0.0.1 run by a [`Daemon`]: its port, and the probe that says it answers.
/// The rigs (`redis.rs`, `nats.rs`, `rabbitmq.rs`) wrap one and dereference to it.
#[derive(Debug)]
pub struct Server {
    daemon: Daemon,
    port: u16,
    ready: fn(u16) -> bool,
    start_timeout: Duration,
}

impl Server {
    /// Spawns `daemon` and returns once `ready(port)` says it answers, within `start_timeout`.
    pub(super) fn start(
        daemon: Daemon,
        port: u16,
        ready: fn(u16) -> bool,
        start_timeout: Duration,
    ) -> Result<Server> {
        let mut server = Server {
            daemon,
            port,
            ready,
            start_timeout,
        };
        server.start_again()?;
        Ok(server)
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its directory.
    pub(super) fn root(&self) -> &Path {
        self.daemon.root()
    }

    /// The server's log (its stdout and stderr, across restarts).
    pub fn log_path(&self) -> &Path {
        self.daemon.log_path()
    }

    /// The last lines of the log, on one line.
    pub fn log_tail(&self) -> String {
        self.daemon.log_tail(20)
    }

    /// Stops the server the orderly way (SIGTERM to its process group).
    pub fn stop(&mut self) -> Result<()> {
        self.daemon.stop()
    }

    /// Kills the server (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        self.daemon.kill();
    }

    /// Starts the stopped (or killed) server again on its directory and port; returns once it
    /// answers.
    pub fn start_again(&mut self) -> Result<()> {
        self.daemon.spawn()?;
        let (port, ready) = (self.port, self.ready);
        self.daemon
            .wait_ready(self.start_timeout, || ready(port))
            .map(drop)
    }

    /// [`Server::stop`] then [`Server::start_again`].
    pub fn restart(&mut self) -> Result<()> {
        self.stop()?;
        self.start_again()
    }
}

/// Sends `signal` to the process group `pgid` (the server runs in a group of its own whose id
/// is its pid). `kill(1)` rather than `libc`: no new dependency for the sandbox.
fn signal_group(pgid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([format!("-{signal}"), "--".to_owned(), format!("-{pgid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Waits (for at most [`STOP_TIMEOUT`]) until no process of group `pgid` is left: the reaped
/// child may be a wrapper script whose server, killed with it, is still exiting and holding
/// its ports.
fn wait_group_gone(pgid: u32) {
    let deadline = Instant::now() + STOP_TIMEOUT;
    while Instant::now() < deadline {
        let alive = Command::new("kill")
            .args(["-0", "--", &format!("-{pgid}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !alive {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Daemon {
    /// Kills the server's process group, runs the `cleanup` script if any, removes the
    /// directory, then ends the watchdog.
    fn drop(&mut self) {
        self.kill();
        let cleanup = self.root.join("cleanup");
        if cleanup.is_file() {
            let _ = Command::new("/bin/sh")
                .arg(&cleanup)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        if let Some(dir) = self.dir.take() {
            let _ = dir.close();
        }
        if let Some(mut watchdog) = self.watchdog.take() {
            drop(watchdog.stdin.take());
            let _ = watchdog.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell(script: &str) -> Daemon {
        let mut daemon = Daemon::new("Test", "walbox-daemon-test.", "/bin/sh".into()).unwrap();
        daemon.set_command(vec!["-c".into(), script.into()], Vec::new());
        daemon.spawn().unwrap();
        daemon
    }

    #[test]
    fn a_server_that_exits_is_reported_with_the_end_of_its_log() {
        let mut daemon = shell("echo first; echo 'bind: address in use' >&2; exit 3");
        let error = daemon
            .wait_ready(Duration::from_secs(30), || false)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("Test did not start (exited with"),
            "{error}"
        );
        assert!(error.contains("first | bind: address in use"), "{error}");
    }

    #[test]
    fn a_server_that_does_not_answer_in_time_is_reported() {
        let mut daemon = shell("echo listening; exec sleep 60");
        let error = daemon
            .wait_ready(Duration::from_millis(200), || false)
            .unwrap_err()
            .to_string();
        assert!(error.contains("no answer within 200ms"), "{error}");
        assert!(error.contains("its log ends: listening"), "{error}");
    }

    #[test]
    fn dropping_kills_the_whole_process_group_and_removes_the_directory() {
        let daemon = shell("sleep 60 & echo $! > child.pid; wait");
        let root = daemon.root().to_owned();
        let pid_file = root.join("child.pid");
        let started = Instant::now();
        while !pid_file.is_file() && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let child = fs::read_to_string(&pid_file).unwrap().trim().to_owned();
        drop(daemon);
        assert!(!root.exists(), "the directory is removed");
        let alive = Command::new("kill")
            .args(["-0", &child])
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(!alive.success(), "the server's own child {child} survived");
    }
}
