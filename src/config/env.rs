//! The environment layer: which `WALBOX_*` variables set which keys (`EnvLayout`, and
//! `walbox run`'s `LAYOUT`), and writing them over the file's TOML table (`apply_env`).
//!
//! Invariants: `<PREFIX>_<PATH>_<KEY>` sets `[path] key`, converted to the key's kind (string,
//! boolean, integer, number or comma-separated list); `<PREFIX>_KAFKA_PROPERTY_<NAME>` sets
//! `[kafka.properties]`, `_` standing for `.`. Every other variable in the prefix's namespace is
//! an error naming it, with the closest known name when one is close, unless the layout accepts
//! it or leaves it to others. The value of an unknown variable is never shown; only a value of
//! the wrong type for a boolean or numeric setting is quoted. `WALBOX_LOG` is checked like
//! `log.level` whichever command runs. `walbox inbox` declares its own layout.

use super::error::ConfigError;
use super::log::{check_log_filter, LOG_ENV};

/// The process environment as text, for the layers. A `WALBOX_*` variable whose name or
/// value is not UTF-8 is an error naming it (its value is never shown: it may be a secret);
/// other variables are not walbox's and are skipped as they are, whatever their bytes.
pub(crate) fn process_env() -> Result<Vec<(String, String)>, ConfigError> {
    os_env(std::env::vars_os())
}

fn os_env(
    vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut out = Vec::new();
    for (name, value) in vars {
        let ours = name.as_encoded_bytes().starts_with(b"WALBOX_");
        match (name.into_string(), value.into_string()) {
            (Ok(name), Ok(value)) => out.push((name, value)),
            (Ok(name), Err(_)) if ours => {
                return Err(ConfigError::Invalid(format!(
                    "environment variable {name} is not valid UTF-8: set it to text"
                )))
            }
            (Err(name), _) if ours => {
                return Err(ConfigError::Invalid(format!(
                    "the name of environment variable {} is not valid UTF-8: rename or unset it",
                    name.to_string_lossy()
                )))
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Kinds of values settable from the environment.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    /// A string.
    Str,
    /// `true`/`false` (also 1/0, yes/no, on/off).
    Bool,
    /// An integer.
    Int,
    /// A number.
    Float,
    /// A comma-separated list of strings.
    List,
}

/// Which environment variables override which keys of one configuration file.
pub(crate) struct EnvLayout {
    /// Variable prefix, e.g. `WALBOX`: `WALBOX_<PATH>_<KEY>` sets `[path] key`, and
    /// `WALBOX_KAFKA_PROPERTY_<NAME>` sets `[kafka.properties] name` (`_` standing for `.`).
    pub prefix: &'static str,
    /// `(section path, key, kind)` of every settable key.
    pub scalars: &'static [(&'static [&'static str], &'static str, Kind)],
    /// `(section path, key)` of the secret keys: each may come from a file named by `key_file`
    /// (`<PREFIX>_<PATH>_<KEY>_FILE`), see `config::secret`.
    pub secrets: &'static [(&'static [&'static str], &'static str)],
    /// Variables with the prefix that this command reads but that set nothing here.
    pub accepted: &'static [&'static str],
    /// Prefixes within `<prefix>_` that belong to others (another command, the test and
    /// benchmark harnesses). Every other `<prefix>_*` variable must be a setting: an unknown
    /// one is an error, like an unknown key in the file.
    pub foreign: &'static [&'static str],
}

/// The environment layout of `walbox run`'s configuration.
pub(super) const LAYOUT: EnvLayout = EnvLayout {
    prefix: "WALBOX",
    scalars: SCALARS,
    secrets: SECRETS,
    // The config file (clap reads it) and the log filter override (main reads it).
    accepted: &["WALBOX_CONFIG", LOG_ENV],
    // `walbox inbox`'s, the variables of the tests and benchmarks, and where the sandbox and
    // scripts/install-deps.sh keep other PostgreSQL majors (which ones), and where
    // scripts/install-debezium.sh keeps Debezium (which version).
    foreign: &[
        "WALBOX_DEBEZIUM_",
        "WALBOX_INBOX_",
        "WALBOX_TEST_",
        "WALBOX_BENCH_",
        "WALBOX_PG_CACHE",
        "WALBOX_PG_MAJORS",
    ],
};

