//! `walbox demo`: walbox end to end on throwaway infrastructure.
//!
//! Starts a private PostgreSQL cluster (`wal_level=logical`) and librdkafka's mock Kafka cluster
//! (or, with `--broker`, a throwaway Redis, NATS or RabbitMQ server:
//! [`crate::sandbox::scratch_broker`]), creates the seeds' outbox table, writes events for several aggregates in transactions (one of
//! them rolled back), relays them with the real relay, and prints what a consumer reads back plus
//! a short metrics summary. Everything is removed on exit.

use std::time::Duration;

use anyhow::{bail, Context};
use tokio::sync::oneshot;

use crate::app::{self, Handles};
use crate::config;
use crate::config::BrokerKind;
use crate::pg::control::connect_control;
use crate::sandbox::postgres::{PgCluster, PgClusterOptions};
use crate::sandbox::scratch_broker::ScratchBroker;
use crate::sandbox::SCHEMA;

const TOPIC: &str = "payments.events";

/// Runs the demo.
pub async fn run(aggregates: u32, events: u32, kind: BrokerKind) -> anyhow::Result<()> {
    if aggregates == 0 || events == 0 {
        bail!("--aggregates and --events must be at least 1");
    }
    println!("starting a throwaway PostgreSQL cluster (wal_level=logical)…");
    let cluster = tokio::task::spawn_blocking(|| {
        PgCluster::start(PgClusterOptions {
            watchdog: true,
            // The recommended setting: a stalled slot is invalidated before it fills the disk.
            settings: vec![("max_slot_wal_keep_size".into(), "1GB".into())],
            ..Default::default()
        })
    })
    .await?
    .context("starting PostgreSQL")?;
    cluster.create_database("demo")?;
    cluster.psql("demo", SCHEMA)?;
    if kind != BrokerKind::Kafka {
        println!("starting a throwaway {kind} server…");
    }
    // The mock cluster cannot move between threads: started here, off the runtime's workers.
    let broker = tokio::task::block_in_place(|| ScratchBroker::start(kind))
        .with_context(|| format!("starting {kind}"))?;
    broker.prepare(TOPIC, 4).await?;
    println!("postgres: {}", cluster.socket_url("demo"));
    println!("{}", broker.describe());

    let mut env: Vec<(String, String)> = [
        ("WALBOX_POSTGRES_URL", cluster.url("demo")),
        ("WALBOX_POSTGRES_CREATE_SLOT", "true".into()),
        ("WALBOX_POSTGRES_CREATE_PUBLICATION", "true".into()),
        ("WALBOX_HTTP_LISTEN", "off".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    env.extend(broker.env());
    let config = config::load_from(None, &mut env.into_iter())?;
    let conn = config.postgres.conn.clone();
    let handles = Handles::default();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let relay = tokio::spawn(app::run_with(
        config,
        async move {
            let _ = stop_rx.await;
        },
        handles.clone(),
    ));

    // Wait until walbox streams from its slot: rows written while the slot is still being
    // created (it is `active` then, before its consistent point) would not be in its stream.
    let client = connect_control(&conn).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while client
        .query_opt(
            "SELECT 1 FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid \
             WHERE s.slot_name = 'walbox' AND s.confirmed_flush_lsn IS NOT NULL \
             AND r.state IN ('streaming', 'catchup')",
            &[],
        )
        .await?
        .is_none()
    {
        if relay.is_finished() || tokio::time::Instant::now() > deadline {
            bail!("walbox did not start streaming: {:?}", relay.await);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    println!("\nwriting {events} events for each of {aggregates} aggregates, one transaction per round, plus one rolled-back transaction…");
    for round in 0..events {
        let mut sql = String::from("BEGIN;");
        for a in 0..aggregates {
            sql.push_str(&format!(
                "INSERT INTO payments (wallet_id, amount) VALUES ('wallet-{a}', {amount});
                 INSERT INTO outbox (aggregate_id, topic, event_type, payload)
                 VALUES ('wallet-{a}', '{TOPIC}', 'payment.captured', '{{\"round\": {round}, \"amount\": {amount}}}');",
                amount = 10 + round * 5 + a
            ));
        }
        sql.push_str("COMMIT;");
        client.batch_execute(&sql).await?;
    }
    client
        .batch_execute(
            "BEGIN; INSERT INTO outbox (aggregate_id, topic, event_type, payload) VALUES ('wallet-0', 'payments.events', 'payment.captured', '{\"rolled_back\": true}'); ROLLBACK;",
        )
        .await?;

    let expected = (aggregates * events) as usize;
    let records = broker
        .read(TOPIC, expected, Duration::from_secs(60))
        .await?;
    if records.len() < expected {
        bail!("the consumer read {} of {expected} events", records.len());
    }
    let mut rows = records;
    rows.sort_by_key(|r| (r.partition, r.offset));
    println!("\nwhat a consumer reads back from {TOPIC}:");
    println!(
        "{:<10} {:>6} {:<10} {:>8}  {:<18} payload",
        "partition", "offset", "key", "event id", "commit lsn/index"
    );
    for r in &rows {
        println!(
            "{:<10} {:>6} {:<10} {:>8}  {:<18} {}",
            r.partition,
            r.offset,
            String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()),
            r.header_str("id").unwrap_or("?"),
            format!(
                "{}/{}",
                r.header_str(crate::outbox::COMMIT_LSN_HEADER)
                    .unwrap_or("?"),
                r.header_str(crate::outbox::INDEX_HEADER).unwrap_or("?")
            ),
            String::from_utf8_lossy(r.payload.as_deref().unwrap_or_default()),
        );
    }
    if kind == BrokerKind::Kafka {
        println!("(each aggregate's events sit in one partition, in commit order; the rolled-back event is absent)");
    } else {
        println!("(every aggregate's events in commit order; the rolled-back event is absent)");
    }

    // The slot's confirmed position passes the last commit within a status interval.
    let last_commit = rows
        .iter()
        .filter_map(|r| {
            r.header_str(crate::outbox::COMMIT_LSN_HEADER)?
                .parse::<crate::lsn::Lsn>()
                .ok()
        })
        .max()
        .unwrap_or_default();
    let metrics = handles.metrics.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let confirmed = loop {
        let row = client
            .query_one(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'walbox'",
                &[],
            )
            .await?;
        let text: String = row.get(0);
        if text
            .parse::<crate::lsn::Lsn>()
            .is_ok_and(|l| l > last_commit)
        {
            break text;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the slot did not reach the acknowledged position");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let h = &metrics.commit_to_ack;
    println!("\nmetrics:");
    println!(
        "  walbox_events_published_total  {}",
        metrics.events_published.get()
    );
    println!(
        "  walbox_transactions_total      {}",
        metrics.transactions.get()
    );
    println!("  slot confirmed_flush_lsn       {confirmed}");
    if h.get_sample_count() > 0 {
        println!(
            "  commit → ack, mean             {:.1} ms",
            h.get_sample_sum() / h.get_sample_count() as f64 * 1000.0
        );
    }

    let _ = stop_tx.send(());
    match relay.await? {
        Ok(()) => println!("\nwalbox stopped cleanly; removing the throwaway cluster."),
        Err(e) => bail!("walbox failed: {e}"),
    }
    drop(client);
    drop(broker);
    drop(cluster);
    Ok(())
}
