//! Fatal failures and their exit statuses, and the one classifier of each external error source.
//!
//! walbox sorts every error into one of two classes (Materialize's transient/definite split):
//! **transient** errors (connection reset, PostgreSQL restarting, broker unreachable) end the
//! replication session, and the supervisor reconnects with capped exponential backoff, resuming
//! from the slot's confirmed position; **fatal** errors stop the process with a one-line message
//! and the exit status below, after confirming everything acked (and nothing more).
//!
//! | status | failure | typical cause |
//! |---|---|---|
//! | 0 | — | clean shutdown (SIGTERM/SIGINT) |
//! | 1 | [`Failure::Internal`] | a bug; please report it |
//! | 2 | — | command-line usage error |
//! | 3 | [`Failure::Config`] | invalid configuration file or environment |
//! | 4 | [`Failure::Auth`] | wrong password, role without REPLICATION, TLS verification failed, server without TLS under `sslmode=require`; Kafka brokers refusing the SASL credentials, or a TLS handshake with them failed on a certificate (every Kafka client: `walbox run`, `inbox`, `audit`, `republish`) |
//! | 5 | [`Failure::Schema`] | missing table, column, publication or slot (or, on a standby, one it synchronizes from the primary); a publication that stopped covering an outbox table; wrong `wal_level`; a server too old for the configuration (before 13, or `[outbox.messages]` before 14) |
//! | 6 | [`Failure::SlotInUse`] | another process streams from the slot |
//! | 7 | [`Failure::SlotLost`] | the slot was invalidated; WAL it needed is gone |
//! | 8 | [`Failure::EventRejected`] | an event cannot be published (too large, NULL key, …) |
//! | 9 | [`Failure::Kafka`] | the producer cannot continue (authorization, fatal producer error); a one-shot command (`audit`, `republish`) gets no answer from the brokers in time |
//! | 10 | [`Failure::InboxRecord`] | `walbox inbox`: a record kept failing (or has no message id) under `fail` |
//! | 11 | [`Failure::Retention`] | `walbox inbox`: the inbox keeps rows for less than a topic's replay window |
//! | 12 | [`Failure::Unavailable`] | a one-shot command (`status`, `recreate-slot`, `republish`, `audit`, `reshard`) cannot reach PostgreSQL |
//! | 13 | [`Failure::Preflight`] | `walbox check`: at least one check failed (each printed with its fix) |
//! | 14 | [`Failure::Audit`] | `walbox audit`: outbox rows are missing from Kafka (each listed) |
//! | 15 | [`Failure::Fenced`] | exactly-once mode: another walbox process took over the slot's Kafka transactions |
//! | 16 | [`Failure::Capacity`] | the server has too few free replication slots or walsenders for every shard of `postgres.shards` |
//! | 17 | [`Failure::Interrupted`] | `walbox reshard` was stopped (SIGTERM/SIGINT) before every old shard was drained: run it again |
//!
//! Each module's error type says which class it is in ([`Classify`]); what an external error
//! means is decided once per source: [`kafka`] for librdkafka's error codes, [`sqlstate`] for
//! PostgreSQL's, each with its table (`kafka.rs`, `sqlstate.rs`) and a test that reads it back.
//! Both answer with a [`Class`]: transient, a record rejected, a record's effect failed, or
//! fatal with its [`Failure`]. Elsewhere a code only picks the words of a message or a fix,
//! and three rules sit on top of the table, each about its own context: the same class-22 error
//! at the same transaction, session after session, is a row PostgreSQL cannot decode (exit 8,
//! `relay/error.rs`); a `walbox republish`/`audit` window argument the server cannot read is
//! the command line's (exit 3, `cmd/republish.rs`); and a server out of walsenders (`53300`) or
//! replication slots (`53400`) while a shard layout's slots are made is short of capacity (exit
//! 16, `app/layout.rs`).

use std::fmt;

mod class;
mod kafka;
mod sqlstate;

pub use self::class::{Class, Classify, Failure};
pub use self::kafka::{
    is_batch_refusal, kafka, kafka_error, untrusted_certificate, UntrustedCertificate,
};
pub use self::sqlstate::{postgres_error, sqlstate};

/// A fatal error: what happened, on one line, and how the process exits.
#[derive(Debug)]
pub struct FatalError {
    /// Its kind.
    pub failure: Failure,
    /// One actionable line.
    pub message: String,
}

impl fmt::Display for FatalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FatalError {}

/// Every fatal error is built here: from an error that classifies itself ([`FatalError::of`],
/// [`FatalError::of_or`]), or, where no error type is involved (a signal, a refused flag, a
/// check that failed), from its failure and message ([`FatalError::new`]).
impl FatalError {
    /// A fatal error of kind `failure`, saying `message`.
    pub fn new(failure: Failure, message: impl fmt::Display) -> FatalError {
        FatalError {
            failure,
            message: message.to_string(),
        }
    }

    /// The fatal error of a one-shot command (`status`, `recreate-slot`, `republish`), which
    /// does not retry: `e`'s own classification, a transient cause (server down, network)
    /// being [`Failure::Unavailable`].
    pub fn of<E: Classify + fmt::Display>(e: &E) -> FatalError {
        FatalError::of_or(e, Failure::Unavailable)
    }

    /// `e`'s own classification, or `otherwise` when `e` says retrying could succeed but the
    /// caller does not retry it (a client that could not be created, say).
    pub fn of_or<E: Classify + fmt::Display>(e: &E, otherwise: Failure) -> FatalError {
        FatalError::new(e.failure().unwrap_or(otherwise), e)
    }

    /// The same error, its message prefixed with what failed (`what: message`).
    pub fn prefixed(self, what: &str) -> FatalError {
        FatalError {
            message: format!("{what}: {}", self.message),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_distinct() {
        let all = [
            Failure::Internal,
            Failure::Config,
            Failure::Auth,
            Failure::Schema,
            Failure::SlotInUse,
            Failure::SlotLost,
            Failure::EventRejected,
            Failure::Kafka,
            Failure::InboxRecord,
            Failure::Retention,
            Failure::Unavailable,
            Failure::Preflight,
            Failure::Audit,
            Failure::Fenced,
            Failure::Capacity,
            Failure::Interrupted,
        ];
        let mut codes: Vec<u8> = all.iter().map(|f| f.exit_code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), all.len());
        assert!(!codes.contains(&0) && !codes.contains(&2));
    }
}
