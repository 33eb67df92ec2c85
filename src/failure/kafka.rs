//! Kafka error codes, classified once: the producer of the relay, its transactions, `walbox
//! republish` and both Kafka clients of `walbox inbox` ask [`kafka`] (or [`kafka_error`]);
//! elsewhere a code only picks the words of a message.
//!
//! | codes | class | exit |
//! |---|---|---|
//! | `MSG_SIZE_TOO_LARGE`, `INVALID_MSG_SIZE`, `INVALID_RECORD`, `_UNKNOWN_TOPIC`, `UNKNOWN_TOPIC_OR_PART`, `_UNKNOWN_PARTITION` (a partition the row names that its topic lacks), `TOPIC_EXCEPTION`, `RECORD_LIST_TOO_LARGE` | [`Class::Rejected`]: this record, never the others | the record's policy |
//! | `SASL_AUTHENTICATION_FAILED`, `_AUTHENTICATION` | the brokers refused the credentials | 4 |
//! | `_FENCED`, `PRODUCER_FENCED`, `INVALID_PRODUCER_EPOCH` | a newer producer with the same transactional id took over | 15 |
//! | `_FATAL`, `TOPIC_AUTHORIZATION_FAILED`, `CLUSTER_AUTHORIZATION_FAILED`, `GROUP_AUTHORIZATION_FAILED`, `TRANSACTIONAL_ID_AUTHORIZATION_FAILED`, `FENCED_INSTANCE_ID`, `_INVALID_ARG`, `_UNSUPPORTED_FEATURE`, `UNSUPPORTED_VERSION` | the client cannot continue: rights, librdkafka's fatal error, a static member fenced, brokers without the feature | 9 |
//! | `INVALID_TIMESTAMP` (a timestamp further from the broker's clock than the topic allows) | [`Class::Transient`] here: the broker refuses the whole batch, so every record of it reports the code; the relay then produces one record at a time past it, and the one refused alone is the record's fault | the record's policy |
//! | every other code (timeouts, transport, leaders moving, too few replicas, …) | [`Class::Transient`] | — |
//!
//! Authentication (who walbox is) is exit 4, as for PostgreSQL; authorization (what the
//! principal may do: ACLs) is exit 9, the Kafka client's failure.
//!
//! `_SSL` alone is transient (a connection cut during a handshake says it too), but a TLS
//! handshake that failed on a certificate ([`untrusted_certificate`]: the brokers' is not signed
//! by the configured CA or does not name the host, or the brokers refused walbox's) is exit 4:
//! librdkafka would retry it forever, and no retry can succeed. librdkafka reports it only as a
//! client error (its code and a reason), never on a record, so the client contexts ask
//! [`untrusted_certificate`] for the one line they end with (those that stop on another thread
//! keep it in an [`UntrustedCertificate`]): the relay's producer (and `walbox republish`'s, the
//! same one) fails every lane with it; `walbox inbox`'s consumer, dead-letter producer and
//! retention guard stop it with exit 4; the short-lived readers (the progress reader at
//! start-up, `walbox audit`) return it instead of waiting out their timeouts; and `walbox
//! check` fails its brokers check with it. The relay's topic-lookup admin client only logs it:
//! the relay's producer, on the same brokers, stops the relay.

use std::sync::Mutex;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tokio::sync::Notify;

use super::class::{Class, Classify, Failure};

/// The class of a Kafka error code (see the table above).
pub fn kafka(code: RDKafkaErrorCode) -> Class {
    use RDKafkaErrorCode as C;
    match code {
        C::MessageSizeTooLarge
        | C::InvalidMessageSize
        | C::InvalidRecord
        | C::UnknownTopic
        | C::UnknownTopicOrPartition
        | C::UnknownPartition
        | C::InvalidTopic
        | C::MessageBatchTooLarge => Class::Rejected,
        C::SaslAuthenticationFailed | C::Authentication => Class::Fatal(Failure::Auth),
        C::Fenced | C::ProducerFenced | C::InvalidProducerEpoch => Class::Fatal(Failure::Fenced),
        C::Fatal
        | C::TopicAuthorizationFailed
        | C::ClusterAuthorizationFailed
        | C::GroupAuthorizationFailed
        | C::TransactionalIdAuthorizationFailed
        | C::FencedInstanceId
        | C::InvalidArgument
        | C::UnsupportedFeature
        | C::UnsupportedVersion => Class::Fatal(Failure::Kafka),
        _ => Class::Transient,
    }
}

/// Whether `error` is a broker's refusal of a whole batch for one record of it
/// (`INVALID_TIMESTAMP`: a timestamp further from the broker's clock than the topic allows):
/// every record of the batch reports it, the one at fault and the others alike. The relay
/// tells them apart by producing one record at a time (see the table above).
pub fn is_batch_refusal(error: &KafkaError) -> bool {
    error.rdkafka_error_code() == Some(RDKafkaErrorCode::InvalidTimestamp)
}

