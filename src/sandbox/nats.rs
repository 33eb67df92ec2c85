//! A throwaway NATS server with JetStream (Debian's `nats-server`, 2.9) for the tests of the
//! NATS JetStream broker: `nats-server -js -a 127.0.0.1 -p <port> -sd <dir>`.
//!
//! Invariants:
//! - One server per [`NatsServer`]: its own private directory (JetStream's store in `store/`),
//!   its own client port on 127.0.0.1, a fixed server name (`walbox-<port>`, so that a restart
//!   is the same server to JetStream), no authentication unless [`NatsOptions::user`] or
//!   [`NatsOptions::config`] asks for it, no monitoring port, no cluster.
//! - Cleanup: dropping it kills the server and removes the directory; with
//!   [`NatsOptions::watchdog`] the same happens once this process is gone.
//! - What survives [`NatsServer::restart`] (and [`NatsServer::kill`] then
//!   [`NatsServer::start_again`]): JetStream's streams, consumers and the messages it
//!   acknowledged (file storage; after a kill, what the server had synced). Core NATS
//!   subscriptions do not. Port and directory stay.
//! - [`NatsServer::start`] returns once the server greets a connection with its `INFO` line
//!   (the server opens its client port after JetStream has recovered its store).
//! - With [`NatsOptions::tls`], every client connection must speak TLS (`--tls`), with a
//!   certificate for `localhost` and `127.0.0.1` signed by a fresh CA
//!   ([`NatsServer::ca_file`]); clients need no certificate. The `INFO` line still comes in
//!   clear before the handshake (servers before 2.10), so readiness is probed the same way, but
//!   [`NatsServer::request`] (plain text) is refused.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::daemon::{
    find_program, free_port, io_err, issue_tls_files, Daemon, DaemonError, Result, Server,
};

/// How long the server may take to greet a connection.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start a [`NatsServer`].
#[derive(Debug, Clone, Default)]
pub struct NatsOptions {
    /// Also spawn a detached watchdog that kills the server and removes its directory once
    /// this process is gone. Set it for servers that are never dropped, e.g. kept in a `static`.
    pub watchdog: bool,
    /// Require this user and password (`--user`, `--pass`) of every client.
    pub user: Option<(String, String)>,
    /// A configuration file's text (e.g. an `authorization` block with users and their
    /// permissions), passed with `-c`; the command line's settings win over it.
    pub config: Option<String>,
    /// Require TLS of every client (see the module docs).
    pub tls: bool,
}

/// A running throwaway NATS server; see the [module docs](self).
#[derive(Debug)]
pub struct NatsServer {
    server: Server,
    /// The configuration file given with `-c`, with [`NatsOptions::config`].
    config: Option<PathBuf>,
    /// The CA file, with [`NatsOptions::tls`].
    ca_file: Option<PathBuf>,
}

impl std::ops::Deref for NatsServer {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.server
    }
}

impl std::ops::DerefMut for NatsServer {
    fn deref_mut(&mut self) -> &mut Server {
        &mut self.server
    }
}

