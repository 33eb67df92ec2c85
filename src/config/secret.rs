//! Secrets from files: every secret key `k` of a configuration may instead be given as `k_file`
//! (in TOML, or `<PREFIX>_…_K_FILE` in the environment), naming a file whose content is the
//! value, as Kubernetes secrets and systemd credentials are mounted. Kafka properties likewise:
//! `[kafka.property_files]` maps a librdkafka property to a file (`<PREFIX>_KAFKA_PROPERTY_FILE_<NAME>`
//! in the environment, `_` standing for `.`).
//!
//! Files are read once, when the configuration is loaded, after the environment is layered over
//! the file; one trailing newline is dropped (`echo secret > file` is the common way to write
//! one). The `_file` keys are gone from the table afterwards, so the rest of the configuration
//! sees only the values.
//!
//! Invariants:
//! - A file's content never appears in an error: errors name the key and the path only.
//! - Setting both `k` and `k_file` (or a property and its file) is an error, never a silent
//!   choice; so is an unreadable or empty file, and a property file whose content librdkafka
//!   refuses (named by its `kafka.property_files` key, not as a `kafka.properties` value).
//! - [`Secret`] (a value held after validation) prints as `***` in `Debug` and `Display`.

use std::fmt;
use std::path::Path;

use super::env::EnvLayout;
use super::error::ConfigError;
use super::kafka::refused_property;

/// A secret string: redacted in `Debug` and `Display`; [`Secret::expose`] gives the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: String) -> Self {
        Secret(value)
    }

    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Reads the secret in `path` for `what` (a key, for messages): the content without one
/// trailing newline. Errors name `what` and the path, never the content.
pub fn read_secret_file(what: &str, path: &Path) -> Result<String, ConfigError> {
    let bytes = std::fs::read(path).map_err(|e| {
        ConfigError::Invalid(format!(
            "{what}: cannot read {}: {e} (the file holding the secret)",
            path.display()
        ))
    })?;
    let mut text = String::from_utf8(bytes).map_err(|_| {
        ConfigError::Invalid(format!("{what}: {} is not UTF-8 text", path.display()))
    })?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err(ConfigError::Invalid(format!(
            "{what}: {} is empty",
            path.display()
        )));
    }
    Ok(text)
}

/// `section.key` for messages.
fn dotted(path: &[&str], key: &str) -> String {
    let mut out = path.join(".");
    out.push('.');
    out.push_str(key);
    out
}

/// Replaces every `k_file` of `layout`'s secrets (and `[kafka.property_files]`) in `root` by the
/// file's content under `k` (and `[kafka.properties]`); see the [module docs](self).
pub(crate) fn resolve_files(root: &mut toml::Table, layout: &EnvLayout) -> Result<(), ConfigError> {
    for (path, key) in layout.secret_keys() {
        let Some(table) = table_at(root, path) else {
            continue;
        };
        let file_key = format!("{key}_file");
        let Some(value) = table.remove(&file_key) else {
            continue;
        };
        let what = dotted(path, &file_key);
        let file = value
            .as_str()
            .ok_or_else(|| ConfigError::Invalid(format!("{what} must be a file path (a string)")))?
            .to_owned();
        if table.contains_key(*key) {
            return Err(ConfigError::Invalid(format!(
                "set {} or {what}, not both",
                dotted(path, key)
            )));
        }
        let secret = read_secret_file(&what, Path::new(&file))?;
        table.insert((*key).to_owned(), toml::Value::String(secret));
    }
    let Some(kafka) = table_at(root, &["kafka"]) else {
        return Ok(());
    };
    let Some(files) = kafka.remove("property_files") else {
        return Ok(());
    };
    let files = match files {
        toml::Value::Table(t) => t,
        _ => {
            return Err(ConfigError::Invalid(
                "kafka.property_files must be a table of property = \"file\"".into(),
            ))
        }
    };
    let properties = kafka
        .entry("properties")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .ok_or_else(|| ConfigError::Invalid("kafka.properties must be a table".into()))?;
    for (name, file) in files {
        let what = format!("kafka.property_files.{name}");
        let file = file.as_str().ok_or_else(|| {
            ConfigError::Invalid(format!("{what} must be a file path (a string)"))
        })?;
        if properties.contains_key(&name) {
            return Err(ConfigError::Invalid(format!(
                "set kafka.properties.{name} or {what}, not both"
            )));
        }
        let secret = read_secret_file(&what, Path::new(file))?;
        // Checked here, where it is known to come from a file: the error names the file's key.
        if let Some(why) = refused_property(&name, &secret, true) {
            let var = layout.property_file_var(&name);
            return Err(ConfigError::Invalid(format!(
                "{what} (or {var}): the content of {file} {why}"
            )));
        }
        properties.insert(name, toml::Value::String(secret));
    }
    Ok(())
}

