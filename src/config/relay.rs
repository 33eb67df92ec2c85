//! `[relay]`: the pipeline's limits and timings: events in flight, the shutdown wait and the
//! reconnect backoff.
//!
//! Invariants: `max_in_flight` is between 1 and 1,000,000 and `0 < backoff_initial <=
//! backoff_max` ([`RawRelay::validate`]); `max_in_flight` is at most the producer's queue
//! (`queue.buffering.max.messages`; with shards, which share one producer, `max_in_flight ×
//! shards` is at most a queue the user set, and an unset queue is sized to hold it), a rule
//! across sections checked in `document.rs`.

use std::time::Duration;

use serde::Deserialize;

use super::env::{Kind, Setting};
use super::error::ConfigError;
use super::units::HumanDuration;

/// `[relay]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRelay {
    /// Maximum events produced but not yet acknowledged.
    pub max_in_flight: Option<usize>,
    /// How long shutdown waits for in-flight acknowledgements.
    pub shutdown_timeout: Option<HumanDuration>,
    /// First reconnect delay.
    pub backoff_initial: Option<HumanDuration>,
    /// Longest reconnect delay.
    pub backoff_max: Option<HumanDuration>,
}

/// `relay.max_in_flight` when the configuration does not set it.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 10_000;

/// Validated `[relay]`.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Maximum events produced and not yet retired by the checkpoint.
    pub max_in_flight: usize,
    /// How long shutdown waits for in-flight acknowledgements.
    pub shutdown_timeout: Duration,
    /// First reconnect delay.
    pub backoff_initial: Duration,
    /// Longest reconnect delay.
    pub backoff_max: Duration,
}

impl RawRelay {
    /// The settings of `[relay]`.
    pub(super) const SETTINGS: &'static [Setting] = &[
        (&["relay"], "max_in_flight", Kind::Int),
        (&["relay"], "shutdown_timeout", Kind::Str),
        (&["relay"], "backoff_initial", Kind::Str),
        (&["relay"], "backoff_max", Kind::Str),
    ];

    /// Checks values and fills in defaults.
    pub(super) fn validate(self) -> Result<RelayConfig, ConfigError> {
        let max_in_flight = self.max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT);
        if !(1..=1_000_000).contains(&max_in_flight) {
            return Err(ConfigError::Invalid(
                "relay.max_in_flight must be between 1 and 1000000".into(),
            ));
        }
        let (backoff_initial, backoff_max) = backoff(
            "relay",
            (self.backoff_initial, self.backoff_max),
            (Duration::from_millis(200), Duration::from_secs(30)),
        )?;
        Ok(RelayConfig {
            max_in_flight,
            shutdown_timeout: self
                .shutdown_timeout
                .map(|d| d.0)
                .unwrap_or(Duration::from_secs(30)),
            backoff_initial,
            backoff_max,
        })
    }
}

/// A backoff's `<section>.backoff_initial` and `<section>.backoff_max` (`[relay]`'s reconnects,
/// the inbox's `[effect]` retries), `defaults` where unset: `0 < initial <= max`.
pub(crate) fn backoff(
    section: &str,
    (initial, max): (Option<HumanDuration>, Option<HumanDuration>),
    defaults: (Duration, Duration),
) -> Result<(Duration, Duration), ConfigError> {
    let initial = initial.map_or(defaults.0, |d| d.0);
    let max = max.map_or(defaults.1, |d| d.0);
    if initial.is_zero() || max < initial {
        return Err(ConfigError::Invalid(format!(
            "{section}.backoff_initial must be > 0 and <= {section}.backoff_max"
        )));
    }
    Ok((initial, max))
}
