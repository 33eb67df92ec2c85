//! `walbox reshard --to M`: moves the outbox from the layout of shards it is relayed through
//! (N slots) to one of M, with no aggregate's events reordered and none lost. walbox must be
//! stopped (every process, standbys too); the command runs against the primary.
//!
//! # Procedure
//! 1. Find the layout in use: the slots named after `postgres.slot` ([`crate::shard::find_slots`]).
//! 2. Make the new layout's publications (row filters and comments, as `walbox run` makes them)
//!    and slots.
//! 3. Write the reshard marker, a non-transactional logical message with prefix
//!    [`crate::shard::RESHARD_PREFIX`]. Its LSN X (the end of its record, which is also the LSN the
//!    message carries in the stream) is the *reshard point*. Move the new slots to X
//!    (`pg_replication_slot_advance`): a slot streams exactly the transactions whose commit
//!    record is at or after its confirmed position.
//! 4. Drain every old shard: a relay session with `drain_to = X` relays what committed before X
//!    (PostgreSQL decodes the marker after all of it and before anything committed after it),
//!    waits for the broker's acknowledgements and confirms X.
//! 5. Drop the old slots, then the old shards' publications.
//!
//! # Invariants
//! - Every transaction is relayed by exactly one layout: commit record before X by the old one,
//!   at or after X by the new one. Each aggregate's events before X are acknowledged (step 4)
//!   before any relay of the new layout starts (`walbox run` refuses a database holding slots
//!   of two layouts), so its order holds across the change.
//! - Interrupted anywhere, the command finishes when run again with the same `--to`: while
//!   every old slot still exists, the new slots (never streamed from) are dropped and made again
//!   at a new reshard point, and old shards drained before go on from where they stopped; once
//!   an old slot is gone (step 5 began, after every old shard confirmed X) the new slots are
//!   kept and the rest of the old layout is dropped.
//! - The old layout's unsharded publication (`postgres.publication`, possibly made by hand) is
//!   kept; only the shards' own publications are dropped.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use postgres_protocol::escape::escape_identifier as quote_ident;
use tokio::sync::watch;
use tokio_postgres::Client;

use crate::app::{run_slots, Borrowed, SlotRun};
use crate::config::{Config, OnSlotBusy, PostgresConfig, MAX_SHARDS};
use crate::failure::{Classify, Failure, FatalError};
use crate::fault::crash_point;
use crate::leader::LOCK_CLASS;
use crate::lsn::Lsn;
use crate::metrics::{Health, Metrics};
use crate::pg::control::{connect_control, ConnectError};
use crate::shard::{find_slots, parse_slot_name, FoundSlot, RESHARD_PREFIX};
use crate::source::catalog::{self, CatalogError};
use crate::source::standby::{self, Role};

