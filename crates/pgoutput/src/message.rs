//! The decoded pgoutput messages: [`LogicalMessage`], one variant per message of protocol
//! version 1, and the rows ([`TupleData`], [`TupleValue`]) they carry.
//!
//! Invariants: column values and message content are [`Bytes`] slices of the decoded buffer
//! (zero-copy); names are owned `String`s, valid UTF-8. Plain data: this file knows nothing of
//! the wire format and imports nothing from the decoder.

use bytes::Bytes;

use crate::lsn::Lsn;

/// One decoded pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogicalMessage {
    /// `B`: a transaction starts.
    Begin(Begin),
    /// `C`: a transaction committed.
    Commit(Commit),
    /// `R`: the description of a relation, sent before its first change.
    Relation(Relation),
    /// `Y`: the name of a non-builtin type used by a relation.
    Type(TypeMessage),
    /// `I`: a row was inserted.
    Insert(Insert),
    /// `U`: a row was updated.
    Update(Update),
    /// `D`: a row was deleted.
    Delete(Delete),
    /// `T`: relations were truncated.
    Truncate(Truncate),
    /// `O`: the transaction came from a replication origin.
    Origin(Origin),
    /// `M`: a logical decoding message (`pg_logical_emit_message`).
    Message(Message),
}

/// Start of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Begin {
    /// LSN of the transaction's commit record.
    pub final_lsn: Lsn,
    /// Commit time, microseconds since 2000-01-01 00:00 UTC.
    pub commit_time: i64,
    /// Transaction id.
    pub xid: u32,
}

/// End of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    /// Flags; currently always 0.
    pub flags: u8,
    /// LSN of the commit record.
    pub commit_lsn: Lsn,
    /// LSN just past the commit record: what to confirm once the transaction is durable.
    pub end_lsn: Lsn,
    /// Commit time, microseconds since 2000-01-01 00:00 UTC.
    pub commit_time: i64,
}

/// Description of a relation (table) and its columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// Relation OID, referenced by later row messages.
    pub id: u32,
    /// Schema name as sent; the empty string means `pg_catalog`.
    pub namespace: String,
    /// Relation name.
    pub name: String,
    /// `relreplident`: `d` default, `n` nothing, `f` full, `i` index.
    pub replica_identity: u8,
    /// Published columns, in tuple order.
    pub columns: Vec<Column>,
}

/// One column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Flags; [`Column::FLAG_KEY`] marks a replica identity (key) column.
    pub flags: u8,
    /// Column name.
    pub name: String,
    /// OID of the column's type.
    pub type_oid: u32,
    /// Type modifier (`atttypmod`), -1 when none.
    pub type_modifier: i32,
}

impl Column {
    /// Flag bit: the column is part of the replica identity key.
    pub const FLAG_KEY: u8 = 1;

    /// Whether the column is part of the replica identity key.
    pub fn is_key(&self) -> bool {
        self.flags & Self::FLAG_KEY != 0
    }
}

/// Name of a non-builtin type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeMessage {
    /// Type OID.
    pub id: u32,
    /// Schema name as sent; the empty string means `pg_catalog`.
    pub namespace: String,
    /// Type name.
    pub name: String,
}

/// An inserted row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insert {
    /// OID of the relation, described by an earlier [`Relation`] message.
    pub relation_id: u32,
    /// The new row.
    pub tuple: TupleData,
}

/// An updated row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// OID of the relation, described by an earlier [`Relation`] message.
    pub relation_id: u32,
    /// The old key or row, sent only when the key changed or replica identity is FULL.
    pub old: Option<OldTuple>,
    /// The new row.
    pub new: TupleData,
}

/// The old version of an updated or deleted row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldTuple {
    /// `K`: only the replica identity key columns are set; others are [`TupleValue::Null`].
    Key(TupleData),
    /// `O`: the whole old row (replica identity FULL).
    Old(TupleData),
}

impl OldTuple {
    /// The tuple, whichever kind it is.
    pub fn tuple(&self) -> &TupleData {
        match self {
            OldTuple::Key(t) | OldTuple::Old(t) => t,
        }
    }
}

/// A deleted row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    /// OID of the relation, described by an earlier [`Relation`] message.
    pub relation_id: u32,
    /// The old key or row.
    pub old: OldTuple,
}

/// Truncated relations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncate {
    /// Option bits: [`Truncate::CASCADE`], [`Truncate::RESTART_IDENTITY`].
    pub options: u8,
    /// OIDs of the truncated relations.
    pub relation_ids: Vec<u32>,
}

impl Truncate {
    /// Option bit: `TRUNCATE ... CASCADE`.
    pub const CASCADE: u8 = 1;
    /// Option bit: `TRUNCATE ... RESTART IDENTITY`.
    pub const RESTART_IDENTITY: u8 = 2;
}

/// The replication origin of the current transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// LSN of the commit on the origin server.
    pub commit_lsn: Lsn,
    /// Origin name.
    pub name: String,
}

/// A logical decoding message emitted with `pg_logical_emit_message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Whether the message is part of a transaction (flag bit 1).
    pub transactional: bool,
    /// LSN of the message.
    pub lsn: Lsn,
    /// The prefix given by the emitter.
    pub prefix: String,
    /// The content; a slice of the input buffer.
    pub content: Bytes,
}

/// The column values of one row, in [`Relation::columns`] order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TupleData {
    /// One value per column.
    pub columns: Vec<TupleValue>,
}

/// One column value of a [`TupleData`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TupleValue {
    /// `n`: SQL NULL.
    Null,
    /// `u`: an unchanged TOASTed value whose content was not sent.
    UnchangedToast,
    /// `t`: the value in text format; a slice of the input buffer.
    Text(Bytes),
    /// `b`: the value in binary format; a slice of the input buffer.
    Binary(Bytes),
}

impl TupleValue {
    /// The raw bytes of a [`TupleValue::Text`] or [`TupleValue::Binary`] value.
    pub fn bytes(&self) -> Option<&Bytes> {
        match self {
            TupleValue::Text(b) | TupleValue::Binary(b) => Some(b),
            TupleValue::Null | TupleValue::UnchangedToast => None,
        }
    }
}
