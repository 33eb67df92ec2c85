//! `[rabbitmq]`: the RabbitMQ node walbox publishes to (AMQP 0-9-1), the exchange events go to,
//! where progress records are kept, and how long a publisher confirm may take.
//!
//! Invariants: the password is never part of `url` (refused, with the key to use instead), is
//! held as a [`Secret`] (redacted in `Debug`), and appears in no error. TLS files are only
//! accepted with an `amqps://` URL; a client certificate needs its key and the reverse.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::env::{EnvLayout, Kind, SecretKey, Setting};
use super::error::ConfigError;
use super::secret::Secret;
use super::units::HumanDuration;

/// `rabbitmq.exchange` unless set.
pub const DEFAULT_EXCHANGE: &str = "outbox";
/// `rabbitmq.progress_queue` unless set: the prefix of the progress queues.
pub const DEFAULT_PROGRESS_QUEUE: &str = "walbox.progress";
/// `rabbitmq.confirm_timeout` unless set.
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// `[rabbitmq]` as written.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRabbitMq {
    /// `amqp://user@host:5672/vhost` or `amqps://…`, without a password.
    pub url: Option<String>,
    /// The password of `url`'s user (usually from `password_file`).
    pub password: Option<String>,
    /// PEM file of the certificate authorities to trust (amqps).
    pub tls_ca_file: Option<PathBuf>,
    /// PEM file of the client certificate (amqps).
    pub tls_cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's key (amqps).
    pub tls_key_file: Option<PathBuf>,
    /// The exchange events are published to (it must exist).
    pub exchange: Option<String>,
    /// The prefix of the progress queues (one per slot, declared by walbox).
    pub progress_queue: Option<String>,
    /// How long a publisher confirm may take before the record is failed (transient).
    pub confirm_timeout: Option<HumanDuration>,
}

/// Validated `[rabbitmq]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RabbitMqConfig {
    /// The node's URL, without a password (`amqp://user@host:port/vhost`).
    pub url: String,
    /// The password of `url`'s user.
    pub password: Option<Secret>,
    /// Certificate authorities to trust, PEM.
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate and its key, PEM.
    pub tls_client: Option<(PathBuf, PathBuf)>,
    /// The exchange events are published to; `""` is the default exchange (routing key =
    /// queue name).
    pub exchange: String,
    /// The prefix of the progress queues: `<progress_queue>.<slot key>`.
    pub progress_queue: String,
    /// How long a publisher confirm may take.
    pub confirm_timeout: Duration,
}

impl RabbitMqConfig {
    /// A configuration for `url` (no password in it) with every default.
    pub fn for_url(url: &str) -> Self {
        RabbitMqConfig {
            url: url.to_owned(),
            password: None,
            tls_ca_file: None,
            tls_client: None,
            exchange: DEFAULT_EXCHANGE.to_owned(),
            progress_queue: DEFAULT_PROGRESS_QUEUE.to_owned(),
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
        }
    }

    /// Whether the URL asks for TLS.
    pub fn tls(&self) -> bool {
        self.url.starts_with("amqps://")
    }
}

impl std::fmt::Debug for RawRabbitMq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawRabbitMq")
            .field("url", &self.url)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("exchange", &self.exchange)
            .finish_non_exhaustive()
    }
}

const SECTION: &[&str] = &["rabbitmq"];

impl RawRabbitMq {
    /// `WALBOX_RABBITMQ_<KEY>`.
    pub(crate) const SETTINGS: &'static [Setting] = &[
        (SECTION, "url", Kind::Str),
        (SECTION, "password", Kind::Str),
        (SECTION, "tls_ca_file", Kind::Str),
        (SECTION, "tls_cert_file", Kind::Str),
        (SECTION, "tls_key_file", Kind::Str),
        (SECTION, "exchange", Kind::Str),
        (SECTION, "progress_queue", Kind::Str),
        (SECTION, "confirm_timeout", Kind::Str),
    ];

    /// The password may also be given as `password_file`.
    pub(crate) const SECRETS: &'static [SecretKey] = &[(SECTION, "password")];

    /// Checks the section and fills in defaults.
    pub(crate) fn validate(self, env: &EnvLayout) -> Result<RabbitMqConfig, ConfigError> {
        let invalid = |m: String| ConfigError::Invalid(m);
        let url = self.url.ok_or_else(|| {
            invalid(format!(
                "rabbitmq.url is required (amqp://user@host:5672/vhost; set it in the file or {})",
                env.var(SECTION, "url")
            ))
        })?;
        check_url(&url)?;
        let mut config = RabbitMqConfig::for_url(&url);
        config.password = self.password.map(Secret::new);
        if !config.tls()
            && (self.tls_ca_file.is_some()
                || self.tls_cert_file.is_some()
                || self.tls_key_file.is_some())
        {
            return Err(invalid(
                "rabbitmq.tls_* files need an amqps:// url (TLS); change the url's scheme or remove them".into(),
            ));
        }
        config.tls_ca_file = self.tls_ca_file;
        config.tls_client = match (self.tls_cert_file, self.tls_key_file) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert, key)),
            _ => return Err(invalid(
                "rabbitmq.tls_cert_file and rabbitmq.tls_key_file go together: set both or neither"
                    .into(),
            )),
        };
        if let Some(exchange) = self.exchange {
            if !valid_name(&exchange, true) {
                return Err(invalid(format!(
                    "rabbitmq.exchange {exchange:?}: at most 255 bytes of letters, digits, '-', '_', '.', ':' (\"\" is the default exchange)"
                )));
            }
            config.exchange = exchange;
        }
        if let Some(queue) = self.progress_queue {
            // Room for ".<slot key>" within AMQP's 255-byte names.
            if !valid_name(&queue, false) || queue.len() > 120 || queue.starts_with("amq.") {
                return Err(invalid(format!(
                    "rabbitmq.progress_queue {queue:?}: 1–120 bytes of letters, digits, '-', '_', '.', ':', not starting with \"amq.\""
                )));
            }
            config.progress_queue = queue;
        }
        if let Some(t) = self.confirm_timeout {
            if t.0.is_zero() {
                return Err(invalid("rabbitmq.confirm_timeout must be > 0".into()));
            }
            config.confirm_timeout = t.0;
        }
        Ok(config)
    }
}

