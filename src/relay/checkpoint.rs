//! The checkpoint frontier: which WAL position walbox may confirm to PostgreSQL.
//!
//! Every event produced to Kafka gets a sequence number `seq`, assigned in stream (= commit)
//! order. Kafka acknowledges events out of order (partitions are independent), so the tracker
//! keeps, for the window of events not yet retired, whether each one has been acked, and the
//! commit of every transaction received but not yet confirmed.
//!
//! # Invariants
//! - The frontier is the commit **end** LSN of the longest prefix of received transactions whose
//!   every event has been acked by the broker. It is never the last LSN read and never passes an
//!   event that is unacked or whose delivery failed.
//! - The frontier never moves backwards.
//! - A keepalive's `wal_end` may move the frontier only when no transaction is open and no event
//!   or commit is pending: the walsender has then sent everything that committed before
//!   `wal_end`, and all of it is acked (see `replication-protocol`: data messages carry no usable
//!   "sent up to" position, keepalives do).
//! - Memory is bounded by the number of events in the window (`in_flight`), which the relay caps;
//!   a transaction's size does not matter.
//!
//! Sequence numbers keep increasing across replication sessions of one process; a tracker made
//! for a new session ignores acks of sequence numbers from before it (`first_seq`).

use std::collections::VecDeque;

use crate::lsn::Lsn;

/// A transaction whose commit has been received but which is not yet confirmed.
#[derive(Debug, Clone, Copy)]
struct PendingCommit {
    /// Sequence number one past the transaction's last event.
    end_seq: u64,
    /// LSN of the commit record (identifies the transaction in error messages).
    commit_lsn: Lsn,
    end_lsn: Lsn,
    /// Commit timestamp, microseconds since 2000-01-01.
    commit_time: i64,
}

/// A transaction that the frontier passed: reported so the caller can update metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Confirmed {
    /// The transaction's commit end LSN.
    pub end_lsn: Lsn,
    /// Its commit timestamp, microseconds since 2000-01-01.
    pub commit_time: i64,
}

/// Ordered acknowledgement tracker; see the module docs.
#[derive(Debug)]
pub struct Checkpoint {
    first_seq: u64,
    /// Lowest sequence number not yet retired; all below are acked.
    base_seq: u64,
    next_seq: u64,
    /// `acked[i]` is the state of event `base_seq + i`.
    acked: VecDeque<bool>,
    commits: VecDeque<PendingCommit>,
    open: bool,
    frontier: Lsn,
    newest_confirmed: Option<Confirmed>,
    /// Transactions confirmed since the caller last drained them (reused, no per-ack allocation).
    just_confirmed: VecDeque<Confirmed>,
}

impl Checkpoint {
    /// A tracker whose frontier starts at `start` (the slot's confirmed position) and whose first
    /// event gets sequence number `first_seq`.
    pub fn new(start: Lsn, first_seq: u64) -> Self {
        Checkpoint {
            first_seq,
            base_seq: first_seq,
            next_seq: first_seq,
            acked: VecDeque::new(),
            commits: VecDeque::new(),
            open: false,
            frontier: start,
            newest_confirmed: None,
            just_confirmed: VecDeque::new(),
        }
    }

    /// A transaction begins.
    pub fn begin(&mut self) {
        debug_assert!(!self.open, "BEGIN inside an open transaction");
        self.open = true;
    }

    /// An event of the open transaction is about to be produced: returns its sequence number.
    pub fn event(&mut self) -> u64 {
        debug_assert!(self.open, "event outside a transaction");
        let seq = self.next_seq;
        self.next_seq += 1;
        self.acked.push_back(false);
        seq
    }

