//! The PostgreSQL checks of `walbox check`: the connection, the server and its settings, the
//! role's rights, each outbox table and its mapping (and, with `[outbox.retention]`, what
//! retention needs on it), the publication, the slot.
//!
//! The catalog is read with the relay's own start-up queries (`source::catalog`,
//! `source::slot`); where a verdict is the relay's (a missing column, a slot of another plugin,
//! a lost slot, a standby that cannot decode), the line carries the relay's own message, so an
//! operator sees here the words `walbox run` would stop with.

use postgres_protocol::escape::{escape_identifier as quote_ident, escape_literal};
use tokio_postgres::Client;

use crate::config::conninfo::ConnInfo;
use crate::config::{Config, OnSlotBusy, PostgresConfig};
use crate::failure::{self, Class, Failure};
use crate::pg::control::{connect_control, ConnectError};
use crate::preflight::tables::{
    creation_rights, mapping_check, publication_check, qualified, retention_check, retention_name,
    select_check, select_privilege, table_check, tables, PUBLICATION,
};
use crate::preflight::Check;
use crate::source::catalog::{self, CatalogError, MIN_SERVER_VERSION};
use crate::source::replication::ReplicationConnection;
use crate::source::slot::{self, Capacity, SlotHealth};
use crate::source::standby::{self, Role, StandbyError};

const CONNECTION: &str = "postgres";
const SERVER: &str = "server";
const WAL_LEVEL: &str = "wal_level";
const SLOTS: &str = "max_replication_slots";
const SENDERS: &str = "max_wal_senders";
const ROLE: &str = "role";
const REPLICATION: &str = "replication connection";
const SLOT: &str = "slot";
const KEEP_SIZE: &str = "max_slot_wal_keep_size";
const FAILOVER: &str = "failover slot";
const IDLE_TIMEOUT: &str = "idle_replication_slot_timeout";
const SHARDS: &str = "shards";

/// Every PostgreSQL check, in order.
pub async fn checks(config: &Config) -> Vec<Check> {
    let conn = &config.postgres.conn;
    let client = match connect_control(conn).await {
        Ok(client) => client,
        Err(e) => {
            let mut out = vec![connection_failed(conn, config.postgres.password_key, &e)];
            let mut names: Vec<String> = [SERVER, WAL_LEVEL, SLOTS, SENDERS, ROLE, REPLICATION]
                .map(String::from)
                .into();
            for (route, _, _) in tables(config) {
                names.push(table_check(route));
                names.push(select_check(route));
            }
            names.push(PUBLICATION.into());
            names.extend(config.postgres.shards().iter().map(slot_check_name));
            names.push(KEEP_SIZE.into());
            if config.postgres.failover_slot {
                names.push(FAILOVER.into());
            }
            out.extend(names.into_iter().map(|n| Check::skipped(n, CONNECTION)));
            return out;
        }
    };
    let mut out = Vec::new();
    if let Err(e) = checks_on(&client, config, &mut out).await {
        out.push(Check::fail(
            "catalog queries",
            format!("a catalog query failed: {e}"),
            "check the server's log for this error; the remaining checks did not run",
        ));
    }
    out
}

/// What a failed connection means, and what to do; `password_key` names where the password
/// was set.
fn connection_failed(conn: &ConnInfo, password_key: &str, e: &ConnectError) -> Check {
    let fix = match e.sqlstate() {
        Some("28P01") if password_key == "postgres.url" => {
            "check the user and the password in postgres.url".to_owned()
        }
        Some("28P01") => format!(
            "check the user in postgres.url and the password in {password_key} (it replaces \
             the URL's)"
        ),
        None if e.password_missing() => "the server asks for a password and none is set: name \
             a file holding it in postgres.password_file (WALBOX_POSTGRES_PASSWORD_FILE)"
            .to_owned(),
        Some("28000") => format!(
            "allow role {:?} in pg_hba.conf for database {:?} and for replication",
            conn.user, conn.dbname
        ),
        Some("3D000") => format!(
            "create database {:?}, or fix the database in postgres.url",
            conn.dbname
        ),
        _ if matches!(e, ConnectError::Tls(_)) || e.certificate_rejected() => {
            "check sslmode and sslrootcert in postgres.url against the server's certificate"
                .to_owned()
        }
        _ => "check that PostgreSQL runs and that postgres.url's host and port reach it".to_owned(),
    };
    Check::fail(CONNECTION, format!("{conn}: {e}"), fix)
}

