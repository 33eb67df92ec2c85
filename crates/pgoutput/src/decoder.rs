//! The decoder: [`decode`], the bounds-checked cursor it reads with, and [`DecodeError`].
//!
//! Invariants (see the crate docs): never panics on any input (every read is
//! bounds-checked, lengths and counts are checked, and no count preallocates more than the
//! remaining bytes could hold); a message must fill its buffer exactly; only protocol version 1
//! tags are accepted.

use bytes::Bytes;

use super::message::{
    Begin, Column, Commit, Delete, Insert, LogicalMessage, Message, OldTuple, Origin, Relation,
    Truncate, TupleData, TupleValue, TypeMessage, Update,
};
use crate::lsn::Lsn;

/// Why a pgoutput message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The message ended before a field was complete.
    #[error("pgoutput message truncated reading {what}: needed {needed} bytes, {available} left")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Bytes the field needs.
        needed: usize,
        /// Bytes that were left in the message.
        available: usize,
    },
    /// The first byte is not a known (protocol version 1) message type.
    #[error("unknown pgoutput message tag 0x{0:02x}")]
    UnknownTag(u8),
    /// A tuple column kind other than `n`, `u`, `t` or `b`.
    #[error("unknown pgoutput tuple column kind 0x{0:02x}")]
    UnknownTupleKind(u8),
    /// A byte other than a valid tuple marker (`N`, `K`, `O`) where one was expected.
    #[error("unexpected tuple marker 0x{found:02x} in pgoutput {what}")]
    UnexpectedTupleMarker {
        /// The message being decoded (`insert`, `update`, `delete`).
        what: &'static str,
        /// The byte found instead.
        found: u8,
    },
    /// A string field is not valid UTF-8.
    #[error("pgoutput {what} is not valid UTF-8")]
    InvalidUtf8 {
        /// The field being read.
        what: &'static str,
    },
    /// A length or count field is negative.
    #[error("pgoutput {what} is negative ({length})")]
    NegativeLength {
        /// The field being read.
        what: &'static str,
        /// The value on the wire.
        length: i32,
    },
    /// A string field has no terminating NUL byte.
    #[error("pgoutput {what} is missing its NUL terminator")]
    MissingNul {
        /// The field being read.
        what: &'static str,
    },
    /// Bytes remain after a complete message.
    #[error("{remaining} trailing bytes after pgoutput message '{}'", char::from(*.tag))]
    TrailingBytes {
        /// The tag of the message that was decoded.
        tag: u8,
        /// How many bytes were left over.
        remaining: usize,
    },
}

/// Decodes one pgoutput message, which must fill `buf` exactly.
///
/// Column values and message content in the result share `buf`'s storage.
pub fn decode(buf: Bytes) -> Result<LogicalMessage, DecodeError> {
    decode_with(buf, &mut Vec::new())
}

/// A decoder that keeps the columns `Vec` of the rows it is given back ([`Decoder::recycle`])
/// and decodes the next row into it: a stream of INSERTs then allocates no `Vec` per row.
#[derive(Debug, Default)]
pub struct Decoder {
    spare: Vec<TupleValue>,
}

impl Decoder {
    /// Rows wider than this many columns are not kept: one wide row must not pin its memory.
    const KEEP_COLUMNS: usize = 256;

    /// [`decode`], with the first row of the message decoded into the recycled `Vec`.
    #[inline]
    pub fn decode(&mut self, buf: Bytes) -> Result<LogicalMessage, DecodeError> {
        decode_with(buf, &mut self.spare)
    }

    /// Takes a row back once its values are no longer needed (the values themselves are
    /// dropped here; the `Vec`'s storage is kept for the next row).
    #[inline]
    pub fn recycle(&mut self, tuple: TupleData) {
        let mut columns = tuple.columns;
        if columns.capacity() <= Self::KEEP_COLUMNS && columns.capacity() > self.spare.capacity() {
            columns.clear();
            self.spare = columns;
        }
    }
}

