//! A Kafka Connect connector configuration as a team keeps it: the JSON posted to Connect's REST
//! API (`{"name": …, "config": {…}}`, or the bare config object), or a Java `.properties` file
//! (`ConnectStandalone`'s). Both become one [`ConnectorConfig`]: the connector's name and its
//! settings as strings.
//!
//! Invariants:
//! - The parsers never panic, on any input.
//! - No error quotes the input: a `.properties` line or a JSON value may hold a password, so
//!   errors give a line (and column) and what is wrong, and name keys, never values.
//! - The format is told by the content: a file whose first non-blank character is `{` is JSON,
//!   anything else `.properties`.

use std::collections::BTreeMap;

use super::error::DebeziumError;

/// A connector's settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnectorConfig {
    /// The connector's name (`name`), when the configuration gives one.
    pub name: Option<String>,
    /// Every setting, as Connect reads it: key → value text.
    pub settings: BTreeMap<String, String>,
}

/// Whether `key` holds a secret: its value is never copied into any output.
pub fn is_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("password")
        || k.contains("secret")
        || k.contains("token")
        || k.contains("credential")
        || k.ends_with("jaas.config")
        || k.ends_with(".key")
}

impl ConnectorConfig {
    /// Reads either format (see the module docs).
    pub fn parse(text: &str) -> Result<ConnectorConfig, DebeziumError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        if text.trim_start().starts_with('{') {
            from_json(text)
        } else {
            from_properties(text)
        }
    }
}

/// The REST API's JSON: `{"name": …, "config": {…}}` or the config object itself.
fn from_json(text: &str) -> Result<ConnectorConfig, DebeziumError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| DebeziumError::Json {
        line: e.line(),
        column: e.column(),
        what: match e.classify() {
            serde_json::error::Category::Eof => "it ends too early",
            serde_json::error::Category::Syntax => "a syntax error",
            _ => "not a JSON document",
        },
    })?;
    let serde_json::Value::Object(mut top) = value else {
        return Err(DebeziumError::Shape("the JSON is not an object".into()));
    };
    let (name, config) = match top.remove("config") {
        Some(serde_json::Value::Object(config)) => {
            let name = match top.remove("name") {
                None => None,
                Some(serde_json::Value::String(n)) => Some(n),
                Some(_) => {
                    return Err(DebeziumError::Shape(
                        "the JSON's \"name\" is not a string".into(),
                    ))
                }
            };
            (name, config)
        }
        Some(_) => {
            return Err(DebeziumError::Shape(
                "the JSON's \"config\" is not an object of settings".into(),
            ))
        }
        None => (None, top),
    };
    let mut settings = BTreeMap::new();
    for (key, value) in config {
        let text = match value {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            _ => {
                return Err(DebeziumError::Shape(format!(
                    "setting {key:?} is not a string, number or boolean"
                )))
            }
        };
        settings.insert(key, text);
    }
    let name = name.or_else(|| settings.get("name").cloned());
    Ok(ConnectorConfig { name, settings })
}

/// A `.properties` file, read as `java.util.Properties.load` does: `#`/`!` comments, `=`, `:`
/// or blanks between key and value, a trailing backslash continuing a line, backslash escapes
/// (`\t`, `\n`, `\r`, `\f`, `\uXXXX`, any other character as itself). A later key wins.
fn from_properties(text: &str) -> Result<ConnectorConfig, DebeziumError> {
    let mut settings = BTreeMap::new();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((index, first)) = lines.next() {
        let start = first.trim_start_matches([' ', '\t', '\u{c}']);
        if start.is_empty() || start.starts_with('#') || start.starts_with('!') {
            continue;
        }
        let mut logical = String::new();
        let mut line = start;
        loop {
            if ends_continued(line) {
                logical.push_str(&line[..line.len() - 1]);
                match lines.next() {
                    Some((_, next)) => line = next.trim_start_matches([' ', '\t', '\u{c}']),
                    None => break,
                }
            } else {
                logical.push_str(line);
                break;
            }
        }
        let (key, value) = split_entry(&logical);
        let key = unescape(key).map_err(|what| DebeziumError::Properties {
            line: index + 1,
            what,
        })?;
        let value = unescape(value).map_err(|what| DebeziumError::Properties {
            line: index + 1,
            what,
        })?;
        settings.insert(key, value);
    }
    let name = settings.get("name").cloned();
    Ok(ConnectorConfig { name, settings })
}

/// Whether a line ends in an odd number of backslashes (a continuation).
fn ends_continued(line: &str) -> bool {
    line.bytes().rev().take_while(|b| *b == b'\\').count() % 2 == 1
}

/// Splits a logical line into its key and value (both still escaped).
fn split_entry(line: &str) -> (&str, &str) {
    let mut escaped = false;
    let mut end = line.len();
    for (i, c) in line.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if matches!(c, '=' | ':' | ' ' | '\t' | '\u{c}') {
            end = i;
            break;
        }
    }
    let key = &line[..end];
    let i = end;
    let mut rest = line[i..].trim_start_matches([' ', '\t', '\u{c}']);
    if let Some(r) = rest.strip_prefix(['=', ':']) {
        rest = r.trim_start_matches([' ', '\t', '\u{c}']);
    }
    (key, rest)
}

/// Resolves the escapes of a key or value.
fn unescape(s: &str) -> Result<String, &'static str> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            None => {}
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\u{c}'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                let unit = (hex.len() == 4)
                    .then(|| u32::from_str_radix(&hex, 16).ok())
                    .flatten()
                    .ok_or("a \\u escape without four hexadecimal digits")?;
                // A surrogate pair is two escapes; a lone surrogate becomes U+FFFD.
                if (0xD800..0xDC00).contains(&unit) {
                    let rest = chars.as_str();
                    let low = rest
                        .strip_prefix("\\u")
                        .and_then(|r| r.get(..4))
                        .and_then(|h| u32::from_str_radix(h, 16).ok())
                        .filter(|l| (0xDC00..0xE000).contains(l));
                    if let Some(low) = low {
                        chars.nth(5);
                        let code = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                        out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
                        continue;
                    }
                }
                out.push(char::from_u32(unit).unwrap_or('\u{fffd}'));
            }
            Some(other) => out.push(other),
        }
    }
    Ok(out)
}
