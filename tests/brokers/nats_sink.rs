//! The NATS JetStream publisher against a real `nats-server -js`: records stored in order per
//! subject with every header and `Nats-Msg-Id`, no duplicate when the same events are sent
//! again, a subject no stream captures refused as the record's fault, refused credentials
//! fatal without the password in the message, a server killed mid-stream failing the unacked
//! records as transient and never acknowledging one it did not keep, progress records.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use walbox::config::secret::Secret;
use walbox::config::{NatsAuth, NatsConfig};
use walbox::failure::{Class, Failure};
use walbox::outbox::{
    EventPosition, HeaderName, Headers, OutboxEvent, COMMIT_LSN_HEADER, INDEX_HEADER, KEY_HEADER,
    SOURCE_HEADER,
};
use walbox::sandbox::nats::NatsOptions;
use walbox::sink::nats::{connect, read_progress, NatsSink};
use walbox::sink::{Ack, AckQueue, Publisher, SinkError, PROGRESS_ROUTE};

use crate::support::brokers::{nats, own_nats};
use crate::support::unique;

fn event(subject: &str, i: u32, id: &str) -> OutboxEvent {
    let mut headers = Headers::new();
    let mut h = |name: &'static str, value: String| {
        headers.push((HeaderName::Static(name), Some(Bytes::from(value))))
    };
    h("id", id.to_owned());
    h("event_type", "created".into());
    h(COMMIT_LSN_HEADER, format!("0/{:X}", 0x1000 + i));
    h(INDEX_HEADER, i.to_string());
    h(SOURCE_HEADER, "public.outbox".into());
    OutboxEvent {
        topic: subject.into(),
        partition: None,
        key: Some(Bytes::from(format!("aggregate-{}", i % 20))),
        value: Some(Bytes::from(format!("{{\"n\":{i}}}"))),
        headers,
        timestamp_ms: 0,
        id: Bytes::from(id.to_owned()),
        position: EventPosition::default(),
        source: "public.outbox".into(),
    }
}

async fn jetstream_of(url: &str) -> jetstream::Context {
    jetstream::new(async_nats::connect(url).await.unwrap())
}

