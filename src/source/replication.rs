//! PostgreSQL logical replication client: the wire protocol of a `replication=database`
//! connection, on top of `postgres-protocol` (message encoding, md5, SCRAM) and tokio.
//!
//! # Why our own client
//! tokio-postgres 0.7 cannot open a replication connection (it rejects `replication=database`
//! and does not know CopyBoth); the rust-postgres forks that can (Materialize's, used by
//! supabase/etl) are not published on crates.io. `pgwire-replication` exists but is young and
//! decodes only Begin/Commit. The protocol subset walbox needs is small, and owning it keeps the
//! hot path under our control: no per-message allocation or copy between the socket and the
//! pgoutput decoder.
//!
//! # Data flow
//! ```text
//! socket ──read_buf──▶ BytesMut (≥ 64 KiB) ──split_to(frame).freeze()──▶ XLogData.data: Bytes
//!                                                              (zero-copy slice of the read buffer)
//! StandbyStatus ──▶ 39-byte CopyData('r') ──write──▶ socket (no write buffering)
//! ```
//! A frame is `tag: u8, length: i32` (length includes itself), then the body. The XLogData payload
//! handed out is a slice of the read buffer's allocation, so a consumer that holds on to many
//! payloads keeps their read chunks alive; that is the price of not copying ~200k messages/s.
//!
//! # Invariants
//! * [`ReplicationStream::next`] is cancel-safe: all bytes read live in the stream's own
//!   `BytesMut`; a frame is taken out only once complete, synchronously. Dropping the future (e.g.
//!   in `tokio::select!`) loses nothing.
//! * [`ReplicationStream::send_status`] keeps unsent bytes in its own buffer: if its future is
//!   dropped, the rest of the message goes out first on the next call, so the stream never carries
//!   half a message.
//! * The other methods are not cancel-safe; a [`ReplicationConnection`] whose operation was
//!   cancelled refuses further commands ([`ReplicationError::Protocol`]) instead of reading a
//!   stale answer.
//! * Wire bytes are never trusted: every read is bounds-checked and malformed input is a
//!   [`ReplicationError::Protocol`], never a panic.
//! * An `ErrorResponse` anywhere becomes [`ReplicationError::Server`] with its SQLSTATE;
//!   `NoticeResponse`s are logged at debug level and skipped.
//! * Unix sockets never use TLS. With `sslmode=prefer`, a refused or failed TLS negotiation falls
//!   back to plaintext (libpq's behaviour); every other mode fails instead.
//! * Nothing here decides which LSN is safe to confirm: callers send [`StandbyStatus`] explicitly
//!   (see the protocol notes: XLogData's `wal_end` is not a safe confirmation point).

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{self, ChannelBinding, ScramSha256};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpSocket, TcpStream, UnixStream};
use tokio_openssl::SslStream;

use crate::config::conninfo::{ConnInfo, Host, SslMode};
use crate::failure::{Classify, Failure};
use crate::lsn::Lsn;
use crate::pg::tls::{self, TlsConfig, TlsError};

/// Bytes reserved for the read buffer at a time (the buffer grows beyond it for large frames).
const READ_CHUNK: usize = 128 * 1024;
/// Below this much free space the read buffer reserves a new chunk before reading.
const MIN_READ_SPACE: usize = 16 * 1024;
/// Seconds from the Unix epoch to PostgreSQL's epoch, 2000-01-01 00:00:00 UTC.
const PG_EPOCH_UNIX_SECS: u64 = 946_684_800;
/// How long [`ReplicationStream::finish`] waits for the server to end the copy.
const FINISH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a failing command waits for ReadyForQuery before closing the socket.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// An `ErrorResponse` from the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DbError {
    /// `ERROR`, `FATAL` or `PANIC` (the non-localized severity when the server sends it).
    pub severity: String,
    /// SQLSTATE, e.g. `55006` (object in use).
    pub code: String,
    /// Primary message.
    pub message: String,
    /// Optional detail.
    pub detail: Option<String>,
    /// Optional hint.
    pub hint: Option<String>,
}

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.severity, self.code, self.message)?;
        if let Some(detail) = &self.detail {
            write!(f, " (detail: {detail})")?;
        }
        if let Some(hint) = &self.hint {
            write!(f, " (hint: {hint})")?;
        }
        Ok(())
    }
}

impl std::error::Error for DbError {}

