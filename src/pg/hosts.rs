//! Choosing a host when `postgres.url` lists several, or asks for a kind of server
//! (`target_session_attrs`, see [`crate::config::target`]).
//!
//! Both connections choose for themselves, the same way: each host in the order written is
//! connected to, asked `pg_is_in_recovery()` and `transaction_read_only`, and kept when it is
//! what `target_session_attrs` asks for; `prefer-standby` takes any server on a second pass.
//! After a promotion the old primary is down or in recovery, so the next connection attempt
//! lands on the new primary by itself: nothing is remembered between attempts.
//!
//! Invariants:
//! - A connection string with one host and `target_session_attrs=any` never reaches this module
//!   (no extra query): [`ConnInfo::chooses_host`] is false.
//! - When no host will do, the error names every host with its reason (never the password) and
//!   is transient: the caller retries with backoff, as for a server that is down, and logs it
//!   as it logs that (so a waiting hot standby, polling every second, says it once). Only when
//!   every host failed for the same fatal reason (a wrong password everywhere) is that error
//!   returned as it is, with its exit status.

use crate::config::conninfo::ConnInfo;
use crate::config::target::SessionAttrs;
use crate::failure::Classify;

/// The state of the server a connection reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerRole {
    /// `pg_is_in_recovery()`.
    pub in_recovery: bool,
    /// `transaction_read_only`.
    pub read_only: bool,
}

/// The query that reads [`ServerRole`]; works on ordinary and `replication=database` sessions.
pub const ROLE_QUERY: &str =
    "SELECT pg_is_in_recovery()::text, current_setting('transaction_read_only')";

impl ServerRole {
    /// From [`ROLE_QUERY`]'s text columns.
    pub fn from_text(in_recovery: Option<&str>, read_only: Option<&str>) -> Option<ServerRole> {
        let in_recovery = match in_recovery? {
            "true" | "t" => true,
            "false" | "f" => false,
            _ => return None,
        };
        Some(ServerRole {
            in_recovery,
            read_only: read_only? == "on",
        })
    }

    fn describe(self) -> &'static str {
        match (self.in_recovery, self.read_only) {
            (true, _) => "a standby (in recovery)",
            (false, true) => "read-only (default_transaction_read_only)",
            (false, false) => "a primary accepting writes",
        }
    }
}

/// One host's answer while choosing.
pub enum Verdict<C, E> {
    /// Connected, and the server will do.
    Chosen(C),
    /// Connected, but the server is not what was asked for (the connection is dropped).
    Unsuitable(ServerRole),
    /// Could not connect or ask.
    Failed(E),
}

/// Why no host would do: every host with its reason, for the log and the error.
pub fn no_suitable_host(attrs: SessionAttrs, reasons: &[(String, String)]) -> String {
    let list: Vec<String> = reasons.iter().map(|(h, r)| format!("{h}: {r}")).collect();
    format!(
        "no host of postgres.url is {} (target_session_attrs={attrs}): {}",
        attrs.wanted(),
        list.join("; ")
    )
}

/// Tries `info`'s hosts in order with `try_host` (connect, read the role, keep or drop), as the
/// [module docs](self) say. `Err(Ok(e))`: every host failed with the same fatal error `e`;
/// `Err(Err(message))`: no host would do, transient.
pub async fn choose<C, E, F, Fut>(info: &ConnInfo, mut try_host: F) -> Result<C, Result<E, String>>
where
    E: Classify + std::fmt::Display,
    F: FnMut(ConnInfo, SessionAttrs, bool) -> Fut,
    Fut: std::future::Future<Output = Verdict<C, E>>,
{
    let attrs = info.target_session_attrs;
    let passes: &[bool] = if attrs == SessionAttrs::PreferStandby {
        &[false, true]
    } else {
        &[false]
    };
    let mut reasons = Vec::new();
    let mut fatal: Option<E> = None;
    let mut all_fatal = true;
    for &any in passes {
        for candidate in info.candidates() {
            let label = candidate.host_label();
            match try_host(candidate, attrs, any).await {
                Verdict::Chosen(c) => return Ok(c),
                Verdict::Unsuitable(role) => {
                    all_fatal = false;
                    reasons.push((label, format!("is {}", role.describe())));
                }
                Verdict::Failed(e) => {
                    match (&fatal, e.failure()) {
                        (_, None) => all_fatal = false,
                        (Some(f), Some(kind)) if f.failure() != Some(kind) => all_fatal = false,
                        _ => {}
                    }
                    reasons.push((label, e.to_string()));
                    fatal = Some(e);
                }
            }
        }
    }
    match fatal {
        Some(e) if all_fatal => Err(Ok(e)),
        _ => Err(Err(no_suitable_host(attrs, &reasons))),
    }
}

/// Whether a server in `role` will do on this pass (`any`: the second pass of prefer-standby).
pub fn suits(attrs: SessionAttrs, role: ServerRole, any: bool) -> bool {
    any || attrs.accepts(role.in_recovery, role.read_only) != Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_read_from_text() {
        assert_eq!(
            ServerRole::from_text(Some("true"), Some("on")),
            Some(ServerRole {
                in_recovery: true,
                read_only: true
            })
        );
        assert_eq!(
            ServerRole::from_text(Some("f"), Some("off")),
            Some(ServerRole {
                in_recovery: false,
                read_only: false
            })
        );
        assert_eq!(ServerRole::from_text(Some("maybe"), Some("off")), None);
        assert_eq!(ServerRole::from_text(None, Some("off")), None);
    }

    #[test]
    fn prefer_standby_takes_any_on_the_second_pass() {
        let primary = ServerRole {
            in_recovery: false,
            read_only: false,
        };
        assert!(!suits(SessionAttrs::PreferStandby, primary, false));
        assert!(suits(SessionAttrs::PreferStandby, primary, true));
        assert!(suits(SessionAttrs::ReadWrite, primary, false));
        assert!(suits(SessionAttrs::Any, primary, false));
    }

    #[test]
    fn the_message_names_every_host_and_what_was_wanted() {
        let m = no_suitable_host(
            SessionAttrs::ReadWrite,
            &[
                ("a:5432".into(), "is a standby (in recovery)".into()),
                ("b:5432".into(), "timed out connecting to PostgreSQL".into()),
            ],
        );
        assert_eq!(
            m,
            "no host of postgres.url is a server accepting writes (target_session_attrs=read-write): \
             a:5432: is a standby (in recovery); b:5432: timed out connecting to PostgreSQL"
        );
    }
}
