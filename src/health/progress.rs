//! Catching up on a backlog: how fast walbox relays, how much WAL it is behind, and when it will
//! have caught up.
//!
//! The slot monitor feeds one [`Sample`] per reading (the slot's confirmed lag and the count of
//! events the broker acknowledged) into a [`Catchup`]; the estimate is computed over the
//! readings of the last [`WINDOW`], so one slow or fast interval does not swing it:
//! - events/s: acknowledged events over the window;
//! - drain rate: how fast the confirmed lag shrinks over the window (negative when it grows:
//!   PostgreSQL writes WAL faster than walbox confirms it);
//! - time to catch up: WAL behind / drain rate, only when the lag shrinks.
//!
//! Invariant: an estimate never claims a rate it did not measure. With one reading there is no
//! rate (`None`); a window shorter than [`MIN_SPAN`] gives none either (two readings a few
//! milliseconds apart would give absurd rates).
//!
//! "WAL behind" is the slot's confirmed lag (current WAL position − `confirmed_flush_lsn`), the
//! same number as `walbox_slot_confirmed_lag_bytes` and `walbox status`'s "confirmed lag": it
//! counts every WAL byte, not only the outbox's, because the slot must read all of it.
//!
//! The estimate is exported as `walbox_catchup_*` gauges (so `walbox status` can show the
//! running walbox's own estimate), and logged as one line per reading while the lag is at or
//! above `slot.catchup_threshold`, plus one "caught up" line when it drops below.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// How far back the rates look.
pub const WINDOW: Duration = Duration::from_secs(60);

/// The shortest span between the oldest and the newest reading that gives a rate.
pub const MIN_SPAN: Duration = Duration::from_millis(50);

/// One slot reading.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// When it was read.
    pub at: Instant,
    /// WAL behind: current WAL position − `confirmed_flush_lsn`.
    pub behind_bytes: u64,
    /// Events acknowledged by the broker so far (`walbox_events_published_total`).
    pub events: u64,
}

/// What a window of readings says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// WAL behind at the newest reading.
    pub behind_bytes: u64,
    /// Events acknowledged per second over the window.
    pub events_per_second: Option<f64>,
    /// Bytes per second by which the lag shrinks (negative: it grows).
    pub drain_bytes_per_second: Option<f64>,
    /// Time until the lag is gone at the current drain rate; `None` when it does not shrink.
    pub eta: Option<Duration>,
}

/// The readings of the last [`WINDOW`].
#[derive(Debug, Default)]
pub struct Catchup {
    samples: VecDeque<Sample>,
    /// Whether the last logged line was a "catching up" one.
    catching_up: bool,
}

impl Catchup {
    /// Adds a reading (readings arrive in time order) and returns the estimate.
    pub fn push(&mut self, s: Sample) -> Estimate {
        self.samples.push_back(s);
        // Keep one reading older than the window, so the window is always covered.
        while self.samples.len() > 2 && s.at.duration_since(self.samples[1].at) >= WINDOW {
            self.samples.pop_front();
        }
        self.estimate()
    }

    /// The estimate over the readings kept.
    pub fn estimate(&self) -> Estimate {
        let (Some(first), Some(last)) = (self.samples.front(), self.samples.back()) else {
            return Estimate {
                behind_bytes: 0,
                events_per_second: None,
                drain_bytes_per_second: None,
                eta: None,
            };
        };
        let span = last.at.duration_since(first.at);
        if span < MIN_SPAN {
            return Estimate {
                behind_bytes: last.behind_bytes,
                events_per_second: None,
                drain_bytes_per_second: None,
                eta: None,
            };
        }
        estimate_between(first, last)
    }

    /// The line to log for this estimate, if any: "catching up" while the lag is at or above
    /// `threshold`, one "caught up" when it drops below after that.
    pub fn line(&mut self, e: &Estimate, threshold: u64) -> Option<String> {
        if e.behind_bytes >= threshold {
            self.catching_up = true;
            Some(format!("catching up: {}", describe(e)))
        } else if std::mem::take(&mut self.catching_up) {
            Some(format!("caught up: {}", describe(e)))
        } else {
            None
        }
    }
}

