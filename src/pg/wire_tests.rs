use super::*;
use proptest::prelude::*;

/// A backend message: tag, length, body (also used by the replication tests).
pub(crate) fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
    v.extend_from_slice(body);
    v
}

/// Parses one whole message from `bytes`, which must hold exactly that message.
fn parse_one(bytes: &[u8]) -> Result<Backend, WireError> {
    let mut buf = BytesMut::from(bytes);
    let message = parse_backend(&mut buf)?.expect("a whole message");
    assert!(buf.is_empty(), "the message was taken out whole");
    Ok(message)
}

fn data_row(body: &[u8]) -> Result<Vec<Option<String>>, WireError> {
    match parse_one(&frame(b'D', body))? {
        Backend::Message(Message::DataRow(row)) => data_row_text(&row),
        other => panic!("parsed as {}", other.name()),
    }
}

fn error_response(body: &[u8]) -> WireError {
    match parse_one(&frame(b'E', body)) {
        Ok(Backend::Message(Message::ErrorResponse(e))) => server_error(&e),
        Ok(other) => panic!("parsed as {}", other.name()),
        Err(e) => e,
    }
}

#[test]
fn partial_messages_wait_for_more() {
    let whole = frame(b'd', b"wsome wal");
    for cut in 0..whole.len() {
        let mut buf = BytesMut::from(&whole[..cut]);
        assert!(parse_backend(&mut buf).unwrap().is_none(), "cut {cut}");
        assert_eq!(buf.len(), cut, "nothing consumed");
        buf.extend_from_slice(&whole[cut..]);
        assert!(matches!(
            parse_backend(&mut buf).unwrap(),
            Some(Backend::Message(Message::CopyData(_)))
        ));
        assert!(buf.is_empty());
    }
}

#[test]
fn copy_data_is_a_slice_of_the_read_buffer() {
    let mut buf = BytesMut::from(&frame(b'd', b"payload")[..]);
    buf.extend_from_slice(&frame(b'c', b""));
    let before = buf.as_ptr() as usize;
    let Some(Backend::Message(Message::CopyData(body))) = parse_backend(&mut buf).unwrap() else {
        panic!("expected CopyData")
    };
    let data = body.into_bytes();
    assert_eq!(&data[..], b"payload");
    assert_eq!(data.as_ptr() as usize, before + 5, "not copied");
    assert!(matches!(
        parse_backend(&mut buf).unwrap(),
        Some(Backend::Message(Message::CopyDone))
    ));
    assert!(parse_backend(&mut buf).unwrap().is_none());
}

#[test]
fn bad_lengths_are_errors() {
    // Negative and too-small lengths: errors, and no attempt to reserve 4 GiB.
    for len in [-1i32, 0, 3, i32::MIN] {
        let mut buf = BytesMut::from(&[b'd'][..]);
        buf.extend_from_slice(&len.to_be_bytes());
        assert!(
            matches!(parse_backend(&mut buf), Err(WireError::Protocol(_))),
            "{len}"
        );
    }
}

#[test]
fn copy_both_response() {
    let Backend::CopyBothResponse(c) = parse_one(&frame(b'W', &[0, 0, 0])).unwrap() else {
        panic!("expected CopyBothResponse")
    };
    assert_eq!((c.format, c.column_formats.len()), (0, 0));
    let Backend::CopyBothResponse(c) = parse_one(&frame(b'W', &[1, 0, 2, 0, 1, 0, 0])).unwrap()
    else {
        panic!("expected CopyBothResponse")
    };
    assert_eq!((c.format, c.column_formats), (1, vec![1, 0]));
    for body in [
        &[][..],
        &[0],
        &[0, 0],
        &[0, 0, 1],
        &[0, 0, 1, 0],
        &[0, 0xff, 0xff],
        &[0, 0, 0, 9],
    ] {
        assert!(
            matches!(parse_one(&frame(b'W', body)), Err(WireError::Protocol(_))),
            "{body:?}"
        );
    }
}

#[test]
fn error_response_with_sqlstate() {
    let e = error_response(
        b"SERREUR\0VERROR\0C55006\0Mreplication slot \"s\" is active for PID 42\0Dd\0\0",
    );
    let WireError::Server(db) = &e else {
        panic!("{e}")
    };
    assert_eq!(db.code, "55006");
    assert_eq!(db.severity, "ERROR", "the non-localized severity wins");
    assert_eq!(db.detail.as_deref(), Some("d"));
    assert_eq!(db.hint, None);
    assert_eq!(
        e.to_string(),
        "PostgreSQL: ERROR 55006: replication slot \"s\" is active for PID 42 (detail: d)"
    );
    assert_eq!(e.failure(), Some(Failure::SlotInUse));
    // Without V (servers before 9.6) the localized severity is used; values are decoded lossily.
    let WireError::Server(db) = error_response(b"SFATAL\0C28P01\0Mmot de passe \xe9\0Hh\0\0")
    else {
        panic!("not a server error")
    };
    assert_eq!(db.severity, "FATAL");
    assert_eq!(db.message, "mot de passe \u{fffd}");
    assert_eq!(db.hint.as_deref(), Some("h"));
    // Malformed: unterminated, empty, missing terminator, trailing bytes.
    for body in [&b"Sunterminated"[..], b"", b"SERROR\0", b"SERROR\0\0junk"] {
        assert!(
            matches!(error_response(body), WireError::Protocol(_)),
            "{body:?}"
        );
    }
}