/// Errors of the replication connection.
#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    /// Reading or writing the socket failed.
    #[error("replication connection I/O error: {0}")]
    Io(#[from] io::Error),
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
    /// The server sent an `ErrorResponse`.
    #[error("PostgreSQL: {0}")]
    Server(DbError),
    /// The server asked for an authentication method walbox does not implement.
    #[error("unsupported authentication method: {0}")]
    UnsupportedAuth(String),
    /// The server asked for a password and the connection string has none.
    #[error("the server requires a password and none was given")]
    PasswordRequired,
    /// The server sent something that does not follow the protocol, or a command was issued on a
    /// connection left in an unknown state.
    #[error("replication protocol error: {0}")]
    Protocol(String),
    /// `connect_timeout` (or the bound of [`ReplicationStream::finish`]) elapsed.
    #[error("timed out")]
    Timeout,
    /// The server closed the connection without ending the command or stream cleanly.
    #[error("the server closed the replication connection unexpectedly")]
    ConnectionClosed,
}

impl Classify for ReplicationError {
    fn failure(&self) -> Option<Failure> {
        match self {
            ReplicationError::Tls(t) => t.failure(),
            ReplicationError::UnsupportedAuth(_) | ReplicationError::PasswordRequired => {
                Some(Failure::Auth)
            }
            ReplicationError::Protocol(_) => Some(Failure::Internal),
            e => e
                .sqlstate()
                .and_then(|code| Failure::from_sqlstate(code, &e.to_string())),
        }
    }
}

impl ReplicationError {
    /// The SQLSTATE of a server error (`55006`: slot active elsewhere; `55000`: slot invalidated;
    /// `58P01`: WAL removed; `57P01`: terminated by an administrator; `28P01`: wrong password).
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            ReplicationError::Server(e) => Some(&e.code),
            _ => None,
        }
    }

    /// The server's error, if this is one.
    pub fn db_error(&self) -> Option<&DbError> {
        match self {
            ReplicationError::Server(e) => Some(e),
            _ => None,
        }
    }
}

fn protocol(msg: impl Into<String>) -> ReplicationError {
    ReplicationError::Protocol(msg.into())
}

/// Result of `IDENTIFY_SYSTEM`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SystemIdentity {
    /// The cluster's unique system identifier (a decimal number).
    pub system_id: String,
    /// Current timeline.
    pub timeline: u32,
    /// Current WAL flush position.
    pub xlogpos: Lsn,
    /// Database of the connection (`None` on a physical replication connection).
    pub dbname: Option<String>,
}

/// A message of the replication stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicationMessage {
    /// WAL data: one pgoutput message.
    XLogData {
        /// LSN of the change (0 for messages written before it, e.g. Relation).
        wal_start: Lsn,
        /// For logical replication equal to `wal_start`: not the server's WAL end.
        wal_end: Lsn,
        /// Server clock, µs since 2000-01-01 UTC.
        send_time: i64,
        /// The pgoutput message, a zero-copy slice of the read buffer.
        data: Bytes,
    },
    /// Primary keepalive.
    Keepalive {
        /// How far the walsender has decoded (`sentPtr`).
        wal_end: Lsn,
        /// Server clock, µs since 2000-01-01 UTC.
        send_time: i64,
        /// The server wants a status update now (or it ends the connection after
        /// `wal_sender_timeout`).
        reply_requested: bool,
    },
}

/// A standby status update. For a logical slot only `flush` matters: it becomes the slot's
/// `confirmed_flush_lsn`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StandbyStatus {
    /// Received position (informational).
    pub write: Lsn,
    /// Durably processed position: everything before it may be discarded by the server.
    pub flush: Lsn,
    /// Applied position (informational).
    pub apply: Lsn,
    /// Ask the server to answer with a keepalive at once.
    pub reply_requested: bool,
}

/// The transport: plain TCP, Unix socket, or TLS over TCP.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(SslStream<TcpStream>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// One backend message: its tag and body (without tag and length).
struct Frame {
    tag: u8,
    body: BytesMut,
}

/// Takes one complete frame off the front of `buf`, or `None` if more bytes are needed (then
/// reserves room for the rest of the frame). Synchronous, so cancel-safe callers stay cancel-safe.
fn split_frame(buf: &mut BytesMut) -> Result<Option<Frame>, ReplicationError> {
    let Some(header) = buf.get(..5) else {
        return Ok(None);
    };
    let tag = header[0];
    let len = i32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    let len = usize::try_from(len)
        .ok()
        .filter(|l| *l >= 4)
        .ok_or_else(|| protocol(format!("invalid length {len} of message {}", tag_name(tag))))?;
    let total = len + 1;
    if buf.len() < total {
        buf.reserve(total - buf.len());
        return Ok(None);
    }
    let mut body = buf.split_to(total);
    body.advance(5);
    Ok(Some(Frame { tag, body }))
}

/// A printable name of a message tag for errors.
fn tag_name(tag: u8) -> String {
    if tag.is_ascii_graphic() {
        format!("'{}'", char::from(tag))
    } else {
        format!("0x{tag:02x}")
    }
}