/// The server, its settings and the role's rights, as read once for the checks.
struct Facts {
    role: Role,
    /// `wal_level = logical`.
    logical: bool,
    /// Slots and walsenders, counted for the layout's slots.
    capacity: Capacity,
    /// The layout's slots: `postgres.slot`, or every shard's.
    slots: Vec<String>,
    /// Whether a hot standby walbox may take over (`postgres.on_slot_busy = "wait"`).
    standby: bool,
    /// The current user.
    user: String,
    /// Whether it is a superuser.
    superuser: bool,
    /// Whether it has `REPLICATION`.
    replication: bool,
}

async fn checks_on(
    client: &Client,
    config: &Config,
    out: &mut Vec<Check>,
) -> Result<(), tokio_postgres::Error> {
    let pg = &config.postgres;
    let server = catalog::server(client).await?;
    let role = standby::role(client).await?;
    let where_ = match role {
        Role::Primary => "primary",
        Role::Standby => "standby",
    };
    out.push(Check::ok(CONNECTION, format!("connected to {}", pg.conn)));
    out.push(server_check(client, config, &server, role).await?);
    out.push(if server.wal_level == "logical" {
        Check::ok(WAL_LEVEL, "logical")
    } else {
        Check::fail(
            WAL_LEVEL,
            format!("wal_level is {:?} on the {where_}", server.wal_level),
            "ALTER SYSTEM SET wal_level = 'logical'; then restart PostgreSQL",
        )
    });

    let row = client
        .query_one(
            "SELECT current_user::text, r.rolsuper, r.rolreplication \
             FROM pg_roles r WHERE r.rolname = current_user",
            &[],
        )
        .await?;
    let shards = pg.shards();
    let slots: Vec<String> = shards.iter().map(|s| s.slot.clone()).collect();
    let facts = Facts {
        role,
        logical: server.wal_level == "logical",
        capacity: slot::capacity(client, &slots).await?,
        slots,
        standby: pg.on_slot_busy == OnSlotBusy::Wait,
        user: row.get(0),
        superuser: row.get(1),
        replication: row.get(2),
    };
    out.push(slots_check(&facts));
    out.push(senders_check(&facts));
    out.push(role_check(&facts));
    out.push(replication_check(config).await);

    let mut shapes = Vec::new();
    let mut keys = Vec::new();
    for (route, schema, table) in tables(config) {
        match catalog::table_shape(client, route, schema, table).await {
            Ok(shape) => {
                out.push(mapping_check(route, &qualified(schema, table), &shape));
                out.push(select_privilege(client, route, schema, table).await?);
                if let Some(cfg) = &config.outbox.retention {
                    out.push(retention_check(client, route, cfg).await?);
                }
                let key = &route.columns.aggregate_id;
                let key_type = shape.column_type(key).unwrap_or_default().to_owned();
                keys.push((route.name.to_string(), key.clone(), key_type));
                shapes.push((route, schema, table, shape.partitioned));
            }
            Err(CatalogError::Query(e)) => return Err(e),
            Err(e) => {
                let missing = matches!(e, CatalogError::MissingTable(_));
                out.push(from_catalog(table_check(route), &e));
                if missing {
                    out.push(Check::skipped(select_check(route), &table_check(route)));
                    if config.outbox.retention.is_some() {
                        out.push(Check::skipped(retention_name(route), &table_check(route)));
                    }
                } else {
                    out.push(select_privilege(client, route, schema, table).await?);
                    if let Some(cfg) = &config.outbox.retention {
                        out.push(retention_check(client, route, cfg).await?);
                    }
                }
            }
        }
    }

    if let Some(check) = shards_check(client, config, &server, &keys).await? {
        out.push(check);
    }

    let publication = catalog::publication(client, &pg.publication).await?;
    let creation = match (&publication, pg.create_publication) {
        (None, true) => Some(creation_rights(client, &shapes).await?),
        _ => None,
    };
    out.push(publication_check(
        config,
        facts.role,
        publication.as_ref(),
        &shapes,
        creation.as_deref(),
    ));

    let mut first_health = None;
    for shard in &shards {
        let health = slot::read(client, &shard.slot).await?;
        out.push(slot_check(client, shard, &facts, health.as_ref()).await?);
        first_health = first_health.or(Some(health));
    }
    let health = first_health.flatten();

    if pg.failover_slot {
        out.push(failover_check(client, &pg.conn, &server, role, health.as_ref()).await?);
    }

    let settings = slot::settings(client).await?;
    out.push(match settings.max_slot_wal_keep_bytes {
        Some(bytes) => Check::ok(KEEP_SIZE, format!("{} MiB", bytes >> 20)),
        None => Check::warn(
            KEEP_SIZE,
            "-1 (unlimited): a slot walbox stops reading retains WAL until the disk is full",
            "ALTER SYSTEM SET max_slot_wal_keep_size = '<WAL the disk can hold, e.g. 50GB>'; SELECT pg_reload_conf();",
        ),
    });
    if let Some(check) = idle_timeout_check(&settings) {
        out.push(check);
    }
    Ok(())
}

