//! Log sequence numbers.
//!
//! An [`Lsn`] is a byte position in the write-ahead log. PostgreSQL prints it as two hexadecimal
//! halves, `XXXXXXXX/YYYYYYYY` (e.g. `0/16B3748`), and that is the only textual form read or written
//! here (walbox uses it in logs, headers and its status command).
//!
//! Invariant: `Lsn` is totally ordered like the `u64` it wraps; `Lsn::ZERO` means "invalid / not
//! set" in the replication protocol (`InvalidXLogRecPtr`).

use std::fmt;
use std::str::FromStr;

/// A position in the write-ahead log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    /// `0/0`, PostgreSQL's `InvalidXLogRecPtr`.
    pub const ZERO: Lsn = Lsn(0);

    /// The raw 64-bit value.
    pub fn as_u64(self) -> u64 {
        self.0
    }

    /// Bytes of WAL from `earlier` to `self`, zero when `earlier` is ahead.
    pub fn bytes_since(self, earlier: Lsn) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl From<u64> for Lsn {
    fn from(v: u64) -> Self {
        Lsn(v)
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl serde::Serialize for Lsn {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Lsn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The text was not of the form `XXXXXXXX/YYYYYYYY`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid LSN {0:?}: expected two hexadecimal halves like 0/16B3748")]
pub struct ParseLsnError(pub String);

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseLsnError(s.to_owned());
        let (hi, lo) = s.split_once('/').ok_or_else(err)?;
        if hi.is_empty() || lo.is_empty() || hi.len() > 8 || lo.len() > 8 {
            return Err(err());
        }
        let hi = u32::from_str_radix(hi, 16).map_err(|_| err())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| err())?;
        Ok(Lsn((u64::from(hi) << 32) | u64::from(lo)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_postgres() {
        assert_eq!(Lsn(0x16B3748).to_string(), "0/16B3748");
        assert_eq!(Lsn(0x1_0000_0000).to_string(), "1/0");
        assert_eq!(Lsn::ZERO.to_string(), "0/0");
    }

    #[test]
    fn parses_what_it_prints() {
        for v in [0u64, 1, 0x16B3748, 0xFFFF_FFFF, 0x1_0000_0000, u64::MAX] {
            assert_eq!(Lsn(v).to_string().parse::<Lsn>(), Ok(Lsn(v)));
        }
    }

    #[test]
    fn rejects_garbage() {
        for s in ["", "0", "/1", "1/", "g/1", "1/2/3", "123456789/0", "-1/0"] {
            assert!(s.parse::<Lsn>().is_err(), "{s:?} parsed");
        }
    }
}