/// Bounds-checked big-endian reader over a message body.
struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, what }
    }

    fn truncated(&self) -> ReplicationError {
        protocol(format!("truncated {} message", self.what))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ReplicationError> {
        if self.buf.len() < n {
            return Err(self.truncated());
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ReplicationError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, ReplicationError> {
        Ok(self.array::<1>()?[0])
    }

    fn i16(&mut self) -> Result<i16, ReplicationError> {
        Ok(i16::from_be_bytes(self.array()?))
    }

    fn i32(&mut self) -> Result<i32, ReplicationError> {
        Ok(i32::from_be_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64, ReplicationError> {
        Ok(i64::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, ReplicationError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// A NUL-terminated string (lossily decoded: server messages may be in another encoding).
    fn cstr(&mut self) -> Result<String, ReplicationError> {
        let end = self
            .buf
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| self.truncated())?;
        let s = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.buf = &self.buf[end + 1..];
        Ok(s)
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
}

/// Parses the fields of an ErrorResponse or NoticeResponse.
fn parse_error_fields(body: &[u8]) -> Result<DbError, ReplicationError> {
    let mut r = Reader::new(body, "ErrorResponse");
    let mut e = DbError {
        severity: String::new(),
        code: String::new(),
        message: String::new(),
        detail: None,
        hint: None,
    };
    let mut localized_severity = String::new();
    loop {
        let field = r.u8()?;
        if field == 0 {
            break;
        }
        let value = r.cstr()?;
        match field {
            b'S' => localized_severity = value,
            b'V' => e.severity = value,
            b'C' => e.code = value,
            b'M' => e.message = value,
            b'D' => e.detail = Some(value),
            b'H' => e.hint = Some(value),
            _ => {}
        }
    }
    if e.severity.is_empty() {
        e.severity = localized_severity;
    }
    Ok(e)
}

fn server_error(body: &[u8]) -> ReplicationError {
    match parse_error_fields(body) {
        Ok(e) => ReplicationError::Server(e),
        Err(e) => e,
    }
}

fn log_notice(body: &[u8]) {
    match parse_error_fields(body) {
        Ok(n) => tracing::debug!(
            severity = %n.severity,
            code = %n.code,
            detail = n.detail.as_deref().unwrap_or(""),
            "PostgreSQL notice: {}",
            n.message
        ),
        Err(e) => tracing::debug!(error = %e, "malformed NoticeResponse ignored"),
    }
}

/// Parses a DataRow into text values.
fn parse_data_row(body: &[u8]) -> Result<Vec<Option<String>>, ReplicationError> {
    let mut r = Reader::new(body, "DataRow");
    let n = r.i16()?;
    let n = usize::try_from(n).map_err(|_| protocol("negative DataRow column count"))?;
    let mut row = Vec::with_capacity(n);
    for _ in 0..n {
        let len = r.i32()?;
        if len == -1 {
            row.push(None);
            continue;
        }
        let len = usize::try_from(len).map_err(|_| protocol("invalid DataRow value length"))?;
        let value = std::str::from_utf8(r.take(len)?)
            .map_err(|_| protocol("DataRow value is not UTF-8"))?;
        row.push(Some(value.to_owned()));
    }
    Ok(row)
}

/// Parses a CopyData body of the replication stream. `XLogData.data` is a slice of `body`.
fn parse_copy_data(mut body: BytesMut) -> Result<ReplicationMessage, ReplicationError> {
    let mut r = Reader::new(&body, "CopyData");
    match r.u8()? {
        b'w' => {
            r.what = "XLogData";
            let wal_start = Lsn(r.u64()?);
            let wal_end = Lsn(r.u64()?);
            let send_time = r.i64()?;
            body.advance(1 + 8 + 8 + 8);
            Ok(ReplicationMessage::XLogData {
                wal_start,
                wal_end,
                send_time,
                data: body.freeze(),
            })
        }
        b'k' => {
            r.what = "primary keepalive";
            let wal_end = Lsn(r.u64()?);
            let send_time = r.i64()?;
            let reply_requested = r.u8()? != 0;
            Ok(ReplicationMessage::Keepalive {
                wal_end,
                send_time,
                reply_requested,
            })
        }
        t => Err(protocol(format!(
            "unknown replication CopyData message {}",
            tag_name(t)
        ))),
    }
}

/// Encodes a standby status update ('r' inside CopyData).
fn encode_status(status: &StandbyStatus, client_time: i64, out: &mut BytesMut) {
    out.reserve(39);
    out.put_u8(b'd');
    out.put_i32(4 + 34);
    out.put_u8(b'r');
    out.put_u64(status.write.0);
    out.put_u64(status.flush.0);
    out.put_u64(status.apply.0);
    out.put_i64(client_time);
    out.put_u8(u8::from(status.reply_requested));
}

/// Now, in µs since 2000-01-01 UTC.
fn pg_now_micros() -> i64 {
    let since_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let micros = since_unix.as_micros() as i128 - i128::from(PG_EPOCH_UNIX_SECS) * 1_000_000;
    i64::try_from(micros).unwrap_or(0)
}

/// Quotes an identifier for a replication command: `"…"`, with `"` doubled.
fn quote_ident(s: &str) -> Result<String, ReplicationError> {
    if s.contains('\0') {
        return Err(protocol("identifier contains a NUL byte"));
    }
    Ok(format!("\"{}\"", s.replace('"', "\"\"")))
}

/// Quotes a literal for a replication command: `'…'`, with `'` doubled. The replication
/// command scanner takes backslashes literally.
fn quote_literal(s: &str) -> Result<String, ReplicationError> {
    if s.contains('\0') {
        return Err(protocol("literal contains a NUL byte"));
    }
    Ok(format!("'{}'", s.replace('\'', "''")))
}

/// Parses `server_version` ("15.18 (Debian 15.18-1.pgdg120+1)", "9.6.24", "17devel") into
/// PostgreSQL's numeric form (150018, 90624, 170000).
fn parse_server_version(v: &str) -> Option<u32> {
    let token = v
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .next()?;
    let mut parts = token.split('.').map(|p| p.parse::<u32>().ok());
    let major = parts.next()??;
    let minor = parts.next().flatten().unwrap_or(0);
    let patch = parts.next().flatten().unwrap_or(0);
    if major >= 10 {
        major.checked_mul(10_000)?.checked_add(minor)
    } else {
        Some(major * 10_000 + minor * 100 + patch)
    }
}

/// Socket plus read and write buffers.
struct Wire {
    stream: Stream,
    read_buf: BytesMut,
    write_buf: BytesMut,
}

impl Wire {
    fn new(stream: Stream) -> Self {
        Wire {
            stream,
            read_buf: BytesMut::with_capacity(READ_CHUNK),
            write_buf: BytesMut::with_capacity(256),
        }
    }

    /// Next frame, `None` at a clean EOF. Cancel-safe: bytes read stay in `read_buf`.
    async fn read_frame(&mut self) -> Result<Option<Frame>, ReplicationError> {
        loop {
            if let Some(frame) = split_frame(&mut self.read_buf)? {
                return Ok(Some(frame));
            }
            if self.read_buf.capacity() - self.read_buf.len() < MIN_READ_SPACE {
                self.read_buf.reserve(READ_CHUNK);
            }
            if self.stream.read_buf(&mut self.read_buf).await? == 0 {
                if self.read_buf.is_empty() {
                    return Ok(None);
                }
                return Err(ReplicationError::ConnectionClosed);
            }
        }
    }

    /// Next frame; EOF is an error.
    async fn expect_frame(&mut self) -> Result<Frame, ReplicationError> {
        self.read_frame()
            .await?
            .ok_or(ReplicationError::ConnectionClosed)
    }

    /// Writes out `write_buf`. If the future is dropped, the unsent rest stays in `write_buf`
    /// (`AsyncWriteExt::write` writes nothing when cancelled) and goes out on the next call.
    async fn flush_out(&mut self) -> Result<(), ReplicationError> {
        while !self.write_buf.is_empty() {
            let n = self.stream.write(&self.write_buf).await?;
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::WriteZero).into());
            }
            self.write_buf.advance(n);
        }
        self.stream.flush().await?;
        Ok(())
    }

    /// After an error answer: skip to ReadyForQuery (briefly), send Terminate, shut down.
    async fn close_after_error(&mut self) {
        let drain = async {
            loop {
                match self.read_frame().await {
                    Ok(Some(f)) if f.tag == b'Z' => break,
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => return,
                }
            }
            frontend::terminate(&mut self.write_buf);
            let _ = self.flush_out().await;
            let _ = self.stream.shutdown().await;
        };
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, drain).await;
    }
}

/// A replication connection (`replication=database`) in command mode: `IDENTIFY_SYSTEM`, slot
/// commands, SQL; then [`ReplicationConnection::start_logical`] turns it into a
/// [`ReplicationStream`].
pub struct ReplicationConnection {
    wire: Wire,
    parameters: HashMap<String, String>,
    server_version_num: u32,
    backend_pid: Option<i32>,
    /// Set while a command runs; still set if its future was dropped half-way.
    busy: bool,
}

impl fmt::Debug for ReplicationConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicationConnection")
            .field("server_version_num", &self.server_version_num)
            .field("backend_pid", &self.backend_pid)
            .finish_non_exhaustive()
    }
}

