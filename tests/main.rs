//! Integration tests: real PostgreSQL (spawned per test binary) and a real Kafka-protocol broker
//! (librdkafka's mock cluster, or `WALBOX_TEST_KAFKA_BROKERS`); real RabbitMQ, NATS and Redis
//! servers for the other brokers (`brokers`).

mod support;

mod audit;
mod broker_audit;
mod broker_relay;
mod broker_targets;
mod brokers;
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
mod nats_sink;
mod progress;
mod progress_topic;
mod promotion;
mod publication;
mod rabbitmq_sink;
mod recovery;
mod redis_sink;
mod relay;
mod retention;
mod routing;
mod secrets;
mod shard_layout;
mod shards;
mod slot;
mod standby;
mod versions;
