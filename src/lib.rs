//! walbox: a transactional-outbox relay from PostgreSQL's WAL to Kafka.
//!
//! Services insert an outbox row in the same transaction as their business change; walbox reads
//! those INSERTs from a `pgoutput` logical replication slot, produces each one to Kafka in commit
//! order keyed by aggregate id (idempotent producer, `acks=all`), and confirms the slot's
//! position to PostgreSQL only after the broker acknowledged every event up to it. Delivery is
//! at-least-once; consumers deduplicate by the `id` header.
//!
//! # Layout
//! ```text
//! cli.rs, main.rs      command line; main is thin
//! config/              TOML + WALBOX_* environment → validated Config; outbox routes
//! app.rs               wiring: HTTP, producer, reconnect loop, shutdown order
//! relay.rs             one replication session: WAL → events → Kafka → confirmed LSN
//! source/
//!   conninfo.rs, tls.rs  connection strings, sslmode, the control connection
//!   replication.rs       replication protocol client (CopyBoth, standby status)
//!   pgoutput.rs          pgoutput decoder (bytes → messages), never panics
//!   catalog.rs           start-up checks; publication and slot set-up
//!   slot.rs              slot health readings (retained WAL, wal_status, safe_wal_size)
//!   lsn.rs               log sequence numbers
//! outbox.rs            relation cache + INSERT/message → OutboxEvent (topic, key, value, headers)
//! envelope.rs          JSON and protobuf envelopes (proto/walbox/v1/envelope.proto)
//! timestamp.rs         epochs, RFC 3339, timestamptz parsing
//! sink/kafka.rs        producer: delivery reports, error classification
//! sink/topics.rs       topic existence checks and creation
//! sink/progress.rs     progress records: the evidence that a slot existed (kafka.progress_topic)
//! checkpoint.rs        flush LSN = end of the longest fully acknowledged prefix
//! metrics.rs           Prometheus metrics, /metrics, /healthz, /readyz
//! monitor.rs           slot health checks, alerts, heartbeat, lost-slot stop
//! alert.rs, webhook.rs alert levels and their delivery
//! status.rs            `walbox status`, `walbox recreate-slot`
//! republish.rs         `walbox republish`: rows still in the outbox → Kafka, with the relay's mapping
//! failure.rs           fatal failures and exit statuses
//! sandbox/             throwaway PostgreSQL + Kafka-protocol broker (demo, tests, benches)
//! demo.rs              `walbox demo`
//! inbox/               `walbox inbox`: Kafka → one PostgreSQL transaction per record (inbox row
//!                      + effect) → offset commit; retention guard (the consumer half)
//! ```

pub mod app;
pub mod cli;
pub mod config;
pub mod failure;
pub mod health;
pub mod inbox;
pub mod lsn;
pub mod metrics;
pub mod outbox;
pub mod pg;
pub mod relay;
pub mod republish;
pub mod sandbox;
pub mod sink;
pub mod source;
pub mod timestamp;
