//! The retention guard and the clean-up job.
//!
//! A record older than the inbox's retention can still be replayed (consumer-group reset, a new
//! consumer, a restore) for as long as the topic keeps it; its inbox row is gone by then, so it
//! would be processed twice. The guard reads each topic's `retention.ms`, `segment.ms` and
//! `cleanup.policy` through the admin API (`DescribeConfigs`) at start-up and compares the
//! topic's **replay window** with `retention.keep`:
//!
//! - Kafka deletes whole segments, and a segment only once its newest record is older than
//!   `retention.ms`; a segment rolls after `segment.ms`. A record can therefore be read for up to
//!   `retention.ms + segment.ms`: that sum is the replay window.
//! - `retention.ms = -1` or a `compact` cleanup policy keeps records forever: only an inbox that
//!   keeps rows forever (no `retention.keep`) is safe.
//!
//! With no `retention.keep` the inbox keeps rows forever and the guard has nothing to check.
//! When the topic configuration cannot be read, `guard = "refuse"` refuses to start too: safety
//! that cannot be shown is not assumed. A TLS handshake with the brokers that failed on a
//! certificate ends the wait for the answer at once and stops the inbox with exit 4 whatever
//! the guard's setting ([`DescribeError::Untrusted`]): the consumer would meet it next.
//!
//! The clean-up job deletes this consumer's rows older than `retention.keep` in batches of
//! `retention.cleanup_batch` (short transactions, no long-held locks), every
//! `retention.cleanup_interval`.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::error::KafkaError;
use rdkafka::ClientContext;

use super::config::InboxKafka;
use crate::config::KafkaRole;
use crate::failure::{Classify, Failure, UntrustedCertificate};

/// A topic's retention settings as the broker reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRetention {
    /// The topic the settings belong to.
    pub topic: String,
    /// `retention.ms`; `None` = forever (-1).
    pub retention: Option<Duration>,
    /// `segment.ms`.
    pub segment: Duration,
    /// `cleanup.policy` contains `compact`.
    pub compacted: bool,
}

impl TopicRetention {
    /// How long a record of this topic can be replayed; `None` = forever.
    pub fn replay_window(&self) -> Option<Duration> {
        if self.compacted {
            return None;
        }
        self.retention.map(|r| r.saturating_add(self.segment))
    }
}

/// Whether an inbox keeping rows for `keep` (`None` = forever) is safe for `topic`; `Err` is
/// the one-line explanation.
pub fn check(keep: Option<Duration>, topic: &TopicRetention) -> Result<(), String> {
    let Some(keep) = keep else { return Ok(()) };
    match topic.replay_window() {
        None => Err(format!(
            "topic {:?} keeps records forever ({}), but the inbox keeps rows for only {}: a replay would process old records twice; remove retention.keep or bound the topic's retention",
            topic.topic,
            if topic.compacted { "cleanup.policy=compact" } else { "retention.ms=-1" },
            human(keep),
        )),
        Some(window) if window > keep => Err(format!(
            "topic {:?} can replay records for up to {} (retention.ms {} + segment.ms {}), but the inbox keeps rows for only {}: a replay older than the inbox would process records twice; raise retention.keep to at least {}",
            topic.topic,
            human(window),
            human(topic.retention.unwrap_or_default()),
            human(topic.segment),
            human(keep),
            human(window),
        )),
        Some(_) => Ok(()),
    }
}

/// `90000s` → `1d 1h`; for messages.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    let (days, h, m, sec) = (s / 86_400, s % 86_400 / 3600, s % 3600 / 60, s % 60);
    let mut parts = Vec::new();
    if days > 0 {
        parts.push(format!("{days}d"));
    }
    if h > 0 {
        parts.push(format!("{h}h"));
    }
    if m > 0 {
        parts.push(format!("{m}m"));
    }
    if sec > 0 || parts.is_empty() {
        parts.push(format!("{sec}s"));
    }
    parts.join(" ")
}

