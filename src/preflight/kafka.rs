//! The Kafka checks of `walbox check`: the brokers answer, each topic the configuration names
//! exists (or `kafka.create_topics` is on), the cluster grants the idempotent producer, and, with
//! `kafka.exactly_once`, it grants a transactional producer.
//!
//! The client is configured exactly like the relay's producer (`config::KafkaRole::Producer`:
//! walbox's defaults and the user's `kafka.properties`), so it authenticates and connects the
//! same way. Nothing is produced: the idempotent producer asks for a producer id
//! (InitProducerId) when it starts, and its statistics say when one was assigned. Brokers that refuse the SASL credentials fail
//! the brokers check as "authentication failed" (what `walbox run` stops on with exit 4), not
//! as an unanswered request; so does a TLS handshake that failed on a certificate, with the line
//! `walbox run` and `walbox inbox` stop on (`failure::untrusted_certificate`, naming
//! `ssl.ca.location`).
//!
//! A metadata request for every topic leaves out the topics the principal may not describe, as
//! if they did not exist; a topic missing from it is asked for by name, and the cluster's
//! TOPIC_AUTHORIZATION_FAILED fails its check with the ACL to grant.
//!
//! The transactions check starts a short-lived transactional producer and waits for
//! `init_transactions` (InitProducerId with a transactional id, answered by the transaction
//! coordinator). Its transactional id is [`PROBE_TRANSACTIONAL_ID`] and this process's id, never
//! the id a running walbox derives from its slot: initialising that one would fence it.
//!
//! The progress topic, when it exists, must be compacted (`cleanup.policy=compact`): it is the
//! evidence that a slot existed, and under `delete` an idle slot's only record is deleted after
//! `retention.ms`, after which a lost slot would be created again without a word (and
//! exactly-once mode would send its last transactions again). The check reads the topic's
//! configuration (DescribeConfigs): `delete` with a finite retention fails, `delete` that keeps
//! records forever warns (the topic then grows by every record), a configuration it cannot read
//! warns with the command that shows it.
//!
//! The same DescribeConfigs gives the progress topic's segments. Compaction never touches a
//! topic's active segment, and keeps commit markers `delete.retention.ms` after it compacted
//! their records; in exactly-once mode every Kafka transaction adds a record and a marker. A
//! slot that was idle while others wrote reads back through all of that at start-up. A
//! `segment.ms`, `segment.bytes` or `delete.retention.ms` over a few times what walbox creates
//! the topic with (`sink::topics::PROGRESS_TOPIC_CONFIG`) warns with the command that sets
//! walbox's values.
//!
//! When the progress topic exists, the check writes to it: a tombstone (a record without a
//! value) under a key of its own (`walbox-check/<pid>`), which no slot's record uses and
//! compaction removes. walbox streams only once its session's first record there is
//! acknowledged, so a principal without Write on the topic stops `walbox run`; the check says
//! so first.
//!
//! What only a real cluster can show is left to it: the right to create topics (the check says
//! that walbox will create them, not that it may) and topics rendered from row values, which
//! are known only when their first event comes.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Statistics};

use crate::config::{Config, KafkaConfig, KafkaRole};
use crate::outbox::OutboxMapper;
use crate::preflight::Check;

const BROKERS: &str = "kafka brokers";
const IDEMPOTENCE: &str = "idempotent producer";
const TRANSACTIONS: &str = "kafka transactions";
const PROGRESS_POLICY: &str = "progress topic cleanup.policy";
const PROGRESS_SEGMENTS: &str = "progress topic segments";

/// The prefix of the transactional id the transactions check initialises (then `/<pid>`): under
/// the `walbox/` prefix of the relay's own ids, so a prefixed ACL covers both.
pub const PROBE_TRANSACTIONAL_ID: &str = "walbox/check";

/// How long the brokers have to answer the metadata request.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the cluster has to assign a producer id.
const PRODUCER_ID_TIMEOUT: Duration = Duration::from_secs(10);

fn topic_check(topic: &str) -> String {
    format!("topic {topic}")
}

