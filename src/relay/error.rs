//! How a relay session ends with an error, and what the operator is told about it.
//!
//! Every variant says through [`Classify`] whether it is transient (the supervisor reconnects)
//! or which [`Failure`] (exit status) it is; the classification of a stage's own error is the
//! stage's, never re-decided here.

use crate::failure::{Classify, Failure};
use crate::lsn::Lsn;
use crate::outbox::{OutboxError, OutboxEvent};
use crate::sink::progress::{
    republish_command, ProgressError, ProgressRecord, REPUBLISH_MARGIN_MICROS,
};
use crate::sink::topics::TopicError;
use crate::sink::transaction::TxnError;
use crate::sink::{DeliveryError, Refusal, SinkError};
use crate::source::pgoutput::DecodeError;
use crate::source::replication::ReplicationError;
use crate::source::session::OpenError;
use crate::timestamp::{pg_micros_to_unix_micros, rfc3339_micros};

use super::coverage::Change;

/// Why a session ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Opening the session (connections, start-up checks, slot) failed.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The replication connection failed while streaming.
    #[error("postgres replication: {0}")]
    Replication(#[from] ReplicationError),
    /// A pgoutput message could not be decoded.
    #[error("cannot decode pgoutput message: {0}")]
    Decode(#[from] DecodeError),
    /// A row could not be mapped to an event.
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    /// The producer refused an event.
    #[error(transparent)]
    Send(Box<SendFailure>),
    /// The broker failed a record.
    #[error(transparent)]
    Delivery(Box<DeliveryFailure>),
    /// The server ended the replication stream.
    #[error("postgres ended the replication stream")]
    StreamEnded,
    /// A topic is missing (or could not be created) and the event cannot be dead-lettered.
    #[error("cannot publish event {id} of {source_name} at {lsn}: {error}")]
    Topic {
        /// Event id.
        id: String,
        /// `schema.table`.
        source_name: String,
        /// Commit LSN.
        lsn: Lsn,
        /// The cause.
        error: TopicError,
    },
    /// The publication sends UPDATE/DELETE/TRUNCATE of an outbox table with `on_change = "fail"`
    /// (an UPDATE with `"fail_update"`).
    #[error("{op} on outbox table {table}: an outbox is insert-only (outbox.on_change); publish only inserts: ALTER PUBLICATION … SET (publish = 'insert')")]
    Change {
        /// The operation.
        op: &'static str,
        /// `schema.table`.
        table: String,
    },
    /// An outbox message was emitted outside a transaction: it has no commit to be confirmed
    /// with, and is not rolled back with the business change.
    #[error("non-transactional logical message with prefix {prefix:?} at {lsn}: emit outbox messages with pg_logical_emit_message(true, …) (walbox.emit does)")]
    NonTransactionalMessage {
        /// The prefix.
        prefix: String,
        /// Its LSN.
        lsn: Lsn,
    },
    /// A drain for `walbox reshard` reached the reshard point, but not every event before it
    /// was acknowledged in time; the drain is run again.
    #[error("reached the reshard point {to} but confirmed only up to {confirmed}: events before it are still unacknowledged")]
    Undrained {
        /// The reshard point.
        to: Lsn,
        /// What the slot was confirmed up to.
        confirmed: Lsn,
    },
    /// The stream broke the protocol's rules.
    #[error("replication protocol violation: {0}")]
    Protocol(String),
    /// The producer cannot deliver anything: the brokers refused its credentials or its
    /// rights, or librdkafka raised a fatal error.
    #[error("{}", producer_message(.0))]
    Producer(DeliveryError),
    /// A Kafka transaction (exactly-once mode) failed: aborted (transient), fenced or fatal.
    #[error(transparent)]
    Transaction(TxnError),
    /// The progress topic is missing and may not be created.
    #[error("kafka.progress_topic: {0}; walbox keeps there the evidence that its slot existed (create it with one partition and cleanup.policy=compact)")]
    ProgressTopic(TopicError),
    /// The session's first progress record was refused: nothing is streamed without it.
    #[error("cannot write the progress record to {}: {error}; walbox streams only once its slot is on record there (the evidence that keeps a lost slot from being recreated silently and shard slots from being advanced past rows they never relayed){}", progress_place(error, topic), progress_fix(error))]
    ProgressWrite {
        /// Where the broker keeps the progress records (the topic, key, bucket or queue).
        topic: String,
        /// What the broker said.
        error: DeliveryError,
    },
    /// The progress topic could not be read, so a missing slot cannot be told from a new one.
    #[error("replication slot is missing and {0}, so walbox cannot tell whether the slot existed before; not creating it")]
    Progress(ProgressError),
    /// The server failed to decode the same transaction, with the same data error, in
    /// [`PERMANENT_AFTER`] sessions in a row (a byte that is not UTF-8 in a `SQL_ASCII`
    /// database, say): no reconnect gets past it, and PostgreSQL never hands walbox the row, so
    /// there is nothing to dead-letter.
    #[error("postgres cannot decode the transaction committing at {commit_lsn} (xid {xid}) in {times} sessions in a row: {error}; PostgreSQL does not hand walbox that row (a value it cannot convert to UTF8, e.g. a byte that is not UTF-8 in a SQL_ASCII database), so it is neither published nor dead-lettered; {read} of its outbox events before it were read. To drop exactly this transaction (commit {commit_lsn}) and nothing else, with walbox stopped run: SELECT pg_replication_slot_advance({}, '{}'); then start walbox, correct its rows (in the outbox table, WHERE xmin = '{xid}') and republish them with `walbox republish --since-id <their first id>`", postgres_protocol::escape::escape_literal(.slot), Lsn(.commit_lsn.0 + 1))]
    Undecodable {
        /// The slot.
        slot: String,
        /// The transaction's commit LSN (pgoutput Begin's `final_lsn`).
        commit_lsn: Lsn,
        /// Its xid.
        xid: u32,
        /// Outbox events of it read before the error.
        read: u32,
        /// Sessions that ended with the error.
        times: u32,
        /// The server's error.
        error: ReplicationError,
    },
    /// The slot is missing but a progress record shows it existed: it was dropped (or the
    /// server was restored or replaced), and the events since its last confirmed position are
    /// not in any slot.
    #[error("replication slot {slot:?} existed and is gone: walbox confirmed up to {} (newest confirmed commit at {}, recorded at {} in {topic}); events committed after that were not relayed and no slot holds them. walbox does not recreate a slot that existed: run `walbox recreate-slot --confirm-data-loss`, then {} to republish the window from the outbox table (runbook \"Slot lost\")", record.confirmed_lsn, record.confirmed_commit_time(), record.written_at, republish_command(&record.republish_since(), time_column.as_deref()))]
    SlotGone {
        /// The slot.
        slot: String,
        /// The newest progress record.
        record: Box<ProgressRecord>,
        /// Where the broker keeps the progress records (`kafka topic "walbox.progress"`).
        topic: String,
        /// The column `walbox republish --since` compares (`source::catalog::time_column`).
        time_column: Option<String>,
    },
    /// The slot was found invalidated when a session started: PostgreSQL's cause, the slot's
    /// own last confirmed position, and the newest confirmed commit from the progress record
    /// (this process may have confirmed nothing yet: it may have just started).
    #[error("replication slot {slot:?} is lost: {cause}. It was confirmed up to {confirmed}{}; events committed after that may never be relayed, and walbox does not recreate the slot by itself: run `walbox recreate-slot --confirm-data-loss`, then {} (runbook \"Slot lost\")", newest_commit(record.as_deref()), lost_window(record.as_deref(), time_column.as_deref()))]
    SlotLost {
        /// The slot.
        slot: String,
        /// Its `confirmed_flush_lsn`.
        confirmed: Lsn,
        /// Why PostgreSQL invalidated it (`source::slot::invalidation_cause`).
        cause: String,
        /// The slot's newest progress record, when Kafka answered.
        record: Option<Box<ProgressRecord>>,
        /// The column `walbox republish --since` compares (`source::catalog::time_column`).
        time_column: Option<String>,
    },
    /// The publication watch cannot read the publication, so nothing more is confirmed: the
    /// session ends and the supervisor reconnects (`relay::coverage`).
    #[error("cannot read publication {publication:?} to know it still covers the outbox ({error}); nothing past {confirmed} is confirmed until it can be read")]
    Unwatched {
        /// The publication.
        publication: String,
        /// The last reading's error.
        error: String,
        /// The most walbox confirms.
        confirmed: Lsn,
    },
    /// An event was refused while transactions before it were not all confirmed: the next
    /// session relays one record (and in exactly-once mode one PostgreSQL transaction per Kafka
    /// transaction) up to it, so that it is refused with everything before it confirmed.
    #[error("{0}; the transactions before it were not all confirmed: relaying one at a time up to it, to stop there with everything before it confirmed")]
    Isolating(Box<RelayError>),
    /// The publication does not cover an outbox table any more: found by the publication
    /// watch while streaming (`relay::coverage`), or at start on a slot walbox streamed from.
    #[error(transparent)]
    Uncovered(Box<Uncovered>),
}

/// The publication stopped covering an outbox table: what changed, how far walbox confirmed,
/// and how to get back the rows PostgreSQL no longer decodes.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.message())]
pub struct Uncovered {
    /// The publication.
    pub publication: String,
    /// The slot.
    pub slot: String,
    /// What changed.
    pub change: Change,
    /// The slot's confirmed position (while streaming: the most walbox confirms).
    pub confirmed: Lsn,
    /// Found while streaming (else at start).
    pub streaming: bool,
    /// When the window starts (PostgreSQL microseconds), and what that time is.
    pub since: Option<(i64, &'static str)>,
    /// The column `walbox republish --since` compares (`source::catalog::time_column`).
    pub time_column: Option<String>,
}

impl Uncovered {
    fn message(&self) -> String {
        let what = self.change.describe(&self.publication);
        if self.change == Change::Dropped {
            // `Relay::into_fatal` gives the way out of a dropped publication.
            return what;
        }
        let decoded = "PostgreSQL decodes each change with the catalog as of that change, so the rows inserted since";
        let found = if self.streaming {
            format!(
                "the publication stopped covering an outbox table while walbox streamed: {what}. {decoded} after the change are not decoded, and covering the table again does not bring them back. walbox confirmed nothing past {}, the last position at which the publication still covered it",
                self.confirmed
            )
        } else {
            format!(
                "the publication does not cover an outbox table: {what}; slot {:?} is confirmed up to {}. {decoded} the table stopped being covered are not decoded, and covering it again does not bring them back",
                self.slot, self.confirmed
            )
        };
        format!(
            "{found}. Way out: {}start walbox, then {} (runbook \"Publication changed\")",
            self.change.fix(&self.publication),
            republish_window(self.since, self.time_column.as_deref())
        )
    }
}

impl Classify for Uncovered {
    /// The publication is configuration of the database: exit 5.
    fn failure(&self) -> Option<Failure> {
        Some(Failure::Schema)
    }
}

/// How to republish what was not relayed since `since` (PostgreSQL microseconds, and what that
/// time is): the command with a `--since` [`REPUBLISH_MARGIN_MICROS`] before it.
pub(super) fn republish_window(since: Option<(i64, &str)>, time_column: Option<&str>) -> String {
    match since {
        Some((t, what)) => format!(
            "republish the window from the outbox table with {} (10 minutes before {what} at {}; consumers deduplicate by id)",
            republish_command(
                &rfc3339_micros(pg_micros_to_unix_micros(t) - REPUBLISH_MARGIN_MICROS, 0),
                time_column
            ),
            rfc3339_micros(pg_micros_to_unix_micros(t), 3)
        ),
        None => format!(
            "republish the rows inserted since walbox last confirmed (walbox_confirmed_flush_lsn stopped moving) with {}; consumers deduplicate by id",
            republish_command("<time>", time_column)
        ),
    }
}

impl Classify for RelayError {
    fn failure(&self) -> Option<Failure> {
        match self {
            RelayError::Open(e) => e.failure(),
            RelayError::Replication(e) => e.failure(),
            RelayError::Decode(e) => e.failure(),
            RelayError::Outbox(e) => e.failure(),
            RelayError::Send(f) => f.failure(),
            RelayError::Delivery(f) => f.failure(),
            RelayError::Topic { error, .. } => error.failure(),
            RelayError::ProgressTopic(_) => Some(Failure::Schema),
            RelayError::Progress(e) => e.failure(),
            // Refused rights are fatal (exit 9, 4 for credentials); anything else is retried.
            RelayError::ProgressWrite { error, .. } => error.class().fatal(),
            RelayError::StreamEnded | RelayError::Undrained { .. } => None,
            RelayError::Isolating(_) => None,
            RelayError::Unwatched { .. } => None,
            RelayError::Change { .. } => Some(Failure::Schema),
            RelayError::NonTransactionalMessage { .. } => Some(Failure::EventRejected),
            RelayError::Protocol(_) => Some(Failure::Internal),
            // Exit 4 for credentials the brokers refused; whatever else stopped the producer, 9.
            RelayError::Producer(e) => Some(e.class().fatal().unwrap_or(Failure::Kafka)),
            RelayError::Transaction(e) => e.failure(),
            RelayError::SlotGone { .. } | RelayError::SlotLost { .. } => Some(Failure::SlotLost),
            RelayError::Undecodable { .. } => Some(Failure::EventRejected),
            RelayError::Uncovered(u) => u.failure(),
        }
    }
}

impl RelayError {
    /// The commit LSN of the transaction holding an event that cannot be published, when this
    /// error is such a rejection.
    pub fn rejected_commit_lsn(&self) -> Option<Lsn> {
        if self.failure() != Some(Failure::EventRejected) {
            return None;
        }
        match self {
            RelayError::Send(f) => Some(f.lsn),
            RelayError::Delivery(f) => f.lsn.parse().ok(),
            RelayError::Outbox(OutboxError::InvalidEvent(inv)) => Some(inv.lsn),
            RelayError::Topic { lsn, .. } => Some(*lsn),
            _ => None,
        }
    }

    /// Whether the server stopped decoding because the publication does not exist (SQLSTATE
    /// 42704 from the walsender, e.g. after `DROP PUBLICATION` while streaming), or the
    /// publication watch found it gone.
    pub fn publication_missing(&self) -> bool {
        match self {
            RelayError::Replication(e) => {
                e.sqlstate() == Some("42704") && e.to_string().contains("publication")
            }
            // The publication watch saw it first.
            RelayError::Uncovered(u) => u.change == Change::Dropped,
            _ => false,
        }
    }
}

/// Sessions in a row that end with the same data error at the same transaction before the
/// error is taken as permanent ([`RelayError::Undecodable`]).
pub(super) const PERMANENT_AFTER: u32 = 3;

/// A server error that ended sessions while a transaction was being received: the same
/// SQLSTATE of class 22 (data exception) at the same commit LSN, session after session, with
/// nothing confirmed in between, is a row the server can never decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Recurrence {
    code: String,
    commit_lsn: Lsn,
    /// Sessions in a row that ended this way.
    pub(super) times: u32,
}

impl Recurrence {
    /// Records how a session ended: `error` (the server's SQLSTATE, and the commit LSN of the
    /// transaction being received) when it ended with a server error in a transaction whose
    /// predecessors are all acknowledged, `progressed` when it confirmed a new position.
    /// Returns how many sessions in a row ended with this data error at this transaction (0
    /// when it is not one).
    pub(super) fn observe(
        last: &mut Option<Recurrence>,
        error: Option<(&str, Lsn)>,
        progressed: bool,
    ) -> u32 {
        let Some((code, commit_lsn)) = error.filter(|(code, _)| code.starts_with("22")) else {
            *last = None;
            return 0;
        };
        match last {
            Some(r) if !progressed && r.code == code && r.commit_lsn == commit_lsn => {
                r.times += 1;
            }
            _ => {
                *last = Some(Recurrence {
                    code: code.to_owned(),
                    commit_lsn,
                    times: 1,
                })
            }
        }
        last.as_ref().map_or(0, |r| r.times)
    }
}

/// ", newest confirmed commit at …" from a progress record, or nothing without one.
fn newest_commit(record: Option<&ProgressRecord>) -> String {
    record
        .map(|r| {
            format!(
                " (newest confirmed commit at {}, from the progress topic)",
                r.confirmed_commit_time()
            )
        })
        .unwrap_or_default()
}

/// How to republish what a lost slot may not have relayed: from the progress record's time
/// when there is one.
fn lost_window(record: Option<&ProgressRecord>, time_column: Option<&str>) -> String {
    match record {
        Some(r) => format!(
            "{} to republish the window from the outbox table (10 minutes before the newest confirmed commit; consumers deduplicate by id)",
            republish_command(&r.republish_since(), time_column)
        ),
        None => format!(
            "{} with the time walbox last confirmed (no progress record was found in kafka.progress_topic; walbox_confirmed_flush_lsn shows when it stopped moving)",
            republish_command("<time>", time_column)
        ),
    }
}

/// The transaction of an event that cannot be published, located for the operator.
#[derive(Debug, Clone, Copy)]
pub(super) struct RejectedTxn {
    pub(super) commit_lsn: Lsn,
    /// Its commit end LSN: advancing the slot there skips it.
    pub(super) end_lsn: Option<Lsn>,
    /// Every transaction before it is confirmed, so the advance skips nothing else.
    pub(super) exact: bool,
}

impl RejectedTxn {
    pub(super) fn advice(&self, slot: &str) -> String {
        let commit = self.commit_lsn;
        match self.end_lsn {
            Some(end) if self.exact => format!(
                "to drop exactly this transaction (commit {commit}, end {end}) and nothing else, with walbox stopped run: SELECT pg_replication_slot_advance({}, '{end}'); then start walbox",
                postgres_protocol::escape::escape_literal(slot)
            ),
            Some(end) => format!(
                "its transaction ends at {end}, but the transactions before it were not all acknowledged yet: restart walbox once (it stops here again with everything before it confirmed) to get the statement that drops exactly this transaction (commit {commit})"
            ),
            None => format!(
                "the end of its transaction (commit {commit}) could not be read in time: restart walbox to get the statement that drops exactly this transaction"
            ),
        }
    }
}

/// An event the producer refused before it reached the broker.
#[derive(Debug, thiserror::Error)]
#[error("cannot publish event {id} of {table} at {lsn} to topic {topic:?}: {source}")]
pub struct SendFailure {
    /// `schema.table`.
    pub table: String,
    /// Event id.
    pub id: String,
    /// Commit LSN.
    pub lsn: Lsn,
    /// The topic the event was meant for.
    pub topic: String,
    /// The producer's error.
    #[source]
    pub source: SinkError,
}

/// A record the broker failed.
#[derive(Debug, thiserror::Error)]
#[error("{} failed to deliver event {id} at {lsn} to {}: {}", .error.broker(), destination(.error, topic), describe_delivery(.error))]
pub struct DeliveryFailure {
    /// Event id (from the record's header).
    pub id: String,
    /// Commit LSN (from the record's header).
    pub lsn: String,
    /// The topic the record was produced to.
    pub topic: String,
    /// The error.
    pub error: DeliveryError,
    /// The record was produced alone: an error the broker gives a whole batch for one of its
    /// records (`INVALID_TIMESTAMP`) is then this record's own.
    pub alone: bool,
}

impl Classify for SendFailure {
    /// As the producer's error.
    fn failure(&self) -> Option<Failure> {
        self.source.failure()
    }
}

impl Classify for DeliveryFailure {
    /// As the broker's error (`failure::kafka`); a batch's refusal of a record produced
    /// alone is that record's.
    fn failure(&self) -> Option<Failure> {
        if self.error.is_batch_refusal() && self.alone {
            return Some(Failure::EventRejected);
        }
        self.error.failure()
    }
}

pub(super) fn send_failure(event: &OutboxEvent, source: SinkError) -> RelayError {
    RelayError::Send(Box::new(SendFailure {
        table: event.source.to_string(),
        id: String::from_utf8_lossy(&event.id).into_owned(),
        lsn: event.position.commit_lsn,
        topic: event.topic.to_string(),
        source,
    }))
}

/// What stops a publisher for good, and where to look.
fn producer_message(e: &DeliveryError) -> String {
    match e {
        DeliveryError::Kafka(e) => format!("kafka producer cannot continue: {e} (check kafka.properties: security.protocol, sasl.*, ssl.*, and the ACLs of the principal)"),
        DeliveryError::Broker(e) => format!("{} publisher cannot continue: {}", e.broker, e.message),
    }
}

/// Where a broker keeps the progress records, as the operator names it.
fn progress_place(e: &DeliveryError, place: &str) -> String {
    match e {
        DeliveryError::Kafka(_) => format!("kafka topic {place:?}"),
        DeliveryError::Broker(b) => format!("{} {place:?}", b.broker),
    }
}

/// What lets walbox write its progress records, as fits what the broker said (`: ` and the
/// advice, or nothing when no advice is known): a permission refused is granted; a server out
/// of memory is given memory.
fn progress_fix(e: &DeliveryError) -> &'static str {
    match (e, e.refusal()) {
        (DeliveryError::Kafka(_), Some(Refusal::Permission)) => {
            ": grant walbox's principal Write on that topic (and check `walbox check`)"
        }
        (DeliveryError::Broker(_), Some(Refusal::Permission)) => {
            ": grant walbox's user the right to write there (and check `walbox check`)"
        }
        (_, Some(Refusal::Memory)) => {
            ": free memory on the server (raise maxmemory or trim streams; under maxmemory-policy noeviction Redis refuses writes when full, and an evicting policy could drop the progress records instead); walbox retries meanwhile"
        }
        (_, None) => "",
    }
}

