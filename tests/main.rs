//! Integration tests: real PostgreSQL (spawned per test binary) and a real Kafka-protocol broker
//! (librdkafka's mock cluster, or `WALBOX_TEST_KAFKA_BROKERS`).

mod support;

mod connection;
mod failures;
mod http;
mod inbox;
mod recovery;
mod relay;
mod routing;
mod slot;