impl EnvLayout {
    /// `<prefix>_<PATH>_<KEY>` of a setting.
    fn var(&self, path: &[&str], key: &str) -> String {
        let mut name = String::from(self.prefix);
        for p in path {
            name.push('_');
            name.push_str(&p.to_ascii_uppercase());
        }
        name.push('_');
        name.push_str(&key.to_ascii_uppercase());
        name
    }

    /// Whether `var` is in this command's namespace and yet not a variable it knows.
    fn is_unknown(&self, var: &str) -> bool {
        var.strip_prefix(self.prefix)
            .is_some_and(|rest| rest.starts_with('_'))
            && !self.accepted.contains(&var)
            && !self.foreign.iter().any(|p| var.starts_with(p))
    }

    /// " (did you mean X?)" for the known variable closest to `var`, if close.
    fn suggestion(&self, var: &str) -> String {
        self.scalars
            .iter()
            .map(|(path, key, _)| self.var(path, key))
            .chain(self.accepted.iter().map(|v| (*v).to_owned()))
            .map(|known| (edit_distance(var, &known), known))
            .filter(|(d, _)| *d <= 2)
            .min()
            .map(|(_, known)| format!(" (did you mean {known}?)"))
            .unwrap_or_default()
    }
}

/// Levenshtein distance between two ASCII-ish names.
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// The secret keys of `walbox run`: each may also be given as `<key>_file`.
const SECRETS: &[(&[&str], &str)] = &[
    (&["postgres"], "url"),
    (&["postgres"], "password"),
    (&["postgres"], "primary_url"),
    (&["alerts"], "webhook_url"),
    (&["alerts"], "webhook_token"),
];

/// `(section path, key, kind)` of every scalar setting; `WALBOX_<PATH>_<KEY>` sets it.
const SCALARS: &[(&[&str], &str, Kind)] = &[
    (&["postgres"], "url", Kind::Str),
    (&["postgres"], "primary_url", Kind::Str),
    (&["postgres"], "password", Kind::Str),
    (&["postgres"], "slot", Kind::Str),
    (&["postgres"], "publication", Kind::Str),
    (&["postgres"], "create_slot", Kind::Bool),
    (&["postgres"], "create_publication", Kind::Bool),
    (&["postgres"], "status_interval", Kind::Str),
    (&["postgres"], "on_slot_busy", Kind::Str),
    (&["postgres"], "receive_timeout", Kind::Str),
    (&["postgres"], "failover_slot", Kind::Bool),
    (&["postgres"], "shards", Kind::Int),
    (&["outbox"], "table", Kind::Str),
    (&["outbox"], "topic_prefix", Kind::Str),
    (&["outbox"], "topic", Kind::Str),
    (&["outbox"], "fallback_topic", Kind::Str),
    (&["outbox"], "format", Kind::Str),
    (&["outbox"], "expand_json_payload", Kind::Bool),
    (&["outbox"], "cloudevents", Kind::Bool),
    (&["outbox"], "cloudevents_source", Kind::Str),
    (&["outbox"], "tombstones", Kind::Bool),
    (&["outbox"], "on_invalid", Kind::Str),
    (&["outbox"], "dead_letter_topic", Kind::Str),
    (&["outbox"], "on_change", Kind::Str),
    (&["outbox"], "compat", Kind::Str),
    (&["outbox", "retention"], "enabled", Kind::Bool),
    (&["outbox", "retention"], "keep", Kind::Str),
    (&["outbox", "retention"], "interval", Kind::Str),
    (&["outbox", "retention"], "batch_size", Kind::Int),
    (&["outbox", "retention"], "column", Kind::Str),
    (&["outbox", "retention"], "partition_interval", Kind::Str),
    (&["outbox", "retention"], "premake", Kind::Int),
    (&["outbox", "columns"], "id", Kind::Str),
    (&["outbox", "columns"], "aggregate_id", Kind::Str),
    (&["outbox", "columns"], "aggregate_type", Kind::Str),
    (&["outbox", "columns"], "event_type", Kind::Str),
    (&["outbox", "columns"], "topic", Kind::Str),
    (&["outbox", "columns"], "payload", Kind::Str),
    (&["outbox", "columns"], "timestamp", Kind::Str),
    (&["outbox", "columns"], "partition", Kind::Str),
    (&["kafka"], "brokers", Kind::Str),
    (&["kafka"], "create_topics", Kind::Bool),
    (&["kafka"], "topic_partitions", Kind::Int),
    (&["kafka"], "topic_replication_factor", Kind::Int),
    (&["kafka"], "progress_topic", Kind::Str),
    (&["kafka"], "exactly_once", Kind::Bool),
    (&["kafka"], "transaction_max_events", Kind::Int),
    (&["kafka"], "transaction_interval", Kind::Str),
    (&["kafka"], "transaction_max_bytes", Kind::Str),
    (&["relay"], "max_in_flight", Kind::Int),
    (&["relay"], "shutdown_timeout", Kind::Str),
    (&["relay"], "backoff_initial", Kind::Str),
    (&["relay"], "backoff_max", Kind::Str),
    (&["slot"], "check_interval", Kind::Str),
    (&["slot"], "warning_ratio", Kind::Float),
    (&["slot"], "critical_ratio", Kind::Float),
    (&["slot"], "warning_bytes", Kind::Str),
    (&["slot"], "catchup_threshold", Kind::Str),
    (&["slot"], "critical_bytes", Kind::Str),
    (&["slot"], "heartbeat_interval", Kind::Str),
    (&["alerts"], "webhook_url", Kind::Str),
    (&["alerts"], "webhook_token", Kind::Str),
    (&["alerts"], "webhook_attempts", Kind::Int),
    (&["alerts"], "webhook_timeout", Kind::Str),
    (&["http"], "listen", Kind::Str),
    (&["log"], "format", Kind::Str),
    (&["log"], "level", Kind::Str),
];

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

