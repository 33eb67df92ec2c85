//! walbox: a transactional-outbox relay from PostgreSQL's WAL to Kafka.
//!
//! Services insert an outbox row in the same transaction as their business change; walbox reads
//! those INSERTs from a `pgoutput` logical replication slot, produces each one to Kafka in commit
//! order keyed by aggregate id (idempotent producer, `acks=all`), and confirms the slot's
//! position to PostgreSQL only after the broker acknowledged every event up to it. Delivery is
//! at-least-once; consumers deduplicate by the `id` header.
//!
//! # Layout
//! The folders follow the pipeline: WAL → `source` → `outbox` → `relay` → `sink` (Kafka), with
//! `health` watching the slot beside it. docs/architecture.md has the data flow, the LSN
//! invariants, where each policy lives and what each folder may import (checked by
//! `tests/layout.rs`).
//! ```text
//! main.rs, cli.rs      command line; main is thin
//! cmd/                 the one-shot commands, one file each: check, status, recreate-slot,
//!                      republish, audit, reshard, demo
//! app.rs, app/         wiring: HTTP, producer, reconnect loop, shutdown order; run_slots
//! failure/            fatal failures, exit statuses, the Classify trait every error implements;
//!                      the one classifier of Kafka error codes (kafka.rs) and of SQLSTATEs
//!                      (sqlstate.rs)
//! lsn.rs, timestamp.rs log sequence numbers (from crates/pgoutput); epochs and RFC 3339
//! backoff.rs           the one capped exponential backoff (relay, inbox, webhook)
//! dead_letter.rs       the one dead-letter policy and its headers (relay, republish, inbox)
//! fault.rs             fault points for the crash tests (`failpoints` feature)
//! config/              TOML + WALBOX_* environment → validated per-stage sections; outbox
//!                      routes; connection strings (conninfo.rs)
//! pg/                  PostgreSQL client shared by source, health and inbox: TLS, the control
//!                      connection, wire framing on postgres-protocol, authentication
//! source/              WAL → LogicalMessage: opening a slot session (session.rs), start-up
//!                      checks (catalog.rs), the replication connection and CopyBoth stream,
//!                      the pgoutput decoder (crates/pgoutput), slot health readings, what
//!                      the publication covers (publication.rs)
//! outbox/              LogicalMessage → OutboxEvent: relation cache, mapping, envelopes, the
//!                      relay's dead letters (dead_letter.rs)
//! relay/               the session (mod.rs), the select loop (stream.rs), handing events to
//!                      the producer (publish.rs), RelayError (error.rs), the checkpoint
//!                      (flush LSN = end of the longest fully acknowledged prefix), the
//!                      publication watch (coverage.rs: never confirm past an uncovered table)
//! sink/                Kafka producer, topics, progress records (the evidence a slot existed)
//! health/              slot monitor, alert levels, webhook, catch-up estimate, what the
//!                      progress topic says about a lost slot (evidence.rs)
//! debezium/            `walbox from-debezium`: a Debezium connector's configuration → walbox.toml
//! preflight/           `walbox check`: everything `run` needs, one line per check with its fix
//! metrics.rs           Prometheus metrics, /metrics, /healthz, /readyz
//! leader.rs            which process of several streams a slot: the advisory lock, standbys
//! shard/               the shard layout: names, row filters, what exists
//! retention/           [outbox.retention]: confirmed rows and partitions removed
//! inbox/               `walbox inbox`: the consumer half
//! sandbox/             throwaway PostgreSQL, mock and Apache Kafka brokers, RabbitMQ, NATS
//!                      and Redis servers (`sandbox` feature, on by default)
//! ```

pub mod app;
pub mod backoff;
pub mod cli;
pub mod cmd;
pub mod config;
pub mod dead_letter;
pub mod debezium;
pub mod failure;
pub mod fault;
pub mod health;
pub mod inbox;
pub mod leader;
pub mod lsn;
pub mod metrics;
pub mod outbox;
pub mod pg;
pub mod preflight;
pub mod relay;
pub mod retention;
#[cfg(feature = "sandbox")]
pub mod sandbox;
pub mod shard;
pub mod sink;
pub mod source;
pub mod timestamp;