impl ReplicationConnection {
    /// Connects and authenticates: TCP or Unix socket, TLS per `sslmode`, startup parameters
    /// `user`, `database`, `replication=database`, `application_name`, `client_encoding=UTF8`;
    /// trust, cleartext password, md5 or SCRAM-SHA-256 (with `tls-server-end-point` channel binding
    /// over TLS when the server offers it). The whole sequence is bounded by `connect_timeout`.
    pub async fn connect(info: &ConnInfo) -> Result<Self, ReplicationError> {
        match info.connect_timeout {
            Some(limit) => tokio::time::timeout(limit, Self::connect_inner(info))
                .await
                .map_err(|_| ReplicationError::Timeout)?,
            None => Self::connect_inner(info).await,
        }
    }

    async fn connect_inner(info: &ConnInfo) -> Result<Self, ReplicationError> {
        let tls = if info.tls_applies() {
            TlsConfig::new(info.sslmode, info.sslrootcert.as_deref())?
        } else {
            None
        };
        match Self::attempt(info, tls.as_ref()).await {
            Err(ReplicationError::Tls(
                e @ (TlsError::Handshake(_) | TlsError::CertificateRejected(_)),
            )) if info.sslmode == SslMode::Prefer => {
                tracing::debug!(
                    error = %e,
                    "TLS handshake failed with sslmode=prefer; retrying without TLS"
                );
                Self::attempt(info, None).await
            }
            other => other,
        }
    }

