//! PostgreSQL logical replication client: the commands of a `replication=database` connection
//! ([`ReplicationConnection`]: `IDENTIFY_SYSTEM`, `CREATE_REPLICATION_SLOT`, `START_REPLICATION`,
//! SQL) and its CopyBoth stream ([`ReplicationStream`]: XLogData, keepalives, standby status
//! updates).
//!
//! # Why our own client
//! tokio-postgres 0.7 cannot open a replication connection (it rejects `replication=database`
//! and does not know CopyBoth); the rust-postgres forks that can (Materialize's, used by
//! supabase/etl) are not published on crates.io. `pgwire-replication` exists but is young and
//! decodes only Begin/Commit. The protocol subset walbox needs is small, and owning it keeps the
//! hot path under our control: no per-message allocation or copy between the socket and the
//! pgoutput decoder.
//!
//! # Layers
//! ```text
//! pg::auth        socket, TLS, StartupMessage, authentication        → Session
//! pg::wire        framed socket; postgres-protocol parses every backend message except 'W'
//! this module     replication commands; inside CopyData: 'w' XLogData and 'k' keepalive
//!                 (parsed here), 'r' standby status update (encoded here)
//! ```
//!
//! # Data flow
//! ```text
//! socket ──read_buf──▶ BytesMut (128 KiB chunks) ──Message::parse: split_to + freeze──▶ CopyData
//!        ──skip the 25-byte XLogData header──▶ XLogData.data: Bytes (zero-copy slice of the read buffer)
//! StandbyStatus ──▶ 39-byte CopyData('r') ──write──▶ socket (no write buffering)
//! ```
//! The XLogData payload handed out is a slice of the read buffer's allocation, so a consumer that
//! holds on to many payloads keeps their read chunks alive; that is the price of not copying
//! ~200k messages/s.
//!
//! # Invariants
//! * [`ReplicationStream::next`] is cancel-safe: all bytes read live in the stream's own buffer
//!   ([`Wire`]); a message is taken out only once complete, synchronously. Dropping the future
//!   (e.g. in `tokio::select!`) loses nothing.
//! * [`ReplicationStream::send_status`] keeps unsent bytes in its own buffer: if its future is
//!   dropped, the rest of the message goes out first on the next call, so the stream never carries
//!   half a message.
//! * The other methods are not cancel-safe; a [`ReplicationConnection`] whose operation was
//!   cancelled refuses further commands ([`ReplicationError::Protocol`]) instead of reading a
//!   stale answer.
//! * Wire bytes are never trusted: postgres-protocol parses the messages ([`crate::pg::wire`]),
//!   and the XLogData and keepalive payloads inside CopyData, which are not postgres-protocol
//!   messages, are read here with bounds-checked `Buf::try_get_*`. Malformed input is a
//!   [`ReplicationError::Protocol`], never a panic.
//! * An `ErrorResponse` anywhere becomes [`WireError::Server`] with its SQLSTATE;
//!   `NoticeResponse`s are logged at debug level and skipped, but a walsender's `WARNING` while
//!   streaming (e.g. waiting for a `synchronized_standby_slots` slot) at WARN level.
//! * TLS and authentication follow [`crate::pg::auth`]: Unix sockets never use TLS; with
//!   `sslmode=prefer`, a refused or failed TLS negotiation falls back to plaintext (libpq's
//!   behaviour); every other mode fails instead.
//! * Nothing here decides which LSN is safe to confirm: callers send [`StandbyStatus`] explicitly
//!   (see the protocol notes: XLogData's `wal_end` is not a safe confirmation point).

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use postgres_protocol::escape::escape_identifier;
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;

use super::timeline::TimelineHistory;
use crate::config::conninfo::ConnInfo;
use crate::failure::{Classify, Failure};
use crate::lsn::Lsn;
use crate::pg::auth::{self, StartupError};
use crate::pg::hosts::{self, ServerRole, Verdict, ROLE_QUERY};
use crate::pg::wire::{
    data_row_text, log_notice, server_error, tag_name, Backend, NoticeLog, Wire, WireError,
    CLOSE_TIMEOUT,
};
use crate::timestamp::pg_now_micros;

