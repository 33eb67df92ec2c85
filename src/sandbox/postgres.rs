//! Throwaway PostgreSQL clusters for `walbox demo`, the integration tests and
//! the benchmarks.
//!
//! [`PgCluster::start`] runs `initdb` into a fresh private directory under
//! `/tmp`, configures the cluster for logical replication, starts it on a free
//! `127.0.0.1` port plus a private unix socket, and creates roles that
//! exercise every password authentication method ([`MD5_ROLE`],
//! [`PLAIN_ROLE`], [`NOPRIVS_ROLE`]; [`SUPERUSER`] uses SCRAM over TCP).
//!
//! Invariants:
//! - The server never runs as root. When the effective uid is 0, every
//!   PostgreSQL program runs as the `postgres` OS user, or else as a `walbox`
//!   system user created on demand, and the private directory belongs to it.
//! - One cluster per [`PgCluster`]: its own directory, data dir, socket dir
//!   and port; nothing is shared with other clusters or a system cluster.
//! - Cleanup: dropping a [`PgCluster`] stops the server (`-m immediate`) and
//!   deletes its directory. A cluster that is never dropped (kept in a
//!   `static`, or in a process killed by a signal) is cleaned up by the
//!   watchdog when [`PgClusterOptions::watchdog`] is set.
//!
//! The major is Debian's by default, or any installed one
//! ([`PgClusterOptions::major`]; where the programs come from is
//! `sandbox::programs`). The configuration written here is accepted by every
//! major from 13 to 18, and [`PgCluster::major`] says which one runs.
//!
//! The API is synchronous (`std::process`); from async code it is meant for
//! set-up and tear-down, where blocking for a second is acceptable.

use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::net::TcpListener;
use std::os::unix::fs::{chown, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use openssl::error::ErrorStack;
use tempfile::TempDir;

use super::programs;
pub use super::programs::version_cache;
use super::tls::issue_cert;

/// Superuser created by `initdb`: SCRAM over TCP, trust over the unix socket.
pub const SUPERUSER: &str = "walbox";
/// `(role, password)` of a `LOGIN REPLICATION` role that authenticates with `md5`.
pub const MD5_ROLE: (&str, &str) = ("walbox_md5", "walbox-md5-secret");
/// `(role, password)` of a `LOGIN REPLICATION` role that authenticates with
/// `password` (cleartext).
pub const PLAIN_ROLE: (&str, &str) = ("walbox_plain", "walbox-plain-secret");
/// `(role, password)` of a `LOGIN` role without `REPLICATION` (SCRAM).
pub const NOPRIVS_ROLE: (&str, &str) = ("walbox_noprivs", "walbox-noprivs-secret");

/// Attempts at finding a free port when parallel processes race for it.
const PORT_ATTEMPTS: usize = 10;
/// The watchdog blocks reading stdin, a pipe whose write end only this
/// process holds (std pipes are close-on-exec), so EOF means we are gone;
/// then it stops the server and removes the directory. This beats polling
/// `kill -0 <pid>`, which fails with EPERM from the unprivileged user when we
/// run as root, and cannot mistake a recycled pid for us.
const WATCHDOG_SCRIPT: &str = "trap '' HUP INT\nread -r _ || true\n\
    \"$1\" stop -D \"$2\" -m immediate >/dev/null 2>&1\nrm -rf \"$3\"";
/// Creates the `walbox` user under a lock: concurrent `useradd`s can all
/// "succeed" and leave the user with another process's uid.
const USERADD_SCRIPT: &str = "grep -q '^walbox:' /etc/passwd || \
    useradd --system --no-create-home --shell /usr/sbin/nologin walbox";

/// Errors of the sandbox; every message is one line and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// No directory with `initdb` and `pg_ctl` was found.
    #[error(
        "PostgreSQL server binaries not found; install them with: apt-get install -y postgresql"
    )]
    NotInstalled,
    /// The requested major version is neither Debian's nor in the version cache.
    #[error(
        "PostgreSQL {0} server binaries not found in /usr/lib/postgresql/{0}/bin or {1}/{0}/bin; install them with: bash scripts/install-deps.sh"
    )]
    MajorNotInstalled(u32, String),
    /// A file-system or process-spawning operation (described) failed.
    #[error("{0}: {1}; check that /tmp is writable and not full")]
    Io(String, io::Error),
    /// A PostgreSQL program failed: the program, its exit status and output.
    #[error("`{0}` failed ({1}): {2}")]
    Command(String, String, String),
    /// The server did not (re)start: the end of its log, and the log's path.
    #[error("PostgreSQL did not start: {0} (server log: {log})", log = .1.display())]
    Start(String, PathBuf),
    /// Running as root without an unprivileged OS user to run PostgreSQL as.
    #[error("running as root needs an unprivileged OS user for PostgreSQL ({0}); create one with: useradd --system --no-create-home --shell /usr/sbin/nologin walbox")]
    OsUser(String),
    /// Generating the TLS certificates failed.
    #[error("generating the sandbox TLS certificates failed: {0}; check the OpenSSL installation")]
    Tls(String),
    /// `psql` reported an error: the database and psql's stderr.
    #[error("psql on database {0:?} failed: {1}")]
    Psql(String, String),
}