    async fn attempt(info: &ConnInfo, tls: Option<&TlsConfig>) -> Result<Self, ReplicationError> {
        let (stream, channel_binding) = open_stream(info, tls).await?;
        let mut wire = Wire::new(stream);
        frontend::startup_message(
            [
                ("user", info.user.as_str()),
                ("database", info.dbname.as_str()),
                ("replication", "database"),
                ("application_name", info.application_name.as_str()),
                ("client_encoding", "UTF8"),
            ],
            &mut wire.write_buf,
        )?;
        wire.flush_out().await?;
        authenticate(&mut wire, info, channel_binding).await?;

        let mut parameters = HashMap::new();
        let mut backend_pid = None;
        loop {
            let frame = wire.expect_frame().await?;
            let mut r = Reader::new(&frame.body, "startup");
            match frame.tag {
                b'S' => {
                    let name = r.cstr()?;
                    let value = r.cstr()?;
                    parameters.insert(name, value);
                }
                b'K' => backend_pid = Some(r.i32()?),
                b'Z' => break,
                b'E' => return Err(server_error(&frame.body)),
                b'N' => log_notice(&frame.body),
                t => {
                    return Err(protocol(format!(
                        "unexpected message {} during startup",
                        tag_name(t)
                    )))
                }
            }
        }
        let version = parameters
            .get("server_version")
            .ok_or_else(|| protocol("the server did not report server_version"))?;
        let server_version_num = parse_server_version(version)
            .ok_or_else(|| protocol(format!("cannot parse server_version {version:?}")))?;
        Ok(ReplicationConnection {
            wire,
            parameters,
            server_version_num,
            backend_pid,
            busy: false,
        })
    }

    /// The server version in `server_version_num` form, e.g. 150018 for 15.18.
    pub fn server_version_num(&self) -> u32 {
        self.server_version_num
    }

    /// A parameter the server reported (`server_version`, `server_encoding`, `TimeZone`, …).
    pub fn parameter(&self, name: &str) -> Option<&str> {
        self.parameters.get(name).map(String::as_str)
    }

    /// The walsender's process id (`pg_stat_replication.pid`), if the server sent it.
    pub fn backend_pid(&self) -> Option<i32> {
        self.backend_pid
    }

    fn begin(&mut self) -> Result<(), ReplicationError> {
        if self.busy {
            return Err(protocol(
                "an earlier command was cancelled or failed mid-way, leaving the connection in \
                 an unknown state; reconnect",
            ));
        }
        self.busy = true;
        Ok(())
    }

