//! The publication watch: walbox never confirms a position past the point where the
//! publication stopped covering an outbox table.
//!
//! # Why the catalog must be watched
//! PostgreSQL decodes each change with the catalog as of that change. After `ALTER PUBLICATION
//! … DROP TABLE outbox`, `… SET TABLE other`, `… SET (publish = 'update, delete')`, `… SET
//! (publish_via_partition_root = false)` for a partitioned outbox, or a table replaced under its
//! name (`ALTER TABLE outbox RENAME TO …` or `DROP TABLE outbox`, then
//! `CREATE TABLE outbox …`), the rows inserted later never reach walbox as the outbox's:
//! nothing in the stream says so (keepalives and other tables go on), and covering the table again does not
//! bring them back. The only trace is the catalog, and the only thing walbox can still do is
//! not confirm past the change, then stop and say how to republish them.
//!
//! # How
//! One task per session, on a control connection of its own, every `postgres.status_interval`
//! (at least [`SETTLE`]), takes two readings ([`crate::source::publication`]), in this order:
//! 1. a snapshot of the catalog: the publication, its `pubinsert`, and for each outbox table
//!    its OID and whether the publication includes it. When nothing changed, it **releases**
//!    the position read by the previous round;
//! 2. the server's WAL position (`pg_current_wal_lsn()`, on a standby
//!    `pg_last_wal_replay_lsn()`): the candidate the next round releases.
//!
//! The relay sends PostgreSQL `min(checkpoint frontier, released)` ([`Gate::confirmable`]), so
//! acknowledged events and keepalives wait one to two rounds to be confirmed. A round costs two
//! short queries on one connection (membership is asked of `pg_publication_rel` first, see
//! [`crate::source::publication`]).
//!
//! # Invariants
//! - The position sent to PostgreSQL is never past the last released position, or the
//!   session's start before the first release.
//! - A position is released only by a snapshot taken at least one round after the position was
//!   read, that finds every outbox table still covered. A change committed before the position
//!   was read is in that snapshot, unless its commit stayed invisible for the whole round (on a
//!   primary a commit is written before it becomes visible: for the flush, or longer while it
//!   waits for a synchronous standby). On a standby the replay position is read after the
//!   change is visible, so the round is not needed there.
//! - On a change nothing more is released: the relay stops with exit 5, confirming at most the
//!   last released position ([`crate::relay::RelayError::Uncovered`]).
//! - A change is: the publication is gone; it does not publish INSERTs; it does not include an
//!   outbox table, or publishes a partitioned one's rows under its partitions' names (which
//!   are no outbox table's); or the table of that name is not the one the session started with (its
//!   OID) and the publication does not cover it implicitly. `FOR ALL TABLES` and `FOR TABLES
//!   IN SCHEMA` cover a table from its creation, so a replacement under them misses nothing and
//!   is not a change.
//! - The OID compared is the one read on the session's control connection before it streams
//!   (the table the session decodes), not the one in each pgoutput Relation message: a session
//!   that resumes from before a replacement decodes the old table's rows under the same name,
//!   which were covered when written.
//! - A reading that fails twice (the second time on a new connection) releases nothing and ends
//!   the session (transient: the supervisor reconnects). Holding confirmation back instead
//!   would hold a server's shutdown too: its walsender waits for the client to confirm the end
//!   of its WAL, and a server shutting down takes no new connection to read the catalog on.
//! - A graceful stop asks for one last round ([`Gate::settle`]): a position, [`SETTLE`], a
//!   snapshot, so the final status can confirm everything acknowledged (a stop is not delayed
//!   by a whole round; a change still invisible a tenth of a second after it was written, right
//!   before a stop, is the one this last round can miss).
//!
//! Not seen: a change undone within one round (a table dropped from the publication and added
//! back a second later: the rows between are not decoded); a replacement made, and its new table
//! added to the publication, while walbox was stopped.

