//! The answer every classifier gives ([`Class`]), and the fatal failures with their exit
//! statuses ([`Failure`]), and the trait by which every error type says which it is
//! ([`Classify`]). A leaf of `failure`: the classifiers of each error source
//! (`kafka.rs`, `sqlstate.rs`) and `mod.rs` import it; it imports neither.

/// How an error is to be treated: the one answer of [`crate::failure::kafka`] and
/// [`crate::failure::sqlstate`], whichever path (the relay, its transactions, the one-shot
/// commands, both halves of the inbox) met the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Retrying can succeed (a connection lost, a server restarting, a broker unreachable, a
    /// serialization failure): reconnect or retry with backoff.
    Transient,
    /// This one record can never be accepted (too large, an unknown or invalid topic; for the
    /// inbox, a record without a usable message id): its policy decides, dead-letter it or stop
    /// (exit 8 for the relay's events, 10 for the inbox's records).
    Rejected,
    /// A statement failed because of the values it was given (a data exception, a constraint,
    /// an exception the statement raised, a user-defined SQLSTATE): the record's fault where a
    /// record's effect ran it (`walbox inbox`: counted retries, then `on_error`); anywhere else
    /// retried like a transient error.
    Effect,
    /// Nothing can go on: stop with this failure's exit status.
    Fatal(Failure),
}

impl Class {
    /// The failure to stop with for a publisher's error: a record refused is an event that
    /// cannot be published ([`Failure::EventRejected`], exit 8); otherwise as [`Class::fatal`].
    pub fn published_failure(self) -> Option<Failure> {
        match self {
            Class::Rejected => Some(Failure::EventRejected),
            class => class.fatal(),
        }
    }

    /// The failure to stop with, when the error is fatal.
    pub fn fatal(self) -> Option<Failure> {
        match self {
            Class::Fatal(f) => Some(f),
            Class::Transient | Class::Rejected | Class::Effect => None,
        }
    }
}

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
}

/// How an error is to be treated, said by the module that defines it; every caller (the relay,
/// the one-shot commands, the inbox) uses this one classification.
pub trait Classify {
    /// `None` when retrying (reconnecting) can succeed; else the fatal failure.
    fn failure(&self) -> Option<Failure>;
}
