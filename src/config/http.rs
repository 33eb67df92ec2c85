//! `[http]`: the listen address of `/metrics`, `/healthz` and `/readyz`.
//!
//! Invariant: `listen` is a socket address or `"off"` (no endpoints). The default address is
//! the command's (`walbox run` and `walbox inbox` listen on different ports).

use std::net::SocketAddr;

use serde::Deserialize;

use super::env::{Kind, Setting};
use super::error::ConfigError;

/// `[http]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp {
    /// Listen address of `/metrics`, `/healthz`, `/readyz`; `"off"` disables it.
    pub listen: Option<String>,
}

impl RawHttp {
    /// The settings of `[http]`, the same for every command.
    pub(crate) const SETTINGS: &'static [Setting] = &[(&["http"], "listen", Kind::Str)];

    /// The listen address (`default` when unset), `None` for `"off"`.
    pub(crate) fn validate(self, default: &str) -> Result<Option<SocketAddr>, ConfigError> {
        let listen = self.listen.unwrap_or_else(|| default.into());
        if listen == "off" {
            return Ok(None);
        }
        listen.parse::<SocketAddr>().map(Some).map_err(|_| {
            ConfigError::Invalid(format!(
                "http.listen {listen:?} is not an address like {default} (or \"off\")"
            ))
        })
    }
}
