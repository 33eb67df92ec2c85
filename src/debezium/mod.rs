//! `walbox from-debezium CONFIG`: a Debezium PostgreSQL connector's configuration (the JSON
//! posted to Kafka Connect's REST API, or a `.properties` file) as the walbox.toml that relays
//! the same outbox into the same records: `compat = "debezium"`, on Debezium's own slot and
//! publication, so that walbox resumes where the connector confirmed (docs/migrating.md).
//!
//! ```text
//! file ──connector.rs──▶ ConnectorConfig ──mapping.rs (router.rs)──▶ document + findings
//!      ──check──▶ loads as a walbox configuration ──▶ stdout (TOML), stderr (findings)
//! ```
//!
//! Invariants:
//! - Every setting walbox cannot honour is printed on stderr with its reason, and the command
//!   then exits 3 (configuration) without printing a configuration, unless `--allow-partial`.
//! - No secret of the input appears in any output, stdout or stderr: `database.password` and a
//!   SASL password become `*_file` references (`config::secret`), other secrets are refused by
//!   name, and no message quotes the input.
//! - What is printed loads: before it is printed, the document goes through walbox's own
//!   configuration validation, with stand-ins only for what is read from files or the
//!   environment at start (the secrets, the brokers when the connector does not name them).

mod connector;
mod error;
mod mapping;
mod router;
mod settings;

use std::path::Path;

use serde::Deserialize;
use toml::{Table, Value};

pub use connector::{is_secret, ConnectorConfig};
pub use error::DebeziumError;
pub use mapping::{translate, Translation, KAFKA_PASSWORD_FILE, PASSWORD_FILE, POSTGRES_CONNECTOR};
pub use settings::Finding;

use crate::config::{ConfigError, RawConfig};
use crate::failure::{Failure, FatalError};

/// A translated configuration, ready to print.
#[derive(Debug)]
pub struct Rendered {
    /// walbox.toml.
    pub toml: String,
    /// Settings walbox cannot honour (left out of `toml`).
    pub unhonoured: Vec<Finding>,
    /// What the operator must do for honoured settings.
    pub notes: Vec<Finding>,
}

/// Translates the text of a connector configuration and checks that the result loads.
pub fn render(text: &str) -> Result<Rendered, DebeziumError> {
    let connector = ConnectorConfig::parse(text)?;
    let t = translate(&connector)?;
    check(&t.document).map_err(DebeziumError::Output)?;
    // Section by section in this order (a TOML table prints its keys sorted).
    let mut body = String::new();
    const SECTIONS: [&str; 4] = ["postgres", "outbox", "kafka", "slot"];
    debug_assert!(t.document.keys().all(|k| SECTIONS.contains(&k.as_str())));
    for section in SECTIONS {
        let Some(value) = t.document.get(section) else {
            continue;
        };
        let mut one = Table::new();
        one.insert(section.to_owned(), value.clone());
        if !body.is_empty() {
            body.push('\n');
        }
        body.push_str(&toml::to_string(&one).map_err(|e| DebeziumError::Shape(e.to_string()))?);
    }
    let name = t
        .name
        .as_deref()
        .map(|n| format!(" {:?}", n.replace(|c: char| c.is_control(), " ")))
        .unwrap_or_default();
    let mut toml = format!(
        "# walbox.toml for the Debezium connector{name}, made by `walbox from-debezium`.\n\
         # It reads Debezium's slot and publication: stop the connector before starting walbox\n\
         # (docs/migrating.md).\n"
    );
    if !t.unhonoured.is_empty() {
        let keys: Vec<&str> = t.unhonoured.iter().map(|f| f.key.as_str()).collect();
        toml.push_str(&format!("# Not honoured: {}.\n", keys.join(", ")));
    }
    toml.push('\n');
    toml.push_str(&body);
    Ok(Rendered {
        toml,
        unhonoured: t.unhonoured,
        notes: t.notes,
    })
}

/// Validates `document` as `walbox run` would load it, with stand-ins for the secrets it names
/// as files and for brokers it leaves to the environment.
fn check(document: &Table) -> Result<(), ConfigError> {
    const STAND_IN: &str = "stand-in";
    let mut t = document.clone();
    if let Some(pg) = t.get_mut("postgres").and_then(Value::as_table_mut) {
        if pg.remove("password_file").is_some() {
            pg.insert("password".into(), Value::String(STAND_IN.into()));
        }
    }
    let kafka = t
        .entry("kafka")
        .or_insert_with(|| Value::Table(Table::new()))
        .as_table_mut()
        .expect("a table");
    kafka
        .entry("brokers")
        .or_insert_with(|| Value::String("localhost:9092".into()));
    if let Some(Value::Table(files)) = kafka.remove("property_files") {
        let properties = kafka
            .entry("properties")
            .or_insert_with(|| Value::Table(Table::new()))
            .as_table_mut()
            .expect("a table");
        for (name, _) in files {
            properties.insert(name, Value::String(STAND_IN.into()));
        }
    }
    crate::config::outbox::normalize(&mut t)?;
    RawConfig::deserialize(t)
        .map_err(|e| ConfigError::Parse {
            origin: String::new(),
            message: e.to_string().replace('\n', " "),
        })?
        .validate()
        .map(|_| ())
}

/// `walbox from-debezium`: prints the configuration on stdout and the findings on stderr; see
/// the module docs.
pub fn from_debezium(path: &Path, allow_partial: bool) -> Result<(), FatalError> {
    let text = std::fs::read_to_string(path).map_err(|source| {
        FatalError::of(&DebeziumError::Read {
            path: path.to_owned(),
            source,
        })
    })?;
    let rendered = render(&text).map_err(|e| FatalError::of(&e))?;
    for n in &rendered.notes {
        eprintln!("walbox: note: {}: {}", n.key, n.reason);
    }
    for u in &rendered.unhonoured {
        eprintln!("walbox: cannot honour {}: {}", u.key, u.reason);
    }
    if !rendered.unhonoured.is_empty() && !allow_partial {
        return Err(FatalError::new(
            Failure::Config,
            format!(
                "{} setting(s) of the connector cannot be honoured (listed above); change them, \
                 or pass --allow-partial to print the configuration without them",
                rendered.unhonoured.len()
            ),
        ));
    }
    print!("{}", rendered.toml);
    Ok(())
}

#[cfg(test)]
mod tests;
