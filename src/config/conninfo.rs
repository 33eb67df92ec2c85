//! Connection settings shared by the replication connection and the control connection.
//!
//! walbox parses PostgreSQL connection strings itself because tokio-postgres 0.7.18's `Config`
//! rejects `sslmode=verify-ca|verify-full` and `replication=database`. Both libpq forms are
//! accepted:
//!
//! * URL: `postgres[ql]://user:password@host:port/dbname?param=value&...`, percent-decoded; a
//!   host beginning with `/` (literally in `?host=`, or `%2F`-encoded in the authority) is a Unix
//!   socket directory; IPv6 addresses go in brackets (`[::1]`). As in libpq, the user info is
//!   found before the rest is split, so a password may hold an unencoded `?`, `&`, `=` or `#`
//!   (but not `/`).
//! * key=value: `host=db port=5432 user=walbox password='it''s secret' dbname=app`, values
//!   optionally single-quoted, backslash escapes `\'` and `\\`.
//!
//! Accepted parameters: `host`, `port`, `user`, `password`, `dbname`, `sslmode`, `sslrootcert`,
//! `application_name`, `connect_timeout` (seconds, `0` = none), `target_session_attrs`. Anything
//! else is an error, so a typo never silently weakens TLS. `host` and `port` may list several
//! hosts (`host=a,b`, `postgresql://a:1,b:2/db`): see [`super::target`].
//!
//! Invariants:
//! * the password never appears in [`ConnInfoError`] messages, in [`ConnInfo::redacted`], nor in
//!   `Debug` output. Error messages also hide every fragment of the input that could be part of
//!   a mis-quoted password (every part of a URL, anything after a `password` parameter, a word
//!   without `=` such as a URL with a mistyped scheme): they say which part is wrong, and never
//!   quote the connection string.
//! * Unix sockets never use TLS (PostgreSQL does not offer it there); `sslmode` is ignored for them,
//!   as libpq does.
//! * A server without TLS under `sslmode` require, verify-ca or verify-full is
//!   [`TlsError::NotSupported`] on both connections: fatal (exit status 4), never retried.
//! * When `sslrootcert` is given, `sslmode=prefer|require` verify the certificate chain like
//!   `verify-ca` (libpq's rule for an existing root certificate file). `sslrootcert=system` means
//!   the system's trusted roots.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use super::target::{pair_ports, SessionAttrs};
use crate::failure::{Classify, Failure};

/// Default Unix socket directory of Debian's PostgreSQL packages, used when no host is given and it
/// exists.
const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";
/// Default application name reported to the server (`pg_stat_activity.application_name`).
const DEFAULT_APPLICATION_NAME: &str = "walbox";
/// The parameters walbox accepts.
const KNOWN_PARAMETERS: &[&str] = &[
    "host",
    "port",
    "user",
    "password",
    "dbname",
    "sslmode",
    "sslrootcert",
    "application_name",
    "connect_timeout",
    "target_session_attrs",
];

/// How TLS is negotiated with the server (libpq's `sslmode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SslMode {
    /// Never use TLS.
    Disable,
    /// Try TLS; fall back to plaintext when the server refuses it or the handshake fails.
    #[default]
    Prefer,
    /// Require TLS, without verifying the server certificate (unless `sslrootcert` is given).
    Require,
    /// Require TLS and verify the certificate chain against `sslrootcert` or the system roots,
    /// without checking the host name.
    VerifyCa,
    /// Like [`SslMode::VerifyCa`], and the certificate must also match the host name.
    VerifyFull,
}

impl SslMode {
    /// The libpq spelling, e.g. `verify-full`.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SslMode {
    type Err = ConnInfoError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(ConnInfoError::InvalidValue {
                    param: "sslmode",
                    reason: format!(
                        "{other:?} is not one of disable, prefer, require, verify-ca, verify-full"
                    ),
                })
            }
        })
    }
}

/// Where the server listens.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Host {
    /// A host name or IP address, reached over TCP.
    Tcp(String),
    /// A directory holding the server's Unix socket `.s.PGSQL.<port>`.
    Unix(PathBuf),
}

