//! Integration tests: real PostgreSQL (spawned per test binary) and a real Kafka-protocol broker
//! (librdkafka's mock cluster, or `WALBOX_TEST_KAFKA_BROKERS`).

mod support;

mod check;
mod cli;
mod connection;
// Needs the fault points: `cargo test --features failpoints` (the documented test command).
#[cfg(feature = "failpoints")]
mod crash;
mod failures;
mod http;
mod inbox;
mod layout;
mod recovery;
mod relay;
mod routing;
mod slot;
mod standby;
mod versions;
