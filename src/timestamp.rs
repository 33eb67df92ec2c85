//! Time conversions: PostgreSQL's epoch (2000-01-01) and the Unix epoch, RFC 3339 text, and
//! PostgreSQL's `timestamptz` output.

use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
pub const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

/// Now, in microseconds since the Unix epoch.
pub fn unix_now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Now, in microseconds since 2000-01-01 (the unit of commit timestamps in the stream).
pub fn pg_now_micros() -> i64 {
    unix_now_micros() - PG_EPOCH_OFFSET_MICROS
}

/// PostgreSQL microseconds → Unix microseconds.
pub fn pg_micros_to_unix_micros(pg: i64) -> i64 {
    pg.saturating_add(PG_EPOCH_OFFSET_MICROS)
}

/// Unix microseconds to PostgreSQL microseconds (since 2000-01-01), the inverse of
/// [`pg_micros_to_unix_micros`].
pub fn unix_micros_to_pg_micros(unix: i64) -> i64 {
    unix.saturating_sub(PG_EPOCH_OFFSET_MICROS)
}

/// PostgreSQL microseconds → Unix milliseconds.
pub fn pg_micros_to_unix_ms(pg: i64) -> i64 {
    pg_micros_to_unix_micros(pg).div_euclid(1000)
}

/// Days since 1970-01-01 → (year, month, day) (Howard Hinnant's civil-from-days).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// (year, month, day) → days since 1970-01-01.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Unix microseconds as RFC 3339 UTC with `digits` fractional digits (0, 3 or 6).
pub fn rfc3339_micros(micros: i64, digits: u32) -> String {
    let secs = micros.div_euclid(1_000_000);
    let frac = micros.rem_euclid(1_000_000);
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    let base = format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    );
    match digits {
        0 => format!("{base}Z"),
        3 => format!("{base}.{:03}Z", frac / 1000),
        _ => format!("{base}.{frac:06}Z"),
    }
}

/// Unix milliseconds as RFC 3339 UTC with milliseconds.
pub fn rfc3339_ms(ms: i64) -> String {
    rfc3339_micros(ms.saturating_mul(1000), 3)
}

/// The current time as RFC 3339 UTC, whole seconds.
pub fn rfc3339_now() -> String {
    rfc3339_micros(unix_now_micros(), 0)
}

/// Parses PostgreSQL's ISO output of `timestamptz` (`2026-11-30 01:02:03.123456+00`,
/// `…+05:30`) or `timestamp` (taken as UTC) into Unix milliseconds.
pub fn parse_timestamptz_ms(text: &str) -> Option<i64> {
    let t = text.trim();
    let (date, rest) = t.split_once([' ', 'T'])?;
    let mut dp = date.splitn(3, '-');
    let y: i64 = dp.next()?.parse().ok()?;
    let mo: u32 = dp.next()?.parse().ok()?;
    let d: u32 = dp.next()?.parse().ok()?;
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return None;
    }
    let split = rest.find(['+', '-', 'Z']).unwrap_or(rest.len());
    let (time, zone) = rest.split_at(split);
    let (hms, frac) = match time.split_once('.') {
        Some((a, b)) => (a, b),
        None => (time, ""),
    };
    let mut tp = hms.splitn(3, ':');
    let h: i64 = tp.next()?.parse().ok()?;
    let mi: i64 = tp.next()?.parse().ok()?;
    let s: i64 = tp.next()?.parse().ok()?;
    let ms: i64 = if frac.is_empty() {
        0
    } else {
        let digits: String = frac.chars().chain("000".chars()).take(3).collect();
        digits.parse().ok()?
    };
    let offset_s: i64 = match zone {
        "" | "Z" => 0,
        z => {
            let sign = if z.starts_with('-') { -1 } else { 1 };
            let mut zp = z[1..].split(':');
            let zh: i64 = zp.next()?.parse().ok()?;
            let zm: i64 = zp.next().map(str::parse).transpose().ok()?.unwrap_or(0);
            let zs: i64 = zp.next().map(str::parse).transpose().ok()?.unwrap_or(0);
            sign * (zh * 3600 + zm * 60 + zs)
        }
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s - offset_s;
    Some(secs * 1000 + ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339() {
        assert_eq!(rfc3339_micros(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339_micros(951_782_400_000_000, 0),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(
            rfc3339_micros(1_796_000_523_123_456, 6),
            "2026-11-30T01:02:03.123456Z"
        );
        assert_eq!(rfc3339_ms(1_796_000_523_123), "2026-11-30T01:02:03.123Z");
    }

    #[test]
    fn parses_postgres_timestamps() {
        assert_eq!(
            parse_timestamptz_ms("2026-11-30 01:02:03.123456+00"),
            Some(1_796_000_523_123)
        );
        assert_eq!(
            parse_timestamptz_ms("2026-11-30 06:32:03+05:30"),
            Some(1_796_000_523_000)
        );
        assert_eq!(
            parse_timestamptz_ms("2026-11-29 17:02:03.5-08"),
            Some(1_796_000_523_500)
        );
        assert_eq!(
            parse_timestamptz_ms("2026-11-30 01:02:03"),
            Some(1_796_000_523_000)
        );
        assert_eq!(parse_timestamptz_ms("infinity"), None);
        assert_eq!(parse_timestamptz_ms("2026-13-01 00:00:00"), None);
    }

    #[test]
    fn days_round_trip() {
        for d in [-1_000_000i64, -1, 0, 1, 10_957, 20_787, 2_000_000] {
            let (y, m, dd) = civil_from_days(d);
            assert_eq!(days_from_civil(y, m, dd), d);
        }
    }
}
