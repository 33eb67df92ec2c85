//! `walbox check`: a preflight that asks PostgreSQL and the brokers everything `walbox run`
//! will need, and prints one line per check, each warning and failure with its fix.
//!
//! The checks are read-only: nothing is created, altered or produced (a producer id is asked
//! for, which every idempotent producer does when it starts). Where `walbox run` would create
//! something (`postgres.create_publication`, `postgres.create_slot`, `kafka.create_topics`), the
//! check says so and checks what the creation needs.
//!
//! # Invariants
//! - A check that cannot run because another failed is listed as `skipped`, naming the one
//!   that failed, so a failure is never hidden behind another. (A catalog query failing
//!   unexpectedly ends the PostgreSQL checks with a failed line of its own.)
//! - Not reaching a server (wrong password, host down) is a failed check, not an error of the
//!   command; nothing printed carries a password (connection strings are shown redacted).
//! - The verdicts reuse the relay's own start-up code (`source::catalog`, `source::slot`,
//!   `outbox::OutboxMapper::known_topics`, `config::KafkaRole::Producer`), so `walbox check`
//!   and `walbox run` cannot disagree about what is required.
//! - The exit status is 0 when no check failed (warnings allowed), else
//!   [`crate::failure::Failure::Preflight`] (`walbox check`, in `cmd/check.rs`).

use std::fmt::Write as _;

use crate::config::{BrokerConfig, Config};

pub mod kafka;
pub mod nats;
pub mod postgres;
pub mod rabbitmq;
pub mod redis;
pub mod tables;

/// A check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Nothing to do.
    Ok,
    /// `walbox run` works, but the setting is risky.
    Warn,
    /// `walbox run` would stop (or never start) on this.
    Fail,
    /// Not checked because a check it depends on failed.
    Skipped,
}

impl Status {
    /// The label in the text report: the JSON's status (`skipped` in both), failures and
    /// warnings in capitals to stand out.
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
            Status::Skipped => "skipped",
        }
    }
}

/// One check: what was checked, its outcome, what was found, and (for a warning or a failure)
/// the exact SQL or setting that fixes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Check {
    /// What is checked, e.g. `wal_level` or `topic orders`.
    pub name: String,
    /// The outcome.
    pub status: Status,
    /// What was found, on one line.
    pub detail: String,
    /// The fix, for a warning or a failure.
    pub fix: Option<String>,
}

impl Check {
    /// A passed check.
    pub fn ok(name: impl Into<String>, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    /// A warning with its fix.
    pub fn warn(
        name: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check {
            name: name.into(),
            status: Status::Warn,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    /// A failure with its fix.
    pub fn fail(
        name: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check {
            name: name.into(),
            status: Status::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    /// A check not run because `because` failed.
    pub fn skipped(name: impl Into<String>, because: &str) -> Check {
        Check {
            name: name.into(),
            status: Status::Skipped,
            detail: format!("not checked: {because} failed"),
            fix: None,
        }
    }
}

/// Every check, in the order they ran.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// The checks.
    pub checks: Vec<Check>,
}

impl Report {
    /// Checks with this status.
    pub fn count(&self, status: Status) -> usize {
        self.checks.iter().filter(|c| c.status == status).count()
    }

    /// Whether no check failed.
    pub fn passed(&self) -> bool {
        self.count(Status::Fail) == 0
    }

    /// The report for people: one line per check, then a summary line.
    pub fn text(&self) -> String {
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        let mut out = String::new();
        for c in &self.checks {
            let _ = write!(
                out,
                "{:<7}  {:<width$}  {}",
                c.status.label(),
                c.name,
                c.detail
            );
            if let Some(fix) = &c.fix {
                let _ = write!(out, "; fix: {fix}");
            }
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "{} checks: {} ok, {} warnings, {} failed, {} skipped",
            self.checks.len(),
            self.count(Status::Ok),
            self.count(Status::Warn),
            self.count(Status::Fail),
            self.count(Status::Skipped)
        );
        out
    }

    /// The report for scripts: `{"passed": bool, "checks": [{"name", "status", "detail",
    /// "fix"}]}`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "passed": self.passed(),
            "checks": self.checks,
        })
    }
}

/// Runs every check.
pub async fn run(config: &Config) -> Report {
    let mut checks = postgres::checks(config).await;
    match &config.broker {
        BrokerConfig::Kafka => checks.extend(kafka::checks(config).await),
        BrokerConfig::Redis(r) => checks.extend(redis::checks(config, r).await),
        BrokerConfig::Nats(_) => checks.extend(nats::checks(config).await),
        BrokerConfig::RabbitMq(_) => checks.extend(rabbitmq::checks(config).await),
    }
    Report { checks }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_shows_its_fix_on_its_line_and_fails_the_report() {
        let report = Report {
            checks: vec![
                Check::ok("wal_level", "logical"),
                Check::fail(
                    "role",
                    "walbox has neither REPLICATION nor superuser",
                    "ALTER ROLE walbox REPLICATION;",
                ),
                Check::skipped("slot", "role"),
            ],
        };
        assert!(!report.passed());
        let text = report.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(
            lines[0].starts_with("ok       wal_level  logical"),
            "{text}"
        );
        assert!(
            lines[1].starts_with("FAIL     role       walbox has neither")
                && lines[1].ends_with("; fix: ALTER ROLE walbox REPLICATION;"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("skipped  slot       not checked: role failed"),
            "{text}"
        );
        assert_eq!(lines[3], "3 checks: 1 ok, 0 warnings, 1 failed, 1 skipped");
        let json = report.json();
        assert_eq!(json["passed"], false);
        assert_eq!(json["checks"][1]["status"], "fail");
        assert_eq!(json["checks"][0]["fix"], serde_json::Value::Null);
        // The text and the JSON name each status alike.
        assert_eq!(json["checks"][2]["status"], "skipped");
    }

    #[test]
    fn warnings_pass() {
        let report = Report {
            checks: vec![Check::warn("max_slot_wal_keep_size", "unlimited", "set it")],
        };
        assert!(report.passed());
    }
}