/// `idle_replication_slot_timeout` (PostgreSQL 18+; `None` before): set, a walbox outage
/// longer than it loses the slot at the next checkpoint.
fn idle_timeout_check(settings: &slot::WalSettings) -> Option<Check> {
    let timeout = settings.idle_replication_slot_timeout.as_deref()?;
    Some(match settings.idle_timeout_seconds {
        None => Check::ok(
            IDLE_TIMEOUT,
            "0 (disabled): an inactive slot is never invalidated for idleness",
        ),
        Some(_) => Check::warn(
            IDLE_TIMEOUT,
            format!("{timeout}: if walbox stays stopped longer than that, PostgreSQL invalidates the slot at the next checkpoint (exit 7, events after its confirmed position only republished)"),
            format!("keep walbox outages shorter than {timeout}, or ALTER SYSTEM SET idle_replication_slot_timeout = 0; SELECT pg_reload_conf();"),
        ),
    })
}

/// The relay's verdict on a catalog object, with the short fix for the JSON report.
fn from_catalog(name: String, e: &CatalogError) -> Check {
    let fix = match e {
        CatalogError::MissingTable(_) => {
            "create the table, or fix outbox.table (and the database in postgres.url)".to_owned()
        }
        CatalogError::MissingColumn {
            table,
            column,
            setting,
        } => format!("set outbox.{setting} to a column of {table}, or add column {column:?} to it"),
        CatalogError::NoTopicColumn { .. } => {
            "add the column, or set outbox.columns.topic, outbox.topic or outbox.fallback_topic"
                .to_owned()
        }
        CatalogError::WrongSlot { slot, .. } => format!(
            "set postgres.slot to another name (walbox creates it with postgres.create_slot = true), or drop this one: SELECT pg_drop_replication_slot({});",
            escape_literal(slot)
        ),
        CatalogError::SlotLost { .. } => {
            "walbox recreate-slot --confirm-data-loss, then the walbox republish it prints (see the runbook)".to_owned()
        }
        CatalogError::Standby(e) => standby_fix(e),
        CatalogError::SyncedSlot(_) => {
            "point postgres.url at the primary (both servers, target_session_attrs=read-write) with postgres.failover_slot = true, or set postgres.slot to a slot of walbox's own on the standby".to_owned()
        }
        _ => "see the detail".to_owned(),
    };
    Check::fail(name, e.to_string(), fix)
}

