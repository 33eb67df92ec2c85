//! `[redis]`: the Redis server walbox publishes to as Redis Streams (`sink::redis`), and where
//! it keeps its progress records there.
//!
//! Invariants (checked by [`RawRedis::validate`]): `url` is a `redis://` URL without a
//! password (the password comes from `password_file`, `password` or `WALBOX_REDIS_PASSWORD`,
//! and is held as a [`Secret`]); no message quotes the URL (it may embed a password);
//! `rediss://` is TLS (rustls), verifying the server against `tls_ca_file` (PEM, read when the
//! configuration is loaded) or the system's roots, and `tls_ca_file` without `rediss://` is
//! refused; `maxlen`, when set, is at least 1; `wait_timeout` is at least 1ms.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use super::env::{Kind, SecretKey, Setting};
use super::error::ConfigError;
use super::secret::Secret;
use super::units::HumanDuration;

/// `redis.progress_key_prefix` unless set.
pub const DEFAULT_PROGRESS_KEY_PREFIX: &str = "walbox:progress:";

/// `[redis]` as written.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRedis {
    /// `redis://host:6379/0`, or `rediss://` for TLS.
    pub url: Option<String>,
    /// PEM file of the CA that signed the server's certificate (`rediss://`); without it, the
    /// system's roots.
    pub tls_ca_file: Option<String>,
    /// ACL user (`AUTH <user> <password>`); without it, the `default` user.
    pub user: Option<String>,
    /// The password (usually from `password_file`).
    pub password: Option<String>,
    /// Where progress records are kept: `<prefix><slot key>`.
    pub progress_key_prefix: Option<String>,
    /// `XADD … MAXLEN ~ <maxlen>`: trim each stream to about this many entries.
    pub maxlen: Option<u64>,
    /// `WAIT <n> <timeout>` after each pipeline: an ack means n replicas have the entries.
    pub wait_replicas: Option<u32>,
    /// How long `WAIT` waits for the replicas.
    pub wait_timeout: Option<HumanDuration>,
    /// How long a connection attempt or a reply may take.
    pub timeout: Option<HumanDuration>,
}

impl fmt::Debug for RawRedis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawRedis")
            .field("url", &self.url.as_ref().map(|_| "…"))
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("progress_key_prefix", &self.progress_key_prefix)
            .field("maxlen", &self.maxlen)
            .field("wait_replicas", &self.wait_replicas)
            .finish_non_exhaustive()
    }
}

/// Validated `[redis]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://host:port/db` (or `rediss://`), without credentials.
    pub url: String,
    /// The CA certificates (PEM) that verify the server of a `rediss://` URL; `None`: the
    /// system's roots.
    pub tls_ca: Option<Vec<u8>>,
    /// ACL user; `None`: the `default` user.
    pub user: Option<String>,
    /// The password (redacted in `Debug`).
    pub password: Option<Secret>,
    /// Progress records are kept at `<progress_key_prefix><slot key>`.
    pub progress_key_prefix: String,
    /// `MAXLEN ~ n` trimming of every stream, if set.
    pub maxlen: Option<u64>,
    /// Replicas that must have each pipeline's entries before they are acknowledged (0: none).
    pub wait_replicas: u32,
    /// How long `WAIT` waits for them.
    pub wait_timeout: Duration,
    /// Connection and reply timeout.
    pub timeout: Duration,
}

impl RedisConfig {
    /// A configuration for `url` with every default (tests, the sandbox).
    pub fn for_url(url: impl Into<String>) -> Self {
        RedisConfig {
            url: url.into(),
            tls_ca: None,
            user: None,
            password: None,
            progress_key_prefix: DEFAULT_PROGRESS_KEY_PREFIX.to_owned(),
            maxlen: None,
            wait_replicas: 0,
            wait_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(10),
        }
    }
}

