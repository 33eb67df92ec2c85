//! Timeline histories: which earlier timelines the server's WAL descends from, and where it
//! left each.
//!
//! Every promotion of a standby and every archive recovery (a point-in-time restore) starts a
//! new timeline at a switch point; the WAL below the switch point is the parent's, the WAL above
//! it is new, and the same LSNs on the parent (if it went on) hold other transactions.
//! `TIMELINE_HISTORY <tli>` returns the history file of a timeline: one line per ancestor,
//! `<parent tli> <switch point> <reason>`, oldest first.
//!
//! Invariants:
//! - A position P on timeline T is the same WAL on the current timeline only when T is the
//!   current timeline, or T is an ancestor and P is at or below the point where the current
//!   history left T. [`TimelineHistory::ancestry`] answers that; a timeline that is neither
//!   (a sibling branch, a later timeline seen before a restore) is [`Ancestry::Foreign`].
//! - Timeline 1 has no history file: its history is empty, and only timeline 1 is its own.
//! - Parsing never panics; a line that is not `<number> <LSN> …` fails the whole history (a
//!   history walbox cannot read is not guessed at).

use crate::failure::{Classify, Failure};
use crate::lsn::Lsn;

/// The ancestors of the server's current timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineHistory {
    /// The current timeline.
    pub current: u32,
    /// Each ancestor and the position where its child began, oldest first.
    pub switches: Vec<(u32, Lsn)>,
}

/// How a timeline relates to the current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ancestry {
    /// The current timeline.
    Current,
    /// An ancestor: its WAL is the current history's up to `switchpoint`.
    Ancestor {
        /// Where the current history left it.
        switchpoint: Lsn,
    },
    /// Not in the current history.
    Foreign,
}

/// A history file that is not `<tli> <LSN> <reason>` lines.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unreadable timeline history line {0:?}")]
pub struct HistoryError(pub String);

impl Classify for HistoryError {
    /// A server answer walbox cannot read, as any protocol error (`ReplicationError::Protocol`).
    /// The relay does not stop on it: it trusts no record of an earlier timeline instead
    /// (`relay::lineage::timelines`).
    fn failure(&self) -> Option<Failure> {
        Some(Failure::Internal)
    }
}

impl TimelineHistory {
    /// The history of timeline 1 (or of any timeline, without its ancestors).
    pub fn root(current: u32) -> Self {
        TimelineHistory {
            current,
            switches: Vec::new(),
        }
    }

    /// Parses the content of `current`'s history file (`TIMELINE_HISTORY`'s `content`, raw or
    /// as bytea hex).
    pub fn parse(current: u32, content: &str) -> Result<Self, HistoryError> {
        let text = match content.strip_prefix("\\x") {
            Some(hex) => decode_hex(hex).ok_or_else(|| HistoryError(content.to_owned()))?,
            None => content.to_owned(),
        };
        let mut switches = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = line.split_whitespace();
            let tli = fields.next().and_then(|t| t.parse::<u32>().ok());
            let at = fields.next().and_then(|l| l.parse::<Lsn>().ok());
            match (tli, at) {
                (Some(tli), Some(at)) => switches.push((tli, at)),
                _ => return Err(HistoryError(line.to_owned())),
            }
        }
        Ok(TimelineHistory { current, switches })
    }

    /// How `timeline` relates to the current timeline.
    pub fn ancestry(&self, timeline: u32) -> Ancestry {
        if timeline == self.current {
            return Ancestry::Current;
        }
        self.switches
            .iter()
            .find(|(tli, _)| *tli == timeline)
            .map_or(Ancestry::Foreign, |(_, switchpoint)| Ancestry::Ancestor {
                switchpoint: *switchpoint,
            })
    }
}

fn decode_hex(hex: &str) -> Option<String> {
    let bytes = hex.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    let raw: Option<Vec<u8>> = bytes
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect();
    String::from_utf8(raw?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_names_each_ancestor_and_where_it_was_left() {
        let text = "1\t0/3000060\tno recovery target specified\n\n\
                    2\t0/5000000\tbefore 2026-12-01 10:00:00+00\n";
        let h = TimelineHistory::parse(3, text).unwrap();
        assert_eq!(h.ancestry(3), Ancestry::Current);
        assert_eq!(
            h.ancestry(1),
            Ancestry::Ancestor {
                switchpoint: "0/3000060".parse().unwrap()
            }
        );
        assert_eq!(
            h.ancestry(2),
            Ancestry::Ancestor {
                switchpoint: "0/5000000".parse().unwrap()
            }
        );
        assert_eq!(h.ancestry(4), Ancestry::Foreign);
        assert_eq!(TimelineHistory::root(1).ancestry(2), Ancestry::Foreign);
        assert_eq!(TimelineHistory::root(1).ancestry(1), Ancestry::Current);
    }

    #[test]
    fn bytea_hex_content_is_read_and_garbage_refused() {
        let hex: String = "1\t0/3000060\treason\n"
            .bytes()
            .map(|b| format!("{b:02x}"))
            .collect();
        let h = TimelineHistory::parse(2, &format!("\\x{hex}")).unwrap();
        assert_eq!(h.switches, vec![(1, "0/3000060".parse().unwrap())]);
        assert!(TimelineHistory::parse(2, "one\t0/1\tx").is_err());
        assert!(TimelineHistory::parse(2, "1").is_err());
        assert!(TimelineHistory::parse(2, "\\x4").is_err());
        assert!(TimelineHistory::parse(2, "\\xzz").is_err());
    }
}