/// Parsed connection settings. Build with [`str::parse`].
#[derive(Clone, PartialEq, Eq)]
pub struct ConnInfo {
    /// Server host or socket directory.
    pub host: Host,
    /// TCP port, also part of the Unix socket's file name.
    pub port: u16,
    /// Role to log in as.
    pub user: String,
    /// Password, if any. Never printed.
    pub password: Option<String>,
    /// Database to connect to (the replication connection decodes this database's changes).
    pub dbname: String,
    /// TLS negotiation mode.
    pub sslmode: SslMode,
    /// PEM file of trusted root certificates; `system` for the system's roots.
    pub sslrootcert: Option<PathBuf>,
    /// Reported as `application_name`; defaults to `walbox`.
    pub application_name: String,
    /// Bound on establishing a connection (socket, TLS, authentication); `None` waits forever.
    pub connect_timeout: Option<Duration>,
    /// The hosts after the first one (`host=a,b,…`), each with its port, tried in order.
    pub more_hosts: Vec<(Host, u16)>,
    /// Which servers will do (libpq's `target_session_attrs`).
    pub target_session_attrs: SessionAttrs,
}

/// A connection string could not be parsed. The message never contains the password.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnInfoError {
    /// A parameter walbox does not know.
    #[error("unknown connection parameter {0}")]
    UnknownParameter(String),
    /// A known parameter with an unusable value.
    #[error("invalid value for connection parameter {param}: {reason}")]
    InvalidValue {
        /// Parameter name.
        param: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The string is not a well-formed URL or key=value list.
    #[error("malformed connection string: {0}")]
    Malformed(String),
    /// No user name was given and `$USER` is not set.
    #[error("no user name in the connection string and $USER is not set")]
    MissingUser,
}

impl Classify for ConnInfoError {
    /// Exit 3: the connection string is part of the configuration.
    fn failure(&self) -> Option<Failure> {
        Some(Failure::Config)
    }
}

/// One parameter as written in the input.
struct Param {
    key: String,
    value: String,
    /// The key and value may be fragments of a mis-quoted password: do not echo them in errors.
    hidden: bool,
}

/// Shows `s` in an error message unless it may be part of a password.
fn show(s: &str, hidden: bool) -> String {
    if hidden {
        "(not shown: it may be part of a password)".to_owned()
    } else {
        format!("{s:?}")
    }
}

/// " (did you mean X?)" for the known parameter closest to `key`, if close: names a known
/// parameter, never echoes the input.
fn suggestion(key: &str) -> String {
    KNOWN_PARAMETERS
        .iter()
        .map(|known| (super::env::edit_distance(key, known), *known))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, known)| format!(" (did you mean {known}?)"))
        .unwrap_or_default()
}

impl FromStr for ConnInfo {
    type Err = ConnInfoError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let params = if let Some(rest) = s
            .strip_prefix("postgresql://")
            .or_else(|| s.strip_prefix("postgres://"))
        {
            parse_url(rest)?
        } else {
            parse_keyword_value(s)?
        };
        ConnInfo::from_params(params)
    }
}

impl ConnInfo {
    fn from_params(params: Vec<Param>) -> Result<Self, ConnInfoError> {
        let mut hosts: Vec<Host> = Vec::new();
        let mut ports: Vec<Option<u16>> = Vec::new();
        let mut target_session_attrs = SessionAttrs::default();
        let mut user: Option<String> = None;
        let mut password: Option<String> = None;
        let mut dbname: Option<String> = None;
        let mut sslmode = SslMode::default();
        let mut sslrootcert: Option<PathBuf> = None;
        let mut application_name = DEFAULT_APPLICATION_NAME.to_owned();
        let mut connect_timeout: Option<Duration> = None;

        for Param { key, value, hidden } in params {
            match key.as_str() {
                "host" => hosts = parse_hosts(&value, hidden)?,
                "port" => {
                    ports = value
                        .split(',')
                        .map(|p| match p.trim() {
                            "" => Ok(None),
                            p => parse_port(p, hidden).map(Some),
                        })
                        .collect::<Result<_, _>>()?
                }
                "target_session_attrs" => {
                    target_session_attrs =
                        value
                            .parse()
                            .map_err(|reason| ConnInfoError::InvalidValue {
                                param: "target_session_attrs",
                                reason: format!("{} is {reason}", show(&value, hidden)),
                            })?
                }
                "user" => user = Some(value).filter(|v| !v.is_empty()),
                "password" => password = Some(value),
                "dbname" => dbname = Some(value).filter(|v| !v.is_empty()),
                "sslmode" => {
                    sslmode = value.parse().map_err(|_| ConnInfoError::InvalidValue {
                        param: "sslmode",
                        reason: format!(
                            "{} is not one of disable, prefer, require, verify-ca, verify-full",
                            show(&value, hidden)
                        ),
                    })?
                }
                "sslrootcert" => sslrootcert = Some(PathBuf::from(value)).filter(|p| p != ""),
                "application_name" => application_name = value,
                "connect_timeout" => {
                    let secs: u64 =
                        value
                            .trim()
                            .parse()
                            .map_err(|_| ConnInfoError::InvalidValue {
                                param: "connect_timeout",
                                reason: format!(
                                    "{} is not a whole number of seconds",
                                    show(&value, hidden)
                                ),
                            })?;
                    connect_timeout = (secs > 0).then(|| Duration::from_secs(secs));
                }
                _ => {
                    return Err(ConnInfoError::UnknownParameter(format!(
                        "{}{} (known: {})",
                        show(&key, hidden),
                        suggestion(&key),
                        KNOWN_PARAMETERS.join(", ")
                    )))
                }
            }
        }

        if hosts.is_empty() {
            hosts.push(if Path::new(DEFAULT_SOCKET_DIR).exists() {
                Host::Unix(PathBuf::from(DEFAULT_SOCKET_DIR))
            } else {
                Host::Tcp("localhost".to_owned())
            });
        }
        let mut targets = pair_ports(hosts, &ports, 5432)
            .map_err(|reason| ConnInfoError::InvalidValue {
                param: "port",
                reason,
            })?
            .into_iter();
        let (host, port) = targets.next().expect("at least one host");
        let more_hosts = targets.collect();
        let user = match user {
            Some(u) => u,
            None => std::env::var("USER")
                .ok()
                .filter(|u| !u.is_empty())
                .ok_or(ConnInfoError::MissingUser)?,
        };
        let dbname = dbname.unwrap_or_else(|| user.clone());
        Ok(ConnInfo {
            host,
            port,
            user,
            password,
            dbname,
            sslmode,
            sslrootcert,
            application_name,
            connect_timeout,
            more_hosts,
            target_session_attrs,
        })
    }