/// [`decode`], taking the first row's `Vec` from `spare` (left untouched by messages without
/// a row, and on errors before the row).
fn decode_with(buf: Bytes, spare: &mut Vec<TupleValue>) -> Result<LogicalMessage, DecodeError> {
    let mut r = Reader {
        buf: &buf,
        pos: 0,
        spare,
    };
    let tag = r.u8("message tag")?;
    let msg = match tag {
        b'B' => LogicalMessage::Begin(Begin {
            final_lsn: r.lsn("begin final LSN")?,
            commit_time: r.i64("begin commit timestamp")?,
            xid: r.u32("begin xid")?,
        }),
        b'C' => LogicalMessage::Commit(Commit {
            flags: r.u8("commit flags")?,
            commit_lsn: r.lsn("commit LSN")?,
            end_lsn: r.lsn("commit end LSN")?,
            commit_time: r.i64("commit timestamp")?,
        }),
        b'O' => LogicalMessage::Origin(Origin {
            commit_lsn: r.lsn("origin commit LSN")?,
            name: r.string("origin name")?,
        }),
        b'R' => LogicalMessage::Relation(r.relation()?),
        b'Y' => LogicalMessage::Type(TypeMessage {
            id: r.u32("type id")?,
            namespace: r.string("type namespace")?,
            name: r.string("type name")?,
        }),
        b'I' => {
            let relation_id = r.u32("insert relation id")?;
            r.expect_new("insert")?;
            let tuple = r.tuple()?;
            LogicalMessage::Insert(Insert { relation_id, tuple })
        }
        b'U' => {
            let relation_id = r.u32("update relation id")?;
            let old = match r.u8("update tuple marker")? {
                b'N' => None,
                b'K' => Some(OldTuple::Key(r.tuple()?)),
                b'O' => Some(OldTuple::Old(r.tuple()?)),
                found => return Err(marker("update", found)),
            };
            if old.is_some() {
                r.expect_new("update")?;
            }
            let new = r.tuple()?;
            LogicalMessage::Update(Update {
                relation_id,
                old,
                new,
            })
        }
        b'D' => {
            let relation_id = r.u32("delete relation id")?;
            let old = match r.u8("delete tuple marker")? {
                b'K' => OldTuple::Key(r.tuple()?),
                b'O' => OldTuple::Old(r.tuple()?),
                found => return Err(marker("delete", found)),
            };
            LogicalMessage::Delete(Delete { relation_id, old })
        }
        b'T' => {
            let n = r.count("truncate relation count")?;
            let options = r.u8("truncate options")?;
            let mut relation_ids = Vec::with_capacity(n.min(r.remaining() / 4));
            for _ in 0..n {
                relation_ids.push(r.u32("truncate relation id")?);
            }
            LogicalMessage::Truncate(Truncate {
                options,
                relation_ids,
            })
        }
        b'M' => LogicalMessage::Message(Message {
            transactional: r.u8("message flags")? & 1 != 0,
            lsn: r.lsn("message LSN")?,
            prefix: r.string("message prefix")?,
            content: {
                let len = r.count("message content length")?;
                r.bytes(len, "message content")?
            },
        }),
        other => return Err(DecodeError::UnknownTag(other)),
    };
    match r.remaining() {
        0 => Ok(msg),
        remaining => Err(DecodeError::TrailingBytes { tag, remaining }),
    }
}

#[inline]
pub(super) fn marker(what: &'static str, found: u8) -> DecodeError {
    DecodeError::UnexpectedTupleMarker { what, found }
}

/// Defines `Reader` methods reading one big-endian integer of each given type.
macro_rules! be_getters {
    ($($t:ident),*) => {$(
        #[inline]
        fn $t(&mut self, what: &'static str) -> Result<$t, DecodeError> {
            self.array(what).map($t::from_be_bytes)
        }
    )*};
}

/// A bounds-checked cursor over the message. Invariant: `pos <= buf.len()`.
struct Reader<'a, 's> {
    buf: &'a Bytes,
    pos: usize,
    /// An empty `Vec` the next row is decoded into (taken, so only the first row gets it).
    spare: &'s mut Vec<TupleValue>,
}