pub use crate::pg::wire::DbError;

/// How long [`ReplicationStream::finish`] waits for the server to end the copy.
const FINISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of the replication connection.
#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    /// Opening the session failed: connecting, TLS, authentication.
    #[error(transparent)]
    Startup(#[from] StartupError),
    /// Reading or writing the socket, an `ErrorResponse` from the server (with its SQLSTATE),
    /// a malformed message, or a connection closed mid-exchange.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The server's answer does not fit the command, or a command was issued on a connection
    /// left in an unknown state.
    #[error("replication protocol error: {0}")]
    Protocol(String),
    /// The bound of [`ReplicationStream::finish`] elapsed.
    #[error("timed out")]
    Timeout,
    /// Nothing arrived for `postgres.receive_timeout`, not even the keepalive asked for halfway.
    #[error("no message from PostgreSQL for {0:?} (postgres.receive_timeout), not even a reply to a keepalive request: the connection is presumed dead")]
    Silent(Duration),
    /// Several hosts or `target_session_attrs`: none of the hosts would do (transient).
    #[error("{0}")]
    NoSuitableHost(String),
}

impl From<io::Error> for ReplicationError {
    fn from(e: io::Error) -> Self {
        ReplicationError::Wire(WireError::Io(e))
    }
}

impl Classify for ReplicationError {
    fn failure(&self) -> Option<Failure> {
        match self {
            ReplicationError::Startup(e) => e.failure(),
            ReplicationError::Wire(e) => e.failure(),
            ReplicationError::Protocol(_) => Some(Failure::Internal),
            ReplicationError::Timeout
            | ReplicationError::Silent(_)
            | ReplicationError::NoSuitableHost(_) => None,
        }
    }
}

impl ReplicationError {
    /// The SQLSTATE of a server error (`55006`: slot active elsewhere; `55000`: slot invalidated;
    /// `58P01`: WAL removed; `57P01`: terminated by an administrator; `28P01`: wrong password).
    pub fn sqlstate(&self) -> Option<&str> {
        self.db_error().map(|e| e.code.as_str())
    }