    /// The Unix socket file, `<dir>/.s.PGSQL.<port>`, when [`ConnInfo::host`] is a directory.
    pub fn unix_socket_path(&self) -> Option<PathBuf> {
        match &self.host {
            Host::Unix(dir) => Some(dir.join(format!(".s.PGSQL.{}", self.port))),
            Host::Tcp(_) => None,
        }
    }

    /// Whether connections use TLS at all: never over Unix sockets nor with `sslmode=disable`.
    pub fn tls_applies(&self) -> bool {
        matches!(self.host, Host::Tcp(_)) && self.sslmode != SslMode::Disable
    }

    /// The settings as a `postgresql://` URL with the password replaced by `***`, for logs.
    /// Parsing it gives back the same settings (except the password).
    pub fn redacted(&self) -> String {
        let mut out = String::from("postgresql://");
        out.push_str(&percent_encode(&self.user));
        if self.password.is_some() {
            out.push_str(":***");
        }
        out.push('@');
        let targets = std::iter::once((&self.host, self.port))
            .chain(self.more_hosts.iter().map(|(h, p)| (h, *p)));
        for (i, (host, port)) in targets.enumerate() {
            if i > 0 {
                out.push(',');
            }
            match host {
                Host::Tcp(h) if h.contains(':') => {
                    out.push('[');
                    out.push_str(h);
                    out.push(']');
                }
                Host::Tcp(h) => out.push_str(&percent_encode(h)),
                Host::Unix(dir) => out.push_str(&percent_encode(&dir.to_string_lossy())),
            }
            out.push_str(&format!(":{port}"));
        }
        out.push('/');
        out.push_str(&percent_encode(&self.dbname));
        out.push_str("?sslmode=");
        out.push_str(self.sslmode.as_str());
        if let Some(root) = &self.sslrootcert {
            out.push_str("&sslrootcert=");
            out.push_str(&percent_encode(&root.to_string_lossy()));
        }
        out.push_str("&application_name=");
        out.push_str(&percent_encode(&self.application_name));
        if let Some(t) = self.connect_timeout {
            out.push_str(&format!("&connect_timeout={}", t.as_secs().max(1)));
        }
        if self.target_session_attrs != SessionAttrs::Any {
            out.push_str("&target_session_attrs=");
            out.push_str(self.target_session_attrs.as_str());
        }
        out
    }
}

impl ConnInfo {
    /// Whether connecting needs to choose among hosts or check the server's state.
    pub fn chooses_host(&self) -> bool {
        !self.more_hosts.is_empty() || self.target_session_attrs != SessionAttrs::Any
    }

    /// One single-host connection per host, in the order written.
    pub fn candidates(&self) -> Vec<ConnInfo> {
        let first = ConnInfo {
            more_hosts: Vec::new(),
            ..self.clone()
        };
        let mut out = vec![first.clone()];
        out.extend(self.more_hosts.iter().map(|(host, port)| ConnInfo {
            host: host.clone(),
            port: *port,
            ..first.clone()
        }));
        out
    }

