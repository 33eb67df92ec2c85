//! Several hosts in one connection string, and which of them walbox may use
//! (`target_session_attrs`), as libpq has them.
//!
//! `host=a,b port=5432,5433 target_session_attrs=read-write`, or the URL form
//! `postgresql://u@a:5432,b:5433/db?target_session_attrs=read-write`. The port list holds one
//! port for every host, or a single port for all of them; an empty entry is the default port.
//! `ConnInfo::candidates` lists one single-host `ConnInfo` per host, in the order written;
//! `crate::pg::hosts` tries them in that order and keeps the first one whose session matches
//! [`SessionAttrs`] (`prefer-standby`: a standby first, else any).
//!
//! Invariants:
//! - A connection string with one host and `target_session_attrs=any` (the default) connects
//!   exactly as before: no extra query, no extra connection.
//! - Every candidate shares every setting but host and port (user, password, TLS, timeouts).

use std::fmt;
use std::str::FromStr;

/// Which sessions a connection may end on (libpq's `target_session_attrs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SessionAttrs {
    /// Any server.
    #[default]
    Any,
    /// A server that accepts writes (`transaction_read_only` off): the primary, normally.
    ReadWrite,
    /// A server in read-only mode (a standby, or `default_transaction_read_only`).
    ReadOnly,
    /// A server not in recovery.
    Primary,
    /// A server in recovery.
    Standby,
    /// A server in recovery if one answers, else any.
    PreferStandby,
}

impl SessionAttrs {
    /// The libpq spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionAttrs::Any => "any",
            SessionAttrs::ReadWrite => "read-write",
            SessionAttrs::ReadOnly => "read-only",
            SessionAttrs::Primary => "primary",
            SessionAttrs::Standby => "standby",
            SessionAttrs::PreferStandby => "prefer-standby",
        }
    }

    /// Whether a server in this state will do; `None` when any server will (no query needed).
    /// `prefer-standby` accepts only a standby here: the caller's second pass takes any.
    pub fn accepts(self, in_recovery: bool, read_only: bool) -> Option<bool> {
        match self {
            SessionAttrs::Any => None,
            SessionAttrs::ReadWrite => Some(!read_only),
            SessionAttrs::ReadOnly => Some(read_only),
            SessionAttrs::Primary => Some(!in_recovery),
            SessionAttrs::Standby | SessionAttrs::PreferStandby => Some(in_recovery),
        }
    }

    /// What a server must be, for messages ("a server accepting writes").
    pub fn wanted(self) -> &'static str {
        match self {
            SessionAttrs::Any => "any server",
            SessionAttrs::ReadWrite => "a server accepting writes",
            SessionAttrs::ReadOnly => "a read-only server",
            SessionAttrs::Primary => "a primary",
            SessionAttrs::Standby | SessionAttrs::PreferStandby => "a standby",
        }
    }
}

impl fmt::Display for SessionAttrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SessionAttrs {
    /// What is wrong with the value, for `ConnInfoError::InvalidValue`; it never quotes the
    /// value (the caller decides whether the value may be shown).
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "any" => SessionAttrs::Any,
            "read-write" => SessionAttrs::ReadWrite,
            "read-only" => SessionAttrs::ReadOnly,
            "primary" => SessionAttrs::Primary,
            "standby" => SessionAttrs::Standby,
            "prefer-standby" => SessionAttrs::PreferStandby,
            _ => {
                return Err(
                    "not one of any, read-write, read-only, primary, standby, prefer-standby"
                        .to_owned(),
                )
            }
        })
    }
}

/// Pairs the hosts with the port list: one port each, or one for all (`None` = the default).
/// The error says what is wrong with the port list.
pub(super) fn pair_ports<H>(
    hosts: Vec<H>,
    ports: &[Option<u16>],
    default_port: u16,
) -> Result<Vec<(H, u16)>, String> {
    let port = |p: Option<u16>| p.unwrap_or(default_port);
    match ports.len() {
        0 => Ok(hosts.into_iter().map(|h| (h, default_port)).collect()),
        1 => Ok(hosts.into_iter().map(|h| (h, port(ports[0]))).collect()),
        n if n == hosts.len() => Ok(hosts
            .into_iter()
            .zip(ports.iter().copied())
            .map(|(h, p)| (h, port(p)))
            .collect()),
        n => Err(format!(
            "{n} ports for {} hosts (give one port for every host, or one for all)",
            hosts.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_each_attribute_accepts() {
        use SessionAttrs::*;
        // (in recovery, read only)
        let primary = (false, false);
        let standby = (true, true);
        let check = |a: SessionAttrs, (r, ro): (bool, bool)| a.accepts(r, ro);
        assert_eq!(check(Any, standby), None);
        assert_eq!(check(ReadWrite, primary), Some(true));
        assert_eq!(check(ReadWrite, standby), Some(false));
        assert_eq!(check(ReadOnly, standby), Some(true));
        assert_eq!(check(Primary, standby), Some(false));
        assert_eq!(check(Standby, standby), Some(true));
        assert_eq!(check(PreferStandby, primary), Some(false));
    }
}
