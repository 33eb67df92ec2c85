//! A throwaway RabbitMQ node (Debian's `rabbitmq-server`, 3.10) for the tests of the RabbitMQ
//! broker, with the `rabbitmq_consistent_hash_exchange` plugin enabled.
//!
//! The node is run by `/usr/lib/rabbitmq/bin/rabbitmq-server` directly, as the current user
//! (root included), never through systemd or Debian's `/usr/sbin` wrapper (which `su`s to the
//! `rabbitmq` user and its home). Everything it reads or writes is named by environment
//! variables pointing into its private directory: `RABBITMQ_CONFIG_FILE`,
//! `RABBITMQ_ENABLED_PLUGINS_FILE`, `RABBITMQ_MNESIA_BASE`, `RABBITMQ_LOG_BASE`, an empty
//! `RABBITMQ_CONF_ENV_FILE` (so `/etc/rabbitmq/rabbitmq-env.conf` is not read), and `HOME`
//! with a fresh Erlang cookie.
//!
//! Invariants:
//! - One node per [`RabbitMq`]: a unique node name (`walbox-<pid>-<port>@localhost`), its own
//!   AMQP port on 127.0.0.1, its own Erlang distribution port, and an `epmd` of its own on a
//!   private port (`ERL_EPMD_PORT`), so nothing is shared with a system RabbitMQ or another
//!   sandbox node. The `guest` user (password `guest`) can connect from 127.0.0.1.
//! - Cleanup: dropping it kills the node, stops its `epmd` and removes the directory; with
//!   [`RabbitMqOptions::watchdog`] the same happens once this process is gone.
//! - What survives [`RabbitMq::restart`] (and [`RabbitMq::kill`] then
//!   [`RabbitMq::start_again`]): the node's database (durable exchanges, queues and bindings,
//!   users) and the persistent messages of durable queues. Ports, node name and directory stay.
//! - [`RabbitMq::start`] returns once the AMQP port answers the protocol header with a
//!   `Connection.Start` frame; the node's log goes to its stdout, kept in
//!   [`RabbitMq::log_path`].
//! - With [`RabbitMqOptions::tls`], the node also listens with TLS (`listeners.ssl`) on
//!   127.0.0.1 and a port of its own ([`RabbitMq::tls_url`]), its certificate (for `localhost`
//!   and `127.0.0.1`) signed by a fresh CA ([`RabbitMq::ca_file`]); clients need no
//!   certificate (`verify_none`). The plain AMQP port stays, for the readiness probe and
//!   `rabbitmqctl`'s users.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::daemon::{
    find_program, free_port, io_err, issue_tls_files, Daemon, DaemonError, Result, Server,
};

/// How long the node may take to answer on its AMQP port.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Where Debian keeps RabbitMQ's own scripts (`/usr/sbin` has only wrappers that change user).
const RABBITMQ_BIN: &str = "/usr/lib/rabbitmq/bin";

/// The plugins every sandbox node runs.
pub const PLUGINS: &[&str] = &["rabbitmq_consistent_hash_exchange"];

/// How to start a [`RabbitMq`].
#[derive(Debug, Clone, Default)]
pub struct RabbitMqOptions {
    /// Also spawn a detached watchdog that kills the node and its `epmd` and removes its
    /// directory once this process is gone. Set it for nodes that are never dropped, e.g. kept
    /// in a `static`.
    pub watchdog: bool,
    /// Also listen with TLS (see the module docs).
    pub tls: bool,
}

/// A running throwaway RabbitMQ node; see the [module docs](self).
#[derive(Debug)]
pub struct RabbitMq {
    server: Server,
    node: String,
    /// The scripts' directory (`rabbitmqctl`, `rabbitmq-plugins` are run from it).
    bin: PathBuf,
    /// The environment every RabbitMQ script of this node runs with.
    env: Vec<(String, String)>,
    /// The TLS port and the CA file, with [`RabbitMqOptions::tls`].
    tls: Option<(u16, PathBuf)>,
}

impl std::ops::Deref for RabbitMq {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.server
    }
}

impl std::ops::DerefMut for RabbitMq {
    fn deref_mut(&mut self) -> &mut Server {
        &mut self.server
    }
}

