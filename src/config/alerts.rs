//! `[alerts]`: delivery of alert level transitions to a webhook (Alertmanager's format).
//!
//! Invariants (checked by `RawConfig::validate`, in `document.rs`): the webhook URL starts with
//! `http://` or `https://` and is never quoted in an error, since it often embeds a token; each
//! transition gets at least one delivery attempt.

use std::time::Duration;

use serde::Deserialize;

use super::secret::Secret;
use super::units::HumanDuration;

/// `[alerts]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAlerts {
    /// URL receiving each alert level transition as JSON (Alertmanager webhook format).
    pub webhook_url: Option<String>,
    /// Sent as `Authorization: Bearer <token>`.
    pub webhook_token: Option<String>,
    /// Delivery attempts per transition.
    pub webhook_attempts: Option<u32>,
    /// Timeout of one attempt.
    pub webhook_timeout: Option<HumanDuration>,
}

/// Validated `[alerts]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertsConfig {
    /// Webhook receiving level transitions.
    pub webhook_url: Option<String>,
    /// `Authorization: Bearer` token of the webhook (redacted in `Debug`).
    pub webhook_token: Option<Secret>,
    /// Delivery attempts per transition.
    pub webhook_attempts: u32,
    /// Timeout of one attempt.
    pub webhook_timeout: Duration,
}
