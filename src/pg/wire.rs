//! The framed connection of walbox's own PostgreSQL protocol clients (today the replication
//! connection; tokio-postgres serves the ordinary ones): the socket ([`Stream`]: TCP, Unix or
//! TLS), a read buffer that yields whole backend messages, a write buffer, and what every client
//! does with `ErrorResponse`, `NoticeResponse` and `DataRow`.
//!
//! # Parsing
//! A backend message is `tag: u8, length: i32` (the length counts itself), then the body.
//! [`parse_backend`] checks the header (postgres-protocol's `Header`), waits until the whole
//! message is buffered, and hands it to `postgres_protocol::message::backend::Message::parse`,
//! which knows every backend message except `CopyBothResponse` (`'W'`, the answer to
//! `START_REPLICATION`); that one is parsed here ([`CopyBothResponse`]). So are authentication
//! requests whose code postgres-protocol does not know, to report them as an unsupported method
//! rather than as garbage ([`Backend::UnknownAuthentication`]).
//!
//! A message is split off the read buffer (`BytesMut::split_to`, then `freeze`), never copied: a
//! `CopyData` body (`CopyDataBody::into_bytes`) is a slice of the read buffer's allocation, so the
//! replication stream's payloads reach the pgoutput decoder without a copy. The price: whoever
//! holds on to payloads keeps their read chunks alive.
//!
//! # Invariants
//! * Reading is cancel-safe: [`Wire::read_message`] keeps every byte it read in the wire's own
//!   buffer and takes a message out only once it is complete, synchronously, so dropping its
//!   future (e.g. in `tokio::select!`) loses nothing.
//! * Writing keeps unsent bytes: messages are encoded into the wire's write buffer and
//!   [`Wire::flush_out`] removes only what the socket accepted. If its future is dropped, the
//!   rest goes out first on the next call, so the socket never carries half a message followed
//!   by another.
//! * Wire bytes are never trusted: a length below 4 (negative included) is an error, every body is
//!   parsed with bounds checks (postgres-protocol's, or ours for `'W'`), and malformed input is a
//!   [`WireError::Protocol`], never a panic. After such an error the connection is unusable (the
//!   malformed message has been consumed, the stream position is unknown): callers drop it.
//! * An `ErrorResponse` becomes [`WireError::Server`] with its SQLSTATE ([`server_error`]);
//!   `NoticeResponse`s are logged at debug level ([`log_notice`]) and otherwise ignored; on the
//!   replication stream a `WARNING` is logged at WARN level ([`NoticeLog`]).

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use postgres_protocol::message::backend::{
    DataRowBody, ErrorFields, ErrorResponseBody, Header, Message, NoticeResponseBody,
    AUTHENTICATION_TAG,
};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_openssl::SslStream;
use tokio_postgres::fallible_iterator::FallibleIterator;

use crate::failure::{Classify, Failure};

/// Bytes reserved for the read buffer at a time (the buffer grows beyond it for large messages).
const READ_CHUNK: usize = 128 * 1024;
/// Below this much free space the read buffer reserves a new chunk before reading.
const MIN_READ_SPACE: usize = 16 * 1024;
/// How long closing a connection (after an error, or after a copy ended) may take.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// The tag of `CopyBothResponse`, which postgres-protocol does not parse.
pub const COPY_BOTH_RESPONSE_TAG: u8 = b'W';
/// Authentication request codes postgres-protocol parses (`AuthenticationOk` … `SASLFinal`).
const KNOWN_AUTH_CODES: [i32; 11] = [0, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12];

/// An `ErrorResponse` (or the fields of a `NoticeResponse`) from the server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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

