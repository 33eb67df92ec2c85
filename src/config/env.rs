//! Which `WALBOX_*` variables set which keys (`EnvLayout`), and their names
//! (`EnvLayout::var`, `EnvLayout::property_var`: made here only); `layers.rs` writes them over
//! the file's TOML table.
//!
//! Invariants (kept by `layers.rs`): `<PREFIX>_<PATH>_<KEY>` sets `[path] key`, converted to
//! the key's kind (string, boolean, integer, number or comma-separated list);
//! `<PREFIX>_KAFKA_PROPERTY_<NAME>` sets `[kafka.properties]`, `_` standing for `.`. Every other
//! variable in the prefix's namespace is an error naming it, with the closest known name when
//! one is close, unless the layout accepts it or leaves it to others. The value of an unknown
//! variable is never shown; only a value of the wrong type for a boolean or numeric setting is
//! quoted. `WALBOX_LOG` is checked like `log.level` whichever command runs.
//!
//! Each section declares its own settings (`SETTINGS`, next to its `Raw…` type); a command's
//! layout lists its sections: `walbox run`'s in `document.rs`, `walbox inbox`'s in
//! `inbox/config.rs`, which reuses the sections and connection keys the two share. A leaf
//! beside `error.rs`: this file imports nothing else of `config`.

use super::error::ConfigError;

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
        let ours = name
            .as_encoded_bytes()
            .strip_prefix(RUN_PREFIX.as_bytes())
            .is_some_and(|rest| rest.starts_with(b"_"));
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

/// One setting `(section path, key, kind)`: `<PREFIX>_<PATH>_<KEY>` sets `[path] key`.
pub(crate) type Setting = (&'static [&'static str], &'static str, Kind);

/// A secret key `(section path, key)`: it may instead come from the file named by `key_file`
/// (`<PREFIX>_<PATH>_<KEY>_FILE`), see `config::secret`.
pub(crate) type SecretKey = (&'static [&'static str], &'static str);

/// The namespace of every walbox variable, and `walbox run`'s prefix: `WALBOX_<SECTION>_<KEY>`.
pub(crate) const RUN_PREFIX: &str = "WALBOX";

/// `walbox inbox`'s prefix: `WALBOX_INBOX_<SECTION>_<KEY>`.
pub(crate) const INBOX_PREFIX: &str = "WALBOX_INBOX";

/// Which environment variables override which keys of one configuration file.
pub(crate) struct EnvLayout {
    /// Variable prefix, e.g. `WALBOX`: `WALBOX_<PATH>_<KEY>` sets `[path] key`, and
    /// `WALBOX_KAFKA_PROPERTY_<NAME>` sets `[kafka.properties] name` (`_` standing for `.`).
    pub prefix: &'static str,
    /// The settable keys, one list per section (each section's `SETTINGS`).
    pub scalars: &'static [&'static [Setting]],
    /// The secret keys, one list per section that has any (each section's `SECRETS`).
    pub secrets: &'static [&'static [SecretKey]],
    /// Variables with the prefix that this command reads but that set nothing here.
    pub accepted: &'static [&'static str],
    /// The prefixes of the other commands' layouts: their `<prefix>_*` variables are theirs.
    pub others: &'static [&'static str],
    /// Beginnings of variable names within `<prefix>_` that belong to others (the test and
    /// benchmark harnesses, the install scripts). Every other `<prefix>_*` variable must be a
    /// setting: an unknown one is an error, like an unknown key in the file.
    pub foreign: &'static [&'static str],
}

/// Whether `var` is `<prefix>_…`.
fn in_namespace(prefix: &str, var: &str) -> bool {
    var.strip_prefix(prefix)
        .is_some_and(|rest| rest.starts_with('_'))
}

impl EnvLayout {
    /// `<prefix>_<PATH>_<KEY>` of a setting.
    pub(crate) fn var(&self, path: &[&str], key: &str) -> String {
        let mut name = String::from(self.prefix);
        for p in path {
            name.push('_');
            name.push_str(&p.to_ascii_uppercase());
        }
        name.push('_');
        name.push_str(&key.to_ascii_uppercase());
        name
    }

    /// `<prefix>_KAFKA_PROPERTY_<NAME>` of a librdkafka property (`.` written as `_`).
    pub(crate) fn property_var(&self, property: &str) -> String {
        self.var(&["kafka", "property"], &property.replace('.', "_"))
    }

    /// `<prefix>_KAFKA_PROPERTY_FILE_<NAME>`: the file holding a librdkafka property.
    pub(crate) fn property_file_var(&self, property: &str) -> String {
        self.var(&["kafka", "property", "file"], &property.replace('.', "_"))
    }

    /// Every setting of every section.
    pub(super) fn settings(&self) -> impl Iterator<Item = &Setting> {
        self.scalars.iter().flat_map(|section| section.iter())
    }

    /// Every secret key of every section.
    pub(crate) fn secret_keys(&self) -> impl Iterator<Item = &SecretKey> {
        self.secrets.iter().flat_map(|section| section.iter())
    }

    /// Whether `var` is in this command's namespace and yet not a variable it knows.
    pub(super) fn is_unknown(&self, var: &str) -> bool {
        in_namespace(self.prefix, var)
            && !self.accepted.contains(&var)
            && !self.others.iter().any(|p| in_namespace(p, var))
            && !self.foreign.iter().any(|p| var.starts_with(p))
    }

    /// " (did you mean X?)" for the known variable closest to `var`, if close.
    pub(super) fn suggestion(&self, var: &str) -> String {
        self.settings()
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
