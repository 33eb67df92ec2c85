//! Start-up checks and set-up on the ordinary (control) connection: server version and
//! `wal_level`, the outbox table and its columns, the publication, the slot.
//!
//! Everything here runs before streaming starts, so a misconfiguration is reported as one
//! actionable line instead of surfacing later as a protocol error. Objects are created only when
//! asked (`create_publication`, `create_slot`); a publication created by walbox is
//! `FOR TABLE <outbox> WITH (publish = 'insert')`. The slot itself is created on the replication
//! connection (`CREATE_REPLICATION_SLOT … LOGICAL pgoutput`), see [`crate::source::replication`].
//!
//! The readings ([`server`], [`table_shape`], [`publication`], [`slot_state`]) are public: `walbox
//! check` (`crate::preflight`) asks the same queries and, where a verdict is this module's,
//! prints this module's message, so the preflight and the relay cannot disagree.

use tokio_postgres::Client;

use crate::config::{OutboxConfig, PostgresConfig, Route, RouteSource};
use crate::failure::{Classify, Failure};
use crate::lsn::Lsn;
use crate::source::slot;
use crate::source::standby::{self, Role, StandbyError};
use postgres_protocol::escape::escape_identifier as quote_ident;

/// Why a standby invalidated a slot when the server (16) gives no `invalidation_reason`.
pub const STANDBY_CONFLICT: &str = "the standby invalidated it because it conflicted with recovery (the primary removed catalog rows it needed, or lowered wal_level; keep hot_standby_feedback = on and primary_slot_name set on the standby)";

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
    /// A key or payload column whose Connect schema walbox does not reproduce.
    #[error("outbox table {table}: column {column:?} is {type_name}, and walbox writes JsonConverter's bytes only for {supported} {what} columns (use the string converter, or change the column's type)")]
    ConnectType {
        /// `schema.table`.
        table: String,
        /// The column.
        column: String,
        /// Its type.
        type_name: String,
        /// `key` or `payload`.
        what: &'static str,
        /// The types walbox reproduces.
        supported: &'static str,
    },
    /// A mapped column does not exist.
    #[error("outbox table {table} has no column {column:?} (fix outbox.{setting}, or the table)")]
    MissingColumn {
        /// `schema.table`.
        table: String,
        /// The column.
        column: String,
        /// The setting naming it.
        setting: String,
    },
    /// The topic template needs a column the table lacks.
    #[error("outbox table {table} has no topic column and no column {column:?}, which topic {topic:?} needs (set outbox.columns, topic or fallback_topic)")]
    NoTopicColumn {
        /// `schema.table`.
        table: String,
        /// The missing column.
        column: String,
        /// The template.
        topic: String,
    },
    /// A partitioned table in a publication without `publish_via_partition_root`.
    #[error("outbox table {table} is partitioned but publication {publication:?} publishes its partitions under their own names: run ALTER PUBLICATION {publication} SET (publish_via_partition_root = true)")]
    PartitionsNotViaRoot {
        /// The publication.
        publication: String,
        /// `schema.table`.
        table: String,
    },
    /// The table-less outbox needs PostgreSQL 14.
    #[error("[outbox.messages] needs PostgreSQL 14 or newer (logical messages in pgoutput); this server is {0}")]
    MessagesNeed14(String),
    /// The publication does not exist and may not be created.
    #[error("publication {0:?} does not exist: create it with CREATE PUBLICATION {0} FOR TABLE <outbox> WITH (publish = 'insert'), or set postgres.create_publication = true")]
    MissingPublication(String),
    /// The publication does not publish the outbox table.
    #[error("publication {publication:?} does not include {table}: run ALTER PUBLICATION {publication} ADD TABLE {table}; if walbox relayed it before, the rows committed while it was not published never reach the slot: republish them afterwards (walbox republish --since <when it left the publication>)")]
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
        /// What is wrong with it (plugin, database, temporary, …).
        reason: String,
    },
    /// `postgres.url` names a standby that cannot be decoded from.
    #[error(transparent)]
    Standby(#[from] StandbyError),
    /// `postgres.failover_slot` on a server older than 17.
    #[error("postgres.failover_slot needs PostgreSQL 17 or newer (failover slots); this server is {0}: set postgres.failover_slot = false (before 17 a logical slot does not survive a failover of the primary: see docs/operations.md, \"Failover of the primary\")")]
    FailoverNeeds17(String),
    /// `postgres.failover_slot` while `postgres.url` names a standby.
    #[error("postgres.failover_slot applies to a slot on the primary, but postgres.url names a standby: point postgres.url at the primary (listing the primary and its standby, walbox passes the standby over while it is in recovery: target_session_attrs=read-write, the default with failover_slot); the standby's synchronized copy of the slot cannot be decoded before a promotion")]
    FailoverOnStandby,
    /// The slot on a standby is a copy synchronized from the primary (PostgreSQL 17+
    /// `sync_replication_slots`), which nothing may decode before the standby is promoted.
    #[error("replication slot {0:?} on this standby is synchronized from the primary (synced = true, sync_replication_slots): PostgreSQL lets nothing decode it before the standby is promoted. Point postgres.url at the primary with postgres.failover_slot = true (listing both servers, walbox follows the slot through a promotion), or give walbox a slot of its own on the standby (another postgres.slot)")]
    SyncedSlot(String),
    /// `postgres.shards > 1` on a server without publication row filters.
    #[error("postgres.shards > 1 needs PostgreSQL 15 or newer (publication row filters); this server is {0}: set postgres.shards = 1")]
    ShardsNeed15(String),
    /// The aggregate id column has a type shards cannot hash.
    #[error("outbox table {table}: column {column:?} is {type_name}, which shards cannot hash (text, varchar, char, uuid, bigint, integer, smallint): set postgres.shards = 1, or shard by a column of one of those types (outbox.columns.aggregate_id)")]
    ShardKeyType {
        /// `schema.table`.
        table: String,
        /// The aggregate id column.
        column: String,
        /// Its type.
        type_name: String,
    },
    /// A publication with a shard's name that walbox did not make for this split.
    #[error("publication {publication:?} exists but is not walbox's {expected:?} (its comment is {found:?}): drop it, or choose another postgres.publication")]
    NotAShard {
        /// The publication.
        publication: String,
        /// The comment walbox would have put on it.
        expected: String,
        /// Its comment.
        found: String,
    },
    /// The slots found belong to another number of shards.
    #[error(transparent)]
    Layout(#[from] crate::shard::LayoutError),
    /// The slot was invalidated.
    #[error("replication slot {slot:?} is lost (wal_status = lost, confirmed up to {confirmed}): {cause}, so events after {confirmed} may never be relayed; see the runbook \"Slot lost\" before recreating it")]
    SlotLost {
        /// The slot.
        slot: String,
        /// Its last confirmed position.
        confirmed: Lsn,
        /// Why PostgreSQL invalidated it ([`slot::invalidation_cause`]).
        cause: String,
    },
}

impl Classify for CatalogError {
    fn failure(&self) -> Option<Failure> {
        match self {
            CatalogError::Query(e) => e.failure(),
            CatalogError::SlotLost { .. } => Some(Failure::SlotLost),
            CatalogError::Standby(e) => e.failure(),
            CatalogError::Layout(e) => e.failure(),
            _ => Some(Failure::Schema),
        }
    }
}

/// The slot as found (or created) at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotState {
    /// `confirmed_flush_lsn`: where streaming resumes.
    pub confirmed_flush_lsn: Lsn,
    /// `restart_lsn`: the oldest WAL the slot keeps. Unlike `confirmed_flush_lsn`, it is
    /// written to disk every time it advances, so the same slot never shows less of it again,
    /// crash or restart in between (the confirmed position can go back to the last one saved).
    pub restart_lsn: Lsn,
    /// Whether the slot is a failover slot (PostgreSQL 17+; `None` before).
    pub failover: Option<bool>,
}

