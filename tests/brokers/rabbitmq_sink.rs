//! The RabbitMQ publisher (`walbox::sink::rabbitmq`) against a real node: order and confirms,
//! properties and headers, unroutable records, refused credentials, a missing exchange, a node
//! killed mid-stream, progress records, and the consistent-hash exchange pattern for
//! per-aggregate order across several queues.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use walbox::config::secret::Secret;
use walbox::config::RabbitMqConfig;
use walbox::failure::{Class, Failure};
use walbox::outbox::{EventPosition, HeaderName, OutboxEvent, KEY_HEADER};
use walbox::preflight::Status;
use walbox::sandbox::rabbitmq::{RabbitMq, RabbitMqOptions};
use walbox::sink::rabbitmq::{self, RabbitMqSink};
use walbox::sink::{Ack, AckQueue, Publisher, SinkError, PROGRESS_ROUTE};

use crate::support::brokers::{own_rabbitmq, rabbitmq};

/// How long any condition may take to come true.
const PATIENCE: Duration = Duration::from_secs(60);

fn config(node: &RabbitMq, exchange: &str, password: &str) -> RabbitMqConfig {
    let mut c = RabbitMqConfig::for_url(&format!("amqp://guest@127.0.0.1:{}/%2f", node.port()));
    c.password = Some(Secret::new(password.into()));
    c.exchange = exchange.into();
    c
}

/// A plain client for the test's own topology and reads.
async fn client(node: &RabbitMq) -> (Connection, Channel) {
    let conn = Connection::connect(&node.url(), ConnectionProperties::default())
        .await
        .expect("connect");
    let channel = conn.create_channel().await.expect("channel");
    (conn, channel)
}

pub(crate) async fn exchange(ch: &Channel, name: &str, kind: ExchangeKind) {
    ch.exchange_declare(
        name.into(),
        kind,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("exchange.declare");
}

pub(crate) async fn queue(ch: &Channel, name: &str, exchange: &str, key: &str) {
    ch.queue_declare(
        name.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("queue.declare");
    ch.queue_bind(
        name.into(),
        exchange.into(),
        key.into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("queue.bind");
}

/// Every message of `queue`, taken off it, in queue order.
async fn drain(ch: &Channel, queue: &str) -> Vec<lapin::message::Delivery> {
    let mut out = Vec::new();
    while let Some(m) = ch
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .expect("basic.get")
    {
        out.push(m.delivery);
    }
    out
}

fn event(topic: &str, aggregate: &str, n: u64) -> OutboxEvent {
    let id = format!("{aggregate}-{n}");
    OutboxEvent {
        topic: topic.into(),
        partition: None,
        key: Some(Bytes::copy_from_slice(aggregate.as_bytes())),
        value: Some(Bytes::from(format!("{{\"n\":{n}}}"))),
        headers: [
            ("id", Some(id.clone())),
            ("event_type", Some("OrderPlaced".to_owned())),
            ("walbox.commit_lsn", Some(format!("0/{n:X}"))),
            ("walbox.index", Some("0".to_owned())),
            ("content-type", Some("application/json".to_owned())),
            ("trace", None),
        ]
        .into_iter()
        .map(|(k, v)| (HeaderName::Static(k), v.map(Bytes::from)))
        .collect(),
        timestamp_ms: 1_700_000_000_000,
        id: Bytes::from(id),
        position: EventPosition::default(),
        source: "public.outbox".into(),
    }
}

/// Waits until `n` acks have come (panics after [`PATIENCE`]).
async fn acks(queue: &AckQueue, n: usize) -> Vec<Ack> {
    let deadline = Instant::now() + PATIENCE;
    let mut out = Vec::new();
    while out.len() < n {
        let mut batch = Vec::new();
        queue.drain_into(&mut batch);
        if batch.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{} acks of {n} after {PATIENCE:?}",
                out.len()
            );
            let _ = tokio::time::timeout(left, queue.wait()).await;
        }
        out.append(&mut batch);
    }
    out
}

/// Hands `event` over, retrying while the publisher's queue is full.
async fn send(sink: &RabbitMqSink, event: &OutboxEvent, seq: u64) {
    loop {
        match sink.send(event, seq, 0) {
            Ok(()) => return,
            Err(SinkError::QueueFull) => tokio::task::yield_now().await,
            Err(e) => panic!("send {seq}: {e}"),
        }
    }
}

/// One ack per record `0..n`, in order (the first misplaced one named).
fn assert_in_order(got: &[Ack], n: u64) {
    assert_eq!(got.len() as u64, n, "acks");
    if let Some((i, a)) = got.iter().enumerate().find(|(i, a)| a.seq != *i as u64) {
        panic!("ack {i} is for record {}", a.seq);
    }
}

fn header(d: &lapin::message::Delivery, name: &str) -> Option<AMQPValue> {
    d.properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(name).cloned())
}

