//! Shards: one outbox relayed through several logical replication slots, each carrying one
//! hash bucket of the aggregate id, so one walsender (one core) is no longer the ceiling.
//!
//! # Mechanism
//! Publication row filters (PostgreSQL 15+). Shard `k` of `N` has its own publication,
//! `<publication>_<k>of<N>`, `FOR TABLE <outbox> WHERE ((hash(<aggregate_id>) & 2147483647) % N
//! = k)`, and its own slot, `<slot>_<k>of<N>`. The hash is PostgreSQL's built-in hash of the
//! column's type (`hashtext`, `uuid_hash`, `hashint8`, …: immutable, as row filters require), so
//! every event of an aggregate travels through the same shard, in commit order.
//!
//! Measured against a hash-partitioned outbox (one publication per partition), row filters cost
//! the server more (every walsender evaluates the filter on every row: the partitioned outbox
//! took 39–44 % less server CPU at 4 shards in the last three runs, docs/performance.md
//! "Shards"); they are used because
//! they need no change to the user's table and let `walbox reshard` change N without moving a
//! row. Each walsender still decodes all of the WAL; only the output (pgoutput, network, relay)
//! is divided, which bounds a sharded outbox at `1 / decode` (docs/performance.md, the cost
//! model).
//!
//! # Invariants
//! - A layout of one shard is the unsharded `slot` and `publication`, without a filter: a
//!   deployment that never sets `postgres.shards` is unchanged.
//! - A sharded publication carries the comment [`comment`] (`walbox shard k of N by <column>`
//!   per table); walbox relays through an existing one only when the comment matches, so a
//!   publication made by hand for another split is never taken for a shard.
//! - Logical messages reach every slot whatever the publication, so a table-less outbox cannot
//!   be sharded (`postgres.shards` validation).
//! - Changing the number of shards goes through `walbox reshard` ([`reshard`]), which keeps
//!   every aggregate's order across the change.

use postgres_protocol::escape::escape_identifier as quote_ident;
use tokio_postgres::Client;

use crate::config::ShardOf;
use crate::failure::{Classify, Failure};
use crate::lsn::Lsn;

/// The prefix of the non-transactional logical message `walbox reshard` writes at the reshard
/// point: the old layout's shards relay what commits before it, the new one's what commits
/// after it.
pub const RESHARD_PREFIX: &str = "walbox.reshard";

/// Oldest server with publication row filters.
pub const MIN_SERVER_VERSION: i32 = 150_000;

/// PostgreSQL's built-in hash function for a column type as `format_type` names it, when
/// shards support that type.
pub fn hash_function(type_name: &str) -> Option<&'static str> {
    let base = type_name.split('(').next().unwrap_or(type_name).trim();
    Some(match base {
        "text" | "character varying" | "name" => "hashtext",
        "character" => "hashbpchar",
        "uuid" => "uuid_hash",
        "bigint" => "hashint8",
        "integer" => "hashint4",
        "smallint" => "hashint2",
        _ => return None,
    })
}

/// The row filter of `shard` on `column` of type `type_name`; `None` when the type has no
/// supported hash (text, varchar, char, uuid, bigint, integer, smallint).
pub fn row_filter(column: &str, type_name: &str, shard: ShardOf) -> Option<String> {
    let hash = hash_function(type_name)?;
    Some(format!(
        "(({hash}({}) & 2147483647) % {} = {})",
        quote_ident(column),
        shard.count,
        shard.index
    ))
}

/// The comment walbox puts on a shard's publication, naming the split it filters by: the
/// shard and, per table, the column hashed.
pub fn comment(shard: ShardOf, keys: &[(String, String)]) -> String {
    let by: Vec<String> = keys.iter().map(|(t, c)| format!("{t}.{c}")).collect();
    format!(
        "walbox shard {} of {} by {}",
        shard.index,
        shard.count,
        by.join(", ")
    )
}

/// A publication's comment, if any.
pub async fn publication_comment(
    client: &Client,
    publication: &str,
) -> Result<Option<String>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await?;
    Ok(row.and_then(|r| r.get::<_, Option<String>>(0)))
}

/// One walbox slot of this database as found: which layout it belongs to and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundSlot {
    /// The slot's name.
    pub name: String,
    /// The shard it relays; `None`: the unsharded slot.
    pub shard: Option<ShardOf>,
    /// `confirmed_flush_lsn`.
    pub confirmed: Lsn,
    /// Whether a walsender streams from it.
    pub active: bool,
}

impl FoundSlot {
    /// How many shards its layout has (1 for the unsharded slot).
    pub fn count(&self) -> u32 {
        self.shard.map_or(1, |s| s.count)
    }
}

/// Parses `<base>_<k>of<N>` (or `<base>` itself) into the shard it names.
pub fn parse_slot_name(base: &str, name: &str) -> Option<Option<ShardOf>> {
    if name == base {
        return Some(None);
    }
    let rest = name.strip_prefix(base)?.strip_prefix('_')?;
    let (k, n) = rest.split_once("of")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(k) || !digits(n) || (k.len() > 1 && k.starts_with('0')) {
        return None;
    }
    let (index, count) = (k.parse().ok()?, n.parse().ok()?);
    (count >= 2 && index < count).then_some(Some(ShardOf { index, count }))
}