/// A failed record's destination, as its broker names it.
fn destination(e: &DeliveryError, topic: &str) -> String {
    match e {
        DeliveryError::Kafka(_) => format!("topic {topic:?}"),
        DeliveryError::Broker(_) => format!("{topic:?}"),
    }
}

/// A failed record's error; for Kafka's size limits, which limit to raise.
fn describe_delivery(e: &DeliveryError) -> String {
    match e {
        DeliveryError::Kafka(e) => crate::sink::kafka::describe_delivery_error(e),
        DeliveryError::Broker(e) => e.message.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_record_failure_gives_the_advice_that_fits_the_reply() {
        use crate::config::BrokerKind;
        use crate::failure::Class;
        use crate::sink::BrokerError;
        let message = |said: &str, refusal: Option<Refusal>| {
            let mut error = BrokerError::new(BrokerKind::Redis, Class::Transient, said);
            error.refusal = refusal;
            let m = RelayError::ProgressWrite {
                topic: "redis key \"p:slot\"".to_owned(),
                error: DeliveryError::Broker(error),
            }
            .to_string();
            assert!(!m.contains('\n') && m.contains(said), "{m}");
            m
        };
        let oom = message(
            "out of memory (OOM command not allowed)",
            Some(Refusal::Memory),
        );
        assert!(
            oom.contains("maxmemory-policy") && !oom.contains("grant"),
            "{oom}"
        );
        let denied = message(
            "refused SET (NOPERM no permissions)",
            Some(Refusal::Permission),
        );
        assert!(
            denied.ends_with(
                ": grant walbox's user the right to write there (and check `walbox check`)"
            ),
            "{denied}"
        );
        let other = message("read-only replica (READONLY)", None);
        assert!(other.ends_with("never relayed)"), "{other}");
    }

    #[test]
    fn the_same_data_error_at_the_same_transaction_recurs() {
        let mut last = None;
        let at = Lsn(0x1000);
        assert_eq!(
            Recurrence::observe(&mut last, Some(("22021", at)), false),
            1
        );
        assert_eq!(
            Recurrence::observe(&mut last, Some(("22021", at)), false),
            2
        );
        assert_eq!(
            Recurrence::observe(&mut last, Some(("22021", at)), false),
            3
        );
        // Elsewhere, after progress, or another error: counted afresh.
        assert_eq!(
            Recurrence::observe(&mut last, Some(("22021", Lsn(0x2000))), false),
            1
        );
        assert_eq!(
            Recurrence::observe(&mut last, Some(("22021", Lsn(0x2000))), true),
            1
        );
        assert_eq!(
            Recurrence::observe(&mut last, Some(("22P05", Lsn(0x2000))), false),
            1
        );
        // Not a data error (out of memory, a restart): never permanent.
        assert_eq!(
            Recurrence::observe(&mut last, Some(("53200", Lsn(0x2000))), false),
            0
        );
        assert_eq!(Recurrence::observe(&mut last, None, false), 0);
        assert_eq!(last, None);
    }
}
