//! Opening a session for walbox's own PostgreSQL protocol clients: the socket, `SSLRequest` and
//! the TLS handshake, the `StartupMessage`, the authentication exchange, and the parameters the
//! server reports until it is ready for queries. The result is a [`Session`] on a [`Wire`].
//!
//! # TLS rules
//! * TLS follows [`ConnInfo::sslmode`] with libpq's semantics (see [`crate::pg::tls`]). Unix
//!   sockets never use TLS.
//! * After the `SSLRequest` exactly one byte is read: anything after the server's `'S'` belongs to
//!   the TLS handshake and must not be taken as plaintext protocol (CVE-2021-23222).
//! * With `sslmode=prefer`, a refusal (`'N'`) or a failed handshake falls back to plaintext;
//!   every other mode fails instead (a refusal is [`TlsError::NotSupported`], a configuration
//!   error that every retry repeats).
//!
//! # Authentication
//! Trust, cleartext password, md5 and SCRAM-SHA-256, all from postgres-protocol. Over TLS, SCRAM
//! uses `tls-server-end-point` channel binding (SCRAM-SHA-256-PLUS) when the server offers it. An
//! `AuthenticationOk` before the SCRAM exchange completed is refused: only the server's final
//! signature proves that it knows the password, so skipping it is what an impostor would do.
//! Other methods (Kerberos, GSSAPI, SSPI, SCM credentials, codes postgres-protocol does not know)
//! are [`StartupError::UnsupportedAuth`]. The whole sequence is bounded by `connect_timeout`.

use std::collections::HashMap;
use std::io;

use bytes::BytesMut;
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{self, ChannelBinding, ScramSha256};
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream, UnixStream};
use tokio_postgres::fallible_iterator::FallibleIterator;

use crate::config::conninfo::{ConnInfo, Host, SslMode};
use crate::failure::{Classify, Failure};
use crate::pg::tls::{self, TlsConfig, TlsError};
use crate::pg::wire::{
    log_notice, protocol, server_error, tag_name, Backend, Stream, Wire, WireError,
};

/// Errors of opening a session.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The socket could not be opened.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// Host and port, or the Unix socket path.
        addr: String,
        /// The underlying error.
        source: io::Error,
    },
    /// TLS set-up or negotiation failed.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The server asked for an authentication method walbox does not implement.
    #[error("unsupported authentication method: {0}")]
    UnsupportedAuth(String),
    /// The server asked for a password and the connection string has none.
    #[error("the server requires a password and none was given")]
    PasswordRequired,
    /// `connect_timeout` elapsed.
    #[error("timed out")]
    Timeout,
    /// Reading, writing, the server's answer (e.g. a wrong password: SQLSTATE `28P01`) or its
    /// protocol.
    #[error(transparent)]
    Wire(#[from] WireError),
}

impl From<io::Error> for StartupError {
    fn from(e: io::Error) -> Self {
        StartupError::Wire(WireError::Io(e))
    }
}

impl Classify for StartupError {
    fn failure(&self) -> Option<Failure> {
        match self {
            StartupError::Tls(t) => t.failure(),
            StartupError::UnsupportedAuth(_) | StartupError::PasswordRequired => {
                Some(Failure::Auth)
            }
            StartupError::Wire(w) => w.failure(),
            StartupError::Connect { .. } | StartupError::Timeout => None,
        }
    }
}

/// An authenticated session, ready for queries.
pub struct Session {
    /// The connection.
    pub wire: Wire,
    /// The parameters the server reported (`server_version`, `server_encoding`, `TimeZone`, …).
    pub parameters: HashMap<String, String>,
    /// The backend's process id, if the server sent `BackendKeyData`.
    pub backend_pid: Option<i32>,
}

/// Connects and authenticates: TCP or Unix socket, TLS per `sslmode`, startup parameters `user`,
/// `database`, `application_name`, `client_encoding=UTF8` and `extra` (e.g.
/// `replication=database`). Bounded by `connect_timeout`.
pub async fn connect(info: &ConnInfo, extra: &[(&str, &str)]) -> Result<Session, StartupError> {
    match info.connect_timeout {
        Some(limit) => tokio::time::timeout(limit, connect_inner(info, extra))
            .await
            .map_err(|_| StartupError::Timeout)?,
        None => connect_inner(info, extra).await,
    }
}