/// The one line for a client error (`error`, with librdkafka's `reason`) that is a TLS
/// handshake failed on a certificate: the brokers' certificate not verified against
/// `ssl.ca.location` (or the system's roots), or not naming the host; or walbox's own
/// certificate refused by the brokers. `None` for every other error. The line quotes librdkafka's
/// reason (which holds no secret: the broker's address and OpenSSL's words), never a
/// configuration value, and names the setting to fix. What stops on it stops with
/// [`Failure::Auth`] (exit 4).
pub fn untrusted_certificate(error: &KafkaError, reason: &str) -> Option<String> {
    const CERTIFICATE_FAILURES: [&str; 4] = [
        "certificate verify failed",
        "alert unknown ca",
        "alert bad certificate",
        "alert certificate required",
    ];
    let certificate = error.rdkafka_error_code() == Some(RDKafkaErrorCode::SSL)
        && CERTIFICATE_FAILURES.iter().any(|f| reason.contains(f));
    if !certificate {
        return None;
    }
    // One line, whatever librdkafka's reason holds.
    let reason = reason.split_whitespace().collect::<Vec<_>>().join(" ");
    Some(format!(
        "the TLS handshake with the brokers failed on a certificate ({reason}); set kafka.properties \"ssl.ca.location\" to the CA that signed the brokers' certificate (or check that it names the host walbox connects to, and that the brokers trust walbox's ssl.certificate.location)"
    ))
}

/// What a Kafka client's context keeps of a TLS handshake that failed on a certificate: the
/// first one's line ([`untrusted_certificate`]), for the thread that stops the client on it.
/// librdkafka reports the handshake only to the context's `error` callback, on its own thread.
#[derive(Debug, Default)]
pub struct UntrustedCertificate {
    line: Mutex<Option<String>>,
    reported: Notify,
}

impl UntrustedCertificate {
    /// Keeps the line of `error` (with librdkafka's `reason`) when it is a handshake that
    /// failed on a certificate, and says whether it was one. Logged at debug level only: what
    /// stops on it prints the line (a failed check, or the fatal error's one line).
    pub fn record(&self, error: &KafkaError, reason: &str) -> bool {
        let Some(line) = untrusted_certificate(error, reason) else {
            return false;
        };
        tracing::debug!(error = %error, reason, "kafka TLS handshake failed on a certificate");
        self.line
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(line);
        self.reported.notify_waiters();
        true
    }

