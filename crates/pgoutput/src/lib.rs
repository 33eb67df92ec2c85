//! Decoder for PostgreSQL's `pgoutput` logical replication messages, and the WAL positions
//! ([`Lsn`]) they carry.
//!
//! [`decode`] turns the payload of one replication `XLogData` message (equivalently, one row of
//! `pg_logical_slot_peek_binary_changes`) into a [`LogicalMessage`]. The wire format is described
//! in the PostgreSQL manual, "Logical Replication Message Formats"; all integers are big-endian.
//!
//! Invariants:
//! - **Protocol version 1** (what walbox requests) is decoded completely: Begin, Commit, Origin,
//!   Relation, Type, Insert, Update, Delete, Truncate and logical decoding Messages, with text or
//!   binary (`binary 'true'`) column values. The streaming / two-phase messages of versions 2+
//!   (`S`, `E`, `c`, `A`, `b`, `P`, `K`, `r`, ...) and the extra `xid` field they put in front of
//!   streamed changes are not supported; their tags are rejected with
//!   [`DecodeError::UnknownTag`].
//! - **Zero-copy**: column values ([`TupleValue::Text`], [`TupleValue::Binary`]) and message
//!   content ([`Message::content`]) are [`Bytes::slice`](bytes::Bytes::slice)s of the input
//!   buffer; the only allocation per row is the `Vec` of columns, and [`Decoder`] reuses that
//!   one from row to row when the caller gives rows back ([`Decoder::recycle`]). Names
//!   (relation, namespace, type, prefix, origin) are copied into `String`s, since they are rare
//!   and must be valid UTF-8.
//! - **Never panics**: every read is bounds-checked, length arithmetic is checked, negative
//!   `Int32` lengths and counts are errors, and counts never preallocate more entries than the
//!   remaining bytes could possibly hold. Any malformed input yields a [`DecodeError`].
//! - **Exact framing**: a message must consume its whole buffer; trailing bytes after a complete
//!   message are an error ([`DecodeError::TrailingBytes`]), since they indicate a protocol
//!   mismatch.
//! - `Int16` column counts are read as unsigned, as PostgreSQL itself reads them.
//!
//! - **Self-contained**: this crate depends on nothing of walbox (only `bytes`, `serde` for
//!   [`Lsn`]'s text form, and `thiserror`); walbox re-exports it as `walbox::source::pgoutput`
//!   and `walbox::lsn`, and classifies [`DecodeError`] there.
//!
//! # Files
//! `message.rs` holds the message types, `decoder.rs` [`decode`], [`Decoder`], its cursor and
//! [`DecodeError`], `lsn.rs` [`Lsn`], `tests.rs` the hand-encoded and captured samples and the
//! property tests. This file only re-exports them; inside the crate the decoder imports the
//! types and only the tests import this file.

mod decoder;
pub mod lsn;
mod message;

pub use decoder::{decode, DecodeError, Decoder};
pub use lsn::{Lsn, ParseLsnError};
pub use message::{
    Begin, Column, Commit, Delete, Insert, LogicalMessage, Message, OldTuple, Origin, Relation,
    Truncate, TupleData, TupleValue, TypeMessage, Update,
};

#[cfg(test)]
mod tests;