async fn connect_inner(info: &ConnInfo, extra: &[(&str, &str)]) -> Result<Session, StartupError> {
    let tls = if info.tls_applies() {
        TlsConfig::new(info.sslmode, info.sslrootcert.as_deref())?
    } else {
        None
    };
    match attempt(info, tls.as_ref(), extra).await {
        Err(StartupError::Tls(e @ (TlsError::Handshake(_) | TlsError::CertificateRejected(_))))
            if info.sslmode == SslMode::Prefer =>
        {
            tracing::debug!(
                error = %e,
                "TLS handshake failed with sslmode=prefer; retrying without TLS"
            );
            attempt(info, None, extra).await
        }
        other => other,
    }
}

async fn attempt(
    info: &ConnInfo,
    tls: Option<&TlsConfig>,
    extra: &[(&str, &str)],
) -> Result<Session, StartupError> {
    let (stream, channel_binding) = open_stream(info, tls).await?;
    let mut wire = Wire::new(stream);
    let parameters = [
        ("user", info.user.as_str()),
        ("database", info.dbname.as_str()),
        ("application_name", info.application_name.as_str()),
        ("client_encoding", "UTF8"),
    ];
    frontend::startup_message(parameters.iter().chain(extra).copied(), wire.write_buf())?;
    wire.flush_out().await?;
    authenticate(&mut wire, info, channel_binding).await?;

    let mut parameters = HashMap::new();
    let mut backend_pid = None;
    loop {
        match wire.expect_message().await? {
            Backend::Message(Message::ParameterStatus(p)) => match (p.name(), p.value()) {
                (Ok(name), Ok(value)) => {
                    parameters.insert(name.to_owned(), value.to_owned());
                }
                _ => tracing::debug!("ParameterStatus that is not UTF-8 ignored"),
            },
            Backend::Message(Message::BackendKeyData(k)) => backend_pid = Some(k.process_id()),
            Backend::Message(Message::ReadyForQuery(_)) => break,
            Backend::Message(Message::ErrorResponse(e)) => return Err(server_error(&e).into()),
            Backend::Message(Message::NoticeResponse(n)) => log_notice(&n),
            other => {
                return Err(protocol(format!("unexpected {} during startup", other.name())).into())
            }
        }
    }
    Ok(Session {
        wire,
        parameters,
        backend_pid,
    })
}

/// Opens the socket and negotiates TLS. Returns the channel binding data when TLS is up.
async fn open_stream(
    info: &ConnInfo,
    tls: Option<&TlsConfig>,
) -> Result<(Stream, Option<Vec<u8>>), StartupError> {
    let host = match &info.host {
        Host::Unix(_) => {
            let path = info.unix_socket_path().unwrap_or_default();
            let stream =
                UnixStream::connect(&path)
                    .await
                    .map_err(|source| StartupError::Connect {
                        addr: path.display().to_string(),
                        source,
                    })?;
            return Ok((Stream::Unix(stream), None));
        }
        Host::Tcp(host) => host,
    };
    let mut tcp = connect_tcp(host, info.port).await?;
    let Some(tls) = tls else {
        return Ok((Stream::Tcp(tcp), None));
    };
    let mut request = BytesMut::new();
    frontend::ssl_request(&mut request);
    tcp.write_all(&request).await?;
    // Exactly one byte: anything after 'S' belongs to the TLS handshake (CVE-2021-23222).
    match tcp.read_u8().await? {
        b'S' => {
            let stream = tls.handshake(host, tcp).await?;
            let binding = tls::tls_server_end_point(stream.ssl());
            Ok((Stream::Tls(stream), binding))
        }
        b'N' if info.sslmode == SslMode::Prefer => Ok((Stream::Tcp(tcp), None)),
        b'N' => Err(TlsError::NotSupported(info.sslmode).into()),
        b'E' => Err(protocol(
            "the server rejected the SSLRequest with an error (PostgreSQL older than 7.0?)",
        )
        .into()),
        t => Err(protocol(format!(
            "unexpected answer {} to the SSLRequest",
            tag_name(t)
        ))
        .into()),
    }
}

/// Resolves `host` and connects to the first address that answers, with TCP keepalive and
/// `TCP_NODELAY` on.
async fn connect_tcp(host: &str, port: u16) -> Result<TcpStream, StartupError> {
    let target = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let addrs = tokio::net::lookup_host((host, port))
        .await
        .map_err(|source| StartupError::Connect {
            addr: target.clone(),
            source,
        })?;
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address found");
    for addr in addrs {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        };
        let attempt = async {
            let socket = socket?;
            socket.set_keepalive(true)?;
            let stream = socket.connect(addr).await?;
            stream.set_nodelay(true)?;
            Ok::<_, io::Error>(stream)
        };
        match attempt.await {
            Ok(stream) => return Ok(stream),
            Err(e) => {
                tracing::debug!(%addr, error = %e, "cannot connect");
                last = e;
            }
        }
    }
    Err(StartupError::Connect {
        addr: target,
        source: last,
    })
}

