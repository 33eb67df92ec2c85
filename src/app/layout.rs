//! A layout's slots, made together: before any shard of `postgres.shards` streams, every one of
//! its slots exists, all at one position.
//!
//! A slot holds only what commits after it was created. Were each shard's slot made when that
//! shard's session starts, a shard whose slot cannot be made (no free slot, no free walsender)
//! would leave its bucket's rows in no slot while the other shards stream, and making its slot
//! later would skip them for good. So `walbox run` makes the layout first ([`prepare`]), and no
//! shard's session ever creates a slot.
//!
//! # Procedure (every start with `postgres.shards` > 1, before any shard's relay)
//! 1. Under an advisory lock of the base slot (processes starting together make one layout),
//!    read the layout's slots. All exist and either one is streamed from or all stand at one
//!    position: nothing to do, and nothing is opened (a hot standby process needs no walsender
//!    here). All exist at different positions, none streamed from: one replication connection
//!    names the cluster for the progress topic; a record of any slot means the layout has
//!    streamed (each shard confirms its own position) and is left as it is; none means a start
//!    stopped between steps 5 and 6, which step 6 finishes.
//! 2. Missing slots: count what the layout needs ([`slot::Capacity`]): a free replication slot
//!    for each missing one and a walsender for every shard. Short: exit 16
//!    ([`Failure::Capacity`]) naming each setting and the value it needs; nothing is created.
//! 3. Open every shard's session (start-up checks, its publication, its replication connection)
//!    and hold them together: the walsenders are proved free at once.
//! 4. The progress topic decides ([`crate::relay::never_existed`]): a missing slot with a record
//!    existed and is gone (exit 7, as for any such slot). A slot that exists with a record has
//!    streamed: beside a missing one that never existed, the missing shard's rows since the
//!    layout began are in no slot (exit 7, [`LayoutStartError::Partial`]).
//! 5. Create the missing slots, each on its shard's replication connection. One fails: drop the
//!    ones made in this step and stop (exit 16 when the server ran out of slots or walsenders).
//! 6. Move every slot to the highest position among them, X (`pg_replication_slot_advance`).
//!
//! # Invariants
//! - Every shard of a layout made here streams exactly the transactions that commit after X:
//!   no row is relayed by one shard while a row of another shard, committed before it, is in no
//!   slot. (What commits before X is relayed by no shard, as for an unsharded slot created
//!   at X.)
//! - A slot is moved forward only while no progress record shows that it ever streamed.
//! - Interrupted anywhere (a crash between steps 5 and 6 included), the next start finishes the
//!   layout: unstreamed slots at different positions are moved to one.

use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::Client;

use crate::backoff::Backoff;
use crate::config::{Config, PostgresConfig};
use crate::failure::{Classify, Failure, FatalError};
use crate::fault::crash_point;
use crate::leader::LOCK_CLASS;
use crate::lsn::Lsn;
use crate::pg::control::{connect_control, ConnectError};
use crate::relay::{never_existed, RelayError};
use crate::sink::kafka::KafkaSink;
use crate::sink::progress::ProgressKey;
use crate::sink::topics::Topics;
use crate::source::replication::{ReplicationConnection, ReplicationError, SystemIdentity};
use crate::source::session::{self, OpenError, OpenSession};
use crate::source::slot::{self, Capacity};

