//! The consumer's PostgreSQL: batches of one partition's records in one transaction, a bounded
//! set of connections, the start-up check and the retention clean-up.
//!
//! # Invariants
//! - A batch (consecutive records of one partition) is applied in exactly one transaction:
//!   `BEGIN`; one multi-row `INSERT INTO <inbox> … ON CONFLICT DO NOTHING RETURNING message_id`;
//!   the effect for each record whose row that inserted, in offset order (or, with
//!   `effect.batch_sql`, one statement for all of them, their elements in `$records` in offset
//!   order, see [`super::set_effect`]); `COMMIT`. Requests
//!   are pipelined: `BEGIN` with the `INSERT`, the effects with the `COMMIT` (the whole
//!   transaction in one round trip when there is no effect). An error anywhere rolls the whole
//!   transaction back, inbox rows included, so a failed batch leaves no trace and can be
//!   retried, split or dead-lettered record by record ([`BatchError::at`] says which record
//!   failed).
//! - Within a batch the first record with a message id wins; later ones with the same id are
//!   duplicates and run no effect, exactly as if they came in a later transaction.
//! - Every value is computed before `BEGIN` ([`Statements::prepare`]): a record that cannot be
//!   bound never opens a transaction.
//! - Connections are handed out by a [`Pool`] of at most `effect.max_parallel`, which is what
//!   bounds how many partitions are processed at once.
//! - A connection that saw a connection-level error is dropped, never reused.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement};

use crate::config::conninfo::ConnInfo;
use crate::failure::{self, Class, Classify, Failure};
use crate::pg::control::{connect_control, ConnectError};
use postgres_protocol::escape::escape_identifier as quote_ident;

use super::config::InboxConfig;
use super::effect::{EffectSql, InvalidRecord, Record};
use super::set_effect::{self, BatchSql, Element};

type Value = Box<dyn ToSql + Sync + Send>;

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
    /// The set-based effect cannot take the record: its payload is not JSON (why). The
    /// record's fault, like a data error of the effect.
    #[error("effect failed: {0}")]
    NotJson(String),
    /// The record cannot be processed at all.
    #[error("invalid record: {0}")]
    Invalid(#[from] InvalidRecord),
}

fn pg_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// The class of a statement's error: walbox's one classification ([`failure::sqlstate`]), in
/// which the replication-only failures (slot in use, slot lost) mean nothing here: the
/// database's trouble, retried.
fn statement_class(e: &tokio_postgres::Error) -> Class {
    match e.as_db_error() {
        Some(db) => code_class(db.code().code(), db.message()),
        // No SQLSTATE: the connection failed.
        None => Class::Transient,
    }
}

fn code_class(code: &str, message: &str) -> Class {
    match failure::sqlstate(code, message) {
        Class::Fatal(Failure::SlotInUse | Failure::SlotLost) => Class::Transient,
        class => class,
    }
}

/// How the caller treats a [`StoreError`]: whose fault it is, the record's or the database's.
///
/// | error | class | whose | what happens |
/// |---|---|---|---|
/// | a transient SQLSTATE (`08…` connection, `53…` resources, `57P…` shutdown/restart, `58…` system, `XX…` internal, `40001`, `40P01`, `55P03`), no SQLSTATE, or a slot failure | [`Class::Transient`] | the database's | retried with backoff, indefinitely, not counted against `effect.retries` |
/// | `42…` missing object, syntax, `42501` privilege, `28…`, `3D000`, `0A000`, `55000`; a connection refused for good | [`Class::Fatal`] | the database's | walbox stops (exit 5 or 4), the offset uncommitted; at start-up and at run time alike |
/// | any other SQLSTATE: `22…` data, `23…` constraint, `P0001` raised exception, user-defined codes | [`Class::Effect`] | the record's | counted retries, then `effect.on_error` |
/// | [`StoreError::Invalid`] | [`Class::Rejected`] | the record's | `effect.on_invalid` |
impl StoreError {
    /// Classifies the error (see the table above).
    pub fn class(&self) -> Class {
        match self {
            StoreError::Invalid(_) => Class::Rejected,
            StoreError::NotJson(_) => Class::Effect,
            // The relay's classification: an interrupted TLS handshake or a network outage is
            // transient, never an authentication failure.
            StoreError::Connect(e) => match e.failure() {
                Some(f) => Class::Fatal(f),
                None => Class::Transient,
            },
            // Data errors (a stored payload that is not JSON, a failing effect) are the
            // record's; a renamed table or a revoked privilege is not, whichever statement
            // meets it.
            StoreError::Inbox(e) | StoreError::Effect(e) => statement_class(e),
        }
    }