/// AMQP names walbox accepts: what RabbitMQ's management and every client quote safely.
fn valid_name(name: &str, empty_ok: bool) -> bool {
    (empty_ok || !name.is_empty())
        && name.len() <= 255
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// `amqp://` or `amqps://`, a host, no password. Messages never quote the URL (it might hold
/// one).
fn check_url(url: &str) -> Result<(), ConfigError> {
    let rest = url
        .strip_prefix("amqp://")
        .or_else(|| url.strip_prefix("amqps://"))
        .ok_or_else(|| {
            ConfigError::Invalid(
                "rabbitmq.url must start with amqp:// or amqps:// (amqp://user@host:5672/vhost)"
                    .into(),
            )
        })?;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let host = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            if userinfo.contains(':') {
                return Err(ConfigError::Invalid(
                    "rabbitmq.url holds a password: remove it from the url and put it in rabbitmq.password_file (or WALBOX_RABBITMQ_PASSWORD)".into(),
                ));
            }
            host
        }
        None => authority,
    };
    if host.is_empty() || host.starts_with(':') {
        return Err(ConfigError::Invalid(
            "rabbitmq.url names no host (amqp://user@host:5672/vhost)".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::env::RUN_PREFIX;

    fn layout() -> EnvLayout {
        EnvLayout {
            prefix: RUN_PREFIX,
            scalars: &[],
            secrets: &[],
            accepted: &[],
            others: &[],
            foreign: &[],
        }
    }

    fn raw(url: &str) -> RawRabbitMq {
        RawRabbitMq {
            url: Some(url.into()),
            ..Default::default()
        }
    }

    fn error(raw: RawRabbitMq) -> String {
        raw.validate(&layout()).unwrap_err().to_string()
    }

    #[test]
    fn defaults() {
        let c = raw("amqp://walbox@mq:5672/%2f")
            .validate(&layout())
            .unwrap();
        assert_eq!(c.exchange, "outbox");
        assert_eq!(c.progress_queue, "walbox.progress");
        assert_eq!(c.confirm_timeout, Duration::from_secs(30));
        assert!(!c.tls());
    }

    #[test]
    fn a_password_in_the_url_is_refused_without_quoting_it() {
        let e = error(raw("amqp://walbox:hunter2@mq:5672/%2f"));
        assert!(e.contains("password_file"), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
    }

    #[test]
    fn url_is_required_and_checked() {
        let e = error(RawRabbitMq::default());
        assert!(
            e.contains("rabbitmq.url is required") && e.contains("WALBOX_RABBITMQ_URL"),
            "{e}"
        );
        assert!(error(raw("http://mq")).contains("amqp://"));
        assert!(error(raw("amqp:///vhost")).contains("no host"));
    }

    #[test]
    fn tls_files_need_amqps_and_pairs() {
        let mut r = raw("amqp://walbox@mq");
        r.tls_ca_file = Some("/ca.pem".into());
        assert!(error(r).contains("amqps://"));
        let mut r = raw("amqps://walbox@mq");
        r.tls_cert_file = Some("/c.pem".into());
        assert!(error(r).contains("set both"));
    }

    #[test]
    fn names_and_timeout() {
        let mut r = raw("amqp://walbox@mq");
        r.exchange = Some("bad name".into());
        assert!(error(r).contains("rabbitmq.exchange"));
        let mut r = raw("amqp://walbox@mq");
        r.progress_queue = Some("amq.x".into());
        assert!(error(r).contains("rabbitmq.progress_queue"));
        let mut r = raw("amqp://walbox@mq");
        r.confirm_timeout = Some(HumanDuration(Duration::ZERO));
        assert!(error(r).contains("confirm_timeout"));
        let mut r = raw("amqp://walbox@mq");
        r.exchange = Some(String::new());
        assert_eq!(r.validate(&layout()).unwrap().exchange, "");
    }

    #[test]
    fn debug_hides_the_password() {
        let mut r = raw("amqp://walbox@mq");
        r.password = Some("hunter2".into());
        assert!(!format!("{r:?}").contains("hunter2"));
        let c = r.validate(&layout()).unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}
