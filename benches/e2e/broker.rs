//! The Kafka side of the benchmark: librdkafka's mock cluster hosted in a child process (so its
//! CPU is not counted as walbox's, and it does not share the bench's threads), a single-node
//! Apache Kafka broker (`WALBOX_BENCH_KAFKA=apache`, [`walbox::sandbox::kafka`]), or an external
//! cluster named by `WALBOX_BENCH_KAFKA_BROKERS`.
//!
//! The child is this same executable started with [`HOST_ARG`]. It prints the bootstrap servers
//! on its first stdout line, then serves one command per stdin line — `topic <name> <partitions>`
//! answered by `ok` or `error <message>` — and exits when stdin closes.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use walbox::sandbox::broker::Broker;
use walbox::sandbox::kafka::{KafkaServer, KafkaServerOptions};

/// The argument that turns the bench executable into the broker host.
pub const HOST_ARG: &str = "__walbox_bench_mock_broker";

/// Entry point of the broker host child: never returns normally.
pub fn host_main() -> ! {
    let code = match host() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("mock broker host: {e:#}");
            1
        }
    };
    std::process::exit(code)
}

/// Runs the mock cluster until stdin closes.
fn host() -> anyhow::Result<()> {
    let broker = Broker::mock(1).context("starting the mock cluster")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", broker.bootstrap_servers())?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let parts: Vec<&str> = line.split_whitespace().collect();
        let reply = match parts[..] {
            ["topic", name, partitions] => match partitions.parse() {
                Ok(p) => match broker.create_topic(name, p) {
                    Ok(()) => "ok".to_owned(),
                    Err(e) => format!("error {e}"),
                },
                Err(e) => format!("error {e}"),
            },
            _ => format!("error unknown command {line:?}"),
        };
        writeln!(out, "{reply}")?;
        out.flush()?;
    }
    Ok(())
}

/// The broker the bench produces to.
pub enum BenchBroker {
    /// The mock cluster in a child process.
    Child {
        /// The host process.
        child: Child,
        /// Its command pipe (dropped to stop it).
        stdin: Option<ChildStdin>,
        /// Its reply pipe.
        stdout: BufReader<ChildStdout>,
        /// Bootstrap servers.
        bootstrap: String,
    },
    /// An external cluster.
    External(Broker),
    /// A single-node Apache Kafka broker started for the run (stopped on drop).
    Apache {
        /// The broker process.
        _server: KafkaServer,
        /// Its admin handle.
        broker: Broker,
    },
}

/// Makes the broker at `bootstrap` create its transaction log (`__transaction_state`), as the
/// first `init_transactions` of a cluster does.
fn create_transaction_log(bootstrap: &str) -> anyhow::Result<()> {
    use rdkafka::producer::{BaseProducer, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", "walbox-bench-transaction-log")
        .create()
        .context("creating a transactional producer")?;
    producer
        .init_transactions(Duration::from_secs(60))
        .context("creating the broker's transaction log")
}

impl BenchBroker {
    /// The external cluster of `WALBOX_BENCH_KAFKA_BROKERS`, else Apache Kafka when
    /// `WALBOX_BENCH_KAFKA=apache`, else a mock cluster in a child.
    pub fn start() -> anyhow::Result<Self> {
        if let Ok(b) = std::env::var("WALBOX_BENCH_KAFKA_BROKERS") {
            if !b.trim().is_empty() {
                return Ok(BenchBroker::External(Broker::External(b)));
            }
        }
        match std::env::var("WALBOX_BENCH_KAFKA")
            .as_deref()
            .map(str::trim)
        {
            Ok("apache") => {
                let server = KafkaServer::start(KafkaServerOptions {
                    watchdog: true,
                    ..Default::default()
                })
                .context("starting Apache Kafka (scripts/install-deps.sh installs it)")?;
                let broker = Broker::External(server.bootstrap_servers());
                // walbox's progress records go to a topic of one partition.
                tokio::task::block_in_place(|| {
                    broker.create_topic(walbox::config::DEFAULT_PROGRESS_TOPIC, 1)
                })?;
                // The broker creates its transaction log for the first transactional producer
                // it sees (about half a second): once per cluster, not in a measured drain.
                tokio::task::block_in_place(|| {
                    create_transaction_log(&server.bootstrap_servers())
                })?;
                return Ok(BenchBroker::Apache {
                    _server: server,
                    broker,
                });
            }
            Ok("mock") | Ok("") | Err(_) => {}
            Ok(other) => bail!("WALBOX_BENCH_KAFKA={other}: mock or apache"),
        }
        let exe = std::env::current_exe().context("locating the bench executable")?;
        let mut child = Command::new(exe)
            .arg(HOST_ARG)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the mock broker host")?;
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().context("broker stdout")?);
        let mut bootstrap = String::new();
        stdout.read_line(&mut bootstrap)?;
        let bootstrap = bootstrap.trim().to_owned();
        if bootstrap.is_empty() {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the mock broker host printed no bootstrap servers");
        }
        Ok(BenchBroker::Child {
            child,
            stdin,
            stdout,
            bootstrap,
        })
    }

    /// `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        match self {
            BenchBroker::Child { bootstrap, .. } => bootstrap.clone(),
            BenchBroker::External(b) | BenchBroker::Apache { broker: b, .. } => {
                b.bootstrap_servers()
            }
        }
    }

    /// Whether this is the mock cluster.
    pub fn is_mock(&self) -> bool {
        matches!(self, BenchBroker::Child { .. })
    }

    /// Creates a topic (an existing one is fine).
    pub fn create_topic(&mut self, name: &str, partitions: i32) -> anyhow::Result<()> {
        match self {
            // The admin call blocks on a runtime of its own: off the bench's.
            BenchBroker::External(b) | BenchBroker::Apache { broker: b, .. } => {
                Ok(tokio::task::block_in_place(|| {
                    b.create_topic(name, partitions)
                })?)
            }
            BenchBroker::Child { stdin, stdout, .. } => {
                let stdin = stdin.as_mut().context("broker host stopped")?;
                writeln!(stdin, "topic {name} {partitions}")?;
                stdin.flush()?;
                let mut reply = String::new();
                stdout.read_line(&mut reply)?;
                match reply.trim() {
                    "ok" => Ok(()),
                    other => bail!("creating topic {name}: {other}"),
                }
            }
        }
    }
}

/// What the report calls the broker.
impl std::fmt::Display for BenchBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BenchBroker::Child { .. } => f.write_str(
                "librdkafka mock cluster (1 broker, 4 partitions per topic) in a separate process",
            ),
            BenchBroker::External(_) => f.write_str("external Kafka (WALBOX_BENCH_KAFKA_BROKERS)"),
            BenchBroker::Apache { .. } => write!(
                f,
                "Apache Kafka {} (WALBOX_BENCH_KAFKA=apache), one KRaft node on this machine",
                walbox::sandbox::kafka::kafka_version()
            ),
        }
    }
}

impl Drop for BenchBroker {
    /// Closes the host's stdin (it exits) and reaps it.
    fn drop(&mut self) {
        if let BenchBroker::Child { child, stdin, .. } = self {
            drop(stdin.take());
            let _ = child.wait();
        }
    }
}