fn standby_fix(e: &StandbyError) -> String {
    match e {
        StandbyError::TooOld(_) => {
            "point postgres.url to the primary, or upgrade the standby to PostgreSQL 16 or newer"
        }
        StandbyError::NoFeedback => {
            "on the standby: ALTER SYSTEM SET hot_standby_feedback = on; SELECT pg_reload_conf();"
        }
        StandbyError::PrimaryWalLevel(_) => {
            "on the primary: ALTER SYSTEM SET wal_level = 'logical'; then restart it"
        }
        StandbyError::PrimaryInRecovery => "point postgres.primary_url to the primary",
        StandbyError::MissingPublication(_) => {
            "create the publication on the primary: CREATE PUBLICATION … FOR TABLE … WITH (publish = 'insert')"
        }
        StandbyError::Query(_) => "see the detail",
    }
    .to_owned()
}

/// The server's version, what the configuration needs of it, and on a standby what decoding
/// there needs.
async fn server_check(
    client: &Client,
    config: &Config,
    server: &catalog::Server,
    role: Role,
) -> Result<Check, tokio_postgres::Error> {
    if server.version_num < MIN_SERVER_VERSION {
        return Ok(from_catalog(
            SERVER.into(),
            &CatalogError::TooOld(server.version.clone()),
        ));
    }
    if config.outbox.messages.is_some() && server.version_num < 140_000 {
        return Ok(Check::fail(
            SERVER,
            CatalogError::MessagesNeed14(server.version.clone()).to_string(),
            "upgrade to PostgreSQL 14 or newer, or remove [outbox.messages]",
        ));
    }
    if role == Role::Standby {
        if let Err(e) = standby::check(
            client,
            config.postgres.primary.as_ref(),
            server.version_num,
            &server.version,
        )
        .await
        {
            return Ok(from_catalog(SERVER.into(), &CatalogError::Standby(e)));
        }
        return Ok(Check::ok(
            SERVER,
            format!(
                "PostgreSQL {}, a standby (decoding on a standby)",
                server.version
            ),
        ));
    }
    Ok(Check::ok(
        SERVER,
        format!("PostgreSQL {}, primary", server.version),
    ))
}

/// `postgres.shards`: a server with row filters, hashable aggregate ids, and no slots of
/// another layout. `None` for an unsharded configuration with no other layout in place.
async fn shards_check(
    client: &Client,
    config: &Config,
    server: &catalog::Server,
    keys: &[(String, String, String)],
) -> Result<Option<Check>, tokio_postgres::Error> {
    let pg = &config.postgres;
    match crate::shard::check_layout(client, pg).await {
        Ok(()) => {}
        Err(crate::shard::LayoutError::Query(e)) => return Err(e),
        Err(e) => {
            let fix = match &e {
                crate::shard::LayoutError::Mismatch { found, .. } => format!(
                    "set postgres.shards = {found}, or (walbox stopped) walbox reshard --to {}",
                    pg.shards
                ),
                _ => "run walbox reshard again with the same --to, with walbox stopped".to_owned(),
            };
            return Ok(Some(Check::fail(SHARDS, e.to_string(), fix)));
        }
    }
    if pg.shards == 1 {
        return Ok(None);
    }
    if server.version_num < crate::shard::MIN_SERVER_VERSION {
        return Ok(Some(Check::fail(
            SHARDS,
            CatalogError::ShardsNeed15(server.version.clone()).to_string(),
            "upgrade to PostgreSQL 15 or newer, or set postgres.shards = 1",
        )));
    }
    for (table, column, type_name) in keys {
        if crate::shard::hash_function(type_name).is_none() {
            return Ok(Some(Check::fail(
                SHARDS,
                format!("{table}: column {column:?} is {type_name}, which shards cannot hash"),
                "shard by a text, varchar, char, uuid, bigint, integer or smallint column (outbox.columns.aggregate_id), or set postgres.shards = 1",
            )));
        }
    }
    let slots: Vec<String> = pg.shards().into_iter().map(|s| s.slot).collect();
    Ok(Some(Check::ok(
        SHARDS,
        format!(
            "{} shards by hash of the aggregate id (slots {}, one walsender each: counted in max_replication_slots and max_wal_senders)",
            pg.shards,
            slots.join(", ")
        ),
    )))
}