impl<'a> Reader<'a, '_> {
    #[inline]
    fn rest(&self) -> &'a [u8] {
        self.buf.get(self.pos..).unwrap_or_default()
    }

    #[inline]
    fn remaining(&self) -> usize {
        self.rest().len()
    }

    #[inline]
    fn truncated(&self, what: &'static str, needed: usize) -> DecodeError {
        DecodeError::Truncated {
            what,
            needed,
            available: self.remaining(),
        }
    }

    #[inline]
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        match self.rest().split_first_chunk::<N>() {
            Some((head, _)) => {
                self.pos += N; // cannot overflow: pos + N <= buf.len()
                Ok(*head)
            }
            None => Err(self.truncated(what, N)),
        }
    }

    be_getters!(u8, u16, u32, i32, i64, u64);

    #[inline]
    fn lsn(&mut self, what: &'static str) -> Result<Lsn, DecodeError> {
        self.u64(what).map(Lsn)
    }

    /// An `Int32` length or count, which must not be negative.
    #[inline]
    fn count(&mut self, what: &'static str) -> Result<usize, DecodeError> {
        let n = self.i32(what)?;
        usize::try_from(n).map_err(|_| DecodeError::NegativeLength { what, length: n })
    }

    /// The next `n` bytes as a zero-copy slice of the input.
    #[inline]
    fn bytes(&mut self, n: usize, what: &'static str) -> Result<Bytes, DecodeError> {
        if n > self.remaining() {
            return Err(self.truncated(what, n));
        }
        let start = self.pos;
        self.pos += n; // cannot overflow: n <= buf.len() - pos
        Ok(self.buf.slice(start..self.pos))
    }

    /// A NUL-terminated UTF-8 string.
    fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let rest = self.rest();
        let nul = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::MissingNul { what })?;
        let s = rest.get(..nul).unwrap_or_default();
        let s = std::str::from_utf8(s).map_err(|_| DecodeError::InvalidUtf8 { what })?;
        self.pos += nul + 1; // cannot overflow: nul < rest.len()
        Ok(s.to_owned())
    }

    #[inline]
    fn expect_new(&mut self, what: &'static str) -> Result<(), DecodeError> {
        match self.u8("new tuple marker")? {
            b'N' => Ok(()),
            found => Err(marker(what, found)),
        }
    }

    fn relation(&mut self) -> Result<Relation, DecodeError> {
        let id = self.u32("relation id")?;
        let namespace = self.string("relation namespace")?;
        let name = self.string("relation name")?;
        let replica_identity = self.u8("relation replica identity")?;
        let n = usize::from(self.u16("relation column count")?);
        // Each column takes at least 10 bytes (flags, NUL, oid, typmod).
        let mut columns = Vec::with_capacity(n.min(self.remaining() / 10));
        for _ in 0..n {
            columns.push(Column {
                flags: self.u8("column flags")?,
                name: self.string("column name")?,
                type_oid: self.u32("column type oid")?,
                type_modifier: self.i32("column type modifier")?,
            });
        }
        Ok(Relation {
            id,
            namespace,
            name,
            replica_identity,
            columns,
        })
    }

    /// `TupleData`: the hot path.
    #[inline]
    fn tuple(&mut self) -> Result<TupleData, DecodeError> {
        let n = usize::from(self.u16("tuple column count")?);
        // Each column takes at least its kind byte.
        // `spare` is empty: a new `Vec`, or one `Decoder::recycle` cleared.
        let mut columns = std::mem::take(self.spare);
        columns.reserve(n.min(self.remaining()));
        for _ in 0..n {
            let value = match self.u8("tuple column kind")? {
                b'n' => TupleValue::Null,
                b'u' => TupleValue::UnchangedToast,
                b't' => {
                    let len = self.count("text value length")?;
                    TupleValue::Text(self.bytes(len, "text value")?)
                }
                b'b' => {
                    let len = self.count("binary value length")?;
                    TupleValue::Binary(self.bytes(len, "binary value")?)
                }
                other => return Err(DecodeError::UnknownTupleKind(other)),
            };
            columns.push(value);
        }
        Ok(TupleData { columns })
    }
}
