//! The compose stack (`deploy/compose.yaml`) on throwaway infrastructure, scraped every second
//! by a real Prometheus: the run `scripts/render-dashboard.py` draws the dashboard from.
//!
//! ```sh
//! cargo run --example stack_sample -- /tmp/stack-run            # 160 s
//! python3 scripts/render-dashboard.py /tmp/stack-run docs/dashboard.png
//! ```
//!
//! The stack is the compose file's, with a throwaway PostgreSQL cluster in place of the
//! `postgres` container and librdkafka's mock cluster in place of Kafka: the same init script
//! (`deploy/compose/postgres-init.sh`, which applies `migrations/`), the same topics, walbox
//! and `walbox inbox` with the compose configuration files (only the addresses overridden), the
//! same writer (`deploy/compose/writer.sql`) and the same Prometheus configuration
//! (`deploy/prometheus/prometheus.yml` with its alert rules; only the targets, and a 1 s scrape
//! and evaluation interval, overridden). The cluster has 1 MiB WAL segments,
//! `max_wal_size = 4MB` and `max_slot_wal_keep_size = 32MB`, and walbox warns at a quarter of it
//! (`slot.warning_ratio = 0.25`), so the slot's gauges move within a short run. The run tells
//! one story: steady traffic, then the broker goes down while the writer goes on (in-flight
//! events fill up, walbox stops reading, the slot retains WAL until its alert level reaches
//! `warning`), then the broker comes back and walbox catches up.
//!
//! The run directory holds Prometheus' storage (`data/`), its configuration and log, and
//! `run.json`: the first and last second of the sampled window (unix seconds).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use walbox::sandbox::broker::Broker;
use walbox::sandbox::postgres::{PgCluster, PgClusterOptions};

