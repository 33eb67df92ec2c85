//! The brokers other than Kafka, as real servers (Redis, NATS JetStream, RabbitMQ from Debian's
//! packages) with a real PostgreSQL: each publisher against its server (`*_sink`), and `walbox
//! run`, `audit`, `republish` and `demo` through each (`broker_relay`, `broker_targets`,
//! `broker_audit`), with its refusals (`broker_refusals`) and over TLS (`broker_tls`). A binary of its own: cargo runs test binaries one after the other, so
//! these servers and their connections do not share the machine with the main binary's
//! fault tests (librdkafka's mock cluster re-binds a broker's port when it takes the broker
//! down, and aborts the process when another socket took it meanwhile).

#[path = "../support/mod.rs"]
#[allow(unused_imports)]
mod support;

mod broker_audit;
mod broker_refusals;
mod broker_relay;
mod broker_targets;
mod broker_tls;
mod nats_sink;
mod rabbitmq_sink;
mod redis_sink;
mod servers;