    /// Whether the connection must be dropped.
    pub fn broken_connection(&self) -> bool {
        match self {
            StoreError::Inbox(e) | StoreError::Effect(e) => e.is_closed() || e.code().is_none(),
            StoreError::Connect(_) => true,
            StoreError::Invalid(_) | StoreError::NotJson(_) => false,
        }
    }
}

impl Classify for StoreError {
    /// The exit status when this error stops the inbox: the database's failure, or, for the
    /// record's error under `fail`, [`Failure::InboxRecord`].
    fn failure(&self) -> Option<Failure> {
        match self.class() {
            Class::Fatal(f) => Some(f),
            Class::Rejected | Class::Effect => Some(Failure::InboxRecord),
            Class::Transient => None,
        }
    }
}

/// What a committed transaction did with one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A new row was inserted and the effect (if any) applied.
    Applied,
    /// The message id was already in the inbox: nothing was done.
    Duplicate,
}

/// A record with every value it binds, ready for [`Statements::apply`].
pub struct Prepared {
    /// The record.
    pub record: Record,
    message_id: String,
    effect: Option<Vec<Value>>,
    /// Its element of the set-based effect's `$records`.
    element: Option<Element>,
    stored: Option<Stored>,
}

/// What the stored-inbox form writes besides the record's position.
struct Stored {
    key: Option<String>,
    headers: String,
    payload: Option<String>,
}

/// Why a batch's transaction was rolled back.
#[derive(Debug)]
pub struct BatchError {
    /// The record whose effect failed, when the failure is one record's; `None` when the
    /// transaction failed as a whole (connection, `BEGIN`/`COMMIT`, the inbox statement).
    pub at: Option<usize>,
    /// The error.
    pub error: StoreError,
}

/// One connection with its prepared statements.
pub struct Conn {
    client: Client,
    insert: Statement,
    effect: Option<Statement>,
    batch_effect: Option<Statement>,
}