use std::time::Duration;

use postgres_protocol::escape::escape_identifier as quote_ident;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::config::conninfo::ConnInfo;
use crate::config::{OutboxConfig, RouteSource};
use crate::lsn::Lsn;
use crate::pg::control::connect_control;
use crate::source::publication::{self, Coverage};
use crate::source::session::{OpenError, OpenSession};

/// Shortest round, and the wait between the position and the snapshot of a stop's last round.
pub(super) const SETTLE: Duration = Duration::from_millis(100);

/// How long a stop waits for its last round.
const LAST_ROUND: Duration = Duration::from_secs(2);

/// An outbox table the watch follows: `(schema, table)`.
pub(super) type Watched = (String, String);

/// `"schema"."table"`, as SQL names it.
fn sql_name((schema, table): &Watched) -> String {
    format!("{}.{}", quote_ident(schema), quote_ident(table))
}

/// What no longer holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The publication is gone.
    Dropped,
    /// The publication does not publish INSERTs.
    InsertsOff,
    /// The publication does not include the table.
    NotPublished {
        /// `"schema"."table"`.
        table: String,
    },
    /// The table is partitioned and the publication publishes its partitions' rows under their
    /// own names, which are no outbox table's.
    PartitionsByName {
        /// `"schema"."table"`.
        table: String,
    },
    /// The table of that name is another one, or there is none.
    Replaced {
        /// `"schema"."table"`.
        table: String,
        /// The OID the session started with.
        was: u32,
        /// The OID now, `None` when no such table exists.
        now: Option<u32>,
        /// Whether the publication includes the new table.
        published: bool,
    },
}

impl Change {
    /// What happened, for the operator.
    pub fn describe(&self, publication: &str) -> String {
        let p = quote_ident(publication);
        match self {
            Change::Dropped => format!("publication {p} was dropped (the publication watch saw it)"),
            Change::InsertsOff => format!("publication {p} does not publish inserts"),
            Change::NotPublished { table } => format!("publication {p} does not include {table}"),
            Change::PartitionsByName { table } => format!(
                "publication {p} publishes the rows of {table}'s partitions under the partitions' names"
            ),
            Change::Replaced {
                table, was, now, ..
            } => match now {
                Some(now) => {
                    format!("{table} was replaced by another table (OID {was}, now {now})")
                }
                None => format!("{table} (OID {was}) was renamed or dropped"),
            },
        }
    }

    /// The statement that makes the publication cover the table again, with a trailing
    /// ", "; empty when it already does.
    pub fn fix(&self, publication: &str) -> String {
        let p = quote_ident(publication);
        match self {
            // Its way out is `Relay::into_fatal`'s (the slot must pass the re-creation).
            Change::Dropped => String::new(),
            Change::InsertsOff => format!("run ALTER PUBLICATION {p} SET (publish = 'insert'), "),
            Change::PartitionsByName { .. } => {
                format!("run ALTER PUBLICATION {p} SET (publish_via_partition_root = true), ")
            }
            Change::NotPublished { table }
            | Change::Replaced {
                table,
                now: Some(_),
                published: false,
                ..
            } => format!("run ALTER PUBLICATION {p} ADD TABLE {table}, "),
            Change::Replaced {
                now: None, table, ..
            } => {
                format!("create {table} again, then run ALTER PUBLICATION {p} ADD TABLE {table}, ")
            }
            Change::Replaced { .. } => String::new(),
        }
    }
}

/// What the watch last said.
#[derive(Debug, Clone, Default)]
struct Verdict {
    /// The newest released position.
    released: Lsn,
    /// The server's clock when it was read (PostgreSQL microseconds).
    read_at: Option<i64>,
    /// What stopped holding, once it did.
    change: Option<Change>,
    /// Why the last round could not read the publication (twice, the second time on a new
    /// connection); `None` once a round did.
    unreadable: Option<String>,
}