/// A file-storage stream `name` capturing `<name>.>`.
pub(crate) async fn make_stream(js: &jetstream::Context, name: &str) {
    js.create_stream(stream::Config {
        name: name.to_owned(),
        subjects: vec![format!("{name}.>")],
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .unwrap();
}

/// Every message of `name`, in stream order: (subject, headers, payload).
async fn read_stream(
    js: &jetstream::Context,
    name: &str,
) -> Vec<(String, async_nats::HeaderMap, Bytes)> {
    let mut s = js.get_stream(name).await.unwrap();
    let info = s.info().await.unwrap();
    let (first, last) = (info.state.first_sequence, info.state.last_sequence);
    let mut out = Vec::new();
    if info.state.messages == 0 {
        return out;
    }
    for seq in first..=last {
        let m = s.get_raw_message(seq).await.unwrap();
        out.push((m.subject.to_string(), m.headers, m.payload));
    }
    out
}

/// The first `n` messages of `name`, read through a pull consumer (no acks).
async fn consume(
    js: &jetstream::Context,
    name: &str,
    n: usize,
) -> Vec<(String, async_nats::HeaderMap, Bytes)> {
    use futures_util::StreamExt;
    let consumer = js
        .get_stream(name)
        .await
        .unwrap()
        .create_consumer(jetstream::consumer::pull::Config {
            ack_policy: jetstream::consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = consumer.messages().await.unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        let m = tokio::time::timeout(Duration::from_secs(30), messages.next())
            .await
            .expect("the consumer delivers")
            .expect("the stream of messages ended")
            .unwrap();
        let headers = m.headers.clone().unwrap_or_default();
        out.push((m.subject.to_string(), headers, m.payload.clone()));
    }
    out
}

/// Sends `events` (seq = index), retrying while the queue is full.
fn send_all(sink: &NatsSink, events: &[OutboxEvent], first_seq: u64) {
    for (i, e) in events.iter().enumerate() {
        loop {
            match sink.send(e, first_seq + i as u64, 0) {
                Ok(()) => break,
                Err(SinkError::QueueFull) => std::thread::yield_now(),
                Err(e) => panic!("send refused: {e}"),
            }
        }
    }
}

/// Waits for `n` acks (at most `within`).
async fn take(acks: &AckQueue, n: usize, within: Duration) -> Vec<Ack> {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    let mut batch = Vec::new();
    loop {
        acks.drain_into(&mut batch);
        out.append(&mut batch);
        if out.len() >= n {
            return out;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            tokio::time::timeout(left, acks.wait()).await.is_ok(),
            "{} of {n} acks after {within:?}",
            out.len()
        );
    }
}

fn config(url: &str) -> NatsConfig {
    NatsConfig::for_url(url)
}

fn header<'a>(h: &'a async_nats::HeaderMap, name: &str) -> &'a str {
    h.get(name).map(|v| v.as_str()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_stored_in_order_per_subject_with_every_header() {
    let Some(server) = nats() else { return };
    let js = jetstream_of(&server.url()).await;
    let name = unique("ordered").replace('_', "-");
    make_stream(&js, &name).await;
    let acks = Arc::new(AckQueue::default());
    let sink = connect(&config(&server.url()), acks.clone()).await.unwrap();
    let events: Vec<OutboxEvent> = (0..1000u32)
        .map(|i| event(&format!("{name}.s{}", i % 20), i, &format!("{name}-{i}")))
        .collect();
    send_all(&sink, &events, 0);
    let got = take(&acks, 1000, Duration::from_secs(60)).await;
    let mut seqs = HashSet::new();
    for a in &got {
        assert!(a.result.is_ok(), "{:?}", a.result);
        assert!(seqs.insert(a.seq), "two acks for {}", a.seq);
    }
    assert!(sink.flush(Duration::from_secs(1)));
    assert_eq!(sink.in_flight(), 0);
    assert_eq!(sink.unconfirmed_span(), Duration::ZERO);

    let stored = consume(&js, &name, 1000).await;
    assert_eq!(stored.len(), 1000);
    assert_eq!(
        read_stream(&js, &name).await.len(),
        1000,
        "no more than that"
    );
    let mut last: HashMap<String, i64> = HashMap::new();
    for (subject, h, payload) in &stored {
        let i: u32 = header(h, INDEX_HEADER).parse().unwrap();
        let e = &events[i as usize];
        assert_eq!(subject.as_str(), &*e.topic);
        assert_eq!(header(h, "Nats-Msg-Id"), format!("{name}-{i}"));
        assert_eq!(header(h, "id"), format!("{name}-{i}"));
        assert_eq!(header(h, "event_type"), "created");
        assert_eq!(header(h, COMMIT_LSN_HEADER), format!("0/{:X}", 0x1000 + i));
        assert_eq!(header(h, SOURCE_HEADER), "public.outbox");
        assert_eq!(header(h, KEY_HEADER), format!("aggregate-{}", i % 20));
        assert_eq!(Some(payload), e.value.as_ref());
        let prev = last.insert(subject.clone(), i64::from(i)).unwrap_or(-1);
        assert!(i64::from(i) > prev, "{subject}: {i} stored after {prev}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_events_sent_twice_are_stored_once() {
    let Some(server) = nats() else { return };
    let js = jetstream_of(&server.url()).await;
    let name = unique("dedup").replace('_', "-");
    make_stream(&js, &name).await;
    let acks = Arc::new(AckQueue::default());
    let sink = connect(&config(&server.url()), acks.clone()).await.unwrap();
    let events: Vec<OutboxEvent> = (0..100u32)
        .map(|i| event(&format!("{name}.s{}", i % 5), i, &format!("{name}-{i}")))
        .collect();
    for round in 0..2u64 {
        send_all(&sink, &events, round * 100);
        let got = take(&acks, 100, Duration::from_secs(30)).await;
        assert!(got.iter().all(|a| a.result.is_ok()), "round {round}");
    }
    assert_eq!(read_stream(&js, &name).await.len(), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_no_stream_captures_is_the_records_fault() {
    let Some(server) = nats() else { return };
    let acks = Arc::new(AckQueue::default());
    let sink = connect(&config(&server.url()), acks.clone()).await.unwrap();
    let subject = unique("nowhere").replace('_', "-") + ".orders";
    sink.send(&event(&subject, 0, "x-0"), 7, 0).unwrap();
    let got = take(&acks, 1, Duration::from_secs(30)).await;
    let e = got[0].result.as_ref().unwrap_err();
    assert_eq!(e.class(), Class::Rejected, "{e}");
    assert!(e.to_string().contains(&subject), "{e}");
    assert!(e.to_string().contains("add the subject to a stream"), "{e}");
    let failed = got[0].failed.as_ref().unwrap();
    assert_eq!(
        (failed.topic.as_str(), failed.id.as_str()),
        (subject.as_str(), "x-0")
    );
    // An invalid subject is refused before anything is sent.
    let e = sink.send(&event("a..b", 1, "x-1"), 8, 0).unwrap_err();
    assert_eq!(e.class(), Class::Rejected, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_fatal_and_never_quoted() {
    let Some(server) = own_nats(NatsOptions {
        user: Some(("walbox".into(), "right-password".into())),
        ..Default::default()
    }) else {
        return;
    };
    let mut c = config(&server.url());
    c.auth = NatsAuth::UserPassword {
        user: "walbox".into(),
        password: Secret::new("wrong-password".into()),
    };
    let e = match connect(&c, Arc::new(AckQueue::default())).await {
        Ok(_) => panic!("connected with a wrong password"),
        Err(e) => e,
    };
    assert_eq!(e.class(), Class::Fatal(Failure::Auth), "{e}");
    let msg = e.to_string();
    assert!(
        !msg.contains("wrong-password") && !msg.contains('\n'),
        "{msg}"
    );
    assert!(msg.contains("password_file"), "{msg}");
    // The right one connects.
    c.auth = NatsAuth::UserPassword {
        user: "walbox".into(),
        password: Secret::new("right-password".into()),
    };
    connect(&c, Arc::new(AckQueue::default())).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_stream_acknowledges_only_what_it_kept() {
    let Some(mut server) = own_nats(NatsOptions::default()) else {
        return;
    };
    let url = server.url();
    let js = jetstream_of(&url).await;
    make_stream(&js, "killed").await;
    let acks = Arc::new(AckQueue::default());
    let mut c = config(&url);
    c.ack_timeout = Duration::from_secs(2);
    let sink = connect(&c, acks.clone()).await.unwrap();
    let total = 3000u32;
    let events: Vec<OutboxEvent> = (0..total)
        .map(|i| event(&format!("killed.s{}", i % 10), i, &format!("killed-{i}")))
        .collect();
    send_all(&sink, &events, 0);
    // Kill the server once some records are stored, not all.
    let mut got = take(&acks, 200, Duration::from_secs(60)).await;
    server.kill();
    got.extend(take(&acks, total as usize - got.len(), Duration::from_secs(60)).await);
    assert_eq!(got.len(), total as usize, "one ack per record");
    let mut ok = HashSet::new();
    let mut failed = 0;
    for a in &got {
        match &a.result {
            Ok(()) => {
                ok.insert(a.seq);
            }
            Err(e) => {
                failed += 1;
                assert_eq!(e.class(), Class::Transient, "{e}");
                assert!(a.failed.is_some());
            }
        }
    }
    assert!(failed > 0, "the kill failed nothing: {} acked", ok.len());
    drop(sink);
    server.start_again().unwrap();
    let js = jetstream_of(&url).await;
    // JetStream recovers its streams before the client port opens, yet its API may lag.
    let deadline = Instant::now() + Duration::from_secs(30);
    let stored = loop {
        match js.get_stream("killed").await {
            Ok(_) => break read_stream(&js, "killed").await,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::task::yield_now().await;
            }
            Err(e) => panic!("stream after restart: {e}; log: {}", server.log_tail()),
        }
    };
    let kept: HashSet<String> = stored
        .iter()
        .map(|(_, h, _)| header(h, "Nats-Msg-Id").to_owned())
        .collect();
    for seq in &ok {
        assert!(
            kept.contains(&format!("killed-{seq}")),
            "record {seq} acknowledged but not in the stream after the restart"
        );
    }
    // Per subject, the stored records are a prefix in order (no gap before an acked one).
    let mut last: HashMap<String, i64> = HashMap::new();
    for (subject, h, _) in &stored {
        let i: i64 = header(h, INDEX_HEADER).parse().unwrap();
        let prev = last.insert(subject.clone(), i).unwrap_or(i - 10);
        assert_eq!(i, prev + 10, "{subject}: {i} stored right after {prev}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failure_later_records_fail_until_the_relay_took_the_acks() {
    let Some(server) = nats() else { return };
    let js = jetstream_of(&server.url()).await;
    let name = unique("poison").replace('_', "-");
    make_stream(&js, &name).await;
    let acks = Arc::new(AckQueue::default());
    let mut c = config(&server.url());
    c.ack_timeout = Duration::from_secs(2);
    let sink = connect(&c, acks.clone()).await.unwrap();
    // A stream full with discard "new" refuses the second record: fatal, and the third, sent
    // before the relay took that ack, fails too (it is not stored after a gap).
    js.update_stream(stream::Config {
        name: name.clone(),
        subjects: vec![format!("{name}.>")],
        storage: stream::StorageType::File,
        max_messages: 1,
        discard: stream::DiscardPolicy::New,
        ..Default::default()
    })
    .await
    .unwrap();
    let subject = format!("{name}.a");
    sink.send(&event(&subject, 0, "p-0"), 0, 0).unwrap();
    let first = take(&acks, 1, Duration::from_secs(30)).await;
    assert!(first[0].result.is_ok());
    sink.send(&event(&subject, 1, "p-1"), 1, 0).unwrap();
    // Not drained: the relay has not taken the failure yet.
    let deadline = Instant::now() + Duration::from_secs(30);
    while sink.in_flight() > 0 {
        assert!(Instant::now() < deadline);
        tokio::time::timeout(Duration::from_millis(100), acks.wait())
            .await
            .ok();
    }
    sink.send(&event(&format!("{name}.b"), 2, "p-2"), 2, 0)
        .unwrap();
    let got = take(&acks, 2, Duration::from_secs(30)).await;
    let e = got[0].result.as_ref().unwrap_err();
    assert_eq!(e.class(), Class::Fatal(Failure::Kafka), "{e}");
    assert!(e.to_string().contains("max_msgs"), "{e}");
    assert_eq!(got[1].seq, 2);
    assert!(
        got[1].result.is_err(),
        "published after a failure the relay had not seen"
    );
    assert_eq!(read_stream(&js, &name).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_records_round_trip_and_an_unknown_key_is_none() {
    let Some(server) = nats() else { return };
    let mut c = config(&server.url());
    c.progress_bucket = unique("progress").replace('_', "-");
    // No bucket yet: never recorded.
    assert_eq!(read_progress(&c, "7312/app/walbox").await.unwrap(), None);
    let acks = Arc::new(AckQueue::default());
    let sink = connect(&c, acks.clone()).await.unwrap();
    sink.send_progress("7312/app/walbox", b"{\"v\":1}").unwrap();
    sink.send_progress("7312/app/walbox", b"{\"v\":2}").unwrap();
    let got = take(&acks, 2, Duration::from_secs(30)).await;
    for a in &got {
        assert_eq!(a.route, PROGRESS_ROUTE);
        assert!(a.result.is_ok(), "{:?}", a.result);
    }
    assert_eq!(
        read_progress(&c, "7312/app/walbox")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"{\"v\":2}"[..])
    );
    assert_eq!(read_progress(&c, "other/app/walbox").await.unwrap(), None);
}

/// `walbox check` with `[nats]`: the subjects the routes name outright, against the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_jetstream_the_bucket_and_each_literal_subject() {
    let Some(server) = nats() else { return };
    let js = jetstream_of(&server.url()).await;
    let name = unique("checked").replace('_', "-");
    make_stream(&js, &name).await;
    let short = format!("{name}-short");
    js.create_stream(stream::Config {
        name: short.clone(),
        subjects: vec![format!("{short}.>")],
        duplicate_window: Duration::from_secs(30),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut file = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(
        &mut file,
        format!(
            "[postgres]\nurl = \"postgres://walbox@127.0.0.1:1/app\"\n\
             [[outbox.tables]]\ntable = \"public.a\"\ntopic = \"{name}.orders\"\n\
             [[outbox.tables]]\ntable = \"public.b\"\ntopic = \"{short}.orders\"\n\
             [[outbox.tables]]\ntable = \"public.c\"\ntopic = \"nowhere-{name}.orders\"\n\
             [nats]\nurl = \"{}\"\n",
            server.url()
        )
        .as_bytes(),
    )
    .unwrap();
    let config = walbox::config::load_from(Some(file.path()), &mut std::iter::empty()).unwrap();
    let checks = walbox::preflight::nats::checks(&config).await;
    let status = |prefix: &str| {
        checks
            .iter()
            .find(|c| c.name.starts_with(prefix))
            .map(|c| (c.status, c.detail.clone()))
            .unwrap_or_else(|| panic!("no check {prefix}: {checks:?}"))
    };
    use walbox::preflight::Status;
    assert_eq!(status("nats servers").0, Status::Ok, "{checks:?}");
    assert_eq!(status("nats jetstream").0, Status::Ok, "{checks:?}");
    assert_eq!(status("nats progress bucket").0, Status::Ok, "{checks:?}");
    let (s, detail) = status(&format!("subject {name}.orders"));
    assert_eq!(s, Status::Ok, "{detail}");
    assert!(detail.contains("publish permitted"), "{detail}");
    assert_eq!(status(&format!("subject {short}.orders")).0, Status::Warn);
    assert_eq!(
        status(&format!("subject nowhere-{name}.orders")).0,
        Status::Fail
    );
    // The probe stored nothing.
    assert!(read_stream(&js, &name).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_walbox_may_not_publish_to_is_fatal_and_names_it() {
    let Some(server) = own_nats(NatsOptions {
        config: Some(
            "authorization {\n users = [\n  { user: walbox, password: pw, permissions: {\n   \
             publish: { allow: [\"$JS.API.>\", \"$KV.>\", \"perm.allowed.>\"] },\n   \
             subscribe: { allow: [\"_INBOX.>\"] } } }\n ]\n}\n"
                .into(),
        ),
        ..Default::default()
    }) else {
        return;
    };
    let mut c = config(&server.url());
    c.auth = NatsAuth::UserPassword {
        user: "walbox".into(),
        password: Secret::new("pw".into()),
    };
    c.ack_timeout = Duration::from_secs(1);
    let client = async_nats::ConnectOptions::with_user_and_password("walbox".into(), "pw".into())
        .connect(server.url())
        .await
        .unwrap();
    make_stream(&jetstream::new(client), "perm").await;
    let acks = Arc::new(AckQueue::default());
    let sink = connect(&c, acks.clone()).await.unwrap();
    sink.send(&event("perm.allowed.a", 0, "ok-0"), 0, 0)
        .unwrap();
    assert!(take(&acks, 1, Duration::from_secs(30)).await[0]
        .result
        .is_ok());
    sink.send(&event("perm.denied.a", 1, "no-1"), 1, 0).unwrap();
    let got = take(&acks, 1, Duration::from_secs(30)).await;
    let e = got[0].result.as_ref().unwrap_err();
    assert_eq!(e.class(), Class::Fatal(Failure::Kafka), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("perm.denied.a") && msg.contains("walbox"),
        "{msg}"
    );
    assert!(!msg.contains("pw\"") && !msg.contains('\n'), "{msg}");
}

/// `walbox run` with `[nats]`: rows of the outbox reach the stream, once each, and the slot's
/// progress record is in the bucket.
#[test]
fn walbox_run_relays_the_outbox_to_jetstream() {
    use crate::support::events::write_txns;
    use crate::support::{wait_until_or, walbox_env, TestDb, Walbox};
    let Some(server) = nats() else { return };
    let db = TestDb::new("nats_run");
    let name = unique("relayed").replace('_', "-");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let js = rt.block_on(jetstream_of(&server.url()));
    rt.block_on(make_stream(&js, &name));
    let mut env: Vec<(String, String)> = walbox_env(&db, &db.name, "")
        .into_iter()
        .filter(|(k, _)| k != "WALBOX_KAFKA_BROKERS")
        .collect();
    env.push(("WALBOX_NATS_URL".into(), server.url()));
    env.push(("WALBOX_NATS_PROGRESS_BUCKET".into(), name.clone()));
    let aggregates: Vec<String> = (0..5).map(|i| format!("a{i}")).collect();
    let subject = format!("{name}.orders");
    let walbox = Walbox::spawn(&env);
    // The slot streams what commits after it was made.
    wait_until_or(
        Duration::from_secs(30),
        "walbox streaming",
        || walbox.log().contains("streaming"),
        || walbox.log(),
    );
    let mut ids = write_txns(&db, &subject, &aggregates, 10);
    let count = |n: usize| {
        rt.block_on(async {
            let mut s = js.get_stream(&name).await.unwrap();
            s.info().await.unwrap().state.messages as usize >= n
        })
    };
    wait_until_or(
        Duration::from_secs(20),
        "the first rows in the stream",
        || count(ids.len()),
        || walbox.log(),
    );
    ids.extend(write_txns(&db, &subject, &aggregates, 10));
    wait_until_or(
        Duration::from_secs(60),
        "every row in the stream",
        || count(ids.len()),
        || walbox.log(),
    );
    let stored = rt.block_on(read_stream(&js, &name));
    let msg_ids: HashSet<String> = stored
        .iter()
        .map(|(_, h, _)| header(h, "Nats-Msg-Id").to_owned())
        .collect();
    assert_eq!(stored.len(), ids.len(), "{}", walbox.log());
    assert_eq!(msg_ids.len(), ids.len(), "one message per row");
    let mut c = config(&server.url());
    c.progress_bucket = name.clone();
    let progress = rt.block_on(async {
        let store = jetstream_of(&server.url())
            .await
            .get_key_value(name.as_str())
            .await
            .unwrap();
        let mut keys = store.keys().await.unwrap();
        futures_util::StreamExt::next(&mut keys).await
    });
    let key = progress.expect("a progress record").unwrap();
    assert!(key.ends_with(&db.name), "{key}");
    walbox.terminate();
}
