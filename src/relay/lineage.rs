//! Whether the progress record read at an exactly-once start describes the WAL history and
//! the slot this session streams: only then may its position skip transactions as "already in
//! Kafka".
//!
//! The record's key (system identifier, database, slot) survives what reuses LSNs for other
//! transactions: a promoted asynchronous standby that lagged, a point-in-time restore, a slot
//! dropped and made again by hand on a restored server. Trusting a record of that other history
//! skips new transactions below it: rows lost without an error. Ignoring a record costs at most
//! the transactions PostgreSQL sends again from the slot's confirmed position: duplicates.
//!
//! # Invariants
//! - A record is trusted only up to where its history is the server's (see
//!   [`crate::source::timeline`]): whole when written on the current timeline; on an ancestor
//!   timeline, up to the point where the current history left it (below it both are one WAL);
//!   not at all from a timeline outside the current history.
//! - A record without a timeline (written by an older walbox) is trusted only on timeline 1,
//!   where no promotion or archive recovery has ever forked the history; on a later timeline it
//!   may be of the history before the fork, and is ignored.
//! - A record of the current timeline whose slot generation ([`ProgressRecord::slot_floor`]:
//!   the slot's `restart_lsn` when the writing session started) lies beyond the slot's confirmed
//!   position now is of another generation of the slot (recreated, or restored from a backup).
//!   On an ancestor timeline the switch point bounds the trust instead: below it both histories
//!   are one WAL, and a failover slot's synchronized copy on a promoted standby may rightly
//!   show less than the primary's slot did when the record was written. The same slot
//!   never shows less than that again: PostgreSQL writes a slot to disk whenever its
//!   `restart_lsn` moves, and its confirmed position never falls below its `restart_lsn`. The
//!   confirmed position itself is no such floor: one that moved alone is kept in memory until a
//!   checkpoint finds the slot dirty (before PostgreSQL 17 not even a shutdown saves it), so a
//!   crash or a restart takes it back to the last position saved, and a record written after
//!   it would look like another slot's (its transactions sent twice).
//! - A record beyond the server's WAL position is never trusted (a history that has not yet
//!   written that far cannot have confirmed it).
//! - The position this process acknowledged ([`start_position`]) is judged by the same rule
//!   before a new session starts above the slot's confirmed position: the session's start is a
//!   skip too (PostgreSQL sends nothing that commits below it), and the URL may by then reach a
//!   promoted standby, a restored cluster or another cluster. Its lineage is that of the
//!   session that acknowledged it.
//! - What is not trusted is logged with the reason; the session then skips nothing. A history
//!   that cannot be read counts as the current timeline alone.

use crate::lsn::Lsn;
use crate::sink::progress::{Lineage, ProgressRecord};
use crate::source::session::OpenSession;
use crate::source::timeline::{Ancestry, TimelineHistory};

/// What the server says at session start, against which a record is judged.
#[derive(Debug, Clone)]
pub struct ServerHistory {
    /// The current timeline's ancestors.
    pub timelines: TimelineHistory,
    /// `IDENTIFY_SYSTEM`'s WAL position.
    pub wal_at: Lsn,
    /// The slot's `confirmed_flush_lsn` as the session found (or made) it.
    pub slot_confirmed: Lsn,
}

/// The server's timeline history; when it cannot be read, the current timeline alone (a
/// record of an earlier timeline is then ignored: duplicates, never a skip).
pub async fn timelines(open: &mut OpenSession) -> TimelineHistory {
    match open.timeline_history().await {
        Ok(history) => history,
        Err(e) => {
            let current = open.identity.timeline;
            tracing::warn!(error = %e, timeline = current, "cannot read the server's timeline history; progress records of earlier timelines are not trusted");
            TimelineHistory::root(current)
        }
    }
}

/// How much of a progress record a session may trust.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// Its position, and its commit time.
    Whole,
    /// Only up to this position (where the current history left the record's timeline); the
    /// commit time there is not known.
    Until(Lsn),
    /// Nothing: the reason.
    Ignored(String),
}

/// How much of `record` the session on `server` may trust.
pub fn trust(record: &ProgressRecord, server: &ServerHistory) -> Trust {
    judge(
        record.confirmed_lsn,
        record.timeline,
        record.slot_floor,
        server,
    )
}

/// How much of the position this process acknowledged (`frontier`, on `lineage`: the timeline
/// and slot generation of the session that acknowledged it) the next session on `server` may
/// skip: the same rule as for a progress record. A frontier of another history (a promoted
/// standby that lagged, a restore while walbox retried) would start the session above commits
/// of the new history that no one relayed; PostgreSQL honours a start above the slot's
/// confirmed position and never sends them.
pub fn trust_frontier(frontier: Lsn, lineage: Lineage, server: &ServerHistory) -> Trust {
    judge(
        frontier,
        Some(lineage.timeline),
        Some(lineage.slot_floor),
        server,
    )
}

