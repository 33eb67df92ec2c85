//! `[nats]`: the NATS JetStream broker (`sink::nats`). Present, it makes NATS the broker of
//! `walbox run` (see `broker.rs`).
//!
//! Invariants:
//! - `url` is required; it names one server or several (comma-separated, a cluster's seeds) and
//!   never carries credentials: those come from `user` + `password` (or `password_file`),
//!   `token` (or `token_file`), or `credentials_file` (a `.creds` file), one way at most.
//! - No secret appears in `Debug` output or in an error message (the URL is never quoted).
//! - TLS is used when the URL says `tls://` or any `tls_*` file is set; a client certificate
//!   needs both its certificate and its key.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::env::{EnvLayout, Kind, SecretKey, Setting};
use super::error::ConfigError;
use super::secret::Secret;
use super::units::parse_duration;

/// The JetStream key-value bucket of progress records unless `progress_bucket` says otherwise.
pub const DEFAULT_PROGRESS_BUCKET: &str = "walbox_progress";

/// How long a publish waits for its PubAck unless `ack_timeout` says otherwise.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// `[nats]` as written.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNats {
    /// `nats://host:4222`, or several comma-separated.
    pub url: Option<String>,
    /// User name (with `password`).
    pub user: Option<String>,
    /// The user's password (secret: or `password_file`).
    pub password: Option<String>,
    /// An authentication token (secret: or `token_file`).
    pub token: Option<String>,
    /// A `.creds` file (user JWT and NKey seed).
    pub credentials_file: Option<PathBuf>,
    /// CA certificates (PEM) to verify the servers with.
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate (PEM), with `tls_key_file`.
    pub tls_cert_file: Option<PathBuf>,
    /// Client key (PEM), with `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
    /// The key-value bucket of progress records.
    pub progress_bucket: Option<String>,
    /// How long to wait for a PubAck.
    pub ack_timeout: Option<String>,
}

impl fmt::Debug for RawNats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawNats")
            .field("url", &self.url.as_ref().map(|_| "…"))
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("credentials_file", &self.credentials_file)
            .field("progress_bucket", &self.progress_bucket)
            .finish_non_exhaustive()
    }
}

/// How walbox authenticates to NATS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NatsAuth {
    /// No credentials.
    None,
    /// `user` and `password`.
    UserPassword {
        /// The user.
        user: String,
        /// The password.
        password: Secret,
    },
    /// A token.
    Token(Secret),
    /// A `.creds` file (JWT and NKey seed), read when connecting.
    Credentials(PathBuf),
}

/// TLS settings (any of them set, or a `tls://` URL, turns TLS on).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatsTls {
    /// CA certificates to verify the servers with (else the system's roots).
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// The validated `[nats]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// The servers, as written (`nats://host:port`, `tls://host:port` or `host:port`).
    pub servers: Vec<String>,
    /// Credentials.
    pub auth: NatsAuth,
    /// TLS, when on.
    pub tls: Option<NatsTls>,
    /// The key-value bucket of progress records.
    pub progress_bucket: String,
    /// How long a publish waits for its PubAck before its outcome counts as unknown.
    pub ack_timeout: Duration,
}

impl NatsConfig {
    /// A configuration for `url` (comma-separated servers) without credentials or TLS, and the
    /// defaults (tests, tools).
    pub fn for_url(url: &str) -> Self {
        NatsConfig {
            servers: url.split(',').map(|s| s.trim().to_owned()).collect(),
            auth: NatsAuth::None,
            tls: None,
            progress_bucket: DEFAULT_PROGRESS_BUCKET.to_owned(),
            ack_timeout: DEFAULT_ACK_TIMEOUT,
        }
    }
}

