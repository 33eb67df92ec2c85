//! `walbox status`: the slot's health, human-readable or as JSON; and `walbox recreate-slot`, the
//! only way walbox ever replaces a slot.
//!
//! Recreating a slot is an explicit operator decision because it opens a data-loss window: the
//! new slot streams only transactions that commit after its creation, so every event committed
//! after the old slot's confirmed position and before the new slot exists is never relayed. The
//! command prints both positions, and the `walbox republish` command that fills the window
//! from the outbox table. When the slot is already gone, the old position comes from the
//! progress record in Kafka (`sink::progress`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

use crate::config::conninfo::ConnInfo;
use crate::config::{Config, KafkaConfig};
use crate::failure::{Failure, FatalError};
use crate::health::alert::{self, Assessment};
use crate::health::progress::{self, human_bytes as human, Estimate};
use crate::pg::control::connect_control;
use crate::sink::progress::{
    read_last, republish_command, write_reset, ProgressKey, ProgressRecord,
};
use crate::source::catalog;
use crate::source::replication::ReplicationConnection;
use crate::source::slot::{self, SlotHealth};
use crate::source::standby::{self, Role};

async fn read(config: &Config) -> Result<(tokio_postgres::Client, Option<SlotHealth>), FatalError> {
    let client = connect_control(&config.postgres.conn)
        .await
        .map_err(|e| FatalError::of(&e))?;
    let health = slot::read(&client, &config.postgres.slot)
        .await
        .map_err(|e| FatalError::new(Failure::Schema, format!("cannot read the slot: {e}")))?;
    Ok((client, health))
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

/// `walbox status [--json]`: with `postgres.shards` > 1, every shard's slot (text: one block per
/// shard; JSON: `{"shards": [...]}`).
pub async fn status(config: &Config, json: bool) -> Result<(), FatalError> {
    if config.postgres.shards == 1 {
        let (text, value) = report(config).await?;
        match json {
            true => println!("{value:#}"),
            false => print!("{text}"),
        }
        return Ok(());
    }
    let mut texts = Vec::new();
    let mut values = Vec::new();
    for shard in config.postgres.shards() {
        let mut c = config.clone();
        c.postgres = shard;
        let (text, value) = report(&c).await?;
        texts.push(text);
        values.push(value);
    }
    match json {
        true => println!("{:#}", serde_json::json!({ "shards": values })),
        false => print!("{}", texts.join("\n")),
    }
    Ok(())
}

/// One slot's reading: as text and as JSON.
async fn report(config: &Config) -> Result<(String, serde_json::Value), FatalError> {
    let (client, health) = read(config).await?;
    let Some(h) = health else {
        return Err(FatalError::new(
            Failure::Schema,
            format!("replication slot {:?} does not exist", config.postgres.slot),
        ));
    };
    // A failover slot's stream waits for the standbys of synchronized_standby_slots.
    let waiting_for = if h.failover == Some(true) && !h.in_recovery {
        slot::standby_slots(&client)
            .await
            .map(|s| s.waiting_for)
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let a = alert::assess_stream(
        alert::assess(Some(&h), &config.slot),
        &h,
        &waiting_for,
        None,
    );
    let catchup = catchup(config, &client, &h).await;
    let mut v = serde_json::to_value(&h).map_err(|e| FatalError::new(Failure::Internal, e))?;
    if let Some(obj) = v.as_object_mut() {
        obj.insert("retained_wal_bytes".into(), h.retained_bytes().into());
        obj.insert("confirmed_lag_bytes".into(), h.confirmed_lag_bytes().into());
        obj.insert("wal_keep_used_ratio".into(), h.keep_used_ratio().into());
        obj.insert("alert_level".into(), a.level.name().into());
        obj.insert("alert_level_value".into(), a.level.value().into());
        obj.insert("reason".into(), a.reason.clone().into());
        obj.insert("action".into(), a.action.into());
        obj.insert("headroom_bytes".into(), a.headroom_bytes.into());
        obj.insert("progress".into(), catchup.json());
        obj.insert(
            "waiting_for_standby_slots".into(),
            waiting_for.clone().into(),
        );
    }
    let mut text = format!("{}{:<26} {}\n", render(&h, &a), "progress", catchup.line());
    if !waiting_for.is_empty() {
        text.push_str(&format!(
            "{:<26} {} (in synchronized_standby_slots, not active: the failover slot's stream waits for its standby)\n",
            "waiting for standby slot",
            waiting_for.join(", ")
        ));
    }
    Ok((text, v))
}

/// Where `walbox status`'s progress estimate came from.
enum Catchup {
    /// The running walbox's own estimate, read from its `/metrics`.
    Running { at: SocketAddr, estimate: Estimate },
    /// Two slot readings taken by `status` itself (no event count).
    Sampled { estimate: Estimate, over: Duration },
    /// Below `slot.catchup_threshold`, and the running walbox not reachable: nothing measured.
    Behind { bytes: u64 },
}

impl Catchup {
    fn line(&self) -> String {
        match self {
            Catchup::Running { at, estimate } => {
                format!("{} (walbox at {at})", progress::describe(estimate))
            }
            Catchup::Sampled { estimate, over } => format!(
                "{} (two slot readings {} ms apart; walbox's /metrics not reachable at http.listen)",
                progress::describe(estimate),
                over.as_millis()
            ),
            Catchup::Behind { bytes } => {
                format!("{} of WAL behind", human(*bytes))
            }
        }
    }

    fn json(&self) -> serde_json::Value {
        let (source, e) = match self {
            Catchup::Running { estimate, .. } => ("walbox", Some(estimate)),
            Catchup::Sampled { estimate, .. } => ("slot_readings", Some(estimate)),
            Catchup::Behind { .. } => ("none", None),
        };
        let behind = match self {
            Catchup::Behind { bytes } => *bytes,
            _ => e.map(|e| e.behind_bytes).unwrap_or_default(),
        };
        serde_json::json!({
            "source": source,
            "wal_behind_bytes": behind,
            "events_per_second": e.and_then(|e| e.events_per_second),
            "drain_bytes_per_second": e.and_then(|e| e.drain_bytes_per_second),
            "eta_seconds": e.and_then(|e| e.eta).map(|d| d.as_secs_f64()),
        })
    }
}

/// How long `walbox status` waits between its own two slot readings.
const SAMPLE_SPAN: Duration = Duration::from_secs(1);

/// The catch-up estimate for `walbox status`: the running walbox's (its `/metrics` at
/// `http.listen`, an unspecified address asked on loopback) when it answers; else, when the WAL
/// behind is at or above `slot.catchup_threshold`, a drain rate from a second slot reading
/// [`SAMPLE_SPAN`] later; else just the WAL behind.
async fn catchup(config: &Config, client: &tokio_postgres::Client, h: &SlotHealth) -> Catchup {
    if let Some(listen) = config.http_listen {
        let at = loopback_if_unspecified(listen);
        if let Some(estimate) = scrape(at)
            .await
            .as_deref()
            .and_then(progress::from_metrics_text)
        {
            return Catchup::Running { at, estimate };
        }
    }
    let bytes = h.confirmed_lag_bytes();
    if bytes < config.slot.catchup_threshold {
        return Catchup::Behind { bytes };
    }
    let first = progress::Sample {
        at: Instant::now(),
        behind_bytes: bytes,
        events: 0,
    };
    tokio::time::sleep(SAMPLE_SPAN).await;
    match slot::read(client, &config.postgres.slot).await {
        Ok(Some(h2)) => {
            let last = progress::Sample {
                at: Instant::now(),
                behind_bytes: h2.confirmed_lag_bytes(),
                events: 0,
            };
            let mut estimate = progress::estimate_between(&first, &last);
            estimate.events_per_second = None;
            Catchup::Sampled {
                estimate,
                over: last.at.duration_since(first.at),
            }
        }
        _ => Catchup::Behind { bytes },
    }
}

fn loopback_if_unspecified(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), addr.port())
        }
        _ => addr,
    }
}