#[test]
fn notices_are_parsed_like_errors() {
    let Backend::Message(Message::NoticeResponse(n)) =
        parse_one(&frame(b'N', b"SNOTICE\0C00000\0Mhello\0\0")).unwrap()
    else {
        panic!("expected NoticeResponse")
    };
    let n = DbError::from_fields(n.fields()).unwrap();
    assert_eq!(
        (n.severity.as_str(), n.message.as_str()),
        ("NOTICE", "hello")
    );
}

#[test]
fn data_rows_with_nulls() {
    let mut body = vec![0, 4];
    body.extend_from_slice(&2i32.to_be_bytes());
    body.extend_from_slice(b"ab");
    body.extend_from_slice(&(-1i32).to_be_bytes());
    body.extend_from_slice(&0i32.to_be_bytes());
    body.extend_from_slice(&(-1i32).to_be_bytes());
    assert_eq!(
        data_row(&body).unwrap(),
        vec![Some("ab".to_owned()), None, Some(String::new()), None]
    );
    assert_eq!(data_row(&[0, 0]).unwrap(), Vec::<Option<String>>::new());
}

#[test]
fn malformed_data_rows_are_errors() {
    for body in [
        &[0, 1, 0, 0, 0, 9, b'a'][..],   // value longer than the message
        &[0, 1, 0xff, 0xff, 0xff, 0xfe], // length -2: only -1 means NULL
        &[0xff, 0xff],                   // 65535 columns, no data
        &[0],                            // truncated column count
        &[0, 1, 0, 0, 0, 1, b'a', b'b'], // bytes after the last column
        &[0, 1, 0, 0, 0, 1, 0xff],       // not UTF-8
    ] {
        assert!(
            matches!(data_row(body), Err(WireError::Protocol(_))),
            "{body:?}"
        );
    }
}

#[test]
fn authentication_requests() {
    let md5 = parse_one(&frame(b'R', &[0, 0, 0, 5, 1, 2, 3, 4])).unwrap();
    assert!(
        matches!(md5, Backend::Message(Message::AuthenticationMd5Password(ref b)) if b.salt() == [1, 2, 3, 4])
    );
    let Backend::Message(Message::AuthenticationSasl(sasl)) = parse_one(&frame(
        b'R',
        b"\0\0\0\x0aSCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0",
    ))
    .unwrap() else {
        panic!("expected AuthenticationSASL")
    };
    let mechanisms: Vec<&str> = sasl.mechanisms().collect().unwrap();
    assert_eq!(mechanisms, ["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"]);
    // A code postgres-protocol does not know is reported as such, not as garbage.
    assert!(matches!(
        parse_one(&frame(b'R', &[0, 0, 0, 42])).unwrap(),
        Backend::UnknownAuthentication(42)
    ));
    // Truncated requests are malformed; the code is never read from the next message.
    let mut buf = BytesMut::from(&frame(b'R', &[0, 0])[..]);
    buf.extend_from_slice(&frame(b'Z', b"I"));
    assert!(matches!(
        parse_backend(&mut buf),
        Err(WireError::Protocol(_))
    ));
    assert!(matches!(
        parse_one(&frame(b'R', &[0, 0, 0, 5, 1])),
        Err(WireError::Protocol(_))
    ));
}

#[test]
fn unknown_and_overlong_messages_are_errors() {
    for bytes in [
        frame(b'v', &[0, 0, 0, 0]), // NegotiateProtocolVersion: not expected
        frame(0x01, b""),
        frame(b'Z', b"II"),  // ReadyForQuery with a trailing byte
        frame(b'K', b"123"), // truncated BackendKeyData
        frame(b'S', b"name\0value"),
    ] {
        assert!(
            matches!(parse_one(&bytes), Err(WireError::Protocol(_))),
            "{bytes:?}"
        );
    }
    let e = parse_one(&frame(0x01, b"")).err().unwrap();
    assert!(e.to_string().contains("0x01"), "{e}");
}

proptest! {
    /// Arbitrary bytes, or valid messages with arbitrary bodies, never panic the parser or the
    /// field readers.
    #[test]
    fn never_panics(
        raw in proptest::collection::vec(any::<u8>(), 0..64),
        tag in prop::sample::select(b"RSKZEDNdcCTWIW".to_vec()),
        body in proptest::collection::vec(any::<u8>(), 0..48),
    ) {
        for bytes in [raw.clone(), frame(tag, &body)] {
            let mut buf = BytesMut::from(&bytes[..]);
            while let Ok(Some(message)) = parse_backend(&mut buf) {
                match message {
                    Backend::Message(Message::DataRow(row)) => {
                        let _ = data_row_text(&row);
                    }
                    Backend::Message(Message::ErrorResponse(e)) => {
                        let _ = server_error(&e);
                    }
                    Backend::Message(Message::NoticeResponse(n)) => log_notice(&n),
                    Backend::Message(Message::AuthenticationSasl(s)) => {
                        let _ = s.mechanisms().count();
                    }
                    _ => {}
                }
            }
        }
    }
}