    /// The line, once a handshake failed on a certificate.
    pub fn line(&self) -> Option<String> {
        self.line.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits for the line.
    pub async fn reported(&self) -> String {
        loop {
            let reported = self.reported.notified();
            if let Some(line) = self.line() {
                return line;
            }
            reported.await;
        }
    }
}

/// The class of a client error: its code's ([`kafka`]), an error without a code being
/// transient. What librdkafka itself calls fatal (a consumer's fatal error, a fatal
/// transactional error), a configuration it refused and a client it could not create cannot
/// continue either: exit 9 unless the code says more.
pub fn kafka_error(e: &KafkaError) -> Class {
    let fatal = match e {
        KafkaError::ClientConfig(..) | KafkaError::ClientCreation(_) => true,
        KafkaError::MessageConsumptionFatal(_) => true,
        KafkaError::Transaction(t) => t.is_fatal(),
        _ => false,
    };
    match e.rdkafka_error_code().map_or(Class::Transient, kafka) {
        Class::Fatal(f) => Class::Fatal(f),
        _ if fatal => Class::Fatal(Failure::Kafka),
        class => class,
    }
}

impl Classify for KafkaError {
    /// As a producer's error: a record refused is an event that cannot be published.
    fn failure(&self) -> Option<Failure> {
        kafka_error(self).published_failure()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code some path of walbox meets, with its class: the one table, read back.
    #[test]
    fn each_code_has_one_class() {
        use RDKafkaErrorCode as C;
        let table = [
            (C::MessageSizeTooLarge, Class::Rejected),
            (C::InvalidMessageSize, Class::Rejected),
            (C::InvalidRecord, Class::Rejected),
            (C::UnknownTopic, Class::Rejected),
            (C::UnknownTopicOrPartition, Class::Rejected),
            (C::UnknownPartition, Class::Rejected),
            (C::InvalidTopic, Class::Rejected),
            (C::MessageBatchTooLarge, Class::Rejected),
            (C::SaslAuthenticationFailed, Class::Fatal(Failure::Auth)),
            (C::Authentication, Class::Fatal(Failure::Auth)),
            (C::Fenced, Class::Fatal(Failure::Fenced)),
            (C::ProducerFenced, Class::Fatal(Failure::Fenced)),
            (C::InvalidProducerEpoch, Class::Fatal(Failure::Fenced)),
            (C::Fatal, Class::Fatal(Failure::Kafka)),
            (C::TopicAuthorizationFailed, Class::Fatal(Failure::Kafka)),
            (C::ClusterAuthorizationFailed, Class::Fatal(Failure::Kafka)),
            (C::GroupAuthorizationFailed, Class::Fatal(Failure::Kafka)),
            (
                C::TransactionalIdAuthorizationFailed,
                Class::Fatal(Failure::Kafka),
            ),
            (C::FencedInstanceId, Class::Fatal(Failure::Kafka)),
            (C::InvalidArgument, Class::Fatal(Failure::Kafka)),
            (C::UnsupportedFeature, Class::Fatal(Failure::Kafka)),
            (C::UnsupportedVersion, Class::Fatal(Failure::Kafka)),
            (C::MessageTimedOut, Class::Transient),
            (C::BrokerTransportFailure, Class::Transient),
            (C::AllBrokersDown, Class::Transient),
            (C::NotEnoughReplicas, Class::Transient),
            (C::NotEnoughReplicasAfterAppend, Class::Transient),
            (C::NotLeaderForPartition, Class::Transient),
            (C::RequestTimedOut, Class::Transient),
            (C::CoordinatorLoadInProgress, Class::Transient),
            (C::NotCoordinator, Class::Transient),
            (C::QueueFull, Class::Transient),
            (C::OperationTimedOut, Class::Transient),
            (C::InvalidTransactionalState, Class::Transient),
            (C::PartitionEOF, Class::Transient),
        ];
        for (code, class) in table {
            assert_eq!(kafka(code), class, "{code:?}");
        }
    }

    #[test]
    fn client_errors_take_their_code_s_class() {
        use RDKafkaErrorCode as C;
        assert_eq!(
            kafka_error(&KafkaError::Global(C::Authentication)),
            Class::Fatal(Failure::Auth)
        );
        assert_eq!(
            kafka_error(&KafkaError::MessageConsumption(C::SaslAuthenticationFailed)),
            Class::Fatal(Failure::Auth)
        );
        assert_eq!(
            kafka_error(&KafkaError::MessageProduction(C::MessageSizeTooLarge)),
            Class::Rejected
        );
        assert_eq!(
            kafka_error(&KafkaError::ClientCreation("no".into())),
            Class::Fatal(Failure::Kafka)
        );
        assert_eq!(kafka_error(&KafkaError::Canceled), Class::Transient);
        // librdkafka's word wins over a code that alone would be retried.
        assert_eq!(
            kafka_error(&KafkaError::MessageConsumptionFatal(C::AllBrokersDown)),
            Class::Fatal(Failure::Kafka)
        );
        assert_eq!(
            kafka_error(&KafkaError::MessageConsumption(C::AllBrokersDown)),
            Class::Transient
        );
        // As a producer's error, a refused record is an event that cannot be published.
        assert_eq!(
            KafkaError::MessageProduction(C::InvalidTopic).failure(),
            Some(Failure::EventRejected)
        );
        assert_eq!(
            KafkaError::Global(C::Authentication).failure(),
            Some(Failure::Auth)
        );
        assert_eq!(KafkaError::Global(C::AllBrokersDown).failure(), None);
    }

    #[test]
    fn only_a_handshake_failed_on_a_certificate_is_an_untrusted_certificate() {
        use RDKafkaErrorCode as C;
        // librdkafka 2.x's words for a broker certificate its CA does not sign.
        let unverified = "ssl://localhost:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: broker certificate could not be verified, verify that ssl.ca.location is correctly configured or root CA certificates are installed (after 4ms in state SSL_HANDSHAKE)";
        assert!(untrusted_certificate(&KafkaError::Global(C::SSL), unverified).is_some());
        assert!(untrusted_certificate(
            &KafkaError::Global(C::SSL),
            "SSL handshake failed: ssl/record/rec_layer_s3.c:1605: error:0A000418:SSL routines::tlsv1 alert unknown ca"
        )
        .is_some());
        // A consumer reports it as a consumption error, with the same code.
        assert!(
            untrusted_certificate(&KafkaError::MessageConsumption(C::SSL), unverified).is_some()
        );
        // A cut connection is retried, as is any other code with the same words.
        assert!(untrusted_certificate(
            &KafkaError::Global(C::SSL),
            "SSL handshake failed: Disconnected: connection reset by peer"
        )
        .is_none());
        assert!(
            untrusted_certificate(&KafkaError::Global(C::BrokerTransportFailure), unverified)
                .is_none()
        );
        assert_eq!(kafka(C::SSL), Class::Transient);
    }

    /// Every client ends with the same line: librdkafka's reason on one line, and the setting
    /// to fix.
    #[test]
    fn the_untrusted_certificate_line_is_one_line_naming_ssl_ca_location() {
        let reason = "  ssl://broker-1:9093/1: SSL handshake failed:\n error:0A000086:SSL routines::certificate verify failed  ";
        let line = untrusted_certificate(&KafkaError::Global(RDKafkaErrorCode::SSL), reason)
            .expect("a certificate failure");
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.contains("(ssl://broker-1:9093/1: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed)"),
            "{line}"
        );
        assert!(
            line.contains("kafka.properties \"ssl.ca.location\""),
            "{line}"
        );
    }
}
