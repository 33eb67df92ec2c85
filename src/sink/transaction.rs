//! Kafka transactions for exactly-once mode (`kafka.exactly_once = true`).
//!
//! The producer is librdkafka's transactional producer. Its `transactional.id` is derived from
//! the slot's progress key ([`transactional_id`]: `walbox/<system identifier>/<database>/<slot>`),
//! so every walbox process relaying the same slot of the same cluster uses the same id, and
//! `init_transactions` of a new process fences the one before it: the coordinator bumps the
//! producer epoch and aborts (or completes) the transaction the old one left open, and every
//! later request of the old one is refused.
//!
//! # Invariants
//! - Every transaction error is sorted into one of three outcomes ([`TxnError`]): retry the
//!   same call, abort the transaction and start over from the slot, or stop (fenced, or
//!   librdkafka's fatal error). librdkafka says which; walbox never guesses.
//! - A fenced producer is never used again: the process stops with exit status 15, because
//!   another walbox process now relays this slot (never retried: retrying would fence the
//!   newer one in turn).
//! - The coordinator's abort of a transaction older than `transaction.timeout.ms` fences the
//!   producer exactly as a takeover does (PRODUCER_FENCED on AddPartitionsToTxn and EndTxn,
//!   INVALID_PRODUCER_EPOCH on Produce and on older EndTxn versions; librdkafka reports both as
//!   fenced, and negotiates none of the later protocol's distinct errors). So a fenced
//!   transaction at least that old is judged by what the producer saw ([`timed_out_or`]): if
//!   the brokers' silence during its life ([`super::silence`]) accounts for the excess, they
//!   could not be reached, and the session ends as a transient fault that relays the
//!   transaction again ([`TxnError::Interrupted`]); otherwise walbox held it open too long,
//!   and stops as a configuration error ([`TxnError::TimedOut`], exit status 3).

use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::Producer;

use super::kafka::KafkaSink;
use super::progress::ProgressKey;
use crate::failure::{kafka, kafka_error, Class, Classify, Failure};

/// How often [`KafkaSink::wait_released`] looks whether librdkafka released every record.
const RELEASE_POLL: Duration = Duration::from_micros(200);

/// The `transactional.id` of the producer relaying `key`'s slot.
pub fn transactional_id(key: &ProgressKey) -> String {
    format!("walbox/{}", key.record_key())
}

