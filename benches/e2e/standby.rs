//! The primary's cost of relaying (issue 11): PostgreSQL CPU on the primary per 100k events
//! with walbox decoding on the primary, and with walbox decoding on a physical standby.
//!
//! One PostgreSQL 16+ primary (`WALBOX_BENCH_STANDBY_PG`, default 16) and its standby (made by
//! the sandbox), both fresh and separate from the main bench's cluster. Each way, the same
//! steps: a slot (on the primary, or on the standby), `rows` outbox rows loaded on the primary
//! in 100-row transactions, the standby caught up, then the walbox binary drains the slot until
//! every event is acked and the slot confirmed past the load. CPU of every server process of
//! the primary (postmaster and children, `/proc/<pid>/stat`) and of the standby is sampled the
//! same way both ways, over the drain only: the load costs the primary the same either way.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio_postgres::{Client, NoTls};

use walbox::config::conninfo::ConnInfo;
use walbox::lsn::Lsn;
use walbox::sandbox::postgres::{PgCluster, PgClusterOptions};
use walbox::sandbox::standby::StandbyOptions;
use walbox::source::standby::while_slot_is_created;

use crate::broker::BenchBroker;
use crate::procs::{self, WalboxChild};
use crate::{fmt_n, PUBLICATION, SCHEMA};

/// Where walbox decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoder {
    /// On the primary, as usual.
    Primary,
    /// On the physical standby, with `postgres.primary_url` set.
    Standby,
}

/// One drain.
#[derive(Debug, Clone)]
pub struct CostDrain {
    /// Events drained.
    pub events: u64,
    /// Start → every event acked and the slot confirmed past the load.
    pub elapsed: Duration,
    /// CPU seconds of the primary's server processes during the drain.
    pub primary_cpu: f64,
    /// CPU seconds of the standby's server processes during the drain.
    pub standby_cpu: f64,
}

/// The primary, its standby, and a connection to each.
pub struct Pair {
    primary: PgCluster,
    standby: PgCluster,
    on_primary: Client,
    on_standby: Client,
    /// `SELECT version()` of the primary.
    pub version: String,
}

impl Pair {
    /// Starts both servers, with the bench's schema on the primary.
    pub async fn start() -> anyhow::Result<Pair> {
        let major: u32 = std::env::var("WALBOX_BENCH_STANDBY_PG")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(16);
        let (primary, standby) = tokio::task::spawn_blocking(move || {
            let primary = PgCluster::start(PgClusterOptions {
                settings: [
                    ("shared_buffers", "256MB"),
                    ("max_wal_size", "4GB"),
                    ("max_slot_wal_keep_size", "-1"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
                watchdog: true,
                major: Some(major),
                ..Default::default()
            })?;
            primary.create_database("bench")?;
            primary.psql("bench", SCHEMA)?;
            let standby = primary.start_standby(StandbyOptions {
                watchdog: true,
                ..Default::default()
            })?;
            Ok::<_, walbox::sandbox::postgres::SandboxError>((primary, standby))
        })
        .await?
        .with_context(|| format!("starting a PostgreSQL {major} primary and standby"))?;
        let connect = |url: String| async move {
            let (client, conn) = tokio_postgres::connect(&url, NoTls).await?;
            tokio::spawn(conn);
            Ok::<_, anyhow::Error>(client)
        };
        let on_primary = connect(primary.socket_url("bench")).await?;
        let on_standby = connect(standby.socket_url("bench")).await?;
        let version = on_primary.query_one("SELECT version()", &[]).await?.get(0);
        Ok(Pair {
            primary,
            standby,
            on_primary,
            on_standby,
            version,
        })
    }

    fn server(&self, at: Decoder) -> (&PgCluster, &Client) {
        match at {
            Decoder::Primary => (&self.primary, &self.on_primary),
            Decoder::Standby => (&self.standby, &self.on_standby),
        }
    }

    /// Creates `slot` where walbox decodes (on the standby, asking the primary for a
    /// running-transactions record meanwhile, as walbox does).
    async fn create_slot(&self, at: Decoder, slot: &str) -> anyhow::Result<()> {
        let (_, client) = self.server(at);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&slot];
        let create = client.execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &params,
        );
        match at {
            Decoder::Primary => create.await?,
            Decoder::Standby => {
                let primary: ConnInfo = self
                    .primary
                    .url("bench")
                    .parse()
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                while_slot_is_created(Some(&primary), slot, create).await?
            }
        };
        Ok(())
    }

