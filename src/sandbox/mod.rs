//! Throwaway local infrastructure for `walbox demo`, the integration tests and
//! the benchmarks: each helper starts a private, disposable server and removes
//! every trace of it when it is dropped. The message brokers other than Kafka
//! (`nats`, `rabbitmq`, `redis`) share the process handling of `daemon`.

pub mod broker;
pub mod daemon;
pub mod debezium;
pub mod kafka;
pub mod kafka_cluster;
pub mod nats;
pub mod postgres;
mod programs;
pub mod proxy;
pub mod rabbitmq;
pub mod redis;
pub mod scratch_broker;
pub mod standby;
pub mod tls;

use std::io::{Read, Write};
use std::time::Duration;

/// `GET path` on 127.0.0.1:`port`: (status, body), or `None` when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((code, body))
}

/// The seed article's outbox table (plus the business table the transactions also write).
pub const SCHEMA: &str = "
CREATE TABLE payments (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, wallet_id text NOT NULL, amount numeric NOT NULL);
CREATE TABLE outbox (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    aggregate_id  text        NOT NULL,
    topic         text        NOT NULL,
    event_type    text        NOT NULL,
    payload       jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);";