/// Checks server (and, on a standby, what decoding there needs), the shard layout, tables and
/// publication; creates the publication when asked. Returns where `postgres.url` points.
pub async fn prepare(
    client: &Client,
    pg: &PostgresConfig,
    outbox: &OutboxConfig,
) -> Result<Role, CatalogError> {
    prepare_objects(client, pg, outbox, true).await
}

/// [`prepare`]; `layout` says whether the slots found must belong to `postgres.shards`' layout
/// alone (`walbox reshard` prepares the new layout's publications while the old one's slots
/// still exist).
pub async fn prepare_objects(
    client: &Client,
    pg: &PostgresConfig,
    outbox: &OutboxConfig,
    layout: bool,
) -> Result<Role, CatalogError> {
    let Server {
        version_num: num,
        version,
        wal_level,
    } = server(client).await?;
    if num < MIN_SERVER_VERSION {
        return Err(CatalogError::TooOld(version));
    }
    let role = standby::role(client).await?;
    if pg.failover_slot && num < 170_000 {
        return Err(CatalogError::FailoverNeeds17(version));
    }
    if pg.failover_slot && role == Role::Standby {
        return Err(CatalogError::FailoverOnStandby);
    }
    if role == Role::Standby {
        // A slot the standby already invalidated is the graver news (exit 7): it comes first.
        slot_state(client, &pg.slot).await?;
        standby::check(client, pg.primary.as_ref(), num, &version).await?;
    }
    if wal_level != "logical" {
        return Err(CatalogError::WalLevel(wal_level));
    }
    if outbox.messages.is_some() && num < 140_000 {
        return Err(CatalogError::MessagesNeed14(version));
    }
    if pg.shard.is_some() && num < crate::shard::MIN_SERVER_VERSION {
        return Err(CatalogError::ShardsNeed15(version));
    }
    if layout {
        crate::shard::check_layout(client, pg).await?;
    }

    let mut tables = Vec::new();
    let mut shard_keys = Vec::new();
    for route in &outbox.tables {
        let RouteSource::Table { schema, table } = &route.source else {
            continue;
        };
        let shape = table_shape(client, route, schema, table).await?;
        let mut qualified = format!("{}.{}", quote_ident(schema), quote_ident(table));
        if let Some(shard) = pg.shard {
            let column = &route.columns.aggregate_id;
            let type_name = shape.column_type(column).unwrap_or_default();
            let filter = crate::shard::row_filter(column, type_name, shard).ok_or_else(|| {
                CatalogError::ShardKeyType {
                    table: route.name.to_string(),
                    column: column.clone(),
                    type_name: type_name.to_owned(),
                }
            })?;
            shard_keys.push((route.name.to_string(), column.clone()));
            qualified = format!("{qualified} WHERE {filter}");
        }
        tables.push((
            route.name.to_string(),
            qualified,
            schema,
            table,
            shape.partitioned,
        ));
    }
    let shard_comment = pg.shard.map(|s| crate::shard::comment(s, &shard_keys));

    match publication(client, &pg.publication).await? {
        None if role == Role::Standby => {
            return Err(StandbyError::MissingPublication(pg.publication.clone()).into())
        }
        None if pg.create_publication => {
            let list: Vec<&str> = tables.iter().map(|t| t.1.as_str()).collect();
            let via_root = if tables.iter().any(|t| t.4) {
                ", publish_via_partition_root = true"
            } else {
                ""
            };
            let sql = if list.is_empty() {
                format!(
                    "CREATE PUBLICATION {} WITH (publish = 'insert')",
                    quote_ident(&pg.publication)
                )
            } else {
                format!(
                    "CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert'{via_root})",
                    quote_ident(&pg.publication),
                    list.join(", ")
                )
            };
            match &shard_comment {
                // One transaction: a shard's publication never exists without its comment.
                Some(comment) => {
                    client
                        .batch_execute(&format!(
                            "BEGIN; {sql}; COMMENT ON PUBLICATION {} IS {}; COMMIT",
                            quote_ident(&pg.publication),
                            postgres_protocol::escape::escape_literal(comment)
                        ))
                        .await?
                }
                None => client.batch_execute(&sql).await?,
            }
            tracing::info!(publication = %pg.publication, tables = ?tables.iter().map(|t| &t.0).collect::<Vec<_>>(), "created publication");
        }
        None => return Err(CatalogError::MissingPublication(pg.publication.clone())),
        Some(publication) => {
            if let Some(expected) = shard_comment {
                let found = crate::shard::publication_comment(client, &pg.publication)
                    .await?
                    .unwrap_or_default();
                if found != expected {
                    return Err(CatalogError::NotAShard {
                        publication: pg.publication.clone(),
                        expected,
                        found,
                    });
                }
            }
            if !publication.insert {
                return Err(CatalogError::InsertsNotPublished(pg.publication.clone()));
            }
            for (name, _, schema, table, partitioned) in &tables {
                if *partitioned && !publication.via_root {
                    return Err(CatalogError::PartitionsNotViaRoot {
                        publication: pg.publication.clone(),
                        table: name.clone(),
                    });
                }
                if !publication
                    .tables
                    .contains(&(schema.to_string(), table.to_string()))
                {
                    return Err(CatalogError::TableNotPublished {
                        publication: pg.publication.clone(),
                        table: name.clone(),
                    });
                }
            }
        }
    }
    Ok(role)
}

