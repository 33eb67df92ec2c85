//! Start-up checks and set-up on the ordinary (control) connection: server version and
//! `wal_level`, the outbox table and its columns, the publication, the slot.
//!
//! Everything here runs before streaming starts, so a misconfiguration is reported as one
//! actionable line instead of surfacing later as a protocol error. Objects are created only when
//! asked (`create_publication`, `create_slot`); a publication created by walbox is
//! `FOR TABLE <outbox> WITH (publish = 'insert')`. The slot itself is created on the replication
//! connection (`CREATE_REPLICATION_SLOT … LOGICAL pgoutput`), see [`crate::source::replication`].

use tokio_postgres::Client;

use crate::config::{OutboxConfig, PostgresConfig};
use crate::source::lsn::Lsn;

/// Oldest supported server (`server_version_num`).
pub const MIN_SERVER_VERSION: i32 = 130_000;

/// A start-up check failed.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// A catalog query failed.
    #[error("postgres: {0}")]
    Query(#[from] tokio_postgres::Error),
    /// The server is older than PostgreSQL 13.
    #[error("PostgreSQL {0} is not supported: walbox needs PostgreSQL 13 or newer")]
    TooOld(String),
    /// `wal_level` is not `logical`.
    #[error(
        "wal_level is {0:?}: set wal_level = logical in postgresql.conf and restart PostgreSQL"
    )]
    WalLevel(String),
    /// The outbox table does not exist.
    #[error(
        "outbox table {0} does not exist (check outbox.table and the database in postgres.url)"
    )]
    MissingTable(String),
    /// A mapped column does not exist.
    #[error("outbox table {table} has no column {column:?} (set outbox.columns.{setting} to the right name)")]
    MissingColumn {
        /// `schema.table`.
        table: String,
        /// The column.
        column: String,
        /// The setting naming it.
        setting: &'static str,
    },
    /// Neither topic nor aggregate type column exists.
    #[error("outbox table {0} has neither a topic nor an aggregate_type column, so no topic can be chosen (set outbox.columns.topic or outbox.columns.aggregate_type)")]
    NoTopicColumn(String),
    /// The publication does not exist and may not be created.
    #[error("publication {0:?} does not exist: create it with CREATE PUBLICATION {0} FOR TABLE <outbox> WITH (publish = 'insert'), or set postgres.create_publication = true")]
    MissingPublication(String),
    /// The publication does not publish the outbox table.
    #[error("publication {publication:?} does not include {table}: run ALTER PUBLICATION {publication} ADD TABLE {table}")]
    TableNotPublished {
        /// The publication.
        publication: String,
        /// `schema.table`.
        table: String,
    },
    /// The publication does not publish INSERTs.
    #[error("publication {0:?} does not publish inserts: run ALTER PUBLICATION {0} SET (publish = 'insert')")]
    InsertsNotPublished(String),
    /// The slot does not exist and may not be created.
    #[error("replication slot {0:?} does not exist: set postgres.create_slot = true, or create it with SELECT pg_create_logical_replication_slot('{0}', 'pgoutput')")]
    MissingSlot(String),
    /// The slot exists but is not a pgoutput slot of this database.
    #[error("replication slot {slot:?} is not usable: {reason}")]
    WrongSlot {
        /// The slot.
        slot: String,
        /// Why.
        reason: String,
    },
    /// The slot was invalidated.
    #[error("replication slot {slot:?} is lost (wal_status = lost, confirmed up to {confirmed}): PostgreSQL removed WAL it still needed, so events after {confirmed} may never be relayed; see the runbook \"Slot lost\" before recreating it")]
    SlotLost {
        /// The slot.
        slot: String,
        /// Its last confirmed position.
        confirmed: Lsn,
    },
}

/// The slot as found (or created) at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotState {
    /// `confirmed_flush_lsn`: where streaming resumes.
    pub confirmed_flush_lsn: Lsn,
}

