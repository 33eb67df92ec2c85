use super::*;
use postgres_protocol::message::backend::Header;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::pg::tls::TlsError;
use crate::pg::wire::tests::frame;
use crate::pg::wire::{parse_backend, Stream};

fn xlog_body(start: u64, end: u64, time: i64, data: &[u8]) -> Vec<u8> {
    let mut v = vec![b'w'];
    v.extend_from_slice(&start.to_be_bytes());
    v.extend_from_slice(&end.to_be_bytes());
    v.extend_from_slice(&time.to_be_bytes());
    v.extend_from_slice(data);
    v
}

fn keepalive_body(end: u64, time: i64, reply: bool) -> Vec<u8> {
    let mut v = vec![b'k'];
    v.extend_from_slice(&end.to_be_bytes());
    v.extend_from_slice(&time.to_be_bytes());
    v.push(u8::from(reply));
    v
}

/// One CopyData message off the front of `buf` through the wire's parser, as the stream reads it.
fn copy_data(buf: &mut BytesMut) -> Result<ReplicationMessage, ReplicationError> {
    match parse_backend(buf)? {
        Some(Backend::Message(Message::CopyData(body))) => parse_copy_data(body.into_bytes()),
        Some(other) => panic!("parsed as {}", other.name()),
        None => panic!("incomplete"),
    }
}

#[test]
fn parses_xlogdata_zero_copy() {
    let mut buf = BytesMut::from(&frame(b'd', &xlog_body(0x10, 0x20, 7, b"Ipayload"))[..]);
    buf.extend_from_slice(&frame(b'd', &keepalive_body(0x30, 8, true)));
    let before = buf.as_ptr() as usize;
    match copy_data(&mut buf).unwrap() {
        ReplicationMessage::XLogData {
            wal_start,
            wal_end,
            send_time,
            data,
        } => {
            assert_eq!((wal_start, wal_end, send_time), (Lsn(0x10), Lsn(0x20), 7));
            assert_eq!(&data[..], b"Ipayload");
            // The payload points into the original allocation: 5 header + 25 XLogData bytes.
            assert_eq!(data.as_ptr() as usize, before + 30);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        copy_data(&mut buf).unwrap(),
        ReplicationMessage::Keepalive {
            wal_end: Lsn(0x30),
            send_time: 8,
            reply_requested: true
        }
    );
    assert!(buf.is_empty());
    assert!(parse_backend(&mut buf).unwrap().is_none());
}

#[test]
fn a_partial_xlogdata_frame_waits_for_the_rest() {
    // Framing is tested at every cut in pg/wire_tests.rs; here, that an XLogData message short
    // of its last byte is not decoded until it is whole.
    let whole = frame(b'd', &xlog_body(1, 1, 1, b"abc"));
    let mut buf = BytesMut::from(&whole[..whole.len() - 1]);
    assert!(parse_backend(&mut buf).unwrap().is_none());
    buf.extend_from_slice(&whole[whole.len() - 1..]);
    assert!(matches!(
        copy_data(&mut buf).unwrap(),
        ReplicationMessage::XLogData { .. }
    ));
}

#[test]
fn truncated_or_garbage_is_an_error_not_a_panic() {
    // Short XLogData / keepalive bodies, unknown subtype, empty CopyData.
    for body in [
        &xlog_body(1, 2, 3, b"")[..24],
        &keepalive_body(1, 2, false)[..17],
        b"w",
        b"k",
        b"",
        b"x123",
    ] {
        assert!(
            matches!(
                parse_copy_data(Bytes::copy_from_slice(body)),
                Err(ReplicationError::Protocol(_))
            ),
            "{body:?}"
        );
        // The same through the wire's parser and the stream's error conversion.
        let mut buf = BytesMut::from(&frame(b'd', body)[..]);
        assert!(
            matches!(copy_data(&mut buf), Err(ReplicationError::Protocol(_))),
            "{body:?}"
        );
    }
    // An empty XLogData payload is fine.
    assert!(matches!(
        parse_copy_data(Bytes::from(xlog_body(1, 2, 3, b""))),
        Ok(ReplicationMessage::XLogData { data, .. }) if data.is_empty()
    ));
    // Negative and too-small lengths.
    for len in [-1i32, 0, 3, i32::MIN] {
        let mut buf = BytesMut::from(&[b'd'][..]);
        buf.extend_from_slice(&len.to_be_bytes());
        assert!(parse_backend(&mut buf).is_err(), "{len}");
    }
}

#[test]
fn server_errors_keep_their_fields() {
    let mut buf = BytesMut::from(
        &frame(
            b'E',
            b"SERREUR\0VERROR\0C55006\0Mreplication slot \"s\" is active for PID 42\0Dd\0\0",
        )[..],
    );
    let Some(Backend::Message(Message::ErrorResponse(body))) = parse_backend(&mut buf).unwrap()
    else {
        panic!("expected ErrorResponse")
    };
    let e = ReplicationError::from(server_error(&body));
    assert_eq!(e.sqlstate(), Some("55006"));
    // The fields themselves are parsed (and tested) in pg::wire; the stream only passes them on.
    assert_eq!(e.db_error().map(|db| db.code.as_str()), Some("55006"));
    assert_eq!(
        e.to_string(),
        "PostgreSQL: ERROR 55006: replication slot \"s\" is active for PID 42 (detail: d)"
    );
    assert_eq!(e.failure(), Some(Failure::SlotInUse));
}

#[test]
fn stream_messages_and_errors() {
    let tcp_pair = async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap());
        let (client, server) = tokio::join!(client, listener.accept());
        (client.unwrap(), server.unwrap().0)
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (client, mut server) = rt.block_on(tcp_pair);
    let mut stream = ReplicationStream {
        wire: Wire::new(Stream::Tcp(client)),
        ended: false,
        notices: Default::default(),
    };
    let mut bytes = frame(b'N', b"SNOTICE\0C00000\0Mhello\0\0");
    bytes.extend(frame(b'S', b"TimeZone\0UTC\0"));
    bytes.extend(frame(b'd', &xlog_body(1, 1, 1, b"B")));
    bytes.extend(frame(
        b'E',
        b"SERROR\0VERROR\0C55000\0Mcan no longer get changes\0\0",
    ));
    bytes.extend(frame(b'T', &[0, 0]));
    bytes.extend(frame(b'W', &[0, 0, 0]));
    bytes.extend(frame(b'c', b""));
    rt.block_on(server.write_all(&bytes)).unwrap();
    assert!(
        stream.next_buffered().unwrap().is_none(),
        "nothing read yet"
    );
    // Notice and ParameterStatus are skipped.
    assert!(matches!(
        rt.block_on(stream.next()).unwrap(),
        Some(ReplicationMessage::XLogData { .. })
    ));
    let e = stream.next_buffered().unwrap_err();
    assert_eq!(e.sqlstate(), Some("55000"));
    assert_eq!(e.failure(), Some(Failure::SlotLost));
    let e = stream.next_buffered().unwrap_err();
    assert!(e.to_string().contains("unexpected RowDescription"), "{e}");
    let e = stream.next_buffered().unwrap_err();
    assert!(e.to_string().contains("unexpected CopyBothResponse"), "{e}");
    assert_eq!(stream.next_buffered().unwrap(), None);
    assert_eq!(
        rt.block_on(stream.next()).unwrap(),
        None,
        "ended by CopyDone"
    );
}

