//! The real brokers of the RabbitMQ, NATS JetStream and Redis Streams sinks:
//! each server of `support::brokers` starts, answers its own protocol, and keeps its data
//! across a restart, which the broker tests will do under a backlog. Raw protocol only: no
//! client crate yet.

use walbox::sandbox::nats::NatsOptions;
use walbox::sandbox::rabbitmq::{RabbitMqOptions, PLUGINS};
use walbox::sandbox::redis::RedisOptions;

use crate::support::brokers::{nats, own_nats, own_rabbitmq, own_redis, rabbitmq, redis};
use crate::support::unique;

#[test]
fn the_shared_redis_answers_resp() {
    let Some(redis) = redis() else { return };
    assert_eq!(redis.command(&["PING"]).unwrap(), "+PONG\r\n");
    let key = unique("redis_key");
    assert_eq!(redis.command(&["SET", &key, "v"]).unwrap(), "+OK\r\n");
    assert_eq!(redis.command(&["GET", &key]).unwrap(), "$1\r\nv\r\n");
}

#[test]
fn redis_with_appendonly_keeps_a_key_across_a_restart_and_a_kill() {
    let Some(mut redis) = own_redis(RedisOptions {
        appendonly: true,
        ..Default::default()
    }) else {
        return;
    };
    let port = redis.port();
    let set = |redis: &walbox::sandbox::redis::RedisServer, key: &str| {
        assert_eq!(redis.command(&["SET", key, "kept"]).unwrap(), "+OK\r\n");
    };
    set(&redis, "before_restart");
    redis.restart().unwrap();
    assert_eq!(redis.port(), port);
    set(&redis, "before_kill");
    redis.kill();
    assert!(redis.command(&["PING"]).is_err(), "killed, yet it answers");
    redis.start_again().unwrap();
    for key in ["before_restart", "before_kill"] {
        let got = redis.command(&["GET", key]).unwrap();
        assert_eq!(got, "$4\r\nkept\r\n", "{key}; log: {}", redis.log_tail());
    }
}

#[test]
fn redis_without_appendonly_forgets_across_a_restart() {
    let Some(mut redis) = own_redis(RedisOptions::default()) else {
        return;
    };
    assert_eq!(redis.command(&["SET", "k", "v"]).unwrap(), "+OK\r\n");
    redis.restart().unwrap();
    assert_eq!(redis.command(&["GET", "k"]).unwrap(), "$-1\r\n");
}

#[test]
fn the_shared_nats_server_advertises_jetstream() {
    let Some(nats) = nats() else { return };
    let info: serde_json::Value = serde_json::from_str(&nats.info().unwrap()).unwrap();
    assert_eq!(info["jetstream"], true, "{info}");
    assert_eq!(info["port"], nats.port(), "{info}");
    let account: serde_json::Value =
        serde_json::from_str(&nats.request("$JS.API.INFO", "").unwrap()).unwrap();
    assert!(account.get("error").is_none(), "{account}");
}

#[test]
fn nats_jetstream_keeps_a_stream_and_its_message_across_a_restart() {
    let Some(mut nats) = own_nats(NatsOptions::default()) else {
        return;
    };
    let json = |text: String| -> serde_json::Value { serde_json::from_str(&text).unwrap() };
    let config = r#"{"name":"walbox","subjects":["walbox.>"],"storage":"file"}"#;
    let created = json(
        nats.request("$JS.API.STREAM.CREATE.walbox", config)
            .unwrap(),
    );
    assert!(created.get("error").is_none(), "{created}");
    let ack = json(nats.request("walbox.events", "hello").unwrap());
    assert_eq!(
        (ack["stream"].as_str(), ack["seq"].as_u64()),
        (Some("walbox"), Some(1)),
        "{ack}"
    );
    nats.restart().unwrap();
    let stream = json(nats.request("$JS.API.STREAM.INFO.walbox", "").unwrap());
    assert_eq!(
        stream["state"]["messages"],
        1,
        "{stream}; log: {}",
        nats.log_tail()
    );
    let info = json(nats.info().unwrap());
    assert_eq!(info["jetstream"], true, "{info}");
}

/// Whether `rabbitmq-plugins list -E` shows `plugin` explicitly enabled and running (`[E*]`).
fn running_plugin(node: &walbox::sandbox::rabbitmq::RabbitMq, plugin: &str) -> bool {
    let listed = node.run("rabbitmq-plugins", &["list", "-E"]).unwrap();
    listed
        .lines()
        .any(|l| l.starts_with("[E*]") && l.split_whitespace().nth(1) == Some(plugin))
}

#[test]
fn the_shared_rabbitmq_runs_the_consistent_hash_exchange() {
    let Some(rabbit) = rabbitmq() else { return };
    for plugin in PLUGINS {
        assert!(running_plugin(rabbit, plugin), "{plugin} is not running");
    }
    let exchanges = rabbit
        .run("rabbitmqctl", &["-q", "list_exchanges", "name", "type"])
        .unwrap();
    assert!(exchanges.contains("amq.direct\tdirect"), "{exchanges}");
}

#[test]
fn rabbitmq_keeps_its_database_across_a_restart_and_a_kill() {
    let Some(mut rabbit) = own_rabbitmq(RabbitMqOptions::default()) else {
        return;
    };
    let vhosts = |rabbit: &walbox::sandbox::rabbitmq::RabbitMq| {
        rabbit
            .run("rabbitmqctl", &["-q", "list_vhosts", "name"])
            .unwrap()
    };
    rabbit
        .run("rabbitmqctl", &["add_vhost", "walbox_restart"])
        .unwrap();
    let started = std::time::Instant::now();
    rabbit.restart().unwrap();
    eprintln!("rabbitmq-server restarted in {:?}", started.elapsed());
    assert!(
        vhosts(&rabbit).lines().any(|l| l == "walbox_restart"),
        "log: {}",
        rabbit.log_tail()
    );
    rabbit
        .run("rabbitmqctl", &["add_vhost", "walbox_kill"])
        .unwrap();
    rabbit.kill();
    rabbit.start_again().unwrap();
    let listed = vhosts(&rabbit);
    for vhost in ["walbox_restart", "walbox_kill"] {
        assert!(listed.lines().any(|l| l == vhost), "{vhost} lost: {listed}");
    }
    assert!(
        running_plugin(&rabbit, PLUGINS[0]),
        "the plugin after a restart"
    );
}