impl crate::failure::Classify for SandboxError {
    /// The sandbox serves `walbox demo` and the tests: a throwaway PostgreSQL that cannot be set up
    /// ends the demo with the internal-error status (1); the message says what to install or
    /// fix.
    fn failure(&self) -> Option<crate::failure::Failure> {
        Some(crate::failure::Failure::Internal)
    }
}

impl From<ErrorStack> for SandboxError {
    fn from(e: ErrorStack) -> Self {
        SandboxError::Tls(one_line(&e.to_string()))
    }
}

pub(super) type Result<T, E = SandboxError> = std::result::Result<T, E>;

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> SandboxError {
    let what = what.into();
    move |error| SandboxError::Io(what, error)
}

/// How to set up a [`PgCluster`]; `Default` gives the stock configuration.
#[derive(Debug, Clone, Default)]
pub struct PgClusterOptions {
    /// WAL segment size in MiB (`initdb --wal-segsize`, a power of two);
    /// `None` keeps PostgreSQL's default (16).
    pub wal_segsize_mb: Option<u32>,
    /// Extra `postgresql.conf` settings, applied after (so overriding) the
    /// sandbox's. Values are quoted here: pass them bare, e.g.
    /// `("wal_sender_timeout", "5s")`.
    pub settings: Vec<(String, String)>,
    /// Serve TLS with a certificate for `localhost` and `127.0.0.1` signed by
    /// a fresh CA, see [`PgCluster::ca_cert`].
    pub ssl: bool,
    /// Also spawn a detached watchdog that stops the server and deletes its
    /// directory once this process is gone. Set it for clusters that are
    /// never dropped, e.g. kept in a `static`.
    pub watchdog: bool,
    /// The PostgreSQL major version to run (`13`…`18`): Debian's
    /// `/usr/lib/postgresql/<major>/bin`, else the version cache (see
    /// [`version_cache`]). `None`: the newest installed by Debian.
    pub major: Option<u32>,
}

/// An unprivileged OS user to run PostgreSQL as.
#[derive(Debug, Clone, Copy)]
struct OsUser {
    uid: u32,
    gid: u32,
}

/// A running throwaway PostgreSQL cluster; see the [module docs](self).
#[derive(Debug)]
pub struct PgCluster {
    tmp: Option<TempDir>,
    root: PathBuf,
    data_dir: PathBuf,
    socket_dir: PathBuf,
    log_file: PathBuf,
    bin_dir: PathBuf,
    ca_cert: Option<PathBuf>,
    port: u16,
    password: String,
    run_as: Option<OsUser>,
    watchdog: Option<Child>,
    pub(super) major: u32,
}

