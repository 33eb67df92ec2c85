//! Throwaway local infrastructure for `walbox demo`, the integration tests and
//! the benchmarks: each helper starts a private, disposable server and removes
//! every trace of it when it is dropped.

pub mod broker;
pub mod debezium;
pub mod kafka;
pub mod kafka_cluster;
pub mod postgres;
mod programs;
pub mod proxy;
pub mod standby;
pub mod tls;

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