/// The writer's average rate (events/s).
const WRITER_RATE: u32 = 600;
/// When the broker goes down, after the start of sampling.
const OUTAGE_AT: Duration = Duration::from_secs(40);
/// How long the broker stays down after the slot's alert level reached `warning` (and at
/// most [`OUTAGE_MAX`] in all).
const OUTAGE_AFTER_WARNING: Duration = Duration::from_secs(2);
const OUTAGE_MAX: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `GET path` on 127.0.0.1:`port`: status code and body.
async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// A metric's value in an exposition (the first series of that name).
fn value(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.split([' ', '{']).next() == Some(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn psql(cluster: &PgCluster) -> Command {
    let mut cmd = Command::new("psql");
    cmd.env("PGHOST", cluster.socket_dir())
        .env("PGPORT", cluster.port().to_string());
    cmd
}

fn run_init_script(cluster: &PgCluster) -> anyhow::Result<()> {
    let out = psql(cluster)
        .args([
            "-X",
            "-q",
            "-U",
            "walbox",
            "-d",
            "postgres",
            "-c",
            "CREATE DATABASE app",
        ])
        .output()?;
    if !out.status.success() {
        bail!(
            "CREATE DATABASE app: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = Command::new("bash")
        .arg(repo().join("deploy/compose/postgres-init.sh"))
        .env("PGHOST", cluster.socket_dir())
        .env("PGPORT", cluster.port().to_string())
        .env("POSTGRES_USER", "walbox")
        .env("MIGRATIONS_DIR", repo().join("migrations"))
        .output()?;
    if !out.status.success() {
        bail!("postgres-init.sh: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn start_writer(cluster: &PgCluster) -> anyhow::Result<Child> {
    Ok(psql(cluster)
        .args([
            "-X",
            "-q",
            "-U",
            "walbox",
            "-d",
            "app",
            "-v",
            "ON_ERROR_STOP=1",
        ])
        .arg("-v")
        .arg(format!("rate={WRITER_RATE}"))
        .arg("-f")
        .arg(repo().join("deploy/compose/writer.sql"))
        .stdout(Stdio::null())
        .spawn()?)
}

/// The compose stack's Prometheus configuration, scraping this run's ports every second.
fn prometheus_config(relay_port: u16, inbox_port: u16) -> anyhow::Result<String> {
    let dir = repo().join("deploy/prometheus");
    let mut text = std::fs::read_to_string(dir.join("prometheus.yml"))?;
    let rules = dir.join("alerts.yml");
    for (from, to) in [
        ("scrape_interval: 5s", "scrape_interval: 1s".to_owned()),
        (
            "evaluation_interval: 15s",
            "evaluation_interval: 1s".to_owned(),
        ),
        ("- alerts.yml", format!("- {}", rules.display())),
        ("\"walbox:9187\"", format!("\"127.0.0.1:{relay_port}\"")),
        ("\"inbox:9188\"", format!("\"127.0.0.1:{inbox_port}\"")),
    ] {
        if !text.contains(from) {
            bail!("deploy/prometheus/prometheus.yml no longer has {from:?}: update stack_sample");
        }
        text = text.replace(from, &to);
    }
    Ok(text)
}

/// A Prometheus server with `dir/data` as its storage, scraping as `dir/prometheus.yml` says.
fn start_prometheus(dir: &Path, port: u16) -> anyhow::Result<Child> {
    let log = std::fs::File::create(dir.join("prometheus.log"))?;
    Command::new("prometheus")
        .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("prometheus not found: install it with scripts/install-deps.sh (Debian package prometheus)")
}

/// The number of active targets Prometheus has scraped successfully (`up == 1`).
async fn targets_up(port: u16) -> usize {
    match get(port, "/api/v1/query?query=up").await {
        Some((200, body)) => serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| {
                let results = v["data"]["result"].as_array()?.clone();
                Some(results.iter().filter(|r| r["value"][1] == "1").count())
            })
            .unwrap_or(0),
        _ => 0,
    }
}

fn unix_now() -> anyhow::Result<f64> {
    Ok(SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let run_dir = PathBuf::from(
        args.next()
            .context("usage: stack_sample <run directory> [seconds]")?,
    );
    if run_dir.join("data").exists() {
        bail!(
            "{} already holds a run: choose a new directory",
            run_dir.display()
        );
    }
    std::fs::create_dir_all(&run_dir)?;
    let seconds: u64 = args.next().map_or(Ok(160), |s| s.parse())?;
    tracing_subscriber::fmt()
        .with_env_filter("warn,walbox=info")
        .with_writer(std::io::stderr)
        .init();

    eprintln!("starting PostgreSQL (1 MiB WAL segments, max_slot_wal_keep_size = 32MB)…");
    let cluster = tokio::task::spawn_blocking(|| {
        PgCluster::start(PgClusterOptions {
            wal_segsize_mb: Some(1),
            settings: [
                ("max_wal_size", "4MB"),
                ("min_wal_size", "2MB"),
                ("max_slot_wal_keep_size", "32MB"),
                ("checkpoint_timeout", "30s"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .into(),
            watchdog: true,
            ..Default::default()
        })
    })
    .await??;
    run_init_script(&cluster)?;

    // deploy/compose/kafka-topics.sh's topics (the progress topic comes with the mock).
    let broker = Broker::mock(1)?;
    for (topic, partitions) in [
        ("payments.events", 6),
        ("walbox.dead_letter", 1),
        ("billing.inbox.dlq", 1),
    ] {
        broker.create_topic(topic, partitions)?;
    }
    let bootstrap = broker.bootstrap_servers();

    let (relay_port, inbox_port) = (free_port()?, free_port()?);
    let relay_config = walbox::config::load_from(
        Some(&repo().join("deploy/compose/walbox.toml")),
        &mut [
            ("WALBOX_POSTGRES_URL", cluster.url("app")),
            ("WALBOX_KAFKA_BROKERS", bootstrap.clone()),
            ("WALBOX_HTTP_LISTEN", format!("127.0.0.1:{relay_port}")),
            ("WALBOX_SLOT_CHECK_INTERVAL", "1s".into()),
            ("WALBOX_SLOT_WARNING_RATIO", "0.25".into()),
            ("WALBOX_RELAY_MAX_IN_FLIGHT", "2000".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v)),
    )?;
    let inbox_config = walbox::inbox::config::load_from(
        Some(&repo().join("deploy/compose/inbox.toml")),
        &mut [
            ("WALBOX_INBOX_POSTGRES_URL", cluster.url("billing")),
            ("WALBOX_INBOX_KAFKA_BROKERS", bootstrap.clone()),
            (
                "WALBOX_INBOX_HTTP_LISTEN",
                format!("127.0.0.1:{inbox_port}"),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v)),
    )?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let relay = tokio::spawn(walbox::app::run(relay_config, stopped(stop_rx.clone())));
    let inbox = tokio::spawn(walbox::inbox::run(inbox_config, stopped(stop_rx)));

    // As in the compose file, the writer starts once walbox streams (/readyz).
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(relay_port, "/readyz").await.map(|(s, _)| s) != Some(200) {
        if relay.is_finished() || Instant::now() > deadline {
            bail!("walbox did not start streaming");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let prometheus_port = free_port()?;
    std::fs::write(
        run_dir.join("prometheus.yml"),
        prometheus_config(relay_port, inbox_port)?,
    )?;
    let mut prometheus = start_prometheus(&run_dir, prometheus_port)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while targets_up(prometheus_port).await < 2 {
        if let Some(status) = prometheus.try_wait()? {
            bail!(
                "prometheus stopped ({status}); see {}",
                run_dir.join("prometheus.log").display()
            );
        }
        if Instant::now() > deadline {
            bail!("prometheus did not scrape walbox and the inbox within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut writer = start_writer(&cluster)?;
    eprintln!(
        "prometheus (:{prometheus_port}) scrapes walbox (:{relay_port}) and the inbox \
         (:{inbox_port}) every second; running for {seconds} s…"
    );

    let first = unix_now()?;
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let (mut down_since, mut warning_since, mut outage_done) =
        (None::<Instant>, None::<Instant>, false);
    while start.elapsed() < Duration::from_secs(seconds) {
        tick.tick().await;
        // The outage lasts until the slot's alert level reached `warning`.
        let level = match get(relay_port, "/metrics").await {
            Some((200, body)) => value(&body, "walbox_slot_alert_level").unwrap_or(0.0),
            _ => 0.0,
        };
        if let Some(status) = writer.try_wait()? {
            bail!("the writer stopped: {status}");
        }
        let mock = broker.mock_cluster().context("a mock cluster")?;
        match down_since {
            None if !outage_done && start.elapsed() >= OUTAGE_AT => {
                eprintln!("t={}s: broker down", start.elapsed().as_secs());
                mock.broker_down(1)?;
                down_since = Some(Instant::now());
            }
            Some(since) => {
                if level >= 1.0 && warning_since.is_none() {
                    warning_since = Some(Instant::now());
                }
                if warning_since.is_some_and(|w| w.elapsed() >= OUTAGE_AFTER_WARNING)
                    || since.elapsed() >= OUTAGE_MAX
                {
                    eprintln!(
                        "t={}s: broker up (slot alert level {level})",
                        start.elapsed().as_secs()
                    );
                    mock.broker_up(1)?;
                    (down_since, outage_done) = (None, true);
                }
            }
            None => {}
        }
    }
    let last = unix_now()?;
    // One more scrape interval, so the window's last second is in the storage.
    tokio::time::sleep(Duration::from_secs(2)).await;
    std::fs::write(
        run_dir.join("run.json"),
        serde_json::to_string_pretty(&json!({ "start": first.ceil(), "end": last.floor() }))?,
    )?;
    // SIGTERM: Prometheus closes its storage cleanly.
    let _ = Command::new("kill")
        .arg(prometheus.id().to_string())
        .status();
    prometheus.wait()?;
    let _ = writer.kill();
    let _ = writer.wait();
    let _ = stop_tx.send(true);
    relay.await?.map_err(|e| anyhow::anyhow!("walbox: {e}"))?;
    inbox
        .await?
        .map_err(|e| anyhow::anyhow!("walbox inbox: {e}"))?;
    eprintln!("wrote {}", run_dir.display());
    drop(cluster);
    Ok(())
}
