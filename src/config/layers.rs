//! The two layers of a configuration: an optional TOML file, and the environment written over
//! it (the environment wins); then the resulting table deserialized into a `Raw*` structure.
//!
//! Shared by `walbox run` (`load`, in `document.rs`) and `walbox inbox`, each with its own
//! `EnvLayout`. Invariants: a TOML syntax error gives the line, the column and what is wrong,
//! never the source line, which may hold a password (toml's `Display` quotes it); every error is
//! one line, and those about the file's content name the file.

use std::path::Path;

use super::env::{apply_env, EnvLayout};
use super::error::{one_line, ConfigError};
use super::secret::resolve_files;

/// Reads an optional TOML file and writes the environment over it (the environment wins), then
/// reads the secrets given as files (`config::secret`).
/// Returns the table and " in <file>" (or "") for error messages.
pub(crate) fn read_layers(
    path: Option<&Path>,
    env: &mut dyn Iterator<Item = (String, String)>,
    layout: &EnvLayout,
) -> Result<(toml::Table, String), ConfigError> {
    let (mut table, origin) = match path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.to_owned(),
                source,
            })?;
            let origin = format!(" in {}", p.display());
            let table = text
                .parse::<toml::Table>()
                .map_err(|e| ConfigError::Parse {
                    origin: origin.clone(),
                    message: syntax_error(&text, &e),
                })?;
            (table, origin)
        }
        None => (toml::Table::new(), String::new()),
    };
    apply_env(&mut table, env, layout)?;
    resolve_files(&mut table, layout.secrets, layout.prefix)?;
    Ok((table, origin))
}

/// A TOML syntax error as "line L, column C: what is wrong". toml's `Display` quotes the whole
/// source line, which may hold a password: only its message is used.
fn syntax_error(text: &str, e: &toml::de::Error) -> String {
    let what = one_line(e.message());
    let Some(span) = e.span() else {
        return format!("TOML syntax error: {what}");
    };
    let before = &text.as_bytes()[..span.start.min(text.len())];
    let line_start = before
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |i| i + 1);
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    format!("TOML syntax error at line {line}, column {column}: {what}")
}

/// Deserializes a layered table, naming the file in errors.
pub(crate) fn deserialize<T: serde::de::DeserializeOwned>(
    table: toml::Table,
    origin: String,
) -> Result<T, ConfigError> {
    T::deserialize(table).map_err(|e| ConfigError::Parse {
        origin,
        message: one_line(&e.to_string()),
    })
}