/// Every Kafka check, in order.
pub async fn checks(config: &Config) -> Vec<Check> {
    let mut topics = OutboxMapper::new(&config.outbox).known_topics();
    if !topics.contains(&config.kafka.progress_topic) {
        topics.push(config.kafka.progress_topic.clone());
    }
    let kafka = config.kafka.clone();
    let (mut out, progress_exists) =
        tokio::task::spawn_blocking(move || blocking_checks(&kafka, &topics))
            .await
            .unwrap_or_else(|e| {
                let stopped = Check::fail(
                    BROKERS,
                    format!("the Kafka checks stopped: {e}"),
                    "report a bug, with this line",
                );
                (vec![stopped], false)
            });
    if progress_exists {
        out.extend(progress_config(&config.kafka).await);
    }
    out
}

/// The progress topic's configuration: its `cleanup.policy` and its segments (see the module
/// docs), read with one DescribeConfigs.
async fn progress_config(kafka: &KafkaConfig) -> Vec<Check> {
    let topic = kafka.progress_topic.as_str();
    let names = [
        "cleanup.policy",
        "retention.ms",
        "segment.ms",
        "segment.bytes",
        "delete.retention.ms",
    ];
    match topic_config(kafka, topic, &names).await {
        Ok(values) => vec![
            progress_policy(kafka, values[0].clone(), values[1].clone()),
            progress_segments(kafka, &values[2..]),
        ],
        Err(e) => vec![Check::warn(
            PROGRESS_POLICY,
            format!("cannot read the configuration of topic {topic:?} (DescribeConfigs): {e}"),
            format!("check it is compact (kafka-configs.sh --bootstrap-server {} --describe --entity-type topics --entity-name {topic}), or grant walbox's principal DescribeConfigs on it", kafka.brokers),
        )],
    }
}

/// The largest `segment.ms`, `segment.bytes` and `delete.retention.ms` of a progress topic
/// that does not warn: a few times what walbox creates it with
/// ([`crate::sink::topics::PROGRESS_TOPIC_CONFIG`]).
const SEGMENT_LIMITS: [(&str, u64); 3] = [
    ("segment.ms", 3_600_000),
    ("segment.bytes", 104_857_600),
    ("delete.retention.ms", 3_600_000),
];

/// The progress topic's segments: compaction never reaches the active segment, so the
/// uncompacted end of the topic is as long as a segment may grow, and commit markers stay
/// `delete.retention.ms` after compaction; start-up reads back through both to an idle slot's
/// record. `values`: the topic's `segment.ms`, `segment.bytes` and `delete.retention.ms`.
fn progress_segments(kafka: &KafkaConfig, values: &[Option<String>]) -> Check {
    let topic = kafka.progress_topic.as_str();
    let shown: Vec<String> = SEGMENT_LIMITS
        .iter()
        .zip(values)
        .map(|((name, _), v)| format!("{name}={}", v.as_deref().unwrap_or("?")))
        .collect();
    let shown = shown.join(", ");
    let over: Vec<&str> = SEGMENT_LIMITS
        .iter()
        .zip(values)
        .filter(|((_, limit), v)| {
            v.as_deref()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .is_some_and(|v| v > *limit)
        })
        .map(|((name, _), _)| *name)
        .collect();
    if over.is_empty() {
        return Check::ok(
            PROGRESS_SEGMENTS,
            format!("{shown}: compaction keeps the topic's end short"),
        );
    }
    let settings: Vec<String> = crate::sink::topics::PROGRESS_TOPIC_CONFIG
        .iter()
        .filter(|(k, _)| *k != "cleanup.policy")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    Check::warn(
        PROGRESS_SEGMENTS,
        format!("{shown} ({} above {}): compaction never touches the active segment and keeps commit markers for delete.retention.ms, so the topic's uncompacted end grows with every Kafka transaction (a record and a marker each, in exactly-once mode), and a slot that was idle meanwhile reads back through all of it at start-up", over.join(", "), limits_text()),
        format!(
            "kafka-configs.sh --bootstrap-server {} --alter --entity-type topics --entity-name {topic} --add-config {}",
            kafka.brokers,
            settings.join(",")
        ),
    )
}