/// Replication slots: a free one for each of the layout's slots that does not exist yet.
fn slots_check(f: &Facts) -> Check {
    let c = &f.capacity;
    let (max, used, n) = (c.max_slots, c.used_slots, f.slots.len());
    let missing = c.missing_slots(n);
    if missing == 0 {
        let ours = if n == 1 {
            "the configured slot among them".to_owned()
        } else {
            format!("the {n} shards' slots among them")
        };
        return Check::ok(SLOTS, format!("{used} of {max} in use, {ours}"));
    }
    if c.slots_left(n) >= 0 {
        let free = if n == 1 {
            "one free for walbox's slot".to_owned()
        } else {
            format!("{missing} free for the shards' slots walbox creates")
        };
        return Check::ok(SLOTS, format!("{used} of {max} in use: {free}"));
    }
    let detail = if n == 1 {
        format!("all {max} replication slots are in use, none is left for walbox's")
    } else {
        let absent: Vec<&str> = f
            .slots
            .iter()
            .filter(|s| !c.existing.contains(s))
            .map(String::as_str)
            .collect();
        format!(
            "the {n} shards need a slot each and {missing} do not exist yet ({}), but {} of {max} replication slots are free: walbox would stop before any shard streams",
            absent.join(", "),
            max.saturating_sub(used)
        )
    };
    Check::fail(
        SLOTS,
        detail,
        format!("ALTER SYSTEM SET max_replication_slots = {}; then restart PostgreSQL (or drop an unused slot: SELECT pg_drop_replication_slot('<name>');)", c.slots_needed(n)),
    )
}

/// Walsenders: one for each of the layout's slots (those already streaming from them are
/// walbox's own), and, when a hot standby walbox may take over, as many again for the
/// takeover while the old walsenders end.
fn senders_check(f: &Facts) -> Check {
    let c = &f.capacity;
    let (max, used, n) = (c.max_senders, c.used_senders, f.slots.len());
    let restart =
        |to: i64| format!("ALTER SYSTEM SET max_wal_senders = {to}; then restart PostgreSQL");
    if c.senders_left(n, 0) < 0 {
        let detail = if n == 1 {
            format!(
                "all {max} walsenders are in use, none is left for walbox's replication connection"
            )
        } else {
            format!(
                "the {n} shards need a walsender each, but {used} of {max} are in use, {} of them by others: walbox would stop before any shard streams",
                used as usize - c.active.len().min(used as usize)
            )
        };
        return Check::fail(SENDERS, detail, restart(c.senders_needed(n, 0)));
    }
    let own = if n == 1 {
        "one free for walbox".to_owned()
    } else {
        format!("{n} for the shards, one each")
    };
    if f.standby && c.senders_left(n, n) < 0 {
        return Check::warn(
            SENDERS,
            format!(
                "{used} of {max} walsenders running: {own}, but not {n} more for a hot standby walbox (postgres.on_slot_busy = \"wait\") taking over from one that was cut off, which then waits for the old walsenders to end (wal_sender_timeout)"
            ),
            format!("{} (or lower wal_sender_timeout)", restart(c.senders_needed(n, n))),
        );
    }
    let standby = if f.standby {
        format!(", and {n} more for a hot standby's takeover")
    } else {
        String::new()
    };
    Check::ok(
        SENDERS,
        format!("{used} of {max} walsenders running: {own}{standby}"),
    )
}

fn role_check(f: &Facts) -> Check {
    let (user, superuser, replication) = (&f.user, f.superuser, f.replication);
    match (superuser, replication) {
        (true, _) => Check::ok(ROLE, format!("{user} is a superuser")),
        (false, true) => Check::ok(ROLE, format!("{user} has REPLICATION")),
        (false, false) => Check::fail(
            ROLE,
            format!("{user} has neither REPLICATION nor superuser: it cannot open a replication connection"),
            format!("ALTER ROLE {} REPLICATION;", quote_ident(user)),
        ),
    }
}