    /// Runs a simple-protocol query (a replication command or SQL) and returns the rows of all
    /// its result sets as text. An `ErrorResponse` is returned as [`ReplicationError::Server`]
    /// after the server is ready again, so the connection stays usable. Not for commands that
    /// start a copy (`START_REPLICATION`): use [`ReplicationConnection::start_logical`].
    pub async fn simple_query(
        &mut self,
        sql: &str,
    ) -> Result<Vec<Vec<Option<String>>>, ReplicationError> {
        self.begin()?;
        frontend::query(sql, &mut self.wire.write_buf)?;
        self.wire.flush_out().await?;
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            let frame = self.wire.expect_frame().await?;
            match frame.tag {
                b'T' | b'C' | b'I' => {}
                b'D' => rows.push(parse_data_row(&frame.body)?),
                b'E' => {
                    if error.is_none() {
                        error = Some(server_error(&frame.body));
                    }
                }
                b'N' => log_notice(&frame.body),
                b'S' => {
                    let mut r = Reader::new(&frame.body, "ParameterStatus");
                    let name = r.cstr()?;
                    let value = r.cstr()?;
                    self.parameters.insert(name, value);
                }
                b'Z' => {
                    self.busy = false;
                    return match error {
                        Some(e) => Err(e),
                        None => Ok(rows),
                    };
                }
                b'W' | b'H' | b'G' => {
                    return Err(protocol(
                        "the command started a copy; use start_logical for START_REPLICATION",
                    ))
                }
                t => {
                    return Err(protocol(format!(
                        "unexpected message {} in a query response",
                        tag_name(t)
                    )))
                }
            }
        }
    }

    /// `IDENTIFY_SYSTEM`.
    pub async fn identify_system(&mut self) -> Result<SystemIdentity, ReplicationError> {
        let rows = self.simple_query("IDENTIFY_SYSTEM").await?;
        let row = rows
            .first()
            .filter(|r| r.len() >= 4)
            .ok_or_else(|| protocol("IDENTIFY_SYSTEM returned no row of 4 columns"))?;
        let col = |i: usize, name: &str| {
            row[i]
                .clone()
                .ok_or_else(|| protocol(format!("IDENTIFY_SYSTEM returned a NULL {name}")))
        };
        let timeline = col(1, "timeline")?;
        let xlogpos = col(2, "xlogpos")?;
        Ok(SystemIdentity {
            system_id: col(0, "systemid")?,
            timeline: timeline
                .parse()
                .map_err(|_| protocol(format!("invalid timeline {timeline:?}")))?,
            xlogpos: xlogpos
                .parse()
                .map_err(|_| protocol(format!("invalid xlogpos {xlogpos:?}")))?,
            dbname: row[3].clone(),
        })
    }

    /// Creates a logical slot using pgoutput, without exporting a snapshot
    /// (`(SNAPSHOT 'nothing')` on PostgreSQL ≥ 15, `NOEXPORT_SNAPSHOT` before), and returns its
    /// `consistent_point`: changes committed after it will be streamed. Waits for transactions
    /// already running on the server to finish.
    pub async fn create_logical_slot(&mut self, slot: &str) -> Result<Lsn, ReplicationError> {
        let sql = if self.server_version_num >= 150_000 {
            format!(
                "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT 'nothing')",
                quote_ident(slot)?
            )
        } else {
            format!(
                "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput NOEXPORT_SNAPSHOT",
                quote_ident(slot)?
            )
        };
        let rows = self.simple_query(&sql).await?;
        let point = rows
            .first()
            .and_then(|r| r.get(1))
            .cloned()
            .flatten()
            .ok_or_else(|| protocol("CREATE_REPLICATION_SLOT returned no consistent_point"))?;
        point
            .parse()
            .map_err(|_| protocol(format!("invalid consistent_point {point:?}")))
    }

    /// `START_REPLICATION SLOT "slot" LOGICAL start ("key" 'value', …)`. With `start` = `0/0`
    /// the server resumes at the slot's `confirmed_flush_lsn`. On a server error (e.g. SQLSTATE
    /// `55006`, slot active for another process) the connection is closed and the error returned.
    pub async fn start_logical(
        mut self,
        slot: &str,
        start: Lsn,
        options: &[(&str, &str)],
    ) -> Result<ReplicationStream, ReplicationError> {
        let mut sql = format!(
            "START_REPLICATION SLOT {} LOGICAL {start}",
            quote_ident(slot)?
        );
        if !options.is_empty() {
            let opts = options
                .iter()
                .map(|(k, v)| Ok(format!("{} {}", quote_ident(k)?, quote_literal(v)?)))
                .collect::<Result<Vec<_>, ReplicationError>>()?;
            sql.push_str(" (");
            sql.push_str(&opts.join(", "));
            sql.push(')');
        }
        self.begin()?;
        frontend::query(&sql, &mut self.wire.write_buf)?;
        self.wire.flush_out().await?;
        loop {
            let frame = self.wire.expect_frame().await?;
            match frame.tag {
                b'W' => {
                    // CopyBothResponse: format i8, column count i16, formats.
                    let mut r = Reader::new(&frame.body, "CopyBothResponse");
                    r.u8()?;
                    r.i16()?;
                    break;
                }
                b'E' => {
                    let e = server_error(&frame.body);
                    self.wire.close_after_error().await;
                    return Err(e);
                }
                b'N' => log_notice(&frame.body),
                b'S' => {}
                t => {
                    return Err(protocol(format!(
                        "unexpected message {} in response to START_REPLICATION",
                        tag_name(t)
                    )))
                }
            }
        }
        Ok(ReplicationStream {
            wire: self.wire,
            ended: false,
        })
    }

    /// Ends the session politely (Terminate, then close the socket).
    pub async fn close(mut self) -> Result<(), ReplicationError> {
        frontend::terminate(&mut self.wire.write_buf);
        self.wire.flush_out().await?;
        self.wire.stream.shutdown().await?;
        Ok(())
    }
}

