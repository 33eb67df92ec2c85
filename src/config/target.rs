//! Several hosts in one connection string, and which of them walbox may use
//! (`target_session_attrs`), as libpq has them.
//!
//! `host=a,b port=5432,5433 target_session_attrs=read-write`, or the URL form
//! `postgresql://u@a:5432,b:5433/db?target_session_attrs=read-write`. The port list holds one
//! port for every host, or a single port for all of them; an empty entry is the default port.
//! [`ConnInfo::candidates`] lists one single-host [`ConnInfo`] per host, in the order written;
//! `crate::pg::hosts` tries them in that order and keeps the first one whose session matches
//! [`SessionAttrs`] (`prefer-standby`: a standby first, else any).
//!
//! Invariants:
//! - A connection string with one host and `target_session_attrs=any` (the default) connects
//!   exactly as before: no extra query, no extra connection.
//! - Every candidate shares every setting but host and port (user, password, TLS, timeouts).

use std::fmt;
use std::str::FromStr;

use super::conninfo::{ConnInfo, ConnInfoError, Host};

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
    type Err = ConnInfoError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "any" => SessionAttrs::Any,
            "read-write" => SessionAttrs::ReadWrite,
            "read-only" => SessionAttrs::ReadOnly,
            "primary" => SessionAttrs::Primary,
            "standby" => SessionAttrs::Standby,
            "prefer-standby" => SessionAttrs::PreferStandby,
            other => {
                return Err(ConnInfoError::InvalidValue {
                    param: "target_session_attrs",
                    reason: format!(
                        "{other:?} is not one of any, read-write, read-only, primary, standby, prefer-standby"
                    ),
                })
            }
        })
    }
}

/// Pairs the hosts with the port list: one port each, or one for all (`None` = the default).
pub(super) fn pair_ports(
    hosts: Vec<Host>,
    ports: &[Option<u16>],
    default_port: u16,
) -> Result<Vec<(Host, u16)>, ConnInfoError> {
    let port = |p: Option<u16>| p.unwrap_or(default_port);
    match ports.len() {
        0 => Ok(hosts.into_iter().map(|h| (h, default_port)).collect()),
        1 => Ok(hosts.into_iter().map(|h| (h, port(ports[0]))).collect()),
        n if n == hosts.len() => Ok(hosts
            .into_iter()
            .zip(ports.iter().copied())
            .map(|(h, p)| (h, port(p)))
            .collect()),
        n => Err(ConnInfoError::InvalidValue {
            param: "port",
            reason: format!(
                "{n} ports for {} hosts (give one port for every host, or one for all)",
                hosts.len()
            ),
        }),
    }
}

impl ConnInfo {
    /// Whether connecting needs to choose among hosts or check the server's state.
    pub fn chooses_host(&self) -> bool {
        !self.more_hosts.is_empty() || self.target_session_attrs != SessionAttrs::Any
    }

    /// One single-host connection per host, in the order written.
    pub fn candidates(&self) -> Vec<ConnInfo> {
        let first = ConnInfo {
            more_hosts: Vec::new(),
            ..self.clone()
        };
        let mut out = vec![first.clone()];
        out.extend(self.more_hosts.iter().map(|(host, port)| ConnInfo {
            host: host.clone(),
            port: *port,
            ..first.clone()
        }));
        out
    }

    /// `host:port` (or the socket directory and port) of the first host, for messages.
    pub fn host_label(&self) -> String {
        match &self.host {
            Host::Tcp(h) if h.contains(':') => format!("[{h}]:{}", self.port),
            Host::Tcp(h) => format!("{h}:{}", self.port),
            Host::Unix(dir) => format!("{}:{}", dir.display(), self.port),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> ConnInfo {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn keyword_form_lists_hosts_and_ports() {
        let c = parse("host=a,b,/run/pg port=1,,3 user=u target_session_attrs=read-write");
        let hosts: Vec<String> = c.candidates().iter().map(|c| c.host_label()).collect();
        assert_eq!(hosts, ["a:1", "b:5432", "/run/pg:3"]);
        assert_eq!(c.target_session_attrs, SessionAttrs::ReadWrite);
        assert!(c.chooses_host());
        assert!(c
            .candidates()
            .iter()
            .all(|c| !c.chooses_host() || c.target_session_attrs != SessionAttrs::Any));
        assert!(c.candidates().iter().all(|c| c.more_hosts.is_empty()));

        let one_port = parse("host=a,b port=7 user=u");
        let hosts: Vec<String> = one_port
            .candidates()
            .iter()
            .map(|c| c.host_label())
            .collect();
        assert_eq!(hosts, ["a:7", "b:7"]);
    }

    #[test]
    fn url_form_lists_hosts_with_their_ports() {
        let c = parse("postgresql://u:pw@a:1,[::1]:2,c/db?target_session_attrs=primary");
        let hosts: Vec<String> = c.candidates().iter().map(|c| c.host_label()).collect();
        assert_eq!(hosts, ["a:1", "[::1]:2", "c:5432"]);
        assert_eq!(c.target_session_attrs, SessionAttrs::Primary);
        assert!(c
            .candidates()
            .iter()
            .all(|c| c.password.as_deref() == Some("pw")));
        // The redacted form lists every host and parses back to the same targets.
        let r = c.redacted();
        assert!(
            r.starts_with("postgresql://u:***@a:1,[::1]:2,c:5432/db?"),
            "{r}"
        );
        assert!(r.contains("target_session_attrs=primary"), "{r}");
        let back = parse(&r);
        assert_eq!(back.candidates().len(), 3);
        assert_eq!(back.more_hosts, c.more_hosts);
    }

    #[test]
    fn one_host_and_any_does_not_choose() {
        let c = parse("host=a user=u");
        assert!(!c.chooses_host());
        assert_eq!(c.candidates(), vec![c.clone()]);
        assert!(!c.redacted().contains("target_session_attrs"));
    }

    #[test]
    fn mismatched_ports_and_unknown_attrs_are_errors() {
        let e = "host=a,b,c port=1,2 user=u"
            .parse::<ConnInfo>()
            .unwrap_err();
        assert!(e.to_string().contains("2 ports for 3 hosts"), "{e}");
        let e = "host=a user=u target_session_attrs=rw"
            .parse::<ConnInfo>()
            .unwrap_err();
        assert!(e.to_string().contains("not one of any, read-write"), "{e}");
        let e = "host=a,,b user=u".parse::<ConnInfo>().unwrap_err();
        assert!(e.to_string().contains("an empty host"), "{e}");
    }

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