fn table_at<'a>(root: &'a mut toml::Table, path: &[&str]) -> Option<&'a mut toml::Table> {
    let mut t = root;
    for p in path {
        t = t.get_mut(*p)?.as_table_mut()?;
    }
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYOUT: EnvLayout = EnvLayout {
        prefix: "WALBOX",
        scalars: &[],
        secrets: &[&[(&["postgres"], "password"), (&["alerts"], "token")]],
        accepted: &[],
        others: &[],
        foreign: &[],
    };

    fn file(dir: &tempfile::TempDir, name: &str, content: &[u8]) -> String {
        let p = dir.path().join(name);
        std::fs::write(&p, content).unwrap();
        p.display().to_string()
    }

    #[test]
    fn a_file_key_becomes_the_value_without_its_newline() {
        let dir = tempfile::tempdir().unwrap();
        let pw = file(&dir, "pw", b"s3cr3t\n");
        let sasl = file(&dir, "sasl", b"k4fk4\r\n");
        let mut t: toml::Table = format!(
            "[postgres]\npassword_file = {pw:?}\n[kafka.property_files]\n\"sasl.password\" = {sasl:?}\n"
        )
        .parse()
        .unwrap();
        resolve_files(&mut t, &LAYOUT).unwrap();
        assert_eq!(t["postgres"]["password"].as_str(), Some("s3cr3t"));
        assert!(t["postgres"].get("password_file").is_none());
        assert_eq!(
            t["kafka"]["properties"]["sasl.password"].as_str(),
            Some("k4fk4")
        );
        assert!(t["kafka"].get("property_files").is_none());
    }

    #[test]
    fn both_forms_missing_and_empty_files_are_errors_without_the_content() {
        let dir = tempfile::tempdir().unwrap();
        let pw = file(&dir, "pw", b"s3cr3t");
        let empty = file(&dir, "empty", b"\n");
        let cases = [
            (
                format!("[postgres]\npassword = \"x\"\npassword_file = {pw:?}\n"),
                "set postgres.password or postgres.password_file, not both".to_owned(),
            ),
            (
                "[postgres]\npassword_file = \"/nonexistent/pw\"\n".to_owned(),
                "postgres.password_file: cannot read /nonexistent/pw".to_owned(),
            ),
            (
                format!("[alerts]\ntoken_file = {empty:?}\n"),
                format!("alerts.token_file: {empty} is empty"),
            ),
            (
                format!("[kafka.properties]\n\"sasl.password\" = \"x\"\n[kafka.property_files]\n\"sasl.password\" = {pw:?}\n"),
                "set kafka.properties.sasl.password or kafka.property_files.sasl.password, not both".to_owned(),
            ),
        ];
        for (toml, needle) in cases {
            let mut t: toml::Table = toml.parse().unwrap();
            let e = resolve_files(&mut t, &LAYOUT).unwrap_err().to_string();
            assert!(e.contains(&needle), "{e:?} lacks {needle:?}");
            assert!(!e.contains("s3cr3t"), "{e}");
        }
    }

    #[test]
    fn a_secret_prints_redacted() {
        let s = Secret::new("hunter2".into());
        assert_eq!(format!("{s} {s:?}"), "*** ***");
        assert_eq!(s.expose(), "hunter2");
    }
}