    /// `host:port` (or the socket directory and port) of the first host, for messages.
    pub fn host_label(&self) -> String {
        match &self.host {
            Host::Tcp(h) if h.contains(':') => format!("[{h}]:{}", self.port),
            Host::Tcp(h) => format!("{h}:{}", self.port),
            Host::Unix(dir) => format!("{}:{}", dir.display(), self.port),
        }
    }
}

impl fmt::Display for ConnInfo {
    /// Same as [`ConnInfo::redacted`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for ConnInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnInfo")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("dbname", &self.dbname)
            .field("sslmode", &self.sslmode)
            .field("sslrootcert", &self.sslrootcert)
            .field("application_name", &self.application_name)
            .field("connect_timeout", &self.connect_timeout)
            .field("more_hosts", &self.more_hosts)
            .field("target_session_attrs", &self.target_session_attrs)
            .finish()
    }
}

/// `host=a,b,…`: one host, or several in the order they are tried.
fn parse_hosts(value: &str, hidden: bool) -> Result<Vec<Host>, ConnInfoError> {
    if value.is_empty() {
        return Ok(Vec::new());
    }
    value
        .split(',')
        .map(|h| match parse_host(h.trim(), hidden)? {
            Some(host) => Ok(host),
            None => Err(ConnInfoError::InvalidValue {
                param: "host",
                reason: "an empty host in the list of hosts".to_owned(),
            }),
        })
        .collect()
}

fn parse_host(value: &str, hidden: bool) -> Result<Option<Host>, ConnInfoError> {
    if value.is_empty() {
        return Ok(None);
    }
    if value.starts_with('/') {
        return Ok(Some(Host::Unix(PathBuf::from(value))));
    }
    if value.contains(['@', '/', ' ']) {
        return Err(ConnInfoError::InvalidValue {
            param: "host",
            reason: format!(
                "{} is not a host name (percent-encode '@' and '/' in a URL's user name or password)",
                show(value, hidden)
            ),
        });
    }
    Ok(Some(Host::Tcp(value.to_owned())))
}

fn parse_port(value: &str, hidden: bool) -> Result<u16, ConnInfoError> {
    match value.trim().parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(ConnInfoError::InvalidValue {
            param: "port",
            reason: format!("{} is not a port number (1-65535)", show(value, hidden)),
        }),
    }
}

/// Where a URL's user info ends (the index of its '@'), as libpq finds it: the user info is
/// looked for before the host, so `?`, `#`, `&` and `=` in an unencoded password stay in the
/// password. It ends at an '@' before the first '/'; of several, the last one before the query
/// (which starts at the first '?' after the first '@'), so an unencoded '@' in the password
/// cannot become the host, nor an '@' in a query value the user info.
fn userinfo_end(rest: &str) -> Option<usize> {
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let first = authority.find('@')?;
    let query = authority[first..]
        .find('?')
        .map_or(authority.len(), |i| first + i);
    authority[..query].rfind('@')
}

/// Parses the part of a URL after `postgres://`. Every part of a URL may hold a fragment of a
/// mis-encoded password, so no part of it is ever quoted in an error.
fn parse_url(rest: &str) -> Result<Vec<Param>, ConnInfoError> {
    let (userinfo, rest) = match userinfo_end(rest) {
        Some(i) => (Some(&rest[..i]), &rest[i + 1..]),
        None => (None, rest),
    };
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (hostport, path) = match before_query.find('/') {
        Some(i) => (&before_query[..i], &before_query[i + 1..]),
        None => (before_query, ""),
    };
    let mut params = Vec::new();
    let mut push = |key: &str, value: String| {
        params.push(Param {
            key: key.to_owned(),
            value,
            hidden: true,
        })
    };

    if let Some(userinfo) = userinfo {
        let (user, password) = match userinfo.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (userinfo, None),
        };
        push("user", percent_decode(user, "user name")?);
        if let Some(p) = password {
            push("password", percent_decode(p, "password")?);
        }
    }

    // Hosts and ports: a comma-separated list of "[v6]:port", "host:port", "host", ":port", "".
    let mut hosts = Vec::new();
    let mut ports = Vec::new();
    for hostport in hostport.split(',') {
        let (host, port) = url_host_port(hostport)?;
        hosts.push(host);
        ports.push(port.unwrap_or_default());
    }
    if hosts.iter().any(|h| !h.is_empty()) {
        push("host", hosts.join(","));
    }
    if ports.iter().any(|p| !p.is_empty()) {
        push("port", ports.join(","));
    }

    if !path.is_empty() {
        if path.contains('@') {
            return Err(ConnInfoError::Malformed(
                "unexpected '@' after the URL's host: percent-encode '/' and '@' in the user name \
                 or password (%2F, %40)"
                    .to_owned(),
            ));
        }
        push("dbname", percent_decode(path, "database name")?);
    }

    for (n, pair) in query.split('&').filter(|p| !p.is_empty()).enumerate() {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            ConnInfoError::Malformed(format!(
                "URL query parameter {} has no '=' (not shown: it may be part of a password; \
                 percent-encode '?', '&' and '=' in a password)",
                n + 1
            ))
        })?;
        let key = percent_decode(k, "query parameter name")?;
        let value = percent_decode(v, "query parameter value")?;
        push(&key, value);
    }
    Ok(params)
}