impl PgCluster {
    /// Creates, configures and starts a new cluster, and creates the roles
    /// [`MD5_ROLE`], [`PLAIN_ROLE`] and [`NOPRIVS_ROLE`].
    pub fn start(opts: PgClusterOptions) -> Result<PgCluster> {
        let bin_dir = match opts.major {
            Some(major) => bin_dir_for_major(major)?,
            None => programs::debian_server_dir().ok_or(SandboxError::NotInstalled)?,
        };
        let mut cluster = PgCluster::empty(bin_dir, None, opts.watchdog)?;
        // From here on, an early return drops `cluster`, which cleans up.
        cluster.initdb(&opts)?;
        cluster.configure(&opts)?;
        cluster.start_on_free_port()?;
        let ((md5, md5_pw), (plain, plain_pw)) = (MD5_ROLE, PLAIN_ROLE);
        let (noprivs, noprivs_pw) = NOPRIVS_ROLE;
        let version = cluster.psql(
            "postgres",
            &format!(
                "SET password_encryption = 'md5';\n\
                 CREATE ROLE {md5} LOGIN REPLICATION PASSWORD '{md5_pw}';\n\
                 RESET password_encryption;\n\
                 CREATE ROLE {plain} LOGIN REPLICATION PASSWORD '{plain_pw}';\n\
                 CREATE ROLE {noprivs} LOGIN PASSWORD '{noprivs_pw}';\n\
                 SHOW server_version_num;\n"
            ),
        )?;
        cluster.major = version.trim().parse::<u32>().map_or(0, |num| num / 10_000);
        Ok(cluster)
    }

    /// The server's major version (`server_version_num / 10000`, e.g. 15).
    pub fn major(&self) -> u32 {
        self.major
    }