/// `GET /metrics` from a running walbox, bounded by two seconds; `None` on any failure.
async fn scrape(at: SocketAddr) -> Option<String> {
    let get = async {
        let tcp = tokio::net::TcpStream::connect(at).await.ok()?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .ok()?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = hyper::Request::get("/metrics")
            .header(hyper::header::HOST, at.to_string())
            .header(hyper::header::USER_AGENT, "walbox status")
            .body(Empty::<Bytes>::new())
            .ok()?;
        let resp = sender.send_request(req).await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let body = resp.into_body().collect().await.ok()?.to_bytes();
        String::from_utf8(body.to_vec()).ok()
    };
    tokio::time::timeout(Duration::from_secs(2), get)
        .await
        .ok()
        .flatten()
}

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
    let record = last_progress(&pg.conn, &pg.slot, &config.kafka).await;
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
    if let Some((key, timeline)) = identify(&config.postgres.conn, &config.postgres.slot).await {
        let kafka = config.kafka.clone();
        let reset = tokio::task::spawn_blocking(move || {
            write_reset(&kafka, &key, timeline, new, Duration::from_secs(30))
        })
        .await;
        let failed = match reset {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(e) => Some(e.to_string()),
        };
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

/// The progress key of `slot` on the server `conn` names, and the server's timeline, when the
/// server answers.
async fn identify(conn: &ConnInfo, slot: &str) -> Option<(ProgressKey, u32)> {
    let mut repl = ReplicationConnection::connect(conn).await.ok()?;
    let identity = repl.identify_system().await.ok()?;
    // Terminate, so the server logs no unexpected EOF.
    if let Err(e) = repl.close().await {
        tracing::debug!(error = %e, "closing the replication connection");
    }
    let key = ProgressKey {
        system_identifier: identity.system_id,
        database: identity.dbname.unwrap_or_default(),
        slot: slot.to_owned(),
    };
    Some((key, identity.timeline))
}

/// The newest progress record of `slot` on the server `conn` names, when Kafka and the server
/// answer (`walbox recreate-slot`, and the relay's message for a slot found lost).
pub async fn last_progress(
    conn: &ConnInfo,
    slot: &str,
    kafka: &KafkaConfig,
) -> Option<ProgressRecord> {
    let (key, _) = identify(conn, slot).await?;
    let kafka = kafka.clone();
    let read = tokio::task::spawn_blocking(move || {
        read_last(&kafka, &key, std::time::Duration::from_secs(30))
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
