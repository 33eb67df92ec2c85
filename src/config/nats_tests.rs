//! `[nats]`: validation and its messages.

use super::fixture::{env, file};
use super::*;
use std::time::Duration;

const PG: &str = "[postgres]\nurl = \"postgres://walbox@db/app\"\n";

fn load(nats: &str, vars: &[(&str, &str)]) -> Result<NatsConfig, String> {
    let f = file(&format!("{PG}[nats]\n{nats}"));
    let c = load_from(Some(f.path()), &mut env(vars).into_iter()).map_err(|e| e.to_string())?;
    match c.broker {
        BrokerConfig::Nats(n) => Ok(n),
        other => Err(format!("not nats: {other:?}")),
    }
}

fn one_line(e: &str) {
    assert!(!e.contains('\n'), "one line: {e}");
}

#[test]
fn defaults_and_env() {
    let n = load("url = \"nats://n1:4222, nats://n2:4222\"\n", &[]).unwrap();
    assert_eq!(n.servers, ["nats://n1:4222", "nats://n2:4222"]);
    assert_eq!(n.progress_bucket, "walbox_progress");
    assert_eq!(n.ack_timeout, Duration::from_secs(10));
    assert_eq!(n.auth, NatsAuth::None);
    assert!(n.tls.is_none());
    let n = load(
        "url = \"tls://n1:4222\"\n",
        &[
            ("WALBOX_NATS_USER", "walbox"),
            ("WALBOX_NATS_PASSWORD", "hunter2"),
            ("WALBOX_NATS_ACK_TIMEOUT", "3s"),
        ],
    )
    .unwrap();
    assert!(n.tls.is_some());
    assert_eq!(n.ack_timeout, Duration::from_secs(3));
    let dbg = format!("{n:?}");
    assert!(!dbg.contains("hunter2"), "{dbg}");
    assert!(matches!(n.auth, NatsAuth::UserPassword { .. }));
}

#[test]
fn a_password_in_the_url_is_refused_without_quoting_it() {
    let e = load("url = \"nats://walbox:hunter2@n1:4222\"\n", &[]).unwrap_err();
    assert!(e.contains("nats.password_file"), "{e}");
    assert!(!e.contains("hunter2"), "{e}");
    one_line(&e);
}

#[test]
fn bad_values_are_one_line_errors() {
    for (nats, needle) in [
        ("user = \"u\"\n", "nats.url is required"),
        ("url = \"n1:4222\"\nuser = \"u\"\n", "needs a password"),
        (
            "url = \"n1:4222\"\ntoken = \"t\"\nuser = \"u\"\npassword = \"p\"\n",
            "one way to authenticate",
        ),
        ("url = \"n1:4222\"\ntls_cert_file = \"/c\"\n", "go together"),
        ("url = \"n1:4222\"\nprogress_bucket = \"a.b\"\n", "bucket"),
        ("url = \"n1:4222\"\nack_timeout = \"soon\"\n", "ack_timeout"),
        ("url = \"http://n1\"\n", "scheme"),
        ("url = \"n1:4222,\"\n", "server 2"),
        (
            "url = \"n1:4222\"\ncredentials_file = \"/nonexistent/x.creds\"\n",
            "credentials_file",
        ),
        ("url = \"n1:4222\"\nbogus = 1\n", "bogus"),
    ] {
        let e = load(nats, &[]).unwrap_err();
        assert!(e.contains(needle), "{nats}: {e}");
        one_line(&e);
    }
}

#[test]
fn nats_and_kafka_brokers_together_are_refused() {
    let f = file(&format!(
        "{PG}[nats]\nurl = \"n1:4222\"\n[kafka]\nbrokers = \"k:9092\"\n"
    ));
    let e = load_from(Some(f.path()), &mut std::iter::empty())
        .unwrap_err()
        .to_string();
    assert!(e.contains("[nats] and [kafka]"), "{e}");
}
