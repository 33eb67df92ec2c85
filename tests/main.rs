//! Integration tests: real PostgreSQL (spawned per test binary) and a real Kafka-protocol broker
//! (librdkafka's mock cluster, or `WALBOX_TEST_KAFKA_BROKERS`).

mod support;

mod inbox;
mod relay;