impl DbError {
    /// Collects the fields of an `ErrorResponse` or `NoticeResponse`. Values are decoded lossily:
    /// a server may report errors in another encoding than the client's (e.g. before
    /// `client_encoding` applies).
    pub fn from_fields(mut fields: ErrorFields<'_>) -> Result<DbError, WireError> {
        let mut e = DbError::default();
        let mut localized_severity = String::new();
        while let Some(field) = fields
            .next()
            .map_err(|err| malformed("ErrorResponse/NoticeResponse", &err))?
        {
            let value = String::from_utf8_lossy(field.value_bytes()).into_owned();
            match field.type_() {
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
}

/// Errors of the framed connection.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Reading or writing the socket failed.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// The server sent an `ErrorResponse`.
    #[error("PostgreSQL: {0}")]
    Server(Box<DbError>),
    /// The server sent something that does not follow the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server closed the connection in the middle of a message or an exchange.
    #[error("the server closed the connection unexpectedly")]
    ConnectionClosed,
}

impl Classify for WireError {
    fn failure(&self) -> Option<Failure> {
        match self {
            WireError::Server(e) => crate::failure::sqlstate(&e.code, &self.to_string()).fatal(),
            WireError::Protocol(_) => Some(Failure::Internal),
            WireError::Io(_) | WireError::ConnectionClosed => None,
        }
    }
}

/// A [`WireError::Protocol`].
pub fn protocol(msg: impl Into<String>) -> WireError {
    WireError::Protocol(msg.into())
}

/// A parser's complaint about a message as a [`WireError::Protocol`].
fn malformed(what: &str, e: &io::Error) -> WireError {
    protocol(format!("malformed {what} message: {e}"))
}

/// A printable name of a message tag for errors.
pub fn tag_name(tag: u8) -> String {
    if tag.is_ascii_graphic() {
        format!("'{}'", char::from(tag))
    } else {
        format!("0x{tag:02x}")
    }
}

/// `CopyBothResponse`: the server starts a copy in both directions (`START_REPLICATION`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyBothResponse {
    /// 0: textual, 1: binary (always 0 for replication).
    pub format: u8,
    /// The format of each column (none for replication).
    pub column_formats: Vec<i16>,
}

impl CopyBothResponse {
    /// Parses the body (after tag and length): format `i8`, column count `i16`, one `i16` format
    /// per column, nothing after.
    pub fn parse(mut body: &[u8]) -> Result<Self, WireError> {
        let truncated = |_| protocol("truncated CopyBothResponse message");
        let format = body.try_get_u8().map_err(truncated)?;
        let count = body.try_get_i16().map_err(truncated)?;
        let count = usize::try_from(count)
            .map_err(|_| protocol(format!("CopyBothResponse with {count} columns")))?;
        let column_formats = (0..count)
            .map(|_| body.try_get_i16().map_err(truncated))
            .collect::<Result<Vec<_>, _>>()?;
        if !body.is_empty() {
            return Err(protocol("CopyBothResponse message longer than its columns"));
        }
        Ok(CopyBothResponse {
            format,
            column_formats,
        })
    }
}

/// One backend message.
pub enum Backend {
    /// Anything postgres-protocol parses.
    Message(Message),
    /// `CopyBothResponse` (`'W'`).
    CopyBothResponse(CopyBothResponse),
    /// An authentication request with a code postgres-protocol does not know.
    UnknownAuthentication(i32),
}

impl Backend {
    /// The message's name, for errors ("unexpected RowDescription in …").
    pub fn name(&self) -> &'static str {
        let m = match self {
            Backend::Message(m) => m,
            Backend::CopyBothResponse(_) => return "CopyBothResponse",
            Backend::UnknownAuthentication(_) => return "Authentication",
        };
        match m {
            Message::AuthenticationCleartextPassword
            | Message::AuthenticationGss
            | Message::AuthenticationKerberosV5
            | Message::AuthenticationMd5Password(_)
            | Message::AuthenticationOk
            | Message::AuthenticationScmCredential
            | Message::AuthenticationSspi
            | Message::AuthenticationGssContinue(_)
            | Message::AuthenticationSasl(_)
            | Message::AuthenticationSaslContinue(_)
            | Message::AuthenticationSaslFinal(_) => "Authentication",
            Message::BackendKeyData(_) => "BackendKeyData",
            Message::BindComplete => "BindComplete",
            Message::CloseComplete => "CloseComplete",
            Message::CommandComplete(_) => "CommandComplete",
            Message::CopyData(_) => "CopyData",
            Message::CopyDone => "CopyDone",
            Message::CopyInResponse(_) => "CopyInResponse",
            Message::CopyOutResponse(_) => "CopyOutResponse",
            Message::DataRow(_) => "DataRow",
            Message::EmptyQueryResponse => "EmptyQueryResponse",
            Message::ErrorResponse(_) => "ErrorResponse",
            Message::NoData => "NoData",
            Message::NoticeResponse(_) => "NoticeResponse",
            Message::NotificationResponse(_) => "NotificationResponse",
            Message::ParameterDescription(_) => "ParameterDescription",
            Message::ParameterStatus(_) => "ParameterStatus",
            Message::ParseComplete => "ParseComplete",
            Message::PortalSuspended => "PortalSuspended",
            Message::ReadyForQuery(_) => "ReadyForQuery",
            Message::RowDescription(_) => "RowDescription",
            _ => "message",
        }
    }
}

