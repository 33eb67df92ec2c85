//! `[alerts]`: delivery of alert level transitions to a webhook (Alertmanager's format).
//!
//! Invariants (checked by [`RawAlerts::validate`]): the webhook URL starts with
//! `http://` or `https://` and is never quoted in an error, since it often embeds a token; each
//! transition gets at least one delivery attempt.

use std::time::Duration;

use serde::Deserialize;

use super::env::{Kind, SecretKey, Setting};
use super::error::ConfigError;
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

impl RawAlerts {
    /// The settings of `[alerts]`.
    pub(super) const SETTINGS: &'static [Setting] = &[
        (&["alerts"], "webhook_url", Kind::Str),
        (&["alerts"], "webhook_token", Kind::Str),
        (&["alerts"], "webhook_attempts", Kind::Int),
        (&["alerts"], "webhook_timeout", Kind::Str),
    ];

    /// Its secrets: each may also be given as `<key>_file`.
    pub(super) const SECRETS: &'static [SecretKey] =
        &[(&["alerts"], "webhook_url"), (&["alerts"], "webhook_token")];

    /// Checks values and fills in defaults.
    pub(super) fn validate(self) -> Result<AlertsConfig, ConfigError> {
        if let Some(url) = &self.webhook_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                // Not quoted: webhook URLs often embed a token.
                return Err(ConfigError::Invalid(
                    "alerts.webhook_url must start with http:// or https://".into(),
                ));
            }
        }
        Ok(AlertsConfig {
            webhook_url: self.webhook_url,
            webhook_token: self.webhook_token.map(Secret::new),
            webhook_attempts: self.webhook_attempts.unwrap_or(5).max(1),
            webhook_timeout: self
                .webhook_timeout
                .map(|d| d.0)
                .unwrap_or(Duration::from_secs(5)),
        })
    }
}