/// [`SEGMENT_LIMITS`] in words.
fn limits_text() -> String {
    SEGMENT_LIMITS
        .iter()
        .map(|(name, limit)| format!("{name} {limit}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The progress topic's `cleanup.policy`, given it and `retention.ms` (see the module docs).
fn progress_policy(
    kafka: &KafkaConfig,
    policy: Option<String>,
    retention: Option<String>,
) -> Check {
    let topic = kafka.progress_topic.as_str();
    let fix = format!(
        "kafka-configs.sh --bootstrap-server {} --alter --entity-type topics --entity-name {topic} --add-config cleanup.policy=compact",
        kafka.brokers
    );
    // The broker's default when it names none.
    let policy = policy.unwrap_or_else(|| "delete".into());
    let has = |p: &str| policy.split(',').any(|v| v.trim() == p);
    let forever = retention.as_deref().map(str::trim) == Some("-1");
    let retention = retention.unwrap_or_else(|| "the broker's default".into());
    if has("delete") && !forever {
        Check::fail(
            PROGRESS_POLICY,
            format!("cleanup.policy={policy}, retention.ms={retention}: an idle slot's progress record is deleted after that, and with it the evidence that the slot existed (a lost slot would be created again without a word; exactly-once mode would send its last transactions again)"),
            fix,
        )
    } else if !has("compact") {
        Check::warn(
            PROGRESS_POLICY,
            format!("cleanup.policy={policy}, retention.ms=-1: nothing is deleted, but the topic keeps every record written (one per Kafka transaction in exactly-once mode)"),
            fix,
        )
    } else {
        Check::ok(
            PROGRESS_POLICY,
            format!("cleanup.policy={policy}: the newest record of each slot is kept"),
        )
    }
}

/// The values of `names` in `topic`'s configuration (DescribeConfigs), in that order.
async fn topic_config(
    kafka: &KafkaConfig,
    topic: &str,
    names: &[&str],
) -> Result<Vec<Option<String>>, String> {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = kafka
        .client_config(KafkaRole::Admin)
        .create()
        .map_err(|e| e.to_string())?;
    let opts = AdminOptions::new().request_timeout(Some(METADATA_TIMEOUT));
    let specs = [ResourceSpecifier::Topic(topic)];
    let results = tokio::time::timeout(METADATA_TIMEOUT, admin.describe_configs(&specs, &opts))
        .await
        .map_err(|_| format!("no answer within {} s", METADATA_TIMEOUT.as_secs()))?
        .map_err(|e| e.to_string())?;
    let resource = results
        .into_iter()
        .next()
        .ok_or_else(|| "no result".to_owned())?
        .map_err(|code| code.to_string())?;
    Ok(names
        .iter()
        .map(|n| resource.get(n).and_then(|e| e.value.clone()))
        .collect())
}

/// Keeps what the producer's statistics say about its producer id, and whether the brokers
/// refused its credentials.
#[derive(Default)]
struct Probe {
    /// The idempotent producer's state (`Assigned` once it has an id) and the id.
    eos: Mutex<Option<(String, i64)>>,
    /// The brokers' refusal of the credentials (SASL authentication), when one came.
    refused: Mutex<Option<String>>,
    /// A TLS handshake that failed on a certificate, when one did.
    untrusted: crate::failure::UntrustedCertificate,
}

impl ClientContext for Probe {
    fn stats(&self, statistics: Statistics) {
        if let Some(eos) = statistics.eos {
            if let Ok(mut state) = self.eos.lock() {
                *state = Some((eos.idemp_state, eos.producer_id));
            }
        }
    }

    // Unreachable brokers are the brokers check's line, not log noise.
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        tracing::debug!(?level, fac, "librdkafka: {log_message}");
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(error = %error, reason, "kafka client error");
        self.untrusted.record(&error, reason);
        if crate::failure::kafka_error(&error)
            == crate::failure::Class::Fatal(crate::failure::Failure::Auth)
        {
            if let Ok(mut refused) = self.refused.lock() {
                *refused = Some(reason.to_owned());
            }
        }
    }
}

impl ProducerContext for Probe {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

/// The checks that block, and whether the progress topic exists.
fn blocking_checks(kafka: &KafkaConfig, topics: &[String]) -> (Vec<Check>, bool) {
    let skipped = |out: &mut Vec<Check>| {
        out.extend(
            topics
                .iter()
                .map(|t| Check::skipped(topic_check(t), BROKERS)),
        );
        out.push(Check::skipped(IDEMPOTENCE, BROKERS));
        if kafka.exactly_once.is_some() {
            out.push(Check::skipped(TRANSACTIONS, BROKERS));
        }
    };
    let mut out = Vec::new();
    let mut cc = kafka.client_config(KafkaRole::Producer);
    cc.set("statistics.interval.ms", "100");
    let producer: BaseProducer<Probe> = match cc.create_with_context(Probe::default()) {
        Ok(p) => p,
        Err(e) => {
            out.push(Check::fail(
                BROKERS,
                format!("cannot create a Kafka client: {e}"),
                "check kafka.properties",
            ));
            skipped(&mut out);
            return (out, false);
        }
    };
    let metadata = match producer.client().fetch_metadata(None, METADATA_TIMEOUT) {
        Ok(md) => md,
        Err(e) => {
            // Why the brokers did not answer, when the client said: refused credentials, or a
            // certificate the handshake failed on.
            let failed = match (refused(&producer), untrusted(&producer)) {
                (Some(refusal), _) => Check::fail(
                    BROKERS,
                    format!(
                        "authentication failed: the brokers at {} refused walbox's credentials ({refusal})",
                        kafka.brokers,
                    ),
                    "check sasl.mechanisms, sasl.username and sasl.password in kafka.properties against the principal the brokers know (walbox run stops with exit status 4 here)",
                ),
                (None, Some(line)) => Check::fail(
                    BROKERS,
                    line,
                    "point kafka.properties ssl.ca.location at the CA that signed the brokers' certificate (walbox run and walbox inbox stop with exit status 4 here)",
                ),
                (None, None) => Check::fail(
                    BROKERS,
                    format!(
                        "no answer from {} within {} s: {e}",
                        kafka.brokers,
                        METADATA_TIMEOUT.as_secs()
                    ),
                    "check kafka.brokers, the network, and the security settings in kafka.properties (security.protocol, sasl.*, ssl.*)",
                ),
            };
            out.push(failed);
            skipped(&mut out);
            return (out, false);
        }
    };
    let ids: Vec<String> = metadata
        .brokers()
        .iter()
        .map(|b| b.id().to_string())
        .collect();
    out.push(Check::ok(
        BROKERS,
        format!(
            "{} answers: {} brokers (ids {})",
            kafka.brokers,
            ids.len(),
            ids.join(", ")
        ),
    ));

    let mut progress_exists = false;
    for topic in topics {
        let name = topic_check(topic);
        let found = metadata.topics().iter().find(|t| t.name() == topic);
        if found.is_none() && describe_refused(&producer, topic) {
            out.push(Check::fail(
                name,
                format!("walbox's principal is not authorized to describe topic {topic:?} (TOPIC_AUTHORIZATION_FAILED): the cluster does not say whether it exists"),
                format!(
                    "grant it {} on the topic (they imply Describe): kafka-acls.sh --bootstrap-server {} --add --allow-principal User:<walbox> {} --topic {topic} (docs/operations.md, ACLs)",
                    if *topic == kafka.progress_topic { "Write and Read" } else { "Write" },
                    kafka.brokers,
                    if *topic == kafka.progress_topic {
                        "--operation Write --operation Read"
                    } else {
                        "--operation Write"
                    },
                ),
            ));
            continue;
        }
        out.push(match found {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => {
                progress_exists |= *topic == kafka.progress_topic;
                Check::ok(name, format!("exists, partitions: {}", t.partitions().len()))
            }
            Some(t) if t.error().is_some() => Check::fail(
                name,
                format!(
                    "the cluster answers {} for topic {topic:?}",
                    t.error()
                        .map(RDKafkaErrorCode::from)
                        .map(|code| code.to_string())
                        .unwrap_or_default()
                ),
                "grant walbox's principal Describe and Write on the topic, or fix the topic",
            ),
            _ if kafka.create_topics.is_some() => Check::ok(
                name,
                "does not exist yet: walbox creates it (kafka.create_topics)",
            ),
            _ => Check::fail(
                name,
                format!("topic {topic:?} does not exist"),
                format!("create it (kafka-topics.sh --create --topic {topic}), or set kafka.create_topics = true"),
            ),
        });
    }

    out.push(idempotence(&producer));
    if progress_exists {
        out.push(progress_write(&cc, &kafka.progress_topic));
    }
    if kafka.exactly_once.is_some() {
        out.push(transactions(&cc, metadata.brokers().len()));
    }
    (out, progress_exists)
}

const PROGRESS_WRITE: &str = "progress topic write";

/// How long the brokers have to acknowledge the check's record on the progress topic.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// A producer's context that keeps the delivery report of its one record.
#[derive(Default)]
struct Delivery {
    report: Mutex<Option<Result<(), KafkaError>>>,
}

impl ClientContext for Delivery {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        tracing::debug!(?level, fac, "librdkafka: {log_message}");
    }
}

impl ProducerContext for Delivery {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, _: ()) {
        if let Ok(mut report) = self.report.lock() {
            *report = Some(result.as_ref().map(drop).map_err(|(e, _)| e.clone()));
        }
    }
}

/// Writes a tombstone to the progress topic under the check's own key (see the module docs).
fn progress_write(base: &ClientConfig, topic: &str) -> Check {
    let fail = |detail: String| {
        Check::fail(
            PROGRESS_WRITE,
            detail,
            format!("grant walbox's principal Write on topic {topic} (kafka-acls.sh --add --allow-principal User:<walbox> --operation Write --topic {topic}): walbox streams only once its slot is on record there"),
        )
    };
    let producer: BaseProducer<Delivery> = match base.create_with_context(Delivery::default()) {
        Ok(p) => p,
        Err(e) => return fail(format!("cannot create a Kafka client: {e}")),
    };
    let key = format!("walbox-check/{}", std::process::id());
    let record = rdkafka::producer::BaseRecord::<str, [u8]>::to(topic).key(key.as_str());
    if let Err((e, _)) = producer.send(record) {
        return fail(format!("the record was refused before it was sent: {e}"));
    }
    let deadline = Instant::now() + WRITE_TIMEOUT;
    loop {
        producer.poll(Duration::from_millis(50));
        let report = producer
            .context()
            .report
            .lock()
            .ok()
            .and_then(|r| r.clone());
        match report {
            Some(Ok(())) => {
                return Check::ok(
                    PROGRESS_WRITE,
                    format!("a record was written to {topic} (a tombstone under key {key})"),
                )
            }
            Some(Err(e)) => return fail(format!("the brokers refused a record: {e}")),
            None if Instant::now() >= deadline => {
                return fail(format!(
                    "no acknowledgement within {} s",
                    WRITE_TIMEOUT.as_secs()
                ))
            }
            None => {}
        }
    }
}

/// The brokers' refusal of `producer`'s credentials, when one came (serving the client's
/// pending error events first).
fn refused(producer: &BaseProducer<Probe>) -> Option<String> {
    producer.poll(Duration::from_millis(50));
    producer.context().refused.lock().ok()?.clone()
}

/// The line of a TLS handshake of `producer` that failed on a certificate, when one did
/// (serving the client's pending error events first).
fn untrusted(producer: &BaseProducer<Probe>) -> Option<String> {
    producer.poll(Duration::from_millis(50));
    producer.context().untrusted.line()
}

/// Whether the cluster refuses to describe `topic` to walbox's principal. A metadata request
/// for every topic leaves out the topics the principal may not describe, as if they did not
/// exist; one that names the topic answers TOPIC_AUTHORIZATION_FAILED (whether it exists or
/// not).
fn describe_refused(producer: &BaseProducer<Probe>, topic: &str) -> bool {
    producer
        .client()
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .is_ok_and(|md| {
            md.topics().iter().any(|t| {
                t.name() == topic
                    && t.error().map(RDKafkaErrorCode::from)
                        == Some(RDKafkaErrorCode::TopicAuthorizationFailed)
            })
        })
}

/// Initialises a transactional producer of its own: the transaction coordinator must answer
/// InitProducerId for a transactional id.
fn transactions(base: &ClientConfig, brokers: usize) -> Check {
    let mut cc = base.clone();
    cc.remove("statistics.interval.ms");
    cc.set(
        "transactional.id",
        format!("{PROBE_TRANSACTIONAL_ID}/{}", std::process::id()),
    );
    let producer: BaseProducer<Probe> = match cc.create_with_context(Probe::default()) {
        Ok(p) => p,
        Err(e) => {
            return Check::fail(
                TRANSACTIONS,
                format!("cannot create a transactional producer: {e}"),
                "check kafka.properties",
            )
        }
    };
    let secs = PRODUCER_ID_TIMEOUT.as_secs();
    match producer.init_transactions(PRODUCER_ID_TIMEOUT) {
        Ok(()) => Check::ok(
            TRANSACTIONS,
            "the transaction coordinator initialised a transactional producer (InitProducerId)",
        ),
        Err(e) => {
            let code = e.rdkafka_error_code();
            let denied = matches!(
                code,
                Some(
                    RDKafkaErrorCode::TransactionalIdAuthorizationFailed
                        | RDKafkaErrorCode::ClusterAuthorizationFailed
                )
            );
            if code == Some(RDKafkaErrorCode::InvalidTransactionTimeout)
                || producer.client().fatal_error().map(|(c, _)| c)
                    == Some(RDKafkaErrorCode::InvalidTransactionTimeout)
            {
                Check::fail(
                    TRANSACTIONS,
                    format!("the cluster refused transaction.timeout.ms: {e}"),
                    "it must not exceed the brokers' transaction.max.timeout.ms (15 minutes by default): lower kafka.properties.transaction.timeout.ms, or raise transaction.max.timeout.ms on the brokers",
                )
            } else if denied {
                Check::fail(
                    TRANSACTIONS,
                    format!("the cluster refused a transactional producer: {e}"),
                    "grant walbox's principal Write and Describe on transactional ids prefixed walbox/ (kafka-acls.sh --add --allow-principal User:<walbox> --operation Write --operation Describe --transactional-id walbox/ --resource-pattern-type prefixed)",
                )
            } else {
                Check::fail(
                    TRANSACTIONS,
                    format!("no transaction coordinator answered InitProducerId within {secs} s: {e}"),
                    format!("on the brokers, transaction.state.log.replication.factor and transaction.state.log.min.isr must not exceed the live brokers ({brokers}); then check the brokers' logs"),
                )
            }
        }
    }
}

/// Waits for the producer id the idempotent producer asks for when it starts.
fn idempotence(producer: &BaseProducer<Probe>) -> Check {
    let deadline = Instant::now() + PRODUCER_ID_TIMEOUT;
    let mut last = None;
    loop {
        producer.poll(Duration::from_millis(50));
        if let Some((code, reason)) = producer.client().fatal_error() {
            return Check::fail(
                IDEMPOTENCE,
                format!("the cluster refused the idempotent producer ({code:?}): {reason}"),
                "brokers of Kafka 0.11 or newer, and (before Kafka 3.0) an IdempotentWrite ACL on the cluster for walbox's principal",
            );
        }
        last = producer
            .context()
            .eos
            .lock()
            .ok()
            .and_then(|s| s.clone())
            .or(last);
        if let Some((state, id)) = &last {
            if state == "Assigned" {
                return Check::ok(
                    IDEMPOTENCE,
                    format!("producer id {id} assigned (InitProducerId)"),
                );
            }
        }
        if Instant::now() >= deadline {
            return Check::fail(
                IDEMPOTENCE,
                format!(
                    "no producer id within {} s (InitProducerId unanswered; producer state {})",
                    PRODUCER_ID_TIMEOUT.as_secs(),
                    last.map(|(s, _)| s).unwrap_or_else(|| "unknown".into())
                ),
                "check the brokers' logs; an idempotent producer needs Kafka 0.11 or newer and, before Kafka 3.0, an IdempotentWrite ACL",
            );
        }
    }
}
