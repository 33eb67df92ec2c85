//! `walbox status`: the slot's health, human-readable or as JSON; and `walbox recreate-slot`, the
//! only way walbox ever replaces a slot.
//!
//! Recreating a slot is an explicit operator decision because it opens a data-loss window: the
//! new slot streams only transactions that commit after its creation, so every event committed
//! after the old slot's confirmed position and before the new slot exists is never relayed. The
//! command prints both positions, and the `walbox republish` command that fills the window
//! from the outbox table. When the slot is already gone, the old position comes from the
//! progress record in Kafka (`sink::progress`).

use crate::config::Config;
use crate::failure::{Failure, FatalError};
use crate::health::alert::{self, Assessment};
use crate::pg::control::connect_control;
use crate::sink::progress::{self, ProgressKey, ProgressRecord};
use crate::source::replication::ReplicationConnection;
use crate::source::slot::{self, SlotHealth};
use crate::source::standby::{self, Role};

fn fatal(failure: Failure, message: impl ToString) -> FatalError {
    FatalError {
        failure,
        message: message.to_string(),
    }
}

async fn read(config: &Config) -> Result<(tokio_postgres::Client, Option<SlotHealth>), FatalError> {
    let client = connect_control(&config.postgres.conn)
        .await
        .map_err(|e| FatalError::of(&e))?;
    let health = slot::read(&client, &config.postgres.slot)
        .await
        .map_err(|e| fatal(Failure::Schema, format!("cannot read the slot: {e}")))?;
    Ok((client, health))
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Renders a reading for people.
pub fn render(h: &SlotHealth, a: &Assessment) -> String {
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<26} {v}\n"));
    line("slot", h.slot.clone());
    line("alert level", format!("{} ({})", a.level, a.reason));
    line("action", a.action.to_owned());
    line(
        "active",
        match h.active_pid {
            Some(pid) if h.active => format!("yes (pid {pid})"),
            _ => "no".into(),
        },
    );
    line("wal_status", opt(h.wal_status.clone()));
    if h.in_recovery {
        line(
            "server",
            "standby (lag and retained WAL against its replayed WAL)".into(),
        );
        line("replayed WAL LSN", h.current_lsn.to_string());
    } else {
        line("server", "primary".into());
        line("current WAL LSN", h.current_lsn.to_string());
    }
    line(
        "confirmed_flush_lsn",
        opt(h.confirmed_flush_lsn.map(|l| l.to_string())),
    );
    line("restart_lsn", opt(h.restart_lsn.map(|l| l.to_string())));
    line("retained WAL", human(h.retained_bytes()));
    line("confirmed lag", human(h.confirmed_lag_bytes()));
    line(
        "max_slot_wal_keep_size",
        h.max_slot_wal_keep_bytes
            .map(human)
            .unwrap_or_else(|| "-1 (unlimited: the slot can fill the disk)".into()),
    );
    line(
        "keep size used",
        opt(h.keep_used_ratio().map(|r| format!("{:.1}%", r * 100.0))),
    );
    line(
        "safe_wal_size",
        opt(h
            .safe_wal_size
            .map(|s| human(u64::try_from(s).unwrap_or(0)))),
    );
    line("headroom", opt(a.headroom_bytes.map(human)));
    line("max_wal_size", human(h.max_wal_bytes));
    line("wal_keep_size", human(h.wal_keep_bytes));
    if let Some(t) = &h.idle_replication_slot_timeout {
        line("idle_replication_slot_timeout", t.clone());
    }
    // Columns of newer majors: shown where the server has them.
    if let Some(since) = &h.inactive_since {
        line("inactive_since", since.clone());
    }
    if let Some(reason) = &h.invalidation_reason {
        line("invalidation_reason", reason.clone());
    }
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_owned();
    if let Some(failover) = h.failover {
        line("failover", yes_no(failover));
    }
    if let Some(synced) = h.synced {
        line("synced", yes_no(synced));
    }
    if let Some(spilled) = h.spill_bytes {
        line(
            "spilled to disk",
            human(u64::try_from(spilled).unwrap_or(0)),
        );
    }
    line("server_version_num", h.server_version_num.to_string());
    out
}

