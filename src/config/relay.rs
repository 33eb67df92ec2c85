//! `[relay]`: the pipeline's limits and timings: events in flight, the shutdown wait and the
//! reconnect backoff.
//!
//! Invariants (checked by `RawConfig::validate`, in `document.rs`): `max_in_flight` is between
//! 1 and 1,000,000 and at most the producer's queue (`queue.buffering.max.messages`; with
//! shards, which share one producer, `max_in_flight × shards` is at most a queue the user set,
//! and an unset queue is sized to hold it), and `0 < backoff_initial <= backoff_max`.

use std::time::Duration;

use serde::Deserialize;

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