impl NatsServer {
    /// Starts a server with JetStream on a free port; returns once it sends its `INFO` line.
    pub fn start(opts: NatsOptions) -> Result<NatsServer> {
        let program = find_program("nats-server", &["/usr/sbin", "/usr/bin"], "nats-server")?;
        let mut daemon = Daemon::new("NATS", "walbox-nats.", program)?;
        let port = free_port()?;
        let store = daemon.root().join("store");
        let args = [
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-sd",
            &store.display().to_string(),
            "-n",
            &format!("walbox-{port}"),
        ]
        .map(str::to_owned);
        let mut args = args.to_vec();
        let mut config = None;
        if let Some(text) = &opts.config {
            let path = daemon.write("nats.conf", text.as_bytes())?;
            args.extend(["-c".into(), path.display().to_string()]);
            config = Some(path);
        }
        let mut ca_file = None;
        if opts.tls {
            let files = issue_tls_files(&daemon)?;
            args.extend([
                "--tls".into(),
                "--tlscert".into(),
                files.cert.display().to_string(),
                "--tlskey".into(),
                files.key.display().to_string(),
            ]);
            ca_file = Some(files.ca);
        }
        if let Some((user, pass)) = &opts.user {
            args.extend(["--user".into(), user.clone(), "--pass".into(), pass.clone()]);
        }
        daemon.set_command(args, Vec::new());
        if opts.watchdog {
            daemon.spawn_watchdog()?;
        }
        Ok(NatsServer {
            server: Server::start(daemon, port, |port| info(port).is_ok(), START_TIMEOUT)?,
            config,
            ca_file,
        })
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port())
    }

    /// `tls://localhost:<port>`, with [`NatsOptions::tls`].
    pub fn tls_url(&self) -> Option<String> {
        self.ca_file
            .as_ref()
            .map(|_| format!("tls://localhost:{}", self.port()))
    }

    /// The PEM file of the CA that signed the server's TLS certificate.
    pub fn ca_file(&self) -> Option<&Path> {
        self.ca_file.as_deref()
    }

    /// Replaces the text of the configuration file of [`NatsOptions::config`] (e.g. to grant a
    /// user a permission); the server reads it on its next start ([`Server::restart`]). An
    /// error when the server was started without one.
    pub fn set_config(&self, text: &str) -> Result<()> {
        let path = self.config.as_ref().ok_or_else(|| {
            DaemonError::Command(
                "rewrite the NATS configuration".into(),
                "no file".into(),
                "the server was started without NatsOptions::config".into(),
            )
        })?;
        std::fs::write(path, text).map_err(io_err(format!("writing {}", path.display())))
    }

    /// The JSON of the `INFO` line the server greets a new connection with.
    pub fn info(&self) -> std::io::Result<String> {
        info(self.port())
    }

    /// A request on a fresh connection: publishes `payload` to `subject` with a reply inbox and
    /// returns the first reply's payload (e.g. `$JS.API.STREAM.CREATE.<name>` with a stream's
    /// configuration). For tests, not a client.
    pub fn request(&self, subject: &str, payload: &str) -> std::io::Result<String> {
        let (mut conn, mut reader) = connect(self.port())?;
        let inbox = "_INBOX.walbox-sandbox";
        write!(
            conn,
            "CONNECT {{\"verbose\":false,\"pedantic\":false}}\r\nSUB {inbox} 1\r\n\
             PUB {subject} {inbox} {}\r\n{payload}\r\n",
            payload.len()
        )?;
        loop {
            let line = read_line(&mut reader)?;
            if line == "PING" {
                conn.write_all(b"PONG\r\n")?;
            } else if let Some(rest) = line.strip_prefix("MSG ") {
                let len: usize = rest
                    .rsplit(' ')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| invalid(&line))?;
                let mut body = vec![0u8; len + 2];
                reader.read_exact(&mut body)?;
                body.truncate(len);
                return Ok(String::from_utf8_lossy(&body).into_owned());
            } else if line.starts_with("-ERR") {
                return Err(invalid(&line));
            }
        }
    }
}

/// A connection to the server on `port`, past its `INFO` line.
fn connect(port: u16) -> std::io::Result<(TcpStream, BufReader<TcpStream>)> {
    let conn = TcpStream::connect(("127.0.0.1", port))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let line = read_line(&mut reader)?;
    if !line.starts_with("INFO ") {
        return Err(invalid(&line));
    }
    Ok((conn, reader))
}

/// The JSON of the `INFO` line of a new connection to `port`.
fn info(port: u16) -> std::io::Result<String> {
    let conn = TcpStream::connect(("127.0.0.1", port))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let line = read_line(&mut BufReader::new(conn))?;
    line.strip_prefix("INFO ")
        .map(|json| json.trim().to_owned())
        .ok_or_else(|| invalid(&line))
}

/// One protocol line, without its `\r\n`.
fn read_line(reader: &mut impl BufRead) -> std::io::Result<String> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(line.trim_end().to_owned())
}

fn invalid(line: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("unexpected from the NATS server: {line:?}"),
    )
}
