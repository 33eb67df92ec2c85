//! Where events go: Kafka ([`kafka`]), its topics ([`topics`]), walbox's own progress
//! records ([`progress`]), and Kafka transactions for exactly-once mode ([`transaction`]).

use std::collections::BTreeMap;

pub mod kafka;
pub mod progress;
pub mod topics;
pub mod transaction;

/// The user's producer properties that every other client of the same cluster (admin,
/// progress reader) needs too: security settings, not producer tuning.
pub fn security_properties(
    properties: &BTreeMap<String, String>,
) -> impl Iterator<Item = (&str, &str)> {
    properties
        .iter()
        .filter(|(k, _)| {
            k.starts_with("security.") || k.starts_with("sasl.") || k.starts_with("ssl.")
        })
        .map(|(k, v)| (k.as_str(), v.as_str()))
}