fn long_string(v: Option<AMQPValue>) -> String {
    match v {
        Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        other => panic!("not a long string: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_publishes_in_order_with_confirms_properties_and_headers() {
    let Some(node) = rabbitmq() else { return };
    let (_conn, ch) = client(node).await;
    exchange(&ch, "order.x", ExchangeKind::Direct).await;
    queue(&ch, "order.q", "order.x", "orders").await;
    let ackq = Arc::new(AckQueue::default());
    let sink = rabbitmq::connect(&config(node, "order.x", "guest"), ackq.clone())
        .await
        .expect("connect");
    for seq in 0..1000 {
        send(
            &sink,
            &event("orders", &format!("agg{}", seq % 7), seq),
            seq,
        )
        .await;
    }
    let got = acks(&ackq, 1000).await;
    assert_in_order(&got, 1000);
    assert!(got.iter().all(|a| a.result.is_ok() && a.failed.is_none()));
    // The count drops just after the ack is queued.
    assert!(sink.flush(Duration::from_secs(5)));
    assert_eq!(sink.in_flight(), 0);

    let messages = drain(&ch, "order.q").await;
    assert_eq!(messages.len(), 1000);
    for (seq, m) in messages.iter().enumerate() {
        let agg = format!("agg{}", seq % 7);
        let p = &m.properties;
        assert_eq!(
            p.message_id().as_ref().map(|s| s.to_string()),
            Some(format!("{agg}-{seq}"))
        );
        assert_eq!(
            p.kind().as_ref().map(|s| s.to_string()).as_deref(),
            Some("OrderPlaced")
        );
        assert_eq!(
            p.content_type().as_ref().map(|s| s.to_string()).as_deref(),
            Some("application/json")
        );
        assert_eq!(*p.delivery_mode(), Some(2));
        assert_eq!(*p.timestamp(), Some(1_700_000_000));
        assert_eq!(long_string(header(m, KEY_HEADER)), agg);
        assert_eq!(
            long_string(header(m, "walbox.commit_lsn")),
            format!("0/{seq:X}")
        );
        assert_eq!(header(m, "trace"), Some(AMQPValue::Void));
        assert_eq!(m.data, format!("{{\"n\":{seq}}}").into_bytes());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_unroutable_record_is_rejected_naming_exchange_and_key() {
    let Some(node) = rabbitmq() else { return };
    let (_conn, ch) = client(node).await;
    exchange(&ch, "unroutable.x", ExchangeKind::Direct).await;
    queue(&ch, "unroutable.q", "unroutable.x", "bound").await;
    let ackq = Arc::new(AckQueue::default());
    let sink = rabbitmq::connect(&config(node, "unroutable.x", "guest"), ackq.clone())
        .await
        .expect("connect");
    send(&sink, &event("bound", "a", 0), 0).await;
    send(&sink, &event("nobody.binds.this", "a", 1), 1).await;
    send(&sink, &event("bound", "a", 2), 2).await;
    let got = acks(&ackq, 3).await;
    assert!(got[0].result.is_ok());
    let e = got[1].result.as_ref().unwrap_err();
    assert_eq!(e.class(), Class::Rejected, "{e}");
    let text = e.to_string();
    assert!(
        text.contains("unroutable.x") && text.contains("nobody.binds.this"),
        "{text}"
    );
    let failed = got[1].failed.as_ref().expect("failed record");
    assert_eq!(
        (failed.topic.as_str(), failed.id.as_str()),
        ("nobody.binds.this", "a-1")
    );
    // The record's fault only: later records are published.
    assert!(got[2].result.is_ok());
    assert_eq!(drain(&ch, "unroutable.q").await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_wrong_password_is_fatal_auth_without_the_secret() {
    let Some(node) = rabbitmq() else { return };
    let secret = "not-the-guest-s3cret";
    let e = match rabbitmq::connect(&config(node, "", secret), Arc::default()).await {
        Ok(_) => panic!("connected with a wrong password"),
        Err(e) => e,
    };
    assert_eq!(e.class(), Class::Fatal(Failure::Auth), "{e}");
    let text = e.to_string();
    assert!(!text.contains(secret) && !text.contains('\n'), "{text}");
    assert!(text.contains("guest"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_missing_exchange_is_fatal_with_the_fix() {
    let Some(node) = rabbitmq() else { return };
    let ackq = Arc::new(AckQueue::default());
    let sink = rabbitmq::connect(&config(node, "no.such.exchange", "guest"), ackq.clone())
        .await
        .expect("connect");
    send(&sink, &event("k", "a", 0), 0).await;
    send(&sink, &event("k", "a", 1), 1).await;
    // Until the relay has taken every failed ack, a record may be the failed session's: refused.
    assert!(sink.flush(PATIENCE));
    let refused = sink.send(&event("k", "a", 2), 2, 0).unwrap_err();
    assert_eq!(refused.class(), Class::Transient, "{refused}");
    let got = acks(&ackq, 2).await;
    let first = got[0].result.as_ref().unwrap_err();
    assert_eq!(first.class(), Class::Fatal(Failure::Kafka), "{first}");
    assert!(first.to_string().contains("no.such.exchange"), "{first}");
    assert_eq!(
        got[1].result.as_ref().unwrap_err().class(),
        Class::Transient
    );
    // Then the next session's record connects again (and fails alike).
    send(&sink, &event("k", "a", 3), 3).await;
    let again = acks(&ackq, 1).await;
    let e = again[0].result.as_ref().unwrap_err();
    assert_eq!(
        (again[0].seq, e.class()),
        (3, Class::Fatal(Failure::Kafka)),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_progress_record_round_trip_and_none_when_absent() {
    let Some(node) = rabbitmq() else { return };
    let c = config(node, "", "guest");
    let key = "7000000000000000001/app/walbox_rabbit";
    assert_eq!(rabbitmq::read_progress(&c, key).await.expect("read"), None);
    let ackq = Arc::new(AckQueue::default());
    let sink = rabbitmq::connect(&c, ackq.clone()).await.expect("connect");
    sink.send_progress(key, b"{\"v\":1}").expect("send");
    sink.send_progress(key, b"{\"v\":2}").expect("send");
    let got = acks(&ackq, 2).await;
    assert!(got
        .iter()
        .all(|a| a.route == PROGRESS_ROUTE && a.result.is_ok()));
    for _ in 0..2 {
        // Reading leaves the record in place.
        let read = rabbitmq::read_progress(&c, key).await.expect("read");
        assert_eq!(read.as_deref(), Some(&b"{\"v\":2}"[..]));
    }
    let other = "7000000000000000001/app/other_slot";
    assert_eq!(
        rabbitmq::read_progress(&c, other).await.expect("read"),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_consistent_hash_exchange_keeps_each_aggregate_in_one_queue_in_order() {
    let Some(node) = rabbitmq() else { return };
    let (_conn, ch) = client(node).await;
    exchange(
        &ch,
        "hash.x",
        ExchangeKind::Custom("x-consistent-hash".into()),
    )
    .await;
    let queues = ["hash.q0", "hash.q1", "hash.q2"];
    for q in queues {
        // The binding key is the queue's weight.
        queue(&ch, q, "hash.x", "1").await;
    }
    let ackq = Arc::new(AckQueue::default());
    let sink = rabbitmq::connect(&config(node, "hash.x", "guest"), ackq.clone())
        .await
        .expect("connect");
    let aggregates: Vec<String> = (0..40).map(|i| format!("order-{i}")).collect();
    let n = 1200;
    for seq in 0..n {
        let agg = &aggregates[(seq as usize * 7 + seq as usize / 3) % aggregates.len()];
        // The routing key is the aggregate id (a route topic of `${aggregate_id}`).
        send(&sink, &event(agg, agg, seq), seq).await;
    }
    let got = acks(&ackq, n as usize).await;
    assert!(got.iter().all(|a| a.result.is_ok()));
    let mut home: HashMap<String, &str> = HashMap::new();
    let mut total = 0;
    for q in queues {
        let messages = drain(&ch, q).await;
        assert!(!messages.is_empty(), "{q} got no aggregate");
        total += messages.len();
        let mut last: HashMap<String, u64> = HashMap::new();
        for m in &messages {
            let agg = long_string(header(m, KEY_HEADER));
            let id = m
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default();
            let seq: u64 = id
                .rsplit('-')
                .next()
                .and_then(|s| s.parse().ok())
                .expect("seq");
            assert_eq!(
                *home.entry(agg.clone()).or_insert(q),
                q,
                "{agg} in two queues"
            );
            if let Some(prev) = last.insert(agg.clone(), seq) {
                assert!(prev < seq, "{agg}: {seq} after {prev} in {q}");
            }
        }
    }
    assert_eq!(total, n as usize);
    assert_eq!(home.len(), aggregates.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_killed_node_loses_no_acked_record_and_fails_the_rest_transient() {
    let Some(mut node) = own_rabbitmq(RabbitMqOptions::default()) else {
        return;
    };
    {
        let (conn, ch) = client(&node).await;
        exchange(&ch, "kill.x", ExchangeKind::Direct).await;
        queue(&ch, "kill.q", "kill.x", "k").await;
        let _ = conn.close(200, "bye".into()).await;
    }
    let ackq = Arc::new(AckQueue::default());
    let sink = rabbitmq::connect(&config(&node, "kill.x", "guest"), ackq.clone())
        .await
        .expect("connect");
    let n: u64 = 20_000;
    let mut got = Vec::new();
    let mut sent = 0;
    // Publish until some records are confirmed, then kill the node with more in flight.
    while sent < n {
        match sink.send(&event("k", "a", sent), sent, 0) {
            Ok(()) => sent += 1,
            Err(SinkError::QueueFull) => tokio::task::yield_now().await,
            Err(e) => panic!("send {sent}: {e}"),
        }
        if sent % 500 == 0 {
            let mut batch = Vec::new();
            ackq.drain_into(&mut batch);
            got.append(&mut batch);
            if got.len() >= 1000 {
                break;
            }
        }
    }
    if got.len() < 1000 {
        got.extend(acks(&ackq, 1000 - got.len()).await);
    }
    node.kill();
    // Every record gets its ack; until the relay took them all, new records are refused.
    assert!(sink.flush(PATIENCE));
    let refused = sink.send(&event("k", "a", sent), sent, 0).unwrap_err();
    assert_eq!(refused.class(), Class::Transient, "{refused}");
    let left = sent as usize - got.len();
    got.extend(acks(&ackq, left).await);
    assert_eq!(got.len(), sent as usize);
    assert_in_order(&got, sent);
    let ok: HashSet<String> = got
        .iter()
        .filter(|a| a.result.is_ok())
        .map(|a| format!("a-{}", a.seq))
        .collect();
    let first_failed = got.iter().position(|a| a.result.is_err());
    if let Some(i) = first_failed {
        for a in &got[i..] {
            let e = a
                .result
                .as_ref()
                .expect_err("no Ok after the first failure");
            assert_eq!(e.class(), Class::Transient, "{e}");
        }
    }
    eprintln!(
        "{} acked Ok, {} failed, of {sent}",
        ok.len(),
        sent as usize - ok.len()
    );

    tokio::task::block_in_place(|| node.start_again()).expect("start again");
    let (_conn, ch) = client(&node).await;
    // A node killed while publishing can come back with a durable queue's binding missing
    // from its routing table (rabbitmq-server#1873, #5075): the next record would be returned
    // unroutable. Binding again (declare and bind are idempotent) is the operator's cure.
    queue(&ch, "kill.q", "kill.x", "k").await;
    let kept: HashSet<String> = drain(&ch, "kill.q")
        .await
        .iter()
        .filter_map(|m| m.properties.message_id().as_ref().map(|s| s.to_string()))
        .collect();
    let missing: Vec<&String> = ok.difference(&kept).collect();
    assert!(missing.is_empty(), "acked Ok but lost: {missing:?}");

    // The next session's first record connects again.
    send(&sink, &event("k", "a", sent + 1), sent + 1).await;
    let after = acks(&ackq, 1).await;
    assert!(after[0].result.is_ok(), "{:?}", after[0].result);
}

/// `walbox check`'s RabbitMQ lines: (name, status) pairs.
async fn check_lines(c: &RabbitMqConfig) -> Vec<(String, Status)> {
    walbox::preflight::rabbitmq::checks_of(c)
        .await
        .into_iter()
        .map(|c| (c.name, c.status))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_check_lines() {
    let Some(node) = rabbitmq() else { return };
    let (_conn, ch) = client(node).await;
    exchange(&ch, "check.x", ExchangeKind::Topic).await;
    exchange(
        &ch,
        "check.hash",
        ExchangeKind::Custom("x-consistent-hash".into()),
    )
    .await;
    queue(&ch, "check.hash.q", "check.hash", "1").await;
    let ok = check_lines(&config(node, "check.x", "guest")).await;
    assert!(ok.iter().all(|(_, s)| *s == Status::Ok), "{ok:?}");
    assert_eq!(ok.len(), 5, "{ok:?}");
    let hash = walbox::preflight::rabbitmq::checks_of(&config(node, "check.hash", "guest")).await;
    let publish = hash
        .iter()
        .find(|c| c.name.contains("publish"))
        .expect("publish line");
    assert_eq!(publish.status, Status::Ok, "{publish:?}");
    assert!(publish.detail.contains("routes every key"), "{publish:?}");
    let missing = check_lines(&config(node, "check.none", "guest")).await;
    assert_eq!(missing[2].1, Status::Fail, "{missing:?}");
    assert_eq!(missing[3].1, Status::Skipped, "{missing:?}");
    let refused = check_lines(&config(node, "check.x", "wrong-password")).await;
    assert_eq!(refused[0].1, Status::Ok, "{refused:?}");
    assert_eq!(refused[1].1, Status::Fail, "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_message_over_max_message_size_is_rejected_and_the_rest_fail_transient() {
    let Some(node) = own_rabbitmq(RabbitMqOptions::default()) else {
        return;
    };
    // Channels opened from now on take the smaller limit (RabbitMQ 3.10's default: 128 MiB).
    node.run(
        "rabbitmqctl",
        &[
            "eval",
            "application:set_env(rabbit, max_message_size, 1048576).",
        ],
    )
    .expect("set max_message_size");
    let (_conn, ch) = client(&node).await;
    exchange(&ch, "size.x", ExchangeKind::Direct).await;
    queue(&ch, "size.q", "size.x", "k").await;
    let ackq = Arc::new(AckQueue::default());
    let sink = rabbitmq::connect(&config(&node, "size.x", "guest"), ackq.clone())
        .await
        .expect("connect");
    send(&sink, &event("k", "a", 0), 0).await;
    let mut big = event("k", "a", 1);
    big.value = Some(Bytes::from(vec![b'x'; 2 << 20]));
    send(&sink, &big, 1).await;
    send(&sink, &event("k", "a", 2), 2).await;
    let got = acks(&ackq, 3).await;
    assert_in_order(&got, 3);
    let e = got[1].result.as_ref().expect_err("the large record");
    assert_eq!(e.class(), Class::Rejected, "{e}");
    assert!(e.to_string().contains("max_message_size"), "{e}");
    for a in [&got[0], &got[2]] {
        if let Err(e) = &a.result {
            assert_eq!(e.class(), Class::Transient, "{e}");
        }
    }
    assert!(
        got[2].result.is_err(),
        "a record after the refusal is never acked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walbox_run_relays_the_outbox_to_rabbitmq_in_commit_order() {
    use crate::support::events::write_txns;
    use crate::support::{wait_until, walbox_env, TestDb, Walbox};
    let Some(node) = rabbitmq() else { return };
    let db = TestDb::new("rabbit_e2e");
    let slot = db.name.clone();
    let (_conn, ch) = client(node).await;
    exchange(&ch, "e2e.x", ExchangeKind::Topic).await;
    let q = format!("e2e.{slot}");
    queue(&ch, &q, "e2e.x", "#").await;
    let mut env: Vec<(String, String)> = walbox_env(&db, &slot, "")
        .into_iter()
        .filter(|(k, _)| k != "WALBOX_KAFKA_BROKERS")
        .collect();
    env.extend(
        [
            (
                "WALBOX_RABBITMQ_URL",
                format!("amqp://guest@127.0.0.1:{}/%2f", node.port()),
            ),
            ("WALBOX_RABBITMQ_PASSWORD", "guest".to_owned()),
            ("WALBOX_RABBITMQ_EXCHANGE", "e2e.x".to_owned()),
        ]
        .map(|(k, v)| (k.to_owned(), v)),
    );
    let walbox = Walbox::spawn(&env);
    let aggregates: Vec<String> = (0..5).map(|i| format!("agg-{i}")).collect();
    wait_until(PATIENCE, "walbox to stream", || db.slot_active(&slot));
    let ids = write_txns(&db, "e2e", &aggregates, 40);
    let mut got = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    while got.len() < ids.len() {
        assert!(
            Instant::now() < deadline,
            "{} of {} events; log:\n{}",
            got.len(),
            ids.len(),
            walbox.log()
        );
        got.extend(drain(&ch, &q).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let bodies: Vec<i64> = got
        .iter()
        .map(|m| long_string(header(m, "id")).parse().expect("id header"))
        .collect();
    assert_eq!(bodies, ids, "every event once, in commit order");
    // The slot's progress record: one message in its own progress queue.
    let suffix = format!("_{slot}");
    wait_until(PATIENCE, "the progress queue", || {
        let queues = node
            .run("rabbitmqctl", &["-q", "list_queues", "name", "messages"])
            .expect("list_queues");
        queues.lines().any(|l| {
            let mut f = l.split_whitespace();
            let (name, n) = (f.next().unwrap_or(""), f.next().unwrap_or(""));
            name.starts_with("walbox.progress.") && name.ends_with(&suffix) && n == "1"
        })
    });
    drop(walbox);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_publish_without_write_permission_is_fatal_naming_exchange_and_user() {
    let Some(node) = rabbitmq() else { return };
    let (_conn, ch) = client(node).await;
    exchange(&ch, "denied.x", ExchangeKind::Direct).await;
    queue(&ch, "denied.q", "denied.x", "k").await;
    node.run("rabbitmqctl", &["add_user", "reader", "reader-pw"])
        .expect("add_user");
    // Configure and read anything, write nothing.
    node.run(
        "rabbitmqctl",
        &["set_permissions", "-p", "/", "reader", ".*", "^$", ".*"],
    )
    .expect("set_permissions");
    let mut c = config(node, "denied.x", "reader-pw");
    c.url = format!("amqp://reader@127.0.0.1:{}/%2f", node.port());
    let ackq = Arc::new(AckQueue::default());
    let sink = rabbitmq::connect(&c, ackq.clone()).await.expect("connect");
    send(&sink, &event("k", "a", 0), 0).await;
    let got = acks(&ackq, 1).await;
    let e = got[0].result.as_ref().expect_err("refused");
    assert_eq!(e.class(), Class::Fatal(Failure::Kafka), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("denied.x") && text.contains("reader"),
        "{text}"
    );
    let lines = check_lines(&c).await;
    let publish = lines
        .iter()
        .find(|(n, _)| n.contains("publish"))
        .expect("line");
    assert_eq!(publish.1, Status::Fail, "{lines:?}");
}
