//! The Redis Streams publisher against a real `redis-server`: entries in order with ids from
//! WAL positions, re-sends confirmed as delivered (also when trimmed), a gap fatal, a wrong-type
//! key the record's fault, refused credentials fatal without the secret, a killed server
//! failing what it did not acknowledge, progress records read back.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use walbox::config::RedisConfig;
use walbox::failure::{Class, Failure};
use walbox::outbox::{EventPosition, HeaderName, OutboxEvent};
use walbox::sandbox::redis::{RedisOptions, RedisServer};
use walbox::sink::redis::{connect, read_progress, RedisSink};
use walbox::sink::{Ack, AckQueue, Publisher, PROGRESS_ROUTE};

use crate::support::brokers::{own_redis, redis};
use crate::support::unique;

/// An event for `stream` at WAL position `lsn`-`index`.
fn event(stream: &str, lsn: u64, index: u32) -> OutboxEvent {
    let id = format!("ev-{lsn}-{index}");
    OutboxEvent {
        topic: stream.into(),
        partition: None,
        key: Some(Bytes::from(format!("agg-{}", lsn % 7))),
        value: Some(Bytes::from(format!("{{\"n\":{lsn}}}"))),
        headers: [
            (HeaderName::Static("id"), Some(Bytes::from(id.clone()))),
            (
                HeaderName::Static("walbox.commit_lsn"),
                Some(Bytes::from(lsn.to_string())),
            ),
            (
                HeaderName::Static("walbox.index"),
                Some(Bytes::from(index.to_string())),
            ),
        ]
        .into_iter()
        .collect(),
        timestamp_ms: 0,
        id: Bytes::from(id),
        position: EventPosition {
            commit_lsn: lsn.into(),
            index,
            commit_time: 0,
        },
        source: "public.outbox".into(),
    }
}

/// Waits (up to 30 s) until `n` acks arrived; returns them in arrival order.
async fn acks(queue: &AckQueue, n: usize) -> Vec<Ack> {
    let mut all = Vec::new();
    while all.len() < n {
        let mut batch = Vec::new();
        queue.drain_into(&mut batch);
        if batch.is_empty() {
            tokio::time::timeout(Duration::from_secs(30), queue.wait())
                .await
                .unwrap_or_else(|_| panic!("{} of {n} acks within 30 s", all.len()));
        }
        all.extend(batch);
    }
    all
}

/// Sends `events` with sequence numbers from `seq0`, retrying while the queue is full.
async fn send_all(sink: &RedisSink, events: &[OutboxEvent], seq0: u64) {
    for (i, e) in events.iter().enumerate() {
        loop {
            match sink.send(e, seq0 + i as u64, 1) {
                Ok(()) => break,
                Err(walbox::sink::SinkError::QueueFull) => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                Err(e) => panic!("send: {e}"),
            }
        }
    }
}

fn class(ack: &Ack) -> Option<Class> {
    ack.result.as_ref().err().map(|e| e.class())
}

fn xlen(redis: &RedisServer, stream: &str) -> usize {
    let reply = redis.command(&["XLEN", stream]).unwrap();
    reply.trim_start_matches(':').trim().parse().unwrap()
}