    /// The server's error, if this is one.
    pub fn db_error(&self) -> Option<&DbError> {
        match self {
            ReplicationError::Wire(WireError::Server(e))
            | ReplicationError::Startup(StartupError::Wire(WireError::Server(e))) => Some(&**e),
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
    /// Several hosts, or `target_session_attrs`: the first host that will do
    /// ([`crate::pg::hosts`]).
    pub async fn connect(info: &ConnInfo) -> Result<Self, ReplicationError> {
        if !info.chooses_host() {
            return Self::connect_one(info).await;
        }
        let chosen = hosts::choose(info, |candidate, attrs, any| async move {
            let mut conn = match Self::connect_one(&candidate).await {
                Ok(conn) => conn,
                Err(e) => return Verdict::Failed(e),
            };
            let rows = match conn.simple_query(ROLE_QUERY).await {
                Ok(rows) => rows,
                Err(e) => return Verdict::Failed(e),
            };
            let role = rows
                .first()
                .and_then(|r| ServerRole::from_text(r[0].as_deref(), r.get(1)?.as_deref()));
            match role {
                Some(role) if hosts::suits(attrs, role, any) => Verdict::Chosen(conn),
                Some(role) => {
                    // Dropping the socket is enough: the server ends the session.
                    let _ = conn.close().await;
                    Verdict::Unsuitable(role)
                }
                None => Verdict::Failed(protocol("unexpected answer to pg_is_in_recovery()")),
            }
        })
        .await;
        chosen.map_err(|e| e.unwrap_or_else(ReplicationError::NoSuitableHost))
    }

    async fn connect_one(info: &ConnInfo) -> Result<Self, ReplicationError> {
        let session = auth::connect(info, &[("replication", "database")]).await?;
        let version = session
            .parameters
            .get("server_version")
            .ok_or_else(|| protocol("the server did not report server_version"))?;
        let server_version_num = parse_server_version(version)
            .ok_or_else(|| protocol(format!("cannot parse server_version {version:?}")))?;
        Ok(ReplicationConnection {
            wire: session.wire,
            parameters: session.parameters,
            server_version_num,
            backend_pid: session.backend_pid,
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

    /// `ALTER_REPLICATION_SLOT … (FAILOVER true)` (PostgreSQL 17+): an existing slot becomes a
    /// failover slot. The slot must not be in use.
    pub async fn enable_failover(&mut self, slot: &str) -> Result<(), ReplicationError> {
        let sql = format!(
            "ALTER_REPLICATION_SLOT {} (FAILOVER true)",
            quote_ident(slot)?
        );
        self.simple_query(&sql).await.map(drop)
    }

    /// Runs a simple-protocol query (a replication command or SQL) and returns the rows of all
    /// its result sets as text. An `ErrorResponse` is returned as [`WireError::Server`]
    /// after the server is ready again, so the connection stays usable. Not for commands that
    /// start a copy (`START_REPLICATION`): use [`ReplicationConnection::start_logical`].
    pub async fn simple_query(
        &mut self,
        sql: &str,
    ) -> Result<Vec<Vec<Option<String>>>, ReplicationError> {
        self.begin()?;
        frontend::query(sql, self.wire.write_buf())?;
        self.wire.flush_out().await?;
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            let message = match self.wire.expect_message().await? {
                Backend::Message(m) => m,
                Backend::CopyBothResponse(_) => return Err(starts_copy()),
                other => return Err(unexpected(&other, "in a query response")),
            };
            match message {
                Message::RowDescription(_)
                | Message::CommandComplete(_)
                | Message::EmptyQueryResponse => {}
                Message::DataRow(row) => rows.push(data_row_text(&row)?),
                Message::ErrorResponse(body) => {
                    if error.is_none() {
                        error = Some(server_error(&body).into());
                    }
                }
                Message::NoticeResponse(body) => log_notice(&body),
                Message::ParameterStatus(p) => {
                    if let (Ok(name), Ok(value)) = (p.name(), p.value()) {
                        self.parameters.insert(name.to_owned(), value.to_owned());
                    }
                }
                Message::ReadyForQuery(_) => {
                    self.busy = false;
                    return match error {
                        Some(e) => Err(e),
                        None => Ok(rows),
                    };
                }
                Message::CopyInResponse(_) | Message::CopyOutResponse(_) => {
                    return Err(starts_copy())
                }
                other => return Err(unexpected(&Backend::Message(other), "in a query response")),
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

    /// The current timeline's ancestors (`TIMELINE_HISTORY`; timeline 1 has none).
    pub async fn timeline_history(
        &mut self,
        current: u32,
    ) -> Result<TimelineHistory, ReplicationError> {
        if current <= 1 {
            return Ok(TimelineHistory::root(current));
        }
        let rows = self
            .simple_query(&format!("TIMELINE_HISTORY {current}"))
            .await?;
        let content = rows
            .first()
            .and_then(|r| r.get(1).cloned().flatten())
            .ok_or_else(|| protocol("TIMELINE_HISTORY returned no content"))?;
        TimelineHistory::parse(current, &content).map_err(|e| protocol(e.to_string()))
    }

    /// Creates a logical slot using pgoutput, without exporting a snapshot
    /// (`(SNAPSHOT 'nothing')` on PostgreSQL ≥ 15, `NOEXPORT_SNAPSHOT` before), and returns its
    /// `consistent_point`: changes committed after it will be streamed. Waits for transactions
    /// already running on the server to finish. `failover` (PostgreSQL 17+) makes it a failover
    /// slot, synchronized to standbys that have `sync_replication_slots` on.
    pub async fn create_logical_slot(
        &mut self,
        slot: &str,
        failover: bool,
    ) -> Result<Lsn, ReplicationError> {
        let sql = if failover {
            format!(
                "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT 'nothing', FAILOVER)",
                quote_ident(slot)?
            )
        } else if self.server_version_num >= 150_000 {
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
        frontend::query(&sql, self.wire.write_buf())?;
        self.wire.flush_out().await?;
        loop {
            match self.wire.expect_message().await? {
                Backend::CopyBothResponse(_) => break,
                Backend::Message(Message::ErrorResponse(body)) => {
                    let e = server_error(&body).into();
                    self.wire.close_after_error().await;
                    return Err(e);
                }
                Backend::Message(Message::NoticeResponse(body)) => log_notice(&body),
                Backend::Message(Message::ParameterStatus(_)) => {}
                other => return Err(unexpected(&other, "in response to START_REPLICATION")),
            }
        }
        Ok(ReplicationStream {
            wire: self.wire,
            ended: false,
            notices: NoticeLog::default(),
        })
    }

    /// Ends the session politely (Terminate, then close the socket).
    pub async fn close(mut self) -> Result<(), ReplicationError> {
        Ok(self.wire.terminate().await?)
    }
}

fn starts_copy() -> ReplicationError {
    protocol("the command started a copy; use start_logical for START_REPLICATION")
}

fn unexpected(message: &Backend, context: &str) -> ReplicationError {
    protocol(format!("unexpected {} {context}", message.name()))
}

/// A replication connection in CopyBoth mode, streaming XLogData and keepalives.
pub struct ReplicationStream {
    wire: Wire,
    /// The server ended the copy (CopyDone or CommandComplete seen).
    ended: bool,
    /// The walsender's warnings, logged.
    notices: NoticeLog,
}

impl fmt::Debug for ReplicationStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicationStream")
            .field("buffered", &self.wire.buffered())
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl ReplicationStream {
    /// Next message from the server. MUST stay cancel-safe (it is used inside
    /// `tokio::select!`): read bytes are kept in the stream's buffer, messages are taken out only
    /// when complete. `None` = the server ended the copy stream cleanly (CopyDone or
    /// CommandComplete, e.g. at a server shutdown after everything was sent); an EOF without
    /// that is [`WireError::ConnectionClosed`].
    pub async fn next(&mut self) -> Result<Option<ReplicationMessage>, ReplicationError> {
        if self.ended {
            return Ok(None);
        }
        loop {
            let Some(message) = self.wire.read_message().await? else {
                return if self.ended {
                    Ok(None)
                } else {
                    Err(WireError::ConnectionClosed.into())
                };
            };
            if let Some(result) = self.handle(message) {
                return result;
            }
        }
    }

    /// The next message already received and buffered, without waiting for the socket:
    /// `Ok(None)` when nothing complete is buffered (or the stream ended; [`Self::next`] then
    /// says so). Lets the relay work through a burst of messages in one go.
    pub fn next_buffered(&mut self) -> Result<Option<ReplicationMessage>, ReplicationError> {
        while let Some(message) = self.wire.buffered_message()? {
            if let Some(result) = self.handle(message) {
                return result;
            }
        }
        Ok(None)
    }

    /// One message of the copy stream: `None` for messages that carry nothing for the caller.
    #[inline]
    fn handle(
        &mut self,
        message: Backend,
    ) -> Option<Result<Option<ReplicationMessage>, ReplicationError>> {
        let message = match message {
            Backend::Message(m) => m,
            other => return Some(Err(unexpected(&other, "in the replication stream"))),
        };
        match message {
            Message::CopyData(body) => Some(parse_copy_data(body.into_bytes()).map(Some)),
            Message::CopyDone | Message::CommandComplete(_) | Message::ReadyForQuery(_) => {
                self.ended = true;
                Some(Ok(None))
            }
            Message::ErrorResponse(body) => Some(Err(server_error(&body).into())),
            Message::NoticeResponse(body) => {
                self.notices.log(&body);
                None
            }
            Message::ParameterStatus(_) => None,
            other => Some(Err(unexpected(
                &Backend::Message(other),
                "in the replication stream",
            ))),
        }
    }

    /// Sends a standby status update; `clientTime` is now. Written straight to the socket; if the
    /// future is dropped, the unsent rest goes out first on the next call.
    pub async fn send_status(&mut self, status: StandbyStatus) -> Result<(), ReplicationError> {
        encode_status(&status, pg_now_micros(), self.wire.write_buf());
        Ok(self.wire.flush_out().await?)
    }

    /// Ends streaming: sends CopyDone, discards what the server still sends until ReadyForQuery
    /// or EOF (at most 10 s), then sends Terminate and closes the socket. Send the final status
    /// update before calling this.
    pub async fn finish(mut self) -> Result<(), ReplicationError> {
        frontend::copy_done(self.wire.write_buf());
        self.wire.flush_out().await?;
        let wire = &mut self.wire;
        let drained = tokio::time::timeout(FINISH_TIMEOUT, async {
            loop {
                match wire.read_message().await? {
                    None => return Ok(false),
                    Some(Backend::Message(Message::ReadyForQuery(_))) => return Ok(true),
                    Some(Backend::Message(Message::ErrorResponse(body))) => {
                        return Err(ReplicationError::from(server_error(&body)))
                    }
                    Some(_) => {}
                }
            }
        })
        .await;
        let open = matches!(drained, Ok(Ok(true)));
        if open {
            if let Ok(Err(e)) = tokio::time::timeout(CLOSE_TIMEOUT, self.wire.terminate()).await {
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

/// Parses a CopyData body of the replication stream (`'w'` XLogData or `'k'` primary keepalive;
/// not postgres-protocol messages). `XLogData.data` is the rest of `body`, not a copy: the
/// bounds-checked `try_get_*` reads advance the `Bytes` past the header.
#[inline]
fn parse_copy_data(mut body: Bytes) -> Result<ReplicationMessage, ReplicationError> {
    let truncated = |what: &str| protocol(format!("truncated {what} message"));
    match body.try_get_u8().map_err(|_| truncated("CopyData"))? {
        b'w' => {
            // Evaluated left to right: dataStart, walEnd, sendTime.
            let (Ok(wal_start), Ok(wal_end), Ok(send_time)) =
                (body.try_get_u64(), body.try_get_u64(), body.try_get_i64())
            else {
                return Err(truncated("XLogData"));
            };
            Ok(ReplicationMessage::XLogData {
                wal_start: Lsn(wal_start),
                wal_end: Lsn(wal_end),
                send_time,
                data: body,
            })
        }
        b'k' => {
            let (Ok(wal_end), Ok(send_time), Ok(reply_requested)) =
                (body.try_get_u64(), body.try_get_i64(), body.try_get_u8())
            else {
                return Err(truncated("primary keepalive"));
            };
            Ok(ReplicationMessage::Keepalive {
                wal_end: Lsn(wal_end),
                send_time,
                reply_requested: reply_requested != 0,
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

/// Quotes an identifier for a replication command (`escape_identifier`: `"…"`, `"` doubled).
/// A NUL byte would end the query string early, so it is refused.
fn quote_ident(s: &str) -> Result<String, ReplicationError> {
    if s.contains('\0') {
        return Err(protocol("identifier contains a NUL byte"));
    }
    Ok(escape_identifier(s))
}

/// Quotes a literal for a replication command: `'…'`, with `'` doubled; NUL refused.
///
/// Not `postgres_protocol::escape::escape_literal`: for a value with a backslash that writes the
/// SQL escape-string form ` E'a\\b'`, which the replication command scanner does not know
/// (PostgreSQL 15.18: `syntax error`); it takes `'a\b'` literally instead.
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

#[cfg(test)]
#[path = "replication_tests.rs"]
mod tests;