/// How a transactional call failed, as librdkafka classifies it.
#[derive(Debug, thiserror::Error)]
pub enum TxnError {
    /// Call it again (a timeout, a coordinator that is moving or loading).
    #[error("kafka transaction: {0} (retriable)")]
    Retriable(KafkaError),
    /// The transaction cannot commit: abort it; nothing of it is confirmed, and the session
    /// starts over from the slot and the progress record.
    #[error("kafka transaction aborted: {0}")]
    Abortable(KafkaError),
    /// Another producer with the same `transactional.id` took over.
    #[error("another walbox process took over this slot's kafka transactions (transactional.id {id:?}, {error}): this one stops without confirming anything more. Run one walbox per slot, or `[ha]` with a standby (it waits for the leader lock)")]
    Fenced {
        /// The transactional id.
        id: String,
        /// librdkafka's error.
        error: KafkaError,
    },
    /// The transaction stayed open longer than `transaction.timeout.ms`: the coordinator
    /// aborted it and bumped the epoch, which librdkafka reports as fenced. Replaying the same
    /// PostgreSQL transaction would time out again, so this stops as a configuration error.
    #[error("kafka transaction timed out: it was open {:.1} s, longer than transaction.timeout.ms ({} ms), and the coordinator aborted it (nothing of it is confirmed). One PostgreSQL transaction must be relayed within that timeout: raise kafka.properties.transaction.timeout.ms (at most the brokers' transaction.max.timeout.ms, 15 minutes by default), or write the outbox in smaller PostgreSQL transactions", age.as_secs_f64(), timeout.as_millis())]
    TimedOut {
        /// How long the transaction had been open.
        age: Duration,
        /// `transaction.timeout.ms`.
        timeout: Duration,
    },
    /// The coordinator aborted the transaction after `transaction.timeout.ms`, but the brokers
    /// had left the producer without an answer for long enough that, had they answered, it
    /// would have stayed within the timeout: an outage, not a transaction too large for the
    /// timeout. Transient: the next session relays the transaction again.
    #[error("kafka transaction aborted by its coordinator: it was open {:.1} s, longer than transaction.timeout.ms ({} ms), {:.1} s of them waiting for brokers that did not answer. Nothing of it is confirmed; it is relayed again once the brokers answer", age.as_secs_f64(), timeout.as_millis(), silent.as_secs_f64())]
    Interrupted {
        /// How long the transaction had been open.
        age: Duration,
        /// How long of that the brokers did not answer.
        silent: Duration,
        /// `transaction.timeout.ms`.
        timeout: Duration,
    },
    /// librdkafka refused the transactional producer's configuration.
    #[error("kafka transactional producer configuration refused: {0} (in exactly-once mode message.timeout.ms must not exceed transaction.timeout.ms, and neither may be 0)")]
    Config(KafkaError),
    /// The last committed progress record could not be read: nothing is produced until it is.
    #[error("exactly-once mode: {0}; walbox reads the last committed progress record before it produces anything")]
    Progress(super::progress::ProgressError),
    /// The brokers do not implement Kafka transactions (KIP-98).
    #[error("the kafka brokers do not support transactions ({0}): exactly-once mode needs brokers that implement KIP-98 (Apache Kafka 0.11 or later); set kafka.exactly_once = false to relay at-least-once")]
    Unsupported(KafkaError),
    /// The brokers refused `transaction.timeout.ms`: it is above their
    /// `transaction.max.timeout.ms`.
    #[error("the kafka brokers refused transaction.timeout.ms ({0}): it is above the brokers' transaction.max.timeout.ms (15 minutes by default). Lower kafka.properties.transaction.timeout.ms, or raise transaction.max.timeout.ms on the brokers")]
    TimeoutAboveMax(KafkaError),
    /// The producer cannot continue (authorization refused, librdkafka's fatal error, …).
    #[error("kafka transactional producer cannot continue: {error}{advice}", error = .0, advice = acl_advice(.0))]
    Fatal(KafkaError),
}

/// What to grant when `e` is an authorization refusal (empty otherwise).
fn acl_advice(e: &KafkaError) -> &'static str {
    use RDKafkaErrorCode as C;
    match e.rdkafka_error_code() {
        Some(
            C::TransactionalIdAuthorizationFailed
            | C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::GroupAuthorizationFailed,
        ) => " (check the ACLs: the principal needs Write and Describe on transactional ids prefixed walbox/, and Write on the topics; docs/operations.md, ACLs)",
        _ => "",
    }
}

impl Classify for TxnError {
    fn failure(&self) -> Option<Failure> {
        match self {
            TxnError::Retriable(_) | TxnError::Abortable(_) | TxnError::Interrupted { .. } => None,
            // Retried, unless the brokers refused the principal.
            TxnError::Progress(e) => e.failure(),
            TxnError::Config(_) | TxnError::TimedOut { .. } | TxnError::TimeoutAboveMax(_) => {
                Some(Failure::Config)
            }
            TxnError::Fenced { .. } => Some(Failure::Fenced),
            TxnError::Unsupported(_) => Some(Failure::Kafka),
            // The code's class (`failure::kafka`): 4 for refused credentials, else 9.
            TxnError::Fatal(e) => Some(kafka_error(e).fatal().unwrap_or(Failure::Kafka)),
        }
    }
}

/// Whether `code` says that a newer producer with the same transactional id exists.
pub fn is_fencing(code: RDKafkaErrorCode) -> bool {
    kafka(code) == Class::Fatal(Failure::Fenced)
}

/// The Kafka transaction a session had open when it ended: when it was begun, and its
/// `transaction.timeout.ms`.
#[derive(Debug, Clone, Copy)]
pub struct OpenTxn {
    /// When `begin_transaction` opened it.
    pub since: Instant,
    /// `transaction.timeout.ms`.
    pub timeout: Duration,
}

/// `e`, or what a fenced producer means when `open` had been open at least its timeout: the
/// coordinator aborted it (see the module docs), after an outage of the brokers
/// ([`TxnError::Interrupted`]) when their silence since it opened, as `sink` measured it,
/// accounts for the excess, else because walbox held it open too long
/// ([`TxnError::TimedOut`]).
pub fn timed_out_or(e: TxnError, open: OpenTxn, sink: &KafkaSink) -> TxnError {
    verdict(
        e,
        open.since.elapsed(),
        open.timeout,
        sink.silent_since(open.since),
    )
}

