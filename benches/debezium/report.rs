//! The result table: walbox and Debezium per measurement (medians over the pairs), the ratio
//! walbox / Debezium and the targets (reported, never asserted), then every pair's rates and
//! the live runs, preceded by the run's set-up (versions, machine, load).

use std::time::Duration;

use crate::drain::Drain;
use crate::format::{fmt_list, fmt_n, k, machine, median, mib, ms, ratio};
use crate::live::Latency;
use crate::relay::Which;
use crate::Settings;

/// One table row.
struct Row {
    measurement: String,
    walbox: String,
    debezium: String,
    ratio: String,
    target: String,
}

/// Collected results.
pub struct Report {
    header: Vec<String>,
    rows: Vec<Row>,
    pairs: Vec<String>,
    live: Vec<(Which, u64, Latency)>,
    load_at_start: String,
    /// `SELECT version()`.
    pub pg_version: String,
    /// Wall time of the whole run.
    pub elapsed: Duration,
}

/// `/proc/loadavg`'s three load averages.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|t| t.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "?".into())
}

impl Report {
    /// An empty report for a run with `settings`.
    pub fn new(settings: &Settings) -> Self {
        Report {
            header: vec![
                format!(
                    "N = {} events per drain, {} pairs per transaction size (walbox first, then \
                     Debezium first, alternating); live runs {} s at {} events/s",
                    fmt_n(settings.rows),
                    settings.pairs,
                    settings.live.as_secs(),
                    fmt_list(&settings.rates)
                ),
                format!(
                    "Debezium {} (PostgreSQL connector, Outbox Event Router) in Kafka Connect \
                     standalone (Kafka {} jars, `-Xms128m -Xmx512m`), walbox {} ({} \
                     build) with `compat = \"debezium\"`",
                    walbox::sandbox::debezium::version(),
                    walbox::sandbox::kafka::kafka_version(),
                    env!("CARGO_PKG_VERSION"),
                    if cfg!(debug_assertions) {
                        "debug"
                    } else {
                        "release"
                    }
                ),
                format!(
                    "broker: Apache Kafka {}, one KRaft node on this machine, {} partitions per \
                     topic; both relays reach PostgreSQL over TCP on 127.0.0.1 (SCRAM, no TLS) \
                     and Kafka over PLAINTEXT on 127.0.0.1",
                    walbox::sandbox::kafka::kafka_version(),
                    crate::PARTITIONS
                ),
                machine(),
            ],
            rows: Vec::new(),
            pairs: Vec::new(),
            live: Vec::new(),
            load_at_start: load(),
            pg_version: String::new(),
            elapsed: Duration::ZERO,
        }
    }

    /// The drains of the `per_tx`-row backlog.
    pub fn drains(&mut self, per_tx: u64, pairs: &[(Drain, Drain)]) {
        let shape = format!("{per_tx}-row tx");
        let med = |f: &dyn Fn(&Drain) -> f64, walbox: bool| {
            median(
                pairs
                    .iter()
                    .map(|(w, d)| f(if walbox { w } else { d }))
                    .collect(),
            )
        };
        let mut row =
            |what: &str, f: &dyn Fn(&Drain) -> f64, show: &dyn Fn(f64) -> String, target: &str| {
                let (w, d) = (med(f, true), med(f, false));
                self.rows.push(Row {
                    measurement: format!("{shape}: {what}"),
                    walbox: show(w),
                    debezium: show(d),
                    ratio: ratio(w, d),
                    target: target.to_owned(),
                });
            };
        let secs = |v: f64| format!("{v:.2} s");
        row(
            "drain, events/s (first → last event in Kafka)",
            &Drain::rate,
            &k,
            "≥ 3×",
        );
        row(
            "drain, events/s (process start → last event in Kafka)",
            &Drain::rate_from_start,
            &k,
            "",
        );
        row(
            "relay CPU per 100k events (first → last event)",
            &Drain::relay_cpu_per_100k,
            &secs,
            "≤ 0.20×",
        );
        row(
            "relay CPU from start to the first event",
            &|d| d.relay_cpu_start,
            &secs,
            "",
        );
        row(
            "walsender CPU per 100k events",
            &Drain::walsender_cpu_per_100k,
            &secs,
            "",
        );
        row(
            "relay peak RSS",
            &|d| d.peak_rss as f64,
            &|b| mib(b as u64),
            "≤ 0.05×",
        );
        row(
            "process start → first event in Kafka",
            &|d| d.first.as_secs_f64(),
            &secs,
            "",
        );
        for (i, (w, d)) in pairs.iter().enumerate() {
            let order = if i % 2 == 0 {
                "walbox first"
            } else {
                "Debezium first"
            };
            self.pairs.push(format!(
                "| {shape} | {i} ({order}) | {} | {} | {} |",
                k(w.rate()),
                k(d.rate()),
                ratio(w.rate(), d.rate())
            ));
        }
    }

    /// A live run.
    pub fn live(&mut self, which: Which, rate: u64, lat: &Latency) {
        self.live.push((which, rate, lat.clone()));
    }

    /// The markdown text: set-up lines, then the tables.
    pub fn render(&self) -> String {
        let mut out = String::from("## walbox and Debezium, side by side\n\n");
        for h in &self.header {
            out += &format!("- {h}\n");
        }
        out += &format!("- {}\n", self.pg_version);
        out += &format!(
            "- load average (1, 5, 15 min) at the start {}, at the end {}; run time {:.0} s\n\n",
            self.load_at_start,
            load(),
            self.elapsed.as_secs_f64()
        );
        out += "| measurement (median of the pairs) | walbox | Debezium | walbox / Debezium | target |\n";
        out += "|---|---:|---:|---:|---|\n";
        for r in &self.rows {
            out += &format!(
                "| {} | {} | {} | {} | {} |\n",
                r.measurement, r.walbox, r.debezium, r.ratio, r.target
            );
        }
        let rates: Vec<u64> = {
            let mut r: Vec<u64> = self.live.iter().map(|x| x.1).collect();
            r.sort();
            r.dedup();
            r
        };
        for rate in rates {
            let find = |which| {
                self.live
                    .iter()
                    .find(|x| x.0 == which && x.1 == rate)
                    .map(|x| &x.2)
            };
            let (Some(w), Some(d)) = (find(Which::Walbox), find(Which::Debezium)) else {
                continue;
            };
            let fmt = |l: &Latency| {
                format!(
                    "{} / {} ms ({}/{} received)",
                    ms(l.p50),
                    ms(l.p99),
                    l.received,
                    l.inserted
                )
            };
            out += &format!(
                "| live {} events/s (achieved {} / {}): commit → consumed p50 / p99 | {} | {} | p50 {}, p99 {} | |\n",
                fmt_n(rate),
                k(w.achieved_rate),
                k(d.achieved_rate),
                fmt(w),
                fmt(d),
                ratio(w.p50.as_secs_f64(), d.p50.as_secs_f64()),
                ratio(w.p99.as_secs_f64(), d.p99.as_secs_f64()),
            );
        }
        out += "\n| backlog | pair | walbox events/s | Debezium events/s | walbox / Debezium |\n";
        out += "|---|---|---:|---:|---:|\n";
        for p in &self.pairs {
            out += p;
            out += "\n";
        }
        out += "\nA drain ends when the topic's end offsets sum to N (the relay's work, not a \
                consumer's). CPU is the relay process's own (`utime + stime`: walbox, or \
                Connect's JVM with its JIT and GC threads) and that of the walsender serving \
                its slot. Latency is commit returned to the inserter → record received by a \
                consumer of the broker (`fetch.wait.max.ms=1`).\n";
        out
    }
}