/// Quotes an identifier for SQL.
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// Checks server, table and publication; creates the publication when asked.
pub async fn prepare(
    client: &Client,
    pg: &PostgresConfig,
    outbox: &OutboxConfig,
) -> Result<(), CatalogError> {
    let row = client
        .query_one(
            "SELECT current_setting('server_version_num')::int, current_setting('server_version'), current_setting('wal_level')",
            &[],
        )
        .await?;
    let (num, version, wal_level): (i32, String, String) = (row.get(0), row.get(1), row.get(2));
    if num < MIN_SERVER_VERSION {
        return Err(CatalogError::TooOld(version));
    }
    if wal_level != "logical" {
        return Err(CatalogError::WalLevel(wal_level));
    }

    let table = format!("{}.{}", outbox.schema, outbox.table);
    let rows = client
        .query(
            "SELECT a.attname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
             WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')",
            &[&outbox.schema, &outbox.table],
        )
        .await?;
    if rows.is_empty() {
        return Err(CatalogError::MissingTable(table));
    }
    let columns: Vec<String> = rows.iter().filter_map(|r| r.get(0)).collect();
    let has = |c: &str| columns.iter().any(|x| x == c);
    let cols = &outbox.columns;
    for (name, setting) in [
        (&cols.id, "id"),
        (&cols.aggregate_id, "aggregate_id"),
        (&cols.payload, "payload"),
    ] {
        if !has(name) {
            return Err(CatalogError::MissingColumn {
                table,
                column: name.clone(),
                setting,
            });
        }
    }
    if !has(&cols.topic) && !has(&cols.aggregate_type) {
        return Err(CatalogError::NoTopicColumn(table));
    }

    let publication = client
        .query_opt(
            "SELECT pubinsert FROM pg_publication WHERE pubname = $1",
            &[&pg.publication],
        )
        .await?;
    let qualified = format!(
        "{}.{}",
        quote_ident(&outbox.schema),
        quote_ident(&outbox.table)
    );
    match publication {
        None if pg.create_publication => {
            let sql = format!(
                "CREATE PUBLICATION {} FOR TABLE {qualified} WITH (publish = 'insert')",
                quote_ident(&pg.publication)
            );
            client.batch_execute(&sql).await?;
            tracing::info!(publication = %pg.publication, table = %table, "created publication");
        }
        None => return Err(CatalogError::MissingPublication(pg.publication.clone())),
        Some(row) => {
            if !row.get::<_, bool>(0) {
                return Err(CatalogError::InsertsNotPublished(pg.publication.clone()));
            }
            let published = client
                .query_opt(
                    "SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
                    &[&pg.publication, &outbox.schema, &outbox.table],
                )
                .await?;
            if published.is_none() {
                return Err(CatalogError::TableNotPublished {
                    publication: pg.publication.clone(),
                    table,
                });
            }
        }
    }
    Ok(())
}

/// Looks the slot up. `Ok(None)` when it does not exist.
pub async fn slot_state(client: &Client, slot: &str) -> Result<Option<SlotState>, CatalogError> {
    let row = client
        .query_opt(
            "SELECT s.plugin::text, s.slot_type, s.database::text = current_database(), \
                    s.confirmed_flush_lsn::text, s.wal_status \
             FROM pg_replication_slots s WHERE s.slot_name = $1",
            &[&slot],
        )
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let wrong = |reason: String| CatalogError::WrongSlot {
        slot: slot.to_owned(),
        reason,
    };
    let plugin: Option<String> = row.get(0);
    let slot_type: Option<String> = row.get(1);
    let same_db: Option<bool> = row.get(2);
    if slot_type.as_deref() != Some("logical") {
        return Err(wrong(
            "it is a physical slot; walbox needs a logical pgoutput slot".into(),
        ));
    }
    if plugin.as_deref() != Some("pgoutput") {
        return Err(wrong(format!(
            "its output plugin is {:?}; walbox needs pgoutput",
            plugin.unwrap_or_default()
        )));
    }
    if same_db != Some(true) {
        return Err(wrong(
            "it belongs to another database than postgres.url names".into(),
        ));
    }
    let confirmed = row
        .get::<_, Option<String>>(3)
        .and_then(|t| t.parse::<Lsn>().ok())
        .unwrap_or(Lsn::ZERO);
    if row.get::<_, Option<String>>(4).as_deref() == Some("lost") {
        return Err(CatalogError::SlotLost {
            slot: slot.to_owned(),
            confirmed,
        });
    }
    Ok(Some(SlotState {
        confirmed_flush_lsn: confirmed,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_identifiers() {
        assert_eq!(quote_ident("outbox"), "\"outbox\"");
        assert_eq!(quote_ident("we\"ird"), "\"we\"\"ird\"");
    }
}