/// Statement texts and settings shared by all connections.
#[derive(Debug)]
pub struct Statements {
    conn: ConnInfo,
    insert_sql: String,
    insert_types: Vec<Type>,
    effect: Option<EffectSql>,
    batch_effect: Option<BatchSql>,
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
        // One statement for the whole batch: the rows come from arrays, in batch order
        // (`WITH ORDINALITY`), so a message id repeated within the batch keeps its first record.
        let (insert_sql, insert_types) = if config.effect.store_record {
            (
                format!(
                    "INSERT INTO {table} (consumer, message_id, topic, kafka_partition, kafka_offset, message_key, headers, payload) \
                     SELECT $1, u.id, $3, $4, u.off, u.key, u.headers::jsonb, u.payload::jsonb \
                     FROM unnest($2::text[], $5::int8[], $6::text[], $7::text[], $8::text[]) \
                     WITH ORDINALITY AS u(id, off, key, headers, payload, n) ORDER BY u.n \
                     ON CONFLICT DO NOTHING RETURNING message_id"
                ),
                vec![
                    Type::TEXT,
                    Type::TEXT_ARRAY,
                    Type::TEXT,
                    Type::INT4,
                    Type::INT8_ARRAY,
                    Type::TEXT_ARRAY,
                    Type::TEXT_ARRAY,
                    Type::TEXT_ARRAY,
                ],
            )
        } else {
            (
                format!(
                    "INSERT INTO {table} (consumer, message_id) \
                     SELECT $1, u.id FROM unnest($2::text[]) WITH ORDINALITY AS u(id, n) ORDER BY u.n \
                     ON CONFLICT DO NOTHING RETURNING message_id"
                ),
                vec![Type::TEXT, Type::TEXT_ARRAY],
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
            batch_effect: config.effect.batch_sql.clone(),
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
        let batch_effect = match &self.batch_effect {
            Some(b) => Some(
                client
                    .prepare_typed(&b.sql, &[Type::TEXT])
                    .await
                    .map_err(StoreError::Effect)?,
            ),
            None => None,
        };
        Ok(Conn {
            client,
            insert,
            effect,
            batch_effect,
        })
    }

    /// Computes everything a record binds; an [`InvalidRecord`] (no usable message id, a key
    /// or header that is not UTF-8 where text is needed) can never be applied.
    pub fn prepare(&self, record: Record) -> Result<Prepared, Box<(Record, InvalidRecord)>> {
        let bound = (|| {
            let message_id = record.message_id(&self.message_id_header)?.to_owned();
            let effect = match &self.effect {
                Some(e) => Some(e.values(&record, &message_id)?),
                None => None,
            };
            let element = match &self.batch_effect {
                Some(_) => Some(Element::of(&record, &message_id)?),
                None => None,
            };
            let stored = if self.store_record {
                Some(Stored {
                    key: record.key_text()?.map(str::to_owned),
                    headers: record.headers_json()?,
                    payload: record.payload_text()?.map(str::to_owned),
                })
            } else {
                None
            };
            Ok((message_id, effect, element, stored))
        })();
        match bound {
            Ok((message_id, effect, element, stored)) => Ok(Prepared {
                record,
                message_id,
                effect,
                element,
                stored,
            }),
            Err(e) => Err(Box::new((record, e))),
        }
    }

    /// Applies `batch` (consecutive records of one partition) in one transaction; see the
    /// module invariants. On success, one [`Outcome`] per record, in order.
    ///
    /// Two round trips with an effect, one without: `BEGIN` and the inbox `INSERT` are sent
    /// together (with `COMMIT` when there is no effect), then the effects and `COMMIT`. After
    /// the first error the server ignores the rest of the transaction ("current transaction is
    /// aborted") and answers the pipelined `COMMIT` with a rollback, so nothing after a failure
    /// commits.
    pub async fn apply(
        &self,
        conn: &mut Conn,
        batch: &[Prepared],
    ) -> Result<Vec<Outcome>, BatchError> {
        let whole = |error| BatchError { at: None, error };
        let Some(first) = batch.first() else {
            return Ok(Vec::new());
        };
        let client = &conn.client;
        let ids: Vec<&str> = batch.iter().map(|p| p.message_id.as_str()).collect();
        let offsets: Vec<i64>;
        let keys: Vec<Option<&str>>;
        let headers: Vec<Option<&str>>;
        let payloads: Vec<Option<&str>>;
        let params: Vec<&(dyn ToSql + Sync)> = if self.store_record {
            offsets = batch.iter().map(|p| p.record.offset).collect();
            let column = |f: fn(&Stored) -> Option<&str>| -> Vec<Option<&str>> {
                batch
                    .iter()
                    .map(|p| p.stored.as_ref().and_then(f))
                    .collect()
            };
            keys = column(|s| s.key.as_deref());
            headers = column(|s| Some(s.headers.as_str()));
            payloads = column(|s| s.payload.as_deref());
            vec![
                &self.consumer,
                &ids,
                &first.record.topic,
                &first.record.partition,
                &offsets,
                &keys,
                &headers,
                &payloads,
            ]
        } else {
            vec![&self.consumer, &ids]
        };
        // Futures send their request when first polled, and `join` polls them in this order.
        let commit_at_once = conn.effect.is_none() && conn.batch_effect.is_none();
        let (begun, inserted, committed) = futures_util::future::join3(
            client.batch_execute("BEGIN"),
            client.query(&conn.insert, &params),
            async {
                if commit_at_once {
                    Some(client.batch_execute("COMMIT").await)
                } else {
                    None
                }
            },
        )
        .await;
        begun.map_err(|e| whole(StoreError::Inbox(e)))?;
        let inserted = match inserted {
            Ok(rows) => rows,
            Err(e) => {
                if !commit_at_once {
                    rollback(client).await.map_err(whole)?;
                }
                return Err(whole(StoreError::Inbox(e)));
            }
        };
        let outcomes = outcomes(batch, &inserted).map_err(whole)?;
        if commit_at_once {
            if let Some(Err(e)) = committed {
                return Err(whole(StoreError::Inbox(e)));
            }
            return Ok(outcomes);
        }
        if !outcomes.contains(&Outcome::Applied) {
            rollback(client).await.map_err(whole)?;
            return Ok(outcomes);
        }
        let applied: Vec<usize> = (0..batch.len())
            .filter(|&i| outcomes[i] == Outcome::Applied)
            .collect();
        let stmt = match (&conn.effect, &conn.batch_effect) {
            (Some(stmt), _) => stmt,
            (None, Some(stmt)) => {
                apply_set(client, stmt, batch, &applied).await?;
                return Ok(outcomes);
            }
            // Not reached: without an effect the COMMIT went with the INSERT. Never left open.
            (None, None) => {
                client
                    .batch_execute("COMMIT")
                    .await
                    .map_err(|e| whole(StoreError::Inbox(e)))?;
                return Ok(outcomes);
            }
        };
        let params: Vec<Vec<&(dyn ToSql + Sync)>> = applied
            .iter()
            .map(|&i| {
                batch[i]
                    .effect
                    .iter()
                    .flatten()
                    .map(|v| v.as_ref() as &(dyn ToSql + Sync))
                    .collect()
            })
            .collect();
        // Sent in order, answered in order: the server runs them one after the other.
        let (results, committed) = futures_util::future::join(
            futures_util::future::join_all(params.iter().map(|p| client.execute(stmt, p))),
            client.batch_execute("COMMIT"),
        )
        .await;
        if let Some((k, e)) = results
            .into_iter()
            .enumerate()
            .find_map(|(k, r)| r.err().map(|e| (k, e)))
        {
            // The COMMIT rolled the transaction back; if it could not even be sent, the
            // connection is gone and the server rolls back.
            return Err(BatchError {
                at: Some(applied[k]),
                error: StoreError::Effect(e),
            });
        }
        committed.map_err(|e| whole(StoreError::Inbox(e)))?;
        Ok(outcomes)
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

/// Which records of `batch` the inbox INSERT made new: the first record with each returned id;
/// every other record is a duplicate.
fn outcomes(
    batch: &[Prepared],
    inserted: &[tokio_postgres::Row],
) -> Result<Vec<Outcome>, StoreError> {
    let mut new: HashSet<&str> = HashSet::with_capacity(inserted.len());
    for row in inserted {
        new.insert(row.try_get(0).map_err(StoreError::Inbox)?);
    }
    Ok(batch
        .iter()
        .map(|p| {
            if new.remove(p.message_id.as_str()) {
                Outcome::Applied
            } else {
                Outcome::Duplicate
            }
        })
        .collect())
}

/// The set-based effect of a batch whose new records are `applied` (indices into `batch`),
/// pipelined with `COMMIT`: the statement gets their elements as one `$records` array. A record
/// whose payload is not JSON fails alone, before the statement is sent; a failing statement
/// names its record only when it had one.
async fn apply_set(
    client: &Client,
    stmt: &Statement,
    batch: &[Prepared],
    applied: &[usize],
) -> Result<(), BatchError> {
    let whole = |error| BatchError { at: None, error };
    let mut elements = Vec::with_capacity(applied.len());
    for &i in applied {
        match &batch[i].element {
            Some(Element::Json(e)) => elements.push(e.as_str()),
            Some(Element::NotJson(why)) => {
                rollback(client).await.map_err(whole)?;
                return Err(BatchError {
                    at: Some(i),
                    error: StoreError::NotJson(why.clone()),
                });
            }
            None => {
                rollback(client).await.map_err(whole)?;
                return Err(whole(StoreError::Invalid(InvalidRecord(
                    "no $records element was prepared".into(),
                ))));
            }
        }
    }
    let records = set_effect::array(elements.into_iter());
    let (result, committed) = futures_util::future::join(
        client.execute(stmt, &[&records]),
        client.batch_execute("COMMIT"),
    )
    .await;
    if let Err(e) = result {
        // The COMMIT rolled the transaction back (or the connection is gone).
        return Err(BatchError {
            at: match applied {
                [only] => Some(*only),
                _ => None,
            },
            error: StoreError::Effect(e),
        });
    }
    committed.map_err(|e| whole(StoreError::Inbox(e)))?;
    Ok(())
}

/// Rolls the open transaction back. An error here means the connection is unusable: it is
/// returned so the caller drops the connection.
async fn rollback(client: &Client) -> Result<(), StoreError> {
    client
        .batch_execute("ROLLBACK")
        .await
        .map_err(StoreError::Inbox)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(code: &str) -> Class {
        code_class(code, "")
    }

    #[test]
    fn data_errors_are_the_records_and_missing_objects_the_databases() {
        // The record's: data, constraints, raised exceptions, user-defined codes.
        for code in [
            "22P02", "22003", "23505", "23503", "P0001", "P0004", "U0001",
        ] {
            assert_eq!(class(code), Class::Effect, "{code}");
        }
        // The database's, fatal: a renamed table or function, a revoked privilege.
        for code in ["42P01", "42883", "42703", "3D000", "3F000", "0A000"] {
            assert_eq!(class(code), Class::Fatal(Failure::Schema), "{code}");
        }
        for code in ["42501", "28P01"] {
            assert_eq!(class(code), Class::Fatal(Failure::Auth), "{code}");
        }
        // The database's, retried: connections, resources, restarts, I/O, conflicts.
        for code in [
            "08006", "53300", "53100", "57P01", "58030", "XX000", "40001", "40P01", "55P03",
            "55006", "58P01",
        ] {
            assert_eq!(class(code), Class::Transient, "{code}");
        }
    }
}