/// Writes the variables of `env` that `layout` names over `root`.
pub(super) fn apply_env(
    root: &mut toml::Table,
    env: &mut dyn Iterator<Item = (String, String)>,
    layout: &EnvLayout,
) -> Result<(), ConfigError> {
    let property_prefix = format!("{}_KAFKA_PROPERTY_", layout.prefix);
    let property_file_prefix = format!("{}_KAFKA_PROPERTY_FILE_", layout.prefix);
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
            .secrets
            .iter()
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
            .scalars
            .iter()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_walbox_variables_must_be_text() {
        use std::ffi::OsString;
        use std::os::unix::ffi::OsStringExt;
        let bad = || OsString::from_vec(vec![b's', 0xff]);
        let vars = vec![
            (OsString::from("WALBOX_POSTGRES_SLOT"), OsString::from("s")),
            (OsString::from("OTHER"), bad()),
            (
                OsString::from_vec(b"OTHER_\xff".to_vec()),
                OsString::from("v"),
            ),
        ];
        assert_eq!(
            os_env(vars.clone().into_iter()).unwrap(),
            [("WALBOX_POSTGRES_SLOT".to_owned(), "s".to_owned())]
        );
        let mut with_value = vars.clone();
        with_value.push(("WALBOX_POSTGRES_URL".into(), bad()));
        let e = os_env(with_value.into_iter()).unwrap_err().to_string();
        assert!(e.contains("WALBOX_POSTGRES_URL is not valid UTF-8"), "{e}");
        assert!(!e.contains('\u{fffd}'), "the value is not shown: {e}");
        let mut with_name = vars;
        with_name.push((OsString::from_vec(b"WALBOX_\xff".to_vec()), "v".into()));
        let e = os_env(with_name.into_iter()).unwrap_err().to_string();
        assert!(e.contains("name of environment variable WALBOX_"), "{e}");
    }

    #[test]
    fn edit_distances() {
        assert_eq!(
            edit_distance("WALBOX_POSTGRES_SLOTT", "WALBOX_POSTGRES_SLOT"),
            1
        );
        assert_eq!(edit_distance("abc", "abc"), 0);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "ab"), 2);
    }
}
