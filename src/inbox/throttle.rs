//! Repeated errors, logged once and then summarised. While a broker is down, librdkafka reports
//! the same error for every connection attempt and every poll: logged one by one, a 3 s outage
//! made about 190 lines per inbox member.
//!
//! # Invariants
//! - An error (by its key: the error, without librdkafka's varying reason) is logged the first
//!   time it comes.
//! - Its repeats within the throttle's interval of the line last logged for it are counted, not
//!   logged; the first repeat after that is logged, with how many were held back meanwhile.
//! - At most [`KEYS`] errors are remembered; beyond that the memory starts over (every error is
//!   then logged once more).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How many distinct errors are remembered.
pub const KEYS: usize = 64;

/// The errors logged, and their repeats held back (see the module docs).
#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    /// Per key: when it was last logged, and how often it came since.
    seen: HashMap<String, (Instant, u64)>,
}

impl Throttle {
    /// A throttle that logs each error at most once per `every`.
    pub fn new(every: Duration) -> Self {
        Throttle {
            every,
            seen: HashMap::new(),
        }
    }

    /// Whether the error `key`, come now, is to be logged: `Some(n)` with the `n` repeats held
    /// back since it was last logged, `None` to hold this one back.
    pub fn admit(&mut self, key: &str, now: Instant) -> Option<u64> {
        if let Some((logged, held)) = self.seen.get_mut(key) {
            if now.saturating_duration_since(*logged) < self.every {
                *held += 1;
                return None;
            }
            let n = *held;
            *logged = now;
            *held = 0;
            return Some(n);
        }
        if self.seen.len() >= KEYS {
            self.seen.clear();
        }
        self.seen.insert(key.to_owned(), (now, 0));
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_of_an_error_is_logged_its_repeats_summarised() {
        let (mut t, t0) = (Throttle::new(Duration::from_secs(60)), Instant::now());
        let down = "BrokerTransportFailure";
        assert_eq!(t.admit(down, t0), Some(0));
        // 190 repeats in the next 3 s: none logged.
        for i in 1..=190u64 {
            assert_eq!(t.admit(down, t0 + Duration::from_millis(i * 15)), None);
        }
        // Another error is logged at once.
        assert_eq!(
            t.admit("AllBrokersDown", t0 + Duration::from_secs(1)),
            Some(0)
        );
        // A minute after the first line, the next repeat is logged with the count held back.
        assert_eq!(t.admit(down, t0 + Duration::from_secs(61)), Some(190));
        assert_eq!(t.admit(down, t0 + Duration::from_secs(62)), None);
        assert_eq!(t.admit(down, t0 + Duration::from_secs(122)), Some(1));
    }

    #[test]
    fn memory_is_bounded() {
        let (mut t, t0) = (Throttle::new(Duration::from_secs(60)), Instant::now());
        for i in 0..(KEYS * 3) {
            assert_eq!(t.admit(&format!("error {i}"), t0), Some(0));
        }
        assert!(t.seen.len() <= KEYS);
    }
}