/// An outbox table as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableShape {
    /// Whether it is a partitioned table.
    pub partitioned: bool,
    /// Its columns: name and type (`format_type`, e.g. `timestamp with time zone`).
    pub columns: Vec<(String, String)>,
}

impl TableShape {
    /// The type of column `name`, if the table has it.
    pub fn column_type(&self, name: &str) -> Option<&str> {
        self.columns
            .iter()
            .find(|(c, _)| c == name)
            .map(|(_, t)| t.as_str())
    }
}

/// Checks that the table exists with the mapped columns; returns its shape.
pub async fn table_shape(
    client: &Client,
    route: &Route,
    schema: &str,
    table: &str,
) -> Result<TableShape, CatalogError> {
    let name = route.name.to_string();
    let rows = client
        .query(
            "SELECT c.relkind = 'p', a.attname::text, format_type(a.atttypid, a.atttypmod) \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
             WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p') ORDER BY a.attnum",
            &[&schema, &table],
        )
        .await?;
    let Some(first) = rows.first() else {
        return Err(CatalogError::MissingTable(name));
    };
    let shape = TableShape {
        partitioned: first.get(0),
        columns: rows
            .iter()
            .filter_map(|r| {
                Some((
                    r.get::<_, Option<String>>(1)?,
                    r.get::<_, Option<String>>(2)?,
                ))
            })
            .collect(),
    };
    let has = |c: &str| shape.column_type(c).is_some();
    let c = &route.columns;
    let mut required: Vec<(&str, String)> = vec![
        (c.id.as_str(), "columns.id".into()),
        (c.aggregate_id.as_str(), "columns.aggregate_id".into()),
        (c.payload.as_str(), "columns.payload".into()),
    ];
    if let Some(t) = &c.timestamp {
        required.push((t, "columns.timestamp".into()));
    }
    if let Some(p) = &c.partition {
        required.push((p, "columns.partition".into()));
    }
    for (col, _) in &route.headers {
        required.push((col, format!("headers.{col}")));
    }
    for (col, _) in &route.envelope {
        required.push((col, format!("envelope.{col}")));
    }
    for (column, setting) in required {
        if !has(column) {
            return Err(CatalogError::MissingColumn {
                table: name,
                column: column.to_owned(),
                setting,
            });
        }
    }
    connect_types(route, &shape)?;
    // Routing: every variable the topic template uses needs its column, unless a topic column
    // or a fallback topic covers rows without it.
    if !c.topic.as_deref().is_some_and(has) && route.fallback_topic.is_none() {
        for (var, col) in [
            ("${aggregate_type}", &c.aggregate_type),
            ("${event_type}", &c.event_type),
        ] {
            if route.topic.contains(var) && !has(col) {
                return Err(CatalogError::NoTopicColumn {
                    table: name,
                    column: col.clone(),
                    topic: route.topic.clone(),
                });
            }
        }
    }
    Ok(shape)
}