impl RabbitMq {
    /// Starts a node on free ports; returns once it answers on its AMQP port.
    pub fn start(opts: RabbitMqOptions) -> Result<RabbitMq> {
        let server = Path::new(RABBITMQ_BIN).join("rabbitmq-server");
        let server = if server.is_file() {
            server
        } else {
            find_program("rabbitmq-server", &[], "rabbitmq-server")?
        };
        let bin = server.parent().map(Path::to_owned).unwrap_or_default();
        let epmd = find_program("epmd", &["/usr/lib/erlang/bin"], "erlang-base")?;
        let mut daemon = Daemon::new("RabbitMQ", "walbox-rabbitmq.", server)?;
        let (port, dist_port, epmd_port) = (free_port()?, free_port()?, free_port()?);
        let node = format!("walbox-{}-{port}@localhost", std::process::id());
        let root = daemon.root().to_owned();

        let home = root.join("home");
        fs::create_dir(&home).map_err(io_err("creating the node's HOME"))?;
        let cookie = home.join(".erlang.cookie");
        fs::write(&cookie, random_cookie()?).map_err(io_err("writing the Erlang cookie"))?;
        fs::set_permissions(&cookie, fs::Permissions::from_mode(0o400))
            .map_err(io_err("chmod the Erlang cookie"))?;
        let mut config = "disk_free_limit.absolute = 1MB\nlog.file = false\nlog.console = true\n\
                          log.console.level = info\n"
            .to_owned();
        let mut tls = None;
        if opts.tls {
            let tls_port = free_port()?;
            let files = issue_tls_files(&daemon)?;
            config += &format!(
                "listeners.ssl.1 = 127.0.0.1:{tls_port}\nssl_options.cacertfile = {}\n\
                 ssl_options.certfile = {}\nssl_options.keyfile = {}\n\
                 ssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n",
                files.ca.display(),
                files.cert.display(),
                files.key.display(),
            );
            tls = Some((tls_port, files.ca));
        }
        let config = daemon.write("rabbitmq.conf", config.as_bytes())?;
        let plugins = daemon.write(
            "enabled_plugins",
            format!("[{}].\n", PLUGINS.join(",")).as_bytes(),
        )?;
        let env_file = daemon.write("rabbitmq-env.conf", b"")?;
        // The node's epmd outlives the node (the Erlang VM starts it as a daemon): stopped by
        // the `cleanup` script, which the drop and the watchdog run once the node is killed.
        // epmd refuses `-kill` while a node is registered, which it may be for a moment.
        daemon.write("cleanup", cleanup_script(&epmd, epmd_port).as_bytes())?;
        let path = |p: &Path| p.display().to_string();
        let env: Vec<(String, String)> = [
            ("HOME", path(&home)),
            ("RABBITMQ_NODENAME", node.clone()),
            ("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1".to_owned()),
            ("RABBITMQ_NODE_PORT", port.to_string()),
            ("RABBITMQ_DIST_PORT", dist_port.to_string()),
            ("ERL_EPMD_PORT", epmd_port.to_string()),
            ("ERL_EPMD_ADDRESS", "127.0.0.1".to_owned()),
            ("RABBITMQ_CONF_ENV_FILE", path(&env_file)),
            ("RABBITMQ_CONFIG_FILE", path(&config)),
            (
                "RABBITMQ_ADVANCED_CONFIG_FILE",
                path(&root.join("advanced.config")),
            ),
            ("RABBITMQ_ENABLED_PLUGINS_FILE", path(&plugins)),
            ("RABBITMQ_MNESIA_BASE", path(&root.join("mnesia"))),
            ("RABBITMQ_LOG_BASE", path(&root.join("log"))),
            ("RABBITMQ_LOGS", "-".to_owned()),
            ("RABBITMQ_PID_FILE", path(&root.join("rabbitmq.pid"))),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        daemon.set_command(Vec::new(), env.clone());
        if opts.watchdog {
            daemon.spawn_watchdog()?;
        }
        Ok(RabbitMq {
            server: Server::start(daemon, port, amqp_answers, START_TIMEOUT)?,
            node,
            bin,
            env,
            tls,
        })
    }

    /// `amqps://guest@localhost:<TLS port>/%2f` (no password: it is `guest`), with
    /// [`RabbitMqOptions::tls`].
    pub fn tls_url(&self) -> Option<String> {
        self.tls
            .as_ref()
            .map(|(port, _)| format!("amqps://guest@localhost:{port}/%2f"))
    }

    /// The PEM file of the CA that signed the node's TLS certificate.
    pub fn ca_file(&self) -> Option<&Path> {
        self.tls.as_ref().map(|(_, ca)| ca.as_path())
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f` (the default virtual host).
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port())
    }

    /// The node's name (`-n` of `rabbitmqctl`).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// A command for RabbitMQ script `program` (`rabbitmqctl`, `rabbitmq-plugins`,
    /// `rabbitmq-diagnostics`) aimed at this node (`-n <node>`, its cookie, its epmd).
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("LC_ALL", "C.UTF-8")
            .args(["-n", &self.node])
            .current_dir(self.server.root())
            .stdin(Stdio::null());
        cmd
    }

    /// Runs [`RabbitMq::command`]`(program)` with `args`; its stdout, or an error with its
    /// output.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<String> {
        let what = format!("{program} {}", args.join(" "));
        let out = self
            .command(program)
            .args(args)
            .output()
            .map_err(io_err(format!("running {what}")))?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let text = format!(
            "{} {}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Err(DaemonError::Command(
            what,
            out.status.to_string(),
            text.lines().collect::<Vec<_>>().join(" | "),
        ))
    }
}

/// The script that stops the node's epmd (on `port`): retried for up to 5 s, done once epmd
/// no longer answers.
fn cleanup_script(epmd: &Path, port: u16) -> String {
    format!(
        "export ERL_EPMD_PORT={port}\nn=0\nwhile [ $n -lt 50 ]; do\n\
         \x20 '{epmd}' -names >/dev/null 2>&1 || exit 0\n\
         \x20 '{epmd}' -kill >/dev/null 2>&1\n  n=$((n + 1))\n  sleep 0.1\ndone\n",
        epmd = epmd.display()
    )
}

/// Whether the AMQP port answers the AMQP 0-9-1 protocol header with a method frame (type 1:
/// `Connection.Start`).
fn amqp_answers(port: u16) -> bool {
    let answer = || -> std::io::Result<u8> {
        let mut conn = TcpStream::connect(("127.0.0.1", port))?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        conn.write_all(b"AMQP\x00\x00\x09\x01")?;
        let mut first = [0u8; 1];
        conn.read_exact(&mut first)?;
        Ok(first[0])
    };
    answer().is_ok_and(|frame_type| frame_type == 1)
}

/// A random cookie for the node's Erlang distribution (from OpenSSL's generator): 32 capital
/// letters.
fn random_cookie() -> Result<String> {
    let mut bytes = [0u8; 32];
    openssl::rand::rand_bytes(&mut bytes)
        .map_err(|e| DaemonError::Io("making an Erlang cookie".into(), std::io::Error::other(e)))?;
    Ok(bytes.iter().map(|b| char::from(b'A' + b % 26)).collect())
}