/// The relay's replication connection: `pg_hba.conf` must allow it, and a walsender must be
/// free.
async fn replication_check(config: &Config) -> Check {
    let conn = &config.postgres.conn;
    let opened = async {
        let mut repl = ReplicationConnection::connect(conn).await?;
        let identity = repl.identify_system().await;
        // Terminate, so the server logs no unexpected EOF.
        let _ = repl.close().await;
        identity
    };
    match opened.await {
        Ok(id) => Check::ok(
            REPLICATION,
            format!(
                "IDENTIFY_SYSTEM: system {}, timeline {}",
                id.system_id, id.timeline
            ),
        ),
        Err(e) => {
            let fix = match e.sqlstate() {
                Some("53300") => {
                    "free a walsender or raise max_wal_senders (see that check)".to_owned()
                }
                Some("28000") if e.to_string().contains("pg_hba") => format!(
                    "add to pg_hba.conf: host replication {} <walbox's address> scram-sha-256; then SELECT pg_reload_conf();",
                    conn.user
                ),
                // Refused credentials or a privilege: what the relay exits 4 for.
                Some(c) if failure::sqlstate(c, "") == Class::Fatal(Failure::Auth) => {
                    format!("ALTER ROLE {} REPLICATION;", quote_ident(&conn.user))
                }
                _ => "check the server's log for this error".to_owned(),
            };
            Check::fail(REPLICATION, e.to_string(), fix)
        }
    }
}

/// The slot exists as a pgoutput slot of this database that no other process holds, or it
/// may be created.
/// `postgres.failover_slot`: a server that has failover slots (17+, a primary), the slot's flag,
/// and `synchronized_standby_slots` naming active physical slots (without it a promotion may
/// lose changes Kafka already has; with an inactive one, the stream waits for that standby).
async fn failover_check(
    client: &Client,
    conn: &ConnInfo,
    server: &catalog::Server,
    role: Role,
    health: Option<&SlotHealth>,
) -> Result<Check, tokio_postgres::Error> {
    if server.version_num < 170_000 {
        return Ok(Check::fail(
            FAILOVER,
            format!(
                "postgres.failover_slot needs PostgreSQL 17 or newer; this server is {}",
                server.version
            ),
            "set postgres.failover_slot = false (before 17 a failover loses the slot: see docs/operations.md, \"Failover of the primary\")",
        ));
    }
    if role == Role::Standby {
        return Ok(Check::fail(
            FAILOVER,
            "postgres.url names a standby: failover slots are created and decoded on the primary",
            "point postgres.url at the primary (listing the primary and its standby: walbox defaults to target_session_attrs=read-write with failover_slot)",
        ));
    }
    let standby = slot::standby_slots(client).await?;
    let hosts = match conn.more_hosts.len() {
        0 => String::new(),
        n => format!(
            "; postgres.url lists {} hosts, target_session_attrs={}",
            n + 1,
            conn.target_session_attrs
        ),
    };
    let flag = match health.and_then(|h| h.failover) {
        Some(true) => "the slot is a failover slot",
        Some(false) => "walbox makes the slot a failover slot at start (ALTER_REPLICATION_SLOT)",
        None => "walbox creates the slot as a failover slot",
    };
    Ok(if standby.setting.trim().is_empty() {
        Check::warn(
            FAILOVER,
            format!("{flag}, but synchronized_standby_slots is empty: a promoted standby may lack changes Kafka already has{hosts}"),
            "ALTER SYSTEM SET synchronized_standby_slots = '<the standby's physical slot>'; SELECT pg_reload_conf();",
        )
    } else if !standby.waiting_for.is_empty() {
        Check::warn(
            FAILOVER,
            format!("{flag}; synchronized_standby_slots names {}, not an active physical slot: walbox's stream waits for it{hosts}", standby.waiting_for.join(", ")),
            "start that standby, or remove its slot from synchronized_standby_slots",
        )
    } else {
        Check::ok(
            FAILOVER,
            format!(
                "{flag}; synchronized_standby_slots = {}{hosts}",
                standby.setting
            ),
        )
    })
}