/// One host of a URL's authority: `[v6]:port`, `host:port`, `host`, `:port` or empty.
fn url_host_port(hostport: &str) -> Result<(String, Option<String>), ConnInfoError> {
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| ConnInfoError::Malformed("unterminated '[' in URL host".to_owned()))?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(|| {
                ConnInfoError::Malformed("unexpected text after ']' in URL host".to_owned())
            })?),
        };
        (h.to_owned(), port)
    } else {
        match hostport.split_once(':') {
            Some((h, p)) => (percent_decode(h, "host")?, Some(p)),
            None => (percent_decode(hostport, "host")?, None),
        }
    };
    let port = match port {
        Some(p) => Some(percent_decode(p, "port")?),
        None => None,
    };
    Ok((host, port))
}

/// Parses libpq's `key=value key='quoted value'` form.
fn parse_keyword_value(s: &str) -> Result<Vec<Param>, ConnInfoError> {
    let mut params = Vec::new();
    let mut chars = s.chars().peekable();
    let mut after_password = false;
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            // Not echoed unless it is a parameter name: a word without '=' may be a password
            // (a mistyped URL is one word holding the password).
            return Err(ConnInfoError::Malformed(
                if params.is_empty() && key.contains(':') {
                    "not a URL starting with postgres:// or postgresql://, nor key=value pairs \
                 (check the URL's scheme and the '//' after it)"
                        .to_owned()
                } else if KNOWN_PARAMETERS.contains(&key.as_str()) && !after_password {
                    format!("missing '=' after {key:?} (values with spaces need single quotes)")
                } else {
                    format!(
                    "missing '=' after word {} (not shown: it may be part of a password; values \
                     with spaces need single quotes)",
                    params.len() + 1
                )
                },
            ));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => {
                        return Err(ConnInfoError::Malformed(format!(
                            "unterminated quoted value of {}",
                            show(&key, after_password)
                        )))
                    }
                    Some('\'') => break,
                    Some('\\') => match chars.next() {
                        Some(c) => value.push(c),
                        None => {
                            return Err(ConnInfoError::Malformed(format!(
                                "unterminated quoted value of {}",
                                show(&key, after_password)
                            )))
                        }
                    },
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    if let Some(escaped) = chars.next() {
                        value.push(escaped);
                    }
                } else {
                    value.push(c);
                }
            }
        }
        let is_password = key == "password";
        params.push(Param {
            key,
            value,
            hidden: after_password,
        });
        after_password |= is_password;
    }
    Ok(params)
}

/// Decodes `%XX` escapes; the result must be UTF-8 without NUL. `what` names the part for errors
/// (the input itself is never echoed).
fn percent_decode(s: &str, what: &str) -> Result<String, ConnInfoError> {
    // percent-encoding passes malformed escapes through unchanged; libpq rejects them.
    let bytes = s.as_bytes();
    let malformed = bytes.iter().enumerate().any(|(i, &b)| {
        b == b'%'
            && !bytes
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if malformed {
        return Err(ConnInfoError::Malformed(format!(
            "invalid percent-encoding in the {what}"
        )));
    }
    let decoded: Vec<u8> = percent_encoding::percent_decode_str(s).collect();
    if decoded.contains(&0) {
        return Err(ConnInfoError::Malformed(format!(
            "%00 is not allowed in the {what}"
        )));
    }
    String::from_utf8(decoded).map_err(|_| {
        ConnInfoError::Malformed(format!("the {what} is not UTF-8 after percent-decoding"))
    })
}

/// Everything but RFC 3986's unreserved characters is percent-encoded.
const NOT_UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes everything except RFC 3986 unreserved characters.
fn percent_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, NOT_UNRESERVED).to_string()
}

#[cfg(test)]
#[path = "conninfo_tests.rs"]
mod tests;