/// The outbox tables of `outbox` (the table-less outbox needs no publication entry).
fn watched(outbox: &OutboxConfig) -> Vec<Watched> {
    outbox
        .tables
        .iter()
        .filter_map(|r| match &r.source {
            RouteSource::Table { schema, table } => Some((schema.clone(), table.clone())),
            RouteSource::Messages { .. } => None,
        })
        .collect()
}

/// The tables the watch follows, and their OIDs when the session started.
pub(super) struct Baseline {
    tables: Vec<Watched>,
    oids: Vec<Option<u32>>,
}

/// The first reading, on the session's control connection before it streams (a later one
/// could miss a replacement made meanwhile): `None` when there is no outbox table to watch.
pub(super) async fn baseline(
    open: &OpenSession,
    publication: &str,
    outbox: &OutboxConfig,
) -> Result<Option<Baseline>, OpenError> {
    let tables = watched(outbox);
    if tables.is_empty() {
        return Ok(None);
    }
    let first = open.publication(publication, &tables).await?;
    Ok(Some(Baseline {
        oids: first.tables.iter().map(|t| t.oid).collect(),
        tables,
    }))
}

/// Whether `now` still covers `tables` as `first` found them (their OIDs); the change when not.
fn judge(tables: &[Watched], first: &[Option<u32>], c: &Coverage) -> Option<Change> {
    if !c.exists {
        return Some(Change::Dropped);
    }
    if !c.insert {
        return Some(Change::InsertsOff);
    }
    for ((t, first), now) in tables.iter().zip(first).zip(&c.tables) {
        let implicit = now.member && !now.listed;
        match first {
            Some(was) if now.oid != Some(*was) && !implicit => {
                return Some(Change::Replaced {
                    table: sql_name(t),
                    was: *was,
                    now: now.oid,
                    published: now.member,
                })
            }
            _ if !now.member => return Some(Change::NotPublished { table: sql_name(t) }),
            _ if now.partitioned && !c.via_root => {
                return Some(Change::PartitionsByName { table: sql_name(t) })
            }
            _ => {}
        }
    }
    None
}

/// The relay's side of the watch: which position may be confirmed. See the module docs.
pub(super) struct Gate {
    start: Lsn,
    watch: Option<Watch>,
}