/// The name of `pg`'s slot check: `slot`, or `slot <name>` for each shard.
fn slot_check_name(pg: &PostgresConfig) -> String {
    match pg.shard {
        Some(_) => format!("{SLOT} {}", pg.slot),
        None => SLOT.to_owned(),
    }
}

async fn slot_check(
    client: &Client,
    pg: &PostgresConfig,
    facts: &Facts,
    health: Option<&SlotHealth>,
) -> Result<Check, tokio_postgres::Error> {
    let name = slot_check_name(pg);
    let slots_short = facts.capacity.slots_left(facts.slots.len()) < 0;
    let create_sql = format!(
        "SELECT pg_create_logical_replication_slot({}, 'pgoutput');",
        escape_literal(&pg.slot)
    );
    let Some(health) = health else {
        if !pg.create_slot {
            return Ok(Check::fail(
                name,
                format!("replication slot {:?} does not exist", pg.slot),
                format!("{create_sql} (or set postgres.create_slot = true)"),
            ));
        }
        let mut cannot = Vec::new();
        if !facts.logical {
            cannot.push(format!("{WAL_LEVEL} failed"));
        }
        if slots_short {
            cannot.push(format!("{SLOTS} failed"));
        }
        if !facts.superuser && !facts.replication {
            cannot.push(format!("{ROLE} failed"));
        }
        return Ok(if cannot.is_empty() {
            Check::ok(
                name,
                format!(
                    "{:?} does not exist yet: walbox creates it (postgres.create_slot)",
                    pg.slot
                ),
            )
        } else {
            Check::fail(
                name,
                format!(
                    "replication slot {:?} does not exist and cannot be created: {}",
                    pg.slot,
                    cannot.join(", ")
                ),
                format!("fix those checks, or create the slot as a superuser: {create_sql}"),
            )
        });
    };
    match catalog::slot_state(client, &pg.slot).await {
        Ok(_) => {}
        Err(CatalogError::Query(e)) => return Err(e),
        Err(e) => return Ok(from_catalog(name, &e)),
    }
    if let (true, Some(pid)) = (health.active, health.active_pid) {
        let holder = client
            .query_opt(
                "SELECT application_name, host(client_addr) FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await?;
        let (application, address): (Option<String>, Option<String>) =
            holder.map(|r| (r.get(0), r.get(1))).unwrap_or_default();
        return Ok(Check::fail(
            name,
            format!(
                "replication slot {:?} is held by pid {pid} (application_name {:?}, client {})",
                pg.slot,
                application.unwrap_or_default(),
                address.as_deref().unwrap_or("local socket")
            ),
            format!("stop that process: one walbox per slot (a stale one: SELECT pg_terminate_backend({pid});)"),
        ));
    }
    Ok(Check::ok(
        name,
        format!(
            "{:?}: pgoutput, not held, confirmed up to {}, wal_status {}",
            pg.slot,
            health
                .confirmed_flush_lsn
                .map(|l| l.to_string())
                .unwrap_or_else(|| "-".into()),
            health.wal_status.as_deref().unwrap_or("-")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::Status;

    #[test]
    fn a_missing_column_names_the_setting_to_fix() {
        let check = from_catalog(
            "outbox table public.outbox".into(),
            &CatalogError::MissingColumn {
                table: "public.outbox".into(),
                column: "aggregate_id".into(),
                setting: "columns.aggregate_id".into(),
            },
        );
        assert_eq!(check.status, Status::Fail);
        assert_eq!(
            check.fix.as_deref(),
            Some("set outbox.columns.aggregate_id to a column of public.outbox, or add column \"aggregate_id\" to it")
        );
    }
}
