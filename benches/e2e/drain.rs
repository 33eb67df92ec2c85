//! Backlog drains: `pg_recvlogical`, the walbox binary and the polling relay, each draining the
//! same rows, with the CPU of PostgreSQL and of the relay, WAL written and dead tuples.

use std::time::{Duration, Instant};

use anyhow::bail;
use walbox::lsn::Lsn;

use crate::procs::{self, WalboxChild};
use crate::{poller, Bench, Drain, Switches, PUBLICATION};

/// How many times each drain pair (walbox and `pg_recvlogical` on the same backlog) runs: the
/// VM's speed moves within a run, and which of the two drains first is not what the ratio
/// should measure.
pub const DRAIN_PAIRS: usize = 4;

/// The `pg_recvlogical` and walbox slots of pair `i` of `tag`.
fn pair_slot_names(tag: &str, i: usize) -> (String, String) {
    (format!("recv_{tag}_{i}"), format!("walbox_{tag}_{i}"))
}

/// Every slot [`Bench::drain_pairs`] drains for `tag`, to create before the backlog is loaded.
pub fn pair_slots(tag: &str) -> Vec<String> {
    (0..DRAIN_PAIRS)
        .flat_map(|i| {
            let (recv, walbox) = pair_slot_names(tag, i);
            [recv, walbox]
        })
        .collect()
}

/// The at-least-once and exactly-once walbox slots of pair `i` of [`Bench::drain_eos_pairs`].
fn eos_slot_names(i: usize) -> (String, String) {
    (format!("walbox_alo_{i}"), format!("walbox_eos_{i}"))
}

/// Every slot [`Bench::drain_eos_pairs`] drains, to create before the backlog is loaded.
pub fn eos_pair_slots() -> Vec<String> {
    (0..DRAIN_PAIRS)
        .flat_map(|i| {
            let (alo, eos) = eos_slot_names(i);
            [alo, eos]
        })
        .collect()
}

impl Bench {
    /// How long a drain of `rows` may take before the bench gives up.
    pub fn timeout(rows: u64) -> Duration {
        Duration::from_secs(120 + rows / 2_000)
    }

    /// Drains `slot` with pg_recvlogical to `/dev/null` up to `end`.
    pub async fn drain_recvlogical(
        &self,
        slot: &str,
        end: Lsn,
        rows: u64,
    ) -> anyhow::Result<Drain> {
        self.drain_recvlogical_many(&[(slot.to_owned(), PUBLICATION.to_owned())], end, rows)
            .await
    }

    /// The drain pair [`DRAIN_PAIRS`] times on the slots of [`pair_slots`], `pg_recvlogical`
    /// first in even pairs and walbox first in odd ones: (walbox, `pg_recvlogical`) per pair.
    pub async fn drain_pairs(
        &self,
        tag: &str,
        end: Lsn,
        rows: u64,
    ) -> anyhow::Result<Vec<(Drain, Drain)>> {
        let mut pairs = Vec::with_capacity(DRAIN_PAIRS);
        for i in 0..DRAIN_PAIRS {
            let (recv_slot, walbox_slot) = pair_slot_names(tag, i);
            let pair = if i % 2 == 0 {
                let recv = self.drain_recvlogical(&recv_slot, end, rows).await?;
                (self.drain_walbox(&walbox_slot, end, rows).await?, recv)
            } else {
                let wb = self.drain_walbox(&walbox_slot, end, rows).await?;
                (wb, self.drain_recvlogical(&recv_slot, end, rows).await?)
            };
            pairs.push(pair);
        }
        Ok(pairs)
    }

    /// walbox at-least-once and in exactly-once mode (`eos`: its variables) on the same
    /// backlog, [`DRAIN_PAIRS`] times on the slots of [`eos_pair_slots`], at-least-once first
    /// in even pairs and exactly-once first in odd ones: (at-least-once, exactly-once) per pair.
    /// Within one run, so that the ratio does not depend on what else the machine does.
    pub async fn drain_eos_pairs(
        &self,
        end: Lsn,
        rows: u64,
        eos: &[(&str, String)],
    ) -> anyhow::Result<Vec<(Drain, Drain)>> {
        let mut pairs = Vec::with_capacity(DRAIN_PAIRS);
        for i in 0..DRAIN_PAIRS {
            let (alo_slot, eos_slot) = eos_slot_names(i);
            let pair = if i % 2 == 0 {
                let alo = self.drain_walbox(&alo_slot, end, rows).await?;
                (
                    alo,
                    self.drain_walbox_with(&eos_slot, end, rows, eos).await?,
                )
            } else {
                let e = self.drain_walbox_with(&eos_slot, end, rows, eos).await?;
                (self.drain_walbox(&alo_slot, end, rows).await?, e)
            };
            pairs.push(pair);
        }
        Ok(pairs)
    }