    /// A cluster that is not there yet: a fresh private directory (owned by the user that
    /// will run PostgreSQL) with its socket directory, and the programs of `bin_dir`.
    /// `password` is [`SUPERUSER`]'s (random when `None`). Dropping it removes the directory.
    pub(super) fn empty(
        bin_dir: PathBuf,
        password: Option<String>,
        watchdog: bool,
    ) -> Result<PgCluster> {
        let tmp = tempfile::Builder::new()
            .prefix("walbox-pg-")
            .tempdir_in("/tmp")
            .map_err(io_err("creating a directory in /tmp"))?;
        let root = tmp.path().to_path_buf();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o700))
            .map_err(io_err(format!("chmod {}", root.display())))?;
        // A new directory belongs to its creator: our effective uid.
        let meta = fs::metadata(&root).map_err(io_err(format!("stat {}", root.display())))?;
        let run_as = if meta.uid() == 0 {
            Some(unprivileged_user()?)
        } else {
            None
        };
        let password = match password {
            Some(p) => p,
            None => random_password()?,
        };
        let mut cluster = PgCluster {
            data_dir: root.join("data"),
            socket_dir: root.join("s"),
            log_file: root.join("postgres.log"),
            root,
            tmp: Some(tmp),
            bin_dir,
            ca_cert: None,
            port: 0,
            password,
            run_as,
            watchdog: None,
            major: 0,
        };
        cluster.chown(&cluster.root)?;
        fs::create_dir(&cluster.socket_dir).map_err(io_err("creating the socket directory"))?;
        cluster.chown(&cluster.socket_dir)?;
        if watchdog {
            cluster.spawn_watchdog()?;
        }
        Ok(cluster)
    }

    /// The TCP port the server listens on at `127.0.0.1`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding the server's unix socket (`.s.PGSQL.<port>`).
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// The cluster's data directory (`PGDATA`).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The directory of the PostgreSQL programs in use, e.g. `pg_recvlogical`.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The server log (`pg_ctl -l`), deleted with the cluster.
    pub fn log_file(&self) -> &Path {
        &self.log_file
    }

    /// The random password of [`SUPERUSER`].
    pub fn password(&self) -> &str {
        &self.password
    }

    /// With [`PgClusterOptions::ssl`], the root certificate (PEM) that signed
    /// the server certificate.
    pub fn ca_cert(&self) -> Option<&Path> {
        self.ca_cert.as_deref()
    }

    /// TCP URL of [`SUPERUSER`] (SCRAM):
    /// `postgres://walbox:<pw>@127.0.0.1:<port>/<db>?sslmode=disable`.
    pub fn url(&self, dbname: &str) -> String {
        self.role_url(SUPERUSER, &self.password, dbname)
    }

    /// TCP URL of any role:
    /// `postgres://<role>:<pw>@127.0.0.1:<port>/<db>?sslmode=disable`.
    pub fn role_url(&self, role: &str, password: &str, dbname: &str) -> String {
        let (role, password, db) = (pct(role), pct(password), pct(dbname));
        format!(
            "postgres://{role}:{password}@127.0.0.1:{}/{db}?sslmode=disable",
            self.port
        )
    }

    /// Unix-socket URL of [`SUPERUSER`] (trust) with the percent-encoded
    /// socket directory as host, a form libpq and tokio-postgres both accept:
    /// `postgres://walbox@%2Ftmp%2Fwalbox-pg-XXXXXX%2Fs:<port>/<db>`.
    pub fn socket_url(&self, dbname: &str) -> String {
        let host = pct(&self.socket_dir.to_string_lossy());
        format!(
            "postgres://{SUPERUSER}@{host}:{}/{}",
            self.port,
            pct(dbname)
        )
    }

    /// Runs `sql` (one or more statements, as a script) with
    /// `psql -X -q -At -v ON_ERROR_STOP=1` as [`SUPERUSER`] over the unix
    /// socket and returns its stdout (unaligned, tuples only).
    pub fn psql(&self, dbname: &str, sql: &str) -> Result<String> {
        let mut cmd = self.command("psql");
        cmd.args("-X -q -At -v ON_ERROR_STOP=1 -f - -U walbox -h".split(' '))
            .arg(&self.socket_dir)
            .args(["-p", &self.port.to_string(), "-d", dbname])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(io_err("spawning psql"))?;
        // Feed stdin from a thread so that a large result cannot deadlock us.
        let writer = child.stdin.take().map(|mut stdin| {
            let sql = sql.to_owned();
            std::thread::spawn(move || stdin.write_all(sql.as_bytes()))
        });
        let out = child.wait_with_output().map_err(io_err("running psql"))?;
        if let Some(writer) = writer {
            let _ = writer.join();
        }
        if !out.status.success() {
            let stderr = one_line(&String::from_utf8_lossy(&out.stderr));
            return Err(SandboxError::Psql(dbname.to_owned(), stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Creates database `name`, owned by [`SUPERUSER`].
    pub fn create_database(&self, name: &str) -> Result<()> {
        let sql = format!("CREATE DATABASE \"{}\";", name.replace('"', "\"\""));
        self.psql("postgres", &sql).map(drop)
    }

    /// Stops the server (`pg_ctl stop -m fast`); the cluster is kept and
    /// [`start_again`](Self::start_again) brings it back.
    pub fn stop(&self) -> Result<()> {
        self.pg_ctl("stop -m fast -w -t 60").map(drop)
    }

    /// Stops the server the way a crash does (`pg_ctl stop -m immediate`: every backend killed,
    /// no shutdown checkpoint); [`start_again`](Self::start_again) then recovers from WAL.
    pub fn crash(&self) -> Result<()> {
        self.pg_ctl("stop -m immediate -w -t 60").map(drop)
    }

    /// Starts the stopped server again (`pg_ctl start -w`), same port and directories.
    pub fn start_again(&self) -> Result<()> {
        let offset = self.log_len();
        self.pg_ctl("start -w -t 60")
            .map_err(|_| self.start_error(offset))
            .map(drop)
    }

    /// Restarts the server (`pg_ctl restart -m fast -w`), e.g. to apply
    /// settings that need a restart.
    pub fn restart(&self) -> Result<()> {
        let offset = self.log_len();
        let restart = self.pg_ctl("restart -m fast -w -t 60");
        restart.map_err(|_| self.start_error(offset)).map(drop)
    }

    /// A command for PostgreSQL program `prog` (a client program from
    /// Debian's installation when the server's directory lacks it), run in
    /// the cluster directory.
    pub(super) fn command(&self, prog: &str) -> Command {
        let dir = programs::client_dir(&self.bin_dir, prog);
        let mut cmd = self.base_command(dir.join(prog));
        cmd.current_dir(&self.root);
        cmd
    }

    /// A command run as the unprivileged user (if any), without `PG*`
    /// variables, with `HOME` in the cluster directory and C messages.
    pub(super) fn base_command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(program);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("PG") {
                cmd.env_remove(key);
            }
        }
        cmd.env("HOME", &self.root)
            .env("LC_ALL", "C")
            .stdin(Stdio::null());
        if let Some(user) = self.run_as {
            cmd.uid(user.uid).gid(user.gid);
        }
        cmd
    }

    /// Runs `pg_ctl <args> -D <data> -l <log>` and checks its exit status.
    pub(super) fn pg_ctl(&self, args: &str) -> Result<Output> {
        let mut cmd = self.command("pg_ctl");
        cmd.args(args.split(' '))
            .arg("-D")
            .arg(&self.data_dir)
            .arg("-l")
            .arg(&self.log_file);
        run(cmd, &format!("pg_ctl {args}"))
    }

    fn initdb(&self, opts: &PgClusterOptions) -> Result<()> {
        let pwfile = self.root.join("pwfile");
        self.write_owned(&pwfile, self.password.as_bytes(), 0o600)?;
        let mut cmd = self.command("initdb");
        cmd.arg("-D")
            .arg(&self.data_dir)
            .arg(format!("--pwfile={}", pwfile.display()));
        cmd.args("-U walbox --auth-local=trust --auth-host=scram-sha-256".split(' '))
            .args("-E UTF8 --locale=C --no-sync".split(' '));
        if let Some(mb) = opts.wal_segsize_mb {
            cmd.arg(format!("--wal-segsize={mb}"));
        }
        let result = run(cmd, "initdb");
        let _ = fs::remove_file(&pwfile);
        result.map(drop)
    }

    /// Appends the sandbox settings to `postgresql.conf` and replaces `pg_hba.conf`.
    fn configure(&mut self, opts: &PgClusterOptions) -> Result<()> {
        let mut conf = format!(
            "\n# walbox sandbox\nlisten_addresses = '127.0.0.1'\ninclude 'walbox_port.conf'\n\
             unix_socket_directories = {}\nwal_level = logical\nmax_replication_slots = 256\n\
             max_wal_senders = 128\nmax_connections = 200\nfsync = off\nshared_buffers = 128MB\n\
             logging_collector = off\nlog_min_messages = warning\n",
            conf_quote(&self.socket_dir.to_string_lossy())
        );
        if opts.ssl {
            let (ca_cert, ca_key) = issue_cert("walbox sandbox CA", None)?;
            let (cert, key) = issue_cert("localhost", Some((&ca_cert, &ca_key)))?;
            let (ca_path, cert_path) = (self.root.join("ca.crt"), self.data_dir.join("server.crt"));
            let key_path = self.data_dir.join("server.key");
            self.write_owned(&ca_path, &ca_cert.to_pem()?, 0o644)?;
            self.write_owned(&cert_path, &cert.to_pem()?, 0o644)?;
            self.write_owned(&key_path, &key.private_key_to_pem_pkcs8()?, 0o600)?;
            let (cert_path, key_path) = (cert_path.to_string_lossy(), key_path.to_string_lossy());
            conf += &format!("ssl = on\nssl_cert_file = {}\n", conf_quote(&cert_path));
            conf += &format!("ssl_key_file = {}\n", conf_quote(&key_path));
            self.ca_cert = Some(ca_path);
        }
        for (key, value) in &opts.settings {
            conf += &format!("{key} = {}\n", conf_quote(value));
        }
        let path = self.data_dir.join("postgresql.conf");
        OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(conf.as_bytes()))
            .map_err(io_err(format!("appending to {}", path.display())))?;
        let mut hba = String::from("local all all trust\nlocal replication all trust\n");
        for (role, method) in [
            (MD5_ROLE.0, "md5"),
            (PLAIN_ROLE.0, "password"),
            ("all", "scram-sha-256"),
        ] {
            for db in ["all", "replication"] {
                hba += &format!("host {db} {role} 127.0.0.1/32 {method}\n");
            }
        }
        self.write_owned(&self.data_dir.join("pg_hba.conf"), hba.as_bytes(), 0o600)
    }

    /// Starts the server, moving to another port when a parallel process
    /// grabbed the one we picked.
    pub(super) fn start_on_free_port(&mut self) -> Result<()> {
        for attempt in 1..=PORT_ATTEMPTS {
            self.port = free_port()?;
            let port_conf = self.data_dir.join("walbox_port.conf");
            self.write_owned(
                &port_conf,
                format!("port = {}\n", self.port).as_bytes(),
                0o600,
            )?;
            let offset = self.log_len();
            if self.pg_ctl("start -w -t 60").is_ok() {
                return Ok(());
            }
            if attempt == PORT_ATTEMPTS || !self.log_since(offset).contains("could not bind") {
                return Err(self.start_error(offset));
            }
        }
        unreachable!("the last attempt returns")
    }

    pub(super) fn log_len(&self) -> u64 {
        fs::metadata(&self.log_file).map_or(0, |m| m.len())
    }

    pub(super) fn log_since(&self, offset: u64) -> String {
        let log = fs::read(&self.log_file).unwrap_or_default();
        let start = usize::try_from(offset).unwrap_or(0).min(log.len());
        String::from_utf8_lossy(&log[start..]).into_owned()
    }

    /// A [`SandboxError::Start`] with the last lines logged since `offset`.
    fn start_error(&self, offset: u64) -> SandboxError {
        let log = self.log_since(offset);
        let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = match lines[lines.len().saturating_sub(5)..].join(" | ") {
            tail if tail.is_empty() => "nothing was logged".to_owned(),
            tail => tail,
        };
        SandboxError::Start(tail, self.log_file.clone())
    }

    /// Spawns the detached watchdog, see [`WATCHDOG_SCRIPT`]; the write end
    /// of its stdin stays in `self.watchdog` until we are dropped or exit.
    fn spawn_watchdog(&mut self) -> Result<()> {
        let mut sh = self.base_command("/bin/sh");
        sh.args(["-c", WATCHDOG_SCRIPT, "walbox-pg-watchdog"])
            .args([
                self.bin_dir.join("pg_ctl"),
                self.data_dir.clone(),
                self.root.clone(),
            ])
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0); // Ctrl-C on the terminal must not kill it
        self.watchdog = Some(
            sh.spawn()
                .map_err(io_err("spawning the watchdog (/bin/sh)"))?,
        );
        Ok(())
    }

    /// Writes `path` with `mode`, owned by the user running PostgreSQL.
    pub(super) fn write_owned(&self, path: &Path, contents: &[u8], mode: u32) -> Result<()> {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(path)
            .and_then(|mut f| f.write_all(contents))
            .and_then(|()| fs::set_permissions(path, fs::Permissions::from_mode(mode)))
            .map_err(io_err(format!("writing {}", path.display())))?;
        self.chown(path)
    }

    fn chown(&self, path: &Path) -> Result<()> {
        let Some(user) = self.run_as else {
            return Ok(());
        };
        chown(path, Some(user.uid), Some(user.gid))
            .map_err(io_err(format!("chown {}", path.display())))
    }
}