/// The estimate from two readings, `first` older than `last`.
pub fn estimate_between(first: &Sample, last: &Sample) -> Estimate {
    let secs = last.at.duration_since(first.at).as_secs_f64();
    let events = last.events.saturating_sub(first.events) as f64 / secs;
    let drain = (first.behind_bytes as f64 - last.behind_bytes as f64) / secs;
    let eta = (drain > 0.0).then(|| {
        // Bounded: a trickle of drain must not overflow a Duration.
        Duration::from_secs_f64((last.behind_bytes as f64 / drain).min(1e9))
    });
    Estimate {
        behind_bytes: last.behind_bytes,
        events_per_second: Some(events),
        drain_bytes_per_second: Some(drain),
        eta,
    }
}

/// "12,345 events/s, 1.2 GiB of WAL behind, about 2m 10s to catch up".
pub fn describe(e: &Estimate) -> String {
    let mut out = String::new();
    match (e.events_per_second, e.drain_bytes_per_second) {
        (Some(r), _) => {
            let _ = write!(out, "{} events/s, ", thousands(r.round() as u64));
        }
        (None, None) => out.push_str("rate not measured yet, "),
        // A drain rate without an event count (`walbox status` sampling the slot itself).
        (None, Some(_)) => {}
    }
    let _ = write!(out, "{} of WAL behind", human_bytes(e.behind_bytes));
    match (e.eta, e.drain_bytes_per_second) {
        (Some(eta), _) if e.behind_bytes > 0 => {
            let _ = write!(out, ", about {} to catch up", human_duration(eta));
        }
        (_, Some(d)) if d < 0.0 => {
            let _ = write!(
                out,
                ", falling behind by {}/s: PostgreSQL writes WAL faster than walbox confirms it",
                human_bytes(d.abs() as u64)
            );
        }
        (_, Some(_)) if e.behind_bytes > 0 => out.push_str(", not draining"),
        _ => {}
    }
    out
}

