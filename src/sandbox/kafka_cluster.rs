//! A throwaway three-node Apache Kafka cluster on one machine, for the leader-failover tests:
//! three [`KafkaServer`] nodes, each `process.roles=broker,controller`, in a static KRaft quorum
//! (`controller.quorum.voters`, every node a voter).
//!
//! Invariants:
//! - Each node is a [`KafkaServer`] of its own (directory, ports, log file, watchdog); the
//!   cluster adds only the quorum and the replication settings.
//! - The internal topics (offsets, transaction state, share state) and created topics have
//!   replication factor 3 and min ISR 2: one node may be down and every write still commits.
//! - [`KafkaCluster::start`] returns once every node answers metadata listing all three brokers.
//! - [`KafkaCluster::kill`] SIGKILLs one node; [`KafkaCluster::restart`] starts it again on its
//!   storage and ports, and returns once it is back in the cluster's metadata
//!   ([`KafkaCluster::start_again`] does not wait).
//! - [`KafkaCluster::start_behind_proxies`] adds a second listener on each node that advertises
//!   a [`Proxy`] of its own: a client bootstrapped from
//!   [`KafkaCluster::proxied_bootstrap_servers`] reaches every broker through the proxies only,
//!   so a blackhole of the proxies cuts it off from the whole cluster, while the PLAINTEXT
//!   listener ([`KafkaCluster::bootstrap_servers`]) stays direct.

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::kafka::{free_port, KafkaServer, KafkaServerError, KafkaServerOptions, Node};
use super::proxy::Proxy;

/// Nodes in a [`KafkaCluster`].
pub const NODES: u32 = 3;

/// How long the cluster may take to list every broker once all nodes answer.
const JOIN_TIMEOUT: Duration = Duration::from_secs(90);

/// The replication settings of a three-node cluster, after the single node's defaults.
const REPLICATION: [(&str, &str); 8] = [
    ("offsets.topic.replication.factor", "3"),
    ("transaction.state.log.replication.factor", "3"),
    ("transaction.state.log.min.isr", "2"),
    ("share.coordinator.state.topic.replication.factor", "3"),
    ("share.coordinator.state.topic.min.isr", "2"),
    ("default.replication.factor", "3"),
    ("min.insync.replicas", "2"),
    // A killed leader's partitions move at once, not after the 9 s default.
    ("broker.session.timeout.ms", "3000"),
];

/// A running three-node cluster; every node killed and removed on drop.
pub struct KafkaCluster {
    nodes: Vec<KafkaServer>,
    /// With [`KafkaCluster::start_behind_proxies`]: node `i + 1`'s proxy at `i`.
    proxies: Vec<Proxy>,
}

impl KafkaCluster {
    /// Formats and starts three nodes in one static quorum; `opts` applies to each (its
    /// `log_file`, when set, gets the node id appended: `<file>.<id>`).
    pub fn start(opts: KafkaServerOptions) -> Result<KafkaCluster, KafkaServerError> {
        Self::start_with(opts, false)
    }

    /// [`KafkaCluster::start`], each node also reachable through a [`Proxy`] of its own (see the
    /// [module docs](self)).
    pub fn start_behind_proxies(
        opts: KafkaServerOptions,
    ) -> Result<KafkaCluster, KafkaServerError> {
        Self::start_with(opts, true)
    }

