//! `walbox check [--json]`: runs the preflight ([`crate::preflight`]) and prints its report, one
//! line per check (or one JSON document); the exit status is 0 when no check failed (warnings
//! allowed), else [`Failure::Preflight`].

use crate::config::Config;
use crate::failure::{Failure, FatalError};
use crate::preflight::{run, Status};

/// What `walbox check --json` prints when the configuration cannot be loaded (no check ran):
/// the report's shape, failed, with the error (`message` never holds a secret: configuration
/// errors name keys and files, not values).
pub fn unloadable_config_json(message: &str) -> serde_json::Value {
    serde_json::json!({
        "passed": false,
        "error": message,
        "exit_status": Failure::Config.exit_code(),
        "checks": [],
    })
}

/// `walbox check [--json]`: prints the report; fails with [`Failure::Preflight`] when a check
/// failed.
pub async fn check(config: &Config, json: bool) -> Result<(), FatalError> {
    let report = run(config).await;
    if json {
        println!("{:#}", report.json());
    } else {
        print!("{}", report.text());
    }
    if report.passed() {
        Ok(())
    } else {
        Err(FatalError::new(
            Failure::Preflight,
            format!(
                "{} of {} checks failed",
                report.count(Status::Fail),
                report.checks.len()
            ),
        ))
    }
}