/// A route that writes JsonConverter's bytes needs key and payload columns of types whose
/// Connect schema walbox reproduces ([`crate::outbox::connect::ColumnType`]).
fn connect_types(route: &Route, shape: &TableShape) -> Result<(), CatalogError> {
    use crate::config::Converter;
    use crate::source::column_type::ColumnType;
    let checks = [
        (
            route.converters.key,
            &route.columns.aggregate_id,
            "key",
            "text, varchar, char, uuid, json, jsonb, smallint, integer and bigint",
        ),
        (
            route.converters.value,
            &route.columns.payload,
            "payload",
            "text, varchar, char, uuid, json, jsonb, bytea, smallint, integer and bigint",
        ),
    ];
    for (converter, column, what, supported) in checks {
        if converter == Converter::String {
            continue;
        }
        let type_name = shape.column_type(column).unwrap_or_default();
        let ok = match ColumnType::of_name(type_name) {
            Some(ColumnType::Bytes) => what == "payload",
            Some(_) => true,
            None => false,
        };
        if !ok {
            return Err(CatalogError::ConnectType {
                table: route.name.to_string(),
                column: column.clone(),
                type_name: type_name.to_owned(),
                what,
                supported,
            });
        }
    }
    Ok(())
}

/// Each table route's NOT NULL columns, in `outbox.tables` order (empty for a route that does
/// not write Connect's bytes, or a table not found): whether a key or payload column is
/// nullable decides its Connect schema's `optional` ([`crate::outbox::connect`]).
pub async fn not_null_columns(
    client: &impl tokio_postgres::GenericClient,
    outbox: &OutboxConfig,
) -> Result<Vec<Vec<String>>, tokio_postgres::Error> {
    let mut all = Vec::with_capacity(outbox.tables.len());
    for route in &outbox.tables {
        let RouteSource::Table { schema, table } = &route.source else {
            all.push(Vec::new());
            continue;
        };
        if !route.writes_connect_bytes() {
            all.push(Vec::new());
            continue;
        }
        let rows = client
            .query(
                "SELECT a.attname::text, a.attnotnull, a.atthasdef FROM pg_attribute a \
                 JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
                &[schema, table],
            )
            .await?;
        let c = &route.columns;
        for r in &rows {
            let name: String = r.get(0);
            let json = |side: crate::config::Converter| side != crate::config::Converter::String;
            let schema_has_it = (name == c.aggregate_id && json(route.converters.key))
                || (name == c.payload && json(route.converters.value));
            if r.get::<_, bool>(2) && schema_has_it {
                // Debezium carries a column's default in its schema (`"default":…`) and
                // JsonConverter writes it for a null value; walbox does neither.
                tracing::warn!(table = %route.name, column = %name, "the column has a DEFAULT: Debezium's JsonConverter schema for it carries the default, and writes it for a NULL; walbox's does not (docs/migrating.md)");
            }
        }
        all.push(
            rows.iter()
                .filter(|r| r.get::<_, bool>(1))
                .map(|r| r.get(0))
                .collect(),
        );
    }
    Ok(all)
}