/// The position a session starts at: the slot's confirmed position, raised to `frontier` as far
/// as it is trusted (see [`trust_frontier`]); what is not trusted is logged.
pub fn start_position(frontier: Lsn, lineage: Lineage, server: &ServerHistory) -> Lsn {
    let slot = server.slot_confirmed;
    if frontier <= slot {
        return slot;
    }
    match trust_frontier(frontier, lineage, server) {
        Trust::Whole => frontier,
        Trust::Until(switchpoint) => {
            tracing::warn!(
                acknowledged = %frontier, timeline = lineage.timeline, trusted_up_to = %switchpoint,
                "the server's history left the timeline walbox acknowledged on before the acknowledged position; streaming resumes from where it left it, so transactions after it may be sent again"
            );
            slot.max(switchpoint)
        }
        Trust::Ignored(reason) => {
            tracing::warn!(
                acknowledged = %frontier, timeline = lineage.timeline, slot_floor = %lineage.slot_floor, slot_confirmed = %slot,
                "the position walbox acknowledged is not resumed from: {reason}; streaming resumes from the slot's confirmed position, so transactions may be sent again, none is skipped"
            );
            slot
        }
    }
}

/// The rule behind [`trust`] and [`trust_frontier`]: position `at`, acknowledged on `timeline`
/// by a session that found the slot's `restart_lsn` at `floor`.
fn judge(at: Lsn, timeline: Option<u32>, floor: Option<Lsn>, server: &ServerHistory) -> Trust {
    let current = server.timelines.current;
    let limit = match timeline {
        None if current == 1 => None,
        None => {
            return Trust::Ignored(format!(
                "it names no timeline (an older walbox wrote it) and the server is on timeline {current}: it may be of the history before a promotion or a restore"
            ))
        }
        Some(t) => match server.timelines.ancestry(t) {
            Ancestry::Current => None,
            Ancestry::Ancestor { switchpoint } => {
                if floor.is_some_and(|f| f > switchpoint) {
                    return Trust::Ignored(format!(
                        "it is of a slot on timeline {t} made after the server's history left that timeline at {switchpoint}"
                    ));
                }
                Some(switchpoint)
            }
            Ancestry::Foreign => {
                return Trust::Ignored(format!(
                    "it is of timeline {t}, which is not in the history of the server's timeline {current} (another branch: a promoted standby or a restore)"
                ))
            }
        },
    };
    // On the current timeline a slot confirmed below the writer's floor is another generation
    // (recreated, or restored with a snapshot of the cluster: the WAL after it is not the one
    // the record speaks of). On an ancestor timeline the switch point bounds the trust instead:
    // below it both histories are one WAL, whatever the slot's copy shows now (a failover
    // slot's synchronized copy on a promoted standby may be older than the primary's was).
    if let Some(floor) = floor.filter(|f| limit.is_none() && *f > server.slot_confirmed) {
        return Trust::Ignored(format!(
            "it is of another generation of the slot: its writer found the slot's restart_lsn at {floor}, the slot is confirmed at {} now (it was recreated, or restored from a backup)",
            server.slot_confirmed
        ));
    }
    match limit {
        Some(switchpoint) if at > switchpoint => Trust::Until(switchpoint),
        _ if at > server.wal_at => Trust::Ignored(format!(
            "it lies beyond the server's WAL position {}: it is of another history (a restore or a promoted standby)",
            server.wal_at
        )),
        _ => Trust::Whole,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lsn(text: &str) -> Lsn {
        text.parse().unwrap()
    }

    fn record(at: &str, timeline: Option<u32>, floor: Option<&str>) -> ProgressRecord {
        ProgressRecord {
            slot: "s".into(),
            database: "d".into(),
            system_identifier: "1".into(),
            confirmed_lsn: lsn(at),
            confirmed_commit_time_us: Some(1),
            written_at: "x".into(),
            timeline,
            slot_floor: floor.map(lsn),
            writer: None,
        }
    }

    fn server(current: u32, history: &str, wal_at: &str, slot: &str) -> ServerHistory {
        ServerHistory {
            timelines: TimelineHistory::parse(current, history).unwrap(),
            wal_at: lsn(wal_at),
            slot_confirmed: lsn(slot),
        }
    }

    #[test]
    fn a_record_of_the_current_timeline_and_slot_is_trusted() {
        let s = server(1, "", "0/9000000", "0/5000000");
        assert_eq!(
            trust(&record("0/6000000", Some(1), Some("0/4000000")), &s),
            Trust::Whole
        );
        // An older walbox's record on timeline 1: as before.
        assert_eq!(trust(&record("0/6000000", None, None), &s), Trust::Whole);
        // Beyond the server's WAL: never.
        assert!(
            matches!(trust(&record("0/A000000", Some(1), None), &s), Trust::Ignored(r) if r.contains("another history"))
        );
    }

    #[test]
    fn a_record_of_an_ancestor_timeline_is_trusted_up_to_where_the_history_left_it() {
        let s = server(2, "1\t0/5000000\tpromoted\n", "0/9000000", "0/4000000");
        assert_eq!(
            trust(&record("0/4800000", Some(1), Some("0/4000000")), &s),
            Trust::Whole
        );
        assert_eq!(
            trust(&record("0/8000000", Some(1), Some("0/4000000")), &s),
            Trust::Until(lsn("0/5000000"))
        );
        // Its slot was made on timeline 1 after the fork: not this slot.
        assert!(matches!(
            trust(&record("0/8000000", Some(1), Some("0/6000000")), &s),
            Trust::Ignored(_)
        ));
    }

    #[test]
    fn a_synchronized_slot_older_than_the_record_is_judged_by_the_switch_point() {
        // The primary's slot had restart_lsn 0/4800000 when the writer started; the promoted
        // standby's synchronized copy is confirmed at 0/4000000 only.
        let s = server(2, "1\t0/5000000\tpromoted\n", "0/9000000", "0/4000000");
        assert_eq!(
            trust(&record("0/6000000", Some(1), Some("0/4800000")), &s),
            Trust::Until(lsn("0/5000000"))
        );
        assert_eq!(
            trust(&record("0/4900000", Some(1), Some("0/4800000")), &s),
            Trust::Whole
        );
    }

    #[test]
    fn an_acknowledged_frontier_is_resumed_from_only_on_its_own_history() {
        let lineage = |timeline, floor: &str| Lineage {
            timeline,
            slot_floor: lsn(floor),
        };
        // Same timeline and slot: the frontier, even above the slot's confirmed position.
        let same = server(1, "", "0/9000000", "0/5000000");
        assert_eq!(
            start_position(lsn("0/6000000"), lineage(1, "0/4000000"), &same),
            lsn("0/6000000")
        );
        // Never below the slot.
        assert_eq!(
            start_position(lsn("0/4000000"), lineage(1, "0/3000000"), &same),
            lsn("0/5000000")
        );
        // A promoted standby that lagged: only up to where its history left timeline 1.
        let promoted = server(2, "1\t0/5800000\tpromoted\n", "0/9000000", "0/5000000");
        assert_eq!(
            start_position(lsn("0/7000000"), lineage(1, "0/4000000"), &promoted),
            lsn("0/5800000")
        );
        // A restore that took the slot back below the acknowledging session's floor.
        let restored = server(1, "", "0/9000000", "0/3000000");
        assert_eq!(
            start_position(lsn("0/6000000"), lineage(1, "0/4000000"), &restored),
            lsn("0/3000000")
        );
        // A server whose WAL has not reached the frontier.
        let behind = server(1, "", "0/5800000", "0/5000000");
        assert_eq!(
            start_position(lsn("0/6000000"), lineage(1, "0/4000000"), &behind),
            lsn("0/5000000")
        );
        // Another branch.
        let branch = server(3, "1\t0/3000000\tx\n", "0/9000000", "0/5000000");
        assert_eq!(
            start_position(lsn("0/6000000"), lineage(2, "0/4000000"), &branch),
            lsn("0/5000000")
        );
    }

    #[test]
    fn records_of_other_branches_generations_or_unknown_timelines_are_ignored() {
        let s = server(3, "1\t0/3000000\tx\n", "0/9000000", "0/5000000");
        // Timeline 2 forked from 1 too, but the server's history does not pass through it.
        assert!(
            matches!(trust(&record("0/4000000", Some(2), None), &s), Trust::Ignored(r) if r.contains("timeline 2"))
        );
        // Without a timeline on timeline 3: it may be of timeline 1 or 2.
        assert!(
            matches!(trust(&record("0/4000000", None, None), &s), Trust::Ignored(r) if r.contains("no timeline"))
        );
        // The slot is behind where the record's writer found it: another generation.
        assert!(
            matches!(trust(&record("0/7000000", Some(3), Some("0/6000000")), &s), Trust::Ignored(r) if r.contains("generation"))
        );
    }
}
