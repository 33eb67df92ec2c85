//! The consumer's PostgreSQL: one transaction per record, a bounded set of connections, the
//! start-up check and the retention clean-up.
//!
//! # Invariants
//! - A record is processed in exactly one transaction: `INSERT INTO <inbox> … ON CONFLICT DO
//!   NOTHING`; the effect runs only when that inserted a row; then `COMMIT`. An error anywhere
//!   rolls the whole transaction back, inbox row included, so a failed effect leaves no trace
//!   and the record can be retried or dead-lettered.
//! - Connections are handed out by a [`Pool`] of at most `effect.max_parallel`, which is what
//!   bounds how many partitions are processed at once.
//! - A connection that saw a connection-level error is dropped, never reused.

use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement};

use crate::config::conninfo::ConnInfo;
use crate::failure::Classify;
use crate::failure::Failure;
use crate::pg::control::{connect_control, ConnectError};
use postgres_protocol::escape::escape_identifier as quote_ident;

use super::config::InboxConfig;
use super::effect::{EffectSql, InvalidRecord, Record};

/// Why processing a record failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Connecting failed.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The inbox statement (or BEGIN/COMMIT) failed.
    #[error("inbox statement failed: {}", pg_message(.0))]
    Inbox(#[source] tokio_postgres::Error),
    /// The effect failed.
    #[error("effect failed: {}", pg_message(.0))]
    Effect(#[source] tokio_postgres::Error),
    /// The record cannot be processed at all.
    #[error("invalid record: {0}")]
    Invalid(#[from] InvalidRecord),
}

/// How the caller treats a [`StoreError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Connection lost, server restarting, serialization failure, deadlock: retry without
    /// counting against the effect's retries.
    Transient,
    /// The effect (or, in the stored form, the record's values) failed: counted retries, then
    /// `effect.on_error`.
    Effect,
    /// The record can never be processed: `effect.on_invalid`.
    Invalid,
    /// walbox cannot go on (schema, authentication).
    Fatal(Failure),
}

fn pg_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

fn transient_sqlstate(code: &SqlState) -> bool {
    let c = code.code();
    c.starts_with("08")
        || c.starts_with("53")
        || c.starts_with("57P")
        || *code == SqlState::T_R_SERIALIZATION_FAILURE
        || *code == SqlState::T_R_DEADLOCK_DETECTED
        || *code == SqlState::LOCK_NOT_AVAILABLE
}

impl StoreError {
    /// Classifies the error.
    pub fn class(&self) -> ErrorClass {
        match self {
            StoreError::Invalid(_) => ErrorClass::Invalid,
            // The relay's classification: an interrupted TLS handshake or a network outage is
            // transient, never an authentication failure.
            StoreError::Connect(e) => match e.failure() {
                Some(f) => ErrorClass::Fatal(f),
                None => ErrorClass::Transient,
            },
            StoreError::Inbox(e) => match e.code() {
                None => ErrorClass::Transient,
                Some(c) if transient_sqlstate(c) => ErrorClass::Transient,
                Some(c) if c.code().starts_with("42") => ErrorClass::Fatal(Failure::Schema),
                // Data errors (a stored payload that is not JSON, …) are the record's fault.
                Some(_) => ErrorClass::Effect,
            },
            StoreError::Effect(e) => match e.code() {
                None => ErrorClass::Transient,
                Some(c) if transient_sqlstate(c) => ErrorClass::Transient,
                Some(_) => ErrorClass::Effect,
            },
        }
    }

    /// Whether the connection must be dropped.
    pub fn broken_connection(&self) -> bool {
        match self {
            StoreError::Inbox(e) | StoreError::Effect(e) => e.is_closed() || e.code().is_none(),
            StoreError::Connect(_) => true,
            StoreError::Invalid(_) => false,
        }
    }
}

/// What a committed transaction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A new row was inserted and the effect (if any) applied.
    Applied,
    /// The message id was already in the inbox: nothing was done.
    Duplicate,
}

/// One connection with its prepared statements.
pub struct Conn {
    client: Client,
    insert: Statement,
    effect: Option<Statement>,
}

/// Statement texts and settings shared by all connections.
#[derive(Debug)]
pub struct Statements {
    conn: ConnInfo,
    insert_sql: String,
    insert_types: Vec<Type>,
    effect: Option<EffectSql>,
    store_record: bool,
    consumer: String,
    message_id_header: String,
    table: String,
    delete_sql: String,
}

