//! Integration tests: real PostgreSQL (spawned per test binary) and a real Kafka-protocol broker
//! (librdkafka's mock cluster, or `WALBOX_TEST_KAFKA_BROKERS`). The other brokers (Redis,
//! NATS, RabbitMQ) have a test binary of their own, `tests/brokers/`.

mod support;

mod audit;
mod check;
mod check_kafka;
mod cli;
mod connection;
// Needs the fault points: `cargo test --features failpoints` (the documented test command).
#[cfg(feature = "failpoints")]
mod crash;
mod debezium;
mod debezium_converters;
mod debezium_migration;
mod deploy;
mod exactly_once;
mod exactly_once_faults;
mod exactly_once_history;
mod exactly_once_refusals;
mod exactly_once_window;
mod failover;
mod failures;
mod faults;
mod ha;
mod http;
mod inbox;
mod kafka_acls;
mod kafka_security;
mod layout;
mod manual;
mod progress;
mod progress_topic;
mod promotion;
mod publication;
mod recovery;
mod relay;
mod retention;
mod routing;
mod secrets;
mod shard_layout;
mod shards;
mod slot;
mod standby;
mod versions;