struct Watch {
    verdict: watch::Receiver<Verdict>,
    ask: mpsc::Sender<()>,
    task: JoinHandle<()>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Gate {
    /// A gate for a session starting at `start`, watching `publication`'s coverage of the
    /// tables of `baseline` on connections to `conn`, a round every `interval` (at least
    /// [`SETTLE`]). With no table to watch, it holds nothing back.
    pub(super) fn start(
        conn: &ConnInfo,
        publication: &str,
        baseline: Option<Baseline>,
        interval: Duration,
        start: Lsn,
    ) -> Gate {
        let Some(Baseline { tables, oids }) = baseline else {
            return Gate { start, watch: None };
        };
        let (tx, verdict) = watch::channel(Verdict::default());
        let (ask, asked) = mpsc::channel(1);
        let rounds = Rounds {
            conn: conn.clone(),
            publication: publication.to_owned(),
            tables,
            client: None,
            first: oids,
            candidate: None,
        };
        let task = tokio::spawn(rounds.run(interval.max(SETTLE), tx, asked));
        Gate {
            start,
            watch: Some(Watch { verdict, ask, task }),
        }
    }

    /// The newest position that may be confirmed (`Lsn::MAX` when nothing is watched).
    pub(super) fn bound(&self) -> Lsn {
        match &self.watch {
            Some(w) => w.verdict.borrow().released.max(self.start),
            None => Lsn(u64::MAX),
        }
    }

    /// What to send PostgreSQL for a checkpoint `frontier`.
    pub(super) fn confirmable(&self, frontier: Lsn) -> Lsn {
        frontier.min(self.bound())
    }

    /// The change the watch found, with the server's clock at the newest release (before the
    /// change, PostgreSQL microseconds).
    pub(super) fn change(&self) -> Option<(Change, Option<i64>)> {
        let w = self.watch.as_ref()?;
        let v = w.verdict.borrow();
        v.change.clone().map(|c| (c, v.read_at))
    }

    /// Why the publication cannot be read, when the last round could not: the relay then ends
    /// the session (a server shutting down waits for its walsender's client to confirm the
    /// end of its WAL, which walbox cannot do without a reading; it disconnects instead).
    pub(super) fn unreadable(&self) -> Option<String> {
        self.watch.as_ref()?.verdict.borrow().unreadable.clone()
    }

    /// Asks for one last round and waits (bounded) until it released `frontier` or found a
    /// change: for the final status of a session.
    pub(super) async fn settle(&mut self, frontier: Lsn) {
        if self.confirmable(frontier) >= frontier || self.unreadable().is_some() {
            return;
        }
        let Some(w) = self.watch.as_mut() else {
            return;
        };
        let _ = w.ask.try_send(());
        let done = w
            .verdict
            .wait_for(|v| v.change.is_some() || v.released >= frontier);
        if tokio::time::timeout(LAST_ROUND, done).await.is_err() {
            tracing::warn!(
                frontier = %frontier,
                "the publication could not be read in time: the final status confirms only up to {}; what follows is sent again after restart",
                self.bound()
            );
        }
    }
}

/// The watch's own state between rounds.
struct Rounds {
    conn: ConnInfo,
    publication: String,
    tables: Vec<Watched>,
    client: Option<tokio_postgres::Client>,
    /// The tables' OIDs when the session started.
    first: Vec<Option<u32>>,
    /// The position read by the previous round, and the server's clock then.
    candidate: Option<(Lsn, i64)>,
}

/// How a round ended.
enum Round {
    /// Still covered; releases the position of the round before (none on the first).
    Covered(Option<(Lsn, i64)>),
    /// Not any more.
    Changed(Change),
}

impl Rounds {
    async fn run(
        mut self,
        interval: Duration,
        tx: watch::Sender<Verdict>,
        mut asked: mpsc::Receiver<()>,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let last = tokio::select! {
                _ = tick.tick() => false,
                Some(()) = asked.recv() => true,
            };
            let outcome = match self.round(last).await {
                // Once more on a new connection before the relay hears of it.
                Err(_) => {
                    self.client = None;
                    self.round(last).await
                }
                done => done,
            };
            match outcome {
                Ok(Round::Changed(change)) => {
                    tracing::debug!(?change, "the publication stopped covering the outbox");
                    tx.send_modify(|v| v.change = Some(change));
                    return;
                }
                Ok(Round::Covered(released)) => {
                    tx.send_modify(|v| {
                        v.unreadable = None;
                        if let Some((lsn, at)) = released.filter(|(lsn, _)| *lsn > v.released) {
                            v.released = lsn;
                            v.read_at = Some(at);
                        }
                    });
                }
                Err(e) => {
                    self.client = None;
                    tx.send_modify(|v| v.unreadable = Some(e));
                }
            }
        }
    }

