//! The control connection: an ordinary (non-replication) PostgreSQL session through
//! tokio-postgres, for catalog checks, slot queries, the slot monitor and the inbox.
//!
//! TLS follows [`ConnInfo::sslmode`] exactly as on the replication connection (same
//! [`TlsConfig`]). With `prefer`, a failed handshake is retried once without TLS; a server that
//! refuses TLS under `require`/`verify-*` is [`TlsError::NotSupported`], a configuration error
//! that every retry would repeat.

use crate::config::conninfo::{ConnInfo, Host, SslMode};
use crate::failure::{Classify, Failure};
use crate::pg::hosts::{self, ServerRole, Verdict, ROLE_QUERY};
use crate::pg::tls::{TlsConfig, TlsError};

/// The control connection could not be established.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// TLS could not be set up (e.g. unreadable `sslrootcert`).
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// Connecting, the TLS handshake, authentication or the server failed.
    #[error("cannot connect to PostgreSQL: {}", error_chain(.0))]
    Postgres(#[from] tokio_postgres::Error),
    /// `connect_timeout` elapsed.
    #[error("timed out connecting to PostgreSQL")]
    Timeout,
    /// Several hosts or `target_session_attrs`: none of the hosts would do (transient).
    #[error("{0}")]
    NoSuitableHost(String),
}

impl Classify for ConnectError {
    fn failure(&self) -> Option<Failure> {
        match self {
            ConnectError::Tls(t) => t.failure(),
            e if e.certificate_rejected() => Some(Failure::Auth),
            e => e
                .sqlstate()
                .and_then(|c| crate::failure::sqlstate(c, &e.to_string()).fatal()),
        }
    }
}

impl ConnectError {
    /// The SQLSTATE of a server error, e.g. `28P01` for a wrong password.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            ConnectError::Postgres(e) => e.as_db_error().map(|db| db.code().code()),
            _ => None,
        }
    }

    /// Whether the server asked for a password and the connection settings hold none.
    pub fn password_missing(&self) -> bool {
        match self {
            // tokio-postgres 0.7 reports it only as this configuration error's text.
            ConnectError::Postgres(e) => {
                std::error::Error::source(e).is_some_and(|s| s.to_string() == "password missing")
            }
            _ => false,
        }
    }

    /// Whether the TLS handshake failed because the server's certificate was rejected (untrusted
    /// chain, host name mismatch, expired): a configuration problem that every retry repeats,
    /// unlike a handshake cut short by the network.
    pub fn certificate_rejected(&self) -> bool {
        match self {
            ConnectError::Postgres(e) => is_certificate_rejection(e),
            _ => false,
        }
    }
}

/// Opens an ordinary (non-replication) connection with tokio-postgres, for DDL and slot health
/// queries. TLS follows [`ConnInfo::sslmode`] exactly like the replication connection (same
/// [`TlsConfig`]); with `prefer`, a failed handshake is retried once without TLS. The connection
/// task is spawned on tokio and logs with `tracing::warn!` if it ends with an error. Several
/// hosts, or `target_session_attrs`: the first host that will do ([`crate::pg::hosts`]).
pub async fn connect_control(info: &ConnInfo) -> Result<tokio_postgres::Client, ConnectError> {
    if !info.chooses_host() {
        return connect_one(info).await;
    }
    let chosen = hosts::choose(info, |candidate, attrs, any| async move {
        let client = match connect_one(&candidate).await {
            Ok(client) => client,
            Err(e) => return Verdict::Failed(e),
        };
        let row = match client.query_one(ROLE_QUERY, &[]).await {
            Ok(row) => row,
            Err(e) => return Verdict::Failed(ConnectError::Postgres(e)),
        };
        match ServerRole::from_text(row.get(0), row.get(1)) {
            Some(role) if hosts::suits(attrs, role, any) => Verdict::Chosen(client),
            Some(role) => Verdict::Unsuitable(role),
            None => Verdict::Failed(ConnectError::NoSuitableHost(
                "unexpected answer to pg_is_in_recovery()".to_owned(),
            )),
        }
    })
    .await;
    chosen.map_err(|e| e.unwrap_or_else(ConnectError::NoSuitableHost))
}

