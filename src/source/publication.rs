//! What the publication covers, read while streaming: the readings the relay's publication
//! watch (`relay::coverage`) takes on a control connection of its own, each in one statement.
//!
//! - [`read`]: for each outbox table, its OID (by name), whether the publication exists,
//!   publishes INSERTs, and includes the table, in one statement, hence one snapshot of the
//!   catalog. Membership is asked of the catalogs directly (`FOR ALL TABLES`, then
//!   `pg_publication_rel`), and of `pg_publication_tables` only when neither says yes (schemas,
//!   partitions), so that a publication `FOR ALL TABLES` in a database of many tables costs no
//!   more than one listing its tables.
//! - [`position`]: the server's WAL position (`pg_current_wal_lsn()`, on a standby
//!   `pg_last_wal_replay_lsn()`) and its clock.
//!
//! The two are separate statements on purpose: a snapshot taken after a position was read sees
//! every change committed before that position (on a primary once its commit is visible; see
//! `relay::coverage` for the time it is given).

use tokio_postgres::Client;

use crate::lsn::Lsn;
use crate::timestamp::unix_micros_to_pg_micros;

/// One outbox table as a reading found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableCoverage {
    /// Its OID, `None` when no table of that name exists.
    pub oid: Option<u32>,
    /// Whether the publication publishes it (by name: a table of that name, whatever its OID).
    pub member: bool,
    /// Whether the publication lists it (`pg_publication_rel`), rather than covering it through
    /// `FOR ALL TABLES` or `FOR TABLES IN SCHEMA`, which cover a new table from its creation.
    pub listed: bool,
    /// Whether it is a partitioned table.
    pub partitioned: bool,
}

/// The publication as one reading found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coverage {
    /// Whether the publication exists.
    pub exists: bool,
    /// Whether it publishes INSERTs (`pubinsert`).
    pub insert: bool,
    /// Whether it publishes a partitioned table's rows under the table's name
    /// (`publish_via_partition_root`).
    pub via_root: bool,
    /// The outbox tables, in the order asked.
    pub tables: Vec<TableCoverage>,
}

/// Reads what `publication` covers of `tables` (`(schema, table)`), in one snapshot.
pub async fn read(
    client: &Client,
    publication: &str,
    tables: &[(String, String)],
) -> Result<Coverage, tokio_postgres::Error> {
    let schemas: Vec<&str> = tables.iter().map(|(s, _)| s.as_str()).collect();
    let names: Vec<&str> = tables.iter().map(|(_, t)| t.as_str()).collect();
    let rows = client
        .query(
            "SELECT p.oid IS NOT NULL, coalesce(p.pubinsert, false), c.oid, \
                    c.oid IS NOT NULL AND p.oid IS NOT NULL AND (p.puballtables OR listed.yes \
                      OR EXISTS (SELECT 1 FROM pg_publication_tables t WHERE t.pubname = p.pubname \
                                 AND t.schemaname = r.schema AND t.tablename = r.name)), \
                    coalesce(listed.yes, false), coalesce(c.relkind = 'p', false), \
                    coalesce(p.pubviaroot, false) \
             FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS r(schema, name, ord) \
             LEFT JOIN pg_publication p ON p.pubname = $1 \
             LEFT JOIN pg_namespace n ON n.nspname = r.schema \
             LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = r.name \
                                 AND c.relkind IN ('r', 'p') \
             LEFT JOIN LATERAL (SELECT EXISTS (SELECT 1 FROM pg_publication_rel pr \
                                WHERE pr.prpubid = p.oid AND pr.prrelid = c.oid) AS yes) listed \
                       ON true \
             ORDER BY r.ord",
            &[&publication, &schemas, &names],
        )
        .await?;
    let exists = rows.first().is_some_and(|r| r.get(0));
    let insert = rows.first().is_some_and(|r| r.get(1));
    let via_root = rows.first().is_some_and(|r| r.get(6));
    Ok(Coverage {
        exists,
        insert,
        via_root,
        tables: rows
            .iter()
            .map(|r| TableCoverage {
                oid: r.get(2),
                member: r.get(3),
                listed: r.get(4),
                partitioned: r.get(5),
            })
            .collect(),
    })
}

/// The server's WAL position (written, on a standby replayed) and its clock (PostgreSQL
/// microseconds since 2000-01-01), read together.
pub async fn position(client: &Client) -> Result<(Lsn, i64), tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                    ELSE pg_current_wal_lsn() END::text, \
                    (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
            &[],
        )
        .await?;
    let lsn = row
        .get::<_, Option<String>>(0)
        .and_then(|t| t.parse::<Lsn>().ok())
        .unwrap_or(Lsn::ZERO);
    Ok((lsn, unix_micros_to_pg_micros(row.get(1))))
}
