//! What the progress records say about a slot, read on connections of its own: the slot's
//! progress key on the server `postgres.url` names ([`progress_key`]), and its newest record
//! ([`last_progress`]). The relay reads it when it finds its slot lost, to say which window
//! of events no slot holds; `walbox recreate-slot` reads it for the old slot's position and
//! resets it under the same key. The records themselves (what they hold, when they are
//! written) are `sink::progress`'s.
//!
//! Both answer `None` when the server or the broker does not: the callers then say that no record
//! was found, never guess a position.

use crate::config::conninfo::ConnInfo;
use crate::config::{BrokerConfig, KafkaConfig};
use crate::sink::progress::{ProgressKey, ProgressRecord};
use crate::sink::read_progress;
use crate::source::replication::ReplicationConnection;

/// The progress key of `slot` on the server `conn` names, and the server's timeline, when the
/// server answers.
pub async fn progress_key(conn: &ConnInfo, slot: &str) -> Option<(ProgressKey, u32)> {
    let mut repl = ReplicationConnection::connect(conn).await.ok()?;
    let identity = repl.identify_system().await.ok()?;
    // Terminate, so the server logs no unexpected EOF.
    if let Err(e) = repl.close().await {
        tracing::debug!(error = %e, "closing the replication connection");
    }
    let key = ProgressKey {
        system_identifier: identity.system_id,
        database: identity.dbname.unwrap_or_default(),
        slot: slot.to_owned(),
    };
    Some((key, identity.timeline))
}

/// The newest progress record of `slot` on the server `conn` names, when the broker (where
/// `broker` keeps the records; `kafka` when that is Kafka) and the server answer (`walbox
/// recreate-slot`, and the relay's message for a slot found lost).
pub async fn last_progress(
    conn: &ConnInfo,
    slot: &str,
    broker: &BrokerConfig,
    kafka: &KafkaConfig,
) -> Option<ProgressRecord> {
    let (key, _) = progress_key(conn, slot).await?;
    match read_progress(broker, kafka, &key, std::time::Duration::from_secs(30)).await {
        Ok(record) => record,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the progress record");
            None
        }
    }
}
