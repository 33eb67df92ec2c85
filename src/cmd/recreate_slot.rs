//! `walbox recreate-slot --confirm-data-loss`: the only way walbox ever replaces a slot.
//!
//! Recreating a slot is an explicit operator decision because it opens a data-loss window: the
//! new slot streams only transactions that commit after its creation, so every event committed
//! after the old slot's confirmed position and before the new slot exists is never relayed. The
//! command prints both positions, and the `walbox republish` command that fills the window
//! from the outbox table. When the slot is already gone, the old position comes from the
//! progress record in Kafka (`health::evidence`), which is then reset to the new slot's start.

use std::time::Duration;

use super::status::read;
use crate::config::Config;
use crate::failure::{Failure, FatalError};
use crate::health::evidence::{last_progress, progress_key};
use crate::sink::progress::republish_command;
use crate::sink::reset_progress;
use crate::source::catalog;
use crate::source::slot;
use crate::source::standby::{self, Role};

/// `walbox recreate-slot --confirm-data-loss`: drops the slot and creates it again.
pub async fn recreate_slot(config: &Config) -> Result<(), FatalError> {
    let (client, health) = read(config).await?;
    let name = &config.postgres.slot;
    if let Some(h) = &health {
        if h.active {
            return Err(FatalError::new(
                Failure::SlotInUse,
                format!(
                    "replication slot {name:?} is active (pid {}); stop every walbox streaming from it first (SELECT application_name, client_addr FROM pg_stat_replication finds the process)",
                    h.active_pid.unwrap_or_default()
                ),
            ));
        }
    }
    let pg = &config.postgres;
    let record = last_progress(&pg.conn, &pg.slot, &config.broker, &config.kafka).await;
    let old = health
        .as_ref()
        .and_then(|h| h.confirmed_flush_lsn)
        .or(record.as_ref().map(|r| r.confirmed_lsn))
        .map(|l| l.to_string())
        .unwrap_or_else(|| "none".into());
    let failover = health.as_ref().and_then(|h| h.failover);
    let recreate = slot::recreate(&client, name, failover);
    // On a standby the slot may be gone, and with it the reading that says so: ask the server.
    let on_standby = matches!(standby::role(&client).await, Ok(Role::Standby));
    let recreated = if on_standby {
        standby::while_slot_is_created(config.postgres.primary.as_ref(), name, recreate).await
    } else {
        recreate.await
    };
    let new = recreated.map_err(|e| {
        FatalError::new(
            Failure::Schema,
            format!("cannot recreate slot {name:?}: {e}"),
        )
    })?;
    println!("recreated replication slot {name:?}");
    // The old slot's record would otherwise still say where Kafka is: in exactly-once mode,
    // new transactions below it would be skipped as already relayed.
    if let Some((key, timeline)) = progress_key(&config.postgres.conn, &config.postgres.slot).await
    {
        let reset = reset_progress(config, &key, timeline, new, Duration::from_secs(30)).await;
        let failed = reset.err().map(|e| e.to_string());
        match failed {
            None => println!("  progress record reset to the new slot's start"),
            // Exactly-once mode trusts the record at start: it must not outlive the old slot.
            Some(e) if config.kafka.exactly_once.is_some() => {
                return Err(FatalError::new(
                    Failure::Kafka,
                    format!("slot recreated, but its progress record was not reset ({e}); run recreate-slot again once Kafka answers, before walbox run"),
                ));
            }
            Some(e) => {
                println!("  progress record not reset ({e}); the next walbox run writes one")
            }
        }
    }
    if failover == Some(true) {
        println!("  failover: kept (synchronized to standbys, as the old slot was)");
    }
    println!("  old confirmed position: {old}");
    println!("  new slot starts at:     {new}");
    println!(
        "events committed after {old} and before {new} were NOT relayed; republish them from the outbox table if its rows are still there:"
    );
    let time_column = catalog::time_column(&client, &config.outbox)
        .await
        .ok()
        .flatten();
    let command = |since: &str| republish_command(since, time_column.as_deref());
    match &record {
        Some(r) => println!(
            "  {}   (10 minutes before the newest confirmed commit, {})",
            command(&r.republish_since()),
            r.confirmed_commit_time()
        ),
        None => println!(
            "  {}   (no progress record found in kafka.progress_topic: the time walbox stopped confirming)",
            command("<time>")
        ),
    }
    Ok(())
}