    /// One round; the last one of a session reads its position first, then waits [`SETTLE`].
    async fn round(&mut self, last: bool) -> Result<Round, String> {
        if self.client.as_ref().is_none_or(|c| c.is_closed()) {
            let client = connect_control(&self.conn)
                .await
                .map_err(|e| e.to_string())?;
            self.client = Some(client);
        }
        let Some(client) = self.client.as_ref() else {
            return Ok(Round::Covered(None));
        };
        if last {
            let now = publication::position(client).await;
            self.candidate = Some(now.map_err(|e| e.to_string())?);
            tokio::time::sleep(SETTLE).await;
        }
        let now = publication::read(client, &self.publication, &self.tables)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(change) = judge(&self.tables, &self.first, &now) {
            return Ok(Round::Changed(change));
        }
        let released = self.candidate.take();
        // Read after the snapshot (a failure costs a round, not the release); the last round
        // reads none: the next snapshot would follow too soon.
        if !last {
            match publication::position(client).await {
                Ok(p) => self.candidate = Some(p),
                Err(e) => tracing::debug!(error = %e, "reading the WAL position"),
            }
        }
        Ok(Round::Covered(released))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::publication::TableCoverage;

    fn outbox() -> Vec<Watched> {
        vec![("public".into(), "outbox".into())]
    }

    fn reading(oid: Option<u32>, member: bool, listed: bool) -> Coverage {
        Coverage {
            exists: true,
            insert: true,
            via_root: false,
            tables: vec![TableCoverage {
                oid,
                member,
                listed,
                partitioned: false,
            }],
        }
    }

    #[test]
    fn each_way_of_no_longer_covering_the_table_is_a_change() {
        let (t, first) = (outbox(), [Some(10)]);
        assert_eq!(judge(&t, &first, &reading(Some(10), true, true)), None);
        let table = "\"public\".\"outbox\"".to_owned();
        // DROP TABLE from the publication, SET TABLE other.
        assert_eq!(
            judge(&t, &first, &reading(Some(10), false, false)),
            Some(Change::NotPublished {
                table: table.clone()
            })
        );
        // SET (publish = 'update, delete').
        let off = Coverage {
            insert: false,
            ..reading(Some(10), true, true)
        };
        assert_eq!(judge(&t, &first, &off), Some(Change::InsertsOff));
        let gone = Coverage {
            exists: false,
            ..reading(Some(10), false, false)
        };
        assert_eq!(judge(&t, &first, &gone), Some(Change::Dropped));
        // A partitioned outbox whose partitions' rows come under their own names.
        let mut by_name = reading(Some(10), true, true);
        by_name.tables[0].partitioned = true;
        assert_eq!(
            judge(&t, &first, &by_name),
            Some(Change::PartitionsByName {
                table: table.clone()
            })
        );
        by_name.via_root = true;
        assert_eq!(judge(&t, &first, &by_name), None);
        // Renamed away (or dropped), then created again: unpublished, or published since.
        for published in [false, true] {
            assert_eq!(
                judge(&t, &first, &reading(Some(11), published, published)),
                Some(Change::Replaced {
                    table: table.clone(),
                    was: 10,
                    now: Some(11),
                    published,
                })
            );
        }
        assert_eq!(
            judge(&t, &first, &reading(None, false, false)),
            Some(Change::Replaced {
                table,
                was: 10,
                now: None,
                published: false,
            })
        );
    }

    #[test]
    fn a_table_replaced_under_a_publication_covering_it_from_its_creation_is_no_change() {
        // FOR ALL TABLES / FOR TABLES IN SCHEMA: included without being listed.
        assert_eq!(
            judge(&outbox(), &[Some(10)], &reading(Some(11), true, false)),
            None
        );
    }

    #[tokio::test]
    async fn nothing_is_held_back_without_a_table_and_the_start_before_a_release() {
        let conn: ConnInfo = "postgresql://u@127.0.0.1:1/db".parse().unwrap();
        let open = Gate::start(&conn, "p", None, SETTLE, Lsn(100));
        assert_eq!(open.confirmable(Lsn(500)), Lsn(500));
        assert_eq!(open.change(), None);
        // Nothing answers on port 1: nothing is released past the session's start.
        let first = Baseline {
            tables: outbox(),
            oids: vec![Some(10)],
        };
        let held = Gate::start(&conn, "p", Some(first), SETTLE, Lsn(100));
        assert_eq!(held.confirmable(Lsn(500)), Lsn(100));
        assert_eq!(held.confirmable(Lsn(50)), Lsn(50));
    }
}
