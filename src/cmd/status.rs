//! `walbox status`: the slot's health, human-readable or as JSON, with the alert level the
//! running relay would give it (`health::alert`) and, on a backlog, the catch-up estimate
//! (`health::progress`), sampled here or scraped from the running relay's `/metrics`.
//!
//! It only reads: no slot, publication or record is created or changed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

use crate::config::Config;
use crate::failure::{Failure, FatalError};
use crate::health::alert::{self, Assessment};
use crate::health::progress::{self, human_bytes as human, Estimate};
use crate::pg::control::connect_control;
use crate::source::slot::{self, SlotHealth};

/// The slot's reading (`None`: there is no slot), on a control connection of its own (shared
/// with `walbox recreate-slot`).
pub(super) async fn read(
    config: &Config,
) -> Result<(tokio_postgres::Client, Option<SlotHealth>), FatalError> {
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