/// [`timed_out_or`] for a transaction open `age`, of which the brokers were silent `silent`.
fn verdict(e: TxnError, age: Duration, timeout: Duration, silent: Duration) -> TxnError {
    match e {
        TxnError::Fenced { .. } if age >= timeout && age.saturating_sub(silent) < timeout => {
            TxnError::Interrupted {
                age,
                silent,
                timeout,
            }
        }
        TxnError::Fenced { .. } if age >= timeout => TxnError::TimedOut { age, timeout },
        e => e,
    }
}

/// Sorts a transactional call's error (see [`TxnError`]). `sink` answers what librdkafka's
/// fatal error was when the call only says "fatal".
pub fn classify_txn(sink: &KafkaSink, id: &str, e: KafkaError) -> TxnError {
    let (fatal, retriable, abortable) = match &e {
        KafkaError::Transaction(t) => (t.is_fatal(), t.is_retriable(), t.txn_requires_abort()),
        _ => (false, true, false),
    };
    let fenced = e.rdkafka_error_code().is_some_and(is_fencing)
        || sink.fatal_error().is_some_and(|(code, _)| is_fencing(code));
    if fenced {
        return TxnError::Fenced {
            id: id.to_owned(),
            error: e,
        };
    }
    // A configuration the brokers refuse (librdkafka calls it fatal): exit 3, not 9.
    let code = e
        .rdkafka_error_code()
        .filter(|c| *c != RDKafkaErrorCode::Fatal)
        .or_else(|| sink.fatal_error().map(|(code, _)| code));
    if code == Some(RDKafkaErrorCode::InvalidTransactionTimeout) {
        return TxnError::TimeoutAboveMax(e);
    }
    // Fatal either way (`failure::kafka`); these two say why in words of transactions.
    if matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::UnsupportedFeature | RDKafkaErrorCode::UnsupportedVersion)
    ) {
        return TxnError::Unsupported(e);
    }
    if fatal || matches!(kafka_error(&e), Class::Fatal(_)) {
        return TxnError::Fatal(e);
    }
    if abortable {
        return TxnError::Abortable(e);
    }
    if retriable {
        return TxnError::Retriable(e);
    }
    // Neither retriable nor abortable (a state error, say): abort and start over.
    TxnError::Abortable(e)
}

impl KafkaSink {
    /// `init_transactions` (blocking): registers the transactional id with its coordinator,
    /// fencing every earlier producer with the same id.
    pub fn init_transactions(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.producer().init_transactions(timeout)
    }

    /// `begin_transaction` (local, does not block).
    pub fn begin_transaction(&self) -> Result<(), KafkaError> {
        self.producer().begin_transaction()
    }