    /// The open transaction committed; `commit_lsn` is the LSN of its commit record and
    /// `end_lsn` its commit end LSN.
    ///
    /// Returns how many transactions this call confirmed (an empty transaction whose
    /// predecessors are all acked is confirmed at once); see [`Checkpoint::drain_confirmed`].
    pub fn commit(&mut self, commit_lsn: Lsn, end_lsn: Lsn, commit_time: i64) -> usize {
        debug_assert!(self.open, "COMMIT without BEGIN");
        self.open = false;
        self.commits.push_back(PendingCommit {
            end_seq: self.next_seq,
            commit_lsn,
            end_lsn,
            commit_time,
        });
        self.advance()
    }

    /// The broker acknowledged event `seq`. Acks from an earlier session, duplicates and
    /// unknown sequence numbers are ignored. Returns how many transactions this confirmed.
    pub fn ack(&mut self, seq: u64) -> usize {
        if seq < self.base_seq || seq >= self.next_seq {
            debug_assert!(seq < self.next_seq, "ack for an event never produced");
            return 0;
        }
        // In range by the check above; the window never exceeds the relay's in-flight cap.
        let idx = (seq - self.base_seq) as usize;
        match self.acked.get_mut(idx) {
            Some(slot) => *slot = true,
            None => return 0,
        }
        self.advance()
    }

    /// Every event below `end_seq` is acknowledged at once: exactly-once mode, where a Kafka
    /// transaction's commit (not each record's delivery report) makes its events count.
    /// Returns how many transactions this confirmed.
    pub fn ack_through(&mut self, end_seq: u64) -> usize {
        let end = end_seq.min(self.next_seq);
        if end <= self.base_seq {
            return 0;
        }
        let n = (end - self.base_seq) as usize;
        for slot in self.acked.iter_mut().take(n) {
            *slot = true;
        }
        self.advance()
    }

    /// A primary keepalive reported `wal_end`. Moves the frontier there only when nothing is
    /// open, pending or in flight. Returns whether the frontier moved.
    pub fn keepalive(&mut self, wal_end: Lsn) -> bool {
        if self.is_idle() && wal_end > self.frontier {
            self.frontier = wal_end;
            true
        } else {
            false
        }
    }

    /// The position that may be confirmed to PostgreSQL.
    pub fn frontier(&self) -> Lsn {
        self.frontier
    }

    /// The oldest transaction received whole but not yet confirmed: `(commit LSN, end LSN)`.
    pub fn oldest_pending(&self) -> Option<(Lsn, Lsn)> {
        self.commits.front().map(|c| (c.commit_lsn, c.end_lsn))
    }

    /// The end LSN of the pending transaction whose commit record is at `commit_lsn`.
    pub fn pending_end(&self, commit_lsn: Lsn) -> Option<Lsn> {
        self.commits
            .iter()
            .find(|c| c.commit_lsn == commit_lsn)
            .map(|c| c.end_lsn)
    }

    /// The commit time of the pending transaction whose commit record is at `commit_lsn`.
    pub fn pending_commit_time(&self, commit_lsn: Lsn) -> Option<i64> {
        self.commits
            .iter()
            .find(|c| c.commit_lsn == commit_lsn)
            .map(|c| c.commit_time)
    }

    /// The newest transaction the frontier passed in this session, if any.
    pub fn newest_confirmed(&self) -> Option<Confirmed> {
        self.newest_confirmed
    }

    /// Events produced but not yet retired (acked out of order ones included): the window the
    /// relay bounds.
    pub fn in_flight(&self) -> usize {
        self.acked.len()
    }

    /// Sequence number the next event will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Whether `seq` belongs to this tracker's session.
    pub fn owns(&self, seq: u64) -> bool {
        seq >= self.first_seq && seq < self.next_seq
    }

    /// No transaction open, no commit pending, no event in flight.
    pub fn is_idle(&self) -> bool {
        !self.open && self.commits.is_empty() && self.acked.is_empty()
    }