async fn connect_one(info: &ConnInfo) -> Result<tokio_postgres::Client, ConnectError> {
    let attempt = async {
        let tls = if info.tls_applies() {
            TlsConfig::new(info.sslmode, info.sslrootcert.as_deref())?
        } else {
            None
        };
        match tls {
            None => connect_control_with(control_config(info, false), tokio_postgres::NoTls).await,
            Some(tls) => {
                let first =
                    connect_control_with(control_config(info, true), tls.make_tls_connect()).await;
                match first {
                    Err(ConnectError::Postgres(e))
                        if info.sslmode == SslMode::Prefer && is_tls_failure(&e) =>
                    {
                        tracing::debug!(
                            error = %e,
                            "TLS handshake failed with sslmode=prefer; retrying without TLS"
                        );
                        connect_control_with(control_config(info, false), tokio_postgres::NoTls)
                            .await
                    }
                    // The same verdict as the replication connection's: a configuration
                    // problem that every retry repeats, not a transient error.
                    Err(ConnectError::Postgres(e)) if server_refused_tls(&e) => {
                        Err(TlsError::NotSupported(info.sslmode).into())
                    }
                    other => other,
                }
            }
        }
    };
    match info.connect_timeout {
        Some(limit) => tokio::time::timeout(limit, attempt)
            .await
            .map_err(|_| ConnectError::Timeout)?,
        None => attempt.await,
    }
}

fn control_config(info: &ConnInfo, tls: bool) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    match &info.host {
        Host::Tcp(h) => config.host(h.as_str()),
        Host::Unix(dir) => config.host_path(dir),
    };
    config
        .port(info.port)
        .user(info.user.as_str())
        .dbname(info.dbname.as_str())
        .application_name(info.application_name.as_str())
        .ssl_mode(match (tls, info.sslmode) {
            (false, _) => tokio_postgres::config::SslMode::Disable,
            // The server may refuse TLS: then go on in plaintext, like libpq.
            (true, SslMode::Prefer) => tokio_postgres::config::SslMode::Prefer,
            (true, _) => tokio_postgres::config::SslMode::Require,
        });
    if let Some(p) = &info.password {
        config.password(p.as_bytes());
    }
    if let Some(t) = info.connect_timeout {
        config.connect_timeout(t);
    }
    config
}

async fn connect_control_with<T>(
    config: tokio_postgres::Config,
    tls: T,
) -> Result<tokio_postgres::Client, ConnectError>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: Send + 'static,
{
    let (client, connection) = config.connect(tls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "PostgreSQL control connection ended with an error");
        }
    });
    Ok(client)
}

/// tokio-postgres's `Display` says only "db error" or "error performing TLS handshake": add the
/// server's fields, or the chain of causes. The server's messages never hold the password.
pub fn error_chain(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} {}: {}", db.severity(), db.code().code(), db.message());
    }
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// Whether tokio-postgres gave up because the server answered the SSLRequest with 'N' under
/// `sslmode=require` (its only report of it is this message, in tokio-postgres 0.7).
fn server_refused_tls(e: &tokio_postgres::Error) -> bool {
    std::error::Error::source(e).is_some_and(|s| s.to_string() == "server does not support TLS")
}

/// Whether a tokio-postgres error came from the TLS handshake (OpenSSL).
fn is_tls_failure(e: &tokio_postgres::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<openssl::ssl::Error>() || s.is::<openssl::error::ErrorStack>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// Whether a tokio-postgres error is OpenSSL's "certificate verify failed" (the verification
/// callback, including the host name check, refused the server's certificate).
fn is_certificate_rejection(e: &tokio_postgres::Error) -> bool {
    /// OpenSSL's `ERR_LIB_SSL` and `SSL_R_CERTIFICATE_VERIFY_FAILED` (same in 1.1 and 3.x).
    const ERR_LIB_SSL: i32 = 20;
    const SSL_R_CERTIFICATE_VERIFY_FAILED: i32 = 134;
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(stack) = s
            .downcast_ref::<openssl::ssl::Error>()
            .and_then(|ssl| ssl.ssl_error())
        {
            return stack.errors().iter().any(|e| {
                e.library_code() == ERR_LIB_SSL
                    && e.reason_code() == SSL_R_CERTIFICATE_VERIFY_FAILED
            });
        }
        source = s.source();
    }
    false
}
