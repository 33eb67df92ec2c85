//! The two layers of a configuration: an optional TOML file, and the environment written over
//! it (the environment wins, `apply_env`, following an `EnvLayout`); then the secrets read from
//! files, and the resulting table deserialized into a `Raw*` structure.
//!
//! Shared by `walbox run` (`load`, in `document.rs`) and `walbox inbox`, each with its own
//! `EnvLayout`. Invariants: a TOML syntax error gives the line, the column and what is wrong,
//! never the source line, which may hold a password (toml's `Display` quotes it); every error is
//! one line, and those about the file's content name the file.

use std::path::Path;

use super::env::{EnvLayout, Kind};
use super::error::{one_line, ConfigError};
use super::log::{check_log_filter, LOG_ENV};
use super::secret::resolve_files;

fn table_at<'a>(root: &'a mut toml::Table, path: &[&str]) -> Result<&'a mut toml::Table, String> {
    let mut t = root;
    for p in path {
        let entry = t
            .entry((*p).to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = entry
            .as_table_mut()
            .ok_or_else(|| format!("`{p}` must be a table"))?;
    }
    Ok(t)
}

/// Writes the variables of `env` that `layout` names over `root` (see `env.rs` for the rules).
fn apply_env(
    root: &mut toml::Table,
    env: &mut dyn Iterator<Item = (String, String)>,
    layout: &EnvLayout,
) -> Result<(), ConfigError> {
    let property_prefix = layout.property_var("");
    let property_file_prefix = layout.property_file_var("");
    for (var, value) in env {
        if var == LOG_ENV {
            // Whichever command runs, main lets it override log.level: check it the same way.
            check_log_filter(&value).map_err(|message| ConfigError::Env {
                var: var.clone(),
                message,
            })?;
            continue;
        }
        if let Some(name) = var.strip_prefix(&property_file_prefix) {
            let key = name.to_ascii_lowercase().replace('_', ".");
            let t = table_at(root, &["kafka", "property_files"]).map_err(|message| {
                ConfigError::Env {
                    var: var.clone(),
                    message,
                }
            })?;
            t.insert(key, toml::Value::String(value));
            continue;
        }
        if let Some((path, key)) = layout
            .secret_keys()
            .find(|(path, key)| layout.var(path, &format!("{key}_file")) == var)
        {
            let t = table_at(root, path).map_err(|message| ConfigError::Env {
                var: var.clone(),
                message,
            })?;
            t.insert(format!("{key}_file"), toml::Value::String(value));
            continue;
        }
        if let Some(name) = var.strip_prefix(&property_prefix) {
            let key = name.to_ascii_lowercase().replace('_', ".");
            let t =
                table_at(root, &["kafka", "properties"]).map_err(|message| ConfigError::Env {
                    var: var.clone(),
                    message,
                })?;
            t.insert(key, toml::Value::String(value));
            continue;
        }
        let Some((path, key, kind)) = layout
            .settings()
            .find(|(path, key, _)| layout.var(path, key) == var)
        else {
            if layout.is_unknown(&var) {
                return Err(ConfigError::UnknownEnv {
                    hint: layout.suggestion(&var),
                    var,
                    prefix: layout.prefix,
                });
            }
            continue;
        };
        let bad = |what: &str| ConfigError::Env {
            var: var.clone(),
            message: format!("expected {what}, got {value:?}"),
        };
        let v = match kind {
            Kind::Str => toml::Value::String(value.clone()),
            Kind::List => toml::Value::Array(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| toml::Value::String(s.to_owned()))
                    .collect(),
            ),
            Kind::Bool => match value.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => toml::Value::Boolean(true),
                "false" | "0" | "no" | "off" => toml::Value::Boolean(false),
                _ => return Err(bad("true or false")),
            },
            Kind::Float => toml::Value::Float(value.parse().map_err(|_| bad("a number"))?),
            Kind::Int => toml::Value::Integer(value.parse().map_err(|_| bad("an integer"))?),
        };
        let t = table_at(root, path).map_err(|message| ConfigError::Env { var, message })?;
        t.insert((*key).to_owned(), v);
    }
    Ok(())
}

/// Reads an optional TOML file and writes the environment over it (the environment wins), then
/// reads the secrets given as files (`config::secret`).
/// Returns the table and " in <file>" (or "") for error messages.
fn read_layers(
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
    resolve_files(&mut table, layout)?;
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
fn deserialize<T: serde::de::DeserializeOwned>(
    table: toml::Table,
    origin: String,
) -> Result<T, ConfigError> {
    T::deserialize(table).map_err(|e| ConfigError::Parse {
        origin,
        message: one_line(&e.to_string()),
    })
}

/// The layers of `path` and `env` (with `layout`), rewritten by `prepare` (`walbox run`'s
/// `[outbox]` shorthand), then deserialized into a command's `Raw…` document.
pub(crate) fn read_document<T: serde::de::DeserializeOwned>(
    path: Option<&Path>,
    env: &mut dyn Iterator<Item = (String, String)>,
    layout: &EnvLayout,
    prepare: fn(&mut toml::Table) -> Result<(), ConfigError>,
) -> Result<T, ConfigError> {
    let (mut table, origin) = read_layers(path, env, layout)?;
    prepare(&mut table)?;
    deserialize(table, origin)
}
