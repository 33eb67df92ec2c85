//! The pgoutput decoder, from the `walbox-pgoutput` crate (`crates/pgoutput`): [`decode`] turns
//! one replication `XLogData` payload into a [`LogicalMessage`], zero-copy, never panicking on
//! any bytes (see that crate's docs for the invariants and the supported protocol version).
//!
//! What walbox adds here is how a decoding failure is classified: the server sent what walbox
//! cannot read, a bug on one side, never retried.

pub use pgoutput::{
    decode, Begin, Column, Commit, DecodeError, Decoder, Delete, Insert, LogicalMessage, Message,
    OldTuple, Origin, Relation, Truncate, TupleData, TupleValue, TypeMessage, Update,
};

use crate::failure::{Classify, Failure};

impl Classify for DecodeError {
    /// The server sent what walbox cannot read: a bug on one side, never retried.
    fn failure(&self) -> Option<Failure> {
        Some(Failure::Internal)
    }
}