#[test]
fn status_update_encoding() {
    let mut out = BytesMut::new();
    let status = StandbyStatus {
        write: Lsn(1),
        flush: Lsn(2),
        apply: Lsn(3),
        reply_requested: true,
    };
    encode_status(&status, 0x0102, &mut out);
    assert_eq!(out.len(), 39);
    assert_eq!(&out[..6], &[b'd', 0, 0, 0, 38, b'r']);
    assert_eq!(&out[6..14], &1u64.to_be_bytes());
    assert_eq!(&out[14..22], &2u64.to_be_bytes());
    assert_eq!(&out[22..30], &3u64.to_be_bytes());
    assert_eq!(&out[30..38], &0x0102i64.to_be_bytes());
    assert_eq!(out[38], 1);
    // Now is after 2020 in PostgreSQL's epoch.
    assert!(pg_now_micros() > 631_152_000_000_000);
}

#[test]
fn quoting_and_versions() {
    assert_eq!(quote_ident("a\"b").unwrap(), "\"a\"\"b\"");
    assert!(quote_ident("a\0").is_err());
    assert_eq!(quote_literal("it's \\").unwrap(), "'it''s \\'");
    assert!(quote_literal("a\0").is_err());
    // Why quote_literal is not escape_literal: the replication command scanner rejects E'…'.
    assert_eq!(
        postgres_protocol::escape::escape_literal("it's \\"),
        " E'it''s \\\\'"
    );
    assert_eq!(
        quote_literal("it's").unwrap(),
        postgres_protocol::escape::escape_literal("it's")
    );
    assert_eq!(
        parse_server_version("15.18 (Debian 15.18-1.pgdg120+1)"),
        Some(150018)
    );
    assert_eq!(parse_server_version("13.2"), Some(130002));
    assert_eq!(parse_server_version("9.6.24"), Some(90624));
    assert_eq!(parse_server_version("17devel"), Some(170000));
    assert_eq!(parse_server_version("16beta1"), Some(160000));
    assert_eq!(parse_server_version("garbage"), None);
}

