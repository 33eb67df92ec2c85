//! `walbox run` to NATS and RabbitMQ over TLS (`tls://`, `amqps://`), each server's
//! certificate signed by a fresh CA of the sandbox: with that CA as `tls_ca_file`, every event
//! arrives (Redis's `rediss://` relay is `redis_sink.rs`'s); with a CA that did not sign the server's certificate, walbox stops at once with
//! exit 4, as for PostgreSQL's untrusted certificate (retrying meets the same certificate),
//! one line naming the setting, and no secret printed.

use std::collections::HashSet;

use walbox::sandbox::nats::NatsOptions;
use walbox::sandbox::rabbitmq::RabbitMqOptions;
use walbox::sandbox::redis::RedisOptions;
use walbox::sandbox::tls::issue_cert;

use crate::broker_audit::insert;
use crate::broker_relay::{env_with, Target};
use crate::broker_targets::{NatsTarget, RabbitTarget, RedisTarget};
use crate::support::brokers::{own_nats, own_rabbitmq, own_redis};
use crate::support::events::distinct_ids;
use crate::support::{unique, wait_until_or, TestDb, Walbox, WAIT};

/// Walbox with `extra` (the TLS url and CA file) relays three events to `target`.
fn relays_over_tls(target: &mut dyn Target, extra: &[(&str, String)], tag: &str) {
    let db = TestDb::new(tag);
    db.create_slot_and_publication(&db.name);
    let env = env_with(&db, &db.name, target, extra);
    let destination = target.destination();
    let ids: HashSet<i64> = (0..3)
        .map(|i| insert(&db, &destination, &format!("a{i}")))
        .collect();
    let mut walbox = Walbox::spawn(&env);
    wait_until_or(
        WAIT,
        "the events over TLS",
        || distinct_ids(&target.read_all()) == ids,
        || walbox.log(),
    );
    walbox.terminate();
    assert!(walbox.wait_exit(WAIT).success(), "{}", walbox.log());
}

/// Walbox with `extra` (the TLS url, a CA that did not sign the server's certificate, and
/// `secret` as the password) exits 4 at once, its one line naming `setting`, `secret` unsaid.
fn an_unknown_ca_exits_4(
    target: &dyn Target,
    extra: &[(&str, String)],
    secret: &str,
    setting: &str,
    tag: &str,
) {
    let db = TestDb::new(tag);
    db.create_slot_and_publication(&db.name);
    let env = env_with(&db, &db.name, target, extra);
    let mut walbox = Walbox::spawn(&env);
    let status = walbox.wait_exit(WAIT);
    let (line, log) = (walbox.last_line(), walbox.log());
    assert_eq!(status.code(), Some(4), "{log}");
    assert!(line.contains(setting) && line.contains("TLS"), "{line}");
    assert!(!log.contains(secret), "the secret is printed: {log}");
}

/// A CA of its own (not the server's), as a PEM file.
fn other_ca() -> tempfile::NamedTempFile {
    let (ca, _) = issue_cert("walbox test other CA", None).unwrap();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), ca.to_pem().unwrap()).unwrap();
    file
}

#[test]
fn nats_over_tls_relays_with_the_configured_ca_and_an_unknown_ca_exits_4() {
    let Some(server) = own_nats(NatsOptions {
        tls: true,
        ..Default::default()
    }) else {
        return;
    };
    let (url, ca) = (server.tls_url().unwrap(), server.ca_file().unwrap());
    let mut target = NatsTarget::with_tls(url.clone(), ca);
    let tls = [
        ("WALBOX_NATS_URL", url.clone()),
        ("WALBOX_NATS_TLS_CA_FILE", ca.display().to_string()),
    ];
    relays_over_tls(&mut target, &tls, "nats_tls");
    let (other, secret) = (other_ca(), unique("s3cret"));
    an_unknown_ca_exits_4(
        &target,
        &[
            ("WALBOX_NATS_URL", url),
            (
                "WALBOX_NATS_TLS_CA_FILE",
                other.path().display().to_string(),
            ),
            ("WALBOX_NATS_USER", "walbox".into()),
            ("WALBOX_NATS_PASSWORD", secret.clone()),
        ],
        &secret,
        "nats.tls_ca_file",
        "nats_tls_ca",
    );
}

#[test]
fn rabbitmq_over_tls_relays_with_the_configured_ca_and_an_unknown_ca_exits_4() {
    let Some(node) = own_rabbitmq(RabbitMqOptions {
        tls: true,
        ..Default::default()
    }) else {
        return;
    };
    let (url, ca) = (node.tls_url().unwrap(), node.ca_file().unwrap());
    let mut target = RabbitTarget::new(node.port());
    let tls = [
        ("WALBOX_RABBITMQ_URL", url.clone()),
        ("WALBOX_RABBITMQ_TLS_CA_FILE", ca.display().to_string()),
    ];
    relays_over_tls(&mut target, &tls, "rabbit_tls");
    let (other, secret) = (other_ca(), unique("s3cret"));
    an_unknown_ca_exits_4(
        &target,
        &[
            ("WALBOX_RABBITMQ_URL", url),
            (
                "WALBOX_RABBITMQ_TLS_CA_FILE",
                other.path().display().to_string(),
            ),
            ("WALBOX_RABBITMQ_PASSWORD", secret.clone()),
        ],
        &secret,
        "rabbitmq.tls_ca_file",
        "rabbit_tls_ca",
    );
}

/// The Redis client calls a refused certificate an I/O error, which it would retry: walbox
/// still stops at once, as for NATS and RabbitMQ.
#[test]
fn redis_over_tls_with_an_unknown_ca_exits_4() {
    let Some(redis) = own_redis(RedisOptions {
        tls: true,
        ..Default::default()
    }) else {
        return;
    };
    let url = redis.tls_url().unwrap();
    let target = RedisTarget::new(url.clone());
    let (other, secret) = (other_ca(), unique("s3cret"));
    an_unknown_ca_exits_4(
        &target,
        &[
            ("WALBOX_REDIS_URL", url),
            (
                "WALBOX_REDIS_TLS_CA_FILE",
                other.path().display().to_string(),
            ),
            ("WALBOX_REDIS_PASSWORD", secret.clone()),
        ],
        &secret,
        "redis.tls_ca_file",
        "redis_tls_ca",
    );
}