    /// How far the standby has replayed.
    async fn replayed(&self) -> anyhow::Result<Lsn> {
        let text: String = self
            .on_standby
            .query_one("SELECT pg_last_wal_replay_lsn()::text", &[])
            .await?
            .get(0);
        text.parse().map_err(|e| anyhow::anyhow!("{e:?}"))
    }

    /// `confirmed_flush_lsn` of `slot` where walbox decodes.
    async fn confirmed(&self, at: Decoder, slot: &str) -> anyhow::Result<Lsn> {
        let text: Option<String> = self
            .server(at)
            .1
            .query_one(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await?
            .get(0);
        text.unwrap_or_default()
            .parse()
            .map_err(|e| anyhow::anyhow!("{e:?}"))
    }

    /// Loads `rows` rows behind a fresh slot at `at`, then drains them with walbox; see the
    /// module docs.
    pub async fn drain(
        &self,
        at: Decoder,
        rows: u64,
        broker: &BenchBroker,
    ) -> anyhow::Result<CostDrain> {
        let slot = match at {
            Decoder::Primary => "cost_on_primary",
            Decoder::Standby => "cost_on_standby",
        };
        let p = &self.on_primary;
        p.batch_execute("TRUNCATE outbox").await?;
        self.create_slot(at, slot).await?;
        let t = Instant::now();
        p.batch_execute("SET synchronous_commit = off").await?;
        p.batch_execute(&format!("CALL bench_load({rows}, 100)"))
            .await?;
        p.batch_execute("RESET synchronous_commit").await?;
        let end: Lsn = p
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await?
            .get::<_, String>(0)
            .parse()
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        for sql in [
            "CHECKPOINT",
            "SELECT pg_logical_emit_message(false, 'walbox-bench', 'end')",
        ] {
            p.batch_execute(sql).await?;
        }
        eprintln!(
            "primary cost ({at:?}): loaded {} rows in {:.1} s",
            fmt_n(rows),
            t.elapsed().as_secs_f64()
        );
        let deadline = Instant::now() + Duration::from_secs(300);
        while self.replayed().await? < end {
            if Instant::now() > deadline {
                bail!("the standby did not replay the load");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        let (server, _) = self.server(at);
        let primary_url = self.primary.socket_url("bench");
        let extra: Vec<(&str, String)> = match at {
            Decoder::Primary => Vec::new(),
            Decoder::Standby => vec![("WALBOX_POSTGRES_PRIMARY_URL", primary_url)],
        };
        let cpu = || {
            (
                procs::postgres_cpu_seconds(self.primary.data_dir()),
                procs::postgres_cpu_seconds(self.standby.data_dir()),
            )
        };
        let cpu0 = cpu();
        let t0 = Instant::now();
        let mut walbox = WalboxChild::start(
            &server.socket_url("bench"),
            slot,
            PUBLICATION,
            &broker.bootstrap(),
            false,
            &extra,
        )?;
        let deadline = t0 + Duration::from_secs(120 + rows / 2_000);
        let mut acked = false;
        let (elapsed, used) = loop {
            walbox.check_alive()?;
            let now = cpu();
            let used = (now.0 - cpu0.0, now.1 - cpu0.1);
            acked = acked || walbox.metrics().is_some_and(|m| m.published >= rows);
            if acked && self.confirmed(at, slot).await? >= end {
                break (t0.elapsed(), used);
            }
            if Instant::now() > deadline {
                bail!("walbox did not drain {slot} in time");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        walbox.stop()?;
        self.server(at)
            .1
            .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
            .await?;
        let d = CostDrain {
            events: rows,
            elapsed,
            primary_cpu: used.0,
            standby_cpu: used.1,
        };
        eprintln!("primary cost ({at:?}): {d:?}");
        Ok(d)
    }
}