    /// The transactions confirmed since the last call, oldest first.
    pub fn drain_confirmed(&mut self) -> impl Iterator<Item = Confirmed> + '_ {
        self.just_confirmed.drain(..)
    }

    fn advance(&mut self) -> usize {
        while self.acked.front() == Some(&true) {
            self.acked.pop_front();
            self.base_seq += 1;
        }
        let mut confirmed = 0;
        while let Some(c) = self.commits.front().copied() {
            if c.end_seq > self.base_seq {
                break;
            }
            self.commits.pop_front();
            debug_assert!(
                c.end_lsn >= self.frontier,
                "commit end LSN {} behind frontier {}",
                c.end_lsn,
                self.frontier
            );
            self.frontier = self.frontier.max(c.end_lsn);
            let done = Confirmed {
                end_lsn: c.end_lsn,
                commit_time: c.commit_time,
            };
            self.newest_confirmed = Some(done);
            self.just_confirmed.push_back(done);
            confirmed += 1;
        }
        confirmed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(cp: &mut Checkpoint, events: usize, end: u64) -> (Vec<u64>, usize) {
        cp.begin();
        let seqs = (0..events).map(|_| cp.event()).collect();
        let confirmed = cp.commit(Lsn(end - 1), Lsn(end), end as i64);
        (seqs, confirmed)
    }

    #[test]
    fn frontier_waits_for_every_event_of_a_transaction() {
        let mut cp = Checkpoint::new(Lsn(100), 0);
        let (seqs, confirmed) = txn(&mut cp, 3, 200);
        assert_eq!(confirmed, 0);
        cp.ack(seqs[0]);
        cp.ack(seqs[2]);
        assert_eq!(cp.frontier(), Lsn(100), "seq 1 still unacked");
        let confirmed = cp.ack(seqs[1]);
        assert_eq!(cp.frontier(), Lsn(200));
        assert_eq!(confirmed, 1);
        assert_eq!(
            cp.drain_confirmed().map(|c| c.end_lsn).collect::<Vec<_>>(),
            vec![Lsn(200)]
        );
        assert!(cp.is_idle());
    }

    #[test]
    fn out_of_order_acks_across_partitions_confirm_only_the_prefix() {
        let mut cp = Checkpoint::new(Lsn(0), 0);
        let (a, _) = txn(&mut cp, 2, 10);
        let (b, _) = txn(&mut cp, 2, 20);
        let (c, _) = txn(&mut cp, 1, 30);
        // Later transactions acked first (another partition was faster).
        cp.ack(c[0]);
        cp.ack(b[0]);
        cp.ack(b[1]);
        assert_eq!(cp.frontier(), Lsn(0));
        cp.ack(a[1]);
        assert_eq!(cp.frontier(), Lsn(0));
        assert_eq!(cp.ack(a[0]), 3);
        assert_eq!(cp.frontier(), Lsn(30));
        assert_eq!(
            cp.drain_confirmed().map(|c| c.end_lsn).collect::<Vec<_>>(),
            vec![Lsn(10), Lsn(20), Lsn(30)]
        );
    }

    #[test]
    fn empty_transactions_confirm_once_predecessors_are_acked() {
        let mut cp = Checkpoint::new(Lsn(0), 0);
        let (_, confirmed) = txn(&mut cp, 0, 5);
        assert_eq!(confirmed, 1, "nothing before it: confirmed at commit");
        assert_eq!(cp.frontier(), Lsn(5));
        let (a, _) = txn(&mut cp, 1, 10);
        let (_, confirmed) = txn(&mut cp, 0, 15);
        assert_eq!(confirmed, 0, "must wait for the event before it");
        cp.ack(a[0]);
        assert_eq!(cp.frontier(), Lsn(15));
    }

    #[test]
    fn keepalive_advances_only_when_idle() {
        let mut cp = Checkpoint::new(Lsn(50), 0);
        assert!(cp.keepalive(Lsn(60)), "idle: wal_end may be confirmed");
        assert_eq!(cp.frontier(), Lsn(60));

        cp.begin();
        assert!(!cp.keepalive(Lsn(70)), "transaction open");
        let s = cp.event();
        cp.commit(Lsn(79), Lsn(80), 0);
        assert!(!cp.keepalive(Lsn(90)), "event in flight");
        assert_eq!(cp.frontier(), Lsn(60));
        cp.ack(s);
        assert_eq!(cp.frontier(), Lsn(80));
        assert!(cp.keepalive(Lsn(90)));
        assert_eq!(cp.frontier(), Lsn(90));
    }

    #[test]
    fn never_moves_backwards() {
        let mut cp = Checkpoint::new(Lsn(100), 0);
        assert!(!cp.keepalive(Lsn(40)));
        assert_eq!(cp.frontier(), Lsn(100));
    }

    #[test]
    fn acks_from_an_earlier_session_and_duplicates_are_ignored() {
        let mut cp = Checkpoint::new(Lsn(0), 1_000);
        assert_eq!(cp.ack(999), 0);
        let (s, _) = txn(&mut cp, 2, 10);
        assert!(cp.owns(s[0]) && !cp.owns(999));
        cp.ack(s[0]);
        cp.ack(s[0]);
        assert_eq!(cp.frontier(), Lsn(0));
        cp.ack(s[1]);
        assert_eq!(cp.frontier(), Lsn(10));
    }

    #[test]
    fn window_shrinks_as_the_oldest_events_are_acked() {
        let mut cp = Checkpoint::new(Lsn(0), 0);
        cp.begin();
        let seqs: Vec<u64> = (0..1000).map(|_| cp.event()).collect();
        assert_eq!(cp.in_flight(), 1000);
        for s in &seqs[..600] {
            cp.ack(*s);
        }
        assert_eq!(
            cp.in_flight(),
            400,
            "a big open transaction keeps no acked events"
        );
        assert_eq!(cp.frontier(), Lsn(0), "its commit has not arrived");
    }

    #[test]
    fn random_ack_orders_never_confirm_an_unacked_event() {
        use proptest::prelude::*;
        proptest!(|(sizes in proptest::collection::vec(0usize..5, 1..20), seed in any::<u64>())| {
            let mut cp = Checkpoint::new(Lsn(0), 0);
            let mut owner = Vec::new(); // seq -> end lsn of its transaction
            for (i, n) in sizes.iter().enumerate() {
                let end = (i as u64 + 1) * 10;
                cp.begin();
                for _ in 0..*n { cp.event(); owner.push(end); }
                cp.commit(Lsn(end - 1), Lsn(end), 0);
            }
            let mut order: Vec<u64> = (0..owner.len() as u64).collect();
            let mut x = seed | 1;
            for i in (1..order.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                order.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let mut acked = vec![false; owner.len()];
            let mut last = Lsn(0);
            for s in order {
                cp.ack(s);
                acked[s as usize] = true;
                let f = cp.frontier();
                prop_assert!(f >= last);
                last = f;
                for (seq, end) in owner.iter().enumerate() {
                    if *end <= f.0 { prop_assert!(acked[seq], "frontier {} passed unacked {}", f, seq); }
                }
            }
            prop_assert_eq!(cp.frontier(), Lsn(sizes.len() as u64 * 10));
        });
    }

    #[test]
    fn ack_through_confirms_whole_transactions_and_nothing_after() {
        let mut c = Checkpoint::new(Lsn(100), 0);
        c.begin();
        c.event();
        c.event();
        assert_eq!(c.commit(Lsn(150), Lsn(200), 1), 0);
        c.begin();
        let third = c.event();
        assert_eq!(c.commit(Lsn(250), Lsn(300), 2), 0);
        c.begin();
        c.event();
        // The Kafka transaction held the first two PostgreSQL transactions.
        assert_eq!(c.ack_through(third + 1), 2);
        assert_eq!(c.frontier(), Lsn(300));
        // The open one's event stays unconfirmed, whatever its delivery report says.
        assert_eq!(c.ack_through(third + 1), 0);
        assert_eq!(c.frontier(), Lsn(300));
        assert_eq!(c.in_flight(), 1);
    }
}