/// `walbox status [--json]`.
pub async fn status(config: &Config, json: bool) -> Result<(), FatalError> {
    let (_client, health) = read(config).await?;
    let Some(h) = health else {
        return Err(fatal(
            Failure::Schema,
            format!("replication slot {:?} does not exist", config.postgres.slot),
        ));
    };
    let a = alert::assess(Some(&h), &config.slot);
    if json {
        let mut v = serde_json::to_value(&h).map_err(|e| fatal(Failure::Internal, e))?;
        if let Some(obj) = v.as_object_mut() {
            obj.insert("retained_wal_bytes".into(), h.retained_bytes().into());
            obj.insert("confirmed_lag_bytes".into(), h.confirmed_lag_bytes().into());
            obj.insert("wal_keep_used_ratio".into(), h.keep_used_ratio().into());
            obj.insert("alert_level".into(), a.level.name().into());
            obj.insert("alert_level_value".into(), a.level.value().into());
            obj.insert("reason".into(), a.reason.clone().into());
            obj.insert("action".into(), a.action.into());
            obj.insert("headroom_bytes".into(), a.headroom_bytes.into());
        }
        println!("{v:#}");
    } else {
        print!("{}", render(&h, &a));
    }
    Ok(())
}

/// `walbox recreate-slot --confirm-data-loss`: drops the slot and creates it again.
pub async fn recreate_slot(config: &Config) -> Result<(), FatalError> {
    let (client, health) = read(config).await?;
    let name = &config.postgres.slot;
    if let Some(h) = &health {
        if h.active {
            return Err(fatal(
                Failure::SlotInUse,
                format!(
                    "replication slot {name:?} is active (pid {}); stop walbox first",
                    h.active_pid.unwrap_or_default()
                ),
            ));
        }
    }
    let record = last_progress(config).await;
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
        fatal(
            Failure::Schema,
            format!("cannot recreate slot {name:?}: {e}"),
        )
    })?;
    println!("recreated replication slot {name:?}");
    if failover == Some(true) {
        println!("  failover: kept (synchronized to standbys, as the old slot was)");
    }
    println!("  old confirmed position: {old}");
    println!("  new slot starts at:     {new}");
    println!(
        "events committed after {old} and before {new} were NOT relayed; republish them from the outbox table if its rows are still there:"
    );
    match &record {
        Some(r) => println!(
            "  walbox republish --since '{}'   (10 minutes before the newest confirmed commit, {})",
            r.republish_since(),
            r.confirmed_commit_time()
        ),
        None => println!(
            "  walbox republish --since <time walbox stopped confirming>   (no progress record found in kafka.progress_topic)"
        ),
    }
    Ok(())
}

/// The newest progress record of the configured slot, when Kafka and the server answer.
async fn last_progress(config: &Config) -> Option<ProgressRecord> {
    let mut repl = ReplicationConnection::connect(&config.postgres.conn)
        .await
        .ok()?;
    let identity = repl.identify_system().await.ok()?;
    // Terminate, so the server logs no unexpected EOF.
    if let Err(e) = repl.close().await {
        tracing::debug!(error = %e, "closing the replication connection");
    }
    let key = ProgressKey {
        system_identifier: identity.system_id,
        database: identity.dbname.unwrap_or_default(),
        slot: config.postgres.slot.clone(),
    };
    let kafka = config.kafka.clone();
    let read = tokio::task::spawn_blocking(move || {
        progress::read_last(&kafka, &key, std::time::Duration::from_secs(30))
    });
    match read.await {
        Ok(Ok(record)) => record,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot read the progress record");
            None
        }
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::human;

    #[test]
    fn sizes_for_people() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(64 << 20), "64.0 MiB");
        assert_eq!(human(3 << 30), "3.0 GiB");
    }
}