/// Takes one complete backend message off the front of `buf`, or `None` if more bytes are needed
/// (then reserves room for the rest of the message). Synchronous, so cancel-safe callers stay
/// cancel-safe. Zero-copy: bodies are slices of `buf`'s allocation.
#[inline]
pub fn parse_backend(buf: &mut BytesMut) -> Result<Option<Backend>, WireError> {
    let header = match Header::parse(buf) {
        Ok(Some(header)) => header,
        Ok(None) => return Ok(None),
        Err(e) => {
            let tag = buf.first().copied().unwrap_or_default();
            return Err(malformed(&tag_name(tag), &e));
        }
    };
    let tag = header.tag();
    // `Header::parse` refused lengths below 4, so this is the tag plus a non-negative length.
    let total = usize::try_from(header.len())
        .map_err(|_| protocol(format!("invalid length of message {}", tag_name(tag))))?
        + 1;
    if buf.len() < total {
        buf.reserve(total - buf.len());
        return Ok(None);
    }
    if tag == COPY_BOTH_RESPONSE_TAG {
        let mut frame = buf.split_to(total);
        frame.advance(5);
        return CopyBothResponse::parse(&frame).map(|c| Some(Backend::CopyBothResponse(c)));
    }
    if tag == AUTHENTICATION_TAG {
        let code = buf.get(..total).and_then(|frame| frame.get(5..9));
        if let Some(code) = code.and_then(|c| <[u8; 4]>::try_from(c).ok()) {
            let code = i32::from_be_bytes(code);
            if !KNOWN_AUTH_CODES.contains(&code) {
                buf.advance(total);
                return Ok(Some(Backend::UnknownAuthentication(code)));
            }
        }
    }
    match Message::parse(buf) {
        Ok(Some(message)) => Ok(Some(Backend::Message(message))),
        // Cannot happen (the whole message is buffered); never panic on it either.
        Ok(None) => Err(protocol(format!(
            "message {} could not be parsed",
            tag_name(tag)
        ))),
        Err(e) => Err(malformed(&tag_name(tag), &e)),
    }
}

/// An `ErrorResponse` as a [`WireError::Server`] (or [`WireError::Protocol`] if malformed).
pub fn server_error(body: &ErrorResponseBody) -> WireError {
    match DbError::from_fields(body.fields()) {
        Ok(e) => WireError::Server(Box::new(e)),
        Err(e) => e,
    }
}