/// A replication connection in CopyBoth mode, streaming XLogData and keepalives.
pub struct ReplicationStream {
    wire: Wire,
    /// The server ended the copy (CopyDone or CommandComplete seen).
    ended: bool,
}

impl fmt::Debug for ReplicationStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicationStream")
            .field("buffered", &self.wire.read_buf.len())
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl ReplicationStream {
    /// Next message from the server. MUST stay cancel-safe (it is used inside
    /// `tokio::select!`): read bytes are kept in the stream's buffer, frames are taken out only
    /// when complete. `None` = the server ended the copy stream cleanly (CopyDone or
    /// CommandComplete, e.g. at a server shutdown after everything was sent); an EOF without
    /// that is [`ReplicationError::ConnectionClosed`].
    pub async fn next(&mut self) -> Result<Option<ReplicationMessage>, ReplicationError> {
        if self.ended {
            return Ok(None);
        }
        loop {
            let Some(frame) = self.wire.read_frame().await? else {
                return if self.ended {
                    Ok(None)
                } else {
                    Err(ReplicationError::ConnectionClosed)
                };
            };
            if let Some(result) = self.handle_frame(frame) {
                return result;
            }
        }
    }

    /// The next message already received and buffered, without waiting for the socket:
    /// `Ok(None)` when nothing complete is buffered (or the stream ended; [`Self::next`] then
    /// says so). Lets the relay work through a burst of messages in one go.
    pub fn next_buffered(&mut self) -> Result<Option<ReplicationMessage>, ReplicationError> {
        while let Some(frame) = split_frame(&mut self.wire.read_buf)? {
            if let Some(result) = self.handle_frame(frame) {
                return result;
            }
        }
        Ok(None)
    }

    /// One frame of the copy stream: `None` for frames that carry nothing for the caller.
    fn handle_frame(
        &mut self,
        frame: Frame,
    ) -> Option<Result<Option<ReplicationMessage>, ReplicationError>> {
        match frame.tag {
            b'd' => Some(parse_copy_data(frame.body).map(Some)),
            b'c' | b'C' | b'Z' => {
                self.ended = true;
                Some(Ok(None))
            }
            b'E' => Some(Err(server_error(&frame.body))),
            b'N' => {
                log_notice(&frame.body);
                None
            }
            b'S' => None,
            t => Some(Err(protocol(format!(
                "unexpected message {} in the replication stream",
                tag_name(t)
            )))),
        }
    }

    /// Sends a standby status update; `clientTime` is now. Written straight to the socket; if the
    /// future is dropped, the unsent rest goes out first on the next call.
    pub async fn send_status(&mut self, status: StandbyStatus) -> Result<(), ReplicationError> {
        encode_status(&status, pg_now_micros(), &mut self.wire.write_buf);
        self.wire.flush_out().await
    }

    /// Ends streaming: sends CopyDone, discards what the server still sends until ReadyForQuery
    /// or EOF (at most 10 s), then sends Terminate and closes the socket. Send the final status
    /// update before calling this.
    pub async fn finish(mut self) -> Result<(), ReplicationError> {
        frontend::copy_done(&mut self.wire.write_buf);
        self.wire.flush_out().await?;
        let wire = &mut self.wire;
        let drained = tokio::time::timeout(FINISH_TIMEOUT, async {
            loop {
                match wire.read_frame().await? {
                    None => return Ok(false),
                    Some(f) if f.tag == b'Z' => return Ok(true),
                    Some(f) if f.tag == b'E' => return Err(server_error(&f.body)),
                    Some(_) => {}
                }
            }
        })
        .await;
        let open = matches!(drained, Ok(Ok(true)));
        if open {
            frontend::terminate(&mut self.wire.write_buf);
            let close = async {
                self.wire.flush_out().await?;
                self.wire.stream.shutdown().await?;
                Ok::<_, ReplicationError>(())
            };
            if let Ok(Err(e)) = tokio::time::timeout(CLOSE_TIMEOUT, close).await {
                tracing::debug!(error = %e, "closing the replication connection");
            }
        }
        match drained {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ReplicationError::Timeout),
        }
    }
}

