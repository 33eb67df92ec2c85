//! Scaling through shards (issue 12): the same backlog drained through 1, 2 and 4 shards by
//! walbox (`postgres.shards`) and by as many `pg_recvlogical` processes on identical slots, with
//! PostgreSQL's CPU per 100k events for each; and the alternative mechanism, a hash-partitioned
//! outbox with one publication per partition, drained by `pg_recvlogical` the same way.
//!
//! Like with like: for each layout the bench creates the shards' publications exactly as walbox
//! does (the row filters and comments of `walbox::shard`), then walbox's slots and the
//! references' slots at one LSN, then loads the rows; `pg_recvlogical` drains its slots, one
//! process per slot started together, over the same Unix socket walbox uses, and the drain ends
//! when the last one exits at the end of the backlog. CPU is sampled the same way for both
//! (`procs`), including the walsenders that exited.

use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use walbox::config::ShardOf;
use walbox::lsn::Lsn;

use crate::procs;
use crate::{Bench, Drain, PUBLICATION};

/// The layouts measured.
pub const LAYOUTS: [u32; 3] = [1, 2, 4];

/// One layout's drains of the same backlog.
#[derive(Debug, Clone)]
pub struct ShardRun {
    /// Shards (slots).
    pub shards: u32,
    /// walbox with `postgres.shards` = `shards`.
    pub walbox: Drain,
    /// `shards` pg_recvlogical processes.
    pub recv: Drain,
    /// walbox's threads and context switches per event over its drain.
    pub walbox_threads: u64,
    /// See `walbox_threads`.
    pub walbox_switches_per_event: f64,
}

/// The hash-partitioned alternative at 4 shards, against row filters at 4 shards.
#[derive(Debug, Clone)]
pub struct PartitionRun {
    /// 4 pg_recvlogical processes, one per partition's publication.
    pub recv: Drain,
    /// Seconds the load took into the partitioned table.
    pub load_secs: f64,
    /// Seconds the same load took into the plain table (row filters).
    pub plain_load_secs: f64,
}

/// The partitioned outbox (4 hash partitions by aggregate_id), its publications and loader.
const PARTITIONED: &str = r#"
CREATE TABLE outbox_hp (LIKE outbox INCLUDING DEFAULTS) PARTITION BY HASH (aggregate_id);
CREATE TABLE outbox_hp_0 PARTITION OF outbox_hp FOR VALUES WITH (MODULUS 4, REMAINDER 0) WITH (autovacuum_enabled = false);
CREATE TABLE outbox_hp_1 PARTITION OF outbox_hp FOR VALUES WITH (MODULUS 4, REMAINDER 1) WITH (autovacuum_enabled = false);
CREATE TABLE outbox_hp_2 PARTITION OF outbox_hp FOR VALUES WITH (MODULUS 4, REMAINDER 2) WITH (autovacuum_enabled = false);
CREATE TABLE outbox_hp_3 PARTITION OF outbox_hp FOR VALUES WITH (MODULUS 4, REMAINDER 3) WITH (autovacuum_enabled = false);
CREATE PUBLICATION walbox_hp_0 FOR TABLE outbox_hp_0 WITH (publish = 'insert');
CREATE PUBLICATION walbox_hp_1 FOR TABLE outbox_hp_1 WITH (publish = 'insert');
CREATE PUBLICATION walbox_hp_2 FOR TABLE outbox_hp_2 WITH (publish = 'insert');
CREATE PUBLICATION walbox_hp_3 FOR TABLE outbox_hp_3 WITH (publish = 'insert');
CREATE PROCEDURE bench_load_hp(total bigint, per_tx bigint) LANGUAGE plpgsql AS $$
DECLARE done bigint := 0; k bigint;
BEGIN
  WHILE done < total LOOP
    k := least(per_tx, total - done);
    INSERT INTO outbox_hp (id, aggregate_id, topic, event_type, payload)
    SELECT n, 'order-' || n, 'orders', 'OrderCreated',
           format('{"order_id": %s, "customer_id": "cust-%s", "amount": 129.99, "status": "CREATED", "items": [{"sku": "SKU-000123", "qty": 2, "price": 49.99}, {"sku": "SKU-000456", "qty": 1, "price": 30.01}]}', n, n % 100000)::jsonb
    FROM generate_series(done + 1, done + k) n;
    done := done + k;
    COMMIT;
  END LOOP;
END $$;
"#;

impl Bench {
    /// The publications of a layout of `n` shards, made as walbox makes them (row filter on
    /// `aggregate_id`, the comment walbox checks); `[PUBLICATION]` for one shard.
    async fn shard_publications(&self, n: u32) -> anyhow::Result<Vec<String>> {
        if n == 1 {
            return Ok(vec![PUBLICATION.to_owned()]);
        }
        let mut names = Vec::new();
        for index in 0..n {
            let shard = ShardOf { index, count: n };
            let name = format!("{PUBLICATION}{}", shard.suffix());
            let filter = walbox::shard::row_filter("aggregate_id", "text", shard)
                .context("a row filter for text")?;
            let comment = walbox::shard::comment(
                shard,
                &[("public.outbox".to_owned(), "aggregate_id".to_owned())],
            );
            self.admin
                .batch_execute(&format!(
                    "DROP PUBLICATION IF EXISTS {name}; \
                     CREATE PUBLICATION {name} FOR TABLE outbox WHERE {filter} WITH (publish = 'insert'); \
                     COMMENT ON PUBLICATION {name} IS '{comment}'"
                ))
                .await?;
            names.push(name);
        }
        Ok(names)
    }