/// Why the layout could not be made.
#[derive(Debug, thiserror::Error)]
pub enum LayoutStartError {
    /// The control connection failed.
    #[error("postgres control connection: {0}")]
    Connect(#[from] ConnectError),
    /// A statement failed.
    #[error("postgres: {0}")]
    Query(#[from] tokio_postgres::Error),
    /// A shard's session could not be opened, or its slot created.
    #[error("shard {slot}: {error}")]
    Open {
        /// The shard's slot.
        slot: String,
        /// The cause.
        error: OpenError,
    },
    /// The replication connection that names the cluster failed.
    #[error("postgres replication: {0}")]
    Replication(#[from] ReplicationError),
    /// The progress topic: a missing slot existed, or the topic cannot be read.
    #[error(transparent)]
    Evidence(#[from] RelayError),
    /// The server has too few free slots or walsenders for every shard.
    #[error("postgres.shards = {shards} needs {needs}: raise {raise} (ALTER SYSTEM SET …; then restart PostgreSQL); no slot was created and no shard streams (docs/sharding.md)")]
    Capacity {
        /// `postgres.shards`.
        shards: usize,
        /// What is short, e.g. "3 walsenders, 2 are free (max_wal_senders = 2, 0 in use)".
        needs: String,
        /// The settings and their new values, e.g. "max_wal_senders to at least 3".
        raise: String,
    },
    /// Slots of the layout are missing and may not be created.
    #[error("replication slots {0} do not exist and postgres.create_slot is off: set postgres.create_slot = true to create every shard's slot together, or create them (SELECT pg_create_logical_replication_slot('<slot>', 'pgoutput') for each) before starting walbox")]
    Missing(String),
    /// Some slots of the layout streamed while another never existed.
    #[error("replication slots {missing} of this layout never existed, while {relayed} have relayed (the progress topic records them): the rows of the missing shards committed since the layout began are in no slot. Create the missing slots (SELECT pg_create_logical_replication_slot('<slot>', 'pgoutput') for each), start walbox, then republish the rows since the layout began with `walbox republish --since '<time walbox first started with postgres.shards = {shards}>'` (consumers deduplicate by id)")]
    Partial {
        /// The missing slots.
        missing: String,
        /// The slots with progress records.
        relayed: String,
        /// `postgres.shards`.
        shards: usize,
    },
    /// A slot could not be moved to the layout's position.
    #[error(
        "could not move slot {slot:?} to the layout's position {to} (it is at {at}); retrying"
    )]
    Advance {
        /// The slot.
        slot: String,
        /// The layout's position.
        to: Lsn,
        /// Where it is.
        at: Lsn,
    },
}

impl Classify for LayoutStartError {
    fn failure(&self) -> Option<Failure> {
        match self {
            LayoutStartError::Connect(e) => e.failure(),
            LayoutStartError::Query(e) => e.failure(),
            LayoutStartError::Open { error, .. } => error.failure(),
            LayoutStartError::Replication(e) => e.failure(),
            LayoutStartError::Evidence(e) => e.failure(),
            LayoutStartError::Capacity { .. } => Some(Failure::Capacity),
            LayoutStartError::Missing(_) => Some(Failure::Schema),
            LayoutStartError::Partial { .. } => Some(Failure::SlotLost),
            LayoutStartError::Advance { .. } => None,
        }
    }
}

/// Makes sure every slot of `config`'s layout exists, at one position, before any shard
/// streams; retries transient errors with the relay's backoff until `stop` is raised. Returns
/// `Ok(false)` when stopped first. `sink` and `topics` look the progress topic up (creating it
/// with `kafka.create_topics`) before it is read.
pub async fn prepare(
    config: &Config,
    sink: &KafkaSink,
    topics: &mut Topics,
    mut stop: watch::Receiver<bool>,
) -> Result<bool, FatalError> {
    let mut backoff = Backoff::new(config.relay.backoff_initial, config.relay.backoff_max);
    loop {
        let attempt = tokio::select! {
            done = attempt(config, sink, topics) => done,
            _ = stop.wait_for(|s| *s) => return Ok(false),
        };
        let e = match attempt {
            Ok(()) => return Ok(true),
            Err(e) => e,
        };
        if e.failure().is_some() {
            return Err(FatalError::of(&e));
        }
        let delay = backoff.next_delay();
        tracing::warn!(error = %e, retry_in = ?delay, "cannot make the shards' slots yet; retrying");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.wait_for(|s| *s) => return Ok(false),
        }
    }
}

/// One pass of the procedure in the module docs.
async fn attempt(
    config: &Config,
    sink: &KafkaSink,
    topics: &mut Topics,
) -> Result<(), LayoutStartError> {
    let pg = &config.postgres;
    let shards = pg.shards();
    let names: Vec<String> = shards.iter().map(|s| s.slot.clone()).collect();
    let control = connect_control(&pg.conn).await?;
    lock(&control, pg.base_slot()).await?;
    let found: Vec<crate::shard::FoundSlot> = crate::shard::find_slots(&control, pg.base_slot())
        .await?
        .into_iter()
        .filter(|s| names.contains(&s.name))
        .collect();
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !found.iter().any(|s| &s.name == *n))
        .collect();
    let at_one_position = found.windows(2).all(|w| w[0].confirmed == w[1].confirmed);
    if missing.is_empty() && (at_one_position || found.iter().any(|s| s.active)) {
        return Ok(());
    }
    let list = |v: &[&String]| v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
    topics
        .ensure_progress(sink, &config.kafka.progress_topic)
        .await
        .map_err(RelayError::ProgressTopic)?;
    if missing.is_empty() {
        // Every slot exists at its own position and none is streamed from: the layout has
        // streamed (each shard confirms its own position), or a start stopped between making
        // the slots and moving them to one position. One replication connection names the
        // cluster for the progress topic; the first record found settles it.
        let mut repl = ReplicationConnection::connect(&pg.conn).await?;
        let identity = repl.identify_system().await;
        let _ = repl.close().await;
        let identity = identity?;
        for slot in &found {
            match never_existed(
                &config.broker,
                &config.kafka,
                &progress_key(&identity, &slot.name),
                None,
            )
            .await
            {
                Ok(()) => {}
                Err(RelayError::SlotGone { .. }) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        let positions: Vec<Lsn> = found.iter().map(|s| s.confirmed).collect();
        return move_to_one_position(&control, &names, positions, &found, &[]).await;
    }
    if !pg.create_slot {
        return Err(LayoutStartError::Missing(list(&missing)));
    }
    let capacity = slot::capacity(&control, &names).await?;
    if let Some(e) = shortfall(&capacity, shards.len()) {
        return Err(e);
    }
    // Every shard's session at once: N walsenders are free, every publication exists.
    let mut opened: Vec<(PostgresConfig, OpenSession)> = Vec::with_capacity(shards.len());
    for shard in &shards {
        match session::open(shard, &config.outbox).await {
            Ok(open) => opened.push((shard.clone(), open)),
            Err(error) => return Err(capacity_error(&control, &names, &shard.slot, error).await),
        }
    }
    let identity = opened[0].1.identity.clone();
    let time_column = opened[0].1.time_column(&config.outbox).await;
    for name in &missing {
        never_existed(
            &config.broker,
            &config.kafka,
            &progress_key(&identity, name),
            time_column.clone(),
        )
        .await?;
    }
    let mut relayed = Vec::new();
    for slot in &found {
        match never_existed(
            &config.broker,
            &config.kafka,
            &progress_key(&identity, &slot.name),
            None,
        )
        .await
        {
            Ok(()) => {}
            Err(RelayError::SlotGone { .. }) => relayed.push(&slot.name),
            Err(e) => return Err(e.into()),
        }
    }
    if !relayed.is_empty() {
        return Err(LayoutStartError::Partial {
            missing: list(&missing),
            relayed: list(&relayed),
            shards: shards.len(),
        });
    }
    // Step 5: the missing slots, each on its own shard's replication connection.
    let mut created: Vec<String> = Vec::new();
    let mut positions: Vec<Lsn> = found.iter().map(|s| s.confirmed).collect();
    for (shard, open) in &mut opened {
        if !missing.contains(&&shard.slot) {
            continue;
        }
        match open.create_slot(&shard.slot).await {
            Ok(state) => {
                created.push(shard.slot.clone());
                positions.push(state.confirmed_flush_lsn);
            }
            Err(error) => {
                for slot in &created {
                    let _ = drop_slot(&control, slot).await;
                }
                let slot = shard.slot.clone();
                return Err(capacity_error(&control, &names, &slot, error).await);
            }
        }
    }
    drop(opened);
    crash_point!("layout::slots-created");
    move_to_one_position(&control, &names, positions, &found, &created).await
}

/// Step 6: moves every slot of `names` (none streamed from, none with a progress record) to
/// the highest of their `positions`. A slot that existed before this start (`found`: made by
/// hand, or by a start that stopped half-way) and stands below it holds rows of its bucket
/// that no shard will relay: each is named in a warning, with the window and the way to
/// republish it.
async fn move_to_one_position(
    control: &Client,
    names: &[String],
    positions: Vec<Lsn>,
    found: &[crate::shard::FoundSlot],
    created: &[String],
) -> Result<(), LayoutStartError> {
    let to = positions.into_iter().max().unwrap_or(Lsn::ZERO);
    for slot in found.iter().filter(|s| s.confirmed < to) {
        tracing::warn!(
            slot = %slot.name, from = %slot.confirmed, to = %to,
            "shard slot {} stood at {}, before the other shards' slots: moving it to {} (the layout starts there for every shard alike), the rows of its bucket committed between {} and {} are relayed by no shard. If they must reach Kafka, republish them once the shards stream: walbox republish --since <when slot {} was made> (consumers deduplicate by id)",
            slot.name, slot.confirmed, to, slot.confirmed, to, slot.name
        );
    }
    for name in names {
        let at = slot::advance(control, name, to).await?;
        if at < to {
            return Err(LayoutStartError::Advance {
                slot: name.clone(),
                to,
                at,
            });
        }
    }
    tracing::info!(slots = %names.join(", "), position = %to, created = %created.join(", "), "every shard's slot exists, all at one position: the shards stream what commits after it");
    Ok(())
}

/// The progress topic's key of `slot` on the cluster and database `identity` names.
fn progress_key(identity: &SystemIdentity, slot: &str) -> ProgressKey {
    ProgressKey {
        system_identifier: identity.system_id.clone(),
        database: identity.dbname.clone().unwrap_or_default(),
        slot: slot.to_owned(),
    }
}

/// Waits for the layout lock of `base` (session-level: it goes with the connection).
async fn lock(client: &Client, base: &str) -> Result<(), tokio_postgres::Error> {
    loop {
        let locked: bool = client
            .query_one(
                "SELECT pg_try_advisory_lock($1, hashtext($2 || '/layout'))",
                &[&LOCK_CLASS, &base],
            )
            .await?
            .get(0);
        if locked {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What the server lacks for a layout of `shards` slots, if anything.
fn shortfall(capacity: &Capacity, shards: usize) -> Option<LayoutStartError> {
    let mut needs = Vec::new();
    let mut raise = Vec::new();
    if capacity.slots_left(shards) < 0 {
        needs.push(format!(
            "replication slots: {} to create, {} free (max_replication_slots = {}, {} in use)",
            capacity.missing_slots(shards),
            capacity.max_slots.saturating_sub(capacity.used_slots),
            capacity.max_slots,
            capacity.used_slots
        ));
        raise.push(format!(
            "max_replication_slots to at least {}",
            capacity.slots_needed(shards)
        ));
    }
    if capacity.senders_left(shards, 0) < 0 {
        needs.push(format!(
            "walsenders: {shards}, one per shard, {} free (max_wal_senders = {}, {} in use)",
            capacity.max_senders.saturating_sub(capacity.used_senders),
            capacity.max_senders,
            capacity.used_senders
        ));
        raise.push(format!(
            "max_wal_senders to at least {}",
            capacity.senders_needed(shards, 0)
        ));
    }
    (!needs.is_empty()).then(|| LayoutStartError::Capacity {
        shards,
        needs: needs.join(" and "),
        raise: raise.join(" and "),
    })
}

/// `error` of `slot`'s shard, as [`LayoutStartError::Capacity`] when the server ran out of
/// walsenders or slots meanwhile.
async fn capacity_error(
    control: &Client,
    names: &[String],
    slot: &str,
    error: OpenError,
) -> LayoutStartError {
    let Some(setting) = error.exhausted_setting() else {
        return LayoutStartError::Open {
            slot: slot.to_owned(),
            error,
        };
    };
    let needed = match slot::capacity(control, names).await {
        Ok(c) if setting == "max_wal_senders" => c.senders_needed(names.len(), 0),
        Ok(c) => c.slots_needed(names.len()),
        Err(_) => i64::from(u32::try_from(names.len()).unwrap_or(u32::MAX)),
    };
    LayoutStartError::Capacity {
        shards: names.len(),
        needs: format!(
            "{} for every shard, and shard {slot} got none ({error})",
            if setting == "max_wal_senders" {
                "a walsender"
            } else {
                "a replication slot"
            }
        ),
        raise: format!("{setting} to at least {needed}"),
    }
}

async fn drop_slot(client: &Client, slot: &str) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active",
            &[&slot],
        )
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capacity(max_slots: u32, used_slots: u32, max_senders: u32, used_senders: u32) -> Capacity {
        Capacity {
            max_slots,
            used_slots,
            max_senders,
            used_senders,
            existing: Vec::new(),
            active: Vec::new(),
        }
    }

    #[test]
    fn a_shortfall_names_each_setting_and_the_value_it_needs() {
        let e = shortfall(&capacity(2, 0, 2, 0), 3)
            .expect("short")
            .to_string();
        assert!(
            e.contains("max_replication_slots to at least 3")
                && e.contains("max_wal_senders to at least 3")
                && e.contains("no slot was created"),
            "{e}"
        );
        let e = shortfall(&capacity(10, 4, 5, 3), 3)
            .expect("short")
            .to_string();
        assert!(
            !e.contains("max_replication_slots") && e.contains("max_wal_senders to at least 6"),
            "{e}"
        );
        assert!(shortfall(&capacity(3, 0, 3, 0), 3).is_none());
        // Walsenders already streaming from the layout's slots are its own.
        let mut running = capacity(3, 3, 3, 3);
        running.existing = vec!["a".into(), "b".into(), "c".into()];
        running.active = running.existing.clone();
        assert!(shortfall(&running, 3).is_none());
    }
}