/// A server that trickles bytes one at a time while the client polls `next()` inside a
/// `select!` whose other branch keeps winning: no byte may be lost.
#[tokio::test]
async fn next_is_cancel_safe() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut bytes = Vec::new();
    for i in 0..20u64 {
        bytes.extend(frame(
            b'd',
            &xlog_body(i, i, 0, &vec![b'x'; i as usize * 10]),
        ));
        bytes.extend(frame(b'd', &keepalive_body(i, 0, false)));
    }
    bytes.extend(frame(b'c', b""));
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        for chunk in bytes.chunks(7) {
            s.write_all(chunk).await.unwrap();
            s.flush().await.unwrap();
            tokio::time::sleep(Duration::from_micros(300)).await;
        }
        // Keep the socket open until the client is done.
        let mut sink = [0u8; 1];
        let _ = s.read(&mut sink).await;
    });
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut stream = ReplicationStream {
        wire: Wire::new(Stream::Tcp(tcp)),
        ended: false,
        notices: Default::default(),
    };
    let mut got = Vec::new();
    let mut cancelled = 0u32;
    loop {
        tokio::select! {
            m = stream.next() => match m.unwrap() {
                Some(m) => got.push(m),
                None => break,
            },
            _ = tokio::time::sleep(Duration::from_micros(100)) => cancelled += 1,
        }
    }
    assert!(cancelled > 0, "the select never cancelled next()");
    assert_eq!(got.len(), 40);
    for (i, pair) in got.chunks(2).enumerate() {
        let i = i as u64;
        assert_eq!(
            pair[0],
            ReplicationMessage::XLogData {
                wal_start: Lsn(i),
                wal_end: Lsn(i),
                send_time: 0,
                data: Bytes::from(vec![b'x'; i as usize * 10]),
            }
        );
        assert!(
            matches!(pair[1], ReplicationMessage::Keepalive { wal_end, .. } if wal_end == Lsn(i))
        );
    }
    drop(stream);
    server.await.unwrap();
}