/// `1234567` → `"1,234,567"`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes for people: `"512 B"`, `"64.0 MiB"`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// A duration for people, to the second: `"45s"`, `"2m 10s"`, `"3h 05m"`.
pub fn human_duration(d: Duration) -> String {
    let s = d.as_secs_f64().ceil() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The running walbox's estimate, read back from its `/metrics` text (for `walbox status`).
/// `None` when the exposition has no `walbox_catchup_wal_behind_bytes` (not walbox's, or no
/// reading yet).
pub fn from_metrics_text(text: &str) -> Option<Estimate> {
    let value = |name: &str| {
        text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
            let (metric, v) = l.split_once(' ')?;
            (metric == name).then(|| v.trim().parse::<f64>().ok())?
        })
    };
    let behind = value("walbox_catchup_wal_behind_bytes")?;
    Some(Estimate {
        behind_bytes: behind.max(0.0) as u64,
        events_per_second: value("walbox_catchup_events_per_second"),
        drain_bytes_per_second: value("walbox_catchup_drain_bytes_per_second"),
        eta: value("walbox_catchup_eta_seconds")
            .filter(|v| v.is_finite() && *v >= 0.0)
            .map(Duration::from_secs_f64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, secs: u64, behind: u64, events: u64) -> Sample {
        Sample {
            at: base + Duration::from_secs(secs),
            behind_bytes: behind,
            events,
        }
    }

    #[test]
    fn one_reading_measures_no_rate() {
        let mut c = Catchup::default();
        let e = c.push(at(Instant::now(), 0, 1 << 30, 0));
        assert_eq!(e.behind_bytes, 1 << 30);
        assert_eq!(e.events_per_second, None);
        assert_eq!(e.eta, None);
        assert_eq!(describe(&e), "rate not measured yet, 1.0 GiB of WAL behind");
    }

    #[test]
    fn a_shrinking_lag_gives_rates_and_the_time_to_catch_up() {
        let base = Instant::now();
        let mut c = Catchup::default();
        c.push(at(base, 0, 300 << 20, 1_000));
        let e = c.push(at(base, 10, 200 << 20, 101_000));
        assert_eq!(e.events_per_second, Some(10_000.0));
        assert_eq!(e.drain_bytes_per_second, Some((10 << 20) as f64));
        // 200 MiB left at 10 MiB/s.
        assert_eq!(e.eta, Some(Duration::from_secs(20)));
        assert_eq!(
            describe(&e),
            "10,000 events/s, 200.0 MiB of WAL behind, about 20s to catch up"
        );
    }

    #[test]
    fn a_growing_lag_says_so_and_promises_nothing() {
        let base = Instant::now();
        let mut c = Catchup::default();
        c.push(at(base, 0, 100 << 20, 0));
        let e = c.push(at(base, 2, 104 << 20, 500));
        assert_eq!(e.eta, None);
        assert_eq!(e.drain_bytes_per_second, Some(-((2 << 20) as f64)));
        assert!(
            describe(&e).contains("falling behind by 2.0 MiB/s"),
            "{}",
            describe(&e)
        );
        // Over the window the lag still grew: 4 MiB in 4 s.
        let e = c.push(at(base, 4, 104 << 20, 500));
        assert!(
            describe(&e).contains("falling behind by 1.0 MiB/s"),
            "{}",
            describe(&e)
        );
        // A lag that stays put: no promise either.
        let mut c = Catchup::default();
        c.push(at(base, 0, 104 << 20, 500));
        let e = c.push(at(base, 2, 104 << 20, 500));
        assert_eq!(e.eta, None);
        assert!(describe(&e).ends_with("not draining"), "{}", describe(&e));
    }

    #[test]
    fn the_window_forgets_old_readings() {
        let base = Instant::now();
        let mut c = Catchup::default();
        // A burst long ago, then a steady 1,000 events/s.
        c.push(at(base, 0, 0, 0));
        c.push(at(base, 1, 0, 1_000_000));
        for s in 2..=200 {
            c.push(at(base, s, 0, 1_000_000 + (s - 1) * 1_000));
        }
        let e = c.estimate();
        let rate = e.events_per_second.unwrap();
        assert!((rate - 1_000.0).abs() < 1e-6, "{rate}");
        assert!(c.samples.len() <= 62, "{}", c.samples.len());
    }

    #[test]
    fn readings_too_close_together_give_no_rate() {
        let base = Instant::now();
        let mut c = Catchup::default();
        c.push(Sample {
            at: base,
            behind_bytes: 10,
            events: 0,
        });
        let e = c.push(Sample {
            at: base + Duration::from_millis(1),
            behind_bytes: 0,
            events: 1_000,
        });
        assert_eq!(e.events_per_second, None);
    }

    #[test]
    fn lines_while_behind_then_one_caught_up() {
        let base = Instant::now();
        let mut c = Catchup::default();
        let e = c.push(at(base, 0, 10, 0));
        assert_eq!(c.line(&e, 100), None);
        let e = c.push(at(base, 1, 500, 0));
        assert!(c.line(&e, 100).unwrap().starts_with("catching up: "));
        let e = c.push(at(base, 2, 50, 1_000));
        assert!(c.line(&e, 100).unwrap().starts_with("caught up: "));
        let e = c.push(at(base, 3, 0, 1_000));
        assert_eq!(c.line(&e, 100), None);
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
        assert_eq!(human_duration(Duration::from_millis(300)), "1s");
        assert_eq!(human_duration(Duration::from_secs(130)), "2m 10s");
        assert_eq!(
            human_duration(Duration::from_secs(3 * 3600 + 5 * 60)),
            "3h 05m"
        );
    }

    #[test]
    fn reads_the_estimate_back_from_metrics() {
        let text = "# HELP walbox_catchup_wal_behind_bytes x\n\
                    walbox_catchup_wal_behind_bytes 2097152\n\
                    walbox_catchup_events_per_second 1500\n\
                    walbox_catchup_drain_bytes_per_second 1048576\n\
                    walbox_catchup_eta_seconds 2\n";
        let e = from_metrics_text(text).unwrap();
        assert_eq!(e.behind_bytes, 2 << 20);
        assert_eq!(e.events_per_second, Some(1500.0));
        assert_eq!(e.eta, Some(Duration::from_secs(2)));
        assert_eq!(from_metrics_text("walbox_streaming 1\n"), None);
        let e = from_metrics_text("walbox_catchup_wal_behind_bytes 0\n").unwrap();
        assert_eq!(e.events_per_second, None);
    }
}
