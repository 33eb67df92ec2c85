//! Tests of the decoder: hand-encoded samples of every message kind, messages captured from
//! PostgreSQL 15, malformed fields, the recycling [`Decoder`], and property tests (random input
//! never panics; inserts round-trip with zero-copy values).

use bytes::Bytes;
use proptest::prelude::*;

use super::decoder::marker;
use super::*;
use crate::lsn::Lsn;
use LogicalMessage as M;
use TupleValue::{Null as NULL, UnchangedToast as TOAST};

/// `hex => expected` rows; a macro so the table stays one row per line.
macro_rules! table {
    ($($hex:expr => $want:expr;)*) => { vec![$(($hex.to_string(), $want)),*] };
}

/// Hex to bytes; whitespace (used to separate fields) is ignored.
fn hex(s: &str) -> Vec<u8> {
    let d: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    d.chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

fn text(s: &'static str) -> TupleValue {
    TupleValue::Text(Bytes::from_static(s.as_bytes()))
}

fn bin(b: &'static [u8]) -> TupleValue {
    TupleValue::Binary(Bytes::from_static(b))
}

fn tup<const N: usize>(columns: [TupleValue; N]) -> TupleData {
    TupleData {
        columns: columns.into(),
    }
}

fn col(flags: u8, name: &str, type_oid: u32, type_modifier: i32) -> Column {
    let name = name.into();
    Column {
        flags,
        name,
        type_oid,
        type_modifier,
    }
}

fn insert(relation_id: u32, tuple: TupleData) -> LogicalMessage {
    M::Insert(Insert { relation_id, tuple })
}

fn message(transactional: bool, lsn: u64, prefix: &str, content: &'static [u8]) -> M {
    let (lsn, prefix, content) = (Lsn(lsn), prefix.into(), Bytes::from_static(content));
    M::Message(Message {
        transactional,
        lsn,
        prefix,
        content,
    })
}

/// Encoded tuple '1', NULL, unchanged TOAST, binary \x00ff, '' and its key tuple '1', NULL.
const ROW: &str = "0005 74 00000001 31  6e  75  62 00000002 00ff  74 00000000";
const KEY: &str = "0002 74 00000001 31  6e";

/// Hand-encoded samples, at least one per message kind.
fn samples() -> Vec<(String, LogicalMessage)> {
    let row = || tup([text("1"), NULL, TOAST, bin(b"\0\xff"), text("")]);
    let key = || tup([text("1"), NULL]);
    let (k, o) = (OldTuple::Key(key()), OldTuple::Old(row()));
    table! {
        "42 0000000100000010 fffffffffffffffb ee6b2800"
            => M::Begin(Begin { final_lsn: Lsn(0x1_0000_0010), commit_time: -5, xid: 4_000_000_000 });
        "43 00 0000000000000007 0000000000000008 0000000000000009"
            => M::Commit(Commit { flags: 0, commit_lsn: Lsn(7), end_lsn: Lsn(8), commit_time: 9 });
        "4f 000000000000002a 7570737472 00" => M::Origin(Origin { commit_lsn: Lsn(42), name: "upstr".into() });
        "52 00004000 00 6f7574626f7800 64 0002 01 696400 00000014 ffffffff 00 74c3b3706963 00 00000413 00000044"
            => M::Relation(Relation { id: 16384, namespace: "".into(), name: "outbox".into(), replica_identity: b'd',
                columns: vec![col(1, "id", 20, -1), col(0, "tópic", 1043, 68)] });
        "59 00004010 7075626c696300 6d6f6f6400"
            => M::Type(TypeMessage { id: 16400, namespace: "public".into(), name: "mood".into() });
        format!("49 00000005 4e {ROW}") => insert(5, row());
        "49 00000005 4e 0000" => insert(5, tup([]));
        format!("55 00000005 4e {ROW}") => M::Update(Update { relation_id: 5, old: None, new: row() });
        format!("55 00000006 4b {KEY} 4e {ROW}") => M::Update(Update { relation_id: 6, old: Some(k.clone()), new: row() });
        format!("55 00000006 4f {ROW} 4e {ROW}") => M::Update(Update { relation_id: 6, old: Some(o.clone()), new: row() });
        format!("44 00000007 4b {KEY}") => M::Delete(Delete { relation_id: 7, old: k });
        format!("44 00000007 4f {ROW}") => M::Delete(Delete { relation_id: 7, old: o });
        "54 00000002 03 00004000 00004006" => M::Truncate(Truncate { options: 3, relation_ids: vec![16384, 16390] });
        "54 00000000 00" => M::Truncate(Truncate { options: 0, relation_ids: vec![] });
        "4d 01 0000000000000063 77616c626f7800 00000002 6869" => message(true, 99, "walbox", b"hi");
        "4d 00 0000000000000063 00 00000000" => message(false, 99, "", b"");
    }
}

/// Captured from PostgreSQL 15 via `pg_logical_slot_peek_binary_changes(.., 'proto_version',
/// '1', 'publication_names', 'pub', 'messages', 'true')`; the last with `'binary', 'true'`.
fn captured() -> Vec<(String, LogicalMessage)> {
    let (outbox, full) = (16384, 16391);
    let (payload, t, key3) = (
        || text("{\"a\": 1}"),
        text,
        || tup([text("3"), NULL, NULL, NULL]),
    );
    table! {
        "420000000001531ac800030472c8b4c301000002d8"
            => M::Begin(Begin { final_lsn: Lsn(0x1531AC8), commit_time: 0x0003_0472_c8b4_c301, xid: 728 });
        "43000000000001531ac80000000001531af800030472c8b4c301"
            => M::Commit(Commit { flags: 0, commit_lsn: Lsn(0x1531AC8), end_lsn: Lsn(0x1531AF8),
                commit_time: 0x0003_0472_c8b4_c301 });
        "52000040007075626c6963006f7574626f78006400040169640000000014ffffffff00746f706963000000\
         0019ffffffff007061796c6f61640000000edaffffffff006e6f74650000000019ffffffff"
            => M::Relation(Relation { id: outbox, namespace: "public".into(), name: "outbox".into(),
                replica_identity: b'd', columns: vec![col(1, "id", 20, -1), col(0, "topic", 25, -1),
                col(0, "payload", 3802, -1), col(0, "note", 25, -1)] });
        "49000040004e000474000000013174000000066f726465727374000000087b2261223a20317d6e"
            => insert(outbox, tup([t("1"), t("orders"), payload(), NULL]));
        // The TOASTed `note` did not change.
        "55000040004e00047400000001327400000004626967326e75"
            => M::Update(Update { relation_id: outbox, old: None, new: tup([t("2"), t("big2"), NULL, TOAST]) });
        // The primary key changed.
        "55000040004b00047400000001316e6e6e4e000474000000013374000000066f726465727374000000087b226122\
         3a20317d6e"
            => M::Update(Update { relation_id: outbox, old: Some(OldTuple::Key(tup([t("1"), NULL, NULL, NULL]))),
                new: tup([t("3"), t("orders"), payload(), NULL]) });
        "44000040004b00047400000001336e6e6e" => M::Delete(Delete { relation_id: outbox, old: OldTuple::Key(key3()) });
        // REPLICA IDENTITY FULL.
        "55000040074f00027400000001377400000001784e0002740000000137740000000179"
            => M::Update(Update { relation_id: full, old: Some(OldTuple::Old(tup([t("7"), t("x")]))),
                new: tup([t("7"), t("y")]) });
        "44000040074f0002740000000137740000000179"
            => M::Delete(Delete { relation_id: full, old: OldTuple::Old(tup([t("7"), t("y")])) });
        "5400000002020000400000004007"
            => M::Truncate(Truncate { options: Truncate::RESTART_IDENTITY, relation_ids: vec![outbox, full] });
        "4d010000000001532d6877616c626f78000000000568656c6c6f" => message(true, 0x1532D68, "walbox", b"hello");
        "4d00000000000153eba06e6f6e747800000000020001" => message(false, 0x153EBA0, "nontx", b"\0\x01");
        "59000040187075626c6963006d6f6f6400"
            => M::Type(TypeMessage { id: 16408, namespace: "public".into(), name: "mood".into() });
        "4f0000000000abcdef757073747265616d3100"
            => M::Origin(Origin { commit_lsn: Lsn(0xABCDEF), name: "upstream1".into() });
        // Binary mode: int4 5, enum 'happy', bytea \x0102.
        "490000401d4e00036200000004000000056200000005686170707962000000020102"
            => insert(16413, tup([bin(b"\0\0\0\x05"), bin(b"happy"), bin(b"\x01\x02")]));
    }
}

fn all_valid() -> impl Iterator<Item = Vec<u8>> {
    samples()
        .into_iter()
        .chain(captured())
        .map(|(h, _)| hex(&h))
}

fn check_kind(tag: u8) {
    let kind: Vec<_> = samples()
        .into_iter()
        .filter(|(h, _)| hex(h)[0] == tag)
        .collect();
    assert!(!kind.is_empty(), "no sample for tag {}", char::from(tag));
    for (h, want) in kind {
        assert_eq!(decode(hex(&h).into()), Ok(want), "{h}");
    }
}

macro_rules! per_kind {
    ($($name:ident => $tag:literal),* $(,)?) => { $(#[test] fn $name() { check_kind($tag) })* };
}

per_kind! {
    decodes_begin => b'B', decodes_commit => b'C', decodes_origin => b'O',
    decodes_relation => b'R', decodes_type => b'Y', decodes_insert => b'I',
    decodes_update => b'U', decodes_delete => b'D', decodes_truncate => b'T',
    decodes_message => b'M',
}

#[test]
fn decodes_captured_postgres_messages() {
    for (h, want) in captured() {
        assert_eq!(decode(hex(&h).into()), Ok(want), "{h}");
    }
}

/// A [`Decoder`] given every row back decodes each message as [`decode`] does, whatever came
/// before it: a longer row, a malformed message, a message without a row.
#[test]
fn recycling_decoder_matches_decode() {
    let mut decoder = Decoder::default();
    for _ in 0..2 {
        for bytes in all_valid() {
            let want = decode(bytes.clone().into());
            let got = decoder.decode(bytes.clone().into());
            assert_eq!(got, want, "{bytes:02x?}");
            let truncated = Bytes::copy_from_slice(&bytes[..bytes.len() - 1]);
            assert!(decoder.decode(truncated).is_err());
            if let Ok(M::Insert(ins)) = got {
                decoder.recycle(ins.tuple);
            }
        }
    }
}

#[test]
fn every_prefix_is_an_error() {
    for bytes in all_valid() {
        for len in 0..bytes.len() {
            let prefix = Bytes::copy_from_slice(&bytes[..len]);
            assert!(decode(prefix).is_err(), "prefix {len} of {bytes:02x?}");
        }
    }
}

#[test]
fn trailing_bytes_are_an_error() {
    for mut bytes in all_valid() {
        let tag = bytes[0];
        bytes.push(0);
        let want = Err(DecodeError::TrailingBytes { tag, remaining: 1 });
        assert_eq!(decode(bytes.into()), want);
    }
}

#[test]
fn rejects_malformed_fields() {
    use DecodeError::*;
    let cases = table! {
        "" => Truncated { what: "message tag", needed: 1, available: 0 };
        "5a" => UnknownTag(b'Z');
        "49 00000005 4e 0001 78" => UnknownTupleKind(b'x');
        "49 00000005 4e 0001 74 ffffffff" => NegativeLength { what: "text value length", length: -1 };
        "49 00000005 4e 0001 74 7fffffff 6162"
            => Truncated { what: "text value", needed: i32::MAX as usize, available: 2 };
        "49 00000005 4b 0000" => marker("insert", b'K');
        "55 00000005 4b 0000 4b 0000" => marker("update", b'K');
        "44 00000005 4e 0000" => marker("delete", b'N');
        "54 80000000 00" => NegativeLength { what: "truncate relation count", length: i32::MIN };
        "4d 00 0000000000000000 00 fffffffe" => NegativeLength { what: "message content length", length: -2 };
        "59 00000001 7075626c6963" => MissingNul { what: "type namespace" };
        "59 00000001 ff00 7800" => InvalidUtf8 { what: "type namespace" };
        // Huge counts with nothing behind them fail without preallocating.
        "54 7fffffff 00" => Truncated { what: "truncate relation id", needed: 4, available: 0 };
        "49 00000005 4e ffff" => Truncated { what: "tuple column kind", needed: 1, available: 0 };
    };
    for (h, want) in cases {
        assert_eq!(decode(hex(&h).into()), Err(want), "{h}");
    }
}

fn value_strategy() -> impl Strategy<Value = TupleValue> {
    let bytes = || proptest::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from);
    prop_oneof![
        Just(NULL),
        Just(TOAST),
        bytes().prop_map(TupleValue::Text),
        bytes().prop_map(TupleValue::Binary),
    ]
}

proptest! {
    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(data.into());
    }

    /// A valid tag followed by bytes biased towards NULs and tuple markers, to go deeper.
    #[test]
    fn random_bodies_never_panic(
        tag in proptest::sample::select(b"BCORYIUDTM".to_vec()),
        body in proptest::collection::vec(
            prop_oneof![any::<u8>(), proptest::sample::select(b"\0NKOnutb".to_vec())], 0..512),
    ) {
        let _ = decode([&[tag][..], &body].concat().into());
    }

    #[test]
    fn insert_round_trips_zero_copy(
        relation_id in any::<u32>(),
        columns in proptest::collection::vec(value_strategy(), 0..40),
    ) {
        let mut b = vec![b'I'];
        b.extend_from_slice(&relation_id.to_be_bytes());
        b.push(b'N');
        b.extend_from_slice(&(columns.len() as u16).to_be_bytes());
        for v in &columns {
            let kind = match v { NULL => b'n', TOAST => b'u', TupleValue::Text(_) => b't', _ => b'b' };
            b.push(kind);
            if let Some(data) = v.bytes() {
                b.extend_from_slice(&(data.len() as i32).to_be_bytes());
                b.extend_from_slice(data);
            }
        }
        let input = Bytes::from(b);
        let got = decode(input.clone());
        prop_assert_eq!(&got, &Ok(insert(relation_id, TupleData { columns })));
        let range = input.as_ptr_range();
        if let Ok(M::Insert(got)) = got {
            for v in got.tuple.columns.iter().filter_map(TupleValue::bytes) {
                let p = v.as_ptr_range();
                prop_assert!(v.is_empty() || (range.start <= p.start && p.end <= range.end));
            }
        }
    }
}