/// A scripted fake server: cleartext auth, IDENTIFY_SYSTEM, START_REPLICATION, one XLogData,
/// a status update, then an error inside the stream.
#[tokio::test]
async fn talks_to_a_fake_server() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = BytesMut::new();
        // Startup message: length-prefixed, no tag.
        let len = s.read_i32().await.unwrap() as usize;
        let mut startup = vec![0u8; len - 4];
        s.read_exact(&mut startup).await.unwrap();
        let text = String::from_utf8_lossy(&startup).to_string();
        assert!(text.contains("replication\0database\0"), "{text:?}");
        assert!(text.contains("client_encoding\0UTF8\0"), "{text:?}");
        s.write_all(&frame(b'R', &3i32.to_be_bytes()))
            .await
            .unwrap();
        /// One frontend message (same framing as the backend's; postgres-protocol has no
        /// frontend parser).
        async fn msg(s: &mut TcpStream, buf: &mut BytesMut) -> (u8, Vec<u8>) {
            loop {
                if let Some(h) = Header::parse(buf).unwrap() {
                    let total = h.len() as usize + 1;
                    if buf.len() >= total {
                        let body = buf.split_to(total)[5..].to_vec();
                        return (h.tag(), body);
                    }
                }
                s.read_buf(buf).await.unwrap();
            }
        }
        let (tag, body) = msg(&mut s, &mut buf).await;
        assert_eq!((tag, &body[..]), (b'p', &b"pw\0"[..]));
        let mut ok = frame(b'R', &0i32.to_be_bytes());
        ok.extend(frame(b'S', b"server_version\x0015.18 (Debian)\0"));
        ok.extend(frame(b'K', &[0, 0, 0, 42, 0, 0, 0, 1]));
        ok.extend(frame(b'N', b"SNOTICE\0C00000\0Mhello\0\0"));
        ok.extend(frame(b'Z', b"I"));
        s.write_all(&ok).await.unwrap();

        let (tag, body) = msg(&mut s, &mut buf).await;
        assert_eq!((tag, &body[..]), (b'Q', &b"IDENTIFY_SYSTEM\0"[..]));
        let mut row = vec![0, 4];
        for v in ["7000", "1", "0/16B3748"] {
            row.extend_from_slice(&(v.len() as i32).to_be_bytes());
            row.extend_from_slice(v.as_bytes());
        }
        row.extend_from_slice(&(-1i32).to_be_bytes());
        let mut answer = frame(b'T', &[0, 0]);
        answer.extend(frame(b'D', &row));
        answer.extend(frame(b'C', b"IDENTIFY_SYSTEM\0"));
        answer.extend(frame(b'Z', b"I"));
        s.write_all(&answer).await.unwrap();

        let (tag, body) = msg(&mut s, &mut buf).await;
        assert_eq!(tag, b'Q');
        assert_eq!(
            String::from_utf8_lossy(&body),
            "START_REPLICATION SLOT \"s\"\"x\" LOGICAL 0/10 (\"proto_version\" '1', \
             \"publication_names\" 'p''q')\0"
        );
        let mut answer = frame(b'W', &[0, 0, 0]);
        answer.extend(frame(b'd', &xlog_body(5, 5, 9, b"B...")));
        answer.extend(frame(b'd', &keepalive_body(6, 9, true)));
        s.write_all(&answer).await.unwrap();

        let (tag, body) = msg(&mut s, &mut buf).await;
        assert_eq!(tag, b'd');
        assert_eq!(body[0], b'r');
        assert_eq!(&body[9..17], &6u64.to_be_bytes(), "flush");
        s.write_all(&frame(b'E', b"SFATAL\0VFATAL\0C57P01\0Mterminating\0\0"))
            .await
            .unwrap();
    });

    let info: ConnInfo = format!(
        "host=127.0.0.1 port={port} user=u password=pw dbname=d sslmode=disable \
         connect_timeout=5"
    )
    .parse()
    .unwrap();
    let mut conn = ReplicationConnection::connect(&info).await.unwrap();
    assert_eq!(conn.server_version_num(), 150018);
    assert_eq!(conn.backend_pid(), Some(42));
    let id = conn.identify_system().await.unwrap();
    assert_eq!(
        id,
        SystemIdentity {
            system_id: "7000".into(),
            timeline: 1,
            xlogpos: Lsn(0x16B3748),
            dbname: None
        }
    );
    let mut stream = conn
        .start_logical(
            "s\"x",
            Lsn(0x10),
            &[("proto_version", "1"), ("publication_names", "p'q")],
        )
        .await
        .unwrap();
    assert!(matches!(
        stream.next().await.unwrap(),
        Some(ReplicationMessage::XLogData {
            wal_start: Lsn(5),
            ..
        })
    ));
    let Some(ReplicationMessage::Keepalive {
        wal_end,
        reply_requested: true,
        ..
    }) = stream.next().await.unwrap()
    else {
        panic!("expected a keepalive")
    };
    stream
        .send_status(StandbyStatus {
            write: wal_end,
            flush: wal_end,
            apply: wal_end,
            reply_requested: false,
        })
        .await
        .unwrap();
    let e = stream.next().await.unwrap_err();
    assert_eq!(e.sqlstate(), Some("57P01"));
    server.await.unwrap();
    assert!(matches!(
        stream.next().await,
        Err(ReplicationError::Wire(WireError::ConnectionClosed))
    ));
}

#[tokio::test]
async fn connect_errors() {
    // Nothing listens: a Connect error naming the address.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let info: ConnInfo = format!("host=127.0.0.1 port={port} user=u sslmode=disable")
        .parse()
        .unwrap();
    let e = ReplicationConnection::connect(&info).await.unwrap_err();
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");

    // A server that accepts and never answers: connect_timeout applies.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let info: ConnInfo =
        format!("host=127.0.0.1 port={port} user=u sslmode=require connect_timeout=1")
            .parse()
            .unwrap();
    let hold = tokio::spawn(async move {
        let (_s, _) = listener.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
    });
    let e = ReplicationConnection::connect(&info).await.unwrap_err();
    assert!(
        matches!(e, ReplicationError::Startup(StartupError::Timeout)),
        "{e}"
    );
    hold.abort();

    // A server that refuses TLS: require fails, prefer goes on in plaintext.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let refuse = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut req = [0u8; 8];
        s.read_exact(&mut req).await.unwrap();
        assert_eq!(req, [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]);
        s.write_all(b"N").await.unwrap();
    });
    let info: ConnInfo = format!("host=127.0.0.1 port={port} user=u sslmode=require")
        .parse()
        .unwrap();
    let e = ReplicationConnection::connect(&info).await.unwrap_err();
    assert!(
        matches!(
            e,
            ReplicationError::Startup(StartupError::Tls(TlsError::NotSupported(_)))
        ),
        "{e}"
    );
    refuse.await.unwrap();
}