/// Every slot of this database named after `base` (the unsharded slot and every layout's
/// shards), ordered by layout and shard.
pub async fn find_slots(
    client: &Client,
    base: &str,
) -> Result<Vec<FoundSlot>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT slot_name::text, confirmed_flush_lsn::text, active FROM pg_replication_slots \
             WHERE database = current_database() AND (slot_name = $1 OR starts_with(slot_name, $1 || '_'))",
            &[&base],
        )
        .await?;
    let mut found: Vec<FoundSlot> = rows
        .iter()
        .filter_map(|r| {
            let name: String = r.get(0);
            let shard = parse_slot_name(base, &name)?;
            let confirmed = r
                .get::<_, Option<String>>(1)
                .and_then(|l| l.parse().ok())
                .unwrap_or(Lsn::ZERO);
            Some(FoundSlot {
                name,
                shard,
                confirmed,
                active: r.get(2),
            })
        })
        .collect();
    found.sort_by_key(|s| (s.count(), s.shard.map_or(0, |s| s.index)));
    Ok(found)
}

/// The slots found do not fit `postgres.shards`.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// The query failed.
    #[error("postgres: {0}")]
    Query(#[from] tokio_postgres::Error),
    /// The outbox is relayed through another number of shards.
    #[error("postgres.shards = {configured}, but the outbox is relayed through {found} shard(s) (slots {slots}): set postgres.shards = {found}, or change the number of shards with `walbox reshard --to {configured}` (docs/sharding.md)")]
    Mismatch {
        /// `postgres.shards`.
        configured: u32,
        /// The layout found.
        found: u32,
        /// Its slots.
        slots: String,
    },
    /// Slots of two layouts exist: a reshard did not finish.
    #[error("slots of {layouts} exist (slots {slots}): a `walbox reshard` did not finish; run it again with the same --to, with walbox stopped (docs/sharding.md)")]
    Unfinished {
        /// The layouts, e.g. "1 and 4 shards".
        layouts: String,
        /// Every slot found.
        slots: String,
    },
}

impl Classify for LayoutError {
    /// Another layout of slots is the configuration's (exit 3: set `postgres.shards`, or
    /// finish the reshard); the query's error is its SQLSTATE's.
    fn failure(&self) -> Option<Failure> {
        match self {
            LayoutError::Query(e) => e.failure(),
            LayoutError::Mismatch { .. } | LayoutError::Unfinished { .. } => Some(Failure::Config),
        }
    }
}

/// Checks that the slots of this database named after `pg`'s base slot belong to the layout
/// of `postgres.shards` only (or that there are none yet): relaying one layout while another
/// holds slots would publish events twice and out of order. A session that drains a shard for
/// `walbox reshard` (`drain_to`) is exempt.
pub async fn check_layout(
    client: &Client,
    pg: &crate::config::PostgresConfig,
) -> Result<(), LayoutError> {
    if pg.drain_to.is_some() {
        return Ok(());
    }
    let found = find_slots(client, pg.base_slot()).await?;
    let mut counts: Vec<u32> = found.iter().map(FoundSlot::count).collect();
    counts.dedup();
    let names = || {
        found
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match counts.as_slice() {
        [] => Ok(()),
        [one] if *one == pg.shards => Ok(()),
        [one] => Err(LayoutError::Mismatch {
            configured: pg.shards,
            found: *one,
            slots: names(),
        }),
        many => Err(LayoutError::Unfinished {
            layouts: format!(
                "{} shards",
                many.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
            slots: names(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_parse_back_to_their_shard() {
        let s = |index, count| Some(Some(ShardOf { index, count }));
        assert_eq!(parse_slot_name("walbox", "walbox"), Some(None));
        assert_eq!(parse_slot_name("walbox", "walbox_0of4"), s(0, 4));
        assert_eq!(parse_slot_name("walbox", "walbox_13of16"), s(13, 16));
        for other in [
            "walbox_4of4",
            "walbox_0of1",
            "walbox_01of4",
            "walbox_xof4",
            "walbox_0of",
            "walbox2",
            "walbox_other",
            "walboxes_0of2",
        ] {
            assert_eq!(parse_slot_name("walbox", other), None, "{other}");
        }
        // The suffix the configuration makes is the one parsed.
        let shard = ShardOf { index: 2, count: 3 };
        assert_eq!(
            parse_slot_name("w", &format!("w{}", shard.suffix())),
            Some(Some(shard))
        );
    }

    #[test]
    fn row_filters_use_the_types_own_hash_and_never_overflow() {
        let shard = ShardOf { index: 1, count: 4 };
        assert_eq!(
            row_filter("aggregate_id", "text", shard).unwrap(),
            "((hashtext(\"aggregate_id\") & 2147483647) % 4 = 1)"
        );
        assert_eq!(
            row_filter("k", "character varying(64)", shard).unwrap(),
            "((hashtext(\"k\") & 2147483647) % 4 = 1)"
        );
        assert!(row_filter("k", "uuid", shard)
            .unwrap()
            .contains("uuid_hash"));
        assert!(row_filter("k", "bigint", shard)
            .unwrap()
            .contains("hashint8"));
        assert_eq!(row_filter("k", "jsonb", shard), None);
    }
}