    fn start_with(
        opts: KafkaServerOptions,
        proxied: bool,
    ) -> Result<KafkaCluster, KafkaServerError> {
        let mut proxies = Vec::new();
        let nodes: Vec<Node> = (1..=NODES)
            .map(|id| {
                let external = if proxied {
                    let listen = free_port()?;
                    let proxy = Proxy::start(([127, 0, 0, 1], listen).into()).map_err(|e| {
                        KafkaServerError::Io(format!("starting node {id}'s proxy"), e)
                    })?;
                    let advertise = proxy.port();
                    proxies.push(proxy);
                    Some((listen, advertise))
                } else {
                    None
                };
                Ok(Node {
                    id,
                    plaintext: free_port()?,
                    controller: free_port()?,
                    voters: None,
                    external,
                })
            })
            .collect::<Result<_, KafkaServerError>>()?;
        let voters = nodes
            .iter()
            .map(|n| format!("{}@127.0.0.1:{}", n.id, n.controller))
            .collect::<Vec<_>>()
            .join(",");
        let mut servers = Vec::new();
        for mut node in nodes {
            node.voters = Some(voters.clone());
            let mut node_opts = opts.clone();
            node_opts.log_file = opts.log_file.as_ref().map(|f| {
                let mut name = f.clone().into_os_string();
                name.push(format!(".{}", node.id));
                name.into()
            });
            node_opts.properties = REPLICATION
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .chain(opts.properties.iter().cloned())
                .collect();
            servers.push(KafkaServer::spawn_node(node_opts, &node)?);
        }
        let mut cluster = KafkaCluster {
            nodes: servers,
            proxies,
        };
        for node in &mut cluster.nodes {
            node.wait_ready()?;
        }
        cluster.wait_brokers(NODES as usize)?;
        Ok(cluster)
    }

    /// `bootstrap.servers` naming every node's PLAINTEXT listener.
    pub fn bootstrap_servers(&self) -> String {
        self.nodes
            .iter()
            .map(KafkaServer::bootstrap_servers)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `bootstrap.servers` naming every node's proxy (empty unless started with
    /// [`KafkaCluster::start_behind_proxies`]).
    pub fn proxied_bootstrap_servers(&self) -> String {
        self.proxies
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.port()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The nodes' proxies, node 1's first (empty unless started with
    /// [`KafkaCluster::start_behind_proxies`]).
    pub fn proxies(&self) -> &[Proxy] {
        &self.proxies
    }

    /// Node `id` (1 to [`NODES`]).
    pub fn node(&self, id: i32) -> &KafkaServer {
        &self.nodes[usize::try_from(id - 1).expect("node ids start at 1")]
    }

    /// The id of the node leading `topic`'s `partition`, per the cluster's metadata.
    pub fn leader(&self, topic: &str, partition: i32) -> Option<i32> {
        let md = self
            .client()
            .ok()?
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .ok()?;
        let t = md.topics().iter().find(|t| t.name() == topic)?;
        let p = t.partitions().iter().find(|p| p.id() == partition)?;
        (p.leader() >= 0).then_some(p.leader())
    }

    /// SIGKILLs node `id`.
    pub fn kill(&mut self, id: i32) {
        self.nodes[usize::try_from(id - 1).expect("node ids start at 1")].kill();
    }

    /// Starts node `id` again after [`KafkaCluster::kill`]; returns once the cluster lists
    /// every broker again.
    pub fn restart(&mut self, id: i32) -> Result<(), KafkaServerError> {
        self.nodes[usize::try_from(id - 1).expect("node ids start at 1")].restart()?;
        self.wait_brokers(NODES as usize)
    }

    /// Starts node `id` again after [`KafkaCluster::kill`] without waiting for it to rejoin (a
    /// node that comes back while other faults go on); [`KafkaCluster::restart`] waits.
    pub fn start_again(&mut self, id: i32) -> Result<(), KafkaServerError> {
        self.nodes[usize::try_from(id - 1).expect("node ids start at 1")].spawn_again()
    }

    /// The last lines of every node's log.
    pub fn log_tail(&self) -> String {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| format!("node {}: {}", i + 1, n.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn client(&self) -> Result<BaseConsumer, KafkaServerError> {
        ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap_servers())
            .set("log_level", "0")
            .create()
            .map_err(|e| KafkaServerError::Start(e.to_string(), String::new()))
    }

    /// Waits until the metadata lists `n` brokers.
    fn wait_brokers(&self, n: usize) -> Result<(), KafkaServerError> {
        let client = self.client()?;
        let deadline = Instant::now() + JOIN_TIMEOUT;
        loop {
            if let Ok(md) = client.fetch_metadata(None, Duration::from_secs(2)) {
                if md.brokers().len() >= n {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(KafkaServerError::Start(
                    format!("fewer than {n} brokers in the metadata within {JOIN_TIMEOUT:?}"),
                    self.log_tail(),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