    /// Drains `slot` with the walbox binary until `rows` events are acked and the slot passed
    /// `end`.
    pub async fn drain_walbox(&self, slot: &str, end: Lsn, rows: u64) -> anyhow::Result<Drain> {
        self.drain_walbox_with(slot, end, rows, &[]).await
    }

    /// [`Bench::drain_walbox`] with more `WALBOX_*` variables.
    pub async fn drain_walbox_with(
        &self,
        slot: &str,
        end: Lsn,
        rows: u64,
        extra: &[(&str, String)],
    ) -> anyhow::Result<Drain> {
        let slots = [slot.to_owned()];
        Ok(self
            .drain_walbox_slots(slot, &slots, end, rows, extra)
            .await?
            .0)
    }

    /// walbox on `slot` (with `postgres.shards`, the base of its shards' slots) until `rows`
    /// events are acked and every one of `slots` passed `end`; with the most threads the process
    /// had and its context switches.
    pub async fn drain_walbox_slots(
        &self,
        slot: &str,
        slots: &[String],
        end: Lsn,
        rows: u64,
        extra: &[(&str, String)],
    ) -> anyhow::Result<(Drain, Switches)> {
        let wal0 = self.wal_lsn().await?;
        let dead0 = self.dead_tuples().await?;
        let cpu0 = procs::postgres_cpu_seconds(self.cluster.data_dir());
        let t0 = Instant::now();
        let brokers = self.broker.bootstrap();
        let mut walbox = WalboxChild::start(&self.url, slot, PUBLICATION, &brokers, false, extra)?;
        let pid = walbox.pid();
        let deadline = t0 + Self::timeout(rows);
        let mut acked = None;
        let (mut relay_cpu, mut rss, mut pg_cpu) = (0.0f64, 0u64, 0.0f64);
        let mut seen = Switches::default();
        let confirmed = loop {
            walbox.check_alive()?;
            relay_cpu = procs::cpu_seconds(pid).max(relay_cpu);
            rss = procs::peak_rss(pid).unwrap_or(0).max(rss);
            if let Some((threads, switches)) = procs::threads_and_switches(pid) {
                seen.threads = seen.threads.max(threads);
                seen.switches = seen.switches.max(switches);
            }
            pg_cpu = pg_cpu.max(procs::postgres_cpu_seconds(self.cluster.data_dir()) - cpu0);
            if acked.is_none() && walbox.metrics().is_some_and(|m| m.published >= rows) {
                acked = Some(t0.elapsed());
            }
            if acked.is_some() {
                let mut all = true;
                for s in slots {
                    all &= self.confirmed(s).await? >= end;
                }
                if all {
                    break t0.elapsed();
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "walbox did not drain {} in time (published {:?})",
                    slots.join(", "),
                    walbox.metrics().map(|m| m.published)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let wal_bytes = self.wal_lsn().await?.bytes_since(wal0);
        walbox.stop()?;
        let d = Drain {
            events: rows,
            acked: acked.unwrap_or(confirmed),
            confirmed,
            pg_cpu,
            relay_cpu: Some(relay_cpu),
            peak_rss: Some(rss),
            wal_bytes,
            dead_tuples: self.dead_tuples().await? - dead0,
        };
        eprintln!(
            "walbox {slot} ×{} (pid {pid}): {:.0} events/s, {} threads, {} context switches {d:?}",
            slots.len(),
            d.rate(),
            seen.threads,
            seen.switches
        );
        Ok((d, seen))
    }

    /// Drains every unpublished row with the polling relay.
    pub async fn drain_poller(&self, rows: u64) -> anyhow::Result<Drain> {
        let wal0 = self.wal_lsn().await?;
        let dead0 = self.dead_tuples().await?;
        let mut poller = poller::Poller::connect(&self.url, &self.broker.bootstrap()).await?;
        let cpu0 = procs::postgres_cpu_seconds(self.cluster.data_dir());
        let t0 = Instant::now();
        let published = poller.drain().await?;
        let elapsed = t0.elapsed();
        let pg_cpu = procs::postgres_cpu_seconds(self.cluster.data_dir()) - cpu0;
        if published != rows {
            bail!("the polling relay published {published} of {rows} rows");
        }
        let wal_bytes = self.wal_lsn().await?.bytes_since(wal0);
        poller.flush_stats().await?;
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let d = Drain {
            events: rows,
            acked: elapsed,
            confirmed: elapsed,
            pg_cpu,
            relay_cpu: None,
            peak_rss: None,
            wal_bytes,
            dead_tuples: self.dead_tuples().await? - dead0,
        };
        eprintln!("polling relay: {:.0} events/s {d:?}", d.rate());
        Ok(d)
    }
}