/// How long moving the new slots to the reshard point may take (it waits for the marker to be
/// flushed).
const ADVANCE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a reshard stopped. Running it again with the same `--to` finishes it.
#[derive(Debug, thiserror::Error)]
pub enum ReshardError {
    /// The control connection failed.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// A statement failed.
    #[error("postgres: {0}")]
    Query(#[from] tokio_postgres::Error),
    /// A publication or table check failed.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// `--to` out of range.
    #[error("--to must be between 1 and {MAX_SHARDS}")]
    Target,
    /// More than one shard on a server without publication row filters.
    #[error("walbox reshard --to {to}: shards need PostgreSQL 15 or newer (publication row filters); this server is {version}: keep postgres.shards = 1")]
    NeedsRowFilters {
        /// `--to`.
        to: u32,
        /// `server_version`.
        version: String,
    },
    /// The server is a standby.
    #[error("walbox reshard writes the reshard point and makes slots: run it against the primary (postgres.url points to a standby)")]
    Standby,
    /// Another reshard of the same slots runs.
    #[error("another `walbox reshard` of slot {0:?} is running")]
    Concurrent(String),
    /// A slot of the old layout is streamed from.
    #[error("replication slot {0:?} is active: stop walbox (every process of this outbox, standbys too), then run walbox reshard again")]
    Active(String),
    /// Slots of layouts that the requested one cannot finish.
    #[error("slots of {layouts} exist (slots {slots}), left by a reshard that did not finish: run `walbox reshard --to {finish}` to finish it first")]
    Unfinished {
        /// The layouts found.
        layouts: String,
        /// Their slots.
        slots: String,
        /// The `--to` that finishes it.
        finish: u32,
    },
    /// The new slots could not be moved to the reshard point.
    #[error("could not move slot {slot:?} to the reshard point {to} within {ADVANCE_TIMEOUT:?} (it is at {at}); run walbox reshard again")]
    Advance {
        /// The slot.
        slot: String,
        /// The reshard point.
        to: Lsn,
        /// Where it is.
        at: Lsn,
    },
    /// A drain ended before its slot confirmed the reshard point (interrupted).
    #[error("slot {slot:?} is drained up to {at}, not yet to the reshard point {to}: walbox reshard was interrupted; run it again with the same --to")]
    Undrained {
        /// The old slot.
        slot: String,
        /// The reshard point.
        to: Lsn,
        /// Its confirmed position.
        at: Lsn,
    },
}

impl Classify for ReshardError {
    fn failure(&self) -> Option<Failure> {
        match self {
            ReshardError::Connect(e) => e.failure(),
            ReshardError::Query(e) => e.failure(),
            ReshardError::Catalog(e) => e.failure(),
            ReshardError::Target | ReshardError::Standby | ReshardError::Unfinished { .. } => {
                Some(Failure::Config)
            }
            // As `walbox run` with `postgres.shards > 1` on that server.
            ReshardError::NeedsRowFilters { .. } => Some(Failure::Schema),
            ReshardError::Concurrent(_) | ReshardError::Active(_) => Some(Failure::SlotInUse),
            ReshardError::Advance { .. } => None,
            // A drain ends short of the reshard point only when the command is stopped.
            ReshardError::Undrained { .. } => Some(Failure::Interrupted),
        }
    }
}

/// What the command found and does.
struct Plan {
    /// The layout the outbox is relayed through now.
    from: u32,
    /// The old layout's shards still holding a slot, with their slots.
    old: Vec<(PostgresConfig, FoundSlot)>,
    /// The new layout's shards.
    new: Vec<PostgresConfig>,
    /// Whether the old layout is still whole (else step 5 had begun).
    old_whole: bool,
    /// New-layout slots found (made by an earlier, interrupted run).
    new_found: Vec<FoundSlot>,
}

/// `walbox reshard --to <to>`; `shutdown` interrupts the drains (the command can be run again).
pub async fn reshard(
    config: &Config,
    to: u32,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), FatalError> {
    let fatal = |e: ReshardError| FatalError::of(&e);
    if !(1..=MAX_SHARDS).contains(&to) {
        return Err(fatal(ReshardError::Target));
    }
    let client = connect_control(&config.postgres.conn)
        .await
        .map_err(|e| fatal(e.into()))?;
    if standby::role(&client).await.map_err(|e| fatal(e.into()))? == Role::Standby {
        return Err(fatal(ReshardError::Standby));
    }
    if to > 1 {
        let server = catalog::server(&client)
            .await
            .map_err(|e| fatal(e.into()))?;
        if server.version_num < crate::shard::MIN_SERVER_VERSION {
            return Err(fatal(ReshardError::NeedsRowFilters {
                to,
                version: server.version,
            }));
        }
    }
    let base = config.postgres.base_slot().to_owned();
    let locked: bool = client
        .query_one(
            "SELECT pg_try_advisory_lock($1, hashtext($2 || '/reshard'))",
            &[&LOCK_CLASS, &base],
        )
        .await
        .map_err(|e| fatal(e.into()))?
        .get(0);
    if !locked {
        return Err(fatal(ReshardError::Concurrent(base)));
    }
    let plan = match plan(&client, &config.postgres, to).await.map_err(fatal)? {
        Found::Move(plan) => plan,
        found => {
            drop_stale_publications(&client, &config.postgres, to)
                .await
                .map_err(|e| fatal(e.into()))?;
            if matches!(found, Found::NoSlot) {
                println!("no slot of postgres.slot {base:?} exists yet: there is nothing to move; set postgres.shards = {to} and start walbox, which creates the {to} slot(s)");
            } else {
                println!("the outbox is relayed through {to} shard(s) already: set postgres.shards = {to} and start walbox");
            }
            return Ok(());
        }
    };
    println!("resharding slot {base:?}: {} → {to} shard(s)", plan.from);
    let point = if plan.old_whole {
        for stale in &plan.new_found {
            drop_slot(&client, &stale.name)
                .await
                .map_err(|e| fatal(e.into()))?;
            println!("  dropped slot {} of an unfinished run", stale.name);
        }
        let point = prepare_new_layout(&client, config, &plan)
            .await
            .map_err(fatal)?;
        println!("  reshard point: {point}");
        drain(config, &plan, point, shutdown).await?;
        crash_point!("reshard::drained");
        point
    } else {
        // Step 5 had begun: every old shard confirmed the reshard point the new slots sit at.
        let point = plan
            .new_found
            .iter()
            .map(|s| s.confirmed)
            .min()
            .unwrap_or(Lsn::ZERO);
        println!("  finishing an interrupted reshard at {point}");
        point
    };
    // Every old slot must have confirmed the reshard point before any is dropped.
    for (_, slot) in &plan.old {
        let at = confirmed(&client, &slot.name)
            .await
            .map_err(|e| fatal(e.into()))?;
        if at < point {
            return Err(fatal(ReshardError::Undrained {
                slot: slot.name.clone(),
                to: point,
                at,
            }));
        }
    }
    for (_, slot) in &plan.old {
        drop_slot(&client, &slot.name)
            .await
            .map_err(|e| fatal(e.into()))?;
        println!("  dropped slot {}", slot.name);
        crash_point!("reshard::old-slot-dropped");
    }
    drop_stale_publications(&client, &config.postgres, to)
        .await
        .map_err(|e| fatal(e.into()))?;
    let slots: Vec<&str> = plan.new.iter().map(|p| p.slot.as_str()).collect();
    println!(
        "resharded at {point}: the outbox is relayed through {to} shard(s) (slots {}). Set postgres.shards = {to} and start walbox.",
        slots.join(", ")
    );
    Ok(())
}

/// What [`plan`] found.
enum Found {
    /// No slot exists yet: `walbox run` makes them.
    NoSlot,
    /// The outbox is relayed through `to` shards already.
    Already,
    /// Slots of another layout: move them.
    Move(Plan),
}

/// Reads the layout.
async fn plan(client: &Client, pg: &PostgresConfig, to: u32) -> Result<Found, ReshardError> {
    let found = find_slots(client, pg.base_slot()).await?;
    if let Some(active) = found.iter().find(|s| s.active) {
        return Err(ReshardError::Active(active.name.clone()));
    }
    let mut layouts: Vec<u32> = found.iter().map(FoundSlot::count).collect();
    layouts.dedup();
    let from = match layouts.as_slice() {
        [] => return Ok(Found::NoSlot),
        [one] if *one == to => return Ok(Found::Already),
        [one] => *one,
        [a, b] if *a == to || *b == to => {
            if *a == to {
                *b
            } else {
                *a
            }
        }
        _ => {
            let names: Vec<&str> = found.iter().map(|s| s.name.as_str()).collect();
            let layouts: Vec<String> = layouts.iter().map(u32::to_string).collect();
            return Err(ReshardError::Unfinished {
                layouts: format!("{} shards", layouts.join(" and ")),
                slots: names.join(", "),
                // The layout furthest ahead is the one an earlier run was moving to.
                finish: found
                    .iter()
                    .max_by_key(|s| s.confirmed)
                    .map_or(to, FoundSlot::count),
            });
        }
    };
    let old_layout = pg.layout(from);
    let old: Vec<(PostgresConfig, FoundSlot)> = old_layout
        .iter()
        .filter_map(|shard| {
            found
                .iter()
                .find(|s| s.name == shard.slot)
                .map(|s| (shard.clone(), s.clone()))
        })
        .collect();
    let old_whole = old.len() == old_layout.len();
    let new_found: Vec<FoundSlot> = found.into_iter().filter(|s| s.count() == to).collect();
    if !old_whole && new_found.len() != to as usize {
        // Old slots were being dropped, so the new layout was complete: something else
        // removed slots meanwhile.
        return Err(ReshardError::Unfinished {
            layouts: format!("{from} and {to} shards, both incomplete"),
            slots: old
                .iter()
                .map(|(_, s)| s.name.clone())
                .chain(new_found.iter().map(|s| s.name.clone()))
                .collect::<Vec<_>>()
                .join(", "),
            finish: to,
        });
    }
    Ok(Found::Move(Plan {
        from,
        old,
        new: pg.layout(to),
        old_whole,
        new_found,
    }))
}

/// Steps 2 and 3: the new layout's publications and slots, the marker, the slots moved to it.
/// Returns the reshard point.
async fn prepare_new_layout(
    client: &Client,
    config: &Config,
    plan: &Plan,
) -> Result<Lsn, ReshardError> {
    for shard in &plan.new {
        let mut shard = shard.clone();
        // A shard's publication is walbox's own; the unsharded one follows the configuration.
        shard.create_publication |= shard.shard.is_some();
        catalog::prepare_objects(client, &shard, &config.outbox, false).await?;
    }
    for shard in &plan.new {
        let sql = if config.postgres.failover_slot {
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)"
        } else {
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')"
        };
        client.execute(sql, &[&shard.slot]).await?;
        println!("  created slot {}", shard.slot);
    }
    let content = format!("{{\"from\":{},\"to\":{}}}", plan.from, plan.new.len());
    let point: Lsn = lsn(client
        .query_one(
            "SELECT pg_logical_emit_message(false, $1, $2)::text",
            &[&RESHARD_PREFIX, &content],
        )
        .await?
        .get(0));
    // A non-transactional message is not flushed on its own: a committed transaction (with
    // synchronous_commit on) flushes it, so the slots can be moved there.
    client.batch_execute("SET synchronous_commit = on").await?;
    let deadline = tokio::time::Instant::now() + ADVANCE_TIMEOUT;
    for shard in &plan.new {
        loop {
            client
                .execute(
                    "SELECT pg_logical_emit_message(true, $1, 'flush')",
                    &[&RESHARD_PREFIX],
                )
                .await?;
            let at = crate::source::slot::advance(client, &shard.slot, point).await?;
            if at >= point {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ReshardError::Advance {
                    slot: shard.slot.clone(),
                    to: point,
                    at,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(point)
}

/// Step 4: every old shard that has not confirmed `point` yet is relayed up to it, all at once,
/// each by the relay `walbox run` uses (its own producer, reconnects and slot monitor).
async fn drain(
    config: &Config,
    plan: &Plan,
    point: Lsn,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), FatalError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let mut slots = Vec::new();
    for (shard, slot) in &plan.old {
        if slot.confirmed >= point {
            println!("  {} is drained already", slot.name);
            continue;
        }
        let mut c = config.clone();
        c.postgres = shard.clone();
        c.postgres.drain_to = Some(point);
        c.postgres.create_slot = false;
        c.postgres.create_publication = false;
        c.postgres.on_slot_busy = OnSlotBusy::Fail;
        c.slot.heartbeat_interval = None;
        c.outbox.retention = None;
        c.alerts.webhook_url = None;
        println!(
            "  draining {} from {} to {point}",
            slot.name, slot.confirmed
        );
        slots.push(SlotRun {
            metrics: Arc::new(Metrics::for_slot(&c.postgres.slot)),
            config: c,
            health: Arc::new(Health::default()),
            borrowed: Borrowed::default(),
        });
    }
    let stopped = stop_rx.clone();
    run_slots(slots, &stop_rx, |name, ended| match ended {
        // A drain also ends without error when the command is stopped: only the slot's
        // confirmed position (checked next) says it reached the reshard point.
        Ok(()) if *stopped.borrow() => println!("  draining {name} stopped (interrupted)"),
        Ok(()) => println!("  drained {name}"),
        Err(_) => {}
    })
    .await
}

/// Drops the shard publications named after `postgres.publication` that belong to a layout
/// other than `keep` and that no slot uses any more.
async fn drop_stale_publications(
    client: &Client,
    pg: &PostgresConfig,
    keep: u32,
) -> Result<(), tokio_postgres::Error> {
    let base = pg.layout(1).remove(0).publication;
    let slots = find_slots(client, pg.base_slot()).await?;
    let rows = client
        .query(
            "SELECT pubname::text FROM pg_publication WHERE starts_with(pubname, $1 || '_')",
            &[&base],
        )
        .await?;
    for row in rows {
        let name: String = row.get(0);
        let Some(Some(shard)) = parse_slot_name(&base, &name) else {
            continue;
        };
        let in_use = slots.iter().any(|s| s.count() == shard.count);
        if shard.count != keep && !in_use {
            client
                .batch_execute(&format!(
                    "DROP PUBLICATION IF EXISTS {}",
                    quote_ident(&name)
                ))
                .await?;
            println!("  dropped publication {name}");
        }
    }
    Ok(())
}

async fn drop_slot(client: &Client, slot: &str) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map(drop)
}

async fn confirmed(client: &Client, slot: &str) -> Result<Lsn, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(lsn(row.and_then(|r| r.get(0))))
}

fn lsn(text: Option<String>) -> Lsn {
    text.and_then(|t| t.parse().ok()).unwrap_or(Lsn::ZERO)
}
