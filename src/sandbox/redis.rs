//! A throwaway Redis server (Debian's `redis-server`) for the tests of the Redis Streams broker.
//!
//! Invariants:
//! - One server per [`RedisServer`]: its own private directory (the working directory, so the
//!   append-only file and any dump live there), its own port on 127.0.0.1, no unix socket, no
//!   password, protected mode off, no RDB snapshots (`save ""`).
//! - Cleanup: dropping it kills the server and removes the directory; with
//!   [`RedisOptions::watchdog`] the same happens once this process is gone.
//! - What survives [`RedisServer::restart`](Server::restart) (and [`RedisServer::kill`](Server::kill) then
//!   [`RedisServer::start_again`](Server::start_again)): with [`RedisOptions::appendonly`], every write the server
//!   acknowledged (`appendfsync always`); without it, nothing. Port and directory stay.
//! - [`RedisServer::start`] returns once the server answers `PING` with `+PONG`.
//! - With [`RedisOptions::tls`], the server also listens with TLS on a port of its own
//!   ([`RedisServer::tls_url`]), its certificate (for `localhost` and `127.0.0.1`) signed by a
//!   fresh CA ([`RedisServer::ca_file`]); clients need no certificate. The plain port stays, for
//!   the readiness probe and [`RedisServer::command`].

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::daemon::{find_program, free_port, issue_tls_files, Daemon, Result, Server};

/// How long the server may take to answer `PING`.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start a [`RedisServer`]; `Default` gives an in-memory server.
#[derive(Debug, Clone, Default)]
pub struct RedisOptions {
    /// Keep an append-only file, fsynced on every write, so that the data survives a restart
    /// (and a kill).
    pub appendonly: bool,
    /// Also spawn a detached watchdog that kills the server and removes its directory once
    /// this process is gone. Set it for servers that are never dropped, e.g. kept in a `static`.
    pub watchdog: bool,
    /// Also listen with TLS (see the module docs).
    pub tls: bool,
}

/// A running throwaway Redis server; see the [module docs](self).
#[derive(Debug)]
pub struct RedisServer {
    server: Server,
    /// The TLS port and the CA file, with [`RedisOptions::tls`].
    tls: Option<(u16, PathBuf)>,
}

impl std::ops::Deref for RedisServer {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.server
    }
}

impl std::ops::DerefMut for RedisServer {
    fn deref_mut(&mut self) -> &mut Server {
        &mut self.server
    }
}

/// The `redis.conf` lines of a TLS listener on `port` with fresh certificates, and the CA file.
fn tls_config(daemon: &Daemon, port: u16) -> Result<(String, PathBuf)> {
    let files = issue_tls_files(daemon)?;
    let config = format!(
        "tls-port {port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-auth-clients no\n",
        quote(&files.cert),
        quote(&files.key),
        quote(&files.ca),
    );
    Ok((config, files.ca))
}

impl RedisServer {
    /// Starts a server on a free port; returns once it answers `PING`.
    pub fn start(opts: RedisOptions) -> Result<RedisServer> {
        let program = find_program("redis-server", &["/usr/bin", "/usr/sbin"], "redis-server")?;
        let mut daemon = Daemon::new("Redis", "walbox-redis.", program)?;
        let port = free_port()?;
        let appendonly = if opts.appendonly { "yes" } else { "no" };
        let mut tls = None;
        let mut tls_lines = String::new();
        if opts.tls {
            let tls_port = free_port()?;
            let (lines, ca_file) = tls_config(&daemon, tls_port)?;
            tls_lines = lines;
            tls = Some((tls_port, ca_file));
        }
        let config = format!(
            "{tls_lines}bind 127.0.0.1\nport {port}\nprotected-mode no\ndaemonize no\n\
             dir {dir}\nsave \"\"\nappendonly {appendonly}\nappendfsync always\n\
             logfile \"\"\nloglevel notice\n",
            dir = quote(daemon.root()),
        );
        let config = daemon.write("redis.conf", config.as_bytes())?;
        daemon.set_command(vec![config.display().to_string()], Vec::new());
        if opts.watchdog {
            daemon.spawn_watchdog()?;
        }
        Ok(RedisServer {
            server: Server::start(daemon, port, ping, START_TIMEOUT)?,
            tls,
        })
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port())
    }

    /// `rediss://localhost:<TLS port>`, with [`RedisOptions::tls`].
    pub fn tls_url(&self) -> Option<String> {
        self.tls
            .as_ref()
            .map(|(port, _)| format!("rediss://localhost:{port}"))
    }

    /// The PEM file of the CA that signed the server's TLS certificate.
    pub fn ca_file(&self) -> Option<&Path> {
        self.tls.as_ref().map(|(_, ca)| ca.as_path())
    }

    /// Sends one command (`args`, as a RESP array of bulk strings) and returns the raw reply,
    /// read until it is complete (one RESP value). For tests and readiness, not a client.
    pub fn command(&self, args: &[&str]) -> std::io::Result<String> {
        command(self.port(), args)
    }
}

/// Whether a server on `port` answers `PING` with `+PONG`.
fn ping(port: u16) -> bool {
    command(port, &["PING"]).is_ok_and(|reply| reply == "+PONG\r\n")
}

/// One RESP command on a fresh connection; the reply as text.
fn command(port: u16, args: &[&str]) -> std::io::Result<String> {
    let mut conn = TcpStream::connect(("127.0.0.1", port))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request += &format!("${}\r\n{arg}\r\n", arg.len());
    }
    conn.write_all(request.as_bytes())?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    while !complete(&reply) {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// Whether `reply` holds one complete RESP value: a line (`+`, `-`, `:`), or a bulk string
/// (`$<len>` then that many bytes; `$-1` for none). Arrays are not needed here: their reply is
/// taken as complete at its first line's end plus whatever arrived with it.
fn complete(reply: &[u8]) -> bool {
    let Some(end) = reply.windows(2).position(|w| w == b"\r\n") else {
        return false;
    };
    if reply[0] != b'$' {
        return true;
    }
    match std::str::from_utf8(&reply[1..end])
        .ok()
        .and_then(|n| n.parse::<i64>().ok())
    {
        Some(len) if len >= 0 => reply.len() >= end + 2 + len as usize + 2,
        _ => true,
    }
}

/// A path quoted for `redis.conf`.
fn quote(path: &Path) -> String {
    format!("\"{}\"", path.display().to_string().replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::complete;

    #[test]
    fn a_reply_is_complete_once_its_value_arrived() {
        assert!(complete(b"+PONG\r\n"));
        assert!(!complete(b"+PO"));
        assert!(complete(b"$-1\r\n"));
        assert!(!complete(b"$5\r\nhel"));
        assert!(complete(b"$5\r\nhello\r\n"));
    }
}
