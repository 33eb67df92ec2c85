//! The soak's faults, and how each is injected and healed.
//!
//! Invariants:
//! - [`inject`] returns once the fault is over: PostgreSQL accepts connections again, a proxy
//!   passes again, a killed broker's partitions have new leaders and its JVM is starting again.
//!   A stopped walbox stays down until the caller starts it again (once events flow, so the
//!   standby is the one that takes over); waiting for events to flow is the caller's.
//! - A broker is killed only when every partition of the soak's topics has its three replicas in
//!   sync, so at most one node is ever behind and every write still has its two in-sync replicas.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::rngs::StdRng;
use rand::Rng;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use walbox::sandbox::kafka_cluster::KafkaCluster;
use walbox::sandbox::postgres::PgCluster;
use walbox::sandbox::proxy::Mode;

use crate::members::Members;

/// How long the cluster may take to have every replica in sync again before a broker kill.
const IN_SYNC_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a killed leader's partition may stay without a new leader.
const LEADER_TIMEOUT: Duration = Duration::from_secs(60);

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// The active walbox SIGKILLed (the standby takes over), then started again as a standby.
    WalboxSigkill,
    /// The active walbox SIGTERMed (drains, releases the lock; the standby takes over), then
    /// started again as a standby.
    WalboxSigterm,
    /// The Kafka node leading a partition of the soak's topics SIGKILLed; started again once
    /// another node leads the partition.
    BrokerLeaderKill,
    /// PostgreSQL restarted (`pg_ctl restart -m fast`).
    PgRestartFast,
    /// PostgreSQL crashed (`pg_ctl stop -m immediate`) and started again.
    PgRestartImmediate,
    /// The active walbox partitioned from PostgreSQL for 0.5–2.5 s (its proxy blackholes, the
    /// server's side of its connections is cut), then healed.
    PgBlackhole,
    /// Both walbox processes cut off from every Kafka node for 0.5–2.5 s (the nodes' proxies
    /// blackhole), then healed.
    KafkaBlackhole,
}

impl Fault {
    /// Every kind, in the order the summary lists them.
    pub const ALL: [Fault; 7] = [
        Fault::WalboxSigkill,
        Fault::WalboxSigterm,
        Fault::BrokerLeaderKill,
        Fault::PgRestartFast,
        Fault::PgRestartImmediate,
        Fault::PgBlackhole,
        Fault::KafkaBlackhole,
    ];

    /// How the summary names it.
    pub fn label(self) -> &'static str {
        match self {
            Fault::WalboxSigkill => "walbox SIGKILL",
            Fault::WalboxSigterm => "walbox SIGTERM",
            Fault::BrokerLeaderKill => "Kafka partition leader killed",
            Fault::PgRestartFast => "PostgreSQL restart (fast)",
            Fault::PgRestartImmediate => "PostgreSQL restart (immediate)",
            Fault::PgBlackhole => "PostgreSQL blackhole",
            Fault::KafkaBlackhole => "Kafka blackhole",
        }
    }
}

/// What the faults act on.
pub struct Targets<'a> {
    pub pg: &'a PgCluster,
    pub cluster: &'a mut KafkaCluster,
    pub members: &'a mut Members,
    /// The topics whose partition leaders may be killed.
    pub topics: &'a [&'a str],
}

/// Injects `fault` and heals it; returns a few words on what exactly was done.
pub fn inject(fault: Fault, t: &mut Targets, rng: &mut StdRng) -> anyhow::Result<String> {
    let active = t.members.active(t.pg);
    // Faults aimed at "the active walbox" hit a random member when none holds the lock now.
    let target = active.unwrap_or_else(|| rng.random_range(0..2));
    let blackhole = Duration::from_millis(rng.random_range(500..=2_500));
    Ok(match fault {
        Fault::WalboxSigkill => {
            t.members.sigkill(target)?;
            format!("member {target}")
        }
        Fault::WalboxSigterm => {
            let (by_itself, status) = t.members.sigterm(target)?;
            if !by_itself {
                bail!("member {target} did not exit within a minute of SIGTERM ({status})");
            }
            format!("member {target}, {status}")
        }
        Fault::BrokerLeaderKill => {
            wait_in_sync(t.cluster, t.topics)?;
            let topic = t.topics[rng.random_range(0..t.topics.len())];
            let partitions = partition_count(t.cluster, topic)?;
            let partition = rng.random_range(0..partitions);
            let leader = t
                .cluster
                .leader(topic, partition)
                .with_context(|| format!("no leader for {topic}/{partition}"))?;
            t.cluster.kill(leader);
            let deadline = Instant::now() + LEADER_TIMEOUT;
            while t
                .cluster
                .leader(topic, partition)
                .is_none_or(|l| l == leader)
            {
                if Instant::now() > deadline {
                    bail!("{topic}/{partition} has no new leader {LEADER_TIMEOUT:?} after node {leader} was killed");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            // It comes back while the soak goes on; the next broker kill waits for it.
            t.cluster
                .start_again(leader)
                .with_context(|| format!("restarting Kafka node {leader}"))?;
            format!("node {leader}, leader of {topic}/{partition}")
        }
        Fault::PgRestartFast => {
            t.pg.restart().context("restarting PostgreSQL")?;
            String::new()
        }
        Fault::PgRestartImmediate => {
            t.pg.crash().context("crashing PostgreSQL")?;
            t.pg.start_again().context("starting PostgreSQL again")?;
            String::new()
        }
        Fault::PgBlackhole => {
            let proxy = t.members.proxy(target);
            proxy.partition();
            std::thread::sleep(blackhole);
            proxy.set(Mode::Pass);
            format!("member {target}, {:.1} s", blackhole.as_secs_f64())
        }
        Fault::KafkaBlackhole => {
            for p in t.cluster.proxies() {
                p.set(Mode::Blackhole);
            }
            std::thread::sleep(blackhole);
            for p in t.cluster.proxies() {
                p.set(Mode::Pass);
            }
            format!("{:.1} s", blackhole.as_secs_f64())
        }
    })
}

fn metadata_client(cluster: &KafkaCluster) -> anyhow::Result<BaseConsumer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .set("log_level", "0")
        .create()?)
}

fn partition_count(cluster: &KafkaCluster, topic: &str) -> anyhow::Result<i32> {
    let md = metadata_client(cluster)?.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let n = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map_or(0, |t| t.partitions().len());
    if n == 0 {
        bail!("topic {topic} has no partitions in the metadata");
    }
    Ok(i32::try_from(n)?)
}

/// Waits until every partition of `topics` has three in-sync replicas.
fn wait_in_sync(cluster: &KafkaCluster, topics: &[&str]) -> anyhow::Result<()> {
    let client = metadata_client(cluster)?;
    let deadline = Instant::now() + IN_SYNC_TIMEOUT;
    loop {
        let in_sync = topics.iter().all(|topic| {
            client
                .fetch_metadata(Some(topic), Duration::from_secs(5))
                .ok()
                .and_then(|md| {
                    let t = md.topics().iter().find(|t| t.name() == *topic)?;
                    Some(
                        !t.partitions().is_empty()
                            && t.partitions().iter().all(|p| p.isr().len() == 3),
                    )
                })
                .unwrap_or(false)
        });
        if in_sync {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the replicas of {topics:?} not all in sync within {IN_SYNC_TIMEOUT:?}; the nodes' logs end:\n{}",
                cluster.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