impl Drop for PgCluster {
    /// Stops the server (`-m immediate`), deletes the directory, then ends
    /// the watchdog, if any.
    fn drop(&mut self) {
        if self.data_dir.join("postmaster.pid").exists() {
            let _ = self.pg_ctl("stop -m immediate -w -t 60");
        }
        if let Some(tmp) = self.tmp.take() {
            let _ = tmp.close();
        }
        if let Some(mut watchdog) = self.watchdog.take() {
            drop(watchdog.stdin.take());
            let _ = watchdog.wait();
        }
    }
}

/// Runs `cmd`, capturing its output; a failure becomes [`SandboxError::Command`].
pub(super) fn run(mut cmd: Command, what: &str) -> Result<Output> {
    let out = cmd.output().map_err(io_err(format!("spawning {what}")))?;
    if out.status.success() {
        return Ok(out);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let text = if stderr.trim().is_empty() {
        String::from_utf8_lossy(&out.stdout)
    } else {
        stderr
    };
    Err(SandboxError::Command(
        what.to_owned(),
        out.status.to_string(),
        one_line(&text),
    ))
}

/// The `bin` directory of PostgreSQL `major`: Debian's package if installed,
/// else the version cache.
pub fn bin_dir_for_major(major: u32) -> Result<PathBuf> {
    programs::server_dir(major).ok_or_else(|| {
        SandboxError::MajorNotInstalled(major, version_cache().display().to_string())
    })
}

/// The OS user to run PostgreSQL as when we are root: `postgres` if it
/// exists, else `walbox`, created if needed. Safe against parallel threads
/// (a mutex) and processes (`flock` around check-and-create, and a retry).
fn unprivileged_user() -> Result<OsUser> {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(user) = lookup_user("postgres")? {
        return Ok(user);
    }
    let mut last_error = String::from("useradd did not create it");
    for attempt in 0..10 {
        if let Some(user) = lookup_user("walbox")? {
            return Ok(user);
        }
        let out = Command::new("flock")
            .args(["/tmp/.walbox-useradd.lock", "/bin/sh", "-c", USERADD_SCRIPT])
            .output();
        match out {
            Ok(out) if out.status.success() => {}
            Ok(out) => last_error = one_line(&String::from_utf8_lossy(&out.stderr)),
            Err(e) => last_error = format!("cannot run flock (util-linux): {e}"),
        }
        std::thread::sleep(Duration::from_millis(100 * attempt));
    }
    Err(SandboxError::OsUser(last_error))
}

/// Looks `name` up in `/etc/passwd`.
fn lookup_user(name: &str) -> Result<Option<OsUser>> {
    let passwd = fs::read_to_string("/etc/passwd").map_err(io_err("reading /etc/passwd"))?;
    Ok(passwd
        .lines()
        .find_map(|line| match line.split(':').collect::<Vec<_>>()[..] {
            [user, _, uid, gid, ..] if user == name => Some(OsUser {
                uid: uid.parse().ok()?,
                gid: gid.parse().ok()?,
            }),
            _ => None,
        }))
}

/// A currently free TCP port on 127.0.0.1 (racy by nature: callers retry).
fn free_port() -> Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(io_err("finding a free TCP port on 127.0.0.1"))
}

/// Quotes a `postgresql.conf` value.
fn conf_quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// Percent-encodes all but RFC 3986 unreserved characters.
fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Folds multi-line program output into one (bounded) line for error messages.
fn one_line(text: &str) -> String {
    let folded = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ");
    match folded.char_indices().nth(600) {
        Some((cut, _)) => format!("{}…", &folded[..cut]),
        None => folded,
    }
}

/// 24 random alphanumeric characters, from OpenSSL's generator.
fn random_password() -> Result<String> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut bytes = [0u8; 24];
    openssl::rand::rand_bytes(&mut bytes)?;
    Ok(bytes
        .iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect())
}

#[cfg(test)]
#[path = "postgres_tests.rs"]
mod tests;
