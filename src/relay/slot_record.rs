//! What the progress records say about a missing slot: whether it may be created
//! ([`never_existed`]), and where the broker keeps the records ([`progress_place`]), for the
//! relay's start and `app/layout.rs`'s shards. A leaf of `relay`: it imports no sibling but
//! the errors.

use std::time::Duration;

use super::error::RelayError;
use crate::config::{BrokerConfig, KafkaConfig};
use crate::sink::progress::ProgressKey;

/// How long reading the progress topic may take when the slot is missing.
const PROGRESS_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Where `broker` keeps `key`'s progress records, as messages name it
/// (`kafka topic "walbox.progress"`).
pub fn progress_place(broker: &BrokerConfig, kafka: &KafkaConfig, key: &ProgressKey) -> String {
    match broker {
        BrokerConfig::Kafka => {
            let _ = key;
            format!("kafka topic {:?}", kafka.progress_topic)
        }
        BrokerConfig::Redis(redis) => crate::sink::redis::progress_place(redis, &key.record_key()),
        BrokerConfig::Nats(n) => format!(
            "nats key-value bucket {:?}, key {:?}",
            n.progress_bucket,
            crate::sink::nats::sanitize_key(&key.record_key())
        ),
        BrokerConfig::RabbitMq(r) => format!(
            "rabbitmq queue {:?}",
            crate::sink::rabbitmq::progress_queue(r, &key.record_key())
        ),
    }
}

/// Whether the missing slot of `key` may be created: `Ok` when the progress topic holds no
/// record of it (it never existed); [`RelayError::SlotGone`] when it does (it existed and is
/// gone, its message naming `time_column` in the republish command); [`RelayError::Progress`]
/// (transient) when the topic cannot be read to its end.
pub async fn never_existed(
    broker: &BrokerConfig,
    kafka: &KafkaConfig,
    key: &ProgressKey,
    time_column: Option<String>,
) -> Result<(), RelayError> {
    let evidence = crate::sink::read_progress(broker, kafka, key, PROGRESS_READ_TIMEOUT).await;
    match evidence {
        Ok(None) => Ok(()),
        Ok(Some(record)) => Err(RelayError::SlotGone {
            slot: key.slot.clone(),
            record: Box::new(record),
            topic: progress_place(broker, kafka, key),
            time_column,
        }),
        Err(e) => Err(RelayError::Progress(e)),
    }
}