/// Runs the authentication exchange up to AuthenticationOk.
async fn authenticate(
    wire: &mut Wire,
    info: &ConnInfo,
    channel_binding: Option<Vec<u8>>,
) -> Result<(), StartupError> {
    let password = || {
        info.password
            .as_deref()
            .ok_or(StartupError::PasswordRequired)
    };
    let unsupported = |method: &str| Err(StartupError::UnsupportedAuth(method.to_owned()));
    let mut scram: Option<ScramSha256> = None;
    let mut channel_binding = channel_binding;
    loop {
        let message = match wire.expect_message().await? {
            Backend::Message(Message::ErrorResponse(e)) => return Err(server_error(&e).into()),
            Backend::Message(Message::NoticeResponse(n)) => {
                log_notice(&n);
                continue;
            }
            Backend::UnknownAuthentication(code) => {
                return unsupported(&format!("authentication request code {code}"))
            }
            Backend::Message(m) => m,
            other => {
                return Err(
                    protocol(format!("unexpected {} during authentication", other.name())).into(),
                )
            }
        };
        match message {
            Message::AuthenticationOk => {
                if scram.is_some() {
                    return Err(protocol(
                        "the server skipped the end of the SCRAM exchange (possible spoofing)",
                    )
                    .into());
                }
                return Ok(());
            }
            Message::AuthenticationCleartextPassword => {
                frontend::password_message(password()?.as_bytes(), wire.write_buf())?;
                wire.flush_out().await?;
            }
            Message::AuthenticationMd5Password(body) => {
                let hash = md5_hash(info.user.as_bytes(), password()?.as_bytes(), body.salt());
                frontend::password_message(hash.as_bytes(), wire.write_buf())?;
                wire.flush_out().await?;
            }
            Message::AuthenticationSasl(body) => {
                let mechanisms: Vec<&str> = body
                    .mechanisms()
                    .collect()
                    .map_err(|e| protocol(format!("malformed AuthenticationSASL message: {e}")))?;
                let has = |m: &str| mechanisms.contains(&m);
                let (mechanism, binding) = match channel_binding.take() {
                    Some(data) if has(sasl::SCRAM_SHA_256_PLUS) => (
                        sasl::SCRAM_SHA_256_PLUS,
                        ChannelBinding::tls_server_end_point(data),
                    ),
                    Some(_) if has(sasl::SCRAM_SHA_256) => {
                        (sasl::SCRAM_SHA_256, ChannelBinding::unrequested())
                    }
                    None if has(sasl::SCRAM_SHA_256) => {
                        (sasl::SCRAM_SHA_256, ChannelBinding::unsupported())
                    }
                    _ => return unsupported(&format!("SASL mechanisms {}", mechanisms.join(", "))),
                };
                tracing::debug!(mechanism, "SASL authentication");
                let client = ScramSha256::new(password()?.as_bytes(), binding);
                frontend::sasl_initial_response(mechanism, client.message(), wire.write_buf())?;
                wire.flush_out().await?;
                scram = Some(client);
            }
            Message::AuthenticationSaslContinue(body) => {
                let client = scram
                    .as_mut()
                    .ok_or_else(|| protocol("unexpected AuthenticationSASLContinue"))?;
                client
                    .update(body.data())
                    .map_err(|e| protocol(format!("SCRAM: {e}")))?;
                frontend::sasl_response(client.message(), wire.write_buf())?;
                wire.flush_out().await?;
            }
            Message::AuthenticationSaslFinal(body) => {
                let mut client = scram
                    .take()
                    .ok_or_else(|| protocol("unexpected AuthenticationSASLFinal"))?;
                client
                    .finish(body.data())
                    .map_err(|e| protocol(format!("SCRAM server signature: {e}")))?;
            }
            Message::AuthenticationKerberosV5 => return unsupported("Kerberos V5"),
            Message::AuthenticationScmCredential => return unsupported("SCM credentials"),
            Message::AuthenticationGss | Message::AuthenticationGssContinue(_) => {
                return unsupported("GSSAPI")
            }
            Message::AuthenticationSspi => return unsupported("SSPI"),
            other => {
                return Err(protocol(format!(
                    "unexpected {} during authentication",
                    Backend::Message(other).name()
                ))
                .into())
            }
        }
    }
}