/// Reading topic configurations failed.
#[derive(Debug, thiserror::Error)]
pub enum DescribeError {
    /// The admin client or the request failed.
    #[error("cannot read the configuration of topic(s) {topics}: {source}")]
    Kafka {
        /// Topics asked for.
        topics: String,
        /// The cause.
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// The broker answered with an error or an unreadable value.
    #[error("cannot read the configuration of topic {topic:?}: {message}")]
    Topic {
        /// The topic whose configuration was asked for.
        topic: String,
        /// What went wrong.
        message: String,
    },
    /// No answer in time.
    #[error("timed out reading the configuration of topic(s) {0}")]
    Timeout(String),
    /// A TLS handshake with the brokers failed on a certificate: its one line
    /// (`failure::untrusted_certificate`). No retry can succeed: exit 4.
    #[error("{0}")]
    Untrusted(String),
}

impl Classify for DescribeError {
    /// The guard cannot show that `retention.keep` covers the topics: under `guard = "refuse"`
    /// the inbox does not start (exit 11), whatever the cause; a Kafka error that stops any
    /// client (credentials refused) stops it with that error's status.
    fn failure(&self) -> Option<Failure> {
        match self {
            DescribeError::Kafka { source, .. } => source.failure().or(Some(Failure::Retention)),
            DescribeError::Topic { .. } | DescribeError::Timeout(_) => Some(Failure::Retention),
            DescribeError::Untrusted(_) => Some(Failure::Auth),
        }
    }
}

fn millis(
    topic: &str,
    name: &str,
    value: Option<&str>,
    default: i64,
) -> Result<i64, DescribeError> {
    match value {
        None => Ok(default),
        Some(v) => v.trim().parse::<i64>().map_err(|_| DescribeError::Topic {
            topic: topic.to_owned(),
            message: format!("{name} = {v:?} is not a number"),
        }),
    }
}

/// The admin client's context: a TLS handshake that failed on a certificate ends the wait for
/// an answer that cannot come ([`UntrustedCertificate::reported`]); every other client error is
/// logged.
#[derive(Default)]
struct AdminContext {
    untrusted: Arc<UntrustedCertificate>,
}

impl ClientContext for AdminContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if !self.untrusted.record(&error, reason) {
            tracing::warn!(error = %error, reason, "kafka admin client error");
        }
    }
}

/// Reads the retention settings of `kafka.topics` through the admin API.
pub async fn describe(
    kafka: &InboxKafka,
    timeout: Duration,
) -> Result<Vec<TopicRetention>, DescribeError> {
    let names = kafka.topics.join(", ");
    let cc = kafka.client_config(KafkaRole::Admin);
    let context = AdminContext::default();
    let untrusted = context.untrusted.clone();
    let admin: AdminClient<AdminContext> =
        cc.create_with_context(context)
            .map_err(|source| DescribeError::Kafka {
                topics: names.clone(),
                source,
            })?;
    let specs: Vec<ResourceSpecifier<'_>> = kafka
        .topics
        .iter()
        .map(|t| ResourceSpecifier::Topic(t.as_str()))
        .collect();
    let opts = AdminOptions::new().request_timeout(Some(timeout));
    let answer = tokio::time::timeout(timeout, admin.describe_configs(&specs, &opts));
    let results = tokio::select! {
        answer = answer => answer,
        line = untrusted.reported() => return Err(DescribeError::Untrusted(line)),
    }
    .map_err(|_| DescribeError::Timeout(names.clone()))?
    .map_err(|source| DescribeError::Kafka {
        topics: names.clone(),
        source,
    })?;
    let mut out = Vec::with_capacity(results.len());
    for (topic, result) in kafka.topics.iter().zip(results) {
        let resource = result.map_err(|code| DescribeError::Topic {
            topic: topic.clone(),
            message: code.to_string(),
        })?;
        let value = |name: &str| resource.get(name).and_then(|e| e.value.clone());
        let retention_ms = millis(
            topic,
            "retention.ms",
            value("retention.ms").as_deref(),
            7 * 86_400_000,
        )?;
        let segment_ms = millis(
            topic,
            "segment.ms",
            value("segment.ms").as_deref(),
            7 * 86_400_000,
        )?;
        let compacted = value("cleanup.policy").is_some_and(|p| p.contains("compact"));
        out.push(TopicRetention {
            topic: topic.clone(),
            retention: u64::try_from(retention_ms).ok().map(Duration::from_millis),
            segment: Duration::from_millis(u64::try_from(segment_ms).unwrap_or(0)),
            compacted,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn topic(retention_days: Option<u64>, segment_days: u64, compacted: bool) -> TopicRetention {
        TopicRetention {
            topic: "payments".into(),
            retention: retention_days.map(|d| DAY * d as u32),
            segment: DAY * segment_days as u32,
            compacted,
        }
    }

    #[test]
    fn the_replay_window_includes_the_open_segment() {
        let t = topic(Some(7), 7, false);
        assert_eq!(t.replay_window(), Some(DAY * 14));
        let e = check(Some(DAY * 10), &t).unwrap_err();
        assert!(e.contains("14d") && e.contains("10d"), "{e}");
        assert!(check(Some(DAY * 14), &t).is_ok());
        assert!(check(None, &t).is_ok());
    }

    #[test]
    fn forever_topics_need_a_forever_inbox() {
        assert!(check(Some(DAY * 365), &topic(None, 7, false)).is_err());
        assert!(check(Some(DAY * 365), &topic(Some(1), 1, true)).is_err());
        assert!(check(None, &topic(None, 7, true)).is_ok());
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human(Duration::from_secs(90_061)), "1d 1h 1m 1s");
        assert_eq!(human(Duration::ZERO), "0s");
    }
}