    /// Waits (blocking, polling every [`RELEASE_POLL`]) until librdkafka holds no record and no
    /// delivery report not yet served, at most `timeout`; `true` when none is left.
    pub fn wait_released(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.producer().in_flight_count() == 0 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(RELEASE_POLL);
        }
    }

    /// `commit_transaction` (blocking): flushes every record of the transaction, then commits.
    /// The coordinator's silence meanwhile counts ([`super::silence`]).
    pub fn commit_transaction(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.waiting_on(|| self.producer().commit_transaction(timeout))
    }

    /// `abort_transaction` (blocking): purges what is queued and aborts. The coordinator's
    /// silence meanwhile counts ([`super::silence`]).
    pub fn abort_transaction(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.waiting_on(|| self.producer().abort_transaction(timeout))
    }

    /// librdkafka's fatal error, if one was raised.
    pub fn fatal_error(&self) -> Option<(RDKafkaErrorCode, String)> {
        self.producer().client().fatal_error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transactional_id_names_cluster_database_and_slot() {
        let key = ProgressKey {
            system_identifier: "7300000000000000001".into(),
            database: "app".into(),
            slot: "walbox".into(),
        };
        assert_eq!(
            transactional_id(&key),
            "walbox/7300000000000000001/app/walbox"
        );
    }

    #[test]
    fn fencing_stops_with_its_own_status_refused_rights_with_kafka_s_and_credentials_with_auth() {
        let fenced = TxnError::Fenced {
            id: "walbox/x".into(),
            error: KafkaError::Global(RDKafkaErrorCode::Fenced),
        };
        assert_eq!(fenced.failure(), Some(Failure::Fenced));
        assert!(fenced.to_string().contains("walbox/x"), "{fenced}");
        let denied = TxnError::Fatal(KafkaError::Global(
            RDKafkaErrorCode::TransactionalIdAuthorizationFailed,
        ));
        assert_eq!(denied.failure(), Some(Failure::Kafka));
        let refused = TxnError::Fatal(KafkaError::Global(RDKafkaErrorCode::Authentication));
        assert_eq!(refused.failure(), Some(Failure::Auth));
        let aborted = TxnError::Abortable(KafkaError::Global(
            RDKafkaErrorCode::InvalidTransactionalState,
        ));
        assert_eq!(aborted.failure(), None);
        let fenced = || TxnError::Fenced {
            id: "walbox/x".into(),
            error: KafkaError::Global(RDKafkaErrorCode::Fenced),
        };
        let (timeout, s) = (Duration::from_secs(10), Duration::from_secs);
        // Open 11 s with the brokers answering throughout: walbox held it open too long.
        let late = verdict(fenced(), s(11), timeout, Duration::ZERO);
        assert_eq!(late.failure(), Some(Failure::Config));
        assert!(late.to_string().contains("transaction timed out"), "{late}");
        assert!(!late.to_string().contains("took over"), "{late}");
        // Younger than the timeout: the coordinator did not abort it, another producer won.
        let early = verdict(fenced(), s(9), timeout, Duration::ZERO);
        assert_eq!(early.failure(), Some(Failure::Fenced));
    }

    /// Issue: a transaction the coordinator timed out during a broker outage stopped walbox
    /// with exit status 3 and "raise the timeout", which the shipped systemd unit does not
    /// restart.
    #[test]
    fn a_timeout_the_brokers_silence_accounts_for_is_transient() {
        let fenced = || TxnError::Fenced {
            id: "walbox/x".into(),
            error: KafkaError::Global(RDKafkaErrorCode::Fenced),
        };
        let (timeout, s) = (Duration::from_secs(10), Duration::from_secs);
        // 2 s of relaying, then 28 s without an answer.
        let outage = verdict(fenced(), s(30), timeout, s(28));
        assert_eq!(outage.failure(), None, "{outage}");
        let text = outage.to_string();
        assert!(
            text.contains("did not answer") && text.contains("relayed again"),
            "{text}"
        );
        assert!(
            !text.contains("took over") && !text.contains("raise"),
            "{text}"
        );
        // 12 s of relaying with the brokers answering, plus a 1 s silence: too long anyway.
        let slow = verdict(fenced(), s(13), timeout, s(1));
        assert_eq!(slow.failure(), Some(Failure::Config), "{slow}");
        // Any other error stays what it is.
        let other = verdict(
            TxnError::Abortable(KafkaError::Global(RDKafkaErrorCode::MessageTimedOut)),
            s(30),
            timeout,
            s(28),
        );
        assert!(matches!(other, TxnError::Abortable(_)), "{other}");
    }

    #[test]
    fn configuration_errors_name_the_timeout() {
        let refused = TxnError::Config(KafkaError::ClientCreation("message.timeout.ms".into()));
        assert_eq!(refused.failure(), Some(Failure::Config));
        assert!(
            refused.to_string().contains("transaction.timeout.ms"),
            "{refused}"
        );
    }

    #[test]
    fn acl_advice_follows_only_an_authorization_refusal_and_a_timeout_over_the_maximum_is_config() {
        let denied = TxnError::Fatal(KafkaError::Global(
            RDKafkaErrorCode::TransactionalIdAuthorizationFailed,
        ));
        assert!(denied.to_string().contains("check the ACLs"), "{denied}");
        let other = TxnError::Fatal(KafkaError::Global(RDKafkaErrorCode::InvalidArgument));
        assert!(!other.to_string().contains("ACL"), "{other}");
        let too_long = TxnError::TimeoutAboveMax(KafkaError::Global(
            RDKafkaErrorCode::InvalidTransactionTimeout,
        ));
        assert_eq!(too_long.failure(), Some(Failure::Config));
        let message = too_long.to_string();
        assert!(
            message.contains("transaction.max.timeout.ms") && !message.contains("ACL"),
            "{message}"
        );
    }
}