/// Opens the socket and negotiates TLS. Returns the channel binding data when TLS is up.
async fn open_stream(
    info: &ConnInfo,
    tls: Option<&TlsConfig>,
) -> Result<(Stream, Option<Vec<u8>>), ReplicationError> {
    let host = match &info.host {
        Host::Unix(_) => {
            let path = info.unix_socket_path().unwrap_or_default();
            let stream =
                UnixStream::connect(&path)
                    .await
                    .map_err(|source| ReplicationError::Connect {
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
        )),
        t => Err(protocol(format!(
            "unexpected answer {} to the SSLRequest",
            tag_name(t)
        ))),
    }
}

/// Resolves `host` and connects to the first address that answers, with TCP keepalive and
/// `TCP_NODELAY` on.
async fn connect_tcp(host: &str, port: u16) -> Result<TcpStream, ReplicationError> {
    let target = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let addrs = tokio::net::lookup_host((host, port))
        .await
        .map_err(|source| ReplicationError::Connect {
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
    Err(ReplicationError::Connect {
        addr: target,
        source: last,
    })
}

/// Runs the authentication exchange up to AuthenticationOk.
async fn authenticate(
    wire: &mut Wire,
    info: &ConnInfo,
    channel_binding: Option<Vec<u8>>,
) -> Result<(), ReplicationError> {
    let password = || {
        info.password
            .as_deref()
            .ok_or(ReplicationError::PasswordRequired)
    };
    let mut scram: Option<ScramSha256> = None;
    let mut channel_binding = channel_binding;
    loop {
        let frame = wire.expect_frame().await?;
        match frame.tag {
            b'R' => {}
            b'E' => return Err(server_error(&frame.body)),
            b'N' => {
                log_notice(&frame.body);
                continue;
            }
            t => {
                return Err(protocol(format!(
                    "unexpected message {} during authentication",
                    tag_name(t)
                )))
            }
        }
        let mut r = Reader::new(&frame.body, "Authentication");
        match r.i32()? {
            0 => {
                if scram.is_some() {
                    return Err(protocol(
                        "the server skipped the end of the SCRAM exchange (possible spoofing)",
                    ));
                }
                return Ok(());
            }
            3 => {
                frontend::password_message(password()?.as_bytes(), &mut wire.write_buf)?;
                wire.flush_out().await?;
            }
            5 => {
                let salt = r.array::<4>()?;
                let hash = md5_hash(info.user.as_bytes(), password()?.as_bytes(), salt);
                frontend::password_message(hash.as_bytes(), &mut wire.write_buf)?;
                wire.flush_out().await?;
            }
            10 => {
                let mut mechanisms = Vec::new();
                loop {
                    let m = r.cstr()?;
                    if m.is_empty() {
                        break;
                    }
                    mechanisms.push(m);
                }
                let has = |m: &str| mechanisms.iter().any(|x| x == m);
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
                    _ => {
                        return Err(ReplicationError::UnsupportedAuth(format!(
                            "SASL mechanisms {}",
                            mechanisms.join(", ")
                        )))
                    }
                };
                tracing::debug!(mechanism, "SASL authentication");
                let client = ScramSha256::new(password()?.as_bytes(), binding);
                frontend::sasl_initial_response(mechanism, client.message(), &mut wire.write_buf)?;
                wire.flush_out().await?;
                scram = Some(client);
            }
            11 => {
                let client = scram
                    .as_mut()
                    .ok_or_else(|| protocol("unexpected AuthenticationSASLContinue"))?;
                client
                    .update(r.rest())
                    .map_err(|e| protocol(format!("SCRAM: {e}")))?;
                frontend::sasl_response(client.message(), &mut wire.write_buf)?;
                wire.flush_out().await?;
            }
            12 => {
                let mut client = scram
                    .take()
                    .ok_or_else(|| protocol("unexpected AuthenticationSASLFinal"))?;
                client
                    .finish(r.rest())
                    .map_err(|e| protocol(format!("SCRAM server signature: {e}")))?;
            }
            2 => return Err(ReplicationError::UnsupportedAuth("Kerberos V5".into())),
            6 => return Err(ReplicationError::UnsupportedAuth("SCM credentials".into())),
            7 | 8 => return Err(ReplicationError::UnsupportedAuth("GSSAPI".into())),
            9 => return Err(ReplicationError::UnsupportedAuth("SSPI".into())),
            code => {
                return Err(ReplicationError::UnsupportedAuth(format!(
                    "authentication request code {code}"
                )))
            }
        }
    }
}

#[cfg(test)]
#[path = "replication_tests.rs"]
mod tests;