    /// Drains every `(slot, publication)` with its own `pg_recvlogical` to `/dev/null`, all
    /// started together, up to `end`; `rows` events in all.
    pub async fn drain_recvlogical_many(
        &self,
        slots: &[(String, String)],
        end: Lsn,
        rows: u64,
    ) -> anyhow::Result<Drain> {
        let conninfo = format!(
            "host={} port={} user=walbox dbname=bench",
            self.cluster.socket_dir().display(),
            self.cluster.port()
        );
        let wal0 = self.wal_lsn().await?;
        let dead0 = self.dead_tuples().await?;
        let cpu0 = procs::postgres_cpu_seconds(self.cluster.data_dir());
        let t0 = Instant::now();
        let mut children: Vec<(Child, f64)> = Vec::new();
        for (slot, publication) in slots {
            let child = procs::recvlogical(
                self.cluster.bin_dir(),
                &conninfo,
                slot,
                &end.to_string(),
                publication,
            )?;
            children.push((child, 0.0));
        }
        let mut pg_cpu = 0.0f64;
        let deadline = t0 + Self::timeout(rows);
        loop {
            let mut running = 0;
            for (child, cpu) in &mut children {
                if let Some(status) = child.try_wait()? {
                    if !status.success() {
                        bail!("pg_recvlogical failed: {status}");
                    }
                } else {
                    running += 1;
                    *cpu = procs::cpu_seconds(child.id()).max(*cpu);
                }
            }
            pg_cpu = pg_cpu.max(procs::postgres_cpu_seconds(self.cluster.data_dir()) - cpu0);
            if running == 0 {
                break;
            }
            if Instant::now() > deadline {
                for (child, _) in &mut children {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                bail!("pg_recvlogical did not finish in time");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let elapsed = t0.elapsed();
        for (slot, _) in slots {
            let confirmed = self.confirmed(slot).await?;
            if confirmed < end {
                bail!("pg_recvlogical exited at {confirmed} on {slot}, before the end of the backlog {end}");
            }
        }
        let d = Drain {
            events: rows,
            acked: elapsed,
            confirmed: elapsed,
            pg_cpu: pg_cpu.max(procs::postgres_cpu_seconds(self.cluster.data_dir()) - cpu0),
            relay_cpu: Some(children.iter().map(|(_, cpu)| cpu).sum()),
            peak_rss: None,
            wal_bytes: self.wal_lsn().await?.bytes_since(wal0),
            dead_tuples: self.dead_tuples().await? - dead0,
        };
        eprintln!(
            "pg_recvlogical ×{}: {:.0} events/s {d:?}",
            slots.len(),
            d.rate()
        );
        Ok(d)
    }

    /// walbox with `postgres.shards = n` on slot base `base` until every event is acked and
    /// every shard's slot passed `end`; with its threads and context switches per event.
    async fn drain_walbox_shards(
        &self,
        base: &str,
        n: u32,
        end: Lsn,
        rows: u64,
    ) -> anyhow::Result<(Drain, u64, f64)> {
        let slots: Vec<String> = match n {
            1 => vec![base.to_owned()],
            n => (0..n)
                .map(|index| format!("{base}{}", ShardOf { index, count: n }.suffix()))
                .collect(),
        };
        let extra = [("WALBOX_POSTGRES_SHARDS", n.to_string())];
        let (d, seen) = self
            .drain_walbox_slots(base, &slots, end, rows, &extra)
            .await?;
        Ok((d, seen.threads, seen.switches as f64 / rows.max(1) as f64))
    }

    /// The backlog of `rows` rows in `per_tx`-row transactions drained through each of
    /// [`LAYOUTS`] by walbox and by as many pg_recvlogical processes.
    pub async fn scaling(&self, rows: u64, per_tx: u64) -> anyhow::Result<Vec<ShardRun>> {
        let mut runs = Vec::new();
        for n in LAYOUTS {
            let publications = self.shard_publications(n).await?;
            let base = format!("wbs{n}");
            let walbox_slots: Vec<String> = match n {
                1 => vec![base.clone()],
                n => (0..n)
                    .map(|index| format!("{base}{}", ShardOf { index, count: n }.suffix()))
                    .collect(),
            };
            let recv: Vec<(String, String)> = publications
                .iter()
                .enumerate()
                .map(|(k, p)| (format!("recv_s{n}_{k}"), p.clone()))
                .collect();
            let mut slots: Vec<&str> = walbox_slots.iter().map(String::as_str).collect();
            slots.extend(recv.iter().map(|(s, _)| s.as_str()));
            let end = self.backlog(&slots, rows, per_tx).await?;
            let recv = self.drain_recvlogical_many(&recv, end, rows).await?;
            let (walbox, threads, switches) = self.drain_walbox_shards(&base, n, end, rows).await?;
            runs.push(ShardRun {
                shards: n,
                walbox,
                recv,
                walbox_threads: threads,
                walbox_switches_per_event: switches,
            });
            self.drop_slots().await?;
        }
        Ok(runs)
    }

    /// The hash-partitioned outbox at 4 shards: the same rows loaded into `outbox_hp` and
    /// drained by 4 pg_recvlogical processes, one per partition's publication. `plain_load_secs`
    /// is the load time of the row-filter layout's backlog, for comparison.
    pub async fn partitioned(&self, rows: u64, per_tx: u64) -> anyhow::Result<PartitionRun> {
        self.admin.batch_execute(PARTITIONED).await?;
        // The plain table's load, timed the same way, on the same rows.
        let (_, plain_load_secs) = self
            .backlog_into("outbox", "bench_load", &[], rows, per_tx)
            .await?;
        self.admin.batch_execute("TRUNCATE outbox").await?;
        let recv: Vec<(String, String)> = (0..4)
            .map(|k| (format!("recv_hp_{k}"), format!("walbox_hp_{k}")))
            .collect();
        let slots: Vec<&str> = recv.iter().map(|(s, _)| s.as_str()).collect();
        let (end, load_secs) = self
            .backlog_into("outbox_hp", "bench_load_hp", &slots, rows, per_tx)
            .await?;
        let recv = self.drain_recvlogical_many(&recv, end, rows).await?;
        self.drop_slots().await?;
        self.admin
            .batch_execute(
                "DROP PUBLICATION walbox_hp_0, walbox_hp_1, walbox_hp_2, walbox_hp_3; \
                 DROP TABLE outbox_hp; DROP PROCEDURE bench_load_hp",
            )
            .await?;
        Ok(PartitionRun {
            recv,
            load_secs,
            plain_load_secs,
        })
    }
}

/// The cost model fitted to the runs, in seconds of CPU per event. PostgreSQL's CPU per event
/// with `s` shards is `decode × s + output` (every walsender decodes all of the WAL; the output
/// is divided among them); walbox's is `relay + relay_shard × s` (the per-event work, and what
/// each further session adds: its producer's threads and wake-ups).
#[derive(Debug, Clone, Copy)]
pub struct CostModel {
    /// Per walsender, per event of the WAL it reads (decoding, reorder buffer, row filter).
    pub decode: f64,
    /// Per event sent (pgoutput, the socket), summed over walsenders.
    pub output: f64,
    /// walbox's CPU per event relayed, with no shard overhead.
    pub relay: f64,
    /// walbox's CPU per event added by each shard.
    pub relay_shard: f64,
}

/// Least squares of `y = slope × x + intercept`, both clamped at 0 (a cost is never negative).
fn line(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let sxx: f64 = points.iter().map(|(x, _)| x * x).sum();
    let sxy: f64 = points.iter().map(|(x, y)| x * y).sum();
    let denom = n * sxx - sx * sx;
    if points.len() < 2 || denom == 0.0 {
        return None;
    }
    let slope = ((n * sxy - sx * sy) / denom).max(0.0);
    let intercept = ((sy - slope * sx) / n).max(0.0);
    Some((slope, intercept))
}

impl CostModel {
    /// Fits both lines over the runs (1, 2 and 4 shards).
    pub fn fit(runs: &[ShardRun]) -> Option<CostModel> {
        let per_event = |cpu: f64, events: u64| cpu / events.max(1) as f64;
        let pg: Vec<(f64, f64)> = runs
            .iter()
            .map(|r| (r.shards as f64, per_event(r.walbox.pg_cpu, r.walbox.events)))
            .collect();
        let relay: Vec<(f64, f64)> = runs
            .iter()
            .map(|r| {
                let cpu = r.walbox.relay_cpu.unwrap_or(0.0);
                (r.shards as f64, per_event(cpu, r.walbox.events))
            })
            .collect();
        let (decode, output) = line(&pg)?;
        let (relay_shard, relay) = line(&relay)?;
        Some(CostModel {
            decode,
            output,
            relay,
            relay_shard,
        })
    }

    /// Events/s with `shards` shards on `cores` cores: the least of one walsender's ceiling
    /// (it decodes every event and sends its share: `1 / (decode + output / shards)`) and the
    /// machine's (`cores / (decode × shards + output + relay + relay_shard × shards)`). A
    /// shard's relay session is one task on one core at a time, but at these costs it is never
    /// the bound before its walsender.
    pub fn throughput(&self, shards: u32, cores: u32) -> f64 {
        let s = shards as f64;
        let walsender = 1.0 / (self.decode + self.output / s);
        let machine =
            cores as f64 / (self.decode * s + self.output + self.relay + self.relay_shard * s);
        walsender.min(machine)
    }

    /// The best number of shards on `cores` cores and its throughput.
    pub fn best(&self, cores: u32) -> (u32, f64) {
        (1..=cores.max(1))
            .map(|s| (s, self.throughput(s, cores)))
            .fold((1, 0.0), |best, x| if x.1 > best.1 { x } else { best })
    }
}
