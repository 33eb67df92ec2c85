//! How long the brokers left a producer without an answer while it waited on them.
//!
//! A Kafka transaction's coordinator aborts it once it is older than `transaction.timeout.ms`,
//! whatever kept it open, and says so the same way it says that another producer took over
//! (PRODUCER_FENCED or INVALID_PRODUCER_EPOCH, which librdkafka reports as fenced). Whether
//! walbox held the transaction open too long, or the brokers could not be reached for part of
//! its life, only the producer can tell: this module measures the second
//! ([`crate::sink::transaction::timed_out_or`] decides with it).
//!
//! # Invariants
//! - Something is outstanding from the moment it is handed over (a record to librdkafka, a
//!   transactional call to the coordinator) until its answer (the record's delivery report,
//!   success or failure; the call's return).
//! - A silence runs, while something is outstanding, from the moment waiting began or the last
//!   answer, whichever is later, to the next answer. A broker that answers keeps every silence
//!   short however much is queued; an unreachable one makes one silence as long as the outage
//!   (until librdkafka gives up on a record at `message.timeout.ms`, or a call returns).
//! - Silences of at least [`FLOOR`] are kept, the newest [`KEPT`] of them; shorter ones are
//!   normal round trips and are not counted. The silence running now counts too.
//! - Recording takes no lock, except to keep a silence of at least [`FLOOR`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The shortest silence that is kept.
pub const FLOOR: Duration = Duration::from_millis(100);

/// How many silences are kept (the newest).
pub const KEPT: usize = 64;

/// The silences of one producer (see the module docs).
#[derive(Debug)]
pub struct Silences {
    /// The origin of the nanosecond counts below.
    base: Instant,
    /// Records and calls outstanding.
    outstanding: AtomicU64,
    /// When the silence running now began (nanoseconds after `base`), while `outstanding > 0`.
    since: AtomicU64,
    /// Silences of at least [`FLOOR`], oldest first: start and end, nanoseconds after `base`.
    kept: Mutex<VecDeque<(u64, u64)>>,
}

impl Default for Silences {
    fn default() -> Self {
        Silences {
            base: Instant::now(),
            outstanding: AtomicU64::new(0),
            since: AtomicU64::new(0),
            kept: Mutex::new(VecDeque::with_capacity(KEPT)),
        }
    }
}

impl Silences {
    /// One more record or call outstanding, from now.
    pub fn waiting(&self) {
        // The clock is read only when a silence can begin (nothing was outstanding): a record
        // handed over behind others costs one atomic add.
        self.waiting_with(Instant::now);
    }

    /// One record or call answered, now.
    pub fn answered(&self) {
        self.answered_at(Instant::now());
    }

    /// One record or call counted by [`Silences::waiting`] was not handed over after all.
    pub fn withdrawn(&self) {
        let _ = self
            .outstanding
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// How long the brokers were silent between `from` and now.
    pub fn since(&self, from: Instant) -> Duration {
        self.between(from, Instant::now())
    }

    fn nanos(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    fn waiting_with(&self, now: impl FnOnce() -> Instant) {
        if self.outstanding.fetch_add(1, Ordering::AcqRel) == 0 {
            self.since.store(self.nanos(now()), Ordering::Release);
        }
    }

    #[cfg(test)]
    fn waiting_at(&self, now: Instant) {
        self.waiting_with(|| now);
    }

    fn answered_at(&self, now: Instant) {
        let now = self.nanos(now);
        let start = self.since.swap(now, Ordering::AcqRel);
        self.withdrawn();
        if now.saturating_sub(start) >= FLOOR.as_nanos() as u64 {
            let mut kept = match self.kept.lock() {
                Ok(k) => k,
                Err(poisoned) => poisoned.into_inner(),
            };
            if kept.len() == KEPT {
                kept.pop_front();
            }
            kept.push_back((start, now));
        }
    }

    /// The silent time within `[from, to]`: the kept silences, and the one running at `to`.
    fn between(&self, from: Instant, to: Instant) -> Duration {
        let (from, to) = (self.nanos(from), self.nanos(to));
        let overlap = |(s, e): (u64, u64)| e.min(to).saturating_sub(s.max(from));
        let mut total: u64 = match self.kept.lock() {
            Ok(k) => k.iter().copied().map(overlap).sum(),
            Err(poisoned) => poisoned.into_inner().iter().copied().map(overlap).sum(),
        };
        if self.outstanding.load(Ordering::Acquire) > 0 {
            let running = (self.since.load(Ordering::Acquire), to);
            if running.1.saturating_sub(running.0) >= FLOOR.as_nanos() as u64 {
                total += overlap(running);
            }
        }
        Duration::from_nanos(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn answered_records_leave_no_silence_however_many_are_queued() {
        let (w, t0) = (Silences::default(), Instant::now());
        // 10,000 records handed over at once, answered one every millisecond.
        for _ in 0..10_000 {
            w.waiting_at(t0);
        }
        for i in 1..=10_000u64 {
            w.answered_at(t0 + Duration::from_millis(i));
        }
        assert_eq!(w.between(t0, t0 + secs(20.0)), Duration::ZERO);
    }

    #[test]
    fn an_outage_is_one_silence_as_long_as_it_lasts() {
        let (w, t0) = (Silences::default(), Instant::now());
        w.waiting_at(t0);
        w.answered_at(t0 + secs(0.01));
        // Three records in flight when the brokers go away; librdkafka fails them 10 s later.
        for _ in 0..3 {
            w.waiting_at(t0 + secs(1.0));
        }
        for _ in 0..3 {
            w.answered_at(t0 + secs(11.0));
        }
        // Then an abort call that waits 17 s for the coordinator.
        w.waiting_at(t0 + secs(11.5));
        w.answered_at(t0 + secs(28.5));
        let silent = w.between(t0, t0 + secs(30.0));
        assert_eq!(silent, secs(27.0));
        // Only the part after `from` counts.
        assert_eq!(w.between(t0 + secs(6.0), t0 + secs(30.0)), secs(22.0));
    }

    #[test]
    fn walbox_being_slow_is_not_a_silence() {
        let (w, t0) = (Silences::default(), Instant::now());
        // Nothing outstanding for 12 s between two promptly answered records.
        w.waiting_at(t0);
        w.answered_at(t0 + secs(0.002));
        w.waiting_at(t0 + secs(12.0));
        w.answered_at(t0 + secs(12.002));
        assert_eq!(w.between(t0, t0 + secs(13.0)), Duration::ZERO);
    }

    #[test]
    fn the_silence_running_now_counts() {
        let (w, t0) = (Silences::default(), Instant::now());
        w.waiting_at(t0 + secs(2.0));
        assert_eq!(w.between(t0, t0 + secs(9.0)), secs(7.0));
        w.answered_at(t0 + secs(9.5));
        assert_eq!(w.between(t0, t0 + secs(20.0)), secs(7.5));
    }

    #[test]
    fn only_the_newest_silences_are_kept() {
        let (w, t0) = (Silences::default(), Instant::now());
        for i in 0..(KEPT as u64 + 10) {
            let start = t0 + Duration::from_secs(i * 2);
            w.waiting_at(start);
            w.answered_at(start + secs(1.0));
        }
        let all = w.between(t0, t0 + Duration::from_secs(1_000));
        assert_eq!(all, Duration::from_secs(KEPT as u64));
    }
}
