//! The units of configuration values: durations ([`HumanDuration`], [`parse_duration`]) and
//! byte sizes ([`ByteSize`], [`parse_size`]).
//!
//! Invariants: a value is a plain non-negative integer (seconds, bytes) or digits followed by
//! one unit: `ms`, `s`, `m`, `h`, `d` for durations; `B`, `kB` (or `KB`), `MB`, `GB`, `TB`,
//! 1024-based like PostgreSQL, for sizes. Anything else is an error quoting the text. Long
//! durations saturate; a size that overflows `u64` is an error. A leaf: this file imports
//! nothing from the rest of `config`.

use std::time::Duration;

use serde::Deserialize;

/// Duration written as `"500ms"`, `"10s"`, `"5m"`, `"1h"`, `"14d"` or a number of seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        number_or_text(d, Duration::from_secs, parse_duration).map(HumanDuration)
    }
}

/// A value written as a plain number (`number` converts it) or as text (`parse` reads it).
fn number_or_text<'de, D: serde::Deserializer<'de>, T>(
    d: D,
    number: impl FnOnce(u64) -> T,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<T, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Number(u64),
        Text(String),
    }
    match Repr::deserialize(d)? {
        Repr::Number(n) => Ok(number(n)),
        Repr::Text(t) => parse(&t).map_err(serde::de::Error::custom),
    }
}

/// Parses `"500ms"`, `"10s"`, `"5m"`, `"1h"`, `"14d"` or plain seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid duration {text:?}: expected e.g. 500ms, 10s, 5m, 1h"))?;
    let d = match unit.trim() {
        "" | "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        "d" => Duration::from_secs(n.saturating_mul(86_400)),
        _ => {
            return Err(format!(
                "invalid duration {text:?}: expected e.g. 500ms, 10s, 5m, 1h"
            ))
        }
    };
    Ok(d)
}

/// A byte size written as `"512MB"`, `"10GB"` (PostgreSQL's 1024-based units `kB`, `MB`, `GB`,
/// `TB`) or a number of bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        number_or_text(d, |bytes| bytes, parse_size).map(ByteSize)
    }
}

/// Parses `"512MB"`, `"10GB"`, `"1TB"`, `"64kB"` (1024-based, like PostgreSQL) or plain bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let err = || format!("invalid size {text:?}: expected e.g. 512MB, 10GB");
    let n: u64 = num.parse().map_err(|_| err())?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "kB" | "KB" => 1 << 10,
        "MB" => 1 << 20,
        "GB" => 1 << 30,
        "TB" => 1 << 40,
        _ => return Err(err()),
    };
    n.checked_mul(mult).ok_or_else(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64MB"), Ok(64 << 20));
        assert_eq!(parse_size("1TB"), Ok(1 << 40));
        assert_eq!(parse_size("123"), Ok(123));
        assert!(parse_size("12 parsecs").is_err());
    }

    #[test]
    fn numbers_and_text_deserialize() {
        #[derive(Deserialize)]
        struct Values {
            secs: HumanDuration,
            text: HumanDuration,
            bytes: ByteSize,
            size: ByteSize,
        }
        let v: Values =
            toml::from_str("secs = 7\ntext = \"500ms\"\nbytes = 1024\nsize = \"2kB\"").unwrap();
        assert_eq!(v.secs, HumanDuration(Duration::from_secs(7)));
        assert_eq!(v.text, HumanDuration(Duration::from_millis(500)));
        assert_eq!(v.bytes, ByteSize(1024));
        assert_eq!(v.size, ByteSize(2048));
        let e = toml::from_str::<Values>("secs = 1\ntext = \"5 parsecs\"\nbytes = 1\nsize = \"1\"")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("invalid duration \"5 parsecs\""), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_duration("14d"), Ok(Duration::from_secs(14 * 86_400)));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }
}