impl Statements {
    /// Builds the statements from the configuration.
    pub fn new(config: &InboxConfig) -> Statements {
        let table = format!(
            "{}.{}",
            quote_ident(&config.schema),
            quote_ident(&config.table)
        );
        let (insert_sql, insert_types) = if config.effect.store_record {
            (
                format!(
                    "INSERT INTO {table} (consumer, message_id, topic, kafka_partition, kafka_offset, message_key, headers, payload) \
                     VALUES ($1, $2, $3, $4, $5, $6, ($7::jsonb), ($8::jsonb)) ON CONFLICT DO NOTHING"
                ),
                vec![
                    Type::TEXT,
                    Type::TEXT,
                    Type::TEXT,
                    Type::INT4,
                    Type::INT8,
                    Type::TEXT,
                    Type::TEXT,
                    Type::TEXT,
                ],
            )
        } else {
            (
                format!(
                    "INSERT INTO {table} (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING"
                ),
                vec![Type::TEXT, Type::TEXT],
            )
        };
        let delete_sql = format!(
            "DELETE FROM {table} WHERE (consumer, message_id) IN (\
             SELECT consumer, message_id FROM {table} \
             WHERE consumer = $1 AND processed_at < now() - make_interval(secs => $2::float8) LIMIT $3)"
        );
        Statements {
            conn: config.conn.clone(),
            insert_sql,
            insert_types,
            effect: config.effect.sql.clone(),
            store_record: config.effect.store_record,
            consumer: config.consumer.clone(),
            message_id_header: config.kafka.message_id_header.clone(),
            table,
            delete_sql,
        }
    }

    /// The quoted `schema.table` of the inbox.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Opens a connection and prepares the statements (which checks that the inbox table and
    /// whatever the effect calls exist).
    pub async fn connect(&self) -> Result<Conn, StoreError> {
        let client = connect_control(&self.conn).await?;
        let insert = client
            .prepare_typed(&self.insert_sql, &self.insert_types)
            .await
            .map_err(StoreError::Inbox)?;
        let effect = match &self.effect {
            Some(e) => Some(
                client
                    .prepare_typed(&e.sql, &e.types())
                    .await
                    .map_err(StoreError::Effect)?,
            ),
            None => None,
        };
        Ok(Conn {
            client,
            insert,
            effect,
        })
    }

    /// Processes one record in one transaction; see the module invariants.
    pub async fn process(&self, conn: &mut Conn, record: &Record) -> Result<Outcome, StoreError> {
        let message_id = record.message_id(&self.message_id_header)?;
        // Every value is computed before BEGIN: an invalid record never opens a transaction.
        let effect_values = match &self.effect {
            Some(e) => Some(e.values(record, message_id)?),
            None => None,
        };
        let stored = if self.store_record {
            Some((
                record.key_text()?.map(str::to_owned),
                record.headers_json()?,
                record.payload_text()?.map(str::to_owned),
            ))
        } else {
            None
        };

        let tx = conn.client.transaction().await.map_err(StoreError::Inbox)?;
        let inserted = match &stored {
            None => tx
                .execute(&conn.insert, &[&self.consumer, &message_id])
                .await
                .map_err(StoreError::Inbox)?,
            Some((key, headers, payload)) => tx
                .execute(
                    &conn.insert,
                    &[
                        &self.consumer,
                        &message_id,
                        &record.topic,
                        &record.partition,
                        &record.offset,
                        key,
                        headers,
                        payload,
                    ],
                )
                .await
                .map_err(StoreError::Inbox)?,
        };
        if inserted == 0 {
            tx.rollback().await.map_err(StoreError::Inbox)?;
            return Ok(Outcome::Duplicate);
        }
        if let (Some(stmt), Some(values)) = (&conn.effect, &effect_values) {
            let params: Vec<&(dyn ToSql + Sync)> = values
                .iter()
                .map(|v| v.as_ref() as &(dyn ToSql + Sync))
                .collect();
            tx.execute(stmt, &params)
                .await
                .map_err(StoreError::Effect)?;
        }
        tx.commit().await.map_err(StoreError::Inbox)?;
        Ok(Outcome::Applied)
    }

    /// Deletes up to `batch` inbox rows of this consumer older than `keep`; returns how many.
    pub async fn delete_expired(
        &self,
        conn: &Conn,
        keep: std::time::Duration,
        batch: i64,
    ) -> Result<u64, StoreError> {
        conn.client
            .execute(
                &self.delete_sql,
                &[&self.consumer, &keep.as_secs_f64(), &batch],
            )
            .await
            .map_err(StoreError::Inbox)
    }
}

/// At most `size` connections, created on demand, reused while healthy.
pub struct Pool {
    statements: Arc<Statements>,
    idle: Mutex<Vec<Conn>>,
    permits: Arc<Semaphore>,
}

/// A connection borrowed from the [`Pool`]; give it back with [`Pool::put`].
pub struct Lease {
    /// The connection.
    pub conn: Conn,
    _permit: OwnedSemaphorePermit,
}

impl Pool {
    /// A pool of at most `size` connections.
    pub fn new(statements: Arc<Statements>, size: usize) -> Pool {
        Pool {
            statements,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(size)),
        }
    }

    /// The statements.
    pub fn statements(&self) -> &Arc<Statements> {
        &self.statements
    }

    /// Waits for a free slot, then an idle connection or a new one.
    pub async fn get(&self) -> Result<Lease, StoreError> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Invalid(InvalidRecord("pool closed".into())))?;
        let idle = self.idle.lock().ok().and_then(|mut v| v.pop());
        let conn = match idle {
            Some(c) if !c.client.is_closed() => c,
            _ => self.statements.connect().await?,
        };
        Ok(Lease {
            conn,
            _permit: permit,
        })
    }

    /// Returns a healthy connection to the pool.
    pub fn put(&self, lease: Lease) {
        if lease.conn.client.is_closed() {
            return;
        }
        if let Ok(mut v) = self.idle.lock() {
            v.push(lease.conn);
        }
    }
}