/// The server's version and `wal_level`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// `server_version_num`, e.g. 150004.
    pub version_num: i32,
    /// `server_version`, e.g. `15.4 (Debian 15.4-1)`.
    pub version: String,
    /// `wal_level`.
    pub wal_level: String,
}

/// Reads [`Server`].
pub async fn server(client: &Client) -> Result<Server, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT current_setting('server_version_num')::int, current_setting('server_version'), current_setting('wal_level')",
            &[],
        )
        .await?;
    Ok(Server {
        version_num: row.get(0),
        version: row.get(1),
        wal_level: row.get(2),
    })
}

/// A publication as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publication {
    /// `FOR ALL TABLES`.
    pub all_tables: bool,
    /// Publishes INSERTs.
    pub insert: bool,
    /// Publishes UPDATEs.
    pub update: bool,
    /// Publishes DELETEs.
    pub delete: bool,
    /// Publishes TRUNCATEs.
    pub truncate: bool,
    /// `publish_via_partition_root`.
    pub via_root: bool,
    /// The tables it publishes (`pg_publication_tables`), as `(schema, table)`.
    pub tables: Vec<(String, String)>,
}

/// Looks publication `name` up. `Ok(None)` when it does not exist.
pub async fn publication(
    client: &Client,
    name: &str,
) -> Result<Option<Publication>, tokio_postgres::Error> {
    let Some(row) = client
        .query_opt(
            "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot \
             FROM pg_publication WHERE pubname = $1",
            &[&name],
        )
        .await?
    else {
        return Ok(None);
    };
    let tables = client
        .query(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1 \
             ORDER BY 1, 2",
            &[&name],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    Ok(Some(Publication {
        all_tables: row.get(0),
        insert: row.get(1),
        update: row.get(2),
        delete: row.get(3),
        truncate: row.get(4),
        via_root: row.get(5),
        tables,
    }))
}

/// The column `walbox republish --since` compares for the outbox's rows, for the command walbox
/// prints after a lost or dropped slot: the first table's `outbox.columns.timestamp` when set,
/// else that table's first column of a timestamp type (one with a default first, as
/// `created_at timestamptz DEFAULT now()`). `None`: no table route, or no such column.
pub async fn time_column(
    client: &Client,
    outbox: &OutboxConfig,
) -> Result<Option<String>, tokio_postgres::Error> {
    let Some((route, schema, table)) = outbox.tables.iter().find_map(|r| match &r.source {
        RouteSource::Table { schema, table } => Some((r, schema, table)),
        RouteSource::Messages { .. } => None,
    }) else {
        return Ok(None);
    };
    if let Some(column) = &route.columns.timestamp {
        return Ok(Some(column.clone()));
    }
    let row = client
        .query_opt(
            "SELECT a.attname::text FROM pg_attribute a \
             JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped \
               AND a.atttypid IN ('timestamptz'::regtype, 'timestamp'::regtype) \
             ORDER BY a.atthasdef DESC, a.attnum LIMIT 1",
            &[&schema, &table],
        )
        .await?;
    Ok(row.map(|r| r.get(0)))
}

/// Looks the slot up. `Ok(None)` when it does not exist; an error when it cannot be streamed
/// from: another plugin or database, lost, or on a standby a copy synchronized from the primary.
pub async fn slot_state(client: &Client, slot: &str) -> Result<Option<SlotState>, CatalogError> {
    let row = client
        .query_opt(
            "SELECT s.plugin::text, s.slot_type, s.database::text = current_database(), \
                    s.confirmed_flush_lsn::text, s.wal_status, \
                    to_jsonb(s) ->> 'invalidation_reason', \
                    coalesce((to_jsonb(s)->>'conflicting')::bool, false), \
                    (to_jsonb(s)->>'failover')::bool, \
                    coalesce((to_jsonb(s)->>'synced')::bool, false) AND pg_is_in_recovery(), \
                    s.restart_lsn::text \
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
    // `invalidation_reason` exists from 17 on (NULL before, see `source::slot`); `conflicting`
    // (16+): a standby invalidated the slot in a conflict with recovery (16 gives no reason).
    let reason: Option<String> = row.get(5);
    if row.get::<_, Option<String>>(4).as_deref() == Some("lost") || reason.is_some() {
        let cause = if row.get::<_, bool>(6) {
            STANDBY_CONFLICT.to_owned()
        } else {
            slot::invalidation_cause(reason.as_deref())
        };
        return Err(CatalogError::SlotLost {
            slot: slot.to_owned(),
            confirmed,
            cause,
        });
    }
    if row.get::<_, bool>(8) {
        return Err(CatalogError::SyncedSlot(slot.to_owned()));
    }
    let restart = row
        .get::<_, Option<String>>(9)
        .and_then(|t| t.parse::<Lsn>().ok())
        .unwrap_or(Lsn::ZERO);
    Ok(Some(SlotState {
        confirmed_flush_lsn: confirmed,
        restart_lsn: restart,
        failover: row.get(7),
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