impl RawRedis {
    /// The settings of `[redis]`.
    pub(super) const SETTINGS: &'static [Setting] = &[
        (&["redis"], "url", Kind::Str),
        (&["redis"], "tls_ca_file", Kind::Str),
        (&["redis"], "user", Kind::Str),
        (&["redis"], "password", Kind::Str),
        (&["redis"], "progress_key_prefix", Kind::Str),
        (&["redis"], "maxlen", Kind::Int),
        (&["redis"], "wait_replicas", Kind::Int),
        (&["redis"], "wait_timeout", Kind::Str),
        (&["redis"], "timeout", Kind::Str),
    ];

    /// Its secrets: `password` may also be given as `password_file`.
    pub(super) const SECRETS: &'static [SecretKey] = &[(&["redis"], "password")];

    /// Checks values and fills in defaults.
    pub(super) fn validate(self) -> Result<RedisConfig, ConfigError> {
        let url = self.url.ok_or_else(|| {
            ConfigError::Invalid(
                "redis.url is required with [redis] (redis://host:6379/0; set it in the file or WALBOX_REDIS_URL)".into(),
            )
        })?;
        check_url(&url)?;
        let tls_ca = match &self.tls_ca_file {
            None => None,
            Some(_) if !url.starts_with("rediss://") => {
                return Err(ConfigError::Invalid(
                    "redis.tls_ca_file applies to rediss:// URLs only: use rediss:// in redis.url, or remove it".into(),
                ))
            }
            Some(path) => Some(std::fs::read(path).map_err(|e| {
                ConfigError::Invalid(format!("redis.tls_ca_file: cannot read {path}: {e}"))
            })?),
        };
        if self.user.as_deref().is_some_and(str::is_empty) {
            return Err(ConfigError::Invalid(
                "redis.user must not be empty; remove it to use the default user".into(),
            ));
        }
        if self.user.is_some() && self.password.is_none() {
            return Err(ConfigError::Invalid(
                "redis.user needs a password: set redis.password_file (or WALBOX_REDIS_PASSWORD)"
                    .into(),
            ));
        }
        let progress_key_prefix = self
            .progress_key_prefix
            .unwrap_or_else(|| DEFAULT_PROGRESS_KEY_PREFIX.to_owned());
        if progress_key_prefix.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "redis.progress_key_prefix must not be empty (default {DEFAULT_PROGRESS_KEY_PREFIX:?})"
            )));
        }
        if self.maxlen == Some(0) {
            return Err(ConfigError::Invalid(
                "redis.maxlen must be at least 1 (remove it to keep every entry)".into(),
            ));
        }
        let wait_timeout = self
            .wait_timeout
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(5));
        if wait_timeout.is_zero() {
            // `WAIT n 0` blocks forever.
            return Err(ConfigError::Invalid(
                "redis.wait_timeout must be at least 1ms (WAIT with 0 waits forever)".into(),
            ));
        }
        let timeout = self.timeout.map(|d| d.0).unwrap_or(Duration::from_secs(10));
        if timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "redis.timeout must be greater than 0".into(),
            ));
        }
        Ok(RedisConfig {
            url,
            tls_ca,
            user: self.user,
            password: self.password.map(Secret::new),
            progress_key_prefix,
            maxlen: self.maxlen,
            wait_replicas: self.wait_replicas.unwrap_or(0),
            wait_timeout,
            timeout,
        })
    }
}

