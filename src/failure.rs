//! Fatal failures and their exit statuses.
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
//! | 4 | [`Failure::Auth`] | wrong password, role without REPLICATION, TLS verification failed, server without TLS under `sslmode=require`; Kafka brokers refusing the SASL credentials |
//! | 5 | [`Failure::Schema`] | missing table, column, publication or slot (or, on a standby, one it synchronizes from the primary); wrong `wal_level`; a server too old for the configuration (before 13, or `[outbox.messages]` before 14) |
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

use std::fmt;

/// A kind of fatal failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Unexpected internal error.
    Internal,
    /// Invalid configuration.
    Config,
    /// Authentication or authorization failed.
    Auth,
    /// Database objects missing or misconfigured.
    Schema,
    /// The slot is active in another process.
    SlotInUse,
    /// The slot was invalidated.
    SlotLost,
    /// An event cannot be published.
    EventRejected,
    /// The Kafka producer cannot continue.
    Kafka,
    /// `walbox inbox`: a record cannot be processed and its policy is `fail`.
    InboxRecord,
    /// `walbox inbox`: the retention guard refused to start.
    Retention,
    /// A one-shot command cannot reach a server (the relay retries instead).
    Unavailable,
    /// `walbox check`: at least one check failed.
    Preflight,
    /// `walbox audit`: outbox rows are missing from Kafka.
    Audit,
    /// Exactly-once mode: a newer producer with the same transactional id fenced this one.
    Fenced,
    /// Too few free replication slots or walsenders for every shard of a layout to start.
    Capacity,
    /// A one-shot command that changes state in steps (`walbox reshard`) was stopped by a
    /// signal before it finished; running it again finishes it.
    Interrupted,
}

impl Failure {
    /// The process exit status for this failure.
    pub fn exit_code(self) -> u8 {
        match self {
            Failure::Internal => 1,
            Failure::Config => 3,
            Failure::Auth => 4,
            Failure::Schema => 5,
            Failure::SlotInUse => 6,
            Failure::SlotLost => 7,
            Failure::EventRejected => 8,
            Failure::Kafka => 9,
            Failure::InboxRecord => 10,
            Failure::Retention => 11,
            Failure::Unavailable => 12,
            Failure::Preflight => 13,
            Failure::Audit => 14,
            Failure::Fenced => 15,
            Failure::Capacity => 16,
            Failure::Interrupted => 17,
        }
    }

    /// Classifies a PostgreSQL error by SQLSTATE (and, for slot loss, message); `None` means
    /// transient.
    pub fn from_sqlstate(code: &str, message: &str) -> Option<Failure> {
        match code {
            "55006" => Some(Failure::SlotInUse),
            "58P01" => Some(Failure::SlotLost),
            "55000" if message.contains("can no longer get changes") => Some(Failure::SlotLost),
            "55000" => Some(Failure::Schema),
            "42501" => Some(Failure::Auth),
            "3D000" | "3F000" | "42704" | "42P01" | "42703" | "0A000" => Some(Failure::Schema),
            c if c.starts_with("28") => Some(Failure::Auth),
            c if c.starts_with("42") => Some(Failure::Schema),
            _ => None,
        }
    }
}

/// How an error is to be treated, said by the module that defines it; every caller (the relay,
/// the one-shot commands, the inbox) uses this one classification.
pub trait Classify {
    /// `None` when retrying (reconnecting) can succeed; else the fatal failure.
    fn failure(&self) -> Option<Failure>;
}

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

impl FatalError {
    /// The fatal error of a one-shot command (`status`, `recreate-slot`, `republish`), which
    /// does not retry: `e`'s own classification, a transient cause (server down, network)
    /// being [`Failure::Unavailable`].
    pub fn of<E: Classify + fmt::Display>(e: &E) -> FatalError {
        FatalError {
            failure: e.failure().unwrap_or(Failure::Unavailable),
            message: e.to_string(),
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

    #[test]
    fn sqlstates() {
        assert_eq!(Failure::from_sqlstate("28P01", ""), Some(Failure::Auth));
        assert_eq!(
            Failure::from_sqlstate("55006", ""),
            Some(Failure::SlotInUse)
        );
        assert_eq!(
            Failure::from_sqlstate(
                "55000",
                "can no longer get changes from replication slot \"s\""
            ),
            Some(Failure::SlotLost)
        );
        assert_eq!(
            Failure::from_sqlstate("57P01", "terminating connection"),
            None
        );
        assert_eq!(Failure::from_sqlstate("08006", ""), None);
    }
}
