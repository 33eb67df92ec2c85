//! Processes the bench starts or watches: `/proc` readings (CPU seconds, peak RSS), the walbox
//! binary as a child process, and `pg_recvlogical`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};

/// Kernel clock ticks per second (`getconf CLK_TCK`; 100 on Linux).
pub fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// `(ppid, utime + stime in ticks)` of a process, from `/proc/<pid>/stat`.
fn stat(pid: u32) -> Option<(u32, u64)> {
    stat_fields(pid).map(|(ppid, own, _)| (ppid, own))
}

/// `(ppid, utime + stime, cutime + cstime)` in ticks: its own CPU and that of its children it
/// has reaped.
fn stat_fields(pid: u32) -> Option<(u32, u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command name: f[0] = state (field 3), so field k is f[k - 3].
    let ppid = f.get(1)?.parse().ok()?;
    let field = |i: usize| -> Option<u64> { f.get(i)?.parse().ok() };
    Some((ppid, field(11)? + field(12)?, field(13)? + field(14)?))
}

/// CPU seconds used so far by process `pid` (0 when it is gone).
pub fn cpu_seconds(pid: u32) -> f64 {
    stat(pid).map_or(0.0, |(_, t)| t as f64 / clock_ticks())
}

/// Peak resident set size (`VmHWM`) of `pid`, in bytes.
pub fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// `(threads, context switches so far)` of `pid`: voluntary and involuntary switches summed over
/// its live threads (`/proc/<pid>/task/*/status`).
pub fn threads_and_switches(pid: u32) -> Option<(u64, u64)> {
    let mut threads = 0;
    let mut switches = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        threads += 1;
        for line in status.lines() {
            if let Some(n) = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                switches += n.trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    Some((threads, switches))
}

/// CPU seconds used so far by the PostgreSQL server: the postmaster and all its children
/// (backends, walsenders, checkpointer, WAL writer, …), those alive now and, through the
/// postmaster's `cutime`/`cstime`, those that exited (a walsender whose client finished).
pub fn postgres_cpu_seconds(data_dir: &Path) -> f64 {
    let Some(postmaster) = std::fs::read_to_string(data_dir.join("postmaster.pid"))
        .ok()
        .and_then(|t| t.lines().next().and_then(|l| l.trim().parse::<u32>().ok()))
    else {
        return 0.0;
    };
    let mut ticks = stat_fields(postmaster).map_or(0, |(_, own, reaped)| own + reaped);
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Some((ppid, t)) = stat(pid) {
            if ppid == postmaster {
                ticks += t;
            }
        }
    }
    ticks as f64 / clock_ticks()
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// `pg_recvlogical` (in `bin_dir`) draining `slot` of `conninfo` to `/dev/null` up to `end`,
/// with pgoutput on `publication`: PostgreSQL's own pace for the stream walbox reads.
pub fn recvlogical(
    bin_dir: &Path,
    conninfo: &str,
    slot: &str,
    end: &str,
    publication: &str,
) -> anyhow::Result<Child> {
    Command::new(bin_dir.join("pg_recvlogical"))
        .args([
            "-d",
            conninfo,
            "-S",
            slot,
            "--start",
            "--no-loop",
            "-E",
            end,
        ])
        .args(["-o", "proto_version=1", "-o"])
        .arg(format!("publication_names={publication}"))
        .args(["-f", "/dev/null"])
        .stdin(Stdio::null())
        .spawn()
        .context("starting pg_recvlogical")
}

/// Sends SIGTERM to `pid` (through kill(1): the crate forbids `unsafe`).
pub fn terminate(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}

/// The walbox binary running as a child process.
pub struct WalboxChild {
    child: Child,
    http_port: u16,
}

/// What the bench reads from walbox's `/metrics`.
#[derive(Debug, Default, Clone)]
pub struct WalboxMetrics {
    /// `walbox_events_published_total`.
    pub published: u64,
    /// Cumulative `walbox_commit_to_ack_seconds` buckets: `(le, count)`.
    pub commit_to_ack: Vec<(f64, u64)>,
    /// Exactly-once mode's steps of a Kafka transaction, `(step, seconds summed, count)`:
    /// `walbox_kafka_transaction_phase_seconds{phase}` and, as `commit`,
    /// `walbox_kafka_transaction_commit_seconds`.
    pub txn_steps: Vec<(String, f64, u64)>,
    /// Exactly-once mode's steps again, `(step, within 10 ms, within 25 ms, all)`: transactions
    /// counted in the step's 10 ms and 25 ms buckets and in all of its buckets (where the tail
    /// of a transaction's time is).
    pub txn_steps_within: Vec<(String, u64, u64, u64)>,
}

impl WalboxMetrics {
    /// `step`'s seconds and count, summed.
    fn step(&mut self, step: &str) -> &mut (String, f64, u64) {
        let at = match self.txn_steps.iter().position(|(s, ..)| s == step) {
            Some(at) => at,
            None => {
                self.txn_steps.push((step.to_owned(), 0.0, 0));
                self.txn_steps.len() - 1
            }
        };
        &mut self.txn_steps[at]
    }

    /// Reads one `_bucket` line of a transaction step: its 10 ms, 25 ms and `+Inf` buckets
    /// count.
    fn txn_step_bucket(&mut self, line: &str) -> Option<()> {
        let (labels, count) = line.split_once("} ")?;
        let step = match labels.split_once("phase=\"") {
            Some((_, rest)) => rest.split_once('"')?.0.to_owned(),
            None => "commit".to_owned(),
        };
        let le = labels.split_once("le=\"")?.1.split_once('"')?.0;
        let count: u64 = count.trim().parse().ok()?;
        let at = match self.txn_steps_within.iter().position(|(s, ..)| *s == step) {
            Some(at) => at,
            None => {
                self.txn_steps_within.push((step, 0, 0, 0));
                self.txn_steps_within.len() - 1
            }
        };
        let entry = &mut self.txn_steps_within[at];
        match le {
            "0.01" => entry.1 += count,
            "0.025" => entry.2 += count,
            "+Inf" => entry.3 += count,
            _ => {}
        }
        Some(())
    }

    /// Reads one `_sum` or `_count` line of a transaction step.
    fn txn_step_line(&mut self, line: &str) -> Option<()> {
        let (name, value) = line.rsplit_once(' ')?;
        let (step, sum) =
            if let Some(rest) = name.strip_prefix("walbox_kafka_transaction_phase_seconds_") {
                let (kind, label) = rest.split_once("{phase=\"")?;
                (label.strip_suffix("\"}")?.to_owned(), kind == "sum")
            } else {
                let kind = name.strip_prefix("walbox_kafka_transaction_commit_seconds_")?;
                ("commit".to_owned(), kind == "sum")
            };
        let entry = self.step(&step);
        if sum {
            entry.1 += value.trim().parse::<f64>().ok()?;
        } else {
            entry.2 += value.trim().parse::<u64>().ok()?;
        }
        Some(())
    }

    /// Per step, between `before` and `self`: the transactions for which it took more than
    /// 10 ms, more than 25 ms, and all of them.
    pub fn txn_steps_slow(&self, before: &WalboxMetrics) -> Vec<(String, u64, u64, u64)> {
        self.txn_steps_within
            .iter()
            .map(|(step, in10, in25, all)| {
                let (in10_0, in25_0, all0) = before
                    .txn_steps_within
                    .iter()
                    .find(|(s, ..)| s == step)
                    .map_or((0, 0, 0), |(_, a, b, c)| (*a, *b, *c));
                let all = all.saturating_sub(all0);
                let over =
                    |within: u64, within0: u64| all.saturating_sub(within.saturating_sub(within0));
                (step.clone(), over(*in10, in10_0), over(*in25, in25_0), all)
            })
            .collect()
    }

    /// Mean milliseconds per transaction of each step between `before` and `self`.
    pub fn txn_step_means(&self, before: &WalboxMetrics) -> Vec<(String, f64)> {
        self.txn_steps
            .iter()
            .filter_map(|(step, sum, count)| {
                let (s0, c0) = before
                    .txn_steps
                    .iter()
                    .find(|(s, ..)| s == step)
                    .map_or((0.0, 0), |(_, s, c)| (*s, *c));
                let n = count.checked_sub(c0).filter(|n| *n > 0)?;
                Some((step.clone(), (sum - s0) * 1000.0 / n as f64))
            })
            .collect()
    }
}

impl WalboxChild {
    /// Starts `walbox run` on Kafka `brokers` with its configuration in `WALBOX_*` variables,
    /// `extra` last.
    pub fn start(
        pg_url: &str,
        slot: &str,
        publication: &str,
        brokers: &str,
        create_slot: bool,
        extra: &[(&str, String)],
    ) -> anyhow::Result<Self> {
        let mut env = vec![("WALBOX_KAFKA_BROKERS", brokers.to_owned())];
        env.extend(extra.iter().cloned());
        Self::start_on(pg_url, slot, publication, create_slot, &env)
    }

    /// Starts `walbox run` with no broker of its own: `extra` names one (`WALBOX_REDIS_URL`,
    /// `WALBOX_KAFKA_BROKERS`, …).
    pub fn start_on(
        pg_url: &str,
        slot: &str,
        publication: &str,
        create_slot: bool,
        extra: &[(&str, String)],
    ) -> anyhow::Result<Self> {
        let http_port = free_port()?;
        let child = Command::new(env!("CARGO_BIN_EXE_walbox"))
            .arg("run")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("WALBOX_POSTGRES_URL", pg_url)
            .env("WALBOX_POSTGRES_SLOT", slot)
            .env("WALBOX_POSTGRES_PUBLICATION", publication)
            .env("WALBOX_POSTGRES_CREATE_SLOT", create_slot.to_string())
            .env("WALBOX_HTTP_LISTEN", format!("127.0.0.1:{http_port}"))
            .env(
                "WALBOX_LOG",
                std::env::var("WALBOX_BENCH_WALBOX_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .envs(extra.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .spawn()
            .context("starting the walbox binary")?;
        Ok(WalboxChild { child, http_port })
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails when the child has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("walbox exited early: {status}");
        }
        Ok(())
    }

    /// Scrapes `/metrics`; `None` while the listener is not up yet.
    pub fn metrics(&self) -> Option<WalboxMetrics> {
        let mut s = TcpStream::connect(("127.0.0.1", self.http_port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let mut m = WalboxMetrics::default();
        for line in text.lines() {
            // Unlabelled, or one line per shard (`{slot="…"}`): summed.
            if let Some(rest) = line.strip_prefix("walbox_events_published_total") {
                if rest.starts_with(' ') || rest.starts_with('{') {
                    m.published += rest.rsplit(' ').next()?.trim().parse::<u64>().ok()?;
                }
            } else if let Some(rest) =
                line.strip_prefix("walbox_commit_to_ack_seconds_bucket{le=\"")
            {
                // Shards' buckets carry a slot label too: only the unsharded ones are read.
                let Some((le, count)) = rest.split_once("\"} ") else {
                    continue;
                };
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                m.commit_to_ack.push((le, count.trim().parse().ok()?));
            } else if line.starts_with("walbox_kafka_transaction_phase_seconds_bucket{")
                || line.starts_with("walbox_kafka_transaction_commit_seconds_bucket{")
            {
                m.txn_step_bucket(line);
            } else if (line.starts_with("walbox_kafka_transaction_phase_seconds_")
                || line.starts_with("walbox_kafka_transaction_commit_seconds_"))
                && !line.contains("_bucket")
            {
                m.txn_step_line(line);
            }
        }
        Some(m)
    }

    /// SIGTERM, then waits for a clean exit (killed after 60 s).
    pub fn stop(mut self) -> anyhow::Result<()> {
        terminate(self.child.id());
        for _ in 0..600 {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("walbox stopped with {status}");
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        bail!("walbox did not stop within 60 s of SIGTERM; killed")
    }
}

impl Drop for WalboxChild {
    /// Kills a child that was not stopped (error paths).
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