/// Logs a `NoticeResponse` at debug level.
pub fn log_notice(body: &NoticeResponseBody) {
    match DbError::from_fields(body.fields()) {
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

/// The server's notices on a long-lived connection (the replication stream, where a walsender
/// reports why it waits: a `synchronized_standby_slots` slot without its standby). A `WARNING`
/// is logged at WARN level, the same text again at most once per [`NoticeLog::REPEAT`] (with how
/// often it came meanwhile); lower severities at debug level, as [`log_notice`].
#[derive(Debug, Default)]
pub struct NoticeLog {
    /// The last warning logged, and when.
    last: Option<(String, std::time::Instant)>,
    /// How often it came again since.
    repeats: u64,
}

impl NoticeLog {
    /// How long the same warning is not logged again.
    pub const REPEAT: Duration = Duration::from_secs(60);

    /// Logs `body` (see the type's docs).
    pub fn log(&mut self, body: &NoticeResponseBody) {
        let n = match DbError::from_fields(body.fields()) {
            Ok(n) if n.severity == "WARNING" => n,
            _ => return log_notice(body),
        };
        let text = n.to_string();
        let now = std::time::Instant::now();
        if let Some((last, at)) = &self.last {
            if *last == text && now.duration_since(*at) < Self::REPEAT {
                self.repeats += 1;
                return;
            }
        }
        tracing::warn!(
            code = %n.code,
            repeated = self.repeats,
            "PostgreSQL warning on the replication connection: {text}"
        );
        self.last = Some((text, now));
        self.repeats = 0;
    }
}

/// The values of a `DataRow` as text (`None` for NULL). Values must be UTF-8 (the session's
/// `client_encoding`).
pub fn data_row_text(row: &DataRowBody) -> Result<Vec<Option<String>>, WireError> {
    let buf = row.buffer();
    let mut ranges = row.ranges();
    let mut values = Vec::with_capacity(ranges.size_hint().0.min(buf.len() / 4));
    // Offset of the next value's length: postgres-protocol reads every negative length as NULL,
    // the protocol has only -1.
    let mut next = 0;
    while let Some(range) = ranges.next().map_err(|e| malformed("DataRow", &e))? {
        let Some(range) = range else {
            if buf.get(next..next + 4) != Some(&(-1i32).to_be_bytes()[..]) {
                return Err(protocol("invalid DataRow value length"));
            }
            next += 4;
            values.push(None);
            continue;
        };
        next = range.end;
        let value = buf
            .get(range)
            .ok_or_else(|| protocol("truncated DataRow message"))?;
        let value =
            std::str::from_utf8(value).map_err(|_| protocol("DataRow value is not UTF-8"))?;
        values.push(Some(value.to_owned()));
    }
    Ok(values)
}

/// The transport: plain TCP, Unix socket, or TLS over TCP.
pub enum Stream {
    /// Plain TCP.
    Tcp(TcpStream),
    /// A Unix-domain socket (never TLS).
    Unix(UnixStream),
    /// TLS over TCP.
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

/// A socket with its read and write buffers.
pub struct Wire {
    stream: Stream,
    read_buf: BytesMut,
    write_buf: BytesMut,
}

impl Wire {
    /// Wraps a connected (and, if wanted, TLS-negotiated) socket.
    pub fn new(stream: Stream) -> Self {
        Wire {
            stream,
            read_buf: BytesMut::with_capacity(READ_CHUNK),
            write_buf: BytesMut::with_capacity(256),
        }
    }

    /// Bytes received and not yet taken out as messages.
    pub fn buffered(&self) -> usize {
        self.read_buf.len()
    }

    /// The write buffer: encode frontend messages into it (`postgres_protocol::message::frontend`),
    /// then [`Wire::flush_out`].
    pub fn write_buf(&mut self) -> &mut BytesMut {
        &mut self.write_buf
    }

    /// The next message already received, without touching the socket; `None` when no complete
    /// message is buffered.
    #[inline]
    pub fn buffered_message(&mut self) -> Result<Option<Backend>, WireError> {
        parse_backend(&mut self.read_buf)
    }

    /// The next message, `None` at a clean EOF (between messages). Cancel-safe: bytes read stay
    /// in the read buffer.
    pub async fn read_message(&mut self) -> Result<Option<Backend>, WireError> {
        loop {
            if let Some(message) = parse_backend(&mut self.read_buf)? {
                return Ok(Some(message));
            }
            if self.read_buf.capacity() - self.read_buf.len() < MIN_READ_SPACE {
                self.read_buf.reserve(READ_CHUNK);
            }
            if self.stream.read_buf(&mut self.read_buf).await? == 0 {
                if self.read_buf.is_empty() {
                    return Ok(None);
                }
                return Err(WireError::ConnectionClosed);
            }
        }
    }

    /// The next message; EOF is [`WireError::ConnectionClosed`].
    pub async fn expect_message(&mut self) -> Result<Backend, WireError> {
        self.read_message()
            .await?
            .ok_or(WireError::ConnectionClosed)
    }

    /// Writes out the write buffer. If the future is dropped, the unsent rest stays in the buffer
    /// (`AsyncWriteExt::write` writes nothing when cancelled) and goes out on the next call.
    pub async fn flush_out(&mut self) -> Result<(), WireError> {
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

    /// Ends the session politely: Terminate, then shut the socket down.
    pub async fn terminate(&mut self) -> Result<(), WireError> {
        frontend::terminate(&mut self.write_buf);
        self.flush_out().await?;
        self.stream.shutdown().await?;
        Ok(())
    }

    /// After an error answer: skips to ReadyForQuery, then terminates; all within
    /// [`CLOSE_TIMEOUT`], errors ignored (the caller reports the original error).
    pub async fn close_after_error(&mut self) {
        let drain = async {
            loop {
                match self.read_message().await {
                    Ok(Some(Backend::Message(Message::ReadyForQuery(_)))) => break,
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => return,
                }
            }
            let _ = self.terminate().await;
        };
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, drain).await;
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
pub(crate) mod tests;
