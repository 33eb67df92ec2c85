//! Capped exponential backoff with jitter, for every retry loop in walbox: the relay's
//! reconnects, the inbox's consumer and effect retries, the alert webhook.
//!
//! # Invariants
//! - A delay is never longer than `max`, and never shorter than half the current step.
//! - The step doubles after each delay up to `max`, and [`Backoff::reset`] returns it to
//!   `initial` (after a success).
//!
//! The jitter only spreads reconnects of several processes apart; it needs no quality, so it
//! comes from the standard library's randomly seeded hasher rather than a random-number crate.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Capped exponential backoff with jitter in the upper half of each step.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
    jitter: RandomState,
    draws: u64,
}

impl Backoff {
    /// Starts at `initial`, doubles up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            current: initial.min(max),
            jitter: RandomState::new(),
            draws: 0,
        }
    }

    /// The next delay: between half and all of the current step, which then doubles.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.current;
        self.current = (self.current * 2).min(self.max);
        let half = step / 2;
        let spread = (step - half).as_nanos() as u64;
        let offset = if spread == 0 {
            0
        } else {
            self.random() % (spread + 1)
        };
        half + Duration::from_nanos(offset)
    }

    /// Back to the initial delay.
    pub fn reset(&mut self) {
        self.current = self.initial.min(self.max);
    }

    /// A pseudo-random number: the seeded hash of a counter.
    fn random(&mut self) -> u64 {
        self.draws += 1;
        let mut h = self.jitter.build_hasher();
        h.write_u64(self.draws);
        h.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_reset() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let steps = [100, 200, 400, 800, 1000, 1000, 1000];
        for step in steps {
            let step = Duration::from_millis(step);
            let d = b.next_delay();
            assert!(
                d >= step / 2 && d <= step,
                "{d:?} outside [{:?}, {step:?}]",
                step / 2
            );
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn delays_are_spread() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(1));
        let delays: std::collections::HashSet<Duration> = (0..20).map(|_| b.next_delay()).collect();
        assert!(delays.len() > 1, "jitter spreads the delays: {delays:?}");
    }
}