async fn sink_for(url: String) -> (RedisSink, Arc<AckQueue>) {
    let queue = Arc::new(AckQueue::default());
    let sink = connect(&RedisConfig::for_url(url), queue.clone())
        .await
        .expect("connect");
    (sink, queue)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_published_in_order_with_wal_ids_and_resent_ones_confirmed_once() {
    let Some(redis) = redis() else { return };
    let streams: Vec<String> = (0..4).map(|i| unique(&format!("orders{i}"))).collect();
    let events: Vec<OutboxEvent> = (0..1000u64)
        .map(|i| event(&streams[(i % 4) as usize], 1000 + i / 3, (i % 3) as u32))
        .collect();
    let (sink, queue) = sink_for(redis.url()).await;
    send_all(&sink, &events, 0).await;
    let got = acks(&queue, 1000).await;
    let seqs: Vec<u64> = got.iter().map(|a| a.seq).collect();
    assert_eq!(seqs, (0..1000).collect::<Vec<_>>(), "acks in send order");
    assert!(got.iter().all(|a| a.result.is_ok() && a.route == 1));
    assert!(sink.flush(Duration::from_secs(5)));
    for s in &streams {
        assert_eq!(xlen(redis, s), 250);
    }
    // The first event's entry: its id is its WAL position, its fields all there.
    let entry = redis
        .command(&["XRANGE", &streams[0], "1000-0", "1000-0"])
        .unwrap();
    for field in [
        "key",
        "agg-6",
        "payload",
        "{\"n\":1000}",
        "id",
        "ev-1000-0",
        "walbox.commit_lsn",
    ] {
        assert!(entry.contains(field), "{field} in {entry:?}");
    }
    // The same events again (a restart, a standby taking over): all Ok, each held once.
    send_all(&sink, &events, 1000).await;
    let again = acks(&queue, 1000).await;
    assert!(
        again.iter().all(|a| a.result.is_ok()),
        "{:?}",
        again.iter().find(|a| a.result.is_err())
    );
    assert_eq!(sink.already_delivered(), 1000);
    for s in &streams {
        assert_eq!(xlen(redis, s), 250, "no duplicate in {s}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trimmed_resent_entry_is_delivered_and_a_gap_is_fatal() {
    let Some(redis) = redis() else { return };
    let stream = unique("trimmed");
    let mut config = RedisConfig::for_url(redis.url());
    config.maxlen = Some(1);
    let queue = Arc::new(AckQueue::default());
    let sink = connect(&config, queue.clone()).await.unwrap();
    let events: Vec<OutboxEvent> = (1..=200).map(|i| event(&stream, i, 0)).collect();
    send_all(&sink, &events, 0).await;
    assert!(acks(&queue, 200).await.iter().all(|a| a.result.is_ok()));
    // Trim for sure (`~` trims whole nodes only).
    redis.command(&["XTRIM", &stream, "MAXLEN", "1"]).unwrap();
    assert_eq!(xlen(redis, &stream), 1);
    send_all(&sink, &events[..10], 200).await;
    let resent = acks(&queue, 10).await;
    assert!(
        resent.iter().all(|a| a.result.is_ok()),
        "{:?}",
        resent.iter().find(|a| a.result.is_err())
    );

    // Another client writes a higher id: walbox's next entry would be out of order.
    let gap = unique("gap");
    redis.command(&["XADD", &gap, "900-0", "f", "v"]).unwrap();
    let (sink, queue) = sink_for(redis.url()).await;
    send_all(&sink, &[event(&gap, 500, 3)], 0).await;
    let ack = acks(&queue, 1).await.remove(0);
    assert_eq!(class(&ack), Some(Class::Fatal(Failure::Kafka)));
    let message = ack.result.unwrap_err().to_string();
    assert!(
        message.contains(&gap) && message.contains("500-3") && message.contains("ev-500-3"),
        "{message}"
    );
    assert_eq!(ack.failed.unwrap().topic, gap);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_rejects_its_record_only() {
    let Some(redis) = redis() else { return };
    let (string, stream) = (unique("a_string"), unique("fine"));
    redis.command(&["SET", &string, "x"]).unwrap();
    let (sink, queue) = sink_for(redis.url()).await;
    let events = [
        event(&stream, 10, 0),
        event(&string, 11, 0),
        event(&stream, 12, 0),
    ];
    send_all(&sink, &events, 0).await;
    let got = acks(&queue, 3).await;
    assert!(got[0].result.is_ok() && got[2].result.is_ok(), "{got:?}");
    assert_eq!(class(&got[1]), Some(Class::Rejected));
    let message = got[1].result.as_ref().unwrap_err().to_string();
    assert!(
        message.contains("WRONGTYPE") && message.contains(&string),
        "{message}"
    );
    assert_eq!(got[1].failed.as_ref().unwrap().id, "ev-11-0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_fatal_and_never_shown() {
    let Some(redis) = redis() else { return };
    let user = unique("walbox_user");
    redis
        .command(&[
            "ACL",
            "SETUSER",
            &user,
            "on",
            ">right-secret",
            "~*",
            "+@all",
        ])
        .unwrap();
    let mut config = RedisConfig::for_url(redis.url());
    config.user = Some(user.clone());
    config.password = Some(walbox::config::secret::Secret::new("wrong-secret".into()));
    let e = match connect(&config, Arc::default()).await {
        Ok(_) => panic!("a wrong password connected"),
        Err(e) => e,
    };
    assert_eq!(e.class(), Class::Fatal(Failure::Auth), "{e}");
    let message = e.to_string();
    assert!(
        !message.contains("secret") && !message.contains('\n'),
        "{message}"
    );
    config.password = Some(walbox::config::secret::Secret::new("right-secret".into()));
    let queue = Arc::new(AckQueue::default());
    let sink = connect(&config, queue.clone())
        .await
        .expect("the right password");
    send_all(&sink, &[event(&unique("acl"), 5, 0)], 0).await;
    assert!(acks(&queue, 1).await[0].result.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_records_round_trip_and_none_when_absent() {
    let Some(redis) = redis() else { return };
    let mut config = RedisConfig::for_url(redis.url());
    config.progress_key_prefix = unique("progress") + ":";
    let queue = Arc::new(AckQueue::default());
    let sink = connect(&config, queue.clone()).await.unwrap();
    assert_eq!(read_progress(&config, "sys/db/slot").await.unwrap(), None);
    sink.send_progress("sys/db/slot", b"{\"v\":1}").unwrap();
    sink.send_progress("sys/db/slot", b"{\"v\":2}").unwrap();
    let got = acks(&queue, 2).await;
    assert!(got
        .iter()
        .all(|a| a.route == PROGRESS_ROUTE && a.result.is_ok()));
    assert_eq!(
        read_progress(&config, "sys/db/slot")
            .await
            .unwrap()
            .as_deref(),
        Some(&b"{\"v\":2}"[..])
    );
    assert_eq!(read_progress(&config, "sys/db/other").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_fails_what_it_did_not_acknowledge_and_keeps_what_it_did() {
    let Some(mut redis) = own_redis(RedisOptions {
        appendonly: true,
        ..Default::default()
    }) else {
        return;
    };
    let stream = "killed";
    let (sink, queue) = sink_for(redis.url()).await;
    let events: Vec<OutboxEvent> = (1..=20_000).map(|i| event(stream, i, 0)).collect();
    let sending = {
        let (sink, events) = (sink.clone(), events.clone());
        tokio::spawn(async move { send_all(&sink, &events, 0).await })
    };
    // Kill once some, not all, are acknowledged.
    let mut got = Vec::new();
    while got.len() < 500 {
        got.extend(acks(&queue, 1).await);
    }
    redis.kill();
    sending.await.unwrap();
    got.extend(acks(&queue, events.len() - got.len()).await);
    let ok: Vec<u64> = got
        .iter()
        .filter(|a| a.result.is_ok())
        .map(|a| a.seq)
        .collect();
    let failed: Vec<&Ack> = got.iter().filter(|a| a.result.is_err()).collect();
    assert!(!failed.is_empty(), "the kill failed something");
    assert!(
        failed.iter().all(|a| class(a) == Some(Class::Transient)),
        "{:?}",
        failed.iter().find(|a| class(a) != Some(Class::Transient))
    );
    // Acknowledged Ok: a prefix of the sequence, every one of them on disk.
    assert_eq!(ok, (0..ok.len() as u64).collect::<Vec<_>>());
    redis.start_again().unwrap();
    assert!(
        xlen(&redis, stream) >= ok.len(),
        "nothing acknowledged is missing"
    );
    // The next session re-sends from the first failed one: the publisher reconnects, confirms
    // what the server kept, and publishes the rest.
    let from = ok.len();
    send_all(&sink, &events[from..], 100_000).await;
    let rest = acks(&queue, events.len() - from).await;
    assert!(
        rest.iter().all(|a| a.result.is_ok()),
        "{:?}",
        rest.iter().find(|a| a.result.is_err())
    );
    assert_eq!(xlen(&redis, stream), events.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walbox_check_reports_reachability_version_persistence_acl_and_progress() {
    let Some(redis) = redis() else { return };
    let stream = unique("checked");
    let user = unique("check_user");
    // May write only its progress keys: XADD on the stream is refused.
    redis
        .command(&["ACL", "SETUSER", &user, "on", ">pw", "~walbox:*", "+@all"])
        .unwrap();
    let load = |user: Option<&str>| {
        let mut vars = vec![
            (
                "WALBOX_POSTGRES_URL".to_owned(),
                "postgres://walbox@localhost/app".to_owned(),
            ),
            ("WALBOX_REDIS_URL".to_owned(), redis.url()),
            ("WALBOX_OUTBOX_TOPIC".to_owned(), stream.clone()),
        ];
        if let Some(user) = user {
            vars.push(("WALBOX_REDIS_USER".to_owned(), user.to_owned()));
            vars.push(("WALBOX_REDIS_PASSWORD".to_owned(), "pw".to_owned()));
        }
        walbox::config::load_from(None, &mut vars.into_iter()).expect("config")
    };
    let status = |checks: &[walbox::preflight::Check], name: &str| {
        checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("{name} in {checks:?}"))
            .clone()
    };
    use walbox::preflight::Status;
    let config = load(None);
    let walbox::config::BrokerConfig::Redis(r) = &config.broker else {
        panic!("the broker is redis")
    };
    let checks = walbox::preflight::redis::checks(&config, r).await;
    assert_eq!(
        status(&checks, "redis server").status,
        Status::Ok,
        "{checks:?}"
    );
    assert_eq!(status(&checks, "redis version").status, Status::Ok);
    // The shared server keeps no append-only file.
    let persistence = status(&checks, "redis persistence");
    assert_eq!(persistence.status, Status::Warn);
    assert!(
        persistence.detail.contains("appendonly no"),
        "{persistence:?}"
    );
    let xadd = format!("redis stream {stream}");
    assert_eq!(status(&checks, &xadd).status, Status::Ok, "{checks:?}");
    assert_eq!(
        status(&checks, "redis progress key").status,
        Status::Ok,
        "{checks:?}"
    );

    let config = load(Some(&user));
    let walbox::config::BrokerConfig::Redis(r) = &config.broker else {
        panic!("the broker is redis")
    };
    let checks = walbox::preflight::redis::checks(&config, r).await;
    let refused = status(&checks, &xadd);
    assert_eq!(refused.status, Status::Fail, "{checks:?}");
    assert!(refused.fix.unwrap().contains("+xadd"), "{checks:?}");
    assert_eq!(
        status(&checks, "redis progress key").status,
        Status::Ok,
        "{checks:?}"
    );

    // XADD, but not XINFO: re-sent entries could not be confirmed.
    let reader = unique("no_xinfo");
    redis
        .command(&[
            "ACL", "SETUSER", &reader, "on", ">pw", "~*", "+@all", "-xinfo",
        ])
        .unwrap();
    let config = load(Some(&reader));
    let walbox::config::BrokerConfig::Redis(r) = &config.broker else {
        panic!("the broker is redis")
    };
    let checks = walbox::preflight::redis::checks(&config, r).await;
    let refused = status(&checks, &xadd);
    assert_eq!(refused.status, Status::Fail, "{checks:?}");
    assert!(refused.fix.unwrap().contains("+xinfo|stream"), "{checks:?}");

    let mut wrong = r.clone();
    wrong.password = Some(walbox::config::secret::Secret::new("nope".into()));
    let checks = walbox::preflight::redis::checks(&config, &wrong).await;
    assert_eq!(status(&checks, "redis server").status, Status::Fail);
    assert_eq!(status(&checks, "redis version").status, Status::Skipped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_publishes_over_tls_verified_by_the_configured_ca() {
    let Some(redis) = own_redis(RedisOptions {
        tls: true,
        ..Default::default()
    }) else {
        return;
    };
    let (url, ca) = (redis.tls_url().unwrap(), redis.ca_file().unwrap());
    let mut config = RedisConfig::for_url(url.clone());
    config.tls_ca = Some(std::fs::read(ca).unwrap());
    let queue = Arc::new(AckQueue::default());
    let sink = connect(&config, queue.clone())
        .await
        .expect("TLS with the CA");
    send_all(&sink, &[event("tls", 7, 0)], 0).await;
    assert!(acks(&queue, 1).await[0].result.is_ok());
    assert_eq!(xlen(&redis, "tls"), 1);
    // The system's roots do not know the sandbox's CA: refused.
    let e = connect(&RedisConfig::for_url(url), Arc::default())
        .await
        .err()
        .expect("an unknown CA is refused");
    assert!(e.to_string().contains("redis"), "{e}");
}

/// Out of memory: the refused event and every later one fail (transient), later ones without
/// being sent, until the refused one comes again; then they are published, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_transient_refusal_nothing_later_is_published_until_the_resend() {
    let Some(redis) = own_redis(RedisOptions::default()) else {
        return;
    };
    let stream = "oom";
    let (sink, queue) = sink_for(redis.url()).await;
    send_all(&sink, &[event(stream, 10, 0)], 0).await;
    assert!(acks(&queue, 1).await[0].result.is_ok());
    redis.command(&["CONFIG", "SET", "maxmemory", "1"]).unwrap();
    let events: Vec<OutboxEvent> = (11..=20).map(|i| event(stream, i, 0)).collect();
    send_all(&sink, &events[..5], 1).await;
    let failed = acks(&queue, 5).await;
    assert!(
        failed.iter().all(|a| class(a) == Some(Class::Transient)),
        "{failed:?}"
    );
    let first = failed[0].result.as_ref().unwrap_err().to_string();
    assert!(
        first.contains("OOM") && first.contains("maxmemory"),
        "{first}"
    );
    redis.command(&["CONFIG", "SET", "maxmemory", "0"]).unwrap();
    // Sent by the failed session before it saw the failure: not published.
    send_all(&sink, &events[5..7], 6).await;
    let held = acks(&queue, 2).await;
    assert!(
        held.iter().all(|a| class(a) == Some(Class::Transient)),
        "{held:?}"
    );
    assert!(held[0]
        .result
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("an earlier record (entry 11-0) failed"));
    assert_eq!(
        xlen(&redis, stream),
        1,
        "nothing overtook the refused event"
    );
    // The next session re-sends from the refused event.
    send_all(&sink, &events, 100).await;
    assert!(acks(&queue, 10).await.iter().all(|a| a.result.is_ok()));
    assert_eq!(xlen(&redis, stream), 11);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_or_a_forbidden_key_is_fatal_with_what_to_fix() {
    let Some(shared) = redis() else { return };
    let (stream, user) = (unique("forbidden"), unique("no_xadd"));
    shared
        .command(&["ACL", "SETUSER", &user, "on", ">pw", "~*", "+@all", "-xadd"])
        .unwrap();
    let mut config = RedisConfig::for_url(shared.url());
    config.user = Some(user);
    config.password = Some(walbox::config::secret::Secret::new("pw".into()));
    let queue = Arc::new(AckQueue::default());
    let sink = connect(&config, queue.clone()).await.unwrap();
    send_all(&sink, &[event(&stream, 3, 0)], 0).await;
    let ack = acks(&queue, 1).await.remove(0);
    assert_eq!(class(&ack), Some(Class::Fatal(Failure::Kafka)));
    let message = ack.result.unwrap_err().to_string();
    assert!(
        message.contains("NOPERM") && message.contains("XADD") && message.contains(&stream),
        "{message}"
    );

    let Some(replica) = own_redis(RedisOptions::default()) else {
        return;
    };
    let port = shared.port().to_string();
    replica.command(&["REPLICAOF", "127.0.0.1", &port]).unwrap();
    let (sink, queue) = sink_for(replica.url()).await;
    send_all(&sink, &[event(&stream, 4, 0)], 0).await;
    let ack = acks(&queue, 1).await.remove(0);
    assert_eq!(class(&ack), Some(Class::Fatal(Failure::Kafka)));
    let message = ack.result.unwrap_err().to_string();
    assert!(
        message.contains("point redis.url at the primary"),
        "{message}"
    );
}
