//! What the mapper produces: [`OutboxEvent`], the record to send, and [`EventPosition`], where
//! its row sits in the WAL.
//!
//! # Invariants
//! - An event's identity in the stream is its position (commit LSN, index): every event of a
//!   transaction shares the commit LSN, the index orders them.
//! - Every field is owned or a cheap reference-counted slice: an event outlives the replication
//!   buffer it was decoded from only through `Bytes`.

use std::sync::Arc;

use bytes::Bytes;

use crate::lsn::Lsn;

/// Where an event sits in the WAL: the commit LSN of its transaction and its ordinal in it.
/// An LSN alone does not identify an event (all rows of a transaction share one commit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventPosition {
    /// LSN of the transaction's commit record (pgoutput Begin's `final_lsn`).
    pub commit_lsn: Lsn,
    /// 0-based ordinal of the event among the transaction's outbox events.
    pub index: u32,
    /// Commit time, microseconds since 2000-01-01.
    pub commit_time: i64,
}

/// A header name: one of walbox's own, or one configured in `[outbox.headers]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderName {
    /// A fixed name.
    Static(&'static str),
    /// A configured name.
    Custom(Arc<str>),
}

impl HeaderName {
    /// The name.
    pub fn as_str(&self) -> &str {
        match self {
            HeaderName::Static(s) => s,
            HeaderName::Custom(s) => s,
        }
    }
}

/// The header carrying the event id (every record, in both layouts).
pub const ID_HEADER: &str = "id";

/// The header carrying the event type (walbox's layout; the router's places none by itself).
pub const EVENT_TYPE_HEADER: &str = "event_type";

/// CloudEvents' Kafka binary-mode headers (`cloudevents = true`).
pub const CE_SPECVERSION: &str = "ce_specversion";
/// CloudEvents `id`: the event id.
pub const CE_ID: &str = "ce_id";
/// CloudEvents `source`: `cloudevents_source`.
pub const CE_SOURCE: &str = "ce_source";
/// CloudEvents `type`: the event type.
pub const CE_TYPE: &str = "ce_type";
/// CloudEvents `time`: the record timestamp, RFC 3339.
pub const CE_TIME: &str = "ce_time";
/// CloudEvents `subject`: the aggregate id.
pub const CE_SUBJECT: &str = "ce_subject";
/// The value's content type ([`super::envelope::content_type`]).
pub const CONTENT_TYPE_HEADER: &str = "content-type";

/// The header naming the route an event (or its dead letter) comes from: `schema.table`, or
/// `message:<prefix>` for the table-less outbox. With `id` it identifies an event of this
/// outbox (`walbox audit` matches on both; ids of different tables may be equal).
pub const SOURCE_HEADER: &str = "walbox.source";

/// The header carrying the event's commit LSN (`X/Y`): with [`INDEX_HEADER`], its position in
/// the WAL, and what tells walbox's records from other producers'.
pub const COMMIT_LSN_HEADER: &str = "walbox.commit_lsn";

/// The header carrying the event's index within its transaction.
pub const INDEX_HEADER: &str = "walbox.index";

/// Where brokers without a record key (NATS, RabbitMQ) carry the event's key (its aggregate
/// id), as a header of this name; Redis Streams as the entry's field `key`.
pub const KEY_HEADER: &str = "walbox.key";

/// The header a dead letter carries: why the original event could not be published.
pub use crate::dead_letter::ERROR_HEADER;

/// Headers held inline up to walbox's own five and two configured ones: no allocation per
/// event (CloudEvents headers spill to the heap). A `None` value is a header with a null value
/// (a NULL header column with `compat = "debezium"`).
pub type Headers = smallvec::SmallVec<[(HeaderName, Option<Bytes>); 7]>;

/// One record to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    /// Destination topic (interned: events of one topic share the name).
    pub topic: Arc<str>,
    /// Explicit partition (`columns.partition`), else the key decides.
    pub partition: Option<i32>,
    /// Record key: the aggregate id.
    pub key: Option<Bytes>,
    /// Record value; `None` is a tombstone.
    pub value: Option<Bytes>,
    /// Headers in order: `id`, `event_type`, `walbox.commit_lsn`, `walbox.index`,
    /// `walbox.source`, CloudEvents, configured extras.
    pub headers: Headers,
    /// Record timestamp, milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    /// The event id (for messages and dead letters).
    pub id: Bytes,
    /// Position in the WAL.
    pub position: EventPosition,
    /// `schema.table` or `message:<prefix>`.
    pub source: Arc<str>,
}