impl RawNats {
    /// The keys `WALBOX_NATS_<KEY>` sets.
    pub(crate) const SETTINGS: &'static [Setting] = &[
        (&["nats"], "url", Kind::Str),
        (&["nats"], "user", Kind::Str),
        (&["nats"], "password", Kind::Str),
        (&["nats"], "token", Kind::Str),
        (&["nats"], "credentials_file", Kind::Str),
        (&["nats"], "tls_ca_file", Kind::Str),
        (&["nats"], "tls_cert_file", Kind::Str),
        (&["nats"], "tls_key_file", Kind::Str),
        (&["nats"], "progress_bucket", Kind::Str),
        (&["nats"], "ack_timeout", Kind::Str),
    ];

    /// The secrets: each may also be given as `<key>_file`.
    pub(crate) const SECRETS: &'static [SecretKey] =
        &[(&["nats"], "password"), (&["nats"], "token")];

    /// Checks values and fills in defaults; `env` names the variables in messages.
    pub(crate) fn validate(self, env: &EnvLayout) -> Result<NatsConfig, ConfigError> {
        let invalid = |m: String| ConfigError::Invalid(m);
        let url = self.url.ok_or_else(|| {
            invalid(format!(
                "nats.url is required with [nats] (set it in the file or {})",
                env.var(&["nats"], "url")
            ))
        })?;
        let mut servers = Vec::new();
        let mut tls_url = false;
        for (i, server) in url.split(',').map(str::trim).enumerate() {
            check_server(server)
                .map_err(|why| invalid(format!("nats.url, server {} of the list: {why}", i + 1)))?;
            tls_url |= server.starts_with("tls://");
            servers.push(server.to_owned());
        }
        let auth = match (self.user, self.password, self.token, self.credentials_file) {
            (None, None, None, None) => NatsAuth::None,
            (Some(user), Some(password), None, None) if !user.is_empty() => {
                NatsAuth::UserPassword {
                    user,
                    password: Secret::new(password),
                }
            }
            (Some(_), None, None, None) => {
                return Err(invalid(format!(
                    "nats.user needs a password: set nats.password_file (or {})",
                    env.var(&["nats"], "password")
                )))
            }
            (None, Some(_), None, None) => {
                return Err(invalid("nats.password needs nats.user".into()))
            }
            (None, None, Some(token), None) => NatsAuth::Token(Secret::new(token)),
            (None, None, None, Some(path)) => {
                std::fs::metadata(&path).map_err(|e| {
                    invalid(format!(
                        "nats.credentials_file: cannot read {}: {e}",
                        path.display()
                    ))
                })?;
                NatsAuth::Credentials(path)
            }
            _ => {
                return Err(invalid(
                    "nats: set one way to authenticate: user and password, or token, or credentials_file"
                        .into(),
                ))
            }
        };
        let client = match (self.tls_cert_file, self.tls_key_file) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(invalid(
                    "nats.tls_cert_file and nats.tls_key_file go together: set both or neither"
                        .into(),
                ))
            }
        };
        let tls = (tls_url || self.tls_ca_file.is_some() || client.is_some()).then_some(NatsTls {
            ca_file: self.tls_ca_file,
            client,
        });
        let progress_bucket = self
            .progress_bucket
            .unwrap_or_else(|| DEFAULT_PROGRESS_BUCKET.to_owned());
        if progress_bucket.is_empty()
            || !progress_bucket
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(invalid(format!(
                "nats.progress_bucket {progress_bucket:?}: a JetStream bucket name is letters, digits, '_' and '-'"
            )));
        }
        let ack_timeout = match self.ack_timeout {
            None => DEFAULT_ACK_TIMEOUT,
            Some(text) => match parse_duration(&text) {
                Ok(d) if !d.is_zero() => d,
                Ok(_) => return Err(invalid("nats.ack_timeout must be more than 0".into())),
                Err(e) => return Err(invalid(format!("nats.ack_timeout: {e}"))),
            },
        };
        Ok(NatsConfig {
            servers,
            auth,
            tls,
            progress_bucket,
            ack_timeout,
        })
    }
}

/// Why `server` (one entry of `nats.url`) is not a server address; the message never quotes
/// it (it might hold a password).
fn check_server(server: &str) -> Result<(), String> {
    if server.is_empty() {
        return Err("empty (a stray comma?)".into());
    }
    let rest = match server.split_once("://") {
        Some((scheme, rest)) => {
            if !matches!(scheme, "nats" | "tls") {
                return Err(format!(
                    "scheme {:?} is not nats:// or tls://",
                    scheme.chars().take(10).collect::<String>()
                ));
            }
            rest
        }
        None => server,
    };
    let authority = rest.split('/').next().unwrap_or(rest);
    if authority.contains('@') {
        return Err(
            "credentials in the URL are refused (it is logged and shown): put the password in \
             nats.password_file (with nats.user), or use nats.token_file or nats.credentials_file"
                .into(),
        );
    }
    if authority.is_empty() || authority.starts_with(':') {
        return Err("no host".into());
    }
    Ok(())
}