/// `url` is `redis[s]://host[:port][/db]`, without a user or password. Never quoted in a message.
fn check_url(url: &str) -> Result<(), ConfigError> {
    let Some(rest) = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("rediss://"))
    else {
        return Err(ConfigError::Invalid(
            "redis.url must start with redis:// (redis://host:6379/0), or rediss:// for TLS".into(),
        ));
    };
    if url.contains("#insecure") {
        return Err(ConfigError::Invalid(
            "redis.url: #insecure would skip verifying the server's certificate; set redis.tls_ca_file to the CA that signed it".into(),
        ));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        if userinfo.contains(':') {
            return Err(ConfigError::Invalid(
                "redis.url must not contain a password: remove it from the URL and set redis.password_file (or WALBOX_REDIS_PASSWORD), and redis.user for an ACL user".into(),
            ));
        }
        return Err(ConfigError::Invalid(
            "redis.url must not contain a user: set redis.user instead".into(),
        ));
    }
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    if host.is_empty() {
        return Err(ConfigError::Invalid(
            "redis.url has no host (redis://host:6379/0)".into(),
        ));
    }
    if redis::IntoConnectionInfo::into_connection_info(url).is_err() {
        return Err(ConfigError::Invalid(
            "redis.url is not a valid Redis URL (redis://host:6379/0: a port number, a database number)".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(url: &str) -> RawRedis {
        RawRedis {
            url: Some(url.to_owned()),
            ..Default::default()
        }
    }

    #[test]
    fn refusals_name_the_key_and_never_quote_the_url() {
        let cases: &[(RawRedis, &str)] = &[
            (RawRedis::default(), "redis.url is required"),
            (raw("http://h:6379"), "redis.url must start with redis://"),
            (
                raw("rediss://h:6379/#insecure"),
                "#insecure would skip verifying",
            ),
            (
                RawRedis {
                    tls_ca_file: Some("/ca.pem".into()),
                    ..raw("redis://h")
                },
                "redis.tls_ca_file applies to rediss:// URLs only",
            ),
            (
                RawRedis {
                    tls_ca_file: Some("/nonexistent/ca.pem".into()),
                    ..raw("rediss://h")
                },
                "redis.tls_ca_file: cannot read /nonexistent/ca.pem",
            ),
            (
                raw("redis://:s3cret@h:6379/0"),
                "must not contain a password: remove it from the URL and set redis.password_file",
            ),
            (
                raw("redis://bob:s3cret@h:6379/0"),
                "must not contain a password",
            ),
            (raw("redis://bob@h:6379/0"), "set redis.user instead"),
            (raw("redis://:6379"), "redis.url has no host"),
            (
                raw("redis://h:port/0"),
                "redis.url is not a valid Redis URL",
            ),
            (
                RawRedis {
                    maxlen: Some(0),
                    ..raw("redis://h")
                },
                "redis.maxlen must be at least 1",
            ),
            (
                RawRedis {
                    wait_timeout: Some(HumanDuration(Duration::ZERO)),
                    ..raw("redis://h")
                },
                "redis.wait_timeout must be at least 1ms",
            ),
            (
                RawRedis {
                    user: Some("walbox".into()),
                    ..raw("redis://h")
                },
                "redis.user needs a password",
            ),
            (
                RawRedis {
                    progress_key_prefix: Some(String::new()),
                    ..raw("redis://h")
                },
                "redis.progress_key_prefix must not be empty",
            ),
        ];
        for (raw, message) in cases {
            let e = RawRedis {
                url: raw.url.clone(),
                tls_ca_file: raw.tls_ca_file.clone(),
                user: raw.user.clone(),
                password: raw.password.clone(),
                progress_key_prefix: raw.progress_key_prefix.clone(),
                maxlen: raw.maxlen,
                wait_replicas: raw.wait_replicas,
                wait_timeout: raw.wait_timeout,
                timeout: raw.timeout,
            }
            .validate()
            .unwrap_err()
            .to_string();
            assert!(e.contains(message), "{e:?} lacks {message:?}");
            assert!(!e.contains("s3cret"), "{e}");
        }
    }

    #[test]
    fn defaults_and_a_redacted_password() {
        let c = RawRedis {
            user: Some("walbox".into()),
            password: Some("s3cret".into()),
            ..raw("redis://127.0.0.1:6379/2")
        }
        .validate()
        .unwrap();
        assert_eq!(c.progress_key_prefix, DEFAULT_PROGRESS_KEY_PREFIX);
        assert_eq!((c.maxlen, c.wait_replicas), (None, 0));
        assert_eq!(c.timeout, Duration::from_secs(10));
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("s3cret") && debug.contains("***"),
            "{debug}"
        );
    }
}
